// Fused attention, f32: out = softmax(scale · q·kᵀ + mask) · v, one head at a
// time, without writing the score matrix anywhere (FlashAttention's online
// softmax).
//
// One workgroup of 256 invocations per block of BQ = 64 query rows of one
// query head; invocation (tx, ty), tx and ty < 16, holds rows 4·ty..4·ty+3 of
// the block (a subgroup of 32 is 8 tx × 4 ty, so that its reads of workgroup
// memory touch few distinct addresses). It walks the keys the block can see in
// blocks of BK = 64. For each key block:
//   1. S = Q·Kᵀ for the 64 × 64 block, head_dim in chunks of CK values staged
//      in workgroup memory (rows of Q and K as they are in memory). Invocation
//      (tx, ty) holds its rows at keys tx, tx+16, tx+32, tx+48 (vec4s s[r]);
//   2. scale (times log2 e: exp2 below), mask (keys past seq_k, and with a
//      causal mask keys j > i + offset), the block's row maxima through
//      workgroup memory, the running maximum m, the rescale factor
//      exp2(m_old − m_new) applied to the output accumulator and to the
//      running sum l, and the weights P = exp2(S − m_new) into workgroup memory;
//   3. O += P·V, keys in chunks of CV with V staged in workgroup memory.
// At the end each row's partial sums l (one per tx) are added through workgroup
// memory and O / l is stored; a row that saw no key stores zeros.
//
// Every stage of the walk (a chunk of Q and K, or a chunk of V) is loaded from
// global memory into registers one stage ahead, while the current stage is
// multiplied, then stored into `stage` between two barriers. Key blocks that no
// row of the query block can see (past the causal diagonal) are never visited.
//
// Keys counted on the device (`attention_at`, for AttentionSpec::with_positions):
// a fifth storage binding holds the positions of the queries, batch · seq_q
// f32 values. A workgroup's batch element b (from its key/value head's unit:
// (unit0 + head / group) / heads_kv) attends to the first
// keys_at(positions[b·seq_q + seq_q − 1]) keys (trunc(p + 1) within
// 0..=seq_k, a NaN none), with the causal diagonal of a call of that many keys
// (the mask aligned to the end takes offset = keys − seq_q). Invocation 0
// reads the position and `workgroupUniformLoad` hands the count to the others,
// so that the loop bounds holding barriers stay uniform. Key blocks past the
// count are never visited: a decoding step reads the keys it attends to, not
// the cache's capacity. `attention` takes seq_k from the parameters and has no
// such binding.
//
// Output columns are done in slices of at most 256 (DV vec4 groups of 64 per
// invocation: columns 4·(g·16 + tx)..+3 of the slice for g < DV); a head_dim
// above 256 takes one dispatch per slice, each computing S again.
//
// Layouts (row-major, f32): q and out [heads, seq_q, head_dim], k and v
// [kv heads, kv_rows, head_dim] (kv_rows ≥ seq_k: a KV cache's capacity, of
// which each head's first seq_k rows are read), the bindings starting at this dispatch's first
// key/value head (`plan.rs` splits larger calls). Query head h of the dispatch
// reads key/value head h / group. The grid is flat over (head, query block),
// query blocks innermost and the last (most work under a causal mask) first;
// surplus workgroups of a 2-D grid return at once.
//
// Bounds. The backend compiles this module without naga's runtime checks
// (kernels.rs), which this file makes safe: every global index is
// `base + row·d + col` with row and col compared against seq_q or seq_k and d
// before use (zeros are loaded outside), where base is `head·seq_q·d` or
// `(head / group)·kv_rows·d` (rows below seq_k ≤ kv_rows) for a head below
// the dispatch's heads (`flat < groups`), which the host binds whole (kv_rows
// rows each); every workgroup index is below its
// array's size by construction (the bounds are stated where the arrays are, and
// V's stage vec4s are compared against the chunk's count); private arrays are
// indexed by literals only; every loop runs a number of steps bounded by CK,
// CV or the key blocks of seq_k (the key count of `attention_at` is at most
// seq_k; its position index b·seq_q + seq_q − 1 is below batch · seq_q, the
// whole binding, because the grid's heads are below the units the host
// binds). The host keeps the constants to the
// combinations stated below.

// Vec4 groups of output columns per invocation: the slice is 64·DV wide (1..4).
override DV: u32 = 1u;
// Head_dim values per step of Q·Kᵀ: 16 or 32. The chunks of Q and K hold
// 32·CK vec4s, at most 4 per invocation.
override CK: u32 = 16u;
// Keys per step of P·V (8, 16 or 32): the chunk of V holds 16·CV·DV vec4s, at
// most 4 per invocation.
override CV: u32 = 16u;
// Vec4s per row of the Q and K chunks: CK/4, plus one of padding (an odd
// stride: the eight rows a quarter-warp reads are in distinct banks).
override RSQ: u32 = CK / 4u + 1u;
// Vec4s of `stage`: Q and K chunks (2 · 64 rows of RSQ vec4s), or a V chunk
// (CV rows of 16·DV vec4s).
override STAGE: u32 = max(128u * (CK / 4u + 1u), 16u * CV * DV);

const BQ: u32 = 64u;
const BK: u32 = 64u;
// Vec4s per row of `ps`: 16, plus one of padding, so that the stores of a
// quarter-warp hit distinct banks.
const RS: u32 = 17u;
const LOWEST: f32 = -3.4028234663852886e38;

struct Params {
    seq_q: u32,
    seq_k: u32,
    d: u32,
    // Query heads per key/value head.
    group: u32,
    // Query blocks per head: ceil(seq_q / BQ).
    q_blocks: u32,
    // Workgroups that do work in this dispatch (heads · q_blocks).
    groups: u32,
    // Causal diagonal: query i sees keys j ≤ i + offset.
    offset: i32,
    // 1 with a causal mask, 0 without.
    causal: u32,
    // The softmax scale times log2(e).
    scale2: f32,
    // First output column of this dispatch's slice.
    c0: u32,
    // 1 when head_dim is a multiple of 4: rows are then read as vec4s.
    vec: u32,
    // Rows per key/value head in k and v (≥ seq_k: a KV cache's capacity, of
    // which the first seq_k rows are read).
    kv_rows: u32,
    // `attention_at`: the dispatch's first unit (a key/value head of one
    // sequence), the key/value heads per sequence, and 1 when the diagonal
    // moves with the key count (offset + keys), 0 when it does not.
    unit0: u32,
    heads_kv: u32,
    end_aligned: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
// The same q, k and v as vec4s (bound to the same ranges).
@group(0) @binding(5) var<storage, read> q4: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read> k4: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read> v4: array<vec4<f32>>;
// `attention_at`: the query positions, batch · seq_q values, bound whole.
@group(0) @binding(8) var<storage, read> positions: array<f32>;

// The stage being multiplied. Q chunk: stage[row·RSQ + d/4][d % 4] for
// row < BQ, d < CK (indices below 64·RSQ); K chunk after it, key j at
// 64·RSQ + j·RSQ + d/4 (indices below 128·RSQ). V chunk: stage[key·16·DV +
// column/4][column % 4] (indices below 16·CV·DV).
var<workgroup> stage: array<vec4<f32>, STAGE>;
// Weights of the key block: ps[key·RS + row/4][row % 4], key < 64, row < 64
// (indices below 63·17 + 16 = 1087).
var<workgroup> ps: array<vec4<f32>, 1088>;
// One value per (row, tx): red[row·4 + tx/4][tx % 4] (indices below 256).
var<workgroup> red: array<vec4<f32>, 256>;

var<private> lid: u32;
var<private> tx: u32;
var<private> ty: u32;
// First query row of the block; first element of the head's q / out rows and
// of its key/value head's rows.
var<private> q0: u32;
var<private> qbase: u32;
var<private> kvbase: u32;
// The keys this workgroup reads (seq_k, or `attention_at`'s count) and its
// causal diagonal: query i sees keys j ≤ i + diag.
var<private> nkeys: u32;
var<private> diag: i32;

// Scores of the invocation's row r at keys tx + 16·c.
var<private> s: array<vec4<f32>, 4>;
// Output accumulator: o[r·4 + g] holds row r at slice columns 4·(g·16 + tx)..+3.
var<private> o: array<vec4<f32>, 16>;
// Running maxima (of scaled scores, base 2) and partial sums of the 4 rows.
var<private> m: vec4<f32>;
var<private> l: vec4<f32>;
// The next stage's values, loaded ahead: vec4 lid + 256·i of the stage in pre[i].
var<private> pre: array<vec4<f32>, 4>;

// Values col..col+3 of row `row` of this head's q (k and v: of its key/value
// head), zeros outside the matrix.
fn load_q(row: u32, col: u32) -> vec4<f32> {
    var r = vec4<f32>(0.0);
    if (row < p.seq_q) {
        let i = qbase + row * p.d + col;
        if (col + 3u < p.d) {
            if (p.vec != 0u) {
                r = q4[i / 4u];
            } else {
                r = vec4<f32>(q[i], q[i + 1u], q[i + 2u], q[i + 3u]);
            }
        } else {
            if (col < p.d) { r.x = q[i]; }
            if (col + 1u < p.d) { r.y = q[i + 1u]; }
            if (col + 2u < p.d) { r.z = q[i + 2u]; }
        }
    }
    return r;
}

fn load_k(row: u32, col: u32) -> vec4<f32> {
    var r = vec4<f32>(0.0);
    if (row < nkeys) {
        let i = kvbase + row * p.d + col;
        if (col + 3u < p.d) {
            if (p.vec != 0u) {
                r = k4[i / 4u];
            } else {
                r = vec4<f32>(k[i], k[i + 1u], k[i + 2u], k[i + 3u]);
            }
        } else {
            if (col < p.d) { r.x = k[i]; }
            if (col + 1u < p.d) { r.y = k[i + 1u]; }
            if (col + 2u < p.d) { r.z = k[i + 2u]; }
        }
    }
    return r;
}

fn load_v(row: u32, col: u32) -> vec4<f32> {
    var r = vec4<f32>(0.0);
    if (row < nkeys) {
        let i = kvbase + row * p.d + col;
        if (col + 3u < p.d) {
            if (p.vec != 0u) {
                r = v4[i / 4u];
            } else {
                r = vec4<f32>(v[i], v[i + 1u], v[i + 2u], v[i + 3u]);
            }
        } else {
            if (col < p.d) { r.x = v[i]; }
            if (col + 1u < p.d) { r.y = v[i + 1u]; }
            if (col + 2u < p.d) { r.z = v[i + 2u]; }
        }
    }
    return r;
}

// The e-th vec4 of a Q or K chunk (e < 16·CK): (row, first column within the chunk).
fn qk_slot(e: u32) -> vec2<u32> {
    return vec2<u32>(e / (CK / 4u), (e % (CK / 4u)) * 4u);
}

// Vec4 e of the Q and K stage (e < 32·CK: Q's first) of key block kb, from head_dim d0 on.
fn fetch_qk(e: u32, d0: u32, kb: u32) -> vec4<f32> {
    if (e < 16u * CK) {
        let a = qk_slot(e);
        return load_q(q0 + a.x, d0 + a.y);
    }
    let a = qk_slot(e - 16u * CK);
    return load_k(kb * BK + a.x, d0 + a.y);
}

// Vec4 e of the V stage (e < 16·CV·DV) whose first key is key0.
fn fetch_v(e: u32, key0: u32) -> vec4<f32> {
    let w = 16u * DV;
    return load_v(key0 + e / w, p.c0 + (e % w) * 4u);
}

// Loads stage t of the walk into `pre` (nc stages of Q·Kᵀ, then BK / CV of
// P·V, `per` in all, for each key block).
fn fetch(t: u32, nc: u32, per: u32) {
    let kb = t / per;
    let st = t % per;
    if (st < nc) {
        // 32·CK vec4s, a multiple of 256.
        let n = 32u * CK;
        let d0 = st * CK;
        pre[0] = fetch_qk(lid, d0, kb);
        if (n > 256u) { pre[1] = fetch_qk(lid + 256u, d0, kb); }
        if (n > 512u) { pre[2] = fetch_qk(lid + 512u, d0, kb); }
        if (n > 768u) { pre[3] = fetch_qk(lid + 768u, d0, kb); }
    } else {
        let n = 16u * CV * DV;
        let key0 = kb * BK + (st - nc) * CV;
        if (lid < n) { pre[0] = fetch_v(lid, key0); }
        if (lid + 256u < n) { pre[1] = fetch_v(lid + 256u, key0); }
        if (lid + 512u < n) { pre[2] = fetch_v(lid + 512u, key0); }
        if (lid + 768u < n) { pre[3] = fetch_v(lid + 768u, key0); }
    }
}

// Stores vec4 e of the Q and K stage (e < 32·CK: Q's first).
fn put_qk(e: u32, x: vec4<f32>) {
    if (e < 16u * CK) {
        let a = qk_slot(e);
        stage[a.x * RSQ + a.y / 4u] = x;
    } else {
        let a = qk_slot(e - 16u * CK);
        stage[(64u + a.x) * RSQ + a.y / 4u] = x;
    }
}

// Stores `pre`, stage t's values, into the stage.
fn put(t: u32, nc: u32, per: u32) {
    let st = t % per;
    if (st < nc) {
        let n = 32u * CK;
        put_qk(lid, pre[0]);
        if (n > 256u) { put_qk(lid + 256u, pre[1]); }
        if (n > 512u) { put_qk(lid + 512u, pre[2]); }
        if (n > 768u) { put_qk(lid + 768u, pre[3]); }
    } else {
        let n = 16u * CV * DV;
        if (lid < n) { stage[lid] = pre[0]; }
        if (lid + 256u < n) { stage[lid + 256u] = pre[1]; }
        if (lid + 512u < n) { stage[lid + 512u] = pre[2]; }
        if (lid + 768u < n) { stage[lid + 768u] = pre[3]; }
    }
}

// S += the Q·Kᵀ of the staged chunk, four head_dim values at a time: the
// invocation's rows a0..a3 and keys k0..k3, each a vec4 along head_dim.
fn scores() {
    let qr = 4u * ty * RSQ;
    let kr = (64u + tx) * RSQ;
    for (var d = 0u; d < CK / 4u; d++) {
        let a0 = stage[qr + d];
        let a1 = stage[qr + RSQ + d];
        let a2 = stage[qr + 2u * RSQ + d];
        let a3 = stage[qr + 3u * RSQ + d];
        let k0 = stage[kr + d];
        let k1 = stage[kr + 16u * RSQ + d];
        let k2 = stage[kr + 32u * RSQ + d];
        let k3 = stage[kr + 48u * RSQ + d];
        let kx = vec4<f32>(k0.x, k1.x, k2.x, k3.x);
        let ky = vec4<f32>(k0.y, k1.y, k2.y, k3.y);
        let kz = vec4<f32>(k0.z, k1.z, k2.z, k3.z);
        let kw = vec4<f32>(k0.w, k1.w, k2.w, k3.w);
        s[0] = fma(vec4<f32>(a0.x), kx, s[0]);
        s[0] = fma(vec4<f32>(a0.y), ky, s[0]);
        s[0] = fma(vec4<f32>(a0.z), kz, s[0]);
        s[0] = fma(vec4<f32>(a0.w), kw, s[0]);
        s[1] = fma(vec4<f32>(a1.x), kx, s[1]);
        s[1] = fma(vec4<f32>(a1.y), ky, s[1]);
        s[1] = fma(vec4<f32>(a1.z), kz, s[1]);
        s[1] = fma(vec4<f32>(a1.w), kw, s[1]);
        s[2] = fma(vec4<f32>(a2.x), kx, s[2]);
        s[2] = fma(vec4<f32>(a2.y), ky, s[2]);
        s[2] = fma(vec4<f32>(a2.z), kz, s[2]);
        s[2] = fma(vec4<f32>(a2.w), kw, s[2]);
        s[3] = fma(vec4<f32>(a3.x), kx, s[3]);
        s[3] = fma(vec4<f32>(a3.y), ky, s[3]);
        s[3] = fma(vec4<f32>(a3.z), kz, s[3]);
        s[3] = fma(vec4<f32>(a3.w), kw, s[3]);
    }
}

// O += P·V for the staged chunk `c` of V (keys c·CV..+CV of the block).
fn accumulate(c: u32) {
    let w = 16u * DV;
    for (var j = 0u; j < CV; j++) {
        let a = ps[(c * CV + j) * RS + ty];
        let row = j * w + tx;
        let b0 = stage[row];
        o[0] = fma(vec4<f32>(a.x), b0, o[0]);
        o[4] = fma(vec4<f32>(a.y), b0, o[4]);
        o[8] = fma(vec4<f32>(a.z), b0, o[8]);
        o[12] = fma(vec4<f32>(a.w), b0, o[12]);
        if (DV > 1u) {
            let b1 = stage[row + 16u];
            o[1] = fma(vec4<f32>(a.x), b1, o[1]);
            o[5] = fma(vec4<f32>(a.y), b1, o[5]);
            o[9] = fma(vec4<f32>(a.z), b1, o[9]);
            o[13] = fma(vec4<f32>(a.w), b1, o[13]);
        }
        if (DV > 2u) {
            let b2 = stage[row + 32u];
            o[2] = fma(vec4<f32>(a.x), b2, o[2]);
            o[6] = fma(vec4<f32>(a.y), b2, o[6]);
            o[10] = fma(vec4<f32>(a.z), b2, o[10]);
            o[14] = fma(vec4<f32>(a.w), b2, o[14]);
        }
        if (DV > 3u) {
            let b3 = stage[row + 48u];
            o[3] = fma(vec4<f32>(a.x), b3, o[3]);
            o[7] = fma(vec4<f32>(a.y), b3, o[7]);
            o[11] = fma(vec4<f32>(a.z), b3, o[11]);
            o[15] = fma(vec4<f32>(a.w), b3, o[15]);
        }
    }
}

// Largest component.
fn max4(x: vec4<f32>) -> f32 {
    return max(max(x.x, x.y), max(x.z, x.w));
}

// The 16 values of row `row` in `red`, reduced by max or sum.
fn row_max(row: u32) -> f32 {
    let b = row * 4u;
    return max4(max(max(red[b], red[b + 1u]), max(red[b + 2u], red[b + 3u])));
}

fn row_sum(row: u32) -> f32 {
    let b = row * 4u;
    return dot(red[b] + red[b + 1u] + red[b + 2u] + red[b + 3u], vec4<f32>(1.0));
}

// Stores x.x..x.w at red[r·4 + tx/4][tx % 4] for rows r = row..row+3.
fn put_red(row: u32, x: vec4<f32>) {
    let b = row * 4u + tx / 4u;
    let c = tx % 4u;
    red[b][c] = x.x;
    red[b + 4u][c] = x.y;
    red[b + 8u][c] = x.z;
    red[b + 12u][c] = x.w;
}

// Row `row`'s scores of key block kb (`x`), scaled, with the keys it does not
// see (past the key count; with a causal mask, past i + diag) set to LOWEST.
fn mask_row(x: vec4<f32>, row: u32, kb: u32) -> vec4<f32> {
    let i = i32(q0 + row);
    var lim = i32(nkeys);
    if (p.causal != 0u) {
        lim = min(lim, i + diag + 1);
    }
    let j = vec4<i32>(i32(kb * BK + tx)) + vec4<i32>(0, 16, 32, 48);
    return select(vec4<f32>(LOWEST), x * p.scale2, j < vec4<i32>(lim));
}

// The weights exp2(x − m) of masked scores `x` (zero where masked).
fn weigh(x: vec4<f32>, m: f32) -> vec4<f32> {
    return select(vec4<f32>(0.0), exp2(x - m), x > vec4<f32>(LOWEST));
}

// The online softmax step of key block kb (S complete in `s`): the running
// maxima and sums, the output rescaled, the weights in `ps`. Call from uniform
// control flow. (Private arrays are indexed by literals only, here and in the
// products, so that they can live in registers.)
fn softmax(kb: u32) {
    let r0 = 4u * ty;
    let x0 = mask_row(s[0], r0, kb);
    let x1 = mask_row(s[1], r0 + 1u, kb);
    let x2 = mask_row(s[2], r0 + 2u, kb);
    let x3 = mask_row(s[3], r0 + 3u, kb);
    put_red(r0, vec4<f32>(max4(x0), max4(x1), max4(x2), max4(x3)));
    workgroupBarrier();
    let mx = vec4<f32>(row_max(r0), row_max(r0 + 1u), row_max(r0 + 2u), row_max(r0 + 3u));
    let m_new = max(m, mx);
    // 0 for a row's first visible keys (m was LOWEST), 1 while it sees none.
    let alpha = exp2(m - m_new);
    m = m_new;
    let w0 = weigh(x0, m_new.x);
    let w1 = weigh(x1, m_new.y);
    let w2 = weigh(x2, m_new.z);
    let w3 = weigh(x3, m_new.w);
    let one = vec4<f32>(1.0);
    l = l * alpha + vec4<f32>(dot(w0, one), dot(w1, one), dot(w2, one), dot(w3, one));
    o[0] *= alpha.x;
    o[4] *= alpha.y;
    o[8] *= alpha.z;
    o[12] *= alpha.w;
    if (DV > 1u) {
        o[1] *= alpha.x;
        o[5] *= alpha.y;
        o[9] *= alpha.z;
        o[13] *= alpha.w;
    }
    if (DV > 2u) {
        o[2] *= alpha.x;
        o[6] *= alpha.y;
        o[10] *= alpha.z;
        o[14] *= alpha.w;
    }
    if (DV > 3u) {
        o[3] *= alpha.x;
        o[7] *= alpha.y;
        o[11] *= alpha.z;
        o[15] *= alpha.w;
    }
    // Key tx + 16·c of the block, rows 4·ty..+3.
    ps[tx * RS + ty] = vec4<f32>(w0.x, w1.x, w2.x, w3.x);
    ps[(tx + 16u) * RS + ty] = vec4<f32>(w0.y, w1.y, w2.y, w3.y);
    ps[(tx + 32u) * RS + ty] = vec4<f32>(w0.z, w1.z, w2.z, w3.z);
    ps[(tx + 48u) * RS + ty] = vec4<f32>(w0.w, w1.w, w2.w, w3.w);
}

// Stores `x`, four output values of row `row` (of the head) from column `col`
// on (those below head_dim).
fn store4(row: u32, col: u32, x: vec4<f32>) {
    let i = qbase + row * p.d + col;
    if (col + 3u < p.d) {
        out[i] = x.x;
        out[i + 1u] = x.y;
        out[i + 2u] = x.z;
        out[i + 3u] = x.w;
    } else {
        if (col < p.d) { out[i] = x.x; }
        if (col + 1u < p.d) { out[i + 1u] = x.y; }
        if (col + 2u < p.d) { out[i + 2u] = x.z; }
    }
}

// Stores row `row` of the block, accumulators a0..a3 divided by the row's
// sum `total` (zeros when the row saw no key).
fn store_row(row: u32, total: f32, a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, a3: vec4<f32>) {
    let i = q0 + row;
    if (i >= p.seq_q) {
        return;
    }
    let inv = select(0.0, 1.0 / total, total > 0.0);
    let col = p.c0 + 4u * tx;
    store4(i, col, a0 * inv);
    if (DV > 1u) { store4(i, col + 64u, a1 * inv); }
    if (DV > 2u) { store4(i, col + 128u, a2 * inv); }
    if (DV > 3u) { store4(i, col + 192u, a3 * inv); }
}

// Workgroup `flat` (below p.groups) of the dispatch over the first `keys`
// keys (at most seq_k) with causal diagonal `offset`; both uniform.
fn attend(flat: u32, local: u32, keys: u32, offset: i32) {
    lid = local;
    nkeys = keys;
    diag = offset;
    // Subgroup w of 32 (w < 8) covers tx 8·(w % 2)..+7 and ty 4·(w / 2)..+3.
    let lane = local % 32u;
    let w = local / 32u;
    tx = 8u * (w % 2u) + lane % 8u;
    ty = 4u * (w / 2u) + lane / 8u;
    let head = flat / p.q_blocks;
    let qb = p.q_blocks - 1u - flat % p.q_blocks;
    let first = qb * BQ;
    q0 = first;
    qbase = head * p.seq_q * p.d;
    kvbase = (head / p.group) * p.kv_rows * p.d;
    // Keys any row of the block sees: 0..kend.
    var kend = keys;
    if (p.causal != 0u) {
        kend = u32(clamp(i32(first + BQ) + offset, 0, i32(keys)));
    }
    // Stages per key block: chunks of Q·Kᵀ, then BK / CV chunks of P·V.
    let nc = (p.d + CK - 1u) / CK;
    let per = nc + BK / CV;
    let steps = ((kend + BK - 1u) / BK) * per;
    m = vec4<f32>(LOWEST);
    l = vec4<f32>(0.0);
    if (steps > 0u) {
        fetch(0u, nc, per);
        put(0u, nc, per);
    }
    workgroupBarrier();
    for (var t = 0u; t < steps; t++) {
        let st = t % per;
        if (t + 1u < steps) {
            fetch(t + 1u, nc, per);
        }
        if (st < nc) {
            if (st == 0u) {
                s[0] = vec4<f32>(0.0);
                s[1] = vec4<f32>(0.0);
                s[2] = vec4<f32>(0.0);
                s[3] = vec4<f32>(0.0);
            }
            scores();
            if (st + 1u == nc) {
                softmax(t / per);
            }
        } else {
            accumulate(st - nc);
        }
        workgroupBarrier();
        if (t + 1u < steps) {
            put(t + 1u, nc, per);
        }
        workgroupBarrier();
    }
    // Each row's sum: its 16 partial sums (one per tx) added.
    let r0 = 4u * ty;
    put_red(r0, l);
    workgroupBarrier();
    store_row(r0, row_sum(r0), o[0], o[1], o[2], o[3]);
    store_row(r0 + 1u, row_sum(r0 + 1u), o[4], o[5], o[6], o[7]);
    store_row(r0 + 2u, row_sum(r0 + 2u), o[8], o[9], o[10], o[11]);
    store_row(r0 + 3u, row_sum(r0 + 3u), o[12], o[13], o[14], o[15]);
}

@compute @workgroup_size(256)
fn attention(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) local: u32,
) {
    let flat = wid.x + wid.y * nwg.x;
    if (flat >= p.groups) {
        return;
    }
    attend(flat, local, p.seq_k, p.offset);
}

// The key count of `attention_at`'s workgroup, written by invocation 0.
var<workgroup> keys_wg: u32;

// keys_at(position): trunc(position + 1) within 0..=seq_k, none for a NaN
// (detected from its bits: it holds without IEEE comparisons) or a position
// below 0 (then position + 1 < 1); exact for every f32 (trunc(p) + 1 in
// integers for 0 ≤ p < 2^31, seq_k beyond).
fn keys_at(position: f32) -> u32 {
    let bits = bitcast<u32>(position);
    if ((bits & 0x7fffffffu) > 0x7f800000u || !(position >= 0.0)) {
        return 0u;
    }
    if (position >= 2147483648.0) {
        return p.seq_k;
    }
    return min(u32(position) + 1u, p.seq_k);
}

@compute @workgroup_size(256)
fn attention_at(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) local: u32,
) {
    let flat = wid.x + wid.y * nwg.x;
    if (flat >= p.groups) {
        return;
    }
    if (local == 0u) {
        let b = (p.unit0 + flat / p.q_blocks / p.group) / p.heads_kv;
        keys_wg = keys_at(positions[b * p.seq_q + p.seq_q - 1u]);
    }
    let keys = workgroupUniformLoad(&keys_wg);
    attend(flat, local, keys, p.offset + select(0, i32(keys), p.end_aligned != 0u));
}
