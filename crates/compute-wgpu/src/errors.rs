//! Turning wgpu's failures into typed [`ComputeError`]s.

use compute_core::{BackendKind, ComputeError};

/// The backend family every error of this crate names.
pub(crate) const KIND: BackendKind = BackendKind::Wgpu;

/// A driver-level failure of `op` with wgpu's message.
pub(crate) fn driver(op: &'static str, message: impl std::fmt::Display) -> ComputeError {
    ComputeError::Driver { op, backend: KIND, message: message.to_string(), cause: None }
}

/// A validation or internal error that wgpu reported, kept as the
/// [`source`](std::error::Error::source) of the [`ComputeError::Driver`] it
/// became: `err.source().and_then(|s| s.downcast_ref::<WgpuError>())`.
///
/// (`wgpu::Error` itself cannot be kept: its inner source is not `Sync`, and
/// compute errors cross threads.)
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WgpuError {
    /// Which of wgpu's error kinds it was.
    pub kind: WgpuErrorKind,
    /// wgpu's description, as it gave it.
    pub description: String,
}

/// The kinds of [`WgpuError`] (wgpu's out-of-memory errors become
/// [`ComputeError::OutOfMemory`] instead).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WgpuErrorKind {
    /// `wgpu::Error::Validation`: the call broke a rule of the WebGPU API.
    Validation,
    /// `wgpu::Error::Internal`: the implementation or driver failed.
    Internal,
}

impl std::fmt::Display for WgpuError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.kind {
            WgpuErrorKind::Validation => "validation error",
            WgpuErrorKind::Internal => "internal error",
        };
        write!(f, "{kind}: {}", self.description)
    }
}

impl std::error::Error for WgpuError {}

/// Maps an error captured by an error scope (or the uncaptured-error handler) for `op`.
/// `requested_bytes` is what the call tried to allocate, for out-of-memory errors.
pub(crate) fn from_wgpu(op: &'static str, error: wgpu::Error, requested_bytes: u64) -> ComputeError {
    let (kind, description) = match error {
        wgpu::Error::OutOfMemory { .. } => return ComputeError::OutOfMemory { op, backend: KIND, requested_bytes },
        wgpu::Error::Validation { description, .. } => (WgpuErrorKind::Validation, description),
        wgpu::Error::Internal { description, .. } => (WgpuErrorKind::Internal, description),
    };
    let cause = WgpuError { kind, description };
    driver(op, &cause).with_cause(cause)
}

/// Maps a failed `device.poll`, keeping wgpu's `PollError` as the source.
pub(crate) fn from_poll(op: &'static str, error: wgpu::PollError) -> ComputeError {
    driver(op, format!("waiting for the device failed: {error}")).with_cause(error)
}

/// The call is larger than a device limit.
pub(crate) fn limit(op: &'static str, what: &'static str, requested: u64, maximum: u64) -> ComputeError {
    ComputeError::LimitExceeded { op, what, requested, maximum }
}

/// The device (or this target) cannot be used.
pub(crate) fn unavailable(reason: impl Into<String>) -> ComputeError {
    ComputeError::DeviceUnavailable { backend: KIND, reason: reason.into() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn wgpu_errors_keep_their_kind_and_description_as_the_source() {
        let e = from_wgpu(
            "matmul",
            wgpu::Error::Validation { source: Box::new(std::fmt::Error), description: "binding too small".into() },
            0,
        );
        assert!(matches!(e, ComputeError::Driver { op: "matmul", backend: KIND, .. }), "{e:?}");
        let cause = e.source().and_then(|s| s.downcast_ref::<WgpuError>()).expect("a WgpuError source");
        assert_eq!(cause.kind, WgpuErrorKind::Validation);
        assert_eq!(cause.description, "binding too small");
        assert!(e.to_string().contains("validation error: binding too small"), "{e}");
        let oom = from_wgpu("alloc", wgpu::Error::OutOfMemory { source: Box::new(std::fmt::Error) }, 1 << 20);
        assert_eq!(oom, ComputeError::OutOfMemory { op: "alloc", backend: KIND, requested_bytes: 1 << 20 });
    }
}
