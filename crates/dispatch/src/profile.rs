//! [`Profile`]: what each engine costs on this machine, as measured by
//! [`crate::calibrate`] (or nominal figures until then). Serialised as JSON.

use compute_core::{Cost, DType, Op, OpClass};
use serde::{Deserialize, Serialize};

use crate::engine::Engine;

/// Version of the JSON layout; a cached file of another version is ignored
/// (and measured again). Format 3 keys each curve by op class and dtype.
pub const FORMAT: u32 = 3;

/// The measured profile of every engine of one machine.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    /// Layout version ([`FORMAT`]).
    pub format: u32,
    /// Which machine this is: every engine's device and driver description
    /// (see [`crate::calibrate::profile_key`]). A cached profile is only reused
    /// when its key matches the machine's.
    pub key: String,
    /// `true` when measured by [`crate::calibrate`], `false` for [`Profile::nominal`].
    pub calibrated: bool,
    /// Seconds since the Unix epoch when it was measured (0 for nominal ones).
    pub created_unix_s: u64,
    /// One entry per engine.
    pub engines: Vec<EngineProfile>,
    /// How long each step of the measurement took, in order (empty for
    /// nominal profiles and for files written before this field existed).
    #[serde(default)]
    pub timings: Vec<StepTime>,
}

/// The wall time of one step of [`crate::calibrate`]: `"prepare"` (the GPUs
/// compile the ladders' kernels), `"launch"` (the tiny call on every engine),
/// `"link <engine>"` (a GPU's transfers), `"host calls"` (the links fitted to
/// a real host call), or one ladder, named by its [`CurveKey`] (`"Matmul"`,
/// `"Matmul bf16"`, …).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepTime {
    /// Which step.
    pub step: String,
    /// Its wall time, seconds.
    pub seconds: f64,
}

/// The cost of one engine: fixed latency, the bus to its memory, and time per
/// op class as a function of work.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EngineProfile {
    /// Which engine.
    pub engine: Engine,
    /// Its device description, as the backend prints it.
    pub device: String,
    /// Seconds of a call that does (almost) nothing on data already there:
    /// launch plus synchronisation.
    pub launch_s: f64,
    /// The bus to the engine's memory; `None` when it works on host memory.
    pub link: Option<Link>,
    /// Measured call times per op class and dtype (data already resident),
    /// at most one curve per [`CurveKey`].
    pub classes: Vec<ClassCurve>,
}

impl EngineProfile {
    /// The curve measured for `key`, if any (no fallback to another dtype:
    /// that is [`crate::CostModel`]'s business). A linear search of a few entries.
    pub fn curve(&self, key: CurveKey) -> Option<&ClassCurve> {
        self.classes.iter().find(|c| c.key() == key)
    }
}

/// Host ↔ device transfer costs of one engine: a fixed overhead plus, each
/// way, a bandwidth up to [`Link::knee_bytes`] and another beyond it (small
/// and large copies take different paths in the drivers: on the H200 machine
/// CUDA's pageable uploads ran several times faster per byte at 1 MiB than at
/// 16 MiB).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Link {
    /// Extra fixed seconds of a call on host data over one on resident data
    /// (staging, the two copies' own latencies).
    pub overhead_s: f64,
    /// Host → device bytes per second, for the first `knee_bytes` of a copy.
    pub h2d_bytes_per_s: f64,
    /// Device → host bytes per second, for the first `knee_bytes` of a copy.
    pub d2h_bytes_per_s: f64,
    /// Where the large-copy bandwidths take over.
    pub knee_bytes: f64,
    /// Host → device bytes per second beyond `knee_bytes`.
    pub h2d_large_bytes_per_s: f64,
    /// Device → host bytes per second beyond `knee_bytes`.
    pub d2h_large_bytes_per_s: f64,
}

impl Link {
    /// One bandwidth each way at every size (no knee: it lies at `f64::MAX`
    /// bytes, a finite number so that the link survives JSON).
    pub fn uniform(overhead_s: f64, h2d_bytes_per_s: f64, d2h_bytes_per_s: f64) -> Link {
        Link {
            overhead_s,
            h2d_bytes_per_s,
            d2h_bytes_per_s,
            knee_bytes: f64::MAX,
            h2d_large_bytes_per_s: h2d_bytes_per_s,
            d2h_large_bytes_per_s: d2h_bytes_per_s,
        }
    }

    /// Seconds to bring `read` bytes in and `written` bytes back: the overhead
    /// plus each copy at its two bandwidths (a few float operations).
    pub fn round_trip_s(&self, read: u64, written: u64) -> f64 {
        let copy = |bytes: f64, small: f64, large: f64| {
            let head = bytes.min(self.knee_bytes);
            head / small + (bytes - head).max(0.0) / large
        };
        self.overhead_s
            + copy(read as f64, self.h2d_bytes_per_s, self.h2d_large_bytes_per_s)
            + copy(written as f64, self.d2h_bytes_per_s, self.d2h_large_bytes_per_s)
    }

    /// Whether every figure is usable (finite, positive bandwidths, overhead ≥ 0).
    pub fn is_valid(&self) -> bool {
        let bw = [self.h2d_bytes_per_s, self.d2h_bytes_per_s, self.h2d_large_bytes_per_s, self.d2h_large_bytes_per_s];
        self.overhead_s.is_finite() && self.overhead_s >= 0.0 && self.knee_bytes > 0.0 && bw.iter().all(|&b| b > 0.0)
    }
}

/// What a curve is measured for and looked up by: an op class and the dtype
/// of the data its ladder ran on (an op's first input, [`Op::dtype`]; a
/// matmul with `bf16` operands and an `f32` output is a `bf16` matmul).
/// Two bytes; free to build and compare.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CurveKey {
    /// The op class.
    pub class: OpClass,
    /// The dtype of the op's first input.
    pub dtype: DType,
}

impl CurveKey {
    /// The key of `class` on `dtype` data.
    pub const fn new(class: OpClass, dtype: DType) -> CurveKey {
        CurveKey { class, dtype }
    }

    /// The key of `op`: its class and its first input's dtype, except a
    /// quantized matmul, keyed by its weight's block dtype (the cost model
    /// predicts it from the curves of other keys, see
    /// [`CostModel::predict_cost`](crate::CostModel::predict_cost)). Free.
    pub fn of(op: &Op) -> CurveKey {
        match *op {
            Op::QuantMatmul(s) => CurveKey { class: OpClass::Matmul, dtype: s.weight },
            _ => CurveKey { class: op.class(), dtype: op.dtype() },
        }
    }
}

impl std::fmt::Display for CurveKey {
    /// The class as [`std::fmt::Debug`] prints it (`Matmul`), followed by the
    /// dtype unless it is `f32` (`Matmul bf16`): the calibration step's name.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.class)?;
        if self.dtype != DType::F32 { write!(f, " {}", self.dtype.as_str()) } else { Ok(()) }
    }
}

/// Measured full-call times of one op class on resident data of one dtype, by
/// amount of work ([`work`]), sorted by work.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClassCurve {
    /// The op class.
    pub class: OpClass,
    /// The dtype of the ladder's data (its ops' first input). `f32` when the
    /// JSON has no such field.
    #[serde(default = "f32_dtype")]
    pub dtype: DType,
    /// `(work, seconds)` samples, increasing work.
    pub points: Vec<Point>,
}

impl ClassCurve {
    /// Its class and dtype. Free.
    pub fn key(&self) -> CurveKey {
        CurveKey { class: self.class, dtype: self.dtype }
    }
}

fn f32_dtype() -> DType {
    DType::F32
}

/// One calibration sample.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// Work of the call ([`work`]).
    pub work: f64,
    /// Median seconds per call, launch and synchronisation included.
    pub seconds: f64,
}

/// The amount of work the time of an op of `class` scales with: FLOPs for the
/// compute-bound classes (matmul, conv, transcendental), bytes moved for the
/// memory-bound ones (each operand at its dtype's size, so an add on `bf16`
/// data is half the work of one on as many `f32` values). Computed from
/// [`compute_core::Op::cost`]; costs nothing.
pub fn work(class: OpClass, cost: &Cost) -> f64 {
    match class {
        OpClass::Matmul | OpClass::Conv | OpClass::Transcendental => cost.flops as f64,
        OpClass::Elementwise | OpClass::RowWise | OpClass::Reduction => cost.bytes() as f64,
    }
}

/// Work per second of each class, for nominal profiles, in [`OpClass::ALL`] order.
type Rates = [f64; 6];

impl Profile {
    /// A profile from nominal figures (no measurement): for use before
    /// [`crate::calibrate`] has run, and in tests. CPU: one thread moves
    /// ~10 GB/s and runs ~50 GFLOP/s of matmul, all threads scale that ×0.8
    /// each but pay 5 µs to wake; GPU: 10–20 µs launch, 20 µs and 12 GB/s of
    /// pageable PCIe each way, 0.5–1 TB/s memory and 5–20 TFLOP/s matmul.
    /// `threads` is the CPU engine's thread count.
    ///
    /// Every curve is an `f32` one: ops on `f16` and `bf16` data are predicted
    /// from them by [`crate::CostModel`]'s fallback, at their own work (half
    /// the bytes per element, the same FLOPs). Nominal figures are guesses
    /// to an order of magnitude, which per-dtype guesses would not sharpen.
    pub fn nominal(engines: &[(Engine, String)], threads: usize) -> Profile {
        let cpu1: Rates = [10e9, 2e9, 15e9, 5e9, 50e9, 30e9];
        let scale = 0.8 * threads.max(1) as f64;
        let engines = engines
            .iter()
            .map(|(engine, device)| {
                let (launch_s, link, rates) = match engine {
                    Engine::SimdSingle => (0.5e-6, None, cpu1),
                    Engine::Simd => (5e-6, None, cpu1.map(|r| r * scale)),
                    Engine::Cuda => (10e-6, Some(pcie()), [1e12, 5e12, 1e12, 0.8e12, 20e12, 5e12]),
                    Engine::Wgpu => (20e-6, Some(pcie()), [0.5e12, 2e12, 0.5e12, 0.4e12, 5e12, 2e12]),
                };
                let classes = OpClass::ALL
                    .iter()
                    .zip(rates)
                    .map(|(&class, rate)| {
                        // Two samples on the line t = launch + work / rate.
                        let points = [1e6, 1e9].map(|w| Point { work: w, seconds: launch_s + w / rate }).to_vec();
                        ClassCurve { class, dtype: DType::F32, points }
                    })
                    .collect();
                EngineProfile { engine: *engine, device: device.clone(), launch_s, link, classes }
            })
            .collect();
        Profile {
            format: FORMAT,
            key: String::new(),
            calibrated: false,
            created_unix_s: 0,
            engines,
            timings: Vec::new(),
        }
    }

    /// The entry of `engine`, if profiled.
    pub fn engine(&self, engine: Engine) -> Option<&EngineProfile> {
        self.engines.iter().find(|e| e.engine == engine)
    }

    /// The step timings as one line, e.g. `launch 0.03 s, Elementwise 0.30 s`.
    pub fn timings_text(&self) -> String {
        let steps: Vec<String> = self.timings.iter().map(|t| format!("{} {:.2} s", t.step, t.seconds)).collect();
        steps.join(", ")
    }

    /// JSON text of the profile.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

fn pcie() -> Link {
    Link::uniform(20e-6, 12e9, 12e9)
}

#[cfg(test)]
mod link_tests {
    use super::Link;

    #[test]
    fn copies_past_the_knee_run_at_the_large_bandwidth() {
        let l = Link {
            overhead_s: 1e-6,
            h2d_bytes_per_s: 1e9,
            d2h_bytes_per_s: 2e9,
            knee_bytes: 1e6,
            h2d_large_bytes_per_s: 1e8,
            d2h_large_bytes_per_s: 4e8,
        };
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b;
        assert!(close(l.round_trip_s(500_000, 0), 1e-6 + 5e-4));
        assert!(close(l.round_trip_s(2_000_000, 0), 1e-6 + 1e-3 + 1e-2));
        assert!(close(l.round_trip_s(0, 3_000_000), 1e-6 + 5e-4 + 5e-3));
        assert!(l.is_valid());
        let u = Link::uniform(0.0, 1e9, 1e9);
        assert!(close(u.round_trip_s(4_000_000_000, 0), 4.0));
        assert!(!Link { h2d_large_bytes_per_s: 0.0, ..l }.is_valid());
    }
}
