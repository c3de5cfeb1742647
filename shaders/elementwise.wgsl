// Element-wise ops: one input (`unary`) or two inputs of equal length
// (`binary`), `convert` (casts), from the dtype of x to that of y, and a
// matmul's epilogue (`epilogue`): y = act(alpha·x + beta·c0 + bias) for the
// f32 product x, with C₀ and the bias (one value per column) of y's dtype.
//
// Buffers are read and written four elements at a time (a vec4<f32>, or for
// f16/bf16 data a vec2<u32>): the backend allocates every buffer rounded up to
// 16 bytes, so the last four may hold up to 3 padding lanes past `len`; they
// are computed and written like the others and never read back.
// Each invocation handles PER vec4s, WG apart, so a warp's loads stay coalesced
// and several are in flight at once. The workgroup grid may be 2-D (more than
// 65535 groups): the flat group index is `wid.x + wid.y * nwg.x`.
//
// The op is a pipeline-overridable constant, so each op gets its own pipeline
// with the other branches folded away.

// Unary op codes: 0 relu, 1 leaky_relu(a), 2 elu(a), 3 sigmoid, 4 tanh, 5 swish,
// 6 gelu (tanh form), 7 gelu (erf form), 8 clip(a, b), 9 scale(a).
// Binary op codes: 0 add, 1 sub, 2 mul, 3 lerp(a = t), 4 swiglu (swish(x)·b).
// The epilogue's activation is the unary op OP, applied only with ACT.
override OP: u32 = 0u;
override ACT: bool = false;

struct Params {
    // Elements in this piece.
    len: u32,
    _pad: u32,
    // Op parameters (alpha, min/max, scale; lerp's t; the epilogue's alpha and beta).
    a: f32,
    b: f32,
    // The epilogue's: columns of C, the column of the piece's first element,
    // and flags (EPI_BIAS, EPI_C0).
    cols: u32,
    col0: u32,
    flags: u32,
}

const WG: u32 = 256u;
// vec4s per invocation (`binary` is unrolled for exactly 4).
const PER: u32 = 4u;

@group(0) @binding(0) var<uniform> p: Params;

// The operands and their access functions, four elements at a time, as written
// here for f32 data. For f16 or bf16 operands the backend replaces the lines
// between the markers (kernels.rs, `io_block`): the arrays hold vec2<u32>
// (four packed values) and the functions convert, so each invocation still
// reads and writes whole words.
// @io-begin
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
fn load_x(j: u32) -> vec4<f32> { return x[j]; }
@group(0) @binding(2) var<storage, read_write> y: array<vec4<f32>>;
fn store_y(j: u32, v: vec4<f32>) { y[j] = v; }
@group(0) @binding(3) var<storage, read> b: array<vec4<f32>>;
fn load_b(j: u32) -> vec4<f32> { return b[j]; }
@group(0) @binding(4) var<storage, read> c0: array<vec4<f32>>;
fn load_c0(j: u32) -> vec4<f32> { return c0[j]; }
@group(0) @binding(5) var<storage, read> bias: array<f32>;
fn load_bias(i: u32) -> f32 { return bias[i]; }
// @io-end

// 1 / (1 + e^-t), exact 0 below -87 (where e^t underflows f32) and no overflow above.
fn sigmoid(t: f32) -> f32 {
    if (t >= 0.0) {
        return 1.0 / (1.0 + exp(-min(t, 88.0)));
    }
    if (t < -87.0) {
        return 0.0;
    }
    let e = exp(t);
    return e / (1.0 + e);
}

// tanh through e^(2|x|), clamped where tanh is 1 in f32.
fn tanh_(v: f32) -> f32 {
    let a = min(abs(v), 9.0);
    let e = exp(2.0 * a);
    return sign(v) * (1.0 - 2.0 / (e + 1.0));
}

// erfc(z) for z >= 0 (Numerical Recipes erfcc: fractional error < 1.2e-7).
fn erfc_pos(z: f32) -> f32 {
    let zc = min(z, 12.0);
    let t = 1.0 / (1.0 + 0.5 * zc);
    let poly = -zc * zc - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806
        + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))));
    return t * exp(poly);
}

fn unary_op(v: f32) -> f32 {
    switch OP {
        case 0u: { return max(v, 0.0); }
        case 1u: { return select(p.a * v, v, v > 0.0); }
        case 2u: { return select(p.a * (exp(max(v, -88.0)) - 1.0), v, v > 0.0); }
        case 3u: { return sigmoid(v); }
        case 4u: { return tanh_(v); }
        case 5u: { return v * sigmoid(v); }
        case 6u: {
            // 0.5·x·(1 + tanh(u)) = x·sigmoid(2u): no cancellation for negative x.
            let u = 0.7978845608028654 * (v + 0.044715 * v * v * v);
            return v * sigmoid(2.0 * u);
        }
        case 7u: {
            // 0.5·x·(1 + erf(x/√2)) = 0.5·x·erfc(−x/√2).
            let z = v * 0.7071067811865476;
            var c: f32;
            if (z <= 0.0) {
                c = erfc_pos(-z);
            } else {
                c = 2.0 - erfc_pos(z);
            }
            return 0.5 * v * c;
        }
        case 8u: { return min(max(v, p.a), p.b); }
        default: { return p.a * v; }
    }
}

// Special values. WGSL lets an implementation assume there are no NaNs or
// infinities, and drivers act on it: `max`, `min` and `clamp` drop a NaN
// operand, and a comparison `x != x` may be folded to false.
// So NaN and -inf are told from their bits, which loads and bit casts keep: a
// NaN input gives that NaN back (`keep_nan`), and swish and gelu, whose
// formula is -inf·0 there, give their limit -0 (`limit_at_neg_inf`). A bit
// test and a select per element: free in a memory-bound kernel.
fn is_nan4(v: vec4<f32>) -> vec4<bool> {
    return (bitcast<vec4<u32>>(v) & vec4<u32>(0x7fffffffu)) > vec4<u32>(0x7f800000u);
}

fn is_neg_inf4(v: vec4<f32>) -> vec4<bool> {
    return bitcast<vec4<u32>>(v) == vec4<u32>(0xff800000u);
}

// -0.0, from its bits (a literal -0.0 may be folded to +0.0).
fn neg_zero4() -> vec4<f32> {
    return bitcast<vec4<f32>>(vec4<u32>(0x80000000u));
}

// The op's result `r` for the input `u`, with a NaN of `u` kept.
fn keep_nan(u: vec4<f32>, r: vec4<f32>) -> vec4<f32> {
    return select(r, u, is_nan4(u));
}

// `r`, or -0 where `u` is -inf.
fn limit_at_neg_inf(u: vec4<f32>, r: vec4<f32>) -> vec4<f32> {
    return select(r, neg_zero4(), is_neg_inf4(u));
}

// Subnormal inputs. GPUs may flush subnormals to zero in arithmetic (WGSL
// allows it; NVIDIA's Vulkan driver does), which loses normal results such as
// 1e-38 · 1.7 or 1e-38 + 1e-38. Loads and bit casts keep them, so add, sub, mul
// and scale rebuild subnormal operands from their bits, scaled by 2^64 into the
// normal range, and scale the result back: exact (one rounding) wherever the
// result is normal; so does lerp. Costs a few ALU operations per element of a
// memory-bound op.
const UP: f32 = 18446744073709551616.0; // 2^64
const DOWN: f32 = 5.42101086242752217e-20; // 2^-64

// 2^64 · v, exact for subnormal v (bits rebuilt: mantissa · 2^-149 · 2^64).
fn up(v: vec4<f32>) -> vec4<f32> {
    let bits = bitcast<vec4<u32>>(v);
    let mant = vec4<f32>(bits & vec4<u32>(0x007fffffu)) * 2.58493941422821148e-26; // 2^-85
    let sub = select(mant, -mant, (bits & vec4<u32>(0x80000000u)) != vec4<u32>(0u));
    return select(v * UP, sub, (bits & vec4<u32>(0x7f800000u)) == vec4<u32>(0u));
}

fn tiny(v: vec4<f32>) -> vec4<bool> {
    return (bitcast<vec4<u32>>(v) & vec4<u32>(0x7f800000u)) == vec4<u32>(0u);
}

// s · v, also for subnormal v.
fn scale(v: vec4<f32>, s: f32) -> vec4<f32> {
    let t = tiny(v);
    if (!any(t)) {
        return v * s;
    }
    return select(v * s, (up(v) * s) * DOWN, t);
}

// u + t·(v − u), exact at t = 0 and t = 1: t < 0.5 ? fma(t, v − u, u) : fma(t − 1, v − u, v).
fn lerp_fma(u: vec4<f32>, v: vec4<f32>) -> vec4<f32> {
    let t = p.a;
    let d = v - u;
    if (t < 0.5) {
        return fma(vec4<f32>(t), d, u);
    }
    return fma(vec4<f32>(t - 1.0), d, v);
}

// lerp_fma, also for subnormal operands: where a lane has one and neither
// operand is large (|x| < 2^32), both are rebuilt scaled by 2^64 (see `up`)
// and the result scaled back, exact wherever it is normal (lerp is linear, so
// scaling commutes with it). Elsewhere a flushed subnormal moves the result
// by less than its relative slack.
fn lerp(u: vec4<f32>, v: vec4<f32>) -> vec4<f32> {
    let plain = lerp_fma(u, v);
    let small = vec4<f32>(4294967296.0); // 2^32
    let scaled = (tiny(u) | tiny(v)) & (abs(u) < small) & (abs(v) < small);
    if (!any(scaled)) {
        return plain;
    }
    return select(plain, lerp_fma(up(u), up(v)) * DOWN, scaled);
}

// swish(u)·v = u·σ(u)·v, the gated product of a SwiGLU block (σ as `sigmoid`:
// exact 0 below -87, no overflow; swish(-inf) = -0, swish(NaN) = NaN).
fn swiglu(u: vec4<f32>, v: vec4<f32>) -> vec4<f32> {
    let s = vec4<f32>(sigmoid(u.x), sigmoid(u.y), sigmoid(u.z), sigmoid(u.w));
    return keep_nan(u, limit_at_neg_inf(u, u * s)) * v;
}

fn binary_op(u: vec4<f32>, v: vec4<f32>) -> vec4<f32> {
    if (OP == 3u) {
        return lerp(u, v);
    }
    if (OP == 4u) {
        return swiglu(u, v);
    }
    // The exact path only where a lane has a subnormal (or zero) operand: a rare,
    // per-invocation branch, so the common case stays three loads' worth of work.
    let tu = tiny(u);
    let tv = tiny(v);
    if (!any(tu | tv)) {
        switch OP {
            case 0u: { return u + v; }
            case 1u: { return u - v; }
            default: { return u * v; }
        }
    }
    switch OP {
        case 0u: { return select(u + v, (up(u) + up(v)) * DOWN, tu & tv); }
        case 1u: { return select(u - v, (up(u) - up(v)) * DOWN, tu & tv); }
        default: {
            // At most one subnormal factor matters: two make an underflow anyway.
            let w = select(u, up(u), tu);
            let z = select(v, up(v), tv & !tu);
            return select(u * v, (w * z) * DOWN, tu | tv);
        }
    }
}

// All PER loads are issued before any store: storage bindings may alias as far as
// the driver knows, so interleaving would serialise the loads.
@compute @workgroup_size(256)
fn unary(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let n4 = (p.len + 3u) / 4u;
    let base = (wid.x + wid.y * nwg.x) * (WG * PER) + lid;
    var v: array<vec4<f32>, PER>;
    for (var i = 0u; i < PER; i++) {
        let j = base + i * WG;
        if (j < n4) {
            v[i] = load_x(j);
        }
    }
    for (var i = 0u; i < PER; i++) {
        let j = base + i * WG;
        if (j < n4) {
            let u = v[i];
            if (OP == 9u) {
                store_y(j, scale(u, p.a));
            } else {
                var r = vec4<f32>(unary_op(u.x), unary_op(u.y), unary_op(u.z), unary_op(u.w));
                if (OP == 5u || OP == 6u || OP == 7u) {
                    r = limit_at_neg_inf(u, r);
                }
                store_y(j, keep_nan(u, r));
            }
        }
    }
}

// Unrolled by hand (no private arrays): with the subnormal path inlined, a
// loop over arrays as in `unary` may stay a loop, and its arrays then live in
// local memory.
@compute @workgroup_size(256)
fn binary(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let n4 = (p.len + 3u) / 4u;
    let j0 = (wid.x + wid.y * nwg.x) * (WG * PER) + lid;
    let j1 = j0 + WG;
    let j2 = j1 + WG;
    let j3 = j2 + WG;
    var u0 = vec4<f32>(0.0);
    var v0 = vec4<f32>(0.0);
    var u1 = vec4<f32>(0.0);
    var v1 = vec4<f32>(0.0);
    var u2 = vec4<f32>(0.0);
    var v2 = vec4<f32>(0.0);
    var u3 = vec4<f32>(0.0);
    var v3 = vec4<f32>(0.0);
    if (j0 < n4) {
        u0 = load_x(j0);
        v0 = load_b(j0);
    }
    if (j1 < n4) {
        u1 = load_x(j1);
        v1 = load_b(j1);
    }
    if (j2 < n4) {
        u2 = load_x(j2);
        v2 = load_b(j2);
    }
    if (j3 < n4) {
        u3 = load_x(j3);
        v3 = load_b(j3);
    }
    if (j0 < n4) {
        store_y(j0, binary_op(u0, v0));
    }
    if (j1 < n4) {
        store_y(j1, binary_op(u1, v1));
    }
    if (j2 < n4) {
        store_y(j2, binary_op(u2, v2));
    }
    if (j3 < n4) {
        store_y(j3, binary_op(u3, v3));
    }
}

// y = x, converted from x's dtype to y's (rounding in `store_y`; the backend
// builds this entry only for two different dtypes: an f32 → f32 cast is a copy).
@compute @workgroup_size(256)
fn convert(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let n4 = (p.len + 3u) / 4u;
    let base = (wid.x + wid.y * nwg.x) * (WG * PER) + lid;
    for (var i = 0u; i < PER; i++) {
        let j = base + i * WG;
        if (j < n4) {
            store_y(j, load_x(j));
        }
    }
}

// The epilogue's flags: a bias is added; C₀ is read (beta ≠ 0).
const EPI_BIAS: u32 = 1u;
const EPI_C0: u32 = 2u;

// The column of element i of the piece: (col0 + i) mod cols, without overflow.
fn column(i: u32) -> u32 {
    let r = i % p.cols;
    let d = p.cols - p.col0;
    return select(p.col0 + r, r - d, r >= d);
}

// The column after column c.
fn next_column(c: u32) -> u32 {
    return select(c + 1u, 0u, c + 1u == p.cols);
}

// y = act(alpha·x + beta·c0 + bias), in the order of the CPU's epilogue:
// alpha·x, then beta·c0 by a fused multiply-add, then the bias, then the
// activation (the unary kernel's, special values included). The padding
// lanes of the last vec4 compute on padding and are never read back.
@compute @workgroup_size(256)
fn epilogue(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let n4 = (p.len + 3u) / 4u;
    let base = (wid.x + wid.y * nwg.x) * (WG * PER) + lid;
    var v: array<vec4<f32>, PER>;
    var c: array<vec4<f32>, PER>;
    for (var i = 0u; i < PER; i++) {
        let j = base + i * WG;
        if (j < n4) {
            v[i] = load_x(j);
            if ((p.flags & EPI_C0) != 0u) {
                c[i] = load_c0(j);
            }
        }
    }
    for (var i = 0u; i < PER; i++) {
        let j = base + i * WG;
        if (j < n4) {
            var u = p.a * v[i];
            if ((p.flags & EPI_C0) != 0u) {
                u = fma(vec4<f32>(p.b), c[i], u);
            }
            if ((p.flags & EPI_BIAS) != 0u) {
                let k0 = column(4u * j);
                let k1 = next_column(k0);
                let k2 = next_column(k1);
                let k3 = next_column(k2);
                u = u + vec4<f32>(load_bias(k0), load_bias(k1), load_bias(k2), load_bias(k3));
            }
            if (ACT) {
                var r = vec4<f32>(unary_op(u.x), unary_op(u.y), unary_op(u.z), unary_op(u.w));
                if (OP == 5u || OP == 6u || OP == 7u) {
                    r = limit_at_neg_inf(u, r);
                }
                u = keep_nan(u, r);
            }
            store_y(j, u);
        }
    }
}
