//! The shared conformance suite on the wgpu backend (lavapipe in CI, the real
//! GPU on the GPU machine), with every dtype required: each op on `f32`, `f16`
//! and `bf16`, and casts between any two, bit for bit. Without any adapter the
//! groups print SKIPPED, unless `COMPUTE_REQUIRE` lists `wgpu` (then they fail).
use compute_core::{BackendKind, DType, conformance::Config};
use compute_wgpu::WgpuBackend;

compute_core::conformance_tests!(WgpuBackend::new, BackendKind::Wgpu, Config::from_env().with_dtypes(&DType::ALL));
