//! Executor metrics: batches, fill rate, flush reasons, queue latency.

use serde::Serialize;

use crate::engine::Engine;

/// Why a batch was dispatched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum FlushReason {
    /// It reached `max_batch_size` requests.
    Size,
    /// It was held for requests expected to join it, and its oldest request
    /// reached `max_wait` first.
    Timeout,
    /// The engine was free and no more requests were expected to join (or
    /// those expected did not come within the hold): dispatched at once.
    Idle,
    /// The executor was shutting down.
    Shutdown,
    /// A caller alone ran its own request on its own thread, the engine
    /// being free and nothing queued (the blocking calls).
    Alone,
}

/// A snapshot of an executor's counters.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ExecutorMetrics {
    /// Requests accepted.
    pub submitted: u64,
    /// Requests refused (queue full on `try_submit`, or shut down).
    pub rejected: u64,
    /// Requests answered with a value.
    pub completed: u64,
    /// Requests answered with an error.
    pub failed: u64,
    /// Groups dispatched (a merged group is one call; a group that could
    /// not be merged, or whose merge would not pay, runs one call per
    /// request and counts in [`ExecutorMetrics::unmerged`] too).
    pub batches: u64,
    /// Requests of groups of several that ran one call each.
    pub unmerged: u64,
    /// Requests per batch, on average.
    pub mean_batch_size: f64,
    /// `mean_batch_size / max_batch_size`.
    pub fill_rate: f64,
    /// Batches flushed for size.
    pub flush_size: u64,
    /// Batches held for company whose oldest request reached `max_wait`.
    pub flush_timeout: u64,
    /// Batches dispatched as soon as the engine was free, with no more
    /// requests expected to join.
    pub flush_idle: u64,
    /// Batches flushed by shutdown.
    pub flush_shutdown: u64,
    /// Requests of a caller alone, run on its own thread.
    pub flush_alone: u64,
    /// Median seconds from submission to dispatch (last 65 536 requests).
    pub queue_p50_s: f64,
    /// 99th percentile of the same.
    pub queue_p99_s: f64,
    /// Dispatches per engine, as the policy chose them (most first).
    pub engines: Vec<(Engine, u64)>,
    /// Where the batches against shared weights spent their time.
    pub phases: BatchPhases,
}

/// Seconds spent in each step of the batches against shared weights
/// ([`ExecutorMetrics::phases`]), summed over `batches`. Measured with two
/// clock reads per step, always on. The product and the copies of a GPU
/// batch are queued work that only the download waits for: `upload_s` and
/// `product_s` then hold the time to queue them, and `download_s` the wait
/// for all three, unless the executor was started with the environment
/// variable `DISPATCH_EXECUTOR_PHASES=1`, which waits for the device after
/// each step (costing a synchronisation each) so that every step is timed
/// apart.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct BatchPhases {
    /// Batches counted.
    pub batches: u64,
    /// Requests in those batches.
    pub requests: u64,
    /// Gathering the requests' rows into the stacked input (host copies), and
    /// finding the buffers for it.
    pub stack_s: f64,
    /// Copying the stacked rows to the device (0 on the CPU).
    pub upload_s: f64,
    /// The stacked product.
    pub product_s: f64,
    /// Copying the result back (0 on the CPU).
    pub download_s: f64,
    /// Splitting the result into each request's rows and waking the callers.
    pub answer_s: f64,
}

impl BatchPhases {
    /// Microseconds per batch of each step: stack, upload, product, download,
    /// answer (zeros before any batch). Free.
    pub fn per_batch_us(&self) -> [f64; 5] {
        let b = self.batches.max(1) as f64 * 1e-6;
        [self.stack_s / b, self.upload_s / b, self.product_s / b, self.download_s / b, self.answer_s / b]
    }

    /// Adds `other`'s sums to these.
    pub fn add(&mut self, other: &BatchPhases) {
        self.batches += other.batches;
        self.requests += other.requests;
        self.stack_s += other.stack_s;
        self.upload_s += other.upload_s;
        self.product_s += other.product_s;
        self.download_s += other.download_s;
        self.answer_s += other.answer_s;
    }
}

impl ExecutorMetrics {
    /// `engines` as text, e.g. `"wgpu 12, simd 3"` (`"-"` when none).
    pub fn engines_text(&self) -> String {
        if self.engines.is_empty() {
            return "-".into();
        }
        self.engines.iter().map(|(e, n)| format!("{e} {n}")).collect::<Vec<_>>().join(", ")
    }
}

const WINDOW: usize = 1 << 16;

/// The mutable counters behind [`ExecutorMetrics`].
#[derive(Debug, Default)]
pub(crate) struct State {
    pub(crate) submitted: u64,
    pub(crate) rejected: u64,
    pub(crate) completed: u64,
    pub(crate) failed: u64,
    pub(crate) batches: u64,
    pub(crate) unmerged: u64,
    pub(crate) batched_requests: u64,
    pub(crate) flush_size: u64,
    pub(crate) flush_timeout: u64,
    pub(crate) flush_idle: u64,
    pub(crate) flush_shutdown: u64,
    pub(crate) flush_alone: u64,
    pub(crate) engines: Vec<(Engine, u64)>,
    pub(crate) phases: BatchPhases,
    queue: Vec<f64>,
    next: usize,
}

impl State {
    /// Records one dispatch of `n` requests on `engine` and their queue times.
    pub(crate) fn batch(&mut self, reason: FlushReason, engine: Engine, queue_s: impl Iterator<Item = f64>) {
        self.batches += 1;
        match self.engines.iter_mut().find(|(e, _)| *e == engine) {
            Some((_, n)) => *n += 1,
            None => self.engines.push((engine, 1)),
        }
        match reason {
            FlushReason::Size => self.flush_size += 1,
            FlushReason::Timeout => self.flush_timeout += 1,
            FlushReason::Idle => self.flush_idle += 1,
            FlushReason::Shutdown => self.flush_shutdown += 1,
            FlushReason::Alone => self.flush_alone += 1,
        }
        for q in queue_s {
            self.batched_requests += 1;
            if self.queue.len() < WINDOW {
                self.queue.push(q);
            } else if let Some(slot) = self.queue.get_mut(self.next) {
                *slot = q;
            }
            self.next = (self.next + 1) % WINDOW;
        }
    }

    /// The snapshot; sorts a copy of the latency window (O(n log n), n ≤ 65 536).
    pub(crate) fn snapshot(&self, max_batch_size: usize) -> ExecutorMetrics {
        let mut q = self.queue.clone();
        q.sort_by(|a, b| a.total_cmp(b));
        let pct = |p: f64| {
            if q.is_empty() {
                0.0
            } else {
                let i = ((q.len() - 1) as f64 * p).round() as usize;
                q.get(i).copied().unwrap_or(0.0)
            }
        };
        let mut engines = self.engines.clone();
        engines.sort_by_key(|e| std::cmp::Reverse(e.1));
        let mean = if self.batches == 0 { 0.0 } else { self.batched_requests as f64 / self.batches as f64 };
        ExecutorMetrics {
            submitted: self.submitted,
            rejected: self.rejected,
            completed: self.completed,
            failed: self.failed,
            batches: self.batches,
            unmerged: self.unmerged,
            mean_batch_size: mean,
            fill_rate: mean / max_batch_size.max(1) as f64,
            flush_size: self.flush_size,
            flush_timeout: self.flush_timeout,
            flush_idle: self.flush_idle,
            flush_shutdown: self.flush_shutdown,
            flush_alone: self.flush_alone,
            queue_p50_s: pct(0.5),
            queue_p99_s: pct(0.99),
            engines,
            phases: self.phases,
        }
    }
}
