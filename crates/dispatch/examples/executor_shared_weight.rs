//! Requests `x[1, k]·W[k, n]` against one shared weight from 1…N caller
//! threads: through the batching executor (which stacks them into one
//! `[Σrows, k]·W` product) against every caller making direct calls on the
//! same engine at the same time. Prints requests/s and per-request latency
//! p50 / p99 for each configuration, and the executor's hand-off (a lone
//! caller's tiny request through the executor against a direct call).
//!
//! ```text
//! cargo run --release -p dispatch --no-default-features --example executor_shared_weight -- \
//!     [--secs 2] [--reps 3] [--callers 1,4,16] [--n 4096,14336] [--k 4096] [--transposed] \
//!     [--engine simd|cuda|wgpu] [--bf16] [--attention [--kv 512]] [--alone]
//! ```
//!
//! Engine: the CPU on all its threads (`simd`) by default, or a GPU (built
//! with the `cuda` / `gpu` feature), for both sides. On a GPU the direct
//! calls keep the weight resident, as the executor does: each uploads its
//! `x`, runs the product and downloads its `y`. Each cell
//! (shape × callers) runs direct calls and the three configurations `reps`
//! times, in alternating order (direct first, then last), each for `secs`;
//! a row gives the median requests/s over the repetitions, and the latency
//! percentiles of all their requests together (`--bf16`: the weight in
//! `bf16`, each request's row rounded to `bf16`, results in `f32`), and where the executor's
//! batches spent their time (per batch: stacking, upload, product, download,
//! answering; with `DISPATCH_EXECUTOR_PHASES=1` the device is waited for
//! after each step so that each is timed apart).
//!
//! `--alone` times a lone caller only, alternating one direct call and one
//! request through the executor (balanced preset) for `secs`, `reps` times:
//! both sides then see the same machine state, which separate runs of a
//! busy or throttled machine do not. On the CPU both sides read the same
//! buffer of `W` (the executor's copy, [`SharedWeight::host_copy`]).
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

struct Args {
    secs: f64,
    reps: usize,
    callers: Vec<usize>,
    ns: Vec<usize>,
    k: usize,
    layout: WeightLayout,
    engine: Engine,
    dtype: DType,
    attention: bool,
    kv: usize,
    alone: bool,
}

fn list(v: &str) -> Vec<usize> {
    v.split(',').filter_map(|s| s.trim().parse().ok()).collect()
}

fn args() -> Args {
    let mut a = Args {
        secs: 2.0,
        reps: 3,
        callers: vec![1, 4, 16],
        ns: vec![4096, 14336],
        k: 4096,
        layout: WeightLayout::RowMajor,
        engine: Engine::Simd,
        dtype: DType::F32,
        attention: false,
        kv: 512,
        alone: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--secs" => a.secs = it.next().and_then(|v| v.parse().ok()).unwrap_or(a.secs),
            "--reps" => a.reps = it.next().and_then(|v| v.parse().ok()).unwrap_or(a.reps).max(1),
            "--callers" => a.callers = it.next().map(|v| list(&v)).unwrap_or(a.callers),
            "--n" => a.ns = it.next().map(|v| list(&v)).unwrap_or(a.ns),
            "--k" => a.k = it.next().and_then(|v| v.parse().ok()).unwrap_or(a.k),
            "--transposed" => a.layout = WeightLayout::Transposed,
            "--bf16" => a.dtype = DType::BF16,
            "--attention" => a.attention = true,
            "--alone" => a.alone = true,
            "--kv" => a.kv = it.next().and_then(|v| v.parse().ok()).unwrap_or(a.kv).max(8),
            "--engine" => match it.next().as_deref() {
                Some("cuda") => a.engine = Engine::Cuda,
                Some("wgpu") => a.engine = Engine::Wgpu,
                Some("simd") => a.engine = Engine::Simd,
                other => eprintln!("ignored engine {other:?} (simd, cuda or wgpu)"),
            },
            other => eprintln!("ignored argument {other}"),
        }
    }
    a
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
        let xh = HostVec::from_f32(w.dtype(), &x);
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

/// A lone caller alternating a direct call and a request through the
/// executor for `secs`, so that both see the same machine state: the p50 of
/// each and their ratio.
fn alone_interleaved(direct: &mut dyn FnMut(), batched: &mut dyn FnMut(), secs: f64) -> (f64, f64) {
    direct();
    batched();
    let (mut d, mut b) = (Vec::new(), Vec::new());
    let t0 = Instant::now();
    while d.is_empty() || t0.elapsed().as_secs_f64() < secs {
        let t = Instant::now();
        direct();
        d.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        batched();
        b.push(t.elapsed().as_secs_f64());
    }
    let mut d = Run { lat: d, wall: 1.0 };
    let mut b = Run { lat: b, wall: 1.0 };
    (d.pct(0.5), b.pct(0.5))
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

fn row(shape: &str, callers: usize, mode: &str, r: &Reps, base: Option<f64>) {
    let mut run = Run { lat: r.lat.clone(), wall: 1.0 };
    let ratio = base.map_or(String::new(), |b| format!("{:.2}x", r.rate() / b));
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
    println!(
        "{shape:<14} {callers:>7}  {mode:<20} {:>9.1} {range:>11} {:>9.3} {:>9.3} {ratio:>7}  {extra}",
        r.rate(),
        run.pct(0.5) * 1e3,
        run.pct(0.99) * 1e3
    );
}

fn main() -> compute_core::Result<()> {
    let a = args();
    let builder = if a.engine == Engine::Simd { Compute::builder().cpu() } else { Compute::builder().discover() };
    // Attention requests merge only where the cost model predicts it pays:
    // give it this machine's figures.
    let builder = if a.attention {
        builder.calibration_options(dispatch::calibrate::Options::quick()).calibrate()
    } else {
        builder.nominal_profile()
    };
    let compute = builder.policy(Policy::Fixed(a.engine)).build()?;
    let Some(backend) = compute.backend(a.engine) else {
        eprintln!("engine {} is not available here", a.engine);
        return Ok(());
    };
    let gpu = a.engine != Engine::Simd;
    println!("engine: {}; load average at start: {}", backend.device_name(), load());
    let configs = [
        ("latency 256/1ms", BatchConfig::latency()),
        ("balanced 1024/5ms", BatchConfig::balanced()),
        ("throughput 2048/10ms", BatchConfig::throughput()),
    ];

    // The hand-off: a lone caller's tiny request (1×16 by 16×16) through the
    // executor against a direct call: the difference is what the executor adds.
    {
        let (k, n) = (16, 16);
        let wv = data(1, k * n);
        let op = compute_core::Op::matmul(1, k, n);
        let tw = if gpu { Some(backend.upload(&wv)?) } else { None };
        let mut d = direct(&compute, a.engine, (HostSlice::F32(&wv), tw.as_ref()), op, (k, n), 1, a.secs.min(1.0));
        let exec = BatchedExecutor::new(compute.clone(), BatchConfig::balanced())?;
        let w = exec.handle().register_weight(wv.clone(), k, n, WeightLayout::RowMajor)?;
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
    }

    println!(
        "\n{:<14} {:>7}  {:<20} {:>9} {:>11} {:>9} {:>9} {:>7}",
        "shape", "callers", "mode", "req/s", "range", "p50 ms", "p99 ms", "vs dir"
    );
    if a.attention {
        for &callers in &a.callers {
            let mut d = Reps::default();
            let mut b: Vec<Reps> = configs.iter().map(|_| Reps::default()).collect();
            for rep in 0..a.reps {
                if rep % 2 == 0 {
                    d.add(direct_attention(&compute, a.engine, a.kv, callers, a.secs), None);
                }
                for ((_, cfg), b) in configs.iter().zip(b.iter_mut()) {
                    let exec = BatchedExecutor::new(compute.clone(), *cfg)?;
                    let r = batched_attention(&exec, a.kv, callers, a.secs);
                    b.add(r, Some(exec.shutdown()));
                }
                if rep % 2 == 1 {
                    d.add(direct_attention(&compute, a.engine, a.kv, callers, a.secs), None);
                }
            }
            let shape = format!("attn kv {}", a.kv);
            row(&shape, callers, "direct", &d, None);
            for ((name, _), b) in configs.iter().zip(&b) {
                row(&shape, callers, name, b, Some(d.rate()));
            }
        }
        println!("\nload average at end: {}", load());
        return Ok(());
    }
    let k = a.k;
    for &n in &a.ns {
        let wv = HostVec::from_f32(a.dtype, &data(7, k * n));
        let spec = compute_core::MatmulSpec::new(1, k, n).with_dtypes(a.dtype, DType::F32);
        let op = compute_core::Op::Matmul(compute_core::MatmulSpec {
            trans_b: a.layout == WeightLayout::Transposed,
            ..spec
        });
        let shape = format!(
            "1x{k}x{n}{}{}",
            if a.layout == WeightLayout::Transposed { "T" } else { "" },
            if a.dtype == DType::BF16 { " bf16" } else { "" }
        );
        let tw = if gpu { Some(backend.upload_typed(wv.as_slice())?) } else { None };
        let w = (wv.as_slice(), tw.as_ref());
        if a.alone {
            let exec = BatchedExecutor::new(compute.clone(), BatchConfig::balanced())?;
            let sw = exec.handle().register_weight_typed(wv.clone(), k, n, a.layout)?;
            // On the CPU both read the executor's own copy of W: the same
            // pages, so neither gains from where its copy landed.
            let w = match sw.host_copy() {
                Some(h) if !gpu => (h, None),
                _ => w,
            };
            let mut one_direct = direct_call(&compute, a.engine, w, op, (k, n), 0);
            let mut one_batched = batched_call(&exec, &sw, k, 0);
            for rep in 0..a.reps {
                let (d, b) = alone_interleaved(&mut one_direct, &mut one_batched, a.secs);
                println!(
                    "{shape:<14} alone, interleaved, rep {rep}: direct p50 {:.3} ms, executor p50 {:.3} ms: {:.3}x",
                    d * 1e3,
                    b * 1e3,
                    b / d
                );
            }
            drop(exec.shutdown());
            continue;
        }
        for &callers in &a.callers {
            let mut d = Reps::default();
            let mut b: Vec<Reps> = configs.iter().map(|_| Reps::default()).collect();
            for rep in 0..a.reps {
                if rep % 2 == 0 {
                    d.add(direct(&compute, a.engine, w, op, (k, n), callers, a.secs), None);
                }
                for ((_, cfg), b) in configs.iter().zip(b.iter_mut()) {
                    let exec = BatchedExecutor::new(compute.clone(), *cfg)?;
                    let w = exec.handle().register_weight_typed(wv.clone(), k, n, a.layout)?;
                    let r = batched(&exec, &w, k, callers, a.secs);
                    b.add(r, Some(exec.shutdown()));
                }
                if rep % 2 == 1 {
                    d.add(direct(&compute, a.engine, w, op, (k, n), callers, a.secs), None);
                }
            }
            row(&shape, callers, "direct", &d, None);
            for ((name, _), b) in configs.iter().zip(&b) {
                row(&shape, callers, name, b, Some(d.rate()));
            }
        }
    }
    println!("\nload average at end: {}", load());
    Ok(())
}
