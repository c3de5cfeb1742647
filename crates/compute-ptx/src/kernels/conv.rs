//! Convolution support: `im2col`, after which `conv2d` is one batched GEMM.
//!
//! For image `n`, `col[n]` is the `(c_in·kh·kw) × (oh·ow)` matrix whose column
//! `(oy, ox)` holds the input window of output pixel `(oy, ox)` (zeros where the
//! window hangs over the padding). Then `y[n] = W · col[n]`, with `W` the
//! weights viewed as `c_out × (c_in·kh·kw)`: exactly NCHW output, so the GEMM
//! writes `y` in place (batch stride 0 for `W`).

use crate::builder::{BuildError, Cmp, Dim, F32, Kernel, KernelBuilder, Target, U32, U64};

/// Threads per block.
pub const BLOCK: u32 = 256;

/// Builds `im2col`. Params: `x`, `col`, `c_in`, `h`, `w`, `kh`, `kw`, `sh`, `sw`,
/// `ph`, `pw`, `oh`, `ow` (u32). Launch: [`BLOCK`] threads, grid
/// `(ceil(c_in·kh·kw·oh·ow / 256), n)`; that product must fit in u32.
pub fn im2col(target: Target) -> Result<Kernel, BuildError> {
    let mut b = KernelBuilder::new("im2col", target);
    b.doc("im2col: col[n][(ci,ky,kx)][(oy,ox)] = x[n][ci][oy*sh+ky-ph][ox*sw+kx-pw], 0 in the padding");
    b.doc("one thread per element of col; blockIdx.y is the image");
    b.max_threads(BLOCK);
    let x = b.param_ptr("x");
    let col = b.param_ptr("col");
    let names = ["c_in", "h", "w", "kh", "kw", "sh", "sw", "ph", "pw", "oh", "ow"];
    let p: Vec<_> = names.iter().map(|n| b.param::<U32>(n)).collect();
    let (c_in, h, w, kh, kw, sh, sw, ph, pw, oh, ow) =
        (p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10]);
    let e = b.global_index_x();
    let ni = b.ctaid(Dim::Y);
    let khw = b.mul(kh, kw);
    let kk = b.mul(c_in, khw);
    let pix_n = b.mul(oh, ow);
    let total = b.mul(kk, pix_n);
    let exit = b.label("exit");
    let out = b.setp(Cmp::Ge, e, total);
    b.bra_if(out, exit);
    let kidx = b.div(e, pix_n);
    let t = b.mul(kidx, pix_n);
    let pix = b.sub(e, t);
    let ci = b.div(kidx, khw);
    let t = b.mul(ci, khw);
    let r = b.sub(kidx, t);
    let ky = b.div(r, kw);
    let t = b.mul(ky, kw);
    let kx = b.sub(r, t);
    let oy = b.div(pix, ow);
    let t = b.mul(oy, ow);
    let ox = b.sub(pix, t);
    b.comment("input row and column; below the padding they wrap to huge unsigned values");
    let iy = b.mad(oy, sh, ky);
    let iy = b.sub(iy, ph);
    let ix = b.mad(ox, sw, kx);
    let ix = b.sub(ix, pw);
    let y_ok = b.setp(Cmp::Lt, iy, h);
    let x_ok = b.setp(Cmp::Lt, ix, w);
    let inside = b.and_pred(y_ok, x_ok);
    let v = b.mov(0.0f32);
    let plane = b.mad(ni, c_in, ci);
    let prow = b.mul_wide(plane, h);
    let iy64 = b.cvt::<U64, U32>(iy);
    let prow = b.add(prow, iy64);
    let w64 = b.cvt::<U64, U32>(w);
    let ix64 = b.cvt::<U64, U32>(ix);
    let xi = b.mad(prow, w64, ix64);
    let xb = b.shl(xi, 2u32);
    let xa = b.add(x, xb);
    b.guarded(inside, false, |b| {
        let l = b.ld_global_nc::<F32>(xa, 0);
        b.assign(v, l);
    });
    let ci_ = b.mul_wide(ni, total);
    let e64 = b.cvt::<U64, U32>(e);
    let ci_ = b.add(ci_, e64);
    let cb = b.shl(ci_, 2u32);
    let ca = b.add(col, cb);
    b.st_global(ca, 0, v);
    b.place(exit);
    b.ret();
    b.finish()
}
