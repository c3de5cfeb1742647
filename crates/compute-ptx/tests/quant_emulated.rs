//! The block-quantized weight kernels (dequantize, activation quantizer,
//! `dp4a` GEMV and the dequantize-then-GEMM prefill path) run by the PTX
//! emulator through their plans: products against an `f64` reference on the
//! dequantized weights within the int8-activation bound, dequantization bit
//! for bit against `BlockFormat::dequantize`, and the typed errors.

mod common;

use common::EmuBackend;
use compute_core::conformance::rng::Rng;
use compute_core::quant::BlockFormat;
use compute_core::{ComputeError, DType, HostVec, bf16, f16};
use compute_ptx::plan;

const FORMATS: [BlockFormat; 4] = [BlockFormat::Q4K, BlockFormat::Q5K, BlockFormat::Q6K, BlockFormat::Q8_0];
const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// `n` rows of `k` random values (row scales from 1e-3 to 1e2, one row of
/// zeros when `n > 2`), quantized; returns the blocks and the dequantized
/// rows.
fn weights(format: BlockFormat, n: usize, k: usize, rng: &mut Rng) -> (Vec<u8>, Vec<f32>) {
    let row_bytes = format.row_bytes(k).unwrap();
    let mut blocks = vec![0u8; n * row_bytes];
    let scales = [1.0f64, 1e-3, 37.0, 0.25, 100.0];
    for j in 0..n {
        let s = scales[j % scales.len()];
        let mut row = rng.vec(k, -s, s);
        if n > 2 && j == 1 {
            row.iter_mut().for_each(|v| *v = 0.0);
        }
        if j % 3 == 2 {
            // Mostly positive rows exercise the k-quants' mins.
            row.iter_mut().for_each(|v| *v = v.abs() + 0.1 * s as f32);
        }
        format.quantize(&row, &mut blocks[j * row_bytes..(j + 1) * row_bytes]).unwrap();
    }
    let mut w = vec![0f32; n * k];
    format.dequantize(&blocks, &mut w).unwrap();
    (blocks, w)
}

fn decode(bytes: &[u8], dtype: DType) -> Vec<f32> {
    match dtype {
        DType::F32 => bytes.chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        DType::F16 => bytes.chunks(2).map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()).collect(),
        _ => bytes.chunks(2).map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()).collect(),
    }
}

/// Half an ulp of `dtype` at `v` (relative), 0 for `f32` (covered by the 2⁻¹⁸ term).
fn half_ulp(dtype: DType, v: f64) -> f64 {
    match dtype {
        DType::F16 => v.abs() * 2f64.powi(-11) + 2f64.powi(-25),
        DType::BF16 => v.abs() * 2f64.powi(-8),
        _ => 0.0,
    }
}

/// Runs `y = x·Wᵀ` on the emulator and checks every output against the bound.
#[allow(clippy::too_many_arguments)]
fn check_product(
    emu: &EmuBackend,
    format: BlockFormat,
    (m, k, n): (usize, usize, usize),
    x_dtype: DType,
    out_dtype: DType,
    rng: &mut Rng,
) {
    let (blocks, w) = weights(format, n, k, rng);
    let mut xf = rng.vec(m * k, -1.0, 1.0);
    for (i, row) in xf.chunks_mut(k.max(1)).enumerate() {
        let s = [1.0f32, 8.0, 0.01][i % 3];
        row.iter_mut().for_each(|v| *v *= s);
    }
    let x = HostVec::from_f32(x_dtype, &xf);
    let xs: Vec<f64> = x.to_f32().iter().map(|&v| f64::from(v)).collect();
    let out_bytes = m * n * out_dtype.size_in_bytes();
    let y = emu
        .run_bytes(&[x.as_slice().as_bytes(), &blocks], out_bytes, |p, o| {
            plan::run_quant_matmul(emu, format, m, k, n, x_dtype, out_dtype, (p[0], p[1], o))
        })
        .unwrap();
    let y = decode(&y, out_dtype);
    let prefill = m > compute_ptx::kernels::quant_gemv::MAX_ROWS;
    for i in 0..m {
        let xr = &xs[i * k..(i + 1) * k];
        let xmax = xr.iter().fold(0f64, |a, v| a.max(v.abs()));
        for j in 0..n {
            let wr = &w[j * k..(j + 1) * k];
            let exact: f64 = xr.iter().zip(wr).map(|(a, &b)| a * f64::from(b)).sum();
            let abs_xw: f64 = xr.iter().zip(wr).map(|(a, &b)| (a * f64::from(b)).abs()).sum();
            let sum_w: f64 = wr.iter().map(|&b| f64::from(b).abs()).sum();
            let mut bound = 1.01 * (xmax / 254.0) * sum_w + 2f64.powi(-18) * abs_xw;
            if prefill {
                // bf16 weights, and bf16 activations unless they already were.
                bound += 2f64.powi(-8) * abs_xw * if x_dtype == DType::BF16 { 1.0 } else { 2.0 };
            }
            bound += half_ulp(out_dtype, exact.abs() + bound);
            let got = f64::from(y[i * n + j]);
            assert!(
                (got - exact).abs() <= bound,
                "{format} m={m} k={k} n={n} x {x_dtype} y {out_dtype}: y[{i}, {j}] = {got}, reference {exact}, bound {bound}"
            );
        }
    }
}

fn products(format: BlockFormat, shapes: &[(usize, usize)], ms: &[usize]) {
    let emu = EmuBackend::new();
    let mut rng = Rng::new(0x9a11 + format.bytes_per_block() as u64);
    let mut c = 0;
    for &m in ms {
        for &(k, n) in shapes {
            let (x_dtype, out_dtype) = (DTYPES[c % 3], DTYPES[(c / 3 + c) % 3]);
            check_product(&emu, format, (m, k, n), x_dtype, out_dtype, &mut rng);
            c += 1;
        }
    }
}

/// Shapes of the GEMV path: k of 1 to 3 blocks (the tail alone) and of 9
/// blocks (the main loop, then the tail), n not a multiple of the 4 rows a
/// block takes.
const K_SHAPES: [(usize, usize); 4] = [(256, 5), (512, 37), (768, 6), (2304, 3)];
const GEMV_MS: [usize; 5] = [1, 2, 3, 8, 16];

#[test]
fn q4k_products_within_the_int8_bound() {
    products(BlockFormat::Q4K, &K_SHAPES, &GEMV_MS);
}

#[test]
fn q5k_products_within_the_int8_bound() {
    products(BlockFormat::Q5K, &K_SHAPES, &GEMV_MS);
}

#[test]
fn q6k_products_within_the_int8_bound() {
    products(BlockFormat::Q6K, &K_SHAPES, &GEMV_MS);
}

#[test]
fn q8_0_products_within_the_int8_bound() {
    // 1, 3 and 24 blocks (tail only), 40 (main loop and tail).
    products(BlockFormat::Q8_0, &[(32, 5), (96, 37), (768, 6), (1280, 3)], &GEMV_MS);
}

/// The kernels that quantize the activations in shared memory (up to 4
/// rows): a row of 18 blocks (the main loop of 16 blocks per warp, then the
/// tail; two passes of the quantizing loop), warps taking several rows; the
/// kernels for long rows on a row of 33 blocks (one pass, most warps past
/// the end; `Q4_K` takes the split kernel there) and 4 rows of 18 (two passes); and 4 rows of 12288 values, whose
/// quantized activations exceed the shared memory the kernel may take, so
/// the separate quantizer and the GEMV run.
#[test]
fn quantizing_gemv_long_rows_and_the_fallback() {
    let emu = EmuBackend::new();
    let mut rng = Rng::new(0x51de);
    for (f, format) in FORMATS.into_iter().enumerate() {
        for (s, &(m, k, n)) in
            [(1, 4608, 70), (1, 8448, 11), (2, 4352, 5), (4, 4608, 9), (4, 12288, 3)].iter().enumerate()
        {
            let x_dtype = DTYPES[(f + s) % 3];
            let out_dtype = DTYPES[(f + 2 * s + 2) % 3];
            check_product(&emu, format, (m, k, n), x_dtype, out_dtype, &mut rng);
        }
    }
}

/// The split one-row `Q4_K` kernel for rows of 8192 values or more: whole
/// slices (8192 values: 4 slices; 37 rows, so a chunk has rows past the
/// end), a last slice of one block (8448), and six slices, the last of one
/// block, with rows enough for several batches per chunk (10496 × 300);
/// every dtype of `x` and `y`. Each product launches the split kernel alone.
#[test]
fn split_gemv_for_long_rows() {
    let emu = EmuBackend::new();
    let mut rng = Rng::new(0x5b11);
    for (s, &(k, n)) in [(8192, 37), (8448, 70), (10496, 300)].iter().enumerate() {
        for (t, x_dtype) in DTYPES.into_iter().enumerate() {
            let out_dtype = DTYPES[(s + t) % 3];
            let before = emu.log.lock().unwrap().len();
            check_product(&emu, BlockFormat::Q4K, (1, k, n), x_dtype, out_dtype, &mut rng);
            let names: Vec<String> = emu.log.lock().unwrap()[before..].iter().map(|(k, _)| k.clone()).collect();
            let want = format!("qgemvs_q4k_{}_{}", x_dtype.as_str(), out_dtype.as_str());
            assert_eq!(names, [want], "k = {k}, n = {n}");
        }
    }
}

#[test]
fn every_dtype_pair_on_one_shape() {
    let emu = EmuBackend::new();
    let mut rng = Rng::new(7);
    for format in FORMATS {
        for x_dtype in DTYPES {
            for out_dtype in DTYPES {
                check_product(&emu, format, (4, 256, 5), x_dtype, out_dtype, &mut rng);
            }
        }
    }
}

#[test]
fn prefill_dequantizes_then_multiplies() {
    let emu = EmuBackend::new();
    let mut rng = Rng::new(11);
    for (f, format) in FORMATS.into_iter().enumerate() {
        // n odd (through f32) and even (tensor cores).
        for (s, &(m, n)) in [(17, 5), (33, 8)].iter().enumerate() {
            let k = if format == BlockFormat::Q8_0 { 64 } else { 256 };
            let x_dtype = DTYPES[(f + s) % 3];
            let out_dtype = DTYPES[(f + 2 * s + 1) % 3];
            check_product(&emu, format, (m, k, n), x_dtype, out_dtype, &mut rng);
        }
    }
    let log = emu.log.lock().unwrap();
    assert!(log.iter().any(|(name, _)| name.starts_with("dequant_")), "the prefill path dequantizes");
}

/// The one-launch kernel with an epilogue in its stores: `y = alpha·x·Wᵀ +
/// beta·C₀` (a residual add at `alpha = beta = 1`), against the exact
/// product and `C₀` within the int8 bound; one row of 8448 values takes the
/// split kernel with the same epilogue.
#[test]
fn the_one_row_kernel_adds_a_residual_in_its_stores() {
    use compute_ptx::kernels::gemm_epilogue::EpilogueKind;
    use compute_ptx::kernels::quant_gemv::XFusion;
    let emu = EmuBackend::new();
    let mut rng = Rng::new(0xe911);
    let kind = EpilogueKind { bias: false, c: true, activation: None };
    for (m, k, n, dtype, (alpha, beta)) in [
        (1, 512, 37, DType::BF16, (1.0, 1.0)),
        (2, 256, 9, DType::F32, (0.5, -2.0)),
        (3, 768, 5, DType::F16, (1.0, 1.0)),
        (1, 8448, 21, DType::BF16, (0.75, 1.0)),
    ] {
        let format = BlockFormat::Q4K;
        assert!(plan::fuses_epilogue(m, k));
        let (blocks, w) = weights(format, n, k, &mut rng);
        let x = HostVec::from_f32(dtype, &rng.vec(m * k, -1.0, 1.0));
        let c0 = HostVec::from_f32(dtype, &rng.vec(m * n, -4.0, 4.0));
        let (xs, cs) = (x.to_f32(), c0.to_f32());
        let y = emu
            .run_bytes(
                &[x.as_slice().as_bytes(), &blocks, c0.as_slice().as_bytes()],
                m * n * dtype.size_in_bytes(),
                |p, o| {
                    let args = [plan::Arg::F32(alpha), plan::Arg::F32(beta), plan::Arg::Ptr(0), plan::Arg::Ptr(p[2])];
                    plan::run_quant_matmul_fused(
                        &emu,
                        format,
                        (m, k, n),
                        (dtype, dtype),
                        (XFusion::epilogue(Some(kind)), &args),
                        (p[0], p[1], o),
                    )
                },
            )
            .unwrap();
        let y = decode(&y, dtype);
        for i in 0..m {
            let xr = &xs[i * k..(i + 1) * k];
            let xmax = xr.iter().fold(0f64, |a, &v| a.max(f64::from(v).abs()));
            for j in 0..n {
                let wr = &w[j * k..(j + 1) * k];
                let p: f64 = xr.iter().zip(wr).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum();
                let sum_w: f64 = wr.iter().map(|&b| f64::from(b).abs()).sum();
                let c = f64::from(cs[i * n + j]);
                let exact = f64::from(alpha) * p + f64::from(beta) * c;
                let mut bound = f64::from(alpha).abs() * 1.01 * (xmax / 254.0) * sum_w + 1e-5 * (p.abs() + c.abs());
                bound += half_ulp(dtype, exact.abs() + bound);
                let got = f64::from(y[i * n + j]);
                assert!(
                    (got - exact).abs() <= bound,
                    "m={m} {dtype}: y[{i}, {j}] = {got}, reference {exact}, bound {bound}"
                );
            }
        }
    }
    let log = emu.log.lock().unwrap();
    assert!(log.iter().any(|(name, _)| name == "qgemvs_q4k_bf16_bf16_ep_c"), "the long row takes the split kernel");
}

/// The conformance suite's products with a fused RMS norm and gated
/// halves (every format, 1 to 17 rows: the one-launch kernel and the passes
/// the other paths run instead) and a long `Q4_K` row (the kernels for long
/// rows), every dtype pair, against the float64 reference within the op's
/// stated tolerance.
#[test]
fn fused_norm_and_gated_halves_agree() {
    use compute_core::conformance::{Group, Scale, cases, check_op_typed, dtype_variants, typed_inputs_for};
    use compute_core::{Op, QuantMatmulSpec};
    let emu = EmuBackend::new();
    let mut rng = Rng::new(0xf05e);
    // A long row too (8448 values: the kernels for long rows).
    let long = QuantMatmulSpec::new(1, 8448, 6, DType::Q4K);
    let long = [long.with_rms_norm(1e-5), long.with_glu(), long.with_rms_norm(1e-6).with_glu()].map(Op::QuantMatmul);
    let fused: Vec<Op> = cases(Group::Quantized, Scale::Small)
        .into_iter()
        .filter(|op| matches!(op, Op::QuantMatmul(s) if s.rms_norm.is_some() || s.glu))
        .chain(long)
        .flat_map(|op| dtype_variants(&op))
        .collect();
    assert!(fused.len() >= 60, "{} fused cases", fused.len());
    for op in &fused {
        let inputs = typed_inputs_for(op, &mut rng);
        if let Err(msg) = check_op_typed(&emu, op, &inputs, 1.0) {
            panic!("{}: {msg}", op.shapes());
        }
    }
}

#[test]
fn empty_inner_dimension_writes_zeros() {
    let emu = EmuBackend::new();
    for m in [3, 20] {
        let y = emu
            .run_bytes(&[&[0u8; 16], &[0u8; 16]], m * 2 * 4, |p, o| {
                plan::run_quant_matmul(&emu, BlockFormat::Q4K, m, 0, 2, DType::F32, DType::F32, (p[0], p[1], o))
            })
            .unwrap();
        assert!(decode(&y, DType::F32).iter().all(|&v| v == 0.0));
    }
}

#[test]
fn dequantize_is_bit_exact() {
    let emu = EmuBackend::new();
    let mut rng = Rng::new(3);
    for format in FORMATS {
        let k = format.values_per_block() * 3;
        let (blocks, _) = weights(format, 4, k, &mut rng);
        let len = 4 * k;
        let mut want = vec![0f32; len];
        format.dequantize(&blocks, &mut want).unwrap();
        let mut want16 = vec![f16::ZERO; len];
        format.dequantize_f16(&blocks, &mut want16).unwrap();
        let mut want_b = vec![bf16::ZERO; len];
        format.dequantize_bf16(&blocks, &mut want_b).unwrap();
        for out in DTYPES {
            let y = emu
                .run_bytes(&[&blocks], len * out.size_in_bytes(), |p, o| {
                    plan::run_dequantize(&emu, format, len, out, (p[0], o))
                })
                .unwrap();
            let bits: Vec<u32> = match out {
                DType::F32 => y.chunks(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
                _ => y.chunks(2).map(|c| u32::from(u16::from_le_bytes([c[0], c[1]]))).collect(),
            };
            let expect: Vec<u32> = match out {
                DType::F32 => want.iter().map(|v| v.to_bits()).collect(),
                DType::F16 => want16.iter().map(|v| u32::from(v.to_bits())).collect(),
                _ => want_b.iter().map(|v| u32::from(v.to_bits())).collect(),
            };
            if let Some(i) = (0..len).find(|&i| bits[i] != expect[i]) {
                panic!("{format} to {out}: value {i} is {:#x}, ggml gives {:#x}", bits[i], expect[i]);
            }
        }
    }
}

#[test]
fn typed_errors_queue_nothing() {
    let emu = EmuBackend::new();
    let run = |format, k: usize, x_dtype| {
        emu.run_bytes(&[&[0u8; 4096], &[0u8; 4096]], 64, |p, o| {
            plan::run_quant_matmul(&emu, format, 2, k, 2, x_dtype, DType::F32, (p[0], p[1], o))
        })
    };
    assert!(matches!(run(BlockFormat::Q4K, 300, DType::F32), Err(ComputeError::Shape { .. })));
    assert!(matches!(run(BlockFormat::Q8_0, 48, DType::F32), Err(ComputeError::Shape { .. })));
    assert!(matches!(run(BlockFormat::Q8K, 256, DType::F32), Err(ComputeError::Shape { .. })));
    let dq = |format, len: usize, misalign: u64| {
        emu.run_bytes(&[&[0u8; 4096]], 4096, |p, o| {
            plan::run_dequantize(&emu, format, len, DType::F32, (p[0] + misalign, o))
        })
    };
    assert!(matches!(dq(BlockFormat::Q6K, 100, 0), Err(ComputeError::Shape { .. })));
    assert!(matches!(dq(BlockFormat::Q8K, 256, 0), Err(ComputeError::Shape { .. })));
    assert!(matches!(dq(BlockFormat::Q4K, 256, 2), Err(ComputeError::Shape { .. })));
    assert!(emu.log.lock().unwrap().is_empty(), "an error queues nothing");
}
