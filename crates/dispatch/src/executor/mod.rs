//! [`BatchedExecutor`]: coalesces many small requests from many threads into
//! few large dispatches, on a background thread (no async runtime needed).
//!
//! Requests go through a bounded channel (`channel_size`; a full channel
//! blocks [`BatchedGpuHandle::submit`] and fails [`BatchedGpuHandle::try_submit`]).
//! The worker groups compatible requests (see `coalesce`: same op, same inner
//! shape) and dispatches a group when it holds `max_batch_size` requests or
//! when its OLDEST request has waited `max_wait`; the merged call goes through
//! [`Compute`], which puts it on the engine predicted fastest for its merged
//! size, and the output is split back to each request.
//!
//! Shutdown stops accepting, then dispatches everything already accepted:
//! every accepted request is answered (value or error), none is dropped.

mod coalesce;
mod metrics;

use std::collections::HashMap;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError, sync_channel};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use compute_core::{Backend, BackendKind, ComputeError, Op, Result, UnaryOp};

pub use metrics::{ExecutorMetrics, FlushReason};

use crate::async_result::{AsyncGpuResult, Completer};
use crate::compute::Compute;
use crate::engine::{Engine, Placement};
use crate::lock::{lock, read, write};

/// Batching parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchConfig {
    /// Most requests in one dispatch (≥ 1).
    pub max_batch_size: usize,
    /// Longest a request waits for company, from the oldest waiting request.
    pub max_wait: Duration,
    /// Requests the queue holds before submitters block (≥ 1).
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

    /// Sets `channel_size`.
    pub fn with_channel_size(mut self, n: usize) -> Self {
        self.channel_size = n;
        self
    }
}

struct Request {
    op: Op,
    inputs: Vec<Vec<f32>>,
    completer: Completer<Vec<f32>>,
    enqueued: Instant,
}

enum Msg {
    Request(Request),
    Shutdown,
}

struct Shared {
    tx: SyncSender<Msg>,
    open: RwLock<bool>,
    metrics: Mutex<metrics::State>,
    config: BatchConfig,
    backend: BackendKind,
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
            tx,
            open: RwLock::new(true),
            metrics: Mutex::new(metrics::State::default()),
            config,
            backend: compute.kind(),
        });
        let worker_shared = shared.clone();
        let worker = std::thread::Builder::new()
            .name("dispatch-batcher".into())
            .spawn(move || worker(rx, compute, worker_shared))
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

    fn enqueue(&self, op: Op, inputs: Vec<Vec<f32>>, block: bool) -> Result<AsyncGpuResult<Vec<f32>>> {
        let lens: Vec<usize> = inputs.iter().map(Vec::len).collect();
        op.check(&lens, op.layout()?.output_len())?;
        let shared = &self.shared;
        let (result, completer) = AsyncGpuResult::channel(op.name(), shared.backend);
        let msg = Msg::Request(Request { op, inputs, completer, enqueued: Instant::now() });
        let refused = |e: ComputeError| {
            lock(&shared.metrics).rejected += 1;
            Err(e)
        };
        // Sending under the read lock orders every accepted request before the
        // shutdown marker, which is sent under the write lock.
        let open = read(&shared.open);
        if !*open {
            return refused(Self::closed(&op, shared.backend));
        }
        let sent = if block {
            shared.tx.send(msg).map_err(|_| Self::closed(&op, shared.backend))
        } else {
            shared.tx.try_send(msg).map_err(|e| match e {
                TrySendError::Full(_) => ComputeError::LimitExceeded {
                    op: op.name(),
                    what: "batched executor queue (channel_size)",
                    requested: shared.config.channel_size as u64 + 1,
                    maximum: shared.config.channel_size as u64,
                },
                TrySendError::Disconnected(_) => Self::closed(&op, shared.backend),
            })
        };
        drop(open);
        match sent {
            Ok(()) => {
                lock(&shared.metrics).submitted += 1;
                Ok(result)
            }
            Err(e) => refused(e),
        }
    }

    /// Queues `op` on `inputs`; blocks while the queue is full (backpressure).
    /// Shapes are checked here: a bad request is refused, never queued.
    pub fn submit(&self, op: Op, inputs: Vec<Vec<f32>>) -> Result<AsyncGpuResult<Vec<f32>>> {
        self.enqueue(op, inputs, true)
    }

    /// Like [`BatchedGpuHandle::submit`] but fails at once with
    /// [`ComputeError::LimitExceeded`] when the queue is full.
    pub fn try_submit(&self, op: Op, inputs: Vec<Vec<f32>>) -> Result<AsyncGpuResult<Vec<f32>>> {
        self.enqueue(op, inputs, false)
    }

    /// Submits and waits for the result.
    pub fn call(&self, op: Op, inputs: Vec<Vec<f32>>) -> Result<Vec<f32>> {
        self.submit(op, inputs)?.wait()
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

    /// Stops accepting requests; those already accepted are still answered.
    /// Idempotent.
    pub fn shutdown(&self) {
        let mut open = write(&self.shared.open);
        if *open {
            *open = false;
            drop(open);
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

struct Group {
    oldest: Instant,
    reqs: Vec<Request>,
}

/// The worker's pending groups.
struct Pending<'a> {
    groups: HashMap<coalesce::Key, Group>,
    seq: u64,
    compute: &'a Compute,
    shared: &'a Shared,
}

impl Pending<'_> {
    /// Adds a request to its group; dispatches the group if it is full.
    fn add(&mut self, r: Request) {
        self.seq += 1;
        let key = coalesce::key(&r.op, &r.inputs, self.seq);
        let g = self.groups.entry(key).or_insert_with(|| Group { oldest: r.enqueued, reqs: Vec::new() });
        g.oldest = g.oldest.min(r.enqueued);
        g.reqs.push(r);
        if g.reqs.len() >= self.shared.config.max_batch_size
            && let Some(g) = self.groups.remove(&key)
        {
            flush(self.compute, self.shared, g, FlushReason::Size);
        }
    }

    /// Dispatches every group whose oldest request has waited `max_wait`.
    fn flush_due(&mut self) {
        let now = Instant::now();
        let wait = self.shared.config.max_wait;
        let due: Vec<coalesce::Key> =
            self.groups.iter().filter(|(_, g)| g.oldest + wait <= now).map(|(k, _)| *k).collect();
        for k in due {
            if let Some(g) = self.groups.remove(&k) {
                flush(self.compute, self.shared, g, FlushReason::Timeout);
            }
        }
    }

    /// Dispatches everything (shutdown).
    fn flush_all(&mut self) {
        for (_, g) in self.groups.drain() {
            flush(self.compute, self.shared, g, FlushReason::Shutdown);
        }
    }
}

fn worker(rx: Receiver<Msg>, compute: Compute, shared: Arc<Shared>) {
    let mut p = Pending { groups: HashMap::new(), seq: 0, compute: &compute, shared: &shared };
    loop {
        let deadline = p.groups.values().map(|g| g.oldest + shared.config.max_wait).min();
        let msg = match deadline {
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            Some(d) => rx.recv_timeout(d.saturating_duration_since(Instant::now())),
        };
        let mut next = match msg {
            Ok(m) => Some(m),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => Some(Msg::Shutdown),
        };
        // Take what is already queued (at most one channel's worth, so that due
        // groups are never starved by a steady stream) before deciding what is
        // due: under load the requests waiting in the channel join their groups
        // instead of each group leaving half empty because its oldest request
        // waited in the queue.
        let mut drained = 0usize;
        while let Some(m) = next {
            match m {
                Msg::Request(r) => p.add(r),
                Msg::Shutdown => {
                    p.flush_all();
                    return;
                }
            }
            drained += 1;
            if drained > shared.config.channel_size {
                break;
            }
            next = match rx.try_recv() {
                Ok(m) => Some(m),
                Err(TryRecvError::Empty) => None,
                Err(TryRecvError::Disconnected) => Some(Msg::Shutdown),
            };
        }
        p.flush_due();
    }
}

/// Runs `op` through `compute` on `engine` (the CPU if that engine fails for
/// a reason other than the call), turning a panic into an error.
fn run_caught(compute: &Compute, engine: Engine, op: &Op, inputs: &[Vec<f32>]) -> Result<Vec<f32>> {
    let run = || {
        let refs: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
        let mut out = vec![0.0f32; op.layout()?.output_len()];
        compute.run_f32_with_fallback(engine, op, &refs, &mut out).map(|()| out)
    };
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).unwrap_or_else(|_| {
        Err(ComputeError::Driver {
            op: op.name(),
            backend: compute.kind(),
            message: "the backend panicked while running a batch".into(),
            cause: None,
        })
    })
}

fn flush(compute: &Compute, shared: &Shared, group: Group, reason: FlushReason) {
    let start = Instant::now();
    let merged = if group.reqs.len() > 1 {
        let views: Vec<(&Op, &[Vec<f32>])> = group.reqs.iter().map(|r| (&r.op, r.inputs.as_slice())).collect();
        coalesce::merge(&views)
    } else {
        None
    };
    // Where each dispatch runs, as the policy picks: the merged call, or each
    // request that could not be merged. The metrics count the first.
    let engines: Vec<Engine> = match &merged {
        Some(m) => vec![compute.choose(&m.op, Placement::Host)],
        None => group.reqs.iter().map(|r| compute.choose(&r.op, Placement::Host)).collect(),
    };
    let engine = engines.first().copied().unwrap_or_else(|| compute.primary());
    lock(&shared.metrics).batch(
        reason,
        engine,
        group.reqs.iter().map(|r| start.duration_since(r.enqueued).as_secs_f64()),
    );
    let outcomes: Vec<Outcome> = match merged {
        Some(m) => {
            let result = run_caught(compute, engine, &m.op, &m.inputs);
            let mut offset = 0usize;
            group
                .reqs
                .into_iter()
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
        None => group
            .reqs
            .into_iter()
            .zip(engines)
            .map(|(r, e)| (r.completer, run_caught(compute, e, &r.op, &r.inputs)))
            .collect(),
    };
    {
        // Counted before anyone is woken, so a caller that saw its result sees it counted.
        let ok = outcomes.iter().filter(|(_, r)| r.is_ok()).count() as u64;
        let mut m = lock(&shared.metrics);
        m.completed += ok;
        m.failed += outcomes.len() as u64 - ok;
    }
    for (c, r) in outcomes {
        c.complete(r);
    }
}
