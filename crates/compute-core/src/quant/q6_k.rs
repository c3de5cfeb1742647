//! `Q6_K`: 256 values in 210 bytes, ggml's `block_q6_K`.
//!
//! Sixteen groups of 16 values; group `j` decodes as `d·sc[j]·(q − 32)` with
//! 6-bit quants `q` and signed 8-bit `sc`. The block is two halves of 128
//! values; in half `h`, for `l` in `0..32`, values `128h + l`, `+32`, `+64`,
//! `+96` take their low 4 bits from `ql[64h + l]` (low nibble),
//! `ql[64h + 32 + l]` (low), `ql[64h + l]` (high), `ql[64h + 32 + l]` (high)
//! and their high 2 bits from bits 0–1, 2–3, 4–5, 6–7 of `qh[32h + l]`.
//! Unlike the other k-quants, `d` comes last.

use half::f16;

use super::search::symmetric_levels;
use super::{BlockFormat, nearest_int};
use crate::Result;

/// Values in one block.
pub const VALUES: usize = 256;
/// Bytes of one block.
pub const BYTES: usize = 210;

/// One `Q6_K` block, field for field as ggml stores it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ6K {
    /// Low 4 bits of the quants (bytes 0–127).
    pub ql: [u8; 128],
    /// High 2 bits of the quants (bytes 128–191).
    pub qh: [u8; 64],
    /// Signed 8-bit scale of each group of 16 (bytes 192–207).
    pub scales: [i8; 16],
    /// Super-block scale (bytes 208–209).
    pub d: f16,
}

impl BlockQ6K {
    /// Reads a block from its 210 bytes. O(1), a copy.
    pub fn from_bytes(bytes: &[u8; BYTES]) -> Self {
        let mut ql = [0u8; 128];
        ql.copy_from_slice(&bytes[..128]);
        let mut qh = [0u8; 64];
        qh.copy_from_slice(&bytes[128..192]);
        let scales = std::array::from_fn(|j| bytes[192 + j] as i8);
        BlockQ6K { ql, qh, scales, d: f16::from_le_bytes([bytes[208], bytes[209]]) }
    }

    /// The block's 210 bytes, as ggml stores them. O(1), a copy.
    pub fn to_bytes(&self) -> [u8; BYTES] {
        let mut out = [0u8; BYTES];
        out[..128].copy_from_slice(&self.ql);
        out[128..192].copy_from_slice(&self.qh);
        for (o, &s) in out[192..208].iter_mut().zip(&self.scales) {
            *o = s as u8;
        }
        out[208..].copy_from_slice(&self.d.to_le_bytes());
        out
    }
}

/// Quantizes 256 values as ggml's `quantize_row_q6_K_ref` does (no importance
/// matrix), bit for bit: a symmetric search per group of 16 (19 candidate
/// scales), the group scales quantized to 8 bits against the largest in
/// magnitude, `d` rounded to f16, then every value quantized again against
/// `d·sc` (a group whose `d·sc` is 0 keeps its levels from the search). A block
/// whose group scales are all below 1e-15 in magnitude is all zero bytes.
pub fn quantize_block(x: &[f32; VALUES]) -> BlockQ6K {
    let mut levels = [0u8; VALUES];
    let mut scales = [0f32; 16];
    let mut max_scale = 0.0f32;
    let mut max_abs_scale = 0.0f32;
    let groups = x.as_chunks::<16>().0.iter().zip(levels.as_chunks_mut::<16>().0);
    for ((xg, lg), scale) in groups.zip(&mut scales) {
        *scale = symmetric_levels(xg, 32, lg);
        let abs_scale = scale.abs();
        if abs_scale > max_abs_scale {
            max_abs_scale = abs_scale;
            max_scale = *scale;
        }
    }
    if max_abs_scale < 1e-15 {
        return BlockQ6K { ql: [0; 128], qh: [0; 64], scales: [0; 16], d: f16::ZERO };
    }

    let iscale = -128.0 / max_scale;
    let d = f16::from_f32(1.0 / iscale);
    // ggml stores min(127, nearest_int(..)) in an i8 (wrapping below -128,
    // which the largest-magnitude scale rules out).
    let sc: [i8; 16] = std::array::from_fn(|j| nearest_int(iscale * scales[j]).min(127) as i8);

    let groups = x.as_chunks::<16>().0.iter().zip(levels.as_chunks_mut::<16>().0);
    for ((xg, lg), &s) in groups.zip(&sc) {
        let dj = d.to_f32() * f32::from(s);
        if dj == 0.0 {
            continue;
        }
        for (l, &v) in lg.iter_mut().zip(xg) {
            *l = (nearest_int(v / dj).clamp(-32, 31) + 32) as u8;
        }
    }

    let mut ql = [0u8; 128];
    let mut qh = [0u8; 64];
    for h in 0..2 {
        let (base, lo, hi) = (128 * h, 64 * h, 32 * h);
        for l in 0..32 {
            let q = [levels[base + l], levels[base + l + 32], levels[base + l + 64], levels[base + l + 96]];
            ql[lo + l] = (q[0] & 0x0f) | ((q[2] & 0x0f) << 4);
            ql[lo + l + 32] = (q[1] & 0x0f) | ((q[3] & 0x0f) << 4);
            qh[hi + l] = (q[0] >> 4) | ((q[1] >> 4) << 2) | ((q[2] >> 4) << 4) | ((q[3] >> 4) << 6);
        }
    }
    BlockQ6K { ql, qh, scales: sc, d }
}

/// Dequantizes one block as ggml's `dequantize_row_q6_K` does, bit for bit:
/// each value is `(d·sc)·(q − 32)`.
pub fn dequantize_block(block: &BlockQ6K, y: &mut [f32; VALUES]) {
    let d = block.d.to_f32();
    for h in 0..2 {
        let (base, lo, hi, s) = (128 * h, 64 * h, 32 * h, 8 * h);
        for l in 0..32 {
            let is = s + l / 16;
            let (a, b, qh) = (block.ql[lo + l], block.ql[lo + l + 32], block.qh[hi + l]);
            let q1 = i32::from((a & 0x0f) | ((qh & 3) << 4)) - 32;
            let q2 = i32::from((b & 0x0f) | (((qh >> 2) & 3) << 4)) - 32;
            let q3 = i32::from((a >> 4) | (((qh >> 4) & 3) << 4)) - 32;
            let q4 = i32::from((b >> 4) | (((qh >> 6) & 3) << 4)) - 32;
            y[base + l] = d * f32::from(block.scales[is]) * q1 as f32;
            y[base + l + 32] = d * f32::from(block.scales[is + 2]) * q2 as f32;
            y[base + l + 64] = d * f32::from(block.scales[is + 4]) * q3 as f32;
            y[base + l + 96] = d * f32::from(block.scales[is + 6]) * q4 as f32;
        }
    }
}

pub(super) fn quantize_bytes(x: &[f32; VALUES], out: &mut [u8; BYTES]) {
    *out = quantize_block(x).to_bytes();
}

pub(super) fn dequantize_bytes(bytes: &[u8; BYTES], y: &mut [f32; VALUES]) {
    dequantize_block(&BlockQ6K::from_bytes(bytes), y);
}

/// Quantizes a row (a multiple of 256 values) into `Q6_K` blocks, bit for bit
/// as ggml's `quantize_row_q6_K_ref`. `dst` must be exactly
/// `src.len() / 256 · 210` bytes; otherwise a [`crate::ComputeError::Shape`]
/// and nothing is written. O(n), a few hundred flops a value.
pub fn quantize(src: &[f32], dst: &mut [u8]) -> Result<()> {
    super::quantize_rows(BlockFormat::Q6K, src, dst, quantize_bytes)
}

/// Dequantizes `Q6_K` blocks (a multiple of 210 bytes) into a row, bit for
/// bit as ggml's `dequantize_row_q6_K`. `dst` must hold exactly 256 values a
/// block; otherwise a [`crate::ComputeError::Shape`] and nothing is written.
/// O(n), two flops a value.
pub fn dequantize(src: &[u8], dst: &mut [f32]) -> Result<()> {
    super::dequantize_rows(BlockFormat::Q6K, src, dst, dequantize_bytes)
}
