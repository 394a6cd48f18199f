//! Runs one churn scenario: testbed up, LB and agents started, the load and the schedule
//! run side by side, drained servers removed once empty, then everything taken down and
//! the results written. Everything started here is stopped on every way out: the end, an
//! error, or a Ctrl-C (which stops the load early and still writes what it measured).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use cheetah_core::config::{Forwarding, Mode};
use cheetah_core::policy::PolicyKind;

use super::lb::{spawn_in_netns, tail, Lb};
use super::load::{self, ClientLoad, Workload, LONG_IDLE_CLASS};
use super::progress::{Progress, Status};
use super::results::{
    self, ChurnResults, CounterTotals, Event, LbMetrics, LoadSpread, LoadgenReport, NoTimestamps,
};
use super::schedule::{Action, Schedule, Step};
use super::{lbconfig, tsclock};
use crate::testbed::{self, pool, ready, Options, ServerClocks, Topology};

/// Clients behind the router; with c0 on the LB's own segment, four loadgens.
const CLIENTS: u16 = 3;
/// How long the LB stays down in a restart: long enough that clients retransmit into the
/// XDP program's drop (no socket bound), short of any request timeout.
const RESTART_DOWNTIME: Duration = Duration::from_secs(1);
/// A drained server is removed after this many polls (a second apart) in a row that find
/// it without connections...
const EMPTY_POLLS_BEFORE_REMOVE: u32 = 3;
/// ...and never sooner than this after an LB start: a new LB process counts no connection
/// until the agents' next reports, so a server looks empty for up to a second.
const FRESH_LB_GRACE: Duration = Duration::from_secs(3);
/// After the load, how long drained servers get to empty before the run ends without
/// removing them. A server may hold a half-open connection (SYN-RECV) for about a minute:
/// when a client retransmits its SYN, the policy may place the copy on another server, and
/// the server whose SYN-ACK the client did not take retransmits it until it gives up.
const POST_LOAD_DRAIN_WAIT: Duration = Duration::from_secs(30);
/// How long an instance may take to know every server's clock and health before it joins
/// the router's pool (its probes' first rounds).
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// What to run.
pub struct Config {
    pub mode: Mode,
    pub servers: u16,
    pub duration: Duration,
    pub prefix: String,
    pub forwarding: Forwarding,
    /// LB instances behind the router's ECMP route, all on one config and key.
    pub lbs: u16,
    pub out: PathBuf,
    pub workload: Workload,
    /// Clients whose TCP sends no timestamps (the last ones).
    pub clients_without_timestamps: u16,
    pub progress: bool,
}

/// Takes the testbed down however the run ends.
struct Teardown(String);

impl Drop for Teardown {
    fn drop(&mut self) {
        if let Err(e) = testbed::teardown(&self.0, false) {
            eprintln!(
                "churn: {e:#}; run `cheetah testbed down --prefix {}`",
                self.0
            );
        }
    }
}

/// The agents: killed when dropped (they run until then); the teardown would end them too,
/// as it ends whatever runs in the testbed's namespaces.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A running loadgen; killed if dropped before it exited (on an error).
struct Loadgen {
    load: ClientLoad,
    child: Child,
    /// When it was spawned, on the scenario's clock (its load starts a little later).
    spawned_at: f64,
    log: PathBuf,
    report: PathBuf,
    /// It runs only the client's long idle sessions, which its report calls `idle`.
    long_idle: bool,
    exited: bool,
}

impl Drop for Loadgen {
    fn drop(&mut self) {
        if !self.exited {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A drained server the runner waits to remove.
struct DrainWatch {
    drained_at: f64,
    empty_polls: u32,
    /// Its open connections at the last poll, for the progress line.
    open: Option<u64>,
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `<mode>` names the results (`<mode>.json`, `<mode>-logs/`) of a one-instance run,
/// `<mode>-<n>lbs` those of a run with n instances, so both fit in one results folder.
pub fn results_stem(mode: Mode, lbs: u16) -> String {
    if lbs == 1 {
        mode.name().to_string()
    } else {
        format!("{}-{lbs}lbs", mode.name())
    }
}

pub fn run(config: &Config) -> anyhow::Result<PathBuf> {
    let mode = config.mode.name();
    let stem = results_stem(config.mode, config.lbs);
    let schedule = Schedule::new(config.servers, config.duration)?;
    let logs = config.out.join(format!("{stem}-logs"));
    if logs.exists() {
        std::fs::remove_dir_all(&logs)
            .with_context(|| format!("cannot clear {}", logs.display()))?;
    }
    std::fs::create_dir_all(&logs).with_context(|| format!("cannot create {}", logs.display()))?;
    let logs = std::path::absolute(&logs)?;
    let interrupted = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, Arc::clone(&interrupted))?;
    }
    let mut progress = Progress::new(config.progress, mode);

    progress.say(&format!(
        "churn [{stem}]: testbed `{}` with {} LB instance(s), {} servers, {} forwarding",
        config.prefix,
        config.lbs,
        config.servers,
        config.forwarding.name()
    ));
    let _teardown = Teardown(config.prefix.clone());
    let topo = Topology::up(&Options {
        prefix: config.prefix.clone(),
        lbs: config.lbs,
        servers: config.servers,
        clients: CLIENTS,
        forwarding: config.forwarding,
        mode: config.mode,
        policy: PolicyKind::RoundRobin,
        dir: None,
        server_clocks: ServerClocks::Distinct,
        clients_without_timestamps: config.clients_without_timestamps,
    })?;
    let lb_config = lbconfig::write(&topo.files.config, &schedule.initial_pool)?;
    let exe = std::env::current_exe().context("cannot find the cheetah binary")?;
    // Each instance's API on its server-side address, where the servers' agents reach it.
    let apis: Vec<String> = topo
        .lbs()
        .map(|lb| {
            let address = lb.server_side.address.expect("lb-s has an address");
            format!("{address}:{}", lbconfig::API_PORT)
        })
        .collect();
    let mut lbs = Vec::new();
    for (instance, api) in topo.lbs().zip(&apis) {
        let mut lb = Lb::new(&instance.namespace, &exe, &lb_config, api, &logs);
        if instance.instance > 1 {
            lb = lb.instance(&format!("lb{}", instance.instance), &instance.state_dir);
        }
        lb.start()?;
        lbs.push(lb);
    }
    if config.lbs > 1 {
        // The pool of a several-instance testbed starts empty: each joins once ready.
        for (instance, api) in topo.lbs().zip(&apis) {
            ready::wait(instance, api, READY_TIMEOUT)?;
            pool::join(&topo, instance)?;
        }
    }

    let mut agents = Children(Vec::new());
    for server in &topo.servers {
        let mut args: Vec<String> = ["testbed", "agent", "--id", &server.id.to_string()]
            .iter()
            .map(|s| s.to_string())
            .collect();
        for api in &apis {
            args.extend(["--api".to_string(), api.clone()]);
        }
        let log = logs.join(format!("agent-{}.log", server.name));
        agents
            .0
            .push(spawn_in_netns(&server.namespace, &exe, &args, &log)?);
    }

    let mut runner = Runner {
        config,
        topo: &topo,
        lbs,
        events: Vec::new(),
        draining: BTreeMap::new(),
        spread_samples: Vec::new(),
        counters: CounterTotals::default(),
        active_servers: schedule.initial_pool.len(),
        start: Instant::now(),
        start_unix_ms: 0,
        progress,
    };
    let stop_file = logs.join("stop");
    let clients: Vec<(String, String)> = topo
        .clients
        .iter()
        .map(|c| (c.name.clone(), c.namespace.clone()))
        .collect();
    let target = format!("{}:{}", topo.vip, topo.vip_port);
    runner.start = Instant::now();
    runner.start_unix_ms = unix_ms();
    let msb_clock_at_start = tsclock::monotonic_ms();
    let pool: Vec<String> = schedule
        .initial_pool
        .iter()
        .map(|id| format!("s{id}"))
        .collect();
    runner.event(
        "start",
        "load starts".into(),
        format!(
            "{} running with pool {} of {} servers, policy rr, mode {mode}",
            if config.lbs == 1 {
                "LB".to_string()
            } else {
                format!("{} LB instances (ECMP)", config.lbs)
            },
            pool.join(" "),
            config.servers
        ),
    );

    let mut loadgens = Vec::new();
    for load in load::split(&config.workload, &clients) {
        let report = logs.join(format!("loadgen-{}.json", load.client));
        let log = logs.join(format!("loadgen-{}.log", load.client));
        let args = load.loadgen_args(
            &config.workload,
            &target,
            config.duration,
            &report,
            &stop_file,
        );
        let long_idle = load.long_idle_loadgen_args(
            &config.workload,
            &target,
            config.duration,
            &logs.join(format!("loadgen-{}-long-idle.json", load.client)),
            &stop_file,
        );
        let spawned_at = runner.now();
        let child = spawn_in_netns(&load.namespace, &exe, &args, &log)?;
        loadgens.push(Loadgen {
            load: load.clone(),
            child,
            spawned_at,
            log,
            report,
            long_idle: false,
            exited: false,
        });
        if let Some(args) = long_idle {
            let log = logs.join(format!("loadgen-{}-long-idle.log", load.client));
            let report = logs.join(format!("loadgen-{}-long-idle.json", load.client));
            let spawned_at = runner.now();
            let child = spawn_in_netns(&load.namespace, &exe, &args, &log)?;
            loadgens.push(Loadgen {
                load,
                child,
                spawned_at,
                log,
                report,
                long_idle: true,
                exited: false,
            });
        }
    }
    // Every server's clock has an offset of its own (docs/testbed.md, "Server clocks"), so
    // each changes its MSB at its own moments; s1's are marked, one every period.
    let s1_clock_at_start =
        u64::from((msb_clock_at_start as u32).wrapping_add(topo.servers[0].clock_offset));
    for t in tsclock::msb_changes(s1_clock_at_start, config.duration) {
        let msb = tsclock::msb_at(s1_clock_at_start + (t * 1000.0) as u64);
        runner.events.push(Event {
            t,
            kind: "ts_msb_change".into(),
            label: "s1's TS MSB changes".into(),
            detail: format!(
                "s1's TSval high 16 bits become {msb:#06x}; the other servers' change as often, at their own moments"
            ),
        });
    }

    let interrupted_at =
        runner.run_load(&schedule.steps, &mut loadgens, &interrupted, &stop_file)?;
    let load_end = runner.now();
    runner.event(
        "load_stop",
        "load stopped".into(),
        match interrupted_at {
            Some(t) => format!("interrupted at {t:.1} s"),
            None => "every loadgen finished".into(),
        },
    );
    runner.remove_drained_after_load(&interrupted);
    let mut final_snapshot = String::new();
    for index in 0..runner.lbs.len() {
        let text = runner.lbs[index].metrics().unwrap_or_default();
        runner.counters.observe(index, &text);
        final_snapshot.push_str(&text);
    }
    for lb in &mut runner.lbs {
        lb.stop();
    }
    drop(agents);
    runner.progress.finish();

    let results = runner.results(
        &loadgens,
        &schedule,
        load_end,
        interrupted_at,
        final_snapshot,
    )?;
    let path = config.out.join(format!("{stem}.json"));
    let mut json = serde_json::to_string_pretty(&results)?;
    json.push('\n');
    std::fs::write(&path, json).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

struct Runner<'a> {
    config: &'a Config,
    topo: &'a Topology,
    /// One per LB instance, in instance order.
    lbs: Vec<Lb>,
    events: Vec<Event>,
    draining: BTreeMap<u16, DrainWatch>,
    spread_samples: Vec<f64>,
    /// The highlighted counters over every LB process of the run.
    counters: CounterTotals,
    active_servers: usize,
    start: Instant,
    /// `start` on the wall clock, which loadgens report their own start on.
    start_unix_ms: u64,
    progress: Progress,
}

impl Runner<'_> {
    fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    fn event(&mut self, kind: &str, label: String, detail: String) {
        self.event_at(self.now(), kind, label, detail);
    }

    /// An event that began at `t` (a restart is logged once it is done).
    fn event_at(&mut self, t: f64, kind: &str, label: String, detail: String) {
        let text = if detail.is_empty() {
            format!("  {t:6.1}s  {label}")
        } else {
            format!("  {t:6.1}s  {label}: {detail}")
        };
        self.progress.say(&text);
        self.events.push(Event {
            t,
            kind: kind.into(),
            label,
            detail,
        });
    }

    /// Runs the schedule while the loadgens run; returns when they have all exited, with the
    /// time of a Ctrl-C if there was one.
    fn run_load(
        &mut self,
        steps: &[Step],
        loadgens: &mut [Loadgen],
        interrupted: &AtomicBool,
        stop_file: &Path,
    ) -> anyhow::Result<Option<f64>> {
        let mut next_step = 0;
        let mut next_poll = Duration::ZERO;
        let mut interrupted_at = None;
        loop {
            if interrupted.load(Ordering::Relaxed) && interrupted_at.is_none() {
                interrupted_at = Some(self.now());
                std::fs::write(stop_file, "stop\n")?;
                self.progress
                    .say("churn: interrupted; stopping the load (results are still written)");
            }
            while interrupted_at.is_none()
                && next_step < steps.len()
                && self.start.elapsed() >= steps[next_step].at
            {
                self.apply(&steps[next_step].action)?;
                next_step += 1;
            }
            if self.start.elapsed() >= next_poll {
                next_poll = self.start.elapsed() + Duration::from_secs(1);
                self.poll_servers();
                // A kill -9 then loses at most a second of its workers' counts.
                for index in 0..self.lbs.len() {
                    self.observe_metrics(index);
                }
                self.show_progress(loadgens);
            }
            for lb in &mut self.lbs {
                lb.check_running()?;
            }
            for loadgen in loadgens.iter_mut().filter(|l| !l.exited) {
                if let Some(status) = loadgen.child.try_wait()? {
                    loadgen.exited = true;
                    if !status.success() {
                        bail!(
                            "loadgen in {} exited with {status}:\n{}",
                            loadgen.load.namespace,
                            tail(&loadgen.log)
                        );
                    }
                }
            }
            if loadgens.iter().all(|l| l.exited) {
                return Ok(interrupted_at);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Applies one step; its event carries the time the step began, since the LB acts on a
    /// change as soon as its API answers.
    fn apply(&mut self, action: &Action) -> anyhow::Result<()> {
        let t = self.now();
        let vip = format!("{}:{}", self.topo.vip, self.topo.vip_port);
        match action {
            Action::Add(id) => {
                let server = self
                    .topo
                    .servers
                    .iter()
                    .find(|s| s.id == *id)
                    .with_context(|| format!("the testbed has no server {id}"))?;
                let (dip, mac) = (server.dip.to_string(), server.mac.clone());
                self.ctl_all(&[
                    "servers",
                    "add",
                    "--id",
                    &id.to_string(),
                    "--dip",
                    &dip,
                    "--mac",
                    &mac,
                    "--vip",
                    &vip,
                    "--draining",
                ])?;
                // Known to every instance before any sends it a connection: its replies
                // cross all of them (docs/operations.md, "Add a server in two steps").
                self.ctl_all(&["servers", "activate", &id.to_string()])?;
                self.active_servers += 1;
                self.event_at(
                    t,
                    "add",
                    action.label(),
                    format!("{dip} joins the pool of {vip}"),
                );
            }
            Action::Drain(id) => {
                self.ctl_all(&["servers", "drain", &id.to_string()])?;
                self.draining.insert(
                    *id,
                    DrainWatch {
                        drained_at: t,
                        empty_polls: 0,
                        open: None,
                    },
                );
                self.active_servers -= 1;
                self.event_at(
                    t,
                    "drain",
                    action.label(),
                    "no new connections; removed once it has none left".into(),
                );
            }
            Action::Policy { policy, metric } => {
                self.ctl_all(&["policy", "set", &vip, policy.name(), "--metric", metric])?;
                self.event_at(t, "policy", action.label(), format!("load metric {metric}"));
            }
            Action::GracefulRestart | Action::KillRestart => {
                let began = Instant::now();
                for index in 0..self.lbs.len() {
                    self.restart(index, action)?;
                }
                let detail = if self.lbs.len() == 1 {
                    format!(
                        "forwarding again after {:.1} s (state file: tables, MSBs)",
                        began.elapsed().as_secs_f64()
                    )
                } else {
                    format!(
                        "{} instances one at a time, each out of the router's pool until ready again; all back after {:.1} s",
                        self.lbs.len(),
                        began.elapsed().as_secs_f64()
                    )
                };
                self.event_at(t, "restart", action.label(), detail);
            }
        }
        Ok(())
    }

    /// `cheetah ctl ARGS` on every instance: they all run the same pool and policy.
    fn ctl_all(&self, args: &[&str]) -> anyhow::Result<()> {
        for lb in &self.lbs {
            lb.ctl(args)?;
        }
        Ok(())
    }

    /// Restarts instance `index`. Alone, it is the router's only next hop and stays so (the
    /// router sends into the XDP program's drop meanwhile). One of several leaves the pool
    /// first (a graceful restart) or right after its crash (kill -9: the router notices),
    /// and joins it again once ready.
    fn restart(&mut self, index: usize, action: &Action) -> anyhow::Result<()> {
        // What this process counted since the last scrape: its workers' counters start
        // from zero in the next one.
        self.observe_metrics(index);
        let alone = self.lbs.len() == 1;
        let instance = self
            .topo
            .lbs()
            .nth(index)
            .context("one testbed instance per LB")?;
        let lb = &mut self.lbs[index];
        if alone {
            if *action == Action::GracefulRestart {
                lb.graceful_restart(RESTART_DOWNTIME)?;
            } else {
                lb.kill_restart(RESTART_DOWNTIME)?;
            }
            self.observe_metrics(index);
            return Ok(());
        }
        if *action == Action::GracefulRestart {
            pool::leave(self.topo, instance)?;
            lb.graceful_stop()?;
        } else {
            lb.kill();
            pool::leave(self.topo, instance)?;
        }
        std::thread::sleep(RESTART_DOWNTIME);
        lb.start()?;
        let api = lb.api().to_string();
        ready::wait(instance, &api, READY_TIMEOUT)?;
        // Before its workers' fresh counters can grow past the old ones unseen.
        self.observe_metrics(index);
        pool::join(self.topo, instance)
    }

    /// Scrapes instance `index` into the run's counters; an instance that does not answer
    /// is read at the next scrape.
    fn observe_metrics(&mut self, index: usize) {
        if let Ok(text) = self.lbs[index].metrics() {
            self.counters.observe(index, &text);
        }
    }

    /// Reads `/servers`: samples the load spread and removes drained servers that have
    /// stayed empty. An LB that is restarting does not answer; the next poll will.
    fn poll_servers(&mut self) {
        // The agents report to every instance alike: one instance's view is theirs.
        let Some(servers) = self
            .lbs
            .iter()
            .find_map(|lb| lb.ctl(&["servers", "list"]).ok())
        else {
            return;
        };
        if let Some(spread) = results::active_spread(&servers) {
            self.spread_samples.push(spread);
        }
        let settled = self
            .lbs
            .iter()
            .all(|lb| lb.up_since.elapsed() >= FRESH_LB_GRACE);
        let mut empty = Vec::new();
        for (id, watch) in &mut self.draining {
            let open = servers["servers"]
                .as_array()
                .and_then(|all| all.iter().find(|s| s["id"] == *id))
                .and_then(|s| s["active_connections"].as_u64());
            watch.open = open;
            if settled && open == Some(0) {
                watch.empty_polls += 1;
            } else {
                watch.empty_polls = 0;
            }
            if watch.empty_polls >= EMPTY_POLLS_BEFORE_REMOVE {
                empty.push((*id, watch.drained_at));
            }
        }
        for (id, drained_at) in empty {
            match self.ctl_all(&["servers", "remove", &id.to_string()]) {
                Ok(_) => {
                    self.draining.remove(&id);
                    let waited = self.now() - drained_at;
                    self.event(
                        "remove",
                        format!("remove s{id}"),
                        format!(
                            "no connection left, {waited:.0} s after the drain; id quarantined"
                        ),
                    );
                }
                Err(e) => self.progress.say(&format!("churn: {e:#}")),
            }
        }
    }

    /// Gives drained servers a little time to empty once the load has closed its
    /// connections, then removes them (or reports them as not removed).
    /// After a Ctrl-C the user wants out: no waiting.
    fn remove_drained_after_load(&mut self, interrupted: &AtomicBool) {
        let deadline = Instant::now() + POST_LOAD_DRAIN_WAIT;
        while !self.draining.is_empty()
            && Instant::now() < deadline
            && !interrupted.load(Ordering::Relaxed)
        {
            self.poll_servers();
            std::thread::sleep(Duration::from_secs(1));
        }
    }

    fn show_progress(&mut self, loadgens: &[Loadgen]) {
        let (mut live, mut broken) = (0, 0);
        for loadgen in loadgens {
            let text = std::fs::read_to_string(&loadgen.log).unwrap_or_default();
            if let Some((l, b)) = load::last_progress(&text) {
                live += l;
                broken += b;
            }
        }
        let last_event = self
            .events
            .iter()
            .rfind(|e| e.t <= self.now() && e.kind != "start")
            .map(|e| format!("{:.0}s {}", e.t, e.label));
        let status = Status {
            elapsed: self.start.elapsed(),
            duration: self.config.duration,
            live,
            broken,
            active_servers: self.active_servers,
            draining: self
                .draining
                .iter()
                .map(|(id, watch)| (*id, watch.open))
                .collect(),
            last_event,
        };
        self.progress.update(&status);
    }

    fn results(
        &self,
        loadgens: &[Loadgen],
        schedule: &Schedule,
        load_end: f64,
        interrupted_at: Option<f64>,
        final_snapshot: String,
    ) -> anyhow::Result<ChurnResults> {
        let mut reports = Vec::new();
        let mut report_paths = Vec::new();
        // Which clients send no timestamps: their connections are also counted apart.
        let without_timestamps: Vec<String> = self
            .topo
            .clients
            .iter()
            .filter(|c| !c.timestamps)
            .map(|c| c.name.clone())
            .collect();
        let mut reports_without_timestamps = Vec::new();
        for loadgen in loadgens {
            let text = std::fs::read_to_string(&loadgen.report).with_context(|| {
                format!(
                    "loadgen in {} wrote no report:\n{}",
                    loadgen.load.namespace,
                    tail(&loadgen.log)
                )
            })?;
            let mut report: LoadgenReport = serde_json::from_str(&text)
                .with_context(|| format!("{} is not a loadgen report", loadgen.report.display()))?;
            if loadgen.long_idle {
                report = report.with_class_renamed("idle", LONG_IDLE_CLASS);
            }
            // Breaks are timed from the loadgen's own start, which follows its spawn by the
            // time it takes to start and check the target: put them on the scenario's clock.
            let offset = if report.started_at_unix_ms > 0 {
                (report.started_at_unix_ms as f64 - self.start_unix_ms as f64) / 1000.0
            } else {
                loadgen.spawned_at
            };
            if without_timestamps.contains(&loadgen.load.client) {
                reports_without_timestamps.push((offset, report.clone()));
            }
            reports.push((offset, report));
            let relative = loadgen
                .report
                .strip_prefix(std::path::absolute(&self.config.out)?)
                .unwrap_or(&loadgen.report);
            report_paths.push(relative.to_string_lossy().into_owned());
        }
        let (merged, broken) = results::merge(&reports);
        let (apart, _) = results::merge(&reports_without_timestamps);
        let no_timestamps = NoTimestamps {
            clients: without_timestamps,
            requests: apart.requests,
            connections_opened: apart.connections_opened,
            connections_broken: apart.connections_broken,
            broken_by_kind: apart.broken_by_kind,
            broken_by_class: apart.broken_by_class,
        };
        let seconds = self.config.duration.as_secs().max(load_end as u64);
        let spread = LoadSpread {
            requests_max_over_mean: results::max_over_mean(merged.requests_per_server.values()),
            live_sessions_max_over_mean: results::max_over_mean(
                merged.live_sessions_per_server.values(),
            ),
            active_connections_max_over_mean: (!self.spread_samples.is_empty()).then(|| {
                self.spread_samples.iter().sum::<f64>() / self.spread_samples.len() as f64
            }),
            requests_per_server: merged.requests_per_server,
            live_sessions_per_server: merged.live_sessions_per_server,
        };
        let mut events = self.events.clone();
        events.sort_by(|a, b| a.t.total_cmp(&b.t));
        let workload = &self.config.workload;
        Ok(ChurnResults {
            mode: self.config.mode.name().into(),
            lbs: self.config.lbs,
            forwarding: self.config.forwarding.name().into(),
            servers: self.config.servers,
            initial_pool: schedule.initial_pool.clone(),
            duration_s: self.config.duration.as_secs_f64(),
            elapsed_s: interrupted_at.unwrap_or(load_end),
            interrupted: interrupted_at.is_some(),
            workload: results::Workload {
                clients: loadgens
                    .iter()
                    .filter(|l| !l.long_idle)
                    .map(|l| l.load.client.clone())
                    .collect(),
                keepalive: workload.keepalive,
                idle_sessions: workload.idle_sessions,
                idle_gap_s: workload.idle_gap.as_secs_f64(),
                long_idle_sessions: workload.long_idle_sessions,
                long_idle_gap_s: workload.long_idle_gap.as_secs_f64(),
                downloads: workload.downloads,
                short_rate: workload.short_rate,
            },
            requests: merged.requests,
            connections_opened: merged.connections_opened,
            connections_broken: merged.connections_broken,
            broken_by_kind: merged.broken_by_kind,
            broken_by_class: merged.broken_by_class,
            no_timestamps,
            long_lived_at_end: merged.long_lived_at_end,
            unfinished_at_stop: merged.unfinished_at_stop,
            load_spread: spread,
            broken_per_second: results::per_second(&broken, seconds),
            broken,
            events,
            not_removed: self.draining.keys().copied().collect(),
            lb_metrics: LbMetrics {
                totals: self.counters.totals().clone(),
                final_snapshot,
            },
            loadgen_reports: report_paths,
        })
    }
}
