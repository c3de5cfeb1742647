//! Matrix products with few rows (`C = A·op(B)`, `A` of `m ≤ 8` rows stored
//! `m × k`): the GEMV kernels that LLM decoding runs, one pass over `B` at
//! memory bandwidth instead of a tensor-core tile that would be almost all
//! padding. Inputs `f32`, `f16` or `bf16` (both operands of one dtype),
//! accumulation in `f32`, output `f32`, `f16` or `bf16`.
//!
//! Each kernel is built for a row count `R` in [`ROWS`] (1, 2, 4, 8): the
//! plans pick the smallest `R ≥ m`; rows `m..R` read row `m − 1` again (an L1
//! hit, always in bounds) and are not stored, so one kernel serves every `m`
//! up to `R` without branches in the loop.
//!
//! - `B` stored `n × k` ([`nt`], the `nn.Linear` layout): one warp per output
//!   column `j`, [`NT_COLS`] columns per block. The lanes stride row `j` of
//!   `B` in 16-byte loads (4 `f32` or 8 halves; a warp reads 512 contiguous
//!   bytes per load, four loads in flight per lane for `R ≤ 2`, two above),
//!   each beside the same 16 bytes of every row of `A` (small, cache
//!   resident), into `R` sums per lane; a butterfly (`shfl.sync.bfly`)
//!   combines the lanes and lane `i < m` writes `C[i, j]`. Rows whose `k` is
//!   not a multiple of the vector width (or unaligned operands) run the same
//!   loop one element per lane.
//! - `B` stored `k × n` ([`nn`]): a block of 32 × [`NN_SLICES`] threads; each
//!   thread owns 16 bytes of columns (4 or 8, loaded as one vector when `n`
//!   allows) and `R` rows, so it keeps `R·V` sums, and the [`NN_SLICES`]
//!   threads of a column interleave over the rows of `B` of one k-split. The
//!   slices are added in a fixed order through shared memory; the k-splits
//!   (`blockIdx.y`, enough blocks to fill the device) write `f32` partials
//!   `[splits, m, n]` that [`combine`] adds in split order and rounds to the
//!   output dtype. Deterministic: no atomics.
//!
//! Batches run over `blockIdx.z`, with element strides between matrices as
//! kernel arguments.

use super::elem;
use crate::builder::{BuildError, Cmp, Dim, F32, Kernel, KernelBuilder, Pred, Reg, Target, U32, U64};
use compute_core::DType;

/// The row counts the kernels are built for.
pub const ROWS: [u32; 4] = [1, 2, 4, 8];
/// The most rows (`m`) a GEMV kernel takes.
pub const MAX_ROWS: usize = 8;
/// Threads per block of the `B` stored `n × k` kernels.
pub const NT_BLOCK: u32 = 256;
/// Output columns per block of the `B` stored `n × k` kernels (one per warp).
pub const NT_COLS: u32 = NT_BLOCK / 32;
/// Threads along `k` per column of the `B` stored `k × n` kernels (`blockDim.y`).
pub const NN_SLICES: u32 = 4;
/// Threads along `n` per block of the `B` stored `k × n` kernels (`blockDim.x`).
pub const NN_THREADS_X: u32 = 32;
/// Threads per block of [`combine`].
pub const COMBINE_BLOCK: u32 = 256;

/// The row count of the kernel that takes `m` rows (`1 ≤ m ≤ 8`): the
/// smallest of [`ROWS`] at least `m`. Free.
pub fn rows_for(m: usize) -> u32 {
    ROWS.into_iter().find(|&r| r as usize >= m).unwrap_or(ROWS[ROWS.len() - 1])
}

/// Elements of `dtype` per 16-byte vector (4 `f32`, 8 halves).
pub fn vector_width(dtype: DType) -> u32 {
    16 / elem::size(dtype)
}

/// Output columns per block of the `B` stored `k × n` kernel on `dtype`.
pub fn nn_block_cols(dtype: DType) -> u32 {
    NN_THREADS_X * vector_width(dtype)
}

/// Name of the `B` stored `n × k` kernel (`gemv_nt_r4_bf16_f32`).
pub fn nt_name(rows: u32, input: DType, output: DType) -> String {
    format!("gemv_nt_r{rows}_{input}_{output}")
}

/// Name of the `B` stored `k × n` kernel (`gemv_nn_r1_bf16`; it writes `f32`).
pub fn nn_name(rows: u32, input: DType) -> String {
    format!("gemv_nn_r{rows}_{input}")
}

/// Name of the k-split combine kernel (`gemv_combine_bf16`).
pub fn combine_name(output: DType) -> String {
    format!("gemv_combine_{output}")
}

fn check_rows(name: &str, rows: u32) -> Result<(), BuildError> {
    if ROWS.contains(&rows) {
        return Ok(());
    }
    Err(BuildError { kernel: name.to_string(), problems: vec![format!("no GEMV kernel for {rows} rows")] })
}

/// The address of row `min(r, m − 1)` of a row-major matrix of `k`-element
/// rows at `base`.
fn row_ptr(b: &mut KernelBuilder, base: Reg<U64>, r: u32, m: Reg<U32>, k: Reg<U32>, dtype: DType) -> Reg<U64> {
    let last = b.sub(m, 1u32);
    let ri = b.min(last, r);
    let off = b.mul_wide(ri, k);
    let off = b.shl(off, elem::shift(dtype));
    b.add(base, off)
}

/// `base + z·stride` elements of `dtype` (`z` the block's `blockIdx.z`).
fn batch_ptr(b: &mut KernelBuilder, base: Reg<U64>, z: Reg<U64>, stride: Reg<U64>, dtype: DType) -> Reg<U64> {
    let off = b.mul(z, stride);
    let off = b.shl(off, elem::shift(dtype));
    b.add(base, off)
}

/// Builds the `B` stored `n × k` kernel for `rows` rows: `C[i, j] = Σ_p
/// A[i, p]·B[j, p]` for `i < m`, `j < n`. Params: `a`, `b`, `c` (pointers),
/// `m`, `n`, `k` (u32), `vec` (u32: nonzero when `k` is a multiple of the
/// vector width and `a`, `b` and the strides keep rows 16-byte aligned),
/// `sa`, `sb`, `sc` (u64, elements between batch matrices). Launch:
/// [`NT_BLOCK`] threads, `(ceil(n / NT_COLS), 1, batch)` blocks.
pub fn nt(rows: u32, input: DType, output: DType, target: Target) -> Result<Kernel, BuildError> {
    let name = nt_name(rows, input, output);
    check_rows(&name, rows)?;
    let v = vector_width(input);
    let unroll: u32 = if rows <= 2 { 4 } else { 2 };
    let mut b = KernelBuilder::new(&name, target);
    b.doc(&format!("{name}: C[i, j] = sum_p A[i, p] * B[j, p] for i < m <= {rows}, B stored n x k ({input} in, f32 sums, {output} out)"));
    b.doc(&format!(
        "one warp per column j ({NT_COLS} per block): lanes stride row j of B and the rows of A in 16-byte loads ({v} values, {unroll} in flight), butterfly sum, lane i writes C[i, j]"
    ));
    b.doc("params: a, b, c (pointers), m, n, k, vec (u32), sa, sb, sc (u64 batch strides, elements)");
    b.doc(&format!("launch: {NT_BLOCK} threads, (ceil(n / {NT_COLS}), 1, batch) blocks"));
    b.max_threads(NT_BLOCK);
    let a = b.param_ptr("a");
    let bp = b.param_ptr("b");
    let c = b.param_ptr("c");
    let m = b.param::<U32>("m");
    let n = b.param::<U32>("n");
    let k = b.param::<U32>("k");
    let vec = b.param::<U32>("vec");
    let sa = b.param::<U64>("sa");
    let sb = b.param::<U64>("sb");
    let sc = b.param::<U64>("sc");

    let tid = b.tid(Dim::X);
    let lane = b.and(tid, 31u32);
    let warp = b.shr(tid, 5u32);
    let cta = b.ctaid(Dim::X);
    let j = b.mad(cta, NT_COLS, warp);
    // Whole warps leave together, so the shuffles below see 32 lanes.
    let gone = b.setp(Cmp::Ge, j, n);
    b.guarded(gone, false, |b| b.ret());
    let z = b.ctaid(Dim::Z);
    let z = b.cvt::<U64, U32>(z);
    let az = batch_ptr(&mut b, a, z, sa, input);
    let bz = batch_ptr(&mut b, bp, z, sb, input);
    let cz = batch_ptr(&mut b, c, z, sc, output);
    let boff = b.mul_wide(j, k);
    let boff = b.shl(boff, elem::shift(input));
    let brow = b.add(bz, boff);
    let arows: Vec<Reg<U64>> = (0..rows).map(|r| row_ptr(&mut b, az, r, m, k, input)).collect();
    let acc: Vec<Reg<F32>> = (0..rows).map(|_| b.mov(0.0f32)).collect();

    let is_vec = b.setp(Cmp::Ne, vec, 0u32);
    let kv = b.shr(k, v.trailing_zeros());
    let units = b.selp(kv, 0u32, is_vec);
    let u = b.mov(lane);
    let main = b.label("main");
    let one = b.label("one_at_a_time");
    let scalar = b.label("scalar");
    let reduce = b.label("reduce");
    let unit_bytes = 16u32;
    let stride_bytes = i64::from(32 * unit_bytes);

    b.comment(&format!("{unroll} vectors of {v} per lane per iteration"));
    b.place(main);
    let last = b.add(u, 32 * (unroll - 1));
    let past = b.setp(Cmp::Ge, last, units);
    b.bra_if(past, one);
    let off = b.mul_wide(u, unit_bytes);
    let bv = b.add(brow, off);
    let bs: Vec<Vec<Reg<F32>>> =
        (0..unroll).map(|t| elem::load(&mut b, input, bv, i64::from(t) * stride_bytes, v as usize)).collect();
    for (t, bt) in bs.iter().enumerate() {
        for (r, &ar) in arows.iter().enumerate() {
            let av = b.add(ar, off);
            let xs = elem::load(&mut b, input, av, t as i64 * stride_bytes, v as usize);
            for (x, &y) in xs.into_iter().zip(bt) {
                b.fma_acc(acc[r], x, y);
            }
        }
    }
    let next = b.add(u, 32 * unroll);
    b.assign(u, next);
    b.bra(main);

    b.place(one);
    let past = b.setp(Cmp::Ge, u, units);
    b.bra_if(past, scalar);
    let off = b.mul_wide(u, unit_bytes);
    let bv = b.add(brow, off);
    let bt = elem::load(&mut b, input, bv, 0, v as usize);
    for (r, &ar) in arows.iter().enumerate() {
        let av = b.add(ar, off);
        let xs = elem::load(&mut b, input, av, 0, v as usize);
        for (x, &y) in xs.into_iter().zip(&bt) {
            b.fma_acc(acc[r], x, y);
        }
    }
    let next = b.add(u, 32u32);
    b.assign(u, next);
    b.bra(one);

    b.comment("the elements past the vectors (all of them without vec), one per lane");
    b.place(scalar);
    let base = b.shl(units, v.trailing_zeros());
    let p = b.add(base, lane);
    let tail = b.label("tail");
    b.place(tail);
    let past = b.setp(Cmp::Ge, p, k);
    b.bra_if(past, reduce);
    let off = b.mul_wide(p, elem::size(input));
    let bq = b.add(brow, off);
    let y = elem::load(&mut b, input, bq, 0, 1)[0];
    for (r, &ar) in arows.iter().enumerate() {
        let aq = b.add(ar, off);
        let x = elem::load(&mut b, input, aq, 0, 1)[0];
        b.fma_acc(acc[r], x, y);
    }
    let next = b.add(p, 32u32);
    b.assign(p, next);
    b.bra(tail);

    b.place(reduce);
    b.comment("butterfly over the lanes; lane i < m writes row i");
    for mask in [16, 8, 4, 2, 1] {
        for &s in &acc {
            let o = b.shfl_bfly(s, mask);
            let t = b.add(s, o);
            b.assign(s, t);
        }
    }
    let mut val = acc[0];
    for (r, &s) in acc.iter().enumerate().skip(1) {
        let is = b.setp(Cmp::Eq, lane, r as u32);
        val = b.selp(s, val, is);
    }
    let done = b.label("done");
    let out = b.setp(Cmp::Ge, lane, m);
    b.bra_if(out, done);
    let ci = b.mad(lane, n, j);
    let coff = b.mul_wide(ci, elem::size(output));
    let ca = b.add(cz, coff);
    elem::store(&mut b, output, ca, 0, &[val]);
    b.place(done);
    b.ret();
    b.finish()
}

/// One step of the `B` stored `k × n` loop: row `p` of `B` (`bq` the address
/// of this thread's first column in it, or the row's start with the column
/// offsets `cols` when not vectorised) against `A[:, p]` (`aoff` bytes into
/// each row of `A`, plus `a_imm`), into `acc[r][e]`.
#[allow(clippy::too_many_arguments)]
fn nn_step(
    b: &mut KernelBuilder,
    input: DType,
    bq: Reg<U64>,
    cols: Option<&[Reg<U64>]>,
    arows: &[Reg<U64>],
    aoff: Reg<U64>,
    a_imm: i64,
    acc: &[Vec<Reg<F32>>],
) {
    let v = vector_width(input) as usize;
    let ys: Vec<Reg<F32>> = match cols {
        None => elem::load(b, input, bq, 0, v),
        Some(cols) => cols
            .iter()
            .map(|&co| {
                let q = b.add(bq, co);
                elem::load(b, input, q, 0, 1)[0]
            })
            .collect(),
    };
    for (r, &ar) in arows.iter().enumerate() {
        let aq = b.add(ar, aoff);
        let x = elem::load(b, input, aq, a_imm, 1)[0];
        for (e, &y) in ys.iter().enumerate() {
            b.fma_acc(acc[r][e], x, y);
        }
    }
}

/// Builds the `B` stored `k × n` kernel for `rows` rows: the partial sums
/// `P[s, i, j] = Σ_{p in split s} A[i, p]·B[p, j]` in `f32`, for `i < m`, `j <
/// n`, split `s = blockIdx.y` covering `p` in `[s·kc, min((s+1)·kc, k))`.
/// Params: `a`, `b`, `part` (pointers; `part` holds `f32`), `m`, `n`, `k`,
/// `kc` (u32), `vec` (u32: nonzero when `n` is a multiple of the vector width
/// and `b`, `part` and the strides keep each thread's columns 16-byte
/// aligned), `sa`, `sb` (u64, elements between batch matrices), `sp` (u64,
/// floats between a batch's partials). Launch: `(32, NN_SLICES)` threads,
/// `(ceil(n / nn_block_cols), splits, batch)` blocks.
pub fn nn(rows: u32, input: DType, target: Target) -> Result<Kernel, BuildError> {
    let name = nn_name(rows, input);
    check_rows(&name, rows)?;
    let v = vector_width(input);
    let unroll: u32 = if rows * v <= 16 { 4 } else { 2 };
    let mut b = KernelBuilder::new(&name, target);
    b.doc(&format!(
        "{name}: part[s, i, j] = sum over split s of A[i, p] * B[p, j] for i < m <= {rows}, B stored k x n ({input} in, f32 out)"
    ));
    b.doc(&format!(
        "block (32, {NN_SLICES}): each thread {v} columns (one 16-byte load of B per row of k) by {rows} rows; the {NN_SLICES} slices interleave over the split's rows of k and add through shared memory in order"
    ));
    b.doc("params: a, b, part (pointers), m, n, k, kc (u32 rows of k per split), vec (u32), sa, sb (u64 batch strides, elements), sp (u64, floats)");
    b.doc(&format!(
        "launch: ({NN_THREADS_X}, {NN_SLICES}) threads, (ceil(n / {}), splits, batch) blocks",
        nn_block_cols(input)
    ));
    b.max_threads(NN_THREADS_X * NN_SLICES);
    let a = b.param_ptr("a");
    let bp = b.param_ptr("b");
    let part = b.param_ptr("part");
    let m = b.param::<U32>("m");
    let n = b.param::<U32>("n");
    let k = b.param::<U32>("k");
    let kc = b.param::<U32>("kc");
    let vec = b.param::<U32>("vec");
    let sa = b.param::<U64>("sa");
    let sb = b.param::<U64>("sb");
    let sp = b.param::<U64>("sp");
    let scratch = b.shared("slices", (NN_SLICES - 1) * rows * v * NN_THREADS_X * 4, 16);

    let tx = b.tid(Dim::X);
    let ty = b.tid(Dim::Y);
    let cx = b.ctaid(Dim::X);
    let s = b.ctaid(Dim::Y);
    let z = b.ctaid(Dim::Z);
    let z = b.cvt::<U64, U32>(z);
    let g = b.mad(cx, NN_THREADS_X, tx);
    let j0 = b.mul(g, v);
    let active = b.setp(Cmp::Lt, j0, n);
    let jl = b.selp(j0, 0u32, active);
    let k0 = b.mul(s, kc);
    let k1 = b.add(k0, kc);
    let k1 = b.min(k1, k);
    let az = batch_ptr(&mut b, a, z, sa, input);
    let bz = batch_ptr(&mut b, bp, z, sb, input);
    let arows: Vec<Reg<U64>> = (0..rows).map(|r| row_ptr(&mut b, az, r, m, k, input)).collect();
    let acc: Vec<Vec<Reg<F32>>> = (0..rows).map(|_| (0..v).map(|_| b.mov(0.0f32)).collect()).collect();
    let es = elem::size(input);
    let sh = elem::shift(input);

    let p = b.add(k0, ty);
    // Byte offset of A[:, p] in each row, and of B[p, jl], kept as running sums.
    let aoff = b.mul_wide(p, es);
    let prow = b.mul_wide(p, n);
    let jl64 = b.cvt::<U64, U32>(jl);
    let bo = b.add(prow, jl64);
    let bo = b.shl(bo, sh);
    let bq = b.add(bz, bo);
    let bstep = b.mul_wide(n, NN_SLICES * es);
    let astep = u64::from(NN_SLICES * es);
    let is_vec = b.setp(Cmp::Ne, vec, 0u32);

    let main = b.label("main");
    let one = b.label("one_at_a_time");
    let scalar = b.label("scalar");
    let slices = b.label("slices");
    b.bra_unless(is_vec, scalar);

    b.comment(&format!("{unroll} rows of B per thread per iteration, {v}-wide loads"));
    b.place(main);
    let last = b.add(p, NN_SLICES * (unroll - 1));
    let past = b.setp(Cmp::Ge, last, k1);
    b.bra_if(past, one);
    let mut q = bq;
    for t in 0..unroll {
        if t > 0 {
            q = b.add(q, bstep);
        }
        nn_step(&mut b, input, q, None, &arows, aoff, i64::from(t * NN_SLICES * es), &acc);
    }
    let next = b.add(p, NN_SLICES * unroll);
    b.assign(p, next);
    let next = b.add(aoff, astep * u64::from(unroll));
    b.assign(aoff, next);
    let next = b.add(q, bstep);
    b.assign(bq, next);
    b.bra(main);

    b.place(one);
    let past = b.setp(Cmp::Ge, p, k1);
    b.bra_if(past, slices);
    nn_step(&mut b, input, bq, None, &arows, aoff, 0, &acc);
    let next = b.add(p, NN_SLICES);
    b.assign(p, next);
    let next = b.add(aoff, astep);
    b.assign(aoff, next);
    let next = b.add(bq, bstep);
    b.assign(bq, next);
    b.bra(one);

    b.comment("n not a multiple of the vector width: each column on its own, clamped to column n - 1");
    b.place(scalar);
    let nm1 = b.sub(n, 1u32);
    let cols: Vec<Reg<U64>> = (0..v)
        .map(|e| {
            let je = b.add(j0, e);
            let je = b.min(je, nm1);
            let d = b.sub(je, jl);
            b.mul_wide(d, es)
        })
        .collect();
    let scalar_loop = b.label("scalar_loop");
    b.place(scalar_loop);
    let past = b.setp(Cmp::Ge, p, k1);
    b.bra_if(past, slices);
    nn_step(&mut b, input, bq, Some(&cols), &arows, aoff, 0, &acc);
    let next = b.add(p, NN_SLICES);
    b.assign(p, next);
    let next = b.add(aoff, astep);
    b.assign(aoff, next);
    let next = b.add(bq, bstep);
    b.assign(bq, next);
    b.bra(scalar_loop);

    b.place(slices);
    b.comment("slices 1.. through shared memory; slice 0 adds them in order");
    let sbase = b.shared_base(&scratch);
    let first = b.setp(Cmp::Eq, ty, 0u32);
    // Slot of (slice ty - 1, row r, element e, thread tx): tx fastest, no bank conflicts.
    let tym1 = b.sub(ty, 1u32);
    let slot = b.mad(tym1, rows * v * NN_THREADS_X, tx);
    let slot = b.shl(slot, 2u32);
    let mine = b.add(sbase, slot);
    let txo = b.shl(tx, 2u32);
    let zero_slot = b.add(sbase, txo);
    let per_slice = i64::from(rows * v * NN_THREADS_X * 4);
    let store_slices = b.label("stored");
    b.bra_if(first, store_slices);
    for (r, row) in acc.iter().enumerate() {
        for (e, &x) in row.iter().enumerate() {
            b.st_shared(mine, ((r as u32 * v + e as u32) * NN_THREADS_X * 4) as i64, x);
        }
    }
    b.place(store_slices);
    b.bar_sync();
    let done = b.label("done");
    let not_first: Reg<Pred> = b.not_pred(first);
    b.bra_if(not_first, done);
    for sl in 0..(NN_SLICES - 1) as i64 {
        for (r, row) in acc.iter().enumerate() {
            for (e, &x) in row.iter().enumerate() {
                let off = sl * per_slice + i64::from((r as u32 * v + e as u32) * NN_THREADS_X * 4);
                let o = b.ld_shared::<F32>(zero_slot, off);
                let t = b.add(x, o);
                b.assign(x, t);
            }
        }
    }
    b.bra_unless(active, done);

    b.comment("partials of rows i < m: 16-byte stores with vec, else column by column");
    let mn = b.mul_wide(m, n);
    let sp_z = b.mul(z, sp);
    let s64 = b.cvt::<U64, U32>(s);
    let s_off = b.mul(s64, mn);
    let base = b.add(sp_z, s_off);
    let j64 = b.cvt::<U64, U32>(j0);
    let base = b.add(base, j64);
    let base = b.shl(base, 2u32);
    let pbase = b.add(part, base);
    let nb = b.mul_wide(n, 4u32);
    let scalar_store = b.label("scalar_store");
    b.bra_unless(is_vec, scalar_store);
    let mut prow = pbase;
    for (r, row) in acc.iter().enumerate() {
        if r > 0 {
            prow = b.add(prow, nb);
        }
        let out = b.setp(Cmp::Le, m, r as u32);
        b.bra_if(out, done);
        elem::store(&mut b, DType::F32, prow, 0, row);
    }
    b.bra(done);
    b.place(scalar_store);
    let mut prow = pbase;
    for (r, row) in acc.iter().enumerate() {
        if r > 0 {
            prow = b.add(prow, nb);
        }
        let out = b.setp(Cmp::Le, m, r as u32);
        b.bra_if(out, done);
        for (e, &x) in row.iter().enumerate() {
            let je = b.add(j0, e as u32);
            let inside = b.setp(Cmp::Lt, je, n);
            b.guarded(inside, false, |b| b.st_global(prow, 4 * e as i64, x));
        }
    }
    b.place(done);
    b.ret();
    b.finish()
}

/// Builds the k-split combine: `C[z, i] = Σ_s P[z, s, i]` in split order,
/// rounded to `output`. Params: `part` (f32), `c` (pointers), `mn` (u32,
/// outputs per matrix), `splits` (u32), `sc` (u64, elements between batch
/// matrices of `C`). Launch: [`COMBINE_BLOCK`] threads, `(ceil(mn / 256), 1,
/// batch)` blocks. Reads `splits` floats and writes one value per output.
pub fn combine(output: DType, target: Target) -> Result<Kernel, BuildError> {
    let name = combine_name(output);
    let mut b = KernelBuilder::new(&name, target);
    b.doc(&format!("{name}: c[z, i] = sum over s in order of part[z, s, i] (f32), rounded to {output}"));
    b.doc("params: part, c (pointers), mn, splits (u32), sc (u64 batch stride of c, elements)");
    b.doc(&format!("launch: {COMBINE_BLOCK} threads, (ceil(mn / {COMBINE_BLOCK}), 1, batch) blocks"));
    b.max_threads(COMBINE_BLOCK);
    let part = b.param_ptr("part");
    let c = b.param_ptr("c");
    let mn = b.param::<U32>("mn");
    let splits = b.param::<U32>("splits");
    let sc = b.param::<U64>("sc");
    let i = b.global_index_x();
    let gone = b.setp(Cmp::Ge, i, mn);
    b.guarded(gone, false, |b| b.ret());
    let z = b.ctaid(Dim::Z);
    let z = b.cvt::<U64, U32>(z);
    let per = b.mul_wide(splits, mn);
    let zo = b.mul(z, per);
    let i64r = b.cvt::<U64, U32>(i);
    let o = b.add(zo, i64r);
    let o = b.shl(o, 2u32);
    let q = b.add(part, o);
    let step = b.mul_wide(mn, 4u32);
    let acc = b.mov(0.0f32);
    let s = b.mov(0u32);
    let sum = b.label("sum");
    let summed = b.label("summed");
    b.place(sum);
    let past = b.setp(Cmp::Ge, s, splits);
    b.bra_if(past, summed);
    let x = b.ld_global::<F32>(q, 0);
    let t = b.add(acc, x);
    b.assign(acc, t);
    let next = b.add(q, step);
    b.assign(q, next);
    let next = b.add(s, 1u32);
    b.assign(s, next);
    b.bra(sum);
    b.place(summed);
    let co = b.mul(z, sc);
    let co = b.add(co, i64r);
    let co = b.shl(co, elem::shift(output));
    let ca = b.add(c, co);
    elem::store(&mut b, output, ca, 0, &[acc]);
    b.ret();
    b.finish()
}
