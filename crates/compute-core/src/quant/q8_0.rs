//! `Q8_0`: 32 values in 34 bytes, ggml's `block_q8_0`: an f16 scale `d`, then
//! 32 signed 8-bit quants; value `i` decodes as `q[i]·d`.

use half::f16;

use super::BlockFormat;
use crate::Result;

/// Values in one block.
pub const VALUES: usize = 32;
/// Bytes of one block.
pub const BYTES: usize = 34;

/// One `Q8_0` block, field for field as ggml stores it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8_0 {
    /// Scale (bytes 0–1).
    pub d: f16,
    /// Quants (bytes 2–33).
    pub qs: [i8; 32],
}

impl BlockQ8_0 {
    /// Reads a block from its 34 bytes. O(1), a copy.
    pub fn from_bytes(bytes: &[u8; BYTES]) -> Self {
        BlockQ8_0 { d: f16::from_le_bytes([bytes[0], bytes[1]]), qs: std::array::from_fn(|i| bytes[2 + i] as i8) }
    }

    /// The block's 34 bytes, as ggml stores them. O(1), a copy.
    pub fn to_bytes(&self) -> [u8; BYTES] {
        let mut out = [0u8; BYTES];
        out[..2].copy_from_slice(&self.d.to_le_bytes());
        for (o, &q) in out[2..].iter_mut().zip(&self.qs) {
            *o = q as u8;
        }
        out
    }
}

/// Quantizes 32 values as ggml's `quantize_row_q8_0_ref` does, bit for bit:
/// `d = max|x| / 127` (in f32), stored rounded to f16, and each quant
/// `round(x · (1/d))` with the unrounded `d` and `roundf`'s ties away from
/// zero. An all-zero block gets `d = 0` and zero quants.
pub fn quantize_block(x: &[f32; VALUES]) -> BlockQ8_0 {
    let mut amax = 0.0f32;
    for &v in x {
        // ggml's MAX(amax, fabsf(v)): keeps amax unless it is not larger.
        amax = if amax > v.abs() { amax } else { v.abs() };
    }
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    BlockQ8_0 { d: f16::from_f32(d), qs: std::array::from_fn(|i| (x[i] * id).round() as i8) }
}

/// Dequantizes one block as ggml's `dequantize_row_q8_0` does: `q·d`.
pub fn dequantize_block(block: &BlockQ8_0, y: &mut [f32; VALUES]) {
    let d = block.d.to_f32();
    for (o, &q) in y.iter_mut().zip(&block.qs) {
        *o = f32::from(q) * d;
    }
}

pub(super) fn quantize_bytes(x: &[f32; VALUES], out: &mut [u8; BYTES]) {
    *out = quantize_block(x).to_bytes();
}

pub(super) fn dequantize_bytes(bytes: &[u8; BYTES], y: &mut [f32; VALUES]) {
    dequantize_block(&BlockQ8_0::from_bytes(bytes), y);
}

/// Quantizes a row (a multiple of 32 values) into `Q8_0` blocks, bit for bit
/// as ggml's `quantize_row_q8_0_ref`. `dst` must be exactly
/// `src.len() / 32 · 34` bytes; otherwise a [`crate::ComputeError::Shape`] and
/// nothing is written. O(n), a few flops a value.
pub fn quantize(src: &[f32], dst: &mut [u8]) -> Result<()> {
    super::quantize_rows(BlockFormat::Q8_0, src, dst, quantize_bytes)
}

/// Dequantizes `Q8_0` blocks (a multiple of 34 bytes) into a row, bit for bit
/// as ggml's `dequantize_row_q8_0`. `dst` must hold exactly 32 values a block;
/// otherwise a [`crate::ComputeError::Shape`] and nothing is written. O(n),
/// one flop a value.
pub fn dequantize(src: &[u8], dst: &mut [f32]) -> Result<()> {
    super::dequantize_rows(BlockFormat::Q8_0, src, dst, dequantize_bytes)
}
