//! Attention for decoding shapes: few query rows per key/value head.
//!
//! The query rows of a group (the `group` heads that share a key/value head,
//! `seq_q` rows each) are consecutive in `q` and in the output, so a task
//! takes all `rows = group·seq_q` of them (at most
//! [`crate::tuning::ATTENTION_DECODE_MAX_ROWS`]) against its keys, in blocks
//! of [`ATTENTION_DECODE_BLOCK_K`]. Each block of keys and values is read
//! from memory once for all the rows, and the next block is prefetched into
//! L2 while this one is computed (without it one thread read `f32` keys at
//! 12 GB/s of a 28 GB/s stream; with it, 18):
//!
//! 1. scores of every row against the block, in tiles of 16 dot products
//!    (4 rows × 4 keys, 2 × 8 or 1 × 16) whose 16 vector accumulators are
//!    summed by one transposing tree ([`SimdF32::reduce_add16`]);
//! 2. the online softmax of the prefill kernel ([`Online`]), masking the
//!    keys a row does not see (a causal mask with `seq_q > 1`);
//! 3. `O += P·V` in tiles of 4 rows × 4 vectors of columns: each value
//!    vector is loaded once and multiplied by every row's weight.
//!
//! `f32` keys and values are read in place (when the head size is whole
//! vectors); `f16` and `bf16` blocks are widened into an `f32` buffer first
//! (keys, then values, in the same buffer). On a CPU with AVX512_BF16, bf16
//! runs both products on `vdpbf16ps` straight from the bf16 data
//! ([`gemm::dpbf16::scores`], [`gemm::dpbf16::weighted`]): `q` unscaled
//! (the scale goes on the scores), the softmax weights rounded to bf16 for
//! `P·V` as FlashAttention does, twice the multiply-adds per instruction
//! and nothing widened.
//!
//! Flash-decoding: when (batch, key/value head) pairs are too few to give
//! every thread [`TASKS_PER_THREAD`] tasks, the keys of each pair are cut
//! into chunks (at least [`ATTENTION_DECODE_MIN_CHUNK`] keys, whole blocks)
//! processed in parallel. Each chunk leaves its rows' running max `m`, sum
//! `l` and unnormalised output `O`; the merge takes `M = max m`, scales each
//! chunk by `e^(m − M)` and writes `ΣO·e^(m − M) / Σl·e^(m − M)`, zeros
//! where no chunk saw a key. With chunks, the sums are added in another
//! order than on one thread: results differ from the one-thread result by
//! rounding.
//!
//! Memory: per thread, the group's scaled queries, scores and output
//! accumulator and one widened block (`ATTENTION_DECODE_BLOCK_K · d`
//! values), kept between calls; per call, the chunks' partial results
//! (`rows·(d + 2)` values per chunk) when the keys are split.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};

use compute_core::{AttentionSpec, DType, Element, Result, bf16};

use super::{Online, TASKS_PER_THREAD, finish, out_of_memory, scaled, with_scratch};
use crate::gemm;
use crate::halves::convert;
use crate::isa::Isa;
use crate::kernels::fork;
use crate::simd::{Block, LANES, SimdF32, WithSimd, dispatch};
use crate::tuning::{ATTENTION_DECODE_BLOCK_K, ATTENTION_DECODE_MIN_CHUNK};

/// [`super::attention`] for shapes with at most
/// [`crate::tuning::ATTENTION_DECODE_MAX_ROWS`] query rows per key/value
/// head, on `threads` threads (1: the calling thread only). Lengths were
/// checked by the caller.
pub(super) fn attention<T: Element>(
    isa: Isa,
    spec: &AttentionSpec,
    (q, k, v): (&[T], &[T], &[T]),
    out: &mut [T],
    threads: usize,
) -> Result<()> {
    let d = spec.head_dim;
    let rows = spec.group() * spec.seq_q;
    let pairs = spec.batch * spec.heads_kv;
    let group_len = rows * d;
    // Queries see a prefix of the keys, the last query the longest one.
    let (keys, chunk, chunks) = key_chunks(spec, threads);
    // bf16 on a CPU with AVX512_BF16: both products straight from the bf16
    // data with `vdpbf16ps`, nothing widened.
    let dp = T::DTYPE == DType::BF16 && gemm::bf16::available(isa);
    let sizes = Sizes::new(rows, d, T::DTYPE != DType::F32 || !d.is_multiple_of(LANES));
    let ctx = Ctx { isa, spec, q, k, v, rows, sizes, dp };
    let failed = AtomicBool::new(false);
    let run = |t: Task<'_, T>| {
        if !with_scratch(sizes.total, |buf| ctx.task(t, buf)) {
            failed.store(true, Ordering::Relaxed);
        }
    };
    let out = out.get_mut(..pairs * group_len).unwrap_or_default();
    if chunks == 1 {
        let tasks = out.chunks_exact_mut(group_len).enumerate();
        let tasks: Vec<Task<'_, T>> = tasks.map(|(x, o)| Task { x, keys: 0..keys, dst: Dst::Out(o) }).collect();
        each(tasks, threads, run);
    } else {
        let part = partial_len(rows, d);
        let Some(len) = pairs.checked_mul(chunks).and_then(|n| n.checked_mul(part)) else {
            return Err(out_of_memory(usize::MAX));
        };
        let mut partials = Vec::new();
        if partials.try_reserve_exact(len).is_err() {
            return Err(out_of_memory(len));
        }
        partials.resize(len, 0.0f32);
        let tasks = partials.chunks_exact_mut(part).enumerate().map(|(i, p)| {
            let (x, c) = (i / chunks, i % chunks);
            let keys = c * chunk..((c + 1) * chunk).min(keys);
            Task { x, keys, dst: Dst::Partial(p) }
        });
        each(tasks.collect(), threads, run);
        if !failed.load(Ordering::Relaxed) {
            let merges: Vec<_> =
                out.chunks_exact_mut(group_len).zip(partials.chunks_exact_mut(chunks * part)).collect();
            each(merges, threads, |(o, p)| merge(isa, p, chunks, rows, d, o));
        }
    }
    if failed.load(Ordering::Relaxed) {
        return Err(out_of_memory(sizes.total));
    }
    Ok(())
}

/// `f(item)` for every item, in parallel when `threads > 1`.
fn each<I: Send>(items: Vec<I>, threads: usize, f: impl Fn(I) + Sync) {
    if threads > 1 {
        fork::each(items, f);
    } else {
        items.into_iter().for_each(f);
    }
}

/// The keys the queries of `spec` see at most (the last query's, a prefix
/// of which every other query sees), the keys per chunk on `threads`
/// threads, and the number of chunks.
pub(super) fn key_chunks(spec: &AttentionSpec, threads: usize) -> (usize, usize, usize) {
    let keys = spec.visible(spec.seq_q.saturating_sub(1));
    let chunk = chunk_len(keys, spec.batch.saturating_mul(spec.heads_kv), threads);
    (keys, chunk, keys.div_ceil(chunk).max(1))
}

/// Keys per chunk: all of them (one chunk) on one thread or when `pairs`
/// gives every thread [`TASKS_PER_THREAD`] tasks; else enough chunks for
/// that, of at least [`ATTENTION_DECODE_MIN_CHUNK`] keys, rounded up to
/// whole key blocks. At least 1.
pub(super) fn chunk_len(keys: usize, pairs: usize, threads: usize) -> usize {
    let all = keys.max(1);
    let want = TASKS_PER_THREAD * threads;
    if threads <= 1 || pairs >= want {
        return all;
    }
    let per_pair = want.div_ceil(pairs.max(1));
    let len = keys.div_ceil(per_pair).max(ATTENTION_DECODE_MIN_CHUNK).next_multiple_of(ATTENTION_DECODE_BLOCK_K);
    len.min(all)
}

/// Values of one chunk's partial result: the running max and sum of each
/// row, then the rows' unnormalised outputs (`rows × d`).
fn partial_len(rows: usize, d: usize) -> usize {
    rows * (d + 2)
}

/// One task: the query rows of key/value head `x` (`batch·heads_kv + h`)
/// against `keys`, into their output rows or a partial result.
struct Task<'a, T> {
    x: usize,
    keys: Range<usize>,
    dst: Dst<'a, T>,
}

/// Where a task's result goes.
enum Dst<'a, T> {
    /// The group's output rows (`rows × d`): the task saw every key.
    Out(&'a mut [T]),
    /// A partial result ([`partial_len`] values) for [`merge`].
    Partial(&'a mut [f32]),
}

/// Sizes of the regions of a task's scratch, in values (each a multiple of
/// [`LANES`]).
#[derive(Clone, Copy)]
struct Sizes {
    /// Row stride of the scores (the key block rounded up to whole vectors).
    lds: usize,
    /// Row stride of the scaled queries, the output accumulator and the
    /// widened blocks (`d` rounded up to whole vectors, zeros past `d`).
    ldo: usize,
    qs: usize,
    s: usize,
    o: usize,
    stats: usize,
    /// One widened key or value block (`bk × ldo`), for half data or a head
    /// size that is not whole vectors; else 0 (read in place).
    wide: usize,
    /// All of it: the regions above and two of `stats`.
    total: usize,
}

impl Sizes {
    fn new(rows: usize, d: usize, widen: bool) -> Sizes {
        let bk = ATTENTION_DECODE_BLOCK_K;
        let (lds, ldo) = (bk.next_multiple_of(LANES), d.next_multiple_of(LANES));
        let (qs, s, o, stats) = (rows * ldo, rows * lds, rows * ldo, rows.next_multiple_of(LANES));
        // Also big enough for the bf16 weights (`rows × lds` halves) of the
        // `vdpbf16ps` path.
        let wide = if widen { (bk * ldo).max(rows * lds) } else { 0 };
        Sizes { lds, ldo, qs, s, o, stats, wide, total: qs + s + o + 2 * stats + wide }
    }
}

/// What every task shares.
struct Ctx<'a, T> {
    isa: Isa,
    spec: &'a AttentionSpec,
    q: &'a [T],
    k: &'a [T],
    v: &'a [T],
    /// Query rows per key/value head.
    rows: usize,
    sizes: Sizes,
    /// Run both products on `vdpbf16ps` ([`gemm::dpbf16`]): bf16 data on
    /// a CPU with AVX512_BF16.
    dp: bool,
}

impl<T: Element> Ctx<'_, T> {
    /// Runs one task with `buf` (`sizes.total` values, 64-byte aligned) as scratch.
    fn task(&self, t: Task<'_, T>, buf: &mut [f32]) {
        let Ctx { isa, spec, rows, sizes: z, .. } = *self;
        let d = spec.head_dim;
        let Some((qs, rest)) = buf.split_at_mut_checked(z.qs) else { return };
        let Some((s, rest)) = rest.split_at_mut_checked(z.s) else { return };
        let Some((o, rest)) = rest.split_at_mut_checked(z.o) else { return };
        let Some((m, rest)) = rest.split_at_mut_checked(z.stats) else { return };
        let Some((l, rest)) = rest.split_at_mut_checked(z.stats) else { return };
        let Some(kw) = rest.get_mut(..z.wide) else { return };
        let (Some(m), Some(l)) = (m.get_mut(..rows), l.get_mut(..rows)) else { return };
        // The group's rows, scaled, each padded with zeros to whole vectors.
        let group = self.q.get(t.x * rows * d..(t.x + 1) * rows * d).unwrap_or_default();
        let (kv_len, stride) = (spec.seq_k * d, spec.kv_rows() * d);
        let kh = self.k.get(t.x * stride..t.x * stride + kv_len).unwrap_or_default();
        let vh = self.v.get(t.x * stride..t.x * stride + kv_len).unwrap_or_default();
        // The `vdpbf16ps` path reads the bf16 bits of q (unscaled: the scale
        // goes on the scores), k and v in place.
        let dp = match (bits(group), bits(kh), bits(vh)) {
            (Some(q), Some(k), Some(v)) if self.dp => Some((q, k, v)),
            _ => None,
        };
        qs.fill(0.0);
        if dp.is_none() {
            for (dst, src) in qs.chunks_exact_mut(z.ldo).zip(group.chunks_exact(d)) {
                scaled(isa, src, spec.scale, dst);
            }
        }
        o.fill(0.0);
        m.fill(f32::NEG_INFINITY);
        l.fill(0.0);
        let sq = spec.seq_q.max(1);
        let bk = ATTENTION_DECODE_BLOCK_K;
        let (qb, _) = qs.as_chunks::<LANES>();
        let mut j0 = t.keys.start;
        while j0 < t.keys.end {
            let w = bk.min(t.keys.end - j0);
            // Row `r` is query `r % seq_q` of its head: it sees a prefix of the block.
            let seen = |r: usize| spec.visible(r % sq).saturating_sub(j0).min(w);
            // The last query of each head sees the most keys.
            let width = seen(sq - 1);
            if width == 0 {
                break;
            }
            let keys = j0 * d..(j0 + width) * d;
            // The next block's keys and values, prefetched while this one is
            // computed (the hardware prefetcher alone fell behind).
            let next = ((j0 + w) * d).min(kh.len())..((j0 + 2 * w) * d).min(kh.len());
            let (k_ahead, v_ahead) = (kh.get(next.clone()).unwrap_or_default(), vh.get(next).unwrap_or_default());
            let (k_ahead, v_ahead) = (T::host(k_ahead).as_bytes(), T::host(v_ahead).as_bytes());
            if let Some((qh, kh, vh)) = dp {
                let kb = kh.get(keys.clone()).unwrap_or_default();
                if !gemm::dpbf16::scores(d, (qh, d), rows, (kb, d), width, spec.scale, (&mut *s, z.lds), k_ahead) {
                    return;
                }
                dispatch(isa, Online { s: &mut *s, lds: z.lds, w: width, o: &mut *o, ldo: z.ldo, m, l, seen: &seen });
                // The weights rounded to bf16, read in pairs of keys (the
                // pad past `width` is zero).
                let pairs = width.next_multiple_of(2);
                let pw: &mut [bf16] = bytemuck::cast_slice_mut(&mut *kw);
                for (dst, src) in pw.chunks_exact_mut(z.lds).zip(s.chunks_exact(z.lds)).take(rows) {
                    convert::narrow(isa, src.get(..pairs).unwrap_or_default(), dst);
                }
                let pw: &[u16] = bytemuck::cast_slice(pw);
                let vb = vh.get(keys).unwrap_or_default();
                if !gemm::dpbf16::weighted(width, (pw, z.lds), rows, (vb, d), d, (&mut *o, z.ldo), v_ahead) {
                    return;
                }
                j0 += w;
                continue;
            }
            let kb = block(isa, kh.get(keys.clone()).unwrap_or_default(), d, z.ldo, &mut *kw);
            let (s, o) = (&mut *s, &mut *o);
            dispatch(isa, Scores { q: qb, rows, k: kb, keys: width, s: &mut *s, lds: z.lds, ahead: k_ahead });
            dispatch(isa, Online { s: &mut *s, lds: z.lds, w: width, o: &mut *o, ldo: z.ldo, m, l, seen: &seen });
            // The key block is spent: its buffer takes the value block.
            let vb = block(isa, vh.get(keys).unwrap_or_default(), d, z.ldo, &mut *kw);
            dispatch(isa, Accumulate { p: s, lds: z.lds, rows, v: vb, keys: width, o, ahead: v_ahead });
            j0 += w;
        }
        match t.dst {
            Dst::Out(out) => finish(isa, o, z.ldo, l, d, out),
            Dst::Partial(p) => {
                let (pm, rest) = p.split_at_mut(rows.min(p.len()));
                let (pl, po) = rest.split_at_mut(rows.min(rest.len()));
                pm.iter_mut().zip(m.iter()).for_each(|(x, &y)| *x = y);
                pl.iter_mut().zip(l.iter()).for_each(|(x, &y)| *x = y);
                for (dst, src) in po.chunks_exact_mut(d).zip(o.chunks(z.ldo)) {
                    dst.iter_mut().zip(src).for_each(|(x, &y)| *x = y);
                }
            }
        }
    }
}

/// The bits of `x` when `T` is bf16.
fn bits<T: Element>(x: &[T]) -> Option<&[u16]> {
    bf16::from_host(T::host(x)).map(bytemuck::cast_slice::<bf16, u16>)
}

/// Rows of `d` values of `src` (keys or values of one block) as whole
/// vectors of `f32`, `ld = d` rounded up to whole vectors apart: `src`
/// itself when it is `f32` and `d` is whole vectors, else widened (or
/// copied) into `buf`, zeros past `d`.
fn block<'a, T: Element>(isa: Isa, src: &'a [T], d: usize, ld: usize, buf: &'a mut [f32]) -> &'a [Block] {
    if ld == d
        && let Some(s) = f32::from_host(T::host(src))
    {
        return s.as_chunks::<LANES>().0;
    }
    let n = src.len() / d.max(1);
    let buf = buf.get_mut(..n * ld).unwrap_or_default();
    if ld == d {
        convert::widen(isa, src, buf);
    } else {
        for (dst, row) in buf.chunks_exact_mut(ld).zip(src.chunks_exact(d)) {
            let (head, pad) = dst.split_at_mut(d);
            convert::widen(isa, row, head);
            pad.fill(0.0);
        }
    }
    buf.as_chunks::<LANES>().0
}

/// Scores of one key block: `s[r·lds + j] = q[r]·k[j]` for the `rows` rows
/// of `q` and the `keys` rows of `k` (both of whole vectors, `q.len() /
/// rows` apart; `s` may be written past `keys` up to a multiple of 16).
///
/// Tiles of 16 dot products (4 rows × 4 keys, 2 × 8 or 1 × 16, as the rows
/// left allow) accumulate along the depth in 16 vectors, summed by one
/// [`SimdF32::reduce_add16`]; with fewer registers (AVX2, portable), tiles
/// of 2 × 2 or 1 × 4 with a [`SimdF32::reduce_add`] each.
struct Scores<'a> {
    q: &'a [Block],
    rows: usize,
    k: &'a [Block],
    keys: usize,
    s: &'a mut [f32],
    lds: usize,
    /// Bytes to prefetch along the way (the next block's keys), in step
    /// with the keys of the first row tile.
    ahead: &'a [u8],
}

impl WithSimd for Scores<'_> {
    type Output = ();
    #[inline(always)]
    fn run<S: SimdF32>(mut self, s: S) {
        let mut r = 0;
        while r < self.rows {
            let left = self.rows - r;
            r += if S::VECTORS >= 32 {
                match left {
                    1 => self.tile::<S, 1, 16>(s, r),
                    2 | 3 => self.tile::<S, 2, 8>(s, r),
                    _ => self.tile::<S, 4, 4>(s, r),
                }
            } else if left == 1 {
                self.tile::<S, 1, 4>(s, r)
            } else {
                self.tile::<S, 2, 2>(s, r)
            };
        }
    }
}

impl Scores<'_> {
    /// Rows `r..r + MX` (fewer at the edge: the last row repeats, its sums
    /// dropped) against every key, `NY` keys at a time (past the last key
    /// the last one repeats; those sums land in `s` past `keys`, where the
    /// softmax masks them). Returns `MX`.
    #[inline(always)]
    fn tile<S: SimdF32, const MX: usize, const NY: usize>(&mut self, s: S, r: usize) -> usize {
        let (qs, ks, lds) = (self.q, self.k, self.lds);
        let nb = qs.len() / self.rows.max(1);
        let used = (self.rows - r).min(MX);
        let zero = s.splat(0.0);
        // Every row sliced to exactly `nb` vectors, so the loads below need
        // no bounds checks.
        let mut q: [&[Block]; MX] = [&[]; MX];
        for (x, dst) in q.iter_mut().enumerate() {
            let Some(src) = qs.get((r + x.min(used - 1)) * nb..).and_then(|m| m.get(..nb)) else { return MX };
            *dst = src;
        }
        // Bytes of `ahead` per key, prefetched by the first row tile only.
        let per_key = if r == 0 { self.ahead.len().div_ceil(self.keys.max(1)) } else { 0 };
        let mut j = 0;
        while j < self.keys {
            if per_key > 0 {
                s.prefetch_bytes(
                    self.ahead.get(j * per_key..).unwrap_or_default().get(..NY * per_key).unwrap_or_default(),
                );
            }
            let mut k: [&[Block]; NY] = [&[]; NY];
            for (y, dst) in k.iter_mut().enumerate() {
                let Some(src) = ks.get((j + y).min(self.keys - 1) * nb..).and_then(|m| m.get(..nb)) else { return MX };
                *dst = src;
            }
            let mut acc = [[zero; NY]; MX];
            for c in 0..nb {
                let mut kv = [zero; NY];
                for (v, row) in kv.iter_mut().zip(&k) {
                    if let Some(b) = row.get(c) {
                        *v = s.load(b);
                    }
                }
                for (a, row) in acc.iter_mut().zip(&q) {
                    if let Some(b) = row.get(c) {
                        let qv = s.load(b);
                        for (x, &y) in a.iter_mut().zip(&kv) {
                            *x = s.fma(qv, y, *x);
                        }
                    }
                }
            }
            let mut sums = [0.0f32; LANES];
            if MX * NY == LANES {
                let mut all = [zero; LANES];
                for (dst, src) in all.chunks_exact_mut(NY).zip(&acc) {
                    dst.copy_from_slice(src);
                }
                s.store(&mut sums, s.reduce_add16(all));
            } else {
                for (dst, src) in sums.chunks_exact_mut(NY).zip(&acc) {
                    for (d, &v) in dst.iter_mut().zip(src) {
                        *d = s.reduce_add(v);
                    }
                }
            }
            for (x, sum) in sums.chunks_exact(NY).take(used).enumerate() {
                let at = (r + x) * lds + j;
                if let Some(dst) = self.s.get_mut(at..at + NY) {
                    dst.copy_from_slice(sum);
                }
            }
            j += NY;
        }
        MX
    }
}

/// `o[r] += Σ_j p[r·lds + j]·v[j]` for the `rows` rows of `o` (whole
/// vectors, `o.len() / rows` apart) and the first `keys` rows of `v` (as
/// wide as `o`'s): the weights times the value block.
///
/// Tiles of 4 rows × 4 vectors of columns (16 accumulators; 4 × 1 with
/// fewer registers), 2 or 1 rows at the edge, run down the keys: each value
/// vector is loaded once per tile and multiplied by every row's weight.
struct Accumulate<'a> {
    p: &'a [f32],
    lds: usize,
    rows: usize,
    v: &'a [Block],
    keys: usize,
    o: &'a mut [f32],
    /// Bytes to prefetch along the way (the next block's values), in step
    /// with the keys of the first tile.
    ahead: &'a [u8],
}

impl WithSimd for Accumulate<'_> {
    type Output = ();
    #[inline(always)]
    fn run<S: SimdF32>(mut self, s: S) {
        let nb = self.o.len() / LANES / self.rows.max(1);
        let mut r = 0;
        while r < self.rows {
            let left = self.rows - r;
            let mut c = 0;
            while c < nb {
                let wide = S::VECTORS >= 32 && nb - c >= 4;
                c += match (left, wide) {
                    (1, true) => self.tile::<S, 1, 4>(s, r, c),
                    (1, false) => self.tile::<S, 1, 1>(s, r, c),
                    (2 | 3, true) => self.tile::<S, 2, 4>(s, r, c),
                    (2 | 3, false) => self.tile::<S, 2, 1>(s, r, c),
                    (_, true) => self.tile::<S, 4, 4>(s, r, c),
                    (_, false) => self.tile::<S, 4, 1>(s, r, c),
                };
            }
            r += left.min(if left >= 4 {
                4
            } else if left >= 2 {
                2
            } else {
                1
            });
        }
    }
}

impl Accumulate<'_> {
    /// Rows `r..r + MX` (at most the rows left) by column vectors
    /// `c..c + NV`. Returns `NV`.
    #[inline(always)]
    fn tile<S: SimdF32, const MX: usize, const NV: usize>(&mut self, s: S, r: usize, c: usize) -> usize {
        let (p, vs, lds) = (self.p, self.v, self.lds);
        let nb = self.o.len() / LANES / self.rows.max(1);
        let used = (self.rows - r).min(MX);
        let zero = s.splat(0.0);
        // Every weight row sliced to exactly `keys` values, so the loads
        // below need no bounds checks.
        let keys = self.keys.min(vs.len() / nb.max(1));
        let mut pr: [&[f32]; MX] = [&[]; MX];
        for (x, dst) in pr.iter_mut().enumerate() {
            let at = (r + x.min(used - 1)) * lds;
            let Some(src) = p.get(at..at + keys) else { return NV };
            *dst = src;
        }
        // Bytes of `ahead` per key, prefetched by the first tile only.
        let per_key = if r == 0 && c == 0 { self.ahead.len().div_ceil(keys.max(1)) } else { 0 };
        let mut acc = [[zero; NV]; MX];
        for (j, vrow) in vs.chunks_exact(nb).take(keys).enumerate() {
            if per_key > 0 {
                s.prefetch_bytes(self.ahead.get(j * per_key..).unwrap_or_default().get(..per_key).unwrap_or_default());
            }
            let Some(vrow) = vrow.get(c..c + NV) else { break };
            let mut vv = [zero; NV];
            for (v, b) in vv.iter_mut().zip(vrow) {
                *v = s.load(b);
            }
            for (a, row) in acc.iter_mut().zip(&pr) {
                if let Some(&w) = row.get(j) {
                    let w = s.splat(w);
                    for (x, &y) in a.iter_mut().zip(&vv) {
                        *x = s.fma(w, y, *x);
                    }
                }
            }
        }
        let (ob, _) = self.o.as_chunks_mut::<LANES>();
        for (x, a) in acc.iter().enumerate().take(used) {
            for (y, &v) in a.iter().enumerate() {
                if let Some(b) = ob.get_mut((r + x) * nb + c + y) {
                    s.store(b, s.add(s.load(b), v));
                }
            }
        }
        NV
    }
}

/// Merges the partial results `p` of `chunks` key chunks of one group
/// (`chunks` × [`partial_len`] values) into its `rows × d` output rows `out`
/// with the log-sum-exp rule; the first chunk's rows hold the sum.
fn merge<T: Element>(isa: Isa, p: &mut [f32], chunks: usize, rows: usize, d: usize, out: &mut [T]) {
    let part = partial_len(rows, d);
    if chunks == 0 || p.len() < chunks * part {
        return;
    }
    let (first, rest) = p.split_at_mut(part);
    let (m0, first) = first.split_at_mut(rows);
    let (l0, o0) = first.split_at_mut(rows);
    for (r, dst) in out.chunks_exact_mut(d).take(rows).enumerate() {
        let others = rest.chunks_exact(part).map(|c| (c[r], c[rows + r], &c[2 * rows + r * d..][..d]));
        let top = others.clone().fold(m0[r], |a, (m, _, _)| a.max(m));
        let acc = &mut o0[r * d..(r + 1) * d];
        if top == f32::NEG_INFINITY {
            // No chunk saw a key for this row.
            acc.fill(0.0);
        } else {
            let a0 = (m0[r] - top).exp();
            let mut sum = l0[r] * a0;
            if a0 != 1.0 {
                acc.iter_mut().for_each(|x| *x *= a0);
            }
            for (m, l, o) in others {
                // A chunk that saw no key for this row adds zeros (`a = 0`).
                let a = (m - top).exp();
                sum += l * a;
                for (x, &y) in acc.iter_mut().zip(o) {
                    *x += a * y;
                }
            }
            let inv = if sum == 0.0 { 0.0 } else { (1.0 / f64::from(sum)) as f32 };
            acc.iter_mut().for_each(|x| *x *= inv);
        }
        convert::narrow(isa, acc, dst);
    }
}
