//! The batching executor's benchmark (`--executor`): requests
//! `x[1, k]·W[k, n]` against one shared weight from 1…N caller threads,
//! through the executor (which stacks them into one `[Σrows, k]·W` product)
//! against every caller making direct calls on the same engine at the same
//! time; requests/s and per-request latency p50 / p99 for each configuration
//! (latency, balanced, throughput), and a lone caller's latency against a
//! direct call's.
//!
//! ```text
//! cargo xtask bench --executor [--backend simd|cuda|wgpu] [--secs 1] [--reps 2]
//!     [--callers 1,4,16,64,256] [--n 4096,14336] [--k 4096] [--transposed] [--bf16 | --dtype q4_K]
//!     [--attention [--kv 512]] [--alone]
//! ```
//!
//! Engine: the first `--backend` (the CPU on all its threads by default), for
//! both sides. On a GPU the direct calls keep the weight resident, as the
//! executor does: each uploads its `x`, runs the product and downloads its
//! `y`; on the CPU they read the benchmark's copy of `W`, and each executor
//! its own (the lone caller's rows below share one). Each cell (shape × callers) runs direct calls and the
//! three configurations `reps` times, in alternating order (direct first,
//! then last), each for `secs`; a row gives the median requests/s over the
//! repetitions, and the latency percentiles of all their requests together
//! (`--bf16`: the weight in `bf16`, each request's row rounded to `bf16`,
//! results in `f32`; `--dtype q4_K` and the other ggml formats: the weight in
//! blocks, stored `n × k`), and where the executor's batches spent their time (per
//! batch: stacking, upload, product, download, answering; with
//! `DISPATCH_EXECUTOR_PHASES=1` the device is waited for after each step so
//! that each is timed apart).
//!
//! Every run also times a lone caller alternating a direct call, a request
//! through the executor (`matmul_shared_call`, which a caller alone runs on
//! its own thread) and a second direct call, so that all three see the same
//! machine state: the second direct call's ratio to the first is the noise
//! of that comparison. On the CPU all three read the executor's own copy of
//! `W` (`SharedWeight::host_copy`), so that none gains from where its pages
//! landed. `--alone` runs only that.
//!
//! `--attention` times decoding steps instead: caller `t` decodes one token of
//! its own sequence, `softmax(q·kᵀ)·v` with 32 query heads, 4 key/value heads
//! of 64 values, causal, reading the first `c/8 + 97·t mod 7c/8` rows of a KV
//! cache of `c = --kv` rows (512 by default: `f32` on the host, 1 MiB of keys
//! and values per request).
//! The executor merges the steps of different lengths into one attention call
//! (keys counted per sequence); the direct calls run each step on its own.
//! Both sides pass the host data: the executor takes its inputs by value (one
//! copy per request), the direct calls borrow them. The executor merges them
//! only where the cost model predicts that it pays, so this mode calibrates
//! the engines first (quick options).

use std::sync::{Arc, Barrier};
use std::time::Instant;

use compute_core::{DType, HostSlice, HostSliceMut, HostVec, Tensor};
use dispatch::{BatchConfig, BatchedExecutor, Compute, Engine, ExecutorMetrics, Policy, SharedWeight, WeightLayout};

use crate::report::{Record, median};

/// What `--executor` runs (its options, parsed by the bench's `main`).
pub struct ExecutorArgs {
    pub secs: f64,
    pub reps: usize,
    pub callers: Vec<usize>,
    pub ns: Vec<usize>,
    pub k: usize,
    pub layout: WeightLayout,
    pub dtype: DType,
    /// `Some(kv)`: decoding steps against KV caches of `kv` rows instead.
    pub attention: Option<usize>,
    /// Only the lone caller's comparison.
    pub alone: bool,
}

impl ExecutorArgs {
    /// The issue's benchmark: 1–256 callers, 4096×4096 and 4096×14336, 1 s
    /// per run, two repetitions (`quick`: 1–16 callers, 4096² only, 0.3 s,
    /// one).
    pub fn new(quick: bool) -> Self {
        ExecutorArgs {
            secs: if quick { 0.3 } else { 1.0 },
            reps: if quick { 1 } else { 2 },
            callers: if quick { vec![1, 4, 16] } else { vec![1, 4, 16, 64, 256] },
            ns: if quick { vec![4096] } else { vec![4096, 14336] },
            k: 4096,
            layout: WeightLayout::RowMajor,
            dtype: DType::F32,
            attention: None,
            alone: false,
        }
    }

    /// Takes `flag` (and its value from `next`) if it is one of the
    /// executor's options; `Ok(false)` if it is not.
    pub fn parse(&mut self, flag: &str, next: &mut dyn FnMut() -> Option<String>) -> Result<bool, String> {
        let mut value = |name: &str| next().ok_or_else(|| format!("{name} needs a value"));
        let number = |name: &str, v: String| v.trim().parse::<f64>().map_err(|e| format!("{name}: {e}"));
        let list = |name: &str, v: String| {
            v.split(',')
                .map(|s| s.trim().parse::<usize>().map_err(|e| format!("{name}: {e}")))
                .collect::<Result<Vec<usize>, String>>()
        };
        match flag {
            "--secs" => self.secs = number(flag, value(flag)?)?,
            "--reps" => self.reps = (number(flag, value(flag)?)? as usize).max(1),
            "--callers" => self.callers = list(flag, value(flag)?)?,
            "--n" => self.ns = list(flag, value(flag)?)?,
            "--k" => self.k = number(flag, value(flag)?)? as usize,
            "--transposed" => self.layout = WeightLayout::Transposed,
            "--bf16" => self.dtype = DType::BF16,
            "--dtype" => {
                let name = value(flag)?;
                self.dtype = DType::ALL
                    .into_iter()
                    .chain(DType::QUANTIZED)
                    .find(|d| d.as_str() == name)
                    .ok_or_else(|| format!("--dtype: no dtype named {name}"))?;
                if self.dtype.is_quantized() {
                    // Blocks hold rows of W's transpose, as GGUF stores them.
                    self.layout = WeightLayout::Transposed;
                }
            }
            "--attention" => self.attention = Some(self.attention.unwrap_or(512)),
            "--kv" => self.attention = Some((number(flag, value(flag)?)? as usize).max(8)),
            "--alone" => self.alone = true,
            _ => return Ok(false),
        }
        Ok(true)
    }
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map_or_else(|_| "?".into(), |s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
}

/// Per-request latencies (seconds) and the wall time of a run.
struct Run {
    lat: Vec<f64>,
    wall: f64,
}

impl Run {
    fn rate(&self) -> f64 {
        self.lat.len() as f64 / self.wall
    }
    fn pct(&mut self, p: f64) -> f64 {
        self.lat.sort_by(|a, b| a.total_cmp(b));
        self.lat.get(((self.lat.len().saturating_sub(1)) as f64 * p).round() as usize).copied().unwrap_or(f64::NAN)
    }
}

/// `callers` threads each running `one()` in a loop for `secs` (at least once
/// each), timing every call.
fn drive<F>(callers: usize, secs: f64, make: impl Fn(usize) -> F + Sync) -> Run
where
    F: FnMut(),
{
    let start = Arc::new(Barrier::new(callers + 1));
    let (lat, wall) = std::thread::scope(|s| {
        let hs: Vec<_> = (0..callers)
            .map(|t| {
                let (start, make) = (start.clone(), &make);
                s.spawn(move || {
                    let mut one = make(t);
                    one(); // warm-up, untimed
                    start.wait();
                    let t0 = Instant::now();
                    let mut lat = Vec::new();
                    while lat.is_empty() || t0.elapsed().as_secs_f64() < secs {
                        let t = Instant::now();
                        one();
                        lat.push(t.elapsed().as_secs_f64());
                    }
                    lat
                })
            })
            .collect();
        start.wait();
        let t0 = Instant::now();
        let lat: Vec<f64> = hs.into_iter().flat_map(|h| h.join().unwrap_or_default()).collect();
        (lat, t0.elapsed().as_secs_f64())
    });
    Run { lat, wall }
}

fn data(seed: u64, len: usize) -> Vec<f32> {
    compute_core::conformance::rng::Rng::new(seed).vec(len, -1.0, 1.0)
}

/// One caller's direct call (caller `t`'s row): on the CPU on host slices;
/// on a GPU against the weight uploaded once (`w_gpu`), uploading `x` and
/// downloading `y` per call. With a `bf16` weight each call first rounds its
/// `x` to `bf16`, as the executor does.
fn direct_call<'a>(
    compute: &'a Compute,
    engine: Engine,
    (w, w_gpu): (HostSlice<'a>, Option<&'a Tensor>),
    op: compute_core::Op,
    (k, n): (usize, usize),
    t: usize,
) -> impl FnMut() + 'a {
    let backend = compute.backend(engine);
    let x = data(100 + t as u64, k);
    let mut y = vec![0.0f32; n];
    move || {
        // The rows as the product takes them: bf16 for a bf16 weight, else f32.
        let xh = HostVec::from_f32(if w.dtype() == DType::BF16 { DType::BF16 } else { DType::F32 }, &x);
        let done = match (&backend, w_gpu) {
            (Some(b), Some(tw)) => b.upload_typed(xh.as_slice()).and_then(|tx| {
                let ty = b.alloc(n)?;
                b.run_tensors(&op, &[&tx, tw], &ty)?;
                b.download(&ty, &mut y)
            }),
            _ => compute.run_on_typed(engine, &op, &[xh.as_slice(), w], HostSliceMut::F32(&mut y)),
        };
        if let Err(e) = done {
            eprintln!("direct call failed: {e}");
        }
    }
}

/// Direct calls from `callers` threads ([`direct_call`]).
fn direct(
    compute: &Compute,
    engine: Engine,
    w: (HostSlice<'_>, Option<&Tensor>),
    op: compute_core::Op,
    (k, n): (usize, usize),
    callers: usize,
    secs: f64,
) -> Run {
    drive(callers, secs, |t| direct_call(compute, engine, w, op, (k, n), t))
}

/// One caller's request through the executor, waited for
/// (`matmul_shared_call`: a caller alone runs it on its own thread).
fn batched_call<'a>(exec: &BatchedExecutor, w: &'a SharedWeight, k: usize, t: usize) -> impl FnMut() + 'a {
    let x = data(100 + t as u64, k);
    let h = exec.handle();
    move || match h.matmul_shared_call(w, x.clone(), 1) {
        Ok(y) => drop(y),
        Err(e) => eprintln!("batched call failed: {e}"),
    }
}

/// A lone caller alternating a direct call, a request through the executor
/// and a second direct call for `secs`, so that all three see the same
/// machine state: the p50 of each.
fn alone_interleaved(
    direct: &mut dyn FnMut(),
    batched: &mut dyn FnMut(),
    control: &mut dyn FnMut(),
    secs: f64,
) -> [f64; 3] {
    direct();
    batched();
    control();
    let mut lat: [Vec<f64>; 3] = Default::default();
    let timed = |f: &mut dyn FnMut(), l: &mut Vec<f64>| {
        let t = Instant::now();
        f();
        l.push(t.elapsed().as_secs_f64());
    };
    let t0 = Instant::now();
    while lat[0].is_empty() || t0.elapsed().as_secs_f64() < secs {
        let [d, b, c] = &mut lat;
        timed(direct, d);
        timed(batched, b);
        timed(control, c);
    }
    lat.map(|l| Run { lat: l, wall: 1.0 }.pct(0.5))
}

fn batched(exec: &BatchedExecutor, w: &SharedWeight, k: usize, callers: usize, secs: f64) -> Run {
    drive(callers, secs, |t| batched_call(exec, w, k, t))
}

/// Caller `t`'s decoding step against a KV cache of `kv` rows (see the
/// module docs) and its inputs.
fn attention_step(t: usize, kv: usize) -> (compute_core::Op, Vec<Vec<f32>>) {
    let seq_k = kv / 8 + (97 * t) % (kv - kv / 8);
    let spec = compute_core::AttentionSpec::new(1, 32, 1, seq_k, 64).with_kv_heads(4).causal().with_kv_capacity(kv);
    let op = compute_core::Op::Attention(spec);
    let lens: Vec<usize> = op.layout().map(|l| l.input_lens().collect()).unwrap_or_default();
    let inputs = lens.iter().enumerate().map(|(i, &n)| data(300 + 3 * t as u64 + i as u64, n)).collect();
    (op, inputs)
}

/// Decoding steps as direct calls on host data from `callers` threads.
fn direct_attention(compute: &Compute, engine: Engine, kv: usize, callers: usize, secs: f64) -> Run {
    drive(callers, secs, |t| {
        let (op, inputs) = attention_step(t, kv);
        let mut y = vec![0.0f32; op.layout().map_or(0, |l| l.output_len())];
        move || {
            let refs: Vec<HostSlice<'_>> = inputs.iter().map(|v| HostSlice::F32(v)).collect();
            if let Err(e) = compute.run_on_typed(engine, &op, &refs, HostSliceMut::F32(&mut y)) {
                eprintln!("direct call failed: {e}");
            }
        }
    })
}

/// Decoding steps through the executor from `callers` threads.
fn batched_attention(exec: &BatchedExecutor, kv: usize, callers: usize, secs: f64) -> Run {
    drive(callers, secs, |t| {
        let (op, inputs) = attention_step(t, kv);
        let h = exec.handle();
        move || match h.call(op, inputs.clone()) {
            Ok(y) => drop(y),
            Err(e) => eprintln!("batched call failed: {e}"),
        }
    })
}

/// The repetitions of one mode: requests/s of each, latencies of all.
#[derive(Default)]
struct Reps {
    rates: Vec<f64>,
    lat: Vec<f64>,
    metrics: Vec<ExecutorMetrics>,
}

impl Reps {
    fn add(&mut self, r: Run, m: Option<ExecutorMetrics>) {
        self.rates.push(r.rate());
        self.lat.extend(r.lat);
        self.metrics.extend(m);
    }
    fn rate(&self) -> f64 {
        let mut r = self.rates.clone();
        r.sort_by(|a, b| a.total_cmp(b));
        r.get(r.len() / 2).copied().unwrap_or(f64::NAN)
    }
}

/// Prints one mode's line of a cell and returns its record: requests/s as
/// seconds per request, against the direct calls' (`base`) when given.
fn row(cell: &Cell<'_>, mode: &str, r: &Reps, base: Option<&Reps>) -> Record {
    let mut run = Run { lat: r.lat.clone(), wall: 1.0 };
    let ratio = base.map_or(String::new(), |b| format!("{:.2}x", r.rate() / b.rate()));
    let range = if r.rates.len() > 1 {
        let lo = r.rates.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = r.rates.iter().copied().fold(0.0, f64::max);
        format!("{lo:.0}-{hi:.0}")
    } else {
        String::new()
    };
    let extra = if r.metrics.is_empty() {
        String::new()
    } else {
        let sum = |f: fn(&ExecutorMetrics) -> u64| r.metrics.iter().map(f).sum::<u64>();
        let (batches, done, alone) = (sum(|m| m.batches), sum(|m| m.completed), sum(|m| m.unmerged));
        let q50 = r.metrics.iter().map(|m| m.queue_p50_s).fold(0.0, f64::max);
        let mut phases = dispatch::BatchPhases::default();
        for m in &r.metrics {
            phases.add(&m.phases);
        }
        let [st, up, pr, dn, an] = phases.per_batch_us();
        format!(
            "batches {batches:>6}  mean {:>6.1}  unmerged {alone}  flush size/wait/idle/alone {}/{}/{}/{}  queue p50 <= {:.2} ms  \
             per batch µs stack {st:.1} up {up:.1} product {pr:.1} down {dn:.1} answer {an:.1}",
            done as f64 / batches.max(1) as f64,
            sum(|m| m.flush_size),
            sum(|m| m.flush_timeout),
            sum(|m| m.flush_idle),
            sum(|m| m.flush_alone),
            q50 * 1e3
        )
    };
    let (p50, p99) = (run.pct(0.5), run.pct(0.99));
    println!(
        "{:<14} {:>7}  {mode:<20} {:>9.1} {range:>11} {:>9.3} {:>9.3} {ratio:>7}  {extra}",
        cell.shape,
        cell.callers,
        r.rate(),
        p50 * 1e3,
        p99 * 1e3
    );
    let record = Record {
        op: format!("executor {mode}"),
        shape: format!("{} x{}", cell.shape, cell.callers),
        backend: cell.engine.as_str().into(),
        device: cell.device.into(),
        threads: cell.callers,
        placement: "host".into(),
        median_s: 1.0 / r.rate(),
        note: Some(format!(
            "{:.1} requests/s (range {range}), latency p50 {:.3} ms p99 {:.3} ms{}{}",
            r.rate(),
            p50 * 1e3,
            p99 * 1e3,
            base.map_or(String::new(), |b| {
                let mut d = Run { lat: b.lat.clone(), wall: 1.0 };
                format!("; direct calls p50 {:.3} ms p99 {:.3} ms", d.pct(0.5) * 1e3, d.pct(0.99) * 1e3)
            }),
            if extra.is_empty() { String::new() } else { format!("; {extra}") }
        )),
        ..Record::default()
    };
    match base {
        Some(b) => record.with_peer("direct calls", 1.0 / b.rate()),
        None => record,
    }
}

/// What a cell's rows are labelled with.
struct Cell<'a> {
    shape: &'a str,
    callers: usize,
    engine: Engine,
    device: &'a str,
}

/// The engine `--backend` names (the CPU on all its threads for `simd`).
fn engine_of(name: &str) -> Result<Engine, String> {
    match name {
        "simd" | "cpu" => Ok(Engine::Simd),
        "cuda" => Ok(Engine::Cuda),
        "wgpu" => Ok(Engine::Wgpu),
        other => Err(format!("--executor runs on simd, cuda or wgpu, not {other}")),
    }
}

/// Runs the executor's benchmark on the engine `backend` names; see the
/// module docs. Takes `secs` × (`reps` × 4 runs) per cell, plus a lone
/// caller's `reps` × `secs` per shape.
pub fn rows(a: &ExecutorArgs, backend: &str) -> Result<Vec<Record>, String> {
    let engine = engine_of(backend)?;
    let err = |e: compute_core::ComputeError| e.to_string();
    let builder = if engine == Engine::Simd { Compute::builder().cpu() } else { Compute::builder().discover() };
    // Attention requests merge only where the cost model predicts it pays:
    // give it this machine's figures.
    let builder = if a.attention.is_some() {
        builder.calibration_options(dispatch::calibrate::Options::quick()).calibrate()
    } else {
        builder.nominal_profile()
    };
    let compute = builder.policy(Policy::Fixed(engine)).build().map_err(err)?;
    let backend = compute.backend(engine).ok_or_else(|| format!("engine {engine} is not available here"))?;
    let gpu = engine != Engine::Simd;
    let device = backend.device_name();
    println!("engine: {device}; load average at start: {}", load());
    let configs = [
        ("latency 256/1ms", BatchConfig::latency()),
        ("balanced 1024/5ms", BatchConfig::balanced()),
        ("throughput 2048/10ms", BatchConfig::throughput()),
    ];
    let mut out = Vec::new();

    // The hand-off: a lone caller's tiny request (1×16 by 16×16) through the
    // executor against a direct call: the difference is what the executor adds.
    {
        let (k, n) = (16, 16);
        let wv = data(1, k * n);
        let op = compute_core::Op::matmul(1, k, n);
        let tw = if gpu { Some(backend.upload(&wv).map_err(err)?) } else { None };
        let mut d = direct(&compute, engine, (HostSlice::F32(&wv), tw.as_ref()), op, (k, n), 1, a.secs.min(1.0));
        let exec = BatchedExecutor::new(compute.clone(), BatchConfig::balanced()).map_err(err)?;
        let w = exec.handle().register_weight(wv.clone(), k, n, WeightLayout::RowMajor).map_err(err)?;
        let mut b = batched(&exec, &w, k, 1, a.secs.min(1.0));
        let (dp, bp) = (d.pct(0.5), b.pct(0.5));
        println!(
            "hand-off (1 caller, 1x16x16): direct p50 {:.1} µs, executor p50 {:.1} µs (p99 {:.1}): {:.1} µs per request",
            dp * 1e6,
            bp * 1e6,
            b.pct(0.99) * 1e6,
            (bp - dp) * 1e6
        );
        drop(exec.shutdown());
        out.push(
            Record {
                op: "executor hand-off".into(),
                shape: "1x16x16 x1".into(),
                backend: engine.as_str().into(),
                device: device.clone(),
                threads: 1,
                placement: "host".into(),
                median_s: bp,
                note: Some("p50 of a lone caller's tiny product, against a direct call's".into()),
                ..Record::default()
            }
            .with_peer("direct call", dp),
        );
    }

    println!(
        "\n{:<14} {:>7}  {:<20} {:>9} {:>11} {:>9} {:>9} {:>7}",
        "shape", "callers", "mode", "req/s", "range", "p50 ms", "p99 ms", "vs dir"
    );
    if let Some(kv) = a.attention {
        let shape = format!("attn kv {kv}");
        for &callers in &a.callers {
            let mut d = Reps::default();
            let mut b: Vec<Reps> = configs.iter().map(|_| Reps::default()).collect();
            for rep in 0..a.reps {
                if rep % 2 == 0 {
                    d.add(direct_attention(&compute, engine, kv, callers, a.secs), None);
                }
                for ((_, cfg), b) in configs.iter().zip(b.iter_mut()) {
                    let exec = BatchedExecutor::new(compute.clone(), *cfg).map_err(err)?;
                    let r = batched_attention(&exec, kv, callers, a.secs);
                    b.add(r, Some(exec.shutdown()));
                }
                if rep % 2 == 1 {
                    d.add(direct_attention(&compute, engine, kv, callers, a.secs), None);
                }
            }
            let cell = Cell { shape: &shape, callers, engine, device: &device };
            row(&cell, "direct", &d, None);
            for ((name, _), b) in configs.iter().zip(&b) {
                out.push(row(&cell, name, b, Some(&d)));
            }
        }
        println!("\nload average at end: {}", load());
        return Ok(out);
    }
    let k = a.k;
    for &n in &a.ns {
        let wv = HostVec::from_f32(a.dtype, &data(7, k * n));
        let op = if a.dtype.is_quantized() {
            compute_core::Op::QuantMatmul(compute_core::QuantMatmulSpec::new(1, k, n, a.dtype))
        } else {
            let spec = compute_core::MatmulSpec::new(1, k, n).with_dtypes(a.dtype, DType::F32);
            compute_core::Op::Matmul(compute_core::MatmulSpec { trans_b: a.layout == WeightLayout::Transposed, ..spec })
        };
        let shape = format!(
            "1x{k}x{n}{}{}",
            if a.layout == WeightLayout::Transposed { "T" } else { "" },
            if a.dtype == DType::F32 { String::new() } else { format!(" {}", a.dtype) }
        );
        let tw = if gpu { Some(backend.upload_typed(wv.as_slice()).map_err(err)?) } else { None };
        let w = (wv.as_slice(), tw.as_ref());
        {
            let exec = BatchedExecutor::new(compute.clone(), BatchConfig::balanced()).map_err(err)?;
            let sw = exec.handle().register_weight_typed(wv.clone(), k, n, a.layout).map_err(err)?;
            // On the CPU all three read the executor's own copy of W: the
            // same pages, so none gains from where its copy landed.
            let w = match sw.host_copy() {
                Some(h) if !gpu => (h, None),
                _ => w,
            };
            let mut one_direct = direct_call(&compute, engine, w, op, (k, n), 0);
            let mut one_batched = batched_call(&exec, &sw, k, 0);
            let mut control = direct_call(&compute, engine, w, op, (k, n), 0);
            let mut p50s = Vec::new();
            for rep in 0..a.reps {
                let [d, b, c] = alone_interleaved(&mut one_direct, &mut one_batched, &mut control, a.secs);
                println!(
                    "{shape:<14} alone, interleaved, rep {rep}: direct p50 {:.3} ms, executor p50 {:.3} ms: {:.3}x; \
                     second direct call {:.3} ms: {:.3}x",
                    d * 1e3,
                    b * 1e3,
                    b / d,
                    c * 1e3,
                    c / d
                );
                p50s.push((d, b, c));
            }
            drop(exec.shutdown());
            let mid = |f: fn(&(f64, f64, f64)) -> f64| {
                let mut v: Vec<f64> = p50s.iter().map(f).collect();
                median(&mut v)
            };
            let ratios = |f: fn(&(f64, f64, f64)) -> f64| {
                p50s.iter().map(|p| format!("{:.3}", f(p) / p.0)).collect::<Vec<_>>().join(" / ")
            };
            out.push(
                Record {
                    op: "executor alone".into(),
                    shape: format!("{shape} x1"),
                    backend: engine.as_str().into(),
                    device: device.clone(),
                    threads: 1,
                    placement: "host".into(),
                    median_s: mid(|p| p.1),
                    note: Some(format!(
                        "a lone caller alternating direct call, executor request, second direct call; p50 per \
                         repetition, executor ÷ direct: {}; second direct ÷ direct (the noise): {}",
                        ratios(|p| p.1),
                        ratios(|p| p.2)
                    )),
                    ..Record::default()
                }
                .with_peer("direct call", mid(|p| p.0)),
            );
        }
        if a.alone {
            continue;
        }
        for &callers in &a.callers {
            let mut d = Reps::default();
            let mut b: Vec<Reps> = configs.iter().map(|_| Reps::default()).collect();
            for rep in 0..a.reps {
                if rep % 2 == 0 {
                    d.add(direct(&compute, engine, w, op, (k, n), callers, a.secs), None);
                }
                for ((_, cfg), b) in configs.iter().zip(b.iter_mut()) {
                    let exec = BatchedExecutor::new(compute.clone(), *cfg).map_err(err)?;
                    let w = exec.handle().register_weight_typed(wv.clone(), k, n, a.layout).map_err(err)?;
                    let r = batched(&exec, &w, k, callers, a.secs);
                    b.add(r, Some(exec.shutdown()));
                }
                if rep % 2 == 1 {
                    d.add(direct(&compute, engine, w, op, (k, n), callers, a.secs), None);
                }
            }
            let cell = Cell { shape: &shape, callers, engine, device: &device };
            row(&cell, "direct", &d, None);
            for ((name, _), b) in configs.iter().zip(&b) {
                out.push(row(&cell, name, b, Some(&d)));
            }
        }
    }
    println!("\nload average at end: {}", load());
    Ok(out)
}
