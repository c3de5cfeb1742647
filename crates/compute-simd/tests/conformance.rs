//! The shared conformance suite on the CPU backend, on the best ISA path.
//! (Every other path runs it too: `COMPUTE_SIMD_ISA=avx2|portable cargo test`.)
use compute_core::{BackendKind, conformance::Config};

compute_core::conformance_tests!(
    || Ok::<_, compute_core::ComputeError>(compute_simd::SimdBackend::new()),
    BackendKind::Simd,
    Config::from_env()
);
