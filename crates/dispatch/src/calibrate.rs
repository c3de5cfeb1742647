//! Measures a [`Profile`] on this machine, and keeps it in the user's cache.
//!
//! For each engine: the fixed cost of a call on resident data (launch +
//! synchronise), for GPUs the host↔device bandwidth and per-call staging
//! overhead, and for each op class and dtype in [`LADDERS`] the call time at a
//! ladder of sizes (data resident). At each size the engines are timed
//! round-robin, in bursts each round ([`crate::timing`]), so that a load spike
//! on a shared machine hits all of them alike; each ladder is measured
//! [`PASSES`] times (a whole pass up the ladder apart) and each point keeps
//! the fastest median, so that a phase of a few tens of milliseconds in which
//! the machine was busy elsewhere does not become an engine's speed. Only the
//! engines in the running at a size (`contenders`: within [`RUNNING_WITHIN`]
//! of the fastest) are timed again there. A ladder stops early for an engine
//! when its next size would take longer than [`Options::max_call`], or once it
//! is [`DROP_BEYOND`] times slower than the fastest past its fixed cost
//! ([`FIXED_SHARE`]; the two smallest sizes are always measured); the model
//! extrapolates linearly past the last sample. First, each GPU engine
//! compiles the kernels of every ladder op ([`Backend::prepare`], the engines
//! at once), so that no size's step pays for it; after the links are
//! measured, each is fitted to one real host call (`fit_links_to_host_calls`).
//!
//! [`LADDERS`] holds every op class on `f32` data, and add, softmax and matmul
//! on `bf16` data. Default options took 1.2 s for the two CPU engines of the
//! 2-core development machine (engines already open), and 2.00–2.01 s for
//! four engines on the H200 machine, 3.34 s in a freshly started machine's
//! first process, where CUDA's driver compiles the kernels (2026-11-27).
//! [`Profile::timings`] holds each step's time; see `docs/dispatch.md`.
//!
//! The profile is saved as JSON in `$COMPUTE_PROFILE` if set, else
//! `$XDG_CACHE_HOME/compute/profile-<hash>.json`, else
//! `~/.cache/compute/profile-<hash>.json`, where the hash is that of
//! [`profile_key`]: a profile measured on other hardware or drivers is never reused.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use compute_core::conformance::rng::Rng;
use compute_core::{
    Backend, BackendKind, BinaryOp, ComputeError, Conv2dSpec, DType, GeluForm, HostSlice, HostVec, Op, OpClass, Result,
    RowOp, Tensor, UnaryOp, bf16, f16,
};

use crate::engine::Engine;
use crate::profile::{ClassCurve, CurveKey, EngineProfile, FORMAT, Link, Point, Profile, StepTime, work};
use crate::timing::{Call, median_round_robin};

/// Times each class's ladder is measured; each point keeps its fastest median.
pub const PASSES: usize = 2;

/// The half-precision ladders spend this fraction of
/// [`Options::budget_per_point`] on each size, in at least
/// [`HALF_MIN_ROUNDS`] rounds per pass. With the `f32` ladders' share and
/// sizes they added 0.75–1.0 s to a 2.0–2.4 s calibration on the 2-core
/// machine (three engines); with this share and their sparser sizes (see
/// `ladder`), 0.35 s.
pub const HALF_POINT_SHARE: f64 = 0.25;

/// The half-precision ladders' least rounds per size and pass (at most
/// [`Options::min_reps`]). With four engines the rounds, not
/// [`HALF_POINT_SHARE`], set those ladders' time: with three rounds (and
/// bursts of 1 ms) they took 0.68–0.71 s of a 3.0–3.1 s calibration on the
/// H200 machine.
pub const HALF_MIN_ROUNDS: usize = 2;

/// How long calibration may take.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Options {
    /// Time spent timing one size, split over the [`PASSES`] (at least
    /// `min_reps` rounds in each).
    pub budget_per_point: Duration,
    /// Minimum rounds of bursts per size and pass (minimum calls timed, after
    /// one warm-up call, where a size is timed call by call).
    pub min_reps: usize,
    /// A ladder stops before a size whose single call would exceed this.
    pub max_call: Duration,
    /// Time per engine (the total is this times the number of engines, shared
    /// equally by the op classes); a class's ladders are cut short past its share.
    pub max_per_engine: Duration,
    /// Time each burst of one engine's calls takes samples for, after its
    /// settling calls ([`crate::timing::median_round_robin`]).
    pub burst: Duration,
}

impl Default for Options {
    /// 10 ms per size, ≥ 3 rounds per pass, bursts of 0.25 ms, calls up to
    /// 10 ms, 2.5 s per engine. With four engines (two GPUs, two CPU engines)
    /// the rounds rather than the 10 ms set the time of most sizes; on the H200
    /// machine these options took 2.18–2.31 s where 16 ms per size and bursts
    /// of 1 ms took 2.92–3.49 s, and the regret over the dispatch benchmark's
    /// grid stayed at a geometric mean of 1.001–1.004 (2026-11-27).
    fn default() -> Self {
        Options {
            budget_per_point: Duration::from_millis(10),
            min_reps: 3,
            max_call: Duration::from_millis(10),
            max_per_engine: Duration::from_millis(2500),
            burst: Duration::from_micros(250),
        }
    }
}

impl Options {
    /// A fast, coarse calibration (tests, CI): 3 ms per size, bursts of
    /// 0.25 ms, calls up to 10 ms.
    pub fn quick() -> Self {
        Options {
            budget_per_point: Duration::from_millis(3),
            min_reps: 2,
            max_call: Duration::from_millis(10),
            max_per_engine: Duration::from_millis(600),
            burst: Duration::from_micros(250),
        }
    }
}

/// The identity of a machine's engines: format, crate version, and each
/// engine's device description (which the backends make include the driver).
pub fn profile_key(engines: &[(Engine, Arc<dyn Backend>)]) -> String {
    let devices: Vec<String> = engines.iter().map(|(e, b)| format!("{e}={}", b.device_name())).collect();
    format!("format {FORMAT}; dispatch {}; {}", env!("CARGO_PKG_VERSION"), devices.join("; "))
}

fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

/// Where the profile of the machine with `key` is cached (see the module docs);
/// `None` when neither `COMPUTE_PROFILE`, `XDG_CACHE_HOME` nor `HOME` is set.
pub fn cache_path(key: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("COMPUTE_PROFILE").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").filter(|p| !p.is_empty()).map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("compute").join(format!("profile-{:016x}.json", fnv1a(key))))
}

/// A failed file operation on the profile cache, keeping `e` as the source.
fn io_error(action: &str, path: &Path, e: impl std::error::Error + Send + Sync + 'static) -> ComputeError {
    ComputeError::driver("calibrate", BackendKind::Simd, format!("{action} {}: {e}", path.display())).with_cause(e)
}

/// Reads the profile at `path` if it exists, parses, has this [`FORMAT`] and
/// the given `key`. One file read.
pub fn load(path: &Path, key: &str) -> Option<Profile> {
    let text = std::fs::read_to_string(path).ok()?;
    let profile: Profile = serde_json::from_str(&text).ok()?;
    (profile.format == FORMAT && profile.key == key).then_some(profile)
}

/// Writes `profile` to `path` as JSON (creating the folder; written to a
/// temporary file first, then renamed, so readers never see half a file).
pub fn save(profile: &Profile, path: &Path) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| io_error("creating", dir, e))?;
    }
    let text = serde_json::to_string_pretty(profile).map_err(|e| io_error("serialising for", path, e))?;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, text).map_err(|e| io_error("writing", &tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| io_error("renaming to", path, e))
}

/// What `cargo xtask calibrate` runs: finds the engines, measures them with
/// the default [`Options`] and saves the profile to [`cache_path`]. Returns the
/// profile and where it was written. Takes a few seconds.
pub fn run_and_save() -> Result<(Profile, PathBuf)> {
    let engines = crate::discover::available();
    let key = profile_key(&engines);
    let profile = calibrate(&engines, &Options::default())?;
    let path = cache_path(&key).ok_or_else(|| ComputeError::Driver {
        op: "calibrate",
        backend: BackendKind::Simd,
        message: "no cache directory: set COMPUTE_PROFILE, XDG_CACHE_HOME or HOME".into(),
        cause: None,
    })?;
    save(&profile, &path)?;
    Ok((profile, path))
}

/// Measures every engine in `engines` and returns their [`Profile`], keyed by
/// [`profile_key`]. An op class an engine does not support gets no curve (the
/// model then never picks that engine for it); any other failure is returned.
/// `Unsupported` on wasm32, which has no clock to measure with: a browser
/// build uses [`Profile::nominal`](crate::Profile::nominal) figures.
pub fn calibrate(engines: &[(Engine, Arc<dyn Backend>)], opts: &Options) -> Result<Profile> {
    if cfg!(target_arch = "wasm32") {
        // No clock and no blocking waits on wasm32-unknown-unknown.
        return Err(ComputeError::Unsupported { op: "calibrate", backend: BackendKind::Simd });
    }
    let mut timings = Vec::new();
    let mut step = Instant::now();
    let mut lap = |name: String| {
        timings.push(StepTime { step: name, seconds: step.elapsed().as_secs_f64() });
        step = Instant::now();
    };
    let tiny = Op::unary(UnaryOp::Relu, 64);
    // Every kernel the ladders need (half-precision ones included), compiled up
    // front instead of in the warm-up calls of each size's step.
    let mut all: Vec<Op> = LADDERS.into_iter().flat_map(|k| ladder(k).0).collect();
    all.push(tiny);
    let backends: Vec<&dyn Backend> = engines.iter().map(|(_, b)| b.as_ref()).collect();
    let each = prepare_timed(&backends, &all)?;
    // The GPU engines' own times (the step takes as long as the slowest).
    let gpus: Vec<String> =
        engines.iter().zip(&each).filter(|((e, _), _)| e.is_gpu()).map(|((e, _), s)| format!("{e} {s:.2} s")).collect();
    lap(if gpus.is_empty() { "prepare".into() } else { format!("prepare ({})", gpus.join(", ")) });
    let mut pool = RandomPool::new(0x5eed_0001);
    let launches = time_all(engines, &tiny, &mut pool, opts)?;
    lap("launch".into());
    let mut out = Vec::with_capacity(engines.len());
    for ((engine, b), launch) in engines.iter().zip(&launches) {
        let launch_s = launch.ok_or_else(|| ComputeError::Unsupported { op: tiny.name(), backend: engine.kind() })?;
        let link = if engine.is_gpu() {
            let link = measure_link(b.as_ref(), &tiny, launch_s, &mut pool, opts)?;
            lap(format!("link {engine}"));
            Some(link)
        } else {
            None
        };
        out.push(EngineProfile { engine: *engine, device: b.device_name(), launch_s, link, classes: Vec::new() });
    }
    if out.iter().any(|e| e.link.is_some()) {
        fit_links_to_host_calls(engines, &mut out, &mut pool, opts)?;
        lap("host calls".into());
    }
    // Each ladder gets a share of the time left in proportion to its number of
    // sizes, so that slow early ladders (large element-wise sizes on a software
    // GPU) cannot starve matmul, conv and the half-precision ladders, and time a
    // ladder leaves unspent goes to the ones after it.
    let total = opts.max_per_engine.saturating_mul(engines.len().max(1) as u32);
    let sizes: Vec<usize> = LADDERS.iter().map(|&k| ladder(k).0.len()).collect();
    let ladders_started = Instant::now();
    for (l, key) in LADDERS.into_iter().enumerate() {
        let class = key.class;
        let (point, rounds) = if key.dtype == DType::F32 {
            (1.0, opts.min_reps)
        } else {
            (HALF_POINT_SHARE, opts.min_reps.min(HALF_MIN_ROUNDS))
        };
        let per_pass = Options {
            budget_per_point: scaled(opts.budget_per_point, point / PASSES as f64),
            min_reps: rounds,
            ..*opts
        };
        let started = Instant::now();
        let sizes_left: usize = sizes.get(l..).map_or(0, |s| s.iter().sum());
        let share = sizes.get(l).copied().unwrap_or(0) as f64 / sizes_left.max(1) as f64;
        let budget = scaled(total.saturating_sub(ladders_started.elapsed()), share);
        // Per ladder size: its op, its work, and each engine's seconds (`None`: not timed).
        let mut rows: Vec<(Op, f64, Vec<Option<f64>>)> = Vec::new();
        let mut active: Vec<bool> = vec![true; engines.len()];
        // Consecutive sizes at which each engine was DROP_BEYOND× slower than the fastest.
        let mut behind: Vec<usize> = vec![0; engines.len()];
        // Pass 1: up the ladder. An engine stops before a size predicted (linearly
        // from its last one) to be too slow, or once it is DROP_BEYOND× slower than
        // the fastest at two sizes in a row, past its fixed cost (its time is
        // FIXED_SHARE× its time at the class's smallest size, and grows with the
        // work), so it cannot catch up further on; the model extrapolates it
        // linearly. The two smallest sizes are always measured (a curve needs two
        // samples). Past the regular sizes (see `ladder`) only the engines whose
        // time is still mostly fixed cost are timed.
        let (ops, regular) = ladder(key);
        for (rung, op) in ops.into_iter().enumerate() {
            let w = work(class, &op.cost());
            for (i, (a, (_, b))) in active.iter_mut().zip(engines).enumerate() {
                // This engine's (work, seconds) so far, smallest first.
                let timed: Vec<(f64, f64)> =
                    rows.iter().filter_map(|r| r.2.get(i).copied().flatten().map(|s| (r.1, s))).collect();
                let (too_slow, out_of_running) =
                    match (timed.first(), timed.len().checked_sub(2).and_then(|j| timed.get(j..))) {
                        (Some(&(_, fixed)), Some(&[(w0, s0), (w1, s1)])) => {
                            let slope_known = s1 >= FIXED_SHARE * fixed;
                            let too_slow = s1 * w / w1 > opts.max_call.as_secs_f64()
                                || started.elapsed() > budget
                                || (rung >= regular && slope_known);
                            let past_fixed = slope_known && s1 / s0 >= (w1 / w0).sqrt();
                            (too_slow, behind.get(i).is_some_and(|&n| n >= 2) && past_fixed)
                        }
                        _ => (false, false),
                    };
                *a = *a && b.supports(&op) && !too_slow && !out_of_running;
            }
            if !active.iter().any(|&a| a) {
                break;
            }
            let seconds = time_subset(engines, &active, &op, &mut pool, &per_pass)?;
            for (a, s) in active.iter_mut().zip(&seconds) {
                *a = *a && s.is_some();
            }
            let running = contenders(&seconds, &round_trips(&out, &op), DROP_BEYOND);
            for ((n, &r), s) in behind.iter_mut().zip(&running).zip(&seconds) {
                *n = if r || s.is_none() { 0 } else { *n + 1 };
            }
            rows.push((op, w, seconds));
        }
        // Passes 2.., each a whole ladder later: the same sizes on the engines that
        // are in the running there or at a neighbouring size (the others' times do
        // not change a decision), and each point keeps its fastest median. Sizes at
        // which every such engine's call takes SLOW_CALL or more are not timed
        // again: their rounds already spread over tens of milliseconds. On a shared
        // machine an engine has phases in which it runs up to 2× slower (measured on
        // a 2-core VM: the two-thread engine at one-thread speed for tens of
        // milliseconds, at one size in one calibration and another in the next);
        // one median can land in such a phase, PASSES medians a ladder apart rarely
        // all do.
        let running: Vec<Vec<bool>> =
            rows.iter().map(|(op, _, s)| contenders(s, &round_trips(&out, op), RUNNING_WITHIN)).collect();
        // Per row, the engines to time again (`None`: the row is not timed again).
        let retime: Vec<Option<Vec<bool>>> = rows
            .iter()
            .enumerate()
            .map(|(r, (_, _, seconds))| {
                let neighbours = running.get(r.saturating_sub(1)..(r + 2).min(running.len())).unwrap_or(&[]);
                let near = |i: usize| neighbours.iter().any(|c| c.get(i) == Some(&true));
                let again: Vec<bool> = seconds.iter().enumerate().map(|(i, s)| s.is_some() && near(i)).collect();
                let fastest =
                    seconds.iter().zip(&again).filter_map(|(s, &a)| s.filter(|_| a)).fold(f64::INFINITY, f64::min);
                let worth = again.iter().filter(|&&a| a).count() >= 2 && fastest < SLOW_CALL.as_secs_f64();
                worth.then_some(again)
            })
            .collect();
        for _ in 1..PASSES {
            for ((op, _, seconds), again) in rows.iter_mut().zip(&retime) {
                let Some(again) = again else { continue };
                let again = time_subset(engines, again, op, &mut pool, &per_pass)?;
                for (s, a) in seconds.iter_mut().zip(again) {
                    if let (Some(s), Some(a)) = (s.as_mut(), a) {
                        *s = s.min(a);
                    }
                }
            }
        }
        for (i, e) in out.iter_mut().enumerate() {
            let pts: Vec<Point> = rows
                .iter()
                .filter_map(|(_, work, s)| s.get(i).copied().flatten().map(|seconds| Point { work: *work, seconds }))
                .collect();
            if !pts.is_empty() {
                e.classes.push(ClassCurve { class, dtype: key.dtype, points: pts });
            }
        }
        lap(key.to_string());
    }
    let created_unix_s = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    Ok(Profile { format: FORMAT, key: profile_key(engines), calibrated: true, created_unix_s, engines: out, timings })
}

/// `d` times `factor` (in [0, 1]); `d` itself where that does not make a
/// duration (`Duration::MAX` times 1.0 rounds past it).
fn scaled(d: Duration, factor: f64) -> Duration {
    Duration::try_from_secs_f64(d.as_secs_f64() * factor).unwrap_or(d)
}

/// [`Backend::prepare`] of `ops` on every backend, each on its own thread, so
/// that one driver's compiles overlap another's; the first error wins. One
/// after the other in the browser. Takes as long as the slowest backend's prepare.
pub(crate) fn prepare_concurrently(backends: &[&dyn Backend], ops: &[Op]) -> Result<()> {
    prepare_timed(backends, ops).map(drop)
}

/// [`prepare_concurrently`], returning each backend's own time in seconds
/// (zeros in the browser, which has no clock here).
fn prepare_timed(backends: &[&dyn Backend], ops: &[Op]) -> Result<Vec<f64>> {
    if cfg!(target_arch = "wasm32") {
        return backends.iter().map(|b| b.prepare(ops).map(|()| 0.0)).collect();
    }
    let timed = |b: &dyn Backend| {
        let started = Instant::now();
        b.prepare(ops).map(|()| started.elapsed().as_secs_f64())
    };
    if backends.len() <= 1 {
        return backends.iter().map(|b| timed(*b)).collect();
    }
    std::thread::scope(|scope| {
        let handles: Vec<_> = backends.iter().map(|b| scope.spawn(move || timed(*b))).collect();
        handles
            .into_iter()
            .zip(backends)
            .map(|(h, b)| {
                h.join().unwrap_or_else(|_| {
                    Err(ComputeError::Driver {
                        op: "prepare",
                        backend: b.kind(),
                        message: "the preparing thread panicked".into(),
                        cause: None,
                    })
                })
            })
            .collect()
    })
}

/// A ladder size at which every engine still in the running takes this long
/// per call is not timed again (see [`PASSES`]). (Deciding by how long the
/// size's first pass took instead let one slow engine — lavapipe's 40 ms conv
/// at 64² — spare the CPU engines their second and third passes, and one slow
/// median of the two-thread engine then stood.)
pub const SLOW_CALL: Duration = Duration::from_millis(5);

/// An engine whose time is within this factor of the fastest one's is in the
/// running (see `contenders`).
pub const RUNNING_WITHIN: f64 = 3.0;

/// Calibration stops timing an engine up a ladder once it is this many times
/// slower than the fastest (resident and host data alike) at two sizes in a row.
/// Larger than [`RUNNING_WITHIN`]: on the 2-core machine the two-thread engine
/// measured 3.5× the one-thread one's time at 2¹⁶ elements (waking the second
/// thread) and was the faster from 2¹⁹ on.
pub const DROP_BEYOND: f64 = 8.0;

/// An engine is only dropped from a ladder (see [`DROP_BEYOND`]) at a size
/// whose time is at least this many times its time at the class's smallest
/// size (its fixed cost for that class). A GPU's time on small calls is mostly
/// fixed cost and grows in steps: on the H200 machine CUDA's dot went from 9
/// to 15 µs between 2¹² and 2¹⁴ elements, 8× the CPU's, then stayed under
/// 20 µs up to 2²², and wgpu's matmul took 60–110 µs from 16³ to 512³ (its
/// launch on a tiny relu is less); dropped there and extrapolated linearly,
/// they were predicted 3 ms at 2²² and 600 s at 4096³.
pub const FIXED_SHARE: f64 = 4.0;

/// Which engines are in the running at one size: those whose `seconds` are
/// `within` that factor of the fastest, either on resident data or with
/// each engine's `round_trip` (host data) added. The others cannot be the
/// model's choice there unless their times are off by that factor.
fn contenders(seconds: &[Option<f64>], round_trip: &[f64], within: f64) -> Vec<bool> {
    let host = |i: usize, s: f64| s + round_trip.get(i).copied().unwrap_or(0.0);
    let best = seconds.iter().flatten().copied().fold(f64::INFINITY, f64::min);
    let best_host = seconds.iter().enumerate().filter_map(|(i, s)| s.map(|s| host(i, s))).fold(f64::INFINITY, f64::min);
    seconds
        .iter()
        .enumerate()
        .map(|(i, s)| s.is_some_and(|s| s <= within * best || host(i, s) <= within * best_host))
        .collect()
}

/// Each engine's host round trip for `op` from its measured link (0 for CPU engines).
fn round_trips(engines: &[EngineProfile], op: &Op) -> Vec<f64> {
    let cost = op.cost();
    engines.iter().map(|e| e.link.map_or(0.0, |l| l.round_trip_s(cost.bytes_read, cost.bytes_written))).collect()
}

/// One timed call of `op` on an engine, in the op's dtypes: host slices on
/// the CPU, writing `out` (shared by the CPU engines, so that they run on the
/// same buffers; replaced by one of the op's output length and dtype); on a
/// GPU, inputs uploaded once, then `run_tensors` + `synchronize` per call.
fn prepare<'a>(
    engine: Engine,
    b: &'a dyn Backend,
    op: &'a Op,
    ins: &'a [HostSlice<'a>],
    out: &'a RefCell<HostVec>,
) -> Result<Call<'a>> {
    let result = op.layout()?.output();
    if engine.is_gpu() {
        let tensors = ins.iter().map(|v| b.upload_typed(*v)).collect::<Result<Vec<Tensor>>>()?;
        let out = b.alloc_typed(result.len, result.dtype)?;
        Ok(Box::new(move || {
            let refs: Vec<&Tensor> = tensors.iter().collect();
            b.run_tensors(op, &refs, &out)?;
            b.synchronize()
        }))
    } else {
        let mut o = out.borrow_mut();
        if o.dtype() != result.dtype || o.len() != result.len {
            *o = HostVec::zeros(result.dtype, result.len);
        }
        Ok(Box::new(move || b.run_typed(op, ins, out.borrow_mut().as_mut())))
    }
}

/// Median seconds of one call of `op` on each engine, data resident, timed in
/// rotating bursts ([`crate::timing`]) so that every engine sees the same
/// machine state. `None` for an engine that refuses the op (unsupported, over a
/// limit, out of memory).
fn time_all(
    engines: &[(Engine, Arc<dyn Backend>)],
    op: &Op,
    data: &mut RandomPool,
    opts: &Options,
) -> Result<Vec<Option<f64>>> {
    let ins = data.inputs(op)?;
    let out = RefCell::new(HostVec::zeros(DType::F32, 0));
    let mut calls: Vec<Option<Call<'_>>> = Vec::with_capacity(engines.len());
    for (engine, b) in engines {
        // Warm-up call, which also tells whether the engine takes the op at all.
        let call = prepare(*engine, b.as_ref(), op, &ins, &out).and_then(|mut c| c().map(|()| c));
        match call {
            Ok(c) => calls.push(Some(c)),
            Err(e) if refuses(&e) => calls.push(None),
            Err(e) => return Err(e),
        }
    }
    median_round_robin(&mut calls, opts.budget_per_point, opts.min_reps, 2000, opts.burst)
}

/// Whether `e` says the engine does not take the op (unsupported, a dtype it
/// does not compute, over a limit, out of memory): calibration then leaves
/// that engine out of the size, instead of failing.
fn refuses(e: &ComputeError) -> bool {
    matches!(
        e,
        ComputeError::Unsupported { .. }
            | ComputeError::UnsupportedDType { .. }
            | ComputeError::LimitExceeded { .. }
            | ComputeError::OutOfMemory { .. }
    )
}

/// [`time_all`] on the engines whose `active` flag is set; `None` for the others
/// (and for an engine that refuses the op), in the order of `engines`.
fn time_subset(
    engines: &[(Engine, Arc<dyn Backend>)],
    active: &[bool],
    op: &Op,
    data: &mut RandomPool,
    opts: &Options,
) -> Result<Vec<Option<f64>>> {
    let subset: Vec<(Engine, Arc<dyn Backend>)> =
        engines.iter().zip(active).filter(|(_, a)| **a).map(|(e, _)| e.clone()).collect();
    let mut times = time_all(&subset, op, data, opts)?.into_iter();
    Ok(active.iter().map(|&a| if a { times.next().flatten() } else { None }).collect())
}

/// Median seconds of `f` over `budget` (≥ `min_reps` calls after a warm-up).
fn median_time(mut f: impl FnMut() -> Result<()>, budget: Duration, min_reps: usize) -> Result<f64> {
    f()?;
    let start = Instant::now();
    let mut samples = Vec::with_capacity(min_reps.max(8));
    while samples.len() < min_reps || (start.elapsed() < budget && samples.len() < 2000) {
        let t = Instant::now();
        f()?;
        samples.push(t.elapsed().as_secs_f64());
    }
    Ok(crate::timing::median(&mut samples).unwrap_or(1e-9))
}

/// The curves calibration measures, in order: one ladder per op class on
/// `f32` data, then `bf16` ladders for the classes whose half-precision
/// throughput differs from what the `f32` curve predicts at the op's work:
/// add, softmax, and matmul with `bf16` operands and an `f32` output (the
/// usual inference GEMM). On the H100 machine's CPU, add bf16 2¹⁶ took 17.8 µs
/// where the `f32` curve at its bytes said 5.2 µs, softmax bf16 2¹⁴ 14.5 µs
/// against 5.0 µs; a bf16 matmul has its own kernels where the CPU has
/// AVX512_BF16. The other classes, and `f16` data, are predicted from these
/// curves ([`crate::CostModel::predict_cost`]).
pub const LADDERS: [CurveKey; 9] = [
    CurveKey::new(OpClass::Elementwise, DType::F32),
    CurveKey::new(OpClass::Transcendental, DType::F32),
    CurveKey::new(OpClass::Reduction, DType::F32),
    CurveKey::new(OpClass::RowWise, DType::F32),
    CurveKey::new(OpClass::Matmul, DType::F32),
    CurveKey::new(OpClass::Conv, DType::F32),
    CurveKey::new(OpClass::Elementwise, DType::BF16),
    CurveKey::new(OpClass::RowWise, DType::BF16),
    CurveKey::new(OpClass::Matmul, DType::BF16),
];

/// The ladder of calibration ops of `key`, smallest first, and how many
/// of them are regular sizes, timed on every engine still climbing. Element
/// counts step by 2 from 2¹⁰ to 2²⁰: the CPU engine's time jumps where a
/// kernel starts using every thread (its thresholds in `compute_simd::tuning`
/// lie between 2¹³ and 2¹⁸), and a sparser ladder interpolates across that
/// jump (on the 16-core GPU machine, gelu at 2¹⁴ was predicted 5.6 µs from
/// samples at 2¹³ and 2¹⁶, and took 15 µs). The regular sizes stop at 2²²;
/// 2²⁴ is only for engines whose time at 2²² is still under [`FIXED_SHARE`]
/// times their fixed cost, whose growth with size the model could not
/// extrapolate yet. On the H200 machine the 2²⁴ size on every engine took
/// about 0.6 s of a 2.75–3.0 s calibration (64 MiB inputs on two GPUs, calls
/// of 7–10 ms on one CPU thread); dropped altogether, wgpu was predicted
/// 81 µs at 2²⁶ (flat from its 2²⁰ and 2²² samples) and took 200–300 µs.
///
/// The ops are on `key.dtype` data; a matmul's output is `f32` whatever its
/// operands. The half-precision element-count ladders step by 2 only from
/// 2¹² to 2¹⁶, around the CPU's thresholds for going parallel (2¹³–2¹⁵
/// elements, whatever the dtype), and by 4 elsewhere, and their regular
/// sizes stop at 2²⁰: 9 instead of 13; only the engines still launch-bound
/// there are timed at 2²² and 2²⁴. A CPU engine is then extrapolated in
/// proportion from 2²⁰, which reads low out of cache (on the 2-core machine a
/// bf16 add took 5.6–6.0× its 2²⁰ time at 2²², a bf16 softmax 4.7–4.9×), but
/// at those sizes a GPU beats the CPU by about 10× on resident data and loses
/// by more on host data, and both CPU engines are extrapolated alike. Their
/// matmul ladder has the `f32` one's sizes: the engines' crossovers lie
/// between 64³ and 1024³. The matmul ladders start at 16³: below it a
/// prediction runs linearly from the engine's launch to that sample, and on a
/// GPU an 8³ call (a GEMV kernel) was fixed cost alone, whose two kernels took
/// CUDA's driver 0.2 s to compile in a machine's first calibration.
fn ladder(key: CurveKey) -> (Vec<Op>, usize) {
    let powers: Vec<u32> = if key.dtype == DType::F32 {
        [6].into_iter().chain(10..=20).chain([22, 24]).collect()
    } else {
        [6, 10].into_iter().chain(12..=16).chain([18, 20, 22, 24]).collect()
    };
    let lens: Vec<usize> = powers.into_iter().map(|p| 1usize << p).collect();
    let by_len = |f: fn(usize) -> Op| lens.iter().map(|&n| f(n)).collect::<Vec<Op>>();
    let ops = match key.class {
        OpClass::Elementwise => by_len(|n| Op::binary(BinaryOp::Add, n)),
        OpClass::Transcendental => by_len(|n| Op::unary(UnaryOp::Gelu(GeluForm::Tanh), n)),
        OpClass::Reduction => by_len(Op::dot),
        OpClass::RowWise => by_len(|n| Op::rows(RowOp::Softmax, (n / 256).max(1), 256)),
        OpClass::Matmul => [16usize, 32, 64, 128, 256, 512, 1024, 2048].map(|n| Op::matmul(n, n, n)).to_vec(),
        OpClass::Conv => {
            [4usize, 8, 16, 32, 64, 128, 256].map(|hw| Op::Conv2d(Conv2dSpec::same(16, hw, 16, 3))).to_vec()
        }
    };
    let ops: Vec<Op> = ops
        .into_iter()
        .map(|op| match op {
            Op::Matmul(spec) => Op::Matmul(spec.with_dtypes(key.dtype, DType::F32)),
            op => op.with_dtype(key.dtype),
        })
        .collect();
    // Only the element-count ladders have launch-bound-only sizes: the last
    // one, and for half data the last two.
    let regular = match key.class {
        OpClass::Matmul | OpClass::Conv => ops.len(),
        _ if key.dtype == DType::F32 => ops.len().saturating_sub(1),
        _ => ops.len().saturating_sub(2),
    };
    (ops, regular)
}

/// Random values in [−1, 1) (never all zeros) from which every calibration
/// call takes its inputs: drawn once and grown as larger calls need, instead
/// of drawing tens of millions of values again for each size and pass. Past
/// [`RandomPool::DRAWN`] values the pool repeats its first ones (no kernel's
/// speed depends on the order of its values): drawing all 32 Mi values of
/// what was then the largest ladder call (2²⁴) took about 0.2 s. The `f16`
/// and `bf16` inputs come from copies of the pool rounded to those types,
/// made (and repeated past `DRAWN`) the same way.
struct RandomPool {
    rng: Rng,
    values: Vec<f32>,
    f16: Vec<f16>,
    bf16: Vec<bf16>,
}

impl RandomPool {
    /// Values drawn from the generator; the pool repeats them past this length.
    const DRAWN: usize = 1 << 20;

    fn new(seed: u64) -> RandomPool {
        RandomPool { rng: Rng::new(seed), values: Vec::new(), f16: Vec::new(), bf16: Vec::new() }
    }

    /// `len` `f32` values.
    fn slice(&mut self, len: usize) -> &[f32] {
        self.grow(len);
        self.values.get(..len).unwrap_or(&[])
    }

    /// The inputs of `op`, each in its dtype: consecutive, disjoint ranges of
    /// the pool. Fails for an invalid op or a dtype the pool has no copy in.
    fn inputs(&mut self, op: &Op) -> Result<Vec<HostSlice<'_>>> {
        let layout = op.layout()?;
        let total: usize = layout.input_lens().sum();
        self.grow(total);
        for d in layout.inputs().iter().map(|o| o.dtype) {
            match d {
                DType::F16 => repeat_rounded(&mut self.f16, &self.values, total, f16::from_f32),
                DType::BF16 => repeat_rounded(&mut self.bf16, &self.values, total, bf16::from_f32),
                DType::F32 => {}
                other => {
                    let why = "calibration draws f32, f16 and bf16 inputs only";
                    return Err(ComputeError::unsupported_dtype(op, BackendKind::Simd, other, why));
                }
            }
        }
        let mut at = 0usize;
        let mut ins = Vec::with_capacity(layout.inputs().len());
        for o in layout.inputs() {
            let range = at..at + o.len;
            at += o.len;
            ins.push(match o.dtype {
                DType::F16 => HostSlice::F16(self.f16.get(range).unwrap_or(&[])),
                DType::BF16 => HostSlice::BF16(self.bf16.get(range).unwrap_or(&[])),
                _ => HostSlice::F32(self.values.get(range).unwrap_or(&[])),
            });
        }
        Ok(ins)
    }

    /// Makes the `f32` pool at least `total` values long.
    fn grow(&mut self, total: usize) {
        if self.values.len() < total {
            let drawn = total.min(Self::DRAWN).saturating_sub(self.values.len());
            let more = self.rng.vec(drawn, -1.0, 1.0);
            self.values.extend(more);
            while self.values.len() < total {
                let n = (total - self.values.len()).min(self.values.len());
                self.values.extend_from_within(..n);
            }
        }
    }
}

/// Makes `copy` at least `total` long: `values` rounded by `round` up to
/// [`RandomPool::DRAWN`], then the copy repeated (as the pool repeats itself).
fn repeat_rounded<T: Copy>(copy: &mut Vec<T>, values: &[f32], total: usize, round: fn(f32) -> T) {
    let rounded = total.min(RandomPool::DRAWN).min(values.len());
    if copy.len() < rounded {
        copy.extend(values.get(copy.len()..rounded).unwrap_or(&[]).iter().map(|&v| round(v)));
    }
    while copy.len() < total && !copy.is_empty() {
        let n = (total - copy.len()).min(copy.len());
        copy.extend_from_within(..n);
    }
}

/// Host ↔ device costs: the extra fixed time of a host call over a resident
/// one, and bandwidth each way below and above a 1 MiB knee: from a 1 MiB copy
/// minus a tiny one, and a 16 MiB copy minus a 1 MiB one. The calls whose
/// engine is a close call move about 1 MiB (conv 16×128², matmul 512³), the
/// large ones tens of MiB, and drivers copy the two differently.
fn measure_link(b: &dyn Backend, tiny: &Op, launch_s: f64, data: &mut RandomPool, opts: &Options) -> Result<Link> {
    let refs = data.inputs(tiny)?;
    let mut out = HostVec::zeros(tiny.out_dtype(), tiny.layout()?.output_len());
    let host_call = median_time(|| b.run_typed(tiny, &refs, out.as_mut()), opts.budget_per_point, opts.min_reps)?;
    let lens = [64usize, 1 << 18, 1 << 22];
    let mut up = [0.0f64; 3];
    let mut down = [0.0f64; 3];
    for ((&len, u), d) in lens.iter().zip(&mut up).zip(&mut down) {
        let values = data.slice(len);
        *u = median_time(|| b.upload(values).map(drop), opts.budget_per_point, opts.min_reps)?;
        let t = b.upload(values)?;
        let mut back = vec![0.0f32; len];
        *d = median_time(|| b.download(&t, &mut back), opts.budget_per_point, opts.min_reps)?;
    }
    let bytes = |i: usize, j: usize| (lens[j] - lens[i]) as f64 * 4.0;
    let bw = |t: &[f64; 3], i: usize, j: usize| bytes(i, j) / (t[j] - t[i]).max(1e-7);
    Ok(Link {
        overhead_s: (host_call - launch_s).max(0.0),
        h2d_bytes_per_s: bw(&up, 0, 1),
        d2h_bytes_per_s: bw(&down, 0, 1),
        knee_bytes: bytes(0, 1),
        h2d_large_bytes_per_s: bw(&up, 1, 2),
        d2h_large_bytes_per_s: bw(&down, 1, 2),
    })
}

/// The host call a GPU link is checked against: 1 MiB each way, the size of
/// the close calls between a GPU on host data and the CPU (matmul 512³, conv
/// 16×128²), and the link's knee.
fn knee_call() -> Op {
    Op::unary(UnaryOp::Relu, 1 << 18)
}

/// Fits each GPU link's bandwidths below the knee to a real host call.
///
/// `measure_link` times bare uploads and downloads back to back, with the
/// host data hot in cache; a host call in use (and in the dispatch benchmark)
/// comes between other engines' calls. [`knee_call`] is timed on host data and
/// on resident data in rotating bursts with every engine's host call in
/// between, as a ladder size is; the link's small-copy bandwidths are scaled
/// (both by the same factor, keeping their ratio) so that its round trip
/// equals the difference. Costs one size's timing budget (0.02 s).
///
/// On the H200 machine, without this fit, CUDA's host calls with 256 KiB–1
/// MiB per buffer took 1.03–1.31× their prediction (median of twelve grid
/// runs per cell; matmul 512³: 345 µs measured, 281 µs predicted), and auto
/// chose CUDA there over a CPU engine up to 1.63× faster. With it, over three
/// runs: matmul 512³ 1.00–1.05×, the 2¹⁸ cells 0.82–1.18×.
fn fit_links_to_host_calls(
    engines: &[(Engine, Arc<dyn Backend>)],
    profiles: &mut [EngineProfile],
    data: &mut RandomPool,
    opts: &Options,
) -> Result<()> {
    let op = knee_call();
    let cost = op.cost();
    let ins = data.inputs(&op)?;
    let out = RefCell::new(HostVec::zeros(op.out_dtype(), op.layout()?.output_len()));
    let (op, ins, out) = (&op, &ins[..], &out);
    // Per engine: its host call, then (GPUs only) its resident call; `slots`
    // holds the GPUs' two places in `calls`.
    let mut calls: Vec<Option<Call<'_>>> = Vec::new();
    let mut slots = Vec::new();
    for (engine, b) in engines {
        let b = b.as_ref();
        let mut host: Call<'_> = Box::new(move || b.run_typed(op, ins, out.borrow_mut().as_mut()));
        if !engine.is_gpu() {
            calls.push(Some(host));
            slots.push(None);
            continue;
        }
        // Warm-up calls; an engine that refuses the op keeps its link as measured.
        match prepare(*engine, b, op, ins, out).and_then(|mut r| host().and_then(|()| r()).map(|()| r)) {
            Ok(resident) => {
                slots.push(Some((calls.len(), calls.len() + 1)));
                calls.extend([Some(host), Some(resident)]);
            }
            Err(e) if refuses(&e) => slots.push(None),
            Err(e) => return Err(e),
        }
    }
    let medians = median_round_robin(&mut calls, opts.budget_per_point, opts.min_reps, 2000, opts.burst)?;
    for (profile, slot) in profiles.iter_mut().zip(slots) {
        let (Some(link), Some((host_at, resident_at))) = (profile.link.as_mut(), slot) else { continue };
        if let (Some(Some(host)), Some(Some(resident))) = (medians.get(host_at), medians.get(resident_at)) {
            *link = fitted(*link, host - resident, &cost);
        }
    }
    Ok(())
}

/// `link` with its bandwidths below the knee scaled by one factor so that its
/// round trip for `cost` is `round_trip_s` (unchanged when either, less the
/// fixed overhead, is not positive).
fn fitted(link: Link, round_trip_s: f64, cost: &compute_core::Cost) -> Link {
    let measured = round_trip_s - link.overhead_s;
    let predicted = link.round_trip_s(cost.bytes_read, cost.bytes_written) - link.overhead_s;
    if !(measured > 0.0 && predicted > 0.0 && measured.is_finite()) {
        return link;
    }
    let slower = measured / predicted;
    Link { h2d_bytes_per_s: link.h2d_bytes_per_s / slower, d2h_bytes_per_s: link.d2h_bytes_per_s / slower, ..link }
}

#[cfg(test)]
mod tests {
    use super::*;
    use compute_core::MatmulSpec;

    #[test]
    fn a_link_fitted_to_a_host_call_predicts_it() {
        let link = Link {
            overhead_s: 10e-6,
            h2d_bytes_per_s: 20e9,
            d2h_bytes_per_s: 10e9,
            knee_bytes: 2e6,
            h2d_large_bytes_per_s: 5e9,
            d2h_large_bytes_per_s: 5e9,
        };
        let cost = knee_call().cost(); // 1 MiB each way, below the knee
        let before = link.round_trip_s(cost.bytes_read, cost.bytes_written);
        // A host call whose copies take twice as long as measured bare.
        let measured = link.overhead_s + 2.0 * (before - link.overhead_s);
        let f = fitted(link, measured, &cost);
        let after = f.round_trip_s(cost.bytes_read, cost.bytes_written);
        assert!((after - measured).abs() < 1e-12, "{after} vs {measured}");
        assert_eq!((f.h2d_bytes_per_s, f.d2h_bytes_per_s), (10e9, 5e9), "both halved, their ratio kept");
        assert_eq!((f.overhead_s, f.knee_bytes, f.h2d_large_bytes_per_s), (10e-6, 2e6, 5e9), "the rest unchanged");
        // Nothing to fit against: the link stays as measured.
        assert_eq!(fitted(link, 5e-6, &cost), link);
        assert_eq!(fitted(link, f64::NAN, &cost), link);
    }

    #[test]
    fn ladders_are_valid_and_increasing() {
        for key in LADDERS {
            let (ops, regular) = ladder(key);
            assert!(regular >= 5 && regular <= ops.len(), "{key}");
            assert!(ops.len() >= 5, "{key}");
            let mut prev = 0.0;
            for op in ops {
                assert!(op.layout().is_ok(), "{op:?}");
                assert_eq!(CurveKey::of(&op), key, "{op:?}");
                let w = work(key.class, &op.cost());
                assert!(w > prev, "{key}: work must increase");
                prev = w;
            }
        }
        // Every class has an f32 ladder, and no key is measured twice.
        for class in OpClass::ALL {
            assert!(LADDERS.contains(&CurveKey::new(class, DType::F32)), "{class:?}");
        }
        let mut keys = LADDERS.to_vec();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), LADDERS.len());
        // The half-precision matmul is the inference GEMM: bf16 operands, f32 output.
        let (mm, _) = ladder(CurveKey::new(OpClass::Matmul, DType::BF16));
        assert!(mm.iter().all(|op| op.dtype() == DType::BF16 && op.out_dtype() == DType::F32));
        let (add, _) = ladder(CurveKey::new(OpClass::Elementwise, DType::BF16));
        assert!(add.iter().all(|op| op.dtype() == DType::BF16 && op.out_dtype() == DType::BF16));
    }

    #[test]
    fn budgets_scale_without_panicking() {
        assert_eq!(scaled(Duration::from_millis(16), 0.125), Duration::from_millis(2));
        assert_eq!(scaled(Duration::MAX, 1.0), Duration::MAX);
        assert_eq!(scaled(Duration::ZERO, 0.5), Duration::ZERO);
        assert!(scaled(Duration::MAX, 0.5) < Duration::MAX);
    }

    #[test]
    fn contenders_count_the_host_round_trip() {
        // A GPU 10× faster on resident data but with a 5 ms round trip, a CPU
        // engine at 1 ms and another at 2.5 ms: on host data the GPU takes 5.1 ms
        // and both CPUs are within 3× of the best (1 ms).
        let s = [Some(0.1e-3), Some(1e-3), Some(2.5e-3), None];
        let trip = [5e-3, 0.0, 0.0, 0.0];
        assert_eq!(contenders(&s, &trip, 3.0), vec![true, true, true, false]);
        // Without the round trip only the GPU is within 3×; the CPUs are 10× and
        // 25× behind.
        assert_eq!(contenders(&s, &[0.0; 4], 3.0), vec![true, false, false, false]);
        assert_eq!(contenders(&s, &[0.0; 4], 20.0), vec![true, true, false, false]);
    }

    #[test]
    fn the_random_pool_hands_out_disjoint_nonzero_inputs() {
        let mut pool = RandomPool::new(7);
        let op = Op::binary(BinaryOp::Add, 1000);
        let ins: Vec<Vec<f32>> = pool.inputs(&op).expect("valid op").iter().map(|v| v.to_f32()).collect();
        assert_eq!(ins.len(), 2);
        assert!(ins.iter().all(|v| v.len() == 1000 && v.iter().any(|&x| x != 0.0)));
        assert_ne!(ins[0], ins[1]);
        // Half inputs are the same values, rounded, in the op's dtype.
        let half = pool.inputs(&op.with_dtype(DType::BF16)).expect("valid op");
        assert!(half.iter().all(|v| v.dtype() == DType::BF16 && v.len() == 1000));
        assert_eq!(half[1].to_f32(), ins[1].iter().map(|&x| bf16::from_f32(x).to_f32()).collect::<Vec<_>>());
        let mm = Op::Matmul(MatmulSpec::new(4, 8, 2).with_dtypes(DType::F16, DType::F32));
        assert!(pool.inputs(&mm).expect("valid op").iter().all(|v| v.dtype() == DType::F16));
        let big = pool.inputs(&Op::binary(BinaryOp::Add, RandomPool::DRAWN + 3).with_dtype(DType::F16)).expect("ok");
        assert_eq!(big[1].len(), RandomPool::DRAWN + 3, "half copies repeat past DRAWN too");
        assert_eq!(pool.slice(3000).len(), 3000, "grows on demand");
        // Past DRAWN values the pool repeats its drawn ones.
        let n = RandomPool::DRAWN;
        let big = pool.slice(2 * n + 5).to_vec();
        assert_eq!(big.len(), 2 * n + 5);
        assert_eq!(big[..n], big[n..2 * n]);
        assert_eq!(big[..5], big[2 * n..]);
        assert!(big[..n].windows(2).any(|w| w[0] != w[1]), "the drawn part varies");
    }

    #[test]
    fn cache_path_hashes_the_key() {
        // Only meaningful when COMPUTE_PROFILE is not set in the test environment.
        if std::env::var_os("COMPUTE_PROFILE").is_some() {
            return;
        }
        if let (Some(a), Some(b)) = (cache_path("machine a"), cache_path("machine b")) {
            assert_ne!(a, b);
            assert!(a.to_string_lossy().contains("compute"));
            assert_eq!(a.extension().and_then(|e| e.to_str()), Some("json"));
        }
    }
}
