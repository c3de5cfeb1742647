//! bf16 and f16 through the same named ops as f32: a bf16 matmul into an f32
//! result, a bf16 RMS norm, a cast, and the typed errors of a dtype mismatch.
//! `cargo run --release -p compute-simd --example half_precision`
use compute_core::{Backend, DType, HostSlice, HostVec, MatmulSpec, Op, Ops, bf16, f16};

fn main() -> Result<(), compute_core::ComputeError> {
    let cpu = compute_simd::SimdBackend::new();
    let (m, k, n) = (8, 64, 16);
    let to_bf16 = |v: f32| bf16::from_f32(v);
    let a: Vec<bf16> = (0..m * k).map(|i| to_bf16((i % 7) as f32 * 0.25 - 0.75)).collect();
    let w: Vec<bf16> = (0..k * n).map(|i| to_bf16((i % 5) as f32 * 0.125 - 0.25)).collect();

    // bf16 × bf16 with f32 accumulation, written as f32.
    let mut logits = vec![0.0f32; m * n];
    cpu.matmul_spec(MatmulSpec::new(m, k, n).with_dtypes(DType::BF16, DType::F32), &a, &w, &mut logits)?;

    // The same named ops on bf16 data: RMS norm, then a cast to f16.
    let gamma = vec![bf16::ONE; k];
    let mut normed = vec![bf16::ZERO; m * k];
    cpu.rms_norm(&a, &gamma, m, k, 1e-6, &mut normed)?;
    let mut as_f16 = vec![f16::ZERO; m * k];
    cpu.cast(&normed, &mut as_f16)?;
    println!("logits[0] = {}, normed[0] = {}, as f16 = {}", logits[0], normed[0], as_f16[0]);

    // A dtype known only at run time: typed views through `run_typed`.
    let x = HostVec::from_f32(DType::F16, &[0.5, -1.25, 3.0]);
    let mut y = HostVec::zeros(DType::F16, 3);
    cpu.run_typed(
        &Op::unary(compute_core::UnaryOp::Gelu(compute_core::GeluForm::Erf), 3).with_dtype(DType::F16),
        &[x.as_slice()],
        y.as_mut(),
    )?;
    println!("gelu(f16) = {:?}", y.to_f32());

    // Operands of the wrong dtype are typed errors; the output is untouched.
    let relu = Op::unary(compute_core::UnaryOp::Relu, 3); // an f32 op
    if let Err(e) = cpu.run_typed(&relu, &[HostSlice::from(&as_f16[..3])], y.as_mut()) {
        println!("as expected: {e}");
    }
    Ok(())
}
