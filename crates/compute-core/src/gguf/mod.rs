//! GGUF: the file format of ggml and llama.cpp for model weights (header,
//! metadata key/values, tensor infos, then the aligned tensor data), read
//! into [`GgufHeader`] with every field checked.
//!
//! Two ways in:
//!
//! - [`Gguf::parse`] reads a file already in memory (`&[u8]`): its tensors
//!   are borrowed slices of it, free.
//! - [`GgufFile::open`] reads only the part before the data section from a
//!   path (through a 64 KiB buffer), and then one tensor's bytes at a time
//!   on request ([`GgufFile::read_tensor_bytes`]): a seek and a read into a
//!   new `Vec`.
//!
//! There is no memory mapping: mapping a file needs either a new dependency
//! (`memmap2`) or `unsafe` calls to the OS, and this crate takes neither. The
//! cost is one copy of each tensor read from a path, and its memory, which a
//! mapping would share with the page cache; a caller that wants the whole
//! file resident can `std::fs::read` it and use [`Gguf::parse`].
//!
//! Versions 2 and 3 (little-endian) are read; they have the same layout.
//! Version 1 (32-bit counts, obsolete) and big-endian files are refused.
//! `general.alignment` (a `u32`, a power of two; 32 when absent) sets where
//! the data section starts and what every tensor offset must be a multiple of.
//!
//! Malformed input is a [`GgufError`] naming the field and its byte offset,
//! never a panic: truncation anywhere, a bad magic or version, counts and
//! lengths that cannot fit in the bytes that remain (checked before anything
//! is allocated, so a header claiming 2⁶⁰ tensors fails at once), invalid
//! UTF-8, unknown value types, bools other than 0 or 1, arrays nested past
//! [`MAX_ARRAY_DEPTH`], more than [`MAX_DIMS`] dimensions, sizes that
//! overflow, rows that are not whole blocks, misaligned offsets, tensors
//! ending past the end of the file, duplicate keys and duplicate tensor
//! names. Tensors may overlap. An unknown tensor type is kept as
//! [`GgmlType::Other`], readable as raw bytes.
//!
//! ```
//! use compute_core::gguf::{GgmlType, Gguf};
//! // A version 3 file with one metadata pair and one 2×3 F32 tensor.
//! let mut f = Vec::new();
//! f.extend(b"GGUF");
//! f.extend(3u32.to_le_bytes());
//! f.extend(1u64.to_le_bytes()); // tensors
//! f.extend(1u64.to_le_bytes()); // metadata pairs
//! f.extend(12u64.to_le_bytes());
//! f.extend(b"general.name");
//! f.extend(8u32.to_le_bytes()); // string
//! f.extend(4u64.to_le_bytes());
//! f.extend(b"tiny");
//! f.extend(1u64.to_le_bytes());
//! f.extend(b"w");
//! f.extend(2u32.to_le_bytes()); // n_dims
//! f.extend(3u64.to_le_bytes()); // ne0, the row length
//! f.extend(2u64.to_le_bytes()); // ne1, the row count
//! f.extend(0u32.to_le_bytes()); // F32
//! f.extend(0u64.to_le_bytes()); // offset in the data section
//! f.resize(f.len().next_multiple_of(32), 0);
//! for x in [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0] {
//!     f.extend(x.to_le_bytes());
//! }
//!
//! let g = Gguf::parse(&f)?;
//! assert_eq!(g.get_str("general.name"), Some("tiny"));
//! let w = g.tensor("w").unwrap();
//! assert_eq!((w.dims(), w.shape(), w.ggml_type(), w.byte_len()), (&[3, 2][..], vec![2, 3], GgmlType::F32, 24));
//! assert_eq!(g.tensor_host("w")?.to_f32(), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
//! // One byte short of the data: a typed error, not a panic.
//! assert!(Gguf::parse(&f[..f.len() - 1]).is_err());
//! # Ok::<(), compute_core::gguf::GgufError>(())
//! ```

mod error;
mod ggml_type;
mod parse;
mod value;

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::ops::{Deref, Range};
use std::path::{Path, PathBuf};

use crate::dtype::{bf16, f16};
use crate::host::{Blocks, HostVec};

pub use error::GgufError;
pub use ggml_type::{GgmlType, TensorSizeError};
pub use value::{Array, Value, ValueType};

/// The most dimensions a tensor may have. ggml uses 4; the spec says that
/// may grow, so a few more are read, and more than this is refused as absurd.
pub const MAX_DIMS: u32 = 8;

/// The deepest arrays may nest (an array of arrays is depth 2). Deeper is
/// refused, so a crafted file cannot exhaust the stack.
pub const MAX_ARRAY_DEPTH: usize = 16;

/// The longest string read, in bytes (1 GiB, ggml's own limit).
pub const MAX_STRING_LEN: u64 = 1 << 30;

/// The metadata key that sets the data alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";

/// Where one tensor is and what it holds, as its info in the file says
/// (checked: its bytes lie inside the file).
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    name: String,
    dims: Vec<u64>,
    ggml_type: GgmlType,
    offset: u64,
    file_offset: u64,
    byte_len: u64,
    size_known: bool,
    n_elements: u64,
    info_offset: u64,
}

impl TensorInfo {
    /// The tensor's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Dimensions as ggml lists them: `ne0` first, the innermost (the row
    /// length). Free.
    pub fn dims(&self) -> &[u64] {
        &self.dims
    }

    /// Dimensions outermost first (row-major, as compute-core and PyTorch
    /// write shapes): [`TensorInfo::dims`] reversed. Allocates a small `Vec`.
    pub fn shape(&self) -> Vec<u64> {
        self.dims.iter().rev().copied().collect()
    }

    /// Number of values (1 for a tensor with no dimensions).
    pub fn n_elements(&self) -> u64 {
        self.n_elements
    }

    /// The element type.
    pub fn ggml_type(&self) -> GgmlType {
        self.ggml_type
    }

    /// Offset of its bytes from the start of the data section, as stored.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Offset of its bytes from the start of the file.
    pub fn file_offset(&self) -> u64 {
        self.file_offset
    }

    /// Its length in bytes: rows × blocks per row × block bytes. For a type
    /// this version does not know ([`GgmlType::Other`]), the span from its
    /// start to the next tensor's start or the end of the file, an upper
    /// bound that includes padding (see [`TensorInfo::size_is_exact`]).
    pub fn byte_len(&self) -> u64 {
        self.byte_len
    }

    /// Whether [`TensorInfo::byte_len`] is computed from the type (true for
    /// every named [`GgmlType`]) rather than bounded by the next tensor.
    pub fn size_is_exact(&self) -> bool {
        self.size_known
    }

    /// Its bytes' range in the file.
    pub fn byte_range(&self) -> Range<u64> {
        self.file_offset..self.file_offset + self.byte_len
    }

    /// Where its info starts in the file (for messages).
    pub fn info_offset(&self) -> u64 {
        self.info_offset
    }
}

/// Everything in a GGUF file before its data section: version, metadata and
/// tensor infos, with the data section's position. Read by [`Gguf::parse`]
/// or [`GgufFile::open`], both of which dereference to it.
///
/// Lookups by key or tensor name are hash lookups; accessors are free.
#[derive(Clone, Debug)]
pub struct GgufHeader {
    version: u32,
    alignment: u64,
    metadata: Vec<(String, Value)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    data_offset: u64,
    file_len: u64,
}

macro_rules! typed_getters {
    ($( $(#[$doc:meta])* $fn:ident, $as:ident, $t:ty; )*) => {
        $(
            $(#[$doc])*
            pub fn $fn(&self, key: &str) -> Option<$t> {
                self.get(key).and_then(|v| v.$as())
            }
        )*
    };
}

impl GgufHeader {
    /// The format version: 2 or 3.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The data alignment in bytes (`general.alignment`, or 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Where the data section starts in the file (a multiple of the alignment).
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// The file's length in bytes, as parsed.
    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    /// Every metadata pair, in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.key_index.get(key).map(|&i| &self.metadata[i].1)
    }

    typed_getters! {
        /// The value of `key` if it is a `u8`.
        get_u8, as_u8, u8;
        /// The value of `key` if it is an `i8`.
        get_i8, as_i8, i8;
        /// The value of `key` if it is a `u16`.
        get_u16, as_u16, u16;
        /// The value of `key` if it is an `i16`.
        get_i16, as_i16, i16;
        /// The value of `key` if it is a `u32`.
        get_u32, as_u32, u32;
        /// The value of `key` if it is an `i32`.
        get_i32, as_i32, i32;
        /// The value of `key` if it is an `f32`.
        get_f32, as_f32, f32;
        /// The value of `key` if it is a `bool`.
        get_bool, as_bool, bool;
        /// The value of `key` if it is a `u64`.
        get_u64, as_u64, u64;
        /// The value of `key` if it is an `i64`.
        get_i64, as_i64, i64;
        /// The value of `key` if it is an `f64`.
        get_f64, as_f64, f64;
        /// The value of `key` if it is any integer type and not negative,
        /// widened (counts may be stored as `u32` or `u64`).
        get_uint, to_u64, u64;
    }

    /// The value of `key` if it is a string.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }

    /// The value of `key` if it is an array.
    pub fn get_array(&self, key: &str) -> Option<&Array> {
        self.get(key).and_then(Value::as_array)
    }

    /// Every tensor's info, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The info of the tensor named `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    fn require(&self, name: &str) -> Result<&TensorInfo, GgufError> {
        self.tensor(name).ok_or_else(|| GgufError::NoSuchTensor { name: name.to_string() })
    }
}

/// A tensor's little-endian bytes as host values, for the types a
/// [`HostVec`] holds. One pass over the bytes, one allocation.
fn host_vec(info: &TensorInfo, bytes: &[u8]) -> Result<HostVec, GgufError> {
    Ok(match info.ggml_type {
        GgmlType::F32 => HostVec::F32(bytes.as_chunks::<4>().0.iter().map(|c| f32::from_le_bytes(*c)).collect()),
        GgmlType::F16 => {
            HostVec::F16(bytes.as_chunks::<2>().0.iter().map(|c| f16::from_bits(u16::from_le_bytes(*c))).collect())
        }
        GgmlType::BF16 => {
            HostVec::BF16(bytes.as_chunks::<2>().0.iter().map(|c| bf16::from_bits(u16::from_le_bytes(*c))).collect())
        }
        ggml_type => match ggml_type.dtype() {
            // Whole blocks: the parser checked the size against the dims.
            Some(dtype) => HostVec::blocks(dtype, bytes.to_vec())
                .map_err(|_| GgufError::NotFloat { tensor: info.name.clone(), ggml_type })?,
            None => return Err(GgufError::NotFloat { tensor: info.name.clone(), ggml_type }),
        },
    })
}

/// A GGUF file held in memory, parsed: its tensors are slices of the bytes.
/// Dereferences to [`GgufHeader`] for metadata and tensor infos.
#[derive(Clone, Debug)]
pub struct Gguf<'a> {
    header: GgufHeader,
    bytes: &'a [u8],
}

impl<'a> Gguf<'a> {
    /// Parses the whole file in `bytes`. Reads the header, metadata and
    /// tensor infos (copying keys, names and values into owned memory, no
    /// more than a few times their size in the file) and checks every
    /// tensor's range; tensor bytes are not touched. Fails with a
    /// [`GgufError`] on anything malformed; never panics.
    pub fn parse(bytes: &'a [u8]) -> Result<Gguf<'a>, GgufError> {
        let header = parse::parse(parse::SliceSource { bytes, pos: 0 })?;
        Ok(Gguf { header, bytes })
    }

    /// The parsed header, metadata and tensor infos.
    pub fn header(&self) -> &GgufHeader {
        &self.header
    }

    /// The whole file.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The bytes of the tensor named `name`. Free (a slice of the file).
    pub fn tensor_bytes(&self, name: &str) -> Result<&'a [u8], GgufError> {
        let info = self.header.require(name)?;
        self.bytes_of(info)
    }

    /// The bytes of a tensor of this file. Free.
    pub fn bytes_of(&self, info: &TensorInfo) -> Result<&'a [u8], GgufError> {
        let range = info.byte_range();
        let (start, end) = (usize::try_from(range.start), usize::try_from(range.end));
        match (start, end) {
            (Ok(start), Ok(end)) => self.bytes.get(start..end).ok_or(GgufError::TensorOutOfBounds {
                tensor: info.name.clone(),
                start: range.start,
                end: range.end,
                file_len: self.bytes.len() as u64,
            }),
            _ => Err(GgufError::TooLargeForPlatform { what: "tensor", bytes: info.byte_len }),
        }
    }

    /// The tensor named `name` as host values, in file order (ne0 fastest):
    /// `F32`, `F16`, `BF16` values, or the blocks of a `Q4_K`, `Q5_K`,
    /// `Q6_K` or `Q8_0` tensor ([`HostVec::Blocks`]). Copies it (one
    /// allocation); other types are [`GgufError::NotFloat`].
    pub fn tensor_host(&self, name: &str) -> Result<HostVec, GgufError> {
        let info = self.header.require(name)?;
        host_vec(info, self.bytes_of(info)?)
    }

    /// The blocks of the `Q4_K`, `Q5_K`, `Q6_K` or `Q8_0` tensor named
    /// `name`, borrowed from the file's bytes (free: no copy), ready to pass
    /// as a weight to [`Op::QuantMatmul`](crate::Op::QuantMatmul) or to
    /// upload. Other types are [`GgufError::NotFloat`].
    pub fn tensor_blocks(&self, name: &str) -> Result<Blocks<'a>, GgufError> {
        let info = self.header.require(name)?;
        let not = || GgufError::NotFloat { tensor: info.name.clone(), ggml_type: info.ggml_type };
        let dtype = info.ggml_type.dtype().filter(|d| d.is_quantized()).ok_or_else(not)?;
        Blocks::new(dtype, self.bytes_of(info)?).map_err(|_| not())
    }
}

impl Deref for Gguf<'_> {
    type Target = GgufHeader;
    fn deref(&self) -> &GgufHeader {
        &self.header
    }
}

/// A GGUF file on disk: its header, metadata and tensor infos read and
/// checked, its tensors read one at a time on request (a seek and a read
/// into a new `Vec` each; no memory mapping, see the [module](self) docs).
/// Dereferences to [`GgufHeader`].
///
/// Keeps the file open. Reads take `&mut self` (they move the file's
/// position); open the path again for reads from several threads.
#[derive(Debug)]
pub struct GgufFile {
    header: GgufHeader,
    file: File,
    path: PathBuf,
}

impl GgufFile {
    /// Opens `path` and reads everything before the data section through a
    /// 64 KiB buffer (for a model, the header is kilobytes to a few
    /// megabytes of tokenizer data; the gigabytes of tensors are not read).
    /// Tensor ranges are checked against the file's length now.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref().to_path_buf();
        let open_err = |source| GgufError::Open { path: path.clone(), source };
        let file = File::open(&path).map_err(open_err)?;
        let len = file.metadata().map_err(open_err)?.len();
        let reader = BufReader::with_capacity(64 * 1024, &file);
        let header = parse::parse(parse::ReaderSource { reader, pos: 0, len })?;
        Ok(GgufFile { header, file, path })
    }

    /// The parsed header, metadata and tensor infos.
    pub fn header(&self) -> &GgufHeader {
        &self.header
    }

    /// The path it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the bytes of the tensor named `name`: one seek and one read of
    /// exactly its length into a new `Vec` (the copy a memory map would
    /// avoid). An I/O failure, e.g. the file shrank since it was opened, is
    /// [`GgufError::Io`].
    pub fn read_tensor_bytes(&mut self, name: &str) -> Result<Vec<u8>, GgufError> {
        let info = self.header.require(name)?;
        let start = info.file_offset;
        let len = usize::try_from(info.byte_len)
            .map_err(|_| GgufError::TooLargeForPlatform { what: "tensor", bytes: info.byte_len })?;
        let io = |source| GgufError::Io { offset: start, source };
        self.file.seek(SeekFrom::Start(start)).map_err(io)?;
        let mut bytes = vec![0u8; len];
        self.file.read_exact(&mut bytes).map_err(io)?;
        Ok(bytes)
    }

    /// Reads the tensor named `name` as host values (`F32`, `F16`, `BF16`,
    /// or the blocks of `Q4_K`, `Q5_K`, `Q6_K`, `Q8_0`): its bytes are read
    /// ([`GgufFile::read_tensor_bytes`]) and converted, two allocations.
    /// Other types are [`GgufError::NotFloat`] (checked before reading).
    pub fn read_tensor_host(&mut self, name: &str) -> Result<HostVec, GgufError> {
        let info = self.header.require(name)?;
        if info.ggml_type.dtype().is_none() {
            return Err(GgufError::NotFloat { tensor: info.name.clone(), ggml_type: info.ggml_type });
        }
        let info = info.clone();
        let bytes = self.read_tensor_bytes(name)?;
        host_vec(&info, &bytes)
    }
}

impl Deref for GgufFile {
    type Target = GgufHeader;
    fn deref(&self) -> &GgufHeader {
        &self.header
    }
}
