//! The PTX builder: write a kernel in Rust, get readable PTX text.
//!
//! A [`KernelBuilder`] hands out typed virtual registers ([`Reg<T>`]) and has one
//! method per instruction; each method checks its operand types through Rust's
//! type system and returns the result register. What Rust's types cannot see
//! (a register from another kernel, a label placed twice or never, a vector
//! width PTX lacks, a duplicate parameter) is recorded and reported by
//! [`KernelBuilder::finish`], so a kernel that builds is well formed before the
//! driver sees it. Loops are labels and branches; unrolling is a Rust loop.
//!
//! ```
//! use compute_ptx::builder::{KernelBuilder, Target, F32, U32, Cmp, Dim};
//! let mut b = KernelBuilder::new("scale", Target::Sm90);
//! let x = b.param_ptr("x");
//! let n = b.param::<U32>("n");
//! let i = b.global_index_x();
//! let done = b.label("done");
//! let out = b.setp(Cmp::Ge, i, n);
//! b.bra_if(out, done);
//! let off = b.mul_wide(i, 4u32);
//! let p = b.add(x, off);
//! let v = b.ld_global::<F32>(p, 0);
//! let v2 = b.mul(v, 2.0f32);
//! b.st_global(p, 0, v2);
//! b.place(done);
//! b.ret();
//! let kernel = b.finish().unwrap();
//! assert!(kernel.ptx().contains("mul.rn.f32"));
//! ```

mod arith;
mod bulk;
mod control;
mod halves;
mod memory;
mod types;
mod warpgroup;

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU32, Ordering};

pub use arith::{Cmp, Num, Signed};
pub use bulk::{TENSOR_MAP_BYTES, TensorMapParam};
pub use control::{Dim, Label};
pub use halves::Half;
pub use memory::Shared;
pub use types::{
    B16, B32, B64, CvtFrom, Data, F32, F64, Float, Imm, Int, Pred, PtxType, Reg, RegClass, S32, S64, Src, Ty,
};
pub use types::{U32, U64, Word};
pub use warpgroup::{WgmmaInput, smem_descriptor_bits};

/// The GPU architecture a kernel is emitted for (`.target`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    /// Ampere (A100): `sm_80`.
    Sm80,
    /// Hopper (H100, H200): `sm_90`.
    Sm90,
    /// Hopper's arch-specific target `sm_90a`: adds the warpgroup instructions
    /// (`wgmma`); its PTX runs on compute capability 9.0 only. Only the
    /// kernels that need it are emitted for it ([`Target::ALL`] leaves it out).
    Sm90a,
}

impl Target {
    /// The targets every kernel of the checked-in set is emitted for (the
    /// `wgmma` kernels are emitted for [`Target::Sm90a`] alone).
    pub const ALL: [Target; 2] = [Target::Sm80, Target::Sm90];

    /// Every target with checked-in PTX (`ptx/<target>/`): [`Target::ALL`] and `sm_90a`.
    pub const EMITTED: [Target; 3] = [Target::Sm80, Target::Sm90, Target::Sm90a];

    /// The name PTX and `ptxas --gpu-name` use (`sm_90`).
    pub fn name(self) -> &'static str {
        match self {
            Target::Sm80 => "sm_80",
            Target::Sm90 => "sm_90",
            Target::Sm90a => "sm_90a",
        }
    }

    /// The PTX ISA version written in `.version` (8.0: Hopper's first, and
    /// below the 9.0 that a CUDA 13.0 driver JIT-compiles).
    pub fn ptx_version(self) -> &'static str {
        "8.0"
    }

    /// The best target for a device of compute capability `major.minor`, or
    /// `None` below 8.0 (the kernels use `max.NaN` and `cp.async`).
    pub fn for_compute_capability(major: i32, minor: i32) -> Option<Target> {
        let _ = minor;
        match major {
            9.. => Some(Target::Sm90),
            8 => Some(Target::Sm80),
            _ => None,
        }
    }

    /// Whether kernels for this target open with the grid-dependency controls
    /// of programmatic dependent launch (`sm_90` on): see
    /// [`Kernel::waits_for_prerequisites`].
    pub fn has_grid_dependency_control(self) -> bool {
        self >= Target::Sm90
    }

    /// Whether a device of compute capability `major.minor` runs `sm_90a`
    /// PTX (`wgmma`): exactly 9.0 (H100, H200).
    pub fn has_wgmma(major: i32, minor: i32) -> bool {
        (major, minor) == (9, 0)
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a kernel did not build: every misuse the builder found, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuildError {
    /// Kernel name.
    pub kernel: String,
    /// One line per problem.
    pub problems: Vec<String>,
}

impl std::fmt::Display for BuildError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "kernel `{}` is malformed: {}", self.kernel, self.problems.join("; "))
    }
}

impl std::error::Error for BuildError {}

/// What one kernel parameter holds: a scalar of a PTX type, or a CUDA tensor
/// map (the 128-byte, 128-byte aligned `CUtensorMap` that TMA copies read,
/// declared `.param .align 128 .b8 name[128]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ParamTy {
    /// A scalar (`.param .u64 name`).
    Scalar(Ty),
    /// A tensor map passed by value ([`KernelBuilder::param_tensor_map`]).
    TensorMap,
}

impl From<Ty> for ParamTy {
    fn from(t: Ty) -> Self {
        ParamTy::Scalar(t)
    }
}

impl std::fmt::Display for ParamTy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParamTy::Scalar(t) => write!(f, ".{t}"),
            ParamTy::TensorMap => write!(f, ".align 128 .b8"),
        }
    }
}

/// A finished kernel: its name and its PTX module text (one `.entry` per module).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kernel {
    name: String,
    target: Target,
    ptx: String,
    params: Vec<ParamTy>,
}

impl Kernel {
    /// The entry point's name, as the driver looks it up.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The target it was emitted for.
    pub fn target(&self) -> Target {
        self.target
    }
    /// The PTX module text.
    pub fn ptx(&self) -> &str {
        &self.ptx
    }
    /// Takes the PTX text.
    pub fn into_ptx(self) -> String {
        self.ptx
    }
    /// The types of the entry point's parameters, in order: what a launch must pass.
    pub fn params(&self) -> &[ParamTy] {
        &self.params
    }
    /// Whether the kernel may be launched before the kernel ahead of it in its
    /// stream has finished (programmatic dependent launch, `sm_90` on). Such
    /// a kernel's first instruction is `griddepcontrol.launch_dependents` (the
    /// kernel after it may start launching once every block of this one has
    /// started), and `griddepcontrol.wait` (nothing of it runs on until the
    /// kernel before has completed and its writes are visible) comes next, or
    /// where the kernel placed it before its first memory access
    /// ([`KernelBuilder::wait_for_prerequisites`]). So it reads and writes
    /// memory exactly as a serially launched kernel does; what it gains is
    /// the launch of its blocks during the previous kernel's last wave.
    /// Launched without the attribute, both instructions do nothing.
    pub fn waits_for_prerequisites(&self) -> bool {
        self.target.has_grid_dependency_control()
    }
}

#[derive(Clone, Debug)]
enum Line {
    Inst(String),
    Label(u32),
    Comment(String),
    Blank,
}

#[derive(Clone, Debug)]
struct LabelInfo {
    name: String,
    placed: bool,
    used: bool,
}

#[derive(Clone, Debug)]
struct SharedDecl {
    name: String,
    align: u32,
    /// `None` for the dynamic (extern, sized at launch) array.
    bytes: Option<u32>,
}

static NEXT_BUILDER: AtomicU32 = AtomicU32::new(1);

/// Builds one kernel. Costs: a few allocations per instruction; a GEMM kernel
/// of a few thousand instructions builds in well under a millisecond.
#[derive(Debug)]
pub struct KernelBuilder {
    id: u32,
    name: String,
    target: Target,
    doc: Vec<String>,
    params: Vec<(String, ParamTy)>,
    counts: [u32; 6],
    shared: Vec<SharedDecl>,
    body: Vec<Line>,
    labels: Vec<LabelInfo>,
    guard: Option<(Reg<Pred>, bool)>,
    errors: Vec<String>,
    max_threads: Option<u32>,
    min_blocks: Option<u32>,
    max_regs: Option<u32>,
    /// Where `griddepcontrol.wait` went, when the kernel placed it itself
    /// ([`KernelBuilder::wait_for_prerequisites`]); else it opens the body.
    waits_in_body: bool,
}

impl KernelBuilder {
    /// Starts a kernel named `name` (a PTX identifier: letters, digits, `_`).
    pub fn new(name: &str, target: Target) -> Self {
        let mut errors = Vec::new();
        if !is_identifier(name) {
            errors.push(format!("`{name}` is not a valid PTX identifier"));
        }
        KernelBuilder {
            id: NEXT_BUILDER.fetch_add(1, Ordering::Relaxed),
            name: name.to_string(),
            target,
            doc: Vec::new(),
            params: Vec::new(),
            counts: [0; 6],
            shared: Vec::new(),
            body: Vec::new(),
            labels: Vec::new(),
            guard: None,
            errors,
            max_threads: None,
            min_blocks: None,
            max_regs: None,
            waits_in_body: false,
        }
    }

    /// The target this kernel is emitted for.
    pub fn target(&self) -> Target {
        self.target
    }

    /// Adds a line (ASCII) to the comment block at the top of the module.
    pub fn doc(&mut self, line: &str) {
        self.check_text(line);
        self.doc.push(line.to_string());
    }

    /// Declares the largest block the kernel is launched with (`.maxntid`), which
    /// lets `ptxas` budget registers for it.
    pub fn max_threads(&mut self, threads: u32) {
        self.max_threads = Some(threads);
    }

    /// Asks `ptxas` to fit at least `blocks` blocks per multiprocessor (`.minnctapersm`).
    pub fn min_blocks_per_sm(&mut self, blocks: u32) {
        self.min_blocks = Some(blocks);
    }

    /// Caps the registers per thread (`.maxnreg`); kernels that move
    /// registers between warpgroups ([`KernelBuilder::setmaxnreg`]) need
    /// this fixed budget at entry.
    pub fn max_registers(&mut self, regs: u32) {
        self.max_regs = Some(regs);
    }

    /// A comment line in the body (one line of ASCII).
    pub fn comment(&mut self, text: &str) {
        self.check_text(text);
        self.body.push(Line::Comment(text.to_string()));
    }

    /// An empty line in the body, to separate phases.
    pub fn blank(&mut self) {
        self.body.push(Line::Blank);
    }

    /// `ptxas` rejects non-ASCII text anywhere in a module, comments included.
    fn check_text(&mut self, text: &str) {
        if !text.is_ascii() || text.contains('\n') {
            self.error(format!("comment `{text}` is not one line of ASCII"));
        }
    }

    pub(crate) fn fresh<T: PtxType>(&mut self) -> Reg<T> {
        let class = T::TY.class().index();
        let index = self.counts[class];
        self.counts[class] += 1;
        Reg::new(index, self.id)
    }

    pub(crate) fn error(&mut self, problem: String) {
        self.errors.push(problem);
    }

    /// The register's name, recording an error if it belongs to another kernel.
    pub(crate) fn reg<T: PtxType>(&mut self, r: Reg<T>) -> String {
        if r.owner != self.id {
            self.error(format!("register {} belongs to another kernel", r.name()));
        }
        r.name()
    }

    pub(crate) fn src<T: PtxType>(&mut self, s: Src<T>) -> String {
        match s {
            Src::Reg(r) => self.reg(r),
            Src::Imm(i) => i.to_string(),
        }
    }

    /// Emits one instruction (without the trailing `;`), under the current guard.
    pub(crate) fn emit(&mut self, text: String) {
        let line = match self.guard {
            Some((p, negated)) => format!("@{}{} {text};", if negated { "!" } else { "" }, p.name()),
            None => format!("{text};"),
        };
        self.body.push(Line::Inst(line));
    }

    /// Emits the instructions written by `f` under the predicate `p` (`@p`), or
    /// under its negation (`@!p`) when `negated`; guards do not nest.
    pub fn guarded(&mut self, p: Reg<Pred>, negated: bool, f: impl FnOnce(&mut Self)) {
        self.reg(p);
        if self.guard.is_some() {
            self.error("guarded blocks do not nest".into());
        }
        let saved = self.guard.replace((p, negated));
        f(self);
        self.guard = saved;
    }

    /// Checks everything and renders the module text.
    pub fn finish(mut self) -> Result<Kernel, BuildError> {
        for l in &self.labels {
            if l.used && !l.placed {
                self.errors.push(format!("label {} is branched to but never placed", l.name));
            }
        }
        if !self.errors.is_empty() {
            return Err(BuildError { kernel: self.name, problems: self.errors });
        }
        let ptx = self.render();
        let params = self.params.iter().map(|(_, t)| *t).collect();
        Ok(Kernel { name: self.name, target: self.target, ptx, params })
    }

    fn render(&self) -> String {
        let mut s = String::new();
        s.push_str("//\n// Generated by compute-ptx (`cargo xtask ptx`); do not edit.\n");
        for d in &self.doc {
            if d.is_empty() {
                s.push_str("//\n");
            } else {
                let _ = writeln!(s, "// {d}");
            }
        }
        s.push_str("//\n\n");
        let _ =
            writeln!(s, ".version {}\n.target {}\n.address_size 64\n", self.target.ptx_version(), self.target.name());
        for sh in &self.shared {
            match sh.bytes {
                Some(n) => {
                    let _ = writeln!(s, ".shared .align {} .b8 {}[{n}];", sh.align, sh.name);
                }
                None => {
                    let _ = writeln!(s, ".extern .shared .align {} .b8 {}[];", sh.align, sh.name);
                }
            }
        }
        if !self.shared.is_empty() {
            s.push('\n');
        }
        let _ = write!(s, ".visible .entry {}(", self.name);
        for (i, (name, ty)) in self.params.iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            match ty {
                ParamTy::Scalar(t) => {
                    let _ = write!(s, "{sep}\n\t.param .{t} {name}");
                }
                ParamTy::TensorMap => {
                    let _ = write!(s, "{sep}\n\t.param .align 128 .b8 {name}[{TENSOR_MAP_BYTES}]");
                }
            }
        }
        s.push_str(if self.params.is_empty() { ")\n" } else { "\n)\n" });
        if let Some(t) = self.max_threads {
            let _ = writeln!(s, ".maxntid {t}, 1, 1");
        }
        if let Some(b) = self.min_blocks {
            let _ = writeln!(s, ".minnctapersm {b}");
        }
        if let Some(r) = self.max_regs {
            let _ = writeln!(s, ".maxnreg {r}");
        }
        s.push_str("{\n");
        for class in RegClass::ALL {
            let n = self.counts[class.index()];
            if n > 0 {
                let _ = writeln!(s, "\t.reg .{} {}<{n}>;", class.decl_type(), class.prefix());
            }
        }
        s.push('\n');
        if self.target.has_grid_dependency_control() {
            // Programmatic dependent launch ([`Kernel::waits_for_prerequisites`]):
            // the next kernel may launch once every block here has started; this
            // one waits for the previous kernel's completion before anything
            // else, unless the body placed the wait itself.
            s.push_str("\tgriddepcontrol.launch_dependents;\n");
            if !self.waits_in_body {
                s.push_str("\tgriddepcontrol.wait;\n");
            }
            s.push('\n');
        }
        for line in &self.body {
            match line {
                Line::Inst(t) => {
                    let _ = writeln!(s, "\t{t}");
                }
                Line::Label(id) => {
                    if let Some(l) = self.labels.get(*id as usize) {
                        let _ = writeln!(s, "{}:", l.name);
                    }
                }
                Line::Comment(c) => {
                    let _ = writeln!(s, "\t// {c}");
                }
                Line::Blank => s.push('\n'),
            }
        }
        s.push_str("}\n");
        s
    }
}

pub(crate) fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests;
