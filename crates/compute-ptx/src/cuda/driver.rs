//! Every call into the CUDA driver that `cudarc`'s safe API does not cover, and
//! so every `unsafe` block of the crate: module loading with the JIT's error
//! log, kernel launches, raw copies to and from device pointers, pinned host
//! staging and pinned buffers, and driver queries.

use std::ffi::{CString, c_void};
use std::sync::Arc;
use std::sync::atomic::AtomicU32;

use compute_core::{BackendKind, ComputeError, DType, Result};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DriverError, PinnedHostSlice, result, sys};

use super::error::{driver_err, message};
use crate::builder::{Kernel, ParamTy, TENSOR_MAP_BYTES};
use crate::plan::{Arg, Grid, TensorMapDesc};

/// Whether the CUDA driver library can be loaded on this machine. `cudarc`
/// panics on first use without it, so this is asked before anything else.
pub(crate) fn culib_present() -> bool {
    // SAFETY: only tries to dlopen the driver library by its usual names; loading
    // it runs no CUDA code beyond the library's initialisers.
    unsafe { sys::is_culib_present() }
}

/// The driver's CUDA version as `major·1000 + minor·10` (13000 for 13.0).
pub(crate) fn driver_version() -> Result<i32> {
    let mut v: std::ffi::c_int = 0;
    // SAFETY: `v` is a valid out-pointer for the duration of the call.
    unsafe { sys::cuDriverGetVersion(&mut v) }.result().map_err(|e| driver_err("driver_version", e))?;
    Ok(v)
}

/// Turns off cudarc's cross-stream event tracking for buffers allocated from
/// now on: each device has exactly one stream here, which orders all work.
pub(crate) fn single_stream(ctx: &CudaContext) {
    // SAFETY: every device is driven through exactly one stream, shared by every
    // backend on it, so all work on its buffers is ordered by that stream; the
    // tracking (two events per allocation) would only add cost.
    unsafe { ctx.disable_event_tracking() };
}

/// Keeps freed device memory in the stream-ordered pool instead of returning it
/// at every synchronisation (release threshold = max): allocations after the
/// first are then a few microseconds. Best effort.
pub(crate) fn keep_pool_memory(ctx: &CudaContext) {
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: the context is bound on this thread by the caller; `pool` is a valid
    // out-pointer, and the threshold value lives until the call returns.
    unsafe {
        if sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()).result().is_ok() && !pool.is_null() {
            let mut threshold: u64 = u64::MAX;
            let _ = sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut threshold as *mut u64).cast::<c_void>(),
            );
        }
    }
}

/// A loaded kernel: its module (unloaded on drop) and entry point.
#[derive(Debug)]
pub(crate) struct Function {
    module: sys::CUmodule,
    func: sys::CUfunction,
    name: String,
    params: Vec<ParamTy>,
    /// Launched with programmatic stream serialization ([`dependent_launch`]).
    dependent: bool,
    ctx: Arc<CudaContext>,
}

// SAFETY: module and function handles are plain driver handles, valid from any
// thread once the owning context is bound (every use below binds it first);
// the struct is immutable after loading.
unsafe impl Send for Function {}
// SAFETY: as above; launches with a shared `&Function` only read the handles.
unsafe impl Sync for Function {}

impl Drop for Function {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: the module was loaded by `load` and is unloaded once, here.
            let _ = unsafe { sys::cuModuleUnload(self.module) };
        }
    }
}

/// JIT-compiles `kernel`'s PTX into the context and looks up its entry point.
/// A compile failure carries the kernel name and the JIT's own error log.
/// `max_dynamic_smem`: raise the kernel's dynamic shared-memory limit to this.
pub(crate) fn load(ctx: &Arc<CudaContext>, kernel: &Kernel, max_dynamic_smem: Option<u32>) -> Result<Function> {
    let compile_err = |message: String| ComputeError::Compile {
        backend: BackendKind::Cuda,
        kernel: kernel.name().to_string(),
        message,
    };
    ctx.bind_to_thread().map_err(|e| driver_err("load_module", e))?;
    let image = CString::new(kernel.ptx()).map_err(|_| compile_err("PTX text contains a NUL byte".into()))?;
    let entry = CString::new(kernel.name()).map_err(|_| compile_err("kernel name contains a NUL byte".into()))?;
    let mut log = vec![0u8; 16 * 1024];
    let mut options =
        [sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER, sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES];
    let mut values: [*mut c_void; 2] = [log.as_mut_ptr().cast(), log.len() as *mut c_void];
    let mut module: sys::CUmodule = std::ptr::null_mut();
    // SAFETY: `image` is a NUL-terminated PTX string; the two options point at a
    // writable log buffer of the stated size; all outlive the call. The context
    // is bound on this thread.
    let loaded = unsafe {
        sys::cuModuleLoadDataEx(
            &mut module,
            image.as_ptr().cast(),
            options.len() as u32,
            options.as_mut_ptr(),
            values.as_mut_ptr(),
        )
    };
    if let Err(e) = loaded.result() {
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        let text = String::from_utf8_lossy(log.get(..end).unwrap_or(&[])).trim().to_string();
        return Err(compile_err(format!(
            "{}; JIT log: {}",
            message(e),
            if text.is_empty() { "(empty)" } else { &text }
        )));
    }
    let mut func: sys::CUfunction = std::ptr::null_mut();
    // SAFETY: `module` was just loaded; `entry` is NUL-terminated; `func` is a valid out-pointer.
    let got = unsafe { sys::cuModuleGetFunction(&mut func, module, entry.as_ptr()) };
    let f = Function {
        module,
        func,
        name: kernel.name().to_string(),
        params: kernel.params().to_vec(),
        dependent: kernel.waits_for_prerequisites() && dependent_launch(),
        ctx: ctx.clone(),
    };
    got.result().map_err(|e| compile_err(format!("entry point not found: {}", message(e))))?;
    if let Some(bytes) = max_dynamic_smem {
        // SAFETY: `func` is a live function handle of the bound context.
        unsafe {
            sys::cuFuncSetAttribute(
                f.func,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as std::ffi::c_int,
            )
        }
        .result()
        .map_err(|e| compile_err(format!("setting the dynamic shared memory limit to {bytes}: {}", message(e))))?;
    }
    Ok(f)
}

/// Whether kernels that wait for their prerequisites
/// ([`Kernel::waits_for_prerequisites`]) are launched as programmatic
/// dependents of the kernel before them in the stream, so that their blocks
/// launch during that kernel's last wave instead of after it. On unless the
/// environment sets `COMPUTE_PTX_DEPENDENT_LAUNCH=0` (read once per process),
/// which launches every kernel serially, for comparison.
pub(crate) fn dependent_launch() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("COMPUTE_PTX_DEPENDENT_LAUNCH").map_or(true, |v| v.trim() != "0"))
}

/// One kernel argument's bytes, first in memory, aligned as a tensor map must be.
#[repr(C, align(128))]
struct Slot([u8; TENSOR_MAP_BYTES as usize]);

/// The argument's bytes in a slot; tensor maps are encoded here.
fn slot(a: Arg) -> Result<Slot> {
    let mut b = [0u8; TENSOR_MAP_BYTES as usize];
    match a {
        Arg::Ptr(v) | Arg::U64(v) => b[..8].copy_from_slice(&v.to_ne_bytes()),
        Arg::U32(v) => b[..4].copy_from_slice(&v.to_ne_bytes()),
        Arg::F32(v) => b[..4].copy_from_slice(&v.to_ne_bytes()),
        Arg::TensorMap(d) => {
            let map = encode_tensor_map(&d)?;
            for (chunk, word) in b.chunks_exact_mut(8).zip(map.opaque) {
                chunk.copy_from_slice(&word.to_ne_bytes());
            }
        }
    }
    Ok(Slot(b))
}

/// Encodes a TMA tensor map (`cuTensorMapEncodeTiled`, host-side, about a
/// microsecond): 128-byte swizzle, zeros beyond the edges, no interleave.
pub(crate) fn encode_tensor_map(d: &TensorMapDesc) -> Result<sys::CUtensorMap> {
    use sys::CUtensorMapDataType as T;
    let op = "tensor map";
    let bad = |why: String| ComputeError::driver(op, BackendKind::Cuda, why);
    d.check().map_err(bad)?;
    let dtype = match d.dtype {
        DType::F16 => T::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        DType::BF16 => T::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        DType::F32 => T::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
        other => return Err(bad(format!("no tensor map of {other}"))),
    };
    let mut map = sys::CUtensorMap { opaque: [0; 16] };
    let ones = [1u32; 3];
    // SAFETY: `map` is a valid out-pointer; `dims`, `strides`, `boxes` and
    // `ones` hold at least `rank` (checked to be 1..=3) elements; the
    // function only reads them and writes `map` (the address is not dereferenced).
    let r = unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            dtype,
            d.rank,
            d.addr as *mut c_void,
            d.dims.as_ptr(),
            d.strides.as_ptr(),
            d.boxes.as_ptr(),
            ones.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    r.result().map_err(|e| {
        ComputeError::driver(op, BackendKind::Cuda, format!("encoding {d:?}: {}", message(e))).with_cause(e)
    })?;
    Ok(map)
}

/// Launches `f` on `stream`. The arguments are checked against the kernel's
/// declared parameters first (count and type), so a mismatch is an error, not
/// undefined behaviour; launch failures carry the kernel name.
pub(crate) fn launch(stream: &CudaStream, f: &Function, grid: Grid, args: &[Arg]) -> Result<()> {
    let op = "launch";
    if args.len() != f.params.len() || args.iter().zip(&f.params).any(|(a, t)| a.ty() != *t) {
        return Err(ComputeError::Driver {
            op,
            backend: BackendKind::Cuda,
            message: format!(
                "kernel `{}` takes ({:?}) but was given ({:?})",
                f.name,
                f.params,
                args.iter().map(|a| a.ty()).collect::<Vec<_>>()
            ),
            cause: None,
        });
    }
    let mut slots = args.iter().map(|a| slot(*a)).collect::<Result<Vec<Slot>>>()?;
    let mut ptrs: Vec<*mut c_void> = slots.iter_mut().map(|s| s.0.as_mut_ptr().cast::<c_void>()).collect();
    stream.context().bind_to_thread().map_err(|e| driver_err(op, e))?;
    let r = if f.dependent {
        // Programmatic stream serialization: the kernel may launch once every
        // block of the kernel before it has started; it waits for that
        // kernel's completion in its own first instructions.
        let mut attr = sys::CUlaunchAttribute {
            id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            value: sys::CUlaunchAttributeValue { programmaticStreamSerializationAllowed: 1 },
        };
        let config = sys::CUlaunchConfig {
            gridDimX: grid.blocks.0,
            gridDimY: grid.blocks.1,
            gridDimZ: grid.blocks.2,
            blockDimX: grid.threads.0,
            blockDimY: grid.threads.1,
            blockDimZ: grid.threads.2,
            sharedMemBytes: grid.dynamic_smem,
            hStream: stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        // SAFETY: the argument count and types match the entry point's
        // declared parameters (checked above); each pointer addresses a live
        // 128-byte slot holding the value's bytes first; device pointers come
        // from live allocations of this context sized by the op's plan.
        // `config` and the one attribute it points at live until the call
        // returns (the driver copies them, as it does the arguments).
        unsafe { sys::cuLaunchKernelEx(&config, f.func, ptrs.as_mut_ptr(), std::ptr::null_mut()) }.result()
    } else {
        // SAFETY: the argument count and types match the entry point's declared
        // parameters (checked above); each pointer addresses a 128-byte slot,
        // 128-byte aligned, holding the value's bytes first, alive until the call
        // returns (the driver copies them). Device pointers come from live allocations of this context, sized
        // by the caller's plan for the op (validated by `Op::check`).
        unsafe {
            result::launch_kernel(f.func, grid.blocks, grid.threads, grid.dynamic_smem, stream.cu_stream(), &mut ptrs)
        }
    };
    r.map_err(|e| {
        let what =
            format!("launching kernel `{}` (grid {:?}, block {:?}): {}", f.name, grid.blocks, grid.threads, message(e));
        ComputeError::driver(op, BackendKind::Cuda, what).with_cause(e)
    })
}

/// Allocates `bytes` (at least 4) of device memory, stream-ordered.
pub(crate) fn alloc(stream: &Arc<CudaStream>, bytes: usize, op: &'static str) -> Result<(CudaSlice<u8>, u64)> {
    let n = bytes.max(4);
    // SAFETY: the memory is uninitialised; every user writes before reading
    // (kernels write their outputs in full, uploads copy in full) or reads
    // deliberately uninitialised data only through `alloc` tensors, whose
    // contents the trait documents as unspecified.
    let slice = unsafe { stream.alloc::<u8>(n) }.map_err(|e| match e.0 {
        sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
            ComputeError::OutOfMemory { op, backend: BackendKind::Cuda, requested_bytes: n as u64 }
        }
        _ => driver_err(op, e),
    })?;
    let ptr = {
        let (ptr, _sync) = slice.device_ptr(stream);
        ptr
    };
    Ok((slice, ptr))
}

/// Copies host `src` (`f32`s, or the bytes of any dtype) to device address
/// `dst` on `stream`. From pageable memory the copy has consumed `src` when
/// this returns; from the pinned staging buffer it completes at the next
/// synchronisation (see [`Staging`]).
pub(crate) fn htod<T: Copy>(stream: &CudaStream, dst: u64, src: &[T], op: &'static str) -> Result<()> {
    // SAFETY: `dst` addresses a live allocation of at least `size_of_val(src)`
    // bytes (the caller sized it from the same length and dtype); `src` is valid
    // for reads and `T` is plain data (`f32`, `u8`). For pageable memory the
    // driver stages the data before returning; pinned memory is only our
    // `Staging` buffer, which is not touched again before a sync.
    unsafe { result::memcpy_htod_async(dst, src, stream.cu_stream()) }.map_err(|e| driver_err(op, e))
}

/// Copies `size_of_val(dst)` bytes from device address `src` into `dst`
/// (`f32`s, or the bytes of any dtype) and waits.
pub(crate) fn dtoh_sync<T: Copy>(stream: &CudaStream, dst: &mut [T], src: u64, op: &'static str) -> Result<()> {
    // SAFETY: `src` addresses a live allocation of at least `size_of_val(dst)`
    // bytes; `dst` is valid for writes, `T` is plain data (`f32`, `u8`: any bit
    // pattern is a value), and `dst` is not read until the stream is
    // synchronised below, which is when the copy has completed.
    unsafe { result::memcpy_dtoh_async(dst, src, stream.cu_stream()) }.map_err(|e| driver_err(op, e))?;
    stream.synchronize().map_err(|e| driver_err(op, e))
}

/// A pitched device-to-device copy on `stream`: `height` rows of
/// `width_bytes` bytes, row `i` read at `src + i·src_pitch` and written at
/// `dst + i·dst_pitch` (one `cuMemcpy2DAsync`). Used by the multi-GPU
/// products (feature `nccl`).
#[cfg(feature = "nccl")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn dtod_2d(
    stream: &CudaStream,
    (dst, dst_pitch): (u64, usize),
    (src, src_pitch): (u64, usize),
    width_bytes: usize,
    height: usize,
    op: &'static str,
) -> Result<()> {
    let copy = sys::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        srcHost: std::ptr::null(),
        srcDevice: src,
        srcArray: std::ptr::null_mut(),
        srcPitch: src_pitch,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        dstHost: std::ptr::null_mut(),
        dstDevice: dst,
        dstArray: std::ptr::null_mut(),
        dstPitch: dst_pitch,
        WidthInBytes: width_bytes,
        Height: height,
    };
    stream.context().bind_to_thread().map_err(|e| driver_err(op, e))?;
    // SAFETY: the caller guarantees both regions (`height` rows at their
    // pitches, `width_bytes` each) lie in live allocations of this stream's
    // device; `copy` lives until the call returns (the driver reads it then).
    unsafe { sys::cuMemcpy2DAsync_v2(&copy, stream.cu_stream()) }.result().map_err(|e| driver_err(op, e))
}

/// Lets `ctx` read and write `peer`'s memory directly (NVLink or PCIe
/// peer-to-peer) when the devices allow it: `true` if enabled (now or
/// before), `false` where the driver has no such path (copies between them
/// then go through the host, still correct).
pub(crate) fn enable_peer_access(ctx: &CudaContext, peer: &CudaContext, op: &'static str) -> Result<bool> {
    let mut can: std::ffi::c_int = 0;
    // SAFETY: `can` is a valid out-pointer; both devices are open handles.
    unsafe { sys::cuDeviceCanAccessPeer(&mut can, ctx.cu_device(), peer.cu_device()) }
        .result()
        .map_err(|e| driver_err(op, e))?;
    if can == 0 {
        return Ok(false);
    }
    ctx.bind_to_thread().map_err(|e| driver_err(op, e))?;
    // SAFETY: `peer`'s context is a live primary context; flags must be 0.
    match unsafe { sys::cuCtxEnablePeerAccess(peer.cu_ctx(), 0) } {
        sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {}
        other => return Err(driver_err(op, DriverError(other))),
    }
    // Tensors come from each device's stream-ordered pool, which context
    // peer access does not cover: open each pool to the other device.
    grant_pool_access(peer, ctx, op)?;
    grant_pool_access(ctx, peer, op)?;
    Ok(true)
}

/// Lets `reader`'s device read and write the allocations of `owner`'s
/// default memory pool (where every tensor of `owner` comes from).
fn grant_pool_access(owner: &CudaContext, reader: &CudaContext, op: &'static str) -> Result<()> {
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: `pool` is a valid out-pointer; the device is an open handle.
    unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, owner.cu_device()) }.result().map_err(|e| driver_err(op, e))?;
    let access = sys::CUmemAccessDesc {
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: reader.cu_device(),
        },
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: `pool` is the owner device's default pool (non-null on
    // success) and `access` one valid descriptor, read during the call.
    unsafe { sys::cuMemPoolSetAccess(pool, &access, 1) }.result().map_err(|e| driver_err(op, e))
}

/// Copies `bytes` bytes from `src` on `src_ctx`'s device to `dst` on
/// `stream`'s (another device), queued on `stream`.
pub(crate) fn dtod_peer(
    stream: &CudaStream,
    dst: u64,
    src_ctx: &CudaContext,
    src: u64,
    bytes: usize,
    op: &'static str,
) -> Result<()> {
    let dst_ctx = stream.context();
    dst_ctx.bind_to_thread().map_err(|e| driver_err(op, e))?;
    // SAFETY: `dst` and `src` address live allocations of at least `bytes`
    // bytes on their contexts' devices (the caller checks lengths and keeps
    // both alive until the stream has run the copy).
    unsafe { result::memcpy_peer_async(dst_ctx.cu_ctx(), dst, src_ctx.cu_ctx(), src, bytes, stream.cu_stream()) }
        .map_err(|e| driver_err(op, e))
}

/// Device-to-device copy of `bytes` bytes.
pub(crate) fn dtod(stream: &CudaStream, dst: u64, src: u64, bytes: usize, op: &'static str) -> Result<()> {
    // With several devices the thread's current context may be another one's.
    stream.context().bind_to_thread().map_err(|e| driver_err(op, e))?;
    // SAFETY: both addresses are live allocations of at least `bytes` bytes (the
    // caller checks lengths); the copy is stream-ordered after prior work.
    unsafe { result::memcpy_dtod_async(dst, src, bytes, stream.cu_stream()) }.map_err(|e| driver_err(op, e))
}

/// Pinned host buffer plus a device buffer of the same size: small host calls
/// copy all inputs in one transfer and the output back in another, with no
/// allocation. Whoever holds it (behind the device's mutex) synchronises the
/// stream before releasing it, so its memory is never reused while a copy is
/// in flight.
pub(crate) struct Staging {
    host: PinnedHostSlice<u8>,
    _device: CudaSlice<u8>,
    device_ptr: u64,
    floats: usize,
}

impl std::fmt::Debug for Staging {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Staging({} floats)", self.floats)
    }
}

impl Staging {
    /// Allocates `floats` floats of each.
    pub(crate) fn new(ctx: &Arc<CudaContext>, stream: &Arc<CudaStream>, floats: usize) -> Result<Staging> {
        // SAFETY: uninitialised pinned memory; only the prefix written by `stage_in`
        // is ever copied or read. Flags 0: cached (not write-combined), since the
        // host reads results back from it.
        let host = unsafe { ctx.alloc_pinned_with_flags::<u8>(floats * 4, 0) }.map_err(|e| driver_err("staging", e))?;
        let (device, device_ptr) = alloc(stream, floats * 4, "staging")?;
        Ok(Staging { host, _device: device, device_ptr, floats })
    }

    /// Capacity in floats.
    pub(crate) fn floats(&self) -> usize {
        self.floats
    }

    /// Device address of float `offset` of the device half.
    pub(crate) fn device_at(&self, offset: usize) -> u64 {
        self.device_ptr + 4 * offset as u64
    }

    /// Copies host data (bytes of any dtype) into the pinned buffer at the
    /// given float offsets, then the whole prefix `[0, end)` floats to the
    /// device in one transfer.
    pub(crate) fn stage_in(&mut self, stream: &CudaStream, parts: &[(usize, &[u8])], end: usize) -> Result<()> {
        let bytes = self.host.as_mut_slice().map_err(|e| driver_err("staging", e))?;
        for (off, data) in parts {
            let dst = bytes.get_mut(4 * off..4 * off + data.len()).ok_or_else(too_small)?;
            dst.copy_from_slice(data);
        }
        let prefix = bytes.get(..4 * end).unwrap_or(&[]);
        htod(stream, self.device_ptr, prefix, "upload")
    }

    /// Copies host `parts` (bytes of any dtype) one after the other into the
    /// pinned buffer, then all of them to device address `dst` (which holds
    /// their total) in one transfer, and waits for it.
    pub(crate) fn stage_to(&mut self, stream: &CudaStream, parts: &[&[u8]], dst: u64) -> Result<()> {
        let bytes = self.host.as_mut_slice().map_err(|e| driver_err("staging", e))?;
        let mut end = 0;
        for data in parts {
            let to = bytes.get_mut(end..end + data.len()).ok_or_else(too_small)?;
            to.copy_from_slice(data);
            end += data.len();
        }
        htod(stream, dst, bytes.get(..end).unwrap_or(&[]), "upload")?;
        stream.synchronize().map_err(|e| driver_err("upload", e))
    }

    /// Copies `out.len()` bytes at float `offset` of the device half back,
    /// waits, and fills `out`.
    pub(crate) fn stage_out(&mut self, stream: &CudaStream, offset: usize, out: &mut [u8]) -> Result<()> {
        let src = self.device_at(offset);
        self.fetch(stream, src, out)
    }

    /// Copies `out.len()` bytes from device address `src` through the pinned
    /// buffer, waits, and fills `out`.
    pub(crate) fn fetch(&mut self, stream: &CudaStream, src: u64, out: &mut [u8]) -> Result<()> {
        let bytes = self.host.as_mut_slice().map_err(|e| driver_err("staging", e))?;
        let region = bytes.get_mut(..out.len()).ok_or_else(too_small)?;
        dtoh_sync(stream, region, src, "download")?;
        out.copy_from_slice(region);
        Ok(())
    }
}

/// Zeroed page-locked host memory of `len` (at least one) elements of `T`,
/// cached (not write-combined: the host reads it too), and its address.
fn pinned_zeroed<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    ctx: &Arc<CudaContext>,
    len: usize,
    op: &'static str,
) -> Result<(PinnedHostSlice<T>, usize)> {
    let n = len.max(1);
    // SAFETY: the memory is uninitialised; it is zeroed below before anything
    // reads it or hands out a view of it.
    let mut mem = unsafe { ctx.alloc_pinned_with_flags::<T>(n, 0) }.map_err(|e| match e.0 {
        sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => ComputeError::OutOfMemory {
            op,
            backend: BackendKind::Cuda,
            requested_bytes: (n * std::mem::size_of::<T>()) as u64,
        },
        _ => driver_err(op, e),
    })?;
    // No copy has used this memory's event yet: this returns at once.
    let ptr = mem.as_mut_ptr().map_err(|e| driver_err(op, e))?;
    // SAFETY: `ptr` is the start of the `n` elements just allocated, which no
    // one else can reach yet; all-zero bytes are a valid `T`.
    unsafe { std::ptr::write_bytes(ptr, 0, n) };
    Ok((mem, ptr as usize))
}

/// Page-locked words of one device's context, shared by the threads that
/// write them (`compute_core::PinnedWords` on CUDA). Dropping them waits
/// for the device's stream, so that no copy queued from them is still
/// reading when they are freed.
pub(crate) struct PinnedWordsMem {
    mem: PinnedHostSlice<u32>,
    addr: usize,
    len: usize,
    stream: Arc<CudaStream>,
}

impl PinnedWordsMem {
    /// `len` zero words for copies on `stream`.
    pub(crate) fn new(ctx: &Arc<CudaContext>, stream: &Arc<CudaStream>, len: usize) -> Result<PinnedWordsMem> {
        let (mem, addr) = pinned_zeroed::<u32>(ctx, len, "alloc_pinned_words")?;
        Ok(PinnedWordsMem { mem, addr, len, stream: stream.clone() })
    }

    /// Whether copies from these words go on `stream` (the one that
    /// dropping them waits for).
    pub(crate) fn is_for(&self, stream: &Arc<CudaStream>) -> bool {
        Arc::ptr_eq(&self.stream, stream)
    }
}

impl std::fmt::Debug for PinnedWordsMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PinnedWordsMem({} words, {} bytes pinned)", self.len, self.mem.num_bytes())
    }
}

impl compute_core::WordsMemory for PinnedWordsMem {
    fn words(&self) -> &[AtomicU32] {
        // SAFETY: `addr` starts `len` zeroed (so initialised) `u32`s that live
        // as long as `self.mem`; `AtomicU32` has the size and alignment of
        // `u32`, and this type hands out no other view of the memory, so every
        // access from the host is through these atomics.
        unsafe { std::slice::from_raw_parts(self.addr as *const AtomicU32, self.len) }
    }
}

impl Drop for PinnedWordsMem {
    fn drop(&mut self) {
        // Copies queued from these words must finish before the memory goes.
        let _ = self.stream.synchronize();
    }
}

/// Page-locked `f32` values with one owner (`compute_core::PinnedF32` on
/// CUDA). Copies into them wait before returning, so none is in flight when
/// they are read or freed.
pub(crate) struct PinnedF32Mem {
    mem: PinnedHostSlice<f32>,
    addr: usize,
    len: usize,
}

impl PinnedF32Mem {
    /// `len` zeros.
    pub(crate) fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<PinnedF32Mem> {
        let (mem, addr) = pinned_zeroed::<f32>(ctx, len, "alloc_pinned_f32")?;
        Ok(PinnedF32Mem { mem, addr, len })
    }
}

impl std::fmt::Debug for PinnedF32Mem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PinnedF32Mem({} values, {} bytes pinned)", self.len, self.mem.num_bytes())
    }
}

impl compute_core::F32Memory for PinnedF32Mem {
    fn values(&self) -> &[f32] {
        // SAFETY: `addr` starts `len` zeroed (so initialised) `f32`s that live
        // as long as `self.mem`; shared access only reads them, and writes
        // need `&mut self` (`values_mut`, or a copy that waits for itself).
        unsafe { std::slice::from_raw_parts(self.addr as *const f32, self.len) }
    }

    fn values_mut(&mut self) -> &mut [f32] {
        // SAFETY: as in `values`; `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.addr as *mut f32, self.len) }
    }
}

/// Queues a copy of host words `src` to device address `dst` on `stream`.
/// The words must stay allocated until the stream has run the copy (the
/// caller passes only [`PinnedWordsMem`] of this stream, whose drop waits for
/// it); other threads may keep storing into them meanwhile, and the copy
/// takes whatever they hold when the device reads them.
pub(crate) fn htod_words(stream: &CudaStream, dst: u64, src: &[AtomicU32], op: &'static str) -> Result<()> {
    stream.context().bind_to_thread().map_err(|e| driver_err(op, e))?;
    // SAFETY: `dst` addresses a live allocation of at least `size_of_val(src)`
    // bytes (the caller checked the parts against the tensor); `src` is valid
    // for reads of that many bytes until the copy has run (see above). The
    // device reads the memory outside Rust's view, as a DMA engine does.
    unsafe {
        sys::cuMemcpyHtoDAsync_v2(dst, src.as_ptr().cast::<c_void>(), std::mem::size_of_val(src), stream.cu_stream())
    }
    .result()
    .map_err(|e| driver_err(op, e))
}

/// Queues a copy of `size_of_val(dst)` bytes from device address `src` into
/// `dst`; the caller waits for the stream before `dst`'s borrow ends.
pub(crate) fn dtoh_async<T: Copy>(stream: &CudaStream, dst: &mut [T], src: u64, op: &'static str) -> Result<()> {
    // SAFETY: `src` addresses a live allocation of at least `size_of_val(dst)`
    // bytes; `dst` is valid for writes and `T` is plain data (`f32`: any bit
    // pattern is a value); the caller synchronises the stream while it still
    // holds `dst` exclusively, so nothing reads it before the copy is done.
    unsafe { result::memcpy_dtoh_async(dst, src, stream.cu_stream()) }.map_err(|e| driver_err(op, e))
}

/// The error for data larger than the staging buffer (its callers check the
/// size first: not reached).
fn too_small() -> ComputeError {
    ComputeError::Driver {
        op: "staging",
        backend: BackendKind::Cuda,
        message: "staging buffer too small".into(),
        cause: None,
    }
}

/// Reads device attribute `attr` of the context's device.
pub(crate) fn attribute(ctx: &CudaContext, attr: sys::CUdevice_attribute) -> Result<i32> {
    ctx.attribute(attr).map_err(|e| driver_err("device_attribute", e))
}

/// Wraps a [`DriverError`] for callers outside this module.
pub(crate) fn err(op: &'static str, e: DriverError) -> ComputeError {
    driver_err(op, e)
}
