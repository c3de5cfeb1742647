//! Register-tiled micro-kernels, one per ISA, and the loop over the tiles of
//! one packed block (the macro-kernel).
//!
//! This is the only module of the GEMM with `unsafe`: raw-pointer loads and
//! stores in the hot loop. [`block`] is the safe door: it checks every length
//! and that the CPU supports the ISA before entering the kernel.
//!
//! A tile is `MR` rows of `C` by `NV` vectors of columns. Each step of the
//! inner loop loads `NV` vectors of a packed row of `B`, broadcasts `MR`
//! values of a packed column of `A` and issues `MR·NV` fused multiply-adds
//! into accumulators that stay in registers for the whole depth of the block.

use crate::isa::Isa;

/// Shape of a register tile: rows of `C` (broadcast from packed `A`) by
/// columns of `C` (vector loads from packed `B`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tile {
    /// Rows of one tile: the height of a packed `A` panel.
    pub mr: usize,
    /// Columns of one tile: the width of a packed `B` panel.
    pub nr: usize,
}

/// AVX-512: 14 rows by 2 vectors (32 columns): 28 accumulators of 32 registers.
const AVX512_MR: usize = 14;
const AVX512_NV: usize = 2;
/// AVX2+FMA: 6 rows by 2 vectors (16 columns): 12 accumulators of 16 registers.
const AVX2_MR: usize = 6;
const AVX2_NV: usize = 2;
/// Portable `wide::f32x8`: aarch64 has 32 NEON registers (an `f32x8` takes
/// two), SSE2 has 16.
#[cfg(target_arch = "aarch64")]
const PORTABLE_MR: usize = 6;
#[cfg(target_arch = "aarch64")]
const PORTABLE_NV: usize = 2;
#[cfg(not(target_arch = "aarch64"))]
const PORTABLE_MR: usize = 4;
#[cfg(not(target_arch = "aarch64"))]
const PORTABLE_NV: usize = 1;

/// The tile shape the kernel of `isa` uses (`Neon` and `Portable` share the
/// `wide` kernel; an ISA this build cannot run maps to it too). Costs nothing.
pub(crate) fn tile(isa: Isa) -> Tile {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => Tile { mr: AVX512_MR, nr: AVX512_NV * 16 },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => Tile { mr: AVX2_MR, nr: AVX2_NV * 8 },
        _ => Tile { mr: PORTABLE_MR, nr: PORTABLE_NV * 8 },
    }
}

/// One packed block of the product, as the macro-kernel sees it.
pub(crate) struct Block<'a> {
    /// Depth of the block (columns of the `A` panels, rows of the `B` panels).
    pub kc: usize,
    /// Rows of `C` the block covers.
    pub mc: usize,
    /// Columns of `C` the block covers.
    pub nc: usize,
    /// `⌈mc/mr⌉` panels of `mr×kc`, each stored depth-major (`mr` values per depth step).
    pub a: &'a [f32],
    /// `⌈nc/nr⌉` panels of `kc×nr`, each stored depth-major (`nr` values per depth step).
    pub b: &'a [f32],
    /// Add to `C` (`true`) or overwrite it (`false`).
    pub accumulate: bool,
}

/// `C[..mc, ..nc] (+)= A·B` for one packed block; `c` starts at the block's
/// first element and has row stride `ldc`. Costs `2·mc·nc·kc` FLOPs (rounded
/// up to whole tiles). Does nothing if a length is inconsistent or the CPU
/// lacks `isa` (the caller guarantees neither happens).
pub(crate) fn block(isa: Isa, blk: &Block<'_>, c: &mut [f32], ldc: usize) {
    let t = tile(isa);
    let (kc, mc, nc) = (blk.kc, blk.mc, blk.nc);
    if kc == 0 || mc == 0 || nc == 0 {
        return;
    }
    let a_need = mc.div_ceil(t.mr).saturating_mul(t.mr).saturating_mul(kc);
    let b_need = nc.div_ceil(t.nr).saturating_mul(t.nr).saturating_mul(kc);
    let c_need = (mc - 1).saturating_mul(ldc).saturating_add(nc);
    let ok = blk.a.len() >= a_need && blk.b.len() >= b_need && nc <= ldc && c.len() >= c_need && isa.is_supported();
    debug_assert!(ok, "gemm block with inconsistent lengths");
    if !ok {
        return;
    }
    let args = Args {
        kc,
        mc,
        nc,
        a: blk.a.as_ptr(),
        b: blk.b.as_ptr(),
        c: c.as_mut_ptr(),
        ldc,
        accumulate: blk.accumulate,
    };
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `isa.is_supported()` was checked above (AVX-512F present), and
        // the lengths checked above are the contract of `Args`.
        Isa::Avx512 => unsafe { block_avx512(&args) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, with AVX2 and FMA present.
        Isa::Avx2 => unsafe { block_avx2(&args) },
        // SAFETY: the portable kernel needs no CPU feature; lengths checked above.
        _ => unsafe { block_impl::<Wide, PORTABLE_MR, PORTABLE_NV>(&args) },
    }
}

/// Raw view of a block. Contract: `a` holds `⌈mc/MR⌉·MR·kc` values, `b` holds
/// `⌈nc/NR⌉·NR·kc`, and `c` has `(mc−1)·ldc + nc` writable values with `nc ≤ ldc`.
struct Args {
    kc: usize,
    mc: usize,
    nc: usize,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
/// # Safety
/// The CPU supports AVX-512F and `args` meets its contract.
unsafe fn block_avx512(args: &Args) {
    // SAFETY: forwarded contract; AVX-512F is enabled for this function.
    unsafe { block_impl::<x86::Zmm, AVX512_MR, AVX512_NV>(args) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
/// # Safety
/// The CPU supports AVX2 and FMA and `args` meets its contract.
unsafe fn block_avx2(args: &Args) {
    // SAFETY: forwarded contract; AVX2 and FMA are enabled for this function.
    unsafe { block_impl::<x86::Ymm, AVX2_MR, AVX2_NV>(args) }
}

/// The macro-kernel: every tile of the block, columns innermost so the `A`
/// panel (`MR·kc` values) stays in L1 while `B` panels stream from L2.
///
/// # Safety
/// `args` meets its contract with `MR` and `NR = NV·V::N`, and the CPU
/// supports the instructions behind `V`.
#[inline(always)]
unsafe fn block_impl<V: Lanes, const MR: usize, const NV: usize>(args: &Args) {
    let nr = NV * V::N;
    let mut i = 0;
    while i < args.mc {
        let rows = (args.mc - i).min(MR);
        let mut j = 0;
        while j < args.nc {
            let cols = (args.nc - j).min(nr);
            // SAFETY: panel `i/MR` of A starts at `i·kc` and panel `j/nr` of B at
            // `j·kc`, both inside the lengths of the contract; the tile of C at
            // `i·ldc + j` has `rows ≤ mc − i` rows and `cols ≤ nc − j` columns.
            unsafe {
                let tile = TilePtr { c: args.c.add(i * args.ldc + j), ldc: args.ldc, rows, cols };
                micro::<V, MR, NV>(args.kc, args.a.add(i * args.kc), args.b.add(j * args.kc), &tile, args.accumulate);
            }
            j += nr;
        }
        i += MR;
    }
}

/// Where one tile of `C` goes: `rows × cols` values at `c`, row stride `ldc`.
struct TilePtr {
    c: *mut f32,
    ldc: usize,
    rows: usize,
    cols: usize,
}

/// One register tile: `C (+)= Apanel·Bpanel` over depth `kc`.
///
/// # Safety
/// `a` holds `MR·kc` values, `b` holds `NV·V::N·kc`, `tile` describes
/// writable memory with `rows ≤ MR`, `cols ≤ NV·V::N`, and the CPU supports `V`.
#[inline(always)]
unsafe fn micro<V: Lanes, const MR: usize, const NV: usize>(
    kc: usize,
    a: *const f32,
    b: *const f32,
    tile: &TilePtr,
    accumulate: bool,
) {
    // SAFETY: the CPU supports `V` (contract).
    let zero = unsafe { V::zero() };
    let mut acc = [[zero; NV]; MR];
    let mut a = a;
    let mut b = b;
    for _ in 0..kc {
        let mut bv = [zero; NV];
        for (v, x) in bv.iter_mut().enumerate() {
            // SAFETY: `b` points at one depth step of `NV·V::N` values.
            *x = unsafe { V::load(b.add(v * V::N)) };
        }
        for (r, row) in acc.iter_mut().enumerate() {
            // SAFETY: `a` points at one depth step of `MR` values and `r < MR`.
            let s = unsafe { V::splat(*a.add(r)) };
            for (x, &y) in row.iter_mut().zip(&bv) {
                // SAFETY: the CPU supports `V` (contract).
                *x = unsafe { V::fma(s, y, *x) };
            }
        }
        // SAFETY: stays within (or one past) the panels of the contract.
        unsafe {
            a = a.add(MR);
            b = b.add(NV * V::N);
        }
    }
    for (r, row) in acc.iter().enumerate().take(tile.rows) {
        // SAFETY: `r < rows`, so row `r` of the tile is writable for `cols` values.
        let cr = unsafe { tile.c.add(r * tile.ldc) };
        for (v, &x) in row.iter().enumerate() {
            let j = v * V::N;
            if j >= tile.cols {
                break;
            }
            let n = (tile.cols - j).min(V::N);
            // SAFETY: `j + n ≤ cols` values of row `r` are readable and writable.
            unsafe {
                let p = cr.add(j);
                if n == V::N {
                    let y = if accumulate { V::add(V::load(p), x) } else { x };
                    V::store(p, y);
                } else {
                    let y = if accumulate { V::add(V::load_part(p, n), x) } else { x };
                    V::store_part(p, y, n);
                }
            }
        }
    }
}

/// A SIMD vector of `N` f32 lanes. Every method is unsafe: the CPU must
/// support the instructions, and pointers must be valid for the lanes used.
trait Lanes: Copy {
    /// Lanes per vector.
    const N: usize;
    /// All lanes zero.
    unsafe fn zero() -> Self;
    /// All lanes `x`.
    unsafe fn splat(x: f32) -> Self;
    /// `N` values from `p` (unaligned).
    unsafe fn load(p: *const f32) -> Self;
    /// `N` values to `p` (unaligned).
    unsafe fn store(p: *mut f32, v: Self);
    /// `a·b + c`, fused where the ISA has it.
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self;
    /// `a + b`.
    unsafe fn add(a: Self, b: Self) -> Self;
    /// The first `n < N` values from `p`, the rest zero; reads only `n` values.
    #[inline(always)]
    unsafe fn load_part(p: *const f32, n: usize) -> Self {
        let mut buf = [0.0f32; 16];
        // SAFETY: `p` is readable for `n < N ≤ 16` values (caller).
        unsafe {
            std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), n.min(16));
            Self::load(buf.as_ptr())
        }
    }
    /// The first `n < N` lanes of `v` to `p`; writes only `n` values.
    #[inline(always)]
    unsafe fn store_part(p: *mut f32, v: Self, n: usize) {
        let mut buf = [0.0f32; 16];
        // SAFETY: `buf` holds 16 ≥ N values; `p` is writable for `n < N` values (caller).
        unsafe {
            Self::store(buf.as_mut_ptr(), v);
            std::ptr::copy_nonoverlapping(buf.as_ptr(), p, n.min(16));
        }
    }
}

/// The portable vector: `wide::f32x8` (SSE2 pairs on x86-64, NEON pairs on aarch64).
#[derive(Clone, Copy)]
struct Wide(wide::f32x8);

impl Lanes for Wide {
    const N: usize = 8;
    #[inline(always)]
    unsafe fn zero() -> Self {
        Wide(wide::f32x8::ZERO)
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        Wide(wide::f32x8::splat(x))
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        // SAFETY: `p` is readable for 8 values (caller); `read_unaligned` needs no alignment.
        Wide(wide::f32x8::from(unsafe { p.cast::<[f32; 8]>().read_unaligned() }))
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: Self) {
        // SAFETY: `p` is writable for 8 values (caller).
        unsafe { p.cast::<[f32; 8]>().write_unaligned(v.0.to_array()) }
    }
    #[inline(always)]
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
        Wide(a.0.mul_add(b.0, c.0))
    }
    #[inline(always)]
    unsafe fn add(a: Self, b: Self) -> Self {
        Wide(a.0 + b.0)
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! AVX-512 and AVX2 vectors. Callers run inside `#[target_feature]`
    //! functions that enable the features, so the intrinsics inline.
    use super::Lanes;
    use std::arch::x86_64::*;

    /// 16 lanes in a `zmm` register (AVX-512F).
    #[derive(Clone, Copy)]
    pub(super) struct Zmm(__m512);

    impl Lanes for Zmm {
        const N: usize = 16;
        #[inline(always)]
        unsafe fn zero() -> Self {
            // SAFETY: AVX-512F is supported (trait contract).
            Zmm(unsafe { _mm512_setzero_ps() })
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> Self {
            // SAFETY: AVX-512F is supported (trait contract).
            Zmm(unsafe { _mm512_set1_ps(x) })
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            // SAFETY: AVX-512F is supported and `p` is readable for 16 values (trait contract).
            Zmm(unsafe { _mm512_loadu_ps(p) })
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: Self) {
            // SAFETY: AVX-512F is supported and `p` is writable for 16 values (trait contract).
            unsafe { _mm512_storeu_ps(p, v.0) }
        }
        #[inline(always)]
        unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
            // SAFETY: AVX-512F is supported (trait contract).
            Zmm(unsafe { _mm512_fmadd_ps(a.0, b.0, c.0) })
        }
        #[inline(always)]
        unsafe fn add(a: Self, b: Self) -> Self {
            // SAFETY: AVX-512F is supported (trait contract).
            Zmm(unsafe { _mm512_add_ps(a.0, b.0) })
        }
        #[inline(always)]
        unsafe fn load_part(p: *const f32, n: usize) -> Self {
            let mask = ((1u32 << n.min(16)) - 1) as __mmask16;
            // SAFETY: a masked load touches only the `n` lanes that are readable (trait contract).
            Zmm(unsafe { _mm512_maskz_loadu_ps(mask, p) })
        }
        #[inline(always)]
        unsafe fn store_part(p: *mut f32, v: Self, n: usize) {
            let mask = ((1u32 << n.min(16)) - 1) as __mmask16;
            // SAFETY: a masked store touches only the `n` lanes that are writable (trait contract).
            unsafe { _mm512_mask_storeu_ps(p, mask, v.0) }
        }
    }

    /// 8 lanes in a `ymm` register (AVX2 + FMA).
    #[derive(Clone, Copy)]
    pub(super) struct Ymm(__m256);

    impl Lanes for Ymm {
        const N: usize = 8;
        #[inline(always)]
        unsafe fn zero() -> Self {
            // SAFETY: AVX is supported (trait contract).
            Ymm(unsafe { _mm256_setzero_ps() })
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> Self {
            // SAFETY: AVX is supported (trait contract).
            Ymm(unsafe { _mm256_set1_ps(x) })
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            // SAFETY: AVX is supported and `p` is readable for 8 values (trait contract).
            Ymm(unsafe { _mm256_loadu_ps(p) })
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: Self) {
            // SAFETY: AVX is supported and `p` is writable for 8 values (trait contract).
            unsafe { _mm256_storeu_ps(p, v.0) }
        }
        #[inline(always)]
        unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
            // SAFETY: FMA is supported (trait contract).
            Ymm(unsafe { _mm256_fmadd_ps(a.0, b.0, c.0) })
        }
        #[inline(always)]
        unsafe fn add(a: Self, b: Self) -> Self {
            // SAFETY: AVX is supported (trait contract).
            Ymm(unsafe { _mm256_add_ps(a.0, b.0) })
        }
    }
}
