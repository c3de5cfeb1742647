//! The strided loop of the memory-bound kernels that keep several loads in
//! flight per thread: a thread visits the units `start, start + stride, … <
//! end` (a unit being whatever the caller loads at once: 16 bytes, or one
//! element), `unroll` of them per round. Full rounds run unguarded; the last
//! round guards each of its units by `unit < end`, so the loads of a round are
//! always issued together and no tail is walked one latency at a time.

use crate::builder::{Cmp, KernelBuilder, Pred, Reg, U32};

/// Emits the loop. `round(b, units, guards)` emits one round: `units` holds
/// the `unroll` unit indices of the round, `guards` (in the last round only)
/// the predicate under which each may be touched. `hint` names the labels.
/// Costs two integer compares per round besides the caller's body.
pub(crate) fn strided_rounds(
    b: &mut KernelBuilder,
    (start, stride, end): (Reg<U32>, Reg<U32>, Reg<U32>),
    unroll: u32,
    hint: &str,
    mut round: impl FnMut(&mut KernelBuilder, &[Reg<U32>], Option<&[Reg<Pred>]>),
) {
    let i = b.mov(start);
    let span = b.mul(stride, unroll - 1);
    let step = b.mul(stride, unroll);
    let full = b.label(&format!("{hint}_full"));
    let last = b.label(&format!("{hint}_last"));
    let done = b.label(&format!("{hint}_done"));
    b.place(full);
    // `end - i`, compared only when i < end: no overflow near 2³².
    let out = b.setp(Cmp::Ge, i, end);
    b.bra_if(out, done);
    let left = b.sub(end, i);
    let short = b.setp(Cmp::Le, left, span);
    b.bra_if(short, last);
    let units = unit_indices(b, i, stride, unroll);
    round(b, &units, None);
    let next = b.add(i, step);
    b.assign(i, next);
    b.bra(full);

    b.place(last);
    let units = unit_indices(b, i, stride, unroll);
    let guards: Vec<Reg<Pred>> = (0..unroll)
        .map(|t| {
            let off = b.mul(stride, t);
            b.setp(Cmp::Lt, off, left)
        })
        .collect();
    round(b, &units, Some(&guards));
    b.place(done);
}

fn unit_indices(b: &mut KernelBuilder, i: Reg<U32>, stride: Reg<U32>, unroll: u32) -> Vec<Reg<U32>> {
    let mut units = vec![i];
    for _ in 1..unroll {
        let prev = units[units.len() - 1];
        units.push(b.add(prev, stride));
    }
    units
}

/// Runs `f` under `guard` when there is one, unguarded otherwise.
pub(crate) fn maybe_guarded(b: &mut KernelBuilder, guard: Option<Reg<Pred>>, f: impl FnOnce(&mut KernelBuilder)) {
    match guard {
        Some(p) => b.guarded(p, false, f),
        None => f(b),
    }
}
