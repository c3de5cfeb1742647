//! Element types: [`DType`] names the type of an operand's values, and
//! [`Element`] is the Rust type behind each scalar dtype (`f32`, and the `half`
//! crate's `f16` and `bf16`).
//!
//! Four dtypes are GGML's block-quantized weight formats (`Q4_K`, `Q5_K`,
//! `Q6_K`, `Q8_0`, see [`quant`](crate::quant)): an operand of such a dtype
//! still counts its *values*, but stores them as whole blocks of 256 (or 32)
//! values in ggml's byte layout; [`DType::bytes_for`] gives the blocks' bytes
//! and refuses a length that is not a whole number of blocks. No Rust scalar
//! type stands behind them: host data of these dtypes travels as bytes
//! ([`Blocks`](crate::host::Blocks)).
//!
//! Conversions from `f32` round to nearest, ties to even; NaN stays NaN (its
//! sign kept, the payload quieted); ±∞ and ±0 are kept; values past the
//! narrower type's range become ±∞. This is what PyTorch's `.to(dtype)`, the
//! CUDA `cvt.rn` instructions and AVX-512's `vcvtneps2bf16` do, so every backend
//! can agree bit for bit.
//!
//! ```
//! use compute_core::{DType, Element};
//! use half::bf16;
//! assert_eq!(DType::BF16.size_in_bytes(), 2);
//! assert_eq!(<bf16 as Element>::DTYPE, DType::BF16);
//! // 1 + 2⁻⁸ lies halfway between two bf16 values: ties go to the even one.
//! assert_eq!(bf16::from_f32(1.0 + 1.0 / 256.0).to_f32(), 1.0);
//! assert!(bf16::from_f32(f32::NAN).to_f32().is_nan());
//! ```

use std::fmt;

use crate::host::{HostSlice, HostSliceMut, HostVec};
use crate::quant::BlockFormat;

pub use half::{bf16, f16};

/// The type of an operand's values.
///
/// Marked `non_exhaustive`: 8-bit floats (`F8E4M3`) and more quantized
/// block types join it as they are supported, so a `match` on it needs a
/// wildcard arm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub enum DType {
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary16: 5 exponent bits, 10 mantissa bits (max 65504).
    F16,
    /// bfloat16: f32's 8 exponent bits, 7 mantissa bits.
    BF16,
    /// GGML `Q4_K`: blocks of 256 values in 144 bytes (4.5 bits a value).
    Q4K,
    /// GGML `Q5_K`: blocks of 256 values in 176 bytes (5.5 bits a value).
    Q5K,
    /// GGML `Q6_K`: blocks of 256 values in 210 bytes (6.5625 bits a value).
    Q6K,
    /// GGML `Q8_0`: blocks of 32 values in 34 bytes (8.5 bits a value).
    Q8_0,
}

impl DType {
    /// The floating-point dtypes, in a fixed order (for tests and tables):
    /// every op of the vocabulary runs on each of them.
    pub const ALL: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

    /// The block-quantized dtypes, in a fixed order: weight operands of
    /// [`Op::QuantMatmul`](crate::Op::QuantMatmul) and the two sides of a
    /// quantizing or dequantizing [`Op::Cast`](crate::Op::Cast).
    pub const QUANTIZED: [DType; 4] = [DType::Q4K, DType::Q5K, DType::Q6K, DType::Q8_0];

    /// The block format behind a quantized dtype, `None` for a float dtype. Free.
    pub const fn block_format(self) -> Option<BlockFormat> {
        match self {
            DType::Q4K => Some(BlockFormat::Q4K),
            DType::Q5K => Some(BlockFormat::Q5K),
            DType::Q6K => Some(BlockFormat::Q6K),
            DType::Q8_0 => Some(BlockFormat::Q8_0),
            DType::F32 | DType::F16 | DType::BF16 => None,
        }
    }

    /// The dtype of a weight block format; `None` for `Q8_K`, which is only
    /// an activation format inside the CPU kernels. Free.
    pub const fn of_block_format(format: BlockFormat) -> Option<DType> {
        match format {
            BlockFormat::Q4K => Some(DType::Q4K),
            BlockFormat::Q5K => Some(DType::Q5K),
            BlockFormat::Q6K => Some(DType::Q6K),
            BlockFormat::Q8_0 => Some(DType::Q8_0),
            BlockFormat::Q8K => None,
        }
    }

    /// Whether values of this dtype are stored in quantized blocks. Free.
    pub const fn is_quantized(self) -> bool {
        self.block_format().is_some()
    }

    /// Values in one storage unit: 1 for a float dtype, the block's values
    /// (256, or 32 for `Q8_0`) for a quantized one. An operand's length must
    /// be a multiple of it.
    pub const fn block_values(self) -> usize {
        match self.block_format() {
            Some(f) => f.values_per_block(),
            None => 1,
        }
    }

    /// `x` rounded to this dtype and widened back to `f64`: the value a
    /// backend stores when it writes `x`. Rounds through `f32` (correctly
    /// rounded for every `x` that `f32` holds exactly; for others the double
    /// rounding can differ by one unit in rare ties).
    ///
    /// A quantized dtype rounds one value alone only through `f32` (its
    /// rounding depends on the whole block, see [`quant`](crate::quant)).
    pub fn round(self, x: f64) -> f64 {
        match self {
            DType::F16 => f16::from_f32(x as f32).to_f64(),
            DType::BF16 => bf16::from_f32(x as f32).to_f64(),
            _ => f64::from(x as f32),
        }
    }

    /// Bytes of one storage unit: one value of a float dtype (4 or 2), one
    /// block of a quantized dtype (144, 176, 210 or 34 bytes for
    /// [`block_values`](Self::block_values) values).
    pub const fn size_in_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q4K | DType::Q5K | DType::Q6K | DType::Q8_0 => match self.block_format() {
                Some(f) => f.bytes_per_block(),
                None => 0,
            },
        }
    }

    /// Bytes of `len` values, or `None` when that overflows `u64` or, for a
    /// quantized dtype, when `len` is not a whole number of blocks.
    pub fn bytes_for(self, len: usize) -> Option<u64> {
        if !len.is_multiple_of(self.block_values()) {
            return None;
        }
        ((len / self.block_values()) as u64).checked_mul(self.size_in_bytes() as u64)
    }

    /// Short name, as printed in errors, tables and JSON (`f32`, `f16`,
    /// `bf16`, and ggml's `q4_K`, `q5_K`, `q6_K`, `q8_0`).
    pub const fn as_str(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::Q4K => "q4_K",
            DType::Q5K => "q5_K",
            DType::Q6K => "q6_K",
            DType::Q8_0 => "q8_0",
        }
    }

    /// Unit roundoff: half the distance from 1.0 to the next value
    /// (2⁻²⁴ for f32, 2⁻¹¹ for f16, 2⁻⁸ for bf16). Tolerances scale with it.
    /// A quantized dtype has no fixed relative rounding; this gives f32's,
    /// the precision its values are computed in once dequantized.
    pub fn unit_roundoff(self) -> f64 {
        match self {
            DType::F16 => f16::EPSILON.to_f64() / 2.0,
            DType::BF16 => bf16::EPSILON.to_f64() / 2.0,
            _ => f64::from(f32::EPSILON) / 2.0,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
}

/// A Rust type that holds one value of a scalar [`DType`]: `f32`, [`f16`](struct@f16) or
/// [`bf16`]. Sealed: the library's kernels exist for exactly these.
///
/// Every conversion is exact except [`Element::from_f32`] into a narrower type,
/// which rounds as the [module](self) describes. Each costs a few instructions
/// (a shift for bf16 → f32; F16C or a short bit sequence for f16).
pub trait Element:
    Copy + Default + PartialEq + PartialOrd + fmt::Debug + Send + Sync + 'static + sealed::Sealed
{
    /// The dtype this type holds.
    const DTYPE: DType;
    /// `x` rounded to this type (nearest, ties to even; NaN stays NaN).
    fn from_f32(x: f32) -> Self;
    /// This value as `f32` (exact).
    fn to_f32(self) -> f32;
    /// This value as `f64` (exact).
    fn to_f64(self) -> f64 {
        f64::from(self.to_f32())
    }
    /// A typed view of `s` (free).
    fn host(s: &[Self]) -> HostSlice<'_>;
    /// A typed mutable view of `s` (free).
    fn host_mut(s: &mut [Self]) -> HostSliceMut<'_>;
    /// The slice behind `s`, if it holds this type (free).
    fn from_host(s: HostSlice<'_>) -> Option<&[Self]>;
    /// The mutable slice behind `s`, if it holds this type (free).
    fn from_host_mut(s: HostSliceMut<'_>) -> Option<&mut [Self]>;
    /// `v` as an owned typed vector (free).
    fn host_vec(v: Vec<Self>) -> HostVec;
}

/// The [`Element`] methods that wrap and unwrap the typed host views.
macro_rules! host_views {
    ($t:ty, $variant:ident) => {
        fn host(s: &[Self]) -> HostSlice<'_> {
            HostSlice::$variant(s)
        }
        fn host_mut(s: &mut [Self]) -> HostSliceMut<'_> {
            HostSliceMut::$variant(s)
        }
        fn from_host(s: HostSlice<'_>) -> Option<&[Self]> {
            match s {
                HostSlice::$variant(s) => Some(s),
                _ => None,
            }
        }
        fn from_host_mut(s: HostSliceMut<'_>) -> Option<&mut [Self]> {
            match s {
                HostSliceMut::$variant(s) => Some(s),
                _ => None,
            }
        }
        fn host_vec(v: Vec<Self>) -> HostVec {
            HostVec::$variant(v)
        }
    };
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    fn from_f32(x: f32) -> Self {
        x
    }
    fn to_f32(self) -> f32 {
        self
    }
    host_views!(f32, F32);
}

impl Element for f16 {
    const DTYPE: DType = DType::F16;
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    host_views!(f16, F16);
}

impl Element for bf16 {
    const DTYPE: DType = DType::BF16;
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    host_views!(bf16, BF16);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// bf16 by hand: the upper 16 bits of the f32, rounded to nearest even.
    fn bf16_bits(x: f32) -> u16 {
        let b = x.to_bits();
        if x.is_nan() {
            return ((b >> 16) as u16) | 0x0040;
        }
        let lsb = (b >> 16) & 1;
        (b.wrapping_add(0x7fff + lsb) >> 16) as u16
    }

    #[test]
    fn bf16_rounds_to_nearest_even_and_keeps_specials() {
        let mut rng = crate::rng::Rng::new(crate::rng::fresh_seed());
        for _ in 0..100_000 {
            let x = f32::from_bits(rng.next_u64() as u32);
            let got = bf16::from_f32(x);
            if x.is_nan() {
                assert!(got.is_nan(), "{x:?}");
                assert_eq!(got.to_bits() >> 15, (x.to_bits() >> 31) as u16, "sign of NaN {x:?}");
            } else {
                assert_eq!(got.to_bits(), bf16_bits(x), "{x:?}");
            }
        }
        for (x, want) in [
            (1.0 + 1.0 / 256.0, 1.0),               // tie: down to even
            (1.0 + 3.0 / 256.0, 1.0 + 4.0 / 256.0), // tie: up to even
            (f32::INFINITY, f32::INFINITY),
            (-0.0, -0.0),
            (f32::MAX, f32::INFINITY), // past bf16's largest finite value
        ] {
            let got = <bf16 as Element>::from_f32(x).to_f32();
            assert_eq!(got.to_bits(), want.to_bits(), "{x}");
        }
    }

    #[test]
    fn f16_rounds_to_nearest_even_and_saturates_to_infinity() {
        for (x, want) in [
            (1.0 + 1.0 / 2048.0, 1.0),                // tie: down to even
            (1.0 + 3.0 / 2048.0, 1.0 + 4.0 / 2048.0), // tie: up to even
            (65504.0, 65504.0),
            (65520.0, f32::INFINITY), // halfway past the max rounds up to ∞
            (-1e9, f32::NEG_INFINITY),
            (2.0f32.powi(-24), 2.0f32.powi(-24)), // smallest subnormal
            (-0.0, -0.0),
        ] {
            let got = <f16 as Element>::from_f32(x).to_f32();
            assert_eq!(got.to_bits(), want.to_bits(), "{x}");
        }
        assert!(<f16 as Element>::from_f32(f32::NAN).to_f32().is_nan());
    }

    #[test]
    fn dtypes_know_their_sizes_and_names() {
        let sizes: Vec<usize> = DType::ALL.iter().map(|d| d.size_in_bytes()).collect();
        assert_eq!(sizes, [4, 2, 2]);
        assert_eq!(DType::BF16.to_string(), "bf16");
        assert_eq!(DType::F16.bytes_for(3), Some(6));
        assert_eq!(DType::F32.bytes_for(usize::MAX), None);
        assert_eq!(<f32 as Element>::DTYPE, DType::F32);
        assert_eq!(<f16 as Element>::DTYPE, DType::F16);
        assert!(DType::BF16.unit_roundoff() > DType::F16.unit_roundoff());
        assert_eq!(DType::F32.unit_roundoff(), 2f64.powi(-24));
    }

    #[test]
    fn quantized_dtypes_count_values_and_store_whole_blocks() {
        assert_eq!(DType::Q4K.bytes_for(512), Some(288));
        assert_eq!(DType::Q6K.bytes_for(256), Some(210));
        assert_eq!(DType::Q8_0.bytes_for(64), Some(68));
        assert_eq!(DType::Q4K.bytes_for(300), None, "not a whole number of blocks");
        assert_eq!(DType::Q5K.to_string(), "q5_K");
        for d in DType::QUANTIZED {
            let f = d.block_format().unwrap();
            assert_eq!(DType::of_block_format(f), Some(d));
            assert_eq!((d.block_values(), d.size_in_bytes()), (f.values_per_block(), f.bytes_per_block()));
            assert!(d.is_quantized());
        }
        assert_eq!(DType::of_block_format(BlockFormat::Q8K), None);
        assert!(DType::ALL.iter().all(|d| !d.is_quantized() && d.block_values() == 1));
    }
}
