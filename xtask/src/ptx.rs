//! `cargo xtask ptx`: the checked-in PTX of every kernel, and the GPU recipe.
//!
//! - `cargo xtask ptx` writes `ptx/<target>/<kernel>.ptx` for every kernel of
//!   `compute_ptx::kernels::catalog()` and every target (removing stale files).
//! - `cargo xtask ptx --check` fails if any file differs from what the code
//!   emits (or is missing, or stale), then assembles every file with the real
//!   `ptxas --gpu-name <target>` (CUDA 13.0, installed from PyPI into `.tools/`
//!   when missing; with `CI=true` a missing `ptxas` is a failure) and prints
//!   each kernel's registers and spills.
//! - `cargo xtask ptx --gpu-bundle` builds the CUDA test binaries, examples and
//!   benchmark (release, `--features cuda`) into `.gpu/ptx/` with a `run.sh`
//!   that runs the conformance suite (large), the GPU tests,
//!   `compute-sanitizer` memcheck and racecheck, and the benchmarks there.
//!
//! `XTASK_ROOT` overrides the workspace root (for running this module from
//! another crate).

use std::path::{Path, PathBuf};
use std::process::Command;

use compute_ptx::Target;
use compute_ptx::kernels::catalog;

/// The `nvidia-cuda-nvcc` wheel whose `ptxas` matches the GPU machine's driver (CUDA 13.0).
const NVCC_WHEEL: &str = "nvidia-cuda-nvcc==13.0.88";
const TOOLS_DIR: &str = ".tools/cuda-nvcc";

/// Entry point: `cargo xtask ptx [--check | --gpu-bundle | --help]`.
pub fn run(args: &[String]) -> Result<(), String> {
    let root = workspace_root()?;
    match args.first().map(String::as_str) {
        None | Some("--write") => write(&root),
        Some("--check") => {
            check(&root)?;
            assemble_all(&root)
        }
        Some("--gpu-bundle") => gpu_bundle(&root),
        Some("--help" | "-h") => {
            println!(
                "cargo xtask ptx              regenerate ptx/<target>/<kernel>.ptx\n\
                 cargo xtask ptx --check      fail on a difference, then assemble every file with ptxas\n\
                 cargo xtask ptx --gpu-bundle build the CUDA tests/benches into .gpu/ptx/ and print the device command"
            );
            Ok(())
        }
        Some(other) => Err(format!("cargo xtask ptx: unknown argument `{other}` (try --help)")),
    }
}

fn workspace_root() -> Result<PathBuf, String> {
    if let Some(root) = std::env::var_os("XTASK_ROOT") {
        return Ok(PathBuf::from(root));
    }
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent().map(Path::to_path_buf).ok_or_else(|| "xtask has no parent directory".to_string())
}

/// Every (path relative to the root, text) the kernel set emits.
fn generated() -> Result<Vec<(PathBuf, String)>, String> {
    let mut out = Vec::new();
    for target in Target::ALL {
        for id in catalog() {
            let k = id.build(target).map_err(|e| e.to_string())?;
            out.push((Path::new("ptx").join(target.name()).join(format!("{}.ptx", k.name())), k.into_ptx()));
        }
    }
    Ok(out)
}

/// The `.ptx` files now under `ptx/<target>/`.
fn existing(root: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    for target in Target::ALL {
        let dir = root.join("ptx").join(target.name());
        if let Ok(rd) = std::fs::read_dir(&dir) {
            for e in rd.flatten() {
                let p = e.path();
                if p.extension().is_some_and(|x| x == "ptx")
                    && let Ok(rel) = p.strip_prefix(root)
                {
                    v.push(rel.to_path_buf());
                }
            }
        }
    }
    v.sort();
    v
}

fn write(root: &Path) -> Result<(), String> {
    let files = generated()?;
    let mut changed = 0;
    for (rel, text) in &files {
        let path = root.join(rel);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
            std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
            changed += 1;
        }
    }
    let mut removed = 0;
    for rel in existing(root) {
        if !files.iter().any(|(r, _)| *r == rel) {
            std::fs::remove_file(root.join(&rel)).map_err(|e| format!("{}: {e}", rel.display()))?;
            removed += 1;
        }
    }
    println!("ptx: {} files ({changed} changed, {removed} stale removed) under ptx/", files.len());
    Ok(())
}

fn check(root: &Path) -> Result<(), String> {
    let files = generated()?;
    let mut problems = Vec::new();
    for (rel, text) in &files {
        match std::fs::read_to_string(root.join(rel)) {
            Ok(t) if t == *text => {}
            Ok(_) => problems.push(format!("{} differs from what the code emits", rel.display())),
            Err(_) => problems.push(format!("{} is missing", rel.display())),
        }
    }
    for rel in existing(root) {
        if !files.iter().any(|(r, _)| *r == rel) {
            problems.push(format!("{} is stale (no kernel emits it)", rel.display()));
        }
    }
    if !problems.is_empty() {
        return Err(format!("ptx/ is out of date; run `cargo xtask ptx`:\n  {}", problems.join("\n  ")));
    }
    println!("ptx: all {} files match the generator", files.len());
    Ok(())
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

fn find_in(dir: &Path, name: &str, depth: usize) -> Option<PathBuf> {
    let rd = std::fs::read_dir(dir).ok()?;
    let mut dirs = Vec::new();
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            dirs.push(p);
        } else if p.file_name().is_some_and(|f| f == name) {
            return Some(p);
        }
    }
    if depth == 0 {
        return None;
    }
    dirs.into_iter().find_map(|d| find_in(&d, name, depth - 1))
}

/// `ptxas`: `$PTXAS`, the copy under `.tools/`, or one on `PATH`; installs the
/// pinned wheel into `.tools/` when none is found.
fn ptxas(root: &Path) -> Result<Option<PathBuf>, String> {
    if let Ok(p) = std::env::var("PTXAS") {
        return Ok(Some(PathBuf::from(p)));
    }
    let tools = root.join(TOOLS_DIR);
    if let Some(p) = find_in(&tools, "ptxas", 5) {
        return Ok(Some(p));
    }
    if Command::new("ptxas").arg("--version").output().is_ok_and(|o| o.status.success()) {
        return Ok(Some(PathBuf::from("ptxas")));
    }
    println!("ptx: installing ptxas ({NVCC_WHEEL}) into {TOOLS_DIR}");
    let mut installed = false;
    for py in ["python3", "python"] {
        let status = Command::new(py)
            .args(["-m", "pip", "install", "--quiet", "--no-deps", "--target"])
            .arg(&tools)
            .arg(NVCC_WHEEL)
            .status();
        if status.is_ok_and(|s| s.success()) {
            installed = true;
            break;
        }
    }
    let found = if installed { find_in(&tools, "ptxas", 5) } else { None };
    match found {
        Some(p) => Ok(Some(p)),
        None if in_ci() => Err(format!("ptxas not found and `pip install {NVCC_WHEEL}` failed (CI=true)")),
        None => {
            println!("ptx: WARNING: no ptxas (pip install of {NVCC_WHEEL} failed); skipping assembly");
            Ok(None)
        }
    }
}

/// One file's `ptxas -v` summary, or its error output.
fn assemble(ptxas: &Path, target: &str, file: &Path) -> Result<String, String> {
    let out = Command::new(ptxas)
        .args(["--gpu-name", target, "-v", "-o"])
        .arg(if cfg!(windows) { "NUL" } else { "/dev/null" })
        .arg(file)
        .output()
        .map_err(|e| format!("running {}: {e}", ptxas.display()))?;
    let text = String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!("{}: ptxas failed:\n{text}", file.display()));
    }
    let pick = |key: &str| {
        text.lines().find(|l| l.contains(key)).map(|l| l.split("info    :").last().unwrap_or(l).trim().to_string())
    };
    Ok(format!(
        "{} | {}",
        pick("registers").unwrap_or_default(),
        pick("spill").map(|s| s.replace("bytes ", "")).unwrap_or_default()
    ))
}

fn assemble_all(root: &Path) -> Result<(), String> {
    let Some(ptxas) = ptxas(root)? else { return Ok(()) };
    let version = Command::new(&ptxas).arg("--version").output().map_err(|e| format!("{}: {e}", ptxas.display()))?;
    let version = String::from_utf8_lossy(&version.stdout);
    let release = version.lines().find(|l| l.contains("release")).unwrap_or("unknown release").trim();
    println!("ptx: assembling with {} ({release})", ptxas.display());
    let files = existing(root);
    let results: Vec<(PathBuf, Result<String, String>)> = std::thread::scope(|s| {
        let chunks: Vec<&[PathBuf]> = files.chunks(files.len().div_ceil(4).max(1)).collect();
        let handles: Vec<_> = chunks
            .into_iter()
            .map(|chunk| {
                let ptxas = &ptxas;
                s.spawn(move || {
                    chunk
                        .iter()
                        .map(|rel| {
                            let target = rel.iter().nth(1).and_then(|t| t.to_str()).unwrap_or("sm_90").to_string();
                            (rel.clone(), assemble(ptxas, &target, &root.join(rel)))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap_or_default()).collect()
    });
    let mut failures = Vec::new();
    for (rel, r) in &results {
        match r {
            Ok(summary) => println!("  {:<44} {summary}", rel.display()),
            Err(e) => failures.push(e.clone()),
        }
    }
    if results.len() != files.len() {
        failures.push("a ptxas worker thread failed".into());
    }
    if !failures.is_empty() {
        return Err(failures.join("\n"));
    }
    println!("ptx: ptxas accepted all {} files", files.len());
    Ok(())
}

/// Runs cargo with `args` and returns the executables it reports (JSON messages).
fn cargo_executables(root: &Path, args: &[&str]) -> Result<Vec<(String, PathBuf)>, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(root)
        .args(args)
        .arg("--message-format=json")
        .output()
        .map_err(|e| format!("cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!("cargo {} failed:\n{}", args.join(" "), String::from_utf8_lossy(&out.stderr)));
    }
    let mut v = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let field = |key: &str| {
            let start = line.find(&format!("\"{key}\":\""))? + key.len() + 4;
            let end = start + line.get(start..)?.find('"')?;
            line.get(start..end).map(str::to_string)
        };
        if let (Some(exe), Some(name)) = (field("executable"), field("name")) {
            v.push((name, PathBuf::from(exe)));
        }
    }
    Ok(v)
}

const RUN_SH: &str = r#"#!/bin/bash
# Generated by `cargo xtask ptx --gpu-bundle`: the CUDA backend's checks on a GPU machine.
# Usage: bash .gpu/ptx/run.sh [STEP...]   STEP: bench gpu conformance memcheck racecheck ncu
# (default: the first five, in that order)
# Logs under $OUT (default /tmp/ptx-out); a summary line per step at the end.
B=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/ptx-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PATH=/usr/local/cuda/bin:$PATH
export COMPUTE_REQUIRE=cuda RUST_BACKTRACE=1
step() { local name=$1 secs=$2; shift 2; echo "== $name"; local t0=$(date +%s)
  timeout "$secs" "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  printf '%-14s rc=%-4s %5ss\n' "$name" "$rc" "$(( $(date +%s) - t0 ))" | tee -a "$OUT/summary.txt"
  tail -n 40 "$OUT/$name.log" | grep -E 'test result|FAILED|panicked|ERROR SUMMARY|RACECHECK SUMMARY|error|sgemm|relu|gelu|add |dot|sum |softmax|layer_norm' | cut -c1-300 | head -30; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv > "$OUT/device.txt" 2>&1
"$B/cuda_monitor" | tee -a "$OUT/device.txt"
STEPS=${*:-bench gpu conformance memcheck racecheck}
for s in $STEPS; do case $s in
  bench) step bench ${BENCH_SECS:-240} "$B/cuda_bench" ${BENCH_ARGS:-} ;;
  gpu) step gpu ${GPU_SECS:-200} "$B/gpu" --test-threads=1 ;;
  conformance) COMPUTE_CONFORMANCE=large step conformance ${CONF_SECS:-300} "$B/conformance" --test-threads=1 ;;
  memcheck) step memcheck ${MEMCHECK_SECS:-300} compute-sanitizer --tool memcheck --error-exitcode 9 "$B/conformance" --test-threads=1 ;;
  ncu) step ncu ${NCU_SECS:-120} ncu --clock-control none -k regex:gemm_simt --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis "$B/cuda_bench" --profile-gemm 4096 ;;
  racecheck) step racecheck ${RACECHECK_SECS:-300} compute-sanitizer --tool racecheck --error-exitcode 9 "$B/conformance" --test-threads=1 matmul conv2d row_ops reductions ;;
  *) echo "unknown step $s" ;;
esac; done
cat "$OUT/summary.txt"
"#;

fn gpu_bundle(root: &Path) -> Result<(), String> {
    let dir = root.join(".gpu").join("ptx");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    println!("ptx: building the CUDA test binaries, examples and benchmark (release, --features cuda)");
    let mut exes = cargo_executables(
        root,
        &[
            "test",
            "--release",
            "-p",
            "compute-ptx",
            "--features",
            "cuda",
            "--no-run",
            "--test",
            "conformance",
            "--test",
            "gpu",
        ],
    )?;
    exes.extend(cargo_executables(
        root,
        &[
            "build",
            "--release",
            "-p",
            "compute-ptx",
            "--features",
            "cuda",
            "--example",
            "cuda_monitor",
            "--example",
            "cuda_bench",
        ],
    )?);
    for (name, exe) in &exes {
        let dst = dir.join(name);
        std::fs::copy(exe, &dst).map_err(|e| format!("copying {}: {e}", exe.display()))?;
        // Smaller to carry; a missing `strip` only costs size.
        let _ = Command::new("strip").arg(&dst).status();
        println!("  .gpu/ptx/{name}");
    }
    let script = dir.join("run.sh");
    std::fs::write(&script, RUN_SH).map_err(|e| format!("{}: {e}", script.display()))?;
    println!("  .gpu/ptx/run.sh");
    println!(
        "\nOn the GPU machine (device `run` tool, carry [\".gpu\"]), one call:\n  \
         bash .gpu/ptx/run.sh        # or some of: bench gpu conformance memcheck racecheck; logs under $OUT"
    );
    Ok(())
}
