//! The lines that say on what and where a run was made.

use super::affinity;
use super::timing::Clock;
use super::trace::{Role, Trace, TracePacket};

pub fn machine_summary(clock: &Clock, core: &str) -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|m| m.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_else(|| "unknown".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    let cpus = affinity::cpus();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    format!(
        "machine: {model}, {cpus} cpus, kernel {kernel}; TSC {:.4} ticks/ns; {core}; load average at start {}",
        clock.ticks_per_ns,
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    )
}

pub fn trace_summary(trace: &Trace) -> String {
    let count = |f: &dyn Fn(&TracePacket) -> bool| trace.packets.iter().filter(|p| f(p)).count();
    format!(
        "trace: {} connections ({} without timestamps), at most {} open, {} packets: {} SYN, {} client established, {} SYN-ACK, {} server established",
        trace.keys.len(),
        count(&|p| !p.timestamps && p.role == Role::ClientSyn),
        trace.max_concurrent,
        trace.packets.len(),
        count(&|p| p.role == Role::ClientSyn),
        count(&|p| p.role == Role::ClientEstablished),
        count(&|p| p.role == Role::ServerSynAck),
        count(&|p| p.role == Role::ServerEstablished),
    )
}
