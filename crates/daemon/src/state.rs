//! What the data path, the API and the persister share.
//!
//! The hot path never takes a lock here: workers read the published snapshot, the load
//! totals and the MSB table through [`LbShared`], and count into their own atomics
//! ([`WorkerCounters`], [`IoCounters`]). The locks below are taken by the API thread, the
//! persister, and the data path at start-up (registering workers and interfaces).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use cheetah_core::config::{Forwarding, Mode};
use cheetah_core::lb::{Counter, LbShared, WorkerCounters};
use cheetah_core::tables::ControlPlane;
use cheetah_core::types::Nanos;
use cheetah_core::verdict::DropReason;
use serde::Serialize;

use crate::clock::{unix_ms, Clock};
use crate::dataplane::xdp::SteeringStats;
use crate::dataplane::xdp_layout::{
    FAST_BUNDLES, FAST_EVENTS, GENERAL_PATH, KERNEL_DROPS, OPTIONS_WALKED, UP_REASONS,
};
use crate::dataplane::IoCounters;
use crate::fallback_state;
use crate::health::{self, HealthBook, Readiness};
use crate::persist::{Persister, SaveContents};
use crate::published::PublishedGeneration;

/// One data-path worker, as the API and metrics see it.
#[derive(Clone)]
pub struct WorkerStats {
    pub index: usize,
    /// The NIC queue it serves.
    pub queue: u32,
    pub counters: Arc<WorkerCounters>,
    pub io: Arc<IoCounters>,
}

/// An interface the data path attached to, as it reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct InterfaceStatus {
    pub name: String,
    pub ifindex: u32,
    /// How the XDP program is attached (`native`, `skb`, ...).
    pub xdp_mode: String,
    /// NIC queues with a worker.
    pub queues: Vec<u32>,
}

/// The XDP program's own counters: packets handed to a socket, dropped because no socket
/// was bound (the LB restarting), passed to the host, and sent without metadata room; and
/// with `[daemon] datapath = "xdp"`, the packets its in-kernel path handled (by core
/// bundle) and those it handed to userspace (by reason).
#[derive(Debug)]
pub struct SteeringCounters {
    pub to_socket: AtomicU64,
    pub no_socket: AtomicU64,
    pub passed_to_host: AtomicU64,
    pub no_metadata_room: AtomicU64,
    /// Replies whose next hop the kernel asked `bpf_fib_lookup` for, not in `next_hops`.
    pub next_hop_miss: AtomicU64,
    /// Replies whose next hop the kernel's per-CPU cache did not hold (next_hops read).
    pub next_hop_cache_miss: AtomicU64,
    /// Server replies the kernel found by steering's lookups, not in `reply_senders`.
    pub reply_by_steering: AtomicU64,
    /// Packets the kernel handled whose timestamp the options' walk found.
    pub options_walked: AtomicU64,
    /// Packets the kernel routed as without a timestamp whose timestamp the compare found.
    pub options_compared: AtomicU64,
    /// Server segments the kernel handled that the core's general path takes (no
    /// `fast_path`), beside an entry that stands for one.
    pub general_path: AtomicU64,
    /// Echoes the kernel restored and forwarded beyond the idle limit: added to the core's
    /// `echoes_beyond_idle_limit`.
    pub echo_beyond_idle_limit: AtomicU64,
    /// The in-kernel path is on: its packets are reported as a worker of their own.
    pub fast_path: AtomicBool,
    fast: [AtomicU64; FAST_BUNDLES.len()],
    up: [AtomicU64; UP_REASONS.len()],
    events: [AtomicU64; FAST_EVENTS.len()],
}

// By hand: `events` is longer than the arrays std derives `Default` for.
impl Default for SteeringCounters {
    fn default() -> Self {
        let zero = || AtomicU64::new(0);
        SteeringCounters {
            to_socket: zero(),
            no_socket: zero(),
            passed_to_host: zero(),
            no_metadata_room: zero(),
            next_hop_miss: zero(),
            next_hop_cache_miss: zero(),
            reply_by_steering: zero(),
            options_walked: zero(),
            options_compared: zero(),
            general_path: zero(),
            echo_beyond_idle_limit: zero(),
            fast_path: AtomicBool::new(false),
            fast: std::array::from_fn(|_| zero()),
            up: std::array::from_fn(|_| zero()),
            events: std::array::from_fn(|_| zero()),
        }
    }
}

impl SteeringCounters {
    /// Copies a reading of the program's per-CPU counters.
    pub fn store(&self, stats: &SteeringStats) {
        self.to_socket.store(stats.to_socket, Relaxed);
        self.no_socket.store(stats.no_socket, Relaxed);
        self.passed_to_host.store(stats.passed_to_host, Relaxed);
        self.no_metadata_room.store(stats.no_metadata_room, Relaxed);
        self.next_hop_miss.store(stats.next_hop_miss, Relaxed);
        self.next_hop_cache_miss
            .store(stats.next_hop_cache_miss, Relaxed);
        self.reply_by_steering
            .store(stats.reply_by_steering, Relaxed);
        self.options_walked.store(stats.options_walked, Relaxed);
        self.options_compared.store(stats.options_compared, Relaxed);
        self.general_path.store(stats.general_path, Relaxed);
        self.echo_beyond_idle_limit
            .store(stats.echo_beyond_idle_limit, Relaxed);
        for (cell, value) in self.fast.iter().zip(stats.fast) {
            cell.store(value, Relaxed);
        }
        for (cell, value) in self.up.iter().zip(stats.up) {
            cell.store(value, Relaxed);
        }
        for (cell, value) in self.events.iter().zip(stats.events) {
            cell.store(value, Relaxed);
        }
    }

    /// The in-kernel path's packets as the core's counters: each packet of a bundle in
    /// every counter of the bundle (`Bundle::counters`), as a worker counts its own.
    pub fn kernel_events(&self) -> impl Iterator<Item = (Counter, u64)> + '_ {
        Counter::ALL.iter().map(move |counter| {
            let bundles = FAST_BUNDLES
                .iter()
                .zip(&self.fast)
                .filter(|((_, bundle), _)| bundle.counters().contains(counter))
                .map(|(_, cell)| cell.load(Relaxed));
            let events = FAST_EVENTS
                .iter()
                .zip(&self.events)
                .filter(|((_, counters), _)| counters.contains(counter))
                .map(|(_, cell)| cell.load(Relaxed));
            // A walked packet's entry stands for the compare's count, the core counted the
            // walk's; an options_compared packet's the other way round.
            let walked = self.options_walked.load(Relaxed);
            let found_by_compare = self.options_compared.load(Relaxed);
            let (compare, walk) = OPTIONS_WALKED;
            let total = bundles.chain(events).fold(0, u64::wrapping_add);
            let total = if *counter == compare {
                total.wrapping_sub(walked).wrapping_add(found_by_compare)
            } else if *counter == walk {
                total.wrapping_add(walked).wrapping_sub(found_by_compare)
            } else {
                total
            };
            // A general-path packet's entry stands for the straight line's `fast_path`.
            let total = if *counter == GENERAL_PATH {
                total.wrapping_sub(self.general_path.load(Relaxed))
            } else {
                total
            };
            (*counter, total)
        })
    }

    /// Packets the in-kernel path dropped, under the core's reasons (every reason, zeros
    /// included, as a worker's drops are shown).
    pub fn kernel_drops(&self) -> impl Iterator<Item = (DropReason, u64)> + '_ {
        DropReason::ALL.iter().map(move |reason| {
            let dropped = KERNEL_DROPS
                .iter()
                .filter(|(_, dropped)| dropped == reason)
                .flat_map(|(stat, _)| {
                    FAST_EVENTS
                        .iter()
                        .zip(&self.events)
                        .filter(move |((index, _), _)| index == stat)
                        .map(|(_, cell)| cell.load(Relaxed))
                })
                .fold(0, u64::wrapping_add);
            (*reason, dropped)
        })
    }

    /// Packets the in-kernel path handed to userspace, by reason.
    pub fn to_userspace(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        UP_REASONS
            .iter()
            .zip(&self.up)
            .map(|((_, reason), cell)| (*reason, cell.load(Relaxed)))
    }

    pub fn samples(&self) -> [(&'static str, u64); 4] {
        [
            ("to_socket", self.to_socket.load(Relaxed)),
            ("no_socket", self.no_socket.load(Relaxed)),
            ("passed_to_host", self.passed_to_host.load(Relaxed)),
            ("no_metadata_room", self.no_metadata_room.load(Relaxed)),
        ]
    }
}

/// Packets per second of each worker, sampled once a second by the API thread.
#[derive(Default)]
struct RateMeter {
    last: Option<(Instant, Vec<u64>)>,
    rates: Vec<f64>,
}

pub struct DaemonState {
    /// The control plane. Control changes are rare and the hot path never takes this lock.
    pub control: Mutex<ControlPlane>,
    pub shared: Arc<LbShared>,
    pub secret_fingerprint: String,
    pub mode: Mode,
    pub forwarding: Forwarding,
    pub clock: Clock,
    workers: RwLock<Vec<WorkerStats>>,
    interfaces: RwLock<Vec<InterfaceStatus>>,
    started: Instant,
    started_unix_ms: u64,
    persister: Option<Persister>,
    rates: Mutex<RateMeter>,
    /// What the XDP steering program did, copied from its per-CPU map about once a
    /// second by the daemon's main thread (the program object lives there).
    pub steering: SteeringCounters,
    /// The health prober's decisions with their reasons (`health/`).
    pub health: HealthBook,
    /// The snapshot generation the XDP program's maps hold (`published.rs`).
    pub published: PublishedGeneration,
}

impl DaemonState {
    /// `plane` must have been built (or restored) with `clock`'s `now`.
    pub fn new(plane: ControlPlane, clock: Clock, persister: Option<Persister>) -> Self {
        let shared = Arc::clone(plane.shared());
        let config = plane.config();
        DaemonState {
            secret_fingerprint: shared.secret_fingerprint().to_string(),
            mode: config.mode,
            forwarding: config.forwarding,
            control: Mutex::new(plane),
            shared,
            clock,
            workers: RwLock::new(Vec::new()),
            interfaces: RwLock::new(Vec::new()),
            started: Instant::now(),
            started_unix_ms: unix_ms(),
            persister,
            rates: Mutex::new(RateMeter::default()),
            steering: SteeringCounters::default(),
            health: HealthBook::default(),
            published: PublishedGeneration::default(),
        }
    }

    #[inline]
    pub fn now(&self) -> Nanos {
        self.clock.now()
    }

    /// The control plane. A change either happens whole or not at all (the plane
    /// validates before it publishes), so a panic while it was held leaves it consistent
    /// and the poison is ignored.
    pub fn control(&self) -> MutexGuard<'_, ControlPlane> {
        self.control.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a worker's counters (the data path, at start-up) and returns the I/O
    /// counters it is to write.
    pub fn register_worker(
        &self,
        index: usize,
        queue: u32,
        counters: Arc<WorkerCounters>,
    ) -> Arc<IoCounters> {
        let io = Arc::new(IoCounters::default());
        let mut workers = self.workers.write().unwrap_or_else(|e| e.into_inner());
        workers.push(WorkerStats {
            index,
            queue,
            counters,
            io: Arc::clone(&io),
        });
        workers.sort_by_key(|w| w.index);
        io
    }

    pub fn workers(&self) -> Vec<WorkerStats> {
        self.workers
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Set by the data path once its interfaces are attached.
    pub fn set_interfaces(&self, interfaces: Vec<InterfaceStatus>) {
        *self.interfaces.write().unwrap_or_else(|e| e.into_inner()) = interfaces;
    }

    pub fn interfaces(&self) -> Vec<InterfaceStatus> {
        self.interfaces
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Whether this instance is ready for traffic, and what it waits for.
    pub fn readiness(&self) -> Readiness {
        health::readiness(&self.control(), &self.shared.msb, &self.health)
    }

    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    pub fn started_unix_ms(&self) -> u64 {
        self.started_unix_ms
    }

    pub fn persister(&self) -> Option<&Persister> {
        self.persister.as_ref()
    }

    /// Saves the state file now (after a control change). A failure is logged, not
    /// returned: the change is made and the periodic save will try again.
    pub fn persist(&self) {
        let Some(persister) = &self.persister else {
            return;
        };
        let saved = persister.save(|now_unix_ms| {
            // One instant for every part, as for the wall-clock time they are saved with.
            let now = self.now();
            SaveContents {
                tables: self.control().export(now),
                msb: self.shared.msb.persist(now, now_unix_ms),
                cookie_epoch_bits: self.shared.layout().epoch_bits(),
                fallback: fallback_state::encode(&self.shared, now, now_unix_ms),
            }
        });
        if let Err(e) = saved {
            tracing::warn!(error = %format!("{e:#}"), "cannot save the state file");
        }
    }

    /// Once a second (the API thread): carries every server's clock estimate forward (a
    /// server whose connections idle must not leave its estimate behind), ends
    /// quarantines that are over and samples the packet rates.
    pub fn tick(&self) {
        self.shared.msb.refresh(self.now());
        let expired = self.control().expire(self.now());
        if expired > 0 {
            tracing::info!(expired, "quarantine over: server ids free for reuse");
            self.persist();
        }
        self.sample_rates(Instant::now());
    }

    fn sample_rates(&self, at: Instant) {
        let totals: Vec<u64> = self
            .workers()
            .iter()
            .map(|w| w.counters.packets())
            .collect();
        let mut meter = self.rates.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((last_at, last)) = &meter.last {
            let seconds = at.duration_since(*last_at).as_secs_f64();
            if seconds > 0.0 {
                let rates = totals
                    .iter()
                    .enumerate()
                    .map(|(i, now)| {
                        now.saturating_sub(last.get(i).copied().unwrap_or(0)) as f64 / seconds
                    })
                    .collect();
                meter.rates = rates;
            }
        }
        meter.last = Some((at, totals));
    }

    /// Packets per second of each worker over the last sampling second (0 until two
    /// samples were taken), in the order of [`DaemonState::workers`].
    pub fn packet_rates(&self) -> Vec<f64> {
        let meter = self.rates.lock().unwrap_or_else(|e| e.into_inner());
        let n = self.workers.read().unwrap_or_else(|e| e.into_inner()).len();
        (0..n)
            .map(|i| meter.rates.get(i).copied().unwrap_or(0.0))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use cheetah_core::config::LbConfig;
    use cheetah_core::hash::Secret;
    use cheetah_core::lb::Counter;

    use super::*;

    #[test]
    fn kernel_packets_count_under_every_counter_of_their_bundle() {
        let counters = SteeringCounters::default();
        let stats = SteeringStats {
            fast: [10, 20, 30, 40, 100, 1000, 50],
            up: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
            // A first close, a duplicate close, an ICMP error by its cookie, by a pick; a
            // reply that learnt its server's clock (first MSB, advance): a cookie, a first
            // close, a duplicate close; a SYN without options (evicting, retransmitted,
            // both), a fallback miss, a server's SYN-ACK without timestamps (evicting or not),
            // a SYN-ACK that moved its retried SYN's count (the retired entry, as an older
            // program counted it); a client segment whose timestamp
            // the walk found; a baseline's client segment too short for the straight line; a
            // server's segment without a timestamp (an RST or not; with the straight line's
            // header or shorter); a baseline's reply too short for the straight line; drops
            // for malformed options (truncated, bad length, overrun, bad timestamp length),
            // of a client's segment and of a server's reply; fragments to a VIP; UDP, another
            // protocol and an unknown port at a VIP address; a removed server's segment and
            // one from a MAC no server has; a removed server's too short for the straight
            // line; a server's reply on the clients' side; a server's FIN without a
            // timestamp, a first close or a duplicate; a cookie naming an unknown server,
            // a removed one, an unknown clock; an ICMP error's quoted cookie naming an
            // unknown server, a removed one; a bad IP version, IPv4 header length, total
            // length; a truncated TCP header, a bad data offset; an ICMP message to a VIP
            // address too short, or of a type the core does not route; l2, a packet from a VIP
            // address that is no TCP segment, forwarded; a fallback entry naming a
            // removed server; a reply whose clock the core would not learn (a cookie, a first
            // close, a duplicate close; each unstable or ahead of real time); an ICMP error
            // without a cookie routed by the fallback table; a move counted beside a
            // SYN-ACK's entry; a new connection to an empty pool (a SYN with a timestamp,
            // one without, a fallback miss, a baseline's pick, straight or general).
            events: [
                100, 200, 400, 800, 3, 5, 7, 11, 13, 17, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512,
                1024, 2048, 4096, 8192, 16384, 1000, 2000, 3000, 4000, 10, 20, 30, 40, 5, 60, 70,
                80, 90, 100, 110, 120, 6000, 7000, 130, 140, 150, 160, 170, 180, 190, 200, 210,
                220, 240, 250, 260, 230, 300, 301, 302, 303, 304, 305, 700, 50, 31, 37, 41, 43, 47,
            ],
            // Of the packets above counted under options_fast_path, 9 were walked.
            options_walked: 9,
            // Of those counted under options_slow_path, 4 were found by the compare.
            options_compared: 4,
            // Of those counted under fast_path, 3 took the core's general path.
            general_path: 3,
            ..SteeringStats::default()
        };
        counters.store(&stats);
        let events: std::collections::BTreeMap<&str, u64> = counters
            .kernel_events()
            .map(|(c, n)| (c.name(), n))
            .collect();
        assert_eq!(
            events["to_server"], 2667 + 512 + 700,
            "client cookie (compared or walked) + client pick (straight or general) + SYNs (retransmitted or not) + ICMP (cookie, pick, fallback) + client fallback + SYNs without options + fallback misses"
        );
        assert_eq!(events["fallback_hits"], 50);
        assert_eq!(
            events["options_slow_path"],
            177 + 256 + 9 + 1024 + 2048 + 4096 + 8192 + 13000 + 230 - 4 + 37 + 41
        );
        assert_eq!(events["fallback_connections"], 15);
        assert_eq!(events["fallback_evictions"], 74);
        assert_eq!(events["fallback_learned_from_server"], 96);
        assert_eq!(events["fallback_misses"], 16 + 41);
        assert_eq!(
            events["to_client"], 650 + 1024 + 2048 + 4096 + 8192 + 16384 + 13000 + 1815 + 260,
            "server cookie + server plain + closes + replies that learnt a clock + SYN-ACKs without timestamps + moves + replies without timestamps + baseline replies too short + FINs without timestamps + l2 packets from a VIP address that are no TCP"
        );
        assert_eq!(
            events["fast_path"],
            680 + 1024 + 2048 + 100 + 90 + 13000 + 420 - 3 + 1815 + 43,
            "+ the server replies dropped (malformed options, a removed server's) + FINs without timestamps + cookies routing nowhere - the general path's + a baseline's pick for an empty pool"
        );
        assert_eq!(events["resets_without_timestamp"], 2048 + 8192);
        assert_eq!(events["cookie_routed"], 10 + 256);
        assert_eq!(events["cookies_inserted"], 514 + 1815);
        assert_eq!(events["options_fast_path"], 1624 + 420 - 9 + 1815 + 4 + 31);
        assert_eq!(events["handshake_count_moved"], 128 + 50);
        assert_eq!(events["server_closes"], 118 + 6000 + 302 + 303);
        assert_eq!(events["duplicate_closes"], 230 + 7000 + 304 + 305);
        assert_eq!(events["server_ts_clock_unstable"], 300 + 302 + 304);
        assert_eq!(events["server_ts_ahead_of_real_time"], 301 + 303 + 305);
        assert_eq!(events["ts_msb_learned"], 23);
        assert_eq!(events["ts_msb_advanced"], 33);
        assert_eq!(events["icmp_routed_by_cookie"], 400);
        assert_eq!(events["icmp_routed_by_fallback"], 700);
        assert_eq!(events["new_connections"], 1100);
        assert_eq!(events["syn_retransmissions"], 1012);
        assert_eq!(
            events["dropped"],
            10105 + 510 + 120 + 420 + 330 + 1000 + 230 + 240 + 250 + 31 + 37 + 41 + 43 + 47,
            "every kernel drop is a dropped verdict"
        );
        let drops: std::collections::BTreeMap<&str, u64> = counters
            .kernel_drops()
            .map(|(r, n)| (r.name(), n))
            .collect();
        assert_eq!(
            drops.len(),
            DropReason::COUNT,
            "every reason, zeros included"
        );
        assert_eq!(drops["tcp_option_truncated"], 1010);
        assert_eq!(drops["tcp_option_bad_length"], 2020);
        assert_eq!(drops["tcp_option_overrun"], 3030);
        assert_eq!(drops["bad_timestamp_option_length"], 4040);
        assert_eq!(drops["unsupported_fragment"], 5);
        assert_eq!(drops["unsupported_udp"], 60);
        assert_eq!(drops["unsupported_protocol"], 70);
        assert_eq!(drops["vip_port_unknown"], 80);
        assert_eq!(drops["server_removed"], 90 + 110);
        assert_eq!(drops["unknown_server_source"], 100);
        assert_eq!(drops["no_server_available"], 31 + 37 + 41 + 43 + 47);
        assert_eq!(drops["reply_from_client_side"], 120);
        assert_eq!(drops["cookie_unknown_server"], 130 + 160);
        assert_eq!(drops["cookie_server_removed"], 140 + 170);
        assert_eq!(drops["ts_msb_unknown"], 150);
        assert_eq!(drops["bad_ip_version"], 180);
        assert_eq!(drops["bad_ipv4_header_length"], 190);
        assert_eq!(drops["bad_ipv4_total_length"], 200);
        assert_eq!(drops["truncated_tcp"], 210);
        assert_eq!(drops["bad_tcp_data_offset"], 220);
        assert_eq!(drops["fallback_server_removed"], 230);
        assert_eq!(drops["truncated_icmp"], 240);
        assert_eq!(drops["unsupported_icmp_type"], 250);
        assert_eq!(
            drops.values().sum::<u64>(),
            10105 + 510 + 120 + 420 + 330 + 1000 + 230 + 240 + 250 + 31 + 37 + 41 + 43 + 47
        );
        let up: Vec<(&str, u64)> = counters.to_userspace().collect();
        assert_eq!(up[0], ("new_connection", 1));
        assert_eq!(up[6], ("other", 7));
        assert_eq!(up[7], ("publishing", 8));
        assert_eq!(up[8], ("icmp", 9));
        assert_eq!(up[9], ("fallback_miss", 10));
    }

    #[test]
    fn packet_rates_come_from_the_counters() {
        // Written out rather than taken from the core's testkit, which the daemon does
        // not build with.
        let config = LbConfig::from_toml(
            r#"
            [[servers]]
            id = 1
            dip = "10.1.0.1"
            mac = "02:00:00:01:00:01"
            [[servers]]
            id = 2
            dip = "10.1.0.2"
            mac = "02:00:00:01:00:02"
            [[vips]]
            address = "10.0.0.100"
            port = 80
            servers = [1, 2]
            "#,
        )
        .unwrap();
        let plane = ControlPlane::new(&config, &Secret([1; 16])).unwrap();
        let state = DaemonState::new(plane, Clock::start(), None);
        let counters = Arc::new(WorkerCounters::default());
        state.register_worker(0, 0, Arc::clone(&counters));
        let t0 = Instant::now();
        state.sample_rates(t0);
        assert_eq!(state.packet_rates(), vec![0.0]);
        counters.add(Counter::ToServer, 300);
        counters.add(Counter::Dropped, 100);
        state.sample_rates(t0 + Duration::from_secs(2));
        assert_eq!(state.packet_rates(), vec![200.0]);
    }
}
