//! Do servers get back exactly the timestamps they sent, also after a connection sat idle?
//! Judged from captures on the servers' own interfaces with the tests' own parser
//! ([`super::parse_tcp`]), never with the core's cookie code: a server's TSvals are
//! collected per connection, and every TSecr a client segment brings must be one of them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::Ipv4Addr;

use super::TcpView;

/// A client segment is the first after an idle gap when the client's own TSval moved this
/// far since its previous segment on the connection (clients send their 1 ms clock with a
/// constant offset per connection, so the difference is the idle time). Below the
/// shortest gap the idle tests wait (70 s), above anything a busy connection shows.
pub const AFTER_GAP_MS: u32 = 60_000;

/// Echoes of one client (all its connections, at every server).
#[derive(Debug, Default, Clone)]
pub struct EchoCounts {
    /// Client segments whose TSecr is a TSval the server sent on that connection.
    pub exact: u64,
    /// Of those, the first segment after an idle gap ([`AFTER_GAP_MS`]).
    pub exact_after_gap: u64,
    /// TSecr values the server never sent on that connection.
    pub mismatches: u64,
    /// Of those, the first segment after an idle gap.
    pub mismatches_after_gap: u64,
    /// Client segments on connections whose server side the capture did not see.
    pub unknown_connections: u64,
    /// The first few mismatches, described.
    pub examples: Vec<String>,
}

/// Per client address: what the servers' captures say about the echoes they received.
#[derive(Debug, Default)]
pub struct EchoCheck {
    pub by_client: BTreeMap<Ipv4Addr, EchoCounts>,
}

/// Client address and port: a connection as one server sees it (the service port is fixed).
type ClientEnd = ([u8; 4], u16);

impl EchoCheck {
    /// Adds one server's capture (both directions, in capture order); `service_port` is
    /// the port the server listens on.
    pub fn add_server_capture(&mut self, segments: &[TcpView], service_port: u16) {
        let mut sent: HashMap<ClientEnd, HashSet<u32>> = HashMap::new();
        let mut last_client_tsval: HashMap<ClientEnd, u32> = HashMap::new();
        for segment in segments {
            let Some((tsval, tsecr)) = segment.timestamps else {
                continue;
            };
            if segment.sport == service_port {
                sent.entry((segment.dst, segment.dport))
                    .or_default()
                    .insert(tsval);
                continue;
            }
            if segment.dport != service_port {
                continue;
            }
            let end = (segment.src, segment.sport);
            if segment.is_syn() && !segment.is_ack() {
                // A new connection on a client port used before: start afresh.
                sent.remove(&end);
                last_client_tsval.insert(end, tsval);
                continue;
            }
            let previous = last_client_tsval.insert(end, tsval);
            // Serial arithmetic: a retransmission's older TSval is no gap.
            let after_gap =
                previous.is_some_and(|p| (tsval.wrapping_sub(p) as i32) >= AFTER_GAP_MS as i32);
            if !segment.is_ack() {
                continue;
            }
            let counts = self
                .by_client
                .entry(Ipv4Addr::from(segment.src))
                .or_default();
            let Some(server_tsvals) = sent.get(&end) else {
                counts.unknown_connections += 1;
                continue;
            };
            if server_tsvals.contains(&tsecr) {
                counts.exact += 1;
                counts.exact_after_gap += u64::from(after_gap);
            } else {
                counts.mismatches += 1;
                counts.mismatches_after_gap += u64::from(after_gap);
                if counts.examples.len() < 5 {
                    counts.examples.push(format!(
                        "{}:{} flags {:#04x}{}: TSecr {tsecr:#010x}, which the server never \
                         sent on this connection ({} distinct TSvals sent)",
                        Ipv4Addr::from(segment.src),
                        segment.sport,
                        segment.flags,
                        if after_gap { " after an idle gap" } else { "" },
                        server_tsvals.len(),
                    ));
                }
            }
        }
    }

    /// The counts of one client (zero if the servers saw nothing from it).
    pub fn client(&self, address: Ipv4Addr) -> EchoCounts {
        self.by_client.get(&address).cloned().unwrap_or_default()
    }
}
