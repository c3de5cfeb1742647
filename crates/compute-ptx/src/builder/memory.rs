//! Kernel parameters, global and shared memory (scalar and vector), `cp.async`.
//!
//! Global addresses are [`Reg<U64>`] (after `cvta.to.global`), shared addresses
//! [`Reg<U32>`] in the shared window; every access takes a constant byte offset,
//! which PTX folds into the instruction (`[%rd4+16]`).

use super::types::{Data, PtxType, Reg, S32, Src, U32, U64};
use super::{KernelBuilder, SharedDecl, is_identifier};

/// A shared-memory array declared by [`KernelBuilder::shared`] or
/// [`KernelBuilder::dynamic_shared`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shared {
    name: String,
    owner: u32,
    bytes: Option<u32>,
}

impl Shared {
    /// The symbol's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Declared size in bytes; `None` for the dynamic array sized at launch.
    pub fn bytes(&self) -> Option<u32> {
        self.bytes
    }
}

fn offset(off: i64) -> String {
    match off {
        0 => String::new(),
        o if o > 0 => format!("+{o}"),
        o => format!("{o}"),
    }
}

impl KernelBuilder {
    pub(super) fn declare_param(&mut self, name: &str, ty: super::ParamTy) -> String {
        let pname = format!("{}_{}", self.name, name);
        if !is_identifier(name) {
            self.error(format!("parameter `{name}` is not a valid identifier"));
        }
        if self.params.iter().any(|(n, _)| *n == pname) {
            self.error(format!("parameter `{name}` declared twice"));
        }
        self.params.push((pname.clone(), ty));
        pname
    }

    /// Declares a scalar kernel parameter and loads it (`ld.param`).
    pub fn param<T: Data>(&mut self, name: &str) -> Reg<T> {
        let p = self.declare_param(name, T::TY.into());
        let d = self.fresh::<T>();
        let dn = d.name();
        self.emit(format!("ld.param.{} {dn}, [{p}]", T::TY));
        d
    }

    /// Declares a pointer parameter and converts it to a global address
    /// (`ld.param.u64` + `cvta.to.global.u64`).
    pub fn param_ptr(&mut self, name: &str) -> Reg<U64> {
        let raw = self.param::<U64>(name);
        let r = self.reg(raw);
        let d = self.fresh::<U64>();
        let dn = d.name();
        self.emit(format!("cvta.to.global.u64 {dn}, {r}"));
        d
    }

    fn check_vec<T: PtxType>(&mut self, n: usize) {
        let bytes = n as u32 * T::TY.bytes();
        if !matches!(n, 1 | 2 | 4) || bytes > 16 {
            self.error(format!("no {n}-wide vector access of .{} ({bytes} bytes; PTX allows v2/v4 up to 16)", T::TY));
        }
    }

    fn load<T: Data, const N: usize>(&mut self, op: &str, addr: String) -> [Reg<T>; N] {
        self.check_vec::<T>(N);
        let regs: [Reg<T>; N] = std::array::from_fn(|_| self.fresh::<T>());
        let names: Vec<String> = regs.iter().map(|r| r.name()).collect();
        let dst = if N == 1 { names.join("") } else { format!("{{{}}}", names.join(", ")) };
        let v = if N == 1 { String::new() } else { format!(".v{N}") };
        self.emit(format!("{op}{v}.{} {dst}, [{addr}]", T::TY));
        regs
    }

    fn store<T: Data, const N: usize>(&mut self, op: &str, addr: String, vals: [Src<T>; N]) {
        self.check_vec::<T>(N);
        let names: Vec<String> = vals.iter().map(|v| self.src(*v)).collect();
        let src = if N == 1 { names.join("") } else { format!("{{{}}}", names.join(", ")) };
        let v = if N == 1 { String::new() } else { format!(".v{N}") };
        self.emit(format!("{op}{v}.{} [{addr}], {src}", T::TY));
    }

    fn gaddr(&mut self, base: Reg<U64>, off: i64) -> String {
        format!("{}{}", self.reg(base), offset(off))
    }

    fn saddr(&mut self, base: Reg<U32>, off: i64) -> String {
        format!("{}{}", self.reg(base), offset(off))
    }

    /// `prefetch.global.L2 [addr+off]`: asks for the 128-byte line at that
    /// global address to be brought into L2. A hint with no effect on what
    /// any load returns, so it may run before
    /// [`KernelBuilder::wait_for_prerequisites`]; the address must lie in an
    /// allocation.
    pub fn prefetch_l2(&mut self, addr: Reg<U64>, off: i64) {
        let a = self.reg(addr);
        self.emit(format!("prefetch.global.L2 [{a}{}]", offset(off)));
    }

    /// Loads one value from global memory at `base + off` bytes (`ld.global`).
    pub fn ld_global<T: Data>(&mut self, base: Reg<U64>, off: i64) -> Reg<T> {
        let a = self.gaddr(base, off);
        let [r] = self.load::<T, 1>("ld.global", a);
        r
    }

    /// Loads one value through the read-only data cache (`ld.global.nc`): for
    /// inputs the kernel never writes.
    pub fn ld_global_nc<T: Data>(&mut self, base: Reg<U64>, off: i64) -> Reg<T> {
        let a = self.gaddr(base, off);
        let [r] = self.load::<T, 1>("ld.global.nc", a);
        r
    }

    /// Loads `N` (2 or 4) consecutive values (`ld.global.v4`); the address must be
    /// aligned to the vector's size.
    pub fn ld_global_v<T: Data, const N: usize>(&mut self, base: Reg<U64>, off: i64) -> [Reg<T>; N] {
        let a = self.gaddr(base, off);
        self.load::<T, N>("ld.global", a)
    }

    /// [`KernelBuilder::ld_global_v`] into the registers `dst` instead of
    /// fresh ones, so that a guarded load ([`KernelBuilder::guarded`]) leaves
    /// them as they were when its predicate is false.
    pub fn ld_global_v_into<T: Data, const N: usize>(&mut self, dst: [Reg<T>; N], base: Reg<U64>, off: i64) {
        self.load_into("ld.global", dst, base, off);
    }

    /// [`KernelBuilder::ld_global_nc_v`] into the registers `dst`, as
    /// [`KernelBuilder::ld_global_v_into`] does: for guarded loads of inputs
    /// the kernel never writes, which may then move ahead of its stores.
    pub fn ld_global_nc_v_into<T: Data, const N: usize>(&mut self, dst: [Reg<T>; N], base: Reg<U64>, off: i64) {
        self.load_into("ld.global.nc", dst, base, off);
    }

    /// `{op}[.vN].type dst, [base + off]` into existing registers.
    fn load_into<T: Data, const N: usize>(&mut self, op: &str, dst: [Reg<T>; N], base: Reg<U64>, off: i64) {
        self.check_vec::<T>(N);
        let a = self.gaddr(base, off);
        let names: Vec<String> = dst.iter().map(|r| self.reg(*r)).collect();
        let d = if N == 1 { names.join("") } else { format!("{{{}}}", names.join(", ")) };
        let v = if N == 1 { String::new() } else { format!(".v{N}") };
        self.emit(format!("{op}{v}.{} {d}, [{a}]", T::TY));
    }

    /// Vector load through the read-only data cache (`ld.global.nc.v4`).
    pub fn ld_global_nc_v<T: Data, const N: usize>(&mut self, base: Reg<U64>, off: i64) -> [Reg<T>; N] {
        let a = self.gaddr(base, off);
        self.load::<T, N>("ld.global.nc", a)
    }

    /// Loads one unsigned byte through the read-only cache, zero-extended into a
    /// 32-bit register (`ld.global.nc.u8`): for packed data of any alignment.
    pub fn ld_global_nc_u8(&mut self, base: Reg<U64>, off: i64) -> Reg<U32> {
        self.narrow_load("u8", base, off)
    }

    /// Loads one signed byte through the read-only cache, sign-extended into a
    /// 32-bit register (`ld.global.nc.s8`).
    pub fn ld_global_nc_s8(&mut self, base: Reg<U64>, off: i64) -> Reg<S32> {
        self.narrow_load("s8", base, off)
    }

    /// Loads two bytes (2-byte aligned) through the read-only cache,
    /// zero-extended into a 32-bit register (`ld.global.nc.u16`).
    pub fn ld_global_nc_u16(&mut self, base: Reg<U64>, off: i64) -> Reg<U32> {
        self.narrow_load("u16", base, off)
    }

    fn narrow_load<T: Data>(&mut self, ty: &str, base: Reg<U64>, off: i64) -> Reg<T> {
        let a = self.gaddr(base, off);
        let d = self.fresh::<T>();
        let dn = d.name();
        self.emit(format!("ld.global.nc.{ty} {dn}, [{a}]"));
        d
    }

    /// Stores one value to global memory (`st.global`).
    pub fn st_global<T: Data>(&mut self, base: Reg<U64>, off: i64, v: impl Into<Src<T>>) {
        let a = self.gaddr(base, off);
        self.store::<T, 1>("st.global", a, [v.into()]);
    }

    /// Stores `N` (2 or 4) consecutive values (`st.global.v4`); aligned address.
    pub fn st_global_v<T: Data, const N: usize>(&mut self, base: Reg<U64>, off: i64, vals: [Src<T>; N]) {
        let a = self.gaddr(base, off);
        self.store::<T, N>("st.global", a, vals);
    }

    /// Declares a shared-memory array of `bytes` bytes aligned to `align`.
    pub fn shared(&mut self, name: &str, bytes: u32, align: u32) -> Shared {
        self.declare_shared(name, Some(bytes), align)
    }

    /// Declares the dynamic shared-memory array, sized by the launch
    /// (`.extern .shared`); at most one per kernel.
    pub fn dynamic_shared(&mut self, name: &str, align: u32) -> Shared {
        if self.shared.iter().any(|s| s.bytes.is_none()) {
            self.error("only one dynamic shared array per kernel".into());
        }
        self.declare_shared(name, None, align)
    }

    fn declare_shared(&mut self, name: &str, bytes: Option<u32>, align: u32) -> Shared {
        let full = format!("{}_{}", self.name, name);
        if !is_identifier(name) {
            self.error(format!("shared array `{name}` is not a valid identifier"));
        }
        if !align.is_power_of_two() {
            self.error(format!("shared array `{name}`: alignment {align} is not a power of two"));
        }
        if self.shared.iter().any(|s| s.name == full) {
            self.error(format!("shared array `{name}` declared twice"));
        }
        self.shared.push(SharedDecl { name: full.clone(), align, bytes });
        Shared { name: full, owner: self.id, bytes }
    }

    /// The shared-window address of a shared array (`mov.u32 %r, name`).
    pub fn shared_base(&mut self, s: &Shared) -> Reg<U32> {
        if s.owner != self.id {
            self.error(format!("shared array {} belongs to another kernel", s.name));
        }
        let d = self.fresh::<U32>();
        let dn = d.name();
        self.emit(format!("mov.u32 {dn}, {}", s.name));
        d
    }

    /// Loads one value from shared memory (`ld.shared`).
    pub fn ld_shared<T: Data>(&mut self, base: Reg<U32>, off: i64) -> Reg<T> {
        let a = self.saddr(base, off);
        let [r] = self.load::<T, 1>("ld.shared", a);
        r
    }

    /// Loads `N` (2 or 4) consecutive values from shared memory (`ld.shared.v4`).
    pub fn ld_shared_v<T: Data, const N: usize>(&mut self, base: Reg<U32>, off: i64) -> [Reg<T>; N] {
        let a = self.saddr(base, off);
        self.load::<T, N>("ld.shared", a)
    }

    /// Stores one value to shared memory (`st.shared`).
    pub fn st_shared<T: Data>(&mut self, base: Reg<U32>, off: i64, v: impl Into<Src<T>>) {
        let a = self.saddr(base, off);
        self.store::<T, 1>("st.shared", a, [v.into()]);
    }

    /// Stores `N` (2 or 4) consecutive values to shared memory (`st.shared.v4`).
    pub fn st_shared_v<T: Data, const N: usize>(&mut self, base: Reg<U32>, off: i64, vals: [Src<T>; N]) {
        let a = self.saddr(base, off);
        self.store::<T, N>("st.shared", a, vals);
    }

    /// Starts an asynchronous 16-byte copy from global to shared memory
    /// (`cp.async.cg.shared.global`, sm_80+), bypassing registers and L1. With
    /// `src_bytes`, only that many bytes (0..=16) are read and the rest of the
    /// 16 are zero-filled: the bounds-checked form for the edges of a tile.
    pub fn cp_async_16(
        &mut self,
        dst: Reg<U32>,
        dst_off: i64,
        src: Reg<U64>,
        src_off: i64,
        src_bytes: Option<Src<U32>>,
    ) {
        let d = self.saddr(dst, dst_off);
        let s = self.gaddr(src, src_off);
        let extra = match src_bytes {
            Some(n) => format!(", {}", self.src(n)),
            None => String::new(),
        };
        self.emit(format!("cp.async.cg.shared.global [{d}], [{s}], 16{extra}"));
    }

    /// Starts an asynchronous 4-byte copy from global to shared memory
    /// (`cp.async.ca.shared.global`), zero-filling when `src_bytes` is 0.
    pub fn cp_async_4(
        &mut self,
        dst: Reg<U32>,
        dst_off: i64,
        src: Reg<U64>,
        src_off: i64,
        src_bytes: Option<Src<U32>>,
    ) {
        let d = self.saddr(dst, dst_off);
        let s = self.gaddr(src, src_off);
        let extra = match src_bytes {
            Some(n) => format!(", {}", self.src(n)),
            None => String::new(),
        };
        self.emit(format!("cp.async.ca.shared.global [{d}], [{s}], 4{extra}"));
    }

    /// Closes the current group of `cp.async` copies (`cp.async.commit_group`).
    pub fn cp_async_commit(&mut self) {
        self.emit("cp.async.commit_group".into());
    }

    /// Waits until at most `pending` committed groups are still in flight
    /// (`cp.async.wait_group`); follow with a barrier before other threads read.
    pub fn cp_async_wait(&mut self, pending: u32) {
        self.emit(format!("cp.async.wait_group {pending}"));
    }
}

impl KernelBuilder {
    /// Widens a shared-window address to a 64-bit generic address (`cvta.shared.u64`),
    /// for code that reads shared or global memory through one pointer.
    pub fn shared_to_generic(&mut self, a: Reg<U32>) -> Reg<U64> {
        let w = self.cvt::<U64, U32>(a);
        let s = self.reg(w);
        let d = self.fresh::<U64>();
        let dn = d.name();
        self.emit(format!("cvta.shared.u64 {dn}, {s}"));
        d
    }

    /// Loads `N` (1, 2 or 4) values through a generic address (`ld.v4`): shared or global.
    pub fn ld_generic_v<T: Data, const N: usize>(&mut self, base: Reg<U64>, off: i64) -> [Reg<T>; N] {
        let a = self.gaddr(base, off);
        self.load::<T, N>("ld", a)
    }
}
