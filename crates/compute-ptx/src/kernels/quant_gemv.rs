//! Products of few activation rows with block-quantized weights, `y = x·Wᵀ`
//! (`x` of `m ≤` [`MAX_ROWS`] rows, `W` of `n` rows of `k` values stored as
//! `Q4_K`, `Q5_K`, `Q6_K` or `Q8_0` blocks): ggml's "mmvq" design. The
//! activations are first quantized to int8 per 32 values
//! ([`quant::quantize_x`]); these kernels then unpack the weight quants in
//! registers and take the dot products on integers with `dp4a` (four int8
//! products per instruction), scaling in `f32` once per 32 values (16 for
//! `Q6_K`): `d_w·sc·d_x·Σq_w·q_x − dmin·m·d_x·Σq_x` for the k-quants with a
//! min, `d_w·sc·d_x·Σ(q_w − 32)·q_x` for `Q6_K`, `d_w·d_x·Σq_w·q_x` for
//! `Q8_0`. The error against the exact product with the dequantized weights
//! is that of the int8 activations, at most `(d_x/2)·Σ|W|` per 32 values
//! (`d_x = max|x| / 127` of those values), plus `f32` rounding.
//!
//! Shape: each warp takes [`weight_rows_per_warp`] weight rows (1 up to 4
//! activation rows, 2 for 8, 4 for 16 (`Q5_K`: 2): every activation load then serves
//! that many weight rows, so the cache reads of the activations, about `2·m`
//! bytes per weight byte and row, stay within the L1's bandwidth), with
//! [`ROWS_PER_BLOCK`] warps per block of [`THREADS`] threads. [`lanes_per_block`] lanes share one weight block,
//! each unpacking 32 of its values (`Q4_K`/`Q5_K`: a 16-byte load of quants
//! beside the block's 16-byte header, the 16-byte-aligned loads those
//! 144/176-byte blocks allow; `Q6_K`, `Q8_0`: 2-byte loads, their blocks
//! being only 2-byte aligned), and each lane takes [`units`] weight blocks
//! per iteration, so that many independent loads are in flight. Each lane
//! keeps `R` sums (`R` in [`ROWS`], the smallest at least `m`: rows `m..R`
//! read row `m − 1` again and are not stored) per weight row; a butterfly
//! (`shfl.sync.bfly`) adds the lanes and lane `i < m` writes `y[i, j]`.
//! Deterministic: no atomics.

use super::elem;
use super::quant::{self, f16_lo, scale_min_k4, words_2aligned};
use crate::builder::{BuildError, Cmp, Dim, F32, Kernel, KernelBuilder, Pred, Reg, S32, Target, U32, U64};
use compute_core::DType;
use compute_core::quant::BlockFormat;

/// The row counts the kernels are built for.
pub const ROWS: [u32; 5] = [1, 2, 4, 8, 16];
/// The most activation rows (`m`) a kernel takes; more run the prefill path.
pub const MAX_ROWS: usize = 16;
/// Warps per block (each takes [`weight_rows_per_warp`] weight rows).
pub const ROWS_PER_BLOCK: u32 = 4;
/// Threads per block.
pub const THREADS: u32 = 32 * ROWS_PER_BLOCK;

/// The row count of the kernel that takes `m` rows (`1 ≤ m ≤ 16`): the
/// smallest of [`ROWS`] at least `m`. Free.
pub fn rows_for(m: usize) -> u32 {
    ROWS.into_iter().find(|&r| r as usize >= m).unwrap_or(ROWS[ROWS.len() - 1])
}

/// Lanes that share one weight block: 8 (32 values each) for the 256-value
/// formats, 4 (8 values each) for `Q8_0`.
pub fn lanes_per_block(format: BlockFormat) -> u32 {
    if format == BlockFormat::Q8_0 { 4 } else { 8 }
}

/// Weight blocks each lane takes per loop iteration.
pub fn units(format: BlockFormat) -> u32 {
    if format == BlockFormat::Q8_0 { 4 } else { 2 }
}

/// Weight rows each warp takes in the kernel of `format` for `rows`
/// activation rows: 1 up to 4 rows, 2 for 8, 4 for 16 (2 for `Q5_K`, whose
/// unpacked fifth bits would not fit the registers of 4). Each activation
/// load then serves that many weight rows, which keeps the cache reads of
/// the activations (about `2·m` bytes per weight byte with one weight row
/// a warp) within the L1's bandwidth as `m` grows. Free.
pub fn weight_rows_per_warp(format: BlockFormat, rows: u32) -> u32 {
    match rows {
        16 if format != BlockFormat::Q5K => 4,
        8 | 16 => 2,
        _ => 1,
    }
}

/// Weight rows per block of the kernel of `format` for `rows` activation
/// rows (the grid is `ceil(n / weight_rows_per_block)` blocks). Free.
pub fn weight_rows_per_block(format: BlockFormat, rows: u32) -> u32 {
    ROWS_PER_BLOCK * weight_rows_per_warp(format, rows)
}

/// Name of the kernel (`qgemv_q4k_r4_bf16`).
pub fn name(format: BlockFormat, rows: u32, out: DType) -> String {
    format!("qgemv_{}_r{rows}_{}", quant::tag(format), out.as_str())
}

/// What one lane needs to process a weight block: constants of its lane.
struct Lane {
    /// Byte offsets (within a block) of this lane's pieces.
    a: Reg<U64>,
    b: Reg<U64>,
    c: Reg<U64>,
    /// Offset of this lane's activation bytes within the block's 256 (or 32).
    xo: Reg<U64>,
    /// Offset of this lane's first `(d, s)` pair within the block's.
    dso: Reg<U64>,
    /// Format-specific shifts and flags.
    s0: Reg<U32>,
    s1: Reg<U32>,
    high: Reg<Pred>,
    /// `−1` for the lane that adds a group's min term, else `0`.
    min_sign: Reg<F32>,
}

/// Builds the GEMV of `format` for `rows` activation rows, writing `out`:
/// `y[i, j] = Σ_p x[i, p]·W[j, p]` for `i < m`, `j < n`, from the quantized
/// activations. Params: `w` (the blocks, `n` rows of `k / values_per_block`
/// blocks; 16-byte aligned for `Q4_K`/`Q5_K`, 2-byte otherwise), `qx`, `ds`
/// (from [`quant::quantize_x`], 16-byte aligned), `y` (pointers), `m`, `n`,
/// `k` (u32). Launch: [`THREADS`] threads, `ceil(n / weight_rows_per_block(format, rows))` blocks.
/// Reads `W` once (at memory bandwidth) and the activations from cache.
pub fn qgemv(format: BlockFormat, rows: u32, out: DType, target: Target) -> Result<Kernel, BuildError> {
    let kname = name(format, rows, out);
    if !quant::supported(format) || !ROWS.contains(&rows) {
        let why = format!("no quantized GEMV for {format} with {rows} rows");
        return Err(BuildError { kernel: kname, problems: vec![why] });
    }
    let lpb = lanes_per_block(format);
    let u = units(format);
    let rw = weight_rows_per_warp(format, rows);
    let per_iter = u * 32 / lpb;
    let bytes = format.bytes_per_block() as u32;
    let vpb = format.values_per_block() as u32;
    let mut b = KernelBuilder::new(&kname, target);
    b.doc(&format!(
        "{kname}: y[i, j] = sum_p x[i, p] * W[j, p] for i < m <= {rows}; W rows of {format} blocks, x as int8 per 32 values (d, d*sum q), {out} out"
    ));
    b.doc(&format!(
        "{rw} weight rows per warp ({ROWS_PER_BLOCK} warps per block); {lpb} lanes per weight block, {u} blocks per lane per iteration; dp4a on int8, f32 scales per group; butterfly sum, lane i writes y[i, j]"
    ));
    b.doc("params: w, qx, ds, y (pointers), m, n, k (u32)");
    b.doc(&format!("launch: {THREADS} threads, ceil(n / {}) blocks", ROWS_PER_BLOCK * rw));
    b.max_threads(THREADS);
    let w = b.param_ptr("w");
    let qx = b.param_ptr("qx");
    let ds = b.param_ptr("ds");
    let y = b.param_ptr("y");
    let m = b.param::<U32>("m");
    let n = b.param::<U32>("n");
    let k = b.param::<U32>("k");

    let tid = b.tid(Dim::X);
    let lane = b.and(tid, 31u32);
    let warp = b.shr(tid, 5u32);
    let cta = b.ctaid(Dim::X);
    let wi = b.mad(cta, ROWS_PER_BLOCK, warp);
    let j = b.mul(wi, rw);
    // Whole warps leave together, so the shuffles below see 32 lanes.
    let gone = b.setp(Cmp::Ge, j, n);
    b.guarded(gone, false, |b| b.ret());
    let nb = b.shr(k, vpb.trailing_zeros());
    let row_bytes = b.mul(nb, bytes);
    // Weight rows j..j + rw, the ones past n reading row n - 1 (not stored).
    let nm1 = b.sub(n, 1u32);
    let wrows: Vec<Reg<U64>> = (0..rw)
        .map(|c| {
            let jc = b.add(j, c);
            let jc = b.min(jc, nm1);
            let roff = b.mul_wide(jc, row_bytes);
            b.add(w, roff)
        })
        .collect();
    // Row r of the activations starts min(r, m - 1)·k bytes into qx (m·k < 2³²):
    // one 32-bit offset per row keeps the registers of 16 rows low.
    let last = b.sub(m, 1u32);
    let xrows: Vec<Reg<U32>> = (0..rows)
        .map(|r| {
            let ri = b.min(last, r);
            b.mul(ri, k)
        })
        .collect();
    // acc[c·rows + r]: weight row c, activation row r.
    let acc: Vec<Reg<F32>> = (0..rows * rw).map(|_| b.mov(0.0f32)).collect();
    let sub = b.and(lane, lpb - 1);
    let slot = b.shr(lane, lpb.trailing_zeros());
    let ln = lane_consts(&mut b, format, sub);

    let main = b.label("main");
    let tail = b.label("tail");
    let reduce = b.label("reduce");
    let bi0 = b.mov(slot);
    b.comment(&format!("{u} weight blocks per lane per iteration"));
    b.place(main);
    let lastu = b.add(bi0, (u - 1) * (32 / lpb));
    let past = b.setp(Cmp::Ge, lastu, nb);
    b.bra_if(past, tail);
    for t in 0..u {
        let bi = b.add(bi0, t * (32 / lpb));
        unit(&mut b, format, &ln, &wrows, bi, (qx, ds, &xrows), &acc);
    }
    let next = b.add(bi0, per_iter);
    b.assign(bi0, next);
    b.bra(main);

    b.comment("the last blocks: every unit clamped to the row, added only when inside it");
    b.place(tail);
    let empty = b.setp(Cmp::Eq, nb, 0u32);
    b.bra_if(empty, reduce);
    let nbm1 = b.sub(nb, 1u32);
    for t in 0..u {
        let bi = b.add(bi0, t * (32 / lpb));
        let valid = b.setp(Cmp::Lt, bi, nb);
        let bic = b.min(bi, nbm1);
        let part: Vec<Reg<F32>> = (0..rows * rw).map(|_| b.mov(0.0f32)).collect();
        unit(&mut b, format, &ln, &wrows, bic, (qx, ds, &xrows), &part);
        for (&a, &p) in acc.iter().zip(&part) {
            let s = b.add(a, p);
            let s = b.selp(s, a, valid);
            b.assign(a, s);
        }
    }

    b.place(reduce);
    b.comment("butterfly over the lanes; lane i < m writes row i");
    for mask in [16, 8, 4, 2, 1] {
        for &s in &acc {
            let o = b.shfl_bfly(s, mask);
            let t = b.add(s, o);
            b.assign(s, t);
        }
    }
    let done = b.label("done");
    let outside = b.setp(Cmp::Ge, lane, m);
    b.bra_if(outside, done);
    for (c, sums) in acc.chunks(rows as usize).enumerate() {
        let mut val = sums[0];
        for (r, &s) in sums.iter().enumerate().skip(1) {
            let is = b.setp(Cmp::Eq, lane, r as u32);
            val = b.selp(s, val, is);
        }
        let jc = b.add(j, c as u32);
        let past = b.setp(Cmp::Ge, jc, n);
        b.bra_if(past, done);
        let yi = b.mad(lane, n, jc);
        let yoff = b.mul_wide(yi, elem::size(out));
        let ya = b.add(y, yoff);
        elem::store(&mut b, out, ya, 0, &[val]);
    }
    b.place(done);
    b.ret();
    b.finish()
}

/// The per-lane constants of `format` for lane `sub` of a block's lanes.
fn lane_consts(b: &mut KernelBuilder, format: BlockFormat, sub: Reg<U32>) -> Lane {
    let zero64 = b.mov(0u64);
    let zero = b.mov(0u32);
    let never = b.setp(Cmp::Ne, zero, zero);
    let none = b.mov(0.0f32);
    match format {
        BlockFormat::Q4K | BlockFormat::Q5K => {
            // Lane (r, h): run r = sub / 2 of the quants, half h = sub mod 2:
            // values 16h.. of groups 2r (low nibbles) and 2r + 1 (high).
            let r = b.shr(sub, 1u32);
            let h = b.and(sub, 1u32);
            let qs_at = if format == BlockFormat::Q4K { 16u32 } else { 48 };
            let qa = b.mad(r, 32u32, qs_at);
            let qa = b.mad(h, 16u32, qa);
            let qha = b.mad(h, 16u32, 16u32);
            let xo = b.mad(r, 64u32, 0u32);
            let xo = b.mad(h, 16u32, xo);
            // (d, s) pairs of groups 2r and 2r + 1: 16 bytes at 16r.
            let dso = b.mul_wide(r, 16u32);
            let rm = b.and(r, 1u32);
            let s0 = b.shl(rm, 4u32); // 8·(2r mod 4)
            let high = b.setp(Cmp::Ge, r, 2u32);
            let s1 = b.shl(r, 1u32); // 2r: the fifth-bit shift of group 2r
            let lead = b.setp(Cmp::Eq, h, 0u32);
            let min_sign = b.selp(-1.0f32, 0.0f32, lead);
            Lane {
                a: b.cvt::<U64, U32>(qa),
                b: b.cvt::<U64, U32>(qha),
                c: zero64,
                xo: b.cvt::<U64, U32>(xo),
                dso,
                s0,
                s1,
                high,
                min_sign,
            }
        }
        BlockFormat::Q6K => {
            // Lane (hh, l0): values 128hh + 32t + l0.. (8 of them) for t in
            // 0..4, from ql[64hh + l0..], ql[64hh + 32 + l0..], qh[128 + 32hh + l0..];
            // scales 192 + 8hh + g + 2t with g = l0 / 16.
            let hh = b.shr(sub, 2u32);
            let q = b.and(sub, 3u32);
            let l0 = b.shl(q, 3u32);
            let g = b.shr(q, 1u32);
            let qa = b.mad(hh, 64u32, l0);
            let qha = b.mad(hh, 32u32, l0);
            let qha = b.add(qha, 128u32);
            let sa = b.mad(hh, 8u32, g);
            let sa = b.add(sa, 192u32);
            let xo = b.mad(hh, 128u32, l0);
            let dso = b.mul_wide(hh, 32u32);
            Lane {
                a: b.cvt::<U64, U32>(qa),
                b: b.cvt::<U64, U32>(qha),
                c: b.cvt::<U64, U32>(sa),
                xo: b.cvt::<U64, U32>(xo),
                dso,
                s0: zero,
                s1: zero,
                high: never,
                min_sign: none,
            }
        }
        _ => {
            // Lane sub: values 8·sub.. of the block, quants at 2 + 8·sub.
            let qa = b.mad(sub, 8u32, 2u32);
            let xo = b.shl(sub, 3u32);
            Lane {
                a: b.cvt::<U64, U32>(qa),
                b: zero64,
                c: zero64,
                xo: b.cvt::<U64, U32>(xo),
                dso: zero64,
                s0: zero,
                s1: zero,
                high: never,
                min_sign: none,
            }
        }
    }
}

/// `Σ_i dp4a(w_i, x_i)` over paired words.
fn dot(b: &mut KernelBuilder, ws: &[Reg<U32>], xs: &[Reg<U32>]) -> Reg<F32> {
    let mut s = b.mov(0i32);
    for (&wv, &xv) in ws.iter().zip(xs) {
        s = b.dp4a(wv, xv, s);
    }
    b.cvt::<F32, S32>(s)
}

/// One weight block's share of a lane, unpacked in registers.
enum Decoded {
    /// `Q4_K`/`Q5_K`: quant words of groups 2r and 2r + 1, `d·sc` and
    /// `−dmin·m` (0 on the lane that does not add the min term) of each.
    K4 { lo: Vec<Reg<U32>>, hi: Vec<Reg<U32>>, dl: [Reg<F32>; 2], nml: [Reg<F32>; 2] },
    /// `Q6_K`: the words of `q − 32` of groups t = 0..4 and `d·sc` of each.
    Q6 { q: Vec<Vec<Reg<U32>>>, dsc: Vec<Reg<F32>> },
    /// `Q8_0`: two words of quants and `d`.
    Q8 { q: Vec<Reg<U32>>, d: Reg<F32> },
}

/// Loads and unpacks this lane's share of the weight block at `base`.
fn decode(b: &mut KernelBuilder, format: BlockFormat, ln: &Lane, base: Reg<U64>) -> Decoded {
    match format {
        BlockFormat::Q4K | BlockFormat::Q5K => {
            let [h0, h1, h2, h3] = b.ld_global_nc_v::<U32, 4>(base, 0);
            let qa = b.add(base, ln.a);
            let qs = b.ld_global_nc_v::<U32, 4>(qa, 0);
            let qh = (format == BlockFormat::Q5K).then(|| {
                let ha = b.add(base, ln.b);
                b.ld_global_nc_v::<U32, 4>(ha, 0)
            });
            // Groups 2r (shift s0) and 2r + 1 (shift s0 + 8).
            let (sc0, m0) = scale_min_k4(b, [h1, h2, h3], ln.s0, ln.high);
            let s0b = b.add(ln.s0, 8u32);
            let (sc1, m1) = scale_min_k4(b, [h1, h2, h3], s0b, ln.high);
            let d = f16_lo(b, h0);
            let hi = b.shr(h0, 16u32);
            let dmin = f16_lo(b, hi);
            let mut dl = Vec::new();
            let mut nml = Vec::new();
            for (sc, mm) in [(sc0, m0), (sc1, m1)] {
                let f = b.cvt::<F32, U32>(sc);
                dl.push(b.mul(d, f));
                let f = b.cvt::<F32, U32>(mm);
                let ml = b.mul(dmin, f);
                nml.push(b.mul(ml, ln.min_sign));
            }
            let mut lo = Vec::new();
            let mut hiw = Vec::new();
            for (i, &q) in qs.iter().enumerate() {
                let mut l = b.and(q, 0x0f0f_0f0fu32);
                let hq = b.shr(q, 4u32);
                let mut h = b.and(hq, 0x0f0f_0f0fu32);
                if let Some(qh) = &qh {
                    let bl = b.shr(qh[i], ln.s1);
                    let bl = b.and(bl, 0x0101_0101u32);
                    let bl = b.shl(bl, 4u32);
                    l = b.or(l, bl);
                    let bh = b.shr(qh[i], ln.s1);
                    let bh = b.shr(bh, 1u32);
                    let bh = b.and(bh, 0x0101_0101u32);
                    let bh = b.shl(bh, 4u32);
                    h = b.or(h, bh);
                }
                lo.push(l);
                hiw.push(h);
            }
            Decoded::K4 { lo, hi: hiw, dl: [dl[0], dl[1]], nml: [nml[0], nml[1]] }
        }
        BlockFormat::Q6K => {
            let qa = b.add(base, ln.a);
            let qla = words_2aligned(b, qa, 0, 2);
            let qlb = words_2aligned(b, qa, 32, 2);
            let ha = b.add(base, ln.b);
            let qh = words_2aligned(b, ha, 0, 2);
            let dw = b.ld_global_nc_u16(base, 208);
            let d = f16_lo(b, dw);
            let sa = b.add(base, ln.c);
            let mut dsc = Vec::new();
            for t in 0..4 {
                let s = b.ld_global_nc_s8(sa, 2 * t);
                let f = b.cvt::<F32, S32>(s);
                dsc.push(b.mul(d, f));
            }
            // Group t: (low or high nibble of ql run t mod 2) | (qh bits 2t) << 4, minus 32.
            let mut q: Vec<Vec<Reg<U32>>> = Vec::new();
            for t in 0..4u32 {
                let src = if t % 2 == 0 { &qla } else { &qlb };
                let words = (0..2)
                    .map(|i| {
                        let l = b.shr(src[i], 4 * (t / 2));
                        let l = b.and(l, 0x0f0f_0f0fu32);
                        let h = b.shr(qh[i], 2 * t);
                        let h = b.and(h, 0x0303_0303u32);
                        let h = b.shl(h, 4u32);
                        let v = b.or(l, h);
                        // Bytewise q − 32 in 8-bit two's complement: flip bit 5,
                        // then copy it into bits 6 and 7.
                        let v = b.xor(v, 0x2020_2020u32);
                        let s = b.and(v, 0x2020_2020u32);
                        let s = b.mul(s, 6u32);
                        b.or(v, s)
                    })
                    .collect();
                q.push(words);
            }
            Decoded::Q6 { q, dsc }
        }
        _ => {
            let dw = b.ld_global_nc_u16(base, 0);
            let d = f16_lo(b, dw);
            let qa = b.add(base, ln.a);
            Decoded::Q8 { q: words_2aligned(b, qa, 0, 2), d }
        }
    }
}

/// This lane's share of weight block `bi` of each weight row (`wrows`, one
/// row of sums each in `acc`) against every activation row (`qx`, `ds` and
/// each row's byte offset into `qx`; a row's `(d, s)` pairs start at a
/// quarter of it into `ds`): each activation load serves every weight row.
fn unit(
    b: &mut KernelBuilder,
    format: BlockFormat,
    ln: &Lane,
    wrows: &[Reg<U64>],
    bi: Reg<U32>,
    (qx, ds, offsets): (Reg<U64>, Reg<U64>, &[Reg<U32>]),
    acc: &[Reg<F32>],
) {
    let bytes = format.bytes_per_block() as u32;
    let vpb = format.values_per_block() as u32;
    let rows = offsets.len();
    let boff = b.mul_wide(bi, bytes);
    let decoded: Vec<Decoded> = wrows
        .iter()
        .map(|&wrow| {
            let base = b.add(wrow, boff);
            decode(b, format, ln, base)
        })
        .collect();
    let xb = b.mul_wide(bi, vpb);
    let xoff = b.add(xb, ln.xo);
    let db = b.mul_wide(bi, vpb / 4);
    let doff = b.add(db, ln.dso);
    for (r, &o) in offsets.iter().enumerate() {
        let q = b.cvt::<U64, U32>(o);
        let q = b.add(q, xoff);
        let xa = b.add(qx, q);
        let d = b.shr(o, 2u32);
        let d = b.cvt::<U64, U32>(d);
        let d = b.add(d, doff);
        let da = b.add(ds, d);
        let sums = acc.iter().skip(r).step_by(rows);
        match format {
            BlockFormat::Q4K | BlockFormat::Q5K => {
                let x0 = b.ld_global_nc_v::<U32, 4>(xa, 0);
                let x1 = b.ld_global_nc_v::<U32, 4>(xa, 32);
                let [d0, s0, d1, s1] = b.ld_global_nc_v::<F32, 4>(da, 0);
                for (dec, &a) in decoded.iter().zip(sums) {
                    let Decoded::K4 { lo, hi, dl, nml } = dec else { continue };
                    for (ws, xs, dx, sx, dlg, nm) in
                        [(lo, &x0, d0, s0, dl[0], nml[0]), (hi, &x1, d1, s1, dl[1], nml[1])]
                    {
                        let isum = dot(b, ws, xs);
                        let sc = b.mul(dlg, dx);
                        b.fma_acc(a, sc, isum);
                        b.fma_acc(a, nm, sx);
                    }
                }
            }
            BlockFormat::Q6K => {
                let xs: Vec<[Reg<U32>; 2]> = (0..4).map(|t| b.ld_global_nc_v::<U32, 2>(xa, 32 * t)).collect();
                let dx: Vec<Reg<F32>> = (0..4).map(|t| b.ld_global_nc::<F32>(da, 8 * t)).collect();
                for (dec, &a) in decoded.iter().zip(sums) {
                    let Decoded::Q6 { q, dsc } = dec else { continue };
                    for t in 0..4 {
                        let isum = dot(b, &q[t], &xs[t]);
                        let sc = b.mul(dsc[t], dx[t]);
                        b.fma_acc(a, sc, isum);
                    }
                }
            }
            _ => {
                let xs = b.ld_global_nc_v::<U32, 2>(xa, 0);
                let dx = b.ld_global_nc::<F32>(da, 0);
                for (dec, &a) in decoded.iter().zip(sums) {
                    let Decoded::Q8 { q, d } = dec else { continue };
                    let isum = dot(b, q, &xs);
                    let sc = b.mul(*d, dx);
                    b.fma_acc(a, sc, isum);
                }
            }
        }
    }
}
