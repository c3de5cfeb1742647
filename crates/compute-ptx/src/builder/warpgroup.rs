//! Hopper's warpgroup instructions (`sm_90a`): `wgmma.mma_async` reading both
//! operands from shared memory through 64-bit matrix descriptors, its fence,
//! commit and wait, and the proxy fence that makes ordinary shared-memory
//! writes visible to it; the register-`A` form of `wgmma` (a 64×16 half or
//! 64×8 TF32 operand held in the warpgroup's registers); and the named barriers (`barrier.sync`
//! / `barrier.arrive` with an id and a thread count) by which warpgroups order
//! themselves without stopping the whole block. A warpgroup is four
//! consecutive warps (128 threads whose first is a multiple of 128); every one
//! of its threads must execute each `wgmma` instruction.

use super::halves::Half;
use super::types::{F32, Pred, Reg, Src, U32, U64};
use super::{KernelBuilder, Target};

/// A shared-memory matrix descriptor of an operand tile in the 128-byte
/// swizzle (rows of 128 bytes in atoms of 8 rows, 1024 bytes aligned to 1024,
/// the 16-byte chunks of row `r` XORed with `r mod 8`): start address
/// `addr >> 4` (bits 0–13), leading byte offset `lbo` (bits 16–29), stride
/// byte offset `sbo` (bits 32–45), swizzle mode 1 (bits 62–63). For a
/// `k`-contiguous operand (rows along m or n, 64 values of `k` each) `lbo` is
/// unused (16) and `sbo` is the distance between groups of 8 rows; for an
/// `m`/`n`-contiguous one (rows along `k`, 64 values along m or n each) `lbo`
/// is the distance between atoms along m or n and `sbo` between atoms along `k`.
pub const fn smem_descriptor_bits(addr: u32, lbo: u32, sbo: u32) -> u64 {
    let start = ((addr as u64) >> 4) & 0x3fff;
    start | ((((lbo >> 4) & 0x3fff) as u64) << 16) | ((((sbo >> 4) & 0x3fff) as u64) << 32) | (1 << 62)
}

/// What a `wgmma` multiplies: `f16` or `bf16` values (16 per `k` step), or
/// `f32` values read as TF32 (their top 19 bits; 8 per `k` step).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WgmmaInput {
    /// 16-bit floats.
    Half(Half),
    /// `f32` in memory, multiplied as TF32 (`.tf32`).
    Tf32,
}

impl WgmmaInput {
    /// The instruction's `k`: 16 for halves, 8 for TF32 (32 bytes of each row either way).
    pub fn k(self) -> u32 {
        match self {
            WgmmaInput::Half(_) => 16,
            WgmmaInput::Tf32 => 8,
        }
    }

    /// The type as PTX writes it (`bf16`, `tf32`).
    pub fn name(self) -> &'static str {
        match self {
            WgmmaInput::Half(h) => h.name(),
            WgmmaInput::Tf32 => "tf32",
        }
    }
}

impl KernelBuilder {
    fn need_sm90a(&mut self, what: &str) {
        if self.target() != Target::Sm90a {
            self.error(format!("{what} needs target sm_90a, not {}", self.target()));
        }
    }

    /// The descriptor ([`smem_descriptor_bits`]) of the operand tile at the
    /// shared-window address `addr`, computed in registers (4 instructions).
    pub fn smem_descriptor(&mut self, addr: Reg<super::U32>, lbo: u32, sbo: u32) -> Reg<U64> {
        let wide = self.cvt::<U64, super::U32>(addr);
        let start = self.shr(wide, 4u32);
        let start = self.and(start, 0x3fffu64);
        self.or(start, smem_descriptor_bits(0, lbo, sbo))
    }

    /// `wgmma.fence.sync.aligned`: orders this warpgroup's register accesses to
    /// the accumulators before the `wgmma` that follow.
    pub fn wgmma_fence(&mut self) {
        self.need_sm90a("wgmma.fence");
        self.emit("wgmma.fence.sync.aligned".into());
    }

    /// `wgmma.commit_group.sync.aligned`: closes the group of `wgmma` issued since the last commit.
    pub fn wgmma_commit(&mut self) {
        self.need_sm90a("wgmma.commit_group");
        self.emit("wgmma.commit_group.sync.aligned".into());
    }

    /// `wgmma.wait_group.sync.aligned n`: waits until at most `pending` groups
    /// are in flight; their accumulators and shared reads are then complete.
    pub fn wgmma_wait(&mut self, pending: u32) {
        self.need_sm90a("wgmma.wait_group");
        self.emit(format!("wgmma.wait_group.sync.aligned {pending}"));
    }

    /// `cvt.rna.tf32.f32`: `v` rounded to TF32 (10 mantissa bits, to nearest,
    /// ties away from zero), as the bits of an `f32` whose low 13 bits are
    /// zero (sm_80+).
    pub fn round_to_tf32(&mut self, v: Reg<super::B32>) -> Reg<super::B32> {
        let s = self.reg(v);
        let d = self.fresh::<super::B32>();
        self.emit(format!("cvt.rna.tf32.f32 {}, {s}", d.name()));
        d
    }

    /// A fresh 32-bit register holding zero bits (`mov.b32 r, 0`).
    pub fn zero_b32(&mut self) -> Reg<super::B32> {
        let d = self.fresh::<super::B32>();
        self.emit(format!("mov.b32 {}, 0", d.name()));
        d
    }

    /// `fence.proxy.async.shared::cta`: makes this thread's earlier ordinary
    /// writes to shared memory visible to the async proxy (`wgmma` reads),
    /// once a barrier has ordered them for the other threads too.
    pub fn fence_proxy_async_shared(&mut self) {
        self.emit("fence.proxy.async.shared::cta".into());
    }

    /// `acc += A·B` on a warpgroup:
    /// `wgmma.mma_async.sync.aligned.m64n{N}k{K}.f32.<in>.<in>` with `K` =
    /// [`WgmmaInput::k`], `A` (64×K) and `B` (K×N) in shared memory, described
    /// by `desc_a` and `desc_b`: `k`-contiguous, or with `mn_major_a` /
    /// `mn_major_b` `m`- / `n`-contiguous (the instruction's transpose flags,
    /// which TF32 does not have). `acc` holds the warpgroup's 64×N `f32`
    /// accumulator, `N/2` registers per thread: warp `w`'s lane `l` holds rows
    /// `16w + l/4` (registers `4j`, `4j+1`) and `16w + l/4 + 8` (`4j+2`,
    /// `4j+3`) at columns `8j + 2(l%4)` and the one after. `scale_d` false
    /// ignores the old accumulator (`D = A·B`). Asynchronous: the accumulators
    /// and the operands' shared memory are in use until a
    /// [`KernelBuilder::wgmma_wait`] retires the group.
    pub fn wgmma_mma_async(
        &mut self,
        input: WgmmaInput,
        acc: &[Reg<F32>],
        (desc_a, desc_b): (Reg<U64>, Reg<U64>),
        scale_d: Reg<Pred>,
        (mn_major_a, mn_major_b): (bool, bool),
    ) {
        self.need_sm90a("wgmma.mma_async");
        let n = acc.len() as u32 * 2;
        if !(8..=256).contains(&n) || !n.is_multiple_of(8) {
            self.error(format!("wgmma m64n{n}: N must be a multiple of 8 in 8..=256"));
        }
        let d: Vec<String> = acc.iter().map(|r| self.reg(*r)).collect();
        let (a, b, p) = (self.reg(desc_a), self.reg(desc_b), self.reg(scale_d));
        let (t, k) = (input.name(), input.k());
        let trans = match input {
            WgmmaInput::Half(_) => format!(", {}, {}", u32::from(mn_major_a), u32::from(mn_major_b)),
            WgmmaInput::Tf32 => {
                if mn_major_a || mn_major_b {
                    self.error("wgmma on tf32 reads k-contiguous operands only".into());
                }
                String::new()
            }
        };
        self.emit(format!(
            "wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32.{t}.{t} {{{}}}, {a}, {b}, {p}, 1, 1{trans}",
            d.join(", ")
        ));
    }

    /// `acc += A·B` with `A` from registers:
    /// `wgmma.mma_async.sync.aligned.m64n{N}k{K}.f32.<in>.<in>` whose 64×K
    /// `A` is four 32-bit registers per thread. Halves (`K` = 16): each
    /// register two values (low half first); warp `w`'s lane `l` holds row
    /// `16w + l/4` (`a[0]`, `a[2]`) and row `16w + l/4 + 8` (`a[1]`, `a[3]`)
    /// at columns `2(l%4)` and the one after (`a[0]`, `a[1]`) and 8 further
    /// (`a[2]`, `a[3]`) — the layout of the accumulator of a `wgmma` (see
    /// [`KernelBuilder::wgmma_mma_async`]) over 16 columns, rounded and packed
    /// in pairs. TF32 (`K` = 8): each register one `f32` whose top 19 bits
    /// are read, at the same rows and columns `l%4` (`a[0]`, `a[1]`) and
    /// `l%4 + 4` (`a[2]`, `a[3]`) — what `ldmatrix` delivers from four 8×4
    /// blocks of `f32`. `B` (K×N) is in shared memory as `desc_b` and
    /// `mn_major_b` say (TF32: `k`-contiguous only). Asynchronous like the
    /// shared form; `a` must not be written until a
    /// [`KernelBuilder::wgmma_wait`] retires the group, and a
    /// [`KernelBuilder::wgmma_fence`] must come between writing `a` and this
    /// instruction. One instruction.
    pub fn wgmma_mma_async_reg_a(
        &mut self,
        input: WgmmaInput,
        acc: &[Reg<F32>],
        a: [Reg<U32>; 4],
        desc_b: Reg<U64>,
        scale_d: Reg<Pred>,
        mn_major_b: bool,
    ) {
        self.need_sm90a("wgmma.mma_async");
        let n = acc.len() as u32 * 2;
        if !(8..=256).contains(&n) || !n.is_multiple_of(8) {
            self.error(format!("wgmma m64n{n}: N must be a multiple of 8 in 8..=256"));
        }
        let d: Vec<String> = acc.iter().map(|r| self.reg(*r)).collect();
        let a: Vec<String> = a.iter().map(|r| self.reg(*r)).collect();
        let (b, p) = (self.reg(desc_b), self.reg(scale_d));
        let (t, k) = (input.name(), input.k());
        let trans = match input {
            WgmmaInput::Half(_) => format!(", {}", u32::from(mn_major_b)),
            WgmmaInput::Tf32 => {
                if mn_major_b {
                    self.error("wgmma on tf32 reads a k-contiguous B only".into());
                }
                String::new()
            }
        };
        self.emit(format!(
            "wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32.{t}.{t} {{{}}}, {{{}}}, {b}, {p}, 1, 1{trans}",
            d.join(", "),
            a.join(", ")
        ));
    }

    fn named_barrier(&mut self, what: &str, id: Src<U32>, threads: u32) {
        if let Src::Imm(i) = id
            && !matches!(i, super::types::Imm::Int(0..16))
        {
            self.error(format!("barrier.{what}: id {i} is not an integer in 0..16"));
        }
        if threads == 0 || !threads.is_multiple_of(32) {
            self.error(format!("barrier.{what}: {threads} threads is not a positive multiple of 32"));
        }
        let id = self.src(id);
        self.emit(format!("barrier.{what} {id}, {threads}"));
    }

    /// `barrier.sync id, threads`: waits until `threads` threads (whole warps)
    /// have arrived at barrier `id` (0..16), this one included. Not
    /// `.aligned`: the warps may reach it at different places in the code,
    /// so warpgroups can meet at different points of their schedules. Shared
    /// memory written before the arrivals is visible after it.
    pub fn barrier_sync(&mut self, id: impl Into<Src<U32>>, threads: u32) {
        self.named_barrier("sync", id.into(), threads);
    }

    /// `barrier.arrive id, threads`: counts this warp's threads towards barrier
    /// `id`'s next completion without waiting; a warp that later waits on the
    /// barrier (`barrier.sync`) sees this thread's earlier shared-memory
    /// writes.
    pub fn barrier_arrive(&mut self, id: impl Into<Src<U32>>, threads: u32) {
        self.named_barrier("arrive", id.into(), threads);
    }
}
