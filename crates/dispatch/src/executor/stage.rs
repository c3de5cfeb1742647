//! Page-locked rows: host memory that callers write their requests' rows
//! into before handing them to the worker, so that a batch goes to the GPU
//! as one transfer per contiguous run of rows, with nothing gathered on the
//! worker's thread.
//!
//! A [`Pool`] (one per executor and GPU) holds a few slabs of
//! [`PinnedWords`]. A caller claims a region of a slab ([`Pool::claim`]),
//! stores its rows there from its own core ([`Rows::write`]) and sends the
//! claim with its request; the worker sorts a batch's requests by slab and
//! offset, so that requests that claimed one after the other are uploaded
//! together ([`parts`]). A claim is given back when its request is dropped,
//! after its batch has been run and waited for; a slab whose claims have all
//! been given back is reused from its start. When no slab has room the
//! caller's request goes without a claim and its batch gathers the rows as
//! before.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use compute_core::{Backend, DType, PinnedWords, Result};

use super::shared::SharedRequest;
use crate::engine::Engine;
use crate::lock::lock;

/// Words per slab: 4 MiB, the rows of 256 requests of 4096 `f32` values.
pub(crate) const SLAB_WORDS: usize = 1 << 20;

/// Most slabs a pool allocates.
const SLABS: usize = 4;

/// One slab and its claims.
struct Slab {
    words: Arc<PinnedWords>,
    /// Words claimed from the start since the slab was last empty.
    claimed: usize,
    /// Claims not given back yet.
    live: Arc<AtomicUsize>,
}

/// Page-locked slabs on one GPU engine, shared by the callers of an
/// executor's requests against every weight whose batches run there.
pub(crate) struct Pool {
    engine: Engine,
    backend: Arc<dyn Backend>,
    slabs: Mutex<Vec<Slab>>,
}

impl Pool {
    /// A pool on `engine` with its first slab, or `None` when `backend` has
    /// no page-locked memory. Costs one allocation of [`SLAB_WORDS`] words.
    pub(crate) fn new(engine: Engine, backend: Arc<dyn Backend>) -> Result<Option<Pool>> {
        let Some(first) = backend.alloc_pinned_words(SLAB_WORDS)? else { return Ok(None) };
        let slab = Slab { words: Arc::new(first), claimed: 0, live: Arc::new(AtomicUsize::new(0)) };
        Ok(Some(Pool { engine, backend, slabs: Mutex::new(vec![slab]) }))
    }

    /// Claims `len` words: in the first slab with room (a slab with no live
    /// claim starts over), else in a new slab while there are fewer than
    /// [`SLABS`]; `None` when none has room or a new one cannot be had. One
    /// lock, and rarely an allocation.
    pub(crate) fn claim(&self, len: usize) -> Option<Rows> {
        if len == 0 || len > SLAB_WORDS {
            return None;
        }
        let mut slabs = lock(&self.slabs);
        for (i, s) in slabs.iter_mut().enumerate() {
            // Claims are only taken under this lock, so a slab seen empty
            // here stays so until it is reset.
            if s.live.load(Ordering::Acquire) == 0 {
                s.claimed = 0;
            }
            if s.claimed + len <= s.words.len() {
                return Some(Rows::take((i, s), len, self.engine));
            }
        }
        if slabs.len() >= SLABS {
            return None;
        }
        let words = self.backend.alloc_pinned_words(SLAB_WORDS).ok().flatten()?;
        slabs.push(Slab { words: Arc::new(words), claimed: 0, live: Arc::new(AtomicUsize::new(0)) });
        let i = slabs.len() - 1;
        slabs.last_mut().map(|s| Rows::take((i, s), len, self.engine))
    }
}

/// A claim of a region of a slab: where one request's rows are. Given back
/// when dropped.
pub(crate) struct Rows {
    words: Arc<PinnedWords>,
    slab: usize,
    start: usize,
    len: usize,
    engine: Engine,
    live: Arc<AtomicUsize>,
}

impl Rows {
    /// Claims the next `len` words of slab number `slab`, `s`.
    fn take((slab, s): (usize, &mut Slab), len: usize, engine: Engine) -> Rows {
        let start = s.claimed;
        s.claimed += len;
        s.live.fetch_add(1, Ordering::Relaxed);
        Rows { words: s.words.clone(), slab, start, len, engine, live: s.live.clone() }
    }

    /// Stores the request's rows `x` (rounded to `bf16` for a `bf16`
    /// weight) in the claimed words; a [`compute_core::ComputeError::Shape`]
    /// when they do not fill them.
    pub(crate) fn write(&self, x: &[f32], dtype: DType) -> Result<()> {
        let need = if dtype == DType::BF16 { x.len().div_ceil(2) } else { x.len() };
        if need != self.len {
            return Err(compute_core::ComputeError::shape(
                "matmul_shared",
                format!("{} values take {need} words, {} were claimed", x.len(), self.len),
                format!("x=[{}] {dtype}", x.len()),
            ));
        }
        match dtype {
            DType::BF16 => self.words.store_bf16(self.start, x),
            _ => self.words.store_f32(self.start, x),
        }
    }

    /// Where it is: slab, then first word (the order of a batch's upload).
    pub(crate) fn key(&self) -> (usize, usize) {
        (self.slab, self.start)
    }
}

impl Drop for Rows {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::Release);
    }
}

/// Whether every request has its rows in page-locked memory of `engine`.
pub(crate) fn all_on(reqs: &[SharedRequest], engine: Engine) -> bool {
    !reqs.is_empty() && reqs.iter().all(|r| r.staged.as_ref().is_some_and(|s| s.engine == engine))
}

/// The parts of page-locked memory that hold the stack's rows `r0..r1`
/// (`row_words` words per row), in stack order, adjacent regions of one slab
/// merged into one part. Requests without a claim are skipped (callers check
/// [`all_on`] first).
pub(crate) fn parts(
    reqs: &[SharedRequest],
    row_words: usize,
    (r0, r1): (usize, usize),
) -> Vec<(&PinnedWords, Range<usize>)> {
    let mut parts: Vec<(&PinnedWords, usize, Range<usize>)> = Vec::new();
    let mut at = 0usize;
    for r in reqs {
        let (lo, hi) = (at.max(r0), (at + r.rows).min(r1));
        if let Some(s) = r.staged.as_ref().filter(|_| lo < hi) {
            let words = s.start + (lo - at) * row_words..s.start + (hi - at) * row_words;
            match parts.last_mut() {
                Some((_, slab, prev)) if *slab == s.slab && prev.end == words.start => prev.end = words.end,
                _ => parts.push((&s.words, s.slab, words)),
            }
        }
        at += r.rows;
        if at >= r1 {
            break;
        }
    }
    parts.into_iter().map(|(w, _, r)| (w, r)).collect()
}

/// The CPU backend under CUDA's name, with heap memory for its page-locked
/// memory (the defaults of the transfers take it): the page-locked paths
/// without a GPU.
#[cfg(test)]
pub(crate) struct PinnedOnHeap(pub(crate) compute_simd::SimdBackend);

#[cfg(test)]
impl Backend for PinnedOnHeap {
    fn kind(&self) -> compute_core::BackendKind {
        compute_core::BackendKind::Cuda
    }
    fn device_name(&self) -> String {
        "CPU with heap memory for page-locked memory".into()
    }
    fn run_typed(
        &self,
        op: &compute_core::Op,
        inputs: &[compute_core::HostSlice<'_>],
        output: compute_core::HostSliceMut<'_>,
    ) -> Result<()> {
        self.0.run_typed(op, inputs, output)
    }
    fn upload_typed(&self, data: compute_core::HostSlice<'_>) -> Result<compute_core::Tensor> {
        self.0.upload_typed(data)
    }
    fn alloc_typed(&self, len: usize, dtype: DType) -> Result<compute_core::Tensor> {
        self.0.alloc_typed(len, dtype)
    }
    fn download_typed(&self, tensor: &compute_core::Tensor, out: compute_core::HostSliceMut<'_>) -> Result<()> {
        self.0.download_typed(tensor, out)
    }
    fn run_tensors(
        &self,
        op: &compute_core::Op,
        inputs: &[&compute_core::Tensor],
        output: &compute_core::Tensor,
    ) -> Result<()> {
        self.0.run_tensors(op, inputs, output)
    }
    fn alloc_pinned_words(&self, len: usize) -> Result<Option<PinnedWords>> {
        PinnedWords::host(len).map(Some)
    }
    fn alloc_pinned_f32(&self, len: usize) -> Result<Option<compute_core::PinnedF32>> {
        compute_core::PinnedF32::host(len).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::async_result::AsyncGpuResult;
    use crate::executor::{SharedWeight, WeightLayout};
    use compute_core::{BackendKind, HostVec};
    use std::time::Instant;

    fn pool() -> Pool {
        let b: Arc<dyn Backend> = Arc::new(PinnedOnHeap(compute_simd::SimdBackend::new()));
        Pool::new(Engine::Cuda, b).unwrap().unwrap()
    }

    #[test]
    fn claims_are_disjoint_and_a_slab_starts_over_once_all_are_given_back() {
        let p = pool();
        let a = p.claim(10).unwrap();
        let b = p.claim(SLAB_WORDS - 10).unwrap();
        assert_eq!((a.key(), b.key()), ((0, 0), (0, 10)));
        // The first slab is full: the next claim takes a second one.
        let c = p.claim(4).unwrap();
        assert_eq!(c.key(), (1, 0));
        drop(a);
        // One claim of the first slab is still live: it does not start over.
        assert_eq!(p.claim(4).map(|r| r.key()), Some((1, 4)));
        drop(b);
        let d = p.claim(4).unwrap();
        assert_eq!(d.key(), (0, 0), "the first slab, empty again, is reused from its start");
        assert!(p.claim(0).is_none() && p.claim(SLAB_WORDS + 1).is_none());
        // Four full slabs: no more room.
        let full: Vec<Rows> = (0..SLABS).filter_map(|_| p.claim(SLAB_WORDS)).collect();
        assert_eq!(full.len(), SLABS - 2, "two slabs hold live claims");
        assert!(p.claim(SLAB_WORDS).is_none());
        assert!(Pool::new(Engine::Simd, Arc::new(compute_simd::SimdBackend::new())).unwrap().is_none());
    }

    /// The trait's default transfers (the CPU backend's): parts in order into
    /// a tensor of either dtype, tensors into a buffer at an offset, and
    /// parts or tensors that do not fit refused.
    #[test]
    fn default_transfers_copy_the_parts_in_order_and_check_them() {
        use compute_core::{ComputeError, HostSliceMut, PinnedF32, bf16};
        let b = compute_simd::SimdBackend::new();
        let w = PinnedWords::host(8).unwrap();
        w.store_f32(0, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        let t = b.alloc(4).unwrap();
        b.upload_pinned_parts(&[(&w, 0..1), (&w, 3..6)], &t).unwrap();
        let mut out = PinnedF32::host(6).unwrap();
        b.download_pinned(&[&t], &mut out, 1).unwrap();
        assert_eq!(out.as_slice(), &[0.0, 1.0, 4.0, 5.0, 6.0, 0.0]);
        assert!(matches!(b.upload_pinned_parts(&[(&w, 0..3)], &t), Err(ComputeError::Shape { .. })));
        assert!(matches!(b.upload_pinned_parts(&[(&w, 6..9)], &t), Err(ComputeError::Shape { .. })));
        assert!(matches!(b.download_pinned(&[&t], &mut out, 3), Err(ComputeError::Shape { .. })));
        let h = b.alloc_typed(4, DType::BF16).unwrap();
        assert!(matches!(b.download_pinned(&[&h], &mut out, 0), Err(ComputeError::DType { .. })));
        w.store_bf16(6, &[1.0, -2.0, 0.5, 3.0]).unwrap();
        b.upload_pinned_parts(&[(&w, 6..8)], &h).unwrap();
        let mut back = vec![bf16::ZERO; 4];
        b.download_typed(&h, HostSliceMut::BF16(&mut back)).unwrap();
        assert_eq!(back, [1.0, -2.0, 0.5, 3.0].map(bf16::from_f32));
    }

    #[test]
    fn a_batch_takes_adjacent_claims_as_one_part_and_splits_at_chunks() {
        let p = pool();
        let w = SharedWeight::host(1, HostVec::F32(vec![0.0; 6]), 2, 3, WeightLayout::RowMajor).unwrap();
        let req = |rows: usize, staged: Option<Rows>| {
            let (_r, completer) = AsyncGpuResult::channel("matmul", BackendKind::Cuda);
            let x = vec![0.5; rows * 2];
            if let Some(s) = &staged {
                s.write(&x, DType::F32).unwrap();
            }
            SharedRequest { weight: w.clone(), x, staged, rows, completer, enqueued: Instant::now() }
        };
        // Rows 0..3 in words 0..6, then a gap (a claim not in this batch), then rows 3..5.
        let a = req(1, p.claim(2));
        let b = req(2, p.claim(4));
        let _gap = p.claim(2).unwrap();
        let c = req(2, p.claim(4));
        assert!(matches!(c.staged.as_ref().map(|s| s.write(&[1.0; 3], DType::F32)), Some(Err(_))));
        let reqs = vec![a, b, c];
        assert!(all_on(&reqs, Engine::Cuda) && !all_on(&reqs, Engine::Wgpu));
        let ranges = |r0, r1| parts(&reqs, 2, (r0, r1)).into_iter().map(|(_, r)| r).collect::<Vec<_>>();
        assert_eq!(ranges(0, 5), vec![0..6, 8..12]);
        assert_eq!(ranges(0, 2), vec![0..4]);
        assert_eq!(ranges(2, 5), vec![4..6, 8..12]);
        assert!(!all_on(&[req(1, None)], Engine::Cuda));
    }
}
