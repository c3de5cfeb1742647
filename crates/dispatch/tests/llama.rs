//! The Llama decoder (`dispatch::llama`) against its float64 reference on
//! the CPU: logits after a prompt and after each decoding step, and greedy
//! tokens, for `f32`, `bf16` and block-quantized weights. The GPU backends
//! run the same model in the GPU test binaries.

use std::sync::Arc;

use compute_core::{Backend, DType, RopeLayout};
use compute_simd::SimdBackend;
use dispatch::llama::{HostWeights, Llama, LlamaConfig, WeightFormat, reference_logits};

/// Largest |logit − reference| over the largest |reference logit|.
fn error(got: &[f32], want: &[f64]) -> f64 {
    let top = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    got.iter().zip(want).map(|(&g, w)| (f64::from(g) - w).abs()).fold(0.0, f64::max) / top
}

fn argmax(v: &[f64]) -> u32 {
    v.iter().enumerate().fold((0, f64::NEG_INFINITY), |(bi, bv), (i, &x)| if x > bv { (i, x) } else { (bi, bv) }).0
        as u32
}

/// Runs a prompt then `steps` decoding steps, checking every step's logits
/// against the reference within `tol`; returns the tokens it chose.
fn check(backend: Arc<dyn Backend>, cfg: LlamaConfig, format: WeightFormat, tol: f64, steps: usize) -> Vec<u32> {
    let weights = HostWeights::random(cfg, 11);
    let stored = weights.as_stored(format);
    let mut model = Llama::load(backend, &weights, format).unwrap();
    let mut tokens: Vec<u32> = vec![3, 1, 4, 1, 5, 9, 2];
    let mut chosen = Vec::new();
    let mut feed = tokens.clone();
    for step in 0..=steps {
        let logits = model.logits(&feed).unwrap();
        let want = reference_logits(&stored, &tokens);
        let e = error(&logits, &want);
        eprintln!("{format:?} step {step}: error {e:.2e} of max |logit|");
        assert!(e <= tol, "{format:?} step {step}: logits off by {e:.3e} of their largest (tolerance {tol:.1e})");
        let next = argmax(&want);
        chosen.push(next);
        tokens.push(next);
        feed = vec![next];
    }
    chosen
}

#[test]
fn f32_logits_and_greedy_tokens_match_the_reference() {
    let cpu: Arc<dyn Backend> = Arc::new(SimdBackend::new());
    check(cpu.clone(), LlamaConfig::tiny(), WeightFormat::dense(DType::F32), 1e-5, 8);
    // Greedy generation on the model itself picks the reference's tokens.
    let cfg = LlamaConfig::tiny();
    let weights = HostWeights::random(cfg, 11);
    let mut model = Llama::load(cpu, &weights, WeightFormat::dense(DType::F32)).unwrap();
    let prompt = [3u32, 1, 4, 1, 5, 9, 2];
    let got = model.generate(&prompt, 8).unwrap();
    let mut tokens = prompt.to_vec();
    for &t in &got {
        assert_eq!(t, argmax(&reference_logits(&weights, &tokens)), "after {tokens:?}");
        tokens.push(t);
    }
    assert_eq!(model.position(), prompt.len() + 7);
}

#[test]
fn interleaved_rotary_pairs_match_the_reference() {
    let cfg = LlamaConfig { rope_layout: RopeLayout::Interleaved, ..LlamaConfig::tiny() };
    check(Arc::new(SimdBackend::new()), cfg, WeightFormat::dense(DType::F32), 1e-5, 3);
}

#[test]
fn half_precision_models_stay_within_their_rounding() {
    for dtype in [DType::BF16, DType::F16] {
        let tol = if dtype == DType::BF16 { 2e-2 } else { 5e-3 };
        check(Arc::new(SimdBackend::new()), LlamaConfig::tiny(), WeightFormat::dense(dtype), tol, 4);
    }
}

#[test]
fn quantized_linear_layers_stay_within_the_activation_rounding() {
    let cpu: Arc<dyn Backend> = Arc::new(SimdBackend::new());
    check(cpu.clone(), LlamaConfig::tiny(), WeightFormat { dtype: DType::F32, linear: DType::Q8_0 }, 2e-2, 3);
    let cfg = LlamaConfig { hidden: 256, heads: 4, kv_heads: 2, intermediate: 512, ..LlamaConfig::tiny() };
    for q in [DType::Q4K, DType::Q6K] {
        check(cpu.clone(), cfg, WeightFormat { dtype: DType::F32, linear: q }, 2e-2, 2);
    }
}

#[test]
fn bad_steps_are_typed_errors() {
    let cfg = LlamaConfig { max_seq: 8, ..LlamaConfig::tiny() };
    let mut model =
        Llama::load(Arc::new(SimdBackend::new()), &HostWeights::random(cfg, 1), WeightFormat::dense(DType::F32))
            .unwrap();
    assert!(model.step(&[]).is_err());
    assert!(model.step(&[97]).is_err(), "a token past the vocabulary");
    assert!(model.step(&[1; 9]).is_err(), "more tokens than the cache holds");
    assert_eq!(model.position(), 0);
    model.step(&[1; 8]).unwrap();
    assert!(model.step(&[1]).is_err(), "the cache is full");
    model.reset();
    model.step(&[1]).unwrap();
}
