//! Products of a few rows by a half-precision weight, the weight read in
//! place: `y = x·W` or `y = x·Wᵀ` for `m ≤ GEMM_DOTS_MAX_M` rows of `x`
//! (decoding), `W` in `f16` or `bf16`, `f32` accumulation.
//!
//! The general half matmul widens both operands into `f32` arrays first,
//! which for a weight means writing (and, in a fresh allocation, faulting in)
//! twice its bytes before the product reads them again. Here the weight is
//! widened a piece at a time into a small per-task buffer that stays in L1,
//! and the `f32` lane code runs on it:
//! - `Wᵀ` stored `n × k` (a linear layer's weight): each weight row is widened
//!   once and dotted with every row of `x`; tasks take [`ROWS`] weight rows.
//!   On the AVX2 path the row is widened in registers as the dot products
//!   read it (`convert::dot_rows`), four rows of `x` per pass, and never
//!   stored as `f32`.
//! - `W` stored `k × n`: each task takes [`COLS`] columns and walks the depth,
//!   widening `W[p, cols]` and adding `x[i, p]·W[p, cols]` into `m` rows of
//!   accumulators. On the AVX2 path the pieces are widened in registers
//!   (`convert::columns`), four depth steps per pass over the accumulators,
//!   with the same sums in the same order.
//!
//! Each task writes its own part of `y`, so the values are those of one
//! thread whatever the thread count. Where AVX512_BF16 exists, `bf16`
//! products take the `vdpbf16ps` GEMM instead (module `gemm::bf16`).

use compute_core::{HostSlice, MatmulSpec};

use super::{convert, widen_range};
use crate::isa::Isa;
use crate::kernels::fork;
use crate::simd::{Block, LANES, LaneFn, SimdF32, WithSimd, blocks, dispatch};
use crate::tuning::{GEMM_DOTS_MAX_M, PAR_GEMM_MIN_MACS};

/// Weight rows (`n × k` layout) per task.
pub const ROWS: usize = 32;

/// Columns (`k × n` layout) per task: 2 KiB of `W` in half per depth step.
pub const COLS: usize = 1024;

/// Whether [`gemv`] computes `spec` on these operands: one product (no
/// batch), `x` not transposed, 1 to `GEMM_DOTS_MAX_M` rows, a weight in
/// `f16` or `bf16` and `x` of the same dtype or `f32`, and slices long enough
/// for the shape. Free.
pub fn takes(spec: &MatmulSpec, a: HostSlice<'_>, b: HostSlice<'_>) -> bool {
    let MatmulSpec { batch, m, k, n, trans_a, .. } = *spec;
    let half = |x: HostSlice<'_>| matches!(x, HostSlice::F16(_) | HostSlice::BF16(_));
    batch == 1
        && !trans_a
        && (1..=GEMM_DOTS_MAX_M).contains(&m)
        && k > 0
        && n > 0
        && half(b)
        && (half(a) || matches!(a, HostSlice::F32(_)))
        && m.checked_mul(k).is_some_and(|l| a.len() >= l)
        && k.checked_mul(n).is_some_and(|l| b.len() >= l)
}

/// `c = x·op(b)` (`m × n`, row-major, overwritten) for `x` the `m × k`
/// rows already widened to `f32`, where [`takes`] holds. Costs `2·m·k·n`
/// FLOPs and one read of `b`, in [`ROWS`] / [`COLS`] pieces (in parallel
/// from [`PAR_GEMM_MIN_MACS`] multiply-adds), with `m·COLS` floats of
/// accumulators per piece of `W` stored `k × n`, and off the AVX2 path a
/// buffer of `k` (or `COLS`) floats for the widened pieces.
pub fn gemv(isa: Isa, spec: &MatmulSpec, x: &[f32], b: HostSlice<'_>, c: &mut [f32]) {
    let MatmulSpec { m, k, n, trans_b, .. } = *spec;
    let c = &mut c[..m * n];
    if trans_b {
        // Each piece: y[.., j0..j1] as rows of j, for all i.
        let parts = pieces(m * k * n, n.div_ceil(ROWS), |t| {
            let (j0, j1) = (t * ROWS, ((t + 1) * ROWS).min(n));
            let mut w = Vec::new();
            let mut y = vec![0.0f32; (j1 - j0) * m];
            for (j, y) in (j0..j1).zip(y.chunks_exact_mut(m)) {
                // On AVX2 the row is widened in registers as it is read;
                // elsewhere into `w` (in L1), then the `f32` lane code runs.
                if !convert::dot_rows(isa, x, k, b, j * k, y) {
                    w.resize(k, 0.0);
                    widen_range(isa, b, j * k, &mut w);
                    dispatch(isa, Dots { x, k, w: &w, out: y });
                }
            }
            y
        });
        for (t, y) in parts.iter().enumerate() {
            for (dj, row) in y.chunks_exact(m).enumerate() {
                for (i, v) in row.iter().enumerate() {
                    c[i * n + t * ROWS + dj] = *v;
                }
            }
        }
    } else {
        let parts = pieces(m * k * n, n.div_ceil(COLS), |t| {
            let (j0, j1) = (t * COLS, ((t + 1) * COLS).min(n));
            let mut acc = vec![0.0f32; m * (j1 - j0)];
            // On AVX2 the pieces of `W` are widened in registers as they are
            // read; elsewhere into a buffer in L1, then the `f32` lane code runs.
            if !convert::columns(isa, x, (m, k, n), b, (j0, j1), &mut acc) {
                dispatch(isa, Columns { isa, x, m, k, n, b, cols: (j0, j1), acc: &mut acc });
            }
            acc
        });
        for (t, acc) in parts.iter().enumerate() {
            let (j0, width) = (t * COLS, acc.len() / m);
            for (i, row) in acc.chunks_exact(width).enumerate() {
                c[i * n + j0..i * n + j0 + width].copy_from_slice(row);
            }
        }
    }
}

/// `f(t)` for `t` in `0..count`, in order: on the pool's threads when the
/// product has at least [`PAR_GEMM_MIN_MACS`] multiply-adds, else on this one.
fn pieces<R: Send>(macs: usize, count: usize, f: impl Fn(usize) -> R + Sync) -> Vec<R> {
    if macs < PAR_GEMM_MIN_MACS { (0..count).map(f).collect() } else { fork::map(count, f) }
}

/// `acc + a·b`, fused.
struct MulAdd;

impl<S: SimdF32> LaneFn<S, 3> for MulAdd {
    #[inline(always)]
    fn apply(&self, s: S, [acc, a, b]: [S::V; 3]) -> S::V {
        s.fma(a, b, acc)
    }
}

/// `out[i] = x_i · w` for each of the `out.len()` rows of `x` (`k` values each).
struct Dots<'a> {
    x: &'a [f32],
    k: usize,
    w: &'a [f32],
    out: &'a mut [f32],
}

impl WithSimd for Dots<'_> {
    type Output = ();
    #[inline(always)]
    fn run<S: SimdF32>(self, s: S) {
        for (o, x) in self.out.iter_mut().zip(self.x.chunks_exact(self.k)) {
            *o = s.reduce_add(blocks::fold2(s, x, self.w, 0.0, s.splat(0.0), &MulAdd, &blocks::Add));
        }
    }
}

/// Columns `cols` of `x·W` for `W` stored `k × n`, added into `acc` (`m`
/// rows of `width` floats, row by row), the depth walked once.
struct Columns<'a> {
    isa: Isa,
    x: &'a [f32],
    m: usize,
    k: usize,
    n: usize,
    b: HostSlice<'a>,
    cols: (usize, usize),
    acc: &'a mut [f32],
}

impl WithSimd for Columns<'_> {
    type Output = ();
    #[inline(always)]
    fn run<S: SimdF32>(self, s: S) {
        let Columns { isa, x, m, k, n, b, cols: (j0, j1), acc } = self;
        let width = j1 - j0;
        let acc = &mut acc[..m * width];
        let mut w = vec![0.0f32; width];
        let whole = width / LANES * LANES;
        for p in 0..k {
            widen_range(isa, b, p * n + j0, &mut w);
            for (i, acc) in acc.chunks_exact_mut(width).enumerate() {
                let xp = x[i * k + p];
                let a = s.splat(xp);
                let (acc_v, acc_t) = acc.split_at_mut(whole);
                let (w_v, w_t) = w.split_at(whole);
                for (acc, w) in acc_v.chunks_exact_mut(LANES).zip(w_v.chunks_exact(LANES)) {
                    let (acc, w): (&mut Block, &Block) = match (acc.try_into(), w.try_into()) {
                        (Ok(acc), Ok(w)) => (acc, w),
                        _ => continue,
                    };
                    let v = s.fma(a, s.load(w), s.load(acc));
                    s.store(acc, v);
                }
                for (acc, w) in acc_t.iter_mut().zip(w_t) {
                    *acc = xp.mul_add(*w, *acc);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use compute_core::{bf16, f16};

    /// `x·op(W)` in `f64` from the half values.
    fn reference(x: &[f32], w: &[f32], (m, k, n): (usize, usize, usize), trans_b: bool) -> Vec<f64> {
        let mut y = vec![0.0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                y[i * n + j] = (0..k)
                    .map(|p| {
                        let wv = if trans_b { w[j * k + p] } else { w[p * n + j] };
                        f64::from(x[i * k + p]) * f64::from(wv)
                    })
                    .sum();
            }
        }
        y
    }

    #[test]
    fn few_rows_by_a_half_weight_match_the_reference_on_every_path() {
        let mut rng = compute_core::conformance::rng::Rng::new(7);
        for (m, k, n) in [(1, 1, 1), (1, 4096, 40), (3, 100, 1029), (16, 37, 2100), (2, 1031, 65)] {
            for trans_b in [false, true] {
                let x32 = rng.vec(m * k, -1.0, 1.0);
                let w32 = rng.vec(k * n, -1.0, 1.0);
                let spec = MatmulSpec { trans_b, ..MatmulSpec::new(m, k, n) };
                let wb: Vec<bf16> = w32.iter().map(|&v| bf16::from_f32(v)).collect();
                let wh: Vec<f16> = w32.iter().map(|&v| f16::from_f32(v)).collect();
                for (b, wv) in [
                    (HostSlice::BF16(&wb), wb.iter().map(|v| v.to_f32()).collect::<Vec<_>>()),
                    (HostSlice::F16(&wh), wh.iter().map(|v| v.to_f32()).collect::<Vec<_>>()),
                ] {
                    assert!(takes(&spec, HostSlice::F32(&x32), b));
                    let want = reference(&x32, &wv, (m, k, n), trans_b);
                    for isa in [Isa::Portable, Isa::Avx2, Isa::Avx512] {
                        if !isa.is_supported() {
                            continue;
                        }
                        let mut c = vec![f32::NAN; m * n];
                        gemv(isa, &spec, &x32, b, &mut c);
                        for (idx, (&got, &want)) in c.iter().zip(&want).enumerate() {
                            let bound = 1e-5 * (k as f64).sqrt() * (1.0 + want.abs()) + 1e-6 * k as f64;
                            assert!(
                                (f64::from(got) - want).abs() <= bound,
                                "{isa:?} {m}x{k}x{n} trans_b={trans_b} {:?} [{idx}]: {got} vs {want}",
                                b.dtype()
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn only_few_rows_of_one_product_by_a_half_weight_are_taken() {
        let (x, w) = (vec![0.0f32; 64 * 8], vec![bf16::ZERO; 64]);
        let ok = MatmulSpec::new(8, 8, 8);
        assert!(takes(&ok, HostSlice::F32(&x), HostSlice::BF16(&w)));
        assert!(!takes(&MatmulSpec::new(17, 8, 8), HostSlice::F32(&x), HostSlice::BF16(&w)));
        assert!(!takes(&MatmulSpec { batch: 2, ..ok }, HostSlice::F32(&x), HostSlice::BF16(&w)));
        assert!(!takes(&MatmulSpec { trans_a: true, ..ok }, HostSlice::F32(&x), HostSlice::BF16(&w)));
        assert!(!takes(&ok, HostSlice::F32(&x), HostSlice::F32(&x)));
        assert!(!takes(&ok, HostSlice::F32(&x), HostSlice::BF16(&w[..63])));
    }
}
