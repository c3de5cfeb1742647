//! One-row products with `Q4_K` weights and long rows, `y = x·Wᵀ` for a
//! single activation row (a decoder's step), with the inner dimension split over
//! the warps of a block: each warp keeps one slice of `x` in registers,
//! quantized to int8 there, and streams the slice's weight blocks of many
//! rows past it.
//!
//! Why: the one-launch kernels of the parent module read the activations
//! back from shared memory for every weight block (with two weight rows a
//! warp, one 16-byte load of `x` quants per 32 bytes of weight quants), and
//! those reads, not the weight bytes, hold back their long rows. Here a lane
//! reads and quantizes its 64 activation values once per chunk of rows, and
//! each weight byte costs only its own load: 3 16-byte loads a lane per
//! block and row, with the unpacking and `dp4a` products of the parent's
//! wide layout (4 lanes a block, each a 32-byte run of quants: groups `2r`
//! and `2r + 1`). Rows shorter than [`MIN_K`] stay on the one-launch
//! kernels, which were as fast or faster there; `Q5_K`, whose batches of
//! rows would have to halve to fit the registers, too (see the benchmarks
//! page).
//!
//! Layout: a slice is [`SLICE_BLOCKS`] weight blocks (2048 values); a row of
//! `k` values has `slices = ceil(k / 2048)`. A block of the grid holds `cpb`
//! chunks of `slices` warps (warp `w` takes slice `w mod slices` of chunk
//! `w / slices`); chunk `c` takes the `rpc` weight rows from `c·rpc`,
//! [`BATCH`] at a time with their loads issued together. The lanes' sums of
//! a batch are added across the warp by a transposing butterfly (one shuffle
//! per row and a few more), each slice's sum of a row goes to shared
//! memory, and after one barrier the block's threads add the slices in
//! order and store `y`. Deterministic: no atomics.
//!
//! The kernel waits for the kernel before it (programmatic dependent launch)
//! at its top, before anything else. A build that asked its first rows into
//! L2 first and waited after them, as the parent's kernels do, read stale
//! activations in a decoder: `ptxas` took the activations' `ld.global.nc`
//! loads, which follow the wait in straight-line code, for constants and
//! moved them above `griddepcontrol.wait` (`cargo xtask ptx --check` now
//! rejects machine code with a global access before that wait).
//!
//! Error: that of the parent's kernels (int8 activations per 32 values,
//! `q = round(x·127/max|x|)` with an approximate reciprocal, `f32` sums).

use super::gemm_epilogue::{self, EpilogueKind};
use super::quant::{Reciprocal, pack_quad};
use super::{Decoded, dot, fetch, lane_consts, unpack};
use crate::builder::{BuildError, Cmp, Dim, F32, Kernel, KernelBuilder, Reg, S32, Target, U32};
use crate::kernels::elem;
use compute_core::DType;
use compute_core::quant::BlockFormat;

/// Weight blocks in one warp's slice of a row (4 lanes each): 2048 values.
pub const SLICE_BLOCKS: u32 = 8;
/// The most slices a row may have ([`slices`]): `k ≤ 32768`.
pub const MAX_SLICES: u32 = 16;
/// Warps a block of the grid aims for (whole chunks of `slices` warps).
pub const BLOCK_WARPS: u32 = 8;
/// The most weight rows a chunk takes (a multiple of [`BATCH`]): a block's
/// slice sums (`4·rpc·slices·cpb` bytes, `slices·cpb ≤ 16`) then stay within
/// 48 KiB of shared memory.
pub const MAX_CHUNK_ROWS: u32 = 768;

/// The shortest rows (`k`) that take the split kernel: at 4096 × 14336 a
/// build of it took 16.5 µs on an H100 where the one-launch kernel took
/// 18.2–18.5, at 2048 × 8192 8.3 against 8.5, at 14336 × 4096 15.7–15.9
/// against 15.1 (that build's activation loads ran ahead of its wait; see
/// the module's note).
pub const MIN_K: usize = 8192;

/// Whether `format` has a split kernel (`Q4_K`). Free.
pub fn supported(format: BlockFormat) -> bool {
    format == BlockFormat::Q4K
}

/// Whether a one-row product of `format` with rows of `k` values takes the
/// split kernel: `Q4_K`, `MIN_K ≤ k ≤` [`MAX_SLICES`] slices. Free.
pub fn takes(format: BlockFormat, k: usize) -> bool {
    supported(format) && k >= MIN_K && slices(k) <= MAX_SLICES as usize
}

/// Slices of a row of `k` values (`k` a multiple of 256): `ceil(k / 2048)`. Free.
pub fn slices(k: usize) -> usize {
    (k / 256).div_ceil(SLICE_BLOCKS as usize)
}

/// Weight rows of one batch, whose loads (12 words a lane each) are issued
/// together (1, 2, 4 or 8: the transposing butterfly takes that many).
pub const BATCH: u32 = 4;
const _: () = assert!(BATCH.is_power_of_two() && BATCH <= 8);

/// Name of the kernel (`qgemvs_q4k_f32_bf16`, then the epilogue's suffix:
/// `qgemvs_q4k_bf16_bf16_ep_c`).
pub fn name(format: BlockFormat, input: DType, out: DType, epilogue: Option<EpilogueKind>) -> String {
    let ep = EpilogueKind::suffix(epilogue);
    format!("qgemvs_{}_{}_{}{ep}", super::quant::tag(format), input.as_str(), out.as_str())
}

/// Builds the split one-row GEMV of `format` (`Q4_K`) from
/// activations of `input` into `out`: `y[j] = Σ_p x[p]·W[j, p]` for `j < n`,
/// through `epilogue` in the stores where there is one.
/// Params: `w` (the blocks, `n` rows of `k / 256`; 16-byte aligned), `x`
/// (`k` values, 16-byte aligned), `y` (pointers), `n`, `k` (u32, `256 ≤ k ≤
/// 32768`), `rpc` (u32, weight rows per chunk, a multiple of [`BATCH`]),
/// then with an `epilogue` its `alpha`, `beta` (f32), bias and `C₀`
/// (pointers; [`gemm_epilogue`]).
/// Launch: `32·slices·cpb` threads (`cpb` chunks a block), `ceil(n / (cpb·rpc))`
/// blocks, `4·rpc·slices·cpb` bytes of dynamic shared memory (the slices' sums).
/// Reads each weight byte once and `x` once per chunk.
pub fn qgemv_split(
    format: BlockFormat,
    input: DType,
    out: DType,
    epilogue: Option<EpilogueKind>,
    target: Target,
) -> Result<Kernel, BuildError> {
    let kname = name(format, input, out, epilogue);
    if !supported(format) {
        let why = format!("no split GEMV for {format}");
        return Err(BuildError { kernel: kname, problems: vec![why] });
    }
    let bt = BATCH;
    let bytes = format.bytes_per_block() as u32;
    let mut b = KernelBuilder::new(&kname, target);
    b.doc(&format!(
        "{kname}: y[j] = sum_p x[p] * W[j, p] for one row x ({input}); W rows of {format} blocks; {out} out"
    ));
    b.doc(&format!(
        "warp w: slice w % slices ({SLICE_BLOCKS} blocks, 4 lanes each; x quantized to int8 per 32 values in registers) of chunk w / slices (rpc rows, {bt} at a time); slice sums through shared memory"
    ));
    b.doc("params: w, x, y (pointers), n, k, rpc (u32)");
    gemm_epilogue::doc(&mut b, epilogue);
    b.doc("launch: 32 * slices * cpb threads, ceil(n / (cpb * rpc)) blocks, 4 * rpc * slices * cpb bytes of dynamic shared memory");
    b.max_threads(32 * MAX_SLICES);
    let w = b.param_ptr("w");
    let x = b.param_ptr("x");
    let y = b.param_ptr("y");
    let n = b.param::<U32>("n");
    let k = b.param::<U32>("k");
    let rpc = b.param::<U32>("rpc");
    let epi = gemm_epilogue::params(&mut b, epilogue);
    let smem = b.dynamic_shared("sums", 16);
    let sbase = b.shared_base(&smem);
    let tid = b.tid(Dim::X);
    let threads = b.ntid(Dim::X);
    let lane = b.and(tid, 31u32);
    let warp = b.shr(tid, 5u32);
    let cta = b.ctaid(Dim::X);

    b.comment("this warp's slice and chunk; this lane's block and run of quants");
    let nb = b.shr(k, 8u32);
    let slices = b.add(nb, SLICE_BLOCKS - 1);
    let slices = b.shr(slices, SLICE_BLOCKS.trailing_zeros());
    let slice = b.rem(warp, slices);
    let chunk_in_block = b.div(warp, slices);
    let warps = b.shr(threads, 5u32);
    let rows_per_block = b.mul(warps, rpc);
    let rows_per_block = b.div(rows_per_block, slices);
    let block_row0 = b.mul(cta, rows_per_block);
    let row0 = b.mad(chunk_in_block, rpc, block_row0);
    let sub = b.and(lane, 3u32);
    let blk = b.shr(lane, 2u32);
    let bi = b.mad(slice, SLICE_BLOCKS, blk);
    let valid = b.setp(Cmp::Lt, bi, nb);
    let nbm1 = b.sub(nb, 1u32);
    let bi = b.min(bi, nbm1);
    let nm1 = b.sub(n, 1u32);
    let row_bytes = b.mul(nb, bytes);
    let boff = b.mul_wide(bi, bytes);
    let wcol = b.add(w, boff);
    let ln = lane_consts(&mut b, format, true, sub);

    b.comment("this lane's 64 activation values (groups 2r and 2r + 1 of its block), quantized");
    let xo = b.mad(bi, 256u32, ln.xo);
    let xoff = b.mul_wide(xo, elem::size(input));
    let xa = b.add(x, xoff);
    let mut xs = Vec::new();
    for c in 0..8i64 {
        xs.extend(elem::load(&mut b, input, xa, c * 8 * elem::size(input) as i64, 8));
    }
    let (d0, s0, q0) = quantize_group(&mut b, &xs[..32]);
    let (d1, s1, q1) = quantize_group(&mut b, &xs[32..]);

    b.comment(&format!("the chunk's rows, {bt} at a time: loads, products, sums across the warp"));
    let r = b.mov(0u32);
    let lp = b.label("rows");
    let done = b.label("rows_done");
    b.place(lp);
    let over = b.setp(Cmp::Ge, r, rpc);
    b.bra_if(over, done);
    let raws: Vec<Vec<Reg<U32>>> = (0..bt)
        .map(|t| {
            let row = b.add(row0, r);
            let row = b.add(row, t);
            let row = b.min(row, nm1);
            let roff = b.mul_wide(row, row_bytes);
            let base = b.add(wcol, roff);
            fetch(&mut b, format, &ln, base)
        })
        .collect();
    let mut sums: Vec<Reg<F32>> = Vec::new();
    for raw in &raws {
        let Decoded::K4 { lo, hi, dl, nml } = unpack(&mut b, format, &ln, raw) else {
            let why = format!("{format} blocks did not unpack as 4-bit groups");
            return Err(BuildError { kernel: kname, problems: vec![why] });
        };
        let i0 = dot(&mut b, &lo, &q0);
        let i1 = dot(&mut b, &hi, &q1);
        let c0 = b.mul(dl[0], d0);
        let c1 = b.mul(dl[1], d1);
        let v = b.mul(nml[0], s0);
        let v = b.fma(c0, i0, v);
        let v = b.fma(nml[1], s1, v);
        let v = b.fma(c1, i1, v);
        sums.push(b.selp(v, 0.0f32, valid));
    }
    let (total, pick) = transpose_sum(&mut b, &sums, lane);
    // Lanes 32/bt·i hold row i's sum: part[(chunk·rpc + r + i)·slices + slice].
    let lead = b.and(lane, 32 / bt - 1);
    let lead = b.setp(Cmp::Eq, lead, 0u32);
    let rl = b.mad(chunk_in_block, rpc, r);
    let rl = b.add(rl, pick);
    let at = b.mad(rl, slices, slice);
    let sa = b.mad(at, 4u32, sbase);
    b.guarded(lead, false, |b| b.st_shared(sa, 0, total));
    let r2 = b.add(r, bt);
    b.assign(r, r2);
    b.bra(lp);
    b.place(done);
    b.bar_sync();

    b.comment("the block's rows: the slices' sums added in order, stored");
    let i = b.mov(tid);
    let sl = b.label("store");
    let sd = b.label("stored");
    b.place(sl);
    let over = b.setp(Cmp::Ge, i, rows_per_block);
    b.bra_if(over, sd);
    let j = b.add(block_row0, i);
    let past = b.setp(Cmp::Ge, j, n);
    b.bra_if(past, sd);
    let first = b.mul(i, slices);
    let a0 = b.mad(first, 4u32, sbase);
    let acc = b.mov(0.0f32);
    let s = b.mov(0u32);
    let al = b.label("slices");
    let ad = b.label("slices_done");
    b.place(al);
    let end = b.setp(Cmp::Ge, s, slices);
    b.bra_if(end, ad);
    let sa = b.mad(s, 4u32, a0);
    let v = b.ld_shared::<F32>(sa, 0);
    let a2 = b.add(acc, v);
    b.assign(acc, a2);
    let s2 = b.add(s, 1u32);
    b.assign(s, s2);
    b.bra(al);
    b.place(ad);
    let yoff = b.mul_wide(j, elem::size(out));
    let ya = b.add(y, yoff);
    let val = match epi {
        Some(e) => e.element(&mut b, out, (yoff, j), acc),
        None => acc,
    };
    elem::store(&mut b, out, ya, 0, &[val]);
    let i2 = b.add(i, threads);
    b.assign(i, i2);
    b.bra(sl);
    b.place(sd);
    b.ret();
    b.finish()
}

/// Quantizes 32 activation values held by one lane as the activation
/// quantizer does: `d = max|x| / 127`, `q = round(x·(127 / max|x|))` (ties
/// to even, approximate reciprocal; 0 when `max|x|` is 0). Returns `d`,
/// `d·Σq` and the 8 words of int8 quants.
fn quantize_group(b: &mut KernelBuilder, xs: &[Reg<F32>]) -> (Reg<F32>, Reg<F32>, Vec<Reg<U32>>) {
    let mut amax = b.abs(xs[0]);
    for &v in &xs[1..] {
        let a = b.abs(v);
        amax = b.max(amax, a);
    }
    let d = b.div(amax, 127.0f32);
    let inv = b.rcp_approx(amax);
    let inv = b.mul(inv, 127.0f32);
    let nonzero = b.setp(Cmp::Gt, amax, 0.0f32);
    let mut sum = b.mov(0i32);
    let words = xs
        .chunks(4)
        .map(|quad| {
            let word = b.mov(0u32);
            let (word, s) = pack_quad(b, quad, (Reciprocal::Approx, inv), nonzero, (word, sum));
            sum = s;
            word
        })
        .collect();
    let sf = b.cvt::<F32, S32>(sum);
    let s = b.mul(d, sf);
    (d, s, words)
}

/// Adds each of `vals` (one per row, 1, 2, 4 or 8 of them) across the 32
/// lanes with `log2(len)` halving exchanges (each lane keeps half of its
/// rows and sends the other half to its partner) and then a butterfly on
/// the one value left: `len − 1 + 5 − log2(len)` shuffles in all. Returns
/// the sum each lane holds and its row: `lane / (32 / len)` (`len` a power
/// of two up to 8, as [`BATCH`] is checked to be).
fn transpose_sum(b: &mut KernelBuilder, vals: &[Reg<F32>], lane: Reg<U32>) -> (Reg<F32>, Reg<U32>) {
    let len = vals.len() as u32;
    let mut cur = vals.to_vec();
    let mut mask = 16u32;
    while cur.len() > 1 {
        // Lanes with this bit set keep the upper half of the rows.
        let bit = b.and(lane, mask);
        let upper = b.setp(Cmp::Ne, bit, 0u32);
        let half = cur.len() / 2;
        cur = (0..half)
            .map(|i| {
                let (lo, hi) = (cur[i], cur[i + half]);
                let keep = b.selp(hi, lo, upper);
                let send = b.selp(lo, hi, upper);
                let got = b.shfl_bfly(send, mask);
                b.add(keep, got)
            })
            .collect();
        mask /= 2;
    }
    let mut v = cur[0];
    while mask >= 1 {
        let o = b.shfl_bfly(v, mask);
        v = b.add(v, o);
        mask /= 2;
    }
    let pick = b.shr(lane, (32 / len).trailing_zeros());
    (v, pick)
}
