//! [`BatchedExecutor`]: coalesces requests from many threads into few large
//! dispatches, on a background thread (no async runtime needed).
//!
//! Requests go through a bounded channel (`channel_size`; a full channel
//! blocks [`BatchedGpuHandle::submit`] and fails [`BatchedGpuHandle::try_submit`]).
//! The worker groups compatible requests: products against one registered
//! [`SharedWeight`] (stacked into one `[Σrows, k]·W`, see `shared`),
//! element-wise, row-wise and equal-shape matmul requests (see `coalesce`),
//! and attention requests such as decoding steps of different sequences,
//! whatever their KV caches' lengths, when the merged call goes to a GPU
//! and is predicted to pay for copying their inputs (see `attention`).
//! The merged call runs on the engine predicted fastest for its merged size,
//! and the output is split back to each request.
//!
//! Flushing is adaptive. The worker runs one batch at a time; whenever it is
//! free it dispatches the most urgent group, unless that group is expected to
//! grow: the threads answered by its previous batch have not submitted again
//! yet (callers in a loop come back within microseconds). Such a group is held
//! at most a quarter of its previous batch's run time, and never past its
//! oldest request's `max_wait`. A group is dispatched at once when it reaches
//! `max_batch_size`. So a request arriving at an idle executor runs at once,
//! and under load each batch takes everything that arrived while the previous
//! one ran, including the requests of submitters blocked on the full queue
//! (the worker lets them in before it dispatches, so `channel_size` does not
//! cap a batch).
//!
//! Requests against a shared weight on a GPU with page-locked host memory
//! have their rows written there by their callers (see `stage`), and the
//! callers of one batch sleep on one bell that the worker rings once when
//! the batch is answered.
//!
//! A caller alone skips the hand-off: when the blocking calls
//! ([`BatchedGpuHandle::call`], [`BatchedGpuHandle::matmul_shared_call`])
//! find nothing queued, the engine free, and the last batch answered only
//! this thread, the request runs on the caller's own thread as a batch of
//! one, exactly as the worker would run it. Requests submitted without
//! waiting ([`BatchedGpuHandle::submit`], [`BatchedGpuHandle::matmul_shared`])
//! always go to the worker, so that a thread's queued requests batch together.
//!
//! Shutdown stops accepting, then dispatches everything already accepted:
//! every accepted request is answered (value or error), none is dropped.

mod attention;
mod coalesce;
mod interpolate;
mod metrics;
mod shared;
mod stack;
mod stage;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError, sync_channel};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread::{JoinHandle, ThreadId};
use std::time::{Duration, Instant};

use compute_core::{Backend, BackendKind, ComputeError, HostVec, Op, Result, Tensor, UnaryOp};

pub use interpolate::Interpolation;
pub use metrics::{BatchPhases, ExecutorMetrics, FlushReason};
pub use shared::{MatmulRows, SharedWeight, WeightLayout};

use crate::async_result::{AsyncGpuResult, Completer};
use crate::compute::Compute;
use crate::engine::{Engine, Placement};
use crate::lock::{lock, read, wait_timeout, write};
use shared::SharedRequest;

/// Batching parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchConfig {
    /// Most requests in one dispatch (≥ 1); a group is dispatched as soon as
    /// it holds this many.
    pub max_batch_size: usize,
    /// Longest a group is held for requests expected to join it, counted from
    /// its oldest request. A request arriving at an idle executor is not held;
    /// a request may still wait longer than this while the engine runs the
    /// batches before it.
    pub max_wait: Duration,
    /// Requests the queue holds before submitters block (≥ 1). Blocked
    /// submitters' requests still join the next batch: this bounds memory
    /// held in the queue, not the batch size.
    pub channel_size: usize,
}

impl Default for BatchConfig {
    /// [`BatchConfig::balanced`].
    fn default() -> Self {
        BatchConfig::balanced()
    }
}

impl BatchConfig {
    /// Low latency: 256 requests / 1 ms.
    pub fn latency() -> Self {
        BatchConfig { max_batch_size: 256, max_wait: Duration::from_millis(1), channel_size: 128 }
    }

    /// The default: 1024 requests / 5 ms, queue of 128.
    pub fn balanced() -> Self {
        BatchConfig { max_batch_size: 1024, max_wait: Duration::from_millis(5), channel_size: 128 }
    }

    /// High throughput: 2048 requests / 10 ms.
    pub fn throughput() -> Self {
        BatchConfig { max_batch_size: 2048, max_wait: Duration::from_millis(10), channel_size: 128 }
    }

    /// Sets `max_batch_size`.
    pub fn with_max_batch_size(mut self, n: usize) -> Self {
        self.max_batch_size = n;
        self
    }

    /// Sets `max_wait`.
    pub fn with_max_wait(mut self, d: Duration) -> Self {
        self.max_wait = d;
        self
    }

    /// Sets `max_wait` in milliseconds (`max_wait_ms`, the trueno name).
    pub fn with_max_wait_ms(self, ms: u64) -> Self {
        self.with_max_wait(Duration::from_millis(ms))
    }

    /// `max_wait` in whole milliseconds (the trueno name).
    pub fn max_wait_ms(&self) -> u64 {
        u64::try_from(self.max_wait.as_millis()).unwrap_or(u64::MAX)
    }

    /// Sets `channel_size`.
    pub fn with_channel_size(mut self, n: usize) -> Self {
        self.channel_size = n;
        self
    }
}

/// A queued request on host vectors.
struct OpRequest {
    op: Op,
    inputs: Vec<Vec<f32>>,
    completer: Completer<Vec<f32>>,
    enqueued: Instant,
}

enum Request {
    Op(OpRequest),
    Shared(SharedRequest),
}

impl Request {
    fn enqueued(&self) -> Instant {
        match self {
            Request::Op(r) => r.enqueued,
            Request::Shared(r) => r.enqueued,
        }
    }
}

enum Msg {
    /// A request and the thread that submitted it.
    Request(Request, ThreadId),
    Shutdown,
}

static NEXT_EXECUTOR: AtomicU64 = AtomicU64::new(1);

struct Shared {
    id: u64,
    tx: SyncSender<Msg>,
    compute: Compute,
    /// The right to run a batch, and the buffers batches reuse: held by the
    /// worker while it takes requests and runs a group, or by a caller alone
    /// running its own request.
    engine: Mutex<stack::Scratch>,
    /// The one thread the last batch answered (`None` after a batch of
    /// several threads' requests, or before any): only it may run its next
    /// request on its own thread.
    solo: Mutex<Option<ThreadId>>,
    open: RwLock<bool>,
    metrics: Mutex<metrics::State>,
    config: BatchConfig,
    backend: BackendKind,
    engines: Vec<Engine>,
    /// Submitters waiting for room in the queue, and where they wait.
    blocked: AtomicUsize,
    room: Mutex<()>,
    room_cv: Condvar,
    /// Wait for the device after each step of a batch, so that
    /// [`BatchPhases`] times each apart (`DISPATCH_EXECUTOR_PHASES=1`).
    sync_phases: bool,
    /// Requests accepted and not answered yet.
    outstanding: AtomicUsize,
    /// Nanoseconds the last batch took, from dispatch to its last answer.
    last_batch_ns: AtomicU64,
    /// Callers that may spin waiting for their answers at once.
    spinners: usize,
}

/// Longest a caller spins for its answer, or the worker for the next request,
/// before blocking; batches that took longer than this are not spun for.
const MAX_SPIN: Duration = Duration::from_micros(200);

/// How long the worker spins for new requests after a short batch.
const WORKER_SPIN: Duration = Duration::from_micros(100);

/// The environment variable that makes GPU batches wait for the device
/// after each step, so that [`BatchPhases`] times each step apart.
pub const PHASES_ENV: &str = "DISPATCH_EXECUTOR_PHASES";

/// Longest a submitter blocked on a full queue sleeps before trying again
/// when no wake-up comes.
const ROOM_POLL: Duration = Duration::from_millis(1);

/// Counts a blocked submitter while it lives.
struct Blocked<'a>(&'a AtomicUsize);

impl<'a> Blocked<'a> {
    fn new(n: &'a AtomicUsize) -> Self {
        n.fetch_add(1, Ordering::SeqCst);
        Blocked(n)
    }
}

impl Drop for Blocked<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A cloneable, `Send + Sync` handle for submitting to a [`BatchedExecutor`].
#[derive(Clone)]
pub struct BatchedGpuHandle {
    shared: Arc<Shared>,
}

/// The executor: owns the background thread. Dropping it shuts down (and
/// waits for every accepted request to be answered).
pub struct BatchedExecutor {
    handle: BatchedGpuHandle,
    worker: Option<JoinHandle<()>>,
}

/// [`BatchedExecutor`] under its trueno-compatible name.
pub type BatchedGpuExecutor = BatchedExecutor;

impl BatchedExecutor {
    /// Starts the worker thread over `compute` with `config` (sizes below 1
    /// are raised to 1).
    pub fn new(compute: Compute, config: BatchConfig) -> Result<BatchedExecutor> {
        let config = BatchConfig {
            max_batch_size: config.max_batch_size.max(1),
            channel_size: config.channel_size.max(1),
            ..config
        };
        let (tx, rx) = sync_channel(config.channel_size);
        let shared = Arc::new(Shared {
            id: NEXT_EXECUTOR.fetch_add(1, Ordering::Relaxed),
            tx,
            compute: compute.clone(),
            engine: Mutex::new(stack::Scratch::default()),
            solo: Mutex::new(None),
            open: RwLock::new(true),
            metrics: Mutex::new(metrics::State::default()),
            config,
            backend: compute.kind(),
            engines: compute.engines(),
            blocked: AtomicUsize::new(0),
            room: Mutex::new(()),
            room_cv: Condvar::new(),
            sync_phases: std::env::var(PHASES_ENV).is_ok_and(|v| v == "1"),
            outstanding: AtomicUsize::new(0),
            last_batch_ns: AtomicU64::new(0),
            spinners: std::thread::available_parallelism().map_or(1, |n| (n.get() / 4).max(1)),
        });
        let worker_shared = shared.clone();
        let worker = std::thread::Builder::new()
            .name("dispatch-batcher".into())
            .spawn(move || worker(rx, worker_shared))
            .map_err(|e| ComputeError::DeviceUnavailable {
                backend: BackendKind::Simd,
                reason: format!("could not start the batching thread: {e}"),
            })?;
        Ok(BatchedExecutor { handle: BatchedGpuHandle { shared }, worker: Some(worker) })
    }

    /// A handle for submitting (clone it freely).
    pub fn handle(&self) -> BatchedGpuHandle {
        self.handle.clone()
    }

    /// Current metrics.
    pub fn metrics(&self) -> ExecutorMetrics {
        self.handle.metrics()
    }

    /// Stops accepting, answers every accepted request, joins the worker and
    /// returns the final metrics.
    pub fn shutdown(mut self) -> ExecutorMetrics {
        self.stop();
        self.handle.metrics()
    }

    fn stop(&mut self) {
        self.handle.shutdown();
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

impl Drop for BatchedExecutor {
    fn drop(&mut self) {
        self.stop();
    }
}

impl BatchedGpuHandle {
    fn closed(op: &Op, backend: BackendKind) -> ComputeError {
        ComputeError::Driver {
            op: op.name(),
            backend,
            message: format!("batched executor is shut down; request {} not accepted", op.shapes()),
            cause: None,
        }
    }

    /// Sends `req` (described by `op` in errors) to the worker. With `block`,
    /// waits while the queue is full, and fails if the executor shuts down
    /// meanwhile.
    fn send(&self, op: &Op, req: Request, block: bool) -> Result<()> {
        let shared = &self.shared;
        let mut msg = Msg::Request(req, std::thread::current().id());
        let full = || ComputeError::LimitExceeded {
            op: op.name(),
            what: "batched executor queue (channel_size)",
            requested: shared.config.channel_size as u64 + 1,
            maximum: shared.config.channel_size as u64,
        };
        let mut waiting: Option<(std::sync::MutexGuard<'_, ()>, Blocked<'_>)> = None;
        let sent = loop {
            // Sending under the read lock orders every accepted request before
            // the shutdown marker, which is sent after the write lock set `open`.
            let open = read(&shared.open);
            if !*open {
                break Err(Self::closed(op, shared.backend));
            }
            match shared.tx.try_send(msg) {
                Ok(()) => break Ok(()),
                Err(TrySendError::Disconnected(_)) => break Err(Self::closed(op, shared.backend)),
                Err(TrySendError::Full(_)) if !block => break Err(full()),
                Err(TrySendError::Full(m)) => {
                    drop(open);
                    msg = m;
                    // Counted as blocked before trying again, so that the
                    // worker, having made room, wakes us; the timeout covers
                    // a wake-up that slips between the try and the wait.
                    match waiting.take() {
                        None => waiting = Some((lock(&shared.room), Blocked::new(&shared.blocked))),
                        Some((guard, b)) => waiting = Some((wait_timeout(&shared.room_cv, guard, ROOM_POLL), b)),
                    }
                }
            }
        };
        drop(waiting);
        match sent {
            Ok(()) => {
                shared.outstanding.fetch_add(1, Ordering::Relaxed);
                lock(&shared.metrics).submitted += 1;
                Ok(())
            }
            Err(e) => {
                lock(&shared.metrics).rejected += 1;
                Err(e)
            }
        }
    }

    /// How long a new request's caller spins for its answer before blocking:
    /// about the last batch's time when that was short and few callers are
    /// waiting (each spinning caller holds a core), else not at all. A caller
    /// woken from a block pays a thread wake-up, tens of microseconds on a
    /// loaded machine; one that spins sees its answer at once.
    fn spin(&self) -> Duration {
        let s = &self.shared;
        let last = Duration::from_nanos(s.last_batch_ns.load(Ordering::Relaxed));
        if last.is_zero() || last > MAX_SPIN || s.outstanding.load(Ordering::Relaxed) >= s.spinners {
            return Duration::ZERO;
        }
        (last * 3 / 2 + Duration::from_micros(20)).min(MAX_SPIN)
    }

    /// Runs `req` on the calling thread, as a batch of one, when this caller
    /// is alone: the executor is open, nothing is queued or running, and the
    /// last batch answered this thread only (`None`). Otherwise gives `req`
    /// back, to be queued. Costs a few locks and atomic loads, and may wait for the
    /// worker to finish its bookkeeping after the batch that answered us
    /// (with nothing queued, it holds the engine for nothing else).
    fn run_alone(&self, req: Request) -> Option<Request> {
        let s = &*self.shared;
        let me = std::thread::current().id();
        let open = read(&s.open);
        let alone = || s.outstanding.load(Ordering::SeqCst) == 0 && *lock(&s.solo) == Some(me);
        if !*open || !alone() {
            return Some(req);
        }
        let mut engine = lock(&s.engine);
        if !alone() {
            // Another thread's request came meanwhile: batch with it instead.
            return Some(req);
        }
        // Accepted: counted before `open` is released, as a queued request
        // would be before the shutdown marker.
        s.outstanding.fetch_add(1, Ordering::SeqCst);
        lock(&s.metrics).submitted += 1;
        drop(open);
        let mut group = Group { oldest: req.enqueued(), ops: Vec::new(), shared: Vec::new(), threads: vec![me] };
        match req {
            Request::Op(o) => group.ops.push(o),
            Request::Shared(r) => group.shared.push(r),
        }
        flush(s, &mut engine, group, FlushReason::Alone);
        None
    }

    /// Runs `req` on this thread when `here` and the caller is alone
    /// ([`BatchedGpuHandle::run_alone`]), else sends it to the worker.
    fn hand_off(&self, op: &Op, req: Request, block: bool, here: bool) -> Result<()> {
        match if here { self.run_alone(req) } else { Some(req) } {
            None => Ok(()),
            Some(req) => self.send(op, req, block),
        }
    }

    fn enqueue(&self, op: Op, inputs: Vec<Vec<f32>>, block: bool, here: bool) -> Result<AsyncGpuResult<Vec<f32>>> {
        let lens: Vec<usize> = inputs.iter().map(Vec::len).collect();
        op.check(&lens, op.layout()?.output_len())?;
        let (result, completer) = AsyncGpuResult::channel_spinning(op.name(), self.shared.backend, self.spin());
        let req = Request::Op(OpRequest { op, inputs, completer, enqueued: Instant::now() });
        self.hand_off(&op, req, block, here)?;
        Ok(result)
    }

    /// Queues `op` on `inputs`; blocks while the queue is full (backpressure).
    /// Shapes are checked here: a bad request is refused, never queued.
    pub fn submit(&self, op: Op, inputs: Vec<Vec<f32>>) -> Result<AsyncGpuResult<Vec<f32>>> {
        self.enqueue(op, inputs, true, false)
    }

    /// Like [`BatchedGpuHandle::submit`] but fails at once with
    /// [`ComputeError::LimitExceeded`] when the queue is full.
    pub fn try_submit(&self, op: Op, inputs: Vec<Vec<f32>>) -> Result<AsyncGpuResult<Vec<f32>>> {
        self.enqueue(op, inputs, false, false)
    }

    /// Submits and waits for the result. A caller alone (nothing queued or
    /// running, and the last batch answered this thread only) runs its
    /// request on its own thread, with no hand-off to the worker and back;
    /// the metrics count it as a batch flushed [`FlushReason::Alone`].
    pub fn call(&self, op: Op, inputs: Vec<Vec<f32>>) -> Result<Vec<f32>> {
        self.enqueue(op, inputs, true, true)?.wait()
    }

    /// Submits a unary element-wise op on `x`.
    pub fn unary(&self, op: UnaryOp, x: Vec<f32>) -> Result<AsyncGpuResult<Vec<f32>>> {
        let n = x.len();
        self.submit(Op::unary(op, n), vec![x])
    }

    /// Submits `A·B` (`m × k` by `k × n`); equal shapes become one batched matmul.
    pub fn matmul(&self, a: Vec<f32>, b: Vec<f32>, m: usize, k: usize, n: usize) -> Result<AsyncGpuResult<Vec<f32>>> {
        self.submit(Op::matmul(m, k, n), vec![a, b])
    }

    /// Registers the `f32` weight `w` (`k × n`, or `n × k` with
    /// [`WeightLayout::Transposed`]) for [`BatchedGpuHandle::matmul_shared`].
    /// Takes `w` without copying it and returns at once (nothing is queued).
    /// The weight stays in host memory; the first batch that runs on a GPU
    /// uploads it and the copy is kept for later batches (device memory of
    /// `4·k·n` bytes per GPU used, freed with the last clone of the returned
    /// [`SharedWeight`]). On a GPU whose backend has page-locked host memory
    /// (CUDA), the executor also takes some for the callers' rows (4 MiB,
    /// growing to at most 16 MiB while more rows are in flight) and for up
    /// to four result buffers, kept while the executor or a weight that
    /// used them lives. Fails with [`ComputeError::Shape`] when
    /// `w.len() != k·n`.
    pub fn register_weight(&self, w: Vec<f32>, k: usize, n: usize, layout: WeightLayout) -> Result<SharedWeight> {
        SharedWeight::host(self.shared.id, HostVec::F32(w), k, n, layout)
    }

    /// [`BatchedGpuHandle::register_weight`] for a weight of `f32` or `bf16`
    /// values, or in ggml blocks (`q4_K`, `q5_K`, `q6_K`, `q8_0`, stored
    /// `n × k` as a GGUF file holds a linear layer: `layout` must be
    /// [`WeightLayout::Transposed`], and `k` a whole number of blocks), taken
    /// without a copy; another dtype or layout is a [`ComputeError::DType`].
    /// Requests stay `f32` for their callers: against a `bf16` weight their
    /// rows are rounded to `bf16` when stacked (a `bf16` product's operands);
    /// against blocks the stack is a quantized product ([`Op::QuantMatmul`]).
    /// Results are `f32`. A GPU copy costs the weight's bytes (`2·k·n` in
    /// `bf16`, 4.5 bits a value in `q4_K`).
    pub fn register_weight_typed(&self, w: HostVec, k: usize, n: usize, layout: WeightLayout) -> Result<SharedWeight> {
        SharedWeight::host(self.shared.id, w, k, n, layout)
    }

    /// Registers a weight already in device memory: a tensor of `k·n` values
    /// of a dtype [`BatchedGpuHandle::register_weight_typed`] takes
    /// ([`ComputeError::DType`] for another), laid out as `layout` says, on the memory of one of this
    /// executor's engines ([`ComputeError::WrongDevice`] otherwise). Nothing
    /// is copied now. Batches run where the cost model predicts fastest,
    /// counting the move of the weight to engines whose memory lacks it; the
    /// first batch run on the CPU downloads it once and keeps the host copy.
    pub fn register_weight_tensor(&self, w: Tensor, k: usize, n: usize, layout: WeightLayout) -> Result<SharedWeight> {
        SharedWeight::tensor(self.shared.id, &self.shared.engines, w, k, n, layout)
    }

    fn enqueue_shared(
        &self,
        weight: &SharedWeight,
        x: Vec<f32>,
        rows: usize,
        block: bool,
        here: bool,
    ) -> Result<AsyncGpuResult<MatmulRows>> {
        let op = weight.op(rows);
        if weight.owner() != self.shared.id {
            return Err(ComputeError::WrongDevice {
                op: "matmul_shared",
                expected: format!("a weight registered with executor #{}", self.shared.id),
                found: format!("a weight of executor #{}", weight.owner()),
            });
        }
        if rows.checked_mul(weight.k()) != Some(x.len()) {
            return Err(ComputeError::shape(
                "matmul_shared",
                format!("x holds {} values, rows·k = {rows}·{}", x.len(), weight.k()),
                format!("x=[{}] rows={rows} w=[{}x{}]", x.len(), weight.k(), weight.n()),
            ));
        }
        if rows == 0 {
            if !self.is_open() {
                lock(&self.shared.metrics).rejected += 1;
                return Err(Self::closed(&op, self.shared.backend));
            }
            return Ok(AsyncGpuResult::finished("matmul", self.shared.backend, Ok(shared::empty(weight.n()))));
        }
        // Once the weight's batches run on a GPU with page-locked memory, the
        // caller writes its rows there itself (in parallel with the other
        // callers); the worker then only queues their transfer. `x` still
        // goes with the request, for a batch run elsewhere.
        let staged = weight
            .stage()
            .zip(weight.stage_words(rows))
            .and_then(|(pool, words)| pool.claim(words))
            .filter(|claim| claim.write(&x, weight.row_dtype()).is_ok());
        let bell = weight.bell().clone();
        let (result, completer) = AsyncGpuResult::channel_belled("matmul", self.shared.backend, self.spin(), bell);
        let req = Request::Shared(SharedRequest {
            weight: weight.clone(),
            x,
            staged,
            rows,
            completer,
            enqueued: Instant::now(),
        });
        self.hand_off(&op, req, block, here)?;
        Ok(result)
    }

    /// Queues `y = x·W` for the `rows × k` row-major `x` against the registered
    /// weight `weight`, and returns at once with the pending result; blocks
    /// while the queue is full (and fails if the executor shuts down
    /// meanwhile). Requests against the same weight are stacked into one
    /// `[Σrows, k]·W` product (on a GPU, each `x` is copied once, into the
    /// transfer to the device; on the CPU once into the stack, and not at all
    /// for a request alone), and the result is this request's `rows × n`
    /// rows of its output, as a view ([`MatmulRows`], no copy).
    ///
    /// Once a batch of this weight has run on a GPU whose backend has
    /// page-locked host memory (CUDA), the caller writes its rows there
    /// itself before handing the request off (one atomic store per value,
    /// for a `bf16` weight per two values, rounded here), so that the batch
    /// goes to the device in one transfer with nothing gathered on the
    /// worker's thread; its result is then a view of the page-locked buffer
    /// the device wrote.
    ///
    /// Shapes are checked here: `x.len()` must be `rows·k`
    /// ([`ComputeError::Shape`]), and the weight must come from this
    /// executor ([`ComputeError::WrongDevice`]). `rows = 0` is answered at
    /// once with an empty result. Costs, besides the product, a queue slot and
    /// the hand-off to the worker thread and back (two thread wake-ups, or
    /// none after short batches, when both sides spin; the callers of one
    /// batch are woken together, by one system call: see
    /// `docs/benchmarks.md` for measured figures).
    pub fn matmul_shared(&self, weight: &SharedWeight, x: Vec<f32>, rows: usize) -> Result<AsyncGpuResult<MatmulRows>> {
        self.enqueue_shared(weight, x, rows, true, false)
    }

    /// [`BatchedGpuHandle::matmul_shared`], waiting for the result. A caller
    /// alone (nothing queued or running, and the last batch answered this
    /// thread only: one thread making one call after another) runs its
    /// product on its own thread, exactly as the worker would run a batch of
    /// one, with no hand-off to the worker and back; the metrics count it as
    /// a batch flushed [`FlushReason::Alone`]. A thread that wants its
    /// requests batched with each other submits them all with
    /// `matmul_shared` first and waits after.
    pub fn matmul_shared_call(&self, weight: &SharedWeight, x: Vec<f32>, rows: usize) -> Result<MatmulRows> {
        self.enqueue_shared(weight, x, rows, true, true)?.wait()
    }

    /// Like [`BatchedGpuHandle::matmul_shared`] but fails at once with
    /// [`ComputeError::LimitExceeded`] when the queue is full.
    pub fn try_matmul_shared(
        &self,
        weight: &SharedWeight,
        x: Vec<f32>,
        rows: usize,
    ) -> Result<AsyncGpuResult<MatmulRows>> {
        self.enqueue_shared(weight, x, rows, false, false)
    }

    /// Stops accepting requests; those already accepted are still answered,
    /// and submitters blocked on a full queue get an error at once.
    /// Idempotent. Returns once the stop is queued behind every accepted
    /// request (waiting only while the queue is full), without waiting for
    /// them to be answered ([`BatchedExecutor::shutdown`] does).
    pub fn shutdown(&self) {
        let mut open = write(&self.shared.open);
        if *open {
            *open = false;
            drop(open);
            {
                let _room = lock(&self.shared.room);
                self.shared.room_cv.notify_all();
            }
            // Blocks only while the queue is full; the worker keeps draining it.
            let _ = self.shared.tx.send(Msg::Shutdown);
        }
    }

    /// Whether requests are still accepted.
    pub fn is_open(&self) -> bool {
        *read(&self.shared.open)
    }

    /// The configuration in force.
    pub fn config(&self) -> BatchConfig {
        self.shared.config
    }

    /// Current metrics.
    pub fn metrics(&self) -> ExecutorMetrics {
        lock(&self.shared.metrics).snapshot(self.shared.config.max_batch_size)
    }
}

/// A request's completer and what it gets.
type Outcome = (Completer<Vec<f32>>, Result<Vec<f32>>);

/// Requests of one key waiting to be dispatched together.
struct Group {
    oldest: Instant,
    ops: Vec<OpRequest>,
    shared: Vec<SharedRequest>,
    /// The distinct threads that submitted them.
    threads: Vec<ThreadId>,
}

impl Group {
    fn len(&self) -> usize {
        self.ops.len() + self.shared.len()
    }
}

/// What the last batch of a key tells about the next one: the threads it
/// answered, which may be about to submit again.
struct Recent {
    answered_at: Instant,
    /// How long a group of this key is held for those threads.
    hold: Duration,
    /// Threads answered by that batch that have not submitted since.
    awaited: Vec<ThreadId>,
}

/// Fraction of a batch's run time that the next batch of its key may be held
/// for the threads it answered.
const HOLD_FRACTION: u32 = 4;

/// Keys whose last batch is remembered before stale ones are forgotten.
const RECENT_KEYS: usize = 64;

/// The worker's pending groups.
struct Pending<'a> {
    groups: HashMap<coalesce::Key, Group>,
    recent: HashMap<coalesce::Key, Recent>,
    seq: u64,
    shared: &'a Shared,
    /// When the last batch ended, and how long it took.
    last_done: Option<(Instant, Duration)>,
}

impl Pending<'_> {
    /// Adds a request to its group; dispatches the group if it is full.
    fn add(&mut self, scratch: &mut stack::Scratch, r: Request, from: ThreadId) {
        self.seq += 1;
        let key = match &r {
            Request::Op(o) => coalesce::key(&o.op, &o.inputs, self.seq),
            Request::Shared(s) => coalesce::Key::Shared(s.weight.id()),
        };
        if let Some(rec) = self.recent.get_mut(&key) {
            rec.awaited.retain(|t| *t != from);
        }
        let enqueued = r.enqueued();
        let g = self.groups.entry(key).or_insert_with(|| Group {
            oldest: enqueued,
            ops: Vec::new(),
            shared: Vec::new(),
            threads: Vec::new(),
        });
        g.oldest = g.oldest.min(enqueued);
        if !g.threads.contains(&from) {
            g.threads.push(from);
        }
        match r {
            Request::Op(o) => g.ops.push(o),
            Request::Shared(s) => g.shared.push(s),
        }
        if g.len() >= self.shared.config.max_batch_size
            && let Some(g) = self.groups.remove(&key)
        {
            self.dispatch(scratch, key, g, FlushReason::Size);
        }
    }

    /// When `g` is to be dispatched, and why: at once (its oldest request's
    /// time) unless threads answered by its key's last batch are expected
    /// back, then when the hold for them ends or at `max_wait`.
    fn due(&self, key: &coalesce::Key, g: &Group) -> (Instant, FlushReason) {
        match self.recent.get(key) {
            Some(rec) if !rec.awaited.is_empty() => {
                let timeout = g.oldest + self.shared.config.max_wait;
                let held = rec.answered_at + rec.hold;
                if held < timeout { (held.max(g.oldest), FlushReason::Idle) } else { (timeout, FlushReason::Timeout) }
            }
            _ => (g.oldest, FlushReason::Idle),
        }
    }

    /// The earliest time a group is due.
    fn next_due(&self) -> Option<Instant> {
        self.groups.iter().map(|(k, g)| self.due(k, g).0).min()
    }

    /// Dispatches the group due first, if one is due now. Returns whether one was.
    fn dispatch_due(&mut self, scratch: &mut stack::Scratch) -> bool {
        let now = Instant::now();
        let first = self
            .groups
            .iter()
            .map(|(k, g)| (*k, self.due(k, g)))
            .filter(|(_, (at, _))| *at <= now)
            .min_by_key(|(_, (at, _))| *at);
        match first.and_then(|(k, (_, reason))| Some((k, self.groups.remove(&k)?, reason))) {
            Some((k, g, reason)) => {
                self.dispatch(scratch, k, g, reason);
                true
            }
            None => false,
        }
    }

    /// Dispatches everything (shutdown).
    fn dispatch_all(&mut self, scratch: &mut stack::Scratch) {
        let mut groups: Vec<(coalesce::Key, Group)> = self.groups.drain().collect();
        groups.sort_by_key(|(_, g)| g.oldest);
        for (_, g) in groups {
            flush(self.shared, scratch, g, FlushReason::Shutdown);
        }
    }

    /// Runs `g` and remembers which threads it answered.
    fn dispatch(&mut self, scratch: &mut stack::Scratch, key: coalesce::Key, g: Group, reason: FlushReason) {
        let threads = g.threads.clone();
        // Set before the batch answers anyone, so that a caller it answers
        // alone finds itself alone when it calls again.
        *lock(&self.shared.solo) = match threads.as_slice() {
            [one] => Some(*one),
            _ => None,
        };
        let start = Instant::now();
        flush(self.shared, scratch, g, reason);
        let now = Instant::now();
        let took = now.saturating_duration_since(start);
        self.shared.last_batch_ns.store(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
        self.last_done = Some((now, took));
        if matches!(key, coalesce::Key::Alone(_)) {
            return;
        }
        let hold = (now.saturating_duration_since(start) / HOLD_FRACTION).min(self.shared.config.max_wait);
        if self.recent.len() >= RECENT_KEYS {
            let groups = &self.groups;
            self.recent.retain(|k, r| groups.contains_key(k) || r.answered_at + r.hold > now);
        }
        self.recent.insert(key, Recent { answered_at: now, hold, awaited: threads });
    }
}

fn worker(rx: Receiver<Msg>, shared: Arc<Shared>) {
    let mut p = Pending { groups: HashMap::new(), recent: HashMap::new(), seq: 0, shared: &shared, last_done: None };
    loop {
        let msg = match p.next_due() {
            None => recv_spinning(&rx, p.last_done),
            Some(d) => recv_until(&rx, d, p.last_done),
        };
        let first = match msg {
            Ok(m) => Some(m),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => Some(Msg::Shutdown),
        };
        // The engine is held while requests are taken and a group runs (a
        // caller alone may hold it meanwhile, running its own request).
        let mut engine = lock(&shared.engine);
        if !take(&mut p, &mut engine, &rx, &shared, first) {
            // Shut down: the reused device and page-locked buffers go now,
            // not with the last handle.
            *engine = stack::Scratch::default();
            return;
        }
        // One group at a time: requests that arrive while it runs can still
        // join the next ones.
        p.dispatch_due(&mut engine);
    }
}

/// The next message. Right after a short batch (at most [`MAX_SPIN`]), whose
/// callers are likely to submit again within microseconds, spins for up to
/// [`WORKER_SPIN`] first, so that their requests need no thread wake-up.
fn recv_spinning(rx: &Receiver<Msg>, last: Option<(Instant, Duration)>) -> std::result::Result<Msg, RecvTimeoutError> {
    if let Some((end, took)) = last
        && took <= MAX_SPIN
        && let Some(r) = poll_until(rx, end + WORKER_SPIN)
    {
        return r;
    }
    rx.recv().map_err(|_| RecvTimeoutError::Disconnected)
}

/// Longest batch after which the worker spins through the end of a hold
/// instead of sleeping: its callers come back within microseconds, and each
/// of them would otherwise have to wake the worker.
const SPIN_HOLD_AFTER: Duration = Duration::from_millis(1);

/// The next message, waiting at most until `due` (a held group's time). When
/// that is at most [`MAX_SPIN`] away and the last batch took at most
/// [`SPIN_HOLD_AFTER`], spins instead of sleeping.
fn recv_until(
    rx: &Receiver<Msg>,
    due: Instant,
    last: Option<(Instant, Duration)>,
) -> std::result::Result<Msg, RecvTimeoutError> {
    let left = due.saturating_duration_since(Instant::now());
    if left <= MAX_SPIN && last.is_some_and(|(_, took)| took <= SPIN_HOLD_AFTER) {
        return poll_until(rx, due).unwrap_or(Err(RecvTimeoutError::Timeout));
    }
    rx.recv_timeout(left)
}

/// Polls for a message until `until`; `None` if none came.
fn poll_until(rx: &Receiver<Msg>, until: Instant) -> Option<std::result::Result<Msg, RecvTimeoutError>> {
    while Instant::now() < until {
        match rx.try_recv() {
            Ok(m) => return Some(Ok(m)),
            Err(TryRecvError::Disconnected) => return Some(Err(RecvTimeoutError::Disconnected)),
            Err(TryRecvError::Empty) => {
                for _ in 0..32 {
                    std::hint::spin_loop();
                }
            }
        }
    }
    None
}

/// Longest the worker waits for a submitter it woke (one that was blocked on
/// the full queue) to put its request in.
const REFILL_WAIT: Duration = Duration::from_millis(2);

/// Wakes the submitters blocked on a full queue, if any.
fn make_room(shared: &Shared) {
    if shared.blocked.load(Ordering::SeqCst) > 0 {
        let _room = lock(&shared.room);
        shared.room_cv.notify_all();
    }
}

/// Adds `first` and every request queued behind it to their groups before
/// anything is dispatched, so that what arrived while the last batch ran
/// joins it. Submitters blocked on the full queue arrived before this
/// decision too: while any is blocked, they are woken and their requests
/// taken as well (waiting at most [`REFILL_WAIT`] for each). At most
/// `max(max_batch_size, channel_size) + 1` requests are taken, so that a
/// steady stream never starves due groups. Returns `false` at shutdown
/// (after dispatching everything).
fn take(
    p: &mut Pending<'_>,
    scratch: &mut stack::Scratch,
    rx: &Receiver<Msg>,
    shared: &Shared,
    first: Option<Msg>,
) -> bool {
    let cap = shared.config.max_batch_size.max(shared.config.channel_size) + 1;
    let mut next = first;
    let mut taken = 0usize;
    loop {
        while let Some(m) = next {
            match m {
                Msg::Request(r, from) => p.add(scratch, r, from),
                Msg::Shutdown => {
                    p.dispatch_all(scratch);
                    return false;
                }
            }
            taken += 1;
            if taken >= cap {
                make_room(shared);
                return true;
            }
            next = match rx.try_recv() {
                Ok(m) => Some(m),
                Err(TryRecvError::Empty) => None,
                Err(TryRecvError::Disconnected) => Some(Msg::Shutdown),
            };
        }
        if taken == 0 || shared.blocked.load(Ordering::SeqCst) == 0 {
            return true;
        }
        make_room(shared);
        next = match rx.recv_timeout(REFILL_WAIT) {
            Ok(m) => Some(m),
            Err(RecvTimeoutError::Timeout) => return true,
            Err(RecvTimeoutError::Disconnected) => Some(Msg::Shutdown),
        };
    }
}

/// Runs `op` through `compute` on `engine` (the CPU if that engine fails for
/// a reason other than the call), turning a panic into an error.
fn run_caught(compute: &Compute, engine: Engine, op: &Op, inputs: &[Vec<f32>]) -> Result<Vec<f32>> {
    let run = || {
        let refs: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
        let mut out = shared::zeros(op.name(), compute.kind(), op.layout()?.output_len())?;
        compute.run_f32_with_fallback(engine, op, &refs, &mut out).map(|()| out)
    };
    catch_panic(compute, op, run)
}

/// `f()`, with a panic turned into an error.
fn catch_panic<T>(compute: &Compute, op: &Op, f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|_| {
        Err(ComputeError::Driver {
            op: op.name(),
            backend: compute.kind(),
            message: "the backend panicked while running a batch".into(),
            cause: None,
        })
    })
}

/// Runs `group` on `shared`'s engines with `scratch` (whoever holds the
/// engine: the worker, or a caller alone).
fn flush(shared: &Shared, scratch: &mut stack::Scratch, group: Group, reason: FlushReason) {
    let compute = &shared.compute;
    let Group { ops, shared: stacked, .. } = group;
    if !ops.is_empty() {
        flush_ops(compute, shared, ops, reason);
    }
    if !stacked.is_empty() {
        flush_shared(compute, shared, scratch, stacked, reason);
    }
}

/// Counts finished requests (before anyone is woken, so that a caller that saw
/// its result sees it counted).
fn count(shared: &Shared, results: impl Iterator<Item = bool>) {
    let (mut ok, mut failed) = (0u64, 0u64);
    for r in results {
        if r { ok += 1 } else { failed += 1 }
    }
    shared.outstanding.fetch_sub((ok + failed) as usize, Ordering::Relaxed);
    let mut m = lock(&shared.metrics);
    m.completed += ok;
    m.failed += failed;
}

/// Whether merging `reqs` can pay. Everything merges but attention, whose
/// requests the worker copies into the merged inputs (keys and values too):
/// they merge only when the merged call goes to a GPU and the cost model
/// predicts it, plus that copy (timed as a one-thread element-wise pass over
/// the merged inputs), under the requests' calls one by one. On the CPU each
/// request alone reads its inputs in place, from caches still warm from its
/// caller: on the 2-core VM merged decoding steps ran at a tenth of the
/// direct calls' rate.
fn worth_merging(compute: &Compute, reqs: &[(&Op, &[Vec<f32>])]) -> bool {
    match reqs.first() {
        Some((Op::Attention(_), _)) => attention_merge_pays(compute, reqs),
        _ => true,
    }
}

fn attention_merge_pays(compute: &Compute, reqs: &[(&Op, &[Vec<f32>])]) -> bool {
    let Some(merged) = attention::merged_op(reqs) else { return false };
    let engine = compute.choose(&merged, Placement::Host);
    if !engine.is_gpu() {
        return false;
    }
    let model = compute.model();
    let alone: Option<f64> =
        reqs.iter().map(|(op, _)| model.predict(compute.choose(op, Placement::Host), op, Placement::Host)).sum();
    let values: usize = merged.layout().map_or(0, |l| l.input_lens().sum());
    let copier = if compute.engines().contains(&Engine::SimdSingle) { Engine::SimdSingle } else { Engine::Simd };
    let copy = model.predict(copier, &Op::unary(UnaryOp::Relu, values), Placement::Host);
    match (model.predict(engine, &merged, Placement::Host), copy, alone) {
        (Some(m), Some(c), Some(a)) => m + c < a,
        _ => false,
    }
}

fn flush_ops(compute: &Compute, shared: &Shared, reqs: Vec<OpRequest>, reason: FlushReason) {
    let start = Instant::now();
    let merged = if reqs.len() > 1 {
        let views: Vec<(&Op, &[Vec<f32>])> = reqs.iter().map(|r| (&r.op, r.inputs.as_slice())).collect();
        worth_merging(compute, &views).then(|| coalesce::merge(&views)).flatten()
    } else {
        None
    };
    // Where each dispatch runs, as the policy picks: the merged call, or each
    // request that could not be merged. The metrics count the first.
    let engines: Vec<Engine> = match &merged {
        Some(m) => vec![compute.choose(&m.op, Placement::Host)],
        None => reqs.iter().map(|r| compute.choose(&r.op, Placement::Host)).collect(),
    };
    let engine = engines.first().copied().unwrap_or_else(|| compute.primary());
    {
        let mut m = lock(&shared.metrics);
        m.batch(reason, engine, reqs.iter().map(|r| start.duration_since(r.enqueued).as_secs_f64()));
        if merged.is_none() && reqs.len() > 1 {
            m.unmerged += reqs.len() as u64;
        }
    }
    let outcomes: Vec<Outcome> = match merged {
        Some(m) => {
            let result = run_caught(compute, engine, &m.op, &m.inputs);
            let mut offset = 0usize;
            reqs.into_iter()
                .map(|r| {
                    let len = r.op.layout().map_or(0, |l| l.output_len());
                    let part = match &result {
                        Ok(all) => all.get(offset..offset + len).map(<[f32]>::to_vec).ok_or_else(|| {
                            ComputeError::shape(r.op.name(), "merged output shorter than the requests", r.op.shapes())
                        }),
                        Err(e) => Err(e.clone()),
                    };
                    offset += len;
                    (r.completer, part)
                })
                .collect()
        }
        // Requests that could not be merged run one by one, each on its own choice.
        None => reqs
            .into_iter()
            .zip(engines)
            .map(|(r, e)| (r.completer, run_caught(compute, e, &r.op, &r.inputs)))
            .collect(),
    };
    count(shared, outcomes.iter().map(|(_, r)| r.is_ok()));
    for (c, r) in outcomes {
        c.complete(r);
    }
}

/// Stacks requests against one weight into one product, runs it, and answers
/// each with a view of its rows; their callers are woken together, by one
/// ring of the weight's bell.
fn flush_shared(
    compute: &Compute,
    shared: &Shared,
    scratch: &mut stack::Scratch,
    mut reqs: Vec<SharedRequest>,
    reason: FlushReason,
) {
    let start = Instant::now();
    let Some(weight) = reqs.first().map(|r| r.weight.clone()) else { return };
    let total = reqs.iter().try_fold(0usize, |acc, r| acc.checked_add(r.rows));
    let op = weight.op(total.unwrap_or(usize::MAX));
    let engine = shared::choose(compute, &weight, &op);
    lock(&shared.metrics).batch(reason, engine, reqs.iter().map(|r| start.duration_since(r.enqueued).as_secs_f64()));
    // Rows in page-locked memory in the order they lie there, so that
    // requests that claimed one after the other go in one transfer (rows
    // without a claim first, in arrival order).
    reqs.sort_by_key(|r| r.staged.as_ref().map(stage::Rows::key));
    let mut phases = BatchPhases { batches: 1, requests: reqs.len() as u64, ..BatchPhases::default() };
    let run = || -> Result<std::sync::Arc<shared::Values>> {
        let rows = total.ok_or_else(|| ComputeError::shape("matmul", "stacked rows overflow", op.shapes()))?;
        stack::run(compute, engine, (&weight, &op), &reqs, rows, scratch, &mut phases, shared.sync_phases)
    };
    let result = catch_panic(compute, &op, run);
    let t = Instant::now();
    let outcomes: Vec<(Completer<MatmulRows>, Result<MatmulRows>)> = match result {
        Ok(out) => {
            let views = shared::split(out, reqs.iter().map(|r| r.rows), weight.n());
            reqs.into_iter().zip(views).map(|(r, v)| (r.completer, Ok(v))).collect()
        }
        Err(e) => reqs.into_iter().map(|r| (r.completer, Err(e.clone()))).collect(),
    };
    count(shared, outcomes.iter().map(|(_, r)| r.is_ok()));
    for (c, r) in outcomes {
        c.complete_quiet(r);
    }
    weight.bell().ring();
    phases.answer_s = t.elapsed().as_secs_f64();
    lock(&shared.metrics).phases.add(&phases);
}
