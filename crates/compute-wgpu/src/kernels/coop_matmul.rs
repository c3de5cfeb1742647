//! The `matmul_coop` entry point of `shaders/matmul_coop.wgsl`, written out
//! per configuration ([`CoopTiles`], transposes, output dtype) with every
//! 16 × 16 fragment and accumulator a named variable and every loop over
//! fragments, loads, the two tile buffers and the register sets of the K
//! steps in flight unrolled: cooperative matrices
//! cannot live in arrays that the driver is sure to keep in registers, and
//! naga 30 needs the index and stride of each cooperative load and store as
//! `let`s of their own (see the shader's header).
//!
//! The host's side of the kernel: [`source`] (the WGSL), [`workgroup_bytes`]
//! (what the device's limit is checked against) and [`Layout`] (tile strides
//! and offsets, shared by both, so the planner and the shader cannot disagree).

use compute_core::DType;

use crate::options::CoopTiles;

/// Halves per unit of the tiles in workgroup memory and of the loads (a
/// `vec4<f16>`, 8 bytes).
const UNIT: u32 = 4;

/// Where a configuration keeps its tiles in workgroup memory, in units of 4
/// halves (`vec4<f16>`): two buffers of the A tile (`As`) and two of the B
/// tile (`Bs`), each stored row by row as the matrix is stored, every row
/// padded by 8 halves (the eight 16-byte rows of a fragment's 8 × 8 pieces
/// then fall in distinct banks, and every row stays 16-byte aligned, as
/// cooperative loads require).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    /// Units per stored row of an A tile (`BK` halves, `BM` when transposed, plus 8).
    pub(crate) sa: u32,
    /// Units per stored row of a B tile (`BN` halves, `BK` when transposed, plus 8).
    pub(crate) sb: u32,
    /// Units of one A tile.
    pub(crate) at: u32,
    /// Units of one B tile.
    pub(crate) bt: u32,
}

impl Layout {
    /// The layout of `t` for the transposes `ta`, `tb`.
    pub(crate) fn of(t: CoopTiles, ta: bool, tb: bool) -> Layout {
        let (bm, bn, bk) = (t.tile_m(), t.tile_n(), t.k_step());
        // Stored A tile: BM rows of BK halves, or (TA) BK rows of BM; B: BK rows of BN, or (TB) BN of BK.
        let (a_rows, a_len) = if ta { (bk, bm) } else { (bm, bk) };
        let (b_rows, b_len) = if tb { (bn, bk) } else { (bk, bn) };
        let (sa, sb) = ((a_len + 8) / UNIT, (b_len + 8) / UNIT);
        Layout { sa, sb, at: a_rows * sa, bt: b_rows * sb }
    }
}

/// Bytes of workgroup memory the kernel of `t` declares for the transposes
/// `ta`, `tb`: two buffers of each tile (8 bytes a unit) and one 16 × 16 `f32`
/// staging slice per subgroup (`Cs`).
pub(crate) fn workgroup_bytes(t: CoopTiles, ta: bool, tb: bool) -> u64 {
    let l = Layout::of(t, ta, tb);
    16 * u64::from(l.at + l.bt) + 1024 * u64::from(t.warps())
}

/// What one K step of the main loop's pass does (the `u`-th step of the
/// pass starting at step `t`, which multiplies step `t + u`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Step {
    /// The step whose loads go out, as an offset from `t`: `u + ahead`.
    pub(crate) load: u32,
    /// The register set they go into (the one step `t + u` left).
    pub(crate) load_set: u32,
    /// The buffer multiplied (holding step `t + u`); the other one receives step `t + u + 1`.
    pub(crate) buf: usize,
    /// The register set stored into the other buffer (step `t + u + 1`,
    /// loaded `ahead − 1` steps before).
    pub(crate) store_set: u32,
}

/// The steps of one pass of the main loop for loads `ahead` steps before
/// their multiply, after a prologue that loads steps `0..ahead` into sets
/// `0..ahead` and stores set 0 into buffer 0: lcm(2, `ahead`) steps, so that
/// buffers (step mod 2) and register sets (step mod `ahead`) fall on the same
/// names in every pass.
pub(crate) fn schedule(ahead: u32) -> Vec<Step> {
    let unroll = if ahead.is_multiple_of(2) { ahead } else { 2 * ahead };
    (0..unroll)
        .map(|u| Step { load: u + ahead, load_set: u % ahead, buf: (u % 2) as usize, store_set: (u + 1) % ahead })
        .collect()
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
    // Units of each tile per invocation (the configurations keep these whole).
    let (na, nb) = (bm * bk / UNIT / threads, bn * bk / UNIT / threads);
    // Buffer offsets in As and Bs.
    let a_buf = [0, l.at];
    let b_buf = [0, l.bt];
    let mut s = String::new();
    let mut w = |line: &str| {
        s.push_str(line);
        s.push('\n');
    };
    w(&format!("const TA: bool = {ta};\nconst TB: bool = {tb};"));
    let to_half = if out == DType::BF16 { "f32_to_bf16" } else { "f32_to_f16" };
    w(&format!("fn to_half(v: f32) -> u32 {{ return {to_half}(v); }}"));
    w("");
    w(&format!("// Two buffers of each tile ({} and {} units), then one 16 × 16 slice per subgroup.", l.at, l.bt));
    w(&format!("var<workgroup> As: array<vec4<f16>, {}>;", 2 * l.at));
    w(&format!("var<workgroup> Bs: array<vec4<f16>, {}>;", 2 * l.bt));
    w(&format!("var<workgroup> Cs: array<f32, {}>;", 256 * wm * wn));
    w("");
    // Invocation lid moves unit v = lid + q·threads of each tile (v < the tile's units): its
    // stored row and unit within the row, and the global load that fills it.
    let a_pos = |q: u32| -> (String, String, String) {
        let v = format!("(lid + {}u)", q * threads);
        let per = if ta { bm } else { bk } / UNIT;
        let (r, c) = (format!("{v} / {per}u"), format!("{v} % {per}u"));
        let args =
            if ta { format!("z, row0 + ({c}) * 4u, k0 + {r}") } else { format!("z, row0 + {r}, k0 + ({c}) * 4u") };
        (args, format!("({r}) * {}u + {c}", l.sa), String::new())
    };
    let b_pos = |q: u32| -> (String, String, String) {
        let v = format!("(lid + {}u)", q * threads);
        let per = if tb { bk } else { bn } / UNIT;
        let (r, c) = (format!("{v} / {per}u"), format!("{v} % {per}u"));
        let args =
            if tb { format!("z, k0 + ({c}) * 4u, col0 + {r}") } else { format!("z, k0 + {r}, col0 + ({c}) * 4u") };
        (args, format!("({r}) * {}u + {c}", l.sb), String::new())
    };
    // The loads of the K step at `k0` into register set `set` (`x0a0`…,
    // `x0b0`…): unchecked where the whole tile is inside A and B (uniform in
    // the workgroup), else each checked.
    let fetch = |k0: &str, set: &str, indent: &str| -> Vec<String> {
        let mut v = vec![format!("{indent}{{"), format!("{indent}    let k0 = {k0};")];
        v.push(format!("{indent}    if (row0 + {bm}u <= p.m && col0 + {bn}u <= p.n && k0 + {bk}u <= p.k) {{"));
        for checked in [false, true] {
            let suffix = if checked { "_checked" } else { "" };
            for q in 0..na {
                v.push(format!("{indent}        {set}a{q} = load_a{suffix}({});", a_pos(q).0));
            }
            for q in 0..nb {
                v.push(format!("{indent}        {set}b{q} = load_b{suffix}({});", b_pos(q).0));
            }
            if !checked {
                v.push(format!("{indent}    }} else {{"));
            }
        }
        v.push(format!("{indent}    }}"));
        v.push(format!("{indent}}}"));
        v
    };
    // Stores of register set `set` into buffer `buf` (0 or 1): each index is below
    // the buffer's end, (tile rows − 1)·stride + units per row < tile units.
    let stash = |buf: usize, set: &str, indent: &str| -> Vec<String> {
        let mut v = Vec::new();
        for q in 0..na {
            v.push(format!("{indent}As[{}u + {}] = {set}a{q};", a_buf[buf], a_pos(q).1));
        }
        for q in 0..nb {
            v.push(format!("{indent}Bs[{}u + {}] = {set}b{q};", b_buf[buf], b_pos(q).1));
        }
        v
    };
    // The multiply of the tiles in buffer `buf`: per 16 of k, FM fragments of A
    // (rows wr + 16i.., k kk..kk + 16) and FN of B (k kk.., columns wc + 16j..), each
    // 16 rows or columns of 4 units inside its tile, then FM·FN multiply-adds.
    let compute = |buf: usize, indent: &str| -> Vec<String> {
        let mut v = Vec::new();
        for kk in (0..bk).step_by(16) {
            let ku = kk / UNIT;
            for i in 0..fm {
                let (index, load) = if ta {
                    (format!("{}u + {}u + (wr + {}u) / 4u", a_buf[buf], kk * l.sa, 16 * i), "coopLoad")
                } else {
                    (format!("{}u + (wr + {}u) * {}u + {ku}u", a_buf[buf], 16 * i, l.sa), "coopLoadT")
                };
                v.push(format!("{indent}let ia{buf}_{kk}_{i} = {index};"));
                v.push(format!(
                    "{indent}let fa{buf}_{kk}_{i} = {load}<coop_mat16x16<f16, A>>(&As[ia{buf}_{kk}_{i}], {}u);",
                    l.sa
                ));
            }
            for j in 0..fn_ {
                let (index, load) = if tb {
                    (format!("{}u + (wc + {}u) * {}u + {ku}u", b_buf[buf], 16 * j, l.sb), "coopLoad")
                } else {
                    (format!("{}u + {}u + (wc + {}u) / 4u", b_buf[buf], kk * l.sb, 16 * j), "coopLoadT")
                };
                v.push(format!("{indent}let ib{buf}_{kk}_{j} = {index};"));
                v.push(format!(
                    "{indent}let fb{buf}_{kk}_{j} = {load}<coop_mat16x16<f16, B>>(&Bs[ib{buf}_{kk}_{j}], {}u);",
                    l.sb
                ));
            }
            for i in 0..fm {
                for j in 0..fn_ {
                    v.push(format!(
                        "{indent}acc{i}_{j} = coopMultiplyAdd(fa{buf}_{kk}_{i}, fb{buf}_{kk}_{j}, acc{i}_{j});"
                    ));
                }
            }
        }
        v
    };
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
    // Register sets x0… of the K steps in flight: step s's loads go into set
    // s mod D, D = t.ahead() steps before its multiply.
    let depth = t.ahead();
    let set = |i: u32| format!("x{i}");
    for u in 0..depth {
        for q in 0..na {
            w(&format!("    var x{u}a{q}: vec4<f16>;"));
        }
        for q in 0..nb {
            w(&format!("    var x{u}b{q}: vec4<f16>;"));
        }
    }
    w(&format!("    let steps = (p.k + {}u) / {bk}u;", bk - 1));
    // Prologue: the loads of steps 0..D, then step 0 into buffer 0.
    let mut lines: Vec<String> =
        (0..depth).flat_map(|u| fetch(&format!("{}u", u * bk), &set(u % depth), "    ")).collect();
    lines.extend(stash(0, &set(0), "    "));
    lines.iter().for_each(|line| w(line));
    w("    workgroupBarrier();");
    let pass = schedule(depth);
    w(&format!(
        "    // {} K steps per pass; each step's loads go out {depth} step(s) before its multiply (past k, zeros).",
        pass.len()
    ));
    w(&format!("    for (var t = 0u; t < steps; t += {}u) {{", pass.len()));
    for (u, step) in pass.iter().enumerate() {
        if u > 0 {
            w(&format!("        if (t + {u}u >= steps) {{\n            break;\n        }}"));
        }
        // (Each step's fragments in a block of their own: a buffer's names recur.)
        let lines = [
            fetch(&format!("(t + {}u) * {bk}u", step.load), &set(step.load_set), "        "),
            vec!["        {".to_string()],
            compute(step.buf, "            "),
            vec!["        }".to_string()],
            stash(1 - step.buf, &set(step.store_set), "        "),
        ]
        .concat();
        lines.iter().for_each(|line| w(line));
        w("        workgroupBarrier();");
    }
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
    w(&format!("    // Each subgroup's staging slice: 256 values from sg·256 (sg < {}: inside Cs).", wm * wn));
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The pipeline of [`schedule`] as the kernel runs it, for every `ahead`
    /// and number of K steps (the loop left where step t + u reaches the
    /// number of steps): every step is multiplied exactly once, in order, out
    /// of a buffer holding it; a set is loaded only after the step it held was
    /// stored; the step stored is the next one.
    #[test]
    fn every_k_step_is_multiplied_once_from_the_buffer_that_holds_it() {
        for ahead in 1..=4u32 {
            let pass = schedule(ahead);
            assert_eq!(pass.len() % 2, 0);
            assert_eq!(pass.len() as u32 % ahead, 0);
            for steps in 1..=20u32 {
                // Each set: (step held, stored yet); each buffer: step held.
                let mut sets: Vec<(u32, bool)> = (0..ahead).map(|s| (s, false)).collect();
                let mut bufs = [Some(0), None];
                sets[0].1 = true;
                let mut multiplied = Vec::new();
                let mut t = 0;
                'passes: while t < steps {
                    for (u, step) in pass.iter().enumerate() {
                        let now = t + u as u32;
                        if u > 0 && now >= steps {
                            break 'passes;
                        }
                        let set = &mut sets[step.load_set as usize];
                        assert!(
                            set.1,
                            "ahead {ahead}, steps {steps}: set {} reloaded before it was stored",
                            step.load_set
                        );
                        *set = (t + step.load, false);
                        assert_eq!(step.load, u as u32 + ahead);
                        assert_eq!(bufs[step.buf], Some(now), "ahead {ahead}, steps {steps}, step {now}");
                        multiplied.push(now);
                        let stored = &mut sets[step.store_set as usize];
                        assert_eq!(stored.0, now + 1, "ahead {ahead}, steps {steps}");
                        stored.1 = true;
                        bufs[1 - step.buf] = Some(now + 1);
                    }
                    t += pass.len() as u32;
                }
                assert_eq!(multiplied, (0..steps).collect::<Vec<_>>(), "ahead {ahead}, steps {steps}");
            }
        }
    }
}
