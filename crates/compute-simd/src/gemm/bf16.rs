//! bf16 GEMM with `f32` accumulation on CPUs with AVX512_BF16: `C = op(A)·op(B)`
//! for bf16 `A` and `B` into an `f32` `C`, at up to twice the `f32` GEMM's
//! multiply-add rate (each `vdpbf16ps` takes two steps of depth).
//!
//! The loops are the `f32` GEMM's (module docs of [`super`]): row blocks of
//! [`GEMM_MC`] → depth blocks of [`KC`] → column blocks of [`NC`] → 6×64
//! register tiles (module `dpbf16`), columns innermost. Both operands are
//! packed, whatever their transposes, into panels of depth *pairs*: one
//! 32-bit word holds two bf16 values that are neighbours along the depth (an
//! odd depth is padded with a zero), which is the layout `vdpbf16ps` reads.
//! Packing keeps 2 bytes per value, so it moves no more than the operands.
//! A transposed `B` times at most [`GEMM_DOTS_MAX_M`] rows (a weight stored
//! `n × k` times a few activations: decoding) is not packed: each element is
//! a dot product of two rows read in place, 32 values of depth per load.
//! The columns (or, for narrow products, the rows) are split over the pool's
//! threads above [`PAR_GEMM_MIN_MACS`], and small products of a batch run one
//! per task, as in the `f32` GEMM.
//!
//! Values are rounded as the instruction defines: each product is exact,
//! each sum of two products and the accumulator rounds to `f32`, and
//! subnormal bf16 inputs count as zero (they are below 1.2·10⁻³⁸).

use std::cell::RefCell;

use compute_core::MatmulSpec;
use half::bf16;

use super::dpbf16::{self, MR, NR};
use super::epilogue::{EpilogueArgs, Finish};
use super::kernel::MatMut;
use super::{balanced, empty_depth, pack, split_parts, with_thread_buffers};
use crate::isa::Isa;
use crate::kernels::{fork, par};
use crate::tuning::{GEMM_DOTS_MAX_M, GEMM_MC, PAR_GEMM_MIN_MACS};

/// Depth block in bf16 values (an even number): the `MR × KC` values of `A`
/// of a tile (12 KiB) stay in L1 while the kernel sweeps the packed
/// `KC × NC` block of `B` (1 MiB at most, L2).
pub const KC: usize = 1024;

/// Column block: columns of `B` packed at once.
pub const NC: usize = 512;

/// Whether [`gemm`] runs on this CPU with `isa`: the AVX-512 path on a CPU
/// with AVX512_BF16. Costs an atomic load.
pub fn available(isa: Isa) -> bool {
    isa == Isa::Avx512 && dpbf16::available()
}

/// Computes the product described by `spec` (its dtypes and epilogue are
/// not read: `a` and `b` are bf16, `c` is `f32`) into `c`, overwriting it,
/// with `epilogue` applied as [`super::sgemm`] does, and returns true;
/// returns false, having written nothing, where [`available`] is false.
/// Shapes are validated by the caller; a short slice only shortens the work.
///
/// Costs `2·batch·m·k·n` FLOPs at up to twice the `f32` GEMM's rate, plus
/// packing (one copy of `B` per row block and thread, one of `A` per
/// thread), in reusable per-thread buffers (about `(GEMM_MC + NC)·KC` bf16
/// values).
pub fn gemm(isa: Isa, spec: &MatmulSpec, a: &[bf16], b: &[bf16], epilogue: &EpilogueArgs<'_>, c: &mut [f32]) -> bool {
    if !available(isa) {
        return false;
    }
    let MatmulSpec { batch, m, k, n, trans_a, trans_b, .. } = *spec;
    let (sa, sb, sc) = (m.saturating_mul(k), k.saturating_mul(n), m.saturating_mul(n));
    if batch == 0 || sc == 0 {
        return true;
    }
    if k == 0 {
        empty_depth(isa, (batch, m, n), epilogue, c);
        return true;
    }
    let operands = |a, b| Operands { a, b, m, k, n, trans_a, trans_b };
    let threads = par::threads();
    let macs = sc.saturating_mul(k);
    let small_or_many = macs < PAR_GEMM_MIN_MACS || batch >= threads;
    if threads > 1 && batch > 1 && small_or_many && macs.saturating_mul(batch) >= PAR_GEMM_MIN_MACS {
        let whole = batch.min(c.len() / sc) * sc;
        let c = c.get_mut(..whole).unwrap_or_default();
        fork::chunks_mut(c, sc, |i, c| {
            if let (Some(a), Some(b)) = (a.get(i * sa..(i + 1) * sa), b.get(i * sb..(i + 1) * sb)) {
                product(&operands(a, b), epilogue.product(i, m, n).as_ref(), c, 1);
            }
        });
    } else {
        let products = a.chunks_exact(sa).zip(b.chunks_exact(sb)).zip(c.chunks_exact_mut(sc)).take(batch);
        for (i, ((a, b), c)) in products.enumerate() {
            product(&operands(a, b), epilogue.product(i, m, n).as_ref(), c, threads);
        }
    }
    true
}

/// The operands of one product, row-major: `A` is `m×k` (`k×m` when
/// `trans_a`), `B` is `k×n` (`n×k` when `trans_b`).
#[derive(Clone, Copy)]
struct Operands<'a> {
    a: &'a [bf16],
    b: &'a [bf16],
    m: usize,
    k: usize,
    n: usize,
    trans_a: bool,
    trans_b: bool,
}

/// One product into `c` (`m×n`), split across up to `threads` threads: by
/// columns when there are at least two panels per thread (each thread then
/// packs only its own part of `B`), else by rows. Few rows times a
/// transposed `B` run as dot products read in place ([`dpbf16::dots`]),
/// split by columns. `finish` is applied to each block as it is completed.
fn product(op: &Operands<'_>, finish: Option<&Finish<'_>>, c: &mut [f32], threads: usize) {
    let (m, n, k) = (op.m, op.n, op.k);
    let Some(view) = MatMut::new(c, m, n, n) else {
        return;
    };
    let threads = if m.saturating_mul(k).saturating_mul(n) < PAR_GEMM_MIN_MACS { 1 } else { threads };
    if op.trans_b && m <= GEMM_DOTS_MAX_M {
        let a_rows: Vec<bf16> = if op.trans_a { transposed(op.a, k, m) } else { Vec::new() };
        let x: &[u16] = bytemuck::cast_slice(if op.trans_a { &a_rows } else { op.a });
        let y: &[u16] = bytemuck::cast_slice(op.b);
        let run = |j0: usize, mut part: MatMut<'_>| {
            dpbf16::dots(k, (x, k), (y.get(j0 * k..).unwrap_or_default(), k), &mut part);
            if let Some(f) = finish {
                f.apply(Isa::Avx512, (0, j0), &mut part);
            }
        };
        if threads <= 1 {
            run(0, view);
            return;
        }
        // Columns split evenly (multiples of 8), one part per thread.
        let parts = split_parts(view, (1, 8), threads, true);
        fork::each(parts, |((_, j0), part)| run(j0, part));
        return;
    }
    if threads <= 1 {
        compute(op, (0, 0), finish, view);
        return;
    }
    let (row_units, col_units) = (m.div_ceil(MR), n.div_ceil(NR));
    let parts = split_parts(view, (MR, NR), threads, col_units >= 2 * threads || col_units >= row_units);
    fork::each(parts, |(origin, part)| compute(op, origin, finish, part));
}

/// The block of `C` at `origin` (row, column) into the view `c`, on one
/// thread; `finish` is applied to each `GEMM_MC × NC` block right after its
/// last depth block.
fn compute(op: &Operands<'_>, (i0, j0): (usize, usize), finish: Option<&Finish<'_>>, mut c: MatMut<'_>) {
    let (mc, nc, k) = (c.rows(), c.cols(), op.k);
    let kc = balanced(k, KC, 2);
    let mcb = balanced(mc, GEMM_MC, MR);
    let ncb = balanced(nc, NC, NR);
    let pairs_max = kc / 2;
    with_buffers(mcb.next_multiple_of(MR) * pairs_max, ncb.next_multiple_of(NR) * pairs_max, |abuf, bbuf| {
        for ib in (0..mc).step_by(mcb) {
            let mcur = mcb.min(mc - ib);
            for (pi, p) in (0..k).step_by(kc).enumerate() {
                let kcur = kc.min(k - p);
                let pairs = kcur.div_ceil(2);
                pack_a(op, (i0 + ib, mcur), (p, kcur), abuf);
                for jb in (0..nc).step_by(ncb) {
                    let ncur = ncb.min(nc - jb);
                    pack_b(op, (p, kcur), (j0 + jb, ncur), bbuf);
                    dpbf16::block(pairs, abuf, bbuf, &mut c.block(ib, jb, mcur, ncur), pi > 0);
                    if let Some(f) = finish.filter(|_| p + kcur == k) {
                        f.apply(Isa::Avx512, (i0 + ib, j0 + jb), &mut c.block(ib, jb, mcur, ncur));
                    }
                }
            }
        }
    });
}

/// The `cols × rows` transpose of the row-major `rows × cols` matrix `a`.
/// Costs one pass over `a` and an allocation (`rows·cols` bf16 values).
fn transposed(a: &[bf16], rows: usize, cols: usize) -> Vec<bf16> {
    let mut t = vec![bf16::ZERO; rows * cols];
    for (r, row) in a.chunks_exact(cols).take(rows).enumerate() {
        for (x, &v) in t.iter_mut().skip(r).step_by(rows).zip(row) {
            *x = v;
        }
    }
    t
}

/// `x` (rows of `k` values) as 32-bit words, each a pair of neighbours along
/// a row (the first in the low half, as [`pair`] makes it), typed `f32` for
/// the packing's transposes (which move bits, never values): when `k` is
/// even and `x` starts on a 4-byte boundary. Costs nothing.
fn words(x: &[bf16], k: usize) -> Option<&[f32]> {
    if !k.is_multiple_of(2) {
        return None;
    }
    bytemuck::try_cast_slice(x.get(..x.len() & !1)?).ok()
}

/// The word holding `lo` (low half) and `hi`.
#[inline(always)]
fn pair(lo: bf16, hi: bf16) -> u32 {
    u32::from(lo.to_bits()) | (u32::from(hi.to_bits()) << 16)
}

/// Packs rows `i0..i0+rows` and depths `p0..p0+depth` of `op(A)` into
/// `⌈rows/MR⌉` panels of `⌈depth/2⌉` steps of [`MR`] pair words (rows past
/// the end and the odd depth's partner are zero). One read and one write
/// per value.
fn pack_a(op: &Operands<'_>, (i0, rows): (usize, usize), (p0, depth): (usize, usize), dst: &mut [u32]) {
    let pairs = depth.div_ceil(2);
    let (m, k) = (op.m, op.k);
    for (panel, dst) in dst.chunks_exact_mut(MR * pairs).take(rows.div_ceil(MR)).enumerate() {
        let i = i0 + panel * MR;
        let live = (rows - panel * MR).min(MR);
        if op.trans_a {
            // A(i, p) = a[p·m + i]: each depth is contiguous across the rows.
            let row = |p: usize| op.a.get(p * m + i..).and_then(|s| s.get(..live)).unwrap_or_default();
            for (q, d) in dst.chunks_exact_mut(MR).enumerate() {
                let p = p0 + 2 * q;
                let (lo, hi) = (row(p), if 2 * q + 1 < depth { row(p + 1) } else { &[] });
                for (r, w) in d.iter_mut().enumerate() {
                    *w = match lo.get(r) {
                        Some(&l) => pair(l, hi.get(r).copied().unwrap_or(bf16::ZERO)),
                        None => 0,
                    };
                }
            }
        } else {
            // A(i, p) = a[i·k + p]: each row is contiguous along the depth.
            runs_into_lanes(dst, MR, live, |r| op.a.get((i + r) * k + p0..).and_then(|s| s.get(..depth)));
        }
    }
}

/// Lane `l < width` of every `width`-word step of `dst` gets the pair words
/// of `run(l)` (bf16 values contiguous along the depth, an odd last value
/// paired with zero); lanes from `live` on, and steps past a run's end, are
/// zero. One read and one write per value, the writes strided.
fn runs_into_lanes<'a>(dst: &mut [u32], width: usize, live: usize, run: impl Fn(usize) -> Option<&'a [bf16]>) {
    for l in 0..width {
        let src = if l < live { run(l).unwrap_or_default() } else { &[] };
        let mut words = src.chunks(2).map(|t| pair(t[0], t.get(1).copied().unwrap_or(bf16::ZERO)));
        for step in dst.chunks_exact_mut(width) {
            if let Some(w) = step.get_mut(l) {
                *w = words.next().unwrap_or(0);
            }
        }
    }
}

/// Packs depths `p0..p0+depth` and columns `j0..j0+cols` of `op(B)` into
/// `⌈cols/NR⌉` panels of `⌈depth/2⌉` steps of [`NR`] pair words (columns
/// past the end and the odd depth's partner are zero). One read and one
/// write per value.
fn pack_b(op: &Operands<'_>, (p0, depth): (usize, usize), (j0, cols): (usize, usize), dst: &mut [u32]) {
    let pairs = depth.div_ceil(2);
    let (k, n) = (op.k, op.n);
    for (panel, dst) in dst.chunks_exact_mut(NR * pairs).take(cols.div_ceil(NR)).enumerate() {
        let j = j0 + panel * NR;
        let live = (cols - panel * NR).min(NR);
        if op.trans_b {
            // B(p, j) = b[j·k + p]: each column is contiguous along the depth,
            // so its pairs are already words: the panel is their transpose.
            match words(op.b, k) {
                Some(w) => {
                    let src = w.get((j * k + p0) / 2..).unwrap_or_default();
                    pack::transpose_into::<NR>(Isa::Avx512, src, k / 2, live, pairs, bytemuck::cast_slice_mut(dst));
                }
                None => runs_into_lanes(dst, NR, live, |c| op.b.get((j + c) * k + p0..).and_then(|s| s.get(..depth))),
            }
        } else {
            // B(p, j) = b[p·n + j]: each depth is contiguous across the columns.
            let row = |p: usize| op.b.get(p * n + j..).and_then(|s| s.get(..live)).unwrap_or_default();
            for (q, d) in dst.chunks_exact_mut(NR).enumerate() {
                let p = p0 + 2 * q;
                let lo = row(p);
                let (body, tail) = d.split_at_mut(lo.len().min(NR));
                if 2 * q + 1 < depth {
                    let hi = row(p + 1);
                    for ((w, &l), &h) in body.iter_mut().zip(lo).zip(hi) {
                        *w = pair(l, h);
                    }
                } else {
                    for (w, &l) in body.iter_mut().zip(lo) {
                        *w = pair(l, bf16::ZERO);
                    }
                }
                tail.fill(0);
            }
        }
    }
}

thread_local! {
    /// Pair-packing buffers of this thread, kept between calls.
    static PACK: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with two 64-byte-aligned buffers of `a_len` and `b_len` words,
/// from this thread's reusable storage (a fresh allocation only on first
/// use, growth, or re-entry).
fn with_buffers(a_len: usize, b_len: usize, f: impl FnOnce(&mut [u32], &mut [u32])) {
    with_thread_buffers(&PACK, a_len, b_len, f)
}
