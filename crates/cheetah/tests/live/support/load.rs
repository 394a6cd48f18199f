//! `cheetah loadgen` in a client namespace, in the background, and its report.

use std::process::Child;

use serde_json::Value;

use super::{cheetah_bin, spawn_in_netns, Testbed};

/// A loadgen run; `finish` waits for its end and reads the JSON report.
pub struct Loadgen {
    name: String,
    dir: std::path::PathBuf,
    child: Option<Child>,
    /// Set for a run that lasts until `finish` says stop.
    stop_file: Option<std::path::PathBuf>,
}

impl Loadgen {
    /// Starts `cheetah loadgen --target VIP --report <dir>/<name>.json ARGS` in client
    /// `client` (`c1`, ...); its output goes to `<dir>/<name>.log`.
    pub fn start(testbed: &Testbed, client: &str, name: &str, args: &[&str]) -> Self {
        let report = testbed.dir.join(format!("{name}.json"));
        let target = testbed.vip();
        let report_arg = report.to_string_lossy().into_owned();
        let mut all = vec!["loadgen", "--target", &target, "--report", &report_arg];
        all.extend_from_slice(args);
        let child = spawn_in_netns(
            &testbed.ns(client),
            cheetah_bin(),
            &all,
            &testbed.dir.join(format!("{name}.log")),
        );
        Loadgen {
            name: name.to_string(),
            dir: testbed.dir.clone(),
            child: Some(child),
            stop_file: None,
        }
    }

    /// Like `start`, but the load runs until `finish`, however long the test's steps take
    /// on a busy machine (ARGS must not set `--duration`).
    pub fn start_until_finished(
        testbed: &Testbed,
        client: &str,
        name: &str,
        args: &[&str],
    ) -> Self {
        let stop_file = testbed.dir.join(format!("{name}.stop"));
        let _ = std::fs::remove_file(&stop_file);
        let stop_arg = stop_file.to_string_lossy().into_owned();
        let mut all = vec!["--duration", "0", "--stop-file", &stop_arg];
        all.extend_from_slice(args);
        let mut load = Loadgen::start(testbed, client, name, &all);
        load.stop_file = Some(stop_file);
        load
    }

    /// Like `finish` for a run with a duration, but a loadgen still running at `deadline`
    /// is killed and the test fails: a long test must end by itself.
    pub fn finish_by(mut self, deadline: std::time::Instant) -> Value {
        let child = self.child.as_mut().unwrap();
        while child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "loadgen {} was still running at its deadline:\n{}",
                    self.name,
                    self.log()
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        self.finish()
    }

    /// What loadgen printed so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join(format!("{}.log", self.name))).unwrap_or_default()
    }

    /// Stops a run started with `start_until_finished`, or waits for the end of one with a
    /// duration; its report. Fails if loadgen itself failed.
    pub fn finish(mut self) -> Value {
        if let Some(stop_file) = &self.stop_file {
            std::fs::write(stop_file, b"stop\n").unwrap();
        }
        let status = self.child.take().unwrap().wait().unwrap();
        let log = self.log();
        assert!(status.success(), "loadgen {} failed:\n{log}", self.name);
        let text = std::fs::read_to_string(self.dir.join(format!("{}.json", self.name))).unwrap();
        eprintln!("loadgen {}:\n{log}", self.name);
        serde_json::from_str(&text).unwrap()
    }
}

impl Drop for Loadgen {
    /// A test that fails midway must not leave a loadgen running into the next test.
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub fn assert_nothing_broken(report: &Value, what: &str) {
    assert_eq!(
        report["connections_broken"].as_u64(),
        Some(0),
        "{what}: broken connections: {}",
        serde_json::to_string_pretty(&report["broken"]).unwrap()
    );
}

/// A count in a loadgen or churn report, 0 where the report has none.
pub fn count(value: &Value) -> u64 {
    value.as_u64().unwrap_or(0)
}
