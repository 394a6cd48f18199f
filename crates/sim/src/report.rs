//! CSV outputs: one summary row per run, and per-second rows for time-series studies.
//!
//! Numbers are printed with fixed precision and wall times are left out, so the same seed
//! gives byte-identical files on any machine.

use std::io::Write;

use crate::engine::{pct, RunResult};
use crate::scenario::{RunPlan, Study};

pub const SUMMARY_HEADER: [&str; 19] = [
    "study",
    "lb",
    "param",
    "value",
    "seed",
    "servers",
    "active_target",
    "update_rate_per_min",
    "connections",
    "broken",
    "broken_pct",
    "broken_bytes_pct",
    "fallback_connections",
    "fallback_broken",
    "mean_system_imbalance",
    "imbalance_excess_pct",
    "mean_active",
    "arrivals",
    "dip_updates",
];

pub const SERIES_HEADER: [&str; 11] = [
    "study",
    "lb",
    "value",
    "second",
    "arrivals",
    "completed",
    "broken",
    "broken_per_second_pct",
    "active",
    "pool",
    "system_imbalance",
];

fn value(param: Option<f64>) -> String {
    param.map_or_else(String::new, |v| format!("{v}"))
}

/// Writes the summary CSV of `results` (in plan order) to `out`.
pub fn write_summary<W: Write>(
    out: W,
    study: &Study,
    plans: &[RunPlan],
    results: &[&RunResult],
) -> anyhow::Result<()> {
    let mut writer = csv::Writer::from_writer(out);
    writer.write_record(SUMMARY_HEADER)?;
    let param = study.sweep.as_ref().map_or("", |sweep| sweep.param.name());
    for (plan, result) in plans.iter().zip(results) {
        let scenario = &plan.scenario;
        writer.write_record([
            study.name.clone(),
            result.lb.clone(),
            param.to_string(),
            value(result.param),
            scenario.seed.to_string(),
            scenario.servers.to_string(),
            format!("{}", scenario.active_connections),
            format!("{}", scenario.updates.rate_per_min),
            result.connections.to_string(),
            result.broken.to_string(),
            format!("{:.6}", result.broken_pct()),
            format!("{:.6}", result.broken_bytes_pct()),
            result.fallback_connections.to_string(),
            result.fallback_broken.to_string(),
            format!("{:.6}", result.mean_system_imbalance),
            format!("{:.4}", result.imbalance_excess_pct()),
            format!("{:.1}", result.mean_active),
            result.arrivals.to_string(),
            result.dip_updates.to_string(),
        ])?;
    }
    writer.flush()?;
    Ok(())
}

/// Writes the per-second CSV of `results` to `out`.
pub fn write_series<W: Write>(out: W, study: &Study, results: &[&RunResult]) -> anyhow::Result<()> {
    let mut writer = csv::Writer::from_writer(out);
    writer.write_record(SERIES_HEADER)?;
    for result in results {
        for (second, stats) in result.series.iter().enumerate() {
            writer.write_record([
                study.name.clone(),
                result.lb.clone(),
                value(result.param),
                second.to_string(),
                stats.arrivals.to_string(),
                stats.completed.to_string(),
                stats.broken.to_string(),
                format!("{:.4}", pct(stats.broken, stats.broken + stats.completed)),
                stats.active.to_string(),
                stats.pool.to_string(),
                format!("{:.6}", stats.system_imbalance),
            ])?;
        }
    }
    writer.flush()?;
    Ok(())
}
