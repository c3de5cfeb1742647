// GGML block-quantized weights: the product y = x · Wᵀ (`gemv`) and
// dequantization (`dequant`).
//
// W holds rows of k values as ggml blocks, packed back to back with no
// padding (q4_K: 256 values in 144 bytes, q5_K: 256 in 176, q6_K: 256 in 210,
// q8_0: 32 in 34), read here as an array of u32 words. q6_K and q8_0 blocks
// start only 2-byte aligned, so their fields are read across word boundaries
// (`word_at`, `byte_at`). The format is the pipeline-overridable `FMT`.
//
// Work unit: one *slice* of a block, the bytes whose values one invocation
// decodes: q4_K and q5_K one word of 4-bit quants (32 slices a block, 8
// values: 4 low nibbles and the 4 high nibbles 32 values further), q6_K one
// word of low bits from each half-run with its high bits (16 slices, 16
// values), q8_0 two words (4 slices, 8 values). Consecutive invocations take
// consecutive slices, so a subgroup's quant loads are consecutive words of
// one row (coalesced); the block header words are the same address for a
// run of invocations (broadcast from cache). Values are decoded to f32 in
// registers exactly as `BlockFormat::dequantize` does (the products are exact
// in f32, so a fused multiply-add gives the same bits), four at a time.
//
// `gemv`: a workgroup of WG invocations computes NR consecutive weight rows
// for MR rows of x (one pass; the host runs more passes for more rows). Each
// invocation strides over the slices of the rows, decodes its slice of each of
// the NR rows (NR independent loads in flight), then reads the matching
// values of x, four at a time, once for the NR rows (x is small and stays in
// cache), accumulating MR·NR f32 sums. The sums are then reduced over the
// workgroup: with subgroups (`@reduce` block replaced by the backend), one
// subgroupAdd each and a pass over the subgroups' partials; otherwise a tree
// in workgroup memory. y is written as f32, one value per output: the host
// casts into a half output.
//
// `dequant`: one invocation per slice, writing its values four at a time
// (whole words also for f16/bf16 outputs, through the @io block).
//
// The grid may be 2-D (more than 65535 workgroups); the flat group index is
// wid.x + wid.y · nwg.x, and groups past the work return at once.

// 0 q4_K, 1 q5_K, 2 q6_K, 3 q8_0.
override FMT: u32 = 0u;
// Rows of x per gemv pass (1..=8) and weight rows per workgroup (1..=4);
// MR · NR ≤ ACC.
override MR: u32 = 1u;
override NR: u32 = 4u;

const WG: u32 = 128u;
const DQ_WG: u32 = 256u;
const ACC: u32 = 16u;

struct Params {
    // gemv: values per weight row; dequant: blocks in this piece.
    k: u32,
    // gemv: weight rows in this piece.
    n: u32,
    // gemv: rows of x in this pass (≤ MR) and the first of them.
    m: u32,
    m0: u32,
    // gemv: y's row stride, and the column of y of this piece's first weight row.
    ldy: u32,
    j0: u32,
    // Workgroups of work (the grid may hold a few more).
    groups: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
// The activations and the dequantized output, four values at a time, as
// written here for f32 data; for f16 or bf16 the backend replaces the lines
// between the markers (kernels.rs, `io_block`) with arrays of vec2<u32>.
// @io-begin
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
fn load_x(j: u32) -> vec4<f32> { return x[j]; }
@group(0) @binding(2) var<storage, read_write> y: array<vec4<f32>>;
fn store_y(j: u32, v: vec4<f32>) { y[j] = v; }
// @io-end
// The product's f32 output and the weight blocks.
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read> wq: array<u32>;

// Bytes of a block, values of a block, slices of a block, vec4s of a slice.
fn block_bytes() -> u32 {
    switch FMT {
        case 0u: { return 144u; }
        case 1u: { return 176u; }
        case 2u: { return 210u; }
        default: { return 34u; }
    }
}

fn block_values() -> u32 {
    return select(256u, 32u, FMT == 3u);
}

fn slices() -> u32 {
    switch FMT {
        case 2u: { return 16u; }
        case 3u: { return 4u; }
        default: { return 32u; }
    }
}

fn slice_vec4s() -> u32 {
    return select(2u, 4u, FMT == 2u);
}

// The 4 bytes at byte offset o (any alignment; all 4 inside the binding).
fn word_at(o: u32) -> u32 {
    let i = o >> 2u;
    let s = (o & 3u) * 8u;
    if (s == 0u) {
        return wq[i];
    }
    return (wq[i] >> s) | (wq[i + 1u] << (32u - s));
}

// The byte at byte offset o, zero-extended.
fn byte_at(o: u32) -> u32 {
    return extractBits(wq[o >> 2u], (o & 3u) * 8u, 8u);
}

// The f16 at the even byte offset o, as f32 (exact, subnormals kept).
fn f16_field(o: u32) -> f32 {
    return f16_exact(extractBits(wq[o >> 2u], (o & 2u) * 8u, 16u));
}

// f16 bits (the low 16 bits of h) as f32, exactly, in integer arithmetic (as
// half.wgsl's f16_to_f32: unpack2x16float may flush subnormals).
fn f16_exact(h: u32) -> f32 {
    let s = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    var bits = s | ((e + 112u) << 23u) | (m << 13u);
    if (e == 0x1fu) {
        bits = s | 0x7f800000u | (m << 13u);
    } else if (e == 0u) {
        let t = 31u - countLeadingZeros(max(m, 1u));
        let sub = ((t + 103u) << 23u) | ((m << (23u - t)) & 0x7fffffu);
        bits = select(s | sub, s, m == 0u);
    }
    return bitcast<f32>(bits);
}

// The four bytes of a word as unsigned values, low byte first.
fn bytes4(w: u32) -> vec4<u32> {
    return (vec4<u32>(w) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xffu);
}

// The four bytes of a word as signed values, low byte first.
fn sbytes4(w: u32) -> vec4<i32> {
    let v = bitcast<i32>(w);
    return vec4<i32>(extractBits(v, 0u, 8u), extractBits(v, 8u, 8u), extractBits(v, 16u, 8u), extractBits(v, 24u, 8u));
}

// Scale (x) and min (y) of group j (0..8) of a q4_K/q5_K block whose 12
// packed bytes start at byte offset o (ggml's get_scale_min_k4).
fn scale_min_k4(o: u32, j: u32) -> vec2<u32> {
    if (j < 4u) {
        return vec2<u32>(byte_at(o + j) & 63u, byte_at(o + j + 4u) & 63u);
    }
    let lo = byte_at(o + j + 4u);
    return vec2<u32>((lo & 0xfu) | ((byte_at(o + j - 4u) >> 6u) << 4u), (lo >> 4u) | ((byte_at(o + j) >> 6u) << 4u));
}

// Values of slice t of the block at byte offset bb, as dequantize computes
// them, into v[0..slice_vec4s()], and their offsets within the block (each
// the first of four consecutive values) into c.
fn decode(bb: u32, t: u32, v: ptr<function, array<vec4<f32>, 4>>, c: ptr<function, array<u32, 4>>) {
    switch FMT {
        case 0u, 1u: {
            // q4_K / q5_K: d, dmin, 12 scale bytes, (q5_K: 32 bytes of fifth
            // bits), 128 bytes of quants in four runs of 32.
            let head = wq[bb >> 2u];
            let d = f16_exact(head & 0xffffu);
            let dmin = f16_exact(head >> 16u);
            let r = t / 8u;
            let l = 4u * (t % 8u);
            let sm1 = scale_min_k4(bb + 4u, 2u * r);
            let sm2 = scale_min_k4(bb + 4u, 2u * r + 1u);
            let qs_at = select(16u, 48u, FMT == 1u);
            let qw = wq[((bb + qs_at) >> 2u) + t];
            let qb = bytes4(qw);
            var lo = qb & vec4<u32>(0xfu);
            var hi = qb >> vec4<u32>(4u);
            if (FMT == 1u) {
                let h = bytes4(wq[((bb + 16u) >> 2u) + (t % 8u)]);
                lo = lo + (((h >> vec4<u32>(2u * r)) & vec4<u32>(1u)) << vec4<u32>(4u));
                hi = hi + (((h >> vec4<u32>(2u * r + 1u)) & vec4<u32>(1u)) << vec4<u32>(4u));
            }
            let d1 = d * f32(sm1.x);
            let m1 = dmin * f32(sm1.y);
            let d2 = d * f32(sm2.x);
            let m2 = dmin * f32(sm2.y);
            (*v)[0] = d1 * vec4<f32>(lo) - vec4<f32>(m1);
            (*v)[1] = d2 * vec4<f32>(hi) - vec4<f32>(m2);
            (*c)[0] = 64u * r + l;
            (*c)[1] = 64u * r + 32u + l;
        }
        case 2u: {
            // q6_K: ql[128], qh[64], scales[16] (i8), d (f16) last. Slice t:
            // half h, positions l..l+4 of its 32, values 128h + l + 32q.
            let h = t / 8u;
            let l = 4u * (t % 8u);
            let d = f16_field(bb + 208u);
            let a = bytes4(word_at(bb + 64u * h + l));
            let b = bytes4(word_at(bb + 64u * h + l + 32u));
            let qh = bytes4(word_at(bb + 128u + 32u * h + l));
            let is = 8u * h + l / 16u;
            let q1 = vec4<i32>((a & vec4<u32>(0xfu)) | ((qh & vec4<u32>(3u)) << vec4<u32>(4u))) - vec4<i32>(32);
            let q2 = vec4<i32>((b & vec4<u32>(0xfu)) | (((qh >> vec4<u32>(2u)) & vec4<u32>(3u)) << vec4<u32>(4u)))
                - vec4<i32>(32);
            let q3 = vec4<i32>((a >> vec4<u32>(4u)) | (((qh >> vec4<u32>(4u)) & vec4<u32>(3u)) << vec4<u32>(4u)))
                - vec4<i32>(32);
            let q4 = vec4<i32>((b >> vec4<u32>(4u)) | ((qh >> vec4<u32>(6u)) << vec4<u32>(4u))) - vec4<i32>(32);
            let sc = bb + 192u + is;
            let s1 = f32(extractBits(bitcast<i32>(byte_at(sc)), 0u, 8u));
            let s2 = f32(extractBits(bitcast<i32>(byte_at(sc + 2u)), 0u, 8u));
            let s3 = f32(extractBits(bitcast<i32>(byte_at(sc + 4u)), 0u, 8u));
            let s4 = f32(extractBits(bitcast<i32>(byte_at(sc + 6u)), 0u, 8u));
            (*v)[0] = (d * s1) * vec4<f32>(q1);
            (*v)[1] = (d * s2) * vec4<f32>(q2);
            (*v)[2] = (d * s3) * vec4<f32>(q3);
            (*v)[3] = (d * s4) * vec4<f32>(q4);
            let base = 128u * h + l;
            (*c)[0] = base;
            (*c)[1] = base + 32u;
            (*c)[2] = base + 64u;
            (*c)[3] = base + 96u;
        }
        default: {
            // q8_0: d (f16), 32 signed bytes. Slice t: values 8t..8t+8.
            let d = f16_field(bb);
            let q1 = sbytes4(word_at(bb + 2u + 8u * t));
            let q2 = sbytes4(word_at(bb + 6u + 8u * t));
            (*v)[0] = vec4<f32>(q1) * d;
            (*v)[1] = vec4<f32>(q2) * d;
            (*c)[0] = 8u * t;
            (*c)[1] = 8u * t + 4u;
        }
    }
}

// Each invocation's sums: acc[r · MR + i] for weight row r and x row i.
var<private> acc: array<f32, 16>;
// The workgroup's partial sums on their way to one total each (WG · ACC).
var<workgroup> red: array<f32, 2048>;

// Accumulates into acc the products of this invocation's slices of the NR
// weight rows from row0 with the MR rows of x of this pass.
fn accumulate(lid: u32, row0: u32) {
    let units = (p.k / block_values()) * slices();
    let row_bytes = (p.k / block_values()) * block_bytes();
    for (var a = 0u; a < ACC; a++) {
        acc[a] = 0.0;
    }
    var wv: array<vec4<f32>, 16>;
    for (var u = lid; u < units; u += WG) {
        let blk = u / slices();
        let t = u % slices();
        var c: array<u32, 4>;
        for (var r = 0u; r < NR; r++) {
            var v: array<vec4<f32>, 4>;
            if (row0 + r < p.n) {
                decode((row0 + r) * row_bytes + blk * block_bytes(), t, &v, &c);
            }
            for (var q = 0u; q < 4u; q++) {
                wv[r * 4u + q] = v[q];
            }
        }
        let col = blk * block_values();
        for (var i = 0u; i < MR; i++) {
            if (i < p.m) {
                let xrow = (p.m0 + i) * p.k + col;
                for (var q = 0u; q < slice_vec4s(); q++) {
                    let xv = load_x((xrow + c[q]) >> 2u);
                    for (var r = 0u; r < NR; r++) {
                        acc[r * MR + i] += dot(wv[r * 4u + q], xv);
                    }
                }
            }
        }
    }
}

// Writes the total `v` of output lid (weight row lid / MR, x row lid % MR) of
// the workgroup's rows from row0, if it exists.
fn write_total(lid: u32, row0: u32, v: f32) {
    let r = lid / MR;
    let i = lid % MR;
    if (row0 + r < p.n && i < p.m) {
        out[(p.m0 + i) * p.ldy + p.j0 + row0 + r] = v;
    }
}

// Without subgroup operations: the sums reduced by a tree over the WG
// invocations in workgroup memory (log2 WG barriers).
@compute @workgroup_size(WG)
fn gemv(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let group = wid.x + wid.y * nwg.x;
    if (group >= p.groups) {
        return;
    }
    let row0 = group * NR;
    accumulate(lid, row0);
    for (var a = 0u; a < ACC; a++) {
        red[lid * ACC + a] = acc[a];
    }
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if (lid < s) {
            for (var a = 0u; a < ACC; a++) {
                red[lid * ACC + a] += red[(lid + s) * ACC + a];
            }
        }
        workgroupBarrier();
    }
    if (lid < MR * NR) {
        write_total(lid, row0, red[lid]);
    }
}

@compute @workgroup_size(DQ_WG)
fn dequant(
    @builtin(global_invocation_id) gid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    let u = gid.x + gid.y * nwg.x * DQ_WG;
    if (u >= p.k * slices()) {
        return;
    }
    let blk = u / slices();
    let t = u % slices();
    var v: array<vec4<f32>, 4>;
    var c: array<u32, 4>;
    decode(blk * block_bytes(), t, &v, &c);
    let base = blk * block_values();
    for (var q = 0u; q < slice_vec4s(); q++) {
        store_y((base + c[q]) >> 2u, v[q]);
    }
}
