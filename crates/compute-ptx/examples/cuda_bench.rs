//! The CUDA rows of the benchmark report (`benches/src/cuda.rs`, the same code
//! `cargo xtask bench` runs), as a standalone program for the GPU machine:
//! prints one line per row and the rows as JSON.
//!
//! `cargo run --release -p compute-ptx --features cuda --example cuda_bench [--quick] [--tensor-cores | --tf32 | --ragged | --epilogue | --attention | --gemv | --gemv16]`
//! (`COMPUTE_PTX_GEMM_SWEEP=1` adds the other GEMM shapes of
//! `gemm_simt::sweep_configs` at 2048³, 4096³ and 8192³, also with `--quick`,
//! and those of `gemm_mma::sweep_configs` at 4096³ and 8192³; `--tensor-cores`
//! runs only the tensor-core GEMM and GEMV rows, `--tf32` only their TF32
//! rows (with the TF32 sweep under `COMPUTE_PTX_GEMM_SWEEP`), `--ragged` only the
//! ragged rows and their aligned neighbour, `--epilogue` only the matmul
//! epilogue rows beside cuBLASLt's, `--gemv` only the GEMV and
//! argmax rows (device-timed, `benches/src/cuda_gemv.rs`), `--gemv16` only
//! the products of 8 to 16 rows beside the tensor-core GEMM, `--attention` only
//! the fused-attention rows, beside PyTorch's figures when
//! `COMPUTE_TORCH_ATTENTION` names the output of `benches/torch_attention.py`).

#[path = "../../../benches/src/cuda.rs"]
mod cuda;
#[path = "../../../benches/src/cuda_attention.rs"]
mod cuda_attention;
#[path = "../../../benches/src/cuda_epilogue.rs"]
mod cuda_epilogue;
#[path = "../../../benches/src/cuda_gemv.rs"]
mod cuda_gemv;
#[path = "../../../benches/src/cuda_half.rs"]
mod cuda_half;
#[path = "../../../benches/src/cuda_mma.rs"]
mod cuda_mma;
#[path = "../../../benches/src/report.rs"]
#[allow(dead_code)]
mod report;

/// `--profile-gemm N [simt|mma|wgmma|tma] [nt|nn] [K]`: each register-blocked shape of the
/// sweep (`simt`, the default), or the default shape of a tensor-core GEMM on
/// bf16 (`mma`, `wgmma` or `tma`, `A·B`, or with `nt` `A·Bᵀ`), once, at `N³`
/// (tensor cores: `N × N × K` when `K` is given) (for
/// `ncu -k regex:gemm_<which>`); no timing.
fn profile_gemm(n: usize, which: &str, trans_b: bool, depth: Option<usize>) -> Result<(), String> {
    use compute_core::{Backend, DType, HostVec, MatmulSpec};
    use compute_ptx::cuda::GemmTier;
    use compute_ptx::kernels::gemm_mma::MmaConfig;
    use compute_ptx::kernels::gemm_tma::TmaConfig;
    use compute_ptx::kernels::gemm_wgmma::WgmmaConfig;
    let be = compute_ptx::CudaBackend::new().map_err(|e| e.to_string())?;
    let data: Vec<f32> = (0..n * n).map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 500.0).collect();
    let e = |e: compute_core::ComputeError| e.to_string();
    if which == "mma" || which == "wgmma" || which == "tma" {
        let k = depth.unwrap_or(n);
        let host = HostVec::from_f32(DType::BF16, &data[..n * k.min(n)]);
        let host = if k > n { HostVec::from_f32(DType::BF16, &vec![0.5; n * k]) } else { host };
        let (a, b) = (be.upload_typed(host.as_slice()).map_err(e)?, be.upload_typed(host.as_slice()).map_err(e)?);
        let c = be.alloc_typed(n * n, DType::BF16).map_err(e)?;
        let spec = MatmulSpec { trans_b, ..MatmulSpec::new(n, k, n) }.with_dtypes(DType::BF16, DType::BF16);
        let (tier, spec, name) = if which == "mma" {
            let cfg = MmaConfig::default();
            (GemmTier::Mma(cfg), spec, cfg.kernel_name(DType::BF16, DType::BF16, false, trans_b))
        } else if which == "tma" {
            let cfg = TmaConfig::default();
            (GemmTier::Tma(cfg), spec, cfg.kernel_name(DType::BF16, DType::BF16, false, trans_b))
        } else {
            let cfg = WgmmaConfig::default();
            (GemmTier::Wgmma(cfg), spec, cfg.kernel_name(DType::BF16, DType::BF16, false, trans_b))
        };
        be.matmul_tier(tier, spec, &a, &b, &c).map_err(e)?;
        be.synchronize().map_err(e)?;
        println!("ran {name}");
        return Ok(());
    }
    let (a, b, c) = (be.upload(&data), be.upload(&data), be.alloc(n * n));
    let (a, b, c) = (a.map_err(e)?, b.map_err(e)?, c.map_err(e)?);
    let mut configs = vec![compute_ptx::kernels::gemm_simt::SimtConfig::default()];
    configs.extend(cuda::sweep_configs());
    for cfg in configs {
        be.matmul_tier(GemmTier::Simt(cfg), MatmulSpec::new(n, n, n), &a, &b, &c).map_err(e)?;
        be.synchronize().map_err(e)?;
        println!("ran {}", cfg.kernel_name(false, false));
    }
    Ok(())
}

/// `--attention`: only the fused-attention rows ([`cuda_attention`]).
fn attention_rows(quick: bool) -> Result<Vec<report::Record>, String> {
    let be = compute_ptx::CudaBackend::new().map_err(|e| e.to_string())?;
    let device = be.info().map_err(|e| e.to_string())?.name;
    let budget = std::time::Duration::from_millis(if quick { 300 } else { 1000 });
    cuda_attention::rows(&be, &device, quick, budget)
}

/// `--gemv`: only the GEMV and argmax rows ([`cuda_gemv`]).
fn gemv_rows(quick: bool) -> Result<Vec<report::Record>, String> {
    let be = compute_ptx::CudaBackend::new().map_err(|e| e.to_string())?;
    let device = be.info().map_err(|e| e.to_string())?.name;
    let blas = cuda_mma::Blas::new()?;
    let budget = std::time::Duration::from_millis(if quick { 300 } else { 1000 });
    cuda_gemv::rows(&be, &blas, &device, quick, budget)
}

/// `--gemv16`: only the rows of products of 8 to 16 rows
/// ([`cuda_gemv::rows_many`]).
fn gemv_many_rows(quick: bool) -> Result<Vec<report::Record>, String> {
    let be = compute_ptx::CudaBackend::new().map_err(|e| e.to_string())?;
    let device = be.info().map_err(|e| e.to_string())?.name;
    let blas = cuda_mma::Blas::new()?;
    let budget = std::time::Duration::from_millis(if quick { 300 } else { 1000 });
    cuda_gemv::rows_many(&be, &blas, &device, budget)
}

/// `--tensor-cores`: only the tensor-core GEMM rows ([`cuda_mma`]).
fn tensor_core_rows(quick: bool) -> Result<Vec<report::Record>, String> {
    let be = compute_ptx::CudaBackend::new().map_err(|e| e.to_string())?;
    let device = be.info().map_err(|e| e.to_string())?.name;
    let budget = std::time::Duration::from_millis(if quick { 300 } else { 1500 });
    cuda_mma::rows(&be, &device, quick, budget)
}

/// `--ragged`: only the ragged tensor-core GEMM rows and their aligned
/// neighbour ([`cuda_mma`]).
fn ragged_rows(quick: bool) -> Result<Vec<report::Record>, String> {
    let be = compute_ptx::CudaBackend::new().map_err(|e| e.to_string())?;
    let device = be.info().map_err(|e| e.to_string())?.name;
    let budget = std::time::Duration::from_millis(if quick { 300 } else { 1500 });
    cuda_mma::ragged_only(&be, &device, budget)
}

/// `--tf32`: only the TF32 rows of the tensor-core GEMM ([`cuda_mma`]).
fn tf32_rows(quick: bool) -> Result<Vec<report::Record>, String> {
    let be = compute_ptx::CudaBackend::new().map_err(|e| e.to_string())?;
    let device = be.info().map_err(|e| e.to_string())?.name;
    let budget = std::time::Duration::from_millis(if quick { 300 } else { 1500 });
    cuda_mma::tf32_only(&be, &device, quick, budget)
}

/// `--epilogue`: only the matmul epilogue rows ([`cuda_epilogue`]).
fn epilogue_rows(quick: bool) -> Result<Vec<report::Record>, String> {
    let be = compute_ptx::CudaBackend::new().map_err(|e| e.to_string())?;
    let device = be.info().map_err(|e| e.to_string())?.name;
    let budget = std::time::Duration::from_millis(if quick { 300 } else { 1500 });
    cuda_epilogue::rows(&be, &device, quick, budget)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--profile-gemm") {
        let n = args.get(i + 1).and_then(|v| v.parse().ok()).unwrap_or(4096);
        let which = args.get(i + 2).map(String::as_str).unwrap_or("simt");
        let trans_b = args.get(i + 3).is_some_and(|t| t == "nt");
        let depth = args.get(i + 4).and_then(|v| v.parse().ok());
        if let Err(e) = profile_gemm(n, which, trans_b, depth) {
            eprintln!("{e}");
            std::process::exit(2);
        }
        return;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let rows = if args.iter().any(|a| a == "--tensor-cores") {
        tensor_core_rows(quick)
    } else if args.iter().any(|a| a == "--tf32") {
        tf32_rows(quick)
    } else if args.iter().any(|a| a == "--ragged") {
        ragged_rows(quick)
    } else if args.iter().any(|a| a == "--epilogue") {
        epilogue_rows(quick)
    } else if args.iter().any(|a| a == "--gemv16") {
        gemv_many_rows(quick)
    } else if args.iter().any(|a| a == "--gemv") {
        gemv_rows(quick)
    } else if args.iter().any(|a| a == "--attention") {
        attention_rows(quick)
    } else {
        cuda::rows(quick)
    };
    match rows {
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
