//! `cargo xtask ptx`: regenerates the checked-in PTX (owned by the compute-ptx work).

/// Writes every kernel's PTX into `ptx/`; with `--check`, fails on a difference.
pub fn run(_args: &[String]) -> Result<(), String> {
    Err("cargo xtask ptx is not wired yet".into())
}
