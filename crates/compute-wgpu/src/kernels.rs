//! The WGSL kernels (from the top-level `shaders/` folder, compiled into the
//! binary) and the per-device cache of their compute pipelines.
//!
//! A shader module is compiled once per device on first use; each
//! (entry point, pipeline-overridable constants) pair becomes one pipeline,
//! compiled once and kept for the device's life.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use compute_core::{ComputeError, Result};

use crate::context::Context;
use crate::errors::KIND;
use crate::options::{MatmulTiles, TiledMatmul};

/// One WGSL source file: a family of ops.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Module {
    Elementwise,
    Reduce,
    Rows,
    Matmul,
    Conv,
}

impl Module {
    fn source(self) -> &'static str {
        match self {
            Module::Elementwise => include_str!("../../../shaders/elementwise.wgsl"),
            Module::Reduce => include_str!("../../../shaders/reduce.wgsl"),
            Module::Rows => include_str!("../../../shaders/rows.wgsl"),
            Module::Matmul => include_str!("../../../shaders/matmul.wgsl"),
            Module::Conv => include_str!("../../../shaders/conv.wgsl"),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Module::Elementwise => "elementwise.wgsl",
            Module::Reduce => "reduce.wgsl",
            Module::Rows => "rows.wgsl",
            Module::Matmul => "matmul.wgsl",
            Module::Conv => "conv.wgsl",
        }
    }
}

/// The matmul entry points of `matmul.wgsl`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum MatmulKernel {
    /// 64 × 64 tiles, 4 × 4 per invocation, vec4 loads (aligned shapes).
    Small,
    /// 64 × 64 tiles, scalar loads (any shape).
    Scalar,
    /// `matmul_tiled` in the given configuration (aligned shapes).
    Tiled(TiledMatmul),
}

impl MatmulKernel {
    /// Rows and columns of C per workgroup.
    pub(crate) fn tile(self) -> (u64, u64) {
        match self {
            MatmulKernel::Small | MatmulKernel::Scalar => (64, 64),
            MatmulKernel::Tiled(t) => t.tile(),
        }
    }
}

/// One compute pipeline: an entry point with its constants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Kernel {
    /// `elementwise.wgsl` `unary`, op code.
    Unary(u32),
    /// `elementwise.wgsl` `binary`, op code.
    Binary(u32),
    /// `reduce.wgsl` `partials`, op code.
    ReducePartials(u32),
    /// `reduce.wgsl` `finish`, op code.
    ReduceFinish(u32),
    /// `rows.wgsl` `softmax`: 0 softmax, 1 log_softmax.
    Softmax(u32),
    /// `rows.wgsl` `layer_norm`.
    LayerNorm,
    /// `rows.wgsl` `rms_norm`.
    RmsNorm,
    /// `matmul.wgsl`: which tiling, transposes; `checked`: compiled with naga's
    /// runtime bounds checks.
    Matmul { tiles: MatmulKernel, ta: bool, tb: bool, checked: bool },
    /// `matmul.wgsl` `matmul_reduce`: sums `sk` split-K partials into C;
    /// `checked` as for the matmul it finishes (same module).
    MatmulReduce { sk: u32, checked: bool },
    /// `conv.wgsl` `conv2d`.
    Conv2d,
}

impl Kernel {
    fn module(self) -> Module {
        match self {
            Kernel::Unary(_) | Kernel::Binary(_) => Module::Elementwise,
            Kernel::ReducePartials(_) | Kernel::ReduceFinish(_) => Module::Reduce,
            Kernel::Softmax(_) | Kernel::LayerNorm | Kernel::RmsNorm => Module::Rows,
            Kernel::Matmul { .. } | Kernel::MatmulReduce { .. } => Module::Matmul,
            Kernel::Conv2d => Module::Conv,
        }
    }

    fn entry(self) -> &'static str {
        match self {
            Kernel::Unary(_) => "unary",
            Kernel::Binary(_) => "binary",
            Kernel::ReducePartials(_) => "partials",
            Kernel::ReduceFinish(_) => "finish",
            Kernel::Softmax(_) => "softmax",
            Kernel::LayerNorm => "layer_norm",
            Kernel::RmsNorm => "rms_norm",
            Kernel::Matmul { tiles: MatmulKernel::Small, .. } => "matmul_vec4_small",
            Kernel::Matmul { tiles: MatmulKernel::Scalar, .. } => "matmul_scalar",
            Kernel::Matmul { tiles: MatmulKernel::Tiled(_), .. } => "matmul_tiled",
            Kernel::MatmulReduce { .. } => "matmul_reduce",
            Kernel::Conv2d => "conv2d",
        }
    }

    fn constants(self) -> Vec<(&'static str, f64)> {
        let flag = |b: bool| if b { 1.0 } else { 0.0 };
        match self {
            Kernel::Unary(op)
            | Kernel::Binary(op)
            | Kernel::ReducePartials(op)
            | Kernel::ReduceFinish(op)
            | Kernel::Softmax(op) => vec![("OP", f64::from(op))],
            Kernel::Matmul { ta, tb, tiles: MatmulKernel::Tiled(t), .. } => {
                let mut c = vec![("TA", flag(ta)), ("TB", flag(tb))];
                c.extend(t.override_constants());
                c
            }
            Kernel::MatmulReduce { sk, .. } => vec![("SK", f64::from(sk))],
            Kernel::Matmul { ta, tb, .. } => vec![("TA", flag(ta)), ("TB", flag(tb))],
            Kernel::LayerNorm | Kernel::RmsNorm | Kernel::Conv2d => Vec::new(),
        }
    }

    /// Whether this kernel's module is compiled without naga's runtime checks.
    fn unchecked(self) -> bool {
        matches!(self, Kernel::Matmul { checked: false, .. } | Kernel::MatmulReduce { checked: false, .. })
    }
}

/// A compiled pipeline and its bind group layout (group 0).
#[derive(Clone, Debug)]
pub(crate) struct Compiled {
    pub(crate) pipeline: wgpu::ComputePipeline,
    pub(crate) layout: wgpu::BindGroupLayout,
}

/// How matmuls are compiled: naga's checks, tiling. Switchable while the device lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MatmulChoice {
    /// Whether matmul keeps naga's runtime bounds checks.
    pub(crate) checked: bool,
    /// Which matmul tiling aligned shapes use.
    pub(crate) tiles: MatmulTiles,
}

/// Per-device cache of shader modules and pipelines.
#[derive(Debug)]
pub(crate) struct Kernels {
    matmul: Mutex<MatmulChoice>,
    modules: Mutex<HashMap<(Module, bool), wgpu::ShaderModule>>,
    pipelines: Mutex<HashMap<Kernel, Compiled>>,
}

fn compile_error(kernel: &str, e: impl std::fmt::Display) -> ComputeError {
    ComputeError::Compile { backend: KIND, kernel: kernel.to_string(), message: e.to_string() }
}

impl Kernels {
    pub(crate) fn new(matmul: MatmulChoice) -> Self {
        Kernels {
            matmul: Mutex::new(matmul),
            modules: Mutex::new(HashMap::new()),
            pipelines: Mutex::new(HashMap::new()),
        }
    }

    /// The current matmul choice.
    pub(crate) fn matmul(&self) -> MatmulChoice {
        match self.matmul.lock() {
            Ok(m) => *m,
            Err(poisoned) => *poisoned.into_inner(),
        }
    }

    /// Changes the matmul choice for ops planned from now on.
    pub(crate) fn set_matmul(&self, choice: MatmulChoice) {
        match self.matmul.lock() {
            Ok(mut m) => *m = choice,
            Err(poisoned) => *poisoned.into_inner() = choice,
        }
    }

    /// The pipeline for `kernel`, compiled on first use (milliseconds; a cache hit costs a map lookup).
    pub(crate) fn get(&self, ctx: &Context, kernel: Kernel) -> Result<Compiled> {
        let poisoned = |_| compile_error(kernel.entry(), "pipeline cache lock poisoned");
        if let Some(c) = self.pipelines.lock().map_err(poisoned)?.get(&kernel) {
            return Ok(c.clone());
        }
        let module = self.module(ctx, kernel.module(), kernel.unchecked())?;
        let constants = kernel.constants();
        let scope = ctx.scope();
        let pipeline = ctx.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(kernel.entry()),
            layout: None,
            module: &module,
            entry_point: Some(kernel.entry()),
            compilation_options: wgpu::PipelineCompilationOptions {
                constants: &constants,
                // Every kernel writes its workgroup memory before reading it.
                zero_initialize_workgroup_memory: false,
            },
            cache: None,
        });
        let layout = pipeline.get_bind_group_layout(0);
        scope.end_now("compile", 0).map_err(|e| compile_error(kernel.entry(), e))?;
        let compiled = Compiled { pipeline, layout };
        self.pipelines.lock().map_err(poisoned)?.insert(kernel, compiled.clone());
        Ok(compiled)
    }

    /// Whether every kernel of `kernels` has its pipeline compiled. One lock.
    pub(crate) fn has_all(&self, kernels: &[Kernel]) -> Result<bool> {
        let have = self.pipelines.lock().map_err(|_| compile_error("prepare", "pipeline cache lock poisoned"))?;
        Ok(kernels.iter().all(|k| have.contains_key(k)))
    }

    /// Compiles every kernel of `kernels` not compiled yet: first their shader
    /// modules, then their pipelines, each stage on up to [`COMPILE_THREADS`]
    /// threads (one at a time in the browser). Costs what their first uses
    /// would, spread over the threads; nothing when all are cached.
    pub(crate) fn compile_all(&self, ctx: &Context, kernels: &[Kernel]) -> Result<()> {
        let poisoned = |_| compile_error("prepare", "pipeline cache lock poisoned");
        let missing: Vec<Kernel> = {
            let have = self.pipelines.lock().map_err(poisoned)?;
            let mut seen = HashSet::new();
            kernels.iter().copied().filter(|k| !have.contains_key(k) && seen.insert(*k)).collect()
        };
        let mut seen = HashSet::new();
        let modules: Vec<(Module, bool)> =
            missing.iter().map(|k| (k.module(), k.unchecked())).filter(|m| seen.insert(*m)).collect();
        on_threads(&modules, |&(m, u)| self.module(ctx, m, u).map(drop))?;
        on_threads(&missing, |&k| self.get(ctx, k).map(drop))
    }

    fn module(&self, ctx: &Context, module: Module, unchecked: bool) -> Result<wgpu::ShaderModule> {
        let poisoned = |_| compile_error(module.name(), "module cache lock poisoned");
        if let Some(m) = self.modules.lock().map_err(poisoned)?.get(&(module, unchecked)) {
            return Ok(m.clone());
        }
        let desc = wgpu::ShaderModuleDescriptor {
            label: Some(module.name()),
            source: wgpu::ShaderSource::Wgsl(module.source().into()),
        };
        let scope = ctx.scope();
        let compiled = if unchecked {
            // SAFETY: only `matmul.wgsl` is compiled unchecked. Its kernels compare every
            // global index against the matrix extents (m, k, n) before using it (also the
            // loads of `matmul_tiled` past the last K step; with split-K the loads compare k
            // against the end of the workgroup's slice, which is at most k; its regrouped tile
            // coordinates stay inside the grid), the host validates that each binding holds
            // the batch × extents it is told (`plan.rs`; for split-K the scratch binding holds
            // exactly the grid's matrices · slices partial matrices that the tiled kernel
            // writes and `matmul_reduce` reads, and `matmul_reduce` skips invocations past the
            // vec4s it is told, whose C range the host checks), workgroup indices are below the
            // arrays' sizes by construction (bounds stated in the shader), private arrays
            // (accumulators, loads in flight) are indexed by literals only, and every loop
            // runs a finite number of steps bounded by k. So no access can leave its binding
            // and no loop can run forever: the two things the dropped checks guard against.
            unsafe { ctx.device.create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked()) }
        } else {
            ctx.device.create_shader_module(desc)
        };
        scope.end_now("compile", 0).map_err(|e| compile_error(module.name(), e))?;
        self.modules.lock().map_err(poisoned)?.insert((module, unchecked), compiled.clone());
        Ok(compiled)
    }
}

/// Most threads [`Kernels::compile_all`] compiles on. Measured on the H200
/// (NVIDIA Vulkan driver 580, its pipeline cache emptied, CUDA's warm): the
/// calibration ladders' pipelines took 0.47 s on one thread and 0.21 s on 8
/// (one run each), which then hides under the CUDA backend's own compiles.
pub(crate) const COMPILE_THREADS: usize = 8;

/// Runs `f` on every item, on up to [`COMPILE_THREADS`] threads (the items
/// dealt round-robin); the first error wins. In the browser, one after the other.
fn on_threads<T: Sync>(items: &[T], f: impl Fn(&T) -> Result<()> + Sync) -> Result<()> {
    let threads = COMPILE_THREADS.min(items.len());
    if cfg!(target_arch = "wasm32") || threads <= 1 {
        return items.iter().try_for_each(f);
    }
    std::thread::scope(|scope| {
        let f = &f;
        let handles: Vec<_> =
            (0..threads).map(|t| scope.spawn(move || items.iter().skip(t).step_by(threads).try_for_each(f))).collect();
        handles
            .into_iter()
            .try_for_each(|h| h.join().unwrap_or_else(|_| Err(compile_error("prepare", "a compiling thread panicked"))))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_module_parses_and_validates_with_naga() {
        // Every GPU test compiles the shaders too; this catches WGSL errors on machines without a GPU.
        for m in [Module::Elementwise, Module::Reduce, Module::Rows, Module::Matmul, Module::Conv] {
            let module = naga::front::wgsl::parse_str(m.source())
                .unwrap_or_else(|e| panic!("{} does not parse:\n{}", m.name(), e.emit_to_string(m.source())));
            let mut validator =
                naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::default());
            if let Err(e) = validator.validate(&module) {
                panic!("{} does not validate:\n{}", m.name(), e.emit_to_string(m.source()));
            }
            assert!(!module.entry_points.is_empty(), "{} has no entry point", m.name());
        }
    }

    #[test]
    fn kernels_name_their_entry_points_and_constants() {
        assert_eq!(Kernel::Unary(3).entry(), "unary");
        assert_eq!(Kernel::Unary(3).constants(), vec![("OP", 3.0)]);
        let mm = Kernel::Matmul { tiles: MatmulKernel::Small, ta: true, tb: false, checked: false };
        assert_eq!(mm.entry(), "matmul_vec4_small");
        assert_eq!(mm.constants(), vec![("TA", 1.0), ("TB", 0.0)]);
        assert!(mm.unchecked());
        assert!(!Kernel::Unary(0).unchecked());
        let small = Kernel::Matmul { tiles: MatmulKernel::Small, ta: false, tb: true, checked: true };
        let scalar = Kernel::Matmul { tiles: MatmulKernel::Scalar, ta: false, tb: false, checked: false };
        let tiled = TiledMatmul::new(128, 64, 16).and_then(|t| t.with_split(true)).map(MatmulKernel::Tiled).unwrap();
        let tiled = Kernel::Matmul { tiles: tiled, ta: true, tb: true, checked: false };
        let want = [
            ("TBM", 128.0),
            ("TBN", 64.0),
            ("TBK", 16.0),
            ("SPLIT", 1.0),
            ("AHEAD", 0.0),
            ("GROUP", 0.0),
            ("W84", 0.0),
            ("TN", 8.0),
            ("SK", 1.0),
        ];
        assert_eq!(tiled.constants(), [[("TA", 1.0), ("TB", 1.0)].as_slice(), &want].concat());
        let reduce = Kernel::MatmulReduce { sk: 4, checked: false };
        assert_eq!(reduce.constants(), vec![("SK", 4.0)]);
        assert!(reduce.unchecked() && reduce.module() == Module::Matmul);
        let rows = [Kernel::Softmax(1), Kernel::LayerNorm, Kernel::RmsNorm, reduce];
        for k in
            [Kernel::Unary(0), Kernel::Binary(2), Kernel::ReduceFinish(0), Kernel::Conv2d, mm, small, scalar, tiled]
                .into_iter()
                .chain(rows)
        {
            assert!(k.module().source().contains(&format!("fn {}(", k.entry())), "{k:?}");
        }
    }
}
