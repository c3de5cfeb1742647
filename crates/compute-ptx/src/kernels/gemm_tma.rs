//! The Hopper tensor-core GEMM fed by the tensor memory accelerator
//! (`sm_90a`): TMA copies into a ring of shared-memory stages tracked by
//! `mbarrier`s, a producer warpgroup and two consumer warpgroups
//! (warp-specialised, with `setmaxnreg` moving registers to the consumers),
//! and persistent blocks that walk the output tiles in grouped order.
//!
//! A block of 384 threads lives on each multiprocessor (the grid is at most
//! one block per multiprocessor) and takes output tiles `ctaid.x`,
//! `ctaid.x + nctaid.x`, …, each `128 × BN`, in the raster order of
//! the `cp.async` kernels (groups of `group_m` tile-rows), batch
//! by batch. Its warpgroups:
//!
//! - **Producer** (warpgroup 0, 40 registers a thread, 56 when it rounds
//!   TF32): one thread walks the
//!   same tiles and, per k-tile, waits until the consumers have released the
//!   stage (`empty`), arms the stage's `full` barrier with the tile's bytes
//!   and issues the TMA copies of `A` and `B` (one box per operand for a
//!   `k`-contiguous one, one per 64 columns of `m` or `n` for an
//!   `m`/`n`-contiguous one). The copies write the 128-byte swizzle that
//!   `wgmma` reads and zeros where a box hangs over an edge, so ragged
//!   shapes need no checks. When the kernel rounds both TF32 operands in
//!   shared memory ([`Tf32Rounding::InShared`], for measurements) the other
//!   three warps round each landed stage to nearest in place and arm a
//!   third barrier (`ready`).
//! - **Consumers** (warpgroups 1 and 2, rows 0–63 and 64–127 of the tile,
//!   232 registers a thread, 224 beside rounding warps): per k-tile wait for the stage, issue its
//!   `wgmma` as one group, wait until only that group is in flight and
//!   release the stage before, then store the tile from the accumulators
//!   while the producer is already filling stages for the next tile. The
//!   plans' TF32 kernel ([`Tf32Rounding::ARegistersBBefore`]) reads its rows
//!   of `A` from the stage into registers (`ldmatrix`), rounds them to
//!   nearest there and gives them to `wgmma` as its register operand, two
//!   k-tiles per pass of the loop so that the group in flight keeps its
//!   registers; `B` comes rounded by a pass before the kernel.
//!
//! Stage `s` of k-tile `i` is `i mod stages` of a counter that runs on
//! across tiles; its barriers complete once per round, and waits name the
//! round's parity. Inputs `f16`/`bf16` (any transposes; `f32` output, or a
//! half one rounded to nearest even) or `f32` read as TF32 (`A·Bᵀ` only).
//! Every operand's contiguous dimension must be a multiple of 8 elements
//! (16 bytes) and the operands 16-byte aligned, as tensor maps require.

use compute_core::DType;

use super::gemm_common::{ATOM_K_STRIDE, Tf32Fragments, atom_mn_stride, kernel_base, store_wgmma_tile, wgmma_dtypes};
use super::gemm_epilogue::{self, EpilogueKind};
use super::gemm_wgmma::Tf32Rounding;
use crate::builder::{B32, BuildError, Cmp, Dim, F32, Kernel, KernelBuilder, Reg, Target, U32, U64, WgmmaInput};
use crate::plan::TensorMapDesc;

/// Bytes of one swizzled row of a stage: 64 halves or 32 `f32` of `k`, or 64
/// halves along `m`/`n` for an `m`/`n`-contiguous operand.
const ROW: u32 = 128;
/// Rows of the block tile: two consumer warpgroups of 64.
const BM: u32 = 128;
/// Threads per block: the producer warpgroup and two consumers.
const THREADS: u32 = 384;
/// The warps of the consumers, each arriving once per released stage.
const CONSUMER_WARPS: u32 = 8;
/// Threads of the producer warpgroup that round TF32 stages (warps 1–3).
const ROUNDERS: u32 = 96;

/// Shape of the TMA-fed `wgmma` kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TmaConfig {
    /// Columns of the block tile (128 or 256), the `N` of each `wgmma`.
    pub bn: u32,
    /// Shared-memory stages in the ring (2..=6, within 227 KiB).
    pub stages: u32,
    /// Tile-rows per group in the raster order (0: row-major).
    pub group_m: u32,
    /// How `f32` inputs (TF32) are rounded: `A` in the consumers' registers
    /// and `B` by a pass before the kernel ([`Tf32Rounding::ARegistersBBefore`]),
    /// both in shared memory by the producer's spare warps
    /// ([`Tf32Rounding::InShared`]), both by the pass
    /// ([`Tf32Rounding::BeforeKernel`], whose kernel is the one of
    /// [`Tf32Rounding::None`]), or not at all (truncation, for measurements).
    pub tf32: Tf32Rounding,
}

impl Default for TmaConfig {
    fn default() -> Self {
        TmaConfig { bn: 256, stages: 4, group_m: 8, tf32: Tf32Rounding::InShared }
    }
}

impl TmaConfig {
    /// Rows of the block tile (128).
    pub fn bm(&self) -> u32 {
        BM
    }

    /// Threads per block (384).
    pub fn threads(&self) -> u32 {
        THREADS
    }

    /// Bytes of one stage: both operand tiles.
    fn stage_bytes(&self) -> u32 {
        (BM + self.bn) * ROW
    }

    /// Dynamic shared memory to launch with: the stages, three barriers per
    /// stage, and 1 KiB so the stages can start on a 1024-byte boundary.
    pub fn dynamic_shared_bytes(&self) -> u32 {
        self.stages * self.stage_bytes() + 24 * self.stages + 1024
    }

    /// Why this shape cannot be built, if it cannot.
    pub fn check(&self) -> Result<(), String> {
        if !matches!(self.bn, 128 | 256) {
            return Err(format!("bn {}: need 128 or 256", self.bn));
        }
        if !(2..=6).contains(&self.stages) {
            return Err(format!("{} stages: need 2..=6", self.stages));
        }
        if self.tf32 == Tf32Rounding::InRegisters {
            return Err("the TMA kernel rounds TF32 in shared memory or not at all".into());
        }
        let max = 227 * 1024;
        if self.dynamic_shared_bytes() > max {
            return Err(format!("{} bytes of shared memory: above {max}", self.dynamic_shared_bytes()));
        }
        Ok(())
    }

    /// Kernel name: `gemm_tma_bf16_f32_nt` for the default shape (`f32`
    /// inputs read as TF32: `gemm_tma_tf32_f32_nt`), the shape spelled out for
    /// others (`gemm_tma_bf16_f32_nt_128x128_s6_g8`, `_nr` unrounded TF32).
    pub fn kernel_name(&self, input: DType, output: DType, trans_a: bool, trans_b: bool) -> String {
        let read_as = if input == DType::F32 { "tf32" } else { input.as_str() };
        let base = kernel_base("gemm_tma", read_as, output, trans_a, trans_b);
        if *self == TmaConfig::default() {
            base
        } else {
            let rounding = self.tf32.suffix();
            format!("{base}_{BM}x{}_s{}_g{}{rounding}", self.bn, self.stages, self.group_m)
        }
    }

    /// The tile shape for a `batch × m × n` output on `sms`
    /// multiprocessors: 128 × 256 unless its tiles would leave more than a
    /// third of the multiprocessors idle in the last wave where 128 × 128
    /// tiles would not. Free.
    pub fn for_shape(batch: usize, m: usize, n: usize, sms: u32) -> TmaConfig {
        let sms = sms.max(1) as usize;
        let waste = |bn: usize| {
            let tiles = batch.max(1) * m.div_ceil(BM as usize) * n.div_ceil(bn);
            let waves = tiles.div_ceil(sms);
            // Idle fraction of the last wave, weighted by the tile's work.
            (waves * sms - tiles) as f64 / (waves * sms) as f64
        };
        if waste(256) > 1.0 / 3.0 && waste(128) < waste(256) {
            TmaConfig { bn: 128, stages: 6, ..TmaConfig::default() }
        } else {
            TmaConfig::default()
        }
    }

    /// The TF32 shape (`f32` inputs, `A·Bᵀ`): the default tile, `A` rounded
    /// in the consumers' registers and `B` by a separate pass into a
    /// temporary ([`Tf32Rounding::ARegistersBBefore`]). Rounding both
    /// operands by the pass ([`Tf32Rounding::BeforeKernel`]) ran at 0.81×
    /// and 0.89× cuBLAS's TF32 GEMM at 4096³ and 8192³ on the H100
    /// (2026-11-26), rounding in shared memory inside the kernel at 0.66×
    /// and 0.62×.
    pub fn tf32() -> TmaConfig {
        TmaConfig { tf32: Tf32Rounding::ARegistersBBefore, ..TmaConfig::default() }
    }

    /// The kernel this shape launches: [`Tf32Rounding::BeforeKernel`] runs
    /// the kernel that does not round (its operands are rounded already);
    /// [`Tf32Rounding::ARegistersBBefore`] the one that rounds `A`.
    pub fn kernel(&self) -> TmaConfig {
        match self.tf32 {
            Tf32Rounding::BeforeKernel => TmaConfig { tf32: Tf32Rounding::None, ..*self },
            _ => *self,
        }
    }
}

/// Other shapes the benchmark's sweep times next to the default.
pub fn sweep_configs() -> Vec<TmaConfig> {
    let d = TmaConfig::default();
    vec![TmaConfig { bn: 128, stages: 6, ..d }, TmaConfig { stages: 3, ..d }, TmaConfig { group_m: 16, ..d }]
}

/// The tensor maps of a product's operands for the TMA kernel (element
/// size of `input`, `batch` products): `A` stored `m × k` (or `k × m` when
/// `trans_a`), `B` stored `k × n` (or `n × k` when `trans_b`), each stored
/// row `lds.0` (`A`) or `lds.1` (`B`) elements after the previous one (at
/// least the row's length; batches one matrix of such rows apart); boxes of
/// one k-tile by the block's rows (`k`-contiguous) or 64 by one k-tile
/// (`m`/`n`-contiguous, one box per 64 rows of the tile).
pub fn tensor_maps(
    cfg: &TmaConfig,
    input: DType,
    shape: (usize, usize, usize, usize),
    trans: (bool, bool),
    addrs: (u64, u64),
    lds: (usize, usize),
) -> (TensorMapDesc, TensorMapDesc) {
    tensor_maps_strided(cfg, input, shape, trans, addrs, lds, (None, None))
}

/// [`tensor_maps`] with the matrices of `A` and of `B` `batch_strides`
/// elements apart where given (at least one matrix of stored rows; the
/// map's stride must be a multiple of 16 bytes, which
/// [`TensorMapDesc::check`] verifies).
pub fn tensor_maps_strided(
    cfg: &TmaConfig,
    input: DType,
    (batch, m, n, k): (usize, usize, usize, usize),
    (trans_a, trans_b): (bool, bool),
    (a, b): (u64, u64),
    lds: (usize, usize),
    batch_strides: (Option<usize>, Option<usize>),
) -> (TensorMapDesc, TensorMapDesc) {
    let e = input.size_in_bytes() as u64;
    let bk = ROW / e as u32;
    let (m, n, k, batch) = (m as u64, n as u64, k as u64, batch.max(1) as u64);
    let map = |addr: u64, kmajor: bool, rows: u64, tile: u32, ld: u64, stride: Option<usize>| {
        let (dims, boxes) = if kmajor { ([k, rows, batch], [bk, tile, 1]) } else { ([rows, k, batch], [64, bk, 1]) };
        let between = stride.map_or(dims[1] * ld, |s| s as u64) * e;
        TensorMapDesc { addr, dtype: input, rank: 3, dims, strides: [ld * e, between], boxes }
    };
    (map(a, !trans_a, m, BM, lds.0 as u64, batch_strides.0), map(b, trans_b, n, cfg.bn, lds.1 as u64, batch_strides.1))
}

/// The smallest of `m` and `n` from which the plans copy `B`, when its
/// stored rows are not a multiple of 128 bytes, into rows that are, before
/// the TMA kernel reads it. Rows off the 128-byte lines make every box row
/// straddle two lines: 4096×4096×4088 in bf16 ran at 0.63× its aligned
/// neighbour (H100, 2026-11-26, `ncu`: 37.5 M L2 requests against 14.9 M).
/// `B`'s boxes of 256 rows cost the most: on the H200 (2026-11-28) copying
/// `B` alone gave 0.85× the aligned neighbour, both operands 0.83–0.84×, neither
/// 0.72×; `A` off the lines alone (`B` stored `k × n`) cost 4 % uncopied
/// and 11 % copied, so `A` is never copied. The copy reads and writes `B`
/// once, about 12 % of the product's time at 4096² outputs and a larger
/// share below.
pub const REALIGN_MIN_MN: usize = 2048;

/// Builds the TMA-fed `wgmma` kernel (target `sm_90a`) for one input dtype
/// (`f16`/`bf16`, or `f32` as TF32 with `trans_b` only), output dtype and
/// transpose combination (`A` stored `k × m` when `trans_a`, `B` stored
/// `n × k` when `trans_b`).
///
/// Params: `a`, `b` (tensor maps, [`tensor_maps`]), `c`, `m`, `n`, `k`,
/// `batch` (u32), `sc` (the batch stride of `C` in elements). Launch:
/// [`TmaConfig::threads`] threads, `min(tiles, multiprocessors)` blocks
/// along x, [`TmaConfig::dynamic_shared_bytes`] of dynamic shared memory.
pub fn gemm_tma(
    cfg: &TmaConfig,
    input: DType,
    output: DType,
    (trans_a, trans_b): (bool, bool),
    epilogue: Option<EpilogueKind>,
    target: Target,
) -> Result<Kernel, BuildError> {
    let name = cfg.kernel_name(input, output, trans_a, trans_b) + &EpilogueKind::suffix(epilogue);
    let fail = |p: String| Err(BuildError { kernel: name.clone(), problems: vec![p] });
    if let Err(e) = cfg.check() {
        return fail(e);
    }
    if target != Target::Sm90a {
        return fail(format!("TMA wgmma kernels are built for sm_90a, not {target}"));
    }
    let (mma_in, out_half) = match wgmma_dtypes(input, output, (trans_a, trans_b)) {
        Ok(d) => d,
        Err(e) => return fail(e),
    };
    let rounding = mma_in == WgmmaInput::Tf32 && cfg.tf32 == Tf32Rounding::InShared;
    let a_in_registers = mma_in == WgmmaInput::Tf32 && cfg.tf32 == Tf32Rounding::ARegistersBBefore;
    let elem = if mma_in == WgmmaInput::Tf32 { 4 } else { 2 };
    let bk = ROW / elem;
    let (bn, stages) = (cfg.bn, cfg.stages);
    let stage_bytes = cfg.stage_bytes();
    let (a_kmajor, b_kmajor) = (!trans_a, trans_b);
    // Producer and consumer register budgets: 128·p + 256·c ≤ 65536.
    let (producer_regs, consumer_regs) = if rounding { (56, 224) } else { (40, 232) };

    let mut b = KernelBuilder::new(&name, target);
    b.doc(&format!(
        "{name}: C = {} * {}, {input} inputs, f32 accumulation, {output} output, wgmma.mma_async m64n{bn}k{}",
        if trans_a { "A^T" } else { "A" },
        if trans_b { "B^T" } else { "B" },
        mma_in.k()
    ));
    b.doc(&format!(
        "block tile {BM}x{bn}, k-tile {bk}, {stages} TMA stages, 128-byte swizzle; warp-specialised: 1 producer, 2 consumer warpgroups; persistent"
    ));
    b.doc("params: a, b (tensor maps), c, m, n, k, batch, sc (batch stride of C in elements)");
    b.doc(&format!(
        "launch: {THREADS} threads, grid (min(tiles, multiprocessors), 1, 1), {} bytes of dynamic shared memory",
        cfg.dynamic_shared_bytes()
    ));
    b.max_threads(THREADS);
    b.min_blocks_per_sm(1);
    let map_a = b.param_tensor_map("a");
    let map_b = b.param_tensor_map("b");
    let c = b.param_ptr("c");
    let m = b.param::<U32>("m");
    let n = b.param::<U32>("n");
    let k = b.param::<U32>("k");
    let batch = b.param::<U32>("batch");
    let sc = b.param::<U64>("sc");
    gemm_epilogue::doc(&mut b, epilogue);
    let epi = gemm_epilogue::params(&mut b, epilogue);

    let smem = b.dynamic_shared("tiles", 1024);
    let raw = b.shared_base(&smem);
    b.comment("stages start on a 1024-byte boundary (the swizzle's period); barriers after them");
    let up = b.add(raw, 1023u32);
    let sbase = b.and(up, !1023u32);
    let bars = b.add(sbase, stages * stage_bytes);
    // full[s] at bars + 8s, empty[s] at + 8 stages, ready[s] (TF32) at + 16 stages.
    let (full_at, empty_at, ready_at) = (0i64, i64::from(8 * stages), i64::from(16 * stages));

    let tid = b.tid(Dim::X);
    let wg = b.shr(tid, 7u32);
    let warp = b.shr(tid, 5u32);
    let lane = b.and(tid, 31u32);
    let tiles_n = b.add(n, bn - 1);
    let tiles_n = b.div(tiles_n, bn);
    let tiles_m = b.add(m, BM - 1);
    let tiles_m = b.div(tiles_m, BM);
    let per_batch = b.mul(tiles_m, tiles_n);
    let total = b.mul(per_batch, batch);
    let k_tiles = b.add(k, bk - 1);
    let k_tiles = b.div(k_tiles, bk);
    let first_tile = b.ctaid(Dim::X);
    let tile_step = b.nctaid(Dim::X);

    b.comment("thread 0 initialises the barriers: full (the producer's arrival and the bytes), empty (one arrival per consumer warp)");
    let t0 = b.setp(Cmp::Eq, tid, 0u32);
    b.guarded(t0, false, |b| {
        for s in 0..stages {
            let s8 = i64::from(8 * s);
            b.mbarrier_init(bars, full_at + s8, 1);
            b.mbarrier_init(bars, empty_at + s8, CONSUMER_WARPS);
            if rounding {
                b.mbarrier_init(bars, ready_at + s8, ROUNDERS);
            }
        }
        b.fence_mbarrier_init();
    });
    b.bar_sync();

    let consumer = b.label("consumer");
    let done = b.label("done");
    let is_consumer = b.setp(Cmp::Ne, wg, 0u32);
    b.bra_if(is_consumer, consumer);

    // ---------------------------------------------------------------- producer
    b.blank();
    b.comment("producer warpgroup: hands its registers to the consumers");
    b.setmaxnreg(false, producer_regs);
    let ring = Ring::new(&mut b);
    // TF32 rounded in the kernel: warps 1-3 round the landed stages.
    let rounder = rounding.then(|| b.label("rounder"));
    if let Some(r) = rounder {
        let is_rounder = b.setp(Cmp::Ne, warp, 0u32);
        b.bra_if(is_rounder, r);
    }
    let coords = |b: &mut KernelBuilder, t: Reg<U32>| tile_coords(b, t, (per_batch, tiles_m, tiles_n), cfg.group_m, bn);
    let loads = Producer { a_kmajor, b_kmajor, bk, bn, stages, stage_bytes, sbase, bars, full_at, empty_at };
    producer(&mut b, &ring, (tid, done), (&map_a, &map_b), (first_tile, tile_step, total, k_tiles), &coords, &loads);
    if let Some(r) = rounder {
        b.place(r);
        b.comment("warps 1-3: round each landed stage to TF32 in place, then mark it ready");
        let rt = b.sub(tid, 32u32);
        let mine = b.mul(rt, 16u32);
        let chunk0 = b.add(sbase, mine);
        let my_tiles = tiles_of(&mut b, (first_tile, tile_step, total));
        let steps = b.mul(my_tiles, k_tiles);
        let i = b.mov(0u32);
        let top = b.label("round_loop");
        b.place(top);
        let end = b.setp(Cmp::Ge, i, steps);
        b.bra_if(end, done);
        let f = ring.barrier(&mut b, bars);
        b.mbarrier_wait(f, full_at, ring.phase);
        let off = b.mul(ring.stage, stage_bytes);
        let base = b.add(chunk0, off);
        let chunks = stage_bytes / 16;
        for j in 0..chunks.div_ceil(ROUNDERS) {
            let at = i64::from(j * 16 * ROUNDERS);
            let round = |b: &mut KernelBuilder| {
                let v = b.ld_shared_v::<B32, 4>(base, at);
                let r = v.map(|x| b.round_to_tf32(x));
                b.st_shared_v::<B32, 4>(base, at, r.map(Into::into));
            };
            if (j + 1) * ROUNDERS <= chunks {
                round(&mut b);
            } else {
                // The last round of chunks covers part of the threads.
                let inside = b.setp(Cmp::Lt, rt, chunks - j * ROUNDERS);
                let skip = b.label("round_skip");
                b.bra_unless(inside, skip);
                round(&mut b);
                b.place(skip);
            }
        }
        b.fence_proxy_async_shared();
        b.mbarrier_arrive(f, ready_at);
        ring.advance(&mut b, stages);
        let next = b.add(i, 1u32);
        b.assign(i, next);
        b.bra(top);
    }

    // ---------------------------------------------------------------- consumers
    b.place(consumer);
    b.blank();
    b.comment("consumer warpgroups 1 and 2: rows 0-63 and 64-127 of each tile");
    b.setmaxnreg(true, consumer_regs);
    let ring = Ring::new(&mut b);
    let cw = b.sub(wg, 1u32);
    // (leading, stride, bytes per k step): k-contiguous: groups of 8 rows 1024
    // apart, 32 bytes per step; m/n-contiguous: 64-wide atom columns
    // atom_mn_stride apart, atoms along k 1024 apart, 2048 bytes per step of 16.
    let layout = |kmajor: bool| -> (u32, u32, u32) {
        if kmajor { (16, 1024, 32) } else { (atom_mn_stride(BK_HALF), ATOM_K_STRIDE, 2 * ATOM_K_STRIDE) }
    };
    let (a_lbo, a_sbo, a_step) = layout(a_kmajor);
    let (b_lbo, b_sbo, b_step) = layout(b_kmajor);
    // A warpgroup's 64 rows of A start 64 * 128 bytes after the previous one's, either layout.
    let a_rows = b.mul(cw, 64 * ROW);
    let a_addr = b.add(sbase, a_rows);
    let desc_a = b.smem_descriptor(a_addr, a_lbo, a_sbo);
    let b_addr = b.add(sbase, BM * ROW);
    let desc_b = b.smem_descriptor(b_addr, b_lbo, b_sbo);
    let zero = b.mov(0u32);
    let always = b.setp(Cmp::Eq, zero, 0u32);
    let acc: Vec<Reg<F32>> = (0..bn / 2).map(|_| b.mov(0.0f32)).collect();
    let is_lane0 = b.setp(Cmp::Eq, lane, 0u32);

    let lane_g = b.shr(lane, 2u32);
    let cwarp = b.and(warp, 3u32);
    let frags = a_in_registers.then(|| Tf32Fragments::new(&mut b, a_addr, cwarp, lane, bk / mma_in.k()));
    let row_in_tile = b.mul(cw, 64u32);
    let row_in_tile = b.mad(cwarp, 16u32, row_in_tile);
    let row_in_tile = b.add(row_in_tile, lane_g);
    let esz = if out_half.is_some() { 2u32 } else { 4 };

    let t = b.mov(first_tile);
    let tile_top = b.label("tile_loop");
    b.place(tile_top);
    let finished = b.setp(Cmp::Ge, t, total);
    b.bra_if(finished, done);
    let (z, m0, n0) = tile_coords(&mut b, t, (per_batch, tiles_m, tiles_n), cfg.group_m, bn);
    for a in &acc {
        b.assign(*a, 0.0f32);
    }
    let prev = b.mov(0u32);
    let kt = b.mov(0u32);
    let k_top = b.label("k_loop");
    let k_done = b.label("k_done");
    b.place(k_top);
    // One k-tile: wait for its stage, issue its wgmma as one group, release
    // the stage of the k-tile before once that one's group is done.
    let k_tile = |b: &mut KernelBuilder| {
        let k_end = b.setp(Cmp::Ge, kt, k_tiles);
        b.bra_if(k_end, k_done);
        let f = ring.barrier(b, bars);
        b.mbarrier_wait(f, if rounding { ready_at } else { full_at }, ring.phase);
        let steps = bk / mma_in.k();
        // TF32 with A rounded in registers: the tile's fragments, before the fence.
        let a_regs: Vec<[Reg<U32>; 4]> = frags.as_ref().map_or_else(Vec::new, |fr| {
            let off = b.mul(ring.stage, stage_bytes);
            let row = fr.row_in(b, off);
            (0..steps as usize).map(|ks| fr.load_rounded(b, row, ks)).collect()
        });
        let soff = b.mul(ring.stage, stage_bytes >> 4);
        let soff = b.cvt::<U64, U32>(soff);
        let da0 = b.add(desc_a, soff);
        let db0 = b.add(desc_b, soff);
        b.wgmma_fence();
        for ks in 0..steps {
            if let Some(&a) = a_regs.get(ks as usize) {
                let db = b.add(db0, u64::from((ks * b_step) >> 4));
                b.wgmma_mma_async_reg_a(mma_in, &acc, a, db, always, false);
            } else {
                let da = b.add(da0, u64::from((ks * a_step) >> 4));
                let db = b.add(db0, u64::from((ks * b_step) >> 4));
                b.wgmma_mma_async(mma_in, &acc, (da, db), always, (!a_kmajor, !b_kmajor));
            }
        }
        b.wgmma_commit();
        b.comment("the previous k-tile's wgmma are done: release its stage");
        b.wgmma_wait(1);
        let not_first = b.setp(Cmp::Ne, kt, 0u32);
        let release = b.and_pred(not_first, is_lane0);
        let pbar = b.mad(prev, 8u32, bars);
        b.guarded(release, false, |b| b.mbarrier_arrive(pbar, empty_at));
        b.assign(prev, ring.stage);
        ring.advance(b, stages);
        let next = b.add(kt, 1u32);
        b.assign(kt, next);
    };
    k_tile(&mut b);
    if frags.is_some() {
        // The group in flight reads the registers of A it was issued with:
        // two k-tiles per pass give consecutive tiles their own registers.
        k_tile(&mut b);
    }
    b.bra(k_top);
    b.place(k_done);
    b.wgmma_wait(0);
    let any = b.setp(Cmp::Ne, k_tiles, 0u32);
    let release = b.and_pred(any, is_lane0);
    let pbar = b.mad(prev, 8u32, bars);
    b.guarded(release, false, |b| b.mbarrier_arrive(pbar, empty_at));

    b.blank();
    b.comment("epilogue: warp w of the warpgroup holds rows 16w+g and 16w+g+8, columns 8j+2t and 8j+2t+1");
    let zw = b.cvt::<U64, U32>(z);
    let zc = b.mul(zw, sc);
    let zc = b.mul(zc, u64::from(esz));
    let c_base = b.add(c, zc);
    let tile_epi = epi.map(|e| e.at_batch(&mut b, zc));
    let row0 = b.add(m0, row_in_tile);
    store_wgmma_tile(&mut b, &acc, (out_half, tile_epi), (c_base, row0, n0), (m, n, lane));
    let next = b.add(t, tile_step);
    b.assign(t, next);
    b.bra(tile_top);

    b.place(done);
    b.ret();
    b.finish()
}

/// Depth of an `m`/`n`-contiguous tile's atoms (64 halves; TF32 tiles are
/// `k`-contiguous only).
const BK_HALF: u32 = 64;

/// Position in the ring of stages: the stage and the parity of its round.
struct Ring {
    stage: Reg<U32>,
    phase: Reg<U32>,
}

impl Ring {
    fn new(b: &mut KernelBuilder) -> Ring {
        Ring { stage: b.mov(0u32), phase: b.mov(0u32) }
    }

    /// The shared address of this stage's barrier triple (`bars + 8·stage`).
    fn barrier(&self, b: &mut KernelBuilder, bars: Reg<U32>) -> Reg<U32> {
        b.mad(self.stage, 8u32, bars)
    }

    /// The next stage; the parity flips when the ring wraps.
    fn advance(&self, b: &mut KernelBuilder, stages: u32) {
        let s = b.add(self.stage, 1u32);
        let wrap = b.setp(Cmp::Eq, s, stages);
        let flipped = b.xor(self.phase, 1u32);
        let p = b.selp(flipped, self.phase, wrap);
        let s = b.selp(0u32, s, wrap);
        b.assign(self.stage, s);
        b.assign(self.phase, p);
    }
}

/// How many of the tiles `first, first + step, …` below `total` this block takes.
fn tiles_of(b: &mut KernelBuilder, (first, step, total): (Reg<U32>, Reg<U32>, Reg<U32>)) -> Reg<U32> {
    let have = b.setp(Cmp::Lt, first, total);
    let left = b.sub(total, first);
    let left = b.add(left, step);
    let left = b.sub(left, 1u32);
    let count = b.div(left, step);
    b.selp(count, 0u32, have)
}

/// Batch, first row and first column of tile `t`: tiles of a batch in
/// groups of `group_m` tile-rows, column by column within a group.
fn tile_coords(
    b: &mut KernelBuilder,
    t: Reg<U32>,
    (per_batch, tiles_m, tiles_n): (Reg<U32>, Reg<U32>, Reg<U32>),
    group_m: u32,
    bn: u32,
) -> (Reg<U32>, Reg<U32>, Reg<U32>) {
    let z = b.div(t, per_batch);
    let pid = b.rem(t, per_batch);
    let (pm, pn) = if group_m > 0 {
        let width = b.mul(tiles_n, group_m);
        let gid = b.div(pid, width);
        let first = b.mul(gid, group_m);
        let left = b.sub(tiles_m, first);
        let gsz = b.min(left, group_m);
        let inner = b.rem(pid, width);
        let r = b.rem(inner, gsz);
        (b.add(first, r), b.div(inner, gsz))
    } else {
        (b.div(pid, tiles_n), b.rem(pid, tiles_n))
    };
    (z, b.mul(pm, BM), b.mul(pn, bn))
}

/// What the producer thread needs to fill a stage.
struct Producer {
    a_kmajor: bool,
    b_kmajor: bool,
    bk: u32,
    bn: u32,
    stages: u32,
    stage_bytes: u32,
    sbase: Reg<U32>,
    bars: Reg<U32>,
    full_at: i64,
    empty_at: i64,
}

type TileCoords<'a> = &'a dyn Fn(&mut KernelBuilder, Reg<U32>) -> (Reg<U32>, Reg<U32>, Reg<U32>);

/// The producer thread (thread 0): walks the block's tiles and their
/// k-tiles, waits for each stage to be released, arms its `full` barrier with
/// the stage's bytes and issues the TMA copies. The other threads that reach
/// it go to `done`.
fn producer(
    b: &mut KernelBuilder,
    ring: &Ring,
    (tid, done): (Reg<U32>, crate::builder::Label),
    (map_a, map_b): (&crate::builder::TensorMapParam, &crate::builder::TensorMapParam),
    (first, step, total, k_tiles): (Reg<U32>, Reg<U32>, Reg<U32>, Reg<U32>),
    coords: TileCoords<'_>,
    p: &Producer,
) {
    let idle = b.setp(Cmp::Ne, tid, 0u32);
    b.bra_if(idle, done);
    let ma = b.tensor_map_address(map_a);
    let mb = b.tensor_map_address(map_b);
    b.prefetch_tensor_map(ma);
    b.prefetch_tensor_map(mb);
    let t = b.mov(first);
    let tile_top = b.label("load_tiles");
    b.place(tile_top);
    let finished = b.setp(Cmp::Ge, t, total);
    b.bra_if(finished, done);
    let (z, m0, n0) = coords(b, t);
    let kt = b.mov(0u32);
    let kc = b.mov(0u32);
    let k_top = b.label("load_k");
    let next_tile = b.label("load_next_tile");
    b.place(k_top);
    let k_end = b.setp(Cmp::Ge, kt, k_tiles);
    b.bra_if(k_end, next_tile);
    let bar = ring.barrier(b, p.bars);
    let released = b.xor(ring.phase, 1u32);
    b.mbarrier_wait(bar, p.empty_at, released);
    b.mbarrier_arrive_expect_tx(bar, p.full_at, p.stage_bytes);
    let dst = b.mad(ring.stage, p.stage_bytes, p.sbase);
    // A: rows m0.. of its k-tile; B: rows n0.. (k-contiguous: one box of all
    // rows; m/n-contiguous: one 64-wide box per 8 KiB column of atoms).
    for (map, kmajor, rows, origin, at) in [(ma, p.a_kmajor, BM, m0, 0u32), (mb, p.b_kmajor, p.bn, n0, BM * ROW)] {
        if kmajor {
            b.tma_load((dst, i64::from(at)), map, &[kc, origin, z], (bar, p.full_at));
        } else {
            for j in 0..rows / 64 {
                let o = b.add(origin, j * 64);
                let off = i64::from(at + j * atom_mn_stride(p.bk));
                b.tma_load((dst, off), map, &[o, kc, z], (bar, p.full_at));
            }
        }
    }
    ring.advance(b, p.stages);
    let next = b.add(kt, 1u32);
    b.assign(kt, next);
    let nk = b.add(kc, p.bk);
    b.assign(kc, nk);
    b.bra(k_top);
    b.place(next_tile);
    let nt = b.add(t, step);
    b.assign(t, nt);
    b.bra(tile_top);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shape_builds_for_sm90a_only() {
        for cfg in std::iter::once(TmaConfig::default()).chain(sweep_configs()) {
            assert!(cfg.check().is_ok(), "{cfg:?}");
            for (i, o) in [(DType::BF16, DType::F32), (DType::F16, DType::F16), (DType::BF16, DType::BF16)] {
                for t in [(false, false), (false, true), (true, false), (true, true)] {
                    let k = gemm_tma(&cfg, i, o, t, None, Target::Sm90a);
                    assert!(k.is_ok(), "{cfg:?}: {:?}", k.err());
                    assert!(gemm_tma(&cfg, i, o, t, None, Target::Sm90).is_err());
                }
            }
            let tf32 = gemm_tma(&cfg, DType::F32, DType::F32, (false, true), None, Target::Sm90a).expect("tf32");
            assert!(tf32.ptx().contains("cvt.rna.tf32.f32"));
            assert!(gemm_tma(&cfg, DType::F32, DType::F32, (false, false), None, Target::Sm90a).is_err());
        }
        assert!(TmaConfig { bn: 192, ..TmaConfig::default() }.check().is_err());
        assert!(TmaConfig { stages: 5, ..TmaConfig::default() }.check().is_err(), "5 stages of 48 KiB");
        assert!(TmaConfig { tf32: Tf32Rounding::InRegisters, ..TmaConfig::default() }.check().is_err());
    }

    #[test]
    fn small_outputs_get_narrower_tiles() {
        assert_eq!(TmaConfig::for_shape(1, 8192, 8192, 132), TmaConfig::default());
        assert_eq!(TmaConfig::for_shape(1, 4096, 4096, 132), TmaConfig::default());
        assert_eq!(TmaConfig::for_shape(1, 512, 4096, 132).bn, 128);
    }

    #[test]
    fn tensor_maps_follow_the_stored_layouts() {
        let cfg = TmaConfig::default();
        // A stored m x k, B stored k x n (bf16): A boxes of 64 x 128, B of 64 x 64.
        let (a, b) = tensor_maps(&cfg, DType::BF16, (2, 300, 520, 72), (false, false), (4096, 8192), (72, 520));
        assert_eq!((a.dims, a.strides, a.boxes), ([72, 300, 2], [144, 300 * 72 * 2], [64, 128, 1]));
        assert_eq!((b.dims, b.strides, b.boxes), ([520, 72, 2], [1040, 520 * 72 * 2], [64, 64, 1]));
        assert!(a.check().is_ok() && b.check().is_ok());
        // Rows padded to 128 bytes: the strides follow the padding, the dimensions the data.
        let (a, _) = tensor_maps(&cfg, DType::BF16, (2, 300, 520, 72), (false, false), (0, 0), (128, 520));
        assert_eq!((a.dims, a.strides), ([72, 300, 2], [256, 300 * 256]));
        // TF32: 32 values of k per box row.
        let (a, b) = tensor_maps(&cfg, DType::F32, (1, 64, 64, 64), (false, true), (0, 0), (64, 64));
        assert_eq!((a.boxes, b.boxes), ([32, 128, 1], [32, 256, 1]));
        // A misaligned operand is refused by the map, so the plans keep the cp.async kernel.
        let (a, _) = tensor_maps(&cfg, DType::BF16, (1, 64, 64, 64), (false, true), (8, 0), (64, 64));
        assert!(a.check().is_err());
        // Batch strides: matrices 64 values past their size apart, B's as given.
        let shape = (2, 300, 520, 72);
        let strides = (Some(300 * 72 + 64), Some(520 * 72));
        let (a, b) = tensor_maps_strided(&cfg, DType::BF16, shape, (false, false), (0, 0), (72, 520), strides);
        assert_eq!((a.strides, b.strides), ([144, (300 * 72 + 64) * 2], [1040, 520 * 72 * 2]));
        let odd = tensor_maps_strided(&cfg, DType::BF16, shape, (false, false), (0, 0), (72, 520), (Some(21603), None));
        assert!(odd.0.check().is_err(), "a stride off 16 bytes");
    }
}
