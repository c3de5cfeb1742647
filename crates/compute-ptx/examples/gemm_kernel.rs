//! Builds a GEMM kernel with [`GemmKernel`] and prints its PTX. No GPU needed.
//!
//! `cargo run -p compute-ptx --example gemm_kernel [naive|tiled|simt] [TILE]`
//! (default: `simt`, the register-blocked kernel the CUDA backend uses; `TILE`
//! is the tiled tier's side, 8, 16 or 32, default 32). The PTX goes to stdout,
//! a summary of the kernel and its launch shape for 1024³ to stderr.
use compute_ptx::GemmKernel;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (m, n, k) = (1024, 1024, 1024);
    let kernel = match args.first().map(String::as_str) {
        Some("naive") => GemmKernel::naive(m, n, k),
        Some("tiled") => GemmKernel::tiled(m, n, k, args.get(1).and_then(|t| t.parse().ok()).unwrap_or(32)),
        _ => GemmKernel::simt(m, n, k),
    };
    match kernel.emit_ptx() {
        Ok(ptx) => {
            print!("{ptx}");
            eprintln!(
                "{}: block {:?}, grid {:?} for {m}x{n}x{k}, {} lines of PTX",
                kernel.name(),
                kernel.block_dim(),
                kernel.grid_dim(),
                ptx.lines().count()
            );
        }
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}
