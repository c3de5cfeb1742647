//! Host data of any dtype, as it crosses the [`Backend`](crate::Backend) trait.
//!
//! [`HostSlice`] and [`HostSliceMut`] borrow the caller's typed slices (no
//! copy); a backend matches on them once per call and hands its kernels typed
//! slices ([`HostSlice::get`]). [`HostVec`] owns a typed vector, for tests,
//! examples and code that loads data of a dtype known only at run time.
//!
//! Data of a quantized dtype (`Q4_K`, `Q5_K`, `Q6_K`, `Q8_0`) travels as the
//! bytes of whole blocks in ggml's layout: [`Blocks`], [`BlocksMut`], checked
//! once where they are made. Their length counts values, like every other
//! view's.
//!
//! ```
//! use compute_core::{DType, HostSlice, HostVec, bf16};
//! let x = [bf16::from_f32(1.5), bf16::from_f32(-2.0)];
//! let view = HostSlice::from(&x[..]);
//! assert_eq!((view.dtype(), view.len(), view.as_bytes().len()), (DType::BF16, 2, 4));
//! assert_eq!(view.get::<bf16>(), Some(&x[..]));
//! assert_eq!(view.get::<f32>(), None); // the dtype is checked where the data enters
//! let owned = HostVec::from_f32(DType::F16, &[0.1, 2.0]); // rounded to f16
//! assert_eq!(owned.to_f64(), [0.0999755859375, 2.0]);
//! ```

use crate::dtype::{DType, Element, bf16, f16};
use crate::error::{ComputeError, Result};
use crate::op::Operand;
use crate::quant::BlockFormat;

/// Checks that `dtype` is quantized and `bytes` whole blocks of it.
fn check_blocks(dtype: DType, bytes: usize) -> Result<BlockFormat> {
    let format = dtype.block_format().ok_or_else(|| ComputeError::DType {
        op: "blocks",
        detail: format!("{dtype} is not a block-quantized dtype"),
        shapes: format!("bytes=[{bytes}] {dtype}"),
    })?;
    if !bytes.is_multiple_of(format.bytes_per_block()) {
        return Err(ComputeError::shape(
            "blocks",
            format!("{dtype} blocks are {} bytes; got {bytes}, not a multiple", format.bytes_per_block()),
            format!("bytes=[{bytes}] {dtype}"),
        ));
    }
    Ok(format)
}

/// Borrowed bytes of whole blocks of one quantized dtype (ggml's layout).
/// Copy, three words wide; made by [`Blocks::new`], which checks the dtype
/// and that the bytes are whole blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Blocks<'a> {
    dtype: DType,
    bytes: &'a [u8],
}

impl<'a> Blocks<'a> {
    /// A view of `bytes` as blocks of `dtype`; a `DType` error when `dtype`
    /// is not quantized, a `Shape` error when `bytes` is not whole blocks. Free.
    pub fn new(dtype: DType, bytes: &'a [u8]) -> Result<Self> {
        check_blocks(dtype, bytes.len())?;
        Ok(Blocks { dtype, bytes })
    }

    /// The quantized dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The block bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The block format.
    pub fn format(&self) -> BlockFormat {
        self.dtype.block_format().unwrap_or(BlockFormat::Q8_0)
    }

    /// Values held: blocks × values per block.
    pub fn len(&self) -> usize {
        self.bytes.len() / self.dtype.size_in_bytes().max(1) * self.dtype.block_values()
    }

    /// Whether there are no blocks.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The values, dequantized as ggml does (exact). O(n); allocates.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.len()];
        // Cannot fail: the lengths were checked where the view was made.
        let _ = self.format().dequantize(self.bytes, &mut out);
        out
    }
}

/// Mutable bytes of whole blocks of one quantized dtype, where a quantizing
/// cast writes; made by [`BlocksMut::new`].
#[derive(Debug, PartialEq, Eq)]
pub struct BlocksMut<'a> {
    dtype: DType,
    bytes: &'a mut [u8],
}

impl<'a> BlocksMut<'a> {
    /// A view of `bytes` as blocks of `dtype`, checked as [`Blocks::new`]
    /// checks. Free.
    pub fn new(dtype: DType, bytes: &'a mut [u8]) -> Result<Self> {
        check_blocks(dtype, bytes.len())?;
        Ok(BlocksMut { dtype, bytes })
    }

    /// The quantized dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The block format.
    pub fn format(&self) -> BlockFormat {
        self.dtype.block_format().unwrap_or(BlockFormat::Q8_0)
    }

    /// Values held.
    pub fn len(&self) -> usize {
        self.as_blocks().len()
    }

    /// Whether there are no blocks.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// A read-only view.
    pub fn as_blocks(&self) -> Blocks<'_> {
        Blocks { dtype: self.dtype, bytes: self.bytes }
    }

    /// The block bytes, to write.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.bytes
    }

    /// The block bytes for the whole borrow.
    pub fn into_bytes(self) -> &'a mut [u8] {
        self.bytes
    }

    /// A shorter-lived view of the same bytes.
    pub fn reborrow(&mut self) -> BlocksMut<'_> {
        BlocksMut { dtype: self.dtype, bytes: self.bytes }
    }
}

/// A borrowed, typed view of host values: one variant per scalar [`DType`].
/// Copy, two words wide. Build one with `HostSlice::from(&[T])` for any
/// [`Element`] `T`.
///
/// `non_exhaustive`: more dtypes join it as they are supported.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum HostSlice<'a> {
    /// `f32` values.
    F32(&'a [f32]),
    /// IEEE half values.
    F16(&'a [f16]),
    /// bfloat16 values.
    BF16(&'a [bf16]),
    /// Quantized blocks.
    Blocks(Blocks<'a>),
}

/// A mutable, typed view of host values, where a backend writes an op's output.
/// Pass it on with [`HostSliceMut::reborrow`].
#[derive(Debug, PartialEq)]
#[non_exhaustive]
pub enum HostSliceMut<'a> {
    /// `f32` values.
    F32(&'a mut [f32]),
    /// IEEE half values.
    F16(&'a mut [f16]),
    /// bfloat16 values.
    BF16(&'a mut [bf16]),
    /// Quantized blocks.
    Blocks(BlocksMut<'a>),
}

/// An owned vector of host values of one dtype.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum HostVec {
    /// `f32` values.
    F32(Vec<f32>),
    /// IEEE half values.
    F16(Vec<f16>),
    /// bfloat16 values.
    BF16(Vec<bf16>),
    /// Quantized blocks: the dtype and the bytes of whole blocks (build
    /// with [`HostVec::blocks`], which checks them).
    Blocks(DType, Vec<u8>),
}

impl<'a> HostSlice<'a> {
    /// The dtype of the values.
    pub fn dtype(&self) -> DType {
        match self {
            HostSlice::F32(_) => DType::F32,
            HostSlice::F16(_) => DType::F16,
            HostSlice::BF16(_) => DType::BF16,
            HostSlice::Blocks(b) => b.dtype(),
        }
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            HostSlice::F32(s) => s.len(),
            HostSlice::F16(s) => s.len(),
            HostSlice::BF16(s) => s.len(),
            HostSlice::Blocks(b) => b.len(),
        }
    }

    /// Whether there are no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its length and dtype, as an op's [`Layout`](crate::Layout) states them.
    pub fn operand(&self) -> Operand {
        Operand { len: self.len(), dtype: self.dtype() }
    }

    /// The values as bytes (native endianness), e.g. for a device upload. Free.
    pub fn as_bytes(&self) -> &'a [u8] {
        match *self {
            HostSlice::F32(s) => bytemuck::cast_slice(s),
            HostSlice::F16(s) => bytemuck::cast_slice(s),
            HostSlice::BF16(s) => bytemuck::cast_slice(s),
            HostSlice::Blocks(b) => b.bytes(),
        }
    }

    /// The typed slice, if the values are `T`s. Free.
    pub fn get<T: Element>(&self) -> Option<&'a [T]> {
        T::from_host(*self)
    }

    /// The values widened to `f64` (exact; blocks dequantized as ggml
    /// does). Allocates; for references and tests.
    pub fn to_f64(&self) -> Vec<f64> {
        match self {
            HostSlice::F32(s) => s.iter().map(|&v| f64::from(v)).collect(),
            HostSlice::F16(s) => s.iter().map(|v| v.to_f64()).collect(),
            HostSlice::BF16(s) => s.iter().map(|v| v.to_f64()).collect(),
            HostSlice::Blocks(b) => b.dequantize().into_iter().map(f64::from).collect(),
        }
    }

    /// The values widened to `f32` (exact; blocks dequantized). Allocates.
    pub fn to_f32(&self) -> Vec<f32> {
        match self {
            HostSlice::F32(s) => s.to_vec(),
            HostSlice::F16(s) => s.iter().map(|v| v.to_f32()).collect(),
            HostSlice::BF16(s) => s.iter().map(|v| v.to_f32()).collect(),
            HostSlice::Blocks(b) => b.dequantize(),
        }
    }

    /// Each value's bits (zero-extended for the 2-byte types), for exact
    /// comparisons; for blocks, each byte. Allocates.
    pub fn bits(&self) -> Vec<u32> {
        match self {
            HostSlice::F32(v) => v.iter().map(|x| x.to_bits()).collect(),
            HostSlice::F16(v) => v.iter().map(|x| u32::from(x.to_bits())).collect(),
            HostSlice::BF16(v) => v.iter().map(|x| u32::from(x.to_bits())).collect(),
            HostSlice::Blocks(b) => b.bytes().iter().map(|&x| u32::from(x)).collect(),
        }
    }

    /// The values in `range`, or `None` past the end (or for quantized
    /// blocks, which are not cut). Free.
    pub fn slice(&self, range: std::ops::Range<usize>) -> Option<HostSlice<'a>> {
        match *self {
            HostSlice::F32(s) => s.get(range).map(HostSlice::F32),
            HostSlice::F16(s) => s.get(range).map(HostSlice::F16),
            HostSlice::BF16(s) => s.get(range).map(HostSlice::BF16),
            HostSlice::Blocks(_) => None,
        }
    }

    /// The blocks, if the values are quantized. Free.
    pub fn blocks(&self) -> Option<Blocks<'a>> {
        match *self {
            HostSlice::Blocks(b) => Some(b),
            _ => None,
        }
    }

    /// An owned copy.
    pub fn to_vec(&self) -> HostVec {
        match self {
            HostSlice::F32(v) => HostVec::F32(v.to_vec()),
            HostSlice::F16(v) => HostVec::F16(v.to_vec()),
            HostSlice::BF16(v) => HostVec::BF16(v.to_vec()),
            HostSlice::Blocks(b) => HostVec::Blocks(b.dtype(), b.bytes().to_vec()),
        }
    }
}

impl<'a, T: Element> From<&'a [T]> for HostSlice<'a> {
    fn from(s: &'a [T]) -> Self {
        T::host(s)
    }
}

impl<'a, T: Element> From<&'a Vec<T>> for HostSlice<'a> {
    fn from(s: &'a Vec<T>) -> Self {
        T::host(s)
    }
}

impl<'a> HostSliceMut<'a> {
    /// The dtype of the values.
    pub fn dtype(&self) -> DType {
        match self {
            HostSliceMut::F32(_) => DType::F32,
            HostSliceMut::F16(_) => DType::F16,
            HostSliceMut::BF16(_) => DType::BF16,
            HostSliceMut::Blocks(b) => b.dtype(),
        }
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            HostSliceMut::F32(s) => s.len(),
            HostSliceMut::F16(s) => s.len(),
            HostSliceMut::BF16(s) => s.len(),
            HostSliceMut::Blocks(b) => b.len(),
        }
    }

    /// Whether there are no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its length and dtype.
    pub fn operand(&self) -> Operand {
        Operand { len: self.len(), dtype: self.dtype() }
    }

    /// A shorter-lived view of the same values, so this one stays usable.
    pub fn reborrow(&mut self) -> HostSliceMut<'_> {
        match self {
            HostSliceMut::F32(s) => HostSliceMut::F32(s),
            HostSliceMut::F16(s) => HostSliceMut::F16(s),
            HostSliceMut::BF16(s) => HostSliceMut::BF16(s),
            HostSliceMut::Blocks(b) => HostSliceMut::Blocks(b.reborrow()),
        }
    }

    /// The values in `range`, mutably, or `None` past the end (or for
    /// quantized blocks). Free.
    pub fn slice_mut(&mut self, range: std::ops::Range<usize>) -> Option<HostSliceMut<'_>> {
        match self {
            HostSliceMut::F32(s) => s.get_mut(range).map(HostSliceMut::F32),
            HostSliceMut::F16(s) => s.get_mut(range).map(HostSliceMut::F16),
            HostSliceMut::BF16(s) => s.get_mut(range).map(HostSliceMut::BF16),
            HostSliceMut::Blocks(_) => None,
        }
    }

    /// A read-only view of the same values.
    pub fn as_slice(&self) -> HostSlice<'_> {
        match self {
            HostSliceMut::F32(s) => HostSlice::F32(s),
            HostSliceMut::F16(s) => HostSlice::F16(s),
            HostSliceMut::BF16(s) => HostSlice::BF16(s),
            HostSliceMut::Blocks(b) => HostSlice::Blocks(b.as_blocks()),
        }
    }

    /// The values as bytes, e.g. for a device download. Free.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        match self {
            HostSliceMut::F32(s) => bytemuck::cast_slice_mut(s),
            HostSliceMut::F16(s) => bytemuck::cast_slice_mut(s),
            HostSliceMut::BF16(s) => bytemuck::cast_slice_mut(s),
            HostSliceMut::Blocks(b) => b.bytes_mut(),
        }
    }

    /// The typed slice, if the values are `T`s. Free.
    pub fn get_mut<T: Element>(&mut self) -> Option<&mut [T]> {
        T::from_host_mut(self.reborrow())
    }

    /// The typed slice for the whole borrow, if the values are `T`s.
    pub fn into_typed<T: Element>(self) -> Option<&'a mut [T]> {
        T::from_host_mut(self)
    }

    /// Writes `values` (f32) into the view, each rounded to its dtype
    /// (blocks: quantized as ggml's reference quantizers do, which needs
    /// exactly [`HostSliceMut::len`] values, else nothing is written).
    /// `values.len()` must equal [`HostSliceMut::len`]; extra values are ignored.
    pub fn store_f32(&mut self, values: &[f32]) {
        match self {
            HostSliceMut::F32(s) => s.iter_mut().zip(values).for_each(|(o, &v)| *o = v),
            HostSliceMut::F16(s) => s.iter_mut().zip(values).for_each(|(o, &v)| *o = f16::from_f32(v)),
            HostSliceMut::BF16(s) => s.iter_mut().zip(values).for_each(|(o, &v)| *o = bf16::from_f32(v)),
            HostSliceMut::Blocks(b) => {
                let format = b.format();
                if let Some(v) = values.get(..b.len()) {
                    let _ = format.quantize(v, b.bytes_mut());
                }
            }
        }
    }
}

impl<'a, T: Element> From<&'a mut [T]> for HostSliceMut<'a> {
    fn from(s: &'a mut [T]) -> Self {
        T::host_mut(s)
    }
}

impl<'a, T: Element> From<&'a mut Vec<T>> for HostSliceMut<'a> {
    fn from(s: &'a mut Vec<T>) -> Self {
        T::host_mut(s)
    }
}

impl HostVec {
    /// `len` zeros of `dtype` (for a quantized dtype, zero bytes: blocks of
    /// zeros, `len` rounded up to whole blocks). Aborts like `vec!` when the
    /// host has no memory for it; meant for test and example sizes.
    pub fn zeros(dtype: DType, len: usize) -> HostVec {
        match dtype {
            DType::F16 => HostVec::F16(vec![f16::ZERO; len]),
            DType::BF16 => HostVec::BF16(vec![bf16::ZERO; len]),
            d if d.is_quantized() => HostVec::Blocks(d, vec![0; len.div_ceil(d.block_values()) * d.size_in_bytes()]),
            _ => HostVec::F32(vec![0.0; len]),
        }
    }

    /// Owned blocks of `dtype`, checked as [`Blocks::new`] checks them.
    pub fn blocks(dtype: DType, bytes: Vec<u8>) -> Result<HostVec> {
        check_blocks(dtype, bytes.len())?;
        Ok(HostVec::Blocks(dtype, bytes))
    }

    /// `values` rounded to `dtype` (nearest, ties to even; a quantized dtype
    /// quantizes as ggml's reference does, the values padded with zeros to
    /// whole blocks).
    pub fn from_f32(dtype: DType, values: &[f32]) -> HostVec {
        match dtype {
            DType::F16 => HostVec::F16(values.iter().map(|&v| f16::from_f32(v)).collect()),
            DType::BF16 => HostVec::BF16(values.iter().map(|&v| bf16::from_f32(v)).collect()),
            d if d.is_quantized() => {
                let per = d.block_values();
                let mut padded = values.to_vec();
                padded.resize(values.len().div_ceil(per) * per, 0.0);
                let mut v = HostVec::zeros(d, padded.len());
                v.as_mut().store_f32(&padded);
                v
            }
            _ => HostVec::F32(values.to_vec()),
        }
    }

    /// `parts` one after the other, as one vector (rows of weights stacked:
    /// whole quantized rows concatenate as their blocks); `None` when their
    /// dtypes differ or there are none. Costs one copy of every part.
    pub fn concat(parts: &[HostVec]) -> Option<HostVec> {
        let first = parts.first()?;
        if parts.iter().any(|p| p.dtype() != first.dtype()) {
            return None;
        }
        fn join<T: Element>(parts: &[HostVec]) -> Vec<T> {
            parts.iter().filter_map(|p| p.as_slice().get::<T>()).flatten().copied().collect()
        }
        Some(match first {
            HostVec::F32(_) => HostVec::F32(join(parts)),
            HostVec::F16(_) => HostVec::F16(join(parts)),
            HostVec::BF16(_) => HostVec::BF16(join(parts)),
            HostVec::Blocks(d, _) => {
                HostVec::Blocks(*d, parts.iter().flat_map(|p| p.as_slice().as_bytes().iter().copied()).collect())
            }
        })
    }

    /// `len` copies of the bit pattern `bits` in `dtype` (its low 16 bits for
    /// the 2-byte types, its low byte in every byte of quantized blocks), e.g.
    /// a NaN with a payload to poison an output with.
    pub fn filled_bits(dtype: DType, len: usize, bits: u32) -> HostVec {
        match dtype {
            DType::F16 => HostVec::F16(vec![f16::from_bits(bits as u16); len]),
            DType::BF16 => HostVec::BF16(vec![bf16::from_bits(bits as u16); len]),
            d if d.is_quantized() => {
                HostVec::Blocks(d, vec![bits as u8; len.div_ceil(d.block_values()) * d.size_in_bytes()])
            }
            _ => HostVec::F32(vec![f32::from_bits(bits); len]),
        }
    }

    /// The dtype of the values.
    pub fn dtype(&self) -> DType {
        self.as_slice().dtype()
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// Whether there are no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A borrowed view.
    pub fn as_slice(&self) -> HostSlice<'_> {
        match self {
            HostVec::F32(v) => HostSlice::F32(v),
            HostVec::F16(v) => HostSlice::F16(v),
            HostVec::BF16(v) => HostSlice::BF16(v),
            HostVec::Blocks(d, v) => HostSlice::Blocks(Blocks { dtype: *d, bytes: v }),
        }
    }

    /// A mutable view.
    pub fn as_mut(&mut self) -> HostSliceMut<'_> {
        match self {
            HostVec::F32(v) => HostSliceMut::F32(v),
            HostVec::F16(v) => HostSliceMut::F16(v),
            HostVec::BF16(v) => HostSliceMut::BF16(v),
            HostVec::Blocks(d, v) => HostSliceMut::Blocks(BlocksMut { dtype: *d, bytes: v }),
        }
    }

    /// The values widened to `f64` (exact).
    pub fn to_f64(&self) -> Vec<f64> {
        self.as_slice().to_f64()
    }

    /// The values widened to `f32` (exact).
    pub fn to_f32(&self) -> Vec<f32> {
        self.as_slice().to_f32()
    }

    /// Each value's bits (zero-extended for the 2-byte types), for exact comparisons.
    pub fn bits(&self) -> Vec<u32> {
        self.as_slice().bits()
    }
}

impl<T: Element> From<Vec<T>> for HostVec {
    fn from(v: Vec<T>) -> Self {
        T::host_vec(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_know_their_dtype_and_refuse_the_wrong_type() {
        let mut v = vec![f16::from_f32(1.0), f16::from_f32(-0.5), f16::from_f32(3.0)];
        let s = HostSlice::from(&v);
        assert_eq!(s.operand(), Operand { len: 3, dtype: DType::F16 });
        assert_eq!(s.as_bytes(), [0x00, 0x3c, 0x00, 0xb8, 0x00, 0x42]);
        assert!(s.get::<bf16>().is_none() && s.get::<f32>().is_none());
        let mut m = HostSliceMut::from(&mut v);
        m.store_f32(&[2.0, 65520.0, f32::NAN]);
        assert!(m.get_mut::<f32>().is_none());
        let typed = m.into_typed::<f16>().unwrap();
        assert_eq!(typed[0], f16::from_f32(2.0));
        assert!(typed[1].is_infinite() && typed[2].is_nan());
    }

    #[test]
    fn owned_vectors_round_on_entry_and_expose_bits() {
        let v = HostVec::from_f32(DType::BF16, &[1.0 + 1.0 / 256.0, -3.0]);
        assert_eq!(v.to_f32(), [1.0, -3.0]);
        assert_eq!(v.bits(), [0x3f80, 0xc040]);
        let p = HostVec::filled_bits(DType::F16, 2, 0x7e5a);
        assert!(p.to_f32().iter().all(|x| x.is_nan()));
        assert_eq!(HostVec::zeros(DType::F32, 2), HostVec::from(vec![0.0f32, 0.0]));
    }

    #[test]
    fn blocks_are_checked_once_and_count_values() {
        assert!(Blocks::new(DType::F32, &[0; 8]).is_err());
        assert!(Blocks::new(DType::Q8_0, &[0; 35]).is_err());
        let x: Vec<f32> = (0..64).map(|i| i as f32 / 8.0 - 4.0).collect();
        let v = HostVec::from_f32(DType::Q8_0, &x);
        let s = v.as_slice();
        assert_eq!((s.dtype(), s.len(), s.as_bytes().len()), (DType::Q8_0, 64, 68));
        assert!(s.get::<f32>().is_none() && s.blocks().is_some());
        let back = s.to_f32();
        assert!(x.iter().zip(&back).all(|(a, b)| (a - b).abs() <= 4.0 / 127.0));
        assert_eq!(HostVec::blocks(DType::Q8_0, s.as_bytes().to_vec()).unwrap(), v);
    }
}
