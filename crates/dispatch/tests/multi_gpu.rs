//! [`MultiGpu`] on the GPUs of this machine (feature `nccl`): a product
//! spread over every GPU equals the same product on GPU 0 alone, and the
//! calibrated fits are positive. Skips without a GPU or NCCL;
//! `COMPUTE_REQUIRE=nccl` turns the skip into a failure.

use compute_core::{Backend, ComputeError, DType, HostVec, MatmulSpec};
use dispatch::multi_gpu::{MultiGpu, cuda_devices};

#[test]
fn a_spread_product_equals_the_one_gpu_product() {
    let require = std::env::var("COMPUTE_REQUIRE").is_ok_and(|v| v.split(',').any(|s| s.trim() == "nccl"));
    let gpus = match MultiGpu::calibrate(DType::F32) {
        Ok(g) => g,
        Err(e @ ComputeError::DeviceUnavailable { .. }) => {
            assert!(!require, "NCCL required but {e}");
            eprintln!("SKIPPED: {e}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let p = gpus.profile().clone();
    assert_eq!(p.gpus, cuda_devices().len());
    for fit in [p.matmul, p.broadcast, p.send] {
        assert!(fit.rate > 0.0 && fit.fixed_s >= 0.0, "{p:?}");
    }
    let r = p.gpus;
    let (m, k, n) = (128 * r, 256, 192);
    let spec = MatmulSpec::new(m, k, n);
    // Small integers: exact in any order of summation.
    let ints = |len: usize, s: usize| (0..len).map(|i| ((i * 7 + s) % 7) as f32 - 3.0).collect::<Vec<f32>>();
    let b0 = gpus.backend(0).expect("GPU 0");
    let up = |v: &[f32]| b0.upload_typed(HostVec::from_f32(DType::F32, v).as_slice()).expect("upload");
    let (a, b) = (up(&ints(m * k, 1)), up(&ints(k * n, 2)));
    let mut results = Vec::new();
    for g in [1, r] {
        let c = up(&vec![f32::NAN; m * n]);
        gpus.matmul_on(g, &spec, &a, &b, &c).expect("matmul");
        let mut out = vec![0.0f32; m * n];
        b0.download(&c, &mut out).expect("download");
        results.push(out);
    }
    assert_eq!(results[0], results[1], "spread over {r} GPUs");
    // A small product stays on GPU 0.
    assert_eq!(gpus.plan(&MatmulSpec::new(r, 8, 8)).gpus, 1);
}
