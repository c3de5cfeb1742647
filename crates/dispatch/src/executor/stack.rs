//! Running a batch of requests against one shared weight as stacked products,
//! with the buffers kept between batches.
//!
//! On a GPU whose backend has page-locked memory, the callers have written
//! their rows into it already (see `stage`): the batch's rows go to the
//! device as one asynchronous transfer per contiguous run
//! ([`Backend::upload_pinned_parts`]), and the result comes back straight
//! into a page-locked result buffer ([`Backend::download_pinned`]) that the
//! requests' views read in place, so the worker copies no values on the
//! host. Otherwise the rows go in one gathered transfer
//! ([`Backend::upload_parts_into`]) and the result comes back into a host
//! buffer. Either way the device tensors are kept from earlier batches of
//! the same height, and a result buffer is reused once every view of it has
//! been dropped: a steady stream of batches allocates nothing.
//!
//! A stack of more than [`CHUNK_ROWS`] rows can run as one product or as
//! products of at most [`CHUNK_ROWS`] rows each (the GEMV kernels' height:
//! each reads `W` once at memory bandwidth). Which is faster depends on the
//! device's kernels for that height, so the first batches of each height try
//! both and later ones take the faster, trying the other again now and then.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use compute_core::{Backend, ComputeError, DType, HostSlice, HostSliceMut, Op, Result, Tensor, bf16};

use super::metrics::BatchPhases;
use super::shared::{SharedRequest, SharedWeight, Values, backend_of, zeros};
use super::stage::{self, Pool};
use crate::compute::{Compute, worth_falling_back};
use crate::engine::Engine;

/// Rows per product when a stack runs in chunks: the GEMV kernels' height.
pub(crate) const CHUNK_ROWS: usize = 8;

/// Device buffer sets kept (one per engine, weight shape, height and split).
const DEVICE_SETS: usize = 8;

/// Result buffers kept for reuse.
const OUTPUT_BUFFERS: usize = 4;

/// Largest page-locked result buffer, in values (64 MiB); larger results
/// come back into ordinary memory.
const MAX_PINNED_OUTPUT: usize = 1 << 24;

/// Batches of one height between two tries of the strategy not in use.
const RETRY_EVERY: u64 = 128;

/// How a stack runs on a GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Split {
    /// One product of all the rows.
    Whole,
    /// Products of at most [`CHUNK_ROWS`] rows.
    Chunks,
}

/// Device tensors for the stacked rows and the result of one height: one
/// pair, or one per chunk.
struct DeviceSet {
    key: (Engine, usize, usize, usize, Split, DType),
    pairs: Vec<(Tensor, Tensor)>,
    used: u64,
}

/// What the batches of one height on one engine measured.
#[derive(Default)]
struct Tuning {
    whole_s: Option<f64>,
    chunks_s: Option<f64>,
    batches: u64,
}

impl Tuning {
    /// The split to run next: each once, then the faster, and the slower
    /// again every [`RETRY_EVERY`] batches (its figure may be stale).
    fn pick(&self) -> Split {
        match (self.whole_s, self.chunks_s) {
            (None, _) => Split::Whole,
            (_, None) => Split::Chunks,
            (Some(w), Some(c)) => {
                let best = if c < w { Split::Chunks } else { Split::Whole };
                let other = if best == Split::Whole { Split::Chunks } else { Split::Whole };
                if self.batches % RETRY_EVERY == RETRY_EVERY - 1 { other } else { best }
            }
        }
    }

    /// Notes that a batch run with `split` took `s` seconds (a moving
    /// average of the last few).
    fn note(&mut self, split: Split, s: f64) {
        self.batches += 1;
        let slot = if split == Split::Whole { &mut self.whole_s } else { &mut self.chunks_s };
        *slot = Some(slot.map_or(s, |old| 0.75 * old + 0.25 * s));
    }
}

/// What the worker keeps between batches against shared weights.
#[derive(Default)]
pub(crate) struct Scratch {
    sets: Vec<DeviceSet>,
    outputs: Vec<Arc<Values>>,
    /// Page-locked memory for callers' rows, per GPU engine (`None`: the
    /// engine has none).
    pools: HashMap<Engine, Option<Arc<Pool>>>,
    tuning: HashMap<(Engine, usize, usize, usize, DType), Tuning>,
    host_x: Vec<f32>,
    /// The stacked rows rounded to `bf16`, for `bf16` weights.
    half_x: Vec<bf16>,
    clock: u64,
}

impl Scratch {
    /// A result buffer of `len` values, not shared: a kept one that no view
    /// uses any more (taken out of the kept ones until [`Scratch::keep`]),
    /// or a new one. With `pinned`, a page-locked one from that backend when
    /// it has them and one can be kept (capacity rounded up to a power of
    /// two, so that batches of nearby sizes share it), else one in ordinary
    /// memory.
    fn output(&mut self, compute: &Compute, len: usize, pinned: Option<&dyn Backend>) -> Result<Arc<Values>> {
        let pinned = pinned.filter(|_| len <= MAX_PINNED_OUTPUT);
        let fits = |v: &Values| match v {
            Values::Pinned { mem, .. } => mem.len() >= len,
            Values::Heap(_) => pinned.is_none(),
        };
        let free = |b: &Arc<Values>| Arc::strong_count(b) == 1 && Arc::weak_count(b) == 0;
        if let Some(i) = self.outputs.iter().position(|b| free(b) && fits(b)) {
            let mut buf = self.outputs.swap_remove(i);
            if let Some(v) = Arc::get_mut(&mut buf) {
                match v {
                    Values::Pinned { len: used, .. } => *used = len,
                    Values::Heap(v) if v.len() != len => {
                        v.clear();
                        v.try_reserve_exact(len).map_err(|_| oom(compute, len))?;
                        v.resize(len, 0.0);
                    }
                    Values::Heap(_) => {}
                }
                return Ok(buf);
            }
        }
        if let Some(b) = pinned {
            // A kept buffer that no view uses but that does not fit (too
            // small, or in ordinary memory) makes room for a new one.
            if self.outputs.len() >= OUTPUT_BUFFERS
                && let Some(i) = self.outputs.iter().position(free)
            {
                self.outputs.swap_remove(i);
            }
            if self.outputs.len() < OUTPUT_BUFFERS
                && let Ok(Some(mem)) = b.alloc_pinned_f32(len.next_power_of_two())
            {
                return Ok(Arc::new(Values::Pinned { mem, len }));
            }
        }
        Ok(Arc::new(Values::Heap(zeros("matmul", compute.kind(), len)?)))
    }

    /// Keeps `buf` for a later batch once its views are gone, if there is
    /// room.
    fn keep(&mut self, buf: &Arc<Values>) {
        if self.outputs.len() < OUTPUT_BUFFERS {
            self.outputs.push(buf.clone());
        }
    }

    /// The page-locked memory for callers' rows on GPU `engine`: the pool
    /// made for it, or a new one (`None` when `backend` has no such memory
    /// or it cannot be had; not tried again).
    pub(crate) fn pool(&mut self, engine: Engine, backend: &Arc<dyn Backend>) -> Option<Arc<Pool>> {
        self.pools
            .entry(engine)
            .or_insert_with(|| Pool::new(engine, backend.clone()).ok().flatten().map(Arc::new))
            .clone()
    }

    /// The device tensors for `rows` stacked rows against `w` on `backend`,
    /// split as `split` says: kept ones, or new ones (the least recently
    /// used set is dropped beyond [`DEVICE_SETS`]).
    fn device_set(
        &mut self,
        backend: &dyn Backend,
        engine: Engine,
        w: &SharedWeight,
        rows: usize,
        split: Split,
    ) -> Result<&[(Tensor, Tensor)]> {
        self.clock += 1;
        let key = (engine, w.k(), w.n(), rows, split, w.dtype());
        let at = match self.sets.iter().position(|s| s.key == key) {
            Some(i) => i,
            None => {
                let heights: Vec<usize> = match split {
                    Split::Whole => vec![rows],
                    Split::Chunks => chunk_heights(rows).collect(),
                };
                let pairs = heights
                    .into_iter()
                    .map(|h| Ok((backend.alloc_typed(h * w.k(), w.row_dtype())?, backend.alloc(h * w.n())?)))
                    .collect::<Result<Vec<_>>>()?;
                if self.sets.len() >= DEVICE_SETS
                    && let Some(old) = self.sets.iter().enumerate().min_by_key(|(_, s)| s.used).map(|(i, _)| i)
                {
                    self.sets.swap_remove(old);
                }
                self.sets.push(DeviceSet { key, pairs, used: 0 });
                self.sets.len() - 1
            }
        };
        let clock = self.clock;
        let set = &mut self.sets[at];
        set.used = clock;
        Ok(&set.pairs)
    }
}

fn oom(compute: &Compute, len: usize) -> ComputeError {
    ComputeError::OutOfMemory { op: "matmul", backend: compute.kind(), requested_bytes: (len as u64).saturating_mul(4) }
}

/// Heights of the chunks of a stack of `rows` rows.
fn chunk_heights(rows: usize) -> impl Iterator<Item = usize> {
    (0..rows).step_by(CHUNK_ROWS).map(move |r0| (rows - r0).min(CHUNK_ROWS))
}

/// The requests' rows `r0..r1` of the stack, as slices of their `x` (a
/// request may straddle two chunks).
fn rows_of<'a>(reqs: &'a [SharedRequest], k: usize, (r0, r1): (usize, usize)) -> Vec<HostSlice<'a>> {
    let mut parts = Vec::new();
    let mut at = 0usize;
    for r in reqs {
        let (lo, hi) = (at.max(r0), (at + r.rows).min(r1));
        if lo < hi {
            parts.push(HostSlice::F32(&r.x[(lo - at) * k..(hi - at) * k]));
        }
        at += r.rows;
        if at >= r1 {
            break;
        }
    }
    parts
}

/// The requests' rows, stacked and rounded to `bf16` into `half`.
fn round_rows(reqs: &[SharedRequest], half: &mut Vec<bf16>) {
    half.clear();
    for r in reqs {
        half.extend(r.x.iter().map(|&v| bf16::from_f32(v)));
    }
}

/// Runs the stacked product of `reqs` (`rows` rows together) against `w` on
/// `engine` and returns the `rows × n` result. A failure of a GPU that is not
/// the requests' fault reruns the batch on the CPU. Adds the time of each step
/// to `phases` (with `sync`, waiting for the device after each step).
#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    compute: &Compute,
    engine: Engine,
    (w, op): (&SharedWeight, &Op),
    reqs: &[SharedRequest],
    rows: usize,
    scratch: &mut Scratch,
    phases: &mut BatchPhases,
    sync: bool,
) -> Result<Arc<Values>> {
    let len = rows
        .checked_mul(w.n())
        .ok_or_else(|| ComputeError::shape("matmul", "stacked output overflows", op.shapes()))?;
    let t = Instant::now();
    let gpu = if engine.is_gpu() { compute.backend(engine) } else { None };
    let mut out = scratch.output(compute, len, gpu.as_deref())?;
    phases.stack_s += t.elapsed().as_secs_f64();
    match run_on(compute, engine, (w, op), reqs, rows, scratch, &mut out, phases, sync) {
        Err(e) if engine.is_gpu() && worth_falling_back(&e) => {
            let cpu = compute.engines().into_iter().find(|e| !e.is_gpu()).ok_or(e)?;
            run_on(compute, cpu, (w, op), reqs, rows, scratch, &mut out, phases, sync)?;
        }
        r => r?,
    }
    // A request alone gets a buffer in ordinary memory for itself, which
    // `MatmulRows::into_vec` then hands over without a copy; page-locked
    // ones are always kept (they are costly to allocate).
    if reqs.len() > 1 || matches!(*out, Values::Pinned { .. }) {
        scratch.keep(&out);
    }
    Ok(out)
}

/// The result buffer, to write: `out` is unique here ([`Scratch::output`]
/// hands out only buffers no view uses).
fn writable<'a>(out: &'a mut Arc<Values>, op: &Op) -> Result<&'a mut Values> {
    Arc::get_mut(out).ok_or_else(|| ComputeError::Driver {
        op: "matmul",
        backend: compute_core::BackendKind::Simd,
        message: format!("the result buffer of {} is shared before it is written", op.shapes()),
        cause: None,
    })
}

#[allow(clippy::too_many_arguments)]
fn run_on(
    compute: &Compute,
    engine: Engine,
    (w, op): (&SharedWeight, &Op),
    reqs: &[SharedRequest],
    rows: usize,
    scratch: &mut Scratch,
    out: &mut Arc<Values>,
    phases: &mut BatchPhases,
    sync: bool,
) -> Result<()> {
    let k = w.k();
    let half = w.dtype() == DType::BF16;
    if !engine.is_gpu() && (w.on_host() || w.resident_on(engine).is_none()) {
        let values = w.host_values(compute)?;
        let t0 = Instant::now();
        let x: HostSlice<'_> = match reqs {
            _ if half => {
                round_rows(reqs, &mut scratch.half_x);
                HostSlice::BF16(&scratch.half_x)
            }
            [one] => HostSlice::F32(&one.x),
            _ => {
                let x = &mut scratch.host_x;
                x.clear();
                x.try_reserve(rows.saturating_mul(k)).map_err(|_| oom(compute, rows.saturating_mul(k)))?;
                for r in reqs {
                    x.extend_from_slice(&r.x);
                }
                HostSlice::F32(x)
            }
        };
        let t1 = Instant::now();
        let y = writable(out, op)?.as_mut_slice();
        let r = compute.run_on_typed(engine, op, &[x, values], HostSliceMut::F32(y));
        phases.stack_s += (t1 - t0).as_secs_f64();
        phases.product_s += t1.elapsed().as_secs_f64();
        return r;
    }
    let backend = backend_of(compute, engine)?;
    let wt = w.tensor_on(compute, engine, backend.as_ref())?;
    // From now on the weight's callers write their rows into page-locked
    // memory of this engine, if it has some.
    if let Some(pool) = scratch.pool(engine, &backend) {
        w.use_stage(&pool);
    }
    let tune_key = (engine, k, w.n(), rows, w.dtype());
    let split = if rows > CHUNK_ROWS && engine == Engine::Cuda {
        scratch.tuning.entry(tune_key).or_default().pick()
    } else {
        Split::Whole
    };
    let t0 = Instant::now();
    // Rows the callers wrote into page-locked memory of this engine are
    // copied from there; otherwise they are gathered (rounded to bf16 first
    // for a bf16 weight).
    let staged = stage::all_on(reqs, engine).then(|| w.stage_words(1)).flatten();
    if half && staged.is_none() {
        round_rows(reqs, &mut scratch.half_x);
    }
    let pairs = scratch.device_set(backend.as_ref(), engine, w, rows, split)?.to_vec();
    let heights: Vec<usize> = pairs.iter().map(|(x, _)| x.len() / k.max(1)).collect();
    let t1 = Instant::now();
    let mut r0 = 0;
    for ((xt, _), h) in pairs.iter().zip(&heights) {
        match staged {
            Some(row_words) => backend.upload_pinned_parts(&stage::parts(reqs, row_words, (r0, r0 + h)), xt)?,
            None if half => {
                let rounded = scratch.half_x.get(r0 * k..(r0 + h) * k).unwrap_or_default();
                backend.upload_parts_into(&[HostSlice::BF16(rounded)], xt)?;
            }
            None => backend.upload_parts_into(&rows_of(reqs, k, (r0, r0 + h)), xt)?,
        }
        r0 += h;
    }
    if sync {
        backend.synchronize()?;
    }
    let t2 = Instant::now();
    for ((xt, yt), &h) in pairs.iter().zip(&heights) {
        let chunk_op = if split == Split::Whole { *op } else { w.op(h) };
        backend.run_tensors(&chunk_op, &[xt, &wt], yt)?;
    }
    if sync {
        backend.synchronize()?;
    }
    let t3 = Instant::now();
    match writable(out, op)? {
        Values::Pinned { mem, .. } => {
            let ys: Vec<&Tensor> = pairs.iter().map(|(_, yt)| yt).collect();
            backend.download_pinned(&ys, mem, 0)?;
        }
        Values::Heap(y) => {
            let mut at = 0;
            for (_, yt) in &pairs {
                let part = y
                    .get_mut(at..at + yt.len())
                    .ok_or_else(|| ComputeError::shape("matmul", "stacked output too short", op.shapes()))?;
                backend.download(yt, part)?;
                at += yt.len();
            }
        }
    }
    let t4 = Instant::now();
    phases.stack_s += (t1 - t0).as_secs_f64();
    phases.upload_s += (t2 - t1).as_secs_f64();
    phases.product_s += (t3 - t2).as_secs_f64();
    phases.download_s += (t4 - t3).as_secs_f64();
    if rows > CHUNK_ROWS && engine == Engine::Cuda {
        scratch.tuning.entry(tune_key).or_default().note(split, (t4 - t1).as_secs_f64());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::async_result::AsyncGpuResult;
    use crate::executor::WeightLayout;
    use compute_core::conformance::{compare_typed, rng::Rng};
    use compute_core::{BackendKind, HostVec};

    #[test]
    fn chunks_cover_the_stack_in_order() {
        assert_eq!(chunk_heights(20).collect::<Vec<_>>(), vec![8, 8, 4]);
        assert_eq!(chunk_heights(8).collect::<Vec<_>>(), vec![8]);
        assert_eq!(chunk_heights(0).count(), 0);
    }

    #[test]
    fn tuning_tries_both_then_keeps_the_faster_and_retries_the_other() {
        let mut t = Tuning::default();
        assert_eq!(t.pick(), Split::Whole);
        t.note(Split::Whole, 2e-3);
        assert_eq!(t.pick(), Split::Chunks);
        t.note(Split::Chunks, 1e-3);
        let picks: Vec<Split> = (0..RETRY_EVERY)
            .map(|_| {
                let s = t.pick();
                t.note(s, if s == Split::Chunks { 1e-3 } else { 2e-3 });
                s
            })
            .collect();
        assert_eq!(picks.iter().filter(|s| **s == Split::Whole).count(), 1, "{picks:?}");
        assert_eq!(picks.iter().filter(|s| **s == Split::Chunks).count() as u64, RETRY_EVERY - 1);
    }

    #[test]
    fn a_result_buffer_is_reused_only_once_no_view_holds_it() {
        let compute = Compute::builder().cpu().nominal_profile().build().unwrap();
        let mut s = Scratch::default();
        let a = s.output(&compute, 6, None).unwrap();
        s.keep(&a);
        let view = a.clone();
        drop(a);
        let b = s.output(&compute, 6, None).unwrap();
        assert!(!Arc::ptr_eq(&view, &b), "a buffer a view still reads was handed out again");
        drop(view);
        let c = s.output(&compute, 9, None).unwrap();
        assert_eq!(c.as_slice().len(), 9);
        assert_eq!(Arc::strong_count(&c), 1, "handed out unshared, so it is written without a copy");
    }

    /// Page-locked result buffers: sized up to a power of two and reused for
    /// nearby sizes; a kept buffer that does not fit makes room for one when
    /// all slots are taken; a backend without them gets ordinary memory.
    #[test]
    fn page_locked_result_buffers_are_kept_and_reused_for_nearby_sizes() {
        let compute = Compute::builder().cpu().nominal_profile().build().unwrap();
        let pinned = super::super::stage::PinnedOnHeap(compute_simd::SimdBackend::new());
        let mut s = Scratch::default();
        let heap: Vec<Arc<Values>> = (0..OUTPUT_BUFFERS).map(|_| s.output(&compute, 5, None).unwrap()).collect();
        for h in &heap {
            s.keep(h);
        }
        drop(heap);
        let a = s.output(&compute, 6, Some(&pinned)).unwrap();
        assert!(matches!(*a, Values::Pinned { ref mem, len: 6 } if mem.len() == 8), "room made for a pinned one");
        s.keep(&a);
        assert_eq!(s.outputs.len(), OUTPUT_BUFFERS);
        let first = Arc::as_ptr(&a);
        drop(a);
        let b = s.output(&compute, 7, Some(&pinned)).unwrap();
        assert_eq!(Arc::as_ptr(&b), first, "7 values fit the buffer of 8");
        assert_eq!(b.as_slice().len(), 7);
        let c = s.output(&compute, 3, Some(&compute_simd::SimdBackend::new())).unwrap();
        assert!(matches!(*c, Values::Heap(ref v) if v.len() == 3), "no page-locked memory there");
    }

    /// Requests of 1 to 8 rows (straddling the chunks' edges) against one
    /// `k × n` weight: the weight's values, each request's rows, and all of
    /// them stacked.
    struct Stacks {
        k: usize,
        n: usize,
        wv: Vec<f32>,
        heights: [usize; 6],
        rows: usize,
        xs: Vec<Vec<f32>>,
        stacked: Vec<f32>,
    }

    impl Stacks {
        fn new(seed: u64) -> Stacks {
            let (k, n) = (40, 72);
            let mut rng = Rng::new(seed);
            let wv = rng.vec(k * n, -1.0, 1.0);
            let heights = [1usize, 3, 2, 8, 5, 1];
            let rows: usize = heights.iter().sum();
            let xs: Vec<Vec<f32>> = heights.iter().map(|&h| rng.vec(h * k, -1.0, 1.0)).collect();
            let stacked = xs.concat();
            Stacks { k, n, wv, heights, rows, xs, stacked }
        }
    }

    /// The GPU engines here (a required one that is missing fails; others
    /// are skipped with a note naming `what`).
    fn gpu_engines(what: &str) -> Vec<(Engine, Arc<dyn Backend>)> {
        let mut engines = Vec::new();
        for f in crate::discover::probe().into_iter().filter(|f| f.engine.is_gpu()) {
            match f.backend {
                Ok(b) => engines.push((f.engine, b)),
                Err(e) => {
                    let required = compute_core::conformance::required(f.engine.kind());
                    assert!(!required, "{} is required here but unavailable: {e}", f.engine);
                    eprintln!("SKIPPED: {} {what}: {e}", f.engine);
                }
            }
        }
        engines
    }

    /// Requests of 1 to 8 rows (straddling the chunks' edges) stacked to 20
    /// rows, run whole and in chunks on every engine here: each equals the
    /// reference; and the gathered upload puts the parts in order.
    #[test]
    fn stacks_run_whole_or_in_chunks_match_the_reference_on_every_engine() {
        let Stacks { k, n, wv, heights, rows, xs, stacked } = Stacks::new(0x57ac);
        let mut engines = vec![(Engine::Simd, None)];
        engines.extend(gpu_engines("stacked products").into_iter().map(|(e, b)| (e, Some(b))));
        for (engine, backend) in engines {
            let mut b = Compute::builder().cpu().nominal_profile();
            if let Some(be) = backend.clone() {
                b = b.engine(engine, be);
            }
            let compute = b.build().unwrap();
            if let Some(be) = &backend {
                let t = be.alloc(rows * k).unwrap();
                let parts: Vec<HostSlice<'_>> = xs.iter().map(|x| HostSlice::F32(x)).collect();
                be.upload_parts_into(&parts, &t).unwrap();
                let mut back = vec![f32::NAN; rows * k];
                be.download(&t, &mut back).unwrap();
                assert_eq!(back, stacked, "{engine}: gathered upload");
                let short = be.upload_parts_into(&parts[1..], &t);
                assert!(matches!(short, Err(ComputeError::Shape { .. })), "{short:?}");
            }
            for (dtype, split) in [
                (DType::F32, Split::Whole),
                (DType::F32, Split::Chunks),
                (DType::BF16, Split::Whole),
                (DType::BF16, Split::Chunks),
            ] {
                let wh = HostVec::from_f32(dtype, &wv);
                let w = SharedWeight::host(1, wh.clone(), k, n, WeightLayout::RowMajor).unwrap();
                let op = w.op(rows);
                let reqs: Vec<SharedRequest> = xs
                    .iter()
                    .zip(heights)
                    .map(|(x, h)| {
                        let (_r, completer) = AsyncGpuResult::channel("matmul", BackendKind::Simd);
                        let x = x.clone();
                        SharedRequest {
                            weight: w.clone(),
                            x,
                            staged: None,
                            rows: h,
                            completer,
                            enqueued: Instant::now(),
                        }
                    })
                    .collect();
                let mut scratch = Scratch::default();
                // Both figures known, the faster one runs.
                let (whole_s, chunks_s) = if split == Split::Whole { (1e-6, 1.0) } else { (1.0, 1e-6) };
                let tuning = Tuning { whole_s: Some(whole_s), chunks_s: Some(chunks_s), batches: 0 };
                scratch.tuning.insert((engine, k, n, rows, dtype), tuning);
                let mut phases = BatchPhases::default();
                // The rows as the product takes them (rounded to bf16 for a bf16 weight).
                let xh = HostVec::from_f32(dtype, &stacked);
                for round in 0..2 {
                    let out =
                        run(&compute, engine, (&w, &op), &reqs, rows, &mut scratch, &mut phases, round == 1).unwrap();
                    let ins = [xh.as_slice(), wh.as_slice()];
                    if let Some(msg) = compare_typed(&op, &ins, HostSlice::F32(out.as_slice()), 1.0) {
                        panic!("{engine} {dtype} {split:?} round {round}: {msg}");
                    }
                }
            }
        }
    }

    /// Requests whose callers wrote their rows into page-locked memory (one
    /// claim skipped between them, so the upload takes two parts), run whole
    /// and in chunks, `f32` and `bf16`, on every GPU engine here and on the
    /// CPU posing as one with heap memory for page-locked memory: each batch
    /// matches the reference, and the result lands in a page-locked buffer.
    #[test]
    fn rows_from_page_locked_memory_match_the_reference_on_every_engine() {
        let Stacks { k, n, wv, heights, rows, xs, stacked } = Stacks::new(0x9a9e);
        let mut engines: Vec<(Engine, Arc<dyn Backend>)> =
            vec![(Engine::Cuda, Arc::new(super::super::stage::PinnedOnHeap(compute_simd::SimdBackend::new())))];
        engines.extend(gpu_engines("page-locked stacks"));
        for (engine, backend) in engines {
            let compute = Compute::builder().cpu().nominal_profile().engine(engine, backend.clone()).build().unwrap();
            let Some(pool) = Pool::new(engine, backend.clone()).unwrap() else {
                eprintln!("SKIPPED: {engine} has no page-locked memory");
                continue;
            };
            for (dtype, split) in [
                (DType::F32, Split::Whole),
                (DType::F32, Split::Chunks),
                (DType::BF16, Split::Whole),
                (DType::BF16, Split::Chunks),
            ] {
                let wh = HostVec::from_f32(dtype, &wv);
                let w = SharedWeight::host(1, wh.clone(), k, n, WeightLayout::RowMajor).unwrap();
                let op = w.op(rows);
                let row_words = w.stage_words(1).unwrap();
                let reqs: Vec<SharedRequest> = xs
                    .iter()
                    .zip(heights)
                    .enumerate()
                    .map(|(i, (x, h))| {
                        if i == 3 {
                            // Given back at once, with the others live: a gap the batch skips.
                            drop(pool.claim(row_words));
                        }
                        let staged = pool.claim(h * row_words).unwrap();
                        staged.write(x, dtype).unwrap();
                        let (_r, completer) = AsyncGpuResult::channel("matmul", BackendKind::Cuda);
                        let staged = Some(staged);
                        SharedRequest {
                            weight: w.clone(),
                            x: vec![f32::NAN; x.len()],
                            staged,
                            rows: h,
                            completer,
                            enqueued: Instant::now(),
                        }
                    })
                    .collect();
                assert!(stage::all_on(&reqs, engine));
                assert_eq!(stage::parts(&reqs, row_words, (0, rows)).len(), 2, "{engine}: two runs of claims");
                let mut scratch = Scratch::default();
                let (whole_s, chunks_s) = if split == Split::Whole { (1e-6, 1.0) } else { (1.0, 1e-6) };
                let tuning = Tuning { whole_s: Some(whole_s), chunks_s: Some(chunks_s), batches: 0 };
                scratch.tuning.insert((engine, k, n, rows, dtype), tuning);
                let mut phases = BatchPhases::default();
                let xh = HostVec::from_f32(dtype, &stacked);
                for round in 0..2 {
                    let out =
                        run(&compute, engine, (&w, &op), &reqs, rows, &mut scratch, &mut phases, round == 1).unwrap();
                    assert!(matches!(*out, Values::Pinned { .. }), "{engine}: a page-locked result buffer");
                    let ins = [xh.as_slice(), wh.as_slice()];
                    if let Some(msg) = compare_typed(&op, &ins, HostSlice::F32(out.as_slice()), 1.0) {
                        panic!("{engine} {dtype} {split:?} round {round}: {msg}");
                    }
                }
                assert!(w.stage().is_some(), "{engine}: the weight's callers now write their rows there");
            }
        }
    }
}
