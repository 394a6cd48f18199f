//! Runs the plans of a study, on several threads if asked, with a progress bar.
//!
//! Runs are independent and each is deterministic, and results are put back in plan
//! order, so the output does not depend on the number of threads.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::engine::{run, RunOptions, RunResult};
use crate::scenario::{RunPlan, Study};

/// How to run a study.
pub struct RunnerOptions {
    /// Threads running plans at once.
    pub jobs: usize,
    /// Draw progress bars on stderr (only shown on a terminal).
    pub progress: bool,
}

/// A run's result with the wall time it took (kept out of the CSVs, which must not depend
/// on the machine).
pub struct Timed {
    pub result: RunResult,
    pub wall: Duration,
}

pub fn run_plans(study: &Study, plans: &[RunPlan], options: &RunnerOptions) -> Vec<Timed> {
    let multi = MultiProgress::with_draw_target(if options.progress {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    });
    let overall = multi.add(ProgressBar::new(plans.len() as u64));
    overall.set_style(
        ProgressStyle::with_template("{prefix} [{elapsed_precise}] {wide_bar} {pos}/{len} runs")
            .expect("valid template"),
    );
    overall.set_prefix(study.name.clone());
    if options.progress {
        overall.enable_steady_tick(Duration::from_millis(500));
    }
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Timed>>> = Mutex::new((0..plans.len()).map(|_| None).collect());
    let style = ProgressStyle::with_template("  {msg:32} {bar:40} {pos}/{len} simulated s")
        .expect("valid template");
    std::thread::scope(|scope| {
        for _ in 0..options.jobs.max(1) {
            scope.spawn(|| loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let Some(plan) = plans.get(index) else {
                    break;
                };
                let span = (plan.scenario.warmup_s + plan.scenario.duration_s).ceil() as u64;
                let bar = multi.add(ProgressBar::new(span));
                bar.set_style(style.clone());
                bar.set_message(describe(study, plan));
                let started = Instant::now();
                let result = run(
                    &plan.scenario,
                    &plan.lb,
                    plan.param,
                    &RunOptions {
                        record_placements: false,
                        progress: Some(bar.clone()),
                    },
                );
                let wall = started.elapsed();
                bar.finish_and_clear();
                multi.remove(&bar);
                overall.inc(1);
                results.lock().expect("no thread panicked")[index] = Some(Timed { result, wall });
            });
        }
    });
    overall.finish_and_clear();
    results
        .into_inner()
        .expect("no thread panicked")
        .into_iter()
        .map(|timed| timed.expect("every plan ran"))
        .collect()
}

/// A short label of a run for progress bars and logs.
pub fn describe(study: &Study, plan: &RunPlan) -> String {
    match (&study.sweep, plan.param) {
        (Some(sweep), Some(value)) => {
            format!("{} {}={}", plan.lb.name(), sweep.param.name(), value)
        }
        _ => plan.lb.name(),
    }
}

/// Files a study wrote.
pub struct Outputs {
    pub runs: Vec<Timed>,
    pub files: Vec<std::path::PathBuf>,
    /// Plots that could not be drawn (e.g. no font): the CSVs are written regardless.
    pub plot_error: Option<anyhow::Error>,
}

/// Runs every plan of `study` and writes `<out>/<name>.csv`, `<name>_timeseries.csv`
/// (time-series studies) and one PNG + SVG per plot.
pub fn run_study(
    study: &Study,
    out: &std::path::Path,
    options: &RunnerOptions,
) -> anyhow::Result<Outputs> {
    let plans = study.plans();
    let runs = run_plans(study, &plans, options);
    let results: Vec<&RunResult> = runs.iter().map(|timed| &timed.result).collect();
    std::fs::create_dir_all(out)?;
    let mut files = Vec::new();
    let summary = out.join(format!("{}.csv", study.name));
    crate::report::write_summary(std::fs::File::create(&summary)?, study, &plans, &results)?;
    files.push(summary);
    if plans.iter().any(|plan| plan.scenario.timeseries) {
        let series = out.join(format!("{}_timeseries.csv", study.name));
        crate::report::write_series(std::fs::File::create(&series)?, study, &results)?;
        files.push(series);
    }
    let mut plot_error = None;
    for spec in &study.plots {
        let stem = out.join(format!("{}_{}", study.name, spec.metric.name()));
        let chart = crate::plot::chart(study, spec, &results);
        match crate::plot::write(&chart, &stem) {
            Ok(()) => {
                files.push(stem.with_extension("png"));
                files.push(stem.with_extension("svg"));
            }
            Err(error) => {
                plot_error = Some(error);
                break;
            }
        }
    }
    Ok(Outputs {
        runs,
        files,
        plot_error,
    })
}
