//! # compute-core
//!
//! The shared vocabulary of the compute library: every operation is described
//! once here ([`Op`]: shapes, validation, FLOPs and bytes moved), every backend
//! implements one trait ([`Backend`]), every failure is one error type
//! ([`ComputeError`]), and one conformance suite ([`conformance`]) checks every
//! backend against a float64 [`reference`].
//!
//! This crate has no dependency beyond `thiserror` (and `serde`, optionally).

pub mod backend;
pub mod conformance;
pub mod error;
pub mod op;
pub mod reference;

pub use backend::{Backend, Location, Ops, Tensor, TensorStorage, check_host_call, check_tensor_call};
pub use error::{BackendKind, ComputeError, Result};
pub use op::{BinaryOp, Conv2dSpec, Cost, GeluForm, Layout, MatmulSpec, Op, OpClass, ReduceOp, RowOp, UnaryOp};
