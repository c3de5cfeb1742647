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
                let mut acc = [[_mm512_setzero_ps(); NY]; MX];
                let mut p = 0;
                while p < args.k {
                    let len = (args.k - p).min(32);
                    let mask = (u64::MAX >> (64 - len)) as __mmask32;
                    let mut yv = [_mm512_setzero_si512(); NY];
                    for (v, &r) in yv.iter_mut().zip(&y) {
                        // SAFETY: `p + len ≤ k` values of the row are readable; masked lanes are not read.
                        *v = unsafe { _mm512_maskz_loadu_epi16(mask, r.add(p).cast()) };
                    }
                    for (row, &xr) in acc.iter_mut().zip(&x) {
                        // SAFETY: as above.
                        let xv = as_bh(unsafe { _mm512_maskz_loadu_epi16(mask, xr.add(p).cast()) });
                        for (a, &v) in row.iter_mut().zip(&yv) {
                            *a = _mm512_dpbf16_ps(*a, xv, as_bh(v));
                        }
                    }
                    p += len;
                }
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
}
