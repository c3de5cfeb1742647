//! [`CudaBackend`]: the op vocabulary on NVIDIA GPUs, from the generated PTX,
//! through the CUDA driver (`cudarc`, loaded at run time).
//!
//! Nothing here needs the CUDA toolkit; at run time only the driver library.
//! Without it, or without a GPU, [`CudaBackend::new`] returns
//! [`ComputeError::DeviceUnavailable`] (it never panics), so a program built
//! with the `cuda` feature runs unchanged on any machine.
//!
//! Kernels are generated for the device's target (sm_90 on Hopper, sm_80 on
//! Ampere), JIT-compiled by the driver on first use and cached per device for
//! the life of the process. All backends on one device share its context and
//! one stream, so device tensors can move freely between them.

mod buffer;
mod device;
mod driver;
mod error;
mod graph;
#[cfg(feature = "nccl")]
pub mod nccl;
#[cfg(feature = "nccl")]
mod nccl_sys;
mod peer;

use std::ops::Range;
use std::sync::Arc;

use compute_core::{
    Backend, BackendKind, ComputeError, DType, HostSlice, HostSliceMut, Location, MatmulSpec, Op, PinnedF32,
    PinnedWords, Recording, Result, Tensor, check_download, check_host_call, check_pinned_download, check_pinned_parts,
    check_tensor_call, check_upload,
};

pub use crate::plan::GemmTier;
pub use buffer::{Completion, CudaBuffer, DeviceAlloc};

use crate::plan;
use device::Device;

/// What [`probe`] and [`CudaBackend::info`] report about a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device ordinal.
    pub ordinal: u32,
    /// Marketing name, e.g. `NVIDIA H200`.
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// Streaming multiprocessors.
    pub multiprocessors: u32,
    /// Free device memory in bytes, at the time of the query.
    pub memory_free: u64,
    /// Total device memory in bytes.
    pub memory_total: u64,
    /// Driver CUDA version, e.g. `(13, 0)`.
    pub driver_version: (i32, i32),
    /// The PTX target kernels are emitted for.
    pub target: crate::Target,
}

/// Opens device `ordinal` and describes it; `DeviceUnavailable` without a driver or GPU.
pub fn probe(ordinal: u32) -> Result<DeviceInfo> {
    let dev = device::open(ordinal)?;
    info_of(&dev)
}

fn info_of(dev: &Device) -> Result<DeviceInfo> {
    let (free, total) = dev.ctx.mem_get_info().map_err(|e| driver::err("device_info", e))?;
    let v = driver::driver_version()?;
    Ok(DeviceInfo {
        ordinal: dev.ordinal,
        name: dev.name.clone(),
        compute_capability: dev.compute_capability,
        multiprocessors: dev.sm_count,
        memory_free: free as u64,
        memory_total: total as u64,
        driver_version: (v / 1000, (v % 1000) / 10),
        target: dev.target,
    })
}

/// The CUDA backend: every op of the vocabulary on one NVIDIA GPU.
///
/// Host calls ([`Backend::run_typed`], [`Backend::run`]) copy in, launch and
/// copy out; inputs and output of up to 4 MiB together go through a pinned
/// staging buffer in one transfer each way, larger ones through fresh device
/// buffers. Tensor calls ([`Backend::run_tensors`]) only queue kernels and
/// return; [`Backend::download`] and [`Backend::synchronize`] wait. Cheap to clone.
///
/// Dtypes: every op runs on `f32`, `f16` and `bf16` data. Element-wise ops,
/// reductions, row ops and casts have a kernel per dtype that widens halves
/// to `f32` as it loads them and rounds once as it stores; a half matmul runs
/// on tensor cores (`f32` accumulation) when each operand's contiguous
/// dimension is a multiple of 8 and `n` is even — `wgmma` on compute
/// capability 9.0, `mma.sync` otherwise — else (and for conv2d) it
/// widens the operands into `f32` temporaries and runs the `f32` GEMM; a TF32
/// `A·Bᵀ` matmul runs on `wgmma` on compute capability 9.0, other TF32
/// matmuls in full precision. Host calls of every dtype use the pinned
/// staging buffer when they fit in it.
#[derive(Clone, Debug)]
pub struct CudaBackend {
    dev: Arc<Device>,
}

impl CudaBackend {
    /// The first GPU. `DeviceUnavailable` when the driver library or a GPU of
    /// compute capability 8.0+ is missing. First call per process: context
    /// creation (tens to hundreds of milliseconds); later calls share it.
    pub fn new() -> Result<Self> {
        Self::with_device(0)
    }

    /// GPU number `ordinal`.
    pub fn with_device(ordinal: u32) -> Result<Self> {
        Ok(CudaBackend { dev: device::open(ordinal)? })
    }

    /// Where this backend's tensors live.
    pub fn location(&self) -> Location {
        Location { backend: BackendKind::Cuda, device: self.dev.ordinal }
    }

    /// Name, compute capability, multiprocessors, memory and driver version.
    pub fn info(&self) -> Result<DeviceInfo> {
        info_of(&self.dev)
    }

    /// Whether every kernel that `ops` launch is compiled and loaded already
    /// (see [`Backend::prepare`]), so their first calls pay no JIT. One dry
    /// run of each op's plan.
    pub fn is_prepared(&self, ops: &[Op]) -> Result<bool> {
        let ops: Vec<&Op> = ops.iter().collect();
        Ok(self.dev.missing_kernels(&ops)?.is_empty())
    }

    /// The PTX target this device's kernels are generated for.
    pub fn target(&self) -> crate::Target {
        self.dev.target
    }

    /// Allocates `bytes` of device memory from the driver's stream-ordered pool
    /// (microseconds once the pool is warm). The raw unit of a buffer pool.
    pub fn alloc_bytes(&self, bytes: usize) -> Result<Arc<DeviceAlloc>> {
        let (slice, ptr) = driver::alloc(&self.dev.stream, bytes, "alloc")?;
        Ok(Arc::new(DeviceAlloc::new(slice, ptr, bytes.max(4), self.dev.ordinal)))
    }

    /// A tensor of `len` floats over the start of `alloc` (which must be of this
    /// device and hold `4·len` bytes). The tensor keeps `alloc` alive.
    pub fn tensor_in(&self, alloc: Arc<DeviceAlloc>, len: usize) -> Result<Tensor> {
        self.tensor_in_typed(alloc, len, DType::F32)
    }

    /// A tensor of `len` elements of `dtype` over the start of `alloc` (which
    /// must be of this device and hold `len` times the dtype's size in bytes).
    /// The tensor keeps `alloc` alive. Free.
    pub fn tensor_in_typed(&self, alloc: Arc<DeviceAlloc>, len: usize, dtype: DType) -> Result<Tensor> {
        if alloc.ordinal() != self.dev.ordinal {
            return Err(ComputeError::WrongDevice {
                op: "tensor_in",
                expected: self.location().to_string(),
                found: format!("cuda:{}", alloc.ordinal()),
            });
        }
        // Block dtypes hold whole blocks: `bytes_for` is `None` otherwise.
        let need = dtype.bytes_for(len).map_or(u64::MAX, |b| b);
        if need > alloc.bytes() as u64 {
            return Err(ComputeError::shape(
                "tensor_in",
                format!("{len} {dtype} values need {need} bytes, the allocation has {}", alloc.bytes()),
                format!("x=[{len}] {dtype}"),
            ));
        }
        Ok(Tensor::from_storage(Arc::new(CudaBuffer::new(alloc, len, dtype))))
    }

    /// Marks the current end of the device queue; poll the result to learn when
    /// everything queued so far (e.g. a [`Backend::run_tensors`]) has finished.
    pub fn record_completion(&self) -> Result<Completion> {
        let ev = self.dev.stream.record_event(None).map_err(|e| driver::err("record_completion", e))?;
        Ok(Completion::new(ev))
    }

    /// [`CudaBackend::record_completion`] with a timestamp, for
    /// [`Completion::seconds_since`]: the device time of the work queued
    /// between two such points (benchmarks of kernels too short to time from
    /// the host). Costs one event record.
    pub fn record_timestamp(&self) -> Result<Completion> {
        let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let ev = self.dev.stream.record_event(flags).map_err(|e| driver::err("record_timestamp", e))?;
        Ok(Completion::new(ev))
    }

    /// Runs a matrix product of device tensors with a chosen GEMM tier (the
    /// tiers agree within the matmul tolerance; this exists for tests, tuning
    /// and benchmarks): the `f32` tiers take `f32` tensors, [`GemmTier::Mma`]
    /// half inputs of a shape [`crate::plan::mma_fits`] accepts; other
    /// combinations are `UnsupportedDType` or `Shape` here and run through
    /// [`Backend::run_tensors`]. Queued, like `run_tensors`.
    pub fn matmul_tier(&self, tier: GemmTier, spec: MatmulSpec, a: &Tensor, b: &Tensor, c: &Tensor) -> Result<()> {
        let op = Op::Matmul(spec);
        check_tensor_call(&op, self.location(), &[a, b], c)?;
        if let GemmTier::Simt(cfg) | GemmTier::SimtSplit(cfg, _) = tier {
            cfg.check().map_err(|e| ComputeError::Compile {
                backend: BackendKind::Cuda,
                kernel: cfg.kernel_name(spec.trans_a, spec.trans_b),
                message: e,
            })?;
        }
        if let GemmTier::Mma(cfg) = tier {
            cfg.check(self.target()).map_err(|e| ComputeError::Compile {
                backend: BackendKind::Cuda,
                kernel: cfg.kernel_name(spec.dtype, spec.out_dtype, spec.trans_a, spec.trans_b),
                message: e,
            })?;
        }
        if let GemmTier::Wgmma(cfg) = tier {
            cfg.check().map_err(|e| ComputeError::Compile {
                backend: BackendKind::Cuda,
                kernel: cfg.kernel_name(spec.dtype, spec.out_dtype, spec.trans_a, spec.trans_b),
                message: e,
            })?;
        }
        let (pa, pb, pc) = (self.ptr(a, &op)?, self.ptr(b, &op)?, self.ptr(c, &op)?);
        plan::run_matmul(&*self.dev, tier, &spec, (pa, pb, pc), None)
    }

    /// Runs fused attention of device tensors with the tensor-core kernel of
    /// shape `flash` for half data (for tuning and benchmarks; every shape
    /// that builds gives the same result within the tolerance), as
    /// [`Backend::run_tensors`] does otherwise. A shape that cannot be built
    /// is a `Compile` error. Queued, like `run_tensors`.
    pub fn attention_with(
        &self,
        spec: compute_core::AttentionSpec,
        kernel: Option<plan::AttentionKernel>,
        (q, k, v): (&Tensor, &Tensor, &Tensor),
        o: &Tensor,
    ) -> Result<()> {
        let op = Op::Attention(spec);
        check_tensor_call(&op, self.location(), &[q, k, v], o)?;
        let checked = match kernel {
            Some(plan::AttentionKernel::Flash(cfg)) => cfg.check().map_err(|e| (cfg.kernel_name(spec.dtype), e)),
            Some(plan::AttentionKernel::Hopper(cfg)) => {
                let cc = self.info()?.compute_capability;
                let device = if crate::Target::has_wgmma(cc.0, cc.1) {
                    Ok(())
                } else {
                    Err(format!("needs compute capability 9.0, not {}.{}", cc.0, cc.1))
                };
                cfg.check().and(device).map_err(|e| (cfg.kernel_name(spec.dtype), e))
            }
            None => Ok(()),
        };
        checked.map_err(|(kernel, message)| ComputeError::Compile { backend: BackendKind::Cuda, kernel, message })?;
        let (pq, pk, pv, po) = (self.ptr(q, &op)?, self.ptr(k, &op)?, self.ptr(v, &op)?, self.ptr(o, &op)?);
        plan::run_attention(&*self.dev, &spec, kernel, (pq, pk, pv, po))
    }

    /// This device as a plan [`Launcher`](plan::Launcher), for the
    /// plan functions that take device addresses (e.g.
    /// [`plan::run_quant_matmul`] on [`DeviceAlloc::device_ptr`]s): what
    /// they queue runs on this backend's stream, in order with its other
    /// work. Free.
    pub fn launcher(&self) -> &dyn plan::Launcher {
        &*self.dev
    }

    /// Device-to-device copy of `src` into `dst` (equal lengths and dtypes), queued.
    pub fn copy(&self, src: &Tensor, dst: &Tensor) -> Result<()> {
        let op = Op::unary(compute_core::UnaryOp::Scale { s: 1.0 }, src.len().max(1));
        let shapes = || format!("src=[{}] {} dst=[{}] {}", src.len(), src.dtype(), dst.len(), dst.dtype());
        if src.len() != dst.len() {
            return Err(ComputeError::shape("copy", "lengths differ", shapes()));
        }
        if src.dtype() != dst.dtype() {
            return Err(ComputeError::DType { op: "copy", detail: "dtypes differ".into(), shapes: shapes() });
        }
        let (s, d) = (self.ptr(src, &op)?, self.ptr(dst, &op)?);
        driver::dtod(&self.dev.stream, d, s, tensor_bytes("copy", src.len(), src.dtype())?, "copy")
    }

    fn buffer<'t>(&self, t: &'t Tensor, op: &Op) -> Result<&'t CudaBuffer> {
        t.storage::<CudaBuffer>().filter(|b| b.allocation().ordinal() == self.dev.ordinal).ok_or_else(|| {
            ComputeError::WrongDevice {
                op: op.name(),
                expected: self.location().to_string(),
                found: t.location().to_string(),
            }
        })
    }

    fn ptr(&self, t: &Tensor, op: &Op) -> Result<u64> {
        Ok(self.buffer(t, op)?.device_ptr())
    }

    /// Host path through device buffers allocated for this call, any dtype
    /// (the views' bytes).
    fn run_allocated(&self, op: &Op, inputs: &[&[u8]], output: &mut [u8]) -> Result<()> {
        let name = op.name();
        let mut keep = Vec::new();
        let mut ptrs = Vec::new();
        for x in inputs {
            let (slice, p) = driver::alloc(&self.dev.stream, x.len(), name)?;
            driver::htod(&self.dev.stream, p, x, name)?;
            keep.push(slice);
            ptrs.push(p);
        }
        let (out_slice, out_ptr) = driver::alloc(&self.dev.stream, output.len(), name)?;
        // A strided copy writes only its view: the rest keeps the output's values.
        if op.writes_part_of_output() {
            driver::htod(&self.dev.stream, out_ptr, output, name)?;
        }
        plan::run_op(&*self.dev, op, &ptrs, out_ptr)?;
        // Kernel faults surface here, before anything touches `output`; the
        // result lands in a temporary first so a failed copy writes nothing.
        self.dev.synchronize(name)?;
        let mut tmp = vec![0u8; output.len()];
        driver::dtoh_sync(&self.dev.stream, &mut tmp, out_ptr, name)?;
        output.copy_from_slice(&tmp);
        drop(out_slice);
        drop(keep);
        Ok(())
    }

    /// Host path through the pinned staging buffer: one copy in, one copy
    /// out, for operands of any dtype (as bytes) that fit in it together.
    fn run_staged(&self, op: &Op, inputs: &[&[u8]], output: &mut [u8]) -> Result<bool> {
        // Each operand starts on a 256-byte boundary (a whole number of floats).
        let floats = |bytes: usize| bytes.div_ceil(256) * 64;
        let mut offsets = Vec::new();
        let mut end = 0;
        for x in inputs {
            offsets.push(end);
            end += floats(x.len());
        }
        let out_off = end;
        if out_off + floats(output.len()) > device::STAGING_FLOATS {
            return Ok(false);
        }
        let dev = &self.dev;
        dev.with_staging(|st| {
            if out_off + floats(output.len()) > st.floats() {
                return Ok(false);
            }
            let initial = op.writes_part_of_output().then(|| output.to_vec());
            let mut parts: Vec<(usize, &[u8])> = offsets.iter().copied().zip(inputs.iter().copied()).collect();
            let mut end = out_off;
            if let Some(bytes) = &initial {
                parts.push((out_off, bytes));
                end = out_off + floats(bytes.len());
            }
            st.stage_in(&dev.stream, &parts, end)?;
            let ptrs: Vec<u64> = offsets.iter().map(|&o| st.device_at(o)).collect();
            plan::run_op(&**dev, op, &ptrs, st.device_at(out_off))?;
            st.stage_out(&dev.stream, out_off, output)?;
            Ok(true)
        })
    }
}

/// The async names of every op (`relu_async`, `matmul_async`…): a host call on
/// CUDA waits for its copy back, so each future runs the op at its first poll
/// and is ready at once.
impl compute_core::AsyncOps for CudaBackend {}

impl Backend for CudaBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn device_name(&self) -> String {
        format!("{} (cuda:{}, {})", self.dev.name, self.dev.ordinal, self.dev.target)
    }

    /// Every op on `f32`, `f16` and `bf16` (see [`CudaBackend`]); a TF32
    /// matmul runs in full precision.
    fn supports(&self, op: &Op) -> bool {
        plan::supported(op)
    }

    /// Validates lengths and dtypes, refuses dtypes the kernels lack
    /// ([`ComputeError::UnsupportedDType`]), then copies in, launches and
    /// copies out (operands of up to 4 MiB together, of any dtype, through the
    /// pinned staging buffer).
    fn run_typed(&self, op: &Op, inputs: &[HostSlice<'_>], mut output: HostSliceMut<'_>) -> Result<()> {
        check_host_call(op, inputs, &output)?;
        if !plan::supported(op) {
            return Err(plan::unsupported_dtype(op));
        }
        let ins: Vec<&[u8]> = inputs.iter().map(|x| x.as_bytes()).collect();
        if self.run_staged(op, &ins, output.as_bytes_mut())? {
            return Ok(());
        }
        self.run_allocated(op, &ins, output.as_bytes_mut())
    }

    /// A new tensor of the data's dtype, its bytes copied as they are.
    fn upload_typed(&self, data: HostSlice<'_>) -> Result<Tensor> {
        let alloc = self.alloc_bytes(data.as_bytes().len())?;
        driver::htod(&self.dev.stream, alloc.device_ptr(), data.as_bytes(), "upload")?;
        self.tensor_in_typed(alloc, data.len(), data.dtype())
    }

    /// Copies `data` straight into the tensor's device memory, queued on the
    /// device's stream (the host data has been consumed when this returns).
    fn upload_into(&self, data: HostSlice<'_>, tensor: &Tensor) -> Result<()> {
        check_upload(&data, tensor)?;
        let op = Op::unary(compute_core::UnaryOp::Relu, data.len().max(1));
        let dst = self.ptr(tensor, &op)?;
        driver::htod(&self.dev.stream, dst, data.as_bytes(), "upload_into")
    }

    /// Gathers the parts into the pinned staging buffer and copies them to the
    /// tensor in one transfer when they fit in it (4 MiB), waiting for that
    /// transfer (and the work queued before it); larger uploads concatenate
    /// the parts on the host and copy them as [`Backend::upload_into`] does.
    fn upload_parts_into(&self, parts: &[HostSlice<'_>], tensor: &Tensor) -> Result<()> {
        compute_core::check_parts(parts, tensor)?;
        let op = Op::unary(compute_core::UnaryOp::Relu, tensor.len().max(1));
        let dst = self.ptr(tensor, &op)?;
        let bytes: Vec<&[u8]> = parts.iter().map(|p| p.as_bytes()).collect();
        let total: usize = bytes.iter().map(|b| b.len()).sum();
        if total <= 4 * device::STAGING_FLOATS {
            return self.dev.with_staging(|st| st.stage_to(&self.dev.stream, &bytes, dst));
        }
        let all: Vec<u8> = bytes.concat();
        driver::htod(&self.dev.stream, dst, &all, "upload_parts_into")
    }

    /// Zeroed page-locked words of this device's context (one driver
    /// allocation, about a millisecond for a few MiB), which
    /// [`Backend::upload_pinned_parts`] copies from without waiting.
    fn alloc_pinned_words(&self, len: usize) -> Result<Option<PinnedWords>> {
        let mem = driver::PinnedWordsMem::new(&self.dev.ctx, &self.dev.stream, len)?;
        Ok(Some(PinnedWords::from_memory(Box::new(mem))))
    }

    /// Zeroed page-locked `f32` values (one driver allocation), which
    /// [`Backend::download_pinned`] copies into without a host copy.
    fn alloc_pinned_f32(&self, len: usize) -> Result<Option<PinnedF32>> {
        Ok(Some(PinnedF32::from_memory(Box::new(driver::PinnedF32Mem::new(&self.dev.ctx, len)?))))
    }

    /// Queues one asynchronous copy per part when every part is page-locked
    /// memory of this device ([`Backend::alloc_pinned_words`]); otherwise
    /// gathers the words on the host and copies them as
    /// [`Backend::upload_into`] does (consumed when this returns).
    fn upload_pinned_parts(&self, parts: &[(&PinnedWords, Range<usize>)], tensor: &Tensor) -> Result<()> {
        check_pinned_parts(parts, tensor)?;
        let op = Op::unary(compute_core::UnaryOp::Relu, tensor.len().max(1));
        let dst = self.ptr(tensor, &op)?;
        let stream = &self.dev.stream;
        let ours = |b: &PinnedWords| b.memory::<driver::PinnedWordsMem>().is_some_and(|m| m.is_for(stream));
        if !parts.iter().all(|(b, _)| ours(b)) {
            return compute_core::upload_pinned_via_host(self, parts, tensor);
        }
        let mut at = dst;
        for (b, r) in parts {
            let words = b.words().get(r.clone()).unwrap_or_default();
            driver::htod_words(stream, at, words, "upload_pinned_parts")?;
            at += 4 * words.len() as u64;
        }
        Ok(())
    }

    /// Queues a copy of each tensor straight into `dst` (page-locked memory
    /// from [`Backend::alloc_pinned_f32`] takes it without a host copy; other
    /// memory through the driver's), then waits once for everything queued.
    fn download_pinned(&self, tensors: &[&Tensor], dst: &mut PinnedF32, at: usize) -> Result<()> {
        check_pinned_download(tensors, dst, at)?;
        let op = Op::unary(compute_core::UnaryOp::Relu, dst.len().max(1));
        let srcs = tensors.iter().map(|t| self.ptr(t, &op)).collect::<Result<Vec<u64>>>()?;
        let out = dst.as_mut_slice();
        let mut start = at;
        let mut queued = Ok(());
        for (t, src) in tensors.iter().zip(srcs) {
            let part = out.get_mut(start..start + t.len()).unwrap_or_default();
            queued = driver::dtoh_async(&self.dev.stream, part, src, "download_pinned");
            if queued.is_err() {
                break;
            }
            start += t.len();
        }
        // Waits even after a failure, so that no copy into `dst` is left in flight.
        let waited = self.dev.synchronize("download_pinned");
        queued.and(waited)
    }

    /// Captures the calls `body` queues as a CUDA graph (one launch per
    /// replay). The device's stream is shared: calls that other threads queue
    /// on this device while `body` runs join the recording, so record from
    /// one thread at a time.
    fn record(&self, body: &mut dyn FnMut() -> Result<()>) -> Result<Option<Box<dyn Recording>>> {
        Ok(Some(Box::new(graph::record(&self.dev, body)?)))
    }

    /// A tensor of `len` elements of `dtype` (contents unspecified), any dtype.
    fn alloc_typed(&self, len: usize, dtype: DType) -> Result<Tensor> {
        let bytes = tensor_bytes("alloc", len, dtype)?;
        let alloc = self.alloc_bytes(bytes)?;
        self.tensor_in_typed(alloc, len, dtype)
    }

    /// Waits for the queued work, then copies the tensor out (through the
    /// pinned staging buffer when it fits, 4 MiB).
    fn download_typed(&self, tensor: &Tensor, mut out: HostSliceMut<'_>) -> Result<()> {
        check_download(tensor, &out)?;
        let op = Op::unary(compute_core::UnaryOp::Relu, out.len().max(1));
        let src = self.ptr(tensor, &op)?;
        // Queued work (and its faults) first, before anything touches `out`.
        self.dev.synchronize("download")?;
        let out = out.as_bytes_mut();
        if out.len() <= 4 * device::STAGING_FLOATS {
            return self.dev.with_staging(|st| st.fetch(&self.dev.stream, src, out));
        }
        let mut tmp = vec![0u8; out.len()];
        driver::dtoh_sync(&self.dev.stream, &mut tmp, src, "download")?;
        out.copy_from_slice(&tmp);
        Ok(())
    }

    fn run_tensors(&self, op: &Op, inputs: &[&Tensor], output: &Tensor) -> Result<()> {
        check_tensor_call(op, self.location(), inputs, output)?;
        if !plan::supported(op) {
            return Err(plan::unsupported_dtype(op));
        }
        let ptrs = inputs.iter().map(|t| self.ptr(t, op)).collect::<Result<Vec<u64>>>()?;
        let out = self.ptr(output, op)?;
        plan::run_op(&*self.dev, op, &ptrs, out)
    }

    fn synchronize(&self) -> Result<()> {
        self.dev.synchronize("synchronize")
    }

    /// JIT-compiles the kernels of `ops` that are not loaded yet (see
    /// [`CudaBackend::is_prepared`]).
    fn prepare(&self, ops: &[Op]) -> Result<()> {
        let ops: Vec<&Op> = ops.iter().filter(|op| self.supports(op)).collect();
        self.dev.load_all(&ops)
    }
}

/// Bytes of `len` values of `dtype` (whole blocks for a block-quantized
/// dtype): a `Shape` error when `len` is not a whole number of blocks, a
/// `LimitExceeded` one when the bytes overflow `usize`. Free.
fn tensor_bytes(op: &'static str, len: usize, dtype: DType) -> Result<usize> {
    let per = dtype.block_values();
    if !len.is_multiple_of(per) {
        let why = format!("{dtype} tensors hold whole blocks of {per} values; got {len}");
        return Err(ComputeError::shape(op, why, format!("x=[{len}] {dtype}")));
    }
    dtype.bytes_for(len).and_then(|b| usize::try_from(b).ok()).ok_or(ComputeError::LimitExceeded {
        op,
        what: "tensor bytes",
        requested: len as u64,
        maximum: (usize::MAX / dtype.size_in_bytes().max(1)) as u64,
    })
}
