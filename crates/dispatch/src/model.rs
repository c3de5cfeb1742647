//! [`CostModel`]: predicts each engine's time for a call from a [`Profile`]
//! and picks the fastest. A prediction is a few float operations and one
//! `ln`/`exp` pair (well under 1 µs for all engines together).

use compute_core::{Cost, Op, OpClass};

use crate::engine::{Engine, Placement};
use crate::profile::{Link, Profile, work};

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
    /// samples; linear in work outside them, on top of the fixed `launch`.
    fn seconds(&self, w: f64, launch: f64) -> f64 {
        let (w0, t0) = self.first;
        let (wn, tn) = self.last;
        if w <= w0 {
            return launch + (t0 - launch).max(0.0) * (w / w0);
        }
        if w >= wn {
            return launch + (tn - launch).max(0.0) * (w / wn);
        }
        let lw = w.ln();
        // First sample with ln_w >= lw; 1 ≤ i < len since w0 < w < wn.
        let i = self.ln_w.partition_point(|&x| x < lw);
        match (self.ln_w.get(i.wrapping_sub(1)), self.ln_w.get(i), self.ln_t.get(i.wrapping_sub(1)), self.ln_t.get(i))
        {
            (Some(&wa), Some(&wb), Some(&ta), Some(&tb)) if wb > wa => (ta + (tb - ta) * (lw - wa) / (wb - wa)).exp(),
            _ => launch + (tn - launch).max(0.0) * (w / wn),
        }
    }
}

/// The compiled profile of one engine.
#[derive(Clone, Debug, Default)]
struct EngineModel {
    launch_s: f64,
    link: Option<Link>,
    curves: [Option<Curve>; 6],
}

/// A prediction: which engine, and the seconds it is expected to take.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Decision {
    /// The engine to run on.
    pub engine: Engine,
    /// Predicted seconds, transfers included.
    pub seconds: f64,
}

/// Predicts call times per engine from a [`Profile`]. Cheap to clone; a
/// prediction allocates nothing.
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
    /// Compiles `profile` (sorts and log-transforms its samples).
    pub fn new(profile: &Profile) -> CostModel {
        let mut model = CostModel::default();
        for e in &profile.engines {
            let mut curves: [Option<Curve>; 6] = Default::default();
            for c in &e.classes {
                if let Some(slot) = curves.get_mut(class_index(c.class)) {
                    *slot = Curve::new(&c.points);
                }
            }
            let launch_s = if e.launch_s.is_finite() { e.launch_s.max(0.0) } else { 0.0 };
            let link = e.link.filter(|l| {
                l.overhead_s.is_finite() && l.h2d_bytes_per_s > 0.0 && l.d2h_bytes_per_s > 0.0 && l.overhead_s >= 0.0
            });
            if let Some(slot) = model.engines.get_mut(e.engine.index()) {
                *slot = Some(EngineModel { launch_s, link, curves });
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
    /// when the engine or the op's class was never profiled.
    pub fn predict(&self, engine: Engine, op: &Op, placement: Placement) -> Option<f64> {
        let class = op.class();
        let cost = op.cost();
        self.predict_cost(engine, class, &cost, placement)
    }

    /// [`CostModel::predict`] for an op given by class and cost.
    pub fn predict_cost(&self, engine: Engine, class: OpClass, cost: &Cost, placement: Placement) -> Option<f64> {
        let m = self.engines.get(engine.index())?.as_ref()?;
        let curve = m.curves.get(class_index(class))?.as_ref()?;
        let compute = curve.seconds(work(class, cost).max(1.0), m.launch_s);
        Some(compute + self.transfer_seconds(engine, cost, placement))
    }

    /// The engine among `candidates` with the smallest predicted time for `op`
    /// (first listed wins ties); `None` if none of them is profiled.
    pub fn choose(&self, candidates: &[Engine], op: &Op, placement: Placement) -> Option<Decision> {
        let class = op.class();
        let cost = op.cost();
        let mut best: Option<Decision> = None;
        for &engine in candidates {
            if let Some(seconds) = self.predict_cost(engine, class, &cost, placement)
                && best.is_none_or(|b| seconds < b.seconds)
            {
                best = Some(Decision { engine, seconds });
            }
        }
        best
    }
}
