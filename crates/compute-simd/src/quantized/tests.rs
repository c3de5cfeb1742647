//! The quantized product against the f64 product of the dequantized
//! weights, the vectorised kernel against the scalar loop, and the refusals.
use super::*;
use compute_core::quant::BlockFormat;

fn values(len: usize, seed: u64) -> Vec<f32> {
    compute_core::rng::random_vec(len, -1.0, 1.0, seed)
}

fn block_format(format: Weights) -> BlockFormat {
    match format {
        Weights::Q4K => BlockFormat::Q4K,
        Weights::Q6K => BlockFormat::Q6K,
    }
}

/// `n` rows of `k` random values quantized to `format`, and their dequantized values.
fn weights_of(format: Weights, n: usize, k: usize, seed: u64) -> (Vec<u8>, Vec<f32>) {
    let w = values(n * k, seed);
    let mut blocks = vec![0u8; n * k / Q4K_VALUES * format.block_bytes()];
    block_format(format).quantize(&w, &mut blocks).expect("quantize");
    let mut deq = vec![0.0f32; n * k];
    block_format(format).dequantize(&blocks, &mut deq).expect("dequantize");
    (blocks, deq)
}

fn weights(n: usize, k: usize, seed: u64) -> (Vec<u8>, Vec<f32>) {
    weights_of(Weights::Q4K, n, k, seed)
}

/// Checks `matmul_q4k` on `threads` threads against the f64 reference: the
/// error bound is the activations' rounding (`dx/2` per value, times `|w|`)
/// plus `f32` rounding of the per-block terms.
fn check(format: Weights, m: usize, k: usize, n: usize, threads: usize) {
    let (w, deq) = weights_of(format, n, k, (m * 7 + k + n) as u64);
    let x = values(m * k, (m + k * 3 + n * 5) as u64);
    let mut y = vec![f32::NAN; m * n];
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("pool");
    assert!(pool.install(|| matmul(format, &x, &w, (m, k, n), &mut y)));
    for i in 0..m {
        let xi = &x[i * k..(i + 1) * k];
        let q = Q8Row::quantize(xi);
        for j in 0..n {
            let wj = &deq[j * k..(j + 1) * k];
            let (mut exact, mut bound) = (0.0f64, 1e-6f64);
            for (p, (&a, &b)) in xi.iter().zip(wj).enumerate() {
                exact += f64::from(a) * f64::from(b);
                bound += f64::from(b.abs()) * (f64::from(q.scales()[p / Q4K_VALUES]) / 2.0 + 1e-6 * f64::from(a.abs()));
            }
            let got = f64::from(y[i * n + j]);
            assert!(
                (got - exact).abs() <= bound,
                "({m}, {k}, {n}) t={threads} y[{i}][{j}] = {got}, want {exact} ± {bound}"
            );
        }
    }
}

#[test]
fn products_match_the_dequantized_reference() {
    for &(m, k, n) in
        &[(1, 256, 1), (1, 512, 5), (3, 256, 64), (1, 4096, 300), (17, 768, 33), (2, 1024, 1000), (9, 512, 70)]
    {
        for format in [Weights::Q4K, Weights::Q6K] {
            check(format, m, k, n, 1);
            check(format, m, k, n, 2);
        }
    }
}

#[test]
fn the_vnni_kernel_agrees_with_the_scalar_loop() {
    if !has_vnni() {
        eprintln!("skipped: this CPU has no AVX-512 VNNI");
        return;
    }
    let k = 2048;
    let (w, _) = weights(8, k, 3);
    let x = values(k, 4);
    let q = Q8Row::quantize(&x);
    let others: Vec<Q8Row> = (0..3).map(|s| Q8Row::quantize(&values(k, 10 + s))).collect();
    for wj in w.chunks_exact(k / Q4K_VALUES * Q4K_BYTES) {
        for rows in 1..=vnni::ROWS {
            let xs: Vec<&Q8Row> = std::iter::once(&q).chain(&others).take(rows).collect();
            let mut fast = [f32::NAN; vnni::ROWS];
            assert!(vnni::dots(wj, &xs, &mut fast));
            for (f, x) in fast.iter().zip(&xs) {
                // The same integers; only the order of the f32 block terms differs.
                let slow = dot_scalar(wj, x);
                assert!((f - slow).abs() <= 1e-5 * slow.abs().max(1.0), "{f} vs {slow}");
            }
        }
    }
}

#[test]
fn the_q6k_vnni_kernel_agrees_with_the_scalar_loop() {
    if !has_vnni() {
        eprintln!("skipped: this CPU has no AVX-512 VNNI");
        return;
    }
    let k = 1024;
    let (w, _) = weights_of(Weights::Q6K, 6, k, 5);
    let xs: Vec<Q8Row> = (0..4).map(|s| Q8Row::quantize(&values(k, 20 + s))).collect();
    for wj in w.chunks_exact(k / Q4K_VALUES * Q6K_BYTES) {
        for rows in 1..=vnni::ROWS {
            let refs: Vec<&Q8Row> = xs.iter().take(rows).collect();
            let mut fast = [f32::NAN; vnni::ROWS];
            assert!(vnni::dots_q6k(wj, &refs, &mut fast));
            for (f, x) in fast.iter().zip(&refs) {
                let slow = dot_scalar_q6k(wj, x);
                assert!((f - slow).abs() <= 1e-5 * slow.abs().max(1.0), "{f} vs {slow}");
            }
        }
    }
}

#[test]
fn word_unpacking_of_scales_matches_the_formats_definition() {
    let mut packed = [0u8; 12];
    for seed in 0..200u64 {
        for (i, b) in packed.iter_mut().enumerate() {
            *b = (seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(i as u32 * 5) >> 13) as u8;
        }
        let (scales, mins) = compute_core::quant::unpack_scales_k4(&packed);
        let (s, m) = vnni::unpack_scales(packed);
        assert_eq!(s.to_le_bytes(), scales, "{packed:?}");
        assert_eq!(m.to_le_bytes(), mins, "{packed:?}");
    }
}

#[test]
fn non_finite_activations_give_nan_and_zeros_give_zero() {
    let (k, n) = (512, 4);
    let (w, _) = weights(n, k, 9);
    let mut x = vec![0.0f32; 2 * k];
    x[k + 300] = f32::INFINITY;
    let mut y = vec![1.0f32; 2 * n];
    assert!(matmul_q4k(&x, &w, (2, k, n), &mut y));
    assert!(y[..n].iter().all(|&v| v == 0.0), "{y:?}");
    assert!(y[n..].iter().all(|v| v.is_nan()), "{y:?}");
}

#[test]
fn bad_shapes_are_refused_and_nothing_is_written() {
    let (w, _) = weights(2, 256, 1);
    let x = values(512, 2);
    let mut y = vec![7.0f32; 4];
    assert!(!matmul_q4k(&x, &w, (1, 255, 2), &mut y), "depth not a multiple of 256");
    assert!(!matmul_q4k(&x, &w, (1, 256, 3), &mut y), "weight too short");
    assert!(!matmul_q4k(&x, &w, (3, 256, 2), &mut y), "activations too short");
    assert!(!matmul_q4k(&x, &w, (2, 256, 2), &mut y[..3]), "output too short");
    assert!(!matmul_q4k(&x, &w, (usize::MAX, 256, 2), &mut y), "overflowing shape");
    assert!(y.iter().all(|&v| v == 7.0));
}
