// The ops a transformer decoder adds: rotary position embedding (`rope`),
// strided copies (`copy`), embedding lookups (`gather`) and the index of each
// row's maximum (`argmax`).
//
// Operands are arrays of u32 words for every dtype: one f32 value a word, or
// two f16/bf16 values (element 2i in the low half). The access functions of
// the @io block move raw bits (`bits_x`, `put_y`), so copies and lookups are
// exact, or values in f32 (`load_x`, `enc_y`). No two invocations of one
// dispatch write the two halves of one word:
//
// - `put_y2` writes two neighbouring values as whole words;
// - `put_y` on half data reads the word and writes it back with the other
//   half kept: a kernel calls it only where no other invocation of the
//   dispatch touches that word (the modes below say why).
//
// The workgroup grid may be 2-D (more than 65535 groups): the flat group index
// is `wid.x + wid.y * nwg.x`; surplus invocations return at once.

// Which scheme a kernel uses (see each entry point); pipeline-overridable.
override MODE: u32 = 0u;

// Sixteen u32 parameters; each entry point names its own.
struct Params {
    v: array<vec4<u32>, 4>,
}

@group(0) @binding(0) var<uniform> p: Params;

fn prm(k: u32) -> u32 {
    return p.v[k / 4u][k % 4u];
}

// The operands, as written here for f32 data. For f16 or bf16 data the
// backend replaces the lines between the markers (kernels.rs, `io_block`):
// the same functions over words of two packed values; `put_y` then reads
// and rewrites the word.
// @io-begin
@group(0) @binding(1) var<storage, read> x: array<u32>;
fn bits_x(i: u32) -> u32 { return x[i]; }
fn load_x(i: u32) -> f32 { return bitcast<f32>(x[i]); }
@group(0) @binding(2) var<storage, read_write> y: array<u32>;
const Y_PACKED: bool = false;
const Y_NAN: u32 = 0x7fc00000u;
fn enc_y(v: f32) -> u32 { return bitcast<u32>(v); }
fn put_y(i: u32, b: u32) { y[i] = b; }
fn put_y2(w: u32, lo: u32, hi: u32) { y[2u * w] = lo; y[2u * w + 1u] = hi; }
// @io-end

// f32 values read by index: the ids of `gather` (integers), the token
// positions of `rope_at`, the destination slots of `copy_at` (whole numbers).
@group(0) @binding(3) var<storage, read> ids: array<f32>;

const WG: u32 = 256u;

fn flat(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return (wid.x + wid.y * nwg.x) * WG + lid;
}

fn is_nan_bits(b: u32) -> bool {
    return (b & 0x7fffffffu) > 0x7f800000u;
}

// ---------------------------------------------------------------------------
// rope: x and y [rows, d] (rows = tokens · heads, token-major), pairs of a row
// by layout (0: (i, i + d/2), 1: (2i, 2i + 1)), the angle of pair i of token
// t `f32(position + t) · inv_freq(i)`, or with `rope_at` `ids[t] · inv_freq(i)`
// (the positions binding, one f32 per token, bound whole). Every invocation
// works within one row, so the entry points find its token's position and
// the shared body takes it.
//
// Parameters: 0 invocations, 1 layout, 2 heads, 3 d, 4 position, 5 the
// piece's first row (its token is (row0 + row) / heads), 6 and 7 the
// mantissa and exponent of θ^(−2/d) ([`Fx`]), 8 to 10 the bits of the f32
// coefficients a, b, c of Llama 3's frequency scaling (`scaled`; 0, 1, 1:
// none).
//
// MODE 0: one pair per invocation (f32 data; or interleaved halves, whose
// pair is one word). MODE 1: two neighbouring half-split pairs per
// invocation, two whole words (half data, d/2 even). MODE 2: one word per
// invocation, each of its two values computed from its own pair (half data,
// half-split, d/2 odd).

// m · 2^(e − 31): a positive number with a 32-bit significand m in [2^31, 2^32).
struct Fx {
    m: u32,
    e: i32,
}

// a · b, its significand truncated to 32 bits (relative error below 2^-31):
// the 64-bit product of the significands from 16-bit halves.
fn fx_mul(a: Fx, b: Fx) -> Fx {
    let al = a.m & 0xffffu;
    let ah = a.m >> 16u;
    let bl = b.m & 0xffffu;
    let bh = b.m >> 16u;
    let ll = al * bl;
    let lh = al * bh;
    let hl = ah * bl;
    let mid = (ll >> 16u) + (lh & 0xffffu) + (hl & 0xffffu);
    let hi = ah * bh + (lh >> 16u) + (hl >> 16u) + (mid >> 16u);
    if (hi >= 0x80000000u) {
        return Fx(hi, a.e + b.e + 1);
    }
    return Fx((hi << 1u) | ((mid << 16u) >> 31u), a.e + b.e);
}

// θ^(−2i/d) = r^i with r = θ^(−2/d) (from the host, 32 bits of significand),
// by squaring and multiplying in 32-bit integer arithmetic, rounded once to
// f32 (nearest, ties to even): within about 2^-32 · i of r^i before that
// rounding, on every adapter (no pow, exp2 or log2, whose WGSL accuracy is
// loose).
fn inv_freq(i: u32) -> f32 {
    var acc = Fx(0x80000000u, 0);
    var base = Fx(prm(6u), bitcast<i32>(prm(7u)));
    for (var n = i; n != 0u; n = n >> 1u) {
        if ((n & 1u) != 0u) {
            acc = fx_mul(acc, base);
        }
        if (n > 1u) {
            base = fx_mul(base, base);
        }
    }
    var q = acc.m >> 8u;
    let r = acc.m & 0xffu;
    if (r > 0x80u || (r == 0x80u && (q & 1u) == 1u)) {
        q += 1u;
    }
    return ldexp(f32(q), acc.e - 23);
}

// (cos a, sin a). WGSL leaves the accuracy of sin and cos loose (and for
// large arguments open), so: a − k·π/2 with k = round(a · 2/π) and π/2 in
// three parts (Cody–Waite: the first has 8 significant bits, so k · it is
// exact for |k| < 2^16, i.e. |a| below about 100000, and off by less than the
// f32 angle's own rounding beyond), then the minimax polynomials of Cephes'
// sinf and cosf on [−π/4, π/4] (about 1 ulp), then the quadrant.
fn cos_sin(a: f32) -> vec2<f32> {
    let k = round(a * 0.636619772367581343);
    let r = ((a - k * 1.5703125) - k * 4.837512969970703125e-4) - k * 7.54978995489188216e-8;
    let z = r * r;
    let s = r + r * z * (-1.6666654611e-1 + z * (8.3321608736e-3 + z * -1.9515295891e-4));
    let c = 1.0 - 0.5 * z + z * z * (4.166664568298827e-2 + z * (-1.388731625493765e-3 + z * 2.443315711809948e-5));
    switch (i32(k) & 3) {
        case 0: { return vec2<f32>(c, s); }
        case 1: { return vec2<f32>(-s, c); }
        case 2: { return vec2<f32>(-c, -s); }
        default: { return vec2<f32>(s, -c); }
    }
}

// Llama 3's frequency scaling of f: f·(c + s·(1 − c)), s = clamp(f·a + b,
// 0, 1); with (a, b, c) = (0, 1, 1) the product is f · 1, exact.
fn scaled(f: f32) -> f32 {
    let a = bitcast<f32>(prm(8u));
    let b = bitcast<f32>(prm(9u));
    let c = bitcast<f32>(prm(10u));
    let s = clamp(fma(f, a, b), 0.0, 1.0);
    return f * fma(s, 1.0 - c, c);
}

// (cos, sin) of pair i's angle at position `pos`.
fn rope_cs(pos: f32, i: u32) -> vec2<f32> {
    return cos_sin(pos * scaled(inv_freq(i)));
}

// Output value e of a row at `base` (MODE 2) at position `pos`: from its
// pair's two inputs.
fn rope_value(pos: f32, base: u32, e: u32) -> f32 {
    let h = prm(3u) / 2u;
    var i = e / 2u;
    var first = (e & 1u) == 0u;
    var other = e ^ 1u;
    if (prm(1u) == 0u) {
        first = e < h;
        i = select(e - h, e, first);
        other = select(e - h, e + h, first);
    }
    let cs = rope_cs(pos, i);
    let me = load_x(base + e);
    let o = load_x(base + other);
    // (x₁, x₂) → (x₁·c − x₂·s, x₂·c + x₁·s)
    return select(me * cs.x + o * cs.y, me * cs.x - o * cs.y, first);
}

// The row of the piece that invocation u works on.
fn rope_row(u: u32) -> u32 {
    let d = prm(3u);
    if (MODE == 1u) {
        return u / (d / 4u);
    }
    return u / (d / 2u);
}

// The token (of the whole call) of invocation u.
fn rope_token(u: u32) -> u32 {
    return (prm(5u) + rope_row(u)) / prm(2u);
}

@compute @workgroup_size(256)
fn rope(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let u = flat(wid, nwg, lid);
    if (u >= prm(0u)) {
        return;
    }
    rope_run(u, f32(prm(4u) + rope_token(u)));
}

@compute @workgroup_size(256)
fn rope_at(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let u = flat(wid, nwg, lid);
    if (u >= prm(0u)) {
        return;
    }
    rope_run(u, ids[rope_token(u)]);
}

// The values of invocation u (below the invocation count), its token at `pos`.
fn rope_run(u: u32, pos: f32) {
    let d = prm(3u);
    let h = d / 2u;
    if (MODE == 0u) {
        let row = u / h;
        let i = u % h;
        let base = row * d;
        var a = base + i;
        var b = base + i + h;
        if (prm(1u) != 0u) {
            a = base + 2u * i;
            b = a + 1u;
        }
        let cs = rope_cs(pos, i);
        let x1 = load_x(a);
        let x2 = load_x(b);
        let y1 = enc_y(x1 * cs.x - x2 * cs.y);
        let y2 = enc_y(x2 * cs.x + x1 * cs.y);
        if (Y_PACKED) {
            // Interleaved: the pair is word a / 2 (a is even).
            put_y2(a / 2u, y1, y2);
        } else {
            put_y(a, y1);
            put_y(b, y2);
        }
    } else if (MODE == 1u) {
        let per = d / 4u;
        let row = u / per;
        let i = (u % per) * 2u;
        let base = row * d;
        let c0 = rope_cs(pos, i);
        let c1 = rope_cs(pos, i + 1u);
        let a0 = load_x(base + i);
        let a1 = load_x(base + i + 1u);
        let b0 = load_x(base + i + h);
        let b1 = load_x(base + i + h + 1u);
        put_y2((base + i) / 2u, enc_y(a0 * c0.x - b0 * c0.y), enc_y(a1 * c1.x - b1 * c1.y));
        put_y2((base + i + h) / 2u, enc_y(b0 * c0.x + a0 * c0.y), enc_y(b1 * c1.x + a1 * c1.y));
    } else {
        let row = u / h;
        let w = u % h;
        let base = row * d;
        put_y2(base / 2u + w, enc_y(rope_value(pos, base, 2u * w)), enc_y(rope_value(pos, base, 2u * w + 1u)));
    }
}

// ---------------------------------------------------------------------------
// copy: y[dst(i, j, l)] = x[src(i, j, l)] over a [n0, n1, n2] block, where
// view(i, j, l) = offset + i·s0 + j·s1 + l·s2; nothing else of y is written.
//
// Parameters: 0 invocations, 1 n1, 2 n2, 3–6 the source's offset and
// strides, 7–10 the destination's, 11 the parity this dispatch writes (MODE 1),
// 12 the destination's slots (`copy_at`).
//
// `copy_at` writes source row j to destination slot ids[j] instead of j (the
// positions binding, n1 f32 values, bound whole): y[dst(i, ids[j], l)] =
// x[src(i, j, l)], nothing for a position that is not a whole number below
// the slots. Every invocation works within one source row j, so the entry
// points find its slot and the shared body takes it.
//
// MODE 0: one element per invocation (f32). MODE 1: one element per
// invocation, only those whose destination index has the dispatch's parity
// (half data, any view; the host dispatches both parities): the elements of
// one parity lie in distinct words (the destination view is one-to-one), so
// the read and write back of `put_y` races with nothing. MODE 2: two
// neighbouring elements (l even) per invocation, one whole word (half data
// whose destination offset and outer strides are even, s2 = 1 and n2 even).

fn src_at(i: u32, j: u32, l: u32) -> u32 {
    return prm(3u) + i * prm(4u) + j * prm(5u) + l * prm(6u);
}

fn dst_at(i: u32, j: u32, l: u32) -> u32 {
    return prm(7u) + i * prm(8u) + j * prm(9u) + l * prm(10u);
}

// The invocations per (i, j) row of the block: n2 elements, or n2 / 2 words.
fn copy_per_row() -> u32 {
    return select(prm(2u), prm(2u) / 2u, MODE == 2u);
}

// The source row j (second index) of invocation u.
fn copy_row(u: u32) -> u32 {
    return (u / copy_per_row()) % prm(1u);
}

// The destination slot of a position: itself if it is a whole number below
// `slots`, else NONE (also for a NaN, detected from its bits).
fn copy_slot(position: f32, slots: u32) -> u32 {
    let nan = is_nan_bits(bitcast<u32>(position));
    if (nan || !(position >= 0.0) || position >= 4294967296.0 || floor(position) != position) {
        return NONE;
    }
    let k = u32(position);
    return select(NONE, k, k < slots);
}

@compute @workgroup_size(256)
fn copy(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let u = flat(wid, nwg, lid);
    if (u >= prm(0u)) {
        return;
    }
    let j = copy_row(u);
    copy_run(u, j, j);
}

@compute @workgroup_size(256)
fn copy_at(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let u = flat(wid, nwg, lid);
    if (u >= prm(0u)) {
        return;
    }
    let j = copy_row(u);
    let to = copy_slot(ids[j], prm(12u));
    if (to == NONE) {
        return;
    }
    copy_run(u, j, to);
}

// The element (or word) of invocation u (below the invocation count), whose
// source row j goes to destination slot `to`.
fn copy_run(u: u32, j: u32, to: u32) {
    let per = copy_per_row();
    let i = u / per / prm(1u);
    if (MODE == 2u) {
        let l = (u % per) * 2u;
        let s = src_at(i, j, l);
        put_y2(dst_at(i, to, l) / 2u, bits_x(s), bits_x(s + prm(6u)));
        return;
    }
    let l = u % per;
    let at = dst_at(i, to, l);
    if (MODE == 1u && (at & 1u) != prm(11u)) {
        return;
    }
    put_y(at, bits_x(src_at(i, j, l)));
}

// ---------------------------------------------------------------------------
// gather: y[r, c] = table[ids[r], c] for a table of `rows` rows of `cols`;
// an id that is not an integer in 0..rows gives a row of NaN (the dtype's NaN
// bits). The table may be bound in pieces of whole rows, one dispatch each:
// a dispatch writes the values of the rows it binds, and the first also the
// NaN rows.
//
// Parameters: 0 invocations, 1 cols, 2 rows, 3 first row bound, 4 rows
// bound, 5 whether this dispatch writes NaN rows, 6 output elements.
//
// MODE 0: one element per invocation (f32). MODE 1: one output word per
// invocation (half data): its two values are looked up independently, and
// a word only partly written by this dispatch is read and written back by
// the invocation that owns it.

// (written by this dispatch, bits) of output element e.
fn gather_value(e: u32) -> vec2<u32> {
    let cols = prm(1u);
    let id = ids[e / cols];
    let valid = !is_nan_bits(bitcast<u32>(id)) && id >= 0.0 && id < f32(prm(2u)) && floor(id) == id;
    if (!valid) {
        return vec2<u32>(prm(5u), Y_NAN);
    }
    let k = u32(id);
    let r0 = prm(3u);
    if (k < r0 || k - r0 >= prm(4u)) {
        return vec2<u32>(0u, 0u);
    }
    return vec2<u32>(1u, bits_x((k - r0) * cols + e % cols));
}

@compute @workgroup_size(256)
fn gather(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let u = flat(wid, nwg, lid);
    if (u >= prm(0u)) {
        return;
    }
    if (MODE == 0u) {
        let v = gather_value(u);
        if (v.x != 0u) {
            put_y(u, v.y);
        }
        return;
    }
    let e = 2u * u;
    let a = gather_value(e);
    var b = vec2<u32>(0u, 0u);
    if (e + 1u < prm(6u)) {
        b = gather_value(e + 1u);
    }
    if (a.x != 0u && b.x != 0u) {
        put_y2(u, a.y, b.y);
    } else if (a.x != 0u) {
        put_y(e, a.y);
    } else if (b.x != 0u) {
        put_y(e + 1u, b.y);
    }
}

// ---------------------------------------------------------------------------
// argmax: y[r] = the index (as f32) of the largest value of row r of x
// [rows, cols]: the first of equal maxima, and a NaN beats every number
// (the first NaN wins). One workgroup per row: each invocation scans a
// stride of the row in increasing order, then a fixed tree over (value,
// index) pairs: deterministic. y is f32.
//
// Parameters: 0 rows in this piece, 1 cols.

const NONE: u32 = 0xffffffffu;

var<workgroup> best_bits: array<u32, WG>;
var<workgroup> best_index: array<u32, WG>;

// Whether (av, ai) wins over (bv, bi) (values as f32 bits; NONE: no element).
fn wins(av: u32, ai: u32, bv: u32, bi: u32) -> bool {
    if (ai == NONE) {
        return false;
    }
    if (bi == NONE) {
        return true;
    }
    let an = is_nan_bits(av);
    let bn = is_nan_bits(bv);
    if (an || bn) {
        return select(an, ai < bi, an && bn);
    }
    let a = bitcast<f32>(av);
    let b = bitcast<f32>(bv);
    if (a != b) {
        return a > b;
    }
    return ai < bi;
}

@compute @workgroup_size(256)
fn argmax(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= prm(0u)) {
        return;
    }
    let cols = prm(1u);
    let base = row * cols;
    var bv = 0u;
    var bi = NONE;
    for (var c = lid; c < cols; c += WG) {
        let v = bitcast<u32>(load_x(base + c));
        if (wins(v, c, bv, bi)) {
            bv = v;
            bi = c;
        }
    }
    best_bits[lid] = bv;
    best_index[lid] = bi;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if (lid < s) {
            let ov = best_bits[lid + s];
            let oi = best_index[lid + s];
            if (wins(ov, oi, best_bits[lid], best_index[lid])) {
                best_bits[lid] = ov;
                best_index[lid] = oi;
            }
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        put_y(row, bitcast<u32>(f32(best_index[0])));
    }
}
