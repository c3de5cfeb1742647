//! GPU timing of the block-quantized weight kernels: `y = x·Wᵀ` with `W`
//! stored as `q4_K`, `q5_K`, `q6_K` or `q8_0` blocks (`Op::QuantMatmul`, the
//! `dp4a` GEMV for up to 16 rows, dequantize-then-GEMM beyond), and
//! dequantization to `bf16` (`Op::Cast`).
//!
//! `cargo run --release -p compute-ptx --features cuda --example quant_bench [--quick]`
//!
//! Shapes `n × k` = 14336 × 4096 and 4096 × 14336 (weight rows × inner
//! dimension), `m` = 1 and 16 for every format, plus 64 and 512 for `q4_K`;
//! then, for `q4_K` and `m = 1`, the linear layers of the 1.1 B Llama
//! decoder (2048 × 2048, 512 × 2048, 8192 × 2048, 2048 × 8192, 32000 ×
//! 2048). `f32` activations (`--x-bf16`: `bf16`) and `f32` output. Each
//! row prints the median time over 50 samples (each the mean of 10
//! back-to-back calls, after warm-up), the
//! weight bytes read per second, the bandwidth of a device-to-device copy of
//! the same bytes timed in the same process counting bytes read plus written
//! (`2·bytes / time`, the figure a device's copy bandwidth is quoted in) and
//! the product's weight bytes per second as a fraction of it (`×copy`), for
//! `m = 1` the speedup against our `bf16` GEMV on the same shape (`bf16`
//! weights and activations), for `m > 1` the time as a multiple of `m = 1`'s,
//! and the largest error of output row 0 against a CPU `f64`
//! product with the dequantized weights, as a fraction of the error bound
//! (`≤ 1` passes). Then one row per format and shape for dequantization to
//! `bf16`: time and GB/s of blocks read, and of blocks read plus values
//! written. Copies of the quantized weights filling 256 MiB (at most 512)
//! are cycled so that they do not sit in L2 between calls; the `bf16` GEMV
//! reads one copy, which for the decoder's small shapes stays in L2.
//! `--quick` takes 10 samples; `--only q4_K` (a format name, repeatable)
//! limits the formats, `--m 1` (repeatable) the row counts, `--shapes big`
//! or `--shapes small` the shapes.

use std::time::Instant;

use compute_core::quant::BlockFormat;
use compute_core::{Backend, DType, HostVec, MatmulSpec, Op, QuantMatmulSpec, Tensor};
use compute_ptx::CudaBackend;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const REPS: usize = 10;
/// Distinct weight rows quantized on the CPU (then repeated to fill `n`).
const DISTINCT_ROWS: usize = 64;
/// Weight bytes cycled through per timing: well past any L2.
const CYCLE_BYTES: usize = 256 << 20;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 { v[n / 2] } else { 0.5 * (v[n / 2 - 1] + v[n / 2]) }
}

/// Median seconds per call of `f` (call index given), over `samples` samples
/// of `REPS` calls each, after three warm-up calls.
fn time(be: &CudaBackend, samples: usize, mut f: impl FnMut(usize) -> Res<()>) -> Res<f64> {
    let mut call = 0;
    for _ in 0..3 {
        f(call)?;
        call += 1;
    }
    be.synchronize()?;
    let mut out = Vec::with_capacity(samples);
    for _ in 0..samples {
        let t = Instant::now();
        for _ in 0..REPS {
            f(call)?;
            call += 1;
        }
        be.synchronize()?;
        out.push(t.elapsed().as_secs_f64() / REPS as f64);
    }
    Ok(median(out))
}

/// `n` rows of `k` values as `format` blocks: `DISTINCT_ROWS` random rows
/// quantized on the CPU, repeated. Returns the blocks and the distinct rows
/// dequantized.
fn weights(format: BlockFormat, n: usize, k: usize) -> Res<(Vec<u8>, Vec<f32>)> {
    let rows = DISTINCT_ROWS.min(n);
    let values = compute_core::rng::random_vec(rows * k, -1.0, 1.0, 0x5eed + k as u64);
    let row_bytes = format.row_bytes(k)?;
    let mut distinct = vec![0u8; rows * row_bytes];
    format.quantize(&values, &mut distinct)?;
    let mut deq = vec![0f32; rows * k];
    format.dequantize(&distinct, &mut deq)?;
    let mut all = Vec::with_capacity(n * row_bytes);
    for j in 0..n {
        let r = j % rows;
        all.extend_from_slice(&distinct[r * row_bytes..(r + 1) * row_bytes]);
    }
    Ok((all, deq))
}

/// Largest `|y − ref| / bound` over output row 0 (`f64` reference on the
/// dequantized weights; the bound of the int8 activations, plus the `bf16`
/// roundings of the prefill path for `m > 16`).
fn check_row0(x: &[f32], deq: &[f32], y: &[f32], (m, k, n): (usize, usize, usize)) -> f64 {
    let rows = deq.len() / k;
    let xr = &x[..k];
    let xmax = xr.iter().fold(0f64, |a, &v| a.max(f64::from(v).abs()));
    let mut worst = 0f64;
    for j in 0..n {
        let w = &deq[(j % rows) * k..(j % rows + 1) * k];
        let exact: f64 = xr.iter().zip(w).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum();
        let abs: f64 = xr.iter().zip(w).map(|(&a, &b)| (f64::from(a) * f64::from(b)).abs()).sum();
        let sum_w: f64 = w.iter().map(|&b| f64::from(b).abs()).sum();
        let mut bound = 1.01 * xmax / 254.0 * sum_w + 2f64.powi(-18) * abs;
        if m > 16 {
            bound += 2.0 * 2f64.powi(-8) * abs;
        }
        worst = worst.max((f64::from(y[j]) - exact).abs() / bound.max(f64::MIN_POSITIVE));
    }
    worst
}

fn main() -> Res<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let samples = if quick { 10 } else { 50 };
    let be = CudaBackend::new()?;
    let info = be.info()?;
    println!("device: {info:?}");
    let args: Vec<String> = std::env::args().collect();
    let only: Vec<&str> = args.windows(2).filter(|w| w[0] == "--only").map(|w| w[1].as_str()).collect();
    let only_m: Vec<usize> = args.windows(2).filter(|w| w[0] == "--m").filter_map(|w| w[1].parse().ok()).collect();
    let x_dtype = if args.iter().any(|a| a == "--x-bf16") { DType::BF16 } else { DType::F32 };
    let shape_set = args.windows(2).find(|w| w[0] == "--shapes").map_or("all", |w| w[1].as_str());
    println!(
        "x {x_dtype}, y f32; median of {samples} samples of {REPS} calls; weights cycled over {} MiB",
        CYCLE_BYTES >> 20
    );
    let formats = [BlockFormat::Q4K, BlockFormat::Q5K, BlockFormat::Q6K, BlockFormat::Q8_0];
    for format in formats {
        if !only.is_empty() && !only.iter().any(|o| o.eq_ignore_ascii_case(&format.to_string())) {
            continue;
        }
        let wdt = DType::of_block_format(format).ok_or("not a weight format")?;
        let big = [(14336usize, 4096usize), (4096, 14336)];
        // The linear layers of the 1.1 B Llama decoder (hidden 2048, feed-forward 8192,
        // vocabulary 32000, 8 of 32 heads for K and V): one decoding step's GEMVs.
        let small = [(2048usize, 2048usize), (512, 2048), (8192, 2048), (2048, 8192), (32000, 2048)];
        let mut shapes: Vec<(usize, usize, bool)> = Vec::new();
        if shape_set != "small" {
            shapes.extend(big.iter().map(|&(n, k)| (n, k, true)));
        }
        if shape_set != "big" && format == BlockFormat::Q4K {
            shapes.extend(small.iter().map(|&(n, k)| (n, k, false)));
        }
        for (n, k, is_big) in shapes {
            let (blocks, deq) = weights(format, n, k)?;
            let wbytes = blocks.len();
            let copies = CYCLE_BYTES.div_ceil(wbytes).clamp(1, 512);
            let host = HostVec::blocks(wdt, blocks)?;
            let ws: Vec<Tensor> = (0..copies).map(|_| be.upload_typed(host.as_slice())).collect::<Result<_, _>>()?;
            let dst = be.alloc_typed(n * k, wdt)?;
            let copy_s = time(&be, samples, |i| Ok(be.copy(&ws[i % copies], &dst)?))?;
            // Read + written, as device copy bandwidth is quoted.
            let copy_gbs = 2.0 * wbytes as f64 / copy_s / 1e9;
            // Dequantize to bf16 (also the bf16 GEMV's weights below).
            let wb = be.alloc_typed(n * k, DType::BF16)?;
            let cast = Op::cast(n * k, wdt, DType::BF16);
            let dq_s = time(&be, samples, |i| Ok(be.run_tensors(&cast, &[&ws[i % copies]], &wb)?))?;
            println!(
                "{format:5} dequantize to bf16 n={n:5} k={k:5}: {:8.1} us  {:7.1} GB/s of blocks  {:7.1} GB/s read+written",
                dq_s * 1e6,
                wbytes as f64 / dq_s / 1e9,
                (wbytes + 2 * n * k) as f64 / dq_s / 1e9
            );
            let ms: &[usize] = match (format, is_big) {
                (_, false) => &[1],
                (BlockFormat::Q4K, true) => &[1, 16, 64, 512],
                _ => &[1, 16],
            };
            let mut one = f64::NAN;
            for &m in ms.iter().filter(|m| only_m.is_empty() || only_m.contains(m)) {
                let xs = compute_core::rng::random_vec(m * k, -1.0, 1.0, 7 + m as u64);
                let xh = HostVec::from_f32(x_dtype, &xs);
                // The reference takes the activations as the kernel reads them.
                let xs = xh.to_f32();
                let x = be.upload_typed(xh.as_slice())?;
                let y = be.alloc_typed(m * n, DType::F32)?;
                let op = Op::QuantMatmul(QuantMatmulSpec::new(m, k, n, wdt).with_dtypes(x_dtype, DType::F32));
                let s = time(&be, samples, |i| Ok(be.run_tensors(&op, &[&x, &ws[i % copies]], &y)?))?;
                let mut out = HostVec::zeros(DType::F32, m * n);
                be.download_typed(&y, out.as_mut())?;
                let worst = check_row0(&xs, &deq, &out.to_f32(), (m, k, n));
                let mut line = format!(
                    "{format:5} n={n:5} k={k:5} m={m:3}: {:8.1} us  {:7.1} GB/s  copy r+w {:7.1} GB/s  {:4.2}x copy",
                    s * 1e6,
                    wbytes as f64 / s / 1e9,
                    copy_gbs,
                    copy_s / (2.0 * s)
                );
                if m > 1 {
                    line += &format!("  {:4.2}x the m=1 time", s / one);
                } else {
                    one = s;
                    let xb = be.upload_typed(HostVec::from_f32(DType::BF16, &xs).as_slice())?;
                    let spec =
                        MatmulSpec { trans_b: true, ..MatmulSpec::new(1, k, n) }.with_dtypes(DType::BF16, DType::F32);
                    let mm = Op::Matmul(spec);
                    let bf = time(&be, samples, |_| Ok(be.run_tensors(&mm, &[&xb, &wb], &y)?))?;
                    line += &format!("  bf16 GEMV {:8.1} us, speedup vs bf16 {:4.2}x", bf * 1e6, bf / s);
                }
                line += &format!("  row 0 max err {worst:.3} of bound{}", if worst <= 1.0 { "" } else { "  FAIL" });
                println!("{line}");
            }
        }
    }
    Ok(())
}
