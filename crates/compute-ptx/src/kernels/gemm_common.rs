//! What the tensor-core GEMMs ([`super::gemm_mma`], [`super::gemm_wgmma`])
//! share: the GEMM kernels' parameters, the dtypes they take, the swizzled
//! shared-memory layouts of operand tiles and the `cp.async` copies that fill
//! them, the prologue that puts the first k-tiles in flight, and the masked
//! pair stores of the epilogue.

use compute_core::DType;

use super::gemm_epilogue::EpilogueRegs;

use crate::builder::{B32, Cmp, F32, Half, KernelBuilder, Pred, Reg, Src, U32, U64, WgmmaInput};

/// The parameters every GEMM kernel declares, in order: `a`, `b`, `c`
/// (global addresses), `m`, `n`, `k`, and the batch strides `sa`, `sb`, `sc`
/// in elements.
pub(crate) struct GemmParams {
    pub(crate) a: Reg<U64>,
    pub(crate) b: Reg<U64>,
    pub(crate) c: Reg<U64>,
    pub(crate) m: Reg<U32>,
    pub(crate) n: Reg<U32>,
    pub(crate) k: Reg<U32>,
    pub(crate) sa: Reg<U64>,
    pub(crate) sb: Reg<U64>,
    pub(crate) sc: Reg<U64>,
}

/// Declares and loads the GEMM parameters ([`GemmParams`]).
pub(crate) fn gemm_params(b: &mut KernelBuilder) -> GemmParams {
    GemmParams {
        a: b.param_ptr("a"),
        b: b.param_ptr("b"),
        c: b.param_ptr("c"),
        m: b.param::<U32>("m"),
        n: b.param::<U32>("n"),
        k: b.param::<U32>("k"),
        sa: b.param::<U64>("sa"),
        sb: b.param::<U64>("sb"),
        sc: b.param::<U64>("sc"),
    }
}

/// A tensor-core kernel's name before its shape: `{family}_{input}_{output}_{nn|nt|tn|tt}`
/// (`input` as the tensor cores read it: `bf16`, `f16`, `tf32`; `t`: that
/// operand is stored transposed).
pub(crate) fn kernel_base(family: &str, input: &str, output: DType, trans_a: bool, trans_b: bool) -> String {
    let t = |x: bool| if x { 't' } else { 'n' };
    format!("{family}_{input}_{output}_{}{}", t(trans_a), t(trans_b))
}

/// What a `wgmma` kernel multiplies for `input` and how it rounds the
/// output (`None`: `f32`): halves as they are, or `f32` read as TF32, which
/// takes `A` stored `m × k` and `B` stored `n × k` and an `f32` output only;
/// or why the combination is not taken.
pub(crate) fn wgmma_dtypes(
    input: DType,
    output: DType,
    (trans_a, trans_b): (bool, bool),
) -> Result<(WgmmaInput, Option<Half>), String> {
    if input == DType::F32 {
        if output != DType::F32 || trans_a || !trans_b {
            return Err("TF32 takes A stored m x k and B stored n x k, with an f32 output".into());
        }
        return Ok((WgmmaInput::Tf32, None));
    }
    half_dtypes(input, output).map(|(h, o)| (WgmmaInput::Half(h), o))
}

/// Stores a warpgroup's `64 × bn` `f32` accumulator (`wgmma`'s layout: warp
/// `w` of the warpgroup holds rows `16w + g` and `16w + g + 8`, columns
/// `8j + 2t` and `8j + 2t + 1`, for lane `4g + t`) into `C` of `m × n`
/// elements at `c_base`, rounded to `out` (or `f32`), rows from `row0` (this
/// lane's first row, `16w + g` included) and columns from `n0`; elements
/// outside `C` are skipped. With `epi`, each pair goes through the matmul
/// epilogue first ([`EpilogueRegs::pair`]; its `C₀` at this batch).
pub(crate) fn store_wgmma_tile(
    b: &mut KernelBuilder,
    acc: &[Reg<F32>],
    (out, epi): (Option<Half>, Option<EpilogueRegs>),
    (c_base, row0, n0): (Reg<U64>, Reg<U32>, Reg<U32>),
    (m, n, lane): (Reg<U32>, Reg<U32>, Reg<U32>),
) {
    let bn = acc.len() as u32 * 2;
    let esz = if out.is_some() { 2u32 } else { 4 };
    let t = b.and(lane, 3u32);
    let t2 = b.shl(t, 1u32);
    let col = b.add(n0, t2);
    let col_ok: Vec<_> = (0..bn / 8)
        .map(|j| {
            let c = b.add(col, j * 8);
            b.setp(Cmp::Lt, c, n)
        })
        .collect();
    if let Some(e) = epi {
        return store_wgmma_tile_epilogue(b, acc, (out, e), (c_base, row0, col), &col_ok, (m, n));
    }
    for h in 0..2u32 {
        let row = b.add(row0, h * 8);
        let row_ok = b.setp(Cmp::Lt, row, m);
        let elem = b.mad(row, n, col);
        let off = b.mul_wide(elem, esz);
        let row_ptr = b.add(c_base, off);
        for j in 0..bn / 8 {
            let (lo, hi) = (acc[(4 * j + 2 * h) as usize], acc[(4 * j + 2 * h + 1) as usize]);
            let ok = b.and_pred(row_ok, col_ok[j as usize]);
            store_pair(b, out, (row_ptr, i64::from(j * 8 * esz)), (lo, hi), ok);
        }
    }
}

/// Column groups of 8 whose epilogue reads [`store_wgmma_tile_epilogue`]
/// issues together before their stores.
const EPILOGUE_CHUNK: usize = 8;

/// [`store_wgmma_tile`] through the epilogue `e`: per chunk of
/// [`EPILOGUE_CHUNK`] column groups, every read of the bias and of `C₀` is
/// issued first (read-only loads that the stores do not wait behind), then
/// the values are finished and stored.
fn store_wgmma_tile_epilogue(
    b: &mut KernelBuilder,
    acc: &[Reg<F32>],
    (out, e): (Option<Half>, EpilogueRegs),
    (c_base, row0, col): (Reg<U64>, Reg<U32>, Reg<U32>),
    col_ok: &[Reg<Pred>],
    (m, n): (Reg<U32>, Reg<U32>),
) {
    let groups = acc.len() / 4;
    let esz = if out.is_some() { 2u32 } else { 4 };
    let col_off = b.mul_wide(col, esz);
    let rows: Vec<(Reg<Pred>, Reg<U64>, Reg<U64>)> = (0..2u32)
        .map(|h| {
            let row = b.add(row0, h * 8);
            let row_ok = b.setp(Cmp::Lt, row, m);
            let elem = b.mad(row, n, col);
            let off = b.mul_wide(elem, esz);
            (row_ok, off, b.add(c_base, off))
        })
        .collect();
    let all: Vec<usize> = (0..groups).collect();
    for chunk in all.chunks(EPILOGUE_CHUNK) {
        let mut pending = Vec::new();
        for &j in chunk {
            let at = (j as u32 * 8 * esz) as i64;
            let bias = e.load_bias(b, out, (col_off, at), col_ok[j]);
            for (h, &(row_ok, off, row_ptr)) in rows.iter().enumerate() {
                let ok = b.and_pred(row_ok, col_ok[j]);
                let c = e.load_c(b, out, (off, at), ok);
                pending.push((4 * j + 2 * h, row_ptr, at, ok, c, bias));
            }
        }
        for (i, row_ptr, at, ok, c, bias) in pending {
            let (lo, hi) = e.finish(b, (acc[i], acc[i + 1]), c, bias);
            store_pair(b, out, (row_ptr, at), (lo, hi), ok);
        }
    }
}

/// A `wgmma` warpgroup's TF32 fragments of `A` read from a `k`-contiguous
/// stage in the 128-byte swizzle (rows of 128 bytes, 32 `f32` of `k` each;
/// chunk `c` of row `r` at `c ⊕ (r mod 8)`, tiles aligned to 1024 bytes) and
/// rounded to nearest on their way to `wgmma` with `A` from registers
/// ([`KernelBuilder::wgmma_mma_async_reg_a`]). Per `k` step of 8, one
/// `ldmatrix.x4` reads four 8×4 blocks of `f32` as 8×8 blocks of halves:
/// lane `l` of warp `w` receives rows `16w + l/4` and `16w + l/4 + 8` at
/// `k` = `l mod 4` and `l mod 4 + 4`, the layout the instruction takes; lanes
/// `8i..8i+8` name the rows of block `i` (row `16w + 8((l/8) mod 2) + l mod 8`,
/// chunk `2s + l/16` of step `s`). The eight rows a phase reads sit in eight
/// different bank groups, so the reads are conflict-free. Then four
/// `cvt.rna.tf32.f32`: the rounding of [`super::elementwise::round_tf32`].
pub(crate) struct Tf32Fragments {
    /// This lane's row of `A` in stage 0 (shared address).
    row: Reg<U32>,
    /// Per `k` step, the byte offset of this lane's swizzled chunk in its row.
    chunks: Vec<Reg<U32>>,
}

impl Tf32Fragments {
    /// For lane `lane` of warp `warp` (0..4 within its warpgroup), whose
    /// warpgroup's 64 rows of `A` start at shared address `rows` in stage 0,
    /// over `steps` `k` steps (4 for a 128-byte row). About ten instructions.
    pub(crate) fn new(b: &mut KernelBuilder, rows: Reg<U32>, warp: Reg<U32>, lane: Reg<U32>, steps: u32) -> Self {
        let lo = b.and(lane, 7u32);
        let block = b.shr(lane, 3u32);
        let second8 = b.and(block, 1u32);
        let hi = b.shr(lane, 4u32);
        let r = b.mad(second8, 8u32, lo);
        let r = b.mad(warp, 16u32, r);
        let row = b.mad(r, 128u32, rows);
        let chunks = (0..steps)
            .map(|s| {
                let c = b.add(hi, 2 * s);
                let c = b.xor(c, lo);
                b.shl(c, 4u32)
            })
            .collect();
        Tf32Fragments { row, chunks }
    }

    /// This lane's row in the stage `offset` bytes after stage 0 (one add).
    pub(crate) fn row_in(&self, b: &mut KernelBuilder, offset: impl Into<Src<U32>>) -> Reg<U32> {
        b.add(self.row, offset)
    }

    /// Step `s`'s four registers from the stage whose row [`Tf32Fragments::row_in`]
    /// gave, rounded to TF32: one `ldmatrix.x4` and four `cvt`.
    pub(crate) fn load_rounded(&self, b: &mut KernelBuilder, row: Reg<U32>, s: usize) -> [Reg<U32>; 4] {
        let at = b.add(row, self.chunks[s]);
        let v = b.ldmatrix_x4(at, 0, false);
        v.map(|x| {
            let r = b.round_to_tf32(x);
            b.bitcast::<U32, B32>(r)
        })
    }
}

/// The tensor cores' input format for `input` and the rounding of the output
/// (`None`: `f32`), or why the pair is not taken.
pub(crate) fn half_dtypes(input: DType, output: DType) -> Result<(Half, Option<Half>), String> {
    let half = match input {
        DType::F16 => Half::F16,
        DType::BF16 => Half::Bf16,
        other => return Err(format!("tensor-core inputs are f16 or bf16, not {other}")),
    };
    let out = match output {
        DType::F32 => None,
        DType::F16 => Some(Half::F16),
        DType::BF16 => Some(Half::Bf16),
        other => return Err(format!("no {other} output")),
    };
    Ok((half, out))
}

/// The matrices of batch `z` (as a 64-bit register): `A` and `B` of `elem`-byte
/// values (2 or 4) from `sa`/`sb` elements per batch.
pub(crate) fn batch_operands(b: &mut KernelBuilder, p: &GemmParams, z: Reg<U64>, elem: u32) -> (Reg<U64>, Reg<U64>) {
    let shift = elem.trailing_zeros();
    let a_off = b.mul(z, p.sa);
    let a_off = b.shl(a_off, shift);
    let a_base = b.add(p.a, a_off);
    let b_off = b.mul(z, p.sb);
    let b_off = b.shl(b_off, shift);
    (a_base, b.add(p.b, b_off))
}

/// The physical 16-byte chunk of logical chunk `c` in row `r` of a shared
/// tile whose rows hold `cpr` chunks: `c` XOR a function of the row chosen so
/// that eight consecutive rows at one logical chunk land in eight different
/// 16-byte bank groups (rows of 128 bytes or more: `r mod 8`; narrower rows
/// share a 128-byte line, so the row index is first divided by the rows per line).
pub fn swizzle(r: u32, c: u32, cpr: u32) -> u32 {
    let (per_line, mask) = swizzle_params(cpr);
    c ^ ((r / per_line) & mask)
}

fn swizzle_params(cpr: u32) -> (u32, u32) {
    ((8 / cpr).max(1), cpr.min(8) - 1)
}

/// [`swizzle`] on registers (`r` a row, `c` a chunk index).
pub(crate) fn swizzle_reg(b: &mut KernelBuilder, r: Reg<U32>, c: Reg<U32>, cpr: u32) -> Reg<U32> {
    let (per_line, mask) = swizzle_params(cpr);
    let q = if per_line > 1 { b.shr(r, per_line.trailing_zeros()) } else { r };
    let s = b.and(q, mask);
    b.xor(c, s)
}

/// One operand's shared tile: stored `k`-contiguous (rows along m or n, `bk`
/// halves each) or `m`/`n`-contiguous (rows along k, `tile` halves each).
#[derive(Clone, Copy)]
pub(crate) struct Side {
    pub(crate) kmajor: bool,
    pub(crate) tile: u32,
    pub(crate) bk: u32,
    /// Byte offset of this operand's tile within a stage.
    pub(crate) at: u32,
    /// For an `m`/`n`-contiguous operand: lay the tile out in `wgmma`'s
    /// 128-byte swizzle atoms ([`ATOM_K_STRIDE`]) instead of rows of `tile` halves.
    pub(crate) atoms: bool,
    /// Bytes per value: 2 (`f16`, `bf16`) or 4 (`f32` read as TF32).
    pub(crate) elem: u32,
}

/// `wgmma`'s layout of an `m`/`n`-contiguous tile: atoms of 8 rows (8 values
/// of `k`) by 128 bytes (64 values along m or n), 1024 bytes each, swizzled
/// like a 128-byte-row tile; the atoms of one 64-wide column follow each
/// other along `k` (this many bytes apart), and the columns are
/// [`atom_mn_stride`] apart.
pub(crate) const ATOM_K_STRIDE: u32 = 1024;

/// Bytes between two 64-wide columns of atoms of a tile `bk` deep.
pub(crate) fn atom_mn_stride(bk: u32) -> u32 {
    bk / 8 * ATOM_K_STRIDE
}

impl Side {
    pub(crate) fn rows(&self) -> u32 {
        if self.kmajor { self.tile } else { self.bk }
    }
    pub(crate) fn row_bytes(&self) -> u32 {
        self.elem * if self.kmajor { self.bk } else { self.tile }
    }
    pub(crate) fn cpr(&self) -> u32 {
        self.row_bytes() / 16
    }
}

/// Per-thread state of one operand's global→shared copies.
pub(crate) struct Copies {
    side: Side,
    /// Global address of each of the thread's chunks, advanced per k-tile.
    ptrs: Vec<Reg<U64>>,
    /// Shared offset (within a stage) of each chunk.
    pub(crate) dst: Vec<Reg<U32>>,
    /// `k`-contiguous: bytes each row may read (16, or 0 past `m`/`n`).
    row_bytes: Vec<Reg<U32>>,
    /// `k`-contiguous: the thread's chunk's first `k` offset (`8·c`).
    /// Otherwise: the thread's first row (a `k` offset).
    first: Reg<U32>,
    /// Rows between the thread's chunks.
    step_rows: u32,
    /// `m`/`n`-contiguous: 16 when the thread's column chunk is inside, else 0.
    col_bytes: Option<Reg<U32>>,
    /// Bytes to advance every pointer by per k-tile.
    advance: Src<U64>,
}

/// Sets up one operand's copies: `base` is the batch's matrix, `ld` its row
/// length in elements, `mn`/`mn0` the operand's extent and this block's origin
/// along m or n.
pub(crate) fn copies(
    b: &mut KernelBuilder,
    side: Side,
    threads: u32,
    tid: Reg<U32>,
    base: Reg<U64>,
    ld: Reg<U32>,
    (mn, mn0): (Reg<U32>, Reg<U32>),
) -> Copies {
    let cpr = side.cpr();
    let step_rows = threads / cpr;
    let iters = side.rows() * cpr / threads;
    let c = b.rem(tid, cpr);
    let r0 = b.div(tid, cpr);
    let mut ptrs = Vec::new();
    let mut dst = Vec::new();
    let mut row_bytes = Vec::new();
    // The first value of chunk c: 16 bytes hold 8 halves or 4 f32.
    let c8 = b.shl(c, (16 / side.elem).trailing_zeros());
    let (first, col_bytes, advance) = if side.kmajor {
        // Rows along m/n, clamped inside the matrix (their copies read nothing past it).
        let last = b.sub(mn, 1u32);
        for i in 0..iters {
            let r = b.add(r0, i * step_rows);
            let row = b.add(mn0, r);
            let inside = b.setp(Cmp::Lt, row, mn);
            row_bytes.push(b.selp(16u32, 0u32, inside));
            let clamped = b.min(row, last);
            let elem = b.mad(clamped, ld, c8);
            let off = b.mul_wide(elem, side.elem);
            ptrs.push(b.add(base, off));
        }
        (c8, None, Src::from(u64::from(side.bk * side.elem)))
    } else {
        // Rows along k; the column chunk is inside or not for the whole loop.
        let col = b.add(mn0, c8);
        let inside = b.setp(Cmp::Lt, col, mn);
        let col_bytes = b.selp(16u32, 0u32, inside);
        let colc = b.selp(col, 0u32, inside);
        for i in 0..iters {
            let r = b.add(r0, i * step_rows);
            let elem = b.mad(r, ld, colc);
            let off = b.mul_wide(elem, side.elem);
            ptrs.push(b.add(base, off));
        }
        let adv = b.mul_wide(ld, side.bk * side.elem);
        (r0, Some(col_bytes), Src::from(adv))
    };
    for i in 0..iters {
        let r = b.add(r0, i * step_rows);
        let off = if side.atoms && !side.kmajor {
            // Atom column c / 8, atom row r / 8; inside it, row r % 8 and chunk (c % 8) ^ (r % 8).
            let col = b.shr(c, 3u32);
            let col_off = b.mul(col, atom_mn_stride(side.bk));
            let grp = b.shr(r, 3u32);
            let at = b.mad(grp, ATOM_K_STRIDE, col_off);
            let r8 = b.and(r, 7u32);
            let cin = b.and(c, 7u32);
            let pc = b.xor(cin, r8);
            let pc16 = b.shl(pc, 4u32);
            let within = b.mad(r8, 128u32, pc16);
            b.add(at, within)
        } else {
            let pc = swizzle_reg(b, r, c, cpr);
            let pc16 = b.shl(pc, 4u32);
            b.mad(r, side.row_bytes(), pc16)
        };
        dst.push(b.add(off, side.at));
    }
    Copies { side, ptrs, dst, row_bytes, first, step_rows, col_bytes, advance }
}

/// Issues the copies of the k-tile starting at `k0` into the stage at byte
/// offset `stage_off`, and advances the pointers to the next k-tile.
pub(crate) fn issue(b: &mut KernelBuilder, cp: &Copies, k0: Reg<U32>, k: Reg<U32>, stage_off: u32) {
    if cp.side.kmajor {
        let kc = b.add(k0, cp.first);
        let inside = b.setp(Cmp::Lt, kc, k);
        for (i, &p) in cp.ptrs.iter().enumerate() {
            let bytes = b.selp(cp.row_bytes[i], 0u32, inside);
            b.cp_async_16(cp.dst[i], i64::from(stage_off), p, 0, Some(bytes.into()));
        }
    } else {
        let kr = b.add(k0, cp.first);
        // Always set for an operand stored with m or n contiguous.
        let col_bytes = cp.col_bytes.unwrap_or(kr);
        for (i, &p) in cp.ptrs.iter().enumerate() {
            let row = b.add(kr, i as u32 * cp.step_rows);
            let inside = b.setp(Cmp::Lt, row, k);
            let bytes = b.selp(col_bytes, 0u32, inside);
            b.cp_async_16(cp.dst[i], i64::from(stage_off), p, 0, Some(bytes.into()));
        }
    }
    for &p in &cp.ptrs {
        let next = b.add(p, cp.advance);
        b.assign(p, next);
    }
}

/// One `k`-contiguous operand's share of a k-tile held in registers on its
/// way to shared memory (the TF32 path that rounds values before storing
/// them): four 32-bit values per 16-byte chunk of [`Copies`], and whether
/// each chunk's row is inside the matrix.
pub(crate) struct RegTile {
    vals: Vec<[Reg<B32>; 4]>,
    rows_inside: Vec<Reg<Pred>>,
    zero: Reg<B32>,
}

/// The registers of [`RegTile`] for the chunks of `cp` (a `k`-contiguous
/// operand of 4-byte values).
pub(crate) fn reg_tile(b: &mut KernelBuilder, cp: &Copies) -> RegTile {
    let zero = b.zero_b32();
    let vals = cp.ptrs.iter().map(|_| std::array::from_fn(|_| b.zero_b32())).collect();
    let rows_inside = cp.row_bytes.iter().map(|&r| b.setp(Cmp::Ne, r, 0u32)).collect();
    RegTile { vals, rows_inside, zero }
}

/// Loads the k-tile starting at `k0` of a `k`-contiguous operand into `t`
/// (zeros past the matrix's edges), and advances the pointers to the next k-tile.
pub(crate) fn load_regs(b: &mut KernelBuilder, cp: &Copies, t: &RegTile, k0: Reg<U32>, k: Reg<U32>) {
    let kc = b.add(k0, cp.first);
    let k_inside = b.setp(Cmp::Lt, kc, k);
    for (i, &p) in cp.ptrs.iter().enumerate() {
        let ok = b.and_pred(t.rows_inside[i], k_inside);
        for v in t.vals[i] {
            b.assign(v, t.zero);
        }
        b.guarded(ok, false, |b| b.ld_global_v_into(t.vals[i], p, 0));
    }
    for &p in &cp.ptrs {
        let next = b.add(p, cp.advance);
        b.assign(p, next);
    }
}

/// Stores the values of `t`, each rounded to TF32 (`cvt.rna.tf32.f32`),
/// where [`copies`] would have put them, in the stage at byte offset `stage_off`.
pub(crate) fn store_rounded(b: &mut KernelBuilder, cp: &Copies, t: &RegTile, stage_off: u32) {
    for (i, &d) in cp.dst.iter().enumerate() {
        let r = t.vals[i].map(|x| b.round_to_tf32(x));
        b.st_shared_v::<B32, 4>(d, i64::from(stage_off), r.map(Src::from));
    }
}

/// The prologue: copies of the first `ahead` k-tiles (of `bk`) into stages
/// `0..ahead`, one `cp.async` group each. Returns the register holding the
/// next k-tile's origin.
pub(crate) fn issue_ahead(
    b: &mut KernelBuilder,
    operands: [&Copies; 2],
    k: Reg<U32>,
    (ahead, stage_bytes, bk): (u32, u32, u32),
) -> Reg<U32> {
    let kload = b.mov(0u32);
    for s in 0..ahead {
        refill(b, operands, (kload, k), s * stage_bytes, bk);
    }
    kload
}

/// Copies of the k-tile at `kload` into the stage at `stage_off`, as one
/// `cp.async` group, and `kload` moved on by `bk`.
pub(crate) fn refill(
    b: &mut KernelBuilder,
    operands: [&Copies; 2],
    (kload, k): (Reg<U32>, Reg<U32>),
    stage_off: u32,
    bk: u32,
) {
    for cp in operands {
        issue(b, cp, kload, k, stage_off);
    }
    b.cp_async_commit();
    let next = b.add(kload, bk);
    b.assign(kload, next);
}

/// The k-tile loop, unrolled over the `stages` buffers: `body(b, s)` is the
/// work of one k-tile read from stage `s`; the loop leaves after
/// `ceil(k / bk)` k-tiles (`bk` a power of two), and the code emitted next
/// runs after it.
pub(crate) fn stage_loop(
    b: &mut KernelBuilder,
    k: Reg<U32>,
    (bk, stages): (u32, u32),
    mut body: impl FnMut(&mut KernelBuilder, u32),
) {
    let kt = b.mov(0u32);
    let k_end = b.add(k, bk - 1);
    let nk = b.shr(k_end, bk.trailing_zeros());
    b.blank();
    b.comment(&format!("main loop, unrolled over the {stages} stages"));
    let top = b.label("ktile");
    let done = b.label("drain");
    b.place(top);
    for s in 0..stages {
        let over = b.setp(Cmp::Ge, kt, nk);
        b.bra_if(over, done);
        body(b, s);
        let next = b.add(kt, 1u32);
        b.assign(kt, next);
    }
    b.bra(top);
    b.place(done);
}

/// Stores one accumulator pair at `p + at` when `ok`: two `f32`s (8 bytes) or,
/// with `out`, the pair rounded to two halves (4 bytes).
pub(crate) fn store_pair(
    b: &mut KernelBuilder,
    out: Option<Half>,
    (p, at): (Reg<U64>, i64),
    (lo, hi): (Reg<F32>, Reg<F32>),
    ok: Reg<Pred>,
) {
    match out {
        None => b.guarded(ok, false, |b| b.st_global_v::<F32, 2>(p, at, [lo.into(), hi.into()])),
        Some(h) => {
            let w = b.f32_pair_to_half(lo, hi, h);
            b.guarded(ok, false, |b| b.st_global::<U32>(p, at, w));
        }
    }
}
