//! What the target allows: blocking calls on native, only futures in the browser.
//!
//! On wasm32 nothing may block the page's thread, so the blocking forms of the
//! API that wait on a GPU are absent there at compile time
//! (`CommandBatch::execute`, `CommandBatch::read`, and in `compute-wgpu`
//! `WgpuBackend::new`, `is_available`, `GpuCommandBatch::read`…), and their
//! async forms are the way in: [`crate::Compute::auto_async`],
//! [`crate::discover::probe_async`], the `*_async` ops of
//! [`compute_core::AsyncOps`], [`crate::CommandBatch::execute_async`] and
//! [`crate::CommandBatch::read_async`]. The [`compute_core::Backend`] trait's
//! methods stay (the CPU answers them at once); [`crate::Compute`] runs host
//! calls on the CPU there.

/// Whether the blocking API is available on this target: true on native,
/// false on wasm32 (the browser). Free.
pub fn sync_available() -> bool {
    cfg!(not(target_arch = "wasm32"))
}
