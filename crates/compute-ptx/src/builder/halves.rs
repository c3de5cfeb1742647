//! 16-bit floats: moving `f16` and `bf16` values between memory words and
//! `f32` registers. Kernels compute in `f32`; these are the conversions at the
//! edges, two values per 32-bit word (as they lie in memory, the lower address
//! in the low half).

use super::{B16, F32, KernelBuilder, Reg, U32};

/// Which 16-bit float format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Half {
    /// IEEE binary16 (`.f16`).
    F16,
    /// bfloat16 (`.bf16`): the upper half of an `f32`.
    Bf16,
}

impl Half {
    /// The type as PTX writes it (`f16`, `bf16`).
    pub fn name(self) -> &'static str {
        match self {
            Half::F16 => "f16",
            Half::Bf16 => "bf16",
        }
    }
}

impl KernelBuilder {
    /// Splits a word into its two 16-bit halves, low first (`mov.b32 {lo, hi}, w`).
    pub fn unpack_halves(&mut self, w: Reg<U32>) -> [Reg<B16>; 2] {
        let s = self.reg(w);
        let (lo, hi) = (self.fresh::<B16>(), self.fresh::<B16>());
        self.emit(format!("mov.b32 {{{}, {}}}, {s}", lo.name(), hi.name()));
        [lo, hi]
    }

    /// The two values of a word of `half`s as `f32`s, low first; exact. For
    /// `bf16` two integer instructions (the bits move to the top of an `f32`);
    /// for `f16` an unpack and two `cvt.f32.f16`.
    pub fn half_pair_to_f32(&mut self, w: Reg<U32>, half: Half) -> [Reg<F32>; 2] {
        match half {
            Half::Bf16 => {
                let lo = self.shl(w, 16u32);
                let hi = self.and(w, 0xffff_0000u32);
                [self.bitcast(lo), self.bitcast(hi)]
            }
            Half::F16 => {
                let [lo, hi] = self.unpack_halves(w);
                [self.half_to_f32(lo, half), self.half_to_f32(hi, half)]
            }
        }
    }

    /// One 16-bit value as an `f32`; exact (`cvt.f32.f16`, or for `bf16` the
    /// bits widened and shifted to the top, which needs no `sm_90`).
    pub fn half_to_f32(&mut self, h: Reg<B16>, half: Half) -> Reg<F32> {
        let s = self.reg(h);
        match half {
            Half::F16 => {
                let d = self.fresh::<F32>();
                self.emit(format!("cvt.f32.f16 {}, {s}", d.name()));
                d
            }
            Half::Bf16 => {
                let w = self.fresh::<U32>();
                self.emit(format!("cvt.u32.u16 {}, {s}", w.name()));
                let top = self.shl(w, 16u32);
                self.bitcast(top)
            }
        }
    }

    /// Two `f32`s rounded to nearest even into one word of `half`s, `lo` in the
    /// low half (`cvt.rn.f16x2.f32` / `cvt.rn.bf16x2.f32`, one instruction).
    pub fn f32_pair_to_half(&mut self, lo: Reg<F32>, hi: Reg<F32>, half: Half) -> Reg<U32> {
        let (l, h) = (self.reg(lo), self.reg(hi));
        let d = self.fresh::<U32>();
        // PTX takes the value for the upper half first.
        self.emit(format!("cvt.rn.{}x2.f32 {}, {h}, {l}", half.name(), d.name()));
        d
    }

    /// One `f32` rounded to nearest even to a `half` (`cvt.rn.f16.f32` / `cvt.rn.bf16.f32`).
    pub fn f32_to_half(&mut self, v: Reg<F32>, half: Half) -> Reg<B16> {
        let s = self.reg(v);
        let d = self.fresh::<B16>();
        self.emit(format!("cvt.rn.{}.f32 {}, {s}", half.name(), d.name()));
        d
    }
}
