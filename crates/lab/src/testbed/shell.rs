//! Running the system tools (`ip`, `ethtool`, `sysctl`, `nginx`, `ping`, `curl`).
//!
//! Every failure names the whole command line and what the tool printed, because the tools'
//! own messages ("RTNETLINK answers: File exists") say nothing about which step failed.

use std::ffi::OsStr;
use std::process::{Command, Output, Stdio};

use anyhow::{bail, Context};

/// A command line kept as text, so that errors can quote it.
pub struct Cmd {
    words: Vec<String>,
}

impl Cmd {
    pub fn new(program: &str) -> Self {
        Cmd {
            words: vec![program.to_string()],
        }
    }

    /// The same command run inside network namespace `namespace`.
    pub fn in_netns(namespace: &str, program: &str) -> Self {
        Cmd::new("ip").args(["netns", "exec", namespace, program])
    }

    pub fn arg(mut self, word: impl AsRef<OsStr>) -> Self {
        self.words
            .push(word.as_ref().to_string_lossy().into_owned());
        self
    }

    pub fn args<I, S>(mut self, words: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        for word in words {
            self = self.arg(word);
        }
        self
    }

    pub fn line(&self) -> String {
        self.words.join(" ")
    }

    fn output(&self) -> anyhow::Result<Output> {
        Command::new(&self.words[0])
            .args(&self.words[1..])
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("cannot start `{}`", self.line()))
    }

    /// Runs to completion; fails unless the exit status is 0. Returns stdout.
    pub fn run(&self) -> anyhow::Result<String> {
        let out = self.output()?;
        if !out.status.success() {
            bail!(
                "`{}` failed ({}): {}",
                self.line(),
                out.status,
                describe_output(&out)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// What a failed tool said: stderr, else stdout (ping reports on stdout), else nothing.
fn describe_output(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let text = if stderr.trim().is_empty() {
        stdout.trim()
    } else {
        stderr.trim()
    };
    if text.is_empty() {
        "no output".to_string()
    } else {
        text.to_string()
    }
}

/// Fails unless every program is on PATH, naming the Debian packages that provide them.
pub fn require_tools(tools: &[(&str, &str)]) -> anyhow::Result<()> {
    let missing: Vec<String> = tools
        .iter()
        .filter(|(program, _)| !on_path(program))
        .map(|(program, package)| format!("{program} (Debian package {package})"))
        .collect();
    if !missing.is_empty() {
        bail!(
            "the testbed needs {}; scripts/setup.sh installs them",
            missing.join(", ")
        );
    }
    Ok(())
}

fn on_path(program: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).any(|dir| dir.join(program).is_file())
}
