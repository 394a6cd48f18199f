//! The live bench's network: two namespaces of its own joined by one veth, the LB's end
//! (`<prefix>lb`) and the sender's (`<prefix>gen`), deleted again by [`Net`]'s drop on
//! every way out (an error, a panic unwinding, or Ctrl-C, which the bench turns into an
//! early return).
//!
//! Where the XDP program runs: a veth has no IRQ, and its receive NAPI is scheduled on the
//! CPU that transmits into it. Two ways to make that the LB's CPU (`--xdp-live-steer`):
//! threaded NAPI (`/sys/class/net/<dev>/threaded`) moves the LB end's NAPI into a kernel
//! thread, `napi/<dev>-<id>`, which the bench pins to the LB's CPU; or the sender hands its
//! frames to a cpumap's kernel thread on the LB's CPU (`cpumap/<cpu>/map:<id>`), which
//! transmits them there. Either way the bench checks where the program ran from its
//! per-CPU counters.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};

use anyhow::{bail, ensure, Context};

use crate::testbed::netns;
use crate::testbed::shell::Cmd;

pub(super) struct Net {
    pub(super) lb_namespace: String,
    pub(super) gen_namespace: String,
    pub(super) lb_interface: String,
    pub(super) gen_interface: String,
}

/// The LB end's MAC (the core's testkit frames are addressed to it) and the sender's.
pub(super) const LB_MAC: &str = "02:00:00:00:00:fe";
const GEN_MAC: &str = "02:00:00:00:00:c1";

impl Net {
    /// Makes the namespaces and the veth (one queue each way, so one NAPI), after taking
    /// away what a killed earlier run of the same prefix left.
    pub(super) fn up(prefix: &str) -> anyhow::Result<Net> {
        let net = Net {
            lb_namespace: format!("{prefix}-xl-lb"),
            gen_namespace: format!("{prefix}-xl-gen"),
            lb_interface: format!("{prefix}lb"),
            gen_interface: format!("{prefix}gen"),
        };
        // `napi/<dev>-<id>` must fit a thread name (15 bytes) with a 5-digit id.
        ensure!(
            net.lb_interface.len() <= 5,
            "the prefix {prefix:?} is too long for the live bench (at most 3 characters)"
        );
        net.remove();
        for namespace in [&net.lb_namespace, &net.gen_namespace] {
            netns::add(namespace)?;
        }
        Cmd::new("ip")
            .args(["link", "add", &net.lb_interface, "netns", &net.lb_namespace])
            .args(["address", LB_MAC, "numtxqueues", "1", "numrxqueues", "1"])
            .args(["type", "veth", "peer", "name", &net.gen_interface])
            .args(["netns", &net.gen_namespace, "address", GEN_MAC])
            .args(["numtxqueues", "1", "numrxqueues", "1"])
            .run()?;
        for (namespace, interface) in net.ends() {
            netns::ip(namespace)
                .args(["link", "set", interface, "up"])
                .run()?;
        }
        // The servers' subnet is behind the LB's end: the publisher resolves their egress
        // from the routes, as `cheetah run` does.
        netns::ip(&net.lb_namespace)
            .args(["addr", "add", "10.1.255.254/16", "dev", &net.lb_interface])
            .run()?;
        Ok(net)
    }

    /// Turns threaded NAPI on at the LB's end. A veth has a NAPI only while an XDP program
    /// (or GRO) is on, so this comes after the first attach; replacing the program keeps it.
    pub(super) fn thread_lb_napi(&self) -> anyhow::Result<()> {
        Cmd::in_netns(&self.lb_namespace, "sh")
            .arg("-c")
            .arg(format!(
                "echo 1 > /sys/class/net/{}/threaded",
                self.lb_interface
            ))
            .run()?;
        Ok(())
    }

    fn ends(&self) -> [(&str, &str); 2] {
        [
            (&self.lb_namespace, &self.lb_interface),
            (&self.gen_namespace, &self.gen_interface),
        ]
    }

    fn remove(&self) {
        for namespace in [&self.lb_namespace, &self.gen_namespace] {
            if std::path::Path::new("/run/netns").join(namespace).exists() {
                let _ = netns::delete(namespace);
            }
        }
    }

    /// The `ethtool -S` counters of the LB's end (`lb`) or the sender's.
    pub(super) fn counters(&self, lb: bool) -> anyhow::Result<BTreeMap<String, u64>> {
        let (namespace, interface) = self.ends()[usize::from(!lb)];
        let text = Cmd::in_netns(namespace, "ethtool")
            .args(["-S", interface])
            .run()?;
        Ok(text
            .lines()
            .filter_map(|line| {
                let (name, value) = line.trim().split_once(':')?;
                Some((name.to_string(), value.trim().parse().ok()?))
            })
            .collect())
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        self.remove();
    }
}

/// An open handle on a named network namespace, to move threads into.
pub(super) struct Namespace(OwnedFd);

impl Namespace {
    pub(super) fn open(name: &str) -> anyhow::Result<Self> {
        let file = std::fs::File::open(format!("/run/netns/{name}"))
            .with_context(|| format!("cannot open network namespace {name}"))?;
        Ok(Namespace(file.into()))
    }

    /// Moves the calling thread (only it) into the namespace.
    pub(super) fn enter(&self) -> anyhow::Result<()> {
        // SAFETY: setns on a namespace fd we own; it changes this thread's namespace only.
        if unsafe { libc::setns(self.0.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            bail!("setns: {}", std::io::Error::last_os_error());
        }
        Ok(())
    }
}

/// The one kernel thread whose name is `name`, or begins with it if `name` ends in `-`.
/// `/proc/<pid>/comm` shows a kernel thread's whole name on Linux 6.18, and only its
/// first 15 bytes on older kernels: either matches.
pub(super) fn kernel_thread(name: &str) -> anyhow::Result<i32> {
    let short: String = name.chars().take(15).collect();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        let comm = comm.trim_end();
        let named = if name.ends_with('-') {
            comm.starts_with(&short)
        } else {
            comm == name || comm == short
        };
        if named {
            found.push(pid);
        }
    }
    let [pid] = found[..] else {
        bail!(
            "expected one kernel thread named {name}, found {}",
            found.len()
        );
    };
    Ok(pid)
}

/// Pins thread `pid` to `cpu` (an online CPU).
pub(super) fn pin(pid: i32, cpu: usize) -> anyhow::Result<()> {
    // SAFETY: cpu_set_t is plain data, zeroed is the empty set, and cpu < CPU_SETSIZE is
    // checked by the caller (it is an online CPU).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(pid, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            bail!(
                "cannot pin thread {pid} to CPU {cpu}: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    Ok(())
}

/// Makes the thread that runs the LB's XDP program SCHED_FIFO, so that the other
/// processes on the LB's CPU (builds on a shared machine) do not take the CPU from it while
/// it has frames to process: the scheduler then leaves them only what it keeps for them
/// when realtime threads would starve them (the fair server, 5% by default on Linux 6.18).
pub(super) fn realtime(pid: i32) -> anyhow::Result<()> {
    let param = libc::sched_param { sched_priority: 50 };
    // SAFETY: sched_setscheduler reads the one sched_param we pass.
    if unsafe { libc::sched_setscheduler(pid, libc::SCHED_FIFO, &param) } != 0 {
        bail!(
            "cannot make thread {pid} SCHED_FIFO: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}
