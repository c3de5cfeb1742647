//! The ping-pong schedule of the Hopper attention kernel
//! ([`HopperSchedule::PingPong`]): two warpgroups of 64 query rows each take
//! turns issuing their `wgmma`, so one warpgroup's softmax runs while the
//! other's products keep the tensor cores busy (FlashAttention-3's
//! inter-warpgroup overlap), with the weights `P` kept in registers.
//!
//! Per key tile `t`, each warpgroup:
//!
//! 1. waits for its turn (named barrier 2 + its index), issues `S = q·k_tᵀ`
//!    and `O += P_{t−1}·v_{t−1}` (the previous tile's weights, packed in
//!    registers: register-`A` `wgmma`) as one group, and hands the turn to the
//!    other warpgroup (`barrier.arrive` on the other's barrier);
//! 2. waits for the group, runs the online softmax on `S`, rescales `O` and
//!    packs the new weights;
//! 3. waits for its own copies and fences them to the async proxy.
//!
//! The two warpgroups meet once per tile on block-wide barrier 1, at
//! different points of their schedules: warpgroup 0 right after issuing its
//! products, warpgroup 1 before its turn (after its previous softmax). At
//! meeting `t` both have finished tile `t − 1`'s `q·kᵀ` and tile `t − 2`'s
//! `P·v`, and every thread's copies of `k_{t+1}` and `v_t` have landed; after
//! it each thread puts `k_{t+2}` and `v_{t+1}` in flight. Key and value tiles
//! so live three at a time: three stages of each (`q` and six tiles: 224 KiB
//! at `d = 128`, key tiles of 128). Warpgroup 1 arrives once on warpgroup
//! 0's turn barrier before the first tile so warpgroup 0 goes first; after
//! the last tile each issues the last `P·v`.

use compute_core::DType;

use super::attention::issue_tile;
use super::attention_wgmma::{
    HopperConfig, HopperSchedule, ROW, frame, issue_scores, issue_values_reg, keep_weights, online_softmax,
    ping_pong_tiles, q_descriptor, stage_delta, sw128_copies, write_out,
};
use crate::builder::{BuildError, Cmp, Kernel, KernelBuilder, Reg, Target, U32};

/// The block-wide meeting's barrier id (0 is `bar.sync`'s).
const MEET: u32 = 1;
/// Warpgroup `w`'s turn barrier: `TURN + w`.
const TURN: u32 = 2;

/// Builds the ping-pong kernel ([`super::attention_wgmma::hopper`] with
/// [`HopperSchedule::PingPong`]).
pub(super) fn build(cfg: &HopperConfig, dtype: DType, target: Target) -> Result<Kernel, BuildError> {
    debug_assert_eq!(cfg.schedule, HopperSchedule::PingPong);
    let (mut b, f) = frame(cfg, dtype, target)?;
    let (d, bn) = (f.d, f.bn);
    let (bm, threads) = (cfg.rows(), cfg.threads());
    let p = &f.p;
    // Shared layout: q | k stages 0..3 | v stages 0..3.
    let tile = bn * d * 2;
    let k_at = bm * d * 2;
    let v_at = k_at + 3 * tile;
    let k0 = b.add(f.sbase, k_at);
    let v0 = b.add(f.sbase, v_at);

    b.comment("copies: q, k_0, v_0 and k_1 before the first tile, waited for by the whole block");
    let q_cp = sw128_copies(&mut b, threads, f.tid, bm, d);
    let kv_cp = sw128_copies(&mut b, threads, f.tid, bn, d);
    issue_tile(&mut b, &q_cp, (f.qh, d), (f.m0, p.rows), f.sbase);
    let any = b.setp(Cmp::Gt, f.n_blocks, 0u32);
    let skip = b.label("no_first_tile");
    b.bra_unless(any, skip);
    issue_tile(&mut b, &kv_cp, (f.kh, d), (f.zero, p.seq_k), k0);
    issue_tile(&mut b, &kv_cp, (f.vh, d), (f.zero, p.seq_k), v0);
    let two = b.setp(Cmp::Gt, f.n_blocks, 1u32);
    b.bra_unless(two, skip);
    let k1 = b.add(k0, tile);
    let first = b.mov(bn);
    issue_tile(&mut b, &kv_cp, (f.kh, d), (first, p.seq_k), k1);
    b.place(skip);
    b.cp_async_commit();
    b.cp_async_wait(0);
    b.fence_proxy_async_shared();
    b.bar_sync();

    b.comment("descriptors: q (this warpgroup's rows), k and v of stage 0");
    let desc_q = q_descriptor(&mut b, &f, f.sbase);
    let desc_k = b.smem_descriptor(k0, 16, 1024);
    // v read n-contiguous: 64-wide blocks of the head bn*128 bytes apart, 8-key atoms 1024 apart.
    let desc_v = b.smem_descriptor(v0, bn * ROW, 1024);
    let first_wg = b.setp(Cmp::Eq, f.wg, 0u32);
    // Barrier ids as immediates (a register id reserves all 16): each warpgroup takes one of two guarded forms.
    let turn = |b: &mut KernelBuilder, mine: bool, arrive: bool| {
        for (wg1, negated) in [(0, false), (1, true)] {
            let id = if mine { TURN + wg1 } else { TURN + 1 - wg1 };
            b.guarded(first_wg, negated, |b| if arrive { b.barrier_arrive(id, 256) } else { b.barrier_sync(id, 256) });
        }
    };
    // The previous tile's weights, packed for P·v.
    let pw: Vec<[Reg<U32>; 4]> = (0..bn / 16).map(|_| [(); 4].map(|_| b.mov(0u32))).collect();

    b.comment("warpgroup 1 hands warpgroup 0 the first turn");
    let skip = b.label("no_turns");
    b.bra_unless(any, skip);
    b.guarded(first_wg, true, |b| b.barrier_arrive(TURN, 256));
    b.place(skip);

    let kb = f.kb;
    let values = |b: &mut KernelBuilder, tile_no: Reg<U32>| {
        let vs = b.rem(tile_no, 3u32);
        let sd = stage_delta(b, vs, tile);
        let dv = b.add(desc_v, sd);
        issue_values_reg(b, &f, &pw, dv);
    };
    // One key tile; the first (`first`) has no previous P v.
    let body = |b: &mut KernelBuilder, first: bool, masked: bool| {
        b.comment("warpgroup 1 meets warpgroup 0 here, after its previous softmax");
        b.guarded(first_wg, true, |b| b.barrier_sync(MEET, 256));
        turn(b, true, false);
        b.comment("S = q k_t^T and O += P_{t-1} v_{t-1}, one group");
        let ks = b.rem(kb, 3u32);
        let sd = stage_delta(b, ks, tile);
        let dk = b.add(desc_k, sd);
        b.wgmma_fence();
        issue_scores(b, &f, bm, desc_q, dk);
        if !first {
            let prev = b.sub(kb, 1u32);
            values(b, prev);
        }
        b.wgmma_commit();
        turn(b, false, true);
        b.comment("warpgroup 0 meets warpgroup 1 here, its products issued");
        b.guarded(first_wg, false, |b| b.barrier_sync(MEET, 256));

        b.comment("copies of k_{t+2} and v_{t+1} into the stages of k_{t-1} and v_{t-2}");
        let t2 = b.add(kb, 2u32);
        let more_k = b.setp(Cmp::Lt, t2, f.n_blocks);
        let skip_k = b.label("no_key_copy");
        b.bra_unless(more_k, skip_k);
        let st = b.rem(t2, 3u32);
        let off = b.mul(st, tile);
        let at = b.add(k0, off);
        let row = b.mul(t2, bn);
        issue_tile(b, &kv_cp, (f.kh, d), (row, p.seq_k), at);
        b.place(skip_k);
        let t1 = b.add(kb, 1u32);
        let more_v = b.setp(Cmp::Lt, t1, f.n_blocks);
        let skip_v = b.label("no_value_copy");
        b.bra_unless(more_v, skip_v);
        let st = b.rem(t1, 3u32);
        let off = b.mul(st, tile);
        let at = b.add(v0, off);
        let row = b.mul(t1, bn);
        issue_tile(b, &kv_cp, (f.vh, d), (row, p.seq_k), at);
        b.place(skip_v);
        b.cp_async_commit();

        b.wgmma_wait(0);
        let (probs, alphas) = online_softmax(b, &f, masked);
        keep_weights(b, &f, (probs, alphas), &pw);
        b.cp_async_wait(0);
        b.fence_proxy_async_shared();
        let nk = b.add(kb, 1u32);
        b.assign(kb, nk);
    };
    ping_pong_tiles(&mut b, &f, (any, kb), body);

    b.comment("the last tile's P v, in turn");
    let skip = b.label("no_last_tile");
    b.bra_unless(any, skip);
    turn(&mut b, true, false);
    let last = b.sub(f.n_blocks, 1u32);
    b.wgmma_fence();
    values(&mut b, last);
    b.wgmma_commit();
    b.guarded(first_wg, false, |b| b.barrier_arrive(TURN + 1, 256));
    b.wgmma_wait(0);
    b.place(skip);
    write_out(&mut b, &f);
    b.finish()
}
