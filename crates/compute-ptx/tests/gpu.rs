//! CUDA-only behaviour beyond the conformance suite: every GEMM tier forced,
//! buffer-pool allocations, completion events, long chains of device ops, and
//! driver errors that name the kernel. Each test prints SKIPPED without a GPU
//! (and fails instead when `COMPUTE_REQUIRE` lists `cuda`).
#![cfg(feature = "cuda")]

use std::sync::Arc;

use compute_core::conformance::{compare, required, rng::Rng};
use compute_core::{Backend, BackendKind, ComputeError, MatmulSpec, Op, RowOp, UnaryOp};
use compute_ptx::CudaBackend;
use compute_ptx::cuda::GemmTier;
use compute_ptx::kernels::gemm_simt::SimtConfig;
use compute_ptx::plan::Splits;

fn backend(test: &str) -> Option<CudaBackend> {
    match CudaBackend::new() {
        Ok(b) => Some(b),
        Err(e) if !required(BackendKind::Cuda) => {
            eprintln!("SKIPPED: {test}: {e}");
            None
        }
        Err(e) => panic!("{test}: cuda is required here but unavailable: {e}"),
    }
}

fn run_tier(be: &CudaBackend, tier: GemmTier, spec: MatmulSpec, rng: &mut Rng) -> Result<(), String> {
    let a = rng.vec(spec.batch * spec.m * spec.k, -1.0, 1.0);
    let b = rng.vec(spec.batch * spec.k * spec.n, -1.0, 1.0);
    let (ta, tb) = (be.upload(&a).map_err(|e| e.to_string())?, be.upload(&b).map_err(|e| e.to_string())?);
    let tc = be.upload(&vec![f32::NAN; spec.batch * spec.m * spec.n]).map_err(|e| e.to_string())?;
    be.matmul_tier(tier, spec, &ta, &tb, &tc).map_err(|e| e.to_string())?;
    let mut out = vec![0.0; spec.batch * spec.m * spec.n];
    be.download(&tc, &mut out).map_err(|e| e.to_string())?;
    match compare(&Op::Matmul(spec), &[&a, &b], &out, 1.0) {
        None => Ok(()),
        Some(m) => Err(format!("{tier:?} {spec:?}: {m}")),
    }
}

#[test]
fn every_gemm_tier_matches_the_reference() {
    let Some(be) = backend("every_gemm_tier_matches_the_reference") else { return };
    let mut rng = Rng::new(compute_core::conformance::rng::fresh_seed());
    let d = SimtConfig::register_staged();
    let piped = SimtConfig { async_transpose: true, ..d };
    let tuned = [
        SimtConfig { async_copy: false, warp_tiled: false, ..d },
        SimtConfig { bk: 16, min_blocks: 1, ..d },
        SimtConfig { bm: 128, bn: 256, tm: 8, tn: 16, min_blocks: 1, ..d },
        SimtConfig { bm: 64, bn: 128, bk: 16, warp_tiled: false, ..d },
        SimtConfig { group_m: 0, async_copy: false, ..d },
        SimtConfig { stages: 4, ..piped },
        SimtConfig { tm: 16, tn: 8, stages: 3, min_blocks: 3, ..piped },
        SimtConfig { tm: 8, tn: 16, stages: 2, bk: 16, ..piped },
        SimtConfig { bk: 16, stages: 3, early_barrier: true, ..piped },
    ];
    let mut tiers = vec![
        GemmTier::Naive,
        GemmTier::Tiled,
        GemmTier::Simt(SimtConfig::default()),
        GemmTier::Simt(SimtConfig::thin()),
        GemmTier::Simt(SimtConfig::thin_wide()),
        GemmTier::SimtSplit(SimtConfig::split_shape(16).0, Splits::Fill(8)),
        GemmTier::SimtSplit(SimtConfig::split_shape(32).0, Splits::Fill(8)),
        GemmTier::SimtSplit(SimtConfig::thin_split(), Splits::Fill(3)),
        GemmTier::SimtSplit(SimtConfig::split_shape(128).0, Splits::Fill(8)),
        GemmTier::SimtSplit(SimtConfig::thin_wide(), Splits::Fixed(3)),
    ];
    tiers.extend(tuned.into_iter().filter(|c| *c != SimtConfig::default()).map(GemmTier::Simt));
    // (1, 40, 1030, 200): enough k for the split tiers to split.
    let shapes = [
        (1, 1, 1, 1),
        (1, 7, 13, 5),
        (3, 33, 65, 17),
        (1, 129, 257, 130),
        (1, 40, 1030, 200),
        (1, 1000, 999, 1001),
        (2, 256, 64, 384),
    ];
    let mut fails = Vec::new();
    for tier in tiers {
        for &(batch, m, k, n) in &shapes {
            // The big shape (a slow f64 reference) only for the tiers the backend picks.
            let picked = matches!(tier, GemmTier::Tiled)
                || tier == GemmTier::Simt(SimtConfig::default())
                || tier == GemmTier::Simt(SimtConfig::thin())
                || tier == GemmTier::Simt(SimtConfig::thin_wide())
                || tier == GemmTier::SimtSplit(SimtConfig::thin_split(), Splits::Fill(3));
            if m * n * k > 1 << 24 && !picked {
                continue;
            }
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                let spec = MatmulSpec { batch, trans_a: ta, trans_b: tb, ..MatmulSpec::new(m, k, n) };
                if let Err(e) = run_tier(&be, tier, spec, &mut rng) {
                    fails.push(e);
                }
            }
        }
    }
    assert!(fails.is_empty(), "{} failures:\n{}", fails.len(), fails.join("\n"));
}

/// The tensor-core tiers (`mma.sync`; `wgmma` on compute capability 9.0),
/// every shape of their sweeps, both input dtypes, every output dtype and
/// every transpose they take, on ragged and batched shapes (poisoned outputs,
/// fresh inputs each run), against the f64 reference.
#[test]
fn tensor_core_gemm_matches_the_reference() {
    use compute_ptx::kernels::gemm_mma::{self, MmaConfig};
    use compute_ptx::kernels::gemm_wgmma::{self, WgmmaConfig};
    let Some(be) = backend("tensor_core_gemm_matches_the_reference") else { return };
    let mut tiers: Vec<GemmTier> =
        std::iter::once(MmaConfig::default()).chain(gemm_mma::sweep_configs()).map(GemmTier::Mma).collect();
    let cc = be.info().expect("device info").compute_capability;
    if compute_ptx::Target::has_wgmma(cc.0, cc.1) {
        tiers.extend(std::iter::once(WgmmaConfig::default()).chain(gemm_wgmma::sweep_configs()).map(GemmTier::Wgmma));
    } else {
        eprintln!("wgmma tiers skipped: compute capability {}.{}", cc.0, cc.1);
    }
    let defaults = [GemmTier::Mma(MmaConfig::default()), GemmTier::Wgmma(WgmmaConfig::default())];
    tensor_core_tiers_match(&be, &tiers, &defaults);
}

/// The TMA-fed `wgmma` kernel (every shape of its sweep; compute capability
/// 9.0 only) against the f64 reference, as [`tensor_core_gemm_matches_the_reference`].
#[test]
fn tma_gemm_matches_the_reference() {
    use compute_ptx::kernels::gemm_tma::{self, TmaConfig};
    let Some(be) = backend("tma_gemm_matches_the_reference") else { return };
    let cc = be.info().expect("device info").compute_capability;
    if !compute_ptx::Target::has_wgmma(cc.0, cc.1) {
        eprintln!("SKIPPED: tma_gemm_matches_the_reference: compute capability {}.{}", cc.0, cc.1);
        return;
    }
    let tiers: Vec<GemmTier> =
        std::iter::once(TmaConfig::default()).chain(gemm_tma::sweep_configs()).map(GemmTier::Tma).collect();
    tensor_core_tiers_match(&be, &tiers, &[GemmTier::Tma(TmaConfig::default())]);
}

/// Products whose stored rows are not a multiple of 128 bytes, large enough
/// for the plans to copy `B` into aligned rows before the TMA kernel
/// (`gemm_tma::REALIGN_MIN_MN`), every transpose and a batch of two: equal
/// bit for bit to the `cp.async` kernel on the same operands (both add the
/// same `wgmma` products in the same order), whose accuracy the other tests
/// hold against the f64 reference. Compute capability 9.0 only.
#[test]
fn tma_gemm_realigns_rows_off_the_lines() {
    use compute_core::DType;
    use compute_core::conformance::{poisoned, typed_inputs_for};
    use compute_ptx::kernels::gemm_tma::{REALIGN_MIN_MN, TmaConfig};
    use compute_ptx::kernels::gemm_wgmma::WgmmaConfig;
    let Some(be) = backend("tma_gemm_realigns_rows_off_the_lines") else { return };
    let cc = be.info().expect("device info").compute_capability;
    if !compute_ptx::Target::has_wgmma(cc.0, cc.1) {
        eprintln!("SKIPPED: tma_gemm_realigns_rows_off_the_lines: compute capability {}.{}", cc.0, cc.1);
        return;
    }
    let mut rng = Rng::new(compute_core::conformance::rng::fresh_seed());
    let (m, n) = (REALIGN_MIN_MN + 8, REALIGN_MIN_MN + 24);
    for (batch, k, ta, tb) in
        [(1, 1000, false, true), (2, 1000, false, false), (1, 1000, true, false), (1, 1000, true, true)]
    {
        let spec = MatmulSpec { batch, trans_a: ta, trans_b: tb, ..MatmulSpec::new(m, k, n) }
            .with_dtypes(DType::BF16, DType::F32);
        let inputs = typed_inputs_for(&Op::Matmul(spec), &mut rng);
        let ta = be.upload_typed(inputs[0].as_slice()).expect("upload");
        let tb = be.upload_typed(inputs[1].as_slice()).expect("upload");
        let mut outs = Vec::new();
        for tier in [GemmTier::Tma(TmaConfig::default()), GemmTier::Wgmma(WgmmaConfig::default())] {
            let mut out = poisoned(DType::F32, batch * m * n);
            let tc = be.upload_typed(out.as_slice()).expect("upload");
            be.matmul_tier(tier, spec, &ta, &tb, &tc).expect("matmul");
            be.download_typed(&tc, out.as_mut()).expect("download");
            outs.push(out.to_f32());
        }
        let differ = outs[0].iter().zip(&outs[1]).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
        assert_eq!(differ, 0, "{spec:?}: {differ} outputs differ between the TMA and cp.async kernels");
    }
}

/// `spec` on `tier` with fresh inputs drawn in its dtypes (laid out as its
/// batch strides say) against the f64 reference: why it failed, if it did.
fn typed_tier_failure(be: &CudaBackend, tier: GemmTier, spec: MatmulSpec, rng: &mut Rng) -> Option<String> {
    use compute_core::conformance::{compare_typed, poisoned, typed_inputs_for};
    let op = Op::Matmul(spec);
    let inputs = typed_inputs_for(&op, rng);
    let run = || -> Result<compute_core::HostVec, String> {
        let e = |e: ComputeError| e.to_string();
        let ta = be.upload_typed(inputs[0].as_slice()).map_err(e)?;
        let tb = be.upload_typed(inputs[1].as_slice()).map_err(e)?;
        let mut out = poisoned(spec.out_dtype, spec.batch * spec.m * spec.n);
        let tc = be.upload_typed(out.as_slice()).map_err(e)?;
        be.matmul_tier(tier, spec, &ta, &tb, &tc).map_err(e)?;
        be.download_typed(&tc, out.as_mut()).map_err(e)?;
        Ok(out)
    };
    let views: Vec<_> = inputs.iter().map(|v| v.as_slice()).collect();
    match run() {
        Err(e) => Some(format!("{tier:?} {spec:?}: {e}")),
        Ok(out) => compare_typed(&op, &views, out.as_slice(), 1.0).map(|msg| format!("{tier:?} {spec:?}: {msg}")),
    }
}

/// Each of `tiers` on every half input and output dtype, transpose and test
/// shape (the 1000³ one only for `defaults`, output of the input's dtype).
fn tensor_core_tiers_match(be: &CudaBackend, tiers: &[GemmTier], defaults: &[GemmTier]) {
    use compute_core::DType;
    let mut rng = Rng::new(compute_core::conformance::rng::fresh_seed());
    let shapes = [
        (1, 8, 8, 8),
        (3, 40, 72, 24),
        (1, 136, 264, 520),
        (2, 256, 64, 384),
        (5, 136, 136, 264),
        (1, 1000, 1000, 1000),
    ];
    let mut fails = Vec::new();
    for &tier in tiers {
        for input in [DType::BF16, DType::F16] {
            for output in [DType::F32, DType::F16, DType::BF16] {
                for &(batch, m, k, n) in &shapes {
                    // The big shape (a slow f64 reference) only for the defaults and one output.
                    if m * n * k > 1 << 24 && (!defaults.contains(&tier) || output != input) {
                        continue;
                    }
                    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                        let spec = MatmulSpec { batch, trans_a: ta, trans_b: tb, ..MatmulSpec::new(m, k, n) }
                            .with_dtypes(input, output);
                        fails.extend(typed_tier_failure(be, tier, spec, &mut rng));
                    }
                }
            }
        }
    }
    assert!(fails.is_empty(), "{} failures:\n{}", fails.len(), fails.join("\n"));
}

/// The `wgmma` kernel reading `f32` as TF32 (`A·Bᵀ`, forced), every shape of
/// its sweep, on ragged and batched shapes, within the TF32 tolerance
/// (compute capability 9.0 only).
#[test]
fn tf32_wgmma_matches_the_reference() {
    use compute_core::Precision;
    use compute_ptx::kernels::gemm_tma::{self, TmaConfig};
    use compute_ptx::kernels::gemm_wgmma::{self, WgmmaConfig};
    let Some(be) = backend("tf32_wgmma_matches_the_reference") else { return };
    let cc = be.info().expect("device info").compute_capability;
    if !compute_ptx::Target::has_wgmma(cc.0, cc.1) {
        eprintln!("SKIPPED: tf32_wgmma_matches_the_reference: compute capability {}.{}", cc.0, cc.1);
        return;
    }
    let mut rng = Rng::new(compute_core::conformance::rng::fresh_seed());
    let mut fails = Vec::new();
    // Every shape of both sweeps that rounds (the unrounded one is for measurements).
    let rounded = gemm_wgmma::tf32_sweep_configs().into_iter().filter(|c| c.tf32 != gemm_wgmma::Tf32Rounding::None);
    let mut tiers: Vec<GemmTier> = std::iter::once(WgmmaConfig::default())
        .chain(gemm_wgmma::sweep_configs())
        .chain(rounded)
        .map(GemmTier::Wgmma)
        .collect();
    tiers.extend(std::iter::once(TmaConfig::tf32()).chain(gemm_tma::sweep_configs()).map(GemmTier::Tma));
    for rounding in [gemm_wgmma::Tf32Rounding::InShared, gemm_wgmma::Tf32Rounding::BeforeKernel] {
        tiers.push(GemmTier::Tma(TmaConfig { tf32: rounding, ..TmaConfig::tf32() }));
    }
    for &tier in &tiers {
        for (batch, m, k, n) in
            [(1, 8, 4, 8), (3, 40, 72, 24), (1, 136, 268, 520), (2, 256, 64, 384), (1, 700, 1000, 900)]
        {
            let spec = MatmulSpec { batch, trans_b: true, ..MatmulSpec::new(m, k, n) }.with_precision(Precision::Tf32);
            if let Err(e) = run_tier(&be, tier, spec, &mut rng) {
                fails.push(e);
            }
        }
    }
    // Batches spaced wider than their matrices, which the rounding passes
    // must copy at the same strides.
    for tier in tiers.into_iter().filter(|t| matches!(t, GemmTier::Tma(_))) {
        let (batch, m, k, n) = (3, 136, 72, 264);
        let spec = MatmulSpec { batch, trans_b: true, ..MatmulSpec::new(m, k, n) }
            .with_precision(Precision::Tf32)
            .with_batch_strides(m * k + 64, n * k + 128);
        fails.extend(typed_tier_failure(&be, tier, spec, &mut rng));
    }
    assert!(fails.is_empty(), "{} failures:\n{}", fails.len(), fails.join("\n"));
}

/// Every rounding mode of the TF32 `wgmma` kernels (fed by `cp.async` or by
/// TMA) rounds to nearest: with `A`
/// holding `1 + 0x1800·2⁻²³` (to nearest `1 + 2⁻¹⁰`, truncated `1`) and `B`
/// ones, every output is `k·(1 + 2⁻¹⁰)` exactly; rows 0–4 start with specials
/// the rounding keeps (NaNs whose payload fills the mantissa, ±∞, and the
/// largest `f32`, which rounds to +∞). Compute capability 9.0 only.
#[test]
fn tf32_wgmma_rounds_to_nearest() {
    use compute_core::Precision;
    use compute_ptx::kernels::gemm_tma::TmaConfig;
    use compute_ptx::kernels::gemm_wgmma::{self, Tf32Rounding};
    let Some(be) = backend("tf32_wgmma_rounds_to_nearest") else { return };
    let cc = be.info().expect("device info").compute_capability;
    if !compute_ptx::Target::has_wgmma(cc.0, cc.1) {
        eprintln!("SKIPPED: tf32_wgmma_rounds_to_nearest: compute capability {}.{}", cc.0, cc.1);
        return;
    }
    let (m, k, n) = (200, 1000, 300);
    let spec = MatmulSpec { trans_b: true, ..MatmulSpec::new(m, k, n) }.with_precision(Precision::Tf32);
    let mut host_a = vec![f32::from_bits(0x3f80_1800); m * k];
    for (row, bits) in [0x7fff_ffffu32, 0xffff_ffff, 0x7f80_0000, 0xff80_0000, 0x7f7f_ffff].into_iter().enumerate() {
        host_a[row * k] = f32::from_bits(bits);
    }
    let a = be.upload(&host_a).expect("upload");
    let b = be.upload(&vec![1.0; n * k]).expect("upload");
    let want = k as f32 * (1.0 + 2f32.powi(-10));
    let cp_async = gemm_wgmma::tf32_sweep_configs().into_iter().filter(|c| c.tf32 != Tf32Rounding::None);
    let tma = [Tf32Rounding::InShared, Tf32Rounding::BeforeKernel].map(|tf32| TmaConfig { tf32, ..TmaConfig::tf32() });
    let tiers = cp_async.map(GemmTier::Wgmma).chain([TmaConfig::tf32()].into_iter().chain(tma).map(GemmTier::Tma));
    for cfg in tiers {
        let c = be.upload(&vec![f32::NAN; m * n]).expect("upload");
        be.matmul_tier(cfg, spec, &a, &b, &c).expect("matmul");
        let mut out = vec![0.0; m * n];
        be.download(&c, &mut out).expect("download");
        for (i, &c) in out.iter().enumerate() {
            let ok = match i / n {
                0 | 1 => c.is_nan(),
                2 | 4 => c == f32::INFINITY,
                3 => c == f32::NEG_INFINITY,
                _ => c == want,
            };
            assert!(ok, "{cfg:?}: C[{}][{}] = {c}", i / n, i % n);
        }
    }
}

/// The GEMV kernels on LLM decoding shapes (1×4096·4096×4096 and
/// 4×4096·4096×14336, `B` stored `n × k` and `k × n`, `f32` and `bf16`, and
/// the 1.1 B decoder's k/v, down and LM-head shapes, and its fused shapes
/// with 9 to 16 rows), as the plans pick them, forced, and (`B` stored `n ×
/// k`) with every k-split of the CUDA-core kernel forced and, for aligned
/// half rows, every tile count and k-split of the tensor-core kernel, plus
/// ragged and batched products of every row count, against the f64
/// reference.
#[test]
fn gemv_matches_the_reference_on_llm_shapes() {
    use compute_core::DType;
    use compute_core::conformance::{compare_typed, poisoned, typed_inputs_for};
    let Some(be) = backend("gemv_matches_the_reference_on_llm_shapes") else { return };
    let mut rng = Rng::new(compute_core::conformance::rng::fresh_seed());
    let mut cases = Vec::new();
    for (m, k, n) in [(1, 4096, 4096), (4, 4096, 14336)] {
        for dtype in [DType::F32, DType::BF16] {
            for trans_b in [true, false] {
                cases.push((1, m, k, n, trans_b, dtype, dtype));
            }
        }
    }
    for (m, k, n) in [(1, 2048, 512), (1, 8192, 2048), (8, 8192, 2048), (1, 2048, 32000)] {
        cases.push((1, m, k, n, true, DType::BF16, DType::BF16));
    }
    for (m, k, n) in [(16, 2048, 3072), (12, 8192, 2048), (9, 2048, 8192)] {
        cases.push((1, m, k, n, true, DType::BF16, DType::BF16));
    }
    for m in 1..=16 {
        cases.push((1, m, 999, 1001, m % 2 == 0 || m > 8, DType::F16, DType::F32));
        cases.push((3, m, 1032, 72, m % 2 == 1 || m > 8, DType::BF16, DType::BF16));
    }
    let mut fails = Vec::new();
    for (batch, m, k, n, trans_b, input, output) in cases {
        let spec = MatmulSpec { batch, trans_b, ..MatmulSpec::new(m, k, n) }.with_dtypes(input, output);
        assert_eq!(GemmTier::choose(&spec, false), GemmTier::Gemv, "{spec:?}");
        let op = Op::Matmul(spec);
        let inputs = typed_inputs_for(&op, &mut rng);
        let views: Vec<_> = inputs.iter().map(|v| v.as_slice()).collect();
        let mut tiers = vec![None, Some(GemmTier::Gemv)];
        if trans_b {
            use compute_ptx::kernels::gemv::{MMA_TILES, NT_SPLITS};
            tiers.extend(NT_SPLITS.map(|s| Some(GemmTier::GemvSplit(s))));
            if input != DType::F32 && k % 8 == 0 {
                for t in MMA_TILES {
                    tiers.extend(NT_SPLITS.map(|s| Some(GemmTier::GemvMma(t, s))));
                }
            }
            if m * k * n > 1 << 26 {
                // Large products: the plans' shapes and one of each other kind.
                tiers.retain(|t| {
                    matches!(t, None | Some(GemmTier::Gemv | GemmTier::GemvSplit(4) | GemmTier::GemvMma(2, 2)))
                });
            }
        }
        for forced in tiers {
            let run = || -> Result<compute_core::HostVec, String> {
                let e = |e: ComputeError| e.to_string();
                let mut out = poisoned(output, batch * m * n);
                if let Some(tier) = forced {
                    let ta = be.upload_typed(inputs[0].as_slice()).map_err(e)?;
                    let tb = be.upload_typed(inputs[1].as_slice()).map_err(e)?;
                    let tc = be.upload_typed(out.as_slice()).map_err(e)?;
                    be.matmul_tier(tier, spec, &ta, &tb, &tc).map_err(e)?;
                    be.download_typed(&tc, out.as_mut()).map_err(e)?;
                } else {
                    be.run_typed(&op, &views, out.as_mut()).map_err(e)?;
                }
                Ok(out)
            };
            match run() {
                Err(e) => fails.push(format!("{spec:?} forced {forced:?}: {e}")),
                Ok(out) => {
                    if let Some(msg) = compare_typed(&op, &views, out.as_slice(), 1.0) {
                        fails.push(format!("{spec:?} forced {forced:?}: {msg}"));
                    }
                }
            }
        }
    }
    assert!(fails.is_empty(), "{} failures:\n{}", fails.len(), fails.join("\n"));
}

#[test]
fn pooled_allocations_back_tensors() {
    let Some(be) = backend("pooled_allocations_back_tensors") else { return };
    let mut rng = Rng::new(7);
    let alloc = be.alloc_bytes(4096).expect("alloc");
    assert_eq!(alloc.bytes(), 4096);
    let x = rng.vec(1000, -3.0, 3.0);
    let tx = be.upload(&x).expect("upload");
    let ty = be.tensor_in(alloc.clone(), 1000).expect("tensor over the pooled allocation");
    assert_eq!(Arc::strong_count(&alloc), 2);
    be.run_tensors(&Op::unary(UnaryOp::Relu, 1000), &[&tx], &ty).expect("relu");
    let mut y = vec![0.0; 1000];
    be.download(&ty, &mut y).expect("download");
    assert!(x.iter().zip(&y).all(|(a, b)| a.max(0.0) == *b));
    drop(ty);
    assert_eq!(Arc::strong_count(&alloc), 1, "the pool can reuse the allocation once the tensor is gone");
    match be.tensor_in(alloc, 1025) {
        Err(ComputeError::Shape { .. }) => {}
        other => panic!("a tensor larger than its allocation must be refused, got {other:?}"),
    }
}

#[test]
fn prepare_loads_the_kernels_of_its_ops() {
    let Some(be) = backend("prepare_loads_the_kernels_of_its_ops") else { return };
    let ops = [
        Op::unary(UnaryOp::Elu { alpha: 0.7 }, 1000),
        Op::rows(RowOp::LogSoftmax, 3, 5000),
        Op::matmul(33, 17, 65),
        Op::Conv2d(compute_core::Conv2dSpec::same(3, 9, 4, 3)),
    ];
    // An op with invalid shapes is skipped, not an error.
    let mut with_bad = ops.to_vec();
    with_bad.push(Op::matmul(0, 4, 4));
    be.prepare(&with_bad).unwrap();
    assert!(be.is_prepared(&ops).unwrap());
    let mut rng = Rng::new(21);
    for op in &ops {
        let layout = op.layout().unwrap();
        let ins: Vec<Vec<f32>> = layout.input_lens().map(|n| rng.vec(n, -1.0, 1.0)).collect();
        let refs: Vec<&[f32]> = ins.iter().map(Vec::as_slice).collect();
        let mut out = vec![f32::NAN; layout.output_len()];
        be.run(op, &refs, &mut out).unwrap();
        assert!(compare(op, &refs, &out, 1.0).is_none(), "{op:?}");
    }
}

#[test]
fn completion_follows_queued_work() {
    let Some(be) = backend("completion_follows_queued_work") else { return };
    let mut rng = Rng::new(9);
    let n = 1024;
    let a = rng.vec(n * n, -1.0, 1.0);
    let (ta, tb, tc) = (be.upload(&a).unwrap(), be.upload(&a).unwrap(), be.alloc(n * n).unwrap());
    for _ in 0..20 {
        be.run_tensors(&Op::matmul(n, n, n), &[&ta, &tb], &tc).unwrap();
    }
    let done = be.record_completion().unwrap();
    done.wait().unwrap();
    assert!(done.is_complete().unwrap());
    let mut c = vec![0.0; n * n];
    be.download(&tc, &mut c).unwrap();
    assert!(compare(&Op::matmul(n, n, n), &[&a, &a], &c, 1.0).is_none());
}

#[test]
fn long_device_chains_stay_on_the_device() {
    let Some(be) = backend("long_device_chains_stay_on_the_device") else { return };
    let mut rng = Rng::new(11);
    let (rows, cols) = (300, 1500);
    let x = rng.vec(rows * cols, -2.0, 2.0);
    let t0 = be.upload(&x).unwrap();
    let t1 = be.alloc(rows * cols).unwrap();
    // softmax(softmax(…)) 50 times on the device, then once on the host path for comparison.
    let op = Op::rows(RowOp::Softmax, rows, cols);
    let (mut src, mut dst) = (&t0, &t1);
    let mut host = x.clone();
    for _ in 0..50 {
        be.run_tensors(&op, &[src], dst).unwrap();
        std::mem::swap(&mut src, &mut dst);
        let mut next = vec![0.0; rows * cols];
        be.run(&op, &[&host], &mut next).unwrap();
        host = next;
    }
    let mut got = vec![0.0; rows * cols];
    be.download(src, &mut got).unwrap();
    assert_eq!(got, host, "device chain and host path run the same kernels on the same data");
    assert!((got.iter().take(cols).map(|v| *v as f64).sum::<f64>() - 1.0).abs() < 1e-4);
}

#[test]
fn tensors_of_other_devices_are_refused() {
    let Some(be) = backend("tensors_of_other_devices_are_refused") else { return };
    let cpu = compute_core::Tensor::from_storage(Arc::new(Foreign));
    let out = be.alloc(4).unwrap();
    match be.run_tensors(&Op::unary(UnaryOp::Relu, 4), &[&cpu], &out) {
        Err(ComputeError::WrongDevice { .. }) => {}
        other => panic!("expected WrongDevice, got {other:?}"),
    }
}

#[derive(Debug)]
struct Foreign;
impl compute_core::TensorStorage for Foreign {
    fn len(&self) -> usize {
        4
    }
    fn dtype(&self) -> compute_core::DType {
        compute_core::DType::F32
    }
    fn location(&self) -> compute_core::Location {
        compute_core::Location { backend: BackendKind::Simd, device: 0 }
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[test]
fn device_info_is_sane() {
    let Some(be) = backend("device_info_is_sane") else { return };
    let info = be.info().unwrap();
    assert!(info.multiprocessors > 0);
    assert!(info.memory_total >= info.memory_free && info.memory_free > 0);
    assert!(info.driver_version.0 >= 12, "{info:?}");
    eprintln!("{info:?}");
}

#[test]
fn async_names_match_the_blocking_ones() {
    let Some(be) = backend("async_names_match_the_blocking_ones") else { return };
    let mut rng = Rng::new(compute_core::conformance::rng::fresh_seed());
    compute_core::conformance::check_async_ops(&be, &mut rng).unwrap();
}

/// Half tensors round-trip as their bytes, run the kernels of their dtype
/// (relu on 8-value units with a tail, here against the exact answer), keep a
/// wrong-dtype call out with `DType`, and a cast to the same dtype copies every bit.
#[test]
fn half_tensors_are_stored_computed_and_copied() {
    use compute_core::{DType, HostVec, Ops, bf16};
    let Some(be) = backend("half_tensors_are_stored_computed_and_copied") else { return };
    let mut rng = Rng::new(31);
    for len in [7, (1 << 20) + 3] {
        for dtype in [DType::F16, DType::BF16] {
            let data = HostVec::from_f32(dtype, &rng.vec(len, -100.0, 100.0));
            let t = be.upload_typed(data.as_slice()).unwrap();
            assert_eq!((t.len(), t.dtype()), (len, dtype));
            let mut back = HostVec::zeros(dtype, len);
            be.download_typed(&t, back.as_mut()).unwrap();
            assert_eq!(back.bits(), data.bits(), "{dtype} x {len}");
            let out = be.alloc_typed(len, dtype).unwrap();
            be.copy(&t, &out).unwrap();
            be.download_typed(&out, back.as_mut()).unwrap();
            assert_eq!(back.bits(), data.bits(), "{dtype} x {len} device copy");
            let relu = Op::unary(UnaryOp::Relu, len);
            assert!(matches!(be.run_tensors(&relu, &[&t], &out), Err(ComputeError::DType { .. })));
            be.run_tensors(&relu.with_dtype(dtype), &[&t], &out).unwrap();
            be.download_typed(&out, back.as_mut()).unwrap();
            // relu of a half is exact: the value itself or +0.
            let want: Vec<f32> = data.to_f32().into_iter().map(|v| v.max(0.0)).collect();
            assert_eq!(back.to_f32(), want, "{dtype} x {len} relu");
        }
    }
    let x: Vec<bf16> = rng.vec(33, -2.0, 2.0).into_iter().map(bf16::from_f32).collect();
    let mut out = vec![bf16::from_bits(0x7fed); 33];
    be.relu(&x, &mut out).unwrap();
    assert!(out.iter().zip(&x).all(|(o, v)| o.to_f32() == v.to_f32().max(0.0)), "host relu");
    let mut v = rng.vec(4099, -1e30, 1e30);
    v[..4].copy_from_slice(&[f32::from_bits(0x7fc0_1234), 1e-45, -0.0, f32::INFINITY]);
    let cast = Op::cast(v.len(), DType::F32, DType::F32);
    let mut copied = vec![f32::NAN; v.len()];
    be.run(&cast, &[&v], &mut copied).unwrap();
    assert!(copied.iter().zip(&v).all(|(a, b)| a.to_bits() == b.to_bits()), "host cast");
    let (tv, to) = (be.upload(&v).unwrap(), be.alloc(v.len()).unwrap());
    be.run_tensors(&cast, &[&tv], &to).unwrap();
    let mut back = vec![0.0; v.len()];
    be.download(&to, &mut back).unwrap();
    assert!(back.iter().zip(&v).all(|(a, b)| a.to_bits() == b.to_bits()), "tensor cast");
}

/// The tensor-core attention kernels (`mma.sync`, and `wgmma` on compute
/// capability 9.0) in every shape of their sweeps, both half dtypes and
/// f32 (TF32 opted in: the bf16x3 form), on odd lengths, both causal alignments, grouped heads and a
/// decode shape (poisoned outputs, fresh inputs each run), against the f64
/// reference. Run under `compute-sanitizer --tool racecheck` it checks the
/// `cp.async` waits and barriers of every shape.
#[test]
fn flash_attention_shapes_match_the_reference() {
    use compute_core::conformance::{compare_typed, poisoned, typed_inputs_for};
    use compute_core::{AttentionSpec, DType, Mask};
    use compute_ptx::kernels::attention::FlashConfig;
    use compute_ptx::kernels::attention_wgmma::HopperConfig;
    use compute_ptx::plan::AttentionKernel;
    let Some(be) = backend("flash_attention_shapes_match_the_reference") else { return };
    let cc = be.info().expect("device info").compute_capability;
    let hopper = compute_ptx::Target::has_wgmma(cc.0, cc.1);
    let mut rng = Rng::new(compute_core::conformance::rng::fresh_seed());
    let specs = [
        AttentionSpec::new(2, 4, 100, 300, 64).with_kv_heads(2).causal(),
        AttentionSpec::new(1, 2, 257, 129, 128).with_mask(Mask::CausalTopLeft),
        AttentionSpec::new(3, 8, 1, 1000, 128).with_kv_heads(2).causal(),
        AttentionSpec::new(1, 2, 200, 200, 64),
        AttentionSpec::new(1, 1, 64, 96, 96).causal(),
        // A KV cache of larger capacity: the TMA maps step heads by it and stop at seq_k.
        AttentionSpec::new(1, 2, 33, 70, 128).causal().with_kv_capacity(96),
    ];
    let mut fails = Vec::new();
    for spec in specs {
        let mut cfgs = vec![FlashConfig::for_head_dim(spec.head_dim)];
        cfgs.extend(FlashConfig::sweep(spec.head_dim));
        cfgs.push(FlashConfig::for_decode(spec.head_dim));
        cfgs.extend(FlashConfig::decode_sweep(spec.head_dim));
        cfgs.push(FlashConfig::for_f32(spec.head_dim));
        let mut kernels: Vec<AttentionKernel> = cfgs.into_iter().map(AttentionKernel::Flash).collect();
        if hopper && HopperConfig::fits(spec.head_dim) {
            kernels.push(AttentionKernel::Hopper(HopperConfig::for_head_dim(spec.head_dim)));
            kernels.extend(HopperConfig::sweep(spec.head_dim).into_iter().map(AttentionKernel::Hopper));
        }
        for cfg in kernels {
            for dtype in [DType::BF16, DType::F16, DType::F32] {
                // f32 data with TF32 opted in runs the bf16x3 form (q from shared memory only).
                let takes_f32 = matches!(cfg, AttentionKernel::Flash(c) if c.check_f32().is_ok());
                if dtype == DType::F32 && !takes_f32 {
                    continue;
                }
                let spec = spec.with_dtype(dtype).with_precision(compute_core::Precision::Tf32);
                let op = Op::Attention(spec);
                let inputs = typed_inputs_for(&op, &mut rng);
                let run = || -> Result<compute_core::HostVec, String> {
                    let e = |e: ComputeError| e.to_string();
                    let t: Vec<_> =
                        inputs.iter().map(|x| be.upload_typed(x.as_slice())).collect::<Result<_, _>>().map_err(e)?;
                    let mut out = poisoned(dtype, inputs[0].len());
                    let o = be.upload_typed(out.as_slice()).map_err(e)?;
                    be.attention_with(spec, Some(cfg), (&t[0], &t[1], &t[2]), &o).map_err(e)?;
                    be.download_typed(&o, out.as_mut()).map_err(e)?;
                    Ok(out)
                };
                let views: Vec<_> = inputs.iter().map(|v| v.as_slice()).collect();
                match run() {
                    Err(e) => fails.push(format!("{cfg:?} {}: {e}", op.shapes())),
                    Ok(out) => {
                        if let Some(msg) = compare_typed(&op, &views, out.as_slice(), 1.0) {
                            fails.push(format!("{cfg:?} {}: {msg}", op.shapes()));
                        }
                    }
                }
            }
        }
    }
    assert!(fails.is_empty(), "{} failures:\n{}", fails.len(), fails.join("\n"));
}

/// The TMA-fed Hopper attention schedules alone (producer warpgroup,
/// `mbarrier` rings), both half dtypes, on odd lengths, both causal
/// alignments, grouped heads, a KV cache of larger capacity, one query row
/// per sequence and blocks whose keys end inside a tile (poisoned outputs), against the f64
/// reference: small enough to run under `compute-sanitizer --tool racecheck`
/// and `--tool synccheck`, which check the rings' waits and releases.
/// Skipped below compute capability 9.0.
#[test]
fn hopper_tma_attention_matches_the_reference() {
    use compute_core::conformance::{compare_typed, poisoned, typed_inputs_for};
    use compute_core::{AttentionSpec, DType, Mask};
    use compute_ptx::kernels::attention_wgmma::HopperConfig;
    use compute_ptx::plan::AttentionKernel;
    let Some(be) = backend("hopper_tma_attention_matches_the_reference") else { return };
    let cc = be.info().expect("device info").compute_capability;
    if !compute_ptx::Target::has_wgmma(cc.0, cc.1) {
        eprintln!("SKIPPED: hopper_tma_attention_matches_the_reference: compute capability {cc:?}");
        return;
    }
    let mut rng = Rng::new(compute_core::conformance::rng::fresh_seed());
    let specs = [
        AttentionSpec::new(2, 4, 100, 300, 64).with_kv_heads(2).causal(),
        AttentionSpec::new(1, 2, 257, 129, 128).with_mask(Mask::CausalTopLeft),
        AttentionSpec::new(1, 2, 33, 70, 128).causal().with_kv_capacity(96),
        AttentionSpec::new(2, 2, 300, 520, 128),
        AttentionSpec::new(3, 8, 1, 1000, 128).with_kv_heads(2).causal(),
    ];
    let mut fails = Vec::new();
    let mut runs = 0;
    for spec in specs {
        let d = spec.head_dim;
        let mut cfgs = vec![HopperConfig::for_head_dim(d)];
        cfgs.extend(HopperConfig::sweep(d));
        cfgs.retain(|c| c.schedule.uses_tma());
        for cfg in cfgs {
            for dtype in [DType::BF16, DType::F16] {
                let spec = spec.with_dtype(dtype);
                let op = Op::Attention(spec);
                let inputs = typed_inputs_for(&op, &mut rng);
                let run = || -> Result<compute_core::HostVec, String> {
                    let e = |e: ComputeError| e.to_string();
                    let t: Vec<_> =
                        inputs.iter().map(|x| be.upload_typed(x.as_slice())).collect::<Result<_, _>>().map_err(e)?;
                    let mut out = poisoned(dtype, inputs[0].len());
                    let o = be.upload_typed(out.as_slice()).map_err(e)?;
                    be.attention_with(spec, Some(AttentionKernel::Hopper(cfg)), (&t[0], &t[1], &t[2]), &o)
                        .map_err(e)?;
                    be.download_typed(&o, out.as_mut()).map_err(e)?;
                    Ok(out)
                };
                let views: Vec<_> = inputs.iter().map(|v| v.as_slice()).collect();
                runs += 1;
                match run() {
                    Err(e) => fails.push(format!("{cfg:?} {}: {e}", op.shapes())),
                    Ok(out) => {
                        if let Some(msg) = compare_typed(&op, &views, out.as_slice(), 1.0) {
                            fails.push(format!("{cfg:?} {}: {msg}", op.shapes()));
                        }
                    }
                }
            }
        }
    }
    assert!(runs >= 16, "{runs} runs: the sweep lost its TMA shapes");
    assert!(fails.is_empty(), "{} failures:\n{}", fails.len(), fails.join("\n"));
}
