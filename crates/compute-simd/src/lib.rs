//! # compute-simd
//!
//! The CPU backend: every op of [`compute_core::Op`] vectorised, with the
//! instruction set chosen at run time ([`Isa`]: AVX-512, AVX2+FMA, NEON, or a
//! portable path through `wide`) and `rayon` parallelism above the measured
//! thresholds in [`tuning`]. Depends on `compute-core`, `wide` and `rayon` only.
//!
//! ```
//! use compute_core::Ops;
//! let cpu = compute_simd::SimdBackend::new();
//! let mut out = vec![0.0; 4];
//! cpu.relu(&[-1.0, 2.0, -3.0, 4.0], &mut out)?;
//! assert_eq!(out, [0.0, 2.0, 0.0, 4.0]);
//! # Ok::<(), compute_core::ComputeError>(())
//! ```

mod backend;
pub mod gemm;
pub mod halves;
pub mod isa;
pub mod kernels;
pub mod quantized;
pub mod simd;
pub mod tuning;

pub use backend::{HostStorage, SimdBackend};
pub use isa::Isa;

/// The README's code blocks, compiled and run as doctests so the quickstart stays true.
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
