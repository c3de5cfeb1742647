//! A small PTX interpreter for the subset `compute-ptx` emits, to run every
//! kernel of the set on the CPU in tests: threads of a block run until they
//! reach a barrier, a shuffle or their end, then meet there (shuffles per warp,
//! barriers by id: `bar.sync 0` waits for the whole block, `barrier.sync id,
//! n` and `barrier.arrive id, n` count `n` threads, generation by generation).
//! Global and shared memory are bounds- and
//! alignment-checked: an out-of-bounds or misaligned access fails the test, as
//! `compute-sanitizer --tool memcheck` would on the GPU. Approximate
//! instructions (`ex2.approx`, `lg2.approx`) are modelled by the exact function
//! rounded to f32 (the hardware is within 2 ulp of it).
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};

use compute_core::{bf16, f16};
use compute_ptx::kernels::KernelId;
use compute_ptx::plan::{Arg, Grid};
use compute_ptx::{Kernel, Target};

#[derive(Clone, Debug)]
enum Opnd {
    Reg(usize),
    Imm(u64),
    Special(&'static str),
    Sym(u32),
    Mem(Box<Opnd>, i64),
    Vec(Vec<Opnd>),
    Param(usize),
    Label(usize),
}

#[derive(Clone, Debug)]
struct Inst {
    guard: Option<(usize, bool)>,
    parts: Vec<String>,
    args: Vec<Opnd>,
    text: String,
}

/// (guard register and negation, opcode, operand text) before operands are resolved.
type RawInst = (Option<(String, bool)>, String, String);

/// A parsed kernel.
#[derive(Debug)]
pub struct Program {
    name: String,
    params: Vec<(String, String)>,
    code: Vec<Inst>,
    nregs: usize,
    static_smem: u32,
    /// Offset of the dynamic shared array (after the static ones), if declared.
    dynamic_at: Option<u32>,
}

fn parse_imm(t: &str) -> Option<u64> {
    if let Some(h) = t.strip_prefix("0f") {
        return u32::from_str_radix(h, 16).ok().map(u64::from);
    }
    if let Some(h) = t.strip_prefix("0d") {
        return u64::from_str_radix(h, 16).ok();
    }
    if let Some(h) = t.strip_prefix("0x") {
        return u64::from_str_radix(h, 16).ok();
    }
    t.parse::<i64>().ok().map(|v| v as u64)
}

fn split_args(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '{' | '[' => {
                depth += 1;
                cur.push(c)
            }
            '}' | ']' => {
                depth -= 1;
                cur.push(c)
            }
            ',' if depth == 0 => {
                out.push(cur.trim().to_string());
                cur.clear();
            }
            _ => cur.push(c),
        }
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

impl Program {
    /// Parses one module of one entry point.
    pub fn parse(ptx: &str) -> Program {
        let mut params = Vec::new();
        let mut regs: HashMap<String, usize> = HashMap::new();
        let mut syms: HashMap<String, u32> = HashMap::new();
        let mut static_smem = 0u32;
        let mut dynamic_name = None;
        let mut dyn_align = 16;
        let mut labels: HashMap<String, usize> = HashMap::new();
        let mut raw: Vec<RawInst> = Vec::new();
        let mut name = String::new();
        let mut in_body = false;
        for line in ptx.lines() {
            let line = line.split("//").next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            if let Some(rest) = line.strip_prefix(".visible .entry ") {
                name = rest.trim_end_matches('(').to_string();
                continue;
            }
            if line.starts_with(".param") {
                let t: Vec<&str> = line.trim_end_matches(',').split_whitespace().collect();
                params.push((t[2].to_string(), t[1].trim_start_matches('.').to_string()));
                continue;
            }
            if line.starts_with(".shared") || line.starts_with(".extern .shared") {
                let t: Vec<&str> = line.trim_end_matches(';').split_whitespace().collect();
                let align: u32 = t[t.iter().position(|x| *x == ".align").unwrap() + 1].parse().unwrap();
                let decl = t[t.len() - 1];
                let (nm, size) = decl.split_once('[').unwrap();
                let size = size.trim_end_matches(']');
                if size.is_empty() {
                    dynamic_name = Some(nm.to_string());
                    dyn_align = align;
                } else {
                    static_smem = static_smem.div_ceil(align) * align;
                    syms.insert(nm.to_string(), static_smem);
                    static_smem += size.parse::<u32>().unwrap();
                }
                continue;
            }
            if line == "{" {
                in_body = true;
                continue;
            }
            if !in_body || line == "}" || line.starts_with(".reg") || line.starts_with('.') || line == ")" {
                continue;
            }
            if let Some(l) = line.strip_suffix(':') {
                labels.insert(l.to_string(), raw.len());
                continue;
            }
            let line = line.trim_end_matches(';');
            let (guard, rest) = if let Some(g) = line.strip_prefix('@') {
                let (p, rest) = g.split_once(' ').unwrap();
                let neg = p.starts_with('!');
                (Some((p.trim_start_matches('!').to_string(), neg)), rest.trim())
            } else {
                (None, line)
            };
            let (op, args) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
            raw.push((guard, op.to_string(), args.trim().to_string()));
        }
        let dynamic_at = dynamic_name.as_ref().map(|n| {
            let at = static_smem.div_ceil(dyn_align) * dyn_align;
            syms.insert(n.clone(), at);
            at
        });
        let reg_of = |r: &str, regs: &mut HashMap<String, usize>| {
            let n = regs.len();
            *regs.entry(r.to_string()).or_insert(n)
        };
        let param_index: HashMap<String, usize> = params.iter().enumerate().map(|(i, (n, _))| (n.clone(), i)).collect();
        let mut code = Vec::new();
        for (guard, op, args) in raw {
            let parse_one = |a: &str, regs: &mut HashMap<String, usize>| -> Opnd {
                let a = a.trim();
                if a.starts_with('%') {
                    let special = [
                        "%tid.x",
                        "%tid.y",
                        "%tid.z",
                        "%ntid.x",
                        "%ntid.y",
                        "%ntid.z",
                        "%ctaid.x",
                        "%ctaid.y",
                        "%ctaid.z",
                        "%nctaid.x",
                        "%nctaid.y",
                        "%nctaid.z",
                        "%laneid",
                    ];
                    if let Some(s) = special.iter().find(|s| **s == a) {
                        return Opnd::Special(s);
                    }
                    return Opnd::Reg(reg_of(a, regs));
                }
                if let Some(l) = labels.get(a) {
                    return Opnd::Label(*l);
                }
                if let Some(s) = syms.get(a) {
                    return Opnd::Sym(*s);
                }
                if let Some(v) = parse_imm(a) {
                    return Opnd::Imm(v);
                }
                panic!("cannot parse operand `{a}` in {name}");
            };
            let mut parsed = Vec::new();
            for a in split_args(&args) {
                if let Some(inner) = a.strip_prefix('[').and_then(|x| x.strip_suffix(']')) {
                    if let Some(p) = param_index.get(inner) {
                        parsed.push(Opnd::Param(*p));
                        continue;
                    }
                    let (base, off) = match inner.find(['+', '-']) {
                        Some(i) if i > 0 => (&inner[..i], inner[i..].trim_start_matches('+').parse::<i64>().unwrap()),
                        _ => (inner, 0),
                    };
                    parsed.push(Opnd::Mem(Box::new(parse_one(base, &mut regs)), off));
                } else if let Some(inner) = a.strip_prefix('{').and_then(|x| x.strip_suffix('}')) {
                    parsed.push(Opnd::Vec(inner.split(',').map(|x| parse_one(x, &mut regs)).collect()));
                } else {
                    parsed.push(parse_one(&a, &mut regs));
                }
            }
            let guard = guard.map(|(p, n)| (reg_of(&p, &mut regs), n));
            let parts: Vec<String> = op.split('.').map(String::from).collect();
            code.push(Inst { guard, parts, args: parsed, text: format!("{op} {args}") });
        }
        Program { name, params, code, nregs: regs.len(), static_smem, dynamic_at }
    }
}

/// Device memory: bounds-checked allocations in one address space.
#[derive(Debug, Default)]
pub struct Memory {
    bufs: BTreeMap<u64, Vec<u8>>,
    next: u64,
}

impl Memory {
    pub fn new() -> Memory {
        Memory { bufs: BTreeMap::new(), next: 0x1_0000_0000 }
    }
    /// Allocates `bytes` (256-aligned), filled with a NaN pattern so unwritten reads show.
    pub fn alloc(&mut self, bytes: usize) -> u64 {
        let a = self.next;
        self.next += (bytes.max(4) as u64).div_ceil(256) * 256 + 256;
        let fill = f32::from_bits(0x7fc0_beef).to_ne_bytes();
        self.bufs.insert(a, fill.iter().copied().cycle().take(bytes.max(4)).collect());
        a
    }
    pub fn free(&mut self, a: u64) {
        self.bufs.remove(&a);
    }
    fn slot(&mut self, addr: u64, n: usize, what: std::fmt::Arguments) -> &mut [u8] {
        let (start, buf) = self
            .bufs
            .range_mut(..=addr)
            .next_back()
            .unwrap_or_else(|| panic!("{what}: address {addr:#x} is not in any allocation"));
        let off = (addr - start) as usize;
        if off + n > buf.len() {
            panic!(
                "{what}: {n}-byte access at {addr:#x} is out of bounds (allocation {start:#x} of {} bytes)",
                buf.len()
            );
        }
        &mut buf[off..off + n]
    }
    pub fn write_f32(&mut self, addr: u64, data: &[f32]) {
        let s = self.slot(addr, data.len() * 4, format_args!("upload"));
        for (c, v) in s.chunks_mut(4).zip(data) {
            c.copy_from_slice(&v.to_ne_bytes());
        }
    }
    pub fn read_f32(&mut self, addr: u64, n: usize) -> Vec<f32> {
        let s = self.slot(addr, n * 4, format_args!("download"));
        s.chunks(4).map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]])).collect()
    }
    pub fn write_bytes(&mut self, addr: u64, data: &[u8]) {
        self.slot(addr, data.len(), format_args!("upload")).copy_from_slice(data);
    }
    pub fn read_bytes(&mut self, addr: u64, n: usize) -> Vec<u8> {
        self.slot(addr, n, format_args!("download")).to_vec()
    }
}

#[derive(Clone)]
struct Thread {
    pc: usize,
    regs: Vec<u64>,
    done: bool,
    /// Waiting at a barrier or shuffle (pc points at it).
    waiting: bool,
    /// Waiting at barrier `id` until its generation passes `generation`: (id, generation).
    bar_wait: Option<(u32, u64)>,
    tid: (u32, u32, u32),
    lane: u32,
    /// `cp.async` copies issued since the last commit: (shared address, data).
    open_copies: Vec<(u64, Vec<u8>)>,
    /// Committed groups not yet waited for, oldest first.
    groups: std::collections::VecDeque<Vec<(u64, Vec<u8>)>>,
}

fn type_bits(t: &str) -> u32 {
    match t {
        "f64" | "u64" | "s64" | "b64" => 64,
        "f16" | "bf16" | "u16" | "s16" | "b16" => 16,
        "u8" | "s8" | "b8" => 8,
        "pred" => 1,
        _ => 32,
    }
}

/// `cvt.rn` to a 16-bit float; NaN becomes the canonical NaN (`0x7fff`), as
/// the hardware documents.
fn to_half(x: f32, ty: &str) -> u16 {
    if x.is_nan() {
        return 0x7fff;
    }
    match ty {
        "f16" => f16::from_f32(x).to_bits(),
        "bf16" => bf16::from_f32(x).to_bits(),
        other => panic!("cvt to {other}"),
    }
}

fn f(x: u64) -> f32 {
    f32::from_bits(x as u32)
}
fn fb(x: f32) -> u64 {
    u64::from(x.to_bits())
}

/// Runs `prog` over a whole grid. Panics on any fault, with the kernel name.
/// `approx`: (factor on every `ex2.approx` result, term added to every
/// `lg2.approx` result, factor on every `rcp.approx` result), to model the
/// hardware's approximation error; (1, 0, 1) is exact. A nonzero `lg2` term
/// also moves every `sin.approx`/`cos.approx` result by their documented
/// absolute error ([`SIN_COS_ERROR`]) in the same direction.
/// The absolute error of `sin.approx.f32` and `cos.approx.f32` on `[−π, π]` (2⁻²⁰·⁹).
pub const SIN_COS_ERROR: f64 = 5.1e-7;

pub fn run(prog: &Program, mem: &mut Memory, grid: Grid, args: &[Arg], approx: (f64, f64, f64)) {
    assert_eq!(args.len(), prog.params.len(), "{}: argument count", prog.name);
    let argv: Vec<u64> = args
        .iter()
        .map(|a| match *a {
            Arg::Ptr(v) | Arg::U64(v) => v,
            Arg::U32(v) => u64::from(v),
            Arg::F32(v) => fb(v),
            Arg::TensorMap(_) => panic!("{}: TMA copies are not emulated", prog.name),
        })
        .collect();
    let (bx, by, bz) = grid.blocks;
    let (tx, ty, tz) = grid.threads;
    for z in 0..bz {
        for y in 0..by {
            for x in 0..bx {
                run_block(prog, mem, grid, &argv, (x, y, z), (tx, ty, tz), approx);
            }
        }
    }
}

fn run_block(
    prog: &Program,
    mem: &mut Memory,
    grid: Grid,
    argv: &[u64],
    cta: (u32, u32, u32),
    nt: (u32, u32, u32),
    approx: (f64, f64, f64),
) {
    let nthreads = (nt.0 * nt.1 * nt.2) as usize;
    let smem_size = prog.static_smem.max(prog.dynamic_at.unwrap_or(0)) as usize
        + if prog.dynamic_at.is_some() { grid.dynamic_smem as usize } else { 0 };
    let mut shared = vec![0xAAu8; smem_size];
    let mut threads: Vec<Thread> = (0..nthreads as u32)
        .map(|i| Thread {
            pc: 0,
            regs: vec![0; prog.nregs],
            done: false,
            waiting: false,
            tid: (i % nt.0, (i / nt.0) % nt.1, i / (nt.0 * nt.1)),
            lane: i % 32,
            bar_wait: None,
            open_copies: Vec::new(),
            groups: Default::default(),
        })
        .collect();
    let ctx = Ctx { prog, argv, cta, nt, nct: grid.blocks, approx };
    let mut bars = Barriers::default();
    loop {
        let mut progressed = false;
        for t in threads.iter_mut() {
            if !t.done && !t.waiting {
                step_until_sync(&ctx, t, mem, &mut shared, &mut bars);
                progressed = true;
            }
        }
        if threads.iter().all(|t| t.done) {
            return;
        }
        // Shuffles: a warp whose live lanes all wait at the same shuffle.
        for w in 0..nthreads.div_ceil(32) {
            let lanes = &threads[w * 32..((w + 1) * 32).min(nthreads)];
            let live: Vec<&Thread> = lanes.iter().filter(|t| !t.done).collect();
            if live.is_empty() || !live.iter().all(|t| t.waiting) {
                continue;
            }
            let pc = live[0].pc;
            let inst = &prog.code[pc];
            if matches!(inst.parts[0].as_str(), "ldmatrix" | "mma" | "wgmma") {
                assert!(live.iter().all(|t| t.pc == pc), "{}: warp {w} diverged at {}", prog.name, inst.text);
                assert_eq!(live.len(), 32, "{}: {} needs a whole warp", prog.name, inst.text);
                let warp = &mut threads[w * 32..(w + 1) * 32];
                match inst.parts[0].as_str() {
                    "ldmatrix" => ldmatrix(&ctx, inst, warp, mem, &mut shared),
                    "mma" => mma(&ctx, inst, warp),
                    _ => wgmma(&ctx, inst, warp, w % 4, mem, &mut shared),
                }
                for t in warp.iter_mut() {
                    t.pc += 1;
                    t.waiting = false;
                }
                progressed = true;
                continue;
            }
            if inst.parts[0] != "shfl" {
                continue;
            }
            assert!(live.iter().all(|t| t.pc == pc), "{}: warp {w} diverged at a shuffle", prog.name);
            assert_eq!(live.len(), lanes.len(), "{}: shuffle with exited lanes", prog.name);
            let vals: Vec<u64> = lanes.iter().map(|t| val(&ctx, t, &inst.args[1])).collect();
            let mode = inst.parts[2].as_str();
            let results: Vec<u64> = lanes
                .iter()
                .map(|t| {
                    let b = val(&ctx, t, &inst.args[2]) as u32;
                    let src = match mode {
                        "bfly" => t.lane ^ b,
                        "down" => t.lane + b,
                        "up" => t.lane.wrapping_sub(b),
                        "idx" => b,
                        m => panic!("shfl mode {m}"),
                    };
                    vals.get(src as usize).copied().filter(|_| src < 32).unwrap_or(vals[t.lane as usize])
                })
                .collect();
            for (i, t) in threads[w * 32..((w + 1) * 32).min(nthreads)].iter_mut().enumerate() {
                if let Opnd::Reg(d) = inst.args[0] {
                    t.regs[d] = results[i];
                }
                t.pc += 1;
                t.waiting = false;
            }
            progressed = true;
        }
        // Barriers: a waiting thread goes on once its barrier's generation has completed.
        for t in threads.iter_mut() {
            if let Some((id, generation)) = t.bar_wait
                && bars.generation(id) > generation
            {
                t.bar_wait = None;
                t.pc += 1;
                t.waiting = false;
                progressed = true;
            }
        }
        if !progressed {
            let exited = threads.iter().filter(|t| t.done).count();
            let at: Vec<String> = threads
                .iter()
                .filter(|t| t.waiting)
                .map(|t| prog.code[t.pc].text.clone())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            panic!("{}: deadlock ({exited} threads exited; the others wait at {at:?})", prog.name);
        }
    }
}

fn regs_of(o: &Opnd) -> Vec<usize> {
    match o {
        Opnd::Vec(v) => v
            .iter()
            .map(|x| match x {
                Opnd::Reg(r) => *r,
                other => panic!("not a register: {other:?}"),
            })
            .collect(),
        other => panic!("not a register list: {other:?}"),
    }
}

/// `ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16`: lanes 8i..8i+8 give the
/// row addresses of matrix i (16 bytes each); lane t receives, in register i,
/// elements (t/4, 2(t%4)) and (t/4, 2(t%4)+1) of matrix i, or with `.trans`
/// elements (2(t%4), t/4) and (2(t%4)+1, t/4), the first in the low half.
fn ldmatrix(ctx: &Ctx, inst: &Inst, warp: &mut [Thread], mem: &mut Memory, shared: &mut [u8]) {
    let trans = inst.parts.iter().any(|p| p == "trans");
    assert!(inst.parts.iter().any(|p| p == "x4") && inst.parts.iter().any(|p| p == "shared"), "{}", inst.text);
    let dst = regs_of(&inst.args[0]);
    // rows[i][j][c]: element c of row j of matrix i.
    let mut rows = [[[0u16; 8]; 8]; 4];
    for (i, mat) in rows.iter_mut().enumerate() {
        for (j, row) in mat.iter_mut().enumerate() {
            let at = addr(ctx, &warp[8 * i + j], &inst.args[1]);
            let bytes = access(ctx, mem, shared, "shared", at, 16, &inst.text);
            for (c, v) in row.iter_mut().enumerate() {
                *v = u16::from_le_bytes([bytes[2 * c], bytes[2 * c + 1]]);
            }
        }
    }
    for (t, th) in warp.iter_mut().enumerate() {
        let (g, q) = (t / 4, t % 4);
        for (i, &d) in dst.iter().enumerate() {
            let (lo, hi) = if trans {
                (rows[i][2 * q][g], rows[i][2 * q + 1][g])
            } else {
                (rows[i][g][2 * q], rows[i][g][2 * q + 1])
            };
            th.regs[d] = u64::from(lo) | (u64::from(hi) << 16);
        }
    }
}

/// `mma.sync.aligned.m16n8k16.row.col.f32.<h>.<h>.f32`: D = A·B + C over the
/// warp's fragments (A 16×16, B 16×8, C and D 16×8), summed in f64 and
/// rounded once (the hardware's order and rounding are unspecified; tests
/// compare within a tolerance).
fn mma(ctx: &Ctx, inst: &Inst, warp: &mut [Thread]) {
    let p = &inst.parts;
    assert!(p.len() == 10 && p[3] == "m16n8k16" && p[4] == "row" && p[5] == "col", "{}", inst.text);
    let half = p[7].as_str();
    let widen = |h: u64| -> f64 {
        let h = h as u16;
        match half {
            "bf16" => f64::from(bf16::from_bits(h).to_f32()),
            "f16" => f64::from(f16::from_bits(h).to_f32()),
            other => panic!("{}: mma on {other}", ctx.prog.name),
        }
    };
    let (d, a, b, c) = (regs_of(&inst.args[0]), regs_of(&inst.args[1]), regs_of(&inst.args[2]), regs_of(&inst.args[3]));
    let mut am = [[0f64; 16]; 16];
    let mut bm = [[0f64; 8]; 16];
    let mut cm = [[0f64; 8]; 16];
    for (t, th) in warp.iter().enumerate() {
        let (g, q) = (t / 4, t % 4);
        for (r, &reg) in a.iter().enumerate() {
            let (row, col) = (g + 8 * (r % 2), 2 * q + 8 * (r / 2));
            am[row][col] = widen(th.regs[reg] & 0xffff);
            am[row][col + 1] = widen(th.regs[reg] >> 16);
        }
        for (r, &reg) in b.iter().enumerate() {
            let k = 2 * q + 8 * r;
            bm[k][g] = widen(th.regs[reg] & 0xffff);
            bm[k + 1][g] = widen(th.regs[reg] >> 16);
        }
        for (r, &reg) in c.iter().enumerate() {
            cm[g + 8 * (r / 2)][2 * q + r % 2] = f64::from(f(th.regs[reg]));
        }
    }
    for (t, th) in warp.iter_mut().enumerate() {
        let (g, q) = (t / 4, t % 4);
        for (r, &reg) in d.iter().enumerate() {
            let (row, col) = (g + 8 * (r / 2), 2 * q + r % 2);
            let sum: f64 = cm[row][col] + (0..16).map(|k| am[row][k] * bm[k][col]).sum::<f64>();
            th.regs[reg] = fb(sum as f32);
        }
    }
}

/// One warp's share of `wgmma.mma_async.sync.aligned.m64nNkK.f32.<t>.<t>`
/// (`f16`/`bf16` with K = 16, or `tf32` with K = 8, its `f32` values cut to
/// their top 19 bits):
/// warp `quarter` of the warpgroup computes rows `16·quarter..+16` of the
/// 64×N product. Operands in shared memory in the 128-byte swizzle, as their
/// descriptors and transpose flags say: element (row r, k) of a
/// `k`-contiguous tile at `start + (r/8)·SBO + (r%8)·128 + 2k`, of an
/// `m`/`n`-contiguous one at `start + (r/64)·LBO + (k/8)·SBO + (k%8)·128 +
/// 2(r%64)` (the PTX ISA's "leading" dimension of such a tile is m or n),
/// address bits 4–6 XORed with bits 7–9. With `A` in registers (a vector of
/// four words in place of its descriptor, and no transpose flag for it),
/// lane `l` of the warp holds rows `l/4` and `l/4 + 8` at `k = 2(l%4)` and
/// the one after in words 0 and 1, at `k + 8` in words 2 and 3. Summed in
/// f64, rounded once.
fn wgmma(ctx: &Ctx, inst: &Inst, warp: &mut [Thread], quarter: usize, mem: &mut Memory, shared: &mut [u8]) {
    let p = &inst.parts;
    let shape = p[4].as_str();
    let (n, kk) = shape.strip_prefix("m64n").and_then(|r| r.split_once('k')).unwrap();
    let (n, kk): (usize, usize) = (n.parse().unwrap(), kk.parse().unwrap());
    let half = p[6].as_str();
    let esz: u64 = if half == "tf32" { 4 } else { 2 };
    assert_eq!(kk as u64 * esz, 32, "{}: k of the shape", inst.text);
    assert_eq!(p[5], "f32", "{}", inst.text);
    let d = regs_of(&inst.args[0]);
    assert_eq!(d.len(), n / 2, "{}", inst.text);
    let imm = |i: usize| match inst.args[i] {
        Opnd::Imm(v) => v,
        ref o => panic!("{}: wgmma immediate {o:?}", ctx.prog.name),
    };
    assert_eq!((imm(4), imm(5)), (1, 1), "{}: scales", inst.text);
    // A from registers: four words per thread, no transpose flag for A.
    let a_regs = match &inst.args[1] {
        Opnd::Vec(_) => Some(regs_of(&inst.args[1])),
        _ => None,
    };
    // TF32 has no transpose flags: both operands k-contiguous.
    let (mn_major_a, mn_major_b) = match (esz, &a_regs) {
        (4, _) => (false, false),
        (_, Some(_)) => (false, imm(6) == 1),
        _ => (imm(6) == 1, imm(7) == 1),
    };
    let t0 = &warp[0];
    let (desc_a, desc_b, scale_d) = (
        if a_regs.is_some() { 0 } else { val(ctx, t0, &inst.args[1]) },
        val(ctx, t0, &inst.args[2]),
        val(ctx, t0, &inst.args[3]),
    );
    for t in warp.iter() {
        if a_regs.is_none() {
            assert_eq!(val(ctx, t, &inst.args[1]), desc_a, "{}: descriptors differ across the warp", ctx.prog.name);
        }
        assert_eq!(val(ctx, t, &inst.args[2]), desc_b, "{}: descriptors differ across the warp", ctx.prog.name);
    }
    // Element (r, k), r along m or n: k-contiguous rows of 128 bytes in groups
    // of 8 `sbo` apart; or m/n-contiguous atoms of 8 values of k by 64 along r,
    // `lbo` apart along r and `sbo` apart along k.
    let mut element = |desc: u64, mn_major: bool, r: usize, k: usize| -> f64 {
        assert_eq!(desc >> 62, 1, "{}: only the 128-byte swizzle is modelled", ctx.prog.name);
        let start = (desc & 0x3fff) << 4;
        let lbo = ((desc >> 16) & 0x3fff) << 4;
        let sbo = ((desc >> 32) & 0x3fff) << 4;
        let (r, k) = (r as u64, k as u64);
        let logical = if mn_major {
            start + (r / 64) * lbo + (k / 8) * sbo + (k % 8) * 128 + 2 * (r % 64)
        } else {
            start + (r / 8) * sbo + (r % 8) * 128 + esz * k
        };
        let physical = logical ^ (((logical >> 7) & 7) << 4);
        let b = access(ctx, mem, shared, "shared", physical, esz as usize, &inst.text);
        match half {
            "bf16" => f64::from(bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()),
            "f16" => f64::from(f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()),
            // TF32 reads the top 19 bits of the f32: the low 13 mantissa bits are dropped.
            "tf32" => f64::from(f32::from_bits(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) & !0x1fff)),
            other => panic!("{}: wgmma on {other}", ctx.prog.name),
        }
    };
    let a: Vec<Vec<f64>> = match &a_regs {
        // TF32: lane l: word 0 row l/4, word 1 row l/4 + 8, at k = l%4; words 2, 3 the
        // same at k + 4; each word's top 19 bits read.
        Some(ar) if half == "tf32" => {
            assert_eq!(ar.len(), 4, "{}: A takes four registers", inst.text);
            let mut m = vec![vec![0.0; kk]; 16];
            for (l, th) in warp.iter().enumerate() {
                let (g, q) = (l / 4, l % 4);
                for (w, &reg) in ar.iter().enumerate() {
                    let bits = (th.regs[reg] as u32) & !0x1fff;
                    m[g + 8 * (w % 2)][q + 4 * (w / 2)] = f64::from(f32::from_bits(bits));
                }
            }
            m
        }
        // Halves: lane l: word 0 row l/4, word 1 row l/4 + 8, at k = 2(l%4) (+1); words 2, 3 the same at k + 8.
        Some(ar) => {
            assert_eq!(ar.len(), 4, "{}: A takes four registers", inst.text);
            let widen = |h: u64| match half {
                "bf16" => f64::from(bf16::from_bits(h as u16).to_f32()),
                "f16" => f64::from(f16::from_bits(h as u16).to_f32()),
                other => panic!("{}: wgmma with A in registers on {other}", ctx.prog.name),
            };
            let mut m = vec![vec![0.0; kk]; 16];
            for (l, th) in warp.iter().enumerate() {
                let (g, q) = (l / 4, l % 4);
                for (w, &reg) in ar.iter().enumerate() {
                    let (row, col) = (g + 8 * (w % 2), 2 * q + 8 * (w / 2));
                    m[row][col] = widen(th.regs[reg] & 0xffff);
                    m[row][col + 1] = widen((th.regs[reg] >> 16) & 0xffff);
                }
            }
            m
        }
        None => (0..16).map(|r| (0..kk).map(|k| element(desc_a, mn_major_a, 16 * quarter + r, k)).collect()).collect(),
    };
    let b: Vec<Vec<f64>> = (0..n).map(|c| (0..kk).map(|k| element(desc_b, mn_major_b, c, k)).collect()).collect();
    for (l, th) in warp.iter_mut().enumerate() {
        let (g, q) = (l / 4, l % 4);
        for (i, &reg) in d.iter().enumerate() {
            let (row, col) = (g + 8 * ((i % 4) / 2), 8 * (i / 4) + 2 * q + i % 2);
            let old = if scale_d != 0 { f64::from(f(th.regs[reg])) } else { 0.0 };
            let sum: f64 = old + (0..kk).map(|k| a[row][k] * b[col][k]).sum::<f64>();
            th.regs[reg] = fb(sum as f32);
        }
    }
}

/// Named barriers: per id, threads arrived towards the current generation
/// and the generations completed.
#[derive(Default)]
struct Barriers {
    state: HashMap<u32, (u32, u64)>,
}

impl Barriers {
    fn generation(&self, id: u32) -> u64 {
        self.state.get(&id).map_or(0, |s| s.1)
    }

    /// Counts one thread at barrier `id` of `count` threads; returns the
    /// generation it arrived in and whether its arrival completed it.
    fn arrive(&mut self, id: u32, count: u32) -> (u64, bool) {
        let s = self.state.entry(id).or_insert((0, 0));
        let generation = s.1;
        s.0 += 1;
        if s.0 == count {
            *s = (0, generation + 1);
            (generation, true)
        } else {
            (generation, false)
        }
    }
}

struct Ctx<'a> {
    prog: &'a Program,
    argv: &'a [u64],
    cta: (u32, u32, u32),
    nt: (u32, u32, u32),
    nct: (u32, u32, u32),
    approx: (f64, f64, f64),
}

fn val(ctx: &Ctx, t: &Thread, o: &Opnd) -> u64 {
    match o {
        Opnd::Reg(r) => t.regs[*r],
        Opnd::Imm(v) => *v,
        Opnd::Sym(a) => u64::from(*a),
        Opnd::Special(s) => u64::from(match *s {
            "%tid.x" => t.tid.0,
            "%tid.y" => t.tid.1,
            "%tid.z" => t.tid.2,
            "%ntid.x" => ctx.nt.0,
            "%ntid.y" => ctx.nt.1,
            "%ntid.z" => ctx.nt.2,
            "%ctaid.x" => ctx.cta.0,
            "%ctaid.y" => ctx.cta.1,
            "%ctaid.z" => ctx.cta.2,
            "%nctaid.x" => ctx.nct.0,
            "%nctaid.y" => ctx.nct.1,
            "%nctaid.z" => ctx.nct.2,
            "%laneid" => t.lane,
            s => panic!("special {s}"),
        }),
        Opnd::Param(i) => ctx.argv[*i],
        other => panic!("{}: not a value: {other:?}", ctx.prog.name),
    }
}

fn addr(ctx: &Ctx, t: &Thread, o: &Opnd) -> u64 {
    match o {
        Opnd::Mem(base, off) => val(ctx, t, base).wrapping_add(*off as u64),
        other => panic!("{}: not an address: {other:?}", ctx.prog.name),
    }
}

fn access<'m>(
    ctx: &Ctx,
    mem: &'m mut Memory,
    shared: &'m mut [u8],
    space: &str,
    a: u64,
    n: usize,
    text: &str,
) -> &'m mut [u8] {
    assert!(a.is_multiple_of(n.min(16) as u64), "{}: misaligned {n}-byte access at {a:#x}: {text}", ctx.prog.name);
    if space == "shared" {
        let a = a as usize;
        assert!(
            a + n <= shared.len(),
            "{}: shared access [{a}, {}) beyond {} bytes: {text}",
            ctx.prog.name,
            a + n,
            shared.len()
        );
        &mut shared[a..a + n]
    } else {
        mem.slot(a, n, format_args!("{}: {text}", ctx.prog.name))
    }
}

fn setp(cmp: &str, ty: &str, a: u64, b: u64) -> bool {
    if ty == "f32" {
        let (x, y) = (f(a), f(b));
        let nan = x.is_nan() || y.is_nan();
        return match cmp {
            "eq" => !nan && x == y,
            "ne" => !nan && x != y,
            "lt" => !nan && x < y,
            "le" => !nan && x <= y,
            "gt" => !nan && x > y,
            "ge" => !nan && x >= y,
            "neu" => nan || x != y,
            "ltu" => nan || x < y,
            "geu" => nan || x >= y,
            "nan" => nan,
            "num" => !nan,
            c => panic!("setp.{c}.f32"),
        };
    }
    let signed = ty.starts_with('s');
    let bits = type_bits(ty);
    let (x, y): (i128, i128) = if signed {
        if bits == 32 {
            (a as u32 as i32 as i128, b as u32 as i32 as i128)
        } else {
            (a as i64 as i128, b as i64 as i128)
        }
    } else if bits == 32 {
        (a as u32 as i128, b as u32 as i128)
    } else {
        (a as i128, b as i128)
    };
    match cmp {
        "eq" => x == y,
        "ne" => x != y,
        "lt" => x < y,
        "le" => x <= y,
        "gt" => x > y,
        "ge" => x >= y,
        c => panic!("setp.{c}.{ty}"),
    }
}

fn int_op(op: &str, ty: &str, a: u64, b: u64) -> u64 {
    let bits = type_bits(ty);
    let mask = if bits == 32 { 0xffff_ffffu64 } else { u64::MAX };
    let signed = ty.starts_with('s');
    let r = match op {
        "add" => a.wrapping_add(b),
        "sub" => a.wrapping_sub(b),
        "mul" => a.wrapping_mul(b),
        "and" => a & b,
        "or" => a | b,
        "xor" => a ^ b,
        "shl" => {
            if b >= u64::from(bits) {
                0
            } else {
                a << b
            }
        }
        "shr" => {
            if signed {
                let v = if bits == 32 { a as u32 as i32 as i64 } else { a as i64 };
                (v >> b.min(u64::from(bits) - 1)) as u64
            } else if b >= u64::from(bits) {
                0
            } else {
                (a & mask) >> b
            }
        }
        "div" | "rem" | "min" | "max" => {
            if signed {
                let (x, y) =
                    if bits == 32 { (a as u32 as i32 as i64, b as u32 as i32 as i64) } else { (a as i64, b as i64) };
                (match op {
                    "div" => x.checked_div(y).unwrap_or(-1),
                    "rem" => x.checked_rem(y).unwrap_or(x),
                    "min" => x.min(y),
                    _ => x.max(y),
                }) as u64
            } else {
                let (x, y) = (a & mask, b & mask);
                match op {
                    "div" => x.checked_div(y).unwrap_or(mask),
                    "rem" => x.checked_rem(y).unwrap_or(x),
                    "min" => x.min(y),
                    _ => x.max(y),
                }
            }
        }
        o => panic!("integer op {o}.{ty}"),
    };
    r & mask
}

fn float_op(op: &str, nan_mode: bool, a: f32, b: f32) -> f32 {
    match op {
        "add" => a + b,
        "sub" => a - b,
        "mul" => a * b,
        "div" => a / b,
        "min" if nan_mode => {
            if a.is_nan() || b.is_nan() {
                f32::NAN
            } else {
                a.min(b)
            }
        }
        "max" if nan_mode => {
            if a.is_nan() || b.is_nan() {
                f32::NAN
            } else {
                a.max(b)
            }
        }
        "min" => a.min(b),
        "max" => a.max(b),
        o => panic!("float op {o}"),
    }
}

/// Executes `t` until it ends or reaches a barrier or shuffle.
fn step_until_sync(ctx: &Ctx, t: &mut Thread, mem: &mut Memory, shared: &mut [u8], bars: &mut Barriers) {
    let code = &ctx.prog.code;
    let mut budget = 50_000_000u64;
    loop {
        budget -= 1;
        assert!(budget > 0, "{}: runaway thread", ctx.prog.name);
        let Some(inst) = code.get(t.pc) else { panic!("{}: fell off the end", ctx.prog.name) };
        if let Some((p, neg)) = inst.guard {
            let on = t.regs[p] != 0;
            if on == neg {
                t.pc += 1;
                continue;
            }
        }
        let p = &inst.parts;
        let op = p[0].as_str();
        let ty = p.last().map(String::as_str).unwrap_or("");
        let dst = |inst: &Inst| match inst.args.first() {
            Some(Opnd::Reg(r)) => *r,
            other => panic!("{}: bad destination {other:?} in {}", ctx.prog.name, inst.text),
        };
        let a = |i: usize| val(ctx, t, &inst.args[i]);
        match op {
            // bar.sync 0 (the whole block), barrier.sync id, n and barrier.arrive id, n.
            "bar" | "barrier" => {
                let id = a(0) as u32;
                let block = ctx.nt.0 * ctx.nt.1 * ctx.nt.2;
                let count = inst.args.get(1).map_or(block, |_| a(1) as u32);
                assert!(count <= block && count % 32 == 0, "{}: {}: thread count", ctx.prog.name, inst.text);
                let (generation, completed) = bars.arrive(id, count);
                match p[1].as_str() {
                    "sync" if !completed => {
                        t.bar_wait = Some((id, generation));
                        t.waiting = true;
                        return;
                    }
                    "sync" | "arrive" => t.pc += 1,
                    other => panic!("{}: barrier.{other}", ctx.prog.name),
                }
                continue;
            }
            "shfl" | "ldmatrix" | "mma" => {
                t.waiting = true;
                return;
            }
            // wgmma.mma_async is computed at issue (warp by warp, below); its
            // fence, commit and wait, and the proxy fence, order nothing here.
            "wgmma" if p[1] == "mma_async" => {
                t.waiting = true;
                return;
            }
            "wgmma" | "fence" => {
                t.pc += 1;
                continue;
            }
            // One grid at a time here: there is no kernel before to wait for
            // and none after to launch; no cache to prefetch into.
            "griddepcontrol" | "prefetch" => {
                t.pc += 1;
                continue;
            }
            "ret" => {
                assert!(
                    t.open_copies.is_empty() && t.groups.iter().all(Vec::is_empty),
                    "{}: thread exits with cp.async copies in flight",
                    ctx.prog.name
                );
                t.done = true;
                return;
            }
            "bra" => {
                match inst.args[0] {
                    Opnd::Label(l) => t.pc = l,
                    _ => panic!("bra target"),
                }
                continue;
            }
            "ld" | "st" => {
                let space = p[1].as_str();
                let width =
                    p.iter().find_map(|x| x.strip_prefix('v').and_then(|n| n.parse::<usize>().ok())).unwrap_or(1);
                let esz = (type_bits(ty) / 8) as usize;
                if op == "ld" && space == "param" {
                    let v = match inst.args[1] {
                        Opnd::Param(i) => ctx.argv[i],
                        _ => panic!("ld.param operand"),
                    };
                    let d = dst(inst);
                    t.regs[d] = v;
                    t.pc += 1;
                    continue;
                }
                let (ai, vi) = if op == "ld" { (1, 0) } else { (0, 1) };
                let ad = addr(ctx, t, &inst.args[ai]);
                let vals = match &inst.args[vi] {
                    Opnd::Vec(v) => v.as_slice(),
                    x => std::slice::from_ref(x),
                };
                assert_eq!(vals.len(), width, "vector width");
                let bytes = access(ctx, mem, shared, space, ad, esz * width, &inst.text);
                if op == "ld" {
                    for (i, o) in vals.iter().enumerate() {
                        let c = &bytes[i * esz..(i + 1) * esz];
                        let v = match esz {
                            // Narrow loads into 32-bit registers: zero- or sign-extended.
                            1 if ty == "s8" => u64::from(c[0] as i8 as i32 as u32),
                            1 => u64::from(c[0]),
                            2 => u64::from(u16::from_ne_bytes([c[0], c[1]])),
                            4 => u64::from(u32::from_ne_bytes([c[0], c[1], c[2], c[3]])),
                            _ => u64::from_ne_bytes(c.try_into().unwrap()),
                        };
                        if let Opnd::Reg(r) = o {
                            t.regs[*r] = v;
                        }
                    }
                } else {
                    let vs: Vec<u64> = vals.iter().map(|o| val(ctx, t, o)).collect();
                    for (i, v) in vs.iter().enumerate() {
                        let c = &mut bytes[i * esz..(i + 1) * esz];
                        match esz {
                            1 => c[0] = *v as u8,
                            2 => c.copy_from_slice(&(*v as u16).to_ne_bytes()),
                            4 => c.copy_from_slice(&(*v as u32).to_ne_bytes()),
                            _ => c.copy_from_slice(&v.to_ne_bytes()),
                        }
                    }
                }
                t.pc += 1;
                continue;
            }
            "cp" => {
                // cp.async, modelled as late as the rules allow: the source is read at
                // issue, the destination is poisoned (all-ones bytes: NaN) at issue, and
                // the data lands only when a `cp.async.wait_group` retires its group. A
                // kernel that reads a tile before waiting for it, or overwrites a stage
                // another thread still reads, computes NaNs.
                match p[2].as_str() {
                    "ca" | "cg" => {
                        let n = a(2) as usize;
                        let src_size = if inst.args.len() > 3 { a(3) as usize } else { n };
                        let d_at = addr(ctx, t, &inst.args[0]);
                        let s_at = addr(ctx, t, &inst.args[1]);
                        let mut data = vec![0u8; n];
                        if src_size > 0 {
                            let src = access(ctx, mem, shared, "global", s_at, n, &inst.text);
                            data[..src_size].copy_from_slice(&src[..src_size]);
                        }
                        access(ctx, mem, shared, "shared", d_at, n, &inst.text).fill(0xFF);
                        t.open_copies.push((d_at, data));
                    }
                    "commit_group" => {
                        let g = std::mem::take(&mut t.open_copies);
                        t.groups.push_back(g);
                    }
                    "wait_group" => {
                        let keep = a(0) as usize;
                        while t.groups.len() > keep {
                            for (d_at, data) in t.groups.pop_front().unwrap_or_default() {
                                access(ctx, mem, shared, "shared", d_at, data.len(), &inst.text).copy_from_slice(&data);
                            }
                        }
                    }
                    other => panic!("{}: cp.async.{other}", ctx.prog.name),
                }
                t.pc += 1;
                continue;
            }
            // `mov.b32 {lo, hi}, w` splits a word into halves.
            "mov" if matches!(inst.args[0], Opnd::Vec(_)) => {
                let w = a(1);
                if let Opnd::Vec(parts) = &inst.args[0] {
                    for (k, o) in parts.iter().enumerate() {
                        if let Opnd::Reg(r) = o {
                            t.regs[*r] = (w >> (16 * k)) & 0xffff;
                        }
                    }
                }
                t.pc += 1;
                continue;
            }
            _ => {}
        }
        let d = dst(inst);
        let r: u64 = match op {
            // `mov.b32 w, {lo, hi}` joins two halves.
            "mov" if matches!(inst.args[1], Opnd::Vec(_)) => match &inst.args[1] {
                Opnd::Vec(parts) => parts.iter().enumerate().map(|(k, o)| (val(ctx, t, o) & 0xffff) << (16 * k)).sum(),
                _ => unreachable!(),
            },
            "mov" => a(1),
            "cvta" => a(1),
            "selp" => {
                if a(3) != 0 {
                    a(1)
                } else {
                    a(2)
                }
            }
            "setp" => u64::from(setp(&p[1], ty, a(1), a(2))),
            "not" => u64::from(a(1) == 0),
            "and" | "or" | "xor" if ty == "pred" => {
                let (x, y) = (a(1) != 0, a(2) != 0);
                u64::from(match op {
                    "and" => x && y,
                    "or" => x || y,
                    _ => x != y,
                })
            }
            "cvt" => {
                let (dt, st) = (p[p.len() - 2].as_str(), p[p.len() - 1].as_str());
                let rnd = if p.len() == 4 { p[1].as_str() } else { "" };
                let x = a(1);
                match (dt, st) {
                    // Round to nearest, ties away from zero, to 10 mantissa bits.
                    ("tf32", "f32") => {
                        let v = x as u32;
                        if f(x).is_nan() { u64::from(v) } else { u64::from(v.wrapping_add(0x1000) & !0x1fff) }
                    }
                    ("f32", "u32") => fb(x as u32 as f32),
                    ("f32", "s32") => fb(x as u32 as i32 as f32),
                    ("f32", "u64") => fb(x as f32),
                    ("f32", "f32") => fb(match rnd {
                        "rni" => f(x).round_ties_even(),
                        "rmi" => f(x).floor(),
                        "rzi" => f(x).trunc(),
                        r => panic!("cvt.{r}.f32.f32"),
                    }),
                    ("u32", "f32") => u64::from(f(x) as u32),
                    ("s32", "f32") => u64::from(f(x) as i32 as u32),
                    ("u64", "u32") => x & 0xffff_ffff,
                    ("u32", "u64") => x & 0xffff_ffff,
                    ("u64", "s32") | ("s64", "s32") => x as u32 as i32 as i64 as u64,
                    ("u32", "u16") => x & 0xffff,
                    ("f32", "f16") => fb(f16::from_bits(x as u16).to_f32()),
                    ("f16", "f32") => u64::from(to_half(f(x), "f16")),
                    ("bf16", "f32") => u64::from(to_half(f(x), "bf16")),
                    // The first source fills the upper half.
                    ("f16x2", "f32") | ("bf16x2", "f32") => {
                        let h = dt.trim_end_matches("x2");
                        (u64::from(to_half(f(x), h)) << 16) | u64::from(to_half(f(a(2)), h))
                    }
                    (d2, s2) => panic!("cvt {d2} <- {s2}"),
                }
            }
            "fma" => fb(f(a(1)).mul_add(f(a(2)), f(a(3)))),
            // dp4a.s32.s32: c + the products of the four signed bytes of a and b.
            "dp4a" => {
                let (x, y) = (a(1) as u32, a(2) as u32);
                let dot: i32 =
                    (0..4).map(|i| i32::from((x >> (8 * i)) as u8 as i8) * i32::from((y >> (8 * i)) as u8 as i8)).sum();
                u64::from((a(3) as u32 as i32).wrapping_add(dot) as u32)
            }
            "mad" => {
                let m = int_op("mul", ty, a(1), a(2));
                int_op("add", ty, m, a(3))
            }
            "mul" if p[1] == "wide" => {
                if ty == "u32" {
                    (a(1) & 0xffff_ffff) * (a(2) & 0xffff_ffff)
                } else {
                    ((a(1) as u32 as i32 as i64) * (a(2) as u32 as i32 as i64)) as u64
                }
            }
            "neg" if ty == "f32" => fb(-f(a(1))),
            "abs" if ty == "f32" => fb(f(a(1)).abs()),
            "copysign" => fb(f(a(2)).copysign(f(a(1)))),
            "rcp" if p[1] == "approx" => fb(((1.0 / f(a(1)) as f64) * ctx.approx.2) as f32),
            "rcp" => fb(1.0 / f(a(1))),
            "sqrt" => fb(f(a(1)).sqrt()),
            "rsqrt" => fb((1.0 / (f(a(1)) as f64).sqrt()) as f32),
            "ex2" => fb(((f(a(1)) as f64).exp2() * ctx.approx.0) as f32),
            "lg2" => fb(((f(a(1)) as f64).log2() + ctx.approx.1) as f32),
            "tanh" => fb(f(a(1)).tanh()),
            // sin/cos.approx: absolute error 2^-20.9 on [-pi, pi], pushed the way of the lg2 term.
            "sin" => fb(((f(a(1)) as f64).sin()
                + SIN_COS_ERROR * ctx.approx.1.signum() * f64::from(ctx.approx.1 != 0.0))
                as f32),
            "cos" => fb(((f(a(1)) as f64).cos()
                + SIN_COS_ERROR * ctx.approx.1.signum() * f64::from(ctx.approx.1 != 0.0))
                as f32),
            "add" | "sub" | "mul" | "div" | "min" | "max" if ty == "f32" => {
                fb(float_op(op, p.iter().any(|x| x == "NaN"), f(a(1)), f(a(2))))
            }
            "add" | "sub" | "mul" | "div" | "rem" | "min" | "max" | "and" | "or" | "xor" | "shl" | "shr" => {
                let ity = if ty.starts_with('b') { if type_bits(ty) == 32 { "u32" } else { "u64" } } else { ty };
                int_op(op, ity, a(1), a(2))
            }
            _ => panic!("{}: instruction not emulated: {}", ctx.prog.name, inst.text),
        };
        t.regs[d] = r;
        t.pc += 1;
    }
}

/// Builds, parses and caches kernels (sm_90 text).
#[derive(Default)]
pub struct Kernels {
    cache: std::sync::Mutex<HashMap<KernelId, std::sync::Arc<(Kernel, Program)>>>,
}

impl Kernels {
    pub fn get(&self, id: KernelId) -> std::sync::Arc<(Kernel, Program)> {
        let mut c = self.cache.lock().unwrap();
        c.entry(id)
            .or_insert_with(|| {
                let k: Kernel = id.build(id.target_on(Target::Sm90)).unwrap_or_else(|e| panic!("{e}"));
                let p = Program::parse(k.ptx());
                std::sync::Arc::new((k, p))
            })
            .clone()
    }
}
