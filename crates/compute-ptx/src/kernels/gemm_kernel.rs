//! [`GemmKernel`]: one entry to the three GEMM tiers, in the shape the trueno
//! library's users write (`GemmKernel::tiled(m, n, k, tile).emit_ptx()`).
//!
//! It is a thin description (tier, problem size): building it calls
//! [`gemm_simple::naive`], [`gemm_simple::tiled_sized`] or [`gemm_simt::simt`],
//! and its launch shape is the one the CUDA backend's plans use for that
//! kernel. The PTX does not depend on `m`, `n`, `k` (the kernels take them as
//! parameters at run time); they only size [`GemmKernel::grid_dim`].

use super::gemm_simple::{self, TILE};
use super::gemm_simt::{self, SimtConfig};
use crate::builder::{BuildError, Kernel, Target};

/// Which kernel a [`GemmKernel`] builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Tier {
    Naive,
    /// The tile side, already one of [`gemm_simple::TILE_SIDES`].
    Tiled(u32),
    Simt(SimtConfig),
}

/// A single-precision GEMM kernel, `C = A·B` with `A` `m × k`, `B` `k × n` and
/// `C` `m × n`, in one of three tiers:
///
/// - [`GemmKernel::naive`]: one thread per output, operands read straight from
///   global memory. Simple and slow; for checking the others.
/// - [`GemmKernel::tiled`]: square tiles of `A` and `B` staged in shared
///   memory, one output per thread.
/// - [`GemmKernel::simt`]: the register-blocked, `cp.async`-pipelined kernel
///   the CUDA backend uses for large products (the fast tier).
///
/// Kernel parameters, in order (what a launch passes):
/// - naive and tiled: `a`, `b`, `c` (device addresses), `m`, `n`, `k`, `a_rs`,
///   `a_cs`, `b_rs`, `b_cs` (u32 element strides: `A(i,p) = a[i·a_rs + p·a_cs]`,
///   `B(p,j) = b[p·b_rs + j·b_cs]`, so row-major `A` is `(k, 1)`, row-major `B`
///   is `(n, 1)`), `sa`, `sb`, `sc` (u64 batch strides in elements; 0 for one
///   product).
/// - simt: `a`, `b`, `c`, `m`, `n`, `k`, `sa`, `sb`, `sc`; `A` and `B`
///   row-major.
///
/// The PTX does not depend on `m`, `n`, `k`: the kernels read them from their
/// parameters at run time (any sizes, ragged edges included), and the values
/// given here only size [`GemmKernel::grid_dim`]. One built kernel serves
/// every size.
///
/// `C` is always row-major. Launch with [`GemmKernel::block_dim`],
/// [`GemmKernel::grid_dim`] (a batch runs on the grid's `z`) and
/// [`GemmKernel::dynamic_shared_bytes`].
///
/// Constructing one is free (no allocation, no PTX); [`GemmKernel::build`] and
/// [`GemmKernel::emit_ptx`] generate the PTX each time they are called.
///
/// ```
/// use compute_ptx::kernels::GemmKernel;
/// let kernel = GemmKernel::tiled(1024, 1024, 1024, 32);
/// let ptx = kernel.emit_ptx()?;
/// assert!(ptx.contains(".visible .entry gemm_tiled_32("));
/// assert_eq!(kernel.block_dim(), (32, 32, 1)); // 1024 threads
/// assert_eq!(kernel.grid_dim(), (32, 32, 1)); // ceil(n/32), ceil(m/32)
/// // Sides other than 8, 16, 32 round down.
/// assert_eq!(GemmKernel::tiled(1024, 1024, 1024, 20).tile(), 16);
/// # Ok::<(), compute_ptx::BuildError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemmKernel {
    m: u32,
    n: u32,
    k: u32,
    tier: Tier,
}

impl GemmKernel {
    /// The target [`GemmKernel::emit_ptx`] emits for: `sm_80`, the lowest the
    /// kernels support; the driver JIT-compiles it for Ampere and every later
    /// GPU (Hopper included). Use [`GemmKernel::build`] for another target.
    pub const DEFAULT_TARGET: Target = Target::Sm80;

    /// The naive tier for an `m × k` by `k × n` product: 16×16 threads per
    /// block, one output each, entry `gemm_naive`. Free (stores four words).
    pub fn naive(m: u32, n: u32, k: u32) -> GemmKernel {
        GemmKernel { m, n, k, tier: Tier::Naive }
    }

    /// The shared-memory tiled tier with `tile × tile` tiles and thread blocks.
    /// Supported sides are 8, 16 and 32 (a block has `tile²` ≤ 1024 threads);
    /// any other value is rounded down to the nearest supported side, and
    /// values below 8 become 8 — [`GemmKernel::tile`] returns the side used.
    /// The entry is `gemm_tiled` for 16 (the kernel the CUDA backend launches
    /// and `ptx/` holds) and `gemm_tiled_<tile>` otherwise. Free (stores four
    /// words); never fails.
    pub fn tiled(m: u32, n: u32, k: u32, tile: u32) -> GemmKernel {
        GemmKernel { m, n, k, tier: Tier::Tiled(gemm_simple::tile_side(tile)) }
    }

    /// The register-blocked tier the CUDA backend uses for large products:
    /// [`SimtConfig::default`] (128×128 block tiles, 256 threads of 8×8
    /// outputs, two `cp.async` stages), no transposes, entry `gemm_simt_nn`.
    /// Free (stores the configuration).
    pub fn simt(m: u32, n: u32, k: u32) -> GemmKernel {
        GemmKernel { m, n, k, tier: Tier::Simt(SimtConfig::default()) }
    }

    /// Rows of `A` and `C`. Free.
    pub fn m(&self) -> u32 {
        self.m
    }

    /// Columns of `B` and `C`. Free.
    pub fn n(&self) -> u32 {
        self.n
    }

    /// Columns of `A`, rows of `B` (the reduction length). Free.
    pub fn k(&self) -> u32 {
        self.k
    }

    /// The side of the square block of `C` one thread block computes: the
    /// shared-memory tile side for `tiled` (after rounding: 8, 16 or 32), 16
    /// for `naive` (its thread block; no shared memory), 128 for `simt` (its
    /// block tile). Free.
    pub fn tile(&self) -> u32 {
        match self.tier {
            Tier::Naive => TILE,
            Tier::Tiled(side) => side,
            Tier::Simt(cfg) => cfg.bm,
        }
    }

    /// The kernel's entry-point name (`gemm_naive`, `gemm_tiled`,
    /// `gemm_tiled_32`, `gemm_simt_nn`, …), as the driver looks it up. One
    /// small allocation; no PTX is generated.
    pub fn name(&self) -> String {
        match self.tier {
            Tier::Naive => "gemm_naive".into(),
            Tier::Tiled(side) => gemm_simple::tiled_name(side),
            Tier::Simt(cfg) => cfg.kernel_name(false, false),
        }
    }

    /// Generates the kernel for `target`. Pure Rust, no GPU: well under a
    /// millisecond for naive and tiled, a few milliseconds for simt. The
    /// result does not depend on `m`, `n`, `k`.
    pub fn build(&self, target: Target) -> Result<Kernel, BuildError> {
        match self.tier {
            Tier::Naive => gemm_simple::naive(target),
            Tier::Tiled(side) => gemm_simple::tiled_sized(side, target),
            Tier::Simt(cfg) => gemm_simt::simt(&cfg, false, false, target),
        }
    }

    /// The PTX module text for [`GemmKernel::DEFAULT_TARGET`]: one `.entry`
    /// named [`GemmKernel::name`]. Costs what [`GemmKernel::build`] costs.
    pub fn emit_ptx(&self) -> Result<String, BuildError> {
        self.build(Self::DEFAULT_TARGET).map(Kernel::into_ptx)
    }

    /// Threads per block `(x, y, z)`: `(16, 16, 1)` for naive, `(tile, tile,
    /// 1)` for tiled, `(256, 1, 1)` for simt. Free.
    pub fn block_dim(&self) -> (u32, u32, u32) {
        match self.tier {
            Tier::Naive => (TILE, TILE, 1),
            Tier::Tiled(side) => (side, side, 1),
            Tier::Simt(cfg) => (cfg.threads(), 1, 1),
        }
    }

    /// Blocks `(x, y, z)` covering this `m × n` output: `(ceil(n / tile),
    /// ceil(m / tile), 1)` with [`GemmKernel::tile`] (simt: its 128×128 block
    /// tile). For a batch, set `z` to the number of products. A zero `m` or
    /// `n` gives an empty grid (launch nothing). A GPU allows at most 65 535
    /// blocks in `y`: above `65 535 · tile` rows, launch row ranges separately
    /// (offset `a` and `c`, pass the range's `m`), as the CUDA backend does.
    /// Free.
    pub fn grid_dim(&self) -> (u32, u32, u32) {
        let (bm, bn) = match self.tier {
            Tier::Simt(cfg) => (cfg.bm, cfg.bn),
            _ => (self.tile(), self.tile()),
        };
        (self.n.div_ceil(bn), self.m.div_ceil(bm), 1)
    }

    /// Bytes of dynamic shared memory to launch with: 0 for every tier as
    /// built here (their shared memory is static: `2·tile·(tile+1)·4` bytes for
    /// tiled, [`SimtConfig::shared_bytes`] (33 KiB) for simt, none for naive).
    /// Free.
    pub fn dynamic_shared_bytes(&self) -> u32 {
        match self.tier {
            Tier::Simt(cfg) => cfg.dynamic_shared_bytes(),
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::KernelId;

    fn all() -> Vec<GemmKernel> {
        vec![
            GemmKernel::naive(37, 29, 45),
            GemmKernel::tiled(37, 29, 45, 8),
            GemmKernel::tiled(37, 29, 45, 16),
            GemmKernel::tiled(37, 29, 45, 32),
            GemmKernel::simt(37, 29, 45),
        ]
    }

    #[test]
    fn every_tier_emits_one_entry_named_as_reported() {
        for kernel in all() {
            let ptx = kernel.emit_ptx().unwrap_or_else(|e| panic!("{kernel:?}: {e}"));
            let entry = format!(".visible .entry {}(", kernel.name());
            assert_eq!(ptx.matches(".visible .entry ").count(), 1, "{kernel:?}");
            assert!(ptx.contains(&entry), "{kernel:?}: no `{entry}`");
            assert!(ptx.contains(".target sm_80"), "{kernel:?}: not the default target");
            for target in Target::ALL {
                let built = kernel.build(target).unwrap();
                assert_eq!(built.name(), kernel.name());
                assert_eq!(built.target(), target);
            }
        }
    }

    #[test]
    fn tiled_16_is_the_checked_in_tiled_kernel() {
        for target in Target::ALL {
            let ours = GemmKernel::tiled(1024, 1024, 1024, 16).build(target).unwrap();
            let catalog = KernelId::GemmTiled.build(target).unwrap();
            assert_eq!(ours, catalog, "{target}");
        }
        assert_eq!(
            GemmKernel::naive(8, 8, 8).build(Target::Sm90).unwrap(),
            KernelId::GemmNaive.build(Target::Sm90).unwrap()
        );
        assert_eq!(
            GemmKernel::simt(8, 8, 8).build(Target::Sm90).unwrap(),
            KernelId::GemmSimt(SimtConfig::default(), false, false).build(Target::Sm90).unwrap()
        );
    }

    #[test]
    fn tile_sides_round_down_and_never_fail() {
        for (asked, used) in
            [(0, 8), (1, 8), (7, 8), (8, 8), (15, 8), (16, 16), (31, 16), (32, 32), (33, 32), (u32::MAX, 32)]
        {
            let kernel = GemmKernel::tiled(100, 100, 100, asked);
            assert_eq!(kernel.tile(), used, "tile {asked}");
            assert_eq!(kernel.block_dim(), (used, used, 1));
            kernel.emit_ptx().unwrap();
        }
    }

    #[test]
    fn launch_shapes_cover_the_output() {
        let k = GemmKernel::tiled(1024, 1024, 1024, 32);
        assert_eq!((k.m(), k.n(), k.k(), k.tile()), (1024, 1024, 1024, 32));
        assert_eq!(k.grid_dim(), (32, 32, 1));
        assert_eq!(GemmKernel::tiled(37, 29, 45, 8).grid_dim(), (4, 5, 1));
        assert_eq!(GemmKernel::naive(37, 29, 45).grid_dim(), (2, 3, 1));
        assert_eq!(GemmKernel::naive(37, 29, 45).block_dim(), (16, 16, 1));
        let s = GemmKernel::simt(300, 129, 7);
        assert_eq!((s.block_dim(), s.grid_dim(), s.tile()), ((256, 1, 1), (2, 3, 1), 128));
        assert_eq!(GemmKernel::tiled(0, 5, 5, 16).grid_dim(), (1, 0, 1));
        for kernel in all() {
            assert_eq!(kernel.dynamic_shared_bytes(), 0, "{kernel:?}");
        }
    }

    #[test]
    fn tile_32_declares_its_shape() {
        let ptx = GemmKernel::tiled(64, 64, 64, 32).emit_ptx().unwrap();
        assert!(ptx.contains(".maxntid 1024, 1, 1"), "{ptx}");
        // Two 32×33-float tiles.
        assert!(ptx.contains("a_tile[4224]") && ptx.contains("b_tile[4224]"), "{ptx}");
        assert_eq!(ptx.matches("fma.rn.f32").count(), 32);
        assert_eq!(ptx.matches("bar.sync").count(), 2);
    }
}
