//! The bf16 micro-kernel: AVX-512 `vdpbf16ps` (AVX512_BF16), 6 rows by 64
//! columns of `C` in 24 `f32` accumulators, two steps of depth per
//! instruction.
//!
//! Operands come packed in pairs (module [`super::bf16`]): each 32-bit word
//! holds two bf16 values that are neighbours along the depth, the first in
//! the low half. One step loads four vectors of a `B` panel (16 columns × one
//! pair each), broadcasts one pair of `A` per row, and issues 24
//! `vdpbf16ps`: lane `j` of accumulator `(r, v)` gains
//! `a[r][2q]·b[2q][j] + a[r][2q+1]·b[2q+1][j]`, the products exact, each sum
//! rounded to `f32` (nearest even), with bf16 subnormal inputs read as zero
//! as the instruction defines.
//!
//! [`dots`] is the form for few rows of `C` and a transposed `B` (a weight
//! stored `n × k`, as `y = x·Wᵀ` keeps it): both operands are read in place,
//! 32 values of depth per load, each element of `C` a dot product.
//!
//! [`scores`] and [`weighted`] are the two products of decoding attention
//! on bf16 data (a few query rows against a block of keys, then the softmax
//! weights times the block of values), both read in place: the first with
//! 16 dot products summed at once by a transposing tree, the second with the
//! rows of two keys' values interleaved in registers so that one
//! `vdpbf16ps` takes a pair of keys.
//!
//! This module and `kernel.rs` are the GEMM's only `unsafe` code. [`block`]
//! and [`dots`] are the safe doors: they check the lengths and the CPU's
//! features.

use super::kernel::MatMut;

/// Rows of a tile: the height of a packed `A` panel.
pub(crate) const MR: usize = 6;
/// Columns of a tile: the width of a packed `B` panel (four vectors of 16).
pub(crate) const NR: usize = 64;

/// Whether this CPU has the instructions of the kernels (AVX-512F, BW and
/// BF16). Costs three atomic loads after the first call.
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `C (+)= A·B` over one block into the view `c` (`mc × nc`): `a` holds
/// `⌈mc/MR⌉` panels of `pairs` steps of [`MR`] words, `b` holds `⌈nc/NR⌉`
/// panels of `pairs` steps of [`NR`] words. Costs `4·mc·nc·pairs` FLOPs
/// (rounded up to whole tiles). Does nothing if a length is inconsistent or
/// the CPU lacks the kernel's instructions (the caller guarantees neither).
pub(crate) fn block(pairs: usize, a: &[u32], b: &[u32], c: &mut MatMut<'_>, accumulate: bool) {
    let (mc, nc) = (c.rows(), c.cols());
    if pairs == 0 || mc == 0 || nc == 0 {
        return;
    }
    let a_need = mc.div_ceil(MR).saturating_mul(MR).saturating_mul(pairs);
    let b_need = nc.div_ceil(NR).saturating_mul(NR).saturating_mul(pairs);
    let ok = a.len() >= a_need && b.len() >= b_need && available();
    debug_assert!(ok, "bf16 gemm block with inconsistent lengths");
    #[cfg(target_arch = "x86_64")]
    if ok {
        let (ptr, ldc) = c.raw();
        let args = x86::Args { pairs, mc, nc, a: a.as_ptr(), b: b.as_ptr(), c: ptr, ldc, accumulate };
        // SAFETY: the CPU has AVX-512F and AVX512_BF16 (checked above); the
        // lengths checked above, and the view's invariant for `c`, are the
        // contract of `Args`.
        unsafe { x86::block(&args) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (ok, accumulate);
}

/// `C[i][j] = Σₚ x[i·ldx + p]·y[j·ldy + p]` over depth `k` (bf16 bits), for
/// every element of the view `c` (rows of `C` = rows of `x`, columns = rows
/// of `y`): dot products of rows that are both contiguous along the depth,
/// read in place. Costs `2·rows·cols·k` FLOPs plus a horizontal sum per
/// element. Does nothing if a length is inconsistent or the CPU lacks the
/// kernel's instructions.
pub(crate) fn dots(k: usize, (x, ldx): (&[u16], usize), (y, ldy): (&[u16], usize), c: &mut MatMut<'_>) {
    let (m, n) = (c.rows(), c.cols());
    if m == 0 || n == 0 {
        return;
    }
    let fits =
        |v: &[u16], ld: usize, rows: usize| k <= ld && v.len() >= (rows - 1).saturating_mul(ld).saturating_add(k);
    let ok = k > 0 && fits(x, ldx, m) && fits(y, ldy, n) && available();
    debug_assert!(ok, "bf16 gemm dots with inconsistent lengths");
    #[cfg(target_arch = "x86_64")]
    if ok {
        let (ptr, ldc) = c.raw();
        let args = x86::DotArgs { k, x: x.as_ptr(), ldx, y: y.as_ptr(), ldy, m, n, c: ptr, ldc };
        // SAFETY: the CPU has AVX-512F, BW and BF16 (checked above); the
        // lengths checked above, and the view's invariant for `c`, are the
        // contract of `DotArgs`.
        unsafe { x86::dots(&args) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = ok;
}

/// Attention scores of a few query rows (decoding):
/// `c[i·ldc + j] = scale · Σₚ x[i·ldx + p]·y[j·ldy + p]` over depth `k`
/// for `i < m` rows of `x` and `j < n` rows of `y` (bf16 bits, read in
/// place). Tiles of 16 dot products (4 rows × 4 keys, 2 × 8 or 1 × 16)
/// accumulate 32 values of depth per `vdpbf16ps` and are summed together by
/// one transposing tree; row `i` of `c` may be written up to `n` rounded up
/// to 16, so `ldc` must be at least that. `ahead` (any bytes: the next
/// keys) is prefetched into L2 along the way. Costs `2·m·n·k` FLOPs.
/// Returns false, having written nothing, if a length is inconsistent or
/// the CPU lacks the instructions.
#[allow(clippy::too_many_arguments)]
pub(crate) fn scores(
    k: usize,
    (x, ldx): (&[u16], usize),
    m: usize,
    (y, ldy): (&[u16], usize),
    n: usize,
    scale: f32,
    (c, ldc): (&mut [f32], usize),
    ahead: &[u8],
) -> bool {
    if m == 0 || n == 0 {
        return true;
    }
    let fits =
        |v: &[u16], ld: usize, rows: usize| k <= ld && v.len() >= (rows - 1).saturating_mul(ld).saturating_add(k);
    let wide = n.next_multiple_of(16);
    let c_ok = ldc >= wide && c.len() >= (m - 1).saturating_mul(ldc).saturating_add(wide);
    let ok = k > 0 && fits(x, ldx, m) && fits(y, ldy, n) && c_ok && available();
    // Elsewhere `available()` is false and the arguments go unused.
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (scale, ahead);
    #[cfg(target_arch = "x86_64")]
    if ok {
        let args =
            x86::ScoreArgs { k, x: x.as_ptr(), ldx, m, y: y.as_ptr(), ldy, n, scale, c: c.as_mut_ptr(), ldc, ahead };
        // SAFETY: the CPU has AVX-512F, BW and BF16 (checked above); the
        // lengths checked above are the contract of `ScoreArgs`.
        unsafe { x86::scores(&args) }
    }
    ok
}

/// The weighted sum of value rows of attention (decoding):
/// `o[i·ldo + c] += Σ_{j<n} p[i·ldp + j]·v[j·ldv + c]` for `i < m` rows of
/// weights `p` and `c < d` (bf16 bits, `v` read in place). Each row of `p`
/// must be readable up to `n` rounded up to even (a weight past `n` is
/// multiplied by zeros). Key pairs of `v` are interleaved in registers
/// (`vpermt2w`) so that one `vdpbf16ps` adds two keys' terms; tiles of 4
/// rows × 64 columns. `ahead` (the next values) is prefetched along the
/// way. Costs `2·m·n·d` FLOPs. Returns false, having written nothing, if a
/// length is inconsistent or the CPU lacks the instructions.
#[allow(clippy::too_many_arguments)]
pub(crate) fn weighted(
    n: usize,
    (p, ldp): (&[u16], usize),
    m: usize,
    (v, ldv): (&[u16], usize),
    d: usize,
    (o, ldo): (&mut [f32], usize),
    ahead: &[u8],
) -> bool {
    if m == 0 || n == 0 || d == 0 {
        return true;
    }
    let pairs = n.next_multiple_of(2);
    let p_ok = pairs <= ldp && p.len() >= (m - 1).saturating_mul(ldp).saturating_add(pairs);
    let v_ok = d <= ldv && v.len() >= (n - 1).saturating_mul(ldv).saturating_add(d);
    let o_ok = d <= ldo && o.len() >= (m - 1).saturating_mul(ldo).saturating_add(d);
    let ok = p_ok && v_ok && o_ok && available();
    #[cfg(not(target_arch = "x86_64"))]
    let _ = ahead;
    #[cfg(target_arch = "x86_64")]
    if ok {
        let args = x86::WeightArgs { n, p: p.as_ptr(), ldp, m, v: v.as_ptr(), ldv, d, o: o.as_mut_ptr(), ldo, ahead };
        // SAFETY: the CPU has AVX-512F, BW and BF16 (checked above); the
        // lengths checked above are the contract of `WeightArgs`.
        unsafe { x86::weighted(&args) }
    }
    ok
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{MR, NR};

    /// Vectors of 16 lanes per tile row.
    const NV: usize = NR / 16;

    /// Raw view of a [`super::block`] call. Contract: `a` holds
    /// `⌈mc/MR⌉·MR·pairs` words, `b` holds `⌈nc/NR⌉·NR·pairs` words, `c` has
    /// `(mc−1)·ldc + nc` writable `f32`s with `nc ≤ ldc`, not aliasing `a` or `b`.
    pub(super) struct Args {
        pub pairs: usize,
        pub mc: usize,
        pub nc: usize,
        pub a: *const u32,
        pub b: *const u32,
        pub c: *mut f32,
        pub ldc: usize,
        pub accumulate: bool,
    }

    /// Every tile of the block, columns innermost: the `A` panel of a row of
    /// tiles (`MR·pairs` words) stays in L1 while the `B` panels stream from L2.
    ///
    /// # Safety
    /// The CPU supports AVX-512F and AVX512_BF16, and `args` meets its contract.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn block(args: &Args) {
        let mut i = 0;
        while i < args.mc {
            let mut j = 0;
            while j < args.nc {
                // SAFETY: panel `i/MR` of A and `j/NR` of B lie inside `a` and
                // `b`, and the tile at `(i, j)` (clamped to `mc × nc`) inside
                // `c` (contract).
                unsafe {
                    let tile = Tile {
                        c: args.c.add(i * args.ldc + j),
                        ldc: args.ldc,
                        rows: (args.mc - i).min(MR),
                        cols: (args.nc - j).min(NR),
                    };
                    micro(args.pairs, args.a.add(i * args.pairs), args.b.add(j * args.pairs), &tile, args.accumulate);
                }
                j += NR;
            }
            i += MR;
        }
    }

    /// Where one tile of `C` goes: `rows × cols` values at `c`, row stride `ldc`.
    struct Tile {
        c: *mut f32,
        ldc: usize,
        rows: usize,
        cols: usize,
    }

    /// One tile: `C (+)= Apanel·Bpanel` over `pairs` steps.
    ///
    /// # Safety
    /// AVX-512F and AVX512_BF16 are supported; `a` is readable for
    /// `pairs·MR` words, `b` for `pairs·NR`; `tile` is writable with
    /// `1 ≤ rows ≤ MR`, `1 ≤ cols ≤ NR`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn micro(pairs: usize, a: *const u32, b: *const u32, tile: &Tile, accumulate: bool) {
        for r in 0..tile.rows {
            // SAFETY: a prefetch never faults.
            unsafe {
                let p = tile.c.add(r * tile.ldc);
                _mm_prefetch::<_MM_HINT_T0>(p.cast());
                _mm_prefetch::<_MM_HINT_T0>(p.add(tile.cols - 1).cast());
            }
        }
        let mut acc = [[_mm512_setzero_ps(); NV]; MR];
        for q in 0..pairs {
            let mut bv = [_mm512_setzero_si512(); NV];
            for (v, x) in bv.iter_mut().enumerate() {
                // SAFETY: step `q < pairs` of the B panel holds NR words.
                *x = unsafe { _mm512_loadu_si512(b.add(q * NR + v * 16).cast()) };
            }
            for (r, row) in acc.iter_mut().enumerate() {
                // SAFETY: step `q < pairs` of the A panel holds MR words.
                let s = _mm512_set1_epi32(unsafe { a.add(q * MR + r).read_unaligned() } as i32);
                for (x, &y) in row.iter_mut().zip(&bv) {
                    *x = _mm512_dpbf16_ps(*x, as_bh(s), as_bh(y));
                }
            }
        }
        for (r, row) in acc.iter().enumerate().take(tile.rows) {
            for (v, &x) in row.iter().enumerate() {
                let j = v * 16;
                if j >= tile.cols {
                    break;
                }
                let n = (tile.cols - j).min(16);
                let mask = (u32::MAX >> (32 - n)) as __mmask16;
                // SAFETY: `r < rows` and `j + n ≤ cols`: the masked lanes of
                // row `r` are readable and writable.
                unsafe {
                    let p = tile.c.add(r * tile.ldc + j);
                    let y = if accumulate { _mm512_add_ps(_mm512_maskz_loadu_ps(mask, p), x) } else { x };
                    _mm512_mask_storeu_ps(p, mask, y);
                }
            }
        }
    }

    /// The 32 bf16 values of `x`, as `vdpbf16ps` takes them (same bits).
    #[inline(always)]
    fn as_bh(x: __m512i) -> __m512bh {
        // SAFETY: both are plain 64-byte vectors; every bit pattern is a valid value of either.
        unsafe { std::mem::transmute::<__m512i, __m512bh>(x) }
    }

    /// `acc[r][q] = Σₚ x[r][p]·y[q][p]` over `k` values of each row, 32 at a
    /// time (the ragged end through masked loads, zeros past `k`), one
    /// 16-lane partial sum per pair.
    ///
    /// # Safety
    /// The CPU supports AVX-512F, BW and BF16; every `x[r]` and `y[q]` has `k` readable values.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn dot_depth<const MX: usize, const NY: usize>(
        k: usize,
        x: &[*const u16; MX],
        y: &[*const u16; NY],
    ) -> [[__m512; NY]; MX] {
        let mut acc = [[_mm512_setzero_ps(); NY]; MX];
        let mut p = 0;
        while p < k {
            let len = (k - p).min(32);
            let mask = (u64::MAX >> (64 - len)) as __mmask32;
            let mut yv = [_mm512_setzero_si512(); NY];
            for (v, &r) in yv.iter_mut().zip(y) {
                // SAFETY: `p + len ≤ k` values of the row are readable; masked lanes are not read.
                *v = unsafe { _mm512_maskz_loadu_epi16(mask, r.add(p).cast()) };
            }
            for (row, &xr) in acc.iter_mut().zip(x) {
                // SAFETY: as above.
                let xv = as_bh(unsafe { _mm512_maskz_loadu_epi16(mask, xr.add(p).cast()) });
                for (a, &v) in row.iter_mut().zip(&yv) {
                    *a = _mm512_dpbf16_ps(*a, xv, as_bh(v));
                }
            }
            p += len;
        }
        acc
    }

    /// Raw view of a [`super::dots`] call. Contract: `k ≥ 1`; rows `i < m`
    /// of `x` and `j < n` of `y` hold `k` values at `x + i·ldx` and
    /// `y + j·ldy`; `c` has `(m−1)·ldc + n` writable `f32`s with `n ≤ ldc`.
    pub(super) struct DotArgs {
        pub k: usize,
        pub x: *const u16,
        pub ldx: usize,
        pub y: *const u16,
        pub ldy: usize,
        pub m: usize,
        pub n: usize,
        pub c: *mut f32,
        pub ldc: usize,
    }

    /// Rows of `x` and of `y` per dot tile (`MX·NY` accumulators).
    const MX: usize = 4;
    const NY: usize = 6;

    /// `MX` rows of `x` by `NY` rows of `y` at a time, 32 values of depth per
    /// step, the ragged end through masked loads (zeros past `k`). Rows past
    /// the edge repeat the last one (their sums are dropped).
    ///
    /// # Safety
    /// The CPU supports AVX-512F, BW and BF16, and `args` meets its contract.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn dots(args: &DotArgs) {
        let mut j = 0;
        while j < args.n {
            let cols = (args.n - j).min(NY);
            let mut y = [args.y; NY];
            for (r, p) in y.iter_mut().enumerate() {
                // SAFETY: row `j + min(r, cols − 1) < n` of `y` (contract).
                *p = unsafe { args.y.add((j + r.min(cols - 1)) * args.ldy) };
            }
            let mut i = 0;
            while i < args.m {
                let rows = (args.m - i).min(MX);
                let mut x = [args.x; MX];
                for (r, p) in x.iter_mut().enumerate() {
                    // SAFETY: row `i + min(r, rows − 1) < m` of `x` (contract).
                    *p = unsafe { args.x.add((i + r.min(rows - 1)) * args.ldx) };
                }
                // SAFETY: rows of `x` and `y` hold `k` values (contract).
                let acc = unsafe { dot_depth::<MX, NY>(args.k, &x, &y) };
                for (r, row) in acc.iter().enumerate().take(rows) {
                    for (q, &a) in row.iter().enumerate().take(cols) {
                        // SAFETY: element `(i + r, j + q)` is inside `c` (`r < rows`, `q < cols`).
                        unsafe { *args.c.add((i + r) * args.ldc + j + q) = _mm512_reduce_add_ps(a) };
                    }
                }
                i += MX;
            }
            j += NY;
        }
    }

    /// Raw view of a [`super::scores`] call. Contract: `k ≥ 1`; rows `i < m`
    /// of `x` and `j < n` of `y` hold `k` values at `x + i·ldx` and
    /// `y + j·ldy`; row `i < m` of `c` has `n` rounded up to 16 writable
    /// `f32`s at `c + i·ldc`, not aliasing `x` or `y`.
    pub(super) struct ScoreArgs<'a> {
        pub k: usize,
        pub x: *const u16,
        pub ldx: usize,
        pub m: usize,
        pub y: *const u16,
        pub ldy: usize,
        pub n: usize,
        pub scale: f32,
        pub c: *mut f32,
        pub ldc: usize,
        pub ahead: &'a [u8],
    }

    /// Every tile of the scores: 4 rows at a time, then 2, then 1.
    ///
    /// # Safety
    /// The CPU supports AVX-512F, BW and BF16, and `args` meets its contract.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn scores(args: &ScoreArgs<'_>) {
        let mut i = 0;
        while i < args.m {
            // SAFETY: `i < m` (forwarded contract).
            i += unsafe {
                match args.m - i {
                    1 => score_tile::<1, 16>(args, i),
                    2 | 3 => score_tile::<2, 8>(args, i),
                    _ => score_tile::<4, 4>(args, i),
                }
            };
        }
    }

    /// Rows `i..i + MX` of the scores (rows past `m` repeat the last one,
    /// their sums dropped) against every key, `NY` keys at a time (keys past
    /// `n` repeat the last one; their sums land past `n`, inside the row's
    /// `n` rounded up to 16). `MX·NY = 16`. Returns `MX`.
    ///
    /// # Safety
    /// The CPU supports AVX-512F, BW and BF16, `args` meets its contract and `i < m`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn score_tile<const MX: usize, const NY: usize>(args: &ScoreArgs<'_>, i: usize) -> usize {
        use crate::simd::SimdF32;
        let Some(s) = crate::simd::Avx512::detect() else { return MX };
        let used = (args.m - i).min(MX);
        let mut x = [args.x; MX];
        for (r, ptr) in x.iter_mut().enumerate() {
            // SAFETY: row `i + min(r, used − 1) < m` of `x` (contract).
            *ptr = unsafe { args.x.add((i + r.min(used - 1)) * args.ldx) };
        }
        // The next keys' bytes, prefetched by the first row tile only, in
        // step with the keys.
        let per_key = if i == 0 { args.ahead.len().div_ceil(args.n) } else { 0 };
        let scale = _mm512_set1_ps(args.scale);
        let mut j = 0;
        while j < args.n {
            if per_key > 0 {
                let from = (j * per_key).min(args.ahead.len());
                let to = ((j + NY) * per_key).min(args.ahead.len());
                s.prefetch_bytes(args.ahead.get(from..to).unwrap_or_default());
            }
            let mut y = [args.y; NY];
            for (r, ptr) in y.iter_mut().enumerate() {
                // SAFETY: row `min(j + r, n − 1) < n` of `y` (contract).
                *ptr = unsafe { args.y.add((j + r).min(args.n - 1) * args.ldy) };
            }
            // SAFETY: rows of `x` and `y` hold `k` values (contract).
            let acc = unsafe { dot_depth::<MX, NY>(args.k, &x, &y) };
            let mut all = [_mm512_setzero_ps(); 16];
            for (dst, src) in all.chunks_exact_mut(NY).zip(&acc) {
                dst.copy_from_slice(src);
            }
            // Lane `r·NY + q` holds the dot product of row `i + r` and key `j + q`.
            let sums = _mm512_mul_ps(s.reduce_add16(all), scale);
            let mut out = [0.0f32; 16];
            // SAFETY: `out` holds 16 floats.
            unsafe { _mm512_storeu_ps(out.as_mut_ptr(), sums) };
            for (r, row) in out.chunks_exact(NY).take(used).enumerate() {
                // SAFETY: `j + NY ≤ n` rounded up to 16 (NY divides 16 and `j`
                // is a multiple of NY), inside row `i + r < m` of `c` (contract).
                unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), args.c.add((i + r) * args.ldc + j), NY) };
            }
            j += NY;
        }
        MX
    }

    /// Raw view of a [`super::weighted`] call. Contract: rows `i < m` of `p`
    /// hold `n` rounded up to even values at `p + i·ldp`; rows `j < n` of `v`
    /// hold `d` values at `v + j·ldv`; rows `i < m` of `o` have `d` readable
    /// and writable `f32`s at `o + i·ldo`, not aliasing `p` or `v`; `n, d ≥ 1`.
    pub(super) struct WeightArgs<'a> {
        pub n: usize,
        pub p: *const u16,
        pub ldp: usize,
        pub m: usize,
        pub v: *const u16,
        pub ldv: usize,
        pub d: usize,
        pub o: *mut f32,
        pub ldo: usize,
        pub ahead: &'a [u8],
    }

    /// Columns of `o` per weighted tile: two loads of 32 bf16 per value row.
    const WCOLS: usize = 64;

    /// Every tile of the weighted sum: 4 rows at a time, then 2, then 1,
    /// each across all columns in steps of [`WCOLS`].
    ///
    /// # Safety
    /// The CPU supports AVX-512F, BW and BF16, and `args` meets its contract.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn weighted(args: &WeightArgs<'_>) {
        let mut i = 0;
        while i < args.m {
            let rows = match args.m - i {
                1 => 1,
                2 | 3 => 2,
                _ => 4,
            };
            let mut c = 0;
            while c < args.d {
                // SAFETY: `i + rows ≤ m`, `c < d` (forwarded contract).
                unsafe {
                    match rows {
                        1 => weighted_tile::<1>(args, i, c),
                        2 => weighted_tile::<2>(args, i, c),
                        _ => weighted_tile::<4>(args, i, c),
                    }
                }
                c += WCOLS;
            }
            i += rows;
        }
    }

    /// Word `2q` of the result is word `q` of `a`, word `2q + 1` word `q`
    /// of `b`, for `q < 16` (`LO`) or `16 ≤ q < 32` (`HI`).
    const fn interleave(hi: bool) -> [i16; 32] {
        let mut idx = [0i16; 32];
        let mut q = 0;
        while q < 16 {
            let from = if hi { q + 16 } else { q } as i16;
            idx[2 * q] = from;
            idx[2 * q + 1] = from + 32;
            q += 1;
        }
        idx
    }
    const LO: [i16; 32] = interleave(false);
    const HI: [i16; 32] = interleave(true);

    /// Rows `i..i + MX` by columns `c..c + WCOLS` (clamped to `d`) over
    /// every key pair: the pair's two value rows interleaved into four
    /// vectors of 16 columns × 2 keys, each row's pair of weights broadcast,
    /// 4·MX `vdpbf16ps`.
    ///
    /// # Safety
    /// The CPU supports AVX-512F, BW and BF16, `args` meets its contract,
    /// `i + MX ≤ m` and `c < d`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn weighted_tile<const MX: usize>(args: &WeightArgs<'_>, i: usize, c: usize) {
        use crate::simd::SimdF32;
        let Some(s) = crate::simd::Avx512::detect() else { return };
        // SAFETY: the tables hold 32 words each.
        let (lo, hi) = unsafe { (_mm512_loadu_si512(LO.as_ptr().cast()), _mm512_loadu_si512(HI.as_ptr().cast())) };
        let cols = (args.d - c).min(WCOLS);
        let load_mask = |from: usize| -> __mmask32 {
            let len = cols.saturating_sub(from).min(32);
            if len == 0 { 0 } else { (u64::MAX >> (64 - len)) as __mmask32 }
        };
        let masks = [load_mask(0), load_mask(32)];
        let per_key = if i == 0 && c == 0 { args.ahead.len().div_ceil(args.n) } else { 0 };
        let mut acc = [[_mm512_setzero_ps(); 4]; MX];
        let mut j = 0;
        while j < args.n {
            if per_key > 0 {
                let from = (j * per_key).min(args.ahead.len());
                let to = ((j + 2) * per_key).min(args.ahead.len());
                s.prefetch_bytes(args.ahead.get(from..to).unwrap_or_default());
            }
            let mut vv = [_mm512_setzero_si512(); 4];
            for (h, &mask) in masks.iter().enumerate() {
                // SAFETY: row `j < n` of `v` holds `d ≥ c + 32·h + (loaded
                // lanes)` values; masked lanes are not read. Row `j + 1` only
                // when it exists (else zeros).
                let (a, b) = unsafe {
                    let row = args.v.add(j * args.ldv + c + 32 * h);
                    let a = _mm512_maskz_loadu_epi16(mask, row.cast());
                    let b = if j + 1 < args.n {
                        _mm512_maskz_loadu_epi16(mask, row.add(args.ldv).cast())
                    } else {
                        _mm512_setzero_si512()
                    };
                    (a, b)
                };
                vv[2 * h] = _mm512_permutex2var_epi16(a, lo, b);
                vv[2 * h + 1] = _mm512_permutex2var_epi16(a, hi, b);
            }
            for (r, row) in acc.iter_mut().enumerate() {
                // SAFETY: words `j, j + 1` of row `i + r < m` of `p` are
                // readable (`j + 1 <` n rounded up to even; contract).
                let w = unsafe { args.p.add((i + r) * args.ldp + j).cast::<u32>().read_unaligned() };
                let w = as_bh(_mm512_set1_epi32(w as i32));
                for (a, &v) in row.iter_mut().zip(&vv) {
                    *a = _mm512_dpbf16_ps(*a, w, as_bh(v));
                }
            }
            j += 2;
        }
        for (r, row) in acc.iter().enumerate() {
            for (q, &x) in row.iter().enumerate() {
                let from = 16 * q;
                let len = cols.saturating_sub(from).min(16);
                if len == 0 {
                    continue;
                }
                let mask = (u32::MAX >> (32 - len)) as __mmask16;
                // SAFETY: columns `c + from .. c + from + len ≤ d` of row
                // `i + r < m` of `o` are readable and writable (contract).
                unsafe {
                    let ptr = args.o.add((i + r) * args.ldo + c + from);
                    _mm512_mask_storeu_ps(ptr, mask, _mm512_add_ps(_mm512_maskz_loadu_ps(mask, ptr), x));
                }
            }
        }
    }
}
