//! The trait every backend implements, and the device-resident tensor handle.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use crate::error::{BackendKind, ComputeError, Result};
use crate::op::{BinaryOp, GeluForm, MatmulSpec, Op, ReduceOp, RowOp, UnaryOp};

/// Where a [`Tensor`] lives: the backend family and the device index within it
/// (0 for the first GPU; always 0 for the CPU).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Location {
    /// Backend family.
    pub backend: BackendKind,
    /// Device index within that backend (room for multi-GPU).
    pub device: u32,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.backend, self.device)
    }
}

/// Storage behind a [`Tensor`]; each backend has its own (a `Vec<f32>`, a wgpu
/// buffer, a CUDA allocation). Backends downcast it through [`TensorStorage::as_any`].
pub trait TensorStorage: Any + Send + Sync + fmt::Debug {
    /// Number of `f32` elements.
    fn len(&self) -> usize;
    /// Whether the storage holds no elements.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Where the data lives.
    fn location(&self) -> Location;
    /// For downcasting to the backend's concrete storage.
    fn as_any(&self) -> &dyn Any;
}

/// A flat `f32` buffer resident on one backend's device. Cheap to clone (shared
/// handle); freed when the last clone drops. Ops on tensors keep data on the
/// device: nothing crosses to the host until [`Backend::download`].
#[derive(Clone, Debug)]
pub struct Tensor {
    storage: Arc<dyn TensorStorage>,
}

impl Tensor {
    /// Wraps backend storage. Backends call this; users get tensors from [`Backend::upload`].
    pub fn from_storage(storage: Arc<dyn TensorStorage>) -> Self {
        Tensor { storage }
    }
    /// Number of `f32` elements.
    pub fn len(&self) -> usize {
        self.storage.len()
    }
    /// Whether the tensor holds no elements.
    pub fn is_empty(&self) -> bool {
        self.storage.is_empty()
    }
    /// Where the data lives.
    pub fn location(&self) -> Location {
        self.storage.location()
    }
    /// The backend's concrete storage, if it is of type `T`.
    pub fn storage<T: TensorStorage>(&self) -> Option<&T> {
        self.storage.as_any().downcast_ref::<T>()
    }
    /// Whether two handles share the same storage.
    pub fn same_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
    }
}

/// A compute backend: runs every [`Op`] on host slices, and on tensors kept on its device.
///
/// Contract, checked by the conformance suite for every implementation:
/// - Shapes are validated with [`Op::check`] before any data is touched; on any
///   error the output is left exactly as it was.
/// - Results match the float64 reference within the tolerances of
///   [`crate::conformance::tolerance`].
/// - Nothing panics: missing devices, driver failures and limits are typed errors.
pub trait Backend: Send + Sync {
    /// Backend family.
    fn kind(&self) -> BackendKind;

    /// Human-readable device description (e.g. `"CPU avx512 x2 threads"`, `"NVIDIA H200"`).
    fn device_name(&self) -> String;

    /// Whether this backend implements `op`. Unsupported ops return
    /// [`ComputeError::Unsupported`] from [`Backend::run`].
    fn supports(&self, op: &Op) -> bool {
        let _ = op;
        true
    }

    /// Runs `op` on host data. `inputs` are in the op's documented order; `output`
    /// has [`crate::Layout::output`] elements. GPU backends copy in and out.
    fn run(&self, op: &Op, inputs: &[&[f32]], output: &mut [f32]) -> Result<()>;

    /// Copies host data to a new tensor on this backend's device.
    fn upload(&self, data: &[f32]) -> Result<Tensor>;

    /// Allocates an uninitialised tensor of `len` elements on the device.
    fn alloc(&self, len: usize) -> Result<Tensor>;

    /// Copies a tensor back to the host. `out.len()` must equal `tensor.len()`.
    fn download(&self, tensor: &Tensor, out: &mut [f32]) -> Result<()>;

    /// Runs `op` on device-resident tensors, writing into `output` (which must not
    /// alias an input). May return before the device finishes; [`Backend::download`]
    /// and [`Backend::synchronize`] wait.
    fn run_tensors(&self, op: &Op, inputs: &[&Tensor], output: &Tensor) -> Result<()>;

    /// Waits until all work queued on the device has finished.
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    /// Readies what `ops` need ahead of their first calls, so those calls do
    /// not pay for it: a GPU backend compiles and loads their kernels.
    /// Optional: every call readies what
    /// it needs on first use anyway, and the default does nothing. Ops this
    /// backend does not support, or with invalid shapes, are skipped; driver
    /// and compile failures are returned.
    fn prepare(&self, ops: &[Op]) -> Result<()> {
        let _ = ops;
        Ok(())
    }
}

/// Checks the lengths of a host call against `op` (used by every backend first).
pub fn check_host_call(op: &Op, inputs: &[&[f32]], output: &[f32]) -> Result<crate::Layout> {
    let mut lens = [0usize; 3];
    if inputs.len() > lens.len() {
        return Err(ComputeError::shape(op.name(), format!("too many inputs: {}", inputs.len()), op.shapes()));
    }
    for (l, x) in lens.iter_mut().zip(inputs) {
        *l = x.len();
    }
    op.check(&lens[..inputs.len()], output.len())
}

/// Checks a tensor call: lengths match `op`, every tensor is at `location`, and the
/// output does not alias an input.
pub fn check_tensor_call(op: &Op, location: Location, inputs: &[&Tensor], output: &Tensor) -> Result<crate::Layout> {
    for t in inputs.iter().copied().chain(std::iter::once(output)) {
        if t.location() != location {
            return Err(ComputeError::WrongDevice {
                op: op.name(),
                expected: location.to_string(),
                found: t.location().to_string(),
            });
        }
    }
    if inputs.iter().any(|t| t.same_storage(output)) {
        return Err(ComputeError::shape(op.name(), "output tensor aliases an input", op.shapes()));
    }
    let mut lens = [0usize; 3];
    if inputs.len() > lens.len() {
        return Err(ComputeError::shape(op.name(), format!("too many inputs: {}", inputs.len()), op.shapes()));
    }
    for (l, x) in lens.iter_mut().zip(inputs) {
        *l = x.len();
    }
    op.check(&lens[..inputs.len()], output.len())
}

/// Named methods for every op, on any [`Backend`]: `backend.relu(&x, &mut out)`.
/// Each builds the [`Op`] and calls [`Backend::run`]; the cost is that of the op.
pub trait Ops: Backend {
    /// Applies a unary element-wise op.
    fn unary(&self, op: UnaryOp, x: &[f32], out: &mut [f32]) -> Result<()> {
        self.run(&Op::unary(op, out.len()), &[x], out)
    }
    /// `max(x, 0)`.
    fn relu(&self, x: &[f32], out: &mut [f32]) -> Result<()> {
        self.unary(UnaryOp::Relu, x, out)
    }
    /// Leaky ReLU with slope `alpha`.
    fn leaky_relu(&self, x: &[f32], alpha: f32, out: &mut [f32]) -> Result<()> {
        self.unary(UnaryOp::LeakyRelu { alpha }, x, out)
    }
    /// ELU with scale `alpha`.
    fn elu(&self, x: &[f32], alpha: f32, out: &mut [f32]) -> Result<()> {
        self.unary(UnaryOp::Elu { alpha }, x, out)
    }
    /// Logistic sigmoid.
    fn sigmoid(&self, x: &[f32], out: &mut [f32]) -> Result<()> {
        self.unary(UnaryOp::Sigmoid, x, out)
    }
    /// Hyperbolic tangent.
    fn tanh(&self, x: &[f32], out: &mut [f32]) -> Result<()> {
        self.unary(UnaryOp::Tanh, x, out)
    }
    /// Swish / SiLU.
    fn swish(&self, x: &[f32], out: &mut [f32]) -> Result<()> {
        self.unary(UnaryOp::Swish, x, out)
    }
    /// GELU, tanh approximation.
    fn gelu(&self, x: &[f32], out: &mut [f32]) -> Result<()> {
        self.unary(UnaryOp::Gelu(GeluForm::Tanh), x, out)
    }
    /// GELU, exact erf form.
    fn gelu_erf(&self, x: &[f32], out: &mut [f32]) -> Result<()> {
        self.unary(UnaryOp::Gelu(GeluForm::Erf), x, out)
    }
    /// Clamp to `[min, max]`.
    fn clip(&self, x: &[f32], min: f32, max: f32, out: &mut [f32]) -> Result<()> {
        self.unary(UnaryOp::Clip { min, max }, x, out)
    }
    /// Multiply by `s`.
    fn scale(&self, x: &[f32], s: f32, out: &mut [f32]) -> Result<()> {
        self.unary(UnaryOp::Scale { s }, x, out)
    }
    /// `a + b`.
    fn add(&self, a: &[f32], b: &[f32], out: &mut [f32]) -> Result<()> {
        self.run(&Op::binary(BinaryOp::Add, out.len()), &[a, b], out)
    }
    /// `a − b`.
    fn sub(&self, a: &[f32], b: &[f32], out: &mut [f32]) -> Result<()> {
        self.run(&Op::binary(BinaryOp::Sub, out.len()), &[a, b], out)
    }
    /// `a · b`, element-wise.
    fn mul(&self, a: &[f32], b: &[f32], out: &mut [f32]) -> Result<()> {
        self.run(&Op::binary(BinaryOp::Mul, out.len()), &[a, b], out)
    }
    /// `Σ aᵢ·bᵢ`.
    fn dot(&self, a: &[f32], b: &[f32]) -> Result<f32> {
        let mut out = [0.0];
        self.run(&Op::Dot { len: a.len() }, &[a, b], &mut out)?;
        Ok(out[0])
    }
    /// Sum of all elements.
    fn sum(&self, x: &[f32]) -> Result<f32> {
        let mut out = [0.0];
        self.run(&Op::Reduce { op: ReduceOp::Sum, len: x.len() }, &[x], &mut out)?;
        Ok(out[0])
    }
    /// Largest element (NaN if any is NaN).
    fn max(&self, x: &[f32]) -> Result<f32> {
        let mut out = [0.0];
        self.run(&Op::Reduce { op: ReduceOp::Max, len: x.len() }, &[x], &mut out)?;
        Ok(out[0])
    }
    /// Row-wise softmax of a `rows × cols` matrix.
    fn softmax(&self, x: &[f32], rows: usize, cols: usize, out: &mut [f32]) -> Result<()> {
        self.run(&Op::rows(RowOp::Softmax, rows, cols), &[x], out)
    }
    /// Row-wise log-softmax.
    fn log_softmax(&self, x: &[f32], rows: usize, cols: usize, out: &mut [f32]) -> Result<()> {
        self.run(&Op::rows(RowOp::LogSoftmax, rows, cols), &[x], out)
    }
    /// Row-wise layer norm with per-column `gamma`, `beta`.
    #[allow(clippy::too_many_arguments)]
    fn layer_norm(
        &self,
        x: &[f32],
        gamma: &[f32],
        beta: &[f32],
        rows: usize,
        cols: usize,
        eps: f32,
        out: &mut [f32],
    ) -> Result<()> {
        self.run(&Op::rows(RowOp::LayerNorm { eps }, rows, cols), &[x, gamma, beta], out)
    }
    /// Row-wise RMS norm with per-column `gamma`.
    fn rms_norm(&self, x: &[f32], gamma: &[f32], rows: usize, cols: usize, eps: f32, out: &mut [f32]) -> Result<()> {
        self.run(&Op::rows(RowOp::RmsNorm { eps }, rows, cols), &[x, gamma], out)
    }
    /// `C = A·B` with `A` `m × k`, `B` `k × n`, `C` `m × n`, row-major.
    fn matmul(&self, a: &[f32], b: &[f32], out: &mut [f32], m: usize, k: usize, n: usize) -> Result<()> {
        self.run(&Op::matmul(m, k, n), &[a, b], out)
    }
    /// Matrix product with the full [`MatmulSpec`] (transposes, batch).
    fn matmul_spec(&self, spec: MatmulSpec, a: &[f32], b: &[f32], out: &mut [f32]) -> Result<()> {
        self.run(&Op::Matmul(spec), &[a, b], out)
    }
}

impl<B: Backend + ?Sized> Ops for B {}
