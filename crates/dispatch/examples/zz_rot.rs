use compute_core::{Backend, GeluForm, Op, UnaryOp};
use dispatch::timing::{Call, median_round_robin};
use std::time::Duration;
fn main() {
    let n: usize = std::env::args().nth(1).map_or(1 << 20, |s| s.parse().unwrap());
    let x: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
    let b2 = compute_simd::SimdBackend::with_threads(2).unwrap();
    let b1 = compute_simd::SimdBackend::with_threads(1).unwrap();
    let op = Op::unary(UnaryOp::Gelu(GeluForm::Tanh), n);
    for rep in 0..12 {
        let mut o1 = vec![0.0f32; n];
        let mut o2 = vec![0.0f32; n];
        let mut o3 = vec![0.0f32; n];
        let mut calls: Vec<Option<Call<'_>>> = vec![
            Some(Box::new(|| b2.run(&op, &[&x], &mut o1))),
            Some(Box::new(|| b1.run(&op, &[&x], &mut o2))),
            Some(Box::new(|| b2.run(&op, &[&x], &mut o3))),
        ];
        let m = median_round_robin(&mut calls, Duration::from_millis(if rep < 6 { 25 } else { 60 }), 3, 2000).unwrap();
        println!(
            "{rep}: simd {:.0} simd1 {:.0} simd-twin {:.0}",
            m[0].unwrap() * 1e6,
            m[1].unwrap() * 1e6,
            m[2].unwrap() * 1e6
        );
    }
}
