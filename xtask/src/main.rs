//! `cargo xtask <command>`: the project's task runner (std only, so it builds in seconds).
//!
//! - `test`       set up what the tests need (Mesa's software Vulkan, ptxas, the wasm32 target, Chromium and
//!   wasm-bindgen), then run every test, the PTX check, the browser (`gpu-wasm`) build check, the browser
//!   tests in headless Chromium and the demo page's check (see `web.rs`)
//! - `browser`    only the browser steps of `test`
//! - `web`        build the browser demo (`examples/web`) and check it in headless Chromium, or `--serve` it
//! - `bench`      the side-by-side benchmark report (CPU by default; `--backend wgpu|cuda|all`, `--dispatch`)
//! - `ptx`        regenerate the checked-in PTX (`--check`: fail on a difference, run ptxas on every file)
//! - `calibrate`  measure this machine's dispatch profile and save it
//! - `gpu-bundle` build the test, example and bench binaries a GPU-machine run needs into `.gpu/`, with
//!   `.gpu/run.sh [tests|sanitize|bench|ncu|all] [FILTER]` to run them there (see `gpu.rs`)
//! - `deps`       check with `cargo tree` that the CPU-only crates pull no GPU dependency
//! - `ci`         what `.ci/run` runs: fmt check, clippy, test

mod gpu;
mod ptx;
mod setup;
mod web;

use std::process::{Command, ExitCode};

const USAGE: &str = "usage: cargo xtask <test|bench|ptx|calibrate|gpu-bundle|deps|ci|web> [args]
  test [--quick] [--all-browser-groups]
                          set up Vulkan (lavapipe), ptxas, wasm32, Chromium and wasm-bindgen if missing, run all
                          tests and build checks, the browser tests and the demo page's check (not with --quick)
  browser [--all-browser-groups]
                          only the browser steps of `test`: dispatch's browser tests and the demo page's check
  web [--release] [--serve [--port N]]
                          build the browser demo and check it in headless Chromium, or serve it at
                          http://127.0.0.1:N/ (default 8000) to open in a browser
  bench [ARGS]            cargo run --release -p compute-benches -- ARGS (see `cargo xtask bench --help`)
  ptx [--check]           write every kernel's PTX into ptx/ (or check it and run ptxas)
  calibrate               measure and save the dispatch profile of this machine
  gpu-bundle [--no-bench] build test, example and bench binaries into .gpu/ for a GPU machine;
                          there: bash .gpu/run.sh [tests|sanitize|bench|ncu|all] [FILTER]
  deps                    check that compute-simd / dispatch without GPU features pull no GPU crate
  ci                      cargo fmt --check, clippy -D warnings, then `test`";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((cmd, rest)) = args.split_first() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let result = match cmd.as_str() {
        "test" => test(rest),
        "bench" => bench(rest),
        "ptx" => ptx::run(rest),
        "calibrate" => calibrate(rest),
        "ci" => ci(rest),
        "deps" => deps(),
        "gpu-bundle" => gpu::bundle(rest),
        "web" => web::command(rest),
        "browser" => browser(rest.iter().any(|a| a == "--all-browser-groups")),
        "-h" | "--help" | "help" => {
            println!("{USAGE}");
            Ok(())
        }
        other => Err(format!("unknown command `{other}`\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask {cmd}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Whether we run under CI (CI=true): nothing may be skipped there.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Runs a command, echoing it first; an error if it fails.
pub fn run(cmd: &mut Command) -> Result<(), String> {
    eprintln!("$ {}", describe(cmd));
    let status = cmd.status().map_err(|e| format!("{}: {e}", describe(cmd)))?;
    if status.success() { Ok(()) } else { Err(format!("`{}` failed: {status}", describe(cmd))) }
}

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

pub(crate) fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

/// Every feature that compiles on any machine: the GPU backends load their
/// drivers at run time and report `DeviceUnavailable` when there are none.
const TEST_FEATURES: &str = "dispatch/gpu,dispatch/cuda,dispatch/nccl,compute-ptx/cuda,compute-ptx/nccl";
/// [`TEST_FEATURES`] and the bench harness's GPU rows, for clippy.
const CLIPPY_FEATURES: &str = "dispatch/gpu,dispatch/cuda,dispatch/nccl,compute-ptx/cuda,compute-ptx/nccl,compute-benches/gpu,compute-benches/cuda,compute-benches/dispatch";
/// The package `cargo test` leaves out: the bench harness has no tests, and
/// building its peers (faer, gemm, criterion) would be about a quarter of a
/// cold test build; clippy checks it.
const NOT_TESTED: &str = "compute-benches";

fn test(args: &[String]) -> Result<(), String> {
    let quick = args.iter().any(|a| a == "--quick");
    let env = setup::prepare()?;
    let mut cmd = cargo();
    cmd.args(["test", "--workspace", "--exclude", NOT_TESTED, "--features", TEST_FEATURES]);
    if quick {
        cmd.arg("--lib");
    }
    for (k, v) in &env {
        cmd.env(k, v);
    }
    run(&mut cmd)?;
    ptx::run(&["--check".to_string()])?;
    if !quick {
        browser(args.iter().any(|a| a == "--all-browser-groups"))?;
    }
    setup::report_skips(&env);
    Ok(())
}

/// The browser steps: `dispatch`'s browser tests and the demo page, in
/// headless Chromium (installed when missing; see `setup::browser_tools`),
/// their builds linted as they compile (`web::linted`). Without a browser
/// (outside CI) the same crates still get clippy's check ([`wasm`]).
fn browser(all_groups: bool) -> Result<(), String> {
    let started = std::time::Instant::now();
    // Both paths build for wasm32: its standard library first (added with
    // rustup when missing; an error under CI, a loud skip elsewhere).
    if !setup::wasm_target()? {
        return Ok(());
    }
    let Some(tools) = setup::browser_tools()? else { return wasm() };
    eprintln!("xtask: browser tools ready in {:.0} s", started.elapsed().as_secs_f64());
    web::browser_tests(&tools, all_groups)?;
    web::check_demo(&tools, false)?;
    eprintln!("xtask: browser steps took {:.0} s in all", started.elapsed().as_secs_f64());
    Ok(())
}

/// The browser build: `dispatch` with only `gpu-wasm` (wgpu on WebGPU), its
/// browser tests and the demo's module must compile for wasm32 without
/// warnings; clippy checks them where [`browser`] cannot build and run them
/// (which has made sure of the wasm32 standard library).
fn wasm() -> Result<(), String> {
    let target = ["--target", setup::WASM_TARGET];
    let deny = ["--", "-D", "warnings"];
    run(cargo()
        .args(["clippy", "-p", "dispatch", "--no-default-features", "--features", "gpu-wasm"])
        .args(target)
        .args(["--lib", "--test", "browser"])
        .args(deny))?;
    run(cargo().args(["clippy", "-p", "web-demo"]).args(target).args(deny))
}

fn bench(args: &[String]) -> Result<(), String> {
    let mut features = Vec::new();
    let mut it = args.iter().peekable();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--backend" => match it.peek().map(|s| s.as_str()) {
                // With `cuda`: the same-run yardsticks (cuBLAS, CUDA's pageable copies). The CUDA
                // driver is loaded at run time, so this builds and runs without one.
                Some("wgpu") => features.extend(["gpu", "cuda"]),
                Some("cuda") => features.push("cuda"),
                Some("all") => features.extend(["gpu", "cuda"]),
                _ => {}
            },
            "--dispatch" | "--executor" => features.push("dispatch"),
            _ => {}
        }
    }
    let mut cmd = cargo();
    cmd.args(["run", "--release", "-p", "compute-benches", "--bin", "compute-bench"]);
    if !features.is_empty() {
        cmd.args(["--features", &features.join(",")]);
    }
    cmd.arg("--").args(args);
    run(&mut cmd)
}

fn calibrate(args: &[String]) -> Result<(), String> {
    let mut cmd = cargo();
    cmd.args(["run", "--release", "-p", "dispatch", "--example", "calibrate", "--features", "cuda", "--"]).args(args);
    run(&mut cmd)
}

fn ci(_args: &[String]) -> Result<(), String> {
    run(cargo().args(["fmt", "--all", "--check"]))?;
    run(cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--features",
        CLIPPY_FEATURES,
        "--",
        "-D",
        "warnings",
    ]))?;
    test(&[])
}

/// `cargo tree` checks: what a user who depends on one sub-crate gets.
fn deps() -> Result<(), String> {
    let tree = |args: &[&str]| -> Result<String, String> {
        let out = cargo()
            .args(["tree", "-e", "normal", "--prefix", "none", "--format", "{p}"])
            .args(args)
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let forbidden = ["wgpu", "cudarc", "naga", "ash"];
    for (what, args) in [
        ("compute-simd", &["-p", "compute-simd"][..]),
        ("compute-core", &["-p", "compute-core"][..]),
        ("dispatch --no-default-features", &["-p", "dispatch", "--no-default-features"][..]),
    ] {
        let t = tree(args)?;
        let bad: Vec<&str> =
            t.lines().filter(|l| forbidden.iter().any(|f| l.split_whitespace().next() == Some(*f))).collect();
        if !bad.is_empty() {
            return Err(format!("{what} pulls GPU dependencies: {bad:?}"));
        }
        let crates: std::collections::BTreeSet<&str> = t.lines().filter_map(|l| l.split_whitespace().next()).collect();
        eprintln!("{what}: {} crates, none of {forbidden:?}", crates.len());
    }
    let with_gpu = tree(&["-p", "dispatch"])?;
    if !with_gpu.lines().any(|l| l.starts_with("wgpu ")) {
        return Err("dispatch with default features should pull wgpu (feature `gpu`)".into());
    }
    Ok(())
}
