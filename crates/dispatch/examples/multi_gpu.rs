//! One GPU or all of them, per product: calibrates [`MultiGpu`] (bf16),
//! prints its fits, then for square bf16 products `A·Bᵀ` on GPU 0 times both
//! ways (median of `--reps`), next to the model's predictions and its choice.
//! `regret` is the chosen way's measured time over the faster one's (1.0:
//! the right call).
//!
//! ```text
//! cargo run --release -p dispatch --no-default-features --features nccl --example multi_gpu -- [--sizes 2048,4096,8192,16384] [--reps 5]
//! ```
//!
//! Set `NCCL_NVLS_ENABLE=0` where NVLink multicast exists.

use std::time::Instant;

use compute_core::{Backend, DType, HostVec, MatmulSpec};
use dispatch::multi_gpu::{MultiGpu, cuda_devices};

fn main() -> compute_core::Result<()> {
    let mut sizes = vec![2048usize, 4096, 8192, 16384];
    let mut reps = 5usize;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--sizes" => {
                sizes = it.next().map(|v| v.split(',').filter_map(|s| s.parse().ok()).collect()).unwrap_or(sizes)
            }
            "--reps" => reps = it.next().and_then(|v| v.parse().ok()).unwrap_or(reps).max(1),
            other => eprintln!("ignored argument {other}"),
        }
    }
    for d in cuda_devices() {
        eprintln!(
            "GPU {}: {} ({} SMs, {:.1} GiB)",
            d.ordinal,
            d.name,
            d.multiprocessors,
            d.memory_total as f64 / (1u64 << 30) as f64
        );
    }
    let t = Instant::now();
    let gpus = MultiGpu::calibrate(DType::BF16)?;
    let p = gpus.profile();
    println!(
        "{{\"calibration_s\":{:.3},\"gpus\":{},\"matmul_tflops\":{:.1},\"matmul_fixed_us\":{:.1},\"broadcast_gbps\":{:.1},\"broadcast_fixed_us\":{:.1},\"send_gbps\":{:.1},\"send_fixed_us\":{:.1}}}",
        t.elapsed().as_secs_f64(),
        p.gpus,
        p.matmul.rate / 1e12,
        p.matmul.fixed_s * 1e6,
        p.broadcast.rate / 1e9,
        p.broadcast.fixed_s * 1e6,
        p.send.rate / 1e9,
        p.send.fixed_s * 1e6
    );
    let b0 = gpus.backend(0).expect("GPU 0");
    for &n in &sizes {
        let spec = MatmulSpec { trans_b: true, ..MatmulSpec::new(n, n, n) }.with_dtypes(DType::BF16, DType::BF16);
        let values: Vec<f32> = (0..n * n).map(|i| (i % 251) as f32 / 251.0 - 0.5).collect();
        let a = b0.upload_typed(HostVec::from_f32(DType::BF16, &values).as_slice())?;
        let w = b0.upload_typed(HostVec::from_f32(DType::BF16, &values).as_slice())?;
        let c = b0.alloc_typed(n * n, DType::BF16)?;
        let time = |g: usize| -> compute_core::Result<f64> {
            gpus.matmul_on(g, &spec, &a, &w, &c)?;
            gpus.communicator().synchronize()?;
            let mut s = Vec::with_capacity(reps);
            for _ in 0..reps {
                let t = Instant::now();
                gpus.matmul_on(g, &spec, &a, &w, &c)?;
                gpus.communicator().synchronize()?;
                s.push(t.elapsed().as_secs_f64());
            }
            s.sort_by(f64::total_cmp);
            Ok(s[s.len() / 2])
        };
        let (one, spread) = (time(1)?, if p.gpus > 1 { time(p.gpus)? } else { f64::INFINITY });
        let plan = gpus.plan(&spec);
        let chosen = if plan.gpus > 1 { spread } else { one };
        println!(
            "{{\"n\":{n},\"one_gpu_ms\":{:.3},\"spread_ms\":{:.3},\"predicted_one_gpu_ms\":{:.3},\"predicted_spread_ms\":{:.3},\"chosen_gpus\":{},\"regret\":{:.3}}}",
            one * 1e3,
            spread * 1e3,
            plan.one_gpu_s * 1e3,
            plan.spread_s * 1e3,
            plan.gpus,
            chosen / one.min(spread)
        );
    }
    Ok(())
}
