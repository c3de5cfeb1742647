//! [`GgmlType`]: the element type id of a GGUF tensor, with its block layout.

use std::fmt;

macro_rules! ggml_types {
    ($( $(#[$doc:meta])* $variant:ident = $id:literal, $name:literal, $block:literal, $bytes:literal; )*) => {
        /// The type of a tensor's elements in a GGUF file (ggml's `ggml_type`,
        /// the `GGMLQuantizationType` of the `gguf` Python package).
        ///
        /// Every type is stored as blocks: [`GgmlType::block_values`] values
        /// packed into [`GgmlType::block_bytes`] bytes (one value per block for
        /// the plain types: `F32` is `(1, 4)`, `Q8_0` is `(32, 34)`, `Q4_K` is
        /// `(256, 144)`). A row of `ne0` values holds `ne0 / block_values`
        /// blocks, so `ne0` must be a multiple of the block.
        ///
        /// An id this version does not name is kept as [`GgmlType::Other`]:
        /// not an error, its tensor is readable as raw bytes. Converting from
        /// and to the id ([`GgmlType::from_id`], [`GgmlType::id`]) is a match,
        /// free.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        #[allow(non_camel_case_types)] // ggml's own names: `Q4_K`, `IQ2_XXS`
        pub enum GgmlType {
            $( $(#[$doc])* $variant, )*
            /// An id this version does not know: its block layout is unknown,
            /// so its tensor's byte length is the span up to the next tensor
            /// (see [`TensorInfo::byte_len`](super::TensorInfo::byte_len)).
            Other(u32),
        }

        impl GgmlType {
            /// Every named type, in id order (for tests and tables).
            pub const KNOWN: &'static [GgmlType] = &[$(GgmlType::$variant),*];

            /// The type with this id; an unknown id is [`GgmlType::Other`].
            pub const fn from_id(id: u32) -> GgmlType {
                match id {
                    $( $id => GgmlType::$variant, )*
                    other => GgmlType::Other(other),
                }
            }

            /// The id stored in the file.
            pub const fn id(self) -> u32 {
                match self {
                    $( GgmlType::$variant => $id, )*
                    GgmlType::Other(id) => id,
                }
            }

            /// ggml's name for the type (`"Q4_K"`, `"BF16"`), as the `gguf`
            /// Python package spells it; `None` for [`GgmlType::Other`].
            pub const fn name(self) -> Option<&'static str> {
                match self {
                    $( GgmlType::$variant => Some($name), )*
                    GgmlType::Other(_) => None,
                }
            }

            /// `(values per block, bytes per block)`; `None` for [`GgmlType::Other`].
            pub const fn block(self) -> Option<(u64, u64)> {
                match self {
                    $( GgmlType::$variant => Some(($block, $bytes)), )*
                    GgmlType::Other(_) => None,
                }
            }
        }
    };
}

ggml_types! {
    /// IEEE binary32.
    F32 = 0, "F32", 1, 4;
    /// IEEE binary16.
    F16 = 1, "F16", 1, 2;
    /// 32 4-bit values and an f16 scale.
    Q4_0 = 2, "Q4_0", 32, 18;
    /// 32 4-bit values, an f16 scale and an f16 minimum.
    Q4_1 = 3, "Q4_1", 32, 20;
    /// 32 5-bit values and an f16 scale.
    Q5_0 = 6, "Q5_0", 32, 22;
    /// 32 5-bit values, an f16 scale and an f16 minimum.
    Q5_1 = 7, "Q5_1", 32, 24;
    /// 32 8-bit values and an f16 scale.
    Q8_0 = 8, "Q8_0", 32, 34;
    /// 32 8-bit values, an f16 scale and an f16 sum. (ggml's block is 36
    /// bytes; the `gguf` Python package's table still says 40, from when the
    /// scale and sum were f32.)
    Q8_1 = 9, "Q8_1", 32, 36;
    /// k-quant: 256 2-bit values in 16 sub-blocks.
    Q2_K = 10, "Q2_K", 256, 84;
    /// k-quant: 256 3-bit values in 16 sub-blocks.
    Q3_K = 11, "Q3_K", 256, 110;
    /// k-quant: 256 4-bit values in 8 sub-blocks with 6-bit scales and minimums.
    Q4_K = 12, "Q4_K", 256, 144;
    /// k-quant: 256 5-bit values in 8 sub-blocks.
    Q5_K = 13, "Q5_K", 256, 176;
    /// k-quant: 256 6-bit values in 16 sub-blocks.
    Q6_K = 14, "Q6_K", 256, 210;
    /// k-quant: 256 8-bit values, an f32 scale and 16 partial sums.
    Q8_K = 15, "Q8_K", 256, 292;
    /// i-quant, about 2.06 bits a value.
    IQ2_XXS = 16, "IQ2_XXS", 256, 66;
    /// i-quant, about 2.31 bits a value.
    IQ2_XS = 17, "IQ2_XS", 256, 74;
    /// i-quant, about 3.06 bits a value.
    IQ3_XXS = 18, "IQ3_XXS", 256, 98;
    /// i-quant, about 1.56 bits a value.
    IQ1_S = 19, "IQ1_S", 256, 50;
    /// i-quant: 32 4-bit non-linear values and an f16 scale.
    IQ4_NL = 20, "IQ4_NL", 32, 18;
    /// i-quant, about 3.44 bits a value.
    IQ3_S = 21, "IQ3_S", 256, 110;
    /// i-quant, about 2.5 bits a value.
    IQ2_S = 22, "IQ2_S", 256, 82;
    /// i-quant, about 4.25 bits a value.
    IQ4_XS = 23, "IQ4_XS", 256, 136;
    /// 8-bit signed integers.
    I8 = 24, "I8", 1, 1;
    /// 16-bit signed integers.
    I16 = 25, "I16", 1, 2;
    /// 32-bit signed integers.
    I32 = 26, "I32", 1, 4;
    /// 64-bit signed integers.
    I64 = 27, "I64", 1, 8;
    /// IEEE binary64.
    F64 = 28, "F64", 1, 8;
    /// i-quant, about 1.75 bits a value.
    IQ1_M = 29, "IQ1_M", 256, 56;
    /// bfloat16.
    BF16 = 30, "BF16", 1, 2;
    /// Ternary, about 1.69 bits a value.
    TQ1_0 = 34, "TQ1_0", 256, 54;
    /// Ternary, 2 bits a value.
    TQ2_0 = 35, "TQ2_0", 256, 66;
    /// Microscaling FP4: 32 E2M1 values and an E8M0 scale.
    MXFP4 = 39, "MXFP4", 32, 17;
    /// NVIDIA FP4: 64 E2M1 values and four E4M3 scales.
    NVFP4 = 40, "NVFP4", 64, 36;
    /// 128 1-bit values and an f16 scale.
    Q1_0 = 41, "Q1_0", 128, 18;
}

impl GgmlType {
    /// Values per block (1 for the plain types); `None` for [`GgmlType::Other`].
    pub const fn block_values(self) -> Option<u64> {
        match self.block() {
            Some((values, _)) => Some(values),
            None => None,
        }
    }

    /// Bytes per block (the type size); `None` for [`GgmlType::Other`].
    pub const fn block_bytes(self) -> Option<u64> {
        match self.block() {
            Some((_, bytes)) => Some(bytes),
            None => None,
        }
    }

    /// Whether the type is quantized in blocks of more than one value.
    pub const fn is_quantized(self) -> bool {
        matches!(self.block_values(), Some(n) if n > 1)
    }

    /// The compute-core [`DType`](crate::DType) of the values, for the types
    /// the library computes with (`F32`, `F16`, `BF16`, and the blocks of
    /// `Q4_K`, `Q5_K`, `Q6_K`, `Q8_0`); `None` for the others.
    pub const fn dtype(self) -> Option<crate::DType> {
        match self {
            GgmlType::F32 => Some(crate::DType::F32),
            GgmlType::F16 => Some(crate::DType::F16),
            GgmlType::BF16 => Some(crate::DType::BF16),
            GgmlType::Q4_K => Some(crate::DType::Q4K),
            GgmlType::Q5_K => Some(crate::DType::Q5K),
            GgmlType::Q6_K => Some(crate::DType::Q6K),
            GgmlType::Q8_0 => Some(crate::DType::Q8_0),
            _ => None,
        }
    }

    /// Bytes of a tensor of this type with dims `dims` (ne0 first, the
    /// innermost): rows × (ne0 / block values) × block bytes, or why not.
    /// Checked arithmetic: a few multiplications, no allocation.
    pub fn tensor_bytes(self, dims: &[u64]) -> Result<u64, TensorSizeError> {
        let (values, bytes) = self.block().ok_or(TensorSizeError::UnknownType)?;
        let ne0 = dims.first().copied().unwrap_or(1);
        if ne0 % values != 0 {
            return Err(TensorSizeError::NotBlockMultiple { ne0, block_values: values });
        }
        let rows = dims.iter().skip(1).try_fold(1u64, |acc, &d| acc.checked_mul(d)).ok_or(TensorSizeError::Overflow)?;
        (ne0 / values).checked_mul(bytes).and_then(|row| row.checked_mul(rows)).ok_or(TensorSizeError::Overflow)
    }
}

/// Why [`GgmlType::tensor_bytes`] has no answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TensorSizeError {
    /// The type is [`GgmlType::Other`]: its block layout is unknown.
    UnknownType,
    /// The row length `ne0` is not a multiple of the type's block.
    NotBlockMultiple {
        /// The row length.
        ne0: u64,
        /// Values per block.
        block_values: u64,
    },
    /// The byte count does not fit in a `u64`.
    Overflow,
}

/// ggml's name (`Q4_K`), or `type 77` for an unknown id.
impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "type {}", self.id()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_sizes_follow_the_blocks() {
        for &t in GgmlType::KNOWN {
            assert_eq!(GgmlType::from_id(t.id()), t);
        }
        assert_eq!(GgmlType::from_id(4), GgmlType::Other(4));
        assert_eq!(GgmlType::Other(4).to_string(), "type 4");
        assert_eq!(GgmlType::Q4_K.to_string(), "Q4_K");
        assert_eq!(GgmlType::Q4_K.tensor_bytes(&[512, 3]), Ok(2 * 144 * 3));
        assert_eq!(GgmlType::F16.tensor_bytes(&[]), Ok(2));
        assert_eq!(GgmlType::Q8_0.tensor_bytes(&[0, 7]), Ok(0));
        assert_eq!(
            GgmlType::Q8_0.tensor_bytes(&[33]),
            Err(TensorSizeError::NotBlockMultiple { ne0: 33, block_values: 32 })
        );
        assert_eq!(GgmlType::F32.tensor_bytes(&[1 << 62, 2]), Err(TensorSizeError::Overflow));
        assert_eq!(GgmlType::Other(99).tensor_bytes(&[4]), Err(TensorSizeError::UnknownType));
        assert!(GgmlType::Q2_K.is_quantized() && !GgmlType::BF16.is_quantized());
    }
}
