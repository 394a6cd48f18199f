//! What the simulated clients do: when connections arrive, how long they last, how many
//! bytes they carry, and whether they send TCP timestamps.
//!
//! Every distribution is written out here with its source, so that the numbers in
//! `docs/simulation.md` can be traced back to a measurement:
//!
//! * Connection durations ([`DurationModel::Edge`]): the flow-completion-time CDF Faild
//!   measured at the edge (Araújo et al., NSDI'18, section 5.3 and figure 9): "between 60%
//!   and 70% of flows last less than 10 seconds and between 78% and 85% last less than 1
//!   minute". We interpolate log-uniformly between knots that sit inside those bands
//!   ([`EDGE_DURATION_KNOTS`]); the knots below 10 s and above 1 min are ours.
//! * Connection sizes: the web-search (DCTCP, Alizadeh et al., SIGCOMM'10) and data-mining
//!   (VL2, Greenberg et al., SIGCOMM'09) flow-size CDFs, in the form pFabric (Alizadeh et
//!   al., SIGCOMM'13) published for its simulations, interpolated linearly in packets of
//!   1460 bytes ([`WEB_SEARCH_KNOTS`], [`DATA_MINING_KNOTS`]).
//! * Arrivals: a Poisson process whose rate holds the requested number of active
//!   connections (Little's law: rate = active / mean duration), or a sinusoidal rate as in
//!   the paper's figure 9, sampled by thinning.
//!
//! Sampling never allocates; every draw comes from a seeded [`PolicyRng`].

use cheetah_core::policy::PolicyRng;
use cheetah_core::types::NANOS_PER_SEC;
use cheetah_core::Nanos;
use rand_core::RngCore;
use serde::{Deserialize, Serialize};

/// Bytes per packet in the pFabric size CDFs.
pub const PACKET_BYTES: f64 = 1460.0;

/// Knots `(seconds, cumulative share)` of the edge connection-duration CDF.
///
/// 65% under 10 s and 80% under 60 s sit in Faild's measured bands (60-70%, 78-85%). The
/// shape below 10 s and the tail (95% under 10 min, none over 1 h) are our assumptions:
/// Faild plots the tail but gives no numbers for it.
pub const EDGE_DURATION_KNOTS: [(f64, f64); 6] = [
    (0.01, 0.0),
    (1.0, 0.30),
    (10.0, 0.65),
    (60.0, 0.80),
    (600.0, 0.95),
    (3600.0, 1.0),
];

/// Knots `(packets, cumulative share)` of the web-search flow-size CDF (DCTCP / pFabric).
pub const WEB_SEARCH_KNOTS: [(f64, f64); 12] = [
    (6.0, 0.0),
    (6.0, 0.15),
    (13.0, 0.2),
    (19.0, 0.3),
    (33.0, 0.4),
    (53.0, 0.53),
    (133.0, 0.6),
    (667.0, 0.7),
    (1333.0, 0.8),
    (3333.0, 0.9),
    (6667.0, 0.97),
    (20000.0, 1.0),
];

/// Knots `(packets, cumulative share)` of the data-mining flow-size CDF (VL2 / pFabric).
pub const DATA_MINING_KNOTS: [(f64, f64); 9] = [
    (1.0, 0.0),
    (1.0, 0.5),
    (2.0, 0.6),
    (3.0, 0.7),
    (7.0, 0.8),
    (267.0, 0.9),
    (2107.0, 0.95),
    (66667.0, 0.99),
    (666667.0, 1.0),
];

/// A uniform draw in `[0, 1)` with 53 random bits.
#[inline]
pub fn unit(rng: &mut PolicyRng) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// A uniform draw in `0..n` (`n > 0`), by Lemire's multiply-shift; the bias is below
/// `n / 2^64`, far under anything a run can observe.
#[inline]
pub fn below(rng: &mut PolicyRng, n: usize) -> usize {
    ((u128::from(rng.next_u64()) * n as u128) >> 64) as usize
}

/// An exponential draw with the given rate (per second), in seconds.
#[inline]
pub fn exponential(rng: &mut PolicyRng, rate: f64) -> f64 {
    // 1 - unit() is in (0, 1], so the log is finite.
    -(1.0 - unit(rng)).ln() / rate
}

/// Seconds to simulation nanoseconds, rounding to the nearest nanosecond.
#[inline]
pub fn secs(seconds: f64) -> Nanos {
    (seconds * NANOS_PER_SEC as f64).round() as Nanos
}

/// An empirical CDF given by knots, sampled by inverse transform.
#[derive(Clone, Debug)]
struct Cdf {
    knots: Vec<(f64, f64)>,
    /// Interpolate in log space (durations spanning 6 decades) or linearly (sizes, as
    /// pFabric's simulator does).
    log: bool,
}

impl Cdf {
    fn new(knots: &[(f64, f64)], log: bool) -> Self {
        assert!(knots.len() >= 2 && knots[0].1 == 0.0 && knots[knots.len() - 1].1 == 1.0);
        assert!(knots
            .windows(2)
            .all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1));
        Cdf {
            knots: knots.to_vec(),
            log,
        }
    }

    fn sample(&self, rng: &mut PolicyRng) -> f64 {
        self.quantile(unit(rng))
    }

    fn quantile(&self, p: f64) -> f64 {
        let i = self
            .knots
            .windows(2)
            .position(|w| p < w[1].1)
            .unwrap_or(self.knots.len() - 2);
        let ((x0, p0), (x1, p1)) = (self.knots[i], self.knots[i + 1]);
        let f = if p1 > p0 { (p - p0) / (p1 - p0) } else { 0.0 };
        if self.log {
            (x0.ln() + f * (x1.ln() - x0.ln())).exp()
        } else {
            x0 + f * (x1 - x0)
        }
    }

    /// The mean, exactly, segment by segment.
    fn mean(&self) -> f64 {
        self.knots
            .windows(2)
            .map(|w| {
                let ((a, p0), (b, p1)) = (w[0], w[1]);
                let mass = p1 - p0;
                let segment_mean = if self.log && b > a {
                    (b - a) / (b / a).ln()
                } else {
                    (a + b) / 2.0
                };
                mass * segment_mean
            })
            .sum()
    }

    /// A draw from the length-biased distribution (density `x f(x) / mean`): the total
    /// length of the connection that an observer arriving at a random instant finds
    /// active. Within a log-uniform segment the length-biased density is uniform, within
    /// a linear (uniform) segment it grows linearly.
    fn sample_length_biased(&self, rng: &mut PolicyRng) -> f64 {
        let mean = self.mean();
        let mut target = unit(rng) * mean;
        let last = self.knots.len() - 2;
        for (i, w) in self.knots.windows(2).enumerate() {
            let ((a, p0), (b, p1)) = (w[0], w[1]);
            let mass = p1 - p0;
            if mass <= 0.0 {
                continue;
            }
            let weight = if self.log && b > a {
                mass * (b - a) / (b / a).ln()
            } else {
                mass * (a + b) / 2.0
            };
            if target < weight || i == last {
                let u = unit(rng);
                return if self.log || b <= a {
                    a + u * (b - a)
                } else {
                    // Density proportional to x on [a, b]: invert the quadratic CDF.
                    (a * a + u * (b * b - a * a)).sqrt()
                };
            }
            target -= weight;
        }
        unreachable!("the last segment always accepts")
    }
}

/// How long connections last.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum DurationModel {
    /// Faild's edge flow-completion-time CDF ([`EDGE_DURATION_KNOTS`]).
    Edge,
    /// Every connection lasts exactly this long (for hand-checked tests).
    Fixed { seconds: f64 },
    /// A CDF of your own: knots `[seconds, cumulative share]`, the first share 0 and the
    /// last 1, interpolated log-uniformly like [`DurationModel::Edge`] (e.g. to test how
    /// much the results owe to the tail of long connections).
    Empirical { knots: Vec<(f64, f64)> },
    /// Duration follows the size: `base_ms + bytes * 8 / rate_mbps`, i.e. a request served
    /// at a fixed per-flow rate after a fixed setup time. Used for the figure-9 scenario,
    /// whose requests "are served using the web server distribution".
    FromSize { base_ms: f64, rate_mbps: f64 },
}

/// How many bytes connections carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SizeModel {
    WebSearch,
    DataMining,
}

/// How connection arrivals are spread over time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum ArrivalModel {
    /// Poisson arrivals at the rate that keeps the scenario's `active_connections` open.
    Steady,
    /// Poisson arrivals whose rate swings from `low_per_s` up to `high_per_s` and back
    /// once per `period_s` (figure 9: 1500 to 2500 requests/s and back over 40 s).
    Sinusoidal {
        low_per_s: f64,
        high_per_s: f64,
        period_s: f64,
    },
}

/// The client population of a scenario.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadSpec {
    #[serde(default = "default_durations")]
    pub durations: DurationModel,
    #[serde(default = "default_sizes")]
    pub sizes: SizeModel,
    #[serde(default = "default_arrivals")]
    pub arrivals: ArrivalModel,
    /// Share of clients that send no TCP timestamp option (Windows desktops): cheetah
    /// cannot carry a cookie for them and takes its Maglev + fallback-table path.
    #[serde(default = "default_no_timestamp_share")]
    pub no_timestamp_share: f64,
}

fn default_durations() -> DurationModel {
    DurationModel::Edge
}
fn default_sizes() -> SizeModel {
    SizeModel::WebSearch
}
fn default_arrivals() -> ArrivalModel {
    ArrivalModel::Steady
}
fn default_no_timestamp_share() -> f64 {
    0.02
}

impl Default for WorkloadSpec {
    fn default() -> Self {
        WorkloadSpec {
            durations: default_durations(),
            sizes: default_sizes(),
            arrivals: default_arrivals(),
            no_timestamp_share: default_no_timestamp_share(),
        }
    }
}

/// One new connection as the clients produce it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NewConnection {
    /// Keyed hash of the connection id. SipHash output is uniform, so a uniform draw is
    /// what the LB would see.
    pub flow_hash: u64,
    /// How long the connection stays open from now.
    pub lifetime: Nanos,
    pub bytes: u64,
    /// The client sends TCP timestamps (cheetah can place a cookie).
    pub timestamps: bool,
}

/// Samples connections for one scenario. Owns its RNG, so the workload is identical
/// whatever load balancer the run simulates.
pub struct Workload {
    rng: PolicyRng,
    durations: Option<Cdf>,
    duration_model: DurationModel,
    sizes: Cdf,
    arrivals: ArrivalModel,
    /// Arrival rate (per second) of the steady model, or the peak rate of the sinusoidal one.
    peak_rate: f64,
    no_timestamp_share: f64,
}

impl Workload {
    /// `active_connections` sets the steady arrival rate; ignored by the sinusoidal model.
    pub fn new(spec: &WorkloadSpec, active_connections: f64, rng: PolicyRng) -> Self {
        let sizes = match spec.sizes {
            SizeModel::WebSearch => Cdf::new(&WEB_SEARCH_KNOTS, false),
            SizeModel::DataMining => Cdf::new(&DATA_MINING_KNOTS, false),
        };
        let durations = match &spec.durations {
            DurationModel::Edge => Some(Cdf::new(&EDGE_DURATION_KNOTS, true)),
            DurationModel::Empirical { knots } => Some(Cdf::new(knots, true)),
            _ => None,
        };
        let mut workload = Workload {
            rng,
            durations,
            duration_model: spec.durations.clone(),
            sizes,
            arrivals: spec.arrivals.clone(),
            peak_rate: 0.0,
            no_timestamp_share: spec.no_timestamp_share,
        };
        workload.peak_rate = match spec.arrivals {
            ArrivalModel::Steady => active_connections / workload.mean_duration(),
            ArrivalModel::Sinusoidal { high_per_s, .. } => high_per_s,
        };
        workload
    }

    /// Mean connection duration in seconds.
    pub fn mean_duration(&self) -> f64 {
        match &self.duration_model {
            DurationModel::Edge | DurationModel::Empirical { .. } => {
                self.durations.as_ref().expect("duration CDF").mean()
            }
            DurationModel::Fixed { seconds } => *seconds,
            DurationModel::FromSize { base_ms, rate_mbps } => {
                base_ms / 1e3 + self.sizes.mean() * PACKET_BYTES * 8.0 / (rate_mbps * 1e6)
            }
        }
    }

    /// Arrival rate (per second) at time `t`.
    pub fn rate_at(&self, t: Nanos) -> f64 {
        match self.arrivals {
            ArrivalModel::Steady => self.peak_rate,
            ArrivalModel::Sinusoidal {
                low_per_s,
                high_per_s,
                period_s,
            } => {
                let phase = t as f64 / NANOS_PER_SEC as f64 / period_s * std::f64::consts::TAU;
                low_per_s + (high_per_s - low_per_s) * (1.0 - phase.cos()) / 2.0
            }
        }
    }

    /// How many connections are open in steady state at time 0 (Little's law).
    pub fn initial_active(&self) -> usize {
        (self.rate_at(0) * self.mean_duration()).round() as usize
    }

    /// The next arrival strictly after `now` (thinning for the non-homogeneous model).
    pub fn next_arrival(&mut self, now: Nanos) -> Nanos {
        if self.peak_rate <= 0.0 {
            return Nanos::MAX;
        }
        let mut t = now;
        loop {
            t = t.saturating_add(secs(exponential(&mut self.rng, self.peak_rate)).max(1));
            let accept = self.rate_at(t) / self.peak_rate;
            if accept >= 1.0 || unit(&mut self.rng) < accept {
                return t;
            }
        }
    }

    /// A connection that starts now.
    pub fn connection(&mut self) -> NewConnection {
        let bytes = self.sample_bytes();
        let seconds = match &self.duration_model {
            DurationModel::Edge | DurationModel::Empirical { .. } => self
                .durations
                .as_ref()
                .expect("duration CDF")
                .sample(&mut self.rng),
            DurationModel::Fixed { seconds } => *seconds,
            DurationModel::FromSize { base_ms, rate_mbps } => {
                base_ms / 1e3 + bytes as f64 * 8.0 / (rate_mbps * 1e6)
            }
        };
        self.finish(bytes, seconds)
    }

    /// A connection already open at time 0 of a system in steady state: its total length
    /// is length-biased and time 0 falls uniformly within it, so only the residual part
    /// is returned (the "inspection paradox"). Starting from steady state instead of an
    /// empty system spares the hour of warm-up the longest connections would need.
    pub fn connection_in_progress(&mut self) -> NewConnection {
        let (bytes, total) = match self.duration_model.clone() {
            DurationModel::Edge | DurationModel::Empirical { .. } => {
                let bytes = self.sample_bytes();
                let total = self
                    .durations
                    .as_ref()
                    .expect("duration CDF")
                    .sample_length_biased(&mut self.rng);
                (bytes, total)
            }
            DurationModel::Fixed { seconds } => (self.sample_bytes(), seconds),
            DurationModel::FromSize { base_ms, rate_mbps } => {
                let packets = self.sizes.sample_length_biased(&mut self.rng);
                let bytes = (packets * PACKET_BYTES).round() as u64;
                (
                    bytes,
                    base_ms / 1e3 + bytes as f64 * 8.0 / (rate_mbps * 1e6),
                )
            }
        };
        let residual = total * (1.0 - unit(&mut self.rng));
        self.finish(bytes, residual)
    }

    fn sample_bytes(&mut self) -> u64 {
        (self.sizes.sample(&mut self.rng) * PACKET_BYTES).round() as u64
    }

    fn finish(&mut self, bytes: u64, seconds: f64) -> NewConnection {
        let flow_hash = self.rng.next_u64();
        let timestamps = unit(&mut self.rng) >= self.no_timestamp_share;
        NewConnection {
            flow_hash,
            lifetime: secs(seconds).max(1),
            bytes,
            timestamps,
        }
    }
}

#[cfg(test)]
mod tests {
    use rand_core::SeedableRng;

    use super::*;

    fn share_below(samples: &[f64], x: f64) -> f64 {
        samples.iter().filter(|&&s| s < x).count() as f64 / samples.len() as f64
    }

    #[test]
    fn edge_durations_match_faild_bands() {
        let cdf = Cdf::new(&EDGE_DURATION_KNOTS, true);
        let mut rng = PolicyRng::seed_from_u64(1);
        let samples: Vec<f64> = (0..200_000).map(|_| cdf.sample(&mut rng)).collect();
        let under_10s = share_below(&samples, 10.0);
        let under_1min = share_below(&samples, 60.0);
        assert!((0.60..=0.70).contains(&under_10s), "{under_10s}");
        assert!((0.78..=0.85).contains(&under_1min), "{under_1min}");
        let mean = samples.iter().sum::<f64>() / samples.len() as f64;
        assert!(
            (mean / cdf.mean() - 1.0).abs() < 0.03,
            "{mean} vs {}",
            cdf.mean()
        );
    }

    #[test]
    fn size_cdfs_have_their_published_medians() {
        let mut rng = PolicyRng::seed_from_u64(2);
        let web = Cdf::new(&WEB_SEARCH_KNOTS, false);
        let samples: Vec<f64> = (0..100_000).map(|_| web.sample(&mut rng)).collect();
        // 53% of web-search flows are at most 53 packets.
        assert!((share_below(&samples, 53.0) - 0.53).abs() < 0.01);
        let mining = Cdf::new(&DATA_MINING_KNOTS, false);
        let samples: Vec<f64> = (0..100_000).map(|_| mining.sample(&mut rng)).collect();
        // Half the data-mining flows are a single packet.
        assert!((share_below(&samples, 1.0 + 1e-9) - 0.5).abs() < 0.01);
    }

    #[test]
    fn length_biased_draws_have_the_right_mean() {
        // E[length-biased X] = E[X^2] / E[X]; check against a direct estimate.
        for (knots, log) in [
            (&EDGE_DURATION_KNOTS[..], true),
            (&WEB_SEARCH_KNOTS[..], false),
        ] {
            let cdf = Cdf::new(knots, log);
            let mut rng = PolicyRng::seed_from_u64(3);
            let n = 400_000;
            let plain: Vec<f64> = (0..n).map(|_| cdf.sample(&mut rng)).collect();
            let expected = plain.iter().map(|x| x * x).sum::<f64>() / plain.iter().sum::<f64>();
            let biased = (0..n)
                .map(|_| cdf.sample_length_biased(&mut rng))
                .sum::<f64>()
                / n as f64;
            assert!(
                (biased / expected - 1.0).abs() < 0.05,
                "{biased} vs {expected}"
            );
        }
    }

    #[test]
    fn steady_rate_holds_the_requested_active_connections() {
        let spec = WorkloadSpec::default();
        let workload = Workload::new(&spec, 200_000.0, PolicyRng::seed_from_u64(4));
        assert_eq!(workload.initial_active(), 200_000);
        let rate = workload.rate_at(0);
        assert!((rate * workload.mean_duration() - 200_000.0).abs() < 1e-6);
    }

    #[test]
    fn sinusoidal_rate_swings_between_its_bounds() {
        let spec = WorkloadSpec {
            arrivals: ArrivalModel::Sinusoidal {
                low_per_s: 1500.0,
                high_per_s: 2500.0,
                period_s: 40.0,
            },
            ..WorkloadSpec::default()
        };
        let workload = Workload::new(&spec, 0.0, PolicyRng::seed_from_u64(5));
        assert!((workload.rate_at(0) - 1500.0).abs() < 1e-9);
        assert!((workload.rate_at(secs(20.0)) - 2500.0).abs() < 1e-9);
        assert!((workload.rate_at(secs(40.0)) - 1500.0).abs() < 1e-9);
    }
}
