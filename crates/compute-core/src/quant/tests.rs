use half::{bf16, f16};

use super::*;
use crate::rng::Rng;

/// Roughly normal values (Irwin–Hall of 4), times `scale`.
fn normal_row(rng: &mut Rng, len: usize, scale: f32) -> Vec<f32> {
    (0..len).map(|_| ((0..4).map(|_| rng.uniform(0.0, 1.0)).sum::<f32>() - 2.0) * scale).collect()
}

fn round_trip(format: BlockFormat, x: &[f32]) -> Vec<f32> {
    let mut blocks = vec![0u8; format.row_bytes(x.len()).expect("whole blocks")];
    format.quantize(x, &mut blocks).expect("quantize");
    let mut y = vec![0f32; x.len()];
    format.dequantize(&blocks, &mut y).expect("dequantize");
    y
}

#[test]
fn block_sizes_are_ggmls() {
    let sizes: Vec<_> =
        BlockFormat::ALL.iter().map(|f| (f.name(), f.values_per_block(), f.bytes_per_block())).collect();
    assert_eq!(
        sizes,
        [("q4_K", 256, 144), ("q5_K", 256, 176), ("q6_K", 256, 210), ("q8_0", 32, 34), ("q8_K", 256, 292)]
    );
    assert_eq!(BlockFormat::Q4K.row_bytes(4096), Ok(16 * 144));
    assert_eq!(BlockFormat::Q8_0.blocks(96), Ok(3));
    assert!(BlockFormat::Q6K.blocks(100).is_err());
}

#[test]
fn round_trip_error_is_within_each_formats_bound() {
    // Bounds on the RMS error relative to the RMS of the row for the k-quants
    // (their searches trade max error for RMS error; measured 0.068, 0.035 and
    // 0.017 at scale 1, Q6_K 0.022 at 1e-3 where d is subnormal in f16), and on
    // each value's error for the 8-bit formats.
    let rms_bound = [(BlockFormat::Q4K, 0.08), (BlockFormat::Q5K, 0.04), (BlockFormat::Q6K, 0.026)];
    let mut rng = Rng::new(11);
    for scale in [1e-3f32, 1.0, 1e3] {
        let x = normal_row(&mut rng, 4096, scale);
        let rms = |v: &mut dyn Iterator<Item = f32>| {
            let (s, n) = v.fold((0f64, 0usize), |(s, n), e| (s + f64::from(e) * f64::from(e), n + 1));
            (s / n as f64).sqrt()
        };
        let x_rms = rms(&mut x.iter().copied());
        for (format, bound) in rms_bound {
            let y = round_trip(format, &x);
            let err = rms(&mut x.iter().zip(&y).map(|(a, b)| a - b));
            assert!(err <= bound * x_rms, "{format} at scale {scale}: RMS error {err:e} > {bound} * {x_rms:e}");
        }
        for format in [BlockFormat::Q8_0, BlockFormat::Q8K] {
            let y = round_trip(format, &x);
            let n = format.values_per_block();
            for (xb, yb) in x.chunks_exact(n).zip(y.chunks_exact(n)) {
                let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                // Half a step of d = amax/127, plus for Q8_0 the f16 rounding
                // of d (half an f16 ulp: 2⁻¹¹ relative, or 2⁻²⁵ where d is
                // subnormal in f16) on up to 127 steps.
                let d = amax / 127.0;
                let d_rounding = if format == BlockFormat::Q8_0 { (d / 2048.0).max(2f32.powi(-25)) } else { 0.0 };
                let bound = (0.5 * d + 127.0 * d_rounding) * 1.001;
                for (a, b) in xb.iter().zip(yb) {
                    assert!((a - b).abs() <= bound, "{format} at scale {scale}: |{a} - {b}| > {bound}");
                }
            }
        }
    }
}

#[test]
fn zero_and_constant_rows_give_no_nan() {
    for format in BlockFormat::ALL {
        let zero = round_trip(format, &[0.0; 512]);
        assert!(zero.iter().all(|v| *v == 0.0), "{format}: a zero row dequantizes to zeros");
        for c in [1e-30f32, -1e-12, 1e-6, 0.7, -3.25, 100.0, -1e4] {
            let y = round_trip(format, &[c; 512]);
            assert!(y.iter().all(|v| v.is_finite()), "{format}: constant {c} gave {:?}", &y[..4]);
            // Within f16's normal range the constant comes back close.
            if c.abs() >= 1e-3 {
                assert!(y.iter().all(|v| (v - c).abs() <= c.abs() * 0.07), "{format}: constant {c} gave {}", y[0]);
            }
        }
    }
}

#[test]
fn non_finite_inputs_do_not_panic() {
    for format in BlockFormat::ALL {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::MAX, f32::MIN_POSITIVE / 4.0] {
            let mut x = normal_row(&mut Rng::new(3), 256, 1.0);
            x[7] = bad;
            let _ = round_trip(format, &x);
            let _ = round_trip(format, &[bad; 256]);
        }
    }
}

#[test]
fn bad_lengths_are_shape_errors_and_write_nothing() {
    for format in BlockFormat::ALL {
        let (n, b) = (format.values_per_block(), format.bytes_per_block());
        let x = vec![1.0f32; 2 * n];
        for (src_len, dst_len) in [(2 * n - 1, 2 * b), (2 * n, 2 * b - 1), (2 * n, 2 * b + 1), (n, 2 * b)] {
            let mut dst = vec![0xAAu8; dst_len];
            let err = format.quantize(&x[..src_len], &mut dst);
            assert!(
                matches!(err, Err(ComputeError::Shape { op: "quantize", .. })),
                "{format} {src_len}/{dst_len}: {err:?}"
            );
            assert!(dst.iter().all(|&v| v == 0xAA), "{format}: a failed quantize wrote nothing");
        }

        let blocks = vec![0u8; 2 * b];
        let mut y = vec![7.0f32; 2 * n];
        for (src_len, dst_len) in [(2 * b - 1, 2 * n), (2 * b, 2 * n - 1), (b, 2 * n)] {
            let err = format.dequantize(&blocks[..src_len], &mut y[..dst_len]);
            assert!(matches!(err, Err(ComputeError::Shape { op: "dequantize", .. })), "{format}: {err:?}");
            let mut h = vec![f16::ZERO; dst_len];
            assert!(format.dequantize_f16(&blocks[..src_len], &mut h).is_err());
            let mut h = vec![bf16::ZERO; dst_len];
            assert!(format.dequantize_bf16(&blocks[..src_len], &mut h).is_err());
        }
        assert!(y.iter().all(|&v| v == 7.0), "{format}: a failed dequantize wrote nothing");

        // Empty rows are zero blocks, not errors.
        assert_eq!(format.quantize(&[], &mut []), Ok(()));
        assert_eq!(format.dequantize(&[], &mut []), Ok(()));
    }
}

#[test]
fn half_outputs_round_the_f32_once() {
    let x = normal_row(&mut Rng::new(5), 1024, 3.0);
    for format in BlockFormat::ALL {
        let mut blocks = vec![0u8; format.row_bytes(x.len()).expect("whole blocks")];
        format.quantize(&x, &mut blocks).expect("quantize");
        let mut y = vec![0f32; x.len()];
        format.dequantize(&blocks, &mut y).expect("dequantize");
        let mut h = vec![f16::ZERO; x.len()];
        format.dequantize_f16(&blocks, &mut h).expect("f16");
        let mut b = vec![bf16::ZERO; x.len()];
        format.dequantize_bf16(&blocks, &mut b).expect("bf16");
        for i in 0..x.len() {
            assert_eq!(h[i].to_bits(), f16::from_f32(y[i]).to_bits(), "{format} f16 at {i}");
            assert_eq!(b[i].to_bits(), bf16::from_f32(y[i]).to_bits(), "{format} bf16 at {i}");
        }
    }
}

#[test]
fn blocks_read_back_field_for_field() {
    let x = normal_row(&mut Rng::new(9), 256, 1.0);
    let x: &[f32; 256] = x.as_chunks::<256>().0.first().expect("one block");
    let b = q4_k::quantize_block(x);
    assert_eq!(q4_k::BlockQ4K::from_bytes(&b.to_bytes()), b);
    let b = q5_k::quantize_block(x);
    assert_eq!(q5_k::BlockQ5K::from_bytes(&b.to_bytes()), b);
    let b = q6_k::quantize_block(x);
    assert_eq!(q6_k::BlockQ6K::from_bytes(&b.to_bytes()), b);
    let bytes = b.to_bytes();
    assert_eq!(&bytes[208..], &b.d.to_le_bytes(), "Q6_K keeps d last");
    let b = q8_k::quantize_block(x);
    assert_eq!(q8_k::BlockQ8K::from_bytes(&b.to_bytes()), b);
    for (j, s) in b.bsums.iter().enumerate() {
        assert_eq!(i32::from(*s), b.qs[16 * j..16 * j + 16].iter().map(|&q| i32::from(q)).sum::<i32>());
    }
    let x8: &[f32; 32] = x.as_chunks::<32>().0.first().expect("one block");
    let b = q8_0::quantize_block(x8);
    assert_eq!(q8_0::BlockQ8_0::from_bytes(&b.to_bytes()), b);
}

#[test]
fn k4_scales_pack_and_unpack_every_6_bit_value() {
    for v in 0..64u8 {
        let scales: [u8; 8] = std::array::from_fn(|j| (v ^ (j as u8 * 9)) & 63);
        let mins: [u8; 8] = std::array::from_fn(|j| (v + 17 * j as u8) & 63);
        assert_eq!(unpack_scales_k4(&pack_scales_k4(&scales, &mins)), (scales, mins));
    }
}

#[test]
fn nearest_int_rounds_half_to_even() {
    let cases = [
        (0.5, 0),
        (1.5, 2),
        (2.5, 2),
        (-0.5, 0),
        (-1.5, -2),
        (-2.5, -2),
        (0.49999997, 0),
        (7.0, 7),
        (-4194303.0, -4194303),
    ];
    for (x, want) in cases {
        assert_eq!(nearest_int(x), want, "nearest_int({x})");
    }
}
