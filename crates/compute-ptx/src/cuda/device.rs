//! One opened GPU: its context, the stream every backend on it shares, its
//! properties, the cache of loaded kernels, and the host-call staging buffer.
//! Opened once per process and device ordinal, then shared.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use compute_core::{BackendKind, ComputeError, Op, Result};
use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{CudaContext, CudaStream};

use super::driver::{self, Function, Staging};
use crate::builder::Target;
use crate::kernels::KernelId;
use crate::kernels::rows::{BLOCK_CACHE_BYTES, RowShape};
use crate::plan::{self, Arg, Grid, Launcher};

/// Floats of the host-call staging buffer (4 MiB): host calls whose inputs and
/// output fit go through it without allocating.
pub(crate) const STAGING_FLOATS: usize = 1 << 20;

/// An opened device.
#[derive(Debug)]
pub(crate) struct Device {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) ordinal: u32,
    pub(crate) target: Target,
    pub(crate) name: String,
    pub(crate) compute_capability: (i32, i32),
    pub(crate) sm_count: u32,
    kernels: Mutex<HashMap<KernelId, Arc<Function>>>,
    staging: Mutex<Option<Staging>>,
}

fn unavailable(reason: String) -> ComputeError {
    ComputeError::DeviceUnavailable { backend: BackendKind::Cuda, reason }
}

/// Locks a mutex; a poisoned one (a panic elsewhere while held) is still usable
/// here, since every critical section leaves its data consistent.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

static DEVICES: OnceLock<Mutex<HashMap<u32, Arc<Device>>>> = OnceLock::new();

/// Opens device `ordinal` (once per process; later calls share it).
/// `DeviceUnavailable` without the driver library, without a GPU, or below
/// compute capability 8.0.
pub(crate) fn open(ordinal: u32) -> Result<Arc<Device>> {
    if !driver::culib_present() {
        return Err(unavailable("the CUDA driver library (libcuda) is not installed on this machine".into()));
    }
    let mut devices = lock(DEVICES.get_or_init(|| Mutex::new(HashMap::new())));
    if let Some(d) = devices.get(&ordinal) {
        return Ok(d.clone());
    }
    let ctx = CudaContext::new(ordinal as usize)
        .map_err(|e| unavailable(format!("no usable CUDA device {ordinal}: {}", super::error::message(e))))?;
    driver::single_stream(&ctx);
    let stream = ctx.new_stream().map_err(|e| driver::err("open", e))?;
    let cc = ctx.compute_capability().map_err(|e| driver::err("open", e))?;
    let target = Target::for_compute_capability(cc.0, cc.1).ok_or_else(|| {
        unavailable(format!("device {ordinal} has compute capability {}.{}; 8.0+ needed", cc.0, cc.1))
    })?;
    let name = ctx.name().map_err(|e| driver::err("open", e))?;
    let sm_count = driver::attribute(&ctx, CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?.max(1) as u32;
    driver::keep_pool_memory(&ctx);
    let d = Arc::new(Device {
        ctx,
        stream,
        ordinal,
        target,
        name,
        compute_capability: cc,
        sm_count,
        kernels: Mutex::new(HashMap::new()),
        staging: Mutex::new(None),
    });
    devices.insert(ordinal, d.clone());
    Ok(d)
}

impl Device {
    /// The loaded kernel `id`: generated and JIT-compiled on first use (a few
    /// milliseconds), then cached for the life of the process.
    pub(crate) fn function(&self, id: KernelId) -> Result<Arc<Function>> {
        if let Some(f) = lock(&self.kernels).get(&id) {
            return Ok(f.clone());
        }
        let kernel = id.build(id.target_on(self.target)).map_err(|e| ComputeError::Compile {
            backend: BackendKind::Cuda,
            kernel: e.kernel.clone(),
            message: e.to_string(),
        })?;
        let smem = match id {
            KernelId::Rows(_, RowShape::Block, _) => Some(BLOCK_CACHE_BYTES),
            KernelId::GemmSimt(cfg, ..) if cfg.dynamic_shared_bytes() > 0 => Some(cfg.dynamic_shared_bytes()),
            KernelId::GemmMma(cfg, ..) if cfg.dynamic_shared_bytes() > 0 => Some(cfg.dynamic_shared_bytes()),
            KernelId::GemmWgmma(cfg, ..) => Some(cfg.dynamic_shared_bytes()),
            KernelId::GemmTma(cfg, ..) => Some(cfg.dynamic_shared_bytes()),
            KernelId::AttentionFlash(cfg, d) | KernelId::AttentionFlashSplit(cfg, d) => Some(cfg.shared_bytes(d)),
            KernelId::AttentionWgmma(cfg, _) => Some(cfg.shared_bytes()),
            _ => None,
        };
        let f = Arc::new(driver::load(&self.ctx, &kernel, smem)?);
        // Another thread may have loaded it meanwhile: keep the first (it may
        // already be queued); ours, never launched, is unloaded on drop.
        Ok(lock(&self.kernels).entry(id).or_insert(f).clone())
    }

    /// The kernels that `ops` launch and that are not loaded yet, each once:
    /// one dry run of each op's plan. Ops with invalid shapes, and ops of
    /// dtypes the plans decline ([`plan::supported`]), are skipped.
    pub(crate) fn missing_kernels(&self, ops: &[&Op]) -> Result<Vec<KernelId>> {
        let recorder = Recorder { sm_count: self.sm_count, wgmma: self.has_wgmma(), ids: Mutex::new(Vec::new()) };
        for op in ops.iter().filter(|op| plan::supported(op)) {
            let Ok(layout) = op.layout() else { continue };
            let ins = vec![0u64; layout.inputs().len()];
            plan::run_op(&recorder, op, &ins, 0)?;
        }
        let mut ids = recorder.ids.into_inner().unwrap_or_else(|p| p.into_inner());
        let loaded = lock(&self.kernels);
        let mut seen = std::collections::HashSet::new();
        ids.retain(|id| !loaded.contains_key(id) && seen.insert(*id));
        Ok(ids)
    }

    /// Loads every kernel that `ops` launch and that is not loaded yet, one
    /// after the other. Costs the JIT of the missing kernels (a fresh machine
    /// has no compiled copy cached). Compiling on 8 threads was tried: on the
    /// H200 machine (driver 580) it took 0.52–0.64 s for the calibration
    /// ladders' kernels, about what compiling them one by one had cost, so
    /// that driver seems to compile one module at a time.
    pub(crate) fn load_all(&self, ops: &[&Op]) -> Result<()> {
        self.missing_kernels(ops)?.into_iter().try_for_each(|id| self.function(id).map(drop))
    }

    /// Runs `f` with the staging buffer (allocated on first use), holding it
    /// for the duration. `f` must synchronise before returning (it does: the
    /// staged output is read back synchronously).
    pub(crate) fn with_staging<R>(&self, f: impl FnOnce(&mut Staging) -> Result<R>) -> Result<R> {
        let mut guard = lock(&self.staging);
        if guard.is_none() {
            *guard = Some(Staging::new(&self.ctx, &self.stream, STAGING_FLOATS)?);
        }
        match guard.as_mut() {
            Some(s) => {
                let r = f(s);
                if r.is_err() {
                    // Whatever failed, leave nothing in flight on the staging memory.
                    let _ = self.stream.synchronize();
                }
                r
            }
            None => Err(unavailable("staging buffer".into())),
        }
    }

    /// A temporary device buffer (stream-ordered free on drop).
    pub(crate) fn temp(&self, bytes: usize, op: &'static str) -> Result<super::buffer::DeviceAlloc> {
        let (slice, ptr) = driver::alloc(&self.stream, bytes, op)?;
        Ok(super::buffer::DeviceAlloc::new(slice, ptr, bytes.max(4), self.ordinal))
    }

    /// Waits for all queued work.
    pub(crate) fn synchronize(&self, op: &'static str) -> Result<()> {
        self.stream.synchronize().map_err(|e| driver::err(op, e))
    }
}

/// A [`Launcher`] that only notes which kernels a plan would launch.
struct Recorder {
    sm_count: u32,
    wgmma: bool,
    ids: Mutex<Vec<KernelId>>,
}

impl Launcher for Recorder {
    fn sm_count(&self) -> u32 {
        self.sm_count
    }

    fn has_wgmma(&self) -> bool {
        self.wgmma
    }

    fn has_tma(&self) -> bool {
        self.wgmma
    }

    fn launch(&self, id: KernelId, _grid: Grid, _args: &[Arg]) -> Result<()> {
        lock(&self.ids).push(id);
        Ok(())
    }

    fn temp(&self, _bytes: usize, _op: &'static str) -> Result<(Box<dyn std::any::Any>, u64)> {
        Ok((Box::new(()), 0))
    }

    fn copy(&self, _dst: u64, _src: u64, _bytes: usize, _op: &'static str) -> Result<()> {
        Ok(())
    }
}

impl Launcher for Device {
    fn sm_count(&self) -> u32 {
        self.sm_count
    }

    fn has_wgmma(&self) -> bool {
        Target::has_wgmma(self.compute_capability.0, self.compute_capability.1)
    }

    fn has_tma(&self) -> bool {
        self.has_wgmma()
    }

    fn launch(&self, id: KernelId, grid: Grid, args: &[Arg]) -> Result<()> {
        let f = self.function(id)?;
        driver::launch(&self.stream, &f, grid, args)
    }

    fn temp(&self, bytes: usize, op: &'static str) -> Result<(Box<dyn std::any::Any>, u64)> {
        let a = Device::temp(self, bytes, op)?;
        let p = a.device_ptr();
        Ok((Box::new(a), p))
    }

    fn copy(&self, dst: u64, src: u64, bytes: usize, op: &'static str) -> Result<()> {
        driver::dtod(&self.stream, dst, src, bytes, op)
    }
}
