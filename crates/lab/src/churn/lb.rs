//! The LB under test: `cheetah run` in the testbed's LB namespace, its restarts, and
//! `cheetah ctl` calls to its API.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::Value;

use cheetah_daemon::api::StatusView;

/// How long a start may take before the data path runs (XDP attach, socket setup).
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a SIGTERM'd LB gets to save its state and exit before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Spawns `program args` inside `namespace`, output to `log`, in its own process group so
/// that a Ctrl-C at the terminal reaches only the runner, which then stops everything in
/// order.
pub fn spawn_in_netns(
    namespace: &str,
    program: &Path,
    args: &[String],
    log: &Path,
) -> anyhow::Result<Child> {
    let out =
        std::fs::File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
    Command::new("ip")
        .args(["netns", "exec", namespace])
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .process_group(0)
        .spawn()
        .with_context(|| format!("cannot start {} in {namespace}", program.display()))
}

pub struct Lb {
    namespace: String,
    exe: PathBuf,
    config: PathBuf,
    /// `--state-dir`, for an instance that does not use the config's.
    state_dir: Option<PathBuf>,
    /// Names its logs: `lb` (`lb-1.log`, ...), `lb2`, ...
    name: String,
    api: String,
    log_dir: PathBuf,
    child: Option<Child>,
    starts: u32,
    /// When the running process's data path came up.
    pub up_since: Instant,
}

impl Lb {
    pub fn new(namespace: &str, exe: &Path, config: &Path, api: &str, log_dir: &Path) -> Self {
        Lb {
            namespace: namespace.to_string(),
            exe: exe.to_path_buf(),
            config: config.to_path_buf(),
            state_dir: None,
            name: "lb".into(),
            api: api.to_string(),
            log_dir: log_dir.to_path_buf(),
            child: None,
            starts: 0,
            up_since: Instant::now(),
        }
    }

    /// Another instance on the same config: its logs are `<name>-<n>.log` and its state
    /// folder `state_dir`.
    pub fn instance(mut self, name: &str, state_dir: &Path) -> Self {
        self.name = name.to_string();
        self.state_dir = Some(state_dir.to_path_buf());
        self
    }

    fn log(&self) -> PathBuf {
        self.log_dir
            .join(format!("{}-{}.log", self.name, self.starts))
    }

    /// Starts `cheetah run` and waits until its data path runs, not only its API: the load
    /// starts right after, and a SYN in between would be answered "network unreachable"
    /// (`StatusView::data_path_up`).
    pub fn start(&mut self) -> anyhow::Result<()> {
        self.starts += 1;
        let log = self.log();
        let mut args = vec![
            "run".to_string(),
            "--config".to_string(),
            self.config.to_string_lossy().into_owned(),
        ];
        if let Some(state_dir) = &self.state_dir {
            args.push("--state-dir".into());
            args.push(state_dir.to_string_lossy().into_owned());
        }
        self.child = Some(spawn_in_netns(&self.namespace, &self.exe, &args, &log)?);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            // Until the API answers, `ctl` fails: keep waiting. An answer that is not a
            // status is a bug to report, not a reason to wait out the timeout.
            if let Ok(json) = self.ctl(&["status"]) {
                let status: StatusView =
                    serde_json::from_value(json).context("`cheetah ctl status` answered")?;
                if status.data_path_up() {
                    self.up_since = Instant::now();
                    return Ok(());
                }
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                bail!("cheetah run exited with {status} at start:\n{}", tail(&log));
            }
            if Instant::now() > deadline {
                bail!(
                    "cheetah run's data path did not come up within {START_TIMEOUT:?}:\n{}",
                    tail(&log)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGTERM: the LB saves its state and exits; then starts it again.
    pub fn graceful_restart(&mut self, down_for: Duration) -> anyhow::Result<()> {
        self.graceful_stop()?;
        std::thread::sleep(down_for);
        self.start()
    }

    /// SIGTERM, and a check that the LB saved its state and exited cleanly.
    pub fn graceful_stop(&mut self) -> anyhow::Result<()> {
        if let Some(mut child) = self.child.take() {
            // SAFETY: signalling our own child (`ip netns exec` execs the LB: same pid).
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + STOP_TIMEOUT;
            loop {
                if let Some(status) = child.try_wait()? {
                    if !status.success() {
                        bail!(
                            "cheetah run exited with {status} on SIGTERM:\n{}",
                            tail(&self.log())
                        );
                    }
                    break;
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    bail!("cheetah run did not stop within {STOP_TIMEOUT:?} of SIGTERM");
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// SIGKILL: nothing is saved on the way down; then starts it again.
    pub fn kill_restart(&mut self, down_for: Duration) -> anyhow::Result<()> {
        self.kill();
        std::thread::sleep(down_for);
        self.start()
    }

    /// SIGKILL, as a crash.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Its control API's address.
    pub fn api(&self) -> &str {
        &self.api
    }

    /// The network namespace it runs in.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The running LB's pid (`ip netns exec` execs the LB, so it is the child's).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Fails if the LB exited by itself.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        if let Some(child) = self.child.as_mut() {
            if let Some(status) = child.try_wait()? {
                self.child = None;
                bail!(
                    "cheetah run exited by itself with {status}:\n{}",
                    tail(&self.log())
                );
            }
        }
        Ok(())
    }

    /// SIGTERM and wait, at the end of the run.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: as in graceful_restart.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + STOP_TIMEOUT;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// `cheetah ctl --api <api> --json ARGS` in the LB namespace; the parsed JSON answer.
    pub fn ctl(&self, args: &[&str]) -> anyhow::Result<Value> {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.namespace])
            .arg(&self.exe)
            .args(["ctl", "--api", &self.api, "--json"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .context("cannot run cheetah ctl")?;
        if !out.status.success() {
            bail!(
                "`cheetah ctl {}` failed ({}): {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let text = String::from_utf8_lossy(&out.stdout);
        Ok(serde_json::from_str(&text).unwrap_or(Value::String(text.into_owned())))
    }

    /// The Prometheus text of `/metrics`.
    pub fn metrics(&self) -> anyhow::Result<String> {
        let url = format!("http://{}/metrics", self.api);
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.namespace,
                "curl",
                "-sf",
                "-m",
                "5",
                &url,
            ])
            .stdin(Stdio::null())
            .output()
            .context("cannot run curl")?;
        if !out.status.success() {
            bail!("curl {url} failed ({})", out.status);
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl Drop for Lb {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The last lines of a log, for error messages.
pub fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}
