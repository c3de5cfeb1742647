//! Builds the register-blocked GEMM kernel and prints its PTX. No GPU needed.
//!
//! `cargo run -p compute-ptx --example gemm_kernel [nn|nt|tn|tt] [sm_80|sm_90]`
//!
//! `--sweep DIR` instead writes the default and every shape of
//! [`sweep_configs`] (all four transposes) as `DIR/<kernel>.ptx`, to check
//! their registers and spills with `ptxas -v` before any GPU time.
use compute_ptx::Target;
use compute_ptx::kernels::gemm_simt::{SimtConfig, simt, sweep_configs};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(i) = args.iter().position(|a| a == "--sweep") {
        let dir = std::path::PathBuf::from(args.get(i + 1).map_or("gemm_sweep", String::as_str));
        let target = if args.iter().any(|a| a == "sm_80") { Target::Sm80 } else { Target::Sm90 };
        if let Err(e) = std::fs::create_dir_all(&dir) {
            eprintln!("{}: {e}", dir.display());
            std::process::exit(1);
        }
        let mut configs = vec![SimtConfig::default()];
        configs.extend(sweep_configs());
        for cfg in configs {
            for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
                match simt(&cfg, ta, tb, target) {
                    Ok(k) => {
                        let path = dir.join(format!("{}.ptx", k.name()));
                        if let Err(e) = std::fs::write(&path, k.ptx()) {
                            eprintln!("{}: {e}", path.display());
                            std::process::exit(1);
                        }
                        println!("{}", path.display());
                    }
                    Err(e) => {
                        eprintln!("{e}");
                        std::process::exit(1);
                    }
                }
            }
        }
        return;
    }
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
