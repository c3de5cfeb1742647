//! The kernels a transformer decoder adds: rotary position embedding
//! ([`rope`]), strided copies ([`copy`]), embedding lookups ([`gather`]) and
//! argmax over rows ([`argmax`]).
//!
//! - **rope**: one thread per pair (grid-stride over `seq·heads·head_dim/2`
//!   pairs, [`BLOCK`] threads). The pair's frequency `θ^(−2i/d) = 2^(i·c)`,
//!   `c = −2·log₂θ / d` passed as two `f32`s (high and low part, from `f64` on
//!   the host), is `ex2.approx` of the rounded exponent corrected by its exact
//!   rounding error (an `fma`), so within about 3 ulp; the angle
//!   `(position + t)·freq` is one `f32` product, as the reference model
//!   computes it. Llama 3's frequency scaling is four more instructions
//!   on the frequency (an `fma`, a clamp, an `fma` and a product, from three
//!   parameters; neutral ones leave it exact). The angle is then reduced to `[−π, π]` (Cody–Waite: `k =
//!   rni(a/2π)`, `r = a − k·C₁ − k·C₂` with `2π = C₁ + C₂` to 48 bits, each
//!   step an `fma`; the first is exact since `k·C₁` and `a` share the grid of
//!   `r`), so `sin.approx`/`cos.approx` work where they are accurate (about
//!   2⁻²⁰·⁹ absolute). Total error: the angle's own `f32` rounding (which the
//!   tolerance allows, `2⁻²⁰·|a|`), about 2⁻²³ from the reduction and the
//!   approximations' 2⁻²⁰·⁹. Memory: one read and one write per value;
//!   half-split pairs are coalesced across a warp, interleaved ones read two
//!   neighbours per thread.
//! - **copy**: one thread per element of the 3-D view (grid-stride; the
//!   index split into `(i, j, l)` by two 32-bit divisions), each a load and a
//!   store of raw bits at `offset + i·s₀ + j·s₁ + l·s₂` (64-bit strides), so
//!   nothing outside the destination view is touched. Kernels exist per unit
//!   size, 2, 4, 8 and 16 bytes: the plan copies rows whose inner strides are
//!   1 and whose offsets, strides and lengths are multiples of 16 (or 8)
//!   bytes in 16-byte (or 8-byte) units, one `v4`/`v2` access per thread.
//! - **gather**: one thread per output element (grid-stride over `ids·cols`):
//!   the id (`f32`) is checked (`0 ≤ id < rows`, an integer: `rni(id) = id`,
//!   NaN fails every test), then the table element's bits are copied, or the
//!   dtype's NaN bits (a kernel argument) stored. Per element size (2 or 4
//!   bytes); neighbouring threads read neighbouring columns of one row.
//! - **argmax**: one block of [`ARGMAX_BLOCK`] threads per row. Each thread
//!   scans the 16-byte units `tid, tid + 1024, …` of the row (4 `f32` or 8
//!   halves each; 4 loads in flight, issued a round at a time) when the rows
//!   are 16-byte aligned, then the values past them one at a time. A thread
//!   meets its candidates in increasing index order, so it keeps a larger
//!   value, or a NaN over a number, and never replaces a NaN (five
//!   instructions a value). The threads' bests then meet under one total
//!   order (NaN above every number, then larger values, then smaller
//!   indices: the first NaN, else the first of equal maxima), so the result
//!   does not depend on the order of combination: a warp shuffle tree, then
//!   one shared-memory step over the 32 warps. The index is stored as `f32`.
//!   Reads each value once; deterministic.

use super::elem;
use super::unroll::{maybe_guarded, strided_rounds};
use crate::builder::{B16, BuildError, Cmp, Dim, F32, Kernel, KernelBuilder, Pred, Reg, Target, U32, U64};
use compute_core::{DType, RopeLayout};

/// Threads per block of the rotary, copy and gather kernels.
pub const BLOCK: u32 = 256;
/// Threads per block of the argmax kernel (one block per row).
pub const ARGMAX_BLOCK: u32 = 1024;
/// 16-byte units (or single values past them) each argmax thread has in flight.
const ARGMAX_UNROLL: u32 = 4;

/// `2π` split into two `f32`s whose sum holds it to about 48 bits.
const TWO_PI_HI: f32 = std::f64::consts::TAU as f32;
const TWO_PI_LO: f32 = (std::f64::consts::TAU - TWO_PI_HI as f64) as f32;
const INV_TWO_PI: f32 = (1.0 / std::f64::consts::TAU) as f32;
const LN2: f32 = std::f64::consts::LN_2 as f32;

/// The unit sizes (bytes) of the strided-copy kernels.
pub const COPY_UNITS: [u32; 4] = [2, 4, 8, 16];
/// The element sizes (bytes) of the gather kernels.
pub const GATHER_SIZES: [u32; 2] = [2, 4];

/// The grid-stride loop shared by the one-thread-per-item kernels: runs
/// `body` for every `g < n` of this thread (`g = global index + k·threads`).
pub(crate) fn grid_stride(b: &mut KernelBuilder, n: Reg<U32>, body: impl FnOnce(&mut KernelBuilder, Reg<U32>)) {
    let g = b.global_index_x();
    let ntid = b.ntid(Dim::X);
    let nct = b.nctaid(Dim::X);
    let threads = b.mul(ntid, nct);
    let top = b.label("item");
    let done = b.label("done");
    b.place(top);
    let past = b.setp(Cmp::Ge, g, n);
    b.bra_if(past, done);
    body(b, g);
    let next = b.add(g, threads);
    b.assign(g, next);
    b.bra(top);
    b.place(done);
    b.ret();
}

/// Name of the rotary-embedding kernel (`rope_half`, `rope_interleaved_bf16`).
pub fn rope_name(layout: RopeLayout, dtype: DType) -> String {
    let stem = match layout {
        RopeLayout::HalfSplit => "rope_half",
        RopeLayout::Interleaved => "rope_interleaved",
    };
    format!("{stem}{}", elem::suffix(dtype))
}

/// Builds the rotary-embedding kernel for `layout` on `dtype` (computed in
/// `f32`; module docs). Params: `x`, `y`, `pairs` (`seq·heads·head_dim/2`),
/// `heads`, `half` (`head_dim/2`), `position`, `freq_hi`, `freq_lo`
/// (`−2·log₂θ/head_dim`, high and low parts), `positions` (0, or `seq` `f32`
/// positions read instead of `position + t`), `row_heads` and `first_head`
/// (`x` holds rows of `row_heads` heads a token, and heads `first_head..` of
/// each are turned; `heads` and 0 for a plain `[seq, heads, d]`), and
/// `scale_a`, `scale_b`, `scale_c` (Llama 3's frequency scaling,
/// [`compute_core::RopeScaling::coefficients`]: the frequency `f` becomes
/// `f·(c + s·(1 − c))`, `s = clamp(f·a + b, 0, 1)`; `0, 1, 1` leaves it
/// exact), and `cache` (0: `y` is `[seq, heads, d]`; else `y` is a KV
/// cache `[heads, cache, d]` and token `t`'s heads go to its position's
/// row, skipped unless a whole number below `cache`:
/// [`compute_core::RopeSpec::into_cache`]). Launch: [`BLOCK`] threads, any
/// grid.
pub fn rope(layout: RopeLayout, dtype: DType, target: Target) -> Result<Kernel, BuildError> {
    let name = rope_name(layout, dtype);
    let mut b = KernelBuilder::new(&name, target);
    let pairs = match layout {
        RopeLayout::HalfSplit => "(x[i], x[i + d/2])",
        RopeLayout::Interleaved => "(x[2i], x[2i + 1])",
    };
    b.doc(&format!("{name}: rotary embedding of x [seq, heads, d], pairs {pairs}, one thread per pair"));
    b.doc("angle (position + t) * 2^(i*c) in f32, reduced mod 2pi (Cody-Waite), then sin/cos.approx");
    b.doc("params: x, y, pairs, heads, half (d/2), position, freq_hi, freq_lo (c = -2 log2(theta)/d),");
    b.doc("positions (0, or the tokens' f32 positions, read instead of position + t),");
    b.doc("row_heads, first_head (x holds rows of row_heads heads a token; heads first_head.. are turned),");
    b.doc("scale_a, scale_b, scale_c (llama3 frequency scaling; 0, 1, 1: none),");
    b.doc("cache (0: y is [seq, heads, d]; else y is [heads, cache, d] and token t's heads go to row pos_t,");
    b.doc("skipped unless pos_t is a whole number below cache)");
    b.doc(&format!("launch: {BLOCK} threads per block, any grid (grid-stride)"));
    b.max_threads(BLOCK);
    let x = b.param_ptr("x");
    let y = b.param_ptr("y");
    let n = b.param::<U32>("pairs");
    let heads = b.param::<U32>("heads");
    let half = b.param::<U32>("half");
    let position = b.param::<U32>("position");
    let freq_hi = b.param::<F32>("freq_hi");
    let freq_lo = b.param::<F32>("freq_lo");
    let positions = b.param_ptr("positions");
    let row_heads = b.param::<U32>("row_heads");
    let first_head = b.param::<U32>("first_head");
    let scale_a = b.param::<F32>("scale_a");
    let scale_b = b.param::<F32>("scale_b");
    let scale_c = b.param::<F32>("scale_c");
    let cache = b.param::<U32>("cache");
    let given = b.setp(Cmp::Ne, positions, 0u64);
    let cached = b.setp(Cmp::Ne, cache, 0u32);
    let shift = elem::shift(dtype);
    let size = elem::size(dtype);
    grid_stride(&mut b, n, |b, g| {
        let i = b.rem(g, half);
        let th = b.div(g, half);
        let t = b.div(th, heads);
        let h = b.rem(th, heads);
        let d = b.shl(half, 1u32);
        let base = b.mul_wide(th, d);
        // The input head: head h of this token's row of row_heads, from first_head.
        let hx = b.mad(t, row_heads, first_head);
        let hx = b.add(hx, h);
        let xbase = b.mul_wide(hx, d);
        let (pair, second) = match layout {
            RopeLayout::HalfSplit => (b.cvt::<U64, U32>(i), b.mul_wide(half, size)),
            RopeLayout::Interleaved => (b.mul_wide(i, 2u32), b.mov::<U64>(u64::from(size))),
        };
        let xat = b.add(xbase, pair);
        let xoff = b.shl(xat, shift);
        let xa = b.add(x, xoff);
        let xb = b.add(xa, second);
        let x1 = elem::load(b, dtype, xa, 0, 1)[0];
        let x2 = elem::load(b, dtype, xb, 0, 1)[0];
        b.comment("frequency 2^(i*c): ex2 of the rounded exponent, corrected by its rounding error");
        let fi = b.cvt::<F32, U32>(i);
        let e = b.mul(fi, freq_hi);
        let ne = b.neg(e);
        let err = b.fma(fi, freq_hi, ne);
        let err = b.fma(fi, freq_lo, err);
        let p = b.ex2_approx(e);
        let k = b.mul(err, LN2);
        let freq = b.fma(p, k, p);
        b.comment("llama3 scaling: s = clamp(f*sa + sb, 0, 1), f *= sc + s*(1 - sc); (0, 1, 1) leaves f exact");
        let s = b.fma(freq, scale_a, scale_b);
        let s = b.max(s, 0.0f32);
        let s = b.min(s, 1.0f32);
        let keep = b.sub(1.0f32, scale_c);
        let m = b.fma(s, keep, scale_c);
        let freq = b.mul(freq, m);
        let pos = b.add(position, t);
        let posf = b.cvt::<F32, U32>(pos);
        let toff = b.mul_wide(t, 4u32);
        let pat = b.add(positions, toff);
        b.guarded(given, false, |b| {
            let v = b.ld_global::<F32>(pat, 0);
            b.assign(posf, v);
        });
        let a = b.mul(posf, freq);
        b.comment("a mod 2pi: k = rni(a/2pi), r = a - k*C1 - k*C2 (the first step exact)");
        let q = b.mul(a, INV_TWO_PI);
        let q = b.round_even(q);
        let nq = b.neg(q);
        let r = b.fma(nq, TWO_PI_HI, a);
        let r = b.fma(nq, TWO_PI_LO, r);
        let s = b.sin_approx(r);
        let c = b.cos_approx(r);
        let x2s = b.mul(x2, s);
        let nx2s = b.neg(x2s);
        let y1 = b.fma(x1, c, nx2s);
        let x1s = b.mul(x1, s);
        let y2 = b.fma(x2, c, x1s);
        let skip = b.label("skip_store");
        let plain = b.label("plain_row");
        b.bra_unless(cached, plain);
        b.comment("into the cache: row pos_t of head h, skipped unless a whole number below cache");
        let row = b.mov::<U32>(pos);
        let host_row = b.label("host_row");
        b.bra_unless(given, host_row);
        let read = b.cvt::<U32, F32>(posf);
        let back = b.cvt::<F32, U32>(read);
        let not_whole = b.setp(Cmp::Neu, back, posf);
        b.bra_if(not_whole, skip);
        b.assign(row, read);
        b.place(host_row);
        let past = b.setp(Cmp::Ge, row, cache);
        b.bra_if(past, skip);
        let hrow = b.mad(h, cache, row);
        let cbase = b.mul_wide(hrow, d);
        b.assign(base, cbase);
        b.place(plain);
        let at = b.add(base, pair);
        let off = b.shl(at, shift);
        let ya = b.add(y, off);
        let yb = b.add(ya, second);
        elem::store(b, dtype, ya, 0, &[y1]);
        elem::store(b, dtype, yb, 0, &[y2]);
        b.place(skip);
    });
    b.finish()
}

/// The launch parameters of the rotary-embedding kernels for `theta` and
/// `head_dim`: `c = −2·log₂θ / head_dim` as an `f32` high part and the `f32`
/// rest (computed in `f64`). Free.
pub fn rope_freq(theta: f32, head_dim: usize) -> (f32, f32) {
    let c = -2.0 * f64::from(theta).log2() / head_dim.max(1) as f64;
    let hi = c as f32;
    (hi, (c - f64::from(hi)) as f32)
}

/// Name of the strided-copy kernel moving units of `bytes` bytes (`copy_b4`).
pub fn copy_name(bytes: u32) -> String {
    format!("copy_b{bytes}")
}

/// One unit of `bytes` bytes (2, 4, 8 or 16) as raw registers.
enum Unit {
    Half(Reg<B16>),
    Words(Vec<Reg<U32>>),
}

fn load_unit(b: &mut KernelBuilder, bytes: u32, at: Reg<U64>) -> Unit {
    match bytes {
        2 => Unit::Half(b.ld_global_nc::<B16>(at, 0)),
        4 => Unit::Words(vec![b.ld_global_nc::<U32>(at, 0)]),
        8 => Unit::Words(b.ld_global_nc_v::<U32, 2>(at, 0).to_vec()),
        _ => Unit::Words(b.ld_global_nc_v::<U32, 4>(at, 0).to_vec()),
    }
}

fn store_unit(b: &mut KernelBuilder, at: Reg<U64>, u: &Unit) {
    match u {
        Unit::Half(h) => b.st_global(at, 0, *h),
        Unit::Words(w) => match w.as_slice() {
            [a] => b.st_global(at, 0, *a),
            [a, c] => b.st_global_v::<U32, 2>(at, 0, [(*a).into(), (*c).into()]),
            [a, c, d, e] => b.st_global_v::<U32, 4>(at, 0, [(*a).into(), (*c).into(), (*d).into(), (*e).into()]),
            _ => b.error(format!("no store of {} words", w.len())),
        },
    }
}

/// Builds the strided copy of `bytes`-byte units (2, 4, 8 or 16; module
/// docs). Params: `src`, `dst`, `count` (units), `n1`, `n2` (the inner
/// extents), then the source's offset and three strides and the
/// destination's, all `u64` in units, then `positions` (0, or `n1` `f32`
/// values replacing the destination's `j`; a value that is not a whole
/// number below `slots` is skipped) and `slots`. Launch: [`BLOCK`] threads,
/// any grid.
pub fn copy(bytes: u32, target: Target) -> Result<Kernel, BuildError> {
    let name = copy_name(bytes);
    if !COPY_UNITS.contains(&bytes) {
        return Err(BuildError { kernel: name, problems: vec![format!("unit of {bytes} bytes: need 2, 4, 8 or 16")] });
    }
    let mut b = KernelBuilder::new(&name, target);
    b.doc(&format!("{name}: dst[do + i*d0 + j*d1 + l*d2] = src[so + i*s0 + j*s1 + l*s2], {bytes}-byte units"));
    b.doc("params: src, dst, count, n1, n2, so, s0, s1, s2, do, d0, d1, d2 (offsets and strides in units),");
    b.doc("positions (0, or n1 f32 destination rows j; not a whole number below slots: skipped), slots");
    b.doc(&format!("launch: {BLOCK} threads per block, any grid (grid-stride); one unit per thread"));
    b.max_threads(BLOCK);
    let src = b.param_ptr("src");
    let dst = b.param_ptr("dst");
    let n = b.param::<U32>("count");
    let n1 = b.param::<U32>("n1");
    let n2 = b.param::<U32>("n2");
    let mut views = Vec::new();
    for side in ["s", "d"] {
        let off = b.param::<U64>(&format!("{side}o"));
        let strides: Vec<Reg<U64>> = (0..3).map(|k| b.param::<U64>(&format!("{side}{k}"))).collect();
        views.push((off, strides));
    }
    let positions = b.param_ptr("positions");
    let slots = b.param::<U32>("slots");
    let shift = bytes.trailing_zeros();
    grid_stride(&mut b, n, |b, g| {
        let l = b.rem(g, n2);
        let q = b.div(g, n2);
        let j = b.rem(q, n1);
        let i = b.div(q, n1);
        let skip = b.label("skip");
        let plain = b.label("dst_row");
        let jd = b.mov::<U32>(j);
        let none = b.setp(Cmp::Eq, positions, 0u64);
        b.bra_if(none, plain);
        b.comment("the destination row from the positions: skipped unless a whole number below slots");
        let off = b.mul_wide(j, 4u32);
        let at = b.add(positions, off);
        let pv = b.ld_global::<F32>(at, 0);
        let pi = b.cvt::<U32, F32>(pv);
        let back = b.cvt::<F32, U32>(pi);
        let not_whole = b.setp(Cmp::Neu, back, pv);
        b.bra_if(not_whole, skip);
        let past = b.setp(Cmp::Ge, pi, slots);
        b.bra_if(past, skip);
        b.assign(jd, pi);
        b.place(plain);
        let mut addrs = Vec::new();
        for (side, ((off, strides), base)) in views.iter().zip([src, dst]).enumerate() {
            let row = if side == 0 { j } else { jd };
            let idx: Vec<Reg<U64>> = [i, row, l].iter().map(|&v| b.cvt::<U64, U32>(v)).collect();
            let mut at = *off;
            for (k, s) in idx.iter().zip(strides) {
                at = b.mad(*k, *s, at);
            }
            let at = b.shl(at, shift);
            addrs.push(b.add(base, at));
        }
        let u = load_unit(b, bytes, addrs[0]);
        store_unit(b, addrs[1], &u);
        b.place(skip);
    });
    b.finish()
}

/// Name of the gather kernel for elements of `bytes` bytes (`gather_b2`).
pub fn gather_name(bytes: u32) -> String {
    format!("gather_b{bytes}")
}

/// Builds the gather of `bytes`-byte elements (2 or 4; module docs). Params:
/// `table`, `ids` (`f32`), `y`, `total` (`ids·cols`), `cols`, `rows`, `nan`
/// (the bits stored for an id outside the table, in the low `bytes`).
/// Launch: [`BLOCK`] threads, any grid.
pub fn gather(bytes: u32, target: Target) -> Result<Kernel, BuildError> {
    let name = gather_name(bytes);
    if !GATHER_SIZES.contains(&bytes) {
        return Err(BuildError { kernel: name, problems: vec![format!("element of {bytes} bytes: need 2 or 4")] });
    }
    let mut b = KernelBuilder::new(&name, target);
    b.doc(&format!("{name}: y[r][c] = table[ids[r]][c], or the nan bits when ids[r] is not an integer in 0..rows"));
    b.doc("params: table, ids (f32), y, total (ids*cols), cols, rows, nan (bits)");
    b.doc(&format!("launch: {BLOCK} threads per block, any grid (grid-stride); one element per thread"));
    b.max_threads(BLOCK);
    let table = b.param_ptr("table");
    let ids = b.param_ptr("ids");
    let y = b.param_ptr("y");
    let n = b.param::<U32>("total");
    let cols = b.param::<U32>("cols");
    let rows = b.param::<U32>("rows");
    let nan = b.param::<U32>("nan");
    let shift = bytes.trailing_zeros();
    let rows_f = b.cvt::<F32, U32>(rows);
    grid_stride(&mut b, n, |b, g| {
        let r = b.div(g, cols);
        let rc = b.mul(r, cols);
        let c = b.sub(g, rc);
        let ia = b.mul_wide(r, 4u32);
        let ia = b.add(ids, ia);
        let id = b.ld_global_nc::<F32>(ia, 0);
        let ge = b.setp(Cmp::Ge, id, 0.0f32);
        let lt = b.setp(Cmp::Lt, id, rows_f);
        let whole = b.round_even(id);
        let int = b.setp(Cmp::Eq, whole, id);
        let ok = b.and_pred(ge, lt);
        let ok = b.and_pred(ok, int);
        let store = b.label("store");
        let goff = b.cvt::<U64, U32>(g);
        let goff = b.shl(goff, shift);
        let ya = b.add(y, goff);
        let row = b.cvt::<U32, F32>(id);
        let at = |b: &mut KernelBuilder| {
            let e = b.mul_wide(row, cols);
            let c64 = b.cvt::<U64, U32>(c);
            let e = b.add(e, c64);
            let e = b.shl(e, shift);
            b.add(table, e)
        };
        if bytes == 2 {
            let [v, _] = b.unpack_halves(nan);
            b.bra_unless(ok, store);
            let ta = at(b);
            let t = b.ld_global_nc::<B16>(ta, 0);
            b.assign(v, t);
            b.place(store);
            b.st_global(ya, 0, v);
        } else {
            let v = b.mov::<U32>(nan);
            b.bra_unless(ok, store);
            let ta = at(b);
            let t = b.ld_global_nc::<U32>(ta, 0);
            b.assign(v, t);
            b.place(store);
            b.st_global(ya, 0, v);
        }
    });
    b.finish()
}

/// Name of the argmax kernel over rows of `dtype` (`argmax`, `argmax_f16`).
pub fn argmax_name(dtype: DType) -> String {
    format!("argmax{}", elem::suffix(dtype))
}

/// Whether `(v, i)` comes before `(bv, bi)`: NaN first, then larger values,
/// then smaller indices.
fn better(b: &mut KernelBuilder, (v, i): (Reg<F32>, Reg<U32>), (bv, bi): (Reg<F32>, Reg<U32>)) -> Reg<Pred> {
    let gt = b.setp(Cmp::Gt, v, bv);
    let eq = b.setp(Cmp::Eq, v, bv);
    let first = b.setp(Cmp::Lt, i, bi);
    let vn = b.setp(Cmp::Nan, v, v);
    let bnum = b.setp(Cmp::Num, bv, bv);
    let tie = b.and_pred(eq, first);
    let nan_wins = b.or_pred(bnum, first);
    let nan_wins = b.and_pred(vn, nan_wins);
    let take = b.or_pred(gt, tie);
    b.or_pred(take, nan_wins)
}

/// Folds `(v, i)` into the running best `(bv, bi)`, in place.
fn fold(b: &mut KernelBuilder, cand: (Reg<F32>, Reg<U32>), best: (Reg<F32>, Reg<U32>)) {
    let take = better(b, cand, best);
    let nv = b.selp(cand.0, best.0, take);
    let ni = b.selp(cand.1, best.1, take);
    b.assign(best.0, nv);
    b.assign(best.1, ni);
}

/// Folds `(v, i)` into a thread's running best `(bv, bi)` when every earlier
/// candidate of the thread had a smaller index: take it if larger, or a NaN
/// over a number (`bv < v` or unordered); never over a NaN. Five
/// instructions where [`fold`] takes eleven.
fn fold_next(b: &mut KernelBuilder, (v, i): (Reg<F32>, Reg<U32>), best: (Reg<F32>, Reg<U32>)) {
    let above = b.setp(Cmp::Ltu, best.0, v);
    let num = b.setp(Cmp::Num, best.0, best.0);
    let take = b.and_pred(above, num);
    let nv = b.selp(v, best.0, take);
    let ni = b.selp(i, best.1, take);
    b.assign(best.0, nv);
    b.assign(best.1, ni);
}

/// Folds the other lanes' bests into each lane's, down a shuffle tree (lane
/// 0 ends with the warp's best).
fn warp_fold(b: &mut KernelBuilder, best: (Reg<F32>, Reg<U32>)) {
    for delta in [16, 8, 4, 2, 1] {
        let ov = b.shfl_down(best.0, delta);
        let oi = b.shfl_down(best.1, delta);
        fold(b, (ov, oi), best);
    }
}

/// Builds the argmax over rows of `dtype` (module docs). Params: `x`, `y`
/// (`f32` indices), `cols`, `vec` (u32: nonzero when `cols` is a multiple of
/// the 16-byte vector's values and `x` is 16-byte aligned). Launch:
/// [`ARGMAX_BLOCK`] threads, one block per row.
pub fn argmax(dtype: DType, target: Target) -> Result<Kernel, BuildError> {
    let name = argmax_name(dtype);
    let v = 16 / elem::size(dtype);
    let mut b = KernelBuilder::new(&name, target);
    b.doc(&format!("{name}: y[r] = index of the largest x[r][..] (first NaN, else first of equal maxima), as f32"));
    b.doc(&format!(
        "each thread scans 16-byte units tid, tid + {ARGMAX_BLOCK}, ... ({v} values, {ARGMAX_UNROLL} in flight), then the rest one value at a time; shuffles, then the warps through shared memory"
    ));
    b.doc("params: x, y (f32), cols, vec (u32)");
    b.doc(&format!("launch: {ARGMAX_BLOCK} threads per block, one block per row"));
    b.max_threads(ARGMAX_BLOCK);
    let x = b.param_ptr("x");
    let y = b.param_ptr("y");
    let cols = b.param::<U32>("cols");
    let vec = b.param::<U32>("vec");
    let warps = ARGMAX_BLOCK / 32;
    let scratch = b.shared("best", warps * 8, 8);
    let tid = b.tid(Dim::X);
    let row = b.ctaid(Dim::X);
    let shift = elem::shift(dtype);
    let start = b.mul_wide(row, cols);
    let start = b.shl(start, shift);
    let xr = b.add(x, start);
    let best = (b.mov::<F32>(f32::NEG_INFINITY), b.mov::<U32>(u32::MAX));
    let stride = b.mov::<U32>(ARGMAX_BLOCK);
    let is_vec = b.setp(Cmp::Ne, vec, 0u32);
    let cv = b.shr(cols, v.trailing_zeros());
    let units = b.selp(cv, 0u32, is_vec);
    b.comment("this thread's 16-byte units tid, tid + BLOCK, ...: all loads of a round first, then the folds");
    strided_rounds(&mut b, (tid, stride, units), ARGMAX_UNROLL, "vec", |b, us, gs| {
        let guard = |t: usize| gs.map(|g| g[t]);
        let mut vals = Vec::with_capacity(us.len());
        for (t, &u) in us.iter().enumerate() {
            let mut got = Vec::new();
            maybe_guarded(b, guard(t), |b| {
                let off = b.mul_wide(u, 16u32);
                let at = b.add(xr, off);
                got = elem::load(b, dtype, at, 0, v as usize);
            });
            vals.push(got);
        }
        for (t, (&u, got)) in us.iter().zip(&vals).enumerate() {
            maybe_guarded(b, guard(t), |b| {
                let j0 = b.mul(u, v);
                for (e, &val) in got.iter().enumerate() {
                    let j = b.add(j0, e as u32);
                    fold_next(b, (val, j), best);
                }
            });
        }
    });
    b.comment("the columns past the units (all of them without vec), one per thread");
    let base = b.shl(units, v.trailing_zeros());
    let j0 = b.add(base, tid);
    strided_rounds(&mut b, (j0, stride, cols), ARGMAX_UNROLL, "scalar", |b, js, gs| {
        let guard = |t: usize| gs.map(|g| g[t]);
        let mut vals = Vec::with_capacity(js.len());
        for (t, &j) in js.iter().enumerate() {
            let mut got = None;
            maybe_guarded(b, guard(t), |b| {
                let off = b.mul_wide(j, elem::size(dtype));
                let at = b.add(xr, off);
                got = Some(elem::load(b, dtype, at, 0, 1)[0]);
            });
            vals.push(got);
        }
        for (t, (&j, got)) in js.iter().zip(&vals).enumerate() {
            if let Some(val) = *got {
                maybe_guarded(b, guard(t), |b| fold_next(b, (val, j), best));
            }
        }
    });
    b.comment("lanes by shuffles, then the warps' bests through shared memory");
    warp_fold(&mut b, best);
    let lane = b.and(tid, 31u32);
    let warp = b.shr(tid, 5u32);
    let sbase = b.shared_base(&scratch);
    let slot = b.mad(warp, 8u32, sbase);
    let lane0 = b.setp(Cmp::Eq, lane, 0u32);
    b.guarded(lane0, false, |b| {
        b.st_shared(slot, 0, best.0);
        b.st_shared(slot, 4, best.1);
    });
    b.bar_sync();
    let done = b.label("done");
    let first_warp = b.setp(Cmp::Lt, tid, 32u32);
    b.bra_unless(first_warp, done);
    let mine = b.setp(Cmp::Lt, lane, warps);
    let l = b.min(lane, warps - 1);
    let la = b.mad(l, 8u32, sbase);
    let wv = b.ld_shared::<F32>(la, 0);
    let wi = b.ld_shared::<U32>(la, 4);
    let wv = b.selp(wv, f32::NEG_INFINITY, mine);
    let wi = b.selp(wi, u32::MAX, mine);
    b.assign(best.0, wv);
    b.assign(best.1, wi);
    warp_fold(&mut b, best);
    // An empty row (cols = 0) keeps the sentinel: index 0, as the reference says.
    let empty = b.setp(Cmp::Eq, best.1, u32::MAX);
    let bi = b.selp(0u32, best.1, empty);
    let idx = b.cvt::<F32, U32>(bi);
    let ya = b.mul_wide(row, 4u32);
    let ya = b.add(y, ya);
    b.guarded(lane0, false, |b| b.st_global(ya, 0, idx));
    b.place(done);
    b.ret();
    b.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_pi_splits_exactly_enough() {
        let sum = f64::from(TWO_PI_HI) + f64::from(TWO_PI_LO);
        assert!((sum - std::f64::consts::TAU).abs() < 1e-14);
        let (hi, lo) = rope_freq(10_000.0, 128);
        let c = -2.0 * 10_000f64.log2() / 128.0;
        assert!((f64::from(hi) + f64::from(lo) - c).abs() < 1e-14);
    }

    #[test]
    fn every_kernel_builds() {
        for d in elem::DTYPES {
            for layout in [RopeLayout::HalfSplit, RopeLayout::Interleaved] {
                rope(layout, d, Target::Sm80).unwrap();
            }
            argmax(d, Target::Sm80).unwrap();
        }
        for u in COPY_UNITS {
            copy(u, Target::Sm80).unwrap();
        }
        for s in GATHER_SIZES {
            gather(s, Target::Sm80).unwrap();
        }
        assert!(copy(3, Target::Sm80).is_err());
        assert!(gather(8, Target::Sm80).is_err());
    }
}
