//! `Q4_K`: 256 values in 144 bytes, ggml's `block_q4_K`.
//!
//! Eight groups of 32 values; group `j` decodes as `d·sc[j]·q − dmin·m[j]`
//! with 4-bit quants `q` and 6-bit `sc`, `m` (see [`unpack_scales_k4`]).
//! Quants are stored in four runs of 32 bytes: byte `l` of run `r` holds value
//! `64r + l` in its low nibble and value `64r + 32 + l` in its high nibble.

use half::f16;

use super::search::affine_k_block;
use super::{BlockFormat, unpack_scales_k4};
use crate::Result;

/// Values in one block.
pub const VALUES: usize = 256;
/// Bytes of one block.
pub const BYTES: usize = 144;

/// One `Q4_K` block, field for field as ggml stores it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ4K {
    /// Super-block scale of the 6-bit group scales (bytes 0–1).
    pub d: f16,
    /// Super-block scale of the 6-bit group mins (bytes 2–3).
    pub dmin: f16,
    /// Packed group scales and mins (bytes 4–15), see [`unpack_scales_k4`].
    pub scales: [u8; 12],
    /// 4-bit quants (bytes 16–143).
    pub qs: [u8; 128],
}

impl BlockQ4K {
    /// Reads a block from its 144 bytes. O(1), a copy.
    pub fn from_bytes(bytes: &[u8; BYTES]) -> Self {
        let mut scales = [0u8; 12];
        scales.copy_from_slice(&bytes[4..16]);
        let mut qs = [0u8; 128];
        qs.copy_from_slice(&bytes[16..]);
        BlockQ4K {
            d: f16::from_le_bytes([bytes[0], bytes[1]]),
            dmin: f16::from_le_bytes([bytes[2], bytes[3]]),
            scales,
            qs,
        }
    }

    /// The block's 144 bytes, as ggml stores them. O(1), a copy.
    pub fn to_bytes(&self) -> [u8; BYTES] {
        let mut out = [0u8; BYTES];
        out[0..2].copy_from_slice(&self.d.to_le_bytes());
        out[2..4].copy_from_slice(&self.dmin.to_le_bytes());
        out[4..16].copy_from_slice(&self.scales);
        out[16..].copy_from_slice(&self.qs);
        out
    }
}

/// Quantizes 256 values as ggml's `quantize_row_q4_K_ref` does (no importance
/// matrix), bit for bit. About 21 candidate scales are tried per group of 32.
pub fn quantize_block(x: &[f32; VALUES]) -> BlockQ4K {
    let (levels, d, dmin, scales) = affine_k_block(x, 15, -1.0, 0.1, 20);
    let mut qs = [0u8; 128];
    for (r, run) in qs.chunks_exact_mut(32).enumerate() {
        for (l, q) in run.iter_mut().enumerate() {
            *q = levels[64 * r + l] | (levels[64 * r + 32 + l] << 4);
        }
    }
    BlockQ4K { d, dmin, scales, qs }
}

/// Dequantizes one block as ggml's `dequantize_row_q4_K` does, bit for bit.
pub fn dequantize_block(block: &BlockQ4K, y: &mut [f32; VALUES]) {
    let d = block.d.to_f32();
    let dmin = block.dmin.to_f32();
    let (sc, m) = unpack_scales_k4(&block.scales);
    for (r, (run, out)) in block.qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let (d1, m1) = (d * f32::from(sc[2 * r]), dmin * f32::from(m[2 * r]));
        let (d2, m2) = (d * f32::from(sc[2 * r + 1]), dmin * f32::from(m[2 * r + 1]));
        let (lo, hi) = out.split_at_mut(32);
        for ((&q, a), b) in run.iter().zip(lo).zip(hi) {
            *a = d1 * f32::from(q & 0x0f) - m1;
            *b = d2 * f32::from(q >> 4) - m2;
        }
    }
}

pub(super) fn quantize_bytes(x: &[f32; VALUES], out: &mut [u8; BYTES]) {
    *out = quantize_block(x).to_bytes();
}

pub(super) fn dequantize_bytes(bytes: &[u8; BYTES], y: &mut [f32; VALUES]) {
    dequantize_block(&BlockQ4K::from_bytes(bytes), y);
}

/// Quantizes a row (a multiple of 256 values) into `Q4_K` blocks, bit for bit
/// as ggml's `quantize_row_q4_K_ref`. `dst` must be exactly
/// `src.len() / 256 · 144` bytes; otherwise a [`crate::ComputeError::Shape`]
/// and nothing is written. O(n), a few hundred flops a value.
pub fn quantize(src: &[f32], dst: &mut [u8]) -> Result<()> {
    super::quantize_rows(BlockFormat::Q4K, src, dst, quantize_bytes)
}

/// Dequantizes `Q4_K` blocks (a multiple of 144 bytes) into a row, bit for
/// bit as ggml's `dequantize_row_q4_K`. `dst` must hold exactly 256 values a
/// block; otherwise a [`crate::ComputeError::Shape`] and nothing is written.
/// O(n), two flops a value.
pub fn dequantize(src: &[u8], dst: &mut [f32]) -> Result<()> {
    super::dequantize_rows(BlockFormat::Q4K, src, dst, dequantize_bytes)
}
