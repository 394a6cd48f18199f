//! The one host setting `cheetah run` changes, IPv4 forwarding on `lo`, and what it reports
//! about the host's own forwarding on the LB's interfaces.
//!
//! The XDP program asks the kernel's FIB for the next hop of each server reply with
//! `bpf_fib_lookup`, which answers only if forwarding is on for the interface the lookup
//! names (`BPF_FIB_LKUP_RET_FWD_DISABLED` otherwise). The kernel forwards a packet it
//! receives if forwarding is on for the interface it arrived on. So the program names
//! `lo` (ifindex 1 in every namespace) and `run` turns forwarding on for `lo` only: only
//! this host's own packets arrive on `lo`, and the LB's interfaces keep whatever the
//! operator set, off on a host that is not a router. With forwarding on for an LB
//! interface, the host routes whatever arrives there for addresses that are not its own:
//! a client with a route through the LB host reaches every port of every server's own
//! address, bypassing the VIPs. `run` says so at start and leaves it as it is.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

/// lo's ifindex in every network namespace; the XDP program's FIB lookups name it.
pub const LOOPBACK_IFINDEX: u32 = 1;

/// The IPv4 sysctls of this network namespace (`/proc/sys/net/ipv4`), or of a copy of
/// that tree in tests.
#[derive(Clone, Debug)]
pub struct Ipv4Sysctls {
    root: PathBuf,
}

impl Ipv4Sysctls {
    pub fn system() -> Self {
        Self::at("/proc/sys/net/ipv4")
    }

    pub fn at(root: impl AsRef<Path>) -> Self {
        Ipv4Sysctls {
            root: root.as_ref().to_path_buf(),
        }
    }

    fn forwarding_path(&self, interface: &str) -> PathBuf {
        self.root.join("conf").join(interface).join("forwarding")
    }

    /// `net.ipv4.conf.<interface>.forwarding`.
    pub fn forwarding(&self, interface: &str) -> anyhow::Result<bool> {
        let path = self.forwarding_path(interface);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        match text.trim() {
            "0" => Ok(false),
            "1" => Ok(true),
            other => bail!("{}: unexpected value {other:?}", path.display()),
        }
    }

    fn set_forwarding(&self, interface: &str, on: bool) -> anyhow::Result<()> {
        let path = self.forwarding_path(interface);
        std::fs::write(&path, if on { "1" } else { "0" })
            .with_context(|| format!("cannot write {}", path.display()))
    }
}

/// Forwarding on `lo` for as long as the LB runs: turned on if it was off, and back off
/// when this is dropped (a stop, or a start that failed after it). A `kill -9` leaves it
/// on, which routes nothing: only this host's own packets arrive on `lo`.
#[derive(Debug)]
pub struct LoopbackForwarding {
    sysctls: Ipv4Sysctls,
    turned_on: bool,
}

impl LoopbackForwarding {
    pub fn enable(sysctls: &Ipv4Sysctls) -> anyhow::Result<Self> {
        let turned_on = !sysctls.forwarding("lo")?;
        if turned_on {
            sysctls.set_forwarding("lo", true).context(
                "cannot enable IPv4 forwarding on lo, which the XDP program's FIB lookups need",
            )?;
            tracing::info!(
                "enabled IPv4 forwarding on lo only (until the LB stops): the XDP program looks up \
                 server replies' next hops as if they came in on lo, and only this host's own \
                 packets arrive there, so the host routes nothing more than before"
            );
        }
        Ok(LoopbackForwarding {
            sysctls: sysctls.clone(),
            turned_on,
        })
    }
}

impl Drop for LoopbackForwarding {
    fn drop(&mut self) {
        if !self.turned_on {
            return;
        }
        match self.sysctls.set_forwarding("lo", false) {
            Ok(()) => tracing::info!(
                "IPv4 forwarding on lo is off again, as it was before the LB started"
            ),
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "cannot turn IPv4 forwarding on lo off again")
            }
        }
    }
}

/// What the host's forwarding on the LB's interfaces means, as `run` logs it at start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ForwardingReport {
    /// No LB interface forwards: clients reach the servers only through the VIPs.
    Off,
    /// These interfaces forward (the operator's choice, left as it is).
    On(Vec<String>),
}

impl ForwardingReport {
    pub fn read(sysctls: &Ipv4Sysctls, interfaces: &[String]) -> anyhow::Result<Self> {
        let mut on = Vec::new();
        for interface in interfaces {
            if sysctls.forwarding(interface)? {
                on.push(interface.clone());
            }
        }
        Ok(if on.is_empty() {
            ForwardingReport::Off
        } else {
            ForwardingReport::On(on)
        })
    }

    pub fn message(&self) -> String {
        match self {
            ForwardingReport::Off => "the host forwards on none of the LB's interfaces: clients \
                                      reach the servers through the VIPs only"
                .to_string(),
            ForwardingReport::On(interfaces) => format!(
                "IPv4 forwarding is on for {}: the host routes whatever arrives there for \
                 addresses that are not its own, so a client with a route through this host \
                 reaches every port of the servers' own addresses, not only the VIPs. cheetah \
                 does not need it and leaves it as it is; unless this host must route, turn it \
                 off (sysctl -w net.ipv4.conf.<interface>.forwarding=0)",
                interfaces.join(", ")
            ),
        }
    }

    pub fn log(&self) {
        match self {
            ForwardingReport::Off => tracing::info!("{}", self.message()),
            ForwardingReport::On(_) => tracing::warn!("{}", self.message()),
        }
    }
}

/// The XDP program names `lo` by its ifindex, the same in every namespace; a kernel where
/// it is not would have its lookups refused (or, worse, made as if from another device).
pub fn check_loopback_ifindex() -> anyhow::Result<()> {
    // SAFETY: a valid NUL-terminated string.
    let ifindex = unsafe { libc::if_nametoindex(c"lo".as_ptr()) };
    if ifindex != LOOPBACK_IFINDEX {
        bail!(
            "lo has ifindex {ifindex} in this network namespace, not {LOOPBACK_IFINDEX}: the XDP \
             program's next-hop lookups name lo by that index"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sysctl tree with `forwarding` for each (interface, value).
    fn tree(values: &[(&str, &str)]) -> (tempfile::TempDir, Ipv4Sysctls) {
        let dir = tempfile::tempdir().unwrap();
        for (interface, value) in values {
            let conf = dir.path().join("conf").join(interface);
            std::fs::create_dir_all(&conf).unwrap();
            std::fs::write(conf.join("forwarding"), format!("{value}\n")).unwrap();
        }
        let sysctls = Ipv4Sysctls::at(dir.path());
        (dir, sysctls)
    }

    fn read(dir: &tempfile::TempDir, interface: &str) -> String {
        let path = dir.path().join("conf").join(interface).join("forwarding");
        std::fs::read_to_string(path).unwrap().trim().to_string()
    }

    const HOST: [(&str, &str); 5] = [
        ("all", "0"),
        ("default", "0"),
        ("lo", "0"),
        ("eth1", "0"),
        ("eth2", "0"),
    ];

    #[test]
    fn lo_forwards_while_the_lb_runs_and_nothing_else_is_touched() {
        let (dir, sysctls) = tree(&HOST);
        let lo = LoopbackForwarding::enable(&sysctls).unwrap();
        assert_eq!(read(&dir, "lo"), "1");
        for interface in ["all", "default", "eth1", "eth2"] {
            assert_eq!(read(&dir, interface), "0", "{interface}");
        }
        drop(lo);
        for (interface, value) in HOST {
            assert_eq!(read(&dir, interface), value, "{interface} after the stop");
        }
    }

    #[test]
    fn forwarding_on_lo_before_the_start_stays_on() {
        let (dir, sysctls) = tree(&[("lo", "1"), ("eth1", "0")]);
        drop(LoopbackForwarding::enable(&sysctls).unwrap());
        assert_eq!(read(&dir, "lo"), "1");
        assert_eq!(read(&dir, "eth1"), "0");
    }

    #[test]
    fn an_unreadable_lo_setting_stops_the_start() {
        let (_dir, sysctls) = tree(&[("eth1", "0")]);
        let err = LoopbackForwarding::enable(&sysctls).unwrap_err();
        assert!(format!("{err:#}").contains("conf/lo/forwarding"), "{err:#}");
    }

    #[test]
    fn the_report_names_the_interfaces_that_forward_and_changes_none() {
        let (dir, sysctls) = tree(&[("lo", "0"), ("eth1", "1"), ("eth2", "0"), ("eth3", "1")]);
        let names = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();

        let report = ForwardingReport::read(&sysctls, &names(&["eth2"])).unwrap();
        assert_eq!(report, ForwardingReport::Off);
        assert!(report
            .message()
            .contains("forwards on none of the LB's interfaces"));

        let report = ForwardingReport::read(&sysctls, &names(&["eth1", "eth2", "eth3"])).unwrap();
        assert_eq!(report, ForwardingReport::On(names(&["eth1", "eth3"])));
        let message = report.message();
        assert!(
            message.contains("IPv4 forwarding is on for eth1, eth3"),
            "{message}"
        );
        assert!(
            message.contains("every port of the servers' own addresses"),
            "{message}"
        );
        assert_eq!(read(&dir, "eth1"), "1");
        assert_eq!(read(&dir, "eth3"), "1");

        assert!(ForwardingReport::read(&sysctls, &names(&["eth9"])).is_err());
    }

    #[test]
    fn lo_is_ifindex_1_here() {
        check_loopback_ifindex().unwrap();
    }
}
