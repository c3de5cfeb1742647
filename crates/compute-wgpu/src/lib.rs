//! # compute-wgpu
//!
//! Every op of the compute vocabulary ([`compute_core::Op`]) on any GPU wgpu
//! reaches: Vulkan, Metal and DX12 on native, WebGPU in the browser (feature
//! `webgpu`), and Mesa's lavapipe software Vulkan in CI.
//!
//! - [`WgpuBackend`] (alias [`GpuDevice`]) implements [`compute_core::Backend`]:
//!   host calls, and device-resident tensors (upload once, chain ops, read once).
//! - [`GpuCommandBatch`] records ops on buffer ids and runs them in ONE queue submission.
//! - WGSL lives in the workspace's `shaders/` folder, one file per op family,
//!   compiled into the binary; each pipeline is compiled once per device and
//!   cached. Kernel parameters, host-call buffers and staging buffers are reused.
//! - Every op runs on `f32`, `f16` and `bf16` data on any adapter (no
//!   `SHADER_F16`): half values are stored two to a 32-bit word, computed in
//!   `f32`, and rounded to nearest even on store, bit-exact with the CPU
//!   backend's casts (see [`WgpuBackend`] for which ops go through `f32`
//!   temporaries). Where the adapter offers cooperative matrices (tensor
//!   cores through `wgpu`'s experimental `EXPERIMENTAL_COOPERATIVE_MATRIX`),
//!   `f16` matmuls run on them ([`WgpuBackend::cooperative_matrix`],
//!   [`CoopMatmul`]); everywhere else on the `f32` kernels.
//! - Adapter choice prefers a discrete GPU and can be forced ([`DeviceOptions`]);
//!   [`WgpuBackend::adapter`] reports what was opened.
//! - No panics: missing adapters or drivers, validation, out-of-memory, device
//!   loss and device limits are typed [`compute_core::ComputeError`]s. Ops larger
//!   than a storage binding are split, or refused with `LimitExceeded`.
//! - Asynchronous results: every op by its async name through
//!   [`compute_core::AsyncOps`] (`relu_async`, `matmul_async`, `dot_async`…),
//!   [`WgpuBackend::new_async`], [`WgpuBackend::is_available_async`],
//!   [`WgpuBackend::download_async`], [`WgpuBackend::run_async`],
//!   [`WgpuBackend::submitted_work_done`]; [`runtime`] drives them on native.
//! - External buffer pools: [`WgpuBackend::create_buffer`],
//!   [`WgpuBackend::tensor_from_buffer`] and [`BufferRecycler`].
//!
//! ```
//! use compute_core::{AsyncOps, Ops};
//! use compute_wgpu::{GpuDevice, runtime};
//! // Without an adapter (no GPU, no software Vulkan) this is a typed error.
//! let Ok(gpu) = GpuDevice::new() else { return Ok(()) };
//! let mut out = vec![0.0; 4];
//! gpu.relu(&[-1.0, 2.0, -3.0, 4.0], &mut out)?; // blocking, native only
//! assert_eq!(out, [0.0, 2.0, 0.0, 4.0]);
//! let dot = runtime::block_on(gpu.dot_async(&[1.0, 2.0], &[3.0, 4.0]))?; // the browser's way
//! assert_eq!(dot, 11.0);
//! # Ok::<(), compute_core::ComputeError>(())
//! ```

// In the browser (wasm32 + WebGPU) the native-only pieces — the poller thread,
// blocking waits, `wgpu::PollError` mapping — are compiled but never called.
#![cfg_attr(target_arch = "wasm32", allow(dead_code, reason = "native-only helpers unused in the browser"))]
mod backend;
mod batch;
mod buffers;
mod completion;
mod context;
mod encode;
mod errors;
mod kernels;
mod options;
mod plan;
pub mod runtime;
mod transfer;

pub use backend::{GpuDevice, WgpuBackend, sync_available};
pub use batch::{BufferId, GpuCommandBatch};
pub use buffers::{BufferRecycler, GpuBuffer, padded_bytes};
pub use completion::WorkDone;
pub use compute_core::{AsyncOps, Ops};
pub use context::{AdapterListing, AdapterReport, adapters};
pub use errors::{WgpuError, WgpuErrorKind};
pub use kernels::coop_matmul_wgsl;
pub use options::{CoopMatmul, CoopTiles, DeviceOptions, GpuApi, MatmulTiles, TiledMatmul};
/// For the crate's device tests: a test without an adapter is skipped (and
/// says so), unless one is required here (`COMPUTE_REQUIRE` names wgpu, or
/// `CI=true`), where it fails.
#[cfg(test)]
pub(crate) fn skip_without_adapter(e: &dyn std::fmt::Display) {
    let required = compute_core::conformance::required(compute_core::BackendKind::Wgpu)
        || std::env::var("CI").is_ok_and(|v| v == "true");
    assert!(!required, "a wgpu adapter is required here (COMPUTE_REQUIRE / CI) but: {e}");
    eprintln!("SKIPPED (no wgpu adapter: {e})");
}

/// The wgpu crate this backend is built on (for [`WgpuBackend::device`] and pooled buffers).
pub use wgpu;
