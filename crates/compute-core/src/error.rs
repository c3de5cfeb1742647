//! The one error type every backend returns.

use thiserror::Error;

/// Which family of backend produced an error or ran a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum BackendKind {
    /// CPU SIMD (`compute-simd`).
    Simd,
    /// Any GPU through wgpu (`compute-wgpu`).
    Wgpu,
    /// NVIDIA GPUs through generated PTX and the CUDA driver (`compute-ptx`).
    Cuda,
}

impl BackendKind {
    /// Short lower-case name, as printed in tables and JSON (`simd`, `wgpu`, `cuda`).
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Simd => "simd",
            BackendKind::Wgpu => "wgpu",
            BackendKind::Cuda => "cuda",
        }
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Every failure of a compute call. Each variant names the op (or the
/// backend action) and enough of the shapes or limits to act on it.
///
/// A call that returns an error has written nothing to the caller's output.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum ComputeError {
    /// Input or output shapes do not fit the op (mismatch, zero size, overflow).
    #[error("{op}: shape error: {detail} (shapes: {shapes})")]
    Shape {
        /// Op name, e.g. `matmul`.
        op: &'static str,
        /// What is wrong.
        detail: String,
        /// The shapes as given, e.g. `a=[3x4] b=[5x6]`.
        shapes: String,
    },
    /// The backend does not implement this op (or this variant of it).
    #[error("{op}: not supported by the {backend} backend")]
    Unsupported {
        /// Op name.
        op: &'static str,
        /// Backend that refused it.
        backend: BackendKind,
    },
    /// The backend's device, driver or library is not present on this machine.
    #[error("{backend} backend unavailable: {reason}")]
    DeviceUnavailable {
        /// Backend that is missing.
        backend: BackendKind,
        /// Why, in words a user can act on.
        reason: String,
    },
    /// The device could not allocate what the call needs.
    #[error("{op}: out of memory on {backend}: requested {requested_bytes} bytes")]
    OutOfMemory {
        /// Op (or `alloc`/`upload`) that needed the memory.
        op: &'static str,
        /// Backend whose memory ran out.
        backend: BackendKind,
        /// Bytes asked for.
        requested_bytes: u64,
    },
    /// The device was lost (driver reset, removal); the backend must be recreated.
    #[error("{backend} device lost: {reason}")]
    DeviceLost {
        /// Backend whose device was lost.
        backend: BackendKind,
        /// Driver's message.
        reason: String,
    },
    /// The driver or API reported an error while running an op.
    #[error("{op}: {backend} driver error: {message}")]
    Driver {
        /// Op (or action) that failed.
        op: &'static str,
        /// Backend that failed.
        backend: BackendKind,
        /// Driver's message.
        message: String,
    },
    /// A kernel or shader failed to compile or load.
    #[error("{backend}: compiling kernel `{kernel}` failed: {message}")]
    Compile {
        /// Backend doing the compilation.
        backend: BackendKind,
        /// Kernel or shader entry point.
        kernel: String,
        /// Compiler's message.
        message: String,
    },
    /// The call is larger than a device limit allows.
    #[error("{op}: {what} exceeds the device limit: requested {requested}, maximum {maximum}")]
    LimitExceeded {
        /// Op that hit the limit.
        op: &'static str,
        /// Which limit (e.g. `storage buffer binding bytes`).
        what: &'static str,
        /// Amount requested.
        requested: u64,
        /// Device maximum.
        maximum: u64,
    },
    /// A device tensor belongs to another backend or device than the one asked to use it.
    #[error("{op}: tensor lives on {found}, not on {expected}")]
    WrongDevice {
        /// Op that received the tensor.
        op: &'static str,
        /// Device the backend expected.
        expected: String,
        /// Device the tensor is on.
        found: String,
    },
}

impl ComputeError {
    /// Builds a [`ComputeError::Shape`].
    pub fn shape(op: &'static str, detail: impl Into<String>, shapes: impl Into<String>) -> Self {
        ComputeError::Shape { op, detail: detail.into(), shapes: shapes.into() }
    }
}

/// `Result` with [`ComputeError`].
pub type Result<T, E = ComputeError> = std::result::Result<T, E>;
