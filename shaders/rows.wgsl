// Per-row ops on a rows × cols matrix: softmax / log_softmax, layer_norm, rms_norm.
//
// One workgroup of 256 invocations per row (flat group index over a possibly
// 2-D grid). Each pass strides over the row with coalesced loads and reduces
// through workgroup memory. Softmax keeps a row of up to 4096 floats in
// workgroup memory (one read and one write of device memory per element); the
// other passes re-read the row, which is then still in cache. Sums over a row
// are two-pass (mean first, then squared deviations) for accuracy.

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
const LOWEST: f32 = -3.40282347e38;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<storage, read> gamma: array<f32>;
@group(0) @binding(4) var<storage, read> beta: array<f32>;

var<workgroup> scratch: array<f32, WG>;
// Softmax's copy of its row (rows of at most CACHE floats).
const CACHE: u32 = 4096u;
var<workgroup> row_cache: array<f32, CACHE>;

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
    // Uniform: every invocation of the workgroup takes the same branches below.
    let cached = p.cols <= CACHE;
    var m = LOWEST;
    for (var c = lid; c < p.cols; c += WG) {
        let v = x[base + c];
        if (cached) {
            row_cache[c] = v;
        }
        m = max(m, v);
    }
    m = reduce(m, lid, true);
    // Each invocation reads back only the elements it wrote: no barrier needed.
    var s = 0.0;
    for (var c = lid; c < p.cols; c += WG) {
        var v: f32;
        if (cached) {
            v = row_cache[c];
        } else {
            v = x[base + c];
        }
        let e = exp(v - m);
        if (cached && OP == 0u) {
            row_cache[c] = e;
        }
        s += e;
    }
    s = reduce(s, lid, false);
    if (OP == 0u) {
        let inv = 1.0 / s;
        for (var c = lid; c < p.cols; c += WG) {
            var e: f32;
            if (cached) {
                e = row_cache[c];
            } else {
                e = exp(x[base + c] - m);
            }
            y[base + c] = e * inv;
        }
    } else {
        let shift = m + log(s);
        for (var c = lid; c < p.cols; c += WG) {
            var v: f32;
            if (cached) {
                v = row_cache[c];
            } else {
                v = x[base + c];
            }
            y[base + c] = v - shift;
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
        s += x[base + c];
    }
    let mean = reduce(s, lid, false) / n;
    var q = 0.0;
    for (var c = lid; c < p.cols; c += WG) {
        let d = x[base + c] - mean;
        q += d * d;
    }
    let inv = 1.0 / sqrt(reduce(q, lid, false) / n + p.eps);
    for (var c = lid; c < p.cols; c += WG) {
        y[base + c] = (x[base + c] - mean) * inv * gamma[c] + beta[c];
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
        let v = x[base + c];
        q += v * v;
    }
    let inv = 1.0 / sqrt(reduce(q, lid, false) / f32(p.cols) + p.eps);
    for (var c = lid; c < p.cols; c += WG) {
        y[base + c] = x[base + c] * inv * gamma[c];
    }
}
