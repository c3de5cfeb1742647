//! SGEMM: `C = op(A)·op(B)`, BLIS-style, with register-tiled micro-kernels
//! per ISA (module `kernel`: AVX-512 6×64, AVX2+FMA 6×16, portable `wide`).
//!
//! Loops, outermost first: row blocks of [`GEMM_MC`] → depth blocks of
//! [`GEMM_KC`] → column blocks of [`GEMM_NC`] (`B` packed into `nr`-column
//! panels, L2-resident) → `mr × nr` register tiles, columns innermost, so the
//! `mr` rows of `A` of a tile stay in L1 while the `B` panels stream past.
//! A row-major `A` is read in place (broadcasts need no packing); a transposed
//! one is packed into `mr`-row panels. Transposes are absorbed by the packing
//! (module `pack`), so all four transpose combinations run at about the same speed.
//!
//! Short products skip packing: with at most [`GEMM_INPLACE_B_MAX_M`] rows a
//! row-major `B` is read in place (software-prefetched), with at most
//! [`GEMM_DOTS_MAX_M`] rows a transposed `B` is used as rows of dot products,
//! and a one-column product runs as a one-row product of the transposes.
//!
//! Above [`PAR_GEMM_MIN_MACS`] the columns (or, for narrow products, the rows)
//! of `C` are split into one part per thread of the pool in scope; each
//! thread packs into its own reusable buffers. Many small products of a batch
//! run one per task instead.
//!
//! bf16 operands on a CPU with AVX512_BF16 take [`bf16::gemm`]: the same
//! loops on depth-pair panels and a `vdpbf16ps` micro-kernel.
//!
//! A matmul's epilogue (scales, `C₀`, bias, activation) is applied by both
//! GEMMs to the values of `C` right after their last depth block, on the
//! thread that computed them, in strips of [`GEMM_EPILOGUE_ROWS`] rows where
//! that keeps them in cache ([`epilogue`]).
//!
//! Fused kernels (attention) run their small products block by block on
//! the same micro-kernels, on their own thread: `pack_transposed` and
//! `packed_product` (a `B` packed once for several products),
//! `rows_product` (a row-major `B` read in place) and `dots_product`; bf16
//! decoding attention runs `dpbf16::scores` and `dpbf16::weighted`.
//!
//! Only the micro-kernel modules (`kernel.rs`, `dpbf16.rs`) contain `unsafe`.

pub mod bf16;
pub(crate) mod dpbf16;
pub mod epilogue;
mod kernel;
mod pack;
#[cfg(test)]
mod tests;

use std::cell::RefCell;

use compute_core::MatmulSpec;

use crate::isa::Isa;
use crate::kernels::fork;
use crate::tuning::{
    GEMM_DOTS_MAX_M, GEMM_EPILOGUE_ROWS, GEMM_INPLACE_B_MAX_M, GEMM_KC, GEMM_MC, GEMM_NC, PAR_GEMM_MIN_MACS,
};
use epilogue::{EpilogueArgs, Finish};
use kernel::{Block, MatMut, PanelsA, PanelsB, Tile};
use pack::Operands;

/// Computes the product described by `spec` into `c` (overwriting it), on the
/// kernel of `isa` (the portable one if this CPU lacks `isa`), applying
/// `epilogue` (not `spec.epilogue`: [`EpilogueArgs::new`] makes one from it
/// and the op's inputs; [`EpilogueArgs::none`] for the plain product) to each
/// block of `C` as it is completed ([`epilogue`]). Shapes are validated by
/// the caller; a short slice only shortens the work.
///
/// Costs `2·batch·m·k·n` FLOPs, at close to the FMA peak of the ISA for large
/// products, plus packing (one copy of `B`, and of a transposed `A`, per
/// thread); uses every thread of the pool in scope above
/// [`PAR_GEMM_MIN_MACS`] multiply-adds. Allocates nothing per call beyond
/// each thread's first packing buffers (kept for reuse, about
/// `(GEMM_MC + GEMM_NC)·GEMM_KC` values) and a small list of parts. An
/// epilogue adds one read and write of each value of `C` while it is still
/// in cache, and one read of `C₀`.
pub fn sgemm(isa: Isa, spec: &MatmulSpec, a: &[f32], b: &[f32], epilogue: &EpilogueArgs<'_>, c: &mut [f32]) {
    let isa = if isa.is_supported() { isa } else { Isa::Portable };
    let MatmulSpec { batch, m, k, n, trans_a, trans_b, .. } = *spec;
    let (sa, sb, sc) = (m.saturating_mul(k), k.saturating_mul(n), m.saturating_mul(n));
    if batch == 0 || sc == 0 {
        return;
    }
    if k == 0 {
        empty_depth(isa, (batch, m, n), epilogue, c);
        return;
    }
    let operands = |a, b| Operands { a, b, m, k, n, trans_a, trans_b };
    let threads = crate::kernels::par::threads();
    let macs = sc.saturating_mul(k);
    let small_or_many = macs < PAR_GEMM_MIN_MACS || batch >= threads;
    if threads > 1 && batch > 1 && small_or_many && macs.saturating_mul(batch) >= PAR_GEMM_MIN_MACS {
        // Products too small to split, or at least one per thread: one task per
        // product. (Splitting each 64³ product of a merged batch over 16 threads
        // held the batching executor to 1/50 of the unbatched request rate on
        // the 16-core GPU machine.)
        let whole = batch.min(c.len() / sc) * sc;
        let c = c.get_mut(..whole).unwrap_or_default();
        fork::chunks_mut(c, sc, |i, c| {
            if let (Some(a), Some(b)) = (a.get(i * sa..(i + 1) * sa), b.get(i * sb..(i + 1) * sb)) {
                product(isa, &operands(a, b), epilogue.product(i, m, n).as_ref(), c, 1);
            }
        });
    } else {
        let products = a.chunks_exact(sa).zip(b.chunks_exact(sb)).zip(c.chunks_exact_mut(sc)).take(batch);
        for (i, ((a, b), c)) in products.enumerate() {
            product(isa, &operands(a, b), epilogue.product(i, m, n).as_ref(), c, threads);
        }
    }
}

/// A product of depth 0 (every value of `op(A)·op(B)` is 0) into the
/// `batch` products of `m × n` in `c`, with `epilogue` applied. One pass
/// over `c` on the calling thread.
pub(crate) fn empty_depth(isa: Isa, (batch, m, n): (usize, usize, usize), epilogue: &EpilogueArgs<'_>, c: &mut [f32]) {
    let sc = m.saturating_mul(n);
    for (i, c) in c.chunks_exact_mut(sc.max(1)).take(batch).enumerate() {
        c.fill(0.0);
        if let (Some(finish), Some(mut view)) = (epilogue.product(i, m, n), MatMut::new(c, m, n, n)) {
            finish.apply(isa, (0, 0), &mut view);
        }
    }
}

/// Applies `epilogue` to the one `m × n` product already in `c` (row-major),
/// on the calling thread: one pass over `c`.
pub(crate) fn finish_product(isa: Isa, (m, n): (usize, usize), epilogue: &EpilogueArgs<'_>, c: &mut [f32]) {
    if let (Some(finish), Some(mut view)) = (epilogue.product(0, m, n), MatMut::new(c, m, n, n)) {
        finish.apply(isa, (0, 0), &mut view);
    }
}

/// One product into `c` (`m×n`), split across up to `threads` threads, with
/// `finish` applied to each block as it is completed.
fn product(isa: Isa, op: &Operands<'_>, finish: Option<&Finish<'_>>, c: &mut [f32], threads: usize) {
    let swapped = op.n == 1 && op.m > 1;
    let op = &normalized(op);
    let turned = finish.filter(|_| swapped).map(|f| f.transposed(op.n));
    let finish = if swapped { turned.as_ref() } else { finish };
    let (m, n, k) = (op.m, op.n, op.k);
    let macs = m.saturating_mul(k).saturating_mul(n);
    let threads = if macs < PAR_GEMM_MIN_MACS { 1 } else { threads };
    let Some(view) = MatMut::new(c, m, n, n) else {
        return;
    };
    // Few rows times a transposed B: dot products along the contiguous depth
    // beat transposing all of B into panels.
    let dots = op.trans_b && m <= GEMM_DOTS_MAX_M;
    let a_rows = if dots && op.trans_a { transposed(op.a, k, m) } else { Vec::new() };
    let x = if dots && op.trans_a { &a_rows[..] } else { op.a };
    let run = |(i0, j0): (usize, usize), mut part: MatMut<'_>| {
        if dots {
            let x = x.get(i0 * k..).unwrap_or_default();
            kernel::dots(isa, k, (x, k), (op.b.get(j0 * k..).unwrap_or_default(), k), &mut part);
            if let Some(f) = finish {
                f.apply(isa, (i0, j0), &mut part);
            }
        } else {
            compute(isa, op, (i0, j0), finish, part);
        }
    };
    if threads <= 1 {
        run((0, 0), view);
        return;
    }
    let t = kernel::tile(isa);
    let (row_unit, col_unit) = if dots { (1, 8) } else { (t.mr, t.nr) };
    let (row_units, col_units) = (m.div_ceil(row_unit), n.div_ceil(col_unit));
    // Columns first: each thread then packs only its own part of B. A
    // transposed A is packed too: rows first then, so that is not done twice.
    let by_cols = col_units >= 2 * threads && !(op.trans_a && !dots && row_units >= 2 * threads);
    let parts = split_parts(view, (row_unit, col_unit), threads, by_cols);
    fork::each(parts, |(origin, part)| run(origin, part));
}

/// `view` cut into at most `threads` parts, each with its origin (row,
/// column): columns in whole `col_unit`s when `by_cols`, else rows in whole
/// `row_unit`s, as equal as the units allow. Costs one small allocation.
fn split_parts(
    view: MatMut<'_>,
    (row_unit, col_unit): (usize, usize),
    threads: usize,
    by_cols: bool,
) -> Vec<((usize, usize), MatMut<'_>)> {
    let threads = threads.max(1);
    let mut parts = Vec::with_capacity(threads);
    let mut rest = view;
    if by_cols {
        let cols = rest.cols().div_ceil(col_unit).div_ceil(threads) * col_unit;
        let mut j0 = 0;
        while rest.cols() > 0 {
            let (part, tail) = rest.split_cols(cols);
            parts.push(((0, j0), part));
            j0 += cols;
            rest = tail;
        }
    } else {
        let rows = rest.rows().div_ceil(row_unit).div_ceil(threads) * row_unit;
        let mut i0 = 0;
        while rest.rows() > 0 {
            let (part, tail) = rest.split_rows(rows);
            parts.push(((i0, 0), part));
            i0 += rows;
            rest = tail;
        }
    }
    parts
}

/// The `cols × rows` transpose of the row-major `rows × cols` matrix `a`.
/// Costs one pass over `a` and an allocation.
fn transposed(a: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0; rows * cols];
    for (r, row) in a.chunks_exact(cols).take(rows).enumerate() {
        for (x, &v) in t.iter_mut().skip(r).step_by(rows).zip(row) {
            *x = v;
        }
    }
    t
}

/// The same product in its cheapest form: a one-row `op(A)` or one-column
/// `op(B)` reads the same either way, and a one-column product is computed as
/// the one-row product `Cᵀ = op(B)ᵀ·op(A)ᵀ` (same memory for `C`).
fn normalized<'a>(op: &Operands<'a>) -> Operands<'a> {
    let mut op = *op;
    op.trans_a &= op.m > 1;
    op.trans_b &= op.n > 1;
    if op.n == 1 && op.m > 1 {
        op = Operands { a: op.b, b: op.a, m: 1, k: op.k, n: op.m, trans_a: false, trans_b: !op.trans_a };
    }
    op
}

/// The block of `C = op(A)·op(B)` at `origin` (row, column) into the view
/// `c`, on one thread; `finish` is applied to the values right after their
/// last depth block, strip by strip ([`GEMM_EPILOGUE_ROWS`]).
fn compute(isa: Isa, op: &Operands<'_>, (i0, j0): (usize, usize), finish: Option<&Finish<'_>>, mut c: MatMut<'_>) {
    let t = kernel::tile(isa);
    let Tile { mr, nr } = t;
    let (mc, nc, k) = (c.rows(), c.cols(), op.k);
    let kc = balanced(k, GEMM_KC, 1);
    // A row-major A is read in place; a transposed one is packed.
    let a_in_place = !op.trans_a;
    // Few rows reuse each value of B too little to pay for packing it: a
    // row-major B is then read in place (only its ragged last columns are packed).
    let b_in_place = !op.trans_b && mc <= GEMM_INPLACE_B_MAX_M;
    let mcb = if a_in_place { mc.max(1) } else { balanced(mc, GEMM_MC, mr) };
    let ncb = if b_in_place { nc.max(1) } else { balanced(nc, GEMM_NC, nr) };
    let a_len = if a_in_place { 0 } else { mcb.next_multiple_of(mr) * kc };
    let b_len = if b_in_place { nr * kc } else { ncb.next_multiple_of(nr) * kc };
    with_buffers(a_len, b_len, |abuf, bbuf| {
        for ib in (0..mc).step_by(mcb) {
            let mcur = mcb.min(mc - ib);
            for (pi, p) in (0..k).step_by(kc).enumerate() {
                let kcur = kc.min(k - p);
                let accumulate = pi > 0;
                let last = p + kcur == k;
                let a = if a_in_place {
                    let s = (i0 + ib) * k + p;
                    PanelsA::Rows { a: op.a.get(s..).unwrap_or_default(), lda: k }
                } else {
                    pack::pack_a(isa, op, t, (i0 + ib, mcur), (p, kcur), abuf);
                    PanelsA::Packed(abuf)
                };
                // The epilogue finishes the last depth block in strips of
                // rows, each while it is in cache: the tiles run in the same
                // order (rows of tiles outermost) but for a B read in place,
                // whose tiles go down the rows, so that it is read once.
                let finish = finish.filter(|_| last);
                let strip =
                    if finish.is_some() && !b_in_place { GEMM_EPILOGUE_ROWS.next_multiple_of(mr) } else { mcur };
                for jb in (0..nc).step_by(ncb) {
                    let ncur = ncb.min(nc - jb);
                    let full = if b_in_place { ncur / nr * nr } else { 0 };
                    if full < ncur {
                        pack::pack_b(isa, op, t, (p, kcur), (j0 + jb + full, ncur - full), bbuf);
                    }
                    for s0 in (0..mcur).step_by(strip.max(1)) {
                        let (rows, a) = (strip.min(mcur - s0), a.skip_rows(s0, kcur));
                        if full > 0 {
                            let s = p * op.n + j0 + jb;
                            let b = PanelsB::Rows { b: op.b.get(s..).unwrap_or_default(), ldb: op.n };
                            let blk = Block { kc: kcur, a, b, accumulate };
                            kernel::block(isa, &blk, &mut c.block(ib + s0, jb, rows, full));
                        }
                        if full < ncur {
                            let blk = Block { kc: kcur, a, b: PanelsB::Packed(bbuf), accumulate };
                            kernel::block(isa, &blk, &mut c.block(ib + s0, jb + full, rows, ncur - full));
                        }
                        if let Some(f) = finish {
                            f.apply(isa, (i0 + ib + s0, j0 + jb), &mut c.block(ib + s0, jb, rows, ncur));
                        }
                    }
                }
            }
        }
    });
}

/// `op(B)` of several products of a fused kernel (attention), packed once by
/// [`pack_transposed`] into the panels the micro-kernels read.
#[derive(Clone, Copy)]
pub(crate) struct PackedB<'a> {
    panels: &'a [f32],
    k: usize,
    n: usize,
}

/// Values of the buffer [`pack_transposed`] and [`rows_product`] need for
/// depth `k` and `n` columns on `isa`: `n` rounded up to whole panels, times
/// `k`. Costs nothing.
pub(crate) fn packed_len(isa: Isa, k: usize, n: usize) -> usize {
    n.next_multiple_of(kernel::tile(isa).nr).saturating_mul(k)
}

/// Packs `op(B) = Bᵀ` (`k × n`) of `B` stored `n × k` (rows contiguous) into
/// `buf`, for [`packed_product`]. `None` if `buf` is shorter than
/// [`packed_len`]. Costs one transposing copy of `B`.
pub(crate) fn pack_transposed<'a>(isa: Isa, b: &[f32], k: usize, n: usize, buf: &'a mut [f32]) -> Option<PackedB<'a>> {
    let isa = if isa.is_supported() { isa } else { Isa::Portable };
    let t = kernel::tile(isa);
    let panels = buf.get_mut(..packed_len(isa, k, n))?;
    let op = Operands { a: &[], b, m: 0, k, n, trans_a: false, trans_b: true };
    pack::pack_b(isa, &op, t, (0, k), (0, n), panels);
    Some(PackedB { panels, k, n })
}

/// `C (+)= A·op(B)[:, ..n]` into `c` (`m × n`, row stride `ldc`) on the
/// calling thread: `A` is `m × k` (row `i` at `a[i·lda..][..k]`, read in
/// place), `op(B)` packed by [`pack_transposed`] with the same depth and at
/// least `n` columns (its first `n` are used). Costs `2·m·k·n` FLOPs (`n`
/// rounded up to whole panels) on the SGEMM micro-kernels. Does nothing if a
/// length is inconsistent; `isa` must be the one `b` was packed for.
pub(crate) fn packed_product(
    isa: Isa,
    (a, lda): (&[f32], usize),
    (m, n): (usize, usize),
    b: &PackedB<'_>,
    (c, ldc): (&mut [f32], usize),
    accumulate: bool,
) {
    let isa = if isa.is_supported() { isa } else { Isa::Portable };
    if m == 0 || n == 0 || b.k == 0 || n > b.n {
        return;
    }
    let Some(mut view) = MatMut::new(c, m, n, ldc) else { return };
    let blk = Block { kc: b.k, a: PanelsA::Rows { a, lda }, b: PanelsB::Packed(b.panels), accumulate };
    kernel::block(isa, &blk, &mut view);
}

/// `C = A·Bᵀ` into `c` (`m × n`, row stride `ldc`) as dot products of rows,
/// without packing: `A` is `m × k` (row stride `lda`), `B` is `n × k` with
/// contiguous rows. Meant for a few rows of `A` (up to [`GEMM_DOTS_MAX_M`]).
/// Costs `2·m·k·n` FLOPs plus a horizontal sum per element. Does nothing if
/// a length is inconsistent.
pub(crate) fn dots_product(
    isa: Isa,
    (a, lda): (&[f32], usize),
    (m, k, n): (usize, usize, usize),
    b: &[f32],
    (c, ldc): (&mut [f32], usize),
) {
    let isa = if isa.is_supported() { isa } else { Isa::Portable };
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    let Some(mut view) = MatMut::new(c, m, n, ldc) else { return };
    kernel::dots(isa, k, (a, lda), (b, k), &mut view);
}

/// `C (+)= A·B` into `c` (`m × n`, row stride `ldc`) on the calling thread:
/// `A` is `m × k` (row stride `lda`) and `B` is `k × n` row-major (row stride
/// `n`), both read in place, but for the columns of `B` past its last whole
/// panel, which are packed into `buf` (at least [`packed_len`] values).
/// Costs `2·m·k·n` FLOPs on the SGEMM micro-kernels. Does nothing if a
/// length is inconsistent.
pub(crate) fn rows_product(
    isa: Isa,
    (a, lda): (&[f32], usize),
    (m, k, n): (usize, usize, usize),
    b: &[f32],
    (c, ldc): (&mut [f32], usize),
    accumulate: bool,
    buf: &mut [f32],
) {
    let isa = if isa.is_supported() { isa } else { Isa::Portable };
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    let Some(mut view) = MatMut::new(c, m, n, ldc) else { return };
    let t = kernel::tile(isa);
    let pa = PanelsA::Rows { a, lda };
    let full = n / t.nr * t.nr;
    if full > 0 {
        let blk = Block { kc: k, a: pa, b: PanelsB::Rows { b, ldb: n }, accumulate };
        kernel::block(isa, &blk, &mut view.block(0, 0, m, full));
    }
    if full < n {
        let Some(buf) = buf.get_mut(..packed_len(isa, k, n - full)) else { return };
        let op = Operands { a: &[], b, m, k, n, trans_a: false, trans_b: false };
        pack::pack_b(isa, &op, t, (0, k), (full, n - full), buf);
        let blk = Block { kc: k, a: pa, b: PanelsB::Packed(buf), accumulate };
        kernel::block(isa, &blk, &mut view.block(0, full, m, n - full));
    }
}

/// The block size for `len` elements at most `max` per block (a multiple of
/// `unit`), with the blocks as equal as possible.
fn balanced(len: usize, max: usize, unit: usize) -> usize {
    let max = max.max(unit);
    let blocks = len.div_ceil(max).max(1);
    len.div_ceil(blocks).next_multiple_of(unit).max(unit)
}

thread_local! {
    /// Packing buffers of this thread, kept between calls.
    static PACK: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with two 64-byte-aligned packing buffers of `a_len` and `b_len`
/// values, from this thread's reusable storage (a fresh allocation only on
/// first use, growth, or re-entry).
fn with_buffers(a_len: usize, b_len: usize, f: impl FnOnce(&mut [f32], &mut [f32])) {
    with_thread_buffers(&PACK, a_len, b_len, f)
}

/// [`with_buffers`] from the thread-local storage `key` (values of 4 bytes).
fn with_thread_buffers<T: Copy + Default + 'static>(
    key: &'static std::thread::LocalKey<RefCell<Vec<T>>>,
    a_len: usize,
    b_len: usize,
    f: impl FnOnce(&mut [T], &mut [T]),
) {
    let mut f = Some(f);
    let _ = key.try_with(|cell| {
        if let Ok(mut v) = cell.try_borrow_mut()
            && let Some(f) = f.take()
        {
            split(&mut v, a_len, b_len, f);
        }
    });
    if let Some(f) = f {
        split(&mut Vec::new(), a_len, b_len, f);
    }
}

/// Grows `v` as needed and hands `f` two disjoint 64-byte-aligned slices of
/// it (`T` is a 4-byte value: `f32`, or the bf16 GEMM's pair words).
fn split<T: Copy + Default>(v: &mut Vec<T>, a_len: usize, b_len: usize, f: impl FnOnce(&mut [T], &mut [T])) {
    const ALIGN: usize = 16; // 4-byte values in 64 bytes
    let a_pad = a_len.next_multiple_of(ALIGN);
    let need = a_pad + b_len + ALIGN;
    if v.len() < need {
        v.resize(need, T::default());
    }
    let off = v.as_ptr().align_offset(64).min(ALIGN);
    if let Some((a, b)) = v.get_mut(off..off + a_pad + b_len).and_then(|s| s.split_at_mut_checked(a_pad))
        && let (Some(a), Some(b)) = (a.get_mut(..a_len), b.get_mut(..b_len))
    {
        f(a, b);
    }
}
