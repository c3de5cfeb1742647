// Half-precision storage: f16 and bf16 values packed two to a u32 word (element
// 2i in the low 16 bits, 2i + 1 in the high 16 bits, as the host's little-endian
// bytes lay them out), and exact conversions to and from f32 in integer
// arithmetic.
//
// The backend prepends this file to every shader module it builds for f16 or
// bf16 operands (kernels.rs, `Module::source_for`); the kernels compute in f32.
// The conversions are written with integer operations only, so they give the
// same bits on every adapter: WGSL leaves the rounding of `pack2x16float`
// implementation-defined and lets implementations flush subnormals in float
// arithmetic, and a cast must match the CPU bit for bit. No SHADER_F16 is
// needed. Round to nearest, ties to even; NaN stays NaN (sign kept, quiet bit
// set); values past f16's range become ±∞.

// f16 bits (the low 16 bits of `h`) as f32, exactly: subnormals become normal
// f32 values, ±∞ and NaN are kept.
fn f16_to_f32(h: u32) -> f32 {
    let s = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    // Normal: rebias the exponent (127 − 15 = 112).
    var bits = s | ((e + 112u) << 23u) | (m << 13u);
    if (e == 0x1fu) {
        bits = s | 0x7f800000u | (m << 13u);
    } else if (e == 0u) {
        // ±0, or a subnormal m · 2^-24 whose top bit sits at position t (0..9):
        // the f32 1.f · 2^(t − 24).
        let t = 31u - countLeadingZeros(max(m, 1u));
        let sub = ((t + 103u) << 23u) | ((m << (23u - t)) & 0x7fffffu);
        bits = select(s | sub, s, m == 0u);
    }
    return bitcast<f32>(bits);
}

// f32 as f16 bits (in the low 16 bits), rounded to nearest, ties to even.
fn f32_to_f16(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    let s = (b >> 16u) & 0x8000u;
    let a = b & 0x7fffffffu;
    if (a > 0x7f800000u) {
        // NaN: quiet, with the top bits of the payload.
        return s | 0x7e00u | ((a >> 13u) & 0x3ffu);
    }
    if (a >= 0x477ff000u) {
        // 65520 and above (halfway past 65504 rounds up), and ∞: ∞.
        return s | 0x7c00u;
    }
    if (a >= 0x38800000u) {
        // Normal f16: drop 13 mantissa bits, rounding to nearest even; a carry
        // moves into the exponent, as it should.
        return s | ((a + 0x0fffu + ((a >> 13u) & 1u) - 0x38000000u) >> 13u);
    }
    if (a <= 0x33000000u) {
        // At most 2^-25 (half the smallest subnormal, which ties to even 0),
        // and f32 subnormals: ±0.
        return s;
    }
    // Subnormal f16 (or the smallest normal, by rounding up): the 24-bit
    // significand shifted right by 126 − e (14..24 places), rounded to nearest even.
    let e = a >> 23u;
    let m = (a & 0x7fffffu) | 0x800000u;
    let sh = 126u - e;
    let q = m >> sh;
    let r = m & ((1u << sh) - 1u);
    let half = 1u << (sh - 1u);
    let up = select(0u, 1u, r > half || (r == half && (q & 1u) == 1u));
    return s | (q + up);
}

// bf16 bits (the low 16 bits of `h`) as f32, exactly.
fn bf16_to_f32(h: u32) -> f32 {
    return bitcast<f32>(h << 16u);
}

// f32 as bf16 bits (in the low 16 bits), rounded to nearest, ties to even;
// values past bf16's largest finite value become ±∞.
fn f32_to_bf16(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        // NaN: quiet, sign and top payload bits kept.
        return (b >> 16u) | 0x40u;
    }
    return (b + 0x7fffu + ((b >> 16u) & 1u)) >> 16u;
}

// The two f16 values of a word.
fn f16x2_to_f32(w: u32) -> vec2<f32> {
    return vec2<f32>(f16_to_f32(w & 0xffffu), f16_to_f32(w >> 16u));
}

// Two values as one word of f16.
fn f32x2_to_f16(v: vec2<f32>) -> u32 {
    return f32_to_f16(v.x) | (f32_to_f16(v.y) << 16u);
}

// The two bf16 values of a word.
fn bf16x2_to_f32(w: u32) -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(w << 16u), bitcast<f32>(w & 0xffff0000u));
}

// Two values as one word of bf16.
fn f32x2_to_bf16(v: vec2<f32>) -> u32 {
    return f32_to_bf16(v.x) | (f32_to_bf16(v.y) << 16u);
}

// Element i of an array of words holding f16 values.
fn f16_at(w: u32, i: u32) -> f32 {
    return f16_to_f32((w >> ((i & 1u) * 16u)) & 0xffffu);
}

// Element i of an array of words holding bf16 values.
fn bf16_at(w: u32, i: u32) -> f32 {
    return bitcast<f32>(((w >> ((i & 1u) * 16u)) & 0xffffu) << 16u);
}
