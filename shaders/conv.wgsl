// 2-D convolution (cross-correlation), NCHW, no bias: one invocation per output
// element, looping over input channels and the kernel window. Consecutive
// invocations share an output channel, so weight loads are broadcast.

struct Params {
    n: u32,
    c_in: u32,
    h: u32,
    w: u32,
    c_out: u32,
    kh: u32,
    kw: u32,
    sh: u32,
    sw: u32,
    ph: u32,
    pw: u32,
    oh: u32,
    ow: u32,
    // n · c_out · oh · ow.
    total: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
// The operands and their access functions, one element at a time, as written
// here for f32 data. For f16 or bf16 inputs the backend replaces the lines
// between the markers (kernels.rs, `io_block`): x and wt are arrays of u32
// words of two packed values; y stays f32 (an f32 temporary, which the backend
// casts), since neighbouring invocations write neighbouring elements.
// @io-begin
@group(0) @binding(1) var<storage, read> x: array<f32>;
fn load_x(i: u32) -> f32 { return x[i]; }
@group(0) @binding(2) var<storage, read> wt: array<f32>;
fn load_wt(i: u32) -> f32 { return wt[i]; }
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
fn store_y(i: u32, v: f32) { y[i] = v; }
// @io-end

@compute @workgroup_size(256)
fn conv2d(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let idx = (wid.x + wid.y * nwg.x) * 256u + lid;
    if (idx >= p.total) {
        return;
    }
    let ox = idx % p.ow;
    var t = idx / p.ow;
    let oy = t % p.oh;
    t = t / p.oh;
    let co = t % p.c_out;
    let ni = t / p.c_out;
    var acc = 0.0;
    for (var ci = 0u; ci < p.c_in; ci++) {
        let xb = (ni * p.c_in + ci) * p.h;
        let wb = (co * p.c_in + ci) * p.kh;
        for (var ky = 0u; ky < p.kh; ky++) {
            // Row in the unpadded input; out of range rows are padding (zero).
            let iy = i32(oy * p.sh + ky) - i32(p.ph);
            if (iy < 0 || iy >= i32(p.h)) {
                continue;
            }
            let xr = (xb + u32(iy)) * p.w;
            let wr = (wb + ky) * p.kw;
            for (var kx = 0u; kx < p.kw; kx++) {
                let ix = i32(ox * p.sw + kx) - i32(p.pw);
                if (ix >= 0 && ix < i32(p.w)) {
                    acc = fma(load_x(xr + u32(ix)), load_wt(wr + kx), acc);
                }
            }
        }
    }
    store_y(idx, acc);
}
