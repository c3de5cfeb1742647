//! Platform helpers for the async API, under the names trueno's users know.
//!
//! On native targets every `*_async` op of [`compute_core::AsyncOps`] can be
//! driven to completion on the calling thread with [`block_on`]; the blocking
//! methods ([`compute_core::Ops`]: `relu`, `matmul`…) give the same results
//! without the future. In the browser nothing may block: [`sync_available`] is
//! false there, [`block_on`] does not exist, and the futures are awaited from
//! the page's event loop.

pub use crate::backend::sync_available;

/// Runs `future` to completion on this thread (native only): parks the thread
/// between polls, so it costs no CPU while the GPU works.
///
/// ```no_run
/// use compute_core::AsyncOps;
/// use compute_wgpu::{GpuDevice, runtime};
/// let device = GpuDevice::new()?;
/// let mut out = vec![0.0; 3];
/// runtime::block_on(device.relu_async(&[-1.0, 0.5, 2.0], &mut out))?;
/// assert_eq!(out, [0.0, 0.5, 2.0]);
/// # Ok::<(), compute_core::ComputeError>(())
/// ```
#[cfg(not(target_arch = "wasm32"))]
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    pollster::block_on(future)
}
