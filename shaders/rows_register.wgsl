// Row ops with the whole row in registers: softmax / log_softmax, layer_norm,
// rms_norm on rows of at most 8192 values whose length is a multiple of 4.
//
// One workgroup of 256 invocations per row (flat group index over a possibly
// 2-D grid). Invocation `lid` holds the vec4s `lid`, `lid + 256`, … of its row
// (VPT of them, VPT = ceil(cols / 1024)), all loaded before any arithmetic, so
// the row is read from memory once and written once: the statistics come from
// registers. The entry points are written out per VPT by the backend
// (`kernels/rows_register.rs`) with one named variable per vec4, so nothing
// depends on the driver keeping a private array in registers. Reductions over
// the workgroup use subgroup operations where the device has them (one
// `subgroupMax`/`subgroupAdd`, then the subgroups' results through workgroup
// memory), else a tree in workgroup memory; each reduction has its own array,
// so none waits for the previous one's readers.
//
// Special values. WGSL lets an implementation assume there are no NaNs or
// infinities, and drivers act on it (`max` drops a NaN operand), so softmax
// takes the row's max through order keys (an f32's bits as an i32 with the
// other 31 bits of a negative value flipped compare as the values do; every
// NaN gets the largest key) and writes NaN for a row whose max is not finite
// (a NaN or +inf in it, or only -inf), as `x - max` gives on the CPU and in
// PyTorch. layer_norm writes NaN for a row whose mean is not finite. rms_norm
// rebuilds subnormal inputs from their bits (`scaled`), which a GPU that
// flushes subnormal operands would turn into zeros.

// softmax entry: 0 softmax, 1 log_softmax (pipeline-overridable).
override OP: u32 = 0u;

struct Params {
    // Rows in this piece.
    rows: u32,
    // Row length (a multiple of 4, at most 1024 · VPT).
    cols: u32,
    // Added to the variance / mean square.
    eps: f32,
}

const WG: u32 = 256u;
// The order key of -inf: the identity of max.
const NEG_INF_KEY: i32 = -2139095041;

@group(0) @binding(0) var<uniform> p: Params;
// The operands and their access functions, four elements at a time, as written
// here for f32 data. For f16 or bf16 inputs the backend replaces the lines
// between the markers (kernels.rs, `io_block`): x, gamma and beta are arrays of
// vec2<u32> (four packed values). y stays f32 then (the backend writes an f32
// temporary and casts it, as for `rows.wgsl`).
// @io-begin
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
fn load_x(j: u32) -> vec4<f32> { return x[j]; }
@group(0) @binding(2) var<storage, read_write> y: array<vec4<f32>>;
fn store_y(j: u32, v: vec4<f32>) { y[j] = v; }
@group(0) @binding(3) var<storage, read> gamma: array<vec4<f32>>;
fn load_gamma(j: u32) -> vec4<f32> { return gamma[j]; }
@group(0) @binding(4) var<storage, read> beta: array<vec4<f32>>;
fn load_beta(j: u32) -> vec4<f32> { return beta[j]; }
// @io-end

var<workgroup> red_key: array<i32, WG>;
var<workgroup> red_a: array<f32, WG>;
var<workgroup> red_b: array<f32, WG>;

// The largest order key of the four values of `v`.
fn max_key(v: vec4<f32>) -> i32 {
    let b = bitcast<vec4<i32>>(v);
    let k = b ^ ((b >> vec4<u32>(31u)) & vec4<i32>(0x7fffffff));
    let n = select(k, vec4<i32>(0x7fffffff), (b & vec4<i32>(0x7fffffff)) > vec4<i32>(0x7f800000));
    return max(max(n.x, n.y), max(n.z, n.w));
}

fn unkey(k: i32) -> f32 {
    return bitcast<f32>(k ^ ((k >> 31u) & 0x7fffffff));
}

fn is_finite(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7f800000u) != 0x7f800000u;
}

fn hsum(v: vec4<f32>) -> f32 {
    return (v.x + v.y) + (v.z + v.w);
}

// `v`, or NaN in every lane where `bad`. The NaN comes from a runtime value:
// a constant NaN is a shader-creation error in WebGPU's WGSL compilers.
fn or_nan(v: vec4<f32>, bad: bool) -> vec4<f32> {
    return select(v, bitcast<vec4<f32>>(vec4<u32>(0x7fc00000u | (p.cols & 0u))), bad);
}

// v·s lane by lane, also for subnormal lanes of v where the GPU flushes
// subnormal operands: those are rebuilt from their bits, scaled by 2^64 into
// the normal range, multiplied, and scaled back (exact but for the one
// rounding of the product).
fn scaled(v: vec4<f32>, s: vec4<f32>) -> vec4<f32> {
    let bits = bitcast<vec4<u32>>(v);
    let tiny = (bits & vec4<u32>(0x7f800000u)) == vec4<u32>(0u);
    if (!any(tiny)) {
        return v * s;
    }
    // mantissa · 2^-149 · 2^64 = mantissa · 2^-85, exact.
    let m = vec4<f32>(bits & vec4<u32>(0x007fffffu)) * 2.58493941422821148e-26;
    let up = select(m, -m, (bits & vec4<u32>(0x80000000u)) != vec4<u32>(0u));
    return select(v * s, (up * s) * 5.42101086242752217e-20, tiny);
}
