//! `cheetah run`: the load balancer daemon on real interfaces.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use cheetah_core::hash::Secret;
use cheetah_core::lb::{Ingress, LbShared, Worker, WorkerConfig};

use crate::config::{read_key_file, DaemonConfig, FileConfig, KeyFile};
use crate::dataplane::awrr_schedules::AwrrSchedules;
use crate::dataplane::kernel_loads::KernelLoads;
use crate::dataplane::next_hops::NextHopMirror;
use crate::dataplane::pin;
use crate::dataplane::sides::{log_sides, InterfaceSides, SideSource};
use crate::dataplane::worker_loop::DataPath;
use crate::dataplane::xdp::{self, SteeringProgram};
use crate::dataplane::xdp_policy::PolicySeeds;
use crate::dataplane::xdp_tables::{Publication, Publisher};
use crate::dataplane::xsk::WorkerPorts;
use crate::dataplane::Interface;
use crate::dataplane::{host, host_addrs};
use crate::persist::Persister;
use crate::{api, health, saver, Clock, DaemonState, InterfaceStatus};

#[derive(clap::Args)]
pub struct Args {
    /// The config file (see the README's config reference).
    #[arg(long)]
    config: PathBuf,
    /// Create the secret file with a fresh random key if it does not exist. Every LB
    /// instance behind the same routers must share one key: copy the file, do not
    /// create one per instance.
    #[arg(long)]
    init_secret: bool,
    /// Use this state folder instead of the config's `[daemon] state_dir`: instances that
    /// share one config file on one filesystem each need a folder of their own.
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Take the XDP program off the config's interfaces and exit. (A stopped LB leaves it
    /// attached on purpose: it drops VIP traffic so the host never resets connections.)
    #[arg(long)]
    unload: bool,
    /// Test-only fault injection (hidden): break the LB on purpose so that a test can show
    /// its check notices. Never use it in production.
    #[arg(long = "fault", hide = true, value_enum)]
    faults: Vec<Fault>,
}

/// Deliberate bugs for the live tests (`--fault`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Fault {
    /// Route client packets by their cookie but leave the cookie in TSecr: servers see
    /// TSecr values they never sent (`Worker::set_restore_tsecr(false)`).
    SkipTsecrRestore,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let file = FileConfig::load(&args.config)?;
    let mut daemon = file
        .daemon
        .clone()
        .context("the config has no [daemon] section (daemon.interfaces is required to run)")?;
    if let Some(state_dir) = args.state_dir {
        daemon.state_dir = state_dir;
    }
    let pin_dir = daemon.pin_dir()?;
    if args.unload {
        for name in &daemon.interfaces {
            let iface = Interface::discover(name, 0)?;
            xdp::detach(name, iface.ifindex)?;
            tracing::info!(interface = %name, "XDP program detached");
        }
        // Without the program its state keeps no connection: the next start is fresh.
        pin_dir.forget()?;
        tracing::info!(dir = %pin_dir.path().display(), "pinned XDP maps removed");
        return Ok(());
    }
    let secret_path = file.secret_file.clone().context(
        "secret_file: required (a file with 32 hex digits; create it with --init-secret)",
    )?;
    let secret = load_or_create_secret(&secret_path, args.init_secret, file.lb.cookie_epoch_bits)?;
    let persister = Persister::new(&daemon.state_dir, &file.lb)?;
    // Loaded before the control plane is built, whose clock table lives in the program's
    // msb_seen and msb_restores arrays, whose handshake table in its handshakes array and
    // whose fallback table in its fallback array: the kernel restores, learns, books SYNs
    // and looks flows up in the same words. Over the maps an earlier run pinned, if any
    // (`pin.rs`): then those words are kept, not cleared.
    let layout = file.lb.cookie_layout().map_err(anyhow::Error::msg)?;
    let pin_dir = pin_dir.for_key(&secret.fingerprint(layout));
    // Nothing shared with a running instance may be touched: its maps are locked first.
    let _pin_lock = pin_dir.lock()?;
    let steering = SteeringProgram::load_pinned(file.lb.fallback_table_capacity, &pin_dir)?;
    let unused_pins = pin::UnusedPins::new(&pin_dir, steering.pins());
    pin::record(&daemon.state_dir, &pin_dir)?;
    // The times in kept handshake and fallback words are the earlier run's clock's: it
    // continues (same boot: a BPF filesystem does not outlive one).
    let clock = match steering.kept_clock_base()? {
        Some(base) => Clock::resume(base),
        None => Clock::start(),
    };
    let kernel_words = steering.kernel_words()?;
    // Read before the state file's import writes the same words.
    let kept_clocks = kernel_words.kept_clocks();
    let mut plane = persister.restore_with_tables(&file.lb, &secret, &clock, &|layout, _| {
        kernel_words.tables(layout)
    })?;
    adopt_kept_clocks(&steering, &plane, &kept_clocks, clock.now())?;
    // Likewise the close filter lives in the program's closes array: a close counted in
    // the kernel is a duplicate for the workers, and the other way round.
    if plane
        .share_closes(steering.close_words()?.filter())
        .is_err()
    {
        bail!("the close filter must be shared with the XDP program before the workers start");
    }
    // The kernel's handshake bookkeeping keeps the core's time.
    steering.set_clock_base(clock.monotonic_base_ns())?;
    let state = Arc::new(DaemonState::new(plane, clock, Some(persister)));
    // The API binds before anything touches the interfaces: a bad or busy address stops
    // the start with nothing changed.
    let api = api::spawn(Arc::clone(&state), daemon.api_listen)?;
    for fault in &args.faults {
        tracing::warn!(
            ?fault,
            "FAULT INJECTION: this LB is broken on purpose for a test; never run it in production"
        );
    }
    let data_plane = DataPlane::start(steering, &file, &daemon, &state, &args.faults)?;
    unused_pins.in_use();
    let saver = saver::spawn(Arc::clone(&state), Duration::from_secs(1))?;
    // After the XDP program is attached: it hands the probes' answers to the kernel.
    let prober = health::spawn(Arc::clone(&state))?;
    tracing::info!(
        fingerprint = %state.shared.secret_fingerprint(),
        cookie_epoch_bits = state.shared.layout().epoch_bits(),
        mode = file.lb.mode.name(),
        datapath = daemon.datapath.name(),
        workers = data_plane.workers.len(),
        api = %api.local_addr(),
        "cheetah is forwarding"
    );
    data_plane.run_until_signal(&state)?;
    prober.shutdown();
    api.shutdown();
    saver.shutdown();
    Ok(())
}

/// The secret file's key, checked against the config's cookie layout; `create` makes the
/// file (key and layout) if there is none.
fn load_or_create_secret(path: &Path, create: bool, epoch_bits: u8) -> anyhow::Result<Secret> {
    if path.exists() {
        let key = read_key_file(path)?;
        key.check_layout(path, epoch_bits)?;
        if key.cookie_epoch_bits.is_none() {
            tracing::warn!(
                path = %path.display(),
                "the secret file records no cookie layout, so an instance configured with another \
                 one would not be stopped: add the line `cookie_epoch_bits = {epoch_bits}` to it on every instance"
            );
        }
        return Ok(key.secret);
    }
    if !create {
        bail!(
            "secret file {} does not exist; pass --init-secret to create it (and copy it to every other LB instance)",
            path.display()
        );
    }
    let file = KeyFile::generate(epoch_bits)?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    file.write_new(path)?;
    tracing::info!(path = %path.display(), cookie_epoch_bits = epoch_bits, "created a new secret");
    Ok(file.secret)
}

/// The running data path: the XDP program and one worker thread per queue.
pub struct DataPlane {
    pub workers: Vec<std::thread::JoinHandle<()>>,
    steering: SteeringProgram,
    stop: Arc<AtomicBool>,
    interfaces: Vec<Interface>,
    interface_names: Vec<String>,
    side_source: SideSource,
    sides: Arc<InterfaceSides>,
    /// Keeps the XDP program's tables (`xdp_tables.rs`) in step with the core's.
    publisher: Publisher,
    fast_path: bool,
    /// Keeps the XDP program's `next_hops` equal to the kernel's routes and neighbours
    /// (`next_hops.rs`); only with the in-kernel path, which alone reads it.
    next_hops: Option<NextHopMirror>,
    /// Turns forwarding on `lo` off again (if the start turned it on) when the data
    /// plane is dropped, after the workers stopped.
    _loopback_forwarding: host::LoopbackForwarding,
}

impl DataPlane {
    pub fn start(
        steering: SteeringProgram,
        file: &FileConfig,
        daemon: &DaemonConfig,
        state: &Arc<DaemonState>,
        faults: &[Fault],
    ) -> anyhow::Result<Self> {
        let interfaces = daemon
            .interfaces
            .iter()
            .enumerate()
            .map(|(slot, name)| Interface::discover(name, slot as u32))
            .collect::<anyhow::Result<Vec<_>>>()?;
        // Before the program is attached, so that the first server reply finds its next hop.
        let sysctls = host::Ipv4Sysctls::system();
        let names: Vec<String> = interfaces.iter().map(|i| i.name.clone()).collect();
        match host::ForwardingReport::read(&sysctls, &names) {
            Ok(report) => report.log(),
            Err(e) => tracing::warn!(
                error = %format!("{e:#}"),
                "cannot tell whether the host forwards on the LB's interfaces"
            ),
        }
        host::check_loopback_ifindex()?;
        let loopback_forwarding = host::LoopbackForwarding::enable(&sysctls)?;
        let queues = interfaces.iter().map(|i| i.queues).max().unwrap_or(1);
        let workers = daemon
            .workers
            .unwrap_or(queues)
            .min(queues)
            .min(xdp::MAX_QUEUES);

        let slots: Vec<(u32, u32)> = interfaces.iter().map(|i| (i.ifindex, i.slot)).collect();
        steering.set_interface_slots(&slots)?;
        sync_host_addrs(&steering, &state.shared)?;

        // Sockets go into the map before the program is attached (or replaces the previous
        // run's), so there is no moment where owned packets reach the host kernel.
        let mut ports = Vec::new();
        for queue in 0..workers {
            let worker_ports = WorkerPorts::open(&interfaces, queue, daemon.frames_per_worker)?;
            for port in &worker_ports.ports {
                steering.bind_socket(port.slot, queue, port.fd())?;
            }
            ports.push(worker_ports);
        }
        // Before the workers start, so that no reply is judged without it.
        let side_source = match &daemon.server_interfaces {
            Some(names) => SideSource::Configured(names.clone()),
            None => SideSource::Routes,
        };
        let initial = side_source.sides(&names, &state.shared.snapshot.load());
        log_sides(&names, &initial, &side_source);
        let sides = Arc::new(InterfaceSides::new(&initial));
        // Before the program is attached, so that its first packet finds the tables (and
        // with datapath = "afxdp", the NAT backends it steers by).
        // The in-kernel path always restores TSecr, as the core's straight line does; with
        // the restore fault injected the core turns its straight line off, and so must the
        // kernel, or the fault would hold only for the packets that reach the workers.
        let fast_path = daemon.datapath.fast_path() && !faults.contains(&Fault::SkipTsecrRestore);
        let mut seed = [0u8; 8];
        let _ = crate::entropy::fill(&mut seed);
        let seed = u64::from_ne_bytes(seed);
        // The kernel's CPUs draw random picks too: from generators of their own, seeded
        // apart from the workers' (`xdp_policy.rs`).
        let mut publisher = Publisher::with_policy_seeds(PolicySeeds::PerCpu { rng_seed: !seed });
        publish(
            &mut publisher,
            &steering,
            state,
            &interfaces,
            &initial,
            fast_path,
        )?;
        state.steering.fast_path.store(fast_path, Ordering::Relaxed);
        // Before the program is attached too: the first replies find their next hops
        // without bpf_fib_lookup (which answers on a miss anyway).
        let next_hops = if fast_path {
            let mut mirror = NextHopMirror::new()?;
            match mirror.refresh(&steering) {
                Ok(entries) => tracing::info!(
                    entries,
                    "next hops toward clients mirrored from the kernel's routes and neighbours"
                ),
                Err(e) => tracing::warn!(
                    error = %format!("{e:#}"),
                    "cannot mirror the next hops yet; bpf_fib_lookup answers meanwhile"
                ),
            }
            Some(mirror)
        } else {
            None
        };
        let mut statuses = Vec::new();
        for iface in &interfaces {
            let mode = steering.attach(&iface.name, iface.ifindex, daemon.xdp_mode)?;
            tracing::info!(interface = %iface.name, mode, queues = iface.queues, "XDP program attached");
            statuses.push(InterfaceStatus {
                name: iface.name.clone(),
                ifindex: iface.ifindex,
                xdp_mode: mode.to_string(),
                queues: (0..iface.queues.min(workers)).collect(),
            });
        }
        state.set_interfaces(statuses);

        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for (index, worker_ports) in ports.into_iter().enumerate() {
            let mut config = WorkerConfig::new(index, workers as usize, &file.lb);
            // Replays need fixed seeds; a live LB must not make the same random picks as
            // every other instance.
            config.seed ^= seed;
            let mut worker = Worker::new(Arc::clone(&state.shared), config);
            if faults.contains(&Fault::SkipTsecrRestore) {
                worker.set_restore_tsecr(false);
            }
            let io = state.register_worker(index, index as u32, Arc::clone(worker.counters()));
            let port_names: Vec<(String, u8)> = worker_ports
                .ports
                .iter()
                .enumerate()
                .map(|(i, p)| (interfaces[p.slot as usize].name.clone(), i as u8))
                .collect();
            let path = DataPath {
                worker,
                ports: worker_ports,
                io,
                clock: state.clock,
                stop: Arc::clone(&stop),
                busy_poll: daemon.busy_poll,
                sides: Arc::clone(&sides),
            };
            threads.push(
                std::thread::Builder::new()
                    .name(format!("cheetah-w{index}"))
                    .spawn(move || path.run(port_names))?,
            );
        }
        Ok(DataPlane {
            workers: threads,
            steering,
            stop,
            interfaces,
            interface_names: names,
            side_source,
            sides,
            publisher,
            fast_path,
            next_hops,
            _loopback_forwarding: loopback_forwarding,
        })
    }

    /// Keeps the XDP program's maps in step with the tables until SIGTERM or SIGINT, then
    /// stops the workers. The program stays attached (see `--unload`).
    pub fn run_until_signal(mut self, state: &DaemonState) -> anyhow::Result<()> {
        let term = Arc::new(AtomicBool::new(false));
        for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
            signal_hook::flag::register(signal, Arc::clone(&term))?;
        }
        let mut generation = state.shared.snapshot.generation();
        let mut rounds = 0u64;
        let mut sides = self
            .side_source
            .sides(&self.interface_names, &state.shared.snapshot.load());
        let mut kernel_loads =
            KernelLoads::starting_at(&self.steering, Arc::clone(&state.shared.loads))?;
        let mut awrr_schedules = AwrrSchedules::new();
        while !term.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
            rounds += 1;
            if self.fast_path {
                if let Err(e) = kernel_loads.fold(&self.steering, &state.shared) {
                    tracing::error!(error = %format!("{e:#}"), "cannot fold the XDP program's server traffic or publish its load views");
                }
                let snapshot = state.shared.snapshot.load();
                if let Err(e) =
                    awrr_schedules.publish(&self.steering, &snapshot, kernel_loads.view())
                {
                    tracing::error!(error = %format!("{e:#}"), "cannot update the XDP program's awrr cycles");
                }
            }
            let every_second = rounds.is_multiple_of(20);
            // On every routing change the kernel announces (seen within one round), and
            // every second for what it does not announce (docs/dataplane.md "Next hops").
            if let Some(mirror) = &mut self.next_hops {
                if mirror.changed() || every_second {
                    if let Err(e) = mirror.refresh(&self.steering) {
                        tracing::error!(error = %format!("{e:#}"), "cannot update the XDP program's next hops");
                    }
                }
            }
            if every_second {
                state.steering.store(&self.steering.stats());
                // Addresses come and go without a snapshot change (DHCP, an operator).
                if let Err(e) = sync_host_addrs(&self.steering, &state.shared) {
                    tracing::error!(error = %format!("{e:#}"), "cannot update the XDP program's host addresses");
                }
            }
            let now = state.shared.snapshot.generation();
            let tables_changed = now != generation;
            generation = now;
            // Routes change without the tables: looked at again every 5 s too.
            if tables_changed || rounds.is_multiple_of(100) {
                let names = &self.interface_names;
                sides = self.side_source.sides(names, &state.shared.snapshot.load());
                if self.sides.set(&sides) {
                    log_sides(names, &sides, &self.side_source);
                }
            }
            // Every second too: a server's egress and neighbour may appear later.
            if tables_changed || every_second {
                let published = publish(
                    &mut self.publisher,
                    &self.steering,
                    state,
                    &self.interfaces,
                    &sides,
                    self.fast_path,
                );
                if let Err(e) = published {
                    tracing::error!(error = %format!("{e:#}"), "cannot update the XDP program's tables");
                }
                if tables_changed {
                    // A new VIP's address is the host's no more.
                    if let Err(e) = sync_host_addrs(&self.steering, &state.shared) {
                        tracing::error!(error = %format!("{e:#}"), "cannot update the XDP program's host addresses");
                    }
                }
            }
        }
        tracing::info!(
            "stopping; the XDP program stays attached and drops VIP traffic until the next start"
        );
        self.stop.store(true, Ordering::Relaxed);
        for worker in self.workers {
            let _ = worker.join();
        }
        Ok(())
    }
}

/// Merges the clocks an earlier run left in the pinned words with those the state file
/// gave (`MsbTable::import_newer`: no estimate moves backwards), for the ids that still
/// name the server they named then (same address in the pinned `servers` map, not yet
/// republished); the others' words are an unknown server's clock, forgotten unless the
/// state file gave the id a clock (checked against its own addresses).
fn adopt_kept_clocks(
    steering: &SteeringProgram,
    plane: &cheetah_core::tables::ControlPlane,
    kept: &[(cheetah_core::types::ServerId, u32)],
    now: cheetah_core::types::Nanos,
) -> anyhow::Result<()> {
    if kept.is_empty() {
        return Ok(());
    }
    let current: std::collections::HashMap<u16, Ipv4Addr> = plane
        .servers(now)
        .into_iter()
        .filter(|s| s.state != cheetah_core::tables::SlotState::Free)
        .map(|s| (s.id.0, s.dip))
        .collect();
    let msb = &plane.shared().msb;
    let mut same = Vec::new();
    for &(id, tsval) in kept {
        match steering.published_server_dip(id)? {
            Some(dip) if current.get(&id.0) == Some(&dip) => same.push((id, tsval)),
            _ if msb.get(id).is_none() => msb.forget(id),
            _ => {}
        }
    }
    msb.import_newer(&same, now);
    tracing::info!(
        servers = same.len(),
        forgotten = kept.len() - same.len(),
        "server clocks kept from the pinned maps"
    );
    Ok(())
}

/// Publishes the current tables into the XDP program's maps (`xdp_tables.rs`), and
/// records the generation they now hold, which changes' answers wait for (`published.rs`).
fn publish(
    publisher: &mut Publisher,
    steering: &SteeringProgram,
    state: &DaemonState,
    interfaces: &[Interface],
    sides: &[Ingress],
    fast_path: bool,
) -> anyhow::Result<()> {
    let snapshot = state.shared.snapshot.load();
    let publication = Publication {
        snapshot: &snapshot,
        layout: state.shared.layout(),
        interfaces,
        sides,
        fast_path,
        fallback_sets: state.shared.fallback.sets(),
    };
    publisher.publish(steering, &publication)?;
    state.published.published(snapshot.generation);
    Ok(())
}

/// Puts the host's own IPv4 addresses, VIPs left out, into the XDP program's map, so that
/// the answers to the health probes reach the kernel (`bpf/lib/steer.h`).
fn sync_host_addrs(steering: &SteeringProgram, shared: &LbShared) -> anyhow::Result<()> {
    let snapshot = shared.snapshot.load();
    let addresses: Vec<Ipv4Addr> = host_addrs::ipv4_addresses()
        .context("cannot list the host's addresses")?
        .into_iter()
        .filter(|a| !snapshot.is_vip_addr(u32::from(*a)))
        .collect();
    steering.set_host_addrs(&addresses)
}
