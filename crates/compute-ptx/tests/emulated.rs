//! Every kernel of the set, run by the PTX emulator on the CPU through the
//! CUDA backend's own launch plans: the conformance suite at small sizes, plus
//! each GEMM tier forced. No GPU needed; what the GPU machine adds is the
//! hardware's own `ex2`/`lg2` and timing.

mod common;

use common::EmuBackend;
use compute_core::conformance::{Config, compare, rng::Rng};
use compute_core::{BackendKind, MatmulSpec, Op};
use compute_ptx::kernels::gemm_simt::{SimtConfig, sweep_configs};
use compute_ptx::plan::GemmTier;

mod suite {
    use super::*;
    compute_core::conformance_tests!(|| Ok(EmuBackend::new()), BackendKind::Cuda, Config::from_env());
}

/// `ex2.approx.f32` is within 2 ulp, `lg2.approx.f32` within about 2⁻²²
/// absolute and `rcp.approx.f32` within 1 ulp: the transcendental kernels must
/// meet the tolerance at both ends.
#[test]
fn transcendentals_tolerate_the_approximation_error_bounds() {
    use compute_core::conformance::{Group, run_group};
    let ulp = f64::from(f32::EPSILON);
    for (ex2, lg2, rcp) in [(1.0 + 2.0 * ulp, 2.5e-7, 1.0 - ulp), (1.0 - 2.0 * ulp, -2.5e-7, 1.0 + ulp)] {
        for g in [Group::Unary, Group::Rows, Group::EdgeValues] {
            run_group(|| Ok(EmuBackend::with_approx_error(ex2, lg2, rcp)), BackendKind::Cuda, g, Config::from_env());
        }
    }
}

fn check_tier(tier: GemmTier, shapes: &[(usize, usize, usize, usize)]) {
    let emu = EmuBackend::new();
    let mut rng = Rng::new(0x5eed_0001);
    for &(batch, m, k, n) in shapes {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let spec = MatmulSpec { batch, trans_a: ta, trans_b: tb, ..MatmulSpec::new(m, k, n) };
            let a = rng.vec(batch * m * k, -1.0, 1.0);
            let b = rng.vec(batch * k * n, -1.0, 1.0);
            let out = emu.matmul_tier(tier, spec, &a, &b);
            if let Some(msg) = compare(&Op::Matmul(spec), &[&a, &b], &out, 1.0) {
                panic!("{tier:?} {spec:?}: {msg}");
            }
        }
    }
}

#[test]
fn naive_tier_on_odd_shapes() {
    check_tier(GemmTier::Naive, &[(1, 1, 1, 1), (2, 5, 7, 3), (1, 17, 33, 19)]);
}

#[test]
fn tiled_tier_on_odd_shapes() {
    check_tier(GemmTier::Tiled, &[(1, 1, 1, 1), (2, 5, 7, 3), (1, 17, 33, 19), (1, 40, 20, 33)]);
}

#[test]
fn simt_tier_on_edges_and_multiples() {
    let shapes = [(1, 1, 1, 1), (1, 3, 5, 7), (1, 130, 9, 70), (2, 64, 16, 128), (1, 129, 12, 131)];
    check_tier(GemmTier::Simt(SimtConfig::default()), &shapes);
}

#[test]
fn simt_tuning_shapes_build_and_agree() {
    let d = SimtConfig::register_staged();
    for cfg in [
        SimtConfig { async_copy: false, warp_tiled: false, ..d },
        SimtConfig { bk: 16, ..d },
        SimtConfig { bm: 64, bn: 64, bk: 16, tm: 4, tn: 4, warp_tiled: false, ..d },
        SimtConfig { bn: 256, tn: 16, ..d },
        SimtConfig { bk: 16, min_blocks: 1, async_copy: false, ..d },
        SimtConfig { group_m: 0, warp_tiled: false, ..d },
    ] {
        check_tier(GemmTier::Simt(cfg), &[(1, 70, 21, 90), (1, 128, 32, 256)]);
    }
}

/// Every shape the benchmark sweeps, on edges and on k shorter and longer than
/// the pipeline (the emulator lands `cp.async` data only at the wait that
/// retires it and poisons the destination at issue, so a stage read too early
/// or overwritten too soon shows as NaNs).
#[test]
fn simt_sweep_shapes_agree() {
    for cfg in sweep_configs() {
        check_tier(GemmTier::Simt(cfg), &[(1, 70, 21, 90), (1, 33, 1, 65), (2, 129, 40, 131)]);
    }
}

/// The plans run `f32` only: every op with a half operand is declined and
/// refused with `UnsupportedDType` before anything is launched; half tensors
/// are stored as their bytes; an `f32` to `f32` cast is a copy that keeps every bit.
#[test]
fn half_data_is_stored_but_not_computed_and_f32_casts_copy() {
    use compute_core::{Backend, ComputeError, DType, HostVec, Ops, UnaryOp, bf16};
    let emu = EmuBackend::new();
    let mut rng = Rng::new(0x5eed_0002);
    for dtype in [DType::F16, DType::BF16] {
        let data = HostVec::from_f32(dtype, &rng.vec(7, -3.0, 3.0));
        let t = emu.upload_typed(data.as_slice()).unwrap();
        assert_eq!((t.len(), t.dtype()), (7, dtype));
        let mut back = HostVec::zeros(dtype, 7);
        emu.download_typed(&t, back.as_mut()).unwrap();
        assert_eq!(back.bits(), data.bits());
        let op = Op::unary(UnaryOp::Relu, 7).with_dtype(dtype);
        assert!(!emu.supports(&op));
        let out = emu.alloc_typed(7, dtype).unwrap();
        let launches = emu.log.lock().unwrap().len();
        match emu.run_tensors(&op, &[&t], &out) {
            Err(ComputeError::UnsupportedDType { dtype: d, .. }) => assert_eq!(d, dtype),
            other => panic!("{dtype} relu: {other:?}"),
        }
        assert_eq!(emu.log.lock().unwrap().len(), launches, "nothing launched");
    }
    let x: Vec<bf16> = rng.vec(9, -1.0, 1.0).into_iter().map(bf16::from_f32).collect();
    let mut out = vec![0.0f32; 9];
    assert!(matches!(emu.cast(&x, &mut out), Err(ComputeError::UnsupportedDType { dtype: DType::BF16, .. })));
    assert!(out.iter().all(|&v| v == 0.0));
    let mut v = rng.vec(1031, -1e30, 1e30);
    v[..4].copy_from_slice(&[f32::from_bits(0x7fc0_1234), 1e-45, -0.0, f32::NEG_INFINITY]);
    let mut copied = vec![f32::NAN; v.len()];
    emu.cast(&v, &mut copied).unwrap();
    assert!(copied.iter().zip(&v).all(|(a, b)| a.to_bits() == b.to_bits()));
}
