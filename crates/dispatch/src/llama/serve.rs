//! [`BatchedDecoder`]: many callers generating at once through one model,
//! each request a sequence in a slot of the KV cache, all decoded together.
//!
//! This is the batching executor's pattern applied to a whole decoder.
//! Callers on any thread submit a prompt ([`DecoderHandle::generate`]) and
//! read its tokens as they come ([`Generation`]); one worker thread owns the
//! [`Llama`] and batches continuously:
//!
//! - between steps it admits waiting requests into free slots, their
//!   prompts prefilled together in one pass ([`Llama::add_sequences`]);
//! - each step decodes one token of every held sequence in one step of the
//!   model, one product per weight for all of them ([`Llama::step_active`]),
//!   so the weights are read once a step whatever the number of sequences;
//! - a sequence leaves as soon as it has its tokens, or a stop token, or its
//!   caller dropped its [`Generation`]; its slot goes to the next request.
//!
//! An idle decoder that receives a request waits up to
//! [`DecoderConfig::max_wait`] for more to fill its slots, so that requests
//! arriving together are prefilled in one pass. Requests that arrive while
//! sequences decode join at the next step without waiting; their prefill
//! holds up the held sequences' next step for its duration. Requests beyond
//! the free slots queue in arrival order.
//!
//! Greedy decoding: a request's tokens are the ones [`Llama::generate`] gives
//! for its prompt alone (up to the rounding of a product over more rows).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use compute_core::{BackendKind, ComputeError, Result};

use super::{Llama, LlamaConfig, SeqId};
use crate::lock::{lock, wait};

/// How a [`BatchedDecoder`] batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecoderConfig {
    /// Sequences decoded together (≥ 1): the KV cache holds this many of
    /// [`LlamaConfig::max_seq`] tokens each, and every step runs one row per
    /// slot.
    pub slots: usize,
    /// Longest an idle decoder holds its first request for others to join
    /// its prefill, counted from that request's submission.
    pub max_wait: Duration,
}

impl DecoderConfig {
    /// `slots` sequences, a `max_wait` of 2 ms.
    pub fn new(slots: usize) -> Self {
        DecoderConfig { slots, max_wait: Duration::from_millis(2) }
    }

    /// Sets `max_wait`.
    pub fn with_max_wait(mut self, d: Duration) -> Self {
        self.max_wait = d;
        self
    }
}

/// What one caller asks for: greedy tokens after its prompt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GenerateRequest {
    /// The prompt's token ids (at least one).
    pub prompt: Vec<u32>,
    /// Most tokens to generate (≥ 1); the prompt and all but the last of
    /// them must fit the KV cache.
    pub max_new_tokens: usize,
    /// Tokens that end the generation early (an end-of-sequence token); the
    /// stop token itself is the last one returned.
    pub stop_tokens: Vec<u32>,
}

impl GenerateRequest {
    /// `max_new_tokens` greedy tokens after `prompt`, no stop token.
    pub fn new(prompt: Vec<u32>, max_new_tokens: usize) -> Self {
        GenerateRequest { prompt, max_new_tokens, stop_tokens: Vec::new() }
    }

    /// Sets the tokens that end the generation early.
    pub fn with_stop_tokens(mut self, stop: Vec<u32>) -> Self {
        self.stop_tokens = stop;
        self
    }
}

/// A finished generation: its tokens and where its time went, each counted
/// from its submission.
#[derive(Clone, Debug, PartialEq)]
pub struct Generated {
    /// The generated tokens, in order (a stop token last if one ended it).
    pub tokens: Vec<u32>,
    /// Until its prefill started (queued behind full slots, held for others
    /// to join, or behind a step of the held sequences).
    pub queued: Duration,
    /// Until its first token (its prefill done).
    pub first_token: Duration,
    /// Until its last token.
    pub total: Duration,
    /// Whether a stop token ended it before `max_new_tokens`.
    pub stopped: bool,
}

impl Generated {
    /// Tokens per second after the first: the rate this caller's sequence
    /// decoded at, sharing its steps with the others held beside it.
    pub fn decode_tokens_per_s(&self) -> f64 {
        let decoding = self.total.saturating_sub(self.first_token).as_secs_f64();
        let n = self.tokens.len().saturating_sub(1);
        if n == 0 || decoding <= 0.0 { 0.0 } else { n as f64 / decoding }
    }
}

/// Counters of a [`BatchedDecoder`] since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DecoderMetrics {
    /// Requests accepted.
    pub requests: u64,
    /// Requests answered with all their tokens.
    pub completed: u64,
    /// Requests whose caller dropped its [`Generation`] before the end.
    pub cancelled: u64,
    /// Requests answered with an error (a failed prefill or step).
    pub failed: u64,
    /// Prefill passes, and the prompts they started.
    pub prefills: u64,
    /// Prompts started by the prefills.
    pub prefilled: u64,
    /// Decoding steps run.
    pub steps: u64,
    /// Sequences the steps decoded, summed over the steps (÷ `steps`: the
    /// mean batch).
    pub step_rows: u64,
    /// Tokens generated (each request's first token, from its prefill,
    /// included).
    pub tokens: u64,
    /// Time the worker spent in prefills and steps.
    pub busy: Duration,
}

impl DecoderMetrics {
    /// Sequences decoded per step, on average.
    pub fn mean_batch(&self) -> f64 {
        if self.steps == 0 { 0.0 } else { self.step_rows as f64 / self.steps as f64 }
    }
}

/// One request's answer, shared by its caller and the worker: the tokens
/// not read yet and, once it has ended, how.
#[derive(Default)]
struct Reply {
    state: Mutex<ReplyState>,
    ready: Condvar,
}

#[derive(Default)]
struct ReplyState {
    unread: VecDeque<u32>,
    end: Option<Result<Generated>>,
    /// The caller waits for its next token (else the worker wakes it only
    /// at the end: a caller in [`Generation::wait`] sleeps through the steps).
    listening: bool,
    /// The caller dropped its [`Generation`].
    dropped: bool,
}

/// The worker's side of a [`Reply`]. Dropped without an end (the worker
/// thread ended abnormally), it ends the request with an error, so that no
/// caller waits forever.
struct Replier {
    reply: Arc<Reply>,
    backend: BackendKind,
}

impl Replier {
    /// Hands `token` to the caller; `false` if the caller has gone.
    fn token(&self, token: u32) -> bool {
        let mut s = lock(&self.reply.state);
        if s.dropped {
            return false;
        }
        s.unread.push_back(token);
        if s.listening {
            self.reply.ready.notify_one();
        }
        true
    }

    fn end(&self, how: Result<Generated>) {
        lock(&self.reply.state).end = Some(how);
        self.reply.ready.notify_one();
    }
}

impl Drop for Replier {
    fn drop(&mut self) {
        let mut s = lock(&self.reply.state);
        if s.end.is_none() {
            s.end = Some(Err(Generation::lost(self.backend)));
            self.reply.ready.notify_one();
        }
    }
}

/// A request on its way to the worker.
struct Pending {
    request: GenerateRequest,
    submitted: Instant,
    reply: Replier,
}

enum Msg {
    Generate(Pending),
    Shutdown,
}

/// The state shared by the decoder and its handles.
struct Shared {
    tx: Sender<Msg>,
    open: AtomicBool,
    cfg: LlamaConfig,
    backend: BackendKind,
    metrics: Mutex<DecoderMetrics>,
}

/// A cloneable, `Send + Sync` handle for submitting to a [`BatchedDecoder`].
#[derive(Clone)]
pub struct DecoderHandle {
    shared: Arc<Shared>,
}

/// Decodes the requests of many callers together on one [`Llama`] (see the
/// module documentation). Dropping it shuts down like
/// [`BatchedDecoder::shutdown`].
pub struct BatchedDecoder {
    handle: DecoderHandle,
    worker: Option<JoinHandle<Llama>>,
}

impl BatchedDecoder {
    /// Gives `model` to a worker thread that decodes `config.slots`
    /// sequences together. Reallocates the model's KV cache for that many
    /// slots ([`Llama::set_slots`], dropping any held sequence). Needs a
    /// backend that takes positions from a tensor
    /// ([`Llama::device_positions`]), else `Unsupported`.
    pub fn new(mut model: Llama, config: DecoderConfig) -> Result<BatchedDecoder> {
        if !model.device_positions() {
            return Err(ComputeError::Unsupported { op: "llama batched decoder", backend: model.backend.kind() });
        }
        model.set_slots(config.slots)?;
        let (tx, rx) = channel();
        let shared = Arc::new(Shared {
            tx,
            open: AtomicBool::new(true),
            cfg: *model.config(),
            backend: model.backend.kind(),
            metrics: Mutex::new(DecoderMetrics::default()),
        });
        let worker_shared = shared.clone();
        let backend = shared.backend;
        let worker = std::thread::Builder::new()
            .name("dispatch-decoder".into())
            .spawn(move || Worker::new(model, config, worker_shared).run(rx))
            .map_err(|e| ComputeError::DeviceUnavailable {
                backend,
                reason: format!("could not start the decoding thread: {e}"),
            })?;
        Ok(BatchedDecoder { handle: DecoderHandle { shared }, worker: Some(worker) })
    }

    /// A handle for submitting (clone it freely, send it to other threads).
    pub fn handle(&self) -> DecoderHandle {
        self.handle.clone()
    }

    /// The counters so far.
    pub fn metrics(&self) -> DecoderMetrics {
        self.handle.metrics()
    }

    /// Stops accepting requests, finishes every accepted one (their callers
    /// get all their tokens), and returns the model (its slots as the worker
    /// left them: all free) with the final counters.
    pub fn shutdown(mut self) -> Result<(Llama, DecoderMetrics)> {
        let model = self.stop();
        let backend = self.handle.shared.backend;
        let model = model.ok_or_else(|| ComputeError::DeviceUnavailable {
            backend,
            reason: "the decoding thread ended abnormally; its model is lost".into(),
        })?;
        Ok((model, self.handle.metrics()))
    }

    fn stop(&mut self) -> Option<Llama> {
        let shared = &self.handle.shared;
        shared.open.store(false, Ordering::SeqCst);
        // A send fails only if the worker has already ended.
        let _ = shared.tx.send(Msg::Shutdown);
        self.worker.take().and_then(|w| w.join().ok())
    }
}

impl Drop for BatchedDecoder {
    fn drop(&mut self) {
        self.stop();
    }
}

impl DecoderHandle {
    /// Submits `max_new_tokens` greedy tokens after `prompt`
    /// ([`DecoderHandle::submit`] of a [`GenerateRequest::new`]).
    pub fn generate(&self, prompt: Vec<u32>, max_new_tokens: usize) -> Result<Generation> {
        self.submit(GenerateRequest::new(prompt, max_new_tokens))
    }

    /// Queues `request` and returns at once with the [`Generation`] that
    /// yields its tokens. A prompt that is empty, holds a token past the
    /// vocabulary, or with `max_new_tokens` does not fit the KV cache is a
    /// shape error here, and nothing is queued; so is a request after
    /// shutdown (a driver error). Costs one channel send.
    pub fn submit(&self, request: GenerateRequest) -> Result<Generation> {
        let c = self.shared.cfg;
        let (p, n) = (request.prompt.len(), request.max_new_tokens);
        let shapes = || format!("prompt=[{p}] max_new_tokens={n} max_seq={}", c.max_seq);
        if p == 0 || n == 0 {
            return Err(ComputeError::shape("llama generate", "an empty prompt or no token to generate", shapes()));
        }
        if p + n - 1 > c.max_seq {
            return Err(ComputeError::shape(
                "llama generate",
                format!("the prompt and {} generated tokens exceed the KV cache", n - 1),
                shapes(),
            ));
        }
        if let Some(t) = request.prompt.iter().find(|&&t| t as usize >= c.vocab) {
            return Err(ComputeError::shape(
                "llama generate",
                format!("token {t} is past the vocabulary of {}", c.vocab),
                shapes(),
            ));
        }
        let closed = || {
            ComputeError::driver(
                "llama generate",
                self.shared.backend,
                "the batched decoder is shut down; not accepted",
            )
        };
        if !self.shared.open.load(Ordering::SeqCst) {
            return Err(closed());
        }
        let reply = Arc::new(Reply::default());
        let submitted = Instant::now();
        let pending =
            Pending { request, submitted, reply: Replier { reply: reply.clone(), backend: self.shared.backend } };
        self.shared.tx.send(Msg::Generate(pending)).map_err(|_| closed())?;
        lock(&self.shared.metrics).requests += 1;
        Ok(Generation { reply, tokens: Vec::new(), ended: false })
    }

    /// The counters so far.
    pub fn metrics(&self) -> DecoderMetrics {
        *lock(&self.shared.metrics)
    }

    /// The model's shape (its vocabulary and cache capacity bound requests).
    pub fn config(&self) -> LlamaConfig {
        self.shared.cfg
    }
}

/// One request's tokens as the decoder produces them: iterate for each
/// token as it comes (blocking), or [`Generation::wait`] for all of them.
/// Dropping it cancels the request: its sequence leaves at the next step.
pub struct Generation {
    reply: Arc<Reply>,
    /// The tokens read so far.
    tokens: Vec<u32>,
    /// The iteration has returned its end (`None`, or the error).
    ended: bool,
}

impl Generation {
    /// Blocks until the request has ended; returns all its tokens (those
    /// already read included) with their timings, or the error that ended
    /// it. The caller sleeps until then: no wake-up per token.
    pub fn wait(self) -> Result<Generated> {
        let mut s = lock(&self.reply.state);
        loop {
            if let Some(end) = &s.end {
                return end.clone();
            }
            s = wait(&self.reply.ready, s);
        }
    }

    /// The tokens read so far.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    fn lost(backend: BackendKind) -> ComputeError {
        ComputeError::driver("llama generate", backend, "the decoding thread ended before answering")
    }
}

impl Iterator for Generation {
    type Item = Result<u32>;

    /// The next token, blocking until the decoder produces it; `None` after
    /// the last one. An error ends the iteration.
    fn next(&mut self) -> Option<Result<u32>> {
        if self.ended {
            return None;
        }
        let mut s = lock(&self.reply.state);
        loop {
            if let Some(t) = s.unread.pop_front() {
                self.tokens.push(t);
                return Some(Ok(t));
            }
            if let Some(end) = &s.end {
                self.ended = true;
                return end.as_ref().err().map(|e| Err(e.clone()));
            }
            s.listening = true;
            s = wait(&self.reply.ready, s);
            s.listening = false;
        }
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        lock(&self.reply.state).dropped = true;
    }
}

/// A sequence the worker holds for one request.
struct Held {
    pending: Pending,
    tokens: Vec<u32>,
    queued: Duration,
    first_token: Duration,
}

/// Whether a delivered token ended its sequence.
enum Delivered {
    More,
    Finished,
    Cancelled,
}

/// The thread that owns the model.
struct Worker {
    model: Llama,
    config: DecoderConfig,
    shared: Arc<Shared>,
    queue: VecDeque<Pending>,
    held: HashMap<SeqId, Held>,
    closing: bool,
}

impl Worker {
    fn new(model: Llama, config: DecoderConfig, shared: Arc<Shared>) -> Self {
        Worker { model, config, shared, queue: VecDeque::new(), held: HashMap::new(), closing: false }
    }

    /// Admits and steps until shut down with nothing left to answer; returns
    /// the model.
    fn run(mut self, rx: Receiver<Msg>) -> Llama {
        loop {
            if self.held.is_empty() && self.queue.is_empty() {
                if self.closing {
                    break;
                }
                match rx.recv() {
                    Ok(m) => self.take(m),
                    Err(_) => break,
                }
            }
            while let Ok(m) = rx.try_recv() {
                self.take(m);
            }
            if self.held.is_empty() && !self.closing {
                self.hold_for_more(&rx);
            }
            self.admit();
            self.step();
        }
        self.model
    }

    fn take(&mut self, m: Msg) {
        match m {
            Msg::Generate(p) => self.queue.push_back(p),
            Msg::Shutdown => self.closing = true,
        }
    }

    /// An idle model with fewer requests than slots waits, up to `max_wait`
    /// from the oldest request, for more to share its prefill.
    fn hold_for_more(&mut self, rx: &Receiver<Msg>) {
        let Some(first) = self.queue.front() else { return };
        let deadline = first.submitted + self.config.max_wait;
        while self.queue.len() < self.config.slots && !self.closing {
            let Some(left) = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) else {
                return;
            };
            match rx.recv_timeout(left) {
                Ok(m) => self.take(m),
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    /// Starts as many queued requests as there are free slots, their
    /// prompts prefilled in one pass.
    fn admit(&mut self) {
        let free = self.config.slots.saturating_sub(self.held.len());
        let take = free.min(self.queue.len());
        if take == 0 {
            return;
        }
        let batch: Vec<Pending> = self.queue.drain(..take).collect();
        let start = Instant::now();
        let prompts: Vec<&[u32]> = batch.iter().map(|p| p.request.prompt.as_slice()).collect();
        let added = self.model.add_sequences(&prompts);
        let done = Instant::now();
        {
            let mut m = lock(&self.shared.metrics);
            m.busy += done - start;
            m.prefills += 1;
            m.prefilled += batch.len() as u64;
        }
        let added = match added {
            Ok(added) => added,
            Err(e) => {
                for p in batch {
                    Self::fail(&self.shared, &p, &e);
                }
                return;
            }
        };
        for ((id, first), pending) in added.into_iter().zip(batch) {
            let queued = start - pending.submitted;
            let first_token = done - pending.submitted;
            self.held.insert(id, Held { pending, tokens: Vec::new(), queued, first_token });
            self.deliver(id, first, done);
        }
    }

    /// One decoding step of every held sequence.
    fn step(&mut self) {
        if self.held.is_empty() {
            return;
        }
        let start = Instant::now();
        let out = self.model.step_active();
        let done = Instant::now();
        {
            let mut m = lock(&self.shared.metrics);
            m.busy += done - start;
            m.steps += 1;
            m.step_rows += self.held.len() as u64;
        }
        match out {
            Ok(out) => {
                for (id, token) in out {
                    self.deliver(id, token, done);
                }
            }
            Err(e) => {
                // Every held sequence shared the failed step: each caller
                // gets the error and its slot is freed.
                for (id, held) in std::mem::take(&mut self.held) {
                    Self::fail(&self.shared, &held.pending, &e);
                    let _ = self.model.remove_sequence(id);
                }
            }
        }
    }

    /// Sends `token` to `id`'s caller; ends the sequence when it is the last
    /// one asked for, a stop token, or nobody listens any more.
    fn deliver(&mut self, id: SeqId, token: u32, at: Instant) {
        let Some(held) = self.held.get_mut(&id) else { return };
        held.tokens.push(token);
        let req = &held.pending.request;
        let stopped = req.stop_tokens.contains(&token);
        let outcome = if !held.pending.reply.token(token) {
            Delivered::Cancelled
        } else if stopped || held.tokens.len() >= req.max_new_tokens {
            Delivered::Finished
        } else {
            Delivered::More
        };
        // Counted before the caller hears of the end, so that a caller who
        // reads the metrics after its last token sees its request in them.
        {
            let mut m = lock(&self.shared.metrics);
            m.tokens += 1;
            match outcome {
                Delivered::More => return,
                Delivered::Finished => m.completed += 1,
                Delivered::Cancelled => m.cancelled += 1,
            }
        }
        if let Delivered::Finished = outcome {
            let stopped = stopped && held.tokens.len() < req.max_new_tokens;
            held.pending.reply.end(Ok(Generated {
                tokens: std::mem::take(&mut held.tokens),
                queued: held.queued,
                first_token: held.first_token,
                total: at - held.pending.submitted,
                stopped,
            }));
        }
        self.held.remove(&id);
        // The id was just held: removing it cannot fail.
        let _ = self.model.remove_sequence(id);
    }

    fn fail(shared: &Shared, pending: &Pending, e: &ComputeError) {
        // Counted first, as in `deliver`.
        lock(&shared.metrics).failed += 1;
        pending.reply.end(Err(e.clone()));
    }
}
