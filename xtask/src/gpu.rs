//! `cargo xtask gpu-bundle`: builds everything a GPU-machine run needs into `.gpu/`
//! and writes `.gpu/run.sh`, the one script that runs it there.
//!
//! The bundle: the GPU test binaries of compute-ptx (`cuda,nccl`), compute-wgpu
//! and dispatch (`gpu,cuda,nccl`); compute-ptx's `cuda_monitor` (device report),
//! `cuda_bench` (the CUDA benchmark rows standalone, and `--profile-gemm` for
//! `ncu`), `nccl_bench` (all-reduce across every GPU) and `quant_bench`
//! (block-quantized weight products and dequantization) examples; the
//! `compute-bench` binary (skipped with `--no-bench`); the Vulkan loader
//! packages. All release builds, stripped, under `.gpu/bin/`.
//!
//! `bash .gpu/run.sh [tests|sanitize|bench|ncu|all] [FILTER]` (default `all` =
//! tests, sanitize, bench; `ncu` runs only when named; `FILTER` keeps the tests
//! whose names contain it), from the directory that holds
//! `.gpu/`, logging under `$OUT` (default `/tmp/out`):
//! - always: the device (`nvidia-smi`, then `cuda_monitor`) into `device.txt`;
//! - `tests`: the conformance suites at large sizes on CUDA and on the NVIDIA
//!   Vulkan adapter (one test thread), then every test binary again at small
//!   sizes with parallel test threads;
//! - `sanitize`: `compute-sanitizer` memcheck over compute-ptx's conformance
//!   suite, racecheck over its groups whose kernels use shared memory;
//! - `bench`: the benchmark report (`cuda_bench`'s CUDA rows when the bundle
//!   has no `compute-bench`);
//! - `ncu`: Nsight Compute on each register-blocked GEMM shape at 4096³, or
//!   on a bf16 tensor-core GEMM with `NCU_GEMM=mma`, `wgmma` or `tma` (`NCU_N` sets
//!   the size).
//!
//! The machine needs the NVIDIA driver only: no Rust, no CUDA toolkit
//! (`compute-sanitizer` and `ncu` are used when present).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{cargo, run};

const DEBS: &[&str] = &["libvulkan1", "libegl1", "libglvnd0", "libopengl0", "libgl1", "libglx0", "libgles2"];

/// Packages whose GPU test binaries go into the bundle, with the features they are built with.
const TESTS: &[(&str, &str)] = &[("compute-ptx", "cuda,nccl"), ("compute-wgpu", ""), ("dispatch", "gpu,cuda,nccl")];

/// Test targets that exercise a GPU (unit tests, golden and emulator tests run everywhere and stay home).
const GPU_TARGETS: &[&str] = &["conformance", "gpu", "nccl", "async_overlap", "executor", "pool"];

/// compute-ptx's examples the script runs (`--features cuda,nccl`).
const EXAMPLES: &[&str] = &["cuda_monitor", "cuda_bench", "nccl_bench", "quant_bench"];

/// One executable cargo built: its target's name, whether it is a test
/// harness, and its path.
#[derive(Debug, PartialEq)]
struct Artifact {
    name: String,
    test: bool,
    exe: PathBuf,
}

/// The executables in cargo's `--message-format=json` output (libraries and
/// build scripts have none).
fn artifacts(json: &str) -> Vec<Artifact> {
    let field = |line: &str, key: &str| -> Option<String> {
        let tag = format!("\"{key}\":\"");
        let start = line.find(&tag)? + tag.len();
        let rest = &line[start..];
        Some(rest[..rest.find('"')?].to_string())
    };
    json.lines()
        .filter(|l| l.contains("\"reason\":\"compiler-artifact\""))
        .filter_map(|l| {
            // A test harness is built with the `test` profile flag (a target's
            // own `"test":true` only says it is tested by default).
            let profile = &l[l.find("\"profile\":{")?..];
            let test = profile[..profile.find('}')?].contains("\"test\":true");
            // The first `name` of an artifact message is its target's.
            Some(Artifact { name: field(l, "name")?, test, exe: PathBuf::from(field(l, "executable")?) })
        })
        .collect()
}

/// Runs a cargo build with `--message-format=json`; the executables it reports.
fn build(cmd: &mut Command, what: &str) -> Result<Vec<Artifact>, String> {
    eprintln!("building {what}");
    let out = cmd.arg("--message-format=json").output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!("building {what} failed:\n{}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(artifacts(&String::from_utf8_lossy(&out.stdout)))
}

/// Copies `exe` to `dest` and strips it (smaller to move; a missing `strip` only costs size).
fn install(exe: &Path, dest: &Path) -> Result<(), String> {
    std::fs::copy(exe, dest).map_err(|e| format!("{}: {e}", exe.display()))?;
    let _ = Command::new("strip").arg(dest).status();
    Ok(())
}

/// Builds the bundle into `<workspace>/.gpu/`; `args` may contain `--no-bench`.
pub fn bundle(args: &[String]) -> Result<(), String> {
    let root = crate::ptx::workspace_root()?.join(".gpu");
    let root = root.as_path();
    let bin = root.join("bin");
    let _ = std::fs::remove_dir_all(&bin);
    std::fs::create_dir_all(&bin).map_err(|e| e.to_string())?;
    for (pkg, features) in TESTS {
        let mut cmd = cargo();
        cmd.args(["test", "--release", "--no-run", "-p", pkg]);
        if !features.is_empty() {
            cmd.args(["--features", features]);
        }
        for a in build(&mut cmd, &format!("tests of {pkg}"))? {
            if a.test && GPU_TARGETS.contains(&a.name.as_str()) {
                install(&a.exe, &bin.join(format!("test-{pkg}-{}", a.name)))?;
            }
        }
    }
    let mut cmd = cargo();
    cmd.args(["build", "--release", "-p", "compute-ptx", "--features", "cuda,nccl"]);
    for ex in EXAMPLES {
        cmd.args(["--example", ex]);
    }
    let built = build(&mut cmd, &format!("compute-ptx examples {}", EXAMPLES.join(", ")))?;
    for ex in EXAMPLES {
        let a = built.iter().find(|a| a.name == *ex).ok_or_else(|| format!("cargo reported no `{ex}` example"))?;
        install(&a.exe, &bin.join(ex))?;
    }
    if !args.iter().any(|a| a == "--no-bench") {
        let mut cmd = cargo();
        cmd.args(["build", "--release", "-p", "compute-benches", "--bin", "compute-bench"]);
        cmd.args(["--features", "gpu,cuda,dispatch"]);
        let built = build(&mut cmd, "compute-bench")?;
        let a = built.iter().find(|a| a.name == "compute-bench").ok_or("cargo reported no `compute-bench` binary")?;
        install(&a.exe, &bin.join("compute-bench"))?;
    }
    let gl = root.join("gl");
    if std::fs::read_dir(&gl).map(|d| d.count()).unwrap_or(0) < DEBS.len() {
        std::fs::create_dir_all(&gl).map_err(|e| e.to_string())?;
        std::fs::create_dir_all("/tmp/amd64/partial").map_err(|e| e.to_string())?;
        let o = ["-oAPT::Architecture=amd64", "-oAPT::Architectures=amd64", "-oDir::State::Lists=/tmp/amd64"];
        run(Command::new("apt-get").args(o).arg("update"))?;
        run(Command::new("apt-get").args(o).arg("download").args(DEBS).current_dir(&gl))?;
    }
    std::fs::write(root.join("run.sh"), RUN_SH).map_err(|e| e.to_string())?;
    eprintln!(
        "bundle ready in .gpu/ ({}); on the GPU machine, from the directory holding .gpu/:\n  \
         bash .gpu/run.sh [tests|sanitize|bench|ncu|all] [FILTER]    # default all = tests, sanitize, bench; logs under $OUT",
        Command::new("du")
            .arg("-sh")
            .arg(root)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).split_whitespace().next().unwrap_or("").to_string())
            .unwrap_or_default()
    );
    Ok(())
}

const RUN_SH: &str = r#"#!/usr/bin/env bash
# Written by `cargo xtask gpu-bundle`. Usage: bash .gpu/run.sh [tests|sanitize|bench|ncu|all] [FILTER]
# all (the default) = tests, sanitize, bench; ncu runs only when named. Logs under $OUT.
# FILTER (tests only) keeps the tests whose names contain it, e.g. `tests matmul`: a
# whole large-size run takes longer than one 10-minute call, so split it by group.
set -uo pipefail
what="${1:-all}"
filter="${2:-}"
case "$what" in
  tests|sanitize|bench|ncu|all) ;;
  *) echo "usage: bash .gpu/run.sh [tests|sanitize|bench|ncu|all] [FILTER]" >&2; exit 2 ;;
esac
step() { [ "$what" = "$1" ] || { [ "$what" = all ] && [ "$1" != ncu ]; }; }
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
for f in .gpu/gl/*.deb; do dpkg -x "$f" / ; done; ldconfig
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PATH=$PATH:/usr/local/cuda/bin
export RUST_BACKTRACE=1
export XDG_RUNTIME_DIR=/tmp/xdg; mkdir -p $XDG_RUNTIME_DIR
[ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ] && export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1 | tee "$OUT/device.txt"
.gpu/bin/cuda_monitor 2>&1 | tee -a "$OUT/device.txt"
rc=0
if step tests; then
  for t in .gpu/bin/test-*; do
    case "$t" in
      *compute-*-conformance)
        # Large sizes in every dtype: one process and one time limit per group,
        # so a slow group cannot cut the others short.
        for g in $("$t" --list 2>/dev/null | sed -n 's/: test$//p'); do
          case "$g" in *"$filter"*) ;; *) continue ;; esac
          echo "== $t $g" | tee -a "$OUT/tests.log"
          COMPUTE_REQUIRE=cuda,wgpu COMPUTE_CONFORMANCE=large timeout 240 "$t" --exact "$g" --test-threads=1 2>&1 | tail -n 20 >> "$OUT/tests.log" || rc=1
        done ;;
      *)
        echo "== $t" | tee -a "$OUT/tests.log"
        COMPUTE_REQUIRE=cuda,wgpu COMPUTE_CONFORMANCE=small timeout 240 "$t" $filter --test-threads=1 2>&1 | tail -n 60 >> "$OUT/tests.log" || rc=1 ;;
    esac
  done
  # Again with the default test threads: many tests share one process-wide
  # backend, so this is where races between calls show up.
  for t in .gpu/bin/test-*; do
    echo "== $t (parallel)" | tee -a "$OUT/tests.log"
    COMPUTE_REQUIRE=cuda,wgpu COMPUTE_CONFORMANCE=small timeout 240 "$t" $filter 2>&1 | tail -n 60 >> "$OUT/tests.log" || rc=1
  done
  grep -E "^== |^test result|FAILED|panicked" "$OUT/tests.log" | tail -n 60
fi
if step sanitize; then
  san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  t=.gpu/bin/test-compute-ptx-conformance
  COMPUTE_REQUIRE=cuda "$san" --tool memcheck --error-exitcode 3 "$t" --test-threads=1 > "$OUT/sanitize-memcheck.log" 2>&1 || rc=1
  tail -n 5 "$OUT/sanitize-memcheck.log"
  # racecheck is slow: only the groups whose kernels use shared memory.
  COMPUTE_REQUIRE=cuda "$san" --tool racecheck --error-exitcode 3 "$t" --test-threads=1 matmul conv2d row_ops reductions > "$OUT/sanitize-racecheck.log" 2>&1 || rc=1
  tail -n 5 "$OUT/sanitize-racecheck.log"
fi
if step bench; then
  if [ -x .gpu/bin/compute-bench ]; then
    .gpu/bin/compute-bench --backend wgpu --backend cuda --dispatch --threads 16 --json "$OUT/bench.json" --svg "$OUT/bench.svg" 2>&1 | tee "$OUT/bench.log" | tail -n 80
  else
    echo "no compute-bench in the bundle (--no-bench): the CUDA rows only"
    .gpu/bin/cuda_bench 2>&1 | tee "$OUT/bench.log" | tail -n 80
  fi
  # PyTorch's figures for the f16/bf16 rows, same sizes, when PyTorch is there.
  if [ -f benches/torch_half.py ] && python3 -c "import torch" 2>/dev/null; then
    python3 benches/torch_half.py 2>&1 | tee "$OUT/torch-half.jsonl"
  fi
fi
if step ncu; then
  # Each register-blocked GEMM shape (NCU_GEMM=simt, the default) or a bf16
  # tensor-core GEMM (NCU_GEMM=mma, wgmma or tma) once at ${NCU_N:-4096}^3, profiled by Nsight Compute.
  ncu_bin=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  which_gemm="${NCU_GEMM:-simt}"
  timeout "${NCU_SECS:-120}" "$ncu_bin" --clock-control none -k "regex:gemm_$which_gemm" --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis .gpu/bin/cuda_bench --profile-gemm "${NCU_N:-4096}" "$which_gemm" > "$OUT/ncu.log" 2>&1 || rc=1
  grep -E "gemm_|Throughput|Occupancy|Pipe|ERROR|error" "$OUT/ncu.log" | cut -c1-200 | head -n 80
fi
exit $rc
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn artifacts_name_tests_examples_and_binaries() {
        let json = [
            r#"{"reason":"compiler-artifact","package_id":"path+file:///w/crates/compute-ptx#0.1.0","manifest_path":"/w/crates/compute-ptx/Cargo.toml","target":{"kind":["test"],"crate_types":["bin"],"name":"conformance","src_path":"/w/crates/compute-ptx/tests/conformance.rs","edition":"2024","doc":false,"doctest":false,"test":true},"profile":{"opt_level":"3","debuginfo":0,"debug_assertions":false,"overflow_checks":false,"test":true},"features":["cuda"],"filenames":["/w/target/release/deps/conformance-0123"],"executable":"/w/target/release/deps/conformance-0123","fresh":true}"#,
            r#"{"reason":"compiler-artifact","package_id":"path+file:///w/crates/compute-ptx#0.1.0","manifest_path":"/w/crates/compute-ptx/Cargo.toml","target":{"kind":["example"],"crate_types":["bin"],"name":"cuda_monitor","src_path":"/w/crates/compute-ptx/examples/cuda_monitor.rs","edition":"2024","doc":false,"doctest":false,"test":false},"profile":{"opt_level":"3","debuginfo":0,"debug_assertions":false,"overflow_checks":false,"test":false},"features":["cuda"],"filenames":["/w/target/release/examples/cuda_monitor"],"executable":"/w/target/release/examples/cuda_monitor","fresh":true}"#,
            r#"{"reason":"compiler-artifact","package_id":"path+file:///w/benches#0.1.0","manifest_path":"/w/benches/Cargo.toml","target":{"kind":["bin"],"crate_types":["bin"],"name":"compute-bench","src_path":"/w/benches/src/main.rs","edition":"2024","doc":true,"doctest":false,"test":true},"profile":{"opt_level":"3","debuginfo":0,"debug_assertions":false,"overflow_checks":false,"test":false},"features":[],"filenames":["/w/target/release/compute-bench"],"executable":"/w/target/release/compute-bench","fresh":false}"#,
            r#"{"reason":"compiler-artifact","package_id":"path+file:///w/crates/compute-ptx#0.1.0","manifest_path":"/w/crates/compute-ptx/Cargo.toml","target":{"kind":["lib"],"crate_types":["lib"],"name":"compute_ptx","src_path":"/w/crates/compute-ptx/src/lib.rs","edition":"2024","doc":true,"doctest":true,"test":true},"profile":{"opt_level":"3","debuginfo":0,"debug_assertions":false,"overflow_checks":false,"test":false},"features":["cuda"],"filenames":["/w/target/release/deps/libcompute_ptx-0123.rlib"],"executable":null,"fresh":true}"#,
            r#"{"reason":"build-finished","success":true}"#,
        ]
        .join("\n");
        let got = artifacts(&json);
        let want = [
            ("conformance", true, "/w/target/release/deps/conformance-0123"),
            ("cuda_monitor", false, "/w/target/release/examples/cuda_monitor"),
            ("compute-bench", false, "/w/target/release/compute-bench"),
        ]
        .map(|(name, test, exe)| Artifact { name: name.into(), test, exe: exe.into() });
        assert_eq!(got, want);
    }
}
