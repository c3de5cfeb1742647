//! The `matmul_coop` entry point of `shaders/matmul_coop.wgsl`, written out
//! per configuration ([`CoopTiles`], transposes, output dtype) with every
//! 16 × 16 fragment and accumulator a named variable and every loop over
//! fragments and loads unrolled: cooperative matrices cannot live in arrays
//! that the driver is sure to keep in registers, and naga 30 needs the index
//! and stride of each cooperative load and store as `let`s of their own (see
//! the shader's header).
//!
//! The host's side of the kernel: [`source`] (the WGSL), [`workgroup_bytes`]
//! (what the device's limit is checked against) and [`Layout`] (tile strides,
//! shared by both, so the planner and the shader cannot disagree).

use compute_core::DType;

use crate::options::CoopTiles;

/// Halves of padding after each row of a tile in workgroup memory (16 bytes:
/// the rows of a fragment's 8 × 8 pieces fall in distinct banks, and every row
/// stays 16-byte aligned, as cooperative loads require).
const PAD: u32 = 8;

/// Where a configuration keeps its tiles: strides and sizes in units of the
/// workgroup arrays' elements (`vec4<f16>`, or `f16` with
/// [`CoopTiles::scalar_tiles`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    /// Units per stored row of an A tile (`BK` halves, `BM` when transposed, plus [`PAD`]).
    pub(crate) sa: u32,
    /// Units per stored row of a B tile (`BN` halves, `BK` when transposed, plus [`PAD`]).
    pub(crate) sb: u32,
    /// Units of one A tile (one of its two buffers).
    pub(crate) at: u32,
    /// Units of one B tile.
    pub(crate) bt: u32,
    /// Halves per unit (4 for `vec4<f16>`, 1 for `f16`).
    pub(crate) unit: u32,
}

impl Layout {
    /// The layout of `t` for the transposes `ta`, `tb`.
    pub(crate) fn of(t: CoopTiles, ta: bool, tb: bool) -> Layout {
        let (bm, bn, bk) = (t.tile_m(), t.tile_n(), t.k_step());
        let unit = if t.scalar_tiles() { 1 } else { 4 };
        // Stored A tile: BM rows of BK halves, or (TA) BK rows of BM; B: BK rows of BN, or (TB) BN of BK.
        let (a_rows, a_len) = if ta { (bk, bm) } else { (bm, bk) };
        let (b_rows, b_len) = if tb { (bn, bk) } else { (bk, bn) };
        let (sa, sb) = ((a_len + PAD) / unit, (b_len + PAD) / unit);
        Layout { sa, sb, at: a_rows * sa, bt: b_rows * sb, unit }
    }
}

/// Bytes of workgroup memory the kernel of `t` declares for the transposes
/// `ta`, `tb`: two buffers of each tile (2 bytes a half) and one 16 × 16 `f32`
/// staging slice per subgroup.
pub(crate) fn workgroup_bytes(t: CoopTiles, ta: bool, tb: bool) -> u64 {
    let l = Layout::of(t, ta, tb);
    let halves = 2 * u64::from(l.at + l.bt) * u64::from(l.unit);
    2 * halves + 4 * 256 * u64::from(t.warps())
}

/// The WGSL of `matmul_coop` for `t`, transposes `ta`, `tb` and output dtype
/// `out` (`f32`, `f16` or `bf16`), to append to `matmul_coop.wgsl` (with
/// `half.wgsl`'s conversions). Allocates the text (tens of KiB).
pub(crate) fn source(t: CoopTiles, ta: bool, tb: bool, out: DType) -> String {
    let (bm, bn, bk) = (t.tile_m(), t.tile_n(), t.k_step());
    let (wm, wn) = (t.warps_m(), t.warps_n());
    let (fm, fn_) = (bm / (16 * wm), bn / (16 * wn));
    let threads = t.threads();
    let l = Layout::of(t, ta, tb);
    let u = l.unit;
    let elem = if u == 4 { "vec4<f16>" } else { "f16" };
    // vec4s of each tile per invocation (the configurations keep these whole).
    let (na, nb) = (bm * bk / 4 / threads, bn * bk / 4 / threads);
    let mut s = String::new();
    let mut w = |line: &str| {
        s.push_str(line);
        s.push('\n');
    };
    w(&format!("const TA: bool = {ta};\nconst TB: bool = {tb};"));
    w(&format!("const WARPS: u32 = {}u;", wm * wn));
    let to_half = match out {
        DType::BF16 => "f32_to_bf16",
        _ => "f32_to_f16",
    };
    w(&format!("fn to_half(v: f32) -> u32 {{ return {to_half}(v); }}"));
    w("");
    w(&format!("// Two buffers of each tile ({} and {} {elem}s), then one 16 × 16 slice per subgroup.", l.at, l.bt));
    w(&format!("var<workgroup> As: array<{elem}, {}>;", 2 * l.at));
    w(&format!("var<workgroup> Bs: array<{elem}, {}>;", 2 * l.bt));
    w(&format!("var<workgroup> Cs: array<f32, {}>;", 256 * wm * wn));
    w("");
    w(&format!("@compute @workgroup_size({threads})"));
    w("fn matmul_coop(");
    w("    @builtin(workgroup_id) wid: vec3<u32>,");
    w("    @builtin(num_workgroups) groups: vec3<u32>,");
    w("    @builtin(local_invocation_index) lid: u32,");
    w("    @builtin(subgroup_id) sg: u32,");
    w("    @builtin(subgroup_invocation_id) lane: u32,");
    w(") {");
    w("    let z = wid.z + p.z0;");
    w("    let tile = tile_of(wid, groups);");
    w(&format!("    let row0 = tile.x * {bm}u;\n    let col0 = tile.y * {bn}u;"));
    w(&format!(
        "    // This subgroup's block: rows wr..wr + {}, columns wc..wc + {} of the tile (sg < {}).",
        fm * 16,
        fn_ * 16,
        wm * wn
    ));
    w(&format!("    let wr = (sg / {wn}u) * {}u;\n    let wc = (sg % {wn}u) * {}u;", fm * 16, fn_ * 16));
    for i in 0..fm {
        for j in 0..fn_ {
            w(&format!("    var acc{i}_{j} = coop_mat16x16<f32, C>();"));
        }
    }
    // The loads of one K step into registers, and their stores into buffer `buf`.
    // Invocation lid moves vec4 v = lid + q·threads of each tile (v < the tile's vec4s).
    let a_pos = |q: u32| -> (String, String) {
        let v = format!("(lid + {}u)", q * threads);
        if ta {
            // Tile: BK rows (k) of BM halves (m); vec4 v at k row v / (BM/4), m column (v % (BM/4))·4.
            let (r, c) = (format!("{v} / {}u", bm / 4), format!("{v} % {}u", bm / 4));
            (format!("load_a(z, row0 + ({c}) * 4u, k0 + {r})"), format!("({r}) * {}u + ({c}) * {}u", l.sa, 4 / u))
        } else {
            let (r, c) = (format!("{v} / {}u", bk / 4), format!("{v} % {}u", bk / 4));
            (format!("load_a(z, row0 + {r}, k0 + ({c}) * 4u)"), format!("({r}) * {}u + ({c}) * {}u", l.sa, 4 / u))
        }
    };
    let b_pos = |q: u32| -> (String, String) {
        let v = format!("(lid + {}u)", q * threads);
        if tb {
            // Tile: BN rows (n) of BK halves (k).
            let (r, c) = (format!("{v} / {}u", bk / 4), format!("{v} % {}u", bk / 4));
            (format!("load_b(z, k0 + ({c}) * 4u, col0 + {r})"), format!("({r}) * {}u + ({c}) * {}u", l.sb, 4 / u))
        } else {
            let (r, c) = (format!("{v} / {}u", bn / 4), format!("{v} % {}u", bn / 4));
            (format!("load_b(z, k0 + {r}, col0 + ({c}) * 4u)"), format!("({r}) * {}u + ({c}) * {}u", l.sb, 4 / u))
        }
    };
    for q in 0..na {
        w(&format!("    var ra{q}: vec4<f16>;"));
    }
    for q in 0..nb {
        w(&format!("    var rb{q}: vec4<f16>;"));
    }
    let fetch = |out: &mut Vec<String>, indent: &str| {
        for q in 0..na {
            out.push(format!("{indent}ra{q} = {};", a_pos(q).0));
        }
        for q in 0..nb {
            out.push(format!("{indent}rb{q} = {};", b_pos(q).0));
        }
    };
    // Stores into the buffer at unit offsets ao, bo: whole vec4s, or 4 halves each.
    let stash = |out: &mut Vec<String>, indent: &str| {
        for (tile, base, n, pos) in
            [("As", "ao", na, &a_pos as &dyn Fn(u32) -> (String, String)), ("Bs", "bo", nb, &b_pos)]
        {
            let r = if tile == "As" { "ra" } else { "rb" };
            for q in 0..n {
                let at = format!("{base} + {}", pos(q).1);
                if u == 4 {
                    out.push(format!("{indent}{tile}[{at}] = {r}{q};"));
                } else {
                    out.push(format!("{indent}{{\n{indent}    let i = {at};"));
                    for (e, comp) in ["x", "y", "z", "w"].iter().enumerate() {
                        out.push(format!("{indent}    {tile}[i + {e}u] = {r}{q}.{comp};"));
                    }
                    out.push(format!("{indent}}}"));
                }
            }
        }
    };
    let mut lines = Vec::new();
    w(&format!("    let steps = (p.k + {}u) / {bk}u;", bk - 1));
    w("    {");
    w("        let k0 = 0u;\n        let ao = 0u;\n        let bo = 0u;");
    fetch(&mut lines, "        ");
    stash(&mut lines, "        ");
    for line in lines.drain(..) {
        w(&line);
    }
    w("    }");
    w("    workgroupBarrier();");
    w("    for (var t = 0u; t < steps; t++) {");
    w("        let more = t + 1u < steps;");
    w("        if (more) {");
    w(&format!("            let k0 = (t + 1u) * {bk}u;"));
    fetch(&mut lines, "            ");
    for line in lines.drain(..) {
        w(&line);
    }
    w("        }");
    w(&format!("        let cur_a = (t % 2u) * {}u;\n        let cur_b = (t % 2u) * {}u;", l.at, l.bt));
    for kk in (0..bk).step_by(16) {
        // Fragment i of A: rows wr + 16i.., k kk..kk + 16; j of B: k kk.., columns wc + 16j...
        // Each reads 16 rows or columns of 16 halves inside its tile buffer: the last
        // unit read is below cur + (tile units), the buffer's end.
        for i in 0..fm {
            let (index, load) = if ta {
                (format!("cur_a + {}u * {}u + (wr + {}u) / {u}u", kk, l.sa, 16 * i), "coopLoad")
            } else {
                (format!("cur_a + (wr + {}u) * {}u + {}u", 16 * i, l.sa, kk / u), "coopLoadT")
            };
            w(&format!("        let ia{kk}_{i} = {index};"));
            w(&format!("        let fa{kk}_{i} = {load}<coop_mat16x16<f16, A>>(&As[ia{kk}_{i}], {}u);", l.sa));
        }
        for j in 0..fn_ {
            let (index, load) = if tb {
                (format!("cur_b + (wc + {}u) * {}u + {}u", 16 * j, l.sb, kk / u), "coopLoad")
            } else {
                (format!("cur_b + {}u * {}u + (wc + {}u) / {u}u", kk, l.sb, 16 * j), "coopLoadT")
            };
            w(&format!("        let ib{kk}_{j} = {index};"));
            w(&format!("        let fb{kk}_{j} = {load}<coop_mat16x16<f16, B>>(&Bs[ib{kk}_{j}], {}u);", l.sb));
        }
        for i in 0..fm {
            for j in 0..fn_ {
                w(&format!("        acc{i}_{j} = coopMultiplyAdd(fa{kk}_{i}, fb{kk}_{j}, acc{i}_{j});"));
            }
        }
    }
    w("        if (more) {");
    w(&format!("            let ao = {}u - cur_a;\n            let bo = {}u - cur_b;", l.at, l.bt));
    stash(&mut lines, "            ");
    for line in lines.drain(..) {
        w(&line);
    }
    w("        }");
    w("        workgroupBarrier();");
    w("    }");
    // Epilogue.
    let block = |i: u32, j: u32| (format!("row0 + wr + {}u", 16 * i), format!("col0 + wc + {}u", 16 * j));
    if out == DType::F32 {
        w(&format!("    if (p.direct == 1u && row0 + {bm}u <= p.m && col0 + {bn}u <= p.n) {{\n        let ldc = p.n;"));
        for i in 0..fm {
            for j in 0..fn_ {
                let (r, c) = block(i, j);
                w(&format!("        let at{i}_{j} = z * p.sc + ({r}) * p.n + {c};"));
                w(&format!("        coopStoreT(acc{i}_{j}, &c[at{i}_{j}], ldc);"));
            }
        }
        w("        return;\n    }");
    }
    let write = if out == DType::F32 { "write_f32" } else { "write_half" };
    w("    let so = sg * 256u;");
    for i in 0..fm {
        for j in 0..fn_ {
            let (r, c) = block(i, j);
            w(&format!("    coopStoreT(acc{i}_{j}, &Cs[so], 16u);"));
            w("    subgroupBarrier();");
            w(&format!("    {write}(z, {r}, {c}, so, lane);"));
            w("    subgroupBarrier();");
        }
    }
    w("}");
    s
}
