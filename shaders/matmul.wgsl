// C = op(A) · op(B), batched, for any m, k, n: tiled through workgroup memory
// with register blocking. Two kernels:
// - `matmul_tiled` (below, with its own header): tiles of 128 × 128, 128 × 64
//   or 64 × 64, each invocation an 8 × 8 block (or 8 × 4: TN), K steps of 8 or 16, tuning
//   switches as pipeline-overridable constants. Shapes that fill the GPU.
//   With split-K (SK = 2 or 4) each workgroup multiplies one of SK slices of k
//   into a partial tile of a scratch buffer, and `matmul_reduce` sums the SK
//   partials into C (a second dispatch of the same pass).
// - `matmul_small`: 64 × 64 tiles of 256 invocations (16 × 16), each a
//   4 × 4 block (rows ty·4..+4, columns tx·4..+4), K steps of BK = 16. Shapes
//   too small for the tiled kernel's workgroups to fill the GPU.
// Every invocation loads its share of the next K step from global memory into
// registers while it multiplies the current step out of workgroup memory
// (double-buffered: one barrier per step). Tiles are stored k-major
// (As[k][m], Bs[k][n]): the inner loop reads whole vec4s of A and B.
//
// Each operand is read (A, B) or written (C) in vec4s when its layout allows,
// else one element at a time (VA, VB, VC: pipeline-overridable, chosen by the
// host per shape). A vec4 needs the contiguous dimension of its stored matrix
// (A: k, or m when transposed; B: n, or k when transposed; C: n) to be a
// multiple of 4, so that a vec4 is wholly inside or wholly outside its matrix
// and every matrix of a batch starts on a vec4. Element loads gather the same
// four values as the vec4 would, each bounds-checked, so the tiles in workgroup
// memory and the multiply are the same for every shape: a ragged shape costs
// only its wider loads and stores (the A·B work is unchanged).
// Edges are bounds-checked
// against m, k, n (zeros are loaded outside), so the kernels never index past a
// binding: every global index below is `z·stride + row·ld + col` with row and
// col checked against the matrix's extents (k against `k_end` ≤ k, the end of
// this workgroup's slice of k); `matmul_reduce` indexes below the binding sizes
// the host computes for it (stated there); every workgroup index is below its
// array's size by construction (the bounds are stated where the arrays are);
// private arrays are indexed by literals only; every loop runs a number of steps
// bounded by k. That is what lets the backend compile this module without naga's
// runtime bounds checks.
//
// Transposes are pipeline-overridable constants; batch is the grid's z. The
// host binds A, B and C twice each: as vec4s (slots 1–3) and as elements
// (slots 4–6), over the same ranges.

override TA: bool = false;
override TB: bool = false;
// Whether A, B and C are read or written as vec4s (else element by element).
override VA: bool = true;
override VB: bool = true;
override VC: bool = true;

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
    // `matmul_reduce` only: vec4s of C it writes (matrices of this dispatch · sc / 4).
    len4: u32,
}

// Split-K: slices of k per matrix (1: none). The tiled kernel's grid z is then
// matrices · SK (z = matrix · SK + slice), and C is a scratch buffer holding
// matrices · SK partial matrices of sc elements each, in grid-z order.
override SK: u32 = 1u;

// End of the k range the loads of this invocation may read (≤ p.k): p.k, or the
// end of its split-K slice. Set first thing by every entry point.
var<private> k_end: u32;

// vec4s in one small tile buffer (16 · 16).
const TILE: u32 = 256u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> b4: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> c4: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> a1: array<f32>;
@group(0) @binding(5) var<storage, read> b1: array<f32>;
@group(0) @binding(6) var<storage, read_write> c1: array<f32>;

// Double-buffered small tiles: As[buf + kk·16 + m/4][m % 4], buf ∈ {0, TILE};
// every index is below buf + 15·16 + 16 ≤ 2·TILE.
var<workgroup> As: array<vec4<f32>, 2u * TILE>;
var<workgroup> Bs: array<vec4<f32>, 2u * TILE>;

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
    if (row < p.m && kc < k_end) {
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
    if (col < p.n && kc < k_end) {
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

// ---- element loads and stores (operands not aligned to vec4s) -------------

fn a_at(z: u32, row: u32, kc: u32) -> f32 {
    if (row < p.m && kc < k_end) {
        if (TA) {
            return a1[z * p.sa + kc * p.m + row];
        }
        return a1[z * p.sa + row * p.k + kc];
    }
    return 0.0;
}

fn b_at(z: u32, col: u32, kc: u32) -> f32 {
    if (col < p.n && kc < k_end) {
        if (TB) {
            return b1[z * p.sb + col * p.k + kc];
        }
        return b1[z * p.sb + kc * p.n + col];
    }
    return 0.0;
}

// The same elements as load_a4, one at a time: unchecked where the whole tile
// (4w rows from row0, k0..k0 + bk) lies inside A, else each bounds-checked.
fn load_a1(z: u32, row0: u32, k0: u32, l: u32, w: u32, bk: u32) -> vec4<f32> {
    let s = slot(l, TA, w, bk);
    let row = row0 + s.x;
    let kc = k0 + s.y;
    if (row0 + 4u * w <= p.m && k0 + bk <= k_end) {
        // Four consecutive elements: along m (TA) or along k, all inside A.
        var i = z * p.sa + row * p.k + kc;
        if (TA) {
            i = z * p.sa + kc * p.m + row;
        }
        return vec4<f32>(a1[i], a1[i + 1u], a1[i + 2u], a1[i + 3u]);
    }
    if (TA) {
        return vec4<f32>(a_at(z, row, kc), a_at(z, row + 1u, kc), a_at(z, row + 2u, kc), a_at(z, row + 3u, kc));
    }
    return vec4<f32>(a_at(z, row, kc), a_at(z, row, kc + 1u), a_at(z, row, kc + 2u), a_at(z, row, kc + 3u));
}

fn load_b1(z: u32, col0: u32, k0: u32, l: u32, w: u32, bk: u32) -> vec4<f32> {
    let s = slot(l, !TB, w, bk);
    let col = col0 + s.x;
    let kc = k0 + s.y;
    if (col0 + 4u * w <= p.n && k0 + bk <= k_end) {
        // Four consecutive elements: along k (TB) or along n, all inside B.
        var i = z * p.sb + kc * p.n + col;
        if (TB) {
            i = z * p.sb + col * p.k + kc;
        }
        return vec4<f32>(b1[i], b1[i + 1u], b1[i + 2u], b1[i + 3u]);
    }
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

// ---- the loads and stores the kernels use: vec4 or element by element ------

fn ld_a(z: u32, row0: u32, k0: u32, l: u32, w: u32, bk: u32) -> vec4<f32> {
    if (VA) {
        return load_a4(z, row0, k0, l, w, bk);
    }
    return load_a1(z, row0, k0, l, w, bk);
}

fn ld_b(z: u32, col0: u32, k0: u32, l: u32, w: u32, bk: u32) -> vec4<f32> {
    if (VB) {
        return load_b4(z, col0, k0, l, w, bk);
    }
    return load_b1(z, col0, k0, l, w, bk);
}

fn st_c(z: u32, row: u32, c0: u32, v: vec4<f32>) {
    if (VC) {
        store4(z, row, c0, v);
    } else {
        store1(z, row, c0, v);
    }
}

// ---- matmul_tiled: the tunable register-blocked kernel ----------------------
//
// Tiles of TBM × TBN (128 × 128, 128 × 64, 64 × 64 or 128 × 32) with
// WG = TBM·TBN/64 invocations, each an 8 × 8 block: rows ty·4..+4 and
// TBM/2+ty·4..+4, columns tx·4..+4 and TBN/2+tx·4..+4 (tx < TBN/8,
// ty < TBM/8), in 16 vec4 accumulators indexed by literals only. TN = 4
// (`narrow`): WG = TBM·TBN/32 invocations, each 8 × 4 (columns tx·4..+4 only,
// tx < TBN/4; the 8 even accumulators): more warps for the same tile. K in steps of
// TBK = 8 or 16, every step written out (no loop over k inside a tile, no
// dynamic index into a private array). Tiles are stored k-major, each k row
// padded by one vec4 (AW = TBM/4 + 1, BW = TBN/4 + 1 vec4s), so that the
// transposing stores of a k-contiguous operand hit distinct banks. The next
// tile's vec4s are loaded into registers while the current one is multiplied:
// all at once, or (SPLIT) half before each half of the multiply. Double-buffered:
// one barrier per K step. AHEAD (not with SPLIT) issues the loads two tiles ahead
// instead of one, into a second set of registers (the K loop then runs an even
// number of steps; a surplus step multiplies zeros). GROUP > 0 visits the tiles
// GROUP tile-rows at a time
// (column by column within a group) instead of row by row; W84 lays a subgroup
// of 32 out as 8 × 4 invocations instead of 16 × 2 (128-column tiles only).
// SK > 1 (split-K, above): the grid's z runs over matrices · SK, each workgroup
// multiplies K steps [slice·per, (slice + 1)·per) of its tile (loads checked
// against k_end, the slice's end) and stores its partial tile into the scratch
// binding at matrix z·SK + slice; `matmul_reduce` then sums the slices into C.

override TBM: u32 = 128u;
override TBN: u32 = 128u;
override TBK: u32 = 8u;
override SPLIT: bool = false;
override AHEAD: bool = false;
override GROUP: u32 = 0u;
override W84: bool = false;
// Columns of C per invocation: 8 (two vec4s TBN/2 apart) or 4 (NARROW: one vec4;
// TBN/4 invocations across, twice the invocations per tile).
override TN: u32 = 8u;
// Invocations; vec4 stride of a k row of the A and B tiles.
override WG: u32 = TBM * TBN / (8u * TN);
override AW: u32 = TBM / 4u + 1u;
override BW: u32 = TBN / 4u + 1u;
// vec4s of A and of B each invocation moves per tile: 1, 2 or 4 (the host never
// asks for more or fewer: TBM·TBK/4 and TBN·TBK/4 are 1, 2 or 4 times WG).
override NA: u32 = TBM * TBK / (4u * WG);
override NB: u32 = TBN * TBK / (4u * WG);

// Double-buffered tiles: Ta[buf + k·AW + m/4][m % 4], Tb[buf + k·BW + n/4][n % 4],
// buf ∈ {0, TBK·AW} (A) and {0, TBK·BW} (B). Every index is below
// buf + (TBK − 1)·AW + TBM/4 < 2·TBK·AW (k < TBK, m < TBM; likewise for B):
// reads at ty + {0, TBM/8} < TBM/4 and tx + {0, TBN/8} < TBN/4 (TN = 4: tx < TBN/4
// alone) within a row,
// stores at slot() positions, which stay inside the tile for l < NA·WG (NB·WG).
var<workgroup> Ta: array<vec4<f32>, 2u * TBK * AW>;
var<workgroup> Tb: array<vec4<f32>, 2u * TBK * BW>;

// Loads in flight (literal indices only); qa, qb: the second set of AHEAD.
var<private> pa: array<vec4<f32>, 4>;
var<private> pb: array<vec4<f32>, 4>;
var<private> qa: array<vec4<f32>, 4>;
var<private> qb: array<vec4<f32>, 4>;

// Stores the l-th vec4 of an A tile (l < TBM·TBK/4) into Ta at `buf`.
fn put_ta(buf: u32, l: u32, v: vec4<f32>) {
    let s = slot(l, TA, TBM / 4u, TBK);
    let q = buf + s.y * AW + s.x / 4u;
    if (TA) {
        Ta[q] = v;
    } else {
        let c = s.x % 4u;
        Ta[q][c] = v.x;
        Ta[q + AW][c] = v.y;
        Ta[q + 2u * AW][c] = v.z;
        Ta[q + 3u * AW][c] = v.w;
    }
}

// Stores the l-th vec4 of a B tile (l < TBN·TBK/4) into Tb at `buf`.
fn put_tb(buf: u32, l: u32, v: vec4<f32>) {
    let s = slot(l, !TB, TBN / 4u, TBK);
    let q = buf + s.y * BW + s.x / 4u;
    if (!TB) {
        Tb[q] = v;
    } else {
        let c = s.x % 4u;
        Tb[q][c] = v.x;
        Tb[q + BW][c] = v.y;
        Tb[q + 2u * BW][c] = v.z;
        Tb[q + 3u * BW][c] = v.w;
    }
}

// One k: 64 FMAs. `a`, `b`: this invocation's first vec4 of the k row of A and B.
fn kstep(a: u32, b: u32) {
    let x0 = Ta[a];
    let x1 = Ta[a + TBM / 8u];
    let y0 = Tb[b];
    acc[0] = fma(vec4<f32>(x0.x), y0, acc[0]);
    acc[2] = fma(vec4<f32>(x0.y), y0, acc[2]);
    acc[4] = fma(vec4<f32>(x0.z), y0, acc[4]);
    acc[6] = fma(vec4<f32>(x0.w), y0, acc[6]);
    acc[8] = fma(vec4<f32>(x1.x), y0, acc[8]);
    acc[10] = fma(vec4<f32>(x1.y), y0, acc[10]);
    acc[12] = fma(vec4<f32>(x1.z), y0, acc[12]);
    acc[14] = fma(vec4<f32>(x1.w), y0, acc[14]);
    // TN = 4 (one vec4 of columns): the odd accumulators stay unused, and the
    // read TBN/8 vec4s further (past tx < TBN/4's row) does not happen.
    if (TN == 8u) {
        let y1 = Tb[b + TBN / 8u];
        acc[1] = fma(vec4<f32>(x0.x), y1, acc[1]);
        acc[3] = fma(vec4<f32>(x0.y), y1, acc[3]);
        acc[5] = fma(vec4<f32>(x0.z), y1, acc[5]);
        acc[7] = fma(vec4<f32>(x0.w), y1, acc[7]);
        acc[9] = fma(vec4<f32>(x1.x), y1, acc[9]);
        acc[11] = fma(vec4<f32>(x1.y), y1, acc[11]);
        acc[13] = fma(vec4<f32>(x1.z), y1, acc[13]);
        acc[15] = fma(vec4<f32>(x1.w), y1, acc[15]);
    }
}

// Half a tile: TBK / 2 k's from `a`, `b`.
fn multiply_half(a: u32, b: u32) {
    kstep(a, b);
    kstep(a + AW, b + BW);
    kstep(a + 2u * AW, b + 2u * BW);
    kstep(a + 3u * AW, b + 3u * BW);
    if (TBK == 16u) {
        kstep(a + 4u * AW, b + 4u * BW);
        kstep(a + 5u * AW, b + 5u * BW);
        kstep(a + 6u * AW, b + 6u * BW);
        kstep(a + 7u * AW, b + 7u * BW);
    }
}

// Whether part i of n (vec4 lid + i·WG of the tile) is loaded with the first
// half (all parts unless SPLIT; with SPLIT the first n/2, or the only one).
fn first_part(i: u32, n: u32) -> bool {
    if (SPLIT) {
        return i < max(n / 2u, 1u);
    }
    return i < n;
}

// Whether part i of n is loaded with the second half (SPLIT only).
fn second_part(i: u32, n: u32) -> bool {
    return SPLIT && n >= 2u && i >= n / 2u && i < n;
}

// Loads of the tile at k1 (parts of the first half, `second`: of the second).
fn fetch(z: u32, row0: u32, col0: u32, k1: u32, lid: u32, second: bool) {
    // Literal part numbers and private indices; the conditions are constants.
    if (select(first_part(0u, NA), second_part(0u, NA), second)) {
        pa[0] = ld_a(z, row0, k1, lid, TBM / 4u, TBK);
    }
    if (select(first_part(1u, NA), second_part(1u, NA), second)) {
        pa[1] = ld_a(z, row0, k1, lid + WG, TBM / 4u, TBK);
    }
    if (select(first_part(2u, NA), second_part(2u, NA), second)) {
        pa[2] = ld_a(z, row0, k1, lid + 2u * WG, TBM / 4u, TBK);
    }
    if (select(first_part(3u, NA), second_part(3u, NA), second)) {
        pa[3] = ld_a(z, row0, k1, lid + 3u * WG, TBM / 4u, TBK);
    }
    if (select(first_part(0u, NB), second_part(0u, NB), second)) {
        pb[0] = ld_b(z, col0, k1, lid, TBN / 4u, TBK);
    }
    if (select(first_part(1u, NB), second_part(1u, NB), second)) {
        pb[1] = ld_b(z, col0, k1, lid + WG, TBN / 4u, TBK);
    }
    if (select(first_part(2u, NB), second_part(2u, NB), second)) {
        pb[2] = ld_b(z, col0, k1, lid + 2u * WG, TBN / 4u, TBK);
    }
    if (select(first_part(3u, NB), second_part(3u, NB), second)) {
        pb[3] = ld_b(z, col0, k1, lid + 3u * WG, TBN / 4u, TBK);
    }
}

// Stores what `fetch` with the same `second` loaded into the buffers at na, nb.
fn stash(na: u32, nb: u32, lid: u32, second: bool) {
    if (select(first_part(0u, NA), second_part(0u, NA), second)) {
        put_ta(na, lid, pa[0]);
    }
    if (select(first_part(1u, NA), second_part(1u, NA), second)) {
        put_ta(na, lid + WG, pa[1]);
    }
    if (select(first_part(2u, NA), second_part(2u, NA), second)) {
        put_ta(na, lid + 2u * WG, pa[2]);
    }
    if (select(first_part(3u, NA), second_part(3u, NA), second)) {
        put_ta(na, lid + 3u * WG, pa[3]);
    }
    if (select(first_part(0u, NB), second_part(0u, NB), second)) {
        put_tb(nb, lid, pb[0]);
    }
    if (select(first_part(1u, NB), second_part(1u, NB), second)) {
        put_tb(nb, lid + WG, pb[1]);
    }
    if (select(first_part(2u, NB), second_part(2u, NB), second)) {
        put_tb(nb, lid + 2u * WG, pb[2]);
    }
    if (select(first_part(3u, NB), second_part(3u, NB), second)) {
        put_tb(nb, lid + 3u * WG, pb[3]);
    }
}

// AHEAD: all parts of the tile at k1 into the second set.
fn fetch_q(z: u32, row0: u32, col0: u32, k1: u32, lid: u32) {
    qa[0] = ld_a(z, row0, k1, lid, TBM / 4u, TBK);
    if (NA > 1u) {
        qa[1] = ld_a(z, row0, k1, lid + WG, TBM / 4u, TBK);
    }
    if (NA > 2u) {
        qa[2] = ld_a(z, row0, k1, lid + 2u * WG, TBM / 4u, TBK);
        qa[3] = ld_a(z, row0, k1, lid + 3u * WG, TBM / 4u, TBK);
    }
    qb[0] = ld_b(z, col0, k1, lid, TBN / 4u, TBK);
    if (NB > 1u) {
        qb[1] = ld_b(z, col0, k1, lid + WG, TBN / 4u, TBK);
    }
    if (NB > 2u) {
        qb[2] = ld_b(z, col0, k1, lid + 2u * WG, TBN / 4u, TBK);
        qb[3] = ld_b(z, col0, k1, lid + 3u * WG, TBN / 4u, TBK);
    }
}

fn stash_q(na: u32, nb: u32, lid: u32) {
    put_ta(na, lid, qa[0]);
    if (NA > 1u) {
        put_ta(na, lid + WG, qa[1]);
    }
    if (NA > 2u) {
        put_ta(na, lid + 2u * WG, qa[2]);
        put_ta(na, lid + 3u * WG, qa[3]);
    }
    put_tb(nb, lid, qb[0]);
    if (NB > 1u) {
        put_tb(nb, lid + WG, qb[1]);
    }
    if (NB > 2u) {
        put_tb(nb, lid + 2u * WG, qb[2]);
        put_tb(nb, lid + 3u * WG, qb[3]);
    }
}

// A whole tile from `a`, `b`.
fn multiply_tile(a: u32, b: u32) {
    multiply_half(a, b);
    multiply_half(a + (TBK / 2u) * AW, b + (TBK / 2u) * BW);
}

@compute @workgroup_size(WG)
fn matmul_tiled(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    // Matrix z of A and B; zc: of C (with split-K the partial matrix in scratch,
    // wid.z < matrices · SK, the scratch binding's extent in sc-element matrices).
    let z = wid.z / SK + p.z0;
    var zc = z;
    // This workgroup's k range [k0, k_end): K steps dealt out evenly over SK
    // slices (a slice of a short k may be empty: its partial is zeros). k0 and
    // k_end stay below p.k + SK·TBK, which the host keeps within u32.
    // `end` is k_end in a function variable: the loop bounds below must be
    // uniform, and a read of a private variable is not (WGSL's uniformity
    // analysis, which the browser's compiler enforces).
    var k0 = 0u;
    var end = p.k;
    if (SK > 1u) {
        zc = wid.z;
        let per = ((p.k + TBK - 1u) / TBK + SK - 1u) / SK * TBK;
        k0 = min((wid.z % SK) * per, p.k);
        end = min(k0 + per, p.k);
    }
    k_end = end;
    // Tile (tm, tn): as dispatched, or GROUP tile-rows at a time. With GROUP the
    // linear index lin < nx·ny maps one to one onto tm < ny, tn < nx.
    var tm = wid.y;
    var tn = wid.x;
    if (GROUP > 0u) {
        let lin = wid.y * groups.x + wid.x;
        let per = GROUP * groups.x;
        let first = (lin / per) * GROUP;
        let rows = min(groups.y - first, GROUP);
        tm = first + (lin % per) % rows;
        tn = (lin % per) / rows;
    }
    let row0 = tm * TBM;
    let col0 = tn * TBN;
    // tx < TBN/TN across (TBN/8, or TBN/4 with TN = 4), ty < TBM/8: lid < WG.
    var tx = lid % (TBN / TN);
    var ty = lid / (TBN / TN);
    if (W84 && TBN == 128u) {
        tx = lid % 8u + 8u * ((lid / 32u) % 2u);
        ty = (lid % 32u) / 8u + 4u * (lid / 64u);
    }
    let steps = (end - k0 + TBK - 1u) / TBK;
    let one_a = TBK * AW;
    let one_b = TBK * BW;
    fetch(z, row0, col0, k0, lid, false);
    stash(0u, 0u, lid, false);
    fetch(z, row0, col0, k0, lid, true);
    stash(0u, 0u, lid, true);
    if (AHEAD) {
        // Tile t in buffer t % 2; the loads of tile t + 2 go out while tile t is
        // multiplied and reach workgroup memory after tile t + 1 is.
        fetch_q(z, row0, col0, k0 + TBK, lid);
        workgroupBarrier();
        for (var t = 0u; t < steps; t += 2u) {
            fetch(z, row0, col0, k0 + (t + 2u) * TBK, lid, false);
            multiply_tile(ty, tx);
            stash_q(one_a, one_b, lid);
            workgroupBarrier();
            fetch_q(z, row0, col0, k0 + (t + 3u) * TBK, lid);
            multiply_tile(one_a + ty, one_b + tx);
            stash(0u, 0u, lid, false);
            workgroupBarrier();
        }
    }
    workgroupBarrier();
    for (var t = 0u; t < select(steps, 0u, AHEAD); t++) {
        let ca = (t % 2u) * one_a;
        let cb = (t % 2u) * one_b;
        let na = one_a - ca;
        let nb = one_b - cb;
        let k1 = k0 + (t + 1u) * TBK;
        let a = ca + ty;
        let b = cb + tx;
        // The last step loads past k: the loads are bounds-checked (zeros) and the
        // stores go to the buffer nobody reads any more.
        fetch(z, row0, col0, k1, lid, false);
        if (SPLIT) {
            multiply_half(a, b);
            stash(na, nb, lid, false);
            fetch(z, row0, col0, k1, lid, true);
            multiply_half(a + (TBK / 2u) * AW, b + (TBK / 2u) * BW);
        } else {
            multiply_tile(a, b);
        }
        // SPLIT: the second half's parts; otherwise all of them.
        stash(na, nb, lid, SPLIT);
        workgroupBarrier();
    }
    let r0 = row0 + ty * 4u;
    let r1 = r0 + TBM / 2u;
    let c0 = col0 + tx * 4u;
    st_c(zc, r0, c0, acc[0]);
    st_c(zc, r0 + 1u, c0, acc[2]);
    st_c(zc, r0 + 2u, c0, acc[4]);
    st_c(zc, r0 + 3u, c0, acc[6]);
    st_c(zc, r1, c0, acc[8]);
    st_c(zc, r1 + 1u, c0, acc[10]);
    st_c(zc, r1 + 2u, c0, acc[12]);
    st_c(zc, r1 + 3u, c0, acc[14]);
    if (TN == 8u) {
        let c1 = c0 + TBN / 2u;
        st_c(zc, r0, c1, acc[1]);
        st_c(zc, r0 + 1u, c1, acc[3]);
        st_c(zc, r0 + 2u, c1, acc[5]);
        st_c(zc, r0 + 3u, c1, acc[7]);
        st_c(zc, r1, c1, acc[9]);
        st_c(zc, r1 + 1u, c1, acc[11]);
        st_c(zc, r1 + 2u, c1, acc[13]);
        st_c(zc, r1 + 3u, c1, acc[15]);
    }
}

@compute @workgroup_size(256)
fn matmul_small(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let z = wid.z + p.z0;
    k_end = p.k;
    let row0 = wid.y * 64u;
    let col0 = wid.x * 64u;
    let tx = lid % 16u;
    let ty = lid / 16u;
    let steps = (p.k + 15u) / 16u;
    var va = ld_a(z, row0, 0u, lid, 16u, 16u);
    var vb = ld_b(z, col0, 0u, lid, 16u, 16u);
    put_a(0u, lid, TA, 16u, 16u, va);
    put_b(0u, lid, !TB, 16u, 16u, vb);
    workgroupBarrier();
    for (var t = 0u; t < steps; t++) {
        let cur = (t % 2u) * TILE;
        let more = t + 1u < steps;
        if (more) {
            va = ld_a(z, row0, (t + 1u) * 16u, lid, 16u, 16u);
            vb = ld_b(z, col0, (t + 1u) * 16u, lid, 16u, 16u);
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
    st_c(z, r0, c0, acc[0]);
    st_c(z, r0 + 1u, c0, acc[1]);
    st_c(z, r0 + 2u, c0, acc[2]);
    st_c(z, r0 + 3u, c0, acc[3]);
}

// ---- matmul_reduce: the second dispatch of split-K --------------------------
//
// C[z0 + j] = Σ_s partial[j·SK + s] for the j < len4 / (sc / 4) matrices of one
// dispatch, one vec4 per invocation (1-D or 2-D grid, surplus invocations
// return). Bindings: the scratch of partials as a4 (the host binds exactly
// len4·SK vec4s: every read index (j·SK + s)·sc/4 + e < len4·SK since e < sc/4,
// s < SK and j·sc/4 + e = i < len4), C as c4 (z0·sc/4 + i < (z0 + j + 1)·sc/4,
// within the batch the host validated). Sums in slice order: deterministic.
@compute @workgroup_size(256)
fn matmul_reduce(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = (wid.y * groups.x + wid.x) * 256u + lid;
    if (i >= p.len4) {
        return;
    }
    let sc4 = p.sc / 4u;
    let j = i / sc4;
    let e = i % sc4;
    var sum = a4[j * SK * sc4 + e];
    for (var s = 1u; s < SK; s++) {
        sum += a4[(j * SK + s) * sc4 + e];
    }
    c4[p.z0 * sc4 + i] = sum;
}
