//! Fused attention: `out = softmax(scale·q·kᵀ + mask)·v` without the score matrix.
//!
//! The kernels treat one (batch, key/value head) as a matrix of
//! `rows = group · seq_q` query rows: with `q` laid out `[batch, heads_q,
//! seq_q, d]`, the query heads that share a key/value head are consecutive,
//! so their rows follow each other in memory and one block's tile of rows
//! reads each key and value once for the whole group (grouped-query
//! attention costs no extra traffic). Row `r` is query position `r mod seq_q`.
//! Keys and values are `[batch, heads_kv, kv_rows, d]` (`kv_rows` a kernel
//! argument: `seq_k`, or the capacity of a KV cache filled to `seq_k`): every
//! kernel steps `kv_rows·d` between heads and reads the first `seq_k` rows.
//!
//! The mask enters as two numbers per launch ([`visible_params`]): query
//! position `i` sees keys `0..vis(i)` with `vis(i) = min(seq_k, max(0, i + a − b))`,
//! which covers no mask, the end-aligned and the start-aligned causal masks.
//!
//! - [`flash`] (`f16`/`bf16`, head sizes that are multiples of 16 up to 128):
//!   FlashAttention-2 on `mma.sync`. A block of `warps` warps owns
//!   `16·m_tiles` query rows each; the `q` tile is copied to shared memory once
//!   and held in registers as `mma` fragments (or read from shared memory per
//!   key tile: [`FlashConfig::q_regs`]); key and value tiles of `bn`
//!   rows stream through two shared-memory stages by `cp.async` (the next
//!   tile's copies are in flight while this one is multiplied). Per key tile:
//!   `S = q·kᵀ` on tensor cores, the running row maximum and sum updated in
//!   registers (rows are shared by the four lanes of a quad: two shuffles),
//!   the accumulator rescaled by `2^(m_old − m_new)`, the weights rounded to
//!   the input dtype and fed straight from the `S` accumulators into the
//!   `A` fragments of `O += P·v` (the accumulator layout of two adjacent
//!   `m16n8` tiles is the `A` layout of one `m16n8k16`). Key tiles every
//!   row of the block sees fully run without the mask; the tiles past the
//!   first row's limit run with it; tiles past the last row's limit are
//!   skipped. Shared rows are XOR-swizzled ([`super::gemm_mma::swizzle`]),
//!   padded to a power of two. On `f32` data (TF32 opted in) the same kernel
//!   reads bf16 high and low parts of `q`, `k`, `v` ([`split_bf16`] makes
//!   them) and computes every product as `ah·bh + ah·bl + al·bh`.
//! - [`flash_split`] and [`combine`] (flash-decoding): the keys of each row
//!   tile split across blocks, each writing `f32` partial rows and their
//!   base-2 log-sum-exp, merged by `combine`.
//! - [`simt`] (`f32`, any head size up to [`SIMT_MAX_HEAD_DIM`]): one warp
//!   per query row, keys 32 at a time, lane `j` computing the dot product of
//!   key `j` with the row (held in shared memory), then the online softmax
//!   of the 32 scores and the weighted sum of the value rows (lane `c` owning
//!   columns `c`, `c + 32`, …). Exact `f32`, no tensor cores.
//!
//! Every output row is written once: `acc / l`, or zeros where `l = 0` (no
//! key seen). Exponentials are `ex2.approx` of scores pre-multiplied by
//! `scale·log₂e`.

use compute_core::DType;

use crate::builder::{B32, BuildError, Cmp, Dim, F32, Half, Kernel, KernelBuilder, Pred, Reg, Target, U32, U64};

/// Largest head size of the `f32` kernel (8 columns per lane).
pub const SIMT_MAX_HEAD_DIM: usize = 256;
/// Query rows (warps) per block of the `f32` kernel.
pub const SIMT_ROWS: u32 = 4;

/// `(a, b)` of the visible-key rule for a mask with causal offset `offset`
/// (`None`: no mask): `vis(i) = min(seq_k, max(0, i + a − b))`. Free.
pub fn visible_params(offset: Option<i64>, seq_k: usize) -> (u64, u64) {
    match offset {
        None => (seq_k as u64, 0),
        // vis(i) = clamp(i + offset + 1, 0, seq_k)
        Some(off) => {
            let base = off + 1;
            if base >= 0 { (base as u64, 0) } else { (0, (-base) as u64) }
        }
    }
}

/// Shape of the tensor-core attention kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlashConfig {
    /// Head size (a multiple of 16, at most 128).
    pub head_dim: u32,
    /// Warps per block.
    pub warps: u32,
    /// 16-row `mma` tiles of query rows per warp.
    pub m_tiles: u32,
    /// Keys per streamed tile (a multiple of 16).
    pub bn: u32,
    /// Hold the `q` fragments in registers for the whole kernel (else read
    /// them from shared memory for every key tile: fewer registers, more
    /// shared-memory traffic).
    pub q_regs: bool,
    /// Wait for a tile's keys and its values separately, so the next
    /// tile's keys are in flight during this tile's `P·v` and its values
    /// during the next `q·kᵀ` (two barriers per tile instead of one).
    pub split: bool,
}

impl FlashConfig {
    /// The shape the backend launches for head size `d`: 4 warps of two
    /// 16-row tiles (128 query rows per block), key tiles of 64. Up to
    /// `d = 64` the `q` fragments stay in registers; above, they are read
    /// from shared memory per key tile and the key and value waits are
    /// split, which keeps the kernel under 255 registers. On the H200 at
    /// `d = 128` (b4 h32 s4096, bf16, 2026-11-25) that is 332 TFLOP/s full
    /// and 304 causal, against 308 and 285 for one row tile per warp with
    /// `q` in registers and 275 and 262 for one tile with a single wait.
    pub fn for_head_dim(d: usize) -> FlashConfig {
        let wide = d > 64;
        FlashConfig { head_dim: d as u32, warps: 4, m_tiles: 2, bn: 64, q_regs: !wide, split: wide }
    }

    /// The shape for `rows` query rows per key/value head (the group size
    /// times `seq_q`): [`FlashConfig::for_decode`] up to 16 rows (decoding),
    /// [`FlashConfig::for_head_dim`] above.
    pub fn for_shape(d: usize, rows: usize) -> FlashConfig {
        if rows <= 16 { Self::for_decode(d) } else { Self::for_head_dim(d) }
    }

    /// The decoding shape: two warps of 16 rows per block (a block's row
    /// tile is not mostly padding), key tiles of 128, `q` in registers,
    /// split waits. On the H200 (2026-11-25, one query on 8192 keys, GQA
    /// 32:8, d = 128, bf16) it read the KV cache at 3526 GB/s for a batch
    /// of 16 and 1135 GB/s for one sequence, against 3289 and 1039 for one
    /// warp with key tiles of 64, and 3474 and 967 for four warps.
    pub fn for_decode(d: usize) -> FlashConfig {
        FlashConfig { head_dim: d as u32, warps: 2, m_tiles: 1, bn: 128, q_regs: true, split: true }
    }

    /// Other decoding shapes the benchmark's sweep times: warps per block,
    /// key tiles.
    pub fn decode_sweep(d: usize) -> Vec<FlashConfig> {
        let base = FlashConfig::for_decode(d);
        [(1, 64), (2, 64), (4, 64), (1, 128)]
            .into_iter()
            .map(|(warps, bn)| FlashConfig { warps, bn, ..base })
            .filter(|c| c.check().is_ok())
            .collect()
    }

    /// Other shapes for head size `d` that the benchmark's sweep times
    /// (`COMPUTE_PTX_ATTENTION_SWEEP=1`) and the emulator tests check:
    /// row and key tiles, warps, `q` from shared memory, split waits.
    pub fn sweep(d: usize) -> Vec<FlashConfig> {
        let base = FlashConfig::for_head_dim(d);
        let mut v = Vec::new();
        for (warps, m_tiles, bn, q_regs, split) in [
            (4, 1, 64, true, false),
            (4, 1, 64, true, true),
            (4, 2, 64, false, false),
            (4, 2, 64, false, true),
            (4, 2, 64, true, false),
            (4, 2, 32, false, true),
            (8, 1, 64, true, true),
        ] {
            let cfg = FlashConfig { head_dim: d as u32, warps, m_tiles, bn, q_regs, split };
            if cfg != base && cfg.check().is_ok() {
                v.push(cfg);
            }
        }
        v
    }

    /// Whether the kernel for `f32` data ([`flash`] on `f32`) can be built
    /// in this shape: `q` read from shared memory, and twice the tiles in
    /// shared memory.
    pub fn check_f32(&self) -> Result<(), String> {
        self.check()?;
        if self.q_regs {
            return Err("f32 data reads q from shared memory (q_regs off)".into());
        }
        if self.shared_bytes(DType::F32) > 227 * 1024 {
            return Err(format!("{} bytes of shared memory", self.shared_bytes(DType::F32)));
        }
        Ok(())
    }

    /// The shape for `f32` data of head size `d`: as [`FlashConfig::for_head_dim`]
    /// with `q` read from shared memory, split waits and key tiles of 32
    /// where they split into the copies, else 64 (the tiles are twice as
    /// large in shared memory).
    pub fn for_f32(d: usize) -> FlashConfig {
        let c = FlashConfig { q_regs: false, split: true, bn: 32, ..Self::for_head_dim(d) };
        // Head sizes whose 32-key tiles do not split into the threads' copies take 64.
        if c.check_f32().is_ok() { c } else { FlashConfig { bn: 64, ..c } }
    }

    /// Whether the kernel takes head size `d`: a multiple of 16, at most 128.
    pub fn fits(d: usize) -> bool {
        d > 0 && d <= 128 && d.is_multiple_of(16)
    }

    /// Query rows per block.
    pub fn rows(&self) -> u32 {
        self.warps * 16 * self.m_tiles
    }

    /// Threads per block.
    pub fn threads(&self) -> u32 {
        self.warps * 32
    }

    /// Bytes of one shared row: the head padded to a power of two, in halves.
    fn row_bytes(&self) -> u32 {
        self.head_dim.next_power_of_two().max(16) * 2
    }

    /// Dynamic shared memory per block: the `q` tile and two stages of key
    /// and value tiles (each twice, high and low halves, for `f32` data).
    pub fn shared_bytes(&self, dtype: DType) -> u32 {
        let parts = if dtype == DType::F32 { 2 } else { 1 };
        parts * (self.rows() + 4 * self.bn) * self.row_bytes()
    }

    /// Why this shape cannot be built, if it cannot.
    pub fn check(&self) -> Result<(), String> {
        if !Self::fits(self.head_dim as usize) {
            return Err(format!("head size {}: need a multiple of 16 up to 128", self.head_dim));
        }
        if self.warps == 0 || self.warps > 8 || self.m_tiles == 0 || self.m_tiles > 2 {
            return Err(format!("{} warps of {} row tiles: need 1..=8 warps of 1 or 2", self.warps, self.m_tiles));
        }
        if self.bn == 0 || !self.bn.is_multiple_of(16) || self.bn > 128 {
            return Err(format!("key tile {}: need a multiple of 16 up to 128", self.bn));
        }
        let chunks = |rows: u32| rows * self.head_dim / 8;
        for rows in [self.rows(), self.bn] {
            if !chunks(rows).is_multiple_of(self.threads()) {
                return Err(format!("{} threads do not split a {rows}-row tile into 16-byte copies", self.threads()));
            }
        }
        if self.shared_bytes(DType::BF16) > 227 * 1024 {
            return Err(format!("{} bytes of shared memory", self.shared_bytes(DType::BF16)));
        }
        Ok(())
    }

    /// Kernel name: `attention_flash_bf16_d128` for the default shape of a
    /// head size (`attention_flash_bf16x3_d128` for `f32` data), the shape
    /// spelled out for others.
    pub fn kernel_name(&self, dtype: DType) -> String {
        let input = if dtype == DType::F32 { "bf16x3".to_string() } else { dtype.to_string() };
        let base = format!("attention_flash_{input}_d{}", self.head_dim);
        let d = self.head_dim as usize;
        let default = if dtype == DType::F32 { Self::for_f32(d) } else { Self::for_head_dim(d) };
        if *self == default {
            base
        } else {
            let q = if self.q_regs { "" } else { "_qs" };
            let split = if self.split { "_sp" } else { "" };
            format!("{base}_w{}_m{}_n{}{q}{split}", self.warps, self.m_tiles, self.bn)
        }
    }
}

/// The parameters both kernels declare, in order.
pub(crate) struct Params {
    pub(crate) q: Reg<U64>,
    pub(crate) k: Reg<U64>,
    pub(crate) v: Reg<U64>,
    pub(crate) o: Reg<U64>,
    pub(crate) rows: Reg<U32>,
    pub(crate) seq_q: Reg<U32>,
    pub(crate) seq_k: Reg<U32>,
    /// Rows per key/value head in `k` and `v` (`seq_k`, or a KV cache's capacity).
    pub(crate) kv_rows: Reg<U32>,
    pub(crate) scale_log2: Reg<F32>,
    pub(crate) vis_a: Reg<U32>,
    pub(crate) vis_b: Reg<U32>,
    /// The queries' positions (`[batch, seq_q]` f32), or 0: with them, each
    /// batch element reads `min(seq_k, trunc(p_last + 1))` keys and `vis_a`
    /// grows by that count ([`positions_args`]).
    pub(crate) positions: Reg<U64>,
}

pub(crate) const PARAM_DOC: &str = "params: q, k, v, o, rows (group * seq_q), seq_q, seq_k, kv_rows (rows per k/v head), scale_log2 (scale * log2 e), vis_a, vis_b, positions (0 or the queries' positions: keys = min(seq_k, trunc(last position + 1)), vis_a += keys)";

pub(crate) fn params(b: &mut KernelBuilder) -> Params {
    Params {
        q: b.param_ptr("q"),
        k: b.param_ptr("k"),
        v: b.param_ptr("v"),
        o: b.param_ptr("o"),
        rows: b.param::<U32>("rows"),
        seq_q: b.param::<U32>("seq_q"),
        seq_k: b.param::<U32>("seq_k"),
        kv_rows: b.param::<U32>("kv_rows"),
        scale_log2: b.param::<F32>("scale_log2"),
        vis_a: b.param::<U32>("vis_a"),
        vis_b: b.param::<U32>("vis_b"),
        positions: b.param_ptr("positions"),
    }
}

/// `(vis_a, vis_b)` for a launch whose keys are counted from the queries'
/// positions on the device: the kernel adds the count to `vis_a`, which
/// gives the end-aligned causal rule (`mask`) or all keys (no mask). `None`
/// for the start-aligned causal mask, which does not move with the count.
pub fn positions_args(mask: compute_core::Mask, seq_q: usize) -> Option<(u64, u64)> {
    match mask {
        // vis(i) = clamp(i + n + 1 − seq_q, 0, n)
        compute_core::Mask::Causal => Some((1, seq_q as u64)),
        // vis(i) = n
        compute_core::Mask::None => Some((0, 0)),
        compute_core::Mask::CausalTopLeft => None,
    }
}

/// With a positions argument, replaces `seq_k` by this batch element's key
/// count and adds it to `vis_a`: one load by every thread (the same word).
fn apply_positions(b: &mut KernelBuilder, p: &Params, batch: Reg<U32>) {
    b.comment("keys counted from the queries' positions, when given");
    let skip = b.label("no_positions");
    let none = b.setp(Cmp::Eq, p.positions, 0u64);
    b.bra_if(none, skip);
    let idx = b.mad(batch, p.seq_q, p.seq_q);
    let idx = b_sub1(b, idx);
    let off = b.mul_wide(idx, 4u32);
    let at = b.add(p.positions, off);
    let last = b.ld_global::<F32>(at, 0);
    let n = b.add(last, 1.0f32);
    // Float to integer rounds toward zero and saturates (NaN and negatives: 0).
    let n = b.cvt::<U32, F32>(n);
    let n = b.min(n, p.seq_k);
    b.assign(p.seq_k, n);
    let a = b.add(p.vis_a, n);
    b.assign(p.vis_a, a);
    b.place(skip);
}

/// Keys query position `pos` sees: `min(seq_k, max(0, pos + a − b))`.
pub(crate) fn visible(b: &mut KernelBuilder, p: &Params, pos: Reg<U32>) -> Reg<U32> {
    let t = b.add(pos, p.vis_a);
    let over = b.setp(Cmp::Gt, t, p.vis_b);
    let d = b.sub(t, p.vis_b);
    let d = b.min(d, p.seq_k);
    b.selp(d, 0u32, over)
}

/// Byte offsets of this (batch, key/value head)'s `q`/`o` rows and `k`/`v`
/// rows: `(batch·heads_kv + y)·rows·d·elem` and `(batch·heads_kv + y)·kv_rows·d·elem`
/// (a KV cache holds `kv_rows ≥ seq_k` rows per head, of which the first
/// `seq_k` are read). First, with a positions argument, sets this batch
/// element's key count ([`Params::positions`]).
pub(crate) fn head_offsets(
    b: &mut KernelBuilder,
    p: &Params,
    d: u32,
    elem: u32,
    batch: Reg<U32>,
) -> (Reg<U64>, Reg<U64>) {
    apply_positions(b, p, batch);
    let y = b.ctaid(Dim::Y);
    let ny = b.nctaid(Dim::Y);
    let head = b.mad(batch, ny, y);
    let head = b.cvt::<U64, U32>(head);
    let rows = b.cvt::<U64, U32>(p.rows);
    let qo = b.mul(head, rows);
    let qo = b.mul(qo, u64::from(d * elem));
    let sk = b.cvt::<U64, U32>(p.kv_rows);
    let kv = b.mul(head, sk);
    let kv = b.mul(kv, u64::from(d * elem));
    (qo, kv)
}

/// Builds the `f32` attention kernel for head size `d` (1..=[`SIMT_MAX_HEAD_DIM`]).
///
/// Launch: [`SIMT_ROWS`]·32 threads, grid `(ceil(rows / SIMT_ROWS), heads_kv,
/// batch)`, no dynamic shared memory.
pub fn simt(d: u32, target: Target) -> Result<Kernel, BuildError> {
    let name = format!("attention_simt_f32_d{d}");
    if d == 0 || d as usize > SIMT_MAX_HEAD_DIM {
        return Err(BuildError { kernel: name, problems: vec![format!("head size {d}: need 1..=256")] });
    }
    let per_lane = d.div_ceil(32);
    let threads = SIMT_ROWS * 32;
    let mut b = KernelBuilder::new(&name, target);
    b.doc(&format!("{name}: fused attention on f32, one warp per query row, keys 32 at a time"));
    b.doc(PARAM_DOC);
    b.doc(&format!("launch: {threads} threads, grid (ceil(rows/{SIMT_ROWS}), heads_kv, batch)"));
    b.max_threads(threads);
    let p = params(&mut b);
    let stride = d.next_multiple_of(4);
    let smem = b.shared("qrows", SIMT_ROWS * stride * 4, 16);
    let sbase = b.shared_base(&smem);
    let tid = b.tid(Dim::X);
    let lane = b.and(tid, 31u32);
    let warp = b.shr(tid, 5u32);
    let cx = b.ctaid(Dim::X);
    let row = b.mad(cx, SIMT_ROWS, warp);
    let live = b.setp(Cmp::Lt, row, p.rows);
    let z = b.ctaid(Dim::Z);
    let (qo, kvo) = head_offsets(&mut b, &p, d, 4, z);
    let qh = b.add(p.q, qo);
    let oh = b.add(p.o, qo);
    let kh = b.add(p.k, kvo);
    let vh = b.add(p.v, kvo);
    let last_row = b_sub1(&mut b, p.rows);
    let row_c = b.min(row, last_row);
    let roff = b.mul_wide(row_c, d * 4);
    let qrow = b.add(qh, roff);
    let orow = b.add(oh, roff);

    b.comment("the warp's query row into shared memory (zeros past the last row)");
    let my_s = b.mul(warp, stride * 4);
    let my_s = b.add(my_s, sbase);
    for t in 0..per_lane {
        let c = b.add(lane, t * 32);
        let inside = b.setp(Cmp::Lt, c, d);
        let ok = b.and_pred(inside, live);
        let cc = b.min(c, d - 1);
        let off = b.mul_wide(cc, 4u32);
        let at = b.add(qrow, off);
        let x = b.ld_global_nc::<F32>(at, 0);
        let x = b.selp(x, 0.0f32, ok);
        let soff = b.shl(c, 2u32);
        let sa = b.add(my_s, soff);
        b.guarded(inside, false, |b| b.st_shared::<F32>(sa, 0, x));
    }
    b.bar_sync();
    let done = b.label("done");
    b.bra_unless(live, done);

    let pos = b.rem(row, p.seq_q);
    let vis = visible(&mut b, &p, pos);
    let vis_last = b_sub1(&mut b, vis);
    let neg_inf = f32::NEG_INFINITY;
    let m = b.mov(neg_inf);
    let l = b.mov(0.0f32);
    let acc: Vec<Reg<F32>> = (0..per_lane).map(|_| b.mov(0.0f32)).collect();
    let j0 = b.mov(0u32);
    let top = b.label("keys");
    let exit = b.label("keys_done");
    b.place(top);
    let over = b.setp(Cmp::Ge, j0, vis);
    b.bra_if(over, exit);
    {
        b.comment("lane j: the score of key j0 + j");
        let j = b.add(j0, lane);
        let ok = b.setp(Cmp::Lt, j, vis);
        let jc = b.min(j, vis_last);
        let koff = b.mul_wide(jc, d * 4);
        let krow = b.add(kh, koff);
        let mut dot = b.mov(0.0f32);
        let mut c = 0u32;
        while c < d {
            if d - c >= 4 && d.is_multiple_of(4) {
                let qv = b.ld_shared_v::<F32, 4>(my_s, i64::from(c * 4));
                let kv = b.ld_global_nc_v::<F32, 4>(krow, i64::from(c * 4));
                for e in 0..4 {
                    dot = b.fma(qv[e], kv[e], dot);
                }
                c += 4;
            } else {
                let qv = b.ld_shared::<F32>(my_s, i64::from(c * 4));
                let kv = b.ld_global_nc::<F32>(krow, i64::from(c * 4));
                dot = b.fma(qv, kv, dot);
                c += 1;
            }
        }
        let x = b.mul(dot, p.scale_log2);
        let x = b.selp(x, neg_inf, ok);
        let mut mx = x;
        for s in [16u32, 8, 4, 2, 1] {
            let o = b.shfl_bfly(mx, s);
            mx = b.max(mx, o);
        }
        let (m_use, alpha) = rescale(&mut b, m, mx);
        let xs = b.sub(x, m_use);
        let pj = b.ex2_approx(xs);
        let l2 = b.fma(l, alpha, pj);
        b.assign(l, l2);
        for &a in &acc {
            let a2 = b.mul(a, alpha);
            b.assign(a, a2);
        }
        b.comment("acc += p_j * v_j over the 32 keys (lane c owns columns c, c+32, ...)");
        let ccols: Vec<Reg<U64>> = (0..per_lane)
            .map(|t| {
                let c = b.add(lane, t * 32);
                let cc = b.min(c, d - 1);
                b.mul_wide(cc, 4u32)
            })
            .collect();
        for jj in 0..32u32 {
            let pv = b.shfl_idx(pj, jj);
            let kj = b.add(j0, jj);
            let kj = b.min(kj, vis_last);
            let voff = b.mul_wide(kj, d * 4);
            let vrow = b.add(vh, voff);
            for (t, &a) in acc.iter().enumerate() {
                let at = b.add(vrow, ccols[t]);
                let vv = b.ld_global_nc::<F32>(at, 0);
                b.fma_acc(a, pv, vv);
            }
        }
        let nj = b.add(j0, 32u32);
        b.assign(j0, nj);
    }
    b.bra(top);
    b.place(exit);
    let mut lt = l;
    for s in [16u32, 8, 4, 2, 1] {
        let o = b.shfl_bfly(lt, s);
        lt = b.add(lt, o);
    }
    let inv = inverse_or_zero(&mut b, lt);
    for (t, &a) in acc.iter().enumerate() {
        let c = b.add(lane, t as u32 * 32);
        let inside = b.setp(Cmp::Lt, c, d);
        let y = b.mul(a, inv);
        let off = b.mul_wide(c, 4u32);
        let at = b.add(orow, off);
        b.guarded(inside, false, |b| b.st_global::<F32>(at, 0, y));
    }
    b.place(done);
    b.ret();
    b.finish()
}

/// The first query row of this block: row tiles run heaviest first (tile
/// `nctaid.x − 1 − ctaid.x`: under a causal mask the last rows see the most keys).
pub(crate) fn block_rows(b: &mut KernelBuilder, bm: u32) -> Reg<U32> {
    let cx = b.ctaid(Dim::X);
    let nx = b.nctaid(Dim::X);
    let tile = b.sub(nx, cx);
    let tile = b_sub1(b, tile);
    b.mul(tile, bm)
}

/// The key tiles of `bn` the block's rows `[m0, m0 + bm)` (clipped to the
/// rows) need: `(tiles every row sees in full, tiles any row sees)`, from
/// the visible keys of its first and last query positions (all positions
/// when the block spans two heads of a group).
pub(crate) fn block_key_tiles(
    b: &mut KernelBuilder,
    p: &Params,
    (m0, bm): (Reg<U32>, u32),
    bn: u32,
) -> (Reg<U32>, Reg<U32>) {
    b.comment("keys the block's first and last query positions see");
    let r_end = b.add(m0, bm);
    let r_end = b.min(r_end, p.rows);
    let r_last = b_sub1(b, r_end);
    let h0 = b.div(m0, p.seq_q);
    let h1 = b.div(r_last, p.seq_q);
    let same = b.setp(Cmp::Eq, h0, h1);
    let p0 = b.rem(m0, p.seq_q);
    let p1 = b.rem(r_last, p.seq_q);
    let last_pos = b_sub1(b, p.seq_q);
    let pmin = b.selp(p0, 0u32, same);
    let pmax = b.selp(p1, last_pos, same);
    let vis_min = visible(b, p, pmin);
    let vis_max = visible(b, p, pmax);
    let n_full = b.div(vis_min, bn);
    let vm = b.add(vis_max, bn - 1);
    (n_full, b.div(vm, bn))
}

/// The two key-tile loops: tile `kb` (advanced by `body`) runs `body(b,
/// false)` while below `n_full` (every row sees the tile in full), then
/// `body(b, true)` (masked) while below `n_blocks`.
pub(crate) fn key_tile_loops(
    b: &mut KernelBuilder,
    kb: Reg<U32>,
    (n_full, n_blocks): (Reg<U32>, Reg<U32>),
    body: impl Fn(&mut KernelBuilder, bool),
) {
    for (masked, end) in [(false, n_full), (true, n_blocks)] {
        let top = b.label(if masked { "masked_tiles" } else { "full_tiles" });
        let exit = b.label(if masked { "masked_done" } else { "full_done" });
        b.place(top);
        let over = b.setp(Cmp::Ge, kb, end);
        b.bra_if(over, exit);
        body(b, masked);
        b.bra(top);
        b.place(exit);
    }
}

/// `x − 1` (wrapping; callers use it where `x ≥ 1` or clamp with it).
pub(crate) fn b_sub1(b: &mut KernelBuilder, x: Reg<U32>) -> Reg<U32> {
    let one = b.min(x, 1u32);
    b.sub(x, one)
}

/// The online-softmax step for a row whose running maximum is `m` (updated
/// in place) and whose new scores have maximum `mx` (both in log₂ units):
/// returns the base to subtract from the scores (`m_new`, or 0 while every
/// score seen is −∞) and the factor on the running sum and accumulator.
pub(crate) fn rescale(b: &mut KernelBuilder, m: Reg<F32>, mx: Reg<F32>) -> (Reg<F32>, Reg<F32>) {
    let m_new = b.max(m, mx);
    let none = b.setp(Cmp::Eq, m_new, f32::NEG_INFINITY);
    let m_use = b.selp(0.0f32, m_new, none);
    let d = b.sub(m, m_use);
    let alpha = b.ex2_approx(d);
    b.assign(m, m_new);
    (m_use, alpha)
}

/// `1/l`, or 0 where `l = 0` (a row that saw no key).
pub(crate) fn inverse_or_zero(b: &mut KernelBuilder, l: Reg<F32>) -> Reg<F32> {
    let pos = b.setp(Cmp::Gt, l, 0.0f32);
    let safe = b.selp(l, 1.0f32, pos);
    let inv = b.rcp(safe);
    b.selp(inv, 0.0f32, pos)
}

/// One thread's 16-byte copies of a tile (rows of `d` halves into swizzled
/// shared rows). Copy `i` is row `r0 + i·step` (plus an immediate when the
/// threads cover whole rows) at chunk `c`; its shared offset is a register
/// per distinct swizzle (they repeat every `period` copies) plus an immediate.
pub(crate) struct TileCopies {
    pub(crate) copies: Vec<Copy16>,
    /// Whether every copy's row register is the same (`r0`).
    pub(crate) one_row: bool,
}

/// One 16-byte copy of a tile: its row (a register plus an immediate), its
/// first element within the row (`8·chunk`), and its shared offset (a
/// register plus an immediate).
#[derive(Clone, Copy)]
pub(crate) struct Copy16 {
    pub(crate) row: (Reg<U32>, u32),
    pub(crate) chunk8: Reg<U32>,
    pub(crate) dst: (Reg<U32>, u32),
}

fn tile_copies(b: &mut KernelBuilder, cfg: &FlashConfig, tid: Reg<U32>, rows: u32) -> TileCopies {
    let cpr_used = cfg.head_dim / 8;
    let cpr = cfg.row_bytes() / 16;
    let threads = cfg.threads();
    let n = rows * cpr_used / threads;
    let mut copies = Vec::new();
    let one_row = threads.is_multiple_of(cpr_used);
    if one_row {
        // Each thread keeps one chunk; its rows step by threads / cpr_used.
        let step = threads / cpr_used;
        let r0 = b.div(tid, cpr_used);
        let c = b.rem(tid, cpr_used);
        let c8 = b.shl(c, 3u32);
        // The swizzle depends on the row through (row / per_line) mod 8 (at most).
        let per_line = (8 / cpr).max(1);
        let cycle = 8 * per_line;
        let period = cycle / gcd(step, cycle);
        let mut dst_regs = Vec::new();
        for i in 0..n.min(period) {
            let r = b.add(r0, i * step);
            let pc = super::gemm_common::swizzle_reg(b, r, c, cpr);
            let pc16 = b.shl(pc, 4u32);
            dst_regs.push(b.mad(r, cfg.row_bytes(), pc16));
        }
        for i in 0..n {
            let base = i - i % period;
            let dst = (dst_regs[(i % period) as usize], base * step * cfg.row_bytes());
            copies.push(Copy16 { row: (r0, i * step), chunk8: c8, dst });
        }
    } else {
        for i in 0..n {
            let idx = b.add(tid, i * threads);
            let r = b.div(idx, cpr_used);
            let c = b.rem(idx, cpr_used);
            let pc = super::gemm_common::swizzle_reg(b, r, c, cpr);
            let pc16 = b.shl(pc, 4u32);
            let dst = b.mad(r, cfg.row_bytes(), pc16);
            copies.push(Copy16 { row: (r, 0), chunk8: b.shl(c, 3u32), dst: (dst, 0) });
        }
    }
    TileCopies { copies, one_row }
}

pub(crate) fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// Issues a tile's copies: rows `first + row` of the matrix at `base`
/// (`limit` rows, `d` halves each) into shared memory at `at + dst`; rows
/// past `limit` are zero-filled.
pub(crate) fn issue_tile(
    b: &mut KernelBuilder,
    t: &TileCopies,
    (base, d): (Reg<U64>, u32),
    (first, limit): (Reg<U32>, Reg<U32>),
    at: Reg<U32>,
) {
    let last = b_sub1(b, limit);
    let first_r0 = if t.one_row { t.copies.first().map(|c| b.add(first, c.row.0)) } else { None };
    for &Copy16 { row: (r, r_imm), chunk8: c8, dst: (dst, dst_imm) } in &t.copies {
        let row = match first_r0 {
            Some(fr) => b.add(fr, r_imm),
            None => b.add(first, r),
        };
        let inside = b.setp(Cmp::Lt, row, limit);
        let bytes = b.selp(16u32, 0u32, inside);
        let rc = b.min(row, last);
        let elem = b.mad(rc, d, c8);
        let off = b.mul_wide(elem, 2u32);
        let src = b.add(base, off);
        let dst = b.add(at, dst);
        b.cp_async_16(dst, i64::from(dst_imm), src, 0, Some(bytes.into()));
    }
}

/// `ldmatrix` addresses of one operand: per lane, its row within a 16-row
/// group (`lrow`, with the row base of its warp added) and its chunk bit
/// (`lchunk`); fragments at constant row and chunk offsets then differ by
/// an immediate, except the low chunk bits the swizzle mixes, which get a
/// register each.
struct FragAddrs {
    regs: Vec<(u32, Reg<U32>)>,
    row_bytes: u32,
    mask: u32,
}

impl FragAddrs {
    fn new(
        b: &mut KernelBuilder,
        cfg: &FlashConfig,
        (lrow, lchunk): (Reg<U32>, Reg<U32>),
        row_base: Option<Reg<U32>>,
        lows: &[u32],
        base: Reg<U32>,
    ) -> FragAddrs {
        let cpr = cfg.row_bytes() / 16;
        let mask = cpr.min(8) - 1;
        let row = match row_base {
            Some(r) => b.add(r, lrow),
            None => lrow,
        };
        // The swizzle of `row` depends on `lrow` only (row bases are multiples of 16).
        let zero = b.mov(0u32);
        let s = super::gemm_common::swizzle_reg(b, lrow, zero, cpr);
        let x = b.xor(s, lchunk);
        let roff = b.mad(row, cfg.row_bytes(), base);
        let regs = lows
            .iter()
            .map(|&low| {
                let c = b.xor(x, low);
                let c16 = b.shl(c, 4u32);
                (low, b.add(roff, c16))
            })
            .collect();
        FragAddrs { regs, row_bytes: cfg.row_bytes(), mask }
    }

    /// The register and immediate of the fragment at row `r` (a multiple of
    /// 16) and logical chunk `c` (even).
    fn at(&self, r: u32, c: u32) -> (Reg<U32>, i64) {
        let low = c & self.mask;
        let reg = self.regs.iter().find(|(l, _)| *l == low).map_or(self.regs[0].1, |(_, r)| *r);
        (reg, i64::from(r * self.row_bytes + (c - low) * 16))
    }

    /// The same addresses moved by `off` bytes (a stage's offset).
    fn moved(&self, b: &mut KernelBuilder, off: Reg<U32>) -> FragAddrs {
        let regs = self.regs.iter().map(|&(l, r)| (l, b.add(r, off))).collect();
        FragAddrs { regs, row_bytes: self.row_bytes, mask: self.mask }
    }
}

/// The distinct low chunk values (`c & mask`) of even chunks `0, 2, …` below `chunks`.
fn low_chunks(cfg: &FlashConfig, chunks: u32) -> Vec<u32> {
    let mask = (cfg.row_bytes() / 16).min(8) - 1;
    let mut v: Vec<u32> = (0..chunks).step_by(2).map(|c| c & mask).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Builds the tensor-core attention kernel for `f16` or `bf16` data.
///
/// Launch: [`FlashConfig::threads`] threads, grid `(ceil(rows / cfg.rows()),
/// heads_kv, batch)`, [`FlashConfig::shared_bytes`] of dynamic shared memory.
pub fn flash(cfg: &FlashConfig, dtype: DType, target: Target) -> Result<Kernel, BuildError> {
    flash_kernel(cfg, dtype, false, target)
}

/// Builds the key-split form of [`flash`] (flash-decoding): grid
/// `(ceil(rows / cfg.rows()), heads_kv, batch · splits)`; block `z` takes key
/// tiles `[s·tiles_per_split, (s + 1)·tiles_per_split)` of split `s = z mod
/// splits` and writes its normalised partial output (`f32`, into `o`, laid
/// out `[splits, batch·heads_kv, rows, d]`) and its rows' log-sum-exp in
/// base 2 (`lse`, `[splits, batch·heads_kv, rows]`, −∞ for no key), which
/// [`combine`] merges. Extra params after the common ones: `lse`,
/// `tiles_per_split`, `splits`.
pub fn flash_split(cfg: &FlashConfig, dtype: DType, target: Target) -> Result<Kernel, BuildError> {
    flash_kernel(cfg, dtype, true, target)
}

fn flash_kernel(cfg: &FlashConfig, dtype: DType, split_keys: bool, target: Target) -> Result<Kernel, BuildError> {
    let name = if split_keys { format!("{}_split", cfg.kernel_name(dtype)) } else { cfg.kernel_name(dtype) };
    let fail = |p: String| Err(BuildError { kernel: name.clone(), problems: vec![p] });
    let three = dtype == DType::F32;
    if let Err(e) = if three { cfg.check_f32() } else { cfg.check() } {
        return fail(e);
    }
    let half = match dtype {
        DType::F16 => Half::F16,
        DType::BF16 | DType::F32 => Half::Bf16,
        other => return fail(format!("tensor-core attention reads f16, bf16 or f32 split in bf16, not {other}")),
    };
    let FlashConfig { head_dim: d, m_tiles, bn, q_regs, split, .. } = *cfg;
    let (bm, threads, rb) = (cfg.rows(), cfg.threads(), cfg.row_bytes());
    let (ks_n, nt_n, nd_n) = (d / 16, bn / 8, d / 8);
    // f32 data: each tile twice, its bf16 high and low parts; per stage [k][v][k lo][v lo].
    let parts = if three { 2 } else { 1 };
    let (q_at, k_at) = (0u32, parts * bm * rb);
    let v_at = k_at + bn * rb;
    let (q_lo, kv_lo) = (bm * rb, 2 * bn * rb);
    let stage_bytes = 2 * parts * bn * rb;

    let mut b = KernelBuilder::new(&name, target);
    if three {
        b.doc(&format!(
            "{name}: fused attention on f32 q/k/v/o as bf16 high and low parts (a*b = ah*bh + ah*bl + al*bh), mma.sync.m16n8k16"
        ));
    } else {
        b.doc(&format!("{name}: fused attention, {dtype} q/k/v/o, f32 softmax and accumulation, mma.sync.m16n8k16"));
    }
    b.doc(&format!(
        "{bm} query rows per block ({} warps x {m_tiles} row tiles), key tiles of {bn}, 2 cp.async stages",
        cfg.warps
    ));
    b.doc(PARAM_DOC);
    b.doc(&format!(
        "launch: {threads} threads, grid (ceil(rows/{bm}), heads_kv, batch), {} bytes of dynamic shared memory",
        cfg.shared_bytes(dtype)
    ));
    b.max_threads(threads);
    let p = params(&mut b);
    // f32 data: q, k, v point at the high parts; the low parts follow at these byte offsets.
    let lo_offsets = if three {
        b.doc("f32 form: q, k, v are the bf16 high parts; extra params q_lo, kv_lo (byte offsets of the low parts)");
        Some((b.param::<U64>("q_lo"), b.param::<U64>("kv_lo")))
    } else {
        None
    };
    let splits_p = if split_keys {
        b.doc("key-split form: o is the f32 partial buffer; extra params lse, tiles_per_split, splits");
        Some((b.param_ptr("lse"), b.param::<U32>("tiles_per_split"), b.param::<U32>("splits")))
    } else {
        None
    };
    let smem = b.dynamic_shared("tiles", 128);
    let sbase = b.shared_base(&smem);
    let tid = b.tid(Dim::X);
    let lane = b.and(tid, 31u32);
    let warp = b.shr(tid, 5u32);
    let g = b.shr(lane, 2u32);
    let t4 = b.and(lane, 3u32);

    let m0 = block_rows(&mut b, bm);
    let z = b.ctaid(Dim::Z);
    let (batch, key_split) = match splits_p {
        Some((_, _, splits)) => (b.div(z, splits), Some(b.rem(z, splits))),
        None => (z, None),
    };
    let (qo, kvo) = head_offsets(&mut b, &p, d, 2, batch);
    let qh = b.add(p.q, qo);
    // f32 output: twice the bytes of the bf16 parts' offset.
    let oo = if three { b.shl(qo, 1u32) } else { qo };
    let oh = b.add(p.o, oo);
    let kh = b.add(p.k, kvo);
    let vh = b.add(p.v, kvo);

    let (n_full, n_blocks) = block_key_tiles(&mut b, &p, (m0, bm), bn);
    // The key split's tiles: [start, end) of the n_blocks, the first n_full unmasked.
    let (start, n_full, n_blocks) = match (splits_p, key_split) {
        (Some((_, tps, _)), Some(sp)) => {
            let start = b.mul(sp, tps);
            let end = b.add(start, tps);
            let end = b.min(end, n_blocks);
            let full = b.min(n_full, end);
            (start, full, end)
        }
        _ => (b.mov(0u32), n_full, n_blocks),
    };

    b.comment("copies: q once, then key and value tiles into two stages");
    let q_cp = tile_copies(&mut b, cfg, tid, bm);
    let kv_cp = tile_copies(&mut b, cfg, tid, bn);
    let q_dst = b.add(sbase, q_at);
    issue_tile(&mut b, &q_cp, (qh, d), (m0, p.rows), q_dst);
    // The low parts' tiles: the same copies from base + offset into tile + delta.
    let lo_ptr = |b: &mut KernelBuilder, base: Reg<U64>, kv: bool| -> Option<Reg<U64>> {
        lo_offsets.map(|(ql, kvl)| b.add(base, if kv { kvl } else { ql }))
    };
    if let Some(ql) = lo_ptr(&mut b, qh, false) {
        let dst = b.add(q_dst, q_lo);
        issue_tile(&mut b, &q_cp, (ql, d), (m0, p.rows), dst);
    }
    let (kh_lo, vh_lo) = (lo_ptr(&mut b, kh, true), lo_ptr(&mut b, vh, true));
    let issue_kv = |b: &mut KernelBuilder, (hi, lo): (Reg<U64>, Option<Reg<U64>>), first: Reg<U32>, dst: Reg<U32>| {
        issue_tile(b, &kv_cp, (hi, d), (first, p.seq_k), dst);
        if let Some(lo) = lo {
            let dl = b.add(dst, kv_lo);
            issue_tile(b, &kv_cp, (lo, d), (first, p.seq_k), dl);
        }
    };
    let first_key = b.mul(start, bn);
    let any = b.setp(Cmp::Gt, n_blocks, start);
    let k0 = b.add(sbase, k_at);
    let v0 = b.add(sbase, v_at);
    let skip_first = b.label("no_first_tile");
    b.bra_unless(any, skip_first);
    let k_first = b.and(start, 1u32);
    let k_first = b.mul(k_first, stage_bytes);
    let k_first = b.add(k0, k_first);
    issue_kv(&mut b, (kh, kh_lo), first_key, k_first);
    let v_first = b.sub(k_first, k0);
    let v_first = b.add(v0, v_first);
    if split {
        b.place(skip_first);
        b.cp_async_commit();
        let skip_v = b.label("no_first_values");
        b.bra_unless(any, skip_v);
        issue_kv(&mut b, (vh, vh_lo), first_key, v_first);
        b.place(skip_v);
    } else {
        issue_kv(&mut b, (vh, vh_lo), first_key, v_first);
        b.place(skip_first);
    }
    b.cp_async_commit();

    b.comment("this lane's rows: per row tile, g and g + 8; their visible keys");
    let wrow = b.mul(warp, 16 * m_tiles);
    let mut vis_rows = Vec::new();
    for mi in 0..m_tiles {
        for h in 0..2u32 {
            let r = b.add(m0, wrow);
            let r = b.add(r, g);
            let r = b.add(r, mi * 16 + h * 8);
            let pos = b.rem(r, p.seq_q);
            vis_rows.push(visible(&mut b, &p, pos));
        }
    }

    b.comment("ldmatrix lanes: q as A (k-contiguous), k as B stored n x k, v as B stored k x n (.trans)");
    let l7 = b.and(lane, 7u32);
    let bit3 = b.shr(lane, 3u32);
    let bit3 = b.and(bit3, 1u32);
    let bit4 = b.shr(lane, 4u32);
    let q_lanes = (b.and(lane, 15u32), bit4);
    let k_lanes = {
        let hi = b.shl(bit4, 3u32);
        (b.add(l7, hi), bit3)
    };
    let v_lanes = {
        let hi = b.shl(bit3, 3u32);
        (b.add(l7, hi), bit4)
    };
    let q_fr = FragAddrs::new(&mut b, cfg, q_lanes, Some(wrow), &low_chunks(cfg, 2 * ks_n), q_dst);
    // k and v addresses are relative to stage 0; each tile adds its stage's offset.
    let k_fr = FragAddrs::new(&mut b, cfg, k_lanes, None, &low_chunks(cfg, 2 * ks_n), k0);
    let v_fr = FragAddrs::new(&mut b, cfg, v_lanes, None, &low_chunks(cfg, nd_n), v0);

    b.comment("q fragments once its copy has landed (into registers, or read per key tile)");
    b.cp_async_wait(u32::from(split));
    b.bar_sync();
    let load_q = |b: &mut KernelBuilder, mi: u32, ks: u32| {
        let (r, off) = q_fr.at(mi * 16, 2 * ks);
        b.ldmatrix_x4(r, off, false)
    };
    let load_q_lo = |b: &mut KernelBuilder, mi: u32, ks: u32| {
        let (r, off) = q_fr.at(mi * 16, 2 * ks);
        b.ldmatrix_x4(r, off + i64::from(q_lo), false)
    };
    let qf: Vec<Vec<[Reg<B32>; 4]>> = if q_regs {
        (0..m_tiles).map(|mi| (0..ks_n).map(|ks| load_q(&mut b, mi, ks)).collect()).collect()
    } else {
        Vec::new()
    };

    let neg_inf = f32::NEG_INFINITY;
    let zero4: [Reg<F32>; 4] = std::array::from_fn(|_| b.mov(0.0f32));
    let m_run: Vec<Reg<F32>> = (0..2 * m_tiles).map(|_| b.mov(neg_inf)).collect();
    let l_run: Vec<Reg<F32>> = (0..2 * m_tiles).map(|_| b.mov(0.0f32)).collect();
    let o_acc: Vec<[Reg<F32>; 4]> = (0..m_tiles * nd_n).map(|_| std::array::from_fn(|_| b.mov(0.0f32))).collect();
    let kb = b.mov(start);
    let cols0 = b.shl(t4, 1u32);

    // One key tile: wait for it, put the next in flight, multiply, softmax, accumulate.
    let body = |b: &mut KernelBuilder, masked: bool| {
        // With split waits, one group of keys and one of values per tile; else one of both.
        b.cp_async_wait(u32::from(split));
        b.bar_sync();
        let next = b.add(kb, 1u32);
        let more = b.setp(Cmp::Lt, next, n_blocks);
        let nstage = b.and(next, 1u32);
        let noff = b.mul(nstage, stage_bytes);
        let first = b.mul(next, bn);
        let skip = b.label("no_next_keys");
        b.bra_unless(more, skip);
        let kd = b.add(k0, noff);
        issue_kv(b, (kh, kh_lo), first, kd);
        if !split {
            let vd = b.add(v0, noff);
            issue_kv(b, (vh, vh_lo), first, vd);
        }
        b.place(skip);
        b.cp_async_commit();

        let stage = b.and(kb, 1u32);
        let soff = b.mul(stage, stage_bytes);
        b.comment("S = q k^T");
        let mut s_acc: Vec<[Reg<F32>; 4]> = Vec::new();
        let mut s_init = vec![false; (m_tiles * nt_n) as usize];
        s_acc.resize((m_tiles * nt_n) as usize, zero4);
        let k_at_stage = k_fr.moved(b, soff);
        for ks in 0..ks_n {
            let q_ks: Vec<[Reg<B32>; 4]> =
                (0..m_tiles).map(|mi| if q_regs { qf[mi as usize][ks as usize] } else { load_q(b, mi, ks) }).collect();
            let q_ks_lo: Vec<[Reg<B32>; 4]> =
                if three { (0..m_tiles).map(|mi| load_q_lo(b, mi, ks)).collect() } else { Vec::new() };
            for nj in 0..nt_n / 2 {
                let (r, off) = k_at_stage.at(nj * 16, 2 * ks);
                let x4 = b.ldmatrix_x4(r, off, false);
                let x4_lo = if three { Some(b.ldmatrix_x4(r, off + i64::from(kv_lo), false)) } else { None };
                for mi in 0..m_tiles {
                    for half_i in 0..2usize {
                        let pair = [x4[2 * half_i], x4[2 * half_i + 1]];
                        let i = (mi * nt_n + 2 * nj + half_i as u32) as usize;
                        if s_init[i] {
                            b.mma_m16n8k16_acc(half, s_acc[i], q_ks[mi as usize], pair);
                        } else {
                            s_acc[i] = b.mma_m16n8k16(half, q_ks[mi as usize], pair, zero4);
                            s_init[i] = true;
                        }
                        if let Some(lo) = x4_lo {
                            // qh·kl + ql·kh: the low parts' products (ql·kl is below f32's rounding).
                            let pair_lo = [lo[2 * half_i], lo[2 * half_i + 1]];
                            b.mma_m16n8k16_acc(half, s_acc[i], q_ks[mi as usize], pair_lo);
                            b.mma_m16n8k16_acc(half, s_acc[i], q_ks_lo[mi as usize], pair);
                        }
                    }
                }
            }
        }
        b.comment(if masked { "online softmax, keys past each row's limit masked" } else { "online softmax" });
        let key0 = b.mul(kb, bn);
        let key0 = b.add(key0, cols0);
        let mut p_frag: Vec<Vec<[Reg<B32>; 4]>> = Vec::new();
        let mut p_frag_lo: Vec<Vec<[Reg<B32>; 4]>> = Vec::new();
        for mi in 0..m_tiles {
            let mut xs: Vec<[Reg<F32>; 4]> = Vec::new();
            for nt in 0..nt_n {
                let s = s_acc[(mi * nt_n + nt) as usize];
                let x: [Reg<F32>; 4] = std::array::from_fn(|e| {
                    let x = b.mul(s[e], p.scale_log2);
                    if !masked {
                        return x;
                    }
                    let h = (e / 2) as u32;
                    let col = b.add(key0, nt * 8 + (e % 2) as u32);
                    let ok = b.setp(Cmp::Lt, col, vis_rows[(mi * 2 + h) as usize]);
                    b.selp(x, neg_inf, ok)
                });
                xs.push(x);
            }
            let mut probs: Vec<[Reg<F32>; 4]> = xs.clone();
            for h in 0..2usize {
                let ri = (mi as usize) * 2 + h;
                let mut mx = xs[0][2 * h];
                for x in &xs {
                    mx = b.max(mx, x[2 * h]);
                    mx = b.max(mx, x[2 * h + 1]);
                }
                for s in [1u32, 2] {
                    let o = b.shfl_bfly(mx, s);
                    mx = b.max(mx, o);
                }
                let (m_use, alpha) = rescale(b, m_run[ri], mx);
                let mut sum = b.mov(0.0f32);
                for (nt, x) in xs.iter().enumerate() {
                    for e in [2 * h, 2 * h + 1] {
                        let d = b.sub(x[e], m_use);
                        let pv = b.ex2_approx(d);
                        probs[nt][e] = pv;
                        sum = b.add(sum, pv);
                    }
                }
                let l2 = b.fma(l_run[ri], alpha, sum);
                b.assign(l_run[ri], l2);
                for nd in 0..nd_n {
                    let acc = o_acc[(mi * nd_n + nd) as usize];
                    for e in [2 * h, 2 * h + 1] {
                        let a2 = b.mul(acc[e], alpha);
                        b.assign(acc[e], a2);
                    }
                }
            }
            let mut lows = Vec::new();
            let frags: Vec<[Reg<B32>; 4]> = (0..nt_n / 2)
                .map(|kk| {
                    let (a, c) = (probs[(2 * kk) as usize], probs[(2 * kk + 1) as usize]);
                    let pairs = [(a[0], a[1]), (a[2], a[3]), (c[0], c[1]), (c[2], c[3])];
                    let w = pairs.map(|(x, y)| b.f32_pair_to_half(x, y, half));
                    if three {
                        // The low parts: p - bf16(p), rounded to bf16 again.
                        let lo: [Reg<U32>; 4] = std::array::from_fn(|j| {
                            let [hx, hy] = b.half_pair_to_f32(w[j], half);
                            let (x, y) = pairs[j];
                            let dx = b.sub(x, hx);
                            let dy = b.sub(y, hy);
                            b.f32_pair_to_half(dx, dy, half)
                        });
                        lows.push(lo.map(|r| b.bitcast::<B32, U32>(r)));
                    }
                    w.map(|r| b.bitcast::<B32, U32>(r))
                })
                .collect();
            p_frag.push(frags);
            p_frag_lo.push(lows);
        }
        if split {
            b.comment("this tile's values: wait, then put the next tile's in flight");
            b.cp_async_wait(1);
            b.bar_sync();
            let skip = b.label("no_next_values");
            b.bra_unless(more, skip);
            let vd = b.add(v0, noff);
            issue_kv(b, (vh, vh_lo), first, vd);
            b.place(skip);
            b.cp_async_commit();
        }
        b.comment("O += P v");
        let v_at_stage = v_fr.moved(b, soff);
        for kk in 0..nt_n / 2 {
            for ndp in 0..nd_n / 2 {
                let (r, off) = v_at_stage.at(kk * 16, 2 * ndp);
                let x4 = b.ldmatrix_x4(r, off, true);
                let x4_lo = if three { Some(b.ldmatrix_x4(r, off + i64::from(kv_lo), true)) } else { None };
                for mi in 0..m_tiles {
                    for half_i in 0..2usize {
                        let pair = [x4[2 * half_i], x4[2 * half_i + 1]];
                        let acc = o_acc[(mi * nd_n + 2 * ndp + half_i as u32) as usize];
                        let pf = p_frag[mi as usize][kk as usize];
                        b.mma_m16n8k16_acc(half, acc, pf, pair);
                        if let Some(lo) = x4_lo {
                            let pair_lo = [lo[2 * half_i], lo[2 * half_i + 1]];
                            b.mma_m16n8k16_acc(half, acc, pf, pair_lo);
                            b.mma_m16n8k16_acc(half, acc, p_frag_lo[mi as usize][kk as usize], pair);
                        }
                    }
                }
            }
        }
        let nk = b.add(kb, 1u32);
        b.assign(kb, nk);
    };
    key_tile_loops(&mut b, kb, (n_full, n_blocks), body);
    b.cp_async_wait(0);

    b.blank();
    b.comment("epilogue: out = acc / l (zeros for rows that saw no key), rounded pairs");
    // The key-split form writes f32 partials and each row's base-2 log-sum-exp
    // at [split, batch*heads_kv + y, row]: split*(total rows) + head rows.
    let part = match (splits_p, key_split) {
        (Some((lse, _, splits)), Some(sp)) => {
            let ny = b.nctaid(Dim::Y);
            let nz = b.nctaid(Dim::Z);
            let batches = b.div(nz, splits);
            let heads = b.mul(batches, ny);
            let y = b.ctaid(Dim::Y);
            let head = b.mad(batch, ny, y);
            let slab = b.mad(sp, heads, head);
            let slab = b.cvt::<U64, U32>(slab);
            let rows64 = b.cvt::<U64, U32>(p.rows);
            let row0 = b.mul(slab, rows64);
            let lse_row = b.shl(row0, 2u32);
            let lse_base = b.add(lse, lse_row);
            let o_row = b.mul(row0, u64::from(d * 4));
            Some((lse_base, b.add(p.o, o_row)))
        }
        _ => None,
    };
    let lane_t0 = b.setp(Cmp::Eq, t4, 0u32);
    for mi in 0..m_tiles {
        for h in 0..2u32 {
            let ri = (mi * 2 + h) as usize;
            let mut l = l_run[ri];
            for s in [1u32, 2] {
                let o = b.shfl_bfly(l, s);
                l = b.add(l, o);
            }
            let inv = inverse_or_zero(&mut b, l);
            let r = b.add(m0, wrow);
            let r = b.add(r, g);
            let r = b.add(r, mi * 16 + h * 8);
            let ok = b.setp(Cmp::Lt, r, p.rows);
            let elem = b.mad(r, d, cols0);
            // Rows of half data are stored rounded (4 bytes a pair); f32 data and
            // the key-split partials as f32 pairs (8 bytes).
            let (base, wide) = match part {
                Some((_, o_base)) => (o_base, true),
                None => (oh, three),
            };
            let off = b.mul_wide(elem, if wide { 4u32 } else { 2 });
            let at = b.add(base, off);
            for nd in 0..nd_n {
                let acc = o_acc[(mi * nd_n + nd) as usize];
                let lo = b.mul(acc[(2 * h) as usize], inv);
                let hi = b.mul(acc[(2 * h + 1) as usize], inv);
                if wide {
                    b.guarded(ok, false, |b| b.st_global_v::<F32, 2>(at, i64::from(nd * 32), [lo.into(), hi.into()]));
                } else {
                    let w = b.f32_pair_to_half(lo, hi, half);
                    store_if(&mut b, ok, at, i64::from(nd * 16), w);
                }
            }
            if let Some((lse_base, _)) = part {
                // log2(l) + m, or −∞ where no key was seen.
                let lg = b.lg2_approx(l);
                let lse_v = b.add(lg, m_run[ri]);
                let seen = b.setp(Cmp::Gt, l, 0.0f32);
                let lse_v = b.selp(lse_v, f32::NEG_INFINITY, seen);
                let write = b.and_pred(ok, lane_t0);
                let loff = b.mul_wide(r, 4u32);
                let la = b.add(lse_base, loff);
                b.guarded(write, false, |b| b.st_global::<F32>(la, 0, lse_v));
            }
        }
    }
    b.ret();
    b.finish()
}

fn store_if(b: &mut KernelBuilder, ok: Reg<Pred>, at: Reg<U64>, off: i64, w: Reg<U32>) {
    b.guarded(ok, false, |b| b.st_global::<U32>(at, off, w));
}

/// Rows per block of [`combine`] (one warp each).
pub const COMBINE_ROWS: u32 = 4;

/// Builds the kernel that merges the key splits of [`flash_split`]: per
/// output row, `out = Σₛ 2^(lseₛ − M)·oₛ / Σₛ 2^(lseₛ − M)` with `M` the
/// largest `lseₛ` (zeros where every split saw nothing), stored as `dtype`.
///
/// Params: `part` (f32 partials), `lse`, `out`, `total` (rows of all heads),
/// `splits`. Launch: `32·COMBINE_ROWS` threads, grid `ceil(total / COMBINE_ROWS)`.
pub fn combine(d: u32, dtype: DType, target: Target) -> Result<Kernel, BuildError> {
    let name = format!("attention_combine{}_d{d}", super::elem::suffix(dtype));
    if d == 0 || d as usize > SIMT_MAX_HEAD_DIM || !super::elem::supported(dtype) {
        return Err(BuildError { kernel: name, problems: vec![format!("head size {d} of {dtype}: need 1..=256")] });
    }
    let per_lane = d.div_ceil(32);
    let mut b = KernelBuilder::new(&name, target);
    b.doc(&format!("{name}: merges the key splits of the split attention kernel into {dtype} rows"));
    b.doc("params: part, lse, out, total, splits");
    b.doc(&format!("launch: {} threads, grid ceil(total/{COMBINE_ROWS})", 32 * COMBINE_ROWS));
    b.max_threads(32 * COMBINE_ROWS);
    let part = b.param_ptr("part");
    let lse = b.param_ptr("lse");
    let out = b.param_ptr("out");
    let total = b.param::<U32>("total");
    let splits = b.param::<U32>("splits");
    let tid = b.tid(Dim::X);
    let lane = b.and(tid, 31u32);
    let warp = b.shr(tid, 5u32);
    let cx = b.ctaid(Dim::X);
    let row = b.mad(cx, COMBINE_ROWS, warp);
    let done = b.label("done");
    let past = b.setp(Cmp::Ge, row, total);
    b.bra_if(past, done);
    let total64 = b.cvt::<U64, U32>(total);
    let row64 = b.cvt::<U64, U32>(row);
    let lse_step = b.shl(total64, 2u32);
    let part_step = b.mul(total64, u64::from(d * 4));
    let lse_row = b.shl(row64, 2u32);
    let lse0 = b.add(lse, lse_row);
    let part_row = b.mul(row64, u64::from(d * 4));
    let part0 = b.add(part, part_row);

    b.comment("M = the largest log-sum-exp of the splits");
    let mx = b.mov(f32::NEG_INFINITY);
    let i = b.mov(0u32);
    let at = b.mov(lse0);
    let top = b.label("max");
    let out_max = b.label("max_done");
    b.place(top);
    let over = b.setp(Cmp::Ge, i, splits);
    b.bra_if(over, out_max);
    let v = b.ld_global::<F32>(at, 0);
    let m2 = b.max(mx, v);
    b.assign(mx, m2);
    let n = b.add(at, lse_step);
    b.assign(at, n);
    let ni = b.add(i, 1u32);
    b.assign(i, ni);
    b.bra(top);
    b.place(out_max);
    let none = b.setp(Cmp::Eq, mx, f32::NEG_INFINITY);
    let base = b.selp(0.0f32, mx, none);

    b.comment("weighted sum of the partial rows");
    let wsum = b.mov(0.0f32);
    let acc: Vec<Reg<F32>> = (0..per_lane).map(|_| b.mov(0.0f32)).collect();
    let cols: Vec<(Reg<U64>, Reg<Pred>)> = (0..per_lane)
        .map(|t| {
            let c = b.add(lane, t * 32);
            let inside = b.setp(Cmp::Lt, c, d);
            let cc = b.min(c, d - 1);
            (b.mul_wide(cc, 4u32), inside)
        })
        .collect();
    b.assign(i, 0u32);
    b.assign(at, lse0);
    let pat = b.mov(part0);
    let top = b.label("sum");
    let out_sum = b.label("sum_done");
    b.place(top);
    let over = b.setp(Cmp::Ge, i, splits);
    b.bra_if(over, out_sum);
    let v = b.ld_global::<F32>(at, 0);
    let e = b.sub(v, base);
    let w = b.ex2_approx(e);
    let ws = b.add(wsum, w);
    b.assign(wsum, ws);
    for (t, &a) in acc.iter().enumerate() {
        let ptr = b.add(pat, cols[t].0);
        let x = b.ld_global::<F32>(ptr, 0);
        b.fma_acc(a, w, x);
    }
    let n = b.add(at, lse_step);
    b.assign(at, n);
    let n = b.add(pat, part_step);
    b.assign(pat, n);
    let ni = b.add(i, 1u32);
    b.assign(i, ni);
    b.bra(top);
    b.place(out_sum);
    let inv = inverse_or_zero(&mut b, wsum);
    let esz = super::elem::size(dtype);
    let orow = b.mul(row64, u64::from(d * esz));
    let obase = b.add(out, orow);
    for (t, &a) in acc.iter().enumerate() {
        let y = b.mul(a, inv);
        let c = b.add(lane, t as u32 * 32);
        let off = b.mul_wide(c, esz);
        let ptr = b.add(obase, off);
        let inside = cols[t].1;
        b.guarded(inside, false, |b| super::elem::store(b, dtype, ptr, 0, &[y]));
    }
    b.place(done);
    b.ret();
    b.finish()
}

/// Builds the kernel that splits `f32` values into bf16 high and low parts
/// for [`flash`] on `f32` data: `hi = bf16(x)`, `lo = bf16(x − hi)`, so that
/// `hi + lo` is `x` to about 2⁻¹⁷ relative. Params: `x`, `hi`, `lo` (the
/// two bf16 outputs), `pairs` (values / 2; the length is even). Launch: 256
/// threads, any grid (grid-stride loop over pairs).
pub fn split_bf16(target: Target) -> Result<Kernel, BuildError> {
    let mut b = KernelBuilder::new("split_f32_bf16x2", target);
    b.doc("split_f32_bf16x2: x -> (bf16(x), bf16(x - bf16(x))), two values per thread and step");
    b.doc("params: x, hi, lo, pairs; launch: 256 threads, grid-stride");
    b.max_threads(256);
    let x = b.param_ptr("x");
    let hi = b.param_ptr("hi");
    let lo = b.param_ptr("lo");
    let pairs = b.param::<U32>("pairs");
    let i = b.global_index_x();
    let nt = b.ntid(Dim::X);
    let nc = b.nctaid(Dim::X);
    let stride = b.mul(nt, nc);
    let top = b.label("pairs");
    let done = b.label("done");
    b.place(top);
    let over = b.setp(Cmp::Ge, i, pairs);
    b.bra_if(over, done);
    let off8 = b.mul_wide(i, 8u32);
    let at = b.add(x, off8);
    let [a, c] = b.ld_global_nc_v::<F32, 2>(at, 0);
    let h = b.f32_pair_to_half(a, c, Half::Bf16);
    let [ha, hc] = b.half_pair_to_f32(h, Half::Bf16);
    let da = b.sub(a, ha);
    let dc = b.sub(c, hc);
    let l = b.f32_pair_to_half(da, dc, Half::Bf16);
    let off4 = b.mul_wide(i, 4u32);
    let ha_ptr = b.add(hi, off4);
    let la_ptr = b.add(lo, off4);
    b.st_global::<U32>(ha_ptr, 0, h);
    b.st_global::<U32>(la_ptr, 0, l);
    let next = b.add(i, stride);
    b.assign(i, next);
    b.bra(top);
    b.place(done);
    b.ret();
    b.finish()
}
