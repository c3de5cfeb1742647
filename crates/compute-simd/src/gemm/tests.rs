//! Edge shapes of every ISA path against a plain triple loop in f64.
use super::*;
use compute_core::{Activation, DType, Epilogue, GeluForm, HostSlice};

/// Deterministic values in [-1, 1), never all zero.
fn values(len: usize, seed: u64) -> Vec<f32> {
    compute_core::rng::random_vec(len, -1.0, 1.0, seed)
}

/// `op(A)·op(B)` in f64 by the definition, with `Σ|aᵢₚ·bₚⱼ|` per element.
fn reference(spec: &MatmulSpec, a: &[f32], b: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let MatmulSpec { batch, m, k, n, trans_a, trans_b, .. } = *spec;
    let (mut out, mut scale) = (Vec::new(), Vec::new());
    for t in 0..batch {
        let (a, b) = (&a[t * m * k..(t + 1) * m * k], &b[t * k * n..(t + 1) * k * n]);
        for i in 0..m {
            for j in 0..n {
                let (mut s, mut abs) = (0.0f64, 0.0f64);
                for p in 0..k {
                    let x = if trans_a { a[p * m + i] } else { a[i * k + p] } as f64;
                    let y = if trans_b { b[j * k + p] } else { b[p * n + j] } as f64;
                    s += x * y;
                    abs += (x * y).abs();
                }
                out.push(s);
                scale.push(abs);
            }
        }
    }
    (out, scale)
}

/// Runs `spec` on `isa` in a pool of `threads` and checks every element.
fn check(isa: Isa, spec: MatmulSpec, threads: usize) {
    let MatmulSpec { batch, m, k, n, .. } = spec;
    let a = values(batch * m * k, (m * 31 + k * 7 + n) as u64);
    let b = values(batch * k * n, (n * 17 + k * 3 + m + 1) as u64);
    let mut c = vec![f32::NAN; batch * m * n];
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("thread pool");
    pool.install(|| sgemm(isa, &spec, &a, &b, &EpilogueArgs::none(), &mut c));
    let (want, scale) = reference(&spec, &a, &b);
    let tol = f32::EPSILON as f64 * (8.0 + 2.0 * (k as f64).sqrt());
    for (idx, ((&got, &w), &s)) in c.iter().zip(&want).zip(&scale).enumerate() {
        assert!(
            (got as f64 - w).abs() <= tol * s + 1e-30,
            "{isa} {spec:?} threads={threads}: element {idx} is {got}, want {w}"
        );
    }
}

const EDGES: [usize; 10] = [1, 2, 3, 5, 15, 16, 17, 31, 33, 65];

#[test]
fn edge_shapes_every_isa_and_transpose() {
    for isa in Isa::available() {
        for &m in &EDGES {
            for &k in &[1, 2, 3, 16, 17, 33] {
                for &n in &EDGES {
                    for (trans_a, trans_b) in [(false, false), (true, false), (false, true), (true, true)] {
                        check(isa, MatmulSpec { batch: 1, trans_a, trans_b, ..MatmulSpec::new(m, k, n) }, 1);
                    }
                }
            }
        }
    }
}

#[test]
fn tile_and_block_boundaries() {
    // Sizes straddling whole tiles (6, 8, 16, 64 wide) and the depth/column
    // blocks (GEMM_KC, GEMM_NC) on every path.
    let shapes = [(7, GEMM_KC + 1, 65), (13, 2 * GEMM_KC + 3, 129), (97, 300, GEMM_NC + 17), (64, 64, 64)];
    for isa in Isa::available() {
        for &(m, k, n) in &shapes {
            for (trans_a, trans_b) in [(false, false), (true, true)] {
                check(isa, MatmulSpec { batch: 1, trans_a, trans_b, ..MatmulSpec::new(m, k, n) }, 1);
            }
        }
    }
}

#[test]
fn batches() {
    for isa in Isa::available() {
        check(isa, MatmulSpec { batch: 3, trans_a: false, trans_b: true, ..MatmulSpec::new(17, 9, 33) }, 1);
        check(isa, MatmulSpec { batch: 5, trans_a: true, trans_b: false, ..MatmulSpec::new(2, 31, 3) }, 2);
        // Small products, many of them: split over the batch on two threads.
        check(isa, MatmulSpec { batch: 40, trans_a: false, trans_b: false, ..MatmulSpec::new(33, 40, 31) }, 2);
    }
}

#[test]
fn parallel_above_threshold() {
    // m·k·n well above PAR_GEMM_MIN_MACS, split by rows and by columns.
    for isa in Isa::available() {
        for (m, k, n) in [(301, 129, 257), (7, 700, 1000), (1000, 300, 5), (1, 700, 1000), (1000, 700, 1)] {
            assert!(m * k * n >= PAR_GEMM_MIN_MACS);
            for (trans_a, trans_b) in [(false, false), (true, false), (false, true), (true, true)] {
                check(isa, MatmulSpec { batch: 1, trans_a, trans_b, ..MatmulSpec::new(m, k, n) }, 2);
            }
        }
    }
}

#[test]
fn zero_depth_writes_zeros() {
    let mut c = vec![f32::NAN; 6];
    sgemm(Isa::detect(), &MatmulSpec::new(2, 0, 3), &[], &[], &EpilogueArgs::none(), &mut c);
    assert_eq!(c, [0.0; 6]);
}

/// Runs `spec` with `epilogue` on `isa` in a pool of `threads`, its bias and
/// `C₀` given as `dtype` values, and checks every element against the f64
/// reference ([`Epilogue::apply`]) to the conformance suite's bound.
fn check_epilogue(isa: Isa, spec: MatmulSpec, epilogue: Epilogue, dtype: DType, threads: usize) {
    use compute_core::HostVec;
    let spec = spec.with_epilogue(epilogue);
    let MatmulSpec { batch, m, k, n, .. } = spec;
    let a = values(batch * m * k, (m * 5 + k + n * 3) as u64);
    let b = values(batch * k * n, (n * 7 + k * 2 + m) as u64);
    // Rounded to `dtype` once, so the reference sees what the GEMM reads.
    let bias = HostVec::from_f32(dtype, &values(n, 11));
    let c0 = HostVec::from_f32(dtype, &values(batch * m * n, 12));
    let mut extra = Vec::new();
    if epilogue.bias {
        extra.push(bias.as_slice());
    }
    if epilogue.reads_c() {
        extra.push(c0.as_slice());
    }
    let args = EpilogueArgs::new(isa, &spec, &extra).expect("inputs");
    let mut c = vec![f32::NAN; batch * m * n];
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("thread pool");
    pool.install(|| sgemm(isa, &spec, &a, &b, &args, &mut c));
    let (want, scale) = reference(&spec, &a, &b);
    let (bias, c0) = (bias.as_slice().to_f64(), c0.as_slice().to_f64());
    let tol = f32::EPSILON as f64 * (8.0 + 2.0 * (k as f64).sqrt());
    for (idx, &got) in c.iter().enumerate() {
        let (bv, cv) = (if epilogue.bias { bias[idx % n] } else { 0.0 }, c0[idx]);
        let w = epilogue.apply(want[idx], cv, bv);
        let s = f64::from(epilogue.alpha).abs() * scale[idx] + bv.abs() + (f64::from(epilogue.beta) * cv).abs();
        let slack = 1.13 * tol * s + 1e-6 + 1e-5 * w.abs();
        assert!(
            (f64::from(got) - w).abs() <= slack,
            "{isa} {spec:?} {dtype} threads={threads}: element {idx} is {got}, want {w}"
        );
    }
}

#[test]
fn epilogues_on_every_path() {
    let e = Epilogue::default();
    let epilogues = [
        Epilogue { alpha: 0.5, beta: -1.5, bias: true, activation: Some(Activation::Gelu(GeluForm::Tanh)) },
        Epilogue { bias: true, activation: Some(Activation::Relu), ..e },
        Epilogue { beta: 1.0, activation: Some(Activation::Silu), ..e },
    ];
    // Blocks, ragged tiles, a one-column product (computed transposed), dot
    // products (few rows, transposed B), depth 0, batches, and products split
    // over two threads by rows and by columns.
    let shapes = [
        (1, 17, 5, 1, false, false),
        (1, 1, 3, 9, false, true),
        (2, 5, 0, 7, false, false),
        (3, 13, 33, 70, true, false),
        (1, 9, 300, 200, false, true),
        (1, 301, 129, 257, false, false),
        (1, 600, 64, 20, true, true),
    ];
    for isa in Isa::available() {
        for (i, &(batch, m, k, n, trans_a, trans_b)) in shapes.iter().enumerate() {
            let spec = MatmulSpec { batch, trans_a, trans_b, ..MatmulSpec::new(m, k, n) };
            let e = epilogues[i % epilogues.len()];
            for dtype in [DType::F32, DType::F16] {
                for threads in [1, 2] {
                    check_epilogue(isa, spec, e, dtype, threads);
                }
            }
        }
    }
}

#[test]
fn an_epilogue_missing_an_input_is_a_typed_error() {
    let spec = MatmulSpec::new(2, 3, 4).with_bias().with_scales(1.0, 2.0);
    let bias = [0.0f32; 4];
    let short = [0.0f32; 7];
    for extra in [&[][..], &[HostSlice::F32(&bias)][..], &[HostSlice::F32(&bias), HostSlice::F32(&short)][..]] {
        assert!(EpilogueArgs::new(Isa::Portable, &spec, extra).is_err());
    }
}

#[test]
fn nan_and_infinity_propagate() {
    let (m, k, n) = (9, 5, 70);
    let mut a = values(m * k, 1);
    let b = values(k * n, 2);
    a[3 * k + 2] = f32::NAN;
    a[7 * k] = f32::INFINITY;
    for isa in Isa::available() {
        let mut c = vec![0.0; m * n];
        sgemm(isa, &MatmulSpec::new(m, k, n), &a, &b, &EpilogueArgs::none(), &mut c);
        for j in 0..n {
            assert!(c[3 * n + j].is_nan(), "{isa}: row with a NaN");
            assert!(c[7 * n + j].is_infinite() || c[7 * n + j].is_nan(), "{isa}: row with an infinity");
            assert!(c[n + j].is_finite(), "{isa}: clean row");
        }
    }
}

#[test]
fn view_splits_are_disjoint_and_clamped() {
    let mut buf: Vec<f32> = (0..24).map(|x| x as f32).collect();
    let view = MatMut::new(&mut buf, 4, 5, 6).expect("fits");
    let (left, right) = view.split_cols(2);
    assert_eq!((left.rows(), left.cols(), right.rows(), right.cols()), (4, 2, 4, 3));
    let (top, bottom) = right.split_rows(9);
    assert_eq!((top.rows(), bottom.rows()), (4, 0));
    assert!(MatMut::new(&mut buf, 5, 5, 5).is_none(), "too short");
    assert!(MatMut::new(&mut buf, 2, 7, 6).is_none(), "wider than the stride");
}

#[test]
fn simd_transpose_matches_definition() {
    for isa in Isa::available() {
        let s = kernel::transpose_size(isa);
        if s == 0 {
            continue;
        }
        let (ld, ldd) = (s + 3, s + 5);
        let src = values(s * ld, 9);
        let mut dst = vec![f32::NAN; s * ldd];
        assert!(kernel::transpose(isa, &src, ld, &mut dst, ldd), "{isa}");
        for r in 0..s {
            for c in 0..s {
                assert_eq!(dst[c * ldd + r], src[r * ld + c], "{isa} ({r}, {c})");
            }
        }
        // Too short a destination: refused, nothing written.
        let mut short = vec![1.0; (s - 1) * ldd + s - 1];
        assert!(!kernel::transpose(isa, &src, ld, &mut short, ldd));
        assert!(short.iter().all(|&x| x == 1.0));
    }
}

/// Runs `spec` on the bf16 kernel (inputs rounded to bf16) in a pool of
/// `threads` and checks every element against the f64 product of the
/// rounded values, to the `f32` GEMM's bound. False where the CPU has no
/// AVX512_BF16 (nothing checked).
fn check_bf16(spec: MatmulSpec, threads: usize) -> bool {
    if !bf16::available(Isa::Avx512) {
        return false;
    }
    let MatmulSpec { batch, m, k, n, .. } = spec;
    let round = |v: Vec<f32>| -> Vec<half::bf16> { v.into_iter().map(half::bf16::from_f32).collect() };
    let a = round(values(batch * m * k, (m * 29 + k * 5 + n) as u64));
    let b = round(values(batch * k * n, (n * 13 + k * 11 + m + 3) as u64));
    let mut c = vec![f32::NAN; batch * m * n];
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("thread pool");
    assert!(pool.install(|| bf16::gemm(Isa::Avx512, &spec, &a, &b, &EpilogueArgs::none(), &mut c)));
    let wide = |v: &[half::bf16]| -> Vec<f32> { v.iter().map(|x| x.to_f32()).collect() };
    let (want, scale) = reference(&spec, &wide(&a), &wide(&b));
    let tol = f32::EPSILON as f64 * (8.0 + 2.0 * (k as f64).sqrt());
    for (idx, ((&got, &w), &s)) in c.iter().zip(&want).zip(&scale).enumerate() {
        assert!(
            (got as f64 - w).abs() <= tol * s + 1e-30,
            "bf16 {spec:?} threads={threads}: element {idx} is {got}, want {w}"
        );
    }
    true
}

#[test]
fn bf16_kernel_edges_transposes_and_blocks() {
    let mut shapes = Vec::new();
    for &m in &[1, 5, 6, 7, 13] {
        for &k in &[1, 2, 3, 17] {
            for &n in &[1, 15, 64, 65, 130] {
                shapes.push((m, k, n));
            }
        }
    }
    // Several depth blocks (odd remainder), row blocks and column blocks.
    shapes.extend([
        (7, bf16::KC + 3, 65),
        (13, 2 * bf16::KC + 1, 70),
        (GEMM_MC + 5, 9, 3),
        (9, 33, bf16::NC + 70),
        (40, 67, 130),
        (40, 66, 130),
        (50, 2 * bf16::KC + 2, 70),
        (17, 1, 3),
    ]);
    for (m, k, n) in shapes {
        for (trans_a, trans_b) in [(false, false), (true, false), (false, true), (true, true)] {
            if !check_bf16(MatmulSpec { batch: 1, trans_a, trans_b, ..MatmulSpec::new(m, k, n) }, 1) {
                eprintln!("skipped: this CPU has no AVX512_BF16");
                return;
            }
        }
    }
}

#[test]
fn bf16_kernel_threads_and_batches() {
    let cases = [
        MatmulSpec::new(301, 129, 257),
        MatmulSpec::new(1000, 300, 5),
        MatmulSpec { trans_b: true, ..MatmulSpec::new(3, 700, 1000) },
        MatmulSpec { batch: 3, trans_a: true, ..MatmulSpec::new(17, 9, 33) },
        MatmulSpec { batch: 40, ..MatmulSpec::new(33, 40, 31) },
    ];
    for spec in cases {
        if !check_bf16(spec, 2) {
            eprintln!("skipped: this CPU has no AVX512_BF16");
            return;
        }
    }
}

#[test]
fn bf16_kernel_propagates_nan_and_infinity() {
    if !bf16::available(Isa::Avx512) {
        eprintln!("skipped: this CPU has no AVX512_BF16");
        return;
    }
    let (m, k, n) = (9, 5, 70);
    let mut a: Vec<half::bf16> = values(m * k, 1).into_iter().map(half::bf16::from_f32).collect();
    let b: Vec<half::bf16> = values(k * n, 2).into_iter().map(half::bf16::from_f32).collect();
    a[3 * k + 2] = half::bf16::NAN;
    a[7 * k] = half::bf16::INFINITY;
    let mut c = vec![0.0; m * n];
    assert!(bf16::gemm(Isa::Avx512, &MatmulSpec::new(m, k, n), &a, &b, &EpilogueArgs::none(), &mut c));
    for j in 0..n {
        assert!(c[3 * n + j].is_nan(), "row with a NaN");
        assert!(c[7 * n + j].is_infinite() || c[7 * n + j].is_nan(), "row with an infinity");
        assert!(c[n + j].is_finite(), "clean row");
    }
    // Not the AVX-512 path: refused, nothing written.
    assert!(!bf16::gemm(Isa::Avx2, &MatmulSpec::new(m, k, n), &a, &b, &EpilogueArgs::none(), &mut c[..0]));
}

#[test]
fn bf16_kernel_packs_misaligned_operands_the_same() {
    if !bf16::available(Isa::Avx512) {
        eprintln!("skipped: this CPU has no AVX512_BF16");
        return;
    }
    // A weight that starts 2 bytes past a 4-byte boundary cannot be read as
    // pair words: the scalar packing must give the same bits.
    let (m, k, n) = (40, 66, 130);
    let round = |v: Vec<f32>| -> Vec<half::bf16> { v.into_iter().map(half::bf16::from_f32).collect() };
    let a = round(values(m * k, 5));
    let b_store = round(values(k * n + 1, 6));
    let b_shifted = &b_store[1..];
    let b_aligned = b_shifted.to_vec();
    let spec = MatmulSpec { trans_b: true, ..MatmulSpec::new(m, k, n) };
    let (mut c1, mut c2) = (vec![0.0f32; m * n], vec![1.0f32; m * n]);
    assert!(bf16::gemm(Isa::Avx512, &spec, &a, b_shifted, &EpilogueArgs::none(), &mut c1));
    assert!(bf16::gemm(Isa::Avx512, &spec, &a, &b_aligned, &EpilogueArgs::none(), &mut c2));
    assert!(c1.iter().zip(&c2).all(|(x, y)| x.to_bits() == y.to_bits()));
}
