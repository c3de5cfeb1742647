//! The op vocabulary: every operation the library runs, described once.
//!
//! An [`Op`] carries the op's parameters and sizes, never data. From it every
//! backend, the dispatcher's cost model, the batcher and the tests get the same
//! answers to three questions: are these shapes valid ([`Op::layout`]), how long
//! is each input and the output ([`Layout`]), and what does it cost ([`Op::cost`]).
//!
//! Conventions: data is contiguous and row-major. Inputs are passed in the
//! order documented on each variant. Every op states the [`DType`] of its
//! data (`f32` unless built with [`Op::with_dtype`]): its inputs and output
//! share it, except where a variant says otherwise (reductions return `f32`,
//! a cast converts, a matmul may write another dtype). Ops on `f16` and `bf16`
//! compute in `f32` internally and round once when they store.

use crate::attention::AttentionSpec;
use crate::dtype::DType;
use crate::error::{ComputeError, Result};
use crate::rope::{RopeLayout, RopeSpec};
use crate::strided::CopySpec;

/// Which formula `gelu` uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum GeluForm {
    /// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`, as in GPT-2 and PyTorch's `approximate="tanh"`.
    Tanh,
    /// `0.5·x·(1 + erf(x/√2))`, the exact form (PyTorch's default).
    Erf,
}

/// Element-wise ops of one input.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum UnaryOp {
    /// `max(x, 0)`; NaN stays NaN.
    Relu,
    /// `x` if `x > 0`, else `alpha·x`.
    LeakyRelu {
        /// Slope for negative inputs.
        alpha: f32,
    },
    /// `x` if `x > 0`, else `alpha·(eˣ − 1)`.
    Elu {
        /// Scale of the negative branch.
        alpha: f32,
    },
    /// `1 / (1 + e⁻ˣ)`.
    Sigmoid,
    /// Hyperbolic tangent.
    Tanh,
    /// `x·sigmoid(x)` (also called SiLU).
    Swish,
    /// Gaussian error linear unit in the given form.
    Gelu(GeluForm),
    /// `min(max(x, min), max)`; NaN stays NaN.
    Clip {
        /// Lower bound.
        min: f32,
        /// Upper bound.
        max: f32,
    },
    /// `s·x`.
    Scale {
        /// Factor.
        s: f32,
    },
}

impl UnaryOp {
    /// The op's name, e.g. `"gelu_tanh"`.
    pub fn name(&self) -> &'static str {
        match self {
            UnaryOp::Relu => "relu",
            UnaryOp::LeakyRelu { .. } => "leaky_relu",
            UnaryOp::Elu { .. } => "elu",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Swish => "swish",
            UnaryOp::Gelu(GeluForm::Tanh) => "gelu_tanh",
            UnaryOp::Gelu(GeluForm::Erf) => "gelu_erf",
            UnaryOp::Clip { .. } => "clip",
            UnaryOp::Scale { .. } => "scale",
        }
    }

    /// Whether the op evaluates a transcendental (exp, tanh, erf) per element.
    pub fn is_transcendental(&self) -> bool {
        matches!(self, UnaryOp::Elu { .. } | UnaryOp::Sigmoid | UnaryOp::Tanh | UnaryOp::Swish | UnaryOp::Gelu(_))
    }

    /// FLOPs per element, counting one transcendental function as one FLOP.
    pub fn flops_per_element(&self) -> u64 {
        match self {
            UnaryOp::Relu | UnaryOp::Scale { .. } => 1,
            UnaryOp::LeakyRelu { .. } | UnaryOp::Clip { .. } => 2,
            UnaryOp::Elu { .. } => 3,
            UnaryOp::Tanh => 1,
            UnaryOp::Sigmoid => 4,
            UnaryOp::Swish => 5,
            UnaryOp::Gelu(GeluForm::Erf) => 5,
            UnaryOp::Gelu(GeluForm::Tanh) => 9,
        }
    }
}

/// Element-wise ops of two inputs of equal length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum BinaryOp {
    /// `a + b`.
    Add,
    /// `a − b`.
    Sub,
    /// `a · b`.
    Mul,
    /// `swish(a) · b = a·σ(a)·b`: the gated product of a SwiGLU feed-forward
    /// block (`a` the gate projection, `b` the up projection). Computed in
    /// `f32` as `a / (1 + e⁻ᵃ) · b`; a transcendental op (its tolerance).
    SwiGlu,
}

impl BinaryOp {
    /// The op's name.
    pub fn name(&self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::SwiGlu => "swiglu",
        }
    }

    /// Whether it evaluates a transcendental function (its class and tolerance).
    pub fn is_transcendental(&self) -> bool {
        matches!(self, BinaryOp::SwiGlu)
    }

    /// FLOPs per element (one `exp` counts as one).
    pub fn flops_per_element(&self) -> u64 {
        if self.is_transcendental() { 5 } else { 1 }
    }
}

/// Reductions of one input to one value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum ReduceOp {
    /// Sum of all elements.
    Sum,
    /// Largest element; NaN if any element is NaN.
    Max,
}

impl ReduceOp {
    /// The op's name.
    pub fn name(&self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Max => "max",
        }
    }
}

/// Ops applied independently to each row of a `rows × cols` matrix.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum RowOp {
    /// `exp(x − max) / Σ exp(x − max)` per row.
    Softmax,
    /// `x − max − ln Σ exp(x − max)` per row.
    LogSoftmax,
    /// `(x − mean) / √(var + eps) · gamma + beta` per row (biased variance).
    /// Inputs: `x`, `gamma` (`cols`), `beta` (`cols`).
    LayerNorm {
        /// Added to the variance.
        eps: f32,
    },
    /// `x / √(mean(x²) + eps) · gamma` per row. Inputs: `x`, `gamma` (`cols`).
    RmsNorm {
        /// Added to the mean square.
        eps: f32,
    },
}

impl RowOp {
    /// The op's name.
    pub fn name(&self) -> &'static str {
        match self {
            RowOp::Softmax => "softmax",
            RowOp::LogSoftmax => "log_softmax",
            RowOp::LayerNorm { .. } => "layer_norm",
            RowOp::RmsNorm { .. } => "rms_norm",
        }
    }

    /// FLOPs per element (one `exp` counts as one FLOP).
    pub fn flops_per_element(&self) -> u64 {
        match self {
            RowOp::Softmax | RowOp::LogSoftmax => 5,
            RowOp::LayerNorm { .. } => 8,
            RowOp::RmsNorm { .. } => 4,
        }
    }
}

/// How a matrix product on `f32` data may compute.
///
/// Products of `f16` and `bf16` inputs always accumulate in `f32`; this
/// setting only matters for `f32` inputs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Precision {
    /// `f32` products, `f32` accumulation (the default, as in PyTorch).
    #[default]
    Full,
    /// Opt-in: `f32` inputs may be rounded to TF32 (10 mantissa bits) for
    /// tensor cores, still accumulating in `f32`. Errors grow to about
    /// `2⁻¹¹·Σ|aᵢₖ·bₖⱼ|`. Backends without TF32 hardware compute in full
    /// precision, which meets the same bound.
    Tf32,
}

/// An element-wise function a matrix product applies to its values before
/// storing them ([`Epilogue::activation`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Activation {
    /// `max(x, 0)`.
    Relu,
    /// Gaussian error linear unit in the given form.
    Gelu(GeluForm),
    /// `x·sigmoid(x)` (also called swish).
    Silu,
}

impl Activation {
    /// The same function as an element-wise op (its reference and tolerance).
    pub fn unary(self) -> UnaryOp {
        match self {
            Activation::Relu => UnaryOp::Relu,
            Activation::Gelu(form) => UnaryOp::Gelu(form),
            Activation::Silu => UnaryOp::Swish,
        }
    }

    /// The function's name, e.g. `"silu"`.
    pub fn name(self) -> &'static str {
        match self {
            Activation::Silu => "silu",
            other => other.unary().name(),
        }
    }
}

/// What a matrix product does with each value `p` of `op(A)·op(B)` on its
/// way to `C`, as cuBLASLt's epilogues do:
///
/// `C = act(alpha·p + beta·C₀ + bias)`
///
/// `C₀` is an input of the output's shape and dtype, read when `beta ≠ 0`
/// (a separate buffer: as for every op, the output aliases no input);
/// `bias` is an input of `n` values of the output's dtype, one per
/// column, shared by every row and batch; `act` is applied last. Everything
/// is computed in `f32` from the `f32` accumulators and rounded once to the
/// output's dtype. The default (`alpha = 1`, `beta = 0`, no bias, no
/// activation) is the plain product. Backends apply it as the product's
/// values are stored where their kernels can (the tensor-core GEMMs on CUDA)
/// and in one more pass over `C` elsewhere; see each backend's documentation.
#[derive(Clone, Copy, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Epilogue {
    /// Scale of the product.
    pub alpha: f32,
    /// Scale of `C₀`; `0` reads no `C₀`.
    pub beta: f32,
    /// Add a bias of `n` values, one per column.
    pub bias: bool,
    /// The function applied last, if any.
    pub activation: Option<Activation>,
}

impl Default for Epilogue {
    fn default() -> Self {
        Epilogue { alpha: 1.0, beta: 0.0, bias: false, activation: None }
    }
}

impl PartialEq for Epilogue {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Epilogue {}

impl std::hash::Hash for Epilogue {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.key().hash(state);
    }
}

impl Epilogue {
    fn key(&self) -> (u32, u32, bool, Option<Activation>) {
        (self.alpha.to_bits(), self.beta.to_bits(), self.bias, self.activation)
    }

    /// Whether it stores the product as it is.
    pub fn is_identity(&self) -> bool {
        *self == Epilogue::default()
    }

    /// Whether it reads `C₀` (`beta ≠ 0`).
    pub fn reads_c(&self) -> bool {
        self.beta != 0.0
    }

    /// `act(alpha·p + beta·c + bias)` in float64 (the reference).
    pub fn apply(&self, p: f64, c: f64, bias: f64) -> f64 {
        let mut v = f64::from(self.alpha) * p + bias;
        if self.reads_c() {
            v += f64::from(self.beta) * c;
        }
        match self.activation {
            Some(a) => crate::reference::unary(a.unary(), v),
            None => v,
        }
    }

    /// The same in `f32`, in the order every backend computes it: `alpha·p`,
    /// then `+ beta·c` (a fused multiply-add), then `+ bias`, then the
    /// activation (given as `act`, the backend's own `f32` function).
    pub fn apply_f32(&self, p: f32, c: f32, bias: f32, act: impl Fn(Activation, f32) -> f32) -> f32 {
        let mut v = self.alpha * p;
        if self.reads_c() {
            v = self.beta.mul_add(c, v);
        }
        v += bias;
        match self.activation {
            Some(a) => act(a, v),
            None => v,
        }
    }

    /// A short description (`""` for the identity), e.g. `" alpha=0.5 +bias silu"`.
    pub fn describe(&self) -> String {
        let mut s = String::new();
        if self.alpha != 1.0 {
            s += &format!(" alpha={}", self.alpha);
        }
        if self.reads_c() {
            s += &format!(" beta={}", self.beta);
        }
        if self.bias {
            s += " +bias";
        }
        if let Some(a) = self.activation {
            s += " ";
            s += a.name();
        }
        s
    }

    /// FLOPs per output element (an activation counts as its element-wise op does).
    pub fn flops_per_element(&self) -> u64 {
        let scale = u64::from(self.alpha != 1.0);
        let c = 2 * u64::from(self.reads_c());
        let bias = u64::from(self.bias);
        scale + c + bias + self.activation.map_or(0, |a| a.unary().flops_per_element())
    }
}

/// `C = op(A) · op(B)`, optionally over a batch of independent products.
///
/// `op(A)` is `m × k`: `A` is stored `m × k`, or `k × m` when `trans_a`.
/// `op(B)` is `k × n`: `B` is stored `k × n`, or `n × k` when `trans_b`.
/// `C` is `m × n`. With `batch > 1` the matrices follow each other
/// contiguously, unless [`MatmulSpec::with_batch_strides`] spaces those of
/// `A` and `B` otherwise (a stride of 0 shares one matrix among all
/// products); `C`'s always follow each other. `A` and `B` hold `dtype`; `C`
/// holds `out_dtype`; products accumulate in `f32`.
/// The [`Epilogue`] (scales, bias, activation) is applied to each value as
/// it is stored; its inputs follow `A` and `B`: the bias (when
/// [`Epilogue::bias`]), then `C₀` (when [`Epilogue::reads_c`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct MatmulSpec {
    /// Number of independent products (1 for a plain matmul).
    pub batch: usize,
    /// Rows of `C`.
    pub m: usize,
    /// Inner dimension.
    pub k: usize,
    /// Columns of `C`.
    pub n: usize,
    /// `A` is stored transposed (`k × m`).
    pub trans_a: bool,
    /// `B` is stored transposed (`n × k`).
    pub trans_b: bool,
    /// Dtype of `A` and `B`.
    pub dtype: DType,
    /// Dtype of `C`.
    pub out_dtype: DType,
    /// May `f32` inputs use TF32 ([`Precision`]).
    pub precision: Precision,
    /// What is done to each value on its way to `C` ([`Epilogue`]).
    pub epilogue: Epilogue,
    /// Elements between consecutive matrices of `A` and of `B` when
    /// `batch > 1`; `None`: contiguous (`m·k` and `k·n`).
    #[cfg_attr(feature = "serde", serde(default, skip_serializing_if = "Option::is_none"))]
    pub batch_strides: Option<BatchStrides>,
}

/// Where the matrices of a batched product's inputs start: matrix `z` of `A`
/// at element `z·a`, of `B` at `z·b` ([`MatmulSpec::with_batch_strides`]).
/// Any stride is allowed, 0 included (every product reads the same matrix,
/// e.g. one weight for a batch of inputs) and strides shorter than a matrix
/// (overlapping views). `C` stays contiguous, so that a product never leaves
/// elements of its output unwritten between matrices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct BatchStrides {
    /// Elements between consecutive matrices of `A`.
    pub a: usize,
    /// Elements between consecutive matrices of `B`.
    pub b: usize,
}

impl MatmulSpec {
    /// A plain `m × k` by `k × n` product of `f32` matrices, in full precision.
    pub fn new(m: usize, k: usize, n: usize) -> Self {
        MatmulSpec {
            batch: 1,
            m,
            k,
            n,
            trans_a: false,
            trans_b: false,
            dtype: DType::F32,
            out_dtype: DType::F32,
            precision: Precision::Full,
            epilogue: Epilogue::default(),
            batch_strides: None,
        }
    }

    /// The same product on inputs of `input` writing `output`, e.g.
    /// `(BF16, F32)` for bf16 weights and activations with an f32 result.
    pub fn with_dtypes(self, input: DType, output: DType) -> Self {
        MatmulSpec { dtype: input, out_dtype: output, ..self }
    }

    /// The same product with `precision`.
    pub fn with_precision(self, precision: Precision) -> Self {
        MatmulSpec { precision, ..self }
    }

    /// The same product with `epilogue`.
    pub fn with_epilogue(self, epilogue: Epilogue) -> Self {
        MatmulSpec { epilogue, ..self }
    }

    /// The same product adding a bias of `n` values (an input after `B`).
    pub fn with_bias(self) -> Self {
        MatmulSpec { epilogue: Epilogue { bias: true, ..self.epilogue }, ..self }
    }

    /// The same product with `activation` applied last.
    pub fn with_activation(self, activation: Activation) -> Self {
        MatmulSpec { epilogue: Epilogue { activation: Some(activation), ..self.epilogue }, ..self }
    }

    /// The same product as `C = alpha·op(A)·op(B) + beta·C₀` (`C₀` an input
    /// after `B` and the bias when `beta ≠ 0`).
    pub fn with_scales(self, alpha: f32, beta: f32) -> Self {
        MatmulSpec { epilogue: Epilogue { alpha, beta, ..self.epilogue }, ..self }
    }

    /// The same batched product with matrix `z` of `A` starting at element
    /// `z·a` and of `B` at `z·b` ([`BatchStrides`]; 0 shares one matrix).
    /// `A` then holds `(batch − 1)·a + m·k` elements, `B` `(batch − 1)·b +
    /// k·n`. The contiguous strides are the same as none.
    pub fn with_batch_strides(self, a: usize, b: usize) -> Self {
        let contiguous = a == self.m * self.k && b == self.k * self.n;
        MatmulSpec { batch_strides: (!contiguous).then_some(BatchStrides { a, b }), ..self }
    }

    /// Elements between consecutive matrices of `A` (`m·k` unless set).
    pub fn stride_a(&self) -> usize {
        self.batch_strides.map_or(self.m * self.k, |s| s.a)
    }

    /// Elements between consecutive matrices of `B` (`k·n` unless set).
    pub fn stride_b(&self) -> usize {
        self.batch_strides.map_or(self.k * self.n, |s| s.b)
    }

    /// Whether the batch's input matrices are spaced other than one after the
    /// other (only a product of more than one matrix can be).
    pub fn has_batch_strides(&self) -> bool {
        self.batch > 1 && (self.stride_a() != self.m * self.k || self.stride_b() != self.k * self.n)
    }

    /// A product whose `B` is one matrix shared by the whole batch and whose
    /// `A` matrices follow each other untransposed is one product of
    /// `batch·m` rows: that product (`C` is laid out the same), else `None`.
    pub fn shared_b_as_rows(&self) -> Option<MatmulSpec> {
        let shared = self.batch > 1 && self.stride_b() == 0 && !self.trans_a && self.stride_a() == self.m * self.k;
        shared.then(|| MatmulSpec { batch: 1, m: self.batch * self.m, batch_strides: None, ..*self })
    }

    /// The spec of matrix `z` alone (batch 1, no strides), with the offsets
    /// in elements of its `A`, `B` and `C` (and `C₀`) matrices.
    pub fn one_of_batch(&self, z: usize) -> (MatmulSpec, [usize; 3]) {
        let one = MatmulSpec { batch: 1, batch_strides: None, ..*self };
        (one, [z * self.stride_a(), z * self.stride_b(), z * self.m * self.n])
    }
}

/// `y = x · Wᵀ` with a weight `W` in a block-quantized dtype: the linear
/// layer of a GGUF model. `x` is `m × k` (row-major, `f32`, `f16` or `bf16`),
/// `W` is `n` rows of `k` values (ggml's layout: each row is `k / 256` blocks,
/// or `k / 32` for `Q8_0`, one after the other), `y` is `m × n`.
///
/// The result is the product of `x` with the dequantized weights
/// ([`quant`](crate::quant)), accumulated in `f32`. Backends may first round
/// each activation row to 8-bit integers per block of values (as ggml's own
/// kernels do, to multiply in integer units): the stated error bound is
/// `(max_l |x_il| / 254)·Σ_l |W_jl| + 2⁻¹⁸·Σ_l |x_il·W_jl|` per output,
/// before the output's own rounding. `k` must be a whole number of blocks.
///
/// An [`Epilogue`] applies to each value of the product as for
/// [`MatmulSpec`] (`y = act(alpha·x·Wᵀ + beta·C₀ + bias)`, the bias and then
/// `C₀` inputs after `W`), e.g. a residual add (`with_scales(1.0, 1.0)`).
///
/// Two steps of a transformer layer may be fused around the product, so that
/// a decoder's layer launches fewer kernels:
///
/// - [`with_rms_norm`](Self::with_rms_norm): each row of `x` is first
///   normalized, `x_i / √(mean(x_i²) + eps) · g` ([`RowOp::RmsNorm`], in
///   `f32`; a backend may round it to `x`'s dtype before the product, which
///   the stated bound allows for), `g` (`k` values of `x`'s dtype) an input
///   right after `W`.
/// - [`with_glu`](Self::with_glu): `W`'s `n` rows are a gate half then an up
///   half, and `y` (`m × n/2`) is `silu(p[i, j])·p[i, n/2 + j]` of the
///   product `p` ([`Op::Glu`]), computed in `f32` and rounded once. It takes
///   no other epilogue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct QuantMatmulSpec {
    /// Rows of `x` and `y` (tokens).
    pub m: usize,
    /// Inner dimension: values per weight row, a multiple of the block's values.
    pub k: usize,
    /// Weight rows: columns of `y`.
    pub n: usize,
    /// Dtype of `W`: one of [`DType::QUANTIZED`].
    pub weight: DType,
    /// Dtype of `x`.
    pub dtype: DType,
    /// Dtype of `y`.
    pub out_dtype: DType,
    /// What is applied to each value on its way to `y` (none by default).
    #[cfg_attr(feature = "serde", serde(default))]
    pub epilogue: Epilogue,
    /// The RMS normalization of `x`'s rows before the product, if any.
    #[cfg_attr(feature = "serde", serde(default))]
    pub rms_norm: Option<NormEps>,
    /// Whether `y` is the gated product of `W`'s two halves (see the type's docs).
    #[cfg_attr(feature = "serde", serde(default))]
    pub glu: bool,
}

/// The `eps` of a fused RMS normalization ([`QuantMatmulSpec::with_rms_norm`]),
/// compared and hashed by its bits.
#[derive(Clone, Copy, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct NormEps(pub f32);

impl PartialEq for NormEps {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for NormEps {}

impl std::hash::Hash for NormEps {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.to_bits().hash(state);
    }
}

impl QuantMatmulSpec {
    /// `f32` activations `x` (`m × k`) times the `n × k` weight in `weight`,
    /// writing `f32`.
    pub fn new(m: usize, k: usize, n: usize, weight: DType) -> Self {
        QuantMatmulSpec {
            m,
            k,
            n,
            weight,
            dtype: DType::F32,
            out_dtype: DType::F32,
            epilogue: Epilogue::default(),
            rms_norm: None,
            glu: false,
        }
    }

    /// The same product of `x`'s rows normalized first:
    /// `x_i / √(mean(x_i²) + eps) · g`, `g` (`k` values of `x`'s dtype) an
    /// input right after `W`. Costs one more read of `x` and `g`.
    pub fn with_rms_norm(self, eps: f32) -> Self {
        QuantMatmulSpec { rms_norm: Some(NormEps(eps)), ..self }
    }

    /// The same product with `W`'s rows taken as a gate half and an up half:
    /// `y[i, j] = silu(p[i, j])·p[i, n/2 + j]`, `y` of `m × n/2` (`n` even;
    /// no other epilogue).
    pub fn with_glu(self) -> Self {
        QuantMatmulSpec { glu: true, ..self }
    }

    /// Columns of `y`: `n`, or `n / 2` with [`with_glu`](Self::with_glu).
    pub fn out_cols(&self) -> usize {
        if self.glu { self.n / 2 } else { self.n }
    }

    /// Where the epilogue's inputs (bias, then `C₀`) start among the op's
    /// inputs: after `x`, `W` and the norm's `g`.
    pub fn epilogue_at(&self) -> usize {
        2 + usize::from(self.rms_norm.is_some())
    }

    /// The same product on activations of `input` writing `output`.
    pub fn with_dtypes(self, input: DType, output: DType) -> Self {
        QuantMatmulSpec { dtype: input, out_dtype: output, ..self }
    }

    /// The same product with `epilogue`.
    pub fn with_epilogue(self, epilogue: Epilogue) -> Self {
        QuantMatmulSpec { epilogue, ..self }
    }

    /// The same product as `y = alpha·x·Wᵀ + beta·C₀` (`C₀`, of `y`'s shape
    /// and dtype, an input after `W` and the bias when `beta ≠ 0`):
    /// `with_scales(1.0, 1.0)` adds a residual.
    pub fn with_scales(self, alpha: f32, beta: f32) -> Self {
        QuantMatmulSpec { epilogue: Epilogue { alpha, beta, ..self.epilogue }, ..self }
    }
}

/// 2-D convolution (cross-correlation, as in PyTorch), NCHW layout, no bias.
///
/// Input `x` is `n × c_in × h × w`, weights `w` are `c_out × c_in × kh × kw`,
/// output is `n × c_out × oh × ow` with `oh = (h + 2·pad_h − kh) / stride_h + 1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Conv2dSpec {
    /// Batch size.
    pub n: usize,
    /// Input channels.
    pub c_in: usize,
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Output channels.
    pub c_out: usize,
    /// Kernel height.
    pub kh: usize,
    /// Kernel width.
    pub kw: usize,
    /// Stride (height, width).
    pub stride: (usize, usize),
    /// Zero padding (height, width) on each side.
    pub padding: (usize, usize),
    /// Dtype of the input, the weights and the output.
    pub dtype: DType,
}

impl Conv2dSpec {
    /// One `c_in × hw × hw` image through a `k × k` kernel with stride 1 and
    /// `k / 2` zero padding ("same" size for odd `k`) into `c_out` channels.
    /// Costs nothing; validate with [`Op::layout`].
    pub fn same(c_in: usize, hw: usize, c_out: usize, k: usize) -> Conv2dSpec {
        Conv2dSpec {
            n: 1,
            c_in,
            h: hw,
            w: hw,
            c_out,
            kh: k,
            kw: k,
            stride: (1, 1),
            padding: (k / 2, k / 2),
            dtype: DType::F32,
        }
    }

    /// Output height and width, or `None` if the kernel does not fit the padded input
    /// or a stride is zero.
    pub fn output_hw(&self) -> Option<(usize, usize)> {
        let (sh, sw) = self.stride;
        let (ph, pw) = self.padding;
        if sh == 0 || sw == 0 {
            return None;
        }
        let hp = self.h.checked_add(ph.checked_mul(2)?)?;
        let wp = self.w.checked_add(pw.checked_mul(2)?)?;
        if self.kh == 0 || self.kw == 0 || hp < self.kh || wp < self.kw {
            return None;
        }
        Some(((hp - self.kh) / sh + 1, (wp - self.kw) / sw + 1))
    }
}

/// Broad class of an op, used by cost models that keep one throughput per class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum OpClass {
    /// Cheap element-wise arithmetic (relu, add, scale…): memory-bound everywhere.
    Elementwise,
    /// Element-wise with a transcendental per element (sigmoid, gelu…).
    Transcendental,
    /// Whole-array reductions (sum, max, dot).
    Reduction,
    /// Per-row ops (softmax, norms).
    RowWise,
    /// Matrix products.
    Matmul,
    /// Convolutions.
    Conv,
}

impl OpClass {
    /// Every class, in a fixed order.
    pub const ALL: [OpClass; 6] = [
        OpClass::Elementwise,
        OpClass::Transcendental,
        OpClass::Reduction,
        OpClass::RowWise,
        OpClass::Matmul,
        OpClass::Conv,
    ];

    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            OpClass::Elementwise => "elementwise",
            OpClass::Transcendental => "transcendental",
            OpClass::Reduction => "reduction",
            OpClass::RowWise => "rowwise",
            OpClass::Matmul => "matmul",
            OpClass::Conv => "conv",
        }
    }
}

/// One operation with its parameters, sizes and dtypes.
///
/// Build ops with the constructors ([`Op::unary`], [`Op::matmul`]…), which
/// give `f32` data, and [`Op::with_dtype`] for another dtype.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Op {
    /// Element-wise, one input of `len`; output `len`.
    Unary {
        /// Which op.
        op: UnaryOp,
        /// Number of elements.
        len: usize,
        /// Dtype of input and output.
        dtype: DType,
    },
    /// Element-wise, inputs `a`, `b` of `len`; output `len`.
    Binary {
        /// Which op.
        op: BinaryOp,
        /// Number of elements.
        len: usize,
        /// Dtype of inputs and output.
        dtype: DType,
    },
    /// Reduction of one input of `len` to an `f32` output of length 1
    /// (accumulated in `f32` whatever the input dtype).
    Reduce {
        /// Which reduction.
        op: ReduceOp,
        /// Number of elements.
        len: usize,
        /// Dtype of the input.
        dtype: DType,
    },
    /// `Σ aᵢ·bᵢ`, inputs `a`, `b` of `len`; an `f32` output of length 1.
    Dot {
        /// Number of elements.
        len: usize,
        /// Dtype of the inputs.
        dtype: DType,
    },
    /// Per-row op on `x` (`rows × cols`) plus the op's parameter vectors; output `rows × cols`.
    Rows {
        /// Which op.
        op: RowOp,
        /// Number of rows.
        rows: usize,
        /// Row length.
        cols: usize,
        /// Dtype of `x`, the parameter vectors and the output.
        dtype: DType,
    },
    /// Matrix product; inputs `a`, `b`; output `batch × m × n` (dtypes in the spec).
    Matmul(MatmulSpec),
    /// Matrix product with a block-quantized weight; inputs `x` (`m × k`) and
    /// `w` (`n × k` values in blocks); output `m × n` ([`QuantMatmulSpec`]).
    QuantMatmul(QuantMatmulSpec),
    /// Convolution; inputs `x`, `w`; output `n × c_out × oh × ow`.
    Conv2d(Conv2dSpec),
    /// Fused attention; inputs `q`, `k`, `v`; output like `q` (layouts in the spec).
    Attention(AttentionSpec),
    /// Linear interpolation `a + t·(b − a)`, element-wise; inputs `a`, `b`
    /// of `len`; output `len`. Computed in `f32` as
    /// `t < 0.5 ? a + t·(b − a) : b − (1 − t)·(b − a)` (the products fused
    /// where the hardware has an FMA), so `t = 0` gives `a` and `t = 1`
    /// gives `b` exactly, and the error is at most
    /// `2⁻²⁴·|r| + 2⁻²²·min(|t|, |1 − t|)·|b − a|` before the result is
    /// rounded to `dtype` (`r` the exact value). `t` may lie outside
    /// `[0, 1]` (extrapolation) but must be finite. Infinite or NaN inputs
    /// give what that formula gives in IEEE arithmetic (as PyTorch's `lerp`):
    /// NaN stays NaN, `lerp(∞, x, t)` is NaN. Where `b − a` overflows `f32`
    /// (operands of opposite signs beyond about 1.7e38) the result is ±∞ or
    /// NaN.
    ///
    /// `t` is one scalar for the whole op, not a tensor: the scalar form is
    /// what weight averaging, model merging and latent interpolation use; it
    /// keeps the op a two-stream element-wise kernel (12 bytes per `f32`
    /// element instead of 16) whose requests coalesce in the batching
    /// executor; and a per-element weight is `a + t⊙(b − a)`, which the
    /// `sub`, `mul` and `add` ops already express.
    Lerp {
        /// Number of elements.
        len: usize,
        /// Interpolation weight: 0 gives `a`, 1 gives `b`.
        t: f32,
        /// Dtype of the inputs and the output.
        dtype: DType,
    },
    /// Spherical linear interpolation of the rows of `a` and `b` (both
    /// `rows × cols`); output `rows × cols`. The ML convention: the angle
    /// comes from the normalised rows, the given (unnormalised) rows are
    /// interpolated, so the magnitudes blend as well. Per row, in `f32`:
    ///
    /// 1. `‖a‖²`, `‖b‖²` and `⟨a, b⟩`.
    /// 2. A zero row (`‖a‖²` or `‖b‖²` below 2⁻¹²⁶, the smallest normal
    ///    `f32`): `y = lerp(a, b, t)` element-wise, as [`Op::Lerp`] (no NaN).
    /// 3. A row with a NaN or infinite element (or whose squared norm
    ///    overflows `f32`, about `‖a‖ > 1.8e19`): every element NaN.
    /// 4. `c = ⟨a, b⟩ / (‖a‖·‖b‖)` clamped to `[−1, 1]`. Near-parallel or
    ///    near-anti-parallel rows (`|c| > 0.9995`, an angle within 1.8° of 0
    ///    or 180°): `y = lerp(a, b, t)`. Anti-parallel rows have no unique
    ///    great circle; the lerp passes near the origin, never NaN.
    /// 5. Otherwise `Ω = acos c` and
    ///    `y = sin((1 − t)·Ω)/sin Ω · a + sin(t·Ω)/sin Ω · b`.
    ///
    /// `t = 0` gives `a` and `t = 1` gives `b` exactly on every path;
    /// `t` must lie in `[0, 1]` (great-circle extrapolation is refused with
    /// a `Shape` error). Costs a pass for the three sums and a pass for the
    /// output over each row.
    Slerp {
        /// Number of rows.
        rows: usize,
        /// Row length.
        cols: usize,
        /// Interpolation weight in `[0, 1]`.
        t: f32,
        /// Dtype of the inputs and the output.
        dtype: DType,
    },
    /// Rotary position embedding of `x` (`[seq, heads, head_dim]`); output
    /// of the same shape, or the rows of a KV cache ([`RopeSpec`],
    /// [`RopeSpec::into_cache`]).
    Rope(RopeSpec),
    /// Strided copy of `src` into `dst` ([`CopySpec`]): input `src`, output
    /// `dst`, of which only the view's elements are written.
    Copy(CopySpec),
    /// Rows of a table picked by index (an embedding lookup): inputs `table`
    /// (`rows × cols`) and `ids` (`ids` values, `f32` holding integers);
    /// output `ids × cols`, row `r` a copy of table row `ids[r]`. An id that
    /// is not an integer in `0..rows` gives a row of NaN (the op cannot fail
    /// once launched on a device); `rows` is at most 2²⁴, where `f32`
    /// still holds every integer.
    Gather {
        /// Indices looked up (tokens).
        ids: usize,
        /// Rows of the table (vocabulary size).
        rows: usize,
        /// Values per row.
        cols: usize,
        /// Dtype of the table and the output.
        dtype: DType,
    },
    /// The gated product of a fused gate/up projection: `x` is `rows × 2·cols`
    /// (each row's gate values, then its up values, as one product over the
    /// stacked `[W_gate; W_up]` weights writes them), output `rows × cols`,
    /// `y[r, j] = swish(x[r, j])·x[r, cols + j]`: [`BinaryOp::SwiGlu`] of
    /// each row's two halves, with its accuracy.
    Glu {
        /// Rows (tokens).
        rows: usize,
        /// Output values per row (half the input's).
        cols: usize,
        /// Dtype of `x` and the output.
        dtype: DType,
    },
    /// Index of the largest value of each row of `x` (`rows × cols`): output
    /// `rows` values, `f32` holding integers. The first of equal maxima wins;
    /// a NaN counts as larger than every number (the first NaN wins, as
    /// PyTorch's `argmax` does). `cols` is at most 2²⁴.
    ArgMax {
        /// Rows.
        rows: usize,
        /// Values per row.
        cols: usize,
        /// Dtype of `x`.
        dtype: DType,
    },
    /// Converts `len` values of `from` into `to`: round to nearest, ties to
    /// even; NaN stays NaN; values past the target's range become ±∞.
    ///
    /// With a quantized dtype on one side it quantizes or dequantizes, bit
    /// for bit as ggml's reference code does ([`quant`](crate::quant)); `len`
    /// must then be a whole number of blocks. Dequantizing into `f16`/`bf16`
    /// rounds the exact `f32` value once. Quantized to quantized is refused.
    Cast {
        /// Number of elements.
        len: usize,
        /// Dtype of the input.
        from: DType,
        /// Dtype of the output.
        to: DType,
    },
}

/// Cost of one op: what the dispatcher's cost model weighs.
///
/// FLOPs count multiply and add separately (a matmul is `2·m·k·n`); one
/// transcendental function counts as one FLOP; a cast costs one per element.
/// Bytes are the minimum traffic: every input read once, the output written
/// once, each at its dtype's size (`f32` 4 bytes, `f16`/`bf16` 2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Cost {
    /// Floating-point operations.
    pub flops: u64,
    /// Bytes read from inputs.
    pub bytes_read: u64,
    /// Bytes written to the output.
    pub bytes_written: u64,
}

impl Cost {
    /// Bytes read plus bytes written.
    pub fn bytes(&self) -> u64 {
        self.bytes_read.saturating_add(self.bytes_written)
    }

    /// FLOPs per byte moved.
    pub fn intensity(&self) -> f64 {
        self.flops as f64 / self.bytes().max(1) as f64
    }
}

/// One operand of an op: its length in elements and its dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Operand {
    /// Number of elements.
    pub len: usize,
    /// Dtype of the elements.
    pub dtype: DType,
}

impl Operand {
    /// An operand of `len` elements of `dtype`.
    pub const fn new(len: usize, dtype: DType) -> Self {
        Operand { len, dtype }
    }

    /// Its size in bytes (saturating).
    pub fn bytes(&self) -> u64 {
        self.dtype.bytes_for(self.len).unwrap_or(u64::MAX)
    }
}

impl Default for Operand {
    fn default() -> Self {
        Operand { len: 0, dtype: DType::F32 }
    }
}

/// Up to this many operands are stored inline; more spill to the heap.
const INLINE_OPERANDS: usize = 6;

/// The operands of an op once its shapes are validated: inputs then outputs,
/// each with its length and dtype, in the op's documented order. Any number
/// of either: up to six in all are kept without allocating.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    operands: Operands,
    n_inputs: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Operands {
    Inline { buf: [Operand; INLINE_OPERANDS], len: usize },
    Heap(Vec<Operand>),
}

impl Layout {
    /// A layout of `inputs` then `outputs`.
    pub fn new(inputs: &[Operand], outputs: &[Operand]) -> Self {
        let total = inputs.len() + outputs.len();
        let operands = if total <= INLINE_OPERANDS {
            let mut buf = [Operand::default(); INLINE_OPERANDS];
            buf[..inputs.len()].copy_from_slice(inputs);
            buf[inputs.len()..total].copy_from_slice(outputs);
            Operands::Inline { buf, len: total }
        } else {
            Operands::Heap(inputs.iter().chain(outputs).copied().collect())
        };
        Layout { operands, n_inputs: inputs.len() }
    }

    fn all(&self) -> &[Operand] {
        match &self.operands {
            Operands::Inline { buf, len } => &buf[..*len],
            Operands::Heap(v) => v,
        }
    }

    /// The inputs, in the op's input order.
    pub fn inputs(&self) -> &[Operand] {
        &self.all()[..self.n_inputs]
    }

    /// The outputs (one for every op of this version).
    pub fn outputs(&self) -> &[Operand] {
        &self.all()[self.n_inputs..]
    }

    /// The first output.
    pub fn output(&self) -> Operand {
        self.outputs().first().copied().unwrap_or_default()
    }

    /// Length of the first output, in elements.
    pub fn output_len(&self) -> usize {
        self.output().len
    }

    /// Input lengths, in elements, in the op's input order.
    pub fn input_lens(&self) -> impl ExactSizeIterator<Item = usize> + '_ {
        self.inputs().iter().map(|o| o.len)
    }

    /// Bytes of every input plus every output (saturating).
    pub fn bytes(&self) -> u64 {
        self.all().iter().fold(0u64, |a, o| a.saturating_add(o.bytes()))
    }
}

fn mul(op: &'static str, shapes: &dyn Fn() -> String, xs: &[usize]) -> Result<usize> {
    let mut acc: usize = 1;
    for &x in xs {
        if x == 0 {
            return Err(ComputeError::shape(op, "zero-sized dimension", shapes()));
        }
        acc = acc.checked_mul(x).ok_or_else(|| ComputeError::shape(op, "size overflows usize", shapes()))?;
    }
    Ok(acc)
}

/// A `DType` error for a quantized `dtype` where the op takes float data.
fn float_only(op: &'static str, shapes: &dyn Fn() -> String, dtype: DType) -> Result<()> {
    if !dtype.is_quantized() {
        return Ok(());
    }
    Err(ComputeError::DType { op, detail: format!("{dtype} data: this op takes float dtypes"), shapes: shapes() })
}

/// A `Shape` error unless `len` values of `dtype` fill whole blocks.
fn whole_blocks(op: &'static str, shapes: &dyn Fn() -> String, dtype: DType, len: usize) -> Result<()> {
    let per = dtype.block_values();
    if len.is_multiple_of(per) {
        return Ok(());
    }
    Err(ComputeError::shape(op, format!("{dtype} holds whole blocks of {per} values; got {len}"), shapes()))
}

impl Op {
    /// Shorthand for [`Op::Unary`] on `f32`.
    pub fn unary(op: UnaryOp, len: usize) -> Self {
        Op::Unary { op, len, dtype: DType::F32 }
    }
    /// Shorthand for [`Op::Binary`] on `f32`.
    pub fn binary(op: BinaryOp, len: usize) -> Self {
        Op::Binary { op, len, dtype: DType::F32 }
    }
    /// Shorthand for [`Op::Reduce`] on `f32`.
    pub fn reduce(op: ReduceOp, len: usize) -> Self {
        Op::Reduce { op, len, dtype: DType::F32 }
    }
    /// Shorthand for [`Op::Dot`] on `f32`.
    pub fn dot(len: usize) -> Self {
        Op::Dot { len, dtype: DType::F32 }
    }
    /// Shorthand for [`Op::Rows`] on `f32`.
    pub fn rows(op: RowOp, rows: usize, cols: usize) -> Self {
        Op::Rows { op, rows, cols, dtype: DType::F32 }
    }
    /// Shorthand for a plain `m × k` by `k × n` [`Op::Matmul`] on `f32`.
    pub fn matmul(m: usize, k: usize, n: usize) -> Self {
        Op::Matmul(MatmulSpec::new(m, k, n))
    }
    /// Shorthand for [`Op::Lerp`] on `f32`.
    pub fn lerp(len: usize, t: f32) -> Self {
        Op::Lerp { len, t, dtype: DType::F32 }
    }
    /// Shorthand for [`Op::Slerp`] on `f32`.
    pub fn slerp(rows: usize, cols: usize, t: f32) -> Self {
        Op::Slerp { rows, cols, t, dtype: DType::F32 }
    }
    /// Shorthand for [`Op::Cast`].
    pub fn cast(len: usize, from: DType, to: DType) -> Self {
        Op::Cast { len, from, to }
    }
    /// Shorthand for [`Op::QuantMatmul`] of `f32` activations (`m × k`)
    /// and an `n × k` weight in `weight`.
    pub fn quant_matmul(m: usize, k: usize, n: usize, weight: DType) -> Self {
        Op::QuantMatmul(QuantMatmulSpec::new(m, k, n, weight))
    }

    /// The same op on data of `dtype`: its inputs and output (a reduction's
    /// output stays `f32`; a cast takes `dtype` as its input; a matmul both
    /// reads and writes `dtype`, see [`MatmulSpec::with_dtypes`] to differ;
    /// a quantized matmul keeps its weight's dtype).
    pub fn with_dtype(self, dtype: DType) -> Self {
        match self {
            Op::Unary { op, len, .. } => Op::Unary { op, len, dtype },
            Op::Binary { op, len, .. } => Op::Binary { op, len, dtype },
            Op::Reduce { op, len, .. } => Op::Reduce { op, len, dtype },
            Op::Dot { len, .. } => Op::Dot { len, dtype },
            Op::Rows { op, rows, cols, .. } => Op::Rows { op, rows, cols, dtype },
            Op::Lerp { len, t, .. } => Op::Lerp { len, t, dtype },
            Op::Slerp { rows, cols, t, .. } => Op::Slerp { rows, cols, t, dtype },
            Op::Matmul(s) => Op::Matmul(s.with_dtypes(dtype, dtype)),
            Op::QuantMatmul(s) => Op::QuantMatmul(s.with_dtypes(dtype, dtype)),
            Op::Conv2d(c) => Op::Conv2d(Conv2dSpec { dtype, ..c }),
            Op::Attention(a) => Op::Attention(a.with_dtype(dtype)),
            Op::Rope(r) => Op::Rope(r.with_dtype(dtype)),
            Op::Copy(c) => Op::Copy(c.with_dtype(dtype)),
            Op::Gather { ids, rows, cols, .. } => Op::Gather { ids, rows, cols, dtype },
            Op::ArgMax { rows, cols, .. } => Op::ArgMax { rows, cols, dtype },
            Op::Glu { rows, cols, .. } => Op::Glu { rows, cols, dtype },
            Op::Cast { len, to, .. } => Op::Cast { len, from: dtype, to },
        }
    }

    /// The dtype of the op's (first) input (a quantized matmul's activations;
    /// its weight's dtype is [`Op::weight_dtype`]).
    pub fn dtype(&self) -> DType {
        match *self {
            Op::Unary { dtype, .. }
            | Op::Binary { dtype, .. }
            | Op::Reduce { dtype, .. }
            | Op::Dot { dtype, .. }
            | Op::Rows { dtype, .. }
            | Op::Lerp { dtype, .. }
            | Op::Slerp { dtype, .. } => dtype,
            Op::Matmul(s) => s.dtype,
            Op::QuantMatmul(s) => s.dtype,
            Op::Conv2d(c) => c.dtype,
            Op::Attention(a) => a.dtype,
            Op::Rope(r) => r.dtype,
            Op::Copy(c) => c.dtype,
            Op::Gather { dtype, .. } | Op::ArgMax { dtype, .. } | Op::Glu { dtype, .. } => dtype,
            Op::Cast { from, .. } => from,
        }
    }

    /// Whether the op leaves part of its output as it was ([`Op::Copy`]
    /// writes only its destination view, a rope [into a
    /// cache](RopeSpec::into_cache) only its tokens' rows), so that a
    /// backend running it on host data must start the device output from
    /// the caller's values. Every other op writes each output element. Free.
    pub fn writes_part_of_output(&self) -> bool {
        matches!(self, Op::Copy(_)) || matches!(self, Op::Rope(r) if r.cache.is_some())
    }

    /// Whether the op reads positions from an input on the device
    /// ([`RopeSpec::with_positions`], [`CopySpec::at_positions`],
    /// [`AttentionSpec::with_positions`]). Free.
    pub fn reads_positions(&self) -> bool {
        match self {
            Op::Rope(r) => r.positions,
            Op::Copy(c) => c.positions.is_some(),
            Op::Attention(a) => a.positions,
            _ => false,
        }
    }

    /// The quantized dtype the op reads or writes, if any: a quantized
    /// matmul's weight, a cast's quantized side.
    pub fn weight_dtype(&self) -> Option<DType> {
        match *self {
            Op::QuantMatmul(s) => Some(s.weight),
            Op::Cast { from, to, .. } => [from, to].into_iter().find(|d| d.is_quantized()),
            _ => None,
        }
    }

    /// The dtype of the op's output.
    pub fn out_dtype(&self) -> DType {
        match *self {
            Op::Reduce { .. } | Op::Dot { .. } | Op::ArgMax { .. } => DType::F32,
            Op::Matmul(s) => s.out_dtype,
            Op::QuantMatmul(s) => s.out_dtype,
            Op::Cast { to, .. } => to,
            _ => self.dtype(),
        }
    }

    /// Every dtype the op reads or writes, without repeats, input first
    /// (a quantized matmul: activations, weight, output).
    pub fn dtypes(&self) -> Vec<DType> {
        let mut v = vec![self.dtype()];
        for d in [self.weight_dtype(), Some(self.out_dtype())].into_iter().flatten() {
            if !v.contains(&d) {
                v.push(d);
            }
        }
        v
    }

    /// The op's name, e.g. `"softmax"`.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Unary { op, .. } => op.name(),
            Op::Binary { op, .. } => op.name(),
            Op::Reduce { op, .. } => op.name(),
            Op::Dot { .. } => "dot",
            Op::Rows { op, .. } => op.name(),
            Op::Lerp { .. } => "lerp",
            Op::Slerp { .. } => "slerp",
            Op::Matmul(s) if s.batch > 1 => "batched_matmul",
            Op::Matmul(_) => "matmul",
            Op::QuantMatmul(_) => "quant_matmul",
            Op::Conv2d(_) => "conv2d",
            Op::Attention(_) => "attention",
            Op::Rope(_) => "rope",
            Op::Copy(_) => "copy",
            Op::Gather { .. } => "gather",
            Op::ArgMax { .. } => "argmax",
            Op::Glu { .. } => "glu",
            Op::Cast { .. } => "cast",
        }
    }

    /// The op's class, for per-class throughput in cost models.
    pub fn class(&self) -> OpClass {
        match self {
            Op::Unary { op, .. } if op.is_transcendental() => OpClass::Transcendental,
            Op::Binary { op, .. } if op.is_transcendental() => OpClass::Transcendental,
            Op::Rope(_) | Op::Glu { .. } => OpClass::Transcendental,
            Op::Unary { .. }
            | Op::Binary { .. }
            | Op::Cast { .. }
            | Op::Lerp { .. }
            | Op::Copy(_)
            | Op::Gather { .. } => OpClass::Elementwise,
            Op::Reduce { .. } | Op::Dot { .. } => OpClass::Reduction,
            Op::Rows { .. } | Op::Slerp { .. } | Op::ArgMax { .. } => OpClass::RowWise,
            Op::Matmul(_) | Op::QuantMatmul(_) => OpClass::Matmul,
            Op::Conv2d(_) => OpClass::Conv,
            // Decoding (at most 16 query rows per key/value head) is one pass
            // over the KV cache, bound by memory like a row op; longer query
            // blocks are two matrix products per key block.
            Op::Attention(a) if a.group().saturating_mul(a.seq_q) <= 16 => OpClass::RowWise,
            Op::Attention(_) => OpClass::Matmul,
        }
    }

    /// The op's sizes as text, for error messages and tables
    /// (`a=[64x32] b=[32x16]`), followed by its dtypes unless all are `f32`
    /// (`x=[1024] bf16`, `a=[64x32] b=[32x16] bf16→f32`).
    pub fn shapes(&self) -> String {
        let base = match *self {
            Op::Unary { len, .. } | Op::Reduce { len, .. } | Op::Cast { len, .. } => format!("x=[{len}]"),
            Op::Binary { len, .. } | Op::Dot { len, .. } => format!("a=[{len}] b=[{len}]"),
            Op::Lerp { len, t, .. } => format!("a=[{len}] b=[{len}] t={t}"),
            Op::Rows { rows, cols, .. } => format!("x=[{rows}x{cols}]"),
            Op::Slerp { rows, cols, t, .. } => format!("a=[{rows}x{cols}] b=[{rows}x{cols}] t={t}"),
            Op::Matmul(s) => {
                let (ar, ac) = if s.trans_a { (s.k, s.m) } else { (s.m, s.k) };
                let (br, bc) = if s.trans_b { (s.n, s.k) } else { (s.k, s.n) };
                let b = if s.batch > 1 { format!("{}x", s.batch) } else { String::new() };
                let strides = if s.has_batch_strides() {
                    format!(" batch strides a={} b={}", s.stride_a(), s.stride_b())
                } else {
                    String::new()
                };
                format!(
                    "a=[{b}{ar}x{ac}]{} b=[{b}{br}x{bc}]{}{strides}{}",
                    if s.trans_a { "ᵀ" } else { "" },
                    if s.trans_b { "ᵀ" } else { "" },
                    s.epilogue.describe()
                )
            }
            Op::QuantMatmul(s) => {
                let norm = s.rms_norm.map_or(String::new(), |e| format!(" rms_norm(eps={})", e.0));
                let glu = if s.glu { " glu" } else { "" };
                format!("x=[{}x{}]{norm} w=[{}x{}]ᵀ {}{glu}{}", s.m, s.k, s.n, s.k, s.weight, s.epilogue.describe())
            }
            Op::Conv2d(c) => format!(
                "x=[{}x{}x{}x{}] w=[{}x{}x{}x{}] stride={:?} pad={:?}",
                c.n, c.c_in, c.h, c.w, c.c_out, c.c_in, c.kh, c.kw, c.stride, c.padding
            ),
            Op::Attention(a) => a.shapes(),
            Op::Rope(r) => format!(
                "x=[{}x{}x{}]{} pos={} theta={}{}{}{}",
                r.seq,
                r.heads,
                r.head_dim,
                match r.source {
                    Some(h) => format!(" of rows of {} heads from {}", h.row_heads, h.first),
                    None => String::new(),
                },
                if r.positions { format!("[{}]", r.seq) } else { r.position.to_string() },
                r.theta,
                if r.layout == RopeLayout::Interleaved { " interleaved" } else { "" },
                match r.scaling {
                    Some(s) => format!(
                        " llama3(factor={} low={} high={} ctx={})",
                        s.factor, s.low_freq_factor, s.high_freq_factor, s.original_max_position
                    ),
                    None => String::new(),
                },
                match r.cache {
                    Some(c) => format!(" into cache=[{}x{}x{}]", r.heads, c, r.head_dim),
                    None => String::new(),
                }
            ),
            Op::Copy(c) => format!(
                "shape={:?} src=[{}]+{}:{:?} dst=[{}]+{}:{:?}{}",
                c.shape,
                c.src.len,
                c.src.offset,
                c.src.strides,
                c.dst.len,
                c.dst.offset,
                c.dst.strides,
                match c.positions {
                    Some(slots) => format!(" positions=[{}]<{slots}", c.shape[1]),
                    None => String::new(),
                }
            ),
            Op::Gather { ids, rows, cols, .. } => format!("table=[{rows}x{cols}] ids=[{ids}]"),
            Op::ArgMax { rows, cols, .. } => format!("x=[{rows}x{cols}]"),
            Op::Glu { rows, cols, .. } => format!("x=[{rows}x2x{cols}]"),
        };
        let (from, to) = (self.dtype(), self.out_dtype());
        let reduces = matches!(self, Op::Reduce { .. } | Op::Dot { .. } | Op::ArgMax { .. });
        let precision = match self {
            Op::Matmul(s) if s.precision == Precision::Tf32 => " tf32",
            _ => "",
        };
        if matches!(self, Op::Cast { .. }) || (from != to && !reduces) {
            format!("{base} {from}→{to}{precision}")
        } else if from != DType::F32 {
            format!("{base} {from}{precision}")
        } else {
            format!("{base}{precision}")
        }
    }

    /// Validates the op's sizes (no zero dimension, no `usize` overflow, a kernel
    /// that fits) and returns each input and output with its length and dtype.
    pub fn layout(&self) -> Result<Layout> {
        let name = self.name();
        let shapes = || self.shapes();
        let d = self.dtype();
        let o = |len: usize| [Operand::new(len, self.out_dtype())];
        let i = |len: usize| Operand::new(len, d);
        match *self {
            Op::Unary { len, .. } => {
                mul(name, &shapes, &[len])?;
                Ok(Layout::new(&[i(len)], &o(len)))
            }
            Op::Cast { len, from, to } => {
                mul(name, &shapes, &[len])?;
                if from.is_quantized() && to.is_quantized() && from != to {
                    return Err(ComputeError::DType {
                        op: name,
                        detail: format!("no cast between two quantized dtypes ({from} to {to}); dequantize first"),
                        shapes: shapes(),
                    });
                }
                whole_blocks(name, &shapes, from, len)?;
                whole_blocks(name, &shapes, to, len)?;
                Ok(Layout::new(&[i(len)], &o(len)))
            }
            Op::Binary { len, .. } => {
                mul(name, &shapes, &[len])?;
                Ok(Layout::new(&[i(len), i(len)], &o(len)))
            }
            Op::Lerp { len, t, .. } => {
                mul(name, &shapes, &[len])?;
                if !t.is_finite() {
                    return Err(ComputeError::shape(name, "t is not finite", shapes()));
                }
                Ok(Layout::new(&[i(len), i(len)], &o(len)))
            }
            Op::Slerp { rows, cols, t, .. } => {
                let n = mul(name, &shapes, &[rows, cols])?;
                if !(0.0..=1.0).contains(&t) {
                    return Err(ComputeError::shape(name, "t is outside [0, 1]", shapes()));
                }
                Ok(Layout::new(&[i(n), i(n)], &o(n)))
            }
            Op::Reduce { len, .. } => {
                mul(name, &shapes, &[len])?;
                Ok(Layout::new(&[i(len)], &o(1)))
            }
            Op::Dot { len, .. } => {
                mul(name, &shapes, &[len])?;
                Ok(Layout::new(&[i(len), i(len)], &o(1)))
            }
            Op::Rows { op, rows, cols, .. } => {
                let n = mul(name, &shapes, &[rows, cols])?;
                match op {
                    RowOp::Softmax | RowOp::LogSoftmax => Ok(Layout::new(&[i(n)], &o(n))),
                    RowOp::LayerNorm { .. } => Ok(Layout::new(&[i(n), i(cols), i(cols)], &o(n))),
                    RowOp::RmsNorm { .. } => Ok(Layout::new(&[i(n), i(cols)], &o(n))),
                }
            }
            Op::Matmul(s) => {
                // Matrix z of A starts at z·stride: the last ends (batch − 1)·stride + its size in.
                let span = |stride: usize, size: usize| -> Result<usize> {
                    let before = s.batch.saturating_sub(1).checked_mul(stride);
                    before
                        .and_then(|x| x.checked_add(size))
                        .ok_or_else(|| ComputeError::shape(name, "size overflows usize", shapes()))
                };
                // Every dimension non-zero, the contiguous sizes within usize.
                mul(name, &shapes, &[s.batch, s.m, s.k])?;
                mul(name, &shapes, &[s.batch, s.k, s.n])?;
                let c = mul(name, &shapes, &[s.batch, s.m, s.n])?;
                let a = span(s.stride_a(), s.m * s.k)?;
                let b = span(s.stride_b(), s.k * s.n)?;
                let e = s.epilogue;
                if !(e.alpha.is_finite() && e.beta.is_finite()) {
                    return Err(ComputeError::shape(name, "the epilogue's alpha and beta must be finite", shapes()));
                }
                let mut inputs = vec![i(a), i(b)];
                if e.bias {
                    inputs.push(Operand::new(s.n, s.out_dtype));
                }
                if e.reads_c() {
                    inputs.push(Operand::new(c, s.out_dtype));
                }
                Ok(Layout::new(&inputs, &o(c)))
            }
            Op::Rope(r) => {
                let n = mul(name, &shapes, &[r.seq, r.heads, r.head_dim])?;
                let (row_heads, first) = r.input_heads();
                if first.checked_add(r.heads).is_none_or(|end| end > row_heads) {
                    return Err(ComputeError::shape(name, "the turned heads reach past the input's rows", shapes()));
                }
                let x = mul(name, &shapes, &[r.seq, row_heads, r.head_dim])?;
                if !r.head_dim.is_multiple_of(2) {
                    return Err(ComputeError::shape(name, "head_dim is odd: values rotate in pairs", shapes()));
                }
                if !(r.theta.is_finite() && r.theta > 1.0) {
                    return Err(ComputeError::shape(name, "theta must be finite and above 1", shapes()));
                }
                if r.scaling.is_some_and(|s| !s.is_valid()) {
                    return Err(ComputeError::shape(
                        name,
                        "the scaling needs finite factors, factor >= 1, 0 <= low < high and a context",
                        shapes(),
                    ));
                }
                r.position
                    .checked_add(r.seq)
                    .ok_or_else(|| ComputeError::shape(name, "positions overflow", shapes()))?;
                float_only(name, &shapes, d)?;
                // Into a cache: the output is the whole [heads, capacity, head_dim] cache.
                let n = match r.cache {
                    None => n,
                    Some(capacity) => {
                        if !r.positions && r.position.saturating_add(r.seq) > capacity {
                            return Err(ComputeError::shape(
                                name,
                                "the tokens' rows reach past the cache's capacity",
                                shapes(),
                            ));
                        }
                        mul(name, &shapes, &[r.heads, capacity, r.head_dim])?
                    }
                };
                if r.positions {
                    Ok(Layout::new(&[i(x), Operand::new(r.seq, DType::F32)], &o(n)))
                } else {
                    Ok(Layout::new(&[i(x)], &o(n)))
                }
            }
            Op::Copy(c) => {
                mul(name, &shapes, &c.shape)?;
                float_only(name, &shapes, d)?;
                if c.positions == Some(0) {
                    return Err(ComputeError::shape(name, "the destination has no slot for positions", shapes()));
                }
                for (what, view, extent) in [("source", c.src, c.shape), ("destination", c.dst, c.dst_extent())] {
                    match view.last(extent) {
                        Some(last) if last < view.len => {}
                        _ => {
                            return Err(ComputeError::shape(
                                name,
                                format!("the {what} view reaches past its {} elements", view.len),
                                shapes(),
                            ));
                        }
                    }
                }
                if !c.dst.is_one_to_one(c.dst_extent()) {
                    return Err(ComputeError::shape(name, "the destination view writes an element twice", shapes()));
                }
                if c.positions.is_some() {
                    Ok(Layout::new(&[i(c.src.len), Operand::new(c.shape[1], DType::F32)], &o(c.dst.len)))
                } else {
                    Ok(Layout::new(&[i(c.src.len)], &o(c.dst.len)))
                }
            }
            Op::Gather { ids, rows, cols, .. } => {
                let table = mul(name, &shapes, &[rows, cols])?;
                let y = mul(name, &shapes, &[ids, cols])?;
                if rows > 1 << 24 {
                    return Err(ComputeError::shape(name, "more than 2^24 rows: f32 ids cannot name them", shapes()));
                }
                float_only(name, &shapes, d)?;
                Ok(Layout::new(&[i(table), Operand::new(ids, DType::F32)], &o(y)))
            }
            Op::Glu { rows, cols, .. } => {
                let y = mul(name, &shapes, &[rows, cols])?;
                let x = mul(name, &shapes, &[y, 2])?;
                float_only(name, &shapes, d)?;
                Ok(Layout::new(&[i(x)], &o(y)))
            }
            Op::ArgMax { rows, cols, .. } => {
                let n = mul(name, &shapes, &[rows, cols])?;
                if cols > 1 << 24 {
                    return Err(ComputeError::shape(name, "more than 2^24 columns: f32 cannot name them", shapes()));
                }
                float_only(name, &shapes, d)?;
                Ok(Layout::new(&[i(n)], &o(rows)))
            }
            Op::QuantMatmul(s) => {
                let x = mul(name, &shapes, &[s.m, s.k])?;
                let w = mul(name, &shapes, &[s.n, s.k])?;
                let y = mul(name, &shapes, &[s.m, s.n])?;
                if !s.weight.is_quantized() {
                    return Err(ComputeError::DType {
                        op: name,
                        detail: format!("the weight is {}; expected one of q4_K, q5_K, q6_K, q8_0", s.weight),
                        shapes: shapes(),
                    });
                }
                if s.dtype.is_quantized() || s.out_dtype.is_quantized() {
                    return Err(ComputeError::DType {
                        op: name,
                        detail: format!("activations and output are float dtypes; got {}→{}", s.dtype, s.out_dtype),
                        shapes: shapes(),
                    });
                }
                whole_blocks(name, &shapes, s.weight, s.k)?;
                let e = s.epilogue;
                if !(e.alpha.is_finite() && e.beta.is_finite()) {
                    return Err(ComputeError::shape(name, "the epilogue's alpha and beta must be finite", shapes()));
                }
                if s.rms_norm.is_some_and(|eps| !(eps.0 >= 0.0 && eps.0.is_finite())) {
                    return Err(ComputeError::shape(name, "the norm's eps must be finite and not negative", shapes()));
                }
                if s.glu && (!s.n.is_multiple_of(2) || !e.is_identity()) {
                    let why = "a gated product takes an even number of weight rows and no other epilogue";
                    return Err(ComputeError::shape(name, why, shapes()));
                }
                // m·n did not overflow, so neither does m·n/2.
                let y = if s.glu { s.m * s.out_cols() } else { y };
                let mut inputs = vec![i(x), Operand::new(w, s.weight)];
                if s.rms_norm.is_some() {
                    inputs.push(i(s.k));
                }
                if e.bias {
                    inputs.push(Operand::new(s.n, s.out_dtype));
                }
                if e.reads_c() {
                    inputs.push(Operand::new(y, s.out_dtype));
                }
                Ok(Layout::new(&inputs, &o(y)))
            }
            Op::Conv2d(c) => {
                let x = mul(name, &shapes, &[c.n, c.c_in, c.h, c.w])?;
                let w = mul(name, &shapes, &[c.c_out, c.c_in, c.kh, c.kw])?;
                let (oh, ow) = c.output_hw().ok_or_else(|| {
                    ComputeError::shape(name, "kernel larger than padded input, or zero stride", shapes())
                })?;
                let y = mul(name, &shapes, &[c.n, c.c_out, oh, ow])?;
                Ok(Layout::new(&[i(x), i(w)], &o(y)))
            }
            Op::Attention(a) => {
                let q = mul(name, &shapes, &[a.batch, a.heads_q, a.seq_q, a.head_dim])?;
                mul(name, &shapes, &[a.seq_k])?;
                if a.kv_rows() < a.seq_k {
                    return Err(ComputeError::shape(name, "the KV capacity is below seq_k", shapes()));
                }
                let kv = mul(name, &shapes, &[a.batch, a.heads_kv, a.kv_rows(), a.head_dim])?;
                if !a.heads_q.is_multiple_of(a.heads_kv) {
                    return Err(ComputeError::shape(name, "heads_q is not a multiple of heads_kv", shapes()));
                }
                if !a.scale.is_finite() {
                    return Err(ComputeError::shape(name, "the softmax scale is not finite", shapes()));
                }
                if a.positions {
                    let positions = mul(name, &shapes, &[a.batch, a.seq_q])?;
                    Ok(Layout::new(&[i(q), i(kv), i(kv), Operand::new(positions, DType::F32)], &o(q)))
                } else {
                    Ok(Layout::new(&[i(q), i(kv), i(kv)], &o(q)))
                }
            }
        }
    }

    /// Validates the op and checks that the given input and output lengths
    /// match it (lengths only; [`Op::check_operands`] checks dtypes too).
    pub fn check(&self, inputs: &[usize], output: usize) -> Result<Layout> {
        let layout = self.layout()?;
        self.check_lens(&layout, inputs.len(), |i| inputs[i], output)?;
        Ok(layout)
    }

    /// Validates the op and checks the given inputs and output against it:
    /// lengths ([`ComputeError::Shape`]) and then dtypes ([`ComputeError::DType`]).
    /// Every backend calls this (through [`crate::check_host_call`] or
    /// [`crate::check_tensor_call`]) before touching any data.
    pub fn check_operands(&self, inputs: &[Operand], output: Operand) -> Result<Layout> {
        self.check_with(inputs.len(), |i| inputs[i], output)
    }

    /// [`Op::check_operands`] with the inputs given by index, so callers
    /// need not collect them. Allocates nothing for up to six operands.
    pub(crate) fn check_with(&self, n: usize, input: impl Fn(usize) -> Operand, output: Operand) -> Result<Layout> {
        let layout = self.layout()?;
        self.check_lens(&layout, n, |i| input(i).len, output.len)?;
        let mismatch = |what: String, got: DType, want: DType| ComputeError::DType {
            op: self.name(),
            detail: format!("{what} is {got}, expected {want}"),
            shapes: self.shapes(),
        };
        for (i, want) in layout.inputs().iter().enumerate() {
            let got = input(i).dtype;
            if got != want.dtype {
                return Err(mismatch(format!("input {i}"), got, want.dtype));
            }
        }
        if output.dtype != layout.output().dtype {
            return Err(mismatch("the output".into(), output.dtype, layout.output().dtype));
        }
        Ok(layout)
    }

    fn check_lens(&self, layout: &Layout, n: usize, len: impl Fn(usize) -> usize, output: usize) -> Result<()> {
        let expected = layout.inputs();
        if n != expected.len() {
            return Err(ComputeError::shape(
                self.name(),
                format!("expected {} inputs, got {n}", expected.len()),
                self.shapes(),
            ));
        }
        for (i, want) in expected.iter().enumerate() {
            let got = len(i);
            if got != want.len {
                return Err(ComputeError::shape(
                    self.name(),
                    format!("input {i} has {got} elements, expected {}", want.len),
                    self.shapes(),
                ));
            }
        }
        if output != layout.output_len() {
            return Err(ComputeError::shape(
                self.name(),
                format!("output has {output} elements, expected {}", layout.output_len()),
                self.shapes(),
            ));
        }
        Ok(())
    }

    /// FLOPs and minimum bytes moved, each operand at its dtype's size
    /// (quantized operands at their blocks' bytes). Saturates rather than
    /// overflowing for absurd sizes; call [`Op::layout`] to reject those.
    pub fn cost(&self) -> Cost {
        let u = |x: usize| x as u64;
        let bytes = |d: DType, x: u64| {
            let per = d.block_values() as u64;
            x.div_ceil(per).saturating_mul(d.size_in_bytes() as u64)
        };
        let (din, dout) = (self.dtype(), self.out_dtype());
        let read = |xs: &[u64]| xs.iter().fold(0u64, |a, &x| a.saturating_add(bytes(din, x)));
        let write = |x: u64| bytes(dout, x);
        match *self {
            Op::Unary { op, len, .. } => Cost {
                flops: op.flops_per_element().saturating_mul(u(len)),
                bytes_read: read(&[u(len)]),
                bytes_written: write(u(len)),
            },
            Op::Cast { len, .. } => Cost { flops: u(len), bytes_read: read(&[u(len)]), bytes_written: write(u(len)) },
            Op::Binary { op, len, .. } => Cost {
                flops: op.flops_per_element().saturating_mul(u(len)),
                bytes_read: read(&[u(len), u(len)]),
                bytes_written: write(u(len)),
            },
            // Per pair: an angle, its cosine and sine, four multiplies, two adds.
            Op::Rope(r) => {
                let n = u(r.seq).saturating_mul(u(r.heads)).saturating_mul(u(r.head_dim));
                Cost { flops: 5u64.saturating_mul(n), bytes_read: read(&[n]), bytes_written: write(n) }
            }
            Op::Copy(c) => {
                let n = u(c.count());
                Cost { flops: 0, bytes_read: read(&[n]), bytes_written: write(n) }
            }
            Op::Gather { ids, cols, .. } => {
                let n = u(ids).saturating_mul(u(cols));
                Cost { flops: 0, bytes_read: read(&[n]).saturating_add(4 * u(ids)), bytes_written: write(n) }
            }
            Op::ArgMax { rows, cols, .. } => {
                let n = u(rows).saturating_mul(u(cols));
                Cost { flops: n, bytes_read: read(&[n]), bytes_written: write(u(rows)) }
            }
            Op::Glu { rows, cols, .. } => {
                let n = u(rows).saturating_mul(u(cols));
                Cost {
                    flops: BinaryOp::SwiGlu.flops_per_element().saturating_mul(n),
                    bytes_read: read(&[n, n]),
                    bytes_written: write(n),
                }
            }
            // A subtraction and a multiply-add per element.
            Op::Lerp { len, .. } => Cost {
                flops: 3u64.saturating_mul(u(len)),
                bytes_read: read(&[u(len), u(len)]),
                bytes_written: write(u(len)),
            },
            // Three multiply-adds per element for the sums, a multiply and a
            // multiply-add for the output, and about 40 per row for the angle.
            Op::Slerp { rows, cols, .. } => {
                let n = u(rows).saturating_mul(u(cols));
                Cost {
                    flops: 10u64.saturating_mul(n).saturating_add(40u64.saturating_mul(u(rows))),
                    bytes_read: read(&[n, n]),
                    bytes_written: write(n),
                }
            }
            Op::Reduce { len, .. } => Cost { flops: u(len), bytes_read: read(&[u(len)]), bytes_written: write(1) },
            Op::Dot { len, .. } => {
                Cost { flops: 2 * u(len), bytes_read: read(&[u(len), u(len)]), bytes_written: write(1) }
            }
            Op::Rows { op, rows, cols, .. } => {
                let n = u(rows).saturating_mul(u(cols));
                let params = match op {
                    RowOp::Softmax | RowOp::LogSoftmax => 0,
                    RowOp::LayerNorm { .. } => 2 * u(cols),
                    RowOp::RmsNorm { .. } => u(cols),
                };
                Cost {
                    flops: op.flops_per_element().saturating_mul(n),
                    bytes_read: read(&[n, params]),
                    bytes_written: write(n),
                }
            }
            Op::Matmul(s) => {
                let (b, m, k, n) = (u(s.batch), u(s.m), u(s.k), u(s.n));
                let span =
                    |stride: usize, size: u64| b.saturating_sub(1).saturating_mul(u(stride)).saturating_add(size);
                let e = s.epilogue;
                let mn = b.saturating_mul(m * n);
                let extra = bytes(s.out_dtype, if e.bias { n } else { 0 })
                    .saturating_add(bytes(s.out_dtype, if e.reads_c() { mn } else { 0 }));
                Cost {
                    flops: 2u64
                        .saturating_mul(b)
                        .saturating_mul(m)
                        .saturating_mul(k)
                        .saturating_mul(n)
                        .saturating_add(mn.saturating_mul(e.flops_per_element())),
                    // Distinct elements: a matrix shared or overlapping is read once.
                    bytes_read: read(&[
                        b.saturating_mul(m * k).min(span(s.stride_a(), m * k)),
                        b.saturating_mul(k * n).min(span(s.stride_b(), k * n)),
                    ])
                    .saturating_add(extra),
                    bytes_written: write(mn),
                }
            }
            Op::QuantMatmul(s) => {
                let (m, k, n) = (u(s.m), u(s.k), u(s.n));
                let e = s.epilogue;
                let mn = m.saturating_mul(n);
                let extra = bytes(s.out_dtype, if e.bias { n } else { 0 })
                    .saturating_add(bytes(s.out_dtype, if e.reads_c() { mn } else { 0 }));
                let (norm_flops, g) = match s.rms_norm {
                    Some(_) => (m.saturating_mul(k).saturating_mul(4), k),
                    None => (0, 0),
                };
                let (glu_flops, out) = if s.glu {
                    (BinaryOp::SwiGlu.flops_per_element().saturating_mul(mn / 2), mn / 2)
                } else {
                    (mn.saturating_mul(e.flops_per_element()), mn)
                };
                Cost {
                    flops: 2u64
                        .saturating_mul(m)
                        .saturating_mul(k)
                        .saturating_mul(n)
                        .saturating_add(glu_flops)
                        .saturating_add(norm_flops),
                    bytes_read: read(&[m.saturating_mul(k), g])
                        .saturating_add(bytes(s.weight, n.saturating_mul(k)))
                        .saturating_add(extra),
                    bytes_written: write(out),
                }
            }
            Op::Conv2d(c) => {
                let (oh, ow) = c.output_hw().unwrap_or((0, 0));
                let out = u(c.n) * u(c.c_out) * u(oh) * u(ow);
                let macs = out.saturating_mul(u(c.c_in) * u(c.kh) * u(c.kw));
                Cost {
                    flops: macs.saturating_mul(2),
                    bytes_read: read(&[
                        u(c.n) * u(c.c_in) * u(c.h) * u(c.w),
                        u(c.c_out) * u(c.c_in) * u(c.kh) * u(c.kw),
                    ]),
                    bytes_written: write(out),
                }
            }
            Op::Attention(a) => {
                let heads = u(a.batch).saturating_mul(u(a.heads_q));
                let q = heads.saturating_mul(u(a.seq_q)).saturating_mul(u(a.head_dim));
                let kv =
                    u(a.batch).saturating_mul(u(a.heads_kv)).saturating_mul(u(a.seq_k)).saturating_mul(u(a.head_dim));
                Cost {
                    // q·kᵀ and p·v: 2 FLOPs per multiply-add, over the visible pairs.
                    flops: 4u64.saturating_mul(heads).saturating_mul(a.pairs()).saturating_mul(u(a.head_dim)),
                    bytes_read: read(&[q, kv, kv]),
                    bytes_written: write(q),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_cost_is_2mkn_and_minimum_traffic() {
        let c = Op::matmul(3, 5, 7).cost();
        assert_eq!(c.flops, 2 * 3 * 5 * 7);
        assert_eq!(c.bytes_read, (3 * 5 + 5 * 7) * 4);
        assert_eq!(c.bytes_written, 3 * 7 * 4);
        let b = Op::Matmul(MatmulSpec { batch: 4, ..MatmulSpec::new(3, 5, 7) }).cost();
        assert_eq!(b.flops, 4 * c.flops);
        assert_eq!(b.bytes(), 4 * c.bytes());
    }

    #[test]
    fn attention_cost_counts_visible_pairs_and_decoding_is_memory_bound() {
        let full = crate::AttentionSpec::new(2, 8, 256, 256, 64).with_kv_heads(2);
        let c = Op::Attention(full).cost();
        assert_eq!(c.flops, 4 * 2 * 8 * 256 * 256 * 64);
        // q and the output: 2·8·256·64 values; k and v: 2·2·256·64 each; 4 bytes.
        assert_eq!(c.bytes_read, 4 * (2 * 8 * 256 * 64 + 2 * 2 * 2 * 256 * 64));
        assert_eq!(c.bytes_written, 4 * 2 * 8 * 256 * 64);
        let causal = Op::Attention(full.causal()).cost();
        assert_eq!(causal.flops, 4 * 2 * 8 * (256 * 257 / 2) * 64);
        assert_eq!(Op::Attention(full).class(), OpClass::Matmul);
        let decode = crate::AttentionSpec::new(4, 32, 1, 8192, 128).with_kv_heads(8).causal();
        assert_eq!(Op::Attention(decode).class(), OpClass::RowWise);
        assert_eq!(
            Op::Attention(decode.with_dtype(DType::BF16)).cost().bytes_read * 2,
            Op::Attention(decode).cost().bytes_read
        );
    }

    #[test]
    fn elementwise_and_reduction_costs() {
        let relu = Op::unary(UnaryOp::Relu, 1000).cost();
        assert_eq!((relu.flops, relu.bytes_read, relu.bytes_written), (1000, 4000, 4000));
        let add = Op::binary(BinaryOp::Add, 1000).cost();
        assert_eq!((add.flops, add.bytes_read, add.bytes_written), (1000, 8000, 4000));
        let dot = Op::dot(1000).cost();
        assert_eq!((dot.flops, dot.bytes_read, dot.bytes_written), (2000, 8000, 4));
        let ln = Op::rows(RowOp::LayerNorm { eps: 1e-5 }, 10, 100).cost();
        assert_eq!((ln.flops, ln.bytes_read, ln.bytes_written), (8000, 4000 + 800, 4000));
    }

    #[test]
    fn interpolation_layouts_costs_and_classes() {
        let lerp = Op::lerp(1000, 0.25);
        let c = lerp.cost();
        assert_eq!((c.flops, c.bytes_read, c.bytes_written), (3000, 8000, 4000));
        assert_eq!(lerp.class(), OpClass::Elementwise);
        assert_eq!(lerp.with_dtype(DType::BF16).shapes(), "a=[1000] b=[1000] t=0.25 bf16");
        let slerp = Op::slerp(10, 100, 0.5).with_dtype(DType::F16);
        let l = slerp.layout().unwrap();
        assert_eq!(l.input_lens().collect::<Vec<_>>(), [1000, 1000]);
        assert_eq!(l.output(), Operand::new(1000, DType::F16));
        assert_eq!(slerp.class(), OpClass::RowWise);
        assert_eq!(slerp.cost().bytes(), 6000);
        for bad in
            [Op::lerp(4, f32::NAN), Op::lerp(4, f32::NEG_INFINITY), Op::slerp(2, 2, 1.01), Op::slerp(2, 2, -0.0001)]
        {
            assert!(matches!(bad.layout(), Err(ComputeError::Shape { .. })), "{bad:?}");
        }
        assert!(Op::slerp(2, 2, 0.0).layout().is_ok() && Op::slerp(2, 2, 1.0).layout().is_ok());
        assert!(Op::lerp(4, -3.0).layout().is_ok());
    }

    #[test]
    fn same_conv_keeps_the_image_size_for_odd_kernels() {
        let c = Conv2dSpec::same(16, 32, 8, 3);
        assert_eq!((c.n, c.c_in, c.c_out, c.kh, c.kw, c.stride, c.padding), (1, 16, 8, 3, 3, (1, 1), (1, 1)));
        assert_eq!(c.output_hw(), Some((32, 32)));
        assert_eq!(Conv2dSpec::same(1, 7, 1, 5).output_hw(), Some((7, 7)));
    }

    #[test]
    fn conv2d_shape_and_cost() {
        let spec = Conv2dSpec {
            n: 2,
            c_in: 3,
            h: 8,
            w: 10,
            c_out: 4,
            kh: 3,
            kw: 3,
            stride: (2, 1),
            padding: (1, 0),
            dtype: DType::F32,
        };
        assert_eq!(spec.output_hw(), Some((4, 8)));
        let op = Op::Conv2d(spec);
        let l = op.layout().unwrap();
        assert_eq!(l.input_lens().collect::<Vec<_>>(), [2 * 3 * 8 * 10, 4 * 3 * 9]);
        assert_eq!(l.output_len(), 2 * 4 * 4 * 8);
        assert_eq!(op.cost().flops, 2 * (2 * 4 * 4 * 8) * 27);
        let bad = Op::Conv2d(Conv2dSpec { kh: 11, padding: (0, 0), ..spec });
        assert!(matches!(bad.layout(), Err(ComputeError::Shape { op: "conv2d", .. })));
    }

    #[test]
    fn batch_strides_size_the_inputs_and_count_distinct_bytes() {
        let spec = MatmulSpec { batch: 3, ..MatmulSpec::new(2, 3, 4) };
        assert_eq!(spec.with_batch_strides(6, 12), spec, "the contiguous strides are no strides");
        assert!(!MatmulSpec::new(2, 3, 4).with_batch_strides(0, 0).has_batch_strides(), "one matrix");
        let spaced = spec.with_batch_strides(8, 0);
        assert!(spaced.has_batch_strides());
        let op = Op::Matmul(spaced);
        let layout = op.layout().unwrap();
        let lens: Vec<usize> = layout.inputs().iter().map(|o| o.len).collect();
        assert_eq!(lens, [2 * 8 + 6, 12]);
        assert_eq!(layout.output_len(), 24);
        // A's 18 values are read once each, B's 12 once for all three products.
        assert_eq!(op.cost().bytes_read, 4 * (18 + 12));
        assert!(op.shapes().contains("batch strides a=8 b=0"), "{}", op.shapes());
        // Overlapping views: the span, not the sum.
        let overlap = Op::Matmul(spec.with_batch_strides(3, 6));
        assert_eq!(overlap.cost().bytes_read, 4 * ((2 * 3 + 6) + (2 * 6 + 12)));
        // B shared, A contiguous: one product of 6 rows.
        let rows = spec.with_batch_strides(6, 0).shared_b_as_rows().unwrap();
        assert_eq!((rows.batch, rows.m, rows.batch_strides), (1, 6, None));
        assert!(MatmulSpec { trans_a: true, ..spec }.with_batch_strides(6, 0).shared_b_as_rows().is_none());
        assert_eq!(spaced.one_of_batch(2).1, [16, 0, 16]);
        let huge = Op::Matmul(spec.with_batch_strides(usize::MAX / 2, 0));
        assert!(matches!(huge.layout(), Err(ComputeError::Shape { .. })));
    }

    #[test]
    fn zero_and_overflow_are_shape_errors() {
        assert!(matches!(Op::unary(UnaryOp::Relu, 0).layout(), Err(ComputeError::Shape { .. })));
        let big = Op::matmul(usize::MAX / 2, 3, 1);
        let err = big.layout().unwrap_err();
        assert!(err.to_string().contains("overflow"), "{err}");
        assert!(err.to_string().contains("matmul"), "{err}");
    }

    #[test]
    fn check_reports_the_mismatch() {
        let op = Op::matmul(2, 3, 4);
        assert!(op.check(&[6, 12], 8).is_ok());
        let err = op.check(&[6, 11], 8).unwrap_err().to_string();
        assert!(err.contains("input 1 has 11 elements, expected 12"), "{err}");
        assert!(err.contains("a=[2x3] b=[3x4]"), "{err}");
        assert!(op.check(&[6], 8).is_err());
        assert!(op.check(&[6, 12], 9).is_err());
    }

    #[test]
    fn half_ops_move_half_the_bytes_and_state_their_dtypes() {
        let relu = Op::unary(UnaryOp::Relu, 1000).with_dtype(DType::BF16);
        assert_eq!((relu.cost().bytes_read, relu.cost().bytes_written), (2000, 2000));
        assert_eq!(relu.shapes(), "x=[1000] bf16");
        let sum = Op::reduce(ReduceOp::Sum, 1000).with_dtype(DType::F16);
        assert_eq!((sum.out_dtype(), sum.cost().bytes_read, sum.cost().bytes_written), (DType::F32, 2000, 4));
        let mm = Op::Matmul(MatmulSpec::new(2, 3, 4).with_dtypes(DType::BF16, DType::F32));
        let c = mm.cost();
        assert_eq!((c.bytes_read, c.bytes_written), ((6 + 12) * 2, 8 * 4));
        assert_eq!(mm.shapes(), "a=[2x3] b=[3x4] bf16→f32");
        let tf32 = Op::Matmul(MatmulSpec::new(2, 3, 4).with_precision(Precision::Tf32));
        assert_eq!(tf32.shapes(), "a=[2x3] b=[3x4] tf32");
        let cast = Op::cast(10, DType::F32, DType::F16);
        assert_eq!(
            (cast.cost().bytes(), cast.class(), cast.shapes().as_str()),
            (60, OpClass::Elementwise, "x=[10] f32→f16")
        );
        let l = mm.layout().unwrap();
        assert_eq!(l.inputs(), [Operand::new(6, DType::BF16), Operand::new(12, DType::BF16)]);
        assert_eq!(l.outputs(), [Operand::new(8, DType::F32)]);
        assert_eq!(l.bytes(), c.bytes());
    }

    #[test]
    fn check_operands_names_the_operand_of_the_wrong_dtype() {
        let op = Op::binary(BinaryOp::Add, 4).with_dtype(DType::F16);
        let f16x4 = Operand::new(4, DType::F16);
        assert!(op.check_operands(&[f16x4, f16x4], f16x4).is_ok());
        let err = op.check_operands(&[f16x4, Operand::new(4, DType::BF16)], f16x4).unwrap_err();
        assert!(matches!(err, ComputeError::DType { op: "add", .. }), "{err:?}");
        assert!(err.to_string().contains("input 1 is bf16, expected f16"), "{err}");
        assert!(err.to_string().contains("a=[4] b=[4] f16"), "{err}");
        let err = op.check_operands(&[f16x4, f16x4], Operand::new(4, DType::F32)).unwrap_err();
        assert!(err.to_string().contains("the output is f32, expected f16"), "{err}");
        // Lengths are checked first: a wrong length is a Shape error whatever the dtypes.
        let short = Operand::new(3, DType::F32);
        assert!(matches!(op.check_operands(&[f16x4, short], f16x4), Err(ComputeError::Shape { .. })));
    }

    #[test]
    fn layouts_hold_any_number_of_operands() {
        let ops: Vec<Operand> = (1..=9).map(|i| Operand::new(i, DType::F16)).collect();
        for split in [0, 3, 5, 9] {
            let l = Layout::new(&ops[..split], &ops[split..]);
            assert_eq!(l.inputs(), &ops[..split]);
            assert_eq!(l.outputs(), &ops[split..]);
        }
        let small = Layout::new(&ops[..2], &ops[2..3]);
        assert_eq!(small.output(), Operand::new(3, DType::F16));
        assert_eq!(small.bytes(), 12);
    }

    #[test]
    fn quantized_matmuls_and_casts_count_block_bytes() {
        let op = Op::quant_matmul(1, 4096, 14336, DType::Q4K);
        let l = op.layout().unwrap();
        assert_eq!(l.inputs(), [Operand::new(4096, DType::F32), Operand::new(4096 * 14336, DType::Q4K)]);
        assert_eq!(l.output(), Operand::new(14336, DType::F32));
        let c = op.cost();
        assert_eq!(c.flops, 2 * 4096 * 14336);
        assert_eq!(c.bytes_read, 4096 * 4 + 14336 * 16 * 144);
        assert_eq!(c.bytes(), l.bytes());
        assert_eq!(op.shapes(), "x=[1x4096] w=[14336x4096]ᵀ q4_K");
        assert_eq!(op.dtypes(), [DType::F32, DType::Q4K]);
        assert_eq!((op.name(), op.class(), op.weight_dtype()), ("quant_matmul", OpClass::Matmul, Some(DType::Q4K)));
        let bad_k = Op::quant_matmul(1, 300, 4, DType::Q6K);
        assert!(matches!(bad_k.layout(), Err(ComputeError::Shape { .. })));
        assert!(Op::quant_matmul(1, 64, 4, DType::Q8_0).layout().is_ok());
        assert!(matches!(Op::quant_matmul(1, 256, 4, DType::BF16).layout(), Err(ComputeError::DType { .. })));
        let deq = Op::cast(512, DType::Q5K, DType::BF16);
        assert_eq!((deq.cost().bytes_read, deq.cost().bytes_written), (2 * 176, 1024));
        assert_eq!(deq.shapes(), "x=[512] q5_K→bf16");
        assert!(matches!(Op::cast(100, DType::F32, DType::Q8_0).layout(), Err(ComputeError::Shape { .. })));
        assert!(matches!(Op::cast(256, DType::Q4K, DType::Q6K).layout(), Err(ComputeError::DType { .. })));
    }

    #[test]
    fn transposed_shapes_print_stored_layout() {
        let op = Op::Matmul(MatmulSpec { trans_a: true, ..MatmulSpec::new(2, 3, 4) });
        assert_eq!(op.shapes(), "a=[3x2]ᵀ b=[3x4]");
    }

    #[test]
    fn epilogues_compute_in_f32_what_the_reference_computes_in_f64() {
        let act = |a: Activation, x: f32| crate::reference::unary(a.unary(), f64::from(x)) as f32;
        let e = Epilogue { alpha: 0.5, beta: -2.0, bias: true, activation: Some(Activation::Silu) };
        for (p, c, bias) in [(3.0f32, 1.0f32, 0.25f32), (-7.5, 0.125, 2.0), (0.0, 0.0, 0.0)] {
            let want = e.apply(f64::from(p), f64::from(c), f64::from(bias));
            let got = e.apply_f32(p, c, bias, act);
            assert!((f64::from(got) - want).abs() <= 1e-6 * (1.0 + want.abs()), "{got} vs {want}");
        }
        // Without beta, C₀ is not read: a NaN there changes nothing.
        let plain = Epilogue { bias: true, ..Epilogue::default() };
        assert_eq!(plain.apply_f32(1.5, f32::NAN, 0.5, act), 2.0);
        assert!(Epilogue::default().is_identity() && !plain.is_identity());
        assert_eq!(e.describe(), " alpha=0.5 beta=-2 +bias silu");
        let spec = MatmulSpec::new(2, 3, 4).with_bias().with_scales(1.0, 1.0);
        let layout = Op::Matmul(spec).layout().unwrap();
        assert_eq!(layout.inputs().iter().map(|o| o.len).collect::<Vec<_>>(), [6, 12, 4, 8]);
        let bad = Op::Matmul(MatmulSpec::new(2, 3, 4).with_scales(f32::NAN, 0.0));
        assert!(matches!(bad.layout(), Err(ComputeError::Shape { .. })));
    }
}
