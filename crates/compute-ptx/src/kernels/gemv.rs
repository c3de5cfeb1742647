//! Matrix products with few rows (`C = A·op(B)`, `A` of `m ≤ 16` rows
//! stored `m × k`; `m ≤ 8` with `B` stored `k × n`): the GEMV kernels that
//! LLM decoding runs, one sequence or several together, one pass over `B`
//! at memory bandwidth instead of a tensor-core tile that would be almost
//! all padding. Inputs `f32`, `f16` or `bf16` (both operands of one dtype),
//! accumulation in `f32`, output `f32`, `f16` or `bf16`.
//!
//! Each CUDA-core kernel is built for a row count `R` in [`ROWS`] (1, 2, 4,
//! 8, 16; `B` stored `k × n` up to 8): the plans pick the smallest `R ≥ m`;
//! rows `m..R` read row `m − 1` again (an L1 hit, always in bounds) and are
//! not stored, so one kernel serves every `m` up to `R` without branches in
//! the loop.
//!
//! - `B` stored `n × k` ([`nt`], the `nn.Linear` layout): blocks of
//!   [`NT_WARPS`] warps; `split` warps ([`NT_SPLITS`], a kernel argument)
//!   share a group of [`nt_warp_cols`] output columns (1 for 1–2 rows, 2 for
//!   4, 4 for 8, 2 for 16, so that each 16 bytes of `A` read serve that many
//!   rows of `B` while a lane keeps at most 32 sums). Lane `l` of slice `s` reads the 16-byte units `s·32 + l +
//!   i·32·split` of the group's rows of `B` (4 `f32` or 8 halves; together a
//!   warp reads 512 contiguous bytes per load) beside the same 16 bytes of
//!   every row of `A` (small, cache resident), into `R × cols` sums per lane.
//!   The loads go out a round at a time, 8, 4, 4, 4 or 2 loads of `B` per
//!   lane (for 1, 2, 4, 8, 16 rows), all issued before the round's
//!   multiply-adds; the
//!   last round guards each unit instead of walking the tail one load at a
//!   time. A transposing butterfly (`shfl.sync.bfly`: each step halves the
//!   sums a lane holds) leaves lane `l` with sum `l >> (5 − log₂(R·cols))`;
//!   with a split, the slices' sums meet in shared memory and slice 0 adds
//!   them in slice order. Rows whose `k` is not a multiple of the vector
//!   width (or unaligned operands) run the same loop one element per lane.
//!   The plans choose the split per shape ([`nt_split`]): one warp per
//!   column group when the blocks fill the device, more for few columns and
//!   many rows of `A`.
//! - `B` stored `n × k` on tensor cores ([`nt_mma`], `f16`/`bf16` inputs,
//!   `k` a multiple of 8 and 16-byte aligned rows; the plans take it for 9
//!   to 16 rows): 16 rows of `A` are one `mma.sync.m16n8k16` fragment, so
//!   the rows cost next to nothing and the kernel is a pass over `B`. A
//!   group of `split` warps owns `8·tiles` columns ([`MMA_TILES`]); lane `4g
//!   + t` loads the 16-byte unit `t` of each 32-value chunk of rows `g` and
//!   `g + 8` of `A` and of row `g` of each 8-column tile of `B`: the same
//!   8 values of both operands, which make the fragments of two `mma`
//!   (their `k` positions a permutation of the chunk's, which a sum over
//!   `k` does not see). Four chunks (two for 4 tiles) go out per round,
//!   all loaded before the round's `mma`; a partial last chunk (`k` not a
//!   multiple of 32) is taken by its slice with the units past `k` loaded
//!   as zeros (every lane runs the warp-wide `mma`); the slices' accumulators meet in shared memory,
//!   added in slice order. The plans give each column group 8 warps when
//!   `k` is long enough ([`mma_split`]).
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
//! kernel arguments. Every sum is added in an order fixed by the shape and
//! the split: results are deterministic (no atomics).

use super::elem;
use super::gemm_epilogue::{self, EpilogueKind};
use super::unroll::{maybe_guarded, strided_rounds};
use crate::builder::{B32, BuildError, Cmp, Dim, F32, Kernel, KernelBuilder, Pred, Reg, Target, U32, U64};
use compute_core::DType;

/// The row counts the CUDA-core kernels are built for (`B` stored `k × n`:
/// up to [`NN_MAX_ROWS`]).
pub const ROWS: [u32; 5] = [1, 2, 4, 8, 16];
/// The most rows (`m`) a GEMV kernel takes with `B` stored `n × k`.
pub const MAX_ROWS: usize = 16;
/// The most rows (`m`) a GEMV kernel takes with `B` stored `k × n`: a
/// thread there keeps `rows` × 8 sums for half inputs, 128 at 16 rows.
pub const NN_MAX_ROWS: usize = 8;
/// The 8-column tiles per warp group the tensor-core kernel is built for
/// ([`nt_mma`]: 8, 16 or 32 output columns per group of warps).
pub const MMA_TILES: [u32; 3] = [1, 2, 4];
/// The tiles the plans launch ([`nt_mma`]; the others are for tuning): one
/// tile of 8 columns per warp group, which gives the most blocks (measured
/// fastest on an H100 with 12 and 16 rows at the 1.1 B decoder's shapes the
/// plans give the GEMV, up to 8192 columns; `docs/ptx.md`).
pub const MMA_DEFAULT_TILES: u32 = 1;
/// Threads per block of the `B` stored `n × k` kernels.
pub const NT_BLOCK: u32 = 256;
/// Warps per block of the `B` stored `n × k` kernels.
pub const NT_WARPS: u32 = NT_BLOCK / 32;
/// The k-splits of the `B` stored `n × k` kernels: how many warps share one
/// group of output columns, each reading every `split`-th 512-byte stretch
/// of the group's rows of `B`.
pub const NT_SPLITS: [u32; 4] = [1, 2, 4, 8];
/// Blocks of the `B` stored `n × k` kernels the plans count on one
/// multiprocessor holding at once ([`nt_split`]): `ptxas` (CUDA 13.0, sm_90)
/// gives them 72–121 registers a thread, two blocks of 256 threads, except
/// the 8-row `f32` kernels (164: one block).
pub const NT_BLOCKS_PER_SM: u32 = 2;
/// One-element units in flight per lane in the loop past the 16-byte units.
const NT_SCALAR_UNROLL: u32 = 4;
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

/// Output columns each warp of the `B` stored `n × k` kernel for `rows` rows
/// computes: 1 for 1 or 2 rows, 2 for 4, 4 for 8, 2 for 16, so that each 16
/// bytes of `A` read from cache (and widened) serve that many rows of `B`
/// while a lane keeps at most 32 sums. Free.
pub fn nt_warp_cols(rows: u32) -> u32 {
    match rows {
        0..=2 => 1,
        3..=4 => 2,
        5..=8 => 4,
        _ => 2,
    }
}

/// 16-byte units of each of its rows of `B` a lane of the `B` stored `n × k`
/// kernel has in flight: 8 for 1 row, 4 for 2, 2 for 4, 1 for 8 or 16 (with
/// [`nt_warp_cols`], 8, 4, 4, 4 and 2 loads of `B` per lane).
fn nt_unroll(rows: u32) -> u32 {
    match rows {
        0..=1 => 8,
        2 => 4,
        3..=4 => 2,
        _ => 1,
    }
}

/// Output columns per block of the `B` stored `n × k` kernel for `rows` rows
/// and k-split `split`: [`NT_WARPS`]` / split` groups of [`nt_warp_cols`]
/// columns. Free.
pub fn nt_block_cols(rows: u32, split: u32) -> u32 {
    (NT_WARPS / split.clamp(1, NT_WARPS)) * nt_warp_cols(rows)
}

/// The k-split the plans give the `B` stored `n × k` kernel for `m` rows,
/// `n` columns and `k` values of `dtype` per row on a device of `sms`
/// multiprocessors. One warp per column group when the blocks of that
/// already fill every multiprocessor ([`NT_BLOCKS_PER_SM`]): the product is
/// then bound by bandwidth, and a split would only add its shared-memory
/// step. Otherwise the split of [`NT_SPLITS`] with the fewest sequential
/// rounds of loads, counting a lane's rounds times the waves of blocks, the
/// smallest split on a tie. So a decoder's `k` and `v` projections with 8
/// rows (128 column groups) take 8 warps per group, and with 1 row (512
/// groups, each lane's loads in one round) one. Free.
pub fn nt_split(m: usize, n: usize, k: usize, dtype: DType, sms: u32) -> u32 {
    let rows = rows_for(m);
    let slots = NT_BLOCKS_PER_SM as usize * sms.max(1) as usize;
    let blocks = |split: u32| n.div_ceil(nt_block_cols(rows, split) as usize);
    if blocks(1) >= slots {
        return 1;
    }
    let v = vector_width(dtype) as usize;
    let (len, per_round) =
        if k.is_multiple_of(v) { (k / v, nt_unroll(rows) as usize) } else { (k, NT_SCALAR_UNROLL as usize) };
    let cost = |split: u32| {
        let rounds = len.div_ceil(32 * split as usize * per_round).max(1);
        rounds * blocks(split).div_ceil(slots)
    };
    NT_SPLITS.into_iter().fold(1, |best, s| if cost(s) < cost(best) { s } else { best })
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

/// Name of the tensor-core kernel with `tiles` 8-column tiles per warp group
/// (`gemv_nt_mma2_bf16_f32`).
pub fn mma_name(tiles: u32, input: DType, output: DType) -> String {
    format!("gemv_nt_mma{tiles}_{input}_{output}")
}

/// 16-byte units (8 halves) of `B` per lane of the tensor-core kernel with
/// `tiles` tiles, per round of loads: 4 chunks of 32 values in flight for 1
/// or 2 tiles, 2 for 4 (4, 8 and 8 loads of `B` per lane).
fn mma_unroll(tiles: u32) -> u32 {
    if tiles <= 2 { 4 } else { 2 }
}

/// Output columns per block of the tensor-core kernel with `tiles` tiles and
/// k-split `split`: [`NT_WARPS`]` / split` groups of `8·tiles` columns. Free.
pub fn mma_block_cols(tiles: u32, split: u32) -> u32 {
    (NT_WARPS / split.clamp(1, NT_WARPS)) * 8 * tiles
}

/// The k-split the plans give the tensor-core kernel with `tiles` tiles for
/// `k` values per row: the largest of [`NT_SPLITS`] that leaves each warp
/// at least one full round of chunks (32 values each, 4 a round, 2 for 4
/// tiles), else 1. Eight warps per column group at the decoder's shapes
/// (`k` 2048 or 8192): measured fastest on an H100 with 12 and 16 rows at
/// every one of them but the 16384-column one, within 3% there. Free.
pub fn mma_split(k: usize, tiles: u32) -> u32 {
    let chunks = k.div_ceil(32);
    let per_round = mma_unroll(tiles) as usize;
    NT_SPLITS.into_iter().filter(|&s| s as usize * per_round <= chunks).max().unwrap_or(1)
}

/// Name of the `B` stored `k × n` kernel (`gemv_nn_r1_bf16`; it writes `f32`).
pub fn nn_name(rows: u32, input: DType) -> String {
    format!("gemv_nn_r{rows}_{input}")
}

/// Name of the k-split combine kernel (`gemv_combine_bf16`).
pub fn combine_name(output: DType) -> String {
    format!("gemv_combine_{output}")
}

fn check_rows(name: &str, rows: u32, most: usize) -> Result<(), BuildError> {
    if ROWS.contains(&rows) && rows as usize <= most {
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
/// `split` (u32, one of [`NT_SPLITS`]: warps per group of columns), `sa`,
/// `sb`, `sc` (u64, elements between batch matrices). Launch: [`NT_BLOCK`]
/// threads, `(ceil(n / nt_block_cols(rows, split)), 1, batch)` blocks.
pub fn nt(
    rows: u32,
    input: DType,
    output: DType,
    epilogue: Option<EpilogueKind>,
    target: Target,
) -> Result<Kernel, BuildError> {
    let name = nt_name(rows, input, output) + &EpilogueKind::suffix(epilogue);
    check_rows(&name, rows, MAX_ROWS)?;
    let v = vector_width(input);
    let cw = nt_warp_cols(rows);
    let unroll = nt_unroll(rows);
    let sums = rows * cw;
    let mut b = KernelBuilder::new(&name, target);
    b.doc(&format!("{name}: C[i, j] = sum_p A[i, p] * B[j, p] for i < m <= {rows}, B stored n x k ({input} in, f32 sums, {output} out)"));
    b.doc(&format!(
        "split warps per group of {cw} column(s) ({NT_WARPS} warps per block): lane l of slice s reads 16-byte units s*32 + l + i*32*split of the group's rows of B ({v} values, {unroll} units of each row in flight) and of the rows of A"
    ));
    b.doc("transposing butterfly over the lanes, then the slices added in order through shared memory");
    b.doc("params: a, b, c (pointers), m, n, k, vec, split (u32), sa, sb, sc (u64 batch strides, elements)");
    b.doc(&format!("launch: {NT_BLOCK} threads, (ceil(n / ({NT_WARPS} / split * {cw})), 1, batch) blocks"));
    b.max_threads(NT_BLOCK);
    let a = b.param_ptr("a");
    let bp = b.param_ptr("b");
    let c = b.param_ptr("c");
    let m = b.param::<U32>("m");
    let n = b.param::<U32>("n");
    let k = b.param::<U32>("k");
    let vec = b.param::<U32>("vec");
    let split = b.param::<U32>("split");
    let sa = b.param::<U64>("sa");
    let sb = b.param::<U64>("sb");
    let sc = b.param::<U64>("sc");
    gemm_epilogue::doc(&mut b, epilogue);
    let epi = gemm_epilogue::params(&mut b, epilogue);
    let scratch = b.shared("sums", NT_WARPS * 32 * 4, 16);

    let tid = b.tid(Dim::X);
    let lane = b.and(tid, 31u32);
    let warp = b.shr(tid, 5u32);
    let group = b.div(warp, split);
    let lead = b.mul(group, split);
    let slice = b.sub(warp, lead);
    let groups = b.div(NT_WARPS, split);
    let cta = b.ctaid(Dim::X);
    let g = b.mad(cta, groups, group);
    let j0 = b.mul(g, cw);
    let z = b.ctaid(Dim::Z);
    let z = b.cvt::<U64, U32>(z);
    let az = batch_ptr(&mut b, a, z, sa, input);
    let bz = batch_ptr(&mut b, bp, z, sb, input);
    let cz = batch_ptr(&mut b, c, z, sc, output);
    let epi = epi.map(|e| {
        let zc = b.sub(cz, c);
        e.at_batch(&mut b, zc)
    });
    // Columns past n read column n - 1 (in bounds) and are not stored, so
    // every warp reaches the barrier below.
    let nm1 = b.sub(n, 1u32);
    let brows: Vec<Reg<U64>> = (0..cw)
        .map(|col| {
            let j = b.add(j0, col);
            let j = b.min(j, nm1);
            let off = b.mul_wide(j, k);
            let off = b.shl(off, elem::shift(input));
            b.add(bz, off)
        })
        .collect();
    let arows: Vec<Reg<U64>> = (0..rows).map(|r| row_ptr(&mut b, az, r, m, k, input)).collect();
    let acc: Vec<Vec<Reg<F32>>> = (0..rows).map(|_| (0..cw).map(|_| b.mov(0.0f32)).collect()).collect();

    let is_vec = b.setp(Cmp::Ne, vec, 0u32);
    let kv = b.shr(k, v.trailing_zeros());
    let units = b.selp(kv, 0u32, is_vec);
    let first = b.mad(slice, 32u32, lane);
    let stride = b.shl(split, 5u32);
    b.comment(&format!("16-byte units ({v} values), {unroll} per row of B in flight"));
    let step = NtStep { input, width: v, unit_bytes: 16, brows: &brows, arows: &arows, acc: &acc };
    strided_rounds(&mut b, (first, stride, units), unroll, "vec", |b, us, gs| step.round(b, us, gs));
    b.comment("the elements past the units (all of them without vec), one per lane");
    let base = b.shl(units, v.trailing_zeros());
    let p0 = b.add(base, first);
    let step = NtStep { width: 1, unit_bytes: elem::size(input), ..step };
    strided_rounds(&mut b, (p0, stride, k), NT_SCALAR_UNROLL, "scalar", |b, us, gs| step.round(b, us, gs));

    b.comment(&format!("transposing butterfly: lane l ends with sum l >> {} of the {sums}", 5 - sums.trailing_zeros()));
    let mut vals: Vec<Reg<F32>> = (0..sums).map(|i| acc[(i % rows) as usize][(i / rows) as usize]).collect();
    let mut mask = 16u32;
    while vals.len() > 1 {
        let half = vals.len() / 2;
        let upper = b.and(lane, mask);
        let high = b.setp(Cmp::Ne, upper, 0u32);
        let mut next = Vec::with_capacity(half);
        for i in 0..half {
            let keep = b.selp(vals[i + half], vals[i], high);
            let give = b.selp(vals[i], vals[i + half], high);
            let got = b.shfl_bfly(give, mask);
            next.push(b.add(keep, got));
        }
        vals = next;
        mask >>= 1;
    }
    let val = vals[0];
    while mask > 0 {
        let o = b.shfl_bfly(val, mask);
        let t = b.add(val, o);
        b.assign(val, t);
        mask >>= 1;
    }
    let spread = 5 - sums.trailing_zeros();
    let idx = b.shr(lane, spread);
    let low = b.and(lane, (1u32 << spread) - 1);
    let writer = b.setp(Cmp::Eq, low, 0u32);
    let r = b.and(idx, rows - 1);
    let col = b.shr(idx, rows.trailing_zeros());
    let j = b.add(j0, col);
    let done = b.label("done");
    let store = b.label("store");
    let single = b.setp(Cmp::Eq, split, 1u32);
    b.bra_if(single, store);

    b.comment("slices through shared memory; slice 0 adds them in order");
    let sbase = b.shared_base(&scratch);
    let slot = b.mad(warp, 32u32, idx);
    let slot = b.shl(slot, 2u32);
    let mine = b.add(sbase, slot);
    b.guarded(writer, false, |b| b.st_shared(mine, 0, val));
    b.bar_sync();
    let lead_slice = b.setp(Cmp::Eq, slice, 0u32);
    b.bra_unless(lead_slice, done);
    b.bra_unless(writer, done);
    let s = b.mov(1u32);
    let at = b.mov(mine);
    let add = b.label("add_slices");
    b.place(add);
    let past = b.setp(Cmp::Ge, s, split);
    b.bra_if(past, store);
    let next = b.add(at, 32u32 * 4);
    b.assign(at, next);
    let o = b.ld_shared::<F32>(at, 0);
    let t = b.add(val, o);
    b.assign(val, t);
    let next = b.add(s, 1u32);
    b.assign(s, next);
    b.bra(add);

    b.place(store);
    b.comment("writer lanes of rows i < m and columns j < n store C[i, j]");
    let row_in = b.setp(Cmp::Lt, r, m);
    let col_in = b.setp(Cmp::Lt, j, n);
    let ok = b.and_pred(row_in, col_in);
    let ok = b.and_pred(ok, writer);
    b.bra_unless(ok, done);
    let ci = b.mad(r, n, j);
    let coff = b.mul_wide(ci, elem::size(output));
    let ca = b.add(cz, coff);
    let val = match epi {
        Some(e) => e.element(&mut b, output, (coff, j), val),
        None => val,
    };
    elem::store(&mut b, output, ca, 0, &[val]);
    b.place(done);
    b.ret();
    b.finish()
}

/// One round of the `B` stored `n × k` loop: the units (of `width` values,
/// `unit_bytes` bytes) of every row of `B` the warp owns, then, per unit, the
/// same bytes of each row of `A` and the multiply-adds into `acc[r][col]`.
#[derive(Clone, Copy)]
struct NtStep<'a> {
    input: DType,
    width: u32,
    unit_bytes: u32,
    brows: &'a [Reg<U64>],
    arows: &'a [Reg<U64>],
    acc: &'a [Vec<Reg<F32>>],
}

impl NtStep<'_> {
    fn round(&self, b: &mut KernelBuilder, units: &[Reg<U32>], guards: Option<&[Reg<Pred>]>) {
        let guard = |t: usize| guards.map(|g| g[t]);
        let offs: Vec<Reg<U64>> = units.iter().map(|&u| b.mul_wide(u, self.unit_bytes)).collect();
        let mut ys: Vec<Vec<Vec<Reg<F32>>>> = Vec::with_capacity(units.len());
        for (t, &off) in offs.iter().enumerate() {
            let mut row = Vec::with_capacity(self.brows.len());
            maybe_guarded(b, guard(t), |b| {
                for &br in self.brows {
                    let q = b.add(br, off);
                    row.push(elem::load(b, self.input, q, 0, self.width as usize));
                }
            });
            ys.push(row);
        }
        for (t, &off) in offs.iter().enumerate() {
            maybe_guarded(b, guard(t), |b| {
                for (r, &ar) in self.arows.iter().enumerate() {
                    let q = b.add(ar, off);
                    let xs = elem::load(b, self.input, q, 0, self.width as usize);
                    for (col, y) in ys[t].iter().enumerate() {
                        for (&x, &y) in xs.iter().zip(y) {
                            b.fma_acc(self.acc[r][col], x, y);
                        }
                    }
                }
            });
        }
    }
}

/// Builds the tensor-core kernel for `B` stored `n × k` and up to 16 rows of
/// `A` (`f16` or `bf16` in, any output): `C[i, j] = Σ_p A[i, p]·B[j, p]` for
/// `i < m ≤ 16`, `j < n`, with `mma.sync.m16n8k16` (sm_80+). Each warp
/// group (`split` warps, a kernel argument) owns `8·tiles` columns; lane
/// `l = 4g + t` of slice `s` reads the 16-byte units `4q + t` (8 values
/// each) of chunk `q = s + i·split` (32 values) of rows `min(g, m − 1)` and
/// `min(g + 8, m − 1)` of `A` and of row `j0 + 8c + g` (clamped to `n − 1`)
/// of `B` for each tile `c`: the same 8 values of both operands, which is all
/// the fragments ask (the product sums over `k` in any order, so the
/// fragments' `k` positions are taken as a permutation of the chunk's). Two
/// `mma` per chunk and tile; a partial last chunk loads the units past `k`
/// as zeros. The slices' `f32` accumulators meet in shared memory, slice 0 adding them in slice
/// order: deterministic. Params: `a`, `b`, `c` (pointers, 16-byte aligned
/// rows: `k` a multiple of 8), `m`, `n`, `k`, `split` (u32, one of
/// [`NT_SPLITS`]), `sa`, `sb`, `sc` (u64, elements between batch matrices).
/// Launch: [`NT_BLOCK`] threads, `(ceil(n / mma_block_cols(tiles, split)),
/// 1, batch)` blocks.
pub fn nt_mma(
    tiles: u32,
    input: DType,
    output: DType,
    epilogue: Option<EpilogueKind>,
    target: Target,
) -> Result<Kernel, BuildError> {
    let name = mma_name(tiles, input, output) + &EpilogueKind::suffix(epilogue);
    let Some(half) = elem::half(input) else {
        return Err(BuildError {
            kernel: name,
            problems: vec![format!("the tensor-core GEMV reads f16 or bf16, not {input}")],
        });
    };
    if !MMA_TILES.contains(&tiles) {
        return Err(BuildError { kernel: name, problems: vec![format!("no tensor-core GEMV of {tiles} tiles")] });
    }
    let unroll = mma_unroll(tiles);
    let per_lane = tiles * 4;
    let mut b = KernelBuilder::new(&name, target);
    b.doc(&format!(
        "{name}: C[i, j] = sum_p A[i, p] * B[j, p] for i < m <= 16, B stored n x k ({input} in, f32 sums on tensor cores, {output} out)"
    ));
    b.doc(&format!(
        "split warps per group of {} columns ({NT_WARPS} warps per block): lane 4g + t of slice s reads 16-byte units 4q + t of chunks q = s + i*split of rows g and g + 8 of A and row g of each 8-column tile of B ({unroll} chunks in flight), two mma.m16n8k16 per chunk and tile",
        8 * tiles
    ));
    b.doc("the slices' accumulators added in order through shared memory");
    b.doc("params: a, b, c (pointers), m, n, k, split (u32), sa, sb, sc (u64 batch strides, elements)");
    b.doc(&format!("launch: {NT_BLOCK} threads, (ceil(n / ({NT_WARPS} / split * {})), 1, batch) blocks", 8 * tiles));
    b.max_threads(NT_BLOCK);
    let a = b.param_ptr("a");
    let bp = b.param_ptr("b");
    let c = b.param_ptr("c");
    let m = b.param::<U32>("m");
    let n = b.param::<U32>("n");
    let k = b.param::<U32>("k");
    let split = b.param::<U32>("split");
    let sa = b.param::<U64>("sa");
    let sb = b.param::<U64>("sb");
    let sc = b.param::<U64>("sc");
    gemm_epilogue::doc(&mut b, epilogue);
    let epi = gemm_epilogue::params(&mut b, epilogue);
    let scratch = b.shared("sums", NT_WARPS * 32 * per_lane * 4, 16);

    let tid = b.tid(Dim::X);
    let lane = b.and(tid, 31u32);
    let warp = b.shr(tid, 5u32);
    let g = b.shr(lane, 2u32);
    let t = b.and(lane, 3u32);
    let group = b.div(warp, split);
    let lead = b.mul(group, split);
    let slice = b.sub(warp, lead);
    let groups = b.div(NT_WARPS, split);
    let cta = b.ctaid(Dim::X);
    let gi = b.mad(cta, groups, group);
    let j0 = b.mul(gi, 8 * tiles);
    let z = b.ctaid(Dim::Z);
    let z = b.cvt::<U64, U32>(z);
    let az = batch_ptr(&mut b, a, z, sa, input);
    let bz = batch_ptr(&mut b, bp, z, sb, input);
    let cz = batch_ptr(&mut b, c, z, sc, output);
    let epi = epi.map(|e| {
        let zc = b.sub(cz, c);
        e.at_batch(&mut b, zc)
    });
    let lane_off = b.mul_wide(t, 16u32);
    // Rows g and g + 8 of A, clamped to row m - 1; columns past n read
    // column n - 1 (in bounds) and are not stored, so every warp reaches the
    // barrier and every lane the mma.
    let last = b.sub(m, 1u32);
    let arows: Vec<Reg<U64>> = [0u32, 8]
        .into_iter()
        .map(|h| {
            let r = b.add(g, h);
            let r = b.min(r, last);
            let off = b.mul_wide(r, k);
            let off = b.shl(off, elem::shift(input));
            let p = b.add(az, off);
            b.add(p, lane_off)
        })
        .collect();
    let nm1 = b.sub(n, 1u32);
    let brows: Vec<Reg<U64>> = (0..tiles)
        .map(|tile| {
            let j = b.add(j0, 8 * tile);
            let j = b.add(j, g);
            let j = b.min(j, nm1);
            let off = b.mul_wide(j, k);
            let off = b.shl(off, elem::shift(input));
            let p = b.add(bz, off);
            b.add(p, lane_off)
        })
        .collect();
    let acc: Vec<[Reg<F32>; 4]> = (0..tiles).map(|_| std::array::from_fn(|_| b.mov(0.0f32))).collect();
    let kunits = b.shr(k, 3u32);
    let full = b.shr(kunits, 2u32);
    let step = MmaStep { half, unit_bytes: 64, arows: &arows, brows: &brows, acc: &acc };
    b.comment(&format!("whole chunks of 32 values, {unroll} in flight"));
    strided_rounds(&mut b, (slice, split, full), unroll, "chunks", |b, qs, guards| {
        step.round(b, qs, guards.map(|g| g.to_vec()))
    });
    b.comment("the partial chunk past the whole ones (k not a multiple of 32): its slice, units past k as zeros");
    let partial = b.label("partial_done");
    let tail = b.and(kunits, 3u32);
    let none = b.setp(Cmp::Eq, tail, 0u32);
    b.bra_if(none, partial);
    let owner = b.rem(full, split);
    let mine = b.setp(Cmp::Eq, owner, slice);
    b.bra_unless(mine, partial);
    let unit = b.mad(full, 4u32, t);
    let inside = b.setp(Cmp::Lt, unit, kunits);
    step.round(&mut b, &[full], Some(vec![inside]));
    b.place(partial);

    let done = b.label("done");
    let store = b.label("store");
    let single = b.setp(Cmp::Eq, split, 1u32);
    b.bra_if(single, store);
    b.comment("slices through shared memory ([warp][value][lane]); slice 0 adds them in order");
    let sbase = b.shared_base(&scratch);
    let slot = b.mad(warp, 32 * per_lane, lane);
    let slot = b.shl(slot, 2u32);
    let mine = b.add(sbase, slot);
    for (tile, vals) in acc.iter().enumerate() {
        for (e, &v) in vals.iter().enumerate() {
            b.st_shared(mine, i64::from((tile as u32 * 4 + e as u32) * 32 * 4), v);
        }
    }
    b.bar_sync();
    let lead_slice = b.setp(Cmp::Eq, slice, 0u32);
    b.bra_unless(lead_slice, done);
    let s = b.mov(1u32);
    let at = b.mov(mine);
    let add = b.label("add_slices");
    b.place(add);
    let past = b.setp(Cmp::Ge, s, split);
    b.bra_if(past, store);
    let next = b.add(at, 32 * per_lane * 4);
    b.assign(at, next);
    for (tile, vals) in acc.iter().enumerate() {
        for (e, &v) in vals.iter().enumerate() {
            let o = b.ld_shared::<F32>(at, i64::from((tile as u32 * 4 + e as u32) * 32 * 4));
            let sum = b.add(v, o);
            b.assign(v, sum);
        }
    }
    let next = b.add(s, 1u32);
    b.assign(s, next);
    b.bra(add);

    b.place(store);
    b.comment("C[g + 8h, j0 + 8c + 2t + e] for rows < m and columns < n");
    let t2 = b.shl(t, 1u32);
    let jt = b.add(j0, t2);
    for (tile, vals) in acc.iter().enumerate() {
        for h in 0..2u32 {
            let r = b.add(g, 8 * h);
            let row_in = b.setp(Cmp::Lt, r, m);
            for e in 0..2u32 {
                let j = b.add(jt, 8 * tile as u32 + e);
                let col_in = b.setp(Cmp::Lt, j, n);
                let ok = b.and_pred(row_in, col_in);
                let ci = b.mad(r, n, j);
                let coff = b.mul_wide(ci, elem::size(output));
                let ca = b.add(cz, coff);
                let skip = b.label(&format!("skip_{tile}_{h}_{e}"));
                b.bra_unless(ok, skip);
                let v = vals[(2 * h + e) as usize];
                let v = match epi {
                    Some(ep) => ep.element(&mut b, output, (coff, j), v),
                    None => v,
                };
                elem::store(&mut b, output, ca, 0, &[v]);
                b.place(skip);
            }
        }
    }
    b.place(done);
    b.ret();
    b.finish()
}

/// One round of the tensor-core loop: for each chunk `q` of `chunks`, the
/// 16-byte unit `4q + t` of both rows of `A` and of each tile's row of `B`,
/// all loaded before the round's `mma`. With `guards` (one per chunk), a
/// chunk whose guard is false loads zeros (the `mma` still runs: it is
/// warp-wide).
#[derive(Clone, Copy)]
struct MmaStep<'a> {
    half: crate::builder::Half,
    unit_bytes: u32,
    arows: &'a [Reg<U64>],
    brows: &'a [Reg<U64>],
    acc: &'a [[Reg<F32>; 4]],
}

impl MmaStep<'_> {
    fn round(&self, b: &mut KernelBuilder, chunks: &[Reg<U32>], guards: Option<Vec<Reg<Pred>>>) {
        let mut loaded = Vec::with_capacity(chunks.len());
        for (i, &q) in chunks.iter().enumerate() {
            let off = b.mul_wide(q, self.unit_bytes);
            let guard = guards.as_ref().map(|g| g[i]);
            let load = |b: &mut KernelBuilder, row: Reg<U64>| -> [Reg<U32>; 4] {
                let p = b.add(row, off);
                match guard {
                    None => b.ld_global_nc_v::<U32, 4>(p, 0),
                    Some(g) => {
                        let dst: [Reg<U32>; 4] = std::array::from_fn(|_| b.mov(0u32));
                        b.guarded(g, false, |b| b.ld_global_v_into(dst, p, 0));
                        dst
                    }
                }
            };
            let lo = load(b, self.arows[0]);
            let hi = load(b, self.arows[1]);
            let ws: Vec<[Reg<U32>; 4]> = self.brows.iter().map(|&r| load(b, r)).collect();
            loaded.push((lo, hi, ws));
        }
        for (lo, hi, ws) in loaded {
            let lo = lo.map(|r| b.bitcast::<B32, U32>(r));
            let hi = hi.map(|r| b.bitcast::<B32, U32>(r));
            for (tile, w) in ws.into_iter().enumerate() {
                let w = w.map(|r| b.bitcast::<B32, U32>(r));
                b.mma_m16n8k16_acc(self.half, self.acc[tile], [lo[0], hi[0], lo[1], hi[1]], [w[0], w[1]]);
                b.mma_m16n8k16_acc(self.half, self.acc[tile], [lo[2], hi[2], lo[3], hi[3]], [w[2], w[3]]);
            }
        }
    }
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
    check_rows(&name, rows, NN_MAX_ROWS)?;
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
