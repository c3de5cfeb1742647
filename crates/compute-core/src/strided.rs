//! Strided copies ([`CopySpec`]): the parameters of [`Op::Copy`](crate::Op::Copy),
//! which writes a 3-D strided view of one buffer into a 3-D strided view of
//! another, leaving every other element of the destination as it was.
//!
//! One op covers what a decoder moves around: appending a step's keys and
//! values to a KV cache at its current length, turning token-major
//! `[seq, heads, head_dim]` into head-major `[heads, seq, head_dim]` and
//! back, and slicing rows out of a matrix.
//!
//! ```
//! use compute_core::{CopySpec, Op, Strided};
//! // Append 1 token of 2 heads × 4 values to a cache of [2 heads, 8 slots, 4]
//! // at slot 5: each head's 4 values go to (h·8 + 5)·4.
//! let spec = CopySpec::new(
//!     [2, 1, 4],
//!     Strided::contiguous([2, 1, 4]),
//!     Strided { offset: 5 * 4, strides: [8 * 4, 4, 1], len: 2 * 8 * 4 },
//! );
//! let op = Op::Copy(spec);
//! assert_eq!(op.layout()?.output_len(), 64);
//! # Ok::<(), compute_core::ComputeError>(())
//! ```

use crate::dtype::DType;

/// A strided view of a buffer of `len` elements: element `(i, j, l)` is at
/// `offset + i·strides[0] + j·strides[1] + l·strides[2]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Strided {
    /// Index of element `(0, 0, 0)`.
    pub offset: usize,
    /// Elements between neighbours along each dimension.
    pub strides: [usize; 3],
    /// Elements in the whole buffer.
    pub len: usize,
}

impl Strided {
    /// The row-major view of a whole buffer of `shape`.
    pub fn contiguous(shape: [usize; 3]) -> Strided {
        Strided { offset: 0, strides: [shape[1] * shape[2], shape[2], 1], len: shape[0] * shape[1] * shape[2] }
    }

    /// Index of element `(i, j, l)`.
    pub fn index(&self, i: usize, j: usize, l: usize) -> usize {
        self.offset + i * self.strides[0] + j * self.strides[1] + l * self.strides[2]
    }

    /// The largest index the view reaches over `shape` (every extent ≥ 1),
    /// `None` on overflow.
    pub fn last(&self, shape: [usize; 3]) -> Option<usize> {
        let mut at = self.offset;
        for (n, s) in shape.iter().zip(self.strides) {
            at = at.checked_add(n.checked_sub(1)?.checked_mul(s)?)?;
        }
        Some(at)
    }

    /// Whether no two elements of the view over `shape` share an index: with
    /// the dimensions of extent > 1 in increasing stride, each stride passes
    /// the span of the ones before it (a sufficient test, exact for the
    /// views of permuted and sliced arrays).
    pub fn is_one_to_one(&self, shape: [usize; 3]) -> bool {
        let mut dims: Vec<(usize, usize)> =
            shape.iter().zip(self.strides).filter(|(n, _)| **n > 1).map(|(&n, s)| (s, n)).collect();
        dims.sort_unstable();
        let mut span = 0usize;
        for (s, n) in dims {
            if s <= span {
                return false;
            }
            span = match (n - 1).checked_mul(s).and_then(|x| x.checked_add(span)) {
                Some(x) => x,
                None => return false,
            };
        }
        true
    }
}

/// `dst[view] = src[view]` over a `shape` of up to three dimensions; the
/// elements of `dst` outside its view keep their values. Input: `src`
/// (`src.len` elements); output: `dst` (`dst.len`), both of `dtype`, a float
/// dtype. Exact: every backend copies bits.
///
/// With [`CopySpec::at_positions`] the destination's second index comes from
/// the device instead: a second input of `shape[1]` `f32` values, and
/// element `(i, j, l)` goes to `dst.index(i, positions[j], l)`. A decoder
/// appends a step's keys to its cache this way at a position that only the
/// device knows (a recorded step replays at every position). A position that
/// is not a whole number below the slot count is skipped (nothing written for
/// it); two equal positions write one of their values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct CopySpec {
    /// Extents of the copied block.
    pub shape: [usize; 3],
    /// Where the values come from.
    pub src: Strided,
    /// Where they go; one-to-one ([`Strided::is_one_to_one`]).
    pub dst: Strided,
    /// Dtype of both buffers.
    pub dtype: DType,
    /// `Some(slots)`: the destination's second index is read from the
    /// positions input and is below `slots` ([`CopySpec::at_positions`]).
    #[cfg_attr(feature = "serde", serde(default))]
    pub positions: Option<usize>,
}

impl CopySpec {
    /// A copy of `f32` data. Free.
    pub fn new(shape: [usize; 3], src: Strided, dst: Strided) -> Self {
        CopySpec { shape, src, dst, dtype: DType::F32, positions: None }
    }

    /// The same with the destination's second index taken from a second
    /// input of `shape[1]` positions, each below `slots` (the destination
    /// view must fit, one to one, over `[shape[0], slots, shape[2]]`).
    pub fn at_positions(self, slots: usize) -> Self {
        CopySpec { positions: Some(slots), ..self }
    }

    /// The destination slot of a position value: `Some(p)` for a whole
    /// number `0 ≤ p < slots`, else `None` (not written).
    pub fn slot(position: f32, slots: usize) -> Option<usize> {
        (position >= 0.0 && position.fract() == 0.0 && (position as f64) < slots as f64).then_some(position as usize)
    }

    /// The extents the destination view covers: `shape`, or with the
    /// positions' slot count as the second extent.
    pub fn dst_extent(&self) -> [usize; 3] {
        match self.positions {
            Some(slots) => [self.shape[0], slots, self.shape[2]],
            None => self.shape,
        }
    }

    /// The same on `dtype` data.
    pub fn with_dtype(self, dtype: DType) -> Self {
        CopySpec { dtype, ..self }
    }

    /// Elements copied.
    pub fn count(&self) -> usize {
        self.shape.iter().product()
    }
}
