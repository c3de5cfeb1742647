//! The shared conformance suite on the CUDA backend. Without a GPU every group
//! prints SKIPPED (unless `COMPUTE_REQUIRE` lists `cuda`); on the GPU machine run
//! with `COMPUTE_REQUIRE=cuda COMPUTE_CONFORMANCE=large`.
#![cfg(feature = "cuda")]

use compute_core::{BackendKind, DType, conformance::Config};
use compute_ptx::CudaBackend;

compute_core::conformance_tests!(CudaBackend::new, BackendKind::Cuda, Config::from_env().with_dtypes(&DType::ALL));
