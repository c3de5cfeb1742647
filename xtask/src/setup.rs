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
            run(Command::new("apt-get").args(["update", "-qq"]))?;
            run(Command::new("apt-get").env("DEBIAN_FRONTEND", "noninteractive").args([
                "install",
                "-y",
                "-qq",
                "mesa-vulkan-drivers",
                "libvulkan1",
            ]))?;
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
