//! Recordings of tensor calls as CUDA graphs ([`Backend::record`]): the
//! device's stream is captured while the caller's body queues its calls,
//! and the graph is instantiated once; each replay is one `cuGraphLaunch`.
//!
//! [`Backend::record`]: compute_core::Backend::record

use std::sync::{Arc, Mutex};

use compute_core::{Recording, Result};
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaStream};

use super::device::{Device, lock};
use super::error::driver_err;

/// A captured, instantiated graph on one device's stream.
pub(crate) struct CudaRecording {
    graph: Mutex<CudaGraph>,
    /// Keeps the device (context and stream) alive as long as the graph.
    _device: Arc<Device>,
}

// SAFETY: cudarc's `CudaGraph` holds raw driver handles and is not `Send` or
// `Sync` because graph objects are not internally synchronised. Every use
// here goes through the mutex (one launch at a time), the handles are valid
// from any thread once the context is bound (`CudaGraph::launch` binds it),
// and the graph is destroyed once, on drop.
unsafe impl Send for CudaRecording {}
// SAFETY: as above: shared access only reaches the graph through the mutex.
unsafe impl Sync for CudaRecording {}

impl Recording for CudaRecording {
    fn replay(&self) -> Result<()> {
        lock(&self.graph).launch().map_err(|e| driver_err("replay", e))
    }
}

/// Captures what `body` queues on `device`'s stream and instantiates it.
/// The capture is relaxed (module loads stay allowed, though a body run once
/// beforehand has none left to do); a wait or a host transfer inside `body`
/// fails the capture. On any error the capture is ended and dropped.
pub(crate) fn record(device: &Arc<Device>, body: &mut dyn FnMut() -> Result<()>) -> Result<CudaRecording> {
    let stream: &Arc<CudaStream> = &device.stream;
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED).map_err(|e| driver_err("record", e))?;
    let ran = body();
    // End the capture whatever happened, so the stream runs work again.
    let ended = stream.end_capture(CUgraphInstantiate_flags(0));
    ran?;
    match ended.map_err(|e| driver_err("record", e))? {
        Some(graph) => Ok(CudaRecording { graph: Mutex::new(graph), _device: device.clone() }),
        None => Err(compute_core::ComputeError::driver(
            "record",
            compute_core::BackendKind::Cuda,
            "the capture produced no graph".to_string(),
        )),
    }
}
