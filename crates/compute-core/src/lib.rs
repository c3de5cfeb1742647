//! # compute-core
//!
//! The shared vocabulary of the compute library: every operation is described
//! once here ([`Op`]: shapes, validation, FLOPs and bytes moved), every backend
//! implements one trait ([`Backend`]), every failure is one error type
//! ([`ComputeError`]), and one conformance suite ([`conformance`]) checks every
//! backend against a float64 [`reference`](mod@reference).
//!
//! This crate depends on `thiserror`, `half` (the `f16` and `bf16` types) and
//! `bytemuck` only (and `serde`, optionally).
//!
//! An op knows its shapes, its cost and its float64 answer, with no backend:
//!
//! ```
//! use compute_core::{Op, reference};
//! let op = Op::matmul(2, 3, 2); // [2×3]·[3×2]
//! assert_eq!(op.cost().flops, 2 * 2 * 3 * 2);
//! let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
//! let b = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0];
//! let c = reference::run(&op, &[&a, &b])?;
//! assert_eq!(c.values, [4.0, 5.0, 10.0, 11.0]);
//! // A wrong length is a typed error naming the op and shapes, never a panic.
//! assert!(op.check(&[6, 5], 4).is_err());
//! # Ok::<(), compute_core::ComputeError>(())
//! ```

pub mod async_ops;
pub mod attention;
pub mod backend;
pub mod conformance;
pub mod dtype;
pub mod error;
pub mod gguf;
pub mod host;
pub mod op;
pub mod pinned;
pub mod quant;
pub mod reference;
pub mod rng;
pub mod rope;
pub mod strided;

pub use async_ops::AsyncOps;
pub use attention::{AttentionSpec, Mask};
pub use backend::{
    Backend, Location, Ops, Recording, Tensor, TensorStorage, check_download, check_host_call, check_parts,
    check_tensor_call, check_upload, with_f32_views,
};
pub use dtype::{DType, Element, bf16, f16};
pub use error::{BackendKind, Cause, ComputeError, Result};
pub use host::{Blocks, BlocksMut, HostSlice, HostSliceMut, HostVec};
pub use op::{
    Activation, BatchStrides, BinaryOp, Conv2dSpec, Cost, Epilogue, GeluForm, Layout, MatmulSpec, Op, OpClass, Operand,
    Precision, QuantMatmulSpec, ReduceOp, RowOp, UnaryOp,
};
pub use pinned::{
    F32Memory, PinnedF32, PinnedWords, WordsMemory, check_pinned_download, check_pinned_parts,
    download_pinned_via_host, upload_pinned_via_host,
};
pub use rope::{HeadSlice, RopeLayout, RopeScaling, RopeSpec};
pub use strided::{CopySpec, Strided};
