//! Interpolation requests on the executor handle: lerp and slerp of two
//! `f32` vectors, coalesced like the other element-wise and row-wise
//! requests (equal `t`, and for slerp equal row length, share one call).

use compute_core::{ComputeError, Op, Result};

use super::BatchedGpuHandle;
use crate::async_result::AsyncGpuResult;

/// Which interpolation [`BatchedGpuHandle::interpolate`] runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Interpolation {
    /// Element-wise `a + t·(b − a)` over the whole inputs ([`Op::Lerp`]:
    /// `t` finite, exact at 0 and 1).
    Lerp {
        /// Interpolation weight.
        t: f32,
    },
    /// Spherical interpolation of each row of `cols` elements ([`Op::Slerp`]:
    /// `t` in `[0, 1]`; zero and near-(anti)parallel rows fall back to lerp).
    Slerp {
        /// Interpolation weight in `[0, 1]`.
        t: f32,
        /// Row length; must divide the inputs' length.
        cols: usize,
    },
}

impl Interpolation {
    /// The op for two inputs of `len` elements each. A `Shape` error naming
    /// the op when `cols` is zero or does not divide `len`; `t` and the sizes
    /// are validated by [`Op::layout`] when the request is submitted. Free.
    pub fn op(self, len: usize) -> Result<Op> {
        match self {
            Interpolation::Lerp { t } => Ok(Op::lerp(len, t)),
            Interpolation::Slerp { t, cols } => {
                if cols == 0 || !len.is_multiple_of(cols) {
                    let op = Op::slerp(len.checked_div(cols).unwrap_or(0), cols, t);
                    return Err(ComputeError::shape(
                        op.name(),
                        format!("{len} elements are not whole rows of {cols}"),
                        op.shapes(),
                    ));
                }
                Ok(Op::slerp(len / cols, cols, t))
            }
        }
    }
}

impl BatchedGpuHandle {
    /// Submits an interpolation of `a` and `b` (equal lengths): lerp or
    /// slerp, see [`Interpolation`]. Requests of the same kind and `t` (and
    /// row length, for slerp) queued together run as one op call, and each
    /// gets its own slice of the result. Bad shapes or a `t` out of range are
    /// refused here, never queued. Blocks while the queue is full, as
    /// [`BatchedGpuHandle::submit`] does; costs the op (one read of `a` and
    /// `b`, one write; slerp reads each row twice).
    pub fn interpolate(&self, how: Interpolation, a: Vec<f32>, b: Vec<f32>) -> Result<AsyncGpuResult<Vec<f32>>> {
        let op = how.op(a.len())?;
        self.submit(op, vec![a, b])
    }
}
