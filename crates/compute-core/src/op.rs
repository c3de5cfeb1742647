//! The op vocabulary: every operation the library runs, described once.
//!
//! An [`Op`] carries the op's parameters and sizes, never data. From it every
//! backend, the dispatcher's cost model, the batcher and the tests get the same
//! answers to three questions: are these shapes valid ([`Op::layout`]), how long
//! is each input and the output ([`Layout`]), and what does it cost ([`Op::cost`]).
//!
//! Conventions: all data is `f32`, contiguous and row-major. Inputs are passed in
//! the order documented on each variant.

use crate::error::{ComputeError, Result};

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
}

impl BinaryOp {
    /// The op's name.
    pub fn name(&self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
        }
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

/// `C = op(A) · op(B)`, optionally over a batch of independent products.
///
/// `op(A)` is `m × k`: `A` is stored `m × k`, or `k × m` when `trans_a`.
/// `op(B)` is `k × n`: `B` is stored `k × n`, or `n × k` when `trans_b`.
/// `C` is `m × n`. With `batch > 1` the matrices follow each other contiguously.
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
}

impl MatmulSpec {
    /// A plain `m × k` by `k × n` product.
    pub fn new(m: usize, k: usize, n: usize) -> Self {
        MatmulSpec { batch: 1, m, k, n, trans_a: false, trans_b: false }
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
}

impl Conv2dSpec {
    /// One `c_in × hw × hw` image through a `k × k` kernel with stride 1 and
    /// `k / 2` zero padding ("same" size for odd `k`) into `c_out` channels.
    /// Costs nothing; validate with [`Op::layout`].
    pub fn same(c_in: usize, hw: usize, c_out: usize, k: usize) -> Conv2dSpec {
        Conv2dSpec { n: 1, c_in, h: hw, w: hw, c_out, kh: k, kw: k, stride: (1, 1), padding: (k / 2, k / 2) }
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

/// One operation with its parameters and sizes.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Op {
    /// Element-wise, one input of `len`; output `len`.
    Unary {
        /// Which op.
        op: UnaryOp,
        /// Number of elements.
        len: usize,
    },
    /// Element-wise, inputs `a`, `b` of `len`; output `len`.
    Binary {
        /// Which op.
        op: BinaryOp,
        /// Number of elements.
        len: usize,
    },
    /// Reduction of one input of `len` to an output of length 1.
    Reduce {
        /// Which reduction.
        op: ReduceOp,
        /// Number of elements.
        len: usize,
    },
    /// `Σ aᵢ·bᵢ`, inputs `a`, `b` of `len`; output of length 1.
    Dot {
        /// Number of elements.
        len: usize,
    },
    /// Per-row op on `x` (`rows × cols`) plus the op's parameter vectors; output `rows × cols`.
    Rows {
        /// Which op.
        op: RowOp,
        /// Number of rows.
        rows: usize,
        /// Row length.
        cols: usize,
    },
    /// Matrix product; inputs `a`, `b`; output `batch × m × n`.
    Matmul(MatmulSpec),
    /// Convolution; inputs `x`, `w`; output `n × c_out × oh × ow`.
    Conv2d(Conv2dSpec),
}

/// Cost of one op: what the dispatcher's cost model weighs.
///
/// FLOPs count multiply and add separately (a matmul is `2·m·k·n`); one
/// transcendental function counts as one FLOP. Bytes are the minimum traffic:
/// every input read once, the output written once (`f32` = 4 bytes).
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

/// Lengths of an op's inputs and output, in elements, once its shapes are validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    inputs: [usize; 3],
    n_inputs: usize,
    /// Output length in elements.
    pub output: usize,
}

impl Layout {
    /// Input lengths, in the op's input order.
    pub fn inputs(&self) -> &[usize] {
        &self.inputs[..self.n_inputs]
    }

    fn new(inputs: &[usize], output: usize) -> Self {
        let mut arr = [0; 3];
        arr[..inputs.len()].copy_from_slice(inputs);
        Layout { inputs: arr, n_inputs: inputs.len(), output }
    }
}

const F32: u64 = 4;

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

impl Op {
    /// Shorthand for [`Op::Unary`].
    pub fn unary(op: UnaryOp, len: usize) -> Self {
        Op::Unary { op, len }
    }
    /// Shorthand for [`Op::Binary`].
    pub fn binary(op: BinaryOp, len: usize) -> Self {
        Op::Binary { op, len }
    }
    /// Shorthand for [`Op::Rows`].
    pub fn rows(op: RowOp, rows: usize, cols: usize) -> Self {
        Op::Rows { op, rows, cols }
    }
    /// Shorthand for a plain `m × k` by `k × n` [`Op::Matmul`].
    pub fn matmul(m: usize, k: usize, n: usize) -> Self {
        Op::Matmul(MatmulSpec::new(m, k, n))
    }

    /// The op's name, e.g. `"softmax"`.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Unary { op, .. } => op.name(),
            Op::Binary { op, .. } => op.name(),
            Op::Reduce { op, .. } => op.name(),
            Op::Dot { .. } => "dot",
            Op::Rows { op, .. } => op.name(),
            Op::Matmul(s) if s.batch > 1 => "batched_matmul",
            Op::Matmul(_) => "matmul",
            Op::Conv2d(_) => "conv2d",
        }
    }

    /// The op's class, for per-class throughput in cost models.
    pub fn class(&self) -> OpClass {
        match self {
            Op::Unary { op, .. } if op.is_transcendental() => OpClass::Transcendental,
            Op::Unary { .. } | Op::Binary { .. } => OpClass::Elementwise,
            Op::Reduce { .. } | Op::Dot { .. } => OpClass::Reduction,
            Op::Rows { .. } => OpClass::RowWise,
            Op::Matmul(_) => OpClass::Matmul,
            Op::Conv2d(_) => OpClass::Conv,
        }
    }

    /// The op's sizes as text, for error messages and tables (`a=[64x32] b=[32x16]`).
    pub fn shapes(&self) -> String {
        match *self {
            Op::Unary { len, .. } | Op::Reduce { len, .. } => format!("x=[{len}]"),
            Op::Binary { len, .. } | Op::Dot { len } => format!("a=[{len}] b=[{len}]"),
            Op::Rows { rows, cols, .. } => format!("x=[{rows}x{cols}]"),
            Op::Matmul(s) => {
                let (ar, ac) = if s.trans_a { (s.k, s.m) } else { (s.m, s.k) };
                let (br, bc) = if s.trans_b { (s.n, s.k) } else { (s.k, s.n) };
                let b = if s.batch > 1 { format!("{}x", s.batch) } else { String::new() };
                format!(
                    "a=[{b}{ar}x{ac}]{} b=[{b}{br}x{bc}]{}",
                    if s.trans_a { "ᵀ" } else { "" },
                    if s.trans_b { "ᵀ" } else { "" }
                )
            }
            Op::Conv2d(c) => format!(
                "x=[{}x{}x{}x{}] w=[{}x{}x{}x{}] stride={:?} pad={:?}",
                c.n, c.c_in, c.h, c.w, c.c_out, c.c_in, c.kh, c.kw, c.stride, c.padding
            ),
        }
    }

    /// Validates the op's sizes (no zero dimension, no `usize` overflow, a kernel
    /// that fits) and returns the length of each input and of the output.
    pub fn layout(&self) -> Result<Layout> {
        let name = self.name();
        let shapes = || self.shapes();
        match *self {
            Op::Unary { len, .. } => {
                mul(name, &shapes, &[len])?;
                Ok(Layout::new(&[len], len))
            }
            Op::Binary { len, .. } => {
                mul(name, &shapes, &[len])?;
                Ok(Layout::new(&[len, len], len))
            }
            Op::Reduce { len, .. } => {
                mul(name, &shapes, &[len])?;
                Ok(Layout::new(&[len], 1))
            }
            Op::Dot { len } => {
                mul(name, &shapes, &[len])?;
                Ok(Layout::new(&[len, len], 1))
            }
            Op::Rows { op, rows, cols } => {
                let n = mul(name, &shapes, &[rows, cols])?;
                match op {
                    RowOp::Softmax | RowOp::LogSoftmax => Ok(Layout::new(&[n], n)),
                    RowOp::LayerNorm { .. } => Ok(Layout::new(&[n, cols, cols], n)),
                    RowOp::RmsNorm { .. } => Ok(Layout::new(&[n, cols], n)),
                }
            }
            Op::Matmul(s) => {
                let a = mul(name, &shapes, &[s.batch, s.m, s.k])?;
                let b = mul(name, &shapes, &[s.batch, s.k, s.n])?;
                let c = mul(name, &shapes, &[s.batch, s.m, s.n])?;
                Ok(Layout::new(&[a, b], c))
            }
            Op::Conv2d(c) => {
                let x = mul(name, &shapes, &[c.n, c.c_in, c.h, c.w])?;
                let w = mul(name, &shapes, &[c.c_out, c.c_in, c.kh, c.kw])?;
                let (oh, ow) = c.output_hw().ok_or_else(|| {
                    ComputeError::shape(name, "kernel larger than padded input, or zero stride", shapes())
                })?;
                let y = mul(name, &shapes, &[c.n, c.c_out, oh, ow])?;
                Ok(Layout::new(&[x, w], y))
            }
        }
    }

    /// Validates the op and checks that the given input and output lengths match it.
    /// Every backend calls this before touching any data.
    pub fn check(&self, inputs: &[usize], output: usize) -> Result<Layout> {
        let layout = self.layout()?;
        let expected = layout.inputs();
        if inputs.len() != expected.len() {
            return Err(ComputeError::shape(
                self.name(),
                format!("expected {} inputs, got {}", expected.len(), inputs.len()),
                self.shapes(),
            ));
        }
        for (i, (&got, &want)) in inputs.iter().zip(expected).enumerate() {
            if got != want {
                return Err(ComputeError::shape(
                    self.name(),
                    format!("input {i} has {got} elements, expected {want}"),
                    self.shapes(),
                ));
            }
        }
        if output != layout.output {
            return Err(ComputeError::shape(
                self.name(),
                format!("output has {output} elements, expected {}", layout.output),
                self.shapes(),
            ));
        }
        Ok(layout)
    }

    /// FLOPs and minimum bytes moved. Saturates rather than overflowing for
    /// absurd sizes; call [`Op::layout`] to reject those.
    pub fn cost(&self) -> Cost {
        let u = |x: usize| x as u64;
        let read = |xs: &[u64]| xs.iter().fold(0u64, |a, &x| a.saturating_add(x.saturating_mul(F32)));
        match *self {
            Op::Unary { op, len } => Cost {
                flops: op.flops_per_element().saturating_mul(u(len)),
                bytes_read: read(&[u(len)]),
                bytes_written: u(len) * F32,
            },
            Op::Binary { len, .. } => {
                Cost { flops: u(len), bytes_read: read(&[u(len), u(len)]), bytes_written: u(len) * F32 }
            }
            Op::Reduce { len, .. } => Cost { flops: u(len), bytes_read: read(&[u(len)]), bytes_written: F32 },
            Op::Dot { len } => Cost { flops: 2 * u(len), bytes_read: read(&[u(len), u(len)]), bytes_written: F32 },
            Op::Rows { op, rows, cols } => {
                let n = u(rows).saturating_mul(u(cols));
                let params = match op {
                    RowOp::Softmax | RowOp::LogSoftmax => 0,
                    RowOp::LayerNorm { .. } => 2 * u(cols),
                    RowOp::RmsNorm { .. } => u(cols),
                };
                Cost {
                    flops: op.flops_per_element().saturating_mul(n),
                    bytes_read: read(&[n, params]),
                    bytes_written: n.saturating_mul(F32),
                }
            }
            Op::Matmul(s) => {
                let (b, m, k, n) = (u(s.batch), u(s.m), u(s.k), u(s.n));
                Cost {
                    flops: 2u64.saturating_mul(b).saturating_mul(m).saturating_mul(k).saturating_mul(n),
                    bytes_read: read(&[b.saturating_mul(m * k), b.saturating_mul(k * n)]),
                    bytes_written: b.saturating_mul(m * n).saturating_mul(F32),
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
                    bytes_written: out.saturating_mul(F32),
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
    fn elementwise_and_reduction_costs() {
        let relu = Op::unary(UnaryOp::Relu, 1000).cost();
        assert_eq!((relu.flops, relu.bytes_read, relu.bytes_written), (1000, 4000, 4000));
        let add = Op::binary(BinaryOp::Add, 1000).cost();
        assert_eq!((add.flops, add.bytes_read, add.bytes_written), (1000, 8000, 4000));
        let dot = Op::Dot { len: 1000 }.cost();
        assert_eq!((dot.flops, dot.bytes_read, dot.bytes_written), (2000, 8000, 4));
        let ln = Op::rows(RowOp::LayerNorm { eps: 1e-5 }, 10, 100).cost();
        assert_eq!((ln.flops, ln.bytes_read, ln.bytes_written), (8000, 4000 + 800, 4000));
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
        let spec = Conv2dSpec { n: 2, c_in: 3, h: 8, w: 10, c_out: 4, kh: 3, kw: 3, stride: (2, 1), padding: (1, 0) };
        assert_eq!(spec.output_hw(), Some((4, 8)));
        let op = Op::Conv2d(spec);
        let l = op.layout().unwrap();
        assert_eq!(l.inputs(), &[2 * 3 * 8 * 10, 4 * 3 * 9]);
        assert_eq!(l.output, 2 * 4 * 4 * 8);
        assert_eq!(op.cost().flops, 2 * (2 * 4 * 4 * 8) * 27);
        let bad = Op::Conv2d(Conv2dSpec { kh: 11, padding: (0, 0), ..spec });
        assert!(matches!(bad.layout(), Err(ComputeError::Shape { op: "conv2d", .. })));
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
    fn transposed_shapes_print_stored_layout() {
        let op = Op::Matmul(MatmulSpec { trans_a: true, ..MatmulSpec::new(2, 3, 4) });
        assert_eq!(op.shapes(), "a=[3x2]ᵀ b=[3x4]");
    }
}
