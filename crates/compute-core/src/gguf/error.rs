//! [`GgufError`]: every way reading a GGUF file can fail.

use std::path::PathBuf;

use thiserror::Error;

use super::{GgmlType, ValueType};

/// Why a GGUF file could not be read, or a tensor not be taken from it.
///
/// Each variant says what was wrong and where: byte offsets count from the
/// start of the file. Parsing stops at the first problem; no variant is a
/// panic, and none is reached after an allocation larger than the file.
///
/// Not a [`ComputeError`](crate::ComputeError) variant: those describe a
/// compute call on a backend, and a file that does not parse is none.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum GgufError {
    /// The file does not start with the bytes `GGUF`.
    #[error("not a GGUF file: the first 4 bytes are {found:02x?}, expected \"GGUF\" (47 47 55 46)")]
    BadMagic {
        /// The first four bytes.
        found: [u8; 4],
    },
    /// A version other than 2 or 3 (1 used 32-bit counts and is obsolete).
    #[error("GGUF version {version} at byte 4 is not supported (only versions 2 and 3 are)")]
    UnsupportedVersion {
        /// The version in the header.
        version: u32,
    },
    /// The version reads as a large number with zero low bits: a big-endian
    /// file, which this reader does not support.
    #[error("GGUF version field at byte 4 reads {version:#x}: a big-endian file, which is not supported")]
    BigEndian {
        /// The version as read little-endian.
        version: u32,
    },
    /// The file ends inside a field.
    #[error("truncated: {what} at byte {offset} needs {needed} bytes, {available} remain")]
    Truncated {
        /// The field being read.
        what: &'static str,
        /// Where it starts.
        offset: u64,
        /// Its size.
        needed: u64,
        /// Bytes left in the file from `offset`.
        available: u64,
    },
    /// A count or length claims more entries than the rest of the file can
    /// hold, each taking at least `min_bytes`: refused before allocating.
    #[error(
        "{what} at byte {offset} is {count}, but {count} entries of at least {min_bytes} bytes cannot fit in the {available} bytes that remain"
    )]
    CountTooLarge {
        /// Which count (`tensor count`, `array length`, `string length`...).
        what: &'static str,
        /// Where the count is stored.
        offset: u64,
        /// The count.
        count: u64,
        /// The fewest bytes one entry takes.
        min_bytes: u64,
        /// Bytes left in the file after the count.
        available: u64,
    },
    /// A string longer than [`MAX_STRING_LEN`](super::MAX_STRING_LEN).
    #[error("{what} at byte {offset} is {len} bytes long, more than the limit of {max}")]
    StringTooLong {
        /// Which string.
        what: &'static str,
        /// Where its length is stored.
        offset: u64,
        /// Its claimed length.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// A string that is not UTF-8.
    #[error("{what} at byte {offset} is not valid UTF-8")]
    InvalidUtf8 {
        /// Which string.
        what: &'static str,
        /// Where its bytes start.
        offset: u64,
    },
    /// A value type id past 12.
    #[error("metadata value type {id} at byte {offset} is not one of 0..=12")]
    InvalidValueType {
        /// The id.
        id: u32,
        /// Where it is stored.
        offset: u64,
    },
    /// A `bool` byte other than 0 or 1.
    #[error("bool at byte {offset} is {value}, not 0 or 1")]
    InvalidBool {
        /// The byte.
        value: u8,
        /// Where it is stored.
        offset: u64,
    },
    /// Arrays nested deeper than [`MAX_ARRAY_DEPTH`](super::MAX_ARRAY_DEPTH).
    #[error("array at byte {offset} is nested more than {max} deep")]
    NestingTooDeep {
        /// Where the too-deep array starts.
        offset: u64,
        /// The limit.
        max: usize,
    },
    /// A metadata key that appears twice.
    #[error("metadata key `{key}` at byte {offset} appears twice")]
    DuplicateKey {
        /// The key.
        key: String,
        /// Where its second occurrence starts.
        offset: u64,
    },
    /// `general.alignment` is not a `u32`.
    #[error("general.alignment must be a u32, but is a {found}")]
    AlignmentType {
        /// The type it has.
        found: ValueType,
    },
    /// `general.alignment` is zero or not a power of two.
    #[error("general.alignment is {alignment}, not a power of two")]
    BadAlignment {
        /// The value.
        alignment: u32,
    },
    /// A tensor with more than [`MAX_DIMS`](super::MAX_DIMS) dimensions.
    #[error("tensor `{tensor}` (info at byte {offset}) has {n_dims} dimensions, more than {max}")]
    TooManyDims {
        /// The tensor's name.
        tensor: String,
        /// Where its info starts.
        offset: u64,
        /// Its dimension count.
        n_dims: u32,
        /// The limit.
        max: u32,
    },
    /// A dimension past `i64::MAX` (ggml stores them signed), or an element
    /// or byte count that overflows.
    #[error("tensor `{tensor}` (info at byte {offset}) has dims {dims:?}, whose size overflows")]
    ShapeOverflow {
        /// The tensor's name.
        tensor: String,
        /// Where its info starts.
        offset: u64,
        /// Its dims, ne0 first.
        dims: Vec<u64>,
    },
    /// A row length (`ne0`) that is not a multiple of the type's block.
    #[error(
        "tensor `{tensor}` (info at byte {offset}) of type {ggml_type} has rows of {ne0} values, not a multiple of its block of {block_values}"
    )]
    NotBlockMultiple {
        /// The tensor's name.
        tensor: String,
        /// Where its info starts.
        offset: u64,
        /// Its type.
        ggml_type: GgmlType,
        /// Its row length.
        ne0: u64,
        /// Values per block of the type.
        block_values: u64,
    },
    /// A tensor offset that is not a multiple of the alignment.
    #[error("tensor `{tensor}` has data offset {data_offset}, not a multiple of the alignment {alignment}")]
    MisalignedOffset {
        /// The tensor's name.
        tensor: String,
        /// Its offset, relative to the data section.
        data_offset: u64,
        /// The file's alignment.
        alignment: u64,
    },
    /// A tensor whose bytes end past the end of the file (or whose end
    /// overflows `u64`, reported as `u64::MAX`).
    #[error("tensor `{tensor}` spans bytes {start}..{end} of the file, past its end at {file_len}")]
    TensorOutOfBounds {
        /// The tensor's name.
        tensor: String,
        /// Its first byte in the file.
        start: u64,
        /// One past its last byte.
        end: u64,
        /// The file's length.
        file_len: u64,
    },
    /// The aligned start of the data section lies past the end of the file.
    #[error("the data section starts at byte {data_offset}, past the end of the file at {file_len}")]
    DataPastEnd {
        /// Where the data section would start.
        data_offset: u64,
        /// The file's length.
        file_len: u64,
    },
    /// Two tensors with one name.
    #[error("tensor name `{name}` at byte {offset} appears twice")]
    DuplicateTensor {
        /// The name.
        name: String,
        /// Where its second info starts.
        offset: u64,
    },
    /// No tensor has this name.
    #[error("no tensor named `{name}`")]
    NoSuchTensor {
        /// The name asked for.
        name: String,
    },
    /// The tensor's type is not one the library computes with (`F32`,
    /// `F16`, `BF16`, `Q4_K`, `Q5_K`, `Q6_K`, `Q8_0`); read its bytes instead.
    #[error("tensor `{tensor}` is {ggml_type}, not F32, F16, BF16, Q4_K, Q5_K, Q6_K or Q8_0: read it as bytes")]
    NotFloat {
        /// The tensor's name.
        tensor: String,
        /// Its type.
        ggml_type: GgmlType,
    },
    /// A size that does not fit this platform's `usize`.
    #[error("{what} of {bytes} bytes does not fit in memory on this platform")]
    TooLargeForPlatform {
        /// What was to be read.
        what: &'static str,
        /// Its size.
        bytes: u64,
    },
    /// The file could not be opened or its length not be read.
    #[error("opening {}: {source}", path.display())]
    Open {
        /// The path.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// Reading the file failed (or it shrank after it was opened).
    #[error("reading at byte {offset}: {source}")]
    Io {
        /// Where the read started.
        offset: u64,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
}
