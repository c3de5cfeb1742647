//! Bench rows for the dispatcher (`cargo xtask bench --dispatch`):
//! - the profile measurement itself (how long `calibrate()` takes);
//! - the cost of one decision, per policy (goal: under 1 µs);
//! - the regret grid: every engine timed on each op family × size × placement
//!   (data on the host, or already on each engine's device); for each policy
//!   (`auto`, the 5× PCIe rule, the fixed threshold of 1000) the
//!   regret of a cell is time(chosen engine) / time(fastest engine); add,
//!   softmax and matmul also run on bf16 data (matmul: bf16 in, f32 out);
//! - the batching executor against unbatched calls: three configurations ×
//!   2–16 submitting threads, and `max_batch_size` 16–4096;
//! - the Llama decoder on every engine (`crate::decoder`).
//!
//! On a machine without a GPU the engines are the CPU on all threads (`simd`)
//! and on one (`simd1`), plus wgpu on a software adapter if one is installed
//! (lavapipe); `DISPATCH_ENGINES=simd,simd1` restricts the grid to the named
//! engines, and the regret then measures the thread-count choice only.

use std::cell::RefCell;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use compute_core::{
    Backend, BinaryOp, Conv2dSpec, DType, GeluForm, HostSlice, HostVec, MatmulSpec, Op, RowOp, Tensor, UnaryOp,
};
use dispatch::calibrate::Options;
use dispatch::timing::Call;
use dispatch::{BackendSelector, BatchConfig, BatchedExecutor, Compute, Engine, FIXED_THRESHOLD, Placement, Policy};

use crate::report::{Record, random, time};

/// Runs the dispatch rows; `quick` shrinks the grid and the budgets (< 2 min
/// on 2 cores). With a `filter` (`--filter`), the grid, the executor rows and
/// the decoder rows run only where their ops' names (`regret…`,
/// `executor/…`, `llama …`) could contain it; the calibration always runs.
pub fn rows(quick: bool, filter: Option<&str>) -> Result<Vec<Record>, String> {
    let wanted = |names: &str| filter.is_none_or(|f| names.contains(f) || f.starts_with(names));
    let e = |e: compute_core::ComputeError| e.to_string();
    let t0 = Instant::now();
    let opts = Options::default();
    // `DISPATCH_ENGINES=simd,simd1` (names as in the tables) restricts the grid to some engines.
    let only: Option<Vec<String>> =
        std::env::var("DISPATCH_ENGINES").ok().map(|v| v.split(',').map(|x| x.trim().to_string()).collect());
    let mut builder = Compute::builder();
    for (engine, backend) in dispatch::discover::available() {
        if only.as_ref().is_none_or(|o| o.iter().any(|x| x == engine.as_str())) {
            builder = builder.engine(engine, backend);
        }
    }
    let open_s = t0.elapsed().as_secs_f64();
    let compute = builder.calibration_options(opts).calibrate().build().map_err(e)?;
    let calib_s = t0.elapsed().as_secs_f64();
    let steps = compute.profile().timings_text();
    eprintln!("calibration: {calib_s:.2} s; engines opened in {open_s:.2} s, then {steps}");
    let device = compute.device_name();
    let mut out = vec![Record {
        op: "calibrate".into(),
        shape: format!("{} engines", compute.engines().len()),
        backend: "dispatch".into(),
        device: device.clone(),
        threads: 1,
        placement: "-".into(),
        median_s: calib_s,
        note: Some(format!(
            "default calibration of {:?}: engines opened in {open_s:.2} s, then {steps}",
            compute.engines()
        )),
        ..Record::default()
    }];
    out.extend(decision_rows(&compute, &device));
    if wanted("regret/") {
        out.extend(regret_rows(&compute, &device, &Grid::new(quick))?);
    }
    if wanted("executor/") {
        out.extend(executor_rows(&compute, &device, quick)?);
    }
    if wanted("llama ") {
        out.extend(crate::decoder::rows(&compute, quick));
    }
    Ok(out)
}

fn policies(compute: &Compute) -> [(&'static str, Compute); 3] {
    [
        ("auto", compute.with_policy(Policy::Auto)),
        ("5x rule", compute.with_policy(Policy::FiveX(BackendSelector::new()))),
        ("threshold 1000", compute.with_policy(Policy::Threshold(FIXED_THRESHOLD))),
    ]
}

/// Seconds per decision of each policy over a mix of ops and placements.
fn decision_rows(compute: &Compute, device: &str) -> Vec<Record> {
    let ops = [
        Op::binary(BinaryOp::Add, 1 << 20),
        Op::unary(UnaryOp::Gelu(GeluForm::Tanh), 4096),
        Op::dot(1 << 16),
        Op::rows(RowOp::Softmax, 64, 1024),
        Op::matmul(512, 512, 512),
        Op::matmul(16, 16, 16),
    ];
    let placements = [Placement::Host, Placement::Resident];
    policies(compute)
        .into_iter()
        .map(|(name, c)| {
            let per_call = 1000;
            let s = time(
                || {
                    for i in 0..per_call {
                        let op = &ops[i % ops.len()];
                        black_box(c.choose(black_box(op), placements[i % 2]));
                    }
                },
                Duration::from_millis(200),
                5,
            ) / per_call as f64;
            Record {
                op: "decision".into(),
                shape: name.into(),
                backend: "dispatch".into(),
                device: device.into(),
                threads: 1,
                placement: "host+resident".into(),
                median_s: s,
                note: Some(format!("{:.0} ns per choose() over {} engines (goal < 1 µs)", s * 1e9, c.engines().len())),
                ..Record::default()
            }
        })
        .collect()
}

struct Grid {
    lens: Vec<usize>,
    matmul: Vec<usize>,
    conv_hw: Vec<usize>,
    budget: Duration,
    max_call_s: f64,
}

impl Grid {
    fn new(quick: bool) -> Grid {
        if quick {
            Grid {
                lens: (3..=11).map(|p| 1usize << (2 * p)).collect(),
                matmul: vec![16, 32, 64, 128, 256, 512],
                conv_hw: vec![4, 8, 16, 32, 64],
                budget: Duration::from_millis(40),
                max_call_s: 0.25,
            }
        } else {
            Grid {
                lens: (3..=13).map(|p| 1usize << (2 * p)).collect(),
                matmul: vec![16, 32, 64, 128, 256, 512, 1024, 2048, 4096],
                conv_hw: vec![4, 8, 16, 32, 64, 128, 256, 512],
                budget: Duration::from_millis(60),
                max_call_s: 5.0,
            }
        }
    }

    /// (family, shape label, op) for every cell, grouped by family in increasing size.
    fn cells(&self) -> Vec<(&'static str, String, Op)> {
        let mut v = Vec::new();
        for &n in &self.lens {
            let label = format!("2^{}", n.trailing_zeros());
            v.push(("add", label.clone(), Op::binary(BinaryOp::Add, n)));
            v.push(("add bf16", label.clone(), Op::binary(BinaryOp::Add, n).with_dtype(DType::BF16)));
            v.push(("gelu", label.clone(), Op::unary(UnaryOp::Gelu(GeluForm::Tanh), n)));
            v.push(("dot", label.clone(), Op::dot(n)));
            let cols = n.min(256);
            v.push(("softmax", label.clone(), Op::rows(RowOp::Softmax, n / cols, cols)));
            v.push(("softmax bf16", label, Op::rows(RowOp::Softmax, n / cols, cols).with_dtype(DType::BF16)));
        }
        for &n in &self.matmul {
            v.push(("matmul", format!("{n}^3"), Op::matmul(n, n, n)));
            // bf16 operands, f32 accumulation and output (the usual inference GEMM).
            let spec = MatmulSpec::new(n, n, n).with_dtypes(DType::BF16, DType::F32);
            v.push(("matmul bf16", format!("{n}^3"), Op::Matmul(spec)));
        }
        for &hw in &self.conv_hw {
            v.push(("conv2d", format!("16x{hw}x{hw}"), Op::Conv2d(Conv2dSpec::same(16, hw, 16, 3))));
        }
        v.sort_by_key(|(f, _, _)| *f);
        v
    }
}

/// One engine's call of a cell, ready to time: `run_typed` on host data
/// (transfers included) or `run_tensors` + synchronise on data resident on the
/// engine, in the op's dtypes. Timed with the same rotating bursts as
/// calibration ([`dispatch::timing`]).
fn prepare<'a>(
    backend: &'a dyn Backend,
    op: &'a Op,
    inputs: &'a [HostVec],
    out: &'a RefCell<HostVec>,
    resident: bool,
) -> Result<Call<'a>, String> {
    let e = |e: compute_core::ComputeError| format!("{} {}: {e}", op.name(), op.shapes());
    let result = op.layout().map_err(e)?.output();
    if resident {
        let ts =
            inputs.iter().map(|v| backend.upload_typed(v.as_slice())).collect::<Result<Vec<Tensor>, _>>().map_err(e)?;
        let o = backend.alloc_typed(result.len, result.dtype).map_err(e)?;
        Ok(Box::new(move || {
            let refs: Vec<&Tensor> = ts.iter().collect();
            backend.run_tensors(op, &refs, &o).and_then(|()| backend.synchronize())
        }))
    } else {
        Ok(Box::new(move || {
            let refs: Vec<HostSlice<'_>> = inputs.iter().map(HostVec::as_slice).collect();
            backend.run_typed(op, &refs, out.borrow_mut().as_mut())
        }))
    }
}

struct Cell {
    family: &'static str,
    shape: String,
    resident: bool,
    /// Per engine: (seconds, measured (false = extrapolated past the time cap)).
    times: Vec<(Engine, f64, bool)>,
    choices: [Engine; 3],
    /// Ratio of two estimates of the same engine (`simd`) in this cell, each the
    /// faster of two medians as the engines' times are: the noise floor.
    noise: Option<f64>,
    /// What `auto`'s model predicted per engine (seconds), to show where it was wrong.
    predicted: Vec<(Engine, f64)>,
}

/// One cell's inputs in their dtypes (the same seeds in both passes).
fn cell_inputs(op: &Op) -> Result<Vec<HostVec>, String> {
    let layout = op.layout().map_err(|e| e.to_string())?;
    Ok(layout
        .inputs()
        .iter()
        .enumerate()
        .map(|(i, o)| HostVec::from_f32(o.dtype, &random(o.len, 17 + i as u64 + o.len as u64)))
        .collect())
}

/// Medians of `engines` on `op` (rotating bursts), plus a second, identical call
/// of the all-threads CPU engine when `twin` (its median comes last).
fn time_engines(
    backends: &[(Engine, Arc<dyn Backend>)],
    engines: &[Engine],
    twin: bool,
    op: &Op,
    resident: bool,
    budget: Duration,
    min_rounds: usize,
) -> Result<Vec<f64>, String> {
    let inputs = cell_inputs(op)?;
    // On host data every engine reads the same inputs and writes the same
    // output buffer: a call's time at small sizes depends on where its buffers
    // lie relative to each other (4K aliasing), which is the caller's, not
    // the engine's, doing.
    let result = op.layout().map_err(|e| e.to_string())?.output();
    let out = RefCell::new(HostVec::zeros(result.dtype, result.len));
    let mut calls: Vec<Option<Call<'_>>> = Vec::new();
    let find = |e: Engine| backends.iter().find(|(x, _)| *x == e).map(|(_, b)| b.as_ref());
    for &e in engines.iter().chain(twin.then_some(&Engine::Simd)) {
        let b = find(e).ok_or_else(|| format!("no engine {e}"))?;
        calls.push(Some(prepare(b, op, &inputs, &out, resident)?));
    }
    let medians = dispatch::timing::median_round_robin(&mut calls, budget, min_rounds, 5000, dispatch::timing::BURST)
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|m| m.unwrap_or(f64::NAN))
        .collect();
    Ok(medians)
}

/// Engines within this factor of a cell's fastest (first pass) are timed again.
const RETIME_WITHIN: f64 = 3.0;

fn regret_rows(compute: &Compute, device: &str, g: &Grid) -> Result<Vec<Record>, String> {
    let engines = compute.engines();
    let pols = policies(compute);
    let backends: Vec<(Engine, Arc<dyn Backend>)> =
        engines.iter().filter_map(|&e| compute.backend(e).map(|b| (e, b))).collect();
    let t0 = Instant::now();
    // Pass 1: every cell, every engine (past the time cap: extrapolated from the
    // family's previous size). Per cell: its times, and the two medians of `simd`
    // and its twin.
    struct Pending {
        family: &'static str,
        shape: String,
        op: Op,
        resident: bool,
        times: Vec<(Engine, f64, bool)>,
        min_rounds: usize,
        twin: Option<(f64, f64)>,
    }
    let mut pending: Vec<Pending> = Vec::new();
    for resident in [false, true] {
        // Last measured (work, seconds) per engine and family, to skip calls past the cap.
        let mut last: std::collections::HashMap<(Engine, &'static str), (f64, f64)> = Default::default();
        for (family, shape, op) in g.cells() {
            let work = op.cost().flops.max(op.cost().bytes()) as f64;
            let mut times = Vec::new();
            let mut timed: Vec<Engine> = Vec::new();
            let mut slow = false;
            for (eng, b) in &backends {
                if !b.supports(&op) {
                    continue;
                }
                let predicted = last.get(&(*eng, family)).map(|&(w, s)| s * work / w);
                match predicted {
                    Some(p) if p > g.max_call_s => times.push((*eng, p, false)),
                    _ => {
                        slow |= predicted.is_some_and(|p| p > 0.05);
                        timed.push(*eng);
                    }
                }
            }
            // A second, identical call of the all-threads CPU engine: the gap between
            // its two estimates is the measurement's noise floor for this cell.
            let twin = timed.contains(&Engine::Simd);
            let min_rounds = if slow { 1 } else { 5 };
            let mut medians = time_engines(&backends, &timed, twin, &op, resident, g.budget, min_rounds)?;
            let twin = if twin {
                let again = medians.pop().unwrap_or(f64::NAN);
                let first = timed.iter().position(|&e| e == Engine::Simd).and_then(|i| medians.get(i));
                first.map(|&f| (f, again))
            } else {
                None
            };
            for (eng, s) in timed.into_iter().zip(medians) {
                last.insert((eng, family), (work, s));
                times.push((eng, s, true));
            }
            if times.iter().any(|t| t.2) {
                pending.push(Pending { family, shape, op, resident, times, min_rounds, twin });
            }
        }
    }
    // Pass 2, the whole grid later: the engines within RETIME_WITHIN of each cell's
    // fastest, and those a policy chooses there (whose time is that policy's
    // regret), are timed again, and each keeps the faster of its two medians. A
    // shared machine has phases of tens of milliseconds in which one engine runs
    // up to 2× slower (on the 2-core VM: a two-thread engine that lost a core); a
    // median taken in one is not that engine's speed, and two medians a whole
    // grid apart rarely both fall in one. Calibration measures the same way.
    let mut cells: Vec<Cell> = Vec::new();
    for mut c in pending {
        let placement = if c.resident { Placement::Resident } else { Placement::Host };
        let choices = [0, 1, 2].map(|i| pols[i].1.choose(&c.op, placement));
        let best = c.times.iter().filter(|t| t.2).map(|t| t.1).fold(f64::INFINITY, f64::min);
        let chosen = |e: Engine| choices.contains(&e);
        let again: Vec<Engine> =
            c.times.iter().filter(|t| t.2 && (t.1 <= RETIME_WITHIN * best || chosen(t.0))).map(|t| t.0).collect();
        let twin = c.twin.is_some() && again.contains(&Engine::Simd);
        let mut medians = time_engines(&backends, &again, twin, &c.op, c.resident, g.budget, c.min_rounds)?;
        if let (true, Some((first, first_twin))) = (twin, c.twin) {
            let twin_again = medians.pop().unwrap_or(f64::NAN);
            let simd_again = again.iter().position(|&e| e == Engine::Simd).and_then(|i| medians.get(i)).copied();
            c.twin = simd_again.map(|s| (first.min(s), first_twin.min(twin_again)));
        }
        for (e, s) in again.into_iter().zip(medians) {
            if let Some(t) = c.times.iter_mut().find(|t| t.0 == e) {
                t.1 = t.1.min(s);
            }
        }
        let noise = c.twin.map(|(a, b)| a.max(b) / a.min(b));
        let model = compute.model();
        let predicted = c.times.iter().filter_map(|t| model.predict(t.0, &c.op, placement).map(|p| (t.0, p))).collect();
        cells.push(Cell {
            family: c.family,
            shape: c.shape,
            resident: c.resident,
            times: c.times,
            choices,
            noise,
            predicted,
        });
    }
    let grid_s = t0.elapsed().as_secs_f64();
    let mut out = Vec::new();
    let regret = |c: &Cell, e: Engine| {
        let best = c.times.iter().map(|t| t.1).fold(f64::INFINITY, f64::min);
        c.times.iter().find(|t| t.0 == e).map(|t| t.1 / best)
    };
    for c in &cells {
        let (best_e, best_s, _) =
            c.times.iter().copied().min_by(|a, b| a.1.total_cmp(&b.1)).unwrap_or((Engine::Simd, f64::NAN, false));
        let auto = c.choices[0];
        let auto_s = c.times.iter().find(|t| t.0 == auto).map_or(f64::NAN, |t| t.1);
        let engines_txt: Vec<String> = c
            .times
            .iter()
            .map(|(e, s, m)| format!("{e}={:.3e}{}", s, if *m { "" } else { "(extrapolated)" }))
            .collect();
        let regrets: Vec<String> = pols
            .iter()
            .zip(c.choices)
            .map(|((name, _), e)| format!("{name}:{e} {:.2}", regret(c, e).unwrap_or(f64::NAN)))
            .collect();
        out.push(
            Record {
                op: format!("regret/{}", c.family),
                shape: c.shape.clone(),
                backend: auto.as_str().into(),
                device: device.into(),
                threads: 1,
                placement: if c.resident { "resident" } else { "host" }.into(),
                median_s: auto_s,
                note: Some(format!(
                    "{}; {}; predicted {}; noise floor {}",
                    regrets.join(", "),
                    engines_txt.join(" "),
                    c.predicted.iter().map(|(e, p)| format!("{e}={p:.3e}")).collect::<Vec<_>>().join(" "),
                    c.noise.map_or("-".to_string(), |n| format!("{n:.2}"))
                )),
                ..Record::default()
            }
            .with_peer(&format!("best:{best_e}"), best_s),
        );
    }
    // Summaries: geometric mean and worst regret per policy, over all cells and per placement.
    let noise: Vec<(&Cell, f64)> = cells.iter().filter_map(|c| c.noise.map(|n| (c, n))).collect();
    out.extend(summary("noise floor (simd timed twice per cell", "noise floor", "simd", "all", &noise, device, ""));
    for (i, (name, _)) in pols.iter().enumerate() {
        for scope in ["all", "host", "resident"] {
            let sel: Vec<(&Cell, f64)> = cells
                .iter()
                .filter(|c| scope == "all" || (scope == "resident") == c.resident)
                .filter_map(|c| regret(c, c.choices[i]).map(|r| (c, r)))
                .collect();
            let label = format!("{name} regret ({scope}");
            let grid = format!("; grid took {grid_s:.1} s");
            out.extend(summary(&label, &format!("{name} / {scope}"), "dispatch", scope, &sel, device, &grid));
        }
    }
    Ok(out)
}

/// One summary row: the geometric mean (in `median_s`) and the worst (in `ratio`) of
/// per-cell ratios, also printed; `None` when there are no cells.
fn summary(
    label: &str,
    shape: &str,
    backend: &str,
    placement: &str,
    cells: &[(&Cell, f64)],
    device: &str,
    extra: &str,
) -> Option<Record> {
    let &(first, _) = cells.first()?;
    let geo = (cells.iter().map(|(_, r)| r.ln()).sum::<f64>() / cells.len() as f64).exp();
    let (wc, worst) = cells.iter().copied().max_by(|a, b| a.1.total_cmp(&b.1)).unwrap_or((first, 1.0));
    let text = format!(
        "{label}, {} cells): geo-mean {geo:.3}, worst {worst:.3} at {} {} {}",
        cells.len(),
        wc.family,
        wc.shape,
        if wc.resident { "resident" } else { "host" }
    );
    eprintln!("{text}");
    Some(Record {
        op: "regret".into(),
        shape: shape.into(),
        backend: backend.into(),
        device: device.into(),
        threads: 1,
        placement: placement.into(),
        median_s: geo,
        ratio: Some(worst),
        note: Some(format!("median_s holds the geo-mean, ratio the worst; {text}{extra}")),
        ..Record::default()
    })
}

/// Per-request latencies (seconds) and wall time of `threads` threads each making `n` requests.
struct Load {
    lat: Vec<f64>,
    wall_s: f64,
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(((v.len().saturating_sub(1)) as f64 * p).round() as usize).copied().unwrap_or(f64::NAN)
}

/// Random inputs of a request (one vector per operand), different per thread.
fn request_inputs(op: &Op, seed: u64) -> Result<Vec<Vec<f32>>, String> {
    let layout = op.layout().map_err(|e| e.to_string())?;
    Ok(layout.input_lens().enumerate().map(|(i, n)| random(n, seed * 31 + i as u64)).collect())
}

fn unbatched(compute: &Compute, threads: usize, n: usize, op: &Op) -> Result<Load, String> {
    let start = Instant::now();
    let results: Vec<Result<Vec<f64>, String>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let x = request_inputs(op, t as u64 + 1)?;
                    let refs: Vec<&[f32]> = x.iter().map(Vec::as_slice).collect();
                    let mut out = vec![0.0f32; op.layout().map_err(|e| e.to_string())?.output_len()];
                    let mut lat = Vec::with_capacity(n);
                    for _ in 0..n {
                        let t = Instant::now();
                        compute.run(op, &refs, &mut out).map_err(|e| e.to_string())?;
                        lat.push(t.elapsed().as_secs_f64());
                    }
                    Ok(lat)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("thread panicked".into()))).collect()
    });
    let wall_s = start.elapsed().as_secs_f64();
    let mut lat = Vec::new();
    for r in results {
        lat.extend(r?);
    }
    Ok(Load { lat, wall_s })
}

fn batched(exec: &BatchedExecutor, threads: usize, n: usize, op: &Op, window: usize) -> Result<Load, String> {
    let start = Instant::now();
    let results: Vec<Result<Vec<f64>, String>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let h = exec.handle();
                s.spawn(move || {
                    let x = request_inputs(op, t as u64 + 1)?;
                    let mut lat = Vec::with_capacity(n);
                    let mut inflight = std::collections::VecDeque::new();
                    let finish = |(sent, r): (Instant, dispatch::AsyncGpuResult<Vec<f32>>), lat: &mut Vec<f64>| {
                        let done = r.completed_at();
                        r.wait().map_err(|e| e.to_string())?;
                        let end = done.unwrap_or_else(Instant::now);
                        lat.push(end.saturating_duration_since(sent).as_secs_f64());
                        Ok::<(), String>(())
                    };
                    for _ in 0..n {
                        if inflight.len() >= window
                            && let Some(p) = inflight.pop_front()
                        {
                            finish(p, &mut lat)?;
                        }
                        let sent = Instant::now();
                        let r = h.submit(*op, x.clone()).map_err(|e| e.to_string())?;
                        inflight.push_back((sent, r));
                    }
                    while let Some(p) = inflight.pop_front() {
                        finish(p, &mut lat)?;
                    }
                    Ok(lat)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("thread panicked".into()))).collect()
    });
    let wall_s = start.elapsed().as_secs_f64();
    let mut lat = Vec::new();
    for r in results {
        lat.extend(r?);
    }
    Ok(Load { lat, wall_s })
}

/// The executor against unbatched calls: the three standard configurations ×
/// 2–16 submitting threads and `max_batch_size` 16–4096, on a tiny request
/// (gelu of 256 elements, which the CPU answers in well under a microsecond),
/// and the balanced configuration on a request with real work (a 64³ matmul,
/// 0.5 MFLOP), where one dispatch of many products can pay.
fn executor_rows(compute: &Compute, device: &str, quick: bool) -> Result<Vec<Record>, String> {
    let gelu = Op::unary(UnaryOp::Gelu(GeluForm::Tanh), 256);
    let matmul = Op::matmul(64, 64, 64);
    let per_thread = if quick { 2000 } else { 8000 };
    let thread_counts: &[usize] = if quick { &[2, 8, 16] } else { &[2, 4, 8, 16] };
    let sizes: &[usize] = if quick { &[16, 256, 4096] } else { &[16, 64, 256, 1024, 4096] };
    let mut runs: Vec<(String, BatchConfig, usize, Op, usize)> = Vec::new();
    for (name, cfg) in [
        ("latency", BatchConfig::latency()),
        ("balanced", BatchConfig::balanced()),
        ("throughput", BatchConfig::throughput()),
    ] {
        for &t in thread_counts {
            runs.push((format!("{name} t={t}"), cfg, t, gelu, per_thread));
        }
    }
    for &bs in sizes {
        runs.push((format!("bs={bs} t=8"), BatchConfig::balanced().with_max_batch_size(bs), 8, gelu, per_thread));
    }
    for &t in &[2usize, 8, 16] {
        runs.push((format!("balanced t={t}"), BatchConfig::balanced(), t, matmul, per_thread / 8));
    }
    let mut base: std::collections::HashMap<(usize, String), (f64, f64, f64)> = Default::default();
    let mut out = Vec::new();
    for (label, cfg, threads, op, n) in runs {
        let what = format!("{}[{}]", op.name(), op.shapes());
        let (u_per_req, u_p50, u_p99) = match base.get(&(threads, what.clone())) {
            Some(&b) => b,
            None => {
                let mut u = unbatched(compute, threads, n, &op)?;
                let b = (u.wall_s / u.lat.len() as f64, pct(&mut u.lat, 0.5), pct(&mut u.lat, 0.99));
                base.insert((threads, what.clone()), b);
                b
            }
        };
        let exec = BatchedExecutor::new(compute.clone(), cfg).map_err(|e| e.to_string())?;
        // In flight per thread: enough for full batches, bounded so queueing stays finite.
        let window = (2 * cfg.max_batch_size / threads).max(64);
        let mut l = batched(&exec, threads, n, &op, window)?;
        let m = exec.shutdown();
        let per_req = l.wall_s / l.lat.len() as f64;
        let (p50, p99) = (pct(&mut l.lat, 0.5), pct(&mut l.lat, 0.99));
        out.push(
            Record {
                op: format!("executor/{}", op.name()),
                shape: format!("{label} bs={} wait={}ms", cfg.max_batch_size, cfg.max_wait.as_millis()),
                backend: "dispatch".into(),
                device: device.into(),
                threads,
                placement: "host".into(),
                median_s: per_req,
                note: Some(format!(
                    "{what} x{n}/thread, window {window}: batched {:.0} req/s p50 {:.1} µs p99 {:.1} µs; unbatched {:.0} req/s p50 {:.1} µs p99 {:.1} µs; {} batches, mean {:.1}, fill {:.1}%, flushes size/timeout/shutdown {}/{}/{}, queue p50 {:.1} µs p99 {:.1} µs; engines {}",
                    1.0 / per_req,
                    p50 * 1e6,
                    p99 * 1e6,
                    1.0 / u_per_req,
                    u_p50 * 1e6,
                    u_p99 * 1e6,
                    m.batches,
                    m.mean_batch_size,
                    m.fill_rate * 100.0,
                    m.flush_size,
                    m.flush_timeout,
                    m.flush_shutdown,
                    m.queue_p50_s * 1e6,
                    m.queue_p99_s * 1e6,
                    m.engines_text()
                )),
                ..Record::default()
            }
            .with_peer("unbatched", u_per_req),
        );
    }
    Ok(out)
}
