//! The quantized product and dequantize on the device the tests find (lavapipe
//! in CI), against `BlockFormat::dequantize` and an `f64` product. Without an
//! adapter they print SKIPPED, unless `COMPUTE_REQUIRE` lists `wgpu` or `CI`
//! is set (then they fail).

use std::sync::Arc;

use compute_core::quant::BlockFormat;
use compute_core::rng::Rng;
use compute_core::{DType, bf16, f16};

use super::{GEMV_MAX_ROWS, GEMV_PASS_ROWS, dequantize, gemv, quant_matmul};
use crate::buffers::{Use, padded_bytes_of};
use crate::context::{Context, block_on};
use crate::encode::submit_and_read;
use crate::options::DeviceOptions;
use crate::plan::{Step, View};

const FORMATS: [BlockFormat; 4] = [BlockFormat::Q4K, BlockFormat::Q5K, BlockFormat::Q6K, BlockFormat::Q8_0];

fn device() -> Option<Arc<Context>> {
    match block_on(Context::open(&DeviceOptions::default())) {
        Ok(ctx) => Some(Arc::new(ctx)),
        Err(e) => {
            crate::skip_without_adapter(&e);
            None
        }
    }
}

/// A storage buffer holding `bytes` (padded to 16).
fn upload(ctx: &Context, bytes: &[u8]) -> wgpu::Buffer {
    let padded = bytes.len().div_ceil(16) * 16;
    let buffer = ctx.cache.take(ctx, Use::Storage, padded as u64, "test").unwrap();
    let mut data = bytes.to_vec();
    data.resize(padded, 0);
    ctx.queue.write_buffer(&buffer, 0, &data);
    buffer
}

/// Runs `steps`, then reads `bytes` bytes from the start of `out`.
fn run(ctx: &Arc<Context>, steps: Vec<Step>, out: &wgpu::Buffer, bytes: usize) -> Vec<u8> {
    let mut host = vec![0u8; bytes];
    submit_and_read(ctx, steps, out, bytes as u64, "test").unwrap().wait_into_bytes(&mut host).unwrap();
    host
}

/// `values` as bytes of `dtype`, and the values the device sees (rounded).
fn encode(values: &[f32], dtype: DType) -> (Vec<u8>, Vec<f64>) {
    match dtype {
        DType::F16 => {
            let h: Vec<f16> = values.iter().map(|&v| f16::from_f32(v)).collect();
            (h.iter().flat_map(|v| v.to_le_bytes()).collect(), h.iter().map(|v| v.to_f64()).collect())
        }
        DType::BF16 => {
            let h: Vec<bf16> = values.iter().map(|&v| bf16::from_f32(v)).collect();
            (h.iter().flat_map(|v| v.to_le_bytes()).collect(), h.iter().map(|v| v.to_f64()).collect())
        }
        _ => (values.iter().flat_map(|v| v.to_le_bytes()).collect(), values.iter().map(|&v| f64::from(v)).collect()),
    }
}

/// `bytes` of `dtype` as f32 values.
fn decode(bytes: &[u8], dtype: DType) -> Vec<f32> {
    match dtype {
        DType::F16 => bytes.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        DType::BF16 => bytes.chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        _ => bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
    }
}

/// `n` rows of `k` values quantized to `format`: random rows at scales from
/// 0 (an all-zero row) to 100, and the blocks' dequantized values.
fn weights(format: BlockFormat, n: usize, k: usize, rng: &mut Rng) -> (Vec<u8>, Vec<f32>) {
    let scales = [1.0, 0.0, 1e-3, 100.0, 0.3];
    let mut w = Vec::with_capacity(n * k);
    for j in 0..n {
        let s = scales[j % scales.len()];
        w.extend(rng.vec(k, -1.0, 1.0).into_iter().map(|v| v * s as f32));
    }
    let mut blocks = vec![0u8; n * format.row_bytes(k).unwrap()];
    format.quantize(&w, &mut blocks).unwrap();
    let mut deq = vec![0f32; n * k];
    format.dequantize(&blocks, &mut deq).unwrap();
    (blocks, deq)
}

/// Which product path a check runs.
#[derive(Clone, Copy, Debug)]
enum Path {
    /// `quant_matmul`'s own choice.
    Planned,
    /// The `gemv` passes, with subgroup reductions or without.
    Gemv { subgroup: bool },
}

/// Runs one product on the device and checks every output against the `f64`
/// product of the dequantized weights: `|y − ref| ≤ 2⁻¹⁸·Σ|x·w|`, plus half
/// an ulp of a half output, plus `(max |x| / 254)·Σ|w|` for a row that
/// `gemv_dot` computes (a `q4_K` pass of one row: its `x` is rounded to 8-bit
/// integers, as the conformance tolerance allows).
#[allow(clippy::too_many_arguments)]
fn check_product(
    ctx: &Arc<Context>,
    format: BlockFormat,
    (m, k, n): (usize, usize, usize),
    x_dtype: DType,
    y_dtype: DType,
    path: Path,
    rng: &mut Rng,
) {
    let (blocks, deq) = weights(format, n, k, rng);
    let xs = rng.vec(m * k, -2.0, 2.0);
    let (x_bytes, xv) = encode(&xs, x_dtype);
    let w = upload(ctx, &blocks);
    let x = View { buffer: upload(ctx, &x_bytes), len: m * k, dtype: x_dtype };
    let y_bytes = padded_bytes_of(m * n, y_dtype);
    let y_buf = ctx.cache.take(ctx, Use::Storage, y_bytes, "test").unwrap();
    let y = View { buffer: y_buf.clone(), len: m * n, dtype: y_dtype };
    let mut steps = Vec::new();
    let what = format!("{format} m={m} k={k} n={n} x {x_dtype} y {y_dtype} {path:?}");
    match path {
        Path::Planned => quant_matmul(ctx, "quant_matmul", format, (m, k, n), &x, &w, &y, &mut steps),
        Path::Gemv { subgroup } => gemv(ctx, "quant_matmul", format, (m, k, n), &x, &w, &y, subgroup, &mut steps),
    }
    .unwrap_or_else(|e| panic!("{what}: {e}"));
    let got = decode(&run(ctx, steps, &y_buf, m * n * y_dtype.size_in_bytes()), y_dtype);
    for i in 0..m {
        // The last pass holds only this row (`gemv_dot`).
        let rounded = format == BlockFormat::Q4K && m as u64 % GEMV_PASS_ROWS == 1 && i == m - 1;
        let x_max = xv[i * k..(i + 1) * k].iter().fold(0f64, |a, v| a.max(v.abs()));
        for j in 0..n {
            let (mut want, mut size, mut w_sum) = (0f64, 0f64, 0f64);
            for l in 0..k {
                let t = xv[i * k + l] * f64::from(deq[j * k + l]);
                want += t;
                size += t.abs();
                w_sum += f64::from(deq[j * k + l]).abs();
            }
            let e = size * 2f64.powi(-18) + if rounded { x_max / 254.0 * w_sum } else { 0.0 };
            let bound = e + if y_dtype == DType::F32 { 0.0 } else { y_dtype.unit_roundoff() * (want.abs() + e) };
            let g = f64::from(got[i * n + j]);
            assert!((g - want).abs() <= bound, "{what}: y[{i}, {j}] = {g}, want {want} ± {bound}");
        }
    }
}

#[test]
fn products_match_the_dequantized_f64_product() {
    let Some(ctx) = device() else { return };
    let mut rng = Rng::new(7);
    for format in FORMATS {
        for x_dtype in DType::ALL {
            for m in [1, 3, 8, 17] {
                for k in [256, 512] {
                    for n in [5, 37, 64] {
                        check_product(&ctx, format, (m, k, n), x_dtype, DType::F32, Path::Planned, &mut rng);
                    }
                }
            }
        }
    }
}

#[test]
fn dot_kernels_take_the_most_rows_that_still_fill_the_device() {
    assert_eq!(super::dot_rows(65536), 32);
    assert_eq!(super::dot_rows(14336), 32);
    assert_eq!(super::dot_rows(4096), 8);
    assert_eq!(super::dot_rows(2048), 4);
    assert_eq!(super::dot_rows(1), 4);
}

/// One-row `q4_K` products on `gemv_dot`: rows of several phases (2048
/// values each) and a partial last one, and weights of 4, 8 and 32 rows per
/// workgroup with a partial last workgroup.
#[test]
fn one_row_q4k_products_on_integer_dot_products() {
    let Some(ctx) = device() else { return };
    let mut rng = Rng::new(13);
    for (k, n) in [(8448, 37), (2048, 5), (512, 4100), (256, 14339)] {
        for x_dtype in DType::ALL {
            check_product(&ctx, BlockFormat::Q4K, (1, k, n), x_dtype, DType::F32, Path::Planned, &mut rng);
        }
    }
}

#[test]
fn half_outputs_and_both_reductions() {
    let Some(ctx) = device() else { return };
    eprintln!("adapter {}: subgroups {}", ctx.report, ctx.subgroups());
    let mut rng = Rng::new(11);
    for format in FORMATS {
        for (x_dtype, y_dtype) in [(DType::F16, DType::F16), (DType::BF16, DType::BF16), (DType::F32, DType::BF16)] {
            for m in [1, 3, 17] {
                check_product(&ctx, format, (m, 512, 37), x_dtype, y_dtype, Path::Planned, &mut rng);
            }
        }
        // The gemv passes for more rows than the prefill threshold, and the
        // reduction the device's own choice does not take (where it has subgroups).
        let m = GEMV_MAX_ROWS + 3;
        let mut paths = vec![Path::Gemv { subgroup: false }];
        if ctx.subgroups() {
            paths.push(Path::Gemv { subgroup: true });
        }
        for path in paths {
            for (m, n) in [(1, 5), (2, 64), (5, 37), (m, 37)] {
                check_product(&ctx, format, (m, 256, n), DType::F32, DType::F32, path, &mut rng);
            }
        }
    }
}

#[test]
fn dequantize_is_bit_exact_with_the_reference() {
    let Some(ctx) = device() else { return };
    let mut rng = Rng::new(3);
    for format in FORMATS {
        let len = 4 * 512;
        // Quantized rows, then blocks of random bytes (subnormal, infinite and
        // NaN scales included).
        let (mut blocks, _) = weights(format, 2, len / 2, &mut rng);
        let random: Vec<u8> = (0..blocks.len()).map(|_| rng.next_u64() as u8).collect();
        blocks.extend(random);
        let len = 2 * len;
        let w = upload(&ctx, &blocks);
        let mut want = vec![0f32; len];
        format.dequantize(&blocks, &mut want).unwrap();
        for dtype in DType::ALL {
            let y_buf = ctx.cache.take(&ctx, Use::Storage, padded_bytes_of(len, dtype), "test").unwrap();
            let y = View { buffer: y_buf.clone(), len, dtype };
            let mut steps = Vec::new();
            dequantize(&ctx, "cast", format, len, &w, &y, &mut steps).unwrap();
            let got = run(&ctx, steps, &y_buf, len * dtype.size_in_bytes());
            let want_bytes: Vec<u8> = match dtype {
                DType::F16 => want.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes()).collect(),
                DType::BF16 => want.iter().flat_map(|&v| bf16::from_f32(v).to_le_bytes()).collect(),
                _ => want.iter().flat_map(|v| v.to_le_bytes()).collect(),
            };
            let size = dtype.size_in_bytes();
            for (i, (g, r)) in got.chunks_exact(size).zip(want_bytes.chunks_exact(size)).enumerate() {
                let (gv, rv) = (decode(g, dtype)[0], decode(r, dtype)[0]);
                let same = g == r || (gv.is_nan() && rv.is_nan());
                assert!(same, "{format} → {dtype}: value {i}: got {gv:e} ({g:?}), want {rv:e} ({r:?})");
            }
        }
    }
}

#[test]
fn formats_without_kernels_and_ragged_rows_are_typed_errors() {
    let Some(ctx) = device() else { return };
    let w = upload(&ctx, &[0u8; 512]);
    let x = View { buffer: upload(&ctx, &[0u8; 4096]), len: 256, dtype: DType::F32 };
    let y = View { buffer: upload(&ctx, &[0u8; 64]), len: 4, dtype: DType::F32 };
    let mut steps = Vec::new();
    assert!(quant_matmul(&ctx, "q", BlockFormat::Q8K, (1, 256, 1), &x, &w, &y, &mut steps).is_err());
    assert!(quant_matmul(&ctx, "q", BlockFormat::Q4K, (1, 200, 1), &x, &w, &y, &mut steps).is_err());
    assert!(quant_matmul(&ctx, "q", BlockFormat::Q4K, (2, 256, 1), &x, &w, &y, &mut steps).is_err());
    assert!(dequantize(&ctx, "q", BlockFormat::Q6K, 100, &w, &y, &mut steps).is_err());
    assert!(steps.is_empty());
}
