//! [`AsyncGpuResult`]: the result of a call that runs while the caller does
//! other work. States Pending → Ready or Error; blocking ([`AsyncGpuResult::wait`]),
//! polling ([`AsyncGpuResult::try_get`]) and `std::future::Future` (any executor:
//! pollster, tokio, a hand-written `block_on`).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use compute_core::{BackendKind, ComputeError, Result};

use crate::lock::{lock, wait_timeout};

/// Where an [`AsyncGpuResult`] stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AsyncState {
    /// Still computing.
    Pending,
    /// Finished; the value is waiting to be taken.
    Ready,
    /// Finished with an error (or the value was already taken).
    Error,
}

enum Slot<T> {
    Pending,
    Ready(T),
    Error(ComputeError),
    Taken,
}

struct Inner<T> {
    slot: Slot<T>,
    waker: Option<Waker>,
    done_at: Option<Instant>,
    /// Threads blocked on `cv` (only they need a wake-up).
    waiters: usize,
}

struct Shared<T> {
    inner: Mutex<Inner<T>>,
    cv: Condvar,
    /// Set once the slot is filled, for waiters that spin before blocking.
    done: AtomicBool,
    /// How long [`AsyncGpuResult::wait`] spins before blocking.
    spin: Duration,
    /// Where [`AsyncGpuResult::wait`] blocks, if not on `cv`.
    bell: Option<Arc<Bell>>,
    op: &'static str,
    backend: BackendKind,
}

/// One wake-up for many results: [`AsyncGpuResult::wait`] on results made
/// with the same bell blocks on it, and a producer that finishes many of
/// them at once fills them quietly ([`Completer::complete_quiet`]) and
/// rings once, waking every sleeper with one system call instead of one per
/// result. A sleeper whose result is not finished yet goes back to sleep.
#[derive(Debug, Default)]
pub(crate) struct Bell {
    /// Threads asleep on `cv`.
    sleepers: Mutex<usize>,
    cv: Condvar,
}

impl Bell {
    /// Wakes every thread asleep on the bell; free when none is.
    pub(crate) fn ring(&self) {
        // A sleeper counts itself and checks its result under the lock, and
        // results are filled before the ring: one not counted here will see
        // its result filled, so the wake-up may follow the unlock.
        let asleep = *lock(&self.sleepers) > 0;
        if asleep {
            self.cv.notify_all();
        }
    }

    /// Blocks until `done` is set (checked under the lock, after every wake-up).
    fn sleep_until(&self, done: &AtomicBool) {
        let mut sleepers = lock(&self.sleepers);
        while !done.load(Ordering::Acquire) {
            *sleepers += 1;
            sleepers = wait_timeout(&self.cv, sleepers, Duration::from_secs(3600));
            *sleepers -= 1;
        }
    }
}

impl<T> Shared<T> {
    fn taken(&self) -> ComputeError {
        ComputeError::Driver {
            op: self.op,
            backend: self.backend,
            message: "the async result was already taken".into(),
            cause: None,
        }
    }

    fn take(&self, inner: &mut Inner<T>) -> Option<Result<T>> {
        match std::mem::replace(&mut inner.slot, Slot::Taken) {
            Slot::Pending => {
                inner.slot = Slot::Pending;
                None
            }
            Slot::Ready(v) => Some(Ok(v)),
            Slot::Error(e) => {
                inner.slot = Slot::Error(e.clone());
                Some(Err(e))
            }
            Slot::Taken => Some(Err(self.taken())),
        }
    }
}

/// The result of an asynchronous call. The work runs elsewhere (a device
/// queue, a worker thread); this handle costs one small allocation and waits
/// without spinning.
pub struct AsyncGpuResult<T> {
    shared: Arc<Shared<T>>,
}

/// The producing side of an [`AsyncGpuResult`]. Dropping it without calling
/// [`Completer::complete`] (e.g. when the worker panics) completes the result
/// with an error, so no waiter is left hanging.
pub struct Completer<T> {
    shared: Option<Arc<Shared<T>>>,
}

impl<T> std::fmt::Debug for AsyncGpuResult<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncGpuResult").field("op", &self.shared.op).field("state", &self.state()).finish()
    }
}

impl<T> AsyncGpuResult<T> {
    /// A pending result and the completer that finishes it; errors it reports
    /// name `op` and `backend`.
    pub fn channel(op: &'static str, backend: BackendKind) -> (AsyncGpuResult<T>, Completer<T>) {
        Self::channel_spinning(op, backend, Duration::ZERO)
    }

    /// [`AsyncGpuResult::channel`] whose [`AsyncGpuResult::wait`] first
    /// spins for up to `spin` (checking one flag) before blocking: for
    /// results expected within microseconds, where being woken from a block
    /// would cost more than the wait itself. Spinning occupies the waiting
    /// thread's core for that long.
    pub fn channel_spinning(
        op: &'static str,
        backend: BackendKind,
        spin: Duration,
    ) -> (AsyncGpuResult<T>, Completer<T>) {
        Self::make(op, backend, spin, None)
    }

    /// [`AsyncGpuResult::channel_spinning`] whose [`AsyncGpuResult::wait`]
    /// blocks on `bell` once it has spun, for results finished many at a time.
    pub(crate) fn channel_belled(
        op: &'static str,
        backend: BackendKind,
        spin: Duration,
        bell: Arc<Bell>,
    ) -> (AsyncGpuResult<T>, Completer<T>) {
        Self::make(op, backend, spin, Some(bell))
    }

    fn make(
        op: &'static str,
        backend: BackendKind,
        spin: Duration,
        bell: Option<Arc<Bell>>,
    ) -> (AsyncGpuResult<T>, Completer<T>) {
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner { slot: Slot::Pending, waker: None, done_at: None, waiters: 0 }),
            cv: Condvar::new(),
            done: AtomicBool::new(false),
            spin,
            bell,
            op,
            backend,
        });
        (AsyncGpuResult { shared: shared.clone() }, Completer { shared: Some(shared) })
    }

    /// A result that is already finished with `result`.
    pub fn finished(op: &'static str, backend: BackendKind, result: Result<T>) -> AsyncGpuResult<T> {
        let (r, c) = Self::channel(op, backend);
        c.complete(result);
        r
    }

    /// Where it stands now. One lock, no waiting.
    pub fn state(&self) -> AsyncState {
        match lock(&self.shared.inner).slot {
            Slot::Pending => AsyncState::Pending,
            Slot::Ready(_) => AsyncState::Ready,
            Slot::Error(_) | Slot::Taken => AsyncState::Error,
        }
    }

    /// Whether it has finished (with a value or an error), so that
    /// [`AsyncGpuResult::try_get`] returns it without waiting.
    pub fn is_ready(&self) -> bool {
        self.state() != AsyncState::Pending
    }

    /// The value if finished (`Ok(Some)`, taken: later calls return an error),
    /// `Ok(None)` if still pending, or the error it finished with. Never waits.
    pub fn try_get(&self) -> Result<Option<T>> {
        let mut inner = lock(&self.shared.inner);
        self.shared.take(&mut inner).transpose()
    }

    /// Blocks the calling thread until finished and returns the value or
    /// error (spinning first for the time given to
    /// [`AsyncGpuResult::channel_spinning`], if any).
    pub fn wait(self) -> Result<T> {
        if !self.shared.spin.is_zero() && !self.shared.done.load(Ordering::Acquire) {
            let until = Instant::now() + self.shared.spin;
            while !self.shared.done.load(Ordering::Acquire) && Instant::now() < until {
                for _ in 0..32 {
                    std::hint::spin_loop();
                }
            }
        }
        if let Some(bell) = &self.shared.bell {
            bell.sleep_until(&self.shared.done);
        }
        let mut inner = lock(&self.shared.inner);
        loop {
            if let Some(r) = self.shared.take(&mut inner) {
                return r;
            }
            inner.waiters += 1;
            inner = wait_timeout(&self.shared.cv, inner, Duration::from_secs(3600));
            inner.waiters -= 1;
        }
    }

    /// Waits at most `timeout`: `Ok(Some)` when finished in time, `Ok(None)` if
    /// still pending, or the error it finished with.
    pub fn wait_for(&self, timeout: Duration) -> Result<Option<T>> {
        let deadline = Instant::now() + timeout;
        let mut inner = lock(&self.shared.inner);
        loop {
            if let Some(r) = self.shared.take(&mut inner) {
                return r.map(Some);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            inner.waiters += 1;
            inner = wait_timeout(&self.shared.cv, inner, deadline - now);
            inner.waiters -= 1;
        }
    }

    /// When the producer finished it, if it has.
    pub fn completed_at(&self) -> Option<Instant> {
        lock(&self.shared.inner).done_at
    }
}

impl<T> Future for AsyncGpuResult<T> {
    type Output = Result<T>;

    /// Ready once the producer completed; otherwise registers the waker, which
    /// the producer wakes when it completes.
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut inner = lock(&self.shared.inner);
        match self.shared.take(&mut inner) {
            Some(r) => Poll::Ready(r),
            None => {
                inner.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl<T> Completer<T> {
    /// Finishes the result with `result`, waking every waiter.
    pub fn complete(mut self, result: Result<T>) {
        self.finish(result, true);
    }

    /// Finishes the result with `result` without ringing its bell: the
    /// caller rings it once after finishing the others ([`Bell::ring`]).
    /// Waiters that do not sleep on the bell are woken as by
    /// [`Completer::complete`].
    pub(crate) fn complete_quiet(mut self, result: Result<T>) {
        self.finish(result, false);
    }

    /// Whether the [`AsyncGpuResult`] was dropped, so nobody will read the value.
    pub fn is_abandoned(&self) -> bool {
        self.shared.as_ref().is_none_or(|s| Arc::strong_count(s) < 2)
    }

    fn finish(&mut self, result: Result<T>, ring: bool) {
        let Some(shared) = self.shared.take() else { return };
        let (waker, blocked) = {
            let mut inner = lock(&shared.inner);
            inner.slot = match result {
                Ok(v) => Slot::Ready(v),
                Err(e) => Slot::Error(e),
            };
            inner.done_at = Some(Instant::now());
            shared.done.store(true, Ordering::Release);
            (inner.waker.take(), inner.waiters > 0)
        };
        // A waiter counts itself under the lock before it blocks, so one not
        // counted here will see the slot filled: no wake-up (a system call)
        // is needed for it.
        if blocked {
            shared.cv.notify_all();
        }
        if let Some(w) = waker {
            w.wake();
        }
        if let Some(bell) = shared.bell.as_ref().filter(|_| ring) {
            bell.ring();
        }
    }
}

impl<T> Drop for Completer<T> {
    fn drop(&mut self) {
        if let Some(shared) = &self.shared {
            let err = ComputeError::Driver {
                op: shared.op,
                backend: shared.backend,
                message: "the computation ended without producing a result (worker stopped or panicked)".into(),
                cause: None,
            };
            self.finish(Err(err), true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    struct CountingWaker(AtomicUsize);
    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn states_move_from_pending_to_ready_and_value_is_taken_once() {
        let (r, c) = AsyncGpuResult::<Vec<f32>>::channel("relu", BackendKind::Simd);
        assert_eq!(r.state(), AsyncState::Pending);
        assert!(!r.is_ready());
        assert!(matches!(r.try_get(), Ok(None)));
        assert!(!c.is_abandoned());
        c.complete(Ok(vec![1.5, 2.5]));
        assert_eq!(r.state(), AsyncState::Ready);
        assert!(r.completed_at().is_some());
        assert_eq!(r.try_get().ok().flatten(), Some(vec![1.5, 2.5]));
        assert_eq!(r.state(), AsyncState::Error);
        assert!(r.try_get().is_err(), "a second take is an error, not a silent None");
    }

    #[test]
    fn dropped_completer_finishes_with_an_error() {
        let (r, c) = AsyncGpuResult::<u32>::channel("matmul", BackendKind::Wgpu);
        drop(c);
        assert_eq!(r.state(), AsyncState::Error);
        let err = r.wait().unwrap_err();
        assert!(err.to_string().contains("matmul"), "{err}");
    }

    #[test]
    fn future_registers_the_waker_and_is_woken_on_completion() {
        let (mut r, c) = AsyncGpuResult::<i32>::channel("sum", BackendKind::Simd);
        let counter = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let waker = Waker::from(counter.clone());
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut r).poll(&mut cx).is_pending());
        assert_eq!(counter.0.load(Ordering::SeqCst), 0);
        c.complete(Ok(42));
        assert_eq!(counter.0.load(Ordering::SeqCst), 1);
        match Pin::new(&mut r).poll(&mut cx) {
            Poll::Ready(Ok(42)) => {}
            other => panic!("expected Ready(Ok(42)), got {other:?}"),
        }
    }

    #[test]
    fn a_spinning_waiter_gets_results_that_come_early_or_late() {
        // Completed while the waiter spins.
        let (r, c) = AsyncGpuResult::<u32>::channel_spinning("matmul", BackendKind::Cuda, Duration::from_secs(5));
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(2));
            c.complete(Ok(7));
        });
        assert_eq!(r.wait().unwrap(), 7);
        t.join().unwrap();
        // Completed long after the spin: the waiter blocked and is woken.
        let (r, c) = AsyncGpuResult::<u32>::channel_spinning("matmul", BackendKind::Cuda, Duration::from_micros(10));
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            c.complete(Err(ComputeError::Unsupported { op: "matmul", backend: BackendKind::Cuda }));
        });
        assert!(matches!(r.wait(), Err(ComputeError::Unsupported { .. })));
        t.join().unwrap();
        // A completer dropped unfinished still wakes a blocked waiter.
        let (r, c) = AsyncGpuResult::<u32>::channel_spinning("dot", BackendKind::Simd, Duration::from_micros(1));
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            drop(c);
        });
        assert!(r.wait().is_err());
        t.join().unwrap();
    }

    /// Eight threads asleep on one bell: results finished quietly wake no
    /// one until the ring, which wakes them all; a thread whose result is
    /// not finished goes back to sleep, and a completer dropped unfinished
    /// rings by itself.
    #[test]
    fn one_ring_wakes_every_sleeper_whose_result_is_finished() {
        let bell = Arc::new(Bell::default());
        let pairs: Vec<_> = (0..9u32)
            .map(|_| AsyncGpuResult::<u32>::channel_belled("matmul", BackendKind::Cuda, Duration::ZERO, bell.clone()))
            .collect();
        let (results, mut completers): (Vec<_>, Vec<_>) = pairs.into_iter().unzip();
        let last = completers.pop().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let threads: Vec<_> = results
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                let tx = tx.clone();
                std::thread::spawn(move || tx.send((i, r.wait())).unwrap())
            })
            .collect();
        while *lock(&bell.sleepers) < 9 {
            std::thread::sleep(Duration::from_millis(1));
        }
        for (i, c) in completers.into_iter().enumerate() {
            c.complete_quiet(Ok(i as u32 * 10));
        }
        std::thread::sleep(Duration::from_millis(50));
        assert!(rx.try_recv().is_err(), "a quiet completion woke a sleeper");
        bell.ring();
        let mut got: Vec<(usize, u32)> = (0..8).map(|_| rx.recv().unwrap()).map(|(i, r)| (i, r.unwrap())).collect();
        got.sort();
        assert_eq!(got, (0..8).map(|i| (i, i as u32 * 10)).collect::<Vec<_>>());
        assert!(rx.recv_timeout(Duration::from_millis(50)).is_err(), "the unfinished result's thread woke up");
        drop(last);
        let (i, r) = rx.recv_timeout(Duration::from_secs(10)).expect("the dropped completer rang");
        assert_eq!(i, 8);
        assert!(r.is_err());
        for t in threads {
            t.join().unwrap();
        }
    }

    #[test]
    fn wait_for_times_out_while_pending_and_errors_propagate() {
        let (r, c) = AsyncGpuResult::<i32>::channel("dot", BackendKind::Cuda);
        assert!(matches!(r.wait_for(Duration::from_millis(1)), Ok(None)));
        c.complete(Err(ComputeError::Unsupported { op: "dot", backend: BackendKind::Cuda }));
        assert!(matches!(r.wait_for(Duration::from_secs(5)), Err(ComputeError::Unsupported { .. })));
        // The error stays readable.
        assert!(matches!(r.try_get(), Err(ComputeError::Unsupported { .. })));
    }
}
