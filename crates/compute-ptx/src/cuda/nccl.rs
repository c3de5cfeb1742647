//! Collectives across GPUs through NCCL (feature `nccl`): all-reduce,
//! all-gather, reduce-scatter and broadcast of device tensors, one per GPU.
//!
//! A [`Communicator`] joins one [`CudaBackend`] per GPU (distinct devices) in
//! one process (`ncclCommInitAll`). Each collective takes one tensor per rank,
//! in rank order, each on its rank's device, all of one dtype (`f32`, `f16` or
//! `bf16`) and length; it is queued on every rank's stream, in order with
//! that backend's kernels, as one NCCL group issued from the calling thread,
//! and returns without waiting ([`Communicator::synchronize`] or any
//! download waits). NCCL chooses the transport: NVLink or PCIe peer-to-peer
//! between GPUs of one machine. NVLink multicast (NVLS) is never asked for:
//! set `NCCL_NVLS_ENABLE=0` in the environment on machines that offer it.
//!
//! [`Communicator::matmul`] splits one product over the GPUs by rows
//! (data parallel), by the inner dimension (tensor parallel, all-reduce) or
//! by columns (tensor parallel, all-gather), see [`Split`]; its collectives
//! run on a second stream per GPU, chunk by chunk, beside the products.
//! [`CudaBackend::copy_to`] copies a tensor between GPUs without NCCL.
//!
//! `libnccl` is loaded at run time (`libnccl.so`, then `libnccl.so.2`); a
//! machine without it gets [`ComputeError::DeviceUnavailable`] from
//! [`Communicator::new`], never a panic. NCCL's own errors become
//! [`ComputeError::Driver`] with an [`NcclError`] (its result code) as
//! [`source`](std::error::Error::source).

mod matmul;

use std::sync::{Arc, Mutex};

use compute_core::{BackendKind, ComputeError, DType, Op, Result, Tensor};
use cudarc::driver::CudaStream;

use super::CudaBackend;
use super::device::lock;
pub use super::nccl_sys::NcclError;
use super::nccl_sys::{self as sys, Api};
use crate::plan;
pub use matmul::{Split, default_chunks};

/// How [`Communicator::all_reduce`] and [`Communicator::reduce_scatter`]
/// combine the ranks' values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Largest value.
    Max,
    /// Smallest value.
    Min,
    /// Mean (sum over ranks).
    Avg,
}

impl ReduceOp {
    fn code(self) -> i32 {
        match self {
            ReduceOp::Sum => sys::SUM,
            ReduceOp::Prod => sys::PROD,
            ReduceOp::Max => sys::MAX,
            ReduceOp::Min => sys::MIN,
            ReduceOp::Avg => sys::AVG,
        }
    }
}

/// One NCCL communicator per GPU, in rank order. Cheap to share by
/// reference: collectives from several threads are issued one at a time.
pub struct Communicator {
    api: &'static Api,
    ranks: Vec<Rank>,
    /// Serialises the groups of collectives (NCCL communicators take one caller at a time).
    issuing: Mutex<()>,
}

/// One GPU of a [`Communicator`].
struct Rank {
    comm: sys::Comm,
    backend: CudaBackend,
    /// A second stream on the rank's device: the collectives of a pipelined
    /// [`Communicator::matmul`] run on it beside the products.
    side: Arc<CudaStream>,
}

// SAFETY: NCCL communicators may be used from any thread, one call at a time,
// which `issuing` ensures; the handles are only passed to NCCL.
unsafe impl Send for Communicator {}
// SAFETY: as above: every use of the handles takes `issuing` first.
unsafe impl Sync for Communicator {}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let devices: Vec<String> = self.ranks.iter().map(|r| r.backend.location().to_string()).collect();
        f.debug_struct("Communicator").field("ranks", &devices).finish()
    }
}

/// The number of CUDA devices, 0 without a driver.
pub fn device_count() -> usize {
    if !super::driver::culib_present() {
        return 0;
    }
    cudarc::driver::CudaContext::device_count().map_or(0, |n| usize::try_from(n).unwrap_or(0))
}

/// The NCCL library's version `(major, minor, patch)`, or
/// [`ComputeError::DeviceUnavailable`] without it. Loads it on first call.
pub fn nccl_version() -> Result<(u32, u32, u32)> {
    let v = sys::api()?.version()?;
    let v = u32::try_from(v).unwrap_or(0);
    // NCCL ≥ 2.9 encodes major·10000 + minor·100 + patch.
    Ok((v / 10000, (v / 100) % 100, v % 100))
}

fn dtype_code(dtype: DType, what: &'static str, len: usize) -> Result<i32> {
    match dtype {
        DType::F32 => Ok(sys::FLOAT32),
        DType::F16 => Ok(sys::FLOAT16),
        DType::BF16 => Ok(sys::BFLOAT16),
        other => Err(ComputeError::UnsupportedDType {
            op: what,
            backend: BackendKind::Cuda,
            dtype: other,
            reason: "NCCL collectives here take f32, f16 and bf16 tensors".into(),
            shapes: format!("[{len}] {other}"),
        }),
    }
}

impl Communicator {
    /// Joins `backends` (one per GPU, distinct devices; rank `i` is
    /// `backends[i]`). Costs NCCL's setup, tens to hundreds of milliseconds.
    /// `DeviceUnavailable` without NCCL; `Shape` for no backend or a device
    /// named twice.
    pub fn new(backends: &[CudaBackend]) -> Result<Communicator> {
        let devices: Vec<i32> = backends.iter().map(|b| b.dev.ordinal as i32).collect();
        let mut seen = devices.clone();
        seen.sort_unstable();
        seen.dedup();
        if backends.is_empty() || seen.len() != devices.len() {
            return Err(ComputeError::shape(
                "nccl_init",
                "one backend per GPU, each device once",
                format!("devices {devices:?}"),
            ));
        }
        let api = sys::api()?;
        // NCCL creates its resources on the devices' primary contexts, the ones the backends use.
        let comms = api.init_all(&devices)?;
        let mut ranks = Vec::with_capacity(backends.len());
        for (comm, backend) in comms.iter().zip(backends) {
            match backend.dev.ctx.new_stream() {
                Ok(side) => ranks.push(Rank { comm: *comm, backend: backend.clone(), side }),
                Err(e) => {
                    for c in &comms {
                        let _ = api.destroy(*c);
                    }
                    return Err(super::driver::err("nccl_init", e));
                }
            }
        }
        Ok(Communicator { api, ranks, issuing: Mutex::new(()) })
    }

    /// The number of ranks (GPUs).
    pub fn ranks(&self) -> usize {
        self.ranks.len()
    }

    /// The backend of rank `rank`.
    pub fn backend(&self, rank: usize) -> Option<&CudaBackend> {
        self.ranks.get(rank).map(|r| &r.backend)
    }

    /// Checks one tensor per rank on its device, all of one dtype and of
    /// `len` elements each (`len` of the first when `None`); their device
    /// addresses, the length and the NCCL dtype.
    fn operands(&self, what: &'static str, tensors: &[&Tensor], len: Option<usize>) -> Result<(Vec<u64>, usize, i32)> {
        let shapes = || tensors.iter().map(|t| format!("[{}] {}", t.len(), t.dtype())).collect::<Vec<_>>().join(", ");
        if tensors.len() != self.ranks.len() {
            let detail = format!("one tensor per rank ({} ranks)", self.ranks.len());
            return Err(ComputeError::shape(what, detail, shapes()));
        }
        let first = tensors.first().map_or((0, DType::F32), |t| (t.len(), t.dtype()));
        let len = len.unwrap_or(first.0);
        if tensors.iter().any(|t| t.len() != len || t.dtype() != first.1) {
            return Err(ComputeError::shape(what, format!("every tensor {len} elements of {}", first.1), shapes()));
        }
        let code = dtype_code(first.1, what, len)?;
        let probe = Op::unary(compute_core::UnaryOp::Relu, len.max(1));
        let ptrs =
            tensors.iter().zip(&self.ranks).map(|(t, r)| r.backend.ptr(t, &probe)).collect::<Result<Vec<_>>>()?;
        Ok((ptrs, len, code))
    }

    /// Runs `each(rank, comm, stream)` for every rank inside one NCCL group,
    /// on each rank's backend stream.
    fn group(&self, each: impl FnMut(usize, sys::Comm, cudarc::driver::sys::CUstream) -> Result<()>) -> Result<()> {
        self.group_on(false, each)
    }

    /// [`Communicator::group`] on each rank's backend stream, or on its side
    /// stream when `side`.
    fn group_on(
        &self,
        side: bool,
        mut each: impl FnMut(usize, sys::Comm, cudarc::driver::sys::CUstream) -> Result<()>,
    ) -> Result<()> {
        let _one = lock(&self.issuing);
        self.api.group_start()?;
        let mut first_err = None;
        for (rank, r) in self.ranks.iter().enumerate() {
            let stream = if side { r.side.cu_stream() } else { r.backend.dev.stream.cu_stream() };
            if let Err(e) = each(rank, r.comm, stream) {
                first_err = Some(e);
                break;
            }
        }
        // The group is closed whatever happened inside it.
        let end = self.api.group_end();
        match first_err {
            Some(e) => Err(e),
            None => end,
        }
    }

    /// Replaces each rank's tensor by `op` over all ranks' tensors,
    /// element-wise (one tensor per rank, same length and dtype). Moves
    /// about `2·(ranks − 1)/ranks` times the tensor's bytes over each link.
    pub fn all_reduce(&self, tensors: &[&Tensor], op: ReduceOp) -> Result<()> {
        let (ptrs, len, dt) = self.operands("all_reduce", tensors, None)?;
        self.group(|rank, comm, stream| {
            let p = ptrs[rank];
            // SAFETY: `p` addresses this rank's tensor (`len` elements of
            // `dt`, checked on this rank's device), kept alive by the caller's
            // borrow until the call returns; NCCL works on the device in
            // stream order, and the tensor's memory is freed stream-ordered
            // after it.
            unsafe { self.api.all_reduce(p, p, len, dt, op.code(), comm, stream) }
        })
    }

    /// Copies rank `root`'s tensor into every other rank's (same length and dtype).
    pub fn broadcast(&self, tensors: &[&Tensor], root: usize) -> Result<()> {
        let (ptrs, len, dt) = self.operands("broadcast", tensors, None)?;
        let root_c = i32::try_from(root).ok().filter(|_| root < self.ranks.len()).ok_or_else(|| {
            ComputeError::shape("broadcast", format!("root {root} of {} ranks", self.ranks.len()), format!("[{len}]"))
        })?;
        self.group(|rank, comm, stream| {
            let p = ptrs[rank];
            // SAFETY: as in `all_reduce`.
            unsafe { self.api.broadcast(p, p, len, dt, root_c, comm, stream) }
        })
    }

    /// Each rank's `outputs[rank]` (`ranks × n` elements) gets every rank's
    /// `inputs` (`n` each) in rank order.
    pub fn all_gather(&self, inputs: &[&Tensor], outputs: &[&Tensor]) -> Result<()> {
        let (ins, n, dt) = self.operands("all_gather", inputs, None)?;
        let (outs, _, dt_out) = self.operands("all_gather", outputs, Some(n * self.ranks.len()))?;
        if dt != dt_out {
            return Err(ComputeError::shape("all_gather", "outputs of the inputs' dtype", "inputs and outputs"));
        }
        self.group(|rank, comm, stream| {
            // SAFETY: as in `all_reduce`; `outs[rank]` holds `ranks × n` elements (checked).
            unsafe { self.api.all_gather(ins[rank], outs[rank], n, dt, comm, stream) }
        })
    }

    /// `outputs[rank]` (`n` elements) gets block `rank` of `op` over every
    /// rank's `inputs` (`ranks × n` each).
    pub fn reduce_scatter(&self, inputs: &[&Tensor], outputs: &[&Tensor], op: ReduceOp) -> Result<()> {
        let (outs, n, dt) = self.operands("reduce_scatter", outputs, None)?;
        let (ins, _, dt_in) = self.operands("reduce_scatter", inputs, Some(n * self.ranks.len()))?;
        if dt != dt_in {
            return Err(ComputeError::shape("reduce_scatter", "outputs of the inputs' dtype", "inputs and outputs"));
        }
        self.group(|rank, comm, stream| {
            // SAFETY: as in `all_reduce`; `ins[rank]` holds `ranks × n` elements (checked).
            unsafe { self.api.reduce_scatter(ins[rank], outs[rank], n, dt, op.code(), comm, stream) }
        })
    }

    /// Sends block `i` of `source` (on rank 0, `ranks × n` elements) to
    /// `outputs[i]` (`n` elements on rank `i`; rank 0's block is a device
    /// copy), point to point. Moves `(ranks − 1)/ranks` of `source`'s bytes
    /// out of rank 0.
    pub fn scatter(&self, source: &Tensor, outputs: &[&Tensor]) -> Result<()> {
        let (outs, n, dt) = self.operands("scatter", outputs, None)?;
        let r = self.ranks.len();
        if source.len() != n * r || source.dtype() != outputs[0].dtype() {
            let shapes =
                format!("source [{}] {}, {r} outputs of [{n}] {}", source.len(), source.dtype(), outputs[0].dtype());
            return Err(ComputeError::shape("scatter", "a source of ranks × n values of the outputs' dtype", shapes));
        }
        let root = &self.ranks[0].backend;
        let src = root.ptr(source, &Op::unary(compute_core::UnaryOp::Relu, source.len().max(1)))?;
        let es = source.dtype().size_in_bytes();
        plan::Launcher::copy(&*root.dev, outs[0], src, n * es, "scatter")?;
        self.group(|rank, comm, stream| {
            // SAFETY: rank 0's source holds `ranks × n` elements and each
            // output `n` (checked), alive until the streams have run this.
            unsafe {
                match rank {
                    0 => {
                        (1..r).try_for_each(|p| self.api.send(src + (p * n * es) as u64, n, dt, p as i32, comm, stream))
                    }
                    _ => self.api.recv(outs[rank], n, dt, 0, comm, stream),
                }
            }
        })
    }

    /// Waits for every rank's queued work (collectives included).
    pub fn synchronize(&self) -> Result<()> {
        self.ranks.iter().try_for_each(|r| compute_core::Backend::synchronize(&r.backend))
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        for r in &self.ranks {
            // Queued collectives finish before their communicator goes.
            let _ = compute_core::Backend::synchronize(&r.backend);
            let _ = r.side.synchronize();
            let _ = self.api.destroy(r.comm);
        }
    }
}
