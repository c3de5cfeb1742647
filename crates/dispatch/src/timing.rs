//! Timing several engines on the same call fairly: what calibration and the
//! dispatch benchmark both measure with.
//!
//! Engines are timed round-robin, one burst each per round in an order
//! shuffled each round, so a load spike hits all of them alike and no engine
//! always follows the same one (a rotation keeps the cyclic order: each engine
//! would always pay for the same predecessor's leftovers). A burst starts
//! with one untimed call, because the first call after another engine's pays
//! for that engine's leftovers (its rayon workers still spinning on every
//! core, a cold cache, a GPU queue gone idle), which is not this engine's
//! cost — and more untimed calls follow until [`SETTLE`] has passed; it then
//! takes samples until about [`BURST`] has passed (at most [`BURST_CALLS`]):
//! each one call, or for calls under [`SAMPLE_MIN`] the mean of a group of
//! calls. What gets compared is each engine's steady state on repeated
//! calls, which is what a program doing this call in a loop sees.

use std::time::{Duration, Instant};

use compute_core::Result;
use compute_core::rng::Rng;

/// One engine's call, ready to time.
pub type Call<'a> = Box<dyn FnMut() -> Result<()> + 'a>;

/// Time spent on one engine's burst before moving to the next engine, as
/// the dispatch benchmark times (calibration takes its own,
/// [`Options::burst`](crate::calibrate::Options::burst)).
pub const BURST: Duration = Duration::from_millis(1);

/// Most timed calls in one burst.
pub const BURST_CALLS: usize = 32;

/// Least time a burst spends on untimed calls before it times any.
pub const SETTLE: Duration = Duration::from_micros(200);

/// Least time one sample covers: calls shorter than this are timed in groups
/// (at most [`MAX_GROUP`] calls) and each sample is the group's mean, so that
/// a sample of a 0.1 µs call is not a third the clock's own overhead and its
/// jitter.
pub const SAMPLE_MIN: Duration = Duration::from_micros(2);

/// Most calls timed as one sample.
pub const MAX_GROUP: usize = 64;

/// Calls per sample for a call taking `seconds`: enough to cover
/// [`SAMPLE_MIN`], 1 for calls at least that long, at most [`MAX_GROUP`].
pub fn calls_per_sample(seconds: f64) -> usize {
    if seconds.is_nan() {
        return 1;
    }
    let n = SAMPLE_MIN.as_secs_f64() / seconds.max(1e-12);
    if n >= MAX_GROUP as f64 { MAX_GROUP } else { (n.ceil() as usize).max(1) }
}

/// Median seconds per call of each `Some` call (`None` stays `None`), timed in
/// rotating bursts for at least `min_rounds` rounds and then until `budget`
/// has passed (at most `max_rounds`), each burst taking samples for about
/// `burst` (at most [`BURST_CALLS`]). A call whose untimed first call of a
/// burst takes over 50 ms gets one timed call per burst. Costs about
/// `max(budget, min_rounds × calls × (2 calls or SETTLE + burst))`; the first
/// error of any call is returned.
pub fn median_round_robin(
    calls: &mut [Option<Call<'_>>],
    budget: Duration,
    min_rounds: usize,
    max_rounds: usize,
    burst: Duration,
) -> Result<Vec<Option<f64>>> {
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); calls.len()];
    let start = Instant::now();
    let mut rounds = 0;
    let mut order: Vec<usize> = (0..calls.len()).collect();
    let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
    while rounds < min_rounds || (start.elapsed() < budget && rounds < max_rounds) {
        rng.shuffle(&mut order);
        for &i in &order {
            if let (Some(Some(c)), Some(s)) = (calls.get_mut(i), samples.get_mut(i)) {
                let t = Instant::now();
                c()?;
                let slow = t.elapsed() > Duration::from_millis(50);
                // Settle: more untimed calls until SETTLE has passed, so that worker threads
                // the previous engine left spinning (rayon's, a software GPU's) go idle.
                let mut settled = 1u32;
                while t.elapsed() < SETTLE {
                    c()?;
                    settled += 1;
                }
                let group = calls_per_sample(t.elapsed().as_secs_f64() / f64::from(settled));
                let started = Instant::now();
                for _ in 0..BURST_CALLS {
                    let t = Instant::now();
                    for _ in 0..group {
                        c()?;
                    }
                    s.push(t.elapsed().as_secs_f64() / group as f64);
                    if slow || started.elapsed() >= burst {
                        break;
                    }
                }
            }
        }
        rounds += 1;
    }
    Ok(calls.iter().zip(samples.iter_mut()).map(|(c, s)| c.as_ref().and_then(|_| median(s))).collect())
}

/// Median of `s` (sorts it), at least 1 ns; `None` when empty.
pub fn median(s: &mut [f64]) -> Option<f64> {
    s.sort_by(|a, b| a.total_cmp(b));
    s.get(s.len() / 2).map(|m| m.max(1e-9))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_every_call_and_skips_none() {
        let (mut a, mut b) = (0usize, 0usize);
        let mut calls: Vec<Option<Call<'_>>> = vec![
            Some(Box::new(|| {
                a += 1;
                std::thread::sleep(Duration::from_micros(200));
                Ok(())
            })),
            None,
            Some(Box::new(|| {
                b += 1;
                Ok(())
            })),
        ];
        let t = median_round_robin(&mut calls, Duration::ZERO, 3, 3, BURST).expect("no errors");
        drop(calls);
        assert!(t[0].is_some_and(|s| s >= 200e-6), "{t:?}");
        assert!(t[1].is_none());
        assert!(t[2].is_some_and(|s| s < 200e-6), "{t:?}");
        // Three rounds of a warm-up plus at least one timed call each.
        assert!(a >= 6 && b >= 6, "{a} {b}");
    }

    #[test]
    fn the_first_error_is_returned() {
        let mut calls: Vec<Option<Call<'_>>> = vec![Some(Box::new(|| {
            Err(compute_core::ComputeError::Unsupported { op: "relu", backend: compute_core::BackendKind::Simd })
        }))];
        assert!(median_round_robin(&mut calls, Duration::ZERO, 1, 1, BURST).is_err());
    }

    #[test]
    fn every_engine_follows_every_other_one() {
        // Over enough rounds each ordered pair (a right after b, within a round)
        // occurs: no engine always pays for the same predecessor.
        let mut order: Vec<usize> = (0..4).collect();
        let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
        let mut seen = [[false; 4]; 4];
        for _ in 0..64 {
            rng.shuffle(&mut order);
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, vec![0, 1, 2, 3], "a permutation");
            for w in order.windows(2) {
                seen[w[1]][w[0]] = true;
            }
        }
        for (a, row) in seen.iter().enumerate() {
            for (b, &s) in row.iter().enumerate() {
                assert!(a == b || s, "{a} never ran right after {b}");
            }
        }
    }

    #[test]
    fn short_calls_are_timed_in_groups() {
        assert_eq!(calls_per_sample(1e-3), 1);
        assert_eq!(calls_per_sample(2e-6), 1);
        assert_eq!(calls_per_sample(1e-6), 2);
        assert_eq!(calls_per_sample(70e-9), 29);
        assert_eq!(calls_per_sample(1e-9), MAX_GROUP);
        assert_eq!(calls_per_sample(0.0), MAX_GROUP);
        assert_eq!(calls_per_sample(f64::NAN), 1, "an unusable estimate times single calls");
        // End to end, a call of a few ns gets a median per call under 1 µs. (How
        // many calls a group gets depends on how fast settling went, so it is
        // not asserted: a loaded machine may settle slowly.)
        let mut calls: Vec<Option<Call<'_>>> = vec![Some(Box::new(|| Ok(())))];
        let t = median_round_robin(&mut calls, Duration::ZERO, 1, 1, BURST).expect("no errors");
        assert!(t[0].is_some_and(|s| s < 1e-6), "{t:?}");
    }

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut []), None);
    }
}
