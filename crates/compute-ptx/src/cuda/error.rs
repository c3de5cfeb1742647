//! Driver errors as [`ComputeError`]s.

use compute_core::{BackendKind, ComputeError};
use cudarc::driver::{DriverError, sys::CUresult};

/// `CUDA_ERROR_NAME (the driver's description)`.
pub(crate) fn message(e: DriverError) -> String {
    let name = e.error_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|_| format!("{:?}", e.0));
    match e.error_string() {
        Ok(s) => format!("{name} ({})", s.to_string_lossy()),
        Err(_) => name,
    }
}

/// Maps a driver error of `op`: out of memory, a lost device (faults that
/// poison the context), a missing device, or any other driver error. A lost
/// device and other driver errors keep `e` as their
/// [`source`](std::error::Error::source), so a caller can read its `CUresult`.
pub(crate) fn driver_err(op: &'static str, e: DriverError) -> ComputeError {
    let backend = BackendKind::Cuda;
    match e.0 {
        CUresult::CUDA_ERROR_OUT_OF_MEMORY => ComputeError::OutOfMemory { op, backend, requested_bytes: 0 },
        CUresult::CUDA_ERROR_ILLEGAL_ADDRESS
        | CUresult::CUDA_ERROR_LAUNCH_FAILED
        | CUresult::CUDA_ERROR_ECC_UNCORRECTABLE
        | CUresult::CUDA_ERROR_HARDWARE_STACK_ERROR
        | CUresult::CUDA_ERROR_ILLEGAL_INSTRUCTION
        | CUresult::CUDA_ERROR_MISALIGNED_ADDRESS
        | CUresult::CUDA_ERROR_INVALID_ADDRESS_SPACE
        | CUresult::CUDA_ERROR_INVALID_PC
        | CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED
        | CUresult::CUDA_ERROR_DEINITIALIZED => {
            ComputeError::device_lost(backend, format!("{op}: {}", message(e))).with_cause(e)
        }
        CUresult::CUDA_ERROR_NO_DEVICE | CUresult::CUDA_ERROR_INVALID_DEVICE | CUresult::CUDA_ERROR_NOT_INITIALIZED => {
            ComputeError::DeviceUnavailable { backend, reason: format!("{op}: {}", message(e)) }
        }
        _ => ComputeError::driver(op, backend, message(e)).with_cause(e),
    }
}
