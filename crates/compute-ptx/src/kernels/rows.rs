//! Row-wise ops: softmax, log_softmax, layer_norm, rms_norm.
//!
//! One group of threads per row: a warp (`*_warp`, rows of at most
//! [`WARP_MAX_COLS`], eight rows per block) or the whole block (`*_block`).
//! Pass A reads the row from global memory once (`float4` loads when
//! `cols % 4 == 0`), keeps a copy in shared memory when it fits, and folds each
//! value into the running statistics. Softmax of a cached row takes the max in
//! pass A, then sums `e^(x−m)` from the cache (keeping each exponential there),
//! so each value costs one exponential; a row too long to cache folds into the
//! online max and rescaled sum (`s ← s·e^(m−m') + Σe^(x−m')`) in its single
//! read. The norms fold the sum (then, from the cached copy, the centred sum of
//! squares) or the sum of squares. Lanes combine with `shfl.sync.bfly`, warps through
//! shared memory. Pass C reads the cached row (or global memory again, for rows
//! too long to cache) and writes the output once.
//!
//! Every kernel exists per dtype: `f16`/`bf16` rows (and `gamma`, `beta`) are
//! widened to `f32` as they load, four values per 8-byte load, and everything
//! from the cached copy to the statistics stays `f32`; only the output is
//! rounded back.

use super::{elem, math};
use crate::builder::{BuildError, Cmp, Dim, F32, Kernel, KernelBuilder, Label, Reg, Target, U32, U64};
use compute_core::{DType, RowOp};

/// Threads per block of every row kernel.
pub const BLOCK: u32 = 256;
/// Rows per block of the warp-per-row kernels.
pub const WARP_ROWS: u32 = BLOCK / 32;
/// Longest row the warp-per-row kernels take (their shared cache is
/// `WARP_ROWS · cols · 4` bytes: 32 KiB at this length).
pub const WARP_MAX_COLS: usize = 1024;
/// Longest row the block-per-row kernels cache in shared memory (64 KiB);
/// longer rows are read from global memory again in the output pass.
pub const BLOCK_CACHE_MAX_COLS: usize = 16384;
/// Dynamic shared memory the block kernels are allowed (their cache).
pub const BLOCK_CACHE_BYTES: u32 = (BLOCK_CACHE_MAX_COLS * 4) as u32;
/// Row loops unroll by this many units (loads in flight per thread).
const UNROLL: usize = 4;

/// Which row op, parameters dropped (`eps` is a kernel argument).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RowKind {
    /// softmax
    Softmax,
    /// log_softmax
    LogSoftmax,
    /// layer_norm (inputs x, gamma, beta)
    LayerNorm,
    /// rms_norm (inputs x, gamma)
    RmsNorm,
}

/// One thread group per row: a warp, or the whole block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RowShape {
    /// A warp per row, [`WARP_ROWS`] rows per block.
    Warp,
    /// A block of [`BLOCK`] threads per row.
    Block,
}

impl RowKind {
    /// Every row op.
    pub const ALL: [RowKind; 4] = [RowKind::Softmax, RowKind::LogSoftmax, RowKind::LayerNorm, RowKind::RmsNorm];

    /// The kind of `op` and its `eps` (0 for softmax).
    pub fn of(op: RowOp) -> (RowKind, f32) {
        match op {
            RowOp::Softmax => (RowKind::Softmax, 0.0),
            RowOp::LogSoftmax => (RowKind::LogSoftmax, 0.0),
            RowOp::LayerNorm { eps } => (RowKind::LayerNorm, eps),
            RowOp::RmsNorm { eps } => (RowKind::RmsNorm, eps),
        }
    }

    fn stem(self) -> &'static str {
        match self {
            RowKind::Softmax => "softmax",
            RowKind::LogSoftmax => "log_softmax",
            RowKind::LayerNorm => "layer_norm",
            RowKind::RmsNorm => "rms_norm",
        }
    }

    /// Kernel name (`softmax_warp`, `softmax_warp_bf16`).
    pub fn kernel_name(self, shape: RowShape, dtype: DType) -> String {
        let shape = if shape == RowShape::Warp { "warp" } else { "block" };
        format!("{}_{shape}{}", self.stem(), elem::suffix(dtype))
    }

    fn formula(self) -> &'static str {
        match self {
            RowKind::Softmax => {
                "y = exp(x - m) / s; cached rows: m, then s = sum of exp(x - m) kept in the cache (one exp per value); else online m and s (one read)"
            }
            RowKind::LogSoftmax => "y = x - m - ln s; m, s as for softmax",
            RowKind::LayerNorm => "y = (x - mean) * rsqrt(var + eps) * gamma + beta (var from the cached row, centred)",
            RowKind::RmsNorm => "y = x * rsqrt(mean(x^2) + eps) * gamma",
        }
    }
}

/// Where pass B/C read the row from.
#[derive(Clone, Copy)]
enum Source {
    Shared(Reg<U32>),
    Global(Reg<U64>),
}

struct Ctx {
    kind: RowKind,
    dtype: DType,
    shape: RowShape,
    group: u32,
    gl: Reg<U32>,
    cols: Reg<U32>,
    cols4: Reg<U32>,
    colsf: Reg<F32>,
    xr: Reg<U64>,
    yr: Reg<U64>,
    gamma: Option<Reg<U64>>,
    beta: Option<Reg<U64>>,
    eps: Option<Reg<F32>>,
    cache: Reg<U32>,
    /// `None`: always cache (warp kernels); else the kernel's `cached` flag.
    cached: Option<Reg<crate::builder::Pred>>,
    scratch: Option<Reg<U32>>,
    warp: Reg<U32>,
    lane: Reg<U32>,
}

/// Emits the use of one unit's values (unit index, values).
type UnitFn<'a> = dyn FnMut(&mut KernelBuilder, Reg<U32>, &[Reg<F32>]) + 'a;
/// Emits the combination of two threads' statistics.
type CombineFn = dyn Fn(&mut KernelBuilder, &[Reg<F32>], &[Reg<F32>]) -> Vec<Reg<F32>>;

/// Loads one unit (four values or one) at unit index `idx`: from global
/// memory in `dtype`, from the shared cache in `f32`.
fn load_unit(b: &mut KernelBuilder, dtype: DType, vec: bool, src: Source, idx: Reg<U32>) -> Vec<Reg<F32>> {
    let shift = if vec { 4u32 } else { 2u32 };
    match src {
        Source::Global(base) => {
            let n = if vec { 4 } else { 1 };
            let off = b.mul_wide(idx, (n as u32) << elem::shift(dtype));
            let a = b.add(base, off);
            elem::load(b, dtype, a, 0, n)
        }
        Source::Shared(base) => {
            let off = b.shl(idx, shift);
            let a = b.add(base, off);
            if vec { b.ld_shared_v::<F32, 4>(a, 0).to_vec() } else { vec![b.ld_shared::<F32>(a, 0)] }
        }
    }
}

/// Emits `for (k = gl; k < limit; k += group)` over units, [`UNROLL`] units per
/// iteration (all loads first), then the remainder one at a time.
fn for_units(b: &mut KernelBuilder, c: &Ctx, vec: bool, src: Source, body: &mut UnitFn<'_>) {
    let limit = if vec { c.cols4 } else { c.cols };
    let k = b.mov(c.gl);
    let main = b.label("unrolled");
    let rest = b.label("rest");
    let done = b.label("units_done");
    b.place(main);
    let last = b.add(k, c.group * (UNROLL as u32 - 1));
    let past = b.setp(Cmp::Ge, last, limit);
    b.bra_if(past, rest);
    let mut idxs = vec![k];
    for u in 1..UNROLL {
        let i = b.add(k, c.group * u as u32);
        idxs.push(i);
    }
    let vals: Vec<Vec<Reg<F32>>> = idxs.iter().map(|&i| load_unit(b, c.dtype, vec, src, i)).collect();
    for (i, v) in idxs.iter().zip(&vals) {
        body(b, *i, v);
    }
    let next = b.add(k, c.group * UNROLL as u32);
    b.assign(k, next);
    b.bra(main);
    b.place(rest);
    let past = b.setp(Cmp::Ge, k, limit);
    b.bra_if(past, done);
    let v = load_unit(b, c.dtype, vec, src, k);
    body(b, k, &v);
    let next = b.add(k, c.group);
    b.assign(k, next);
    b.bra(rest);
    b.place(done);
}

/// Combines every thread's values across the group; every thread gets the result.
fn group_reduce(b: &mut KernelBuilder, c: &Ctx, vals: Vec<Reg<F32>>, combine: &CombineFn) -> Vec<Reg<F32>> {
    let mut v = vals;
    for mask in [16, 8, 4, 2, 1] {
        let o: Vec<Reg<F32>> = v.iter().map(|&r| b.shfl_bfly(r, mask)).collect();
        v = combine(b, &v, &o);
    }
    if c.shape == RowShape::Warp {
        return v;
    }
    let Some(scratch) = c.scratch else { return v };
    let nv = v.len() as u32;
    let lane0 = b.setp(Cmp::Eq, c.lane, 0u32);
    let woff = b.mul(c.warp, nv * 4);
    let slot = b.add(scratch, woff);
    b.guarded(lane0, false, |b| {
        for (i, &r) in v.iter().enumerate() {
            b.st_shared(slot, i as i64 * 4, r);
        }
    });
    b.bar_sync();
    let mut acc: Vec<Reg<F32>> = (0..nv).map(|i| b.ld_shared::<F32>(scratch, i64::from(i) * 4)).collect();
    for w in 1..WARP_ROWS {
        let o: Vec<Reg<F32>> = (0..nv).map(|i| b.ld_shared::<F32>(scratch, i64::from(w * nv + i) * 4)).collect();
        acc = combine(b, &acc, &o);
    }
    // The scratch is reused by the next reduction: everyone must have read it.
    b.bar_sync();
    acc
}

fn sum_combine(b: &mut KernelBuilder, x: &[Reg<F32>], y: &[Reg<F32>]) -> Vec<Reg<F32>> {
    x.iter().zip(y).map(|(&p, &q)| b.add(p, q)).collect()
}

/// `e^(v − m)`, exactly 1 when `v − m` is 0 (so rescaling by an unchanged max
/// never perturbs the running sum, whatever `ex2.approx(0)` returns). Where
/// `v = m = +∞` the difference is NaN, and so is the result: a row holding
/// `+∞` is NaN, as `x − max` makes it on the CPU (and in PyTorch).
fn exp_or_one(b: &mut KernelBuilder, v: Reg<F32>, m: Reg<F32>) -> Reg<F32> {
    let d = b.sub(v, m);
    let e = math::exp(b, d);
    let same = b.setp(Cmp::Eq, d, 0.0f32);
    b.selp(1.0f32, e, same)
}

/// `(m, s) ⊕ (m', s') = (max, s·e^(m−max) + s'·e^(m'−max))`.
fn softmax_combine(b: &mut KernelBuilder, x: &[Reg<F32>], y: &[Reg<F32>]) -> Vec<Reg<F32>> {
    let m = b.max(x[0], y[0]);
    let e1 = exp_or_one(b, x[0], m);
    let e2 = exp_or_one(b, y[0], m);
    let t = b.mul(y[1], e2);
    let s = b.fma(x[1], e1, t);
    vec![m, s]
}

/// Pass A: read from global memory, cache, fold into the running statistics.
fn pass_a(b: &mut KernelBuilder, c: &Ctx, vec: bool) -> Vec<Reg<F32>> {
    let kind = c.kind;
    let state: Vec<Reg<F32>> = match kind {
        // m starts at −FLT_MAX, not −inf: e^(m−m') stays defined for rows of −inf.
        RowKind::Softmax | RowKind::LogSoftmax => vec![b.mov(f32::MIN), b.mov(0.0f32)],
        RowKind::LayerNorm | RowKind::RmsNorm => vec![b.mov(0.0f32)],
    };
    let cache = c.cache;
    let cached = c.cached;
    let st = state.clone();
    for_units(b, c, vec, Source::Global(c.xr), &mut |b, idx, v| {
        let shift = if vec { 4u32 } else { 2u32 };
        let off = b.shl(idx, shift);
        let a = b.add(cache, off);
        let store = |b: &mut KernelBuilder| {
            if vec {
                b.st_shared_v::<F32, 4>(a, 0, [v[0].into(), v[1].into(), v[2].into(), v[3].into()]);
            } else {
                b.st_shared(a, 0, v[0]);
            }
        };
        match cached {
            Some(p) => b.guarded(p, false, store),
            None => store(b),
        }
        match kind {
            RowKind::Softmax | RowKind::LogSoftmax => {
                let mut mx = v[0];
                for &x in &v[1..] {
                    mx = b.max(mx, x);
                }
                let mn = b.max(st[0], mx);
                let sc = exp_or_one(b, st[0], mn);
                let mut s = b.mul(st[1], sc);
                for &x in v {
                    let e = exp_or_one(b, x, mn);
                    s = b.add(s, e);
                }
                b.assign(st[0], mn);
                b.assign(st[1], s);
            }
            RowKind::LayerNorm => {
                let mut s = st[0];
                for &x in v {
                    s = b.add(s, x);
                }
                b.assign(st[0], s);
            }
            RowKind::RmsNorm => {
                let mut s = st[0];
                for &x in v {
                    s = b.fma(x, x, s);
                }
                b.assign(st[0], s);
            }
        }
    });
    state
}

/// Loads `gamma`/`beta` at unit `idx`.
fn param_unit(b: &mut KernelBuilder, dtype: DType, vec: bool, p: Reg<U64>, idx: Reg<U32>) -> Vec<Reg<F32>> {
    load_unit(b, dtype, vec, Source::Global(p), idx)
}

/// Passes B (layer_norm) and C from `src`, given pass A's reduced statistics.
fn finish_row(b: &mut KernelBuilder, c: &Ctx, vec: bool, src: Source, stats: &[Reg<F32>]) {
    let (yr, dtype) = (c.yr, c.dtype);
    let unit = if vec { 4u32 } else { 1u32 };
    let store = |b: &mut KernelBuilder, idx: Reg<U32>, ys: Vec<Reg<F32>>| {
        let off = b.mul_wide(idx, unit << elem::shift(dtype));
        let a = b.add(yr, off);
        elem::store(b, dtype, a, 0, &ys);
    };
    match c.kind {
        RowKind::Softmax => {
            let (m, r) = (stats[0], b.rcp(stats[1]));
            for_units(b, c, vec, src, &mut |b, idx, v| {
                let ys = v
                    .iter()
                    .map(|&x| {
                        let d = b.sub(x, m);
                        let e = math::exp(b, d);
                        b.mul(e, r)
                    })
                    .collect();
                store(b, idx, ys);
            });
        }
        RowKind::LogSoftmax => {
            let (m, ls) = (stats[0], math::ln_ge1(b, stats[1]));
            for_units(b, c, vec, src, &mut |b, idx, v| {
                let ys = v
                    .iter()
                    .map(|&x| {
                        let d = b.sub(x, m);
                        b.sub(d, ls)
                    })
                    .collect();
                store(b, idx, ys);
            });
        }
        RowKind::LayerNorm => {
            let mean = b.div(stats[0], c.colsf);
            let sq = b.mov(0.0f32);
            for_units(b, c, vec, src, &mut |b, _idx, v| {
                let mut s = sq;
                for &x in v {
                    let d = b.sub(x, mean);
                    s = b.fma(d, d, s);
                }
                b.assign(sq, s);
            });
            let tot = group_reduce(b, c, vec![sq], &sum_combine);
            let var = b.div(tot[0], c.colsf);
            let eps = c.eps.unwrap_or_else(|| b.mov(0.0f32));
            let ve = b.add(var, eps);
            let sd = b.sqrt(ve);
            let rstd = b.rcp(sd);
            let (gamma, beta) = (c.gamma, c.beta);
            for_units(b, c, vec, src, &mut |b, idx, v| {
                let (Some(gp), Some(bp)) = (gamma, beta) else { return };
                let g = param_unit(b, dtype, vec, gp, idx);
                let bt = param_unit(b, dtype, vec, bp, idx);
                let ys = v
                    .iter()
                    .enumerate()
                    .map(|(i, &x)| {
                        let d = b.sub(x, mean);
                        let n = b.mul(d, rstd);
                        b.fma(n, g[i], bt[i])
                    })
                    .collect();
                store(b, idx, ys);
            });
        }
        RowKind::RmsNorm => {
            let ms = b.div(stats[0], c.colsf);
            let eps = c.eps.unwrap_or_else(|| b.mov(0.0f32));
            let ve = b.add(ms, eps);
            let sd = b.sqrt(ve);
            let r = b.rcp(sd);
            let gamma = c.gamma;
            for_units(b, c, vec, src, &mut |b, idx, v| {
                let Some(gp) = gamma else { return };
                let g = param_unit(b, dtype, vec, gp, idx);
                let ys = v
                    .iter()
                    .enumerate()
                    .map(|(i, &x)| {
                        let n = b.mul(x, r);
                        b.mul(n, g[i])
                    })
                    .collect();
                store(b, idx, ys);
            });
        }
    }
}

fn max_combine(b: &mut KernelBuilder, x: &[Reg<F32>], y: &[Reg<F32>]) -> Vec<Reg<F32>> {
    x.iter().zip(y).map(|(&p, &q)| b.max(p, q)).collect()
}

/// Softmax and log_softmax of a row that fits the shared cache, with one
/// exponential per value: pass A copies the row into the cache and takes its
/// max; pass B, from the cache, sums `e^(x−m)` (softmax keeps each `e^(x−m)`
/// in the cache in place of `x`); pass C writes `e·(1/s)`, or `x − m − ln s`.
/// Every thread reads back only the units it wrote, so the passes need no
/// barrier beyond the reductions' own.
fn softmax_cached(b: &mut KernelBuilder, c: &Ctx, vec: bool) {
    let shift = if vec { 4u32 } else { 2u32 };
    let cache = c.cache;
    let store_cache = |b: &mut KernelBuilder, idx: Reg<U32>, v: &[Reg<F32>]| {
        let off = b.shl(idx, shift);
        let a = b.add(cache, off);
        if vec {
            b.st_shared_v::<F32, 4>(a, 0, [v[0].into(), v[1].into(), v[2].into(), v[3].into()]);
        } else {
            b.st_shared(a, 0, v[0]);
        }
    };
    // m starts at −FLT_MAX, not −inf: e^(x−m) stays defined for rows of −inf.
    let m = b.mov(f32::MIN);
    for_units(b, c, vec, Source::Global(c.xr), &mut |b, idx, v| {
        store_cache(b, idx, v);
        let mut mx = m;
        for &x in v {
            mx = b.max(mx, x);
        }
        b.assign(m, mx);
    });
    let m = group_reduce(b, c, vec![m], &max_combine)[0];
    let s = b.mov(0.0f32);
    let keep = c.kind == RowKind::Softmax;
    for_units(b, c, vec, Source::Shared(cache), &mut |b, idx, v| {
        let es: Vec<Reg<F32>> = v.iter().map(|&x| exp_or_one(b, x, m)).collect();
        if keep {
            store_cache(b, idx, &es);
        }
        let mut acc = s;
        for &e in &es {
            acc = b.add(acc, e);
        }
        b.assign(s, acc);
    });
    let s = group_reduce(b, c, vec![s], &sum_combine)[0];
    if keep {
        let (yr, dtype) = (c.yr, c.dtype);
        let unit = if vec { 4u32 } else { 1u32 };
        let r = b.rcp(s);
        for_units(b, c, vec, Source::Shared(cache), &mut |b, idx, v| {
            let ys: Vec<Reg<F32>> = v.iter().map(|&e| b.mul(e, r)).collect();
            let off = b.mul_wide(idx, unit << elem::shift(dtype));
            let a = b.add(yr, off);
            elem::store(b, dtype, a, 0, &ys);
        });
    } else {
        // log_softmax needs no exponential here: the online path's output pass.
        finish_row(b, c, vec, Source::Shared(cache), &[m, s]);
    }
}

/// One whole path (vector or scalar): pass A, reduction, passes B/C.
fn row_path(b: &mut KernelBuilder, c: &Ctx, vec: bool) {
    if matches!(c.kind, RowKind::Softmax | RowKind::LogSoftmax) {
        match c.cached {
            None => softmax_cached(b, c, vec),
            Some(p) => {
                let online: Label = b.label("online");
                b.bra_unless(p, online);
                softmax_cached(b, c, vec);
                b.ret();
                b.place(online);
                let state = pass_a(b, c, vec);
                let stats = group_reduce(b, c, state, &softmax_combine);
                finish_row(b, c, vec, Source::Global(c.xr), &stats);
            }
        }
        b.ret();
        return;
    }
    let state = pass_a(b, c, vec);
    let stats = match c.kind {
        RowKind::Softmax | RowKind::LogSoftmax => group_reduce(b, c, state, &softmax_combine),
        RowKind::LayerNorm | RowKind::RmsNorm => group_reduce(b, c, state, &sum_combine),
    };
    match c.cached {
        None => finish_row(b, c, vec, Source::Shared(c.cache), &stats),
        Some(p) => {
            let uncached: Label = b.label("uncached");
            b.bra_unless(p, uncached);
            finish_row(b, c, vec, Source::Shared(c.cache), &stats);
            b.ret();
            b.place(uncached);
            finish_row(b, c, vec, Source::Global(c.xr), &stats);
        }
    }
    b.ret();
}

/// Builds one row kernel on `dtype` rows (statistics in `f32`).
///
/// Params: `x`, `gamma`, `beta`, `y`, `rows`, `cols` (u32), `eps`, and for
/// block kernels `cached` (non-zero: the row fits the dynamic shared memory).
/// Launch: [`BLOCK`] threads; warp kernels `ceil(rows/8)` blocks with
/// `8·cols·4` bytes of dynamic shared memory, block kernels `rows` blocks with
/// `cols·4` bytes when cached, else none.
pub fn row_kernel(kind: RowKind, shape: RowShape, dtype: DType, target: Target) -> Result<Kernel, BuildError> {
    let name = kind.kernel_name(shape, dtype);
    let mut b = KernelBuilder::new(&name, target);
    b.doc(&format!("{name}: {}", kind.formula()));
    b.doc(&match shape {
        RowShape::Warp => format!(
            "one warp per row (cols <= {WARP_MAX_COLS}), {WARP_ROWS} rows per {BLOCK}-thread block; row cached in dynamic shared memory"
        ),
        RowShape::Block => format!(
            "one {BLOCK}-thread block per row; row cached in dynamic shared memory when `cached` (cols <= {BLOCK_CACHE_MAX_COLS})"
        ),
    });
    b.doc(&if dtype == DType::F32 {
        "float4 loads and stores when cols % 4 == 0; lanes reduce with shfl.sync.bfly, warps through shared memory"
            .to_string()
    } else {
        format!(
            "{dtype} rows: 4 values per 8-byte load and store when cols % 4 == 0, widened to f32 (cache and statistics in f32); lanes reduce with shfl.sync.bfly, warps through shared memory"
        )
    });
    b.max_threads(BLOCK);
    let x = b.param_ptr("x");
    let gamma = matches!(kind, RowKind::LayerNorm | RowKind::RmsNorm).then(|| b.param_ptr("gamma"));
    let beta = (kind == RowKind::LayerNorm).then(|| b.param_ptr("beta"));
    let y = b.param_ptr("y");
    let rows = b.param::<U32>("rows");
    let cols = b.param::<U32>("cols");
    let eps = matches!(kind, RowKind::LayerNorm | RowKind::RmsNorm).then(|| b.param::<F32>("eps"));
    let cached_flag = (shape == RowShape::Block).then(|| b.param::<U32>("cached"));
    let dynamic = b.dynamic_shared("cache", 16);
    let scratch_decl = (shape == RowShape::Block).then(|| b.shared("scratch", WARP_ROWS * 2 * 4, 16));

    let tid = b.tid(Dim::X);
    let lane = b.and(tid, 31u32);
    let warp = b.shr(tid, 5u32);
    let cta = b.ctaid(Dim::X);
    let dyn_base = b.shared_base(&dynamic);
    let (row, gl, group, cache) = match shape {
        RowShape::Warp => {
            let row = b.mad(cta, WARP_ROWS, warp);
            // Whole warps leave together, so the shuffles below see 32 lanes.
            let gone = b.setp(Cmp::Ge, row, rows);
            b.guarded(gone, false, |b| b.ret());
            let per = b.mul(warp, cols);
            let per = b.shl(per, 2u32);
            let cache = b.add(dyn_base, per);
            (row, lane, 32u32, cache)
        }
        RowShape::Block => (cta, tid, BLOCK, dyn_base),
    };
    let cached = cached_flag.map(|f| b.setp(Cmp::Ne, f, 0u32));
    let scratch = scratch_decl.as_ref().map(|s| b.shared_base(s));
    let roff = b.mul_wide(row, cols);
    let roff = b.shl(roff, elem::shift(dtype));
    let xr = b.add(x, roff);
    let yr = b.add(y, roff);
    let cols4 = b.shr(cols, 2u32);
    let colsf = b.cvt::<F32, U32>(cols);
    let low = b.and(cols, 3u32);
    let vec = b.setp(Cmp::Eq, low, 0u32);
    let c = Ctx {
        kind,
        dtype,
        shape,
        group,
        gl,
        cols,
        cols4,
        colsf,
        xr,
        yr,
        gamma,
        beta,
        eps,
        cache,
        cached,
        scratch,
        warp,
        lane,
    };
    let scalar = b.label("scalar_path");
    b.bra_unless(vec, scalar);
    b.blank();
    b.comment("vector path: cols % 4 == 0, units of 4 values");
    row_path(&mut b, &c, true);
    b.blank();
    b.comment("scalar path");
    b.place(scalar);
    row_path(&mut b, &c, false);
    b.finish()
}
