//! # dispatch
//!
//! The product's top crate: write against [`Compute`] and each call runs where
//! it is fastest — CUDA, wgpu or the CPU (on all threads or one) — as predicted
//! by a [`CostModel`] measured on this machine ([`calibrate`]).
//!
//! ```
//! use compute_core::Ops;
//! // `Compute::auto()` finds every engine and loads (or measures once) the
//! // machine's profile; this example uses nominal figures to start instantly.
//! let compute = dispatch::Compute::builder().cpu().nominal_profile().build()?;
//! let mut out = vec![0.0; 4];
//! compute.relu(&[-1.0, 2.0, -3.0, 4.0], &mut out)?;
//! assert_eq!(out, [0.0, 2.0, 0.0, 4.0]);
//! assert!(compute.last_engine().is_some());
//! # Ok::<(), compute_core::ComputeError>(())
//! ```
//!
//! Also here, under the names users of trueno know (the trueno-compatible surface):
//! - [`BackendSelector`]: the 5× PCIe rule, as trueno specifies it (for comparison).
//! - [`HybridScheduler`]: the fixed-threshold scheduler (`matmul`, `matmul_pooled`,
//!   `matmul_async`, `matmul_batch`, `pool_stats`), with a measured default threshold.
//! - [`GpuBufferPool`] / [`GpuPoolStats`]: a capped, thread-safe pool of device buffers.
//! - [`AsyncGpuResult`]: a result computed while the caller works; also a `Future`.
//! - [`CommandBatch`]: upload → chained ops → one `execute()` → `read`.
//! - [`BatchedExecutor`] / [`BatchedGpuHandle`] / [`BatchConfig`]: auto-batching of
//!   requests from many threads on a background thread; requests against one
//!   [`SharedWeight`] are stacked into one product.
//!
//! Features: `gpu` (default, wgpu), `cuda` (CUDA through compute-ptx), `gpu-wasm`
//! (wgpu for WebGPU). With `default-features = false` only the CPU is compiled in,
//! and every API above still works.
//!
//! In the browser (wasm32), nothing may block: [`Compute::auto_async`] opens
//! WebGPU, the `*_async` ops of [`compute_core::AsyncOps`] and
//! [`CommandBatch::execute_async`] / [`CommandBatch::read_async`] reach it, and
//! the blocking forms are absent at compile time (see [`runtime`]).

mod async_result;
mod batch;
pub mod calibrate;
mod compute;
pub mod discover;
mod engine;
mod executor;
mod hybrid;
mod lane;
pub mod llama;
mod lock;
mod model;
#[cfg(feature = "nccl")]
pub mod multi_gpu;
mod pool;
pub mod profile;
pub mod runtime;
mod selector;
pub mod timing;

pub use async_result::{AsyncGpuResult, AsyncState, Completer};
pub use batch::{BufferId, CommandBatch};
#[allow(deprecated)]
pub use compute::seed_workload;
pub use compute::{Compute, ComputeBuilder, GpuCompute, Policy, fixed_threshold_workload};
pub use engine::{Engine, Placement};
pub use executor::{
    BatchConfig, BatchPhases, BatchedExecutor, BatchedGpuExecutor, BatchedGpuHandle, ExecutorMetrics, FlushReason,
    Interpolation, MatmulRows, PHASES_ENV, SharedWeight, WeightLayout,
};
#[allow(deprecated)]
pub use hybrid::SEED_THRESHOLD;
pub use hybrid::{FIXED_THRESHOLD, HybridScheduler, MatmulOp, crossover_threshold};
pub use model::{CostModel, Decision, pick};
pub use pool::{GpuBufferPool, GpuPoolStats, PooledTensor};
pub use profile::{CurveKey, Profile};
pub use selector::{BackendSelector, SelectedBackend};
