//! The sizes each group runs: odd sizes that hit every tail path, sizes above
//! the backends' parallel thresholds, and (with [`Scale::Large`]) sizes that
//! fill a GPU.

use super::{Group, Scale};
use crate::attention::{AttentionSpec, Mask};
use crate::dtype::DType;
use crate::op::{
    Activation, BinaryOp, Conv2dSpec, Epilogue, GeluForm, MatmulSpec, Op, Precision, QuantMatmulSpec, ReduceOp, RowOp,
    UnaryOp,
};

/// The epilogues the suite checks: each option alone and the combinations a
/// transformer uses (bias then activation, a residual through `beta = 1`).
fn epilogues() -> Vec<Epilogue> {
    let e = Epilogue::default();
    vec![
        Epilogue { bias: true, ..e },
        Epilogue { bias: true, activation: Some(Activation::Relu), ..e },
        Epilogue { activation: Some(Activation::Gelu(GeluForm::Tanh)), ..e },
        Epilogue { alpha: 0.5, bias: true, activation: Some(Activation::Gelu(GeluForm::Erf)), ..e },
        Epilogue { beta: 1.0, bias: true, activation: Some(Activation::Silu), ..e },
        Epilogue { alpha: -2.0, beta: 0.5, ..e },
        Epilogue { beta: 1.0, ..e },
    ]
}

/// Every unary op, with representative parameters.
pub(crate) fn unary_ops() -> Vec<UnaryOp> {
    vec![
        UnaryOp::Relu,
        UnaryOp::LeakyRelu { alpha: 0.01 },
        UnaryOp::Elu { alpha: 1.3 },
        UnaryOp::Sigmoid,
        UnaryOp::Tanh,
        UnaryOp::Swish,
        UnaryOp::Gelu(GeluForm::Tanh),
        UnaryOp::Gelu(GeluForm::Erf),
        UnaryOp::Clip { min: -0.75, max: 2.5 },
        UnaryOp::Scale { s: -1.7 },
    ]
}

fn vector_lens(scale: Scale) -> Vec<usize> {
    let mut v = vec![1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 255, 1000, 1023, 4097, 65_537, 1_048_583];
    if scale == Scale::Large {
        v.extend([16 * 1024 * 1024 + 3, 64 * 1024 * 1024 + 1]);
    }
    v
}

/// The ops of one group at this scale.
pub fn cases(group: Group, scale: Scale) -> Vec<Op> {
    let large = scale == Scale::Large;
    match group {
        Group::Unary => {
            let lens = vector_lens(scale);
            unary_ops()
                .into_iter()
                .flat_map(|op| {
                    // The big sizes once per op is plenty; keep the odd small ones for all.
                    lens.iter().map(move |&len| Op::unary(op, len))
                })
                .collect()
        }
        Group::Binary => [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::SwiGlu]
            .into_iter()
            .flat_map(|op| vector_lens(scale).into_iter().map(move |len| Op::binary(op, len)))
            .collect(),
        Group::Reductions => vector_lens(scale)
            .into_iter()
            .flat_map(|len| [Op::reduce(ReduceOp::Sum, len), Op::reduce(ReduceOp::Max, len), Op::dot(len)])
            .collect(),
        Group::Rows => {
            let mut shapes = vec![(1, 1), (1, 7), (3, 33), (5, 1000), (64, 4097), (300, 256), (2, 65_537), (1031, 17)];
            if large {
                shapes.extend([(4096, 4096), (65_536, 128), (8, 1 << 20)]);
            }
            let ops = [RowOp::Softmax, RowOp::LogSoftmax, RowOp::LayerNorm { eps: 1e-5 }, RowOp::RmsNorm { eps: 1e-6 }];
            ops.into_iter().flat_map(|op| shapes.iter().map(move |&(r, c)| Op::rows(op, r, c))).collect()
        }
        Group::Matmul => {
            let mut shapes = vec![
                (1, 1, 1),
                (1, 7, 3),
                (3, 1, 5),
                (5, 3, 1),
                (17, 33, 9),
                (64, 64, 64),
                (65, 31, 127),
                (128, 256, 96),
                (136, 40, 200),
                (257, 129, 191),
                (1, 513, 300),
                (300, 513, 1),
                // 9 to 16 rows (several sequences of a decoder): k a multiple
                // of 8 or not, n ragged.
                (9, 37, 19),
                (12, 136, 40),
                (16, 264, 33),
            ];
            if large {
                shapes.extend([
                    (1024, 1024, 1024),
                    (1000, 2000, 999),
                    (2048, 64, 2048),
                    (33, 4096, 65),
                    (16, 2048, 3072),
                    (13, 8192, 1000),
                ]);
            }
            let mut ops = Vec::new();
            for &(m, k, n) in &shapes {
                for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                    ops.push(Op::Matmul(MatmulSpec { trans_a: ta, trans_b: tb, ..MatmulSpec::new(m, k, n) }));
                }
            }
            ops
        }
        Group::BatchedMatmul => {
            let mut v = vec![
                (3, 5, 7, 9, false, false),
                (4, 33, 65, 17, true, false),
                (2, 64, 32, 128, false, true),
                (7, 1, 9, 1, true, true),
                (3, 16, 72, 24, false, true),
            ];
            if large {
                v.push((16, 256, 512, 256, false, false));
            }
            let mut ops: Vec<Op> = v
                .into_iter()
                .map(|(batch, m, k, n, trans_a, trans_b)| {
                    Op::Matmul(MatmulSpec { batch, trans_a, trans_b, ..MatmulSpec::new(m, k, n) })
                })
                .collect();
            // Strided batches: one B shared by every product (as rows, and
            // not), A shared, matrices spaced past their size or overlapping.
            let strided = |batch, m, k, n, ta, tb, sa: &dyn Fn(usize) -> usize, sb: &dyn Fn(usize) -> usize| {
                let spec = MatmulSpec { batch, trans_a: ta, trans_b: tb, ..MatmulSpec::new(m, k, n) };
                Op::Matmul(spec.with_batch_strides(sa(m * k), sb(k * n)))
            };
            ops.extend([
                strided(3, 5, 7, 9, false, false, &|mk| mk, &|_| 0),
                strided(4, 16, 72, 24, false, true, &|mk| mk, &|_| 0),
                strided(3, 33, 65, 17, true, false, &|mk| mk, &|_| 0),
                strided(2, 64, 32, 128, false, true, &|_| 0, &|kn| kn),
                strided(3, 17, 24, 40, false, false, &|mk| mk + 8, &|kn| kn + 3),
                strided(5, 9, 16, 8, true, true, &|_| 40, &|kn| kn / 2),
                strided(3, 16, 32, 16, false, true, &|mk| mk / 2, &|kn| kn + 16),
            ]);
            if large {
                ops.push(strided(8, 256, 512, 256, false, true, &|mk| mk, &|_| 0));
                ops.push(strided(4, 256, 512, 256, false, false, &|mk| mk + 512, &|kn| kn + 256));
            }
            ops
        }
        Group::MatmulEpilogue => {
            let mut shapes = vec![
                (1, 1, 7, 3),
                (1, 17, 33, 9),
                (1, 65, 31, 127),
                (1, 128, 96, 136),
                (1, 12, 136, 40),
                (3, 16, 72, 24),
                (2, 64, 64, 64),
            ];
            if large {
                shapes.extend([(1, 257, 129, 191), (4, 256, 448, 256), (1, 512, 224, 1024)]);
            }
            let transposes = [(false, false), (true, false), (false, true), (true, true)];
            let mut ops = Vec::new();
            for (i, &(batch, m, k, n)) in shapes.iter().enumerate() {
                for (j, e) in epilogues().into_iter().enumerate() {
                    let (trans_a, trans_b) = transposes[(i + j) % 4];
                    let spec = MatmulSpec { batch, trans_a, trans_b, ..MatmulSpec::new(m, k, n) };
                    ops.push(Op::Matmul(spec.with_epilogue(e)));
                }
            }
            // The epilogues over strided batches: B shared (as rows), then spaced.
            for (i, e) in epilogues().into_iter().enumerate() {
                let spec = MatmulSpec { batch: 3, trans_b: i % 2 == 1, ..MatmulSpec::new(16, 72, 24) };
                ops.push(Op::Matmul(spec.with_batch_strides(16 * 72, 0).with_epilogue(e)));
                for pad in [4, 8] {
                    let spaced = spec.with_batch_strides(16 * 72 + pad, 72 * 24 + 8);
                    ops.push(Op::Matmul(spaced.with_epilogue(e)));
                }
            }
            ops
        }
        Group::Conv2d => {
            let c = |n, c_in, h, w, c_out, kh, kw, stride, padding| {
                Op::Conv2d(Conv2dSpec { n, c_in, h, w, c_out, kh, kw, stride, padding, dtype: DType::F32 })
            };
            let mut v = vec![
                c(1, 1, 5, 5, 1, 3, 3, (1, 1), (0, 0)),
                c(2, 3, 17, 13, 4, 3, 3, (1, 1), (1, 1)),
                c(1, 8, 16, 16, 16, 1, 1, (1, 1), (0, 0)),
                c(3, 4, 15, 20, 5, 5, 3, (2, 1), (2, 0)),
                c(1, 2, 9, 9, 3, 4, 4, (3, 3), (1, 2)),
                c(2, 16, 32, 32, 32, 3, 3, (2, 2), (1, 1)),
            ];
            if large {
                v.push(c(8, 64, 56, 56, 64, 3, 3, (1, 1), (1, 1)));
            }
            v
        }
        Group::Attention => attention_cases(large),
        Group::Casts => {
            let mut v = Vec::new();
            for from in DType::ALL {
                for to in DType::ALL {
                    v.extend(vector_lens(scale).into_iter().map(|len| Op::cast(len, from, to)));
                }
            }
            v
        }
        Group::Interpolation => {
            let mut v: Vec<Op> = vector_lens(scale).into_iter().map(|len| Op::lerp(len, 0.3)).collect();
            v.extend(
                [1, 17, 1000, 65_537].into_iter().flat_map(|len| [-0.5, 0.5, 0.75, 1.25].map(|t| Op::lerp(len, t))),
            );
            let mut shapes = vec![(1, 1), (1, 2), (3, 3), (5, 7), (4, 64), (7, 129), (64, 1000), (300, 256), (2, 4097)];
            shapes.push((1031, 17));
            if large {
                shapes.extend([(4096, 4096), (65_536, 128), (4, 1 << 20)]);
            }
            v.extend(shapes.iter().flat_map(|&(r, c)| [0.3, 0.85].map(|t| Op::slerp(r, c, t))));
            v
        }
        Group::Quantized => quantized_cases(large),
        Group::Decoder => decoder_cases(large),
        Group::EdgeValues | Group::SpecialValues | Group::Errors | Group::Tensors => Vec::new(),
    }
}

/// Quantized matmuls `(m, k, n)` of every weight format (`k` in blocks of
/// 256 values; `Q8_0` also with rows of 96 and 160, whole 32-value blocks
/// but not of 256), and quantizing and dequantizing casts of one block, a
/// few and many. Activations and outputs of other dtypes come from
/// [`dtype_variants`].
fn quantized_cases(large: bool) -> Vec<Op> {
    // (1, 33, 5): one row of 8448 values, the one-row kernels for long rows.
    let mut shapes =
        vec![(1, 1, 1), (1, 2, 37), (1, 33, 5), (2, 1, 5), (3, 3, 17), (8, 1, 64), (16, 2, 9), (17, 1, 33), (40, 2, 7)];
    if large {
        shapes.extend([(1, 16, 4096), (1, 56, 1024), (2, 17, 5), (16, 16, 1024), (64, 16, 512), (300, 4, 256)]);
    }
    let mut v = Vec::new();
    for weight in DType::QUANTIZED {
        for &(m, blocks, n) in &shapes {
            v.push(Op::QuantMatmul(QuantMatmulSpec::new(m, blocks * 256, n, weight)));
        }
        let per = weight.block_values();
        let lens = if large { vec![1, 3, 64, 16_384] } else { vec![1, 3, 64] };
        for blocks in lens {
            for float in DType::ALL {
                v.push(Op::cast(blocks * per, float, weight));
                v.push(Op::cast(blocks * per, weight, float));
            }
        }
    }
    for (m, k, n) in [(1, 96, 3), (2, 96, 5), (17, 160, 9)] {
        v.push(Op::QuantMatmul(QuantMatmulSpec::new(m, k, n, DType::Q8_0)));
    }
    // Epilogues (a residual add, and everything at once) on the one-row, the
    // few-row and the many-row paths.
    let all = Epilogue { alpha: 0.75, beta: -0.5, bias: true, activation: Some(Activation::Silu) };
    for &(m, blocks, n) in &[(1, 2, 37), (3, 1, 17), (8, 1, 40), (17, 1, 33)] {
        for weight in [DType::Q4K, DType::Q6K] {
            let s = QuantMatmulSpec::new(m, blocks * 256, n, weight);
            v.push(Op::QuantMatmul(s.with_scales(1.0, 1.0)));
            v.push(Op::QuantMatmul(s.with_epilogue(all)));
        }
    }
    // The fused norm and gated product of a decoder's layer, alone and
    // together (with a residual after the norm), on the three paths; long
    // rows when large (8448 values, one pass of the kernels for long rows;
    // 14336, several).
    let mut fused = vec![(1, 2, 38), (2, 1, 18), (4, 1, 10), (8, 1, 40), (17, 1, 34)];
    if large {
        fused.extend([(1, 33, 6), (1, 56, 512), (16, 8, 512)]);
    }
    for &(m, blocks, n) in &fused {
        for weight in [DType::Q4K, DType::Q5K, DType::Q6K, DType::Q8_0] {
            let s = QuantMatmulSpec::new(m, blocks * 256, n, weight);
            v.push(Op::QuantMatmul(s.with_rms_norm(1e-5)));
            v.push(Op::QuantMatmul(s.with_glu()));
            v.push(Op::QuantMatmul(s.with_rms_norm(1e-6).with_glu()));
        }
        let s = QuantMatmulSpec::new(m, blocks * 256, n, DType::Q4K).with_rms_norm(1e-5);
        v.push(Op::QuantMatmul(s.with_scales(1.0, 1.0)));
    }
    v
}

/// The ops a transformer decoder adds: rotary embeddings of both layouts
/// (prefill and decode shapes, positions deep into a long context, head
/// sizes 64, 128 and the odd 6), strided copies (a KV-cache append, both
/// transposes between token- and head-major, a sliced row block, a
/// one-element copy), embedding lookups (one token, a prompt, a table of one
/// row) and argmax over rows (one, a batch, odd lengths).
fn decoder_cases(large: bool) -> Vec<Op> {
    use crate::rope::{RopeLayout, RopeScaling, RopeSpec};
    use crate::strided::{CopySpec, Strided};
    let mut v = Vec::new();
    let mut ropes =
        vec![(1, 1, 2, 0), (1, 32, 128, 0), (1, 8, 128, 4095), (17, 4, 64, 0), (7, 3, 6, 100_000), (64, 2, 64, 3)];
    if large {
        ropes.extend([(2048, 32, 128, 0), (1, 32, 128, 131_071)]);
    }
    for (seq, heads, d, pos) in ropes {
        for layout in [RopeLayout::HalfSplit, RopeLayout::Interleaved] {
            v.push(Op::Rope(RopeSpec::new(seq, heads, d, 10_000.0).at_position(pos).with_layout(layout)));
        }
    }
    v.push(Op::Rope(RopeSpec::new(5, 2, 128, 500_000.0).at_position(8191)));
    // Positions read from the device (a recorded decoding step).
    for (seq, heads, d) in [(1, 32, 128), (7, 3, 6), (17, 4, 64)] {
        for layout in [RopeLayout::HalfSplit, RopeLayout::Interleaved] {
            v.push(Op::Rope(RopeSpec::new(seq, heads, d, 10_000.0).with_layout(layout).with_positions()));
        }
    }
    // Llama 3's frequency scaling (3.2: head size 64, factor 32; 3.1: 128,
    // factor 8; θ = 500000): every pair's regime (kept, blended, divided)
    // at positions in and far past the original context, both layouts, host
    // and device positions, and as the keys of a fused q/k/v product.
    for (seq, heads, d, factor, pos) in [(3, 2, 64, 32.0, 0), (2, 4, 128, 8.0, 131_000), (1, 1, 6, 8.0, 8191)] {
        for layout in [RopeLayout::HalfSplit, RopeLayout::Interleaved] {
            let r =
                RopeSpec::new(seq, heads, d, 500_000.0).with_layout(layout).with_scaling(RopeScaling::llama3(factor));
            v.push(Op::Rope(r.at_position(pos)));
            v.push(Op::Rope(r.with_positions()));
        }
    }
    let odd = RopeScaling { factor: 4.0, low_freq_factor: 0.5, high_freq_factor: 2.5, original_max_position: 100 };
    v.push(Op::Rope(RopeSpec::new(9, 2, 64, 10_000.0).from_heads(12, 8).with_scaling(odd).with_positions()));
    // The queries and the keys of a fused q/k/v product (8 + 2 + 2 heads a
    // token), one token and a prompt, host and device positions.
    for (seq, heads, first) in [(1, 8, 0), (1, 2, 8), (9, 8, 0), (9, 2, 8)] {
        for layout in [RopeLayout::HalfSplit, RopeLayout::Interleaved] {
            let r = RopeSpec::new(seq, heads, 64, 10_000.0).with_layout(layout).from_heads(12, first);
            v.push(Op::Rope(r.at_position(33)));
            v.push(Op::Rope(r.with_positions()));
        }
    }
    // The keys of a fused q/k/v product turned straight into a KV cache of
    // [2 heads, 40 rows, 64] (host positions up to its last row, and positions
    // read on the device), and plain rows of 3 heads into a cache of 5.
    for (seq, layout) in [(1, RopeLayout::HalfSplit), (3, RopeLayout::Interleaved), (9, RopeLayout::HalfSplit)] {
        let r = RopeSpec::new(seq, 2, 64, 10_000.0).with_layout(layout).from_heads(12, 8).into_cache(40);
        v.push(Op::Rope(r.at_position(40 - seq)));
        v.push(Op::Rope(r.with_positions()));
    }
    v.push(Op::Rope(RopeSpec::new(4, 3, 6, 10_000.0).into_cache(5).at_position(1)));
    // A KV cache of [heads 4, 16 slots, 8]: append 3 tokens of [3, 4, 8] at slot 5.
    let (h, cap, d) = (4usize, 16usize, 8usize);
    let cache = |offset| Strided { offset, strides: [cap * d, d, 1], len: h * cap * d };
    let token_major = |seq: usize| Strided { offset: 0, strides: [d, h * d, 1], len: seq * h * d };
    v.push(Op::Copy(CopySpec::new([h, 3, d], token_major(3), cache(5 * d))));
    v.push(Op::Copy(CopySpec::new([h, 1, d], token_major(1), cache(15 * d))));
    // [seq, heads, d] → [heads, seq, d] and back, for 33 tokens of 3 heads of 64.
    let (seq, heads, hd) = (33usize, 3usize, 64usize);
    let tm = Strided { offset: 0, strides: [hd, heads * hd, 1], len: seq * heads * hd };
    let hm = Strided::contiguous([heads, seq, hd]);
    v.push(Op::Copy(CopySpec::new([heads, seq, hd], tm, hm)));
    v.push(Op::Copy(CopySpec::new([heads, seq, hd], hm, tm)));
    // Rows 3..10, columns 5..105 of a 20 × 300 matrix into a 7 × 100 one.
    let sliced = Strided { offset: 3 * 300 + 5, strides: [0, 300, 1], len: 20 * 300 };
    v.push(Op::Copy(CopySpec::new([1, 7, 100], sliced, Strided::contiguous([1, 7, 100]))));
    v.push(Op::Copy(CopySpec::new([1, 1, 1], Strided::contiguous([1, 1, 1]), cache(77))));
    // The same appends at slots read from the device.
    v.push(Op::Copy(CopySpec::new([h, 3, d], token_major(3), cache(0)).at_positions(cap)));
    v.push(Op::Copy(CopySpec::new([h, 1, d], token_major(1), cache(0)).at_positions(cap)));
    v.push(Op::Copy(CopySpec::new([h, 5, d], token_major(5), cache(0)).at_positions(cap)));
    if large {
        let (h, cap, d) = (8usize, 8192usize, 128usize);
        let cache = Strided { offset: 4000 * d, strides: [cap * d, d, 1], len: h * cap * d };
        let src = Strided { offset: 0, strides: [d, h * d, 1], len: 512 * h * d };
        v.push(Op::Copy(CopySpec::new([h, 512, d], src, cache)));
        let cache = Strided { offset: 0, ..cache };
        v.push(Op::Copy(CopySpec::new([h, 512, d], src, cache).at_positions(cap)));
    }
    for (ids, rows, cols) in [(1, 1, 1), (1, 1000, 64), (17, 300, 33), (512, 4096, 128), (3, 5, 2048)] {
        v.push(Op::Gather { ids, rows, cols, dtype: DType::F32 });
    }
    // SwiGLU of a fused gate/up product: one token, a prompt, odd widths.
    for (rows, cols) in [(1, 1), (1, 8192), (7, 333), (64, 128)] {
        v.push(Op::Glu { rows, cols, dtype: DType::F32 });
    }
    let mut argmax = vec![(1, 1), (1, 7), (3, 1000), (16, 32_000), (5, 65_537)];
    if large {
        argmax.push((64, 128_256));
    }
    v.extend(argmax.into_iter().map(|(rows, cols)| Op::ArgMax { rows, cols, dtype: DType::F32 }));
    v
}

/// Attention shapes: `(batch, heads_q, heads_kv, seq_q, seq_k, head_dim, mask)`
/// covering odd lengths, `seq_q ≠ seq_k` both ways (with end-aligned causal
/// masks that leave the first queries seeing nothing), grouped-query heads
/// 8:1, 2:1 and 1:1, decode shapes, head sizes 64, 128 and the odd 80 and 8,
/// one case with a scale of 8, whose scores reach ±100 and more, and three
/// reading a KV cache of larger capacity than `seq_k`.
fn attention_cases(large: bool) -> Vec<Op> {
    use Mask::{Causal, CausalTopLeft, None as Full};
    let mut v = vec![
        (1, 1, 1, 1, 1, 64, Full),
        (2, 4, 4, 17, 33, 64, Full),
        (2, 4, 4, 17, 33, 64, Causal),
        (1, 8, 1, 31, 31, 128, Causal),
        (1, 2, 2, 65, 17, 64, Causal),
        (1, 2, 2, 65, 17, 64, CausalTopLeft),
        (1, 2, 1, 40, 90, 128, CausalTopLeft),
        (1, 4, 2, 1, 300, 64, Causal),
        (2, 2, 1, 4, 257, 128, Causal),
        (2, 2, 2, 40, 40, 80, Causal),
        (1, 3, 3, 19, 23, 8, Full),
        (1, 2, 2, 130, 129, 64, Causal),
        // One query against 2048 keys: a GPU splits the keys across blocks.
        (1, 2, 1, 1, 2048, 64, Causal),
    ];
    if large {
        v.extend([
            (1, 8, 2, 512, 512, 128, Causal),
            (2, 4, 4, 1024, 1024, 64, Full),
            (4, 32, 8, 1, 8192, 128, Causal),
            (1, 4, 1, 3, 4097, 64, Causal),
        ]);
    }
    let mut ops: Vec<Op> = v
        .into_iter()
        .map(|(b, hq, hkv, sq, sk, d, mask)| {
            Op::Attention(AttentionSpec::new(b, hq, sq, sk, d).with_kv_heads(hkv).with_mask(mask))
        })
        .collect();
    ops.push(Op::Attention(AttentionSpec::new(2, 2, 33, 70, 64).causal().with_scale(8.0)));
    // Against a KV cache filled to seq_k of its capacity: a decode step, a
    // prefill chunk, and a step over a one-row fill.
    ops.push(Op::Attention(AttentionSpec::new(1, 4, 1, 37, 64).with_kv_heads(2).causal().with_kv_capacity(64)));
    ops.push(Op::Attention(AttentionSpec::new(2, 2, 5, 20, 128).causal().with_kv_capacity(33)));
    ops.push(Op::Attention(AttentionSpec::new(1, 8, 1, 1, 64).with_kv_heads(1).causal().with_kv_capacity(9)));
    // The keys counted from query positions on the device (a recorded
    // decoding step): one token, a chunk of five in two sequences, one token
    // whose keys a GPU splits across blocks.
    let positions = |a: AttentionSpec| Op::Attention(a.with_positions());
    ops.push(positions(AttentionSpec::new(1, 4, 1, 64, 64).with_kv_heads(2).causal()));
    ops.push(positions(AttentionSpec::new(3, 2, 5, 33, 128).causal()));
    ops.push(positions(AttentionSpec::new(2, 2, 1, 2048, 64).with_kv_heads(1).causal()));
    ops.push(positions(AttentionSpec::new(1, 2, 1, 40, 64)));
    if large {
        ops.push(positions(AttentionSpec::new(4, 32, 1, 8192, 128).with_kv_heads(8).causal()));
    }
    ops
}

/// Matmuls and convolutions above this many multiply-adds run in `f32` only:
/// their float64 reference is the slow part of the suite, and the half
/// variants of the smaller shapes reach the same kernel paths.
const HALF_MAX_MACS: u64 = 1 << 27;

/// `op` (an `f32` case) at every dtype the suite checks: the same op on
/// `f16` and `bf16` data, and for a matmul also half inputs with an `f32`
/// output and `f32` inputs in TF32 precision. Casts already name their dtypes.
pub fn dtype_variants(op: &Op) -> Vec<Op> {
    let macs = op.cost().flops / 2;
    match *op {
        Op::Cast { .. } => vec![*op],
        Op::QuantMatmul(s) => {
            let mut v = vec![*op];
            if macs <= HALF_MAX_MACS {
                for d in [DType::F16, DType::BF16] {
                    v.push(Op::QuantMatmul(s.with_dtypes(d, DType::F32)));
                    v.push(Op::QuantMatmul(s.with_dtypes(d, d)));
                }
                v.push(Op::QuantMatmul(s.with_dtypes(DType::F32, DType::BF16)));
            }
            v
        }
        Op::Matmul(s) => {
            let mut v = vec![*op, Op::Matmul(s.with_precision(Precision::Tf32))];
            if macs <= HALF_MAX_MACS {
                for d in [DType::F16, DType::BF16] {
                    v.push(Op::Matmul(s.with_dtypes(d, d)));
                    v.push(Op::Matmul(s.with_dtypes(d, DType::F32)));
                }
            }
            v
        }
        Op::Conv2d(_) if macs > HALF_MAX_MACS => vec![*op],
        Op::Attention(a) => {
            let mut v: Vec<Op> = DType::ALL.iter().map(|&d| op.with_dtype(d)).collect();
            v.push(Op::Attention(a.with_precision(Precision::Tf32)));
            v
        }
        _ => DType::ALL.iter().map(|&d| op.with_dtype(d)).collect(),
    }
}
