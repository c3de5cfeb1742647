//! Device memory as the backend hands it out: raw allocations (what a buffer
//! pool manages), tensor storage on top of them, and completion events.

use std::any::Any;
use std::sync::Arc;

use compute_core::{BackendKind, DType, Location, Result, TensorStorage};
use cudarc::driver::{CudaEvent, CudaSlice};

use super::driver;

/// A device allocation of a fixed number of bytes, freed (stream-ordered, so
/// after every queued use) when the last handle drops. This is the unit a GPU
/// buffer pool keeps: get one from `CudaBackend::alloc_bytes`, wrap any prefix
/// of it in a tensor with `CudaBackend::tensor_in`, and reuse it once
/// `Arc::strong_count` says no tensor holds it any more.
#[derive(Debug)]
pub struct DeviceAlloc {
    _slice: CudaSlice<u8>,
    ptr: u64,
    bytes: usize,
    ordinal: u32,
}

impl DeviceAlloc {
    pub(crate) fn new(slice: CudaSlice<u8>, ptr: u64, bytes: usize, ordinal: u32) -> Self {
        DeviceAlloc { _slice: slice, ptr, bytes, ordinal }
    }
    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
    /// The device address (for interop; the backend's kernels take it).
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }
    /// Device ordinal.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }
}

/// Storage of a CUDA tensor: the first `len` elements of its dtype (`f32`,
/// or `f16`/`bf16` bytes as uploaded) of a [`DeviceAlloc`].
#[derive(Debug)]
pub struct CudaBuffer {
    alloc: Arc<DeviceAlloc>,
    len: usize,
    dtype: DType,
}

impl CudaBuffer {
    pub(crate) fn new(alloc: Arc<DeviceAlloc>, len: usize, dtype: DType) -> Self {
        CudaBuffer { alloc, len, dtype }
    }
    /// Device address of element 0.
    pub fn device_ptr(&self) -> u64 {
        self.alloc.ptr
    }
    /// The allocation underneath (shared with any other tensor built on it).
    pub fn allocation(&self) -> &Arc<DeviceAlloc> {
        &self.alloc
    }
}

impl TensorStorage for CudaBuffer {
    fn len(&self) -> usize {
        self.len
    }
    fn dtype(&self) -> DType {
        self.dtype
    }
    fn location(&self) -> Location {
        Location { backend: BackendKind::Cuda, device: self.alloc.ordinal }
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A point in the device's queue: complete once all work queued before it has
/// finished. What asynchronous callers poll instead of synchronising.
#[derive(Debug)]
pub struct Completion {
    event: CudaEvent,
}

impl Completion {
    pub(crate) fn new(event: CudaEvent) -> Self {
        Completion { event }
    }
    /// Whether the work before this point has finished (a non-blocking query).
    /// A kernel fault in that work is returned here as an error.
    pub fn is_complete(&self) -> Result<bool> {
        self.event.try_is_complete().map_err(|e| driver::err("completion", e))
    }
    /// Blocks until the work before this point has finished.
    pub fn wait(&self) -> Result<()> {
        self.event.synchronize().map_err(|e| driver::err("completion", e))
    }
    /// Device seconds from `earlier` to this point, both recorded by
    /// [`super::CudaBackend::record_timestamp`] (resolution about half a
    /// microsecond). Blocks until both have passed; a point recorded without
    /// a timestamp is a `Driver` error.
    pub fn seconds_since(&self, earlier: &Completion) -> Result<f64> {
        let ms = earlier.event.elapsed_ms(&self.event).map_err(|e| driver::err("completion", e))?;
        Ok(f64::from(ms) / 1e3)
    }
}
