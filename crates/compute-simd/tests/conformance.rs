//! The shared conformance suite on the CPU backend, once per ISA path this CPU
//! supports (AVX-512 and AVX2+FMA on x86-64, NEON on aarch64, portable
//! everywhere). A path this CPU lacks is reported as skipped.
use compute_core::{BackendKind, ComputeError, DType, conformance::Config};
use compute_simd::{Isa, SimdBackend};

/// Every dtype: the CPU runs every op on each float dtype, and every
/// quantized matmul and cast of each block dtype.
const DTYPES: &[DType] = &[DType::F32, DType::F16, DType::BF16, DType::Q4K, DType::Q5K, DType::Q6K, DType::Q8_0];

/// The backend on `isa`; `Unsupported` (the group is skipped, even where the
/// CPU backend is required) when this CPU lacks that path.
fn on(isa: Isa) -> Result<SimdBackend, ComputeError> {
    if !isa.is_supported() {
        eprintln!("this CPU has no {isa} path");
        return Err(ComputeError::Unsupported { op: "conformance", backend: BackendKind::Simd });
    }
    SimdBackend::new().with_isa(isa)
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::*;
    compute_core::conformance_tests!(|| on(Isa::Avx512), BackendKind::Simd, Config::from_env().with_dtypes(DTYPES));
}
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    compute_core::conformance_tests!(|| on(Isa::Avx2), BackendKind::Simd, Config::from_env().with_dtypes(DTYPES));
}
#[cfg(target_arch = "aarch64")]
mod neon {
    use super::*;
    compute_core::conformance_tests!(|| on(Isa::Neon), BackendKind::Simd, Config::from_env().with_dtypes(DTYPES));
}
mod portable {
    use super::*;
    compute_core::conformance_tests!(|| on(Isa::Portable), BackendKind::Simd, Config::from_env().with_dtypes(DTYPES));
}
mod single_thread {
    use super::*;
    compute_core::conformance_tests!(
        || SimdBackend::with_threads(1),
        BackendKind::Simd,
        Config::from_env().with_dtypes(DTYPES)
    );
}

#[test]
fn async_names_match_the_blocking_ones() {
    let mut rng = compute_core::conformance::rng::Rng::new(compute_core::conformance::rng::fresh_seed());
    compute_core::conformance::check_async_ops(&SimdBackend::new(), &mut rng).unwrap();
}
