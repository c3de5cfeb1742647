//! Attention on every ISA against the float64 reference: sequence lengths at
//! the block edges, both causal alignments, grouped-query heads, scores of
//! every magnitude, and several threads.

use super::*;
use crate::kernels::test_data::{pool, uniform};
use compute_core::conformance::{POISON, compare};
use compute_core::{Mask, Op};

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
