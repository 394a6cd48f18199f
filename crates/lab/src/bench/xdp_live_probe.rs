//! What the live bench reads around a run: one CPU's time by kind (`/proc/stat`), its
//! NET_RX softirqs (`/proc/softirqs`), and a BPF program's own run time and count, which
//! the kernel keeps only while `kernel.bpf_stats_enabled` is 1 ([`BpfStats`] turns it on
//! and puts back what it was). `cheetah testbed throughput` reads the last two too.

use std::os::fd::{AsRawFd, BorrowedFd};

use anyhow::{bail, Context};
use libbpf_rs::libbpf_sys;

/// One CPU's line of `/proc/stat`, in clock ticks (USER_HZ).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct CpuTimes {
    pub(super) user: u64,
    pub(super) system: u64,
    pub(super) irq: u64,
    pub(super) softirq: u64,
    pub(super) total: u64,
}

impl CpuTimes {
    pub(super) fn read(cpu: usize) -> anyhow::Result<Self> {
        let stat = std::fs::read_to_string("/proc/stat").context("cannot read /proc/stat")?;
        Self::parse(&stat, cpu)
    }

    fn parse(stat: &str, cpu: usize) -> anyhow::Result<Self> {
        let label = format!("cpu{cpu}");
        let Some(fields) = stat
            .lines()
            .map(|line| line.split_whitespace().collect::<Vec<_>>())
            .find(|words| words.first() == Some(&label.as_str()))
        else {
            bail!("/proc/stat has no line for {label}");
        };
        // user nice system idle iowait irq softirq steal (guest time is inside user).
        let ticks: Vec<u64> = fields[1..]
            .iter()
            .take(8)
            .map(|w| w.parse().unwrap_or(0))
            .collect();
        let at = |i: usize| ticks.get(i).copied().unwrap_or(0);
        Ok(CpuTimes {
            user: at(0) + at(1),
            system: at(2),
            irq: at(5),
            softirq: at(6),
            total: ticks.iter().sum(),
        })
    }

    pub(super) fn since(&self, before: &CpuTimes) -> CpuTimes {
        CpuTimes {
            user: self.user - before.user,
            system: self.system - before.system,
            irq: self.irq - before.irq,
            softirq: self.softirq - before.softirq,
            total: self.total - before.total,
        }
    }

    /// The kernel's share (system + irq + softirq): where a NAPI thread and softirqs are
    /// counted.
    pub(super) fn kernel_share(&self) -> f64 {
        (self.system + self.irq + self.softirq) as f64 / self.total.max(1) as f64
    }

    pub(super) fn share(&self, ticks: u64) -> f64 {
        ticks as f64 / self.total.max(1) as f64
    }
}

/// Seconds per `/proc/stat` tick.
pub(super) fn tick_seconds() -> f64 {
    // SAFETY: sysconf has no preconditions.
    1.0 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// NET_RX softirqs run so far on each CPU.
pub(super) fn net_rx_softirqs() -> anyhow::Result<Vec<u64>> {
    let text = std::fs::read_to_string("/proc/softirqs").context("cannot read /proc/softirqs")?;
    parse_net_rx(&text)
}

fn parse_net_rx(text: &str) -> anyhow::Result<Vec<u64>> {
    text.lines()
        .find_map(|line| line.trim_start().strip_prefix("NET_RX:"))
        .map(|counts| {
            counts
                .split_whitespace()
                .map(|w| w.parse().unwrap_or(0))
                .collect()
        })
        .context("/proc/softirqs has no NET_RX line")
}

/// A thread's time on a CPU and waiting for one (`/proc/<pid>/schedstat`, ns): together,
/// the time it had work; and how often it went to sleep (`voluntary_ctxt_switches` of
/// `/proc/<pid>/status`).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct ThreadTimes {
    pub(super) running_ns: u64,
    pub(super) waiting_ns: u64,
    pub(super) sleeps: u64,
}

impl ThreadTimes {
    pub(super) fn read(pid: i32) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
            .with_context(|| format!("cannot read /proc/{pid}/schedstat"))?;
        let mut words = text.split_whitespace().map(|w| w.parse().unwrap_or(0));
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .with_context(|| format!("cannot read /proc/{pid}/status"))?;
        let sleeps = status
            .lines()
            .find_map(|line| line.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|count| count.trim().parse().ok())
            .unwrap_or(0);
        Ok(ThreadTimes {
            running_ns: words.next().unwrap_or(0),
            waiting_ns: words.next().unwrap_or(0),
            sleeps,
        })
    }

    pub(super) fn since(&self, before: &ThreadTimes) -> ThreadTimes {
        ThreadTimes {
            running_ns: self.running_ns - before.running_ns,
            waiting_ns: self.waiting_ns - before.waiting_ns,
            sleeps: self.sleeps - before.sleeps,
        }
    }
}

/// A program's cumulated run time and runs, as `bpf_stats_enabled` makes the kernel count
/// them (around every run, on whatever CPU).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ProgramRuns {
    pub(crate) run_time_ns: u64,
    pub(crate) run_cnt: u64,
}

impl ProgramRuns {
    pub(crate) fn read(program: BorrowedFd<'_>) -> anyhow::Result<Self> {
        let mut info = libbpf_sys::bpf_prog_info::default();
        let mut len = std::mem::size_of_val(&info) as u32;
        // SAFETY: `info` is a bpf_prog_info of `len` bytes; with no arrays asked for, the
        // kernel writes only into it.
        let rc = unsafe {
            libbpf_sys::bpf_obj_get_info_by_fd(
                program.as_raw_fd(),
                (&mut info as *mut libbpf_sys::bpf_prog_info).cast(),
                &mut len,
            )
        };
        if rc != 0 {
            bail!(
                "cannot read the program's info: {}",
                std::io::Error::last_os_error()
            );
        }
        Ok(ProgramRuns {
            run_time_ns: info.run_time_ns,
            run_cnt: info.run_cnt,
        })
    }

    /// ns per run between `before` and now.
    pub(crate) fn ns_per_run_since(&self, before: &ProgramRuns) -> Option<f64> {
        let runs = self.run_cnt.checked_sub(before.run_cnt)?;
        (runs > 0).then(|| (self.run_time_ns - before.run_time_ns) as f64 / runs as f64)
    }
}

const BPF_STATS_SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";

/// `kernel.bpf_stats_enabled = 1` for as long as it lives; what was there before when it
/// drops.
pub(crate) struct BpfStats {
    previous: String,
}

impl BpfStats {
    pub(crate) fn enable() -> anyhow::Result<Self> {
        let previous = std::fs::read_to_string(BPF_STATS_SYSCTL)
            .with_context(|| format!("cannot read {BPF_STATS_SYSCTL}"))?;
        std::fs::write(BPF_STATS_SYSCTL, "1")
            .with_context(|| format!("cannot write {BPF_STATS_SYSCTL}"))?;
        Ok(BpfStats {
            previous: previous.trim().to_string(),
        })
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = std::fs::write(BPF_STATS_SYSCTL, &self.previous);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpu_line_is_split_by_kind() {
        let stat =
            "cpu  9 9 9 9 9 9 9 9 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\ncpu1 10 0 30 40 0 5 15 0 0 0\n";
        let cpu1 = CpuTimes::parse(stat, 1).unwrap();
        assert_eq!(
            cpu1,
            CpuTimes {
                user: 10,
                system: 30,
                irq: 5,
                softirq: 15,
                total: 100
            }
        );
        assert!((cpu1.kernel_share() - 0.5).abs() < 1e-9);
        assert!(CpuTimes::parse(stat, 2).is_err());
    }

    #[test]
    fn net_rx_counts_are_per_cpu() {
        let text = "                    CPU0       CPU1\n          HI:          1          0\n      NET_RX:     504865     499663\n";
        assert_eq!(parse_net_rx(text).unwrap(), [504_865, 499_663]);
    }
}
