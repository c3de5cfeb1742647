//! [`GemmKernel`]'s kernels, launched with its own block and grid shapes and
//! run by the PTX emulator (`common/emu.rs`) on the CPU, against a plain f64
//! reference. No GPU needed.
//!
//! Tolerance: `|C - ref| ≤ k · f32::EPSILON · Σ_p |A(i,p)·B(p,j)|`, twice the
//! classical bound `γ_k ≈ k·u` (`u` = `EPSILON / 2`) on a `k`-term f32 sum of
//! products, whatever the summation order.

#[path = "common/emu.rs"]
mod emu;

use compute_ptx::GemmKernel;
use compute_ptx::plan::{Arg, Grid};
use emu::{Memory, Program};

/// Deterministic values in [-1, 1).
fn data(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// How `A` and `B` are stored: `trans_a` means `A` is held as `k × m`,
/// `trans_b` that `B` is held as `n × k` (both row-major).
#[derive(Clone, Copy, Debug)]
struct Layout {
    trans_a: bool,
    trans_b: bool,
    batch: u32,
}

const NN: Layout = Layout { trans_a: false, trans_b: false, batch: 1 };

/// Runs `kernel` (its own `m`, `n`, `k`, block, grid and shared memory) on
/// `batch` products and checks every output against the f64 reference.
fn check(kernel: GemmKernel, layout: Layout) {
    let (m, n, k) = (kernel.m(), kernel.n(), kernel.k());
    let (mu, nu, ku, zu) = (m as usize, n as usize, k as usize, layout.batch as usize);
    let a = data(zu * mu * ku, u64::from(m * 1000 + k));
    let b = data(zu * ku * nu, u64::from(n * 1000 + k + 7));
    let built = kernel.build(GemmKernel::DEFAULT_TARGET).unwrap_or_else(|e| panic!("{kernel:?}: {e}"));
    assert_eq!(built.ptx(), kernel.emit_ptx().unwrap());
    let prog = Program::parse(built.ptx());

    let mut mem = Memory::new();
    let pa = mem.alloc(a.len() * 4);
    mem.write_f32(pa, &a);
    let pb = mem.alloc(b.len() * 4);
    mem.write_f32(pb, &b);
    // Exactly C's size: a store outside it fails the emulator's bounds check.
    let pc = mem.alloc(zu * mu * nu * 4);

    // Element strides: A(i, p) = a[i·a_rs + p·a_cs], B(p, j) = b[p·b_rs + j·b_cs].
    let (a_rs, a_cs) = if layout.trans_a { (1, m) } else { (k, 1) };
    let (b_rs, b_cs) = if layout.trans_b { (1, k) } else { (n, 1) };
    let mut args = vec![Arg::Ptr(pa), Arg::Ptr(pb), Arg::Ptr(pc), Arg::U32(m), Arg::U32(n), Arg::U32(k)];
    if kernel.name().starts_with("gemm_simt") {
        assert!(!layout.trans_a && !layout.trans_b, "GemmKernel::simt is the nn kernel");
    } else {
        args.extend([Arg::U32(a_rs), Arg::U32(a_cs), Arg::U32(b_rs), Arg::U32(b_cs)]);
    }
    args.extend([Arg::U64((mu * ku) as u64), Arg::U64((ku * nu) as u64), Arg::U64((mu * nu) as u64)]);
    let types: Vec<_> = args.iter().map(|x| x.ty()).collect();
    assert_eq!(types, built.params(), "{}: argument types", built.name());

    let (gx, gy, gz) = kernel.grid_dim();
    assert_eq!(gz, 1);
    let grid = Grid {
        blocks: (gx, gy, layout.batch),
        threads: kernel.block_dim(),
        dynamic_smem: kernel.dynamic_shared_bytes(),
    };
    emu::run(&prog, &mut mem, grid, &args, (1.0, 0.0, 1.0));
    let c = mem.read_f32(pc, zu * mu * nu);

    for z in 0..zu {
        let at = |i: usize, p: usize| {
            let (ars, acs) = (a_rs as usize, a_cs as usize);
            f64::from(a[z * mu * ku + i * ars + p * acs])
        };
        let bt = |p: usize, j: usize| {
            let (brs, bcs) = (b_rs as usize, b_cs as usize);
            f64::from(b[z * ku * nu + p * brs + j * bcs])
        };
        for i in 0..mu {
            for j in 0..nu {
                let (mut exact, mut magnitude) = (0.0f64, 0.0f64);
                for p in 0..ku {
                    exact += at(i, p) * bt(p, j);
                    magnitude += (at(i, p) * bt(p, j)).abs();
                }
                let got = f64::from(c[z * mu * nu + i * nu + j]);
                let tol = ku as f64 * f64::from(f32::EPSILON) * magnitude;
                assert!(
                    (got - exact).abs() <= tol,
                    "{} {layout:?} m={m} n={n} k={k}: C[{z}][{i}][{j}] = {got}, reference {exact} (tolerance {tol:e})",
                    built.name()
                );
            }
        }
    }
}

/// Every transpose combination, and a batch of two on the grid's `z`.
fn layouts() -> Vec<Layout> {
    let mut v: Vec<Layout> = [(false, false), (true, false), (false, true), (true, true)]
        .into_iter()
        .map(|(trans_a, trans_b)| Layout { trans_a, trans_b, batch: 1 })
        .collect();
    v.push(Layout { batch: 2, ..NN });
    v
}

#[test]
fn tiled_8_matches_the_reference_on_a_ragged_gemm() {
    for layout in layouts() {
        check(GemmKernel::tiled(37, 29, 45, 8), layout);
    }
    // Dimensions below one tile, and exact multiples of it.
    check(GemmKernel::tiled(3, 5, 2, 8), NN);
    check(GemmKernel::tiled(16, 24, 8, 8), NN);
}

#[test]
fn tiled_32_matches_the_reference_on_a_ragged_gemm() {
    for layout in layouts() {
        check(GemmKernel::tiled(37, 29, 45, 32), layout);
    }
    check(GemmKernel::tiled(33, 64, 65, 32), NN);
}

/// The other tiers through the same entry: the launch shapes `GemmKernel`
/// reports are the ones its kernels need.
#[test]
fn naive_tiled_16_and_simt_match_the_reference() {
    check(GemmKernel::naive(37, 29, 45), NN);
    check(GemmKernel::naive(37, 29, 45), Layout { trans_a: true, trans_b: true, batch: 2 });
    check(GemmKernel::tiled(37, 29, 45, 16), NN);
    check(GemmKernel::simt(37, 29, 45), NN);
    check(GemmKernel::simt(130, 136, 20), Layout { batch: 2, ..NN });
}
