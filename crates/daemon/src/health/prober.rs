//! The prober: one thread per instance that probes every server of every VIP every
//! `interval_ms`, decides health from the outcomes, teaches the clock table what each
//! SYN-ACK says, and applies the decisions to the control plane's health overlay. It works
//! beside the data path, never on it: the workers only see the snapshots it causes.
//!
//! One round of its loop: follow the tables when a new snapshot was published (targets
//! come and go with pools and servers), send the probes that are due, wait on the raw
//! socket until the next deadline (at most `TICK`, 20 ms), match the answers, time out the
//! probes not answered in `timeout_ms`, and take the HTTP checks' results, which run on
//! threads of their own since a connection blocks.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cheetah_core::config::HealthConfig;
use cheetah_core::tables::control::VipKey;
use cheetah_core::tables::{Health, SlotState};

use super::book::TargetKey;
use super::http_check;
use super::state::{HealthMachine, ProbeOutcome, Thresholds};
use super::syn_probe::{SentSyn, SynAnswer, SynProber};
use crate::state::DaemonState;

/// The longest the loop sleeps: how late a stop or a change of the tables is noticed.
const TICK: Duration = Duration::from_millis(20);

/// One server of one VIP, as probed.
struct Target {
    server: SocketAddrV4,
    settings: HealthConfig,
    machine: HealthMachine,
    next_probe: Instant,
    /// The SYN in flight and when it times out.
    syn: Option<(SentSyn, Instant)>,
    /// An HTTP check is running (`http_path` set).
    http_running: bool,
    /// Said once: the server's SYN-ACK carries no timestamps, so its clock cannot be
    /// learnt (its connections cannot be balanced by cookie).
    warned_no_timestamps: bool,
}

impl Target {
    fn new(server: SocketAddrV4, settings: HealthConfig, now: Instant) -> Self {
        Target {
            server,
            settings,
            machine: HealthMachine::new(now),
            next_probe: now,
            syn: None,
            http_running: false,
            warned_no_timestamps: false,
        }
    }

    fn thresholds(&self) -> Thresholds {
        Thresholds {
            fall: self.settings.fall,
            rise: self.settings.rise,
        }
    }

    /// Whether the SYN decides health (else the HTTP check does, and the SYN only teaches
    /// the clock).
    fn syn_decides(&self) -> bool {
        self.settings.http_path.is_none()
    }
}

pub struct Prober {
    state: Arc<DaemonState>,
    syn: SynProber,
    targets: BTreeMap<TargetKey, Target>,
    http_results: Receiver<(TargetKey, ProbeOutcome)>,
    http_sender: Sender<(TargetKey, ProbeOutcome)>,
    failing_open: Vec<VipKey>,
    /// The snapshot generation `follow_tables` last read the tables at: targets, marks and
    /// failing-open VIPs change only with the tables, so a round without a new generation
    /// need not lock the control plane.
    followed: Option<u64>,
    started: Instant,
}

impl Prober {
    pub fn new(state: Arc<DaemonState>) -> std::io::Result<Self> {
        let syn = SynProber::open()?;
        tracing::info!(source_ports = ?syn.source_ports(), "health probes: raw socket open");
        let (http_sender, http_results) = channel();
        Ok(Prober {
            state,
            syn,
            targets: BTreeMap::new(),
            http_results,
            http_sender,
            failing_open: Vec::new(),
            followed: None,
            started: Instant::now(),
        })
    }

    /// Probes until `stop` is set.
    pub fn run(mut self, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            self.round(Instant::now());
        }
    }

    /// One round (see the module's doc).
    pub fn round(&mut self, now: Instant) {
        // Read before following: a change made meanwhile is followed next round.
        let generation = self.state.shared.snapshot.generation();
        if self.followed != Some(generation) {
            self.follow_tables(now);
            self.followed = Some(generation);
        }
        self.send_due(now);
        self.wait(now);
        let now = Instant::now();
        self.take_answers(now);
        self.time_out(now);
        while let Ok((key, outcome)) = self.http_results.try_recv() {
            if let Some(target) = self.targets.get_mut(&key) {
                target.http_running = false;
            }
            self.record(key, outcome, now);
        }
    }

    /// Targets from the tables: every member of every IPv4 VIP that is active or draining
    /// (a draining server still serves connections whose packets need its clock). Keeps
    /// the overlay equal to the decisions and logs VIPs that begin or stop failing open.
    fn follow_tables(&mut self, now: Instant) {
        let mut control = self.state.control();
        let states: HashMap<_, _> = control
            .servers(0)
            .into_iter()
            .map(|s| (s.id, (s.state, s.dip)))
            .collect();
        let mut seen = BTreeSet::new();
        for vip in control.vips() {
            if !matches!(vip.address, IpAddr::V4(_)) {
                continue;
            }
            let key = (vip.address, vip.port);
            for (id, _) in &vip.members {
                let Some((state, dip)) = states.get(id) else {
                    continue;
                };
                if !matches!(state, SlotState::Active | SlotState::Draining) {
                    continue;
                }
                let server = SocketAddrV4::new(*dip, vip.health_port());
                let target_key = (key, *id);
                seen.insert(target_key);
                let fresh = match self.targets.get(&target_key) {
                    // Another machine under the same id (after its quarantine), or other
                    // settings: decide again from scratch.
                    Some(t) => t.server != server || t.settings != vip.health,
                    None => true,
                };
                if fresh {
                    let target = Target::new(server, vip.health.clone(), now);
                    self.state.health.update(target_key, &target.machine, None);
                    self.targets.insert(target_key, target);
                }
            }
        }
        self.targets.retain(|key, _| seen.contains(key));
        self.state.health.retain(&seen);
        for (key, target) in &self.targets {
            let decided = target.machine.state();
            if control.health(key.0, key.1) != decided {
                // Only fails if the target left its pool meanwhile; it goes next round.
                let _ = control.set_health(key.0, key.1, decided);
            }
        }
        let failing_open = control.failing_open();
        drop(control);
        if failing_open != self.failing_open {
            for vip in failing_open
                .iter()
                .filter(|v| !self.failing_open.contains(v))
            {
                tracing::error!(
                    vip = %SocketAddr::new(vip.0, vip.1),
                    "every active server of this VIP is down: failing open, new connections go to all of them"
                );
            }
            for vip in self
                .failing_open
                .iter()
                .filter(|v| !failing_open.contains(v))
            {
                tracing::info!(vip = %SocketAddr::new(vip.0, vip.1), "no longer failing open");
            }
            self.failing_open = failing_open;
        }
    }

    fn send_due(&mut self, now: Instant) {
        let tsval = self.started.elapsed().as_millis() as u32;
        let mut failed = Vec::new();
        for (key, target) in &mut self.targets {
            if target.next_probe > now {
                continue;
            }
            let interval = Duration::from_millis(target.settings.interval_ms);
            target.next_probe = (target.next_probe + interval).max(now);
            let timeout = Duration::from_millis(target.settings.timeout_ms);
            match self.syn.send(target.server, tsval) {
                Ok(sent) => target.syn = Some((sent, now + timeout)),
                Err(e) if target.syn_decides() => {
                    failed.push((*key, ProbeOutcome::Failed(format!("cannot send: {e}"))));
                }
                Err(e) => {
                    tracing::debug!(server = %target.server, error = %e, "cannot send the clock probe")
                }
            }
            if let (Some(path), false) = (&target.settings.http_path, target.http_running) {
                target.http_running = true;
                let (key, server, path, results) =
                    (*key, target.server, path.clone(), self.http_sender.clone());
                let spawned =
                    std::thread::Builder::new()
                        .name("cheetah-hc".into())
                        .spawn(move || {
                            let _ = results.send((key, http_check::check(server, &path, timeout)));
                        });
                if let Err(e) = spawned {
                    target.http_running = false;
                    failed.push((key, ProbeOutcome::Failed(format!("http: no thread: {e}"))));
                }
            }
        }
        for (key, outcome) in failed {
            self.record(key, outcome, now);
        }
    }

    /// Sleeps on the raw socket until an answer comes, the next probe or timeout is due,
    /// or [`TICK`] passed.
    fn wait(&self, now: Instant) {
        let next = self
            .targets
            .values()
            .flat_map(|t| [Some(t.next_probe), t.syn.map(|(_, deadline)| deadline)])
            .flatten()
            .min()
            .map_or(TICK, |at| at.saturating_duration_since(now))
            .min(TICK);
        let mut poll = libc::pollfd {
            fd: self.syn.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut poll, 1, next.as_millis() as i32) };
    }

    fn take_answers(&mut self, now: Instant) {
        let segments = self.syn.receive();
        if segments.is_empty() {
            return;
        }
        let mut outcomes = Vec::new();
        for segment in segments {
            let answered = self.targets.iter_mut().find_map(|(key, target)| {
                let (sent, _) = target.syn?;
                segment.answers(&sent).map(|answer| (*key, target, answer))
            });
            let Some((key, target, answer)) = answered else {
                continue;
            };
            target.syn = None;
            let outcome = match answer {
                SynAnswer::SynAck { tsval: Some(tsval) } => {
                    self.state
                        .shared
                        .msb
                        .learn_probe(key.1, tsval, self.state.now());
                    ProbeOutcome::SynAck
                }
                SynAnswer::SynAck { tsval: None } => {
                    if !target.warned_no_timestamps {
                        target.warned_no_timestamps = true;
                        tracing::warn!(
                            server = key.1.0,
                            address = %target.server,
                            "the server answers probes without TCP timestamps: its clock cannot be learnt (enable net.ipv4.tcp_timestamps on it)"
                        );
                    }
                    ProbeOutcome::SynAck
                }
                SynAnswer::Reset => ProbeOutcome::Refused,
            };
            if target.syn_decides() {
                outcomes.push((key, outcome));
            }
        }
        for (key, outcome) in outcomes {
            self.record(key, outcome, now);
        }
    }

    fn time_out(&mut self, now: Instant) {
        let mut timed_out = Vec::new();
        for (key, target) in &mut self.targets {
            if let Some((_, deadline)) = target.syn {
                if deadline <= now {
                    target.syn = None;
                    if target.syn_decides() {
                        timed_out.push(*key);
                    }
                }
            }
        }
        for key in timed_out {
            self.record(key, ProbeOutcome::Timeout, now);
        }
    }

    /// One probe's outcome: the state machine, the book, and on a change the overlay.
    fn record(&mut self, key: TargetKey, outcome: ProbeOutcome, now: Instant) {
        let Some(target) = self.targets.get_mut(&key) else {
            return;
        };
        let changed = target.machine.record(&outcome, target.thresholds(), now);
        self.state
            .health
            .update(key, &target.machine, Some(&outcome));
        let Some(health) = changed else {
            return;
        };
        let vip = SocketAddr::new(key.0 .0, key.0 .1);
        let reason = target.machine.reason().to_string();
        match health {
            Health::Down => {
                tracing::warn!(%vip, server = key.1.0, %reason, "server down: no new connections from this VIP (its connections keep going)")
            }
            _ => {
                tracing::info!(%vip, server = key.1.0, %reason, state = health.name(), "server health decided")
            }
        }
        let _ = self.state.control().set_health(key.0, key.1, health);
    }
}
