//! The few NCCL entry points [`super::nccl`] calls, loaded at run time.
//!
//! `libnccl` is looked for as `libnccl.so`, then `libnccl.so.2` (what most
//! distributions and the NVIDIA packages ship: the unversioned name exists
//! only with the development files). Our own loader rather than cudarc's
//! `nccl` module: cudarc's looks for neither `.so.2` nor any way to report a
//! missing library but a panic. A missing library, or one without a symbol
//! used here, is [`ComputeError::DeviceUnavailable`].

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;

use compute_core::{BackendKind, ComputeError, Result};
use cudarc::driver::sys::CUstream;
use libloading::Library;

/// `ncclComm_t`: an opaque communicator handle.
pub(crate) type Comm = *mut c_void;
/// `ncclResult_t`: 0 is `ncclSuccess`.
type NcclResult = c_int;

/// `ncclDataType_t` values.
pub(crate) const FLOAT16: c_int = 6;
pub(crate) const FLOAT32: c_int = 7;
pub(crate) const BFLOAT16: c_int = 9;

/// `ncclRedOp_t` values.
pub(crate) const SUM: c_int = 0;
pub(crate) const PROD: c_int = 1;
pub(crate) const MAX: c_int = 2;
pub(crate) const MIN: c_int = 3;
pub(crate) const AVG: c_int = 4;

/// The library names tried, in order.
const NAMES: [&str; 2] = ["libnccl.so", "libnccl.so.2"];

/// The loaded library's entry points.
pub(crate) struct Api {
    get_version: unsafe extern "C" fn(*mut c_int) -> NcclResult,
    get_error_string: unsafe extern "C" fn(NcclResult) -> *const c_char,
    comm_init_all: unsafe extern "C" fn(*mut Comm, c_int, *const c_int) -> NcclResult,
    comm_destroy: unsafe extern "C" fn(Comm) -> NcclResult,
    group_start: unsafe extern "C" fn() -> NcclResult,
    group_end: unsafe extern "C" fn() -> NcclResult,
    all_reduce: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, CUstream) -> NcclResult,
    broadcast: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, CUstream) -> NcclResult,
    reduce_scatter: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, CUstream) -> NcclResult,
    all_gather: unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, Comm, CUstream) -> NcclResult,
    send: unsafe extern "C" fn(*const c_void, usize, c_int, c_int, Comm, CUstream) -> NcclResult,
    recv: unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, Comm, CUstream) -> NcclResult,
    /// Keeps the entry points valid.
    _lib: Library,
}

/// An error code NCCL returned, with its description: the
/// [`source`](std::error::Error::source) of the [`ComputeError::Driver`] it becomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NcclError {
    /// The `ncclResult_t` value.
    pub code: i32,
    /// `ncclGetErrorString` of it.
    pub message: String,
}

impl std::fmt::Display for NcclError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NCCL error {}: {}", self.code, self.message)
    }
}

impl std::error::Error for NcclError {}

fn unavailable(reason: String) -> ComputeError {
    ComputeError::DeviceUnavailable { backend: BackendKind::Cuda, reason }
}

impl Api {
    /// Opens the library and resolves every entry point.
    fn load() -> Result<Api> {
        let mut tried = Vec::new();
        for name in NAMES {
            // SAFETY: loading NCCL runs its initialisers, which only set up
            // the library's own state.
            match unsafe { Library::new(name) } {
                Ok(lib) => return Api::resolve(lib, name),
                Err(e) => tried.push(format!("{name}: {e}")),
            }
        }
        Err(unavailable(format!("NCCL not found ({})", tried.join("; "))))
    }

    fn resolve(lib: Library, name: &str) -> Result<Api> {
        macro_rules! sym {
            ($s:literal) => {
                // SAFETY: the symbol is NCCL's documented C function of this
                // name, whose signature the field's type repeats (nccl.h,
                // NCCL 2.x); the pointer stays valid while `_lib` lives.
                *unsafe { lib.get($s) }
                    .map_err(|e| unavailable(format!("{name} lacks {}: {e}", String::from_utf8_lossy($s))))?
            };
        }
        Ok(Api {
            get_version: sym!(b"ncclGetVersion"),
            get_error_string: sym!(b"ncclGetErrorString"),
            comm_init_all: sym!(b"ncclCommInitAll"),
            comm_destroy: sym!(b"ncclCommDestroy"),
            group_start: sym!(b"ncclGroupStart"),
            group_end: sym!(b"ncclGroupEnd"),
            all_reduce: sym!(b"ncclAllReduce"),
            broadcast: sym!(b"ncclBroadcast"),
            reduce_scatter: sym!(b"ncclReduceScatter"),
            all_gather: sym!(b"ncclAllGather"),
            send: sym!(b"ncclSend"),
            recv: sym!(b"ncclRecv"),
            _lib: lib,
        })
    }

    /// `Ok` for `ncclSuccess`, else the [`ComputeError::Driver`] of `op`
    /// with the [`NcclError`] as its cause.
    pub(crate) fn check(&self, op: &'static str, r: NcclResult) -> Result<()> {
        if r == 0 {
            return Ok(());
        }
        // SAFETY: ncclGetErrorString returns a static, NUL-terminated string
        // for any code (or null, handled).
        let text = unsafe { (self.get_error_string)(r) };
        let message = if text.is_null() {
            format!("code {r}")
        } else {
            // SAFETY: non-null, NUL-terminated and static (above).
            unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned()
        };
        let cause = NcclError { code: r, message: message.clone() };
        Err(ComputeError::driver(op, BackendKind::Cuda, format!("NCCL: {message}")).with_cause(cause))
    }

    /// The library's version as NCCL encodes it (e.g. 22803 for 2.28.3).
    pub(crate) fn version(&self) -> Result<i32> {
        let mut v: c_int = 0;
        // SAFETY: `v` is a valid place for the one int NCCL writes.
        let r = unsafe { (self.get_version)(&mut v) };
        self.check("nccl_version", r)?;
        Ok(v)
    }

    /// `ncclCommInitAll` over `devices` (CUDA ordinals): one communicator per device.
    pub(crate) fn init_all(&self, devices: &[c_int]) -> Result<Vec<Comm>> {
        let n = c_int::try_from(devices.len()).map_err(|_| ComputeError::LimitExceeded {
            op: "nccl_init",
            what: "devices",
            requested: devices.len() as u64,
            maximum: c_int::MAX as u64,
        })?;
        let mut comms: Vec<Comm> = vec![std::ptr::null_mut(); devices.len()];
        // SAFETY: `comms` has room for one handle per device in `devices`, both `n` long.
        let r = unsafe { (self.comm_init_all)(comms.as_mut_ptr(), n, devices.as_ptr()) };
        self.check("nccl_init", r)?;
        Ok(comms)
    }

    /// `ncclCommDestroy`.
    pub(crate) fn destroy(&self, comm: Comm) -> Result<()> {
        // SAFETY: `comm` came from `init_all` and is destroyed once (by its owner's drop).
        let r = unsafe { (self.comm_destroy)(comm) };
        self.check("nccl_destroy", r)
    }

    /// `ncclGroupStart`.
    pub(crate) fn group_start(&self) -> Result<()> {
        // SAFETY: no arguments; pairs with `group_end`.
        let r = unsafe { (self.group_start)() };
        self.check("nccl_group", r)
    }

    /// `ncclGroupEnd`.
    pub(crate) fn group_end(&self) -> Result<()> {
        // SAFETY: no arguments; closes the group `group_start` opened.
        let r = unsafe { (self.group_end)() };
        self.check("nccl_group", r)
    }

    /// `ncclAllReduce` of `count` elements.
    ///
    /// # Safety
    /// `send` and `recv` address `count` elements of `dtype` on the
    /// communicator's device, live until the stream has run the collective.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn all_reduce(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: c_int,
        op: c_int,
        comm: Comm,
        stream: CUstream,
    ) -> Result<()> {
        // SAFETY: the caller's contract.
        let r =
            unsafe { (self.all_reduce)(send as *const c_void, recv as *mut c_void, count, dtype, op, comm, stream) };
        self.check("all_reduce", r)
    }

    /// `ncclBroadcast` of `count` elements from rank `root`.
    ///
    /// # Safety
    /// As [`Api::all_reduce`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn broadcast(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: c_int,
        root: c_int,
        comm: Comm,
        stream: CUstream,
    ) -> Result<()> {
        // SAFETY: the caller's contract.
        let r =
            unsafe { (self.broadcast)(send as *const c_void, recv as *mut c_void, count, dtype, root, comm, stream) };
        self.check("broadcast", r)
    }

    /// `ncclReduceScatter`: `recv_count` elements out per rank.
    ///
    /// # Safety
    /// `send` addresses `recv_count × ranks` elements and `recv` `recv_count`,
    /// as in [`Api::all_reduce`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn reduce_scatter(
        &self,
        send: u64,
        recv: u64,
        recv_count: usize,
        dtype: c_int,
        op: c_int,
        comm: Comm,
        stream: CUstream,
    ) -> Result<()> {
        // SAFETY: the caller's contract.
        let r = unsafe {
            (self.reduce_scatter)(send as *const c_void, recv as *mut c_void, recv_count, dtype, op, comm, stream)
        };
        self.check("reduce_scatter", r)
    }

    /// `ncclAllGather`: `send_count` elements in per rank.
    ///
    /// # Safety
    /// `send` addresses `send_count` elements and `recv` `send_count × ranks`,
    /// as in [`Api::all_reduce`].
    pub(crate) unsafe fn all_gather(
        &self,
        send: u64,
        recv: u64,
        send_count: usize,
        dtype: c_int,
        comm: Comm,
        stream: CUstream,
    ) -> Result<()> {
        // SAFETY: the caller's contract.
        let r =
            unsafe { (self.all_gather)(send as *const c_void, recv as *mut c_void, send_count, dtype, comm, stream) };
        self.check("all_gather", r)
    }
}

impl Api {
    /// `ncclSend` of `count` elements to rank `peer` (matched by that rank's
    /// [`Api::recv`] inside the same group).
    ///
    /// # Safety
    /// `send` addresses `count` elements of `dtype` on the communicator's
    /// device, live until the stream has run the transfer.
    pub(crate) unsafe fn send(
        &self,
        send: u64,
        count: usize,
        dtype: c_int,
        peer: c_int,
        comm: Comm,
        stream: CUstream,
    ) -> Result<()> {
        // SAFETY: the caller's contract.
        let r = unsafe { (self.send)(send as *const c_void, count, dtype, peer, comm, stream) };
        self.check("send", r)
    }

    /// `ncclRecv` of `count` elements from rank `peer`.
    ///
    /// # Safety
    /// As [`Api::send`], for `recv`.
    pub(crate) unsafe fn recv(
        &self,
        recv: u64,
        count: usize,
        dtype: c_int,
        peer: c_int,
        comm: Comm,
        stream: CUstream,
    ) -> Result<()> {
        // SAFETY: the caller's contract.
        let r = unsafe { (self.recv)(recv as *mut c_void, count, dtype, peer, comm, stream) };
        self.check("recv", r)
    }
}

/// The library, loaded on first use (the outcome, success or the error, is
/// kept for the life of the process).
pub(crate) fn api() -> Result<&'static Api> {
    static API: OnceLock<std::result::Result<Api, ComputeError>> = OnceLock::new();
    API.get_or_init(Api::load).as_ref().map_err(Clone::clone)
}
