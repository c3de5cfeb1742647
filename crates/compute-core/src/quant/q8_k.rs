//! `Q8_K`: 256 values in 292 bytes, ggml's `block_q8_K`, the activation
//! format of ggml's k-quant dot products: an f32 scale `d`, 256 signed 8-bit
//! quants (value `i` decodes as `d·q[i]`), and the sum of each run of 16
//! quants as an i16 (so a dot product can subtract a k-quant's mins without
//! touching the quants again). All little-endian.

use super::{BlockFormat, nearest_int};
use crate::Result;

/// Values in one block.
pub const VALUES: usize = 256;
/// Bytes of one block.
pub const BYTES: usize = 292;

/// One `Q8_K` block, field for field as ggml stores it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8K {
    /// Scale (bytes 0–3).
    pub d: f32,
    /// Quants (bytes 4–259).
    pub qs: [i8; 256],
    /// `bsums[j]` = sum of `qs[16j..16j + 16]` (bytes 260–291).
    pub bsums: [i16; 16],
}

impl BlockQ8K {
    /// Reads a block from its 292 bytes. O(1), a copy.
    pub fn from_bytes(bytes: &[u8; BYTES]) -> Self {
        BlockQ8K {
            d: f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
            qs: std::array::from_fn(|i| bytes[4 + i] as i8),
            bsums: std::array::from_fn(|j| i16::from_le_bytes([bytes[260 + 2 * j], bytes[261 + 2 * j]])),
        }
    }

    /// The block's 292 bytes, as ggml stores them. O(1), a copy.
    pub fn to_bytes(&self) -> [u8; BYTES] {
        let mut out = [0u8; BYTES];
        out[..4].copy_from_slice(&self.d.to_le_bytes());
        for (o, &q) in out[4..260].iter_mut().zip(&self.qs) {
            *o = q as u8;
        }
        for (o, s) in out[260..].chunks_exact_mut(2).zip(&self.bsums) {
            o.copy_from_slice(&s.to_le_bytes());
        }
        out
    }
}

/// Quantizes 256 values as ggml's `quantize_row_q8_K_ref` does, bit for bit:
/// with `max` the value of largest magnitude (the first, on ties), each quant
/// is `min(127, nearest_int(x · (−127/max)))` and `d = 1/(−127/max)`. An
/// all-zero block gets `d = 0`, zero quants and zero sums (ggml leaves that
/// block's sums unwritten).
pub fn quantize_block(x: &[f32; VALUES]) -> BlockQ8K {
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax == 0.0 {
        return BlockQ8K { d: 0.0, qs: [0; 256], bsums: [0; 16] };
    }
    let iscale = -127.0 / max;
    let qs: [i8; 256] = std::array::from_fn(|i| nearest_int(iscale * x[i]).min(127) as i8);
    let bsums = std::array::from_fn(|j| qs[16 * j..16 * j + 16].iter().map(|&q| i16::from(q)).sum());
    BlockQ8K { d: 1.0 / iscale, qs, bsums }
}

/// Dequantizes one block as ggml's `dequantize_row_q8_K` does: `d·q`.
pub fn dequantize_block(block: &BlockQ8K, y: &mut [f32; VALUES]) {
    for (o, &q) in y.iter_mut().zip(&block.qs) {
        *o = block.d * f32::from(q);
    }
}

pub(super) fn quantize_bytes(x: &[f32; VALUES], out: &mut [u8; BYTES]) {
    *out = quantize_block(x).to_bytes();
}

pub(super) fn dequantize_bytes(bytes: &[u8; BYTES], y: &mut [f32; VALUES]) {
    dequantize_block(&BlockQ8K::from_bytes(bytes), y);
}

/// Quantizes a row (a multiple of 256 values) into `Q8_K` blocks, bit for bit
/// as ggml's `quantize_row_q8_K_ref`. `dst` must be exactly
/// `src.len() / 256 · 292` bytes; otherwise a [`crate::ComputeError::Shape`]
/// and nothing is written. O(n), a few flops a value.
pub fn quantize(src: &[f32], dst: &mut [u8]) -> Result<()> {
    super::quantize_rows(BlockFormat::Q8K, src, dst, quantize_bytes)
}

/// Dequantizes `Q8_K` blocks (a multiple of 292 bytes) into a row, bit for bit
/// as ggml's `dequantize_row_q8_K`. `dst` must hold exactly 256 values a block;
/// otherwise a [`crate::ComputeError::Shape`] and nothing is written. O(n),
/// one flop a value.
pub fn dequantize(src: &[u8], dst: &mut [f32]) -> Result<()> {
    super::dequantize_rows(BlockFormat::Q8K, src, dst, dequantize_bytes)
}
