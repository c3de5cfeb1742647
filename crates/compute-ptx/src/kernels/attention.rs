//! Fused attention: `out = softmax(scale·q·kᵀ + mask)·v` without the score matrix.
//!
//! Both kernels treat one (batch, key/value head) as a matrix of
//! `rows = group · seq_q` query rows: with `q` laid out `[batch, heads_q,
//! seq_q, d]`, the query heads that share a key/value head are consecutive,
//! so their rows follow each other in memory and one block's tile of rows
//! reads each key and value once for the whole group (grouped-query
//! attention costs no extra traffic). Row `r` is query position `r mod seq_q`.
//!
//! The mask enters as two numbers per launch ([`visible_params`]): query
//! position `i` sees keys `0..vis(i)` with `vis(i) = min(seq_k, max(0, i + a − b))`,
//! which covers no mask, the end-aligned and the start-aligned causal masks.
//!
//! - [`flash`] (`f16`/`bf16`, head sizes that are multiples of 16 up to 128):
//!   FlashAttention-2 on `mma.sync`. A block of `warps` warps owns
//!   `16·m_tiles` query rows each; the `q` tile is copied to shared memory once
//!   and held in registers as `mma` fragments; key and value tiles of `bn`
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
//!   padded to a power of two.
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
}

impl FlashConfig {
    /// The shape the backend launches for head size `d`: 4 warps; two row
    /// tiles per warp up to `d = 64`, one above; key tiles of 64.
    pub fn for_head_dim(d: usize) -> FlashConfig {
        let m_tiles = if d <= 64 { 2 } else { 1 };
        FlashConfig { head_dim: d as u32, warps: 4, m_tiles, bn: 64 }
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

    /// Dynamic shared memory per block: the `q` tile and two stages of key and value tiles.
    pub fn shared_bytes(&self) -> u32 {
        (self.rows() + 4 * self.bn) * self.row_bytes()
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
        if self.shared_bytes() > 227 * 1024 {
            return Err(format!("{} bytes of shared memory", self.shared_bytes()));
        }
        Ok(())
    }

    /// Kernel name: `attention_flash_bf16_d128` for the default shape of a
    /// head size, the shape spelled out for others.
    pub fn kernel_name(&self, dtype: DType) -> String {
        let base = format!("attention_flash_{dtype}_d{}", self.head_dim);
        if *self == Self::for_head_dim(self.head_dim as usize) {
            base
        } else {
            format!("{base}_w{}_m{}_n{}", self.warps, self.m_tiles, self.bn)
        }
    }
}

/// The parameters both kernels declare, in order.
struct Params {
    q: Reg<U64>,
    k: Reg<U64>,
    v: Reg<U64>,
    o: Reg<U64>,
    rows: Reg<U32>,
    seq_q: Reg<U32>,
    seq_k: Reg<U32>,
    scale_log2: Reg<F32>,
    vis_a: Reg<U32>,
    vis_b: Reg<U32>,
}

const PARAM_DOC: &str =
    "params: q, k, v, o, rows (group * seq_q), seq_q, seq_k, scale_log2 (scale * log2 e), vis_a, vis_b";

fn params(b: &mut KernelBuilder) -> Params {
    Params {
        q: b.param_ptr("q"),
        k: b.param_ptr("k"),
        v: b.param_ptr("v"),
        o: b.param_ptr("o"),
        rows: b.param::<U32>("rows"),
        seq_q: b.param::<U32>("seq_q"),
        seq_k: b.param::<U32>("seq_k"),
        scale_log2: b.param::<F32>("scale_log2"),
        vis_a: b.param::<U32>("vis_a"),
        vis_b: b.param::<U32>("vis_b"),
    }
}

/// Keys query position `pos` sees: `min(seq_k, max(0, pos + a − b))`.
fn visible(b: &mut KernelBuilder, p: &Params, pos: Reg<U32>) -> Reg<U32> {
    let t = b.add(pos, p.vis_a);
    let over = b.setp(Cmp::Gt, t, p.vis_b);
    let d = b.sub(t, p.vis_b);
    let d = b.min(d, p.seq_k);
    b.selp(d, 0u32, over)
}

/// Byte offsets of this (batch, key/value head)'s `q`/`o` rows and `k`/`v`
/// rows: `(z·heads_kv + y)·rows·d·elem` and `(z·heads_kv + y)·seq_k·d·elem`.
fn head_offsets(b: &mut KernelBuilder, p: &Params, d: u32, elem: u32) -> (Reg<U64>, Reg<U64>) {
    let y = b.ctaid(Dim::Y);
    let z = b.ctaid(Dim::Z);
    let ny = b.nctaid(Dim::Y);
    let head = b.mad(z, ny, y);
    let head = b.cvt::<U64, U32>(head);
    let rows = b.cvt::<U64, U32>(p.rows);
    let qo = b.mul(head, rows);
    let qo = b.mul(qo, u64::from(d * elem));
    let sk = b.cvt::<U64, U32>(p.seq_k);
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
    let (qo, kvo) = head_offsets(&mut b, &p, d, 4);
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

/// `x − 1` (wrapping; callers use it where `x ≥ 1` or clamp with it).
fn b_sub1(b: &mut KernelBuilder, x: Reg<U32>) -> Reg<U32> {
    let one = b.min(x, 1u32);
    b.sub(x, one)
}

/// The online-softmax step for a row whose running maximum is `m` (updated
/// in place) and whose new scores have maximum `mx` (both in log₂ units):
/// returns the base to subtract from the scores (`m_new`, or 0 while every
/// score seen is −∞) and the factor on the running sum and accumulator.
fn rescale(b: &mut KernelBuilder, m: Reg<F32>, mx: Reg<F32>) -> (Reg<F32>, Reg<F32>) {
    let m_new = b.max(m, mx);
    let none = b.setp(Cmp::Eq, m_new, f32::NEG_INFINITY);
    let m_use = b.selp(0.0f32, m_new, none);
    let d = b.sub(m, m_use);
    let alpha = b.ex2_approx(d);
    b.assign(m, m_new);
    (m_use, alpha)
}

/// `1/l`, or 0 where `l = 0` (a row that saw no key).
fn inverse_or_zero(b: &mut KernelBuilder, l: Reg<F32>) -> Reg<F32> {
    let pos = b.setp(Cmp::Gt, l, 0.0f32);
    let safe = b.selp(l, 1.0f32, pos);
    let inv = b.rcp(safe);
    b.selp(inv, 0.0f32, pos)
}

/// One thread's 16-byte copies of a tile (rows of `d` halves into swizzled
/// shared rows): the shared offset (within the tile) and the row and chunk of each.
struct TileCopies {
    dst: Vec<Reg<U32>>,
    row: Vec<Reg<U32>>,
    chunk8: Vec<Reg<U32>>,
}

fn tile_copies(b: &mut KernelBuilder, cfg: &FlashConfig, tid: Reg<U32>, rows: u32) -> TileCopies {
    let cpr_used = cfg.head_dim / 8;
    let cpr = cfg.row_bytes() / 16;
    let n = rows * cpr_used / cfg.threads();
    let mut t = TileCopies { dst: Vec::new(), row: Vec::new(), chunk8: Vec::new() };
    for i in 0..n {
        let idx = b.add(tid, i * cfg.threads());
        let r = b.div(idx, cpr_used);
        let c = b.rem(idx, cpr_used);
        let pc = super::gemm_common::swizzle_reg(b, r, c, cpr);
        let pc16 = b.shl(pc, 4u32);
        t.dst.push(b.mad(r, cfg.row_bytes(), pc16));
        t.row.push(r);
        t.chunk8.push(b.shl(c, 3u32));
    }
    t
}

/// Issues a tile's copies: rows `first + row` of the matrix at `base`
/// (`limit` rows, `d` halves each) into shared memory at `at + dst`; rows
/// past `limit` are zero-filled.
fn issue_tile(
    b: &mut KernelBuilder,
    t: &TileCopies,
    (base, d): (Reg<U64>, u32),
    (first, limit): (Reg<U32>, Reg<U32>),
    at: Reg<U32>,
) {
    let last = b_sub1(b, limit);
    for i in 0..t.dst.len() {
        let row = b.add(first, t.row[i]);
        let inside = b.setp(Cmp::Lt, row, limit);
        let bytes = b.selp(16u32, 0u32, inside);
        let rc = b.min(row, last);
        let elem = b.mad(rc, d, t.chunk8[i]);
        let off = b.mul_wide(elem, 2u32);
        let src = b.add(base, off);
        let dst = b.add(at, t.dst[i]);
        b.cp_async_16(dst, 0, src, 0, Some(bytes.into()));
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
    let name = cfg.kernel_name(dtype);
    let fail = |p: String| Err(BuildError { kernel: name.clone(), problems: vec![p] });
    if let Err(e) = cfg.check() {
        return fail(e);
    }
    let half = match dtype {
        DType::F16 => Half::F16,
        DType::BF16 => Half::Bf16,
        other => return fail(format!("tensor-core attention reads f16 or bf16, not {other}")),
    };
    let FlashConfig { head_dim: d, m_tiles, bn, .. } = *cfg;
    let (bm, threads, rb) = (cfg.rows(), cfg.threads(), cfg.row_bytes());
    let (ks_n, nt_n, nd_n) = (d / 16, bn / 8, d / 8);
    let (q_at, k_at, v_at) = (0u32, bm * rb, bm * rb + bn * rb);
    let stage_bytes = 2 * bn * rb;

    let mut b = KernelBuilder::new(&name, target);
    b.doc(&format!("{name}: fused attention, {dtype} q/k/v/o, f32 softmax and accumulation, mma.sync.m16n8k16"));
    b.doc(&format!(
        "{bm} query rows per block ({} warps x {m_tiles} row tiles), key tiles of {bn}, 2 cp.async stages",
        cfg.warps
    ));
    b.doc(PARAM_DOC);
    b.doc(&format!(
        "launch: {threads} threads, grid (ceil(rows/{bm}), heads_kv, batch), {} bytes of dynamic shared memory",
        cfg.shared_bytes()
    ));
    b.max_threads(threads);
    let p = params(&mut b);
    let smem = b.dynamic_shared("tiles", 128);
    let sbase = b.shared_base(&smem);
    let tid = b.tid(Dim::X);
    let lane = b.and(tid, 31u32);
    let warp = b.shr(tid, 5u32);
    let g = b.shr(lane, 2u32);
    let t4 = b.and(lane, 3u32);

    b.comment("the block's rows, heaviest first: tile nctaid.x - 1 - ctaid.x");
    let cx = b.ctaid(Dim::X);
    let nx = b.nctaid(Dim::X);
    let tile = b.sub(nx, cx);
    let tile = b_sub1(&mut b, tile);
    let m0 = b.mul(tile, bm);
    let (qo, kvo) = head_offsets(&mut b, &p, d, 2);
    let qh = b.add(p.q, qo);
    let oh = b.add(p.o, qo);
    let kh = b.add(p.k, kvo);
    let vh = b.add(p.v, kvo);

    b.comment("keys the block's first and last query positions see");
    let r_end = b.add(m0, bm);
    let r_end = b.min(r_end, p.rows);
    let r_last = b_sub1(&mut b, r_end);
    let h0 = b.div(m0, p.seq_q);
    let h1 = b.div(r_last, p.seq_q);
    let same = b.setp(Cmp::Eq, h0, h1);
    let p0 = b.rem(m0, p.seq_q);
    let p1 = b.rem(r_last, p.seq_q);
    let last_pos = b_sub1(&mut b, p.seq_q);
    let pmin = b.selp(p0, 0u32, same);
    let pmax = b.selp(p1, last_pos, same);
    let vis_min = visible(&mut b, &p, pmin);
    let vis_max = visible(&mut b, &p, pmax);
    let n_full = b.div(vis_min, bn);
    let vm = b.add(vis_max, bn - 1);
    let n_blocks = b.div(vm, bn);

    b.comment("copies: q once, then key and value tiles into two stages");
    let q_cp = tile_copies(&mut b, cfg, tid, bm);
    let kv_cp = tile_copies(&mut b, cfg, tid, bn);
    let q_dst = b.add(sbase, q_at);
    issue_tile(&mut b, &q_cp, (qh, d), (m0, p.rows), q_dst);
    let zero_u = b.mov(0u32);
    let any = b.setp(Cmp::Gt, n_blocks, 0u32);
    let k0 = b.add(sbase, k_at);
    let v0 = b.add(sbase, v_at);
    let skip_first = b.label("no_first_tile");
    b.bra_unless(any, skip_first);
    issue_tile(&mut b, &kv_cp, (kh, d), (zero_u, p.seq_k), k0);
    issue_tile(&mut b, &kv_cp, (vh, d), (zero_u, p.seq_k), v0);
    b.place(skip_first);
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

    b.comment("q fragments into registers once its copy has landed");
    b.cp_async_wait(0);
    b.bar_sync();
    let qf: Vec<Vec<[Reg<B32>; 4]>> = (0..m_tiles)
        .map(|mi| {
            (0..ks_n)
                .map(|ks| {
                    let (r, off) = q_fr.at(mi * 16, 2 * ks);
                    b.ldmatrix_x4(r, off, false)
                })
                .collect()
        })
        .collect();

    let neg_inf = f32::NEG_INFINITY;
    let zero4: [Reg<F32>; 4] = std::array::from_fn(|_| b.mov(0.0f32));
    let m_run: Vec<Reg<F32>> = (0..2 * m_tiles).map(|_| b.mov(neg_inf)).collect();
    let l_run: Vec<Reg<F32>> = (0..2 * m_tiles).map(|_| b.mov(0.0f32)).collect();
    let o_acc: Vec<[Reg<F32>; 4]> = (0..m_tiles * nd_n).map(|_| std::array::from_fn(|_| b.mov(0.0f32))).collect();
    let kb = b.mov(0u32);
    let cols0 = b.shl(t4, 1u32);

    // One key tile: wait for it, put the next in flight, multiply, softmax, accumulate.
    let body = |b: &mut KernelBuilder, masked: bool| {
        b.cp_async_wait(0);
        b.bar_sync();
        let next = b.add(kb, 1u32);
        let more = b.setp(Cmp::Lt, next, n_blocks);
        let nstage = b.and(next, 1u32);
        let noff = b.mul(nstage, stage_bytes);
        let skip = b.label("no_next_tile");
        b.bra_unless(more, skip);
        let first = b.mul(next, bn);
        let kd = b.add(k0, noff);
        let vd = b.add(v0, noff);
        issue_tile(b, &kv_cp, (kh, d), (first, p.seq_k), kd);
        issue_tile(b, &kv_cp, (vh, d), (first, p.seq_k), vd);
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
            for nj in 0..nt_n / 2 {
                let (r, off) = k_at_stage.at(nj * 16, 2 * ks);
                let x4 = b.ldmatrix_x4(r, off, false);
                for mi in 0..m_tiles {
                    for (half_i, pair) in [[x4[0], x4[1]], [x4[2], x4[3]]].into_iter().enumerate() {
                        let i = (mi * nt_n + 2 * nj + half_i as u32) as usize;
                        if s_init[i] {
                            b.mma_m16n8k16_acc(half, s_acc[i], qf[mi as usize][ks as usize], pair);
                        } else {
                            s_acc[i] = b.mma_m16n8k16(half, qf[mi as usize][ks as usize], pair, zero4);
                            s_init[i] = true;
                        }
                    }
                }
            }
        }
        b.comment(if masked { "online softmax, keys past each row's limit masked" } else { "online softmax" });
        let key0 = b.mul(kb, bn);
        let key0 = b.add(key0, cols0);
        let mut p_frag: Vec<Vec<[Reg<B32>; 4]>> = Vec::new();
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
            let frags: Vec<[Reg<B32>; 4]> = (0..nt_n / 2)
                .map(|kk| {
                    let (lo, hi) = (probs[(2 * kk) as usize], probs[(2 * kk + 1) as usize]);
                    let w = [
                        b.f32_pair_to_half(lo[0], lo[1], half),
                        b.f32_pair_to_half(lo[2], lo[3], half),
                        b.f32_pair_to_half(hi[0], hi[1], half),
                        b.f32_pair_to_half(hi[2], hi[3], half),
                    ];
                    w.map(|r| b.bitcast::<B32, U32>(r))
                })
                .collect();
            p_frag.push(frags);
        }
        b.comment("O += P v");
        let v_at_stage = v_fr.moved(b, soff);
        for kk in 0..nt_n / 2 {
            for ndp in 0..nd_n / 2 {
                let (r, off) = v_at_stage.at(kk * 16, 2 * ndp);
                let x4 = b.ldmatrix_x4(r, off, true);
                for mi in 0..m_tiles {
                    for (half_i, pair) in [[x4[0], x4[1]], [x4[2], x4[3]]].into_iter().enumerate() {
                        let acc = o_acc[(mi * nd_n + 2 * ndp + half_i as u32) as usize];
                        b.mma_m16n8k16_acc(half, acc, p_frag[mi as usize][kk as usize], pair);
                    }
                }
            }
        }
        let nk = b.add(kb, 1u32);
        b.assign(kb, nk);
    };
    for (masked, end) in [(false, n_full), (true, n_blocks)] {
        let top = b.label(if masked { "masked_tiles" } else { "full_tiles" });
        let exit = b.label(if masked { "masked_done" } else { "full_done" });
        b.place(top);
        let over = b.setp(Cmp::Ge, kb, end);
        b.bra_if(over, exit);
        body(&mut b, masked);
        b.bra(top);
        b.place(exit);
    }
    b.cp_async_wait(0);

    b.blank();
    b.comment("epilogue: out = acc / l (zeros for rows that saw no key), rounded pairs");
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
            let off = b.mul_wide(elem, 2u32);
            let at = b.add(oh, off);
            for nd in 0..nd_n {
                let acc = o_acc[(mi * nd_n + nd) as usize];
                let lo = b.mul(acc[(2 * h) as usize], inv);
                let hi = b.mul(acc[(2 * h + 1) as usize], inv);
                let w = b.f32_pair_to_half(lo, hi, half);
                store_if(&mut b, ok, at, i64::from(nd * 16), w);
            }
        }
    }
    b.ret();
    b.finish()
}

fn store_if(b: &mut KernelBuilder, ok: Reg<Pred>, at: Reg<U64>, off: i64, w: Reg<U32>) {
    b.guarded(ok, false, |b| b.st_global::<U32>(at, off, w));
}
