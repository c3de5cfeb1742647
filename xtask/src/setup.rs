//! Installs what the tests need when it can, and says exactly what is missing when it cannot.

use std::path::Path;
use std::process::Command;

use crate::{in_ci, run};

/// Whether Mesa's software Vulkan (lavapipe) and the Vulkan loader are installed.
fn lavapipe_present() -> bool {
    let icd = ["/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d"].iter().any(|d| {
        std::fs::read_dir(d)
            .is_ok_and(|entries| entries.flatten().any(|e| e.file_name().to_string_lossy().starts_with("lvp_icd")))
    });
    let loader = Command::new("ldconfig")
        .arg("-p")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("libvulkan.so.1"));
    icd && loader
}

/// Installs Debian packages (as root), running `apt-get update` first, once per process.
fn apt_install(packages: &[&str]) -> Result<(), String> {
    static UPDATED: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    if UPDATED.get().is_none() {
        run(Command::new("apt-get").args(["update", "-qq"]))?;
        let _ = UPDATED.set(());
    }
    run(Command::new("apt-get").env("DEBIAN_FRONTEND", "noninteractive").args(["install", "-y", "-qq"]).args(packages))
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Sets up the test environment. Returns the environment variables the test
/// run needs (`COMPUTE_REQUIRE`, `XDG_RUNTIME_DIR`).
pub fn prepare() -> Result<Vec<(String, String)>, String> {
    let mut env = Vec::new();
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        let dir = std::env::temp_dir().join("compute-xdg-runtime");
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        env.push(("XDG_RUNTIME_DIR".into(), dir.display().to_string()));
    }
    if !lavapipe_present() {
        if is_root() && Path::new("/usr/bin/apt-get").exists() {
            eprintln!("xtask: installing Mesa's software Vulkan (lavapipe) for the wgpu tests");
            apt_install(&["mesa-vulkan-drivers", "libvulkan1"])?;
        } else {
            let msg = "no Vulkan driver: install Mesa's software Vulkan (Debian/Ubuntu: \
                       `sudo apt-get install mesa-vulkan-drivers libvulkan1`) to run the wgpu tests";
            if in_ci() {
                return Err(msg.into());
            }
            eprintln!("\n!!! SKIPPING the wgpu conformance tests: {msg}\n");
        }
    }
    let mut required = vec!["simd"];
    if lavapipe_present() || in_ci() {
        required.push("wgpu");
    }
    env.push(("COMPUTE_REQUIRE".into(), required.join(",")));
    Ok(env)
}

/// Prints, after the run, which backends' tests were required and which could not run here.
pub fn report_skips(env: &[(String, String)]) {
    let required = env.iter().find(|(k, _)| k == "COMPUTE_REQUIRE").map(|(_, v)| v.as_str()).unwrap_or("");
    eprintln!("xtask test: backends required to pass here: {required}");
    if !required.contains("wgpu") {
        eprintln!("!!! the wgpu conformance tests were SKIPPED (no Vulkan driver)");
    }
    eprintln!(
        "!!! the CUDA conformance tests were SKIPPED: no NVIDIA GPU on this machine. To run them on a GPU machine, \
         build the bundle with `cargo xtask gpu-bundle`, then run `bash .gpu/run.sh tests` there (see docs/ptx.md)."
    );
}

/// The browser target the `gpu-wasm` feature builds for.
pub const WASM_TARGET: &str = "wasm32-unknown-unknown";

/// Whether the Rust standard library for [`WASM_TARGET`] is installed; adds it
/// with `rustup` when it is not (a download of about 20 MB). `Ok(false)` (the
/// check is skipped loudly) when that fails outside CI; an error under CI.
pub fn wasm_target() -> Result<bool, String> {
    let installed = || {
        Command::new("rustup")
            .args(["target", "list", "--installed"])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).lines().any(|l| l.trim() == WASM_TARGET))
    };
    if installed() {
        return Ok(true);
    }
    eprintln!("xtask: adding the {WASM_TARGET} target (rustup) for the `gpu-wasm` build check");
    let added = run(Command::new("rustup").args(["target", "add", WASM_TARGET])).is_ok() && installed();
    if added {
        return Ok(true);
    }
    let msg =
        format!("no {WASM_TARGET} standard library: `rustup target add {WASM_TARGET}` to check the browser build");
    if in_ci() {
        return Err(msg);
    }
    eprintln!("\n!!! SKIPPING the `gpu-wasm` build check: {msg}\n");
    Ok(false)
}

/// What the browser tests and the demo's check need: Chromium's WebDriver and
/// `wasm-bindgen`'s tools at the version in Cargo.lock.
pub struct BrowserTools {
    /// Path of `chromedriver`.
    pub chromedriver: std::path::PathBuf,
}

/// Finds `name` on `PATH`.
fn which(name: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

/// The version of `package` in the workspace's Cargo.lock.
fn locked_version(package: &str) -> Result<String, String> {
    let lock = std::fs::read_to_string("Cargo.lock").map_err(|e| format!("Cargo.lock: {e}"))?;
    let mut lines = lock.lines();
    while let Some(line) = lines.next() {
        if line.trim() == format!("name = \"{package}\"") {
            let version = lines.next().and_then(|v| v.trim().strip_prefix("version = \""));
            if let Some(v) = version.and_then(|v| v.strip_suffix('"')) {
                return Ok(v.to_string());
            }
        }
    }
    Err(format!("{package} is not in Cargo.lock"))
}

/// Whether `tool --version` names `version`.
fn tool_has_version(tool: &str, version: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).split_whitespace().any(|w| w == version))
}

/// Installs what the browser steps need when it is missing: Debian's
/// `chromium` and `chromium-driver` (apt, as root; about 20 s on the 2-core
/// VM), and `wasm-bindgen-cli` at Cargo.lock's `wasm-bindgen` version (`cargo
/// install`, a few minutes of compiling, once per machine). `Ok(None)` (the
/// browser steps are skipped loudly) when that cannot be done outside CI; an
/// error under CI.
pub fn browser_tools() -> Result<Option<BrowserTools>, String> {
    let mut missing = Vec::new();
    if which("chromium").is_none() || which("chromedriver").is_none() {
        if is_root() && Path::new("/usr/bin/apt-get").exists() {
            eprintln!("xtask: installing Debian's Chromium and its WebDriver for the browser tests");
            apt_install(&["chromium", "chromium-driver"])?;
        }
        if which("chromium").is_none() || which("chromedriver").is_none() {
            missing.push(
                "Chromium and its WebDriver (Debian/Ubuntu: `sudo apt-get install chromium chromium-driver`)"
                    .to_string(),
            );
        }
    }
    let version = locked_version("wasm-bindgen")?;
    if !tool_has_version("wasm-bindgen-test-runner", &version) || !tool_has_version("wasm-bindgen", &version) {
        eprintln!("xtask: installing wasm-bindgen-cli {version} (the version of wasm-bindgen in Cargo.lock)");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let install = |locked: bool| {
            let mut cmd = Command::new(&cargo);
            cmd.args(["install", "wasm-bindgen-cli", "--version", &version]);
            if locked {
                cmd.arg("--locked");
            }
            run(&mut cmd)
        };
        // `--locked` pins the tools' own dependencies; when the registry no
        // longer serves one of those versions, resolve afresh.
        if install(true).is_err() {
            eprintln!("xtask: `cargo install --locked` failed; installing with freshly resolved dependencies");
            install(false)?;
        }
        if !tool_has_version("wasm-bindgen-test-runner", &version) {
            missing.push(format!(
                "wasm-bindgen-test-runner {version} (`cargo install wasm-bindgen-cli --version {version} --locked`)"
            ));
        }
    }
    if missing.is_empty() {
        let chromedriver = which("chromedriver").ok_or("chromedriver vanished")?;
        return Ok(Some(BrowserTools { chromedriver }));
    }
    let msg = format!("missing for the browser tests: {}", missing.join("; "));
    if in_ci() {
        return Err(msg);
    }
    eprintln!("\n!!! SKIPPING the browser tests and the demo page's check: {msg}\n");
    Ok(None)
}
