//! Times `Op::QuantMatmul` (`y = x · Wᵀ` with GGML block-quantized weights)
//! through the public backend API: weights and activations uploaded once,
//! then `run_tensors` timed for `q4_K`, `q5_K`, `q6_K` and `q8_0` at
//! `n × k` = 14336 × 4096 and 4096 × 14336 (a 7–8B model's FFN projections),
//! `m` = 1 and 16 rows of `f32` activations, `f32` output.
//!
//! Each case runs a few times to warm up (pipelines compiled, caches
//! filled), then 30 times; the median is printed in µs, as GB/s of weight
//! bytes read, and as a ratio to the device's copy bandwidth measured on the
//! same bytes (a buffer-to-buffer copy of the weight: its bytes read plus
//! written over its time). With GPU timestamps (`WgpuBackend::gpu_timing`)
//! each run is timed on the GPU alone; otherwise on the host, from
//! submission to a `synchronize`.
//!
//! Usage: `cargo run -p compute-wgpu --release --example quant_bench [RUNS]`
//! (on a machine with a GPU; `COMPUTE_WGPU_ADAPTER`-style selection goes
//! through `DeviceOptions::from_env`).

use std::time::Instant;

use compute_core::quant::BlockFormat;
use compute_core::rng::Rng;
use compute_core::{Backend, ComputeError, DType, HostSlice, Op, QuantMatmulSpec, Tensor};
use compute_wgpu::{DeviceOptions, GpuBuffer, WgpuBackend};

/// Distinct quantized rows the weight repeats (quantizing all 14336 rows with
/// the k-quant searches would take seconds; the timing does not care).
const DISTINCT_ROWS: usize = 8;
const WARMUP: usize = 3;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// `n` rows of `k` values in `format`: `DISTINCT_ROWS` random rows quantized,
/// repeated.
fn weight_bytes(format: BlockFormat, n: usize, k: usize, rng: &mut Rng) -> Result<Vec<u8>, ComputeError> {
    let row = format.row_bytes(k)?;
    let mut distinct = vec![0u8; DISTINCT_ROWS * row];
    format.quantize(&rng.vec(DISTINCT_ROWS * k, -1.0, 1.0), &mut distinct)?;
    let mut bytes = Vec::with_capacity(n * row);
    for j in 0..n {
        let r = j % DISTINCT_ROWS;
        bytes.extend_from_slice(&distinct[r * row..(r + 1) * row]);
    }
    Ok(bytes)
}

/// Seconds of one run of `run`: GPU time when `gpu` is given, else host
/// time up to a `synchronize`.
fn time_once(
    gpu: &WgpuBackend,
    op: &Op,
    inputs: &[&Tensor],
    output: &Tensor,
    timestamps: bool,
) -> Result<f64, ComputeError> {
    if timestamps && let Some(t) = gpu.time_tensors(op, inputs, output)? {
        return Ok(t);
    }
    let start = Instant::now();
    gpu.run_tensors(op, inputs, output)?;
    gpu.synchronize()?;
    Ok(start.elapsed().as_secs_f64())
}

/// Median seconds of a buffer copy of `w`'s bytes into `dst`.
fn copy_seconds(gpu: &WgpuBackend, w: &Tensor, dst: &Tensor, runs: usize) -> Result<f64, ComputeError> {
    let storage = |t: &Tensor| {
        t.storage::<GpuBuffer>()
            .map(|g| g.buffer().clone())
            .ok_or(ComputeError::Unsupported { op: "copy", backend: compute_core::BackendKind::Wgpu })
    };
    let (src, dst) = (storage(w)?, storage(dst)?);
    let bytes = w.operand().bytes().div_ceil(4) * 4;
    let mut times = Vec::with_capacity(runs);
    for i in 0..WARMUP + runs {
        let t = match gpu.time_commands(|enc| enc.copy_buffer_to_buffer(&src, 0, &dst, 0, bytes))? {
            Some(t) => t,
            None => {
                let start = Instant::now();
                let (device, queue) = gpu.device();
                let mut enc = device.create_command_encoder(&Default::default());
                enc.copy_buffer_to_buffer(&src, 0, &dst, 0, bytes);
                queue.submit([enc.finish()]);
                gpu.synchronize()?;
                start.elapsed().as_secs_f64()
            }
        };
        if i >= WARMUP {
            times.push(t);
        }
    }
    Ok(median(times))
}

fn main() -> Result<(), ComputeError> {
    let runs: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(30).max(1);
    let gpu = WgpuBackend::with_options(&DeviceOptions::from_env())?;
    let timestamps = gpu.gpu_timing();
    println!(
        "adapter: {}\ntiming: {} (median of {runs} after {WARMUP} warm-up runs)",
        gpu.adapter(),
        if timestamps { "GPU timestamps" } else { "host, to synchronize" }
    );
    println!("copy ratio: GB/s of weight bytes read over the copy's GB/s (bytes read + written)");
    println!(
        "{:<6} {:>12} {:>4} {:>10} {:>10} {:>10} {:>8}",
        "format", "n x k", "m", "us", "GB/s", "copy GB/s", "ratio"
    );
    let mut rng = Rng::new(1);
    for weight in DType::QUANTIZED {
        let Some(format) = weight.block_format() else { continue };
        for (n, k) in [(14336, 4096), (4096, 14336)] {
            let blocks = weight_bytes(format, n, k, &mut rng)?;
            let w = gpu.upload_typed(HostSlice::Blocks(compute_core::Blocks::new(weight, &blocks)?))?;
            let copy_dst = gpu.alloc_typed(n * k, weight)?;
            let copy = copy_seconds(&gpu, &w, &copy_dst, runs)?;
            let bytes = blocks.len() as f64;
            let copy_gbs = 2.0 * bytes / copy / 1e9;
            for m in [1, 16] {
                let x = gpu.upload(&rng.vec(m * k, -1.0, 1.0))?;
                let y = gpu.alloc(m * n)?;
                let op = Op::QuantMatmul(QuantMatmulSpec::new(m, k, n, weight));
                let mut times = Vec::with_capacity(runs);
                for i in 0..WARMUP + runs {
                    let t = time_once(&gpu, &op, &[&x, &w], &y, timestamps)?;
                    if i >= WARMUP {
                        times.push(t);
                    }
                }
                let t = median(times);
                let gbs = bytes / t / 1e9;
                println!(
                    "{:<6} {:>12} {:>4} {:>10.1} {:>10.1} {:>10.1} {:>8.2}",
                    weight.as_str(),
                    format!("{n}x{k}"),
                    m,
                    t * 1e6,
                    gbs,
                    copy_gbs,
                    gbs / copy_gbs
                );
            }
        }
    }
    Ok(())
}
