//! Device buffers: the tensor storage of this backend, and the cache that
//! reuses buffers across calls.
//!
//! Every buffer this crate allocates for `len` floats is at least
//! [`padded_bytes`]`(len)` long (rounded up to 16 bytes), because the
//! element-wise kernels read and write whole vec4s; a buffer of another dtype
//! holds its bytes, likewise rounded up to 16.

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use compute_core::{BackendKind, DType, Location, Result, TensorStorage};

use crate::context::Context;
use crate::errors;

/// Where every tensor of this backend lives.
pub(crate) const LOCATION: Location = Location { backend: BackendKind::Wgpu, device: 0 };

/// Bytes a buffer of `len` floats must have: `4·len` rounded up to 16 (saturating).
pub fn padded_bytes(len: usize) -> u64 {
    padded_bytes_of(len, DType::F32)
}

/// Bytes a buffer of `len` elements of `dtype` must have: their size rounded
/// up to 16 (saturating).
pub(crate) fn padded_bytes_of(len: usize, dtype: DType) -> u64 {
    dtype.bytes_for(len).unwrap_or(u64::MAX).saturating_add(15) / 16 * 16
}

/// `bytes` rounded up to whole 4-byte words (saturating): the unit of buffer
/// copies, and of storage bindings of packed `f16`/`bf16` values.
pub(crate) fn whole_words(bytes: u64) -> u64 {
    let align = wgpu::COPY_BUFFER_ALIGNMENT;
    bytes.saturating_add(align - 1) / align * align
}

/// Takes back device buffers when the tensors holding them are dropped: the
/// hook an external buffer pool (e.g. `dispatch`'s) implements to reuse them.
/// See [`crate::WgpuBackend::tensor_from_buffer`].
pub trait BufferRecycler: Send + Sync + std::fmt::Debug {
    /// Receives a buffer no tensor refers to any more. It may still be read or
    /// written by work already submitted; reusing it in later submissions is
    /// safe (the queue orders them). Called from the thread that drops the
    /// last tensor handle; keep it short.
    fn recycle(&self, buffer: wgpu::Buffer);
}

/// A tensor's storage: one wgpu storage buffer holding `len` elements of its
/// dtype from offset 0 (`f32`, or the bytes of `f16`/`bf16` data as uploaded).
#[derive(Debug)]
pub struct GpuBuffer {
    buffer: wgpu::Buffer,
    len: usize,
    dtype: DType,
    device_id: u64,
    recycler: Option<Arc<dyn BufferRecycler>>,
}

impl GpuBuffer {
    pub(crate) fn new(
        buffer: wgpu::Buffer,
        len: usize,
        dtype: DType,
        device_id: u64,
        recycler: Option<Arc<dyn BufferRecycler>>,
    ) -> Self {
        GpuBuffer { buffer, len, dtype, device_id, recycler }
    }

    /// The wgpu buffer (usages `STORAGE | COPY_SRC | COPY_DST`, at least
    /// [`padded_bytes`]`(len)` bytes for `f32`, the data's bytes rounded up to
    /// 16 for other dtypes), for callers that record their own commands.
    pub fn buffer(&self) -> &wgpu::Buffer {
        &self.buffer
    }

    /// Identity of the device the buffer belongs to.
    pub(crate) fn device_id(&self) -> u64 {
        self.device_id
    }
}

impl Drop for GpuBuffer {
    fn drop(&mut self) {
        if let Some(r) = self.recycler.take() {
            r.recycle(self.buffer.clone());
        }
    }
}

impl TensorStorage for GpuBuffer {
    fn len(&self) -> usize {
        self.len
    }
    fn dtype(&self) -> DType {
        self.dtype
    }
    fn location(&self) -> Location {
        LOCATION
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// What a cached buffer is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Use {
    /// `STORAGE | COPY_SRC | COPY_DST`: tensors, kernel inputs and outputs, scratch.
    Storage,
    /// `MAP_READ | COPY_DST`: staging for reads back to the host.
    Readback,
    /// `MAP_WRITE | COPY_SRC`: staging for large uploads, kept mapped while free.
    Upload,
}

impl Use {
    pub(crate) fn usages(self) -> wgpu::BufferUsages {
        match self {
            Use::Storage => wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            Use::Readback => wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            Use::Upload => wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
        }
    }

    fn of(usages: wgpu::BufferUsages) -> Option<Use> {
        [Use::Storage, Use::Readback, Use::Upload].into_iter().find(|u| u.usages() == usages)
    }
}

/// The free buffers, each with the time it was given back (a counter).
#[derive(Debug, Default)]
struct Free {
    /// Per usage and size class, oldest first.
    buffers: HashMap<(Use, u64), Vec<(u64, wgpu::Buffer)>>,
    bytes: u64,
    clock: u64,
}

impl Free {
    /// Drops the buffer given back longest ago; false when there is none.
    fn drop_oldest(&mut self) -> bool {
        let oldest = self.buffers.iter().filter_map(|(k, v)| v.first().map(|(t, _)| (*t, *k))).min_by_key(|(t, _)| *t);
        let Some((_, key)) = oldest else { return false };
        let Some(list) = self.buffers.get_mut(&key) else { return false };
        let (_, b) = list.remove(0);
        if list.is_empty() {
            self.buffers.remove(&key);
        }
        self.bytes = self.bytes.saturating_sub(b.size());
        true
    }
}

/// Free buffers by usage and size class, reused by later calls instead of
/// allocating (see [`size_class`]). Past its limit it drops the buffers given
/// back longest ago, so the sizes in use now stay (a cache that refused new
/// buffers once full kept the sizes of earlier work forever, and every later
/// call allocated, zeroed and mapped fresh memory).
#[derive(Debug)]
pub(crate) struct BufferCache {
    max_buffer: u64,
    limit: AtomicU64,
    free: Mutex<Free>,
}

/// The size class of a request of `bytes`: at least 256, 16 classes per power of
/// two (at most 12.5% slack), or the request itself rounded to 16 when the class
/// would exceed the device's largest buffer `max_buffer`.
pub(crate) fn size_class(bytes: u64, max_buffer: u64) -> u64 {
    let b = bytes.max(256);
    let octave = b.checked_next_power_of_two().unwrap_or(1 << 63);
    let step = (octave / 16).max(16);
    let c = b.div_ceil(step).saturating_mul(step);
    if c > max_buffer { bytes.div_ceil(16).saturating_mul(16) } else { c }
}

/// Default most bytes kept free in the cache.
pub(crate) const DEFAULT_CACHE_BYTES: u64 = 1 << 30;

impl BufferCache {
    pub(crate) fn new(limits: &wgpu::Limits) -> Self {
        BufferCache {
            max_buffer: limits.max_buffer_size,
            limit: AtomicU64::new(DEFAULT_CACHE_BYTES),
            free: Mutex::new(Free::default()),
        }
    }

    pub(crate) fn class(&self, bytes: u64) -> u64 {
        size_class(bytes, self.max_buffer)
    }

    /// Sets the most bytes kept free (0 disables reuse) and trims to it,
    /// dropping the buffers given back longest ago first.
    pub(crate) fn set_limit(&self, bytes: u64) {
        self.limit.store(bytes, Ordering::Relaxed);
        if let Ok(mut f) = self.free.lock() {
            while f.bytes > bytes && f.drop_oldest() {}
        }
    }

    /// Bytes currently kept free.
    pub(crate) fn free_bytes(&self) -> u64 {
        self.free.lock().map_or(0, |f| f.bytes)
    }

    /// A buffer of at least `bytes` for `usage`: a free one of the same class, or a
    /// new one. `Upload` buffers come mapped (free ones are kept mapped). A request beyond the device's largest buffer is a `LimitExceeded`
    /// error of `op`; a failed allocation an `OutOfMemory` error.
    pub(crate) fn take(&self, ctx: &Context, usage: Use, bytes: u64, op: &'static str) -> Result<wgpu::Buffer> {
        if bytes > self.max_buffer {
            return Err(errors::limit(op, "buffer bytes", bytes, self.max_buffer));
        }
        let class = self.class(bytes);
        if let Ok(mut f) = self.free.lock()
            && let Some((_, b)) = f.buffers.get_mut(&(usage, class)).and_then(|v| v.pop())
        {
            f.bytes = f.bytes.saturating_sub(b.size());
            return Ok(b);
        }
        let scope = ctx.scope();
        let buffer = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: class,
            usage: usage.usages(),
            mapped_at_creation: usage == Use::Upload,
        });
        scope.end_now(op, class)?;
        Ok(buffer)
    }

    /// Maps a used upload buffer again in the background and returns it to the
    /// cache once it is mapped (after the GPU has read it).
    pub(crate) fn recycle_upload(self: &Arc<Self>, buffer: wgpu::Buffer) {
        let cache = Arc::clone(self);
        let again = buffer.clone();
        buffer.slice(..).map_async(wgpu::MapMode::Write, move |r| {
            if r.is_ok() {
                cache.give(again);
            }
        });
    }

    /// Returns a buffer for reuse (an `Upload` buffer only while mapped). To
    /// stay within the limit, the buffers given back longest ago are dropped
    /// (freed once no submitted or recorded work uses them). A buffer larger
    /// than the limit, or not of a size class this cache hands out, is dropped
    /// itself. Costs a lock, and a scan of the size classes per buffer dropped.
    pub(crate) fn give(&self, buffer: wgpu::Buffer) {
        let size = buffer.size();
        let keep = Use::of(buffer.usage()).filter(|_| self.class(size) == size);
        let limit = self.limit.load(Ordering::Relaxed);
        if let (Some(usage), Ok(mut f)) = (keep, self.free.lock())
            && size <= limit
        {
            while f.bytes.saturating_add(size) > limit && f.drop_oldest() {}
            f.bytes += size;
            f.clock += 1;
            let now = f.clock;
            f.buffers.entry((usage, size)).or_default().push((now, buffer));
        }
    }
}

impl BufferRecycler for BufferCache {
    fn recycle(&self, buffer: wgpu::Buffer) {
        self.give(buffer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padded_bytes_rounds_to_16() {
        assert_eq!(padded_bytes(1), 16);
        assert_eq!(padded_bytes(4), 16);
        assert_eq!(padded_bytes(5), 32);
        assert_eq!(padded_bytes(1 << 20), 4 << 20);
        assert_eq!(padded_bytes(usize::MAX), u64::MAX / 16 * 16);
        assert_eq!(padded_bytes_of(7, DType::BF16), 16);
        assert_eq!(padded_bytes_of(9, DType::F16), 32);
        assert_eq!(padded_bytes_of(usize::MAX, DType::F16), u64::MAX / 16 * 16);
    }

    #[test]
    fn size_classes_cover_the_request_with_little_slack() {
        let max = 1 << 32;
        for bytes in [1u64, 16, 255, 256, 257, 4000, 4096, 4097, 1 << 20, (1 << 20) + 1, 3 << 28, (1 << 31) + 16] {
            let c = size_class(bytes, max);
            assert!(c >= bytes && c.is_multiple_of(16), "{bytes} -> {c}");
            assert!(c <= (bytes.max(256) as f64 * 1.125) as u64 + 16, "{bytes} -> {c}");
            assert_eq!(size_class(c, max), c, "a class is its own class");
        }
        // Beyond the largest buffer: the request itself, rounded to 16.
        assert_eq!(size_class(1000, 512), 1008);
    }
}
