//! [`WgpuBackend`]: the wgpu implementation of [`Backend`], and its native and async entry points.

use std::future::Future;
use std::sync::{Arc, OnceLock};

use compute_core::{
    Backend, BackendKind, ComputeError, DType, HostSlice, HostSliceMut, Op, Operand, Result, Tensor, check_download,
    check_host_call, check_tensor_call,
};

use crate::batch::GpuCommandBatch;
use crate::buffers::{BufferRecycler, GpuBuffer, LOCATION, Use, padded_bytes, padded_bytes_of};
use crate::completion::{Signal, WorkDone};
use crate::context::{AdapterReport, Context};
use crate::encode::{self, Readback};
use crate::errors::{self, KIND};
use crate::kernels::MatmulChoice;
use crate::options::{CoopMatmul, DeviceOptions, MatmulTiles};
use crate::plan::{self, View};

/// Every op of the vocabulary on one GPU through wgpu (Vulkan, Metal, DX12, or
/// the browser's WebGPU).
///
/// Cheap to clone (one shared device). Shaders are compiled once per device and
/// pipelines cached; buffers for host calls, staging and kernel parameters are
/// reused across calls. Host calls ([`Backend::run_typed`], [`Backend::run`])
/// copy in, run and copy out in one submission and wait; tensor calls
/// ([`Backend::run_tensors`]) submit and return; [`GpuCommandBatch`] records
/// many ops into one submission.
///
/// Dtypes: every op runs on `f32`, `f16` and `bf16` data, on any adapter (no
/// `SHADER_F16` needed). Half tensors are stored as their bytes, two values
/// to a 32-bit word; the shaders compute in `f32` and round once when they
/// store (nearest, ties to even, bit-exact with the CPU backend). Element-wise
/// ops, casts and reductions read and write half data directly; row ops and
/// convolutions write an `f32` temporary that a cast rounds into a half
/// output; a half matmul casts A and B into `f32` temporaries, runs the `f32`
/// GEMM and casts C (except an `f16` matmul on a device with cooperative
/// matrices: [`WgpuBackend::cooperative_matrix`]), and half attention likewise
/// casts q, k and v, runs the
/// `f32` kernel (which keeps its softmax weights in `f32`) and casts the
/// output. A cast between equal dtypes is a buffer copy, and a TF32 matmul or
/// attention runs in full precision.
///
/// Block-quantized weights (`q4_K`, `q5_K`, `q6_K`, `q8_0`) are stored as
/// their blocks' bytes: [`Op::QuantMatmul`] runs a GEMV kernel that decodes
/// the blocks on the fly (up to 16 rows of x; more rows dequantize the weight
/// into an `f32` temporary once and run the GEMM), and a cast from a
/// quantized dtype dequantizes bit for bit. Quantizing casts are declined
/// (typed `UnsupportedDType`): the CPU runs them.
#[derive(Clone, Debug)]
pub struct WgpuBackend {
    pub(crate) ctx: Arc<Context>,
}

/// The backend under its trueno-compatible name: `GpuDevice::new()`, `.relu(&x, &mut out)`,
/// `.matmul(&a, &b, &mut c, m, k, n)`, `.dot(&a, &b)` (the last three through
/// [`compute_core::Ops`]).
pub type GpuDevice = WgpuBackend;

/// Whether the blocking API (`new`, `run`, `download`…) works on this target:
/// true on native, false in the browser (use the async API there). Free.
pub fn sync_available() -> bool {
    cfg!(not(target_arch = "wasm32"))
}

/// Whether the default adapter opens, once known (see [`WgpuBackend::is_available`]).
static AVAILABLE: OnceLock<bool> = OnceLock::new();

impl WgpuBackend {
    /// Opens the best adapter ([`DeviceOptions::from_env`]): blocking, native only
    /// (absent on wasm32: use [`new_async`](Self::new_async) there).
    /// Costs an adapter enumeration and device creation (milliseconds). Fails with
    /// [`ComputeError::DeviceUnavailable`] when there is no adapter or no driver.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn new() -> Result<Self> {
        Self::with_options(&DeviceOptions::from_env())
    }

    /// Opens the adapter `options` ask for; blocking, native only (absent on wasm32).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn with_options(options: &DeviceOptions) -> Result<Self> {
        crate::context::block_on(Self::new_async_with(options.clone()))
    }

    /// Opens the best adapter without blocking: the only way in the browser.
    pub fn new_async() -> impl Future<Output = Result<Self>> {
        Self::new_async_with(DeviceOptions::from_env())
    }

    /// Opens the adapter `options` ask for, without blocking.
    pub async fn new_async_with(options: DeviceOptions) -> Result<Self> {
        let ctx = Context::open(&options).await?;
        Ok(WgpuBackend { ctx: Arc::new(ctx) })
    }

    /// Whether an adapter can be opened with the default options. Blocking and
    /// cached for the process (the first call enumerates adapters: milliseconds).
    /// Native only (absent on wasm32): use
    /// [`is_available_async`](Self::is_available_async) there.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn is_available() -> bool {
        *AVAILABLE.get_or_init(|| Self::new().is_ok())
    }

    /// Whether an adapter can be opened with the default options, without
    /// blocking: the only form that works in the browser. The first answer is
    /// cached for the process (shared with [`is_available`](Self::is_available));
    /// the first call opens a device (milliseconds) and drops it.
    pub async fn is_available_async() -> bool {
        if let Some(&known) = AVAILABLE.get() {
            return known;
        }
        let found = Self::new_async().await.is_ok();
        *AVAILABLE.get_or_init(|| found)
    }

    /// Which adapter this backend opened and its limits.
    pub fn adapter(&self) -> &AdapterReport {
        &self.ctx.report
    }

    /// The wgpu device and queue, for callers that record their own commands. Free.
    pub fn device(&self) -> (&wgpu::Device, &wgpu::Queue) {
        (&self.ctx.device, &self.ctx.queue)
    }

    /// Whether matmul and attention run without naga's runtime bounds checks
    /// (the default; see [`DeviceOptions`]).
    pub fn matmul_unchecked(&self) -> bool {
        !self.ctx.kernels.matmul().checked
    }

    /// The matmul tiling (see [`DeviceOptions::matmul_tiles`]).
    pub fn matmul_tiles(&self) -> MatmulTiles {
        self.ctx.kernels.matmul().tiles
    }

    /// Whether this device runs `f16` matmuls on cooperative matrices (tensor
    /// cores): the adapter offered 16 × 16 × 16 matrices of `f16` inputs and
    /// `f32` accumulators, `SHADER_F16`, subgroups of 32 with their barrier,
    /// and the device was opened with them (unless
    /// [`DeviceOptions::matmul_coop`] was `Off`). Without them (lavapipe, the
    /// browser, most adapters) every matmul runs the `f32` kernels. Free.
    pub fn cooperative_matrix(&self) -> bool {
        self.ctx.coop()
    }

    /// Which cooperative-matrix configuration `f16` matmuls ask for (see
    /// [`DeviceOptions::matmul_coop`]); it applies only where
    /// [`cooperative_matrix`](Self::cooperative_matrix) holds.
    pub fn matmul_coop(&self) -> CoopMatmul {
        self.ctx.kernels.matmul().coop
    }

    /// Changes the cooperative-matrix configuration of `f16` matmuls (or turns
    /// it off) for ops submitted from now on: for tuning and benchmarks on one
    /// device. A device opened without cooperative matrices keeps running the
    /// `f32` kernels whatever this says.
    pub fn set_matmul_coop(&self, coop: CoopMatmul) {
        let choice = self.ctx.kernels.matmul();
        self.ctx.kernels.set_matmul(MatmulChoice { coop, ..choice });
    }

    /// Changes the matmul tiling and whether naga's bounds checks stay in (in the
    /// matmul and attention shaders), for ops submitted from now on (ops already
    /// submitted keep theirs): for tuning and benchmarks on one device. Pipelines
    /// are compiled on first use and cached, so switching back and forth costs
    /// nothing after the first call of each.
    pub fn set_matmul(&self, tiles: MatmulTiles, bounds_checks: bool) {
        let choice = self.ctx.kernels.matmul();
        self.ctx.kernels.set_matmul(MatmulChoice { checked: bounds_checks, tiles, ..choice });
    }

    /// A new batch: ops recorded on buffer ids, run by one submission. Free.
    pub fn batch(&self) -> GpuCommandBatch {
        GpuCommandBatch::new(self.clone())
    }

    /// Sets the most bytes of free buffers kept for reuse (default 1 GiB; 0 disables).
    pub fn set_buffer_cache_limit(&self, bytes: u64) {
        self.ctx.cache.set_limit(bytes);
    }

    /// Bytes of free buffers currently kept for reuse.
    pub fn buffer_cache_bytes(&self) -> u64 {
        self.ctx.cache.free_bytes()
    }

    /// Threads that large host copies use: a copy into an upload staging
    /// buffer, or out of a read-back buffer, of at least 8 MiB is split into
    /// pieces of at least 4 MiB, one per thread (started per copy, the calling
    /// thread taking the first). Default: `COMPUTE_WGPU_COPY_THREADS` if set,
    /// else the cores available, at most 4; 1 in the browser. Free.
    pub fn copy_threads(&self) -> usize {
        self.ctx.copier.threads()
    }

    /// Sets the threads large host copies use (see
    /// [`copy_threads`](Self::copy_threads); 1 keeps every copy on the calling
    /// thread). Applies to calls made from now on. Free.
    pub fn set_copy_threads(&self, threads: usize) {
        self.ctx.copier.set_threads(threads);
    }

    /// A new device buffer for `len` floats (usages `STORAGE | COPY_SRC | COPY_DST`,
    /// [`padded_bytes`]`(len)` bytes, contents unspecified), not taken from this
    /// backend's cache: the building block of an external pool. Costs one allocation.
    pub fn create_buffer(&self, len: usize) -> Result<wgpu::Buffer> {
        let bytes = padded_bytes(len);
        if len == 0 {
            return Err(ComputeError::shape("alloc", "zero-sized buffer", "x=[0]"));
        }
        if bytes > self.ctx.limits.max_buffer_size {
            return Err(errors::limit("alloc", "buffer bytes", bytes, self.ctx.limits.max_buffer_size));
        }
        let scope = self.ctx.scope();
        let buffer = self.ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: bytes,
            usage: Use::Storage.usages(),
            mapped_at_creation: false,
        });
        scope.end_now("alloc", bytes)?;
        Ok(buffer)
    }

    /// Wraps a device buffer of this backend as a tensor of `len` floats. When the
    /// last handle drops, the buffer goes to `recycler` (an external pool) if given.
    /// The buffer must have the usages and size of [`WgpuBackend::create_buffer`]
    /// (checked: a shape error otherwise). Free.
    pub fn tensor_from_buffer(
        &self,
        buffer: wgpu::Buffer,
        len: usize,
        recycler: Option<Arc<dyn BufferRecycler>>,
    ) -> Result<Tensor> {
        let need = padded_bytes(len);
        if len == 0 || buffer.size() < need || !buffer.usage().contains(Use::Storage.usages()) {
            return Err(ComputeError::shape(
                "tensor_from_buffer",
                format!(
                    "buffer of {} bytes with usages {:?} cannot hold {len} floats (needs {need} bytes, STORAGE | COPY_SRC | COPY_DST)",
                    buffer.size(),
                    buffer.usage()
                ),
                format!("x=[{len}]"),
            ));
        }
        Ok(Tensor::from_storage(Arc::new(GpuBuffer::new(buffer, len, DType::F32, self.ctx.id, recycler))))
    }

    /// Whether [`WgpuBackend::time_tensors`] and [`WgpuBackend::time_commands`] can
    /// time on the GPU: the device was opened with `TIMESTAMP_QUERY` and
    /// `TIMESTAMP_QUERY_INSIDE_ENCODERS` (requested whenever the adapter offers
    /// them). Free.
    pub fn gpu_timing(&self) -> bool {
        self.ctx.timestamps()
    }

    /// Checks a call on resident tensors (lengths, dtypes, and dtypes the
    /// shaders lack) and plans its dispatches (nothing is recorded yet): what
    /// `run_tensors` and `time_tensors` submit. Half row ops, convolutions and
    /// matmuls take `f32` temporaries from the buffer cache here.
    fn planned(&self, op: &Op, inputs: &[&Tensor], output: &Tensor) -> Result<Vec<plan::Step>> {
        check_tensor_call(op, LOCATION, inputs, output)?;
        if !plan::supported(op) {
            return Err(plan::unsupported_dtype(op));
        }
        self.check_limits(op)?;
        let mut views = Vec::with_capacity(inputs.len());
        for t in inputs {
            views.push(View { buffer: self.storage(t, op.name())?.buffer().clone(), len: t.len(), dtype: t.dtype() });
        }
        let out = View {
            buffer: self.storage(output, op.name())?.buffer().clone(),
            len: output.len(),
            dtype: output.dtype(),
        };
        let mut steps = Vec::new();
        plan::plan(&self.ctx, op, &views, &out, &mut steps)?;
        Ok(steps)
    }

    /// Runs `op` as [`Backend::run_tensors`] does, in one submission with a GPU
    /// timestamp written before its first command and one after its last, waits
    /// for it, and returns the seconds between them (`None` without
    /// [`WgpuBackend::gpu_timing`]; then nothing runs). GPU time of the op alone,
    /// without the gaps between submissions that host timing includes. Costs a
    /// query set and two 16-byte buffers per call, and a wait. Native only
    /// (absent on wasm32, where nothing may wait).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn time_tensors(&self, op: &Op, inputs: &[&Tensor], output: &Tensor) -> Result<Option<f64>> {
        let steps = self.planned(op, inputs, output)?;
        let Some(timer) = encode::Timer::new(&self.ctx) else { return Ok(None) };
        let index = encode::submit_timed(&self.ctx, &steps, op.name(), Some(&timer))?;
        self.timer_seconds(&timer, index, op.name())
    }

    /// The GPU seconds of the commands `record` puts into a fresh encoder (for
    /// example a `copy_buffer_to_buffer` to compare with), timed as
    /// [`WgpuBackend::time_tensors`] times an op; `None` (and `record` is not
    /// called) without [`WgpuBackend::gpu_timing`]. One submission and a wait.
    /// Native only (absent on wasm32).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn time_commands(&self, record: impl FnOnce(&mut wgpu::CommandEncoder)) -> Result<Option<f64>> {
        self.ctx.check_alive()?;
        let Some(timer) = encode::Timer::new(&self.ctx) else { return Ok(None) };
        let scope = self.ctx.scope();
        let mut encoder =
            self.ctx.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("time_commands") });
        timer.begin(&mut encoder);
        record(&mut encoder);
        timer.end(&mut encoder);
        let index = self.ctx.queue.submit([encoder.finish()]);
        scope.end_now("time_commands", 0)?;
        self.timer_seconds(&timer, index, "time_commands")
    }

    #[cfg(not(target_arch = "wasm32"))]
    fn timer_seconds(
        &self,
        timer: &encode::Timer,
        index: wgpu::SubmissionIndex,
        op: &'static str,
    ) -> Result<Option<f64>> {
        timer.seconds(&self.ctx, index, op).map(Some)
    }

    /// A future that resolves when all work submitted so far has finished. Free to
    /// create; on native a helper thread polls the device while it is pending.
    pub fn submitted_work_done(&self) -> WorkDone {
        let signal = Signal::new();
        let sink = Arc::clone(&signal);
        self.ctx.queue.on_submitted_work_done(move || sink.set(()));
        WorkDone { signal, ctx: Arc::clone(&self.ctx), waiting: None }
    }

    /// Copies an `f32` tensor back to the host without blocking (the browser's
    /// way; works on native too); a tensor of another dtype is a
    /// [`ComputeError::DType`] error. Costs one submission and one staging
    /// buffer (reused).
    pub fn download_async(&self, tensor: &Tensor) -> impl Future<Output = Result<Vec<f32>>> + use<> {
        let read = self.storage(tensor, "download").and_then(|g| {
            if tensor.dtype() != DType::F32 {
                return Err(ComputeError::DType {
                    op: "download",
                    detail: format!("download_async reads f32 values, the tensor is {}", tensor.dtype()),
                    shapes: format!("tensor=[{}] {}", tensor.len(), tensor.dtype()),
                });
            }
            let bytes = tensor.operand().bytes();
            encode::submit_and_read(&self.ctx, Vec::new(), g.buffer(), bytes, "download")
        });
        async move { read?.await }
    }

    /// Runs an `f32` op on `f32` host data without blocking: uploads, runs and
    /// starts the read back in one submission; the future yields the output.
    /// An op of another dtype is a [`ComputeError::DType`] error (the inputs
    /// are `f32`).
    pub fn run_async(&self, op: &Op, inputs: &[&[f32]]) -> impl Future<Output = Result<Vec<f32>>> + use<> {
        let started = op.layout().and_then(|l| {
            let mut operands = [Operand::new(0, DType::F32); 3];
            for (d, x) in operands.iter_mut().zip(inputs) {
                d.len = x.len();
            }
            let out_len = l.output_len();
            op.check_operands(&operands[..inputs.len().min(3)], Operand::new(out_len, DType::F32))?;
            if inputs.len() > 3 {
                return Err(ComputeError::shape(op.name(), "too many inputs", op.shapes()));
            }
            if !plan::supported(op) {
                return Err(plan::unsupported_dtype(op));
            }
            let views: Vec<HostSlice<'_>> = inputs.iter().map(|x| HostSlice::F32(x)).collect();
            self.start_host(op, &views, Operand::new(out_len, DType::F32), None)
        });
        async move { started?.await }
    }

    /// The storage of a tensor of this device, or a typed error.
    pub(crate) fn storage<'t>(&self, t: &'t Tensor, op: &'static str) -> Result<&'t GpuBuffer> {
        let wrong = |found: String| ComputeError::WrongDevice {
            op,
            expected: format!("{LOCATION} (device {})", self.ctx.id),
            found,
        };
        let g = t.storage::<GpuBuffer>().ok_or_else(|| wrong(t.location().to_string()))?;
        if g.device_id() != self.ctx.id {
            return Err(wrong(format!("{} (device {})", t.location(), g.device_id())));
        }
        Ok(g)
    }

    /// Uploads host inputs of any dtype into cached buffers (their bytes as
    /// they are), plans `op`, and submits it with a read back of the output
    /// (`out`'s length and dtype). The buffers go back to the cache at once:
    /// any later use of them is a later submission, which the queue orders after this one.
    ///
    /// An op that [writes only part of its output](Op::writes_part_of_output) starts from
    /// `initial`, the output's bytes on the host (zeros when `None`), uploaded
    /// into the output buffer first; other ops ignore it.
    fn start_host(&self, op: &Op, inputs: &[HostSlice<'_>], out: Operand, initial: Option<&[u8]>) -> Result<Readback> {
        let ctx = &self.ctx;
        ctx.check_alive()?;
        let name = op.name();
        let mut held: Vec<wgpu::Buffer> = Vec::with_capacity(inputs.len() + 1);
        let mut views = Vec::with_capacity(inputs.len());
        let mut staged = encode::Staged::default();
        let result = (|| {
            let mut steps = Vec::new();
            for x in inputs {
                let b = ctx.cache.take(ctx, Use::Storage, padded_bytes_of(x.len(), x.dtype()), name)?;
                held.push(b.clone());
                encode::upload_into(ctx, &b, x.as_bytes(), &mut steps, &mut staged, name)?;
                views.push(View { buffer: b, len: x.len(), dtype: x.dtype() });
            }
            let buffer = ctx.cache.take(ctx, Use::Storage, padded_bytes_of(out.len, out.dtype), name)?;
            held.push(buffer.clone());
            let view = View { buffer: buffer.clone(), len: out.len, dtype: out.dtype };
            if op.writes_part_of_output() {
                let zeros;
                let bytes = match initial {
                    Some(b) => b,
                    None => {
                        zeros = vec![0u8; usize::try_from(out.bytes()).unwrap_or(0)];
                        &zeros
                    }
                };
                encode::upload_into(ctx, &buffer, bytes, &mut steps, &mut staged, name)?;
            }
            plan::plan(ctx, op, &views, &view, &mut steps)?;
            encode::submit_and_read(ctx, steps, &buffer, out.bytes(), name)
        })();
        staged.recycle(ctx);
        for b in held {
            ctx.cache.give(b);
        }
        result
    }

    /// Whether every pipeline `ops` need is compiled (see [`Backend::prepare`]):
    /// then their first calls compile nothing. Plans each op (no device work).
    pub fn is_prepared(&self, ops: &[Op]) -> Result<bool> {
        let kernels = self.kernels_of(ops)?;
        self.ctx.kernels.has_all(&kernels)
    }

    /// The shader entry points `op` dispatches on this device, in order (for
    /// tests and tuning): e.g. `["convert", "convert", "matmul_tiled",
    /// "convert"]` for an `f16` matmul on the `f32` kernels, `["matmul_coop"]`
    /// on cooperative matrices. Plans the op on a placeholder buffer: nothing
    /// is recorded or submitted, but a cooperative-matrix pipeline is compiled
    /// on first use. Empty for an op this device cannot run.
    pub fn entry_points(&self, op: &Op) -> Result<Vec<&'static str>> {
        Ok(self.kernels_of(std::slice::from_ref(op))?.into_iter().map(|k| k.entry()).collect())
    }

    /// The kernels `ops` dispatch, each op planned on a placeholder buffer
    /// (nothing recorded or submitted). Ops with invalid shapes, beyond this
    /// device's limits, or of dtypes the shaders lack are skipped (their calls
    /// report why); the kernels of the steps an op planned before such an
    /// error are kept.
    fn kernels_of(&self, ops: &[Op]) -> Result<Vec<crate::kernels::Kernel>> {
        let ctx = &self.ctx;
        let placeholder = ctx.cache.take(ctx, Use::Storage, 256, "prepare")?;
        let mut kernels = Vec::new();
        for op in ops.iter().filter(|op| plan::supported(op)) {
            let Ok(layout) = op.layout() else { continue };
            if self.check_limits(op).is_err() {
                continue;
            }
            let view = |o: &Operand| View { buffer: placeholder.clone(), len: o.len, dtype: o.dtype };
            let inputs: Vec<View> = layout.inputs().iter().map(view).collect();
            let mut steps = Vec::new();
            let _ = plan::plan(ctx, op, &inputs, &view(&layout.output()), &mut steps);
            for step in steps {
                match step {
                    plan::Step::Dispatch(d) => kernels.push(d.kernel),
                    // Never submitted: free for anyone at once.
                    plan::Step::Scratch(b) => ctx.cache.give(b),
                    plan::Step::Copy { .. } => {}
                }
            }
        }
        ctx.cache.give(placeholder);
        Ok(kernels)
    }

    /// Checks `op` against the device's limits without running it: the error
    /// [`Backend::run`] would return for sizes the device cannot take (each
    /// operand at its dtype's size; the `f32` temporaries of half row ops,
    /// convolutions, matmuls and attention at 4 bytes an element, and the
    /// `f32` product of a matmul with an epilogue, the size of an `f32` C,
    /// whose bias is no larger; for
    /// attention, one key/value head's `f32` keys, and the queries of the heads
    /// that read it, each within one storage binding; a strided copy's two
    /// views, a gather's output and ids, the positions an op reads, and one
    /// row of a rotary embedding, gather table or argmax, each within one
    /// binding). Free.
    pub fn check_limits(&self, op: &Op) -> Result<()> {
        let layout = op.layout()?;
        let bytes = |o: Operand| padded_bytes_of(o.len, o.dtype);
        let max_buffer = self.ctx.limits.max_buffer_size;
        // Half outputs of row ops and convolutions, and half matmul and attention
        // operands, are computed in f32 temporaries of the same length.
        let input = |i: usize| layout.inputs().get(i).copied();
        let temps: [Option<Operand>; 4] = match op {
            Op::Rows { .. } | Op::Conv2d(_) | Op::QuantMatmul(_) => [Some(layout.output()), None, None, None],
            Op::Matmul(_) => [input(0), input(1), Some(layout.output()), None],
            Op::Attention(_) => [input(0), input(1), input(2), Some(layout.output())],
            _ => [None, None, None, None],
        };
        let temps = temps.map(|o| o.filter(|o| o.dtype != DType::F32).map(|o| Operand::new(o.len, DType::F32)));
        // A fused norm's f32 rows, a gated product's f32 halves.
        let fused = match *op {
            Op::QuantMatmul(s) => [
                s.rms_norm.map(|_| Operand::new(s.m.saturating_mul(s.k), DType::F32)),
                s.glu.then(|| Operand::new(s.m.saturating_mul(s.n), DType::F32)),
            ],
            _ => [None, None],
        };
        let temps = temps.into_iter().chain(fused).flatten();
        for o in layout.inputs().iter().chain(layout.outputs()).copied().chain(temps) {
            if bytes(o) > max_buffer {
                return Err(errors::limit(op.name(), "buffer bytes", bytes(o), max_buffer));
            }
        }
        let max = self.ctx.max_binding();
        // What one binding holds whole: matmul's A, B and C in f32; conv's x and w
        // at their dtype and its output in f32.
        let f32_of = |o: Option<Operand>| o.map(|o| Operand::new(o.len, DType::F32));
        let whole: [(Option<Operand>, &'static str); 3] = match op {
            Op::Matmul(_) => [
                (f32_of(layout.inputs().first().copied()), "storage buffer binding bytes (matmul A)"),
                (f32_of(layout.inputs().get(1).copied()), "storage buffer binding bytes (matmul B)"),
                (f32_of(Some(layout.output())), "storage buffer binding bytes (matmul C)"),
            ],
            Op::Conv2d(_) => [
                (layout.inputs().first().copied(), "storage buffer binding bytes (conv input)"),
                (layout.inputs().get(1).copied(), "storage buffer binding bytes (conv weights)"),
                (f32_of(Some(layout.output())), "storage buffer binding bytes (conv output)"),
            ],
            _ => [(None, ""), (None, ""), (None, "")],
        };
        for (o, what) in whole {
            if let Some(b) = o.map(bytes).filter(|&b| b > max) {
                return Err(errors::limit(op.name(), what, b, max));
            }
        }
        // A quantized matmul binds x and its f32 y whole, and whole weight rows.
        if let Op::QuantMatmul(s) = *op {
            plan::quant::check_limits(&self.ctx, op.name(), &s)?;
        }
        // Attention binds whole key/value heads with their queries, in f32.
        if let Op::Attention(a) = op {
            plan::attention_layout(&self.ctx, op.name(), a)?;
        }
        // The decoder ops bind a copy's two views and a gather's output and ids
        // whole, and one row (a head's values, a table row, a row of logits) at least.
        let whole: [(Option<Operand>, &'static str); 2] = match op {
            Op::Copy(_) => [
                (layout.inputs().first().copied(), "storage buffer binding bytes (copy source)"),
                (Some(layout.output()), "storage buffer binding bytes (copy destination)"),
            ],
            Op::Gather { .. } => [
                (Some(layout.output()), "storage buffer binding bytes (gather output)"),
                (layout.inputs().get(1).copied(), "storage buffer binding bytes (ids)"),
            ],
            _ => [(None, ""), (None, "")],
        };
        for (o, what) in whole {
            if let Some(b) = o.map(bytes).filter(|&b| b > max) {
                return Err(errors::limit(op.name(), what, b, max));
            }
        }
        // The positions of a rope, copy or attention that reads them (its last
        // input) are bound whole.
        if let Some(b) = layout.inputs().last().filter(|_| op.reads_positions()).map(|&o| bytes(o)).filter(|&b| b > max)
        {
            return Err(errors::limit(op.name(), "storage buffer binding bytes (positions)", b, max));
        }
        let row = match *op {
            Op::Rope(r) => Some((r.head_dim, r.dtype)),
            Op::Gather { cols, dtype, .. } | Op::ArgMax { cols, dtype, .. } => Some((cols, dtype)),
            _ => None,
        };
        if let Some(row_bytes) = row.map(|(n, d)| padded_bytes_of(n, d)).filter(|&b| b > max) {
            return Err(errors::limit(op.name(), "storage buffer binding bytes (one row)", row_bytes, max));
        }
        // A row is bound whole, in its dtype and (for half data) in the f32 temporary.
        if let Op::Rows { cols, .. } = *op {
            let row_bytes = (cols as u64).saturating_mul(4);
            if row_bytes > max {
                return Err(errors::limit(op.name(), "storage buffer binding bytes (one row)", row_bytes, max));
            }
        }
        Ok(())
    }
}

/// The async names of every op (`relu_async`, `matmul_async`, `dot_async`…),
/// the browser's way to call the GPU: the inputs are uploaded and the op
/// submitted at the first poll; the future resolves when the result is back on
/// the host (no thread blocks), then copies it into the output. Ops of dtypes
/// the shaders lack resolve to the errors [`Backend::run_typed`] returns.
impl compute_core::AsyncOps for WgpuBackend {
    async fn run_async_into<'a>(
        &'a self,
        op: Op,
        inputs: &'a [HostSlice<'a>],
        mut output: HostSliceMut<'a>,
    ) -> Result<()> {
        check_host_call(&op, inputs, &output)?;
        if !plan::supported(&op) {
            return Err(plan::unsupported_dtype(&op));
        }
        self.check_limits(&op)?;
        let initial = Some(output.as_slice().as_bytes());
        let read = self.start_host(&op, inputs, output.operand(), initial)?;
        // Straight from the mapping into the output, once the result is on the host.
        read.into_slice(output.as_bytes_mut()).await
    }

    /// Submits a copy of the tensor (any dtype) into a staging buffer at the
    /// first poll and resolves once it is mapped on the host, without blocking.
    async fn download_async_into<'a>(&'a self, tensor: &'a Tensor, mut out: HostSliceMut<'a>) -> Result<()> {
        check_download(tensor, &out)?;
        let g = self.storage(tensor, "download")?;
        let bytes = tensor.operand().bytes();
        let read = encode::submit_and_read(&self.ctx, Vec::new(), g.buffer(), bytes, "download")?;
        // Straight from the mapping into the output (untouched on any error).
        read.into_slice(out.as_bytes_mut()).await
    }
}

impl Backend for WgpuBackend {
    fn kind(&self) -> BackendKind {
        KIND
    }

    fn device_name(&self) -> String {
        format!("{} ({}, {})", self.ctx.report.name, self.ctx.report.api, self.ctx.report.device_type)
    }

    /// Every op of the vocabulary on `f32`, `f16` and `bf16` (see
    /// [`WgpuBackend`]), matmul epilogues included; a TF32 matmul or
    /// attention runs in full precision. Free.
    fn supports(&self, op: &Op) -> bool {
        plan::supported(op)
    }

    /// Validates lengths and dtypes, refuses dtypes the shaders lack
    /// ([`ComputeError::UnsupportedDType`]), then uploads the inputs (reused
    /// buffers, their bytes as they are), runs `op`, copies the output back:
    /// one submission, then a wait. Ops larger than one storage binding are split.
    fn run_typed(&self, op: &Op, inputs: &[HostSlice<'_>], mut output: HostSliceMut<'_>) -> Result<()> {
        check_host_call(op, inputs, &output)?;
        if !sync_available() {
            return Err(errors::unavailable("blocking calls are not available in the browser: use run_async"));
        }
        if !plan::supported(op) {
            return Err(plan::unsupported_dtype(op));
        }
        self.check_limits(op)?;
        let read = self.start_host(op, inputs, output.operand(), Some(output.as_slice().as_bytes()))?;
        // Writes `output` only once the result is mapped on the host: all or nothing.
        read.wait_into_bytes(output.as_bytes_mut())
    }

    /// A new tensor of the data's dtype from a reused buffer, its bytes as
    /// they are (`f16` and `bf16` values two to a 32-bit word). Small data is
    /// queued with `write_buffer` (it reaches the device before the next
    /// submission); large data goes through a reused staging buffer and one
    /// submission. Returns without waiting for the device.
    fn upload_typed(&self, data: HostSlice<'_>) -> Result<Tensor> {
        if data.is_empty() {
            return Err(ComputeError::shape("upload", "zero-sized tensor", "x=[0]"));
        }
        let ctx = &self.ctx;
        ctx.check_alive()?;
        let buffer = ctx.cache.take(ctx, Use::Storage, padded_bytes_of(data.len(), data.dtype()), "upload")?;
        let mut steps = Vec::new();
        let mut staged = encode::Staged::default();
        let done = encode::upload_into(ctx, &buffer, data.as_bytes(), &mut steps, &mut staged, "upload")
            .and_then(|()| if steps.is_empty() { Ok(()) } else { encode::submit(ctx, &steps, "upload").map(|_| ()) });
        staged.recycle(ctx);
        if let Err(e) = done {
            ctx.cache.give(buffer);
            return Err(e);
        }
        let recycler: Arc<dyn BufferRecycler> = ctx.cache.clone();
        Ok(Tensor::from_storage(Arc::new(GpuBuffer::new(buffer, data.len(), data.dtype(), ctx.id, Some(recycler)))))
    }

    /// A tensor of `len` elements of `dtype`, any dtype, on a reused buffer
    /// (contents unspecified). Free when the cache has one.
    fn alloc_typed(&self, len: usize, dtype: DType) -> Result<Tensor> {
        if len == 0 {
            return Err(ComputeError::shape("alloc", "zero-sized tensor", "x=[0]"));
        }
        let ctx = &self.ctx;
        ctx.check_alive()?;
        let buffer = ctx.cache.take(ctx, Use::Storage, padded_bytes_of(len, dtype), "alloc")?;
        let recycler: Arc<dyn BufferRecycler> = ctx.cache.clone();
        Ok(Tensor::from_storage(Arc::new(GpuBuffer::new(buffer, len, dtype, ctx.id, Some(recycler)))))
    }

    /// Waits for the work queued so far that writes the tensor, then copies
    /// its bytes out (`out` of the tensor's length and dtype).
    fn download_typed(&self, tensor: &Tensor, mut out: HostSliceMut<'_>) -> Result<()> {
        check_download(tensor, &out)?;
        if !sync_available() {
            return Err(errors::unavailable("blocking calls are not available in the browser: use download_async"));
        }
        let g = self.storage(tensor, "download")?;
        let bytes = tensor.operand().bytes();
        let read = encode::submit_and_read(&self.ctx, Vec::new(), g.buffer(), bytes, "download")?;
        read.wait_into_bytes(out.as_bytes_mut())
    }

    /// Records `op` and submits it; returns without waiting.
    fn run_tensors(&self, op: &Op, inputs: &[&Tensor], output: &Tensor) -> Result<()> {
        let steps = self.planned(op, inputs, output)?;
        encode::submit(&self.ctx, &steps, op.name()).map(|_| ())
    }

    /// Compiles the pipelines `ops` need: each op is planned on a placeholder
    /// buffer (nothing is recorded or submitted), then the missing shader
    /// modules and pipelines are compiled on several threads. Ops with invalid
    /// shapes or beyond this device's limits are skipped. Costs what the ops'
    /// first calls would pay for compiling, less the overlap; a hash lookup per
    /// kernel when all are compiled.
    fn prepare(&self, ops: &[Op]) -> Result<()> {
        self.ctx.check_alive()?;
        let kernels = self.kernels_of(ops)?;
        self.ctx.kernels.compile_all(&self.ctx, &kernels)
    }

    /// Blocks until all submitted work has finished; reports errors of earlier
    /// asynchronous work.
    fn synchronize(&self) -> Result<()> {
        self.ctx.check_alive()?;
        #[cfg(not(target_arch = "wasm32"))]
        crate::completion::wait_for(&self.ctx, None, "synchronize")?;
        self.ctx.check_alive()?;
        self.ctx.take_uncaptured("synchronize")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_send<T: Send>(_: &T) -> bool {
        true
    }

    #[test]
    fn futures_are_send_so_multithreaded_executors_can_run_them() {
        // Never polled: only their types matter (no device needed).
        assert!(is_send(&WgpuBackend::new_async()));
        assert!(is_send(&WgpuBackend::new_async_with(DeviceOptions::default())));
        fn readback_is_send(r: Readback) -> bool {
            is_send(&r)
        }
        let _ = readback_is_send;
        assert!(sync_available());
    }
}
