//! Conversions between `f32` and the 2-byte float types, vectorised and
//! picked at run time: F16C (`vcvtph2ps` / `vcvtps2ph`, 8 values per
//! instruction) for `f16` on the AVX2 and AVX-512 paths, integer shifts and
//! adds compiled for AVX2 for `bf16`, and the `half` crate's converters (which
//! use F16C or the Arm `fp16` instructions where the CPU has them) elsewhere.
//!
//! [`fused`] runs the cheap element-wise ops and the casts in one pass on
//! AVX2 + F16C: each step loads 16 values of every input, widens them in
//! registers, applies the op's `f32` lane function (the same one the `f32`
//! kernels use), narrows and stores 16 values, streaming large outputs past
//! the cache as the `f32` kernels do.
//!
//! Every conversion rounds to nearest, ties to even, keeps NaN a NaN and
//! sends values past the narrow type's range to ±∞, bit for bit as
//! `half::f16::from_f32` / `half::bf16::from_f32` (tested below).

use compute_core::{BinaryOp, Element, HostSlice, UnaryOp, bf16, f16};

use crate::isa::Isa;

/// `dst[i] = src[i]` as `f32` (exact) over the shorter length.
pub fn widen<T: Element>(isa: Isa, src: &[T], dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    let (src, dst) = (&src[..n], &mut dst[..n]);
    if let Some(s) = cast::<T, f32>(src) {
        dst.copy_from_slice(s);
    } else if let Some(s) = cast::<T, f16>(src) {
        widen_f16(isa, bytemuck::cast_slice(s), dst);
    } else if let Some(s) = cast::<T, bf16>(src) {
        widen_bf16(isa, bytemuck::cast_slice(s), dst);
    }
}

/// `dst[i] = src[i]` rounded to `T` over the shorter length.
pub fn narrow<T: Element>(isa: Isa, src: &[f32], dst: &mut [T]) {
    let n = src.len().min(dst.len());
    let (src, dst) = (&src[..n], &mut dst[..n]);
    if let Some(d) = cast_mut::<T, f32>(dst) {
        d.copy_from_slice(src);
    } else if let Some(d) = cast_mut::<T, f16>(dst) {
        narrow_f16(isa, src, bytemuck::cast_slice_mut(d));
    } else if let Some(d) = cast_mut::<T, bf16>(dst) {
        narrow_bf16(isa, src, bytemuck::cast_slice_mut(d));
    }
}

/// `out[i] = Σ_p x[i·k + p]·w[at + p]` for each of the `out.len()` rows of
/// `x` (`k` values each), with the half weight row widened in registers 16
/// values at a time as it is read: on the AVX2 path of a CPU with F16C, for
/// an `f16` or `bf16` `w`. Each row's sum is the same whatever the thread
/// count (one fixed order). Returns false, having written nothing,
/// elsewhere, or when a slice is too short. Costs `2·rows·k` FLOPs and one
/// read of the weight row per four rows of `x`.
pub fn dot_rows(isa: Isa, x: &[f32], k: usize, w: HostSlice<'_>, at: usize, out: &mut [f32]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2
        && x.len() >= out.len().saturating_mul(k)
        && let Some(t) = x86::Tok::detect()
    {
        let end = at.saturating_add(k);
        match w {
            HostSlice::F16(w) => {
                if let Some(w) = w.get(at..end) {
                    // SAFETY: the token proves avx2, fma and f16c, the features the entry enables.
                    unsafe { x86::dots_entry(t, x, k, w, out) };
                    return true;
                }
            }
            HostSlice::BF16(w) => {
                if let Some(w) = w.get(at..end) {
                    // SAFETY: as above.
                    unsafe { x86::dots_entry(t, x, k, w, out) };
                    return true;
                }
            }
            _ => {}
        }
    }
    let _ = (isa, x, k, w, at, out);
    false
}

/// Columns `j0..j1` of `x·W` for the `m × k` rows `x` and `W` stored
/// `k × n` in `f16` or `bf16`, added into `acc` (`m` rows of `j1 − j0`
/// values), with each piece of `W` widened in registers as it is read, four
/// depth steps per load of the accumulators: on the AVX2 path of a CPU with
/// F16C. Each output adds its depth steps in order, one fused multiply-add
/// each, as the `f32` lane code over a widened piece does. Returns false,
/// having written nothing, elsewhere, or when a slice is too short. Costs
/// `2·m·k·(j1 − j0)` FLOPs and one read of those columns of `W`.
pub fn columns(
    isa: Isa,
    x: &[f32],
    (m, k, n): (usize, usize, usize),
    w: HostSlice<'_>,
    (j0, j1): (usize, usize),
    acc: &mut [f32],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2
        && j0 <= j1
        && j1 <= n
        && x.len() >= m.saturating_mul(k)
        && w.len() >= k.saturating_mul(n)
        && acc.len() >= m.saturating_mul(j1 - j0)
        && let Some(t) = x86::Tok::detect()
    {
        match w {
            // SAFETY: the token proves avx2, fma and f16c, the features the entry enables.
            HostSlice::F16(w) => unsafe { x86::columns_entry(t, x, (m, k, n), w, (j0, j1), acc) },
            // SAFETY: as above.
            HostSlice::BF16(w) => unsafe { x86::columns_entry(t, x, (m, k, n), w, (j0, j1), acc) },
            _ => return false,
        }
        return true;
    }
    let _ = (isa, x, m, k, n, w, j0, j1, acc);
    false
}

/// What a [`fused`] loop computes from each value (or pair of values).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Lanes {
    /// A unary op, computed in `f32`.
    Unary(UnaryOp),
    /// A binary op, computed in `f32`.
    Binary(BinaryOp),
    /// The value itself: a cast.
    Same,
}

/// `out[i] = f(inputs[..][i])` in one pass (over the shortest length), when
/// this CPU, op and dtypes have a fused loop: the AVX2 and AVX-512 paths on
/// a CPU with F16C, a cheap unary op (not a transcendental), a binary op or a
/// cast, one input of `f32`, `f16` or `bf16` (two of the same
/// dtype for a binary op), output of one of those. Each input is widened
/// to `f32` exactly, `f` is applied with the `f32` kernels' lane function and
/// the result is rounded once, so the values are the staged path's, bit for
/// bit. With `stream` the output is written with non-temporal stores (the
/// caller fences nothing: the loop ends with `sfence`). Returns false, having
/// written nothing, where there is no fused loop.
pub fn fused<T: Element>(isa: Isa, f: Lanes, inputs: &[HostSlice<'_>], out: &mut [T], stream: bool) -> bool {
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2 | Isa::Avx512)
        && let Some(t) = x86::Tok::detect()
    {
        if let Some(o) = cast_mut::<T, f32>(out) {
            return x86::fused(t, f, inputs, o, stream);
        } else if let Some(o) = cast_mut::<T, f16>(out) {
            return x86::fused(t, f, inputs, o, stream);
        } else if let Some(o) = cast_mut::<T, bf16>(out) {
            return x86::fused(t, f, inputs, o, stream);
        }
        return false;
    }
    let _ = (isa, f, inputs, out, stream);
    false
}

/// `out[i] = f(x[i])` in one pass, `f` a lane function of the caller's,
/// from `f16` to `f16` or `bf16` to `bf16`, on a CPU with AVX2, FMA and
/// F16C: [`fused`]'s loop (the same widening, rounding and streaming) with
/// `f` in place of an op's `f32` kernel. `f` is inlined into the loop,
/// compiled for those features. False (nothing written) on other CPUs or
/// dtypes.
#[cfg(target_arch = "x86_64")]
pub(super) fn fused_with<T: Element>(
    x: HostSlice<'_>,
    out: &mut [T],
    stream: bool,
    f: &impl crate::simd::LaneFn<crate::simd::Avx2, 1>,
) -> bool {
    let Some(t) = x86::Tok::detect() else { return false };
    if let (HostSlice::F16(x), Some(o)) = (x, cast_mut::<T, f16>(out)) {
        // SAFETY: the token proves avx2, fma and f16c, the features the entry enables.
        unsafe { x86::map_entry(t, f, x, o, stream) };
        return true;
    }
    if let (HostSlice::BF16(x), Some(o)) = (x, cast_mut::<T, bf16>(out)) {
        // SAFETY: as above.
        unsafe { x86::map_entry(t, f, x, o, stream) };
        return true;
    }
    false
}

/// `s` as a slice of `U` when `T` is `U` (free; the dtype decides).
fn cast<T: Element, U: Element>(s: &[T]) -> Option<&[U]> {
    (T::DTYPE == U::DTYPE).then(|| U::from_host(T::host(s))).flatten()
}

fn cast_mut<T: Element, U: Element>(s: &mut [T]) -> Option<&mut [U]> {
    (T::DTYPE == U::DTYPE).then(|| U::from_host_mut(T::host_mut(s))).flatten()
}

/// Whether this path converts `f16` with F16C.
#[cfg(target_arch = "x86_64")]
fn f16c(isa: Isa) -> bool {
    matches!(isa, Isa::Avx2 | Isa::Avx512) && std::arch::is_x86_feature_detected!("f16c")
}

fn widen_f16(isa: Isa, src: &[u16], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && isa.is_supported() {
        // SAFETY: the CPU has AVX-512F (checked).
        return unsafe { x86::widen_f16_avx512(src, dst) };
    }
    #[cfg(target_arch = "x86_64")]
    if f16c(isa) {
        // SAFETY: the CPU has AVX2 (the path was chosen only if supported) and F16C (checked).
        return unsafe { x86::widen_f16(src, dst) };
    }
    let _ = isa;
    use half::slice::HalfFloatSliceExt;
    let src: &[f16] = bytemuck::cast_slice(src);
    src.convert_to_f32_slice(dst);
}

fn narrow_f16(isa: Isa, src: &[f32], dst: &mut [u16]) {
    #[cfg(target_arch = "x86_64")]
    if f16c(isa) {
        // SAFETY: as in `widen_f16`.
        return unsafe { x86::narrow_f16(src, dst) };
    }
    let _ = isa;
    use half::slice::HalfFloatSliceExt;
    let dst: &mut [f16] = bytemuck::cast_slice_mut(dst);
    dst.convert_from_f32_slice(src);
}

fn widen_bf16(isa: Isa, src: &[u16], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 && isa.is_supported() {
        // SAFETY: the CPU has AVX-512F (checked).
        return unsafe { x86::widen_bf16_avx512(src, dst) };
    }
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2 | Isa::Avx512) {
        // SAFETY: the AVX2 and AVX-512 paths are chosen only on CPUs with AVX2.
        return unsafe { x86::widen_bf16(src, dst) };
    }
    let _ = isa;
    widen_bf16_lanes(src, dst);
}

fn narrow_bf16(isa: Isa, src: &[f32], dst: &mut [u16]) {
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2 | Isa::Avx512) {
        // SAFETY: as in `widen_bf16`.
        return unsafe { x86::narrow_bf16(src, dst) };
    }
    let _ = isa;
    narrow_bf16_lanes(src, dst);
}

/// bf16 → f32: the 16 bits become the top half of the f32. Branch-free, so
/// the compiler vectorises it at whatever width the caller is compiled for.
#[inline(always)]
fn widen_bf16_lanes(src: &[u16], dst: &mut [f32]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f32::from_bits(u32::from(s) << 16);
    }
}

/// f32 → bf16, round to nearest even: add `0x7fff` plus the lowest kept bit,
/// keep the top 16 bits; a NaN keeps its sign and top payload bits and is
/// made quiet. Branch-free (the NaN case is a select), so it vectorises.
#[inline(always)]
fn narrow_bf16_lanes(src: &[f32], dst: &mut [u16]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        let b = x.to_bits();
        let rounded = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
        let quiet = ((b >> 16) as u16) | 0x0040;
        *d = if x.is_nan() { quiet } else { rounded };
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use compute_core::{BinaryOp, HostSlice, bf16, f16};

    use super::Lanes;
    use crate::kernels::elementwise::{LaneLoop, with_binary, with_cheap_unary};
    use crate::simd::{Avx2, LaneFn, SimdF32};

    /// Sixteen `f32` lanes as two AVX registers.
    type V2 = <Avx2 as SimdF32>::V;

    /// Proof that the running CPU has AVX2, FMA and F16C: only [`Tok::detect`]
    /// makes one.
    #[derive(Clone, Copy, Debug)]
    pub(super) struct Tok {
        s: Avx2,
    }

    impl Tok {
        /// The token if this CPU has AVX2, FMA and F16C (cached feature checks).
        #[inline]
        pub(super) fn detect() -> Option<Tok> {
            if is_x86_feature_detected!("f16c") { Avx2::detect().map(|s| Tok { s }) } else { None }
        }
    }

    /// Calls AVX2 / F16C intrinsics; the `Tok` in scope proves the CPU has them.
    macro_rules! f16c {
        ($e:expr) => {
            // SAFETY: a `Tok` exists only on CPUs with avx2, fma and f16c (see
            // `Tok::detect`); pointers come from references to whole blocks of
            // 16 values, and offsets stay within them.
            unsafe { $e }
        };
    }

    /// A storage type the fused loops read and write 16 values of at a time,
    /// in order, as the two `__m256` of an AVX2 [`SimdF32`] vector.
    pub(super) trait Io: Copy + Default {
        /// 16 values widened to `f32` (exact).
        fn load(t: Tok, x: &[Self; 16]) -> V2;
        /// 16 values rounded to this type, stored.
        fn store(t: Tok, out: &mut [Self; 16], v: V2);
        /// As [`Io::store`], non-temporal when `out` is 32-byte aligned.
        fn stream(t: Tok, out: &mut [Self; 16], v: V2);
    }

    impl Io for f32 {
        #[inline(always)]
        fn load(t: Tok, x: &[f32; 16]) -> V2 {
            let _ = t;
            let p = x.as_ptr();
            f16c!([_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))])
        }
        #[inline(always)]
        fn store(t: Tok, out: &mut [f32; 16], v: V2) {
            let _ = t;
            let p = out.as_mut_ptr();
            f16c!({
                _mm256_storeu_ps(p, v[0]);
                _mm256_storeu_ps(p.add(8), v[1]);
            })
        }
        #[inline(always)]
        fn stream(t: Tok, out: &mut [f32; 16], v: V2) {
            let p = out.as_mut_ptr();
            if (p as usize).is_multiple_of(32) {
                f16c!({
                    _mm256_stream_ps(p, v[0]);
                    _mm256_stream_ps(p.add(8), v[1]);
                })
            } else {
                Self::store(t, out, v)
            }
        }
    }

    /// Both halves of `v` rounded to `f16` (`vcvtps2ph`, nearest even).
    #[inline(always)]
    fn to_f16(t: Tok, v: V2) -> __m256i {
        let _ = t;
        f16c!(_mm256_set_m128i(
            _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v[1]),
            _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v[0])
        ))
    }

    impl Io for f16 {
        #[inline(always)]
        fn load(t: Tok, x: &[f16; 16]) -> V2 {
            let _ = t;
            let p = x.as_ptr().cast::<__m128i>();
            f16c!([_mm256_cvtph_ps(_mm_loadu_si128(p)), _mm256_cvtph_ps(_mm_loadu_si128(p.add(1)))])
        }
        #[inline(always)]
        fn store(t: Tok, out: &mut [f16; 16], v: V2) {
            let h = to_f16(t, v);
            f16c!(_mm256_storeu_si256(out.as_mut_ptr().cast(), h))
        }
        #[inline(always)]
        fn stream(t: Tok, out: &mut [f16; 16], v: V2) {
            let h = to_f16(t, v);
            let p = out.as_mut_ptr();
            if (p as usize).is_multiple_of(32) {
                f16c!(_mm256_stream_si256(p.cast(), h))
            } else {
                f16c!(_mm256_storeu_si256(p.cast(), h))
            }
        }
    }

    /// 8 `f32` rounded to `bf16` in the low 16 bits of each lane, as
    /// [`super::narrow_bf16_lanes`]: add `0x7fff` plus the lowest kept bit
    /// and keep the top half; a NaN keeps its top bits, made quiet.
    #[inline(always)]
    fn to_bf16_lanes(t: Tok, v: __m256) -> __m256i {
        let _ = t;
        f16c!({
            let b = _mm256_castps_si256(v);
            let top = _mm256_srli_epi32::<16>(b);
            let lsb = _mm256_and_si256(top, _mm256_set1_epi32(1));
            let rounded =
                _mm256_srli_epi32::<16>(_mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7fff)), lsb));
            let quiet = _mm256_or_si256(top, _mm256_set1_epi32(0x40));
            let nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
            _mm256_blendv_epi8(rounded, quiet, nan)
        })
    }

    /// Both halves of `v` rounded to `bf16`, in order.
    #[inline(always)]
    fn to_bf16(t: Tok, v: V2) -> __m256i {
        let (lo, hi) = (to_bf16_lanes(t, v[0]), to_bf16_lanes(t, v[1]));
        // Every lane is at most 0xffff, so the saturating pack is exact; it
        // packs within 128-bit halves, and the permute puts them in order.
        f16c!(_mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(lo, hi)))
    }

    impl Io for bf16 {
        #[inline(always)]
        fn load(t: Tok, x: &[bf16; 16]) -> V2 {
            let _ = t;
            let p = x.as_ptr().cast::<__m128i>();
            f16c!([
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(_mm_loadu_si128(p)))),
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(_mm_loadu_si128(p.add(1))))),
            ])
        }
        #[inline(always)]
        fn store(t: Tok, out: &mut [bf16; 16], v: V2) {
            let h = to_bf16(t, v);
            f16c!(_mm256_storeu_si256(out.as_mut_ptr().cast(), h))
        }
        #[inline(always)]
        fn stream(t: Tok, out: &mut [bf16; 16], v: V2) {
            let h = to_bf16(t, v);
            let p = out.as_mut_ptr();
            if (p as usize).is_multiple_of(32) {
                f16c!(_mm256_stream_si256(p.cast(), h))
            } else {
                f16c!(_mm256_storeu_si256(p.cast(), h))
            }
        }
    }

    /// The fused loop over `N` inputs of `I` into `out`, as a [`LaneLoop`].
    struct Fuse<'a, I, O, const N: usize> {
        t: Tok,
        ins: [&'a [I]; N],
        out: &'a mut [O],
        stream: bool,
    }

    /// `out = f(ins)` through zero-padded blocks of 16 (the same instructions
    /// as whole blocks), for a head or a tail.
    #[inline(always)]
    fn padded<I: Io, O: Io, const N: usize>(t: Tok, ins: [&[I]; N], out: &mut [O], f: &impl LaneFn<Avx2, N>) {
        for (k, out) in out.chunks_mut(16).enumerate() {
            let mut v = [t.s.splat(0.0); N];
            for (v, x) in v.iter_mut().zip(ins) {
                let mut buf = [I::default(); 16];
                for (b, &x) in buf.iter_mut().zip(x.iter().skip(16 * k)) {
                    *b = x;
                }
                *v = I::load(t, &buf);
            }
            let mut buf = [O::default(); 16];
            O::store(t, &mut buf, f.apply(t.s, v));
            for (o, &b) in out.iter_mut().zip(&buf) {
                *o = b;
            }
        }
    }

    /// `f` of block `i` of every input.
    #[inline(always)]
    fn step<I: Io, const N: usize>(t: Tok, xb: &[&[[I; 16]]; N], i: usize, f: &impl LaneFn<Avx2, N>) -> V2 {
        let mut v = [t.s.splat(0.0); N];
        for (v, x) in v.iter_mut().zip(xb) {
            *v = I::load(t, &x[i]);
        }
        f.apply(t.s, v)
    }

    impl<I: Io, O: Io, const N: usize> LaneLoop<Avx2, N> for Fuse<'_, I, O, N> {
        type Output = ();
        #[inline(always)]
        fn run(self, s: Avx2, f: &impl LaneFn<Avx2, N>) {
            let Fuse { t, ins, out, stream } = self;
            let n = ins.iter().fold(out.len(), |n, x| n.min(x.len()));
            let out = &mut out[..n];
            // A head up to the output's first boundary of a whole block (32
            // bytes of halves, 64 of `f32`: fewer than 16 values) and a tail
            // go through padded blocks; every body store is aligned.
            let head = out.as_ptr().align_offset(std::mem::size_of::<[O; 16]>()).min(n);
            let (oh, out) = out.split_at_mut(head);
            padded(t, ins.map(|x| &x[..head]), oh, f);
            let (ob, ot) = out.as_chunks_mut::<16>();
            let body = ob.len() * 16;
            let xb = ins.map(|x| x[head..head + body].as_chunks::<16>().0);
            // (No closure here: one that is not inlined would be compiled
            // without the entry's target features, a call per intrinsic.)
            if stream {
                for (i, o) in ob.iter_mut().enumerate() {
                    O::stream(t, o, step(t, &xb, i, f));
                }
                s.fence();
            } else {
                for (i, o) in ob.iter_mut().enumerate() {
                    O::store(t, o, step(t, &xb, i, f));
                }
            }
            padded(t, ins.map(|x| &x[head + body..n]), ot, f);
        }
    }

    /// The identity lane function (a cast).
    struct Same;

    impl<S: SimdF32> LaneFn<S, 1> for Same {
        #[inline(always)]
        fn apply(&self, _: S, [v]: [S::V; 1]) -> S::V {
            v
        }
    }

    /// The fused loop of a cheap unary op or a cast; false (nothing written)
    /// for a transcendental op.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn unary_entry<I: Io, O: Io>(t: Tok, f: Lanes, x: &[I], out: &mut [O], stream: bool) -> bool {
        let l = Fuse { t, ins: [x], out, stream };
        match f {
            Lanes::Unary(op) => with_cheap_unary(t.s, op, l).is_ok(),
            _ => {
                l.run(t.s, &Same);
                true
            }
        }
    }

    /// The fused loop of the lane function `f`, from `I` to `O`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn map_entry<I: Io, O: Io>(t: Tok, f: &impl LaneFn<Avx2, 1>, x: &[I], out: &mut [O], stream: bool) {
        Fuse { t, ins: [x], out, stream }.run(t.s, f)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    fn binary_entry<I: Io, O: Io>(t: Tok, op: BinaryOp, a: &[I], b: &[I], out: &mut [O], stream: bool) {
        with_binary(t.s, op, Fuse { t, ins: [a, b], out, stream })
    }

    /// See [`super::fused`].
    pub(super) fn fused<O: Io>(t: Tok, f: Lanes, inputs: &[HostSlice<'_>], out: &mut [O], stream: bool) -> bool {
        match (f, inputs) {
            (Lanes::Binary(op), &[x, y]) => {
                match (x, y) {
                    // SAFETY: the token proves avx2, fma and f16c, the features the entry enables.
                    (HostSlice::F32(a), HostSlice::F32(b)) => unsafe { binary_entry(t, op, a, b, out, stream) },
                    // SAFETY: as above.
                    (HostSlice::F16(a), HostSlice::F16(b)) => unsafe { binary_entry(t, op, a, b, out, stream) },
                    // SAFETY: as above.
                    (HostSlice::BF16(a), HostSlice::BF16(b)) => unsafe { binary_entry(t, op, a, b, out, stream) },
                    _ => return false,
                }
                true
            }
            (Lanes::Unary(_) | Lanes::Same, &[x]) => match x {
                // SAFETY: as above.
                HostSlice::F32(x) => unsafe { unary_entry(t, f, x, out, stream) },
                // SAFETY: as above.
                HostSlice::F16(x) => unsafe { unary_entry(t, f, x, out, stream) },
                // SAFETY: as above.
                HostSlice::BF16(x) => unsafe { unary_entry(t, f, x, out, stream) },
                _ => false,
            },
            _ => false,
        }
    }

    /// Rows `R` of `x` (`k` values each, `R·k` of them) dotted with the
    /// weight row whose whole blocks are `wb` and whose last `k mod 16`
    /// values, zero-padded, are `tail`: `out[j] = reduce(acc_j)`. One or two
    /// rows keep two chains of accumulators (blocks alternating), more rows
    /// one, so that the fused multiply-adds overlap without spilling.
    #[inline(always)]
    fn dots_group<W: Io, const R: usize>(t: Tok, x: &[f32], k: usize, wb: &[[W; 16]], tail: V2, out: &mut [f32]) {
        let s = t.s;
        let body = wb.len() * 16;
        let rows: [&[f32]; R] = std::array::from_fn(|j| &x[j * k..(j + 1) * k]);
        let xb: [&[[f32; 16]]; R] = rows.map(|r| r[..body].as_chunks::<16>().0);
        let mut acc = [s.splat(0.0); R];
        let mut rest = 0..wb.len();
        if R <= 2 {
            let mut odd = [s.splat(0.0); R];
            for i in 0..wb.len() / 2 {
                let (w0, w1) = (W::load(t, &wb[2 * i]), W::load(t, &wb[2 * i + 1]));
                for j in 0..R {
                    acc[j] = s.fma(w0, s.load(&xb[j][2 * i]), acc[j]);
                    odd[j] = s.fma(w1, s.load(&xb[j][2 * i + 1]), odd[j]);
                }
            }
            for j in 0..R {
                acc[j] = s.add(acc[j], odd[j]);
            }
            rest = wb.len() / 2 * 2..wb.len();
        }
        for i in rest {
            let w0 = W::load(t, &wb[i]);
            for j in 0..R {
                acc[j] = s.fma(w0, s.load(&xb[j][i]), acc[j]);
            }
        }
        for j in 0..R {
            let mut xt = [0.0f32; 16];
            xt[..k - body].copy_from_slice(&rows[j][body..]);
            out[j] = s.reduce_add(s.fma(tail, s.load(&xt), acc[j]));
        }
    }

    /// See [`super::dot_rows`]: `w` holds `k` values and `x` at least
    /// `out.len()·k`; rows go four at a time.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn dots_entry<W: Io>(t: Tok, x: &[f32], k: usize, w: &[W], out: &mut [f32]) {
        let (wb, wt) = w[..k].as_chunks::<16>();
        let mut padded = [W::default(); 16];
        padded[..wt.len()].copy_from_slice(wt);
        let tail = W::load(t, &padded);
        for (g, out) in out.chunks_mut(4).enumerate() {
            let x = &x[4 * g * k..];
            match out.len() {
                1 => dots_group::<W, 1>(t, x, k, wb, tail, out),
                2 => dots_group::<W, 2>(t, x, k, wb, tail, out),
                3 => dots_group::<W, 3>(t, x, k, wb, tail, out),
                _ => dots_group::<W, 4>(t, x, k, wb, tail, out),
            }
        }
    }

    /// See [`super::columns`]: the slices hold what it checked.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn columns_entry<W: Io>(
        t: Tok,
        x: &[f32],
        (m, k, n): (usize, usize, usize),
        w: &[W],
        (j0, j1): (usize, usize),
        acc: &mut [f32],
    ) {
        let s = t.s;
        let width = j1 - j0;
        let whole = width / 16 * 16;
        let mut p = 0;
        while p < k {
            let steps = (k - p).min(4);
            for c in (0..whole).step_by(16) {
                let mut wv = [s.splat(0.0); 4];
                for (d, v) in wv.iter_mut().enumerate().take(steps) {
                    if let Some(b) = w[(p + d) * n + j0 + c..].first_chunk::<16>() {
                        *v = W::load(t, b);
                    }
                }
                for i in 0..m {
                    let Some(blk) = acc[i * width + c..].first_chunk_mut::<16>() else { continue };
                    let mut a = s.load(blk);
                    for (d, v) in wv.iter().enumerate().take(steps) {
                        a = s.fma(s.splat(x[i * k + p + d]), *v, a);
                    }
                    s.store(blk, a);
                }
            }
            if whole < width {
                // The last columns (fewer than 16): widened through a padded block.
                for d in 0..steps {
                    let at = (p + d) * n + j0 + whole;
                    let mut buf = [W::default(); 16];
                    buf[..width - whole].copy_from_slice(&w[at..at + width - whole]);
                    let mut wf = [0.0f32; 16];
                    s.store(&mut wf, W::load(t, &buf));
                    for i in 0..m {
                        let xp = x[i * k + p + d];
                        for (a, v) in acc[i * width + whole..(i + 1) * width].iter_mut().zip(&wf) {
                            *a = xp.mul_add(*v, *a);
                        }
                    }
                }
            }
            p += steps;
        }
    }

    /// # Safety
    /// The CPU must support AVX2 and F16C.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn widen_f16(src: &[u16], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: `i + 8 <= n`, so 8 values of `src` (16 bytes) and 8 of
            // `dst` (32 bytes) lie in bounds; both intrinsics accept any alignment.
            unsafe {
                let h = _mm_loadu_si128(src.as_ptr().add(i).cast());
                _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
            }
            i += 8;
        }
        for (d, &s) in dst[i..n].iter_mut().zip(&src[i..n]) {
            *d = half::f16::from_bits(s).to_f32();
        }
    }

    /// # Safety
    /// The CPU must support AVX2 and F16C.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn narrow_f16(src: &[f32], dst: &mut [u16]) {
        let n = src.len().min(dst.len());
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: as in `widen_f16`, with the roles of the slices swapped.
            unsafe {
                let v = _mm256_loadu_ps(src.as_ptr().add(i));
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
                _mm_storeu_si128(dst.as_mut_ptr().add(i).cast(), h);
            }
            i += 8;
        }
        for (d, &s) in dst[i..n].iter_mut().zip(&src[i..n]) {
            *d = half::f16::from_f32(s).to_bits();
        }
    }

    /// 16 values per step: `vcvtph2ps` on a `zmm`.
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn widen_f16_avx512(src: &[u16], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        let mut i = 0;
        while i + 16 <= n {
            // SAFETY: `i + 16 <= n`, so 16 values of `src` (32 bytes) and 16 of
            // `dst` (64 bytes) lie in bounds; both intrinsics accept any alignment.
            unsafe {
                let h = _mm256_loadu_si256(src.as_ptr().add(i).cast());
                _mm512_storeu_ps(dst.as_mut_ptr().add(i), _mm512_cvtph_ps(h));
            }
            i += 16;
        }
        for (d, &s) in dst[i..n].iter_mut().zip(&src[i..n]) {
            *d = half::f16::from_bits(s).to_f32();
        }
    }

    /// 16 values per step: zero-extended to 32 bits and shifted up, on a `zmm`.
    ///
    /// # Safety
    /// The CPU must support AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn widen_bf16_avx512(src: &[u16], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        let mut i = 0;
        while i + 16 <= n {
            // SAFETY: as in `widen_f16_avx512`.
            unsafe {
                let h = _mm256_loadu_si256(src.as_ptr().add(i).cast());
                let w = _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h));
                _mm512_storeu_ps(dst.as_mut_ptr().add(i), _mm512_castsi512_ps(w));
            }
            i += 16;
        }
        super::widen_bf16_lanes(&src[i..n], &mut dst[i..n]);
    }

    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn widen_bf16(src: &[u16], dst: &mut [f32]) {
        super::widen_bf16_lanes(src, dst);
    }

    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn narrow_bf16(src: &[f32], dst: &mut [u16]) {
        super::narrow_bf16_lanes(src, dst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use compute_core::rng::Rng;

    fn every_isa() -> Vec<Isa> {
        Isa::available()
    }

    /// Values that reach every rounding case: ties both ways, subnormals of
    /// both types, overflow to ∞, ±0, ±∞, NaNs with payloads, random bits.
    fn probe_values() -> Vec<f32> {
        let mut rng = Rng::new(compute_core::rng::fresh_seed());
        let mut v = vec![
            0.0,
            -0.0,
            1.0 + 1.0 / 2048.0,
            1.0 + 3.0 / 2048.0,
            1.0 + 1.0 / 256.0,
            1.0 + 3.0 / 256.0,
            65504.0,
            65519.99,
            65520.0,
            -1e9,
            2f32.powi(-24),
            2f32.powi(-25),
            3.0 * 2f32.powi(-26),
            1e-45,
            f32::MAX,
            f32::MIN_POSITIVE,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7f80_0001),
            f32::from_bits(0xffc1_2345),
        ];
        v.extend((0..5000).map(|_| f32::from_bits(rng.next_u64() as u32)));
        v.extend((0..5000).map(|_| rng.uniform(-70_000.0, 70_000.0)));
        v
    }

    #[test]
    fn narrowing_matches_half_bit_for_bit_on_every_path() {
        let x = probe_values();
        for isa in every_isa() {
            // Odd offsets and lengths reach the scalar tails.
            for (start, end) in [(0, x.len()), (3, x.len() - 5), (1, 8), (0, 7)] {
                let src = &x[start..end];
                let mut h = vec![f16::ZERO; src.len()];
                narrow(isa, src, &mut h);
                let mut b = vec![bf16::ZERO; src.len()];
                narrow(isa, src, &mut b);
                for (i, &v) in src.iter().enumerate() {
                    let (want_h, want_b) = (f16::from_f32(v), bf16::from_f32(v));
                    if v.is_nan() {
                        assert!(h[i].is_nan() && b[i].is_nan(), "{isa} NaN {:#x}", v.to_bits());
                        assert_eq!(b[i].to_bits(), want_b.to_bits(), "{isa} bf16 NaN payload {:#x}", v.to_bits());
                    } else {
                        assert_eq!(h[i].to_bits(), want_h.to_bits(), "{isa} f16 of {v:e} ({:#x})", v.to_bits());
                        assert_eq!(b[i].to_bits(), want_b.to_bits(), "{isa} bf16 of {v:e} ({:#x})", v.to_bits());
                    }
                }
            }
        }
    }

    #[test]
    fn widening_is_exact_on_every_path() {
        let mut rng = Rng::new(compute_core::rng::fresh_seed());
        let bits: Vec<u16> = (0..70_000).map(|i| if i < 65_536 { i as u16 } else { rng.next_u64() as u16 }).collect();
        let h: Vec<f16> = bits.iter().map(|&b| f16::from_bits(b)).collect();
        let b: Vec<bf16> = bits.iter().map(|&b| bf16::from_bits(b)).collect();
        for isa in every_isa() {
            let mut out = vec![0.0f32; bits.len() - 3];
            widen(isa, &h[3..], &mut out);
            for (o, v) in out.iter().zip(&h[3..]) {
                assert!(o.to_bits() == v.to_f32().to_bits() || (o.is_nan() && v.is_nan()), "{isa} f16 {v:?}");
            }
            widen(isa, &b[3..], &mut out);
            // A bf16 NaN widens to an f32 NaN with the same top bits (a
            // shift: signalling NaNs are not quieted, unlike `half`'s to_f32).
            for (o, v) in out.iter().zip(&b[3..]) {
                assert_eq!(o.to_bits(), u32::from(v.to_bits()) << 16, "{isa} bf16 {v:?}");
            }
        }
    }

    /// The fused loops against widen, the `f32` kernel, narrow: bit for bit,
    /// NaNs included, with and without streaming stores, at offsets that
    /// leave heads and tails of every length.
    #[test]
    fn fused_loops_match_the_staged_values_bit_for_bit() {
        use compute_core::{BinaryOp, HostSlice, UnaryOp};

        use crate::kernels::elementwise;

        fn check<T: Element>(isa: Isa, a: &[f32], b: &[f32]) {
            let n = a.len().min(b.len());
            let (mut ha, mut hb) = (vec![T::default(); n], vec![T::default(); n]);
            narrow(isa, &a[..n], &mut ha);
            narrow(isa, &b[..n], &mut hb);
            let (mut wa, mut wb) = (vec![0.0f32; n], vec![0.0f32; n]);
            widen(isa, &ha, &mut wa);
            widen(isa, &hb, &mut wb);
            let unary = [
                UnaryOp::Relu,
                UnaryOp::LeakyRelu { alpha: 0.1 },
                UnaryOp::Clip { min: -1.5, max: 2.0 },
                UnaryOp::Scale { s: 3.0 },
            ];
            let binary = [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul];
            let lanes = unary.map(Lanes::Unary).into_iter().chain(binary.map(Lanes::Binary)).chain([Lanes::Same]);
            for f in lanes {
                let mut wide = vec![0.0f32; n];
                match f {
                    Lanes::Unary(op) => elementwise::unary(isa, op, &wa, &mut wide),
                    Lanes::Binary(op) => elementwise::binary(isa, op, &wa, &wb, &mut wide),
                    Lanes::Same => wide.copy_from_slice(&wa),
                }
                let mut want = vec![T::default(); n];
                narrow(isa, &wide, &mut want);
                for (start, end) in [(0, n), (3, n - 5), (17, n - 1), (1, 8), (0, 40)] {
                    let ins = [T::host(&ha[start..end]), T::host(&hb[start..end])];
                    let ins = if matches!(f, Lanes::Binary(_)) { &ins[..] } else { &ins[..1] };
                    for stream in [false, true] {
                        let mut got = vec![T::default(); end - start];
                        let ran = fused(isa, f, ins, &mut got, stream);
                        #[cfg(target_arch = "x86_64")]
                        assert!(
                            ran || !(matches!(isa, Isa::Avx2 | Isa::Avx512)
                                && std::arch::is_x86_feature_detected!("f16c")),
                            "{isa}: no fused loop"
                        );
                        if !ran {
                            continue;
                        }
                        for (i, (g, w)) in got.iter().zip(&want[start..end]).enumerate() {
                            let (g, w) = (g.to_f32(), w.to_f32());
                            assert!(
                                g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                                "{isa} {:?} {f:?} stream {stream} [{}]: {g:e} want {w:e}",
                                T::DTYPE,
                                start + i
                            );
                        }
                    }
                    // f32 in, this dtype out (and back): the casts.
                    if f == Lanes::Same {
                        let mut got = vec![T::default(); end - start];
                        if fused(isa, f, &[HostSlice::F32(&wa[start..end])], &mut got, true) {
                            assert!(
                                got.iter()
                                    .zip(&ha[start..end])
                                    .all(|(g, h)| g.to_f32().to_bits() == h.to_f32().to_bits()
                                        || (g.to_f32().is_nan() && h.to_f32().is_nan())),
                                "{isa} cast to {:?}",
                                T::DTYPE
                            );
                        }
                        let mut back = vec![0.0f32; end - start];
                        if fused(isa, f, &[T::host(&ha[start..end])], &mut back, true) {
                            assert!(
                                back.iter()
                                    .zip(&wa[start..end])
                                    .all(|(g, w)| g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan())),
                                "{isa} cast from {:?}",
                                T::DTYPE
                            );
                        }
                    }
                }
            }
        }

        let a = probe_values();
        let b: Vec<f32> = a.iter().rev().copied().collect();
        for isa in every_isa() {
            check::<f16>(isa, &a, &b);
            check::<bf16>(isa, &a, &b);
        }
        // The fused f32 → half rounding itself, on values that are not halves.
        for isa in every_isa() {
            for stream in [false, true] {
                let mut h = vec![f16::ZERO; a.len() - 3];
                let mut bh = vec![bf16::ZERO; a.len() - 3];
                let (mut wh, mut wb) = (h.clone(), bh.clone());
                narrow(isa, &a[3..], &mut wh);
                narrow(isa, &a[3..], &mut wb);
                if fused(isa, Lanes::Same, &[HostSlice::F32(&a[3..])], &mut h, stream) {
                    assert!(h.iter().zip(&wh).all(|(g, w)| g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan())));
                }
                if fused(isa, Lanes::Same, &[HostSlice::F32(&a[3..])], &mut bh, stream) {
                    assert!(bh.iter().zip(&wb).all(|(g, w)| g.to_bits() == w.to_bits()), "{isa} bf16 narrowing");
                }
            }
        }
    }
}
