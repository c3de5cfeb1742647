//! The one error type every backend returns.

use std::fmt;
use std::sync::Arc;

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
    /// An operand's dtype does not match what the op states (e.g. a `bf16`
    /// tensor passed to an `f32` op).
    #[error("{op}: dtype error: {detail} (shapes: {shapes})")]
    DType {
        /// Op name.
        op: &'static str,
        /// Which operand, and its dtype against the op's.
        detail: String,
        /// The op's shapes and dtypes, e.g. `a=[64] b=[64] bf16`.
        shapes: String,
    },
    /// The backend (or its device, e.g. a wgpu adapter without `SHADER_F16`)
    /// cannot compute on this dtype.
    #[error("{op}: {dtype} is not supported by the {backend} backend: {reason} (shapes: {shapes})")]
    UnsupportedDType {
        /// Op name.
        op: &'static str,
        /// Backend that refused it.
        backend: BackendKind,
        /// The dtype it cannot do.
        dtype: crate::DType,
        /// Why, in words a user can act on.
        reason: String,
        /// The op's shapes and dtypes.
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
        /// The driver's own error, when there is one: also what
        /// [`std::error::Error::source`] returns.
        #[source]
        cause: Option<Cause>,
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
        /// The driver's own error (e.g. cudarc's `DriverError` with its CUDA
        /// result code), when there is one: also what
        /// [`std::error::Error::source`] returns.
        #[source]
        cause: Option<Cause>,
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

    /// Builds a [`ComputeError::UnsupportedDType`] for `op` on `backend`.
    pub fn unsupported_dtype(
        op: &crate::Op,
        backend: BackendKind,
        dtype: crate::DType,
        reason: impl Into<String>,
    ) -> Self {
        ComputeError::UnsupportedDType { op: op.name(), backend, dtype, reason: reason.into(), shapes: op.shapes() }
    }

    /// Builds a [`ComputeError::Driver`] without a cause (add one with [`ComputeError::with_cause`]).
    pub fn driver(op: &'static str, backend: BackendKind, message: impl Into<String>) -> Self {
        ComputeError::Driver { op, backend, message: message.into(), cause: None }
    }

    /// Builds a [`ComputeError::DeviceLost`] without a cause.
    pub fn device_lost(backend: BackendKind, reason: impl Into<String>) -> Self {
        ComputeError::DeviceLost { backend, reason: reason.into(), cause: None }
    }

    /// This error with `cause` kept as its source, for the variants that carry
    /// one ([`ComputeError::Driver`], [`ComputeError::DeviceLost`]); other
    /// variants are returned unchanged. Costs one allocation.
    pub fn with_cause(self, cause: impl std::error::Error + Send + Sync + 'static) -> Self {
        match self {
            ComputeError::Driver { op, backend, message, .. } => {
                ComputeError::Driver { op, backend, message, cause: Some(Cause::new(cause)) }
            }
            ComputeError::DeviceLost { backend, reason, .. } => {
                ComputeError::DeviceLost { backend, reason, cause: Some(Cause::new(cause)) }
            }
            other => other,
        }
    }
}

/// The error a driver or API returned, kept inside a [`ComputeError`] so a
/// caller can inspect it rather than a string: `err.source()` yields it, and
/// `downcast_ref` recovers its type, e.g. cudarc's `DriverError` and its
/// `CUresult`:
///
/// ```
/// use std::error::Error;
/// use compute_core::{BackendKind, ComputeError};
/// #[derive(Debug)]
/// struct DriverSaid(i32);
/// impl std::fmt::Display for DriverSaid {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
///         write!(f, "code {}", self.0)
///     }
/// }
/// impl Error for DriverSaid {}
///
/// let e = ComputeError::driver("matmul", BackendKind::Cuda, "launch failed").with_cause(DriverSaid(719));
/// let code = e.source().and_then(|s| s.downcast_ref::<DriverSaid>()).map(|d| d.0);
/// assert_eq!(code, Some(719));
/// ```
///
/// Shared (`Arc`), so errors stay cheap to clone. Two causes compare equal when
/// their messages do.
#[derive(Clone)]
pub struct Cause(Arc<dyn std::error::Error + Send + Sync + 'static>);

impl Cause {
    /// Wraps `error`. Costs one allocation.
    pub fn new(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        Cause(Arc::new(error))
    }

    /// The error itself, if it is a `T`.
    pub fn downcast_ref<T: std::error::Error + 'static>(&self) -> Option<&T> {
        self.0.downcast_ref::<T>()
    }
}

/// Dereferences to the wrapped error, which is also what
/// [`ComputeError`]'s `source()` returns (not this wrapper), so `downcast_ref`
/// on it finds the driver's type.
impl std::ops::Deref for Cause {
    type Target = dyn std::error::Error + Send + Sync + 'static;
    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

impl fmt::Debug for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}

impl PartialEq for Cause {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.to_string() == other.0.to_string()
    }
}

/// `Result` with [`ComputeError`].
pub type Result<T, E = ComputeError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn a_cause_is_the_source_and_keeps_its_type() {
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "no write access");
        let e = ComputeError::driver("calibrate", BackendKind::Simd, "writing the profile").with_cause(io);
        assert_eq!(e.to_string(), "calibrate: simd driver error: writing the profile");
        let source = e.source().expect("the cause is the source");
        let io = source.downcast_ref::<std::io::Error>().expect("the io::Error itself, not a wrapper");
        assert_eq!(io.kind(), std::io::ErrorKind::PermissionDenied);
        // Clones share the cause and compare equal; a different cause does not.
        assert_eq!(e.clone(), e);
        let other = ComputeError::driver("calibrate", BackendKind::Simd, "writing the profile")
            .with_cause(std::io::Error::other("disk full"));
        assert_ne!(e, other);
        let lost = ComputeError::device_lost(BackendKind::Cuda, "reset").with_cause(std::fmt::Error);
        assert!(lost.source().is_some_and(|s| s.is::<std::fmt::Error>()));
        // Variants without a cause are unchanged and have no source.
        let shape = ComputeError::shape("add", "lengths differ", "a=[3] b=[4]");
        assert_eq!(shape.clone().with_cause(std::fmt::Error), shape);
        assert!(shape.source().is_none());
        assert!(ComputeError::driver("x", BackendKind::Wgpu, "m").source().is_none());
    }
}
