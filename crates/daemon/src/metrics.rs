//! Prometheus metrics at `/metrics`, in the OpenMetrics text format.
//!
//! Built with `prometheus-client` through a custom [`Collector`]: nothing is registered
//! or updated on the data path. At each scrape the collector reads the workers' atomics,
//! the shared load totals and the control plane, so the hot path keeps its plain relaxed
//! stores and the exposition is always consistent with `/status` and `/servers`.
//!
//! Families (each sample's name is the family's, plus `_total` for counters):
//!
//! | family | labels |
//! |---|---|
//! | `cheetah_packets` (counter) | `worker`, `direction` = `rx` / `tx` |
//! | `cheetah_events` (counter) | `worker` (`xdp`: the in-kernel path), `event` = every core counter name |
//! | `cheetah_drops` (counter) | `worker`, `reason` = every drop reason, zeros included |
//! | `cheetah_io_<name>` (counter) | `worker`, one per I/O counter |
//! | `cheetah_cookie_decode_failures` (counter) | `worker` |
//! | `cheetah_fallback_connections` (counter) | `worker` |
//! | `cheetah_worker_packets_per_second` (gauge) | `worker` |
//! | `cheetah_server_active_connections` (gauge) | `server` |
//! | `cheetah_server_new_connections` (counter) | `server` |
//! | `cheetah_server_packets`, `cheetah_server_bytes` (counter) | `server` |
//! | `cheetah_server_reported_load` (gauge) | `server` |
//! | `cheetah_servers` (gauge) | `state` |
//! | `cheetah_ready` (gauge) | |
//! | `cheetah_server_up` (gauge) | `server`, `vip` |
//! | `cheetah_health_probes` (counter) | `server`, `vip`, `result` = ok / refused / timeout / bad_status / error |
//! | `cheetah_vips_failing_open` (gauge) | |
//! | `cheetah_fail_open_events` (counter) | |
//! | `cheetah_xdp_packets` (counter) | `outcome` |
//! | `cheetah_xdp_to_userspace` (counter) | `reason` |
//! | `cheetah_xdp_next_hop_misses` (counter) | |
//! | `cheetah_xdp_next_hop_cache_misses` (counter) | |
//! | `cheetah_xdp_replies_by_steering` (counter) | |
//! | `cheetah_snapshot_generation` (gauge) | |
//! | `cheetah_echoes_beyond_idle_limit` (counter) | |
//! | `cheetah_server_clock_resets` (counter) | |
//! | `cheetah` (info) | `version`, `mode`, `forwarding`, `cookie_epoch_bits`, `secret_fingerprint` |

use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use cheetah_core::lb::Counter;
use cheetah_core::tables::{Health, SlotState};
use cheetah_core::verdict::DropReason;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::health::state::ProbeOutcome;
use super::state::DaemonState;

/// The content type of [`render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Drop reasons that mean a client's cookie could not be turned back into a server.
pub const COOKIE_DECODE_FAILURES: [DropReason; 3] = [
    DropReason::CookieUnknownServer,
    DropReason::CookieServerRemoved,
    DropReason::TsMsbUnknown,
];

/// The whole exposition, as of now.
pub fn render(state: &Arc<DaemonState>) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(DaemonCollector(Arc::clone(state))));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)
        .expect("writing to a String cannot fail");
    text
}

struct DaemonCollector(Arc<DaemonState>);

impl fmt::Debug for DaemonCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DaemonCollector")
    }
}

type Labels = Vec<(&'static str, String)>;

/// One family: its HELP and TYPE once, then every sample.
fn family<I, V>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    samples: I,
) -> fmt::Result
where
    I: IntoIterator<Item = (Labels, V)>,
    V: Sample,
{
    let mut metric = encoder.encode_descriptor(name, help, None, kind)?;
    for (labels, value) in samples {
        if labels.is_empty() {
            // `name 1`, not `name{} 1`.
            value.encode(metric)?;
            return Ok(());
        }
        value.encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

/// A value and how it is encoded (counters and gauges).
trait Sample {
    fn encode(self, encoder: prometheus_client::encoding::MetricEncoder) -> fmt::Result;
}

struct Count(u64);

impl Sample for Count {
    fn encode(self, encoder: prometheus_client::encoding::MetricEncoder) -> fmt::Result {
        ConstCounter::new(self.0).encode(encoder)
    }
}

struct Level(f64);

impl Sample for Level {
    fn encode(self, encoder: prometheus_client::encoding::MetricEncoder) -> fmt::Result {
        ConstGauge::new(self.0).encode(encoder)
    }
}

/// A gauge that is a whole number (printed without `.0`).
struct Whole(u64);

impl Sample for Whole {
    fn encode(self, encoder: prometheus_client::encoding::MetricEncoder) -> fmt::Result {
        ConstGauge::new(self.0).encode(encoder)
    }
}

fn worker(index: usize) -> Labels {
    vec![("worker", index.to_string())]
}

/// The XDP program's in-kernel path, reported as one more worker.
fn kernel_worker() -> Labels {
    vec![("worker", "xdp".to_string())]
}

fn with(mut labels: Labels, key: &'static str, value: impl Into<String>) -> Labels {
    labels.push((key, value.into()));
    labels
}

impl Collector for DaemonCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let state = &self.0;
        let workers = state.workers();
        let rates = state.packet_rates();
        let e = &mut encoder;

        family(
            e,
            "cheetah_packets",
            "Frames received (rx) and sent (tx) by each worker.",
            MetricType::Counter,
            workers.iter().flat_map(|w| {
                [
                    (
                        with(worker(w.index), "direction", "rx"),
                        Count(w.io.rx_packets.load(Relaxed)),
                    ),
                    (
                        with(worker(w.index), "direction", "tx"),
                        Count(w.io.tx_packets.load(Relaxed)),
                    ),
                ]
            }),
        )?;
        // The XDP program's in-kernel path counts as one more worker, `xdp`, so that a sum
        // over workers is every packet the LB handled.
        let kernel = state.steering.fast_path.load(Relaxed).then(|| {
            state
                .steering
                .kernel_events()
                .map(|(c, n)| (with(kernel_worker(), "event", c.name()), Count(n)))
        });
        family(
            e,
            "cheetah_events",
            "Pipeline events of each worker, by event (the core's counters; see docs/api.md); worker xdp: packets the XDP program handled in the kernel.",
            MetricType::Counter,
            workers
                .iter()
                .flat_map(|w| {
                    Counter::ALL.iter().map(|c| {
                        (
                            with(worker(w.index), "event", c.name()),
                            Count(w.counters.get(*c)),
                        )
                    })
                })
                .chain(kernel.into_iter().flatten()),
        )?;
        // The kernel's drops under the core's reasons, as worker xdp (as its events are).
        let kernel_drops = state.steering.fast_path.load(Relaxed).then(|| {
            state
                .steering
                .kernel_drops()
                .map(|(r, n)| (with(kernel_worker(), "reason", r.name()), Count(n)))
        });
        family(
            e,
            "cheetah_drops",
            "Packets dropped by each worker, by reason (every reason, zeros included); worker xdp: packets the XDP program dropped in the kernel.",
            MetricType::Counter,
            workers
                .iter()
                .flat_map(|w| {
                    DropReason::ALL.iter().map(|r| {
                        (
                            with(worker(w.index), "reason", r.name()),
                            Count(w.counters.drops(*r)),
                        )
                    })
                })
                .chain(kernel_drops.into_iter().flatten()),
        )?;
        if let Some(first) = workers.first() {
            for (i, (name, help, _)) in first.io.samples().enumerate() {
                family(
                    e,
                    &format!("cheetah_io_{name}"),
                    help,
                    MetricType::Counter,
                    workers.iter().map(|w| {
                        let value = w.io.samples().nth(i).map_or(0, |s| s.2);
                        (worker(w.index), Count(value))
                    }),
                )?;
            }
        }
        family(
            e,
            "cheetah_cookie_decode_failures",
            "Client packets whose cookie named no usable server or whose timestamp MSB was unknown (drops cookie_unknown_server + cookie_server_removed + ts_msb_unknown).",
            MetricType::Counter,
            workers.iter().map(|w| {
                let sum = COOKIE_DECODE_FAILURES.iter().map(|r| w.counters.drops(*r)).sum();
                (worker(w.index), Count(sum))
            }),
        )?;
        family(
            e,
            "cheetah_fallback_connections",
            Counter::FallbackConnections.description(),
            MetricType::Counter,
            workers.iter().map(|w| {
                (
                    worker(w.index),
                    Count(w.counters.get(Counter::FallbackConnections)),
                )
            }),
        )?;
        family(
            e,
            "cheetah_worker_packets_per_second",
            "Packets each worker processed per second, over the last second.",
            MetricType::Gauge,
            workers
                .iter()
                .enumerate()
                .map(|(i, w)| (worker(w.index), Level(rates.get(i).copied().unwrap_or(0.0)))),
        )?;

        let (servers, generation, health_marks, failing_open, fail_open_events) = {
            let control = state.control();
            let marks: Vec<(String, u16, bool)> = control
                .vips()
                .iter()
                .flat_map(|v| {
                    let control = &control;
                    v.members.iter().map(move |(id, _)| {
                        (
                            SocketAddr::new(v.address, v.port).to_string(),
                            id.0,
                            control.health((v.address, v.port), *id) == Health::Up,
                        )
                    })
                })
                .collect();
            (
                control.servers(state.now()),
                state.shared.snapshot.generation(),
                marks,
                control.failing_open().len(),
                control.fail_open_events(),
            )
        };
        let ready = state.readiness().ready;
        let probes = state.health.all();
        let loads: Vec<_> = servers
            .iter()
            .map(|s| {
                (
                    vec![("server", s.id.0.to_string())],
                    state.shared.loads.server(s.id),
                )
            })
            .collect();
        family(
            e,
            "cheetah_server_active_connections",
            "Open connections of each server: the LB's SYN/FIN estimate, or the server's own count when it reports one.",
            MetricType::Gauge,
            loads.iter().map(|(l, load)| (l.clone(), Whole(load.active_connections))),
        )?;
        family(
            e,
            "cheetah_server_new_connections",
            "New connections the policies placed on each server (reset when its id is reused).",
            MetricType::Counter,
            loads
                .iter()
                .map(|(l, load)| (l.clone(), Count(load.new_connections))),
        )?;
        family(
            e,
            "cheetah_server_packets",
            "Packets exchanged with each server, both directions (reset when its id is reused).",
            MetricType::Counter,
            loads
                .iter()
                .map(|(l, load)| (l.clone(), Count(load.packets))),
        )?;
        family(
            e,
            "cheetah_server_bytes",
            "Bytes exchanged with each server, both directions (reset when its id is reused).",
            MetricType::Counter,
            loads.iter().map(|(l, load)| (l.clone(), Count(load.bytes))),
        )?;
        family(
            e,
            "cheetah_server_reported_load",
            "The load each server last reported (0 until it reports).",
            MetricType::Gauge,
            loads
                .iter()
                .map(|(l, load)| (l.clone(), Level(load.reported_load))),
        )?;
        family(
            e,
            "cheetah_servers",
            "Servers by state (removed ones are quarantined).",
            MetricType::Gauge,
            [SlotState::Active, SlotState::Draining, SlotState::Removed].map(|st| {
                let n = servers.iter().filter(|s| s.state == st).count();
                (vec![("state", st.name().to_string())], Whole(n as u64))
            }),
        )?;
        family(
            e,
            "cheetah_ready",
            "1 when this instance is ready for traffic: every active server's health decided and every healthy one's clock confirmed by a probe (GET /ready says what it waits for).",
            MetricType::Gauge,
            [(Labels::new(), Whole(u64::from(ready)))],
        )?;
        family(
            e,
            "cheetah_server_up",
            "1 when this instance's health probes find the server up on the VIP, 0 when down or not decided yet.",
            MetricType::Gauge,
            health_marks.iter().map(|(vip, id, up)| {
                (
                    vec![("server", id.to_string()), ("vip", vip.clone())],
                    Whole(u64::from(*up)),
                )
            }),
        )?;
        family(
            e,
            "cheetah_health_probes",
            "Health probes this instance made of each server of each VIP, by result (those that decide health: the SYN probe, or the HTTP check with http_path).",
            MetricType::Counter,
            probes.iter().flat_map(|((vip, id), status)| {
                let vip = SocketAddr::new(vip.0, vip.1).to_string();
                ProbeOutcome::RESULTS
                    .iter()
                    .zip(status.probes)
                    .map(move |(result, n)| {
                        (
                            vec![
                                ("server", id.0.to_string()),
                                ("vip", vip.clone()),
                                ("result", result.to_string()),
                            ],
                            Count(n),
                        )
                    })
            }),
        )?;
        family(
            e,
            "cheetah_vips_failing_open",
            "VIPs whose every active server is down, which therefore fail open: new connections go to all their active servers as if healthy.",
            MetricType::Gauge,
            [(Labels::new(), Whole(failing_open as u64))],
        )?;
        family(
            e,
            "cheetah_fail_open_events",
            "Times a VIP began failing open (every active server down) since the LB started.",
            MetricType::Counter,
            [(Labels::new(), Count(fail_open_events))],
        )?;
        family(
            e,
            "cheetah_xdp_packets",
            "Packets the XDP program saw, by outcome: to_socket (the LB's), no_socket (the LB's, dropped while no worker socket was bound), passed_to_host, no_metadata_room (dropped: no headroom for the metadata or a lifted header).",
            MetricType::Counter,
            state
                .steering
                .samples()
                .map(|(outcome, n)| (vec![("outcome", outcome.to_string())], Count(n))),
        )?;
        family(
            e,
            "cheetah_xdp_to_userspace",
            "Packets the XDP program's in-kernel path looked at and handed to the workers, by reason (datapath = xdp; see docs/api.md).",
            MetricType::Counter,
            state
                .steering
                .to_userspace()
                .map(|(reason, n)| (vec![("reason", reason.to_string())], Count(n))),
        )?;
        family(
            e,
            "cheetah_xdp_next_hop_misses",
            "Server replies the in-kernel path found no next hop for in the next_hops map (datapath = xdp), so it asked the kernel's FIB (bpf_fib_lookup) instead.",
            MetricType::Counter,
            [(
                Labels::new(),
                Count(state.steering.next_hop_miss.load(Relaxed)),
            )],
        )?;
        family(
            e,
            "cheetah_xdp_next_hop_cache_misses",
            "Server replies whose next hop the in-kernel path's per-CPU next_hop_cache did not hold for the current publication of the tables (datapath = xdp), so it read the next_hops maps (and, where they have no answer, the FIB).",
            MetricType::Counter,
            [(
                Labels::new(),
                Count(state.steering.next_hop_cache_miss.load(Relaxed)),
            )],
        )?;
        family(
            e,
            "cheetah_xdp_replies_by_steering",
            "Server replies the in-kernel path did not find in its reply_senders map (datapath = xdp), so it found their sender by steering's lookups instead (a server outside the VIP's pool, a removed server, a reply on the clients' side, more senders than the map holds).",
            MetricType::Counter,
            [(
                Labels::new(),
                Count(state.steering.reply_by_steering.load(Relaxed)),
            )],
        )?;
        family(
            e,
            "cheetah_snapshot_generation",
            "Generation of the published table snapshot (moves with every control change).",
            MetricType::Gauge,
            [(Labels::new(), Whole(generation))],
        )?;
        family(
            e,
            "cheetah_echoes_beyond_idle_limit",
            "Client echoes restored from further back than the cookie layout's idle limit (2^(k-1) x 65.5 s): those connections idled too long, and their client's PAWS check will drop the server's next segment.",
            MetricType::Counter,
            // The workers' restores and the kernel's.
            [(
                Labels::new(),
                Count(
                    state.shared.msb.echoes_beyond_idle_limit()
                        + state.steering.echo_beyond_idle_limit.load(Relaxed),
                ),
            )],
        )?;
        family(
            e,
            "cheetah_server_clock_resets",
            "Health-probe answers that moved a server's clock backwards or further forward than real time allows (a server that rebooted); replies never do.",
            MetricType::Counter,
            [(Labels::new(), Count(state.shared.msb.probe_resets()))],
        )?;
        let info = Info::new(vec![
            ("version", env!("CARGO_PKG_VERSION").to_string()),
            ("mode", state.mode.name().to_string()),
            (
                "cookie_epoch_bits",
                state.shared.layout().epoch_bits().to_string(),
            ),
            ("forwarding", state.forwarding.name().to_string()),
            ("secret_fingerprint", state.secret_fingerprint.clone()),
        ]);
        info.encode(e.encode_descriptor(
            "cheetah",
            "This LB: version, mode, forwarding and the public fingerprint of its secret.",
            None,
            MetricType::Info,
        )?)?;
        Ok(())
    }
}
