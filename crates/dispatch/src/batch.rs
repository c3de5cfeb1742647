//! [`CommandBatch`]: record uploads and a chain of ops, run them all with one
//! `execute()` on the engine predicted fastest for the whole chain, then read
//! results. Intermediates never leave the device.

use compute_core::{BinaryOp, ComputeError, Cost, GeluForm, Op, Result, RowOp, Tensor, UnaryOp};

use crate::compute::{Compute, worth_falling_back};
use crate::engine::{Engine, Placement};
use crate::pool::PooledTensor;

/// A buffer of a [`CommandBatch`]: an upload or the output of an op.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BufferId(usize);

#[derive(Debug)]
enum Source {
    Upload(Vec<f32>),
    Output,
}

#[derive(Debug)]
struct Step {
    op: Op,
    inputs: Vec<usize>,
    output: usize,
}

enum Held {
    Plain(Tensor),
    Pooled(PooledTensor),
}

impl Held {
    fn tensor(&self) -> &Tensor {
        match self {
            Held::Plain(t) => t,
            Held::Pooled(p) => p,
        }
    }
}

enum Store {
    /// Tensors of any backend, filled through `run_tensors`.
    Tensors(Vec<Held>),
    /// wgpu's own batch (one queue submission), with each buffer's id in it.
    #[cfg(any(feature = "gpu", feature = "gpu-wasm"))]
    Wgpu(std::sync::Mutex<compute_wgpu::GpuCommandBatch>, Vec<Option<compute_wgpu::BufferId>>),
}

struct Executed {
    engine: Engine,
    store: Store,
}

/// A recorded chain of ops. Recording costs nothing on the device; shapes are
/// checked as each op is added.
///
/// ```
/// # use dispatch::Compute;
/// let compute = Compute::builder().cpu().nominal_profile().build()?;
/// let mut batch = compute.batch();
/// let x = batch.upload(&[1.0, -2.0, 3.0, -4.0]);
/// let r = batch.relu(x)?;
/// let y = batch.scale(r, 2.0)?;
/// batch.execute()?;
/// assert_eq!(batch.read(y)?, [2.0, 0.0, 6.0, 0.0]);
/// # Ok::<(), compute_core::ComputeError>(())
/// ```
pub struct CommandBatch {
    compute: Compute,
    buffers: Vec<(usize, Source)>,
    steps: Vec<Step>,
    done: Option<Executed>,
}

impl CommandBatch {
    /// An empty batch on `compute`.
    pub fn new(compute: &Compute) -> CommandBatch {
        CommandBatch { compute: compute.clone(), buffers: Vec::new(), steps: Vec::new(), done: None }
    }

    /// Records an upload of `data` (copied now, sent at `execute`).
    pub fn upload(&mut self, data: &[f32]) -> BufferId {
        self.done = None;
        self.buffers.push((data.len(), Source::Upload(data.to_vec())));
        BufferId(self.buffers.len() - 1)
    }

    /// Records `op` on `inputs` (in the op's order); checks their lengths now.
    pub fn op(&mut self, op: Op, inputs: &[BufferId]) -> Result<BufferId> {
        let lens = inputs
            .iter()
            .map(|id| self.buffers.get(id.0).map(|b| b.0))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| ComputeError::shape(op.name(), "unknown buffer id in this batch", op.shapes()))?;
        let layout = op.check(&lens, op.layout()?.output_len())?;
        self.done = None;
        self.buffers.push((layout.output_len(), Source::Output));
        let output = self.buffers.len() - 1;
        self.steps.push(Step { op, inputs: inputs.iter().map(|b| b.0).collect(), output });
        Ok(BufferId(output))
    }

    fn len_of(&self, id: BufferId) -> Result<usize> {
        self.buffers
            .get(id.0)
            .map(|b| b.0)
            .ok_or_else(|| ComputeError::shape("batch", "unknown buffer id", format!("id={}", id.0)))
    }

    /// Records a unary element-wise op on `x`.
    pub fn unary(&mut self, op: UnaryOp, x: BufferId) -> Result<BufferId> {
        let n = self.len_of(x)?;
        self.op(Op::unary(op, n), &[x])
    }

    /// Records `max(x, 0)`.
    pub fn relu(&mut self, x: BufferId) -> Result<BufferId> {
        self.unary(UnaryOp::Relu, x)
    }

    /// Records `s·x`.
    pub fn scale(&mut self, x: BufferId, s: f32) -> Result<BufferId> {
        self.unary(UnaryOp::Scale { s }, x)
    }

    /// Records GELU (tanh form).
    pub fn gelu(&mut self, x: BufferId) -> Result<BufferId> {
        self.unary(UnaryOp::Gelu(GeluForm::Tanh), x)
    }

    /// Records `a + b`.
    pub fn add(&mut self, a: BufferId, b: BufferId) -> Result<BufferId> {
        let n = self.len_of(a)?;
        self.op(Op::binary(BinaryOp::Add, n), &[a, b])
    }

    /// Records `a · b` element-wise.
    pub fn mul(&mut self, a: BufferId, b: BufferId) -> Result<BufferId> {
        let n = self.len_of(a)?;
        self.op(Op::binary(BinaryOp::Mul, n), &[a, b])
    }

    /// Records `A·B` (`m × k` by `k × n`).
    pub fn matmul(&mut self, a: BufferId, b: BufferId, m: usize, k: usize, n: usize) -> Result<BufferId> {
        self.op(Op::matmul(m, k, n), &[a, b])
    }

    /// Records a row-wise softmax of a `rows × cols` matrix.
    pub fn softmax(&mut self, x: BufferId, rows: usize, cols: usize) -> Result<BufferId> {
        self.op(Op::rows(RowOp::Softmax, rows, cols), &[x])
    }

    /// Predicted seconds of the whole batch on `engine`: every op on resident
    /// data, plus one upload of all uploads and one download of the final
    /// outputs (those no later op consumes). `None` if unprofiled.
    pub fn predict(&self, engine: Engine) -> Option<f64> {
        let model = self.compute.model();
        let mut total = 0.0;
        for s in &self.steps {
            total += model.predict(engine, &s.op, Placement::Resident)?;
        }
        let up: u64 = self.buffers.iter().filter(|b| matches!(b.1, Source::Upload(_))).map(|b| b.0 as u64 * 4).sum();
        let down: u64 = self
            .steps
            .iter()
            .filter(|s| !self.steps.iter().any(|t| t.inputs.contains(&s.output)))
            .map(|s| self.buffers.get(s.output).map_or(0, |b| b.0 as u64 * 4))
            .sum();
        let io = Cost { flops: 0, bytes_read: up, bytes_written: down };
        Some(total + model.transfer_seconds(engine, &io, Placement::Host))
    }

    /// The engine the batch runs on: smallest [`CommandBatch::predict`] under
    /// [`crate::Policy::Auto`], otherwise the policy's choice for the heaviest op.
    pub fn choose(&self) -> Engine {
        let engines = self.compute.engines();
        if self.compute.policy() == crate::Policy::Auto {
            let mut best: Option<(Engine, f64)> = None;
            for e in engines {
                let supported = self.compute.backend(e).is_some_and(|b| self.steps.iter().all(|s| b.supports(&s.op)));
                if let Some(t) = self.predict(e).filter(|_| supported)
                    && best.is_none_or(|(_, b)| t < b)
                {
                    best = Some((e, t));
                }
            }
            if let Some((e, _)) = best {
                return e;
            }
        }
        let heaviest = self.steps.iter().max_by_key(|s| s.op.cost().flops.max(s.op.cost().bytes()));
        heaviest.map_or_else(|| self.compute.primary(), |s| self.compute.choose(&s.op, Placement::Host))
    }

    /// Records the whole chain into wgpu's own batch: one command encoder, one submission.
    #[cfg(any(feature = "gpu", feature = "gpu-wasm"))]
    fn run_on_wgpu(&self, w: &compute_wgpu::WgpuBackend) -> Result<Executed> {
        let mut gb = w.batch();
        let mut ids: Vec<Option<compute_wgpu::BufferId>> = Vec::with_capacity(self.buffers.len());
        for (_, src) in &self.buffers {
            ids.push(match src {
                Source::Upload(data) => Some(gb.upload(data)?),
                Source::Output => None,
            });
        }
        for s in &self.steps {
            let ins = s
                .inputs
                .iter()
                .map(|&i| ids.get(i).copied().flatten())
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| ComputeError::shape(s.op.name(), "batch input out of range", s.op.shapes()))?;
            let out = gb.op(&s.op, &ins)?;
            if let Some(slot) = ids.get_mut(s.output) {
                *slot = Some(out);
            }
        }
        gb.execute()?;
        Ok(Executed { engine: Engine::Wgpu, store: Store::Wgpu(std::sync::Mutex::new(gb), ids) })
    }

    fn run_on(&self, engine: Engine) -> Result<Executed> {
        #[cfg(any(feature = "gpu", feature = "gpu-wasm"))]
        if engine == Engine::Wgpu
            && let Some(w) = self.compute.native_wgpu()
        {
            return self.run_on_wgpu(w);
        }
        let slot = self.compute.slot(engine).ok_or_else(|| ComputeError::DeviceUnavailable {
            backend: engine.kind(),
            reason: format!("engine `{engine}` is not part of this Compute"),
        })?;
        let mut tensors = Vec::with_capacity(self.buffers.len());
        for (len, src) in &self.buffers {
            tensors.push(match src {
                Source::Upload(data) => Held::Plain(slot.backend.upload(data)?),
                Source::Output => Held::Pooled(slot.pool.acquire(*len)?),
            });
        }
        for s in &self.steps {
            let ins = s
                .inputs
                .iter()
                .map(|&i| tensors.get(i).map(Held::tensor))
                .collect::<Option<Vec<&Tensor>>>()
                .ok_or_else(|| ComputeError::shape(s.op.name(), "batch input out of range", s.op.shapes()))?;
            let out = tensors
                .get(s.output)
                .map(Held::tensor)
                .ok_or_else(|| ComputeError::shape(s.op.name(), "batch output out of range", s.op.shapes()))?;
            slot.backend.run_tensors(&s.op, &ins, out)?;
        }
        slot.backend.synchronize()?;
        Ok(Executed { engine, store: Store::Tensors(tensors) })
    }

    /// Runs every recorded op in order on the chosen engine, with one
    /// synchronisation at the end; falls back to the CPU if a GPU fails.
    /// Returns the engine used. On a discovered wgpu device the chain is
    /// recorded into `compute_wgpu::GpuCommandBatch` (one queue submission);
    /// elsewhere each op is queued with `run_tensors` (which does not wait on
    /// the GPU backends) and outputs come from the engine's buffer pool.
    /// Native only (absent on wasm32: use [`execute_async`](Self::execute_async)).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn execute(&mut self) -> Result<Engine> {
        self.done = None;
        let executed = self.run_with_fallback(self.choose())?;
        let engine = executed.engine;
        self.done = Some(executed);
        Ok(engine)
    }

    /// `execute` without blocking: the browser's way. On a
    /// discovered wgpu device the chain goes out in one submission at the
    /// first poll and the future resolves once the device has finished it
    /// (nothing waits; a device failure, reported then, reruns the chain on
    /// the CPU). Elsewhere the chain runs at the first poll, as `execute`.
    /// In the browser a chain the model gives to a GPU without a discovered
    /// handle (one given to the builder) runs on the CPU.
    pub async fn execute_async(&mut self) -> Result<Engine> {
        self.done = None;
        let engine = self.choose();
        #[cfg(any(feature = "gpu", feature = "gpu-wasm"))]
        if engine == Engine::Wgpu
            && let Some(w) = self.compute.native_wgpu().cloned()
        {
            let attempt = match self.run_on_wgpu(&w) {
                Ok(executed) => w.submitted_work_done().await.map(|()| executed),
                Err(e) => Err(e),
            };
            let executed = match attempt {
                Err(e) if worth_falling_back(&e) && self.compute.slot(Engine::Simd).is_some() => {
                    self.run_on(Engine::Simd)?
                }
                r => r?,
            };
            let engine = executed.engine;
            self.done = Some(executed);
            return Ok(engine);
        }
        let engine = if crate::runtime::sync_available() || !engine.is_gpu() { engine } else { Engine::Simd };
        let executed = self.run_with_fallback(engine)?;
        let engine = executed.engine;
        self.done = Some(executed);
        Ok(engine)
    }

    /// Runs the chain on `engine`, and on the CPU if a GPU fails for a reason
    /// other than the calls themselves.
    fn run_with_fallback(&self, engine: Engine) -> Result<Executed> {
        let cpu = Engine::Simd;
        match self.run_on(engine) {
            Err(e) if worth_falling_back(&e) && engine.is_gpu() && self.compute.slot(cpu).is_some() => self.run_on(cpu),
            r => r,
        }
    }

    /// The engine of the last `execute`, if it succeeded.
    pub fn engine(&self) -> Option<Engine> {
        self.done.as_ref().map(|d| d.engine)
    }

    /// Downloads buffer `id` after `execute`. Native only (absent on wasm32:
    /// use [`read_async`](Self::read_async)).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read(&self, id: BufferId) -> Result<Vec<f32>> {
        let done = self.executed()?;
        match &done.store {
            Store::Tensors(ts) => self.download(done.engine, ts, id),
            #[cfg(any(feature = "gpu", feature = "gpu-wasm"))]
            Store::Wgpu(gb, ids) => crate::lock::lock(gb).read(wgpu_id(ids, id)?),
        }
    }

    /// Downloads buffer `id` after `execute` or `execute_async`, without
    /// blocking: the browser's way. From a wgpu chain the copy is submitted at
    /// the first poll and the future resolves when the values are on the
    /// host; elsewhere it is ready at once. Costs one download of the buffer.
    pub async fn read_async(&self, id: BufferId) -> Result<Vec<f32>> {
        let done = self.executed()?;
        match &done.store {
            Store::Tensors(ts) => self.download(done.engine, ts, id),
            #[cfg(any(feature = "gpu", feature = "gpu-wasm"))]
            Store::Wgpu(gb, ids) => {
                let read = crate::lock::lock(gb).read_async(wgpu_id(ids, id)?);
                read.await
            }
        }
    }

    /// The last successful execution, or a shape error naming why there is none.
    fn executed(&self) -> Result<&Executed> {
        self.done
            .as_ref()
            .ok_or_else(|| ComputeError::shape("batch_read", "execute() has not run since the last change", ""))
    }

    /// Copies tensor `id` of a chain that ran through `run_tensors` on `engine`.
    fn download(&self, engine: Engine, tensors: &[Held], id: BufferId) -> Result<Vec<f32>> {
        let t = tensors.get(id.0).map(Held::tensor).ok_or_else(|| unknown(id))?;
        let backend = self.compute.backend(engine).ok_or_else(|| ComputeError::DeviceUnavailable {
            backend: engine.kind(),
            reason: "engine vanished".into(),
        })?;
        let mut out = vec![0.0f32; t.len()];
        backend.download(t, &mut out)?;
        Ok(out)
    }
}

fn unknown(id: BufferId) -> ComputeError {
    ComputeError::shape("batch_read", "unknown buffer id", format!("id={}", id.0))
}

/// The id in wgpu's batch of buffer `id`.
#[cfg(any(feature = "gpu", feature = "gpu-wasm"))]
fn wgpu_id(ids: &[Option<compute_wgpu::BufferId>], id: BufferId) -> Result<compute_wgpu::BufferId> {
    ids.get(id.0).copied().flatten().ok_or_else(|| unknown(id))
}
