//! Attention on every ISA against the float64 reference: sequence lengths at
//! the block edges, both causal alignments, grouped-query heads, scores of
//! every magnitude, and several threads.

use super::*;
use crate::kernels::test_data::{pool, uniform};
use crate::tuning::{ATTENTION_DECODE_BLOCK_K, ATTENTION_DECODE_MIN_CHUNK};
use compute_core::conformance::{POISON, compare, compare_typed, poison_bits};
use compute_core::{HostVec, Mask, Op, bf16, f16};

const MASKS: [Mask; 3] = [Mask::None, Mask::Causal, Mask::CausalTopLeft];

/// Runs `spec` on `isa` (on the calling thread only, or on a pool of
/// `threads`) and checks every output element; returns the output.
fn check(isa: Isa, spec: AttentionSpec, threads: usize) -> Vec<f32> {
    let AttentionSpec { batch, heads_q, heads_kv, seq_q, seq_k, head_dim: d, .. } = spec;
    let seed = (seq_q * 131 + seq_k * 7 + d + heads_q) as u64;
    let q = uniform(batch * heads_q * seq_q * d, -1.0, 1.0, seed);
    let k = uniform(batch * heads_kv * seq_k * d, -1.0, 1.0, seed + 1);
    let v = uniform(batch * heads_kv * seq_k * d, -1.0, 1.0, seed + 2);
    let mut out = vec![POISON; q.len()];
    let run = |out: &mut [f32]| attention(isa, &spec, &q, &k, &v, out);
    let r = if threads <= 1 { par::sequential(|| run(&mut out)) } else { pool(threads).install(|| run(&mut out)) };
    assert!(r.is_ok(), "{isa} {spec:?}: {r:?}");
    if let Some(msg) = compare(&Op::Attention(spec), &[&q, &k, &v], &out, 1.0) {
        panic!("{isa} {} threads={threads}: {msg}", spec.shapes());
    }
    out
}

/// [`check`] on `T` data: inputs rounded to `T`, read by the kernel as `T`
/// (no widened copies), the output compared in `T` with the float64
/// reference of the rounded inputs.
fn check_typed<T: Element>(isa: Isa, spec: AttentionSpec, threads: usize) -> Vec<T> {
    let AttentionSpec { batch, heads_q, heads_kv, seq_q, seq_k, head_dim: d, .. } = spec;
    let seed = (seq_q * 131 + seq_k * 7 + d + heads_q) as u64;
    let round = |v: Vec<f32>| v.into_iter().map(T::from_f32).collect::<Vec<T>>();
    let q = round(uniform(batch * heads_q * seq_q * d, -1.0, 1.0, seed));
    let k = round(uniform(batch * heads_kv * seq_k * d, -1.0, 1.0, seed + 1));
    let v = round(uniform(batch * heads_kv * seq_k * d, -1.0, 1.0, seed + 2));
    let poison = HostVec::filled_bits(T::DTYPE, q.len(), poison_bits(T::DTYPE));
    let mut out = T::from_host(poison.as_slice()).unwrap_or_default().to_vec();
    let run = |out: &mut [T]| attention(isa, &spec, &q, &k, &v, out);
    let r = if threads <= 1 { par::sequential(|| run(&mut out)) } else { pool(threads).install(|| run(&mut out)) };
    assert!(r.is_ok(), "{isa} {spec:?}: {r:?}");
    let op = Op::Attention(spec.with_dtype(T::DTYPE));
    if let Some(msg) = compare_typed(&op, &[T::host(&q), T::host(&k), T::host(&v)], T::host(&out), 1.0) {
        panic!("{isa} {} {} threads={threads}: {msg}", T::DTYPE, spec.shapes());
    }
    out
}

/// Decoding shapes (one or a few queries per head, at most
/// `ATTENTION_DECODE_MAX_ROWS` rows per key/value head) on `isa`, `threads`.
fn decode_shapes() -> Vec<AttentionSpec> {
    let long = 2 * ATTENTION_DECODE_MIN_CHUNK + 3;
    let mut v = Vec::new();
    for group in [1, 4, 8] {
        for sk in [1, 70, ATTENTION_DECODE_BLOCK_K + 1, 1000, long, 4100] {
            // One (batch, kv head) pair, and four: fewer than four per thread.
            v.push(AttentionSpec::new(1, group, 1, sk, 64).with_kv_heads(1).causal());
            v.push(AttentionSpec::new(2, 2 * group, 1, sk, 128).with_kv_heads(2));
        }
        // Two queries per head (speculative decoding): rows of a group see
        // different numbers of keys.
        v.push(AttentionSpec::new(1, 2 * group, 2, long, 64).with_kv_heads(2).causal());
    }
    v
}

#[test]
fn decoding_splits_the_keys_across_threads() {
    let mut split = 0;
    for spec in decode_shapes() {
        for threads in [2, 3] {
            let (keys, chunk, chunks) = decode::key_chunks(&spec, workers(&spec, threads));
            if chunks > 1 {
                split += 1;
                // A ragged last chunk: the key count is not a multiple of it.
                assert!(!keys.is_multiple_of(chunk) || keys == 1000, "{}", spec.shapes());
            }
        }
    }
    assert!(split >= 12, "only {split} of the decoding shapes split their keys");
    for isa in Isa::available() {
        for spec in decode_shapes() {
            for threads in [1, 2, 3] {
                check(isa, spec, threads);
            }
        }
    }
}

#[test]
fn decoding_reads_half_data_directly() {
    for isa in Isa::available() {
        for spec in decode_shapes() {
            for threads in [1, 2] {
                check_typed::<bf16>(isa, spec, threads);
                check_typed::<f16>(isa, spec, threads);
            }
        }
    }
}

#[test]
fn decoding_masks() {
    let long = 2 * ATTENTION_DECODE_MIN_CHUNK + 3;
    for isa in Isa::available() {
        for threads in [1, 2] {
            // End-aligned: the one query sees every key; start-aligned: only the first.
            for mask in MASKS {
                check(isa, AttentionSpec::new(1, 4, 1, long, 64).with_kv_heads(1).with_mask(mask), threads);
                check_typed::<bf16>(
                    isa,
                    AttentionSpec::new(1, 4, 1, long, 64).with_kv_heads(1).with_mask(mask),
                    threads,
                );
            }
            // 16 rows per kv head (8 queries × 2 heads), end-aligned, 515
            // keys: the last chunk of 3 keys is past what the first four
            // queries see, so their rows of that chunk are empty.
            let spec = AttentionSpec::new(1, 2, 8, 2 * ATTENTION_DECODE_MIN_CHUNK + 3, 32).with_kv_heads(1).causal();
            check(isa, spec, threads);
            check_typed::<bf16>(isa, spec, threads);
            // More queries than keys: the first two of each head see nothing.
            let spec = AttentionSpec::new(1, 4, 3, 1, 16).with_kv_heads(1).causal();
            let out = check(isa, spec, threads);
            for head in out.chunks(3 * 16) {
                assert!(head[..2 * 16].iter().all(|&x| x == 0.0), "{isa}");
                assert!(head[2 * 16..].iter().any(|&x| x != 0.0), "{isa}");
            }
            let out = check_typed::<f16>(isa, spec, threads);
            assert!(out.chunks(3 * 16).all(|head| head[..2 * 16].iter().all(|&x| x.to_f32() == 0.0)), "{isa}");
        }
    }
}

#[test]
fn decoding_keeps_a_stable_softmax_across_key_chunks() {
    // Scale 30: the chunks' maxima differ by hundreds, so the merge's
    // weights e^(m − M) span the whole range down to zero.
    for isa in Isa::available() {
        for threads in [1, 2, 3] {
            let spec = AttentionSpec::new(1, 4, 1, 1500, 64).with_kv_heads(1).with_scale(30.0);
            check(isa, spec, threads);
            check_typed::<bf16>(isa, spec, threads);
            check(isa, spec.with_scale(-4.0).causal(), threads);
        }
    }
}

#[test]
fn decoding_head_sizes_not_a_multiple_of_a_vector() {
    for isa in Isa::available() {
        for d in [1, 3, 17, 40, 80, 130] {
            let spec = AttentionSpec::new(1, 8, 1, 600, d).with_kv_heads(2).causal();
            check(isa, spec, 2);
            check_typed::<bf16>(isa, spec, 2);
            check_typed::<f16>(isa, spec, 1);
        }
    }
}

#[test]
fn key_chunks_give_every_thread_work() {
    use decode::chunk_len;
    // One thread, or enough (batch, kv head) pairs: one chunk.
    assert_eq!(chunk_len(4096, 1, 1), 4096);
    assert_eq!(chunk_len(4096, 8, 2), 4096);
    // One pair on two threads: eight chunks would be 512 keys.
    assert_eq!(chunk_len(4096, 1, 2), 512);
    // ... but never below the minimum, rounded up to whole blocks.
    let c = chunk_len(1000, 1, 2);
    assert!(c >= ATTENTION_DECODE_MIN_CHUNK && c.is_multiple_of(ATTENTION_DECODE_BLOCK_K) && c < 1000, "{c}");
    assert_eq!(chunk_len(100, 1, 16), 100);
    assert_eq!(chunk_len(0, 1, 16), 1);
}

#[test]
fn half_prefill_reads_half_data_directly() {
    for isa in Isa::available() {
        for mask in MASKS {
            check_typed::<bf16>(isa, AttentionSpec::new(1, 4, 200, 300, 64).with_kv_heads(2).with_mask(mask), 2);
            check_typed::<f16>(isa, AttentionSpec::new(1, 2, 37, 70, 17).with_mask(mask), 1);
        }
    }
}

#[test]
fn sequence_lengths_at_the_block_edges_every_isa_and_mask() {
    let (bq, bk) = (ATTENTION_BLOCK_Q, ATTENTION_BLOCK_K);
    let lens = [1, 2, bq - 1, bq, bq + 1, bk - 1, bk, bk + 1];
    for isa in Isa::available() {
        for mask in MASKS {
            for &sq in &lens {
                for &sk in &[1, 17, bk - 1, bk, bk + 1, 2 * bk + 3] {
                    if sq * sk > 64 * 1024 && sq != sk {
                        continue;
                    }
                    check(isa, AttentionSpec::new(1, 1, sq, sk, 16).with_mask(mask), 1);
                }
            }
        }
    }
}

#[test]
fn head_sizes_not_a_multiple_of_a_vector_or_a_tile() {
    for isa in Isa::available() {
        for d in [1, 3, 8, 15, 17, 64, 80, 96, 130] {
            check(isa, AttentionSpec::new(1, 2, 37, 70, d).causal(), 1);
            check(isa, AttentionSpec::new(1, 1, 5, 300, d), 1);
        }
    }
}

#[test]
fn grouped_query_heads_read_their_own_kv_head() {
    for isa in Isa::available() {
        for (hq, hkv) in [(8, 1), (8, 2), (6, 3), (4, 4)] {
            for mask in MASKS {
                check(isa, AttentionSpec::new(2, hq, 19, 45, 32).with_kv_heads(hkv).with_mask(mask), 1);
            }
        }
    }
}

#[test]
fn queries_that_see_no_key_get_zeros() {
    // End-aligned causal with more queries than keys: the first 60 see nothing.
    for isa in Isa::available() {
        let spec = AttentionSpec::new(1, 2, 70, 10, 16).causal();
        let out = check(isa, spec, 1);
        for head in out.chunks(70 * 16) {
            assert!(head[..60 * 16].iter().all(|&x| x == 0.0), "{isa}");
            assert!(head[60 * 16..].iter().any(|&x| x != 0.0), "{isa}");
        }
        // No keys at all.
        let spec = AttentionSpec::new(1, 1, 3, 0, 8);
        let mut out = vec![POISON; 24];
        assert!(attention(isa, &spec, &uniform(24, -1.0, 1.0, 1), &[], &[], &mut out).is_ok());
        assert!(out.iter().all(|&x| x == 0.0), "{isa}");
    }
}

#[test]
fn large_scores_keep_a_stable_softmax() {
    // Scale 30: scores reach several hundred, and the running max changes
    // from one key block to the next.
    for isa in Isa::available() {
        for mask in MASKS {
            check(isa, AttentionSpec::new(1, 2, 50, 600, 64).with_mask(mask).with_scale(30.0), 1);
            check(isa, AttentionSpec::new(1, 1, 40, 300, 16).with_mask(mask).with_scale(-4.0), 1);
        }
    }
}

#[test]
fn several_threads_give_the_same_result_as_one() {
    for isa in Isa::available() {
        for mask in MASKS {
            // Large enough to go parallel, with blocks of every kind.
            let spec = AttentionSpec::new(1, 3, 300, 520, 64).with_kv_heads(1).with_mask(mask);
            let one = check(isa, spec, 1);
            let three = check(isa, spec, 3);
            assert_eq!(one, three, "{isa} {mask:?}: the result depends on the thread count");
            // One head: the query blocks are cut smaller so both threads get work.
            check(isa, AttentionSpec::new(1, 1, 97, 400, 64).with_mask(mask), 2);
        }
        // Decoding: one query per head against a long cache.
        check(isa, AttentionSpec::new(2, 4, 1, 1500, 64).with_kv_heads(2).causal(), 2);
    }
}

#[test]
fn block_rows_give_every_thread_work() {
    assert_eq!(block_rows(1024, 8, 1), ATTENTION_BLOCK_Q);
    assert_eq!(block_rows(1024, 8, 2), ATTENTION_BLOCK_Q);
    assert_eq!(block_rows(1, 64, 16), 1);
    assert_eq!(block_rows(5, 1, 1), 5);
    let rows = block_rows(100, 1, 4);
    assert!(100usize.div_ceil(rows) >= 8 && rows >= MIN_BLOCK_Q, "{rows}");
    assert_eq!(block_rows(40, 1, 16), MIN_BLOCK_Q);
}

#[test]
fn short_slices_leave_the_output_unwritten() {
    let spec = AttentionSpec::new(1, 1, 4, 4, 8);
    let x = uniform(32, -1.0, 1.0, 3);
    let mut out = vec![POISON; 32];
    assert!(attention(Isa::Portable, &spec, &x, &x[..31], &x, &mut out).is_ok());
    assert!(out.iter().all(|v| v.to_bits() == POISON.to_bits()));
}
