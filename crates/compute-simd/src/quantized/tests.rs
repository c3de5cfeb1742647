//! The quantized products against the f64 product of the dequantized
//! weights on every path this CPU has (the VNNI kernels, the AVX2 kernels and
//! the scalar loop), the paths against each other bit for bit, and the
//! refusals.
use super::*;
use compute_core::quant::BlockFormat;

const FORMATS: [Weights; 4] = [Weights::Q4K, Weights::Q5K, Weights::Q6K, Weights::Q8_0];

fn values(len: usize, seed: u64) -> Vec<f32> {
    compute_core::rng::random_vec(len, -1.0, 1.0, seed)
}

fn block_format(format: Weights) -> BlockFormat {
    match format {
        Weights::Q4K => BlockFormat::Q4K,
        Weights::Q5K => BlockFormat::Q5K,
        Weights::Q6K => BlockFormat::Q6K,
        Weights::Q8_0 => BlockFormat::Q8_0,
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

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("pool")
}

/// Checks `matmul_with(isa, format, …)` on `threads` threads against the f64
/// product of the dequantized weights with the original activations. The
/// tolerance is the activations' rounding (`dx/2` per value, times `|w|`)
/// plus `1e-6` relative to `Σ|w·x|` for the `f32` rounding of the per-block
/// terms.
fn check(isa: Isa, format: Weights, (m, k, n): (usize, usize, usize), threads: usize, seed: u64) {
    let (w, deq) = weights_of(format, n, k, seed);
    let x = values(m * k, seed ^ 0x5eed);
    let mut y = vec![f32::NAN; m * n];
    pool(threads).install(|| matmul_with(isa, format, &x, &w, (m, k, n), &mut y)).expect("shapes fit");
    if let Some(why) = violation(format, &x, &deq, (m, k, n), &y) {
        panic!("{isa} t={threads}: {why}");
    }
}

/// The first output of `y` outside the tolerance of [`check`] against the
/// product of `x` with the dequantized weights `deq`, described; `None` when
/// all are inside.
fn violation(format: Weights, x: &[f32], deq: &[f32], (m, k, n): (usize, usize, usize), y: &[f32]) -> Option<String> {
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
            if (got - exact).abs() > bound || got.is_nan() {
                return Some(format!("{format:?} ({m}, {k}, {n}) y[{i}][{j}] = {got}, want {exact} ± {bound}"));
            }
        }
    }
    None
}

/// The vector paths this CPU runs, each with the `Isa` that selects it.
fn vector_paths() -> Vec<(Isa, Kernel)> {
    [Isa::Avx512, Isa::Avx2]
        .into_iter()
        .filter(|isa| isa.is_supported())
        .map(|isa| (isa, kernel_for(isa)))
        .filter(|&(_, kernel)| kernel != Kernel::Scalar)
        .collect()
}

#[test]
fn products_match_the_dequantized_reference_on_every_path() {
    // Odd block counts (3, 5) leave the kernels' steps of 2 or 4 blocks a
    // tail; 9 and 17 rows leave groups of 8 a tail; 70 rows need two panels.
    let shapes = [
        (1, 256, 1),
        (1, 512, 5),
        (3, 768, 64),
        (1, 4096, 300),
        (17, 1280, 33),
        (2, 1024, 200),
        (9, 512, 70),
        (70, 768, 9),
    ];
    for isa in Isa::available() {
        for format in FORMATS {
            for (i, &shape) in shapes.iter().enumerate() {
                check(isa, format, shape, 1 + i % 2, i as u64 * 31 + 7);
            }
        }
    }
}

/// The paths on the same inputs: all compute the same integers and the same
/// `f32` operations in the same order, so every output has the same bits.
#[test]
fn the_vector_kernels_and_the_scalar_loop_give_the_same_bits() {
    let paths = vector_paths();
    if paths.is_empty() {
        eprintln!("skipped: this CPU has neither AVX-512 VNNI nor AVX2");
        return;
    }
    for (isa, kernel) in paths {
        eprintln!("{isa}: {} kernels", kernel.as_str());
        same_bits_as_scalar(isa);
    }
}

fn same_bits_as_scalar(isa: Isa) {
    for format in FORMATS {
        for (s, &(m, k, n)) in
            [(1, 256, 7), (5, 1280, 19), (16, 2048, 24), (33, 768, 5), (66, 512, 3)].iter().enumerate()
        {
            let seed = 1000 + s as u64;
            let (w, _) = weights_of(format, n, k, seed);
            let mut x = values(m * k, seed + 1);
            // Larger and sparser activations in some rows, so lanes reach their extremes.
            for (i, v) in x.iter_mut().enumerate() {
                if (i / k) % 3 == 1 {
                    *v = if i % 5 == 0 { 40.0 * v.signum() } else { 0.0 };
                }
            }
            let (mut fast, mut slow) = (vec![f32::NAN; m * n], vec![f32::NAN; m * n]);
            matmul_with(isa, format, &x, &w, (m, k, n), &mut fast).expect("fits");
            matmul_with(Isa::Portable, format, &x, &w, (m, k, n), &mut slow).expect("fits");
            for (i, (f, s)) in fast.iter().zip(&slow).enumerate() {
                assert_eq!(f.to_bits(), s.to_bits(), "{format:?} {isa} ({m}, {k}, {n}) y[{i}]: {f} vs {s}");
            }
        }
    }
}

/// Extreme blocks: every quant at its largest and smallest value with the
/// largest scales, against activations at ±127: the kernels' 16-bit lanes
/// must not saturate, and the two paths still agree bit for bit.
#[test]
fn extreme_blocks_do_not_saturate_the_kernels() {
    let k = 512;
    let n = 4;
    for format in FORMATS {
        let bytes = k / Q4K_VALUES * format.block_bytes();
        let mut w = vec![0u8; n * bytes];
        for (j, row) in w.chunks_exact_mut(bytes).enumerate() {
            // Quants: row 0 all bits set, 1 the same with small f16 scales, 2
            // all clear, 3 alternating; the largest scales in every row.
            for (i, b) in row.iter_mut().enumerate() {
                *b = match j {
                    0 | 1 => 0xff,
                    2 => 0x00,
                    _ => (if i % 2 == 0 { 0xff } else { 0x00 }) as u8,
                };
            }
            let per = format.block_bytes();
            let d = if j == 1 { 0x10 } else { 0x3c };
            for blk in row.chunks_exact_mut(per) {
                let put = |blk: &mut [u8], at: usize| {
                    blk[at] = 0x00;
                    blk[at + 1] = d;
                };
                match format {
                    Weights::Q4K | Weights::Q5K => {
                        put(blk, 0);
                        put(blk, 2);
                        blk[4..16].fill(0xff);
                    }
                    Weights::Q6K => {
                        put(blk, 208);
                        blk[192..208].fill(if j == 2 { 0x80 } else { 0x7f });
                    }
                    Weights::Q8_0 => {
                        for p in 0..8 {
                            put(blk, Q8_0_BYTES * p);
                            if j == 2 {
                                blk[Q8_0_BYTES * p + 2..Q8_0_BYTES * (p + 1)].fill(0x80);
                            }
                        }
                    }
                }
            }
        }
        let mut deq = vec![0.0f32; n * k];
        block_format(format).dequantize(&w, &mut deq).expect("dequantize");
        for sign in [1.0f32, -1.0] {
            let x: Vec<f32> = (0..2 * k).map(|i| if i < k || i % 2 == 0 { sign } else { -sign }).collect();
            let mut results = Vec::new();
            for isa in Isa::available() {
                let mut y = vec![f32::NAN; 2 * n];
                matmul_with(isa, format, &x, &w, (2, k, n), &mut y).expect("fits");
                for i in 0..2 {
                    for j in 0..n {
                        let exact: f64 = (0..k).map(|p| f64::from(x[i * k + p]) * f64::from(deq[j * k + p])).sum();
                        let scale: f64 = (0..k).map(|p| f64::from(deq[j * k + p].abs())).sum::<f64>() + 1.0;
                        let got = f64::from(y[i * n + j]);
                        assert!(
                            (got - exact).abs() <= 1e-5 * scale,
                            "{format:?} {isa} sign {sign} y[{i}][{j}] = {got}, want {exact}"
                        );
                    }
                }
                results.push(y);
            }
            for y in &results[1..] {
                assert!(y.iter().zip(&results[0]).all(|(a, b)| a.to_bits() == b.to_bits()), "{format:?}: paths differ");
            }
        }
    }
}

/// `Q8Row::quantize` against its definition: `d = max|x|/127`, `q =
/// round_ties_even(x·127/max|x|)`, sums of each 32, values at `value_offset`.
#[test]
fn activation_rows_quantize_as_defined() {
    let mut x = values(4 * Q4K_VALUES, 77);
    // Block 1: halves of the scale, so that many products sit on a tie.
    for (i, v) in x[Q4K_VALUES..2 * Q4K_VALUES].iter_mut().enumerate() {
        *v = (i as f32 - 128.0) * 0.5;
    }
    x[2 * Q4K_VALUES..3 * Q4K_VALUES].fill(0.0);
    x[3 * Q4K_VALUES + 17] = f32::NAN;
    let row = Q8Row::quantize(&x);
    assert_eq!(row.blocks(), 4);
    for (b, block) in x.chunks_exact(Q4K_VALUES).enumerate() {
        let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let (d, inv) = if block.iter().any(|v| !v.is_finite()) {
            (f32::NAN, 0.0)
        } else if amax == 0.0 {
            (0.0, 0.0)
        } else {
            (amax / 127.0, 127.0 / amax)
        };
        assert_eq!(row.scales()[b].to_bits(), d.to_bits(), "block {b}");
        for (i, &v) in block.iter().enumerate() {
            let want = (v * inv).round_ties_even().clamp(-127.0, 127.0) as i8;
            assert_eq!(row.values()[b * Q4K_VALUES + value_offset(i)], want, "block {b} value {i} ({v})");
        }
        for s in 0..8 {
            let want: i32 = (0..32).map(|i| i32::from(row.values()[b * Q4K_VALUES + value_offset(32 * s + i)])).sum();
            assert_eq!(row.sums[8 * b + s], want, "block {b} sum {s}");
        }
    }
}

#[test]
fn value_offsets_are_a_permutation_of_a_block() {
    let mut seen = [false; Q4K_VALUES];
    for i in 0..Q4K_VALUES {
        let o = value_offset(i);
        assert!(!seen[o], "offset {o} twice");
        seen[o] = true;
        // Chunk `i % 32 / 8`, lane pair of sub-block `i / 32`.
        assert_eq!((o / 64, o % 64 / 8), (i % 32 / 8, i / 32), "value {i}");
    }
}

#[test]
#[cfg(target_arch = "x86_64")]
fn vector_unpacking_of_scales_matches_the_formats_definition() {
    let (mut a, mut b) = ([0u8; 20], [0u8; 20]);
    type Unpack = fn(&[u8; 20], &[u8; 20]) -> Option<([u8; 16], [u8; 16])>;
    // The unpacking both vector kernels share (`stream::scales_pair`).
    let unpackers: [(&str, Unpack); 1] = [("avx2", super::stream::scales_pair_of)];
    for (name, unpack) in unpackers {
        for seed in 0..200u64 {
            for (i, v) in a.iter_mut().chain(b.iter_mut()).enumerate() {
                *v = (seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(i as u32 * 5) >> 13) as u8;
            }
            let Some((sc, mn)) = unpack(&a, &b) else {
                eprintln!("skipped: this CPU lacks the {name} kernels' instructions");
                break;
            };
            for (blk, half) in [(&a, 0), (&b, 8)] {
                let packed: [u8; 12] = blk[4..16].try_into().expect("12 bytes");
                let (scales, mins) = compute_core::quant::unpack_scales_k4(&packed);
                assert_eq!(sc[half..half + 8], scales, "{name} {packed:?}");
                assert_eq!(mn[half..half + 8], mins, "{name} {packed:?}");
            }
        }
    }
}

/// The checks above catch a kernel that pairs the weights of a group of 32
/// with the wrong activations: the product of each path with every group of
/// 32 activations reversed (what a kernel reading each group of weights in
/// reverse order computes) fails the reference check and differs from the
/// scalar loop's bits.
#[test]
fn a_kernel_reading_each_group_of_weights_reversed_is_caught() {
    let (m, k, n) = (3, 768, 9);
    let mut paths: Vec<Isa> = vector_paths().into_iter().map(|(isa, _)| isa).collect();
    paths.push(Isa::Portable);
    for format in FORMATS {
        let (w, deq) = weights_of(format, n, k, 41);
        let x = values(m * k, 42);
        let mut reversed = x.clone();
        reversed.chunks_mut(32).for_each(<[f32]>::reverse);
        let mut right = vec![f32::NAN; m * n];
        matmul_with(Isa::Portable, format, &x, &w, (m, k, n), &mut right).expect("fits");
        assert!(violation(format, &x, &deq, (m, k, n), &right).is_none(), "{format:?}");
        for &isa in &paths {
            let mut wrong = vec![f32::NAN; m * n];
            matmul_with(isa, format, &reversed, &w, (m, k, n), &mut wrong).expect("fits");
            assert!(violation(format, &x, &deq, (m, k, n), &wrong).is_some(), "{format:?} {isa}: not caught");
            assert!(wrong.iter().zip(&right).any(|(a, b)| a.to_bits() != b.to_bits()), "{format:?} {isa}");
        }
    }
}

/// `Isa::Avx2` selects the AVX2 kernels and `Isa::Avx512` the VNNI ones
/// where the CPU has them; `Isa::Portable` always the scalar loop.
#[test]
fn each_isa_selects_its_kernels() {
    assert_eq!(kernel_for(Isa::Portable), Kernel::Scalar);
    assert_eq!(kernel_for(Isa::Neon), Kernel::Scalar);
    let avx2 = if has_avx2_kernels() { Kernel::Avx2 } else { Kernel::Scalar };
    assert_eq!(kernel_for(Isa::Avx2), avx2);
    assert_eq!(kernel_for(Isa::Avx512), if has_vnni() { Kernel::Vnni } else { avx2 });
    eprintln!("kernels: avx512 → {}, avx2 → {}", kernel_for(Isa::Avx512).as_str(), kernel_for(Isa::Avx2).as_str());
}

#[test]
fn non_finite_activations_give_nan_and_zeros_give_zero() {
    let (k, n) = (512, 4);
    for isa in Isa::available() {
        for format in FORMATS {
            let (w, _) = weights_of(format, n, k, 9);
            let mut x = vec![0.0f32; 2 * k];
            x[k + 300] = f32::INFINITY;
            let mut y = vec![1.0f32; 2 * n];
            matmul_with(isa, format, &x, &w, (2, k, n), &mut y).expect("fits");
            assert!(y[..n].iter().all(|&v| v == 0.0), "{format:?} {isa}: {y:?}");
            assert!(y[n..].iter().all(|v| v.is_nan()), "{format:?} {isa}: {y:?}");
        }
    }
}

#[test]
fn bad_shapes_are_refused_and_nothing_is_written() {
    let (w, _) = weights(2, 256, 1);
    let x = values(512, 2);
    let mut y = [7.0f32; 4];
    let cases: [((usize, usize, usize), usize, &str); 6] = [
        ((1, 255, 2), 4, "not a positive multiple of 256"),
        ((1, 0, 2), 4, "not a positive multiple of 256"),
        ((1, 256, 3), 4, "w holds 288"),
        ((3, 256, 2), 4, "x holds 512"),
        ((2, 256, 2), 3, "y holds 3"),
        ((usize::MAX, 256, 2), 4, "overflow"),
    ];
    for (shape, y_len, why) in cases {
        let err = matmul_q4k(&x, &w, shape, &mut y[..y_len]).expect_err(why);
        let text = err.to_string();
        assert!(matches!(err, ComputeError::Shape { op: "quantized matmul", .. }), "{text}");
        assert!(text.contains(why) && text.contains("q4_k"), "{why}: {text}");
    }
    assert!(y.iter().all(|&v| v == 7.0));
}

/// Each vector kernel takes the calls `matmul_with` gives it (it does not
/// decline and leave them to the scalar loop, which would hide it from the
/// tests above) and writes the scalar loop's bits, for odd weight row counts
/// and block counts.
#[test]
fn the_vector_kernels_take_their_calls_and_match_the_scalar_loop() {
    type Run = fn(Weights, &[u8], usize, &Panel<'_>, &mut [f32], &mut [f32]) -> bool;
    let kernels: [(&str, bool, Run); 2] = [("vnni", has_vnni(), vnni::run), ("avx2", has_avx2_kernels(), avx2::run)];
    for format in FORMATS {
        for &(m, blocks, jn) in &[(1, 1, 1), (3, 3, 7), (17, 2, 8), (32, 5, 5)] {
            let k = blocks * Q4K_VALUES;
            let (w, _) = weights_of(format, jn, k, 5 + m as u64);
            let x = values(m * k, 6 + jn as u64);
            let rows: Vec<Q8Row> = x.chunks_exact(k).map(Q8Row::quantize).collect();
            let refs: Vec<&Q8Row> = rows.iter().collect();
            let scalar_panel = Panel::new(format, &refs, blocks, true);
            let mut scratch = vec![0.0f32; scalar_panel.scratch(WEIGHT_ROWS)];
            let mut want = vec![f32::NAN; jn * m];
            scalar::run(format, &w, jn, &scalar_panel, &mut scratch, &mut want);
            let panel = Panel::new(format, &refs, blocks, false);
            for &(name, present, run) in &kernels {
                let mut got = vec![f32::NAN; jn * m];
                assert_eq!(run(format, &w, jn, &panel, &mut scratch, &mut got), present, "{name} {format:?}");
                if present {
                    for (i, (g, s)) in got.iter().zip(&want).enumerate() {
                        assert_eq!(g.to_bits(), s.to_bits(), "{name} {format:?} m={m} blocks={blocks} jn={jn} [{i}]");
                    }
                }
            }
        }
    }
}
