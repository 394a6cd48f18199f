//! `cheetah replay`: what would the LB have done with this capture?
//!
//! Runs the same sans-IO pipeline the data path runs over every packet of a pcap/pcapng
//! (both directions, as a capture on the LB sees them), with a given config and key, and
//! writes every packet the LB would have transmitted, rewritten, to an output pcap, plus one
//! verdict line per input packet. Nothing is sent anywhere; time is the capture's, so a
//! replay of the same capture with the same config and key gives the same bytes every time.

mod capture;
mod log;
mod spread;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use cheetah_core::lb::{Counter, Ingress, Worker, WorkerConfig};
use cheetah_core::tables::ControlPlane;
use cheetah_core::types::{Nanos, NANOS_PER_SEC};
use cheetah_core::{DropReason, ServerId, Verdict};

use capture::{CaptureReader, CaptureWriter};
use cheetah_daemon::config::{read_secret, FileConfig};
use log::{VerdictKind, VerdictLog};
use spread::{Spreader, RETA_SIZE};

const MANUAL: &str = "\
WHAT IT DOES
  Every record of the input capture goes through the load-balancing pipeline exactly as
  the data path runs it. Packets the LB would transmit (to a server, toward a client, or
  an ICMP error copied to every server of a VIP) are written, rewritten, to --output with
  the input record's timestamp. Packets handed to the host (pass) and dropped packets are
  not written. Every input record gets one line in the verdict log.

  The capture should hold both directions as the LB sees them: client packets to the VIP
  and the servers' replies. Only Ethernet captures (pcap or pcapng) are accepted; the
  output is always a pcap with nanosecond timestamps.

VERDICT LOG (TSV, one header line, then one line per input record)
  index    record number in the input, from 1 (Wireshark's frame number)
  time_ns  the record's capture timestamp, ns since the Unix epoch
  worker   the worker that processed it
  verdict  to_server | to_client | to_all_servers | pass | drop
  server   the server id for to_server; the ids copied to for to_all_servers
           (comma-separated); - otherwise
  reason   the drop reason (e.g. truncated_ipv4, ts_msb_unknown) for drop; - otherwise

TIME
  The pipeline's clock is the capture's: the first record is processed at 1 s and each
  later one at 1 s plus its distance from the first, never going backwards (records
  slightly out of order are processed at the latest time seen).

WORKERS
  With --workers N, records are spread over N workers as a NIC's RSS would with a
  symmetric Toeplitz key and its default 128-entry indirection table, so both directions
  of a flow meet the same worker. Packets are still processed one at a time in capture
  order, so the result does not depend on thread timing.

KEY AND TIMESTAMP MEMORY
  Give the production key (--secret-file, or the config's secret_file) to decode the
  cookies of a production capture. A replay starts with no memory of the servers'
  timestamp high bits: client packets of connections opened before the capture are
  dropped as ts_msb_unknown until the capture shows a packet from their server.

EXAMPLE
  cheetah replay --config /etc/cheetah/cheetah.toml --input lb.pcap --output out.pcap
  awk -F'\\t' '$4 == \"drop\" {print $6}' out.pcap.verdicts.tsv | sort | uniq -c";

/// Replay a capture through the pipeline.
#[derive(clap::Args, Debug)]
#[command(after_long_help = MANUAL)]
pub struct Args {
    /// The LB config (TOML): mode, forwarding, servers, VIPs and the secret_file.
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,

    /// The capture to replay: pcap or pcapng, Ethernet, both directions as the LB sees them.
    #[arg(long, value_name = "FILE")]
    pub input: PathBuf,

    /// Where to write the packets the LB would transmit (pcap, nanosecond timestamps).
    #[arg(long, value_name = "FILE")]
    pub output: PathBuf,

    /// Where to write the per-packet verdict log (TSV) [default: <OUTPUT>.verdicts.tsv].
    // The text is the `--help` line, where <OUTPUT> names the option, not an HTML tag.
    #[allow(rustdoc::invalid_html_tags)]
    #[arg(long, value_name = "FILE")]
    pub verdicts: Option<PathBuf>,

    /// The 128-bit key, 32 hex digits [default: the config's secret_file].
    #[arg(long, value_name = "PATH")]
    pub secret_file: Option<PathBuf>,

    /// How many workers to spread the packets over, by a symmetric RSS hash (1-128).
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=RETA_SIZE as i64))]
    pub workers: u16,
}

pub fn run(args: Args) -> Result<()> {
    let file_config = FileConfig::load(&args.config)?;
    let secret_path = match (&args.secret_file, &file_config.secret_file) {
        (Some(path), _) | (None, Some(path)) => path.clone(),
        (None, None) => bail!(
            "no key: config {} has no secret_file and --secret-file was not given",
            args.config.display()
        ),
    };
    let secret = read_secret(&secret_path)?;
    let plane = ControlPlane::new(&file_config.lb, &secret)
        .map_err(|e| anyhow!("config {} is not valid: {e}", args.config.display()))?;
    let shared = Arc::clone(plane.shared());
    let worker_count = usize::from(args.workers);
    let mut workers: Vec<Worker> = (0..worker_count)
        .map(|i| {
            Worker::new(
                Arc::clone(&shared),
                WorkerConfig::new(i, worker_count, &file_config.lb),
            )
        })
        .collect();

    let verdicts_path = args
        .verdicts
        .clone()
        .unwrap_or_else(|| default_verdicts_path(&args.output));
    refuse_same_file(&args.input, "--input", &args.output, "--output")?;
    refuse_same_file(&args.input, "--input", &verdicts_path, "the verdict log")?;
    refuse_same_file(&args.output, "--output", &verdicts_path, "the verdict log")?;

    let mut input = CaptureReader::open(&args.input)?;
    let mut output = CaptureWriter::create(&args.output)?;
    let mut log = VerdictLog::create(&verdicts_path)?;

    // Reused for every record: the record as read (kept intact for ToAllServers copies),
    // the buffer the pipeline rewrites, and the buffer each copy is prepared in.
    let mut original = Vec::with_capacity(2048);
    let mut work = Vec::with_capacity(2048);
    let mut copy = Vec::with_capacity(2048);
    let spreader = Spreader::new(worker_count);
    let mut clock = ReplayClock::default();
    let mut tally = Tally::default();
    // The daemon carries every server's clock estimate forward once a second; so does the
    // replay, on the capture's clock, so that a quiet server is restored as live.
    let mut refreshed: Nanos = 0;

    let read_error = loop {
        let meta = match input.next_into(&mut original) {
            Ok(Some(meta)) => meta,
            Ok(None) => break None,
            Err(e) => break Some(e),
        };
        let now = clock.now(meta.ts_ns);
        if now >= refreshed + NANOS_PER_SEC {
            shared.msb.refresh(now);
            refreshed = now;
        }
        let index = spreader.worker_for(&original);
        let worker = &mut workers[index];
        work.clear();
        work.extend_from_slice(&original);
        let verdict = worker.process(&mut work, now, Ingress::ServerSide);
        let targets: &[ServerId] = match verdict {
            Verdict::ToAllServers { vip } => worker.copy_targets(vip),
            _ => &[],
        };
        log.write(&meta, index, &verdict, targets)?;
        match verdict {
            Verdict::ToServer(_) | Verdict::ToClient => output.write(&meta, &work)?,
            Verdict::ToAllServers { vip } => {
                for &server in targets {
                    copy.clear();
                    copy.extend_from_slice(&original);
                    worker.prepare_copy(&mut copy, vip, server);
                    output.write(&meta, &copy)?;
                }
            }
            Verdict::Pass | Verdict::Drop(_) => {}
        }
        tally.count(
            &verdict,
            targets.len(),
            meta.orig_len as usize > original.len(),
        );
    };

    let written = output.written();
    output.finish()?;
    log.finish()?;
    let summary = Summary {
        input: &args.input,
        output: &args.output,
        verdicts: &verdicts_path,
        fingerprint: shared.secret_fingerprint(),
        workers: &workers,
        tally: &tally,
        written,
    };
    // The outputs are complete by now: a reader that stopped early (`| head`) is no failure.
    match summary.print(&mut std::io::stdout().lock()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            return Err(e).context("cannot print the summary")
        }
        _ => {}
    }
    match read_error {
        None => Ok(()),
        Some(e) => Err(e.context(format!(
            "replay stopped early: the {} records before the bad one were replayed and written",
            tally.records
        ))),
    }
}

/// `<output>.verdicts.tsv`: next to the output, named after it, so runs don't overwrite
/// each other's logs.
fn default_verdicts_path(output: &Path) -> PathBuf {
    let mut path = output.as_os_str().to_owned();
    path.push(".verdicts.tsv");
    PathBuf::from(path)
}

/// Refuses to run when two of the files are one: creating the output would truncate the
/// capture being read, or one output would overwrite the other.
fn refuse_same_file(a: &Path, a_name: &str, b: &Path, b_name: &str) -> Result<()> {
    let same = match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => std::path::absolute(a).ok() == std::path::absolute(b).ok(),
    };
    if same {
        bail!(
            "{a_name} and {b_name} are the same file ({}); give them different paths",
            a.display()
        );
    }
    Ok(())
}

/// Turns capture timestamps into the pipeline's `now`.
///
/// The first record is at 1 s rather than 0 so no stage that keeps "time of the last event"
/// can confuse it with "never"; `now` never goes backwards, because captures from several
/// queues interleave slightly out of order and the pipeline's clock is monotonic.
#[derive(Default)]
struct ReplayClock {
    first: Option<u64>,
    last: Nanos,
}

impl ReplayClock {
    fn now(&mut self, ts_ns: u64) -> Nanos {
        let first = *self.first.get_or_insert(ts_ns);
        let now = ts_ns
            .saturating_sub(first)
            .saturating_add(NANOS_PER_SEC)
            .max(self.last);
        self.last = now;
        now
    }
}

/// What the replay itself counts (the pipeline's own counters are read from the workers).
#[derive(Default)]
struct Tally {
    records: u64,
    by_kind: [u64; VerdictKind::ALL.len()],
    copies: u64,
    /// Records whose capture kept fewer bytes than were on the wire (snap length).
    cut: u64,
}

impl Tally {
    fn count(&mut self, verdict: &Verdict, copies: usize, cut: bool) {
        self.records += 1;
        self.by_kind[VerdictKind::of(verdict) as usize] += 1;
        self.copies += copies as u64;
        self.cut += u64::from(cut);
    }
}

struct Summary<'a> {
    input: &'a Path,
    output: &'a Path,
    verdicts: &'a Path,
    fingerprint: &'a str,
    workers: &'a [Worker],
    tally: &'a Tally,
    written: u64,
}

impl Summary<'_> {
    fn print(&self, out: &mut impl Write) -> std::io::Result<()> {
        let tally = self.tally;
        writeln!(out, "replayed {}", self.input.display())?;
        writeln!(out, "  key fingerprint  {}", self.fingerprint)?;
        writeln!(out, "  workers          {}", self.workers.len())?;
        writeln!(out, "  packets in       {}", tally.records)?;
        writeln!(
            out,
            "  packets out      {} -> {}",
            self.written,
            self.output.display()
        )?;
        writeln!(out, "  verdict log      {}", self.verdicts.display())?;
        if tally.cut > 0 {
            writeln!(
                out,
                "  warning: {} packets were cut by the capture's snap length; the pipeline \
                 saw only the captured bytes (expect bad_ipv4_total_length drops)",
                tally.cut
            )?;
        }
        writeln!(out, "verdicts")?;
        for kind in VerdictKind::ALL {
            write!(
                out,
                "  {:<28} {}",
                kind.name(),
                tally.by_kind[kind as usize]
            )?;
            if kind == VerdictKind::ToAllServers && tally.copies > 0 {
                write!(out, " ({} copies)", tally.copies)?;
            }
            writeln!(out)?;
        }
        let mut drops = [0u64; DropReason::COUNT];
        for worker in self.workers {
            for (reason, n) in worker.counters().drop_counts() {
                drops[reason as usize] += n;
            }
        }
        if drops.iter().any(|n| *n > 0) {
            writeln!(out, "drops by reason")?;
            for reason in DropReason::ALL {
                let n = drops[*reason as usize];
                if n > 0 {
                    writeln!(out, "  {:<28} {n}", reason.name())?;
                }
            }
        }
        writeln!(out, "pipeline counters")?;
        for counter in Counter::ALL {
            let n: u64 = self
                .workers
                .iter()
                .map(|w| w.counters().get(*counter))
                .sum();
            if n > 0 {
                writeln!(out, "  {:<28} {n}", counter.name())?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_starts_at_one_second_and_never_goes_back() {
        let mut clock = ReplayClock::default();
        let base = 1_700_000_000 * NANOS_PER_SEC;
        assert_eq!(clock.now(base), NANOS_PER_SEC);
        assert_eq!(clock.now(base + 5), NANOS_PER_SEC + 5);
        assert_eq!(clock.now(base + 2), NANOS_PER_SEC + 5);
        assert_eq!(clock.now(base - 10), NANOS_PER_SEC + 5);
        assert_eq!(clock.now(base + 9), NANOS_PER_SEC + 9);
    }

    #[test]
    fn the_verdict_log_sits_next_to_the_output() {
        assert_eq!(
            default_verdicts_path(Path::new("runs/out.pcap")),
            PathBuf::from("runs/out.pcap.verdicts.tsv")
        );
    }
}
