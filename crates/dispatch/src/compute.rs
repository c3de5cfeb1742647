//! [`Compute`]: the entry point. It finds the engines of this machine, and for
//! each call predicts every engine's time with the [`CostModel`] and runs the
//! call on the fastest, falling back to the CPU if a GPU fails.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use compute_core::{
    Backend, BackendKind, ComputeError, DType, HostSlice, HostSliceMut, HostVec, Location, Op, Result, Tensor,
    check_host_call, with_f32_views,
};

use crate::async_result::AsyncGpuResult;
use crate::batch::CommandBatch;
use crate::calibrate::{self, Options};
use crate::engine::{Engine, Placement};
use crate::lane::Lane;
use crate::model::CostModel;
use crate::pool::{GpuBufferPool, GpuPoolStats};
use crate::profile::{CurveKey, Profile};
use crate::selector::{BackendSelector, SelectedBackend};

/// How [`Compute`] picks the engine of a call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Policy {
    /// The smallest predicted time of the measured [`CostModel`] (the default).
    Auto,
    /// The 5× PCIe rule ([`BackendSelector`]): the first GPU if the rule says
    /// GPU, else the CPU on all threads.
    FiveX(BackendSelector),
    /// The fixed-threshold policy: the first GPU when the workload
    /// ([`fixed_threshold_workload`]: `m·k·n` for a matmul, multiply-adds for a
    /// conv, elements otherwise) is at least this.
    Threshold(u64),
    /// Always this engine (or the CPU if it is absent).
    Fixed(Engine),
}

/// The workload [`Policy::Threshold`] compares with its threshold: `batch·m·k·n`
/// for a matmul, multiply-adds for a conv or attention, the elements moved
/// for a strided copy or a gather, the input's element count otherwise.
/// Free (arithmetic on the op's sizes).
pub fn fixed_threshold_workload(op: &Op) -> u64 {
    let u = |x: usize| x as u64;
    match *op {
        Op::Matmul(s) => u(s.batch).saturating_mul(u(s.m)).saturating_mul(u(s.k)).saturating_mul(u(s.n)),
        Op::Conv2d(_) | Op::Attention(_) | Op::QuantMatmul(_) => op.cost().flops / 2,
        Op::Unary { len, .. }
        | Op::Binary { len, .. }
        | Op::Reduce { len, .. }
        | Op::Dot { len, .. }
        | Op::Lerp { len, .. }
        | Op::Cast { len, .. } => u(len),
        Op::Rows { rows, cols, .. } | Op::Slerp { rows, cols, .. } | Op::ArgMax { rows, cols, .. } => {
            u(rows).saturating_mul(u(cols))
        }
        Op::Glu { rows, cols, .. } => u(rows).saturating_mul(u(cols)).saturating_mul(2),
        Op::Rope(r) => u(r.seq).saturating_mul(u(r.heads)).saturating_mul(u(r.head_dim)),
        Op::Copy(c) => u(c.count()),
        Op::Gather { ids, cols, .. } => u(ids).saturating_mul(u(cols)),
    }
}

/// Former name of [`fixed_threshold_workload`].
#[deprecated(since = "0.2.0", note = "renamed to `fixed_threshold_workload`")]
pub fn seed_workload(op: &Op) -> u64 {
    fixed_threshold_workload(op)
}

/// Whether an error means "this engine cannot do it" (try another) rather
/// than "this call is wrong" (report it).
pub(crate) fn worth_falling_back(e: &ComputeError) -> bool {
    !matches!(e, ComputeError::Shape { .. } | ComputeError::DType { .. } | ComputeError::WrongDevice { .. })
}

#[derive(Clone)]
pub(crate) struct Slot {
    pub(crate) engine: Engine,
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) pool: GpuBufferPool,
}

struct Inner {
    slots: Vec<Slot>,
    native: crate::discover::Native,
    policy: Policy,
    model: CostModel,
    profile: Profile,
    last: AtomicU8,
    lane: Lane,
}

/// One handle on every engine of the machine. Implements [`Backend`] (so every
/// op of the vocabulary, and the named methods of [`compute_core::Ops`], work on
/// host slices and on device tensors) by choosing an engine per call.
/// Cheap to clone (shared); `Send + Sync`.
#[derive(Clone)]
pub struct Compute {
    inner: Arc<Inner>,
}

/// [`Compute`] under its trueno-compatible name.
pub type GpuCompute = Compute;

impl std::fmt::Debug for Compute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compute")
            .field("engines", &self.engines())
            .field("policy", &self.inner.policy)
            .field("calibrated", &self.inner.profile.calibrated)
            .finish()
    }
}

/// Where [`ComputeBuilder::build`] gets its profile.
#[derive(Clone, Debug)]
enum ProfileSource {
    CacheOrCalibrate(Option<PathBuf>),
    Nominal,
    Given(Box<Profile>),
    Calibrate,
}

/// Builds a [`Compute`] from chosen engines, profile and policy.
pub struct ComputeBuilder {
    engines: Vec<(Engine, Arc<dyn Backend>)>,
    native: crate::discover::Native,
    profile: ProfileSource,
    policy: Policy,
    pool_cap_bytes: u64,
    calibration: Options,
}

impl Default for ComputeBuilder {
    fn default() -> Self {
        ComputeBuilder {
            engines: Vec::new(),
            native: Default::default(),
            // wasm32 has no clock to calibrate with and no file to cache in.
            profile: if cfg!(target_arch = "wasm32") {
                ProfileSource::Nominal
            } else {
                ProfileSource::CacheOrCalibrate(None)
            },
            policy: Policy::Auto,
            pool_cap_bytes: 256 << 20,
            calibration: Options::default(),
        }
    }
}

impl ComputeBuilder {
    /// Adds every engine present ([`crate::discover::available`]).
    pub fn discover(mut self) -> Self {
        let (found, native) = crate::discover::available_native();
        for (e, b) in found {
            self = self.engine(e, b);
        }
        self.native = native;
        self
    }

    /// Adds every engine present, opening the wgpu device without blocking
    /// ([`crate::discover::available_async`]): in the browser, the way to add
    /// WebGPU. Costs the first device opening (tens to hundreds of
    /// milliseconds of awaiting), nothing after.
    pub async fn discover_async(mut self) -> Self {
        let (found, native) = crate::discover::available_native_async().await;
        for (e, b) in found {
            self = self.engine(e, b);
        }
        self.native = native;
        self
    }

    /// Adds the CPU engines only.
    pub fn cpu(mut self) -> Self {
        self.engines.extend(crate::discover::cpu());
        self
    }

    /// Adds `backend` as `engine` (replacing an engine of that name). Engines
    /// are preferred in the order CUDA, wgpu, CPU whatever the order added.
    pub fn engine(mut self, engine: Engine, backend: Arc<dyn Backend>) -> Self {
        self.native.forget(engine);
        self.engines.retain(|(e, _)| *e != engine);
        self.engines.push((engine, backend));
        self
    }

    /// Uses `profile` as given (no cache, no measurement).
    pub fn profile(mut self, profile: Profile) -> Self {
        self.profile = ProfileSource::Given(Box::new(profile));
        self
    }

    /// Uses [`Profile::nominal`] figures (no cache, no measurement).
    pub fn nominal_profile(mut self) -> Self {
        self.profile = ProfileSource::Nominal;
        self
    }

    /// Measures a fresh profile (not saved), with the options of
    /// [`ComputeBuilder::calibration_options`].
    pub fn calibrate(mut self) -> Self {
        self.profile = ProfileSource::Calibrate;
        self
    }

    /// Options of any measurement `build` makes (default [`Options::default`]).
    pub fn calibration_options(mut self, opts: Options) -> Self {
        self.calibration = opts;
        self
    }

    /// Loads the profile from `path`, or measures and saves it there if the
    /// file is missing or was measured on other hardware (the default uses
    /// [`calibrate::cache_path`]).
    pub fn profile_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.profile = ProfileSource::CacheOrCalibrate(Some(path.into()));
        self
    }

    /// How engines are chosen (default [`Policy::Auto`]).
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Idle bytes each engine's buffer pool may keep (default 256 MiB).
    pub fn pool_cap_bytes(mut self, cap: u64) -> Self {
        self.pool_cap_bytes = cap;
        self
    }

    /// Builds it: orders the engines, gets the profile (which may measure for
    /// a few seconds on first use, see [`calibrate`]), makes one pool per engine.
    /// On wasm32 the default profile is [`Profile::nominal`] (no clock to
    /// measure with there).
    pub fn build(self) -> Result<Compute> {
        let mut engines = self.engines;
        engines.sort_by_key(|(e, _)| e.index());
        if engines.is_empty() {
            return Err(ComputeError::DeviceUnavailable {
                backend: BackendKind::Simd,
                reason: "no engine was given to the builder".into(),
            });
        }
        let key = calibrate::profile_key(&engines);
        let profile = match self.profile {
            ProfileSource::Given(p) => *p,
            ProfileSource::Nominal => {
                let named: Vec<(Engine, String)> = engines.iter().map(|(e, b)| (*e, b.device_name())).collect();
                let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
                Profile { key: key.clone(), ..Profile::nominal(&named, threads) }
            }
            ProfileSource::Calibrate => calibrate::calibrate(&engines, &self.calibration)?,
            ProfileSource::CacheOrCalibrate(path) => {
                let path = path.or_else(|| calibrate::cache_path(&key));
                match path.as_deref().and_then(|p| calibrate::load(p, &key)) {
                    Some(p) => p,
                    None => {
                        let p = calibrate::calibrate(&engines, &self.calibration)?;
                        // A read-only cache only costs a re-measurement next time.
                        if let Some(path) = &path {
                            let _ = calibrate::save(&p, path);
                        }
                        p
                    }
                }
            }
        };
        let cap = self.pool_cap_bytes;
        let slots = engines
            .into_iter()
            .map(|(engine, backend)| Slot { engine, pool: GpuBufferPool::new(backend.clone(), cap), backend })
            .collect();
        Ok(Compute::from_parts(slots, self.native, self.policy, profile))
    }
}

impl Compute {
    fn from_parts(slots: Vec<Slot>, native: crate::discover::Native, policy: Policy, profile: Profile) -> Compute {
        Compute {
            inner: Arc::new(Inner {
                slots,
                native,
                policy,
                model: CostModel::new(&profile),
                profile,
                last: AtomicU8::new(0),
                lane: Lane::new("dispatch-async"),
            }),
        }
    }

    /// Every engine present (CUDA, then wgpu, then the CPU), with the profile
    /// cached for this machine, or measured now (a few seconds, once) and
    /// cached; [`Policy::Auto`]. Never fails for lack of a GPU: the CPU is
    /// always there.
    pub fn auto() -> Result<Compute> {
        ComputeBuilder::default().discover().build()
    }

    /// Every engine present, the wgpu device opened without blocking: the
    /// browser's way to reach WebGPU (where [`Compute::auto`] finds only the
    /// CPU, unless the device was opened before). Profile and policy as
    /// [`Compute::auto`]; on wasm32, [`Profile::nominal`] figures. Costs the
    /// first device opening, then as [`Compute::auto`].
    pub async fn auto_async() -> Result<Compute> {
        ComputeBuilder::default().discover_async().await.build()
    }

    /// The CPU engines only, with their cached or freshly measured profile.
    pub fn cpu() -> Result<Compute> {
        ComputeBuilder::default().cpu().build()
    }

    /// A builder with no engine yet.
    pub fn builder() -> ComputeBuilder {
        ComputeBuilder::default()
    }

    /// The same engines, pools and profile under another policy.
    pub fn with_policy(&self, policy: Policy) -> Compute {
        Compute::from_parts(self.inner.slots.clone(), self.inner.native.clone(), policy, self.inner.profile.clone())
    }

    /// The same engines and pools with another profile.
    pub fn with_profile(&self, profile: Profile) -> Compute {
        Compute::from_parts(self.inner.slots.clone(), self.inner.native.clone(), self.inner.policy, profile)
    }

    /// Whether a GPU engine is present.
    pub fn is_gpu(&self) -> bool {
        self.inner.slots.iter().any(|s| s.engine.is_gpu())
    }

    /// The engines present, in preference order.
    pub fn engines(&self) -> Vec<Engine> {
        self.inner.slots.iter().map(|s| s.engine).collect()
    }

    /// The backend families present (`cuda`, `wgpu`, `simd`), in preference order.
    pub fn backends(&self) -> Vec<BackendKind> {
        let mut kinds: Vec<BackendKind> = Vec::new();
        for s in &self.inner.slots {
            if !kinds.contains(&s.engine.kind()) {
                kinds.push(s.engine.kind());
            }
        }
        kinds
    }

    /// The engine that ran the most recent call of this handle (or any clone
    /// of it); `None` before the first call.
    pub fn last_engine(&self) -> Option<Engine> {
        match self.inner.last.load(Ordering::Relaxed) {
            0 => None,
            i => Engine::from_index(i as usize - 1),
        }
    }

    /// The backend family of [`Compute::last_engine`].
    pub fn last_backend(&self) -> Option<BackendKind> {
        self.last_engine().map(Engine::kind)
    }

    /// The profile in use.
    pub fn profile(&self) -> &Profile {
        &self.inner.profile
    }

    /// The cost model in use.
    pub fn model(&self) -> &CostModel {
        &self.inner.model
    }

    /// The policy in use.
    pub fn policy(&self) -> Policy {
        self.inner.policy
    }

    /// The backend of `engine`, if present.
    pub fn backend(&self, engine: Engine) -> Option<Arc<dyn Backend>> {
        self.slot(engine).map(|s| s.backend.clone())
    }

    /// The buffer pool of `engine`, if present.
    pub fn pool(&self, engine: Engine) -> Option<&GpuBufferPool> {
        self.slot(engine).map(|s| &s.pool)
    }

    /// Counters of `engine`'s pool (all zero if absent).
    pub fn pool_stats(&self, engine: Engine) -> GpuPoolStats {
        self.pool(engine).map(|p| p.stats()).unwrap_or_default()
    }

    /// The first GPU engine, if any.
    pub fn first_gpu(&self) -> Option<Engine> {
        self.inner.slots.iter().map(|s| s.engine).find(|e| e.is_gpu())
    }

    /// The preferred engine: the first GPU, else the CPU. [`Backend::upload`]
    /// and [`Backend::alloc`] put tensors there.
    pub fn primary(&self) -> Engine {
        self.inner.slots.first().map_or(Engine::Simd, |s| s.engine)
    }

    /// The typed wgpu backend, when discovered (not when given to the builder).
    #[cfg(any(feature = "gpu", feature = "gpu-wasm"))]
    pub(crate) fn native_wgpu(&self) -> Option<&compute_wgpu::WgpuBackend> {
        self.inner.native.wgpu.as_ref()
    }

    pub(crate) fn slot(&self, engine: Engine) -> Option<&Slot> {
        self.inner.slots.iter().find(|s| s.engine == engine)
    }

    fn cpu_engine(&self) -> Engine {
        self.inner.slots.iter().map(|s| s.engine).find(|e| !e.is_gpu()).unwrap_or_else(|| self.primary())
    }

    fn unavailable(engine: Engine) -> ComputeError {
        ComputeError::DeviceUnavailable {
            backend: engine.kind(),
            reason: format!("engine `{engine}` is not part of this Compute"),
        }
    }

    /// The engine the policy picks for `op` with data at `placement`, among the
    /// engines that support it. Allocation-free; under a microsecond with four
    /// engines (measured by `cargo xtask bench --dispatch`).
    pub fn choose(&self, op: &Op, placement: Placement) -> Engine {
        self.choose_among(op, placement, |_| true)
    }

    fn choose_among(&self, op: &Op, placement: Placement, allowed: impl Fn(Engine) -> bool) -> Engine {
        let fallback = self.cpu_engine();
        let ok = |s: &&Slot| allowed(s.engine) && s.backend.supports(op);
        let first_gpu = || self.inner.slots.iter().filter(ok).map(|s| s.engine).find(|e| e.is_gpu());
        let usable = |e: Engine| self.inner.slots.iter().filter(ok).any(|s| s.engine == e);
        let cpu = if usable(Engine::Simd) { Engine::Simd } else { fallback };
        match self.inner.policy {
            Policy::Auto => {
                let key = CurveKey::of(op);
                let cost = op.cost();
                let model = &self.inner.model;
                let times = self
                    .inner
                    .slots
                    .iter()
                    .filter(ok)
                    .filter_map(|s| model.predict_cost(s.engine, key, &cost, placement).map(|t| (s.engine, t)));
                crate::model::pick(times).map_or(cpu, |(e, _)| e)
            }
            Policy::FiveX(sel) => match sel.select_for_op(op) {
                SelectedBackend::Gpu => first_gpu().unwrap_or(cpu),
                SelectedBackend::Simd => cpu,
            },
            Policy::Threshold(t) if fixed_threshold_workload(op) >= t => first_gpu().unwrap_or(cpu),
            Policy::Threshold(_) => cpu,
            Policy::Fixed(e) if usable(e) => e,
            Policy::Fixed(_) => cpu,
        }
    }

    /// `engine`, or where blocking calls are unavailable (wasm32) and it is
    /// a GPU, the engine the policy picks among the CPU ones. Free.
    fn sync_engine(&self, engine: Engine, op: &Op) -> Engine {
        if crate::runtime::sync_available() || !engine.is_gpu() {
            return engine;
        }
        self.choose_among(op, Placement::Host, |e| !e.is_gpu())
    }

    pub(crate) fn record(&self, engine: Engine) {
        self.inner.last.store(engine.index() as u8 + 1, Ordering::Relaxed);
    }

    /// Runs an `f32` op on host data on `engine` exactly (no choice, no fallback).
    pub fn run_on(&self, engine: Engine, op: &Op, inputs: &[&[f32]], output: &mut [f32]) -> Result<()> {
        with_f32_views(inputs, |views| self.run_on_typed(engine, op, views, HostSliceMut::F32(output)))
    }

    /// Runs `op` on host data of any dtype on `engine` exactly (no choice, no fallback).
    pub fn run_on_typed(
        &self,
        engine: Engine,
        op: &Op,
        inputs: &[HostSlice<'_>],
        output: HostSliceMut<'_>,
    ) -> Result<()> {
        let slot = self.slot(engine).ok_or_else(|| Self::unavailable(engine))?;
        slot.backend.run_typed(op, inputs, output)?;
        self.record(engine);
        Ok(())
    }

    /// Runs `op` on `first`; if that engine fails for a reason other than the
    /// call itself (unsupported, a dtype it cannot do, out of memory, device
    /// lost…), runs it on the CPU.
    pub(crate) fn run_with_fallback(
        &self,
        first: Engine,
        op: &Op,
        inputs: &[HostSlice<'_>],
        mut out: HostSliceMut<'_>,
    ) -> Result<()> {
        match self.run_on_typed(first, op, inputs, out.reborrow()) {
            Err(e) if worth_falling_back(&e) && first != self.cpu_engine() => {
                self.run_on_typed(self.cpu_engine(), op, inputs, out)
            }
            r => r,
        }
    }

    /// [`Compute::run_with_fallback`] on `f32` slices.
    pub(crate) fn run_f32_with_fallback(
        &self,
        first: Engine,
        op: &Op,
        inputs: &[&[f32]],
        out: &mut [f32],
    ) -> Result<()> {
        with_f32_views(inputs, |views| self.run_with_fallback(first, op, views, HostSliceMut::F32(out)))
    }

    /// Runs `op` on host data and returns a new output vector.
    pub fn run_vec(&self, op: &Op, inputs: &[&[f32]]) -> Result<Vec<f32>> {
        let mut out = vec![0.0f32; op.layout()?.output_len()];
        self.run(op, inputs, &mut out)?;
        Ok(out)
    }

    /// Starts `op` on owned host data and returns at once: the call runs on
    /// this handle's worker thread (on the engine it chooses, GPU or CPU) while
    /// the caller goes on. Shapes are checked before it is queued.
    pub fn run_async(&self, op: Op, inputs: Vec<Vec<f32>>) -> Result<AsyncGpuResult<Vec<f32>>> {
        let lens: Vec<usize> = inputs.iter().map(|v| v.len()).collect();
        let layout = op.check(&lens, op.layout()?.output_len())?;
        let engine = self.choose(&op, Placement::Host);
        let (result, completer) = AsyncGpuResult::channel(op.name(), engine.kind());
        let this = self.clone();
        let job = Box::new(move || {
            let refs: Vec<&[f32]> = inputs.iter().map(|v| v.as_slice()).collect();
            let mut out = vec![0.0f32; layout.output_len()];
            let r = this.run_f32_with_fallback(engine, &op, &refs, &mut out).map(|()| out);
            completer.complete(r);
        });
        if let Err(job) = self.inner.lane.submit(job) {
            // No worker thread could be started: run here, still delivering through the result.
            job();
        }
        Ok(result)
    }

    /// Queues a closure on this handle's worker thread (used by the scheduler).
    pub(crate) fn spawn(&self, job: crate::lane::Job) {
        if let Err(job) = self.inner.lane.submit(job) {
            job();
        }
    }

    /// Where new tensors of `dtype` live: the primary engine (the first GPU,
    /// else the CPU) when it computes that dtype, else the CPU, so that ops on
    /// them can run (a GPU without half kernels would refuse every one).
    pub fn home_for(&self, dtype: DType) -> Engine {
        let primary = self.primary();
        let probe = Op::unary(compute_core::UnaryOp::Relu, 1).with_dtype(dtype);
        match self.slot(primary) {
            Some(s) if s.backend.supports(&probe) => primary,
            _ => self.cpu_engine(),
        }
    }

    /// Uploads `f32` `data` to `engine`'s memory.
    pub fn upload_to(&self, engine: Engine, data: &[f32]) -> Result<Tensor> {
        self.upload_typed_to(engine, HostSlice::F32(data))
    }

    /// Uploads `data` of any dtype to `engine`'s memory.
    pub fn upload_typed_to(&self, engine: Engine, data: HostSlice<'_>) -> Result<Tensor> {
        self.slot(engine).ok_or_else(|| Self::unavailable(engine))?.backend.upload_typed(data)
    }

    /// Runs `op` on tensors and returns a new output tensor on the device of
    /// the first input.
    pub fn apply(&self, op: &Op, inputs: &[&Tensor]) -> Result<Tensor> {
        let home = inputs.first().map(|t| Engine::home_of(t.location().backend)).unwrap_or_else(|| self.primary());
        let out = op.layout()?.output();
        let out = self.slot(home).ok_or_else(|| Self::unavailable(home))?.backend.alloc_typed(out.len, out.dtype)?;
        self.run_tensors(op, inputs, &out)?;
        Ok(out)
    }

    /// A command batch on this handle: upload, chained ops, one execute, read.
    pub fn batch(&self) -> CommandBatch {
        CommandBatch::new(self)
    }

    /// Measures a new profile of this handle's engines (not saved; see
    /// [`calibrate::run_and_save`]).
    pub fn calibrate(&self, opts: &Options) -> Result<Profile> {
        let engines: Vec<(Engine, Arc<dyn Backend>)> =
            self.inner.slots.iter().map(|s| (s.engine, s.backend.clone())).collect();
        calibrate::calibrate(&engines, opts)
    }

    /// A tensor op that no engine at the output's memory supports (a GPU
    /// without kernels for its dtype): computed on the CPU into a new tensor,
    /// then copied into `output` by a same-dtype cast where `output` lives.
    /// Costs the round trip of the inputs and the output through the host.
    fn run_tensors_via_cpu(&self, op: &Op, inputs: &[&Tensor], output: &Tensor) -> Result<()> {
        let cpu = self.slot(self.cpu_engine()).ok_or_else(|| Self::unavailable(self.cpu_engine()))?;
        // The copy into `output` must run where it lives: no second detour.
        let is_copy = matches!(*op, Op::Cast { from, to, .. } if from == to);
        if is_copy || !cpu.backend.supports(op) {
            return Err(ComputeError::unsupported_dtype(
                op,
                output.location().backend,
                op.dtype(),
                "no engine here computes it",
            ));
        }
        let staged = cpu.backend.alloc_typed(output.len(), output.dtype())?;
        self.run_tensors(op, inputs, &staged)?;
        self.run_tensors(&Op::cast(output.len(), output.dtype(), output.dtype()), &[&staged], output)
    }

    fn home_slot(&self, op: &'static str, loc: Location) -> Result<&Slot> {
        self.slot(Engine::home_of(loc.backend)).ok_or_else(|| ComputeError::WrongDevice {
            op,
            expected: self.backends().iter().map(|k| k.as_str()).collect::<Vec<_>>().join("|"),
            found: loc.to_string(),
        })
    }
}

/// The async names of every op (`relu_async`, `matmul_async`…) on the engine
/// the policy picks. On a discovered wgpu device the future uploads and
/// submits at its first poll and resolves when the result is back, without
/// blocking (the browser's way to WebGPU); if the device fails for a reason
/// other than the call itself, the call runs on the CPU. On the other engines
/// the call runs at the first poll, as [`Backend::run_typed`] would, and the
/// future is ready when it returns.
impl compute_core::AsyncOps for Compute {
    async fn run_async_into<'a>(
        &'a self,
        op: Op,
        inputs: &'a [HostSlice<'a>],
        #[cfg_attr(not(any(feature = "gpu", feature = "gpu-wasm")), allow(unused_mut))] mut output: HostSliceMut<'a>,
    ) -> Result<()> {
        check_host_call(&op, inputs, &output)?;
        let engine = self.choose(&op, Placement::Host);
        #[cfg(any(feature = "gpu", feature = "gpu-wasm"))]
        if engine == Engine::Wgpu
            && let Some(w) = self.native_wgpu()
        {
            match w.run_async_into(op, inputs, output.reborrow()).await {
                Ok(()) => {
                    self.record(Engine::Wgpu);
                    return Ok(());
                }
                Err(e) if !worth_falling_back(&e) => return Err(e),
                Err(_) => return self.run_on_typed(self.cpu_engine(), &op, inputs, output),
            }
        }
        self.run_with_fallback(self.sync_engine(engine, &op), &op, inputs, output)
    }

    /// Downloads from the engine where the tensor lives: on a discovered wgpu
    /// device without blocking, elsewhere as [`Backend::download_typed`].
    async fn download_async_into<'a>(&'a self, tensor: &'a Tensor, out: HostSliceMut<'a>) -> Result<()> {
        let loc = tensor.location();
        #[cfg(any(feature = "gpu", feature = "gpu-wasm"))]
        if Engine::home_of(loc.backend) == Engine::Wgpu
            && let Some(w) = self.native_wgpu()
        {
            return w.download_async_into(tensor, out).await;
        }
        self.home_slot("download", loc)?.backend.download_typed(tensor, out)
    }
}

impl Backend for Compute {
    fn kind(&self) -> BackendKind {
        self.primary().kind()
    }

    fn device_name(&self) -> String {
        let parts: Vec<String> =
            self.inner.slots.iter().map(|s| format!("{}: {}", s.engine, s.backend.device_name())).collect();
        format!("dispatch [{}]", parts.join(", "))
    }

    fn supports(&self, op: &Op) -> bool {
        self.inner.slots.iter().any(|s| s.backend.supports(op))
    }

    /// Checks shapes and dtypes, picks the engine ([`Compute::choose`] with
    /// host data, among the engines that support the op at its dtypes), runs
    /// there, and falls back to the CPU if a GPU fails.
    ///
    /// In the browser, where nothing may block, host calls run on the CPU;
    /// their `*_async` forms ([`compute_core::AsyncOps`]) reach WebGPU.
    fn run_typed(&self, op: &Op, inputs: &[HostSlice<'_>], output: HostSliceMut<'_>) -> Result<()> {
        check_host_call(op, inputs, &output)?;
        let engine = self.sync_engine(self.choose(op, Placement::Host), op);
        self.run_with_fallback(engine, op, inputs, output)
    }

    /// Uploads to the primary engine (the first GPU, else the CPU); data of a
    /// dtype that engine cannot compute goes to the CPU ([`Compute::home_for`]).
    fn upload_typed(&self, data: HostSlice<'_>) -> Result<Tensor> {
        self.upload_typed_to(self.home_for(data.dtype()), data)
    }

    /// Allocates on the engine [`Compute::home_for`] picks for `dtype`.
    fn alloc_typed(&self, len: usize, dtype: DType) -> Result<Tensor> {
        let e = self.home_for(dtype);
        self.slot(e).ok_or_else(|| Self::unavailable(e))?.backend.alloc_typed(len, dtype)
    }

    fn download_typed(&self, tensor: &Tensor, out: HostSliceMut<'_>) -> Result<()> {
        let loc = tensor.location();
        self.home_slot("download", loc)?.backend.download_typed(tensor, out)
    }

    /// Runs where the output tensor lives (inputs on another device are copied
    /// there first). On the CPU the model also picks the thread count.
    fn run_tensors(&self, op: &Op, inputs: &[&Tensor], output: &Tensor) -> Result<()> {
        let operands: Vec<compute_core::Operand> = inputs.iter().map(|t| t.operand()).collect();
        op.check_operands(&operands, output.operand())?;
        if inputs.iter().any(|t| t.same_storage(output)) {
            return Err(ComputeError::shape(op.name(), "output tensor aliases an input", op.shapes()));
        }
        let loc = output.location();
        let home = self.home_slot(op.name(), loc)?;
        let home_can = self.inner.slots.iter().any(|s| s.engine.same_memory(home.engine) && s.backend.supports(op));
        let cpu = self.cpu_engine();
        if !home_can && !home.engine.same_memory(cpu) {
            return self.run_tensors_via_cpu(op, inputs, output);
        }
        // Bring stray inputs to the output's device.
        let mut moved: Vec<Tensor> = Vec::new();
        for t in inputs.iter().filter(|t| t.location() != loc) {
            let src = self.home_slot(op.name(), t.location())?;
            let mut host = HostVec::zeros(t.dtype(), t.len());
            src.backend.download_typed(t, host.as_mut())?;
            moved.push(home.backend.upload_typed(host.as_slice())?);
        }
        let mut moved_iter = moved.iter();
        let local: Vec<&Tensor> = inputs
            .iter()
            .map(|t| if t.location() == loc { Some(*t) } else { moved_iter.next() })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| ComputeError::shape(op.name(), "input migration lost a tensor", op.shapes()))?;
        let engine = self.choose_among(op, Placement::Resident, |e| e.same_memory(home.engine));
        let slot = self.slot(engine).filter(|s| s.engine.same_memory(home.engine)).unwrap_or(home);
        slot.backend.run_tensors(op, &local, output)?;
        self.record(slot.engine);
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        for s in &self.inner.slots {
            s.backend.synchronize()?;
        }
        Ok(())
    }

    /// Prepares `ops` on every engine at once, one thread each (a GPU compiles
    /// their kernels): takes as long as the slowest engine's prepare.
    fn prepare(&self, ops: &[Op]) -> Result<()> {
        let backends: Vec<&dyn Backend> = self.inner.slots.iter().map(|s| s.backend.as_ref()).collect();
        crate::calibrate::prepare_concurrently(&backends, ops)
    }
}
