//! [`CostModel`]: predicts each engine's time for a call from a [`Profile`]
//! and picks the fastest. A prediction is a few float operations and one
//! `ln`/`exp` pair (two for an `f16` matmul on a CPU engine), with no
//! allocation: well under 1 µs for all engines together.
//!
//! Curves are kept per op class and dtype ([`CurveKey`]). An op is predicted
//! from the curve of its class on its first input's dtype, at its own work
//! ([`work`]: bytes counted at each operand's size, or FLOPs); when the
//! profile has no such curve, from the nearest one that it has (see
//! [`CostModel::predict_cost`]), so every profile predicts every op.

use compute_core::{Cost, DType, Op, OpClass};

use crate::engine::{Engine, Placement};
use crate::profile::{CurveKey, Link, Profile, work};

/// The engine with the smallest predicted seconds among `times` (first listed
/// wins ties); `None` when `times` is empty. No engine is favoured near a tie:
/// a 25 % margin in favour of the one-thread CPU engine cost a 2.45× regret in
/// one grid run on the H200 machine (softmax 2¹⁶ on host data, where `simd1`
/// turned out the slower and noisier of the two CPU engines).
pub fn pick(times: impl IntoIterator<Item = (Engine, f64)>) -> Option<(Engine, f64)> {
    times.into_iter().fold(None, |best, (e, t)| if best.is_none_or(|(_, b)| t < b) { Some((e, t)) } else { best })
}

/// One class's samples in log–log space, ready for interpolation.
#[derive(Clone, Debug, Default)]
struct Curve {
    ln_w: Vec<f64>,
    ln_t: Vec<f64>,
    first: (f64, f64),
    last: (f64, f64),
}

impl Curve {
    /// Builds the curve; drops non-finite or non-positive samples and makes it
    /// non-decreasing (more work is never faster; noise can say otherwise).
    fn new(points: &[crate::profile::Point]) -> Option<Curve> {
        let mut pts: Vec<(f64, f64)> = points
            .iter()
            .filter(|p| p.work.is_finite() && p.seconds.is_finite() && p.work > 0.0 && p.seconds > 0.0)
            .map(|p| (p.work, p.seconds))
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        pts.dedup_by(|a, b| a.0 == b.0);
        let mut running = 0.0f64;
        for p in &mut pts {
            running = running.max(p.1);
            p.1 = running;
        }
        let first = *pts.first()?;
        let last = *pts.last()?;
        Some(Curve {
            ln_w: pts.iter().map(|p| p.0.ln()).collect(),
            ln_t: pts.iter().map(|p| p.1.ln()).collect(),
            first,
            last,
        })
    }

    /// Seconds of a resident call of `w` work: log–log interpolation between
    /// samples; below the first, linear in work on top of the fixed `launch`;
    /// above the last, in proportion to the work from that sample.
    ///
    /// Above the last sample the fixed cost is not subtracted: a GPU's launch
    /// latency overlaps its work at the largest sizes calibrated, so what is
    /// left after subtracting it understates the cost of more work. On the
    /// H200 machine wgpu's add took 115–122 µs at 2²⁴ and 289–315 µs at 2²⁶
    /// (six grid runs of `compute-bench --dispatch`, 2026-11-22); extrapolated on top of its
    /// launch it was predicted 196–308 µs at 2²⁶, and auto once chose it over
    /// CUDA's 203 µs (regret 1.55). In proportion it is predicted 4 × 115–122
    /// µs, and CUDA 4 × 58 µs against 203–205 µs measured: pessimistic for
    /// both, the order right (auto chose CUDA at 2²⁶ in the five runs since).
    fn seconds(&self, w: f64, launch: f64) -> f64 {
        let (w0, t0) = self.first;
        let (wn, tn) = self.last;
        if w <= w0 {
            return launch + (t0 - launch).max(0.0) * (w / w0);
        }
        if w >= wn {
            return tn * (w / wn);
        }
        let lw = w.ln();
        // First sample with ln_w >= lw; 1 ≤ i < len since w0 < w < wn.
        let i = self.ln_w.partition_point(|&x| x < lw);
        match (self.ln_w.get(i.wrapping_sub(1)), self.ln_w.get(i), self.ln_t.get(i.wrapping_sub(1)), self.ln_t.get(i)) {
            (Some(&wa), Some(&wb), Some(&ta), Some(&tb)) if wb > wa => (ta + (tb - ta) * (lw - wa) / (wb - wa)).exp(),
            _ => tn * (w / wn),
        }
    }
}

/// The dtypes that have curve slots, in slot order.
const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// The compiled profile of one engine: per op class ([`class_index`]), one
/// curve slot per dtype ([`DTYPES`]).
#[derive(Clone, Debug, Default)]
struct EngineModel {
    launch_s: f64,
    link: Option<Link>,
    curves: [[Option<Curve>; DTYPES.len()]; OpClass::ALL.len()],
}

impl EngineModel {
    /// The curve measured for `class` on `dtype`, if any.
    fn measured(&self, class: OpClass, dtype: DType) -> Option<&Curve> {
        self.curves.get(class_index(class))?.get(dtype_index(dtype)?)?.as_ref()
    }

    /// Seconds of a resident call of `w` work of `key` on `engine` (this
    /// model's engine), from the curve [`CostModel::predict_cost`] describes.
    fn resident_seconds(&self, engine: Engine, key: CurveKey, w: f64) -> Option<f64> {
        let at = |c: &Curve| c.seconds(w, self.launch_s);
        let curve = |d: DType| self.measured(key.class, d);
        if key.dtype == DType::F16 && key.class == OpClass::Matmul && !engine.is_gpu() && curve(DType::F16).is_none() {
            // The CPU has a bf16 dot-product instruction and no f16 one: an f16
            // matmul widens to f32 and runs the f32 kernel, as a bf16 one does
            // on a CPU without it. The slower of the two curves is that.
            return match (curve(DType::F32).map(at), curve(DType::BF16).map(at)) {
                (Some(wide), Some(bf16)) => Some(wide.max(bf16)),
                (wide, bf16) => wide.or(bf16),
            };
        }
        fallback(key.dtype).iter().find_map(|&d| curve(d)).map(at)
    }
}

/// The dtypes whose curves may predict an op on `dtype` data, the first
/// measured one used: its own, then the other 2-byte dtype's (the two cost
/// the same on every engine but for the CPU's matmul, handled apart), then
/// `f32`'s (any dtype without slots of its own is predicted from `f32`).
fn fallback(dtype: DType) -> &'static [DType] {
    match dtype {
        DType::F16 => &[DType::F16, DType::BF16, DType::F32],
        DType::BF16 => &[DType::BF16, DType::F16, DType::F32],
        _ => &[DType::F32],
    }
}

fn dtype_index(d: DType) -> Option<usize> {
    DTYPES.iter().position(|&x| x == d)
}

/// A prediction: which engine, and the seconds it is expected to take.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Decision {
    /// The engine to run on.
    pub engine: Engine,
    /// Predicted seconds, transfers included.
    pub seconds: f64,
}

/// Predicts call times per engine from a [`Profile`]. Cloning copies the
/// compiled curves (a few kilobytes); a prediction allocates nothing.
#[derive(Clone, Debug, Default)]
pub struct CostModel {
    engines: [Option<EngineModel>; 4],
}

fn class_index(c: OpClass) -> usize {
    match c {
        OpClass::Elementwise => 0,
        OpClass::Transcendental => 1,
        OpClass::Reduction => 2,
        OpClass::RowWise => 3,
        OpClass::Matmul => 4,
        OpClass::Conv => 5,
    }
}

impl CostModel {
    /// Compiles `profile` (sorts and log-transforms its samples). A curve of a
    /// dtype without a slot here is ignored; of two curves with the same
    /// [`CurveKey`], the later one counts.
    pub fn new(profile: &Profile) -> CostModel {
        let mut model = CostModel::default();
        for e in &profile.engines {
            let mut m = EngineModel::default();
            for c in &e.classes {
                let slot = dtype_index(c.dtype).and_then(|d| m.curves.get_mut(class_index(c.class))?.get_mut(d));
                if let Some(slot) = slot {
                    *slot = Curve::new(&c.points);
                }
            }
            m.launch_s = if e.launch_s.is_finite() { e.launch_s.max(0.0) } else { 0.0 };
            m.link = e.link.filter(Link::is_valid);
            if let Some(slot) = model.engines.get_mut(e.engine.index()) {
                *slot = Some(m);
            }
        }
        model
    }

    /// Whether `engine` has a profile.
    pub fn has(&self, engine: Engine) -> bool {
        self.engines.get(engine.index()).is_some_and(|e| e.is_some())
    }

    /// Seconds `engine` needs to move the data of a call of `cost` to itself
    /// and the output back, given where the data is (0 when already there).
    pub fn transfer_seconds(&self, engine: Engine, cost: &Cost, placement: Placement) -> f64 {
        let round_trip = |e: Engine| {
            self.engines
                .get(e.index())
                .and_then(|m| m.as_ref())
                .and_then(|m| m.link)
                .map_or(0.0, |l| l.round_trip_s(cost.bytes_read, cost.bytes_written))
        };
        match placement {
            Placement::Resident => 0.0,
            Placement::Host => round_trip(engine),
            Placement::On(src) if src.same_memory(engine) => 0.0,
            // Out of the source device to the host, then into this engine and back.
            Placement::On(src) => round_trip(src) + round_trip(engine),
        }
    }

    /// Predicted seconds of `op` on `engine` with data at `placement`; `None`
    /// when the engine was never profiled or has no curve for the op's class
    /// (in any dtype). See [`CostModel::predict_cost`].
    pub fn predict(&self, engine: Engine, op: &Op, placement: Placement) -> Option<f64> {
        self.predict_cost(engine, CurveKey::of(op), &op.cost(), placement)
    }

    /// [`CostModel::predict`] for an op given by its curve key and cost: the
    /// resident time from a curve of `key.class`, at the op's [`work`], plus
    /// [`CostModel::transfer_seconds`]. The curve is the one measured on
    /// `key.dtype` if the profile has it, else:
    /// - `bf16`: the `f16` curve, else the `f32` one;
    /// - `f16`: the `bf16` curve, else the `f32` one; except a matmul on a CPU
    ///   engine, predicted as the slower of the `f32` and `bf16` curves (f16
    ///   has no dot-product instruction on the CPU: it widens to `f32`);
    /// - any other dtype: the `f32` curve;
    /// - a matmul with a block-quantized weight (keyed by the weight's dtype,
    ///   [`CurveKey::of`]): a roofline of two measured curves, the slower of
    ///   the `bf16` matmul curve at the op's FLOPs (its products run on
    ///   integer or half units) and the `f32` element-wise curve at the op's
    ///   bytes (the weight's blocks read once: a decoding GEMV is bound by
    ///   them).
    ///
    /// A few float operations and one to three `ln`/`exp` pairs; no allocation.
    pub fn predict_cost(&self, engine: Engine, key: CurveKey, cost: &Cost, placement: Placement) -> Option<f64> {
        let m = self.engines.get(engine.index())?.as_ref()?;
        let compute = if key.dtype.is_quantized() && key.class == OpClass::Matmul {
            let products = m.resident_seconds(engine, CurveKey::new(OpClass::Matmul, DType::BF16), cost.flops as f64);
            let stream =
                m.resident_seconds(engine, CurveKey::new(OpClass::Elementwise, DType::F32), cost.bytes() as f64);
            match (products, stream) {
                (Some(a), Some(b)) => a.max(b),
                (a, b) => a.or(b)?,
            }
        } else {
            m.resident_seconds(engine, key, work(key.class, cost).max(1.0))?
        };
        Some(compute + self.transfer_seconds(engine, cost, placement))
    }

    /// The engine among `candidates` with the smallest predicted time for `op`,
    /// as [`pick`] chooses; `None` if none of them is profiled.
    pub fn choose(&self, candidates: &[Engine], op: &Op, placement: Placement) -> Option<Decision> {
        let key = CurveKey::of(op);
        let cost = op.cost();
        pick(candidates.iter().filter_map(|&e| self.predict_cost(e, key, &cost, placement).map(|t| (e, t))))
            .map(|(engine, seconds)| Decision { engine, seconds })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{ClassCurve, EngineProfile, Point};
    use compute_core::{BinaryOp, MatmulSpec, OpClass};

    fn curve(class: OpClass, pts: &[(f64, f64)]) -> ClassCurve {
        typed(class, DType::F32, pts)
    }

    fn typed(class: OpClass, dtype: DType, pts: &[(f64, f64)]) -> ClassCurve {
        ClassCurve { class, dtype, points: pts.iter().map(|&(work, seconds)| Point { work, seconds }).collect() }
    }

    /// A GPU with 10 µs launch, 20 µs staging and 10 GB/s each way; a CPU with
    /// 0.2 µs launch. Elementwise work is bytes, matmul work is FLOPs.
    fn synthetic() -> Profile {
        let gpu = EngineProfile {
            engine: Engine::Cuda,
            device: "synthetic gpu".into(),
            launch_s: 10e-6,
            link: Some(Link::uniform(20e-6, 10e9, 10e9)),
            classes: vec![
                curve(OpClass::Elementwise, &[(1.2e3, 11e-6), (1.2e9, 1.2e-3)]),
                curve(OpClass::Matmul, &[(1e6, 1e-5), (1e9, 1e-4), (1e12, 0.1)]),
            ],
        };
        let cpu = EngineProfile {
            engine: Engine::Simd,
            device: "synthetic cpu".into(),
            launch_s: 0.2e-6,
            link: None,
            classes: vec![
                curve(OpClass::Elementwise, &[(1.2e3, 1e-6), (1.2e5, 1e-4), (1.2e8, 1e-2)]),
                curve(OpClass::Matmul, &[(1e3, 1e-6), (1e6, 1e-4), (1e9, 2e-2)]),
            ],
        };
        Profile {
            format: crate::profile::FORMAT,
            key: "synthetic".into(),
            calibrated: true,
            created_unix_s: 0,
            engines: vec![gpu, cpu],
            timings: Vec::new(),
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1e-12)
    }

    #[test]
    fn prediction_at_a_sample_is_the_sample_and_host_adds_the_round_trip() {
        let m = CostModel::new(&synthetic());
        // 2·500·1000·1000 = 1e9 FLOPs: exactly the middle GPU sample.
        let op = Op::matmul(500, 1000, 1000);
        let resident = m.predict(Engine::Cuda, &op, Placement::Resident).unwrap();
        assert!(close(resident, 1e-4), "{resident}");
        // Host: + 20 µs + 4·(500·1000 + 1000·1000) B / 10 GB/s + 4·500·1000 B / 10 GB/s = 20 µs + 600 µs + 200 µs.
        let host = m.predict(Engine::Cuda, &op, Placement::Host).unwrap();
        assert!(close(host, 1e-4 + 20e-6 + 600e-6 + 200e-6), "{host}");
        // The CPU pays no transfer from the host.
        let cpu = m.predict(Engine::Simd, &op, Placement::Host).unwrap();
        assert!(close(cpu, 2e-2), "{cpu}");
    }

    #[test]
    fn quantized_matmuls_are_bound_by_their_block_bytes() {
        let m = CostModel::new(&synthetic());
        // 1 × 4096 × 14336 Q4_K: 117 MFLOP, but 33 MB of blocks to stream.
        let gemv = Op::quant_matmul(1, 4096, 14336, DType::Q4K);
        let cost = gemv.cost();
        let stream =
            m.predict_cost(Engine::Cuda, CurveKey::new(OpClass::Elementwise, DType::F32), &cost, Placement::Resident);
        let products = m.predict(Engine::Cuda, &Op::matmul(1, 4096, 14336), Placement::Resident).unwrap();
        let q = m.predict(Engine::Cuda, &gemv, Placement::Resident).unwrap();
        assert!(close(q, stream.unwrap()) && q > products, "{q} {stream:?} {products}");
        // Four times fewer weight bytes than the bf16 GEMV's predicted stream.
        let bf16 = Op::Matmul(compute_core::MatmulSpec::new(1, 4096, 14336).with_dtypes(DType::BF16, DType::F32));
        assert!(cost.bytes() * 3 < bf16.cost().bytes());
        // A prefill batch is bound by its products instead.
        let prefill = Op::quant_matmul(4096, 4096, 14336, DType::Q4K);
        let flops = m.predict(Engine::Cuda, &Op::matmul(4096, 4096, 14336), Placement::Resident).unwrap();
        assert!(close(m.predict(Engine::Cuda, &prefill, Placement::Resident).unwrap(), flops));
    }

    #[test]
    fn interpolation_is_log_log_and_extrapolation_linear_in_work() {
        let m = CostModel::new(&synthetic());
        // add of 1000 elements: 12 000 bytes, halfway (in log) between 1.2e3 and 1.2e5 → √(1e-6·1e-4) = 1e-5.
        let add = Op::binary(BinaryOp::Add, 1000);
        assert!(close(m.predict(Engine::Simd, &add, Placement::Resident).unwrap(), 1e-5));
        // Below the first sample: launch + (t0 − launch)·w/w0 = 0.2 µs + 0.8 µs · 120/1200.
        let tiny = Op::binary(BinaryOp::Add, 10);
        assert!(close(m.predict(Engine::Simd, &tiny, Placement::Resident).unwrap(), 0.2e-6 + 0.08e-6));
        // Above the last: tn·w/wn; add of 1e8 elements = 1.2e9 bytes, 10× the last sample.
        let big = Op::binary(BinaryOp::Add, 100_000_000);
        assert!(close(m.predict(Engine::Simd, &big, Placement::Resident).unwrap(), 1e-2 * 10.0));
    }

    #[test]
    fn transfers_depend_on_where_the_data_is() {
        let m = CostModel::new(&synthetic());
        let add = Op::binary(BinaryOp::Add, 1_000_000); // reads 8 MB, writes 4 MB
        let trip = 20e-6 + 8e6 / 10e9 + 4e6 / 10e9;
        assert!(close(m.transfer_seconds(Engine::Cuda, &add.cost(), Placement::Host), trip));
        assert_eq!(m.transfer_seconds(Engine::Cuda, &add.cost(), Placement::Resident), 0.0);
        assert_eq!(m.transfer_seconds(Engine::Cuda, &add.cost(), Placement::On(Engine::Cuda)), 0.0);
        // Data on the GPU: the CPU must bring it out and send the result back.
        assert!(close(m.transfer_seconds(Engine::Simd, &add.cost(), Placement::On(Engine::Cuda)), trip));
        assert_eq!(m.transfer_seconds(Engine::Simd, &add.cost(), Placement::Host), 0.0);
        assert_eq!(m.transfer_seconds(Engine::SimdSingle, &add.cost(), Placement::On(Engine::Simd)), 0.0);
    }

    #[test]
    fn decisions_on_a_synthetic_profile() {
        let m = CostModel::new(&synthetic());
        let both = [Engine::Cuda, Engine::Simd];
        let pick = |op: Op, p: Placement| m.choose(&both, &op, p).unwrap().engine;
        // Small: the GPU's launch alone exceeds the CPU's time.
        assert_eq!(pick(Op::matmul(16, 16, 16), Placement::Host), Engine::Simd);
        assert_eq!(pick(Op::binary(BinaryOp::Add, 256), Placement::Resident), Engine::Simd);
        // 2048³ from the host: 17.2 GFLOP, GPU ≈ 17 ms + 5 ms of PCIe vs CPU ≈ 344 ms.
        assert_eq!(pick(Op::matmul(2048, 2048, 2048), Placement::Host), Engine::Cuda);
        // Large element-wise: the bus decides. From the host the CPU wins (16.8 ms vs 20 ms of PCIe
        // alone), resident the GPU wins (0.2 ms).
        let add = Op::binary(BinaryOp::Add, 1 << 24);
        assert_eq!(pick(add, Placement::Host), Engine::Simd);
        assert_eq!(pick(add, Placement::Resident), Engine::Cuda);
        assert_eq!(pick(add, Placement::On(Engine::Cuda)), Engine::Cuda);
        // An unprofiled class leaves only engines that have it: none here.
        assert!(m.choose(&both, &Op::dot(100), Placement::Host).is_none());
        // Ties go to the first candidate listed.
        assert_eq!(m.choose(&[Engine::Simd, Engine::Simd], &add, Placement::Host).unwrap().engine, Engine::Simd);
    }

    #[test]
    fn noisy_samples_are_made_monotone_and_bad_ones_dropped() {
        let mut p = synthetic();
        p.engines[1].classes =
            vec![curve(OpClass::Elementwise, &[(1.2e3, 5e-6), (1.2e4, 1e-6), (1.2e5, f64::NAN), (1.2e6, 1e-4)])];
        let m = CostModel::new(&p);
        // The dip to 1 µs is lifted to 5 µs; the NaN sample is ignored.
        let at = |n: usize| m.predict(Engine::Simd, &Op::binary(BinaryOp::Add, n), Placement::Resident).unwrap();
        assert!(close(at(1000), 5e-6), "{}", at(1000));
        assert!(at(10_000) >= at(1000));
        assert!(at(100_000) <= 1e-4 && at(100_000) >= 5e-6);
    }

    /// [`synthetic`] with half-precision curves on the CPU: a bf16 add three
    /// times slower per byte than the f32 curve says, a bf16 matmul twice as
    /// fast per FLOP as the f32 one.
    fn with_half_curves() -> Profile {
        let mut p = synthetic();
        p.engines[1].classes.extend([
            typed(OpClass::Elementwise, DType::BF16, &[(6e2, 1.5e-6), (6e4, 1.5e-4), (6e7, 1.5e-2)]),
            typed(OpClass::Matmul, DType::BF16, &[(1e3, 0.5e-6), (1e6, 0.5e-4), (1e9, 1e-2)]),
        ]);
        p
    }

    fn bf16_matmul(m: usize, k: usize, n: usize, input: DType) -> Op {
        Op::Matmul(MatmulSpec::new(m, k, n).with_dtypes(input, DType::F32))
    }

    #[test]
    fn an_op_on_bf16_data_is_predicted_from_the_bf16_curve() {
        let m = CostModel::new(&with_half_curves());
        let at = |op: &Op| m.predict(Engine::Simd, op, Placement::Resident).unwrap();
        // add of 10 000 bf16 values: 3 · 2 · 10 000 = 60 000 bytes, the middle bf16
        // sample. The f32 curve at those bytes says 50 µs, at 10 000 f32 values 100 µs.
        let add = Op::binary(BinaryOp::Add, 10_000).with_dtype(DType::BF16);
        assert_eq!(CurveKey::of(&add), CurveKey::new(OpClass::Elementwise, DType::BF16));
        assert!(close(at(&add), 1.5e-4), "{}", at(&add));
        assert!(close(at(&Op::binary(BinaryOp::Add, 10_000)), 1e-4), "f32 data keeps the f32 curve");
        // bf16 operands with an f32 output count as a bf16 matmul: 1e9 FLOPs, 10 ms (f32: 20 ms).
        let mm = bf16_matmul(500, 1000, 1000, DType::BF16);
        assert_eq!(CurveKey::of(&mm), CurveKey::new(OpClass::Matmul, DType::BF16));
        assert!(close(at(&mm), 1e-2), "{}", at(&mm));
        assert!(close(at(&Op::matmul(500, 1000, 1000)), 2e-2));
        // The class's other ops on bf16 data use the same curve; choices see it too.
        let mul = Op::binary(BinaryOp::Mul, 10_000).with_dtype(DType::BF16);
        assert!(close(at(&mul), 1.5e-4));
        let d = m.choose(&[Engine::Simd], &add, Placement::Resident).unwrap();
        assert!(close(d.seconds, 1.5e-4));
        // The GPU has no bf16 curves: its f32 curve at the op's bytes, plus the
        // host round trip of bf16-sized copies (20 µs + 40 kB and 20 kB at 10 GB/s).
        let gpu_resident = m.predict(Engine::Cuda, &add, Placement::Resident).unwrap();
        let f32_curve = m.predict_cost(
            Engine::Cuda,
            CurveKey::new(OpClass::Elementwise, DType::F32),
            &add.cost(),
            Placement::Resident,
        );
        assert_eq!(Some(gpu_resident), f32_curve);
        let host = m.predict(Engine::Cuda, &add, Placement::Host).unwrap();
        assert!(close(host - gpu_resident, 20e-6 + 40e3 / 10e9 + 20e3 / 10e9), "{host}");
    }

    #[test]
    fn f16_falls_back_to_bf16_except_the_cpu_matmul() {
        let mut p = with_half_curves();
        p.engines[0].classes.push(typed(OpClass::Matmul, DType::BF16, &[(1e6, 2e-5), (1e9, 2e-4), (1e12, 0.2)]));
        let m = CostModel::new(&p);
        let at = |e: Engine, op: &Op| m.predict(e, op, Placement::Resident).unwrap();
        // Element-wise: f16 costs what bf16 costs.
        let add = Op::binary(BinaryOp::Add, 10_000).with_dtype(DType::F16);
        assert!(close(at(Engine::Simd, &add), 1.5e-4));
        // A GPU's f16 matmul: the bf16 curve (0.2 ms at 1e9 FLOPs, f32 0.1 ms).
        let mm16 = bf16_matmul(500, 1000, 1000, DType::F16);
        assert!(close(at(Engine::Cuda, &mm16), 2e-4));
        // The CPU's f16 matmul widens to f32: the slower of the f32 (20 ms) and
        // bf16 (10 ms) curves, so f32 here…
        assert!(close(at(Engine::Simd, &mm16), 2e-2));
        // …and bf16 where the bf16 matmul is the slower one (no bf16 kernel: it widens too).
        let mut slow = p.clone();
        slow.engines[1].classes[3] = typed(OpClass::Matmul, DType::BF16, &[(1e3, 2e-6), (1e6, 2e-4), (1e9, 3e-2)]);
        let ms = CostModel::new(&slow);
        assert!(close(ms.predict(Engine::Simd, &mm16, Placement::Resident).unwrap(), 3e-2));
        // A measured f16 curve wins over any fallback.
        let mut own = p.clone();
        own.engines[1].classes.push(typed(OpClass::Matmul, DType::F16, &[(1e3, 1e-6), (1e9, 5e-2)]));
        let mo = CostModel::new(&own);
        assert!(close(mo.predict(Engine::Simd, &mm16, Placement::Resident).unwrap(), 5e-2));
        // …and bf16 falls back to it when it has no curve of its own.
        let mut f16_only = synthetic();
        f16_only.engines[1].classes.push(typed(OpClass::Elementwise, DType::F16, &[(6e2, 7e-6), (6e7, 7e-1)]));
        let mf = CostModel::new(&f16_only);
        let add_bf16 = Op::binary(BinaryOp::Add, 100).with_dtype(DType::BF16);
        assert!(close(mf.predict(Engine::Simd, &add_bf16, Placement::Resident).unwrap(), 7e-6));
        // Classes without half curves: the f32 curve at the op's work (dot of
        // 1000 f16 values: 4000 bytes read, 4 written, on a line of 1 µs per 1000 bytes).
        let mut dots = synthetic();
        dots.engines[1].classes.push(curve(OpClass::Reduction, &[(4e3, 4e-6), (4e5, 4e-4)]));
        let md = CostModel::new(&dots);
        let dot = Op::dot(1000).with_dtype(DType::F16);
        assert!(close(md.predict(Engine::Simd, &dot, Placement::Resident).unwrap(), 4.004e-6));
    }

    #[test]
    fn a_profile_without_half_curves_predicts_half_ops_from_f32_curves_at_their_work() {
        let m = CostModel::new(&synthetic());
        for engine in [Engine::Cuda, Engine::Simd] {
            for dtype in [DType::BF16, DType::F16] {
                for op in [Op::binary(BinaryOp::Add, 1000).with_dtype(dtype), bf16_matmul(64, 64, 64, dtype)] {
                    let f32_key = CurveKey::new(op.class(), DType::F32);
                    for placement in [Placement::Resident, Placement::Host] {
                        let got = m.predict(engine, &op, placement);
                        assert!(got.is_some());
                        assert_eq!(got, m.predict_cost(engine, f32_key, &op.cost(), placement), "{engine} {op:?}");
                    }
                }
            }
        }
        // add of 1000 bf16 values: 6000 bytes, on the CPU's f32 line of 1 µs per 1200 bytes.
        let add = Op::binary(BinaryOp::Add, 1000).with_dtype(DType::BF16);
        assert!(close(m.predict(Engine::Simd, &add, Placement::Resident).unwrap(), 5e-6));
        // The same as the nominal profile, whose curves are all f32.
        let nominal = CostModel::new(&Profile::nominal(&[(Engine::Simd, "cpu".into())], 4));
        let t = nominal.predict(Engine::Simd, &add, Placement::Host).unwrap();
        let f32_twice = nominal.predict(Engine::Simd, &Op::binary(BinaryOp::Add, 500), Placement::Host).unwrap();
        assert!(close(t, f32_twice), "half the bytes per element: {t} vs {f32_twice}");
    }

    #[test]
    fn profiles_with_dtype_keyed_curves_round_trip_through_json() {
        let p = with_half_curves();
        let json = p.to_json();
        assert!(json.contains("\"dtype\": \"BF16\""), "{json}");
        let back: Profile = serde_json::from_str(&json).unwrap();
        assert_eq!(back, p);
        let cpu = back.engine(Engine::Simd).unwrap();
        let key = CurveKey::new(OpClass::Matmul, DType::BF16);
        assert_eq!(cpu.curve(key).map(|c| c.key()), Some(key));
        assert!(cpu.curve(CurveKey::new(OpClass::Matmul, DType::F16)).is_none());
        let again = CostModel::new(&back);
        let op = Op::binary(BinaryOp::Add, 10_000).with_dtype(DType::BF16);
        assert_eq!(
            again.predict(Engine::Simd, &op, Placement::Host),
            CostModel::new(&p).predict(Engine::Simd, &op, Placement::Host)
        );
        // A curve written without a dtype is an f32 one.
        let old = r#"{"class": "Matmul", "points": [{"work": 1.0, "seconds": 2.0}]}"#;
        let c: ClassCurve = serde_json::from_str(old).unwrap();
        assert_eq!(c.key(), CurveKey::new(OpClass::Matmul, DType::F32));
    }
}

#[cfg(test)]
mod pick_tests {
    use super::*;
    use crate::profile::{ClassCurve, EngineProfile, Point};
    use compute_core::{BinaryOp, OpClass};

    fn cpu(engine: Engine, seconds: f64) -> EngineProfile {
        EngineProfile {
            engine,
            device: "cpu".into(),
            launch_s: 0.0,
            link: None,
            classes: vec![ClassCurve {
                class: OpClass::Elementwise,
                dtype: DType::F32,
                points: vec![Point { work: 12e6, seconds }],
            }],
        }
    }

    #[test]
    fn the_fastest_prediction_wins() {
        let op = Op::binary(BinaryOp::Add, 1_000_000); // 12e6 bytes: exactly the sample
        let engines = [Engine::Simd, Engine::SimdSingle];
        let choose = |single: f64| {
            let p = Profile {
                format: crate::profile::FORMAT,
                key: String::new(),
                calibrated: true,
                created_unix_s: 0,
                engines: vec![cpu(Engine::Simd, 1e-3), cpu(Engine::SimdSingle, single)],
                timings: Vec::new(),
            };
            CostModel::new(&p).choose(&engines, &op, Placement::Host).unwrap().engine
        };
        assert_eq!(choose(0.99e-3), Engine::SimdSingle);
        assert_eq!(choose(1.01e-3), Engine::Simd);
        assert_eq!(choose(1e-3), Engine::Simd, "first listed wins a tie");
        assert_eq!(pick([]), None);
        assert_eq!(pick([(Engine::Cuda, 0.5), (Engine::Simd, 1.0)]), Some((Engine::Cuda, 0.5)));
    }
}
