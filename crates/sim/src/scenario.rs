//! Scenarios and studies, as written in TOML files and in the built-in presets.
//!
//! A [`Scenario`] describes one simulated world: the cluster, the clients, the DIP updates
//! and the LB instances. A [`Study`] runs a list of load balancers over a scenario,
//! optionally sweeping one parameter, and says which plots to draw. Every preset
//! (`presets/*.toml`, one per figure) is a study file like any user-written one.

use serde::{Deserialize, Serialize};

use crate::lbs::LbSpec;
use crate::workload::WorkloadSpec;

/// One simulated world.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Seeds every generator of the run; same seed, same results.
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Servers in the pool at the start (ids `0..servers`).
    #[serde(default = "default_servers")]
    pub servers: usize,
    /// Configured weights, server `i` getting `weights[i % len]` (for WRR).
    #[serde(default = "default_weights")]
    pub weights: Vec<u32>,
    /// Connections open in steady state (sets the steady arrival rate).
    #[serde(default = "default_active")]
    pub active_connections: f64,
    /// Simulated seconds before the measurement window opens.
    #[serde(default = "default_warmup")]
    pub warmup_s: f64,
    /// Length of the measurement window, in simulated seconds.
    #[serde(default = "default_duration")]
    pub duration_s: f64,
    #[serde(default)]
    pub workload: WorkloadSpec,
    #[serde(default)]
    pub updates: UpdateSpec,
    #[serde(default)]
    pub lb_pool: LbPoolSpec,
    /// Record per-second counts (broken, completed...) for a time-series plot.
    #[serde(default)]
    pub timeseries: bool,
}

fn default_seed() -> u64 {
    1
}
fn default_servers() -> usize {
    468
}
fn default_weights() -> Vec<u32> {
    vec![1]
}
fn default_active() -> f64 {
    100_000.0
}
fn default_warmup() -> f64 {
    60.0
}
fn default_duration() -> f64 {
    600.0
}

impl Default for Scenario {
    fn default() -> Self {
        Scenario {
            seed: default_seed(),
            servers: default_servers(),
            weights: default_weights(),
            active_connections: default_active(),
            warmup_s: default_warmup(),
            duration_s: default_duration(),
            workload: WorkloadSpec::default(),
            updates: UpdateSpec::default(),
            lb_pool: LbPoolSpec::default(),
            timeseries: false,
        }
    }
}

/// DIP updates: server removals and additions.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateSpec {
    /// Poisson rate of random updates per minute (SilkRoad: 1.5 to 80 for 95% of
    /// clusters). Each removes a random pool server or re-adds a removed one, with equal
    /// probability, keeping the pool between `min_pool_share` of its size and full.
    #[serde(default)]
    pub rate_per_min: f64,
    #[serde(default = "default_min_pool_share")]
    pub min_pool_share: f64,
    /// Updates at given times: `add` brings a new server id, `remove` takes a random pool
    /// server out (it keeps serving its connections).
    #[serde(default)]
    pub scheduled: Vec<ScheduledChange>,
}

fn default_min_pool_share() -> f64 {
    0.9
}

impl Default for UpdateSpec {
    fn default() -> Self {
        UpdateSpec {
            rate_per_min: 0.0,
            min_pool_share: default_min_pool_share(),
            scheduled: Vec::new(),
        }
    }
}

/// The LB instances behind the first-tier ECMP routers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LbPoolSpec {
    #[serde(default = "default_instances")]
    pub instances: usize,
    /// `add` announces a new instance (empty state), `remove` withdraws the oldest.
    #[serde(default)]
    pub changes: Vec<ScheduledChange>,
}

fn default_instances() -> usize {
    1
}

impl Default for LbPoolSpec {
    fn default() -> Self {
        LbPoolSpec {
            instances: default_instances(),
            changes: Vec::new(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduledChange {
    pub at_s: f64,
    pub action: Action,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    Add,
    Remove,
}

/// Which scenario or LB parameter a study sweeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SweepParam {
    UpdateRatePerMin,
    ActiveConnections,
    /// The threshold of every `dynamic-beamer` in the study.
    ImbalanceThreshold,
    NoTimestampShare,
    Servers,
}

impl SweepParam {
    pub fn name(self) -> &'static str {
        match self {
            SweepParam::UpdateRatePerMin => "update_rate_per_min",
            SweepParam::ActiveConnections => "active_connections",
            SweepParam::ImbalanceThreshold => "imbalance_threshold",
            SweepParam::NoTimestampShare => "no_timestamp_share",
            SweepParam::Servers => "servers",
        }
    }

    /// Axis label of plots.
    pub fn label(self) -> &'static str {
        match self {
            SweepParam::UpdateRatePerMin => "DIP updates per minute",
            SweepParam::ActiveConnections => "active connections",
            SweepParam::ImbalanceThreshold => "imbalance threshold",
            SweepParam::NoTimestampShare => "share of clients without timestamps",
            SweepParam::Servers => "servers",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sweep {
    pub param: SweepParam,
    pub values: Vec<f64>,
}

/// What a plot shows on its y axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Metric {
    /// Broken connections, % of the connections of the window.
    BrokenPct,
    /// Time-weighted system imbalance minus 1, in % (15% = the busiest server has 1.15x
    /// the average).
    ImbalanceExcessPct,
    /// Per second: broken over ended connections, in %.
    BrokenPerSecondPct,
    /// Per second: broken connections.
    BrokenPerSecond,
    /// Broken connections since the window opened, second by second.
    BrokenCumulative,
}

impl Metric {
    pub fn label(self) -> &'static str {
        match self {
            Metric::BrokenPct => "broken connections (%)",
            Metric::ImbalanceExcessPct => "system imbalance - 1 (%)",
            Metric::BrokenPerSecondPct => "broken / ended connections (%)",
            Metric::BrokenPerSecond => "broken connections per second",
            Metric::BrokenCumulative => "broken connections so far",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Metric::BrokenPct => "broken_pct",
            Metric::ImbalanceExcessPct => "imbalance_excess_pct",
            Metric::BrokenPerSecondPct => "broken_per_second_pct",
            Metric::BrokenPerSecond => "broken_per_second",
            Metric::BrokenCumulative => "broken_cumulative",
        }
    }

    /// Whether the metric is drawn over time (one point per second) rather than over the
    /// swept parameter.
    pub fn is_timeseries(self) -> bool {
        matches!(
            self,
            Metric::BrokenPerSecondPct | Metric::BrokenPerSecond | Metric::BrokenCumulative
        )
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlotSpec {
    pub metric: Metric,
    #[serde(default)]
    pub log_y: bool,
    #[serde(default)]
    pub title: Option<String>,
}

/// A set of runs that make one figure.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Study {
    /// File stem of the outputs (`<name>.csv`, `<name>_<metric>.png`...).
    pub name: String,
    #[serde(default)]
    pub title: String,
    #[serde(default)]
    pub scenario: Scenario,
    pub lbs: Vec<LbSpec>,
    #[serde(default)]
    pub sweep: Option<Sweep>,
    #[serde(default)]
    pub plots: Vec<PlotSpec>,
}

/// One run of a study: a scenario, a load balancer and the swept value that made them.
#[derive(Clone, Debug)]
pub struct RunPlan {
    pub scenario: Scenario,
    pub lb: LbSpec,
    pub param: Option<f64>,
}

/// The built-in studies, one per figure, plus the speed benchmark.
pub const PRESETS: [(&str, &str); 6] = [
    ("fig2a", include_str!("../presets/fig2a.toml")),
    ("fig2b", include_str!("../presets/fig2b.toml")),
    ("fig2c", include_str!("../presets/fig2c.toml")),
    ("fig9", include_str!("../presets/fig9.toml")),
    ("lbpool", include_str!("../presets/lbpool.toml")),
    ("bench", include_str!("../presets/bench.toml")),
];

impl Study {
    pub fn from_toml(text: &str) -> anyhow::Result<Study> {
        let study: Study = toml::from_str(text)?;
        study.validate()?;
        Ok(study)
    }

    pub fn preset(name: &str) -> anyhow::Result<Study> {
        let (_, text) = PRESETS
            .iter()
            .find(|(preset, _)| *preset == name)
            .ok_or_else(|| {
                let names: Vec<&str> = PRESETS.iter().map(|(name, _)| *name).collect();
                anyhow::anyhow!("no preset {name:?}; presets: {}", names.join(", "))
            })?;
        Study::from_toml(text)
    }

    fn validate(&self) -> anyhow::Result<()> {
        let scenario = &self.scenario;
        anyhow::ensure!(
            !self.lbs.is_empty(),
            "a study needs at least one LB in `lbs`"
        );
        anyhow::ensure!(
            (1..=MAX_SERVERS).contains(&scenario.servers),
            "servers must be in 1..={MAX_SERVERS}"
        );
        anyhow::ensure!(
            !scenario.weights.is_empty() && scenario.weights.iter().all(|&w| w >= 1),
            "weights must be >= 1"
        );
        anyhow::ensure!(
            (1..=64).contains(&scenario.lb_pool.instances),
            "lb_pool.instances must be in 1..=64"
        );
        anyhow::ensure!(
            (0.0..=1.0).contains(&scenario.workload.no_timestamp_share),
            "no_timestamp_share must be in [0, 1]"
        );
        if let crate::workload::DurationModel::Empirical { knots } = &scenario.workload.durations {
            anyhow::ensure!(
                knots.len() >= 2
                    && knots[0].1 == 0.0
                    && knots[knots.len() - 1].1 == 1.0
                    && knots[0].0 > 0.0
                    && knots
                        .windows(2)
                        .all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1),
                "empirical duration knots must start at share 0, end at share 1, and grow"
            );
        }
        anyhow::ensure!(
            scenario.duration_s > 0.0 && scenario.warmup_s >= 0.0,
            "duration_s must be positive and warmup_s non-negative"
        );
        Ok(())
    }

    /// Every run of the study, sweep value by sweep value, LB by LB (the CSV order).
    pub fn plans(&self) -> Vec<RunPlan> {
        let values: Vec<Option<f64>> = match &self.sweep {
            Some(sweep) => sweep.values.iter().map(|&v| Some(v)).collect(),
            None => vec![None],
        };
        let mut plans = Vec::new();
        for value in values {
            for lb in &self.lbs {
                let mut scenario = self.scenario.clone();
                let mut lb = lb.clone();
                if let (Some(sweep), Some(value)) = (&self.sweep, value) {
                    apply(sweep.param, value, &mut scenario, &mut lb);
                }
                plans.push(RunPlan {
                    scenario,
                    lb,
                    param: value,
                });
            }
        }
        plans
    }
}

/// Largest cluster: ids must fit the cookie's 15 bits, with room for scheduled additions.
pub const MAX_SERVERS: usize = 16_384;

fn apply(param: SweepParam, value: f64, scenario: &mut Scenario, lb: &mut LbSpec) {
    match param {
        SweepParam::UpdateRatePerMin => scenario.updates.rate_per_min = value,
        SweepParam::ActiveConnections => scenario.active_connections = value,
        SweepParam::NoTimestampShare => scenario.workload.no_timestamp_share = value,
        SweepParam::Servers => scenario.servers = value.round() as usize,
        SweepParam::ImbalanceThreshold => {
            if let LbSpec::DynamicBeamer { threshold, .. } = lb {
                *threshold = value;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_parses() {
        for (name, _) in PRESETS {
            let study = Study::preset(name).unwrap();
            assert_eq!(study.name, name);
            assert!(!study.plans().is_empty());
        }
    }

    #[test]
    fn sweeps_expand_value_by_value_then_lb_by_lb() {
        let study = Study::from_toml(
            r#"
            name = "t"
            lbs = [{ kind = "hash" }, { kind = "dynamic-beamer", threshold = 0.5 }]
            [sweep]
            param = "imbalance-threshold"
            values = [0.1, 0.2]
            "#,
        )
        .unwrap();
        let plans = study.plans();
        assert_eq!(plans.len(), 4);
        assert_eq!(plans[0].lb, LbSpec::Hash);
        match &plans[3].lb {
            LbSpec::DynamicBeamer { threshold, .. } => assert_eq!(*threshold, 0.2),
            other => panic!("{other:?}"),
        }
        assert_eq!(plans[3].param, Some(0.2));
    }

    #[test]
    fn unknown_fields_are_refused() {
        assert!(Study::from_toml("name = \"t\"\nlbs = [{ kind = \"hash\" }]\nsevers = 3").is_err());
    }
}
