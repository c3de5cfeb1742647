// Whole-array reductions (sum, max, dot) in two passes.
//
// `partials`: each workgroup strides over its piece of the input (vec4 loads,
// lanes past `len` masked out), reduces its 256 values through workgroup
// memory, and writes one partial, two floats at `partial[2 · (p.out_index +
// group)]`. A piece larger than one storage binding is split by the backend
// into several `partials` dispatches writing consecutive partials.
// `finish`: one workgroup reduces `p.len` partials to `out[0]`.
//
// Sums propagate NaN and infinities by IEEE arithmetic. GPUs may flush
// subnormal operands and results to zero (NVIDIA's Vulkan driver does), which
// would lose a sum of many subnormals, or of products that underflow, even
// where the total is a normal number. So a sum keeps two accumulators: terms
// that are normal numbers (or infinite, or NaN), and, scaled by 2^64 (exactly,
// from their bits), the terms that are zero or subnormal; a product that
// underflows is formed again from its factors scaled by 2^64. The partial is
// the pair; `finish` adds the scaled sum, scaled back, once at the end.
//
// Max does not use WGSL's `max` on floats, which may drop a NaN operand
// (drivers do): it compares order keys instead (`key`), integers that order
// like the values, with every NaN above +inf, so a NaN anywhere is the result,
// a vector of -inf gives -inf, and subnormals compare exactly even where the
// GPU flushes them in arithmetic. Its partial is the first float of the pair.
//
// Op codes (pipeline-overridable): 0 sum, 1 max, 2 dot (sum of a·b).
override OP: u32 = 0u;

struct Params {
    // Elements in this piece (partials: inputs; finish: partials).
    len: u32,
    // Index of this piece's first partial.
    out_index: u32,
}

const WG: u32 = 256u;
// The key of -inf: the identity of max.
const NEG_INF_KEY: i32 = -2139095041;

@group(0) @binding(0) var<uniform> p: Params;
// The inputs and their access functions, four elements at a time, as written
// here for f32 data; for f16 or bf16 inputs the backend replaces the lines
// between the markers (kernels.rs, `io_block`). Partials and the result stay f32.
// @io-begin
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
fn load_x(j: u32) -> vec4<f32> { return x[j]; }
@group(0) @binding(2) var<storage, read> b: array<vec4<f32>>;
fn load_b(j: u32) -> vec4<f32> { return b[j]; }
// @io-end
@group(0) @binding(3) var<storage, read_write> partial: array<f32>;
@group(0) @binding(4) var<storage, read> xs: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

var<workgroup> scratch: array<vec2<f32>, WG>;
var<workgroup> keys: array<i32, WG>;

const UP: f32 = 18446744073709551616.0; // 2^64
const DOWN: f32 = 5.42101086242752217e-20; // 2^-64

// Lanes that are zero or subnormal (their exponent bits are 0).
fn tiny(v: vec4<f32>) -> vec4<bool> {
    return (bitcast<vec4<u32>>(v) & vec4<u32>(0x7f800000u)) == vec4<u32>(0u);
}

// 2^64 · v for zero or subnormal lanes, exact: rebuilt from the mantissa bits
// (mantissa · 2^-149 · 2^64 = mantissa · 2^-85), as no arithmetic on a
// subnormal operand is safe where the GPU flushes it.
fn up(v: vec4<f32>) -> vec4<f32> {
    let bits = bitcast<vec4<u32>>(v);
    let m = vec4<f32>(bits & vec4<u32>(0x007fffffu)) * 2.58493941422821148e-26;
    return select(m, -m, (bits & vec4<u32>(0x80000000u)) != vec4<u32>(0u));
}

// Order keys: an f32's bits as an i32, with the other 31 bits of a negative
// value flipped, compare as signed integers as the values do (-inf < ... < -0
// < +0 < ... < +inf); every NaN gets the largest key, 0x7fffffff, itself a NaN.
// `unkey` inverts `key` (the flip is its own inverse).
fn key(v: vec4<f32>) -> vec4<i32> {
    let b = bitcast<vec4<i32>>(v);
    let k = b ^ ((b >> vec4<u32>(31u)) & vec4<i32>(0x7fffffff));
    return select(k, vec4<i32>(0x7fffffff), (b & vec4<i32>(0x7fffffff)) > vec4<i32>(0x7f800000));
}

fn unkey(k: i32) -> f32 {
    return bitcast<f32>(k ^ ((k >> 31u) & 0x7fffffff));
}

// The largest key of the lanes of `v` (elements `first`..`first + 3`) that lie before `len`.
fn max_key(v: vec4<f32>, first: u32) -> i32 {
    let valid = vec4<bool>(first < p.len, first + 1u < p.len, first + 2u < p.len, first + 3u < p.len);
    let k = select(vec4<i32>(NEG_INF_KEY), key(v), valid);
    return max(max(k.x, k.y), max(k.z, k.w));
}

// Sum of one pair per invocation, to every invocation; call from uniform control flow.
fn workgroup_sum(v: vec2<f32>, lid: u32) -> vec2<f32> {
    scratch[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if (lid < s) {
            scratch[lid] = scratch[lid] + scratch[lid + s];
        }
        workgroupBarrier();
    }
    return scratch[0];
}

// Largest of one key per invocation; call from uniform control flow.
fn workgroup_max(k: i32, lid: u32) -> i32 {
    keys[lid] = k;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if (lid < s) {
            keys[lid] = max(keys[lid], keys[lid + s]);
        }
        workgroupBarrier();
    }
    return keys[0];
}

// The terms of vec4 `j` (x, or x·b for dot) that lie before `len`, summed as
// (normal terms, 2^64 · the zero and subnormal ones).
fn lane_sum(j: u32) -> vec2<f32> {
    let u = load_x(j);
    var v = u;
    var scaled = vec4<f32>(0.0);
    if (OP == 2u) {
        let w = load_b(j);
        v = u * w;
        let t = tiny(v);
        if (any(t)) {
            // 2^64 · u·w: a subnormal factor rebuilt scaled; two normal
            // factors whose product underflows (so |u| < 1) with u scaled.
            let tu = tiny(u);
            let tw = tiny(w);
            let big = select(u * UP, u, tw) * select(w, up(w), tw);
            scaled = select(vec4<f32>(0.0), select(big, up(u) * w, tu), t);
            v = select(v, vec4<f32>(0.0), t);
        }
    } else {
        let t = tiny(v);
        if (any(t)) {
            scaled = select(vec4<f32>(0.0), up(v), t);
            v = select(v, vec4<f32>(0.0), t);
        }
    }
    let first = j * 4u;
    let valid = vec4<bool>(first < p.len, first + 1u < p.len, first + 2u < p.len, first + 3u < p.len);
    v = select(vec4<f32>(0.0), v, valid);
    scaled = select(vec4<f32>(0.0), scaled, valid);
    return vec2<f32>((v.x + v.y) + (v.z + v.w), (scaled.x + scaled.y) + (scaled.z + scaled.w));
}

@compute @workgroup_size(256)
fn partials(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let n4 = (p.len + 3u) / 4u;
    let stride = nwg.x * WG;
    // Two accumulators per invocation keep two loads in flight.
    var j = wid.x * WG + lid;
    if (OP == 1u) {
        var k0 = NEG_INF_KEY;
        var k1 = NEG_INF_KEY;
        loop {
            if (j >= n4) {
                break;
            }
            k0 = max(k0, max_key(load_x(j), j * 4u));
            j = j + stride;
            if (j < n4) {
                k1 = max(k1, max_key(load_x(j), j * 4u));
            }
            j = j + stride;
        }
        let r = workgroup_max(max(k0, k1), lid);
        if (lid == 0u) {
            partial[2u * (p.out_index + wid.x)] = unkey(r);
        }
        return;
    }
    var acc = vec2<f32>(0.0);
    var acc2 = vec2<f32>(0.0);
    loop {
        if (j >= n4) {
            break;
        }
        acc = acc + lane_sum(j);
        j = j + stride;
        if (j < n4) {
            acc2 = acc2 + lane_sum(j);
        }
        j = j + stride;
    }
    let r = workgroup_sum(acc + acc2, lid);
    if (lid == 0u) {
        partial[2u * (p.out_index + wid.x)] = r.x;
        partial[2u * (p.out_index + wid.x) + 1u] = r.y;
    }
}

@compute @workgroup_size(256)
fn finish(@builtin(local_invocation_index) lid: u32) {
    if (OP == 1u) {
        var k = NEG_INF_KEY;
        for (var i = lid; i < p.len; i += WG) {
            k = max(k, key(vec4<f32>(xs[2u * i])).x);
        }
        let r = workgroup_max(k, lid);
        if (lid == 0u) {
            out[0] = unkey(r);
        }
        return;
    }
    var acc = vec2<f32>(0.0);
    for (var i = lid; i < p.len; i += WG) {
        acc = acc + vec2<f32>(xs[2u * i], xs[2u * i + 1u]);
    }
    let r = workgroup_sum(acc, lid);
    if (lid == 0u) {
        out[0] = r.x + r.y * DOWN;
    }
}
