//! Host memory for transfers: buffers that a GPU backend's device copies to
//! and from directly (page-locked memory on CUDA), so that a transfer needs
//! no intermediate copy on the host.
//!
//! Two kinds, for two ways of use:
//! - [`PinnedWords`]: 32-bit words that many threads write at once, each its
//!   own part (atomic stores, so one buffer is shared safely), which one
//!   transfer then takes to the device ([`Backend::upload_pinned_parts`]).
//! - [`PinnedF32`]: `f32` values with one owner, filled by a transfer from
//!   the device ([`Backend::download_pinned`]) and read in place.
//!
//! A backend that has such memory returns it from
//! [`Backend::alloc_pinned_words`] and [`Backend::alloc_pinned_f32`]; the
//! default is `None`. [`PinnedWords::host`] and [`PinnedF32::host`] make the
//! same buffers on the ordinary heap: every backend's transfer methods take
//! them (through a host copy, as the trait's defaults do).
//!
//! [`Backend::upload_pinned_parts`]: crate::Backend::upload_pinned_parts
//! [`Backend::download_pinned`]: crate::Backend::download_pinned
//! [`Backend::alloc_pinned_words`]: crate::Backend::alloc_pinned_words
//! [`Backend::alloc_pinned_f32`]: crate::Backend::alloc_pinned_f32

use std::any::Any;
use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::dtype::bf16;
use crate::error::{BackendKind, ComputeError, Result};

/// The memory behind a [`PinnedWords`]: a backend implements it for its own
/// page-locked memory (and finds it again with [`PinnedWords::memory`]).
pub trait WordsMemory: Any + Send + Sync + fmt::Debug {
    /// The words, all of them initialised.
    fn words(&self) -> &[AtomicU32];
}

/// The memory behind a [`PinnedF32`]: a backend implements it for its own
/// page-locked memory.
pub trait F32Memory: Send + Sync + fmt::Debug {
    /// The values, all of them initialised.
    fn values(&self) -> &[f32];
    /// The values, to write.
    fn values_mut(&mut self) -> &mut [f32];
}

/// Words on the heap ([`PinnedWords::host`]).
struct HeapWords(Box<[AtomicU32]>);

impl fmt::Debug for HeapWords {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HeapWords({})", self.0.len())
    }
}

impl WordsMemory for HeapWords {
    fn words(&self) -> &[AtomicU32] {
        &self.0
    }
}

/// Values on the heap ([`PinnedF32::host`]).
struct HeapF32(Vec<f32>);

impl fmt::Debug for HeapF32 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HeapF32({})", self.0.len())
    }
}

impl F32Memory for HeapF32 {
    fn values(&self) -> &[f32] {
        &self.0
    }
    fn values_mut(&mut self) -> &mut [f32] {
        &mut self.0
    }
}

/// The error for a request to allocate `bytes` of host memory that failed.
fn no_memory(op: &'static str, bytes: usize) -> ComputeError {
    ComputeError::OutOfMemory { op, backend: BackendKind::Simd, requested_bytes: bytes as u64 }
}

/// 32-bit words of host memory that many threads write at once (each its
/// own words, with [`PinnedWords::store_f32`] or [`PinnedWords::store_bf16`])
/// and that a device copies from in one transfer
/// ([`Backend::upload_pinned_parts`](crate::Backend::upload_pinned_parts)).
/// Shared by reference (`Sync`); the words are atomics, so concurrent
/// writes are safe, and a transfer reads whatever they hold when the device
/// copies them.
#[derive(Debug)]
pub struct PinnedWords {
    mem: Box<dyn WordsMemory>,
}

impl PinnedWords {
    /// Wraps a backend's memory. Free.
    pub fn from_memory(mem: Box<dyn WordsMemory>) -> PinnedWords {
        PinnedWords { mem }
    }

    /// `len` zero words on the ordinary heap ([`ComputeError::OutOfMemory`]
    /// when they cannot be had). Costs the allocation and zeroing.
    pub fn host(len: usize) -> Result<PinnedWords> {
        let mut v: Vec<AtomicU32> = Vec::new();
        v.try_reserve_exact(len).map_err(|_| no_memory("alloc_pinned_words", len.saturating_mul(4)))?;
        v.extend((0..len).map(|_| AtomicU32::new(0)));
        Ok(PinnedWords { mem: Box::new(HeapWords(v.into_boxed_slice())) })
    }

    /// Number of words. Free.
    pub fn len(&self) -> usize {
        self.mem.words().len()
    }

    /// Whether it holds no words. Free.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The words. Free.
    pub fn words(&self) -> &[AtomicU32] {
        self.mem.words()
    }

    /// The memory, if it is of type `T` (how a backend recognises its own).
    /// Free.
    pub fn memory<T: WordsMemory>(&self) -> Option<&T> {
        let any: &dyn Any = &*self.mem;
        any.downcast_ref::<T>()
    }

    /// The `n` words from `at`, or a [`ComputeError::Shape`] naming `op`.
    fn span(&self, op: &'static str, at: usize, n: usize) -> Result<&[AtomicU32]> {
        let words = self.words();
        at.checked_add(n).and_then(|end| words.get(at..end)).ok_or_else(|| {
            ComputeError::shape(
                op,
                format!("words {at}..{at}+{n} outside the buffer of {}", words.len()),
                format!("buffer=[{}] at={at} n={n}", words.len()),
            )
        })
    }

    /// Stores `values` (their bits) in the words from `at` on, as an `f32`
    /// tensor's bytes hold them. [`ComputeError::Shape`] when they do not
    /// fit. One relaxed atomic store per value.
    pub fn store_f32(&self, at: usize, values: &[f32]) -> Result<()> {
        let span = self.span("store_f32", at, values.len())?;
        for (w, v) in span.iter().zip(values) {
            w.store(v.to_bits(), Ordering::Relaxed);
        }
        Ok(())
    }

    /// Rounds `values` to `bf16` (as [`bf16::from_f32`] does) and stores them
    /// two per word from `at` on, as a `bf16` tensor's bytes hold them (an
    /// odd count leaves the last word's second half zero).
    /// [`ComputeError::Shape`] when they do not fit. One relaxed atomic store
    /// per two values.
    pub fn store_bf16(&self, at: usize, values: &[f32]) -> Result<()> {
        let span = self.span("store_bf16", at, values.len().div_ceil(2))?;
        for (w, pair) in span.iter().zip(values.chunks(2)) {
            let lo = bf16::from_f32(pair[0]).to_ne_bytes();
            let hi = pair.get(1).map_or([0, 0], |&v| bf16::from_f32(v).to_ne_bytes());
            w.store(u32::from_ne_bytes([lo[0], lo[1], hi[0], hi[1]]), Ordering::Relaxed);
        }
        Ok(())
    }

    /// Appends the bytes of the words of `range` to `out`, as a transfer
    /// would copy them. [`ComputeError::Shape`] when the range is outside
    /// the buffer. One relaxed atomic load per word.
    pub fn load_bytes(&self, range: Range<usize>, out: &mut Vec<u8>) -> Result<()> {
        let span = self.span("load_bytes", range.start, range.end.saturating_sub(range.start))?;
        out.reserve(span.len() * 4);
        for w in span {
            out.extend_from_slice(&w.load(Ordering::Relaxed).to_ne_bytes());
        }
        Ok(())
    }
}

/// `f32` values of host memory with one owner, that a device writes in one
/// transfer ([`Backend::download_pinned`](crate::Backend::download_pinned))
/// and the host then reads in place.
#[derive(Debug)]
pub struct PinnedF32 {
    mem: Box<dyn F32Memory>,
}

impl PinnedF32 {
    /// Wraps a backend's memory. Free.
    pub fn from_memory(mem: Box<dyn F32Memory>) -> PinnedF32 {
        PinnedF32 { mem }
    }

    /// `len` zeros on the ordinary heap ([`ComputeError::OutOfMemory`] when
    /// they cannot be had). Costs the allocation and zeroing.
    pub fn host(len: usize) -> Result<PinnedF32> {
        let mut v = Vec::new();
        v.try_reserve_exact(len).map_err(|_| no_memory("alloc_pinned_f32", len.saturating_mul(4)))?;
        v.resize(len, 0.0);
        Ok(PinnedF32 { mem: Box::new(HeapF32(v)) })
    }

    /// Number of values. Free.
    pub fn len(&self) -> usize {
        self.mem.values().len()
    }

    /// Whether it holds no values. Free.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values. Free.
    pub fn as_slice(&self) -> &[f32] {
        self.mem.values()
    }

    /// The values, to write. Free.
    pub fn as_mut_slice(&mut self) -> &mut [f32] {
        self.mem.values_mut()
    }
}

/// Checks that `parts` (each a buffer and a range of its words) lie in their
/// buffers and together hold exactly `tensor`'s bytes, for
/// [`Backend::upload_pinned_parts`](crate::Backend::upload_pinned_parts)
/// ([`ComputeError::Shape`] otherwise). Free.
pub fn check_pinned_parts(parts: &[(&PinnedWords, Range<usize>)], tensor: &crate::Tensor) -> Result<()> {
    let shapes = || format!("tensor=[{}] {} parts={}", tensor.len(), tensor.dtype(), parts.len());
    let mut words = 0u64;
    for (buf, r) in parts {
        if r.start > r.end || r.end > buf.len() {
            return Err(ComputeError::shape(
                "upload_pinned_parts",
                format!("words {}..{} outside a buffer of {}", r.start, r.end, buf.len()),
                shapes(),
            ));
        }
        words += (r.end - r.start) as u64;
    }
    if words.saturating_mul(4) != tensor.size_in_bytes() {
        return Err(ComputeError::shape(
            "upload_pinned_parts",
            format!("the parts hold {} bytes, the tensor {}", words.saturating_mul(4), tensor.size_in_bytes()),
            shapes(),
        ));
    }
    Ok(())
}

/// Checks that `tensors` are `f32` ([`ComputeError::DType`]) and fit in
/// `dst` one after the other from value `at` on ([`ComputeError::Shape`]),
/// for [`Backend::download_pinned`](crate::Backend::download_pinned).
/// Free.
pub fn check_pinned_download(tensors: &[&crate::Tensor], dst: &PinnedF32, at: usize) -> Result<()> {
    let shapes = || format!("tensors={} dst=[{}] at={at}", tensors.len(), dst.len());
    if let Some(t) = tensors.iter().find(|t| t.dtype() != crate::DType::F32) {
        return Err(ComputeError::DType {
            op: "download_pinned",
            detail: format!("pinned values are f32, a tensor is {}", t.dtype()),
            shapes: shapes(),
        });
    }
    let total = tensors.iter().try_fold(at, |a, t| a.checked_add(t.len()));
    if total.is_none_or(|end| end > dst.len()) {
        return Err(ComputeError::shape(
            "download_pinned",
            format!("the tensors do not fit in {} values from {at}", dst.len()),
            shapes(),
        ));
    }
    Ok(())
}

/// [`Backend::upload_pinned_parts`](crate::Backend::upload_pinned_parts)
/// through host memory, as its default does: checks the parts, gathers
/// their words into one host vector and copies it with
/// [`Backend::upload_into`](crate::Backend::upload_into). Costs a host copy
/// of every word.
pub fn upload_pinned_via_host<B: crate::Backend + ?Sized>(
    backend: &B,
    parts: &[(&PinnedWords, Range<usize>)],
    tensor: &crate::Tensor,
) -> Result<()> {
    check_pinned_parts(parts, tensor)?;
    let mut bytes = Vec::new();
    for (buf, range) in parts {
        buf.load_bytes(range.clone(), &mut bytes)?;
    }
    let mut host = crate::HostVec::zeros(tensor.dtype(), tensor.len());
    let mut view = host.as_mut();
    let dst = view.as_bytes_mut();
    if dst.len() != bytes.len() {
        return Err(ComputeError::shape(
            "upload_pinned_parts",
            format!("the parts hold {} bytes, the tensor {}", bytes.len(), dst.len()),
            format!("tensor=[{}] {}", tensor.len(), tensor.dtype()),
        ));
    }
    dst.copy_from_slice(&bytes);
    backend.upload_into(host.as_slice(), tensor)
}

/// [`Backend::download_pinned`](crate::Backend::download_pinned) through
/// [`Backend::download_typed`](crate::Backend::download_typed), as its
/// default does: checks the tensors, then downloads each into its place.
pub fn download_pinned_via_host<B: crate::Backend + ?Sized>(
    backend: &B,
    tensors: &[&crate::Tensor],
    dst: &mut PinnedF32,
    at: usize,
) -> Result<()> {
    check_pinned_download(tensors, dst, at)?;
    let mut start = at;
    for t in tensors {
        let out = dst.as_mut_slice().get_mut(start..start + t.len()).unwrap_or_default();
        backend.download_typed(t, crate::HostSliceMut::F32(out))?;
        start += t.len();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_take_f32_and_bf16_values_as_their_tensors_hold_them() {
        let w = PinnedWords::host(6).unwrap();
        w.store_f32(1, &[1.5, -2.0]).unwrap();
        w.store_bf16(3, &[1.0, -3.0, 0.5]).unwrap();
        let mut bytes = Vec::new();
        w.load_bytes(1..3, &mut bytes).unwrap();
        let f: Vec<u8> = [1.5f32, -2.0].iter().flat_map(|v| v.to_ne_bytes()).collect();
        assert_eq!(bytes, f);
        bytes.clear();
        w.load_bytes(3..5, &mut bytes).unwrap();
        let h: Vec<u8> = [1.0f32, -3.0, 0.5, 0.0].iter().flat_map(|&v| bf16::from_f32(v).to_ne_bytes()).collect();
        assert_eq!(bytes, h);
        assert!(matches!(w.store_f32(5, &[1.0, 2.0]), Err(ComputeError::Shape { .. })));
        assert!(matches!(w.store_bf16(5, &[1.0, 2.0, 3.0]), Err(ComputeError::Shape { .. })));
        assert!(matches!(w.load_bytes(4..7, &mut bytes), Err(ComputeError::Shape { .. })));
    }

    #[test]
    fn f32_buffers_are_read_and_written_in_place() {
        let mut p = PinnedF32::host(3).unwrap();
        assert_eq!(p.as_slice(), &[0.0; 3]);
        p.as_mut_slice()[2] = 4.0;
        assert_eq!((p.len(), p.as_slice()[2]), (3, 4.0));
    }
}
