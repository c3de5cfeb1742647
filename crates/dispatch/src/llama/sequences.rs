//! Several sequences decoded together, each in a slot of the KV cache.
//!
//! The model holds a fixed number of slots ([`Llama::set_slots`]); the KV
//! cache of a layer is `[slots, kv_heads, capacity, d]`. A decoding step
//! ([`Llama::step_active`], [`Llama::step_all`]) always runs one row per
//! slot, so its calls never change and it is recorded once: an idle slot's
//! row has position −1, which the cache appends skip and for which
//! attention reads no key. Sequences join ([`Llama::add_sequence`],
//! [`Llama::add_sequences`]: their prompts prefilled together in one pass)
//! and leave ([`Llama::remove_sequence`]) between steps without
//! disturbing the others. An idle slot costs its row of every product,
//! which at decoding sizes reads the weights once anyway.

use compute_core::{ComputeError, Result};

use super::{Llama, Seq, SeqId, Step, StepInput};

impl Llama {
    /// Makes room for `slots` sequences decoded together, all free: add
    /// them with [`Llama::add_sequence`] or [`Llama::add_sequences`].
    /// Allocates the KV cache anew (`slots` times one sequence's) and drops
    /// every sequence, scratch tensor and recording. More than one slot
    /// needs a backend that takes positions from a tensor
    /// ([`Llama::device_positions`]), else `Unsupported`.
    pub fn set_slots(&mut self, slots: usize) -> Result<()> {
        if slots == 0 {
            return Err(ComputeError::shape("llama", "no slot for a sequence", "slots=0".to_string()));
        }
        if slots > 1 && !self.device_positions {
            return Err(ComputeError::Unsupported { op: "llama batch", backend: self.backend.kind() });
        }
        let cache = slots * self.cfg.kv_heads * self.cfg.max_seq * self.cfg.head_dim();
        for l in &mut self.layers {
            l.k_cache = self.backend.alloc_typed(cache, self.format.dtype)?;
            l.v_cache = self.backend.alloc_typed(cache, self.format.dtype)?;
        }
        self.slots = vec![None; slots];
        self.scratch.clear();
        self.recordings.clear();
        self.last = None;
        Ok(())
    }

    /// Decodes `sequences` sequences together from now on, each with its own
    /// KV cache of `max_seq` tokens (all empty, in slots `0..sequences`):
    /// [`Llama::step_all`] then takes one token of each and runs every
    /// product once for all of them (the weights are read once a step,
    /// whatever the number of sequences). [`Llama::set_slots`], then every
    /// slot filled with an empty sequence; `sequences = 1` returns to
    /// [`Llama::step`].
    pub fn set_sequences(&mut self, sequences: usize) -> Result<()> {
        self.set_slots(sequences)?;
        for i in 0..sequences {
            let id = self.new_id();
            self.slots[i] = Some(Seq { id, position: 0, next: None });
        }
        Ok(())
    }

    /// Cache slots: sequences the model can hold at once.
    pub fn sequences(&self) -> usize {
        self.slots.len()
    }

    /// The held sequences, in slot order (the order of every per-sequence
    /// result).
    pub fn active_sequences(&self) -> Vec<SeqId> {
        self.slots.iter().flatten().map(|s| s.id).collect()
    }

    /// Tokens in `id`'s cache, `None` if the model does not hold it.
    pub fn sequence_position(&self, id: SeqId) -> Option<usize> {
        self.slots.iter().flatten().find(|s| s.id == id).map(|s| s.position)
    }

    fn new_id(&mut self) -> SeqId {
        self.next_id += 1;
        SeqId(self.next_id - 1)
    }

    fn held(&mut self, id: SeqId) -> Result<&mut Seq> {
        self.slots
            .iter_mut()
            .flatten()
            .find(|s| s.id == id)
            .ok_or_else(|| ComputeError::shape("llama", "no such sequence (removed?)", format!("{id:?}")))
    }

    /// Starts a sequence in a free slot with its `prompt` prefilled, and
    /// returns its id and greedy next token (which its next
    /// [`Llama::step_active`] feeds). [`Llama::add_sequences`] of one.
    pub fn add_sequence(&mut self, prompt: &[u32]) -> Result<(SeqId, u32)> {
        let mut added = self.add_sequences(&[prompt])?;
        added.pop().ok_or_else(|| ComputeError::shape("llama", "no sequence added", format!("[{}]", prompt.len())))
    }

    /// Starts one sequence per prompt, each in a free slot, with the prompts
    /// prefilled together in one pass: `prompts.len() × L` rows, each prompt
    /// left-padded to the longest `L`, one product per layer for all of
    /// them; each attends to its own keys. Returns each one's id and greedy
    /// next token, in the order of `prompts`. The other sequences are not
    /// touched. Costs one forward pass over the padded rows (padding wastes
    /// `Σ (L − lᵢ)` rows). Needs enough free slots, non-empty prompts that
    /// fit the cache, and a backend that takes positions from a tensor.
    pub fn add_sequences(&mut self, prompts: &[&[u32]]) -> Result<Vec<(SeqId, u32)>> {
        let (c, k) = (self.cfg, prompts.len());
        let lengths: Vec<usize> = prompts.iter().map(|p| p.len()).collect();
        let shapes = || format!("prompts={lengths:?}");
        if k == 0 {
            return Ok(Vec::new());
        }
        if !self.device_positions {
            return Err(ComputeError::Unsupported {
                op: "llama prefill of new sequences",
                backend: self.backend.kind(),
            });
        }
        if let Some(&n) = lengths.iter().find(|&&n| n == 0 || n > c.max_seq) {
            return Err(ComputeError::shape(
                "llama",
                format!("a prompt of {n} tokens: each needs 1 to {} (the cache)", c.max_seq),
                shapes(),
            ));
        }
        for p in prompts {
            self.check_tokens(p)?;
        }
        let free: Vec<usize> = self.slots.iter().enumerate().filter(|(_, s)| s.is_none()).map(|(i, _)| i).collect();
        if free.len() < k {
            return Err(ComputeError::shape(
                "llama",
                format!("{k} new sequences for {} free slots of {}", free.len(), self.slots.len()),
                shapes(),
            ));
        }
        let tokens = lengths.iter().copied().max().unwrap_or(1);
        let (kv, cap) = (c.kv_heads, c.max_seq);
        let mut input = StepInput::default();
        for (b, prompt) in prompts.iter().enumerate() {
            let pad = tokens - prompt.len();
            for i in 0..tokens {
                // Token t of the prompt sits at row pad + t, at position t.
                let t = i.checked_sub(pad);
                input.ids.push(t.map_or(0.0, |t| prompt[t] as f32));
                input.positions.push(t.map_or(-1.0, |t| t as f32));
                for h in 0..kv {
                    input.slots.push(t.map_or(-1.0, |t| ((free[b] * kv + h) * cap + t) as f32));
                    input.key_slots.push(t.map_or(-1.0, |t| ((b * kv + h) * tokens + t) as f32));
                }
            }
        }
        let step = Step::Prefill { prompts: k, tokens };
        self.run_step(step, &input)?;
        let next = self.download_next(step)?;
        let mut out = Vec::with_capacity(k);
        for (b, &n) in lengths.iter().enumerate() {
            let id = self.new_id();
            self.slots[free[b]] = Some(Seq { id, position: n, next: Some(next[b]) });
            out.push((id, next[b]));
        }
        self.last = Some((step, out.iter().map(|&(id, _)| Some(id)).collect()));
        Ok(out)
    }

    /// Ends sequence `id` and frees its slot for a new one; the others are
    /// untouched (their next step is the same recorded step). Free.
    pub fn remove_sequence(&mut self, id: SeqId) -> Result<()> {
        let slot = self
            .slots
            .iter_mut()
            .find(|s| s.is_some_and(|s| s.id == id))
            .ok_or_else(|| ComputeError::shape("llama", "no such sequence (removed?)", format!("{id:?}")))?;
        *slot = None;
        Ok(())
    }

    /// Sets the token `id`'s next step feeds, in place of the greedy choice
    /// of its last step (for a sampler, or a sequence added by
    /// [`Llama::set_sequences`], which has none). Free.
    pub fn set_next_token(&mut self, id: SeqId, token: u32) -> Result<()> {
        self.check_tokens(&[token])?;
        self.held(id)?.next = Some(token);
        Ok(())
    }

    /// One decoding step of every held sequence: each feeds its next token
    /// (its last step's greedy choice, or [`Llama::set_next_token`]'s) at
    /// its position, all in one step of the model (one row per slot; the
    /// recorded step, whichever slots are held). Returns each one's id and
    /// new greedy token, in slot order. A sequence whose cache is full or
    /// that has no next token is an error, and nothing runs.
    pub fn step_active(&mut self) -> Result<Vec<(SeqId, u32)>> {
        let mut feed = Vec::with_capacity(self.slots.len());
        for s in &self.slots {
            feed.push(match s {
                None => None,
                Some(s) => Some(s.next.ok_or_else(|| {
                    ComputeError::shape(
                        "llama",
                        "the sequence has no next token: set_next_token",
                        format!("{:?}", s.id),
                    )
                })?),
            });
        }
        if feed.iter().all(Option::is_none) {
            return Ok(Vec::new());
        }
        let next = self.decode(&feed)?;
        Ok(self.slots.iter().zip(next).filter_map(|(s, n)| s.map(|s| (s.id, n))).collect())
    }

    /// Runs one token of each slot's sequence (`tokens[i]` for slot `i`,
    /// each at its own position; every slot must hold a sequence) and
    /// returns each one's greedy next token. One step of the model for all
    /// of them: its products have one row a sequence.
    pub fn step_all(&mut self, tokens: &[u32]) -> Result<Vec<u32>> {
        let feed = self.feed_all(tokens)?;
        self.decode(&feed)
    }

    /// [`Llama::step_all`], returning each sequence's logits (`vocab` values
    /// each, sequence after sequence) instead of the greedy choices.
    pub fn logits_all(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let feed = self.feed_all(tokens)?;
        self.decode(&feed)?;
        self.download_logits(Step::Extend { batch: self.slots.len(), tokens: 1 })
    }

    /// The logits of the last step (`vocab` values, `f32`), one entry per
    /// sequence it ran: a decoding step's held sequences in slot order, or
    /// the sequences [`Llama::add_sequences`] started, in its order. Costs
    /// one download of the step's logits.
    pub fn last_logits(&self) -> Result<Vec<(SeqId, Vec<f32>)>> {
        let Some((step, rows)) = &self.last else {
            return Err(ComputeError::shape("llama", "no step ran since the last reset", String::new()));
        };
        let all = self.download_logits(*step)?;
        let v = self.cfg.vocab;
        Ok(rows.iter().enumerate().filter_map(|(i, id)| id.map(|id| (id, all[i * v..(i + 1) * v].to_vec()))).collect())
    }

    /// `tokens` as one for every slot, which must all be held.
    fn feed_all(&self, tokens: &[u32]) -> Result<Vec<Option<u32>>> {
        let n = self.slots.len();
        if tokens.len() != n {
            return Err(ComputeError::shape(
                "llama",
                format!("one token for each of {n} sequences"),
                format!("tokens=[{}]", tokens.len()),
            ));
        }
        if let Some(i) = self.slots.iter().position(Option::is_none) {
            return Err(ComputeError::shape(
                "llama",
                format!("slot {i} holds no sequence: step the held ones with step_active"),
                format!("tokens=[{n}]"),
            ));
        }
        Ok(tokens.iter().map(|&t| Some(t)).collect())
    }

    /// One decoding step: `feed[i]` for slot `i`'s sequence (`None`: idle).
    /// Returns the greedy token of every slot's row (meaningless for idle
    /// ones) and advances the fed sequences.
    fn decode(&mut self, feed: &[Option<u32>]) -> Result<Vec<u32>> {
        let (c, n) = (self.cfg, self.slots.len());
        let fed: Vec<u32> = feed.iter().flatten().copied().collect();
        self.check_tokens(&fed)?;
        let mut input = StepInput::default();
        for (i, (slot, t)) in self.slots.iter().zip(feed).enumerate() {
            let at = match (slot, t) {
                (Some(s), Some(_)) if s.position >= c.max_seq => {
                    return Err(ComputeError::shape(
                        "llama",
                        format!("sequence {:?}'s cache of {} is full", s.id, c.max_seq),
                        format!("tokens=[{}]", fed.len()),
                    ));
                }
                (Some(s), Some(_)) => Some(s.position),
                (None, Some(_)) => {
                    return Err(ComputeError::shape("llama", format!("slot {i} holds no sequence"), String::new()));
                }
                (_, None) => None,
            };
            input.ids.push(t.map_or(0.0, |t| t as f32));
            input.positions.push(at.map_or(-1.0, |p| p as f32));
            if n > 1 {
                // Slot i's head h appends at row (i·kv_heads + h)·capacity + its position.
                for h in 0..c.kv_heads {
                    input.slots.push(at.map_or(-1.0, |p| ((i * c.kv_heads + h) * c.max_seq + p) as f32));
                }
            }
        }
        if !self.device_positions && feed.first().copied().flatten().is_none() {
            return Err(ComputeError::shape("llama", "the slot holds no sequence", String::new()));
        }
        let step = Step::Extend { batch: n, tokens: 1 };
        self.run_step(step, &input)?;
        let next = self.download_next(step)?;
        let mut rows = Vec::with_capacity(n);
        for ((slot, t), &choice) in self.slots.iter_mut().zip(feed).zip(&next) {
            let seq = slot.as_mut().filter(|_| t.is_some());
            if let Some(s) = seq {
                s.position += 1;
                s.next = Some(choice);
            }
            rows.push(slot.filter(|_| t.is_some()).map(|s| s.id));
        }
        self.last = Some((step, rows));
        Ok(next)
    }

    /// The greedy token of each of the step's sequences.
    fn download_next(&self, step: Step) -> Result<Vec<u32>> {
        let s = self.scratch(step)?;
        let mut next = vec![0f32; step.sequences()];
        self.backend.download(&s.next, &mut next)?;
        Ok(next.into_iter().map(|t| t as u32).collect())
    }
}
