// C = op(A) · op(B), batched, for any m, k, n: tiled through workgroup memory
// with register blocking.
//
// Each workgroup of 256 invocations (16 × 16) computes a BM × BN = 128 × 128
// tile of C; each invocation an 8 × 8 block of it (rows ty·4..+4 and 64+ty·4..+4,
// columns tx·4..+4 and 64+tx·4..+4), held in 16 vec4 accumulators. K is walked
// in steps of BK = 8: every invocation loads one vec4 of A and one of B from
// global memory into registers for the next step while it multiplies the
// current step out of workgroup memory (double-buffered: one barrier per step).
// Workgroup tiles are stored k-major (As[k][m], Bs[k][n]) so the inner loop
// reads 2 vec4 of A and 2 of B per 64 FMAs.
//
// Two entry points share the tiling and the inner loop:
// - `matmul_vec4` loads A, B and stores C as vec4. It needs the contiguous
//   dimension of each stored matrix (A: k, or m when transposed; B: n, or k when
//   transposed) and n to be multiples of 4, so every vec4 is wholly inside or
//   wholly outside the matrix.
// - `matmul_scalar` loads and stores element by element: any shape.
// Edges are bounds-checked against m, k, n (zeros are loaded outside), so the
// kernel never indexes past a binding: every global index below is
// `z·stride + row·ld + col` with row, col checked against the matrix's extents,
// and every workgroup index is below 2·BK·BM/4 by construction. That is what
// lets the backend compile this module without naga's runtime bounds checks.
//
// Transposes are pipeline-overridable constants; batch is the grid's z.

override TA: bool = false;
override TB: bool = false;

struct Params {
    m: u32,
    n: u32,
    k: u32,
    // First batch index of this dispatch (batches beyond the z-grid limit).
    z0: u32,
    // Elements between consecutive matrices of A, B and C.
    sa: u32,
    sb: u32,
    sc: u32,
}

const BK: u32 = 8u;
// One buffer of a tile: BK rows of 128 floats = BK·32 vec4.
const TILE: u32 = 256u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> b4: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> c4: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> a1: array<f32>;
@group(0) @binding(5) var<storage, read> b1: array<f32>;
@group(0) @binding(6) var<storage, read_write> c1: array<f32>;

// Double-buffered tiles: As[buf·TILE + kk·32 + m/4][m%4].
var<workgroup> As: array<vec4<f32>, 512>;
var<workgroup> Bs: array<vec4<f32>, 512>;

var<private> acc: array<vec4<f32>, 16>;

// Where invocation `lid` loads its vec4 of a 128 × BK tile stored with the
// tile's long side contiguous (`long`) or its k side contiguous (`!long`):
// returns (index along the 128 side, index along k) of the vec4's first element.
fn slot(lid: u32, long: bool) -> vec2<u32> {
    if (long) {
        return vec2<u32>((lid % 32u) * 4u, lid / 32u);
    }
    return vec2<u32>(lid / 2u, (lid % 2u) * 4u);
}

// Stores a loaded vec4 into a tile buffer of A (B below). `long`: the vec4 runs
// along the 128 side (stored as is); otherwise it runs along k (scattered over 4
// k rows). Two copies because WGSL functions cannot take workgroup pointers.
fn put_a(buf: u32, lid: u32, long: bool, v: vec4<f32>) {
    if (long) {
        As[buf + lid] = v;
    } else {
        let s = slot(lid, false);
        let q = buf + s.y * 32u + s.x / 4u;
        let c = s.x % 4u;
        As[q][c] = v.x;
        As[q + 32u][c] = v.y;
        As[q + 64u][c] = v.z;
        As[q + 96u][c] = v.w;
    }
}

fn put_b(buf: u32, lid: u32, long: bool, v: vec4<f32>) {
    if (long) {
        Bs[buf + lid] = v;
    } else {
        let s = slot(lid, false);
        let q = buf + s.y * 32u + s.x / 4u;
        let c = s.x % 4u;
        Bs[q][c] = v.x;
        Bs[q + 32u][c] = v.y;
        Bs[q + 64u][c] = v.z;
        Bs[q + 96u][c] = v.w;
    }
}

// 64 FMAs per k: the 8 × 8 block of this invocation.
fn multiply(buf: u32, tx: u32, ty: u32) {
    for (var kk = 0u; kk < BK; kk++) {
        let r = buf + kk * 32u;
        let x0 = As[r + ty];
        let x1 = As[r + 16u + ty];
        let y0 = Bs[r + tx];
        let y1 = Bs[r + 16u + tx];
        acc[0] = fma(vec4<f32>(x0.x), y0, acc[0]);
        acc[1] = fma(vec4<f32>(x0.x), y1, acc[1]);
        acc[2] = fma(vec4<f32>(x0.y), y0, acc[2]);
        acc[3] = fma(vec4<f32>(x0.y), y1, acc[3]);
        acc[4] = fma(vec4<f32>(x0.z), y0, acc[4]);
        acc[5] = fma(vec4<f32>(x0.z), y1, acc[5]);
        acc[6] = fma(vec4<f32>(x0.w), y0, acc[6]);
        acc[7] = fma(vec4<f32>(x0.w), y1, acc[7]);
        acc[8] = fma(vec4<f32>(x1.x), y0, acc[8]);
        acc[9] = fma(vec4<f32>(x1.x), y1, acc[9]);
        acc[10] = fma(vec4<f32>(x1.y), y0, acc[10]);
        acc[11] = fma(vec4<f32>(x1.y), y1, acc[11]);
        acc[12] = fma(vec4<f32>(x1.z), y0, acc[12]);
        acc[13] = fma(vec4<f32>(x1.z), y1, acc[13]);
        acc[14] = fma(vec4<f32>(x1.w), y0, acc[14]);
        acc[15] = fma(vec4<f32>(x1.w), y1, acc[15]);
    }
}

// ---- vec4 loads -------------------------------------------------------------

// A's vec4 for the tile at (row0, k0): A is m × k (k contiguous), or k × m when TA.
fn load_a4(z: u32, row0: u32, k0: u32, lid: u32) -> vec4<f32> {
    let s = slot(lid, TA);
    let row = row0 + s.x;
    let kc = k0 + s.y;
    if (row < p.m && kc < p.k) {
        if (TA) {
            return a4[(z * p.sa + kc * p.m + row) / 4u];
        }
        return a4[(z * p.sa + row * p.k + kc) / 4u];
    }
    return vec4<f32>(0.0);
}

// B's vec4 for the tile at (k0, col0): B is k × n (n contiguous), or n × k when TB.
fn load_b4(z: u32, col0: u32, k0: u32, lid: u32) -> vec4<f32> {
    let s = slot(lid, !TB);
    let col = col0 + s.x;
    let kc = k0 + s.y;
    if (col < p.n && kc < p.k) {
        if (TB) {
            return b4[(z * p.sb + col * p.k + kc) / 4u];
        }
        return b4[(z * p.sb + kc * p.n + col) / 4u];
    }
    return vec4<f32>(0.0);
}

// Row `row` of C at columns c0..c0+4 and c0+64..c0+68, as vec4 (n % 4 == 0).
fn store4(z: u32, row: u32, c0: u32, v0: vec4<f32>, v1: vec4<f32>) {
    if (row < p.m) {
        let at = z * p.sc + row * p.n;
        if (c0 < p.n) {
            c4[(at + c0) / 4u] = v0;
        }
        if (c0 + 64u < p.n) {
            c4[(at + c0 + 64u) / 4u] = v1;
        }
    }
}

@compute @workgroup_size(256)
fn matmul_vec4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let z = wid.z + p.z0;
    let row0 = wid.y * 128u;
    let col0 = wid.x * 128u;
    let tx = lid % 16u;
    let ty = lid / 16u;
    let steps = (p.k + BK - 1u) / BK;
    var va = load_a4(z, row0, 0u, lid);
    var vb = load_b4(z, col0, 0u, lid);
    put_a(0u, lid, TA, va);
    put_b(0u, lid, !TB, vb);
    workgroupBarrier();
    for (var t = 0u; t < steps; t++) {
        let cur = (t % 2u) * TILE;
        let more = t + 1u < steps;
        if (more) {
            va = load_a4(z, row0, (t + 1u) * BK, lid);
            vb = load_b4(z, col0, (t + 1u) * BK, lid);
        }
        multiply(cur, tx, ty);
        if (more) {
            put_a(TILE - cur, lid, TA, va);
            put_b(TILE - cur, lid, !TB, vb);
        }
        workgroupBarrier();
    }
    // Literal accumulator indices only, so they stay in registers.
    let r0 = row0 + ty * 4u;
    let c0 = col0 + tx * 4u;
    store4(z, r0, c0, acc[0], acc[1]);
    store4(z, r0 + 1u, c0, acc[2], acc[3]);
    store4(z, r0 + 2u, c0, acc[4], acc[5]);
    store4(z, r0 + 3u, c0, acc[6], acc[7]);
    store4(z, r0 + 64u, c0, acc[8], acc[9]);
    store4(z, r0 + 65u, c0, acc[10], acc[11]);
    store4(z, r0 + 66u, c0, acc[12], acc[13]);
    store4(z, r0 + 67u, c0, acc[14], acc[15]);
}

// ---- scalar loads -----------------------------------------------------------

fn a_at(z: u32, row: u32, kc: u32) -> f32 {
    if (row < p.m && kc < p.k) {
        if (TA) {
            return a1[z * p.sa + kc * p.m + row];
        }
        return a1[z * p.sa + row * p.k + kc];
    }
    return 0.0;
}

fn b_at(z: u32, col: u32, kc: u32) -> f32 {
    if (col < p.n && kc < p.k) {
        if (TB) {
            return b1[z * p.sb + col * p.k + kc];
        }
        return b1[z * p.sb + kc * p.n + col];
    }
    return 0.0;
}

// Same elements as load_a4, one at a time with each bounds-checked.
fn load_a1(z: u32, row0: u32, k0: u32, lid: u32) -> vec4<f32> {
    let s = slot(lid, TA);
    let row = row0 + s.x;
    let kc = k0 + s.y;
    if (TA) {
        return vec4<f32>(a_at(z, row, kc), a_at(z, row + 1u, kc), a_at(z, row + 2u, kc), a_at(z, row + 3u, kc));
    }
    return vec4<f32>(a_at(z, row, kc), a_at(z, row, kc + 1u), a_at(z, row, kc + 2u), a_at(z, row, kc + 3u));
}

fn load_b1(z: u32, col0: u32, k0: u32, lid: u32) -> vec4<f32> {
    let s = slot(lid, !TB);
    let col = col0 + s.x;
    let kc = k0 + s.y;
    if (TB) {
        return vec4<f32>(b_at(z, col, kc), b_at(z, col, kc + 1u), b_at(z, col, kc + 2u), b_at(z, col, kc + 3u));
    }
    return vec4<f32>(b_at(z, col, kc), b_at(z, col + 1u, kc), b_at(z, col + 2u, kc), b_at(z, col + 3u, kc));
}

// Same as store4, element by element (any n).
fn store1(z: u32, row: u32, c0: u32, v0: vec4<f32>, v1: vec4<f32>) {
    if (row < p.m) {
        let at = z * p.sc + row * p.n;
        for (var j = 0u; j < 4u; j++) {
            if (c0 + j < p.n) {
                c1[at + c0 + j] = v0[j];
            }
            if (c0 + 64u + j < p.n) {
                c1[at + c0 + 64u + j] = v1[j];
            }
        }
    }
}

@compute @workgroup_size(256)
fn matmul_scalar(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let z = wid.z + p.z0;
    let row0 = wid.y * 128u;
    let col0 = wid.x * 128u;
    let tx = lid % 16u;
    let ty = lid / 16u;
    let steps = (p.k + BK - 1u) / BK;
    var va = load_a1(z, row0, 0u, lid);
    var vb = load_b1(z, col0, 0u, lid);
    put_a(0u, lid, TA, va);
    put_b(0u, lid, !TB, vb);
    workgroupBarrier();
    for (var t = 0u; t < steps; t++) {
        let cur = (t % 2u) * TILE;
        let more = t + 1u < steps;
        if (more) {
            va = load_a1(z, row0, (t + 1u) * BK, lid);
            vb = load_b1(z, col0, (t + 1u) * BK, lid);
        }
        multiply(cur, tx, ty);
        if (more) {
            put_a(TILE - cur, lid, TA, va);
            put_b(TILE - cur, lid, !TB, vb);
        }
        workgroupBarrier();
    }
    let r0 = row0 + ty * 4u;
    let c0 = col0 + tx * 4u;
    store1(z, r0, c0, acc[0], acc[1]);
    store1(z, r0 + 1u, c0, acc[2], acc[3]);
    store1(z, r0 + 2u, c0, acc[4], acc[5]);
    store1(z, r0 + 3u, c0, acc[6], acc[7]);
    store1(z, r0 + 64u, c0, acc[8], acc[9]);
    store1(z, r0 + 65u, c0, acc[10], acc[11]);
    store1(z, r0 + 66u, c0, acc[12], acc[13]);
    store1(z, r0 + 67u, c0, acc[14], acc[15]);
}
