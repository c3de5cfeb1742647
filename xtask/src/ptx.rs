//! `cargo xtask ptx`: the checked-in PTX of every kernel, checked by `ptxas`.
//!
//! - `cargo xtask ptx` writes `ptx/<target>/<kernel>.ptx` for every kernel of
//!   `compute_ptx::kernels::catalog()` and every target (removing stale files).
//! - `cargo xtask ptx --check` fails if any file differs from what the code
//!   emits (or is missing, or stale), then assembles every file with the real
//!   `ptxas --gpu-name <target>` (CUDA 13.0, installed from PyPI into `.tools/`
//!   when missing; with `CI=true` a missing `ptxas` is a failure) and prints
//!   each kernel's registers and spills. Every kernel that waits for the
//!   kernel before it (`griddepcontrol.wait`, programmatic dependent launch)
//!   is also disassembled with `nvdisasm` (installed the same way): no global
//!   memory access may come before the wait (`ACQBULK`) in its machine code,
//!   since `ptxas` moves `ld.global.nc` loads, which it takes for constants,
//!   above the wait where it can.
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
/// The wheel of `nvdisasm`, which reads the machine code `ptxas` writes.
const NVDISASM_WHEEL: &str = "nvidia-cuda-nvdisasm==13.5.37";
const NVDISASM_DIR: &str = ".tools/cuda-nvdisasm";

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
    tool(root, ("ptxas", "PTXAS"), NVCC_WHEEL, TOOLS_DIR)
}

/// `nvdisasm`, found or installed as [`ptxas`] is.
fn nvdisasm(root: &Path) -> Result<Option<PathBuf>, String> {
    tool(root, ("nvdisasm", "NVDISASM"), NVDISASM_WHEEL, NVDISASM_DIR)
}

/// A CUDA tool `name`: the path in `$var`, the copy under `dir`, or one on
/// `PATH`; installs `wheel` into `dir` when none is found (with `CI=true` a
/// failed install is an error, else a warning and `None`).
fn tool(root: &Path, (name, var): (&str, &str), wheel: &str, dir: &str) -> Result<Option<PathBuf>, String> {
    if let Ok(p) = std::env::var(var) {
        return Ok(Some(PathBuf::from(p)));
    }
    let tools = root.join(dir);
    if let Some(p) = find_in(&tools, name, 5) {
        return Ok(Some(p));
    }
    if Command::new(name).arg("--version").output().is_ok_and(|o| o.status.success()) {
        return Ok(Some(PathBuf::from(name)));
    }
    println!("ptx: installing {name} ({wheel}) into {dir}");
    let mut installed = false;
    for py in ["python3", "python"] {
        let status = Command::new(py)
            .args(["-m", "pip", "install", "--quiet", "--no-deps", "--target"])
            .arg(&tools)
            .arg(wheel)
            .status();
        if status.is_ok_and(|s| s.success()) {
            installed = true;
            break;
        }
    }
    let found = if installed { find_in(&tools, name, 5) } else { None };
    match found {
        Some(p) => Ok(Some(p)),
        None if in_ci() => Err(format!("{name} not found and `pip install {wheel}` failed (CI=true)")),
        None => {
            println!("ptx: WARNING: no {name} (pip install of {wheel} failed); skipping what needs it");
            Ok(None)
        }
    }
}

/// One file's `ptxas -v` summary, or its error output. With `disasm` (and a
/// kernel that waits for the one before it), the machine code is written to
/// `cubin` and checked by [`memory_after_wait`].
fn assemble(ptxas: &Path, target: &str, file: &Path, disasm: Option<(&Path, &Path)>) -> Result<String, String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let disasm = disasm.filter(|_| text.contains("griddepcontrol.wait"));
    let null = PathBuf::from(if cfg!(windows) { "NUL" } else { "/dev/null" });
    let out_file = disasm.map_or(null.as_path(), |(_, cubin)| cubin);
    let out = Command::new(ptxas)
        .args(["--gpu-name", target, "-v", "-o"])
        .arg(out_file)
        .arg(file)
        .output()
        .map_err(|e| format!("running {}: {e}", ptxas.display()))?;
    let text = String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!("{}: ptxas failed:\n{text}", file.display()));
    }
    if let Some((nvdisasm, cubin)) = disasm {
        let sass = Command::new(nvdisasm)
            .arg("-c")
            .arg(cubin)
            .output()
            .map_err(|e| format!("running {}: {e}", nvdisasm.display()))?;
        if !sass.status.success() {
            return Err(format!("{}: nvdisasm failed: {}", file.display(), String::from_utf8_lossy(&sass.stderr)));
        }
        memory_after_wait(&String::from_utf8_lossy(&sass.stdout)).map_err(|e| format!("{}: {e}", file.display()))?;
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

/// Checks the machine code (`nvdisasm -c` output) of a kernel that waits for
/// the kernel before it: no instruction that reads or writes global memory
/// (`LDG`, `STG`, `LDGSTS`, atomics and reductions, generic `LD`/`ST`, bulk
/// and tensor copies) comes before the first `ACQBULK` (`griddepcontrol.wait`).
/// Prefetches (`CCTL`), constant loads (`LDC`) and shared memory may.
fn memory_after_wait(sass: &str) -> Result<(), String> {
    const GLOBAL: [&str; 10] = ["LDG", "STG", "LDGSTS", "ATOMG", "ATOM", "RED", "LD", "ST", "UBLKCP", "UTMALDG"];
    let mnemonic = |line: &str| -> Option<String> {
        // "        /*0270*/                   LDG.E.128.CONSTANT R72, desc[UR6][R4.64] ;"
        let rest = line.trim_start().strip_prefix("/*")?.split_once("*/")?.1.trim_start();
        let rest = rest.strip_prefix('@').map_or(rest, |r| r.split_once(' ').map_or("", |(_, i)| i.trim_start()));
        let op = rest.split([' ', ';']).next()?;
        Some(op.split('.').next()?.to_string())
    };
    for line in sass.lines() {
        let Some(op) = mnemonic(line) else { continue };
        if op == "ACQBULK" {
            return Ok(());
        }
        if GLOBAL.contains(&op.as_str()) {
            return Err(format!("a global memory access before griddepcontrol.wait: {}", line.trim()));
        }
    }
    Err("waits for the kernel before it (griddepcontrol.wait) but its machine code has no ACQBULK".into())
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
    let nvdisasm = nvdisasm(root)?;
    let scratch = root.join("target").join("xtask-ptx");
    std::fs::create_dir_all(&scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
    let version = Command::new(&ptxas).arg("--version").output().map_err(|e| format!("{}: {e}", ptxas.display()))?;
    let version = String::from_utf8_lossy(&version.stdout);
    let release = version.lines().find(|l| l.contains("release")).unwrap_or("unknown release").trim();
    println!("ptx: assembling with {} ({release})", ptxas.display());
    let files = existing(root);
    let results: Vec<(PathBuf, Result<String, String>)> = std::thread::scope(|s| {
        let chunks: Vec<&[PathBuf]> = files.chunks(files.len().div_ceil(4).max(1)).collect();
        let handles: Vec<_> = chunks
            .into_iter()
            .enumerate()
            .map(|(i, chunk)| {
                let (ptxas, nvdisasm) = (&ptxas, nvdisasm.as_deref());
                let cubin = scratch.join(format!("worker{i}.cubin"));
                s.spawn(move || {
                    chunk
                        .iter()
                        .map(|rel| {
                            let target = rel.iter().nth(1).and_then(|t| t.to_str()).unwrap_or("sm_90").to_string();
                            let disasm = nvdisasm.map(|n| (n, cubin.as_path()));
                            (rel.clone(), assemble(ptxas, &target, &root.join(rel), disasm))
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
    if nvdisasm.is_some() {
        println!("ptx: no kernel touches global memory before it waits for the kernel before it");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_global_load_above_the_wait_is_a_problem() {
        let sass = "
        /*0070*/                   PREEXIT ;
        /*0080*/                   LDC R1, c[0x0][0x28] ;
        /*0090*/                   CCTL.E.PF2 [R34] ;
        /*0270*/                   LDG.E.128.CONSTANT R72, desc[UR6][R4.64] ;
        /*09b0*/                   ACQBULK ;
        /*0a00*/                   STG.E.U16 desc[UR6][R2.64], R5 ;
";
        let err = memory_after_wait(sass).unwrap_err();
        assert!(err.contains("LDG.E.128.CONSTANT"), "{err}");
        let ok = sass.replace("/*0270*/                   LDG", "/*0270*/                   LDS");
        assert_eq!(memory_after_wait(&ok), Ok(()));
        let guarded = sass.replace("LDG.E.128", "@P0 LDG.E.128");
        assert!(memory_after_wait(&guarded).is_err());
        let generic = sass.replace("LDG.E.128.CONSTANT R72,", "ST.E [R2.64],");
        assert!(memory_after_wait(&generic).is_err());
        assert!(memory_after_wait("        /*0000*/  EXIT ;").unwrap_err().contains("no ACQBULK"));
    }

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
