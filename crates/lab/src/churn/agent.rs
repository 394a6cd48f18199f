//! `cheetah testbed agent`: a server's load agent, run inside the server's namespace.
//!
//! Every second it counts the server's own open connections on its service port (from
//! `/proc/net/tcp`, which shows the sockets of the agent's network namespace) and reports
//! them to the LB's API (`POST /servers/{id}/load`) as both `active_connections` and
//! `load`. The count replaces the LB's SYN/FIN estimate, so the runner's "drained server is
//! empty" check reads the server's truth, and `awrr` (metric `reported`) and `pow2` (metric
//! `active-connections`) weigh what the servers really carry. A CPU-bound service would
//! report CPU instead; for the testbed's uniform small requests, open connections are the
//! load.
//!
//! The agent never gives up: while the LB restarts, or before its server is added, the
//! reports fail and the next second tries again.

use std::time::Duration;

use anyhow::Context;
use serde_json::json;

use crate::loadgen::parse_duration;

#[derive(clap::Args, Debug)]
pub struct AgentArgs {
    /// The server id this agent reports for (as in the LB config).
    #[arg(long)]
    id: u16,
    /// The LB's control API, as reachable from the server; once per LB instance (each
    /// gets every report).
    #[arg(long, required = true)]
    api: Vec<String>,
    /// The service port whose connections are counted.
    #[arg(long, default_value_t = 80)]
    port: u16,
    /// Time between two reports.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    interval: Duration,
}

/// TCP states (`st` in /proc/net/tcp) that are not a connection the LB still has to route:
/// LISTEN (0A), TIME_WAIT (06) and CLOSE (07). Every other state still exchanges packets
/// with a client (a half-closed connection waits for its FIN or last ACK).
const NOT_OPEN: [&str; 3] = ["0A", "06", "07"];

/// Connections with local port `port` in the text of `/proc/net/tcp`.
pub fn open_connections(proc_net_tcp: &str, port: u16) -> u64 {
    let wanted = format!("{port:04X}");
    proc_net_tcp
        .lines()
        .skip(1)
        .filter(|line| {
            let mut fields = line.split_whitespace();
            // sl, local_address (ADDR:PORT in hex), rem_address, st
            let local = fields.nth(1);
            let state = fields.nth(1);
            match (local.and_then(|l| l.rsplit_once(':')), state) {
                (Some((_, local_port)), Some(state)) => {
                    local_port.eq_ignore_ascii_case(&wanted)
                        && !NOT_OPEN.iter().any(|s| state.eq_ignore_ascii_case(s))
                }
                _ => false,
            }
        })
        .count() as u64
}

pub fn run(args: AgentArgs) -> anyhow::Result<()> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(2)))
        .build()
        .into();
    let urls: Vec<String> = args
        .api
        .iter()
        .map(|api| format!("http://{api}/servers/{}/load", args.id))
        .collect();
    // Say when reporting to an LB starts or stops working, not every second.
    let mut last_outcomes: Vec<Option<String>> = vec![None; urls.len()];
    loop {
        let text = std::fs::read_to_string("/proc/net/tcp").context("reading /proc/net/tcp")?;
        let open = open_connections(&text, args.port);
        for ((url, api), last_outcome) in urls.iter().zip(&args.api).zip(&mut last_outcomes) {
            let outcome = match agent
                .post(url)
                .send_json(json!({"load": open as f64, "active_connections": open}))
            {
                Ok(_) => "reporting".to_string(),
                Err(ureq::Error::StatusCode(code)) => format!("the LB answers {code}"),
                Err(e) => format!("the LB is not reachable ({e})"),
            };
            if last_outcome.as_deref() != Some(&outcome) {
                eprintln!(
                    "agent s{} to {api}: {outcome} ({open} open connections)",
                    args.id
                );
                *last_outcome = Some(outcome);
            }
        }
        std::thread::sleep(args.interval);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:0050 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0
   1: 0100630A:0050 020B0A0A:A1B2 01 00000000:00000000 02:00000A2B 00000000    33        0 2 1 0 20 4 30 10 -1
   2: 0100630A:0050 020B0A0A:A1B3 01 00000000:00000000 02:00000A2B 00000000    33        0 3 1 0 20 4 30 10 -1
   3: 0100630A:0050 020B0A0A:A1B4 06 00000000:00000000 03:00001770 00000000     0        0 0 3 0
   4: 0100630A:0050 020B0A0A:A1B5 08 00000000:00000000 00:00000000 00000000    33        0 4 1 0 20 4 30 10 -1
   5: 0B00140A:C350 0100140A:23DC 01 00000000:00000000 00:00000000 00000000     0        0 5 1 0 20 4 30 10 -1
";

    #[test]
    fn counts_open_connections_on_the_port_only() {
        // Two established, one in CLOSE_WAIT; not the listener, the TIME_WAIT or the
        // agent's own connection to the API (local port 0xC350).
        assert_eq!(open_connections(SAMPLE, 80), 3);
        assert_eq!(open_connections(SAMPLE, 50000), 1);
        assert_eq!(open_connections(SAMPLE, 443), 0);
        assert_eq!(open_connections("", 80), 0);
    }
}
