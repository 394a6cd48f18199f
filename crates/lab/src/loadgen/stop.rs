//! When the run ends: after `--duration`, or as soon as `--stop-file` exists.

use std::path::Path;
use std::time::Duration;

use tokio::time::Instant;

/// How often the stop file is looked for.
const POLL: Duration = Duration::from_millis(100);

/// Returns at `start + duration` (never, for `None`) or when `stop_file` appears.
pub async fn wait(start: Instant, duration: Option<Duration>, stop_file: Option<&Path>) {
    let deadline = duration.map(|d| start + d);
    loop {
        if stop_file.is_some_and(Path::exists) {
            return;
        }
        let mut wake = Instant::now() + POLL;
        if let Some(deadline) = deadline {
            if Instant::now() >= deadline {
                return;
            }
            wake = wake.min(deadline);
        }
        tokio::time::sleep_until(wake).await;
    }
}
