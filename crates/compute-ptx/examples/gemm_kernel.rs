//! Builds the register-blocked GEMM kernel and prints its PTX. No GPU needed.
//!
//! `cargo run -p compute-ptx --example gemm_kernel [nn|nt|tn|tt] [sm_80|sm_90]`
use compute_ptx::Target;
use compute_ptx::kernels::gemm_simt::{SimtConfig, simt};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let trans = args.iter().find(|a| a.len() == 2 && a.chars().all(|c| c == 'n' || c == 't'));
    let (ta, tb) = match trans.map(String::as_str) {
        Some("tn") => (true, false),
        Some("nt") => (false, true),
        Some("tt") => (true, true),
        _ => (false, false),
    };
    let target = if args.iter().any(|a| a == "sm_80") { Target::Sm80 } else { Target::Sm90 };
    let cfg = SimtConfig::default();
    match simt(&cfg, ta, tb, target) {
        Ok(k) => {
            print!("{}", k.ptx());
            eprintln!(
                "{}: {} threads, {} bytes of shared memory, {} lines of PTX",
                k.name(),
                cfg.threads(),
                cfg.shared_bytes(),
                k.ptx().lines().count()
            );
        }
        Err(e) => eprintln!("{e}"),
    }
}
