//! `cargo xtask ptx`: the checked-in PTX of every kernel, checked by `ptxas`.
//!
//! - `cargo xtask ptx` writes `ptx/<target>/<kernel>.ptx` for every kernel of
//!   `compute_ptx::kernels::catalog()` and every target (removing stale files).
//! - `cargo xtask ptx --check` fails if any file differs from what the code
//!   emits (or is missing, or stale), then assembles every file with the real
//!   `ptxas --gpu-name <target>` (CUDA 13.0, installed from PyPI into `.tools/`
//!   when missing; with `CI=true` a missing `ptxas` is a failure) and prints
//!   each kernel's registers and spills.
//!
//! Running the kernels on a GPU is `cargo xtask gpu-bundle` (`gpu.rs`).
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

/// Entry point: `cargo xtask ptx [--check | --help]`.
pub fn run(args: &[String]) -> Result<(), String> {
    let root = workspace_root()?;
    match args.first().map(String::as_str) {
        None | Some("--write") => write(&root),
        Some("--check") => {
            check(&root)?;
            assemble_all(&root)
        }
        Some("--help" | "-h") => {
            println!(
                "cargo xtask ptx          regenerate ptx/<target>/<kernel>.ptx\n\
                 cargo xtask ptx --check  fail on a difference, then assemble every file with ptxas\n\
                 (GPU runs: cargo xtask gpu-bundle)"
            );
            Ok(())
        }
        Some(other) => Err(format!("cargo xtask ptx: unknown argument `{other}` (try --help)")),
    }
}

/// The workspace root: `XTASK_ROOT`, else the parent of xtask's manifest directory.
pub(crate) fn workspace_root() -> Result<PathBuf, String> {
    if let Some(root) = std::env::var_os("XTASK_ROOT") {
        return Ok(PathBuf::from(root));
    }
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent().map(Path::to_path_buf).ok_or_else(|| "xtask has no parent directory".to_string())
}

/// Every (path relative to the root, text) the kernel set emits.
fn generated() -> Result<Vec<(PathBuf, String)>, String> {
    let mut out = Vec::new();
    for target in Target::EMITTED {
        for id in catalog().into_iter().filter(|id| id.targets().contains(&target)) {
            let k = id.build(target).map_err(|e| e.to_string())?;
            out.push((Path::new("ptx").join(target.name()).join(format!("{}.ptx", k.name())), k.into_ptx()));
        }
    }
    Ok(out)
}

/// The `.ptx` files now under `ptx/<target>/`.
fn existing(root: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    for target in Target::EMITTED {
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

/// The one-launch quantized GEMV for long rows (`qgemvx_*_long*`) sizes its
/// grid for `X_BLOCKS_PER_SM` blocks per multiprocessor and relies on its
/// registers to keep another block off (see
/// `compute_ptx::kernels::quant_gemv::X_BLOCKS_PER_SM`): a problem when the
/// file's registers (from `summary`, `Used N registers`, allocated 8 at a
/// time) would let one more block share a multiprocessor's 64 Ki registers.
fn one_launch_gemv_occupancy(rel: &Path, summary: &str) -> Option<String> {
    use compute_ptx::kernels::quant_gemv::{X_BLOCKS_PER_SM, X_THREADS};
    let name = rel.file_name()?.to_str()?;
    if !name.starts_with("qgemvx_") || !name.contains("_long") {
        return None;
    }
    let regs: u32 = summary.split("Used ").nth(1)?.split(' ').next()?.parse().ok()?;
    let per_block = regs.next_multiple_of(8) * X_THREADS;
    (per_block * (X_BLOCKS_PER_SM + 1) <= 65536).then(|| {
        format!(
            "{}: {regs} registers let {} blocks of {X_THREADS} threads share a multiprocessor; the grid is sized for {X_BLOCKS_PER_SM}, and more would stack on some multiprocessors",
            rel.display(),
            65536 / per_block
        )
    })
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
            Ok(summary) => {
                println!("  {:<44} {summary}", rel.display());
                failures.extend(one_launch_gemv_occupancy(rel, summary));
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_one_launch_gemv_light_on_registers_is_a_problem() {
        let gemv = Path::new("ptx/sm_90/qgemvx_q6k_r1_f32_f32_long.ptx");
        let light = one_launch_gemv_occupancy(gemv, "Used 64 registers, used 1 barriers | 0 spill stores");
        assert!(light.is_some_and(|p| p.contains("64 registers let 4 blocks")));
        assert_eq!(one_launch_gemv_occupancy(gemv, "Used 105 registers, used 1 barriers | 0 spill stores"), None);
        // 85 registers are allocated as 88: three blocks do not fit.
        assert_eq!(one_launch_gemv_occupancy(gemv, "Used 85 registers, used 1 barriers"), None);
        for other in ["ptx/sm_90/qgemv_q6k_r1_f32.ptx", "ptx/sm_90/qgemvx_q6k_r1_f32_f32.ptx"] {
            assert_eq!(one_launch_gemv_occupancy(Path::new(other), "Used 40 registers, used 0 barriers"), None);
        }
    }
}
