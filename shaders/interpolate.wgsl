// Spherical linear interpolation of the rows of a and b (rows × cols each),
// as compute_core's `Op::Slerp` documents it: the angle from the normalised
// rows, the given rows interpolated; lerp for zero rows (squared norm below
// the smallest normal f32) and near-(anti)parallel rows (|cos| > 0.9995);
// NaN rows where a squared norm is not finite. (Element-wise lerp is the
// `binary` entry of elementwise.wgsl, op code 3.)
//
// One workgroup of 256 invocations per row (flat group index over a possibly
// 2-D grid): a strided pass folds |a|², |b|² and <a, b> into one vec4 per
// invocation, reduced through workgroup memory; every invocation then
// evaluates the angle and the three sines with polynomials (Cephes asinf,
// sinf, cosf: a few ulp; WGSL's own acos and sin may be off by 2⁻¹¹
// absolute), and a second pass re-reads the row (in cache) and writes
// p·a + q·b.

struct Params {
    // Rows in this piece.
    rows: u32,
    // Row length.
    cols: u32,
    // Interpolation weight in [0, 1].
    t: f32,
}

const WG: u32 = 256u;
const PARALLEL: f32 = 0.9995;
const TINY: f32 = 1.17549435e-38;
const BIG: f32 = 3.4028234663852886e38;
const PI: f32 = 3.14159265358979;
const HALF_PI: f32 = 1.57079632679490;
const QUARTER_PI: f32 = 0.785398163397448;

@group(0) @binding(0) var<uniform> p: Params;
// The operands and their access functions, one element at a time, as written
// here for f32 data. For f16 or bf16 inputs the backend replaces the lines
// between the markers (kernels.rs, `io_block`): a and b become arrays of u32
// words of two packed values. y stays f32: the backend writes an f32
// temporary and casts it into a half output.
// @io-begin
@group(0) @binding(1) var<storage, read> a: array<f32>;
fn load_a(i: u32) -> f32 { return a[i]; }
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
fn store_y(i: u32, v: f32) { y[i] = v; }
@group(0) @binding(3) var<storage, read> b: array<f32>;
fn load_b(i: u32) -> f32 { return b[i]; }
// @io-end

var<workgroup> scratch: array<vec4<f32>, WG>;

// Sum of one vec4 per invocation, returned to every invocation. Call from
// uniform control flow.
fn reduce(v: vec4<f32>, lid: u32) -> vec4<f32> {
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

// acos(c) for c in [−1, 1] (Cephes acosf).
fn acos_(c: f32) -> f32 {
    let ac = abs(c);
    let big = ac > 0.5;
    // 0.5·(1 − |c|): exact for |c| in [0.5, 1].
    let z = select(c, sqrt(fma(ac, -0.5, 0.5)), big);
    let z2 = z * z;
    let poly = fma(fma(fma(fma(4.2163199e-2, z2, 2.4181311e-2), z2, 4.5470026e-2), z2, 7.4953003e-2), z2, 1.6666752e-1);
    let asn = fma(poly * z2, z, z);
    let two = asn + asn;
    return select(HALF_PI - asn, select(two, PI - two, c < 0.0), big);
}

// sin(x) for x in [0, π]: Cephes sinf/cosf polynomials on |r| ≤ π/4 after
// subtracting k·π/2 (k = 0, 1, 2) in three exact parts.
fn sin_0_pi(x: f32) -> f32 {
    let j1 = x > QUARTER_PI;
    let j2 = x > 3.0 * QUARTER_PI;
    let k = select(select(0.0, 1.0, j1), 2.0, j2);
    var r = fma(k, -1.5703125, x);
    r = fma(k, -4.8375130e-4, r);
    r = fma(k, -7.5497899e-8, r);
    let r2 = r * r;
    let s = fma(fma(fma(r2, -1.9515296e-4, 8.3321609e-3), r2, -1.6666655e-1) * r2, r, r);
    let c = fma(r2, -0.5, 1.0) + fma(fma(r2, 2.4433157e-5, -1.3887316e-3), r2, 4.1666646e-2) * (r2 * r2);
    return select(select(s, -s, j2), c, j1 && !j2);
}

@compute @workgroup_size(256)
fn slerp(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.cols;
    // x: |a|², y: |b|², z: <a, b>.
    var s = vec4<f32>(0.0);
    for (var c = lid; c < p.cols; c += WG) {
        let u = load_a(base + c);
        let v = load_b(base + c);
        s = fma(vec4<f32>(u, v, u, 0.0), vec4<f32>(u, v, v, 0.0), s);
    }
    s = reduce(s, lid);
    let t = p.t;
    let zero = s.x < TINY || s.y < TINY;
    // NaN and infinite squared norms fail `<= BIG`; their exponent bits are
    // tested too, as a driver that assumes no NaN may fold the comparison.
    let special = (bitcast<vec2<u32>>(s.xy) & vec2<u32>(0x7f800000u)) == vec2<u32>(0x7f800000u);
    let finite = !any(special) && s.x <= BIG && s.y <= BIG;
    let cosine = clamp(s.z / (sqrt(s.x) * sqrt(s.y)), -1.0, 1.0);
    let use_lerp = zero || (finite && abs(cosine) > PARALLEL);
    let w = acos_(cosine);
    let sw = sin_0_pi(w);
    var ca = sin_0_pi((1.0 - t) * w) / sw;
    var cb = sin_0_pi(t * w) / sw;
    // The ends exactly: t = 0 gives a, t = 1 gives b.
    if (t == 0.0) {
        ca = 1.0;
        cb = 0.0;
    }
    if (t == 1.0) {
        ca = 0.0;
        cb = 1.0;
    }
    let low = t < 0.5;
    let lc = select(t - 1.0, t, low);
    for (var c = lid; c < p.cols; c += WG) {
        let u = load_a(base + c);
        let v = load_b(base + c);
        var r: f32;
        if (use_lerp) {
            r = fma(lc, v - u, select(v, u, low));
        } else if (finite) {
            r = fma(ca, u, cb * v);
        } else {
            // A quiet NaN (WGSL has no NaN literal; the uniform keeps it a
            // run-time value, which constant evaluation may not reject).
            r = bitcast<f32>(0x7fc00000u | (p.cols & 0u));
        }
        store_y(base + c, r);
    }
}
