// Per-row ops on a rows × cols matrix: softmax / log_softmax, layer_norm, rms_norm.
//
// One workgroup of 256 invocations per row (flat group index over a possibly
// 2-D grid). Each pass strides over the row with coalesced loads and reduces
// through workgroup memory; later passes re-read the row, which is then still
// in cache. (Keeping rows of up to 4096 floats in workgroup memory or in
// registers instead measured slower on an H200: 0.62–0.71 and 0.89–1.10 TB/s
// against 1.31–1.69 TB/s for this version.) Sums over a row are two-pass (mean
// first, then squared deviations) for accuracy.

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
const LOWEST: f32 = -3.4028234663852886e38;

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

// Sum (or max) of one value per invocation, returned to every invocation.
// Call from uniform control flow.
fn reduce(v: f32, lid: u32, is_max: bool) -> f32 {
    scratch[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if (lid < s) {
            let o = scratch[lid + s];
            scratch[lid] = select(scratch[lid] + o, max(scratch[lid], o), is_max);
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
    var m = LOWEST;
    for (var c = lid; c < p.cols; c += WG) {
        m = max(m, load_x(base + c));
    }
    m = reduce(m, lid, true);
    var s = 0.0;
    for (var c = lid; c < p.cols; c += WG) {
        s += exp(load_x(base + c) - m);
    }
    s = reduce(s, lid, false);
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
    let mean = reduce(s, lid, false) / n;
    var q = 0.0;
    for (var c = lid; c < p.cols; c += WG) {
        let d = load_x(base + c) - mean;
        q += d * d;
    }
    let inv = 1.0 / sqrt(reduce(q, lid, false) / n + p.eps);
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
    let inv = 1.0 / sqrt(reduce(q, lid, false) / f32(p.cols) + p.eps);
    for (var c = lid; c < p.cols; c += WG) {
        store_y(base + c, load_x(base + c) * inv * load_gamma(c));
    }
}
