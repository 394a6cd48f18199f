//! Instructions per packet, counted by callgrind (this VM exposes no hardware counters).
//!
//! For each row the benchmark re-executes itself under
//! `valgrind --tool=callgrind --toggle-collect=<measured fn>` in `--instructions-only` mode:
//! the child builds the same trace and warms the same worker with collection off, then
//! calls the row's `#[inline(never)] measured_*` function once per packet for exactly one
//! pass over the path. Only instructions inside that function are counted, so the total
//! `Ir` divided by the packets is the per-packet instruction count, restore excluded.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use anyhow::{bail, Context};

use super::items::{Item, Path};

/// The function whose calls are counted for `path`.
fn toggle(path: Path) -> &'static str {
    match path {
        Path::Element => "*measured_element*",
        Path::Siphash => "*measured_siphash*",
        Path::Toeplitz => "*measured_toeplitz*",
        _ => "*measured_packet*",
    }
}

/// Whether valgrind can be run.
pub fn available() -> bool {
    Command::new("valgrind")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// One child run to make: the row, how many packets, and the trace-shaping arguments.
pub struct Job {
    pub item: Item,
    pub packets: u64,
}

/// Runs every job (at most `parallel` at once) and returns instructions per packet.
pub fn run_all(jobs: &[Job], trace_args: &[String], parallel: usize) -> Vec<anyhow::Result<f64>> {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<anyhow::Result<f64>>>> =
        Mutex::new((0..jobs.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..parallel.max(1) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(job) = jobs.get(i) else { break };
                let result = run_one(job, trace_args, i);
                eprintln!(
                    "callgrind {:<32} {}",
                    job.item.label(),
                    match &result {
                        Ok(ir) => format!("{ir:.1} Ir/packet"),
                        Err(e) => format!("failed: {e:#}"),
                    }
                );
                results.lock().unwrap()[i] = Some(result);
            });
        }
    });
    results
        .into_inner()
        .unwrap()
        .into_iter()
        .map(|r| r.expect("every job ran"))
        .collect()
}

fn run_one(job: &Job, trace_args: &[String], index: usize) -> anyhow::Result<f64> {
    let exe = std::env::current_exe().context("cannot find the running executable")?;
    let out = out_file(index);
    let mut cmd = Command::new("valgrind");
    cmd.arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(format!("--toggle-collect={}", toggle(job.item.path)))
        .arg(exe)
        .arg("bench")
        .arg("--instructions-only")
        .args(["--path", job.item.path.name()])
        .args(["--mode", job.item.mode.name()])
        .args(["--iterations", &job.packets.to_string()])
        .args(trace_args);
    if let Some(policy) = job.item.policy {
        cmd.args(["--policy", policy.name()]);
    }
    let output = cmd.output().context("cannot run valgrind")?;
    let text = std::fs::read_to_string(&out);
    let _ = std::fs::remove_file(&out);
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(8).collect();
        bail!(
            "valgrind exited with {}: {}",
            output.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        );
    }
    let total = total_ir(&text.context("callgrind wrote no output file")?)?;
    Ok(total as f64 / job.packets as f64)
}

fn out_file(index: usize) -> PathBuf {
    std::env::temp_dir().join(format!(
        "cheetah-bench-{}-{index}.callgrind",
        std::process::id()
    ))
}

/// The event total of a callgrind output file: its `totals:` line, else `summary:`.
pub fn total_ir(text: &str) -> anyhow::Result<u64> {
    let value = |prefix: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse::<u64>().ok())
    };
    value("totals:")
        .or_else(|| value("summary:"))
        .context("no totals: or summary: line in the callgrind output")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_totals_line() {
        let out =
            "version: 1\ncreator: callgrind\nevents: Ir\nfn=foo\n3 7\nsummary: 120\ntotals: 120\n";
        assert_eq!(total_ir(out).unwrap(), 120);
        assert_eq!(total_ir("summary: 42\n").unwrap(), 42);
        assert!(total_ir("events: Ir\n").is_err());
    }
}
