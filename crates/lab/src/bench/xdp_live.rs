//! `cheetah bench --xdp-live`: packets per second the LB's XDP program forwards on a veth
//! with one CPU, against a trivial XDP_TX reflector on the same veth, fed by the same
//! sender in the same invocation.
//!
//! The network is `xdp_live_net`'s: the LB's end of one veth in a namespace of its own, its
//! NAPI put on the LB's CPU (threaded NAPI pinned there, or a cpumap hop:
//! `--xdp-live-steer`); the sender's end in another namespace, the sender pinned to the
//! other CPU. The sender is the kernel's own XDP traffic generator (BPF_PROG_TEST_RUN with
//! BPF_F_TEST_XDP_LIVE_FRAMES, bpf/xdp_traffic.c's traffic_send), sending the core's own
//! client ACKs (NOP NOP TS echoing a valid cookie) of `--xdp-live-flows` connections from
//! as many source ports. Two runs of the same length follow each other: bpf/xdp_reflect.c's
//! xdp_reflect on the LB's end, then cheetah_lb (bpf/xdp_lb.c, the program `cheetah run`
//! loads) with its maps filled by the daemon's publisher, so every frame takes the
//! established client->server cookie path and goes back out (XDP_TX, to the server's MAC)
//! to the sender's end, where traffic_sink counts and drops it. Unless `--xdp-live-fair`,
//! the sender and the LB's thread are SCHED_FIFO: other processes on a shared machine then
//! get only what the scheduler keeps for them (5% of each CPU).
//!
//! A run is void unless packets were counted at both ends, the program's own counter says
//! it handled them (cheetah's STAT_FAST_CLIENT_COOKIE, the reflector's `seen`), it ran on
//! the LB's CPU (its per-CPU counters) and that CPU was >= 95% busy in the kernel
//! (system + irq + softirq of its `/proc/stat` line, the condition that the sender
//! loads it). A void run is printed as void, never as a result.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use cheetah_core::lb::Ingress;
use cheetah_daemon::dataplane::xdp::SteeringProgram;
use cheetah_daemon::dataplane::xdp_layout::STAT_FAST_CLIENT_COOKIE;
use libbpf_rs::{libbpf_sys, MapCore, MapFlags, Object, ObjectBuilder, Xdp, XdpFlags};

use super::affinity;
use super::xdp::{self, Bench, Path, SETUPS};
use super::xdp_live_net::{self, Namespace, Net};
use super::xdp_live_packet::{PacketSender, BATCH as PACKET_BATCH};
use super::xdp_live_probe::{self, BpfStats, CpuTimes, ProgramRuns, ThreadTimes};

static REFLECT_OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/xdp_reflect.o"));
static TRAFFIC_OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/xdp_traffic.o"));

/// `TRAFFIC_FRAME_MAX` and `TRAFFIC_FLOWS_MAX` of bpf/xdp_traffic.c.
const TRAFFIC_FRAME_MAX: usize = 128;
const TRAFFIC_FLOWS_MAX: u32 = 4096;
/// The rules: a run counts only with the LB's CPU this busy, and the LB should
/// forward at least this share of what the reflector does.
const MIN_LOAD: f64 = 0.95;
const TARGET_RATIO: f64 = 0.7;
/// Share of a run's packets that must have been handled where the run says.
const MIN_HANDLED: f64 = 0.99;
/// Sender runs per BPF_PROG_TEST_RUN call: as good as endless (minutes). A call costs
/// some 20-25 ms besides its frames (likely the kernel entering the program into its XDP
/// dispatcher and taking it out again, each a wait for RCU): calls of 2^16 frames left the
/// LB idle about a third of the time. The sender is paused by a signal instead, which ends
/// the call (EINTR). And frames per batch.
const FRAMES_PER_CALL: u32 = 1 << 30;
const BATCH: u32 = 64;
const BPF_F_TEST_XDP_LIVE_FRAMES: u32 = 1 << 1;
const FIRST_CLIENT_PORT: u16 = 20_000;

/// What feeds the LB's veth: the kernel's live frames where it allows them, else an
/// AF_PACKET socket (`xdp_live_packet`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Feed {
    LiveFrames,
    PacketSocket,
}

impl Feed {
    fn describe(self) -> String {
        match self {
            Feed::LiveFrames => {
                format!("BPF_PROG_TEST_RUN live frames, one call per run in batches of {BATCH}")
            }
            Feed::PacketSocket => format!(
                "an AF_PACKET socket's transmit ring (PACKET_QDISC_BYPASS, {PACKET_BATCH} frames a send), as this kernel refuses BPF_PROG_TEST_RUN live frames"
            ),
        }
    }
}

/// How the LB's veth NAPI is made to run on the LB's CPU (`xdp_live_net`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Steer {
    /// Threaded NAPI at the LB's end, its thread pinned to the LB's CPU.
    NapiThread,
    /// The sender's frames cross to the LB's CPU through a cpumap, whose thread transmits
    /// them there (a cost on the LB's CPU that both runs pay).
    Cpumap,
}

pub struct Options {
    pub steer: Steer,
    pub seconds: f64,
    pub warm_up: f64,
    pub flows: u32,
    pub lb_cpu: Option<usize>,
    pub sender_cpu: Option<usize>,
    pub servers: u16,
    pub prefix: String,
    /// Leave the LB's NAPI thread under the normal scheduler instead of SCHED_FIFO.
    pub fair: bool,
    pub markdown: bool,
}

/// Why a run does not count.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Void {
    /// The sender did not keep the LB's CPU busy enough (the kernel share, 0..1).
    Load(f64),
    /// The program ran elsewhere than on the LB's CPU (the share that did run there).
    Placement(f64),
    /// Nothing counted at one end.
    NoPackets(&'static str),
    /// The program's own counter did not move with the packets (the share it counted).
    NotHandled(f64),
}

impl std::fmt::Display for Void {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Void::Load(share) => write!(
                f,
                "void (load): the LB's CPU was {:.1}% busy in the kernel, < {:.0}%",
                share * 100.0,
                MIN_LOAD * 100.0
            ),
            Void::Placement(share) => write!(
                f,
                "void (placement): only {:.1}% of the program's packets ran on the LB's CPU",
                share * 100.0
            ),
            Void::NoPackets(end) => write!(f, "void (no packets): nothing counted at {end}"),
            Void::NotHandled(share) => write!(
                f,
                "void (not handled): the program's counter moved by {:.1}% of the packets",
                share * 100.0
            ),
        }
    }
}

/// What one run measured.
pub(super) struct Run {
    pub(super) subject: &'static str,
    pub(super) seconds: f64,
    /// Frames the sender's veth passed to the LB's end, and those it could not because
    /// the LB's receive ring was full (its `tx_queue_0_xdp_xmit` and `_errors`).
    pub(super) offered: u64,
    pub(super) ring_full: u64,
    /// Frames the LB's end received (its veth's `rx_queue_0_xdp_packets`).
    pub(super) received_by_lb: u64,
    /// Frames the sink got back (traffic_sink's `received`).
    pub(super) forwarded: u64,
    /// Frames the program counted as its own (cheetah: STAT_FAST_CLIENT_COOKIE).
    pub(super) handled: u64,
    pub(super) handled_on_lb_cpu: u64,
    pub(super) cpu: CpuTimes,
    pub(super) net_rx_softirqs: u64,
    /// The thread that runs the LB's NAPI (or raises it), over the run.
    pub(super) napi: ThreadTimes,
    pub(super) ns_per_run: Option<f64>,
    pub(super) void: Option<Void>,
}

impl Run {
    pub(super) fn pps(&self) -> f64 {
        self.forwarded as f64 / self.seconds
    }

    /// The LB CPU's kernel time per forwarded packet, in ns.
    pub(super) fn kernel_ns_per_packet(&self) -> f64 {
        let busy = (self.cpu.system + self.cpu.irq + self.cpu.softirq) as f64;
        busy * xdp_live_probe::tick_seconds() * 1e9 / self.forwarded.max(1) as f64
    }

    fn judge(&mut self) {
        let share = |part: u64, whole: u64| part as f64 / whole.max(1) as f64;
        self.void = if self.received_by_lb == 0 {
            Some(Void::NoPackets("the LB's veth"))
        } else if self.forwarded == 0 {
            Some(Void::NoPackets("the sink"))
        } else if share(self.handled, self.received_by_lb) < MIN_HANDLED {
            Some(Void::NotHandled(share(self.handled, self.received_by_lb)))
        } else if share(self.handled_on_lb_cpu, self.handled) < MIN_HANDLED {
            Some(Void::Placement(share(self.handled_on_lb_cpu, self.handled)))
        } else if self.cpu.kernel_share() < MIN_LOAD {
            Some(Void::Load(self.cpu.kernel_share()))
        } else {
            None
        };
    }
}

pub fn run(options: Options) -> anyhow::Result<()> {
    // SAFETY: no arguments, no memory.
    ensure!(
        unsafe { libc::geteuid() } == 0,
        "cheetah bench --xdp-live needs root: it makes namespaces and attaches XDP programs"
    );
    let cpus = affinity::cpus();
    ensure!(
        cpus >= 2,
        "cheetah bench --xdp-live needs 2 CPUs (one for the LB, one for the sender)"
    );
    let lb_cpu = options.lb_cpu.unwrap_or(cpus - 1);
    let sender_cpu = options.sender_cpu.unwrap_or(0);
    ensure!(
        lb_cpu < cpus && sender_cpu < cpus && lb_cpu != sender_cpu,
        "--xdp-live-lb-cpu ({lb_cpu}) and --xdp-live-sender-cpu ({sender_cpu}) must be two different CPUs below {cpus}"
    );
    ensure!(
        (1..=TRAFFIC_FLOWS_MAX).contains(&options.flows),
        "--xdp-live-flows must be in 1..={TRAFFIC_FLOWS_MAX}"
    );
    ensure!(
        options.seconds > 0.0 && options.warm_up >= 0.0,
        "--xdp-live-seconds must be > 0"
    );
    let interrupted = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, Arc::clone(&interrupted))?;
    }
    let jit = xdp::read_setting("/proc/sys/net/core/bpf_jit_enable");
    let net = Net::up(&options.prefix)?;
    let lb_namespace = Namespace::open(&net.lb_namespace)?;
    let gen_namespace = Namespace::open(&net.gen_namespace)?;
    let _bpf_stats = BpfStats::enable()?;

    // The sender's end: the sink, and the sender's frames.
    gen_namespace.enter()?;
    let gen_ifindex = xdp::interface(&net.gen_interface, [0; 6], 0)?.ifindex;
    let traffic = load(TRAFFIC_OBJECT, "bpf/xdp_traffic.c")?;
    attach(&traffic, "traffic_sink", gen_ifindex)?;
    let lb_thread_name = match options.steer {
        Steer::NapiThread => format!("napi/{}-", net.lb_interface),
        Steer::Cpumap => {
            let id = enter_cpumap(&traffic, lb_cpu)?;
            format!("cpumap/{lb_cpu}/map:{id}")
        }
    };

    // The LB's end, where this thread stays.
    lb_namespace.enter()?;
    let lb_interface = xdp::interface(&net.lb_interface, cheetah_core::testkit::LB_MAC, 0)?;
    let lb_ifindex = lb_interface.ifindex;
    let cheetah = Bench::publish(
        SteeringProgram::load(cheetah_core::lb::fallback::DEFAULT_CAPACITY)?,
        &SETUPS[0],
        options.servers,
        &[lb_interface],
        &[Ingress::ServerSide],
    )?;
    let frames = (0..options.flows)
        .map(|n| {
            let port = FIRST_CLIENT_PORT + n as u16;
            cheetah
                .frame_of_port(Path::ClientToServer, port)
                .map(|(frame, _)| frame)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    fill_traffic(&traffic, &frames, gen_ifindex, options.steer, lb_cpu)?;
    gen_namespace.enter()?;
    let feed = if live_frames_refused(&find_program(&traffic, "traffic_send")?, gen_ifindex)? {
        ensure!(
            options.steer != Steer::Cpumap,
            "--xdp-live-steer cpumap needs BPF_PROG_TEST_RUN live frames, which this kernel refuses (EPERM); use napi-thread"
        );
        Feed::PacketSocket
    } else {
        Feed::LiveFrames
    };
    lb_namespace.enter()?;
    let reflect = load(REFLECT_OBJECT, "bpf/xdp_reflect.c")?;

    let subjects: [(&'static str, &Object, &str); 2] = [
        ("xdp_reflect", &reflect, "xdp_reflect"),
        ("cheetah_lb", cheetah.program.object(), "cheetah_lb"),
    ];
    let mut runs = Vec::new();
    for (subject, object, program_name) in subjects {
        attach(object, program_name, lb_ifindex)?;
        if runs.is_empty() && options.steer == Steer::NapiThread {
            net.thread_lb_napi()?;
        }
        // The thread whose CPU time is the LB's: it runs the veth's NAPI, or (cpumap) the
        // transmits that raise it as a softirq in its own context.
        let lb_thread = xdp_live_net::kernel_thread(&lb_thread_name)?;
        // A cpumap's thread is bound to its CPU by the kernel (and cannot be moved).
        if options.steer == Steer::NapiThread {
            xdp_live_net::pin(lb_thread, lb_cpu)?;
        }
        if !options.fair {
            xdp_live_net::realtime(lb_thread)?;
        }
        let handled = |object: &Object| -> anyhow::Result<Vec<u64>> {
            if subject == "cheetah_lb" {
                per_cpu(object, "stats", STAT_FAST_CLIENT_COOKIE)
            } else {
                per_cpu(object, "seen", 0)
            }
        };
        let program = find_program(object, program_name)?;
        let mut run = measure(
            &options,
            &net,
            &gen_namespace,
            &traffic,
            (feed, &frames),
            gen_ifindex,
            sender_cpu,
            lb_cpu,
            lb_thread,
            &interrupted,
            || Ok((handled(object)?, ProgramRuns::read(program.as_fd())?)),
        )?;
        run.subject = subject;
        run.judge();
        match &run.void {
            None => eprintln!(
                "{subject}: {:.0} pps forwarded (LB thread {lb_thread} on CPU {lb_cpu})",
                run.pps()
            ),
            Some(void) => eprintln!("{subject}: {void}"),
        }
        if matches!(run.void, Some(Void::NoPackets(_) | Void::NotHandled(_))) {
            // What the program and the veths did instead.
            if subject == "cheetah_lb" {
                eprintln!("  cheetah_lb's counters: {:?}", cheetah.program.stats());
            }
            let moved: Vec<String> = net
                .counters(true)?
                .into_iter()
                .filter(|(name, value)| *value > 0 && name.contains("xdp"))
                .map(|(name, value)| format!("{name} {value}"))
                .collect();
            eprintln!("  the LB's veth since it was made: {}", moved.join(", "));
        }
        runs.push(run);
    }
    println!(
        "{}",
        xdp::machine_note(
            &format!(
                "LB: {} ({lb_thread_name}) pinned to CPU {lb_cpu}{}; sender pinned to CPU {sender_cpu}",
                match options.steer {
                    Steer::NapiThread => "threaded NAPI of the LB's veth",
                    Steer::Cpumap => "frames handed over by a cpumap",
                },
                if options.fair { "" } else { ", SCHED_FIFO" }
            ),
            &jit
        )
    );
    println!(
        "runs: {:.1} s each after {:.1} s of warm-up; {} flows (client ACKs with NOP NOP TS and a valid cookie); sender: {}",
        options.seconds,
        options.warm_up,
        options.flows,
        feed.describe()
    );
    print!("{}", render(&runs, options.markdown));
    Ok(())
}

/// One run of whatever program is attached to the LB's end: the sender runs on its CPU
/// for the warm-up, pauses while the counters are read (so that no frame is in flight
/// between two readings), runs for the measurement, and pauses again; the CPU's times are
/// read when the sender stops, the counters once the LB has drained its ring.
#[allow(clippy::too_many_arguments)]
fn measure(
    options: &Options,
    net: &Net,
    gen_namespace: &Namespace,
    traffic: &Object,
    (feed, frames): (Feed, &[Vec<u8>]),
    gen_ifindex: u32,
    sender_cpu: usize,
    lb_cpu: usize,
    napi: i32,
    interrupted: &AtomicBool,
    program_counters: impl Fn() -> anyhow::Result<(Vec<u64>, ProgramRuns)>,
) -> anyhow::Result<Run> {
    let control = SenderControl::default();
    // A handler, so that the signal that pauses the sender only ends its system call.
    signal_hook::flag::register(libc::SIGUSR1, Arc::clone(&control.signalled))?;
    std::thread::scope(|scope| -> anyhow::Result<Run> {
        let sender = scope.spawn(|| -> anyhow::Result<()> {
            gen_namespace.enter()?;
            affinity::pin_to(sender_cpu)
                .with_context(|| format!("cannot pin the sender to CPU {sender_cpu}"))?;
            if !options.fair {
                affinity::realtime().context("cannot make the sender SCHED_FIFO")?;
            }
            let program = find_program(traffic, "traffic_send")?;
            let mut packets = match feed {
                Feed::PacketSocket => Some(PacketSender::open(gen_ifindex, frames)?),
                Feed::LiveFrames => None,
            };
            // SAFETY: pthread_self has no preconditions.
            control
                .thread
                .store(unsafe { libc::pthread_self() } as u64, Ordering::Release);
            while !control.stop.load(Ordering::Relaxed) && !interrupted.load(Ordering::Relaxed) {
                if control.paused.load(Ordering::Acquire) {
                    control.idle.store(true, Ordering::Release);
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                }
                control.idle.store(false, Ordering::Release);
                match packets.as_mut() {
                    Some(packets) => {
                        let sent = packets.send_batch()?;
                        control.sent.fetch_add(sent, Ordering::Relaxed);
                    }
                    None => send(&program, gen_ifindex)?,
                }
            }
            Ok(())
        });
        let outcome = (|| -> anyhow::Result<Run> {
            wait(options.warm_up, interrupted, &sender)?;
            control.pause(&sender)?;
            let before_times = Times::read(lb_cpu, napi)?;
            let before = Counters::read(net, traffic, &control.sent, &program_counters)?;
            control.resume();
            let clock = Instant::now();
            wait(options.seconds, interrupted, &sender)?;
            control.pause(&sender)?;
            let seconds = clock.elapsed().as_secs_f64();
            let after_times = Times::read(lb_cpu, napi)?;
            let after = Counters::read(net, traffic, &control.sent, &program_counters)?;
            Ok(after.since(
                &before,
                after_times.since(&before_times),
                feed,
                lb_cpu,
                seconds,
            ))
        })();
        control.stop.store(true, Ordering::Relaxed);
        if !sender.is_finished() {
            let _ = control.pause(&sender);
        }
        sender
            .join()
            .map_err(|_| anyhow::anyhow!("the sender thread panicked"))??;
        outcome
    })
}

#[derive(Default)]
struct SenderControl {
    stop: AtomicBool,
    paused: AtomicBool,
    /// The sender saw `paused` and sends nothing.
    idle: AtomicBool,
    /// The sender's pthread_t, to signal it.
    thread: std::sync::atomic::AtomicU64,
    /// Frames the packet-socket sender handed to its veth.
    sent: std::sync::atomic::AtomicU64,
    signalled: Arc<AtomicBool>,
}

/// Time for frames already sent to cross the LB and reach the sink.
const DRAIN: Duration = Duration::from_millis(20);

impl SenderControl {
    /// Returns once the sender has stopped sending and what it sent has drained.
    fn pause<T>(&self, sender: &std::thread::ScopedJoinHandle<'_, T>) -> anyhow::Result<()> {
        self.idle.store(false, Ordering::Release);
        self.paused.store(true, Ordering::Release);
        while !self.idle.load(Ordering::Acquire) {
            ensure!(!sender.is_finished(), "the sender stopped early");
            // Again and again: a signal that lands just before the sender enters its
            // call does not end that call.
            let thread = self.thread.load(Ordering::Acquire);
            if thread != 0 {
                // SAFETY: the sender thread is alive (not finished, checked above) and
                // handles SIGUSR1.
                unsafe { libc::pthread_kill(thread as libc::pthread_t, libc::SIGUSR1) };
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(DRAIN);
        Ok(())
    }

    fn resume(&self) {
        self.paused.store(false, Ordering::Release);
    }
}

/// Sleeps `seconds`, or less if interrupted (an error) or the sender failed.
fn wait<T>(
    seconds: f64,
    interrupted: &AtomicBool,
    sender: &std::thread::ScopedJoinHandle<'_, T>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    while Instant::now() < deadline {
        if interrupted.load(Ordering::Relaxed) {
            bail!("interrupted");
        }
        if sender.is_finished() {
            bail!("the sender stopped early");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// The LB CPU's times and its NAPI thread's, read when the sender pauses.
struct Times {
    cpu: CpuTimes,
    napi: ThreadTimes,
}

impl Times {
    fn read(lb_cpu: usize, napi: i32) -> anyhow::Result<Self> {
        Ok(Times {
            cpu: CpuTimes::read(lb_cpu)?,
            napi: ThreadTimes::read(napi)?,
        })
    }

    fn since(&self, before: &Times) -> Times {
        Times {
            cpu: self.cpu.since(&before.cpu),
            napi: self.napi.since(&before.napi),
        }
    }
}

/// Packet counters, read while no frame is in flight.
struct Counters {
    lb: BTreeMap<String, u64>,
    gen: BTreeMap<String, u64>,
    sink: u64,
    handled: Vec<u64>,
    runs: ProgramRuns,
    net_rx: Vec<u64>,
    sent: u64,
}

impl Counters {
    fn read(
        net: &Net,
        traffic: &Object,
        sent: &std::sync::atomic::AtomicU64,
        program_counters: &impl Fn() -> anyhow::Result<(Vec<u64>, ProgramRuns)>,
    ) -> anyhow::Result<Self> {
        let (handled, runs) = program_counters()?;
        Ok(Counters {
            lb: net.counters(true)?,
            gen: net.counters(false)?,
            sink: per_cpu(traffic, "received", 0)?.iter().sum(),
            handled,
            runs,
            net_rx: xdp_live_probe::net_rx_softirqs()?,
            sent: sent.load(Ordering::Relaxed),
        })
    }

    fn since(
        &self,
        before: &Counters,
        times: Times,
        feed: Feed,
        lb_cpu: usize,
        seconds: f64,
    ) -> Run {
        let counter =
            |counters: &BTreeMap<String, u64>, name: &str| counters.get(name).copied().unwrap_or(0);
        let moved = |pick: fn(&Counters) -> &BTreeMap<String, u64>, name: &str| {
            counter(pick(self), name) - counter(pick(before), name)
        };
        let at = |v: &[u64], i: usize| v.get(i).copied().unwrap_or(0);
        let handled: Vec<u64> = (0..self.handled.len())
            .map(|i| at(&self.handled, i) - at(&before.handled, i))
            .collect();
        let received_by_lb = moved(|c| &c.lb, "rx_queue_0_xdp_packets");
        // Live frames cross as XDP frames, which the sender's veth counts; a socket's
        // as skbs, of which it counts only what it dropped in total: the socket's own
        // count then, and what the LB's end did not receive.
        let (offered, ring_full) = match feed {
            Feed::LiveFrames => {
                let ring_full = moved(|c| &c.gen, "tx_queue_0_xdp_xmit_errors");
                (
                    moved(|c| &c.gen, "tx_queue_0_xdp_xmit") + ring_full,
                    ring_full,
                )
            }
            Feed::PacketSocket => {
                let sent = self.sent - before.sent;
                (sent, sent.saturating_sub(received_by_lb))
            }
        };
        Run {
            subject: "",
            seconds,
            offered,
            ring_full,
            received_by_lb,
            forwarded: self.sink - before.sink,
            handled: handled.iter().sum(),
            handled_on_lb_cpu: at(&handled, lb_cpu),
            cpu: times.cpu,
            net_rx_softirqs: at(&self.net_rx, lb_cpu) - at(&before.net_rx, lb_cpu),
            napi: times.napi,
            ns_per_run: self.runs.ns_per_run_since(&before.runs),
            void: None,
        }
    }
}

/// Whether the kernel refuses BPF_PROG_TEST_RUN's live-frames mode (EPERM), tried with
/// one frame of traffic_send (which, allowed, reaches the LB's end before any program is
/// attached there, to be dropped by its stack).
fn live_frames_refused(
    program: &libbpf_rs::ProgramMut<'_>,
    gen_ifindex: u32,
) -> anyhow::Result<bool> {
    match run_live(program, gen_ifindex, 1) {
        Ok(()) => Ok(false),
        Err(error) if error.raw_os_error() == Some(libc::EPERM) => Ok(true),
        Err(error) => Err(error).context("BPF_PROG_TEST_RUN (live frames) of traffic_send"),
    }
}

/// One BPF_PROG_TEST_RUN of traffic_send in live-frames mode.
fn send(program: &libbpf_rs::ProgramMut<'_>, gen_ifindex: u32) -> anyhow::Result<()> {
    match run_live(program, gen_ifindex, FRAMES_PER_CALL) {
        // A signal (the bench pausing its sender, or Ctrl-C) ends a call early; the loop
        // then sees the flag.
        Err(error) if error.raw_os_error() != Some(libc::EINTR) => {
            bail!("BPF_PROG_TEST_RUN (live frames) of traffic_send: {error}")
        }
        _ => Ok(()),
    }
}

/// `repeat` frames of traffic_send, live.
fn run_live(
    program: &libbpf_rs::ProgramMut<'_>,
    gen_ifindex: u32,
    repeat: u32,
) -> std::io::Result<()> {
    // The first flow's frame: its length is every frame's, and the program rewrites it.
    let frame = [0u8; 66];
    // struct xdp_md: the frames arrive on the sender's veth, queue 0.
    let mut context = [0u8; 24];
    context[4..8].copy_from_slice(&(frame.len() as u32).to_ne_bytes());
    context[12..16].copy_from_slice(&gen_ifindex.to_ne_bytes());
    // SAFETY: zeroed is a valid bpf_test_run_opts; `sz` says which version we fill.
    let mut opts: libbpf_sys::bpf_test_run_opts = unsafe { std::mem::zeroed() };
    opts.sz = std::mem::size_of_val(&opts) as _;
    opts.data_in = frame.as_ptr().cast();
    opts.data_size_in = frame.len() as u32;
    opts.ctx_in = context.as_ptr().cast();
    opts.ctx_size_in = context.len() as u32;
    opts.repeat = repeat as i32;
    opts.flags = BPF_F_TEST_XDP_LIVE_FRAMES;
    opts.batch_size = BATCH;
    // SAFETY: the buffers named in `opts` live across the call; live-frames mode writes
    // no data or context out.
    let rc = unsafe { libbpf_sys::bpf_prog_test_run_opts(program.as_fd().as_raw_fd(), &mut opts) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn load(bytes: &'static [u8], name: &str) -> anyhow::Result<Object> {
    ObjectBuilder::default()
        .open_memory(bytes)
        .with_context(|| format!("cannot open the embedded {name}"))?
        .load()
        .with_context(|| format!("the kernel refused {name}"))
}

fn find_program<'a>(object: &'a Object, name: &str) -> anyhow::Result<libbpf_rs::ProgramMut<'a>> {
    xdp::program(object, name)
}

/// Attaches `name` of `object` to `ifindex` of this thread's namespace in driver mode,
/// replacing whatever program is there.
fn attach(object: &Object, name: &str, ifindex: u32) -> anyhow::Result<()> {
    let program = find_program(object, name)?;
    Xdp::new(program.as_fd())
        .attach(ifindex as i32, XdpFlags::DRV_MODE)
        .with_context(|| format!("cannot attach {name} to interface {ifindex} (driver mode)"))
}

/// A per-CPU counter's values, one per CPU.
fn per_cpu(object: &Object, map: &str, index: u32) -> anyhow::Result<Vec<u64>> {
    Ok(xdp::map(object, map)?
        .lookup_percpu(&index.to_ne_bytes(), MapFlags::ANY)
        .with_context(|| format!("cannot read {map}"))?
        .unwrap_or_default()
        .iter()
        .map(|v| u64::from_ne_bytes(v[..8].try_into().unwrap()))
        .collect())
}

/// Puts traffic_hop into the cpumap's entry for `lb_cpu` (which starts the entry's kernel
/// thread on that CPU): the map's id, which names the thread.
fn enter_cpumap(traffic: &Object, lb_cpu: usize) -> anyhow::Result<u32> {
    let hop = find_program(traffic, "traffic_hop")?;
    let mut value = Vec::new();
    value.extend_from_slice(&CPUMAP_QUEUE.to_ne_bytes());
    value.extend_from_slice(&hop.as_fd().as_raw_fd().to_ne_bytes());
    let cpus = xdp::map(traffic, "traffic_cpus")?;
    cpus.update(&(lb_cpu as u32).to_ne_bytes(), &value, MapFlags::ANY)
        .context("cannot put traffic_hop into the cpumap")?;
    Ok(cpus.info().context("cannot read the cpumap's id")?.info.id)
}

/// Frames the cpumap queues toward the LB's CPU.
const CPUMAP_QUEUE: u32 = 2048;

/// Puts the flows' frames into traffic_send's maps, and how to send them.
fn fill_traffic(
    traffic: &Object,
    frames: &[Vec<u8>],
    gen_ifindex: u32,
    steer: Steer,
    lb_cpu: usize,
) -> anyhow::Result<()> {
    let len = frames[0].len();
    ensure!(
        len <= TRAFFIC_FRAME_MAX && frames.iter().all(|f| f.len() == len),
        "the sender's frames must all be {len} bytes and at most {TRAFFIC_FRAME_MAX}"
    );
    let map = xdp::map(traffic, "traffic_frames")?;
    for (n, frame) in frames.iter().enumerate() {
        let mut value = [0u8; TRAFFIC_FRAME_MAX];
        value[..len].copy_from_slice(frame);
        map.update(&(n as u32).to_ne_bytes(), &value, MapFlags::ANY)
            .context("cannot write traffic_frames")?;
    }
    let mut config = Vec::new();
    for word in [
        frames.len() as u32,
        len as u32,
        gen_ifindex,
        u32::from(steer == Steer::Cpumap),
        lb_cpu as u32,
    ] {
        config.extend_from_slice(&word.to_ne_bytes());
    }
    xdp::map(traffic, "traffic_config")?
        .update(&0u32.to_ne_bytes(), &config, MapFlags::ANY)
        .context("cannot write traffic_config")
}

fn render(runs: &[Run], markdown: bool) -> String {
    let mut out = String::new();
    let header = [
        "program",
        "pps forwarded",
        "offered pps (ring full)",
        "LB CPU busy (kernel, others' user)",
        "LB thread running (+ waiting), sleeps/s",
        "NET_RX softirqs",
        "bpf_stats ns/run",
        "LB CPU ns/packet",
        "verdict",
    ];
    let mut line = |cells: Vec<String>| {
        if markdown {
            out.push_str(&format!("| {} |\n", cells.join(" | ")));
        } else {
            out.push_str(&cells.join("  ·  "));
            out.push('\n');
        }
    };
    line(header.map(String::from).to_vec());
    if markdown {
        line(vec!["---".into(); header.len()]);
    }
    for run in runs {
        let void = run.void.as_ref().map(ToString::to_string);
        line(vec![
            run.subject.to_string(),
            match &void {
                Some(_) => "void".to_string(),
                None => format!("{:.0}", run.pps()),
            },
            format!(
                "{:.0} ({:.1}%)",
                run.offered as f64 / run.seconds,
                run.ring_full as f64 * 100.0 / run.offered.max(1) as f64
            ),
            format!(
                "{:.1}% ({:.1}%)",
                run.cpu.kernel_share() * 100.0,
                run.cpu.share(run.cpu.user) * 100.0
            ),
            format!(
                "{:.1}% (+{:.1}%), {:.0}",
                run.napi.running_ns as f64 / (run.seconds * 1e7),
                run.napi.waiting_ns as f64 / (run.seconds * 1e7),
                run.napi.sleeps as f64 / run.seconds
            ),
            run.net_rx_softirqs.to_string(),
            run.ns_per_run.map_or("-".into(), |ns| format!("{ns:.0}")),
            if run.forwarded == 0 {
                "-".into()
            } else {
                format!("{:.0}", run.kernel_ns_per_packet())
            },
            void.unwrap_or_else(|| "valid".into()),
        ]);
    }
    out.push('\n');
    match runs {
        [reflector, cheetah] if reflector.void.is_none() && cheetah.void.is_none() => {
            let ratio = cheetah.pps() / reflector.pps();
            out.push_str(&format!(
                "target cheetah_lb >= {TARGET_RATIO}x the reflector: {:.0} / {:.0} pps = {ratio:.2}x, {}\n",
                cheetah.pps(),
                reflector.pps(),
                if ratio >= TARGET_RATIO { "PASS" } else { "MISS" }
            ));
        }
        _ => out.push_str(&format!(
            "target cheetah_lb >= {TARGET_RATIO}x the reflector: void (a run is void)\n"
        )),
    }
    out
}
