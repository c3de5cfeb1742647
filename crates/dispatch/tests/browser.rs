//! `dispatch` with `gpu-wasm` in a browser: WebGPU opened without blocking,
//! the async ops and batches on it, and the conformance suite's groups
//! through the async API. Built for `wasm32-unknown-unknown` and run by
//! `wasm-bindgen-test-runner` in headless Chromium (`cargo xtask test`; the
//! browser's flags are in `webdriver.json` beside this crate's manifest).
//! Every test requires WebGPU: without an adapter they fail.
#![cfg(target_arch = "wasm32")]

use compute_core::conformance::{self, Config, Group};
use compute_core::{AsyncOps, Backend, DType, Ops};
use compute_wgpu::WgpuBackend;
use dispatch::{Compute, Engine, Policy};
use wasm_bindgen_test::{console_log, wasm_bindgen_test, wasm_bindgen_test_configure};

wasm_bindgen_test_configure!(run_in_browser);

/// Every engine the browser offers, with WebGPU required; host calls forced
/// onto it so the async forms are exercised there.
async fn on_webgpu() -> Compute {
    let found = dispatch::discover::probe_async().await;
    let compute = Compute::builder().discover_async().await.policy(Policy::Fixed(Engine::Wgpu)).build();
    let compute = compute.unwrap_or_else(|e| panic!("building Compute: {e}"));
    assert!(compute.engines().contains(&Engine::Wgpu), "no WebGPU adapter in this browser: {found:?}");
    compute
}

#[wasm_bindgen_test]
async fn webgpu_opens_without_blocking_and_blocking_calls_are_absent() {
    assert!(!dispatch::runtime::sync_available());
    assert!(!compute_wgpu::runtime::sync_available());
    assert!(WgpuBackend::is_available_async().await, "no WebGPU adapter");
    let gpu = WgpuBackend::new_async().await.unwrap_or_else(|e| panic!("opening WebGPU: {e}"));
    let a = gpu.adapter();
    console_log!(
        "adapter: {} ({}, {}), driver {:?}, max binding {} bytes, max buffer {} bytes, GPU timestamps {}",
        a.name,
        a.api,
        a.device_type,
        a.driver,
        a.max_binding_bytes,
        a.max_buffer_bytes,
        gpu.gpu_timing()
    );
    let compute = on_webgpu().await;
    console_log!("dispatch: {}", compute.device_name());
    // The blocking trait methods answer with a typed error on WebGPU, and
    // `Compute` runs host calls on the CPU.
    let mut out = vec![0.0f32; 3];
    match gpu.relu(&[-1.0, 2.0, -3.0], &mut out) {
        Err(compute_core::ComputeError::DeviceUnavailable { .. }) => {}
        other => panic!("a blocking wgpu call in the browser gave {other:?}"),
    }
    compute.relu(&[-1.0, 2.0, -3.0], &mut out).unwrap_or_else(|e| panic!("relu: {e}"));
    assert_eq!(out, [0.0, 2.0, 0.0]);
    assert_eq!(compute.last_engine(), Some(Engine::Simd));
}

#[wasm_bindgen_test]
async fn async_ops_and_batches_run_on_webgpu() {
    let compute = on_webgpu().await;
    let (m, k, n) = (33, 65, 17);
    let mut rng = conformance::rng::Rng::new(7);
    let a = rng.vec(m * k, -1.0, 1.0);
    let b = rng.vec(k * n, -1.0, 1.0);
    let mut c = vec![f32::NAN; m * n];
    compute.matmul_async(&a, &b, &mut c, m, k, n).await.unwrap_or_else(|e| panic!("matmul_async: {e}"));
    assert_eq!(compute.last_engine(), Some(Engine::Wgpu));
    let op = compute_core::Op::matmul(m, k, n);
    assert_eq!(conformance::compare(&op, &[&a, &b], &c, 1.0), None);
    let dot = compute.dot_async(&a, &a).await.unwrap_or_else(|e| panic!("dot_async: {e}"));
    let want: f64 = a.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
    assert!((f64::from(dot) - want).abs() <= 1e-4 * want, "dot {dot} vs {want}");
    // A batch: one submission, awaited, then read back without blocking.
    let mut batch = compute.batch();
    let x = batch.upload(&[1.0, -2.0, 3.0, -4.0]);
    let r = batch.relu(x).unwrap_or_else(|e| panic!("{e}"));
    let y = batch.scale(r, 2.0).unwrap_or_else(|e| panic!("{e}"));
    let engine = batch.execute_async().await.unwrap_or_else(|e| panic!("execute_async: {e}"));
    assert_eq!(engine, Engine::Wgpu);
    assert_eq!(batch.read_async(y).await.unwrap_or_else(|e| panic!("read_async: {e}")), [2.0, 0.0, 6.0, 0.0]);
    // A tensor round trip through the device.
    let t = compute.upload_typed(compute_core::HostSlice::F32(&a)).unwrap_or_else(|e| panic!("upload: {e}"));
    assert_eq!(t.location().backend, compute_core::BackendKind::Wgpu);
    let mut back = compute_core::HostVec::zeros(DType::F32, a.len());
    compute.download_async_into(&t, back.as_mut()).await.unwrap_or_else(|e| panic!("download: {e}"));
    assert_eq!(back.to_f32(), a);
}

/// Runs one conformance group on WebGPU through the async API (the wgpu
/// backend's own futures, so no CPU fallback can hide a failure), with the
/// dtypes of the native wgpu suite.
async fn group(group: Group) {
    let gpu = WgpuBackend::new_async().await.unwrap_or_else(|e| panic!("opening WebGPU: {e}"));
    let cfg = Config::from_env().with_dtypes(&DType::ALL);
    let seed = js_sys::Date::now() as u64;
    let started = js_sys::Date::now();
    let report = conformance::run_group_async(&gpu, group, cfg, seed).await;
    console_log!(
        "conformance {group:?} on wgpu [{}]: {} calls, {:.1} s, seed {seed}, {} failure(s){}",
        gpu.device_name(),
        report.calls,
        (js_sys::Date::now() - started) / 1e3,
        report.failures.len(),
        if report.skipped.is_empty() { String::new() } else { format!(", declined: {}", report.skipped.len()) }
    );
    assert!(report.passed(), "{group:?} (seed {seed}):\n  {}", report.failures.join("\n  "));
}

macro_rules! groups {
    ($($name:ident => $group:ident),* $(,)?) => {
        $(
            #[wasm_bindgen_test]
            async fn $name() {
                group(Group::$group).await;
            }
        )*
    };
}

groups!(
    conformance_unary_ops => Unary,
    conformance_binary_ops => Binary,
    conformance_reductions => Reductions,
    conformance_row_ops => Rows,
    conformance_matmul => Matmul,
    conformance_batched_matmul => BatchedMatmul,
    conformance_conv2d => Conv2d,
    conformance_attention => Attention,
    conformance_casts => Casts,
    conformance_interpolation => Interpolation,
    conformance_quantized => Quantized,
    conformance_decoder_ops => Decoder,
    conformance_edge_values => EdgeValues,
    conformance_special_values => SpecialValues,
    conformance_bad_shapes_are_typed_errors => Errors,
    conformance_device_tensors => Tensors,
);
