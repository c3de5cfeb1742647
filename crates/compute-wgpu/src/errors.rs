//! Turning wgpu's failures into typed [`ComputeError`]s.

use compute_core::{BackendKind, ComputeError};

/// The backend family every error of this crate names.
pub(crate) const KIND: BackendKind = BackendKind::Wgpu;

/// A driver-level failure of `op` with wgpu's message.
pub(crate) fn driver(op: &'static str, message: impl std::fmt::Display) -> ComputeError {
    ComputeError::Driver { op, backend: KIND, message: message.to_string() }
}

/// Maps an error captured by an error scope (or the uncaptured-error handler) for `op`.
/// `requested_bytes` is what the call tried to allocate, for out-of-memory errors.
pub(crate) fn from_wgpu(op: &'static str, error: wgpu::Error, requested_bytes: u64) -> ComputeError {
    match error {
        wgpu::Error::OutOfMemory { .. } => ComputeError::OutOfMemory { op, backend: KIND, requested_bytes },
        wgpu::Error::Validation { description, .. } => driver(op, format!("validation error: {description}")),
        wgpu::Error::Internal { description, .. } => driver(op, format!("internal error: {description}")),
    }
}

/// Maps a failed `device.poll`.
pub(crate) fn from_poll(op: &'static str, error: wgpu::PollError) -> ComputeError {
    driver(op, format!("waiting for the device failed: {error}"))
}

/// The call is larger than a device limit.
pub(crate) fn limit(op: &'static str, what: &'static str, requested: u64, maximum: u64) -> ComputeError {
    ComputeError::LimitExceeded { op, what, requested, maximum }
}

/// The device (or this target) cannot be used.
pub(crate) fn unavailable(reason: impl Into<String>) -> ComputeError {
    ComputeError::DeviceUnavailable { backend: KIND, reason: reason.into() }
}
