//! Register-tiled micro-kernels, one per ISA, the loop over the tiles of one
//! block (the macro-kernel), and [`MatMut`], the view of `C` that threads split.
//!
//! This is the only module of the GEMM with `unsafe`: raw-pointer loads and
//! stores in the hot loop, and the disjoint sub-views of `C`. [`block`] is the
//! safe door: it checks every length, and that the CPU supports the ISA,
//! before entering a kernel.
//!
//! A tile is `MR` rows of `C` by `NV` vectors of columns. Each step of the
//! inner loop loads `NV` vectors of a packed row of `B`, broadcasts `MR`
//! values of a column of `A` (packed, or read in place when `A` is row-major)
//! and issues `MR·NV` fused multiply-adds into accumulators that stay in
//! registers for the whole depth of the block.

use std::marker::PhantomData;

use crate::isa::Isa;

/// Shape of a register tile: rows of `C` (broadcast from `A`) by columns of
/// `C` (vector loads from packed `B`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tile {
    /// Rows of one tile: the height of a packed `A` panel.
    pub mr: usize,
    /// Columns of one tile: the width of a packed `B` panel.
    pub nr: usize,
}

/// AVX-512: 6 rows by 4 vectors (64 columns): 24 accumulators of 32 registers.
#[cfg(target_arch = "x86_64")]
const AVX512_MR: usize = 6;
#[cfg(target_arch = "x86_64")]
const AVX512_NV: usize = 4;
/// How many depth steps ahead the kernel prefetches a `B` read in place.
const PREFETCH_STEPS: usize = 8;
/// AVX2+FMA: 6 rows by 2 vectors (16 columns): 12 accumulators of 16 registers.
#[cfg(target_arch = "x86_64")]
const AVX2_MR: usize = 6;
#[cfg(target_arch = "x86_64")]
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

/// A mutable view of a row-major `rows × cols` region with row stride `ld`,
/// borrowed from a slice. Views made by the `split_*` methods are disjoint,
/// so they can be written from different threads. Invariant: when `rows` and
/// `cols` are not zero, `(rows−1)·ld + cols` values from `ptr` are borrowed
/// and `cols ≤ ld`.
pub(crate) struct MatMut<'a> {
    ptr: *mut f32,
    rows: usize,
    cols: usize,
    ld: usize,
    _borrow: PhantomData<&'a mut [f32]>,
}

// SAFETY: a `MatMut` is a unique borrow of the elements it views (disjoint
// from every other live view), like `&mut [f32]`, which is `Send`.
unsafe impl Send for MatMut<'_> {}

impl<'a> MatMut<'a> {
    /// A view of `c` as `rows × cols` with row stride `ld`; `None` if `c` is
    /// too short or `cols > ld`.
    pub(crate) fn new(c: &'a mut [f32], rows: usize, cols: usize, ld: usize) -> Option<Self> {
        let need = if rows == 0 || cols == 0 { 0 } else { (rows - 1).checked_mul(ld)?.checked_add(cols)? };
        (cols <= ld && need <= c.len()).then_some(MatMut { ptr: c.as_mut_ptr(), rows, cols, ld, _borrow: PhantomData })
    }

    /// Rows of the view.
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    /// Columns of the view.
    pub(crate) fn cols(&self) -> usize {
        self.cols
    }

    /// The first element and the row stride, for a kernel that writes the
    /// view through raw pointers (within the invariant above).
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn raw(&mut self) -> (*mut f32, usize) {
        (self.ptr, self.ld)
    }

    /// Splits into columns `..j` and `j..` (`j` clamped to the width).
    pub(crate) fn split_cols(self, j: usize) -> (MatMut<'a>, MatMut<'a>) {
        let j = j.min(self.cols);
        let right = MatMut {
            // Inside the first row (or one past it) whenever the view is not empty.
            ptr: self.ptr.wrapping_add(j),
            rows: self.rows,
            cols: self.cols - j,
            ld: self.ld,
            _borrow: PhantomData,
        };
        (MatMut { cols: j, ..self }, right)
    }

    /// Splits into rows `..i` and `i..` (`i` clamped to the height).
    pub(crate) fn split_rows(self, i: usize) -> (MatMut<'a>, MatMut<'a>) {
        let i = i.min(self.rows);
        // Row `i` starts inside the viewed memory whenever the lower view is not empty.
        let lower = MatMut { ptr: self.ptr.wrapping_add(i * self.ld), rows: self.rows - i, ..self };
        (MatMut { rows: i, ..self }, lower)
    }

    /// Row `i` of the view as a slice of its `cols` values (empty past the
    /// last row). Free.
    pub(crate) fn row_mut(&mut self, i: usize) -> &mut [f32] {
        if i >= self.rows || self.cols == 0 {
            return &mut [];
        }
        // SAFETY: by the invariant, `(rows−1)·ld + cols` values from `ptr` are
        // borrowed by this view alone; row `i < rows` is the `cols` values from
        // `ptr + i·ld`, inside that range, and the returned slice borrows `self`
        // mutably, so no other access through this view overlaps it.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(i * self.ld), self.cols) }
    }

    /// Reborrows the block at `(i, j)` of at most `rows × cols` (clamped to the view).
    pub(crate) fn block(&mut self, i: usize, j: usize, rows: usize, cols: usize) -> MatMut<'_> {
        let (i, j) = (i.min(self.rows), j.min(self.cols));
        let (rows, cols) = (rows.min(self.rows - i), cols.min(self.cols - j));
        // Inside this view whenever the block is not empty.
        let ptr = self.ptr.wrapping_add(i * self.ld + j);
        MatMut { ptr, rows, cols, ld: self.ld, _borrow: PhantomData }
    }
}

/// Where the macro-kernel reads `A` from.
#[derive(Clone, Copy)]
pub(crate) enum PanelsA<'a> {
    /// Packed: `⌈mc/mr⌉` panels of `kc` steps of `mr` values.
    Packed(&'a [f32]),
    /// In place, row-major: element `(i, p)` of the block at `a[i·lda + p]`.
    Rows {
        /// Values from the block's first element on.
        a: &'a [f32],
        /// Row stride of `A`.
        lda: usize,
    },
}

impl<'a> PanelsA<'a> {
    /// The same `A` without its first `i` rows, for a block of depth `kc`
    /// (for packed panels `i` must be a multiple of the tile's rows). Free.
    pub(crate) fn skip_rows(self, i: usize, kc: usize) -> PanelsA<'a> {
        match self {
            PanelsA::Packed(a) => PanelsA::Packed(a.get(i * kc..).unwrap_or_default()),
            PanelsA::Rows { a, lda } => PanelsA::Rows { a: a.get(i * lda..).unwrap_or_default(), lda },
        }
    }
}

/// Where the macro-kernel reads `B` from.
#[derive(Clone, Copy)]
pub(crate) enum PanelsB<'a> {
    /// Packed: `⌈nc/nr⌉` panels of `kc` steps of `nr` values.
    Packed(&'a [f32]),
    /// In place, row-major: element `(p, j)` of the block at `b[p·ldb + j]`;
    /// `nc` must then be a whole number of panels (the caller packs the rest).
    Rows {
        /// Values from the block's first element on.
        b: &'a [f32],
        /// Row stride of `B`.
        ldb: usize,
    },
}

/// One block of the product, as the macro-kernel sees it.
pub(crate) struct Block<'a> {
    /// Depth of the block.
    pub kc: usize,
    /// The `mc × kc` block of `op(A)` (`mc` = rows of the output view).
    pub a: PanelsA<'a>,
    /// The `kc × nc` block of `op(B)` (`nc` = columns of the output view).
    pub b: PanelsB<'a>,
    /// Add to `C` (`true`) or overwrite it (`false`).
    pub accumulate: bool,
}

/// `C (+)= A·B` for one block into the view `c`. Costs `2·mc·nc·kc` FLOPs
/// (rounded up to whole tiles; a one-row block uses a one-row kernel). Does
/// nothing if a length is inconsistent or the CPU lacks `isa` (the caller
/// guarantees neither happens).
pub(crate) fn block(isa: Isa, blk: &Block<'_>, c: &mut MatMut<'_>) {
    let t = tile(isa);
    let (kc, mc, nc) = (blk.kc, c.rows, c.cols);
    if kc == 0 || mc == 0 || nc == 0 {
        return;
    }
    let (a_ok, a, lda, a_packed) = match blk.a {
        PanelsA::Packed(a) => (a.len() >= mc.div_ceil(t.mr).saturating_mul(t.mr).saturating_mul(kc), a, 0, true),
        PanelsA::Rows { a, lda } => {
            (kc <= lda && a.len() >= (mc - 1).saturating_mul(lda).saturating_add(kc), a, lda, false)
        }
    };
    let panels = nc.div_ceil(t.nr).saturating_mul(t.nr);
    let (b_ok, b, b_step, b_packed) = match blk.b {
        PanelsB::Packed(b) => (b.len() >= panels.saturating_mul(kc), b, t.nr, true),
        PanelsB::Rows { b, ldb } => {
            let need = (kc - 1).saturating_mul(ldb).saturating_add(nc);
            (nc.is_multiple_of(t.nr) && nc <= ldb && b.len() >= need, b, ldb, false)
        }
    };
    let ok = a_ok && b_ok && isa.is_supported();
    debug_assert!(ok, "gemm block with inconsistent lengths");
    if !ok {
        return;
    }
    let args = Args {
        kc,
        mc,
        nc,
        a: a.as_ptr(),
        lda,
        b: b.as_ptr(),
        b_step,
        b_packed,
        c: c.ptr,
        ldc: c.ld,
        accumulate: blk.accumulate,
    };
    // A single row (a vector-matrix product) runs on one-row tiles: the full
    // tile would spend `mr` times the FMAs on copies of that row.
    let thin = mc == 1 && !a_packed;
    match (isa, a_packed, thin) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `isa.is_supported()` was checked above (AVX-512F present), and
        // the lengths checked above are the contract of `Args`.
        (Isa::Avx512, true, _) => unsafe { block_avx512::<AVX512_MR, true>(&args) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        (Isa::Avx512, false, false) => unsafe { block_avx512::<AVX512_MR, false>(&args) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above (one row: `mc = 1 ≤ MR`).
        (Isa::Avx512, false, true) => unsafe { block_avx512::<1, false>(&args) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, with AVX2 and FMA present.
        (Isa::Avx2, true, _) => unsafe { block_avx2::<AVX2_MR, true>(&args) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, with AVX2 and FMA present.
        (Isa::Avx2, false, false) => unsafe { block_avx2::<AVX2_MR, false>(&args) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, with AVX2 and FMA present.
        (Isa::Avx2, false, true) => unsafe { block_avx2::<1, false>(&args) },
        // SAFETY: the portable kernel needs no CPU feature; lengths checked above.
        (_, true, _) => unsafe { block_impl::<Wide, PORTABLE_MR, PORTABLE_NV, true>(&args) },
        // SAFETY: as above.
        (_, false, false) => unsafe { block_impl::<Wide, PORTABLE_MR, PORTABLE_NV, false>(&args) },
        // SAFETY: as above.
        (_, false, true) => unsafe { block_impl::<Wide, 1, PORTABLE_NV, false>(&args) },
    }
}

/// `C[i][j] = Σₚ x[i·ldx + p]·y[j·ldy + p]` over depth `k`, for every
/// element of the view `c` (rows of `C` = rows of `x`, columns = rows of `y`):
/// dot products of rows, both contiguous along the depth, with no packing (a
/// product with a transposed `B` and few rows). Costs `2·rows·cols·k` FLOPs
/// plus a horizontal sum per element. Does nothing if a length is
/// inconsistent or the CPU lacks `isa`.
pub(crate) fn dots(isa: Isa, k: usize, (x, ldx): (&[f32], usize), (y, ldy): (&[f32], usize), c: &mut MatMut<'_>) {
    let (m, n) = (c.rows, c.cols);
    if m == 0 || n == 0 {
        return;
    }
    let fits =
        |v: &[f32], ld: usize, rows: usize| k <= ld && v.len() >= (rows - 1).saturating_mul(ld).saturating_add(k);
    let ok = k > 0 && fits(x, ldx, m) && fits(y, ldy, n) && isa.is_supported();
    debug_assert!(ok, "gemm dots with inconsistent lengths");
    if !ok {
        return;
    }
    let args = DotArgs { k, x: x.as_ptr(), ldx, y: y.as_ptr(), ldy, m, n, c: c.ptr, ldc: c.ld };
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX-512F present (checked above); lengths checked above are the contract of `DotArgs`.
        Isa::Avx512 => unsafe { dots_avx512(&args) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2 and FMA present (checked above); lengths as above.
        Isa::Avx2 => unsafe { dots_avx2(&args) },
        // SAFETY: no CPU feature needed; lengths as above.
        _ => unsafe { dots_impl::<Wide, 2, 2>(&args) },
    }
}

/// Raw view of a [`dots`] call. Contract: `k ≥ 1`; rows `i < m` of `x` and
/// `j < n` of `y` hold `k` values at `x + i·ldx` and `y + j·ldy`; `c` has
/// `(m−1)·ldc + n` writable values with `n ≤ ldc`, not aliasing `x` or `y`.
struct DotArgs {
    k: usize,
    x: *const f32,
    ldx: usize,
    y: *const f32,
    ldy: usize,
    m: usize,
    n: usize,
    c: *mut f32,
    ldc: usize,
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
/// # Safety
/// The CPU supports AVX-512F and `args` meets its contract.
unsafe fn dots_avx512(args: &DotArgs) {
    // SAFETY: forwarded contract; AVX-512F is enabled for this function.
    unsafe { dots_impl::<x86::Zmm, 4, 6>(args) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
/// # Safety
/// The CPU supports AVX2 and FMA and `args` meets its contract.
unsafe fn dots_avx2(args: &DotArgs) {
    // SAFETY: forwarded contract; AVX2 and FMA are enabled for this function.
    unsafe { dots_impl::<x86::Ymm, 2, 4>(args) }
}

/// `MX` rows of `x` by `NY` rows of `y` at a time (`MX·NY` accumulators),
/// vectors along the depth, the ragged end of the depth through partial
/// loads. Rows past the edge repeat the last one (their sums are dropped).
///
/// # Safety
/// `args` meets its contract and the CPU supports `V`.
#[inline(always)]
unsafe fn dots_impl<V: Lanes, const MX: usize, const NY: usize>(args: &DotArgs) {
    let full = args.k / V::N * V::N;
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
            // SAFETY: the CPU supports `V` (contract).
            let mut acc = [[unsafe { V::zero() }; NY]; MX];
            let mut p = 0;
            while p < full {
                // SAFETY: `p + N ≤ k`, inside every row of `x` and `y`.
                unsafe { dot_step::<V, MX, NY>(&mut acc, &x, &y, p, V::N) };
                p += V::N;
            }
            if p < args.k {
                // SAFETY: `k − p < N` values from `p` remain in every row.
                unsafe { dot_step::<V, MX, NY>(&mut acc, &x, &y, p, args.k - p) };
            }
            for (r, row) in acc.iter().enumerate().take(rows) {
                for (q, &a) in row.iter().enumerate().take(cols) {
                    // SAFETY: element `(i + r, j + q)` is inside `c` (`r < rows`, `q < cols`).
                    unsafe { *args.c.add((i + r) * args.ldc + j + q) = V::sum(a) };
                }
            }
            i += MX;
        }
        j += NY;
    }
}

/// One vector step of [`dots_impl`]: `len ≤ N` values from offset `p` of every row.
///
/// # Safety
/// Every row pointer is readable for `p + len` values and the CPU supports `V`.
#[inline(always)]
unsafe fn dot_step<V: Lanes, const MX: usize, const NY: usize>(
    acc: &mut [[V; NY]; MX],
    x: &[*const f32; MX],
    y: &[*const f32; NY],
    p: usize,
    len: usize,
) {
    // No closures here: the intrinsics must inline straight into the
    // `#[target_feature]` caller.
    // SAFETY: the CPU supports `V` (caller).
    let mut yv = [unsafe { V::zero() }; NY];
    for (v, &r) in yv.iter_mut().zip(y) {
        // SAFETY: `len` values from `p` are readable in every row (caller).
        *v = unsafe { load_len::<V>(r.add(p), len) };
    }
    for (row, &xr) in acc.iter_mut().zip(x) {
        // SAFETY: as above.
        let xv = unsafe { load_len::<V>(xr.add(p), len) };
        for (a, &v) in row.iter_mut().zip(&yv) {
            // SAFETY: the CPU supports `V` (caller).
            *a = unsafe { V::fma(xv, v, *a) };
        }
    }
}

/// `len ≤ N` values from `p`, zero past `len`.
///
/// # Safety
/// `p` is readable for `len` values and the CPU supports `V`.
#[inline(always)]
unsafe fn load_len<V: Lanes>(p: *const f32, len: usize) -> V {
    // SAFETY: forwarded contract.
    unsafe { if len == V::N { V::load(p) } else { V::load_part(p, len) } }
}

/// Side of the square blocks [`transpose`] handles on `isa` (0: none, the
/// caller transposes in scalar code).
pub(crate) fn transpose_size(isa: Isa) -> usize {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => 16,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => 8,
        _ => 0,
    }
}

/// `dst[c·ldd + r] = src[r·ld + c]` for the `s × s` block, `s =`
/// [`transpose_size`]`(isa)`, in SIMD registers. Returns `false` (and writes
/// nothing) when `isa` has no such transpose, the CPU lacks it, or a slice is
/// too short. Costs `s` loads, `s` stores and about `4·s` shuffles.
pub(crate) fn transpose(isa: Isa, src: &[f32], ld: usize, dst: &mut [f32], ldd: usize) -> bool {
    let s = transpose_size(isa);
    let fits =
        |len: usize, stride: usize| s > 0 && stride >= s && len >= (s - 1).saturating_mul(stride).saturating_add(s);
    if !(fits(src.len(), ld) && fits(dst.len(), ldd) && isa.is_supported()) {
        return false;
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => {
            // SAFETY: AVX-512F present and both 16×16 blocks inside their slices (checked above).
            unsafe { x86::transpose16(src.as_ptr(), ld, dst.as_mut_ptr(), ldd) };
            true
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => {
            // SAFETY: AVX present and both 8×8 blocks inside their slices (checked above).
            unsafe { x86::transpose8(src.as_ptr(), ld, dst.as_mut_ptr(), ldd) };
            true
        }
        _ => false,
    }
}

/// Raw view of a block. Contract: `b` holds `⌈nc/NR⌉·NR·kc` packed values
/// (`b_packed`, `b_step = NR`), or (in place, `b_step` = row stride ≥ `nc`, `nc` a multiple
/// of `NR`) `(kc−1)·b_step + nc` values; `a` holds
/// `⌈mc/MR⌉·MR·kc` packed values, or (in place) `(mc−1)·lda + kc` values with
/// `kc ≤ lda`; `c` has `(mc−1)·ldc + nc` writable values with `nc ≤ ldc`,
/// not aliasing `a` or `b`.
struct Args {
    kc: usize,
    mc: usize,
    nc: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    b_step: usize,
    b_packed: bool,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
/// # Safety
/// The CPU supports AVX-512F and `args` meets its contract.
unsafe fn block_avx512<const MR: usize, const PACKED: bool>(args: &Args) {
    // SAFETY: forwarded contract; AVX-512F is enabled for this function.
    unsafe { block_impl::<x86::Zmm, MR, AVX512_NV, PACKED>(args) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
/// # Safety
/// The CPU supports AVX2 and FMA and `args` meets its contract.
unsafe fn block_avx2<const MR: usize, const PACKED: bool>(args: &Args) {
    // SAFETY: forwarded contract; AVX2 and FMA are enabled for this function.
    unsafe { block_impl::<x86::Ymm, MR, AVX2_NV, PACKED>(args) }
}

/// The macro-kernel: every tile of the block, columns innermost so the `A`
/// rows of a tile (`MR·kc` values) stay in L1 while `B` panels stream from L2.
///
/// # Safety
/// `args` meets its contract with `MR` and `NR = NV·V::N`, and the CPU
/// supports the instructions behind `V`.
#[inline(always)]
unsafe fn block_impl<V: Lanes, const MR: usize, const NV: usize, const PACKED: bool>(args: &Args) {
    let nr = NV * V::N;
    if args.b_packed {
        // Columns innermost: the A rows of a tile stay in L1 while the packed
        // B panels stream past from L2.
        let mut i = 0;
        while i < args.mc {
            // SAFETY: `i < mc` (forwarded contract).
            let a = unsafe { a_rows::<MR, PACKED>(args, i) };
            let mut j = 0;
            while j < args.nc {
                // SAFETY: `i < mc`, `j < nc`, `a` from `a_rows` (forwarded contract).
                unsafe { one_tile::<V, MR, NV, PACKED>(args, i, j, &a) };
                j += nr;
            }
            i += MR;
        }
    } else {
        // B read in place: rows innermost, so each B panel comes from memory
        // once and from L2 for the other row panels.
        let mut j = 0;
        while j < args.nc {
            let mut i = 0;
            while i < args.mc {
                // SAFETY: `i < mc`, `j < nc` (forwarded contract).
                unsafe { one_tile::<V, MR, NV, PACKED>(args, i, j, &a_rows::<MR, PACKED>(args, i)) };
                i += MR;
            }
            j += nr;
        }
    }
}

/// Row `r` of the `A` of the tile at row `i` of the block. In place, rows past
/// the edge repeat the last row (their results are dropped).
///
/// # Safety
/// `args` meets its contract and `i < mc`.
#[inline(always)]
unsafe fn a_rows<const MR: usize, const PACKED: bool>(args: &Args, i: usize) -> [*const f32; MR] {
    let rows = (args.mc - i).min(MR);
    let mut a_rows = [args.a; MR];
    for (r, p) in a_rows.iter_mut().enumerate() {
        let off = if PACKED { i * args.kc + r } else { (i + r.min(rows - 1)) * args.lda };
        // SAFETY: inside `a` by the contract (`i + r.min(rows − 1) < mc`).
        *p = unsafe { args.a.add(off) };
    }
    a_rows
}

/// The tile at `(i, j)` of the block.
///
/// # Safety
/// `args` meets its contract, `i < mc`, `j < nc`, `a` comes from [`a_rows`] for
/// the same `i`, and the CPU supports `V`.
#[inline(always)]
unsafe fn one_tile<V: Lanes, const MR: usize, const NV: usize, const PACKED: bool>(
    args: &Args,
    i: usize,
    j: usize,
    a: &[*const f32; MR],
) {
    let nr = NV * V::N;
    let rows = (args.mc - i).min(MR);
    let cols = (args.nc - j).min(nr);
    let b_off = if args.b_packed { j * args.kc } else { j };
    let a_step = if PACKED { MR } else { 1 };
    // SAFETY: panel `j/nr` of B starts at `b_off`, inside `b`; the tile of C
    // at `i·ldc + j` has `rows ≤ mc − i` rows and `cols ≤ nc − j` columns.
    unsafe {
        let tile = TilePtr { c: args.c.add(i * args.ldc + j), ldc: args.ldc, rows, cols };
        let b = args.b.add(b_off);
        micro::<V, MR, NV>(args.kc, a, a_step, b, args.b_step, &tile, args.accumulate);
    }
}

/// Where one tile of `C` goes: `rows × cols` values at `c`, row stride `ldc`.
struct TilePtr {
    c: *mut f32,
    ldc: usize,
    rows: usize,
    cols: usize,
}

/// One register tile: `C (+)= A·Bpanel` over depth `kc`, where value `p` of
/// row `r` of `A` is at `a[r] + p·a_step` and step `p` of the `B` panel at
/// `b + p·b_step`.
///
/// # Safety
/// Each `a[r]` is readable for `(kc−1)·a_step + 1` values, each step of `b`
/// for `NV·V::N` values, `tile` describes writable memory with `rows ≤ MR`,
/// `1 ≤ cols ≤ NV·V::N`, and the CPU supports `V`.
#[inline(always)]
unsafe fn micro<V: Lanes, const MR: usize, const NV: usize>(
    kc: usize,
    a: &[*const f32; MR],
    a_step: usize,
    b: *const f32,
    b_step: usize,
    tile: &TilePtr,
    accumulate: bool,
) {
    for r in 0..tile.rows {
        // SAFETY: row `r < rows` of the tile is inside the writable memory of `tile`;
        // a prefetch never faults.
        unsafe {
            let p = tile.c.add(r * tile.ldc);
            V::prefetch(p);
            V::prefetch(p.add(tile.cols - 1));
        }
    }
    // SAFETY: the CPU supports `V` (contract).
    let zero = unsafe { V::zero() };
    let mut acc = [[zero; NV]; MR];
    let mut b = b;
    let mut off = 0;
    for _ in 0..kc {
        let mut bv = [zero; NV];
        for (v, x) in bv.iter_mut().enumerate() {
            // SAFETY: `b` points at one depth step of `NV·V::N` values.
            *x = unsafe { V::load(b.add(v * V::N)) };
            if b_step != NV * V::N {
                // B in place: rows `b_step` apart defeat the hardware prefetcher.
                // SAFETY: a prefetch never faults.
                unsafe { V::prefetch(b.wrapping_add(PREFETCH_STEPS * b_step + v * V::N)) };
            }
        }
        for (row, &ar) in acc.iter_mut().zip(a) {
            // SAFETY: `off ≤ (kc−1)·a_step` is inside row `r` of A (contract).
            let s = unsafe { V::splat(*ar.add(off)) };
            for (x, &y) in row.iter_mut().zip(&bv) {
                // SAFETY: the CPU supports `V` (contract).
                *x = unsafe { V::fma(s, y, *x) };
            }
        }
        off += a_step;
        // Past the last step this may point beyond `B`; it is never read there.
        b = b.wrapping_add(b_step);
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
    /// Sum of the lanes.
    #[inline(always)]
    unsafe fn sum(v: Self) -> f32 {
        let mut buf = [0.0f32; 16];
        // SAFETY: `buf` holds 16 ≥ N values.
        unsafe { Self::store(buf.as_mut_ptr(), v) };
        buf.iter().take(Self::N).sum()
    }
    /// Hints the cache line of `p` into L1; a no-op where the ISA has no hint.
    #[inline(always)]
    unsafe fn prefetch(_p: *const f32) {}
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
        unsafe fn prefetch(p: *const f32) {
            // SAFETY: a prefetch hint never faults, whatever the address.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) }
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

    /// Transposes the 16×16 block at `src` (row stride `ld`) into `dst` (row stride `ldd`).
    ///
    /// # Safety
    /// AVX-512F is supported; 16 rows of 16 values are readable at `src` and writable at `dst`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn transpose16(src: *const f32, ld: usize, dst: *mut f32, ldd: usize) {
        let mut r = [_mm512_setzero_ps(); 16];
        for (i, x) in r.iter_mut().enumerate() {
            // SAFETY: row `i < 16` of the block is readable (contract).
            *x = unsafe { _mm512_loadu_ps(src.add(i * ld)) };
        }
        // Pairs of rows interleaved, then pairs of pairs: register 4g+q now holds,
        // in 128-bit lane L, column 4L+q of rows 4g..4g+3.
        let mut t = [_mm512_setzero_ps(); 16];
        for i in 0..8 {
            t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        let pd = _mm512_castps_pd;
        for g in 0..4 {
            let (a, b, c, d) = (t[4 * g], t[4 * g + 1], t[4 * g + 2], t[4 * g + 3]);
            r[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(a), pd(c)));
            r[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(a), pd(c)));
            r[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(b), pd(d)));
            r[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(b), pd(d)));
        }
        // Gather lane L of registers q, 4+q, 8+q, 12+q into output row 4L+q.
        for q in 0..4 {
            let s0 = _mm512_shuffle_f32x4::<0x88>(r[q], r[4 + q]);
            let s1 = _mm512_shuffle_f32x4::<0xdd>(r[q], r[4 + q]);
            let s2 = _mm512_shuffle_f32x4::<0x88>(r[8 + q], r[12 + q]);
            let s3 = _mm512_shuffle_f32x4::<0xdd>(r[8 + q], r[12 + q]);
            let out = [
                _mm512_shuffle_f32x4::<0x88>(s0, s2),
                _mm512_shuffle_f32x4::<0x88>(s1, s3),
                _mm512_shuffle_f32x4::<0xdd>(s0, s2),
                _mm512_shuffle_f32x4::<0xdd>(s1, s3),
            ];
            for (l, v) in out.into_iter().enumerate() {
                // SAFETY: row `4l + q < 16` of the destination block is writable (contract).
                unsafe { _mm512_storeu_ps(dst.add((4 * l + q) * ldd), v) };
            }
        }
    }

    /// Transposes the 8×8 block at `src` (row stride `ld`) into `dst` (row stride `ldd`).
    ///
    /// # Safety
    /// AVX is supported; 8 rows of 8 values are readable at `src` and writable at `dst`.
    #[target_feature(enable = "avx")]
    pub(super) unsafe fn transpose8(src: *const f32, ld: usize, dst: *mut f32, ldd: usize) {
        let mut r = [_mm256_setzero_ps(); 8];
        for (i, x) in r.iter_mut().enumerate() {
            // SAFETY: row `i < 8` of the block is readable (contract).
            *x = unsafe { _mm256_loadu_ps(src.add(i * ld)) };
        }
        let mut t = [_mm256_setzero_ps(); 8];
        for i in 0..4 {
            t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        let pd = _mm256_castps_pd;
        for g in 0..2 {
            let (a, b, c, d) = (t[4 * g], t[4 * g + 1], t[4 * g + 2], t[4 * g + 3]);
            r[4 * g] = _mm256_castpd_ps(_mm256_unpacklo_pd(pd(a), pd(c)));
            r[4 * g + 1] = _mm256_castpd_ps(_mm256_unpackhi_pd(pd(a), pd(c)));
            r[4 * g + 2] = _mm256_castpd_ps(_mm256_unpacklo_pd(pd(b), pd(d)));
            r[4 * g + 3] = _mm256_castpd_ps(_mm256_unpackhi_pd(pd(b), pd(d)));
        }
        for q in 0..4 {
            let lo = _mm256_permute2f128_ps::<0x20>(r[q], r[4 + q]);
            let hi = _mm256_permute2f128_ps::<0x31>(r[q], r[4 + q]);
            // SAFETY: rows `q` and `4 + q < 8` of the destination block are writable (contract).
            unsafe {
                _mm256_storeu_ps(dst.add(q * ldd), lo);
                _mm256_storeu_ps(dst.add((4 + q) * ldd), hi);
            }
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
        #[inline(always)]
        unsafe fn prefetch(p: *const f32) {
            // SAFETY: a prefetch hint never faults, whatever the address.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) }
        }
    }
}
