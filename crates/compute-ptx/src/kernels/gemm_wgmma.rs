//! The Hopper tensor-core GEMM (`sm_90a`): `wgmma.mma_async` reading both
//! operands from shared memory, `f16`/`bf16` inputs, `f32` accumulation,
//! `f32`, `f16` or `bf16` output.
//!
//! Each block computes a `64·W × N` tile of `C` with `W` warpgroups (128
//! threads each), warpgroup `w` rows `64w..64w+64` as one `m64nNk16`
//! accumulator (`N/2` registers per thread), four `wgmma` per k-tile of 64.
//! Operands reach shared memory by 16-byte `cp.async` copies laid out in the
//! 128-byte swizzle `wgmma` reads (rows of 128 bytes, chunk `c` of row `r` at
//! `c ⊕ (r mod 8)`, 1024-byte atoms of 8 rows aligned to 1024), into a ring
//! of `stages` buffers. A `k`-contiguous operand (`A` stored `m × k`, `B`
//! stored `n × k`) keeps its rows, 64 values of `k` each; an `m`/`n`-contiguous
//! one is cut into atoms of 8 values of `k` by 64 along m or n, and `wgmma`
//! reads it transposed (its `imm-trans` flags), so all four transposes run
//! the same loop.
//!
//! `f32` inputs are multiplied as TF32 (`A·Bᵀ` only), rounded to nearest
//! first, since `wgmma` itself would drop their low 13 bits
//! ([`Tf32Rounding`], `cvt.rna.tf32.f32`). The plans' shape
//! ([`WgmmaConfig::tf32`], as the TMA kernel does) rounds `A` on its way
//! from shared memory to `wgmma`, which takes it from registers, and `B`
//! comes rounded by a pass before the kernel
//! ([`Tf32Rounding::ARegistersBBefore`]). The other ways, kept for
//! measurements: each thread rounds the values it copied in shared memory
//! once they land, or loads its chunks of the next k-tile into registers
//! while the current one is multiplied, rounds them there and stores them.
//!
//! The loop per k-tile: wait for the tile's copies, fence them to the async
//! proxy, one barrier, issue the tile's four `wgmma` as one group, wait until
//! only that group is in flight (so the previous tile's reads are done in
//! every warpgroup by the next barrier), then refill the stage read two tiles
//! ago. `stages − 2` tiles are in flight ahead of the one being multiplied.
//!
//! Edges are zero-filled by the copies and masked at the store, as in
//! [`super::gemm_mma`], with the same requirements (each operand's contiguous
//! dimension a multiple of 8, `n` even: [`super::gemm_mma::MmaConfig::fits`]).

use compute_core::DType;

use super::gemm_common::{
    ATOM_K_STRIDE, Side, Tf32Fragments, atom_mn_stride, batch_operands, copies, gemm_params, issue_ahead, kernel_base,
    load_regs, refill, reg_tile, stage_loop, store_rounded, store_wgmma_tile, wgmma_dtypes,
};
use super::gemm_epilogue::{self, EpilogueKind};
use super::gemm_simt::tile_origin;
use crate::builder::{B32, BuildError, Cmp, Dim, F32, Kernel, KernelBuilder, Reg, Src, Target, U32, U64, WgmmaInput};

/// Bytes of one row of an operand tile (one 128-byte swizzled row): a k-tile
/// of 64 halves or 32 `f32`; 64 halves along m or n for an `m`/`n`-contiguous
/// operand.
const ROW: u32 = 128;
/// Depth of a k-tile of halves (an `m`/`n`-contiguous tile's atoms assume it).
const BK: u32 = ROW / 2;

/// How the `wgmma` kernel rounds `f32` inputs to TF32 (`wgmma` itself
/// would read an `f32`'s top 19 bits, dropping the rest).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tf32Rounding {
    /// Copied to shared memory by `cp.async`, then each thread rounds the
    /// values it copied in place: one more read and write of every tile.
    InShared,
    /// Loaded into registers one k-tile ahead, rounded there and stored:
    /// shared memory is written once, and the ring needs three stages only.
    InRegisters,
    /// Not rounded: `wgmma` reads the `f32` bits as they are (truncation,
    /// errors up to twice the TF32 bound). For measurements only.
    None,
    /// Rounded into temporaries by a separate element-wise pass
    /// ([`super::elementwise::round_tf32`]) before the GEMM, which then reads
    /// them as they are: one more read and write of `A` and `B` in memory,
    /// none in the GEMM's shared memory. The TMA kernel only (whose
    /// kernel is then the one of [`Tf32Rounding::None`]).
    BeforeKernel,
    /// `A` rounded in the registers of the warpgroups that multiply it, on
    /// its way to `wgmma` (`ldmatrix` from the stage, `cvt.rna`, `wgmma`
    /// with `A` from registers: `gemm_common::Tf32Fragments`); `B`
    /// rounded into a temporary by the pass of [`Tf32Rounding::BeforeKernel`].
    /// Shared memory is written once, and only `B` makes the extra trip
    /// through memory.
    ARegistersBBefore,
}

impl Tf32Rounding {
    /// Which operands (`A`, `B`) a separate pass rounds into temporaries
    /// before the kernel runs.
    pub fn rounded_before(self) -> (bool, bool) {
        match self {
            Tf32Rounding::BeforeKernel => (true, true),
            Tf32Rounding::ARegistersBBefore => (false, true),
            _ => (false, false),
        }
    }

    /// The kernel's suffix for this rounding: `""` in shared memory, `_rr`
    /// through registers, `_ra` `A` in registers, `_nr` none (also the
    /// kernel of [`Tf32Rounding::BeforeKernel`], whose operands come rounded).
    pub fn suffix(self) -> &'static str {
        match self {
            Tf32Rounding::InShared => "",
            Tf32Rounding::InRegisters => "_rr",
            Tf32Rounding::None | Tf32Rounding::BeforeKernel => "_nr",
            Tf32Rounding::ARegistersBBefore => "_ra",
        }
    }
}

/// Shape of the `wgmma` kernel. [`WgmmaConfig::default`] is the one the CUDA
/// backend launches on compute capability 9.0 for half inputs (chosen per
/// output by [`WgmmaConfig::for_shape`]), [`WgmmaConfig::tf32`] the one for
/// TF32; others are for tuning.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WgmmaConfig {
    /// Warpgroups per block; the block tile has `64 · warpgroups` rows.
    pub warpgroups: u32,
    /// Columns of the block tile, the `N` of each `wgmma` (64, 128, 192 or 256;
    /// the threads must split a row of its 16-byte chunks evenly).
    pub bn: u32,
    /// Shared-memory buffers in the ring (3..=8).
    pub stages: u32,
    /// Tile-rows per group in the block order (0: plain row-major order).
    pub group_m: u32,
    /// How `f32` inputs (TF32) are rounded before `wgmma` reads them.
    pub tf32: Tf32Rounding,
}

impl Default for WgmmaConfig {
    fn default() -> Self {
        WgmmaConfig { warpgroups: 2, bn: 256, stages: 4, group_m: 8, tf32: Tf32Rounding::InShared }
    }
}

impl WgmmaConfig {
    /// Rows of the block tile.
    pub fn bm(&self) -> u32 {
        64 * self.warpgroups
    }

    /// Threads per block: 128 per warpgroup.
    pub fn threads(&self) -> u32 {
        128 * self.warpgroups
    }

    /// Dynamic shared memory to launch with: the stages, plus 1 KiB so the
    /// tiles can start on a 1024-byte boundary.
    pub fn dynamic_shared_bytes(&self) -> u32 {
        self.stages * (self.bm() + self.bn) * ROW + 1024
    }

    /// Why this shape cannot be built, if it cannot.
    pub fn check(&self) -> Result<(), String> {
        let WgmmaConfig { warpgroups, bn, stages, .. } = *self;
        if !(1..=4).contains(&warpgroups) {
            return Err(format!("{warpgroups} warpgroups: need 1..=4"));
        }
        if !matches!(bn, 64 | 128 | 192 | 256) {
            return Err(format!("bn {bn}: need 64, 128, 192 or 256"));
        }
        if !(3..=8).contains(&stages) {
            return Err(format!("{stages} stages: need 3..=8"));
        }
        if self.tf32 == Tf32Rounding::BeforeKernel {
            return Err(
                "the cp.async kernel rounds A itself: both operands rounded before it is the TMA kernel's way".into()
            );
        }
        // 16-byte chunks of both tiles split evenly over the threads, whole
        // rows of chunks at a time in either stored layout.
        let t = self.threads();
        for tile in [self.bm(), bn] {
            if !(tile * BK / 8).is_multiple_of(t) || !t.is_multiple_of(tile / 8) {
                return Err(format!("{t} threads do not split a {tile}x{BK} tile into rows of 16-byte copies"));
            }
        }
        let max = 227 * 1024;
        if self.dynamic_shared_bytes() > max {
            return Err(format!("{} bytes of shared memory: above {max}", self.dynamic_shared_bytes()));
        }
        Ok(())
    }

    /// Kernel name: `gemm_wgmma_bf16_f32_nt` for the default shape (input
    /// dtype as the tensor cores read it, output dtype, transposes; `f32`
    /// inputs are read as TF32: `gemm_wgmma_tf32_f32_nt`), with the shape spelled out for others
    /// (`gemm_wgmma_bf16_f32_nt_128x128_s5_g8`).
    pub fn kernel_name(&self, input: DType, output: DType, trans_a: bool, trans_b: bool) -> String {
        let read_as = if input == DType::F32 { "tf32" } else { input.as_str() };
        let base = kernel_base("gemm_wgmma", read_as, output, trans_a, trans_b);
        if *self == WgmmaConfig::default() {
            base
        } else {
            let rounding = self.tf32.suffix();
            format!("{base}_{}x{}_s{}_g{}{rounding}", self.bm(), self.bn, self.stages, self.group_m)
        }
    }
}

/// The tile shapes [`WgmmaConfig::for_shape`] chooses from, with their
/// throughput relative to the default on a large product (bf16 8192³ with
/// `B` stored `n × k`, H100, `COMPUTE_PTX_GEMM_SWEEP=1 cuda_bench
/// --tensor-cores`, 2026-11-25: 634, 551 and 544 TFLOP/s). Each fits one
/// block per multiprocessor.
const TABLE: [(WgmmaConfig, f64); 3] = [
    (WgmmaConfig { warpgroups: 2, bn: 256, stages: 4, group_m: 8, tf32: Tf32Rounding::InShared }, 1.0),
    (WgmmaConfig { warpgroups: 1, bn: 256, stages: 5, group_m: 8, tf32: Tf32Rounding::InShared }, 0.87),
    (WgmmaConfig { warpgroups: 2, bn: 128, stages: 6, group_m: 8, tf32: Tf32Rounding::InShared }, 0.86),
];

impl WgmmaConfig {
    /// The tile shape for a `batch × m × n` output on `sms` multiprocessors:
    /// the one with the least estimated time, counting whole waves of blocks
    /// (one block per multiprocessor) times each block's work over the
    /// shape's relative throughput. Small outputs (`512 × 4096`) get smaller
    /// tiles so every multiprocessor has a block; large ones the default. Free.
    pub fn for_shape(batch: usize, m: usize, n: usize, sms: u32) -> WgmmaConfig {
        let sms = sms.max(1) as usize;
        let cost = |(cfg, speed): &(WgmmaConfig, f64)| {
            let blocks = batch.max(1) * m.div_ceil(cfg.bm() as usize) * n.div_ceil(cfg.bn as usize);
            let waves = blocks.div_ceil(sms) as f64;
            waves * f64::from(cfg.bm() * cfg.bn) / speed
        };
        TABLE.iter().min_by(|x, y| cost(x).total_cmp(&cost(y))).map(|(c, _)| *c).unwrap_or_default()
    }
}

impl WgmmaConfig {
    /// The shape the CUDA backend launches for `f32` products with TF32 opted
    /// in whose operands the TMA kernel cannot read: the default tile, `A`
    /// rounded in registers and `B` by a pass before the kernel
    /// ([`Tf32Rounding::ARegistersBBefore`]). On the H200 (2026-11-28) that
    /// ran at 0.84–0.88× cuBLAS's TF32 GEMM at 4096³ and 8192³, rounding
    /// both through registers ([`Tf32Rounding::InRegisters`], three stages)
    /// at 0.60–0.66×.
    pub fn tf32() -> WgmmaConfig {
        WgmmaConfig { tf32: Tf32Rounding::ARegistersBBefore, ..WgmmaConfig::default() }
    }
}

/// Other shapes the benchmark's sweep times next to the default.
pub fn sweep_configs() -> Vec<WgmmaConfig> {
    let d = WgmmaConfig::default();
    vec![
        WgmmaConfig { stages: 3, ..d },
        WgmmaConfig { bn: 128, stages: 6, ..d },
        WgmmaConfig { bn: 128, stages: 4, ..d },
        WgmmaConfig { warpgroups: 1, bn: 256, stages: 5, ..d },
        WgmmaConfig { group_m: 16, ..d },
    ]
}

/// TF32 shapes the benchmark's sweep times next to [`WgmmaConfig::tf32`]'s,
/// with the other ways of rounding ([`Tf32Rounding`]).
pub fn tf32_sweep_configs() -> Vec<WgmmaConfig> {
    let d = WgmmaConfig::default();
    vec![
        WgmmaConfig::tf32(),
        WgmmaConfig { tf32: Tf32Rounding::InRegisters, stages: 3, ..d },
        WgmmaConfig { tf32: Tf32Rounding::InShared, ..d },
        WgmmaConfig { tf32: Tf32Rounding::None, ..d },
    ]
}

/// Builds the `wgmma` kernel (target `sm_90a`) for one input dtype
/// (`f16`/`bf16`), output dtype (`f32`, `f16`, `bf16`) and transpose
/// combination (`A` stored `k × m` when `trans_a`, `B` stored `n × k` when `trans_b`).
///
/// Params: `a`, `b`, `c`, `m`, `n`, `k` (u32), `sa`, `sb`, `sc` (batch strides
/// in elements). Launch: [`WgmmaConfig::threads`] threads, grid
/// `(ceil(n/BN), ceil(m/BM), batch)`, [`WgmmaConfig::dynamic_shared_bytes`] of
/// dynamic shared memory; only shapes `MmaConfig::fits` accepts.
pub fn wgmma(
    cfg: &WgmmaConfig,
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
        return fail(format!("wgmma kernels are built for sm_90a, not {target}"));
    }
    // f32 inputs are multiplied as TF32 (the caller opted in), k-contiguous only.
    let (mma_in, out_half) = match wgmma_dtypes(input, output, (trans_a, trans_b)) {
        Ok(d) => d,
        Err(e) => return fail(e),
    };
    let elem = if mma_in == WgmmaInput::Tf32 { 4 } else { 2 };
    let bk = ROW / elem;
    let (bm, bn, stages) = (cfg.bm(), cfg.bn, cfg.stages);
    let threads = cfg.threads();
    let stage_bytes = (bm + bn) * ROW;

    let mut b = KernelBuilder::new(&name, target);
    b.doc(&format!(
        "{name}: C = {} * {}, {input} inputs, f32 accumulation, {output} output, wgmma.mma_async m64n{bn}k16",
        if trans_a { "A^T" } else { "A" },
        if trans_b { "B^T" } else { "B" }
    ));
    b.doc(&format!(
        "block tile {bm}x{bn}, k-tile {bk}, {} warpgroups, {stages} cp.async stages, 128-byte swizzle",
        cfg.warpgroups
    ));
    b.doc("params: a, b, c, m, n, k, sa, sb, sc (batch strides in elements)");
    b.doc(&format!(
        "launch: {threads} threads, grid (ceil(n/{bn}), ceil(m/{bm}), batch), {} bytes of dynamic shared memory",
        cfg.dynamic_shared_bytes()
    ));
    b.max_threads(threads);
    b.min_blocks_per_sm(1);
    gemm_epilogue::doc(&mut b, epilogue);
    let p = gemm_params(&mut b);
    let epi = gemm_epilogue::params(&mut b, epilogue);
    let (m, n, k) = (p.m, p.n, p.k);

    let smem = b.dynamic_shared("tiles", 1024);
    let raw = b.shared_base(&smem);
    b.comment("tiles start on a 1024-byte boundary (the swizzle's period)");
    let up = b.add(raw, 1023u32);
    let sbase = b.and(up, !1023u32);

    let tid = b.tid(Dim::X);
    let z = b.ctaid(Dim::Z);
    let (m0, n0) = tile_origin(&mut b, bm, bn, cfg.group_m);

    b.comment("copies: each thread's 16-byte chunks of both operand tiles");
    let za = b.cvt::<U64, U32>(z);
    let (a_base, b_base) = batch_operands(&mut b, &p, za, elem);
    // A stored m x k or (trans_a) k x m; B stored k x n or (trans_b) n x k.
    let a_side = Side { kmajor: !trans_a, tile: bm, bk, at: 0, atoms: true, elem };
    let b_side = Side { kmajor: trans_b, tile: bn, bk, at: bm * ROW, atoms: true, elem };
    let a_ld = if trans_a { m } else { k };
    let b_ld = if trans_b { k } else { n };
    let mut a_cp = copies(&mut b, a_side, threads, tid, a_base, a_ld, (m, m0));
    let mut b_cp = copies(&mut b, b_side, threads, tid, b_base, b_ld, (n, n0));
    for cp in [&mut a_cp, &mut b_cp] {
        for d in cp.dst.iter_mut() {
            let abs = b.add(*d, sbase);
            *d = abs;
        }
    }

    b.comment("descriptors of stage 0: this warpgroup's 64 rows of A, all of B");
    // (leading, stride, bytes per 16 values of k). k-contiguous: groups of 8 rows
    // 1024 bytes apart (stride), leading unused, 32 bytes per step. m/n-contiguous:
    // atoms atom_mn_stride apart along m or n (leading) and 1024 along k (stride),
    // 2048 bytes per step. Either way a warpgroup's 64 rows of A start
    // 64 * 128 = atom_mn_stride(64) bytes after the previous one's.
    let layout = |side: &Side| -> (u32, u32, u32) {
        if side.kmajor { (16, 1024, 32) } else { (atom_mn_stride(BK), ATOM_K_STRIDE, 2 * ATOM_K_STRIDE) }
    };
    let (a_lbo, a_sbo, a_step) = layout(&a_side);
    let (b_lbo, b_sbo, b_step) = layout(&b_side);
    let wg = b.shr(tid, 7u32);
    let a_rows = b.mul(wg, 64 * ROW);
    let a_addr = b.add(sbase, a_rows);
    let desc_a = b.smem_descriptor(a_addr, a_lbo, a_sbo);
    let b_addr = b.add(sbase, b_side.at);
    let desc_b = b.smem_descriptor(b_addr, b_lbo, b_sbo);
    let zero = b.mov(0u32);
    let always = b.setp(Cmp::Eq, zero, 0u32);

    let acc: Vec<Reg<F32>> = (0..bn / 2).map(|_| b.mov(0.0f32)).collect();

    let tf32 = if mma_in == WgmmaInput::Tf32 { Some(cfg.tf32) } else { None };
    // TF32 with A rounded in registers: this thread's fragments of A.
    let frags = (tf32 == Some(Tf32Rounding::ARegistersBBefore)).then(|| {
        let lane = b.and(tid, 31u32);
        let warp = b.shr(tid, 5u32);
        let warp = b.and(warp, 3u32);
        Tf32Fragments::new(&mut b, a_addr, warp, lane, bk / mma_in.k())
    });
    let issue_tile = |b: &mut KernelBuilder, s: u32| {
        let steps = bk / mma_in.k();
        // A's fragments of the whole tile, rounded, before the fence.
        let a_regs: Vec<[Reg<U32>; 4]> = frags.as_ref().map_or_else(Vec::new, |f| {
            let row = f.row_in(b, s * stage_bytes);
            (0..steps as usize).map(|ks| f.load_rounded(b, row, ks)).collect()
        });
        b.wgmma_fence();
        for ks in 0..steps {
            let b_at = u64::from((s * stage_bytes + ks * b_step) >> 4);
            if let Some(&a) = a_regs.get(ks as usize) {
                let db = b.add(desc_b, b_at);
                b.wgmma_mma_async_reg_a(mma_in, &acc, a, db, always, false);
            } else {
                let da = b.add(desc_a, u64::from((s * stage_bytes + ks * a_step) >> 4));
                let db = b.add(desc_b, b_at);
                b.wgmma_mma_async(mma_in, &acc, (da, db), always, (!a_side.kmajor, !b_side.kmajor));
            }
        }
        b.wgmma_commit();
    };
    b.blank();
    if tf32 == Some(Tf32Rounding::InRegisters) {
        // Each k-tile is loaded into registers one tile ahead, rounded to TF32
        // and stored while the tile before it is multiplied: at iteration t the
        // barrier makes tile t (stored at t - 1) visible and retires the wgmma
        // of tile t - 2 in every warpgroup, whose stage takes tile t + 1.
        b.comment("prologue: k-tile 0 rounded into stage 0, k-tile 1 in registers");
        let regs = [reg_tile(&mut b, &a_cp), reg_tile(&mut b, &b_cp)];
        let kload = b.mov(0u32);
        let load = |b: &mut KernelBuilder| {
            for (cp, t) in [&a_cp, &b_cp].into_iter().zip(&regs) {
                load_regs(b, cp, t, kload, k);
            }
            let next = b.add(kload, bk);
            b.assign(kload, next);
        };
        load(&mut b);
        for (cp, t) in [&a_cp, &b_cp].into_iter().zip(&regs) {
            store_rounded(&mut b, cp, t, 0);
        }
        load(&mut b);
        b.fence_proxy_async_shared();
        stage_loop(&mut b, k, (bk, stages), |b, s| {
            b.comment(&format!("stage {s}: its tile is stored and visible to wgmma in every thread"));
            b.bar_sync();
            issue_tile(b, s);
            b.comment("the next k-tile, rounded, into the stage the wgmma of two tiles ago read");
            for (cp, t) in [&a_cp, &b_cp].into_iter().zip(&regs) {
                store_rounded(b, cp, t, ((s + 1) % stages) * stage_bytes);
            }
            b.fence_proxy_async_shared();
            load(b);
            b.wgmma_wait(1);
        });
        b.wgmma_wait(0);
    } else {
        b.comment(&format!("prologue: k-tiles 0..{} in flight", stages - 2));
        let kload = issue_ahead(&mut b, [&a_cp, &b_cp], k, (stages - 2, stage_bytes, bk));
        stage_loop(&mut b, k, (bk, stages), |b, s| {
            b.comment(&format!("stage {s}: its tile landed and is visible to wgmma in every thread"));
            b.cp_async_wait(stages - 3);
            if tf32 == Some(Tf32Rounding::InShared) {
                // wgmma would read the f32 bits as TF32 by dropping the low 13 bits
                // (truncation); round this thread's own chunks to nearest first.
                for cp in [&a_cp, &b_cp] {
                    for &d in &cp.dst {
                        let off = i64::from(s * stage_bytes);
                        let v = b.ld_shared_v::<B32, 4>(d, off);
                        let r = v.map(|x| b.round_to_tf32(x));
                        b.st_shared_v::<B32, 4>(d, off, r.map(Src::from));
                    }
                }
            }
            b.fence_proxy_async_shared();
            b.bar_sync();
            issue_tile(b, s);
            b.comment("the previous tile's wgmma are done: its stage may be refilled after the next barrier");
            b.wgmma_wait(1);
            refill(b, [&a_cp, &b_cp], (kload, k), ((s + stages - 2) % stages) * stage_bytes, bk);
        });
        b.wgmma_wait(0);
        b.cp_async_wait(0);
    }

    b.blank();
    b.comment("epilogue: warp w of the warpgroup holds rows 16w+g and 16w+g+8, columns 8j+2t and 8j+2t+1");
    let esz = if out_half.is_some() { 2u32 } else { 4 };
    let lane = b.and(tid, 31u32);
    let warp = b.shr(tid, 5u32);
    let g = b.shr(lane, 2u32);
    let zc = b.mul(za, p.sc);
    let zc = b.mul(zc, u64::from(esz));
    let c_base = b.add(p.c, zc);
    let epi = epi.map(|e| e.at_batch(&mut b, zc));
    // Warp w of the block is warp w % 4 of warpgroup w / 4: rows 64·(w/4) + 16·(w%4) = 16w.
    let row0 = b.mad(warp, 16u32, g);
    let row0 = b.add(m0, row0);
    store_wgmma_tile(&mut b, &acc, (out_half, epi), (c_base, row0, n0), (m, n, lane));
    b.ret();
    b.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_outputs_get_smaller_tiles() {
        assert_eq!(WgmmaConfig::for_shape(1, 8192, 8192, 132), WgmmaConfig::default());
        assert_eq!(WgmmaConfig::for_shape(1, 4096, 4096, 132), WgmmaConfig::default());
        let small = WgmmaConfig::for_shape(1, 512, 4096, 132);
        assert!(small.bm() * small.bn < WgmmaConfig::default().bm() * WgmmaConfig::default().bn, "{small:?}");
        assert_eq!(TABLE[0].0, WgmmaConfig::default());
        for (cfg, _) in TABLE {
            assert!(cfg.check().is_ok(), "{cfg:?}");
        }
    }

    #[test]
    fn every_configuration_of_the_sweep_builds_for_sm90a_only() {
        for cfg in std::iter::once(WgmmaConfig::default()).chain(sweep_configs()) {
            for (i, o) in [(DType::BF16, DType::F32), (DType::F16, DType::F16), (DType::BF16, DType::BF16)] {
                for t in [(false, false), (false, true), (true, false), (true, true)] {
                    let k = wgmma(&cfg, i, o, t, None, Target::Sm90a);
                    assert!(k.is_ok(), "{cfg:?}: {:?}", k.err());
                    assert!(wgmma(&cfg, i, o, t, None, Target::Sm90).is_err());
                }
            }
        }
        let bad = WgmmaConfig { bn: 96, ..WgmmaConfig::default() };
        assert!(bad.check().is_err());
        // 24 chunks per 192-wide row do not divide 256 threads.
        assert!(WgmmaConfig { bn: 192, stages: 5, ..WgmmaConfig::default() }.check().is_err());
        let huge = WgmmaConfig { stages: 8, ..WgmmaConfig::default() };
        assert!(huge.check().is_err());
    }
}
