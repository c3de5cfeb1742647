//! Finds the engines present on this machine: CUDA, then wgpu, then the CPU.
//! A GPU backend that is compiled out (feature off) or finds no device is
//! skipped with its reason; the CPU is always there.
//!
//! GPU devices are opened once per process and shared: the first probe opens
//! them (tens to hundreds of milliseconds), every later probe, `Compute::auto()`
//! and calibration hands out clones of the same handles, so a program that
//! creates many `Compute`s neither pays for nor holds more than one device
//! each. The outcome of that first attempt, success or the error, is kept for
//! the life of the process.

use std::sync::Arc;

use compute_core::{Backend, ComputeError};
use compute_simd::SimdBackend;

use crate::engine::Engine;

/// One engine found, or why it is missing.
pub struct Found {
    /// Which engine.
    pub engine: Engine,
    /// The backend, or why it could not be created.
    pub backend: Result<Arc<dyn Backend>, ComputeError>,
}

/// Typed handles of discovered GPU backends, for their native APIs beyond the
/// `Backend` trait (wgpu: one-submission command batches).
#[derive(Clone, Default)]
pub(crate) struct Native {
    #[cfg(any(feature = "gpu", feature = "gpu-wasm"))]
    pub(crate) wgpu: Option<compute_wgpu::WgpuBackend>,
}

impl Native {
    /// Forgets the typed handle of `engine` (when a user replaces that engine).
    pub(crate) fn forget(&mut self, engine: Engine) {
        #[cfg(any(feature = "gpu", feature = "gpu-wasm"))]
        if engine == Engine::Wgpu {
            self.wgpu = None;
        }
        let _ = engine;
    }
}

impl std::fmt::Debug for Found {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.backend {
            Ok(b) => write!(f, "{}: {}", self.engine, b.device_name()),
            Err(e) => write!(f, "{}: unavailable ({e})", self.engine),
        }
    }
}

/// Tries every engine in preference order (CUDA, wgpu, CPU on all threads,
/// CPU on one thread) and reports each. The first call opens the GPU devices
/// (tens to hundreds of milliseconds); later calls share them and cost
/// microseconds, as the CPU ones always do.
pub fn probe() -> Vec<Found> {
    probe_native().0
}

/// [`probe`], also returning the typed GPU handles.
pub(crate) fn probe_native() -> (Vec<Found>, Native) {
    // The two GPU devices open at the same time (each takes tens to hundreds
    // of milliseconds, mostly in its driver), one after the other in the browser.
    let (cuda, wgpu) = open_gpus();
    found_with(cuda, wgpu)
}

/// Tries every engine as [`probe`] does, opening the wgpu device without
/// blocking ([`compute_wgpu::WgpuBackend::new_async`]): the way to find the
/// browser's WebGPU, where [`probe`] can report only a device opened before.
/// The first call opens the device (tens to hundreds of milliseconds, spent
/// awaiting the browser or driver); later calls, sync or async, share it.
pub async fn probe_async() -> Vec<Found> {
    probe_native_async().await.0
}

/// [`probe_async`], also returning the typed GPU handles.
pub(crate) async fn probe_native_async() -> (Vec<Found>, Native) {
    let cuda = cuda();
    let wgpu = wgpu_async().await;
    found_with(cuda, wgpu)
}

/// The engines' reports from the outcomes of opening the GPUs, plus the CPU engines.
fn found_with(cuda: Result<Arc<dyn Backend>, ComputeError>, wgpu: WgpuOpened) -> (Vec<Found>, Native) {
    #[cfg(any(feature = "gpu", feature = "gpu-wasm"))]
    let (wgpu, native) = match wgpu {
        Ok(w) => (Ok(Arc::new(w.clone()) as Arc<dyn Backend>), Native { wgpu: Some(w) }),
        Err(e) => (Err(e), Native::default()),
    };
    #[cfg(not(any(feature = "gpu", feature = "gpu-wasm")))]
    let native = Native::default();
    let mut found = vec![Found { engine: Engine::Cuda, backend: cuda }, Found { engine: Engine::Wgpu, backend: wgpu }];
    found.extend(cpu_found());
    (found, native)
}

/// The outcome of opening the CUDA device, and of opening the wgpu one.
type Opened = (Result<Arc<dyn Backend>, ComputeError>, WgpuOpened);

#[cfg(any(feature = "gpu", feature = "gpu-wasm"))]
type WgpuOpened = Result<compute_wgpu::WgpuBackend, ComputeError>;
#[cfg(not(any(feature = "gpu", feature = "gpu-wasm")))]
type WgpuOpened = Result<Arc<dyn Backend>, ComputeError>;

/// Opens (or, after the first call, hands out) the CUDA and wgpu devices,
/// on two threads where there are threads: the first probe then takes as long
/// as the slower driver, not both. Later calls only read the kept outcomes.
fn open_gpus() -> Opened {
    static OPENED: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    if cfg!(target_arch = "wasm32") || OPENED.get().is_some() {
        return (cuda(), wgpu());
    }
    let opened = std::thread::scope(|scope| {
        let opening = scope.spawn(cuda);
        let wgpu = wgpu();
        let cuda = opening.join().unwrap_or_else(|_| {
            Err(ComputeError::DeviceUnavailable {
                backend: compute_core::BackendKind::Cuda,
                reason: "the thread opening the device panicked".into(),
            })
        });
        (cuda, wgpu)
    });
    let _ = OPENED.set(());
    opened
}

/// An engine and its backend.
pub type EngineBackend = (Engine, Arc<dyn Backend>);

/// The engines that are present, in preference order.
pub fn available() -> Vec<EngineBackend> {
    available_native().0
}

/// [`available`], also returning the typed GPU handles.
pub(crate) fn available_native() -> (Vec<EngineBackend>, Native) {
    present(probe_native())
}

/// The engines that are present, opening the wgpu device without blocking
/// (see [`probe_async`]).
pub async fn available_async() -> Vec<EngineBackend> {
    available_native_async().await.0
}

/// [`available_async`], also returning the typed GPU handles.
pub(crate) async fn available_native_async() -> (Vec<EngineBackend>, Native) {
    present(probe_native_async().await)
}

fn present((found, native): (Vec<Found>, Native)) -> (Vec<EngineBackend>, Native) {
    (found.into_iter().filter_map(|f| f.backend.ok().map(|b| (f.engine, b))).collect(), native)
}

/// The CPU engines only (all threads, one thread); opens no GPU.
pub fn cpu() -> Vec<(Engine, Arc<dyn Backend>)> {
    cpu_found().into_iter().filter_map(|f| f.backend.ok().map(|b| (f.engine, b))).collect()
}

/// The two CPU engines, each found or with the reason it is missing.
fn cpu_found() -> Vec<Found> {
    let cpu = SimdBackend::new();
    let threads = cpu.threads();
    // With one hardware thread the single-threaded engine is the same engine.
    let single = if threads > 1 {
        SimdBackend::with_threads(1).map(|b| Arc::new(b) as Arc<dyn Backend>)
    } else {
        Err(ComputeError::DeviceUnavailable {
            backend: compute_core::BackendKind::Simd,
            reason: "one CPU thread: the single-threaded engine would duplicate `simd`".into(),
        })
    };
    vec![
        Found { engine: Engine::Simd, backend: Ok(Arc::new(cpu)) },
        Found { engine: Engine::SimdSingle, backend: single },
    ]
}

#[cfg(feature = "cuda")]
fn cuda() -> Result<Arc<dyn Backend>, ComputeError> {
    static CUDA: std::sync::OnceLock<Result<Arc<dyn Backend>, ComputeError>> = std::sync::OnceLock::new();
    CUDA.get_or_init(|| compute_ptx::CudaBackend::new().map(|b| Arc::new(b) as Arc<dyn Backend>)).clone()
}

#[cfg(not(feature = "cuda"))]
fn cuda() -> Result<Arc<dyn Backend>, ComputeError> {
    Err(ComputeError::DeviceUnavailable {
        backend: compute_core::BackendKind::Cuda,
        reason: "built without the `cuda` feature of `dispatch`".into(),
    })
}

/// The outcome of the first attempt to open the wgpu device, kept for the process.
#[cfg(any(feature = "gpu", feature = "gpu-wasm"))]
static WGPU: std::sync::OnceLock<WgpuOpened> = std::sync::OnceLock::new();

/// Opens the wgpu device once per process, blocking (native).
#[cfg(all(any(feature = "gpu", feature = "gpu-wasm"), not(target_arch = "wasm32")))]
fn wgpu() -> WgpuOpened {
    WGPU.get_or_init(compute_wgpu::WgpuBackend::new).clone()
}

/// In the browser the device opens only asynchronously: the outcome of an
/// earlier [`probe_async`], or unavailable with the reason.
#[cfg(all(any(feature = "gpu", feature = "gpu-wasm"), target_arch = "wasm32"))]
fn wgpu() -> WgpuOpened {
    WGPU.get().cloned().unwrap_or_else(|| {
        Err(ComputeError::DeviceUnavailable {
            backend: compute_core::BackendKind::Wgpu,
            reason: "in the browser WebGPU opens only asynchronously: use `Compute::auto_async` or \
                     `discover::probe_async` first"
                .into(),
        })
    })
}

/// Opens the wgpu device once per process without blocking; shares the
/// outcome with [`wgpu`]. Two first calls racing each open a device and the
/// first to finish is kept.
#[cfg(any(feature = "gpu", feature = "gpu-wasm"))]
async fn wgpu_async() -> WgpuOpened {
    if let Some(known) = WGPU.get() {
        return known.clone();
    }
    let opened = compute_wgpu::WgpuBackend::new_async().await;
    WGPU.get_or_init(|| opened).clone()
}

#[cfg(not(any(feature = "gpu", feature = "gpu-wasm")))]
fn wgpu() -> WgpuOpened {
    Err(ComputeError::DeviceUnavailable {
        backend: compute_core::BackendKind::Wgpu,
        reason: "built without the `gpu` feature of `dispatch`".into(),
    })
}

#[cfg(not(any(feature = "gpu", feature = "gpu-wasm")))]
async fn wgpu_async() -> WgpuOpened {
    wgpu()
}
