//! Arithmetic, logic, comparisons, selects, conversions and the special-function
//! approximations. Float add/sub/mul carry `.rn`, so `ptxas` never contracts
//! them into an `fma` behind the kernel's back; `fma` is always explicit.

use super::KernelBuilder;
use super::types::{CvtFrom, Data, F32, F64, Float, Int, Pred, PtxType, Reg, S32, S64, Src, Ty, U32, U64, Word};

/// Types with `add`/`sub`/`mul`/`min`/`max`.
pub trait Num: Data {
    /// Modifier of add/sub (`.rn` for floats).
    const ADD: &'static str;
    /// Modifier of mul (`.rn` for floats, `.lo` for integers).
    const MUL: &'static str;
}

macro_rules! num {
    ($($t:ident: $add:expr, $mul:expr);*) => {$(
        impl Num for $t {
            const ADD: &'static str = $add;
            const MUL: &'static str = $mul;
        }
    )*};
}
num!(U32: "", ".lo"; S32: "", ".lo"; U64: "", ".lo"; S64: "", ".lo"; F32: ".rn", ".rn"; F64: ".rn", ".rn");

/// Signed types (`neg`, `abs`).
pub trait Signed: Num {}
impl Signed for S32 {}
impl Signed for S64 {}
impl Signed for F32 {}
impl Signed for F64 {}

/// A comparison for [`KernelBuilder::setp`]. The `…u` forms are the unordered
/// float comparisons (true when either side is NaN).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cmp {
    /// `==`.
    Eq,
    /// `!=`.
    Ne,
    /// `<`.
    Lt,
    /// `<=`.
    Le,
    /// `>`.
    Gt,
    /// `>=`.
    Ge,
    /// `!=` or unordered (floats).
    Neu,
    /// `<` or unordered (floats).
    Ltu,
    /// `>=` or unordered (floats).
    Geu,
    /// Either side NaN (floats).
    Nan,
    /// Neither side NaN (floats).
    Num,
}

impl Cmp {
    fn name(self) -> &'static str {
        match self {
            Cmp::Eq => "eq",
            Cmp::Ne => "ne",
            Cmp::Lt => "lt",
            Cmp::Le => "le",
            Cmp::Gt => "gt",
            Cmp::Ge => "ge",
            Cmp::Neu => "neu",
            Cmp::Ltu => "ltu",
            Cmp::Geu => "geu",
            Cmp::Nan => "nan",
            Cmp::Num => "num",
        }
    }
    fn float_only(self) -> bool {
        matches!(self, Cmp::Neu | Cmp::Ltu | Cmp::Geu | Cmp::Nan | Cmp::Num)
    }
}

fn is_float(t: Ty) -> bool {
    matches!(t, Ty::F32 | Ty::F64 | Ty::F16 | Ty::Bf16)
}

impl KernelBuilder {
    fn unop<T: PtxType>(&mut self, op: &str, a: Src<T>) -> Reg<T> {
        let a = self.src(a);
        let d = self.fresh::<T>();
        let dn = d.name();
        self.emit(format!("{op} {dn}, {a}"));
        d
    }

    fn binop<T: PtxType>(&mut self, op: &str, a: Src<T>, b: Src<T>) -> Reg<T> {
        let (a, b) = (self.src(a), self.src(b));
        let d = self.fresh::<T>();
        let dn = d.name();
        self.emit(format!("{op} {dn}, {a}, {b}"));
        d
    }

    fn triop<T: PtxType>(&mut self, op: &str, a: Src<T>, b: Src<T>, c: Src<T>) -> Reg<T> {
        let (a, b, c) = (self.src(a), self.src(b), self.src(c));
        let d = self.fresh::<T>();
        let dn = d.name();
        self.emit(format!("{op} {dn}, {a}, {b}, {c}"));
        d
    }

    /// `mov`: a new register holding `v`.
    pub fn mov<T: PtxType>(&mut self, v: impl Into<Src<T>>) -> Reg<T> {
        self.unop(&format!("mov.{}", T::TY), v.into())
    }

    /// `mov` into an existing register: how loop-carried values are updated
    /// (`ptxas` removes the copies).
    pub fn assign<T: PtxType>(&mut self, dst: Reg<T>, v: impl Into<Src<T>>) {
        let d = self.reg(dst);
        let v = self.src(v.into());
        self.emit(format!("mov.{} {d}, {v}", T::TY));
    }

    /// Reinterprets the bits of a 32-bit value as another 32-bit type (`mov.b32`).
    pub fn bitcast<D: Word, S: Word>(&mut self, v: Reg<S>) -> Reg<D> {
        let s = self.reg(v);
        let d = self.fresh::<D>();
        let dn = d.name();
        self.emit(format!("mov.b32 {dn}, {s}"));
        d
    }

    /// `a + b`.
    pub fn add<T: Num>(&mut self, a: Reg<T>, b: impl Into<Src<T>>) -> Reg<T> {
        self.binop(&format!("add{}.{}", T::ADD, T::TY), a.into(), b.into())
    }

    /// `a − b`.
    pub fn sub<T: Num>(&mut self, a: impl Into<Src<T>>, b: impl Into<Src<T>>) -> Reg<T> {
        self.binop(&format!("sub{}.{}", T::ADD, T::TY), a.into(), b.into())
    }

    /// `a · b` (low half for integers).
    pub fn mul<T: Num>(&mut self, a: Reg<T>, b: impl Into<Src<T>>) -> Reg<T> {
        self.binop(&format!("mul{}.{}", T::MUL, T::TY), a.into(), b.into())
    }

    /// `min(a, b)`; for floats, a NaN operand yields the other one.
    pub fn min<T: Num>(&mut self, a: Reg<T>, b: impl Into<Src<T>>) -> Reg<T> {
        self.binop(&format!("min.{}", T::TY), a.into(), b.into())
    }

    /// `max(a, b)`; for floats, a NaN operand yields the other one.
    pub fn max<T: Num>(&mut self, a: Reg<T>, b: impl Into<Src<T>>) -> Reg<T> {
        self.binop(&format!("max.{}", T::TY), a.into(), b.into())
    }

    /// `min.NaN.f32`: the minimum, NaN if either is NaN (sm_80+).
    pub fn min_nan(&mut self, a: Reg<F32>, b: impl Into<Src<F32>>) -> Reg<F32> {
        self.binop("min.NaN.f32", a.into(), b.into())
    }

    /// `max.NaN.f32`: the maximum, NaN if either is NaN (sm_80+).
    pub fn max_nan(&mut self, a: Reg<F32>, b: impl Into<Src<F32>>) -> Reg<F32> {
        self.binop("max.NaN.f32", a.into(), b.into())
    }

    /// `−a`.
    pub fn neg<T: Signed>(&mut self, a: Reg<T>) -> Reg<T> {
        self.unop(&format!("neg.{}", T::TY), a.into())
    }

    /// `|a|`.
    pub fn abs<T: Signed>(&mut self, a: Reg<T>) -> Reg<T> {
        self.unop(&format!("abs.{}", T::TY), a.into())
    }

    /// `a · b + c`, rounded once (`fma.rn`).
    pub fn fma<T: Float>(&mut self, a: Reg<T>, b: impl Into<Src<T>>, c: impl Into<Src<T>>) -> Reg<T> {
        self.triop(&format!("fma.rn.{}", T::TY), a.into(), b.into(), c.into())
    }

    /// `acc ← a · b + acc` in place: the accumulator form GEMM inner loops use.
    pub fn fma_acc<T: Float>(&mut self, acc: Reg<T>, a: Reg<T>, b: Reg<T>) {
        let (d, a, b) = (self.reg(acc), self.reg(a), self.reg(b));
        self.emit(format!("fma.rn.{} {d}, {a}, {b}, {d}", T::TY));
    }

    /// `a · b + c` on integers (low half).
    pub fn mad<T: Int>(&mut self, a: Reg<T>, b: impl Into<Src<T>>, c: impl Into<Src<T>>) -> Reg<T> {
        self.triop(&format!("mad.lo.{}", T::TY), a.into(), b.into(), c.into())
    }

    /// `a / b`: IEEE round-to-nearest for floats (`div.rn`), truncating for integers.
    pub fn div<T: Num>(&mut self, a: impl Into<Src<T>>, b: impl Into<Src<T>>) -> Reg<T> {
        let op = if is_float(T::TY) { format!("div.rn.{}", T::TY) } else { format!("div.{}", T::TY) };
        self.binop(&op, a.into(), b.into())
    }

    /// `a mod b` on integers.
    pub fn rem<T: Int>(&mut self, a: Reg<T>, b: impl Into<Src<T>>) -> Reg<T> {
        self.binop(&format!("rem.{}", T::TY), a.into(), b.into())
    }

    /// `c + Σ a_i·b_i` over the four signed bytes of `a` and of `b`
    /// (`dp4a.s32.s32`, sm_61+): four int8 products and their sum in one
    /// instruction, the inner step of integer dot products.
    pub fn dp4a(&mut self, a: Reg<U32>, b: Reg<U32>, c: impl Into<Src<S32>>) -> Reg<S32> {
        let (a, b, c) = (self.reg(a), self.reg(b), self.src(c.into()));
        let d = self.fresh::<S32>();
        let dn = d.name();
        self.emit(format!("dp4a.s32.s32 {dn}, {a}, {b}, {c}"));
        d
    }

    /// The full 64-bit product of two 32-bit unsigned integers (`mul.wide.u32`),
    /// the usual way to turn an index into a byte offset.
    pub fn mul_wide(&mut self, a: Reg<U32>, b: impl Into<Src<U32>>) -> Reg<U64> {
        let (a, b) = (self.reg(a), self.src(b.into()));
        let d = self.fresh::<U64>();
        let dn = d.name();
        self.emit(format!("mul.wide.u32 {dn}, {a}, {b}"));
        d
    }

    /// The full 64-bit product of two signed 32-bit integers (`mul.wide.s32`).
    pub fn mul_wide_s(&mut self, a: Reg<S32>, b: impl Into<Src<S32>>) -> Reg<S64> {
        let (a, b) = (self.reg(a), self.src(b.into()));
        let d = self.fresh::<S64>();
        let dn = d.name();
        self.emit(format!("mul.wide.s32 {dn}, {a}, {b}"));
        d
    }

    /// `a << n`.
    pub fn shl<T: Int>(&mut self, a: Reg<T>, n: impl Into<Src<U32>>) -> Reg<T> {
        let (a, n) = (self.reg(a), self.src(n.into()));
        let d = self.fresh::<T>();
        let dn = d.name();
        self.emit(format!("shl.{} {dn}, {a}, {n}", T::BITS));
        d
    }

    /// `a >> n`: logical for unsigned, arithmetic for signed types.
    pub fn shr<T: Int>(&mut self, a: Reg<T>, n: impl Into<Src<U32>>) -> Reg<T> {
        let (a, n) = (self.reg(a), self.src(n.into()));
        let d = self.fresh::<T>();
        let dn = d.name();
        self.emit(format!("shr.{} {dn}, {a}, {n}", T::TY));
        d
    }

    /// Bitwise `a & b`.
    pub fn and<T: Int>(&mut self, a: Reg<T>, b: impl Into<Src<T>>) -> Reg<T> {
        self.binop(&format!("and.{}", T::BITS), a.into(), b.into())
    }

    /// Bitwise `a | b`.
    pub fn or<T: Int>(&mut self, a: Reg<T>, b: impl Into<Src<T>>) -> Reg<T> {
        self.binop(&format!("or.{}", T::BITS), a.into(), b.into())
    }

    /// Bitwise `a ^ b`.
    pub fn xor<T: Int>(&mut self, a: Reg<T>, b: impl Into<Src<T>>) -> Reg<T> {
        self.binop(&format!("xor.{}", T::BITS), a.into(), b.into())
    }

    /// Predicate `a && b`.
    pub fn and_pred(&mut self, a: Reg<Pred>, b: Reg<Pred>) -> Reg<Pred> {
        self.binop("and.pred", a.into(), b.into())
    }

    /// Predicate `a || b`.
    pub fn or_pred(&mut self, a: Reg<Pred>, b: Reg<Pred>) -> Reg<Pred> {
        self.binop("or.pred", a.into(), b.into())
    }

    /// Predicate `!a`.
    pub fn not_pred(&mut self, a: Reg<Pred>) -> Reg<Pred> {
        self.unop("not.pred", a.into())
    }

    /// Compares `a` with `b` into a predicate (`setp`). Unordered comparisons on
    /// integer types are reported by [`KernelBuilder::finish`].
    pub fn setp<T: Num>(&mut self, cmp: Cmp, a: Reg<T>, b: impl Into<Src<T>>) -> Reg<Pred> {
        if cmp.float_only() && !is_float(T::TY) {
            self.error(format!("setp.{} needs a float type, got .{}", cmp.name(), T::TY));
        }
        let (a, b) = (self.reg(a), self.src(b.into()));
        let d = self.fresh::<Pred>();
        let dn = d.name();
        self.emit(format!("setp.{}.{} {dn}, {a}, {b}", cmp.name(), T::TY));
        d
    }

    /// `p ? a : b` (`selp`).
    pub fn selp<T: Data>(&mut self, a: impl Into<Src<T>>, b: impl Into<Src<T>>, p: Reg<Pred>) -> Reg<T> {
        let (a, b, p) = (self.src(a.into()), self.src(b.into()), self.reg(p));
        let d = self.fresh::<T>();
        let dn = d.name();
        self.emit(format!("selp.{} {dn}, {a}, {b}, {p}", T::TY));
        d
    }

    /// Converts between types (`cvt`), with the rounding a C cast uses; the
    /// pairs allowed are those of [`CvtFrom`].
    pub fn cvt<D: CvtFrom<S>, S: PtxType>(&mut self, v: Reg<S>) -> Reg<D> {
        let s = self.reg(v);
        let d = self.fresh::<D>();
        let dn = d.name();
        self.emit(format!("cvt{}.{}.{} {dn}, {s}", D::ROUNDING, D::TY, S::TY));
        d
    }

    /// Rounds a float to the nearest integer value, ties to even (`cvt.rni.f32.f32`).
    pub fn round_even(&mut self, v: Reg<F32>) -> Reg<F32> {
        self.unop("cvt.rni.f32.f32", v.into())
    }

    /// Rounds a float towards −∞ (`cvt.rmi.f32.f32`).
    pub fn floor(&mut self, v: Reg<F32>) -> Reg<F32> {
        self.unop("cvt.rmi.f32.f32", v.into())
    }

    /// `|a|` with the sign of `b` (`copysign.f32`).
    pub fn copysign(&mut self, magnitude: Reg<F32>, sign: Reg<F32>) -> Reg<F32> {
        let (m, s) = (self.reg(magnitude), self.reg(sign));
        let d = self.fresh::<F32>();
        let dn = d.name();
        // PTX's copysign takes the sign source first.
        self.emit(format!("copysign.f32 {dn}, {s}, {m}"));
        d
    }

    /// `2^a`, approximate (`ex2.approx.f32`, max relative error about 2 ulp,
    /// subnormal results kept).
    pub fn ex2_approx(&mut self, a: Reg<F32>) -> Reg<F32> {
        self.unop("ex2.approx.f32", a.into())
    }

    /// `log2(a)`, approximate (`lg2.approx.f32`, absolute error about 2⁻²²).
    pub fn lg2_approx(&mut self, a: Reg<F32>) -> Reg<F32> {
        self.unop("lg2.approx.f32", a.into())
    }

    /// `sin(a)`, approximate (`sin.approx.f32`: absolute error about 2⁻²⁰·⁹
    /// for `|a| ≤ π`, growing with `|a|` beyond: reduce the argument first).
    pub fn sin_approx(&mut self, a: Reg<F32>) -> Reg<F32> {
        self.unop("sin.approx.f32", a.into())
    }

    /// `cos(a)`, approximate (`cos.approx.f32`, the error of
    /// [`KernelBuilder::sin_approx`]).
    pub fn cos_approx(&mut self, a: Reg<F32>) -> Reg<F32> {
        self.unop("cos.approx.f32", a.into())
    }

    /// `1/a`, approximate (`rcp.approx.f32`).
    pub fn rcp_approx(&mut self, a: Reg<F32>) -> Reg<F32> {
        self.unop("rcp.approx.f32", a.into())
    }

    /// `1/a`, correctly rounded (`rcp.rn`).
    pub fn rcp<T: Float>(&mut self, a: Reg<T>) -> Reg<T> {
        self.unop(&format!("rcp.rn.{}", T::TY), a.into())
    }

    /// `1/√a`, approximate (`rsqrt.approx.f32`).
    pub fn rsqrt_approx(&mut self, a: Reg<F32>) -> Reg<F32> {
        self.unop("rsqrt.approx.f32", a.into())
    }

    /// `√a`, correctly rounded (`sqrt.rn`).
    pub fn sqrt<T: Float>(&mut self, a: Reg<T>) -> Reg<T> {
        self.unop(&format!("sqrt.rn.{}", T::TY), a.into())
    }

    /// `tanh(a)`, approximate (`tanh.approx.f32`, relative error about 2⁻¹¹:
    /// too coarse for the conformance tolerance, kept for callers who want speed).
    pub fn tanh_approx(&mut self, a: Reg<F32>) -> Reg<F32> {
        self.unop("tanh.approx.f32", a.into())
    }

    /// An `f64` register from an `f32` one (exact).
    pub fn widen(&mut self, v: Reg<F32>) -> Reg<F64> {
        self.cvt::<F64, F32>(v)
    }
}
