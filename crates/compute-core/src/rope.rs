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
//! Llama 3.1 and 3.2 stretch the low frequencies for long contexts
//! ([`RopeScaling`], Hugging Face's `rope_type: "llama3"`): with
//! `f = θ^(−2i/d)` and `r = f · original_max_position / 2π` (the turns the
//! pair makes over the context the model was first trained on), pair `i`
//! turns at `f · ((1 − s)/factor + s)`, `s = (r − low_freq_factor) /
//! (high_freq_factor − low_freq_factor)` clamped to `[0, 1]`: unchanged
//! where `r ≥ high_freq_factor`, divided by `factor` where `r ≤
//! low_freq_factor`, and blended between.
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
    /// Llama 3's frequency scaling ([`RopeSpec::with_scaling`]); `None`:
    /// the plain frequencies.
    #[cfg_attr(feature = "serde", serde(default))]
    pub scaling: Option<RopeScaling>,
    /// Where the output goes ([`RopeSpec::into_cache`]): `Some(capacity)`,
    /// a head-major KV cache `[heads, capacity, head_dim]`; `None`,
    /// `[seq, heads, head_dim]`.
    #[cfg_attr(feature = "serde", serde(default))]
    pub cache: Option<usize>,
}

/// Llama 3's rotary frequency scaling (Hugging Face `rope_scaling` /
/// `rope_parameters` of `rope_type: "llama3"`; [module](self) docs): the
/// low frequencies divided by `factor`, the high ones kept, a smooth blend
/// between.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RopeScaling {
    /// What the lowest frequencies are divided by (8 for Llama 3.1, 32 for
    /// Llama 3.2); at least 1.
    pub factor: f32,
    /// Pairs turning at most this many times over the original context are
    /// fully scaled (1 in Llama 3); at least 0.
    pub low_freq_factor: f32,
    /// Pairs turning at least this many times are not scaled (4 in Llama
    /// 3); above `low_freq_factor`.
    pub high_freq_factor: f32,
    /// The context the model was first trained on (8192 in Llama 3).
    pub original_max_position: usize,
}

impl RopeScaling {
    /// Llama 3.1's parameters (factor 8, low 1, high 4, 8192 tokens); Llama
    /// 3.2 has the same with factor 32. Free.
    pub fn llama3(factor: f32) -> Self {
        RopeScaling { factor, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position: 8192 }
    }

    /// Whether the parameters are usable: finite, `factor ≥ 1`,
    /// `0 ≤ low_freq_factor < high_freq_factor`, a positive context.
    pub fn is_valid(&self) -> bool {
        let finite = self.factor.is_finite() && self.low_freq_factor.is_finite() && self.high_freq_factor.is_finite();
        finite
            && self.factor >= 1.0
            && self.low_freq_factor >= 0.0
            && self.high_freq_factor > self.low_freq_factor
            && self.original_max_position > 0
    }

    /// The scaled frequency in `f64` (the reference's): `f·((1 − s)/factor
    /// + s)` with `s` the clamped blend of the [module](self) docs.
    pub fn apply_f64(&self, f: f64) -> f64 {
        let turns = f * self.original_max_position as f64 / std::f64::consts::TAU;
        let (lo, hi) = (f64::from(self.low_freq_factor), f64::from(self.high_freq_factor));
        let s = ((turns - lo) / (hi - lo)).clamp(0.0, 1.0);
        f * ((1.0 - s) / f64::from(self.factor) + s)
    }

    /// The three `f32` coefficients every backend computes the scaling
    /// from, `(a, b, c)`: `s = clamp(f·a + b, 0, 1)` and the frequency
    /// `f·(c + s·(1 − c))`, with `a = original_max_position / (2π·(high −
    /// low))`, `b = −low / (high − low)`, `c = 1/factor` (each rounded
    /// from `f64`). Unscaled: `(0, 1, 1)`, which leaves `f` exact.
    pub fn coefficients(scaling: Option<RopeScaling>) -> [f32; 3] {
        match scaling {
            None => [0.0, 1.0, 1.0],
            Some(r) => {
                let span = f64::from(r.high_freq_factor) - f64::from(r.low_freq_factor);
                let a = r.original_max_position as f64 / (std::f64::consts::TAU * span);
                let b = -f64::from(r.low_freq_factor) / span;
                [a as f32, b as f32, (1.0 / f64::from(r.factor)) as f32]
            }
        }
    }

    /// `f` scaled by the coefficients of [`RopeScaling::coefficients`], in
    /// `f32` as the backends compute it (the same operations the GPU
    /// kernels run).
    pub fn apply_f32(coefficients: [f32; 3], f: f32) -> f32 {
        let [a, b, c] = coefficients;
        let s = f.mul_add(a, b).clamp(0.0, 1.0);
        f * s.mul_add(1.0 - c, c)
    }
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
            scaling: None,
            cache: None,
        }
    }

    /// The same with Llama 3's frequency scaling.
    pub fn with_scaling(self, scaling: RopeScaling) -> Self {
        RopeSpec { scaling: Some(scaling), ..self }
    }

    /// The same reading its heads out of rows of `row_heads` heads per token,
    /// from head `first` on: `x` is `[seq, row_heads, head_dim]` and the
    /// output `[seq, heads, head_dim]` (the queries or keys of a fused q/k/v
    /// product, without a copy first).
    pub fn from_heads(self, row_heads: usize, first: usize) -> Self {
        RopeSpec { source: Some(HeadSlice { row_heads, first }), ..self }
    }

    /// The same writing each token's turned heads into a head-major KV cache
    /// `[heads, capacity, head_dim]` (the output), at row `position + t` of
    /// each head, or with [`RopeSpec::with_positions`] at the row the
    /// token's position gives (a whole number below `capacity`; any other
    /// value writes nothing), leaving every other row as it was: a decoding
    /// step's keys turned and appended to the cache in one op, where a rope
    /// and a [`CopySpec`](crate::CopySpec) append take two ([`RopeSpec::cache_copy`]).
    pub fn into_cache(self, capacity: usize) -> Self {
        RopeSpec { cache: Some(capacity), ..self }
    }

    /// With [`RopeSpec::into_cache`]: the append that the op folds in, i.e.
    /// the [`CopySpec`](crate::CopySpec) that moves the plain output
    /// `[seq, heads, head_dim]` into the cache (at the positions of the
    /// op's second input with [`RopeSpec::with_positions`]). `None` without
    /// a cache. Free.
    pub fn cache_copy(&self) -> Option<crate::CopySpec> {
        let capacity = self.cache?;
        let (h, d, seq) = (self.heads, self.head_dim, self.seq);
        let src = crate::Strided { offset: 0, strides: [d, h * d, 1], len: seq * h * d };
        let at = if self.positions { 0 } else { self.position * d };
        let dst = crate::Strided { offset: at, strides: [capacity * d, d, 1], len: h * capacity * d };
        let copy = crate::CopySpec::new([h, seq, d], src, dst).with_dtype(self.dtype);
        Some(if self.positions { copy.at_positions(capacity) } else { copy })
    }

    /// The same writing `[seq, heads, head_dim]` (no cache).
    pub fn plain(self) -> Self {
        RopeSpec { cache: None, ..self }
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

    /// The frequency of pair `i`, `θ^(−2i/head_dim)` (scaled, with
    /// [`RopeSpec::scaling`]), in `f32` as backends compute it (one `powf`,
    /// then [`RopeScaling::apply_f32`]).
    pub fn inv_freq(&self, i: usize) -> f32 {
        let f = 1.0 / self.theta.powf((2 * i) as f32 / self.head_dim as f32);
        match self.scaling {
            None => f,
            Some(_) => RopeScaling::apply_f32(RopeScaling::coefficients(self.scaling), f),
        }
    }

    /// The exact angle of pair `i` at token `t`, in `f64` (the reference's).
    pub fn angle(&self, t: usize, i: usize) -> f64 {
        self.angle_at((self.position + t) as f64, i)
    }

    /// The exact angle of pair `i` at position `p`, in `f64`.
    pub fn angle_at(&self, p: f64, i: usize) -> f64 {
        let f = f64::from(self.theta).powf(-((2 * i) as f64) / self.head_dim as f64);
        p * self.scaling.map_or(f, |s| s.apply_f64(f))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Op, reference};

    /// Into a cache, the op writes the plain output's rows at the tokens'
    /// positions and nothing else; a host position past the capacity is a
    /// shape error.
    #[test]
    fn into_cache_writes_only_the_tokens_rows() {
        // Two tokens of one head of 4 values into a cache of 3 rows, from row 1.
        let r = RopeSpec::new(2, 1, 4, 10_000.0).at_position(1);
        let x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        let plain = reference::run(&Op::Rope(r), &[&x]).expect("valid");
        let cached = reference::run(&Op::Rope(r.into_cache(3)), &[&x]).expect("valid");
        assert_eq!(cached.values.len(), 12);
        assert_eq!(&cached.values[4..], &plain.values[..]);
        assert!(cached.scale[..4].iter().all(|&s| s == reference::UNTOUCHED));
        assert!(Op::Rope(r.into_cache(3)).writes_part_of_output() && !Op::Rope(r).writes_part_of_output());
        assert!(Op::Rope(r.at_position(2).into_cache(3)).layout().is_err());
        assert!(Op::Rope(r.at_position(2).into_cache(3).with_positions()).layout().is_ok());
        let copy = r.into_cache(3).cache_copy().expect("a cache");
        assert_eq!((copy.dst.offset, copy.dst.strides, copy.positions), (4, [12, 4, 1], None));
        assert_eq!(r.cache_copy(), None);
    }

    /// The backends' `f32` form of the scaling stays within a few ulp of the
    /// exact one over every pair of Llama 3's head sizes, in all three
    /// regimes; the neutral coefficients leave a frequency exact.
    #[test]
    fn scaled_frequencies_in_f32_follow_the_exact_ones() {
        let s = RopeScaling::llama3(32.0);
        let k = RopeScaling::coefficients(Some(s));
        let (mut kept, mut blended, mut slowed) = (0, 0, 0);
        for d in [64usize, 128] {
            let spec = RopeSpec::new(1, 1, d, 500_000.0).with_scaling(s);
            for i in 0..d / 2 {
                let f = 500_000f64.powf(-((2 * i) as f64) / d as f64);
                let exact = s.apply_f64(f);
                let ratio = exact / f;
                match () {
                    _ if ratio == 1.0 => kept += 1,
                    _ if ratio == 1.0 / 32.0 => slowed += 1,
                    _ => blended += 1,
                }
                let got = f64::from(spec.inv_freq(i));
                assert!((got - exact).abs() <= 8.0 * f64::from(f32::EPSILON) * exact, "d {d} pair {i}");
                assert_eq!(RopeScaling::apply_f32(RopeScaling::coefficients(None), f as f32), f as f32);
                assert!((RopeScaling::apply_f32(k, f as f32) as f64 - exact).abs() <= 8.0 * 1.2e-7 * exact);
            }
        }
        assert!(kept > 0 && blended > 0 && slowed > 0, "{kept} {blended} {slowed}");
        assert!(!RopeScaling { high_freq_factor: 1.0, ..s }.is_valid());
        assert!(!RopeScaling { factor: 0.5, ..s }.is_valid());
    }
}
