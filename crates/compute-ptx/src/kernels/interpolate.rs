//! Interpolation kernels: `lerp` (element-wise) and `slerp` (one warp per
//! row), per dtype, computing in `f32`.
//!
//! - `lerp`: the streaming skeleton of the element-wise kernels (vector units
//!   of 4 or 8 elements, four in flight per thread, grid-stride), each
//!   element `fma(c, b − a, t < 0.5 ? a : b)` with `c = t` or `t − 1`: exact
//!   at `t = 0` and `t = 1`.
//! - `slerp`: one warp per row, eight rows per 256-thread block. Pass 1 folds
//!   `‖a‖²`, `‖b‖²`, `⟨a, b⟩` (lanes stride the row, coalesced; combined with
//!   `shfl.sync.bfly`); every lane then decides the row's case as the op
//!   documents it and evaluates `Ω = acos c` and the three sines with
//!   polynomials (Cephes `asinf`/`sinf`/`cosf`, a few ulp on `[−1, 1]` and
//!   `[0, π]`; no `sin.approx`, whose absolute error is too coarse for small
//!   angles); pass 2 reads the row again (from L1/L2) and writes
//!   `p·a + q·b`, or the lerp for zero and near-(anti)parallel rows.

use super::elem;
use super::elementwise::{BLOCK, Stream, stream_loop};
use crate::builder::{BuildError, Cmp, Dim, F32, Kernel, KernelBuilder, Pred, Reg, Target, U32, U64};
use compute_core::DType;

/// Threads per block of the slerp kernels.
pub const SLERP_BLOCK: u32 = 256;
/// Rows per block of the slerp kernels (one warp each).
pub const SLERP_ROWS: u32 = SLERP_BLOCK / 32;

/// Name of the lerp kernel for `dtype` (`lerp`, `lerp_bf16`).
pub fn lerp_name(dtype: DType) -> String {
    format!("lerp{}", elem::suffix(dtype))
}

/// Name of the slerp kernel for `dtype` (`slerp_warp`, `slerp_warp_f16`).
pub fn slerp_name(dtype: DType) -> String {
    format!("slerp_warp{}", elem::suffix(dtype))
}

/// Builds the lerp kernel on `dtype`. Params: `a`, `b`, `y` (pointers), `n`
/// (elements, u64), `t` (f32). Launch as the element-wise kernels.
pub fn lerp(dtype: DType, target: Target) -> Result<Kernel, BuildError> {
    let name = lerp_name(dtype);
    let mut b = KernelBuilder::new(&name, target);
    b.doc(&format!("{name}: y = t < 0.5 ? fma(t, b - a, a) : fma(t - 1, b - a, b), element-wise"));
    b.doc(&format!("params: a, b, y ({dtype} pointers), n (elements), t (f32)"));
    if dtype != DType::F32 {
        b.doc(&format!("{dtype} widened to f32 on load, rounded to nearest even on store"));
    }
    b.doc(&format!("launch: {BLOCK} threads per block, any grid (grid-stride)"));
    b.max_threads(BLOCK);
    let a = b.param_ptr("a");
    let bb = b.param_ptr("b");
    let y = b.param_ptr("y");
    let n = b.param::<U64>("n");
    let t = b.param::<F32>("t");
    let low = b.setp(Cmp::Lt, t, 0.5f32);
    let tm1 = b.sub(t, 1.0f32);
    let c = b.selp(t, tm1, low);
    let s = Stream { inputs: vec![(a, dtype), (bb, dtype)], y: (y, dtype), n };
    stream_loop(&mut b, &s, &mut |b, xs| lerp_element(b, xs[0], xs[1], c, low));
    b.finish()
}

/// `fma(c, y − x, low ? x : y)`.
fn lerp_element(b: &mut KernelBuilder, x: Reg<F32>, y: Reg<F32>, c: Reg<F32>, low: Reg<Pred>) -> Reg<F32> {
    let d = b.sub(y, x);
    let base = b.selp(x, y, low);
    b.fma(c, d, base)
}

/// `ks[0]·xⁿ + ks[1]·xⁿ⁻¹ + … + ks[n]` by Horner's rule (fused steps).
fn horner(b: &mut KernelBuilder, x: Reg<F32>, ks: &[f32]) -> Reg<F32> {
    let mut p = b.mov(ks[0]);
    for &k in &ks[1..] {
        p = b.fma(p, x, k);
    }
    p
}

/// `acos(c)` for `c` in `[−1, 1]` (Cephes `acosf`): `π/2 − asin c` for
/// `|c| ≤ 0.5`, else `2·asin(√((1 − |c|)/2))` reflected for negative `c`.
fn acos(b: &mut KernelBuilder, c: Reg<F32>) -> Reg<F32> {
    let ac = b.abs(c);
    let big = b.setp(Cmp::Gt, ac, 0.5f32);
    // 0.5·(1 − |c|): exact for |c| in [0.5, 1].
    let h = b.fma(ac, -0.5f32, 0.5f32);
    let sq = b.sqrt(h);
    let z = b.selp(sq, c, big);
    let z2 = b.mul(z, z);
    let p = horner(b, z2, &[4.216_32e-2, 2.418_131e-2, 4.547_002_6e-2, 7.495_300_3e-2, 1.666_675_2e-1]);
    let pz = b.mul(p, z2);
    let asn = b.fma(pz, z, z);
    let two = b.add(asn, asn);
    let neg = b.setp(Cmp::Lt, c, 0.0f32);
    let reflected = b.sub(std::f32::consts::PI, two);
    let big_r = b.selp(reflected, two, neg);
    let small_r = b.sub(std::f32::consts::FRAC_PI_2, asn);
    b.selp(big_r, small_r, big)
}

/// `sin x` for `x` in `[0, π]` (Cephes `sinf`/`cosf` polynomials on
/// `|r| ≤ π/4` after subtracting `k·π/2`, `k` in {0, 1, 2}, in three exact parts).
fn sin_0_pi(b: &mut KernelBuilder, x: Reg<F32>) -> Reg<F32> {
    use std::f32::consts::FRAC_PI_4;
    let j1 = b.setp(Cmp::Gt, x, FRAC_PI_4);
    let j2 = b.setp(Cmp::Gt, x, 3.0 * FRAC_PI_4);
    let k1 = b.selp(1.0f32, 0.0f32, j1);
    let k = b.selp(2.0f32, k1, j2);
    let r = b.fma(k, -1.570_312_5f32, x);
    let r = b.fma(k, -4.837_513e-4f32, r);
    let r = b.fma(k, -7.549_79e-8f32, r);
    let r2 = b.mul(r, r);
    let sp = horner(b, r2, &[-1.951_529_6e-4, 8.332_161e-3, -1.666_665_5e-1]);
    let sr = b.mul(sp, r2);
    let sin = b.fma(sr, r, r);
    let cp = horner(b, r2, &[2.443_315_7e-5, -1.388_731_6e-3, 4.166_664_6e-2]);
    let r4 = b.mul(r2, r2);
    let c4 = b.mul(cp, r4);
    let c0 = b.fma(r2, -0.5f32, 1.0f32);
    let cos = b.add(c0, c4);
    let nsin = b.neg(sin);
    let far = b.selp(nsin, sin, j2);
    let mid = b.not_pred(j2);
    let mid = b.and_pred(j1, mid);
    b.selp(cos, far, mid)
}

/// Builds the slerp kernel on `dtype`. Params: `a`, `b`, `y` (pointers),
/// `rows`, `cols` (u32), `t` (f32, in `[0, 1]`). Launch: [`SLERP_BLOCK`]
/// threads, `ceil(rows / 8)` blocks, no shared memory.
pub fn slerp(dtype: DType, target: Target) -> Result<Kernel, BuildError> {
    let name = slerp_name(dtype);
    let mut b = KernelBuilder::new(&name, target);
    b.doc(&format!(
        "{name}: y = sin((1-t)W)/sin W * a + sin(tW)/sin W * b per row, W = acos(<a,b>/(|a||b|)); lerp for zero rows and |cos W| > 0.9995; NaN rows for non-finite |a|^2, |b|^2"
    ));
    b.doc(&format!(
        "one warp per row, {SLERP_ROWS} rows per {SLERP_BLOCK}-thread block; two passes over the row ({dtype} loads, f32 math)"
    ));
    b.doc("params: a, b, y (pointers), rows, cols (u32), t (f32 in [0, 1])");
    b.max_threads(SLERP_BLOCK);
    let a = b.param_ptr("a");
    let bp = b.param_ptr("b");
    let y = b.param_ptr("y");
    let rows = b.param::<U32>("rows");
    let cols = b.param::<U32>("cols");
    let t = b.param::<F32>("t");

    let tid = b.tid(Dim::X);
    let lane = b.and(tid, 31u32);
    let warp = b.shr(tid, 5u32);
    let cta = b.ctaid(Dim::X);
    let row = b.mad(cta, SLERP_ROWS, warp);
    // Whole warps leave together, so the shuffles below see 32 lanes.
    let gone = b.setp(Cmp::Ge, row, rows);
    b.guarded(gone, false, |b| b.ret());
    let roff = b.mul_wide(row, cols);
    let roff = b.shl(roff, elem::shift(dtype));
    let ar = b.add(a, roff);
    let br = b.add(bp, roff);
    let yr = b.add(y, roff);

    b.comment("pass 1: |a|^2, |b|^2, <a, b>");
    let na = b.mov(0.0f32);
    let nb = b.mov(0.0f32);
    let dot = b.mov(0.0f32);
    let k = b.mov(lane);
    let sums = b.label("sums");
    let summed = b.label("summed");
    b.place(sums);
    let past = b.setp(Cmp::Ge, k, cols);
    b.bra_if(past, summed);
    let off = b.mul_wide(k, elem::size(dtype));
    let pa = b.add(ar, off);
    let pb = b.add(br, off);
    let x = elem::load(&mut b, dtype, pa, 0, 1)[0];
    let z = elem::load(&mut b, dtype, pb, 0, 1)[0];
    b.fma_acc(na, x, x);
    b.fma_acc(nb, z, z);
    b.fma_acc(dot, x, z);
    let next = b.add(k, 32u32);
    b.assign(k, next);
    b.bra(sums);
    b.place(summed);
    for mask in [16, 8, 4, 2, 1] {
        for r in [na, nb, dot] {
            let o = b.shfl_bfly(r, mask);
            let s = b.add(r, o);
            b.assign(r, s);
        }
    }

    b.comment("the row's case and coefficients (every lane alike)");
    let za = b.setp(Cmp::Lt, na, f32::MIN_POSITIVE);
    let zb = b.setp(Cmp::Lt, nb, f32::MIN_POSITIVE);
    let zero = b.or_pred(za, zb);
    // NaN and infinite squared norms fail `<= MAX`.
    let fa = b.setp(Cmp::Le, na, f32::MAX);
    let fb = b.setp(Cmp::Le, nb, f32::MAX);
    let finite = b.and_pred(fa, fb);
    let sa = b.sqrt(na);
    let sb = b.sqrt(nb);
    let den = b.mul(sa, sb);
    let c = b.div(dot, den);
    let c = b.min(c, 1.0f32);
    let c = b.max(c, -1.0f32);
    let ac = b.abs(c);
    let parallel = b.setp(Cmp::Gt, ac, compute_core::reference::SLERP_PARALLEL);
    let parallel = b.and_pred(parallel, finite);
    let use_lerp = b.or_pred(zero, parallel);
    let w = acos(&mut b, c);
    let sw = sin_0_pi(&mut b, w);
    let omt = b.sub(1.0f32, t);
    let u = b.mul(omt, w);
    let v = b.mul(t, w);
    let su = sin_0_pi(&mut b, u);
    let sv = sin_0_pi(&mut b, v);
    let p = b.div(su, sw);
    let q = b.div(sv, sw);
    // The ends exactly: t = 0 gives a, t = 1 gives b.
    let t0 = b.setp(Cmp::Eq, t, 0.0f32);
    let t1 = b.setp(Cmp::Eq, t, 1.0f32);
    let p = b.selp(1.0f32, p, t0);
    let q = b.selp(0.0f32, q, t0);
    let p = b.selp(0.0f32, p, t1);
    let q = b.selp(1.0f32, q, t1);
    let p = b.selp(p, f32::NAN, finite);
    let q = b.selp(q, f32::NAN, finite);
    let low = b.setp(Cmp::Lt, t, 0.5f32);
    let tm1 = b.sub(t, 1.0f32);
    let lc = b.selp(t, tm1, low);

    b.comment("pass 2: y = p*a + q*b, or the lerp");
    let k = b.mov(lane);
    let out = b.label("out");
    let done = b.label("done");
    b.place(out);
    let past = b.setp(Cmp::Ge, k, cols);
    b.bra_if(past, done);
    let off = b.mul_wide(k, elem::size(dtype));
    let pa = b.add(ar, off);
    let pb = b.add(br, off);
    let py = b.add(yr, off);
    let x = elem::load(&mut b, dtype, pa, 0, 1)[0];
    let z = elem::load(&mut b, dtype, pb, 0, 1)[0];
    let lerp_y = lerp_element(&mut b, x, z, lc, low);
    let qz = b.mul(q, z);
    let arc_y = b.fma(p, x, qz);
    let yv = b.selp(lerp_y, arc_y, use_lerp);
    elem::store(&mut b, dtype, py, 0, &[yv]);
    let next = b.add(k, 32u32);
    b.assign(k, next);
    b.bra(out);
    b.place(done);
    b.ret();
    b.finish()
}
