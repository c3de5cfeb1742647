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

/// Weight rows per team of [`source_dot`]'s workgroup, for `nr` rows per
/// workgroup (a multiple of the four teams).
fn team_rows(nr: u32) -> u32 {
    (nr / DOT_TEAMS).max(1)
}

/// Teams of 32 invocations in a workgroup of `quant.wgsl`'s 128.
const DOT_TEAMS: u32 = 4;

/// The WGSL of the `gemv_dot` entry point, appended to `quant.wgsl`: `y = x ·
/// Wᵀ` for one row of `x` and `q4_K` weights, `nr` weight rows per workgroup
/// (a multiple of 4, at most 64).
///
/// `x` is rounded to 8-bit integers, 16 values to a scale (`amax / 127`),
/// and each 16 quants meet them in four packed dot products
/// (`dot4I8Packed`: one instruction where the device has integer dot
/// products, e.g. NVIDIA's `dp4a`); the minimum terms take the exact `f32`
/// sum of the 16 values. So 64 values of one row (a *pair* of chunks: one
/// 32-byte run of quants, two sub-blocks) cost sixteen dot products and one
/// decoding of the block header, where the `gemv` entry point spends three
/// to four operations a value. The rounding of `x` stays within the
/// product's tolerance (`(max |x| / 254)·Σ|W|`, the bound of ggml's own
/// 8-bit activations).
///
/// The workgroup is four teams of 32 invocations, each team `nr / 4`
/// consecutive weight rows. The row is taken in phases of 2048 values (32
/// pairs): each invocation first loads its pair of each of its team's rows
/// (four neighbours read one block's 128 bytes of quants), then the
/// workgroup's 128 invocations round one 16-value group of `x` each into
/// workgroup memory, and after a barrier each invocation adds its pair of
/// each row. The 32 sums of each row meet in workgroup memory at the end.
pub(crate) fn source_dot(nr: u32) -> String {
    let rows = team_rows(nr);
    let mut s = String::new();
    let mut w = |line: &str| {
        s.push_str(line);
        s.push('\n');
    };
    w(&format!("const NR: u32 = {nr}u;\nconst DOT_R: u32 = {rows}u;\nconst DOT_TEAM: u32 = 32u;"));
    w(DOT_HELPERS);
    w("@compute @workgroup_size(WG)");
    w("fn gemv_dot(");
    w("    @builtin(local_invocation_index) lid: u32,");
    w("    @builtin(workgroup_id) wid: vec3<u32>,");
    w("    @builtin(num_workgroups) nwg: vec3<u32>,");
    w(") {");
    w("    let group = wid.x + wid.y * nwg.x;\n    if (group >= p.groups) {\n        return;\n    }");
    w("    let lane = lid % DOT_TEAM;\n    let team = lid / DOT_TEAM;");
    w("    let first = group * NR + team * DOT_R;");
    w("    let xb = (p.m0 * p.k) >> 2u;");
    for r in 0..rows {
        // Rows past the piece read its last row again; their sums are not written.
        w(&format!("    let row{r} = min(first + {r}u, p.n - 1u);\n    var s{r} = 0.0;"));
    }
    w("    let pairs = p.k / 64u;");
    w("    for (var phase = 0u; phase < p.k; phase += 2048u) {");
    w("        // This invocation's pair of chunks (one 32-byte run of quants, 64 values):");
    w("        // its rows' words first, whose loads do not wait for x.");
    w("        let pu = (phase >> 6u) + lane;\n        let ok = pu < pairs;\n        let pc = min(pu, pairs - 1u);");
    w("        let jp = pc & 3u;");
    for r in 0..rows {
        w(&format!("        let b{r} = (row{r} * (p.k / 256u) + (pc >> 2u)) * 9u;"));
        w(&format!(
            "        let h{r} = wv[b{r}];\n        let qa{r} = wv[b{r} + 1u + 2u * jp];\n        let qb{r} = wv[b{r} + 2u + 2u * jp];"
        ));
    }
    w("        // This invocation's 16 values of the phase's x, rounded (zeros past the row).");
    w("        let at = phase + 16u * lid;");
    w("        var mine = Xq(vec4<u32>(0u), 0.0, 0.0);");
    w("        if (at < p.k) {\n            mine = quantize16(xb + (at >> 2u));\n        }");
    w("        xs_q[lid] = mine.q;\n        xs_ds[lid] = vec2<f32>(mine.d, mine.s);");
    w("        workgroupBarrier();");
    w("        let g = min((pc * 64u - phase) >> 4u, 124u);");
    w(
        "        let x0 = shared_xq(g);\n        let x1 = shared_xq(g + 1u);\n        let x2 = shared_xq(g + 2u);\n        let x3 = shared_xq(g + 3u);",
    );
    for r in 0..rows {
        w(&format!("        s{r} += select(0.0, dot_pair(h{r}, qa{r}, qb{r}, jp, x0, x1, x2, x3), ok);"));
    }
    w("        workgroupBarrier();");
    w("    }");
    for r in 0..rows {
        w(&format!("    red[lid * DOT_R + {r}u] = s{r};"));
    }
    w("    workgroupBarrier();");
    w("    if (lid < NR) {");
    w("        let t = lid / DOT_R;\n        let r = lid % DOT_R;\n        var total = 0.0;");
    w(
        "        for (var l = 0u; l < DOT_TEAM; l++) {\n            total += red[(t * DOT_TEAM + l) * DOT_R + r];\n        }",
    );
    w("        let row = group * NR + lid;");
    w("        if (row < p.n) {\n            out[p.m0 * p.ldy + p.j0 + row] = total;\n        }\n    }");
    w("}");
    s
}

/// The helpers of [`source_dot`]'s entry point.
const DOT_HELPERS: &str = "
// 16 values of x as 8-bit integers (four words), their scale and their sum.
struct Xq {
    q: vec4<u32>,
    d: f32,
    s: f32,
}

// One phase's x (2048 values), 16 values a group, as quantize16 rounds them.
var<workgroup> xs_q: array<vec4<u32>, 128>;
var<workgroup> xs_ds: array<vec2<f32>, 128>;

fn shared_xq(g: u32) -> Xq {
    let ds = xs_ds[g];
    return Xq(xs_q[g], ds.x, ds.y);
}

// The 16 values of x from the vec4 at index j, rounded to integers of at most
// 127 in magnitude (to nearest, ties to even) on the scale amax / 127.
fn quantize16(j: u32) -> Xq {
    let a = load_x(j);
    let b = load_x(j + 1u);
    let c = load_x(j + 2u);
    let e = load_x(j + 3u);
    let m4 = max(max(abs(a), abs(b)), max(abs(c), abs(e)));
    let amax = max(max(m4.x, m4.y), max(m4.z, m4.w));
    let inv = select(0.0, 127.0 / amax, amax > 0.0);
    let q = vec4<u32>(
        pack4xI8(vec4<i32>(round(a * inv))),
        pack4xI8(vec4<i32>(round(b * inv))),
        pack4xI8(vec4<i32>(round(c * inv))),
        pack4xI8(vec4<i32>(round(e * inv))),
    );
    return Xq(q, amax / 127.0, dot((a + b) + (c + e), vec4<f32>(1.0)));
}

// The block's f16 d and dmin (low and high half of h) as f32: both normal,
// the exponent rebiased in a few integer operations; else f16_to_f32.
fn d_dmin(h: u32) -> vec2<f32> {
    let v = vec2<u32>(h & 0xffffu, h >> 16u);
    let e = (v >> vec2<u32>(10u)) & vec2<u32>(0x1fu);
    if (any(e == vec2<u32>(0u)) || any(e == vec2<u32>(0x1fu))) {
        return vec2<f32>(f16_to_f32(v.x), f16_to_f32(v.y));
    }
    let sign = (v & vec2<u32>(0x8000u)) << vec2<u32>(16u);
    return bitcast<vec2<f32>>(sign | (((v & vec2<u32>(0x7fffu)) << vec2<u32>(13u)) + vec2<u32>(0x38000000u)));
}

// Pair jp of a q4_K block (its two 16-byte runs of quants qa, qb; the
// block's header hdr) times x: the low nibbles of qa and qb against the
// groups x0 and x1 (the 32 values of sub-block 2jp), the high nibbles against
// x2 and x3 (sub-block 2jp + 1).
fn dot_pair(hdr: vec4<u32>, qa: vec4<u32>, qb: vec4<u32>, jp: u32, x0: Xq, x1: Xq, x2: Xq, x3: Xq) -> f32 {
    let m = vec4<u32>(0x0f0f0f0fu);
    let la = qa & m;
    let lb = qb & m;
    let ha = (qa >> vec4<u32>(4u)) & m;
    let hb = (qb >> vec4<u32>(4u)) & m;
    let i0 = (dot4I8Packed(la.x, x0.q.x) + dot4I8Packed(la.y, x0.q.y)) + (dot4I8Packed(la.z, x0.q.z) + dot4I8Packed(la.w, x0.q.w));
    let i1 = (dot4I8Packed(lb.x, x1.q.x) + dot4I8Packed(lb.y, x1.q.y)) + (dot4I8Packed(lb.z, x1.q.z) + dot4I8Packed(lb.w, x1.q.w));
    let i2 = (dot4I8Packed(ha.x, x2.q.x) + dot4I8Packed(ha.y, x2.q.y)) + (dot4I8Packed(ha.z, x2.q.z) + dot4I8Packed(ha.w, x2.q.w));
    let i3 = (dot4I8Packed(hb.x, x3.q.x) + dot4I8Packed(hb.y, x3.q.y)) + (dot4I8Packed(hb.z, x3.q.z) + dot4I8Packed(hb.w, x3.q.w));
    let sm = scales_mins_k4(hdr, jp);
    let dm = d_dmin(hdr.x);
    let lo = x0.d * f32(i0) + x1.d * f32(i1);
    let hi = x2.d * f32(i2) + x3.d * f32(i3);
    return dm.x * (sm.x * lo + sm.y * hi) - dm.y * (sm.z * (x0.s + x1.s) + sm.w * (x2.s + x3.s));
}
";
