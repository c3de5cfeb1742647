// GGML block-quantized weights: the product y = x · Wᵀ (`gemv`) and
// dequantization (`dequant`).
//
// W holds rows of k values as ggml blocks, packed back to back with no
// padding (q4_K: 256 values in 144 bytes, q5_K: 256 in 176, q6_K: 256 in 210,
// q8_0: 32 in 34), read here as an array of u32 words. q6_K and q8_0 blocks
// start only 2-byte aligned, so their fields are read across word boundaries
// (`word_at`, `byte_at`). The format is the pipeline-overridable `FMT`.
//
// `dequant` works on *slices* of a block, the bytes whose values one
// invocation decodes: q4_K and q5_K one word of 4-bit quants (32 slices a
// block, 8 values: 4 low nibbles and the 4 high nibbles 32 values further),
// q6_K one word of low bits from each half-run with its high bits (16 slices,
// 16 values), q8_0 two words (4 slices, 8 values), written four values at a
// time (whole words also for f16/bf16 outputs, through the @io block). Values
// are decoded to f32 exactly as `BlockFormat::dequantize` does (the products
// are exact in f32, so a fused multiply-add gives the same bits). The f16
// scales go through half.wgsl's `f16_to_f32` (exact for subnormals, which
// `unpack2x16float` may flush): the backend puts half.wgsl before this file
// for every variant.
//
// `gemv` (y = x · Wᵀ for up to 16 rows of x) works on 32-value *chunks* (see
// "gemv helpers" below); its entry points are generated per (MR, NR) by the
// backend (`kernels/quant_gemv.rs`) and appended to this file: a workgroup of
// WG invocations computes NR consecutive weight rows for MR rows of x, each
// invocation striding over the chunks of the rows. The values are the ones
// dequantize computes; y is written as f32, one value per output (the host
// casts into a half output).
//
// The grid may be 2-D (more than 65535 workgroups); the flat group index is
// wid.x + wid.y · nwg.x, and groups past the work return at once.

// 0 q4_K, 1 q5_K, 2 q6_K, 3 q8_0.
override FMT: u32 = 0u;

const WG: u32 = 128u;
const DQ_WG: u32 = 256u;
const ACC: u32 = 64u;

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
    return f16_to_f32(extractBits(wq[o >> 2u], (o & 2u) * 8u, 16u));
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
            let d = f16_to_f32(head & 0xffffu);
            let dmin = f16_to_f32(head >> 16u);
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

// ---- gemv helpers (the entry points are generated: kernels/quant_gemv.rs) ----
//
// Work unit: a *chunk* of 32 values of one weight row, in eight groups of four
// consecutive values (group g at value offset goff(g) from the chunk's first):
// q4_K and q5_K one vec4 of quants (8 chunks a block: run jp = c / 2 of 32
// bytes, half c % 2; low nibbles are groups 0..4, high nibbles 4..8, 32
// values further), q6_K two words of each half-run's low bits with their high
// bits (8 chunks: half h = c / 4, positions l = 8 (c % 4); groups 2q + j at
// 32q + 4j), q8_0 one whole block (groups at 4g). `load_chunk` loads a chunk's
// bytes at once (q4_K/q5_K: 16-byte loads, with the block's 16-byte header of
// scales; q6_K/q8_0: words) and keeps them packed as eight words of four small
// unsigned bytes each (one word a group) with one scale and one offset per
// group class; a group becomes four f32 values only where it is multiplied.

// A chunk of one weight row: packed quant bytes of groups 0..4 (`lo`) and
// 4..8 (`hi`), each group class's scale and offset (value = fma(scale, q,
// -offset)), and the value offset of the chunk within the row.
struct Chunk {
    lo: vec4<u32>,
    hi: vec4<u32>,
    sc: vec4<f32>,
    mn: vec4<f32>,
    col: u32,
}

// Partial sums on their way to one total each: the subgroups' totals (at most
// 32 subgroups of ACC sums), or the tree's ACC_TREE sums per invocation.
var<workgroup> red: array<f32, 2048>;
const ACC_TREE: u32 = 16u;

// The same weight bytes as `wq`, 16 at a time (bound by the host to the same
// range): q4_K and q5_K blocks keep 16-byte alignment (144 and 176 bytes).
@group(0) @binding(5) var<storage, read> wv: array<vec4<u32>>;

// The four bytes of w as exact f32 values: each byte's bits placed in the
// mantissa of 2²³ and 2²³ subtracted (two full-rate operations a value where
// an integer conversion runs at a quarter of the rate on many GPUs).
fn bytes_f32(w: u32) -> vec4<f32> {
    let b = (vec4<u32>(w) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xffu);
    return bitcast<vec4<f32>>(b | vec4<u32>(0x4b000000u)) - vec4<f32>(8388608.0);
}

// Chunks per block, and the vec4s of a q4_K/q5_K block.
fn chunks() -> u32 {
    return select(8u, 1u, FMT == 3u);
}

fn block_vec4s() -> u32 {
    return select(9u, 11u, FMT == 1u);
}

// Value offset of group g within a chunk.
fn goff(g: u32) -> u32 {
    switch FMT {
        case 0u, 1u: { return (g >> 2u) * 32u + (g & 3u) * 4u; }
        case 2u: { return (g >> 1u) * 32u + (g & 1u) * 4u; }
        default: { return 4u * g; }
    }
}

// Scale class of group g (component of Chunk.sc / Chunk.mn).
fn gclass(g: u32) -> u32 {
    switch FMT {
        case 0u, 1u: { return g >> 2u; }
        case 2u: { return g >> 1u; }
        default: { return 0u; }
    }
}

// The four values of group g of chunk ch, as dequantize computes them.
fn group_values(ch: Chunk, word: u32, g: u32) -> vec4<f32> {
    let cls = gclass(g);
    return fma(vec4<f32>(ch.sc[cls]), bytes_f32(word), -vec4<f32>(ch.mn[cls]));
}

// The 8 bytes at byte offset o (even) as two words.
fn words2(o: u32) -> vec2<u32> {
    let i = o >> 2u;
    let a = wq[i];
    let b = wq[i + 1u];
    if ((o & 2u) == 0u) {
        return vec2<u32>(a, b);
    }
    let c = wq[i + 2u];
    return vec2<u32>((a >> 16u) | (b << 16u), (b >> 16u) | (c << 16u));
}

// Chunk c of block blk of weight row `row` (of p.k values).
fn load_chunk(row: u32, blk: u32, c: u32) -> Chunk {
    let nb = p.k / block_values();
    switch FMT {
        case 0u, 1u: {
            // d, dmin, 12 scale bytes | (q5_K: 32 bytes of fifth bits) | 128
            // bytes of quants in four runs of 32.
            let bv = (row * nb + blk) * block_vec4s();
            let hdr = wv[bv];
            let jp = c >> 1u;
            let q = wv[bv + select(1u, 3u, FMT == 1u) + c];
            var lo = q & vec4<u32>(0x0f0f0f0fu);
            var hi = (q >> vec4<u32>(4u)) & vec4<u32>(0x0f0f0f0fu);
            if (FMT == 1u) {
                let qh = wv[bv + 1u + (c & 1u)];
                lo |= ((qh >> vec4<u32>(2u * jp)) & vec4<u32>(0x01010101u)) << vec4<u32>(4u);
                hi |= ((qh >> vec4<u32>(2u * jp + 1u)) & vec4<u32>(0x01010101u)) << vec4<u32>(4u);
            }
            // The 8 six-bit scales and mins (ggml's get_scale_min_k4), four to a word.
            let sc_lo = hdr.y & 0x3f3f3f3fu;
            let mn_lo = hdr.z & 0x3f3f3f3fu;
            let sc_hi = (hdr.w & 0x0f0f0f0fu) | ((hdr.y >> 2u) & 0x30303030u);
            let mn_hi = ((hdr.w >> 4u) & 0x0f0f0f0fu) | ((hdr.z >> 2u) & 0x30303030u);
            let sh = 16u * (jp & 1u);
            let scw = select(sc_lo, sc_hi, jp >= 2u) >> sh;
            let mnw = select(mn_lo, mn_hi, jp >= 2u) >> sh;
            let d = f16_to_f32(hdr.x & 0xffffu);
            let dmin = f16_to_f32(hdr.x >> 16u);
            let s = bytes_f32((scw & 0xffffu) | ((mnw & 0xffffu) << 16u));
            let sc = vec4<f32>(d * s.x, d * s.y, 0.0, 0.0);
            let mn = vec4<f32>(dmin * s.z, dmin * s.w, 0.0, 0.0);
            return Chunk(lo, hi, sc, mn, blk * 256u + 64u * jp + 16u * (c & 1u));
        }
        case 2u: {
            // q6_K: ql[128], qh[64], scales[16] (i8), d (f16) last.
            let bb = row * nb * 210u + blk * 210u;
            let h = c >> 2u;
            let l = 8u * (c & 3u);
            let a = words2(bb + 64u * h + l);
            let b = words2(bb + 64u * h + 32u + l);
            let qh = words2(bb + 128u + 32u * h + l);
            let m4 = vec2<u32>(0x0f0f0f0fu);
            let m2 = vec2<u32>(0x03030303u);
            let q1 = (a & m4) | ((qh & m2) << vec2<u32>(4u));
            let q2 = (b & m4) | (((qh >> vec2<u32>(2u)) & m2) << vec2<u32>(4u));
            let q3 = ((a >> vec2<u32>(4u)) & m4) | (((qh >> vec2<u32>(4u)) & m2) << vec2<u32>(4u));
            let q4 = ((b >> vec2<u32>(4u)) & m4) | (((qh >> vec2<u32>(6u)) & m2) << vec2<u32>(4u));
            let d = f16_field(bb + 208u);
            // Signed scales of the four groups: bytes is, is + 2, is + 4, is + 6.
            let sc = bb + 192u + 8u * h + l / 16u;
            let sv = vec4<f32>(
                f32(extractBits(bitcast<i32>(byte_at(sc)), 0u, 8u)),
                f32(extractBits(bitcast<i32>(byte_at(sc + 2u)), 0u, 8u)),
                f32(extractBits(bitcast<i32>(byte_at(sc + 4u)), 0u, 8u)),
                f32(extractBits(bitcast<i32>(byte_at(sc + 6u)), 0u, 8u)),
            );
            // (d·sc)·(q − 32) rounded once, as dequantize: fma(d·sc, q, −32·d·sc).
            let ds = d * sv;
            return Chunk(vec4<u32>(q1, q2), vec4<u32>(q3, q4), ds, 32.0 * ds, blk * 256u + 128u * h + l);
        }
        default: {
            // q8_0: d (f16), 32 signed bytes; the block's 34 bytes lie in the 9
            // words from its first, offset by 0 or 2 bytes.
            let bb = (row * nb + blk) * 34u;
            let i = bb >> 2u;
            let odd = (bb & 2u) != 0u;
            let w0 = wq[i];
            let a = vec4<u32>(w0, wq[i + 1u], wq[i + 2u], wq[i + 3u]);
            let b = vec4<u32>(a.yzw, wq[i + 4u]);
            let e = vec4<u32>(wq[i + 5u], wq[i + 6u], wq[i + 7u], wq[i + 8u]);
            let f = vec4<u32>(b.w, e.xyz);
            let d = f16_to_f32(select(w0 & 0xffffu, w0 >> 16u, odd));
            let s = vec4<u32>(16u);
            let flip = vec4<u32>(0x80808080u);
            let lo = select((a >> s) | (b << s), b, odd) ^ flip;
            let hi = select((f >> s) | (e << s), e, odd) ^ flip;
            // d·(q + 128) − 128·d = d·q (exact).
            return Chunk(lo, hi, vec4<f32>(d), vec4<f32>(128.0 * d), blk * 32u);
        }
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
