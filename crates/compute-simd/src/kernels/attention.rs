//! Fused attention, `out = softmax(scale·q·kᵀ + mask)·v`, FlashAttention-style:
//! the `seq_q × seq_k` score matrix never exists. Each task takes a block of
//! [`ATTENTION_BLOCK_Q`] query rows of one (batch, head), scaled by `scale`
//! once, and streams over blocks of [`ATTENTION_BLOCK_K`] keys:
//!
//! 1. `S = (scale·Q)·Kᵀ` on the SGEMM micro-kernels: the key block packed
//!    once as transposed panels (`gemm::pack_transposed`), or, for a few
//!    rows, dot products of rows without packing;
//! 2. per row, the online softmax: the running maximum `m` and sum `l` are
//!    updated, `S` becomes `P = e^(S − m)` in place (vectorised `exp`; zero
//!    past the keys the row sees), and the row's output accumulator is
//!    rescaled by `e^(m_old − m)` when the maximum moved;
//! 3. `O += P·V` on the micro-kernels, `V` read in place
//!    (`gemm::rows_product`).
//!
//! At the end each row is `O / l`, or zeros for a query that saw no key.
//!
//! `f16` and `bf16` data are read in place: each task widens its query rows
//! into its scaled-query scratch, and each key block and value block into an
//! `f32` block buffer as it reaches them ([`convert::widen`]); output rows
//! are rounded to the dtype once, when stored. Nothing proportional to the
//! tensors is allocated. `f32` keys and values are read in place.
//!
//! Decoding shapes (at most [`ATTENTION_DECODE_MAX_ROWS`] query rows per
//! key/value head: one query, or a few, times the heads of a group) take the
//! `decode` kernel: every query row of a group against each key block at
//! once, so the group's keys and values are read once, with the keys of
//! each head split into chunks processed in parallel when there are too few
//! heads for the threads (flash-decoding), merged with the log-sum-exp
//! rule; bf16 on a CPU with AVX512_BF16 runs both products on `vdpbf16ps`.
//!
//! Masks: the key range of a query block stops at the last key its last row
//! sees (causal masks skip every block past the diagonal), and rows that see
//! none of a key block sit it out. On the diagonal the rows go in segments
//! of [`ATTENTION_DIAGONAL_ROWS`], each computing up to the last key one of
//! its rows sees, and the rest is masked element by element. Everything is
//! `f32`.
//!
//! Extra memory: per thread, one block of scaled queries, scores, output
//! accumulators and packed keys (about `bq·(2·d + bk) + bk·d` values, plus
//! `bk·d` for the ragged columns of `V`, touched only when `d` is not a
//! whole number of panels, and `2·bk·d` for the widened key and value
//! blocks of half data), kept between calls and independent of the
//! sequence lengths.
//! Tasks run in parallel above [`PAR_GEMM_MIN_MACS`] multiply-adds
//! (`fork::each`), the heaviest first.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};

use compute_core::{AttentionSpec, BackendKind, ComputeError, DType, Element, Result};

use super::fork;
use super::par;
use crate::gemm;
use crate::halves::convert;
use crate::isa::Isa;
use crate::simd::{Block, LANES, LaneFn, SimdF32, WithSimd, blocks, dispatch, math};
use crate::tuning::{
    ATTENTION_BLOCK_K, ATTENTION_BLOCK_Q, ATTENTION_DECODE_MAX_ROWS, ATTENTION_DIAGONAL_ROWS, GEMM_DOTS_MAX_M,
    PAR_GEMM_MIN_MACS,
};

mod decode;

/// Fewest query rows per task when a block is cut smaller so that every
/// thread gets work.
const MIN_BLOCK_Q: usize = 8;

/// Tasks per thread below which query blocks are cut smaller: with a causal
/// mask the tasks differ in size, and the heaviest-first order balances them
/// only when each thread gets several.
const TASKS_PER_THREAD: usize = 4;

/// Computes the attention described by `spec` (layouts in [`AttentionSpec`])
/// from `q`, `k` and `v` into `out`, all of element type `T` (`f32`, `f16`
/// or `bf16`; `spec.dtype` is not consulted), on the kernels of `isa` (the
/// portable ones if this CPU lacks it). Shapes are validated by the
/// backend: slices shorter than the spec leave `out` unwritten.
///
/// Costs `4·d` FLOPs per visible (query, key) pair on the SGEMM
/// micro-kernels (plus the masked part of the blocks on a causal diagonal),
/// one vectorised `exp` per computed score, and one copy of every key block
/// per query block (packing; for half data also one widening of every key
/// and value block per query block). Uses every thread of the pool in scope
/// above [`PAR_GEMM_MIN_MACS`] multiply-adds, over (batch, head, query
/// block) tasks, or for decoding shapes over (batch, key/value head, key
/// chunk) tasks. Memory: see the module documentation; `OutOfMemory` if a
/// thread's block buffers (or the partial results of key chunks) cannot be
/// allocated (the rows of its tasks are then left unwritten).
pub fn attention<T: Element>(isa: Isa, spec: &AttentionSpec, q: &[T], k: &[T], v: &[T], out: &mut [T]) -> Result<()> {
    let isa = if isa.is_supported() { isa } else { Isa::Portable };
    let d = spec.head_dim;
    let heads = spec.batch.checked_mul(spec.heads_q);
    let q_head = spec.seq_q.checked_mul(d);
    let kv_heads = spec.batch.checked_mul(spec.heads_kv);
    // Each key/value head holds `kv_rows` rows (a cache's capacity), of which
    // the first `seq_k` are read.
    let kv_head = spec.kv_rows().checked_mul(d);
    let (Some(heads), Some(q_head), Some(kv_heads), Some(kv_head)) = (heads, q_head, kv_heads, kv_head) else {
        return Ok(());
    };
    let fits = |len: usize, n: usize, per: usize| n.checked_mul(per).is_some_and(|need| need <= len);
    if heads == 0 || q_head == 0 || spec.heads_kv == 0 || !spec.heads_q.is_multiple_of(spec.heads_kv) {
        return Ok(());
    }
    if !(fits(q.len(), heads, q_head)
        && fits(out.len(), heads, q_head)
        && fits(k.len(), kv_heads, kv_head)
        && fits(v.len(), kv_heads, kv_head))
    {
        return Ok(());
    }
    let workers = workers(spec, par::threads());
    if spec.group().saturating_mul(spec.seq_q) <= ATTENTION_DECODE_MAX_ROWS {
        return decode::attention(isa, spec, (q, k, v), out, workers);
    }
    let bq = block_rows(spec.seq_q, heads, workers);
    let bk = ATTENTION_BLOCK_K;
    let sizes = Sizes::new(isa, bq, bk, d, T::DTYPE != DType::F32);
    let ctx = Ctx { isa, spec, k, v, bk, sizes };
    let mut tasks: Vec<Task<'_, T>> = Vec::new();
    for (head, o) in out.chunks_exact_mut(q_head).take(heads).enumerate() {
        let qh = q.get(head * q_head..(head + 1) * q_head).unwrap_or_default();
        for (qb, (o, qr)) in o.chunks_mut(bq * d).zip(qh.chunks(bq * d)).enumerate() {
            tasks.push(Task { head, i0: qb * bq, q: qr, out: o });
        }
    }
    // The heaviest tasks first (with a causal mask, the last query blocks), so
    // the lightest ones fill in at the end.
    if spec.mask != compute_core::Mask::None {
        tasks.sort_by_key(|t| std::cmp::Reverse(spec.visible((t.i0 + t.out.len() / d).saturating_sub(1))));
    }
    let failed = AtomicBool::new(false);
    let run = |t: Task<'_, T>| {
        if !with_scratch(sizes.total, |buf| ctx.task(t, buf)) {
            failed.store(true, Ordering::Relaxed);
        }
    };
    if workers > 1 {
        fork::each(tasks, run);
    } else {
        tasks.into_iter().for_each(run);
    }
    if failed.load(Ordering::Relaxed) {
        return Err(out_of_memory(sizes.total));
    }
    Ok(())
}

/// Threads `spec` runs on out of `threads`: all of them above
/// [`PAR_GEMM_MIN_MACS`] multiply-adds, else 1.
fn workers(spec: &AttentionSpec, threads: usize) -> usize {
    let heads = spec.batch.saturating_mul(spec.heads_q) as u64;
    let macs = spec.pairs().saturating_mul(heads).saturating_mul(2 * spec.head_dim as u64);
    if threads > 1 && macs >= PAR_GEMM_MIN_MACS as u64 { threads } else { 1 }
}

/// `OutOfMemory` for `values` `f32`s of scratch.
fn out_of_memory(values: usize) -> ComputeError {
    ComputeError::OutOfMemory {
        op: "attention",
        backend: BackendKind::Simd,
        requested_bytes: DType::F32.bytes_for(values).unwrap_or(u64::MAX),
    }
}

/// `src` as `f32`: itself when `T` is `f32`, else widened into the front of
/// `buf` (as much of it as fits).
fn wide<'a, T: Element>(isa: Isa, src: &'a [T], buf: &'a mut [f32]) -> &'a [f32] {
    if let Some(s) = f32::from_host(T::host(src)) {
        return s;
    }
    let dst = buf.get_mut(..src.len()).unwrap_or_default();
    convert::widen(isa, src, dst);
    dst
}

/// `dst = scale·src` in `f32` (over the shorter length).
fn scaled<T: Element>(isa: Isa, src: &[T], scale: f32, dst: &mut [f32]) {
    match f32::from_host(T::host(src)) {
        Some(s) => {
            for (x, &y) in dst.iter_mut().zip(s) {
                *x = y * scale;
            }
        }
        None => {
            let n = src.len().min(dst.len());
            let dst = &mut dst[..n];
            convert::widen(isa, src, dst);
            for x in dst {
                *x *= scale;
            }
        }
    }
}

/// The last step of a task: row `r` of `out` (`d` values each) is row `r` of
/// `o` (stride `ldo`) divided by `l[r]`, or zeros when `l[r] = 0`, rounded
/// to `T`. For half outputs the rows of `o` are divided in place first.
fn finish<T: Element>(isa: Isa, o: &mut [f32], ldo: usize, l: &[f32], d: usize, out: &mut [T]) {
    if let Some(out) = f32::from_host_mut(T::host_mut(out)) {
        dispatch(isa, Finish { o, ldo, l, d, out });
        return;
    }
    let l = l.get(..out.len() / d.max(1)).unwrap_or(l);
    dispatch(isa, Normalise { o: &mut *o, ldo, l });
    for (orow, dst) in o.chunks(ldo).zip(out.chunks_exact_mut(d)) {
        convert::narrow(isa, orow.get(..d).unwrap_or_default(), dst);
    }
}

/// Query rows per task: [`ATTENTION_BLOCK_Q`], or fewer (down to
/// [`MIN_BLOCK_Q`]) when that leaves fewer than [`TASKS_PER_THREAD`] tasks
/// per thread.
fn block_rows(seq_q: usize, heads: usize, threads: usize) -> usize {
    let full = ATTENTION_BLOCK_Q.min(seq_q.max(1));
    let tasks = heads.saturating_mul(seq_q.div_ceil(full));
    let want = TASKS_PER_THREAD * threads;
    if threads <= 1 || tasks >= want {
        return full;
    }
    let per_head = want.div_ceil(heads.max(1));
    seq_q.div_ceil(per_head).clamp(MIN_BLOCK_Q.min(full), full)
}

/// One task: query rows `i0..` of head `head` (`batch·heads_q + h`) and
/// their output rows.
struct Task<'a, T> {
    head: usize,
    i0: usize,
    /// The task's query rows (`rows × d`).
    q: &'a [T],
    /// The task's output rows (`rows × d`).
    out: &'a mut [T],
}

/// Sizes of the regions of a task's scratch, in values (each a multiple of
/// [`LANES`], so every region starts on a 64-byte boundary).
#[derive(Clone, Copy)]
struct Sizes {
    /// Row stride of the score block (`bk` rounded up to whole vectors).
    lds: usize,
    /// Row stride of the output accumulator (`d` rounded up).
    ldo: usize,
    qs: usize,
    s: usize,
    o: usize,
    stats: usize,
    kpack: usize,
    /// One widened key or value block (`bk·d`) for half data, else 0.
    wide: usize,
    /// All of it: the regions above, two of `stats` and of `wide`, and the
    /// packing buffer of `V`.
    total: usize,
}

impl Sizes {
    /// The regions for query blocks of `bq` rows, key blocks of `bk` and
    /// head size `d`, with widening buffers when `half`.
    fn new(isa: Isa, bq: usize, bk: usize, d: usize, half: bool) -> Sizes {
        let (lds, ldo) = (bk.next_multiple_of(LANES), d.next_multiple_of(LANES));
        let qs = (bq * d).next_multiple_of(LANES);
        let (s, o, stats) = (bq * lds, bq * ldo, bq.next_multiple_of(LANES));
        let kpack = gemm::packed_len(isa, d, bk).next_multiple_of(LANES);
        let vpack = gemm::packed_len(isa, bk, d).next_multiple_of(LANES);
        let wide = if half { (bk * d).next_multiple_of(LANES) } else { 0 };
        let total = qs + s + o + 2 * stats + kpack + 2 * wide + vpack;
        Sizes { lds, ldo, qs, s, o, stats, kpack, wide, total }
    }
}

/// What every task shares.
struct Ctx<'a, T> {
    isa: Isa,
    spec: &'a AttentionSpec,
    k: &'a [T],
    v: &'a [T],
    bk: usize,
    sizes: Sizes,
}

/// A task's scratch, carved from one buffer.
struct Scratch<'a> {
    /// `scale·q` of the task's rows (`rows × d`).
    qs: &'a mut [f32],
    /// Scores, then weights, of one key block (`rows × lds`).
    s: &'a mut [f32],
    /// Output accumulator (`rows × ldo`).
    o: &'a mut [f32],
    /// Running max and sum of each row.
    m: &'a mut [f32],
    l: &'a mut [f32],
    /// Packed keys of one block, and the ragged columns of its values.
    kpack: &'a mut [f32],
    vpack: &'a mut [f32],
    /// The key and value blocks widened to `f32` (half data only).
    kwide: &'a mut [f32],
    vwide: &'a mut [f32],
}

impl Sizes {
    fn carve<'a>(&self, buf: &'a mut [f32]) -> Option<Scratch<'a>> {
        let (qs, rest) = buf.split_at_mut_checked(self.qs)?;
        let (s, rest) = rest.split_at_mut_checked(self.s)?;
        let (o, rest) = rest.split_at_mut_checked(self.o)?;
        let (m, rest) = rest.split_at_mut_checked(self.stats)?;
        let (l, rest) = rest.split_at_mut_checked(self.stats)?;
        let (kpack, rest) = rest.split_at_mut_checked(self.kpack)?;
        let (kwide, rest) = rest.split_at_mut_checked(self.wide)?;
        let (vwide, vpack) = rest.split_at_mut_checked(self.wide)?;
        Some(Scratch { qs, s, o, m, l, kpack, vpack, kwide, vwide })
    }
}

impl<T: Element> Ctx<'_, T> {
    /// Runs one task with `buf` (`sizes.total` values, 64-byte aligned) as scratch.
    fn task(&self, t: Task<'_, T>, buf: &mut [f32]) {
        let Ctx { isa, spec, bk, sizes: z, .. } = *self;
        let d = spec.head_dim;
        let rows = t.out.len() / d;
        let Some(Scratch { qs, s, o, m, l, kpack, vpack, kwide, vwide }) = z.carve(buf) else { return };
        if rows == 0 {
            return;
        }
        // The scale goes on the queries once, not on every score.
        scaled(isa, t.q, spec.scale, qs);
        o.get_mut(..rows * z.ldo).unwrap_or_default().fill(0.0);
        m.fill(f32::NEG_INFINITY);
        l.fill(0.0);
        let kv = (t.head / spec.heads_q) * spec.heads_kv + (t.head % spec.heads_q) / spec.group();
        let (kv_len, stride) = (spec.seq_k * d, spec.kv_rows() * d);
        let kh = self.k.get(kv * stride..kv * stride + kv_len).unwrap_or_default();
        let vh = self.v.get(kv * stride..kv * stride + kv_len).unwrap_or_default();
        // Keys the last row sees: the others see a prefix of them.
        let keys = spec.visible(t.i0 + rows - 1);
        let mut j0 = 0;
        while j0 < keys {
            let w = bk.min(keys - j0);
            // Keys of this block row `r` sees: a prefix of the block.
            let seen = |r: usize| spec.visible(t.i0 + r).saturating_sub(j0).min(w);
            // Rows that see none of these keys (a prefix, on a causal mask) sit this block out.
            let r0 = (0..rows).find(|&r| seen(r) > 0).unwrap_or(rows);
            let kb = wide(isa, kh.get(j0 * d..(j0 + w) * d).unwrap_or_default(), &mut *kwide);
            let vb = wide(isa, vh.get(j0 * d..(j0 + w) * d).unwrap_or_default(), &mut *vwide);
            // The block's keys packed once for all its rows, unless they are
            // few enough for dot products.
            let keys_b = if rows - r0 <= GEMM_DOTS_MAX_M {
                Keys::Rows(kb)
            } else {
                match gemm::pack_transposed(isa, kb, d, w, kpack) {
                    Some(p) => Keys::Packed(p),
                    None => return,
                }
            };
            // Rows that see the whole block go as one segment; on the diagonal,
            // segments of ATTENTION_DIAGONAL_ROWS rows each stop at the last key
            // one of their rows sees.
            let mut r = r0;
            while r < rows {
                let end = if seen(r) == w {
                    (r..rows).find(|&x| seen(x) < w).unwrap_or(rows)
                } else {
                    let cap = (r + ATTENTION_DIAGONAL_ROWS).min(rows);
                    (r + 1..cap).find(|&x| seen(x) == w).unwrap_or(cap)
                };
                let width = (r..end).map(seen).max().unwrap_or(0);
                if width > 0 {
                    let seg = Segment { r, end, width, lds: z.lds, ldo: z.ldo, d };
                    let (sr, or) = (
                        s.get_mut(r * z.lds..end * z.lds).unwrap_or_default(),
                        o.get_mut(r * z.ldo..end * z.ldo).unwrap_or_default(),
                    );
                    let qr = qs.get(r * d..end * d).unwrap_or_default();
                    let (mr, lr) = (m.get_mut(r..end).unwrap_or_default(), l.get_mut(r..end).unwrap_or_default());
                    let seen_here = |x: usize| seen(r + x);
                    seg.run(isa, qr, &keys_b, vb, sr, or, (mr, lr), &seen_here, vpack);
                }
                r = end;
            }
            j0 += w;
        }
        finish(isa, o, z.ldo, l, d, t.out);
    }
}

/// The keys of one block, as the score product reads them.
enum Keys<'a> {
    /// In place (`w × d`), for dot products.
    Rows(&'a [f32]),
    /// Packed as transposed panels.
    Packed(gemm::PackedB<'a>),
}

/// Rows `r..end` of a task on the first `width` keys of a key block.
struct Segment {
    r: usize,
    end: usize,
    width: usize,
    lds: usize,
    ldo: usize,
    d: usize,
}

impl Segment {
    /// Scores, online softmax and `O += P·V` for the segment's rows: `qr`
    /// their scaled queries, `keys` and `vb` the key block, `sr`, `or`, `m`,
    /// `l` their rows of the scratch, `seen(x)` the keys row `r + x` sees.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        isa: Isa,
        qr: &[f32],
        keys: &Keys<'_>,
        vb: &[f32],
        sr: &mut [f32],
        or: &mut [f32],
        (m, l): (&mut [f32], &mut [f32]),
        seen: &(impl Fn(usize) -> usize + ?Sized),
        vpack: &mut [f32],
    ) {
        let Segment { r, end, width: w, lds, ldo, d } = *self;
        let used = end - r;
        match keys {
            Keys::Packed(p) => gemm::packed_product(isa, (qr, d), (used, w), p, (&mut *sr, lds), false),
            Keys::Rows(kb) => gemm::dots_product(isa, (qr, d), (used, d, w), kb, (&mut *sr, lds)),
        }
        dispatch(isa, Online { s: &mut *sr, lds, w, o: &mut *or, ldo, m, l, seen });
        let vb = vb.get(..w * d).unwrap_or_default();
        gemm::rows_product(isa, (sr, lds), (used, w, d), vb, (or, ldo), true, vpack);
    }
}

thread_local! {
    /// This thread's task scratch, kept between calls.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on `len` values of 64-byte-aligned scratch from this thread's
/// reusable buffer (a fresh one if it is in use). `false` (without calling
/// `f`) when the memory cannot be allocated.
fn with_scratch(len: usize, f: impl FnOnce(&mut [f32])) -> bool {
    let mut f = Some(f);
    let done = SCRATCH
        .try_with(|cell| {
            let mut v = cell.try_borrow_mut().ok()?;
            Some(aligned(&mut v, len, f.take()?))
        })
        .ok()
        .flatten();
    match (done, f) {
        (Some(ok), _) => ok,
        (None, Some(f)) => aligned(&mut Vec::new(), len, f),
        (None, None) => false,
    }
}

/// Grows `v` (fallibly) and runs `f` on `len` of its values from a 64-byte boundary.
fn aligned(v: &mut Vec<f32>, len: usize, f: impl FnOnce(&mut [f32])) -> bool {
    let Some(need) = len.checked_add(LANES) else { return false };
    if v.len() < need {
        if v.try_reserve_exact(need - v.len()).is_err() {
            return false;
        }
        v.resize(need, 0.0);
    }
    let off = v.as_ptr().align_offset(64).min(LANES);
    match v.get_mut(off..off + len) {
        Some(buf) => {
            f(buf);
            true
        }
        None => false,
    }
}

/// Step 2 on one key block: for every row `r` of `s` (scores of `w` keys,
/// row stride `lds`), of which the first `seen(r)` are visible, updates the
/// running max `m[r]` and sum `l[r]`, turns the scores into `e^(s − m)` (zero
/// past the visible ones, up to `w` rounded to whole vectors) and rescales
/// row `r` of `o` (stride `ldo`) by `e^(m_old − m)`.
struct Online<'a, F: ?Sized> {
    s: &'a mut [f32],
    lds: usize,
    w: usize,
    o: &'a mut [f32],
    ldo: usize,
    m: &'a mut [f32],
    l: &'a mut [f32],
    seen: &'a F,
}

impl<F: Fn(usize) -> usize + ?Sized> WithSimd for Online<'_, F> {
    type Output = ();
    #[inline(always)]
    fn run<S: SimdF32>(self, s: S) {
        let Online { s: scores, lds, w, o, ldo, m, l, seen } = self;
        let width = w.next_multiple_of(LANES).min(lds);
        let rows = scores.chunks_mut(lds).zip(o.chunks_mut(ldo)).zip(m.iter_mut().zip(l.iter_mut()));
        for (r, ((row, orow), (mr, lr))) in rows.enumerate() {
            let Some(row) = row.get_mut(..width) else { continue };
            let (blocks, _) = row.as_chunks_mut::<LANES>();
            let (oblocks, _) = orow.as_chunks_mut::<LANES>();
            online_row(s, blocks, seen(r), oblocks, mr, lr);
        }
    }
}

/// [`Online`] on one row: `row` holds the scores in whole vectors, of which
/// the first `n` are visible.
#[inline(always)]
fn online_row<S: SimdF32>(s: S, row: &mut [Block], n: usize, o: &mut [Block], m: &mut f32, l: &mut f32) {
    let (full, rem) = (n / LANES, n % LANES);
    // The invisible lanes of the last vector at −∞ (e^−∞ = 0), so both
    // passes below run over whole vectors with nothing kept aside: an
    // `Option` of a vector here kept the running sum on the stack.
    if rem > 0
        && let Some(tail) = row.get_mut(full).and_then(|b| b.get_mut(rem..))
    {
        tail.fill(f32::NEG_INFINITY);
    }
    let (visible, rest) = row.split_at_mut(n.div_ceil(LANES).min(row.len()));
    rest.fill([0.0; LANES]);
    // max(v, acc) drops a NaN score here; it still turns its row's sum NaN below.
    let mut mx = s.splat(f32::NEG_INFINITY);
    for b in visible.iter() {
        mx = s.max(s.load(b), mx);
    }
    let m_new = s.reduce_max(mx).max(*m);
    if m_new == f32::NEG_INFINITY {
        // No visible score (or all −∞): nothing to add.
        visible.fill([0.0; LANES]);
        return;
    }
    let mv = s.splat(m_new);
    let mut sum = s.splat(0.0);
    for b in visible.iter_mut() {
        let p = math::exp_nonpositive(s, s.sub(s.load(b), mv));
        sum = s.add(sum, p);
        s.store(b, p);
    }
    let alpha = if *m == f32::NEG_INFINITY { 0.0 } else { (*m - m_new).exp() };
    *l = *l * alpha + s.reduce_add(sum);
    *m = m_new;
    if alpha != 1.0 {
        let a = s.splat(alpha);
        for b in o.iter_mut() {
            s.store(b, s.mul(s.load(b), a));
        }
    }
}

/// The last step: row `r` of `out` (`d` values) is row `r` of `o` (stride
/// `ldo`) divided by `l[r]`, or zeros when `l[r] = 0` (no key seen).
struct Finish<'a> {
    o: &'a [f32],
    ldo: usize,
    l: &'a [f32],
    d: usize,
    out: &'a mut [f32],
}

impl WithSimd for Finish<'_> {
    type Output = ();
    #[inline(always)]
    fn run<S: SimdF32>(self, s: S) {
        let Finish { o, ldo, l, d, out } = self;
        for ((orow, &sum), dst) in o.chunks(ldo).zip(l).zip(out.chunks_exact_mut(d)) {
            let inv = if sum == 0.0 { 0.0 } else { (1.0 / f64::from(sum)) as f32 };
            blocks::map1(s, orow.get(..d).unwrap_or_default(), dst, false, &Times(s.splat(inv)));
        }
    }
}

/// Row `r` of `o` (stride `ldo`, whole vectors) divided by `l[r]` in place,
/// or zeros when `l[r] = 0`.
struct Normalise<'a> {
    o: &'a mut [f32],
    ldo: usize,
    l: &'a [f32],
}

impl WithSimd for Normalise<'_> {
    type Output = ();
    #[inline(always)]
    fn run<S: SimdF32>(self, s: S) {
        let Normalise { o, ldo, l } = self;
        for (orow, &sum) in o.chunks_mut(ldo).zip(l) {
            let inv = s.splat(if sum == 0.0 { 0.0 } else { (1.0 / f64::from(sum)) as f32 });
            let (row, _) = orow.as_chunks_mut::<LANES>();
            for b in row {
                s.store(b, s.mul(s.load(b), inv));
            }
        }
    }
}

/// `v·k`.
struct Times<V>(V);
impl<S: SimdF32> LaneFn<S, 1> for Times<S::V> {
    #[inline(always)]
    fn apply(&self, s: S, [v]: [S::V; 1]) -> S::V {
        s.mul(v, self.0)
    }
}

#[cfg(test)]
mod tests;
