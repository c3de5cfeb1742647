//! A Llama-architecture decoder with random weights, run through the
//! library's ops on one engine (`dispatch::llama`): prefill a prompt, then
//! decode greedily. Prints prefill and decode tokens per second and the
//! fraction of the decode roofline reached (every weight byte and the KV
//! cache read once per token, at the copy bandwidth measured on the same
//! engine in the same run). On the tiny configuration it also checks the
//! logits and the greedy tokens against the float64 reference.
//!
//! ```text
//! cargo run --release -p dispatch --features cuda --example llama -- \
//!     [--config tiny|1b] [--dtype f32|f16|bf16] [--linear q4_K|q5_K|q6_K|q8_0] \
//!     [--engine simd|wgpu|cuda] [--prompt N] [--new N] [--gguf model.gguf | --hf DIR] \
//!     [--logits FILE] [--compare-direct] [--compare-unfused] [--compare-keys] [--sequences N [--stagger]] [--clients N [--rounds R]]
//!     [--llama3-scaling FACTOR]
//! ```
//!
//! With `--gguf`, the model is a llama GGUF file (memory-mapped; its linear
//! layers keep their block types, `--dtype` sets the activations'); with
//! `--hf`, a directory saved by transformers (`config.json` and
//! `*.safetensors`, memory-mapped, converted to `--dtype`). Without a tokenizer, the prompt
//! is a fixed sequence of token ids: `(i·7919 + 13) mod vocab`. `--logits`
//! writes the prompt's last-position logits (one number a line) and the
//! greedy tokens (a last line `tokens: …`) to FILE, to compare with another
//! implementation. Decoding steps are recorded once and replayed where the
//! engine records (CUDA graphs); `--compare-direct` also times the same
//! decoding with every step queued op by op, in the same process;
//! `--compare-unfused` the decoding with the norms and gated halves of
//! block-quantized products as ops of their own, then fused again;
//! `--compare-keys` the decoding with the keys turned and then appended to
//! the cache (two ops a layer), then turned straight into it (one).
//! `--sequences N` then decodes N sequences together: N different prompts
//! prefilled together in one pass, then `--new` steps of all N timed
//! (`Llama::step_active`), printing the prefill's and the total decode's
//! tokens/s; `--stagger` adds a run of 2N requests through the N slots,
//! joining one after another and leaving when done, their slots refilled.
//! `--clients N` then hands the model to a `BatchedDecoder` of N slots and
//! runs N caller threads, each generating `--new` tokens after its own
//! prompt, `--rounds` times one after another (default 1): prints the total
//! tokens/s over the wall time (prefills included), each caller's decode
//! tokens/s and time to first token, and the decoder's mean batch.
//! `--llama3-scaling FACTOR` gives the random model Llama 3's rotary
//! frequency scaling (low 1, high 4, an original context of 8192; Llama
//! 3.2 uses factor 32); a checkpoint's `config.json` states its own.
//!
//! Defaults: the tiny configuration in `f32` on the first GPU engine (the
//! CPU when there is none), a prompt of 16 tokens and 32 new ones. The
//! benchmark: `--config 1b --dtype bf16 --prompt 512 --new 256`, and with
//! `--linear q4_K` for the quantized model. Layout choices (weights `[out,
//! in]`, separate q/k/v projections, a head-major KV cache) are described in
//! `dispatch::llama`.

use std::time::Instant;

use compute_core::{ComputeError, DType, Op};
use dispatch::llama::{
    BatchedDecoder, DecoderConfig, Generated, HostWeights, Llama, LlamaConfig, WeightFormat, reference_logits,
};
use dispatch::{Compute, Engine};

/// Prints one of the in-process comparisons: `d` seconds for the decoded
/// `again` (the first token is the prefill's), and whether they are the
/// main run's `tokens`.
fn report_decode(what: &str, d: f64, again: &[u32], tokens: &[u32]) {
    let n = again.len().saturating_sub(1).max(1);
    let same = again == tokens;
    println!(
        "decode with {what}: {:.3} ms/token, {:.1} tokens/s; same tokens: {same}",
        d / n as f64 * 1e3,
        n as f64 / d
    );
}

/// Decodes `prompt` again with `set(model, on)` off, on, off, on, each
/// after three untimed tokens, reporting each against `tokens`: what the
/// switch gains, measured in this process.
fn compare_switch(
    model: &mut Llama,
    (prompt, new_tokens, tokens): (&[u32], usize, &[u32]),
    what: &str,
    set: fn(&mut Llama, bool),
) -> Result<(), ComputeError> {
    for on in [false, true, false, true] {
        set(model, on);
        model.reset();
        model.generate(prompt, 3)?;
        model.reset();
        let (_, d, again) = timed(model, prompt, new_tokens)?;
        report_decode(&format!("{what} {}", if on { "on" } else { "off" }), d, &again, tokens);
    }
    Ok(())
}

/// Resets `model`, then times a prefill of `prompt` and greedy decoding up
/// to `new_tokens` tokens: `(prefill s, decode s, tokens)`.
fn timed(model: &mut Llama, prompt: &[u32], new_tokens: usize) -> Result<(f64, f64, Vec<u32>), ComputeError> {
    model.reset();
    let t = Instant::now();
    let first = model.step(prompt)?;
    let prefill_s = t.elapsed().as_secs_f64();
    let mut tokens = vec![first];
    let t = Instant::now();
    while tokens.len() < new_tokens.max(1) {
        let next = model.step(&[*tokens.last().unwrap_or(&first)])?;
        tokens.push(next);
    }
    Ok((prefill_s, t.elapsed().as_secs_f64(), tokens))
}

/// Sequences that come and go: `2·N` requests for `N` slots (`N` the
/// prompts), the first `N` joining one every `new_tokens / N` steps, each
/// leaving after `new_tokens` tokens, its slot taken by the next request's
/// prompt as soon as it is free. Prints the tokens decoded per second over
/// the whole run, prefills included.
fn staggered(model: &mut Llama, prompts: &[Vec<u32>], new_tokens: usize) -> Result<(), ComputeError> {
    let n = prompts.len();
    model.set_slots(n)?;
    let gap = (new_tokens / n).max(1);
    let (mut started, mut done, mut steps, mut decoded) = (0usize, 0usize, 0usize, 0usize);
    let mut left: std::collections::HashMap<dispatch::llama::SeqId, usize> = std::collections::HashMap::new();
    let t = Instant::now();
    while done < 2 * n {
        // Requests waiting: the first n arrive one every `gap` steps, the rest at once.
        let arrived = if steps / gap < n { steps / gap + 1 } else { 2 * n };
        let room = n - left.len();
        let joining: Vec<&[u32]> = (started..arrived.min(started + room)).map(|r| prompts[r % n].as_slice()).collect();
        for (id, _) in model.add_sequences(&joining)? {
            left.insert(id, new_tokens);
        }
        started += joining.len();
        for (id, _) in model.step_active()? {
            decoded += 1;
            let rest = left.entry(id).or_default();
            *rest = rest.saturating_sub(1);
            if *rest <= 1 {
                model.remove_sequence(id)?;
                left.remove(&id);
                done += 1;
            }
        }
        steps += 1;
    }
    let s = t.elapsed().as_secs_f64();
    println!(
        "{} requests through {n} slots, joining and leaving: {steps} steps in {:.1} ms, {:.1} tokens decoded/s \
         (prefills included)",
        2 * n,
        s * 1e3,
        decoded as f64 / s
    );
    Ok(())
}

/// Callers on `clients` threads generating through one [`BatchedDecoder`]
/// of `clients` slots, `rounds` requests each: prints the total and
/// per-caller rates against `one` (the one-sequence decode tokens/s).
fn served(
    model: Llama,
    clients: usize,
    rounds: usize,
    prompt_len: usize,
    new_tokens: usize,
    one: f64,
) -> Result<(), Box<dyn std::error::Error>> {
    let vocab = model.config().vocab;
    let decoder = BatchedDecoder::new(model, DecoderConfig::new(clients))?;
    let prompt = |c: usize, r: usize| -> Vec<u32> {
        (0..prompt_len.max(1)).map(|i| ((c * 104_729 + r * 1_299_709 + i * 7919 + 13) % vocab) as u32).collect()
    };
    let run = |rounds: usize, new_tokens: usize| -> Result<Vec<Generated>, ComputeError> {
        std::thread::scope(|s| {
            let threads: Vec<_> = (0..clients)
                .map(|c| {
                    let handle = decoder.handle();
                    s.spawn(move || {
                        (0..rounds)
                            .map(|r| handle.generate(prompt(c, r), new_tokens)?.wait())
                            .collect::<Result<Vec<_>, _>>()
                    })
                })
                .collect();
            let mut all = Vec::new();
            for t in threads {
                all.extend(t.join().map_err(|_| ComputeError::shape("llama example", "a caller panicked", ""))??);
            }
            Ok(all)
        })
    };
    // Warm-up: the prefill's and the step's kernels and recording.
    run(1, 4)?;
    let before = decoder.metrics();
    let t = Instant::now();
    let done = run(rounds, new_tokens)?;
    let wall = t.elapsed().as_secs_f64();
    let m = decoder.metrics();
    let tokens: usize = done.iter().map(|g| g.tokens.len()).sum();
    let rates: Vec<f64> = done.iter().map(Generated::decode_tokens_per_s).collect();
    let firsts: Vec<f64> = done.iter().map(|g| g.first_token.as_secs_f64() * 1e3).collect();
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let lo = rates.iter().copied().fold(f64::MAX, f64::min);
    let hi = rates.iter().copied().fold(0.0, f64::max);
    let total = tokens as f64 / wall;
    let steps = m.steps - before.steps;
    let rows = m.step_rows - before.step_rows;
    println!(
        "{clients} callers x {rounds} requests of {new_tokens} tokens through a BatchedDecoder of {clients} slots: \
         {:.1} ms, {total:.1} tokens/s in all (prefills included) = {:.2}x the one-sequence decode; per caller \
         decode {:.1} tokens/s (min {lo:.1}, max {hi:.1}), first token after {:.1} ms (max {:.1}); {steps} steps of \
         {:.2} sequences on average, {} prefills",
        wall * 1e3,
        total / one,
        mean(&rates),
        mean(&firsts),
        firsts.iter().copied().fold(0.0, f64::max),
        rows as f64 / steps.max(1) as f64,
        m.prefills - before.prefills
    );
    decoder.shutdown()?;
    Ok(())
}

fn dtype(name: &str) -> Result<DType, String> {
    Ok(match name {
        "f32" => DType::F32,
        "f16" => DType::F16,
        "bf16" => DType::BF16,
        "q4_K" => DType::Q4K,
        "q5_K" => DType::Q5K,
        "q6_K" => DType::Q6K,
        "q8_0" => DType::Q8_0,
        other => return Err(format!("unknown dtype {other}")),
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut cfg = LlamaConfig::tiny();
    let (mut dense, mut linear, mut engine) = (DType::F32, None, None);
    let (mut prompt_len, mut new_tokens) = (16usize, 32usize);
    let (mut gguf_path, mut hf_dir, mut logits_path): (Option<String>, Option<String>, Option<String>) =
        (None, None, None);
    let mut compare_direct = false;
    let mut compare_unfused = false;
    let mut compare_keys = false;
    let mut sequences = 1usize;
    let mut stagger = false;
    let (mut clients, mut rounds) = (0usize, 1usize);
    let mut scaling = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--config" => {
                cfg = match value()?.as_str() {
                    "tiny" => LlamaConfig::tiny(),
                    "1b" => LlamaConfig::llama_1b(),
                    other => return Err(format!("unknown config {other}").into()),
                }
            }
            "--dtype" => dense = dtype(&value()?)?,
            "--linear" => linear = Some(dtype(&value()?)?),
            "--engine" => {
                engine = Some(match value()?.as_str() {
                    "simd" => Engine::Simd,
                    "wgpu" => Engine::Wgpu,
                    "cuda" => Engine::Cuda,
                    other => return Err(format!("unknown engine {other}").into()),
                })
            }
            "--prompt" => prompt_len = value()?.parse()?,
            "--new" => new_tokens = value()?.parse()?,
            "--gguf" => gguf_path = Some(value()?),
            "--hf" => hf_dir = Some(value()?),
            "--logits" => logits_path = Some(value()?),
            "--compare-direct" => compare_direct = true,
            "--compare-unfused" => compare_unfused = true,
            "--compare-keys" => compare_keys = true,
            "--sequences" => sequences = value()?.parse()?,
            "--stagger" => stagger = true,
            "--clients" => clients = value()?.parse()?,
            "--rounds" => rounds = value()?.parse()?,
            "--llama3-scaling" => scaling = Some(compute_core::RopeScaling::llama3(value()?.parse()?)),
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let format = WeightFormat { dtype: dense, linear: linear.unwrap_or(dense) };
    if scaling.is_some() {
        cfg.rope_scaling = scaling;
    }
    cfg.max_seq = cfg.max_seq.max(prompt_len.max(1) + new_tokens);
    let compute = Compute::auto()?;
    let engines = compute.engines();
    let engine = engine
        .or_else(|| [Engine::Cuda, Engine::Wgpu].into_iter().find(|e| engines.contains(e)))
        .unwrap_or(Engine::Simd);
    let backend = compute.backend(engine).ok_or(ComputeError::Unsupported { op: "llama", backend: engine.kind() })?;
    println!(
        "config {cfg:?}\n{:.3} B parameters; weights {format:?}; engine {engine:?} [{}]",
        cfg.parameters() as f64 / 1e9,
        backend.device_name()
    );

    let start = Instant::now();
    let (mut model, weights) = match &gguf_path {
        None if hf_dir.is_some() => {
            let dir = std::path::PathBuf::from(hf_dir.as_deref().unwrap_or_default());
            let model = Llama::from_hf_dir(backend.clone(), &dir, dense, prompt_len + new_tokens)?;
            cfg = *model.config();
            println!("from {}: {cfg:?}", dir.display());
            (model, None)
        }
        Some(path) => {
            let path = std::path::Path::new(path);
            let model = Llama::from_gguf_path(backend.clone(), path, dense, prompt_len + new_tokens)?;
            cfg = *model.config();
            println!("from {}: {cfg:?}", gguf_path.as_deref().unwrap_or_default());
            (model, None)
        }
        None => {
            let weights = HostWeights::random(cfg, 7);
            (Llama::load(backend.clone(), &weights, format)?, Some(weights))
        }
    };
    backend.synchronize()?;
    println!("weights generated, converted and uploaded in {:.1} s", start.elapsed().as_secs_f64());

    // The copy bandwidth of this engine: 256 MiB of f32, read and written.
    let words = 64 << 20;
    // Written data: a host engine would read never-touched pages from the zero page.
    let (src, dst) = (backend.upload(&vec![1.0f32; words])?, backend.upload(&vec![2.0f32; words])?);
    let copy = Op::cast(words, DType::F32, DType::F32);
    backend.run_tensors(&copy, &[&src], &dst)?;
    backend.synchronize()?;
    let t = Instant::now();
    for _ in 0..5 {
        backend.run_tensors(&copy, &[&src], &dst)?;
    }
    backend.synchronize()?;
    let copy_bw = 5.0 * 8.0 * words as f64 / t.elapsed().as_secs_f64();
    drop((src, dst));

    let prompt: Vec<u32> = (0..prompt_len).map(|i| ((i * 7919 + 13) % cfg.vocab) as u32).collect();
    // A warm-up sequence (kernel compilation, scratch allocation, the step's
    // recording), then the timed ones.
    model.generate(&prompt, 3)?;
    model.reset();
    let (prefill_s, decode_s, tokens) = timed(&mut model, &prompt, new_tokens)?;
    if compare_direct && model.device_positions() {
        // The same sequence with every step queued op by op, then recorded
        // again: the recording's gain, measured in this process.
        for on in [false, true, false] {
            model.set_recording(on);
            if on {
                model.reset();
                model.generate(&prompt, 3)?;
            }
            let (_, d, again) = timed(&mut model, &prompt, new_tokens)?;
            report_decode(&format!("recording {}", if on { "on" } else { "off" }), d, &again, &tokens);
        }
        model.set_recording(true);
    }
    if compare_unfused {
        // The norms and gated halves of quantized products as ops of their
        // own, then fused again.
        compare_switch(&mut model, (&prompt, new_tokens, &tokens), "fused norms", Llama::set_fused_norms)?;
    }
    if compare_keys {
        // The keys turned, then appended (two ops a layer), then turned
        // straight into the cache.
        compare_switch(&mut model, (&prompt, new_tokens, &tokens), "keys into the cache", Llama::set_keys_into_cache)?;
    }
    if let Some(path) = &logits_path {
        model.reset();
        let logits = model.logits(&prompt)?;
        let mut text: String = logits.iter().map(|v| format!("{v}\n")).collect();
        text.push_str(&format!("tokens: {tokens:?}\n"));
        std::fs::write(path, text)?;
    }
    let decoded = tokens.len().saturating_sub(1).max(1);

    // Bytes one decoding step must read: every weight once and the KV cache
    // (here at the end of the run; the mean step reads a little less).
    let per_token = model.bytes_per_token() as f64;
    let decode_tps = decoded as f64 / decode_s;
    let roofline = copy_bw / per_token;
    println!("prefill {prompt_len} tokens: {:.1} ms, {:.0} tokens/s", prefill_s * 1e3, prompt_len as f64 / prefill_s);
    println!(
        "decode {decoded} tokens: {:.2} ms/token, {decode_tps:.1} tokens/s; {:.1} MB read per token; copy {:.0} GB/s; \
         roofline {roofline:.0} tokens/s; {:.2} of it",
        decode_s / decoded as f64 * 1e3,
        per_token / 1e6,
        copy_bw / 1e9,
        decode_tps / roofline
    );
    println!("tokens: {:?}", &tokens[..tokens.len().min(16)]);

    if sequences > 1 {
        model.set_slots(sequences)?;
        // N different prompts of --prompt tokens, prefilled together in one pass.
        let prompts: Vec<Vec<u32>> = (0..sequences)
            .map(|s| (0..prompt_len.max(1)).map(|i| ((s * 104_729 + i * 7919 + 13) % cfg.vocab) as u32).collect())
            .collect();
        let views: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
        // Warm-up: the batched prefill's and the step's kernels, the step's recording.
        model.add_sequences(&views)?;
        for _ in 0..3 {
            model.step_active()?;
        }
        model.set_slots(sequences)?;
        let t = Instant::now();
        model.add_sequences(&views)?;
        let prefill_s = t.elapsed().as_secs_f64();
        // The first two steps run directly and record; the timed ones replay.
        for _ in 0..2 {
            model.step_active()?;
        }
        let t = Instant::now();
        for _ in 0..new_tokens.max(1) {
            model.step_active()?;
        }
        let s = t.elapsed().as_secs_f64();
        let total = (sequences * new_tokens.max(1)) as f64 / s;
        println!(
            "prefill {sequences} prompts of {prompt_len} together: {:.1} ms, {:.0} tokens/s",
            prefill_s * 1e3,
            (sequences * prompt_len) as f64 / prefill_s
        );
        println!(
            "decode {sequences} sequences together: {:.2} ms/step, {total:.1} tokens/s in all, {:.1} per sequence; \
             {:.2}x the one-sequence decode above",
            s / new_tokens.max(1) as f64 * 1e3,
            total / sequences as f64,
            total / decode_tps
        );
        if stagger {
            staggered(&mut model, &prompts, new_tokens.max(1))?;
        }
    }

    if let Some(weights) = weights.filter(|_| cfg.parameters() < 20_000_000) {
        let stored = weights.as_stored(format);
        let mut all = prompt.clone();
        let mut agree = 0;
        for &t in &tokens {
            let want = reference_logits(&stored, &all);
            let best = want.iter().enumerate().fold(0, |b, (i, v)| if *v > want[b] { i } else { b });
            agree += usize::from(best as u32 == t);
            all.push(t);
        }
        println!("greedy tokens equal to the float64 reference's: {agree} of {}", tokens.len());
    }
    if clients > 0 {
        served(model, clients, rounds.max(1), prompt_len, new_tokens.max(1), decode_tps)?;
    }
    Ok(())
}
