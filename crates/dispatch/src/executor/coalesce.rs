//! Which requests can share one dispatch, and how to merge and split them.
//!
//! Compatible means same op, same parameters and same inner shape:
//! element-wise ops of any lengths (concatenated; lerps of equal `t`), row
//! ops of equal row length and equal parameter vectors (rows stacked; slerps
//! of equal `t`, both operands stacked), matmuls of equal `(m, k, n)` and
//! transposes (one batched matmul), attention of equal heads, queries, head
//! length, scale and mask, whatever their keys (see `super::attention`).
//! Reductions, dots, convolutions, quantized matmuls and the decoder ops
//! (rotary embeddings, strided copies, gathers, argmax: their parameters and
//! partial writes do not concatenate) run alone.
//! Requests against one shared weight share the key of that weight; they are
//! stacked by `super::shared`, not here.

use compute_core::{BinaryOp, DType, MatmulSpec, Op, RowOp, UnaryOp};

use super::attention::MergeKey;

/// Grouping key: equal keys may be merged. `Shared` holds a shared weight's id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Key {
    Unary { name: &'static str, p0: u32, p1: u32 },
    Binary(BinaryOp),
    Lerp { t: u32 },
    Slerp { t: u32, cols: usize },
    Rows { name: &'static str, eps: u32, cols: usize, params: u64 },
    Matmul { m: usize, k: usize, n: usize, ta: bool, tb: bool },
    Attention(MergeKey),
    Shared(u64),
    Alone(u64),
}

fn fnv(words: impl Iterator<Item = u32>) -> u64 {
    words.fold(0xcbf2_9ce4_8422_2325u64, |h, w| (h ^ w as u64).wrapping_mul(0x0100_0000_01b3))
}

/// The key of a request; `seq` makes non-mergeable requests unique.
pub(crate) fn key(op: &Op, inputs: &[Vec<f32>], seq: u64) -> Key {
    if op.dtype() != DType::F32 || op.out_dtype() != DType::F32 {
        return Key::Alone(seq);
    }
    match *op {
        Op::Unary { op: u, .. } => {
            let (p0, p1) = match u {
                UnaryOp::LeakyRelu { alpha } | UnaryOp::Elu { alpha } => (alpha.to_bits(), 0),
                UnaryOp::Clip { min, max } => (min.to_bits(), max.to_bits()),
                UnaryOp::Scale { s } => (s.to_bits(), 0),
                _ => (0, 0),
            };
            Key::Unary { name: u.name(), p0, p1 }
        }
        Op::Binary { op: b, .. } => Key::Binary(b),
        Op::Lerp { t, .. } => Key::Lerp { t: t.to_bits() },
        Op::Slerp { t, cols, .. } => Key::Slerp { t: t.to_bits(), cols },
        Op::Rows { op: r, cols, .. } => {
            let eps = match r {
                RowOp::LayerNorm { eps } | RowOp::RmsNorm { eps } => eps.to_bits(),
                RowOp::Softmax | RowOp::LogSoftmax => 0,
            };
            let params = fnv(inputs.iter().skip(1).flat_map(|v| v.iter().map(|x| x.to_bits())));
            Key::Rows { name: r.name(), eps, cols, params }
        }
        // A bias or C₀ belongs to one request, and so does a batch spaced
        // by strides (its inputs do not concatenate): such products run alone.
        Op::Matmul(s) if s.epilogue.is_identity() && !s.has_batch_strides() => {
            Key::Matmul { m: s.m, k: s.k, n: s.n, ta: s.trans_a, tb: s.trans_b }
        }
        Op::Attention(a) => Key::Attention(MergeKey::of(&a)),
        Op::Matmul(_)
        | Op::Reduce { .. }
        | Op::Dot { .. }
        | Op::Conv2d(_)
        | Op::Cast { .. }
        | Op::QuantMatmul(_)
        | Op::Rope(_)
        | Op::Copy(_)
        | Op::Gather { .. }
        | Op::Glu { .. }
        | Op::ArgMax { .. } => Key::Alone(seq),
    }
}

/// One merged dispatch: the op, its inputs, and each request's output length.
pub(crate) struct Merged {
    pub(crate) op: Op,
    pub(crate) inputs: Vec<Vec<f32>>,
}

/// Merges requests of one key into a single op (`None` if they turn out not
/// to be mergeable, e.g. a parameter-hash collision: run them one by one).
pub(crate) fn merge(reqs: &[(&Op, &[Vec<f32>])]) -> Option<Merged> {
    let (first_op, first_in) = *reqs.first()?;
    let concat = |idx: usize| -> Option<Vec<f32>> {
        let total: usize = reqs.iter().map(|(_, ins)| ins.get(idx).map_or(0, Vec::len)).sum();
        let mut v = Vec::with_capacity(total);
        for (_, ins) in reqs {
            v.extend_from_slice(ins.get(idx)?);
        }
        Some(v)
    };
    let op = match *first_op {
        Op::Unary { op, .. } => Op::unary(op, reqs.iter().map(|(_, ins)| ins.first().map_or(0, Vec::len)).sum()),
        Op::Binary { op, .. } => Op::binary(op, reqs.iter().map(|(_, ins)| ins.first().map_or(0, Vec::len)).sum()),
        Op::Lerp { t, .. } => Op::lerp(reqs.iter().map(|(_, ins)| ins.first().map_or(0, Vec::len)).sum(), t),
        Op::Slerp { t, cols, .. } => {
            let rows = reqs.iter().map(|(o, _)| if let Op::Slerp { rows, .. } = o { *rows } else { 0 }).sum();
            Op::slerp(rows, cols, t)
        }
        Op::Rows { op, cols, .. } => {
            let params_equal = reqs.iter().all(|(_, ins)| ins.get(1..) == first_in.get(1..));
            if !params_equal {
                return None;
            }
            let rows = reqs.iter().map(|(o, _)| if let Op::Rows { rows, .. } = o { *rows } else { 0 }).sum();
            Op::rows(op, rows, cols)
        }
        Op::Matmul(s) => {
            let batch = reqs.iter().map(|(o, _)| if let Op::Matmul(x) = o { x.batch } else { 0 }).sum();
            Op::Matmul(MatmulSpec { batch, ..s })
        }
        Op::Attention(_) => {
            let (op, inputs) = super::attention::merge(reqs)?;
            return Some(Merged { op, inputs });
        }
        Op::Reduce { .. }
        | Op::Dot { .. }
        | Op::Conv2d(_)
        | Op::Cast { .. }
        | Op::QuantMatmul(_)
        | Op::Rope(_)
        | Op::Copy(_)
        | Op::Gather { .. }
        | Op::Glu { .. }
        | Op::ArgMax { .. } => return None,
    };
    let inputs = match *first_op {
        Op::Rows { .. } => {
            let mut ins = vec![concat(0)?];
            ins.extend(first_in.iter().skip(1).cloned());
            ins
        }
        _ => (0..first_in.len()).map(concat).collect::<Option<Vec<_>>>()?,
    };
    // The merged op must be valid for the merged inputs (sizes may overflow).
    let lens: Vec<usize> = inputs.iter().map(Vec::len).collect();
    op.check(&lens, op.layout().ok()?.output_len()).ok()?;
    Some(Merged { op, inputs })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use compute_core::{Backend, conformance::rng::Rng};
    use compute_simd::SimdBackend;

    /// `op` of `ins` on the CPU backend.
    pub(crate) fn run(op: &Op, ins: &[Vec<f32>]) -> Vec<f32> {
        let refs: Vec<&[f32]> = ins.iter().map(Vec::as_slice).collect();
        let mut out = vec![f32::NAN; op.layout().unwrap().output_len()];
        SimdBackend::new().run(op, &refs, &mut out).unwrap();
        out
    }

    #[test]
    fn merged_results_split_back_equal_individual_results() {
        let mut rng = Rng::new(7);
        let cases: Vec<Vec<(Op, Vec<Vec<f32>>)>> = vec![
            [5usize, 9, 1]
                .iter()
                .map(|&n| (Op::unary(UnaryOp::Gelu(compute_core::GeluForm::Tanh), n), vec![rng.vec(n, -3.0, 3.0)]))
                .collect(),
            [4usize, 7]
                .iter()
                .map(|&n| (Op::binary(BinaryOp::Sub, n), vec![rng.vec(n, -3.0, 3.0), rng.vec(n, -3.0, 3.0)]))
                .collect(),
            {
                let gamma = rng.vec(6, 0.5, 1.5);
                [2usize, 3]
                    .iter()
                    .map(|&r| {
                        (Op::rows(RowOp::RmsNorm { eps: 1e-5 }, r, 6), vec![rng.vec(r * 6, -2.0, 2.0), gamma.clone()])
                    })
                    .collect()
            },
            (0..3).map(|_| (Op::matmul(3, 4, 5), vec![rng.vec(12, -1.0, 1.0), rng.vec(20, -1.0, 1.0)])).collect(),
            [3usize, 8, 1]
                .iter()
                .map(|&n| (Op::lerp(n, 0.7), vec![rng.vec(n, -3.0, 3.0), rng.vec(n, -3.0, 3.0)]))
                .collect(),
            [1usize, 4, 2]
                .iter()
                .map(|&r| (Op::slerp(r, 9, 0.4), vec![rng.vec(r * 9, -1.0, 1.0), rng.vec(r * 9, -1.0, 1.0)]))
                .collect(),
        ];
        for reqs in cases {
            let keys: Vec<Key> = reqs.iter().enumerate().map(|(i, (o, ins))| key(o, ins, i as u64)).collect();
            assert!(keys.windows(2).all(|w| w[0] == w[1]), "{keys:?}");
            let views: Vec<(&Op, &[Vec<f32>])> = reqs.iter().map(|(o, ins)| (o, ins.as_slice())).collect();
            let merged = merge(&views).expect("mergeable");
            let all = run(&merged.op, &merged.inputs);
            let mut offset = 0;
            for (op, ins) in &reqs {
                let want = run(op, ins);
                let got = &all[offset..offset + want.len()];
                assert_eq!(got, want.as_slice(), "{op:?}");
                offset += want.len();
            }
            assert_eq!(offset, all.len());
        }
    }

    #[test]
    fn different_parameters_or_shapes_do_not_share_a_key() {
        let x = vec![vec![1.0f32; 8]];
        assert_ne!(
            key(&Op::unary(UnaryOp::Scale { s: 2.0 }, 8), &x, 0),
            key(&Op::unary(UnaryOp::Scale { s: 3.0 }, 8), &x, 1)
        );
        assert_ne!(key(&Op::matmul(2, 3, 4), &[], 0), key(&Op::matmul(2, 3, 5), &[], 1));
        let shared_b = Op::Matmul(MatmulSpec { batch: 2, ..MatmulSpec::new(2, 3, 4) }.with_batch_strides(6, 0));
        assert_ne!(key(&shared_b, &[], 0), key(&shared_b, &[], 1), "a strided batch runs alone");
        let g1 = vec![vec![1.0f32; 8], vec![1.0; 4]];
        let g2 = vec![vec![1.0f32; 8], vec![2.0; 4]];
        let ln = Op::rows(RowOp::RmsNorm { eps: 1e-5 }, 2, 4);
        assert_ne!(key(&ln, &g1, 0), key(&ln, &g2, 1));
        assert_ne!(key(&Op::dot(8), &[], 0), key(&Op::dot(8), &[], 1));
        assert_ne!(key(&Op::lerp(8, 0.5), &[], 0), key(&Op::lerp(8, 0.25), &[], 1));
        assert_ne!(key(&Op::slerp(2, 4, 0.5), &[], 0), key(&Op::slerp(4, 2, 0.5), &[], 1));
        assert_ne!(key(&Op::slerp(2, 4, 0.5), &[], 0), key(&Op::slerp(2, 4, 0.6), &[], 1));
    }
}
