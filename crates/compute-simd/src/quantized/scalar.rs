//! The scalar path of the quantized products: the same integers as the VNNI
//! kernels (module `vnni`), computed from the blocks' definitions, then the
//! same `f32` operations in the same order, so both paths give the same
//! bits. Used on CPUs without AVX-512 VNNI, and as the tests' reference for
//! the kernels.
//!
//! Weight rows go in pairs `(j, j')`: per step of two blocks and activation
//! row, 16 integer lanes `c` are formed, even lanes for `j` and odd lanes for
//! `j'` (which block and sub-blocks each lane sums is listed at [`lanes`]),
//! then `acc[l] += (c[l] as f32)·(d·dx)` with the `d·dx` of the lane's
//! weight row and block; each weight row's minimum terms go to 16 lanes per
//! 8 rows (`macc`).

use half::f16;

use super::{Panel, Q4K_VALUES, Q8_0_BYTES, STEP_BLOCKS, Weights, tree16};

/// One block of 256 weight values, decoded: integer values in their natural
/// order, scales, minimums and the `f32` factors. All zero for a block past
/// the end of the row.
struct Block {
    /// Values: `0..16` (`Q4_K`), `0..32` (`Q5_K`), `-32..32` (`Q6_K`),
    /// `-128..128` (`Q8_0`).
    q: [i16; 256],
    /// Scales: 8 of sub-blocks of 32 (`Q4_K`, `Q5_K`), 16 signed of groups
    /// of 16 (`Q6_K`); unused for `Q8_0`.
    sc: [i32; 16],
    /// Minimums of the 8 sub-blocks (`Q4_K`, `Q5_K`).
    m: [i32; 8],
    /// `d` (`Q4_K`, `Q5_K`, `Q6_K`) and the `d` of each `Q8_0` block of 32.
    d: [f32; 8],
    /// `dmin` (`Q4_K`, `Q5_K`).
    dmin: f32,
}

fn f16_at(bytes: &[u8], at: usize) -> f32 {
    let b = |i: usize| bytes.get(at + i).copied().unwrap_or(0);
    f16::from_le_bytes([b(0), b(1)]).to_f32()
}

/// The values of a `Q4_K` (`qh` `None`) or `Q5_K` block from its 4-bit
/// quants (sub-blocks `2t`, `2t + 1` in the low and high nibbles of bytes
/// `32t..32t + 32`) and fifth bits (bit `s` of byte `l` for value `l` of
/// sub-block `s`).
fn k_values(qs: &[u8; 128], qh: Option<&[u8; 32]>, q: &mut [i16; 256]) {
    for (t, run) in qs.chunks_exact(32).enumerate() {
        let (lo, hi) = q[64 * t..64 * t + 64].split_at_mut(32);
        for (l, ((&byte, a), b)) in run.iter().zip(lo).zip(hi).enumerate() {
            let h = qh.map_or(0, |qh| qh[l]);
            *a = i16::from(byte & 0xf) + 16 * i16::from(h >> (2 * t) & 1);
            *b = i16::from(byte >> 4) + 16 * i16::from(h >> (2 * t + 1) & 1);
        }
    }
}

impl Block {
    /// An all-zero block: what a block past the end of a row decodes to.
    const ZERO: Block = Block { q: [0; 256], sc: [0; 16], m: [0; 8], d: [0.0; 8], dmin: 0.0 };
}

/// Decodes block `b` of the weight row `w` into `out` (zeros past its end,
/// or for a missing row).
fn decode(format: Weights, w: Option<&[u8]>, b: usize, out: &mut Block) {
    *out = Block::ZERO;
    let Some(w) = w else { return };
    let size = format.block_bytes();
    let Some(bytes) = w.get(b * size..(b + 1) * size) else { return };
    match format {
        Weights::Q4K | Weights::Q5K => {
            out.d[0] = f16_at(bytes, 0);
            out.dmin = f16_at(bytes, 2);
            let mut packed = [0u8; 12];
            packed.copy_from_slice(bytes.get(4..16).unwrap_or(&[0; 12]));
            let (sc, mn) = compute_core::quant::unpack_scales_k4(&packed);
            for s in 0..8 {
                out.sc[s] = i32::from(sc[s]);
                out.m[s] = i32::from(mn[s]);
            }
            let arr = |from: usize| bytes.get(from..).and_then(|t| t.first_chunk::<128>());
            let (qs, qh) = if format == Weights::Q4K {
                (arr(16), None)
            } else {
                (arr(48), bytes.get(16..).and_then(|t| t.first_chunk::<32>()))
            };
            if let Some(qs) = qs {
                k_values(qs, qh, &mut out.q);
            }
        }
        Weights::Q6K => {
            out.d[0] = f16_at(bytes, 208);
            for (g, sc) in out.sc.iter_mut().enumerate() {
                *sc = i32::from(bytes.get(192 + g).copied().unwrap_or(0) as i8);
            }
            let (Some(ql), Some(qh)) =
                (bytes.first_chunk::<128>(), bytes.get(128..).and_then(|t| t.first_chunk::<64>()))
            else {
                return;
            };
            for h in 0..2 {
                for g in 0..4 {
                    for l in 0..32 {
                        let low = ql[64 * h + 32 * (g % 2) + l];
                        let nibble = if g < 2 { low & 0xf } else { low >> 4 };
                        let high = (qh[32 * h + l] >> (2 * g)) & 3;
                        out.q[128 * h + 32 * g + l] = i16::from(nibble | (high << 4)) - 32;
                    }
                }
            }
        }
        Weights::Q8_0 => {
            for (p, blk) in bytes.chunks_exact(Q8_0_BYTES).enumerate() {
                out.d[p] = f16_at(blk, 0);
                for (o, &v) in out.q[32 * p..32 * p + 32].iter_mut().zip(&blk[2..]) {
                    *o = i16::from(v as i8);
                }
            }
        }
    }
}

/// `Σ q[i]·x[i]` over `i` in `from..from + len` of one block (16-bit
/// products summed in 32 bits, which compilers vectorise).
fn dot(q: &[i16; 256], x: &[i16], from: usize, len: usize) -> i32 {
    let (q, x) = (q.get(from..from + len).unwrap_or_default(), x.get(from..from + len).unwrap_or_default());
    q.iter().zip(x).map(|(&a, &b)| i32::from(a) * i32::from(b)).sum()
}

/// The 16 integer lanes of block `bj` of weight row `j` and `bk` of row `j'`
/// (the same block of the row) against the activations `x` of that block,
/// for every format but `Q4_K`. Lane `4k + t` (`k` = the 128-bit lane) holds
/// row `j` for even `t` and `j'` for odd `t`, and sums:
/// - `Q5_K`: `sc[s]·Σ q·x` over sub-blocks `s = 2k, 2k+1`, their first
///   (`t < 2`) or last 16 values;
/// - `Q6_K`: `sc[g]·Σ q·x` over groups `g = 4k, 4k+2` (`t < 2`) or
///   `4k+1, 4k+3` (16 values each);
/// - `Q8_0`: lane `2p + e` (`e` = 0 for `j`, 1 for `j'`) is `Σ q·x` over
///   the 32 values of `Q8_0` block `p`.
fn lanes(format: Weights, rows: [&Block; 2], x: &[i16]) -> [i32; 16] {
    let mut c = [0i32; 16];
    for (l, c) in c.iter_mut().enumerate() {
        let (k, t) = (l / 4, l % 4);
        *c = match format {
            Weights::Q4K => 0,
            Weights::Q5K => {
                let b = rows[t % 2];
                (2 * k..2 * k + 2).map(|s| b.sc[s] * dot(&b.q, x, 32 * s + 16 * (t / 2), 16)).sum()
            }
            Weights::Q6K => {
                let b = rows[t % 2];
                [4 * k + t / 2, 4 * k + 2 + t / 2].iter().map(|&g| b.sc[g] * dot(&b.q, x, 16 * g, 16)).sum()
            }
            Weights::Q8_0 => dot(&rows[l % 2].q, x, 32 * (l / 2), 32),
        };
    }
    c
}

/// `Q4_K`'s 16 lanes for a step: `blk[e][i]` is block `2s + i` of row
/// `j` (`e` = 0) or `j'`. Lane `4k + t` holds row `j` for even `t`, `j'` for
/// odd, block `2s` for `t < 2`, `2s + 1` otherwise, and sums `sc[s]·Σ q·x`
/// over its sub-blocks `s = 2k, 2k+1`.
fn lanes_q4k(blk: &[[Block; 2]; 2], x: [&[i16]; 2]) -> [i32; 16] {
    let mut c = [0i32; 16];
    for (l, c) in c.iter_mut().enumerate() {
        let (k, t) = (l / 4, l % 4);
        let (b, x) = (&blk[t % 2][t / 2], x[t / 2]);
        *c = (2 * k..2 * k + 2).map(|s| b.sc[s] * dot(&b.q, x, 32 * s, 32)).sum();
    }
    c
}

/// The natural-order values of block `b` of panel row `r` (zeros past the
/// row's end).
fn row_block<'p>(panel: &'p Panel<'_>, r: usize, b: usize) -> &'p [i16] {
    static ZERO: [i16; Q4K_VALUES] = [0; Q4K_VALUES];
    let at = (r * panel.blocks + b) * Q4K_VALUES;
    if b < panel.blocks { panel.natural.get(at..at + Q4K_VALUES).unwrap_or(&ZERO) } else { &ZERO }
}

/// The minimum terms' 16 integer lanes of a step for one activation row
/// (`sums`: the panel's words for it) against the rows' blocks `blk[e][i]`:
/// lane `4k + 2i + e` holds `Σ m[s]·Σx` over sub-blocks `s = 2k, 2k+1` of
/// block `2s + i` of row `e`; with `only = Some(i)`, the other block's lanes
/// are 0.
fn min_lanes(blk: &[[Block; 2]; 2], sums: &[i32], only: Option<usize>) -> [i32; 16] {
    let mut c = [0i32; 16];
    for (l, c) in c.iter_mut().enumerate() {
        let (k, e, i) = (l / 4, l % 2, l % 4 / 2);
        if only.is_some_and(|o| o != i) {
            continue;
        }
        let word = sums.get(l).copied().unwrap_or(0);
        let (lo, hi) = (i32::from(word as i16), word >> 16);
        let b = &blk[e][i];
        *c = lo * b.m[2 * k] + hi * b.m[2 * k + 1];
    }
    c
}

/// The outputs of the `jn` weight rows `w` (consecutive, `blocks` blocks
/// each) for every row of `panel`, into `out[jj·rows + r]`, exactly as the
/// VNNI kernels compute them; `scratch` holds at least `panel.scratch(jn)`
/// values. Costs `O(jn·rows·k)` scalar multiply-adds, each block decoded once.
pub(super) fn run(format: Weights, w: &[u8], jn: usize, panel: &Panel<'_>, scratch: &mut [f32], out: &mut [f32]) {
    let (rows, blocks) = (panel.rows.len(), panel.blocks);
    let row_bytes = blocks * format.block_bytes();
    let pairs = jn.div_ceil(2);
    let acc = scratch.get_mut(..16 * pairs * rows).unwrap_or_default();
    acc.fill(0.0);
    let weight = |j: usize| if j < jn { w.get(j * row_bytes..(j + 1) * row_bytes) } else { None };
    let mut blk = [[Block::ZERO, Block::ZERO], [Block::ZERO, Block::ZERO]];
    for s in 0..panel.steps {
        for p in 0..pairs {
            for (e, row) in blk.iter_mut().enumerate() {
                for (i, b) in row.iter_mut().enumerate() {
                    decode(format, weight(2 * p + e), STEP_BLOCKS * s + i, b);
                }
            }
            for r in 0..rows {
                let x = [row_block(panel, r, STEP_BLOCKS * s), row_block(panel, r, STEP_BLOCKS * s + 1)];
                let xv = |t: usize| panel.xv.get((s * rows + r) * 4 + t).copied().unwrap_or(0.0);
                let sums = panel.sums.get((s * rows + r) * 16..).unwrap_or_default();
                let Some(a) = acc.get_mut(16 * (p * rows + r)..16 * (p * rows + r + 1)) else { continue };
                if format == Weights::Q4K {
                    let (c, m) = (lanes_q4k(&blk, x), min_lanes(&blk, sums, None));
                    for (l, a) in a.iter_mut().enumerate() {
                        let (e, i) = (l % 2, l % 4 / 2);
                        let f = c[l] as f32 * blk[e][i].d[0] - m[l] as f32 * blk[e][i].dmin;
                        *a += f * xv(l % 4);
                    }
                } else {
                    for i in 0..STEP_BLOCKS {
                        let c = lanes(format, [&blk[0][i], &blk[1][i]], x[i]);
                        let m = if format.has_mins() { min_lanes(&blk, sums, Some(i)) } else { [0; 16] };
                        for (l, a) in a.iter_mut().enumerate() {
                            let b = &blk[l % 2][i];
                            let f = match format {
                                Weights::Q8_0 => c[l] as f32 * b.d[l / 2],
                                Weights::Q5K => c[l] as f32 * b.d[0] - m[l] as f32 * b.dmin,
                                _ => c[l] as f32 * b.d[0],
                            };
                            *a += f * xv(2 * i);
                        }
                    }
                }
            }
        }
    }
    for p in 0..pairs {
        for r in 0..rows {
            let (yj, yk) = tree16(acc.get(16 * (p * rows + r)..16 * (p * rows + r + 1)).unwrap_or_default());
            for (e, y) in [yj, yk].into_iter().enumerate().filter(|&(e, _)| 2 * p + e < jn) {
                if let Some(o) = out.get_mut((2 * p + e) * rows + r) {
                    *o = y;
                }
            }
        }
    }
}
