//! Whole-array reductions: sum, max (NaN-propagating) and dot.
//!
//! Two launches of the same kernels: the first with a grid of a few blocks per
//! multiprocessor writes one partial per block; the second, one block, reduces
//! the partials (`reduce_sum` also finishes `dot`). Each thread keeps four
//! accumulators (one per `float4` lane) over a grid-stride loop with four
//! 16-byte loads in flight (a `float4`, or 8 halves for `f16`/`bf16` input,
//! which accumulate in `f32`), then the block combines them with a warp
//! butterfly (`shfl.sync.bfly`) and one shared-memory step. Partials and the
//! result are `f32`. Deterministic: no atomics.

use super::elem;
use crate::builder::{BuildError, Cmp, Dim, F32, Kernel, KernelBuilder, Reg, Target, U32, U64};
use compute_core::DType;

/// Threads per block.
pub const BLOCK: u32 = 256;
const WARPS: u32 = BLOCK / 32;
const UNROLL: u64 = 4;

/// Which reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceKind {
    /// `Σ x`.
    Sum,
    /// `max x`, NaN if any element is NaN.
    Max,
    /// `Σ a·b` (first stage; finish with [`ReduceKind::Sum`]).
    Dot,
}

impl ReduceKind {
    /// Kernel name for input `dtype` (`reduce_sum`, `reduce_sum_bf16`).
    pub fn kernel_name(self, dtype: DType) -> String {
        let stem = match self {
            ReduceKind::Sum => "reduce_sum",
            ReduceKind::Max => "reduce_max",
            ReduceKind::Dot => "reduce_dot",
        };
        format!("{stem}{}", elem::suffix(dtype))
    }
}

fn identity(kind: ReduceKind) -> f32 {
    match kind {
        ReduceKind::Max => f32::NEG_INFINITY,
        ReduceKind::Sum | ReduceKind::Dot => 0.0,
    }
}

fn combine(b: &mut KernelBuilder, kind: ReduceKind, acc: Reg<F32>, v: Reg<F32>) -> Reg<F32> {
    match kind {
        ReduceKind::Max => b.max_nan(acc, v),
        ReduceKind::Sum | ReduceKind::Dot => b.add(acc, v),
    }
}

/// Folds one element (or one pair, for dot) into `acc`, in place.
fn fold(b: &mut KernelBuilder, kind: ReduceKind, acc: Reg<F32>, x: Reg<F32>, y: Option<Reg<F32>>) {
    let r = match (kind, y) {
        (ReduceKind::Dot, Some(y)) => b.fma(x, y, acc),
        _ => combine(b, kind, acc, x),
    };
    b.assign(acc, r);
}

/// Builds one reduction kernel over `dtype` input. Params: `x` (and `y` for
/// dot), `out` (one `f32` per block), `n` (elements, u64). Launch: [`BLOCK`]
/// threads, any grid.
pub fn reduce(kind: ReduceKind, dtype: DType, target: Target) -> Result<Kernel, BuildError> {
    let name = kind.kernel_name(dtype);
    let mut b = KernelBuilder::new(&name, target);
    b.doc(&format!(
        "{name}: out[blockIdx.x] = {} over this block's grid-stride share of the {dtype} input, in f32",
        match kind {
            ReduceKind::Sum => "sum of x",
            ReduceKind::Max => "max of x (max.NaN: NaN propagates)",
            ReduceKind::Dot => "sum of a*b",
        }
    ));
    b.doc(&format!("launch: {BLOCK} threads per block; a second launch with one block reduces the partials"));
    b.max_threads(BLOCK);
    let dot = kind == ReduceKind::Dot;
    let x = b.param_ptr(if dot { "a" } else { "x" });
    let y = if dot { Some(b.param_ptr("b")) } else { None };
    let out = b.param_ptr("out");
    let n = b.param::<U64>("n");
    let scratch = b.shared("partials", WARPS * 4, 4);

    let tid = b.tid(Dim::X);
    let gid = b.global_index_x();
    let ntid = b.ntid(Dim::X);
    let nct = b.nctaid(Dim::X);
    let threads = b.mul(ntid, nct);
    let stride = b.cvt::<U64, U32>(threads);
    let i = b.cvt::<U64, U32>(gid);
    // A unit: a float4, or 8 halves (16 bytes either way).
    let w: u64 = if dtype == DType::F32 { 4 } else { 8 };
    let ushift = w.trailing_zeros() + elem::shift(dtype);
    let units = b.shr(n, w.trailing_zeros());
    let step = b.shl(stride, ushift);
    let acc: Vec<Reg<F32>> = (0..4).map(|_| b.mov(identity(kind))).collect();

    let main = b.label("main");
    let one = b.label("one_at_a_time");
    let tail = b.label("scalar_tail");
    let block = b.label("block_reduce");

    b.comment(&format!("main loop: {UNROLL} units of {w} per thread per iteration, four accumulators"));
    b.place(main);
    let last = b.mad(stride, UNROLL - 1, i);
    let past = b.setp(Cmp::Ge, last, units);
    b.bra_if(past, one);
    let off = b.shl(i, ushift);
    let load_all = |b: &mut KernelBuilder, p: Reg<U64>| {
        let mut a = b.add(p, off);
        let mut v = Vec::new();
        for u in 0..UNROLL {
            if u > 0 {
                a = b.add(a, step);
            }
            v.push(elem::load(b, dtype, a, 0, w as usize));
        }
        v
    };
    let xs = load_all(&mut b, x);
    let ys = y.map(|p| load_all(&mut b, p));
    for u in 0..UNROLL as usize {
        for c in 0..w as usize {
            fold(&mut b, kind, acc[c % 4], xs[u][c], ys.as_ref().map(|v| v[u][c]));
        }
    }
    let next = b.mad(stride, UNROLL, i);
    b.assign(i, next);
    b.bra(main);

    b.place(one);
    let past = b.setp(Cmp::Ge, i, units);
    b.bra_if(past, tail);
    let off = b.shl(i, ushift);
    let xa = b.add(x, off);
    let xv = elem::load(&mut b, dtype, xa, 0, w as usize);
    let yv = match y {
        Some(p) => {
            let ya = b.add(p, off);
            Some(elem::load(&mut b, dtype, ya, 0, w as usize))
        }
        None => None,
    };
    for c in 0..w as usize {
        fold(&mut b, kind, acc[c % 4], xv[c], yv.as_ref().map(|v| v[c]));
    }
    let next = b.add(i, stride);
    b.assign(i, next);
    b.bra(one);

    b.comment(&format!("the last n mod {w} elements go to the first threads of the grid"));
    b.place(tail);
    let gid64 = b.cvt::<U64, U32>(gid);
    let base = b.shl(units, w.trailing_zeros());
    let j = b.add(base, gid64);
    let out_of_range = b.setp(Cmp::Ge, j, n);
    b.bra_if(out_of_range, block);
    let off = b.shl(j, elem::shift(dtype));
    let xa = b.add(x, off);
    let xv = elem::load(&mut b, dtype, xa, 0, 1)[0];
    let yv = match y {
        Some(p) => {
            let ya = b.add(p, off);
            Some(elem::load(&mut b, dtype, ya, 0, 1)[0])
        }
        None => None,
    };
    fold(&mut b, kind, acc[0], xv, yv);

    b.place(block);
    b.blank();
    b.comment("block reduction: lanes, then warps through shared memory");
    let fin = if kind == ReduceKind::Dot { ReduceKind::Sum } else { kind };
    let a01 = combine(&mut b, fin, acc[0], acc[1]);
    let a23 = combine(&mut b, fin, acc[2], acc[3]);
    let mut v = combine(&mut b, fin, a01, a23);
    for mask in [16, 8, 4, 2, 1] {
        let o = b.shfl_bfly(v, mask);
        v = combine(&mut b, fin, v, o);
    }
    let lane = b.and(tid, 31u32);
    let warp = b.shr(tid, 5u32);
    let sbase = b.shared_base(&scratch);
    let woff = b.shl(warp, 2u32);
    let slot = b.add(sbase, woff);
    let lane0 = b.setp(Cmp::Eq, lane, 0u32);
    b.guarded(lane0, false, |b| b.st_shared(slot, 0, v));
    b.bar_sync();
    let skip = b.label("exit");
    let not0 = b.setp(Cmp::Ne, tid, 0u32);
    b.bra_if(not0, skip);
    let mut r = b.ld_shared::<F32>(sbase, 0);
    for w in 1..WARPS {
        let o = b.ld_shared::<F32>(sbase, i64::from(w) * 4);
        r = combine(&mut b, fin, r, o);
    }
    let cta = b.ctaid(Dim::X);
    let coff = b.mul_wide(cta, 4u32);
    let oa = b.add(out, coff);
    b.st_global(oa, 0, r);
    b.place(skip);
    b.ret();
    b.finish()
}
