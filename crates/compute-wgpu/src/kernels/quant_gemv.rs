//! The `gemv` entry points of `shaders/quant.wgsl`, written out per
//! `(mr, nr)` with every loop over weight rows, `x` rows and value groups
//! unrolled and every sum a named `f32` variable: no private array is indexed,
//! so nothing depends on the driver unrolling loops to keep the sums in
//! registers (an earlier version with override-bounded loops over private
//! arrays ran 20–50× below the memory bandwidth on the H200).
//!
//! Per chunk step (`quant.wgsl`, "gemv helpers"), an invocation loads its
//! chunk of each of the `nr` rows (`load_chunk`), then for each of the eight
//! groups of four values: dequantizes the group of each row (`group_values`),
//! reads the matching four values of each of the `mr` rows of `x` once, and
//! adds the `mr · nr` dot products. The sums are reduced over the workgroup
//! by `subgroupAdd` and one pass over the subgroups' totals, or (without
//! subgroups) by a tree in workgroup memory, 16 sums at a time.

/// Name of the running sum of weight row `r` and `x` row `i`.
fn sum(r: u32, i: u32) -> String {
    format!("s{r}_{i}")
}

/// The WGSL of the `gemv` entry point (`gemv_subgroup` with `subgroup`) for
/// `mr` rows of `x` and `nr` weight rows per workgroup (`mr · nr ≤ 64`),
/// appended to `quant.wgsl`.
pub(crate) fn source(mr: u32, nr: u32, subgroup: bool) -> String {
    let mut s = String::new();
    let mut w = |line: String| {
        s.push_str(&line);
        s.push('\n');
    };
    w(format!("const MR: u32 = {mr}u;\nconst NR: u32 = {nr}u;"));
    w(String::new());
    w("// Writes total v of output a (weight row a / MR, x row a % MR) of the".into());
    w("// workgroup's rows from row0, if it exists.".into());
    w("fn write_total(a: u32, row0: u32, v: f32) {".into());
    w("    let r = a / MR;\n    let i = a % MR;".into());
    w("    if (row0 + r < p.n && i < p.m) {\n        out[(p.m0 + i) * p.ldy + p.j0 + row0 + r] = v;\n    }\n}".into());
    w(String::new());
    w("@compute @workgroup_size(WG)".into());
    let name = if subgroup { "gemv_subgroup" } else { "gemv" };
    w(format!("fn {name}("));
    w("    @builtin(local_invocation_index) lid: u32,".into());
    w("    @builtin(workgroup_id) wid: vec3<u32>,".into());
    w("    @builtin(num_workgroups) nwg: vec3<u32>,".into());
    if subgroup {
        w("    @builtin(subgroup_invocation_id) lane: u32,".into());
        w("    @builtin(subgroup_size) size: u32,".into());
        w("    @builtin(subgroup_id) sid: u32,".into());
    }
    w(") {".into());
    w("    let group = wid.x + wid.y * nwg.x;\n    if (group >= p.groups) {\n        return;\n    }".into());
    w("    let row0 = group * NR;".into());
    for r in 0..nr {
        for i in 0..mr {
            w(format!("    var {} = 0.0;", sum(r, i)));
        }
    }
    w("    let units = (p.k / block_values()) * chunks();".into());
    w("    for (var u = lid; u < units; u += WG) {".into());
    w("        let blk = u / chunks();\n        let c = u % chunks();".into());
    for r in 0..nr {
        // Rows past the piece reload its last row; their sums are not written.
        w(format!("        let c{r} = load_chunk(min(row0 + {r}u, p.n - 1u), blk, c);"));
    }
    for i in 0..mr {
        w(format!("        let x{i} = (p.m0 + {i}u) * p.k + c0.col;"));
    }
    for g in 0..8u32 {
        let word = format!("{}.{}", if g < 4 { "lo" } else { "hi" }, ["x", "y", "z", "w"][(g % 4) as usize]);
        for r in 0..nr {
            w(format!("        let w{r}_{g} = group_values(c{r}, c{r}.{word}, {g}u);"));
        }
        for i in 0..mr {
            // Rows of x past this pass read row m0 again (in range); their sums are not written.
            let row = if i == 0 { "x0".to_string() } else { format!("select(x0, x{i}, {i}u < p.m)") };
            w(format!("        let v{i}_{g} = load_x(({row} + goff({g}u)) >> 2u);"));
            for r in 0..nr {
                let t = sum(r, i);
                w(format!("        {t} += dot(w{r}_{g}, v{i}_{g});"));
            }
        }
    }
    w("    }".into());
    let sums: Vec<String> = (0..nr).flat_map(|r| (0..mr).map(move |i| sum(r, i))).collect();
    if subgroup {
        for (a, t) in sums.iter().enumerate() {
            w(format!("    let t{a} = subgroupAdd({t});"));
        }
        w("    if (lane == 0u) {".into());
        w("        let base = min(sid, 31u) * ACC;".into());
        for a in 0..sums.len() {
            w(format!("        red[base + {a}u] = t{a};"));
        }
        w("    }".into());
        w("    workgroupBarrier();".into());
        w("    if (lid < MR * NR) {".into());
        w("        var total = 0.0;".into());
        w("        let count = min((WG + size - 1u) / size, 32u);".into());
        w("        for (var g = 0u; g < count; g++) {\n            total += red[g * ACC + lid];\n        }".into());
        w("        write_total(lid, row0, total);\n    }".into());
    } else {
        for (pass, part) in sums.chunks(16).enumerate() {
            let a0 = pass * 16;
            for (a, t) in part.iter().enumerate() {
                w(format!("    red[lid * ACC_TREE + {a}u] = {t};"));
            }
            w("    workgroupBarrier();".into());
            w("    for (var s = WG / 2u; s > 0u; s = s / 2u) {".into());
            w("        if (lid < s) {".into());
            w(format!("            for (var a = 0u; a < {}u; a++) {{", part.len()));
            w("                red[lid * ACC_TREE + a] += red[(lid + s) * ACC_TREE + a];".into());
            w("            }\n        }\n        workgroupBarrier();\n    }".into());
            w(format!("    if (lid < {}u) {{\n        write_total({a0}u + lid, row0, red[lid]);\n    }}", part.len()));
            w("    workgroupBarrier();".into());
        }
    }
    w("}".into());
    s
}
