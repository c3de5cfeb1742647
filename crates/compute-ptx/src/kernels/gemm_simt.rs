//! The register-blocked SIMT GEMM: the fast fp32 tier (no tensor cores).
//!
//! Each block computes a `BM × BN` tile of `C`; each thread a `TM × TN` block
//! of it, as `TM/4 × TN/4` sub-blocks of 4×4 spread `4·TY` rows and `4·TX`
//! columns apart, with each warp's threads laid out as a 4×8 tile, so a warp's
//! shared-memory fragment reads touch 4 and 8 distinct `float4`s (broadcasts,
//! no bank conflicts). `A` and `B` tiles of depth `BK` live in `stages`
//! shared-memory stages, stored `k`-major (`As[k][m]`, `Bs[k][n]`, rows padded
//! by 4 floats so the transposing stores of a `k`-contiguous operand do not
//! conflict).
//!
//! The default (128×128 block tile, `BK` = 16, 256 threads of 8×8, two
//! stages) copies every operand with `cp.async`: the one whose rows already
//! run along m/n (`A` transposed, `B` not) in 16-byte copies, the
//! `k`-contiguous one (`A` not transposed, `B` transposed) in 4-byte copies
//! that transpose it on the fly (a warp reads 8 consecutive `k` of 4 rows,
//! whole 32-byte sectors, and stores them to 32 distinct banks), so no
//! staging registers and no store phase. The next tile is issued at the top
//! of each tile's loop; `cp.async.wait_group` and the one barrier per tile
//! sit before the tile's last k-step, where the next tile's first fragments
//! are loaded, hiding their latency behind that k-step's `fma`s
//! (`early_barrier`). More stages (dynamic shared memory above 48 KiB), the
//! older register-staged loop (`ld.global.nc.v4` before the fmas, transposed
//! stores after them) and other thread tiles stay buildable for the sweep
//! ([`sweep_configs`]).
//!
//! Edges (any `m`, `k`, `n`) fall back to predicated scalar loads (or 4-byte
//! `cp.async` with zero fill), and to scalar stores; a `float4` path needs the
//! contiguous dimension to be a multiple of 4. Blocks are visited in groups of
//! `group_m` tile-rows for L2 reuse. The transposes are compile-time variants:
//! `nn`, `nt`, `tn`, `tt` (`t`: that operand is stored transposed).

use super::gemm_common::{GemmParams, gemm_params};
use crate::builder::{BuildError, Cmp, Dim, F32, Kernel, KernelBuilder, Pred, Reg, Src, Target, U32, U64};

/// The most shared memory a kernel may declare statically.
const MAX_STATIC_SHARED: u32 = 48 * 1024;
/// The most shared memory a block may have on sm_80 (sm_90: 227 KiB).
const MAX_SHARED: u32 = 163 * 1024;

/// Shape of the register-blocked kernel. [`SimtConfig::default`] is the
/// checked-in one (the fastest measured on an H200, see `docs/ptx.md`: 128×128
/// tiles, k-tile 16, 256 threads of 8×8, two `cp.async` stages, early
/// barrier); other shapes are for tuning and tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SimtConfig {
    /// Rows of `C` per block.
    pub bm: u32,
    /// Columns of `C` per block.
    pub bn: u32,
    /// Depth of a shared-memory tile.
    pub bk: u32,
    /// Rows per thread (multiple of 4).
    pub tm: u32,
    /// Columns per thread (multiple of 4).
    pub tn: u32,
    /// Tile-rows per group in the block order (0: plain row-major order).
    pub group_m: u32,
    /// Blocks per multiprocessor `ptxas` must fit (`.minnctapersm`; 0: no hint).
    pub min_blocks: u32,
    /// Copy the operand tiles that need no transposition (`A` stored transposed,
    /// `B` not) straight into shared memory with `cp.async` (sm_80+), skipping
    /// registers; the others go through registers unless `async_transpose`.
    pub async_copy: bool,
    /// Lay each warp's threads out as 4×8 thread tiles (else 2×16): a warp's
    /// shared-memory fragment reads then touch 4 and 8 distinct `float4`s, one
    /// wavefront each.
    pub warp_tiled: bool,
    /// Shared-memory stages of the k-tile pipeline (2..=4). Above 2, every
    /// operand must be copied with `cp.async` (`async_copy` and
    /// `async_transpose`).
    pub stages: u32,
    /// Copy the `k`-contiguous operand (`A` not transposed, `B` transposed) with
    /// 4-byte `cp.async`s that transpose it on the fly into the `k`-major
    /// layout (a warp reads 8 consecutive `k` of 4 rows: whole 32-byte
    /// sectors, conflict-free stores), instead of staging it through registers.
    /// Needs `async_copy` and `bk` a multiple of 8.
    pub async_transpose: bool,
    /// In the `cp.async` pipeline, wait and pass the barrier before a tile's
    /// last k-step instead of before its first, and load the next tile's first
    /// fragments there, so their shared-memory latency hides behind that
    /// k-step's fmas (CUTLASS's multistage order). With 2 stages the next tile
    /// then has `BK-1` k-steps to land instead of `BK`.
    pub early_barrier: bool,
    /// Split `k` over the grid's `z` dimension (one matrix, no batch): block
    /// `z` multiplies the `k`-slice `[z·kc, min(k, (z+1)·kc))` (`kc` an extra
    /// parameter, a multiple of 4) and writes its partial product to matrix
    /// `z` of `C` (`sc` apart), which a combine kernel then adds. For thin
    /// products whose column tiles alone leave most multiprocessors idle.
    pub split_k: bool,
}

impl Default for SimtConfig {
    fn default() -> Self {
        SimtConfig {
            bm: 128,
            bn: 128,
            bk: 16,
            tm: 8,
            tn: 8,
            group_m: 8,
            min_blocks: 2,
            async_copy: true,
            warp_tiled: true,
            stages: 2,
            async_transpose: true,
            early_barrier: true,
            split_k: false,
        }
    }
}

impl SimtConfig {
    /// The previous default: two stages, the `k`-contiguous operand staged
    /// through registers (`ld.global.nc.v4`) and transposed on store, the other
    /// copied with 16-byte `cp.async`; 256 threads of 8×8.
    pub fn register_staged() -> SimtConfig {
        SimtConfig {
            bm: 128,
            bn: 128,
            bk: 8,
            tm: 8,
            tn: 8,
            group_m: 8,
            min_blocks: 2,
            async_copy: true,
            warp_tiled: true,
            stages: 2,
            async_transpose: false,
            early_barrier: false,
            split_k: false,
        }
    }

    /// The shape for thin products (up to [`SimtConfig::THIN_MAX_ROWS`] rows,
    /// e.g. a few dozen stacked requests against one weight): 32×64 block
    /// tiles of 128 threads (4×4 each), so that a product of 64 rows by 4096
    /// columns still spreads over 128 blocks where the default 128×128 tile
    /// gives 32, and k-tiles of 32 in three `cp.async` stages, so that each
    /// block keeps two tiles of `B` in flight.
    pub fn thin() -> SimtConfig {
        SimtConfig {
            bm: 32,
            bn: 64,
            bk: 32,
            tm: 4,
            tn: 4,
            group_m: 0,
            min_blocks: 0,
            async_copy: true,
            warp_tiled: true,
            stages: 3,
            async_transpose: true,
            early_barrier: true,
            split_k: false,
        }
    }

    /// Most rows of a product that [`SimtConfig::thin`] takes.
    pub const THIN_MAX_ROWS: usize = 128;

    /// The shape for 33 to 64 rows against a weight of at least
    /// [`SimtConfig::WIDE_COLUMNS`] columns: 32×128 block tiles of 128
    /// threads (4×8 each) in four `cp.async` stages, half the `A`-tile reads
    /// per column of [`SimtConfig::thin`]. On an H200 and an H100
    /// (2026-11-27, `thin_gemm`; `docs/ptx.md`) 48 and 64 rows by 14336
    /// columns took 267–273 µs against `thin`'s 342–348 µs; at 8192 columns
    /// the two tie (227–239 µs), and at 4096 its 64 blocks leave half the
    /// device idle (169 against 96 µs on the H200).
    pub fn thin_wide() -> SimtConfig {
        SimtConfig { bn: 128, tn: 8, stages: 4, ..SimtConfig::thin() }
    }

    /// The shape for 33 to 64 rows with `k` split over the grid
    /// ([`SimtConfig::split_k`], the plans' `GemmTier::SimtSplit`): 64×128
    /// block tiles of 128 threads (8×8 each), k-tiles of 16 in three stages.
    /// A block computes every row once, and the splits fill the device where
    /// the column tiles alone do not. On an H200 (2026-11-28, `thin_gemm
    /// --splits`; `docs/ptx.md`) 64 rows by 4096 took 76 µs (8 splits)
    /// against `thin`'s 131, by 8192 108 µs (6) against 297, by 14336 206 µs
    /// (3) against `thin_wide`'s 270.
    pub fn thin_split() -> SimtConfig {
        SimtConfig { bm: 64, bn: 128, bk: 16, tm: 8, tn: 8, ..SimtConfig::thin() }
    }

    /// The shape in which a product of `m` rows (9 to
    /// [`SimtConfig::THIN_MAX_ROWS`]) splits `k` over the grid, and the
    /// blocks per multiprocessor its automatic split count aims for: up to
    /// 16 rows 16×64 tiles (4×4 a thread, k-tiles of 16, four stages), up to
    /// 32 rows 32×64 (4×8, k-tiles of 32, three stages), up to 64 rows
    /// [`SimtConfig::thin_split`] (three blocks), beyond 32×128 (4×8, k-tiles
    /// of 32, two stages); eight blocks but for [`SimtConfig::thin_split`].
    /// Picked from a sweep of every shape and split count on an H200
    /// (2026-11-28, `thin_gemm --splits`, `k` = 4096, 4096 and 14336
    /// columns); there the plans' split then took 1.1–2.5× less time than
    /// the unsplit `thin` for 16 to 128 rows by 4096 to 14336 columns
    /// (`docs/ptx.md`).
    pub fn split_shape(m: usize) -> (SimtConfig, u32) {
        let thin = SimtConfig::thin();
        match m {
            ..=16 => (SimtConfig { bm: 16, bn: 64, bk: 16, tm: 4, tn: 4, stages: 4, ..thin }, 8),
            17..=32 => (SimtConfig { bm: 32, bn: 64, bk: 32, tm: 4, tn: 8, stages: 3, ..thin }, 8),
            33..=64 => (SimtConfig::thin_split(), 3),
            _ => (SimtConfig { bm: 32, bn: 128, bk: 32, tm: 4, tn: 8, stages: 2, ..thin }, 8),
        }
    }

    /// Fewest values of `k` a slice of a split product gets (16 k-tiles of
    /// [`SimtConfig::thin_split`]): products with less than twice this `k`
    /// are not split.
    pub const SPLIT_MIN_K: usize = 256;

    /// The shape for `m` rows (9 to [`SimtConfig::THIN_MAX_ROWS`]) by `n`
    /// columns not split: [`SimtConfig::thin_wide`] for 33 to 64 rows
    /// against [`SimtConfig::WIDE_COLUMNS`] columns or more, else
    /// [`SimtConfig::thin`].
    pub fn thin_for(m: usize, n: usize) -> SimtConfig {
        if (33..=64).contains(&m) && n >= SimtConfig::WIDE_COLUMNS {
            SimtConfig::thin_wide()
        } else {
            SimtConfig::thin()
        }
    }

    /// Fewest columns for which products of 33 to 64 rows take
    /// [`SimtConfig::thin_wide`]: between the widths measured (8192, a tie;
    /// 14336, a fifth faster).
    pub const WIDE_COLUMNS: usize = 12288;

    /// Threads per block: `(BM/TM)·(BN/TN)`.
    pub fn threads(&self) -> u32 {
        (self.bm / self.tm.max(1)) * (self.bn / self.tn.max(1))
    }

    /// Shared memory per block in bytes (`stages` stages of both tiles).
    pub fn shared_bytes(&self) -> u32 {
        self.stages * self.bk * ((self.bm + 4) + (self.bn + 4)) * 4
    }

    /// Bytes of dynamic shared memory to launch with: the stages when they
    /// exceed the 48 KiB a kernel may declare statically (the kernel then
    /// declares them `.extern` and its loader raises the limit), else 0.
    pub fn dynamic_shared_bytes(&self) -> u32 {
        if self.shared_bytes() > MAX_STATIC_SHARED { self.shared_bytes() } else { 0 }
    }

    /// Every operand goes through `cp.async` for every transpose, so the
    /// `stages`-deep pipeline is used (else the two-stage loop with the
    /// `k`-contiguous operand staged through registers).
    pub fn all_async(&self) -> bool {
        self.async_copy && self.async_transpose
    }

    /// Why this shape cannot be built, if it cannot.
    pub fn check(&self) -> Result<(), String> {
        let SimtConfig { bm, bn, bk, tm, tn, .. } = *self;
        if tm == 0 || tn == 0 || tm % 4 != 0 || tn % 4 != 0 {
            return Err(format!("thread tile {tm}x{tn}: both must be non-zero multiples of 4"));
        }
        if bm % tm != 0 || bn % tn != 0 || bk == 0 || bk % 4 != 0 {
            return Err(format!(
                "block tile {bm}x{bn}x{bk} does not divide into {tm}x{tn} thread tiles and k-steps of 4"
            ));
        }
        let t = self.threads();
        if !(32..=1024).contains(&t) || !t.is_multiple_of(32) {
            return Err(format!("{t} threads per block: need a multiple of 32 in 32..=1024"));
        }
        if !(bk / 4).is_power_of_two() || !(bm / 4).is_power_of_two() || !(bn / 4).is_power_of_two() {
            return Err(format!("bk/4, bm/4 and bn/4 must be powers of two (got {bk}, {bm}, {bn})"));
        }
        if !t.is_multiple_of(bm / 4) || !t.is_multiple_of(bn / 4) || !t.is_multiple_of(bk / 4) {
            return Err(format!("{t} threads do not cover whole rows of the {bm}x{bk} and {bk}x{bn} tiles"));
        }
        if (bm * bk / 4) % t != 0 || (bn * bk / 4) % t != 0 {
            return Err(format!(
                "tiles of {bm}x{bk} and {bk}x{bn} do not split evenly into float4 loads over {t} threads"
            ));
        }
        if self.warp_tiled && ((bn / tn) % 8 != 0 || (bm / tm) % 4 != 0) {
            return Err(format!("warp tiling needs {}x{} thread tiles in multiples of 4x8", bm / tm, bn / tn));
        }
        if !(2..=4).contains(&self.stages) {
            return Err(format!("{} stages: need 2..=4", self.stages));
        }
        if self.stages > 2 && !self.all_async() {
            return Err(format!(
                "{} stages need every operand copied by cp.async (async_copy, async_transpose)",
                self.stages
            ));
        }
        if self.early_barrier && !self.all_async() {
            return Err("early_barrier needs the cp.async pipeline (async_copy, async_transpose)".into());
        }
        if self.async_transpose {
            if !self.async_copy {
                return Err("async_transpose needs async_copy".into());
            }
            let rows = t / bk.max(1);
            if !bk.is_multiple_of(8)
                || !t.is_multiple_of(bk)
                || !rows.is_power_of_two()
                || !bm.is_multiple_of(rows)
                || !bn.is_multiple_of(rows)
            {
                return Err(format!(
                    "async_transpose: bk {bk} must be a multiple of 8 dividing {t} threads into a power-of-two number of rows dividing {bm} and {bn}"
                ));
            }
        }
        if self.shared_bytes() > MAX_SHARED {
            return Err(format!(
                "{} bytes of shared memory: above {MAX_SHARED}, the most a block may have on sm_80",
                self.shared_bytes()
            ));
        }
        Ok(())
    }

    /// Kernel name: `gemm_simt_nn` for the default shape, with the shape spelled
    /// out for others (`gemm_simt_nn_128x128x16_8x8_g8_m2`).
    pub fn kernel_name(&self, trans_a: bool, trans_b: bool) -> String {
        let t = format!("{}{}", if trans_a { 't' } else { 'n' }, if trans_b { 't' } else { 'n' });
        if *self == SimtConfig::default() {
            format!("gemm_simt_{t}")
        } else {
            format!(
                "gemm_simt_{t}_{}x{}x{}_{}x{}_g{}_m{}{}{}{}{}{}",
                self.bm,
                self.bn,
                self.bk,
                self.tm,
                self.tn,
                self.group_m,
                self.min_blocks,
                if self.async_copy { "_async" } else { "" },
                if self.warp_tiled { "_wt" } else { "" },
                if self.async_transpose { "_at" } else { "" },
                if self.stages != 2 { format!("_s{}", self.stages) } else { String::new() },
                if self.early_barrier { "_eb" } else { "" },
            ) + if self.split_k { "_sk" } else { "" }
        }
    }
}

/// The shapes the benchmark's sweep times next to the default
/// (`COMPUTE_PTX_GEMM_SWEEP=1`), for tuning: the previous register-staged
/// default, and the all-`cp.async` pipeline at other depths (`BK` 8/16/32),
/// stage counts (2–4), barrier placements, block orders and thread tiles
/// (128 threads of 16×8, 128×256 tiles of 8×16).
pub fn sweep_configs() -> Vec<SimtConfig> {
    let d = SimtConfig::default();
    let staged = SimtConfig::register_staged();
    let piped = SimtConfig { async_copy: true, async_transpose: true, ..staged };
    let eb = SimtConfig { early_barrier: true, ..piped };
    let t128 = SimtConfig { tm: 16, tn: 8, ..eb };
    let wide = SimtConfig { bn: 256, tn: 16, min_blocks: 1, ..eb };
    let all = vec![
        staged,
        SimtConfig { stages: 3, ..piped },
        SimtConfig { stages: 3, ..eb },
        SimtConfig { stages: 3, early_barrier: false, ..wide },
        SimtConfig { early_barrier: false, ..d },
        SimtConfig { group_m: 4, ..d },
        SimtConfig { group_m: 16, ..d },
        SimtConfig { stages: 3, ..d },
        SimtConfig { stages: 4, ..d },
        SimtConfig { bk: 32, ..piped },
        SimtConfig { bk: 32, ..eb },
        SimtConfig { bk: 16, stages: 3, min_blocks: 2, ..t128 },
        SimtConfig { bk: 16, ..wide },
    ];
    all.into_iter().filter(|c| *c != d).collect()
}

/// How one operand's tiles reach shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    /// `ld.global.nc.v4` into registers before the current tile's fmas, stored
    /// (transposed if `k`-contiguous) after them.
    Staged,
    /// 16-byte `cp.async` straight into shared memory (rows run along m/n).
    Async16,
    /// 4-byte `cp.async`s of a `k`-contiguous operand, one element each,
    /// transposing it into the `k`-major layout.
    Async4,
}

/// The loads of one operand's tile a thread does: `slots` loads (16-byte, or
/// 4-byte for [`Route::Async4`]) whose addresses, indices and shared-memory
/// offsets differ from slot 0's by constants (or, for addresses, by a multiple
/// of the leading dimension), so only slot 0's state lives in registers
/// through the loop.
struct OperandLoads {
    /// The elements of a slot run along `k` (stored transposed).
    kcontig: bool,
    route: Route,
    slots: u32,
    /// Slot 0's global address this tile (advances every tile).
    ptr: Reg<U64>,
    /// Slot 0's `k` index this tile (advances by BK).
    kidx: Reg<U32>,
    /// Slot 0's index along m/n (its row if `kcontig`, else its first element).
    mn_idx: Reg<U32>,
    /// Extent of m/n, and the stored row length.
    mn: Reg<U32>,
    ld: Reg<U32>,
    /// The row length is a multiple of 4 (the `float4` path is aligned).
    aligned: Reg<Pred>,
    /// Slot `l` is `l·row_step` rows further along the stored rows (m/n rows if
    /// `kcontig`, else k rows): `l·row_step·ld` elements and, if `kcontig`,
    /// `l·row_step` along m/n, else along k.
    row_step: u32,
    /// Slot 0's shared-memory byte address within stage 0.
    st_addr: Reg<U32>,
    /// Shared-memory bytes between consecutive slots, and between consecutive k.
    st_step: u32,
    smem_row: u32,
    /// The operand's base address for this batch (a valid source for the
    /// zero-byte copies of out-of-bounds elements).
    base: Reg<U64>,
    /// Staging registers per slot (only for [`Route::Staged`]).
    regs: Vec<[Reg<F32>; 4]>,
}

impl OperandLoads {
    fn is_async(&self) -> bool {
        self.route != Route::Staged
    }
}

struct Operand<'a> {
    base: Reg<U64>,
    batch: Reg<U32>,
    batch_stride: Reg<U64>,
    /// `k` runs along the stored rows (contiguous): A not transposed, B transposed.
    kcontig: bool,
    /// Extent of the m/n dimension and its block origin.
    mn: Reg<U32>,
    mn0: Reg<U32>,
    /// Rows of the tile along m/n (BM or BN).
    tile_mn: u32,
    /// Leading dimension of the stored matrix (its row length).
    ld: Reg<U32>,
    name: &'a str,
}

fn operand_loads(
    b: &mut KernelBuilder,
    cfg: &SimtConfig,
    op: &Operand,
    tid: Reg<U32>,
    sbase: Reg<U32>,
    region: u32,
) -> OperandLoads {
    b.comment(&format!("{} tile loads", op.name));
    let threads = cfg.threads();
    let route = match (cfg.async_copy, op.kcontig, cfg.async_transpose) {
        (false, _, _) | (true, true, false) => Route::Staged,
        (true, false, _) => Route::Async16,
        (true, true, true) => Route::Async4,
    };
    let per_slot = if route == Route::Async4 { 1 } else { 4 };
    let slots = op.tile_mn * cfg.bk / per_slot / threads;
    let row = (op.tile_mn + 4) * 4;
    let z64 = b.cvt::<U64, U32>(op.batch);
    let zoff = b.mul(z64, op.batch_stride);
    let zbytes = b.shl(zoff, 2u32);
    let base = b.add(op.base, zbytes);
    let ld_low = b.and(op.ld, 3u32);
    let aligned = b.setp(Cmp::Eq, ld_low, 0u32);
    let (ptr, kidx, mn_idx, row_step, st_addr, st_step) = if route == Route::Async4 {
        // Thread f copies k = f % 8 + 8·(chunk) of row (f / 8) % R, R = T / BK rows
        // per pass, chunk = f / (8R): a warp reads 8 consecutive k of 4 rows (whole
        // 32-byte sectors) and stores them to banks 4k + row (mod 32): no conflicts.
        let rows = threads / cfg.bk;
        let kl = b.and(tid, 7u32);
        let g = b.shr(tid, 3u32);
        let r = b.and(g, rows - 1);
        let chunk = b.shr(g, rows.trailing_zeros());
        let kk = b.mad(chunk, 8u32, kl);
        // Shared As[kk][r].
        let (ptr, gr, sa) = kcontig_addresses(b, op, base, sbase, r, kk, row);
        (ptr, kk, gr, rows, sa, rows * 4)
    } else if op.kcontig {
        // Float4 f = tid + l·T → (m/n row f / (BK/4), k quad f % (BK/4)).
        let r = b.shr(tid, (cfg.bk / 4).trailing_zeros());
        let kq = b.and(tid, cfg.bk / 4 - 1);
        let kq = b.shl(kq, 2u32);
        // Shared As[kq + j][r].
        let (ptr, gr, sa) = kcontig_addresses(b, op, base, sbase, r, kq, row);
        let row_step = threads / (cfg.bk / 4);
        (ptr, kq, gr, row_step, sa, row_step * 4)
    } else {
        // Float4 f → (k row f / (TILE/4), m/n quad f % (TILE/4)).
        let quads = op.tile_mn / 4;
        let kk = b.shr(tid, quads.trailing_zeros());
        let q = b.and(tid, quads - 1);
        let q = b.shl(q, 2u32);
        let gq = b.add(op.mn0, q);
        let e = b.mul_wide(kk, op.ld);
        let gq64 = b.cvt::<U64, U32>(gq);
        let e = b.add(e, gq64);
        let bytes = b.shl(e, 2u32);
        let ptr = b.add(base, bytes);
        // Shared Bs[kk][q..q+3]: byte (kk·row + 4q).
        let sa = b.mul(kk, row);
        let q4 = b.shl(q, 2u32);
        let sa = b.add(sa, q4);
        let sa = b.add(sa, sbase);
        let row_step = threads / quads;
        (ptr, kk, gq, row_step, sa, row_step * row)
    };
    let st_addr = b.add(st_addr, region);
    let regs = if route != Route::Staged {
        Vec::new()
    } else {
        (0..slots).map(|_| [b.mov(0.0f32), b.mov(0.0f32), b.mov(0.0f32), b.mov(0.0f32)]).collect()
    };
    OperandLoads {
        kcontig: op.kcontig,
        route,
        slots,
        ptr,
        kidx,
        mn_idx,
        mn: op.mn,
        ld: op.ld,
        aligned,
        row_step,
        st_addr,
        st_step,
        smem_row: row,
        base,
        regs,
    }
}

/// Slot `l`'s (address, k index, m/n index), derived from slot 0's.
/// Addresses of element `k` of row `r` of a k-contiguous operand's tile: the
/// global pointer (`base + ((mn0 + r)·ld + k)·4`), the global row `mn0 + r`, and
/// the shared-memory byte address of `As[k][r]` (`sbase + k·row + 4r`).
fn kcontig_addresses(
    b: &mut KernelBuilder,
    op: &Operand,
    base: Reg<U64>,
    sbase: Reg<U32>,
    r: Reg<U32>,
    k: Reg<U32>,
    row: u32,
) -> (Reg<U64>, Reg<U32>, Reg<U32>) {
    let gr = b.add(op.mn0, r);
    let e = b.mul_wide(gr, op.ld);
    let k64 = b.cvt::<U64, U32>(k);
    let e = b.add(e, k64);
    let bytes = b.shl(e, 2u32);
    let ptr = b.add(base, bytes);
    let sa = b.mul(k, row);
    let r4 = b.shl(r, 2u32);
    let sa = b.add(sa, r4);
    let sa = b.add(sa, sbase);
    (ptr, gr, sa)
}

fn slot_state(b: &mut KernelBuilder, o: &OperandLoads, l: u32) -> (Reg<U64>, Reg<U32>, Reg<U32>) {
    if l == 0 {
        return (o.ptr, o.kidx, o.mn_idx);
    }
    let d = b.mul_wide(o.ld, 4 * l * o.row_step);
    let ptr = b.add(o.ptr, d);
    if o.kcontig {
        let mn = b.add(o.mn_idx, l * o.row_step);
        (ptr, o.kidx, mn)
    } else {
        let k = b.add(o.kidx, l * o.row_step);
        (ptr, k, o.mn_idx)
    }
}

/// Whether slot state `(kidx, mn_idx)` can load its four elements as one
/// aligned `float4` this tile.
fn slot_full(b: &mut KernelBuilder, o: &OperandLoads, kidx: Reg<U32>, mn_idx: Reg<U32>, k: Reg<U32>) -> Reg<Pred> {
    let (kin, mnin) = if o.kcontig {
        let k3 = b.add(kidx, 3u32);
        (b.setp(Cmp::Lt, k3, k), b.setp(Cmp::Lt, mn_idx, o.mn))
    } else {
        let m3 = b.add(mn_idx, 3u32);
        (b.setp(Cmp::Lt, kidx, k), b.setp(Cmp::Lt, m3, o.mn))
    };
    let both = b.and_pred(kin, mnin);
    b.and_pred(both, o.aligned)
}

/// Whether element `j` of a slot's four is inside the matrix.
fn elem_ok(
    b: &mut KernelBuilder,
    o: &OperandLoads,
    kidx: Reg<U32>,
    mn_idx: Reg<U32>,
    k: Reg<U32>,
    j: u32,
) -> Reg<Pred> {
    if o.kcontig {
        let kj = b.add(kidx, j);
        let kin = b.setp(Cmp::Lt, kj, k);
        let mnin = b.setp(Cmp::Lt, mn_idx, o.mn);
        b.and_pred(kin, mnin)
    } else {
        let mj = b.add(mn_idx, j);
        let mnin = b.setp(Cmp::Lt, mj, o.mn);
        let kin = b.setp(Cmp::Lt, kidx, k);
        b.and_pred(kin, mnin)
    }
}

/// Issues the global loads of one tile: `cp.async` for the asynchronous
/// operands (into `stage` of shared memory, closed by a commit if `commit`),
/// the staging registers for the others. Edge slots fall back to element-wise
/// predicated loads (zero fill); `cp.async` edges use 4-byte copies with a
/// source size of 0 outside, from a source address clamped to the matrix base.
fn load_tile(b: &mut KernelBuilder, ops: &[&OperandLoads], stage: Reg<U32>, k: Reg<U32>, commit: bool) {
    for o in ops.iter().filter(|o| o.route == Route::Async16) {
        let first = b.add(o.st_addr, stage);
        for l in 0..o.slots {
            let (ptr, kidx, mn_idx) = slot_state(b, o, l);
            let full = slot_full(b, o, kidx, mn_idx, k);
            let off = i64::from(l * o.st_step);
            b.guarded(full, false, |b| b.cp_async_16(first, off, ptr, 0, None));
            let done = b.label("slot_copied");
            b.bra_if(full, done);
            for j in 0..4u32 {
                let ok = elem_ok(b, o, kidx, mn_idx, k, j);
                let elem = b.add(ptr, u64::from(j) * 4);
                let src = b.selp(elem, o.base, ok);
                let bytes = b.selp(4u32, 0u32, ok);
                b.cp_async_4(first, off + i64::from(j) * 4, src, 0, Some(bytes.into()));
            }
            b.place(done);
        }
    }
    for o in ops.iter().filter(|o| o.route == Route::Async4) {
        // One k per thread; its rows rise with the slot, so the last slot's row
        // decides whether the whole tile is inside.
        let first = b.add(o.st_addr, stage);
        let kin = b.setp(Cmp::Lt, o.kidx, k);
        let last = b.add(o.mn_idx, (o.slots - 1) * o.row_step);
        let lin = b.setp(Cmp::Lt, last, o.mn);
        let full = b.and_pred(kin, lin);
        let edge = b.label("tile_edge");
        let done = b.label("tile_copied");
        b.bra_unless(full, edge);
        for l in 0..o.slots {
            let (ptr, _, _) = slot_state(b, o, l);
            b.cp_async_4(first, i64::from(l * o.st_step), ptr, 0, None);
        }
        b.bra(done);
        b.place(edge);
        for l in 0..o.slots {
            let (ptr, _, mn_idx) = slot_state(b, o, l);
            let mnin = b.setp(Cmp::Lt, mn_idx, o.mn);
            let ok = b.and_pred(kin, mnin);
            let src = b.selp(ptr, o.base, ok);
            let bytes = b.selp(4u32, 0u32, ok);
            b.cp_async_4(first, i64::from(l * o.st_step), src, 0, Some(bytes.into()));
        }
        b.place(done);
    }
    if commit {
        b.cp_async_commit();
    }
    for o in ops.iter().filter(|o| o.route == Route::Staged) {
        for l in 0..o.slots {
            let regs = o.regs[l as usize];
            for &r in &regs {
                b.assign(r, 0.0f32);
            }
            let (ptr, kidx, mn_idx) = slot_state(b, o, l);
            let full = slot_full(b, o, kidx, mn_idx, k);
            b.guarded(full, false, |b| {
                let v = b.ld_global_nc_v::<F32, 4>(ptr, 0);
                for (d, x) in regs.iter().zip(v) {
                    b.assign(*d, x);
                }
            });
            let done = b.label("slot_loaded");
            b.bra_if(full, done);
            for j in 0..4u32 {
                let ok = elem_ok(b, o, kidx, mn_idx, k, j);
                let d = regs[j as usize];
                b.guarded(ok, false, |b| {
                    let v = b.ld_global_nc::<F32>(ptr, i64::from(j) * 4);
                    b.assign(d, v);
                });
            }
            b.place(done);
        }
    }
}

/// Stores the staged tile into shared memory at stage offset `stage`.
fn store_tile(b: &mut KernelBuilder, ops: &[&OperandLoads], stage: Reg<U32>) {
    for o in ops.iter().filter(|o| o.route == Route::Staged) {
        let first = b.add(o.st_addr, stage);
        for l in 0..o.slots {
            let regs = o.regs[l as usize];
            let off = i64::from(l * o.st_step);
            if o.kcontig {
                for (j, &r) in regs.iter().enumerate() {
                    b.st_shared(first, off + j as i64 * i64::from(o.smem_row), r);
                }
            } else {
                b.st_shared_v::<F32, 4>(first, off, regs.map(Src::from));
            }
        }
    }
}

/// Moves every operand's slot 0 to the next tile.
fn advance(b: &mut KernelBuilder, ops: &[&OperandLoads], bk: u32) {
    for o in ops {
        let p = if o.kcontig {
            b.add(o.ptr, u64::from(bk) * 4)
        } else {
            let step = b.mul_wide(o.ld, bk * 4);
            b.add(o.ptr, step)
        };
        b.assign(o.ptr, p);
        let k = b.add(o.kidx, bk);
        b.assign(o.kidx, k);
    }
}

/// The block's tile origin `(m0, n0)`; with `group_m`, blocks are visited in
/// groups of `group_m` tile-rows that sweep the tile-columns (L2 reuse).
/// Emitted twice (prologue, epilogue) so nothing of it stays live in the loop.
fn block_origin(b: &mut KernelBuilder, cfg: &SimtConfig) -> (Reg<U32>, Reg<U32>) {
    tile_origin(b, cfg.bm, cfg.bn, cfg.group_m)
}

/// The origin `(m0, n0)` of this block's `bm × bn` tile of `C` in a grid of
/// `(tile-columns, tile-rows, batch)` blocks: tile-rows visited in groups of
/// `group_m` that sweep the tile-columns, so the blocks running together share
/// their `A` and `B` panels in L2 (0: plain row-major order). About 15 integer
/// instructions.
pub(crate) fn tile_origin(b: &mut KernelBuilder, bm: u32, bn: u32, group_m: u32) -> (Reg<U32>, Reg<U32>) {
    let cx = b.ctaid(Dim::X);
    let cy = b.ctaid(Dim::Y);
    let (pm, pn) = if group_m > 0 {
        let g = group_m;
        let npn = b.nctaid(Dim::X);
        let npm = b.nctaid(Dim::Y);
        let pid = b.mad(cy, npn, cx);
        let width = b.mul(npn, g);
        let gid = b.div(pid, width);
        let first = b.mul(gid, g);
        let left = b.sub(npm, first);
        let gsz = b.min(left, g);
        let inner = b.rem(pid, width);
        let r = b.rem(inner, gsz);
        let pm = b.add(first, r);
        let pn = b.div(inner, gsz);
        (pm, pn)
    } else {
        (cy, cx)
    };
    (b.mul(pm, bm), b.mul(pn, bn))
}

/// This thread's column and row in the `(BN/TN) × (BM/TM)` thread grid.
fn thread_coords(b: &mut KernelBuilder, cfg: &SimtConfig, tid: Reg<U32>) -> (Reg<U32>, Reg<U32>) {
    let tx_n = cfg.bn / cfg.tn;
    if !cfg.warp_tiled {
        return (b.rem(tid, tx_n), b.div(tid, tx_n));
    }
    // Warp w covers threads (wy·4 .. +4, wx·8 .. +8); lane l is (l / 8, l % 8) in it.
    let lane = b.and(tid, 31u32);
    let w = b.shr(tid, 5u32);
    let per_row = tx_n / 8;
    let wx = b.rem(w, per_row);
    let wy = b.div(w, per_row);
    let tx_in = b.and(lane, 7u32);
    let ty_in = b.shr(lane, 3u32);
    let tx = b.mad(wx, 8u32, tx_in);
    let ty = b.mad(wy, 4u32, ty_in);
    (tx, ty)
}

/// One k-step's fragments from the stage whose `A` and `B` tiles start at
/// `a_cur` and `b_cur`: `TM/4` `float4`s of `A`, `TN/4` of `B`.
fn load_fragments(
    b: &mut KernelBuilder,
    cfg: &SimtConfig,
    a_cur: Reg<U32>,
    b_cur: Reg<U32>,
    kk: u32,
) -> (Vec<Reg<F32>>, Vec<Reg<F32>>) {
    let SimtConfig { bm, bn, tm, tn, .. } = *cfg;
    let (tx_n, ty_n) = (bn / tn, bm / tm);
    let mut af = Vec::new();
    for r in 0..tm / 4 {
        let off = i64::from(kk * (bm + 4) * 4 + r * ty_n * 16);
        af.extend(b.ld_shared_v::<F32, 4>(a_cur, off));
    }
    let mut bf = Vec::new();
    for c in 0..tn / 4 {
        let off = i64::from(kk * (bn + 4) * 4 + c * tx_n * 16);
        bf.extend(b.ld_shared_v::<F32, 4>(b_cur, off));
    }
    (af, bf)
}

/// The `TM·TN` fmas of one k-step.
fn fmas(b: &mut KernelBuilder, acc: &[Vec<Reg<F32>>], af: &[Reg<F32>], bf: &[Reg<F32>]) {
    for (row, &x) in acc.iter().zip(af) {
        for (&c, &y) in row.iter().zip(bf) {
            b.fma_acc(c, x, y);
        }
    }
}

/// One k-tile's `BK·TM·TN` fmas from the shared-memory stage at byte offset
/// `stage` (fragments read as `float4`s: `TM/4` of `A`, `TN/4` of `B` per k).
fn compute_tile(
    b: &mut KernelBuilder,
    cfg: &SimtConfig,
    (a_rd, b_rd): (Reg<U32>, Reg<U32>),
    acc: &[Vec<Reg<F32>>],
    stage: Reg<U32>,
) {
    let SimtConfig { bk, tm, tn, .. } = *cfg;
    b.comment(&format!("{bk} k-steps of {tm}x{tn} fmas from the current stage"));
    let a_cur = b.add(a_rd, stage);
    let b_cur = b.add(b_rd, stage);
    for kk in 0..bk {
        let (af, bf) = load_fragments(b, cfg, a_cur, b_cur, kk);
        fmas(b, acc, &af, &bf);
    }
}

/// Moves a stage offset to the next stage, wrapping after the last.
fn next_stage(b: &mut KernelBuilder, cfg: &SimtConfig, r: Reg<U32>) {
    let stage_bytes = cfg.bk * ((cfg.bm + 4) + (cfg.bn + 4)) * 4;
    let n = b.add(r, stage_bytes);
    let wrap = b.setp(Cmp::Eq, n, cfg.stages * stage_bytes);
    let n = b.selp(0u32, n, wrap);
    b.assign(r, n);
}

/// `ceil(k / BK)`: the number of k-tiles.
fn k_tiles(b: &mut KernelBuilder, cfg: &SimtConfig, k: Reg<U32>) -> Reg<U32> {
    let t = b.add(k, cfg.bk - 1);
    b.div(t, cfg.bk)
}

/// The two-stage loop with the `k`-contiguous operand staged through
/// registers: next tile's loads issued before this tile's fmas, stored after
/// them, one barrier per tile.
fn register_staged(
    b: &mut KernelBuilder,
    cfg: &SimtConfig,
    ops: &[&OperandLoads],
    rd: (Reg<U32>, Reg<U32>),
    acc: &[Vec<Reg<F32>>],
    k: Reg<U32>,
) {
    let SimtConfig { bm, bn, bk, .. } = *cfg;
    let stage_bytes = bk * ((bm + 4) + (bn + 4)) * 4;
    let any_async = ops.iter().any(|o| o.is_async());
    b.blank();
    b.comment("prologue: tile 0 into stage 0");
    let stage = b.mov(0u32);
    load_tile(b, ops, stage, k, any_async);
    store_tile(b, ops, stage);
    if any_async {
        b.cp_async_wait(0);
    }
    b.bar_sync();
    // Tiles left after the current one: ceil(k/BK) - 1.
    let ktiles = k_tiles(b, cfg, k);
    let left = b.sub(ktiles, 1u32);

    let lp = b.label("k_tiles");
    b.place(lp);
    let has_next = b.setp(Cmp::Ne, left, 0u32);
    b.comment("next tile's global loads, in flight during this tile's fmas");
    advance(b, ops, bk);
    let skip_load = b.label("no_next_load");
    b.bra_unless(has_next, skip_load);
    let next_stage = b.sub(stage_bytes, stage);
    load_tile(b, ops, next_stage, k, any_async);
    b.place(skip_load);

    compute_tile(b, cfg, rd, acc, stage);
    let done = b.label("k_done");
    b.bra_unless(has_next, done);
    b.comment("stage the next tile into the other buffer, then one barrier");
    let other = b.sub(stage_bytes, stage);
    store_tile(b, ops, other);
    if any_async {
        b.cp_async_wait(0);
    }
    b.bar_sync();
    b.assign(stage, other);
    let l1 = b.sub(left, 1u32);
    b.assign(left, l1);
    b.bra(lp);
    b.place(done);
}

/// The `stages`-deep loop with every operand copied by `cp.async`: the
/// prologue issues tiles `0..S-1` (one commit group each; tiles past `k` are
/// zero-filled); iteration `t` waits for tile `t`'s group
/// (`cp.async.wait_group S-2`), passes one barrier (tile `t` visible to all,
/// and every thread done with stage `(t-1) mod S`), issues tile `t+S-1` into
/// that stage (an empty group past the last tile keeps the count), then
/// computes tile `t`.
fn pipelined(
    b: &mut KernelBuilder,
    cfg: &SimtConfig,
    ops: &[&OperandLoads],
    rd: (Reg<U32>, Reg<U32>),
    acc: &[Vec<Reg<F32>>],
    k: Reg<U32>,
) {
    let SimtConfig { bm, bn, bk, stages, .. } = *cfg;
    let stage_bytes = bk * ((bm + 4) + (bn + 4)) * 4;
    b.blank();
    b.comment(&format!("prologue: tiles 0..{} into stages 0..{}", stages - 1, stages - 1));
    for s in 0..stages - 1 {
        if s > 0 {
            advance(b, ops, bk);
        }
        let st = b.mov(s * stage_bytes);
        load_tile(b, ops, st, k, true);
    }
    let left = k_tiles(b, cfg, k);
    let cur = b.mov(0u32);
    let next = b.mov((stages - 1) * stage_bytes);
    let done = b.label("k_done");
    let none = b.setp(Cmp::Eq, left, 0u32);
    b.bra_if(none, done);

    let (a_rd, b_rd) = rd;
    let frags = if cfg.early_barrier {
        b.comment("tile 0 landed; its first fragments");
        b.cp_async_wait(stages - 2);
        b.bar_sync();
        let (af, bf) = load_fragments(b, cfg, a_rd, b_rd, 0);
        let af: Vec<Reg<F32>> = af.into_iter().map(|x| b.mov(x)).collect();
        let bf: Vec<Reg<F32>> = bf.into_iter().map(|x| b.mov(x)).collect();
        Some((af, bf))
    } else {
        None
    };

    let lp = b.label("k_tiles");
    b.place(lp);
    if frags.is_none() {
        b.cp_async_wait(stages - 2);
        b.bar_sync();
    }
    b.comment(&format!("tile t+{} into the stage freed by tile t-1, in flight during this tile's fmas", stages - 1));
    let more = b.setp(Cmp::Gt, left, stages - 1);
    let skip_load = b.label("no_next_load");
    b.bra_unless(more, skip_load);
    advance(b, ops, bk);
    load_tile(b, ops, next, k, false);
    b.place(skip_load);
    b.cp_async_commit();

    match &frags {
        None => {
            compute_tile(b, cfg, rd, acc, cur);
            next_stage(b, cfg, cur);
        }
        Some((af0, bf0)) => {
            b.comment(&format!("{bk} k-steps; before the last: wait for tile t+1, barrier, its first fragments"));
            let a_cur = b.add(a_rd, cur);
            let b_cur = b.add(b_rd, cur);
            let (mut af, mut bf) = (af0.clone(), bf0.clone());
            for kk in 0..bk {
                let (naf, nbf) = if kk + 1 < bk {
                    load_fragments(b, cfg, a_cur, b_cur, kk + 1)
                } else {
                    b.cp_async_wait(stages - 2);
                    b.bar_sync();
                    next_stage(b, cfg, cur);
                    let a_nx = b.add(a_rd, cur);
                    let b_nx = b.add(b_rd, cur);
                    load_fragments(b, cfg, a_nx, b_nx, 0)
                };
                fmas(b, acc, &af, &bf);
                (af, bf) = (naf, nbf);
            }
            for (d, x) in af0.iter().zip(&af).chain(bf0.iter().zip(&bf)) {
                b.assign(*d, *x);
            }
        }
    }
    next_stage(b, cfg, next);
    let l1 = b.sub(left, 1u32);
    b.assign(left, l1);
    let again = b.setp(Cmp::Ne, left, 0u32);
    b.bra_if(again, lp);
    b.place(done);
    b.comment("no copy may be left in flight (the zero-filled tiles past k)");
    b.cp_async_wait(0);
}

/// Builds the register-blocked kernel for one transpose combination.
///
/// Params: `a`, `b`, `c`, `m`, `n`, `k` (u32), `sa`, `sb`, `sc` (batch strides
/// in elements). Launch: [`SimtConfig::threads`] threads, grid
/// `(ceil(n/BN), ceil(m/BM), batch)`, [`SimtConfig::dynamic_shared_bytes`] of
/// dynamic shared memory.
pub fn simt(cfg: &SimtConfig, trans_a: bool, trans_b: bool, target: Target) -> Result<Kernel, BuildError> {
    let name = cfg.kernel_name(trans_a, trans_b);
    if let Err(e) = cfg.check() {
        return Err(BuildError { kernel: name, problems: vec![e] });
    }
    let SimtConfig { bm, bn, bk, tm, tn, min_blocks, .. } = *cfg;
    let threads = cfg.threads();
    let (tx_n, ty_n) = (bn / tn, bm / tm);
    let mut b = KernelBuilder::new(&name, target);
    b.doc(&format!(
        "{name}: C = {} * {}, register-blocked SIMT fp32 GEMM",
        if trans_a { "A^T" } else { "A" },
        if trans_b { "B^T" } else { "B" }
    ));
    b.doc(&format!(
        "block tile {bm}x{bn}, k-tile {bk}, thread tile {tm}x{tn} ({threads} threads), {} shared-memory stages{}",
        cfg.stages,
        if cfg.all_async() { ", every operand copied by cp.async" } else { "" }
    ));
    if cfg.split_k {
        b.doc("params: a, b, c, m, n, k, sa, sb, sc, kc: block z multiplies the k-slice [z*kc, min(k, (z+1)*kc))");
        b.doc("of A + z*sa and B + z*sb (sa, sb: the slice's offsets in elements) into C + z*sc");
        b.doc(&format!(
            "launch: {threads} threads, grid (ceil(n/{bn}), ceil(m/{bm}), ceil(k/kc)), {} bytes of dynamic shared memory",
            cfg.dynamic_shared_bytes()
        ));
    } else {
        b.doc("params: a, b, c, m, n, k, sa, sb, sc (batch strides in elements)");
        b.doc(&format!(
            "launch: {threads} threads, grid (ceil(n/{bn}), ceil(m/{bm}), batch), {} bytes of dynamic shared memory",
            cfg.dynamic_shared_bytes()
        ));
    }
    b.max_threads(threads);
    if min_blocks > 0 {
        b.min_blocks_per_sm(min_blocks);
    }
    let GemmParams { a: pa, b: pb, c: pc, m, n, k, sa, sb, sc } = gemm_params(&mut b);
    // The k-slice this block multiplies: all of k, or (split) its share of it.
    let k_len = if cfg.split_k {
        let kc = b.param::<U32>("kc");
        let zs = b.ctaid(Dim::Z);
        let k0 = b.mul(zs, kc);
        let left = b.sub(k, k0);
        b.min(left, kc)
    } else {
        k
    };
    let a_bytes = bk * (bm + 4) * 4;
    let b_bytes = bk * (bn + 4) * 4;
    let stage_bytes = a_bytes + b_bytes;
    debug_assert_eq!(stage_bytes * cfg.stages, cfg.shared_bytes());
    let smem = if cfg.dynamic_shared_bytes() > 0 {
        b.dynamic_shared("tiles", 16)
    } else {
        b.shared("tiles", cfg.stages * stage_bytes, 16)
    };

    let tid = b.tid(Dim::X);
    let z = b.ctaid(Dim::Z);
    let (m0, n0) = block_origin(&mut b, cfg);

    // Stored shapes: A is m×k (k-contiguous) or k×m; B is k×n or n×k (k-contiguous).
    let a_op = Operand {
        base: pa,
        batch: z,
        batch_stride: sa,
        kcontig: !trans_a,
        mn: m,
        mn0: m0,
        tile_mn: bm,
        ld: if trans_a { m } else { k },
        name: "A",
    };
    let b_op = Operand {
        base: pb,
        batch: z,
        batch_stride: sb,
        kcontig: trans_b,
        mn: n,
        mn0: n0,
        tile_mn: bn,
        ld: if trans_b { k } else { n },
        name: "B",
    };
    let sbase = b.shared_base(&smem);
    let a_loads = operand_loads(&mut b, cfg, &a_op, tid, sbase, 0);
    let b_loads = operand_loads(&mut b, cfg, &b_op, tid, sbase, a_bytes);
    let ops = [&a_loads, &b_loads];

    // Compute-side read addresses: As[kk][r·4TY + 4ty], Bs[kk][c·4TX + 4tx].
    let (tx, ty) = thread_coords(&mut b, cfg, tid);
    let ty16 = b.shl(ty, 4u32);
    let a_rd = b.add(sbase, ty16);
    let tx16 = b.shl(tx, 4u32);
    let b_rd0 = b.add(sbase, tx16);
    let b_rd = b.add(b_rd0, a_bytes);

    let acc: Vec<Vec<Reg<F32>>> = (0..tm).map(|_| (0..tn).map(|_| b.mov(0.0f32)).collect()).collect();

    if cfg.all_async() {
        pipelined(&mut b, cfg, &ops, (a_rd, b_rd), &acc, k_len);
    } else {
        register_staged(&mut b, cfg, &ops, (a_rd, b_rd), &acc, k_len);
    }

    b.blank();
    b.comment("epilogue: float4 stores where the row is inside and n % 4 == 0, else scalar");
    b.comment("(thread and block coordinates recomputed: nothing of them stays live in the loop)");
    let tid = b.tid(Dim::X);
    let z = b.ctaid(Dim::Z);
    let (m0, n0) = block_origin(&mut b, cfg);
    let (tx, ty) = thread_coords(&mut b, cfg, tid);
    let n_low = b.and(n, 3u32);
    let c_vec = b.setp(Cmp::Eq, n_low, 0u32);
    let z64 = b.cvt::<U64, U32>(z);
    let zc = b.mul(z64, sc);
    for r in 0..tm / 4 {
        for i in 0..4u32 {
            let row = b.mad(ty, 4u32, m0);
            let gi = b.add(row, r * ty_n * 4 + i);
            let row_ok = b.setp(Cmp::Lt, gi, m);
            let skip_row = b.label("row_out");
            b.bra_unless(row_ok, skip_row);
            let e = b.mul_wide(gi, n);
            let e = b.add(e, zc);
            for c in 0..tn / 4 {
                let col = b.mad(tx, 4u32, n0);
                let gj = b.add(col, c * tx_n * 4);
                let gj64 = b.cvt::<U64, U32>(gj);
                let ej = b.add(e, gj64);
                let addr = elem_addr_plain(&mut b, pc, ej);
                let g3 = b.add(gj, 3u32);
                let in3 = b.setp(Cmp::Lt, g3, n);
                let full = b.and_pred(in3, c_vec);
                let vals: Vec<Reg<F32>> = (0..4).map(|j| acc[(r * 4 + i) as usize][(c * 4 + j) as usize]).collect();
                b.guarded(full, false, |b| {
                    b.st_global_v::<F32, 4>(addr, 0, [vals[0].into(), vals[1].into(), vals[2].into(), vals[3].into()]);
                });
                let stored = b.label("stored");
                b.bra_if(full, stored);
                for (j, &v) in vals.iter().enumerate() {
                    let gjj = b.add(gj, j as u32);
                    let ok = b.setp(Cmp::Lt, gjj, n);
                    b.guarded(ok, false, |b| b.st_global(addr, j as i64 * 4, v));
                }
                b.place(stored);
            }
            b.place(skip_row);
        }
    }
    b.ret();
    b.finish()
}

fn elem_addr_plain(b: &mut KernelBuilder, base: Reg<U64>, idx: Reg<U64>) -> Reg<U64> {
    let bytes = b.shl(idx, 2u32);
    b.add(base, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_are_checked_and_deep_pipelines_use_dynamic_shared_memory() {
        let d = SimtConfig::default();
        assert_eq!(d.check(), Ok(()));
        assert_eq!(d.dynamic_shared_bytes(), 0, "the default fits in static shared memory");
        let deep = SimtConfig { stages: 3, ..d };
        assert_eq!(deep.dynamic_shared_bytes(), 3 * 16 * (132 + 132) * 4);
        let k = simt(&deep, false, false, Target::Sm90).expect("3 stages of k-tile 16 build");
        assert!(k.ptx().contains(".extern .shared"), "above 48 KiB the stages are dynamic shared memory");
        let staged = SimtConfig::register_staged();
        assert!(SimtConfig { stages: 3, ..staged }.check().is_err(), "3 stages need every operand in cp.async");
        assert!(SimtConfig { early_barrier: true, ..staged }.check().is_err());
        assert!(SimtConfig { async_copy: false, ..d }.check().is_err(), "async_transpose needs async_copy");
        assert!(SimtConfig { bk: 4, ..d }.check().is_err(), "4-byte transposing copies need bk % 8 == 0");
        assert!(SimtConfig { stages: 5, ..d }.check().is_err());
        for cfg in sweep_configs() {
            assert_eq!(cfg.check(), Ok(()), "{cfg:?}");
        }
    }
}
