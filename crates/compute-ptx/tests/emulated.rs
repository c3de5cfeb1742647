//! Every kernel of the set, run by the PTX emulator on the CPU through the
//! CUDA backend's own launch plans: the conformance suite at small sizes, plus
//! each GEMM tier forced. No GPU needed; what the GPU machine adds is the
//! hardware's own `ex2`/`lg2` and timing.

mod common;

use common::EmuBackend;
use compute_core::conformance::{Config, compare, rng::Rng};
use compute_core::{BackendKind, MatmulSpec, Op};
use compute_ptx::kernels::gemm_simt::{SimtConfig, sweep_configs};
use compute_ptx::plan::{GemmTier, Splits};

mod suite {
    use super::*;
    compute_core::conformance_tests!(
        || Ok(EmuBackend::new()),
        BackendKind::Cuda,
        Config::from_env().with_dtypes(&compute_core::DType::ALL)
    );
}

/// `ex2.approx.f32` is within 2 ulp, `lg2.approx.f32` within about 2⁻²²
/// absolute, `rcp.approx.f32` within 1 ulp and `sin`/`cos.approx.f32` within
/// 2⁻²⁰·⁹ absolute on `[−π, π]`: the transcendental kernels (rotary embeddings
/// and swiglu included) must meet the tolerance at both ends.
#[test]
fn transcendentals_tolerate_the_approximation_error_bounds() {
    use compute_core::conformance::{Group, run_group};
    let ulp = f64::from(f32::EPSILON);
    for (ex2, lg2, rcp) in [(1.0 + 2.0 * ulp, 2.5e-7, 1.0 - ulp), (1.0 - 2.0 * ulp, -2.5e-7, 1.0 + ulp)] {
        for g in [Group::Unary, Group::Binary, Group::Rows, Group::Decoder, Group::EdgeValues] {
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

/// The shapes the plans give products of 9 to 128 rows (with `k` of 512 or
/// more the split shape for their rows; with less `thin`, or `thin_wide` for
/// 33 to 64 rows against a wide weight): on edges, on multiples of their
/// tiles, and with `k` shorter and longer than their pipelines; and the plans
/// pick each where it belongs.
#[test]
fn simt_thin_shape_agrees_and_is_picked_for_thin_products() {
    let thin = SimtConfig::thin();
    assert!(thin.check().is_ok(), "{:?}", thin.check());
    check_tier(GemmTier::Simt(thin), &[(1, 9, 33, 65), (1, 64, 96, 128), (2, 40, 20, 70), (1, 128, 130, 64)]);
    // With k of 512 or more, 9 to 128 rows split k over the grid, in the
    // shape for their rows (each checked on edges; 1000 columns fill the
    // emulator's two multiprocessors: not split).
    assert_eq!(GemmTier::choose(&MatmulSpec::new(8, 4096, 4096), false), GemmTier::Gemv);
    for (rows, m) in [(9..=16, 9), (17..=32, 32), (33..=64, 33), (65..=128, 100)] {
        let (cfg, fill) = SimtConfig::split_shape(m);
        assert!(cfg.check().is_ok(), "{:?}", cfg.check());
        let split = GemmTier::SimtSplit(cfg, Splits::Fill(fill));
        for r in [*rows.start(), *rows.end()] {
            assert_eq!(GemmTier::choose(&MatmulSpec::new(r, 4096, 4096), false), split, "m = {r}");
        }
        check_tier(split, &[(1, m, 512, 129), (1, m, 600, 256), (2, m, 1000, 70), (1, m, 512, 1000)]);
    }
    assert_eq!(SimtConfig::split_shape(64).0, SimtConfig::thin_split());
    // With less k, against a wide weight, 33 to 64 rows take the wide shape.
    let wide = SimtConfig::thin_wide();
    assert!(wide.check().is_ok(), "{:?}", wide.check());
    check_tier(GemmTier::Simt(wide), &[(1, 33, 33, 129), (1, 64, 160, 256), (2, 40, 20, 70)]);
    for (m, want) in [(9, thin), (32, thin), (33, wide), (64, wide), (65, thin), (128, thin)] {
        assert_eq!(GemmTier::choose(&MatmulSpec::new(m, 511, 14336), false), GemmTier::Simt(want), "m = {m}");
    }
    assert_eq!(GemmTier::choose(&MatmulSpec::new(512, 4096, 4096), false), GemmTier::Simt(SimtConfig::default()));
}

/// `k` split over the grid (`GemmTier::SimtSplit`): slices that end inside
/// a k-tile, a last slice shorter than the others, more slices asked for
/// than `k` has k-tiles, one slice (no split), and batches (one after
/// another), every transpose.
#[test]
fn simt_split_k_agrees_on_ragged_slices() {
    let wide = SimtConfig::thin_wide();
    let tile64 = SimtConfig { bm: 64, bn: 128, bk: 16, tm: 8, tn: 8, stages: 3, ..SimtConfig::thin() };
    for (cfg, splits) in [(wide, 2), (wide, 3), (tile64, 4), (tile64, 1), (wide, 64)] {
        let tier = GemmTier::SimtSplit(cfg, Splits::Fixed(splits));
        check_tier(tier, &[(1, 40, 100, 70), (1, 64, 257, 130), (2, 33, 96, 129)]);
    }
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

/// Runs half matmuls of `shapes` (batch, m, k, n) with every transpose and
/// output dtype through the plans, and checks which kernel ran.
fn check_mma(shapes: &[(usize, usize, usize, usize)], input: compute_core::DType) {
    use compute_core::DType;
    use compute_core::conformance::{check_op_typed, typed_inputs_for};
    let emu = EmuBackend::new();
    let mut rng = Rng::new(0x5eed_0003);
    for &(batch, m, k, n) in shapes {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            for out in [DType::F32, input] {
                let spec =
                    MatmulSpec { batch, trans_a: ta, trans_b: tb, ..MatmulSpec::new(m, k, n) }.with_dtypes(input, out);
                let op = Op::Matmul(spec);
                assert!(compute_ptx::plan::mma_fits(&spec), "{spec:?}");
                let inputs = typed_inputs_for(&op, &mut rng);
                let before = emu.log.lock().unwrap().len();
                if let Err(e) = check_op_typed(&emu, &op, &inputs, 1.0) {
                    panic!("{spec:?}: {e}");
                }
                let log = emu.log.lock().unwrap();
                let names: Vec<&str> = log[before..].iter().map(|(k, _)| k.as_str()).collect();
                let want =
                    format!("gemm_mma_{input}_{out}_{}{}", if ta { 't' } else { 'n' }, if tb { 't' } else { 'n' });
                assert_eq!(names, [want.as_str()], "{spec:?}");
            }
        }
    }
}

/// The tensor-core kernel on shapes smaller and larger than its tiles, ragged
/// `m`, `n` and `k` (multiples of 8 where an operand is contiguous along
/// them), batches, and `k` shorter and longer than the pipeline (the
/// emulator poisons a `cp.async` destination at issue and lands the data at
/// the wait that retires it: a stage read early or refilled too soon shows).
#[test]
fn mma_tier_on_edges_and_batches() {
    use compute_core::DType;
    check_mma(&[(1, 24, 8, 8), (2, 24, 40, 16), (1, 136, 168, 72)], DType::BF16);
    check_mma(&[(1, 24, 16, 8), (1, 72, 24, 200)], DType::F16);
}

/// Every shape of the tensor-core sweep agrees on a product spanning two
/// block tiles each way and several k-tiles.
#[test]
fn mma_sweep_shapes_agree() {
    use compute_core::DType;
    use compute_core::conformance::{check_op_typed, typed_inputs_for};
    use compute_ptx::kernels::gemm_mma::{self, MmaConfig};
    let emu = EmuBackend::new();
    let mut rng = Rng::new(0x5eed_0004);
    for cfg in std::iter::once(MmaConfig::default()).chain(gemm_mma::sweep_configs()) {
        for (ta, tb) in [(false, true), (true, false)] {
            let (m, k, n) = (cfg.bm as usize + 8, 3 * cfg.bk as usize + 8, cfg.bn as usize + 24);
            let spec = MatmulSpec { trans_a: ta, trans_b: tb, ..MatmulSpec::new(m, k, n) }
                .with_dtypes(DType::BF16, DType::F32);
            let op = Op::Matmul(spec);
            let inputs = typed_inputs_for(&op, &mut rng);
            let out = emu.matmul_tier_typed(GemmTier::Mma(cfg), spec, &inputs);
            let views: Vec<_> = inputs.iter().map(|v| v.as_slice()).collect();
            if let Some(msg) = compute_core::conformance::compare_typed(&op, &views, out.as_slice(), 1.0) {
                panic!("{cfg:?} {spec:?}: {msg}");
            }
            let _ = check_op_typed;
        }
    }
}

/// The `wgmma` kernel (on an emulated compute capability 9.0 device) for
/// every transpose, every shape of its sweep, both input dtypes, every output
/// dtype, ragged edges and batches.
#[test]
fn wgmma_tier_on_edges_batches_and_sweep_shapes() {
    use compute_core::DType;
    use compute_core::conformance::{check_op_typed, compare_typed, typed_inputs_for};
    use compute_ptx::kernels::gemm_wgmma::{self, WgmmaConfig};
    let emu = EmuBackend::with_wgmma();
    let mut rng = Rng::new(0x5eed_0005);
    for (batch, m, k, n, input, out) in [
        (1, 24, 8, 8, DType::BF16, DType::F32),
        (2, 72, 200, 40, DType::BF16, DType::BF16),
        (1, 136, 72, 264, DType::F16, DType::F16),
        (1, 64, 64, 64, DType::F16, DType::BF16),
    ] {
        for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
            let spec =
                MatmulSpec { batch, trans_a: ta, trans_b: tb, ..MatmulSpec::new(m, k, n) }.with_dtypes(input, out);
            let op = Op::Matmul(spec);
            let inputs = typed_inputs_for(&op, &mut rng);
            let before = emu.log.lock().unwrap().len();
            if let Err(e) = check_op_typed(&emu, &op, &inputs, 1.0) {
                panic!("{spec:?}: {e}");
            }
            let names: Vec<String> = emu.log.lock().unwrap()[before..].iter().map(|(k, _)| k.clone()).collect();
            let t = format!("{}{}", if ta { 't' } else { 'n' }, if tb { 't' } else { 'n' });
            // The tile shape depends on the output's size (`WgmmaConfig::for_shape`).
            assert!(names.len() == 1 && names[0].starts_with(&format!("gemm_wgmma_{input}_{out}_{t}")), "{names:?}");
        }
    }
    for (cfg, (ta, tb)) in
        gemm_wgmma::sweep_configs().into_iter().zip([(false, true), (true, false), (false, false)].into_iter().cycle())
    {
        let (m, k, n) = (cfg.bm() as usize + 8, 4 * 64 + 8, cfg.bn as usize + 24);
        let spec =
            MatmulSpec { trans_a: ta, trans_b: tb, ..MatmulSpec::new(m, k, n) }.with_dtypes(DType::BF16, DType::F32);
        let op = Op::Matmul(spec);
        let inputs = typed_inputs_for(&op, &mut rng);
        let out = emu.matmul_tier_typed(GemmTier::Wgmma(cfg), spec, &inputs);
        let views: Vec<_> = inputs.iter().map(|v| v.as_slice()).collect();
        if let Some(msg) = compare_typed(&op, &views, out.as_slice(), 1.0) {
            panic!("{cfg:?} {spec:?}: {msg}");
        }
    }
    let _ = WgmmaConfig::default();
}

/// The matmul groups' half and TF32 products on an emulated compute
/// capability 9.0 device, where they run the `wgmma` kernels (full-precision
/// `f32` products run the SIMT kernels there as on every device: the suite
/// above covers them).
#[test]
fn matmul_groups_with_wgmma() {
    use compute_core::conformance::{Group, Scale, cases, check_op_typed, dtype_variants, typed_inputs_for};
    use compute_core::{DType, Precision};
    let emu = EmuBackend::with_wgmma();
    let mut rng = Rng::new(0x5eed_0090);
    let mut checked = 0;
    for g in [Group::Matmul, Group::BatchedMatmul, Group::MatmulEpilogue] {
        for op in cases(g, Scale::Small).iter().flat_map(dtype_variants) {
            let Op::Matmul(s) = op else { continue };
            if s.dtype == DType::F32 && s.precision != Precision::Tf32 {
                continue;
            }
            let inputs = typed_inputs_for(&op, &mut rng);
            if let Err(msg) = check_op_typed(&emu, &op, &inputs, 1.0) {
                panic!("{g:?}: {msg}");
            }
            checked += 1;
        }
    }
    assert!(checked > 100, "{checked} products");
}

/// The `wgmma` kernel reading `f32` as TF32 (`A·Bᵀ`, each tile shape forced),
/// on edges, batches and every shape of the sweep, within the TF32 tolerance;
/// other layouts and full precision are refused.
#[test]
fn wgmma_tf32_tier() {
    use compute_core::conformance::{compare_typed, typed_inputs_for};
    use compute_core::{DType, Precision};
    use compute_ptx::kernels::gemm_wgmma::{self, WgmmaConfig};
    let emu = EmuBackend::with_wgmma();
    let mut rng = Rng::new(0x5eed_0006);
    let mut cases: Vec<(WgmmaConfig, (usize, usize, usize, usize))> =
        vec![(WgmmaConfig::default(), (1, 8, 4, 8)), (WgmmaConfig::default(), (2, 72, 100, 40))];
    // Every shape of both sweeps that rounds (the unrounded one is for measurements).
    let rounded = gemm_wgmma::tf32_sweep_configs().into_iter().filter(|c| c.tf32 != gemm_wgmma::Tf32Rounding::None);
    for cfg in gemm_wgmma::sweep_configs().into_iter().chain(rounded) {
        cases.push((cfg, (1, cfg.bm() as usize + 8, 4 * 32 + 4, cfg.bn as usize + 24)));
    }
    cases.push((
        WgmmaConfig { tf32: gemm_wgmma::Tf32Rounding::InRegisters, stages: 3, ..WgmmaConfig::default() },
        (2, 72, 100, 40),
    ));
    for (cfg, (batch, m, k, n)) in cases {
        let spec = MatmulSpec { batch, trans_b: true, ..MatmulSpec::new(m, k, n) }.with_precision(Precision::Tf32);
        assert!(compute_ptx::plan::tf32_fits(&spec));
        let op = Op::Matmul(spec);
        let inputs = typed_inputs_for(&op, &mut rng);
        let out = emu.matmul_tier_typed(GemmTier::Wgmma(cfg), spec, &inputs);
        let views: Vec<_> = inputs.iter().map(|v| v.as_slice()).collect();
        if let Some(msg) = compare_typed(&op, &views, out.as_slice(), 1.0) {
            panic!("{cfg:?} {spec:?}: {msg}");
        }
    }
    let full = MatmulSpec { trans_b: true, ..MatmulSpec::new(8, 8, 8) };
    assert!(!compute_ptx::plan::tf32_fits(&full));
    assert!(!compute_ptx::plan::tf32_fits(&MatmulSpec::new(8, 8, 8).with_precision(Precision::Tf32)));
    let _ = DType::F32;
}

/// TF32 rounds to nearest in every rounding mode of the `wgmma` kernel: with
/// `A` holding `1 + 0x1800·2⁻²³` (to nearest `1 + 2⁻¹⁰`, truncated `1`) and
/// `B` ones, every output is `k·(1 + 2⁻¹⁰)` exactly; unrounded, `wgmma`
/// (as emulated) truncates to `k`. Rows 0–4 start with specials that the
/// rounding must keep: NaNs whose payload fills the mantissa (`0x7fffffff`,
/// `0xffffffff`), ±∞, and the largest `f32`, which rounds to +∞.
#[test]
fn wgmma_tf32_rounds_to_nearest() {
    use compute_core::{DType, HostVec, Precision};
    use compute_ptx::kernels::gemm_wgmma::{self, Tf32Rounding};
    let emu = EmuBackend::with_wgmma();
    let (m, k, n) = (72, 100, 40);
    let spec = MatmulSpec { trans_b: true, ..MatmulSpec::new(m, k, n) }.with_precision(Precision::Tf32);
    let mut a = vec![f32::from_bits(0x3f80_1800); m * k];
    for (row, bits) in [0x7fff_ffffu32, 0xffff_ffff, 0x7f80_0000, 0xff80_0000, 0x7f7f_ffff].into_iter().enumerate() {
        a[row * k] = f32::from_bits(bits);
    }
    let a = HostVec::from_f32(DType::F32, &a);
    let b = HostVec::from_f32(DType::F32, &vec![1.0; n * k]);
    for cfg in gemm_wgmma::tf32_sweep_configs() {
        let out = emu.matmul_tier_typed(GemmTier::Wgmma(cfg), spec, &[a.clone(), b.clone()]).to_f32();
        let rounded = cfg.tf32 != Tf32Rounding::None;
        for (i, &c) in out.iter().enumerate() {
            let ok = match i / n {
                0 | 1 => c.is_nan(),
                2 => c == f32::INFINITY,
                3 => c == f32::NEG_INFINITY,
                4 => (c == f32::INFINITY) == rounded,
                _ if rounded => c == k as f32 * (1.0 + 2f32.powi(-10)),
                _ => c == k as f32,
            };
            assert!(ok, "{cfg:?}: C[{}][{}] = {c}", i / n, i % n);
        }
    }
}

/// A launcher that claims a compute capability 9.0 device with TMA and
/// notes each launch's kernel and addresses (pointers and tensor maps)
/// instead of running it (TMA is not emulated); temporaries at 1 MiB steps
/// from 1 GiB.
struct TmaRecorder {
    launches: std::sync::Mutex<Vec<(compute_ptx::kernels::KernelId, Vec<u64>)>>,
    next: std::sync::Mutex<u64>,
}

impl TmaRecorder {
    fn new() -> TmaRecorder {
        TmaRecorder { launches: Default::default(), next: std::sync::Mutex::new(1 << 30) }
    }
}

impl compute_ptx::plan::Launcher for TmaRecorder {
    fn sm_count(&self) -> u32 {
        132
    }
    fn has_wgmma(&self) -> bool {
        true
    }
    fn has_tma(&self) -> bool {
        true
    }
    fn launch(
        &self,
        id: compute_ptx::kernels::KernelId,
        _grid: compute_ptx::plan::Grid,
        args: &[compute_ptx::plan::Arg],
    ) -> compute_core::Result<()> {
        use compute_ptx::plan::Arg;
        let addrs = args
            .iter()
            .filter_map(|a| match a {
                Arg::Ptr(p) => Some(*p),
                Arg::TensorMap(m) => Some(m.addr),
                _ => None,
            })
            .collect();
        self.launches.lock().unwrap().push((id, addrs));
        Ok(())
    }
    fn temp(&self, _bytes: usize, _op: &'static str) -> compute_core::Result<(Box<dyn std::any::Any>, u64)> {
        let mut next = self.next.lock().unwrap();
        *next += 1 << 20;
        Ok((Box::new(()), *next))
    }
    fn copy(&self, _dst: u64, _src: u64, _bytes: usize, _op: &'static str) -> compute_core::Result<()> {
        Ok(())
    }
}

/// On a device with TMA, the plans round a TF32 product's `B` in a pass and
/// launch the TMA kernel that rounds `A` in registers, reading the rounded
/// copy of `B` and the caller's `A`.
#[test]
fn plans_round_only_b_before_the_tma_tf32_kernel() {
    use compute_core::{DType, Precision};
    use compute_ptx::kernels::KernelId;
    use compute_ptx::kernels::gemm_tma::TmaConfig;
    let rec = TmaRecorder::new();
    let spec = MatmulSpec { trans_b: true, ..MatmulSpec::new(256, 512, 384) }.with_precision(Precision::Tf32);
    let (a, b, c) = (1u64 << 20, 2u64 << 20, 3u64 << 20);
    compute_ptx::plan::run_op(&rec, &Op::Matmul(spec), &[a, b], c).expect("plan");
    let rounded_b = (1u64 << 30) + (1 << 20);
    let want = vec![
        (KernelId::RoundTf32, vec![b, rounded_b]),
        (KernelId::GemmTma(TmaConfig::tf32(), DType::F32, DType::F32, false, true, None), vec![a, rounded_b, c]),
    ];
    assert_eq!(rec.launches.into_inner().unwrap(), want);
}

/// A large half product whose `k` puts the stored rows off the 128-byte
/// lines: the plans copy `B` into aligned rows (16-byte units) and leave `A`
/// where it is, with `B` stored either way; below `REALIGN_MIN_MN` neither.
#[test]
fn plans_realign_only_b_for_the_tma_kernel() {
    use compute_core::DType;
    use compute_ptx::kernels::KernelId;
    use compute_ptx::kernels::gemm_tma::{REALIGN_MIN_MN, TmaConfig};
    let (a, b, c) = (1u64 << 20, 2u64 << 20, 3u64 << 20);
    let copied = (1u64 << 30) + (1 << 20);
    for (m, k, trans_b, b_copied) in [
        (REALIGN_MIN_MN, 4088, true, true),
        (REALIGN_MIN_MN, 4088, false, false),
        (REALIGN_MIN_MN - 8, 4088, true, false),
    ] {
        let rec = TmaRecorder::new();
        let spec = MatmulSpec { trans_b, ..MatmulSpec::new(m, k, 4096) }.with_dtypes(DType::BF16, DType::BF16);
        compute_ptx::plan::run_op(&rec, &Op::Matmul(spec), &[a, b], c).expect("plan");
        let gemm = KernelId::GemmTma(TmaConfig::default(), DType::BF16, DType::BF16, false, trans_b, None);
        let want = if b_copied {
            vec![(KernelId::Copy(16), vec![b, copied, 0]), (gemm, vec![a, copied, c])]
        } else {
            vec![(gemm, vec![a, b, c])]
        };
        assert_eq!(rec.launches.into_inner().unwrap(), want, "{spec:?}");
    }
}

/// On a compute capability 9.0 device the plans run a TF32 `A·Bᵀ` matmul on
/// the `wgmma` kernel (after the pass that rounds `B`); TF32 in other
/// layouts, and full precision, run the `f32` GEMM. Each within its tolerance.
#[test]
fn plans_pick_wgmma_for_tf32_products_it_reads() {
    use compute_core::Precision;
    use compute_core::conformance::{check_op_typed, typed_inputs_for};
    let emu = EmuBackend::with_wgmma();
    let mut rng = Rng::new(0x5eed_0007);
    for (trans_b, precision, kernels) in [
        (true, Precision::Tf32, &["round_tf32", "gemm_wgmma_tf32_f32_nt"][..]),
        (false, Precision::Tf32, &["gemm_simt"][..]),
        (true, Precision::Full, &["gemm_simt"][..]),
    ] {
        let spec = MatmulSpec { trans_b, ..MatmulSpec::new(72, 36, 80) }.with_precision(precision);
        let op = Op::Matmul(spec);
        let inputs = typed_inputs_for(&op, &mut rng);
        let before = emu.log.lock().unwrap().len();
        if let Err(e) = check_op_typed(&emu, &op, &inputs, 1.0) {
            panic!("{spec:?}: {e}");
        }
        let names: Vec<String> = emu.log.lock().unwrap()[before..].iter().map(|(k, _)| k.clone()).collect();
        let picked = names.len() == kernels.len() && names.iter().zip(kernels).all(|(n, k)| n.starts_with(k));
        assert!(picked, "{spec:?}: {names:?}");
    }
}

/// Half data runs the kernels of its own dtype (no detour through `f32`
/// buffers, matmuls of up to 8 rows included) except other matmuls that the
/// tensor cores do not take and conv2d, which widen into `f32` temporaries and
/// round once at the end; a cast to the same dtype is a copy that keeps every
/// bit; half tensors round-trip as their bytes.
#[test]
fn half_ops_launch_their_dtype_kernels_and_same_dtype_casts_copy() {
    use compute_core::{Backend, DType, HostVec, MatmulSpec, UnaryOp};
    let emu = EmuBackend::new();
    let mut rng = Rng::new(0x5eed_0002);
    let launched = |emu: &EmuBackend, f: &mut dyn FnMut()| {
        let before = emu.log.lock().unwrap().len();
        f();
        emu.log.lock().unwrap()[before..].iter().map(|(k, _)| k.clone()).collect::<Vec<_>>()
    };
    for dtype in [DType::F16, DType::BF16] {
        let data = HostVec::from_f32(dtype, &rng.vec(37, -3.0, 3.0));
        let t = emu.upload_typed(data.as_slice()).unwrap();
        let mut back = HostVec::zeros(dtype, 37);
        emu.download_typed(&t, back.as_mut()).unwrap();
        assert_eq!(back.bits(), data.bits());

        let out = emu.alloc_typed(37, dtype).unwrap();
        let op = Op::unary(UnaryOp::Relu, 37).with_dtype(dtype);
        let names = launched(&emu, &mut || emu.run_tensors(&op, &[&t], &out).unwrap());
        assert_eq!(names, [format!("unary_relu_{dtype}")]);

        let copy = emu.alloc_typed(37, dtype).unwrap();
        let names = launched(&emu, &mut || emu.run_tensors(&Op::cast(37, dtype, dtype), &[&t], &copy).unwrap());
        assert!(names.is_empty(), "{names:?}");
        emu.download_typed(&copy, back.as_mut()).unwrap();
        assert_eq!(back.bits(), data.bits());

        let spec = MatmulSpec::new(9, 6, 7).with_dtypes(dtype, dtype);
        let a = emu.upload_typed(HostVec::from_f32(dtype, &rng.vec(54, -1.0, 1.0)).as_slice()).unwrap();
        let b = emu.upload_typed(HostVec::from_f32(dtype, &rng.vec(42, -1.0, 1.0)).as_slice()).unwrap();
        let c = emu.alloc_typed(63, dtype).unwrap();
        let names = launched(&emu, &mut || emu.run_tensors(&Op::Matmul(spec), &[&a, &b], &c).unwrap());
        let widen = format!("cast_{dtype}_f32");
        assert_eq!(names, [widen.as_str(), widen.as_str(), "gemm_naive", &format!("cast_f32_{dtype}")]);

        // Up to 8 rows: the GEMV kernels of the dtype, no widening.
        let spec = MatmulSpec::new(5, 6, 7).with_dtypes(dtype, dtype);
        let c = emu.alloc_typed(35, dtype).unwrap();
        let a5 = emu.upload_typed(HostVec::from_f32(dtype, &rng.vec(30, -1.0, 1.0)).as_slice()).unwrap();
        let names = launched(&emu, &mut || emu.run_tensors(&Op::Matmul(spec), &[&a5, &b], &c).unwrap());
        assert_eq!(names, [format!("gemv_nn_r8_{dtype}"), format!("gemv_combine_{dtype}")]);
    }
    let mut v = rng.vec(1031, -1e30, 1e30);
    v[..4].copy_from_slice(&[f32::from_bits(0x7fc0_1234), 1e-45, -0.0, f32::NEG_INFINITY]);
    let mut copied = vec![f32::NAN; v.len()];
    compute_core::Ops::cast(&emu, &v, &mut copied).unwrap();
    assert!(copied.iter().zip(&v).all(|(a, b)| a.to_bits() == b.to_bits()));
}

/// The tensor-core attention kernel in every shape the tuning sweep may
/// pick (row tiles, key tiles, warps), on both half dtypes, against the
/// reference: odd lengths, both causal alignments, grouped heads, queries
/// that see nothing, and a tile that spans two heads of a group.
#[test]
fn flash_attention_shapes_agree() {
    use compute_core::conformance::{compare_typed, typed_inputs_for};
    use compute_core::{AttentionSpec, DType, Mask};
    use compute_ptx::kernels::attention::FlashConfig;
    use compute_ptx::plan::AttentionKernel;
    let emu = EmuBackend::new();
    let mut rng = Rng::new(0x5eed_a77e);
    let specs = [
        AttentionSpec::new(1, 4, 37, 70, 64).with_kv_heads(2).causal(),
        AttentionSpec::new(2, 2, 9, 130, 32).with_mask(Mask::CausalTopLeft),
        AttentionSpec::new(1, 8, 3, 200, 128).with_kv_heads(1).causal(),
        AttentionSpec::new(1, 2, 80, 30, 80).causal(),
        AttentionSpec::new(1, 1, 65, 65, 16),
        // Decoding: 8 rows, 18 key tiles on the emulator's 2 multiprocessors: 4 key splits.
        AttentionSpec::new(1, 4, 2, 1100, 64).with_kv_heads(1).causal(),
    ];
    for spec in specs {
        let d = spec.head_dim;
        let mut cfgs = vec![FlashConfig::for_head_dim(d)];
        cfgs.extend(FlashConfig::sweep(d));
        cfgs.push(FlashConfig::for_decode(d));
        cfgs.extend(FlashConfig::decode_sweep(d));
        for (warps, m_tiles, bn) in [(2, 2, 64), (8, 1, 16)] {
            let cfg = FlashConfig { warps, m_tiles, bn, ..FlashConfig::for_head_dim(d) };
            if cfg.check().is_ok() {
                cfgs.push(cfg);
            }
        }
        cfgs.push(FlashConfig::for_f32(d));
        for cfg in cfgs {
            for dtype in [DType::BF16, DType::F16, DType::F32] {
                // f32 data (TF32 opted in) runs the bf16x3 form, which reads q from shared memory.
                if dtype == DType::F32 && cfg.check_f32().is_err() {
                    continue;
                }
                let spec = spec.with_dtype(dtype).with_precision(compute_core::Precision::Tf32);
                let op = Op::Attention(spec);
                let inputs = typed_inputs_for(&op, &mut rng);
                let before = emu.log.lock().unwrap().len();
                let out = emu.attention_typed(spec, Some(AttentionKernel::Flash(cfg)), &inputs);
                let names: Vec<String> = emu.log.lock().unwrap()[before..].iter().map(|(k, _)| k.clone()).collect();
                let splits = compute_ptx::plan::key_splits(
                    (spec.group() * spec.seq_q).div_ceil(cfg.rows() as usize) * spec.heads_kv * spec.batch,
                    spec.seq_k.div_ceil(cfg.bn as usize),
                    2,
                );
                let mut want: Vec<String> = Vec::new();
                if dtype == DType::F32 {
                    want.extend(["split_f32_bf16x2".to_string(), "split_f32_bf16x2".into(), "split_f32_bf16x2".into()]);
                }
                if splits == 1 {
                    want.push(cfg.kernel_name(dtype));
                } else {
                    want.push(format!("{}_split", cfg.kernel_name(dtype)));
                    want.push(format!(
                        "attention_combine{}_d{d}",
                        if dtype == DType::F32 { String::new() } else { format!("_{dtype}") }
                    ));
                }
                assert_eq!(names, want, "{spec:?}");
                let views: Vec<_> = inputs.iter().map(|v| v.as_slice()).collect();
                if let Some(msg) = compare_typed(&op, &views, out.as_slice(), 1.0) {
                    panic!("{cfg:?} {}: {msg}", op.shapes());
                }
            }
        }
    }
}

/// Attention over a KV cache of larger capacity than `seq_k` (each head's
/// rows past `seq_k` hold other values, which must not be read) on every
/// kernel: the `mma.sync` kernel (prefill shape and the key-split decode
/// shape with its merge), its bf16x3 form for `f32` with TF32, the `f32`
/// kernel, and the Hopper kernel.
#[test]
fn attention_reads_a_kv_cache_on_every_kernel() {
    use compute_core::conformance::{compare_typed, typed_inputs_for};
    use compute_core::{AttentionSpec, DType, Precision};
    use compute_ptx::kernels::attention::FlashConfig;
    use compute_ptx::kernels::attention_wgmma::HopperConfig;
    use compute_ptx::plan::AttentionKernel;
    let emu = EmuBackend::with_wgmma();
    let mut rng = Rng::new(0x5eed_cace);
    let specs = [
        AttentionSpec::new(1, 4, 2, 700, 64).with_kv_heads(1).causal().with_kv_capacity(1000),
        AttentionSpec::new(2, 2, 33, 70, 128).causal().with_kv_capacity(96),
    ];
    for spec in specs {
        let d = spec.head_dim;
        let mut runs: Vec<(DType, Precision, Option<AttentionKernel>)> = Vec::new();
        for dtype in [DType::BF16, DType::F16] {
            runs.push((dtype, Precision::Full, Some(AttentionKernel::Flash(FlashConfig::for_head_dim(d)))));
            runs.push((dtype, Precision::Full, Some(AttentionKernel::Flash(FlashConfig::for_decode(d)))));
            runs.push((dtype, Precision::Full, Some(AttentionKernel::Hopper(HopperConfig::for_head_dim(d)))));
        }
        runs.push((DType::F32, Precision::Tf32, Some(AttentionKernel::Flash(FlashConfig::for_f32(d)))));
        runs.push((DType::F32, Precision::Full, None));
        for (dtype, precision, kernel) in runs {
            let spec = spec.with_dtype(dtype).with_precision(precision);
            let op = Op::Attention(spec);
            let inputs = typed_inputs_for(&op, &mut rng);
            let before = emu.log.lock().unwrap().len();
            let out = emu.attention_typed(spec, kernel, &inputs);
            let names: Vec<String> = emu.log.lock().unwrap()[before..].iter().map(|(k, _)| k.clone()).collect();
            let views: Vec<_> = inputs.iter().map(|v| v.as_slice()).collect();
            if let Some(msg) = compare_typed(&op, &views, out.as_slice(), 1.0) {
                panic!("{kernel:?} {}: {names:?}: {msg}", op.shapes());
            }
        }
    }
}

/// The Hopper attention kernel (`wgmma`) in every shape of its sweep, both
/// half dtypes, head sizes 64 and 128, on odd lengths, both causal
/// alignments and grouped heads, against the reference; and the plans pick
/// it on compute capability 9.0 for a prefill at head sizes 128 and 64.
#[test]
fn hopper_attention_shapes_agree() {
    use compute_core::conformance::{compare_typed, typed_inputs_for};
    use compute_core::{AttentionSpec, Backend, DType, HostVec, Mask};
    use compute_ptx::kernels::attention_wgmma::{HopperConfig, HopperSchedule};
    use compute_ptx::plan::AttentionKernel;
    let emu = EmuBackend::with_wgmma();
    let mut rng = Rng::new(0x5eed_a77f);
    let specs = [
        AttentionSpec::new(1, 4, 70, 200, 64).with_kv_heads(2).causal(),
        AttentionSpec::new(1, 2, 130, 70, 128).with_mask(Mask::CausalTopLeft),
        AttentionSpec::new(1, 2, 65, 129, 128).causal(),
        AttentionSpec::new(2, 1, 33, 33, 64),
    ];
    for spec in specs {
        let d = spec.head_dim;
        // The emulator encodes no tensor maps: the TMA schedules are checked on the GPU.
        let mut cfgs = vec![HopperConfig::for_head_dim(d)];
        cfgs.extend(HopperConfig::sweep(d));
        cfgs.retain(|c| !c.schedule.uses_tma());
        for cfg in cfgs {
            for dtype in [DType::BF16, DType::F16] {
                let spec = spec.with_dtype(dtype);
                let op = Op::Attention(spec);
                let inputs = typed_inputs_for(&op, &mut rng);
                let before = emu.log.lock().unwrap().len();
                let out = emu.attention_typed(spec, Some(AttentionKernel::Hopper(cfg)), &inputs);
                let names: Vec<String> = emu.log.lock().unwrap()[before..].iter().map(|(k, _)| k.clone()).collect();
                assert_eq!(names, [cfg.kernel_name(dtype)]);
                let views: Vec<_> = inputs.iter().map(|v| v.as_slice()).collect();
                if let Some(msg) = compare_typed(&op, &views, out.as_slice(), 1.0) {
                    panic!("{cfg:?} {}: {msg}", op.shapes());
                }
            }
        }
    }
    // A TMA schedule asked of a launcher without tensor maps runs the cp.async ping-pong of the same tiles.
    let spec = AttentionSpec::new(1, 2, 130, 70, 128).causal().with_dtype(DType::BF16);
    let tma = HopperConfig { head_dim: 128, warpgroups: 2, bn: 128, schedule: HopperSchedule::PingPongTma };
    let op = Op::Attention(spec);
    let inputs = typed_inputs_for(&op, &mut rng);
    let before = emu.log.lock().unwrap().len();
    let out = emu.attention_typed(spec, Some(AttentionKernel::Hopper(tma)), &inputs);
    let names: Vec<String> = emu.log.lock().unwrap()[before..].iter().map(|(k, _)| k.clone()).collect();
    assert_eq!(tma.without_tma().schedule, HopperSchedule::PingPong);
    assert_eq!(names, [tma.without_tma().kernel_name(DType::BF16)]);
    let views: Vec<_> = inputs.iter().map(|v| v.as_slice()).collect();
    assert!(compare_typed(&op, &views, out.as_slice(), 1.0).is_none());
    // Picked by the plans at d = 128: a prefill whose row tiles fill the (two-multiprocessor) device.
    let spec = AttentionSpec::new(1, 8, 200, 200, 128).with_kv_heads(2).causal().with_dtype(DType::BF16);
    let op = Op::Attention(spec);
    let inputs = typed_inputs_for(&op, &mut rng);
    let views: Vec<_> = inputs.iter().map(|v| v.as_slice()).collect();
    let mut out = HostVec::zeros(DType::BF16, inputs[0].len());
    let before = emu.log.lock().unwrap().len();
    emu.run_typed(&op, &views, out.as_mut()).unwrap();
    let names: Vec<String> = emu.log.lock().unwrap()[before..].iter().map(|(k, _)| k.clone()).collect();
    // (the default's TMA schedule becomes the cp.async ping-pong: the emulator encodes no tensor maps)
    assert_eq!(names, [HopperConfig::for_head_dim(128).without_tma().kernel_name(DType::BF16)]);
    assert!(compare_typed(&op, &views, out.as_slice(), 1.0).is_none());
    // And at d = 64 (one warpgroup, P in registers).
    let spec = AttentionSpec::new(1, 4, 150, 150, 64).with_kv_heads(2).causal().with_dtype(DType::F16);
    let op = Op::Attention(spec);
    let inputs = typed_inputs_for(&op, &mut rng);
    let views: Vec<_> = inputs.iter().map(|v| v.as_slice()).collect();
    let mut out = HostVec::zeros(DType::F16, inputs[0].len());
    let before = emu.log.lock().unwrap().len();
    emu.run_typed(&op, &views, out.as_mut()).unwrap();
    let names: Vec<String> = emu.log.lock().unwrap()[before..].iter().map(|(k, _)| k.clone()).collect();
    assert_eq!(names, [HopperConfig::for_head_dim(64).kernel_name(DType::F16)]);
    assert!(compare_typed(&op, &views, out.as_slice(), 1.0).is_none());
}

/// Runs `spec` through the plans (or the forced `tier`) and returns the
/// kernels it launched; panics on a wrong result.
fn run_logged(emu: &EmuBackend, spec: MatmulSpec, tier: Option<GemmTier>, rng: &mut Rng) -> Vec<String> {
    use compute_core::conformance::{check_op_typed, compare_typed, typed_inputs_for};
    let op = Op::Matmul(spec);
    let inputs = typed_inputs_for(&op, rng);
    let before = emu.log.lock().unwrap().len();
    match tier {
        None => {
            if let Err(e) = check_op_typed(emu, &op, &inputs, 1.0) {
                panic!("{spec:?}: {e}");
            }
        }
        Some(tier) => {
            let out = emu.matmul_tier_typed(tier, spec, &inputs);
            let views: Vec<_> = inputs.iter().map(|v| v.as_slice()).collect();
            if let Some(msg) = compare_typed(&op, &views, out.as_slice(), 1.0) {
                panic!("{tier:?} {spec:?}: {msg}");
            }
        }
    }
    emu.log.lock().unwrap()[before..].iter().map(|(k, _)| k.clone()).collect()
}

/// The GEMV kernels for every input and output dtype, both layouts of `B`,
/// every row count 1..=8 (16 with `B` stored `n × k`), on ragged `k` and `n`
/// (the one-element loops) and on aligned ones (the 16-byte loops), with the
/// launches checked: 9 to 16 aligned rows of halves on the tensor-core
/// kernel, the CUDA-core kernels otherwise.
#[test]
fn gemv_every_dtype_layout_and_row_count() {
    use compute_core::DType;
    use compute_ptx::kernels::gemv;
    let emu = EmuBackend::new();
    let mut rng = Rng::new(0x5eed_0008);
    for input in DType::ALL {
        for out in DType::ALL {
            for trans_b in [true, false] {
                let most = if trans_b { gemv::MAX_ROWS } else { gemv::NN_MAX_ROWS };
                for m in 1..=most {
                    let shapes: &[(usize, usize)] =
                        if matches!(m, 1 | 3 | 8 | 9 | 16) { &[(37, 19), (64, 48)] } else { &[(37, 19)] };
                    for &(k, n) in shapes {
                        let spec = MatmulSpec { trans_b, ..MatmulSpec::new(m, k, n) }.with_dtypes(input, out);
                        assert!(compute_ptx::plan::gemv_fits(&spec));
                        let names = run_logged(&emu, spec, None, &mut rng);
                        let r = gemv::rows_for(m);
                        let mma = m > gemv::NN_MAX_ROWS && input != DType::F32 && k % 8 == 0;
                        let want = if mma {
                            gemv::mma_name(gemv::MMA_DEFAULT_TILES, input, out)
                        } else if trans_b {
                            gemv::nt_name(r, input, out)
                        } else {
                            gemv::nn_name(r, input)
                        };
                        assert_eq!(names[0], want, "{spec:?}: {names:?}");
                        if trans_b {
                            assert_eq!(names.len(), 1, "{spec:?}: {names:?}");
                        }
                    }
                }
            }
        }
    }
}

/// `B` stored `k × n` with `k` long enough for several k-splits (the
/// emulated device has 2 multiprocessors), batches over `blockIdx.z`, the
/// combine kernel summing the splits, and the forced tier.
#[test]
fn gemv_k_splits_batches_and_forced_tier() {
    use compute_core::DType;
    use compute_ptx::kernels::gemv;
    let emu = EmuBackend::new();
    let mut rng = Rng::new(0x5eed_0009);
    for (batch, m, k, n, input, out) in [
        (1, 1, 1000, 40, DType::F32, DType::F32),
        (2, 5, 517, 33, DType::BF16, DType::BF16),
        (1, 8, 1024, 64, DType::F16, DType::F32),
        (3, 2, 300, 17, DType::F32, DType::F16),
        (1, 3, 9, 9, DType::BF16, DType::F32),
    ] {
        for trans_b in [false, true] {
            let spec = MatmulSpec { batch, trans_b, ..MatmulSpec::new(m, k, n) }.with_dtypes(input, out);
            let names = run_logged(&emu, spec, None, &mut rng);
            let forced = run_logged(&emu, spec, Some(GemmTier::Gemv), &mut rng);
            assert_eq!(names, forced, "{spec:?}");
            if !trans_b && k >= 300 {
                let splits =
                    emu.log.lock().unwrap().iter().rev().find(|(name, _)| name.starts_with("gemv_nn")).unwrap().1;
                assert!(splits.blocks.1 > 1, "{spec:?}: {splits:?}");
                assert_eq!(names.last().unwrap(), &gemv::combine_name(out), "{spec:?}: {names:?}");
            }
        }
    }
}

/// `B` stored `n × k` with every k-split forced (1, 2, 4 and 8 warps per
/// column group) and every row count 1..=16: `k` long enough for several full
/// rounds of loads per lane and a partial one, ragged `k` (the one-element
/// loop only, past several rounds), `f32` units, fewer columns than a block
/// holds (the columns past `n` read and not stored), more columns than one
/// block, and batches; each checked against the reference.
#[test]
fn gemv_nt_every_split_row_count_and_tail() {
    use compute_core::DType;
    use compute_ptx::kernels::gemv;
    let emu = EmuBackend::new();
    let mut rng = Rng::new(0x5eed_000b);
    for split in gemv::NT_SPLITS {
        for m in 1..=gemv::MAX_ROWS {
            for (batch, k, n, input, out) in [
                (1, 4392, 3, DType::BF16, DType::BF16),
                (2, 1003, 5, DType::F16, DType::F32),
                (1, 1100, 9, DType::F32, DType::F16),
                (1, 72, 37, DType::BF16, DType::F32),
            ] {
                let spec = MatmulSpec { batch, trans_b: true, ..MatmulSpec::new(m, k, n) }.with_dtypes(input, out);
                let names = run_logged(&emu, spec, Some(GemmTier::GemvSplit(split)), &mut rng);
                let r = gemv::rows_for(m);
                assert_eq!(names, [gemv::nt_name(r, input, out)], "{spec:?} split {split}");
                let grid = emu.log.lock().unwrap().last().unwrap().1;
                let cols = gemv::nt_block_cols(r, split) as usize;
                assert_eq!(grid.blocks, (n.div_ceil(cols) as u32, 1, batch as u32), "{spec:?} split {split}");
            }
        }
    }
    let spec = MatmulSpec { trans_b: true, ..MatmulSpec::new(1, 64, 8) };
    for bad in [0, 3, 16] {
        let err = compute_ptx::plan::run_matmul(&emu, GemmTier::GemvSplit(bad), &spec, (0, 0, 0), None).unwrap_err();
        assert!(matches!(err, compute_core::ComputeError::Shape { .. }), "{err}");
    }
}

/// The tensor-core GEMV (`B` stored `n × k`, half inputs) with every tile
/// count and k-split forced, on 1 to 16 rows: `k` of whole chunks of 32
/// values only and with a partial chunk of 1 or 3 units (the units past `k`
/// loaded as zeros), over several rounds, fewer columns than a warp group holds, more than a block,
/// batches and every output dtype, each checked against the reference; and
/// the forced shapes it refuses (`f32`, `k` not a multiple of 8, `B` stored
/// `k × n`, 3 tiles, 17 rows).
#[test]
fn gemv_tensor_cores_every_tile_split_and_tail() {
    use compute_core::DType;
    use compute_ptx::kernels::gemv;
    let emu = EmuBackend::new();
    let mut rng = Rng::new(0x5eed_000d);
    for tiles in gemv::MMA_TILES {
        for split in gemv::NT_SPLITS {
            for (batch, m, k, n, input, out) in [
                (1, 16, 1096, 3, DType::BF16, DType::BF16),
                (2, 12, 72, 37, DType::F16, DType::F32),
                (1, 9, 136, 70, DType::BF16, DType::F16),
                (1, 1, 40, 9, DType::F16, DType::F16),
                (1, 13, 2056, 5, DType::BF16, DType::F32),
                (1, 10, 56, 11, DType::BF16, DType::BF16),
                (2, 16, 4096, 17, DType::F16, DType::F16),
            ] {
                let spec = MatmulSpec { batch, trans_b: true, ..MatmulSpec::new(m, k, n) }.with_dtypes(input, out);
                let names = run_logged(&emu, spec, Some(GemmTier::GemvMma(tiles, split)), &mut rng);
                assert_eq!(names, [gemv::mma_name(tiles, input, out)], "{spec:?} tiles {tiles} split {split}");
                let grid = emu.log.lock().unwrap().last().unwrap().1;
                let cols = gemv::mma_block_cols(tiles, split) as usize;
                assert_eq!(grid.blocks, (n.div_ceil(cols) as u32, 1, batch as u32), "{spec:?} split {split}");
            }
        }
    }
    let ok = MatmulSpec { trans_b: true, ..MatmulSpec::new(16, 64, 8) }.with_dtypes(DType::BF16, DType::BF16);
    for (spec, tiles) in [
        (MatmulSpec { trans_b: true, ..MatmulSpec::new(16, 64, 8) }, 2),
        (MatmulSpec { k: 60, ..ok }, 2),
        (MatmulSpec { trans_b: false, m: 8, ..ok }, 2),
        (ok, 3),
        (MatmulSpec { m: 17, ..ok }, 2),
    ] {
        let err = compute_ptx::plan::run_matmul(&emu, GemmTier::GemvMma(tiles, 1), &spec, (0, 0, 0), None).unwrap_err();
        assert!(matches!(err, compute_core::ComputeError::Shape { .. }), "{spec:?}: {err}");
    }
}

/// The plans' split for the tensor-core GEMV: the largest that leaves each
/// warp a full round of chunks (8 warps per column group at the decoder's
/// shapes), and the plans launch it with one tile.
#[test]
fn gemv_tensor_core_split_follows_k() {
    use compute_core::DType;
    use compute_ptx::kernels::gemv::{self, mma_split};
    for (k, tiles, want) in
        [(2048, 1, 8), (8192, 1, 8), (2048, 4, 8), (512, 1, 4), (512, 4, 8), (136, 1, 1), (64, 2, 1), (8, 1, 1)]
    {
        assert_eq!(mma_split(k, tiles), want, "k {k} tiles {tiles}");
    }
    let emu = EmuBackend::new();
    let mut rng = Rng::new(0x5eed_000e);
    let spec = MatmulSpec { trans_b: true, ..MatmulSpec::new(16, 1024, 20) }.with_dtypes(DType::BF16, DType::BF16);
    let names = run_logged(&emu, spec, None, &mut rng);
    assert_eq!(names, [gemv::mma_name(1, DType::BF16, DType::BF16)]);
    let grid = emu.log.lock().unwrap().last().unwrap().1;
    assert_eq!(grid.blocks, (3, 1, 1), "8 warps per 8 columns");
}

/// The plans' k-split: one warp per column group where the blocks fill the
/// device, else the split with the fewest rounds of loads times waves of
/// blocks (measured best at every decoder shape on an H200, 132
/// multiprocessors); on the emulated device (2 multiprocessors) a product of
/// 3 columns and long `k` runs split.
#[test]
fn gemv_nt_split_follows_the_shape() {
    use compute_core::DType;
    use compute_ptx::kernels::gemv::{self, nt_split};
    let emu = EmuBackend::new();
    let mut rng = Rng::new(0x5eed_000c);
    let spec = MatmulSpec { trans_b: true, ..MatmulSpec::new(1, 4096, 3) }.with_dtypes(DType::BF16, DType::BF16);
    let names = run_logged(&emu, spec, None, &mut rng);
    assert_eq!(names, [gemv::nt_name(1, DType::BF16, DType::BF16)]);
    assert_eq!(nt_split(1, 3, 4096, DType::BF16, 2), 2);
    let grid = emu.log.lock().unwrap().last().unwrap().1;
    assert_eq!(grid.blocks, (1, 1, 1));
    for (m, n, k, sms, want) in [
        (1, 512, 2048, 132, 1),
        (1, 2048, 2048, 132, 1),
        (1, 8192, 2048, 132, 1),
        (1, 2048, 8192, 132, 1),
        (1, 32000, 2048, 132, 1),
        (2, 2048, 8192, 132, 1),
        (4, 2048, 2048, 132, 2),
        (8, 512, 2048, 132, 8),
        (8, 2048, 2048, 132, 4),
        (8, 2048, 8192, 132, 4),
        (8, 8192, 2048, 132, 1),
        (8, 32000, 2048, 132, 1),
        (1, 64, 4099, 132, 8),
        (1, 3, 4096, 2, 2),
        (1, 48, 4096, 2, 1),
    ] {
        assert_eq!(nt_split(m, n, k, DType::BF16, sms), want, "m {m} n {n} k {k} on {sms} SMs");
    }
}

/// The plans take the GEMV kernels for 1 to 8 rows of `A` stored `m × k`,
/// and up to 16 with `B` stored `n × k` (on a compute capability 9.0 device
/// too, and for TF32), and not for 9 rows with `B` stored `k × n`, 17 rows
/// or a transposed `A`; 9 to 16 rows of halves with more than
/// `GEMV_WIDE_COLUMNS` columns run the `wgmma` GEMM where there is one; the
/// forced tier refuses what it does not take.
#[test]
fn plans_pick_gemv_for_few_rows_only() {
    use compute_core::{DType, Precision};
    for (wgmma, emu) in [(false, EmuBackend::new()), (true, EmuBackend::with_wgmma())] {
        let mut rng = Rng::new(0x5eed_000a);
        for (m, trans_a, input, gemv) in [
            (1, false, DType::BF16, true),
            (8, false, DType::BF16, true),
            (8, false, DType::F32, true),
            (9, false, DType::BF16, true),
            (9, false, DType::F32, true),
            (16, false, DType::F16, true),
            (17, false, DType::BF16, false),
            (4, true, DType::BF16, false),
            (4, true, DType::F32, false),
        ] {
            for trans_b in [true, false] {
                let gemv = gemv && (trans_b || m <= 8);
                let spec = MatmulSpec { trans_a, trans_b, ..MatmulSpec::new(m, 64, 32) }.with_dtypes(input, input);
                let names = run_logged(&emu, spec, None, &mut rng);
                assert_eq!(names.iter().any(|n| n.starts_with("gemv_")), gemv, "{spec:?}: {names:?}");
                assert_eq!(GemmTier::choose(&spec, false) == GemmTier::Gemv, gemv, "{spec:?}");
            }
        }
        // Wide products of 9 to 16 half rows: the wgmma GEMM where there is one.
        let wide = MatmulSpec { trans_b: true, ..MatmulSpec::new(12, 64, compute_ptx::plan::GEMV_WIDE_COLUMNS + 8) }
            .with_dtypes(DType::BF16, DType::BF16);
        let names = run_logged(&emu, wide, None, &mut rng);
        assert_eq!(names.iter().any(|n| n.starts_with("gemm_wgmma")), wgmma, "{names:?}");
        assert_eq!(names.iter().any(|n| n.starts_with("gemv_")), !wgmma, "{names:?}");
        assert!(matches!(GemmTier::choose(&wide, true), GemmTier::Wgmma(_)));
        assert_eq!(GemmTier::choose(&wide, false), GemmTier::Gemv);
        let narrow = MatmulSpec { n: compute_ptx::plan::GEMV_WIDE_COLUMNS, ..wide };
        assert_eq!(GemmTier::choose(&narrow, true), GemmTier::Gemv);
        let tf32 = MatmulSpec { trans_b: true, ..MatmulSpec::new(2, 64, 32) }.with_precision(Precision::Tf32);
        let names = run_logged(&emu, tf32, None, &mut rng);
        assert_eq!(names, ["gemv_nt_r2_f32_f32"]);
    }
    let emu = EmuBackend::new();
    let spec = MatmulSpec::new(9, 8, 8);
    let err = compute_ptx::plan::run_matmul(&emu, GemmTier::Gemv, &spec, (0, 0, 0), None).unwrap_err();
    assert!(matches!(err, compute_core::ComputeError::Shape { .. }), "{err}");
    let spec = MatmulSpec { trans_b: true, ..MatmulSpec::new(17, 8, 8) };
    let err = compute_ptx::plan::run_matmul(&emu, GemmTier::Gemv, &spec, (0, 0, 0), None).unwrap_err();
    assert!(matches!(err, compute_core::ComputeError::Shape { .. }), "{err}");
}

/// The strided copy picks 16-, 8-, 4- or 2-byte units from the views'
/// alignment (each checked against the reference, the elements outside the
/// view untouched); argmax takes the first NaN, else the first of equal
/// maxima, over rows of -inf, ties across threads and NaNs, on every dtype.
#[test]
fn copy_units_and_argmax_specials() {
    use compute_core::conformance::{check_op_typed, typed_inputs_for};
    use compute_core::{CopySpec, DType, HostVec, Strided};
    let emu = EmuBackend::new();
    let mut rng = Rng::new(0x5eed_c0b1);
    let dst = |offset: usize| Strided { offset, strides: [64, 16, 1], len: 4 * 64 };
    for (dtype, offset, unit) in [
        (DType::F32, 8, "copy_b16"),
        (DType::F32, 2, "copy_b8"),
        (DType::F32, 1, "copy_b4"),
        (DType::BF16, 8, "copy_b16"),
        (DType::F16, 4, "copy_b8"),
        (DType::F16, 3, "copy_b2"),
    ] {
        let op = Op::Copy(CopySpec::new([3, 2, 8], Strided::contiguous([3, 2, 8]), dst(offset)).with_dtype(dtype));
        let inputs = typed_inputs_for(&op, &mut rng);
        let before = emu.log.lock().unwrap().len();
        if let Err(e) = check_op_typed(&emu, &op, &inputs, 1.0) {
            panic!("{dtype} offset {offset}: {e}");
        }
        let names: Vec<String> = emu.log.lock().unwrap()[before..].iter().map(|(k, _)| k.clone()).collect();
        assert_eq!(names, [unit], "{dtype} offset {offset}");
    }
    let cols = 600;
    let mut rows = vec![vec![f32::NEG_INFINITY; cols]];
    let mut ties = vec![-1.0f32; cols];
    for j in [3, 259, 515] {
        ties[j] = 2.0;
    }
    rows.push(ties);
    let mut nans = vec![0.5f32; cols];
    nans[10] = f32::INFINITY;
    for j in [300, 44, 555] {
        nans[j] = f32::NAN;
    }
    rows.push(nans);
    let x: Vec<f32> = rows.concat();
    for dtype in DType::ALL {
        let op = Op::ArgMax { rows: 3, cols, dtype };
        let inputs = [HostVec::from_f32(dtype, &x)];
        let mut out = HostVec::zeros(DType::F32, 3);
        let views: Vec<_> = inputs.iter().map(|v| v.as_slice()).collect();
        compute_core::Backend::run_typed(&emu, &op, &views, out.as_mut()).unwrap();
        assert_eq!(out.to_f64(), [0.0, 3.0, 44.0], "{dtype}");
    }
}

/// argmax over rows long enough for several full rounds of 16-byte loads per
/// thread and a partial one (and, with a ragged length, as many of one value
/// each), on every dtype: ties between threads and within a 16-byte unit
/// (values on a coarse grid), a row of -inf, a NaN late in the row beside an
/// earlier one in another thread's unit, a maximum in the last column, and
/// NaNs one thread meets in turn (the first stays).
#[test]
fn argmax_long_and_ragged_rows() {
    use compute_core::conformance::check_op_typed;
    use compute_core::{DType, HostVec};
    let emu = EmuBackend::new();
    let mut rng = Rng::new(0x5eed_a4a4);
    for cols in [40000, 40001, 9000] {
        let coarse: Vec<f32> = rng.vec(cols, -1.0, 1.0).iter().map(|v| (v * 4.0).floor() / 4.0).collect();
        let mut nans = rng.vec(cols, -1.0, 1.0);
        nans[cols - 3] = f32::NAN;
        nans[cols / 2 + 9] = f32::NAN;
        let mut last = rng.vec(cols, -1.0, 1.0);
        last[cols - 1] = 2.0;
        // NaNs that one thread meets in turn (one 16-byte unit; or 1024 apart).
        let mut same = rng.vec(cols, -1.0, 1.0);
        for j in [1, 3, 1025] {
            same[j] = f32::NAN;
        }
        same[7] = 5.0;
        let x: Vec<f32> = [coarse, vec![f32::NEG_INFINITY; cols], nans, last, same].concat();
        for dtype in DType::ALL {
            let op = Op::ArgMax { rows: 5, cols, dtype };
            let inputs = [HostVec::from_f32(dtype, &x)];
            if let Err(e) = check_op_typed(&emu, &op, &inputs, 1.0) {
                panic!("{dtype} cols {cols}: {e}");
            }
            let mut out = HostVec::zeros(DType::F32, 5);
            let views: Vec<_> = inputs.iter().map(|v| v.as_slice()).collect();
            compute_core::Backend::run_typed(&emu, &op, &views, out.as_mut()).unwrap();
            let got = out.to_f64();
            assert_eq!(got[1..], [0.0, (cols / 2 + 9) as f64, (cols - 1) as f64, 1.0], "{dtype} cols {cols}");
        }
    }
}

/// `round_tf32`, the pass before a TF32 GEMM that reads its operands as they
/// are, rounds every value to nearest TF32 with ties away from zero, keeps
/// NaN, ±∞ and ±0, and rounds the largest `f32` to +∞, as `cvt.rna.tf32.f32`
/// does (checked bit for bit against the same rule on the host).
#[test]
fn round_tf32_rounds_to_nearest_ties_away() {
    use compute_ptx::kernels::KernelId;
    use compute_ptx::plan::{Arg, Grid, Launcher};
    let emu = EmuBackend::new();
    let mut rng = Rng::new(0x5eed_0071);
    let mut xs: Vec<u32> = (0..1000).map(|_| rng.vec(1, -1e6, 1e6)[0].to_bits()).collect();
    // Ties (low 13 bits exactly 0x1000) both ways, carries into the exponent, specials.
    xs.extend([0x3f80_1000, 0xbf80_1000, 0x3f80_0fff, 0x3fff_f000, 0x7f7f_ffff, 0x7fc0_0001, 0x7f80_0000]);
    xs.extend([0xff80_0000, 0x0000_0000, 0x8000_0000, 0x0000_1000, 0x007f_ffff, 0x8000_1000]);
    let host = |x: u32| -> u32 {
        let f = f32::from_bits(x);
        if f.is_nan() || f.is_infinite() {
            return x;
        }
        (x.wrapping_add(0x1000)) & !0x1fff
    };
    let bytes: Vec<u8> = xs.iter().flat_map(|x| x.to_ne_bytes()).collect();
    let out = emu
        .run_bytes(&[&bytes], bytes.len(), |ins, o| {
            let grid = Grid { blocks: (2, 1, 1), threads: (256, 1, 1), dynamic_smem: 0 };
            emu.launch(KernelId::RoundTf32, grid, &[Arg::Ptr(ins[0]), Arg::Ptr(o), Arg::U64(xs.len() as u64)])
        })
        .expect("round_tf32");
    for (i, (x, y)) in xs.iter().zip(out.chunks_exact(4)).enumerate() {
        let y = u32::from_ne_bytes(y.try_into().expect("4 bytes"));
        let want = host(*x);
        let same = y == want || (f32::from_bits(y).is_nan() && f32::from_bits(want).is_nan());
        assert!(same, "value {i}: {x:#010x} rounded to {y:#010x}, want {want:#010x}");
    }
}
