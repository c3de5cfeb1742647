//! Test backends: a CPU backend under a GPU's name (optionally failing), and
//! one that holds each call until the test opens a gate.
#![allow(dead_code)]

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use compute_core::{
    Backend, BackendKind, ComputeError, DType, HostSlice, HostSliceMut, Op, PinnedF32, PinnedWords, Result, Tensor,
};
use compute_simd::SimdBackend;
use dispatch::profile::{ClassCurve, EngineProfile, Link, Point};
use dispatch::{Engine, Profile};

/// The CPU backend reporting itself as a GPU family; `fail` makes every host
/// `run` return `DeviceLost` (tensors still work, on host memory). With
/// `pinned`, it has page-locked memory (heap memory, which the trait's
/// default transfers take), and counts the transfers from and to it.
pub struct FakeGpu {
    pub inner: SimdBackend,
    pub kind: BackendKind,
    pub fail: bool,
    pub pinned: bool,
    pub pinned_uploads: AtomicUsize,
    pub pinned_downloads: AtomicUsize,
}

impl FakeGpu {
    pub fn arc(kind: BackendKind, fail: bool) -> Arc<dyn Backend> {
        Arc::new(FakeGpu::new(kind, fail, false))
    }

    pub fn new(kind: BackendKind, fail: bool, pinned: bool) -> FakeGpu {
        let (pinned_uploads, pinned_downloads) = (AtomicUsize::new(0), AtomicUsize::new(0));
        FakeGpu { inner: SimdBackend::new(), kind, fail, pinned, pinned_uploads, pinned_downloads }
    }
}

impl Backend for FakeGpu {
    fn kind(&self) -> BackendKind {
        self.kind
    }
    fn device_name(&self) -> String {
        format!("fake {} over {}", self.kind, self.inner.device_name())
    }
    fn run_typed(&self, op: &Op, inputs: &[HostSlice<'_>], output: HostSliceMut<'_>) -> Result<()> {
        if self.fail {
            return Err(ComputeError::DeviceLost {
                backend: self.kind,
                reason: "test device lost".into(),
                cause: None,
            });
        }
        self.inner.run_typed(op, inputs, output)
    }
    fn upload_typed(&self, data: HostSlice<'_>) -> Result<Tensor> {
        self.inner.upload_typed(data)
    }
    fn alloc_typed(&self, len: usize, dtype: DType) -> Result<Tensor> {
        self.inner.alloc_typed(len, dtype)
    }
    fn download_typed(&self, tensor: &Tensor, out: HostSliceMut<'_>) -> Result<()> {
        self.inner.download_typed(tensor, out)
    }
    fn run_tensors(&self, op: &Op, inputs: &[&Tensor], output: &Tensor) -> Result<()> {
        self.inner.run_tensors(op, inputs, output)
    }
    fn alloc_pinned_words(&self, len: usize) -> Result<Option<PinnedWords>> {
        if self.pinned { PinnedWords::host(len).map(Some) } else { Ok(None) }
    }
    fn alloc_pinned_f32(&self, len: usize) -> Result<Option<PinnedF32>> {
        if self.pinned { PinnedF32::host(len).map(Some) } else { Ok(None) }
    }
    fn upload_pinned_parts(&self, parts: &[(&PinnedWords, Range<usize>)], tensor: &Tensor) -> Result<()> {
        self.pinned_uploads.fetch_add(1, Ordering::Relaxed);
        compute_core::upload_pinned_via_host(self, parts, tensor)
    }
    fn download_pinned(&self, tensors: &[&Tensor], dst: &mut PinnedF32, at: usize) -> Result<()> {
        self.pinned_downloads.fetch_add(1, Ordering::Relaxed);
        compute_core::download_pinned_via_host(self, tensors, dst, at)
    }
}

/// The CPU backend whose host `run` waits for the test to open a gate (one
/// `send(())` per call), recording events in order. Gives up after 60 s with
/// an error, so a test that never opens the gate fails instead of hanging.
pub struct Gated {
    pub inner: SimdBackend,
    /// The family it reports (the CPU's unless made with [`Gated::open_as`]).
    pub kind: BackendKind,
    pub gate: Mutex<Receiver<()>>,
    pub events: Arc<Mutex<Vec<String>>>,
}

impl Gated {
    pub fn open() -> (Arc<Gated>, Sender<()>, Arc<Mutex<Vec<String>>>) {
        Gated::open_as(BackendKind::Simd)
    }

    /// The same reporting itself as `kind` (to stand in for a GPU).
    pub fn open_as(kind: BackendKind) -> (Arc<Gated>, Sender<()>, Arc<Mutex<Vec<String>>>) {
        let (tx, rx) = channel();
        let events = Arc::new(Mutex::new(Vec::new()));
        let gated = Gated { inner: SimdBackend::new(), kind, gate: Mutex::new(rx), events: events.clone() };
        (Arc::new(gated), tx, events)
    }
}

impl Backend for Gated {
    fn kind(&self) -> BackendKind {
        self.kind
    }
    fn device_name(&self) -> String {
        "gated cpu".into()
    }
    fn run_typed(&self, op: &Op, inputs: &[HostSlice<'_>], output: HostSliceMut<'_>) -> Result<()> {
        self.events.lock().unwrap().push(format!("{} waiting", op.name()));
        let opened = self.gate.lock().unwrap().recv_timeout(Duration::from_secs(60));
        if opened.is_err() {
            return Err(ComputeError::Driver {
                op: op.name(),
                backend: BackendKind::Simd,
                message: "gate never opened".into(),
                cause: None,
            });
        }
        self.inner.run_typed(op, inputs, output)?;
        let mut events = self.events.lock().unwrap();
        events.push(format!("{} done", op.name()));
        events.push(format!("{} ran on {}", op.name(), std::thread::current().name().unwrap_or("?")));
        Ok(())
    }
    fn upload_typed(&self, data: HostSlice<'_>) -> Result<Tensor> {
        self.inner.upload_typed(data)
    }
    fn alloc_typed(&self, len: usize, dtype: DType) -> Result<Tensor> {
        self.inner.alloc_typed(len, dtype)
    }
    fn download_typed(&self, tensor: &Tensor, out: HostSliceMut<'_>) -> Result<()> {
        self.inner.download_typed(tensor, out)
    }
    fn run_tensors(&self, op: &Op, inputs: &[&Tensor], output: &Tensor) -> Result<()> {
        self.inner.run_tensors(op, inputs, output)
    }
}

/// A profile where `gpu` is extremely fast at everything, so the model always
/// picks it (`launch` 1 ns, no link cost), and the CPU engines are slow.
pub fn gpu_always_wins(gpu: Engine) -> Profile {
    let fast = |engine: Engine, secs_per_work: f64, launch_s: f64, link: Option<Link>| EngineProfile {
        engine,
        device: format!("synthetic {engine}"),
        launch_s,
        link,
        classes: compute_core::OpClass::ALL
            .iter()
            .map(|&class| ClassCurve {
                class,
                dtype: compute_core::DType::F32,
                points: vec![
                    Point { work: 1.0, seconds: launch_s + secs_per_work },
                    Point { work: 1e9, seconds: launch_s + 1e9 * secs_per_work },
                ],
            })
            .collect(),
    };
    let free = Link::uniform(0.0, 1e18, 1e18);
    Profile {
        format: dispatch::profile::FORMAT,
        key: "synthetic".into(),
        calibrated: false,
        created_unix_s: 0,
        engines: vec![
            fast(gpu, 1e-18, 1e-9, Some(free)),
            fast(Engine::Simd, 1e-9, 1e-6, None),
            fast(Engine::SimdSingle, 1e-9, 1e-6, None),
        ],
        timings: Vec::new(),
    }
}

/// Random data in [-2, 2], never all zeros.
pub fn data(seed: u64, len: usize) -> Vec<f32> {
    compute_core::conformance::rng::Rng::new(seed).vec(len, -2.0, 2.0)
}

/// Panics with the mismatch if `out` is not `op` of `inputs` within the conformance tolerance.
pub fn assert_matches_reference(op: &Op, inputs: &[&[f32]], out: &[f32]) {
    if let Some(msg) = compute_core::conformance::compare(op, inputs, out, 1.0) {
        panic!("{} {}: {msg}", op.name(), op.shapes());
    }
}
