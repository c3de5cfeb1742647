//! Hopper's tensor memory accelerator (`sm_90`): bulk tensor copies from
//! global to shared memory described by a tensor map (TMA), the
//! shared-memory barriers (`mbarrier`) that count their bytes and the threads
//! that wait for them, named barriers for a subset of a block's warps, and
//! the warpgroup register reallocation (`setmaxnreg`, `sm_90a`) that lets a
//! copying warpgroup hand its registers to the computing ones.
//!
//! A barrier is 8 bytes of shared memory (aligned to 8) addressed by a
//! [`Reg<U32>`] in the shared window plus a constant offset. It completes a
//! phase when the expected number of threads have arrived and the expected
//! transaction bytes have landed; waiting names the phase by its parity
//! (0, 1, 0, …), so a ring of stages waits on `(round & 1)`.

use super::types::{Pred, Reg, U32, U64};
use super::{KernelBuilder, ParamTy, Target, is_identifier};

/// Bytes of a CUDA tensor map (`CUtensorMap`), passed to a kernel by value
/// (aligned to 128 bytes, as CUDA 13 declares it).
pub const TENSOR_MAP_BYTES: u32 = 128;

/// A tensor-map kernel parameter declared by [`KernelBuilder::param_tensor_map`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorMapParam {
    name: String,
    owner: u32,
}

fn at(off: i64) -> String {
    match off {
        0 => String::new(),
        o if o > 0 => format!("+{o}"),
        o => format!("{o}"),
    }
}

impl KernelBuilder {
    fn need_sm90(&mut self, what: &str) {
        if self.target() < Target::Sm90 {
            self.error(format!("{what} needs sm_90 or later, not {}", self.target()));
        }
    }

    /// Declares a tensor-map parameter (`.param .align 128 .b8 name[128]`):
    /// the launch passes the 128 bytes of a `CUtensorMap` by value.
    pub fn param_tensor_map(&mut self, name: &str) -> TensorMapParam {
        let pname = self.declare_param(name, ParamTy::TensorMap);
        TensorMapParam { name: pname, owner: self.id }
    }

    /// The generic address of a tensor-map parameter, as TMA copies take it
    /// (`mov.u64` of the parameter's address, `cvta.param.u64`).
    pub fn tensor_map_address(&mut self, map: &TensorMapParam) -> Reg<U64> {
        if map.owner != self.id || !is_identifier(&map.name) {
            self.error(format!("tensor map {} belongs to another kernel", map.name));
        }
        let p = self.fresh::<U64>();
        self.emit(format!("mov.u64 {}, {}", p.name(), map.name));
        let g = self.fresh::<U64>();
        self.emit(format!("cvta.param.u64 {}, {}", g.name(), p.name()));
        g
    }

    /// `prefetch.tensormap [map]`: brings the tensor map into the cache of
    /// the copy unit ahead of the first copy.
    pub fn prefetch_tensor_map(&mut self, map: Reg<U64>) {
        self.need_sm90("prefetch.tensormap");
        let m = self.reg(map);
        self.emit(format!("prefetch.tensormap [{m}]"));
    }

    /// `mbarrier.init.shared::cta.b64 [bar+off], count`: a barrier whose
    /// phases complete after `count` arrivals (and their expected bytes).
    pub fn mbarrier_init(&mut self, bar: Reg<U32>, off: i64, count: u32) {
        self.need_sm90("mbarrier.init");
        let b = self.reg(bar);
        self.emit(format!("mbarrier.init.shared::cta.b64 [{b}{}], {count}", at(off)));
    }

    /// `fence.mbarrier_init.release.cluster`: makes barrier initialisations
    /// visible to the copy unit; a block barrier must follow before others use them.
    pub fn fence_mbarrier_init(&mut self) {
        self.need_sm90("fence.mbarrier_init");
        self.emit("fence.mbarrier_init.release.cluster".into());
    }

    /// `mbarrier.arrive.shared::cta.b64 _, [bar+off]`: one arrival (release
    /// semantics: this thread's earlier memory accesses happen before the
    /// phase completes for its waiters).
    pub fn mbarrier_arrive(&mut self, bar: Reg<U32>, off: i64) {
        self.need_sm90("mbarrier.arrive");
        let b = self.reg(bar);
        self.emit(format!("mbarrier.arrive.shared::cta.b64 _, [{b}{}]", at(off)));
    }

    /// `mbarrier.arrive.expect_tx.shared::cta.b64 _, [bar+off], bytes`: one
    /// arrival that also tells the barrier to expect `bytes` more bytes of
    /// bulk copies in the current phase.
    pub fn mbarrier_arrive_expect_tx(&mut self, bar: Reg<U32>, off: i64, bytes: u32) {
        self.need_sm90("mbarrier.arrive.expect_tx");
        let b = self.reg(bar);
        self.emit(format!("mbarrier.arrive.expect_tx.shared::cta.b64 _, [{b}{}], {bytes}", at(off)));
    }

    /// Waits until the phase of parity `parity` (0 or 1) of the barrier at
    /// `bar+off` has completed: a loop on `mbarrier.try_wait.parity` (which
    /// suspends the thread for a while between tries). Acquire semantics: the
    /// arrivals' writes and the landed bytes are visible afterwards.
    pub fn mbarrier_wait(&mut self, bar: Reg<U32>, off: i64, parity: Reg<U32>) {
        self.need_sm90("mbarrier.try_wait");
        let retry = self.label("mbar_wait");
        self.place(retry);
        let done = self.fresh::<Pred>();
        let (d, b, p) = (done.name(), self.reg(bar), self.reg(parity));
        self.emit(format!("mbarrier.try_wait.parity.shared::cta.b64 {d}, [{b}{}], {p}", at(off)));
        self.bra_unless(done, retry);
    }

    /// A TMA copy of one box of a tensor into shared memory:
    /// `cp.async.bulk.tensor.<n>d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
    /// [dst+off], [map, {coords}], [bar+bar_off]`. `coords` (1 to 5, innermost
    /// first, in elements, signed: boxes may hang over any edge, where the copy
    /// writes zeros) locate the box; the box's bytes count towards the
    /// barrier's expected transaction bytes when they land. `dst` must be
    /// aligned as the map's swizzle needs (1024 bytes for the 128-byte swizzle).
    pub fn tma_load(
        &mut self,
        (dst, off): (Reg<U32>, i64),
        map: Reg<U64>,
        coords: &[Reg<U32>],
        (bar, bar_off): (Reg<U32>, i64),
    ) {
        self.need_sm90("cp.async.bulk.tensor");
        if !(1..=5).contains(&coords.len()) {
            self.error(format!("cp.async.bulk.tensor takes 1 to 5 coordinates, not {}", coords.len()));
        }
        let (d, m, b) = (self.reg(dst), self.reg(map), self.reg(bar));
        let c: Vec<String> = coords.iter().map(|r| self.reg(*r)).collect();
        self.emit(format!(
            "cp.async.bulk.tensor.{}d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [{d}{}], [{m}, {{{}}}], [{b}{}]",
            coords.len(),
            at(off),
            c.join(", "),
            at(bar_off)
        ));
    }

    /// `setmaxnreg.{inc,dec}.sync.aligned.u32 regs` (`sm_90a`): every thread
    /// of the warpgroup raises (waiting for free registers) or lowers its
    /// register budget to `regs` (24 to 256, a multiple of 8). The kernel
    /// needs a fixed budget at entry ([`KernelBuilder::max_registers`]).
    pub fn setmaxnreg(&mut self, inc: bool, regs: u32) {
        if self.target() != Target::Sm90a {
            self.error(format!("setmaxnreg needs target sm_90a, not {}", self.target()));
        }
        if !(24..=256).contains(&regs) || !regs.is_multiple_of(8) {
            self.error(format!("setmaxnreg {regs}: need a multiple of 8 in 24..=256"));
        }
        self.emit(format!("setmaxnreg.{}.sync.aligned.u32 {regs}", if inc { "inc" } else { "dec" }));
    }

    /// `bar.sync id, threads`: a named barrier (1 to 15; 0 is the block's)
    /// for the `threads` threads (a multiple of 32) of the warps that use it.
    pub fn bar_sync_named(&mut self, id: u32, threads: u32) {
        if !(1..=15).contains(&id) || !threads.is_multiple_of(32) || threads == 0 {
            self.error(format!("bar.sync {id}, {threads}: need id 1..=15 and a positive multiple of 32 threads"));
        }
        self.emit(format!("bar.sync {id}, {threads}"));
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Kernel, Target};
    use super::*;

    fn build(target: Target, f: impl FnOnce(&mut KernelBuilder)) -> Result<Kernel, super::super::BuildError> {
        let mut b = KernelBuilder::new("k", target);
        f(&mut b);
        b.ret();
        b.finish()
    }

    #[test]
    fn tensor_maps_barriers_and_copies_render() {
        let k = build(Target::Sm90a, |b| {
            let map = b.param_tensor_map("a");
            let n = b.param::<U32>("n");
            let addr = b.tensor_map_address(&map);
            b.prefetch_tensor_map(addr);
            let bar = b.mov(64u32);
            b.mbarrier_init(bar, 8, 1);
            b.fence_mbarrier_init();
            b.mbarrier_arrive_expect_tx(bar, 8, 16384);
            let dst = b.mov(1024u32);
            b.tma_load((dst, 0), addr, &[n, n, n], (bar, 8));
            let phase = b.mov(0u32);
            b.mbarrier_wait(bar, 8, phase);
            b.mbarrier_arrive(bar, 0);
            b.setmaxnreg(true, 232);
            b.bar_sync_named(1, 256);
        })
        .unwrap();
        let t = k.ptx();
        assert!(t.contains(".param .align 128 .b8 k_a[128],\n\t.param .u32 k_n\n)"), "{t}");
        assert_eq!(k.params(), &[ParamTy::TensorMap, ParamTy::Scalar(super::super::Ty::U32)]);
        for line in [
            "cvta.param.u64 %rd1, %rd0;",
            "mbarrier.init.shared::cta.b64 [%r1+8], 1;",
            "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%r1+8], 16384;",
            "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%r2], [%rd1, {%r0, %r0, %r0}], [%r1+8];",
            "setmaxnreg.inc.sync.aligned.u32 232;",
            "bar.sync 1, 256;",
        ] {
            assert!(t.contains(line), "missing `{line}` in\n{t}");
        }
        assert!(t.contains("mbarrier.try_wait.parity.shared::cta.b64 %p0, [%r1+8], %r3;"), "{t}");
    }

    #[test]
    fn misuse_is_reported() {
        let e = build(Target::Sm80, |b| {
            let bar = b.mov(0u32);
            b.mbarrier_init(bar, 0, 1);
        })
        .unwrap_err();
        assert!(e.problems[0].contains("sm_90"), "{e}");
        let e = build(Target::Sm90, |b| b.setmaxnreg(false, 40)).unwrap_err();
        assert!(e.problems[0].contains("sm_90a"), "{e}");
        let e = build(Target::Sm90a, |b| b.setmaxnreg(false, 20)).unwrap_err();
        assert!(e.problems[0].contains("multiple of 8"), "{e}");
        let e = build(Target::Sm90a, |b| b.bar_sync_named(0, 128)).unwrap_err();
        assert!(e.problems[0].contains("id 1..=15"), "{e}");
    }
}
