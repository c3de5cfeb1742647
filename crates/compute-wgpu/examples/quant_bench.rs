//! Times `Op::QuantMatmul` (`y = x · Wᵀ` with GGML block-quantized weights)
//! through the public backend API: weights and activations uploaded once,
//! then `run_tensors` timed for `q4_K`, `q5_K`, `q6_K` and `q8_0` at
//! `n × k` = 14336 × 4096 and 4096 × 14336 (a 7–8B model's FFN projections),
//! `m` = 1 and 16 rows of `f32` activations, `f32` output.
//!
//! Each case runs a few times to warm up (pipelines compiled, caches
//! filled), then `RUNS` times (default 30); the median is printed in µs and
//! as GB/s of weight bytes read, twice: rerunning one weight (`single`: on a
//! GPU whose L2 holds the weight, e.g. the H200's 50 MB, this measures L2),
//! and rotating over enough copies of the weight that together exceed
//! [`ROTATION_BYTES`] (`rotating`: each run reads a weight last touched
//! several weights ago, so from device memory).
//!
//! Yardsticks, in the same process: an `f32` shader pass `y = 1·x`
//! (`Op::unary(UnaryOp::Scale)`) over as many bytes as the weight, and over
//! 256 MiB, counting bytes read plus written (`pass`); and
//! [`CUDA_COPY_GBS`], the CUDA device-to-device copy measured on the H200
//! (docs/benchmarks.md). `/pass` divides the product's GB/s of weight bytes by
//! the pass over the weight's bytes (single) or by the 256 MiB pass
//! (rotating); `/cuda` by [`CUDA_COPY_GBS`].
//!
//! With GPU timestamps (`WgpuBackend::gpu_timing`) each run is timed on the
//! GPU alone; otherwise on the host, from submission to a `synchronize`.
//!
//! Usage: `cargo run -p compute-wgpu --release --example quant_bench [RUNS [scaling|decoder]]`
//! (`decoder`: only the one-row `q4_K` products of the 1.1 B decoder's shapes)
//! (on a machine with a GPU; adapter selection goes through
//! `DeviceOptions::from_env`).

use std::time::Instant;

use compute_core::quant::BlockFormat;
use compute_core::rng::Rng;
use compute_core::{Backend, ComputeError, DType, HostSlice, Op, QuantMatmulSpec, Tensor, UnaryOp};
use compute_wgpu::{DeviceOptions, WgpuBackend};

/// Distinct quantized rows the weight repeats (quantizing all 14336 rows with
/// the k-quant searches would take seconds; the timing does not care).
const DISTINCT_ROWS: usize = 8;
const WARMUP: usize = 3;
/// Bytes the rotating weights hold together (at least; three times the
/// H200's 50 MB L2).
const ROTATION_BYTES: usize = 150_000_000;
/// GB/s of the CUDA device-to-device copy on the H200 (bytes read plus
/// written: 256M `f32` in 508 µs, docs/benchmarks.md, "wgpu backend on f16 and
/// bf16"; 4.19–4.22 TB/s over the runs there).
const CUDA_COPY_GBS: f64 = 4200.0;
/// `f32` values of the large yardstick pass (256 MiB in, 256 MiB out).
const LARGE_PASS: usize = 64 << 20;

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

/// Seconds of one run of `op`: GPU time when `timestamps`, else host time
/// up to a `synchronize`.
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

/// Median seconds of `op` over `runs` runs (after `WARMUP`), run `i` reading
/// the `i`-th of `weights` (cyclically) as its second input.
fn median_seconds(
    gpu: &WgpuBackend,
    op: &Op,
    x: &Tensor,
    weights: &[Tensor],
    y: &Tensor,
    runs: usize,
    timestamps: bool,
) -> Result<f64, ComputeError> {
    let mut times = Vec::with_capacity(runs);
    for i in 0..WARMUP + runs {
        let w = &weights[i % weights.len()];
        let t = time_once(gpu, op, &[x, w], y, timestamps)?;
        if i >= WARMUP {
            times.push(t);
        }
    }
    Ok(median(times))
}

/// GB/s (bytes read plus written) of the `f32` pass `y = 1·x` over `len` values.
fn pass_gbs(gpu: &WgpuBackend, len: usize, runs: usize, timestamps: bool) -> Result<f64, ComputeError> {
    let x = gpu.upload(&vec![1.0f32; len])?;
    let y = gpu.alloc(len)?;
    let op = Op::unary(UnaryOp::Scale { s: 1.0 }, len);
    let mut times = Vec::with_capacity(runs);
    for i in 0..WARMUP + runs {
        let t = time_once(gpu, &op, &[&x], &y, timestamps)?;
        if i >= WARMUP {
            times.push(t);
        }
    }
    Ok(8.0 * len as f64 / median(times) / 1e9)
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
    let large = pass_gbs(&gpu, LARGE_PASS, runs, timestamps)?;
    println!(
        "yardsticks: f32 pass y = 1·x over 256 MiB: {large:.1} GB/s (read + written, {:.2} of {CUDA_COPY_GBS:.0} GB/s, the H200's CUDA device copy)",
        large / CUDA_COPY_GBS
    );
    println!(
        "columns: GB/s of weight bytes; single = one weight rerun (L2 where it fits), rotating = {} MB of copies in turn; \
         /pass = over the f32 pass on the weight's bytes (single) or on 256 MiB (rotating); /cuda = over {CUDA_COPY_GBS:.0} GB/s",
        ROTATION_BYTES / 1_000_000
    );
    println!(
        "{:<6} {:>12} {:>3} {:>9} {:>9} {:>6} {:>6} | {:>3} {:>9} {:>9} {:>6} {:>6} | {:>9}",
        "format",
        "n x k",
        "m",
        "single us",
        "GB/s",
        "/pass",
        "/cuda",
        "w",
        "rot. us",
        "GB/s",
        "/pass",
        "/cuda",
        "pass GB/s"
    );
    let mut rng = Rng::new(1);
    let mode = std::env::args().nth(2);
    if mode.as_deref() == Some("scaling") {
        return scaling(&gpu, runs, timestamps, &mut rng);
    }
    // `decoder`: the one-row q4_K products of the 1.1 B decoder (`dispatch::llama`, config `1b`).
    let decoder = mode.as_deref() == Some("decoder");
    let shapes: &[(usize, usize)] = if decoder {
        &[(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192)]
    } else {
        &[(14336, 4096), (4096, 14336)]
    };
    let rows: &[usize] = if decoder { &[1] } else { &[1, 16] };
    for weight in DType::QUANTIZED {
        let Some(format) = weight.block_format() else { continue };
        if decoder && weight != DType::Q4K {
            continue;
        }
        for &(n, k) in shapes {
            let blocks = weight_bytes(format, n, k, &mut rng)?;
            let bytes = blocks.len();
            let copies = ROTATION_BYTES.div_ceil(bytes).max(2);
            let weights = (0..copies)
                .map(|_| gpu.upload_typed(HostSlice::Blocks(compute_core::Blocks::new(weight, &blocks)?)))
                .collect::<Result<Vec<_>, _>>()?;
            let pass = pass_gbs(&gpu, bytes.div_ceil(4), runs, timestamps)?;
            for &m in rows {
                let x = gpu.upload(&rng.vec(m * k, -1.0, 1.0))?;
                let y = gpu.alloc(m * n)?;
                let op = Op::QuantMatmul(QuantMatmulSpec::new(m, k, n, weight));
                let single = median_seconds(&gpu, &op, &x, &weights[..1], &y, runs, timestamps)?;
                let rotating = median_seconds(&gpu, &op, &x, &weights, &y, runs, timestamps)?;
                let (gs, gr) = (bytes as f64 / single / 1e9, bytes as f64 / rotating / 1e9);
                println!(
                    "{:<6} {:>12} {:>3} {:>9.1} {:>9.1} {:>6.2} {:>6.2} | {:>3} {:>9.1} {:>9.1} {:>6.2} {:>6.2} | {:>9.1}",
                    weight.as_str(),
                    format!("{n}x{k}"),
                    m,
                    single * 1e6,
                    gs,
                    gs / pass,
                    gs / CUDA_COPY_GBS,
                    copies,
                    rotating * 1e6,
                    gr,
                    gr / large,
                    gr / CUDA_COPY_GBS,
                    pass
                );
            }
        }
    }
    Ok(())
}

/// `quant_bench RUNS scaling`: the one-row `q4_K` product of `k` = 4096 at
/// growing `n`, one weight rerun (from L2 while it fits), beside the `f32`
/// pass over the same bytes: the time that does not grow with `n` (the
/// dispatch and its timing) and the rate at which the rest grows (the last
/// two sizes, beyond the L2).
fn scaling(gpu: &WgpuBackend, runs: usize, timestamps: bool, rng: &mut Rng) -> Result<(), ComputeError> {
    let k = 4096;
    let weight = DType::Q4K;
    let Some(format) = weight.block_format() else { return Ok(()) };
    println!("{:<6} {:>12} {:>10} {:>12} {:>12}", "format", "n x k", "us", "pass us", "bytes MB");
    let x = gpu.upload(&rng.vec(k, -1.0, 1.0))?;
    let mut points = Vec::new();
    for n in [512usize, 2048, 8192, 32768, 65536] {
        let blocks = weight_bytes(format, n, k, rng)?;
        let bytes = blocks.len();
        let w = gpu.upload_typed(HostSlice::Blocks(compute_core::Blocks::new(weight, &blocks)?))?;
        let y = gpu.alloc(n)?;
        let op = Op::QuantMatmul(QuantMatmulSpec::new(1, k, n, weight));
        let t = median_seconds(gpu, &op, &x, std::slice::from_ref(&w), &y, runs, timestamps)?;
        // The pass reads and writes bytes / 2 each: the same bytes moved.
        let pass = 8.0 * (bytes / 8) as f64 / pass_gbs(gpu, bytes / 8, runs, timestamps)? / 1e9;
        println!(
            "{:<6} {:>12} {:>10.1} {:>12.1} {:>12.1}",
            weight.as_str(),
            format!("{n}x{k}"),
            t * 1e6,
            pass * 1e6,
            bytes as f64 / 1e6
        );
        points.push((bytes as f64, t, pass));
    }
    if let [.., (b0, t0, p0), (b1, t1, p1)] = points[..] {
        println!(
            "marginal (last two sizes): product {:.1} GB/s of blocks, pass {:.1} GB/s moved; fixed part at the first size: product {:.1} us, pass {:.1} us",
            (b1 - b0) / (t1 - t0) / 1e9,
            (b1 - b0) / (p1 - p0) / 1e9,
            (points[0].1 - points[0].0 * (t1 - t0) / (b1 - b0)) * 1e6,
            (points[0].2 - points[0].0 * (p1 - p0) / (b1 - b0)) * 1e6,
        );
    }
    Ok(())
}
