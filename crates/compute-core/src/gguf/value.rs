//! Metadata values: [`Value`], [`Array`] and their [`ValueType`].

use std::fmt;

/// The type tag of a metadata value (`gguf_metadata_value_type`, ids 0 to 12).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ValueType {
    /// `uint8`, id 0.
    U8,
    /// `int8`, id 1.
    I8,
    /// `uint16`, id 2.
    U16,
    /// `int16`, id 3.
    I16,
    /// `uint32`, id 4.
    U32,
    /// `int32`, id 5.
    I32,
    /// `float32`, id 6.
    F32,
    /// `bool` (one byte, 0 or 1), id 7.
    Bool,
    /// UTF-8 string with a `u64` byte length, id 8.
    String,
    /// Array: element type, `u64` count, elements; id 9.
    Array,
    /// `uint64`, id 10.
    U64,
    /// `int64`, id 11.
    I64,
    /// `float64`, id 12.
    F64,
}

impl ValueType {
    /// The type with this id, or `None` past 12.
    pub const fn from_id(id: u32) -> Option<ValueType> {
        Some(match id {
            0 => ValueType::U8,
            1 => ValueType::I8,
            2 => ValueType::U16,
            3 => ValueType::I16,
            4 => ValueType::U32,
            5 => ValueType::I32,
            6 => ValueType::F32,
            7 => ValueType::Bool,
            8 => ValueType::String,
            9 => ValueType::Array,
            10 => ValueType::U64,
            11 => ValueType::I64,
            12 => ValueType::F64,
            _ => return None,
        })
    }

    /// The id stored in the file.
    pub const fn id(self) -> u32 {
        match self {
            ValueType::U8 => 0,
            ValueType::I8 => 1,
            ValueType::U16 => 2,
            ValueType::I16 => 3,
            ValueType::U32 => 4,
            ValueType::I32 => 5,
            ValueType::F32 => 6,
            ValueType::Bool => 7,
            ValueType::String => 8,
            ValueType::Array => 9,
            ValueType::U64 => 10,
            ValueType::I64 => 11,
            ValueType::F64 => 12,
        }
    }

    /// Bytes of one value of a fixed-size type; `None` for strings and arrays.
    pub const fn fixed_size(self) -> Option<u64> {
        match self {
            ValueType::U8 | ValueType::I8 | ValueType::Bool => Some(1),
            ValueType::U16 | ValueType::I16 => Some(2),
            ValueType::U32 | ValueType::I32 | ValueType::F32 => Some(4),
            ValueType::U64 | ValueType::I64 | ValueType::F64 => Some(8),
            ValueType::String | ValueType::Array => None,
        }
    }

    /// The fewest bytes one value of this type takes in a file (a string's
    /// length field, an array's type and count), used to refuse counts that
    /// cannot fit before anything is allocated.
    pub(crate) const fn min_encoded_size(self) -> u64 {
        match self {
            ValueType::String => 8,
            ValueType::Array => 12,
            other => match other.fixed_size() {
                Some(n) => n,
                None => 1,
            },
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ValueType::U8 => "u8",
            ValueType::I8 => "i8",
            ValueType::U16 => "u16",
            ValueType::I16 => "i16",
            ValueType::U32 => "u32",
            ValueType::I32 => "i32",
            ValueType::F32 => "f32",
            ValueType::Bool => "bool",
            ValueType::String => "string",
            ValueType::Array => "array",
            ValueType::U64 => "u64",
            ValueType::I64 => "i64",
            ValueType::F64 => "f64",
        })
    }
}

/// One metadata value, as read from the file (little-endian, UTF-8 checked).
///
/// The `as_*` accessors return the value only when it has exactly that type
/// (free); [`Value::to_u64`] and [`Value::to_i64`] widen any integer type.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `uint8`.
    U8(u8),
    /// `int8`.
    I8(i8),
    /// `uint16`.
    U16(u16),
    /// `int16`.
    I16(i16),
    /// `uint32`.
    U32(u32),
    /// `int32`.
    I32(i32),
    /// `float32`.
    F32(f32),
    /// `bool`.
    Bool(bool),
    /// A UTF-8 string.
    String(String),
    /// An array of one element type (arrays of arrays allowed).
    Array(Array),
    /// `uint64`.
    U64(u64),
    /// `int64`.
    I64(i64),
    /// `float64`.
    F64(f64),
}

macro_rules! scalar_accessors {
    ($( $(#[$doc:meta])* $fn:ident, $variant:ident, $t:ty; )*) => {
        $(
            $(#[$doc])*
            pub fn $fn(&self) -> Option<$t> {
                match *self {
                    Value::$variant(v) => Some(v),
                    _ => None,
                }
            }
        )*
    };
}

impl Value {
    /// The value's type tag.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    scalar_accessors! {
        /// The value if it is a `u8`.
        as_u8, U8, u8;
        /// The value if it is an `i8`.
        as_i8, I8, i8;
        /// The value if it is a `u16`.
        as_u16, U16, u16;
        /// The value if it is an `i16`.
        as_i16, I16, i16;
        /// The value if it is a `u32`.
        as_u32, U32, u32;
        /// The value if it is an `i32`.
        as_i32, I32, i32;
        /// The value if it is an `f32`.
        as_f32, F32, f32;
        /// The value if it is a `bool`.
        as_bool, Bool, bool;
        /// The value if it is a `u64`.
        as_u64, U64, u64;
        /// The value if it is an `i64`.
        as_i64, I64, i64;
        /// The value if it is an `f64`.
        as_f64, F64, f64;
    }

    /// The string if the value is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The array if the value is one.
    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// Any integer value that is not negative, widened to `u64` (the spec
    /// lets writers store counts as `uint32` or `uint64`).
    pub fn to_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer value that fits an `i64`, widened.
    pub fn to_i64(&self) -> Option<i64> {
        match *self {
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v),
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => i64::try_from(v).ok(),
            _ => None,
        }
    }
}

/// A metadata array: one typed vector per element type, so an array of a
/// million `f32` scores is one `Vec<f32>` (4 bytes a value, as in the
/// file), and nested arrays are a vector of arrays, each with its own
/// element type.
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    /// `uint8` elements.
    U8(Vec<u8>),
    /// `int8` elements.
    I8(Vec<i8>),
    /// `uint16` elements.
    U16(Vec<u16>),
    /// `int16` elements.
    I16(Vec<i16>),
    /// `uint32` elements.
    U32(Vec<u32>),
    /// `int32` elements.
    I32(Vec<i32>),
    /// `float32` elements.
    F32(Vec<f32>),
    /// `bool` elements.
    Bool(Vec<bool>),
    /// String elements.
    String(Vec<String>),
    /// Array elements (each with its own element type).
    Array(Vec<Array>),
    /// `uint64` elements.
    U64(Vec<u64>),
    /// `int64` elements.
    I64(Vec<i64>),
    /// `float64` elements.
    F64(Vec<f64>),
}

macro_rules! slice_accessors {
    ($( $(#[$doc:meta])* $fn:ident, $variant:ident, $t:ty; )*) => {
        $(
            $(#[$doc])*
            pub fn $fn(&self) -> Option<&[$t]> {
                match self {
                    Array::$variant(v) => Some(v),
                    _ => None,
                }
            }
        )*
    };
}

impl Array {
    /// The element type tag.
    pub fn element_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    slice_accessors! {
        /// The elements if they are `u8`s. Free.
        as_u8, U8, u8;
        /// The elements if they are `i8`s. Free.
        as_i8, I8, i8;
        /// The elements if they are `u16`s. Free.
        as_u16, U16, u16;
        /// The elements if they are `i16`s. Free.
        as_i16, I16, i16;
        /// The elements if they are `u32`s. Free.
        as_u32, U32, u32;
        /// The elements if they are `i32`s. Free.
        as_i32, I32, i32;
        /// The elements if they are `f32`s. Free.
        as_f32, F32, f32;
        /// The elements if they are `bool`s. Free.
        as_bool, Bool, bool;
        /// The elements if they are strings. Free.
        as_strings, String, String;
        /// The elements if they are arrays. Free.
        as_arrays, Array, Array;
        /// The elements if they are `u64`s. Free.
        as_u64, U64, u64;
        /// The elements if they are `i64`s. Free.
        as_i64, I64, i64;
        /// The elements if they are `f64`s. Free.
        as_f64, F64, f64;
    }
}
