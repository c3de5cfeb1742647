//! A Llama-architecture decoder run entirely through the library's ops, with
//! its weights and KV cache resident on one engine: the proof that the
//! vocabulary serves a real model.
//!
//! Per layer, for the `seq` tokens of a step at positions `pos..pos + seq`:
//!
//! ```text
//! h = rms_norm(x) · attn_norm
//! q, k, v = h·Wqᵀ, h·Wkᵀ, h·Wvᵀ            [seq, heads·d], [seq, kv_heads·d] ×2
//! q, k = rope(q), rope(k)                   (θ, half-split or interleaved pairs)
//! k_cache[:, pos..pos+seq], v_cache[…] = k, v   (token-major → head-major copies)
//! o = attention(q, k_cache, v_cache)        causal (end-aligned), grouped-query heads
//! x = x + o·Woᵀ
//! h = rms_norm(x) · ffn_norm
//! x = x + swiglu(h·Wgateᵀ, h·Wupᵀ)·Wdownᵀ
//! ```
//!
//! then `logits = rms_norm(x_last) · final_norm · W_lmᵀ` and the next token is
//! their argmax. Every step is one of the vocabulary's ops: [`Op::Gather`]
//! (embedding), [`Op::Rows`] (RMSNorm), [`Op::Matmul`] with `Bᵀ` (a dense
//! linear layer in `nn.Linear`'s `[out, in]` layout) or [`Op::QuantMatmul`]
//! (a GGUF block-quantized one), [`Op::Rope`] (for one sequence's step the
//! keys straight into the cache, [`RopeSpec::into_cache`]), [`Op::Copy`] (cache appends,
//! the query and output transposes of a multi-token step, the last row of a
//! prompt), [`Op::Attention`] against a cache of fixed capacity,
//! [`Op::Binary`] ([`BinaryOp::SwiGlu`], and residual adds where a product
//! cannot add them itself) and [`Op::ArgMax`]. The output and down
//! projections add the residual in the product's epilogue (`C = x·Wᵀ +
//! 1·residual`, [`compute_core::Epilogue`]), float and quantized weights
//! alike, one op instead of two.
//!
//! Layout choices: weights are stored as `[out, in]` (no transposed copies);
//! q, k and v are one product over their stacked weights where they share a
//! dtype and the backend turns heads out of its rows
//! ([`RopeSpec::from_heads`]; three products otherwise), and so are gate and
//! up, followed by [`Op::Glu`] (two products and a swiglu otherwise); the KV
//! cache is head-major `[sequences, kv_heads, capacity, head_dim]` per layer,
//! what the attention op reads; activations are token-major `[rows, hidden]`
//! (a step's tokens, one token of each sequence decoded together, or the
//! stacked prompts of sequences prefilled together).
//!
//! Several sequences live in slots of the KV cache ([`Llama::set_slots`]):
//! they join with their prompts prefilled ([`Llama::add_sequences`], several
//! in one pass), decode together ([`Llama::step_active`]: one row per slot,
//! idle slots skipped) and leave ([`Llama::remove_sequence`]) independently.
//! [`BatchedDecoder`] does that for callers on many threads: each submits a
//! prompt and reads its tokens, and one worker batches them continuously.
//!
//! Where the backend takes positions from a tensor (the `with_positions`
//! forms of rope, copy and attention), a step's positions and token ids live
//! in two small tensors written before it, its calls are the same at every
//! position, and one-token steps are recorded once ([`Backend::record`]: a
//! CUDA graph) and replayed ([`Llama::set_recording`]).
//!
//! [`reference_logits`] computes the same forward pass in float64 on the
//! host, for the tests and the example's check.

mod error;
mod gguf;
mod hf;
mod mapped;
mod prefill;
mod reference;
mod rope_freqs;
mod sequences;
mod serve;
mod weights;

use std::collections::HashMap;
use std::sync::Arc;

use compute_core::{
    AttentionSpec, Backend, BinaryOp, ComputeError, CopySpec, DType, HostSlice, MatmulSpec, Op, QuantMatmulSpec,
    Result, RopeLayout, RopeScaling, RopeSpec, RowOp, Strided, Tensor,
};

pub use error::LoadError;
pub use hf::hf_name;
pub use reference::reference_logits;
pub use serve::{BatchedDecoder, DecoderConfig, DecoderHandle, DecoderMetrics, GenerateRequest, Generated, Generation};

/// The order in which [`Llama`] takes a model's tensors, by their llama.cpp
/// (GGUF) names: the embedding table, the final norm, the LM head, then per
/// layer `i` the two norms and the seven projections.
pub const TENSOR_ORDER: [&str; 3] = ["token_embd.weight", "output_norm.weight", "output.weight"];

/// The per-layer tensors, in order, as `blk.{i}.{name}.weight`.
pub const LAYER_TENSORS: [&str; 9] =
    ["attn_norm", "ffn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"];
pub use weights::{HostLayer, HostWeights};

/// The shape of a Llama-architecture model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LlamaConfig {
    /// Width of the residual stream.
    pub hidden: usize,
    /// Decoder layers.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (divides `heads`).
    pub kv_heads: usize,
    /// Width of the SwiGLU feed-forward block.
    pub intermediate: usize,
    /// Tokens in the vocabulary.
    pub vocab: usize,
    /// Base of the rotary frequencies.
    pub rope_theta: f32,
    /// Which values the rotary embedding pairs (the weights' convention).
    pub rope_layout: RopeLayout,
    /// Llama 3's rotary frequency scaling (Llama 3.1 and 3.2 checkpoints);
    /// `None`: plain frequencies.
    pub rope_scaling: Option<RopeScaling>,
    /// Added to the mean square in every RMSNorm.
    pub rms_eps: f32,
    /// Most tokens a sequence may hold (the KV cache's capacity).
    pub max_seq: usize,
}

impl LlamaConfig {
    /// A model of a few hundred thousand parameters, for tests: hidden 64, 2
    /// layers, 4 query and 2 key/value heads of 16, feed-forward 128,
    /// vocabulary 97, up to 64 tokens.
    pub fn tiny() -> Self {
        LlamaConfig {
            hidden: 64,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            intermediate: 128,
            vocab: 97,
            rope_theta: 10_000.0,
            rope_layout: RopeLayout::HalfSplit,
            rope_scaling: None,
            rms_eps: 1e-5,
            max_seq: 64,
        }
    }

    /// The benchmark size, about 1.1 B parameters: hidden 2048, 16 layers, 32
    /// query and 8 key/value heads of 64, feed-forward 8192, vocabulary
    /// 32000, θ 10000, up to 1024 tokens.
    pub fn llama_1b() -> Self {
        LlamaConfig {
            hidden: 2048,
            layers: 16,
            heads: 32,
            kv_heads: 8,
            intermediate: 8192,
            vocab: 32_000,
            rope_theta: 10_000.0,
            rope_layout: RopeLayout::HalfSplit,
            rope_scaling: None,
            rms_eps: 1e-5,
            max_seq: 1024,
        }
    }

    /// The rotary embedding of `seq` tokens of `heads` heads in this
    /// model's convention (θ, pair layout, scaling), in `dtype`. Free.
    pub fn rope(&self, seq: usize, heads: usize, dtype: DType) -> RopeSpec {
        let r = RopeSpec::new(seq, heads, self.head_dim(), self.rope_theta).with_layout(self.rope_layout);
        let r = r.with_dtype(dtype);
        match self.rope_scaling {
            Some(s) => r.with_scaling(s),
            None => r,
        }
    }

    /// Values per head.
    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads.max(1)
    }

    /// Parameters (embedding and LM head counted apart).
    pub fn parameters(&self) -> usize {
        let d = self.head_dim();
        let attn = self.hidden * (self.heads * d) * 2 + self.hidden * (self.kv_heads * d) * 2;
        let ffn = 3 * self.hidden * self.intermediate;
        self.layers * (attn + ffn + 2 * self.hidden) + 2 * self.vocab * self.hidden + self.hidden
    }

    fn check(&self) -> Result<()> {
        let bad = |why: &str| Err(ComputeError::shape("llama", why.to_string(), format!("{self:?}")));
        if self.heads == 0 || self.kv_heads == 0 || !self.heads.is_multiple_of(self.kv_heads) {
            return bad("kv_heads must divide heads");
        }
        if !self.hidden.is_multiple_of(self.heads) || !self.head_dim().is_multiple_of(2) {
            return bad("hidden must be heads × an even head size");
        }
        if self.layers == 0 || self.vocab == 0 || self.intermediate == 0 || self.max_seq == 0 {
            return bad("every size must be positive");
        }
        if self.rope_scaling.is_some_and(|r| !r.is_valid()) {
            return bad("the rotary scaling needs factor >= 1, 0 <= low < high frequency factors and a context");
        }
        Ok(())
    }
}

/// How the weights are stored on the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WeightFormat {
    /// Dtype of the activations, the norms' weights, the embedding table and
    /// the KV cache (`f32`, `f16` or `bf16`).
    pub dtype: DType,
    /// Dtype of the linear layers' weights: `dtype`, or a block-quantized
    /// dtype (`Q4_K`…) whose products run as [`Op::QuantMatmul`].
    pub linear: DType,
}

impl WeightFormat {
    /// Everything in `dtype`.
    pub fn dense(dtype: DType) -> Self {
        WeightFormat { dtype, linear: dtype }
    }
}

/// Each `(values, dtype)` as stored in `dtype` (rounded, or quantized as
/// ggml's reference quantizer does), converted on every core.
fn convert_all(sources: &[(&[f32], DType)]) -> Vec<compute_core::HostVec> {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let next = AtomicUsize::new(0);
    let out: Vec<Mutex<Option<compute_core::HostVec>>> = sources.iter().map(|_| Mutex::new(None)).collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(sources.len().max(1));
    if threads <= 1 {
        // No threads to spawn (one core, or a target without threads such as wasm32).
        return sources.iter().map(|&(values, dtype)| compute_core::HostVec::from_f32(dtype, values)).collect();
    }
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&(values, dtype)) = sources.get(i) else { break };
                    let v = compute_core::HostVec::from_f32(dtype, values);
                    if let Some(slot) = out.get(i)
                        && let Ok(mut slot) = slot.lock()
                    {
                        *slot = Some(v);
                    }
                }
            });
        }
    });
    out.into_iter().filter_map(|m| m.into_inner().ok().flatten()).collect()
}

/// A linear layer's weight, `[out, in]`.
struct Linear {
    w: Tensor,
    out: usize,
    inp: usize,
}

impl Linear {
    /// `y = x·Wᵀ` for `m` rows of `x`.
    fn op(&self, m: usize, dtype: DType) -> Op {
        if self.w.dtype().is_quantized() {
            Op::QuantMatmul(QuantMatmulSpec::new(m, self.inp, self.out, self.w.dtype()).with_dtypes(dtype, dtype))
        } else {
            let spec = MatmulSpec { trans_b: true, ..MatmulSpec::new(m, self.inp, self.out) };
            Op::Matmul(spec.with_dtypes(dtype, dtype))
        }
    }

    /// `rms_norm(x)·g·Wᵀ` as one quantized product with the norm fused
    /// (and with `glu` the gated halves: `silu(gate)·up`, `out / 2`
    /// columns), where the weight is block-quantized and `b` takes it;
    /// `None` otherwise (the caller runs the norm, the product and the
    /// `Glu` apart). Inputs `x`, `W`, `g`.
    fn normed(&self, b: &dyn Backend, (m, dtype): (usize, DType), eps: f32, glu: bool) -> Option<Op> {
        let Op::QuantMatmul(spec) = self.op(m, dtype) else { return None };
        let spec = spec.with_rms_norm(eps);
        let op = Op::QuantMatmul(if glu { spec.with_glu() } else { spec });
        b.supports(&op).then_some(op)
    }

    /// `into = residual + x·Wᵀ` for `m` rows of `x`: one product whose
    /// epilogue adds the residual (`beta = 1`, computed in `f32` and rounded
    /// once) where the backend takes it, float or quantized weights alike,
    /// else the product into `scratch` and an add.
    fn add_into(
        &self,
        b: &dyn Backend,
        (m, dtype): (usize, DType),
        (x, residual): (&Tensor, &Tensor),
        (scratch, into): (&Tensor, &Tensor),
    ) -> Result<()> {
        let op = self.op(m, dtype);
        let fused = match op {
            Op::Matmul(spec) => Some(Op::Matmul(spec.with_scales(1.0, 1.0))),
            Op::QuantMatmul(spec) => Some(Op::QuantMatmul(spec.with_scales(1.0, 1.0))),
            _ => None,
        };
        if let Some(fused) = fused.filter(|f| b.supports(f)) {
            return b.run_tensors(&fused, &[x, &self.w, residual], into);
        }
        b.run_tensors(&op, &[x, &self.w], scratch)?;
        let add = Op::binary(BinaryOp::Add, m * self.out).with_dtype(dtype);
        b.run_tensors(&add, &[residual, scratch], into)
    }
}

/// The query, key and value projections of a layer.
enum Qkv {
    /// Three products.
    Separate { wq: Linear, wk: Linear, wv: Linear },
    /// One product over the three weights stacked (`[q; k; v]` rows), whose
    /// output rows hold `heads + 2·kv_heads` heads a token: where the three
    /// share a dtype and the backend turns heads out of such rows.
    Fused(Linear),
}

impl Qkv {
    fn weights(&self) -> Vec<&Tensor> {
        match self {
            Qkv::Separate { wq, wk, wv } => vec![&wq.w, &wk.w, &wv.w],
            Qkv::Fused(w) => vec![&w.w],
        }
    }
}

/// The gate and up projections of a layer's feed-forward block.
enum GateUp {
    /// Two products, then the swiglu of the two outputs.
    Separate { gate: Linear, up: Linear },
    /// One product over the stacked `[W_gate; W_up]` rows, then
    /// [`Op::Glu`] of each output row's halves: where the two share a dtype
    /// and the backend runs `Glu`.
    Fused(Linear),
}

impl GateUp {
    fn weights(&self) -> Vec<&Tensor> {
        match self {
            GateUp::Separate { gate, up } => vec![&gate.w, &up.w],
            GateUp::Fused(w) => vec![&w.w],
        }
    }
}

struct Layer {
    attn_norm: Tensor,
    qkv: Qkv,
    wo: Linear,
    ffn_norm: Tensor,
    gate_up: GateUp,
    down: Linear,
    k_cache: Tensor,
    v_cache: Tensor,
}

/// The activations of one step, allocated once per [`Step`].
struct Scratch {
    /// The step's token ids and positions (`f32`, one a row), written before
    /// each step, and, for several sequences, each row's key/value heads'
    /// rows in the cache (`rows · kv_heads`).
    ids: Tensor,
    positions: Tensor,
    slots: Tensor,
    x: Tensor,
    x2: Tensor,
    h: Tensor,
    qkv: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_rot: Tensor,
    k_rot: Tensor,
    q_heads: Tensor,
    attn: Tensor,
    attn_tokens: Tensor,
    o: Tensor,
    gate: Tensor,
    up: Tensor,
    gate_up: Tensor,
    act: Tensor,
    last: Tensor,
    normed: Tensor,
    logits: Tensor,
    next: Tensor,
    /// What a prefill of new sequences adds ([`Step::Prefill`]).
    prefill: Option<prefill::PrefillScratch>,
}

/// The kind and size of a step: the key of its scratch tensors and of its
/// recording.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Step {
    /// `tokens` tokens of each of `batch` cache slots (`batch` is the
    /// model's slot count; more than one slot takes one token each), at
    /// their positions, attending to their caches.
    Extend { batch: usize, tokens: usize },
    /// The prompts of `prompts` new sequences, each left-padded to `tokens`
    /// rows, attending to their own keys and appending them to their slots.
    Prefill { prompts: usize, tokens: usize },
}

impl Step {
    /// Activation rows.
    fn rows(self) -> usize {
        match self {
            Step::Extend { batch, tokens } => batch * tokens,
            Step::Prefill { prompts, tokens } => prompts * tokens,
        }
    }

    /// Rows of logits: one a sequence.
    fn sequences(self) -> usize {
        match self {
            Step::Extend { batch, .. } => batch,
            Step::Prefill { prompts, .. } => prompts,
        }
    }

    /// Tokens of each sequence.
    fn tokens(self) -> usize {
        match self {
            Step::Extend { tokens, .. } | Step::Prefill { tokens, .. } => tokens,
        }
    }
}

/// The values a step writes to its scratch tensors before it runs.
#[derive(Default)]
struct StepInput {
    /// Token ids, one a row.
    ids: Vec<f32>,
    /// Positions, one a row (−1: a padding or idle row).
    positions: Vec<f32>,
    /// Cache rows of each row's key/value heads (several slots; −1: none).
    slots: Vec<f32>,
    /// Rows of each row's key/value heads among the prompts' own keys
    /// ([`Step::Prefill`]).
    key_slots: Vec<f32>,
}

/// Identifies a sequence held by a [`Llama`] ([`Llama::add_sequence`]);
/// never reused, so an id of a removed sequence names nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(u64);

/// A sequence in one cache slot.
#[derive(Clone, Copy, Debug)]
struct Seq {
    id: SeqId,
    /// Tokens in its cache.
    position: usize,
    /// The token its next step feeds: the greedy choice of its last step, or
    /// [`Llama::set_next_token`]'s.
    next: Option<u32>,
}

/// A Llama model resident on one engine, with its KV cache: feed it tokens
/// with [`Llama::step`], or decode several sequences together
/// ([`Llama::set_sequences`] and [`Llama::step_all`] in lockstep;
/// [`Llama::add_sequence`], [`Llama::step_active`] and
/// [`Llama::remove_sequence`] as they come and go), read the logits or the
/// greedy choices.
pub struct Llama {
    backend: Arc<dyn Backend>,
    cfg: LlamaConfig,
    format: WeightFormat,
    embed: Tensor,
    layers: Vec<Layer>,
    final_norm: Tensor,
    lm_head: Linear,
    /// Per step shape.
    scratch: HashMap<Step, Scratch>,
    /// One entry per cache slot: the sequence it holds. One slot unless
    /// [`Llama::set_slots`] or [`Llama::set_sequences`] made more.
    slots: Vec<Option<Seq>>,
    /// The next [`SeqId`].
    next_id: u64,
    /// The last step that ran and the sequence of each of its logit rows
    /// (`None`: an idle slot), for [`Llama::last_logits`].
    last: Option<(Step, Vec<Option<SeqId>>)>,
    /// Whether the step reads its positions from a tensor (every op of the
    /// step supports it), so that its calls do not change with the position.
    device_positions: bool,
    /// Whether one-token steps are recorded and replayed ([`Llama::set_recording`]).
    record_steps: bool,
    /// Whether quantized products take the norm before them and the gated
    /// halves after them, and a quantized LM head the final norm
    /// ([`Llama::set_fused_norms`]).
    fuse_norms: bool,
    /// Whether one sequence's keys are turned straight into the cache
    /// ([`Llama::set_keys_into_cache`]).
    keys_into_cache: bool,
    /// Per step shape: `Ready` once recorded, `Warm` after one direct run,
    /// `Never` where the backend does not record.
    recordings: HashMap<Step, StepRecording>,
}

/// Where the recording of a step shape stands.
enum StepRecording {
    /// Ran once directly (kernels loaded, buffers allocated): record next time.
    Warm,
    /// Recorded: each step replays it.
    Ready(Box<dyn compute_core::Recording>),
    /// The backend does not record: run directly.
    Never,
}

impl Llama {
    /// Uploads `weights` (rounded or quantized to `format`) to `backend` and
    /// allocates a KV cache of `cfg.max_seq` tokens per layer. Costs one
    /// upload of the weights (and, for a quantized format, quantizing them
    /// on the host: seconds for a 1B model).
    pub fn load(backend: Arc<dyn Backend>, weights: &HostWeights, format: WeightFormat) -> Result<Llama> {
        let cfg = weights.cfg;
        cfg.check()?;
        // Round or quantize every tensor first, on all cores, then upload
        // them in the order `assemble` asks for them.
        let mut sources: Vec<(&[f32], DType)> =
            vec![(&weights.embed, format.dtype), (&weights.final_norm, format.dtype)];
        sources.push((&weights.lm_head, format.linear));
        for l in &weights.layers {
            sources.push((&l.attn_norm, format.dtype));
            sources.push((&l.ffn_norm, format.dtype));
            for w in [&l.wq, &l.wk, &l.wv, &l.wo, &l.gate, &l.up, &l.down] {
                sources.push((w, format.linear));
            }
        }
        let mut stored = convert_all(&sources).into_iter();
        Self::assemble(backend, cfg, format, |name| {
            stored.next().ok_or_else(|| ComputeError::shape("llama", format!("no tensor for {name}"), String::new()))
        })
    }

    /// Builds the model from its tensors, each asked for by its llama.cpp
    /// name (see [`TENSOR_ORDER`]) in that order, already in the dtype it
    /// is stored in; uploads each and allocates the KV cache.
    pub(crate) fn assemble(
        backend: Arc<dyn Backend>,
        cfg: LlamaConfig,
        format: WeightFormat,
        mut tensor: impl FnMut(&str) -> Result<compute_core::HostVec>,
    ) -> Result<Llama> {
        cfg.check()?;
        let d = cfg.head_dim();
        let fuse = Self::fused_qkv_supported(&*backend, &cfg, format.dtype);
        let glu = Op::Glu { rows: 1, cols: cfg.intermediate, dtype: format.dtype };
        let fuse_gate_up = backend.supports(&glu);
        let (q_out, kv_out) = (cfg.heads * d, cfg.kv_heads * d);
        let put = |v: compute_core::HostVec| -> Result<Tensor> { backend.upload_typed(v.as_slice()) };
        let embed = put(tensor("token_embd.weight")?)?;
        let final_norm = put(tensor("output_norm.weight")?)?;
        let lm_head = Linear { w: put(tensor("output.weight")?)?, out: cfg.vocab, inp: cfg.hidden };
        let cache = cfg.kv_heads * cfg.max_seq * d;
        let mut layers = Vec::with_capacity(cfg.layers);
        for i in 0..cfg.layers {
            let name = |n: &str| format!("blk.{i}.{n}.weight");
            let attn_norm = put(tensor(&name("attn_norm"))?)?;
            let ffn_norm = put(tensor(&name("ffn_norm"))?)?;
            let parts = [tensor(&name("attn_q"))?, tensor(&name("attn_k"))?, tensor(&name("attn_v"))?];
            let stacked = if fuse { compute_core::HostVec::concat(&parts) } else { None };
            let qkv = match stacked {
                Some(w) => Qkv::Fused(Linear { w: put(w)?, out: q_out + 2 * kv_out, inp: cfg.hidden }),
                None => {
                    let [q, k, v] = parts;
                    let lin = |w, out| -> Result<Linear> { Ok(Linear { w: put(w)?, out, inp: cfg.hidden }) };
                    Qkv::Separate { wq: lin(q, q_out)?, wk: lin(k, kv_out)?, wv: lin(v, kv_out)? }
                }
            };
            let wo = Linear { w: put(tensor(&name("attn_output"))?)?, out: cfg.hidden, inp: q_out };
            let parts = [tensor(&name("ffn_gate"))?, tensor(&name("ffn_up"))?];
            let stacked = if fuse_gate_up { compute_core::HostVec::concat(&parts) } else { None };
            let inter = cfg.intermediate;
            let gate_up = match stacked {
                Some(w) => GateUp::Fused(Linear { w: put(w)?, out: 2 * inter, inp: cfg.hidden }),
                None => {
                    let [gate, up] = parts;
                    let lin = |w| -> Result<Linear> { Ok(Linear { w: put(w)?, out: inter, inp: cfg.hidden }) };
                    GateUp::Separate { gate: lin(gate)?, up: lin(up)? }
                }
            };
            let down = Linear { w: put(tensor(&name("ffn_down"))?)?, out: cfg.hidden, inp: inter };
            layers.push(Layer {
                attn_norm,
                qkv,
                wo,
                ffn_norm,
                gate_up,
                down,
                k_cache: backend.alloc_typed(cache, format.dtype)?,
                v_cache: backend.alloc_typed(cache, format.dtype)?,
            });
        }
        let device_positions = Self::positions_supported(&*backend, &cfg, format.dtype);
        Ok(Llama {
            embed,
            final_norm,
            lm_head,
            layers,
            cfg,
            format,
            backend,
            scratch: HashMap::new(),
            slots: vec![Some(Seq { id: SeqId(0), position: 0, next: None })],
            next_id: 1,
            last: None,
            device_positions,
            record_steps: true,
            fuse_norms: true,
            keys_into_cache: true,
            recordings: HashMap::new(),
        })
    }

    /// Whether `backend` runs the step's position-reading ops (rotary
    /// embedding, cache append, attention) with positions from a tensor.
    fn positions_supported(backend: &dyn Backend, cfg: &LlamaConfig, dtype: DType) -> bool {
        let (d, cap) = (cfg.head_dim(), cfg.max_seq);
        let ops = [
            Op::Rope(cfg.rope(1, cfg.heads, dtype).with_positions()),
            Op::Copy(
                CopySpec::new(
                    [cfg.kv_heads, 1, d],
                    Strided::contiguous([cfg.kv_heads, 1, d]),
                    Strided { offset: 0, strides: [cap * d, d, 1], len: cfg.kv_heads * cap * d },
                )
                .at_positions(cap)
                .with_dtype(dtype),
            ),
            Op::Attention(
                AttentionSpec::new(1, cfg.heads, 1, cap, d)
                    .with_kv_heads(cfg.kv_heads)
                    .causal()
                    .with_dtype(dtype)
                    .with_positions(),
            ),
        ];
        ops.iter().all(|op| backend.supports(op))
    }

    /// Whether `backend` turns the query and key heads out of a fused q/k/v
    /// product's rows ([`RopeSpec::from_heads`]), so the three projections
    /// can be one product.
    fn fused_qkv_supported(backend: &dyn Backend, cfg: &LlamaConfig, dtype: DType) -> bool {
        let rows = cfg.heads + 2 * cfg.kv_heads;
        let rope = cfg.rope(1, cfg.kv_heads, dtype);
        backend.supports(&Op::Rope(rope.from_heads(rows, cfg.heads)))
    }

    /// Whether one-token steps are recorded once and replayed (on by
    /// default). A backend that records ([`Backend::record`]: CUDA, as a
    /// graph) then runs a decoding step as one launch instead of about
    /// twenty per layer; elsewhere this changes nothing. The first step of a
    /// length runs directly, the second records and replays; turning it off
    /// drops the recordings.
    pub fn set_recording(&mut self, on: bool) {
        self.record_steps = on;
        if !on {
            self.recordings.clear();
        }
    }

    /// Whether block-quantized q/k/v and gate/up products take the RMS norm
    /// before them and the gated halves after them into the product
    /// ([`QuantMatmulSpec::with_rms_norm`], [`QuantMatmulSpec::with_glu`]; on
    /// by default), and a block-quantized LM head the final norm: three ops
    /// fewer a layer and one a step (one sequence's decoding step keeps its normalized
    /// rows in `f32` on every backend). Off, they run as ops of
    /// their own (to compare); turning it either way drops the recorded steps.
    pub fn set_fused_norms(&mut self, on: bool) {
        self.fuse_norms = on;
        self.recordings.clear();
    }

    /// Whether one sequence's decoding step turns its keys straight into the
    /// KV cache ([`RopeSpec::into_cache`], where the backend takes it; on by
    /// default): one op fewer a layer than a rope and an append. Off, the
    /// keys are turned into the step's rows and appended (to compare);
    /// turning it either way drops the recorded steps.
    pub fn set_keys_into_cache(&mut self, on: bool) {
        self.keys_into_cache = on;
        self.recordings.clear();
    }

    /// Whether the steps read their positions from a tensor on the device
    /// (the backend runs every position-reading op that way), which is what
    /// lets them be recorded.
    pub fn device_positions(&self) -> bool {
        self.device_positions
    }

    /// The model's shape.
    pub fn config(&self) -> &LlamaConfig {
        &self.cfg
    }

    /// Bytes a decoding step reads at least: every weight once (one row of
    /// the embedding table) and the KV cache of every held sequence up to
    /// its position.
    pub fn bytes_per_token(&self) -> u64 {
        let c = &self.cfg;
        let mut b = self.final_norm.size_in_bytes() + self.lm_head.w.size_in_bytes();
        b += self.embed.size_in_bytes() / c.vocab.max(1) as u64;
        for l in &self.layers {
            let mut tensors = vec![&l.attn_norm, &l.ffn_norm, &l.wo.w, &l.down.w];
            tensors.extend(l.qkv.weights());
            tensors.extend(l.gate_up.weights());
            for t in tensors {
                b += t.size_in_bytes();
            }
        }
        let row = self.format.dtype.bytes_for(2 * c.layers * c.kv_heads * c.head_dim()).unwrap_or(0);
        let held: usize = self.slots.iter().flatten().map(|s| s.position).sum();
        b + row * held as u64
    }

    /// Tokens held in the KV cache of the first slot's sequence (the only
    /// one unless [`Llama::set_slots`] made more; 0 when the slot is free).
    pub fn position(&self) -> usize {
        self.slots.first().copied().flatten().map_or(0, |s| s.position)
    }

    /// Empties the KV cache of every held sequence (each starts again at
    /// position 0, with no next token); free slots stay free. Free.
    pub fn reset(&mut self) {
        for s in self.slots.iter_mut().flatten() {
            s.position = 0;
            s.next = None;
        }
        self.last = None;
    }

    /// Runs `tokens` (a prompt, or the one token of a decoding step) through
    /// the model at the cache's current position, appends their keys and
    /// values to the cache, and returns the greedy next token. About 17 ops
    /// per layer (one launch in all for a recorded step); no host transfer
    /// but the token ids and positions in and the chosen token out. Needs a
    /// model of one slot holding a sequence (the default).
    pub fn step(&mut self, tokens: &[u32]) -> Result<u32> {
        let step = self.forward(tokens)?;
        let s = self.scratch(step)?;
        let mut next = [0f32];
        self.backend.download(&s.next, &mut next)?;
        let next = next[0] as u32;
        if let Some(Some(seq)) = self.slots.first_mut() {
            seq.next = Some(next);
        }
        Ok(next)
    }

    /// [`Llama::step`], returning the last token's logits (`vocab` values,
    /// `f32`) instead of the greedy choice.
    pub fn logits(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let step = self.forward(tokens)?;
        self.download_logits(step)
    }

    /// Greedy decoding: the prompt as one step, then `new_tokens` steps of
    /// one token; returns the generated tokens.
    pub fn generate(&mut self, prompt: &[u32], new_tokens: usize) -> Result<Vec<u32>> {
        let mut out = Vec::with_capacity(new_tokens);
        if new_tokens == 0 {
            return Ok(out);
        }
        let mut next = self.step(prompt)?;
        out.push(next);
        while out.len() < new_tokens {
            next = self.step(&[next])?;
            out.push(next);
        }
        Ok(out)
    }

    fn scratch(&self, step: Step) -> Result<&Scratch> {
        self.scratch
            .get(&step)
            .ok_or_else(|| ComputeError::shape("llama", "no step of this shape ran", format!("{step:?}")))
    }

    /// Every logit row of the step's scratch, `f32`.
    fn download_logits(&self, step: Step) -> Result<Vec<f32>> {
        let s = self.scratch(step)?;
        let mut out = compute_core::HostVec::zeros(self.format.dtype, step.sequences() * self.cfg.vocab);
        self.backend.download_typed(&s.logits, out.as_mut())?;
        Ok(out.to_f32())
    }

    /// Allocates the activations of `step`, once per shape. A multi-token
    /// shape replaces the other multi-token ones (prompts come in many
    /// lengths; one-token steps, which are recorded, stay).
    fn ensure_scratch(&mut self, step: Step) -> Result<()> {
        if self.scratch.contains_key(&step) {
            return Ok(());
        }
        if step.tokens() > 1 {
            self.scratch.retain(|k, _| k.tokens() == 1);
        }
        let (c, dt, b) = (self.cfg, self.format.dtype, &self.backend);
        let d = c.head_dim();
        let a = |len: usize| b.alloc_typed(len, dt);
        let (seq, batch) = (step.rows(), step.sequences());
        let prefill = match step {
            Step::Prefill { prompts, tokens } => Some(prefill::PrefillScratch::new(&**b, &c, dt, prompts, tokens)?),
            Step::Extend { .. } => None,
        };
        let s = Scratch {
            ids: b.alloc_typed(seq, DType::F32)?,
            positions: b.alloc_typed(seq, DType::F32)?,
            slots: b.alloc_typed(seq * c.kv_heads, DType::F32)?,
            x: a(seq * c.hidden)?,
            x2: a(seq * c.hidden)?,
            h: a(seq * c.hidden)?,
            qkv: a(seq * (c.heads + 2 * c.kv_heads) * d)?,
            q: a(seq * c.heads * d)?,
            k: a(seq * c.kv_heads * d)?,
            v: a(seq * c.kv_heads * d)?,
            q_rot: a(seq * c.heads * d)?,
            k_rot: a(seq * c.kv_heads * d)?,
            q_heads: a(seq * c.heads * d)?,
            attn: a(seq * c.heads * d)?,
            attn_tokens: a(seq * c.heads * d)?,
            o: a(seq * c.hidden)?,
            gate: a(seq * c.intermediate)?,
            up: a(seq * c.intermediate)?,
            gate_up: a(seq * 2 * c.intermediate)?,
            act: a(seq * c.intermediate)?,
            last: a(batch * c.hidden)?,
            normed: a(batch * c.hidden)?,
            logits: a(batch * c.vocab)?,
            next: b.alloc_typed(batch, DType::F32)?,
            prefill,
        };
        self.scratch.insert(step, s);
        Ok(())
    }

    /// One step of the single sequence: `tokens` at its position.
    fn forward(&mut self, tokens: &[u32]) -> Result<Step> {
        let seq = tokens.len();
        let c = self.cfg;
        let shapes = || format!("tokens=[{seq}]");
        if self.slots.len() != 1 {
            return Err(ComputeError::shape(
                "llama",
                format!("the model has {} sequence slots: step them with step_all or step_active", self.slots.len()),
                shapes(),
            ));
        }
        let Some(Some(held)) = self.slots.first().copied() else {
            return Err(ComputeError::shape("llama", "the slot holds no sequence: add one first", shapes()));
        };
        let pos = held.position;
        if seq == 0 || pos + seq > c.max_seq {
            return Err(ComputeError::shape(
                "llama",
                format!("{seq} tokens at position {pos} do not fit a cache of {}", c.max_seq),
                shapes(),
            ));
        }
        self.check_tokens(tokens)?;
        let step = Step::Extend { batch: 1, tokens: seq };
        let input = StepInput {
            ids: tokens.iter().map(|&t| t as f32).collect(),
            positions: (pos..pos + seq).map(|p| p as f32).collect(),
            ..StepInput::default()
        };
        self.run_step(step, &input)?;
        if let Some(Some(s)) = self.slots.first_mut() {
            s.position += seq;
        }
        self.last = Some((step, vec![Some(held.id)]));
        Ok(step)
    }

    fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
        match tokens.iter().find(|&&t| t as usize >= self.cfg.vocab) {
            Some(&t) => Err(ComputeError::shape(
                "llama",
                format!("token {t} is past the vocabulary"),
                format!("vocab={}", self.cfg.vocab),
            )),
            None => Ok(()),
        }
    }

    /// Writes the step's ids, positions and cache slots and runs it:
    /// directly, or, for one token a sequence where the backend records,
    /// through its recording.
    fn run_step(&mut self, step: Step, input: &StepInput) -> Result<()> {
        self.ensure_scratch(step)?;
        {
            let (b, s) = (&*self.backend, self.scratch(step)?);
            b.upload_into(HostSlice::F32(&input.ids), &s.ids)?;
            if self.device_positions {
                b.upload_into(HostSlice::F32(&input.positions), &s.positions)?;
            }
            if !input.slots.is_empty() {
                b.upload_into(HostSlice::F32(&input.slots), &s.slots)?;
            }
            if let Some(p) = &s.prefill {
                b.upload_into(HostSlice::F32(&input.key_slots), &p.key_slots)?;
            }
        }
        if !(self.device_positions && self.record_steps && step.tokens() == 1) {
            return self.queue(step);
        }
        match self.recordings.remove(&step) {
            Some(StepRecording::Ready(r)) => {
                let replayed = r.replay();
                self.recordings.insert(step, StepRecording::Ready(r));
                replayed
            }
            Some(StepRecording::Warm) => match self.backend.record(&mut || self.queue(step))? {
                Some(r) => {
                    r.replay()?;
                    self.recordings.insert(step, StepRecording::Ready(r));
                    Ok(())
                }
                None => {
                    self.recordings.insert(step, StepRecording::Never);
                    self.queue(step)
                }
            },
            Some(StepRecording::Never) => {
                self.recordings.insert(step, StepRecording::Never);
                self.queue(step)
            }
            None => {
                self.recordings.insert(step, StepRecording::Warm);
                self.queue(step)
            }
        }
    }

    /// Queues `step`: every op of the forward pass on its scratch tensors.
    /// With device positions the calls are the same at every position (what
    /// a recording replays).
    fn queue(&self, step: Step) -> Result<()> {
        let (c, dt) = (self.cfg, self.format.dtype);
        let dynamic = self.device_positions;
        // Without device positions the model holds one sequence (the ops take its position).
        let pos = if dynamic { 0 } else { self.position() };
        let (b, s) = (&*self.backend, self.scratch(step)?);
        let d = c.head_dim();
        // Activation rows: every token of every sequence of the step.
        let (seq, batch, tokens) = (step.rows(), step.sequences(), step.tokens());
        let slots = self.slots.len();
        let gather = Op::Gather { ids: seq, rows: c.vocab, cols: c.hidden, dtype: dt };
        b.run_tensors(&gather, &[&self.embed, &s.ids], &s.x)?;
        let norm = Op::rows(RowOp::RmsNorm { eps: c.rms_eps }, seq, c.hidden).with_dtype(dt);
        let row_heads = c.heads + 2 * c.kv_heads;
        // `first`: the heads sit in the fused q/k/v rows, from that head on.
        let rope = |heads, first: Option<usize>| {
            let r = c.rope(seq, heads, dt);
            let r = match first {
                Some(f) => r.from_heads(row_heads, f),
                None => r,
            };
            Op::Rope(if dynamic { r.with_positions() } else { r.at_position(pos) })
        };
        // Token-major [seq, heads, d] ↔ head-major [heads, seq, d].
        let token_major = |heads: usize, len: usize| Strided { offset: 0, strides: [d, heads * d, 1], len };
        let to_heads = Op::Copy(
            CopySpec::new(
                [c.heads, seq, d],
                token_major(c.heads, seq * c.heads * d),
                Strided::contiguous([c.heads, seq, d]),
            )
            .with_dtype(dt),
        );
        let to_tokens = Op::Copy(
            CopySpec::new(
                [c.heads, seq, d],
                Strided::contiguous([c.heads, seq, d]),
                token_major(c.heads, seq * c.heads * d),
            )
            .with_dtype(dt),
        );
        let at = if dynamic { 0 } else { pos * d };
        let cache = Strided { offset: at, strides: [c.max_seq * d, d, 1], len: c.kv_heads * c.max_seq * d };
        let append =
            CopySpec::new([c.kv_heads, seq, d], token_major(c.kv_heads, seq * c.kv_heads * d), cache).with_dtype(dt);
        let append = Op::Copy(if dynamic { append.at_positions(c.max_seq) } else { append });
        // The values straight out of the fused q/k/v rows.
        let v_rows =
            Strided { offset: (c.heads + c.kv_heads) * d, strides: [d, row_heads * d, 1], len: seq * row_heads * d };
        let append_v = CopySpec::new([c.kv_heads, seq, d], v_rows, cache).with_dtype(dt);
        let append_v = Op::Copy(if dynamic { append_v.at_positions(c.max_seq) } else { append_v });
        // One sequence's keys turned straight into the cache (one op instead of
        // a rope and an append), where the backend takes it.
        let several = slots > 1 || matches!(step, Step::Prefill { .. });
        let keys_into_cache = |first: Option<usize>| {
            let Op::Rope(r) = rope(c.kv_heads, first) else { return None };
            let op = Op::Rope(r.into_cache(c.max_seq));
            (self.keys_into_cache && !several && b.supports(&op)).then_some(op)
        };
        // Several slots: each row's key/value heads go to their rows of the
        // [slots, kv_heads, capacity, d] cache (the slots tensor).
        let slotted = Op::Copy(prefill::slotted(seq * c.kv_heads, slots * c.kv_heads * c.max_seq, d).with_dtype(dt));
        let v_of_each =
            Strided { offset: (c.heads + c.kv_heads) * d, strides: [row_heads * d, d, 1], len: seq * row_heads * d };
        let values_apart = Op::Copy(
            CopySpec::new([seq, c.kv_heads, d], v_of_each, Strided::contiguous([seq, c.kv_heads, d])).with_dtype(dt),
        );
        let keys = if dynamic { c.max_seq } else { pos + seq };
        let attention = AttentionSpec::new(batch, c.heads, tokens, keys, d)
            .with_kv_heads(c.kv_heads)
            .causal()
            .with_kv_capacity(c.max_seq);
        let attention = Op::Attention(if dynamic { attention.with_positions() } else { attention }.with_dtype(dt));
        let fresh = prefill::Ops::new(&c, dt, batch, tokens);
        // The position-reading ops take the step's positions as their last input.
        let run = |op: &Op, inputs: &[&Tensor], out: &Tensor| -> Result<()> {
            if !dynamic {
                return b.run_tensors(op, inputs, out);
            }
            let with: Vec<&Tensor> = inputs.iter().copied().chain([&s.positions]).collect();
            b.run_tensors(op, &with, out)
        };
        let swiglu = Op::binary(BinaryOp::SwiGlu, seq * c.intermediate).with_dtype(dt);
        let glu = Op::Glu { rows: seq, cols: c.intermediate, dtype: dt };
        // The residual stream alternates between x and x2.
        let (mut x, mut x2) = (&s.x, &s.x2);
        for l in &self.layers {
            // Quantized fused q/k/v weights take the norm into their product.
            let normed_qkv = match &l.qkv {
                Qkv::Fused(w) if self.fuse_norms => w.normed(b, (seq, dt), c.rms_eps, false),
                _ => None,
            };
            if normed_qkv.is_none() {
                b.run_tensors(&norm, &[x, &l.attn_norm], &s.h)?;
            }
            // The values, contiguous `[seq, kv_heads, d]`: `s.v`, or the fused
            // rows; and whether the keys went straight into the cache.
            let (values, keys_placed) = match &l.qkv {
                Qkv::Separate { wq, wk, wv } => {
                    b.run_tensors(&wq.op(seq, dt), &[&s.h, &wq.w], &s.q)?;
                    b.run_tensors(&wk.op(seq, dt), &[&s.h, &wk.w], &s.k)?;
                    b.run_tensors(&wv.op(seq, dt), &[&s.h, &wv.w], &s.v)?;
                    run(&rope(c.heads, None), &[&s.q], &s.q_rot)?;
                    let placed = keys_into_cache(None);
                    match &placed {
                        Some(op) => run(op, &[&s.k], &l.k_cache)?,
                        None => run(&rope(c.kv_heads, None), &[&s.k], &s.k_rot)?,
                    }
                    (None, placed.is_some())
                }
                Qkv::Fused(w) => {
                    match &normed_qkv {
                        Some(op) => b.run_tensors(op, &[x, &w.w, &l.attn_norm], &s.qkv)?,
                        None => b.run_tensors(&w.op(seq, dt), &[&s.h, &w.w], &s.qkv)?,
                    }
                    run(&rope(c.heads, Some(0)), &[&s.qkv], &s.q_rot)?;
                    let placed = keys_into_cache(Some(c.heads));
                    match &placed {
                        Some(op) => run(op, &[&s.qkv], &l.k_cache)?,
                        None => run(&rope(c.kv_heads, Some(c.heads)), &[&s.qkv], &s.k_rot)?,
                    }
                    (Some(&s.qkv), placed.is_some())
                }
            };
            match values {
                _ if several => {
                    if let Some(qkv) = values {
                        b.run_tensors(&values_apart, &[qkv], &s.v)?;
                    }
                    b.run_tensors(&slotted, &[&s.k_rot, &s.slots], &l.k_cache)?;
                    b.run_tensors(&slotted, &[&s.v, &s.slots], &l.v_cache)?;
                }
                Some(qkv) => {
                    if !keys_placed {
                        run(&append, &[&s.k_rot], &l.k_cache)?;
                    }
                    run(&append_v, &[qkv], &l.v_cache)?;
                }
                None => {
                    if !keys_placed {
                        run(&append, &[&s.k_rot], &l.k_cache)?;
                    }
                    run(&append, &[&s.v], &l.v_cache)?;
                }
            }
            let out = match (step, &s.prefill) {
                // New sequences: each prompt attends to its own keys.
                (Step::Prefill { .. }, Some(p)) => {
                    fresh.attend(b, p, s)?;
                    &s.attn_tokens
                }
                // One token a sequence: token-major and head-major are the same layout.
                _ if tokens == 1 => {
                    run(&attention, &[&s.q_rot, &l.k_cache, &l.v_cache], &s.attn)?;
                    &s.attn
                }
                _ => {
                    b.run_tensors(&to_heads, &[&s.q_rot], &s.q_heads)?;
                    run(&attention, &[&s.q_heads, &l.k_cache, &l.v_cache], &s.attn)?;
                    b.run_tensors(&to_tokens, &[&s.attn], &s.attn_tokens)?;
                    &s.attn_tokens
                }
            };
            l.wo.add_into(b, (seq, dt), (out, x), (&s.o, x2))?;
            std::mem::swap(&mut x, &mut x2);
            // Quantized fused gate/up weights take the norm and the gated
            // halves into their product.
            let normed_gate_up = match &l.gate_up {
                GateUp::Fused(w) if self.fuse_norms => w.normed(b, (seq, dt), c.rms_eps, true),
                _ => None,
            };
            match (&l.gate_up, normed_gate_up) {
                (GateUp::Fused(w), Some(op)) => b.run_tensors(&op, &[x, &w.w, &l.ffn_norm], &s.act)?,
                (GateUp::Separate { gate, up }, _) => {
                    b.run_tensors(&norm, &[x, &l.ffn_norm], &s.h)?;
                    b.run_tensors(&gate.op(seq, dt), &[&s.h, &gate.w], &s.gate)?;
                    b.run_tensors(&up.op(seq, dt), &[&s.h, &up.w], &s.up)?;
                    b.run_tensors(&swiglu, &[&s.gate, &s.up], &s.act)?;
                }
                (GateUp::Fused(w), None) => {
                    b.run_tensors(&norm, &[x, &l.ffn_norm], &s.h)?;
                    b.run_tensors(&w.op(seq, dt), &[&s.h, &w.w], &s.gate_up)?;
                    b.run_tensors(&glu, &[&s.gate_up], &s.act)?;
                }
            }
            l.down.add_into(b, (seq, dt), (&s.act, x), (&s.o, x2))?;
            std::mem::swap(&mut x, &mut x2);
        }
        // The logits of each sequence's last token: x's rows when each has
        // one, else every `tokens`-th row (prompts are left-padded: their last
        // rows line up).
        let last = if tokens == 1 {
            x
        } else {
            let copy = CopySpec::new(
                [batch, 1, c.hidden],
                Strided { offset: (tokens - 1) * c.hidden, strides: [tokens * c.hidden, 0, 1], len: seq * c.hidden },
                Strided::contiguous([batch, 1, c.hidden]),
            );
            b.run_tensors(&Op::Copy(copy.with_dtype(dt)), &[x], &s.last)?;
            &s.last
        };
        // A block-quantized LM head takes the final norm into its product.
        let normed_head = if self.fuse_norms { self.lm_head.normed(b, (batch, dt), c.rms_eps, false) } else { None };
        match normed_head {
            Some(op) => b.run_tensors(&op, &[last, &self.lm_head.w, &self.final_norm], &s.logits)?,
            None => {
                let final_norm = Op::rows(RowOp::RmsNorm { eps: c.rms_eps }, batch, c.hidden).with_dtype(dt);
                b.run_tensors(&final_norm, &[last, &self.final_norm], &s.normed)?;
                b.run_tensors(&self.lm_head.op(batch, dt), &[&s.normed, &self.lm_head.w], &s.logits)?;
            }
        }
        b.run_tensors(&Op::ArgMax { rows: batch, cols: c.vocab, dtype: dt }, &[&s.logits], &s.next)
    }
}
