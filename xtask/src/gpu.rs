//! `cargo xtask gpu-bundle`: builds everything a GPU-machine run needs into `.gpu/`
//! (test binaries, the bench binary, the Vulkan loader packages) and writes
//! `.gpu/run.sh`, which runs the conformance suites at large sizes on CUDA and on
//! the NVIDIA Vulkan adapter (one test thread), every test binary again at small
//! sizes with parallel test threads, then the benchmark report, logging under `$OUT`.
//! The machine needs the NVIDIA driver only: no Rust, no CUDA toolkit
//! (compute-sanitizer is used when present).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{cargo, run};

const DEBS: &[&str] = &["libvulkan1", "libegl1", "libglvnd0", "libopengl0", "libgl1", "libglx0", "libgles2"];

/// Test binaries and the bench binary to build, with their features.
const TESTS: &[(&str, &str)] = &[("compute-ptx", "cuda"), ("compute-wgpu", ""), ("dispatch", "gpu,cuda")];

/// Test targets that exercise a GPU (unit tests, golden and emulator tests run everywhere and stay home).
const GPU_TARGETS: &[&str] = &["conformance", "gpu", "async_overlap", "executor", "pool"];

fn executables(json: &str) -> Vec<PathBuf> {
    json.lines()
        .filter(|l| l.contains("\"reason\":\"compiler-artifact\"") && l.contains("\"test\":true"))
        .filter_map(|l| {
            let i = l.find("\"executable\":\"")? + "\"executable\":\"".len();
            let rest = &l[i..];
            Some(PathBuf::from(&rest[..rest.find('"')?]))
        })
        .collect()
}

/// Builds the bundle; `args` may contain `--no-bench`.
pub fn bundle(args: &[String]) -> Result<(), String> {
    let root = Path::new(".gpu");
    let bin = root.join("bin");
    let _ = std::fs::remove_dir_all(&bin);
    std::fs::create_dir_all(&bin).map_err(|e| e.to_string())?;
    for (pkg, features) in TESTS {
        let mut cmd = cargo();
        cmd.args(["test", "--release", "--no-run", "--message-format=json", "-p", pkg]);
        if !features.is_empty() {
            cmd.args(["--features", features]);
        }
        eprintln!("building tests of {pkg}");
        let out = cmd.output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!("building {pkg} tests failed:\n{}", String::from_utf8_lossy(&out.stderr)));
        }
        for exe in executables(&String::from_utf8_lossy(&out.stdout)) {
            let name = exe.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            // Cargo names test binaries `<target>-<hash>`; keep the package in the name.
            let target = name.rsplit_once('-').map_or(name.as_str(), |(n, _)| n);
            if !GPU_TARGETS.contains(&target) {
                continue;
            }
            let dest = bin.join(format!("test-{pkg}-{target}"));
            std::fs::copy(&exe, &dest).map_err(|e| format!("{}: {e}", exe.display()))?;
            let _ = Command::new("strip").arg(&dest).status();
        }
    }
    if !args.iter().any(|a| a == "--no-bench") {
        run(cargo().args([
            "build",
            "--release",
            "-p",
            "compute-benches",
            "--bin",
            "compute-bench",
            "--features",
            "gpu,cuda,dispatch",
        ]))?;
        let dest = bin.join("compute-bench");
        let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
        let built = Path::new(&target).join("release").join("compute-bench");
        std::fs::copy(&built, &dest).map_err(|e| format!("{}: {e}", built.display()))?;
        let _ = Command::new("strip").arg(&dest).status();
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
        "bundle ready in .gpu/ ({}); on the GPU machine run, with .gpu carried:\n  bash .gpu/run.sh [tests|bench|all]",
        Command::new("du")
            .args(["-sh", ".gpu"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    );
    Ok(())
}

const RUN_SH: &str = r#"#!/usr/bin/env bash
# Written by `cargo xtask gpu-bundle`. Usage: bash .gpu/run.sh [tests|sanitize|bench|all]
set -uo pipefail
what="${1:-all}"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
for f in .gpu/gl/*.deb; do dpkg -x "$f" / ; done; ldconfig
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export XDG_RUNTIME_DIR=/tmp/xdg; mkdir -p $XDG_RUNTIME_DIR
[ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ] && export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/device.txt"
rc=0
if [ "$what" = tests ] || [ "$what" = all ]; then
  for t in .gpu/bin/test-*; do
    echo "== $t" | tee -a "$OUT/tests.log"
    case "$t" in *compute-*-conformance) scale=large ;; *) scale=small ;; esac
    COMPUTE_REQUIRE=cuda,wgpu COMPUTE_CONFORMANCE=$scale timeout 240 "$t" --test-threads=1 2>&1 | tail -n 60 >> "$OUT/tests.log" || rc=1
  done
  # Again with the default test threads: many tests share one process-wide
  # backend, so this is where races between calls show up.
  for t in .gpu/bin/test-*; do
    echo "== $t (parallel)" | tee -a "$OUT/tests.log"
    COMPUTE_REQUIRE=cuda,wgpu COMPUTE_CONFORMANCE=small timeout 240 "$t" 2>&1 | tail -n 60 >> "$OUT/tests.log" || rc=1
  done
  grep -E "^== |^test result|FAILED|panicked" "$OUT/tests.log" | tail -n 60
fi
if [ "$what" = sanitize ] || [ "$what" = all ]; then
  san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  for tool in memcheck racecheck; do
    for t in .gpu/bin/test-compute-ptx-conformance; do
      COMPUTE_REQUIRE=cuda "$san" --tool $tool --error-exitcode 3 "$t" --test-threads=1 > "$OUT/sanitize-$tool.log" 2>&1 || rc=1
      tail -n 5 "$OUT/sanitize-$tool.log"
    done
  done
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  .gpu/bin/compute-bench --backend wgpu --backend cuda --dispatch --threads 16 --json "$OUT/bench.json" --svg "$OUT/bench.svg" 2>&1 | tee "$OUT/bench.log" | tail -n 80
fi
exit $rc
"#;
