//! Matmul epilogues ([`compute_core::Epilogue`]): `C = act(alpha·p + beta·C₀ + bias)`
//! applied to each `f32` product value `p` before it is rounded and stored.
//!
//! The tensor-core GEMMs ([`super::gemm_mma`], [`super::gemm_wgmma`],
//! [`super::gemm_tma`]) and the GEMV kernels of `B` stored `n × k`
//! ([`super::gemv`]) apply it in their stores (`EpilogueRegs::pair`,
//! `EpilogueRegs::element`): the results never leave registers, `C₀` and the
//! bias are read beside the store, and the cost is that of reading them. The
//! other tiers (SIMT, the GEMV of `B` stored `k × n`, products widened to
//! `f32`) write the plain product to an `f32` temporary and run
//! [`standalone`] over it: one more pass over `C`.
//!
//! What changes the code ([`EpilogueKind`]: bias or not, `C₀` or not, the
//! activation) is part of the kernel's identity and name; `alpha` and `beta`
//! are parameters. Kernels with an epilogue are built on first use, like
//! every kernel; the checked-in set holds a few of them (see
//! [`super::catalog`]).

use compute_core::{Activation, DType, Epilogue, GeluForm};

use super::elem;
use super::elementwise::{UnaryKind, apply_unary};
use crate::builder::{BuildError, F32, Half, Kernel, KernelBuilder, Pred, Reg, Target, U32, U64};

/// The part of an [`Epilogue`] a kernel is built for; `alpha` and `beta`
/// are its parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EpilogueKind {
    /// Adds a bias of `n` values (one per column).
    pub bias: bool,
    /// Reads `C₀` (`beta ≠ 0`).
    pub c: bool,
    /// The activation applied last.
    pub activation: Option<Activation>,
}

impl EpilogueKind {
    /// The kind of `e`, or `None` for the plain product (which kernels
    /// without an epilogue store as it is).
    pub fn of(e: &Epilogue) -> Option<Self> {
        (!e.is_identity()).then_some(EpilogueKind { bias: e.bias, c: e.reads_c(), activation: e.activation })
    }

    /// The suffix of a kernel name built with `kind` (`""` without one),
    /// e.g. `_ep_bias_c_silu`.
    pub fn suffix(kind: Option<Self>) -> String {
        let Some(k) = kind else { return String::new() };
        let mut s = String::from("_ep");
        if k.bias {
            s += "_bias";
        }
        if k.c {
            s += "_c";
        }
        if let Some(a) = k.activation {
            s += "_";
            s += a.name();
        }
        s
    }

    /// A human-readable formula for kernel docs.
    fn formula(self) -> String {
        let mut v = String::from("alpha*p");
        if self.c {
            v += " + beta*c0";
        }
        if self.bias {
            v += " + bias[col]";
        }
        match self.activation {
            Some(a) => format!("{}({v})", a.name()),
            None => v,
        }
    }
}

/// The epilogue's parameters inside a kernel: `alpha`, `beta`, and the
/// addresses of the bias and of `C₀` (this batch's, after [`EpilogueRegs::at_batch`]).
#[derive(Clone, Copy)]
pub(crate) struct EpilogueRegs {
    kind: EpilogueKind,
    alpha: Reg<F32>,
    beta: Reg<F32>,
    bias: Reg<U64>,
    c0: Reg<U64>,
}

/// Declares the epilogue's parameters (`alpha`, `beta`, `bias`, `c0`, in
/// that order, after the kernel's own) when the kernel has one.
pub(crate) fn params(b: &mut KernelBuilder, kind: Option<EpilogueKind>) -> Option<EpilogueRegs> {
    let kind = kind?;
    Some(EpilogueRegs {
        kind,
        alpha: b.param::<F32>("alpha"),
        beta: b.param::<F32>("beta"),
        bias: b.param_ptr("bias"),
        c0: b.param_ptr("c0"),
    })
}

/// The doc line of a GEMM kernel's epilogue parameters (none without one).
pub(crate) fn doc(b: &mut KernelBuilder, kind: Option<EpilogueKind>) {
    if let Some(k) = kind {
        b.doc(&format!(
            "epilogue: C = {} (f32, rounded once); params after the others: alpha, beta (f32), bias, c0 (addresses)",
            k.formula()
        ));
    }
}

impl EpilogueRegs {
    /// The same with `C₀` moved on by `bytes` (the batch's offset in `C`).
    pub(crate) fn at_batch(self, b: &mut KernelBuilder, bytes: Reg<U64>) -> Self {
        EpilogueRegs { c0: b.add(self.c0, bytes), ..self }
    }

    /// The values to store for the accumulator pair `(lo, hi)` of columns
    /// `col`, `col + 1`: `C₀`'s pair is at byte `off + at` of this batch's
    /// `C₀` (the pair's place in `C`), the bias pair at byte `col_off + at`
    /// of the bias. Both are read only when `ok` (zeros otherwise).
    pub(crate) fn pair(
        &self,
        b: &mut KernelBuilder,
        out: Option<Half>,
        (off, col_off, at): (Reg<U64>, Reg<U64>, i64),
        (lo, hi): (Reg<F32>, Reg<F32>),
        ok: Reg<Pred>,
    ) -> (Reg<F32>, Reg<F32>) {
        let c = self.load_c(b, out, (off, at), ok);
        let bias = self.load_bias(b, out, (col_off, at), ok);
        self.finish(b, (lo, hi), c, bias)
    }

    /// Issues the read of `C₀`'s pair at byte `off + at` (when the kind
    /// reads `C₀`), for [`EpilogueRegs::finish`]: issuing a tile's reads
    /// before its stores keeps them in flight together.
    pub(crate) fn load_c(
        &self,
        b: &mut KernelBuilder,
        out: Option<Half>,
        (off, at): (Reg<U64>, i64),
        ok: Reg<Pred>,
    ) -> Option<Loaded> {
        self.kind.c.then(|| {
            let p = b.add(self.c0, off);
            load_pair(b, out, (p, at), ok)
        })
    }

    /// Issues the read of the bias pair at byte `col_off + at` (when the kind adds one).
    pub(crate) fn load_bias(
        &self,
        b: &mut KernelBuilder,
        out: Option<Half>,
        (col_off, at): (Reg<U64>, i64),
        ok: Reg<Pred>,
    ) -> Option<Loaded> {
        self.kind.bias.then(|| {
            let p = b.add(self.bias, col_off);
            load_pair(b, out, (p, at), ok)
        })
    }

    /// The values to store for `(lo, hi)` from the reads of
    /// [`EpilogueRegs::load_c`] and [`EpilogueRegs::load_bias`].
    pub(crate) fn finish(
        &self,
        b: &mut KernelBuilder,
        (lo, hi): (Reg<F32>, Reg<F32>),
        c: Option<Loaded>,
        bias: Option<Loaded>,
    ) -> (Reg<F32>, Reg<F32>) {
        let c = c.map(|l| l.widen(b));
        let bias = bias.map(|l| l.widen(b));
        let lo = self.value(b, lo, c.map(|v| v[0]), bias.map(|v| v[0]));
        let hi = self.value(b, hi, c.map(|v| v[1]), bias.map(|v| v[1]));
        (lo, hi)
    }

    /// The value to store for one product `v` of column `col` whose place in
    /// `C` (and `C₀`, of the same layout) is byte `coff` of this batch's
    /// matrix, `C₀` and the bias of dtype `out`: both read unconditionally
    /// (the caller branches around elements outside `C`).
    pub(crate) fn element(
        &self,
        b: &mut KernelBuilder,
        out: DType,
        (coff, col): (Reg<U64>, Reg<U32>),
        v: Reg<F32>,
    ) -> Reg<F32> {
        let c = self.kind.c.then(|| {
            let a = b.add(self.c0, coff);
            elem::load(b, out, a, 0, 1)[0]
        });
        let bias = self.kind.bias.then(|| {
            let col = b.cvt::<U64, U32>(col);
            let off = b.shl(col, elem::shift(out));
            let a = b.add(self.bias, off);
            elem::load(b, out, a, 0, 1)[0]
        });
        self.value(b, v, c, bias)
    }

    /// `act(alpha·p + beta·c + bias)`, in the order of [`Epilogue::apply_f32`].
    fn value(&self, b: &mut KernelBuilder, p: Reg<F32>, c: Option<Reg<F32>>, bias: Option<Reg<F32>>) -> Reg<F32> {
        let mut v = b.mul(self.alpha, p);
        if let Some(c) = c {
            v = b.fma(self.beta, c, v);
        }
        if let Some(bias) = bias {
            v = b.add(v, bias);
        }
        match self.kind.activation {
            Some(a) => activation(b, a, v),
            None => v,
        }
    }
}

/// A pair of values read for the epilogue, still in their storage format.
#[derive(Clone, Copy)]
pub(crate) enum Loaded {
    F32([Reg<F32>; 2]),
    Half(Reg<U32>, Half),
}

impl Loaded {
    fn widen(self, b: &mut KernelBuilder) -> [Reg<F32>; 2] {
        match self {
            Loaded::F32(v) => v,
            Loaded::Half(w, h) => b.half_pair_to_f32(w, h),
        }
    }
}

/// Reads two consecutive values of `out` (`f32` when `None`) at `p + at`
/// through the read-only cache (the epilogue's inputs are never written by
/// the kernel) when `ok`; zeros otherwise.
fn load_pair(b: &mut KernelBuilder, out: Option<Half>, (p, at): (Reg<U64>, i64), ok: Reg<Pred>) -> Loaded {
    match out {
        None => {
            let v = [b.mov(0.0f32), b.mov(0.0f32)];
            b.guarded(ok, false, |b| b.ld_global_nc_v_into::<F32, 2>(v, p, at));
            Loaded::F32(v)
        }
        Some(h) => {
            let w = b.mov(0u32);
            b.guarded(ok, false, |b| b.ld_global_nc_v_into::<U32, 1>([w], p, at));
            Loaded::Half(w, h)
        }
    }
}

/// `act(x)` with the element-wise kernels' `f32` functions (their accuracy).
pub(crate) fn activation(b: &mut KernelBuilder, a: Activation, x: Reg<F32>) -> Reg<F32> {
    let kind = match a {
        Activation::Relu => UnaryKind::Relu,
        Activation::Gelu(GeluForm::Tanh) => UnaryKind::GeluTanh,
        Activation::Gelu(GeluForm::Erf) => UnaryKind::GeluErf,
        Activation::Silu => UnaryKind::Swish,
    };
    apply_unary(b, kind, x)
}

/// Threads per block of [`standalone`].
pub const BLOCK: u32 = super::decoder::BLOCK;

/// Name of the standalone epilogue kernel (`gemm_epilogue_bf16_ep_bias_gelu_tanh`).
pub fn standalone_name(kind: EpilogueKind, output: DType) -> String {
    format!("gemm_epilogue{}{}", elem::suffix(output), EpilogueKind::suffix(Some(kind)))
}

/// Builds the epilogue as its own pass over a product already in `f32`:
/// `c[i] = act(alpha·p[i] + beta·c0[i] + bias[i mod n])`, `c`, `c0` and the
/// bias of `output`'s dtype. Params: `p` (`f32` products), `c`, `total`
/// (u32 elements, every batch), `n` (u32 columns), then `alpha`, `beta`,
/// `bias`, `c0`. Launch: [`BLOCK`] threads per block, any grid (grid-stride).
pub fn standalone(kind: EpilogueKind, output: DType, target: Target) -> Result<Kernel, BuildError> {
    let name = standalone_name(kind, output);
    let mut b = KernelBuilder::new(&name, target);
    b.doc(&format!("{name}: c[i] = {} over f32 products p, {output} c, c0 and bias", kind.formula()));
    b.doc("params: p, c, total (elements), n (columns), alpha, beta, bias, c0");
    b.doc(&format!("launch: {BLOCK} threads per block, any grid (grid-stride)"));
    b.max_threads(BLOCK);
    let p = b.param_ptr("p");
    let c = b.param_ptr("c");
    let total = b.param::<U32>("total");
    let n = b.param::<U32>("n");
    let Some(regs) = params(&mut b, Some(kind)) else {
        return Err(BuildError { kernel: name, problems: vec!["no epilogue".into()] });
    };
    let shift = elem::shift(output);
    super::decoder::grid_stride(&mut b, total, |b, g| {
        let g64 = b.cvt::<U64, U32>(g);
        let poff = b.shl(g64, 2u32);
        let pa = b.add(p, poff);
        let v = elem::load(b, DType::F32, pa, 0, 1)[0];
        let off = b.shl(g64, shift);
        let col = b.rem(g, n);
        let y = regs.element(b, output, (off, col), v);
        let ca = b.add(c, off);
        elem::store(b, output, ca, 0, &[y]);
    });
    b.finish()
}
