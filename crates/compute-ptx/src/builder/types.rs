//! PTX value types as Rust marker types, typed virtual registers and operands.
//!
//! Every register carries its PTX type in its Rust type ([`Reg<F32>`],
//! [`Reg<U32>`], …), so an instruction given operands of the wrong type does not
//! compile: `b.add(x_f32, n_u32)` is a Rust type error, not a driver error.

use std::fmt;
use std::marker::PhantomData;

/// A PTX fundamental type, as written after an instruction (`.f32`, `.u64`, …).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ty {
    /// `.pred`: a predicate register.
    Pred,
    /// `.b16`: 16 untyped bits.
    B16,
    /// `.b32`: 32 untyped bits.
    B32,
    /// `.b64`: 64 untyped bits.
    B64,
    /// `.u16`.
    U16,
    /// `.u32`.
    U32,
    /// `.u64`.
    U64,
    /// `.s32`.
    S32,
    /// `.s64`.
    S64,
    /// `.f16`.
    F16,
    /// `.bf16`.
    Bf16,
    /// `.f32`.
    F32,
    /// `.f64`.
    F64,
}

impl Ty {
    /// The type as PTX writes it, without the dot (`f32`).
    pub fn name(self) -> &'static str {
        match self {
            Ty::Pred => "pred",
            Ty::B16 => "b16",
            Ty::B32 => "b32",
            Ty::B64 => "b64",
            Ty::U16 => "u16",
            Ty::U32 => "u32",
            Ty::U64 => "u64",
            Ty::S32 => "s32",
            Ty::S64 => "s64",
            Ty::F16 => "f16",
            Ty::Bf16 => "bf16",
            Ty::F32 => "f32",
            Ty::F64 => "f64",
        }
    }

    /// Size in bytes (predicates count as 0).
    pub fn bytes(self) -> u32 {
        match self {
            Ty::Pred => 0,
            Ty::B16 | Ty::U16 | Ty::F16 | Ty::Bf16 => 2,
            Ty::B32 | Ty::U32 | Ty::S32 | Ty::F32 => 4,
            Ty::B64 | Ty::U64 | Ty::S64 | Ty::F64 => 8,
        }
    }

    /// The register file a value of this type lives in.
    pub fn class(self) -> RegClass {
        match self {
            Ty::Pred => RegClass::Pred,
            Ty::B16 | Ty::U16 | Ty::F16 | Ty::Bf16 => RegClass::B16,
            Ty::B32 | Ty::U32 | Ty::S32 => RegClass::B32,
            Ty::F32 => RegClass::F32,
            Ty::B64 | Ty::U64 | Ty::S64 => RegClass::B64,
            Ty::F64 => RegClass::F64,
        }
    }
}

impl fmt::Display for Ty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The register declarations of a kernel: one numbered family per class, as
/// `nvcc` writes them (`.reg .f32 %f<12>;`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RegClass {
    /// `%p`: predicates.
    Pred,
    /// `%h`: 16-bit values.
    B16,
    /// `%r`: 32-bit integers and bit patterns.
    B32,
    /// `%f`: 32-bit floats.
    F32,
    /// `%rd`: 64-bit integers and addresses.
    B64,
    /// `%fd`: 64-bit floats.
    F64,
}

impl RegClass {
    /// Every class, in declaration order.
    pub const ALL: [RegClass; 6] =
        [RegClass::Pred, RegClass::B16, RegClass::B32, RegClass::F32, RegClass::B64, RegClass::F64];

    /// Register name prefix (`%f`).
    pub fn prefix(self) -> &'static str {
        match self {
            RegClass::Pred => "%p",
            RegClass::B16 => "%h",
            RegClass::B32 => "%r",
            RegClass::F32 => "%f",
            RegClass::B64 => "%rd",
            RegClass::F64 => "%fd",
        }
    }

    /// Type used in the `.reg` declaration.
    pub fn decl_type(self) -> &'static str {
        match self {
            RegClass::Pred => "pred",
            RegClass::B16 => "b16",
            RegClass::B32 => "b32",
            RegClass::F32 => "f32",
            RegClass::B64 => "b64",
            RegClass::F64 => "f64",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// A PTX value type at the Rust type level. Implemented by the marker types of
/// this module only.
pub trait PtxType: Copy + fmt::Debug + Send + Sync + 'static + sealed::Sealed {
    /// The PTX type.
    const TY: Ty;
}

/// Types that load and store to memory (everything but predicates).
pub trait Data: PtxType {}
/// Integer types (`add`, `mul.lo`, `div`, `rem`, `shl`, `shr`, …).
pub trait Int: Data {
    /// The matching untyped bit type, for `and`/`or`/`xor`/`not`.
    const BITS: Ty;
}
/// Floating-point types (`fma`, `div.rn`, `sqrt.rn`, …).
pub trait Float: Data {}
/// 32-bit types, the ones warp shuffles move.
pub trait Word: Data {}

mod sealed {
    pub trait Sealed {}
}

macro_rules! marker {
    ($(#[$doc:meta] $name:ident => $ty:ident : $($tr:ident),*;)*) => {$(
        #[$doc]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
        pub struct $name;
        impl sealed::Sealed for $name {}
        impl PtxType for $name {
            const TY: Ty = Ty::$ty;
        }
        $(impl $tr for $name {})*
    )*};
}

marker! {
    /// Predicate (`.pred`).
    Pred => Pred : ;
    /// 16 untyped bits (`.b16`): one `f16` or `bf16` value.
    B16 => B16 : Data;
    /// 32 untyped bits (`.b32`), e.g. a packed pair of halves for `mma`.
    B32 => B32 : Data, Word;
    /// 64 untyped bits (`.b64`).
    B64 => B64 : Data;
    /// Unsigned 32-bit integer (`.u32`).
    U32 => U32 : Data, Word;
    /// Signed 32-bit integer (`.s32`).
    S32 => S32 : Data, Word;
    /// Unsigned 64-bit integer (`.u64`), also addresses.
    U64 => U64 : Data;
    /// Signed 64-bit integer (`.s64`).
    S64 => S64 : Data;
    /// 32-bit float (`.f32`).
    F32 => F32 : Data, Float, Word;
    /// 64-bit float (`.f64`).
    F64 => F64 : Data, Float;
}

impl Int for U32 {
    const BITS: Ty = Ty::B32;
}
impl Int for S32 {
    const BITS: Ty = Ty::B32;
}
impl Int for U64 {
    const BITS: Ty = Ty::B64;
}
impl Int for S64 {
    const BITS: Ty = Ty::B64;
}

/// A typed virtual register of one kernel. Cheap to copy; using it in another
/// kernel's builder is reported by [`crate::KernelBuilder::finish`].
pub struct Reg<T: PtxType> {
    pub(crate) index: u32,
    pub(crate) owner: u32,
    _ty: PhantomData<T>,
}

impl<T: PtxType> Reg<T> {
    pub(crate) fn new(index: u32, owner: u32) -> Self {
        Reg { index, owner, _ty: PhantomData }
    }

    /// The register's PTX name (`%f12`).
    pub fn name(&self) -> String {
        format!("{}{}", T::TY.class().prefix(), self.index)
    }
}

impl<T: PtxType> Clone for Reg<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T: PtxType> Copy for Reg<T> {}
impl<T: PtxType> fmt::Debug for Reg<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.name(), T::TY)
    }
}

/// An immediate value, as PTX writes it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Imm {
    /// Integer literal.
    Int(i128),
    /// `f32` literal, written exactly as `0fXXXXXXXX`.
    F32(f32),
    /// `f64` literal, written exactly as `0dXXXXXXXXXXXXXXXX`.
    F64(f64),
}

impl fmt::Display for Imm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Imm::Int(v) => write!(f, "{v}"),
            Imm::F32(v) => write!(f, "0f{:08X}", v.to_bits()),
            Imm::F64(v) => write!(f, "0d{:016X}", v.to_bits()),
        }
    }
}

/// A source operand of type `T`: a register or an immediate of that type.
/// Rust literals convert: `1.5f32` into `Src<F32>`, `7u32` into `Src<U32>`.
pub enum Src<T: PtxType> {
    /// A register.
    Reg(Reg<T>),
    /// A literal.
    Imm(Imm),
}

impl<T: PtxType> Clone for Src<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T: PtxType> Copy for Src<T> {}
impl<T: PtxType> fmt::Debug for Src<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Src::Reg(r) => r.fmt(f),
            Src::Imm(i) => write!(f, "{i}:{}", T::TY),
        }
    }
}

impl<T: PtxType> From<Reg<T>> for Src<T> {
    fn from(r: Reg<T>) -> Self {
        Src::Reg(r)
    }
}

macro_rules! imm_from {
    ($($rust:ty => $marker:ident via $variant:ident as $conv:ty),*) => {$(
        impl From<$rust> for Src<$marker> {
            fn from(v: $rust) -> Self {
                Src::Imm(Imm::$variant(v as $conv))
            }
        }
    )*};
}

imm_from!(
    u32 => U32 via Int as i128,
    i32 => S32 via Int as i128,
    u64 => U64 via Int as i128,
    i64 => S64 via Int as i128,
    f32 => F32 via F32 as f32,
    f64 => F64 via F64 as f64
);

/// Conversions `cvt` accepts from `S` into `Self`, with the rounding modifier
/// each needs (`.rn` for int→float, `.rzi` for float→int, as C casts do).
pub trait CvtFrom<S: PtxType>: PtxType {
    /// The modifier written after `cvt` (`""`, `.rn`, `.rzi`).
    const ROUNDING: &'static str;
}

macro_rules! cvt {
    ($($dst:ident <- $src:ident : $rnd:expr),* $(,)?) => {$(
        impl CvtFrom<$src> for $dst {
            const ROUNDING: &'static str = $rnd;
        }
    )*};
}

cvt!(
    U64 <- U32: "", S64 <- S32: "", U32 <- U64: "", S32 <- S64: "", U64 <- S32: "", S64 <- U32: "",
    U32 <- S32: "", S32 <- U32: "",
    F32 <- U32: ".rn", F32 <- S32: ".rn", F32 <- U64: ".rn", F32 <- S64: ".rn",
    F64 <- U32: ".rn", F64 <- S32: ".rn", F64 <- F32: "", F32 <- F64: ".rn",
    U32 <- F32: ".rzi", S32 <- F32: ".rzi", S64 <- F32: ".rzi", U64 <- F32: ".rzi",
);
