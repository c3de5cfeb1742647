//! The whole public API on the CPU only (what a machine without a GPU, or a
//! build with `--no-default-features`, gets), plus fallback and policies with
//! fake GPU engines.
mod common;

use common::{FakeGpu, assert_matches_reference, data, gpu_always_wins};
use compute_core::{Backend, BackendKind, BinaryOp, ComputeError, GeluForm, Op, Ops, RowOp, UnaryOp};
use compute_simd::SimdBackend;
use dispatch::calibrate::{self, Options};
use dispatch::profile::CurveKey;
use dispatch::{
    BackendSelector, Compute, Engine, HybridScheduler, Placement, Policy, SelectedBackend, crossover_threshold,
};

fn cpu() -> Compute {
    Compute::builder().cpu().nominal_profile().build().unwrap()
}

#[test]
fn cpu_only_compute_reports_its_engines_and_the_last_one_used() {
    let c = cpu();
    assert!(!c.is_gpu());
    assert_eq!(c.backends(), vec![BackendKind::Simd]);
    assert!(c.engines().contains(&Engine::Simd));
    assert_eq!(c.kind(), BackendKind::Simd);
    assert_eq!(c.last_engine(), None);
    let x = data(1, 1000);
    let mut out = vec![f32::NAN; 1000];
    c.sigmoid(&x, &mut out).unwrap();
    assert_matches_reference(&Op::unary(UnaryOp::Sigmoid, 1000), &[&x], &out);
    let last = c.last_engine().unwrap();
    assert!(!last.is_gpu());
    assert_eq!(c.last_backend(), Some(BackendKind::Simd));
    assert!(c.device_name().contains("simd"));
}

#[test]
fn host_and_tensor_paths_agree_for_a_chain() {
    let c = cpu();
    let (m, k, n) = (19, 23, 17);
    let a = data(2, m * k);
    let b = data(3, k * n);
    let ta = c.upload(&a).unwrap();
    let tb = c.upload(&b).unwrap();
    let tc = c.apply(&Op::matmul(m, k, n), &[&ta, &tb]).unwrap();
    let tg = c.apply(&Op::unary(UnaryOp::Gelu(GeluForm::Erf), m * n), &[&tc]).unwrap();
    let ts = c.apply(&Op::rows(RowOp::Softmax, m, n), &[&tg]).unwrap();
    let mut dev = vec![f32::NAN; m * n];
    c.download(&ts, &mut dev).unwrap();

    let mut host_c = vec![0.0; m * n];
    c.matmul(&a, &b, &mut host_c, m, k, n).unwrap();
    assert_matches_reference(&Op::matmul(m, k, n), &[&a, &b], &host_c);
    let host_g = c.run_vec(&Op::unary(UnaryOp::Gelu(GeluForm::Erf), m * n), &[&host_c]).unwrap();
    let mut host_s = vec![0.0; m * n];
    c.softmax(&host_g, m, n, &mut host_s).unwrap();
    assert_eq!(dev, host_s, "same engine family, same kernels: bit-identical");
}

#[test]
fn shape_errors_are_typed_and_leave_the_output_alone() {
    let c = cpu();
    let x = data(4, 10);
    let mut out = vec![7.0f32; 9];
    match c.relu(&x, &mut out) {
        Err(ComputeError::Shape { op: "relu", .. }) => {}
        other => panic!("expected a Shape error naming relu, got {other:?}"),
    }
    assert!(out.iter().all(|&v| v == 7.0));
    assert!(matches!(c.run_async(Op::matmul(2, 3, 4), vec![x.clone(), x.clone()]), Err(ComputeError::Shape { .. })));
}

#[test]
fn run_async_returns_the_right_values() {
    let c = cpu();
    let (a, b) = (data(5, 64 * 32), data(6, 32 * 48));
    let r = c.run_async(Op::matmul(64, 32, 48), vec![a.clone(), b.clone()]).unwrap();
    let out = r.wait().unwrap();
    assert_matches_reference(&Op::matmul(64, 32, 48), &[&a, &b], &out);
}

#[test]
fn command_batch_runs_the_chain_once_and_reads_every_buffer() {
    let c = cpu();
    let x = data(7, 300);
    let w = data(8, 300);
    let mut batch = c.batch();
    let bx = batch.upload(&x);
    let bw = batch.upload(&w);
    let r = batch.relu(bx).unwrap();
    let s = batch.scale(r, -1.5).unwrap();
    let p = batch.mul(s, bw).unwrap();
    let sm = batch.softmax(p, 3, 100).unwrap();
    assert!(batch.read(sm).is_err(), "reading before execute is an error");
    let short = batch.upload(&[1.0; 7]);
    assert!(batch.add(bx, short).is_err(), "shape checked when recorded");
    let engine = batch.execute().unwrap();
    assert!(!engine.is_gpu());
    assert_eq!(batch.engine(), Some(engine));
    let relu: Vec<f32> = x.iter().map(|v| v.max(0.0)).collect();
    assert_eq!(batch.read(r).unwrap(), relu);
    let scaled: Vec<f32> = relu.iter().map(|v| v * -1.5).collect();
    assert_eq!(batch.read(s).unwrap(), scaled);
    let prod: Vec<f32> = scaled.iter().zip(&w).map(|(a, b)| a * b).collect();
    assert_eq!(batch.read(p).unwrap(), prod);
    assert_matches_reference(&Op::rows(RowOp::Softmax, 3, 100), &[&prod], &batch.read(sm).unwrap());
    // Outputs came from the engine's pool; a second execute reuses them.
    let before = c.pool_stats(engine);
    batch.execute().unwrap();
    let after = c.pool_stats(engine);
    assert_eq!(after.hits, before.hits + 4, "{before:?} -> {after:?}");
    assert_eq!(after.misses, before.misses, "{before:?} -> {after:?}");
}

#[test]
fn hybrid_scheduler_on_the_cpu() {
    let s = HybridScheduler::from_compute(cpu(), None);
    assert_eq!(s.threshold(), u64::MAX, "no GPU: the crossover never comes");
    assert!(!s.should_use_gpu(4096, 4096, 4096));
    let (m, k, n) = (33, 20, 27);
    let (a, b) = (data(9, m * k), data(10, k * n));
    let op = Op::matmul(m, k, n);
    assert_matches_reference(&op, &[&a, &b], &s.matmul(&a, &b, m, k, n).unwrap());
    let p1 = s.matmul_pooled(&a, &b, m, k, n).unwrap();
    assert!(s.matmul_pooled(&b, &a, m, k, n).is_err(), "swapped inputs have the wrong lengths");
    let p3 = s.matmul_pooled(&a, &b, m, k, n).unwrap();
    assert_matches_reference(&op, &[&a, &b], &p1);
    assert_eq!(p1, p3);
    let stats = s.pool_stats();
    assert_eq!(stats.hits + stats.misses, 2, "{stats:?}");
    assert_eq!(stats.hits, 1, "the second call of the same shape reuses the output buffer: {stats:?}");
    assert!((stats.hit_rate() - 0.5).abs() < 1e-12);
    let r = s.matmul_async(&a, &b, m, k, n).unwrap();
    assert_matches_reference(&op, &[&a, &b], &r.wait().unwrap());
    let batch = vec![
        (a.clone(), b.clone(), m, k, n),
        (data(11, 4 * 5), data(12, 5 * 6), 4, 5, 6),
        (data(13, m * k), data(14, k * n), m, k, n),
    ];
    let results = s.matmul_batch(&batch).unwrap();
    assert_eq!(results.len(), 3);
    for ((a, b, m, k, n), out) in batch.iter().zip(&results) {
        assert_matches_reference(&Op::matmul(*m, *k, *n), &[a, b], out);
    }
    let bad = vec![(a.clone(), b.clone(), m, k, n), (vec![1.0; 3], vec![1.0; 3], 2, 2, 2)];
    let err = s.matmul_batch(&bad).unwrap_err().to_string();
    assert!(err.contains("batch entry 1"), "{err}");
}

#[test]
fn a_failing_gpu_falls_back_to_the_cpu() {
    let c = Compute::builder()
        .cpu()
        .engine(Engine::Cuda, FakeGpu::arc(BackendKind::Cuda, true))
        .profile(gpu_always_wins(Engine::Cuda))
        .build()
        .unwrap();
    assert!(c.is_gpu());
    assert_eq!(c.backends(), vec![BackendKind::Cuda, BackendKind::Simd]);
    let op = Op::binary(BinaryOp::Add, 500);
    assert_eq!(c.choose(&op, Placement::Host), Engine::Cuda);
    let (a, b) = (data(15, 500), data(16, 500));
    let out = c.run_vec(&op, &[&a, &b]).unwrap();
    assert_matches_reference(&op, &[&a, &b], &out);
    assert_eq!(c.last_engine(), Some(Engine::Simd), "ran on the CPU after the GPU failed");
    // The same through the scheduler, the async path and a batch.
    let s = HybridScheduler::from_compute(c.clone(), Some(1));
    assert!(s.should_use_gpu(2, 2, 2));
    let (ma, mb) = (data(17, 6), data(18, 6));
    assert_matches_reference(&Op::matmul(2, 3, 2), &[&ma, &mb], &s.matmul(&ma, &mb, 2, 3, 2).unwrap());
    assert_matches_reference(
        &Op::matmul(2, 3, 2),
        &[&ma, &mb],
        &s.matmul_async(&ma, &mb, 2, 3, 2).unwrap().wait().unwrap(),
    );
    assert_matches_reference(&op, &[&a, &b], &c.run_async(op, vec![a.clone(), b.clone()]).unwrap().wait().unwrap());
}

#[test]
fn policies_route_as_specified() {
    let gpu = FakeGpu::arc(BackendKind::Wgpu, false);
    let c = Compute::builder().cpu().engine(Engine::Wgpu, gpu).profile(gpu_always_wins(Engine::Wgpu)).build().unwrap();
    let small = Op::matmul(8, 8, 8); // 512 < 1000
    let big = Op::matmul(16, 16, 16); // 4096 ≥ 1000
    let threshold = c.with_policy(Policy::Threshold(dispatch::FIXED_THRESHOLD));
    assert_eq!(threshold.choose(&small, Placement::Host), Engine::Simd);
    assert_eq!(threshold.choose(&big, Placement::Host), Engine::Wgpu);
    let five = c.with_policy(Policy::FiveX(BackendSelector::new()));
    assert_eq!(BackendSelector::new().select_for_matmul(2048, 2048, 2048), SelectedBackend::Simd);
    assert_eq!(five.choose(&Op::matmul(2048, 2048, 2048), Placement::Host), Engine::Simd);
    assert_eq!(five.choose(&Op::matmul(20_000, 20_000, 20_000), Placement::Host), Engine::Wgpu);
    let fixed = c.with_policy(Policy::Fixed(Engine::Cuda));
    assert_eq!(fixed.choose(&big, Placement::Host), Engine::Simd, "an absent engine falls back to the CPU");
    assert_eq!(c.choose(&small, Placement::Host), Engine::Wgpu, "auto follows the profile");
    // The fake GPU is the CPU underneath: whatever runs, results are right.
    let (a, b) = (data(19, 256), data(20, 256));
    for comp in [&threshold, &five, &fixed, &c] {
        assert_matches_reference(&big, &[&a, &b], &comp.run_vec(&big, &[&a, &b]).unwrap());
    }
    assert_eq!(c.last_engine(), Some(Engine::Wgpu));
    // With the GPU always predicted faster, the scheduler's measured threshold is the smallest matmul.
    assert_eq!(crossover_threshold(&c), 1);
}

#[test]
fn profile_is_measured_saved_reused_and_keyed_by_machine() {
    let dir = std::env::temp_dir().join(format!("dispatch-profile-test-{}", std::process::id()));
    let path = dir.join("profile.json");
    let _ = std::fs::remove_file(&path);
    let build = || Compute::builder().cpu().calibration_options(Options::quick()).profile_path(&path).build().unwrap();
    let first = build();
    assert!(first.profile().calibrated);
    assert!(path.exists(), "saved to the given path");
    let saved = std::fs::read_to_string(&path).unwrap();
    assert!(saved.contains("\"launch_s\""));
    for e in first.engines() {
        let p = first.profile().engine(e).expect("every engine profiled");
        assert!(p.launch_s > 0.0 && p.launch_s < 0.1, "{p:?}");
        assert!(p.link.is_none(), "CPU engines have no bus");
        let keys: Vec<CurveKey> = p.classes.iter().map(|c| c.key()).collect();
        assert_eq!(keys, dispatch::calibrate::LADDERS, "every ladder measured on the CPU, f32 and bf16");
        for c in &p.classes {
            assert!(c.points.len() >= 2, "{:?}", c);
            assert!(c.points.iter().all(|pt| pt.seconds > 0.0 && pt.seconds.is_finite()));
        }
    }
    // Each step's wall time: prepare, launch, then one per class (no links on the CPU).
    let steps: Vec<&str> = first.profile().timings.iter().map(|t| t.step.as_str()).collect();
    assert_eq!(
        steps,
        [
            "prepare",
            "launch",
            "Elementwise",
            "Transcendental",
            "Reduction",
            "RowWise",
            "Matmul",
            "Conv",
            "Elementwise bf16",
            "RowWise bf16",
            "Matmul bf16"
        ]
    );
    assert!(first.profile().timings.iter().all(|t| t.seconds >= 0.0 && t.seconds < 60.0));
    // Preparing ops is harmless on engines with nothing to compile.
    first.prepare(&[Op::matmul(8, 8, 8), Op::matmul(0, 1, 1)]).unwrap();
    let second = build();
    assert_eq!(second.profile(), first.profile(), "reused from the cache, not measured again");
    // A profile of another machine (other key) is not reused.
    let mut other = first.profile().clone();
    other.key = "another machine".into();
    other.created_unix_s = 1;
    calibrate::save(&other, &path).unwrap();
    let third = build();
    assert_eq!(third.profile().key, first.profile().key);
    assert_ne!(third.profile().created_unix_s, 1);
    assert!(calibrate::load(&path, "another machine").is_none(), "the file was replaced with this machine's");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tensors_from_another_engine_are_moved_to_the_output_device() {
    // A second CPU backend stands in for "another device" only by instance:
    // host tensors work with both, so the call must simply succeed and be right.
    let c = cpu();
    let other = SimdBackend::with_threads(1).unwrap();
    let x = data(21, 64);
    let tx = other.upload(&x).unwrap();
    let out = c.alloc(64).unwrap();
    c.run_tensors(&Op::unary(UnaryOp::Relu, 64), &[&tx], &out).unwrap();
    let mut back = vec![0.0; 64];
    c.download(&out, &mut back).unwrap();
    assert_eq!(back, x.iter().map(|v| v.max(0.0)).collect::<Vec<_>>());
}

#[test]
fn every_discovered_engine_runs_and_is_reported() {
    // On this machine only the CPU may be present; on a GPU machine (or with
    // lavapipe) the GPU engines are exercised too, each called directly.
    let c = Compute::builder().discover().nominal_profile().build().unwrap();
    let probe = dispatch::discover::probe();
    for f in &probe {
        assert_eq!(f.backend.is_ok(), c.engines().contains(&f.engine), "{f:?}");
    }
    assert!(c.engines().contains(&Engine::Simd), "the CPU is always there");
    assert_eq!(c.is_gpu(), c.engines().iter().any(|e| e.is_gpu()));
    assert_eq!(c.primary(), c.engines()[0]);
    let op = Op::rows(RowOp::LayerNorm { eps: 1e-5 }, 7, 33);
    let (x, g, b) = (data(30, 7 * 33), data(31, 33), data(32, 33));
    for e in c.engines() {
        let mut out = vec![f32::NAN; 7 * 33];
        c.run_on(e, &op, &[&x, &g, &b], &mut out).unwrap();
        assert_matches_reference(&op, &[&x, &g, &b], &out);
        assert_eq!(c.last_engine(), Some(e));
    }
}

#[test]
fn gpu_devices_are_opened_once_and_shared() {
    // Every probe after the first hands out the same devices: many `Compute`s
    // in one process must not each open (and hold) a device of their own. On
    // the NVIDIA machine, ~50 probes that each opened a device left wgpu with
    // no Vulkan adapter; this also guards that.
    let first: Vec<(Engine, Result<String, String>)> = dispatch::discover::probe()
        .into_iter()
        .map(|f| (f.engine, f.backend.map(|b| b.device_name()).map_err(|e| e.to_string())))
        .collect();
    for _ in 0..64 {
        let again: Vec<(Engine, Result<String, String>)> = dispatch::discover::probe()
            .into_iter()
            .map(|f| (f.engine, f.backend.map(|b| b.device_name()).map_err(|e| e.to_string())))
            .collect();
        assert_eq!(again, first);
    }
    let a = Compute::builder().discover().nominal_profile().build().unwrap();
    let b = Compute::builder().discover().nominal_profile().build().unwrap();
    assert_eq!(a.engines(), b.engines());
}

#[test]
fn async_names_match_the_blocking_ones() {
    let mut rng = compute_core::rng::Rng::new(compute_core::rng::fresh_seed());
    compute_core::conformance::check_async_ops(&cpu(), &mut rng).unwrap();
}
