//! Fused attention on Hopper's warpgroup tensor cores (`sm_90a`): both
//! products as `wgmma.mma_async` reading their operands from shared memory.
//!
//! A block of `warpgroups` warpgroups takes `64·warpgroups` query rows of one
//! (batch, key/value head), rows as in [`super::attention`] (the query heads
//! of a group are consecutive). Every tile lives in shared memory in the
//! 128-byte swizzle `wgmma` reads: blocks of 64 values of the head (128
//! bytes) by the tile's rows, row `r`'s 16-byte chunks XORed with `r mod 8`.
//! `q` and the key tiles are read `k`-contiguous (`k` = the head); the value
//! tiles have the same bytes and are read `n`-contiguous (their rows are the
//! `k` of `P·v`, 8-row atoms 1024 bytes apart, 64-wide blocks of the head
//! `bn·128` apart). Per key tile of `bn`:
//!
//! 1. wait for the tile's `cp.async` copies, fence them to the async proxy,
//!    one barrier, and put the next tile's copies in flight (two stages);
//! 2. `S = q·kᵀ`: `head/16` `wgmma m64n{bn}k16` per warpgroup, waited for;
//! 3. the online softmax on the accumulators (each row in a quad of lanes, as
//!    with `mma.sync`), the output accumulator rescaled;
//! 4. the weights, rounded to the input dtype, written to the warpgroup's
//!    `P` tile in shared memory (same swizzle), fenced, one barrier;
//! 5. `O += P·v`: `bn/16` `wgmma m64n{head}k16`, waited for.
//!
//! The masks, the visible-key rule and the skipped tiles are those of the
//! `mma.sync` kernel. Rows that see no key write zeros.

use compute_core::DType;

use super::attention::{
    Copy16, PARAM_DOC, Params, TileCopies, b_sub1, block_key_tiles, block_rows, gcd, head_offsets, inverse_or_zero,
    issue_tile, key_tile_loops, params, rescale, visible,
};
use super::gemm_common::store_pair;
use crate::builder::{BuildError, Cmp, Dim, F32, Half, Kernel, KernelBuilder, Pred, Reg, Target, U32, U64, WgmmaInput};

/// Bytes of one swizzled row: 64 halves.
pub(super) const ROW: u32 = 128;

/// How a Hopper attention kernel passes the weights `P` to `P·v` and orders
/// its warpgroups.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HopperSchedule {
    /// `P` through a shared-memory tile per warpgroup; per key tile `S =
    /// q·kᵀ`, the softmax and `O += P·v` in order, the warpgroups in step on
    /// two block-wide barriers (one for the key and value tiles, one for `P`).
    SharedP,
    /// [`HopperSchedule::SharedP`] with each tile's `P·v` run one tile late,
    /// behind the next tile's `q·kᵀ` and softmax.
    SharedPLate,
    /// `P` kept in registers: the `S` accumulator rounded and packed in pairs
    /// is the `A` operand of the register-`A` `wgmma` of `P·v`, so there is
    /// no `P` tile, store, fence or second barrier; the warpgroups in step on
    /// one block-wide barrier per key tile.
    RegisterP,
    /// `P` in registers, each tile's `P·v` issued with the next tile's
    /// `q·kᵀ`, and two warpgroups taking turns on named barriers: one issues
    /// its products while the other runs its softmax, so the tensor cores are
    /// busy during the softmax. The warpgroups meet once per key tile (a
    /// block-wide named barrier reached half a period apart in their
    /// schedules), with three stages of key and value tiles so that the
    /// copies issued after a meeting land before the next. Two warpgroups only.
    PingPong,
    /// [`HopperSchedule::PingPong`] fed by the tensor memory accelerator: a
    /// third (producer) warpgroup copies the key and value tiles with TMA
    /// into rings of three stages tracked by `mbarrier`s, so the two
    /// consumer warpgroups issue no copies and never meet on a block-wide
    /// barrier; `setmaxnreg` moves the producer's registers to them. Needs a
    /// launcher that encodes tensor maps ([`crate::plan::Launcher::has_tma`]);
    /// the plans run [`HopperSchedule::PingPong`] instead where it has none,
    /// or where the key count comes from positions on the device. Two
    /// consumer warpgroups only.
    PingPongTma,
    /// [`HopperSchedule::PingPongTma`] with each warpgroup's softmax also
    /// overlapping its own `P·v`: `S = q·kᵀ` and the previous tile's `P·v`
    /// are committed as two groups, the softmax waits for the first only,
    /// and the output is rescaled once the second is done
    /// (FlashAttention-3's intra-warpgroup overlap).
    PingPongTmaOverlap,
}

impl HopperSchedule {
    /// Whether `P` stays in registers (no shared `P` tile).
    pub fn p_in_registers(self) -> bool {
        matches!(
            self,
            HopperSchedule::RegisterP
                | HopperSchedule::PingPong
                | HopperSchedule::PingPongTma
                | HopperSchedule::PingPongTmaOverlap
        )
    }

    /// Whether the key and value tiles arrive by TMA (tensor-map parameters,
    /// a producer warpgroup).
    pub fn uses_tma(self) -> bool {
        matches!(self, HopperSchedule::PingPongTma | HopperSchedule::PingPongTmaOverlap)
    }

    /// Whether two computing warpgroups take turns on named barriers.
    fn ping_pong(self) -> bool {
        matches!(self, HopperSchedule::PingPong) || self.uses_tma()
    }

    /// Stages of key and value tiles in shared memory.
    pub fn stages(self) -> u32 {
        if self.ping_pong() { 3 } else { 2 }
    }

    /// The kernel name's suffix for a shape other than the default.
    fn suffix(self) -> &'static str {
        match self {
            HopperSchedule::SharedP => "_smem",
            HopperSchedule::SharedPLate => "_smem_late",
            HopperSchedule::RegisterP => "_regp",
            HopperSchedule::PingPong => "_pp",
            HopperSchedule::PingPongTma => "_pptma",
            HopperSchedule::PingPongTmaOverlap => "_pptma_ov",
        }
    }
}

/// Shape of the Hopper attention kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HopperConfig {
    /// Head size: 64 or 128.
    pub head_dim: u32,
    /// Warpgroups per block, each 64 query rows.
    pub warpgroups: u32,
    /// Keys per tile (64 or 128): the `N` of `S = q·kᵀ`.
    pub bn: u32,
    /// How `P` reaches `P·v` and how the warpgroups are ordered.
    pub schedule: HopperSchedule,
}

impl HopperConfig {
    /// The shape the backend launches on compute capability 9.0: at head
    /// size 128 two warpgroups (128 query rows), key tiles of 128,
    /// ping-pong fed by TMA (the plans run the `cp.async` ping-pong of the
    /// same tiles where TMA cannot be used); at 64 one warpgroup with `P` in
    /// registers, key tiles of 128 (80 KiB of shared memory, so two blocks
    /// share a multiprocessor and one's softmax runs under the other's
    /// products). Measured on the H100 (2026-11-26, bf16;
    /// docs/benchmarks.md): the fastest of the sweep at both sizes.
    pub fn for_head_dim(d: usize) -> HopperConfig {
        if d == 64 {
            HopperConfig { head_dim: 64, warpgroups: 1, bn: 128, schedule: HopperSchedule::RegisterP }
        } else {
            HopperConfig { head_dim: d as u32, warpgroups: 2, bn: 128, schedule: HopperSchedule::PingPongTma }
        }
    }

    /// The shape the plans launch instead of this one where TMA cannot be
    /// used: the `cp.async` ping-pong of the same tiles for a TMA schedule,
    /// else this shape.
    pub fn without_tma(&self) -> HopperConfig {
        if self.schedule.uses_tma() { HopperConfig { schedule: HopperSchedule::PingPong, ..*self } } else { *self }
    }

    /// Whether the kernel takes head size `d`.
    pub fn fits(d: usize) -> bool {
        d == 64 || d == 128
    }

    /// Whether the backend runs it (rather than the `mma.sync` kernel) for
    /// head size `d` on compute capability 9.0: at 64 and 128. On the H100
    /// (2026-11-26, bf16) the defaults ran b4 h32 s4096 d128 at 441
    /// TFLOP/s full and 400 causal against 324 and 295 for the `mma.sync`
    /// kernel; b16 h16 s1024 d64 at 320 and 245 against 274 and 207.
    pub fn preferred(d: usize) -> bool {
        Self::fits(d)
    }

    /// Query rows per block.
    pub fn rows(&self) -> u32 {
        64 * self.warpgroups
    }

    /// Threads per block: the computing warpgroups, and the producer
    /// warpgroup of a TMA schedule.
    pub fn threads(&self) -> u32 {
        self.consumer_threads() + if self.schedule.uses_tma() { 128 } else { 0 }
    }

    /// Threads of the warpgroups that compute (64 query rows each).
    pub fn consumer_threads(&self) -> u32 {
        128 * self.warpgroups
    }

    /// Dynamic shared memory: `q`, the stages of key and value tiles, a `P`
    /// tile per warpgroup when `P` goes through shared memory, the stages'
    /// `mbarrier`s of a TMA schedule (four of 8 bytes per stage), and 1 KiB
    /// to align the tiles to 1024 bytes.
    pub fn shared_bytes(&self) -> u32 {
        let d2 = self.head_dim * 2;
        let p = if self.schedule.p_in_registers() { 0 } else { self.warpgroups * 64 * self.bn * 2 };
        let bars = if self.schedule.uses_tma() { 32 * self.schedule.stages() } else { 0 };
        self.rows() * d2 + 2 * self.schedule.stages() * self.bn * d2 + p + bars + 1024
    }

    /// Why this shape cannot be built, if it cannot.
    pub fn check(&self) -> Result<(), String> {
        if !Self::fits(self.head_dim as usize) {
            return Err(format!("head size {}: need 64 or 128", self.head_dim));
        }
        if !(1..=3).contains(&self.warpgroups) {
            return Err(format!("{} warpgroups: need 1..=3", self.warpgroups));
        }
        if self.schedule.ping_pong() && self.warpgroups != 2 {
            return Err(format!("ping-pong takes two warpgroups, not {}", self.warpgroups));
        }
        if !matches!(self.bn, 64 | 128) {
            return Err(format!("key tile {}: need 64 or 128", self.bn));
        }
        let (t, cpr) = (self.consumer_threads(), self.head_dim / 8);
        if !t.is_multiple_of(cpr) || !(self.bn * cpr).is_multiple_of(t) || !(self.rows() * cpr).is_multiple_of(t) {
            return Err(format!("{t} threads do not split {}-row and {}-row tiles into copies", self.rows(), self.bn));
        }
        if self.shared_bytes() > 227 * 1024 {
            return Err(format!("{} bytes of shared memory", self.shared_bytes()));
        }
        Ok(())
    }

    /// Kernel name: `attention_wgmma_bf16_d128` for the default shape, the
    /// shape and schedule spelled out for others.
    pub fn kernel_name(&self, dtype: DType) -> String {
        let base = format!("attention_wgmma_{dtype}_d{}", self.head_dim);
        if *self == Self::for_head_dim(self.head_dim as usize) {
            base
        } else {
            format!("{base}_wg{}_n{}{}", self.warpgroups, self.bn, self.schedule.suffix())
        }
    }

    /// Other shapes for the benchmark's sweep: every schedule at two
    /// warpgroups and key tiles of 128 (the shared-`P` one timed as the
    /// baseline), key tiles of 64, and one warpgroup with `P` in registers.
    pub fn sweep(d: usize) -> Vec<HopperConfig> {
        use HopperSchedule::{PingPong, PingPongTma, PingPongTmaOverlap, RegisterP, SharedP, SharedPLate};
        let base = Self::for_head_dim(d);
        [
            (2, 128, SharedP),
            (2, 128, SharedPLate),
            (2, 128, RegisterP),
            (2, 128, PingPong),
            (2, 128, PingPongTma),
            (2, 128, PingPongTmaOverlap),
            (2, 64, PingPong),
            (2, 64, PingPongTma),
            (2, 64, RegisterP),
            (1, 128, RegisterP),
            (1, 64, RegisterP),
        ]
        .into_iter()
        .map(|(warpgroups, bn, schedule)| HopperConfig { warpgroups, bn, schedule, ..base })
        .filter(|c| c.check().is_ok() && *c != base)
        .collect()
    }
}

/// One thread's copies of a tile of `rows` rows of `d` halves into the
/// 128-byte swizzle: chunk `c` of row `r` at `(c/8)·rows·128 + r·128 +
/// ((c mod 8) ⊕ (r mod 8))·16`.
pub(super) fn sw128_copies(b: &mut KernelBuilder, threads: u32, tid: Reg<U32>, rows: u32, d: u32) -> TileCopies {
    let cpr = d / 8;
    let n = rows * cpr / threads;
    let step = threads / cpr;
    let r0 = b.div(tid, cpr);
    let c = b.rem(tid, cpr);
    let c8 = b.shl(c, 3u32);
    let block = b.shr(c, 3u32);
    let block_off = b.mul(block, rows * ROW);
    let cin = b.and(c, 7u32);
    let period = 8 / gcd(step, 8);
    let mut regs = Vec::new();
    for i in 0..n.min(period) {
        let r = b.add(r0, i * step);
        let r8 = b.and(r, 7u32);
        let pc = b.xor(cin, r8);
        let pc16 = b.shl(pc, 4u32);
        let at = b.mad(r, ROW, pc16);
        regs.push(b.add(at, block_off));
    }
    let copies = (0..n)
        .map(|i| {
            let base = i - i % period;
            Copy16 { row: (r0, i * step), chunk8: c8, dst: (regs[(i % period) as usize], base * step * ROW) }
        })
        .collect();
    TileCopies { copies, one_row: true }
}

/// Registers and offsets every schedule shares: the parameters, this
/// thread's place in the block, the block's rows and key tiles, the running
/// softmax state and the accumulators.
pub(super) struct Frame {
    pub(super) p: Params,
    pub(super) half: Half,
    pub(super) d: u32,
    pub(super) bn: u32,
    /// Aligned base of the dynamic shared memory.
    pub(super) sbase: Reg<U32>,
    pub(super) tid: Reg<U32>,
    /// This thread's warpgroup.
    pub(super) wg: Reg<U32>,
    /// First query row of the block.
    pub(super) m0: Reg<U32>,
    /// This lane's first row (its second is 8 further).
    pub(super) row0: Reg<U32>,
    /// Keys each of this lane's two rows sees.
    pub(super) vis_rows: [Reg<U32>; 2],
    /// Column pair of this lane within 8 (`2·(lane mod 4)`).
    pub(super) cols0: Reg<U32>,
    pub(super) qh: Reg<U64>,
    pub(super) oh: Reg<U64>,
    pub(super) kh: Reg<U64>,
    pub(super) vh: Reg<U64>,
    /// Key tiles seen in full by every row of the block, and in all.
    pub(super) n_full: Reg<U32>,
    pub(super) n_blocks: Reg<U32>,
    pub(super) zero: Reg<U32>,
    /// Constant-true and constant-false predicates (`wgmma`'s `scale-d`).
    pub(super) always: Reg<Pred>,
    pub(super) never: Reg<Pred>,
    pub(super) m_run: [Reg<F32>; 2],
    pub(super) l_run: [Reg<F32>; 2],
    pub(super) o_acc: Vec<Reg<F32>>,
    pub(super) s_acc: Vec<Reg<F32>>,
    /// The key tile in hand.
    pub(super) kb: Reg<U32>,
}

/// The kernel's name, docs and parameters, and the [`Frame`]; errors for a
/// shape, dtype or target it cannot build.
pub(super) fn frame(cfg: &HopperConfig, dtype: DType, target: Target) -> Result<(KernelBuilder, Frame), BuildError> {
    let name = cfg.kernel_name(dtype);
    let fail = |p: String| Err(BuildError { kernel: name.clone(), problems: vec![p] });
    if let Err(e) = cfg.check() {
        return fail(e);
    }
    if target != Target::Sm90a {
        return fail(format!("wgmma kernels are built for sm_90a, not {target}"));
    }
    let half = match dtype {
        DType::F16 => Half::F16,
        DType::BF16 => Half::Bf16,
        other => return fail(format!("Hopper attention reads f16 or bf16, not {other}")),
    };
    let HopperConfig { head_dim: d, bn, schedule, .. } = *cfg;
    let (bm, threads) = (cfg.rows(), cfg.threads());
    let mut b = KernelBuilder::new(&name, target);
    b.doc(&format!("{name}: fused attention, {dtype} q/k/v/o, f32 softmax and accumulation, wgmma.mma_async"));
    b.doc(&format!(
        "{bm} query rows per block ({} warpgroups of 64), key tiles of {bn}, {} {} stages, 128-byte swizzle, schedule {schedule:?}",
        cfg.warpgroups,
        schedule.stages(),
        if schedule.uses_tma() { "TMA" } else { "cp.async" }
    ));
    b.doc(PARAM_DOC);
    b.doc(&format!(
        "launch: {threads} threads, grid (ceil(rows/{bm}), heads_kv, batch), {} bytes of dynamic shared memory",
        cfg.shared_bytes()
    ));
    b.max_threads(threads);
    b.min_blocks_per_sm(1);
    let p = params(&mut b);
    let smem = b.dynamic_shared("tiles", 1024);
    let raw = b.shared_base(&smem);
    let up = b.add(raw, 1023u32);
    let sbase = b.and(up, !1023u32);
    let tid = b.tid(Dim::X);
    let lane = b.and(tid, 31u32);
    let warp = b.shr(tid, 5u32);
    let wg = b.shr(tid, 7u32);
    let g = b.shr(lane, 2u32);
    let t4 = b.and(lane, 3u32);

    let m0 = block_rows(&mut b, bm);
    let z = b.ctaid(Dim::Z);
    let (qo, kvo) = head_offsets(&mut b, &p, d, 2, z);
    let qh = b.add(p.q, qo);
    let oh = b.add(p.o, qo);
    let kh = b.add(p.k, kvo);
    let vh = b.add(p.v, kvo);
    let (n_full, n_blocks) = block_key_tiles(&mut b, &p, (m0, bm), bn);

    b.comment("this lane's rows (warp w%4 of warpgroup w/4: rows 16w + g and 16w + g + 8) and their visible keys");
    let row0 = b.mad(warp, 16u32, g);
    let row0 = b.add(m0, row0);
    let vis_rows = [0u32, 1].map(|h| {
        let r = b.add(row0, h * 8);
        let pos = b.rem(r, p.seq_q);
        visible(&mut b, &p, pos)
    });
    let zero = b.mov(0u32);
    let always = b.setp(Cmp::Eq, zero, 0u32);
    let never = b.setp(Cmp::Ne, zero, 0u32);
    let neg_inf = f32::NEG_INFINITY;
    let m_run = [(); 2].map(|_| b.mov(neg_inf));
    let l_run = [(); 2].map(|_| b.mov(0.0f32));
    let o_acc: Vec<Reg<F32>> = (0..d / 2).map(|_| b.mov(0.0f32)).collect();
    let s_acc: Vec<Reg<F32>> = (0..bn / 2).map(|_| b.mov(0.0f32)).collect();
    let kb = b.mov(0u32);
    let cols0 = b.shl(t4, 1u32);
    let f = Frame {
        p,
        half,
        d,
        bn,
        sbase,
        tid,
        wg,
        m0,
        row0,
        vis_rows,
        cols0,
        qh,
        oh,
        kh,
        vh,
        n_full,
        n_blocks,
        zero,
        always,
        never,
        m_run,
        l_run,
        o_acc,
        s_acc,
        kb,
    };
    Ok((b, f))
}

/// The descriptor of this warpgroup's 64 rows of `q` at `q_at` (a block of
/// `bm` rows).
pub(super) fn q_descriptor(b: &mut KernelBuilder, f: &Frame, q_at: Reg<U32>) -> Reg<U64> {
    let q_rows = b.mul(f.wg, 64 * ROW);
    let q_addr = b.add(q_at, q_rows);
    b.smem_descriptor(q_addr, 16, 1024)
}

/// `stage · bytes` as a descriptor increment (`>> 4`, 64-bit).
pub(super) fn stage_delta(b: &mut KernelBuilder, stage: Reg<U32>, bytes: u32) -> Reg<U64> {
    let off = b.mul(stage, bytes);
    let off16 = b.shr(off, 4u32);
    b.cvt::<U64, U32>(off16)
}

/// Issues `S = q·kᵀ` on the warpgroup (`head/16` `wgmma m64n{bn}k16`, the
/// first overwriting `S`), for `q` described by `desc_q` (`bm` rows) and the
/// key tile by `desc_k`; no fence, commit or wait.
pub(super) fn issue_scores(b: &mut KernelBuilder, f: &Frame, bm: u32, desc_q: Reg<U64>, desc_k: Reg<U64>) {
    for ks in 0..f.d / 16 {
        let (blk, within) = (ks / 4, (ks % 4) * 32);
        let dq = b.add(desc_q, u64::from((blk * bm * ROW + within) >> 4));
        let dk = b.add(desc_k, u64::from((blk * f.bn * ROW + within) >> 4));
        b.wgmma_mma_async(
            WgmmaInput::Half(f.half),
            &f.s_acc,
            (dq, dk),
            if ks == 0 { f.never } else { f.always },
            (false, false),
        );
    }
}

/// Issues `O += P·v` with `P` in registers (`pw`: per 16 keys, the four
/// packed words of [`pack_weights`]) and the value tile described by
/// `desc_v` (read `n`-contiguous); no fence, commit or wait.
pub(super) fn issue_values_reg(b: &mut KernelBuilder, f: &Frame, pw: &[[Reg<U32>; 4]], desc_v: Reg<U64>) {
    for (kk, &a) in pw.iter().enumerate() {
        let dv = b.add(desc_v, ((kk as u64) * 2 * 1024) >> 4);
        b.wgmma_mma_async_reg_a(WgmmaInput::Half(f.half), &f.o_acc, a, dv, f.always, true);
    }
}

/// The online-softmax step on the tile's scores in `S` (each row in a quad
/// of lanes): returns the weights (`f32`, `S`'s layout) and each row's factor
/// on the old accumulator; updates the running maximum and sum. With
/// `masked`, keys past each row's visible count get −∞.
pub(super) fn online_softmax(b: &mut KernelBuilder, f: &Frame, masked: bool) -> (Vec<Reg<F32>>, [Reg<F32>; 2]) {
    let neg_inf = f32::NEG_INFINITY;
    let bn = f.bn;
    b.comment(if masked { "online softmax, keys past each row's limit masked" } else { "online softmax" });
    let key0 = b.mul(f.kb, bn);
    let key0 = b.add(key0, f.cols0);
    let xs: Vec<Reg<F32>> = (0..bn / 2)
        .map(|i| {
            let x = b.mul(f.s_acc[i as usize], f.p.scale_log2);
            if !masked {
                return x;
            }
            let (j, e) = (i / 4, i % 4);
            let col = b.add(key0, j * 8 + e % 2);
            let ok = b.setp(Cmp::Lt, col, f.vis_rows[(e / 2) as usize]);
            b.selp(x, neg_inf, ok)
        })
        .collect();
    let mut probs = xs.clone();
    let mut alphas = Vec::with_capacity(2);
    for h in 0..2usize {
        let mut mx = xs[2 * h];
        for j in 0..(bn / 8) as usize {
            mx = b.max(mx, xs[4 * j + 2 * h]);
            mx = b.max(mx, xs[4 * j + 2 * h + 1]);
        }
        for sh in [1u32, 2] {
            let o = b.shfl_bfly(mx, sh);
            mx = b.max(mx, o);
        }
        let (m_use, alpha) = rescale(b, f.m_run[h], mx);
        let mut sum = b.mov(0.0f32);
        for j in 0..(bn / 8) as usize {
            for e in [4 * j + 2 * h, 4 * j + 2 * h + 1] {
                let dlt = b.sub(xs[e], m_use);
                let pv = b.ex2_approx(dlt);
                probs[e] = pv;
                sum = b.add(sum, pv);
            }
        }
        let l2 = b.fma(f.l_run[h], alpha, sum);
        b.assign(f.l_run[h], l2);
        alphas.push(alpha);
    }
    (probs, [alphas[0], alphas[1]])
}

/// `O *= alpha` row by row (the accumulator under the new maximum).
pub(super) fn rescale_acc(b: &mut KernelBuilder, f: &Frame, alphas: [Reg<F32>; 2]) {
    for (h, &alpha) in alphas.iter().enumerate() {
        for j in 0..(f.d / 8) as usize {
            for e in [4 * j + 2 * h, 4 * j + 2 * h + 1] {
                let a2 = b.mul(f.o_acc[e], alpha);
                b.assign(f.o_acc[e], a2);
            }
        }
    }
}

/// The weights rounded to the input dtype and packed in pairs, per 16 keys
/// the four words of a register-`A` `wgmma` operand: the accumulator's
/// registers `8k..8k+8` are rows `g` and `g + 8` at keys `16k + 2t` (+1)
/// and `16k + 8 + 2t` (+1), which is the `A` fragment's order.
pub(super) fn pack_weights(b: &mut KernelBuilder, f: &Frame, probs: &[Reg<F32>]) -> Vec<[Reg<U32>; 4]> {
    probs.chunks(8).map(|c| [0, 1, 2, 3].map(|w| b.f32_pair_to_half(c[2 * w], c[2 * w + 1], f.half))).collect()
}

/// After a tile's online softmax (`probs`, `alphas`): rescales the output
/// accumulators and keeps the tile's weights, rounded and packed as the
/// register-`A` operand of its `P·v` ([`pack_weights`]), in `pw`.
pub(super) fn keep_weights(
    b: &mut KernelBuilder,
    f: &Frame,
    (probs, alphas): (Vec<Reg<F32>>, [Reg<F32>; 2]),
    pw: &[[Reg<U32>; 4]],
) {
    rescale_acc(b, f, alphas);
    let packed = pack_weights(b, f, &probs);
    for (dst, src) in pw.iter().zip(&packed) {
        for (&dr, &sr) in dst.iter().zip(src) {
            b.assign(dr, sr);
        }
    }
}

/// The key-tile walk of the ping-pong schedules: when the block has any key
/// tile (`any`), the first one (`body(b, true, masked)`, masked unless some
/// tile is full), then the rest through [`key_tile_loops`] over the tile
/// counter `kb` (`body(b, false, masked)`).
pub(super) fn ping_pong_tiles(
    b: &mut KernelBuilder,
    f: &Frame,
    (any, kb): (Reg<Pred>, Reg<U32>),
    body: impl Fn(&mut KernelBuilder, bool, bool),
) {
    b.comment("the first tile (no previous P v), masked unless every row sees all its keys");
    let skip = b.label("no_tiles");
    b.bra_unless(any, skip);
    let some_full = b.setp(Cmp::Gt, f.n_full, 0u32);
    let masked_first = b.label("masked_first_tile");
    let first_done = b.label("first_tile_done");
    b.bra_unless(some_full, masked_first);
    body(b, true, false);
    b.bra(first_done);
    b.place(masked_first);
    body(b, true, true);
    b.place(first_done);
    b.place(skip);
    key_tile_loops(b, kb, (f.n_full, f.n_blocks), |b, masked| body(b, false, masked));
}

/// The epilogue: `out = O / l`, rounded pairs, rows past the end skipped;
/// rows that saw no key write zeros.
pub(super) fn write_out(b: &mut KernelBuilder, f: &Frame) {
    b.blank();
    b.comment("epilogue: out = acc / l, rounded pairs");
    for h in 0..2u32 {
        let mut l = f.l_run[h as usize];
        for sh in [1u32, 2] {
            let o = b.shfl_bfly(l, sh);
            l = b.add(l, o);
        }
        let inv = inverse_or_zero(b, l);
        let r = b.add(f.row0, h * 8);
        let ok = b.setp(Cmp::Lt, r, f.p.rows);
        let elem = b.mad(r, f.d, f.cols0);
        let off = b.mul_wide(elem, 2u32);
        let at = b.add(f.oh, off);
        for j in 0..f.d / 8 {
            let lo = b.mul(f.o_acc[(4 * j + 2 * h) as usize], inv);
            let hi = b.mul(f.o_acc[(4 * j + 2 * h + 1) as usize], inv);
            store_pair(b, Some(f.half), (at, i64::from(j * 16)), (lo, hi), ok);
        }
    }
    b.ret();
}

/// Builds the Hopper attention kernel for `f16` or `bf16` data. Params: those
/// of [`super::attention::flash`], and for a TMA schedule two tensor maps
/// after them, `kmap` and `vmap`
/// ([`super::attention_tma::kv_tensor_maps`]). Launch: [`HopperConfig::threads`] threads,
/// grid `(ceil(rows / cfg.rows()), heads_kv, batch)`,
/// [`HopperConfig::shared_bytes`] of dynamic shared memory; `sm_90a` only.
pub fn hopper(cfg: &HopperConfig, dtype: DType, target: Target) -> Result<Kernel, BuildError> {
    match cfg.schedule {
        HopperSchedule::PingPong => return super::attention_pingpong::build(cfg, dtype, target),
        HopperSchedule::PingPongTma | HopperSchedule::PingPongTmaOverlap => {
            return super::attention_tma::build(cfg, dtype, target);
        }
        _ => {}
    }
    let (mut b, f) = frame(cfg, dtype, target)?;
    let mma_in = WgmmaInput::Half(f.half);
    let (d, bn) = (f.d, f.bn);
    let overlap = cfg.schedule == HopperSchedule::SharedPLate;
    let reg_p = cfg.schedule.p_in_registers();
    let (bm, threads) = (cfg.rows(), cfg.threads());
    let p = &f.p;
    // Shared layout: q | stage 0 (k, v) | stage 1 (k, v) | P per warpgroup (shared-P schedules).
    let q_bytes = bm * d * 2;
    let tile = bn * d * 2;
    let (k_at, v_at) = (q_bytes, q_bytes + tile);
    let stage_bytes = 2 * tile;
    let p_at = q_bytes + 2 * stage_bytes;
    let p_bytes = 64 * bn * 2;
    let sbase = f.sbase;

    b.comment("copies: q once, key and value tiles into two stages");
    let q_cp = sw128_copies(&mut b, threads, f.tid, bm, d);
    let kv_cp = sw128_copies(&mut b, threads, f.tid, bn, d);
    let zero_u = f.zero;
    issue_tile(&mut b, &q_cp, (f.qh, d), (f.m0, p.rows), sbase);
    let k0 = b.add(sbase, k_at);
    let v0 = b.add(sbase, v_at);
    let any = b.setp(Cmp::Gt, f.n_blocks, 0u32);
    let skip_first = b.label("no_first_tile");
    b.bra_unless(any, skip_first);
    issue_tile(&mut b, &kv_cp, (f.kh, d), (zero_u, p.seq_k), k0);
    if !overlap {
        issue_tile(&mut b, &kv_cp, (f.vh, d), (zero_u, p.seq_k), v0);
    }
    b.place(skip_first);
    b.cp_async_commit();

    b.comment("descriptors: q (this warpgroup's 64 rows), k and v of stage 0, this warpgroup's P");
    let desc_q = q_descriptor(&mut b, &f, sbase);
    let desc_k = b.smem_descriptor(k0, 16, 1024);
    // v read n-contiguous: 64-wide blocks of the head bn*128 bytes apart, 8-key atoms 1024 apart.
    let desc_v = b.smem_descriptor(v0, bn * ROW, 1024);
    let p_wg = b.mul(f.wg, p_bytes);
    let p_wg = b.add(p_wg, p_at);
    let p_addr = b.add(sbase, p_wg);
    let desc_p = b.smem_descriptor(p_addr, 16, 1024);

    let p_row_addr: Vec<(Reg<U32>, Reg<U32>)> = if reg_p {
        Vec::new()
    } else {
        b.comment("P stores: row r of the warpgroup, column 8j + 2t at (j/8)*64*128 + r*128 + ((j%8) ^ (r%8))*16 + 4t");
        let wrow = b.sub(f.row0, f.m0);
        let wrow = b.and(wrow, 63u32); // row within the warpgroup (and +8)
        let t4b = b.shl(f.cols0, 1u32);
        (0..2u32)
            .map(|h| {
                let r = b.add(wrow, h * 8);
                let at = b.mad(r, ROW, p_addr);
                let at = b.add(at, t4b);
                (at, b.and(r, 7u32))
            })
            .collect()
    };

    // O += P·v (P in shared memory) for the key tile whose values are in stage `vstage` (0 or 1, a register).
    let pv = |b: &mut KernelBuilder, vstage: Reg<U32>| {
        let dv0 = stage_delta(b, vstage, stage_bytes);
        let dv0 = b.add(desc_v, dv0);
        b.wgmma_fence();
        for kk in 0..bn / 16 {
            let dp = b.add(desc_p, u64::from(((kk / 4) * 64 * ROW + (kk % 4) * 32) >> 4));
            let dv = b.add(dv0, u64::from((kk * 2 * 1024) >> 4));
            b.wgmma_mma_async(mma_in, &f.o_acc, (dp, dv), f.always, (false, true));
        }
        b.wgmma_commit();
    };
    let kb = f.kb;
    let body = |b: &mut KernelBuilder, masked: bool| {
        b.cp_async_wait(0);
        b.fence_proxy_async_shared();
        b.bar_sync();
        let next = b.add(kb, 1u32);
        let more = b.setp(Cmp::Lt, next, f.n_blocks);
        let nstage = b.and(next, 1u32);
        let noff = b.mul(nstage, stage_bytes);
        let stage = b.and(kb, 1u32);
        let skip = b.label("no_next_tile");
        b.bra_unless(more, skip);
        let first = b.mul(next, bn);
        let kd = b.add(k0, noff);
        issue_tile(b, &kv_cp, (f.kh, d), (first, p.seq_k), kd);
        if !overlap {
            let vd = b.add(v0, noff);
            issue_tile(b, &kv_cp, (f.vh, d), (first, p.seq_k), vd);
        }
        b.place(skip);
        if overlap {
            // This tile's values, for its P·v one tile later.
            let this = b.mul(kb, bn);
            let soff = b.mul(stage, stage_bytes);
            let vd = b.add(v0, soff);
            issue_tile(b, &kv_cp, (f.vh, d), (this, p.seq_k), vd);
        }
        b.cp_async_commit();

        b.comment("S = q k^T");
        let sd = stage_delta(b, stage, stage_bytes);
        let dk = b.add(desc_k, sd);
        b.wgmma_fence();
        issue_scores(b, &f, bm, desc_q, dk);
        b.wgmma_commit();
        if overlap {
            b.comment("the previous tile's P v runs behind this tile's softmax");
            let first_tile = b.setp(Cmp::Eq, kb, 0u32);
            let no_prev = b.label("no_previous_tile");
            let go = b.label("scores_ready");
            b.bra_if(first_tile, no_prev);
            let pstage = b.xor(stage, 1u32);
            pv(b, pstage);
            b.wgmma_wait(1);
            b.bra(go);
            b.place(no_prev);
            b.wgmma_wait(0);
            b.place(go);
        } else {
            b.wgmma_wait(0);
        }

        let (probs, alphas) = online_softmax(b, &f, masked);
        if overlap {
            b.comment("the previous tile's P v is done: O (under the old maximum) rescaled, P free");
            b.wgmma_wait(0);
        }
        rescale_acc(b, &f, alphas);
        if reg_p {
            b.comment("O += P v, P from registers");
            let pw = pack_weights(b, &f, &probs);
            let sd = stage_delta(b, stage, stage_bytes);
            let dv = b.add(desc_v, sd);
            b.wgmma_fence();
            issue_values_reg(b, &f, &pw, dv);
            b.wgmma_commit();
            b.wgmma_wait(0);
        } else {
            b.comment("P (rounded) into this warpgroup's tile, visible to wgmma");
            for (h, &(at, r8)) in p_row_addr.iter().enumerate() {
                for j in 0..bn / 8 {
                    let w = b.f32_pair_to_half(
                        probs[(4 * j) as usize + 2 * h],
                        probs[(4 * j) as usize + 2 * h + 1],
                        f.half,
                    );
                    let jj = b.xor(r8, j % 8);
                    let off = b.shl(jj, 4u32);
                    let addr = b.add(at, off);
                    b.st_shared::<U32>(addr, i64::from((j / 8) * 64 * ROW), w);
                }
            }
            if !overlap {
                b.fence_proxy_async_shared();
                b.bar_sync();
                b.comment("O += P v");
                pv(b, stage);
                b.wgmma_wait(0);
            }
        }
        let nk = b.add(kb, 1u32);
        b.assign(kb, nk);
    };
    key_tile_loops(&mut b, kb, (f.n_full, f.n_blocks), body);
    if overlap {
        b.comment("the last tile's P v");
        let none = b.setp(Cmp::Eq, f.n_blocks, 0u32);
        let skip = b.label("no_last_tile");
        b.bra_if(none, skip);
        b.cp_async_wait(0);
        b.fence_proxy_async_shared();
        b.bar_sync();
        let last = b_sub1(&mut b, f.n_blocks);
        let lstage = b.and(last, 1u32);
        pv(&mut b, lstage);
        b.wgmma_wait(0);
        b.place(skip);
    }
    b.cp_async_wait(0);
    write_out(&mut b, &f);
    b.finish()
}
