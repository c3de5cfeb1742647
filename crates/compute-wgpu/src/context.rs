//! Opening a device: adapter choice, limits, error capture, device-lost tracking.

#[cfg(not(target_arch = "wasm32"))]
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use compute_core::{ComputeError, Result};

use crate::buffers::BufferCache;
use crate::completion::Poller;
use crate::encode::Arena;
use crate::errors::{self, KIND};
use crate::kernels::{Kernels, MatmulChoice};
use crate::options::{CoopMatmul, DeviceOptions};

/// Which adapter the backend opened and the limits that shape its calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdapterReport {
    /// Adapter name, e.g. `NVIDIA H200` or `llvmpipe (LLVM 15.0.6, 256 bits)`.
    pub name: String,
    /// Graphics API, e.g. `Vulkan`.
    pub api: String,
    /// `DiscreteGpu`, `IntegratedGpu`, `VirtualGpu`, `Cpu` (software) or `Other`.
    pub device_type: String,
    /// Driver name and version text.
    pub driver: String,
    /// Largest storage buffer binding in bytes (lavapipe: 128 MiB; H200: 2 GiB − 4).
    pub max_binding_bytes: u64,
    /// Largest buffer in bytes.
    pub max_buffer_bytes: u64,
    /// Whether the device was opened with cooperative matrices (tensor cores)
    /// for the `f16` matmul ([`crate::WgpuBackend::cooperative_matrix`]).
    pub cooperative_matrix: bool,
}

impl std::fmt::Display for AdapterReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let b = self.max_binding_bytes;
        let binding = if b >= 1 << 20 { format!("{} MiB", b >> 20) } else { format!("{} KiB", b >> 10) };
        write!(f, "{} ({}, {}, driver {}; max binding {binding}", self.name, self.api, self.device_type, self.driver)?;
        f.write_str(if self.cooperative_matrix { "; cooperative matrices)" } else { ")" })
    }
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Timestamps written anywhere in a command encoder (native Vulkan, Metal, DX12).
const TIMESTAMPS_IN_ENCODERS: wgpu::Features = wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS;

/// What the cooperative-matrix matmul (`shaders/matmul_coop.wgsl`) needs of a
/// device besides a matching matrix shape: the matrices, `f16` in shaders,
/// subgroups (its builtins) and their barrier.
pub(crate) const COOP_FEATURES: wgpu::Features = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX
    .union(wgpu::Features::SHADER_F16)
    .union(wgpu::Features::SUBGROUP)
    .union(wgpu::Features::SUBGROUP_BARRIER);

/// Whether an adapter offering `features`, the cooperative-matrix
/// configurations `shapes` and subgroups of `subgroup_sizes` (least, most
/// invocations) runs `matmul_coop`: all of [`COOP_FEATURES`], a 16 × 16 × 16
/// configuration of `f16` inputs accumulating into `f32`, and subgroups of
/// exactly 32 (each subgroup of the kernel's workgroups owns a fixed block of
/// the tile). Free.
pub(crate) fn runs_coop_matmul(
    features: wgpu::Features,
    shapes: &[wgpu::CooperativeMatrixProperties],
    subgroup_sizes: (u32, u32),
) -> bool {
    let f16_into_f32 = |p: &wgpu::CooperativeMatrixProperties| {
        (p.m_size, p.n_size, p.k_size) == (16, 16, 16)
            && p.ab_type == wgpu::CooperativeScalarType::F16
            && p.cr_type == wgpu::CooperativeScalarType::F32
    };
    features.contains(COOP_FEATURES) && subgroup_sizes == (32, 32) && shapes.iter().any(f16_into_f32)
}

/// Everything one open device owns; shared by the backend, its tensors' users and batches.
pub(crate) struct Context {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) report: AdapterReport,
    pub(crate) limits: wgpu::Limits,
    /// Distinguishes devices: a tensor of another device is a `WrongDevice` error.
    pub(crate) id: u64,
    lost: Arc<Mutex<Option<String>>>,
    uncaptured: Arc<Mutex<Option<String>>>,
    pub(crate) kernels: Kernels,
    pub(crate) cache: Arc<BufferCache>,
    pub(crate) arena: Mutex<Arena>,
    pub(crate) poller: Poller,
    pub(crate) copier: crate::transfer::Copier,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("adapter", &self.report).field("id", &self.id).finish()
    }
}

fn rank(t: wgpu::DeviceType) -> u8 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    }
}

/// One adapter of the machine, as [`adapters`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdapterListing {
    /// Its index: [`DeviceOptions::with_adapter_index`] opens it.
    pub index: usize,
    /// Adapter name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// Graphics API, e.g. `Vulkan`.
    pub api: String,
    /// `DiscreteGpu`, `IntegratedGpu`, `VirtualGpu`, `Cpu` (software) or `Other`.
    pub device_type: String,
}

/// Every adapter of the APIs `options` allow, in the order the indices of
/// [`DeviceOptions::with_adapter_index`] count (wgpu's enumeration order;
/// empty in the browser, which offers one adapter through `new_async`).
/// Costs an adapter enumeration (milliseconds); opens nothing.
pub async fn adapters(options: &DeviceOptions) -> Vec<AdapterListing> {
    if wgpu::Instance::enabled_backend_features().is_empty() {
        return Vec::new();
    }
    let instance = shared_instance(options.backends());
    let found = instance.enumerate_adapters(options.backends()).await;
    found
        .iter()
        .enumerate()
        .map(|(index, a)| {
            let i = a.get_info();
            AdapterListing {
                index,
                name: i.name,
                api: format!("{:?}", i.backend),
                device_type: format!("{:?}", i.device_type),
            }
        })
        .collect()
}

/// Picks the adapter `options` ask for: the one of its index if given, else
/// name filter, no software adapter unless allowed, then the best device type.
async fn choose_adapter(instance: &wgpu::Instance, options: &DeviceOptions) -> Result<wgpu::Adapter> {
    let mut adapters = instance.enumerate_adapters(options.backends()).await;
    if let Some(index) = options.adapter_index {
        let count = adapters.len();
        return adapters.into_iter().nth(index).ok_or_else(|| {
            errors::unavailable(format!(
                "no adapter of index {index}: {count} found (backends {:?})",
                options.backends()
            ))
        });
    }
    if adapters.is_empty() {
        // The browser's WebGPU is reached only through request_adapter.
        let req = wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            force_fallback_adapter: false,
            compatible_surface: None,
            apply_limit_buckets: false,
        };
        if let Ok(a) = instance.request_adapter(&req).await {
            adapters.push(a);
        }
    }
    let seen: Vec<String> = adapters
        .iter()
        .map(|a| {
            let i = a.get_info();
            format!("{} [{:?}, {:?}]", i.name, i.backend, i.device_type)
        })
        .collect();
    let wanted = options.adapter_name.as_ref().map(|n| n.to_lowercase());
    let best = adapters
        .into_iter()
        .filter(|a| {
            let info = a.get_info();
            wanted.as_ref().is_none_or(|w| info.name.to_lowercase().contains(w))
                && (options.allow_fallback || info.device_type != wgpu::DeviceType::Cpu)
        })
        .min_by_key(|a| rank(a.get_info().device_type));
    best.ok_or_else(|| {
        let found = if seen.is_empty() { "none".to_string() } else { seen.join(", ") };
        errors::unavailable(format!(
            "no GPU adapter matches (backends {:?}, name {:?}, fallback {}); adapters found: {found}. \
             On Linux install a Vulkan driver (e.g. `apt-get install mesa-vulkan-drivers libvulkan1`).",
            options.backends(),
            options.adapter_name,
            if options.allow_fallback { "allowed" } else { "refused" },
        ))
    })
}

/// The process's wgpu instance for `backends`, created on first use and shared
/// by every device opened afterwards (creating one costs a loader and driver
/// enumeration: milliseconds). With an instance per open, as this crate had,
/// the 29th open in one process found no adapter at all on the NVIDIA H200
/// machine (driver 580); with one shared instance 80 opens in a row pass there.
/// (A bare wgpu program creating and dropping 80 instance + device pairs did
/// not fail there either, so which object of the old path ran out is not known.)
fn shared_instance(backends: wgpu::Backends) -> wgpu::Instance {
    static INSTANCES: Mutex<Vec<(wgpu::Backends, wgpu::Instance)>> = Mutex::new(Vec::new());
    let create = || {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = backends;
        desc.flags = wgpu::InstanceFlags::empty().with_env();
        wgpu::Instance::new(desc)
    };
    let Ok(mut all) = INSTANCES.lock() else { return create() };
    if let Some((_, i)) = all.iter().find(|(b, _)| *b == backends) {
        return i.clone();
    }
    let instance = create();
    all.push((backends, instance.clone()));
    instance
}

impl Context {
    /// Opens the device `options` describe. Costs an adapter enumeration and a
    /// device creation (milliseconds to tens of milliseconds).
    pub(crate) async fn open(options: &DeviceOptions) -> Result<Context> {
        if wgpu::Instance::enabled_backend_features().is_empty() {
            return Err(errors::unavailable("no wgpu backend is compiled in for this target"));
        }
        // Not across an await in the browser (single-threaded there anyway).
        #[cfg(not(target_arch = "wasm32"))]
        let _exclusive = crate::completion::opening();
        let instance = shared_instance(options.backends());
        let adapter = choose_adapter(&instance, options).await?;
        let info = adapter.get_info();
        let limits = adapter.limits();
        let mut used = limits.clone();
        if let Some(cap) = options.max_binding_bytes {
            used.max_storage_buffer_binding_size = used.max_storage_buffer_binding_size.min(cap.max(256));
        }
        // GPU-side timing (`WgpuBackend::time_tensors`) where the adapter offers it; optional:
        // a device that refuses the features is opened without them.
        // Subgroup operations (the quantized product's reductions) likewise.
        let timing =
            adapter.features() & (wgpu::Features::TIMESTAMP_QUERY | TIMESTAMPS_IN_ENCODERS | wgpu::Features::SUBGROUP);
        // Cooperative matrices (the f16 matmul on tensor cores) only where the
        // adapter lists everything the kernel needs, unless turned off.
        let wanted = options.matmul_coop != CoopMatmul::Off;
        let sizes = (info.subgroup_min_size, info.subgroup_max_size);
        let coop = if wanted && runs_coop_matmul(adapter.features(), &adapter.cooperative_matrix_properties(), sizes) {
            COOP_FEATURES
        } else {
            wgpu::Features::empty()
        };
        let request = |features: wgpu::Features| {
            let experimental = if features.intersects(wgpu::Features::all_experimental_mask()) {
                // SAFETY: the one experimental feature ever requested is
                // EXPERIMENTAL_COOPERATIVE_MATRIX, from adapters that list it, and
                // the one shader that uses it is `matmul_coop.wgsl`: naga validates
                // it (the crate's tests also put every variant through naga's
                // SPIR-V writer), each cooperative load and store reads or writes a
                // 16 × 16 block inside a workgroup array or inside a tile of C the
                // host checked (the shader's header, "Bounds"), with pointers and
                // strides uniform in each subgroup, as the extension requires.
                unsafe { wgpu::ExperimentalFeatures::enabled() }
            } else {
                wgpu::ExperimentalFeatures::disabled()
            };
            adapter.request_device(&wgpu::DeviceDescriptor {
                label: Some("compute-wgpu"),
                required_features: features,
                required_limits: limits.clone(),
                experimental_features: experimental,
                memory_hints: wgpu::MemoryHints::Performance,
                trace: wgpu::Trace::Off,
            })
        };
        // Each optional feature set is dropped in turn if the device refuses it.
        let mut opened = request(timing | coop).await;
        if opened.is_err() && !coop.is_empty() {
            opened = request(timing).await;
        }
        if opened.is_err() && !timing.is_empty() {
            opened = request(wgpu::Features::empty()).await;
        }
        let (device, queue) = opened.map_err(|e| errors::unavailable(format!("opening {}: {e}", info.name)))?;
        let lost = Arc::new(Mutex::new(None));
        let lost_sink = Arc::clone(&lost);
        device.set_device_lost_callback(move |reason, message| {
            if let Ok(mut slot) = lost_sink.lock() {
                slot.get_or_insert(format!("{reason:?}: {message}"));
            }
        });
        // Without a handler wgpu panics on errors outside an error scope; keep the
        // first one and report it from the next call that waits on the device.
        let uncaptured = Arc::new(Mutex::new(None));
        let sink = Arc::clone(&uncaptured);
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            if let Ok(mut slot) = sink.lock() {
                slot.get_or_insert(e.to_string());
            }
        }));
        let report = AdapterReport {
            name: info.name.clone(),
            api: format!("{:?}", info.backend),
            device_type: format!("{:?}", info.device_type),
            driver: format!("{} {}", info.driver, info.driver_info).trim().to_string(),
            max_binding_bytes: used.max_storage_buffer_binding_size,
            max_buffer_bytes: limits.max_buffer_size,
            cooperative_matrix: device.features().contains(COOP_FEATURES),
        };
        let poller = Poller::new(device.clone());
        Ok(Context {
            kernels: Kernels::new(MatmulChoice {
                checked: options.matmul_bounds_checks,
                tiles: options.matmul_tiles,
                coop: options.matmul_coop,
            }),
            cache: Arc::new(BufferCache::new(&used)),
            arena: Mutex::new(Arena::default()),
            device,
            queue,
            report,
            limits: used,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            lost,
            uncaptured,
            poller,
            copier: crate::transfer::Copier::from_env(),
        })
    }

    /// `DeviceLost` once the driver has reported the device lost.
    pub(crate) fn check_alive(&self) -> Result<()> {
        match self.lost.lock().ok().and_then(|s| s.clone()) {
            Some(reason) => Err(ComputeError::DeviceLost { backend: KIND, reason, cause: None }),
            None => Ok(()),
        }
    }

    /// Reports (once) an error that happened outside any error scope.
    pub(crate) fn take_uncaptured(&self, op: &'static str) -> Result<()> {
        match self.uncaptured.lock().ok().and_then(|mut s| s.take()) {
            Some(message) => Err(errors::driver(op, format!("earlier uncaptured error: {message}"))),
            None => Ok(()),
        }
    }

    /// Opens an error scope catching validation, out-of-memory and internal errors
    /// of everything this thread does on the device until [`Scope::end`].
    #[cfg(not(target_arch = "wasm32"))]
    pub(crate) fn scope(&self) -> Scope {
        let internal = self.device.push_error_scope(wgpu::ErrorFilter::Internal);
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        // Field order is the reverse of the pushes: an early return drops (pops) them in order.
        Scope { validation, oom, internal }
    }

    /// In the browser: no scope (see [`Scope::end_now`]).
    #[cfg(target_arch = "wasm32")]
    pub(crate) fn scope(&self) -> Scope {
        Scope {}
    }

    /// Largest storage binding in bytes, rounded down to the offset alignment.
    pub(crate) fn max_binding(&self) -> u64 {
        let align = self.offset_align();
        (self.limits.max_storage_buffer_binding_size / align) * align
    }

    /// Alignment of storage binding offsets (at least 16, for vec4 arrays).
    pub(crate) fn offset_align(&self) -> u64 {
        u64::from(self.limits.min_storage_buffer_offset_alignment).max(16)
    }

    /// Whether the device writes timestamps inside command encoders (GPU-side timing).
    pub(crate) fn timestamps(&self) -> bool {
        self.device.features().contains(wgpu::Features::TIMESTAMP_QUERY | TIMESTAMPS_IN_ENCODERS)
    }

    /// Whether the device runs WGSL subgroup operations (`wgpu::Features::SUBGROUP`,
    /// requested whenever the adapter offers it).
    pub(crate) fn subgroups(&self) -> bool {
        self.device.features().contains(wgpu::Features::SUBGROUP)
    }

    /// Whether the device runs the cooperative-matrix matmul (opened with
    /// [`COOP_FEATURES`] for an adapter that [`runs_coop_matmul`]).
    pub(crate) fn coop(&self) -> bool {
        self.report.cooperative_matrix
    }

    /// Most workgroups per grid dimension.
    pub(crate) fn max_groups(&self) -> u32 {
        self.limits.max_compute_workgroups_per_dimension.max(1)
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        self.poller.shutdown();
    }
}

/// An open error scope (three filters). Pop it with [`Scope::end`] on the thread that opened it.
#[must_use = "an error scope must be ended to see its errors"]
pub(crate) struct Scope {
    #[cfg(not(target_arch = "wasm32"))]
    validation: wgpu::ErrorScopeGuard,
    #[cfg(not(target_arch = "wasm32"))]
    oom: wgpu::ErrorScopeGuard,
    #[cfg(not(target_arch = "wasm32"))]
    internal: wgpu::ErrorScopeGuard,
}

impl Scope {
    /// Pops the scope; the future yields the first error it caught, as a typed error of `op`.
    /// On native the future is ready at once.
    #[cfg(not(target_arch = "wasm32"))]
    pub(crate) fn end(
        self,
        op: &'static str,
        requested_bytes: u64,
    ) -> impl Future<Output = Result<()>> + wgpu::WasmNotSend {
        let Scope { validation, oom, internal } = self;
        let v = validation.pop();
        let o = oom.pop();
        let i = internal.pop();
        async move {
            let (v, o, i) = (v.await, o.await, i.await);
            match o.or(v).or(i) {
                Some(e) => Err(errors::from_wgpu(op, e, requested_bytes)),
                None => Ok(()),
            }
        }
    }

    /// [`Scope::end`], waited for: on native the future is ready at once.
    #[cfg(not(target_arch = "wasm32"))]
    pub(crate) fn end_now(self, op: &'static str, requested_bytes: u64) -> Result<()> {
        block_on(self.end(op, requested_bytes))
    }

    /// In the browser no scope is pushed (its result could only be awaited):
    /// errors go to the uncaptured-error handler instead, and the next
    /// completion (readback or work-done future) reports them.
    #[cfg(target_arch = "wasm32")]
    pub(crate) fn end_now(self, _op: &'static str, _requested_bytes: u64) -> Result<()> {
        Ok(())
    }
}

/// Runs a future to completion on this thread (native only: the browser has no blocking calls).
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn block_on<T>(f: impl Future<Output = Result<T>>) -> Result<T> {
    pollster::block_on(f)
}

/// Runs a future to completion on this thread (native), or refuses (browser).
#[cfg(target_arch = "wasm32")]
pub(crate) fn block_on<T>(_f: impl Future<Output = Result<T>>) -> Result<T> {
    Err(errors::unavailable("blocking calls are not available in the browser: use the async API"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coop_needs_every_feature_an_f16_shape_and_subgroups_of_32() {
        use wgpu::CooperativeScalarType::{F16, F32};
        let shape = |m, n, k, ab, cr| wgpu::CooperativeMatrixProperties {
            m_size: m,
            n_size: n,
            k_size: k,
            ab_type: ab,
            cr_type: cr,
            saturating_accumulation: false,
        };
        // What NVIDIA's Vulkan driver lists among others, and what it does not need.
        let nvidia = [shape(16, 16, 16, F16, F16), shape(16, 8, 16, F16, F32), shape(16, 16, 16, F16, F32)];
        let all = COOP_FEATURES | wgpu::Features::TIMESTAMP_QUERY;
        assert!(runs_coop_matmul(all, &nvidia, (32, 32)));
        // A missing feature (lavapipe has none of the four), shape, or subgroups of other sizes.
        for missing in [
            wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX,
            wgpu::Features::SHADER_F16,
            wgpu::Features::SUBGROUP,
            wgpu::Features::SUBGROUP_BARRIER,
        ] {
            assert!(!runs_coop_matmul(all - missing, &nvidia, (32, 32)), "{missing:?}");
        }
        assert!(!runs_coop_matmul(wgpu::Features::SUBGROUP | wgpu::Features::TIMESTAMP_QUERY, &[], (8, 8)));
        assert!(!runs_coop_matmul(all, &nvidia[..2], (32, 32)));
        assert!(!runs_coop_matmul(all, &[shape(8, 8, 8, F32, F32)], (32, 32)));
        assert!(!runs_coop_matmul(all, &nvidia, (32, 64)));
        assert!(!runs_coop_matmul(all, &nvidia, (16, 32)));
        assert!(!runs_coop_matmul(all, &[], (32, 32)));
    }

    #[test]
    fn the_report_says_whether_cooperative_matrices_are_on() {
        let mut r = AdapterReport {
            name: "NVIDIA H200".into(),
            api: "Vulkan".into(),
            device_type: "DiscreteGpu".into(),
            driver: "NVIDIA 580".into(),
            max_binding_bytes: 1 << 31,
            max_buffer_bytes: 1 << 32,
            cooperative_matrix: true,
        };
        assert!(r.to_string().ends_with("max binding 2048 MiB; cooperative matrices)"), "{r}");
        r.cooperative_matrix = false;
        assert!(r.to_string().ends_with("max binding 2048 MiB)"), "{r}");
    }
}
