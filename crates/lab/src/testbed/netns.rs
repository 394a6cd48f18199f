//! Network namespaces and the processes in them.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;

use super::plan::role_of;
use super::shell::Cmd;

/// `ip -n <namespace> ...`: an `ip` command acting inside the namespace.
pub fn ip(namespace: &str) -> Cmd {
    Cmd::new("ip").args(["-n", namespace])
}

pub fn add(namespace: &str) -> anyhow::Result<()> {
    Cmd::new("ip").args(["netns", "add", namespace]).run()?;
    ip(namespace).args(["link", "set", "lo", "up"]).run()?;
    Ok(())
}

pub fn delete(namespace: &str) -> anyhow::Result<()> {
    Cmd::new("ip").args(["netns", "delete", namespace]).run()?;
    Ok(())
}

/// The existing namespaces that belong to the testbed `prefix`.
pub fn list(prefix: &str) -> anyhow::Result<Vec<String>> {
    let out = Cmd::new("ip").args(["netns", "list"]).run()?;
    // Lines look like `ch-lb (id: 3)` or just `ch-lb`.
    let mut names: Vec<String> = out
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| role_of(prefix, name).is_some())
        .map(str::to_string)
        .collect();
    names.sort();
    Ok(names)
}

/// Sets sysctls inside the namespace in one `sysctl` run.
pub fn sysctl(namespace: &str, settings: &[(&str, &str)]) -> anyhow::Result<()> {
    if settings.is_empty() {
        return Ok(());
    }
    let assignments = settings.iter().map(|(key, value)| format!("{key}={value}"));
    Cmd::in_netns(namespace, "sysctl")
        .args(["-q", "-w"])
        .args(assignments)
        .run()?;
    Ok(())
}

/// Pids of the processes whose network namespace is `namespace`.
pub fn pids(namespace: &str) -> anyhow::Result<Vec<i32>> {
    let out = Cmd::new("ip").args(["netns", "pids", namespace]).run()?;
    out.split_whitespace()
        .map(|word| {
            word.parse()
                .with_context(|| format!("`ip netns pids {namespace}` printed `{word}`"))
        })
        .collect()
}

/// The command name of a process (`nginx`, `cheetah`), if it still exists.
pub fn process_name(pid: i32) -> Option<String> {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    Some(comm.trim().to_string())
}

/// Ends every process in the namespaces: SIGTERM, then SIGKILL for what is left after a
/// grace period. Deleting a namespace does not end its processes (they keep it alive,
/// unnamed, with its interfaces), so this comes before [`delete`].
pub fn kill_processes(namespaces: &[String]) -> anyhow::Result<()> {
    let me = std::process::id() as i32;
    let mut pids = Vec::new();
    for namespace in namespaces {
        pids.extend(pids_of(namespace)?.into_iter().filter(|&pid| pid != me));
    }
    if pids.is_empty() {
        return Ok(());
    }
    signal_all(&pids, libc::SIGTERM);
    if wait_gone(&pids, Duration::from_secs(3)) {
        return Ok(());
    }
    signal_all(&pids, libc::SIGKILL);
    if wait_gone(&pids, Duration::from_secs(2)) {
        return Ok(());
    }
    let left: Vec<String> = pids
        .iter()
        .filter(|&&pid| alive(pid))
        .map(|pid| pid.to_string())
        .collect();
    anyhow::bail!("processes still alive after SIGKILL: {}", left.join(" "))
}

/// Like [`pids`], but a namespace deleted meanwhile has no processes rather than an error.
fn pids_of(namespace: &str) -> anyhow::Result<Vec<i32>> {
    if !Path::new("/run/netns").join(namespace).exists() {
        return Ok(Vec::new());
    }
    pids(namespace)
}

fn signal_all(pids: &[i32], signal: libc::c_int) {
    for &pid in pids {
        // SAFETY: kill(2) only takes plain integers; a pid that is gone gives ESRCH.
        unsafe {
            libc::kill(pid, signal);
        }
    }
}

fn wait_gone(pids: &[i32], within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if !pids.iter().any(|&pid| alive(pid)) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A zombie counts as gone: it holds no sockets and no namespace, only a pid until its
/// parent reaps it.
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // The state follows the parenthesised command name, which may contain spaces.
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next());
            state != Some("Z")
        }
        Err(_) => false,
    }
}
