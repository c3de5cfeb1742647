//! The entry points of `shaders/rows_register.wgsl`, written out per `vpt`
//! (vec4s of the row per invocation, 1..=[`MAX_VPT`]) with one named variable
//! per vec4 and every loop over them unrolled: no private array is indexed, so
//! the row stays in registers whatever the driver does with arrays (an
//! earlier row kernel that kept rows in a private array ran at 0.89–1.10 TB/s
//! on the H200, below the three-pass kernel it was meant to replace).
//!
//! - `softmax_reg` (`OP` 0: softmax, 1: log_softmax): the row's max (order
//!   keys), then `Σ e^(x − max)` (softmax keeps each `e^(x − max)` in place of
//!   `x`), then `e·(1/Σ)` or `x − (max + ln Σ)`.
//! - `layer_norm_reg`: the mean, then the centred sum of squares from the
//!   registers, then `(x − mean)·inv·γ + β`.
//! - `rms_norm_reg`: `Σx²`, then `x·(inv·γ)`.
//!
//! Invocation `lid` holds vec4s `lid + i·256` for `i < vpt`; all but the last
//! are inside every row of the lengths this `vpt` serves
//! (`1024·(vpt − 1) < cols ≤ 1024·vpt`), so only the last is guarded.

/// Most vec4s per invocation: rows of up to `1024 · MAX_VPT` values.
pub(crate) const MAX_VPT: u32 = 8;

/// The reduction helpers: one subgroup operation and a pass over the
/// subgroups' results (`subgroup`), or a tree in workgroup memory. Each
/// returns the same value in every invocation.
fn reductions(subgroup: bool) -> String {
    let mut s = String::from(
        "// Which invocation this is, for the reductions.\n\
         struct Lane {\n    lid: u32,\n    lane: u32,\n    sid: u32,\n    nsg: u32,\n}\n\n",
    );
    let helpers: [(&str, &str, &str, &str); 3] = [
        ("reduce_key", "i32", "red_key", "max"),
        ("reduce_a", "f32", "red_a", "add"),
        ("reduce_b", "f32", "red_b", "add"),
    ];
    for (name, ty, array, how) in helpers {
        let combine = |a: &str, b: &str| if how == "max" { format!("max({a}, {b})") } else { format!("{a} + {b}") };
        if subgroup {
            let op = if how == "max" { "subgroupMax" } else { "subgroupAdd" };
            s.push_str(&format!(
                "fn {name}(v: {ty}, t: Lane) -> {ty} {{\n    let r = {op}(v);\n    if (t.lane == 0u) {{\n        \
                 {array}[t.sid] = r;\n    }}\n    workgroupBarrier();\n    var acc = {array}[0];\n    \
                 for (var i = 1u; i < t.nsg; i++) {{\n        acc = {};\n    }}\n    return acc;\n}}\n\n",
                combine("acc", &format!("{array}[i]"))
            ));
        } else {
            s.push_str(&format!(
                "fn {name}(v: {ty}, t: Lane) -> {ty} {{\n    {array}[t.lid] = v;\n    workgroupBarrier();\n    \
                 for (var s = WG / 2u; s > 0u; s = s / 2u) {{\n        if (t.lid < s) {{\n            \
                 {array}[t.lid] = {};\n        }}\n        workgroupBarrier();\n    }}\n    return {array}[0];\n}}\n\n",
                combine(&format!("{array}[t.lid]"), &format!("{array}[t.lid + s]"))
            ));
        }
    }
    s
}

/// Lines of WGSL, indented by four spaces per level.
struct Body(String);

impl Body {
    fn line(&mut self, depth: usize, text: &str) {
        for _ in 0..depth {
            self.0.push_str("    ");
        }
        self.0.push_str(text);
        self.0.push('\n');
    }

    /// The lines of `text(i)` for every vec4 `i < vpt`, the last one's inside `if (last)`.
    fn each(&mut self, depth: usize, vpt: u32, text: impl Fn(u32) -> String) {
        for i in 0..vpt {
            let guarded = i + 1 == vpt;
            if guarded {
                self.line(depth, "if (last) {");
            }
            for l in text(i).lines() {
                self.line(depth + usize::from(guarded), l);
            }
            if guarded {
                self.line(depth, "}");
            }
        }
    }
}

/// The vec4 index in the row of invocation `lid`'s vec4 `i`.
fn at(i: u32) -> String {
    if i == 0 { "lid".into() } else { format!("lid + {}u", i * 256) }
}

/// An entry point's head: builtins, the row, the `Lane`, and the loads of the row.
fn head(b: &mut Body, name: &str, vpt: u32, subgroup: bool) {
    b.line(0, "@compute @workgroup_size(256)");
    b.line(0, &format!("fn {name}("));
    b.line(1, "@builtin(workgroup_id) wid: vec3<u32>,");
    b.line(1, "@builtin(num_workgroups) nwg: vec3<u32>,");
    b.line(1, "@builtin(local_invocation_index) lid: u32,");
    if subgroup {
        b.line(1, "@builtin(subgroup_invocation_id) lane: u32,");
        b.line(1, "@builtin(subgroup_size) size: u32,");
        b.line(1, "@builtin(subgroup_id) sid: u32,");
    }
    b.line(0, ") {");
    b.line(1, "let row = wid.x + wid.y * nwg.x;");
    b.line(1, "if (row >= p.rows) {");
    b.line(2, "return;");
    b.line(1, "}");
    if subgroup {
        b.line(1, "let t = Lane(lid, lane, sid, (WG + size - 1u) / size);");
    } else {
        b.line(1, "let t = Lane(lid, 0u, 0u, 0u);");
    }
    b.line(1, "let base = row * (p.cols / 4u);");
    b.line(1, &format!("let last = {} < p.cols / 4u;", at(vpt - 1)));
    for i in 0..vpt {
        b.line(1, &format!("var x{i} = vec4<f32>(0.0);"));
    }
    // Every load before any arithmetic: the whole row is in flight at once.
    b.each(1, vpt, |i| format!("x{i} = load_x(base + {});", at(i)));
}

fn softmax(b: &mut Body, vpt: u32, subgroup: bool) {
    head(b, "softmax_reg", vpt, subgroup);
    b.line(1, "var k = NEG_INF_KEY;");
    b.each(1, vpt, |i| format!("k = max(k, max_key(x{i}));"));
    b.line(1, "let m = unkey(reduce_key(k, t));");
    b.line(1, "let bad = !is_finite(m);");
    b.line(1, "var s = 0.0;");
    b.line(1, "if (OP == 0u) {");
    b.each(2, vpt, |i| format!("x{i} = exp(x{i} - m);\ns += hsum(x{i});"));
    b.line(2, "let r = 1.0 / reduce_a(s, t);");
    b.each(2, vpt, |i| format!("store_y(base + {}, or_nan(x{i} * r, bad));", at(i)));
    b.line(1, "} else {");
    b.each(2, vpt, |i| format!("s += hsum(exp(x{i} - m));"));
    b.line(2, "let shift = m + log(reduce_a(s, t));");
    b.each(2, vpt, |i| format!("store_y(base + {}, or_nan(x{i} - shift, bad));", at(i)));
    b.line(1, "}");
    b.line(0, "}");
}

fn layer_norm(b: &mut Body, vpt: u32, subgroup: bool) {
    head(b, "layer_norm_reg", vpt, subgroup);
    b.line(1, "var s = 0.0;");
    b.each(1, vpt, |i| format!("s += hsum(x{i});"));
    b.line(1, "let n = f32(p.cols);");
    b.line(1, "let mean = reduce_a(s, t) / n;");
    b.line(1, "var q = 0.0;");
    b.each(1, vpt, |i| format!("x{i} = x{i} - mean;\nq += dot(x{i}, x{i});"));
    b.line(1, "let inv = 1.0 / sqrt(reduce_b(q, t) / n + p.eps);");
    b.line(1, "let bad = !is_finite(mean);");
    b.each(1, vpt, |i| {
        let j = at(i);
        format!("store_y(base + {j}, or_nan(fma(x{i} * inv, load_gamma({j}), load_beta({j})), bad));")
    });
    b.line(0, "}");
}

fn rms_norm(b: &mut Body, vpt: u32, subgroup: bool) {
    head(b, "rms_norm_reg", vpt, subgroup);
    b.line(1, "var q = 0.0;");
    b.each(1, vpt, |i| format!("q += dot(x{i}, x{i});"));
    b.line(1, "let inv = 1.0 / sqrt(reduce_a(q, t) / f32(p.cols) + p.eps);");
    b.each(1, vpt, |i| {
        let j = at(i);
        format!("store_y(base + {j}, scaled(x{i}, inv * load_gamma({j})));")
    });
    b.line(0, "}");
}

/// The WGSL appended to `rows_register.wgsl` for `vpt` vec4s per invocation
/// (`1..=MAX_VPT`): the reductions (by subgroup operations with `subgroup`,
/// for devices with `wgpu::Features::SUBGROUP`) and the three entry points.
pub(crate) fn source(vpt: u32, subgroup: bool) -> String {
    let vpt = vpt.clamp(1, MAX_VPT);
    let mut b = Body(reductions(subgroup));
    softmax(&mut b, vpt, subgroup);
    b.line(0, "");
    layer_norm(&mut b, vpt, subgroup);
    b.line(0, "");
    rms_norm(&mut b, vpt, subgroup);
    b.0
}

/// The `vpt` of the register kernels for rows of `cols` values, or `None`
/// where they do not apply (a length that is not a multiple of 4, or longer
/// than `1024 · MAX_VPT`).
pub(crate) fn vpt_for(cols: usize) -> Option<u32> {
    let vpt = cols.div_ceil(1024);
    (cols.is_multiple_of(4) && cols > 0 && vpt <= MAX_VPT as usize).then_some(vpt as u32)
}
