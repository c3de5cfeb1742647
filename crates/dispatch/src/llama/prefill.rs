//! The prefill of several new sequences in one pass ([`super::Step::Prefill`]).
//!
//! `k` prompts are stacked as `k × L` rows, each left-padded to the longest,
//! `L` (a padding row has token 0 and position −1), so that every prompt's
//! last token is row `b·L + L − 1`. The products, norms and rotary
//! embedding run once over all the rows. Attention cannot read the KV cache
//! here: [`AttentionSpec`]'s batch element `b` reads batch element `b` of
//! its key tensor, while the prompts' slots are wherever free slots were.
//! So each prompt's keys and values are also written, by a [`CopySpec`]
//! at device slots, to a small `[k, kv_heads, L, d]` buffer of their own,
//! where prompt `b`'s token `t` is row `t` (padding rows are skipped), and
//! attention reads that: with [`AttentionSpec::with_positions`] batch
//! element `b` reads its first `l_b` keys (its last row's position + 1),
//! and the end-aligned causal mask lets its token `t`, at query row
//! `L − l_b + t`, see keys `0..=t`; padding queries see none and come out
//! zero. Two permutation copies (at device slots: the destination index of
//! each row) turn the queries head-major and the output back.

use compute_core::{AttentionSpec, Backend, CopySpec, DType, HostSlice, Op, Result, Strided, Tensor};

use super::{LlamaConfig, Scratch};

/// The tensors a prefill of `prompts` prompts of `tokens` rows adds to its
/// step's scratch.
pub(super) struct PrefillScratch {
    /// The prompts' keys and values, `[prompts, kv_heads, tokens, d]`.
    keys: Tensor,
    values: Tensor,
    /// Each (row, key/value head)'s row in `keys` (−1 for padding), written
    /// before each prefill.
    pub(super) key_slots: Tensor,
    /// Row `i·heads + h` of a prompt's token-major queries goes to row
    /// `h·tokens + i` of its head-major block, and back.
    to_heads: Tensor,
    to_tokens: Tensor,
}

impl PrefillScratch {
    /// Allocates the buffers and uploads the two permutations. Costs
    /// `2·prompts·tokens·kv_heads·d` values of `dtype` and a few small
    /// uploads.
    pub(super) fn new(
        b: &dyn Backend,
        c: &LlamaConfig,
        dtype: DType,
        prompts: usize,
        tokens: usize,
    ) -> Result<PrefillScratch> {
        let kv = prompts * c.kv_heads * tokens * c.head_dim();
        let to_heads: Vec<f32> = (0..tokens).flat_map(|i| (0..c.heads).map(move |h| (h * tokens + i) as f32)).collect();
        let to_tokens: Vec<f32> =
            (0..c.heads).flat_map(|h| (0..tokens).map(move |i| (i * c.heads + h) as f32)).collect();
        Ok(PrefillScratch {
            keys: b.alloc_typed(kv, dtype)?,
            values: b.alloc_typed(kv, dtype)?,
            key_slots: b.alloc_typed(prompts * tokens * c.kv_heads, DType::F32)?,
            to_heads: b.upload_typed(HostSlice::F32(&to_heads))?,
            to_tokens: b.upload_typed(HostSlice::F32(&to_tokens))?,
        })
    }
}

/// A copy of `rows` contiguous rows of `d` values, row `j` to row
/// `slots[j]` of a buffer of `dst_rows` rows (a slot outside it is skipped):
/// how a step's key/value heads reach their places in a cache.
pub(super) fn slotted(rows: usize, dst_rows: usize, d: usize) -> CopySpec {
    CopySpec::new(
        [1, rows, d],
        Strided::contiguous([1, rows, d]),
        Strided { offset: 0, strides: [0, d, 1], len: dst_rows * d },
    )
    .at_positions(dst_rows)
}

/// The ops of a prefill's attention block.
pub(super) struct Ops {
    keys: Op,
    to_heads: Op,
    attention: Op,
    to_tokens: Op,
}

impl Ops {
    /// The ops for `prompts` prompts of `tokens` rows. Free.
    pub(super) fn new(c: &LlamaConfig, dtype: DType, prompts: usize, tokens: usize) -> Ops {
        let d = c.head_dim();
        let rows = prompts * tokens;
        // Each prompt's token-major [tokens·heads, d] rows ↔ head-major
        // [heads·tokens, d], rows placed by the permutation.
        let permute = Op::Copy(
            CopySpec::new(
                [prompts, tokens * c.heads, d],
                Strided::contiguous([prompts, tokens * c.heads, d]),
                Strided { offset: 0, strides: [tokens * c.heads * d, d, 1], len: rows * c.heads * d },
            )
            .at_positions(tokens * c.heads)
            .with_dtype(dtype),
        );
        let attention = AttentionSpec::new(prompts, c.heads, tokens, tokens, d)
            .with_kv_heads(c.kv_heads)
            .causal()
            .with_positions()
            .with_dtype(dtype);
        Ops {
            keys: Op::Copy(slotted(rows * c.kv_heads, prompts * c.kv_heads * tokens, d).with_dtype(dtype)),
            to_heads: permute,
            attention: Op::Attention(attention),
            to_tokens: permute,
        }
    }

    /// Queues the attention of the prompts: their rotated keys (`s.k_rot`)
    /// and values (`s.v`) to their own buffers, the queries (`s.q_rot`)
    /// head-major, attention, and its output token-major into
    /// `s.attn_tokens`. Five ops.
    pub(super) fn attend(&self, b: &dyn Backend, p: &PrefillScratch, s: &Scratch) -> Result<()> {
        b.run_tensors(&self.keys, &[&s.k_rot, &p.key_slots], &p.keys)?;
        b.run_tensors(&self.keys, &[&s.v, &p.key_slots], &p.values)?;
        b.run_tensors(&self.to_heads, &[&s.q_rot, &p.to_heads], &s.q_heads)?;
        b.run_tensors(&self.attention, &[&s.q_heads, &p.keys, &p.values, &s.positions], &s.attn)?;
        b.run_tensors(&self.to_tokens, &[&s.attn, &p.to_tokens], &s.attn_tokens)
    }
}
