//! Matrix products with GGML block-quantized weights, on raw blocks:
//! `y = x·Wᵀ` for `f32` activations `x` (`m × k`) and a weight `W` stored as
//! `n` rows of `k` values in `Q4_K`, `Q5_K`, `Q6_K` or `Q8_0` blocks (ggml's
//! layouts), the way GGUF files keep a linear layer's weight.
//!
//! Each row of `x` is first quantized per 256 values to 8-bit integers with
//! one `f32` scale ([`Q8Row`], as ggml's `Q8_K` does); each output is then a
//! sum over blocks of exact integer dot products, scaled once per block
//! (`Q4_K`, `Q5_K`: `dx·(d·Σ_s sc_s·Σ_i q_i·x_i − dmin·Σ_s m_s·Σ_i x_i)` over
//! sub-blocks of 32; `Q6_K`: `dx·d·Σ_g sc_g·Σ_i q_i·x_i` over groups of 16
//! with signed scales; `Q8_0`: `dx·Σ_p d_p·Σ_i q_i·x_i` over blocks of 32).
//!
//! The integer part is exact, so the result differs from the product with
//! the dequantized weights only by the activations' rounding (at most
//! `dx/2` per value, `dx = max|x|/127` over each 256 values) and the `f32`
//! rounding of the per-block terms.
//!
//! Three paths compute exactly the same thing, bit for bit: on a CPU with
//! AVX-512 VNNI, kernels on `vpdpbusd` (module `vnni`); on one with AVX2
//! (and F16C) but not VNNI, kernels on `vpmaddubsw` and `vpmaddwd` (module
//! `avx2`); elsewhere a scalar loop (module `scalar`). All compute the same
//! integers and then the same `f32` operations in the same order.
//! [`kernel_for`] names the path a given [`Isa`] takes.
//!
//! How the work is shared: the activation rows go in panels of at most
//! [`PANEL_ROWS`]; weight rows go [`WEIGHT_ROWS`] at a time through each
//! panel, in pairs. Each weight block is decoded once per panel into the
//! activations' order and multiplied by every row of the panel, each
//! activation load serving both weight rows of a pair; the sub-block scales
//! are applied to 16-bit integer sums by `vpmaddwd`, the minimum terms come
//! from the rows' sub-block sums by one more, and the `f32` scaling costs
//! three multiplies per row, pair and two blocks. Module `vnni` describes the
//! layout. A GEMV (`m = 1`) reads each weight byte once, prefetched ahead:
//! it is bound by memory bandwidth.
//!
//! Weight rows are split over the threads of the pool in scope above
//! [`PAR_GEMM_MIN_MACS`] multiply-adds; the activation rows are quantized in
//! parallel too.

mod avx2;
pub mod ops;
mod scalar;
#[cfg(target_arch = "x86_64")]
mod stream;
mod vnni;

use compute_core::ComputeError;

use crate::isa::Isa;
use crate::kernels::{fork, par};
use crate::tuning::PAR_GEMM_MIN_MACS;

/// Values per quantized activation block and per `Q4_K`, `Q5_K` and `Q6_K`
/// weight block (256); `k` must be a multiple of it for every format.
pub const Q4K_VALUES: usize = compute_core::quant::q4_k::VALUES;
/// Bytes per `Q4_K` block (144): `d`, `dmin` (f16 each), 12 bytes of packed
/// 6-bit scales and mins, 128 bytes of 4-bit quants.
pub const Q4K_BYTES: usize = compute_core::quant::q4_k::BYTES;
/// Bytes per `Q5_K` block of 256 values (176): as `Q4_K`, with 32 bytes of
/// fifth bits between the scales and the 4-bit quants.
pub const Q5K_BYTES: usize = compute_core::quant::q5_k::BYTES;
/// Bytes per `Q6_K` block of 256 values (210): 128 bytes of low 4 bits, 64
/// of high 2 bits, 16 signed 8-bit scales, `d` (f16) last.
pub const Q6K_BYTES: usize = compute_core::quant::q6_k::BYTES;
/// Bytes per `Q8_0` block of 32 values (34): `d` (f16), 32 signed 8-bit
/// quants; 256 values take eight blocks, 272 bytes.
pub const Q8_0_BYTES: usize = compute_core::quant::q8_0::BYTES;

/// Activation rows one pass over the weight serves: a call with more rows
/// makes `m.div_ceil(PANEL_ROWS)` passes, each decoding every weight block
/// once. A step of 32 rows' activations (two blocks each, 16 KiB) stays in
/// the L1 cache while [`WEIGHT_ROWS`] weight rows use it.
pub const PANEL_ROWS: usize = 32;

/// Activation values above which the rows are quantized in parallel.
const PAR_QUANTIZE_MIN: usize = 1 << 14;

/// Blocks of 256 values the kernels take per step.
const STEP_BLOCKS: usize = 2;

/// Weight rows one kernel call takes, in pairs: each step of a panel's
/// activations is read from L2 once and then from L1 by the other pairs.
pub const WEIGHT_ROWS: usize = 8;

/// One row of activations quantized per 256 values: `x ≈ d[b]·q[i]` for `i`
/// in block `b`, with the sum of each 32 consecutive `q` kept for the
/// weights' minimum terms.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Q8Row {
    /// The quantized values, in `[-127, 127]`, in the kernels' order
    /// ([`value_offset`]).
    q: Vec<i8>,
    /// One scale per 256 values: `max|x|/127` (0 for an all-zero block, NaN
    /// when the block holds a NaN or an infinity, so the products are NaN).
    d: Vec<f32>,
    /// `Σ q` over each 32 consecutive values (8 per block).
    sums: Vec<i32>,
}

impl Q8Row {
    /// Quantizes `x` (its length a multiple of 256; a shorter tail is
    /// dropped): round to nearest, ties to even. One pass over `x` (a few
    /// cycles per 8 values), and `x.len()` bytes plus a little allocated.
    pub fn quantize(x: &[f32]) -> Q8Row {
        /// Adding and subtracting 1.5·2²³ rounds to an integer, ties to even,
        /// for `|t| < 2²²` (ggml's `nearest_int`); here `|t| ≤ 127`.
        const ROUND: f32 = 12_582_912.0;
        let blocks = x.len() / Q4K_VALUES;
        let mut row = Q8Row {
            q: vec![0; blocks * Q4K_VALUES],
            d: Vec::with_capacity(blocks),
            sums: Vec::with_capacity(blocks * 8),
        };
        for (block, dst) in x.chunks_exact(Q4K_VALUES).zip(row.q.chunks_exact_mut(Q4K_VALUES)) {
            // The largest |x| by its bits (a NaN or an infinity compares
            // above every finite value), in a loop the compiler vectorises.
            let top = block.iter().fold(0u32, |m, v| m.max(v.to_bits() & 0x7fff_ffff));
            let (d, inv) = match (top >= 0x7f80_0000, top > 0) {
                (true, _) => (f32::NAN, 0.0),
                (false, false) => (0.0, 0.0),
                (false, true) => {
                    let amax = f32::from_bits(top);
                    (amax / 127.0, 127.0 / amax)
                }
            };
            row.d.push(d);
            let mut q = [0i8; Q4K_VALUES];
            for (o, &v) in q.iter_mut().zip(block) {
                *o = ((v * inv + ROUND) - ROUND).clamp(-127.0, 127.0) as i8;
            }
            for (sub, qs) in q.chunks_exact(32).enumerate() {
                row.sums.push(qs.iter().map(|&v| i32::from(v)).sum());
                for (c, piece) in qs.chunks_exact(8).enumerate() {
                    if let Some(out) = dst.get_mut(64 * c + 8 * sub..64 * c + 8 * sub + 8) {
                        out.copy_from_slice(piece);
                    }
                }
            }
        }
        row
    }

    /// Blocks of 256 values held.
    pub fn blocks(&self) -> usize {
        self.d.len()
    }

    /// The quantized values, in `[-127, 127]` (`256·blocks()` of them), in
    /// the kernels' order: value `i` of block `b` is at `256·b +`
    /// [`value_offset`]`(i)`.
    pub fn values(&self) -> &[i8] {
        &self.q
    }

    /// One scale per block: `max|x|/127` (0 for an all-zero block, NaN when
    /// the block holds a NaN or an infinity, so every product with it is NaN).
    pub fn scales(&self) -> &[f32] {
        &self.d
    }

    /// Value `i` (0..256) of block `b`, or 0 past the end. O(1).
    #[inline]
    fn value(&self, b: usize, i: usize) -> i32 {
        self.q.get(b * Q4K_VALUES + value_offset(i)).map_or(0, |&v| i32::from(v))
    }
}

/// Where value `i` (0..256) of a block sits in [`Q8Row::values`] (relative to
/// the block's start). A block is four chunks of 64 bytes; chunk `c` holds,
/// for each sub-block `s` of 32 values, its values `8c..8c+8` at bytes
/// `8s..8s+8`: so in every chunk the 4-byte lanes `2s` and `2s+1` belong to
/// sub-block `s`, and a `vpdpbusd` over the four chunks sums each sub-block
/// into the same two lanes. O(1).
#[inline(always)]
pub fn value_offset(i: usize) -> usize {
    let (s, r) = (i / 32 % 8, i % 32);
    64 * (r / 8) + 8 * s + r % 8
}

/// Whether this CPU runs the `vpdpbusd` kernels (AVX-512 F, BW and VNNI, and
/// F16C). Costs four atomic loads after the first call.
pub fn has_vnni() -> bool {
    vnni::available()
}

/// Whether this CPU runs the AVX2 kernels (AVX2 and F16C): the path of
/// [`Isa::Avx2`], and of [`Isa::Avx512`] on a CPU without VNNI. Costs two
/// atomic loads after the first call.
pub fn has_avx2_kernels() -> bool {
    avx2::available()
}

/// The kernels [`matmul_with`] runs for `isa` on this CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// `vpdpbusd` on 512-bit vectors (AVX-512 F, BW, VNNI and F16C).
    Vnni,
    /// `vpmaddubsw` and `vpmaddwd` on 256-bit vectors (AVX2 and F16C).
    Avx2,
    /// The portable scalar loop (8 to 20 times slower than the VNNI kernels).
    Scalar,
}

impl Kernel {
    /// Lower-case name (`vnni`, `avx2`, `scalar`), as the benchmarks print it.
    pub fn as_str(self) -> &'static str {
        match self {
            Kernel::Vnni => "vnni",
            Kernel::Avx2 => "avx2",
            Kernel::Scalar => "scalar",
        }
    }
}

/// The kernels [`matmul_with`] runs for `isa` on this CPU: VNNI where `isa`
/// is [`Isa::Avx512`] and the CPU has it, else AVX2 where `isa` is
/// [`Isa::Avx2`] or [`Isa::Avx512`] and the CPU has AVX2 and F16C, else the
/// scalar loop. `COMPUTE_SIMD_ISA=avx2` (see [`Isa::detect`]) makes
/// [`matmul`] take the AVX2 kernels on a CPU that also has VNNI. A few
/// atomic loads.
pub fn kernel_for(isa: Isa) -> Kernel {
    if isa == Isa::Avx512 && vnni::available() {
        Kernel::Vnni
    } else if matches!(isa, Isa::Avx2 | Isa::Avx512) && avx2::available() {
        Kernel::Avx2
    } else {
        Kernel::Scalar
    }
}

/// The block formats whose products this module computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Weights {
    /// `Q4_K`: 144 bytes per 256 values.
    Q4K,
    /// `Q5_K`: 176 bytes per 256 values.
    Q5K,
    /// `Q6_K`: 210 bytes per 256 values.
    Q6K,
    /// `Q8_0`: 34 bytes per 32 values (272 per 256).
    Q8_0,
}

impl Weights {
    /// Bytes of 256 values of a weight row: one block, or eight `Q8_0`
    /// blocks. O(1).
    pub fn block_bytes(self) -> usize {
        match self {
            Weights::Q4K => Q4K_BYTES,
            Weights::Q5K => Q5K_BYTES,
            Weights::Q6K => Q6K_BYTES,
            Weights::Q8_0 => 8 * Q8_0_BYTES,
        }
    }

    /// ggml's name of the format (`q4_k`, `q5_k`, `q6_k`, `q8_0`). O(1).
    pub fn name(self) -> &'static str {
        match self {
            Weights::Q4K => "q4_k",
            Weights::Q5K => "q5_k",
            Weights::Q6K => "q6_k",
            Weights::Q8_0 => "q8_0",
        }
    }

    /// Whether the format has minimum terms (`dmin·m`).
    fn has_mins(self) -> bool {
        matches!(self, Weights::Q4K | Weights::Q5K)
    }

    /// Whether the kernels take the activations as unsigned bytes `x + 128`
    /// (the formats whose weights are signed).
    fn unsigned_activations(self) -> bool {
        matches!(self, Weights::Q6K | Weights::Q8_0)
    }
}

/// Activation rows (at most [`PANEL_ROWS`]) prepared for one format's
/// kernels: the tables both paths read, built once per call and panel.
pub(crate) struct Panel<'a> {
    /// The rows, each of `blocks` blocks.
    rows: Vec<&'a Q8Row>,
    /// Blocks of 256 values per row.
    blocks: usize,
    /// Steps of [`STEP_BLOCKS`] blocks (the last one padded).
    steps: usize,
    /// The values, step by step (`steps × rows × 512` bytes):
    /// `x` as bytes for `Q4_K` and `Q5_K`, `x + 128` (`x ^ 0x80`) for `Q6_K`
    /// and `Q8_0`; padding blocks hold `x = 0`.
    x: Vec<u8>,
    /// The scalar path's copy of the values in their natural order, widened
    /// (`rows × 256·blocks`); empty on the vector paths.
    natural: Vec<i16>,
    /// Per step and row, four activation scales: `dx` of blocks
    /// `2s, 2s, 2s+1, 2s+1`; 0 past the last block.
    xv: Vec<f32>,
    /// `Q4_K` and `Q5_K`: per step and row, 16 words of sub-block sums:
    /// word `4k + 2i + e` holds the sums of sub-blocks `2k` (low 16 bits)
    /// and `2k + 1` (high) of block `2s + i` (the same for both `e`).
    sums: Vec<i32>,
}

impl<'a> Panel<'a> {
    /// Whether a vector kernel may run `jn` weight rows `w` of `format`
    /// against this panel into `out` with `scratch` accumulators: every
    /// length the kernels read or write is there. Free.
    fn fits(&self, format: Weights, w: &[u8], jn: usize, scratch: &[f32], out: &[f32]) -> bool {
        let (rows, blocks) = (self.rows.len(), self.blocks);
        (1..=PANEL_ROWS).contains(&rows)
            && blocks > 0
            && jn > 0
            && self.steps == blocks.div_ceil(STEP_BLOCKS)
            && w.len() >= jn.saturating_mul(blocks).saturating_mul(format.block_bytes())
            && self.x.len() >= self.steps * rows * STEP_BLOCKS * Q4K_VALUES
            && self.xv.len() >= self.steps * rows * 4
            && (!format.has_mins() || self.sums.len() >= self.steps * rows * 16)
            && scratch.len() >= self.scratch(jn)
            && out.len() >= jn * rows
    }

    /// Builds the tables for `rows` (all of `blocks` blocks), and for the
    /// scalar path (`scalar`) a natural-order copy of the values. Costs
    /// `O(rows·blocks)` and a copy of the values.
    fn new(format: Weights, rows: &[&'a Q8Row], blocks: usize, scalar: bool) -> Panel<'a> {
        let n = rows.len();
        let per = STEP_BLOCKS;
        let steps = blocks.div_ceil(per);
        let dx = |r: &Q8Row, b: usize| if b < blocks { r.d.get(b).copied().unwrap_or(0.0) } else { 0.0 };
        let mut xv = Vec::with_capacity(steps * n * 4);
        let flip = if format.unsigned_activations() { 0x80 } else { 0 };
        let step_bytes = per * Q4K_VALUES;
        let mut x = vec![flip; steps * n * step_bytes];
        for s in 0..steps {
            for (i, r) in rows.iter().enumerate() {
                xv.extend((0..4).map(|t| dx(r, 2 * s + t / 2)));
                let from = (per * s * Q4K_VALUES).min(r.q.len());
                let src = r.q.get(from..(per * (s + 1) * Q4K_VALUES).min(r.q.len())).unwrap_or_default();
                if let Some(dst) = x.get_mut((s * n + i) * step_bytes..) {
                    for (o, &v) in dst.iter_mut().zip(src) {
                        *o = v as u8 ^ flip;
                    }
                }
            }
        }
        let mut sums = Vec::new();
        if format.has_mins() {
            sums.reserve(steps * n * 16);
            for s in 0..steps {
                for r in rows {
                    sums.extend((0..16).map(|l| {
                        let (k, b) = (l / 4, per * s + l % 4 / 2);
                        let sum = |i: usize| {
                            if b < blocks { r.sums.get(8 * b + i).map_or(0, |&v| v as i16 as u16 as u32) } else { 0 }
                        };
                        (sum(2 * k) | (sum(2 * k + 1) << 16)) as i32
                    }));
                }
            }
        }
        let natural = if scalar {
            rows.iter()
                .flat_map(|r| (0..blocks * Q4K_VALUES).map(|i| r.value(i / Q4K_VALUES, i % Q4K_VALUES) as i16))
                .collect()
        } else {
            Vec::new()
        };
        Panel { rows: rows.to_vec(), blocks, steps, x, natural, xv, sums }
    }

    /// Scratch values a kernel call for `jn` weight rows needs: 16
    /// accumulator lanes per row and pair of weight rows.
    fn scratch(&self, jn: usize) -> usize {
        16 * jn.div_ceil(2) * self.rows.len()
    }
}

/// The sums of the even and of the odd lanes of 16 (a pair of weight rows'
/// accumulators), in a fixed order (lanes `i` and `i + 8`, then `i + 4`,
/// then `i + 2`): the reduction both paths end with.
#[inline]
fn tree16(v: &[f32]) -> (f32, f32) {
    let mut a = [0.0f32; 16];
    for (o, &x) in a.iter_mut().zip(v) {
        *o = x;
    }
    for half in [8, 4, 2] {
        for i in 0..half {
            a[i] += a[i + half];
        }
    }
    (a[0], a[1])
}

/// [`matmul`] with `Q4_K` weights: same errors and costs.
pub fn matmul_q4k(x: &[f32], w: &[u8], shape: (usize, usize, usize), y: &mut [f32]) -> Result<(), ComputeError> {
    matmul(Weights::Q4K, x, w, shape, y)
}

/// `y[i][j] = Σₚ x[i][p]·W[j][p]` for `x` (`m × k` `f32`, row-major), `W`
/// (`n` rows of `k/256` blocks of 256 values of `format`, [`Weights::block_bytes`]
/// each) and `y` (`m × n`, overwritten), on the fastest path this CPU has
/// ([`matmul_with`] on [`Isa::detect`]).
///
/// Errors, having written nothing: [`ComputeError::Shape`] when `k` is not a
/// positive multiple of 256, a slice is shorter than the shapes need, or the
/// shapes overflow.
///
/// Costs one quantization pass over `x` (and `m·k` bytes), then `m·n·k`
/// 8-bit multiply-adds; each weight byte is read once per panel of
/// [`PANEL_ROWS`] activation rows, and weight rows are split over the pool's
/// threads above [`PAR_GEMM_MIN_MACS`].
pub fn matmul(
    format: Weights,
    x: &[f32],
    w: &[u8],
    shape: (usize, usize, usize),
    y: &mut [f32],
) -> Result<(), ComputeError> {
    matmul_with(Isa::detect(), format, x, w, shape, y)
}

/// [`matmul`] on the path `isa` allows ([`kernel_for`]): the VNNI kernels
/// where `isa` is [`Isa::Avx512`] and the CPU has AVX-512 VNNI
/// ([`has_vnni`]), else the AVX2 kernels where `isa` is [`Isa::Avx2`] or
/// [`Isa::Avx512`] and the CPU has AVX2 and F16C ([`has_avx2_kernels`]),
/// else the scalar loop. All give the same bits. Same errors and costs as
/// [`matmul`]; the scalar loop runs 8 (GEMV) to 20 (batches) times slower
/// than the VNNI kernels on the development machine.
pub fn matmul_with(
    isa: Isa,
    format: Weights,
    x: &[f32],
    w: &[u8],
    (m, k, n): (usize, usize, usize),
    y: &mut [f32],
) -> Result<(), ComputeError> {
    let op = "quantized matmul";
    let y_len = y.len();
    let shapes = || {
        format!(
            "x=[{m}x{k}] f32 ({} values), w=[{n}x{k}] {} ({} bytes), y=[{m}x{n}] ({} values)",
            x.len(),
            format.name(),
            w.len(),
            y_len
        )
    };
    if k == 0 || !k.is_multiple_of(Q4K_VALUES) {
        return Err(ComputeError::shape(op, format!("k = {k} is not a positive multiple of 256"), shapes()));
    }
    let blocks = k / Q4K_VALUES;
    let row_bytes = blocks * format.block_bytes();
    let need = |rows: usize, cols: usize| rows.checked_mul(cols);
    let (Some(x_need), Some(w_need), Some(y_need)) = (need(m, k), need(n, row_bytes), need(m, n)) else {
        return Err(ComputeError::shape(op, "the shapes overflow usize", shapes()));
    };
    for (what, len, want) in [("x", x.len(), x_need), ("w", w.len(), w_need), ("y", y_len, y_need)] {
        if len < want {
            return Err(ComputeError::shape(op, format!("{what} holds {len}, the shapes need {want}"), shapes()));
        }
    }
    let Some(y) = y.get_mut(..y_need) else {
        return Err(ComputeError::shape(op, "output too short", shapes()));
    };
    if m == 0 || n == 0 {
        return Ok(());
    }
    let kernel = kernel_for(isa);
    let xs: Vec<Q8Row> = if m.saturating_mul(k) >= PAR_QUANTIZE_MIN {
        fork::map(m, |i| Q8Row::quantize(x.get(i * k..(i + 1) * k).unwrap_or_default()))
    } else {
        x.chunks_exact(k).take(m).map(Q8Row::quantize).collect()
    };
    let refs: Vec<&Q8Row> = xs.iter().collect();
    let panels: Vec<Panel<'_>> =
        refs.chunks(PANEL_ROWS).map(|rows| Panel::new(format, rows, blocks, kernel == Kernel::Scalar)).collect();
    let threads = if m.saturating_mul(n).saturating_mul(k) < PAR_GEMM_MIN_MACS { 1 } else { par::threads() };
    // Pieces of weight rows; each piece takes its rows `WEIGHT_ROWS` at a
    // time through every panel (those rows' bytes stay in cache while the
    // panels pass) into its own `m × cols` part, copied into `y` at the end.
    let piece = n.div_ceil(threads * 4).next_multiple_of(WEIGHT_ROWS);
    let parts = fork::map(n.div_ceil(piece), |p| {
        let cols = piece.min(n - p * piece);
        let mut out = vec![0.0f32; m * cols];
        let mut scratch = vec![0.0f32; panels.first().map_or(0, |q| q.scratch(WEIGHT_ROWS))];
        let mut ys = [0.0f32; WEIGHT_ROWS * PANEL_ROWS];
        for j0 in (0..cols).step_by(WEIGHT_ROWS) {
            let jn = WEIGHT_ROWS.min(cols - j0);
            let first = p * piece + j0;
            let wj = w.get(first * row_bytes..(first + jn) * row_bytes).unwrap_or_default();
            for (pi, panel) in panels.iter().enumerate() {
                let rows = panel.rows.len();
                let done = match kernel {
                    Kernel::Vnni => vnni::run(format, wj, jn, panel, &mut scratch, &mut ys),
                    Kernel::Avx2 => avx2::run(format, wj, jn, panel, &mut scratch, &mut ys),
                    Kernel::Scalar => false,
                };
                if !done {
                    scalar::run(format, wj, jn, panel, &mut scratch, &mut ys);
                }
                for (jj, yj) in ys.chunks_exact(rows).take(jn).enumerate() {
                    for (r, &v) in yj.iter().enumerate() {
                        if let Some(o) = out.get_mut((pi * PANEL_ROWS + r) * cols + j0 + jj) {
                            *o = v;
                        }
                    }
                }
            }
        }
        out
    });
    for (p, part) in parts.iter().enumerate() {
        let cols = piece.min(n - p * piece);
        for (i, row) in part.chunks_exact(cols).enumerate() {
            if let Some(dst) = y.get_mut(i * n + p * piece..i * n + p * piece + cols) {
                dst.copy_from_slice(row);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
