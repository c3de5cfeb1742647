//! Completion of device work as futures, and the thread that drives them on native.
//!
//! wgpu reports completion through callbacks (`map_async`,
//! `on_submitted_work_done`) that fire while someone polls the device. In the
//! browser the event loop does that; on native a per-device poller thread,
//! started on the first future that has to wait, calls `device.poll` while any
//! future is waiting, so futures complete without busy-waiting and without a
//! caller blocking. Blocking calls (`download`, `synchronize`) poll on their
//! own thread instead.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context as TaskContext, Poll, Waker};

/// A one-shot slot a callback fills and a future waits on.
#[derive(Debug)]
pub(crate) struct Signal<T> {
    state: Mutex<(Option<T>, Option<Waker>)>,
    /// Notified on [`Signal::set`], for threads that block ([`Signal::take_finished`]).
    filled: Condvar,
}

impl<T> Signal<T> {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Signal { state: Mutex::new((None, None)), filled: Condvar::new() })
    }

    /// Fills the slot and wakes the waiting future.
    pub(crate) fn set(&self, value: T) {
        let waker = match self.state.lock() {
            Ok(mut s) => {
                s.0 = Some(value);
                s.1.take()
            }
            Err(_) => None,
        };
        self.filled.notify_all();
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Takes the value if it is there, else remembers `waker`.
    pub(crate) fn poll(&self, waker: &Waker) -> Option<T> {
        let mut s = self.state.lock().ok()?;
        if let Some(v) = s.0.take() {
            return Some(v);
        }
        s.1 = Some(waker.clone());
        None
    }

    /// Takes the value if it is there.
    pub(crate) fn take(&self) -> Option<T> {
        self.state.lock().ok().and_then(|mut s| s.0.take())
    }

    /// The value of a callback whose work the device has finished (its
    /// submission waited for). When several threads poll one device, the poll
    /// that completed the work may be another thread's, which runs the callback
    /// after its poll returns: on the H200 machine, 1 download in 40 with 4
    /// threads found its submission done and its map callback not yet run. So
    /// this polls again and waits for the callback, up to [`CALLBACK_WAIT`];
    /// `None` past that. In the browser (no blocking) it only takes the value.
    pub(crate) fn take_finished(&self, device: &wgpu::Device) -> Option<T> {
        #[cfg(target_arch = "wasm32")]
        {
            let _ = device;
            self.take()
        }
        #[cfg(not(target_arch = "wasm32"))]
        {
            let deadline = std::time::Instant::now() + CALLBACK_WAIT;
            loop {
                let guard = self.state.lock().ok()?;
                let slice = std::time::Duration::from_millis(1);
                let (mut guard, _) = self.filled.wait_timeout_while(guard, slice, |s| s.0.is_none()).ok()?;
                if let Some(v) = guard.0.take() {
                    return Some(v);
                }
                drop(guard);
                if std::time::Instant::now() >= deadline {
                    return None;
                }
                // Runs the callbacks that are ready, on this thread; never blocks.
                let _ = device.poll(wgpu::PollType::Poll);
            }
        }
    }
}

/// Longest [`Signal::take_finished`] waits for a callback.
#[cfg(not(target_arch = "wasm32"))]
const CALLBACK_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Serialises opening a device with waiting on one, process-wide: opening takes
/// it exclusively, each wait shares it.
///
/// Observed on an H200 (NVIDIA 580.159, Vulkan): tests that open a second device
/// while other threads wait on theirs hung when run in parallel in one process,
/// and passed one at a time (the conformance suite, which opens all its devices
/// before any wait, passed in parallel). Cause not established; this guard keeps
/// device creation from overlapping a wait inside the driver. Costs nothing
/// measurable: a wait lasts as long as the work it waits for, and devices are
/// opened rarely.
static DRIVER: Mutex<Driver> = Mutex::new(Driver { opening: false, queued: 0, waiting: 0 });
static DRIVER_CHANGED: Condvar = Condvar::new();

/// Who is inside the driver: one opener, or any number of waiters.
#[derive(Debug)]
struct Driver {
    opening: bool,
    /// Openers waiting for their turn (new waits hold back for them).
    queued: usize,
    waiting: usize,
}

/// Exclusive hold of [`DRIVER`] while a device is opened; released on drop.
/// Holds no lock guard itself, so futures that keep it stay `Send`.
#[derive(Debug)]
pub(crate) struct Opening(());

impl Drop for Opening {
    fn drop(&mut self) {
        if let Ok(mut d) = DRIVER.lock() {
            d.opening = false;
        }
        DRIVER_CHANGED.notify_all();
    }
}

/// Longest an opener or a waiter holds back for the other side. The counts are
/// advisory: a side that has not drained by then is running long work or left
/// a count behind, and going ahead beats a process that hangs.
const DRIVER_TURN: std::time::Duration = std::time::Duration::from_secs(2);

/// Waits on [`DRIVER_CHANGED`] while `busy` holds, for at most [`DRIVER_TURN`];
/// `None` if the lock is poisoned.
fn hold_back(
    mut d: std::sync::MutexGuard<'static, Driver>,
    busy: impl Fn(&Driver) -> bool,
) -> Option<std::sync::MutexGuard<'static, Driver>> {
    // The clock is read only when there is something to wait for: the browser,
    // which never waits here, has no `Instant`.
    let mut start = None;
    while busy(&d) {
        let left = DRIVER_TURN.saturating_sub(start.get_or_insert_with(std::time::Instant::now).elapsed());
        if left.is_zero() {
            break;
        }
        d = DRIVER_CHANGED.wait_timeout(d, left).ok()?.0;
    }
    Some(d)
}

/// Waits until no device is being opened and no wait is in progress (at most
/// [`DRIVER_TURN`]), then holds [`DRIVER`].
pub(crate) fn opening() -> Opening {
    let Ok(mut d) = DRIVER.lock() else { return Opening(()) };
    d.queued += 1;
    let Some(mut d) = hold_back(d, |d| d.opening || d.waiting > 0) else { return Opening(()) };
    d.queued -= 1;
    d.opening = true;
    Opening(())
}

/// One wait inside the driver, counted in [`DRIVER`] until dropped (also when
/// the wait unwinds).
struct InDriver;

impl Drop for InDriver {
    fn drop(&mut self) {
        if let Ok(mut d) = DRIVER.lock() {
            d.waiting = d.waiting.saturating_sub(1);
        }
        DRIVER_CHANGED.notify_all();
    }
}

/// Waits on the device until submission `index` (or the latest submission)
/// has finished, sharing [`DRIVER`] meanwhile. Native only.
///
/// Every wait is unbounded on purpose. wgpu-core 30 asserts, inside
/// `Device::poll`, that a wait which finds the queue empty has seen its
/// submission finish; when the wait timed out and another thread's poll (or
/// the one inside every `Queue::submit`) retired the work between this
/// thread's fence read and its look at the queue, that assertion panics (seen
/// on lavapipe with tests sharing one device; fixed upstream after 30.0.2). A
/// wait without a timeout returns only once the fence has passed `index`, so
/// the assertion holds. A lost device ends the wait with an error.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn wait_inside_driver(
    device: &wgpu::Device,
    index: Option<wgpu::SubmissionIndex>,
) -> Result<wgpu::PollStatus, wgpu::PollError> {
    // Poisoned: skip the bookkeeping.
    let counted = DRIVER.lock().ok().and_then(|d| hold_back(d, |d| d.opening || d.queued > 0)).map(|mut d| {
        d.waiting += 1;
        InDriver
    });
    let r = device.poll(wgpu::PollType::Wait { submission_index: index, timeout: None });
    drop(counted);
    r
}

/// Blocks until submission `index` (or the latest one) has finished, then
/// checks for a lost device. Native only.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn wait_for(
    ctx: &crate::context::Context,
    index: Option<wgpu::SubmissionIndex>,
    op: &'static str,
) -> compute_core::Result<()> {
    match wait_inside_driver(&ctx.device, index) {
        Ok(_) => ctx.check_alive(),
        Err(e) => Err(crate::errors::from_poll(op, e)),
    }
}

#[derive(Debug, Default)]
struct PollerState {
    waiting: AtomicUsize,
    started: AtomicBool,
    shutdown: AtomicBool,
    lock: Mutex<()>,
    cv: Condvar,
}

/// Drives `device.poll` on a helper thread while any future waits (native);
/// does nothing in the browser.
#[derive(Debug)]
pub(crate) struct Poller {
    device: wgpu::Device,
    state: Arc<PollerState>,
}

/// Held by a waiting future: while any exists, the poller thread polls.
#[derive(Debug)]
pub(crate) struct Waiting {
    state: Arc<PollerState>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.state.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Poller {
    pub(crate) fn new(device: wgpu::Device) -> Self {
        Poller { device, state: Arc::new(PollerState::default()) }
    }

    /// Registers a waiting future (starting the thread on first use).
    pub(crate) fn wait(&self) -> Waiting {
        self.state.waiting.fetch_add(1, Ordering::AcqRel);
        #[cfg(not(target_arch = "wasm32"))]
        self.start();
        if let Ok(_g) = self.state.lock.lock() {
            self.state.cv.notify_all();
        }
        Waiting { state: Arc::clone(&self.state) }
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn start(&self) {
        if self.state.started.swap(true, Ordering::AcqRel) {
            return;
        }
        let state = Arc::clone(&self.state);
        let device = self.device.clone();
        let spawned = std::thread::Builder::new().name("compute-wgpu-poller".into()).spawn(move || {
            while !state.shutdown.load(Ordering::Acquire) {
                if state.waiting.load(Ordering::Acquire) == 0 {
                    let Ok(g) = state.lock.lock() else { return };
                    // Re-checked under the lock that `wait` notifies under: no lost wake-up.
                    if state.waiting.load(Ordering::Acquire) == 0 && !state.shutdown.load(Ordering::Acquire) {
                        let _unused = state.cv.wait(g);
                    }
                    continue;
                }
                // Waits for everything submitted so far (the work of every future
                // registered before this point); fires map and done callbacks.
                let _ = wait_inside_driver(&device, None);
                // The futures just completed drop their `Waiting` once polled; give them a moment.
                if let Ok(g) = state.lock.lock() {
                    let _unused = state.cv.wait_timeout(g, std::time::Duration::from_micros(200));
                }
            }
        });
        if spawned.is_err() {
            // No thread: futures fall back to polling the device themselves.
            self.state.started.store(false, Ordering::Release);
        }
    }

    /// What a future that is not ready yet returns: registers it as waiting
    /// (once, in `waiting`), and on native without a poller thread polls the
    /// device from here and asks to be polled again.
    pub(crate) fn pending<T>(&self, waiting: &mut Option<Waiting>, cx: &mut TaskContext<'_>) -> Poll<T> {
        if waiting.is_none() {
            *waiting = Some(self.wait());
        }
        #[cfg(not(target_arch = "wasm32"))]
        if !self.running() {
            self.poke();
            cx.waker().wake_by_ref();
        }
        #[cfg(target_arch = "wasm32")]
        let _ = cx;
        Poll::Pending
    }

    /// Whether a helper thread is driving the device.
    pub(crate) fn running(&self) -> bool {
        self.state.started.load(Ordering::Acquire)
    }

    /// Non-blocking poll of the device (fires ready callbacks).
    pub(crate) fn poke(&self) {
        #[cfg(not(target_arch = "wasm32"))]
        let _ = self.device.poll(wgpu::PollType::Poll);
    }

    /// Stops the thread (when the device's context drops).
    pub(crate) fn shutdown(&self) {
        self.state.shutdown.store(true, Ordering::Release);
        if let Ok(_g) = self.state.lock.lock() {
            self.state.cv.notify_all();
        }
    }
}

/// Resolves when all work submitted before it was created has finished on the
/// device. From [`crate::WgpuBackend::submitted_work_done`].
#[must_use = "futures do nothing unless awaited"]
#[derive(Debug)]
pub struct WorkDone {
    pub(crate) signal: Arc<Signal<()>>,
    pub(crate) ctx: Arc<crate::context::Context>,
    pub(crate) waiting: Option<Waiting>,
}

impl WorkDone {
    /// Whether the work has finished (polls the device once, without blocking).
    pub fn is_done(&mut self) -> bool {
        self.ctx.poller.poke();
        match self.signal.take() {
            Some(()) => {
                // Remember it for a later `await`.
                self.signal.set(());
                true
            }
            None => false,
        }
    }
}

impl Future for WorkDone {
    type Output = compute_core::Result<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        if self.signal.poll(cx.waker()).is_some() {
            self.waiting = None;
            return Poll::Ready(self.ctx.check_alive().and_then(|()| self.ctx.take_uncaptured("submitted_work_done")));
        }
        let this = &mut *self;
        this.ctx.poller.pending(&mut this.waiting, cx)
    }
}
