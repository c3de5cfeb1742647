//! The browser demo's module: matmul, softmax and an 8-op chain through
//! `dispatch`, on WebGPU and on the CPU backend, each checked against the
//! CPU and the `f64` reference and timed; and a CPU benchmark of our ops that
//! the page runs in this build (WebAssembly SIMD128) and in a scalar build of
//! the same code. `examples/web/index.html` calls it and draws the results;
//! `cargo xtask web` builds and serves the page.
//!
//! Every function returns its report as a JSON string. Times are the median
//! of several runs after one warm-up, measured with `performance.now()`; a
//! WebGPU time spans host data in to host data out.
#![cfg(target_arch = "wasm32")]

use compute_core::conformance::{compare, rng::Rng};
use compute_core::{Backend, BinaryOp, Op, RowOp, UnaryOp};
use dispatch::{Compute, Engine, Policy};
use serde_json::{Value, json};
use wasm_bindgen::prelude::*;

/// Milliseconds from the page's clock (`performance.now()`), 0 without one.
fn now_ms() -> f64 {
    use js_sys::{Function, Reflect};
    let Ok(perf) = Reflect::get(&js_sys::global(), &"performance".into()) else { return 0.0 };
    let now = Reflect::get(&perf, &"now".into()).ok().and_then(|f| f.dyn_into::<Function>().ok());
    now.and_then(|f| f.call0(&perf).ok()).and_then(|v| v.as_f64()).unwrap_or(0.0)
}

/// Timed runs after the warm-up (WebGPU part).
const REPS: usize = 5;

/// Timed runs of the CPU benchmark, after its warm-up.
const CPU_REPS: usize = 9;

/// The median of `times`.
fn median(mut times: Vec<f64>) -> f64 {
    times.sort_by(f64::total_cmp);
    times.get(times.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Largest `|a − b|` over the two vectors.
fn max_diff(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (f64::from(*x) - f64::from(*y)).abs()).fold(0.0, f64::max)
}

/// An error as the page shows it.
fn js_error(what: &str, e: impl std::fmt::Display) -> JsValue {
    JsValue::from_str(&format!("{what}: {e}"))
}

/// Whether this module was built with WebAssembly SIMD128 (the `+simd128`
/// target feature, set for wasm32 in the workspace's `.cargo/config.toml`).
#[wasm_bindgen]
pub fn simd128() -> bool {
    cfg!(target_feature = "simd128")
}

/// The CPU benchmark: each op on the CPU engine (one thread: the page has no
/// workers), after a warm-up of at least 3 runs and 200 ms: the median of 9
/// samples, each the mean of enough calls to span about 10 ms. Returns
/// `{"build": "simd128"|"scalar", "cpu": <device>, "ops": [{"op", "shape", "ms"}]}`.
#[wasm_bindgen]
pub fn run_cpu() -> Result<String, JsValue> {
    let compute = Compute::builder().cpu().build().map_err(|e| js_error("CPU engine", e))?;
    let compute = compute.with_policy(Policy::Fixed(Engine::Simd));
    let mut rng = Rng::new(1);
    let n = 1 << 20;
    let (m, k, nn) = (256, 256, 256);
    let (rows, cols) = (256, 1024);
    let x = rng.vec(n, -3.0, 3.0);
    let y = rng.vec(n, -3.0, 3.0);
    let a = rng.vec(m * k, -1.0, 1.0);
    let b = rng.vec(k * nn, -1.0, 1.0);
    let gamma = rng.vec(cols, 0.5, 1.5);
    let beta = rng.vec(cols, -0.5, 0.5);
    let cases: Vec<(&str, String, Op, Vec<&[f32]>)> = vec![
        ("matmul", format!("{m}×{k}×{nn}"), Op::matmul(m, k, nn), vec![&a, &b]),
        ("softmax", format!("{rows}×{cols}"), Op::rows(RowOp::Softmax, rows, cols), vec![&x[..rows * cols]]),
        (
            "layer_norm",
            format!("{rows}×{cols}"),
            Op::rows(RowOp::LayerNorm { eps: 1e-5 }, rows, cols),
            vec![&x[..rows * cols], &gamma, &beta],
        ),
        ("gelu", format!("{n}"), Op::unary(UnaryOp::Gelu(compute_core::GeluForm::Tanh), n), vec![&x]),
        ("add", format!("{n}"), Op::binary(BinaryOp::Add, n), vec![&x, &y]),
        ("dot", format!("{n}"), Op::dot(n), vec![&x, &y]),
        ("sum", format!("{n}"), Op::reduce(compute_core::ReduceOp::Sum, n), vec![&x]),
    ];
    let mut ops = Vec::new();
    for (name, shape, op, inputs) in cases {
        let mut out = vec![0.0f32; op.layout().map_err(|e| js_error(name, e))?.output_len()];
        // Warm-up: at least 3 runs and 200 ms, so that the engine's optimising
        // compiler has replaced the baseline code of the hot loops.
        let start = now_ms();
        let mut warm = 0;
        while warm < 3 || now_ms() - start < 200.0 {
            compute.run(&op, &inputs, &mut out).map_err(|e| js_error(name, e))?;
            warm += 1;
        }
        // Each timed sample spans at least ~10 ms of calls: the page's clock
        // ticks in 0.1 ms steps where the page is not cross-origin isolated.
        let per_call = (now_ms() - start) / f64::from(warm);
        let calls = (10.0 / per_call.max(1e-3)).ceil().clamp(1.0, 10_000.0) as u32;
        let mut times = Vec::new();
        for _ in 0..CPU_REPS {
            let t0 = now_ms();
            for _ in 0..calls {
                compute.run(&op, &inputs, &mut out).map_err(|e| js_error(name, e))?;
            }
            times.push((now_ms() - t0) / f64::from(calls));
        }
        ops.push(json!({ "op": name, "shape": shape, "ms": median(times) }));
    }
    let build = if simd128() { "simd128" } else { "scalar" };
    Ok(json!({ "build": build, "cpu": compute.device_name(), "ops": ops }).to_string())
}

/// One op of the WebGPU part: its time on WebGPU and on the CPU, and the check.
struct Row {
    op: &'static str,
    shape: String,
    gpu_ms: f64,
    cpu_ms: f64,
    max_diff: f64,
    ok: bool,
    detail: String,
}

impl Row {
    fn json(&self) -> Value {
        json!({
            "op": self.op, "shape": self.shape, "gpu_ms": self.gpu_ms, "cpu_ms": self.cpu_ms,
            "max_diff": self.max_diff, "ok": self.ok, "detail": self.detail,
        })
    }
}

/// Runs `op` on host data on the CPU (`cpu`) and on WebGPU (`gpu`, awaited),
/// in that order (SwiftShader's threads, once started, share the cores), times
/// both, and checks both against the `f64` reference with the conformance
/// tolerance.
async fn host_op(
    gpu: &Compute,
    cpu: &Compute,
    name: &'static str,
    shape: String,
    op: Op,
    inputs: &[&[f32]],
) -> Result<Row, JsValue> {
    use compute_core::AsyncOps;
    let len = op.layout().map_err(|e| js_error(name, e))?.output_len();
    let views: Vec<compute_core::HostSlice<'_>> = inputs.iter().map(|x| compute_core::HostSlice::F32(x)).collect();
    let mut c = vec![f32::NAN; len];
    let mut times = Vec::new();
    for rep in 0..=REPS {
        let t0 = now_ms();
        cpu.run(&op, inputs, &mut c).map_err(|e| js_error(name, e))?;
        if rep > 0 {
            times.push(now_ms() - t0);
        }
    }
    let cpu_ms = median(times);
    let mut g = vec![f32::NAN; len];
    let mut times = Vec::new();
    for rep in 0..=REPS {
        let t0 = now_ms();
        gpu.run_async_into(op, &views, compute_core::HostSliceMut::F32(&mut g)).await.map_err(|e| js_error(name, e))?;
        if rep > 0 {
            times.push(now_ms() - t0);
        }
    }
    let on = gpu.last_engine();
    let gpu_ms = median(times);
    let gpu_check = compare(&op, inputs, &g, 1.0);
    let cpu_check = compare(&op, inputs, &c, 1.0);
    let ok = gpu_check.is_none() && cpu_check.is_none() && on == Some(Engine::Wgpu);
    let detail = match (gpu_check, cpu_check) {
        (None, None) if on == Some(Engine::Wgpu) => "WebGPU and CPU within the conformance tolerance".to_string(),
        (None, None) => format!("ran on {on:?}, not WebGPU"),
        (g, c) => format!("WebGPU: {}; CPU: {}", g.unwrap_or("ok".into()), c.unwrap_or("ok".into())),
    };
    Ok(Row { op: name, shape, gpu_ms, cpu_ms, max_diff: max_diff(&g, &c), ok, detail })
}

/// The 8-op chain as one batch: `softmax(σ(tanh(gelu(0.5·(x·y + x))) + y))`
/// row by row, recorded on `compute` and run with one `execute_async`.
/// Returns the result and the median time of the runs after the first.
async fn chain(compute: &Compute, x: &[f32], y: &[f32], rows: usize, cols: usize) -> Result<(Vec<f32>, f64), JsValue> {
    let mut times = Vec::new();
    let mut result = Vec::new();
    for rep in 0..=REPS {
        let t0 = now_ms();
        let mut batch = compute.batch();
        let bx = batch.upload(x);
        let by = batch.upload(y);
        let step = |r: compute_core::Result<dispatch::BufferId>| r.map_err(|e| js_error("chain", e));
        let t = step(batch.mul(bx, by))?;
        let t = step(batch.add(t, bx))?;
        let t = step(batch.scale(t, 0.5))?;
        let t = step(batch.gelu(t))?;
        let t = step(batch.unary(UnaryOp::Tanh, t))?;
        let t = step(batch.add(t, by))?;
        let t = step(batch.unary(UnaryOp::Sigmoid, t))?;
        let t = step(batch.softmax(t, rows, cols))?;
        batch.execute_async().await.map_err(|e| js_error("chain", e))?;
        result = batch.read_async(t).await.map_err(|e| js_error("chain", e))?;
        if rep > 0 {
            times.push(now_ms() - t0);
        }
    }
    Ok((result, median(times)))
}

/// The WebGPU part: opens WebGPU through `dispatch` (`Compute::auto_async`),
/// runs matmul 256³, softmax 256×1024 and the 8-op chain on 256×1024 on it
/// and on the CPU, checks and times them. Returns
/// `{"webgpu": bool, "adapter", "engines", "rows": [...], "pass": bool}`;
/// without WebGPU, `webgpu` is false and no row runs.
#[wasm_bindgen]
pub async fn run_gpu() -> Result<String, JsValue> {
    let found = dispatch::discover::probe_async().await;
    let compute = Compute::auto_async().await.map_err(|e| js_error("opening the engines", e))?;
    let engines: Vec<String> = found.iter().map(|f| format!("{f:?}")).collect();
    if !compute.engines().contains(&Engine::Wgpu) {
        return Ok(json!({ "webgpu": false, "adapter": "", "engines": engines, "rows": [], "pass": false }).to_string());
    }
    let adapter = compute.backend(Engine::Wgpu).map(|b| b.device_name()).unwrap_or_default();
    let gpu = compute.with_policy(Policy::Fixed(Engine::Wgpu));
    let cpu = compute.with_policy(Policy::Fixed(Engine::Simd));
    let mut rng = Rng::new(2);
    let (m, k, n) = (256, 256, 256);
    let (rows, cols) = (256, 1024);
    let a = rng.vec(m * k, -1.0, 1.0);
    let b = rng.vec(k * n, -1.0, 1.0);
    let x = rng.vec(rows * cols, -3.0, 3.0);
    let y = rng.vec(rows * cols, -3.0, 3.0);
    let mut out = Vec::new();
    out.push(host_op(&gpu, &cpu, "matmul", format!("{m}×{k}×{n}"), Op::matmul(m, k, n), &[&a, &b]).await?);
    let softmax = Op::rows(RowOp::Softmax, rows, cols);
    out.push(host_op(&gpu, &cpu, "softmax", format!("{rows}×{cols}"), softmax, &[&x]).await?);
    let (c, cpu_ms) = chain(&cpu, &x, &y, rows, cols).await?;
    let (g, gpu_ms) = chain(&gpu, &x, &y, rows, cols).await?;
    // Eight ops of f32 rounding apart: each element within 1e-5 of the CPU's, relative to 1.
    let bad = g
        .iter()
        .zip(&c)
        .filter(|(p, q)| (f64::from(**p) - f64::from(**q)).abs() > 1e-5 * f64::from(q.abs()).max(1e-2))
        .count();
    let ok = bad == 0 && g.len() == rows * cols;
    let detail = if ok {
        "every element within 1e-5 (relative) of the CPU's".into()
    } else {
        format!("{bad} of {} elements differ from the CPU's", g.len())
    };
    out.push(Row {
        op: "8-op chain",
        shape: format!("{rows}×{cols}"),
        gpu_ms,
        cpu_ms,
        max_diff: max_diff(&g, &c),
        ok,
        detail,
    });
    let pass = out.iter().all(|r| r.ok);
    let rows_json: Vec<Value> = out.iter().map(Row::json).collect();
    Ok(json!({ "webgpu": true, "adapter": adapter, "engines": engines, "rows": rows_json, "pass": pass }).to_string())
}
