// Whole-array reductions (sum, max, dot) in two passes.
//
// `partials`: each workgroup strides over its piece of the input (vec4 loads,
// lanes past `len` masked out), reduces its 256 values through workgroup
// memory, and writes one partial at `partial[p.out_index + group]`. A piece
// larger than one storage binding is split by the backend into several
// `partials` dispatches writing consecutive partials.
// `finish`: one workgroup reduces `p.len` partials to `out[0]`.
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
// Largest finite f32: the identity of max (WGSL has no infinities).
const LOWEST: f32 = -3.4028234663852886e38;

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

var<workgroup> scratch: array<f32, WG>;

fn identity() -> f32 {
    return select(0.0, LOWEST, OP == 1u);
}

fn combine(u: f32, v: f32) -> f32 {
    return select(u + v, max(u, v), OP == 1u);
}

// Reduces one value per invocation to scratch[0]; call from uniform control flow.
fn workgroup_reduce(v: f32, lid: u32) -> f32 {
    scratch[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if (lid < s) {
            scratch[lid] = combine(scratch[lid], scratch[lid + s]);
        }
        workgroupBarrier();
    }
    return scratch[0];
}

@compute @workgroup_size(256)
fn partials(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let n4 = (p.len + 3u) / 4u;
    let stride = nwg.x * WG;
    var acc = identity();
    var acc2 = identity();
    var j = wid.x * WG + lid;
    loop {
        if (j >= n4) {
            break;
        }
        var v = load_x(j);
        if (OP == 2u) {
            v = v * load_b(j);
        }
        // Mask the padding lanes of the last vec4.
        let first = j * 4u;
        let valid = vec4<bool>(first < p.len, first + 1u < p.len, first + 2u < p.len, first + 3u < p.len);
        v = select(vec4<f32>(identity()), v, valid);
        if (OP == 1u) {
            acc = max(acc, max(max(v.x, v.y), max(v.z, v.w)));
        } else {
            acc = acc + ((v.x + v.y) + (v.z + v.w));
        }
        j = j + stride;
        // Two accumulators per invocation keep two loads in flight.
        if (j < n4) {
            var w = load_x(j);
            if (OP == 2u) {
                w = w * load_b(j);
            }
            let f = j * 4u;
            let ok = vec4<bool>(f < p.len, f + 1u < p.len, f + 2u < p.len, f + 3u < p.len);
            w = select(vec4<f32>(identity()), w, ok);
            if (OP == 1u) {
                acc2 = max(acc2, max(max(w.x, w.y), max(w.z, w.w)));
            } else {
                acc2 = acc2 + ((w.x + w.y) + (w.z + w.w));
            }
        }
        j = j + stride;
    }
    let r = workgroup_reduce(combine(acc, acc2), lid);
    if (lid == 0u) {
        partial[p.out_index + wid.x] = r;
    }
}

@compute @workgroup_size(256)
fn finish(@builtin(local_invocation_index) lid: u32) {
    var acc = identity();
    for (var i = lid; i < p.len; i += WG) {
        acc = combine(acc, xs[i]);
    }
    let r = workgroup_reduce(acc, lid);
    if (lid == 0u) {
        out[0] = r;
    }
}
