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

use crate::error::Result;
use crate::op::{BinaryOp, GeluForm, MatmulSpec, Op, ReduceOp, RowOp, UnaryOp};

/// Every op of the vocabulary as a future that writes its result into the
/// caller's slice. On error the output is left untouched, as with [`Ops`](crate::Ops).
///
/// The futures borrow their inputs and output until they resolve; they are not
/// required to be `Send` (the browser's are not). Each costs what the op costs
/// on the backend, plus, on wgpu, one copy of the output from the read-back
/// buffer.
pub trait AsyncOps: crate::Backend {
    /// Runs `op` on host slices; resolves once `output` holds the result.
    /// Validation errors (lengths, sizes) resolve at the first poll and leave
    /// `output` untouched.
    ///
    /// The default suits a backend whose calls finish before they return (the
    /// CPU, CUDA): it runs `op` through [`Backend::run`](crate::Backend::run) at
    /// the first poll, and the future is ready at once. A backend that can wait
    /// without blocking (wgpu) overrides it.
    fn run_async_into<'a>(
        &'a self,
        op: Op,
        inputs: &'a [&'a [f32]],
        output: &'a mut [f32],
    ) -> impl Future<Output = Result<()>> + 'a {
        async move { self.run(&op, inputs, output) }
    }

    /// Applies a unary element-wise op.
    fn unary_async<'a>(
        &'a self,
        op: UnaryOp,
        x: &'a [f32],
        out: &'a mut [f32],
    ) -> impl Future<Output = Result<()>> + 'a {
        async move { self.run_async_into(Op::unary(op, out.len()), &[x], out).await }
    }
    /// `max(x, 0)`.
    fn relu_async<'a>(&'a self, x: &'a [f32], out: &'a mut [f32]) -> impl Future<Output = Result<()>> + 'a {
        self.unary_async(UnaryOp::Relu, x, out)
    }
    /// Leaky ReLU with slope `alpha`.
    fn leaky_relu_async<'a>(
        &'a self,
        x: &'a [f32],
        alpha: f32,
        out: &'a mut [f32],
    ) -> impl Future<Output = Result<()>> + 'a {
        self.unary_async(UnaryOp::LeakyRelu { alpha }, x, out)
    }
    /// ELU with scale `alpha`.
    fn elu_async<'a>(&'a self, x: &'a [f32], alpha: f32, out: &'a mut [f32]) -> impl Future<Output = Result<()>> + 'a {
        self.unary_async(UnaryOp::Elu { alpha }, x, out)
    }
    /// Logistic sigmoid.
    fn sigmoid_async<'a>(&'a self, x: &'a [f32], out: &'a mut [f32]) -> impl Future<Output = Result<()>> + 'a {
        self.unary_async(UnaryOp::Sigmoid, x, out)
    }
    /// Hyperbolic tangent.
    fn tanh_async<'a>(&'a self, x: &'a [f32], out: &'a mut [f32]) -> impl Future<Output = Result<()>> + 'a {
        self.unary_async(UnaryOp::Tanh, x, out)
    }
    /// Swish / SiLU.
    fn swish_async<'a>(&'a self, x: &'a [f32], out: &'a mut [f32]) -> impl Future<Output = Result<()>> + 'a {
        self.unary_async(UnaryOp::Swish, x, out)
    }
    /// GELU, tanh approximation.
    fn gelu_async<'a>(&'a self, x: &'a [f32], out: &'a mut [f32]) -> impl Future<Output = Result<()>> + 'a {
        self.unary_async(UnaryOp::Gelu(GeluForm::Tanh), x, out)
    }
    /// GELU, exact erf form.
    fn gelu_erf_async<'a>(&'a self, x: &'a [f32], out: &'a mut [f32]) -> impl Future<Output = Result<()>> + 'a {
        self.unary_async(UnaryOp::Gelu(GeluForm::Erf), x, out)
    }
    /// Clamp to `[min, max]`.
    fn clip_async<'a>(
        &'a self,
        x: &'a [f32],
        min: f32,
        max: f32,
        out: &'a mut [f32],
    ) -> impl Future<Output = Result<()>> + 'a {
        self.unary_async(UnaryOp::Clip { min, max }, x, out)
    }
    /// Multiply by `s`.
    fn scale_async<'a>(&'a self, x: &'a [f32], s: f32, out: &'a mut [f32]) -> impl Future<Output = Result<()>> + 'a {
        self.unary_async(UnaryOp::Scale { s }, x, out)
    }
    /// `a + b`.
    fn add_async<'a>(
        &'a self,
        a: &'a [f32],
        b: &'a [f32],
        out: &'a mut [f32],
    ) -> impl Future<Output = Result<()>> + 'a {
        self.binary_async(BinaryOp::Add, a, b, out)
    }
    /// `a − b`.
    fn sub_async<'a>(
        &'a self,
        a: &'a [f32],
        b: &'a [f32],
        out: &'a mut [f32],
    ) -> impl Future<Output = Result<()>> + 'a {
        self.binary_async(BinaryOp::Sub, a, b, out)
    }
    /// `a · b`, element-wise.
    fn mul_async<'a>(
        &'a self,
        a: &'a [f32],
        b: &'a [f32],
        out: &'a mut [f32],
    ) -> impl Future<Output = Result<()>> + 'a {
        self.binary_async(BinaryOp::Mul, a, b, out)
    }
    /// Applies a binary element-wise op.
    fn binary_async<'a>(
        &'a self,
        op: BinaryOp,
        a: &'a [f32],
        b: &'a [f32],
        out: &'a mut [f32],
    ) -> impl Future<Output = Result<()>> + 'a {
        async move { self.run_async_into(Op::binary(op, out.len()), &[a, b], out).await }
    }
    /// `Σ aᵢ·bᵢ`.
    fn dot_async<'a>(&'a self, a: &'a [f32], b: &'a [f32]) -> impl Future<Output = Result<f32>> + 'a {
        async move {
            let mut out = [0.0];
            self.run_async_into(Op::Dot { len: a.len() }, &[a, b], &mut out).await?;
            Ok(out[0])
        }
    }
    /// Sum of all elements.
    fn sum_async<'a>(&'a self, x: &'a [f32]) -> impl Future<Output = Result<f32>> + 'a {
        self.reduce_async(ReduceOp::Sum, x)
    }
    /// Largest element (NaN if any is NaN).
    fn max_async<'a>(&'a self, x: &'a [f32]) -> impl Future<Output = Result<f32>> + 'a {
        self.reduce_async(ReduceOp::Max, x)
    }
    /// A reduction of all elements to one value.
    fn reduce_async<'a>(&'a self, op: ReduceOp, x: &'a [f32]) -> impl Future<Output = Result<f32>> + 'a {
        async move {
            let mut out = [0.0];
            self.run_async_into(Op::Reduce { op, len: x.len() }, &[x], &mut out).await?;
            Ok(out[0])
        }
    }
    /// Row-wise softmax of a `rows × cols` matrix.
    fn softmax_async<'a>(
        &'a self,
        x: &'a [f32],
        rows: usize,
        cols: usize,
        out: &'a mut [f32],
    ) -> impl Future<Output = Result<()>> + 'a {
        async move { self.run_async_into(Op::rows(RowOp::Softmax, rows, cols), &[x], out).await }
    }
    /// Row-wise log-softmax.
    fn log_softmax_async<'a>(
        &'a self,
        x: &'a [f32],
        rows: usize,
        cols: usize,
        out: &'a mut [f32],
    ) -> impl Future<Output = Result<()>> + 'a {
        async move { self.run_async_into(Op::rows(RowOp::LogSoftmax, rows, cols), &[x], out).await }
    }
    /// Row-wise layer norm with per-column `gamma`, `beta`.
    #[allow(clippy::too_many_arguments)]
    fn layer_norm_async<'a>(
        &'a self,
        x: &'a [f32],
        gamma: &'a [f32],
        beta: &'a [f32],
        rows: usize,
        cols: usize,
        eps: f32,
        out: &'a mut [f32],
    ) -> impl Future<Output = Result<()>> + 'a {
        async move { self.run_async_into(Op::rows(RowOp::LayerNorm { eps }, rows, cols), &[x, gamma, beta], out).await }
    }
    /// Row-wise RMS norm with per-column `gamma`.
    fn rms_norm_async<'a>(
        &'a self,
        x: &'a [f32],
        gamma: &'a [f32],
        rows: usize,
        cols: usize,
        eps: f32,
        out: &'a mut [f32],
    ) -> impl Future<Output = Result<()>> + 'a {
        async move { self.run_async_into(Op::rows(RowOp::RmsNorm { eps }, rows, cols), &[x, gamma], out).await }
    }
    /// `C = A·B` with `A` `m × k`, `B` `k × n`, `C` `m × n`, row-major.
    fn matmul_async<'a>(
        &'a self,
        a: &'a [f32],
        b: &'a [f32],
        out: &'a mut [f32],
        m: usize,
        k: usize,
        n: usize,
    ) -> impl Future<Output = Result<()>> + 'a {
        self.matmul_spec_async(MatmulSpec::new(m, k, n), a, b, out)
    }
    /// Matrix product with the full [`MatmulSpec`] (transposes, batch).
    fn matmul_spec_async<'a>(
        &'a self,
        spec: MatmulSpec,
        a: &'a [f32],
        b: &'a [f32],
        out: &'a mut [f32],
    ) -> impl Future<Output = Result<()>> + 'a {
        async move { self.run_async_into(Op::Matmul(spec), &[a, b], out).await }
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
