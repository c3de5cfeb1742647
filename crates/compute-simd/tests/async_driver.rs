//! The conformance suite's async driver (`run_group_async`, what the browser
//! runs) on the CPU backend: groups whose calls feed each other (device
//! chains, host chains whose inputs are earlier outputs) and the error
//! checks pass as they do through the blocking driver.
use compute_core::async_ops::block_on;
use compute_core::conformance::{Config, Group, run_group_async};
use compute_core::{DType, rng};
use compute_simd::SimdBackend;

#[test]
fn chained_and_error_groups_pass_through_the_async_driver() {
    let cpu = SimdBackend::new();
    let cfg = Config::from_env().with_dtypes(&DType::ALL);
    for group in [Group::Tensors, Group::Errors, Group::Rows] {
        let seed = rng::fresh_seed();
        let report = block_on(run_group_async(&cpu, group, cfg, seed));
        assert!(report.passed(), "{group:?} (seed {seed}): {:?}", report.failures);
        assert!(report.calls > 0, "{group:?} made no call");
    }
}
