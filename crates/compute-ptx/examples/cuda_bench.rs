//! The CUDA rows of the benchmark report (`benches/src/cuda.rs`, the same code
//! `cargo xtask bench` runs), as a standalone program for the GPU machine:
//! prints one line per row and the rows as JSON.
//!
//! `cargo run --release -p compute-ptx --features cuda --example cuda_bench [--quick]`
//! (`COMPUTE_PTX_GEMM_SWEEP=1` adds other GEMM shapes at 4096).

#[path = "../../../benches/src/cuda.rs"]
mod cuda;
#[path = "../../../benches/src/report.rs"]
#[allow(dead_code)]
mod report;

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    match cuda::rows(quick) {
        Ok(rows) => {
            for r in &rows {
                println!(
                    "{:<11} {:<16} {:>10.3} ms {:>9} {:>9} peer {:<7} {:>10} ratio {:>6}  {}",
                    r.op,
                    r.shape,
                    r.median_s * 1e3,
                    r.gflops.map(|g| format!("{:.1}TF", g / 1e3)).unwrap_or_default(),
                    r.gbps.map(|g| format!("{g:.0}GB/s")).unwrap_or_default(),
                    r.peer.clone().unwrap_or_default(),
                    r.peer_median_s.map(|p| format!("{:.3} ms", p * 1e3)).unwrap_or_default(),
                    r.ratio.map(|x| format!("{x:.2}")).unwrap_or_default(),
                    r.note.clone().unwrap_or_default()
                );
            }
            match serde_json::to_string_pretty(&rows) {
                Ok(j) => println!("{j}"),
                Err(e) => eprintln!("json: {e}"),
            }
        }
        Err(e) => {
            eprintln!("cuda bench unavailable: {e}");
            std::process::exit(2);
        }
    }
}
