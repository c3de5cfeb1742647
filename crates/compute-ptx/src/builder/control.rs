//! Control flow (labels, branches, loops), barriers, special registers, warp
//! shuffles, and the tensor-core instructions (`mma.sync`, `ldmatrix`) a later
//! GEMM builds on.

use super::halves::Half;
use super::types::{B32, F32, Pred, Reg, Src, U32, U64, Word};
use super::{KernelBuilder, LabelInfo, Line};

/// A branch target. Create with [`KernelBuilder::label`], place once with
/// [`KernelBuilder::place`]; branch to it any number of times, before or after.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Label {
    id: u32,
    owner: u32,
}

/// A grid or block dimension for the special registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dim {
    /// `.x`.
    X,
    /// `.y`.
    Y,
    /// `.z`.
    Z,
}

impl Dim {
    fn suffix(self) -> &'static str {
        match self {
            Dim::X => "x",
            Dim::Y => "y",
            Dim::Z => "z",
        }
    }
}

impl KernelBuilder {
    /// A new label; `hint` becomes part of its name (`$L3_loop`).
    pub fn label(&mut self, hint: &str) -> Label {
        let id = self.labels.len() as u32;
        let clean: String = hint.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        self.labels.push(LabelInfo { name: format!("$L{id}_{clean}"), placed: false, used: false });
        Label { id, owner: self.id }
    }

    fn label_name(&mut self, l: Label, placing: bool) -> String {
        if l.owner != self.id {
            self.error(format!("label {} belongs to another kernel", l.id));
            return "$L_foreign".into();
        }
        let mut problem = None;
        let name = match self.labels.get_mut(l.id as usize) {
            Some(info) => {
                if placing {
                    if info.placed {
                        problem = Some(format!("label {} placed twice", info.name));
                    }
                    info.placed = true;
                } else {
                    info.used = true;
                }
                info.name.clone()
            }
            None => "$L_missing".into(),
        };
        if let Some(p) = problem {
            self.error(p);
        }
        name
    }

    fn no_guard(&mut self, what: &str) {
        if self.guard.is_some() {
            self.error(format!("{what} inside a guarded block"));
        }
    }

    /// Places `l` here: branches to it continue at the next instruction.
    pub fn place(&mut self, l: Label) {
        if self.guard.is_some() {
            self.error("a label cannot be placed inside a guarded block".into());
        }
        self.label_name(l, true);
        self.body.push(Line::Label(l.id));
    }

    /// Unconditional branch.
    pub fn bra(&mut self, l: Label) {
        let n = self.label_name(l, false);
        self.emit(format!("bra {n}"));
    }

    /// Branches to `l` when `p` holds.
    pub fn bra_if(&mut self, p: Reg<Pred>, l: Label) {
        self.no_guard("bra_if");
        let n = self.label_name(l, false);
        let pn = self.reg(p);
        self.body.push(Line::Inst(format!("@{pn} bra {n};")));
    }

    /// Branches to `l` when `p` does not hold.
    pub fn bra_unless(&mut self, p: Reg<Pred>, l: Label) {
        self.no_guard("bra_unless");
        let n = self.label_name(l, false);
        let pn = self.reg(p);
        self.body.push(Line::Inst(format!("@!{pn} bra {n};")));
    }

    /// Returns from the kernel.
    pub fn ret(&mut self) {
        self.emit("ret".into());
    }

    /// Waits here for the kernel before this one in its stream to complete
    /// (`griddepcontrol.wait`, on targets from `sm_90`; nothing before):
    /// without this call, kernels for those targets wait at their first
    /// instruction ([`Kernel::waits_for_prerequisites`]). Only work that
    /// reads nothing another kernel may write may come before it: address
    /// arithmetic, parameters, special registers and
    /// [`KernelBuilder::prefetch_l2`] hints. Every thread must pass here
    /// (or exit) before its first global load or store; at most once, outside
    /// guards and loops.
    ///
    /// [`Kernel::waits_for_prerequisites`]: super::Kernel::waits_for_prerequisites
    pub fn wait_for_prerequisites(&mut self) {
        self.no_guard("wait_for_prerequisites");
        if self.waits_in_body {
            self.error("wait_for_prerequisites placed twice".into());
        }
        self.waits_in_body = true;
        if self.target.has_grid_dependency_control() {
            self.emit("griddepcontrol.wait".into());
        }
    }

    /// Block-wide barrier (`bar.sync 0`): every thread of the block waits here,
    /// and shared-memory writes before it are visible after it.
    pub fn bar_sync(&mut self) {
        self.emit("bar.sync 0".into());
    }

    fn special(&mut self, name: &str) -> Reg<U32> {
        let d = self.fresh::<U32>();
        let dn = d.name();
        self.emit(format!("mov.u32 {dn}, %{name}"));
        d
    }

    /// Thread index within the block (`%tid`).
    pub fn tid(&mut self, d: Dim) -> Reg<U32> {
        self.special(&format!("tid.{}", d.suffix()))
    }

    /// Block size (`%ntid`).
    pub fn ntid(&mut self, d: Dim) -> Reg<U32> {
        self.special(&format!("ntid.{}", d.suffix()))
    }

    /// Block index within the grid (`%ctaid`).
    pub fn ctaid(&mut self, d: Dim) -> Reg<U32> {
        self.special(&format!("ctaid.{}", d.suffix()))
    }

    /// Grid size in blocks (`%nctaid`).
    pub fn nctaid(&mut self, d: Dim) -> Reg<U32> {
        self.special(&format!("nctaid.{}", d.suffix()))
    }

    /// Lane index within the warp, 0..32 (`%laneid`).
    pub fn laneid(&mut self) -> Reg<U32> {
        self.special("laneid")
    }

    /// `ctaid.x · ntid.x + tid.x`: this thread's index in a 1-D grid.
    pub fn global_index_x(&mut self) -> Reg<U32> {
        let t = self.tid(Dim::X);
        let c = self.ctaid(Dim::X);
        let n = self.ntid(Dim::X);
        self.mad(c, n, t)
    }

    fn shfl<T: Word>(&mut self, mode: &str, v: Reg<T>, b: Src<U32>, c: u32) -> Reg<T> {
        let (v, b) = (self.reg(v), self.src(b));
        let d = self.fresh::<T>();
        let dn = d.name();
        self.emit(format!("shfl.sync.{mode}.b32 {dn}, {v}, {b}, {c}, 0xffffffff"));
        d
    }

    /// The value of lane `lane ^ mask` (`shfl.sync.bfly`), all 32 lanes taking part:
    /// the step of a butterfly reduction that leaves the result in every lane.
    pub fn shfl_bfly<T: Word>(&mut self, v: Reg<T>, mask: u32) -> Reg<T> {
        self.shfl("bfly", v, mask.into(), 0x1f)
    }

    /// The value of lane `lane + delta` (`shfl.sync.down`); lanes past the end keep their own.
    pub fn shfl_down<T: Word>(&mut self, v: Reg<T>, delta: u32) -> Reg<T> {
        self.shfl("down", v, delta.into(), 0x1f)
    }

    /// The value of lane `lane` (`shfl.sync.idx`): a broadcast.
    pub fn shfl_idx<T: Word>(&mut self, v: Reg<T>, lane: impl Into<Src<U32>>) -> Reg<T> {
        self.shfl("idx", v, lane.into(), 0x1f)
    }

    /// Loads four 8×8 matrices of 16-bit elements from shared memory into the
    /// fragment layout `mma` expects (`ldmatrix.sync.aligned.m8n8.x4.shared.b16`,
    /// sm_75+); each lane passes the address (plus the constant `off` bytes)
    /// of one 16-byte row: lanes 0–7 the rows of the first matrix, 8–15 the
    /// second's, and so on. With `trans` (`.trans`), each matrix is delivered
    /// transposed: the form for an operand whose stored rows run along the
    /// other dimension. Warp-wide: every lane of the warp must execute it.
    pub fn ldmatrix_x4(&mut self, row_addr: Reg<U32>, off: i64, trans: bool) -> [Reg<B32>; 4] {
        let a = self.reg(row_addr);
        let at = match off {
            0 => a,
            o if o > 0 => format!("{a}+{o}"),
            o => format!("{a}{o}"),
        };
        let d: [Reg<B32>; 4] = std::array::from_fn(|_| self.fresh::<B32>());
        let names: Vec<String> = d.iter().map(|r| r.name()).collect();
        let t = if trans { ".trans" } else { "" };
        self.emit(format!("ldmatrix.sync.aligned.m8n8.x4{t}.shared.b16 {{{}}}, [{at}]", names.join(", ")));
        d
    }

    /// One warp-wide tensor-core product `D = A·B + C` of a 16×16 tile of A
    /// (4 registers of packed `half` pairs per lane), a 16×8 tile of B (2
    /// registers) and a 16×8 `f32` accumulator (4 registers)
    /// (`mma.sync.aligned.m16n8k16.row.col.f32.<half>.<half>.f32`, sm_80+).
    pub fn mma_m16n8k16(&mut self, half: Half, a: [Reg<B32>; 4], b: [Reg<B32>; 2], c: [Reg<F32>; 4]) -> [Reg<F32>; 4] {
        let d: [Reg<F32>; 4] = std::array::from_fn(|_| self.fresh::<F32>());
        self.emit_mma(half, d, a, b, c);
        d
    }

    /// [`KernelBuilder::mma_m16n8k16`] accumulating in place (`acc ← A·B + acc`):
    /// the form a GEMM's k-loop uses.
    pub fn mma_m16n8k16_acc(&mut self, half: Half, acc: [Reg<F32>; 4], a: [Reg<B32>; 4], b: [Reg<B32>; 2]) {
        self.emit_mma(half, acc, a, b, acc);
    }

    fn emit_mma(&mut self, half: Half, d: [Reg<F32>; 4], a: [Reg<B32>; 4], b: [Reg<B32>; 2], c: [Reg<F32>; 4]) {
        let dn: Vec<String> = d.iter().map(|r| self.reg(*r)).collect();
        let an: Vec<String> = a.iter().map(|r| self.reg(*r)).collect();
        let bn: Vec<String> = b.iter().map(|r| self.reg(*r)).collect();
        let cn: Vec<String> = c.iter().map(|r| self.reg(*r)).collect();
        let h = half.name();
        self.emit(format!(
            "mma.sync.aligned.m16n8k16.row.col.f32.{h}.{h}.f32 {{{}}}, {{{}}}, {{{}}}, {{{}}}",
            dn.join(", "),
            an.join(", "),
            bn.join(", "),
            cn.join(", ")
        ));
    }

    /// Adds `delta` bytes to a global address.
    pub fn offset_ptr(&mut self, base: Reg<U64>, delta: Reg<U64>) -> Reg<U64> {
        self.add(base, delta)
    }
}
