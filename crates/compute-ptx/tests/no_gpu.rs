//! Without the CUDA driver library the backend is a typed error, never a panic.
#![cfg(feature = "cuda")]

use compute_core::{BackendKind, ComputeError};
use compute_ptx::CudaBackend;
use compute_ptx::cuda::probe;

fn driver_library_present() -> bool {
    ["libcuda.so", "libcuda.so.1"].iter().any(|name| {
        std::env::var("LD_LIBRARY_PATH")
            .unwrap_or_default()
            .split(':')
            .chain(["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/nvidia/lib64"])
            .any(|dir| std::path::Path::new(dir).join(name).exists())
    })
}

#[test]
fn new_is_device_unavailable_or_a_working_backend() {
    match CudaBackend::new() {
        Ok(b) => {
            // A GPU is here: the backend must describe it.
            let info = b.info().expect("a working backend describes its device");
            assert!(!info.name.is_empty());
            assert!(info.compute_capability.0 >= 8);
        }
        Err(ComputeError::DeviceUnavailable { backend, reason }) => {
            assert_eq!(backend, BackendKind::Cuda);
            assert!(!reason.is_empty());
            if !driver_library_present() {
                assert!(reason.contains("libcuda"), "{reason}");
            }
        }
        Err(other) => panic!("expected DeviceUnavailable or a backend, got {other:?}"),
    }
}

#[test]
fn probe_and_second_open_agree() {
    let a = probe(0).map(|i| i.name);
    let b = CudaBackend::new().map(|b| b.info().map(|i| i.name));
    match (a, b) {
        (Ok(n1), Ok(Ok(n2))) => assert_eq!(n1, n2),
        (Err(e1), Err(e2)) => assert_eq!(std::mem::discriminant(&e1), std::mem::discriminant(&e2)),
        (x, y) => panic!("probe and new disagree: {x:?} vs {y:?}"),
    }
}

#[test]
fn a_missing_device_ordinal_is_unavailable() {
    match CudaBackend::with_device(4096) {
        Err(ComputeError::DeviceUnavailable { .. }) => {}
        other => panic!("expected DeviceUnavailable for device 4096, got {other:?}"),
    }
}
