//! Attention requests of many callers as one call: decoding steps of
//! different sequences, each with its own KV cache length.
//!
//! Requests merge when they agree on everything but the batch, the number of
//! keys and the KV caches' capacity (heads, queries, head length, scale,
//! mask, precision; `f32`, as every merged request). Their queries are
//! concatenated along the batch. When every request reads the same number of
//! keys from caches of the same capacity, keys and values are concatenated
//! too. Otherwise the merged call counts its keys on the device
//! ([`AttentionSpec::with_positions`]): each batch element's position says
//! how many keys it reads, and its keys and values are padded with zero rows
//! to the largest capacity (rows it never reads). Either way each batch
//! element computes exactly what its request alone computes, and the output
//! (batch-major) splits back request by request.
//!
//! Cost: one copy of every request's queries, keys and values into the
//! merged inputs. The executor merges only when the merged call goes to a
//! GPU and the cost model predicts that the saved calls outweigh that copy.

use compute_core::{AttentionSpec, Mask, Op, Precision};

/// What attention requests must share to merge: everything but the batch,
/// the number of keys and the KV caches' capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct MergeKey {
    heads_q: usize,
    heads_kv: usize,
    seq_q: usize,
    head_dim: usize,
    scale: u32,
    mask: Mask,
    precision: Precision,
}

impl MergeKey {
    /// The key of `a`. Free.
    pub(crate) fn of(a: &AttentionSpec) -> MergeKey {
        MergeKey {
            heads_q: a.heads_q,
            heads_kv: a.heads_kv,
            seq_q: a.seq_q,
            head_dim: a.head_dim,
            scale: a.scale.to_bits(),
            mask: a.mask,
            precision: a.precision,
        }
    }
}

/// The merged attention call of `reqs` (all `Op::Attention` with equal
/// heads, queries, head length, scale, mask and precision), with its inputs;
/// `None` when a request is not one or its inputs do not match its spec.
pub(crate) fn merge(reqs: &[(&Op, &[Vec<f32>])]) -> Option<(Op, Vec<Vec<f32>>)> {
    let specs = specs(reqs)?;
    let (merged, same_keys) = merged_spec(&specs)?;
    let first = *specs.first()?;
    let concat = |idx: usize| -> Vec<f32> {
        reqs.iter().flat_map(|(_, ins)| ins.get(idx).into_iter().flatten().copied()).collect()
    };
    if same_keys {
        let inputs = (0..reqs.first()?.1.len()).map(concat).collect();
        return checked(Op::Attention(merged), inputs);
    }
    let rows = merged.kv_rows();
    let q = concat(0);
    let (k, v) = (padded(reqs, &specs, 1, rows)?, padded(reqs, &specs, 2, rows)?);
    let mut positions = Vec::with_capacity(merged.batch * first.seq_q);
    for ((_, ins), a) in reqs.iter().zip(&specs) {
        for b in 0..a.batch {
            let keys = if a.positions {
                // Only the last query's position counts; the merged call's
                // larger `seq_k` must not let it read more than its own.
                let last = ((b + 1) * a.seq_q).checked_sub(1);
                last.and_then(|i| ins.get(3)?.get(i)).map_or(0, |&p| a.keys_at(p))
            } else {
                a.seq_k
            };
            // The queries sit at consecutive positions ending at keys − 1
            // (−1: no key at all).
            positions.extend((0..a.seq_q).map(|t| keys as f32 - a.seq_q as f32 + t as f32));
        }
    }
    checked(Op::Attention(merged), vec![q, k, v, positions])
}

/// The op [`merge`] would make of `reqs`, without touching their data (for
/// deciding where it would run). Free.
pub(crate) fn merged_op(reqs: &[(&Op, &[Vec<f32>])]) -> Option<Op> {
    merged_spec(&specs(reqs)?).map(|(spec, _)| Op::Attention(spec))
}

/// Each request's spec, `None` if one is not attention or its inputs do not
/// match it.
fn specs(reqs: &[(&Op, &[Vec<f32>])]) -> Option<Vec<AttentionSpec>> {
    reqs.iter()
        .map(|(op, ins)| {
            let Op::Attention(a) = op else { return None };
            let lens: Vec<usize> = ins.iter().map(Vec::len).collect();
            op.check(&lens, op.layout().ok()?.output_len()).ok()?;
            Some(*a)
        })
        .collect()
}

/// The merged spec, and whether every request reads the same keys from
/// caches of the same capacity (then no positions are needed).
fn merged_spec(specs: &[AttentionSpec]) -> Option<(AttentionSpec, bool)> {
    let first = *specs.first()?;
    let batch = specs.iter().map(|a| a.batch).sum();
    let same_keys = specs
        .iter()
        .all(|a| a.seq_k == first.seq_k && a.kv_rows() == first.kv_rows() && a.positions == first.positions);
    if same_keys {
        return Some((AttentionSpec { batch, ..first }, true));
    }
    let seq_k = specs.iter().map(|a| a.seq_k).max()?;
    let rows = specs.iter().map(AttentionSpec::kv_rows).max()?;
    Some((AttentionSpec { batch, seq_k, kv_capacity: Some(rows), positions: true, ..first }, false))
}

/// `op` with `inputs` if they match (sizes of many requests may overflow).
fn checked(op: Op, inputs: Vec<Vec<f32>>) -> Option<(Op, Vec<Vec<f32>>)> {
    let lens: Vec<usize> = inputs.iter().map(Vec::len).collect();
    op.check(&lens, op.layout().ok()?.output_len()).ok()?;
    Some((op, inputs))
}

/// Input `idx` (keys or values) of every request, each head's rows padded
/// with zeros to `rows` (`None` if a request's input is not whole heads, or
/// if the padding would more than double the values copied).
fn padded(reqs: &[(&Op, &[Vec<f32>])], specs: &[AttentionSpec], idx: usize, rows: usize) -> Option<Vec<f32>> {
    let d = specs.first().map_or(0, |a| a.head_dim);
    let heads: usize = specs.iter().map(|a| a.batch * a.heads_kv).sum();
    // Padding that would more than double the copy is not worth it.
    let own: usize = specs.iter().map(|a| a.batch * a.heads_kv * a.kv_rows() * d).sum();
    let len = heads.checked_mul(rows)?.checked_mul(d).filter(|&n| n <= own.saturating_mul(2))?;
    let mut out = vec![0.0f32; len];
    if out.is_empty() {
        return Some(out);
    }
    let mut slots = out.chunks_exact_mut(rows * d);
    for ((_, ins), a) in reqs.iter().zip(specs) {
        let own = a.kv_rows() * d;
        let input = ins.get(idx)?;
        for h in 0..a.batch * a.heads_kv {
            let head = input.get(h * own..(h + 1) * own)?;
            slots.next()?.get_mut(..own)?.copy_from_slice(head);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::super::coalesce::tests::run;
    use super::*;
    use compute_core::Mask;
    use compute_core::conformance::rng::Rng;

    fn request(rng: &mut Rng, spec: AttentionSpec, last: Option<f32>) -> (Op, Vec<Vec<f32>>) {
        let spec = if last.is_some() { spec.with_positions() } else { spec };
        let op = Op::Attention(spec);
        let layout = op.layout().unwrap();
        let mut ins: Vec<Vec<f32>> = layout.input_lens().take(3).map(|n| rng.vec(n, -1.0, 1.0)).collect();
        if let Some(p) = last {
            ins.push((0..spec.batch * spec.seq_q).map(|t| p - (spec.seq_q - 1 - t % spec.seq_q) as f32).collect());
        }
        (op, ins)
    }

    #[test]
    fn merged_attention_splits_back_into_each_requests_result() {
        let mut rng = Rng::new(11);
        let base = AttentionSpec::new(1, 4, 1, 9, 8).with_kv_heads(2).causal();
        let groups: Vec<Vec<(Op, Vec<Vec<f32>>)>> = vec![
            // The same keys everywhere: plain concatenation.
            (0..3).map(|_| request(&mut rng, base, None)).collect(),
            // Decoding steps of different lengths, caches of different capacities,
            // a request of two sequences, and positions past a request's own keys.
            vec![
                request(&mut rng, AttentionSpec { seq_k: 3, ..base }.with_kv_capacity(12), None),
                request(&mut rng, AttentionSpec { seq_k: 17, ..base }.with_kv_capacity(20), None),
                request(&mut rng, AttentionSpec { batch: 2, seq_k: 5, ..base }.with_kv_capacity(16), None),
                request(&mut rng, AttentionSpec { seq_k: 6, ..base }.with_kv_capacity(16), Some(3.0)),
                request(&mut rng, AttentionSpec { seq_k: 14, ..base }, Some(40.0)),
            ],
            // Several queries, the causal mask aligned to the start.
            vec![
                request(&mut rng, AttentionSpec { seq_q: 2, seq_k: 2, ..base }.with_mask(Mask::CausalTopLeft), None),
                request(&mut rng, AttentionSpec { seq_q: 2, seq_k: 7, ..base }.with_mask(Mask::CausalTopLeft), None),
            ],
        ];
        for reqs in groups {
            let views: Vec<(&Op, &[Vec<f32>])> = reqs.iter().map(|(o, ins)| (o, ins.as_slice())).collect();
            let (op, inputs) = merge(&views).expect("mergeable");
            let all = run(&op, &inputs);
            let mut offset = 0;
            for (op, ins) in &reqs {
                let want = run(op, ins);
                let got = &all[offset..offset + want.len()];
                let worst = got.iter().zip(&want).map(|(g, w)| (g - w).abs()).fold(0.0f32, f32::max);
                assert!(worst <= 1e-6, "{op:?}: off by {worst}");
                offset += want.len();
            }
            assert_eq!(offset, all.len());
        }
    }

    #[test]
    fn requests_whose_inputs_do_not_match_their_spec_are_not_merged() {
        let mut rng = Rng::new(3);
        let spec = AttentionSpec::new(1, 2, 1, 4, 8);
        let good = request(&mut rng, spec, None);
        let mut bad = request(&mut rng, AttentionSpec { seq_k: 5, ..spec }, None);
        bad.1[1].pop();
        let views = [(&good.0, good.1.as_slice()), (&bad.0, bad.1.as_slice())];
        assert!(merge(&views).is_none());
    }

    #[test]
    fn caches_that_padding_would_more_than_double_are_not_merged() {
        let mut rng = Rng::new(5);
        let spec = AttentionSpec::new(1, 2, 1, 2, 8);
        let reqs: Vec<_> =
            [64, 2, 2, 2].iter().map(|&k| request(&mut rng, AttentionSpec { seq_k: k, ..spec }, None)).collect();
        let views: Vec<(&Op, &[Vec<f32>])> = reqs.iter().map(|(o, ins)| (o, ins.as_slice())).collect();
        assert!(merge(&views).is_none());
        assert!(merge(&views[1..]).is_some());
    }
}
