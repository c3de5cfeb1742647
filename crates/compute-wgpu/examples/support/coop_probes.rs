//! The probes of `coop_probe` (also compiled by `coop_stats`): small kernels
//! that each time one part of `matmul_coop`'s inner loop alone (see
//! `coop_probe.rs`). Bindings: 1, an `f32` buffer of at least 1024 values;
//! 2, an `f16` one (neither is written at run time). A tuning aid; not part
//! of the library.

#![allow(dead_code)] // Each example that includes this uses a part of it.

/// Iterations of the K step per subgroup.
pub const ITERS: u32 = 1024;
/// Workgroups per dispatch.
pub const GROUPS: u32 = 132 * 8;

/// How the probe's fragments reach the multiply-adds.
#[derive(Clone, Copy, PartialEq)]
pub enum Mode {
    /// Loaded once before the loop.
    Regs,
    /// Loaded every step from `array<vec4<f16>>` tiles (B row-major or, `bcol`, column-major).
    Vec4 { bcol: bool },
    /// Loaded every step from `array<f16>` tiles.
    Scalar,
    /// Loaded every step from `array<vec4<u32>>` tiles.
    U32x4,
}

/// One probe: its name, fragments' path, accumulators per subgroup, accumulator type.
pub struct Probe {
    /// Printed name.
    pub name: String,
    mode: Mode,
    fm: u32,
    fn_: u32,
    f16acc: bool,
    /// A workgroup barrier after every step (as `matmul_coop` has one per step).
    barrier: bool,
}

impl Probe {
    /// Floating-point operations of one dispatch of [`GROUPS`] workgroups.
    pub fn flops(&self) -> f64 {
        f64::from(GROUPS) * 8.0 * f64::from(self.fm * self.fn_) * 2.0 * 4096.0 * f64::from(ITERS)
    }

    /// The probe's WGSL. Tiles as `matmul_coop`'s 128 × 256 × 16 configuration
    /// lays them out: A 128 rows of 24 halves (16 + 8 padding), B 16 rows of
    /// 264 halves (or, `bcol`, 256 rows of 24), in units of 4 halves; the
    /// step's offset moves by 16 units from one step to the next, back to 0
    /// every 7 steps.
    pub fn wgsl(&self) -> String {
        let (fm, fn_) = (self.fm, self.fn_);
        // Subgroups 2 × 4; each covers rows wr.., columns wc.. of the tile.
        let (sa, sb) = (6u32, if self.mode == (Mode::Vec4 { bcol: true }) { 6 } else { 66 });
        let b_at = 768u32;
        let acc_t = if self.f16acc { "f16" } else { "f32" };
        let mut s = String::from("enable f16;\nenable wgpu_cooperative_matrix;\n");
        s += "@group(0) @binding(1) var<storage, read_write> out: array<f32>;\n";
        s += "@group(0) @binding(2) var<storage, read_write> outh: array<f16>;\n";
        // Units of 4 halves: 4096 (32 KiB).
        let (decl, scale, unit) = match self.mode {
            Mode::Scalar => ("array<f16, 16384>", 4, "f16(f32(i % 13u) * 0.01)"),
            Mode::U32x4 => ("array<vec4<u32>, 2048>", 1, "vec4<u32>(i % 13u)"),
            _ => ("array<vec4<f16>, 4096>", 1, "vec4<f16>(f16(f32(i % 13u) * 0.01))"),
        };
        // Index and stride unit conversions: `scale` elements per unit, or (u32x4) 2 units per element.
        let idx = |units: String| match self.mode {
            Mode::U32x4 => format!("({units}) / 2u"),
            _ => format!("({units}) * {scale}u"),
        };
        let stride = |units: u32| match self.mode {
            Mode::U32x4 => units / 2,
            _ => units * scale,
        };
        let len = match self.mode {
            Mode::Scalar => 16384,
            Mode::U32x4 => 2048,
            _ => 4096,
        };
        s += &format!("var<workgroup> S: {decl};\n");
        s += "@compute @workgroup_size(256)\n";
        s += "fn main(@builtin(local_invocation_index) lid: u32, @builtin(subgroup_id) sg: u32) {\n";
        s += &format!("    for (var i = lid; i < {len}u; i += 256u) {{ S[i] = {unit}; }}\n");
        s += "    workgroupBarrier();\n";
        s += &format!("    let wr = (sg / 4u) * {}u;\n    let wc = (sg % 4u) * {}u;\n", fm * 16, fn_ * 16);
        for i in 0..fm {
            for j in 0..fn_ {
                s += &format!("    var acc{i}_{j} = coop_mat16x16<{acc_t}, C>();\n");
            }
        }
        let loads = |base: &str, indent: &str| -> String {
            let mut l = String::new();
            for i in 0..fm {
                l += &format!("{indent}let ia{i} = {};\n", idx(format!("{base} + (wr + {}u) * {sa}u", 16 * i)));
                l += &format!("{indent}let fa{i} = coopLoadT<coop_mat16x16<f16, A>>(&S[ia{i}], {}u);\n", stride(sa));
            }
            for j in 0..fn_ {
                let (at, load) = if self.mode == (Mode::Vec4 { bcol: true }) {
                    (format!("{base} + {b_at}u + (wc + {}u) * {sb}u", 16 * j), "coopLoad")
                } else {
                    (format!("{base} + {b_at}u + (wc + {}u) / 4u", 16 * j), "coopLoadT")
                };
                l += &format!("{indent}let ib{j} = {};\n", idx(at));
                l += &format!("{indent}let fb{j} = {load}<coop_mat16x16<f16, B>>(&S[ib{j}], {}u);\n", stride(sb));
            }
            l
        };
        if self.mode == Mode::Regs {
            s += &loads("0u", "    ");
        }
        s += &format!("    for (var t = 0u; t < {ITERS}u; t++) {{\n");
        if self.mode != Mode::Regs {
            s += &loads("(t % 7u) * 16u", "        ");
        }
        for i in 0..fm {
            for j in 0..fn_ {
                s += &format!("        acc{i}_{j} = coopMultiplyAdd(fa{i}, fb{j}, acc{i}_{j});\n");
            }
        }
        if self.barrier {
            s += "        workgroupBarrier();\n";
        }
        s += "    }\n";
        s += "    if (arrayLength(&out) == 7u && arrayLength(&outh) == 7u) {\n        let z = 0u;\n        let st = 16u;\n";
        let target = if self.f16acc { "outh" } else { "out" };
        for i in 0..fm {
            for j in 0..fn_ {
                s += &format!("        coopStoreT(acc{i}_{j}, &{target}[z], st);\n");
            }
        }
        s += "    }\n}\n";
        s
    }
}

/// Every probe.
pub fn probes() -> Vec<Probe> {
    let mut v = Vec::new();
    let mut add = |mode: Mode, prefix: &str, fm: u32, fn_: u32, f16acc: bool| {
        let name = format!("{prefix}-{fm}x{fn_}{}", if f16acc { "-f16acc" } else { "" });
        v.push(Probe { name, mode, fm, fn_, f16acc, barrier: false });
    };
    for (fm, fn_) in [(4, 4), (4, 2), (2, 2)] {
        add(Mode::Regs, "regs", fm, fn_, false);
    }
    add(Mode::Regs, "regs", 4, 4, true);
    for (fm, fn_) in [(4, 4), (4, 2), (2, 2)] {
        add(Mode::Vec4 { bcol: false }, "lds-vec4", fm, fn_, false);
    }
    add(Mode::Vec4 { bcol: true }, "lds-vec4-bcol", 4, 4, false);
    add(Mode::Scalar, "lds-scalar", 4, 4, false);
    add(Mode::U32x4, "lds-u32x4", 4, 4, false);
    let name = "lds-vec4-4x4-barrier".to_string();
    v.push(Probe { name, mode: Mode::Vec4 { bcol: false }, fm: 4, fn_: 4, f16acc: false, barrier: true });
    v
}
