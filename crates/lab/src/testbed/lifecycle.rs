//! `up` and `down`: building a testbed from its plan, and removing one by its prefix.
//!
//! `up` replaces: an existing testbed with the same prefix is torn down first, so `up`
//! always yields the topology its options describe (reusing one built with other options
//! would silently keep the old server count or forwarding). If a step fails, `up` tears
//! down whatever it had built before returning the error.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use super::clocks::{self, ServerClocks};
use super::plan::{Topology, RUN_DIR};
use super::shell::require_tools;
use super::{lbconf, netns, network, nginx, plan, server_clock, veth_xdp, Options};

/// Begins `down`'s error when the LB's veths dropped frames its XDP program sent, so that
/// a test harness can tell that failure from others.
pub const XDP_DROPS_ON_VETHS: &str = "XDP frames dropped on the LB's veths";

/// Marks a state dir as the testbed's own, so that `down` may delete it and `up` may reuse it.
const MARKER: &str = ".cheetah-testbed";

/// The programs `up` runs, with the Debian packages that provide them.
const TOOLS: [(&str, &str); 6] = [
    ("ip", "iproute2"),
    ("ethtool", "ethtool"),
    ("sysctl", "procps"),
    ("nginx", "nginx-light"),
    ("ping", "iputils-ping"),
    ("curl", "curl"),
];

impl Topology {
    /// Builds the testbed `options` describe, replacing any testbed with the same prefix.
    pub fn up(options: &Options) -> anyhow::Result<Topology> {
        let mut topo = Topology::plan(options)?;
        check_host()?;
        let offsets = clocks::offsets(topo.server_clocks, options.servers, clocks::monotonic_ms());
        for (server, offset) in topo.servers.iter_mut().zip(offsets) {
            server.clock_offset = offset;
        }
        check_dir_is_usable(&topo.files.dir, &topo.prefix)?;
        // The LBs run under `ip netns exec`, where no BPF filesystem can be mounted for
        // good: their pins need one from the host (`[daemon] bpf_pin_dir`).
        cheetah_daemon::dataplane::pin::mount_default_root()?;
        teardown(&topo.prefix, false)
            .with_context(|| format!("cannot remove the earlier testbed `{}`", topo.prefix))?;
        if let Err(error) = topo.build() {
            return Err(match topo.down() {
                Ok(()) => error,
                Err(cleanup) => error.context(format!(
                    "and cleaning up after it failed too: {cleanup:#}; run `cheetah testbed down --prefix {}`",
                    topo.prefix
                )),
            });
        }
        Ok(topo)
    }

    /// The testbed `prefix` that `up` built, from its summary.
    pub fn of_prefix(prefix: &str) -> anyhow::Result<Topology> {
        plan::check_prefix(prefix)?;
        Topology::load(&summary_of(prefix)).with_context(|| format!("no testbed `{prefix}` is up"))
    }

    /// Removes this testbed: its processes, namespaces and state dir.
    pub fn down(&self) -> anyhow::Result<()> {
        teardown(&self.prefix, false)
    }

    fn build(&self) -> anyhow::Result<()> {
        prepare_dir(&self.files.dir, &self.prefix)?;
        network::build(self).context("cannot build the network")?;
        // Before nginx starts, so that every connection a server has sees one clock.
        if self.server_clocks == ServerClocks::Distinct {
            for server in &self.servers {
                server_clock::attach(
                    &server.namespace,
                    &server.link.interface,
                    server.clock_offset,
                )
                .with_context(|| format!("cannot give {} its own clock", server.name))?;
            }
        }
        lbconf::write(self)?;
        nginx::write_content(&self.files.www)?;
        for server in &self.servers {
            nginx::start(server, &self.files.www)?;
        }
        network::check_reachability(self).context("the network is built but does not work")?;
        // Last, so that a summary on disk means a complete testbed.
        let json = serde_json::to_string_pretty(self)?;
        std::fs::write(&self.files.summary, json + "\n")
            .with_context(|| format!("cannot write {}", self.files.summary.display()))?;
        Ok(())
    }
}

fn check_host() -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the testbed needs root: it creates network namespaces");
    }
    require_tools(&TOOLS)?;
    nginx::require_echo_module()
}

/// Where `up` records a testbed's state dir, so that `status` and `down` find a `--dir`.
fn pointer_file(prefix: &str) -> PathBuf {
    Path::new(RUN_DIR).join(format!("{prefix}.dir"))
}

/// The state dir of testbed `prefix`: the one its `up` recorded, else the default.
pub fn state_dir(prefix: &str) -> PathBuf {
    std::fs::read_to_string(pointer_file(prefix))
        .ok()
        .map(|text| PathBuf::from(text.trim_end_matches('\n')))
        .unwrap_or_else(|| plan::default_dir(prefix))
}

/// Where testbed `prefix`'s summary (`testbed.json`) is.
pub fn summary_of(prefix: &str) -> PathBuf {
    state_dir(prefix).join("testbed.json")
}

struct Marker {
    prefix: String,
    /// Whether `up` made the folder (then `down` removes it) or was given an empty one
    /// (then `down` only empties it).
    created_dir: bool,
}

fn read_marker(dir: &Path) -> Option<Marker> {
    let text = std::fs::read_to_string(dir.join(MARKER)).ok()?;
    let mut prefix = None;
    let mut created_dir = false;
    for line in text.lines() {
        match line.split_once('=').map(|(k, v)| (k.trim(), v.trim())) {
            Some(("prefix", value)) => prefix = Some(value.to_string()),
            Some(("created_dir", value)) => created_dir = value == "true",
            _ => {}
        }
    }
    Some(Marker {
        prefix: prefix?,
        created_dir,
    })
}

/// Refuses a `--dir` that holds someone else's files or another testbed's state.
fn check_dir_is_usable(dir: &Path, prefix: &str) -> anyhow::Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    if !dir.is_dir() {
        bail!("state dir {} exists and is not a folder", dir.display());
    }
    match read_marker(dir) {
        Some(marker) if marker.prefix == prefix => Ok(()),
        Some(marker) => bail!(
            "state dir {} belongs to testbed `{}`",
            dir.display(),
            marker.prefix
        ),
        None if is_empty_dir(dir)? => Ok(()),
        None => bail!(
            "state dir {} is not empty and not a testbed's; give an empty or new folder",
            dir.display()
        ),
    }
}

fn is_empty_dir(dir: &Path) -> anyhow::Result<bool> {
    Ok(std::fs::read_dir(dir)
        .with_context(|| format!("cannot list {}", dir.display()))?
        .next()
        .is_none())
}

fn prepare_dir(dir: &Path, prefix: &str) -> anyhow::Result<()> {
    let created_dir = match read_marker(dir) {
        Some(marker) => {
            let created = marker.created_dir;
            empty_dir(dir)?;
            created
        }
        None => !dir.exists(),
    };
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    std::fs::write(
        dir.join(MARKER),
        format!("prefix = {prefix}\ncreated_dir = {created_dir}\n"),
    )
    .with_context(|| format!("cannot write {}", dir.join(MARKER).display()))?;
    let pointer = pointer_file(prefix);
    std::fs::create_dir_all(RUN_DIR).with_context(|| format!("cannot create {RUN_DIR}"))?;
    let absolute = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
    std::fs::write(&pointer, format!("{}\n", absolute.display()))
        .with_context(|| format!("cannot write {}", pointer.display()))?;
    Ok(())
}

/// Removes the pin directory each LB state folder under `dir` records
/// (`pin::RECORD_FILE`).
fn forget_pinned_maps(dir: &Path) -> anyhow::Result<()> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        if entry.path().is_dir() {
            cheetah_daemon::dataplane::pin::forget_recorded(&entry.path())?;
        }
    }
    Ok(())
}

fn empty_dir(dir: &Path) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let path = entry?.path();
        let removed = if path.is_dir() && !path.is_symlink() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        removed.with_context(|| format!("cannot remove {}", path.display()))?;
    }
    Ok(())
}

/// Removes testbed `prefix`, whatever of it exists: processes in its namespaces (nginx, an
/// LB left running), the namespaces (which takes their veths and bridge along), and its
/// state dir unless `keep_dir`. Goes on past failures and reports them all at the end.
pub fn teardown(prefix: &str, keep_dir: bool) -> anyhow::Result<()> {
    plan::check_prefix(prefix)?;
    let mut failures = Vec::new();
    // Read before the veths go: a frame the LB's XDP program sent that a veth dropped is
    // a lost packet no other counter shows (veth_xdp.rs).
    match veth_xdp::drops(prefix) {
        Ok(drops) => {
            let (failed, congested): (Vec<_>, Vec<_>) = drops.iter().partition(|d| d.is_failure());
            for port in congested {
                eprintln!("testbed `{prefix}`: {port} (congestion at the peer's ring)");
            }
            if !failed.is_empty() {
                let ports: Vec<String> = failed.iter().map(|d| d.to_string()).collect();
                failures.push(format!(
                    "{XDP_DROPS_ON_VETHS}: {} (more than {}%: is GRO on at the peer?)",
                    ports.join(", "),
                    veth_xdp::MAX_DROP_PERCENT
                ));
            }
        }
        Err(e) => failures.push(format!("cannot read the LB's veth counters: {e:#}")),
    }
    let namespaces = netns::list(prefix)?;
    if let Err(e) = netns::kill_processes(&namespaces) {
        failures.push(format!("{e:#}"));
    }
    // The LBs' pinned maps: nothing uses them once their namespaces go.
    if let Err(e) = forget_pinned_maps(&state_dir(prefix)) {
        failures.push(format!("{e:#}"));
    }
    for namespace in &namespaces {
        if let Err(e) = netns::delete(namespace) {
            failures.push(format!("{e:#}"));
        }
    }
    let dir = state_dir(prefix);
    if !keep_dir {
        if let Some(marker) = read_marker(&dir).filter(|m| m.prefix == prefix) {
            let removed = if marker.created_dir {
                std::fs::remove_dir_all(&dir)
                    .with_context(|| format!("cannot remove {}", dir.display()))
            } else {
                empty_dir(&dir)
            };
            if let Err(e) = removed {
                failures.push(format!("{e:#}"));
            }
        }
    }
    let pointer = pointer_file(prefix);
    if pointer.exists() {
        if let Err(e) = std::fs::remove_file(&pointer) {
            failures.push(format!("cannot remove {}: {e}", pointer.display()));
        }
    }
    if !failures.is_empty() {
        bail!(
            "testbed `{prefix}` is not fully removed: {}",
            failures.join("; ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dir_with_foreign_files_or_another_testbeds_state_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let fresh = root.path().join("fresh");
        assert!(check_dir_is_usable(&fresh, "t1").is_ok());
        std::fs::create_dir(&fresh).unwrap();
        assert!(check_dir_is_usable(&fresh, "t1").is_ok());
        std::fs::write(fresh.join("notes.txt"), "mine").unwrap();
        assert!(check_dir_is_usable(&fresh, "t1").is_err());

        let own = root.path().join("own");
        std::fs::create_dir(&own).unwrap();
        std::fs::write(own.join(MARKER), "prefix = t1\ncreated_dir = true\n").unwrap();
        std::fs::write(own.join("cheetah.toml"), "").unwrap();
        assert!(check_dir_is_usable(&own, "t1").is_ok());
        assert!(check_dir_is_usable(&own, "t2").is_err());
        let marker = read_marker(&own).unwrap();
        assert_eq!(marker.prefix, "t1");
        assert!(marker.created_dir);
    }
}
