//! `--progress`: one line a second on stderr while the load runs.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{interval_at, Instant, MissedTickBehavior};

use super::stats::Recorder;

/// Prints elapsed time, requests per second, live long-lived connections and the broken
/// connections so far by kind, every second until `stop`.
pub async fn run(rec: Arc<Recorder>, mut stop: watch::Receiver<bool>) {
    let mut ticks = interval_at(rec.start + Duration::from_secs(1), Duration::from_secs(1));
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut last = (rec.start, 0u64);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stop.wait_for(|&stopped| stopped) => return,
        }
        let now = Instant::now();
        let (requests, broken) = {
            let stats = rec.stats();
            (stats.requests(), stats.broken_by_kind())
        };
        let live = rec.live_count();
        let rate = (requests - last.1) as f64 / (now - last.0).as_secs_f64().max(1e-3);
        last = (now, requests);
        let total: u64 = broken.values().sum();
        let kinds: Vec<String> = broken.iter().map(|(k, n)| format!("{k}={n}")).collect();
        let kinds = if kinds.is_empty() {
            String::new()
        } else {
            format!(" ({})", kinds.join(" "))
        };
        eprintln!(
            "loadgen {:6.1}s  {rate:8.1} req/s  live {live:5}  broken {total}{kinds}",
            (now - rec.start).as_secs_f64()
        );
    }
}
