//! [`AsyncOps`]: every named op of [`Ops`](crate::Ops) as a future, for callers
//! that must not block — the browser above all, where WebGPU hands results back
//! only through the event loop — and for async code on native.
//!
//! These are the trueno-compatible async names: `device.relu_async(&x, &mut
//! out).await`, `device.matmul_async(&a, &b, &mut c, m, k, n).await`,
//! `device.dot_async(&a, &b).await`. A backend implements one method,
//! [`AsyncOps::run_async_into`]; every named op is built on it. The wgpu backend
//! implements it without blocking; the CPU and CUDA backends, whose calls
//! finish before they return, take the default: a future that is ready at once.

use std::future::Future;

use crate::dtype::Element;
use crate::error::Result;
use crate::host::{HostSlice, HostSliceMut};
use crate::op::{BinaryOp, GeluForm, MatmulSpec, Op, ReduceOp, RowOp, UnaryOp};

/// Every op of the vocabulary as a future that writes its result into the
/// caller's slice, for every [`Element`] type. On error the output is left untouched, as with [`Ops`](crate::Ops).
///
/// The futures borrow their inputs and output until they resolve; they are not
/// required to be `Send` (the browser's are not). Each costs what the op costs
/// on the backend, plus, on wgpu, one copy of the output from the read-back
/// buffer.
pub trait AsyncOps: crate::Backend {
    /// Runs `op` on host slices of any dtype; resolves once `output` holds the result.
    /// Validation errors (lengths, sizes) resolve at the first poll and leave
    /// `output` untouched.
    ///
    /// The default suits a backend whose calls finish before they return (the
    /// CPU, CUDA): it runs `op` through [`Backend::run_typed`](crate::Backend::run_typed) at
    /// the first poll, and the future is ready at once. A backend that can wait
    /// without blocking (wgpu) overrides it.
    fn run_async_into<'a>(
        &'a self,
        op: Op,
        inputs: &'a [HostSlice<'a>],
        output: HostSliceMut<'a>,
    ) -> impl Future<Output = Result<()>> + 'a {
        async move { self.run_typed(&op, inputs, output) }
    }

    /// Copies `tensor` into `out` (its length and dtype) once the work that
    /// writes it has finished; errors as [`Backend::download_typed`](crate::Backend::download_typed),
    /// with `out` untouched. The default (CPU, CUDA) runs the blocking download
    /// at the first poll; wgpu overrides it to wait without blocking (the
    /// browser's way to read a device tensor). Costs one copy of the tensor.
    fn download_async_into<'a>(
        &'a self,
        tensor: &'a crate::Tensor,
        out: HostSliceMut<'a>,
    ) -> impl Future<Output = Result<()>> + 'a {
        async move { self.download_typed(tensor, out) }
    }

    /// Applies a unary element-wise op.
    fn unary_async<'a, T: Element>(
        &'a self,
        op: UnaryOp,
        x: &'a [T],
        out: &'a mut [T],
    ) -> impl Future<Output = Result<()>> + 'a {
        async move { self.run_async_into(Op::unary(op, out.len()).with_dtype(T::DTYPE), &[x.into()], out.into()).await }
    }
    /// `max(x, 0)`.
    fn relu_async<'a, T: Element>(&'a self, x: &'a [T], out: &'a mut [T]) -> impl Future<Output = Result<()>> + 'a {
        self.unary_async(UnaryOp::Relu, x, out)
    }
    /// Leaky ReLU with slope `alpha`.
    fn leaky_relu_async<'a, T: Element>(
        &'a self,
        x: &'a [T],
        alpha: f32,
        out: &'a mut [T],
    ) -> impl Future<Output = Result<()>> + 'a {
        self.unary_async(UnaryOp::LeakyRelu { alpha }, x, out)
    }
    /// ELU with scale `alpha`.
    fn elu_async<'a, T: Element>(
        &'a self,
        x: &'a [T],
        alpha: f32,
        out: &'a mut [T],
    ) -> impl Future<Output = Result<()>> + 'a {
        self.unary_async(UnaryOp::Elu { alpha }, x, out)
    }
    /// Logistic sigmoid.
    fn sigmoid_async<'a, T: Element>(&'a self, x: &'a [T], out: &'a mut [T]) -> impl Future<Output = Result<()>> + 'a {
        self.unary_async(UnaryOp::Sigmoid, x, out)
    }
    /// Hyperbolic tangent.
    fn tanh_async<'a, T: Element>(&'a self, x: &'a [T], out: &'a mut [T]) -> impl Future<Output = Result<()>> + 'a {
        self.unary_async(UnaryOp::Tanh, x, out)
    }
    /// Swish / SiLU.
    fn swish_async<'a, T: Element>(&'a self, x: &'a [T], out: &'a mut [T]) -> impl Future<Output = Result<()>> + 'a {
        self.unary_async(UnaryOp::Swish, x, out)
    }
    /// GELU, tanh approximation.
    fn gelu_async<'a, T: Element>(&'a self, x: &'a [T], out: &'a mut [T]) -> impl Future<Output = Result<()>> + 'a {
        self.unary_async(UnaryOp::Gelu(GeluForm::Tanh), x, out)
    }
    /// GELU, exact erf form.
    fn gelu_erf_async<'a, T: Element>(&'a self, x: &'a [T], out: &'a mut [T]) -> impl Future<Output = Result<()>> + 'a {
        self.unary_async(UnaryOp::Gelu(GeluForm::Erf), x, out)
    }
    /// Clamp to `[min, max]`.
    fn clip_async<'a, T: Element>(
        &'a self,
        x: &'a [T],
        min: f32,
        max: f32,
        out: &'a mut [T],
    ) -> impl Future<Output = Result<()>> + 'a {
        self.unary_async(UnaryOp::Clip { min, max }, x, out)
    }
    /// Multiply by `s`.
    fn scale_async<'a, T: Element>(
        &'a self,
        x: &'a [T],
        s: f32,
        out: &'a mut [T],
    ) -> impl Future<Output = Result<()>> + 'a {
        self.unary_async(UnaryOp::Scale { s }, x, out)
    }
    /// `a + b`.
    fn add_async<'a, T: Element>(
        &'a self,
        a: &'a [T],
        b: &'a [T],
        out: &'a mut [T],
    ) -> impl Future<Output = Result<()>> + 'a {
        self.binary_async(BinaryOp::Add, a, b, out)
    }
    /// `a − b`.
    fn sub_async<'a, T: Element>(
        &'a self,
        a: &'a [T],
        b: &'a [T],
        out: &'a mut [T],
    ) -> impl Future<Output = Result<()>> + 'a {
        self.binary_async(BinaryOp::Sub, a, b, out)
    }
    /// `a · b`, element-wise.
    fn mul_async<'a, T: Element>(
        &'a self,
        a: &'a [T],
        b: &'a [T],
        out: &'a mut [T],
    ) -> impl Future<Output = Result<()>> + 'a {
        self.binary_async(BinaryOp::Mul, a, b, out)
    }
    /// Applies a binary element-wise op.
    fn binary_async<'a, T: Element>(
        &'a self,
        op: BinaryOp,
        a: &'a [T],
        b: &'a [T],
        out: &'a mut [T],
    ) -> impl Future<Output = Result<()>> + 'a {
        async move {
            self.run_async_into(Op::binary(op, out.len()).with_dtype(T::DTYPE), &[a.into(), b.into()], out.into()).await
        }
    }
    /// `Σ aᵢ·bᵢ`.
    fn dot_async<'a, T: Element>(&'a self, a: &'a [T], b: &'a [T]) -> impl Future<Output = Result<f32>> + 'a {
        async move {
            let mut out = [0.0f32];
            let op = Op::dot(a.len()).with_dtype(T::DTYPE);
            self.run_async_into(op, &[a.into(), b.into()], (&mut out[..]).into()).await?;
            Ok(out[0])
        }
    }
    /// Sum of all elements.
    fn sum_async<'a, T: Element>(&'a self, x: &'a [T]) -> impl Future<Output = Result<f32>> + 'a {
        self.reduce_async(ReduceOp::Sum, x)
    }
    /// Largest element (NaN if any is NaN).
    fn max_async<'a, T: Element>(&'a self, x: &'a [T]) -> impl Future<Output = Result<f32>> + 'a {
        self.reduce_async(ReduceOp::Max, x)
    }
    /// A reduction of all elements to one value.
    fn reduce_async<'a, T: Element>(&'a self, op: ReduceOp, x: &'a [T]) -> impl Future<Output = Result<f32>> + 'a {
        async move {
            let mut out = [0.0f32];
            let op = Op::reduce(op, x.len()).with_dtype(T::DTYPE);
            self.run_async_into(op, &[x.into()], (&mut out[..]).into()).await?;
            Ok(out[0])
        }
    }
    /// Row-wise softmax of a `rows × cols` matrix.
    fn softmax_async<'a, T: Element>(
        &'a self,
        x: &'a [T],
        rows: usize,
        cols: usize,
        out: &'a mut [T],
    ) -> impl Future<Output = Result<()>> + 'a {
        async move {
            self.run_async_into(Op::rows(RowOp::Softmax, rows, cols).with_dtype(T::DTYPE), &[x.into()], out.into())
                .await
        }
    }
    /// Row-wise log-softmax.
    fn log_softmax_async<'a, T: Element>(
        &'a self,
        x: &'a [T],
        rows: usize,
        cols: usize,
        out: &'a mut [T],
    ) -> impl Future<Output = Result<()>> + 'a {
        async move {
            self.run_async_into(Op::rows(RowOp::LogSoftmax, rows, cols).with_dtype(T::DTYPE), &[x.into()], out.into())
                .await
        }
    }
    /// Row-wise layer norm with per-column `gamma`, `beta`.
    #[allow(clippy::too_many_arguments)]
    fn layer_norm_async<'a, T: Element>(
        &'a self,
        x: &'a [T],
        gamma: &'a [T],
        beta: &'a [T],
        rows: usize,
        cols: usize,
        eps: f32,
        out: &'a mut [T],
    ) -> impl Future<Output = Result<()>> + 'a {
        let op = Op::rows(RowOp::LayerNorm { eps }, rows, cols).with_dtype(T::DTYPE);
        async move { self.run_async_into(op, &[x.into(), gamma.into(), beta.into()], out.into()).await }
    }
    /// Row-wise RMS norm with per-column `gamma`.
    fn rms_norm_async<'a, T: Element>(
        &'a self,
        x: &'a [T],
        gamma: &'a [T],
        rows: usize,
        cols: usize,
        eps: f32,
        out: &'a mut [T],
    ) -> impl Future<Output = Result<()>> + 'a {
        let op = Op::rows(RowOp::RmsNorm { eps }, rows, cols).with_dtype(T::DTYPE);
        async move { self.run_async_into(op, &[x.into(), gamma.into()], out.into()).await }
    }
    /// `C = A·B` with `A` `m × k`, `B` `k × n`, `C` `m × n`, row-major.
    fn matmul_async<'a, T: Element>(
        &'a self,
        a: &'a [T],
        b: &'a [T],
        out: &'a mut [T],
        m: usize,
        k: usize,
        n: usize,
    ) -> impl Future<Output = Result<()>> + 'a {
        self.matmul_spec_async(MatmulSpec::new(m, k, n).with_dtypes(T::DTYPE, T::DTYPE), a, b, out)
    }
    /// Matrix product with the full [`MatmulSpec`] (transposes, batch,
    /// dtypes); `T` and `U` must be the spec's input and output dtypes.
    fn matmul_spec_async<'a, T: Element, U: Element>(
        &'a self,
        spec: MatmulSpec,
        a: &'a [T],
        b: &'a [T],
        out: &'a mut [U],
    ) -> impl Future<Output = Result<()>> + 'a {
        async move { self.run_async_into(Op::Matmul(spec), &[a.into(), b.into()], out.into()).await }
    }
    /// Converts `x` into `out`'s type (round to nearest even; NaN stays NaN).
    fn cast_async<'a, T: Element, U: Element>(
        &'a self,
        x: &'a [T],
        out: &'a mut [U],
    ) -> impl Future<Output = Result<()>> + 'a {
        async move { self.run_async_into(Op::cast(out.len(), T::DTYPE, U::DTYPE), &[x.into()], out.into()).await }
    }
}

/// Runs `future` to completion on this thread, parking it between polls (a
/// dependency-free stand-in for `pollster::block_on`; not for the browser,
/// where nothing may block). Costs a thread park and wake per pending poll.
#[cfg(not(target_arch = "wasm32"))]
pub fn block_on<F: Future>(future: F) -> F::Output {
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake, Waker};

    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        match future.as_mut().poll(&mut cx) {
            Poll::Ready(out) => return out,
            Poll::Pending => std::thread::park(),
        }
    }
}
