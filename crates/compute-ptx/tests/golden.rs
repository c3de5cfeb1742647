//! The checked-in `ptx/` folder is exactly what the kernel code emits (run
//! `cargo xtask ptx` after changing a kernel), and every emitted module is
//! well formed: ASCII, the declared target and version, one entry point.

use std::path::PathBuf;

use compute_ptx::Target;
use compute_ptx::kernels::catalog;

fn ptx_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../ptx")
}

#[test]
fn checked_in_ptx_matches_the_generator() {
    let mut stale = Vec::new();
    let mut names = Vec::new();
    for target in Target::EMITTED {
        for id in catalog().into_iter().filter(|id| id.targets().contains(&target)) {
            let k = id.build(target).unwrap_or_else(|e| panic!("{e}"));
            let path = ptx_dir().join(target.name()).join(format!("{}.ptx", k.name()));
            let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
            if on_disk != k.ptx() {
                stale.push(path.display().to_string());
            }
            names.push(format!("{}/{}.ptx", target.name(), k.name()));
        }
    }
    assert!(stale.is_empty(), "run `cargo xtask ptx`; these differ from the generator:\n{}", stale.join("\n"));
    for target in Target::EMITTED {
        for e in std::fs::read_dir(ptx_dir().join(target.name())).expect("ptx/<target> exists").flatten() {
            let f = format!("{}/{}", target.name(), e.file_name().to_string_lossy());
            assert!(names.contains(&f), "ptx/{f} is not emitted by any kernel (stale file)");
        }
    }
}

#[test]
fn every_module_is_well_formed() {
    for target in Target::EMITTED {
        for id in catalog().into_iter().filter(|id| id.targets().contains(&target)) {
            let k = id.build(target).unwrap_or_else(|e| panic!("{e}"));
            let t = k.ptx();
            assert!(t.is_ascii(), "{}: ptxas rejects non-ASCII", k.name());
            assert!(t.contains(&format!(".target {}\n", target.name())));
            let version: f32 =
                t.lines().find_map(|l| l.strip_prefix(".version ")).and_then(|v| v.parse().ok()).unwrap();
            assert!(version <= 9.0, "{}: .version {version} is above what a CUDA 13.0 driver JIT-compiles", k.name());
            assert_eq!(t.matches(".entry ").count(), 1, "{}", k.name());
            assert!(t.contains(&format!(".entry {}(", k.name())));
            assert_eq!(k.params().len(), t.matches("\t.param .").count(), "{}", k.name());
        }
    }
}

#[test]
fn kernel_names_are_unique() {
    let mut names: Vec<String> = catalog().iter().map(|k| k.name()).collect();
    let n = names.len();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), n);
}
