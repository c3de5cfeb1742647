//! GGML block-quantized weights (`Q4_K`, `Q5_K`, `Q6_K`, `Q8_0`; byte
//! layouts in [`compute_core::quant`]): the dequantize kernels and the
//! activation quantizer that the integer GEMV kernels ([`super::quant_gemv`])
//! read.
//!
//! - [`dequant`]: blocks → `f32`/`f16`/`bf16`, bit for bit as
//!   [`BlockFormat::dequantize`] (the same `f32` products and differences in
//!   the same order, every one `mul.rn`/`sub.rn`, never contracted into an
//!   `fma`), then one round to nearest even to a half dtype. One thread per
//!   32 values: a `Q4_K`/`Q5_K` thread reads its block's 16-byte header and
//!   its 32 quant bytes in 16-byte loads (those blocks keep 16-byte
//!   alignment); `Q6_K` and `Q8_0` blocks are only 2-byte aligned, so their
//!   threads read 2-byte words. The values leave in 16-byte stores. Memory
//!   bound: it reads the block bytes once and writes the values once.
//! - [`quantize_x`]: activations (`m × k`, `f32`/`f16`/`bf16`) → int8 per 32
//!   values, as ggml's `q8_1`: `d = max|x| / 127`, `q = round(x / d)` (to
//!   nearest even), plus `s = d·Σq` for the `Q4_K`/`Q5_K` min term. Eight
//!   threads per 32 values, four each; the quants land in `qx` (`m·k`
//!   bytes, row-major) and `(d, s)` in `ds` (`m·k/32` pairs of `f32`).
//!   With these activations a product's error against the exact one with
//!   the dequantized weights is at most `(d/2)·Σ|W|` per 32 values, plus
//!   `f32` rounding.

use super::elem;
use crate::builder::{BuildError, Cmp, F32, Half, Kernel, KernelBuilder, Pred, Reg, S32, Target, U32, U64};
use compute_core::DType;
use compute_core::quant::BlockFormat;

/// Threads per block of [`dequant`] and [`quantize_x`].
pub const BLOCK: u32 = 256;

/// The formats the kernels read (`Q8_K` is ggml's activation format, not a
/// weight format).
pub const FORMATS: [BlockFormat; 4] = [BlockFormat::Q4K, BlockFormat::Q5K, BlockFormat::Q6K, BlockFormat::Q8_0];

/// Whether kernels exist for `format`. Free.
pub fn supported(format: BlockFormat) -> bool {
    FORMATS.contains(&format)
}

/// The format's short name in kernel names (`q4k`, `q8_0`).
pub fn tag(format: BlockFormat) -> &'static str {
    match format {
        BlockFormat::Q4K => "q4k",
        BlockFormat::Q5K => "q5k",
        BlockFormat::Q6K => "q6k",
        BlockFormat::Q8_0 => "q8_0",
        BlockFormat::Q8K => "q8k",
    }
}

/// Name of the dequantize kernel (`dequant_q4k_bf16`).
pub fn dequant_name(format: BlockFormat, out: DType) -> String {
    format!("dequant_{}_{}", tag(format), out.as_str())
}

/// Name of the activation quantizer (`quantize_x_q8_f16`).
pub fn quantize_x_name(input: DType) -> String {
    format!("quantize_x_q8_{}", input.as_str())
}

fn unsupported(name: &str, format: BlockFormat) -> BuildError {
    BuildError { kernel: name.to_string(), problems: vec![format!("no kernels read {format} blocks")] }
}

/// `f32` of the `f16` in the low half of `w` (exact).
pub(crate) fn f16_lo(b: &mut KernelBuilder, w: Reg<U32>) -> Reg<F32> {
    b.half_pair_to_f32(w, Half::F16)[0]
}

/// `words` little-endian 32-bit words of bytes at `base + off` (2-byte
/// aligned): two `u16` loads each.
pub(crate) fn words_2aligned(b: &mut KernelBuilder, base: Reg<U64>, off: i64, words: usize) -> Vec<Reg<U32>> {
    (0..words as i64)
        .map(|i| {
            let lo = b.ld_global_nc_u16(base, off + 4 * i);
            let hi = b.ld_global_nc_u16(base, off + 4 * i + 2);
            let hi = b.shl(hi, 16u32);
            b.or(lo, hi)
        })
        .collect()
}

/// The 6-bit scale and min of group `j` of a `Q4_K`/`Q5_K` block from its
/// packed scale words `w1` (bytes 0–3), `w2` (4–7), `w3` (8–11), as
/// `unpack_scales_k4` reads them; `shift = 8·(j mod 4)` and `high` (`j ≥ 4`)
/// may differ per thread.
pub(crate) fn scale_min_k4(
    b: &mut KernelBuilder,
    [w1, w2, w3]: [Reg<U32>; 3],
    shift: Reg<U32>,
    high: Reg<crate::builder::Pred>,
) -> (Reg<U32>, Reg<U32>) {
    let a = b.shr(w1, shift);
    let m = b.shr(w2, shift);
    let c = b.shr(w3, shift);
    let sc_low = b.and(a, 63u32);
    let m_low = b.and(m, 63u32);
    let c_lo = b.and(c, 15u32);
    let a_top = b.shr(a, 2u32);
    let a_top = b.and(a_top, 0x30u32);
    let sc_high = b.or(c_lo, a_top);
    let c_hi = b.shr(c, 4u32);
    let c_hi = b.and(c_hi, 15u32);
    let m_top = b.shr(m, 2u32);
    let m_top = b.and(m_top, 0x30u32);
    let m_high = b.or(c_hi, m_top);
    (b.selp(sc_high, sc_low, high), b.selp(m_high, m_low, high))
}

/// Byte `e` of `w` as a `u32`.
fn byte(b: &mut KernelBuilder, w: Reg<U32>, e: u32) -> Reg<U32> {
    let s = b.shr(w, 8 * e);
    b.and(s, 0xffu32)
}

/// Builds the dequantize kernel of `format` writing `out`: `y[32t..32t+32]`
/// from the blocks at `w`, exactly as [`BlockFormat::dequantize`] (then
/// rounded to `out`). Params: `w`, `y` (pointers; `y` 16-byte aligned, and
/// `w` too for `Q4_K`/`Q5_K`), `chunks` (u32, values / 32). Launch:
/// [`BLOCK`] threads, `ceil(chunks / BLOCK)` blocks. Costs one read of the
/// blocks and one write of the values.
pub fn dequant(format: BlockFormat, out: DType, target: Target) -> Result<Kernel, BuildError> {
    let name = dequant_name(format, out);
    if !supported(format) {
        return Err(unsupported(&name, format));
    }
    let mut b = KernelBuilder::new(&name, target);
    b.doc(&format!("{name}: y = dequantize({format} blocks at w), f32 exactly as ggml, rounded once to {out}"));
    b.doc("one thread per 32 values; params: w, y (pointers), chunks (u32, values / 32)");
    b.doc(&format!("launch: {BLOCK} threads, ceil(chunks / {BLOCK}) blocks"));
    b.max_threads(BLOCK);
    let w = b.param_ptr("w");
    let y = b.param_ptr("y");
    let chunks = b.param::<U32>("chunks");
    let t = b.global_index_x();
    let gone = b.setp(Cmp::Ge, t, chunks);
    b.guarded(gone, false, |b| b.ret());
    let vals: Vec<Reg<F32>> = match format {
        BlockFormat::Q4K | BlockFormat::Q5K => dequant_k4(&mut b, format, w, t),
        BlockFormat::Q6K => dequant_q6k(&mut b, w, t),
        _ => dequant_q8_0(&mut b, w, t),
    };
    let es = elem::size(out);
    let off = b.mul_wide(t, 32 * es);
    let ya = b.add(y, off);
    for (i, c) in vals.chunks(8).enumerate() {
        elem::store(&mut b, out, ya, (8 * es) as i64 * i as i64, c);
    }
    b.ret();
    b.finish()
}

/// The 32 values of group `t mod 8` of `Q4_K`/`Q5_K` block `t / 8`:
/// `d·sc·q − dmin·m`, as `(d·sc)·q − (dmin·m)`.
fn dequant_k4(b: &mut KernelBuilder, format: BlockFormat, w: Reg<U64>, t: Reg<U32>) -> Vec<Reg<F32>> {
    let bytes = format.bytes_per_block() as u32;
    let bi = b.shr(t, 3u32);
    let j = b.and(t, 7u32);
    let boff = b.mul_wide(bi, bytes);
    let base = b.add(w, boff);
    let [h0, h1, h2, h3] = b.ld_global_nc_v::<U32, 4>(base, 0);
    let jm = b.and(j, 3u32);
    let shift = b.shl(jm, 3u32);
    let high = b.setp(Cmp::Ge, j, 4u32);
    let (sc, m) = scale_min_k4(b, [h1, h2, h3], shift, high);
    let d = f16_lo(b, h0);
    let h0_hi = b.shr(h0, 16u32);
    let dmin = f16_lo(b, h0_hi);
    let scf = b.cvt::<F32, U32>(sc);
    let mf = b.cvt::<F32, U32>(m);
    let d1 = b.mul(d, scf);
    let m1 = b.mul(dmin, mf);
    // Run r = j / 2 of 32 bytes; odd groups take the high nibbles.
    let r = b.shr(j, 1u32);
    let qs_at = if format == BlockFormat::Q4K { 16 } else { 48 };
    let roff = b.mul_wide(r, 32u32);
    let qa = b.add(base, roff);
    let mut qw = b.ld_global_nc_v::<U32, 4>(qa, qs_at).to_vec();
    qw.extend(b.ld_global_nc_v::<U32, 4>(qa, qs_at + 16));
    let odd = b.and(j, 1u32);
    let nib_shift = b.shl(odd, 2u32);
    let qh = if format == BlockFormat::Q5K {
        let mut h = b.ld_global_nc_v::<U32, 4>(base, 16).to_vec();
        h.extend(b.ld_global_nc_v::<U32, 4>(base, 32));
        Some(h)
    } else {
        None
    };
    let mut vals = Vec::with_capacity(32);
    for (i, &q) in qw.iter().enumerate() {
        let nib = b.shr(q, nib_shift);
        let mut nib = b.and(nib, 0x0f0f_0f0fu32);
        if let Some(h) = &qh {
            // The fifth bit of value 32j + l is bit j of qh[l].
            let bit = b.shr(h[i], j);
            let bit = b.and(bit, 0x0101_0101u32);
            let bit = b.shl(bit, 4u32);
            nib = b.or(nib, bit);
        }
        for e in 0..4 {
            let qv = byte(b, nib, e);
            let qf = b.cvt::<F32, U32>(qv);
            let p = b.mul(d1, qf);
            vals.push(b.sub(p, m1));
        }
    }
    vals
}

/// The 32 values `128h + 32t + l` (`l` in `0..32`) of `Q6_K` block `c / 8`,
/// `c mod 8 = 4h + t`: `(d·sc)·(q − 32)`.
fn dequant_q6k(b: &mut KernelBuilder, w: Reg<U64>, t: Reg<U32>) -> Vec<Reg<F32>> {
    let bi = b.shr(t, 3u32);
    let c = b.and(t, 7u32);
    let hh = b.shr(c, 2u32);
    let tt = b.and(c, 3u32);
    let boff = b.mul_wide(bi, 210u32);
    let base = b.add(w, boff);
    // ql bytes 64h + 32(t mod 2) + l, nibble t / 2; qh bytes 128 + 32h + l, bits 2t.
    let todd = b.and(tt, 1u32);
    let ql_off = b.mad(hh, 64u32, 0u32);
    let ql_off = b.mad(todd, 32u32, ql_off);
    let ql_off = b.cvt::<U64, U32>(ql_off);
    let qla = b.add(base, ql_off);
    let ql = words_2aligned(b, qla, 0, 8);
    let qh_off = b.mul_wide(hh, 32u32);
    let qha = b.add(base, qh_off);
    let qh = words_2aligned(b, qha, 128, 8);
    let thalf = b.shr(tt, 1u32);
    let nib_shift = b.shl(thalf, 2u32);
    let h_shift = b.shl(tt, 1u32);
    // Scales 8h + 2t (l < 16) and 8h + 2t + 1.
    let s_off = b.mad(hh, 8u32, 0u32);
    let s_off = b.mad(tt, 2u32, s_off);
    let s_off = b.cvt::<U64, U32>(s_off);
    let sa = b.add(base, s_off);
    let s0 = b.ld_global_nc_s8(sa, 192);
    let s1 = b.ld_global_nc_s8(sa, 193);
    let dw = b.ld_global_nc_u16(base, 208);
    let d = f16_lo(b, dw);
    let s0f = b.cvt::<F32, S32>(s0);
    let s1f = b.cvt::<F32, S32>(s1);
    let ds = [b.mul(d, s0f), b.mul(d, s1f)];
    let mut vals = Vec::with_capacity(32);
    for i in 0..8 {
        let lo = b.shr(ql[i], nib_shift);
        let lo = b.and(lo, 0x0f0f_0f0fu32);
        let hi = b.shr(qh[i], h_shift);
        let hi = b.and(hi, 0x0303_0303u32);
        let hi = b.shl(hi, 4u32);
        let q = b.or(lo, hi);
        for e in 0..4 {
            let qv = byte(b, q, e);
            let qs = b.bitcast::<S32, U32>(qv);
            let qs = b.sub(qs, 32i32);
            let qf = b.cvt::<F32, S32>(qs);
            vals.push(b.mul(ds[i / 4], qf));
        }
    }
    vals
}

/// The 32 values of `Q8_0` block `t`: `q·d`.
fn dequant_q8_0(b: &mut KernelBuilder, w: Reg<U64>, t: Reg<U32>) -> Vec<Reg<F32>> {
    let boff = b.mul_wide(t, 34u32);
    let base = b.add(w, boff);
    let dw = b.ld_global_nc_u16(base, 0);
    let d = f16_lo(b, dw);
    let qw = words_2aligned(b, base, 2, 8);
    let mut vals = Vec::with_capacity(32);
    for &q in &qw {
        let qs = b.bitcast::<S32, U32>(q);
        for e in 0..4u32 {
            let up = b.shl(qs, 24 - 8 * e);
            let v = b.shr(up, 24u32);
            let qf = b.cvt::<F32, S32>(v);
            vals.push(b.mul(qf, d));
        }
    }
    vals
}

/// How [`quantize_quad`] scales values into quants.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reciprocal {
    /// `q = rint(x / d)`: a division per value.
    Divide,
    /// `q = rint(x · (127 · rcp.approx(max|x|)))`: a multiply per value (within
    /// the same error bound: the scale is off by at most an ulp).
    Approx,
}

/// Quantizes the four values `xs` of this lane to int8 in its group of 32
/// (eight consecutive lanes, reduced with butterfly shuffles): `d = max|x| /
/// 127` over the group, `q = rint(x / d)` (0 for an all-zero group). Returns
/// `d`, the four quants packed into a word (first value in the low byte) and
/// the group's `Σ q` (every lane of the group gets it). About 30 instructions.
pub(crate) fn quantize_quad(b: &mut KernelBuilder, xs: &[Reg<F32>], how: Reciprocal) -> (Reg<F32>, Reg<U32>, Reg<S32>) {
    let mut amax = b.abs(xs[0]);
    for &v in &xs[1..] {
        let a = b.abs(v);
        amax = b.max(amax, a);
    }
    for mask in [1, 2, 4] {
        let o = b.shfl_bfly(amax, mask);
        amax = b.max(amax, o);
    }
    let d = b.div(amax, 127.0f32);
    let inv = match how {
        Reciprocal::Divide => None,
        Reciprocal::Approx => {
            let inv = b.rcp_approx(amax);
            Some(b.mul(inv, 127.0f32))
        }
    };
    let nonzero = b.setp(Cmp::Gt, amax, 0.0f32);
    let word = b.mov(0u32);
    let sum = b.mov(0i32);
    let scale = match inv {
        Some(inv) => (Reciprocal::Approx, inv),
        None => (Reciprocal::Divide, d),
    };
    let (word, mut sum) = pack_quad(b, xs, scale, nonzero, (word, sum));
    for mask in [1, 2, 4] {
        let o = b.shfl_bfly(sum, mask);
        sum = b.add(sum, o);
    }
    (d, word, sum)
}

/// The (up to) four values `xs` as int8 quants, `rint(x·inv)` with
/// `(Reciprocal::Approx, inv)` or `rint(x / d)` with `(Reciprocal::Divide,
/// d)`, 0 where `nonzero` is false, or-ed into `word` (first value in the low
/// byte); returns it and `sum` plus their `Σ q`.
pub(crate) fn pack_quad(
    b: &mut KernelBuilder,
    xs: &[Reg<F32>],
    (how, scale): (Reciprocal, Reg<F32>),
    nonzero: Reg<Pred>,
    (mut word, mut sum): (Reg<U32>, Reg<S32>),
) -> (Reg<U32>, Reg<S32>) {
    for (e, &v) in xs.iter().enumerate() {
        let r = match how {
            Reciprocal::Approx => b.mul(v, scale),
            Reciprocal::Divide => b.div(v, scale),
        };
        let r = b.round_even(r);
        let q = b.cvt::<S32, F32>(r);
        let q = b.selp(q, 0i32, nonzero);
        sum = b.add(sum, q);
        let qu = b.bitcast::<U32, S32>(q);
        let qu = b.and(qu, 0xffu32);
        let qu = b.shl(qu, 8 * e as u32);
        word = b.or(word, qu);
    }
    (word, sum)
}

/// Builds the activation quantizer for `input`: for each 32 consecutive
/// values `x[32g..32g+32]` of the `m × k` activations (`k` a multiple of 32),
/// `d = max|x| / 127`, `q = round(x / d)` (ties to even; 0 when `d` is 0)
/// into `qx[32g..]` (int8) and `(d, d·Σq)` into `ds[2g..]` (`f32`).
/// Params: `x`, `qx`, `ds` (pointers, 16-byte aligned), `quads` (u32,
/// `m·k/4`, at least 1). Launch: [`BLOCK`] threads, `ceil(quads / BLOCK)`
/// blocks. Reads `x` once, writes `1.25` bytes a value.
pub fn quantize_x(input: DType, target: Target) -> Result<Kernel, BuildError> {
    let name = quantize_x_name(input);
    let mut b = KernelBuilder::new(&name, target);
    b.doc(&format!(
        "{name}: per 32 values of x ({input}): d = max|x| / 127, q = rint(x / d) (int8), s = d * sum(q); qx = q, ds = (d, s)"
    ));
    b.doc("eight threads per 32 values, four each; params: x, qx, ds (pointers), quads (u32, values / 4)");
    b.doc(&format!("launch: {BLOCK} threads, ceil(quads / {BLOCK}) blocks"));
    b.max_threads(BLOCK);
    let x = b.param_ptr("x");
    let qx = b.param_ptr("qx");
    let ds = b.param_ptr("ds");
    let quads = b.param::<U32>("quads");
    let t = b.global_index_x();
    // Lanes past the end compute on the last quad (the shuffles need whole
    // warps) and store nothing.
    let valid = b.setp(Cmp::Lt, t, quads);
    let last = b.sub(quads, 1u32);
    let tc = b.min(t, last);
    let xoff = b.mul_wide(tc, 4 * elem::size(input));
    let xa = b.add(x, xoff);
    let xs = elem::load(&mut b, input, xa, 0, 4);
    let (d, word, sum) = quantize_quad(&mut b, &xs, Reciprocal::Divide);
    let done = b.label("done");
    b.bra_unless(valid, done);
    let qoff = b.mul_wide(tc, 4u32);
    let qa = b.add(qx, qoff);
    b.st_global(qa, 0, word);
    let sub = b.and(t, 7u32);
    let lead = b.setp(Cmp::Ne, sub, 0u32);
    b.bra_if(lead, done);
    let sf = b.cvt::<F32, S32>(sum);
    let s = b.mul(d, sf);
    let g = b.shr(tc, 3u32);
    let doff = b.mul_wide(g, 8u32);
    let da = b.add(ds, doff);
    b.st_global_v::<F32, 2>(da, 0, [d.into(), s.into()]);
    b.place(done);
    b.ret();
    b.finish()
}
