//! The shared conformance suite through `Compute`: the CPU with nominal and
//! with measured profiles (so both CPU engines get calls), and with a failing
//! GPU in front (every host call falls back to the CPU). A `Compute` always
//! has the CPU, which computes every dtype, so every dtype is required.
mod common;

use std::sync::OnceLock;

use compute_core::{BackendKind, ComputeError, DType, conformance::Config};
use dispatch::calibrate::Options;
use dispatch::{Compute, Engine, Profile};

mod nominal {
    use super::*;
    compute_core::conformance_tests!(
        || Compute::builder().cpu().nominal_profile().build(),
        BackendKind::Simd,
        Config::from_env().with_dtypes(&DType::ALL)
    );
}

fn measured() -> Result<Profile, ComputeError> {
    static PROFILE: OnceLock<Result<Profile, ComputeError>> = OnceLock::new();
    PROFILE
        .get_or_init(|| {
            Compute::builder()
                .cpu()
                .calibration_options(Options::quick())
                .calibrate()
                .build()
                .map(|c| c.profile().clone())
        })
        .clone()
}

mod measured {
    use super::*;
    compute_core::conformance_tests!(
        || Compute::builder().cpu().profile(measured()?).build(),
        BackendKind::Simd,
        Config::from_env().with_dtypes(&DType::ALL)
    );
}

mod single_thread_engine {
    use super::*;
    compute_core::conformance_tests!(
        || Ok::<_, ComputeError>(
            Compute::builder()
                .cpu()
                .nominal_profile()
                .build()?
                .with_policy(dispatch::Policy::Fixed(Engine::SimdSingle))
        ),
        BackendKind::Simd,
        Config::from_env().with_dtypes(&DType::ALL)
    );
}

mod failing_gpu_in_front {
    use super::*;
    compute_core::conformance_tests!(
        || Compute::builder()
            .cpu()
            .engine(Engine::Cuda, common::FakeGpu::arc(BackendKind::Cuda, true))
            .profile(common::gpu_always_wins(Engine::Cuda))
            .build(),
        BackendKind::Simd,
        Config::from_env().with_dtypes(&DType::ALL)
    );
}

/// The discovered GPU engine of `kind` in front of the CPU, with a profile that
/// sends every call to it; unavailable (the groups skip, or fail under
/// `COMPUTE_REQUIRE`) when this build or machine has no such GPU.
fn gpu_first(engine: Engine) -> Result<Compute, ComputeError> {
    let found = dispatch::discover::probe().into_iter().find(|f| f.engine == engine);
    let backend = match found.map(|f| f.backend) {
        Some(Ok(b)) => b,
        Some(Err(e)) => return Err(e),
        None => {
            return Err(ComputeError::DeviceUnavailable { backend: engine.kind(), reason: "not probed".into() });
        }
    };
    Compute::builder().cpu().engine(engine, backend).profile(common::gpu_always_wins(engine)).build()
}

mod wgpu_first {
    use super::*;
    compute_core::conformance_tests!(
        || gpu_first(Engine::Wgpu),
        BackendKind::Wgpu,
        Config::from_env().with_dtypes(&DType::ALL)
    );
}

mod cuda_first {
    use super::*;
    compute_core::conformance_tests!(
        || gpu_first(Engine::Cuda),
        BackendKind::Cuda,
        Config::from_env().with_dtypes(&DType::ALL)
    );
}
