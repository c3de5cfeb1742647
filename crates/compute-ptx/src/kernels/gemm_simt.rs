//! The register-blocked SIMT GEMM: the fast fp32 tier (no tensor cores).
//!
//! Each block computes a `BM × BN` tile of `C`; each thread a `TM × TN` block
//! of it, as `TM/4 × TN/4` sub-blocks of 4×4 spread `4·TY` rows and `4·TX`
//! columns apart, with each warp's threads laid out as a 4×8 tile, so a warp's
//! shared-memory fragment reads touch 4 and 8 distinct `float4`s (broadcasts,
//! no bank conflicts). `A` and `B` tiles of depth `BK` are double-buffered in
//! shared memory, stored `k`-major (`As[k][m]`, `Bs[k][n]`, rows padded by 4
//! floats so the transposing stores of a `k`-contiguous operand do not
//! conflict). The operand whose rows already run along m/n (`A` transposed,
//! `B` not) is copied with `cp.async` straight into the next stage; the other
//! is loaded into registers (`ld.global.nc.v4`) before the current tile's
//! `BK·TM·TN` `fma`s and stored, transposed, after them: one barrier per tile.
//! Edges (any `m`, `k`, `n`) fall back to predicated scalar loads (or 4-byte
//! `cp.async` with zero fill), and to scalar stores; a `float4` path needs the
//! contiguous dimension to be a multiple of 4. Blocks are visited in groups of
//! `group_m` tile-rows for L2 reuse. The transposes are compile-time variants:
//! `nn`, `nt`, `tn`, `tt` (`t`: that operand is stored transposed).

use crate::builder::{BuildError, Cmp, Dim, F32, Kernel, KernelBuilder, Pred, Reg, Src, Target, U32, U64};

/// Shape of the register-blocked kernel. [`SimtConfig::default`] is the
/// checked-in one (the fastest measured on an H200, see `docs/ptx.md`); other
/// shapes are for tuning and tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SimtConfig {
    /// Rows of `C` per block.
    pub bm: u32,
    /// Columns of `C` per block.
    pub bn: u32,
    /// Depth of a shared-memory tile.
    pub bk: u32,
    /// Rows per thread (multiple of 4).
    pub tm: u32,
    /// Columns per thread (multiple of 4).
    pub tn: u32,
    /// Tile-rows per group in the block order (0: plain row-major order).
    pub group_m: u32,
    /// Blocks per multiprocessor `ptxas` must fit (`.minnctapersm`; 0: no hint).
    pub min_blocks: u32,
    /// Copy the operand tiles that need no transposition (`A` stored transposed,
    /// `B` not) straight into shared memory with `cp.async` (sm_80+), skipping
    /// registers; the others still go through registers.
    pub async_copy: bool,
    /// Lay each warp's threads out as 4×8 thread tiles (else 2×16): a warp's
    /// shared-memory fragment reads then touch 4 and 8 distinct `float4`s, one
    /// wavefront each.
    pub warp_tiled: bool,
}

impl Default for SimtConfig {
    fn default() -> Self {
        SimtConfig {
            bm: 128,
            bn: 128,
            bk: 8,
            tm: 8,
            tn: 8,
            group_m: 8,
            min_blocks: 2,
            async_copy: true,
            warp_tiled: true,
        }
    }
}

impl SimtConfig {
    /// Threads per block: `(BM/TM)·(BN/TN)`.
    pub fn threads(&self) -> u32 {
        (self.bm / self.tm.max(1)) * (self.bn / self.tn.max(1))
    }

    /// Shared memory per block in bytes (two stages of both tiles).
    pub fn shared_bytes(&self) -> u32 {
        2 * self.bk * ((self.bm + 4) + (self.bn + 4)) * 4
    }

    /// Why this shape cannot be built, if it cannot.
    pub fn check(&self) -> Result<(), String> {
        let SimtConfig { bm, bn, bk, tm, tn, .. } = *self;
        if tm == 0 || tn == 0 || tm % 4 != 0 || tn % 4 != 0 {
            return Err(format!("thread tile {tm}x{tn}: both must be non-zero multiples of 4"));
        }
        if bm % tm != 0 || bn % tn != 0 || bk == 0 || bk % 4 != 0 {
            return Err(format!(
                "block tile {bm}x{bn}x{bk} does not divide into {tm}x{tn} thread tiles and k-steps of 4"
            ));
        }
        let t = self.threads();
        if !(32..=1024).contains(&t) || !t.is_multiple_of(32) {
            return Err(format!("{t} threads per block: need a multiple of 32 in 32..=1024"));
        }
        if !(bk / 4).is_power_of_two() || !(bm / 4).is_power_of_two() || !(bn / 4).is_power_of_two() {
            return Err(format!("bk/4, bm/4 and bn/4 must be powers of two (got {bk}, {bm}, {bn})"));
        }
        if !t.is_multiple_of(bm / 4) || !t.is_multiple_of(bn / 4) || !t.is_multiple_of(bk / 4) {
            return Err(format!("{t} threads do not cover whole rows of the {bm}x{bk} and {bk}x{bn} tiles"));
        }
        if (bm * bk / 4) % t != 0 || (bn * bk / 4) % t != 0 {
            return Err(format!(
                "tiles of {bm}x{bk} and {bk}x{bn} do not split evenly into float4 loads over {t} threads"
            ));
        }
        if self.warp_tiled && ((bn / tn) % 8 != 0 || (bm / tm) % 4 != 0) {
            return Err(format!("warp tiling needs {}x{} thread tiles in multiples of 4x8", bm / tm, bn / tn));
        }
        if self.shared_bytes() > 48 * 1024 {
            return Err(format!("{} bytes of shared memory: above the 48 KiB static limit", self.shared_bytes()));
        }
        Ok(())
    }

    /// Kernel name: `gemm_simt_nn` for the default shape, with the shape spelled
    /// out for others (`gemm_simt_nn_128x128x16_8x8_g8_m2`).
    pub fn kernel_name(&self, trans_a: bool, trans_b: bool) -> String {
        let t = format!("{}{}", if trans_a { 't' } else { 'n' }, if trans_b { 't' } else { 'n' });
        if *self == SimtConfig::default() {
            format!("gemm_simt_{t}")
        } else {
            format!(
                "gemm_simt_{t}_{}x{}x{}_{}x{}_g{}_m{}{}{}",
                self.bm,
                self.bn,
                self.bk,
                self.tm,
                self.tn,
                self.group_m,
                self.min_blocks,
                if self.async_copy { "_async" } else { "" },
                if self.warp_tiled { "_wt" } else { "" }
            )
        }
    }
}

/// The loads of one operand's tile a thread does: `slots` 16-byte loads whose
/// addresses, indices and shared-memory offsets differ from slot 0's by
/// constants (or, for addresses, by a multiple of the leading dimension), so
/// only slot 0's state lives in registers through the loop.
struct OperandLoads {
    /// The four elements of a slot run along `k` (stored transposed).
    kcontig: bool,
    /// Copied with `cp.async` straight into shared memory (no staging).
    direct: bool,
    slots: u32,
    /// Slot 0's global address this tile (advances every tile).
    ptr: Reg<U64>,
    /// Slot 0's `k` index this tile (advances by BK).
    kidx: Reg<U32>,
    /// Slot 0's index along m/n (its row if `kcontig`, else its first element).
    mn_idx: Reg<U32>,
    /// Extent of m/n, and the stored row length.
    mn: Reg<U32>,
    ld: Reg<U32>,
    /// The row length is a multiple of 4 (the `float4` path is aligned).
    aligned: Reg<Pred>,
    /// Slot `l` is `l·row_step` rows further along the stored rows (m/n rows if
    /// `kcontig`, else k rows): `l·row_step·ld` elements and, if `kcontig`,
    /// `l·row_step` along m/n, else along k.
    row_step: u32,
    /// Slot 0's shared-memory byte address within stage 0.
    st_addr: Reg<U32>,
    /// Shared-memory bytes between consecutive slots, and between consecutive k.
    st_step: u32,
    smem_row: u32,
    /// The operand's base address for this batch (a valid source for the
    /// zero-byte copies of out-of-bounds elements).
    base: Reg<U64>,
    /// Staging registers per slot (none when `direct`).
    regs: Vec<[Reg<F32>; 4]>,
}

struct Operand<'a> {
    base: Reg<U64>,
    batch: Reg<U32>,
    batch_stride: Reg<U64>,
    /// `k` runs along the stored rows (contiguous): A not transposed, B transposed.
    kcontig: bool,
    /// Extent of the m/n dimension and its block origin.
    mn: Reg<U32>,
    mn0: Reg<U32>,
    /// Rows of the tile along m/n (BM or BN).
    tile_mn: u32,
    /// Leading dimension of the stored matrix (its row length).
    ld: Reg<U32>,
    name: &'a str,
}

fn operand_loads(
    b: &mut KernelBuilder,
    cfg: &SimtConfig,
    op: &Operand,
    tid: Reg<U32>,
    sbase: Reg<U32>,
    region: u32,
) -> OperandLoads {
    b.comment(&format!("{} tile loads", op.name));
    let threads = cfg.threads();
    let slots = op.tile_mn * cfg.bk / 4 / threads;
    let row = (op.tile_mn + 4) * 4;
    let z64 = b.cvt::<U64, U32>(op.batch);
    let zoff = b.mul(z64, op.batch_stride);
    let zbytes = b.shl(zoff, 2u32);
    let base = b.add(op.base, zbytes);
    let ld_low = b.and(op.ld, 3u32);
    let aligned = b.setp(Cmp::Eq, ld_low, 0u32);
    let direct = cfg.async_copy && !op.kcontig;
    let (ptr, kidx, mn_idx, row_step, st_addr, st_step) = if op.kcontig {
        // Float4 f = tid + l·T → (m/n row f / (BK/4), k quad f % (BK/4)).
        let r = b.shr(tid, (cfg.bk / 4).trailing_zeros());
        let kq = b.and(tid, cfg.bk / 4 - 1);
        let kq = b.shl(kq, 2u32);
        let gr = b.add(op.mn0, r);
        let e = b.mul_wide(gr, op.ld);
        let kq64 = b.cvt::<U64, U32>(kq);
        let e = b.add(e, kq64);
        let bytes = b.shl(e, 2u32);
        let ptr = b.add(base, bytes);
        // Shared As[kq + j][r]: byte (kq·row + 4r).
        let sa = b.mul(kq, row);
        let r4 = b.shl(r, 2u32);
        let sa = b.add(sa, r4);
        let sa = b.add(sa, sbase);
        let row_step = threads / (cfg.bk / 4);
        (ptr, kq, gr, row_step, sa, row_step * 4)
    } else {
        // Float4 f → (k row f / (TILE/4), m/n quad f % (TILE/4)).
        let quads = op.tile_mn / 4;
        let kk = b.shr(tid, quads.trailing_zeros());
        let q = b.and(tid, quads - 1);
        let q = b.shl(q, 2u32);
        let gq = b.add(op.mn0, q);
        let e = b.mul_wide(kk, op.ld);
        let gq64 = b.cvt::<U64, U32>(gq);
        let e = b.add(e, gq64);
        let bytes = b.shl(e, 2u32);
        let ptr = b.add(base, bytes);
        // Shared Bs[kk][q..q+3]: byte (kk·row + 4q).
        let sa = b.mul(kk, row);
        let q4 = b.shl(q, 2u32);
        let sa = b.add(sa, q4);
        let sa = b.add(sa, sbase);
        let row_step = threads / quads;
        (ptr, kk, gq, row_step, sa, row_step * row)
    };
    let st_addr = b.add(st_addr, region);
    let regs = if direct {
        Vec::new()
    } else {
        (0..slots).map(|_| [b.mov(0.0f32), b.mov(0.0f32), b.mov(0.0f32), b.mov(0.0f32)]).collect()
    };
    OperandLoads {
        kcontig: op.kcontig,
        direct,
        slots,
        ptr,
        kidx,
        mn_idx,
        mn: op.mn,
        ld: op.ld,
        aligned,
        row_step,
        st_addr,
        st_step,
        smem_row: row,
        base,
        regs,
    }
}

/// Slot `l`'s (address, k index, m/n index), derived from slot 0's.
fn slot_state(b: &mut KernelBuilder, o: &OperandLoads, l: u32) -> (Reg<U64>, Reg<U32>, Reg<U32>) {
    if l == 0 {
        return (o.ptr, o.kidx, o.mn_idx);
    }
    let d = b.mul_wide(o.ld, 4 * l * o.row_step);
    let ptr = b.add(o.ptr, d);
    if o.kcontig {
        let mn = b.add(o.mn_idx, l * o.row_step);
        (ptr, o.kidx, mn)
    } else {
        let k = b.add(o.kidx, l * o.row_step);
        (ptr, k, o.mn_idx)
    }
}

/// Whether slot state `(kidx, mn_idx)` can load its four elements as one
/// aligned `float4` this tile.
fn slot_full(b: &mut KernelBuilder, o: &OperandLoads, kidx: Reg<U32>, mn_idx: Reg<U32>, k: Reg<U32>) -> Reg<Pred> {
    let (kin, mnin) = if o.kcontig {
        let k3 = b.add(kidx, 3u32);
        (b.setp(Cmp::Lt, k3, k), b.setp(Cmp::Lt, mn_idx, o.mn))
    } else {
        let m3 = b.add(mn_idx, 3u32);
        (b.setp(Cmp::Lt, kidx, k), b.setp(Cmp::Lt, m3, o.mn))
    };
    let both = b.and_pred(kin, mnin);
    b.and_pred(both, o.aligned)
}

/// Whether element `j` of a slot's four is inside the matrix.
fn elem_ok(
    b: &mut KernelBuilder,
    o: &OperandLoads,
    kidx: Reg<U32>,
    mn_idx: Reg<U32>,
    k: Reg<U32>,
    j: u32,
) -> Reg<Pred> {
    if o.kcontig {
        let kj = b.add(kidx, j);
        let kin = b.setp(Cmp::Lt, kj, k);
        let mnin = b.setp(Cmp::Lt, mn_idx, o.mn);
        b.and_pred(kin, mnin)
    } else {
        let mj = b.add(mn_idx, j);
        let mnin = b.setp(Cmp::Lt, mj, o.mn);
        let kin = b.setp(Cmp::Lt, kidx, k);
        b.and_pred(kin, mnin)
    }
}

/// Issues the global loads of one tile: `cp.async` for direct operands (into
/// `stage` of shared memory, then one commit), the staging registers for the
/// others. Edge slots fall back to element-wise predicated loads (zero fill);
/// `cp.async` edges use 4-byte copies with a source size of 0 outside, from a
/// source address clamped to the matrix base.
fn load_tile(b: &mut KernelBuilder, ops: &[&OperandLoads], stage: Reg<U32>, k: Reg<U32>) {
    let mut any_async = false;
    for o in ops.iter().filter(|o| o.direct) {
        let first = b.add(o.st_addr, stage);
        for l in 0..o.slots {
            let (ptr, kidx, mn_idx) = slot_state(b, o, l);
            let full = slot_full(b, o, kidx, mn_idx, k);
            let off = i64::from(l * o.st_step);
            b.guarded(full, false, |b| b.cp_async_16(first, off, ptr, 0, None));
            let done = b.label("slot_copied");
            b.bra_if(full, done);
            for j in 0..4u32 {
                let ok = elem_ok(b, o, kidx, mn_idx, k, j);
                let elem = b.add(ptr, u64::from(j) * 4);
                let src = b.selp(elem, o.base, ok);
                let bytes = b.selp(4u32, 0u32, ok);
                b.cp_async_4(first, off + i64::from(j) * 4, src, 0, Some(bytes.into()));
            }
            b.place(done);
        }
        any_async = true;
    }
    if any_async {
        b.cp_async_commit();
    }
    for o in ops.iter().filter(|o| !o.direct) {
        for l in 0..o.slots {
            let regs = o.regs[l as usize];
            for &r in &regs {
                b.assign(r, 0.0f32);
            }
            let (ptr, kidx, mn_idx) = slot_state(b, o, l);
            let full = slot_full(b, o, kidx, mn_idx, k);
            b.guarded(full, false, |b| {
                let v = b.ld_global_nc_v::<F32, 4>(ptr, 0);
                for (d, x) in regs.iter().zip(v) {
                    b.assign(*d, x);
                }
            });
            let done = b.label("slot_loaded");
            b.bra_if(full, done);
            for j in 0..4u32 {
                let ok = elem_ok(b, o, kidx, mn_idx, k, j);
                let d = regs[j as usize];
                b.guarded(ok, false, |b| {
                    let v = b.ld_global_nc::<F32>(ptr, i64::from(j) * 4);
                    b.assign(d, v);
                });
            }
            b.place(done);
        }
    }
}

/// Stores the staged tile into shared memory at stage offset `stage`.
fn store_tile(b: &mut KernelBuilder, ops: &[&OperandLoads], stage: Reg<U32>) {
    for o in ops.iter().filter(|o| !o.direct) {
        let first = b.add(o.st_addr, stage);
        for l in 0..o.slots {
            let regs = o.regs[l as usize];
            let off = i64::from(l * o.st_step);
            if o.kcontig {
                for (j, &r) in regs.iter().enumerate() {
                    b.st_shared(first, off + j as i64 * i64::from(o.smem_row), r);
                }
            } else {
                b.st_shared_v::<F32, 4>(first, off, regs.map(Src::from));
            }
        }
    }
}

/// Moves every operand's slot 0 to the next tile.
fn advance(b: &mut KernelBuilder, ops: &[&OperandLoads], bk: u32) {
    for o in ops {
        let p = if o.kcontig {
            b.add(o.ptr, u64::from(bk) * 4)
        } else {
            let step = b.mul_wide(o.ld, bk * 4);
            b.add(o.ptr, step)
        };
        b.assign(o.ptr, p);
        let k = b.add(o.kidx, bk);
        b.assign(o.kidx, k);
    }
}

/// The block's tile origin `(m0, n0)`; with `group_m`, blocks are visited in
/// groups of `group_m` tile-rows that sweep the tile-columns (L2 reuse).
/// Emitted twice (prologue, epilogue) so nothing of it stays live in the loop.
fn block_origin(b: &mut KernelBuilder, cfg: &SimtConfig) -> (Reg<U32>, Reg<U32>) {
    let cx = b.ctaid(Dim::X);
    let cy = b.ctaid(Dim::Y);
    let (pm, pn) = if cfg.group_m > 0 {
        let g = cfg.group_m;
        let npn = b.nctaid(Dim::X);
        let npm = b.nctaid(Dim::Y);
        let pid = b.mad(cy, npn, cx);
        let width = b.mul(npn, g);
        let gid = b.div(pid, width);
        let first = b.mul(gid, g);
        let left = b.sub(npm, first);
        let gsz = b.min(left, g);
        let inner = b.rem(pid, width);
        let r = b.rem(inner, gsz);
        let pm = b.add(first, r);
        let pn = b.div(inner, gsz);
        (pm, pn)
    } else {
        (cy, cx)
    };
    (b.mul(pm, cfg.bm), b.mul(pn, cfg.bn))
}

/// This thread's column and row in the `(BN/TN) × (BM/TM)` thread grid.
fn thread_coords(b: &mut KernelBuilder, cfg: &SimtConfig, tid: Reg<U32>) -> (Reg<U32>, Reg<U32>) {
    let tx_n = cfg.bn / cfg.tn;
    if !cfg.warp_tiled {
        return (b.rem(tid, tx_n), b.div(tid, tx_n));
    }
    // Warp w covers threads (wy·4 .. +4, wx·8 .. +8); lane l is (l / 8, l % 8) in it.
    let lane = b.and(tid, 31u32);
    let w = b.shr(tid, 5u32);
    let per_row = tx_n / 8;
    let wx = b.rem(w, per_row);
    let wy = b.div(w, per_row);
    let tx_in = b.and(lane, 7u32);
    let ty_in = b.shr(lane, 3u32);
    let tx = b.mad(wx, 8u32, tx_in);
    let ty = b.mad(wy, 4u32, ty_in);
    (tx, ty)
}

/// Builds the register-blocked kernel for one transpose combination.
///
/// Params: `a`, `b`, `c`, `m`, `n`, `k` (u32), `sa`, `sb`, `sc` (batch strides
/// in elements). Launch: [`SimtConfig::threads`] threads, grid
/// `(ceil(n/BN), ceil(m/BM), batch)`, no dynamic shared memory.
pub fn simt(cfg: &SimtConfig, trans_a: bool, trans_b: bool, target: Target) -> Result<Kernel, BuildError> {
    let name = cfg.kernel_name(trans_a, trans_b);
    if let Err(e) = cfg.check() {
        return Err(BuildError { kernel: name, problems: vec![e] });
    }
    let SimtConfig { bm, bn, bk, tm, tn, min_blocks, .. } = *cfg;
    let threads = cfg.threads();
    let (tx_n, ty_n) = (bn / tn, bm / tm);
    let mut b = KernelBuilder::new(&name, target);
    b.doc(&format!(
        "{name}: C = {} * {}, register-blocked SIMT fp32 GEMM",
        if trans_a { "A^T" } else { "A" },
        if trans_b { "B^T" } else { "B" }
    ));
    b.doc(&format!(
        "block tile {bm}x{bn}, k-tile {bk}, thread tile {tm}x{tn} ({threads} threads), double-buffered shared memory"
    ));
    b.doc("params: a, b, c, m, n, k, sa, sb, sc (batch strides in elements)");
    b.doc(&format!("launch: {threads} threads, grid (ceil(n/{bn}), ceil(m/{bm}), batch)"));
    b.max_threads(threads);
    if min_blocks > 0 {
        b.min_blocks_per_sm(min_blocks);
    }
    let pa = b.param_ptr("a");
    let pb = b.param_ptr("b");
    let pc = b.param_ptr("c");
    let m = b.param::<U32>("m");
    let n = b.param::<U32>("n");
    let k = b.param::<U32>("k");
    let sa = b.param::<U64>("sa");
    let sb = b.param::<U64>("sb");
    let sc = b.param::<U64>("sc");
    let a_bytes = bk * (bm + 4) * 4;
    let b_bytes = bk * (bn + 4) * 4;
    let stage_bytes = a_bytes + b_bytes;
    let smem = b.shared("tiles", 2 * stage_bytes, 16);

    let tid = b.tid(Dim::X);
    let z = b.ctaid(Dim::Z);
    let (m0, n0) = block_origin(&mut b, cfg);

    // Stored shapes: A is m×k (k-contiguous) or k×m; B is k×n or n×k (k-contiguous).
    let a_op = Operand {
        base: pa,
        batch: z,
        batch_stride: sa,
        kcontig: !trans_a,
        mn: m,
        mn0: m0,
        tile_mn: bm,
        ld: if trans_a { m } else { k },
        name: "A",
    };
    let b_op = Operand {
        base: pb,
        batch: z,
        batch_stride: sb,
        kcontig: trans_b,
        mn: n,
        mn0: n0,
        tile_mn: bn,
        ld: if trans_b { k } else { n },
        name: "B",
    };
    let sbase = b.shared_base(&smem);
    let a_loads = operand_loads(&mut b, cfg, &a_op, tid, sbase, 0);
    let b_loads = operand_loads(&mut b, cfg, &b_op, tid, sbase, a_bytes);
    let ops = [&a_loads, &b_loads];

    // Compute-side read addresses: As[kk][r·4TY + 4ty], Bs[kk][c·4TX + 4tx].
    let (tx, ty) = thread_coords(&mut b, cfg, tid);
    let ty16 = b.shl(ty, 4u32);
    let a_rd = b.add(sbase, ty16);
    let tx16 = b.shl(tx, 4u32);
    let b_rd0 = b.add(sbase, tx16);
    let b_rd = b.add(b_rd0, a_bytes);

    let acc: Vec<Vec<Reg<F32>>> = (0..tm).map(|_| (0..tn).map(|_| b.mov(0.0f32)).collect()).collect();

    b.blank();
    b.comment("prologue: tile 0 into stage 0");
    let stage = b.mov(0u32);
    load_tile(&mut b, &ops, stage, k);
    store_tile(&mut b, &ops, stage);
    let any_async = ops.iter().any(|o| o.direct);
    if any_async {
        b.cp_async_wait(0);
    }
    b.bar_sync();
    // Tiles left after the current one: ceil(k/BK) - 1.
    let ktiles = b.add(k, bk - 1);
    let ktiles = b.div(ktiles, bk);
    let left = b.sub(ktiles, 1u32);

    let lp = b.label("k_tiles");
    b.place(lp);
    let has_next = b.setp(Cmp::Ne, left, 0u32);
    b.comment("next tile's global loads, in flight during this tile's fmas");
    advance(&mut b, &ops, bk);
    let skip_load = b.label("no_next_load");
    b.bra_unless(has_next, skip_load);
    let next_stage = b.sub(stage_bytes, stage);
    load_tile(&mut b, &ops, next_stage, k);
    b.place(skip_load);

    b.comment(&format!("{bk} k-steps of {tm}x{tn} fmas from the current stage"));
    let a_cur = b.add(a_rd, stage);
    let b_cur = b.add(b_rd, stage);
    for kk in 0..bk {
        let mut af = Vec::new();
        for r in 0..tm / 4 {
            let off = i64::from(kk * (bm + 4) * 4 + r * ty_n * 16);
            af.extend(b.ld_shared_v::<F32, 4>(a_cur, off));
        }
        let mut bf = Vec::new();
        for c in 0..tn / 4 {
            let off = i64::from(kk * (bn + 4) * 4 + c * tx_n * 16);
            bf.extend(b.ld_shared_v::<F32, 4>(b_cur, off));
        }
        for i in 0..tm as usize {
            for j in 0..tn as usize {
                b.fma_acc(acc[i][j], af[i], bf[j]);
            }
        }
    }
    let done = b.label("k_done");
    b.bra_unless(has_next, done);
    b.comment("stage the next tile into the other buffer, then one barrier");
    let other = b.sub(stage_bytes, stage);
    store_tile(&mut b, &ops, other);
    if any_async {
        b.cp_async_wait(0);
    }
    b.bar_sync();
    b.assign(stage, other);
    let l1 = b.sub(left, 1u32);
    b.assign(left, l1);
    b.bra(lp);
    b.place(done);

    b.blank();
    b.comment("epilogue: float4 stores where the row is inside and n % 4 == 0, else scalar");
    b.comment("(thread and block coordinates recomputed: nothing of them stays live in the loop)");
    let tid = b.tid(Dim::X);
    let z = b.ctaid(Dim::Z);
    let (m0, n0) = block_origin(&mut b, cfg);
    let (tx, ty) = thread_coords(&mut b, cfg, tid);
    let n_low = b.and(n, 3u32);
    let c_vec = b.setp(Cmp::Eq, n_low, 0u32);
    let z64 = b.cvt::<U64, U32>(z);
    let zc = b.mul(z64, sc);
    for r in 0..tm / 4 {
        for i in 0..4u32 {
            let row = b.mad(ty, 4u32, m0);
            let gi = b.add(row, r * ty_n * 4 + i);
            let row_ok = b.setp(Cmp::Lt, gi, m);
            let skip_row = b.label("row_out");
            b.bra_unless(row_ok, skip_row);
            let e = b.mul_wide(gi, n);
            let e = b.add(e, zc);
            for c in 0..tn / 4 {
                let col = b.mad(tx, 4u32, n0);
                let gj = b.add(col, c * tx_n * 4);
                let gj64 = b.cvt::<U64, U32>(gj);
                let ej = b.add(e, gj64);
                let addr = elem_addr_plain(&mut b, pc, ej);
                let g3 = b.add(gj, 3u32);
                let in3 = b.setp(Cmp::Lt, g3, n);
                let full = b.and_pred(in3, c_vec);
                let vals: Vec<Reg<F32>> = (0..4).map(|j| acc[(r * 4 + i) as usize][(c * 4 + j) as usize]).collect();
                b.guarded(full, false, |b| {
                    b.st_global_v::<F32, 4>(addr, 0, [vals[0].into(), vals[1].into(), vals[2].into(), vals[3].into()]);
                });
                let stored = b.label("stored");
                b.bra_if(full, stored);
                for (j, &v) in vals.iter().enumerate() {
                    let gjj = b.add(gj, j as u32);
                    let ok = b.setp(Cmp::Lt, gjj, n);
                    b.guarded(ok, false, |b| b.st_global(addr, j as i64 * 4, v));
                }
                b.place(stored);
            }
            b.place(skip_row);
        }
    }
    b.ret();
    b.finish()
}

fn elem_addr_plain(b: &mut KernelBuilder, base: Reg<U64>, idx: Reg<U64>) -> Reg<U64> {
    let bytes = b.shl(idx, 2u32);
    b.add(base, bytes)
}
