//! The WGSL kernels (from the top-level `shaders/` folder, compiled into the
//! binary) and the per-device cache of their compute pipelines.
//!
//! A shader module is compiled once per device and per dtypes on first use;
//! each (entry point, pipeline-overridable constants, dtypes) triple becomes
//! one pipeline, compiled once and kept for the device's life.
//!
//! **Dtypes.** The WGSL files are written for `f32`, but `matmul_coop.wgsl`
//! (`f16` inputs, its output dtype chosen by its generated entry point, see
//! [`coop_matmul`]). Each file (but `matmul.wgsl` and `attention.wgsl`, which
//! only ever see `f32`, and `matmul_coop.wgsl`) declares its
//! operands between `// @io-begin` and `// @io-end` lines, each with the
//! function the kernels read or write it through (`load_x`, `store_y`…). For
//! `f16` or `bf16` operands, [`io_block`] writes those lines again for packed 16-bit values
//! (arrays of `u32` words, converted by the functions of `shaders/half.wgsl`,
//! which is prepended); the kernels themselves are unchanged and compute in
//! `f32`. A unit test checks that the `f32` lines [`io_block`] writes are the
//! ones in the files.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use compute_core::quant::BlockFormat;
use compute_core::{ComputeError, DType, Result};

use crate::context::Context;
use crate::errors::KIND;
use crate::options::{CoopMatmul, CoopTiles, MatmulTiles, TiledMatmul};

/// One WGSL source file: a family of ops.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Module {
    Elementwise,
    Reduce,
    Rows,
    Matmul,
    Conv,
    Attention,
    Interpolate,
    /// `quant.wgsl`: GGML block-quantized weights (product and dequantize).
    Quant,
    /// `decoder.wgsl`: rotary embedding, strided copy, gather, argmax.
    Decoder,
    /// `quant.wgsl` with the `gemv` entry point for `mr` rows of `x` and `nr`
    /// weight rows per workgroup appended ([`quant_gemv::source`]), reduced by
    /// subgroup operations (`subgroup`: devices with `wgpu::Features::SUBGROUP`)
    /// or in workgroup memory; with `dot`, the `gemv_dot` entry point instead
    /// (`q4_K`, one row of `x`, integer dot products: [`quant_gemv::source_dot`]).
    QuantGemv {
        mr: u32,
        nr: u32,
        subgroup: bool,
        dot: bool,
    },
    /// `rows_register.wgsl` with its entry points for `vpt` vec4s of the row
    /// per invocation appended ([`rows_register::source`]), reduced by
    /// subgroup operations (`subgroup`) or in workgroup memory.
    RowsRegister {
        vpt: u32,
        subgroup: bool,
    },
    /// `matmul_coop.wgsl` with the `matmul_coop` entry point for `tiles` and
    /// the transposes appended ([`coop_matmul::source`]); the output dtype is
    /// the module variant's `Io::output`.
    CoopMatmul {
        tiles: CoopTiles,
        ta: bool,
        tb: bool,
    },
}

pub(crate) mod coop_matmul;
mod quant_gemv;
pub(crate) mod rows_register;

/// The conversions between `f32` and packed `f16`/`bf16` words, prepended to
/// every module built for half operands.
const HALF_WGSL: &str = include_str!("../../../shaders/half.wgsl");

/// How a kernel steps through an operand: four elements at a time (`vec4<f32>`,
/// or `vec2<u32>` of packed halves), or one element at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Unit {
    Vec4,
    Scalar,
    /// Arrays of `u32` words for every dtype, with access to raw bits and to
    /// single values and pairs of values (`decoder.wgsl`; see [`bits_io`]).
    Bits,
}

/// One operand of a module's `@io` block: its name, binding slot, unit,
/// whether kernels write it, and whether it holds the io's output dtype (else
/// its input dtype).
#[derive(Clone, Copy, Debug)]
struct IoOperand {
    name: &'static str,
    binding: u32,
    unit: Unit,
    store: bool,
    output: bool,
}

const fn io(name: &'static str, binding: u32, unit: Unit, store: bool) -> IoOperand {
    IoOperand { name, binding, unit, store, output: store }
}

/// The dtypes of a module's operands: `input` for what the kernels read,
/// `output` for what they write (`f32` for row ops and convolutions, whose
/// half results go through an `f32` temporary, see `plan.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Io {
    pub(crate) input: DType,
    pub(crate) output: DType,
}

impl Io {
    /// Every operand `f32`: the WGSL files as written.
    pub(crate) const F32: Io = Io { input: DType::F32, output: DType::F32 };

    /// Inputs of `input`, outputs of `output`.
    pub(crate) const fn new(input: DType, output: DType) -> Io {
        Io { input, output }
    }
}

/// The WGSL name stem of a half dtype's conversion functions (`shaders/half.wgsl`).
fn half_stem(dtype: DType) -> Option<&'static str> {
    match dtype {
        DType::F16 => Some("f16"),
        DType::BF16 => Some("bf16"),
        _ => None,
    }
}

/// The lines of a module's `@io` block for `io`'s dtypes (without the markers),
/// or why there are none: a dtype without conversions, or a half operand that
/// kernels write one element at a time (two invocations would write one word).
fn io_block(operands: &[IoOperand], io: Io) -> std::result::Result<String, String> {
    let mut out = String::new();
    for o in operands {
        let (n, b) = (o.name, o.binding);
        let dtype = if o.output { io.output } else { io.input };
        let access = if o.store { "read_write" } else { "read" };
        if o.unit == Unit::Bits {
            let function = bits_io(n, dtype, o.store)?;
            out.push_str(&format!("@group(0) @binding({b}) var<storage, {access}> {n}: array<u32>;\n{function}"));
            continue;
        }
        let (array, function) = match (dtype, o.unit, o.store) {
            (DType::F32, Unit::Vec4, false) => {
                ("vec4<f32>", format!("fn load_{n}(j: u32) -> vec4<f32> {{ return {n}[j]; }}"))
            }
            (DType::F32, Unit::Vec4, true) => {
                ("vec4<f32>", format!("fn store_{n}(j: u32, v: vec4<f32>) {{ {n}[j] = v; }}"))
            }
            (DType::F32, Unit::Scalar, false) => ("f32", format!("fn load_{n}(i: u32) -> f32 {{ return {n}[i]; }}")),
            (DType::F32, Unit::Scalar, true) => ("f32", format!("fn store_{n}(i: u32, v: f32) {{ {n}[i] = v; }}")),
            (d, unit, store) => {
                let t = half_stem(d).ok_or_else(|| format!("no WGSL conversions for {d}"))?;
                match (unit, store) {
                    (Unit::Vec4, false) => (
                        "vec2<u32>",
                        format!(
                            "fn load_{n}(j: u32) -> vec4<f32> {{ let w = {n}[j]; return vec4<f32>({t}x2_to_f32(w.x), {t}x2_to_f32(w.y)); }}"
                        ),
                    ),
                    (Unit::Vec4, true) => (
                        "vec2<u32>",
                        format!(
                            "fn store_{n}(j: u32, v: vec4<f32>) {{ {n}[j] = vec2<u32>(f32x2_to_{t}(v.xy), f32x2_to_{t}(v.zw)); }}"
                        ),
                    ),
                    (Unit::Scalar, false) => {
                        ("u32", format!("fn load_{n}(i: u32) -> f32 {{ return {t}_at({n}[i >> 1u], i); }}"))
                    }
                    (Unit::Scalar, true) => {
                        return Err(format!("{n} is written one {d} value at a time, which would race on words"));
                    }
                    (Unit::Bits, _) => return Err(format!("{n}: bits operands are written by bits_io")),
                }
            }
        };
        out.push_str(&format!("@group(0) @binding({b}) var<storage, {access}> {n}: array<{array}>;\n{function}\n"));
    }
    Ok(out)
}

/// The access functions of a [`Unit::Bits`] operand `n` of `dtype` (its
/// declaration aside), one per line. Read: `bits_{n}(i)` (element `i`'s bits,
/// in the low 16 for halves) and `load_{n}(i)` (its value in `f32`). Written:
/// `Y_PACKED` (whether two values share a word), `Y_NAN` (the dtype's NaN
/// bits), `enc_{n}(v)` (an `f32` as the dtype's bits, rounded to nearest
/// even), `put_{n}(i, bits)` (one element: for halves a read and write back of
/// its word, for kernels that own that word in the dispatch) and
/// `put_{n}2(w, lo, hi)` (elements `2w` and `2w + 1`, a whole word for halves).
fn bits_io(n: &str, dtype: DType, store: bool) -> std::result::Result<String, String> {
    let up = n.to_uppercase();
    if dtype == DType::F32 {
        return Ok(if store {
            format!(
                "const {up}_PACKED: bool = false;\nconst {up}_NAN: u32 = 0x7fc00000u;\n\
                 fn enc_{n}(v: f32) -> u32 {{ return bitcast<u32>(v); }}\n\
                 fn put_{n}(i: u32, b: u32) {{ {n}[i] = b; }}\n\
                 fn put_{n}2(w: u32, lo: u32, hi: u32) {{ {n}[2u * w] = lo; {n}[2u * w + 1u] = hi; }}\n"
            )
        } else {
            format!(
                "fn bits_{n}(i: u32) -> u32 {{ return {n}[i]; }}\n\
                 fn load_{n}(i: u32) -> f32 {{ return bitcast<f32>({n}[i]); }}\n"
            )
        });
    }
    let t = half_stem(dtype).ok_or_else(|| format!("no WGSL conversions for {dtype}"))?;
    let nan = if dtype == DType::F16 { "0x7e00u" } else { "0x7fc0u" };
    Ok(if store {
        format!(
            "const {up}_PACKED: bool = true;\nconst {up}_NAN: u32 = {nan};\n\
             fn enc_{n}(v: f32) -> u32 {{ return f32_to_{t}(v); }}\n\
             fn put_{n}(i: u32, b: u32) {{ let s = (i & 1u) * 16u; let w = i >> 1u; \
             {n}[w] = ({n}[w] & ~(0xffffu << s)) | (b << s); }}\n\
             fn put_{n}2(w: u32, lo: u32, hi: u32) {{ {n}[w] = lo | (hi << 16u); }}\n"
        )
    } else {
        format!(
            "fn bits_{n}(i: u32) -> u32 {{ return ({n}[i >> 1u] >> ((i & 1u) * 16u)) & 0xffffu; }}\n\
             fn load_{n}(i: u32) -> f32 {{ return {t}_to_f32(bits_{n}(i)); }}\n"
        )
    })
}

const IO_BEGIN: &str = "// @io-begin\n";
const IO_END: &str = "// @io-end\n";

impl Module {
    fn source(self) -> &'static str {
        match self {
            Module::Elementwise => include_str!("../../../shaders/elementwise.wgsl"),
            Module::Reduce => include_str!("../../../shaders/reduce.wgsl"),
            Module::Rows => include_str!("../../../shaders/rows.wgsl"),
            Module::RowsRegister { .. } => include_str!("../../../shaders/rows_register.wgsl"),
            Module::Matmul => include_str!("../../../shaders/matmul.wgsl"),
            Module::Conv => include_str!("../../../shaders/conv.wgsl"),
            Module::Attention => include_str!("../../../shaders/attention.wgsl"),
            Module::Interpolate => include_str!("../../../shaders/interpolate.wgsl"),
            Module::Quant | Module::QuantGemv { .. } => include_str!("../../../shaders/quant.wgsl"),
            Module::Decoder => include_str!("../../../shaders/decoder.wgsl"),
            Module::CoopMatmul { .. } => include_str!("../../../shaders/matmul_coop.wgsl"),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Module::Elementwise => "elementwise.wgsl",
            Module::Reduce => "reduce.wgsl",
            Module::Rows => "rows.wgsl",
            Module::RowsRegister { .. } => "rows_register.wgsl",
            Module::Matmul => "matmul.wgsl",
            Module::Conv => "conv.wgsl",
            Module::Attention => "attention.wgsl",
            Module::Interpolate => "interpolate.wgsl",
            Module::Quant => "quant.wgsl",
            Module::QuantGemv { .. } => "quant.wgsl+gemv",
            Module::Decoder => "decoder.wgsl",
            Module::CoopMatmul { .. } => "matmul_coop.wgsl",
        }
    }

    /// The operands of the file's `@io` block, in its order.
    fn operands(self) -> &'static [IoOperand] {
        // The epilogue's C₀ and bias hold the output's dtype.
        const ELEMENTWISE: [IoOperand; 5] = [
            io("x", 1, Unit::Vec4, false),
            io("y", 2, Unit::Vec4, true),
            io("b", 3, Unit::Vec4, false),
            IoOperand { name: "c0", binding: 4, unit: Unit::Vec4, store: false, output: true },
            IoOperand { name: "bias", binding: 5, unit: Unit::Scalar, store: false, output: true },
        ];
        const REDUCE: [IoOperand; 2] = [io("x", 1, Unit::Vec4, false), io("b", 2, Unit::Vec4, false)];
        const ROWS: [IoOperand; 4] = [
            io("x", 1, Unit::Scalar, false),
            io("y", 2, Unit::Scalar, true),
            io("gamma", 3, Unit::Scalar, false),
            io("beta", 4, Unit::Scalar, false),
        ];
        const ROWS_REGISTER: [IoOperand; 4] = [
            io("x", 1, Unit::Vec4, false),
            io("y", 2, Unit::Vec4, true),
            io("gamma", 3, Unit::Vec4, false),
            io("beta", 4, Unit::Vec4, false),
        ];
        const CONV: [IoOperand; 3] =
            [io("x", 1, Unit::Scalar, false), io("wt", 2, Unit::Scalar, false), io("y", 3, Unit::Scalar, true)];
        const INTERPOLATE: [IoOperand; 3] =
            [io("a", 1, Unit::Scalar, false), io("y", 2, Unit::Scalar, true), io("b", 3, Unit::Scalar, false)];
        const QUANT: [IoOperand; 2] = [io("x", 1, Unit::Vec4, false), io("y", 2, Unit::Vec4, true)];
        const DECODER: [IoOperand; 2] = [io("x", 1, Unit::Bits, false), io("y", 2, Unit::Bits, true)];
        match self {
            Module::Elementwise => &ELEMENTWISE,
            Module::Reduce => &REDUCE,
            Module::Rows => &ROWS,
            Module::RowsRegister { .. } => &ROWS_REGISTER,
            Module::Conv => &CONV,
            Module::Interpolate => &INTERPOLATE,
            Module::Quant | Module::QuantGemv { .. } => &QUANT,
            Module::Decoder => &DECODER,
            Module::Matmul | Module::Attention | Module::CoopMatmul { .. } => &[],
        }
    }

    /// The WGSL for operands of `io`'s dtypes: the file itself for `f32`
    /// (after `half.wgsl` for a module that [reads f16 fields](Self::reads_f16_fields));
    /// otherwise `half.wgsl` followed by the file with its `@io` block
    /// rewritten ([`io_block`]). Allocates the new text (tens of KiB at most);
    /// an `Err` says why the module has no such variant.
    fn source_for(self, io: Io) -> std::result::Result<Cow<'static, str>, String> {
        if let Module::CoopMatmul { tiles, ta, tb } = self {
            return coop_source(tiles, ta, tb, io);
        }
        let body = self.source_io(io)?;
        if let Module::QuantGemv { mr, nr, subgroup, dot } = self {
            if dot {
                return Ok(Cow::Owned(format!("{body}\n{}", quant_gemv::source_dot(nr))));
            }
            // naga (wgpu 30) takes the subgroup builtins without WGSL's
            // `enable subgroups;`, which it rejects as not implemented; the
            // device must have `wgpu::Features::SUBGROUP`.
            return Ok(Cow::Owned(format!("{body}\n{}", quant_gemv::source(mr, nr, subgroup))));
        }
        if let Module::RowsRegister { vpt, subgroup } = self {
            // Subgroup builtins as for `QuantGemv` above.
            return Ok(Cow::Owned(format!("{body}\n{}", rows_register::source(vpt, subgroup))));
        }
        Ok(body)
    }

    /// Whether the module decodes `f16` fields whatever its operands' dtypes
    /// (the block scales of `quant.wgsl`), so it takes `half.wgsl`'s
    /// `f16_to_f32` (exact for subnormals, which `unpack2x16float` may
    /// flush) for its `f32` variants too.
    fn reads_f16_fields(self) -> bool {
        matches!(self, Module::Quant | Module::QuantGemv { .. })
    }

    /// [`Module::source_for`] without the subgroup additions.
    fn source_io(self, io: Io) -> std::result::Result<Cow<'static, str>, String> {
        let src = self.source();
        if io == Io::F32 {
            if self.reads_f16_fields() {
                return Ok(Cow::Owned(format!("{HALF_WGSL}\n{src}")));
            }
            return Ok(Cow::Borrowed(src));
        }
        let (Some(begin), Some(end)) = (src.find(IO_BEGIN), src.find(IO_END)) else {
            return Err(format!("{} has no @io block for {} → {}", self.name(), io.input, io.output));
        };
        let block = io_block(self.operands(), io)?;
        let head = &src[..begin + IO_BEGIN.len()];
        Ok(Cow::Owned(format!("{HALF_WGSL}\n{head}{block}{}", &src[end..])))
    }
}

/// The end of `matmul_coop.wgsl`'s `enable` directives, after which
/// `half.wgsl` goes (WGSL wants the directives first).
const COOP_ENABLES_END: &str = "enable wgpu_cooperative_matrix;\n";

/// `matmul_coop.wgsl` with `half.wgsl` after its directives and the entry
/// point of `tiles`, the transposes and the output dtype `io.output` (inputs
/// `f16`) appended; an `Err` for other dtypes.
fn coop_source(tiles: CoopTiles, ta: bool, tb: bool, io: Io) -> std::result::Result<Cow<'static, str>, String> {
    if io.input != DType::F16 || !matches!(io.output, DType::F32 | DType::F16 | DType::BF16) {
        return Err(format!("matmul_coop.wgsl has no variant for {} → {}", io.input, io.output));
    }
    let file = Module::CoopMatmul { tiles, ta, tb }.source();
    let at = file.find(COOP_ENABLES_END).map(|i| i + COOP_ENABLES_END.len()).ok_or("no enable directives")?;
    let entry = coop_matmul::source(tiles, ta, tb, io.output);
    Ok(Cow::Owned(format!("{}{HALF_WGSL}\n{}\n{entry}", &file[..at], &file[at..])))
}

/// The WGSL module the backend compiles for the cooperative-matrix matmul of
/// configuration `tiles` (`f16` inputs, transposes `trans_a`, `trans_b`,
/// output `out`: `f32`, `f16` or `bf16`; entry point `matmul_coop`), for
/// looking at what a shader compiler makes of it. Generates tens of KiB of
/// text; a `Compile` error for other output dtypes.
pub fn coop_matmul_wgsl(tiles: CoopTiles, trans_a: bool, trans_b: bool, out: DType) -> Result<String> {
    coop_source(tiles, trans_a, trans_b, Io::new(DType::F16, out))
        .map(Cow::into_owned)
        .map_err(|e| compile_error("matmul_coop", e))
}

/// The matmul entry points of `matmul.wgsl`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum MatmulKernel {
    /// `matmul_small`: 64 × 64 tiles, 4 × 4 per invocation.
    Small,
    /// `matmul_tiled` in the given configuration.
    Tiled(TiledMatmul),
}

impl MatmulKernel {
    /// Rows and columns of C per workgroup.
    pub(crate) fn tile(self) -> (u64, u64) {
        match self {
            MatmulKernel::Small => (64, 64),
            MatmulKernel::Tiled(t) => t.tile(),
        }
    }
}

/// Which operands of a matmul move as vec4s (`matmul.wgsl`'s `VA`, `VB`,
/// `VC`); the others element by element.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Vec4s {
    /// A is read in vec4s (its contiguous dimension, k or m when transposed, is a multiple of 4).
    pub(crate) a: bool,
    /// B is read in vec4s (n, or k when transposed, is a multiple of 4).
    pub(crate) b: bool,
    /// C is written in vec4s (n is a multiple of 4).
    pub(crate) c: bool,
}

impl Vec4s {
    /// Every operand in vec4s.
    #[cfg(test)]
    pub(crate) const ALL: Vec4s = Vec4s { a: true, b: true, c: true };

    /// What the layout of an `m × k` by `k × n` product (transposes `ta`,
    /// `tb`) allows. Free.
    pub(crate) fn for_shape(m: usize, k: usize, n: usize, ta: bool, tb: bool) -> Vec4s {
        Vec4s {
            a: (if ta { m } else { k }).is_multiple_of(4),
            b: (if tb { k } else { n }).is_multiple_of(4),
            c: n.is_multiple_of(4),
        }
    }
}

/// One compute pipeline: an entry point with its constants and dtypes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Kernel {
    /// `elementwise.wgsl` `unary`, op code, on data of `dtype`.
    Unary(u32, DType),
    /// `elementwise.wgsl` `binary`, op code (3: lerp), on data of `dtype`.
    Binary(u32, DType),
    /// `elementwise.wgsl` `convert` from `x`'s dtype to `y`'s (two different dtypes).
    Cast { from: DType, to: DType },
    /// `elementwise.wgsl` `epilogue`: a matmul's epilogue on its `f32`
    /// product, with the unary op code of its activation (if any), writing
    /// (and reading C₀ and the bias in) dtype `out`.
    Epilogue { act: Option<u32>, out: DType },
    /// `reduce.wgsl` `partials`, op code, on inputs of `dtype`.
    ReducePartials(u32, DType),
    /// `reduce.wgsl` `finish`, op code (`f32` partials).
    ReduceFinish(u32),
    /// `rows.wgsl` `softmax` (0 softmax, 1 log_softmax) on inputs of `dtype`,
    /// writing `f32` when `dtype` is a half type.
    Softmax(u32, DType),
    /// `rows.wgsl` `layer_norm` (dtypes as for `Softmax`).
    LayerNorm(DType),
    /// `rows.wgsl` `rms_norm` (dtypes as for `Softmax`).
    RmsNorm(DType),
    /// `rows_register.wgsl` for rows of `vpt` vec4s per invocation: `op` 0
    /// softmax, 1 log_softmax (`softmax_reg`), 2 layer_norm, 3 rms_norm; on
    /// inputs of `dtype`, writing `f32`; reduced by subgroup operations with
    /// `subgroup`.
    RowsRegister { op: u32, vpt: u32, subgroup: bool, dtype: DType },
    /// `matmul.wgsl` (`f32` only): which tiling, transposes, which operands
    /// move as vec4s; `checked`: compiled with naga's runtime bounds checks.
    Matmul { tiles: MatmulKernel, ta: bool, tb: bool, vec: Vec4s, checked: bool },
    /// `matmul_coop.wgsl` `matmul_coop` (cooperative matrices): `f16` A and
    /// B, C of dtype `out` (`f32`, `f16` with n even, `bf16` with n even);
    /// `checked`: compiled with naga's runtime bounds checks.
    CoopMatmul { tiles: CoopTiles, ta: bool, tb: bool, out: DType, checked: bool },
    /// `matmul.wgsl` `matmul_reduce`: sums `sk` split-K partials into C;
    /// `checked` as for the matmul it finishes (same module).
    MatmulReduce { sk: u32, checked: bool },
    /// `conv.wgsl` `conv2d` on inputs of `dtype`, writing `f32`.
    Conv2d(DType),
    /// `interpolate.wgsl` `slerp` on inputs of `dtype`, writing `f32`.
    Slerp(DType),
    /// `attention.wgsl` (`f32` only): `dv` vec4 groups of output columns per
    /// invocation (a slice of 64·`dv` columns, 1..=4), head_dim chunks of `ck`
    /// for Q·Kᵀ and key chunks of `cv` for P·V (`plan::attention_chunk_choices`);
    /// `checked`: compiled with naga's runtime bounds checks; `positions`:
    /// `attention_at`, the key count of each sequence from its query positions.
    Attention { dv: u32, ck: u32, cv: u32, checked: bool, positions: bool },
    /// `quant.wgsl` `gemv` (or `gemv_subgroup`: `subgroup`) for weights of
    /// `format`: `mr` rows of x of dtype `x` per pass, `nr` weight rows per
    /// workgroup, writing `f32`; with `dot`, `gemv_dot` (`q4_K`, `mr` 1).
    QuantGemv { format: BlockFormat, mr: u32, nr: u32, x: DType, subgroup: bool, dot: bool },
    /// `quant.wgsl` `dequant`: blocks of `format` into values of dtype `to`.
    Dequant { format: BlockFormat, to: DType },
    /// `decoder.wgsl` `rope` in `mode` (its `MODE`: 0 a pair, 1 two half-split
    /// pairs, 2 a word per invocation) on data of `dtype`; `positions`:
    /// `rope_at`, each token's position read from the positions binding.
    Rope { mode: u32, dtype: DType, positions: bool },
    /// `decoder.wgsl` `copy` in `mode` (0 an element, 1 an element of one
    /// destination parity, 2 a word per invocation) on data of `dtype`;
    /// `positions`: `copy_at`, each source row's destination slot read from
    /// the positions binding.
    Copy { mode: u32, dtype: DType, positions: bool },
    /// `decoder.wgsl` `gather` in `mode` (0 an element, 1 a word per
    /// invocation) on a table and output of `dtype`.
    Gather { mode: u32, dtype: DType },
    /// `decoder.wgsl` `argmax` on inputs of `dtype`, writing `f32`.
    ArgMax(DType),
}

/// The `FMT` code of `quant.wgsl` for a block format (`None`: no kernels).
pub(crate) fn quant_code(format: BlockFormat) -> Option<u32> {
    match format {
        BlockFormat::Q4K => Some(0),
        BlockFormat::Q5K => Some(1),
        BlockFormat::Q6K => Some(2),
        BlockFormat::Q8_0 => Some(3),
        _ => None,
    }
}

impl Kernel {
    fn module(self) -> Module {
        match self {
            Kernel::Unary(..) | Kernel::Binary(..) | Kernel::Cast { .. } | Kernel::Epilogue { .. } => {
                Module::Elementwise
            }
            Kernel::ReducePartials(..) | Kernel::ReduceFinish(_) => Module::Reduce,
            Kernel::Softmax(..) | Kernel::LayerNorm(_) | Kernel::RmsNorm(_) => Module::Rows,
            Kernel::RowsRegister { vpt, subgroup, .. } => Module::RowsRegister { vpt, subgroup },
            Kernel::Matmul { .. } | Kernel::MatmulReduce { .. } => Module::Matmul,
            Kernel::Conv2d(_) => Module::Conv,
            Kernel::Attention { .. } => Module::Attention,
            Kernel::Slerp(_) => Module::Interpolate,
            Kernel::QuantGemv { mr, nr, subgroup, dot, .. } => Module::QuantGemv { mr, nr, subgroup, dot },
            Kernel::CoopMatmul { tiles, ta, tb, .. } => Module::CoopMatmul { tiles, ta, tb },
            Kernel::Dequant { .. } => Module::Quant,
            Kernel::Rope { .. } | Kernel::Copy { .. } | Kernel::Gather { .. } | Kernel::ArgMax(_) => Module::Decoder,
        }
    }

    /// The dtypes of the module variant this kernel lives in.
    pub(crate) fn io(self) -> Io {
        match self {
            Kernel::Unary(_, d)
            | Kernel::Binary(_, d)
            | Kernel::Rope { dtype: d, .. }
            | Kernel::Copy { dtype: d, .. }
            | Kernel::Gather { dtype: d, .. } => Io::new(d, d),
            Kernel::Cast { from, to } => Io::new(from, to),
            Kernel::Epilogue { out, .. } => Io::new(DType::F32, out),
            Kernel::ReducePartials(_, d)
            | Kernel::Softmax(_, d)
            | Kernel::LayerNorm(d)
            | Kernel::RmsNorm(d)
            | Kernel::RowsRegister { dtype: d, .. }
            | Kernel::Conv2d(d)
            | Kernel::Slerp(d)
            | Kernel::QuantGemv { x: d, .. }
            | Kernel::ArgMax(d) => Io::new(d, DType::F32),
            Kernel::Dequant { to, .. } => Io::new(DType::F32, to),
            Kernel::CoopMatmul { out, .. } => Io::new(DType::F16, out),
            Kernel::ReduceFinish(_)
            | Kernel::Matmul { .. }
            | Kernel::MatmulReduce { .. }
            | Kernel::Attention { .. } => Io::F32,
        }
    }

    /// The entry point's name in its WGSL.
    pub(crate) fn entry(self) -> &'static str {
        match self {
            Kernel::Unary(..) => "unary",
            Kernel::Binary(..) => "binary",
            Kernel::Cast { .. } => "convert",
            Kernel::Epilogue { .. } => "epilogue",
            Kernel::ReducePartials(..) => "partials",
            Kernel::ReduceFinish(_) => "finish",
            Kernel::Softmax(..) => "softmax",
            Kernel::LayerNorm(_) => "layer_norm",
            Kernel::RmsNorm(_) => "rms_norm",
            Kernel::RowsRegister { op: 0 | 1, .. } => "softmax_reg",
            Kernel::RowsRegister { op: 2, .. } => "layer_norm_reg",
            Kernel::RowsRegister { .. } => "rms_norm_reg",
            Kernel::Matmul { tiles: MatmulKernel::Small, .. } => "matmul_small",
            Kernel::Matmul { tiles: MatmulKernel::Tiled(_), .. } => "matmul_tiled",
            Kernel::MatmulReduce { .. } => "matmul_reduce",
            Kernel::CoopMatmul { .. } => "matmul_coop",
            Kernel::Conv2d(_) => "conv2d",
            Kernel::Attention { positions: false, .. } => "attention",
            Kernel::Attention { positions: true, .. } => "attention_at",
            Kernel::Slerp(_) => "slerp",
            Kernel::QuantGemv { dot: true, .. } => "gemv_dot",
            Kernel::QuantGemv { subgroup: false, .. } => "gemv",
            Kernel::QuantGemv { subgroup: true, .. } => "gemv_subgroup",
            Kernel::Dequant { .. } => "dequant",
            Kernel::Rope { positions: false, .. } => "rope",
            Kernel::Rope { positions: true, .. } => "rope_at",
            Kernel::Copy { positions: false, .. } => "copy",
            Kernel::Copy { positions: true, .. } => "copy_at",
            Kernel::Gather { .. } => "gather",
            Kernel::ArgMax(_) => "argmax",
        }
    }

    fn constants(self) -> Vec<(&'static str, f64)> {
        let flag = |b: bool| if b { 1.0 } else { 0.0 };
        match self {
            Kernel::Unary(op, _)
            | Kernel::Binary(op, _)
            | Kernel::ReducePartials(op, _)
            | Kernel::ReduceFinish(op)
            | Kernel::Softmax(op, _)
            | Kernel::RowsRegister { op: op @ (0 | 1), .. } => vec![("OP", f64::from(op))],
            Kernel::Matmul { ta, tb, vec, tiles, .. } => {
                let mut c = vec![
                    ("TA", flag(ta)),
                    ("TB", flag(tb)),
                    ("VA", flag(vec.a)),
                    ("VB", flag(vec.b)),
                    ("VC", flag(vec.c)),
                ];
                if let MatmulKernel::Tiled(t) = tiles {
                    c.extend(t.override_constants());
                }
                c
            }
            Kernel::MatmulReduce { sk, .. } => vec![("SK", f64::from(sk))],
            Kernel::Epilogue { act: Some(op), .. } => vec![("OP", f64::from(op)), ("ACT", 1.0)],
            Kernel::Epilogue { act: None, .. } => Vec::new(),
            Kernel::Rope { mode, .. } | Kernel::Copy { mode, .. } | Kernel::Gather { mode, .. } => {
                vec![("MODE", f64::from(mode))]
            }
            Kernel::Attention { dv, ck, cv, .. } => {
                vec![("DV", f64::from(dv)), ("CK", f64::from(ck)), ("CV", f64::from(cv))]
            }
            Kernel::QuantGemv { format, .. } | Kernel::Dequant { format, .. } => {
                vec![("FMT", f64::from(quant_code(format).unwrap_or(0)))]
            }
            Kernel::LayerNorm(_)
            | Kernel::RmsNorm(_)
            | Kernel::RowsRegister { .. }
            | Kernel::Conv2d(_)
            | Kernel::Cast { .. }
            | Kernel::Slerp(_)
            | Kernel::CoopMatmul { .. }
            | Kernel::ArgMax(_) => Vec::new(),
        }
    }

    /// Whether this kernel's module is compiled without naga's runtime checks.
    fn unchecked(self) -> bool {
        matches!(
            self,
            Kernel::Matmul { checked: false, .. }
                | Kernel::MatmulReduce { checked: false, .. }
                | Kernel::CoopMatmul { checked: false, .. }
                | Kernel::Attention { checked: false, .. }
                | Kernel::QuantGemv { dot: true, .. }
        )
    }

    /// The module variant (file, dtypes, checks) this kernel's pipeline is built from.
    fn variant(self) -> ModuleKey {
        (self.module(), self.io(), self.unchecked())
    }
}

/// A shader module as compiled: the file, its operands' dtypes, and whether
/// naga's runtime checks are off.
type ModuleKey = (Module, Io, bool);

/// A compiled pipeline and its bind group layout (group 0).
#[derive(Clone, Debug)]
pub(crate) struct Compiled {
    pub(crate) pipeline: wgpu::ComputePipeline,
    pub(crate) layout: wgpu::BindGroupLayout,
}

/// How matmuls are compiled: naga's checks, tiling, cooperative matrices.
/// Switchable while the device lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MatmulChoice {
    /// Whether matmul keeps naga's runtime bounds checks.
    pub(crate) checked: bool,
    /// Which tiling the `f32` kernels use.
    pub(crate) tiles: MatmulTiles,
    /// Which cooperative-matrix configuration `f16` matmuls take (on devices that have them).
    pub(crate) coop: CoopMatmul,
}

/// Per-device cache of shader modules and pipelines.
#[derive(Debug)]
pub(crate) struct Kernels {
    matmul: Mutex<MatmulChoice>,
    modules: Mutex<HashMap<ModuleKey, wgpu::ShaderModule>>,
    pipelines: Mutex<HashMap<Kernel, Compiled>>,
    /// Kernels whose pipeline the device refused ([`Kernels::compiles`]).
    refused: Mutex<HashSet<Kernel>>,
}

fn compile_error(kernel: &str, e: impl std::fmt::Display) -> ComputeError {
    ComputeError::Compile { backend: KIND, kernel: kernel.to_string(), message: e.to_string() }
}

impl Kernels {
    pub(crate) fn new(matmul: MatmulChoice) -> Self {
        Kernels {
            matmul: Mutex::new(matmul),
            modules: Mutex::new(HashMap::new()),
            pipelines: Mutex::new(HashMap::new()),
            refused: Mutex::new(HashSet::new()),
        }
    }

    /// Whether `kernel`'s pipeline compiles on this device: compiles it on first
    /// use (as [`Kernels::get`]) and remembers a refusal, so that a planner can
    /// take another kernel instead of failing the op (the cooperative-matrix
    /// kernel, whose extension is experimental in wgpu and in drivers).
    pub(crate) fn compiles(&self, ctx: &Context, kernel: Kernel) -> bool {
        if self.refused.lock().is_ok_and(|r| r.contains(&kernel)) {
            return false;
        }
        match self.get(ctx, kernel) {
            Ok(_) => true,
            Err(_) => {
                if let Ok(mut r) = self.refused.lock() {
                    r.insert(kernel);
                }
                false
            }
        }
    }

    /// The current matmul choice.
    pub(crate) fn matmul(&self) -> MatmulChoice {
        match self.matmul.lock() {
            Ok(m) => *m,
            Err(poisoned) => *poisoned.into_inner(),
        }
    }

    /// Changes the matmul choice for ops planned from now on.
    pub(crate) fn set_matmul(&self, choice: MatmulChoice) {
        match self.matmul.lock() {
            Ok(mut m) => *m = choice,
            Err(poisoned) => *poisoned.into_inner() = choice,
        }
    }

    /// The pipeline for `kernel`, compiled on first use (milliseconds; a cache hit costs a map lookup).
    pub(crate) fn get(&self, ctx: &Context, kernel: Kernel) -> Result<Compiled> {
        let poisoned = |_| compile_error(kernel.entry(), "pipeline cache lock poisoned");
        if let Some(c) = self.pipelines.lock().map_err(poisoned)?.get(&kernel) {
            return Ok(c.clone());
        }
        let module = self.module(ctx, kernel.variant())?;
        let constants = kernel.constants();
        let scope = ctx.scope();
        let pipeline = ctx.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(kernel.entry()),
            layout: None,
            module: &module,
            entry_point: Some(kernel.entry()),
            compilation_options: wgpu::PipelineCompilationOptions {
                constants: &constants,
                // Every kernel writes its workgroup memory before reading it.
                zero_initialize_workgroup_memory: false,
            },
            cache: None,
        });
        let layout = pipeline.get_bind_group_layout(0);
        scope.end_now("compile", 0).map_err(|e| compile_error(kernel.entry(), e))?;
        let compiled = Compiled { pipeline, layout };
        self.pipelines.lock().map_err(poisoned)?.insert(kernel, compiled.clone());
        Ok(compiled)
    }

    /// Whether every kernel of `kernels` has its pipeline compiled. One lock.
    pub(crate) fn has_all(&self, kernels: &[Kernel]) -> Result<bool> {
        let have = self.pipelines.lock().map_err(|_| compile_error("prepare", "pipeline cache lock poisoned"))?;
        Ok(kernels.iter().all(|k| have.contains_key(k)))
    }

    /// Compiles every kernel of `kernels` not compiled yet: first their shader
    /// modules, then their pipelines, each stage on up to [`COMPILE_THREADS`]
    /// threads (one at a time in the browser). Costs what their first uses
    /// would, spread over the threads; nothing when all are cached.
    pub(crate) fn compile_all(&self, ctx: &Context, kernels: &[Kernel]) -> Result<()> {
        let poisoned = |_| compile_error("prepare", "pipeline cache lock poisoned");
        let missing: Vec<Kernel> = {
            let have = self.pipelines.lock().map_err(poisoned)?;
            let mut seen = HashSet::new();
            kernels.iter().copied().filter(|k| !have.contains_key(k) && seen.insert(*k)).collect()
        };
        let mut seen = HashSet::new();
        let modules: Vec<ModuleKey> = missing.iter().map(|k| k.variant()).filter(|m| seen.insert(*m)).collect();
        on_threads(&modules, |&key| self.module(ctx, key).map(drop))?;
        on_threads(&missing, |&k| self.get(ctx, k).map(drop))
    }

    /// The shader module of `key`, compiled on first use (the WGSL of a half
    /// variant is generated then: see [`Module::source_for`]).
    fn module(&self, ctx: &Context, key: ModuleKey) -> Result<wgpu::ShaderModule> {
        let (module, io, unchecked) = key;
        let poisoned = |_| compile_error(module.name(), "module cache lock poisoned");
        if let Some(m) = self.modules.lock().map_err(poisoned)?.get(&key) {
            return Ok(m.clone());
        }
        let source = module.source_for(io).map_err(|e| compile_error(module.name(), e))?;
        let desc =
            wgpu::ShaderModuleDescriptor { label: Some(module.name()), source: wgpu::ShaderSource::Wgsl(source) };
        let scope = ctx.scope();
        let compiled = if unchecked {
            // SAFETY: only `matmul.wgsl`, `attention.wgsl` and the `gemv_dot` entry point of
            // `quant.wgsl` are compiled unchecked. `gemv_dot` (`kernels/quant_gemv.rs`,
            // `source_dot`): the host binds x and the f32 y whole (m × k and m × n values) and
            // each piece's weight rows whole (`plan/quant.rs`, `gemv`), with k a multiple of
            // 256, m0 < m, j0 + n ≤ the row of y; the kernel clamps weight rows to n − 1 and
            // pairs to k/64 − 1, reads x only at 16-value groups that start below k, writes y
            // only for rows below n, indexes its 128-entry workgroup arrays with the
            // invocation index and with groups g..g + 3, g clamped to 124, and `red` below
            // 128 · NR / 4 ≤ its 2048 entries (NR ≤ 64); its loops run k / 2048 and 32 steps.
            // `attention.wgsl`: see its header ("Bounds"); the host binds each piece's q,
            // k, v and output whole for the heads it dispatches (`plan.rs`, `attention`),
            // tells the kernel that many workgroups, and picks only the constants that
            // `plan::attention_chunk_choices` allows. `matmul.wgsl`: its kernels compare every
            // global index against the matrix extents (m, k, n) before using it (also the
            // loads of `matmul_tiled` past the last K step; with split-K the loads compare k
            // against the end of the workgroup's slice, which is at most k; its regrouped tile
            // coordinates stay inside the grid), the host validates that each binding holds
            // the batch × extents it is told (`plan.rs`; for split-K the scratch binding holds
            // exactly the grid's matrices · slices partial matrices that the tiled kernel
            // writes and `matmul_reduce` reads, and `matmul_reduce` skips invocations past the
            // vec4s it is told, whose C range the host checks), workgroup indices are below the
            // arrays' sizes by construction (bounds stated in the shader), private arrays
            // (accumulators, loads in flight) are indexed by literals only, and every loop
            // runs a finite number of steps bounded by k. So no access can leave its binding
            // and no loop can run forever: the two things the dropped checks guard against.
            unsafe { ctx.device.create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked()) }
        } else {
            ctx.device.create_shader_module(desc)
        };
        scope.end_now("compile", 0).map_err(|e| compile_error(module.name(), e))?;
        self.modules.lock().map_err(poisoned)?.insert(key, compiled.clone());
        Ok(compiled)
    }
}

/// Most threads [`Kernels::compile_all`] compiles on. Measured on the H200
/// (NVIDIA Vulkan driver 580, its pipeline cache emptied, CUDA's warm): the
/// calibration ladders' pipelines took 0.47 s on one thread and 0.21 s on 8
/// (one run each), which then hides under the CUDA backend's own compiles.
pub(crate) const COMPILE_THREADS: usize = 8;

/// Runs `f` on every item, on up to [`COMPILE_THREADS`] threads (the items
/// dealt round-robin); the first error wins. In the browser, one after the other.
fn on_threads<T: Sync>(items: &[T], f: impl Fn(&T) -> Result<()> + Sync) -> Result<()> {
    let threads = COMPILE_THREADS.min(items.len());
    if cfg!(target_arch = "wasm32") || threads <= 1 {
        return items.iter().try_for_each(f);
    }
    std::thread::scope(|scope| {
        let f = &f;
        let handles: Vec<_> =
            (0..threads).map(|t| scope.spawn(move || items.iter().skip(t).step_by(threads).try_for_each(f))).collect();
        handles
            .into_iter()
            .try_for_each(|h| h.join().unwrap_or_else(|_| Err(compile_error("prepare", "a compiling thread panicked"))))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MODULES: [Module; 22] = [
        Module::Elementwise,
        Module::Decoder,
        Module::Reduce,
        Module::Rows,
        Module::Matmul,
        Module::Conv,
        Module::Attention,
        Module::Interpolate,
        Module::Quant,
        Module::QuantGemv { mr: 1, nr: 4, subgroup: false, dot: false },
        Module::QuantGemv { mr: 16, nr: 4, subgroup: true, dot: false },
        Module::QuantGemv { mr: 1, nr: 4, subgroup: false, dot: true },
        Module::QuantGemv { mr: 1, nr: 16, subgroup: false, dot: true },
        Module::RowsRegister { vpt: 1, subgroup: false },
        Module::RowsRegister { vpt: 1, subgroup: true },
        Module::RowsRegister { vpt: 2, subgroup: false },
        Module::RowsRegister { vpt: 3, subgroup: true },
        Module::RowsRegister { vpt: 4, subgroup: false },
        Module::RowsRegister { vpt: 4, subgroup: true },
        Module::RowsRegister { vpt: 8, subgroup: false },
        Module::RowsRegister { vpt: 8, subgroup: true },
        Module::CoopMatmul { tiles: CoopTiles::AUTO_LARGE, ta: false, tb: true },
    ];

    /// naga's capabilities for validating `m` (subgroup operations for the
    /// subgroup variant; for cooperative matrices what the device is opened
    /// with: `f16`, subgroups and their barrier).
    fn capabilities(m: Module) -> naga::valid::Capabilities {
        use naga::valid::Capabilities as C;
        match m {
            Module::QuantGemv { subgroup: true, .. } | Module::RowsRegister { subgroup: true, .. } => C::SUBGROUP,
            Module::CoopMatmul { .. } => C::COOPERATIVE_MATRIX | C::SHADER_FLOAT16 | C::SUBGROUP | C::SUBGROUP_BARRIER,
            _ => C::default(),
        }
    }

    /// Every module variant the backend builds: element-wise ops and casts
    /// between any two dtypes, the other families on inputs of any dtype
    /// writing `f32`, matmul on `f32` only.
    fn variants() -> Vec<(Module, Io)> {
        let mut v = Vec::new();
        for m in MODULES {
            for input in DType::ALL {
                for output in DType::ALL {
                    let used = match m {
                        Module::Elementwise => true,
                        Module::Matmul | Module::Attention => input == DType::F32 && output == DType::F32,
                        Module::CoopMatmul { .. } => {
                            input == DType::F16 && matches!(output, DType::F32 | DType::F16 | DType::BF16)
                        }
                        Module::Reduce
                        | Module::Rows
                        | Module::RowsRegister { .. }
                        | Module::Conv
                        | Module::Interpolate => output == DType::F32,
                        // The product reads x of any dtype and writes f32; dequantize writes any dtype.
                        Module::Quant => input == DType::F32 || output == DType::F32,
                        Module::QuantGemv { .. } => output == DType::F32,
                        // Rope, copy and gather in one dtype; argmax writes f32.
                        Module::Decoder => output == input || output == DType::F32,
                    };
                    if used {
                        v.push((m, Io::new(input, output)));
                    }
                }
            }
        }
        v
    }

    #[test]
    fn every_module_variant_parses_and_validates_with_naga() {
        // Every GPU test compiles the shaders too; this catches WGSL errors on machines without a GPU.
        let variants = variants();
        // The last term: the two `gemv_dot` modules, x of each dtype.
        assert_eq!(variants.len(), 9 + 4 * 3 + 1 + 1 + 5 + 3 + 3 + 5 + 8 * 3 + 3 + 2 * 3);
        for (m, io) in variants {
            let source = m.source_for(io).unwrap_or_else(|e| panic!("{} for {io:?}: {e}", m.name()));
            let what = format!("{} for {} → {}", m.name(), io.input, io.output);
            let module = naga::front::wgsl::parse_str(&source)
                .unwrap_or_else(|e| panic!("{what} does not parse:\n{}", e.emit_to_string(&source)));
            let mut validator = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), capabilities(m));
            if let Err(e) = validator.validate(&module) {
                panic!("{what} does not validate:\n{}", e.emit_to_string(&source));
            }
            assert!(!module.entry_points.is_empty(), "{what} has no entry point");
        }
    }

    #[test]
    fn the_f32_io_blocks_are_the_ones_in_the_files() {
        for m in MODULES {
            let src = m.source();
            if m.operands().is_empty() {
                assert!(!src.contains(IO_BEGIN), "{}", m.name());
                continue;
            }
            let begin = src.find(IO_BEGIN).map(|b| b + IO_BEGIN.len()).expect("an @io-begin line");
            let end = src.find(IO_END).expect("an @io-end line");
            assert_eq!(io_block(m.operands(), Io::F32).unwrap(), &src[begin..end], "{}", m.name());
        }
        // Halves written one at a time would race on their words: no such variant.
        assert!(Module::Rows.source_for(Io::new(DType::F16, DType::F16)).is_err());
        assert!(Module::Conv.source_for(Io::new(DType::BF16, DType::BF16)).is_err());
        let cast = Module::Elementwise.source_for(Io::new(DType::F32, DType::BF16)).unwrap();
        assert!(cast.contains("var<storage, read_write> y: array<vec2<u32>>;"), "{cast}");
        assert!(cast.contains("var<storage, read> x: array<vec4<f32>>;"), "{cast}");
    }

    /// The integer conversions of `half.wgsl`, mirrored step for step in Rust
    /// and checked against the `half` crate on every f16 value and on a sweep
    /// of f32 bit patterns, so a slip in the rounding shows up without a GPU.
    /// (The GPU runs the WGSL itself in the conformance suite's casts.)
    #[test]
    fn the_integer_conversions_round_like_the_half_crate() {
        fn f16_to_f32(h: u32) -> f32 {
            let s = (h & 0x8000) << 16;
            let e = (h >> 10) & 0x1f;
            let m = h & 0x3ff;
            let mut bits = s | ((e + 112) << 23) | (m << 13);
            if e == 0x1f {
                bits = s | 0x7f80_0000 | (m << 13);
            } else if e == 0 {
                let t = 31 - m.max(1).leading_zeros();
                let sub = ((t + 103) << 23) | ((m << (23 - t)) & 0x7f_ffff);
                bits = if m == 0 { s } else { s | sub };
            }
            f32::from_bits(bits)
        }
        fn f32_to_f16(x: f32) -> u32 {
            let b = x.to_bits();
            let s = (b >> 16) & 0x8000;
            let a = b & 0x7fff_ffff;
            if a > 0x7f80_0000 {
                return s | 0x7e00 | ((a >> 13) & 0x3ff);
            }
            if a >= 0x477f_f000 {
                return s | 0x7c00;
            }
            if a >= 0x3880_0000 {
                return s | ((a + 0x0fff + ((a >> 13) & 1) - 0x3800_0000) >> 13);
            }
            if a <= 0x3300_0000 {
                return s;
            }
            let e = a >> 23;
            let m = (a & 0x7f_ffff) | 0x80_0000;
            let sh = 126 - e;
            let (q, r, half) = (m >> sh, m & ((1 << sh) - 1), 1 << (sh - 1));
            s | (q + u32::from(r > half || (r == half && q & 1 == 1)))
        }
        fn f32_to_bf16(x: f32) -> u32 {
            let b = x.to_bits();
            if b & 0x7fff_ffff > 0x7f80_0000 {
                return (b >> 16) | 0x40;
            }
            b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16
        }
        for h in 0..=0xffffu32 {
            let want = compute_core::f16::from_bits(h as u16).to_f32();
            let got = f16_to_f32(h);
            assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()), "f16 {h:#06x}");
        }
        // Every 2^8-th f32 bit pattern, plus each one's neighbours (ties and
        // their next values sit on multiples of 2^12 and 2^15 in the low bits).
        let mut b = 0u32;
        loop {
            for x in [b, b.wrapping_add(1), b.wrapping_sub(1)].map(f32::from_bits) {
                let (h, bf) = (f32_to_f16(x), f32_to_bf16(x));
                if x.is_nan() {
                    assert!(
                        compute_core::f16::from_bits(h as u16).is_nan()
                            && compute_core::bf16::from_bits(bf as u16).is_nan()
                    );
                } else {
                    assert_eq!(h as u16, compute_core::f16::from_f32(x).to_bits(), "f16 of {x:e} ({:#x})", x.to_bits());
                    assert_eq!(bf as u16, compute_core::bf16::from_f32(x).to_bits(), "bf16 of {x:e}");
                }
            }
            match b.checked_add(1 << 8) {
                Some(n) => b = n,
                None => break,
            }
        }
        // The WGSL holds the same steps (the constants this test mirrors).
        for needle in ["0x477ff000u", "0x38800000u", "0x33000000u", "a + 0x0fffu + ((a >> 13u) & 1u) - 0x38000000u"] {
            assert!(HALF_WGSL.contains(needle), "{needle}");
        }
    }

    /// Every attention variant the host can pick, with its constants applied
    /// as wgpu applies them, validates, and declares exactly the workgroup
    /// memory `plan.rs` checks against the device's limit.
    #[test]
    fn attention_variants_validate_and_declare_the_workgroup_memory_planned() {
        let source = Module::Attention.source();
        let module = naga::front::wgsl::parse_str(source).expect("attention.wgsl parses");
        let flags = naga::valid::ValidationFlags::all();
        let info = naga::valid::Validator::new(flags, naga::valid::Capabilities::default())
            .validate(&module)
            .expect("attention.wgsl validates");
        for dv in 1..=4 {
            for (ck, cv) in crate::plan::attention_chunk_choices(dv) {
                for positions in [false, true] {
                    let kernel = Kernel::Attention { dv, ck, cv, checked: false, positions };
                    let mut constants = naga::back::PipelineConstants::default();
                    for (name, value) in kernel.constants() {
                        constants.insert(name.to_string(), value);
                    }
                    let entry = Some((naga::ShaderStage::Compute, kernel.entry()));
                    let (resolved, _) =
                        naga::back::pipeline_constants::process_overrides(&module, &info, entry, &constants)
                            .unwrap_or_else(|e| panic!("{kernel:?}: {e}"));
                    naga::valid::Validator::new(flags, naga::valid::Capabilities::default())
                        .validate(&resolved)
                        .unwrap_or_else(|e| panic!("{kernel:?} does not validate: {e}"));
                    let bytes: u64 = resolved
                        .global_variables
                        .iter()
                        .filter(|(_, g)| g.space == naga::AddressSpace::WorkGroup)
                        .map(|(_, g)| u64::from(resolved.types[g.ty].inner.size(resolved.to_ctx())))
                        .sum();
                    let planned = crate::plan::attention_workgroup_bytes(dv.into(), ck.into(), cv.into(), positions);
                    assert_eq!(bytes, planned, "{kernel:?}");
                }
            }
        }
    }

    /// Every quantized-product and dequantize pipeline the host can pick, with
    /// its constants applied as wgpu applies them, validates.
    #[test]
    fn quant_variants_validate_with_their_constants() {
        let mut kernels = Vec::new();
        for format in [BlockFormat::Q4K, BlockFormat::Q5K, BlockFormat::Q6K, BlockFormat::Q8_0] {
            for (mr, nr) in crate::plan::quant::GEMV_SHAPES {
                for subgroup in [false, true] {
                    kernels.push(Kernel::QuantGemv { format, mr, nr, x: DType::BF16, subgroup, dot: false });
                }
            }
            kernels.push(Kernel::Dequant { format, to: DType::F16 });
        }
        for nr in crate::plan::quant::DOT_ROWS {
            for x in DType::ALL {
                kernels.push(Kernel::QuantGemv { format: BlockFormat::Q4K, mr: 1, nr, x, subgroup: false, dot: true });
            }
        }
        assert_eq!(quant_code(BlockFormat::Q8K), None);
        kernels.into_iter().for_each(validates_with_constants);
    }

    /// Every cooperative-matrix kernel the host can pick (each configuration
    /// of [`CoopTiles::all`], both transposes, every output dtype) parses,
    /// validates with the capabilities the device is opened with, declares
    /// exactly the workgroup memory the planner checks, and goes through
    /// naga's SPIR-V writer as wgpu's Vulkan backend drives it, with and
    /// without bounds checks (naga 30's writer panics on some forms of
    /// cooperative stores, which this would catch without a device).
    #[test]
    fn coop_variants_validate_and_write_spirv() {
        use naga::back::spv;
        let mut n = 0;
        for tiles in CoopTiles::all() {
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                for out in [DType::F32, DType::F16, DType::BF16] {
                    let m = Module::CoopMatmul { tiles, ta, tb };
                    let what = format!("{tiles} ta={ta} tb={tb} → {out}");
                    let source = m.source_for(Io::new(DType::F16, out)).unwrap_or_else(|e| panic!("{what}: {e}"));
                    let module = naga::front::wgsl::parse_str(&source)
                        .unwrap_or_else(|e| panic!("{what}:\n{}", e.emit_to_string(&source)));
                    let flags = naga::valid::ValidationFlags::all();
                    let info = naga::valid::Validator::new(flags, capabilities(m))
                        .validate(&module)
                        .unwrap_or_else(|e| panic!("{what}:\n{}", e.emit_to_string(&source)));
                    let bytes: u64 = module
                        .global_variables
                        .iter()
                        .filter(|(_, g)| g.space == naga::AddressSpace::WorkGroup)
                        .map(|(_, g)| u64::from(module.types[g.ty].inner.size(module.to_ctx())))
                        .sum();
                    assert_eq!(bytes, coop_matmul::workgroup_bytes(tiles, ta, tb), "{what}");
                    for policy in [naga::proc::BoundsCheckPolicy::Unchecked, naga::proc::BoundsCheckPolicy::Restrict] {
                        let options = spv::Options {
                            lang_version: (1, 6),
                            bounds_check_policies: naga::proc::BoundsCheckPolicies {
                                index: policy,
                                buffer: policy,
                                image_load: policy,
                                binding_array: policy,
                            },
                            zero_initialize_workgroup_memory: spv::ZeroInitializeWorkgroupMemoryMode::None,
                            force_loop_bounding: true,
                            use_storage_input_output_16: true,
                            ..Default::default()
                        };
                        let pipeline = spv::PipelineOptions {
                            shader_stage: naga::ShaderStage::Compute,
                            entry_point: "matmul_coop".into(),
                        };
                        let words =
                            std::panic::catch_unwind(|| spv::write_vec(&module, &info, &options, Some(&pipeline)))
                                .unwrap_or_else(|_| panic!("{what}: naga's SPIR-V writer panicked"))
                                .unwrap_or_else(|e| panic!("{what}: {e}"));
                        assert!(words.len() > 100, "{what}");
                    }
                    n += 1;
                }
            }
        }
        assert_eq!(n, 22 * 4 * 3);
        // What the planner may not ask for: other input dtypes.
        let m = Module::CoopMatmul { tiles: CoopTiles::AUTO_LARGE, ta: false, tb: false };
        assert!(m.source_for(Io::new(DType::BF16, DType::F32)).is_err());
        assert!(m.source_for(Io::new(DType::F16, DType::Q8_0)).is_err());
    }

    /// Every matmul pipeline the host can pick (each tiling, the small
    /// kernel, split-K, transposes, and operands in vec4s or element by
    /// element), with its constants applied as wgpu applies them, validates.
    #[test]
    fn matmul_variants_validate_with_their_constants() {
        let mut tilings: Vec<MatmulKernel> = TiledMatmul::all().into_iter().map(MatmulKernel::Tiled).collect();
        tilings.push(MatmulKernel::Small);
        tilings.push(MatmulKernel::Tiled(TiledMatmul::AUTO_LARGE.with_split_k(4).unwrap()));
        tilings.push(MatmulKernel::Tiled(TiledMatmul::AUTO_MEDIUM));
        let vecs = [
            Vec4s::ALL,
            Vec4s { a: false, b: false, c: false },
            Vec4s { a: false, b: true, c: true },
            Vec4s { a: true, b: false, c: false },
        ];
        let mut n = 0;
        for tiles in tilings {
            for (i, vec) in vecs.into_iter().enumerate() {
                let (ta, tb) = (i % 2 == 1, i / 2 == 1);
                validates_with_constants(Kernel::Matmul { tiles, ta, tb, vec, checked: false });
                n += 1;
            }
        }
        assert_eq!(n, (TiledMatmul::all().len() + 3) * 4);
    }

    /// Parses and validates `kernel`'s module, applies its pipeline
    /// constants as wgpu does, and validates the result; panics naming the
    /// kernel otherwise.
    fn validates_with_constants(kernel: Kernel) {
        let m = kernel.module();
        let source = m.source_for(kernel.io()).unwrap_or_else(|e| panic!("{kernel:?}: {e}"));
        let module = naga::front::wgsl::parse_str(&source)
            .unwrap_or_else(|e| panic!("{kernel:?}: {}", e.emit_to_string(&source)));
        let flags = naga::valid::ValidationFlags::all();
        let info = naga::valid::Validator::new(flags, capabilities(m))
            .validate(&module)
            .unwrap_or_else(|e| panic!("{kernel:?}: {}", e.emit_to_string(&source)));
        let mut constants = naga::back::PipelineConstants::default();
        for (name, value) in kernel.constants() {
            constants.insert(name.to_string(), value);
        }
        let entry = Some((naga::ShaderStage::Compute, kernel.entry()));
        let (resolved, _) = naga::back::pipeline_constants::process_overrides(&module, &info, entry, &constants)
            .unwrap_or_else(|e| panic!("{kernel:?}: {e}"));
        naga::valid::Validator::new(flags, capabilities(m))
            .validate(&resolved)
            .unwrap_or_else(|e| panic!("{kernel:?} does not validate: {e}"));
    }

    /// Every decoder pipeline the host can pick (each mode of `rope`, `copy`
    /// and `gather` on every dtype, `argmax` on every input dtype), with its
    /// constants applied as wgpu applies them, validates.
    #[test]
    fn decoder_variants_validate_with_their_constants() {
        let mut kernels = Vec::new();
        for dtype in DType::ALL {
            for positions in [false, true] {
                kernels.extend((0..3).map(|mode| Kernel::Rope { mode, dtype, positions }));
                kernels.extend((0..3).map(|mode| Kernel::Copy { mode, dtype, positions }));
            }
            kernels.extend((0..2).map(|mode| Kernel::Gather { mode, dtype }));
            kernels.push(Kernel::ArgMax(dtype));
        }
        assert_eq!(kernels.len(), 45);
        kernels.into_iter().for_each(validates_with_constants);
        // Half outputs are packed: whole-word stores, and one value's store
        // rewrites its word with the other half kept.
        let f16 = Module::Decoder.source_for(Io::new(DType::F16, DType::F16)).unwrap();
        assert!(f16.contains("const Y_PACKED: bool = true;"), "{f16}");
        assert!(f16.contains("y[w] = (y[w] & ~(0xffffu << s)) | (b << s);"), "{f16}");
        let bf16 = Module::Decoder.source_for(Io::new(DType::BF16, DType::F32)).unwrap();
        assert!(bf16.contains("fn load_x(i: u32) -> f32 { return bf16_to_f32(bits_x(i)); }"), "{bf16}");
        assert!(bf16.contains("const Y_PACKED: bool = false;"), "{bf16}");
    }

    #[test]
    fn kernels_name_their_entry_points_and_constants() {
        assert_eq!(Kernel::Unary(3, DType::F32).entry(), "unary");
        assert_eq!(Kernel::Unary(3, DType::F32).constants(), vec![("OP", 3.0)]);
        let mm = Kernel::Matmul { tiles: MatmulKernel::Small, ta: true, tb: false, vec: Vec4s::ALL, checked: false };
        assert_eq!(mm.entry(), "matmul_small");
        assert_eq!(mm.constants(), vec![("TA", 1.0), ("TB", 0.0), ("VA", 1.0), ("VB", 1.0), ("VC", 1.0)]);
        assert!(mm.unchecked());
        assert!(!Kernel::Unary(0, DType::F32).unchecked());
        let cast = Kernel::Cast { from: DType::BF16, to: DType::F16 };
        assert_eq!((cast.entry(), cast.io(), cast.constants()), ("convert", Io::new(DType::BF16, DType::F16), vec![]));
        assert_eq!(Kernel::RmsNorm(DType::BF16).io(), Io::new(DType::BF16, DType::F32));
        assert_eq!(Kernel::ReduceFinish(1).io(), Io::F32);
        let small = Kernel::Matmul { tiles: MatmulKernel::Small, ta: false, tb: true, vec: Vec4s::ALL, checked: true };
        // 5 × 7 by 7 × 9 (k × m stored): every operand element by element.
        let ragged = Vec4s::for_shape(5, 7, 9, true, false);
        assert_eq!(ragged, Vec4s { a: false, b: false, c: false });
        assert_eq!(Vec4s::for_shape(5, 8, 12, false, true), Vec4s::ALL);
        assert_eq!(Vec4s::for_shape(4, 7, 12, true, false), Vec4s { a: true, b: true, c: true });
        assert_eq!(Vec4s::for_shape(4, 7, 12, false, true), Vec4s { a: false, b: false, c: true });
        let scalar = Kernel::Matmul { tiles: MatmulKernel::Small, ta: false, tb: false, vec: ragged, checked: false };
        assert_eq!(scalar.constants()[2..], [("VA", 0.0), ("VB", 0.0), ("VC", 0.0)]);
        let tiled = TiledMatmul::new(128, 64, 16).and_then(|t| t.with_split(true)).map(MatmulKernel::Tiled).unwrap();
        let tiled = Kernel::Matmul { tiles: tiled, ta: true, tb: true, vec: Vec4s::ALL, checked: false };
        let want = [
            ("TBM", 128.0),
            ("TBN", 64.0),
            ("TBK", 16.0),
            ("SPLIT", 1.0),
            ("AHEAD", 0.0),
            ("GROUP", 0.0),
            ("W84", 0.0),
            ("TN", 8.0),
            ("SK", 1.0),
        ];
        let flags = [("TA", 1.0), ("TB", 1.0), ("VA", 1.0), ("VB", 1.0), ("VC", 1.0)];
        assert_eq!(tiled.constants(), [flags.as_slice(), &want].concat());
        let reduce = Kernel::MatmulReduce { sk: 4, checked: false };
        assert_eq!(reduce.constants(), vec![("SK", 4.0)]);
        assert!(reduce.unchecked() && reduce.module() == Module::Matmul);
        let rows =
            [Kernel::Softmax(1, DType::F16), Kernel::LayerNorm(DType::BF16), Kernel::RmsNorm(DType::F32), reduce];
        for k in [
            Kernel::Unary(0, DType::F32),
            Kernel::Binary(2, DType::BF16),
            Kernel::ReduceFinish(0),
            Kernel::Conv2d(DType::F16),
            Kernel::Slerp(DType::BF16),
            Kernel::Binary(3, DType::F16),
            Kernel::Attention { dv: 2, ck: 32, cv: 16, checked: false, positions: false },
            Kernel::Attention { dv: 1, ck: 16, cv: 8, checked: false, positions: true },
            Kernel::Rope { mode: 1, dtype: DType::F16, positions: true },
            Kernel::Copy { mode: 2, dtype: DType::BF16, positions: true },
            cast,
            mm,
            small,
            scalar,
            tiled,
        ]
        .into_iter()
        .chain(rows)
        {
            assert!(k.module().source().contains(&format!("fn {}(", k.entry())), "{k:?}");
            assert!(k.module().source_for(k.io()).is_ok(), "{k:?}");
        }
    }
}
