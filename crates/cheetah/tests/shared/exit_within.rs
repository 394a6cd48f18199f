//! A program that must exit by itself, soon: a `cheetah run` that should refuse its config.
//!
//! Shared by test binaries, included by path (`#[path]`), like `programs.rs`.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `command`, which must exit within `timeout` (else it is killed and the test
/// fails: a `cheetah run` that should have refused its config would be running on). Its
/// exit code and stderr.
pub fn exit_within(mut command: Command, timeout: Duration) -> (Option<i32>, String) {
    let what = format!("{command:?}");
    let mut child = command
        .env("RUST_BACKTRACE", "0")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    let deadline = Instant::now() + timeout;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} kept running");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
