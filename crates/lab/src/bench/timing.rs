//! Time stamps, tick-to-nanosecond calibration, and the repeat-and-subtract protocol.
//!
//! Ticks are the TSC, read between `lfence`s so that the reads neither start before the
//! measured code has finished nor let it start early. The TSC runs at a constant rate
//! (`constant_tsc`), so ticks convert to nanoseconds with one factor, measured against the
//! OS monotonic clock.
//!
//! Every measured block runs a whole pass (or several) over its packets: "restore only"
//! first (copy each packet's pristine bytes back into its buffer), then "restore and
//! process". The restore cost is reported and subtracted, run by run, so the figure is the
//! processing of a packet whose header was just written, i.e. is in L1, as it is after the
//! I/O layer touched it. Rows are timed in interleaved rounds ([`measure_all`]).

use std::time::{Duration, Instant};

/// A TSC reading, serialised against surrounding code.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn ticks() -> u64 {
    use core::arch::x86_64::{_mm_lfence, _rdtsc};
    // SAFETY: lfence and rdtsc exist on every x86_64 CPU and touch no memory.
    unsafe {
        _mm_lfence();
        let t = _rdtsc();
        _mm_lfence();
        t
    }
}

/// Elsewhere there is no TSC: ticks are nanoseconds of the monotonic clock.
#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
pub fn ticks() -> u64 {
    use std::sync::OnceLock;
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Ticks per nanosecond.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    pub ticks_per_ns: f64,
    started: Instant,
    started_ticks: u64,
}

impl Clock {
    /// Spins for `span` and compares the TSC with the monotonic clock.
    pub fn calibrate(span: Duration) -> Self {
        let (t0, c0) = (Instant::now(), ticks());
        while t0.elapsed() < span {
            std::hint::spin_loop();
        }
        let (c1, elapsed) = (ticks(), t0.elapsed());
        Clock {
            ticks_per_ns: (c1 - c0) as f64 / elapsed.as_nanos() as f64,
            started: t0,
            started_ticks: c0,
        }
    }

    /// The rate over everything since calibration began: a check that the TSC stayed
    /// constant over the run.
    pub fn rate_since_start(&self) -> f64 {
        let (c, elapsed) = (ticks(), self.started.elapsed());
        (c - self.started_ticks) as f64 / elapsed.as_nanos() as f64
    }

    pub fn ns(&self, ticks: f64) -> f64 {
        ticks / self.ticks_per_ns
    }
}

/// Median, min and max of per-run figures.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Stats {
    pub fn of(values: &[f64]) -> Self {
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Stats {
            median,
            min: v[0],
            max: v[n - 1],
        }
    }
}

/// What a pass does: only the baseline (restore, or the bare loop), or the baseline and the
/// measured work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    Baseline,
    Work,
}

/// Per-item ticks: the work net of its baseline, the baseline, and both together.
#[derive(Clone, Copy, Debug, Default)]
pub struct Measurement {
    pub net: Stats,
    pub baseline: Stats,
    pub gross: Stats,
    /// Runs made in all.
    pub runs: usize,
    /// Runs during which the OS switched this thread out: another process took the core
    /// for a while, so the run's time includes someone else's work.
    pub preempted: usize,
    /// Whether the figures are of the undisturbed runs only (else of every run, because
    /// fewer than [`MIN_RUNS`] were undisturbed: the figures are then inflated).
    pub undisturbed_only: bool,
}

/// Fewest runs a median is taken over.
pub const MIN_RUNS: usize = 5;

/// Context switches of this thread so far (voluntary and not), 0 where unknown.
fn context_switches() -> u64 {
    #[cfg(target_os = "linux")]
    // SAFETY: getrusage fills the zeroed struct we own.
    unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_THREAD, &mut usage) == 0 {
            return (usage.ru_nivcsw + usage.ru_nvcsw) as u64;
        }
    }
    0
}

/// Something timed in passes: a path's packets, the element, a hash.
pub trait Timed {
    /// Items (packets, connection ids) one pass covers.
    fn items(&self) -> usize;
    fn pass(&mut self, pass: Pass);
}

/// The runs of one row: per run, ticks per item of the baseline and of baseline + work,
/// and whether the run was undisturbed.
struct Sampler {
    passes: u64,
    per: f64,
    samples: Vec<(f64, f64, bool)>,
}

impl Sampler {
    fn new(items: usize, per_run: u64) -> Self {
        let passes = per_run.div_ceil(items.max(1) as u64).max(1);
        Sampler {
            passes,
            per: (passes * items as u64) as f64,
            samples: Vec::new(),
        }
    }

    /// One run: an untimed pass to bring the row's code and state back into the caches
    /// (the previous row evicted them), then the timed baseline and work passes.
    fn run(&mut self, timed: &mut dyn Timed) {
        timed.pass(Pass::Work);
        let switches = context_switches();
        let t0 = ticks();
        for _ in 0..self.passes {
            timed.pass(Pass::Baseline);
        }
        let t1 = ticks();
        for _ in 0..self.passes {
            timed.pass(Pass::Work);
        }
        let t2 = ticks();
        let undisturbed = context_switches() == switches;
        self.samples.push((
            (t1 - t0) as f64 / self.per,
            (t2 - t1) as f64 / self.per,
            undisturbed,
        ));
    }

    fn undisturbed(&self) -> usize {
        self.samples.iter().filter(|r| r.2).count()
    }

    fn finish(&self) -> Measurement {
        let clean = self.undisturbed();
        let undisturbed_only = clean >= MIN_RUNS;
        let used: Vec<_> = self
            .samples
            .iter()
            .filter(|r| r.2 || !undisturbed_only)
            .collect();
        let column = |f: &dyn Fn(&(f64, f64, bool)) -> f64| -> Vec<f64> {
            used.iter().map(|r| f(r)).collect()
        };
        Measurement {
            net: Stats::of(&column(&|r| r.1 - r.0)),
            baseline: Stats::of(&column(&|r| r.0)),
            gross: Stats::of(&column(&|r| r.1)),
            runs: self.samples.len(),
            preempted: self.samples.len() - clean,
            undisturbed_only,
        }
    }
}

/// Times every row in rounds, one run of each row per round, until each has `runs`
/// undisturbed runs (or made `4 * runs`).
///
/// Round-robin rather than row after row: on a VM whose host and neighbours come and go,
/// the machine's speed drifts over seconds, and rows measured minutes apart would differ by
/// that drift. Interleaved, every row sees the same mix of machine states, so the ratios
/// between rows (cheetah vs plain hash "in the same run") compare like with like.
///
/// A run times enough baseline passes, then as many work passes, to cover `per_run`
/// items, and yields ticks per item. The medians are over the undisturbed runs when there
/// are at least [`MIN_RUNS`]: a run that lost the core to another process measured it too.
pub fn measure_all(rows: &mut [&mut dyn Timed], runs: usize, per_run: u64) -> Vec<Measurement> {
    let mut samplers: Vec<Sampler> = rows
        .iter()
        .map(|r| Sampler::new(r.items(), per_run))
        .collect();
    loop {
        let mut ran = false;
        for (row, sampler) in rows.iter_mut().zip(&mut samplers) {
            if sampler.undisturbed() < runs && sampler.samples.len() < 4 * runs {
                sampler.run(&mut **row);
                ran = true;
            }
        }
        if !ran {
            break;
        }
    }
    samplers.iter().map(Sampler::finish).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_take_the_middle() {
        let s = Stats::of(&[5.0, 1.0, 3.0, 9.0, 2.0]);
        assert_eq!((s.median, s.min, s.max), (3.0, 1.0, 9.0));
        assert_eq!(Stats::of(&[1.0, 2.0]).median, 1.5);
    }
}
