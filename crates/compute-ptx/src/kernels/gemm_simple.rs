//! The two simple GEMM tiers: naive (one thread per output, operands straight
//! from global memory) and tiled (square tiles staged in shared memory: 16×16
//! for the checked-in [`tiled`], 8×8 or 32×32 through [`tiled_sized`]).
//!
//! Both read `A` and `B` through element strides, so one kernel serves every
//! transpose combination: `A(i, p) = a[i·a_rs + p·a_cs]`, `B(p, j) =
//! b[p·b_rs + j·b_cs]`; `C` is row-major `m × n`. Batches run on `gridDim.z`
//! with element strides `sa`, `sb`, `sc` between matrices (0 shares one).

use crate::builder::{BuildError, Cmp, Dim, F32, Kernel, KernelBuilder, Reg, Target, U32, U64};

/// Side of the square thread block of [`naive`] and of the block and tile of
/// [`tiled`] (the kernels the CUDA backend launches).
pub const TILE: u32 = 16;

/// The tile sides [`tiled_sized`] builds. A block has side² threads, so 32 (1024
/// threads) is the largest a GPU runs.
pub const TILE_SIDES: [u32; 3] = [8, 16, 32];

/// The tile side [`tiled_sized`] uses for a `requested` one: rounded down to the
/// nearest of [`TILE_SIDES`] (anything below 8 becomes 8, anything above 32
/// becomes 32). Never fails; a few comparisons.
pub const fn tile_side(requested: u32) -> u32 {
    if requested >= 32 {
        32
    } else if requested >= 16 {
        16
    } else {
        8
    }
}

/// The entry-point name of the tiled kernel with tile side `tile_side(side)`:
/// `gemm_tiled` for [`TILE`] (the checked-in kernel), `gemm_tiled_<side>` for
/// the others. One small allocation.
pub fn tiled_name(side: u32) -> String {
    let side = tile_side(side);
    if side == TILE { "gemm_tiled".into() } else { format!("gemm_tiled_{side}") }
}

/// The parameters both kernels take, loaded.
pub(crate) struct GemmParams {
    pub a: Reg<U64>,
    pub b: Reg<U64>,
    pub c: Reg<U64>,
    pub m: Reg<U32>,
    pub n: Reg<U32>,
    pub k: Reg<U32>,
    pub a_rs: Reg<U32>,
    pub a_cs: Reg<U32>,
    pub b_rs: Reg<U32>,
    pub b_cs: Reg<U32>,
    pub sa: Reg<U64>,
    pub sb: Reg<U64>,
    pub sc: Reg<U64>,
}

fn strided_params(b: &mut KernelBuilder) -> GemmParams {
    let a = b.param_ptr("a");
    let bp = b.param_ptr("b");
    let c = b.param_ptr("c");
    let m = b.param::<U32>("m");
    let n = b.param::<U32>("n");
    let k = b.param::<U32>("k");
    let a_rs = b.param::<U32>("a_rs");
    let a_cs = b.param::<U32>("a_cs");
    let b_rs = b.param::<U32>("b_rs");
    let b_cs = b.param::<U32>("b_cs");
    let sa = b.param::<U64>("sa");
    let sb = b.param::<U64>("sb");
    let sc = b.param::<U64>("sc");
    GemmParams { a, b: bp, c, m, n, k, a_rs, a_cs, b_rs, b_cs, sa, sb, sc }
}

/// `base + 4·(z·stride + idx)` as a byte address.
pub(crate) fn elem_addr(
    b: &mut KernelBuilder,
    base: Reg<U64>,
    z: Reg<U32>,
    stride: Reg<U64>,
    idx: Reg<U64>,
) -> Reg<U64> {
    let z64 = b.cvt::<U64, U32>(z);
    let e = b.mad(z64, stride, idx);
    let bytes = b.shl(e, 2u32);
    b.add(base, bytes)
}

fn doc_common(b: &mut KernelBuilder, side: u32) {
    b.doc("params: a, b, c, m, n, k, a_rs, a_cs, b_rs, b_cs (element strides: A(i,p) = a[i*a_rs + p*a_cs],");
    b.doc("        B(p,j) = b[p*b_rs + j*b_cs]), sa, sb, sc (batch strides in elements; C is row-major m x n)");
    b.doc(&format!("launch: {side}x{side} threads, grid (ceil(n/{side}), ceil(m/{side}), batch)"));
}

/// The naive tier: each thread computes one `C(i, j)` with a `k`-long `fma` chain.
pub fn naive(target: Target) -> Result<Kernel, BuildError> {
    let mut b = KernelBuilder::new("gemm_naive", target);
    b.doc("gemm_naive: C = op(A) op(B), one thread per output, operands read from global memory");
    doc_common(&mut b, TILE);
    b.max_threads(TILE * TILE);
    let p = strided_params(&mut b);
    let tx = b.tid(Dim::X);
    let ty = b.tid(Dim::Y);
    let bx = b.ctaid(Dim::X);
    let by = b.ctaid(Dim::Y);
    let z = b.ctaid(Dim::Z);
    let j = b.mad(bx, TILE, tx);
    let i = b.mad(by, TILE, ty);
    let exit = b.label("exit");
    let iout = b.setp(Cmp::Ge, i, p.m);
    b.bra_if(iout, exit);
    let jout = b.setp(Cmp::Ge, j, p.n);
    b.bra_if(jout, exit);
    let ai = b.mul_wide(i, p.a_rs);
    let pa = elem_addr(&mut b, p.a, z, p.sa, ai);
    let bj = b.mul_wide(j, p.b_cs);
    let pb = elem_addr(&mut b, p.b, z, p.sb, bj);
    let astep = b.mul_wide(p.a_cs, 4u32);
    let bstep = b.mul_wide(p.b_rs, 4u32);
    let acc = b.mov(0.0f32);
    let q = b.mov(0u32);
    let lp = b.label("k_loop");
    b.place(lp);
    let av = b.ld_global_nc::<F32>(pa, 0);
    let bv = b.ld_global_nc::<F32>(pb, 0);
    b.fma_acc(acc, av, bv);
    let na = b.add(pa, astep);
    b.assign(pa, na);
    let nb = b.add(pb, bstep);
    b.assign(pb, nb);
    let nq = b.add(q, 1u32);
    b.assign(q, nq);
    let more = b.setp(Cmp::Lt, q, p.k);
    b.bra_if(more, lp);
    let ci = b.mul_wide(i, p.n);
    let j64 = b.cvt::<U64, U32>(j);
    let cij = b.add(ci, j64);
    let pc = elem_addr(&mut b, p.c, z, p.sc, cij);
    b.st_global(pc, 0, acc);
    b.place(exit);
    b.ret();
    b.finish()
}

/// The tiled tier the CUDA backend launches: `A` and `B` pass through 16×16
/// shared-memory tiles (rows padded to 17 floats against bank conflicts), one
/// output per thread; entry `gemm_tiled`. Same as `tiled_sized(TILE, target)`.
pub fn tiled(target: Target) -> Result<Kernel, BuildError> {
    tiled_sized(TILE, target)
}

/// The tiled tier with `side × side` tiles and thread blocks, `side` rounded by
/// [`tile_side`] (8, 16 or 32); entry [`tiled_name`]. Rows of the shared tiles
/// are padded to `side + 1` floats against bank conflicts; the k-loop over one
/// tile is unrolled `side` times. Launch: `side × side` threads, grid
/// `(ceil(n/side), ceil(m/side), batch)`, `2·side·(side+1)·4` bytes of static
/// shared memory. Pure Rust, no GPU; well under a millisecond.
pub fn tiled_sized(side: u32, target: Target) -> Result<Kernel, BuildError> {
    let tile = tile_side(side);
    let name = tiled_name(tile);
    let mut b = KernelBuilder::new(&name, target);
    b.doc(&format!(
        "{name}: C = op(A) op(B), {tile}x{tile} tiles of A and B staged in shared memory, one output per thread"
    ));
    doc_common(&mut b, tile);
    b.max_threads(tile * tile);
    let p = strided_params(&mut b);
    let row_bytes = (tile + 1) * 4;
    let tile_bytes = tile * row_bytes;
    let sa = b.shared("a_tile", tile_bytes, 4);
    let sb = b.shared("b_tile", tile_bytes, 4);
    let tx = b.tid(Dim::X);
    let ty = b.tid(Dim::Y);
    let bx = b.ctaid(Dim::X);
    let by = b.ctaid(Dim::Y);
    let z = b.ctaid(Dim::Z);
    let j = b.mad(bx, tile, tx);
    let i = b.mad(by, tile, ty);
    let a_base = b.shared_base(&sa);
    let b_base = b.shared_base(&sb);
    // This thread writes a_tile[ty][tx] and b_tile[ty][tx].
    let my = b.mad(ty, tile + 1, tx);
    let my = b.shl(my, 2u32);
    let a_st = b.add(a_base, my);
    let b_st = b.add(b_base, my);
    // It reads a_tile[ty][q] and b_tile[q][tx].
    let arow = b.mul(ty, row_bytes);
    let a_rd = b.add(a_base, arow);
    let bcol = b.shl(tx, 2u32);
    let b_rd = b.add(b_base, bcol);
    let i_ok = b.setp(Cmp::Lt, i, p.m);
    let j_ok = b.setp(Cmp::Lt, j, p.n);
    // A(i, p0 + tx) and B(p0 + ty, j) move by side·a_cs and side·b_rs elements per tile.
    let ai = b.mul_wide(i, p.a_rs);
    let atx = b.mul_wide(tx, p.a_cs);
    let ai = b.add(ai, atx);
    let pa = elem_addr(&mut b, p.a, z, p.sa, ai);
    let bj = b.mul_wide(j, p.b_cs);
    let bty = b.mul_wide(ty, p.b_rs);
    let bj = b.add(bj, bty);
    let pb = elem_addr(&mut b, p.b, z, p.sb, bj);
    let astep = b.mul_wide(p.a_cs, 4 * tile);
    let bstep = b.mul_wide(p.b_rs, 4 * tile);
    let acc = b.mov(0.0f32);
    let p0 = b.mov(0u32);
    let lp = b.label("tile_loop");
    b.place(lp);
    let ka = b.add(p0, tx);
    let ka_ok = b.setp(Cmp::Lt, ka, p.k);
    let a_in = b.and_pred(i_ok, ka_ok);
    let kb = b.add(p0, ty);
    let kb_ok = b.setp(Cmp::Lt, kb, p.k);
    let b_in = b.and_pred(j_ok, kb_ok);
    let av = b.mov(0.0f32);
    b.guarded(a_in, false, |b| {
        let v = b.ld_global_nc::<F32>(pa, 0);
        b.assign(av, v);
    });
    let bv = b.mov(0.0f32);
    b.guarded(b_in, false, |b| {
        let v = b.ld_global_nc::<F32>(pb, 0);
        b.assign(bv, v);
    });
    b.st_shared(a_st, 0, av);
    b.st_shared(b_st, 0, bv);
    b.bar_sync();
    for q in 0..tile {
        let x = b.ld_shared::<F32>(a_rd, i64::from(q) * 4);
        let y = b.ld_shared::<F32>(b_rd, i64::from(q * row_bytes));
        b.fma_acc(acc, x, y);
    }
    b.bar_sync();
    let na = b.add(pa, astep);
    b.assign(pa, na);
    let nb = b.add(pb, bstep);
    b.assign(pb, nb);
    let np = b.add(p0, tile);
    b.assign(p0, np);
    let more = b.setp(Cmp::Lt, p0, p.k);
    b.bra_if(more, lp);
    let exit = b.label("exit");
    let out_ok = b.and_pred(i_ok, j_ok);
    b.bra_unless(out_ok, exit);
    let ci = b.mul_wide(i, p.n);
    let j64 = b.cvt::<U64, U32>(j);
    let cij = b.add(ci, j64);
    let pc = elem_addr(&mut b, p.c, z, p.sc, cij);
    b.st_global(pc, 0, acc);
    b.place(exit);
    b.ret();
    b.finish()
}
