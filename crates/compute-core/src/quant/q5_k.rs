//! `Q5_K`: 256 values in 176 bytes, ggml's `block_q5_K`.
//!
//! As [`Q4_K`](super::q4_k) with a fifth bit per quant: group `j` decodes as
//! `d·sc[j]·q − dmin·m[j]` with `q` in `0..32`. The low 4 bits are stored as in
//! `Q4_K` (four runs of 32 bytes, values `64r + l` low nibble and
//! `64r + 32 + l` high nibble); the fifth bit of value `64r + l` is bit `2r`
//! of `qh[l]` and that of value `64r + 32 + l` is bit `2r + 1`.

use half::f16;

use super::search::affine_k_block;
use super::{BlockFormat, unpack_scales_k4};
use crate::Result;

/// Values in one block.
pub const VALUES: usize = 256;
/// Bytes of one block.
pub const BYTES: usize = 176;

/// One `Q5_K` block, field for field as ggml stores it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ5K {
    /// Super-block scale of the 6-bit group scales (bytes 0–1).
    pub d: f16,
    /// Super-block scale of the 6-bit group mins (bytes 2–3).
    pub dmin: f16,
    /// Packed group scales and mins (bytes 4–15), see [`unpack_scales_k4`].
    pub scales: [u8; 12],
    /// Fifth bits of the quants (bytes 16–47).
    pub qh: [u8; 32],
    /// Low 4 bits of the quants (bytes 48–175).
    pub qs: [u8; 128],
}

impl BlockQ5K {
    /// Reads a block from its 176 bytes. O(1), a copy.
    pub fn from_bytes(bytes: &[u8; BYTES]) -> Self {
        let mut scales = [0u8; 12];
        scales.copy_from_slice(&bytes[4..16]);
        let mut qh = [0u8; 32];
        qh.copy_from_slice(&bytes[16..48]);
        let mut qs = [0u8; 128];
        qs.copy_from_slice(&bytes[48..]);
        BlockQ5K {
            d: f16::from_le_bytes([bytes[0], bytes[1]]),
            dmin: f16::from_le_bytes([bytes[2], bytes[3]]),
            scales,
            qh,
            qs,
        }
    }

    /// The block's 176 bytes, as ggml stores them. O(1), a copy.
    pub fn to_bytes(&self) -> [u8; BYTES] {
        let mut out = [0u8; BYTES];
        out[0..2].copy_from_slice(&self.d.to_le_bytes());
        out[2..4].copy_from_slice(&self.dmin.to_le_bytes());
        out[4..16].copy_from_slice(&self.scales);
        out[16..48].copy_from_slice(&self.qh);
        out[48..].copy_from_slice(&self.qs);
        out
    }
}

/// Quantizes 256 values as ggml's `quantize_row_q5_K_ref` does (no importance
/// matrix), bit for bit. 16 candidate scales are tried per group of 32.
pub fn quantize_block(x: &[f32; VALUES]) -> BlockQ5K {
    let (levels, d, dmin, scales) = affine_k_block(x, 31, -0.5, 0.1, 15);
    let mut qh = [0u8; 32];
    let mut qs = [0u8; 128];
    for (r, run) in qs.chunks_exact_mut(32).enumerate() {
        let (bit_lo, bit_hi) = (1u8 << (2 * r), 2u8 << (2 * r));
        for (l, (q, h)) in run.iter_mut().zip(&mut qh).enumerate() {
            let (mut lo, mut hi) = (levels[64 * r + l], levels[64 * r + 32 + l]);
            if lo > 15 {
                lo -= 16;
                *h |= bit_lo;
            }
            if hi > 15 {
                hi -= 16;
                *h |= bit_hi;
            }
            *q = lo | (hi << 4);
        }
    }
    BlockQ5K { d, dmin, scales, qh, qs }
}

/// Dequantizes one block as ggml's `dequantize_row_q5_K` does, bit for bit.
pub fn dequantize_block(block: &BlockQ5K, y: &mut [f32; VALUES]) {
    let d = block.d.to_f32();
    let dmin = block.dmin.to_f32();
    let (sc, m) = unpack_scales_k4(&block.scales);
    for (r, (run, out)) in block.qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let (d1, m1) = (d * f32::from(sc[2 * r]), dmin * f32::from(m[2 * r]));
        let (d2, m2) = (d * f32::from(sc[2 * r + 1]), dmin * f32::from(m[2 * r + 1]));
        let (bit_lo, bit_hi) = (1u8 << (2 * r), 2u8 << (2 * r));
        let (lo, hi) = out.split_at_mut(32);
        for (((&q, &h), a), b) in run.iter().zip(&block.qh).zip(lo).zip(hi) {
            let q_lo = (q & 0x0f) + if h & bit_lo != 0 { 16 } else { 0 };
            let q_hi = (q >> 4) + if h & bit_hi != 0 { 16 } else { 0 };
            *a = d1 * f32::from(q_lo) - m1;
            *b = d2 * f32::from(q_hi) - m2;
        }
    }
}

pub(super) fn quantize_bytes(x: &[f32; VALUES], out: &mut [u8; BYTES]) {
    *out = quantize_block(x).to_bytes();
}

pub(super) fn dequantize_bytes(bytes: &[u8; BYTES], y: &mut [f32; VALUES]) {
    dequantize_block(&BlockQ5K::from_bytes(bytes), y);
}

/// Quantizes a row (a multiple of 256 values) into `Q5_K` blocks, bit for bit
/// as ggml's `quantize_row_q5_K_ref`. `dst` must be exactly
/// `src.len() / 256 · 176` bytes; otherwise a [`crate::ComputeError::Shape`]
/// and nothing is written. O(n), a few hundred flops a value.
pub fn quantize(src: &[f32], dst: &mut [u8]) -> Result<()> {
    super::quantize_rows(BlockFormat::Q5K, src, dst, quantize_bytes)
}

/// Dequantizes `Q5_K` blocks (a multiple of 176 bytes) into a row, bit for
/// bit as ggml's `dequantize_row_q5_K`. `dst` must hold exactly 256 values a
/// block; otherwise a [`crate::ComputeError::Shape`] and nothing is written.
/// O(n), two flops a value.
pub fn dequantize(src: &[u8], dst: &mut [f32]) -> Result<()> {
    super::dequantize_rows(BlockFormat::Q5K, src, dst, dequantize_bytes)
}
