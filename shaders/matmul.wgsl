// C = op(A) · op(B), batched, for any m, k, n: tiled through workgroup memory
// with register blocking.
//
// Workgroups of 256 invocations (16 × 16) compute one tile of C:
// - large tiles (`matmul_vec4`): 128 × 128, each invocation an 8 × 8 block
//   (rows ty·4..+4 and 64+ty·4..+4, columns tx·4..+4 and 64+tx·4..+4) in 16
//   vec4 accumulators; K in steps of LBK = 8 or 16 (pipeline-overridable).
// - small tiles (`matmul_vec4_small`, `matmul_scalar`): 64 × 64, each
//   invocation a 4 × 4 block (rows ty·4..+4, columns tx·4..+4); K in steps of
//   BK = 16. Four times as many workgroups: for matrices too small to fill the
//   GPU with large tiles, and for unaligned shapes.
// Every invocation loads one vec4 of A and one of B per step from global memory
// into registers for the next step while it multiplies the current step out of
// workgroup memory (double-buffered: one barrier per step). Tiles are stored
// k-major (As[k][m], Bs[k][n]): the inner loop reads whole vec4s of A and B.
// A tile buffer is W vec4s across (W = 32 large, 16 small) times BK rows of k:
// 32·LBK vec4s (large) or 256 (small); the workgroup arrays hold two.
//
// `matmul_vec4*` load A, B and store C as vec4. They need the contiguous
// dimension of each stored matrix (A: k, or m when transposed; B: n, or k when
// transposed) and n to be multiples of 4, so a vec4 is wholly inside or wholly
// outside its matrix. `matmul_scalar` loads and stores element by element: any
// shape. Edges are bounds-checked against m, k, n (zeros are loaded outside),
// so the kernels never index past a binding: every global index below is
// `z·stride + row·ld + col` with row and col checked against the matrix's
// extents, and every workgroup index is below the arrays' 64·LBK by construction. That is
// what lets the backend compile this module without naga's runtime bounds checks.
//
// Transposes are pipeline-overridable constants; batch is the grid's z.

override TA: bool = false;
override TB: bool = false;
// K step of the large tiles (8 or 16); sizes the workgroup arrays (the small
// tiles use the default, whose arrays are exactly their two 256-vec4 buffers).
override LBK: u32 = 8u;

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

// vec4s in one small tile buffer (16 · 16).
const TILE: u32 = 256u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> b4: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> c4: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> a1: array<f32>;
@group(0) @binding(5) var<storage, read> b1: array<f32>;
@group(0) @binding(6) var<storage, read_write> c1: array<f32>;

// Double-buffered tiles: As[buf + kk·W + m/4][m % 4], buf ∈ {0, one buffer}.
var<workgroup> As: array<vec4<f32>, 64u * LBK>;
var<workgroup> Bs: array<vec4<f32>, 64u * LBK>;

var<private> acc: array<vec4<f32>, 16>;

// Where the l-th vec4 of a tile W vec4s wide and `bk` deep comes from: returns
// (index across the tile, index along k) of its first element. `long`: the vec4
// runs across the tile; otherwise along k (bk / 4 vec4s per tile row).
fn slot(l: u32, long: bool, w: u32, bk: u32) -> vec2<u32> {
    if (long) {
        return vec2<u32>((l % w) * 4u, l / w);
    }
    let per = bk / 4u;
    return vec2<u32>(l / per, (l % per) * 4u);
}

// Stores the l-th loaded vec4 into a tile buffer of A (B below): as is when it
// runs across the tile, else scattered over 4 k rows. Two copies because WGSL
// functions cannot take workgroup pointers.
fn put_a(buf: u32, l: u32, long: bool, w: u32, bk: u32, v: vec4<f32>) {
    if (long) {
        As[buf + l] = v;
    } else {
        let s = slot(l, false, w, bk);
        let q = buf + s.y * w + s.x / 4u;
        let c = s.x % 4u;
        As[q][c] = v.x;
        As[q + w][c] = v.y;
        As[q + 2u * w][c] = v.z;
        As[q + 3u * w][c] = v.w;
    }
}

fn put_b(buf: u32, l: u32, long: bool, w: u32, bk: u32, v: vec4<f32>) {
    if (long) {
        Bs[buf + l] = v;
    } else {
        let s = slot(l, false, w, bk);
        let q = buf + s.y * w + s.x / 4u;
        let c = s.x % 4u;
        Bs[q][c] = v.x;
        Bs[q + w][c] = v.y;
        Bs[q + 2u * w][c] = v.z;
        Bs[q + 3u * w][c] = v.w;
    }
}

// Large tiles: 64 FMAs per k, the 8 × 8 block of this invocation.
fn multiply(buf: u32, tx: u32, ty: u32) {
    for (var kk = 0u; kk < LBK; kk++) {
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

// Small tiles: 16 FMAs per k, the 4 × 4 block of this invocation.
fn multiply_small(buf: u32, tx: u32, ty: u32) {
    for (var kk = 0u; kk < 16u; kk++) {
        let r = buf + kk * 16u;
        let x = As[r + ty];
        let y = Bs[r + tx];
        acc[0] = fma(vec4<f32>(x.x), y, acc[0]);
        acc[1] = fma(vec4<f32>(x.y), y, acc[1]);
        acc[2] = fma(vec4<f32>(x.z), y, acc[2]);
        acc[3] = fma(vec4<f32>(x.w), y, acc[3]);
    }
}

// ---- vec4 loads and stores --------------------------------------------------

// A's vec4 for the tile at (row0, k0): A is m × k (k contiguous), or k × m when TA.
fn load_a4(z: u32, row0: u32, k0: u32, l: u32, w: u32, bk: u32) -> vec4<f32> {
    let s = slot(l, TA, w, bk);
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
fn load_b4(z: u32, col0: u32, k0: u32, l: u32, w: u32, bk: u32) -> vec4<f32> {
    let s = slot(l, !TB, w, bk);
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

// Row `row` of C at columns c0..c0+4, as one vec4 (n % 4 == 0).
fn store4(z: u32, row: u32, c0: u32, v: vec4<f32>) {
    if (row < p.m && c0 < p.n) {
        c4[(z * p.sc + row * p.n + c0) / 4u] = v;
    }
}

@compute @workgroup_size(256)
fn matmul_vec4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let z = wid.z + p.z0;
    let row0 = wid.y * 128u;
    let col0 = wid.x * 128u;
    let tx = lid % 16u;
    let ty = lid / 16u;
    let steps = (p.k + LBK - 1u) / LBK;
    // One tile buffer: 32 · LBK vec4s; each invocation moves LBK / 8 of A and of B.
    let one = 32u * LBK;
    let deep = LBK == 16u;
    var va0 = load_a4(z, row0, 0u, lid, 32u, LBK);
    var vb0 = load_b4(z, col0, 0u, lid, 32u, LBK);
    var va1 = vec4<f32>(0.0);
    var vb1 = vec4<f32>(0.0);
    if (deep) {
        va1 = load_a4(z, row0, 0u, lid + 256u, 32u, LBK);
        vb1 = load_b4(z, col0, 0u, lid + 256u, 32u, LBK);
    }
    put_a(0u, lid, TA, 32u, LBK, va0);
    put_b(0u, lid, !TB, 32u, LBK, vb0);
    if (deep) {
        put_a(0u, lid + 256u, TA, 32u, LBK, va1);
        put_b(0u, lid + 256u, !TB, 32u, LBK, vb1);
    }
    workgroupBarrier();
    for (var t = 0u; t < steps; t++) {
        let cur = (t % 2u) * one;
        let nxt = one - cur;
        let more = t + 1u < steps;
        let k1 = (t + 1u) * LBK;
        if (more) {
            va0 = load_a4(z, row0, k1, lid, 32u, LBK);
            vb0 = load_b4(z, col0, k1, lid, 32u, LBK);
            if (deep) {
                va1 = load_a4(z, row0, k1, lid + 256u, 32u, LBK);
                vb1 = load_b4(z, col0, k1, lid + 256u, 32u, LBK);
            }
        }
        multiply(cur, tx, ty);
        if (more) {
            put_a(nxt, lid, TA, 32u, LBK, va0);
            put_b(nxt, lid, !TB, 32u, LBK, vb0);
            if (deep) {
                put_a(nxt, lid + 256u, TA, 32u, LBK, va1);
                put_b(nxt, lid + 256u, !TB, 32u, LBK, vb1);
            }
        }
        workgroupBarrier();
    }
    // Literal accumulator indices only, so they stay in registers.
    let r0 = row0 + ty * 4u;
    let c0 = col0 + tx * 4u;
    let c1 = c0 + 64u;
    store4(z, r0, c0, acc[0]);
    store4(z, r0, c1, acc[1]);
    store4(z, r0 + 1u, c0, acc[2]);
    store4(z, r0 + 1u, c1, acc[3]);
    store4(z, r0 + 2u, c0, acc[4]);
    store4(z, r0 + 2u, c1, acc[5]);
    store4(z, r0 + 3u, c0, acc[6]);
    store4(z, r0 + 3u, c1, acc[7]);
    store4(z, r0 + 64u, c0, acc[8]);
    store4(z, r0 + 64u, c1, acc[9]);
    store4(z, r0 + 65u, c0, acc[10]);
    store4(z, r0 + 65u, c1, acc[11]);
    store4(z, r0 + 66u, c0, acc[12]);
    store4(z, r0 + 66u, c1, acc[13]);
    store4(z, r0 + 67u, c0, acc[14]);
    store4(z, r0 + 67u, c1, acc[15]);
}

@compute @workgroup_size(256)
fn matmul_vec4_small(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let z = wid.z + p.z0;
    let row0 = wid.y * 64u;
    let col0 = wid.x * 64u;
    let tx = lid % 16u;
    let ty = lid / 16u;
    let steps = (p.k + 15u) / 16u;
    var va = load_a4(z, row0, 0u, lid, 16u, 16u);
    var vb = load_b4(z, col0, 0u, lid, 16u, 16u);
    put_a(0u, lid, TA, 16u, 16u, va);
    put_b(0u, lid, !TB, 16u, 16u, vb);
    workgroupBarrier();
    for (var t = 0u; t < steps; t++) {
        let cur = (t % 2u) * TILE;
        let more = t + 1u < steps;
        if (more) {
            va = load_a4(z, row0, (t + 1u) * 16u, lid, 16u, 16u);
            vb = load_b4(z, col0, (t + 1u) * 16u, lid, 16u, 16u);
        }
        multiply_small(cur, tx, ty);
        if (more) {
            put_a(TILE - cur, lid, TA, 16u, 16u, va);
            put_b(TILE - cur, lid, !TB, 16u, 16u, vb);
        }
        workgroupBarrier();
    }
    let r0 = row0 + ty * 4u;
    let c0 = col0 + tx * 4u;
    store4(z, r0, c0, acc[0]);
    store4(z, r0 + 1u, c0, acc[1]);
    store4(z, r0 + 2u, c0, acc[2]);
    store4(z, r0 + 3u, c0, acc[3]);
}

// ---- scalar loads and stores ------------------------------------------------

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

// The same elements as load_a4, one at a time with each bounds-checked.
fn load_a1(z: u32, row0: u32, k0: u32, l: u32, w: u32, bk: u32) -> vec4<f32> {
    let s = slot(l, TA, w, bk);
    let row = row0 + s.x;
    let kc = k0 + s.y;
    if (TA) {
        return vec4<f32>(a_at(z, row, kc), a_at(z, row + 1u, kc), a_at(z, row + 2u, kc), a_at(z, row + 3u, kc));
    }
    return vec4<f32>(a_at(z, row, kc), a_at(z, row, kc + 1u), a_at(z, row, kc + 2u), a_at(z, row, kc + 3u));
}

fn load_b1(z: u32, col0: u32, k0: u32, l: u32, w: u32, bk: u32) -> vec4<f32> {
    let s = slot(l, !TB, w, bk);
    let col = col0 + s.x;
    let kc = k0 + s.y;
    if (TB) {
        return vec4<f32>(b_at(z, col, kc), b_at(z, col, kc + 1u), b_at(z, col, kc + 2u), b_at(z, col, kc + 3u));
    }
    return vec4<f32>(b_at(z, col, kc), b_at(z, col + 1u, kc), b_at(z, col + 2u, kc), b_at(z, col + 3u, kc));
}

// Row `row` of C at columns c0..c0+4, element by element (any n).
fn store1(z: u32, row: u32, c0: u32, v: vec4<f32>) {
    if (row < p.m) {
        let at = z * p.sc + row * p.n;
        if (c0 < p.n) {
            c1[at + c0] = v.x;
        }
        if (c0 + 1u < p.n) {
            c1[at + c0 + 1u] = v.y;
        }
        if (c0 + 2u < p.n) {
            c1[at + c0 + 2u] = v.z;
        }
        if (c0 + 3u < p.n) {
            c1[at + c0 + 3u] = v.w;
        }
    }
}

@compute @workgroup_size(256)
fn matmul_scalar(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let z = wid.z + p.z0;
    let row0 = wid.y * 64u;
    let col0 = wid.x * 64u;
    let tx = lid % 16u;
    let ty = lid / 16u;
    let steps = (p.k + 15u) / 16u;
    var va = load_a1(z, row0, 0u, lid, 16u, 16u);
    var vb = load_b1(z, col0, 0u, lid, 16u, 16u);
    put_a(0u, lid, TA, 16u, 16u, va);
    put_b(0u, lid, !TB, 16u, 16u, vb);
    workgroupBarrier();
    for (var t = 0u; t < steps; t++) {
        let cur = (t % 2u) * TILE;
        let more = t + 1u < steps;
        if (more) {
            va = load_a1(z, row0, (t + 1u) * 16u, lid, 16u, 16u);
            vb = load_b1(z, col0, (t + 1u) * 16u, lid, 16u, 16u);
        }
        multiply_small(cur, tx, ty);
        if (more) {
            put_a(TILE - cur, lid, TA, 16u, 16u, va);
            put_b(TILE - cur, lid, !TB, 16u, 16u, vb);
        }
        workgroupBarrier();
    }
    let r0 = row0 + ty * 4u;
    let c0 = col0 + tx * 4u;
    store1(z, r0, c0, acc[0]);
    store1(z, r0 + 1u, c0, acc[1]);
    store1(z, r0 + 2u, c0, acc[2]);
    store1(z, r0 + 3u, c0, acc[3]);
}
