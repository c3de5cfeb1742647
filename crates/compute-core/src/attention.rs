//! The attention op's parameters: shapes, grouped-query heads, scale and mask.
//!
//! `softmax(scale · q·kᵀ + mask) · v` per (batch, query head), fused: no
//! backend writes the `seq_q × seq_k` score matrix to memory.

use crate::dtype::DType;
use crate::op::Precision;

/// Which keys each query sees.
///
/// With `offset = seq_k − seq_q` for [`Mask::Causal`] and `0` for
/// [`Mask::CausalTopLeft`], query `i` sees keys `j ≤ i + offset`. When
/// `seq_q = seq_k` the two are the same mask.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Mask {
    /// Every query sees every key.
    #[default]
    None,
    /// Causal, aligned to the end: the last query sees every key, query `i`
    /// sees keys `j ≤ i + seq_k − seq_q`. This is what decoding against a KV
    /// cache needs (the `seq_q` new tokens are the last `seq_q` positions of
    /// the sequence), and what FlashAttention 2.1+ does. When `seq_q > seq_k`
    /// the first `seq_q − seq_k` queries see no key.
    Causal,
    /// Causal, aligned to the start: query `i` sees keys `j ≤ i`, as PyTorch's
    /// `scaled_dot_product_attention(is_causal=True)` does.
    CausalTopLeft,
}

impl Mask {
    /// Lower-case name, as printed in shapes.
    pub fn as_str(self) -> &'static str {
        match self {
            Mask::None => "none",
            Mask::Causal => "causal",
            Mask::CausalTopLeft => "causal_top_left",
        }
    }
}

/// Fused scaled-dot-product attention:
/// `out = softmax(scale · q·kᵀ + mask) · v`.
///
/// Layouts, all contiguous and row-major:
/// - `q`: `[batch, heads_q, seq_q, head_dim]`
/// - `k`, `v`: `[batch, heads_kv, kv_rows, head_dim]`, of which each head's
///   first `seq_k` rows are read: `kv_rows` is `seq_k`, or a KV cache's
///   capacity ([`AttentionSpec::with_kv_capacity`]) that decoding fills one
///   step at a time
/// - output: `[batch, heads_q, seq_q, head_dim]`, the dtype of the inputs.
///
/// `heads_q` is a multiple of `heads_kv`; query head `h` reads key/value head
/// `h / (heads_q / heads_kv)` (grouped-query attention; `heads_kv = 1` is
/// multi-query attention). Scores and the softmax are computed in `f32` with a
/// running maximum, so scores of any magnitude neither overflow nor underflow
/// the sum. A query that sees no key (possible only with [`Mask::Causal`] and
/// `seq_q > seq_k`) gets an output row of zeros, as FlashAttention writes;
/// PyTorch's math kernel writes NaN there.
///
/// On `f16` and `bf16` data the scores, the softmax and both accumulations
/// are `f32`; the softmax weights are rounded to the input dtype before
/// their product with `v` (as FlashAttention does, to feed tensor cores),
/// and the output is rounded once when stored.
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct AttentionSpec {
    /// Independent sequences.
    pub batch: usize,
    /// Query heads (and output heads).
    pub heads_q: usize,
    /// Key/value heads; divides `heads_q`.
    pub heads_kv: usize,
    /// Queries per sequence (1 when decoding one token).
    pub seq_q: usize,
    /// Keys (and values) per sequence: the KV cache's length when decoding.
    pub seq_k: usize,
    /// Length of each query, key and value vector.
    pub head_dim: usize,
    /// Factor on `q·k` before the softmax; [`AttentionSpec::new`] sets `1/√head_dim`.
    pub scale: f32,
    /// Which keys each query sees.
    pub mask: Mask,
    /// Dtype of `q`, `k`, `v` and the output.
    pub dtype: DType,
    /// May `f32` inputs use TF32 tensor cores for both products ([`Precision`]).
    pub precision: Precision,
    /// Rows each key/value head holds when they are more than `seq_k` (a KV
    /// cache of that capacity, filled to `seq_k`); `None`: exactly `seq_k`.
    pub kv_capacity: Option<usize>,
    /// Whether the number of keys comes from the device
    /// ([`AttentionSpec::with_positions`]); `seq_k` is then its upper bound.
    #[cfg_attr(feature = "serde", serde(default))]
    pub positions: bool,
}

impl AttentionSpec {
    /// Attention of `f32` data with `heads` query and key/value heads, scale
    /// `1/√head_dim` and no mask. Costs nothing; validate with [`crate::Op::layout`].
    pub fn new(batch: usize, heads: usize, seq_q: usize, seq_k: usize, head_dim: usize) -> Self {
        AttentionSpec {
            batch,
            heads_q: heads,
            heads_kv: heads,
            seq_q,
            seq_k,
            head_dim,
            scale: 1.0 / (head_dim.max(1) as f32).sqrt(),
            mask: Mask::None,
            dtype: DType::F32,
            precision: Precision::Full,
            kv_capacity: None,
            positions: false,
        }
    }

    /// The same with the keys counted on the device: a fourth input holds
    /// the positions of the queries, `[batch, seq_q]` `f32` values (the
    /// tensor a decoder gives [`crate::RopeSpec::with_positions`]). The
    /// queries of batch element `b` sit at consecutive positions ending at
    /// `p = positions[b, seq_q − 1]`, and they attend to its first `p + 1`
    /// keys ([`AttentionSpec::keys_at`]; at most `seq_k`), with the mask as
    /// for a spec of that many keys. A recorded decoding step thereby
    /// replays at every length of its KV cache.
    pub fn with_positions(self) -> Self {
        AttentionSpec { positions: true, ..self }
    }

    /// The keys a batch element whose last query sits at position `p` reads:
    /// `p + 1` rounded toward zero, within `0..=seq_k` (a NaN reads none).
    pub fn keys_at(&self, p: f32) -> usize {
        let n = (f64::from(p) + 1.0).trunc();
        if n.is_nan() || n <= 0.0 { 0 } else { (n as usize).min(self.seq_k) }
    }

    /// This spec with the keys fixed at `seq_k` (and the positions input
    /// gone): what one batch element of a positions spec computes.
    pub fn with_keys(self, seq_k: usize) -> Self {
        AttentionSpec { seq_k, kv_capacity: Some(self.kv_rows()), positions: false, batch: 1, ..self }
    }

    /// The same reading keys and values from a cache of `capacity` rows per
    /// head (at least `seq_k`; [`crate::Op::layout`] checks it).
    pub fn with_kv_capacity(self, capacity: usize) -> Self {
        AttentionSpec { kv_capacity: Some(capacity), ..self }
    }

    /// Rows per key/value head in `k` and `v`: the capacity, or `seq_k`.
    pub fn kv_rows(&self) -> usize {
        self.kv_capacity.unwrap_or(self.seq_k)
    }

    /// The same with `heads_kv` key/value heads (grouped-query attention).
    pub fn with_kv_heads(self, heads_kv: usize) -> Self {
        AttentionSpec { heads_kv, ..self }
    }

    /// The same with `mask`.
    pub fn with_mask(self, mask: Mask) -> Self {
        AttentionSpec { mask, ..self }
    }

    /// The same with [`Mask::Causal`] (aligned to the end).
    pub fn causal(self) -> Self {
        self.with_mask(Mask::Causal)
    }

    /// The same with softmax scale `scale`.
    pub fn with_scale(self, scale: f32) -> Self {
        AttentionSpec { scale, ..self }
    }

    /// The same with `precision`.
    pub fn with_precision(self, precision: Precision) -> Self {
        AttentionSpec { precision, ..self }
    }

    /// The same on `dtype` data.
    pub fn with_dtype(self, dtype: DType) -> Self {
        AttentionSpec { dtype, ..self }
    }

    /// Query heads per key/value head (1 when `heads_kv` does not divide `heads_q`,
    /// which [`crate::Op::layout`] rejects).
    pub fn group(&self) -> usize {
        if self.heads_kv == 0 || !self.heads_q.is_multiple_of(self.heads_kv) { 1 } else { self.heads_q / self.heads_kv }
    }

    /// The signed key offset of the causal diagonal: query `i` sees keys
    /// `j ≤ i + offset` (`None` without a mask).
    pub fn causal_offset(&self) -> Option<i64> {
        match self.mask {
            Mask::None => None,
            Mask::Causal => Some(self.seq_k as i64 - self.seq_q as i64),
            Mask::CausalTopLeft => Some(0),
        }
    }

    /// How many keys query `i` sees: they are keys `0..visible(i)`.
    pub fn visible(&self, i: usize) -> usize {
        match self.causal_offset() {
            None => self.seq_k,
            Some(off) => (i as i64 + off + 1).clamp(0, self.seq_k as i64) as usize,
        }
    }

    /// Visible (query, key) pairs of one head: `seq_q · seq_k` without a
    /// mask, about half of it with one. Closed form, O(1).
    pub fn pairs(&self) -> u64 {
        let (sq, sk) = (self.seq_q as i128, self.seq_k as i128);
        let Some(off) = self.causal_offset() else {
            return (sq * sk).min(u64::MAX as i128) as u64;
        };
        let off = off as i128;
        // visible(i) = clamp(i + off + 1, 0, sk): zero for i < lo = −off, and
        // sk from hi = sk − off − 1 on.
        let lo = (-off).clamp(0, sq);
        let hi = (sk - off - 1).clamp(lo, sq);
        // rows lo..hi see i + off + 1 keys: an arithmetic series.
        let n = hi - lo;
        let first = lo + off + 1;
        let ramp = n * first + n * (n - 1) / 2;
        let full = (sq - hi) * sk;
        (ramp + full).clamp(0, u64::MAX as i128) as u64
    }

    /// The op's sizes as text: `q=[2x32x4096x128] kv=[2x8x4096x128] causal`.
    pub fn shapes(&self) -> String {
        let mask = match self.mask {
            Mask::None => String::new(),
            m => format!(" {}", m.as_str()),
        };
        let mask = if self.precision == Precision::Tf32 { format!("{mask} tf32") } else { mask };
        let mask = if self.positions { format!("{mask} positions=[{}x{}]", self.batch, self.seq_q) } else { mask };
        let rows = match self.kv_capacity {
            Some(cap) => format!("{}/{cap}", self.seq_k),
            None => self.seq_k.to_string(),
        };
        format!(
            "q=[{}x{}x{}x{}] kv=[{}x{}x{}x{}] scale={}{mask}",
            self.batch,
            self.heads_q,
            self.seq_q,
            self.head_dim,
            self.batch,
            self.heads_kv,
            rows,
            self.head_dim,
            self.scale
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn brute(s: &AttentionSpec) -> u64 {
        (0..s.seq_q).map(|i| s.visible(i) as u64).sum()
    }

    #[test]
    fn pairs_match_a_row_by_row_count() {
        for (sq, sk) in [(1, 1), (1, 9), (9, 1), (5, 5), (7, 3), (3, 7), (64, 17), (17, 64), (1000, 999)] {
            for mask in [Mask::None, Mask::Causal, Mask::CausalTopLeft] {
                let s = AttentionSpec::new(1, 1, sq, sk, 8).with_mask(mask);
                assert_eq!(s.pairs(), brute(&s), "{sq}x{sk} {mask:?}");
            }
        }
    }

    #[test]
    fn causal_alignment_follows_the_documented_convention() {
        // Decoding: 1 query against 10 keys sees all of them (end-aligned),
        // or only the first key (start-aligned, PyTorch's is_causal).
        let s = AttentionSpec::new(1, 1, 1, 10, 8).causal();
        assert_eq!(s.visible(0), 10);
        assert_eq!(s.with_mask(Mask::CausalTopLeft).visible(0), 1);
        // More queries than keys: the first two see nothing.
        let s = AttentionSpec::new(1, 1, 5, 3, 8).causal();
        assert_eq!((0..5).map(|i| s.visible(i)).collect::<Vec<_>>(), [0, 0, 1, 2, 3]);
    }
}
