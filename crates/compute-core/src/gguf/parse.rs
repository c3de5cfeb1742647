//! The parser: header, metadata and tensor infos from any byte [`Source`],
//! every length and count checked against the bytes that remain before
//! anything is allocated.

use std::collections::HashMap;
use std::io::Read;

use super::{
    Array, GgmlType, GgufError, GgufHeader, MAX_ARRAY_DEPTH, MAX_DIMS, MAX_STRING_LEN, TensorInfo, Value, ValueType,
};
use crate::gguf::ggml_type::TensorSizeError;

/// The alignment of the data section when `general.alignment` is absent.
pub(super) const DEFAULT_ALIGNMENT: u32 = 32;

/// The fewest bytes one tensor info takes: name length, `n_dims`, type and offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;
/// The fewest bytes one metadata pair takes: key length, value type and a one-byte value.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;

/// Bytes read in order from a file of known length.
pub(super) trait Source {
    /// Bytes consumed so far (the offset of the next byte in the file).
    fn pos(&self) -> u64;
    /// The file's length.
    fn len(&self) -> u64;
    /// Fills `buf` with the next bytes. The parser has checked that they exist.
    fn read_exact(&mut self, buf: &mut [u8]) -> std::io::Result<()>;
}

/// A file held in memory.
pub(super) struct SliceSource<'a> {
    pub(super) bytes: &'a [u8],
    pub(super) pos: usize,
}

impl Source for SliceSource<'_> {
    fn pos(&self) -> u64 {
        self.pos as u64
    }
    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }
    fn read_exact(&mut self, buf: &mut [u8]) -> std::io::Result<()> {
        let end = self.pos.checked_add(buf.len());
        match end.and_then(|end| self.bytes.get(self.pos..end)) {
            Some(src) => {
                buf.copy_from_slice(src);
                self.pos += buf.len();
                Ok(())
            }
            None => Err(std::io::ErrorKind::UnexpectedEof.into()),
        }
    }
}

/// A reader (a buffered file) whose length is known up front.
pub(super) struct ReaderSource<R> {
    pub(super) reader: R,
    pub(super) pos: u64,
    pub(super) len: u64,
}

impl<R: Read> Source for ReaderSource<R> {
    fn pos(&self) -> u64 {
        self.pos
    }
    fn len(&self) -> u64 {
        self.len
    }
    fn read_exact(&mut self, buf: &mut [u8]) -> std::io::Result<()> {
        self.reader.read_exact(buf)?;
        self.pos += buf.len() as u64;
        Ok(())
    }
}

struct Parser<S> {
    src: S,
}

impl<S: Source> Parser<S> {
    fn pos(&self) -> u64 {
        self.src.pos()
    }

    fn remaining(&self) -> u64 {
        self.src.len().saturating_sub(self.src.pos())
    }

    fn fill(&mut self, buf: &mut [u8], what: &'static str) -> Result<(), GgufError> {
        let offset = self.pos();
        let available = self.remaining();
        if buf.len() as u64 > available {
            return Err(GgufError::Truncated { what, offset, needed: buf.len() as u64, available });
        }
        self.src.read_exact(buf).map_err(|source| GgufError::Io { offset, source })
    }

    fn take<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], GgufError> {
        let mut b = [0u8; N];
        self.fill(&mut b, what)?;
        Ok(b)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, GgufError> {
        self.take(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, GgufError> {
        self.take(what).map(u64::from_le_bytes)
    }

    /// A `u64` count of entries of at least `min_bytes` each, refused when
    /// they cannot fit in what remains after it.
    fn count(&mut self, what: &'static str, min_bytes: u64) -> Result<u64, GgufError> {
        let offset = self.pos();
        let count = self.u64(what)?;
        let available = self.remaining();
        if count.checked_mul(min_bytes).is_none_or(|need| need > available) {
            return Err(GgufError::CountTooLarge { what, offset, count, min_bytes, available });
        }
        Ok(count)
    }

    /// `n` bytes (already checked to remain) as a vector.
    fn bytes(&mut self, n: u64, what: &'static str) -> Result<Vec<u8>, GgufError> {
        let len = usize::try_from(n).map_err(|_| GgufError::TooLargeForPlatform { what, bytes: n })?;
        let available = self.remaining();
        if n > available {
            return Err(GgufError::Truncated { what, offset: self.pos(), needed: n, available });
        }
        let mut v = vec![0u8; len];
        self.fill(&mut v, what)?;
        Ok(v)
    }

    fn string(&mut self, what: &'static str) -> Result<String, GgufError> {
        let offset = self.pos();
        let len = self.u64(what)?;
        if len > MAX_STRING_LEN {
            return Err(GgufError::StringTooLong { what, offset, len, max: MAX_STRING_LEN });
        }
        let available = self.remaining();
        if len > available {
            return Err(GgufError::CountTooLarge { what, offset, count: len, min_bytes: 1, available });
        }
        let bytes = self.bytes(len, what)?;
        String::from_utf8(bytes).map_err(|_| GgufError::InvalidUtf8 { what, offset: offset + 8 })
    }

    fn value_type(&mut self) -> Result<ValueType, GgufError> {
        let offset = self.pos();
        let id = self.u32("metadata value type")?;
        ValueType::from_id(id).ok_or(GgufError::InvalidValueType { id, offset })
    }

    fn bool(&mut self) -> Result<bool, GgufError> {
        let offset = self.pos();
        match self.take::<1>("bool")?[0] {
            0 => Ok(false),
            1 => Ok(true),
            value => Err(GgufError::InvalidBool { value, offset }),
        }
    }

    /// One value of type `ty`; `depth` is the number of arrays around it.
    fn value(&mut self, ty: ValueType, depth: usize) -> Result<Value, GgufError> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.take::<1>("u8")?[0]),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.take("i8")?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.take("u16")?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.take("i16")?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.take("u32")?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.take("i32")?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.take("f32")?)),
            ValueType::Bool => Value::Bool(self.bool()?),
            ValueType::String => Value::String(self.string("string value")?),
            ValueType::Array => Value::Array(self.array(depth + 1)?),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.take("u64")?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.take("i64")?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.take("f64")?)),
        })
    }

    /// `n` fixed-size elements of `N` bytes, read in one piece (the count
    /// was checked to fit in what remains).
    fn fixed<T, const N: usize>(
        &mut self,
        n: u64,
        what: &'static str,
        f: fn([u8; N]) -> T,
    ) -> Result<Vec<T>, GgufError> {
        let bytes = self.bytes(n.saturating_mul(N as u64), what)?;
        Ok(bytes.as_chunks::<N>().0.iter().map(|c| f(*c)).collect())
    }

    /// An array (element type, count, elements) nested `depth` deep.
    fn array(&mut self, depth: usize) -> Result<Array, GgufError> {
        let offset = self.pos();
        if depth > MAX_ARRAY_DEPTH {
            return Err(GgufError::NestingTooDeep { offset, max: MAX_ARRAY_DEPTH });
        }
        let ty = self.value_type()?;
        let n = self.count("array length", ty.min_encoded_size())?;
        Ok(match ty {
            ValueType::U8 => Array::U8(self.bytes(n, "u8 array")?),
            ValueType::I8 => Array::I8(self.fixed(n, "i8 array", i8::from_le_bytes)?),
            ValueType::U16 => Array::U16(self.fixed(n, "u16 array", u16::from_le_bytes)?),
            ValueType::I16 => Array::I16(self.fixed(n, "i16 array", i16::from_le_bytes)?),
            ValueType::U32 => Array::U32(self.fixed(n, "u32 array", u32::from_le_bytes)?),
            ValueType::I32 => Array::I32(self.fixed(n, "i32 array", i32::from_le_bytes)?),
            ValueType::F32 => Array::F32(self.fixed(n, "f32 array", f32::from_le_bytes)?),
            ValueType::U64 => Array::U64(self.fixed(n, "u64 array", u64::from_le_bytes)?),
            ValueType::I64 => Array::I64(self.fixed(n, "i64 array", i64::from_le_bytes)?),
            ValueType::F64 => Array::F64(self.fixed(n, "f64 array", f64::from_le_bytes)?),
            ValueType::Bool => {
                let start = self.pos();
                let bytes = self.bytes(n, "bool array")?;
                let mut v = Vec::with_capacity(bytes.len());
                for (i, &b) in bytes.iter().enumerate() {
                    match b {
                        0 => v.push(false),
                        1 => v.push(true),
                        value => return Err(GgufError::InvalidBool { value, offset: start + i as u64 }),
                    }
                }
                Array::Bool(v)
            }
            // Strings and arrays grow as they are read, so their memory
            // follows the bytes actually present, not the count.
            ValueType::String => {
                let mut v = Vec::new();
                for _ in 0..n {
                    v.push(self.string("string in array")?);
                }
                Array::String(v)
            }
            ValueType::Array => {
                let mut v = Vec::new();
                for _ in 0..n {
                    v.push(self.array(depth + 1)?);
                }
                Array::Array(v)
            }
        })
    }

    fn tensor_info(&mut self, alignment: u64) -> Result<TensorInfo, GgufError> {
        let info_offset = self.pos();
        let name = self.string("tensor name")?;
        let n_dims = self.u32("tensor dimension count")?;
        if n_dims > MAX_DIMS {
            return Err(GgufError::TooManyDims { tensor: name, offset: info_offset, n_dims, max: MAX_DIMS });
        }
        let mut dims = Vec::new();
        for _ in 0..n_dims {
            dims.push(self.u64("tensor dimension")?);
        }
        let ggml_type = GgmlType::from_id(self.u32("tensor type")?);
        let offset = self.u64("tensor data offset")?;

        let n_elements = dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
        let n_elements = match n_elements {
            Some(n) if dims.iter().all(|&d| d <= i64::MAX as u64) && n <= i64::MAX as u64 => n,
            _ => return Err(GgufError::ShapeOverflow { tensor: name, offset: info_offset, dims }),
        };
        let byte_len = match ggml_type.tensor_bytes(&dims) {
            Ok(bytes) => Some(bytes),
            Err(TensorSizeError::UnknownType) => None,
            Err(TensorSizeError::Overflow) => {
                return Err(GgufError::ShapeOverflow { tensor: name, offset: info_offset, dims });
            }
            Err(TensorSizeError::NotBlockMultiple { ne0, block_values }) => {
                return Err(GgufError::NotBlockMultiple {
                    tensor: name,
                    offset: info_offset,
                    ggml_type,
                    ne0,
                    block_values,
                });
            }
        };
        if offset % alignment != 0 {
            return Err(GgufError::MisalignedOffset { tensor: name, data_offset: offset, alignment });
        }
        Ok(TensorInfo {
            name,
            dims,
            ggml_type,
            offset,
            file_offset: 0,
            byte_len: byte_len.unwrap_or(0),
            size_known: byte_len.is_some(),
            n_elements,
            info_offset,
        })
    }
}

/// Reads everything before the data section and checks every tensor's
/// byte range against the file's length.
pub(super) fn parse<S: Source>(src: S) -> Result<GgufHeader, GgufError> {
    let mut p = Parser { src };
    let magic = p.take::<4>("magic")?;
    if &magic != b"GGUF" {
        return Err(GgufError::BadMagic { found: magic });
    }
    let version = p.u32("version")?;
    match version {
        2 | 3 => {}
        v if v > 0xFFFF && v & 0xFFFF == 0 => return Err(GgufError::BigEndian { version: v }),
        v => return Err(GgufError::UnsupportedVersion { version: v }),
    }
    let tensor_count = p.count("tensor count", MIN_TENSOR_INFO_BYTES)?;
    let kv_count = p.count("metadata key/value count", MIN_KV_BYTES)?;

    let mut metadata: Vec<(String, Value)> = Vec::new();
    let mut key_index = HashMap::new();
    for _ in 0..kv_count {
        let offset = p.pos();
        let key = p.string("metadata key")?;
        if key_index.contains_key(&key) {
            return Err(GgufError::DuplicateKey { key, offset });
        }
        let ty = p.value_type()?;
        let value = p.value(ty, 0)?;
        key_index.insert(key.clone(), metadata.len());
        metadata.push((key, value));
    }

    let alignment = match key_index.get(super::ALIGNMENT_KEY).map(|&i| &metadata[i].1) {
        None => DEFAULT_ALIGNMENT,
        Some(Value::U32(a)) if a.is_power_of_two() => *a,
        Some(Value::U32(a)) => return Err(GgufError::BadAlignment { alignment: *a }),
        Some(other) => return Err(GgufError::AlignmentType { found: other.value_type() }),
    };
    let alignment = u64::from(alignment);

    let mut tensors: Vec<TensorInfo> = Vec::new();
    let mut tensor_index = HashMap::new();
    for _ in 0..tensor_count {
        let info = p.tensor_info(alignment)?;
        if tensor_index.contains_key(&info.name) {
            return Err(GgufError::DuplicateTensor { name: info.name, offset: info.info_offset });
        }
        tensor_index.insert(info.name.clone(), tensors.len());
        tensors.push(info);
    }

    let file_len = p.src.len();
    let end_of_infos = p.pos();
    let data_offset = end_of_infos.checked_next_multiple_of(alignment);
    let data_offset = match data_offset {
        Some(d) if d <= file_len || tensors.is_empty() => d,
        _ => {
            return Err(GgufError::DataPastEnd { data_offset: data_offset.unwrap_or(u64::MAX), file_len });
        }
    };

    // Tensors of an unknown type span up to the next tensor's start (or the
    // end of the file): find those starts once, sorted.
    let mut starts: Vec<u64> = Vec::new();
    for t in &mut tensors {
        let start = data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.byte_len));
        match (start, end) {
            (Some(start), Some(end)) if end <= file_len => {
                t.file_offset = start;
                starts.push(start);
            }
            _ => {
                return Err(GgufError::TensorOutOfBounds {
                    tensor: t.name.clone(),
                    start: start.unwrap_or(u64::MAX),
                    end: end.unwrap_or(u64::MAX),
                    file_len,
                });
            }
        }
    }
    if tensors.iter().any(|t| !t.size_known) {
        starts.sort_unstable();
        for t in tensors.iter_mut().filter(|t| !t.size_known) {
            let next = starts.partition_point(|&s| s <= t.file_offset);
            let end = starts.get(next).copied().unwrap_or(file_len);
            t.byte_len = end.saturating_sub(t.file_offset);
        }
    }

    Ok(GgufHeader { version, alignment, metadata, key_index, tensors, tensor_index, data_offset, file_len })
}
