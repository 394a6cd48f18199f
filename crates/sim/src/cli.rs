//! `cheetah sim`: the discrete-event simulator of the paper's large-scale study
//! (crates/sim, docs/simulation.md), run on a built-in preset or a study file.

use std::path::PathBuf;

use crate::lbs::LbSpec;
use crate::runner::{describe, run_study, RunnerOptions};
use crate::scenario::{Study, PRESETS};
use anyhow::Context;

#[derive(clap::Args)]
pub struct Args {
    /// A built-in study: fig2a, fig2b, fig2c, fig9, lbpool or bench.
    #[arg(long, conflicts_with = "scenario", required_unless_present_any = ["scenario", "list_presets"])]
    preset: Option<String>,
    /// A study file (TOML), written like the presets (`--print` shows one).
    #[arg(long)]
    scenario: Option<PathBuf>,
    /// Directory for the CSVs and plots.
    #[arg(long, default_value = "sim-out")]
    out: PathBuf,
    /// Runs simulated at once (one thread each).
    #[arg(long, default_value_t = 1)]
    jobs: usize,
    /// Simulate only these load balancers (e.g. `--lb beamer --lb cheetah-pow2`).
    #[arg(long = "lb")]
    lbs: Vec<String>,
    /// Simulate only these values of the swept parameter.
    #[arg(long = "value")]
    values: Vec<f64>,
    /// Replace the study's seed.
    #[arg(long)]
    seed: Option<u64>,
    /// Replace the measured duration, in simulated seconds.
    #[arg(long)]
    duration: Option<f64>,
    /// Print the study's TOML and exit.
    #[arg(long)]
    print: bool,
    /// List the presets and exit.
    #[arg(long)]
    list_presets: bool,
    /// No progress bars.
    #[arg(long)]
    quiet: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.list_presets {
        for (name, text) in PRESETS {
            let study = Study::from_toml(text)?;
            println!("{name:8} {}", study.title);
        }
        return Ok(());
    }
    let mut study = match (&args.preset, &args.scenario) {
        (Some(name), _) => Study::preset(name)?,
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            Study::from_toml(&text).with_context(|| format!("parsing {}", path.display()))?
        }
        (None, None) => anyhow::bail!("give --preset or --scenario"),
    };
    if args.print {
        print!("{}", toml::to_string(&study)?);
        return Ok(());
    }
    if let Some(seed) = args.seed {
        study.scenario.seed = seed;
    }
    if let Some(duration) = args.duration {
        study.scenario.duration_s = duration;
    }
    if !args.lbs.is_empty() {
        for name in &args.lbs {
            anyhow::ensure!(LbSpec::from_name(name).is_some(), "unknown LB {name:?}");
        }
        study.lbs.retain(|lb| args.lbs.contains(&lb.name()));
        anyhow::ensure!(
            !study.lbs.is_empty(),
            "none of {:?} is in the study",
            args.lbs
        );
    }
    if !args.values.is_empty() {
        let sweep = study
            .sweep
            .as_mut()
            .context("--value needs a study with a sweep")?;
        sweep.values.retain(|value| args.values.contains(value));
        anyhow::ensure!(
            !sweep.values.is_empty(),
            "none of {:?} is swept",
            args.values
        );
    }

    let outputs = run_study(
        &study,
        &args.out,
        &RunnerOptions {
            jobs: args.jobs,
            progress: !args.quiet,
        },
    )?;
    println!(
        "{:40} {:>12} {:>10} {:>10} {:>14} {:>9}",
        "run", "connections", "broken", "broken %", "imbalance-1 %", "wall s"
    );
    for (plan, timed) in study.plans().iter().zip(&outputs.runs) {
        let result = &timed.result;
        println!(
            "{:40} {:>12} {:>10} {:>10.4} {:>14.3} {:>9.2}",
            describe(&study, plan),
            result.connections,
            result.broken,
            result.broken_pct(),
            result.imbalance_excess_pct(),
            timed.wall.as_secs_f64()
        );
    }
    for file in &outputs.files {
        println!("wrote {}", file.display());
    }
    if let Some(error) = outputs.plot_error {
        eprintln!("plots not drawn: {error:#}");
    }
    Ok(())
}
