fn main() {
    let dir = std::env::args().nth(1).unwrap();
    for t in compute_ptx::Target::ALL {
        for k in compute_ptx::kernels::catalog() {
            match k.build(t) {
                Ok(kern) => std::fs::write(format!("{dir}/{}_{}.ptx", t.name(), kern.name()), kern.ptx()).unwrap(),
                Err(e) => eprintln!("{e}"),
            }
        }
    }
}
