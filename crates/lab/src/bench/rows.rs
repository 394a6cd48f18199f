//! Rows made ready to time: the traces of each mode, and what each row runs on.

use std::time::Instant;

use anyhow::Context as _;
use cheetah_core::config::Mode;
use cheetah_core::lb::Counter;
use cheetah_core::policy::PolicyKind;

use super::element::Element;
use super::hashcost::HashBench;
use super::items::{Item, Path};
use super::lab::Lab;
use super::pipeline;
use super::report::Row;
use super::timing::{Measurement, Timed};
use super::trace::{self, Trace, TraceConfig};
use super::Args;

/// The trace of one mode and the LB it was played through.
pub struct ModeTrace {
    pub lab: Lab,
    pub trace: Trace,
    /// Option lookups of that LB over the whole trace: (fast, slow).
    pub options: (u64, u64),
}

/// One trace per mode, generated when a row first needs it.
pub struct Traces {
    pub config: TraceConfig,
    pub servers: u16,
    pub by_mode: Vec<ModeTrace>,
}

impl Traces {
    pub fn get(&mut self, mode: Mode, policy: PolicyKind) -> anyhow::Result<&ModeTrace> {
        if let Some(at) = self.by_mode.iter().position(|t| t.lab.mode == mode) {
            return Ok(&self.by_mode[at]);
        }
        let started = Instant::now();
        let lab = Lab::new(mode, policy, self.servers)?;
        let mut warm_up = lab.worker();
        let trace = trace::generate(&self.config, &mut warm_up)
            .with_context(|| format!("generating the {} trace", mode.name()))?;
        let counters = warm_up.counters();
        let options = (
            counters.get(Counter::OptionsFastPath),
            counters.get(Counter::OptionsSlowPath),
        );
        eprintln!(
            "trace {}: {} packets of {} connections (max {} open) in {:.2?}",
            mode.name(),
            trace.packets.len(),
            trace.keys.len(),
            trace.max_concurrent,
            started.elapsed()
        );
        self.by_mode.push(ModeTrace {
            lab,
            trace,
            options,
        });
        Ok(self.by_mode.last().unwrap())
    }
}

/// A row made ready: what it times, and what the report says about it.
pub enum Subject {
    Pipeline(Box<pipeline::Prepared>),
    Element(Element),
    /// Throughput, then latency.
    Hash(HashBench, HashBench),
}

impl Subject {
    /// Builds what `item` runs on (and checks it: see `pipeline::prepare`).
    pub fn prepare(item: &Item, args: &Args, traces: &mut Traces) -> anyhow::Result<Self> {
        let modal = traces.get(item.mode, args.trace_policy)?;
        Ok(match item.path {
            Path::Siphash | Path::Toeplitz => {
                let hash = |chained| {
                    let hasher = modal.lab.plane.shared().hasher;
                    HashBench::new(modal.trace.keys.clone(), &hasher, item.path, chained)
                };
                Subject::Hash(hash(false), hash(true))
            }
            Path::Element => Subject::Element(Element::prepare(
                &modal.lab,
                &modal.trace,
                args.full_restore,
                args.ring_frames,
            )?),
            _ => {
                // Each policy's SYN row gets an LB of its own with that VIP policy.
                let own_lab = match item.policy {
                    Some(policy) => Some(Lab::new(item.mode, policy, args.servers)?),
                    None => None,
                };
                let lab = own_lab.as_ref().unwrap_or(&modal.lab);
                Subject::Pipeline(Box::new(
                    pipeline::prepare(
                        lab,
                        &modal.trace,
                        item.path,
                        args.full_restore,
                        args.per_packet,
                        args.ring_frames,
                    )
                    .with_context(|| item.label())?,
                ))
            }
        })
    }

    /// Runs `n` packets through the row's `measured_*` function, untimed.
    pub fn run_for_instructions(&mut self, n: u64) {
        match self {
            Subject::Pipeline(p) => p.run_for_instructions(n),
            Subject::Element(e) => e.run_for_instructions(n),
            Subject::Hash(h, _) => h.run_for_instructions(n),
        }
    }

    pub fn timed(&mut self) -> Vec<&mut dyn Timed> {
        match self {
            Subject::Pipeline(p) => vec![&mut **p],
            Subject::Element(e) => vec![e],
            Subject::Hash(throughput, latency) => vec![throughput, latency],
        }
    }

    /// The report row, given the row's measurements (in `timed` order).
    pub fn row(&self, item: Item, measured: &[Measurement]) -> Row {
        let (count, options, restore_bytes) = match self {
            Subject::Pipeline(p) => (
                p.set.len(),
                Some((p.options_fast, p.options_slow)),
                p.set.mean_restore_bytes(),
            ),
            Subject::Element(e) => (e.set.len(), None, e.set.mean_restore_bytes()),
            Subject::Hash(h, _) => (h.items(), None, 0.0),
        };
        Row {
            item,
            count,
            timing: measured[0],
            latency: measured.get(1).copied(),
            ir: None,
            options,
            restore_bytes,
        }
    }
}

/// How many packets (or ids) one pass of `item` has, for the callgrind child's count.
pub fn item_count(item: &Item, trace: &Trace) -> usize {
    match item.path {
        Path::Siphash | Path::Toeplitz => trace.keys.len(),
        path => trace.packets.iter().filter(|p| path.selects(p)).count(),
    }
}
