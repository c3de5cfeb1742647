//! The TMA-fed ping-pong schedule of the Hopper attention kernel
//! ([`HopperSchedule::PingPongTma`]): warp specialisation as in
//! FlashAttention-3. A block of 384 threads has two consumer warpgroups (0
//! and 1, 64 query rows each) and a producer warpgroup (2).
//!
//! - **Producer** (24 registers a thread after `setmaxnreg`): one thread
//!   walks the block's key tiles and, per tile `t`, waits until the
//!   consumers have released stage `t mod 3` of the key ring (`empty`), arms
//!   its `full` barrier with the tile's bytes and issues the TMA copies of
//!   `k_t` (one box of 64 values of the head by the tile's keys per 64
//!   values), then the same for `v_t` in the value ring. The copies write
//!   the 128-byte swizzle `wgmma` reads and zeros past the last key, so the
//!   ragged last tile needs no checks; the maps span the `seq_k` keys of
//!   each (batch, key/value head), `kv_rows` rows apart, so a KV cache's
//!   rows past `seq_k` are never read.
//! - **Consumers** (240 registers a thread): the ping-pong of
//!   [`HopperSchedule::PingPong`] without copies or block-wide meetings: per
//!   key tile `t`, wait for `k_t` (and `v_{t−1}`), wait for the turn (named
//!   barrier 2 + the warpgroup), issue `S = q·k_tᵀ` and `O += P_{t−1}·v_{t−1}`
//!   as one group, hand the turn over, wait for the group, release the two
//!   stages (one arrival per warp), then the softmax, the rescale and the
//!   new weights packed in registers.
//!
//! `q` is copied once by the consumers with `cp.async` before the block's
//! only block-wide barrier, which also publishes the `mbarrier`
//! initialisation. Stage `s`'s barriers complete once per round of the
//! ring; tile `t` waits on parity `(t / 3) mod 2`, and the producer on the
//! opposite parity of `empty` (a fresh barrier's "previous" phase counts as
//! complete, so the first round does not wait).
//!
//! [`HopperSchedule::PingPongTmaOverlap`] commits `S = q·k_tᵀ` and
//! `O += P_{t−1}·v_{t−1}` as two groups and waits for the first only before
//! the softmax, so a warpgroup's softmax also runs under its own `P·v`; the
//! output is rescaled and the new weights packed after the second.

use compute_core::DType;

use super::attention::issue_tile;
use super::attention_wgmma::{
    HopperConfig, HopperSchedule, ROW, frame, issue_scores, issue_values_reg, keep_weights, online_softmax,
    ping_pong_tiles, q_descriptor, stage_delta, sw128_copies, write_out,
};
use crate::builder::{BuildError, Cmp, Dim, Kernel, KernelBuilder, Reg, Target, U32};
use crate::plan::TensorMapDesc;

/// Warpgroup `w`'s turn barrier: `TURN + w` (ids 0 and 1 are left to the block).
const TURN: u32 = 2;
/// Stages of each ring.
const STAGES: u32 = 3;
/// The warps of the consumers, each arriving once per released stage.
const CONSUMER_WARPS: u32 = 8;
/// Registers per thread of the producer and consumer warpgroups after
/// `setmaxnreg` (128·24 + 256·240 ≤ 65536).
const PRODUCER_REGS: u32 = 24;
const CONSUMER_REGS: u32 = 240;
/// Offsets of the barrier arrays from the first: `full` and `empty` of the
/// key ring, then of the value ring, 8 bytes per stage.
const FULL_K: i64 = 0;
const EMPTY_K: i64 = 8 * STAGES as i64;
const FULL_V: i64 = 16 * STAGES as i64;
const EMPTY_V: i64 = 24 * STAGES as i64;

/// The tensor maps of the key and value tensors for the TMA schedule:
/// `batch · heads_kv` heads of `seq_k` rows of `head_dim` values (`dtype`),
/// heads `kv_rows` rows apart (a KV cache's capacity), copied in boxes of
/// 64 values by `cfg.bn` keys. `k` and `v` are the device addresses of the
/// first head. The driver refuses a misaligned address or a row stride that
/// is not a multiple of 16 bytes ([`TensorMapDesc::check`]). Free.
pub fn kv_tensor_maps(
    cfg: &HopperConfig,
    dtype: DType,
    (heads, seq_k, kv_rows): (usize, usize, usize),
    (k, v): (u64, u64),
) -> (TensorMapDesc, TensorMapDesc) {
    let e = dtype.size_in_bytes() as u64;
    let d = u64::from(cfg.head_dim);
    let map = |addr: u64| TensorMapDesc {
        addr,
        dtype,
        rank: 3,
        dims: [d, seq_k as u64, heads as u64],
        strides: [d * e, kv_rows as u64 * d * e],
        boxes: [64, cfg.bn, 1],
    };
    (map(k), map(v))
}

/// Builds the TMA-fed ping-pong kernel ([`super::attention_wgmma::hopper`]
/// with [`HopperSchedule::PingPongTma`]).
pub(super) fn build(cfg: &HopperConfig, dtype: DType, target: Target) -> Result<Kernel, BuildError> {
    debug_assert!(cfg.schedule.uses_tma());
    let overlap = cfg.schedule == HopperSchedule::PingPongTmaOverlap;
    let (mut b, f) = frame(cfg, dtype, target)?;
    b.doc("tensor-map params after the others: kmap, vmap (d x seq_k x heads, boxes of 64 x key tile)");
    let kmap = b.param_tensor_map("kmap");
    let vmap = b.param_tensor_map("vmap");
    let (d, bn) = (f.d, f.bn);
    let bm = cfg.rows();
    let p = &f.p;
    // Shared layout: q | k stages | v stages | barriers.
    let tile = bn * d * 2;
    let k_at = bm * d * 2;
    let v_at = k_at + STAGES * tile;
    let k0 = b.add(f.sbase, k_at);
    let v0 = b.add(f.sbase, v_at);
    let bars = b.add(f.sbase, v_at + STAGES * tile);

    b.comment("thread 0 initialises the barriers: full (the producer's arrival and the bytes), empty (one arrival per consumer warp)");
    let t0 = b.setp(Cmp::Eq, f.tid, 0u32);
    b.guarded(t0, false, |b| {
        for s in 0..STAGES {
            let s8 = i64::from(8 * s);
            for (full, empty) in [(FULL_K, EMPTY_K), (FULL_V, EMPTY_V)] {
                b.mbarrier_init(bars, full + s8, 1);
                b.mbarrier_init(bars, empty + s8, CONSUMER_WARPS);
            }
        }
        b.fence_mbarrier_init();
    });
    b.comment("the consumers copy q; the block meets once, q landed and the barriers initialised");
    let is_producer = b.setp(Cmp::Eq, f.wg, 2u32);
    let q_cp = sw128_copies(&mut b, cfg.consumer_threads(), f.tid, bm, d);
    let no_q = b.label("no_q_copy");
    b.bra_if(is_producer, no_q);
    issue_tile(&mut b, &q_cp, (f.qh, d), (f.m0, p.rows), f.sbase);
    b.place(no_q);
    b.cp_async_commit();
    b.cp_async_wait(0);
    b.fence_proxy_async_shared();
    b.bar_sync();
    let consumer = b.label("consumer");
    let done = b.label("done");
    b.bra_unless(is_producer, consumer);

    // ---------------------------------------------------------------- producer
    b.blank();
    b.comment("producer warpgroup: hands its registers to the consumers; one thread copies");
    b.setmaxnreg(false, PRODUCER_REGS);
    let elected = b.setp(Cmp::Eq, f.tid, 256u32);
    b.bra_unless(elected, done);
    let mk = b.tensor_map_address(&kmap);
    let mv = b.tensor_map_address(&vmap);
    b.prefetch_tensor_map(mk);
    b.prefetch_tensor_map(mv);
    let y = b.ctaid(Dim::Y);
    let ny = b.nctaid(Dim::Y);
    let z = b.ctaid(Dim::Z);
    let head = b.mad(z, ny, y);
    let t = b.mov(0u32);
    let top = b.label("load_tiles");
    b.place(top);
    let end = b.setp(Cmp::Ge, t, f.n_blocks);
    b.bra_if(end, done);
    let stage = b.rem(t, STAGES);
    let round = b.div(t, STAGES);
    let phase = b.and(round, 1u32);
    let released = b.xor(phase, 1u32);
    let bar = b.mad(stage, 8u32, bars);
    let key0 = b.mul(t, bn);
    for (map, ring, full, empty) in [(mk, k0, FULL_K, EMPTY_K), (mv, v0, FULL_V, EMPTY_V)] {
        b.mbarrier_wait(bar, empty, released);
        b.mbarrier_arrive_expect_tx(bar, full, tile);
        let dst = b.mad(stage, tile, ring);
        for j in 0..d / 64 {
            let col = b.mov(j * 64);
            b.tma_load((dst, i64::from(j * bn * ROW)), map, &[col, key0, head], (bar, full));
        }
    }
    let next = b.add(t, 1u32);
    b.assign(t, next);
    b.bra(top);

    // ---------------------------------------------------------------- consumers
    b.place(consumer);
    b.blank();
    b.comment("consumer warpgroups 0 and 1: rows 0-63 and 64-127 of the block");
    b.setmaxnreg(true, CONSUMER_REGS);
    let lane = b.and(f.tid, 31u32);
    let is_lane0 = b.setp(Cmp::Eq, lane, 0u32);
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
    let any = b.setp(Cmp::Gt, f.n_blocks, 0u32);

    b.comment("warpgroup 1 hands warpgroup 0 the first turn");
    let skip = b.label("no_turns");
    b.bra_unless(any, skip);
    b.guarded(first_wg, true, |b| b.barrier_arrive(TURN, 256));
    b.place(skip);

    // Tile `t`'s stage barrier address and round parity.
    let slot = |b: &mut KernelBuilder, t: Reg<U32>| {
        let s = b.rem(t, STAGES);
        let r = b.div(t, STAGES);
        (s, b.mad(s, 8u32, bars), b.and(r, 1u32))
    };
    let kb = f.kb;
    let values = |b: &mut KernelBuilder, vs: Reg<U32>| {
        let sd = stage_delta(b, vs, tile);
        let dv = b.add(desc_v, sd);
        issue_values_reg(b, &f, &pw, dv);
    };
    // One key tile; the first (`first`) has no previous P v.
    let body = |b: &mut KernelBuilder, first: bool, masked: bool| {
        b.comment("wait for k_t (and v_{t-1}), then for the turn");
        let (ks, kbar, kph) = slot(b, kb);
        b.mbarrier_wait(kbar, FULL_K, kph);
        let prev = if first {
            None
        } else {
            let t1 = b.sub(kb, 1u32);
            let (vs, vbar, vph) = slot(b, t1);
            b.mbarrier_wait(vbar, FULL_V, vph);
            Some((vs, vbar))
        };
        turn(b, true, false);
        b.comment("S = q k_t^T and O += P_{t-1} v_{t-1}, one group");
        let sd = stage_delta(b, ks, tile);
        let dk = b.add(desc_k, sd);
        b.wgmma_fence();
        issue_scores(b, &f, bm, desc_q, dk);
        if overlap && prev.is_some() {
            b.wgmma_commit();
        }
        if let Some((vs, _)) = prev {
            values(b, vs);
        }
        b.wgmma_commit();
        turn(b, false, true);
        let release = |b: &mut KernelBuilder, off: i64, bar: Reg<U32>| {
            b.guarded(is_lane0, false, |b| b.mbarrier_arrive(bar, off));
        };
        let softmax = match prev {
            Some((_, vbar)) if overlap => {
                b.comment("S is done (P v may still run): release k_t, softmax, then wait for P v and release v_{t-1}");
                b.wgmma_wait(1);
                release(b, EMPTY_K, kbar);
                let (probs, alphas) = online_softmax(b, &f, masked);
                b.wgmma_wait(0);
                release(b, EMPTY_V, vbar);
                (probs, alphas)
            }
            _ => {
                b.wgmma_wait(0);
                b.comment("k_t and v_{t-1} are read: release their stages");
                release(b, EMPTY_K, kbar);
                if let Some((_, vbar)) = prev {
                    release(b, EMPTY_V, vbar);
                }
                online_softmax(b, &f, masked)
            }
        };
        keep_weights(b, &f, softmax, &pw);
        let nk = b.add(kb, 1u32);
        b.assign(kb, nk);
    };
    ping_pong_tiles(&mut b, &f, (any, kb), body);

    b.comment("the last tile's P v, in turn");
    let skip = b.label("no_last_tile");
    b.bra_unless(any, skip);
    let last = b.sub(f.n_blocks, 1u32);
    let (vs, vbar, vph) = slot(&mut b, last);
    b.mbarrier_wait(vbar, FULL_V, vph);
    turn(&mut b, true, false);
    b.wgmma_fence();
    values(&mut b, vs);
    b.wgmma_commit();
    b.guarded(first_wg, false, |b| b.barrier_arrive(TURN + 1, 256));
    b.wgmma_wait(0);
    b.place(skip);
    write_out(&mut b, &f);
    b.place(done);
    b.ret();
    b.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_for_sm90a_with_a_producer_warpgroup() {
        for (d, bn, schedule) in [64u32, 128].into_iter().flat_map(|d| {
            [
                (64, HopperSchedule::PingPongTma),
                (128, HopperSchedule::PingPongTma),
                (128, HopperSchedule::PingPongTmaOverlap),
            ]
            .map(|(bn, s)| (d, bn, s))
        }) {
            {
                let cfg = HopperConfig { head_dim: d, warpgroups: 2, bn, schedule };
                assert!(cfg.check().is_ok(), "{cfg:?}");
                assert_eq!(cfg.threads(), 384);
                for dtype in [DType::BF16, DType::F16] {
                    let k = super::super::attention_wgmma::hopper(&cfg, dtype, Target::Sm90a).expect("builds");
                    let t = k.ptx();
                    assert!(t.contains("_kmap[128]"), "{t}");
                    assert!(t.contains("setmaxnreg.dec.sync.aligned.u32 24;"));
                    assert!(t.contains("setmaxnreg.inc.sync.aligned.u32 240;"));
                    // One TMA box per 64 values of the head, for k and for v.
                    assert_eq!(t.matches("cp.async.bulk.tensor.3d").count() as u32, 2 * d / 64);
                    // The consumers' only copies are q's, in one group.
                    assert_eq!(t.matches("cp.async.commit_group").count(), 1);
                    let overlapped = schedule == HopperSchedule::PingPongTmaOverlap;
                    assert_eq!(t.contains("wgmma.wait_group.sync.aligned 1;"), overlapped);
                    assert!(super::super::attention_wgmma::hopper(&cfg, dtype, Target::Sm90).is_err());
                }
            }
        }
        let one = HopperConfig { head_dim: 128, warpgroups: 1, bn: 128, schedule: HopperSchedule::PingPongTma };
        assert!(one.check().is_err());
    }

    #[test]
    fn kv_maps_step_heads_by_the_cache_capacity() {
        let cfg = HopperConfig { head_dim: 128, warpgroups: 2, bn: 128, schedule: HopperSchedule::PingPongTma };
        let (k, v) = kv_tensor_maps(&cfg, DType::BF16, (6, 70, 96), (4096, 8192));
        assert_eq!((k.dims, k.strides, k.boxes), ([128, 70, 6], [256, 96 * 256], [64, 128, 1]));
        assert_eq!((v.addr, v.dims), (8192, k.dims));
        assert!(k.check().is_ok() && v.check().is_ok());
        let (k, _) = kv_tensor_maps(&cfg, DType::BF16, (1, 64, 64), (4100, 0));
        assert!(k.check().is_err(), "a misaligned key tensor is refused");
    }
}
