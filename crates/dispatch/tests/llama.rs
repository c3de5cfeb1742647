//! The Llama decoder (`dispatch::llama`) against its float64 reference on
//! the CPU: logits after a prompt and after each decoding step, and greedy
//! tokens, for `f32`, `bf16` and block-quantized weights. The GPU backends
//! run the same model in the GPU test binaries.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use compute_core::{Backend, BackendKind, DType, HostSlice, HostSliceMut, Op, Recording, RopeLayout, Tensor};
use compute_simd::SimdBackend;
use dispatch::llama::{HostWeights, Llama, LlamaConfig, LoadError, SeqId, WeightFormat, reference_logits};

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

/// Keys turned straight into the cache or turned and then appended: the
/// same logits, bit for bit, at every step (both place the same values).
#[test]
fn keys_into_the_cache_equal_keys_appended() {
    let cfg = LlamaConfig::tiny();
    let weights = HostWeights::random(cfg, 11);
    let run = |into: bool| {
        let cpu: Arc<dyn Backend> = Arc::new(SimdBackend::new());
        let mut model = Llama::load(cpu, &weights, WeightFormat::dense(DType::BF16)).unwrap();
        model.set_keys_into_cache(into);
        let mut feed = vec![3u32, 1, 4, 1, 5];
        let mut all = Vec::new();
        for _ in 0..4 {
            let logits = model.logits(&feed).unwrap();
            feed = vec![argmax(&logits.iter().map(|&v| f64::from(v)).collect::<Vec<_>>())];
            all.push(logits);
        }
        all
    };
    let (into, apart) = (run(true), run(false));
    for (step, (a, b)) in into.iter().zip(&apart).enumerate() {
        assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "step {step}");
    }
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

/// A kept tensor call: the op, its inputs, its output.
type Call = (Op, Vec<Tensor>, Tensor);

/// The CPU backend, recording as the CUDA backend does: while `body` runs,
/// tensor calls are kept instead of run, and a replay runs them again.
struct Taping {
    cpu: Arc<SimdBackend>,
    tape: Mutex<Option<Vec<Call>>>,
    replays: Arc<AtomicUsize>,
}

struct Tape {
    cpu: Arc<SimdBackend>,
    calls: Vec<Call>,
    replays: Arc<AtomicUsize>,
}

impl Recording for Tape {
    fn replay(&self) -> compute_core::Result<()> {
        self.replays.fetch_add(1, Ordering::Relaxed);
        for (op, inputs, out) in &self.calls {
            let refs: Vec<&Tensor> = inputs.iter().collect();
            self.cpu.run_tensors(op, &refs, out)?;
        }
        Ok(())
    }
}

impl Backend for Taping {
    fn kind(&self) -> BackendKind {
        self.cpu.kind()
    }
    fn device_name(&self) -> String {
        format!("{} (taping)", self.cpu.device_name())
    }
    fn run_typed(&self, op: &Op, inputs: &[HostSlice<'_>], output: HostSliceMut<'_>) -> compute_core::Result<()> {
        self.cpu.run_typed(op, inputs, output)
    }
    fn upload_typed(&self, data: HostSlice<'_>) -> compute_core::Result<Tensor> {
        self.cpu.upload_typed(data)
    }
    fn upload_into(&self, data: HostSlice<'_>, tensor: &Tensor) -> compute_core::Result<()> {
        self.cpu.upload_into(data, tensor)
    }
    fn alloc_typed(&self, len: usize, dtype: DType) -> compute_core::Result<Tensor> {
        self.cpu.alloc_typed(len, dtype)
    }
    fn download_typed(&self, tensor: &Tensor, out: HostSliceMut<'_>) -> compute_core::Result<()> {
        self.cpu.download_typed(tensor, out)
    }
    fn run_tensors(&self, op: &Op, inputs: &[&Tensor], output: &Tensor) -> compute_core::Result<()> {
        if let Some(tape) = self.tape.lock().unwrap().as_mut() {
            compute_core::check_tensor_call(op, output.location(), inputs, output)?;
            tape.push((*op, inputs.iter().map(|&t| t.clone()).collect(), output.clone()));
            return Ok(());
        }
        self.cpu.run_tensors(op, inputs, output)
    }
    fn record(
        &self,
        body: &mut dyn FnMut() -> compute_core::Result<()>,
    ) -> compute_core::Result<Option<Box<dyn Recording>>> {
        *self.tape.lock().unwrap() = Some(Vec::new());
        let ran = body();
        let calls = self.tape.lock().unwrap().take().unwrap_or_default();
        ran?;
        Ok(Some(Box::new(Tape { cpu: self.cpu.clone(), calls, replays: self.replays.clone() })))
    }
}

/// Decoding steps recorded once and replayed at later positions give the
/// logits of steps run directly, bit for bit, in every weight format.
#[test]
fn recorded_steps_replay_at_every_position() {
    for format in [WeightFormat::dense(DType::F32), WeightFormat::dense(DType::BF16)] {
        let cfg = LlamaConfig::tiny();
        let weights = HostWeights::random(cfg, 5);
        let cpu = Arc::new(SimdBackend::new());
        let replays = Arc::new(AtomicUsize::new(0));
        let taping = Taping { cpu: cpu.clone(), tape: Mutex::new(None), replays: replays.clone() };
        let mut direct = Llama::load(cpu, &weights, format).unwrap();
        let mut recorded = Llama::load(Arc::new(taping), &weights, format).unwrap();
        assert!(recorded.device_positions());
        let mut feed = vec![3u32, 1, 4, 1, 5];
        for step in 0..6 {
            let (a, b) = (direct.logits(&feed).unwrap(), recorded.logits(&feed).unwrap());
            assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "{format:?} step {step}");
            feed = vec![argmax(&a.iter().map(|&v| f64::from(v)).collect::<Vec<_>>())];
        }
        // Decoding steps 1..=5: the first runs directly, the second records,
        // and it and every later one replay.
        assert_eq!(replays.load(Ordering::Relaxed), 4, "{format:?}");
        // Reset: the recording serves the new sequence from position 0 on.
        recorded.reset();
        direct.reset();
        for t in [7u32, 8, 9] {
            let (a, b) = (direct.logits(&[t]).unwrap(), recorded.logits(&[t]).unwrap());
            assert_eq!(a, b, "{format:?} after reset");
        }
        assert_eq!(replays.load(Ordering::Relaxed), 7, "{format:?}");
    }
}

/// Three sequences decoded together, each from its own tokens, give each
/// one's logits as decoding it alone does, step after step (recorded and
/// replayed by the taping backend after the first two).
#[test]
fn sequences_decoded_together_match_each_decoded_alone() {
    let cfg = LlamaConfig::tiny();
    let weights = HostWeights::random(cfg, 9);
    for format in [WeightFormat::dense(DType::F32), WeightFormat::dense(DType::BF16)] {
        let cpu = Arc::new(SimdBackend::new());
        let replays = Arc::new(AtomicUsize::new(0));
        let taping = Taping { cpu: cpu.clone(), tape: Mutex::new(None), replays: replays.clone() };
        let mut together = Llama::load(Arc::new(taping), &weights, format).unwrap();
        together.set_sequences(3).unwrap();
        assert_eq!(together.sequences(), 3);
        assert!(together.step(&[1]).is_err(), "one sequence's step on a model of three");
        assert!(together.step_all(&[1, 2]).is_err(), "two tokens for three sequences");
        let mut alone: Vec<Llama> = (0..3).map(|_| Llama::load(cpu.clone(), &weights, format).unwrap()).collect();
        let mut feed = [3u32, 1, 4];
        for step in 0..6 {
            let got = together.logits_all(&feed).unwrap();
            for (i, model) in alone.iter_mut().enumerate() {
                let want = model.logits(&[feed[i]]).unwrap();
                let row = &got[i * cfg.vocab..(i + 1) * cfg.vocab];
                let top = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let err = row.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max) / top;
                let tol = if format.dtype == DType::F32 { 1e-5 } else { 2e-2 };
                assert!(err <= tol, "{format:?} step {step} sequence {i}: {err:.2e}");
                feed[i] = (feed[i] * 7 + 3 + step as u32) % cfg.vocab as u32;
            }
        }
        assert_eq!(replays.load(Ordering::Relaxed), 5, "{format:?}");
        assert!(together.set_sequences(0).is_err());
        together.set_sequences(1).unwrap();
        together.step(&[1]).unwrap();
    }
}

/// Largest |a − b| over the largest |b|.
fn relative(got: &[f32], want: &[f32]) -> f32 {
    let top = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max) / top
}

/// A model of one sequence beside the many-sequence model: it decodes the
/// same sequence alone.
struct Alone {
    model: Llama,
    tokens: Vec<u32>,
}

/// Checks each sequence of `together`'s last step against its model decoding
/// it alone (fed the same tokens: the prompt, then each step's token);
/// `fed[id]` holds the tokens that step ran.
fn check_against_alone(
    together: &Llama,
    alone: &mut std::collections::HashMap<SeqId, Alone>,
    fed: &std::collections::HashMap<SeqId, Vec<u32>>,
    tol: f32,
    what: &str,
) {
    let got = together.last_logits().unwrap();
    assert_eq!(got.len(), fed.len(), "{what}: one logit row per sequence stepped");
    for (id, logits) in got {
        let a = alone.get_mut(&id).unwrap();
        let feed = &fed[&id];
        let want = a.model.logits(feed).unwrap();
        a.tokens.extend(feed);
        let e = relative(&logits, &want);
        assert!(e <= tol, "{what}: {id:?} off by {e:.2e} of its largest logit");
        assert_eq!(together.sequence_position(id), Some(a.tokens.len()), "{what}: {id:?}'s position");
    }
}

/// Sequences that join while others are mid-decode and leave before them
/// give, step after step, each one's logits as decoding it alone does: a
/// prompt prefilled beside running sequences, the recorded one-token step
/// replayed whatever slots are held, a freed slot taken by a new sequence.
#[test]
fn sequences_joining_and_leaving_match_each_decoded_alone() {
    use std::collections::HashMap;
    let cfg = LlamaConfig::tiny();
    let weights = HostWeights::random(cfg, 13);
    for format in [WeightFormat::dense(DType::F32), WeightFormat::dense(DType::BF16)] {
        let tol = if format.dtype == DType::F32 { 1e-5 } else { 2e-2 };
        let cpu = Arc::new(SimdBackend::new());
        let replays = Arc::new(AtomicUsize::new(0));
        let taping = Taping { cpu: cpu.clone(), tape: Mutex::new(None), replays: replays.clone() };
        let mut model = Llama::load(Arc::new(taping), &weights, format).unwrap();
        model.set_slots(3).unwrap();
        assert!(model.active_sequences().is_empty());
        assert!(model.step_active().unwrap().is_empty(), "nothing held, nothing runs");
        let mut alone: HashMap<SeqId, Alone> = HashMap::new();
        // Each held sequence's next token, as the model chose it.
        let mut pending: HashMap<SeqId, u32> = HashMap::new();
        let open = |model: &mut Llama,
                    prompts: &[&[u32]],
                    alone: &mut HashMap<SeqId, Alone>,
                    pending: &mut HashMap<SeqId, u32>| {
            let added = model.add_sequences(prompts).unwrap();
            let mut fed = HashMap::new();
            for (&(id, next), p) in added.iter().zip(prompts) {
                alone.insert(
                    id,
                    Alone { model: Llama::load(cpu.clone(), &weights, format).unwrap(), tokens: Vec::new() },
                );
                fed.insert(id, p.to_vec());
                pending.insert(id, next);
            }
            fed
        };
        let step =
            |model: &mut Llama, alone: &mut HashMap<SeqId, Alone>, pending: &mut HashMap<SeqId, u32>, what: &str| {
                let fed: HashMap<SeqId, Vec<u32>> =
                    model.active_sequences().into_iter().map(|id| (id, vec![pending[&id]])).collect();
                let chosen = model.step_active().unwrap();
                assert_eq!(chosen.len(), fed.len());
                check_against_alone(model, alone, &fed, tol, what);
                pending.extend(chosen);
            };
        // A starts alone and decodes two tokens.
        let fed = open(&mut model, &[&[3, 1, 4, 1, 5]], &mut alone, &mut pending);
        check_against_alone(&model, &mut alone, &fed, tol, &format!("{format:?} prefill A"));
        let a = model.active_sequences()[0];
        for i in 0..2 {
            step(&mut model, &mut alone, &mut pending, &format!("{format:?} A step {i}"));
        }
        // B and C join mid-way, prefilled together (prompts of 3 and 7).
        let fed = open(&mut model, &[&[9, 2, 6], &[5, 3, 5, 8, 9, 7, 9]], &mut alone, &mut pending);
        check_against_alone(&model, &mut alone, &fed, tol, &format!("{format:?} prefill B, C"));
        assert_eq!(model.sequence_position(a), Some(7), "A is untouched by the prefill");
        let ids = model.active_sequences();
        assert_eq!(ids.len(), 3);
        assert!(model.add_sequence(&[1]).is_err(), "no free slot");
        for i in 0..3 {
            step(&mut model, &mut alone, &mut pending, &format!("{format:?} A, B, C step {i}"));
        }
        // B leaves; A and C go on; D takes B's slot.
        let b = ids[1];
        model.remove_sequence(b).unwrap();
        pending.remove(&b);
        assert!(model.remove_sequence(b).is_err(), "removed twice");
        assert!(model.set_next_token(b, 1).is_err());
        assert_eq!(model.sequence_position(b), None);
        for i in 0..2 {
            step(&mut model, &mut alone, &mut pending, &format!("{format:?} A, C step {i}"));
        }
        let fed = open(&mut model, &[&[2, 7, 1, 8]], &mut alone, &mut pending);
        check_against_alone(&model, &mut alone, &fed, tol, &format!("{format:?} prefill D"));
        for i in 0..2 {
            step(&mut model, &mut alone, &mut pending, &format!("{format:?} A, C, D step {i}"));
        }
        // Every decoding step is the one recorded step (the first ran
        // directly, the second recorded): 9 steps, 8 replays.
        assert_eq!(replays.load(Ordering::Relaxed), 8, "{format:?}");
        // A sampler's token in place of the greedy one.
        let c = model.active_sequences()[2];
        model.set_next_token(c, 11).unwrap();
        pending.insert(c, 11);
        let fed: HashMap<SeqId, Vec<u32>> =
            model.active_sequences().into_iter().map(|id| (id, vec![pending[&id]])).collect();
        let chosen = model.step_active().unwrap();
        check_against_alone(&model, &mut alone, &fed, tol, &format!("{format:?} sampled token"));
        pending.extend(chosen);
        // The f32 model's greedy tokens are the float64 reference's.
        if format.dtype == DType::F32 {
            let stored = weights.as_stored(format);
            let before = pending.clone();
            for (id, next) in model.step_active().unwrap() {
                let mut t = alone[&id].tokens.clone();
                t.push(before[&id]);
                assert_eq!(next, argmax(&reference_logits(&stored, &t)), "{id:?} after {t:?}");
            }
        }
    }
}

/// Prompts prefilled together in one pass (left-padded to the longest) give
/// the logits and next tokens of prefilling them one at a time, and the
/// float64 reference's; the sequences then decode the same.
#[test]
fn batched_prefill_equals_prefilling_one_by_one() {
    let cfg = LlamaConfig::tiny();
    let weights = HostWeights::random(cfg, 17);
    let prompts: [&[u32]; 4] = [&[3, 1, 4, 1, 5, 9, 2, 6], &[7], &[2, 7, 1, 8, 2], &[1, 4, 1, 4, 2, 1, 3, 5]];
    for format in [WeightFormat::dense(DType::F32), WeightFormat::dense(DType::BF16)] {
        let tol = if format.dtype == DType::F32 { 1e-5 } else { 2e-2 };
        let cpu: Arc<dyn Backend> = Arc::new(SimdBackend::new());
        let mut batched = Llama::load(cpu.clone(), &weights, format).unwrap();
        let mut single = Llama::load(cpu.clone(), &weights, format).unwrap();
        batched.set_slots(5).unwrap();
        single.set_slots(5).unwrap();
        // An older sequence in slot 0 of the batched model: the prompts take
        // slots 1..=4 there and 0..=3 in the other.
        let (old, _) = batched.add_sequence(&[5, 5, 5]).unwrap();
        let together = batched.add_sequences(&prompts).unwrap();
        let together_logits = batched.last_logits().unwrap();
        assert_eq!(together_logits.len(), prompts.len());
        let stored = weights.as_stored(format);
        for (i, p) in prompts.iter().enumerate() {
            let (id, next) = single.add_sequence(p).unwrap();
            let (_, want) = single.last_logits().unwrap().remove(0);
            let (got_id, got) = &together_logits[i];
            assert_eq!(*got_id, together[i].0);
            let e = relative(got, &want);
            assert!(e <= tol, "{format:?} prompt {i}: batched prefill off by {e:.2e}");
            let r = error(got, &reference_logits(&stored, p));
            assert!(r <= f64::from(tol), "{format:?} prompt {i}: off the reference by {r:.2e}");
            if format.dtype == DType::F32 {
                assert_eq!(together[i].1, next, "prompt {i}'s next token");
            }
            assert_eq!(single.sequence_position(id), Some(p.len()));
            assert_eq!(batched.sequence_position(together[i].0), Some(p.len()));
        }
        assert_eq!(batched.sequence_position(old), Some(3));
        // Then both decode the same, the older sequence beside them.
        for step in 0..3 {
            let a = batched.step_active().unwrap();
            let b = single.step_active().unwrap();
            assert_eq!(a.len(), 5);
            let (la, lb) = (batched.last_logits().unwrap(), single.last_logits().unwrap());
            for i in 0..prompts.len() {
                let e = relative(&la[i + 1].1, &lb[i].1);
                assert!(e <= tol, "{format:?} step {step} sequence {i}: {e:.2e}");
            }
            if format.dtype == DType::F32 {
                let picks: Vec<u32> = a[1..].iter().map(|p| p.1).collect();
                assert_eq!(picks, b.iter().map(|p| p.1).collect::<Vec<_>>(), "step {step}");
            }
        }
        // What the prefill refuses.
        assert!(batched.add_sequences(&[&[1], &[2]]).is_err(), "two prompts for no free slot");
        let mut roomy = Llama::load(cpu.clone(), &weights, format).unwrap();
        roomy.set_slots(2).unwrap();
        assert!(roomy.add_sequence(&[]).is_err(), "an empty prompt");
        assert!(roomy.add_sequence(&[97]).is_err(), "a token past the vocabulary");
        assert!(roomy.add_sequence(&vec![1; cfg.max_seq + 1]).is_err(), "a prompt past the cache");
        assert!(roomy.active_sequences().is_empty(), "nothing was added");
        assert!(roomy.step(&[1]).is_err(), "step on a model of two slots");
        // A full cache is an error for the step, and nothing runs.
        let (id, _) = roomy.add_sequence(&vec![1; cfg.max_seq]).unwrap();
        let (other, _) = roomy.add_sequence(&[1, 2]).unwrap();
        assert!(roomy.step_active().is_err());
        assert_eq!(roomy.sequence_position(other), Some(2));
        roomy.remove_sequence(id).unwrap();
        roomy.step_active().unwrap();
        assert_eq!(roomy.sequence_position(other), Some(3));
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

/// Llama 3's rotary scaling (`rope_type: "llama3"`), with a context short
/// enough that the tiny model's pairs fall in all three regimes (kept,
/// blended, slowed by the factor): the model's logits and greedy tokens
/// follow the reference, which computes the scaled frequencies as
/// transformers does; the scaling changes them; and a transformers
/// checkpoint stating it in `rope_scaling` (transformers 4) or
/// `rope_parameters` (5) loads it.
#[test]
fn llama3_rotary_scaling_matches_the_reference() {
    use compute_core::RopeScaling;
    let scaling = RopeScaling { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position: 256 };
    let cfg = LlamaConfig { rope_theta: 500_000.0, rope_scaling: Some(scaling), ..LlamaConfig::tiny() };
    let cpu: Arc<dyn Backend> = Arc::new(SimdBackend::new());
    for layout in [RopeLayout::HalfSplit, RopeLayout::Interleaved] {
        check(cpu.clone(), LlamaConfig { rope_layout: layout, ..cfg }, WeightFormat::dense(DType::F32), 1e-5, 6);
    }
    check(cpu.clone(), cfg, WeightFormat::dense(DType::BF16), 2e-2, 3);
    // Unscaled, the same weights give other logits.
    let weights = HostWeights::random(cfg, 11);
    let prompt: Vec<u32> = (0..40).map(|i| (i * 7 + 3) % 97).collect();
    let plain = HostWeights { cfg: LlamaConfig { rope_scaling: None, ..cfg }, ..weights.clone() };
    let (a, b) = (reference_logits(&weights, &prompt), reference_logits(&plain, &prompt));
    let moved =
        a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max) / a.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    assert!(moved > 1e-3, "the scaling moves the logits by only {moved:.2e}");
    // Many sequences and the batched prefill with the scaling.
    let mut model = Llama::load(cpu.clone(), &weights, WeightFormat::dense(DType::F32)).unwrap();
    model.set_slots(2).unwrap();
    model.add_sequences(&[&prompt[..9], &prompt]).unwrap();
    for (i, (_, logits)) in model.last_logits().unwrap().into_iter().enumerate() {
        let p = if i == 0 { &prompt[..9] } else { &prompt[..] };
        let e = error(&logits, &reference_logits(&weights, p));
        assert!(e <= 1e-5, "prompt {i}: {e:.2e}");
    }
    // From a transformers config.json, in both spellings.
    for spelled in [
        r#""rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 256}"#,
        r#""rope_scaling": null, "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 256}"#,
    ] {
        let (config, files) = hf_checkpoint(&weights, DType::F32, 1, false);
        let config = config.replace(r#""rope_scaling": null"#, spelled);
        let shards: Vec<&[u8]> = files.iter().map(Vec::as_slice).collect();
        let mut model = Llama::from_safetensors(cpu.clone(), &config, &shards, DType::F32, 64).unwrap();
        assert_eq!(*model.config(), cfg);
        let e = error(&model.logits(&prompt).unwrap(), &a);
        assert!(e <= 1e-5, "checkpoint with llama3 scaling: {e:.2e}");
    }
}

/// A metadata value of a test GGUF file.
#[derive(Clone, Copy, Debug)]
enum Meta<'a> {
    U32(u32),
    F32(f32),
    Str(&'a str),
}

/// A GGUF file of a small llama model, written the way llama.cpp's converter
/// lays one out (version 3, 32-byte alignment, ne0 first), with the given
/// ggml type per tensor, an `extra` one-dimensional tensor and `meta` keys
/// after the model's own.
fn gguf_file(
    weights: &HostWeights,
    types: &dyn Fn(&str) -> DType,
    extra: Option<(&str, &[f32])>,
    meta: &[(&str, Meta)],
) -> Vec<u8> {
    use compute_core::HostVec;
    let c = weights.cfg;
    let mut tensors: Vec<(String, Vec<u64>, &[f32])> = vec![
        ("token_embd.weight".into(), vec![c.hidden as u64, c.vocab as u64], &weights.embed),
        ("output_norm.weight".into(), vec![c.hidden as u64], &weights.final_norm),
        ("output.weight".into(), vec![c.hidden as u64, c.vocab as u64], &weights.lm_head),
    ];
    let d = c.head_dim();
    for (i, l) in weights.layers.iter().enumerate() {
        let mut t = |name: &str, dims: Vec<usize>, v| {
            tensors.push((format!("blk.{i}.{name}.weight"), dims.into_iter().map(|x| x as u64).collect(), v))
        };
        t("attn_norm", vec![c.hidden], &l.attn_norm);
        t("ffn_norm", vec![c.hidden], &l.ffn_norm);
        t("attn_q", vec![c.hidden, c.heads * d], &l.wq);
        t("attn_k", vec![c.hidden, c.kv_heads * d], &l.wk);
        t("attn_v", vec![c.hidden, c.kv_heads * d], &l.wv);
        t("attn_output", vec![c.heads * d, c.hidden], &l.wo);
        t("ffn_gate", vec![c.hidden, c.intermediate], &l.gate);
        t("ffn_up", vec![c.hidden, c.intermediate], &l.up);
        t("ffn_down", vec![c.intermediate, c.hidden], &l.down);
    }
    if let Some((name, values)) = extra {
        tensors.push((name.to_string(), vec![values.len() as u64], values));
    }
    let ggml_id = |d: DType| match d {
        DType::F32 => 0u32,
        DType::F16 => 1,
        DType::Q8_0 => 8,
        DType::Q4K => 12,
        DType::Q5K => 13,
        DType::Q6K => 14,
        _ => 30,
    };
    let string = |out: &mut Vec<u8>, s: &str| {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    };
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    let mut kv = vec![
        ("general.architecture", Meta::Str("llama")),
        ("llama.embedding_length", Meta::U32(c.hidden as u32)),
        ("llama.block_count", Meta::U32(c.layers as u32)),
        ("llama.attention.head_count", Meta::U32(c.heads as u32)),
        ("llama.attention.head_count_kv", Meta::U32(c.kv_heads as u32)),
        ("llama.feed_forward_length", Meta::U32(c.intermediate as u32)),
        ("llama.rope.freq_base", Meta::F32(c.rope_theta)),
        ("llama.attention.layer_norm_rms_epsilon", Meta::F32(c.rms_eps)),
    ];
    kv.extend_from_slice(meta);
    out.extend((kv.len() as u64).to_le_bytes());
    for (k, v) in kv {
        string(&mut out, k);
        match v {
            Meta::U32(x) => {
                out.extend(4u32.to_le_bytes());
                out.extend(x.to_le_bytes());
            }
            Meta::F32(x) => {
                out.extend(6u32.to_le_bytes());
                out.extend(x.to_le_bytes());
            }
            Meta::Str(x) => {
                out.extend(8u32.to_le_bytes());
                string(&mut out, x);
            }
        }
    }
    let mut data = Vec::new();
    for (name, dims, values) in &tensors {
        let stored = HostVec::from_f32(types(name), values);
        while !data.len().is_multiple_of(32) {
            data.push(0);
        }
        string(&mut out, name);
        out.extend((dims.len() as u32).to_le_bytes());
        dims.iter().for_each(|d| out.extend(d.to_le_bytes()));
        out.extend(ggml_id(types(name)).to_le_bytes());
        out.extend((data.len() as u64).to_le_bytes());
        data.extend(stored.as_slice().as_bytes());
    }
    while !out.len().is_multiple_of(32) {
        out.push(0);
    }
    out.extend(data);
    out
}

#[test]
fn a_gguf_model_with_mixed_block_types_matches_the_reference() {
    use compute_core::gguf::Gguf;
    let cfg = LlamaConfig {
        hidden: 256,
        intermediate: 512,
        rope_layout: RopeLayout::Interleaved,
        rope_theta: 500_000.0,
        ..LlamaConfig::tiny()
    };
    let weights = HostWeights::random(cfg, 5);
    // As a Q4_K_M file: Q4_K projections, Q6_K down projections and LM head,
    // a Q8_0 embedding, f32 norms.
    let types = |name: &str| {
        if name.contains("norm") {
            DType::F32
        } else if name.contains("ffn_down") || name == "output.weight" {
            DType::Q6K
        } else if name.starts_with("token_embd") {
            DType::Q8_0
        } else {
            DType::Q4K
        }
    };
    let bytes = gguf_file(&weights, &types, None, &[]);
    let gguf = Gguf::parse(&bytes).unwrap();
    let mut model = Llama::from_gguf(Arc::new(SimdBackend::new()), &gguf, DType::F32, 64).unwrap();
    // The same file on disk, memory-mapped, gives the same model.
    let path = std::env::temp_dir().join(format!("compute-gguf-{}.gguf", std::process::id()));
    std::fs::write(&path, &bytes).unwrap();
    let mapped =
        Llama::from_gguf_path(Arc::new(SimdBackend::new()), &path, DType::F32, 64).map(|mut m| m.logits(&[5, 17]));
    std::fs::remove_file(&path).unwrap();
    assert_eq!(mapped.unwrap().unwrap(), model.logits(&[5, 17]).unwrap());
    model.reset();
    assert_eq!(*model.config(), LlamaConfig { max_seq: 64, ..cfg });
    // The reference: every tensor as the file stores it.
    let stored = |v: &[f32], name: &str| compute_core::HostVec::from_f32(types(name), v).to_f32();
    let mut want = weights.clone();
    want.embed = stored(&weights.embed, "token_embd.weight");
    want.lm_head = stored(&weights.lm_head, "output.weight");
    for l in &mut want.layers {
        for (w, name) in [
            (&mut l.wq, "q"),
            (&mut l.wk, "k"),
            (&mut l.wv, "v"),
            (&mut l.wo, "o"),
            (&mut l.gate, "g"),
            (&mut l.up, "u"),
        ] {
            *w = stored(w, name);
        }
        l.down = stored(&l.down, "ffn_down");
    }
    let prompt = [5u32, 17, 3, 80, 2];
    let logits = model.logits(&prompt).unwrap();
    let e = error(&logits, &reference_logits(&want, &prompt));
    assert!(e < 2e-2, "GGUF model logits off by {e:.3e}");
    // Metadata that disagrees with the tensors' dims is a typed error naming
    // the tensor; so is a missing key.
    let key = b"llama.feed_forward_length";
    let at = bytes.windows(key.len()).position(|w| w == key).unwrap() + key.len() + 4;
    let mut wrong = bytes.clone();
    wrong[at..at + 4].copy_from_slice(&256u32.to_le_bytes());
    let err = Llama::from_gguf(Arc::new(SimdBackend::new()), &Gguf::parse(&wrong).unwrap(), DType::F32, 64).err();
    assert!(matches!(&err, Some(LoadError::TensorShape { name, .. }) if name == "blk.0.ffn_gate.weight"), "{err:?}");
    let mut unnamed = bytes.clone();
    let at = unnamed.windows(key.len()).position(|w| w == key).unwrap();
    unnamed[at] = b'L';
    let err = Llama::from_gguf(Arc::new(SimdBackend::new()), &Gguf::parse(&unnamed).unwrap(), DType::F32, 64).err();
    assert!(matches!(&err, Some(LoadError::Metadata { key }) if key == "llama.feed_forward_length"), "{err:?}");
}

/// Llama 3's per-pair frequency factors as llama.cpp's converter computes
/// them for `rope_freqs.weight`: by wavelength, in `f32` (as its torch
/// code does), written apart from the library's formula.
fn llama_cpp_rope_freqs(head_dim: usize, theta: f32, s: compute_core::RopeScaling) -> Vec<f32> {
    let context = s.original_max_position as f32;
    let (low_wavelen, high_wavelen) = (context / s.low_freq_factor, context / s.high_freq_factor);
    (0..head_dim / 2)
        .map(|i| {
            let freq = 1.0 / theta.powf((2 * i) as f32 / head_dim as f32);
            let wavelen = std::f32::consts::TAU / freq;
            if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                s.factor
            } else {
                let smooth = (context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
                1.0 / ((1.0 - smooth) / s.factor + smooth)
            }
        })
        .collect()
}

/// Largest relative difference between `factors` and those `scaling` gives
/// (each pair's unscaled frequency over its scaled one, in `f64`).
fn factor_error(factors: &[f32], head_dim: usize, theta: f32, scaling: Option<compute_core::RopeScaling>) -> f64 {
    let mut worst = 0.0f64;
    for (i, &want) in factors.iter().enumerate() {
        let f = f64::from(theta).powf(-((2 * i) as f64) / head_dim as f64);
        let got = scaling.map_or(1.0, |s| f / s.apply_f64(f));
        worst = worst.max((got - f64::from(want)).abs() / f64::from(want));
    }
    worst
}

/// GGUF files of Llama 3.1/3.2 models carry the rotary scaling as
/// `rope_freqs.weight`: the loader recovers a `RopeScaling` that gives the
/// file's factors back, and the model then computes what the same weights
/// with that scaling stated explicitly compute, and what the reference
/// does; factors that are all 1 mean no scaling.
#[test]
fn llama3_gguf_files_load_their_rotary_scaling() {
    use compute_core::RopeScaling;
    use compute_core::gguf::Gguf;
    let cpu: Arc<dyn Backend> = Arc::new(SimdBackend::new());
    let f32_types = |_: &str| DType::F32;
    // Llama 3.1 (head size 128, factor 8) and 3.2 (64, factor 32): the factors
    // llama.cpp writes load without any scaling key, to the same frequencies.
    for (heads, kv_heads, factor) in [(2, 2, 8.0), (4, 2, 32.0), (4, 2, 8.0)] {
        let cfg = LlamaConfig { hidden: 256, heads, kv_heads, rope_theta: 500_000.0, ..LlamaConfig::tiny() };
        let d = cfg.head_dim();
        let factors = llama_cpp_rope_freqs(d, cfg.rope_theta, RopeScaling::llama3(factor));
        let bytes = gguf_file(&HostWeights::random(cfg, 3), &f32_types, Some(("rope_freqs.weight", &factors)), &[]);
        let got = LlamaConfig::from_gguf(&Gguf::parse(&bytes).unwrap(), 64).unwrap().rope_scaling.unwrap();
        let e = factor_error(&factors, d, cfg.rope_theta, Some(got));
        eprintln!("head size {d}, factor {factor}: {got:?}, factors within {e:.2e}");
        assert!(e <= 1e-5, "{got:?} gives the factors back within only {e:.2e}");
        assert_eq!((got.factor, got.original_max_position), (factor, 8192));
        assert!((got.low_freq_factor - 1.0).abs() < 1e-3 && (got.high_freq_factor - 4.0).abs() < 1e-3, "{got:?}");
    }
    // A context of 256 tokens, so that the tiny model's positions feel the
    // scaling: stated as llama.cpp states it (only the original context),
    // or with the type and factor too.
    let scaling = RopeScaling { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position: 256 };
    let cfg = LlamaConfig {
        hidden: 256,
        rope_theta: 500_000.0,
        rope_layout: RopeLayout::Interleaved,
        rope_scaling: Some(scaling),
        ..LlamaConfig::tiny()
    };
    let d = cfg.head_dim();
    let weights = HostWeights::random(cfg, 7);
    let factors = llama_cpp_rope_freqs(d, cfg.rope_theta, scaling);
    let prompt: Vec<u32> = (0..40).map(|i| (i * 7 + 3) % 97).collect();
    let want = reference_logits(&weights, &prompt);
    let mut explicit = Llama::load(cpu.clone(), &weights, WeightFormat::dense(DType::F32)).unwrap();
    let explicit = explicit.logits(&prompt).unwrap();
    let context = ("llama.rope.scaling.original_context_length", Meta::U32(256));
    let stated =
        [("llama.rope.scaling.type", Meta::Str("llama3")), ("llama.rope.scaling.factor", Meta::F32(8.0)), context];
    for meta in [&[context][..], &stated] {
        let bytes = gguf_file(&weights, &f32_types, Some(("rope_freqs.weight", &factors)), meta);
        let mut model = Llama::from_gguf(cpu.clone(), &Gguf::parse(&bytes).unwrap(), DType::F32, 64).unwrap();
        let got = model.config().rope_scaling.unwrap();
        assert_eq!((got.factor, got.original_max_position), (8.0, 256), "{got:?}");
        assert!(factor_error(&factors, d, cfg.rope_theta, Some(got)) <= 1e-5, "{got:?}");
        let logits = model.logits(&prompt).unwrap();
        let (e, apart) = (error(&logits, &want), relative(&logits, &explicit));
        eprintln!(
            "{} metadata keys: {got:?}, logits within {e:.2e} of the reference, {apart:.2e} of explicit",
            meta.len()
        );
        assert!(e <= 1e-5 && apart <= 1e-5, "{e:.2e} of the reference, {apart:.2e} of the explicit scaling");
    }
    // The scaling matters at these positions: unscaled, the logits move.
    let plain = HostWeights { cfg: LlamaConfig { rope_scaling: None, ..cfg }, ..weights.clone() };
    let unscaled = reference_logits(&plain, &prompt);
    assert!(
        error(&explicit, &unscaled) > 1e-3,
        "the scaling moves the logits by only {:.2e}",
        error(&explicit, &unscaled)
    );
    // Factors that are all 1 are plain frequencies.
    let ones = vec![1.0f32; d / 2];
    let bytes = gguf_file(&weights, &f32_types, Some(("rope_freqs.weight", &ones)), &[]);
    let mut model = Llama::from_gguf(cpu.clone(), &Gguf::parse(&bytes).unwrap(), DType::F32, 64).unwrap();
    assert_eq!(model.config().rope_scaling, None);
    let e = error(&model.logits(&prompt).unwrap(), &unscaled);
    assert!(e <= 1e-5, "all-1 factors: {e:.2e} from the unscaled reference");
}

/// What a GGUF file's rotary scaling cannot be: factors that are not Llama
/// 3's (arbitrary ones, Llama 3's for another θ, or a stated factor the
/// tensor contradicts) are refused as `UnsupportedTensor`, a tensor of the
/// wrong length as `TensorShape`, and scalings the model does not compute
/// (linear, YaRN) as `UnsupportedMetadata`, never run with other
/// frequencies.
#[test]
fn gguf_rotary_scalings_the_model_does_not_compute_are_refused() {
    use compute_core::RopeScaling;
    use compute_core::gguf::Gguf;
    let cfg = LlamaConfig { hidden: 256, rope_theta: 500_000.0, ..LlamaConfig::tiny() };
    let weights = HostWeights::random(cfg, 3);
    let d = cfg.head_dim();
    let load = |factors: Option<&[f32]>, meta: &[(&str, Meta)]| {
        let bytes = gguf_file(&weights, &|_: &str| DType::F32, factors.map(|f| ("rope_freqs.weight", f)), meta);
        LlamaConfig::from_gguf(&Gguf::parse(&bytes).unwrap(), 64)
    };
    let arbitrary: Vec<f32> = (0..d / 2).map(|i| 1.0 + (i % 3) as f32).collect();
    let other_theta = llama_cpp_rope_freqs(d, 10_000.0, RopeScaling::llama3(8.0));
    let llama3 = llama_cpp_rope_freqs(d, cfg.rope_theta, RopeScaling::llama3(8.0));
    let below_one: Vec<f32> = llama3.iter().map(|x| 1.0 / x).collect();
    let sixteen = [("llama.rope.scaling.type", Meta::Str("llama3")), ("llama.rope.scaling.factor", Meta::F32(16.0))];
    for (what, factors, meta) in [
        ("arbitrary", &arbitrary, &[][..]),
        ("another θ", &other_theta, &[]),
        ("below 1", &below_one, &[]),
        ("factor 16 stated", &llama3, &sixteen),
    ] {
        let err = load(Some(factors), meta);
        eprintln!("{what}: {err:?}");
        assert!(
            matches!(&err, Err(LoadError::UnsupportedTensor { name, .. }) if name == "rope_freqs.weight"),
            "{what}: {err:?}"
        );
    }
    let err = load(Some(&llama3[1..]), &[]);
    assert!(matches!(&err, Err(LoadError::TensorShape { name, .. }) if name == "rope_freqs.weight"), "{err:?}");
    for (meta, named) in [
        (&[("llama.rope.scaling.factor", Meta::F32(4.0))][..], "llama.rope.scaling.factor"),
        (
            &[("llama.rope.scaling.type", Meta::Str("yarn")), ("llama.rope.scaling.factor", Meta::F32(4.0))],
            "llama.rope.scaling.type",
        ),
        (&sixteen[..1], "llama.rope.scaling.factor"),
        (&sixteen, "llama.rope.scaling.type"),
    ] {
        let err = load(None, meta);
        assert!(matches!(&err, Err(LoadError::UnsupportedMetadata { key, .. }) if key == named), "{meta:?}: {err:?}");
    }
    // Scaling keys that change nothing load as plain frequencies.
    for meta in [
        &[("llama.rope.scaling.type", Meta::Str("none")), ("llama.rope.scaling.factor", Meta::F32(4.0))][..],
        &[("llama.rope.scaling.type", Meta::Str("linear")), ("llama.rope.scaling.factor", Meta::F32(1.0))],
    ] {
        assert_eq!(load(None, meta).unwrap().rope_scaling, None, "{meta:?}");
    }
}

/// `weights` as a transformers checkpoint: `config.json` text and the
/// tensors in `dtype` under transformers' names, split over `shards` files
/// (the LM head left out when `tied`).
fn hf_checkpoint(weights: &HostWeights, dtype: DType, shards: usize, tied: bool) -> (String, Vec<Vec<u8>>) {
    use compute_core::HostVec;
    use dispatch::llama::{LAYER_TENSORS, TENSOR_ORDER, hf_name};
    let c = weights.cfg;
    let config = format!(
        r#"{{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
            "hidden_size": {}, "num_hidden_layers": {}, "num_attention_heads": {}, "num_key_value_heads": {},
            "intermediate_size": {}, "vocab_size": {}, "rope_theta": {:.1}, "rms_norm_eps": {:e},
            "rope_scaling": null, "attention_bias": false, "tie_word_embeddings": {tied}, "torch_dtype": "bfloat16"}}"#,
        c.hidden, c.layers, c.heads, c.kv_heads, c.intermediate, c.vocab, c.rope_theta, c.rms_eps
    );
    let d = c.head_dim();
    let mut tensors: Vec<(String, Vec<usize>, &[f32])> = Vec::new();
    for (name, shape, v) in [
        (TENSOR_ORDER[0], vec![c.vocab, c.hidden], &weights.embed),
        (TENSOR_ORDER[1], vec![c.hidden], &weights.final_norm),
        (TENSOR_ORDER[2], vec![c.vocab, c.hidden], &weights.lm_head),
    ] {
        if !(tied && name == "output.weight") {
            tensors.push((hf_name(name), shape, v));
        }
    }
    for (i, l) in weights.layers.iter().enumerate() {
        let (h, q, kv, ff) = (c.hidden, c.heads * d, c.kv_heads * d, c.intermediate);
        let parts: [(Vec<usize>, &[f32]); 9] = [
            (vec![h], &l.attn_norm),
            (vec![h], &l.ffn_norm),
            (vec![q, h], &l.wq),
            (vec![kv, h], &l.wk),
            (vec![kv, h], &l.wv),
            (vec![h, q], &l.wo),
            (vec![ff, h], &l.gate),
            (vec![ff, h], &l.up),
            (vec![h, ff], &l.down),
        ];
        for (name, (shape, v)) in LAYER_TENSORS.iter().zip(parts) {
            tensors.push((hf_name(&format!("blk.{i}.{name}.weight")), shape, v));
        }
    }
    let st_dtype = match dtype {
        DType::F32 => safetensors::Dtype::F32,
        DType::F16 => safetensors::Dtype::F16,
        _ => safetensors::Dtype::BF16,
    };
    let stored: Vec<(String, Vec<usize>, HostVec)> =
        tensors.into_iter().map(|(n, s, v)| (n, s, HostVec::from_f32(dtype, v))).collect();
    let per = stored.len().div_ceil(shards);
    let files = stored
        .chunks(per)
        .map(|chunk| {
            let views = chunk.iter().map(|(n, s, v)| {
                (n.clone(), safetensors::tensor::TensorView::new(st_dtype, s.clone(), v.as_slice().as_bytes()).unwrap())
            });
            safetensors::serialize(views, None).unwrap()
        })
        .collect();
    (config, files)
}

#[test]
fn a_transformers_checkpoint_matches_the_reference() {
    let cpu: Arc<dyn Backend> = Arc::new(SimdBackend::new());
    let cfg = LlamaConfig { rope_theta: 500_000.0, rms_eps: 1e-6, max_seq: 32, ..LlamaConfig::tiny() };
    let weights = HostWeights::random(cfg, 23);
    let prompt = [7u32, 2, 19, 40, 1, 63];
    for (dtype, shards, tied) in [(DType::BF16, 2, false), (DType::F32, 1, true), (DType::F16, 3, false)] {
        let (config, files) = hf_checkpoint(&weights, dtype, shards, tied);
        // transformers 5 writes the rotary as `rope_parameters`.
        let config = if dtype == DType::F16 {
            config.replace(
                r#""rope_theta": 500000.0"#,
                r#""rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}"#,
            )
        } else {
            config
        };
        assert_eq!(config.contains("rope_parameters"), dtype == DType::F16);
        let shards_in: Vec<&[u8]> = files.iter().rev().map(Vec::as_slice).collect();
        let mut model = Llama::from_safetensors(cpu.clone(), &config, &shards_in, DType::F32, 32).unwrap();
        assert_eq!(*model.config(), cfg);
        let mut want = weights.as_stored(WeightFormat::dense(dtype));
        if tied {
            want.lm_head = want.embed.clone();
        }
        let logits = model.logits(&prompt).unwrap();
        let e = error(&logits, &reference_logits(&want, &prompt));
        assert!(e < 1e-5, "{dtype} checkpoint ({shards} shards, tied {tied}): logits off by {e:.3e}");
    }
    // A directory as `save_pretrained` leaves it, memory-mapped, loads the same
    // model as the bytes in memory.
    let (config, files) = hf_checkpoint(&weights, DType::BF16, 2, false);
    let dir = std::env::temp_dir().join(format!("compute-hf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), &config).unwrap();
    for (i, f) in files.iter().enumerate() {
        std::fs::write(dir.join(format!("model-0000{}-of-00002.safetensors", i + 1)), f).unwrap();
    }
    let from_dir = Llama::from_hf_dir(cpu.clone(), &dir, DType::F32, 32).map(|mut m| m.logits(&prompt));
    let shards_in: Vec<&[u8]> = files.iter().map(Vec::as_slice).collect();
    let from_bytes = Llama::from_safetensors(cpu.clone(), &config, &shards_in, DType::F32, 32).unwrap().logits(&prompt);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(from_dir.unwrap().unwrap(), from_bytes.unwrap());
    let err = Llama::from_hf_dir(cpu.clone(), &dir, DType::F32, 32).err();
    assert!(matches!(&err, Some(LoadError::Io { path, .. }) if path.ends_with("config.json")), "{err:?}");

    // What the loader refuses, as typed errors naming the cause.
    let (config, files) = hf_checkpoint(&weights, DType::BF16, 1, false);
    let load =
        |config: &str, files: &[&[u8]]| Llama::from_safetensors(cpu.clone(), config, files, DType::F32, 32).err();
    let scaled = config.replace(r#""rope_scaling": null"#, r#""rope_scaling": {"rope_type": "llama3", "factor": 8.0}"#);
    let err = load(&scaled, &[&files[0]]);
    assert!(
        matches!(&err, Some(LoadError::Config { key, .. }) if key == "rope_scaling.original_max_position_embeddings"),
        "{err:?}"
    );
    let yarn = config.replace(r#""rope_scaling": null"#, r#""rope_scaling": {"rope_type": "yarn", "factor": 4.0}"#);
    let err = load(&yarn, &[&files[0]]);
    assert!(matches!(&err, Some(LoadError::Config { key, .. }) if key == "rope_scaling"), "{err:?}");
    let backwards = config.replace(
        r#""rope_scaling": null"#,
        r#""rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0,
            "original_max_position_embeddings": 8192}"#,
    );
    let err = load(&backwards, &[&files[0]]);
    assert!(matches!(&err, Some(LoadError::Config { key, .. }) if key == "rope_scaling"), "{err:?}");
    let scaled =
        config.replace(r#""rope_theta": 500000.0"#, r#""rope_parameters": {"rope_theta": 5e5, "rope_type": "llama3"}"#);
    let err = load(&scaled, &[&files[0]]);
    assert!(matches!(&err, Some(LoadError::Config { key, .. }) if key.starts_with("rope_parameters.")), "{err:?}");
    let no_vocab = config.replace(r#""vocab_size""#, r#""vocab""#);
    let err = load(&no_vocab, &[&files[0]]);
    assert!(matches!(&err, Some(LoadError::Config { key, .. }) if key == "vocab_size"), "{err:?}");
    let wider = config.replace(&format!(r#""intermediate_size": {}"#, cfg.intermediate), r#""intermediate_size": 64"#);
    let err = load(&wider, &[&files[0]]);
    assert!(
        matches!(&err, Some(LoadError::TensorShape { name, .. }) if name == "model.layers.0.mlp.gate_proj.weight"),
        "{err:?}"
    );
    let (_, halves) = hf_checkpoint(&weights, DType::BF16, 2, false);
    let err = load(&config, &[&halves[1]]);
    assert!(matches!(&err, Some(LoadError::MissingTensor { .. })), "{err:?}");
    let err = load(&config, &[&files[0][..files[0].len() / 2]]);
    assert!(matches!(&err, Some(LoadError::SafeTensors(_))), "{err:?}");
}

/// Callers on several threads generating through one [`BatchedDecoder`] of
/// three slots (five requests, so two wait for a free slot) each get the
/// tokens their prompt gives decoded alone; the steps are shared.
#[test]
fn concurrent_callers_through_the_batched_decoder_get_their_tokens_alone() {
    use dispatch::llama::{BatchedDecoder, DecoderConfig};
    let cfg = LlamaConfig::tiny();
    let weights = HostWeights::random(cfg, 17);
    let format = WeightFormat::dense(DType::F32);
    let cpu = Arc::new(SimdBackend::new());
    let requests: Vec<(Vec<u32>, usize)> = (0..5u32)
        .map(|r| ((0..3 + 2 * r).map(|i| (i * 31 + r * 7 + 1) % cfg.vocab as u32).collect(), 4 + 3 * r as usize))
        .collect();
    let mut alone = Llama::load(cpu.clone(), &weights, format).unwrap();
    let want: Vec<Vec<u32>> = requests
        .iter()
        .map(|(p, n)| {
            alone.reset();
            alone.generate(p, *n).unwrap()
        })
        .collect();
    let model = Llama::load(cpu.clone(), &weights, format).unwrap();
    let decoder = BatchedDecoder::new(model, DecoderConfig::new(3)).unwrap();
    let got: Vec<Vec<u32>> = std::thread::scope(|s| {
        let threads: Vec<_> = requests
            .iter()
            .map(|(p, n)| {
                let handle = decoder.handle();
                s.spawn(move || {
                    // Streamed one by one: the same tokens `wait` would give.
                    let mut tokens = Vec::new();
                    for t in handle.generate(p.clone(), *n).unwrap() {
                        tokens.push(t.unwrap());
                    }
                    tokens
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    assert_eq!(got, want);
    let m = decoder.metrics();
    let generated: usize = requests.iter().map(|r| r.1).sum();
    assert_eq!((m.requests, m.completed, m.cancelled, m.failed), (5, 5, 0, 0));
    assert_eq!(m.tokens, generated as u64);
    assert_eq!(m.prefilled, 5);
    // A sequence decodes its tokens after the first in steps of its own
    // count at most, shared with the others held beside it.
    assert_eq!(m.step_rows, (generated - 5) as u64);
    assert!(m.steps < m.step_rows, "steps shared: {m:?}");
    assert!(m.mean_batch() > 1.0 && m.mean_batch() <= 3.0, "{m:?}");
    // One request's stream, its timings in order.
    let one = decoder.handle().generate(requests[1].0.clone(), 6).unwrap().wait().unwrap();
    assert_eq!(one.tokens, want[1][..6]);
    assert!(one.queued <= one.first_token && one.first_token <= one.total, "{one:?}");
    assert!(!one.stopped);
    let (model, m) = decoder.shutdown().unwrap();
    assert_eq!(m.completed, 6);
    assert!(model.active_sequences().is_empty(), "every slot freed");
}

/// The CPU backend, whose downloads (one a prefill or decoding step of the
/// model) wait for the test's leave: [`Metered::allow`].
struct Metered {
    cpu: Arc<SimdBackend>,
    budget: Mutex<usize>,
    more: std::sync::Condvar,
}

impl Metered {
    fn new(cpu: Arc<SimdBackend>) -> Self {
        Metered { cpu, budget: Mutex::new(usize::MAX), more: std::sync::Condvar::new() }
    }

    /// Lets `n` more downloads through (`usize::MAX`: all).
    fn allow(&self, n: usize) {
        *self.budget.lock().unwrap() = n;
        self.more.notify_all();
    }
}

impl Backend for Metered {
    fn kind(&self) -> BackendKind {
        self.cpu.kind()
    }
    fn device_name(&self) -> String {
        self.cpu.device_name()
    }
    fn run_typed(&self, op: &Op, inputs: &[HostSlice<'_>], output: HostSliceMut<'_>) -> compute_core::Result<()> {
        self.cpu.run_typed(op, inputs, output)
    }
    fn upload_typed(&self, data: HostSlice<'_>) -> compute_core::Result<Tensor> {
        self.cpu.upload_typed(data)
    }
    fn upload_into(&self, data: HostSlice<'_>, tensor: &Tensor) -> compute_core::Result<()> {
        self.cpu.upload_into(data, tensor)
    }
    fn alloc_typed(&self, len: usize, dtype: DType) -> compute_core::Result<Tensor> {
        self.cpu.alloc_typed(len, dtype)
    }
    fn download_typed(&self, tensor: &Tensor, out: HostSliceMut<'_>) -> compute_core::Result<()> {
        let mut budget = self.budget.lock().unwrap();
        // Bounded, so that a miscounted test fails instead of hanging.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while *budget == 0 && std::time::Instant::now() < deadline {
            budget = self.more.wait_timeout(budget, std::time::Duration::from_millis(50)).unwrap().0;
        }
        *budget = budget.saturating_sub(1);
        drop(budget);
        self.cpu.download_typed(tensor, out)
    }
    fn run_tensors(&self, op: &Op, inputs: &[&Tensor], output: &Tensor) -> compute_core::Result<()> {
        self.cpu.run_tensors(op, inputs, output)
    }
}

/// A stop token ends a generation early; a dropped generation frees its slot;
/// bad requests are refused when submitted; a shut-down decoder accepts
/// nothing and gives its model back.
#[test]
fn the_batched_decoder_stops_cancels_and_refuses_as_asked() {
    use dispatch::llama::{BatchedDecoder, DecoderConfig, GenerateRequest};
    let cfg = LlamaConfig::tiny();
    let weights = HostWeights::random(cfg, 19);
    let format = WeightFormat::dense(DType::F32);
    let cpu = Arc::new(SimdBackend::new());
    let prompt = vec![2u32, 7, 1, 8, 2, 8];
    let mut alone = Llama::load(cpu.clone(), &weights, format).unwrap();
    let want = alone.generate(&prompt, 12).unwrap();
    let model = Llama::load(cpu.clone(), &weights, format).unwrap();
    let decoder = BatchedDecoder::new(model, DecoderConfig::new(2).with_max_wait(std::time::Duration::ZERO)).unwrap();
    let handle = decoder.handle();

    // The stop token is the 4th generated (the first time it appears).
    let stop = want[3];
    let first = want.iter().position(|&t| t == stop).unwrap();
    let req = GenerateRequest::new(prompt.clone(), 12).with_stop_tokens(vec![stop]);
    let got = handle.submit(req).unwrap().wait().unwrap();
    assert_eq!(got.tokens, want[..=first]);
    assert!(got.stopped || first == 11);

    // A caller that leaves after two tokens; another generates beside it.
    // The two share steps on a backend that lets the test hold the third
    // step, so the first caller is gone before that step's token comes.
    let gate = Arc::new(Metered::new(cpu.clone()));
    let gated = Llama::load(gate.clone(), &weights, format).unwrap();
    let config = DecoderConfig::new(2).with_max_wait(std::time::Duration::from_secs(5));
    let two = BatchedDecoder::new(gated, config).unwrap();
    gate.allow(2); // the prefill of both and one step
    let mut leaving = two.handle().generate(prompt.clone(), 12).unwrap();
    let staying = two.handle().generate(prompt.clone(), 12).unwrap();
    assert_eq!(leaving.next().unwrap().unwrap(), want[0]);
    assert_eq!(leaving.next().unwrap().unwrap(), want[1]);
    assert_eq!(leaving.tokens(), &want[..2]);
    drop(leaving);
    gate.allow(usize::MAX);
    assert_eq!(staying.wait().unwrap().tokens, want);
    // Its slot is free again: two more run together.
    let a = two.handle().generate(prompt.clone(), 5).unwrap();
    let b = two.handle().generate(vec![3, 3], 5).unwrap();
    assert_eq!(a.wait().unwrap().tokens, want[..5]);
    b.wait().unwrap();
    let (_, m) = two.shutdown().unwrap();
    assert_eq!((m.requests, m.completed, m.cancelled, m.failed), (4, 3, 1, 0), "{m:?}");

    let refused = |r: compute_core::Result<dispatch::llama::Generation>, what: &str| match r {
        Err(compute_core::ComputeError::Shape { op: "llama generate", .. }) => {}
        Err(e) => panic!("{what}: wrong error {e}"),
        Ok(_) => panic!("{what}: accepted"),
    };
    refused(handle.generate(Vec::new(), 3), "an empty prompt");
    refused(handle.generate(vec![1], 0), "no token asked for");
    refused(handle.generate(vec![cfg.vocab as u32], 3), "a token past the vocabulary");
    refused(handle.generate(vec![1; cfg.max_seq], 2), "past the cache");
    // Exactly filling the cache is fine: the last token is not stored.
    let full = handle.generate(vec![1; cfg.max_seq - 2], 3).unwrap().wait().unwrap();
    assert_eq!(full.tokens.len(), 3);
    assert_eq!(decoder.metrics().requests, 2, "refused requests are not counted");

    let (mut model, _) = decoder.shutdown().unwrap();
    match handle.generate(prompt.clone(), 2) {
        Err(compute_core::ComputeError::Driver { op: "llama generate", .. }) => {}
        Err(e) => panic!("after shutdown: wrong error {e}"),
        Ok(_) => panic!("accepted after shutdown"),
    }
    // The model comes back usable.
    model.set_slots(1).unwrap();
    let (_, next) = model.add_sequence(&prompt).unwrap();
    assert_eq!(next, want[0]);
}
