//! Products of few activation rows with block-quantized weights, `y = x·Wᵀ`
//! (`x` of `m ≤` [`MAX_ROWS`] rows, `W` of `n` rows of `k` values stored as
//! `Q4_K`, `Q5_K`, `Q6_K` or `Q8_0` blocks): ggml's "mmvq" design. The
//! activations are quantized to int8 per 32 values; the kernels unpack the
//! weight quants in registers and take the dot products on integers with
//! `dp4a` (four int8 products per instruction), scaling in `f32` once per 32
//! values (16 for `Q6_K`): `d_w·sc·d_x·Σq_w·q_x − dmin·m·d_x·Σq_x` for the
//! k-quants with a min, `d_w·sc·d_x·Σ(q_w − 32)·q_x` for `Q6_K`,
//! `d_w·d_x·Σq_w·q_x` for `Q8_0`. The error against the exact product with
//! the dequantized weights is that of the int8 activations, at most
//! `(d_x/2)·Σ|W|` per 32 values (`d_x = max|x| / 127` of those values), plus
//! `f32` rounding.
//!
//! Two kernels:
//!
//! - [`qgemv_x`] (1, 2 or 4 rows, when the quantized activations fit
//!   [`X_MAX_SMEM`] of shared memory): one launch that quantizes `x` into
//!   shared memory itself, then streams the weights, each warp taking
//!   [`x_weight_rows`] weight rows at a time so each activation load serves
//!   several rows (the cache reads of the activations, not the weight
//!   bytes, otherwise limit these kernels), with a grid of about
//!   [`X_BLOCKS_PER_SM`] resident blocks per multiprocessor; past
//!   [`X_SHORT_VALUES`] activation values its kernels for long rows
//!   ([`x_long`]) quantize `x` in wider passes.
//! - [`qgemv`] (8 or 16 rows, or activations too large for shared memory):
//!   reads the activations that [`quant::quantize_x`] wrote to a temporary.
//!   Each warp takes [`weight_rows_per_warp`] weight rows (1 up to 4
//!   activation rows, 2 for 8, 4 for 16 (`Q5_K`: 2)), with
//!   [`ROWS_PER_BLOCK`] warps per block of [`THREADS`] threads.
//!
//! In both, several lanes share one weight block ([`lanes_per_block`]; 4 for
//! `Q4_K`/`Q5_K` in [`qgemv_x`], each taking a whole 32-byte run of quants,
//! two groups): `Q4_K`/`Q5_K` lanes read 16-byte loads of quants beside the
//! block's 16-byte header (those 144/176-byte blocks keep 16-byte
//! alignment); `Q6_K` blocks are only 2-byte aligned, so a lane reads each
//! 8-byte piece of quants as 3 aligned words and shifts it into place;
//! `Q8_0` lanes read 2-byte halves. Each lane takes a number of weight
//! blocks per iteration ([`units`], [`x_units`]), their loads issued
//! together. Each lane keeps `R` sums (`R` the kernel's row count, the
//! smallest at least `m`: rows `m..R` read row `m − 1` again and are not
//! stored) per weight row; a butterfly (`shfl.sync.bfly`) adds the lanes
//! and lane `i < m` writes `y[i, j]`. Deterministic: no atomics.

pub mod split;

use super::elem;
use super::gemm_epilogue::{self, EpilogueKind, EpilogueRegs};
use super::quant::{self, f16_lo, scale_min_k4};
use crate::builder::{BuildError, Cmp, Dim, F32, Kernel, KernelBuilder, Pred, Reg, S32, Target, U32, U64};
use compute_core::DType;
use compute_core::quant::BlockFormat;

/// The row counts the kernels are built for.
pub const ROWS: [u32; 5] = [1, 2, 4, 8, 16];
/// The most activation rows (`m`) a kernel takes; more run the prefill path.
pub const MAX_ROWS: usize = 16;
/// Warps per block (each takes [`weight_rows_per_warp`] weight rows).
pub const ROWS_PER_BLOCK: u32 = 4;
/// Threads per block.
pub const THREADS: u32 = 32 * ROWS_PER_BLOCK;

/// The row count of the kernel that takes `m` rows (`1 ≤ m ≤ 16`): the
/// smallest of [`ROWS`] at least `m`. Free.
pub fn rows_for(m: usize) -> u32 {
    ROWS.into_iter().find(|&r| r as usize >= m).unwrap_or(ROWS[ROWS.len() - 1])
}

/// Lanes that share one weight block: 8 (32 values each) for the 256-value
/// formats, 4 (8 values each) for `Q8_0`.
pub fn lanes_per_block(format: BlockFormat) -> u32 {
    if format == BlockFormat::Q8_0 { 4 } else { 8 }
}

/// Lanes per block of `format` in the layout `wide` picks (4 for
/// `Q4_K`/`Q5_K` when wide).
fn lanes_of(format: BlockFormat, wide: bool) -> u32 {
    if wide && matches!(format, BlockFormat::Q4K | BlockFormat::Q5K) { 4 } else { lanes_per_block(format) }
}

/// Weight blocks each lane takes per loop iteration.
pub fn units(format: BlockFormat) -> u32 {
    if format == BlockFormat::Q8_0 { 4 } else { 2 }
}

/// Weight rows each warp takes in the kernel of `format` for `rows`
/// activation rows: 1 up to 4 rows, 2 for 8, 4 for 16 (2 for `Q5_K`, whose
/// unpacked fifth bits would not fit the registers of 4). Each activation
/// load then serves that many weight rows, which keeps the cache reads of
/// the activations (about `2·m` bytes per weight byte with one weight row
/// a warp) within the L1's bandwidth as `m` grows. Free.
pub fn weight_rows_per_warp(format: BlockFormat, rows: u32) -> u32 {
    match rows {
        16 if format != BlockFormat::Q5K => 4,
        8 | 16 => 2,
        _ => 1,
    }
}

/// Weight rows per block of the kernel of `format` for `rows` activation
/// rows (the grid is `ceil(n / weight_rows_per_block)` blocks). Free.
pub fn weight_rows_per_block(format: BlockFormat, rows: u32) -> u32 {
    ROWS_PER_BLOCK * weight_rows_per_warp(format, rows)
}

/// Name of the kernel (`qgemv_q4k_r4_bf16`).
pub fn name(format: BlockFormat, rows: u32, out: DType) -> String {
    format!("qgemv_{}_r{rows}_{}", quant::tag(format), out.as_str())
}

/// What one lane needs to process a weight block: constants of its lane.
struct Lane {
    /// Lanes per weight block.
    lpb: u32,
    /// `Q4_K`/`Q5_K` with 4 lanes per block, each taking a whole run of 32
    /// quant bytes (two groups) instead of half of one.
    wide: bool,
    /// Byte offsets (within a block) of this lane's pieces.
    a: Reg<U64>,
    b: Reg<U64>,
    c: Reg<U64>,
    /// Offset of this lane's activation bytes within the block's 256 (or 32).
    xo: Reg<U32>,
    /// Byte offset of this lane's first `(d, s)` pair within the block's.
    dso: Reg<U32>,
    /// Format-specific shifts and flags.
    s0: Reg<U32>,
    s1: Reg<U32>,
    high: Reg<Pred>,
    /// `−1` for the lane that adds a group's min term, else `0`.
    min_sign: Reg<F32>,
}

/// Builds the GEMV of `format` for `rows` activation rows, writing `out`:
/// `y[i, j] = Σ_p x[i, p]·W[j, p]` for `i < m`, `j < n`, from the quantized
/// activations. Params: `w` (the blocks, `n` rows of `k / values_per_block`
/// blocks; 16-byte aligned for `Q4_K`/`Q5_K`, 2-byte otherwise), `qx`, `ds`
/// (from [`quant::quantize_x`], 16-byte aligned), `y` (pointers), `m`, `n`,
/// `k` (u32). Launch: [`THREADS`] threads, `ceil(n / weight_rows_per_block(format, rows))` blocks.
/// Reads `W` once (at memory bandwidth) and the activations from cache.
pub fn qgemv(format: BlockFormat, rows: u32, out: DType, target: Target) -> Result<Kernel, BuildError> {
    let kname = name(format, rows, out);
    if !quant::supported(format) || !ROWS.contains(&rows) {
        let why = format!("no quantized GEMV for {format} with {rows} rows");
        return Err(BuildError { kernel: kname, problems: vec![why] });
    }
    let lpb = lanes_per_block(format);
    let u = units(format);
    let rw = weight_rows_per_warp(format, rows);
    let bytes = format.bytes_per_block() as u32;
    let vpb = format.values_per_block() as u32;
    let mut b = KernelBuilder::new(&kname, target);
    b.doc(&format!(
        "{kname}: y[i, j] = sum_p x[i, p] * W[j, p] for i < m <= {rows}; W rows of {format} blocks, x as int8 per 32 values (d, d*sum q), {out} out"
    ));
    b.doc(&format!(
        "{rw} weight rows per warp ({ROWS_PER_BLOCK} warps per block); {lpb} lanes per weight block, {u} blocks per lane per iteration; dp4a on int8, f32 scales per group; butterfly sum, lane i writes y[i, j]"
    ));
    b.doc("params: w, qx, ds, y (pointers), m, n, k (u32)");
    b.doc(&format!("launch: {THREADS} threads, ceil(n / {}) blocks", ROWS_PER_BLOCK * rw));
    b.max_threads(THREADS);
    let w = b.param_ptr("w");
    let qx = b.param_ptr("qx");
    let ds = b.param_ptr("ds");
    let y = b.param_ptr("y");
    let m = b.param::<U32>("m");
    let n = b.param::<U32>("n");
    let k = b.param::<U32>("k");

    let tid = b.tid(Dim::X);
    let lane = b.and(tid, 31u32);
    let warp = b.shr(tid, 5u32);
    let cta = b.ctaid(Dim::X);
    let wi = b.mad(cta, ROWS_PER_BLOCK, warp);
    let j = b.mul(wi, rw);
    // Whole warps leave together, so the shuffles below see 32 lanes.
    let gone = b.setp(Cmp::Ge, j, n);
    b.guarded(gone, false, |b| b.ret());
    let nb = b.shr(k, vpb.trailing_zeros());
    let row_bytes = b.mul(nb, bytes);
    // Weight rows j..j + rw, the ones past n reading row n - 1 (not stored).
    let nm1 = b.sub(n, 1u32);
    let wrows: Vec<Reg<U64>> = (0..rw)
        .map(|c| {
            let jc = b.add(j, c);
            let jc = b.min(jc, nm1);
            let roff = b.mul_wide(jc, row_bytes);
            b.add(w, roff)
        })
        .collect();
    // Row r of the activations starts min(r, m - 1)·k bytes into qx (m·k < 2³²):
    // one 32-bit offset per row keeps the registers of 16 rows low.
    let last = b.sub(m, 1u32);
    let xrows: Vec<Reg<U32>> = (0..rows)
        .map(|r| {
            let ri = b.min(last, r);
            b.mul(ri, k)
        })
        .collect();
    // acc[c·rows + r]: weight row c, activation row r.
    let acc: Vec<Reg<F32>> = (0..rows * rw).map(|_| b.mov(0.0f32)).collect();
    let sub = b.and(lane, lpb - 1);
    let slot = b.shr(lane, lpb.trailing_zeros());
    let ln = lane_consts(&mut b, format, false, sub);

    let reduce = b.label("reduce");
    let xs = XSrc::Global { qx, ds, offsets: &xrows };
    row_sums(&mut b, format, &ln, (&wrows, nb, slot, u), (xs, &acc), format == BlockFormat::Q8_0, reduce);
    b.place(reduce);
    let done = b.label("done");
    reduce_store(&mut b, &acc, rows, (lane, m, n, j), (y, out, None), Fused { scale: None, glu: false }, done);
    b.place(done);
    b.ret();
    b.finish()
}

/// The row counts of the kernels that quantize the activations themselves
/// ([`qgemv_x`]).
pub const X_ROWS: [u32; 3] = [1, 2, 4];
/// Threads per block of [`qgemv_x`].
pub const X_THREADS: u32 = 256;
/// Warps per block of [`qgemv_x`].
pub const X_WARPS: u32 = X_THREADS / 32;
/// Blocks of [`qgemv_x`] resident per multiprocessor that the plan sizes the
/// grid for. How many more fit is left to the registers, which cuts both
/// ways on an H100: back-to-back products of one shape run faster when no
/// third block fits (the block scheduler otherwise stacks a grid launched
/// early on the multiprocessors that finished first: the `Q6_K` and `Q8_0`
/// kernels, at 64 and 50 registers, took 36.2 and 42.8 µs at 14336 × 4096,
/// 25.9 and 31.0 held to two blocks), while a decoder's chain of different
/// kernels runs faster when there is room (its `Q4_K` products held to two
/// decoded 1389–1397 tokens/s, against 1496–1508 at 70–103 registers).
/// The kernels for long rows ([`x_long`]) take 105 registers or more, which
/// `cargo xtask ptx --check` holds them to; the others are as light as
/// their work allows.
pub const X_BLOCKS_PER_SM: u32 = 2;
/// The most shared memory [`qgemv_x`] takes (the quantized activations): the
/// default limit of a block.
pub const X_MAX_SMEM: usize = 48 << 10;
/// Bytes at the start of its weight rows (contiguous in memory) that a warp
/// of [`qgemv_x`] asks into L2 before waiting for the kernel ahead of it, a
/// 128-byte line per lane: about what streams in the few microseconds the
/// kernel ahead of a decoder's product takes. Asking for more (the first
/// 8 KiB of each of a warp's first rows) made back-to-back products at 4096
/// × 14336 14 % slower on an H100 (the asked lines evict the ones the
/// product before is reading).
const X_PREFETCH_BYTES: u32 = 32 * 128;
/// Quads (4 activation values) each thread quantizes per pass of
/// [`qgemv_x`]'s first phase, their loads issued together: one pass takes
/// 4096 values.
pub const X_QUADS: u32 = 4;
/// [`X_QUADS`] in the kernels for long rows ([`x_long`]): one pass up to
/// 16 Ki values. `x` of 14336 values took four passes of 4 quads, each
/// waiting for its loads (`Q4_K` at 4096 × 14336: 19.5 µs on an H100 that
/// way, 18.7 µs in one); warps whose quads all lie past the end skip theirs.
pub const X_QUADS_LONG: u32 = 16;
/// [`X_QUADS_LONG`] with a fused norm, which loads `g`'s values beside
/// `x`'s (16 would pass the registers of two blocks per multiprocessor).
pub const X_QUADS_LONG_NORM: u32 = 8;
/// The most activation values (`m·k`) that [`qgemv_x`] quantizes in passes
/// of [`X_QUADS`] (two passes).
pub const X_SHORT_VALUES: usize = 2 * 4 * (X_QUADS * X_THREADS) as usize;

/// Whether a product of `m` activation rows of `k` values takes the kernel
/// for long rows (wider passes of its first phase, [`X_QUADS_LONG`]): more
/// than [`X_SHORT_VALUES`] values. The short rows' kernels keep fewer
/// registers, and with them room on a multiprocessor for the blocks of the
/// kernel after them (see [`X_BLOCKS_PER_SM`]). Free.
pub fn x_long(m: usize, k: usize) -> bool {
    m * k > X_SHORT_VALUES
}

/// Shared bytes of [`qgemv_x`] for `m` activation rows of `k` values: the
/// int8 quants (`m·k`, padded to 16 bytes) then the `(d, s)` pairs
/// (`m·k/32` of 8 bytes), then with a fused `norm` each 32 values' sum of
/// squares (`m·k/32` of 4 bytes). Free.
pub fn x_smem(m: usize, k: usize, norm: bool) -> usize {
    (m * k).next_multiple_of(16) + m * k / 4 + if norm { m * k / 8 } else { 0 }
}

/// What [`qgemv_x`] fuses around its product: the steps of a transformer
/// layer next to its linear layers ([`compute_core::QuantMatmulSpec`]'s
/// `rms_norm` and `glu`, and its epilogue).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct XFusion {
    /// `x`'s rows normalized by their RMS and scaled by `g` first: the block
    /// quantizes `x·g` and keeps each 32 values' `Σx²`; every warp then
    /// takes its rows' `r = 1/√(mean(x²) + eps)` and scales its sums by it
    /// (the int8 scales are linear in `r`, so this is exact).
    pub norm: bool,
    /// The weight rows are a gate half and an up half, `y` their
    /// `silu(gate)·up` (`n/2` columns): each warp takes as many gate rows
    /// as up rows, the same columns.
    pub glu: bool,
    /// The epilogue applied in the stores (none with `glu`).
    pub epilogue: Option<EpilogueKind>,
}

impl XFusion {
    /// Only an epilogue (or nothing).
    pub fn epilogue(epilogue: Option<EpilogueKind>) -> Self {
        XFusion { epilogue, ..XFusion::default() }
    }

    /// The kernel name's suffix: `_norm`, `_glu`, then the epilogue's.
    pub fn suffix(&self) -> String {
        let mut s = String::new();
        if self.norm {
            s += "_norm";
        }
        if self.glu {
            s += "_glu";
        }
        s + &EpilogueKind::suffix(self.epilogue)
    }
}

/// Weight blocks each lane takes per loop iteration in [`qgemv_x`]: 1 (2
/// for `Q8_0`, whose blocks are small). Free.
pub fn x_units(format: BlockFormat) -> u32 {
    if format == BlockFormat::Q8_0 { 2 } else { 1 }
}

/// Weight rows each warp of [`qgemv_x`] for `rows` activation rows takes at
/// a time, each activation load serving them all: 4 for `Q4_K` up to 2 rows
/// and `Q5_K` for 1, else 2 (measured best on an H200 for one row; more
/// would spill registers). Free.
pub fn x_weight_rows(format: BlockFormat, rows: u32) -> u32 {
    match (format, rows) {
        (BlockFormat::Q4K, 1 | 2) | (BlockFormat::Q5K, 1) => 4,
        _ => 2,
    }
}

/// The weight rows a warp of [`qgemv_x`] takes at a time in a product of
/// `cols` output columns (gated: each a gate and an up row) on `sms`
/// multiprocessors: [`x_weight_rows`], or half of it when that would give
/// fewer blocks than multiprocessors (a decoder's 2048-row products on an
/// H100: 64 blocks for 132 multiprocessors, each streaming twice the bytes
/// it would with half the rows a warp). Free.
pub fn x_weight_rows_for(format: BlockFormat, rows: u32, cols: usize, glu: bool, sms: u32) -> u32 {
    let full = x_weight_rows(format, rows);
    let per_col = if glu { 2 } else { 1 };
    let blocks = cols.div_ceil((X_WARPS * full / per_col) as usize);
    if full / 2 >= per_col && blocks < sms as usize { full / 2 } else { full }
}

/// Name of the kernel that quantizes its activations
/// (`qgemvx_q4k_r1_f32_bf16`; `_w2` when its warps take `rw` weight rows at
/// a time instead of [`x_weight_rows`], `_long` for long rows ([`x_long`]),
/// then [`XFusion::suffix`]).
pub fn x_name(
    format: BlockFormat,
    (rows, rw, long): (u32, u32, bool),
    input: DType,
    out: DType,
    fusion: XFusion,
) -> String {
    let narrow = if rw == x_weight_rows(format, rows) { String::new() } else { format!("_w{rw}") };
    let long = if long { "_long" } else { "" };
    let suffix = fusion.suffix();
    format!("qgemvx_{}_r{rows}_{}_{}{narrow}{long}{suffix}", quant::tag(format), input.as_str(), out.as_str())
}

/// Builds the GEMV of `format` for `rows` (1, 2 or 4) activation rows that
/// quantizes the activations itself, in one launch with no temporary, with
/// the steps of `fusion` around the product: each
/// block first quantizes all of `x` (`m × k` values of `input`) into shared
/// memory as [`quant::quantize_x`] does, save that `q = round(x·(127 / max|x|))`
/// with an approximate reciprocal (one division per 4 values instead of 4;
/// `|x − q·d| ≤ d/2` up to `f32` rounding, so the error bound holds). Then
/// warp `w` of block `c` takes the `rpc / 8` consecutive weight rows from
/// `c·rpc + w·rpc/8`, `rw` at a time (at most [`x_weight_rows`]; each
/// activation load, from shared memory, serving them all). `Q4_K`/`Q5_K` blocks get 4 lanes,
/// each a whole run of 32 quant bytes (two groups, 64 values: two 16-byte
/// loads of quants, one of the header); `Q6_K`/`Q8_0` blocks as in
/// [`qgemv`]. The plan sizes `rpc` (a multiple of 8 times that) so that
/// the grid is about [`X_BLOCKS_PER_SM`] blocks per multiprocessor: every
/// block stays resident and `x` is quantized once per block; it picks `rw`
/// with [`x_weight_rows_for`]. Params: `w` (as
/// [`qgemv`]), `x`, `y` (pointers; `x` 16-byte aligned), `m`, `n`, `k`,
/// `rpc` (u32), then with a norm `g` (pointer, `k` values of `input`) and
/// `eps` (f32), then with an `epilogue` its `alpha`, `beta` (f32), bias and
/// `C₀` (pointers; [`gemm_epilogue`]), applied to each value as it is
/// stored. With `glu`, `n` counts the weight rows (even) and `rpc` the
/// output columns (`n / 2`). Launch: [`X_THREADS`] threads, `ceil(n / rpc)`
/// blocks (`ceil(n / 2 / rpc)` with `glu`), [`x_smem`]`(m, k, norm)` bytes
/// of dynamic shared memory (at most [`X_MAX_SMEM`]); `k > 0`. With `long`
/// the first phase quantizes [`X_QUADS_LONG`] quads a thread per pass.
pub fn qgemv_x(
    format: BlockFormat,
    (rows, rw, long): (u32, u32, bool),
    input: DType,
    out: DType,
    fusion: XFusion,
    target: Target,
) -> Result<Kernel, BuildError> {
    let kname = x_name(format, (rows, rw, long), input, out, fusion);
    if !quant::supported(format) || !X_ROWS.contains(&rows) {
        let why = format!("no quantizing GEMV for {format} with {rows} rows");
        return Err(BuildError { kernel: kname, problems: vec![why] });
    }
    if fusion.glu && fusion.epilogue.is_some() {
        let why = "a gated product takes no other epilogue".to_string();
        return Err(BuildError { kernel: kname, problems: vec![why] });
    }
    if !(1..=x_weight_rows(format, rows)).contains(&rw) || !rw.is_power_of_two() || (fusion.glu && rw % 2 != 0) {
        let why =
            format!("{rw} weight rows a warp: a power of two up to {}, even when gated", x_weight_rows(format, rows));
        return Err(BuildError { kernel: kname, problems: vec![why] });
    }
    let epilogue = fusion.epilogue;
    let lpb = lanes_of(format, true);
    let u = x_units(format);
    // Output columns each warp takes at a time (gate and up rows for each with glu).
    let cw = if fusion.glu { rw / 2 } else { rw };
    let bytes = format.bytes_per_block() as u32;
    let vpb = format.values_per_block() as u32;
    let mut b = KernelBuilder::new(&kname, target);
    b.doc(&format!(
        "{kname}: y[i, j] = sum_p x[i, p] * W[j, p] for i < m <= {rows}; W rows of {format} blocks, x ({input}) quantized to int8 per 32 values in shared memory first, {out} out"
    ));
    b.doc(&format!(
        "warp w of block c takes rows c*rpc + w*rpc/{X_WARPS}.., {rw} at a time; {lpb} lanes per weight block, {u} blocks per lane per iteration; dp4a on int8, f32 scales per group; butterfly sum, lane i writes y[i, j]"
    ));
    b.doc("params: w, x, y (pointers), m, n, k, rpc (u32)");
    if fusion.norm {
        b.doc("then g (pointer), eps (f32): x's rows as x / sqrt(mean(x^2) + eps) * g, the sums scaled by each row's 1 / sqrt(..)");
    }
    if fusion.glu {
        b.doc("weight rows [gate; up]: y[i, j] = silu(gate_j . x_i) * (up_j . x_i), n / 2 columns; rpc counts columns");
    }
    gemm_epilogue::doc(&mut b, epilogue);
    let ss_doc = if fusion.norm { " + m*k/8" } else { "" };
    let cols_doc = if fusion.glu { "n/2" } else { "n" };
    b.doc(&format!(
        "launch: {X_THREADS} threads, ceil({cols_doc} / rpc) blocks, round16(m*k) + m*k/4{ss_doc} bytes of dynamic shared memory"
    ));
    b.max_threads(X_THREADS);
    b.min_blocks_per_sm(X_BLOCKS_PER_SM);
    let w = b.param_ptr("w");
    let x = b.param_ptr("x");
    let y = b.param_ptr("y");
    let m = b.param::<U32>("m");
    let n = b.param::<U32>("n");
    let k = b.param::<U32>("k");
    let rpc = b.param::<U32>("rpc");
    let norm = fusion.norm.then(|| (b.param_ptr("g"), b.param::<F32>("eps")));
    let epi = gemm_epilogue::params(&mut b, epilogue);
    let smem = b.dynamic_shared("xq", 16);
    let sq = b.shared_base(&smem);
    let tid = b.tid(Dim::X);
    let lane = b.and(tid, 31u32);
    let warp = b.shr(tid, 5u32);
    let cta = b.ctaid(Dim::X);

    b.comment(if fusion.glu {
        "this warp's output columns, a gate and an up row each"
    } else {
        "this warp's weight rows, rw at a time"
    });
    let nb = b.shr(k, vpb.trailing_zeros());
    let row_bytes = b.mul(nb, bytes);
    // Columns of y: the weight rows, or half of them with glu.
    let cols = if fusion.glu { b.shr(n, 1u32) } else { n };
    let row0 = b.mul(cta, rpc);
    let per_warp = b.shr(rpc, X_WARPS.trailing_zeros());
    let j = b.mad(warp, per_warp, row0);
    let jend = b.add(j, per_warp);
    let jend = b.min(jend, cols);
    let nm1 = b.sub(cols, 1u32);
    let last = b.sub(m, 1u32);
    let xrows: Vec<Reg<U32>> = (0..rows)
        .map(|r| {
            let ri = b.min(last, r);
            b.mul(ri, k)
        })
        .collect();
    let acc: Vec<Reg<F32>> = (0..rows * rw).map(|_| b.mov(0.0f32)).collect();
    let sub = b.and(lane, lpb - 1);
    let slot = b.shr(lane, lpb.trailing_zeros());
    let ln = lane_consts(&mut b, format, true, sub);
    b.comment("the first bytes of this warp's weight rows into L2 while the kernel before ends (it may write x)");
    let first = b.mul_wide(j, row_bytes);
    let first = b.add(w, first);
    let top = b.max(jend, j);
    let end = b.mul_wide(top, row_bytes);
    let end = b.add(w, end);
    let off = b.mul_wide(lane, X_PREFETCH_BYTES / 32);
    let at = b.add(first, off);
    let inside = b.setp(Cmp::Lt, at, end);
    b.guarded(inside, false, |b| b.prefetch_l2(at, 0));
    b.wait_for_prerequisites();
    let slots = match (long, fusion.norm) {
        (false, _) => X_QUADS,
        (true, false) => X_QUADS_LONG,
        (true, true) => X_QUADS_LONG_NORM,
    };
    b.comment("quantize x into shared memory: 8 threads per 32 values, 4 values each");
    let mk = b.mul(m, k);
    let quads = b.shr(mk, 2u32);
    let qlast = b.sub(quads, 1u32);
    let qbytes = b.add(mk, 15u32);
    let qbytes = b.and(qbytes, !15u32);
    let sds = b.add(sq, qbytes);
    // With the norm: each 32 values' sum of squares after the (d, s) pairs,
    // and the quads of a row (to find g's columns).
    let (sss, kq) = if fusion.norm {
        let pair_bytes = b.shr(mk, 2u32);
        (b.add(sds, pair_bytes), b.shr(k, 2u32))
    } else {
        (sds, k)
    };
    let es = elem::size(input);
    let it = b.mov(0u32);
    let qloop = b.label("quantize");
    let qdone = b.label("quantized");
    b.place(qloop);
    let over = b.setp(Cmp::Ge, it, quads);
    b.bra_if(over, qdone);
    // One pass: `slots` quads per thread, then `it` moves on.
    let base = b.add(it, tid);
    let mut loaded = Vec::new();
    for t in 0..slots {
        let q = b.add(base, t * X_THREADS);
        let valid = b.setp(Cmp::Lt, q, quads);
        // With long rows, warps wholly past the end skip the slot (a
        // uniform branch; their loads, of the last quad, hit the cache).
        // Threads past the end in a warp that is not quantize the last
        // quad again (the shuffles need whole warps) and store nothing.
        let wpast = long.then(|| {
            let wq = b.mad(warp, 32u32, it);
            let wq = b.add(wq, t * X_THREADS);
            b.setp(Cmp::Ge, wq, quads)
        });
        let qc = b.min(q, qlast);
        let off = b.mul_wide(qc, 4 * es);
        let xa = b.add(x, off);
        let xs = elem::load(&mut b, input, xa, 0, 4);
        // With the norm, g's values of these columns.
        let gs = norm.map(|(g, _)| {
            let col = b.rem(qc, kq);
            let off = b.mul_wide(col, 4 * es);
            let ga = b.add(g, off);
            elem::load(&mut b, input, ga, 0, 4)
        });
        loaded.push((valid, qc, xs, gs, wpast));
    }
    for (valid, qc, xs, gs, wpast) in loaded {
        let skip = wpast.map(|wpast| {
            let skip = b.label("quad_skip");
            b.bra_if(wpast, skip);
            skip
        });
        // With the norm, x·g is quantized and Σx² of the 32 values kept.
        let xs = match gs {
            Some(gs) => {
                let mut sq2 = b.mul(xs[0], xs[0]);
                for &v in &xs[1..] {
                    sq2 = b.fma(v, v, sq2);
                }
                for mask in [1, 2, 4] {
                    let o = b.shfl_bfly(sq2, mask);
                    sq2 = b.add(sq2, o);
                }
                let lead = b.and(tid, 7u32);
                let lead = b.setp(Cmp::Eq, lead, 0u32);
                let lead = b.and_pred(lead, valid);
                let grp = b.shr(qc, 3u32);
                let sa = b.mad(grp, 4u32, sss);
                b.guarded(lead, false, |b| b.st_shared(sa, 0, sq2));
                xs.iter().zip(&gs).map(|(&v, &g)| b.mul(v, g)).collect()
            }
            None => xs,
        };
        let (d, word, sum) = quant::quantize_quad(&mut b, &xs, quant::Reciprocal::Approx);
        let qa = b.mad(qc, 4u32, sq);
        b.guarded(valid, false, |b| b.st_shared(qa, 0, word));
        let sub = b.and(tid, 7u32);
        let lead = b.setp(Cmp::Eq, sub, 0u32);
        let lead = b.and_pred(lead, valid);
        let sf = b.cvt::<F32, S32>(sum);
        let sv = b.mul(d, sf);
        let g = b.shr(qc, 3u32);
        let da = b.mad(g, 8u32, sds);
        b.guarded(lead, false, |b| b.st_shared_v::<F32, 2>(da, 0, [d.into(), sv.into()]));
        if let Some(skip) = skip {
            b.place(skip);
        }
    }
    let next = b.add(it, slots * X_THREADS);
    b.assign(it, next);
    b.bra(qloop);
    b.place(qdone);
    b.bar_sync();
    // With the norm, each activation row's 1 / sqrt(mean(x²) + eps), from
    // its groups' sums of squares (every warp the same, in the same order).
    let scale: Option<Vec<Reg<F32>>> = norm.map(|(_, eps)| {
        let kg = b.shr(k, 5u32);
        let kf = b.cvt::<F32, U32>(k);
        (0..rows)
            .map(|r| {
                let ri = b.min(last, r);
                let first = b.mul(ri, kg);
                let acc = b.mov(0.0f32);
                let t = b.mov(lane);
                let lp = b.label("rms");
                let ld = b.label("rms_done");
                b.place(lp);
                let out = b.setp(Cmp::Ge, t, kg);
                b.bra_if(out, ld);
                let gi = b.add(first, t);
                let sa = b.mad(gi, 4u32, sss);
                let v = b.ld_shared::<F32>(sa, 0);
                let a2 = b.add(acc, v);
                b.assign(acc, a2);
                let t2 = b.add(t, 32u32);
                b.assign(t, t2);
                b.bra(lp);
                b.place(ld);
                for mask in [16, 8, 4, 2, 1] {
                    let o = b.shfl_bfly(acc, mask);
                    let a2 = b.add(acc, o);
                    b.assign(acc, a2);
                }
                let ms = b.div(acc, kf);
                let ms = b.add(ms, eps);
                let rms = b.sqrt(ms);
                b.div(1.0f32, rms)
            })
            .collect()
    });

    let rloop = b.label("rows");
    let finished = b.label("finished");
    b.place(rloop);
    let gone = b.setp(Cmp::Ge, j, jend);
    b.bra_if(gone, finished);
    // Weight rows j..j + cw, the ones past the columns reading the last
    // (not stored); with glu the up rows j + n/2.. after them.
    let wrows: Vec<Reg<U64>> = (0..rw)
        .map(|c| {
            let jc = b.add(j, c % cw);
            let jc = b.min(jc, nm1);
            let jc = if c >= cw { b.add(jc, cols) } else { jc };
            let roff = b.mul_wide(jc, row_bytes);
            b.add(w, roff)
        })
        .collect();
    for &a in &acc {
        b.assign(a, 0.0f32);
    }
    let reduce = b.label("reduce");
    let xs = XSrc::Shared { qx: sq, ds: sds, offsets: &xrows };
    row_sums(&mut b, format, &ln, (&wrows, nb, slot, u), (xs, &acc), false, reduce);
    b.place(reduce);
    let stored = b.label("stored");
    let fused = Fused { scale: scale.as_deref(), glu: fusion.glu };
    reduce_store(&mut b, &acc, rows, (lane, m, cols, j), (y, out, epi), fused, stored);
    b.place(stored);
    let nj = b.add(j, cw);
    b.assign(j, nj);
    b.bra(rloop);
    b.place(finished);
    b.ret();
    b.finish()
}

/// What [`reduce_store`] does to the sums on their way out: scaled by each
/// activation row's norm factor, and gate and up sums combined.
#[derive(Clone, Copy)]
struct Fused<'a> {
    scale: Option<&'a [Reg<F32>]>,
    glu: bool,
}

/// Adds the lanes' sums (butterfly) and has lane `i < m` write
/// `y[i, j + c]` (`acc[c·rows + i]`) for the columns `j + c < n`, through
/// `epi` where there is one (with `fused.glu`, `silu(acc[c·rows + i])·
/// acc[(c + half)·rows + i]` for the first half of the `c`); ends at `done`
/// (placed right after by the caller).
fn reduce_store(
    b: &mut KernelBuilder,
    acc: &[Reg<F32>],
    rows: u32,
    (lane, m, n, j): (Reg<U32>, Reg<U32>, Reg<U32>, Reg<U32>),
    (y, out, epi): (Reg<U64>, DType, Option<EpilogueRegs>),
    fused: Fused,
    done: crate::builder::Label,
) {
    b.comment("butterfly over the lanes; lane i < m writes row i");
    for mask in [16, 8, 4, 2, 1] {
        for &s in acc {
            let o = b.shfl_bfly(s, mask);
            let t = b.add(s, o);
            b.assign(s, t);
        }
    }
    let outside = b.setp(Cmp::Ge, lane, m);
    b.bra_if(outside, done);
    // This lane's row's value among the `rows` of a column.
    let pick = |b: &mut KernelBuilder, vals: &[Reg<F32>]| {
        let mut val = vals[0];
        for (r, &s) in vals.iter().enumerate().skip(1) {
            let is = b.setp(Cmp::Eq, lane, r as u32);
            val = b.selp(s, val, is);
        }
        val
    };
    let factor = fused.scale.map(|s| pick(b, s));
    let columns: Vec<&[Reg<F32>]> = acc.chunks(rows as usize).collect();
    let half = if fused.glu { columns.len() / 2 } else { columns.len() };
    for (c, sums) in columns[..half].iter().enumerate() {
        let mut val = pick(b, sums);
        if let Some(f) = factor {
            val = b.mul(val, f);
        }
        if fused.glu {
            let mut up = pick(b, columns[c + half]);
            if let Some(f) = factor {
                up = b.mul(up, f);
            }
            let sw = super::elementwise::apply_unary(b, super::elementwise::UnaryKind::Swish, val);
            val = b.mul(sw, up);
        }
        let jc = b.add(j, c as u32);
        let past = b.setp(Cmp::Ge, jc, n);
        b.bra_if(past, done);
        let yi = b.mad(lane, n, jc);
        let yoff = b.mul_wide(yi, elem::size(out));
        let ya = b.add(y, yoff);
        let val = match epi {
            Some(e) => e.element(b, out, (yoff, jc), val),
            None => val,
        };
        elem::store(b, out, ya, 0, &[val]);
    }
}

/// Adds this lane's share of the weight rows `wrows` (`nb` blocks each,
/// `u` blocks per lane per iteration, this lane's first block `slot`)
/// against the activations `xs` into `acc`; ends at `done` (placed right
/// after by the caller).
fn row_sums(
    b: &mut KernelBuilder,
    format: BlockFormat,
    ln: &Lane,
    (wrows, nb, slot, u): (&[Reg<U64>], Reg<U32>, Reg<U32>, u32),
    (xs, acc): (XSrc, &[Reg<F32>]),
    clamped_tail: bool,
    done: crate::builder::Label,
) {
    let lpb = ln.lpb;
    let per_iter = u * 32 / lpb;
    let main = b.label("main");
    let tail = b.label("tail");
    let bi0 = b.mov(slot);
    let slots = 32 / lpb;
    b.comment(&format!("{u} weight blocks per lane per iteration"));
    b.place(main);
    let lastu = b.add(bi0, (u - 1) * slots);
    let past = b.setp(Cmp::Ge, lastu, nb);
    b.bra_if(past, tail);
    for t in 0..u {
        let bi = b.add(bi0, t * slots);
        unit(b, format, ln, wrows, bi, xs, acc);
    }
    let next = b.add(bi0, per_iter);
    b.assign(bi0, next);
    b.bra(main);

    b.place(tail);
    if clamped_tail {
        b.comment("the last blocks: every unit clamped to the row, added only when inside it");
        let empty = b.setp(Cmp::Eq, nb, 0u32);
        b.bra_if(empty, done);
        let nbm1 = b.sub(nb, 1u32);
        for t in 0..u {
            let bi = b.add(bi0, t * slots);
            let valid = b.setp(Cmp::Lt, bi, nb);
            let bic = b.min(bi, nbm1);
            let part: Vec<Reg<F32>> = acc.iter().map(|_| b.mov(0.0f32)).collect();
            unit(b, format, ln, wrows, bic, xs, &part);
            for (&a, &p) in acc.iter().zip(&part) {
                let s = b.add(a, p);
                let s = b.selp(s, a, valid);
                b.assign(a, s);
            }
        }
    } else {
        b.comment("the last blocks: the units inside the row, the first past it ending the row");
        for t in 0..u {
            let bi = b.add(bi0, t * slots);
            let outside = b.setp(Cmp::Ge, bi, nb);
            b.bra_if(outside, done);
            unit(b, format, ln, wrows, bi, xs, acc);
        }
    }
}

/// The per-lane constants of `format` for lane `sub` of a block's lanes.
fn lane_consts(b: &mut KernelBuilder, format: BlockFormat, wide: bool, sub: Reg<U32>) -> Lane {
    let lpb = lanes_of(format, wide);
    let zero64 = b.mov(0u64);
    let zero = b.mov(0u32);
    let never = b.setp(Cmp::Ne, zero, zero);
    let none = b.mov(0.0f32);
    match format {
        BlockFormat::Q4K | BlockFormat::Q5K => {
            // Lane (r, h): run r = sub / 2 of the quants, half h = sub mod 2:
            // values 16h.. of groups 2r (low nibbles) and 2r + 1 (high).
            // Wide: lane r = sub, all 32 values of both groups (h = 0).
            let (r, h) = if wide { (sub, b.mov(0u32)) } else { (b.shr(sub, 1u32), b.and(sub, 1u32)) };
            let qs_at = if format == BlockFormat::Q4K { 16u32 } else { 48 };
            let qa = b.mad(r, 32u32, qs_at);
            let qa = b.mad(h, 16u32, qa);
            let qha = b.mad(h, 16u32, 16u32);
            let xo = b.mad(r, 64u32, 0u32);
            let xo = b.mad(h, 16u32, xo);
            // (d, s) pairs of groups 2r and 2r + 1: 16 bytes at 16r.
            let dso = b.shl(r, 4u32);
            let rm = b.and(r, 1u32);
            let s0 = b.shl(rm, 4u32); // 8·(2r mod 4)
            let high = b.setp(Cmp::Ge, r, 2u32);
            let s1 = b.shl(r, 1u32); // 2r: the fifth-bit shift of group 2r
            let lead = b.setp(Cmp::Eq, h, 0u32);
            let min_sign = b.selp(-1.0f32, 0.0f32, lead);
            Lane {
                lpb,
                wide,
                a: b.cvt::<U64, U32>(qa),
                b: b.cvt::<U64, U32>(qha),
                c: zero64,
                xo,
                dso,
                s0,
                s1,
                high,
                min_sign,
            }
        }
        BlockFormat::Q6K => {
            // Lane (hh, l0): values 128hh + 32t + l0.. (8 of them) for t in
            // 0..4, from ql[64hh + l0..], ql[64hh + 32 + l0..], qh[128 + 32hh + l0..];
            // scales 192 + 8hh + g + 2t with g = l0 / 16.
            let hh = b.shr(sub, 2u32);
            let q = b.and(sub, 3u32);
            let l0 = b.shl(q, 3u32);
            let g = b.shr(q, 1u32);
            let qa = b.mad(hh, 64u32, l0);
            let qha = b.mad(hh, 32u32, l0);
            let qha = b.add(qha, 128u32);
            let sa = b.mad(hh, 8u32, g);
            let sa = b.add(sa, 192u32);
            let xo = b.mad(hh, 128u32, l0);
            let dso = b.shl(hh, 5u32);
            Lane {
                lpb,
                wide,
                a: b.cvt::<U64, U32>(qa),
                b: b.cvt::<U64, U32>(qha),
                c: b.cvt::<U64, U32>(sa),
                xo,
                dso,
                s0: zero,
                s1: zero,
                high: never,
                min_sign: none,
            }
        }
        _ => {
            // Lane sub: values 8·sub.. of the block, quants at 2 + 8·sub.
            let qa = b.mad(sub, 8u32, 2u32);
            let xo = b.shl(sub, 3u32);
            Lane {
                lpb,
                wide,
                a: b.cvt::<U64, U32>(qa),
                b: zero64,
                c: zero64,
                xo,
                dso: zero,
                s0: zero,
                s1: zero,
                high: never,
                min_sign: none,
            }
        }
    }
}

/// `Σ_i dp4a(w_i, x_i)` over paired words.
fn dot(b: &mut KernelBuilder, ws: &[Reg<U32>], xs: &[Reg<U32>]) -> Reg<F32> {
    let mut s = b.mov(0i32);
    for (&wv, &xv) in ws.iter().zip(xs) {
        s = b.dp4a(wv, xv, s);
    }
    b.cvt::<F32, S32>(s)
}

/// One weight block's share of a lane, unpacked in registers.
enum Decoded {
    /// `Q4_K`/`Q5_K`: quant words of groups 2r and 2r + 1, `d·sc` and
    /// `−dmin·m` (0 on the lane that does not add the min term) of each.
    K4 { lo: Vec<Reg<U32>>, hi: Vec<Reg<U32>>, dl: [Reg<F32>; 2], nml: [Reg<F32>; 2] },
    /// `Q6_K`: the words of `q − 32` of groups t = 0..4 and `d·sc` of each.
    Q6 { q: Vec<Vec<Reg<U32>>>, dsc: Vec<Reg<F32>> },
    /// `Q8_0`: two words of quants and `d`.
    Q8 { q: Vec<Reg<U32>>, d: Reg<F32> },
}

/// Loads and unpacks this lane's share of the weight block at `base`.
/// Loads this lane's share of the weight block at `base`, raw: the
/// registers [`unpack`] reads (`Q4_K`/`Q5_K`: the 4 header words, the quant
/// words, the fifth-bit words; `Q6_K`: 2-byte halves of the low and high
/// quants, `d`, the 4 scales; `Q8_0`: `d` and the 2-byte halves of the
/// quants). No instruction waits for the loads, so a loop can fetch the next
/// blocks before it works on the current ones.
fn fetch(b: &mut KernelBuilder, format: BlockFormat, ln: &Lane, base: Reg<U64>) -> Vec<Reg<U32>> {
    let halves = |b: &mut KernelBuilder, a: Reg<U64>, off: i64, words: i64| -> Vec<Reg<U32>> {
        (0..2 * words).map(|i| b.ld_global_nc_u16(a, off + 2 * i)).collect()
    };
    match format {
        BlockFormat::Q4K | BlockFormat::Q5K => {
            let mut raw = b.ld_global_nc_v::<U32, 4>(base, 0).to_vec();
            let qa = b.add(base, ln.a);
            let pieces: i64 = if ln.wide { 2 } else { 1 };
            for p in 0..pieces {
                raw.extend(b.ld_global_nc_v::<U32, 4>(qa, 16 * p));
            }
            if format == BlockFormat::Q5K {
                let ha = b.add(base, ln.b);
                for p in 0..pieces {
                    raw.extend(b.ld_global_nc_v::<U32, 4>(ha, 16 * p));
                }
            }
            raw
        }
        BlockFormat::Q6K => {
            // The three 8-byte pieces start 2 mod 4 in every other block:
            // 3 aligned words each, shifted into place by `unpack`.
            // Every piece is 0 or 2 past a 4-byte boundary, as the block is.
            let mis64 = b.and(base, 3u64);
            let mis = b.cvt::<U32, U64>(mis64);
            let qa = b.add(base, ln.a);
            let qa = b.sub(qa, mis64);
            let mut raw = (0..3).map(|i| b.ld_global_nc::<U32>(qa, 4 * i)).collect::<Vec<_>>();
            raw.extend((0..3).map(|i| b.ld_global_nc::<U32>(qa, 32 + 4 * i)));
            let ha = b.add(base, ln.b);
            let ha = b.sub(ha, mis64);
            raw.extend((0..3).map(|i| b.ld_global_nc::<U32>(ha, 4 * i)));
            raw.push(b.ld_global_nc_u16(base, 208));
            let sa = b.add(base, ln.c);
            for t in 0..4 {
                let sc = b.ld_global_nc_s8(sa, 2 * t);
                raw.push(b.bitcast::<U32, S32>(sc));
            }
            raw.push(b.shl(mis, 3u32));
            raw
        }
        _ => {
            let mut raw = vec![b.ld_global_nc_u16(base, 0)];
            let qa = b.add(base, ln.a);
            raw.extend(halves(b, qa, 0, 2));
            raw
        }
    }
}

/// Little-endian words from pairs of 2-byte halves.
fn join_halves(b: &mut KernelBuilder, h: &[Reg<U32>]) -> Vec<Reg<U32>> {
    h.chunks(2)
        .map(|p| {
            let hi = b.shl(p[1], 16u32);
            b.or(p[0], hi)
        })
        .collect()
}

/// `Q6_K` groups t = 0..4 of a lane from its low-quant words (`qla`, run
/// t mod 2 = 0; `qlb`, 1) and high-bit words: `q − 32` as int8 words.
fn q6k_groups(
    b: &mut KernelBuilder,
    qla: &[Reg<U32>],
    qlb: &[Reg<U32>],
    qh: &[Reg<U32>],
    dsc: Vec<Reg<F32>>,
) -> Decoded {
    // Group t: (low or high nibble of ql run t mod 2) | (qh bits 2t) << 4, minus 32.
    let mut q: Vec<Vec<Reg<U32>>> = Vec::new();
    for t in 0..4u32 {
        let src = if t % 2 == 0 { &qla } else { &qlb };
        let words = (0..2)
            .map(|i| {
                let l = b.shr(src[i], 4 * (t / 2));
                let l = b.and(l, 0x0f0f_0f0fu32);
                let h = b.shr(qh[i], 2 * t);
                let h = b.and(h, 0x0303_0303u32);
                let h = b.shl(h, 4u32);
                let v = b.or(l, h);
                // Bytewise q − 32 in 8-bit two's complement: flip bit 5,
                // then copy it into bits 6 and 7.
                let v = b.xor(v, 0x2020_2020u32);
                let s = b.and(v, 0x2020_2020u32);
                let s = b.mul(s, 6u32);
                b.or(v, s)
            })
            .collect();
        q.push(words);
    }
    Decoded::Q6 { q, dsc }
}

/// Unpacks what [`fetch`] loaded.
fn unpack(b: &mut KernelBuilder, format: BlockFormat, ln: &Lane, raw: &[Reg<U32>]) -> Decoded {
    match format {
        BlockFormat::Q4K | BlockFormat::Q5K => {
            let (h0, h1, h2, h3) = (raw[0], raw[1], raw[2], raw[3]);
            let nq = if ln.wide { 8 } else { 4 };
            let qs = &raw[4..4 + nq];
            let qh = (format == BlockFormat::Q5K).then(|| &raw[4 + nq..4 + 2 * nq]);
            // Groups 2r (shift s0) and 2r + 1 (shift s0 + 8).
            let (sc0, m0) = scale_min_k4(b, [h1, h2, h3], ln.s0, ln.high);
            let s0b = b.add(ln.s0, 8u32);
            let (sc1, m1) = scale_min_k4(b, [h1, h2, h3], s0b, ln.high);
            let d = f16_lo(b, h0);
            let hi = b.shr(h0, 16u32);
            let dmin = f16_lo(b, hi);
            let mut dl = Vec::new();
            let mut nml = Vec::new();
            for (sc, mm) in [(sc0, m0), (sc1, m1)] {
                let f = b.cvt::<F32, U32>(sc);
                dl.push(b.mul(d, f));
                let f = b.cvt::<F32, U32>(mm);
                let ml = b.mul(dmin, f);
                nml.push(b.mul(ml, ln.min_sign));
            }
            let mut lo = Vec::new();
            let mut hiw = Vec::new();
            for (i, &q) in qs.iter().enumerate() {
                let mut l = b.and(q, 0x0f0f_0f0fu32);
                let hq = b.shr(q, 4u32);
                let mut h = b.and(hq, 0x0f0f_0f0fu32);
                if let Some(qh) = &qh {
                    let bl = b.shr(qh[i], ln.s1);
                    let bl = b.and(bl, 0x0101_0101u32);
                    let bl = b.shl(bl, 4u32);
                    l = b.or(l, bl);
                    let bh = b.shr(qh[i], ln.s1);
                    let bh = b.shr(bh, 1u32);
                    let bh = b.and(bh, 0x0101_0101u32);
                    let bh = b.shl(bh, 4u32);
                    h = b.or(h, bh);
                }
                lo.push(l);
                hiw.push(h);
            }
            Decoded::K4 { lo, hi: hiw, dl: [dl[0], dl[1]], nml: [nml[0], nml[1]] }
        }
        BlockFormat::Q6K => {
            let sh = raw[14];
            let back = b.sub(32u32, sh);
            let shifted = |b: &mut KernelBuilder, w: &[Reg<U32>]| -> Vec<Reg<U32>> {
                (0..2)
                    .map(|i| {
                        let lo = b.shr(w[i], sh);
                        let hi = b.shl(w[i + 1], back);
                        b.or(lo, hi)
                    })
                    .collect()
            };
            let qla = shifted(b, &raw[0..3]);
            let qlb = shifted(b, &raw[3..6]);
            let qh = shifted(b, &raw[6..9]);
            let d = f16_lo(b, raw[9]);
            let mut dsc = Vec::new();
            for t in 0..4 {
                let sc = b.bitcast::<S32, U32>(raw[10 + t]);
                let f = b.cvt::<F32, S32>(sc);
                dsc.push(b.mul(d, f));
            }
            q6k_groups(b, &qla, &qlb, &qh, dsc)
        }
        _ => {
            let d = f16_lo(b, raw[0]);
            Decoded::Q8 { q: join_halves(b, &raw[1..5]), d }
        }
    }
}

/// Where the quantized activations are read from: the global buffers of
/// [`quant::quantize_x`] or the shared copy [`qgemv_x`] makes. `offsets`:
/// each activation row's byte offset into the quants (a row's `(d, s)`
/// pairs start a quarter of it into the pairs).
#[derive(Clone, Copy)]
enum XSrc<'a> {
    Global { qx: Reg<U64>, ds: Reg<U64>, offsets: &'a [Reg<U32>] },
    Shared { qx: Reg<U32>, ds: Reg<U32>, offsets: &'a [Reg<U32>] },
}

impl XSrc<'_> {
    fn offsets(&self) -> &[Reg<U32>] {
        match self {
            XSrc::Global { offsets, .. } | XSrc::Shared { offsets, .. } => offsets,
        }
    }
}

/// An address of the activations: global or shared.
#[derive(Clone, Copy)]
enum XAddr {
    G(Reg<U64>),
    S(Reg<U32>),
}

fn ldx_v<T: crate::builder::Data, const N: usize>(b: &mut KernelBuilder, a: XAddr, off: i64) -> [Reg<T>; N] {
    match a {
        XAddr::G(p) => b.ld_global_nc_v::<T, N>(p, off),
        XAddr::S(p) => b.ld_shared_v::<T, N>(p, off),
    }
}

fn ldx<T: crate::builder::Data>(b: &mut KernelBuilder, a: XAddr, off: i64) -> Reg<T> {
    match a {
        XAddr::G(p) => b.ld_global_nc::<T>(p, off),
        XAddr::S(p) => b.ld_shared::<T>(p, off),
    }
}

/// This lane's share of weight block `bi` of each weight row (`wrows`, one
/// row of sums each in `acc`) against every activation row of `xs`: each
/// activation load serves every weight row.
fn unit(
    b: &mut KernelBuilder,
    format: BlockFormat,
    ln: &Lane,
    wrows: &[Reg<U64>],
    bi: Reg<U32>,
    xs: XSrc,
    acc: &[Reg<F32>],
) {
    let bytes = format.bytes_per_block() as u32;
    let boff = b.mul_wide(bi, bytes);
    let raws: Vec<Vec<Reg<U32>>> = wrows
        .iter()
        .map(|&wrow| {
            let base = b.add(wrow, boff);
            fetch(b, format, ln, base)
        })
        .collect();
    dots(b, format, ln, &raws, bi, xs, acc);
}

/// The products of the weight blocks `raws` ([`fetch`]ed, block `bi` of
/// each weight row) with the activations, added into `acc`.
fn dots(
    b: &mut KernelBuilder,
    format: BlockFormat,
    ln: &Lane,
    raws: &[Vec<Reg<U32>>],
    bi: Reg<U32>,
    xs: XSrc,
    acc: &[Reg<F32>],
) {
    let vpb = format.values_per_block() as u32;
    let offsets = xs.offsets();
    let rows = offsets.len();
    let decoded: Vec<Decoded> = raws.iter().map(|r| unpack(b, format, ln, r)).collect();
    // This lane's quants and pairs within a row of the activations.
    let xoff = b.mad(bi, vpb, ln.xo);
    let doff = b.mad(bi, vpb / 4, ln.dso);
    for (r, &o) in offsets.iter().enumerate() {
        let q = b.add(o, xoff);
        let d = b.shr(o, 2u32);
        let d = b.add(d, doff);
        let (xa, da) = match xs {
            XSrc::Global { qx, ds, .. } => {
                let q = b.cvt::<U64, U32>(q);
                let d = b.cvt::<U64, U32>(d);
                (XAddr::G(b.add(qx, q)), XAddr::G(b.add(ds, d)))
            }
            XSrc::Shared { qx, ds, .. } => (XAddr::S(b.add(qx, q)), XAddr::S(b.add(ds, d))),
        };
        let sums = acc.iter().skip(r).step_by(rows);
        match format {
            BlockFormat::Q4K | BlockFormat::Q5K => {
                // Group 2r's values at xa, 2r + 1's 32 bytes later.
                let pieces: i64 = if ln.wide { 2 } else { 1 };
                let mut x0 = Vec::new();
                let mut x1 = Vec::new();
                for p in 0..pieces {
                    x0.extend(ldx_v::<U32, 4>(b, xa, 16 * p));
                    x1.extend(ldx_v::<U32, 4>(b, xa, 32 + 16 * p));
                }
                let [d0, s0, d1, s1] = ldx_v::<F32, 4>(b, da, 0);
                for (dec, &a) in decoded.iter().zip(sums) {
                    let Decoded::K4 { lo, hi, dl, nml } = dec else { continue };
                    for (ws, xs, dx, sx, dlg, nm) in
                        [(lo, &x0, d0, s0, dl[0], nml[0]), (hi, &x1, d1, s1, dl[1], nml[1])]
                    {
                        let isum = dot(b, ws, xs);
                        let sc = b.mul(dlg, dx);
                        b.fma_acc(a, sc, isum);
                        b.fma_acc(a, nm, sx);
                    }
                }
            }
            BlockFormat::Q6K => {
                let xs: Vec<[Reg<U32>; 2]> = (0..4).map(|t| ldx_v::<U32, 2>(b, xa, 32 * t)).collect();
                let dx: Vec<Reg<F32>> = (0..4).map(|t| ldx::<F32>(b, da, 8 * t)).collect();
                for (dec, &a) in decoded.iter().zip(sums) {
                    let Decoded::Q6 { q, dsc } = dec else { continue };
                    for t in 0..4 {
                        let isum = dot(b, &q[t], &xs[t]);
                        let sc = b.mul(dsc[t], dx[t]);
                        b.fma_acc(a, sc, isum);
                    }
                }
            }
            _ => {
                let xs = ldx_v::<U32, 2>(b, xa, 0);
                let dx = ldx::<F32>(b, da, 0);
                for (dec, &a) in decoded.iter().zip(sums) {
                    let Decoded::Q8 { q, d } = dec else { continue };
                    let isum = dot(b, q, &xs);
                    let sc = b.mul(*d, dx);
                    b.fma_acc(a, sc, isum);
                }
            }
        }
    }
}
