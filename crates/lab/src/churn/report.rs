//! `cheetah testbed churn-report`: a cheetah run and a hash run of the churn scenario, side
//! by side, as a table (printed, and written as Markdown) and a plot of broken connections
//! over time.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;

use super::load::LONG_IDLE_CLASS;
use super::plot;
use super::results::ChurnResults;

#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// `cheetah.json` written by `cheetah testbed churn --mode cheetah`.
    #[arg(long)]
    cheetah: PathBuf,
    /// `hash.json` written by `cheetah testbed churn --mode hash`.
    #[arg(long)]
    hash: PathBuf,
    /// Where to write `churn-table.md` and `broken-over-time.png`.
    #[arg(long)]
    out: PathBuf,
    /// Further runs, such as `cheetah-2lbs.json` of `churn --lbs 2`: a line each under
    /// the table (and in `churn-table.md`).
    #[arg(long)]
    more: Vec<PathBuf>,
}

pub const TABLE_FILE: &str = "churn-table.md";
pub const PLOT_FILE: &str = "broken-over-time.png";

fn load(path: &Path) -> anyhow::Result<ChurnResults> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text)
        .with_context(|| format!("{} is not a churn scenario result", path.display()))
}

pub fn run(args: ReportArgs) -> anyhow::Result<()> {
    let cheetah = load(&args.cheetah)?;
    let hash = load(&args.hash)?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let mut table = table(&[&cheetah, &hash]);
    for path in &args.more {
        table.push_str(&format!("\n{}\n", one_line(&load(path)?)));
    }
    print!("{table}");
    let table_path = args.out.join(TABLE_FILE);
    std::fs::write(&table_path, &table)
        .with_context(|| format!("cannot write {}", table_path.display()))?;
    let plot_path = args.out.join(PLOT_FILE);
    plot::broken_over_time(&[&cheetah, &hash], &plot_path)?;
    println!(
        "\nwritten: {} and {}",
        table_path.display(),
        plot_path.display()
    );
    Ok(())
}

/// One line for the end of a run.
pub fn one_line(results: &ChurnResults) -> String {
    let kinds: Vec<String> = results
        .broken_by_kind
        .iter()
        .map(|(kind, n)| format!("{kind} {n}"))
        .collect();
    let apart = &results.no_timestamps;
    format!(
        "churn [{}{}]: {} requests completed, {} connections broken{}, {} long-lived connections open at the end{}",
        results.mode,
        if results.lbs == 1 {
            String::new()
        } else {
            format!(", {} LB instances", results.lbs)
        },
        results.requests.get("total").copied().unwrap_or(0),
        results.connections_broken,
        if kinds.is_empty() {
            String::new()
        } else {
            format!(" ({})", kinds.join(", "))
        },
        results.long_lived_at_end,
        if apart.clients.is_empty() {
            String::new()
        } else {
            format!(
                "; clients without timestamps ({}): {} connections, {} broken",
                apart.clients.join(" "),
                apart.connections_opened.get("total").copied().unwrap_or(0),
                apart.connections_broken
            )
        }
    )
}

fn ratio(value: Option<f64>) -> String {
    value.map_or("-".into(), |v| format!("{v:.2}"))
}

/// The classes of idle sessions the runs had, with the table's name for each: idle
/// sessions are told apart by their gap, which decides what they test.
fn idle_classes(runs: &[&ChurnResults]) -> Vec<(&'static str, f64)> {
    let Some(first) = runs.first() else {
        return Vec::new();
    };
    let mut classes = vec![("idle", first.workload.idle_gap_s)];
    if runs.iter().any(|r| r.workload.long_idle_sessions > 0) {
        classes.push((LONG_IDLE_CLASS, first.workload.long_idle_gap_s));
    }
    classes
}

/// The side-by-side table, Markdown (readable as plain text too).
pub fn table(runs: &[&ChurnResults]) -> String {
    let idle = idle_classes(runs);
    let label = |class: &str| -> String {
        idle.iter()
            .find(|(c, _)| *c == class)
            .map_or(class.to_string(), |(_, gap)| {
                format!("idle, gap {gap:.0} s")
            })
    };
    let mut rows: Vec<(String, Vec<String>)> = Vec::new();
    let mut row = |name: &str, value: &dyn Fn(&ChurnResults) -> String| {
        rows.push((name.to_string(), runs.iter().map(|r| value(r)).collect()));
    };
    let count = |r: &ChurnResults, key: &str| r.requests.get(key).copied().unwrap_or(0);
    row("load ran (s)", &|r| format!("{:.0}", r.elapsed_s));
    row("requests completed", &|r| count(r, "total").to_string());
    let mut classes = vec!["keepalive"];
    classes.extend(idle.iter().map(|(class, _)| *class));
    classes.extend(["short", "download"]);
    for class in classes {
        row(&format!("  {}", label(class)), &|r| {
            count(r, class).to_string()
        });
    }
    row("long-lived connections open at the end", &|r| {
        r.long_lived_at_end.to_string()
    });
    row("**connections broken**", &|r| {
        format!("**{}**", r.connections_broken)
    });
    let kinds: BTreeSet<&String> = runs.iter().flat_map(|r| r.broken_by_kind.keys()).collect();
    for kind in kinds {
        row(&format!("  {kind}"), &|r| {
            r.broken_by_kind.get(kind).copied().unwrap_or(0).to_string()
        });
    }
    let classes: BTreeSet<&String> = runs.iter().flat_map(|r| r.broken_by_class.keys()).collect();
    let broken_in = |r: &ChurnResults, class: &str| -> u64 {
        r.broken_by_class
            .get(class)
            .map(|kinds| kinds.values().sum::<u64>())
            .unwrap_or(0)
    };
    for class in classes {
        row(&format!("  of them {}", label(class)), &|r| {
            broken_in(r, class).to_string()
        });
    }
    for (class, gap) in &idle {
        row(
            &format!("**idle sessions, gap {gap:.0} s: requests / broken**"),
            &|r| format!("{} / **{}**", count(r, class), broken_in(r, class)),
        );
    }
    if runs.iter().any(|r| !r.no_timestamps.clients.is_empty()) {
        row(
            "**clients without timestamps: connections / broken**",
            &|r| {
                let apart = &r.no_timestamps;
                format!(
                    "{} / **{}**",
                    apart.connections_opened.get("total").copied().unwrap_or(0),
                    apart.connections_broken
                )
            },
        );
    }
    row("most broken in one second", &|r| {
        r.broken_per_second
            .iter()
            .map(|(_, kinds)| kinds.values().sum::<u64>())
            .max()
            .unwrap_or(0)
            .to_string()
    });
    row("requests per server, max/mean", &|r| {
        ratio(r.load_spread.requests_max_over_mean)
    });
    row("live sessions per server at the end, max/mean", &|r| {
        ratio(r.load_spread.live_sessions_max_over_mean)
    });
    row(
        "open connections per active server, max/mean (avg of 1 s samples)",
        &|r| ratio(r.load_spread.active_connections_max_over_mean),
    );
    row("drained servers removed / left draining", &|r| {
        let removed = r.events.iter().filter(|e| e.kind == "remove").count();
        format!("{removed} / {}", r.not_removed.len())
    });
    row("LB: cookie decode failures", &|r| {
        format!("{:.0}", total(r, "cookie_decode_failures"))
    });
    row("LB: server TS MSB advances seen", &|r| {
        format!("{:.0}", total(r, "event.ts_msb_advanced"))
    });

    let mut text = String::new();
    let headers: Vec<String> = runs.iter().map(|r| r.mode.clone()).collect();
    let _ = writeln!(text, "| | {} |", headers.join(" | "));
    let _ = writeln!(text, "|---|{}", "---:|".repeat(runs.len()));
    for (name, values) in rows {
        let _ = writeln!(text, "| {name} | {} |", values.join(" | "));
    }
    if let Some(first) = runs.first() {
        let _ = writeln!(
            text,
            "\n{} servers, {} forwarding, LB started with {} of them; load: {} keep-alive, {} idle ({:.0} s gaps), {} long idle ({:.0} s gaps), {} download sessions and {}/s short connections from {} clients.",
            first.servers,
            first.forwarding,
            first.initial_pool.len(),
            first.workload.keepalive,
            first.workload.idle_sessions,
            first.workload.idle_gap_s,
            first.workload.long_idle_sessions,
            first.workload.long_idle_gap_s,
            first.workload.downloads,
            first.workload.short_rate,
            first.workload.clients.len()
        );
        let _ = writeln!(text, "\nSchedule (seconds since the load started):\n");
        let _ = writeln!(text, "| {} | event |", headers.join(" | "));
        let _ = writeln!(text, "|{}---|", "---:|".repeat(runs.len()));
        // Removals happen when a drained server is empty, and the MSB changes when the
        // servers' clock says, both of which differ between runs; everything else is the
        // same schedule in the same order.
        let scheduled = |r: &ChurnResults| -> Vec<(f64, String)> {
            r.events
                .iter()
                .filter(|e| e.kind != "remove" && e.kind != "ts_msb_change")
                .map(|e| (e.t, e.label.clone()))
                .collect()
        };
        let per_run: Vec<Vec<(f64, String)>> = runs.iter().map(|r| scheduled(r)).collect();
        for (index, (_, label)) in per_run[0].iter().enumerate() {
            let times: Vec<String> = per_run
                .iter()
                .map(|events| {
                    events
                        .get(index)
                        .filter(|(_, l)| l == label)
                        .map_or("-".into(), |(t, _)| format!("{t:.1}"))
                })
                .collect();
            let _ = writeln!(text, "| {} | {label} |", times.join(" | "));
        }
        let _ = writeln!(
            text,
            "\nThe servers' timestamp MSB changed (every 65.5 s, on the servers' clock):\n"
        );
        for r in runs {
            let times: Vec<String> = r
                .events
                .iter()
                .filter(|e| e.kind == "ts_msb_change")
                .map(|e| format!("{:.1} s", e.t))
                .collect();
            let _ = writeln!(text, "- {}: {}", r.mode, times.join(", "));
        }
        let _ = writeln!(
            text,
            "\nDrained servers removed once they had no connection left:\n"
        );
        for r in runs {
            let removals: Vec<String> = r
                .events
                .iter()
                .filter(|e| e.kind == "remove")
                .map(|e| format!("{} at {:.1} s", e.label, e.t))
                .collect();
            let left: Vec<String> = r.not_removed.iter().map(|id| format!("s{id}")).collect();
            let _ = writeln!(
                text,
                "- {}: {}{}",
                r.mode,
                if removals.is_empty() {
                    "none".to_string()
                } else {
                    removals.join(", ")
                },
                if left.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; still holding connections at the end: {}",
                        left.join(", ")
                    )
                }
            );
        }
    }
    text
}

fn total(results: &ChurnResults, key: &str) -> f64 {
    results.lb_metrics.totals.get(key).copied().unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run recorded before the long idle sessions existed (docs/churn.md).
    fn recorded() -> ChurnResults {
        serde_json::from_str(include_str!("../../../../docs/churn/cheetah.json")).unwrap()
    }

    #[test]
    fn each_idle_class_has_its_own_rows_named_by_its_gap() {
        let mut cheetah = recorded();
        cheetah.workload.long_idle_sessions = 16;
        cheetah.workload.long_idle_gap_s = 100.0;
        cheetah.requests.insert(LONG_IDLE_CLASS.into(), 32);
        let mut hash = cheetah.clone();
        hash.mode = "hash".into();
        hash.requests.insert(LONG_IDLE_CLASS.into(), 16);
        hash.broken_by_class
            .entry(LONG_IDLE_CLASS.into())
            .or_default()
            .insert("reset".into(), 12);
        let text = table(&[&cheetah, &hash]);
        assert!(text.contains("|   idle, gap 40 s | 96 | 96 |"), "{text}");
        assert!(text.contains("|   idle, gap 100 s | 32 | 16 |"), "{text}");
        assert!(
            text.contains("|   of them idle, gap 100 s | 0 | 12 |"),
            "{text}"
        );
        assert!(
            text.contains(
                "| **idle sessions, gap 100 s: requests / broken** | 32 / **0** | 16 / **12** |"
            ),
            "{text}"
        );
        assert!(text.contains("16 long idle (100 s gaps)"), "{text}");
    }

    #[test]
    fn clients_without_timestamps_have_a_row_of_their_own_when_there_are_any() {
        let old = recorded();
        assert!(!table(&[&old]).contains("without timestamps"));
        let mut cheetah = recorded();
        cheetah.no_timestamps.clients = vec!["c3".into()];
        cheetah
            .no_timestamps
            .connections_opened
            .insert("total".into(), 412);
        let mut hash = cheetah.clone();
        hash.mode = "hash".into();
        hash.no_timestamps.connections_broken = 30;
        let text = table(&[&cheetah, &hash]);
        assert!(
            text.contains(
                "| **clients without timestamps: connections / broken** | 412 / **0** | 412 / **30** |"
            ),
            "{text}"
        );
    }

    #[test]
    fn runs_without_long_idle_sessions_show_no_row_for_them() {
        let old = recorded();
        let text = table(&[&old, &old]);
        assert!(
            text.contains(
                "| **idle sessions, gap 40 s: requests / broken** | 96 / **0** | 96 / **0** |"
            ),
            "{text}"
        );
        assert!(!text.contains("gap 0 s"), "{text}");
    }
}
