//! The trait every backend implements, and the device-resident tensor handle.

use std::any::Any;
use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use crate::attention::AttentionSpec;
use crate::dtype::{DType, Element};
use crate::error::{BackendKind, ComputeError, Result};
use crate::host::{Blocks, BlocksMut, HostSlice, HostSliceMut};
use crate::op::{BinaryOp, GeluForm, MatmulSpec, Op, Operand, QuantMatmulSpec, ReduceOp, RowOp, UnaryOp};
use crate::pinned::{PinnedF32, PinnedWords, download_pinned_via_host, upload_pinned_via_host};

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

/// Storage behind a [`Tensor`]; each backend has its own (host memory, a wgpu
/// buffer, a CUDA allocation). Backends downcast it through [`TensorStorage::as_any`].
pub trait TensorStorage: Any + Send + Sync + fmt::Debug {
    /// Number of elements.
    fn len(&self) -> usize;
    /// Whether the storage holds no elements.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Dtype of the elements.
    fn dtype(&self) -> DType;
    /// Where the data lives.
    fn location(&self) -> Location;
    /// For downcasting to the backend's concrete storage.
    fn as_any(&self) -> &dyn Any;
}

/// A flat buffer of one dtype resident on one backend's device. Cheap to clone
/// (shared handle); freed when the last clone drops. Ops on tensors keep data
/// on the device: nothing crosses to the host until [`Backend::download`].
#[derive(Clone, Debug)]
pub struct Tensor {
    storage: Arc<dyn TensorStorage>,
}

impl Tensor {
    /// Wraps backend storage. Backends call this; users get tensors from [`Backend::upload`].
    pub fn from_storage(storage: Arc<dyn TensorStorage>) -> Self {
        Tensor { storage }
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.storage.len()
    }
    /// Whether the tensor holds no elements.
    pub fn is_empty(&self) -> bool {
        self.storage.is_empty()
    }
    /// Dtype of the elements.
    pub fn dtype(&self) -> DType {
        self.storage.dtype()
    }
    /// Its length and dtype, as an op's [`crate::Layout`] states them.
    pub fn operand(&self) -> Operand {
        Operand { len: self.len(), dtype: self.dtype() }
    }
    /// Size of the data in bytes.
    pub fn size_in_bytes(&self) -> u64 {
        self.operand().bytes()
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
/// Host data of any dtype crosses the trait as typed views ([`HostSlice`],
/// [`HostSliceMut`]); a backend implements the `_typed` methods, and the
/// `f32` methods ([`Backend::run`], [`Backend::upload`], [`Backend::alloc`],
/// [`Backend::download`]) wrap them at no cost.
///
/// Contract, checked by the conformance suite for every implementation:
/// - Lengths and dtypes are validated ([`check_host_call`],
///   [`check_tensor_call`]) before any data is touched; on any error the
///   output is left exactly as it was.
/// - Results match the float64 reference within the tolerances of
///   [`crate::conformance::tolerance`].
/// - Nothing panics: missing devices, driver failures, limits and dtypes the
///   backend cannot do are typed errors.
pub trait Backend: Send + Sync {
    /// Backend family.
    fn kind(&self) -> BackendKind;

    /// Human-readable device description (e.g. `"CPU avx512 x2 threads"`, `"NVIDIA H200"`).
    fn device_name(&self) -> String;

    /// Whether this backend implements `op` at its dtypes. Unsupported ops
    /// return [`ComputeError::Unsupported`] or [`ComputeError::UnsupportedDType`]
    /// from [`Backend::run_typed`].
    fn supports(&self, op: &Op) -> bool {
        let _ = op;
        true
    }

    /// Runs `op` on host data of any dtype. `inputs` are in the op's
    /// documented order; each input and `output` has the length and dtype of
    /// the op's [`crate::Layout`]. GPU backends copy in and out.
    fn run_typed(&self, op: &Op, inputs: &[HostSlice<'_>], output: HostSliceMut<'_>) -> Result<()>;

    /// Runs an `f32` op on `f32` host data: [`Backend::run_typed`] without
    /// allocating.
    fn run(&self, op: &Op, inputs: &[&[f32]], output: &mut [f32]) -> Result<()> {
        with_f32_views(inputs, |views| self.run_typed(op, views, HostSliceMut::F32(output)))
    }

    /// Copies host data of any dtype to a new tensor on this backend's device.
    fn upload_typed(&self, data: HostSlice<'_>) -> Result<Tensor>;

    /// Copies `f32` host data to a new tensor on this backend's device.
    fn upload(&self, data: &[f32]) -> Result<Tensor> {
        self.upload_typed(HostSlice::F32(data))
    }

    /// Copies host data into an existing tensor of the same length
    /// ([`ComputeError::Shape`] otherwise) and dtype ([`ComputeError::DType`]),
    /// in order with the tensor calls queued before and after it: how a
    /// caller feeds new inputs to a [`Recording`]. The default uploads a new
    /// tensor and copies it over on the device; backends override it with a
    /// direct copy.
    fn upload_into(&self, data: HostSlice<'_>, tensor: &Tensor) -> Result<()> {
        check_upload(&data, tensor)?;
        let n = data.len();
        let whole = crate::Strided::contiguous([1, 1, n]);
        let op = Op::Copy(crate::CopySpec::new([1, 1, n], whole, whole).with_dtype(data.dtype()));
        let src = self.upload_typed(data)?;
        self.run_tensors(&op, &[&src], tensor)
    }

    /// Copies the concatenation of host `parts` (all of the tensor's dtype,
    /// their lengths summing to its length: [`ComputeError::DType`] and
    /// [`ComputeError::Shape`] otherwise) into an existing tensor, as
    /// [`Backend::upload_into`] does with one slice: how many requests'
    /// rows become one stacked operand without first being copied into one
    /// host vector. The default concatenates them on the host and
    /// calls `upload_into`; the CUDA backend gathers them into its pinned
    /// staging buffer and makes one transfer when they fit.
    fn upload_parts_into(&self, parts: &[HostSlice<'_>], tensor: &Tensor) -> Result<()> {
        check_parts(parts, tensor)?;
        if let [one] = parts {
            return self.upload_into(*one, tensor);
        }
        let owned: Vec<crate::HostVec> = parts.iter().map(HostSlice::to_vec).collect();
        let all = crate::HostVec::concat(&owned).unwrap_or_else(|| crate::HostVec::zeros(tensor.dtype(), 0));
        self.upload_into(all.as_slice(), tensor)
    }

    /// `len` words of host memory that this backend's device copies from
    /// directly, for [`Backend::upload_pinned_parts`] (page-locked on CUDA:
    /// allocating it costs a driver call, about a millisecond for a few
    /// MiB; keep and reuse it). `Ok(None)` (the default): this backend has
    /// no such memory, and a transfer from host memory costs the same from
    /// any buffer.
    fn alloc_pinned_words(&self, len: usize) -> Result<Option<PinnedWords>> {
        let _ = len;
        Ok(None)
    }

    /// `len` `f32` values of host memory that this backend's device copies
    /// into directly, for [`Backend::download_pinned`]; as
    /// [`Backend::alloc_pinned_words`], `Ok(None)` by default.
    fn alloc_pinned_f32(&self, len: usize) -> Result<Option<PinnedF32>> {
        let _ = len;
        Ok(None)
    }

    /// Copies the words of `parts` (each a buffer and a range of its words),
    /// one after the other, into `tensor`, whose bytes they must fill
    /// exactly ([`ComputeError::Shape`] otherwise): how rows that many
    /// threads wrote into shared host memory reach the device in one transfer
    /// per contiguous part. In order with the tensor calls queued before and
    /// after it, and it may return before the copy is done: the words must
    /// keep their values until the next [`Backend::synchronize`] or download.
    /// The default gathers the words into host memory and calls
    /// [`Backend::upload_into`]; the CUDA backend copies from its page-locked
    /// memory with one asynchronous transfer per part.
    fn upload_pinned_parts(&self, parts: &[(&PinnedWords, Range<usize>)], tensor: &Tensor) -> Result<()> {
        upload_pinned_via_host(self, parts, tensor)
    }

    /// Copies the `f32` tensors, one after the other, into `dst` from value
    /// `at` on ([`ComputeError::DType`] or [`ComputeError::Shape`] when they
    /// are not `f32` or do not fit), and waits for the copies and the work
    /// queued before them. The default downloads each tensor; the CUDA
    /// backend copies straight into its page-locked memory and waits once.
    fn download_pinned(&self, tensors: &[&Tensor], dst: &mut PinnedF32, at: usize) -> Result<()> {
        download_pinned_via_host(self, tensors, dst, at)
    }

    /// Allocates a tensor of `len` elements of `dtype` on the device (zeroed
    /// on the CPU, uninitialised elsewhere).
    fn alloc_typed(&self, len: usize, dtype: DType) -> Result<Tensor>;

    /// Allocates an `f32` tensor of `len` elements on the device.
    fn alloc(&self, len: usize) -> Result<Tensor> {
        self.alloc_typed(len, DType::F32)
    }

    /// Copies a tensor back to the host. `out` must have the tensor's length
    /// ([`ComputeError::Shape`] otherwise) and dtype ([`ComputeError::DType`]).
    fn download_typed(&self, tensor: &Tensor, out: HostSliceMut<'_>) -> Result<()>;

    /// Copies an `f32` tensor back to the host. `out.len()` must equal `tensor.len()`.
    fn download(&self, tensor: &Tensor, out: &mut [f32]) -> Result<()> {
        self.download_typed(tensor, HostSliceMut::F32(out))
    }

    /// Runs `op` on device-resident tensors, writing into `output` (which must not
    /// alias an input). May return before the device finishes; [`Backend::download`]
    /// and [`Backend::synchronize`] wait.
    fn run_tensors(&self, op: &Op, inputs: &[&Tensor], output: &Tensor) -> Result<()>;

    /// Waits until all work queued on the device has finished.
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    /// Records the tensor calls that `body` makes on this backend, without
    /// running them, as one [`Recording`] that replays them all in a single
    /// launch (on CUDA, a graph: the host's cost per call is gone, and so are
    /// most of the gaps between small kernels).
    ///
    /// `Ok(None)`: this backend does not record (the default: the CPU, wgpu)
    /// and `body` was not called; the caller runs its calls directly. While
    /// recording, `body` may only queue [`Backend::run_tensors`] calls on
    /// tensors that outlive the recording: a host transfer or a wait inside
    /// it is an error, and so is any error `body` returns, after which nothing
    /// is recorded. Run `body` once directly before recording it, so that
    /// kernels are compiled and buffers allocated outside the recording.
    /// Replays read and write the recorded tensors: new inputs go in with
    /// [`Backend::upload_into`], and values that change between replays
    /// (positions) must be tensors, never op parameters.
    fn record(&self, body: &mut dyn FnMut() -> Result<()>) -> Result<Option<Box<dyn Recording>>> {
        let _ = body;
        Ok(None)
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

/// Tensor calls recorded by [`Backend::record`], replayed as one launch.
pub trait Recording: Send + Sync {
    /// Queues every recorded call again, on the tensors it was recorded with,
    /// in order after the work already queued. Costs one launch (a few
    /// microseconds on CUDA) whatever the number of calls; like
    /// [`Backend::run_tensors`], it may return before the device finishes.
    fn replay(&self) -> Result<()>;
}

/// Checks that `data` fits `tensor` for [`Backend::upload_into`]: same
/// length ([`ComputeError::Shape`]) and dtype ([`ComputeError::DType`]).
pub fn check_upload(data: &HostSlice<'_>, tensor: &Tensor) -> Result<()> {
    check_same(("upload_into", "data"), tensor, data.operand())
}

/// Checks that `parts` fill `tensor` for [`Backend::upload_parts_into`]: each
/// of its dtype ([`ComputeError::DType`]), their lengths summing to its length
/// ([`ComputeError::Shape`]). Free.
pub fn check_parts(parts: &[HostSlice<'_>], tensor: &Tensor) -> Result<()> {
    if let Some(p) = parts.iter().find(|p| p.dtype() != tensor.dtype()) {
        return Err(ComputeError::DType {
            op: "upload_parts_into",
            detail: format!("a part is {}, the tensor {}", p.dtype(), tensor.dtype()),
            shapes: format!("tensor=[{}] {}", tensor.len(), tensor.dtype()),
        });
    }
    let total = parts.iter().try_fold(0usize, |a, p| a.checked_add(p.len()));
    if total != Some(tensor.len()) {
        return Err(ComputeError::shape(
            "upload_parts_into",
            format!(
                "the parts hold {} elements, the tensor {}",
                total.map_or("too many".into(), |t| t.to_string()),
                tensor.len()
            ),
            format!("tensor=[{}] parts={}", tensor.len(), parts.len()),
        ));
    }
    Ok(())
}

/// Checks that host memory (`host`: its length and dtype) has `tensor`'s
/// length and dtype, for the transfer `what.0`, naming the host side `what.1`.
fn check_same((op, side): (&'static str, &str), tensor: &Tensor, host: Operand) -> Result<()> {
    if tensor.len() != host.len {
        return Err(ComputeError::shape(
            op,
            format!("tensor has {} elements, {side} {}", tensor.len(), host.len),
            format!("tensor=[{}] {side}=[{}]", tensor.len(), host.len),
        ));
    }
    if tensor.dtype() != host.dtype {
        return Err(ComputeError::DType {
            op,
            detail: format!("the {side} is {}, the tensor {}", host.dtype, tensor.dtype()),
            shapes: format!("tensor=[{}] {}", tensor.len(), tensor.dtype()),
        });
    }
    Ok(())
}

/// Up to this many inputs are viewed on the stack by the `f32` wrappers.
const STACK_VIEWS: usize = 6;

/// Calls `f` with `f32` `inputs` as typed views, without allocating for up
/// to six (how the `f32` wrappers reach the `_typed` methods).
pub fn with_f32_views<'a, R>(inputs: &[&'a [f32]], f: impl FnOnce(&[HostSlice<'a>]) -> R) -> R {
    if inputs.len() <= STACK_VIEWS {
        let mut buf = [HostSlice::F32(&[]); STACK_VIEWS];
        for (b, x) in buf.iter_mut().zip(inputs) {
            *b = HostSlice::F32(x);
        }
        f(&buf[..inputs.len()])
    } else {
        let views: Vec<HostSlice<'a>> = inputs.iter().map(|x| HostSlice::F32(x)).collect();
        f(&views)
    }
}

/// Checks the lengths and dtypes of a host call against `op` (every backend
/// calls this first). Allocates nothing for up to six operands.
pub fn check_host_call(op: &Op, inputs: &[HostSlice<'_>], output: &HostSliceMut<'_>) -> Result<crate::Layout> {
    op.check_with(inputs.len(), |i| inputs[i].operand(), output.operand())
}

/// Checks a tensor call: lengths and dtypes match `op`, every tensor is at
/// `location`, and the output does not alias an input.
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
    op.check_with(inputs.len(), |i| inputs[i].operand(), output.operand())
}

/// Checks that a download of `tensor` into `out` fits: same length
/// ([`ComputeError::Shape`]) and dtype ([`ComputeError::DType`]).
pub fn check_download(tensor: &Tensor, out: &HostSliceMut<'_>) -> Result<()> {
    check_same(("download", "buffer"), tensor, out.operand())
}

/// Named methods for every op, on any [`Backend`] and any [`Element`] type:
/// `backend.relu(&x, &mut out)` with `x` and `out` of `f32`, `f16` or `bf16`.
/// Each builds the [`Op`] at `T`'s dtype and calls [`Backend::run_typed`];
/// the cost is that of the op. Reductions return `f32` for every `T`.
///
/// Rust's float literals default to `f64`, which is not an [`Element`]: a call
/// whose only float types are literals needs one annotation
/// (`cpu.relu(&[-1.0f32, 2.0], &mut out)`).
pub trait Ops: Backend {
    /// Applies a unary element-wise op.
    fn unary<T: Element>(&self, op: UnaryOp, x: &[T], out: &mut [T]) -> Result<()> {
        self.run_typed(&Op::unary(op, out.len()).with_dtype(T::DTYPE), &[x.into()], out.into())
    }
    /// `max(x, 0)`.
    fn relu<T: Element>(&self, x: &[T], out: &mut [T]) -> Result<()> {
        self.unary(UnaryOp::Relu, x, out)
    }
    /// Leaky ReLU with slope `alpha`.
    fn leaky_relu<T: Element>(&self, x: &[T], alpha: f32, out: &mut [T]) -> Result<()> {
        self.unary(UnaryOp::LeakyRelu { alpha }, x, out)
    }
    /// ELU with scale `alpha`.
    fn elu<T: Element>(&self, x: &[T], alpha: f32, out: &mut [T]) -> Result<()> {
        self.unary(UnaryOp::Elu { alpha }, x, out)
    }
    /// Logistic sigmoid.
    fn sigmoid<T: Element>(&self, x: &[T], out: &mut [T]) -> Result<()> {
        self.unary(UnaryOp::Sigmoid, x, out)
    }
    /// Hyperbolic tangent.
    fn tanh<T: Element>(&self, x: &[T], out: &mut [T]) -> Result<()> {
        self.unary(UnaryOp::Tanh, x, out)
    }
    /// Swish / SiLU.
    fn swish<T: Element>(&self, x: &[T], out: &mut [T]) -> Result<()> {
        self.unary(UnaryOp::Swish, x, out)
    }
    /// GELU, tanh approximation.
    fn gelu<T: Element>(&self, x: &[T], out: &mut [T]) -> Result<()> {
        self.unary(UnaryOp::Gelu(GeluForm::Tanh), x, out)
    }
    /// GELU, exact erf form.
    fn gelu_erf<T: Element>(&self, x: &[T], out: &mut [T]) -> Result<()> {
        self.unary(UnaryOp::Gelu(GeluForm::Erf), x, out)
    }
    /// Clamp to `[min, max]`.
    fn clip<T: Element>(&self, x: &[T], min: f32, max: f32, out: &mut [T]) -> Result<()> {
        self.unary(UnaryOp::Clip { min, max }, x, out)
    }
    /// Multiply by `s`.
    fn scale<T: Element>(&self, x: &[T], s: f32, out: &mut [T]) -> Result<()> {
        self.unary(UnaryOp::Scale { s }, x, out)
    }
    /// Applies a binary element-wise op.
    fn binary<T: Element>(&self, op: BinaryOp, a: &[T], b: &[T], out: &mut [T]) -> Result<()> {
        self.run_typed(&Op::binary(op, out.len()).with_dtype(T::DTYPE), &[a.into(), b.into()], out.into())
    }
    /// `a + b`.
    fn add<T: Element>(&self, a: &[T], b: &[T], out: &mut [T]) -> Result<()> {
        self.binary(BinaryOp::Add, a, b, out)
    }
    /// `a − b`.
    fn sub<T: Element>(&self, a: &[T], b: &[T], out: &mut [T]) -> Result<()> {
        self.binary(BinaryOp::Sub, a, b, out)
    }
    /// `a · b`, element-wise.
    fn mul<T: Element>(&self, a: &[T], b: &[T], out: &mut [T]) -> Result<()> {
        self.binary(BinaryOp::Mul, a, b, out)
    }
    /// `Σ aᵢ·bᵢ`, accumulated in `f32`.
    fn dot<T: Element>(&self, a: &[T], b: &[T]) -> Result<f32> {
        let mut out = [0.0f32];
        self.run_typed(&Op::dot(a.len()).with_dtype(T::DTYPE), &[a.into(), b.into()], (&mut out[..]).into())?;
        Ok(out[0])
    }
    /// A reduction of all elements to one `f32` value.
    fn reduce<T: Element>(&self, op: ReduceOp, x: &[T]) -> Result<f32> {
        let mut out = [0.0f32];
        self.run_typed(&Op::reduce(op, x.len()).with_dtype(T::DTYPE), &[x.into()], (&mut out[..]).into())?;
        Ok(out[0])
    }
    /// Sum of all elements, accumulated in `f32`.
    fn sum<T: Element>(&self, x: &[T]) -> Result<f32> {
        self.reduce(ReduceOp::Sum, x)
    }
    /// Largest element (NaN if any is NaN).
    fn max<T: Element>(&self, x: &[T]) -> Result<f32> {
        self.reduce(ReduceOp::Max, x)
    }
    /// Applies a row-wise op to a `rows × cols` matrix; `params` are the op's
    /// parameter vectors (none, `gamma`, or `gamma` and `beta`).
    fn row_op<T: Element>(
        &self,
        op: RowOp,
        x: &[T],
        params: &[&[T]],
        rows: usize,
        cols: usize,
        out: &mut [T],
    ) -> Result<()> {
        let op = Op::rows(op, rows, cols).with_dtype(T::DTYPE);
        match params {
            [] => self.run_typed(&op, &[x.into()], out.into()),
            [g] => self.run_typed(&op, &[x.into(), (*g).into()], out.into()),
            [g, b] => self.run_typed(&op, &[x.into(), (*g).into(), (*b).into()], out.into()),
            _ => Err(ComputeError::shape(op.name(), format!("{} parameter vectors", params.len()), op.shapes())),
        }
    }
    /// Row-wise softmax of a `rows × cols` matrix.
    fn softmax<T: Element>(&self, x: &[T], rows: usize, cols: usize, out: &mut [T]) -> Result<()> {
        self.row_op(RowOp::Softmax, x, &[], rows, cols, out)
    }
    /// Row-wise log-softmax.
    fn log_softmax<T: Element>(&self, x: &[T], rows: usize, cols: usize, out: &mut [T]) -> Result<()> {
        self.row_op(RowOp::LogSoftmax, x, &[], rows, cols, out)
    }
    /// Row-wise layer norm with per-column `gamma`, `beta`.
    #[allow(clippy::too_many_arguments)]
    fn layer_norm<T: Element>(
        &self,
        x: &[T],
        gamma: &[T],
        beta: &[T],
        rows: usize,
        cols: usize,
        eps: f32,
        out: &mut [T],
    ) -> Result<()> {
        self.row_op(RowOp::LayerNorm { eps }, x, &[gamma, beta], rows, cols, out)
    }
    /// Row-wise RMS norm with per-column `gamma`.
    fn rms_norm<T: Element>(
        &self,
        x: &[T],
        gamma: &[T],
        rows: usize,
        cols: usize,
        eps: f32,
        out: &mut [T],
    ) -> Result<()> {
        self.row_op(RowOp::RmsNorm { eps }, x, &[gamma], rows, cols, out)
    }
    /// `a + t·(b − a)`, element-wise ([`Op::Lerp`]: `t` finite, exact at
    /// `t = 0` and `t = 1`, error at most `2⁻²⁴·|r| + 2⁻²²·min(|t|, |1 − t|)·|b − a|`
    /// before rounding to `T`). One read of `a` and `b`, one write of `out`.
    fn lerp<T: Element>(&self, a: &[T], b: &[T], t: f32, out: &mut [T]) -> Result<()> {
        self.run_typed(&Op::lerp(out.len(), t).with_dtype(T::DTYPE), &[a.into(), b.into()], out.into())
    }
    /// Spherical linear interpolation of the rows of `a` and `b` (`rows × cols`
    /// each) with `t` in `[0, 1]`: the angle from the normalised rows, the
    /// given rows interpolated; zero and near-(anti)parallel rows fall back to
    /// lerp ([`Op::Slerp`] lists every case). Two passes over each row.
    fn slerp<T: Element>(&self, a: &[T], b: &[T], rows: usize, cols: usize, t: f32, out: &mut [T]) -> Result<()> {
        self.run_typed(&Op::slerp(rows, cols, t).with_dtype(T::DTYPE), &[a.into(), b.into()], out.into())
    }
    /// `C = A·B` with `A` `m × k`, `B` `k × n`, `C` `m × n`, row-major, all of
    /// `T`, accumulated in `f32`.
    fn matmul<T: Element>(&self, a: &[T], b: &[T], out: &mut [T], m: usize, k: usize, n: usize) -> Result<()> {
        self.matmul_spec(MatmulSpec::new(m, k, n).with_dtypes(T::DTYPE, T::DTYPE), a, b, out)
    }
    /// Matrix product with the full [`MatmulSpec`] (transposes, batch,
    /// dtypes, precision). `T` and `U` must be the spec's input and output
    /// dtypes ([`ComputeError::DType`] otherwise).
    fn matmul_spec<T: Element, U: Element>(&self, spec: MatmulSpec, a: &[T], b: &[T], out: &mut [U]) -> Result<()> {
        self.run_typed(&Op::Matmul(spec), &[a.into(), b.into()], out.into())
    }
    /// Fused attention `out = softmax(scale·q·kᵀ + mask)·v` (layouts, masks
    /// and grouped-query heads in [`AttentionSpec`]), on data of `T`: the
    /// spec's dtype is taken from `T`. Costs `4·d` FLOPs per visible
    /// (query, key) pair and one read of `q`, `k`, `v`; no `seq_q × seq_k`
    /// buffer is allocated.
    fn attention<T: Element>(&self, spec: AttentionSpec, q: &[T], k: &[T], v: &[T], out: &mut [T]) -> Result<()> {
        self.run_typed(&Op::Attention(spec.with_dtype(T::DTYPE)), &[q.into(), k.into(), v.into()], out.into())
    }
    /// Converts `x` into `out`'s type (round to nearest even; NaN stays NaN).
    fn cast<T: Element, U: Element>(&self, x: &[T], out: &mut [U]) -> Result<()> {
        self.run_typed(&Op::cast(out.len(), T::DTYPE, U::DTYPE), &[x.into()], out.into())
    }
    /// `y = x · Wᵀ` with a block-quantized weight ([`Op::QuantMatmul`]):
    /// `x` is `m × k` of `T`, `w` holds `n` rows of `k` values (a GGUF
    /// linear layer's weight, e.g. from
    /// [`Gguf::tensor_blocks`](crate::gguf::Gguf::tensor_blocks)), `y` is
    /// `m × n` of `U`. Costs `2·m·k·n` FLOPs and one read of the blocks (for
    /// a single row, bound by their bytes); the error bound is the op's.
    fn quant_matmul<T: Element, U: Element>(
        &self,
        x: &[T],
        w: Blocks<'_>,
        y: &mut [U],
        m: usize,
        k: usize,
        n: usize,
    ) -> Result<()> {
        let spec = QuantMatmulSpec::new(m, k, n, w.dtype()).with_dtypes(T::DTYPE, U::DTYPE);
        self.run_typed(&Op::QuantMatmul(spec), &[x.into(), HostSlice::Blocks(w)], y.into())
    }
    /// Quantizes `x` into the blocks of `out` as ggml's reference quantizer
    /// does, bit for bit (a [`Op::Cast`] into `out`'s dtype; `x.len()` a
    /// whole number of blocks). CPU work: a few hundred FLOPs a value.
    fn quantize<T: Element>(&self, x: &[T], out: BlocksMut<'_>) -> Result<()> {
        let op = Op::cast(x.len(), T::DTYPE, out.dtype());
        self.run_typed(&op, &[x.into()], HostSliceMut::Blocks(out))
    }
    /// Dequantizes the blocks `w` into `out` exactly as ggml does (rounded
    /// once into `f16`/`bf16`): a [`Op::Cast`] from `w`'s dtype. One pass.
    fn dequantize<U: Element>(&self, w: Blocks<'_>, out: &mut [U]) -> Result<()> {
        let op = Op::cast(w.len(), w.dtype(), U::DTYPE);
        self.run_typed(&op, &[HostSlice::Blocks(w)], out.into())
    }
}

impl<B: Backend + ?Sized> Ops for B {}
