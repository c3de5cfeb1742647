//! NCCL collectives (feature `nccl`): on every visible GPU, against values
//! computed on the host. Without NCCL or a GPU each test says why it skipped
//! (and that much is itself checked: a missing library is a typed error, not
//! a panic). `COMPUTE_REQUIRE=nccl` turns a skip into a failure.

use compute_core::conformance::rng::Rng;
use compute_core::{Backend, ComputeError, DType, HostVec, Tensor};
use compute_ptx::CudaBackend;
use compute_ptx::cuda::nccl::{self, Communicator, ReduceOp};

/// One backend per visible GPU and their communicator, or `None` (skipped)
/// where there is no GPU or no NCCL.
fn setup(test: &str) -> Option<(Vec<CudaBackend>, Communicator)> {
    let require = std::env::var("COMPUTE_REQUIRE").is_ok_and(|v| v.split(',').any(|s| s.trim() == "nccl"));
    let skip = |why: String| {
        assert!(!require, "{test}: NCCL required but {why}");
        eprintln!("SKIPPED: {test}: {why}");
        None
    };
    let n = nccl::device_count();
    if n == 0 {
        return skip("no CUDA device".into());
    }
    let backends: Vec<CudaBackend> = match (0..n as u32).map(CudaBackend::with_device).collect() {
        Ok(b) => b,
        Err(e) => return skip(format!("devices: {e}")),
    };
    match Communicator::new(&backends) {
        Ok(c) => Some((backends, c)),
        Err(e @ ComputeError::DeviceUnavailable { .. }) => skip(e.to_string()),
        Err(e) => panic!("{test}: {e}"),
    }
}

fn upload(b: &CudaBackend, values: &[f32], dtype: DType) -> Tensor {
    b.upload_typed(HostVec::from_f32(dtype, values).as_slice()).expect("upload")
}

fn download(b: &CudaBackend, t: &Tensor) -> Vec<f32> {
    let mut out = HostVec::zeros(t.dtype(), t.len());
    b.download_typed(t, out.as_mut()).expect("download");
    out.to_f32()
}

/// The values as `dtype` stores them.
fn rounded(values: &[f32], dtype: DType) -> Vec<f32> {
    HostVec::from_f32(dtype, values).to_f32()
}

#[test]
fn a_missing_library_is_a_typed_error() {
    match nccl::nccl_version() {
        Ok((major, minor, patch)) => {
            eprintln!("NCCL {major}.{minor}.{patch}");
            assert!(major >= 2, "NCCL {major}.{minor}.{patch}");
        }
        Err(ComputeError::DeviceUnavailable { reason, .. }) => eprintln!("no NCCL: {reason}"),
        Err(e) => panic!("unexpected error: {e}"),
    }
}

#[test]
fn all_reduce_sums_every_rank_in_every_dtype() {
    let Some((backends, comm)) = setup("all_reduce_sums_every_rank_in_every_dtype") else { return };
    let mut rng = Rng::new(0x5eed_0031);
    let len = 1000 * backends.len() + 37;
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        // Small integers: every partial sum is exact in each dtype.
        let values: Vec<Vec<f32>> =
            backends.iter().map(|_| rng.vec(len, -8.0, 8.0).into_iter().map(f32::round).collect()).collect();
        let tensors: Vec<Tensor> = backends.iter().zip(&values).map(|(b, v)| upload(b, v, dtype)).collect();
        let refs: Vec<&Tensor> = tensors.iter().collect();
        comm.all_reduce(&refs, ReduceOp::Sum).expect("all_reduce");
        let want: Vec<f32> = (0..len).map(|i| values.iter().map(|v| v[i]).sum()).collect();
        for (b, t) in backends.iter().zip(&tensors) {
            assert_eq!(download(b, t), rounded(&want, dtype), "{dtype} on {}", b.location());
        }
        comm.all_reduce(&refs, ReduceOp::Max).expect("all_reduce max");
        for (b, t) in backends.iter().zip(&tensors) {
            assert_eq!(download(b, t), rounded(&want, dtype), "max of equal tensors, {dtype}");
        }
    }
}

#[test]
fn broadcast_gather_and_scatter_move_the_right_blocks() {
    let Some((backends, comm)) = setup("broadcast_gather_and_scatter_move_the_right_blocks") else { return };
    let ranks = backends.len();
    let mut rng = Rng::new(0x5eed_0032);
    let n = 513;
    let inputs: Vec<Vec<f32>> =
        (0..ranks).map(|_| rng.vec(n, -4.0, 4.0).into_iter().map(f32::round).collect()).collect();
    // Broadcast from the last rank.
    let ts: Vec<Tensor> = backends.iter().zip(&inputs).map(|(b, v)| upload(b, v, DType::F32)).collect();
    let refs: Vec<&Tensor> = ts.iter().collect();
    comm.broadcast(&refs, ranks - 1).expect("broadcast");
    for (b, t) in backends.iter().zip(&ts) {
        assert_eq!(download(b, t), inputs[ranks - 1]);
    }
    // All-gather: every rank gets the blocks in rank order.
    let ins: Vec<Tensor> = backends.iter().zip(&inputs).map(|(b, v)| upload(b, v, DType::BF16)).collect();
    let outs: Vec<Tensor> = backends.iter().map(|b| b.alloc_typed(n * ranks, DType::BF16).expect("alloc")).collect();
    comm.all_gather(&ins.iter().collect::<Vec<_>>(), &outs.iter().collect::<Vec<_>>()).expect("all_gather");
    let gathered: Vec<f32> = inputs.concat();
    for (b, t) in backends.iter().zip(&outs) {
        assert_eq!(download(b, t), rounded(&gathered, DType::BF16));
    }
    // Reduce-scatter: rank r gets block r of the sum.
    let wide: Vec<Vec<f32>> =
        (0..ranks).map(|_| rng.vec(n * ranks, -4.0, 4.0).into_iter().map(f32::round).collect()).collect();
    let ins: Vec<Tensor> = backends.iter().zip(&wide).map(|(b, v)| upload(b, v, DType::F32)).collect();
    let outs: Vec<Tensor> = backends.iter().map(|b| b.alloc_typed(n, DType::F32).expect("alloc")).collect();
    comm.reduce_scatter(&ins.iter().collect::<Vec<_>>(), &outs.iter().collect::<Vec<_>>(), ReduceOp::Sum)
        .expect("reduce_scatter");
    for (r, (b, t)) in backends.iter().zip(&outs).enumerate() {
        let want: Vec<f32> = (0..n).map(|i| wide.iter().map(|v| v[r * n + i]).sum()).collect();
        assert_eq!(download(b, t), want, "block {r}");
    }
}

#[test]
fn bad_operands_are_typed_errors_and_nothing_runs() {
    let Some((backends, comm)) = setup("bad_operands_are_typed_errors_and_nothing_runs") else { return };
    let b0 = &backends[0];
    let t = upload(b0, &[1.0, 2.0, 3.0], DType::F32);
    // Too few tensors for more than one rank; too many for one.
    let refs: Vec<&Tensor> = vec![&t; backends.len() + 1];
    assert!(matches!(comm.all_reduce(&refs, ReduceOp::Sum), Err(ComputeError::Shape { .. })));
    // Out-of-range root.
    let each: Vec<Tensor> = backends.iter().map(|b| upload(b, &[1.0, 2.0, 3.0], DType::F32)).collect();
    let refs: Vec<&Tensor> = each.iter().collect();
    assert!(matches!(comm.broadcast(&refs, backends.len()), Err(ComputeError::Shape { .. })));
    // A device named twice.
    assert!(matches!(Communicator::new(&[b0.clone(), b0.clone()]), Err(ComputeError::Shape { .. })));
    assert_eq!(download(b0, &each[0]), vec![1.0, 2.0, 3.0], "nothing ran");
}

fn refs(v: &[Tensor]) -> Vec<&Tensor> {
    v.iter().collect()
}

/// `C = A·B` on the host (row-major, `B` stored `n × k` when `trans_b`).
fn host_matmul(a: &[f32], b: &[f32], (m, k, n): (usize, usize, usize), trans_b: bool) -> Vec<f32> {
    let mut c = vec![0.0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|p| a[i * k + p] * if trans_b { b[j * k + p] } else { b[p * n + j] }).sum();
        }
    }
    c
}

#[test]
fn sharded_matmul_equals_the_whole_product() {
    use compute_core::MatmulSpec;
    use compute_ptx::cuda::nccl::Split;
    let Some((backends, comm)) = setup("sharded_matmul_equals_the_whole_product") else { return };
    let r = backends.len();
    let mut rng = Rng::new(0x5eed_0033);
    // 192 rows per rank: up to three 64-row chunks of each rank's rows.
    let (m, k, n) = (192 * r, 24 * r, 24 * r);
    // Small integers: every product and sum is exact, in any order.
    let ints = |rng: &mut Rng, len: usize| rng.vec(len, -3.0, 3.0).into_iter().map(f32::round).collect::<Vec<f32>>();
    for (dtype, trans_b) in [(DType::F32, false), (DType::BF16, true)] {
        let spec = MatmulSpec { trans_b, ..MatmulSpec::new(m, k, n) }.with_dtypes(dtype, DType::F32);
        let a = ints(&mut rng, m * k);
        let b = ints(&mut rng, k * n);
        let want = host_matmul(&a, &b, (m, k, n), trans_b);
        for split in [Split::Rows, Split::Inner, Split::Columns] {
            let (mut a_sh, mut b_sh) = (Vec::new(), Vec::new());
            for (i, be) in backends.iter().enumerate() {
                let (ai, bi): (Vec<f32>, Vec<f32>) = match split {
                    Split::Rows => (a[i * m / r * k..(i + 1) * m / r * k].to_vec(), b.clone()),
                    Split::Inner => {
                        let (k0, k1) = (i * k / r, (i + 1) * k / r);
                        let ai = (0..m).flat_map(|row| a[row * k + k0..row * k + k1].to_vec()).collect();
                        let bi = if trans_b {
                            (0..n).flat_map(|j| b[j * k + k0..j * k + k1].to_vec()).collect()
                        } else {
                            b[k0 * n..k1 * n].to_vec()
                        };
                        (ai, bi)
                    }
                    Split::Columns => {
                        let (n0, n1) = (i * n / r, (i + 1) * n / r);
                        let bi = if trans_b {
                            b[n0 * k..n1 * k].to_vec()
                        } else {
                            (0..k).flat_map(|row| b[row * n + n0..row * n + n1].to_vec()).collect()
                        };
                        (a.clone(), bi)
                    }
                };
                a_sh.push(upload(be, &ai, dtype));
                b_sh.push(upload(be, &bi, dtype));
            }
            for chunks in [1, 2, 3] {
                let c: Vec<Tensor> = backends.iter().map(|be| upload(be, &vec![f32::NAN; m * n], DType::F32)).collect();
                comm.matmul_in_chunks(&spec, split, chunks, &refs(&a_sh), &refs(&b_sh), &refs(&c))
                    .expect("sharded matmul");
                for (be, t) in backends.iter().zip(&c) {
                    let got = download(be, t);
                    assert!(
                        got == want,
                        "{split:?} in {chunks} chunks, {dtype} trans_b {trans_b} on {}: first difference at {:?}",
                        be.location(),
                        got.iter().zip(&want).position(|(g, w)| g != w)
                    );
                }
            }
        }
    }
    // A split that does not divide, and a batched spec, are shape errors.
    let odd = MatmulSpec::new(m + 1, k, n + 1);
    let (a, b, c) = (
        upload(&backends[0], &vec![0.0; (m + 1) * k], DType::F32),
        upload(&backends[0], &vec![0.0; k * (n + 1)], DType::F32),
        upload(&backends[0], &vec![0.0; (m + 1) * (n + 1)], DType::F32),
    );
    if r > 1 {
        for split in [Split::Rows, Split::Columns] {
            let err = comm.matmul(&odd, split, &vec![&a; r], &vec![&b; r], &vec![&c; r]);
            assert!(matches!(err, Err(ComputeError::Shape { .. })), "{split:?}: {err:?}");
        }
    }
    let batched = MatmulSpec { batch: 2, ..MatmulSpec::new(m, k, n) };
    let err = comm.matmul(&batched, Split::Inner, &vec![&a; r], &vec![&b; r], &vec![&c; r]);
    assert!(matches!(err, Err(ComputeError::Shape { .. })), "{err:?}");
}

#[test]
fn copies_between_devices_arrive_whole() {
    let Some((backends, _comm)) = setup("copies_between_devices_arrive_whole") else { return };
    let mut rng = Rng::new(0x5eed_0034);
    for dtype in [DType::F32, DType::BF16] {
        let values = rng.vec(100_003, -1.0, 1.0);
        for (i, from) in backends.iter().enumerate() {
            let src = upload(from, &values, dtype);
            for to in &backends {
                let copy = from.copy_to(&src, to).expect("copy_to");
                assert_eq!(copy.location(), to.location());
                assert_eq!(download(to, &copy), rounded(&values, dtype), "{dtype} from {i} to {}", to.location());
            }
            // A tensor of another device is a typed error.
            if let Some(other) = backends.get((i + 1) % backends.len()).filter(|_| backends.len() > 1) {
                let err = other.copy_to(&src, from);
                assert!(matches!(err, Err(ComputeError::WrongDevice { .. })), "{err:?}");
            }
        }
    }
}

#[test]
fn a_product_spread_from_rank_zero_equals_the_whole_product() {
    use compute_core::MatmulSpec;
    let Some((backends, comm)) = setup("a_product_spread_from_rank_zero_equals_the_whole_product") else { return };
    let r = backends.len();
    let mut rng = Rng::new(0x5eed_0035);
    let (m, k, n) = (64 * r, 96, 72);
    let ints = |rng: &mut Rng, len: usize| rng.vec(len, -3.0, 3.0).into_iter().map(f32::round).collect::<Vec<f32>>();
    for (dtype, trans_b) in [(DType::F32, false), (DType::BF16, true)] {
        let spec = MatmulSpec { trans_b, ..MatmulSpec::new(m, k, n) }.with_dtypes(dtype, DType::F32);
        let (a, b) = (ints(&mut rng, m * k), ints(&mut rng, k * n));
        let root = &backends[0];
        let (ta, tb) = (upload(root, &a, dtype), upload(root, &b, dtype));
        let c = upload(root, &vec![f32::NAN; m * n], DType::F32);
        comm.matmul_from_root(&spec, &ta, &tb, &c).expect("matmul_from_root");
        assert_eq!(download(root, &c), host_matmul(&a, &b, (m, k, n), trans_b), "{dtype} trans_b {trans_b}");
    }
    if r > 1 {
        // Operands on another GPU are a typed error.
        let other = upload(&backends[1], &vec![0.0; 64 * r * 96], DType::F32);
        let (b, c) =
            (upload(&backends[0], &vec![0.0; 96 * 72], DType::F32), backends[0].alloc(64 * r * 72).expect("alloc"));
        let err = comm.matmul_from_root(&MatmulSpec::new(64 * r, 96, 72), &other, &b, &c);
        assert!(matches!(err, Err(ComputeError::WrongDevice { .. })), "{err:?}");
    }
}

#[test]
fn scatter_sends_each_rank_its_block() {
    let Some((backends, comm)) = setup("scatter_sends_each_rank_its_block") else { return };
    let r = backends.len();
    let n = 1001;
    for dtype in [DType::F32, DType::BF16] {
        let values: Vec<f32> = (0..r * n).map(|i| (i % 97) as f32).collect();
        let source = upload(&backends[0], &values, dtype);
        let outs: Vec<Tensor> = backends.iter().map(|b| upload(b, &vec![f32::NAN; n], dtype)).collect();
        comm.scatter(&source, &refs(&outs)).expect("scatter");
        for (i, (b, t)) in backends.iter().zip(&outs).enumerate() {
            assert_eq!(download(b, t), values[i * n..(i + 1) * n].to_vec(), "{dtype} block {i}");
        }
        let short = upload(&backends[0], &values[1..], dtype);
        let err = comm.scatter(&short, &refs(&outs));
        assert!(matches!(err, Err(ComputeError::Shape { .. })), "{err:?}");
    }
}
