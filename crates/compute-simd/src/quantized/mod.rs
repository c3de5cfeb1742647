//! Matrix products with GGML k-quant weights, on raw blocks: `y = x·Wᵀ` for
//! `f32` activations `x` (`m × k`) and a weight `W` stored as `n` rows of `k`
//! values in `Q4_K` blocks (144 bytes per 256 values, ggml's layout) or
//! `Q6_K` blocks (210 bytes), the way GGUF files keep a linear layer's weight.
//!
//! Each row of `x` is first quantized per 256 values to 8-bit integers with
//! one `f32` scale ([`Q8Row`], as ggml's `Q8_K` does); each output is then a
//! sum over blocks of integer dot products, scaled once per block:
//!
//! `y = Σ_b dx_b·(dw_b·Σ_s sc_s·Σ_i q4_i·q8_i − dmin_b·Σ_s m_s·Σ_i q8_i)`
//!
//! (for `Q6_K`, `y = Σ_b dx_b·dw_b·Σ_g sc_g·Σ_i q6_i·q8_i` over groups of 16
//! with signed scales and signed 6-bit values).
//!
//! The integer part is exact, so the result differs from the product with
//! the dequantized weights only by the activations' rounding (at most
//! `dx_b/2` per value, `dx_b = max|x|/127` over the 256 values) and the `f32`
//! rounding of the per-block terms. On a CPU with AVX512_VNNI the inner dot
//! products run on `vpdpbusd` (64 multiply-adds per instruction, module
//! `vnni`); elsewhere a scalar loop computes the same integers (the two
//! differ only in the order the per-block `f32` terms are added).
//!
//! A GEMV (`m = 1`, decoding one token) reads each weight byte once: it is
//! bound by memory bandwidth. Weight rows are split over the threads of the
//! pool in scope above [`PAR_GEMM_MIN_MACS`] multiply-adds.

mod vnni;

use half::f16;

use crate::kernels::{fork, par};
use crate::tuning::PAR_GEMM_MIN_MACS;

/// Values per `Q4_K` block (256).
pub const Q4K_VALUES: usize = compute_core::quant::q4_k::VALUES;
/// Bytes per `Q4_K` block (144): `d`, `dmin` (f16 each), 12 bytes of packed
/// 6-bit scales and mins, 128 bytes of 4-bit quants.
pub const Q4K_BYTES: usize = compute_core::quant::q4_k::BYTES;
/// Bytes per `Q6_K` block of 256 values (210): 128 bytes of low 4 bits, 64
/// of high 2 bits, 16 signed 8-bit scales, `d` (f16) last.
pub const Q6K_BYTES: usize = compute_core::quant::q6_k::BYTES;

/// One row of activations quantized per 256 values: `x ≈ d[b]·q[i]` for `i`
/// in block `b`, with the sum of each 32 consecutive `q` kept for the
/// weights' minimum terms.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Q8Row {
    /// The quantized values, in `[-127, 127]`, in the kernels' order.
    q: Vec<i8>,
    /// One scale per 256 values: `max|x|/127` (0 for an all-zero block, NaN
    /// when the block holds a NaN or an infinity, so the products are NaN).
    d: Vec<f32>,
    /// `Σ q` over each 32 consecutive values.
    sums: Vec<i32>,
}

impl Q8Row {
    /// Quantizes `x` (its length a multiple of 256; a shorter tail is
    /// dropped): round to nearest, ties to even. One pass over `x`, and
    /// `x.len()` bytes plus a little allocated.
    pub fn quantize(x: &[f32]) -> Q8Row {
        let blocks = x.len() / Q4K_VALUES;
        let mut row = Q8Row {
            q: Vec::with_capacity(blocks * Q4K_VALUES),
            d: Vec::with_capacity(blocks),
            sums: Vec::with_capacity(blocks * 8),
        };
        for block in x.chunks_exact(Q4K_VALUES) {
            let finite = block.iter().all(|v| v.is_finite());
            let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let (d, inv) = match (finite, amax > 0.0) {
                (false, _) => (f32::NAN, 0.0),
                (true, false) => (0.0, 0.0),
                (true, true) => (amax / 127.0, 127.0 / amax),
            };
            row.d.push(d);
            let at = row.q.len();
            row.q.resize(at + Q4K_VALUES, 0);
            for (sub, xs) in block.chunks_exact(32).enumerate() {
                let mut s = 0i32;
                let dst = &mut row.q[at + sub_offset(sub)..][..32];
                for (o, &v) in dst.iter_mut().zip(xs) {
                    *o = (v * inv).round_ties_even().clamp(-127.0, 127.0) as i8;
                    s += i32::from(*o);
                }
                row.sums.push(s);
            }
        }
        row
    }

    /// Blocks of 256 values held.
    pub fn blocks(&self) -> usize {
        self.d.len()
    }

    /// The quantized values, in `[-127, 127]` (`256·blocks()` of them), in
    /// the kernels' order: in each 128 values, sub-blocks of 32 in the order
    /// 0, 2, 1, 3 ([`sub_offset`]).
    pub fn values(&self) -> &[i8] {
        &self.q
    }

    /// One scale per block: `max|x|/127` (0 for an all-zero block, NaN when
    /// the block holds a NaN or an infinity, so every product with it is NaN).
    pub fn scales(&self) -> &[f32] {
        &self.d
    }
}

/// The fields of one `Q4_K` block: `d`, `dmin`, 8 scales, 8 mins (unpacked
/// as ggml packs them) and the 128 bytes of quants.
#[inline(always)]
pub(crate) fn fields(block: &[u8; Q4K_BYTES]) -> (f32, f32, [u8; 8], [u8; 8], &[u8; 128]) {
    let (head, qs) = block.split_at(16);
    let d = f16::from_le_bytes([head[0], head[1]]).to_f32();
    let dmin = f16::from_le_bytes([head[2], head[3]]).to_f32();
    let mut packed = [0u8; 12];
    packed.copy_from_slice(&head[4..16]);
    let (sc, mn) = compute_core::quant::unpack_scales_k4(&packed);
    let qs: &[u8; 128] = qs.try_into().unwrap_or(&[0; 128]);
    (d, dmin, sc, mn, qs)
}

/// Where sub-block `s` (32 values, 0..8) of a block sits in [`Q8Row::values`]:
/// each 128 values hold sub-blocks `4c, 4c+2, 4c+1, 4c+3`, so that one
/// 64-byte load of a weight's nibbles (low nibbles: sub-blocks `4c` and
/// `4c+2`; high: `4c+1` and `4c+3`) meets its activations in one 64-byte load.
#[inline(always)]
pub fn sub_offset(s: usize) -> usize {
    (s / 4) * 128 + [0, 64, 32, 96][s % 4]
}

/// `Σ` over the blocks of one weight row (`x.blocks()` blocks of
/// [`Q4K_BYTES`]) of the block's term (module docs), in scalar code, summed
/// block by block: the path of CPUs without VNNI, and the tests' reference.
fn dot_scalar(w: &[u8], x: &Q8Row) -> f32 {
    let mut sum = 0.0f32;
    for (b, block) in w.chunks_exact(Q4K_BYTES).take(x.blocks()).enumerate() {
        let Ok(block) = <&[u8; Q4K_BYTES]>::try_from(block) else { break };
        let (d, dmin, sc, mn, qs) = fields(block);
        let (mut isum, mut msum) = (0i32, 0i32);
        let xb = &x.q[b * Q4K_VALUES..][..Q4K_VALUES];
        for j in 0..4 {
            let (xlo, xhi) = (&xb[sub_offset(2 * j)..][..32], &xb[sub_offset(2 * j + 1)..][..32]);
            let q = &qs[32 * j..32 * j + 32];
            let (mut lo, mut hi) = (0i32, 0i32);
            for ((&byte, &a), &b) in q.iter().zip(xlo).zip(xhi) {
                lo += i32::from(byte & 0xf) * i32::from(a);
                hi += i32::from(byte >> 4) * i32::from(b);
            }
            isum += i32::from(sc[2 * j]) * lo + i32::from(sc[2 * j + 1]) * hi;
        }
        for (s, &m) in mn.iter().enumerate() {
            msum += i32::from(m) * x.sums[b * 8 + s];
        }
        sum += x.d[b] * (d * isum as f32 - dmin * msum as f32);
    }
    sum
}

/// One weight row times each of `xs` (at most [`vnni::ROWS`]) into `out`,
/// on the fastest path this CPU has.
#[inline]
fn dots(format: Weights, w: &[u8], xs: &[&Q8Row], out: &mut [f32]) {
    let fast = match format {
        Weights::Q4K => vnni::dots(w, xs, out),
        Weights::Q6K => vnni::dots_q6k(w, xs, out),
    };
    if !fast {
        for (o, x) in out.iter_mut().zip(xs) {
            *o = match format {
                Weights::Q4K => dot_scalar(w, x),
                Weights::Q6K => dot_scalar_q6k(w, x),
            };
        }
    }
}

/// `Σ` over the blocks of one `Q6_K` weight row of `d·dx·Σ_g sc_g·Σ_i q_i·q8_i`
/// (`q` the signed 6-bit values, `sc` the signed scale of each 16 values), in
/// scalar code: the path of CPUs without VNNI, and the tests' reference.
fn dot_scalar_q6k(w: &[u8], x: &Q8Row) -> f32 {
    let mut sum = 0.0f32;
    for (b, block) in w.chunks_exact(Q6K_BYTES).take(x.blocks()).enumerate() {
        let Ok(block) = <&[u8; Q6K_BYTES]>::try_from(block) else { break };
        let q6 = compute_core::quant::q6_k::BlockQ6K::from_bytes(block);
        let xb = &x.q[b * Q4K_VALUES..][..Q4K_VALUES];
        let mut isum = 0i32;
        for v in 0..Q4K_VALUES {
            let (h, r) = (v / 128, v % 128);
            let (g, l) = (r / 32, r % 32);
            let low = q6.ql[64 * h + 32 * (g % 2) + l];
            let nibble = if g < 2 { low & 0xf } else { low >> 4 };
            let high = (q6.qh[32 * h + l] >> (2 * g)) & 3;
            let q = i32::from(nibble | (high << 4)) - 32;
            let xq = xb[sub_offset(v / 32) + v % 32];
            isum += i32::from(q6.scales[v / 16]) * q * i32::from(xq);
        }
        sum += x.d[b] * (q6.d.to_f32() * isum as f32);
    }
    sum
}

/// Whether this CPU runs the `vpdpbusd` kernel (AVX-512 F and VNNI).
pub fn has_vnni() -> bool {
    vnni::available()
}

/// The block formats whose products this module computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Weights {
    /// `Q4_K`: 144 bytes per 256 values.
    Q4K,
    /// `Q6_K`: 210 bytes per 256 values.
    Q6K,
}

impl Weights {
    /// Bytes of one block of 256 values.
    pub fn block_bytes(self) -> usize {
        match self {
            Weights::Q4K => Q4K_BYTES,
            Weights::Q6K => Q6K_BYTES,
        }
    }
}

/// [`matmul`] with `Q4_K` weights.
pub fn matmul_q4k(x: &[f32], w: &[u8], shape: (usize, usize, usize), y: &mut [f32]) -> bool {
    matmul(Weights::Q4K, x, w, shape, y)
}

/// `y[i][j] = Σₚ x[i][p]·W[j][p]` for `x` (`m × k` `f32`, row-major), `W`
/// (`n` rows of `k/256` blocks of `format`) and `y` (`m × n`, overwritten).
/// Returns false, having written nothing, when `k` is not a positive
/// multiple of 256 or a slice is too short for the shapes.
///
/// Costs one quantization pass over `x` (and `m·k` bytes), then `m·n·k`
/// 8-bit multiply-adds reading each weight byte once per call (from cache
/// for the second and later rows of `x`); weight rows are split over the
/// pool's threads above [`PAR_GEMM_MIN_MACS`].
pub fn matmul(format: Weights, x: &[f32], w: &[u8], (m, k, n): (usize, usize, usize), y: &mut [f32]) -> bool {
    let row_bytes = k / Q4K_VALUES * format.block_bytes();
    let fits = |len: usize, rows: usize, cols: usize| rows.checked_mul(cols).is_some_and(|need| len >= need);
    if k == 0 || !k.is_multiple_of(Q4K_VALUES) || !fits(x.len(), m, k) || !fits(w.len(), n, row_bytes) {
        return false;
    }
    let Some(y) = m.checked_mul(n).and_then(|len| y.get_mut(..len)) else { return false };
    if m == 0 || n == 0 {
        return true;
    }
    let xs: Vec<Q8Row> = x.chunks_exact(k).take(m).map(Q8Row::quantize).collect();
    let weight = |j: usize| w.get(j * row_bytes..(j + 1) * row_bytes).unwrap_or_default();
    let threads = if m.saturating_mul(n).saturating_mul(k) < PAR_GEMM_MIN_MACS { 1 } else { par::threads() };
    if m == 1 {
        // One output per weight row: pieces of `y` straight from the pool.
        let piece = n.div_ceil(threads * 4).max(1);
        let x0 = [&xs[0]];
        fork::chunks_mut(y, piece, |p, ys| {
            for (jj, out) in ys.iter_mut().enumerate() {
                dots(format, weight(p * piece + jj), &x0, std::slice::from_mut(out));
            }
        });
        return true;
    }
    // Several rows: each piece of weight rows, each row decoded once per
    // group of activation rows; the piece's columns are then copied into `y`.
    let piece = n.div_ceil(threads * 4).max(1);
    let groups: Vec<Vec<&Q8Row>> = xs.chunks(vnni::ROWS).map(|g| g.iter().collect()).collect();
    let parts = fork::map(n.div_ceil(piece), |p| {
        let cols = piece.min(n - p * piece);
        let mut out = vec![0.0f32; m * cols];
        let mut r = [0.0f32; vnni::ROWS];
        for jj in 0..cols {
            let wj = weight(p * piece + jj);
            for (g, rows) in groups.iter().enumerate() {
                dots(format, wj, rows, &mut r[..rows.len()]);
                for (i, &v) in r.iter().take(rows.len()).enumerate() {
                    out[(g * vnni::ROWS + i) * cols + jj] = v;
                }
            }
        }
        out
    });
    for (p, part) in parts.iter().enumerate() {
        let cols = piece.min(n - p * piece);
        for (i, row) in part.chunks_exact(cols).enumerate() {
            y[i * n + p * piece..][..cols].copy_from_slice(row);
        }
    }
    true
}

#[cfg(test)]
mod tests;
