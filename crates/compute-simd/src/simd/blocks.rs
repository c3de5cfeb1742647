//! Loops over slices in blocks of [`LANES`] floats, shared by every kernel.
//!
//! Maps run a vector function over whole blocks and over one zero-padded
//! block each for the head before the output's first 64-byte boundary and for
//! the tail, so every element goes through the same instructions wherever it
//! sits, and every store of the body fills one whole cache line (a buffer
//! from the system allocator starts 16 bytes past one: a one-thread add of
//! 2¹⁵ elements on such buffers went from 3.67 to 3.44 µs on the 2-core Zen 4,
//! `cargo run --release -p dispatch --example cpu_placement`, `fresh`). With
//! `stream = true` the output body is written with non-temporal stores: that
//! saves the read-for-ownership of outputs too large to stay in cache (see
//! [`crate::tuning::STREAM_MIN`]). Maps do not
//! fence: a kernel that streams calls [`SimdF32::fence`] once after its last
//! map, before its output is handed on. (A fence after every row's map held
//! a one-thread softmax of 4096-float rows to the drain of each row's
//! stores.)
//!
//! Folds keep four independent vector accumulators (64 lanes on every ISA) and
//! restart them every [`FOLD_SPAN`] elements into an outer accumulator, so the
//! rounding error of a sum grows with `FOLD_SPAN/64 + len/FOLD_SPAN` additions
//! per lane instead of `len/64`.
//!
//! Every function is one pass over its slices (plus one padded block at each
//! end) and is `#[inline(always)]`: it is meant to be compiled inside a
//! [`super::WithSimd`] task, with the [`LaneFn`] inlined into the loop.

use super::{Block, LANES, LaneFn, SimdF32};
use crate::tuning::PREFETCH_L2_FROM;

/// Elements folded into the four inner accumulators before they are added to
/// the outer one.
pub const FOLD_SPAN: usize = 64 * LANES;

/// Copies up to 16 floats of `x` into a block filled with `pad`.
#[inline(always)]
fn padded(x: &[f32], pad: f32) -> Block {
    let mut buf = [pad; LANES];
    for (b, &v) in buf.iter_mut().zip(x) {
        *b = v;
    }
    buf
}

/// Copies the first `out.len()` (at most 16) lanes of `buf` into `out`.
#[inline(always)]
fn unpad(buf: &Block, out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(buf) {
        *o = v;
    }
}

/// Elements before the first 64-byte boundary of `out` (all of them if the
/// slice ends first).
#[inline(always)]
fn head_len(out: &[f32]) -> usize {
    out.as_ptr().align_offset(64).min(out.len())
}

/// `out[i] = f(x[i])` over `min(x.len(), out.len())` elements.
#[inline(always)]
pub fn map1<S: SimdF32>(s: S, x: &[f32], out: &mut [f32], stream: bool, f: &impl LaneFn<S, 1>) {
    let n = x.len().min(out.len());
    let (x, out) = (x.split_at(n).0, out.split_at_mut(n).0);
    let head = head_len(out);
    let (xh, x) = x.split_at(head);
    let (oh, out) = out.split_at_mut(head);
    if head > 0 {
        let mut buf = padded(xh, 0.0);
        let y = f.apply(s, [s.load(&buf)]);
        s.store(&mut buf, y);
        unpad(&buf, oh);
    }
    let (xb, xt) = x.as_chunks::<LANES>();
    let (ob, ot) = out.as_chunks_mut::<LANES>();
    if stream {
        for (xi, oi) in xb.iter().zip(ob) {
            s.stream(oi, f.apply(s, [s.load(xi)]));
        }
    } else {
        for (xi, oi) in xb.iter().zip(ob) {
            s.store(oi, f.apply(s, [s.load(xi)]));
        }
    }
    if !xt.is_empty() {
        let mut buf = padded(xt, 0.0);
        let y = f.apply(s, [s.load(&buf)]);
        s.store(&mut buf, y);
        unpad(&buf, ot);
    }
}

/// `out[i] = f(a[i], b[i])` over the shortest of the three lengths.
#[inline(always)]
pub fn map2<S: SimdF32>(s: S, a: &[f32], b: &[f32], out: &mut [f32], stream: bool, f: &impl LaneFn<S, 2>) {
    let n = a.len().min(b.len()).min(out.len());
    let (a, b, out) = (a.split_at(n).0, b.split_at(n).0, out.split_at_mut(n).0);
    let head = head_len(out);
    let (ah, a) = a.split_at(head);
    let (bh, b) = b.split_at(head);
    let (oh, out) = out.split_at_mut(head);
    if head > 0 {
        let mut buf = padded(ah, 0.0);
        let y = f.apply(s, [s.load(&buf), s.load(&padded(bh, 0.0))]);
        s.store(&mut buf, y);
        unpad(&buf, oh);
    }
    let (ab, at) = a.as_chunks::<LANES>();
    let (bb, bt) = b.as_chunks::<LANES>();
    let (ob, ot) = out.as_chunks_mut::<LANES>();
    if stream {
        for ((ai, bi), oi) in ab.iter().zip(bb).zip(ob) {
            s.stream(oi, f.apply(s, [s.load(ai), s.load(bi)]));
        }
    } else {
        for ((ai, bi), oi) in ab.iter().zip(bb).zip(ob) {
            s.store(oi, f.apply(s, [s.load(ai), s.load(bi)]));
        }
    }
    if !at.is_empty() {
        let mut buf = padded(at, 0.0);
        let y = f.apply(s, [s.load(&buf), s.load(&padded(bt, 0.0))]);
        s.store(&mut buf, y);
        unpad(&buf, ot);
    }
}

/// `out[i] = f(a[i], b[i], c[i])` over the shortest of the four lengths.
#[inline(always)]
pub fn map3<S: SimdF32>(s: S, a: &[f32], b: &[f32], c: &[f32], out: &mut [f32], stream: bool, f: &impl LaneFn<S, 3>) {
    let n = a.len().min(b.len()).min(c.len()).min(out.len());
    let (a, b, c, out) = (a.split_at(n).0, b.split_at(n).0, c.split_at(n).0, out.split_at_mut(n).0);
    let head = head_len(out);
    let (ah, a) = a.split_at(head);
    let (bh, b) = b.split_at(head);
    let (ch, c) = c.split_at(head);
    let (oh, out) = out.split_at_mut(head);
    if head > 0 {
        let mut buf = padded(ah, 0.0);
        let y = f.apply(s, [s.load(&buf), s.load(&padded(bh, 0.0)), s.load(&padded(ch, 0.0))]);
        s.store(&mut buf, y);
        unpad(&buf, oh);
    }
    let (ab, at) = a.as_chunks::<LANES>();
    let (bb, bt) = b.as_chunks::<LANES>();
    let (cb, ct) = c.as_chunks::<LANES>();
    let (ob, ot) = out.as_chunks_mut::<LANES>();
    if stream {
        for (((ai, bi), ci), oi) in ab.iter().zip(bb).zip(cb).zip(ob) {
            s.stream(oi, f.apply(s, [s.load(ai), s.load(bi), s.load(ci)]));
        }
    } else {
        for (((ai, bi), ci), oi) in ab.iter().zip(bb).zip(cb).zip(ob) {
            s.store(oi, f.apply(s, [s.load(ai), s.load(bi), s.load(ci)]));
        }
    }
    if !at.is_empty() {
        let mut buf = padded(at, 0.0);
        let y = f.apply(s, [s.load(&buf), s.load(&padded(bt, 0.0)), s.load(&padded(ct, 0.0))]);
        s.store(&mut buf, y);
        unpad(&buf, ot);
    }
}

/// `x[i] = f(x[i])` in place.
#[inline(always)]
pub fn map_in_place<S: SimdF32>(s: S, x: &mut [f32], stream: bool, f: &impl LaneFn<S, 1>) {
    let head = head_len(x);
    let (xh, x) = x.split_at_mut(head);
    if head > 0 {
        let mut buf = padded(xh, 0.0);
        let y = f.apply(s, [s.load(&buf)]);
        s.store(&mut buf, y);
        unpad(&buf, xh);
    }
    let (xb, xt) = x.as_chunks_mut::<LANES>();
    if stream {
        for xi in xb {
            s.stream(xi, f.apply(s, [s.load(xi)]));
        }
    } else {
        for xi in xb {
            s.store(xi, f.apply(s, [s.load(xi)]));
        }
    }
    if !xt.is_empty() {
        let mut buf = padded(xt, 0.0);
        let y = f.apply(s, [s.load(&buf)]);
        s.store(&mut buf, y);
        unpad(&buf, xt);
    }
}

/// Prefetches `p`, into L2 when `far` (the caller's next row is long: see
/// [`PREFETCH_L2_FROM`]).
#[inline(always)]
fn prefetch<S: SimdF32>(s: S, p: &Block, far: bool) {
    if far { s.prefetch_l2(p) } else { s.prefetch(p) }
}

/// `out[i] = f(x[i])` and returns the lane-wise sum of the outputs (tail lanes
/// padded with `pad`, whose `f(pad)` must be 0), in four accumulators. One
/// cache line of `ahead` (the data the caller reads next, e.g. the next row) is
/// prefetched per block, at the same offset, so its memory latency overlaps
/// this pass's arithmetic; pass `&[]` for none.
#[inline(always)]
pub fn map1_sum<S: SimdF32>(s: S, x: &[f32], out: &mut [f32], pad: f32, ahead: &[f32], f: &impl LaneFn<S, 1>) -> S::V {
    let n = x.len().min(out.len());
    let (x, out) = (x.split_at(n).0, out.split_at_mut(n).0);
    let zero = s.splat(0.0);
    let mut total = zero;
    let mut xs = x.chunks(FOLD_SPAN);
    let mut os = out.chunks_mut(FOLD_SPAN);
    let far = ahead.len() >= PREFETCH_L2_FROM;
    let mut ahead = ahead.chunks(FOLD_SPAN);
    while let (Some(x), Some(out)) = (xs.next(), os.next()) {
        let (pb, _) = ahead.next().unwrap_or(&[]).as_chunks::<LANES>();
        let mut pb = pb.iter();
        let (xq, xr) = x.as_chunks::<{ 4 * LANES }>();
        let (oq, or) = out.as_chunks_mut::<{ 4 * LANES }>();
        let mut acc = [zero; 4];
        for (xi, oi) in xq.iter().zip(oq) {
            let (xb, _) = xi.as_chunks::<LANES>();
            let (ob, _) = oi.as_chunks_mut::<LANES>();
            for ((a, xb), ob) in acc.iter_mut().zip(xb).zip(ob) {
                if let Some(p) = pb.next() {
                    prefetch(s, p, far);
                }
                let y = f.apply(s, [s.load(xb)]);
                s.store(ob, y);
                *a = s.add(*a, y);
            }
        }
        let (xb, xt) = xr.as_chunks::<LANES>();
        let (ob, ot) = or.as_chunks_mut::<LANES>();
        for ((a, xb), ob) in acc.iter_mut().zip(xb).zip(ob) {
            let y = f.apply(s, [s.load(xb)]);
            s.store(ob, y);
            *a = s.add(*a, y);
        }
        if !xt.is_empty() {
            let mut buf = padded(xt, pad);
            let y = f.apply(s, [s.load(&buf)]);
            s.store(&mut buf, y);
            unpad(&buf, ot);
            acc[3] = s.add(acc[3], y);
        }
        let [a0, a1, a2, a3] = acc;
        total = s.add(total, s.add(s.add(a0, a1), s.add(a2, a3)));
    }
    total
}

/// Folds `x` into one vector: `step(acc, v)` over 16-lane blocks into four
/// accumulators started at `init`, combined with `combine` (and restarted every
/// [`FOLD_SPAN`] elements). The tail block is padded with `pad`, which must be
/// neutral for `step`. `ahead` is prefetched as in [`map1_sum`] (`&[]` for none).
#[inline(always)]
pub fn fold1<S: SimdF32>(
    s: S,
    x: &[f32],
    pad: f32,
    init: S::V,
    ahead: &[f32],
    step: &impl LaneFn<S, 2>,
    combine: &impl LaneFn<S, 2>,
) -> S::V {
    let mut total = init;
    let far = ahead.len() >= PREFETCH_L2_FROM;
    let mut ahead = ahead.chunks(FOLD_SPAN);
    for x in x.chunks(FOLD_SPAN) {
        let (pb, _) = ahead.next().unwrap_or(&[]).as_chunks::<LANES>();
        let mut pb = pb.iter();
        let (xq, xr) = x.as_chunks::<{ 4 * LANES }>();
        let mut acc = [init; 4];
        for xi in xq {
            let (xb, _) = xi.as_chunks::<LANES>();
            for (a, xb) in acc.iter_mut().zip(xb) {
                if let Some(p) = pb.next() {
                    prefetch(s, p, far);
                }
                *a = step.apply(s, [*a, s.load(xb)]);
            }
        }
        let (xb, xt) = xr.as_chunks::<LANES>();
        for (a, xb) in acc.iter_mut().zip(xb) {
            *a = step.apply(s, [*a, s.load(xb)]);
        }
        if !xt.is_empty() {
            acc[3] = step.apply(s, [acc[3], s.load(&padded(xt, pad))]);
        }
        let [a0, a1, a2, a3] = acc;
        total = combine.apply(s, [total, combine.apply(s, [combine.apply(s, [a0, a1]), combine.apply(s, [a2, a3])])]);
    }
    total
}

/// Like [`fold1`] over pairs `(a[i], b[i])`, both tails padded with `pad`.
#[inline(always)]
pub fn fold2<S: SimdF32>(
    s: S,
    a: &[f32],
    b: &[f32],
    pad: f32,
    init: S::V,
    step: &impl LaneFn<S, 3>,
    combine: &impl LaneFn<S, 2>,
) -> S::V {
    let n = a.len().min(b.len());
    let (a, b) = (a.split_at(n).0, b.split_at(n).0);
    let mut total = init;
    for (a, b) in a.chunks(FOLD_SPAN).zip(b.chunks(FOLD_SPAN)) {
        let (aq, ar) = a.as_chunks::<{ 4 * LANES }>();
        let (bq, br) = b.as_chunks::<{ 4 * LANES }>();
        let mut acc = [init; 4];
        for (ai, bi) in aq.iter().zip(bq) {
            let (ab, _) = ai.as_chunks::<LANES>();
            let (bb, _) = bi.as_chunks::<LANES>();
            for ((acc, ab), bb) in acc.iter_mut().zip(ab).zip(bb) {
                *acc = step.apply(s, [*acc, s.load(ab), s.load(bb)]);
            }
        }
        let (ab, at) = ar.as_chunks::<LANES>();
        let (bb, bt) = br.as_chunks::<LANES>();
        for ((acc, ab), bb) in acc.iter_mut().zip(ab).zip(bb) {
            *acc = step.apply(s, [*acc, s.load(ab), s.load(bb)]);
        }
        if !at.is_empty() {
            acc[3] = step.apply(s, [acc[3], s.load(&padded(at, pad)), s.load(&padded(bt, pad))]);
        }
        let [a0, a1, a2, a3] = acc;
        total = combine.apply(s, [total, combine.apply(s, [combine.apply(s, [a0, a1]), combine.apply(s, [a2, a3])])]);
    }
    total
}

/// `a + b`: the combine step of sums.
#[derive(Clone, Copy, Debug)]
pub struct Add;

impl<S: SimdF32> LaneFn<S, 2> for Add {
    #[inline(always)]
    fn apply(&self, s: S, [a, b]: [S::V; 2]) -> S::V {
        s.add(a, b)
    }
}

/// `max(acc, v)` that keeps a NaN from either side: `max(v, acc)` returns
/// `acc` when either is NaN (so a NaN accumulator sticks), and a NaN `v` is
/// selected explicitly. Step and combine of NaN-propagating maxima.
#[derive(Clone, Copy, Debug)]
pub struct NanMax;

impl<S: SimdF32> LaneFn<S, 2> for NanMax {
    #[inline(always)]
    fn apply(&self, s: S, [acc, v]: [S::V; 2]) -> S::V {
        s.select(s.is_nan(v), v, s.max(v, acc))
    }
}

/// Largest element of `x` (−∞ if empty), NaN if any element is NaN: one
/// [`fold1`] with [`NanMax`].
#[inline(always)]
pub fn max_of<S: SimdF32>(s: S, x: &[f32]) -> f32 {
    let m = fold1(s, x, f32::NEG_INFINITY, s.splat(f32::NEG_INFINITY), &[], &NanMax, &NanMax);
    if s.any(s.is_nan(m)) { f32::NAN } else { s.reduce_max(m) }
}
