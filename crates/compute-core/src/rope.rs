//! Rotary position embedding ([`RopeSpec`]): the parameters of
//! [`Op::Rope`](crate::Op::Rope), and the angles every backend computes.
//!
//! Each vector of `head_dim` values (one head of one token) is split into
//! `head_dim / 2` pairs; pair `i` of the token at position `p` turns by the
//! angle `p · θ^(−2i / head_dim)`:
//!
//! ```text
//! y₁ = x₁·cos(a) − x₂·sin(a)
//! y₂ = x₂·cos(a) + x₁·sin(a)
//! ```
//!
//! Which values form pair `i` is the [`RopeLayout`]: Hugging Face's Llama
//! (`rotate_half`) pairs `x[i]` with `x[i + head_dim/2]`; Meta's original
//! code and ggml's `rope` (mode 0, what llama.cpp runs on GGUF files, whose
//! converter permutes the `q` and `k` weights to match) pair `x[2i]` with
//! `x[2i + 1]`. A model needs the layout its weights were trained, or
//! converted, for.
//!
//! ```
//! use compute_core::{Op, RopeLayout, RopeSpec, reference};
//! // One token at position 1, one head of 4 values, θ = 10000, half-split pairs
//! // (0, 2) and (1, 3): pair 0 turns by 1 radian, pair 1 by 1/100.
//! let spec = RopeSpec::new(1, 1, 4, 10_000.0).at_position(1);
//! let y = reference::run(&Op::Rope(spec), &[&[1.0, 0.0, 0.0, 1.0]])?;
//! assert!((y.values[0] - 1f64.cos()).abs() < 1e-12); // x₁ = 1, x₂ = 0
//! assert!((y.values[2] - 1f64.sin()).abs() < 1e-12);
//! assert!((y.values[1] + 0.01f64.sin()).abs() < 1e-12); // x₁ = 0, x₂ = 1
//! # Ok::<(), compute_core::ComputeError>(())
//! ```

use crate::dtype::DType;

/// Which two values of a head vector turn together ([module](self) docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum RopeLayout {
    /// Pair `i` is `(x[i], x[i + head_dim/2])`: Hugging Face Llama checkpoints
    /// (`rotate_half`).
    #[default]
    HalfSplit,
    /// Pair `i` is `(x[2i], x[2i + 1])`: Meta's original code, ggml and GGUF files.
    Interleaved,
}

/// Rotary position embedding of `x`, `[seq, heads, head_dim]` (token-major,
/// as a projection writes it, or heads of wider rows: [`RopeSpec::from_heads`]);
/// output `[seq, heads, head_dim]` of the same dtype. Token `t`
/// sits at position `position + t`, or, with [`RopeSpec::with_positions`], at
/// the position a second input gives it (`seq` `f32` values, read on the
/// device: a recorded decoding step replays at every position, and tokens
/// of different sequences sit at their own positions).
///
/// Backends compute `θ^(−2i/head_dim)` and the angle in `f32` (as PyTorch's
/// Llama does), then its cosine and sine, in `f32`; the stated bound allows
/// the angle's rounding, `2⁻²⁰·(1 + |a|)·(|x₁| + |x₂|)` per output (at
/// positions in the hundreds of thousands, `f32` angles carry little of the
/// rotation: that is the model's, and PyTorch's, precision too).
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RopeSpec {
    /// Tokens.
    pub seq: usize,
    /// Heads per token.
    pub heads: usize,
    /// Values per head; even.
    pub head_dim: usize,
    /// Position of the first token (the KV cache's length before it).
    pub position: usize,
    /// The base `θ` of the frequencies (10000 for Llama 2, 500000 for Llama 3).
    pub theta: f32,
    /// Which values pair up.
    pub layout: RopeLayout,
    /// Dtype of `x` and the output.
    pub dtype: DType,
    /// Whether each token's position comes from a second input (`seq`
    /// `f32` values) instead of `position + t`.
    #[cfg_attr(feature = "serde", serde(default))]
    pub positions: bool,
    /// Where the turned heads sit in `x` when it holds more than them
    /// ([`RopeSpec::from_heads`]); `None`: `x` is `[seq, heads, head_dim]`.
    #[cfg_attr(feature = "serde", serde(default))]
    pub source: Option<HeadSlice>,
}

/// Heads `first..first + heads` of rows of `row_heads` heads per token: the
/// query or key part of a fused q/k/v projection's output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct HeadSlice {
    /// Heads per token in the input.
    pub row_heads: usize,
    /// The first head turned.
    pub first: usize,
}

impl RopeSpec {
    /// `f32` data, half-split pairs, first token at position 0. Free.
    pub fn new(seq: usize, heads: usize, head_dim: usize, theta: f32) -> Self {
        RopeSpec {
            seq,
            heads,
            head_dim,
            position: 0,
            theta,
            layout: RopeLayout::HalfSplit,
            dtype: DType::F32,
            positions: false,
            source: None,
        }
    }

    /// The same reading its heads out of rows of `row_heads` heads per token,
    /// from head `first` on: `x` is `[seq, row_heads, head_dim]` and the
    /// output `[seq, heads, head_dim]` (the queries or keys of a fused q/k/v
    /// product, without a copy first).
    pub fn from_heads(self, row_heads: usize, first: usize) -> Self {
        RopeSpec { source: Some(HeadSlice { row_heads, first }), ..self }
    }

    /// Heads per token in `x` and the first one turned: `(row_heads, first)`.
    pub fn input_heads(&self) -> (usize, usize) {
        self.source.map_or((self.heads, 0), |s| (s.row_heads, s.first))
    }

    /// The same with each token's position read from a second input of
    /// `seq` `f32` values (whole numbers below 2²⁴ are exact).
    pub fn with_positions(self) -> Self {
        RopeSpec { positions: true, ..self }
    }

    /// The same with the first token at `position`.
    pub fn at_position(self, position: usize) -> Self {
        RopeSpec { position, ..self }
    }

    /// The same with `layout`.
    pub fn with_layout(self, layout: RopeLayout) -> Self {
        RopeSpec { layout, ..self }
    }

    /// The same on `dtype` data.
    pub fn with_dtype(self, dtype: DType) -> Self {
        RopeSpec { dtype, ..self }
    }

    /// The indices of pair `i` within a head vector.
    pub fn pair(&self, i: usize) -> (usize, usize) {
        match self.layout {
            RopeLayout::HalfSplit => (i, i + self.head_dim / 2),
            RopeLayout::Interleaved => (2 * i, 2 * i + 1),
        }
    }

    /// The frequency of pair `i`, `θ^(−2i/head_dim)`, in `f32` as backends
    /// compute it (one `powf`).
    pub fn inv_freq(&self, i: usize) -> f32 {
        1.0 / self.theta.powf((2 * i) as f32 / self.head_dim as f32)
    }

    /// The exact angle of pair `i` at token `t`, in `f64` (the reference's).
    pub fn angle(&self, t: usize, i: usize) -> f64 {
        self.angle_at((self.position + t) as f64, i)
    }

    /// The exact angle of pair `i` at position `p`, in `f64`.
    pub fn angle_at(&self, p: f64, i: usize) -> f64 {
        p * f64::from(self.theta).powf(-((2 * i) as f64) / self.head_dim as f64)
    }
}
