//! [`GpuCommandBatch`]: the trueno-compatible batch API. Ops are recorded on buffer ids and
//! run by [`GpuCommandBatch::execute`] as ONE command encoder and ONE queue
//! submission, however many ops there are.

use std::future::Future;

use compute_core::{
    AttentionSpec, BinaryOp, ComputeError, Conv2dSpec, GeluForm, MatmulSpec, Op, ReduceOp, Result, RowOp, Tensor,
    UnaryOp,
};

use crate::backend::WgpuBackend;
use crate::encode;
use crate::plan::{self, Step, View};
use compute_core::Backend;

/// A buffer of a [`GpuCommandBatch`] (an input it uploaded or an op's output).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BufferId(usize);

/// Records ops on device buffers and runs them all in one submission.
///
/// ```no_run
/// use compute_wgpu::WgpuBackend;
/// let gpu = WgpuBackend::new()?;
/// let mut batch = gpu.batch();
/// let x = batch.upload(&[1.0, -2.0, 3.0, -4.0])?;
/// let y = batch.relu(x)?;
/// let z = batch.scale(y, 0.5)?;
/// batch.execute()?; // one command encoder, one queue submission
/// assert_eq!(batch.read(z)?, vec![0.5, 0.0, 1.5, 0.0]);
/// # Ok::<(), compute_core::ComputeError>(())
/// ```
///
/// Every op checks its shapes and dtypes when recorded and returns a typed
/// error (nothing is recorded then); each op's output is a new device buffer
/// (reused from the backend's cache). Data stays on the device until
/// [`GpuCommandBatch::read`]. The named methods record `f32` ops;
/// [`GpuCommandBatch::op`] records any op, on `f32`, `f16` or `bf16` buffers
/// (from [`GpuCommandBatch::insert`]), as [`WgpuBackend`] runs them.
#[derive(Debug)]
pub struct GpuCommandBatch {
    backend: WgpuBackend,
    tensors: Vec<Tensor>,
    pending: Vec<Step>,
    pending_ops: usize,
    submissions: usize,
}

impl GpuCommandBatch {
    pub(crate) fn new(backend: WgpuBackend) -> Self {
        GpuCommandBatch { backend, tensors: Vec::new(), pending: Vec::new(), pending_ops: 0, submissions: 0 }
    }

    fn push(&mut self, t: Tensor) -> BufferId {
        self.tensors.push(t);
        BufferId(self.tensors.len() - 1)
    }

    fn get(&self, id: BufferId, op: &'static str) -> Result<&Tensor> {
        self.tensors.get(id.0).ok_or_else(|| {
            ComputeError::shape(op, format!("unknown buffer id {}", id.0), format!("{} buffers", self.tensors.len()))
        })
    }

    /// Copies `data` to a new device buffer (queued: it reaches the device with the next submission).
    pub fn upload(&mut self, data: &[f32]) -> Result<BufferId> {
        let t = self.backend.upload(data)?;
        Ok(self.push(t))
    }

    /// A new device buffer of `len` floats (contents unspecified), e.g. for [`GpuCommandBatch::op_into`].
    pub fn alloc(&mut self, len: usize) -> Result<BufferId> {
        let t = self.backend.alloc(len)?;
        Ok(self.push(t))
    }

    /// Adds an existing tensor of this backend to the batch.
    pub fn insert(&mut self, tensor: Tensor) -> Result<BufferId> {
        self.backend.storage(&tensor, "insert")?;
        Ok(self.push(tensor))
    }

    /// The tensor behind `id` (a shared handle: it stays valid after the batch drops).
    pub fn tensor(&self, id: BufferId) -> Result<Tensor> {
        self.get(id, "tensor").cloned()
    }

    /// Number of elements in buffer `id`.
    pub fn len_of(&self, id: BufferId) -> Result<usize> {
        Ok(self.get(id, "len")?.len())
    }

    /// Ops recorded and not yet executed.
    pub fn pending(&self) -> usize {
        self.pending_ops
    }

    /// Queue submissions this batch has made so far (executes and reads).
    pub fn submissions(&self) -> usize {
        self.submissions
    }

    /// Records `op` on `inputs` into a new buffer of the op's output dtype; returns its id.
    /// (A strided copy's elements outside its view are then unspecified:
    /// record it with [`GpuCommandBatch::op_into`] on the buffer it updates.)
    pub fn op(&mut self, op: &Op, inputs: &[BufferId]) -> Result<BufferId> {
        let layout = op.layout()?;
        if !self.backend.supports(op) {
            return Err(plan::unsupported_dtype(op));
        }
        let out = self.backend.alloc_typed(layout.output_len(), layout.output().dtype)?;
        let id = self.push(out);
        match self.op_into(op, inputs, id) {
            Ok(()) => Ok(id),
            Err(e) => {
                self.tensors.pop();
                Err(e)
            }
        }
    }

    /// Records `op` on `inputs` writing buffer `out` (which must not be an input).
    /// Lengths and dtypes are checked as [`Backend::run_tensors`] checks them.
    pub fn op_into(&mut self, op: &Op, inputs: &[BufferId], out: BufferId) -> Result<()> {
        let name = op.name();
        let mut operands = Vec::with_capacity(inputs.len());
        let mut views = Vec::with_capacity(inputs.len());
        for &i in inputs {
            if i == out {
                return Err(ComputeError::shape(name, "output buffer is also an input", op.shapes()));
            }
            let t = self.get(i, name)?;
            operands.push(t.operand());
            views.push(View {
                buffer: self.backend.storage(t, name)?.buffer().clone(),
                len: t.len(),
                dtype: t.dtype(),
            });
        }
        let o = self.get(out, name)?;
        op.check_operands(&operands, o.operand())?;
        if !self.backend.supports(op) {
            return Err(plan::unsupported_dtype(op));
        }
        self.backend.check_limits(op)?;
        let out_view = View { buffer: self.backend.storage(o, name)?.buffer().clone(), len: o.len(), dtype: o.dtype() };
        let mut steps = Vec::new();
        plan::plan(&self.backend.ctx, op, &views, &out_view, &mut steps)?;
        self.pending.extend(steps);
        self.pending_ops += 1;
        Ok(())
    }

    fn unary(&mut self, op: UnaryOp, x: BufferId) -> Result<BufferId> {
        let len = self.len_of(x)?;
        self.op(&Op::unary(op, len), &[x])
    }

    fn binary(&mut self, op: BinaryOp, a: BufferId, b: BufferId) -> Result<BufferId> {
        let len = self.len_of(a)?;
        self.op(&Op::binary(op, len), &[a, b])
    }

    /// `max(x, 0)`.
    pub fn relu(&mut self, x: BufferId) -> Result<BufferId> {
        self.unary(UnaryOp::Relu, x)
    }
    /// Leaky ReLU with slope `alpha`.
    pub fn leaky_relu(&mut self, x: BufferId, alpha: f32) -> Result<BufferId> {
        self.unary(UnaryOp::LeakyRelu { alpha }, x)
    }
    /// ELU with scale `alpha`.
    pub fn elu(&mut self, x: BufferId, alpha: f32) -> Result<BufferId> {
        self.unary(UnaryOp::Elu { alpha }, x)
    }
    /// `s·x`.
    pub fn scale(&mut self, x: BufferId, s: f32) -> Result<BufferId> {
        self.unary(UnaryOp::Scale { s }, x)
    }
    /// Clamp to `[min, max]`.
    pub fn clip(&mut self, x: BufferId, min: f32, max: f32) -> Result<BufferId> {
        self.unary(UnaryOp::Clip { min, max }, x)
    }
    /// Logistic sigmoid.
    pub fn sigmoid(&mut self, x: BufferId) -> Result<BufferId> {
        self.unary(UnaryOp::Sigmoid, x)
    }
    /// Hyperbolic tangent.
    pub fn tanh(&mut self, x: BufferId) -> Result<BufferId> {
        self.unary(UnaryOp::Tanh, x)
    }
    /// Swish / SiLU.
    pub fn swish(&mut self, x: BufferId) -> Result<BufferId> {
        self.unary(UnaryOp::Swish, x)
    }
    /// GELU, tanh form.
    pub fn gelu(&mut self, x: BufferId) -> Result<BufferId> {
        self.unary(UnaryOp::Gelu(GeluForm::Tanh), x)
    }
    /// GELU, erf form.
    pub fn gelu_erf(&mut self, x: BufferId) -> Result<BufferId> {
        self.unary(UnaryOp::Gelu(GeluForm::Erf), x)
    }
    /// `a + b` (equal lengths, else a shape error).
    pub fn add(&mut self, a: BufferId, b: BufferId) -> Result<BufferId> {
        self.binary(BinaryOp::Add, a, b)
    }
    /// `a − b`.
    pub fn sub(&mut self, a: BufferId, b: BufferId) -> Result<BufferId> {
        self.binary(BinaryOp::Sub, a, b)
    }
    /// `a · b`, element-wise.
    pub fn mul(&mut self, a: BufferId, b: BufferId) -> Result<BufferId> {
        self.binary(BinaryOp::Mul, a, b)
    }
    /// `Σ aᵢ·bᵢ` into a one-element buffer.
    pub fn dot(&mut self, a: BufferId, b: BufferId) -> Result<BufferId> {
        let len = self.len_of(a)?;
        self.op(&Op::dot(len), &[a, b])
    }
    /// Sum of all elements into a one-element buffer.
    pub fn sum(&mut self, x: BufferId) -> Result<BufferId> {
        let len = self.len_of(x)?;
        self.op(&Op::reduce(ReduceOp::Sum, len), &[x])
    }
    /// Largest element into a one-element buffer.
    pub fn max(&mut self, x: BufferId) -> Result<BufferId> {
        let len = self.len_of(x)?;
        self.op(&Op::reduce(ReduceOp::Max, len), &[x])
    }
    /// Row-wise softmax of a `rows × cols` matrix.
    pub fn softmax(&mut self, x: BufferId, rows: usize, cols: usize) -> Result<BufferId> {
        self.op(&Op::rows(RowOp::Softmax, rows, cols), &[x])
    }
    /// Row-wise log-softmax.
    pub fn log_softmax(&mut self, x: BufferId, rows: usize, cols: usize) -> Result<BufferId> {
        self.op(&Op::rows(RowOp::LogSoftmax, rows, cols), &[x])
    }
    /// Row-wise layer norm with per-column `gamma`, `beta`.
    pub fn layer_norm(
        &mut self,
        x: BufferId,
        gamma: BufferId,
        beta: BufferId,
        (rows, cols): (usize, usize),
        eps: f32,
    ) -> Result<BufferId> {
        self.op(&Op::rows(RowOp::LayerNorm { eps }, rows, cols), &[x, gamma, beta])
    }
    /// Row-wise RMS norm with per-column `gamma`.
    pub fn rms_norm(
        &mut self,
        x: BufferId,
        gamma: BufferId,
        (rows, cols): (usize, usize),
        eps: f32,
    ) -> Result<BufferId> {
        self.op(&Op::rows(RowOp::RmsNorm { eps }, rows, cols), &[x, gamma])
    }
    /// `C = A·B`, `A` `m × k`, `B` `k × n`, row-major.
    pub fn matmul(&mut self, a: BufferId, b: BufferId, m: usize, k: usize, n: usize) -> Result<BufferId> {
        self.op(&Op::matmul(m, k, n), &[a, b])
    }
    /// Matrix product with transposes and batch.
    pub fn matmul_spec(&mut self, spec: MatmulSpec, a: BufferId, b: BufferId) -> Result<BufferId> {
        self.op(&Op::Matmul(spec), &[a, b])
    }
    /// 2-D convolution, NCHW.
    pub fn conv2d(&mut self, spec: Conv2dSpec, x: BufferId, w: BufferId) -> Result<BufferId> {
        self.op(&Op::Conv2d(spec), &[x, w])
    }
    /// Fused attention `softmax(scale · q·kᵀ + mask) · v` (layouts and masks in
    /// [`AttentionSpec`]), into a new buffer shaped like `q`. The spec's dtype
    /// must be the buffers' (`f32` for buffers from [`GpuCommandBatch::upload`]).
    pub fn attention(&mut self, spec: AttentionSpec, q: BufferId, k: BufferId, v: BufferId) -> Result<BufferId> {
        self.op(&Op::Attention(spec), &[q, k, v])
    }

    /// Records every pending op into one command encoder and submits it once.
    /// Returns when the work is queued; nothing to do (no submission) when no op
    /// is pending. On error nothing is pending any more.
    pub fn execute(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let steps = std::mem::take(&mut self.pending);
        self.pending_ops = 0;
        encode::submit(&self.backend.ctx, &steps, "batch")?;
        self.submissions += 1;
        Ok(())
    }

    /// Executes pending ops (if any), then copies `f32` buffer `id` to the host
    /// and waits for it (a buffer of another dtype is a [`ComputeError::DType`] error).
    /// Native only (absent on wasm32: use [`read_async`](Self::read_async) there).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read(&mut self, id: BufferId) -> Result<Vec<f32>> {
        let t = self.get(id, "read")?.clone();
        self.execute()?;
        let mut out = vec![0.0f32; t.len()];
        self.backend.download(&t, &mut out)?;
        self.submissions += 1;
        Ok(out)
    }

    /// Like [`GpuCommandBatch::read`] without blocking (the browser's way; `f32` buffers).
    pub fn read_async(&mut self, id: BufferId) -> impl Future<Output = Result<Vec<f32>>> + use<> {
        let started = self.get(id, "read").cloned().and_then(|t| {
            self.execute()?;
            self.submissions += 1;
            Ok(self.backend.download_async(&t))
        });
        async move { started?.await }
    }
}
