//! The GPU paths on whatever GPU engine this build and machine have (wgpu on
//! lavapipe in CI, CUDA and wgpu on the GPU machine): pool over real device
//! buffers, command batch, scheduler, async results and the executor, each
//! forced onto the GPU by a synthetic profile. Skipped (loudly) without a GPU,
//! unless `COMPUTE_REQUIRE` names the backend.
mod common;

use std::sync::{Arc, Mutex};

use common::{assert_matches_reference, data, gpu_always_wins};
use compute_core::{BinaryOp, Op, RowOp, Tensor, UnaryOp, conformance::required};
use dispatch::{BatchConfig, BatchedExecutor, Compute, Engine, GpuBufferPool, HybridScheduler, Placement};

/// Every GPU engine present, each as a Compute that prefers it.
fn gpus() -> Vec<(Engine, Compute)> {
    let mut out = Vec::new();
    for f in dispatch::discover::probe().into_iter().filter(|f| f.engine.is_gpu()) {
        match f.backend {
            Ok(b) => {
                // Given as a plain `Backend` (the trait path) ...
                let given = Compute::builder().cpu().engine(f.engine, b).profile(gpu_always_wins(f.engine));
                out.push((f.engine, given.build().unwrap()));
                // ... and discovered (wgpu's command batch then runs as one submission).
                let found = Compute::builder().discover().profile(gpu_always_wins(f.engine));
                out.push((f.engine, found.build().unwrap()));
            }
            Err(e) => {
                assert!(!required(f.engine.kind()), "{} is required here but unavailable: {e}", f.engine);
                eprintln!("SKIPPED: {} GPU tests: {e}", f.engine);
            }
        }
    }
    out
}

#[test]
fn pool_over_device_buffers_lends_each_buffer_once() {
    for (engine, c) in gpus() {
        let backend = c.backend(engine).unwrap();
        let pool = GpuBufferPool::new(backend.clone(), 64 * 1024);
        let live: Arc<Mutex<Vec<Tensor>>> = Arc::new(Mutex::new(Vec::new()));
        std::thread::scope(|s| {
            for t in 0..4 {
                let (pool, live, backend) = (pool.clone(), live.clone(), backend.clone());
                s.spawn(move || {
                    for i in 0..25 {
                        let len = [256usize, 1024, 4096][(t + i) % 3];
                        let buf = pool.acquire(len).unwrap();
                        assert_eq!(buf.location().backend, engine.kind());
                        {
                            let mut l = live.lock().unwrap();
                            assert!(!l.iter().any(|x| x.same_storage(&buf)), "buffer lent twice");
                            l.push(buf.tensor().clone());
                        }
                        let mark = data((t * 100 + i) as u64, len);
                        let src = backend.upload(&mark).unwrap();
                        backend.run_tensors(&Op::unary(UnaryOp::Scale { s: 1.0 }, len), &[&src], &buf).unwrap();
                        let mut back = vec![0.0; len];
                        backend.download(&buf, &mut back).unwrap();
                        assert_eq!(back, mark, "another user wrote into this buffer");
                        let mut l = live.lock().unwrap();
                        let pos = l.iter().position(|x| x.same_storage(&buf)).unwrap();
                        l.swap_remove(pos);
                        drop(l);
                        drop(buf);
                        assert!(pool.stats().bytes_held <= 64 * 1024);
                    }
                });
            }
        });
        let s = pool.stats();
        assert_eq!(s.hits + s.misses, 100, "{s:?}");
        assert!(s.hits > 0, "{s:?}");
        assert_eq!(s.buffers_in_use, 0);
    }
}

#[test]
fn batch_scheduler_async_and_executor_run_on_the_gpu() {
    for (engine, c) in gpus() {
        // Command batch: the chain runs on the GPU, results equal the reference.
        let (m, k, n) = (24, 40, 32);
        let (a, b) = (data(1, m * k), data(2, k * n));
        let mut batch = c.batch();
        let (ba, bb) = (batch.upload(&a), batch.upload(&b));
        let mm = batch.matmul(ba, bb, m, k, n).unwrap();
        let g = batch.gelu(mm).unwrap();
        let sm = batch.softmax(g, m, n).unwrap();
        // With several GPUs discovered (CUDA and Vulkan on one NVIDIA machine) the model may
        // pick the other one: what matters is that the chain ran on a GPU.
        let ran = batch.execute().unwrap();
        assert!(ran.is_gpu(), "batch for {engine} ran on {ran}");
        let mm_out = batch.read(mm).unwrap();
        assert_matches_reference(&Op::matmul(m, k, n), &[&a, &b], &mm_out);
        let g_out = batch.read(g).unwrap();
        assert_matches_reference(&Op::rows(RowOp::Softmax, m, n), &[&g_out], &batch.read(sm).unwrap());

        // Scheduler with threshold 1: every matmul on the GPU.
        let s = HybridScheduler::from_compute(c.clone(), Some(1));
        assert!(s.should_use_gpu(2, 2, 2));
        assert_matches_reference(&Op::matmul(m, k, n), &[&a, &b], &s.matmul(&a, &b, m, k, n).unwrap());
        assert!(c.last_engine().is_some_and(|e| e.is_gpu()), "{:?}", c.last_engine());
        for _ in 0..3 {
            assert_matches_reference(&Op::matmul(m, k, n), &[&a, &b], &s.matmul_pooled(&a, &b, m, k, n).unwrap());
        }
        assert!(s.pool_stats().hits >= 2, "{:?}", s.pool_stats());
        let pending = s.matmul_async(&a, &b, m, k, n).unwrap();
        assert_matches_reference(&Op::matmul(m, k, n), &[&a, &b], &pending.wait().unwrap());
        let outs = s.matmul_batch(&[(a.clone(), b.clone(), m, k, n), (b.clone(), a.clone(), n, k, m)]).unwrap();
        assert_matches_reference(&Op::matmul(m, k, n), &[&a, &b], &outs[0]);
        assert_matches_reference(&Op::matmul(n, k, m), &[&b, &a], &outs[1]);

        // Executor: merged adds dispatched to the GPU.
        let exec = BatchedExecutor::new(c.clone(), BatchConfig::latency()).unwrap();
        let h = exec.handle();
        let xs: Vec<(Vec<f32>, Vec<f32>)> = (0..10).map(|i| (data(10 + i, 100), data(40 + i, 100))).collect();
        let rs: Vec<_> = xs
            .iter()
            .map(|(x, y)| h.submit(Op::binary(BinaryOp::Add, 100), vec![x.clone(), y.clone()]).unwrap())
            .collect();
        for ((x, y), r) in xs.iter().zip(rs) {
            assert_matches_reference(&Op::binary(BinaryOp::Add, 100), &[x, y], &r.wait().unwrap());
        }
        let metrics = exec.shutdown();
        assert_eq!(metrics.completed, 10);
        assert!(c.choose(&Op::binary(BinaryOp::Add, 1000), Placement::Host).is_gpu());
    }
}

/// The browser's entry points on native: `auto_async`/`discover_async`, the
/// `*_async` ops, `execute_async`/`read_async` and `download_async_into` run on
/// the GPU and give what the blocking forms give.
#[test]
fn async_forms_run_on_the_gpu_like_the_blocking_ones() {
    use compute_core::async_ops::block_on;
    use compute_core::{AsyncOps, Backend, DType, HostVec};
    for (engine, _) in gpus() {
        let c = block_on(Compute::builder().discover_async()).profile(gpu_always_wins(engine)).build().unwrap();
        assert!(c.engines().contains(&engine));
        let (m, k, n) = (24, 40, 32);
        let (a, b) = (data(3, m * k), data(4, k * n));
        let mut out = vec![f32::NAN; m * n];
        block_on(c.matmul_async(&a, &b, &mut out, m, k, n)).unwrap();
        assert!(c.last_engine().is_some_and(Engine::is_gpu), "matmul_async ran on {:?}", c.last_engine());
        assert_matches_reference(&Op::matmul(m, k, n), &[&a, &b], &out);
        let mut batch = c.batch();
        let (ba, bb) = (batch.upload(&a), batch.upload(&b));
        let mm = batch.matmul(ba, bb, m, k, n).unwrap();
        let sm = batch.softmax(mm, m, n).unwrap();
        let ran = block_on(batch.execute_async()).unwrap();
        assert!(ran.is_gpu(), "execute_async for {engine} ran on {ran}");
        let (mm_async, sm_async) = (block_on(batch.read_async(mm)).unwrap(), block_on(batch.read_async(sm)).unwrap());
        assert_eq!(mm_async, batch.read(mm).unwrap());
        assert_eq!(sm_async, batch.read(sm).unwrap());
        assert_matches_reference(&Op::rows(RowOp::Softmax, m, n), &[&mm_async], &sm_async);
        let t = c.upload(&a).unwrap();
        let mut back = HostVec::zeros(DType::F32, a.len());
        block_on(c.download_async_into(&t, back.as_mut())).unwrap();
        assert_eq!(back.to_f32(), a);
    }
}

/// The tiny Llama decoder on each GPU engine against its float64 reference:
/// a prompt and eight decoding steps, each step's logits within the dtype's
/// rounding, and on an engine that records (CUDA graphs) the replayed steps
/// bit for bit equal to the same steps queued op by op.
#[test]
fn the_decoder_matches_its_reference_and_replays_its_steps() {
    use compute_core::DType;
    use dispatch::llama::{HostWeights, Llama, LlamaConfig, WeightFormat, reference_logits};
    // Dense weights, and Q4_K linear layers (rows of 256 values: their norms
    // and gated halves fused into the products).
    let wide = LlamaConfig { hidden: 256, heads: 4, kv_heads: 2, intermediate: 512, ..LlamaConfig::tiny() };
    let cases = [
        (LlamaConfig::tiny(), WeightFormat::dense(DType::F32), 1e-4),
        (LlamaConfig::tiny(), WeightFormat::dense(DType::BF16), 3e-2),
        (wide, WeightFormat { dtype: DType::BF16, linear: DType::Q4K }, 3e-2),
    ];
    for (engine, c) in gpus() {
        let backend = c.backend(engine).unwrap();
        for (cfg, format, tol) in cases {
            let (weights, dtype) = (HostWeights::random(cfg, 3), format.dtype);
            let stored = weights.as_stored(format);
            let mut recorded = Llama::load(backend.clone(), &weights, format).unwrap();
            let mut direct = Llama::load(backend.clone(), &weights, format).unwrap();
            direct.set_recording(false);
            let mut tokens = vec![3u32, 1, 4, 1, 5, 9, 2];
            let mut feed = tokens.clone();
            for step in 0..9 {
                let (got, plain) = (recorded.logits(&feed).unwrap(), direct.logits(&feed).unwrap());
                let want = reference_logits(&stored, &tokens);
                let top = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
                let err = got.iter().zip(&want).map(|(&g, w)| (f64::from(g) - w).abs()).fold(0.0, f64::max) / top;
                assert!(err <= tol, "{engine} {dtype} step {step}: error {err:.2e} of the largest logit");
                assert!(
                    got.iter().zip(&plain).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{engine} {dtype} step {step}: a replayed step differs from the direct one"
                );
                let next = want.iter().enumerate().fold(0, |b, (i, v)| if *v > want[b] { i } else { b }) as u32;
                tokens.push(next);
                feed = vec![next];
            }
            // Three sequences decoded together against each decoded alone.
            if recorded.set_sequences(3).is_ok() {
                let mut feed = [3u32, 1, 4];
                let mut alone: Vec<Llama> =
                    (0..3).map(|_| Llama::load(backend.clone(), &weights, format).unwrap()).collect();
                for step in 0..5 {
                    let got = recorded.logits_all(&feed).unwrap();
                    for (i, model) in alone.iter_mut().enumerate() {
                        let want = model.logits(&[feed[i]]).unwrap();
                        let row = &got[i * cfg.vocab..(i + 1) * cfg.vocab];
                        let top = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                        let err = row.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max) / top;
                        assert!(err <= tol as f32, "{engine} {dtype} together, step {step} sequence {i}: {err:.2e}");
                        feed[i] = (feed[i] * 7 + 3 + step) % cfg.vocab as u32;
                    }
                }
            }
        }
    }
}

/// Sequences that join mid-way (their prompts prefilled together, beside a
/// running one) and leave, on each GPU engine: every step's logits of each
/// sequence against the same sequence decoded alone on that engine, the
/// one-token step recorded once (a CUDA graph) and replayed whichever slots
/// are held.
#[test]
fn sequences_join_and_leave_on_the_gpu() {
    use std::collections::HashMap;

    use dispatch::llama::{HostWeights, Llama, LlamaConfig, SeqId, WeightFormat};
    let cfg = LlamaConfig::tiny();
    let weights = HostWeights::random(cfg, 21);
    for (engine, c) in gpus() {
        let backend = c.backend(engine).unwrap();
        for (dtype, tol) in [(compute_core::DType::F32, 1e-4f32), (compute_core::DType::BF16, 3e-2)] {
            let format = WeightFormat::dense(dtype);
            let mut model = Llama::load(backend.clone(), &weights, format).unwrap();
            if model.set_slots(3).is_err() {
                eprintln!("SKIPPED: {engine} takes no device positions: one sequence at a time");
                continue;
            }
            // Each sequence alone, and the token its next step feeds.
            let mut alone: HashMap<SeqId, (Llama, u32)> = HashMap::new();
            let check = |model: &Llama, alone: &mut HashMap<SeqId, (Llama, u32)>, fed: &HashMap<SeqId, Vec<u32>>| {
                for (id, got) in model.last_logits().unwrap() {
                    let (one, _) = alone.get_mut(&id).unwrap();
                    let want = one.logits(&fed[&id]).unwrap();
                    let top = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                    let err = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max) / top;
                    assert!(err <= tol, "{engine} {dtype} {id:?}: {err:.2e} of the largest logit");
                }
            };
            let add = |model: &mut Llama, alone: &mut HashMap<SeqId, (Llama, u32)>, prompts: &[&[u32]]| {
                let added = model.add_sequences(prompts).unwrap();
                let mut fed = HashMap::new();
                for (&(id, next), p) in added.iter().zip(prompts) {
                    alone.insert(id, (Llama::load(backend.clone(), &weights, format).unwrap(), next));
                    fed.insert(id, p.to_vec());
                }
                fed
            };
            let step = |model: &mut Llama, alone: &mut HashMap<SeqId, (Llama, u32)>| {
                let fed: HashMap<SeqId, Vec<u32>> =
                    model.active_sequences().into_iter().map(|id| (id, vec![alone[&id].1])).collect();
                let chosen = model.step_active().unwrap();
                (fed, chosen)
            };
            let fed = add(&mut model, &mut alone, &[&[3, 1, 4, 1, 5]]);
            check(&model, &mut alone, &fed);
            for round in 0..4 {
                for _ in 0..2 {
                    let (fed, chosen) = step(&mut model, &mut alone);
                    check(&model, &mut alone, &fed);
                    for (id, next) in chosen {
                        alone.get_mut(&id).unwrap().1 = next;
                    }
                }
                match round {
                    0 => {
                        let fed = add(&mut model, &mut alone, &[&[9, 2, 6], &[5, 3, 5, 8, 9, 7, 9]]);
                        check(&model, &mut alone, &fed);
                    }
                    1 => model.remove_sequence(model.active_sequences()[1]).unwrap(),
                    2 => {
                        let fed = add(&mut model, &mut alone, &[&[2, 7, 1, 8]]);
                        check(&model, &mut alone, &fed);
                    }
                    _ => {}
                }
            }
            assert_eq!(model.active_sequences().len(), 3, "{engine} {dtype}");
        }
    }
}
