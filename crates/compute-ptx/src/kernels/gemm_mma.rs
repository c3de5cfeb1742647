//! The tensor-core GEMM for `f16` and `bf16` inputs: `mma.sync` (sm_80+),
//! `f32` accumulation, `f32`, `f16` or `bf16` output.
//!
//! Each block computes a `BM × BN` tile of `C` with `WARPS_M × WARPS_N` warps,
//! each warp a `BM/WARPS_M × BN/WARPS_N` tile as a grid of 16×8
//! `mma.m16n8k16` accumulators. Operand tiles of depth `BK` reach shared
//! memory by 16-byte `cp.async` copies in a ring of `stages` buffers (copies
//! for tile `t + stages − 1` are in flight while tile `t` is multiplied), and
//! reach registers by `ldmatrix.x4`, `.trans` for an operand stored with `m`
//! or `n` contiguous (`A` transposed, `B` not), so all four transposes run
//! the same loop without a transposing copy.
//!
//! Shared tiles keep the stored layout (rows of `BK` halves for a
//! `k`-contiguous operand, rows of `BM`/`BN` halves otherwise), and the 16-byte
//! chunks of each row are permuted by an XOR with the row index
//! ([`swizzle`]), so the eight rows one `ldmatrix` phase reads, and the chunks
//! one `cp.async` wave writes, fall in eight different bank groups: no bank
//! conflicts, no padding.
//!
//! Edges: rows and columns past `m`/`n` and depth past `k` are zero-filled by
//! the copies (`cp.async` with a source size of 0) and masked at the store, so
//! any `m`, `n` and `k` run the same loop. The 16-byte copies need each
//! operand's contiguous dimension to be a multiple of 8 (`k` for a
//! `k`-contiguous operand, `m` or `n` otherwise) and the paired stores need
//! `n` even ([`MmaConfig::fits`]); the backend runs other shapes through the
//! `f32` SIMT GEMM.
//!
//! The epilogue stores each accumulator pair straight from registers: 8 bytes
//! (`f32`) or 4 bytes (a rounded `half` pair) per lane, 32 or 16 contiguous
//! bytes per row and instruction.

use std::collections::HashMap;

use compute_core::DType;

pub use super::gemm_common::swizzle;
use super::gemm_common::{
    Side, batch_operands, copies, gemm_params, half_dtypes, issue_ahead, kernel_base, refill, stage_loop, store_pair,
    swizzle_reg,
};
use super::gemm_epilogue::{self, EpilogueKind};
use super::gemm_simt::tile_origin;
use crate::builder::{B32, BuildError, Cmp, Dim, F32, Kernel, KernelBuilder, Reg, Target, U32, U64};

/// The most shared memory a kernel may declare statically.
const MAX_STATIC_SHARED: u32 = 48 * 1024;

/// Shape of the tensor-core kernel. [`MmaConfig::default`] is the one the
/// CUDA backend launches; others are for tuning (`COMPUTE_PTX_GEMM_SWEEP`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MmaConfig {
    /// Rows of `C` per block (a multiple of 64).
    pub bm: u32,
    /// Columns of `C` per block (a multiple of 64).
    pub bn: u32,
    /// Depth of a shared-memory tile: 16, 32 or 64.
    pub bk: u32,
    /// Warps along `m`; each covers `bm / warps_m` rows (a multiple of 16).
    pub warps_m: u32,
    /// Warps along `n`; each covers `bn / warps_n` columns (a multiple of 16).
    pub warps_n: u32,
    /// Shared-memory buffers in the `cp.async` ring (2..=6).
    pub stages: u32,
    /// Tile-rows per group in the block order (0: plain row-major order).
    pub group_m: u32,
    /// Blocks per multiprocessor `ptxas` must fit (`.minnctapersm`; 0: no hint).
    pub min_blocks: u32,
}

impl Default for MmaConfig {
    fn default() -> Self {
        MmaConfig { bm: 128, bn: 128, bk: 64, warps_m: 2, warps_n: 2, stages: 3, group_m: 8, min_blocks: 2 }
    }
}

impl MmaConfig {
    /// Threads per block: 32 per warp.
    pub fn threads(&self) -> u32 {
        32 * self.warps_m * self.warps_n
    }

    /// Rows of `C` per warp.
    pub fn warp_m(&self) -> u32 {
        self.bm / self.warps_m.max(1)
    }

    /// Columns of `C` per warp.
    pub fn warp_n(&self) -> u32 {
        self.bn / self.warps_n.max(1)
    }

    /// Shared memory per block in bytes: `stages` buffers of both tiles.
    pub fn shared_bytes(&self) -> u32 {
        self.stages * (self.bm + self.bn) * self.bk * 2
    }

    /// Bytes of dynamic shared memory to launch with: the buffers when they
    /// exceed the 48 KiB a kernel may declare statically, else 0.
    pub fn dynamic_shared_bytes(&self) -> u32 {
        if self.shared_bytes() > MAX_STATIC_SHARED { self.shared_bytes() } else { 0 }
    }

    /// Whether the kernel takes the product: each operand's contiguous
    /// dimension a multiple of 8 (16-byte copies), `n` even (paired stores).
    /// The same for every configuration. Free.
    pub fn fits(m: usize, n: usize, k: usize, trans_a: bool, trans_b: bool) -> bool {
        let a_contig = if trans_a { m } else { k };
        let b_contig = if trans_b { k } else { n };
        a_contig.is_multiple_of(8) && b_contig.is_multiple_of(8) && n.is_multiple_of(2)
    }

    /// Why this shape cannot be built for `target`, if it cannot.
    pub fn check(&self, target: Target) -> Result<(), String> {
        let MmaConfig { bm, bn, bk, warps_m, warps_n, stages, .. } = *self;
        if !matches!(bk, 16 | 32 | 64) {
            return Err(format!("bk {bk}: need 16, 32 or 64"));
        }
        if bm == 0 || bn == 0 || !bm.is_multiple_of(64) || !bn.is_multiple_of(64) {
            return Err(format!("tile {bm}x{bn}: need multiples of 64"));
        }
        if warps_m == 0 || warps_n == 0 || self.threads() > 1024 {
            return Err(format!("{warps_m}x{warps_n} warps: need 1..=32 warps"));
        }
        if !bm.is_multiple_of(warps_m * 16) || !bn.is_multiple_of(warps_n * 16) {
            return Err(format!("warp tile {}x{}: need multiples of 16", bm / warps_m, bn / warps_n));
        }
        if !(2..=6).contains(&stages) {
            return Err(format!("{stages} stages: need 2..=6"));
        }
        let t = self.threads();
        for (tile, name) in [(bm, "A"), (bn, "B")] {
            // Both stored layouts: rows of bk halves, or rows of `tile` halves.
            for cpr in [bk / 8, tile / 8] {
                if !t.is_multiple_of(cpr) || !(tile * bk / 8).is_multiple_of(t) {
                    return Err(format!("{name}: {t} threads do not split a {tile}x{bk} tile into 16-byte copies"));
                }
            }
        }
        let max = match target {
            Target::Sm80 => 163 * 1024,
            Target::Sm90 | Target::Sm90a => 227 * 1024,
        };
        if self.shared_bytes() > max {
            return Err(format!(
                "{} bytes of shared memory: above {max}, the most a block has on {target}",
                self.shared_bytes()
            ));
        }
        Ok(())
    }

    /// Kernel name: `gemm_mma_bf16_f32_nt` for the default shape (input dtype,
    /// output dtype, transposes), with the shape spelled out for others
    /// (`gemm_mma_bf16_f32_nt_128x256x32_w2x4_s3_g8_m1`).
    pub fn kernel_name(&self, input: DType, output: DType, trans_a: bool, trans_b: bool) -> String {
        let base = kernel_base("gemm_mma", input.as_str(), output, trans_a, trans_b);
        if *self == MmaConfig::default() {
            base
        } else {
            format!(
                "{base}_{}x{}x{}_w{}x{}_s{}_g{}_m{}",
                self.bm, self.bn, self.bk, self.warps_m, self.warps_n, self.stages, self.group_m, self.min_blocks
            )
        }
    }
}

/// Other shapes the benchmark's sweep times next to the default
/// (`COMPUTE_PTX_GEMM_SWEEP=1`): wider and taller block tiles, deeper k-tiles,
/// more or fewer stages.
pub fn sweep_configs() -> Vec<MmaConfig> {
    let d = MmaConfig::default();
    vec![
        MmaConfig { bk: 32, stages: 4, ..d },
        MmaConfig { bk: 32, stages: 3, ..d },
        MmaConfig { stages: 4, min_blocks: 1, ..d },
        MmaConfig { bn: 256, warps_n: 4, min_blocks: 1, ..d },
        MmaConfig { bn: 256, warps_n: 4, bk: 32, min_blocks: 1, ..d },
        MmaConfig { bm: 256, warps_m: 4, bk: 32, min_blocks: 1, ..d },
        MmaConfig { warps_n: 4, bk: 32, stages: 4, min_blocks: 1, ..d },
    ]
}

/// Shared addresses of one operand's `ldmatrix` rows for this lane: the row
/// `rbase + lrow + R` and chunk `cbase + lchunk + C` of the tile, for the
/// constants `R` (a multiple of 8) and `C` of each fragment. The swizzle
/// depends on the row only through `lrow` (its period is 8 rows) and changes
/// only the low 3 bits of the chunk, so one register per distinct `C mod 8`
/// serves every fragment, the rest being an immediate offset.
struct Frags {
    side: Side,
    lrow: Reg<U32>,
    lchunk: Reg<U32>,
    rbase: Reg<U32>,
    cbase: Reg<U32>,
    /// The shared window's address of the tiles.
    sbase: Reg<U32>,
    regs: HashMap<u32, Reg<U32>>,
}

impl Frags {
    fn at(&mut self, b: &mut KernelBuilder, r_const: u32, c_const: u32) -> (Reg<U32>, i64) {
        debug_assert!(r_const.is_multiple_of(8));
        let low = c_const % 8;
        let side = self.side;
        let (lrow, lchunk, rbase, cbase, sbase) = (self.lrow, self.lchunk, self.rbase, self.cbase, self.sbase);
        let reg = *self.regs.entry(low).or_insert_with(|| {
            let row = b.add(rbase, lrow);
            let c0 = b.add(cbase, lchunk);
            let c = b.add(c0, low);
            let pc = swizzle_reg(b, row, c, side.cpr());
            let pc16 = b.shl(pc, 4u32);
            let off = b.mad(row, side.row_bytes(), pc16);
            let off = b.add(off, side.at);
            b.add(off, sbase)
        });
        let imm = r_const * side.row_bytes() + (c_const - low) * 16;
        (reg, i64::from(imm))
    }
}

/// The warp tile's fragments: `A` rows `lrow ∈ 0..16` of a 16×16 block and
/// `B` rows of two 8-column blocks, laid out for `ldmatrix.x4` (module doc).
fn frag_lanes(b: &mut KernelBuilder, lane: Reg<U32>, operand_a: bool, kmajor: bool) -> (Reg<U32>, Reg<U32>) {
    let l7 = b.and(lane, 7u32);
    let bit3 = b.shr(lane, 3u32);
    let bit3 = b.and(bit3, 1u32);
    let bit4 = b.shr(lane, 4u32);
    match (operand_a, kmajor) {
        // A stored m×k: lanes 0–15 rows 0–15 at chunk 0, lanes 16–31 at chunk 1.
        (true, true) => (b.and(lane, 15u32), bit4),
        // A stored k×m, B stored n×k: rows (k or n) l%8 + 8·(l/16), chunk (l/8)%2.
        (true, false) | (false, true) => {
            let hi = b.shl(bit4, 3u32);
            (b.add(l7, hi), bit3)
        }
        // B stored k×n: rows (k) l%8 + 8·((l/8)%2), chunk l/16.
        (false, false) => {
            let hi = b.shl(bit3, 3u32);
            (b.add(l7, hi), bit4)
        }
    }
}

/// Builds the tensor-core kernel for one input dtype (`f16`/`bf16`), output
/// dtype (`f32`, `f16`, `bf16`) and transpose combination.
///
/// Params: `a`, `b`, `c`, `m`, `n`, `k` (u32), `sa`, `sb`, `sc` (batch strides
/// in elements). Launch: [`MmaConfig::threads`] threads, grid
/// `(ceil(n/BN), ceil(m/BM), batch)`, [`MmaConfig::dynamic_shared_bytes`] of
/// dynamic shared memory; only shapes [`MmaConfig::fits`] accepts.
pub fn mma(
    cfg: &MmaConfig,
    input: DType,
    output: DType,
    (trans_a, trans_b): (bool, bool),
    epilogue: Option<EpilogueKind>,
    target: Target,
) -> Result<Kernel, BuildError> {
    let name = cfg.kernel_name(input, output, trans_a, trans_b) + &EpilogueKind::suffix(epilogue);
    let fail = |p: String| Err(BuildError { kernel: name.clone(), problems: vec![p] });
    if let Err(e) = cfg.check(target) {
        return fail(e);
    }
    let (half, out_half) = match half_dtypes(input, output) {
        Ok(h) => h,
        Err(e) => return fail(e),
    };
    let MmaConfig { bm, bn, bk, stages, min_blocks, .. } = *cfg;
    let threads = cfg.threads();
    let (wm_rows, wn_cols) = (cfg.warp_m(), cfg.warp_n());
    let (mi_n, ni_n, ks_n) = (wm_rows / 16, wn_cols / 8, bk / 16);

    let mut b = KernelBuilder::new(&name, target);
    b.doc(&format!(
        "{name}: C = {} * {}, {input} inputs, f32 accumulation, {output} output, mma.sync.m16n8k16",
        if trans_a { "A^T" } else { "A" },
        if trans_b { "B^T" } else { "B" }
    ));
    b.doc(&format!(
        "block tile {bm}x{bn}, k-tile {bk}, {}x{} warps of {wm_rows}x{wn_cols}, {stages} cp.async stages",
        cfg.warps_m, cfg.warps_n
    ));
    b.doc("params: a, b, c, m, n, k, sa, sb, sc (batch strides in elements)");
    b.doc(&format!(
        "launch: {threads} threads, grid (ceil(n/{bn}), ceil(m/{bm}), batch), {} bytes of dynamic shared memory",
        cfg.dynamic_shared_bytes()
    ));
    b.max_threads(threads);
    if min_blocks > 0 {
        b.min_blocks_per_sm(min_blocks);
    }
    gemm_epilogue::doc(&mut b, epilogue);
    let p = gemm_params(&mut b);
    let epi = gemm_epilogue::params(&mut b, epilogue);
    let (m, n, k) = (p.m, p.n, p.k);

    let a_side = Side { kmajor: !trans_a, tile: bm, bk, at: 0, atoms: false, elem: 2 };
    let b_side = Side { kmajor: trans_b, tile: bn, bk, at: bm * bk * 2, atoms: false, elem: 2 };
    let stage_bytes = (bm + bn) * bk * 2;
    let smem = if cfg.dynamic_shared_bytes() > 0 {
        b.dynamic_shared("tiles", 128)
    } else {
        b.shared("tiles", stages * stage_bytes, 128)
    };
    let sbase = b.shared_base(&smem);

    let tid = b.tid(Dim::X);
    let z = b.ctaid(Dim::Z);
    let (m0, n0) = tile_origin(&mut b, bm, bn, cfg.group_m);

    b.comment("copies: each thread's 16-byte chunks of both operand tiles");
    let za = b.cvt::<U64, U32>(z);
    let (a_base, b_base) = batch_operands(&mut b, &p, za, 2);
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

    b.comment("fragments: this lane's ldmatrix row addresses");
    let lane = b.and(tid, 31u32);
    let warp = b.shr(tid, 5u32);
    let wm = b.div(warp, cfg.warps_n);
    let wn = b.rem(warp, cfg.warps_n);
    let zero = b.mov(0u32);
    let mut a_fr = {
        let (lrow, lchunk) = frag_lanes(&mut b, lane, true, a_side.kmajor);
        let w0 = b.mul(wm, wm_rows);
        let (rbase, cbase) = if a_side.kmajor { (w0, zero) } else { (zero, b.shr(w0, 3u32)) };
        Frags { side: a_side, lrow, lchunk, rbase, cbase, sbase, regs: HashMap::new() }
    };
    let mut b_fr = {
        let (lrow, lchunk) = frag_lanes(&mut b, lane, false, b_side.kmajor);
        let w0 = b.mul(wn, wn_cols);
        let (rbase, cbase) = if b_side.kmajor { (w0, zero) } else { (zero, b.shr(w0, 3u32)) };
        Frags { side: b_side, lrow, lchunk, rbase, cbase, sbase, regs: HashMap::new() }
    };
    // Every fragment address, resolved once: (register, immediate) per (index, k-step).
    let mut a_at = Vec::new();
    for mi in 0..mi_n {
        for ks in 0..ks_n {
            a_at.push(if a_side.kmajor { a_fr.at(&mut b, mi * 16, ks * 2) } else { a_fr.at(&mut b, ks * 16, mi * 2) });
        }
    }
    let mut b_at = Vec::new();
    for nj in 0..ni_n / 2 {
        for ks in 0..ks_n {
            b_at.push(if b_side.kmajor { b_fr.at(&mut b, nj * 16, ks * 2) } else { b_fr.at(&mut b, ks * 16, nj * 2) });
        }
    }

    let acc: Vec<[Reg<F32>; 4]> = (0..mi_n * ni_n).map(|_| std::array::from_fn(|_| b.mov(0.0f32))).collect();

    b.blank();
    b.comment(&format!("prologue: k-tiles 0..{} in flight", stages - 1));
    let kload = issue_ahead(&mut b, [&a_cp, &b_cp], k, (stages - 1, stage_bytes, bk));
    stage_loop(&mut b, k, (bk, stages), |b, s| {
        b.comment(&format!("stage {s}: wait for its tile, refill the stage read last"));
        b.cp_async_wait(stages - 2);
        b.bar_sync();
        refill(b, [&a_cp, &b_cp], (kload, k), ((s + stages - 1) % stages) * stage_bytes, bk);
        let stage_off = i64::from(s * stage_bytes);
        for ks in 0..ks_n {
            let afr: Vec<[Reg<B32>; 4]> = (0..mi_n)
                .map(|mi| {
                    let (r, off) = a_at[(mi * ks_n + ks) as usize];
                    b.ldmatrix_x4(r, off + stage_off, !a_side.kmajor)
                })
                .collect();
            let bfr: Vec<[Reg<B32>; 4]> = (0..ni_n / 2)
                .map(|nj| {
                    let (r, off) = b_at[(nj * ks_n + ks) as usize];
                    b.ldmatrix_x4(r, off + stage_off, !b_side.kmajor)
                })
                .collect();
            for mi in 0..mi_n {
                for ni in 0..ni_n {
                    let x4 = bfr[(ni / 2) as usize];
                    let pair = if ni % 2 == 0 { [x4[0], x4[1]] } else { [x4[2], x4[3]] };
                    b.mma_m16n8k16_acc(half, acc[(mi * ni_n + ni) as usize], afr[mi as usize], pair);
                }
            }
        }
    });
    b.cp_async_wait(0);

    b.blank();
    b.comment("epilogue: each lane's pairs (rows g and g+8 of each 16x8 tile, columns 2t, 2t+1)");
    let esz = if out_half.is_some() { 2u32 } else { 4 };
    let g = b.shr(lane, 2u32);
    let t = b.and(lane, 3u32);
    let t2 = b.shl(t, 1u32);
    let wn0 = b.mul(wn, wn_cols);
    let col0 = b.add(n0, wn0);
    let col = b.add(col0, t2);
    let zc = b.mul(za, p.sc);
    let zc = b.mul(zc, u64::from(esz));
    let c_base = b.add(p.c, zc);
    let epi = epi.map(|e| e.at_batch(&mut b, zc));
    let col_off = if epi.is_some() { Some(b.mul_wide(col, esz)) } else { None };
    let wm0 = b.mul(wm, wm_rows);
    let row0 = b.add(m0, wm0);
    let row0 = b.add(row0, g);
    let col_ok: Vec<_> = (0..ni_n)
        .map(|ni| {
            let c = b.add(col, ni * 8);
            b.setp(Cmp::Lt, c, n)
        })
        .collect();
    for mi in 0..mi_n {
        for h in 0..2u32 {
            let row = b.add(row0, mi * 16 + h * 8);
            let row_ok = b.setp(Cmp::Lt, row, m);
            let elem = b.mad(row, n, col);
            let off = b.mul_wide(elem, esz);
            let row_ptr = b.add(c_base, off);
            for ni in 0..ni_n {
                let v = acc[(mi * ni_n + ni) as usize];
                let (lo, hi) = (v[(2 * h) as usize], v[(2 * h + 1) as usize]);
                let ok = b.and_pred(row_ok, col_ok[ni as usize]);
                let at = i64::from(ni * 8 * esz);
                let (lo, hi) = match (&epi, col_off) {
                    (Some(e), Some(col_off)) => e.pair(&mut b, out_half, (off, col_off, at), (lo, hi), ok),
                    _ => (lo, hi),
                };
                store_pair(&mut b, out_half, (row_ptr, at), (lo, hi), ok);
            }
        }
    }
    b.ret();
    b.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eight_rows_at_one_chunk_hit_eight_bank_groups() {
        for cpr in [2u32, 4, 8, 16, 32] {
            let row_bytes = cpr * 16;
            for c in 0..cpr {
                for r0 in (0..64).step_by(8) {
                    let mut groups: Vec<u32> =
                        (r0..r0 + 8).map(|r| ((r * row_bytes + swizzle(r, c, cpr) * 16) / 16) % 8).collect();
                    groups.sort_unstable();
                    groups.dedup();
                    assert_eq!(groups.len(), 8, "cpr {cpr}, chunk {c}, rows {r0}..");
                }
            }
            // A permutation of each row's chunks.
            for r in 0..16 {
                let mut p: Vec<u32> = (0..cpr).map(|c| swizzle(r, c, cpr)).collect();
                p.sort_unstable();
                assert_eq!(p, (0..cpr).collect::<Vec<_>>());
            }
        }
    }

    #[test]
    fn every_configuration_of_the_sweep_builds() {
        for cfg in std::iter::once(MmaConfig::default()).chain(sweep_configs()) {
            for target in Target::ALL {
                for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
                    let k = mma(&cfg, DType::BF16, DType::F32, (ta, tb), None, target);
                    assert!(k.is_ok(), "{cfg:?} {target}: {:?}", k.err());
                }
            }
        }
    }

    #[test]
    fn bad_shapes_and_dtypes_are_refused() {
        let bad = MmaConfig { bk: 24, ..MmaConfig::default() };
        assert!(mma(&bad, DType::BF16, DType::F32, (false, false), None, Target::Sm90).is_err());
        let huge = MmaConfig { bm: 256, bn: 256, bk: 64, stages: 6, ..MmaConfig::default() };
        assert!(huge.check(Target::Sm90).is_err());
        assert!(mma(&MmaConfig::default(), DType::F32, DType::F32, (false, false), None, Target::Sm90).is_err());
        assert!(MmaConfig::fits(64, 64, 64, false, false));
        assert!(!MmaConfig::fits(64, 64, 60, false, false));
        assert!(MmaConfig::fits(60, 64, 64, false, true));
        assert!(!MmaConfig::fits(60, 64, 64, true, false));
        assert!(!MmaConfig::fits(64, 63, 64, false, true));
    }
}
