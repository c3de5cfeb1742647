//! Builds a small kernel with the PTX builder and prints its PTX. No GPU needed.
//!
//! `cargo run -p compute-ptx --example ptx_quickstart`
use compute_ptx::builder::{Cmp, F32, KernelBuilder, Target, U32};

fn main() {
    // y[i] = a·x[i] + y[i] for i < n: one thread per element.
    let mut b = KernelBuilder::new("saxpy", Target::Sm90);
    b.doc("saxpy: y = a*x + y, one thread per element");
    let x = b.param_ptr("x");
    let y = b.param_ptr("y");
    let a = b.param::<F32>("a");
    let n = b.param::<U32>("n");
    let i = b.global_index_x();
    let done = b.label("done");
    let out = b.setp(Cmp::Ge, i, n);
    b.bra_if(out, done);
    let off = b.mul_wide(i, 4u32);
    let xa = b.add(x, off);
    let ya = b.add(y, off);
    let xv = b.ld_global::<F32>(xa, 0);
    let yv = b.ld_global::<F32>(ya, 0);
    let r = b.fma(xv, a, yv);
    b.st_global(ya, 0, r);
    b.place(done);
    b.ret();
    match b.finish() {
        Ok(k) => print!("{}", k.ptx()),
        Err(e) => eprintln!("{e}"),
    }
}
