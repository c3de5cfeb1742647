//! The core kernel set, written with the [builder](crate::builder).
//!
//! [`catalog`] lists every kernel the CUDA backend launches; `cargo xtask ptx`
//! writes each one's PTX for every [`Target`] into the top-level `ptx/` folder,
//! and the golden test checks those files against what this code emits.
//!
//! [`GemmKernel`] is a single entry to the three GEMM tiers for callers who
//! want a kernel's PTX and launch shape without the CUDA backend
//! (`GemmKernel::tiled(m, n, k, 32).emit_ptx()`).

pub mod conv;
pub mod elementwise;
mod gemm_kernel;
pub mod gemm_simple;
pub mod gemm_simt;
pub(crate) mod math;
pub mod reduce;
pub mod rows;

pub use gemm_kernel::GemmKernel;

use crate::builder::{BuildError, Kernel, Target};
use compute_core::BinaryOp;
use elementwise::UnaryKind;
use gemm_simt::SimtConfig;
use reduce::ReduceKind;
use rows::{RowKind, RowShape};

/// Identifies one kernel of the set (and, for the SIMT GEMM, its shape).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelId {
    /// A unary element-wise op.
    Unary(UnaryKind),
    /// add, sub or mul.
    Binary(BinaryOp),
    /// sum, max or the first stage of dot.
    Reduce(ReduceKind),
    /// A row op with its thread-group shape.
    Rows(RowKind, RowShape),
    /// One thread per output GEMM.
    GemmNaive,
    /// Shared-memory tiled GEMM.
    GemmTiled,
    /// Register-blocked GEMM: shape and transposes.
    GemmSimt(SimtConfig, bool, bool),
    /// im2col for conv2d.
    Im2col,
}

impl KernelId {
    /// The kernel's entry-point name (also its file name in `ptx/<target>/`).
    pub fn name(&self) -> String {
        match self {
            KernelId::Unary(k) => k.kernel_name().to_string(),
            KernelId::Binary(op) => elementwise::binary_name(*op).to_string(),
            KernelId::Reduce(k) => k.kernel_name().to_string(),
            KernelId::Rows(k, s) => k.kernel_name(*s),
            KernelId::GemmNaive => "gemm_naive".into(),
            KernelId::GemmTiled => "gemm_tiled".into(),
            KernelId::GemmSimt(cfg, ta, tb) => cfg.kernel_name(*ta, *tb),
            KernelId::Im2col => "im2col".into(),
        }
    }

    /// Emits the kernel's PTX for `target`. Pure Rust, no GPU; well under a
    /// millisecond for most kernels, a few for the SIMT GEMM.
    pub fn build(&self, target: Target) -> Result<Kernel, BuildError> {
        match *self {
            KernelId::Unary(k) => elementwise::unary(k, target),
            KernelId::Binary(op) => elementwise::binary(op, target),
            KernelId::Reduce(k) => reduce::reduce(k, target),
            KernelId::Rows(k, s) => rows::row_kernel(k, s, target),
            KernelId::GemmNaive => gemm_simple::naive(target),
            KernelId::GemmTiled => gemm_simple::tiled(target),
            KernelId::GemmSimt(cfg, ta, tb) => gemm_simt::simt(&cfg, ta, tb, target),
            KernelId::Im2col => conv::im2col(target),
        }
    }
}

/// Every kernel of the checked-in set, in a fixed order.
pub fn catalog() -> Vec<KernelId> {
    let mut v: Vec<KernelId> = UnaryKind::ALL.iter().map(|&k| KernelId::Unary(k)).collect();
    v.extend([BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul].map(KernelId::Binary));
    v.extend([ReduceKind::Sum, ReduceKind::Max, ReduceKind::Dot].map(KernelId::Reduce));
    for k in RowKind::ALL {
        v.push(KernelId::Rows(k, RowShape::Warp));
        v.push(KernelId::Rows(k, RowShape::Block));
    }
    v.push(KernelId::GemmNaive);
    v.push(KernelId::GemmTiled);
    for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
        v.push(KernelId::GemmSimt(SimtConfig::default(), ta, tb));
    }
    v.push(KernelId::Im2col);
    v
}
