//! Which adapter the backend opens, and how.

/// A graphics API wgpu can drive. [`DeviceOptions::backend`] restricts the
/// adapter search to one of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GpuApi {
    /// Vulkan (Linux, Windows, Android; also lavapipe, Mesa's software rasteriser).
    Vulkan,
    /// Metal (macOS, iOS).
    Metal,
    /// Direct3D 12 (Windows).
    Dx12,
    /// The browser's WebGPU (wasm32 with the `webgpu` feature).
    WebGpu,
}

impl GpuApi {
    /// Parses `vulkan`, `metal`, `dx12` or `webgpu` (case-insensitive).
    pub fn parse(name: &str) -> Option<GpuApi> {
        match name.trim().to_ascii_lowercase().as_str() {
            "vulkan" | "vk" => Some(GpuApi::Vulkan),
            "metal" | "mtl" => Some(GpuApi::Metal),
            "dx12" | "d3d12" => Some(GpuApi::Dx12),
            "webgpu" | "browser" => Some(GpuApi::WebGpu),
            _ => None,
        }
    }

    pub(crate) fn backends(self) -> wgpu::Backends {
        match self {
            GpuApi::Vulkan => wgpu::Backends::VULKAN,
            GpuApi::Metal => wgpu::Backends::METAL,
            GpuApi::Dx12 => wgpu::Backends::DX12,
            GpuApi::WebGpu => wgpu::Backends::BROWSER_WEBGPU,
        }
    }
}

/// Which tiling the `f32` matmul kernels use, for any shape (an operand
/// whose rows are not whole vec4s is read or written element by element).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MatmulTiles {
    /// By the number of tiles the shape makes (measured best on an H200, see
    /// `docs/wgpu.md`): [`TiledMatmul::AUTO_LARGE`] from 256 tiles of 128 × 128,
    /// [`TiledMatmul::AUTO_MEDIUM`] from 128
    /// tiles of 128 × 64, else [`MatmulTiles::Small`].
    #[default]
    Auto,
    /// A candidate for `Auto` (name `auto-sk`), measured slower than `Auto` at 1024³
    /// and 2048³ on the H200 (`docs/wgpu.md`): as [`MatmulTiles::Auto`],
    /// but shapes of fewer than 512 tiles of 128 × 128 that `Auto` gives
    /// `AUTO_LARGE` or `AUTO_MEDIUM` (2048³, 1024³) take [`TiledMatmul::AUTO_LARGE`] with split-K
    /// instead: 2 slices from 256 tiles, 4 below, when each slice keeps at least
    /// 128 of k (see [`TiledMatmul::with_split_k`]). For the tuning sweep.
    AutoSplitK,
    /// Always the `matmul_small` kernel: 64 × 64 tiles, 4 × 4 outputs per invocation.
    Small,
    /// Always the `matmul_tiled` kernel in this configuration.
    Tiled(TiledMatmul),
}

impl MatmulTiles {
    /// Parses `auto`, `small`, or a [`TiledMatmul`] name such as
    /// `tiled-128x128-8-ahead` (case-insensitive).
    pub fn parse(name: &str) -> Option<MatmulTiles> {
        match name.trim().to_ascii_lowercase().as_str() {
            "auto" => Some(MatmulTiles::Auto),
            "auto-sk" => Some(MatmulTiles::AutoSplitK),
            "small" => Some(MatmulTiles::Small),
            other => TiledMatmul::parse(other).map(MatmulTiles::Tiled),
        }
    }
}

impl std::fmt::Display for MatmulTiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MatmulTiles::Auto => f.write_str("auto"),
            MatmulTiles::AutoSplitK => f.write_str("auto-sk"),
            MatmulTiles::Small => f.write_str("small"),
            MatmulTiles::Tiled(t) => t.fmt(f),
        }
    }
}

/// A configuration of the register-blocked `matmul_tiled` kernel (see
/// `shaders/matmul.wgsl`): tiles of 128 × 128, 128 × 64, 64 × 64 or 128 × 32
/// (tile_m·tile_n/64 invocations, 8 × 8 outputs each), K steps of 8 or 16
/// (8 only for 128 × 32), and switches: `split` issues the next tile's loads in
/// two halves, `ahead` issues them two tiles ahead (not with `split`), `grouped`
/// visits the tiles 8 tile-rows at a time, and `warps_8x4` lays each subgroup of
/// 32 out as 8 × 4 invocations instead of 16 × 2 (128-column tiles only).
/// `narrow` gives each invocation 8 × 4 outputs instead of 8 × 8 (twice the
/// invocations per tile: tile_m·tile_n/32; needs a K step of at least
/// tile_m/8 and tile_n/8, so that every invocation loads a whole vec4 of each
/// operand, and at most 256 invocations: 64 × 64 with K step 8 or 16, 128 × 64
/// with 16).
/// Split-K (`sk2`, `sk4`) cuts k into 2 or 4 slices: S times the workgroups for
/// shapes with few tiles, at the cost of a scratch buffer of S·m·n floats per
/// matrix (from the backend's buffer cache), writing and re-reading it, and a
/// second dispatch that sums the slices into C.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TiledMatmul {
    tile_m: u32,
    tile_n: u32,
    k_step: u32,
    split: bool,
    ahead: bool,
    grouped: bool,
    warps_8x4: bool,
    narrow: bool,
    split_k: u32,
}

impl TiledMatmul {
    /// `Auto`'s choice from 256 tiles of 128 × 128 (2048³ and up): 128 × 128 tiles,
    /// K step 8, loads two tiles ahead, tiles visited 8 tile-rows at a time, each
    /// subgroup laid out as 8 × 4 invocations. Measured best at 2048³–8192³ on the
    /// H200 (0.82–0.88× cuBLAS with the matmuls of a sample in one submission,
    /// `docs/benchmarks.md`).
    pub const AUTO_LARGE: TiledMatmul =
        TiledMatmul { ahead: true, grouped: true, warps_8x4: true, ..TiledMatmul::plain(128, 128, 8) };
    /// `Auto`'s choice from 128 tiles of 128 × 64 (1024³): 64 × 64 tiles of 128
    /// invocations, each 8 × 4 outputs (`narrow`), K step 16: twice the
    /// workgroups of 128 × 64 tiles and four times the warps per SM.
    pub const AUTO_MEDIUM: TiledMatmul = TiledMatmul { narrow: true, ..TiledMatmul::plain(64, 64, 16) };

    const fn plain(tile_m: u32, tile_n: u32, k_step: u32) -> TiledMatmul {
        TiledMatmul {
            tile_m,
            tile_n,
            k_step,
            split: false,
            ahead: false,
            grouped: false,
            warps_8x4: false,
            narrow: false,
            split_k: 1,
        }
    }

    /// Tiles of `tile_m` × `tile_n`, K step `k_step`, no switches; `None` for a
    /// combination the kernel does not have.
    pub fn new(tile_m: u32, tile_n: u32, k_step: u32) -> Option<TiledMatmul> {
        let tile = matches!((tile_m, tile_n), (128, 128) | (128, 64) | (64, 64) | (128, 32));
        // Each invocation moves 16·k_step/tile_n vec4s of A and 16·k_step/tile_m of B per tile: at most 4.
        let valid = tile && matches!(k_step, 8 | 16) && 16 * k_step <= 4 * tile_m.min(tile_n);
        valid.then_some(TiledMatmul::plain(tile_m, tile_n, k_step))
    }

    /// Loads the next tile in two halves (or not); `None` with `ahead`.
    pub fn with_split(mut self, on: bool) -> Option<TiledMatmul> {
        self.split = on;
        (!(on && self.ahead)).then_some(self)
    }

    /// Issues the loads two tiles ahead (or one); `None` with `split`.
    pub fn with_ahead(mut self, on: bool) -> Option<TiledMatmul> {
        self.ahead = on;
        (!(on && self.split)).then_some(self)
    }

    /// Visits the tiles 8 tile-rows at a time (or row by row).
    pub fn with_grouped(mut self, on: bool) -> TiledMatmul {
        self.grouped = on;
        self
    }

    /// 8 × 4 invocations per subgroup of 32; `None` unless the tiles have 128 columns
    /// (and not with `narrow`).
    pub fn with_warps_8x4(mut self, on: bool) -> Option<TiledMatmul> {
        self.warps_8x4 = on;
        (!on || (self.tile_n == 128 && !self.narrow)).then_some(self)
    }

    /// 8 × 4 outputs per invocation (tile_m·tile_n/32 invocations) instead of 8 × 8;
    /// `None` with `warps_8x4`, a K step below tile_m/8 or tile_n/8, or 128 × 128
    /// tiles (512 invocations).
    pub fn with_narrow(mut self, on: bool) -> Option<TiledMatmul> {
        self.narrow = on;
        // At most 256 invocations (the smallest limit WebGPU guarantees).
        let fits = 8 * self.k_step >= self.tile_m.max(self.tile_n) && self.tile_m * self.tile_n <= 8192;
        (!on || (fits && !self.warps_8x4)).then_some(self)
    }

    /// Cuts k into `slices` (1: no split-K, 2 or 4) whose partial products a second
    /// dispatch sums; `None` for another count. Shapes whose `slices` partial
    /// matrices do not fit one storage binding run without split-K.
    pub fn with_split_k(mut self, slices: u32) -> Option<TiledMatmul> {
        self.split_k = slices;
        matches!(slices, 1 | 2 | 4).then_some(self)
    }

    /// Every configuration without split-K (each also takes
    /// [`TiledMatmul::with_split_k`]): each tile shape and K step plain, `split` or `ahead`,
    /// each with and without `grouped`, and the 128-column ones also with `warps_8x4`.
    pub fn all() -> Vec<TiledMatmul> {
        let mut v = Vec::new();
        for (m, n) in [(128, 128), (128, 64), (64, 64), (128, 32)] {
            for k in [8, 16] {
                let Some(t) = TiledMatmul::new(m, n, k) else { continue };
                let loads = [Some(t), t.with_split(true), t.with_ahead(true)];
                for t in loads.into_iter().flatten() {
                    for grouped in [false, true] {
                        let t = t.with_grouped(grouped);
                        v.push(t);
                        v.extend(t.with_warps_8x4(true).filter(|_| n == 128));
                    }
                }
            }
        }
        v
    }

    /// Invocations per workgroup: tile_m · tile_n / 64 (/ 32 when `narrow`).
    pub fn threads(self) -> u32 {
        self.tile_m * self.tile_n / if self.narrow { 32 } else { 64 }
    }

    /// Whether each invocation computes 8 × 4 outputs (else 8 × 8).
    pub fn narrow(self) -> bool {
        self.narrow
    }

    /// Rows × columns of C per workgroup.
    pub fn tile(self) -> (u64, u64) {
        (u64::from(self.tile_m), u64::from(self.tile_n))
    }

    /// K step (8 or 16).
    pub fn k_step(self) -> u32 {
        self.k_step
    }

    /// Whether the next tile is loaded in two halves.
    pub fn split(self) -> bool {
        self.split
    }

    /// Whether the loads go out two tiles ahead.
    pub fn ahead(self) -> bool {
        self.ahead
    }

    /// Whether the tiles are visited 8 tile-rows at a time.
    pub fn grouped(self) -> bool {
        self.grouped
    }

    /// Whether subgroups are laid out 8 × 4.
    pub fn warps_8x4(self) -> bool {
        self.warps_8x4
    }

    /// Slices of k (1: no split-K).
    pub fn split_k(self) -> u32 {
        self.split_k
    }

    /// The pipeline-overridable constants of `matmul_tiled` (in `shaders/matmul.wgsl`)
    /// that select this tiling, as `(name, value)` pairs; the transposes `TA`/`TB`
    /// are not among them. Allocates one small vector.
    pub fn override_constants(self) -> Vec<(&'static str, f64)> {
        let flag = |b: bool| if b { 1.0 } else { 0.0 };
        vec![
            ("TBM", f64::from(self.tile_m)),
            ("TBN", f64::from(self.tile_n)),
            ("TBK", f64::from(self.k_step)),
            ("SPLIT", flag(self.split)),
            ("AHEAD", flag(self.ahead)),
            ("GROUP", if self.grouped { 8.0 } else { 0.0 }),
            ("W84", flag(self.warps_8x4)),
            ("TN", if self.narrow { 4.0 } else { 8.0 }),
            ("SK", f64::from(self.split_k)),
        ]
    }

    /// Parses the [`Display`](std::fmt::Display) form,
    /// `tiled-<m>x<n>-<k step>[-split|-ahead][-grouped][-w84|-narrow][-sk2|-sk4]`
    /// (switches in any order).
    pub fn parse(name: &str) -> Option<TiledMatmul> {
        let name = name.trim().to_ascii_lowercase();
        let mut parts = name.strip_prefix("tiled-")?.split('-');
        let (m, n) = parts.next()?.split_once('x')?;
        let mut t = TiledMatmul::new(m.parse().ok()?, n.parse().ok()?, parts.next()?.parse().ok()?)?;
        for switch in parts {
            t = match switch {
                "split" => t.with_split(true)?,
                "ahead" => t.with_ahead(true)?,
                "grouped" => t.with_grouped(true),
                "w84" => t.with_warps_8x4(true)?,
                "narrow" => t.with_narrow(true)?,
                "sk1" => t.with_split_k(1)?,
                "sk2" => t.with_split_k(2)?,
                "sk4" => t.with_split_k(4)?,
                _ => return None,
            };
        }
        Some(t)
    }
}

impl std::fmt::Display for TiledMatmul {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "tiled-{}x{}-{}", self.tile_m, self.tile_n, self.k_step)?;
        let switches = [
            (self.split, "-split"),
            (self.ahead, "-ahead"),
            (self.grouped, "-grouped"),
            (self.warps_8x4, "-w84"),
            (self.narrow, "-narrow"),
        ];
        for (on, name) in switches {
            if on {
                f.write_str(name)?;
            }
        }
        if self.split_k > 1 {
            write!(f, "-sk{}", self.split_k)?;
        }
        Ok(())
    }
}

/// A configuration of the cooperative-matrix (tensor core) matmul
/// `matmul_coop` (`shaders/matmul_coop.wgsl`), which runs `f16` inputs with
/// `f32` accumulation on adapters that offer 16 × 16 × 16 cooperative matrices
/// (see [`crate::WgpuBackend::cooperative_matrix`]): tiles of `tile_m` ×
/// `tile_n` per workgroup of `warps_m` × `warps_n` subgroups of 32
/// invocations, each subgroup a block of (`tile_m`/`warps_m`) ×
/// (`tile_n`/`warps_n`) outputs as 16 × 16 accumulators (1, 2 or 4 along each
/// side), K steps of 16, 32 or 64. `ahead` (1 to 4) is how many K steps
/// before its multiply each step's global loads go out, each step in flight a
/// set of registers: the loads have `ahead` − 1 steps of multiplies to arrive
/// before they are stored into workgroup memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CoopTiles {
    tile_m: u32,
    tile_n: u32,
    k_step: u32,
    warps_m: u32,
    warps_n: u32,
    ahead: u32,
}

impl CoopTiles {
    /// `CoopMatmul::Auto`'s choice for shapes of at least 256 tiles of 128 ×
    /// 128: 128 × 256 tiles, K step 16, 2 × 4 subgroups of 64 × 64 outputs
    /// (16 accumulators each), loads four K steps ahead. The fastest of the
    /// configurations timed at 2048³, 4096³ and 8192³ on an H100
    /// (`docs/benchmarks.md`).
    pub const AUTO_LARGE: CoopTiles = CoopTiles { ahead: 4, ..CoopTiles::plain(128, 256, 16, 2, 4) };
    /// `CoopMatmul::Auto`'s choice below: 64 × 64 tiles, K step 32, 2 × 2
    /// subgroups of 32 × 32 outputs (not tuned: more workgroups for shapes
    /// that would leave most of the GPU idle with large tiles).
    pub const AUTO_SMALL: CoopTiles = CoopTiles::plain(64, 64, 32, 2, 2);

    const fn plain(tile_m: u32, tile_n: u32, k_step: u32, warps_m: u32, warps_n: u32) -> CoopTiles {
        CoopTiles { tile_m, tile_n, k_step, warps_m, warps_n, ahead: 1 }
    }

    /// The configuration, or `None` where the kernel has none: tiles of 32 to
    /// 256 (powers of two), 1, 2 or 4 subgroups along each side each holding 1,
    /// 2 or 4 accumulators along it, at most 8 subgroups, K step 16, 32 or 64,
    /// and tiles whose units of 4 halves divide evenly among the invocations.
    /// (Whether its tiles fit a device's workgroup memory is the planner's
    /// question.)
    pub fn new(tile_m: u32, tile_n: u32, k_step: u32, warps_m: u32, warps_n: u32) -> Option<CoopTiles> {
        let side = |tile: u32, warps: u32| {
            matches!(warps, 1 | 2 | 4) && tile.is_multiple_of(16 * warps) && matches!(tile / (16 * warps), 1 | 2 | 4)
        };
        let threads = 32 * warps_m * warps_n;
        let valid = side(tile_m, warps_m)
            && side(tile_n, warps_n)
            && matches!(k_step, 16 | 32 | 64)
            && threads <= 256
            && (tile_m * k_step / 4).is_multiple_of(threads)
            && (tile_n * k_step / 4).is_multiple_of(threads);
        valid.then_some(CoopTiles::plain(tile_m, tile_n, k_step, warps_m, warps_n))
    }

    /// The configurations a tuning sweep tries: [`CoopTiles::AUTO_LARGE`],
    /// [`CoopTiles::AUTO_SMALL`], and other tile shapes of 4 or 8 subgroups
    /// whose tiles fit 48 KiB of workgroup memory with either operand
    /// transposed, each with its loads one and two steps ahead, and the
    /// shapes of one workgroup per multiprocessor also three and four ahead.
    pub fn all() -> Vec<CoopTiles> {
        let names = [
            "coop-128x128-32-w2x4",
            "coop-64x64-32-w2x2",
            "coop-128x128-32-w2x2",
            "coop-128x128-16-w2x4",
            "coop-128x256-16-w2x4",
            "coop-256x128-16-w4x2",
            "coop-128x64-32-w4x2",
            "coop-64x64-64-w2x2",
        ];
        let deep = ["coop-128x128-32-w2x4", "coop-128x128-16-w2x4", "coop-128x256-16-w2x4"];
        let ahead = |n: &&str, steps: &'static [u32]| {
            let t = CoopTiles::parse(n);
            steps.iter().filter_map(move |&s| t.and_then(|t| t.with_ahead(s)))
        };
        let mut v: Vec<CoopTiles> = names.iter().flat_map(|n| ahead(n, &[1, 2])).collect();
        v.extend(deep.iter().flat_map(|n| ahead(n, &[3, 4])));
        v
    }

    /// The same with each K step's loads `steps` K steps ahead of its
    /// multiply (1 to 4; `None` otherwise).
    pub fn with_ahead(mut self, steps: u32) -> Option<CoopTiles> {
        self.ahead = steps;
        (1..=4).contains(&steps).then_some(self)
    }

    /// How many K steps ahead of its multiply each step's loads go out (1 to 4).
    pub fn ahead(self) -> u32 {
        self.ahead
    }

    /// Rows of C per workgroup.
    pub fn tile_m(self) -> u32 {
        self.tile_m
    }

    /// Columns of C per workgroup.
    pub fn tile_n(self) -> u32 {
        self.tile_n
    }

    /// K step (16 or 32).
    pub fn k_step(self) -> u32 {
        self.k_step
    }

    /// Subgroups along m.
    pub fn warps_m(self) -> u32 {
        self.warps_m
    }

    /// Subgroups along n.
    pub fn warps_n(self) -> u32 {
        self.warps_n
    }

    /// Subgroups per workgroup.
    pub fn warps(self) -> u32 {
        self.warps_m * self.warps_n
    }

    /// Invocations per workgroup (32 per subgroup).
    pub fn threads(self) -> u32 {
        32 * self.warps()
    }

    /// Parses the [`Display`](std::fmt::Display) form,
    /// `coop-<m>x<n>-<k step>-w<warps m>x<warps n>[-ahead[N]]` (`-ahead`:
    /// two steps ahead; `-ahead3`, `-ahead4`; none: one).
    pub fn parse(name: &str) -> Option<CoopTiles> {
        let name = name.trim().to_ascii_lowercase();
        let mut parts = name.strip_prefix("coop-")?.split('-');
        let (m, n) = parts.next()?.split_once('x')?;
        let k = parts.next()?.parse().ok()?;
        let (wm, wn) = parts.next()?.strip_prefix('w')?.split_once('x')?;
        let t = CoopTiles::new(m.parse().ok()?, n.parse().ok()?, k, wm.parse().ok()?, wn.parse().ok()?)?;
        match parts.next() {
            None => Some(t),
            Some(a) if parts.next().is_none() => match a.strip_prefix("ahead")? {
                "" => t.with_ahead(2),
                n @ ("3" | "4") => t.with_ahead(n.parse().ok()?),
                _ => None,
            },
            Some(_) => None,
        }
    }
}

impl std::fmt::Display for CoopTiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "coop-{}x{}-{}-w{}x{}", self.tile_m, self.tile_n, self.k_step, self.warps_m, self.warps_n)?;
        match self.ahead {
            1 => {}
            2 => f.write_str("-ahead")?,
            n => write!(f, "-ahead{n}")?,
        }
        Ok(())
    }
}

/// Whether `f16` matmuls take the cooperative-matrix kernel where the device
/// runs it ([`crate::WgpuBackend::cooperative_matrix`]); everywhere else, and
/// for shapes it does not take, they run the `f32` kernels on widened inputs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CoopMatmul {
    /// The configuration by the number of tiles ([`CoopTiles::AUTO_LARGE`]
    /// from 256 tiles of 128 × 128, else [`CoopTiles::AUTO_SMALL`]).
    #[default]
    Auto,
    /// Never: `f16` matmuls always run the `f32` kernels.
    Off,
    /// Always this configuration where the kernel applies.
    Tiles(CoopTiles),
}

impl CoopMatmul {
    /// Parses `auto`, `off` or a [`CoopTiles`] name.
    pub fn parse(name: &str) -> Option<CoopMatmul> {
        match name.trim().to_ascii_lowercase().as_str() {
            "auto" => Some(CoopMatmul::Auto),
            "off" | "0" | "simt" => Some(CoopMatmul::Off),
            other => CoopTiles::parse(other).map(CoopMatmul::Tiles),
        }
    }
}

impl std::fmt::Display for CoopMatmul {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CoopMatmul::Auto => f.write_str("auto"),
            CoopMatmul::Off => f.write_str("off"),
            CoopMatmul::Tiles(t) => t.fmt(f),
        }
    }
}

/// How [`crate::WgpuBackend`] chooses and opens its device. Building one costs nothing.
///
/// By default the backend searches every compiled-in API, prefers a discrete
/// GPU, then an integrated or virtual one, and takes a software adapter (such
/// as lavapipe) only when nothing else exists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceOptions {
    /// Only this API (`None`: all of them).
    pub backend: Option<GpuApi>,
    /// Only adapters whose name contains this text (case-insensitive).
    pub adapter_name: Option<String>,
    /// Exactly the adapter of this index in [`crate::adapters`]'s list (for
    /// the same `backend`), whatever its type (`None`: the best one).
    pub adapter_index: Option<usize>,
    /// Whether a software (CPU) adapter may be used when no hardware adapter matches.
    pub allow_fallback: bool,
    /// Whether the matmul and attention shaders keep naga's runtime bounds
    /// checks. Off by default: the kernels check every global index themselves
    /// (see `shaders/matmul.wgsl` and `shaders/attention.wgsl`), and the checks
    /// cost time in their inner loops (with them, attention ran at two thirds of
    /// its speed on an H200).
    pub matmul_bounds_checks: bool,
    /// Caps the storage binding size below the adapter's (bytes), so that ops are
    /// split (or refused) as on a smaller device: for tests of the splitting paths.
    pub max_binding_bytes: Option<u64>,
    /// Matmul tiling (for tuning and benchmarks; `Auto` by default).
    pub matmul_tiles: MatmulTiles,
    /// The cooperative-matrix matmul of `f16` inputs (`Auto` by default;
    /// devices without cooperative matrices never run it).
    pub matmul_coop: CoopMatmul,
}

impl Default for DeviceOptions {
    fn default() -> Self {
        DeviceOptions {
            backend: None,
            adapter_name: None,
            adapter_index: None,
            allow_fallback: true,
            matmul_bounds_checks: false,
            max_binding_bytes: None,
            matmul_tiles: MatmulTiles::Auto,
            matmul_coop: CoopMatmul::Auto,
        }
    }
}

impl DeviceOptions {
    /// The defaults, overridden by the environment:
    /// `COMPUTE_WGPU_BACKEND` (`vulkan`, `metal`, `dx12`, `webgpu`),
    /// `COMPUTE_WGPU_ADAPTER` (part of the adapter's name),
    /// `COMPUTE_WGPU_ALLOW_FALLBACK` (`0` refuses software adapters),
    /// `COMPUTE_WGPU_MATMUL_CHECKS` (`1` keeps naga's bounds checks in matmul
    /// and attention),
    /// `COMPUTE_WGPU_MATMUL_TILES` (`auto`, `small`, `tiled-128x128-8`…:
    /// [`MatmulTiles::parse`]; anything else is `auto`),
    /// `COMPUTE_WGPU_MATMUL_COOP` (`auto`, `off`, `coop-128x128-32-w2x2`…:
    /// [`CoopMatmul::parse`]; anything else is `auto`).
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let flag = |k: &str, default: bool| var(k).map_or(default, |v| !matches!(v.trim(), "0" | "false" | "no"));
        DeviceOptions {
            backend: var("COMPUTE_WGPU_BACKEND").and_then(|v| GpuApi::parse(&v)),
            adapter_name: var("COMPUTE_WGPU_ADAPTER"),
            adapter_index: var("COMPUTE_WGPU_ADAPTER_INDEX").and_then(|v| v.trim().parse().ok()),
            allow_fallback: flag("COMPUTE_WGPU_ALLOW_FALLBACK", true),
            matmul_bounds_checks: flag("COMPUTE_WGPU_MATMUL_CHECKS", false),
            max_binding_bytes: None,
            matmul_tiles: var("COMPUTE_WGPU_MATMUL_TILES").and_then(|v| MatmulTiles::parse(&v)).unwrap_or_default(),
            matmul_coop: var("COMPUTE_WGPU_MATMUL_COOP").and_then(|v| CoopMatmul::parse(&v)).unwrap_or_default(),
        }
    }

    /// Restricts the search to one API.
    pub fn with_backend(mut self, api: GpuApi) -> Self {
        self.backend = Some(api);
        self
    }

    /// Restricts the search to adapters whose name contains `name`.
    pub fn with_adapter_name(mut self, name: impl Into<String>) -> Self {
        self.adapter_name = Some(name.into());
        self
    }

    /// Opens exactly the adapter of index `index` in [`crate::adapters`]'s list.
    pub fn with_adapter_index(mut self, index: usize) -> Self {
        self.adapter_index = Some(index);
        self
    }

    /// Allows or refuses software adapters.
    pub fn with_fallback(mut self, allow: bool) -> Self {
        self.allow_fallback = allow;
        self
    }

    /// Keeps (or drops) naga's runtime bounds checks in the matmul and attention shaders.
    pub fn with_matmul_bounds_checks(mut self, on: bool) -> Self {
        self.matmul_bounds_checks = on;
        self
    }

    /// Forces a matmul tiling.
    pub fn with_matmul_tiles(mut self, tiles: MatmulTiles) -> Self {
        self.matmul_tiles = tiles;
        self
    }

    /// Chooses the cooperative-matrix matmul of `f16` inputs (or turns it off).
    pub fn with_matmul_coop(mut self, coop: CoopMatmul) -> Self {
        self.matmul_coop = coop;
        self
    }

    /// Caps the storage binding size (bytes; at least 256 is used).
    pub fn with_max_binding_bytes(mut self, bytes: u64) -> Self {
        self.max_binding_bytes = Some(bytes);
        self
    }

    pub(crate) fn backends(&self) -> wgpu::Backends {
        match self.backend {
            Some(api) => api.backends(),
            None => {
                wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12 | wgpu::Backends::BROWSER_WEBGPU
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_api_names() {
        assert_eq!(GpuApi::parse(" Vulkan "), Some(GpuApi::Vulkan));
        assert_eq!(GpuApi::parse("d3d12"), Some(GpuApi::Dx12));
        assert_eq!(GpuApi::parse("metal"), Some(GpuApi::Metal));
        assert_eq!(GpuApi::parse("opengl"), None);
    }

    #[test]
    fn builders_set_fields() {
        let o = DeviceOptions::default().with_backend(GpuApi::Vulkan).with_adapter_name("llvm").with_fallback(false);
        assert_eq!(o.backends(), wgpu::Backends::VULKAN);
        assert_eq!(o.adapter_name.as_deref(), Some("llvm"));
        assert!(!o.allow_fallback);
        assert!(DeviceOptions::default().backends().contains(wgpu::Backends::VULKAN | wgpu::Backends::METAL));
    }

    #[test]
    fn coop_tilings_parse_from_their_names_and_refuse_what_the_kernel_lacks() {
        let all = CoopTiles::all();
        assert_eq!(all.len(), 22);
        for t in &all {
            assert_eq!(CoopTiles::parse(&t.to_string()), Some(*t));
            assert_eq!(CoopMatmul::parse(&t.to_string()), Some(CoopMatmul::Tiles(*t)));
            assert!(t.threads() <= 256 && t.threads() % 32 == 0);
            let (fm, fn_) = (t.tile_m() / (16 * t.warps_m()), t.tile_n() / (16 * t.warps_n()));
            assert!([1, 2, 4].contains(&fm) && [1, 2, 4].contains(&fn_), "{t}");
            assert_eq!((t.tile_m() * t.k_step() / 4) % t.threads(), 0, "{t}");
        }
        assert!(all.contains(&CoopTiles::AUTO_LARGE) && all.contains(&CoopTiles::AUTO_SMALL));
        assert_eq!(CoopTiles::AUTO_LARGE.to_string(), "coop-128x256-16-w2x4-ahead4");
        assert_eq!(CoopTiles::AUTO_SMALL.to_string(), "coop-64x64-32-w2x2");
        let s = CoopTiles::parse("COOP-128x256-16-w2x4-ahead").unwrap();
        assert!(s.threads() == 256 && s.tile_n() == 256 && s.k_step() == 16 && s.ahead() == 2);
        let deep = CoopTiles::parse("coop-128x128-32-w2x4-ahead4").unwrap();
        assert_eq!((deep.ahead(), deep.to_string().as_str()), (4, "coop-128x128-32-w2x4-ahead4"));
        assert_eq!(CoopTiles::parse("coop-128x128-32-w2x4-ahead3").map(CoopTiles::ahead), Some(3));
        assert_eq!(deep.with_ahead(1).map(|t| t.to_string()).as_deref(), Some("coop-128x128-32-w2x4"));
        assert_eq!(deep.with_ahead(0), None);
        assert_eq!(deep.with_ahead(5), None);
        for m in [CoopMatmul::Auto, CoopMatmul::Off] {
            assert_eq!(CoopMatmul::parse(&m.to_string()), Some(m));
        }
        assert_eq!(CoopMatmul::parse("simt"), Some(CoopMatmul::Off));
        for bad in [
            "coop-128x128-8-w2x2",
            "coop-128x128-32-w3x2",
            "coop-128x128-32-w1x1",
            "coop-512x128-16-w4x2",
            "coop-128x128-32-w4x4",
            "coop-128x128-32",
            "coop-128x128-32-w2x2-fast",
            "coop-128x128-128-w2x2",
            "coop-128x128-32-w2x2-ahead-ahead",
            "coop-128x128-32-w2x2-ahead1",
            "coop-128x128-32-w2x2-ahead2",
            "coop-128x128-32-w2x2-ahead5",
            "coop-32x64-16-w2x4",
            "tiled-128x128-8",
        ] {
            assert_eq!(CoopMatmul::parse(bad), None, "{bad}");
        }
        assert_eq!(DeviceOptions::default().matmul_coop, CoopMatmul::Auto);
        let o = DeviceOptions::default().with_matmul_coop(CoopMatmul::Off);
        assert_eq!(o.matmul_coop, CoopMatmul::Off);
    }

    #[test]
    fn matmul_tilings_parse_from_their_names() {
        let all = TiledMatmul::all();
        for t in &all {
            assert_eq!(TiledMatmul::parse(&t.to_string()), Some(*t));
            assert_eq!(MatmulTiles::parse(&t.to_string()), Some(MatmulTiles::Tiled(*t)));
            assert_eq!(t.threads(), (t.tile().0 * t.tile().1 / 64) as u32);
        }
        // 7 shapes × K steps, × (plain, split, ahead) × grouped, and 2 of them (128 columns) also with w84.
        assert_eq!(all.len(), 7 * 6 + 2 * 6);
        for m in [MatmulTiles::Auto, MatmulTiles::AutoSplitK, MatmulTiles::Small] {
            assert_eq!(MatmulTiles::parse(&m.to_string()), Some(m));
        }
        for (t, name) in [
            (TiledMatmul::AUTO_LARGE, "tiled-128x128-8-ahead-grouped-w84"),
            (TiledMatmul::AUTO_MEDIUM, "tiled-64x64-16-narrow"),
        ] {
            assert_eq!(t.to_string(), name);
            assert_eq!(TiledMatmul::parse(name), Some(t));
        }
        assert!(all.contains(&TiledMatmul::AUTO_LARGE));
        let t = TiledMatmul::parse("tiled-128x64-16-grouped-split").unwrap();
        assert_eq!((t.tile(), t.k_step(), t.split(), t.grouped(), t.warps_8x4()), ((128, 64), 16, true, true, false));
        assert_eq!(t.to_string(), "tiled-128x64-16-split-grouped");
        let t = TiledMatmul::parse("tiled-128x128-8-sk4-ahead-grouped").unwrap();
        assert_eq!(t, TiledMatmul::AUTO_LARGE.with_warps_8x4(false).and_then(|t| t.with_split_k(4)).unwrap());
        assert_eq!(t.to_string(), "tiled-128x128-8-ahead-grouped-sk4");
        assert_eq!(TiledMatmul::parse("tiled-64x64-8-sk1"), TiledMatmul::new(64, 64, 8));
        assert_eq!(TiledMatmul::AUTO_LARGE.with_split_k(3), None);
        let t = TiledMatmul::parse("tiled-128x64-16-narrow-ahead-sk2").unwrap();
        assert_eq!((t.threads(), t.narrow(), t.split_k()), (256, true, 2));
        assert_eq!(t.to_string(), "tiled-128x64-16-ahead-narrow-sk2");
        assert_eq!(TiledMatmul::parse("tiled-64x64-8-narrow").map(|t| t.threads()), Some(128));
        for bad in [
            "tiled-128x32-16",
            "tiled-64x128-8",
            "tiled-128x128-4",
            "tiled-128x128-8-fast",
            "tiled-128x128",
            "tiled-128x64-8-w84",
            "tiled-128x128-8-split-ahead",
            "tiled-256-8",
            "tiled-128x128-8-sk3",
            "tiled-128x64-8-narrow",
            "tiled-128x128-16-w84-narrow",
            "tiled-128x128-16-narrow",
            "tiled-128x128-8-sk8",
            "large",
            "big",
        ] {
            assert_eq!(MatmulTiles::parse(bad), None, "{bad}");
        }
    }
}
