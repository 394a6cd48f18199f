//! Same seed, same CSV, byte for byte; another seed, another CSV.

use cheetah_sim::engine::{run, RunOptions};
use cheetah_sim::report::{write_series, write_summary};
use cheetah_sim::scenario::Study;

const STUDY: &str = r#"
name = "determinism"
[scenario]
seed = 3
servers = 16
active_connections = 1000
warmup_s = 2
duration_s = 10
timeseries = true
[scenario.updates]
rate_per_min = 30
[scenario.lb_pool]
instances = 2
changes = [{ at_s = 8, action = "add" }]
[sweep]
param = "update-rate-per-min"
values = [30, 60]
[[lbs]]
kind = "cheetah"
policy = "pow2"
[[lbs]]
kind = "cheetah"
policy = "awrr"
[[lbs]]
kind = "beamer"
[[lbs]]
kind = "shell"
[[lbs]]
kind = "stateful"
[[lbs]]
kind = "dynamic-beamer"
threshold = 0.2
"#;

fn csv(study: &Study) -> Vec<u8> {
    let plans = study.plans();
    let results: Vec<_> = plans
        .iter()
        .map(|plan| run(&plan.scenario, &plan.lb, plan.param, &RunOptions::default()))
        .collect();
    let refs: Vec<_> = results.iter().collect();
    let mut out = Vec::new();
    write_summary(&mut out, study, &plans, &refs).unwrap();
    write_series(&mut out, study, &refs).unwrap();
    out
}

#[test]
fn same_seed_same_csv() {
    let study = Study::from_toml(STUDY).unwrap();
    let first = csv(&study);
    assert_eq!(first, csv(&study));
    let text = String::from_utf8(first.clone()).unwrap();
    assert!(text.lines().count() > 12 * 10, "{text}");

    let mut other = study.clone();
    other.scenario.seed = 4;
    assert_ne!(first, csv(&other));
}
