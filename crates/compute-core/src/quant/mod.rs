//! GGML's block-quantized weight formats, byte for byte and bit for bit.
//!
//! Each format stores a fixed number of values (a *block*) in a fixed number of
//! bytes, exactly as ggml lays the block out in memory and in GGUF files
//! (little-endian, no padding):
//!
//! | format | values | bytes | layout (in byte order) |
//! |---|---|---|---|
//! | [`Q4_K`](q4_k) | 256 | 144 | `d: f16`, `dmin: f16`, `scales: [u8; 12]` (eight 6-bit scales and eight 6-bit mins), `qs: [u8; 128]` (4-bit quants) |
//! | [`Q5_K`](q5_k) | 256 | 176 | `d: f16`, `dmin: f16`, `scales: [u8; 12]`, `qh: [u8; 32]` (fifth bits), `qs: [u8; 128]` |
//! | [`Q6_K`](q6_k) | 256 | 210 | `ql: [u8; 128]` (low 4 bits), `qh: [u8; 64]` (high 2 bits), `scales: [i8; 16]`, `d: f16` (last) |
//! | [`Q8_0`](q8_0) | 32 | 34 | `d: f16`, `qs: [i8; 32]` |
//! | [`Q8_K`](q8_k) | 256 | 292 | `d: f32`, `qs: [i8; 256]`, `bsums: [i16; 16]` (sums of 16 quants) |
//!
//! [`quantize`](BlockFormat::quantize) reproduces ggml's reference quantizers
//! (`quantize_row_*_ref`, no importance matrix) bit for bit: the same searches
//! over scales and minimums, the same rounding of `d`/`dmin` to f16 before the
//! values are quantized again against them, ggml's `nearest_int` (round half
//! to even through the 1.5·2²³ trick; `Q8_0` uses `roundf`, half away from
//! zero, as ggml does), and no fused multiply-add anywhere.
//! [`dequantize`](BlockFormat::dequantize) reproduces ggml's `dequantize_row_*`
//! exactly; to f16 or bf16 it rounds that f32 once (to nearest, ties to even).
//! `tests/ggml_quants.rs` checks both against vectors written by ggml itself.
//!
//! ```
//! use compute_core::quant::BlockFormat;
//! let x: Vec<f32> = (0..512).map(|i| (i as f32 * 0.37).sin()).collect();
//! let q = BlockFormat::Q4K;
//! let mut blocks = vec![0u8; q.row_bytes(x.len())?];
//! q.quantize(&x, &mut blocks)?; // 2 blocks of 144 bytes
//! let mut y = vec![0f32; x.len()];
//! q.dequantize(&blocks, &mut y)?;
//! assert!(x.iter().zip(&y).all(|(a, b)| (a - b).abs() < 0.1));
//! // A row that is not a whole number of blocks is a typed error, never a panic.
//! assert!(q.quantize(&x[..300], &mut blocks).is_err());
//! # Ok::<(), compute_core::ComputeError>(())
//! ```
//!
//! Cost: quantizing is O(n) but the k-quant searches try 16 to 21 candidate
//! scales per group of 16 or 32 values (a few hundred flops a value);
//! dequantizing is one or two flops a value. Nothing allocates.

use std::fmt;

use half::{bf16, f16};

use crate::{ComputeError, Result};

pub mod q4_k;
pub mod q5_k;
pub mod q6_k;
pub mod q8_0;
pub mod q8_k;
mod search;

/// A GGML block format: how many values one block holds and how many bytes it
/// takes. Every method is O(1) except the row conversions, which are O(n).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BlockFormat {
    /// `Q4_K`: 256 values in 144 bytes (4.5 bits a value): eight groups of 32,
    /// each `x ≈ d·sc·q − dmin·m` with 4-bit `q` and 6-bit `sc`, `m`.
    Q4K,
    /// `Q5_K`: 256 values in 176 bytes (5.5 bits a value): as `Q4_K` with 5-bit quants.
    Q5K,
    /// `Q6_K`: 256 values in 210 bytes (6.5625 bits a value): sixteen groups of
    /// 16, each `x ≈ d·sc·q` with 6-bit signed `q` and 8-bit signed `sc`.
    Q6K,
    /// `Q8_0`: 32 values in 34 bytes (8.5 bits a value): `x ≈ d·q`, 8-bit `q`.
    Q8_0,
    /// `Q8_K`: 256 values in 292 bytes: `x ≈ d·q` with an f32 `d` and the sums
    /// of each 16 quants; the activation format of ggml's k-quant dot products.
    Q8K,
}

impl BlockFormat {
    /// Every format, in a fixed order (for tests and tables).
    pub const ALL: [BlockFormat; 5] =
        [BlockFormat::Q4K, BlockFormat::Q5K, BlockFormat::Q6K, BlockFormat::Q8_0, BlockFormat::Q8K];

    /// Values in one block (256, or 32 for `Q8_0`).
    pub const fn values_per_block(self) -> usize {
        match self {
            BlockFormat::Q4K => q4_k::VALUES,
            BlockFormat::Q5K => q5_k::VALUES,
            BlockFormat::Q6K => q6_k::VALUES,
            BlockFormat::Q8_0 => q8_0::VALUES,
            BlockFormat::Q8K => q8_k::VALUES,
        }
    }

    /// Bytes of one block, as ggml stores it.
    pub const fn bytes_per_block(self) -> usize {
        match self {
            BlockFormat::Q4K => q4_k::BYTES,
            BlockFormat::Q5K => q5_k::BYTES,
            BlockFormat::Q6K => q6_k::BYTES,
            BlockFormat::Q8_0 => q8_0::BYTES,
            BlockFormat::Q8K => q8_k::BYTES,
        }
    }

    /// ggml's name of the format (`q4_K`, `q5_K`, `q6_K`, `q8_0`, `q8_K`).
    pub const fn name(self) -> &'static str {
        match self {
            BlockFormat::Q4K => "q4_K",
            BlockFormat::Q5K => "q5_K",
            BlockFormat::Q6K => "q6_K",
            BlockFormat::Q8_0 => "q8_0",
            BlockFormat::Q8K => "q8_K",
        }
    }

    /// Blocks that hold `values` values; an error unless `values` is a
    /// multiple of [`values_per_block`](Self::values_per_block).
    pub fn blocks(self, values: usize) -> Result<usize> {
        let per = self.values_per_block();
        if !values.is_multiple_of(per) {
            return Err(ComputeError::shape(
                "quantize",
                format!("{self} rows hold a multiple of {per} values; got {values}"),
                format!("values=[{values}]"),
            ));
        }
        Ok(values / per)
    }

    /// Bytes of the blocks that hold `values` values; an error unless `values`
    /// is a multiple of [`values_per_block`](Self::values_per_block).
    pub fn row_bytes(self, values: usize) -> Result<usize> {
        Ok(self.blocks(values)? * self.bytes_per_block())
    }

    /// Quantizes `src` into `dst` as ggml's `quantize_row_*_ref` does, bit for
    /// bit. `src.len()` must be a multiple of the block's values and
    /// `dst.len()` exactly the blocks' bytes; otherwise a
    /// [`ComputeError::Shape`] and `dst` is untouched. O(n); see the module
    /// docs for the constant.
    pub fn quantize(self, src: &[f32], dst: &mut [u8]) -> Result<()> {
        match self {
            BlockFormat::Q4K => q4_k::quantize(src, dst),
            BlockFormat::Q5K => q5_k::quantize(src, dst),
            BlockFormat::Q6K => q6_k::quantize(src, dst),
            BlockFormat::Q8_0 => q8_0::quantize(src, dst),
            BlockFormat::Q8K => q8_k::quantize(src, dst),
        }
    }

    /// Dequantizes the blocks in `src` into `dst` as ggml's
    /// `dequantize_row_*` does, bit for bit. `src.len()` must be a multiple of
    /// the block's bytes and `dst.len()` exactly the values they hold;
    /// otherwise a [`ComputeError::Shape`] and `dst` is untouched. O(n), one
    /// or two flops a value.
    pub fn dequantize(self, src: &[u8], dst: &mut [f32]) -> Result<()> {
        match self {
            BlockFormat::Q4K => q4_k::dequantize(src, dst),
            BlockFormat::Q5K => q5_k::dequantize(src, dst),
            BlockFormat::Q6K => q6_k::dequantize(src, dst),
            BlockFormat::Q8_0 => q8_0::dequantize(src, dst),
            BlockFormat::Q8K => q8_k::dequantize(src, dst),
        }
    }

    /// As [`dequantize`](Self::dequantize), each f32 then rounded once to f16
    /// (to nearest, ties to even; past 65504 becomes ±∞). O(n).
    pub fn dequantize_f16(self, src: &[u8], dst: &mut [f16]) -> Result<()> {
        self.dequantize_map(src, dst, f16::from_f32)
    }

    /// As [`dequantize`](Self::dequantize), each f32 then rounded once to bf16
    /// (to nearest, ties to even). O(n).
    pub fn dequantize_bf16(self, src: &[u8], dst: &mut [bf16]) -> Result<()> {
        self.dequantize_map(src, dst, bf16::from_f32)
    }

    fn dequantize_map<T>(self, src: &[u8], dst: &mut [T], round: fn(f32) -> T) -> Result<()> {
        match self {
            BlockFormat::Q4K => dequantize_rows_map(self, src, dst, q4_k::dequantize_bytes, round),
            BlockFormat::Q5K => dequantize_rows_map(self, src, dst, q5_k::dequantize_bytes, round),
            BlockFormat::Q6K => dequantize_rows_map(self, src, dst, q6_k::dequantize_bytes, round),
            BlockFormat::Q8_0 => dequantize_rows_map(self, src, dst, q8_0::dequantize_bytes, round),
            BlockFormat::Q8K => dequantize_rows_map(self, src, dst, q8_k::dequantize_bytes, round),
        }
    }
}

impl fmt::Display for BlockFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// ggml's `nearest_int`: `x` rounded to the nearest integer, ties to even, by
/// adding 1.5·2²³ and reading the low mantissa bits. Exact for
/// `|x| ≤ 4194303`; beyond that (or for NaN) it returns what ggml's release
/// build returns, a wrapped value, and never panics.
#[inline(always)]
pub(crate) fn nearest_int(x: f32) -> i32 {
    let biased = x + 12_582_912.0;
    (biased.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// Checks that `src_len` f32 values fill whole blocks of `N` values and that
/// `dst_len` bytes are exactly their blocks of `B` bytes.
fn check_quantize<const N: usize, const B: usize>(format: BlockFormat, src_len: usize, dst_len: usize) -> Result<()> {
    let shapes = || format!("src=[{src_len}] f32, dst=[{dst_len}] bytes, {format}");
    if !src_len.is_multiple_of(N) {
        return Err(ComputeError::shape(
            "quantize",
            format!("{format} rows hold a multiple of {N} values; got {src_len}"),
            shapes(),
        ));
    }
    let want = src_len / N * B;
    if dst_len != want {
        return Err(ComputeError::shape(
            "quantize",
            format!("{} blocks of {format} take {want} bytes; dst has {dst_len}", src_len / N),
            shapes(),
        ));
    }
    Ok(())
}

/// Checks that `src_len` bytes are whole blocks of `B` bytes and that
/// `dst_len` is exactly the `N` values of each.
fn check_dequantize<const N: usize, const B: usize>(format: BlockFormat, src_len: usize, dst_len: usize) -> Result<()> {
    let shapes = || format!("src=[{src_len}] bytes, dst=[{dst_len}], {format}");
    if !src_len.is_multiple_of(B) {
        return Err(ComputeError::shape(
            "dequantize",
            format!("{format} blocks are {B} bytes; src has {src_len}, not a multiple"),
            shapes(),
        ));
    }
    let want = src_len / B * N;
    if dst_len != want {
        return Err(ComputeError::shape(
            "dequantize",
            format!("{} blocks of {format} hold {want} values; dst has {dst_len}", src_len / B),
            shapes(),
        ));
    }
    Ok(())
}

/// Validates the lengths, then quantizes block by block with `block`.
fn quantize_rows<const N: usize, const B: usize>(
    format: BlockFormat,
    src: &[f32],
    dst: &mut [u8],
    block: fn(&[f32; N], &mut [u8; B]),
) -> Result<()> {
    check_quantize::<N, B>(format, src.len(), dst.len())?;
    let (xs, _) = src.as_chunks::<N>();
    let (ys, _) = dst.as_chunks_mut::<B>();
    for (x, y) in xs.iter().zip(ys) {
        block(x, y);
    }
    Ok(())
}

/// Validates the lengths, then dequantizes block by block with `block`,
/// straight into `dst`.
fn dequantize_rows<const N: usize, const B: usize>(
    format: BlockFormat,
    src: &[u8],
    dst: &mut [f32],
    block: fn(&[u8; B], &mut [f32; N]),
) -> Result<()> {
    check_dequantize::<N, B>(format, src.len(), dst.len())?;
    let (xs, _) = src.as_chunks::<B>();
    let (ys, _) = dst.as_chunks_mut::<N>();
    for (x, y) in xs.iter().zip(ys) {
        block(x, y);
    }
    Ok(())
}

/// As [`dequantize_rows`], through an f32 block on the stack and `round`.
fn dequantize_rows_map<const N: usize, const B: usize, T>(
    format: BlockFormat,
    src: &[u8],
    dst: &mut [T],
    block: fn(&[u8; B], &mut [f32; N]),
    round: fn(f32) -> T,
) -> Result<()> {
    check_dequantize::<N, B>(format, src.len(), dst.len())?;
    let (xs, _) = src.as_chunks::<B>();
    let (ys, _) = dst.as_chunks_mut::<N>();
    let mut tmp = [0f32; N];
    for (x, y) in xs.iter().zip(ys) {
        block(x, &mut tmp);
        for (o, &v) in y.iter_mut().zip(&tmp) {
            *o = round(v);
        }
    }
    Ok(())
}

/// Unpacks the eight 6-bit scales and eight 6-bit mins of a `Q4_K`/`Q5_K`
/// block (ggml's `get_scale_min_k4` for `j` in 0..8). Groups 0–3 keep their
/// scale and min in the low 6 bits of bytes 0–3 and 4–7; groups 4–7 keep their
/// low 4 bits in bytes 8–11 (scale low nibble, min high nibble) and their top
/// 2 bits in the top 2 bits of bytes 0–3 (scales) and 4–7 (mins). O(1).
pub fn unpack_scales_k4(packed: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let mut scales = [0u8; 8];
    let mut mins = [0u8; 8];
    for j in 0..4 {
        scales[j] = packed[j] & 63;
        mins[j] = packed[j + 4] & 63;
        scales[j + 4] = (packed[j + 8] & 0x0f) | ((packed[j] >> 6) << 4);
        mins[j + 4] = (packed[j + 8] >> 4) | ((packed[j + 4] >> 6) << 4);
    }
    (scales, mins)
}

/// Packs eight 6-bit scales and mins the way [`unpack_scales_k4`] reads them;
/// bits above the sixth are dropped. O(1).
pub fn pack_scales_k4(scales: &[u8; 8], mins: &[u8; 8]) -> [u8; 12] {
    let mut packed = [0u8; 12];
    for j in 0..4 {
        let (s_lo, m_lo) = (scales[j] & 63, mins[j] & 63);
        let (s_hi, m_hi) = (scales[j + 4] & 63, mins[j + 4] & 63);
        packed[j] = s_lo | ((s_hi >> 4) << 6);
        packed[j + 4] = m_lo | ((m_hi >> 4) << 6);
        packed[j + 8] = (s_hi & 0x0f) | ((m_hi & 0x0f) << 4);
    }
    packed
}

#[cfg(test)]
mod tests;
