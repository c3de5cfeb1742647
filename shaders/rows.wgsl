// Per-row ops on a rows × cols matrix: softmax / log_softmax, layer_norm, rms_norm,
// for the rows `rows_register.wgsl` does not take (a length that is not a
// multiple of 4, or longer than 8192).
//
// One workgroup of 256 invocations per row (flat group index over a possibly
// 2-D grid). Each pass strides over the row with coalesced loads and reduces
// through workgroup memory; later passes re-read the row, which is then still
// in cache. Sums over a row are two-pass (mean first, then squared deviations)
// for accuracy.

// softmax entry: 0 softmax, 1 log_softmax (pipeline-overridable).
override OP: u32 = 0u;

struct Params {
    // Rows in this piece.
    rows: u32,
    // Row length.
    cols: u32,
    // Added to the variance / mean square.
    eps: f32,
}

const WG: u32 = 256u;
// The order key of -inf (see `key`): the identity of max.
const NEG_INF_KEY: i32 = -2139095041;

@group(0) @binding(0) var<uniform> p: Params;
// The operands and their access functions, one element at a time, as written
// here for f32 data. For f16 or bf16 inputs the backend replaces the lines
// between the markers (kernels.rs, `io_block`): x, gamma and beta are arrays of
// u32 words of two packed values. y stays f32 then: two invocations write the
// two halves of one word, so the backend writes an f32 temporary and casts it.
// @io-begin
@group(0) @binding(1) var<storage, read> x: array<f32>;
fn load_x(i: u32) -> f32 { return x[i]; }
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
fn store_y(i: u32, v: f32) { y[i] = v; }
@group(0) @binding(3) var<storage, read> gamma: array<f32>;
fn load_gamma(i: u32) -> f32 { return gamma[i]; }
@group(0) @binding(4) var<storage, read> beta: array<f32>;
fn load_beta(i: u32) -> f32 { return beta[i]; }
// @io-end

var<workgroup> scratch: array<f32, WG>;
var<workgroup> keys: array<i32, WG>;

// Special values. WGSL lets an implementation assume there are no NaNs or
// infinities, and drivers act on it (`max` drops a NaN operand), so softmax
// takes the row's max through order keys: an f32's bits as an i32 with the
// other 31 bits of a negative value flipped compare as the values do, and
// every NaN gets the largest key. A row whose max is not finite (it
// holds a NaN or +inf, or only -inf) is NaN, as `x - max` makes it in IEEE
// arithmetic (and in PyTorch). Norms need nothing: sums and products propagate.
fn key(v: f32) -> i32 {
    let b = bitcast<i32>(v);
    return select(b ^ ((b >> 31u) & 0x7fffffff), 0x7fffffff, (b & 0x7fffffff) > 0x7f800000);
}

fn unkey(k: i32) -> f32 {
    return bitcast<f32>(k ^ ((k >> 31u) & 0x7fffffff));
}

fn is_finite(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7f800000u) != 0x7f800000u;
}

// v·s, also for a subnormal v where the GPU flushes subnormal operands (NVIDIA's
// Vulkan driver does): v is rebuilt from its bits, scaled by 2^64 into the
// normal range, multiplied, and scaled back. An RMS norm scales a row of
// subnormals up by up to 1/sqrt(eps), into the normal range.
fn scaled(v: f32, s: f32) -> f32 {
    let bits = bitcast<u32>(v);
    if ((bits & 0x7f800000u) != 0u) {
        return v * s;
    }
    // mantissa · 2^-149 · 2^64 = mantissa · 2^-85, exact.
    let m = f32(bits & 0x007fffffu) * 2.58493941422821148e-26;
    let up = select(m, -m, (bits & 0x80000000u) != 0u);
    return (up * s) * 5.42101086242752217e-20; // · 2^-64
}

// Largest of one key per invocation, to every invocation as a uniform value;
// call from uniform control flow.
fn reduce_max_key(k: i32, lid: u32) -> i32 {
    keys[lid] = k;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if (lid < s) {
            keys[lid] = max(keys[lid], keys[lid + s]);
        }
        workgroupBarrier();
    }
    return workgroupUniformLoad(&keys[0]);
}

// Sum of one value per invocation, returned to every invocation.
// Call from uniform control flow.
fn reduce(v: f32, lid: u32) -> f32 {
    scratch[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if (lid < s) {
            scratch[lid] = scratch[lid] + scratch[lid + s];
        }
        workgroupBarrier();
    }
    let r = scratch[0];
    workgroupBarrier();
    return r;
}

// Three passes over the row (max, sum of exponentials, output).
@compute @workgroup_size(256)
fn softmax(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.cols;
    var k = NEG_INF_KEY;
    for (var c = lid; c < p.cols; c += WG) {
        k = max(k, key(load_x(base + c)));
    }
    let m = unkey(reduce_max_key(k, lid));
    if (!is_finite(m)) {
        // From a runtime value: a constant NaN is a shader-creation error in
        // WebGPU's WGSL compilers.
        let nan = bitcast<f32>(0x7fc00000u | (p.cols & 0u));
        for (var c = lid; c < p.cols; c += WG) {
            store_y(base + c, nan);
        }
        return;
    }
    var s = 0.0;
    for (var c = lid; c < p.cols; c += WG) {
        s += exp(load_x(base + c) - m);
    }
    s = reduce(s, lid);
    if (OP == 0u) {
        let inv = 1.0 / s;
        for (var c = lid; c < p.cols; c += WG) {
            store_y(base + c, exp(load_x(base + c) - m) * inv);
        }
    } else {
        let shift = m + log(s);
        for (var c = lid; c < p.cols; c += WG) {
            store_y(base + c, load_x(base + c) - shift);
        }
    }
}

@compute @workgroup_size(256)
fn layer_norm(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.cols;
    let n = f32(p.cols);
    var s = 0.0;
    for (var c = lid; c < p.cols; c += WG) {
        s += load_x(base + c);
    }
    let mean = reduce(s, lid) / n;
    var q = 0.0;
    for (var c = lid; c < p.cols; c += WG) {
        let d = load_x(base + c) - mean;
        q += d * d;
    }
    let inv = 1.0 / sqrt(reduce(q, lid) / n + p.eps);
    for (var c = lid; c < p.cols; c += WG) {
        store_y(base + c, (load_x(base + c) - mean) * inv * load_gamma(c) + load_beta(c));
    }
}

@compute @workgroup_size(256)
fn rms_norm(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.cols;
    var q = 0.0;
    for (var c = lid; c < p.cols; c += WG) {
        let v = load_x(base + c);
        q += v * v;
    }
    let inv = 1.0 / sqrt(reduce(q, lid) / f32(p.cols) + p.eps);
    for (var c = lid; c < p.cols; c += WG) {
        store_y(base + c, scaled(load_x(base + c), inv * load_gamma(c)));
    }
}
