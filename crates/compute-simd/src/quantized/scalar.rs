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

use super::{Panel, Q4K_VALUES, Q8_0_BYTES, Q8Row, STEP_BLOCKS, Weights, tree16};

/// One block of 256 weight values, decoded: integer values in their natural
/// order, scales, minimums and the `f32` factors. All zero for a block past
/// the end of the row.
struct Block {
    /// Values: `0..16` (`Q4_K`), `0..32` (`Q5_K`), `-32..32` (`Q6_K`),
    /// `-128..128` (`Q8_0`).
    q: [i32; 256],
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

/// Decodes block `b` of the weight row `w` (zeros past its end, or for a
/// missing row).
fn decode(format: Weights, w: Option<&[u8]>, b: usize) -> Block {
    let mut out = Block { q: [0; 256], sc: [0; 16], m: [0; 8], d: [0.0; 8], dmin: 0.0 };
    let Some(w) = w else { return out };
    let size = format.block_bytes();
    let Some(bytes) = w.get(b * size..(b + 1) * size) else { return out };
    let byte = |i: usize| bytes.get(i).copied().unwrap_or(0);
    match format {
        Weights::Q4K | Weights::Q5K => {
            out.d[0] = f16_at(bytes, 0);
            out.dmin = f16_at(bytes, 2);
            let mut packed = [0u8; 12];
            for (i, p) in packed.iter_mut().enumerate() {
                *p = byte(4 + i);
            }
            let (sc, mn) = compute_core::quant::unpack_scales_k4(&packed);
            for s in 0..8 {
                out.sc[s] = i32::from(sc[s]);
                out.m[s] = i32::from(mn[s]);
            }
            let (qs, qh) = if format == Weights::Q4K { (16, None) } else { (48, Some(16)) };
            for s in 0..8 {
                let (t, e) = (s / 2, s % 2);
                for l in 0..32 {
                    let mut v = i32::from(byte(qs + 32 * t + l) >> (4 * e) & 0xf);
                    if let Some(qh) = qh {
                        v += 16 * i32::from(byte(qh + l) >> s & 1);
                    }
                    out.q[32 * s + l] = v;
                }
            }
        }
        Weights::Q6K => {
            out.d[0] = f16_at(bytes, 208);
            for g in 0..16 {
                out.sc[g] = i32::from(byte(192 + g) as i8);
            }
            for v in 0..Q4K_VALUES {
                let (h, r) = (v / 128, v % 128);
                let (g, l) = (r / 32, r % 32);
                let low = byte(64 * h + 32 * (g % 2) + l);
                let nibble = if g < 2 { low & 0xf } else { low >> 4 };
                let high = (byte(128 + 32 * h + l) >> (2 * g)) & 3;
                out.q[v] = i32::from(nibble | (high << 4)) - 32;
            }
        }
        Weights::Q8_0 => {
            for p in 0..8 {
                out.d[p] = f16_at(bytes, Q8_0_BYTES * p);
                for l in 0..32 {
                    out.q[32 * p + l] = i32::from(byte(Q8_0_BYTES * p + 2 + l) as i8);
                }
            }
        }
    }
    out
}

/// `Σ q[i]·x[i]` over `i` in `from..from + len` of one block.
fn dot(q: &[i32; 256], x: &[i32; 256], from: usize, len: usize) -> i32 {
    q.iter().zip(x).skip(from).take(len).map(|(a, b)| a * b).sum()
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
fn lanes(format: Weights, rows: [&Block; 2], x: &[i32; 256]) -> [i32; 16] {
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
fn lanes_q4k(blk: &[[Block; 2]; 2], x: &[[i32; 256]; 2]) -> [i32; 16] {
    let mut c = [0i32; 16];
    for (l, c) in c.iter_mut().enumerate() {
        let (k, t) = (l / 4, l % 4);
        let (b, x) = (&blk[t % 2][t / 2], &x[t / 2]);
        *c = (2 * k..2 * k + 2).map(|s| b.sc[s] * dot(&b.q, x, 32 * s, 32)).sum();
    }
    c
}

/// The natural-order values of block `b` of `row` (zeros past its end).
fn row_block(row: &Q8Row, b: usize) -> [i32; 256] {
    let mut x = [0i32; 256];
    if b < row.blocks() {
        for (i, v) in x.iter_mut().enumerate() {
            *v = row.value(b, i);
        }
    }
    x
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
    for s in 0..panel.steps {
        for p in 0..pairs {
            let rw = [weight(2 * p), weight(2 * p + 1)];
            let blk: [[Block; 2]; 2] =
                rw.map(|wr| [decode(format, wr, STEP_BLOCKS * s), decode(format, wr, STEP_BLOCKS * s + 1)]);
            for (r, row) in panel.rows.iter().enumerate() {
                let x = [row_block(row, STEP_BLOCKS * s), row_block(row, STEP_BLOCKS * s + 1)];
                let xv = |t: usize| panel.xv.get((s * rows + r) * 4 + t).copied().unwrap_or(0.0);
                let sums = panel.sums.get((s * rows + r) * 16..).unwrap_or_default();
                let Some(a) = acc.get_mut(16 * (p * rows + r)..16 * (p * rows + r + 1)) else { continue };
                if format == Weights::Q4K {
                    let (c, m) = (lanes_q4k(&blk, &x), min_lanes(&blk, sums, None));
                    for (l, a) in a.iter_mut().enumerate() {
                        let (e, i) = (l % 2, l % 4 / 2);
                        let f = c[l] as f32 * blk[e][i].d[0] - m[l] as f32 * blk[e][i].dmin;
                        *a += f * xv(l % 4);
                    }
                } else {
                    for i in 0..STEP_BLOCKS {
                        let c = lanes(format, [&blk[0][i], &blk[1][i]], &x[i]);
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
