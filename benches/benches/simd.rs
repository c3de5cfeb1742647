//! Criterion micro-benchmarks of the CPU backend, for regression tracking
//! (`cargo bench -p compute-benches`). The side-by-side report with peers is
//! `cargo xtask bench`.
use compute_core::{Backend, BinaryOp, GeluForm, Op, ReduceOp, RowOp, UnaryOp};
use compute_simd::SimdBackend;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;

fn data(len: usize, seed: u32) -> Vec<f32> {
    (0..len)
        .map(|i| ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8) as f32 / 8_388_608.0 - 1.0)
        .collect()
}

fn elementwise(c: &mut Criterion) {
    let cpu = SimdBackend::new();
    let mut g = c.benchmark_group("elementwise");
    for &len in &[1 << 10, 1 << 16, 1 << 20] {
        let x = data(len, 1);
        let y = data(len, 2);
        let mut out = vec![0.0; len];
        for op in [
            Op::unary(UnaryOp::Relu, len),
            Op::unary(UnaryOp::Sigmoid, len),
            Op::unary(UnaryOp::Gelu(GeluForm::Tanh), len),
            Op::binary(BinaryOp::Add, len),
        ] {
            g.throughput(Throughput::Bytes(op.cost().bytes()));
            let inputs: Vec<&[f32]> = if matches!(op, Op::Binary { .. }) { vec![&x, &y] } else { vec![&x] };
            g.bench_with_input(BenchmarkId::new(op.name(), len), &len, |b, _| {
                b.iter(|| cpu.run(black_box(&op), &inputs, &mut out))
            });
        }
    }
    g.finish();
}

fn reductions_and_rows(c: &mut Criterion) {
    let cpu = SimdBackend::new();
    let mut g = c.benchmark_group("reduce_rows");
    let len = 1 << 20;
    let x = data(len, 3);
    let y = data(len, 4);
    let mut one = [0.0f32];
    for op in [Op::reduce(ReduceOp::Sum, len), Op::dot(len)] {
        g.throughput(Throughput::Bytes(op.cost().bytes()));
        let inputs: Vec<&[f32]> = if matches!(op, Op::Dot { .. }) { vec![&x, &y] } else { vec![&x] };
        g.bench_function(op.name(), |b| b.iter(|| cpu.run(black_box(&op), &inputs, &mut one)));
    }
    let mut out = vec![0.0; len];
    let op = Op::rows(RowOp::Softmax, 256, 4096);
    g.throughput(Throughput::Bytes(op.cost().bytes()));
    g.bench_function("softmax_256x4096", |b| b.iter(|| cpu.run(black_box(&op), &[&x], &mut out)));
    g.finish();
}

fn sgemm(c: &mut Criterion) {
    let cpu = SimdBackend::new();
    let mut g = c.benchmark_group("sgemm");
    g.sample_size(20);
    for &n in &[64usize, 256, 512] {
        let a = data(n * n, 5);
        let b = data(n * n, 6);
        let mut out = vec![0.0; n * n];
        let op = Op::matmul(n, n, n);
        g.throughput(Throughput::Elements(op.cost().flops));
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |bch, _| {
            bch.iter(|| cpu.run(black_box(&op), &[&a, &b], &mut out))
        });
    }
    g.finish();
}

criterion_group!(benches, elementwise, reductions_and_rows, sgemm);
criterion_main!(benches);
