//! The paper's metrics (section 2.1), measured over a window of the run.
//!
//! * **Broken connections**: the share of connections "mapped to at least two different
//!   servers during their starting and ending times". A connection counts once, at the
//!   first change that would send its next packet elsewhere. The denominator is every
//!   connection open at some instant of the window (those open when it starts plus those
//!   arriving in it); a connection broken before the window is not counted.
//! * **Imbalance** of a server: its active connections over the average of the pool's
//!   servers. **System imbalance**: the maximum over the pool. The run's imbalance is the
//!   *time-weighted* average of the system imbalance over the window, computed exactly:
//!   the maximum is tracked in O(1) per event with a histogram of per-server counts.
//!   Servers out of the pool (draining) are left out of both the maximum and the average.
//!
//! Per-second series (for the figure-9 and LB-pool scenarios) count arrivals, natural
//! completions and breaks in each second of the window.

use cheetah_core::types::NANOS_PER_SEC;
use cheetah_core::Nanos;
use serde::Serialize;

/// Tracks the maximum and the sum of the per-server active counts of the pool.
#[derive(Default)]
pub struct Imbalance {
    /// `histogram[k]`: pool servers with `k` active connections.
    histogram: Vec<u32>,
    max: usize,
    sum: u64,
    servers: u32,
}

impl Imbalance {
    pub fn add_server(&mut self, active: u32) {
        let k = active as usize;
        if self.histogram.len() <= k {
            self.histogram.resize(k + 1, 0);
        }
        self.histogram[k] += 1;
        self.max = self.max.max(k);
        self.sum += u64::from(active);
        self.servers += 1;
    }

    pub fn remove_server(&mut self, active: u32) {
        let k = active as usize;
        self.histogram[k] -= 1;
        self.sum -= u64::from(active);
        self.servers -= 1;
        while self.max > 0 && self.histogram[self.max] == 0 {
            self.max -= 1;
        }
    }

    /// A pool server went from `from` to `from + 1` connections.
    #[inline]
    pub fn increment(&mut self, from: u32) {
        let k = from as usize;
        if self.histogram.len() <= k + 1 {
            self.histogram.resize(k + 2, 0);
        }
        self.histogram[k] -= 1;
        self.histogram[k + 1] += 1;
        if k + 1 > self.max {
            self.max = k + 1;
        }
        self.sum += 1;
    }

    /// A pool server went from `from` to `from - 1` connections (`from > 0`).
    #[inline]
    pub fn decrement(&mut self, from: u32) {
        let k = from as usize;
        self.histogram[k] -= 1;
        self.histogram[k - 1] += 1;
        if k == self.max && self.histogram[k] == 0 {
            self.max = k - 1;
        }
        self.sum -= 1;
    }

    /// Sum of the pool's active connections.
    pub fn sum(&self) -> u64 {
        self.sum
    }

    pub fn max(&self) -> u32 {
        self.max as u32
    }

    /// Maximum over average; 1 for an idle or empty pool.
    #[inline]
    pub fn system_imbalance(&self) -> f64 {
        if self.sum == 0 {
            1.0
        } else {
            self.max as f64 * f64::from(self.servers) / self.sum as f64
        }
    }
}

/// What happened in one second of the window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Second {
    pub arrivals: u64,
    /// Connections that ended on their own.
    pub completed: u64,
    pub broken: u64,
    /// Active connections at the end of the second.
    pub active: u64,
    /// Servers in the pool at the end of the second.
    pub pool: u64,
    /// System imbalance at the end of the second.
    pub system_imbalance: f64,
}

/// Metrics of one run.
pub struct Recorder {
    start: Nanos,
    end: Nanos,
    last: Nanos,
    started: bool,
    imbalance_integral: f64,
    active_integral: f64,
    pub connections: u64,
    pub broken: u64,
    pub bytes: u64,
    pub broken_bytes: u64,
    pub fallback_connections: u64,
    pub fallback_broken: u64,
    pub series: Vec<Second>,
    timeseries: bool,
}

impl Recorder {
    pub fn new(start: Nanos, end: Nanos, timeseries: bool) -> Self {
        Recorder {
            start,
            end,
            last: start,
            started: false,
            imbalance_integral: 0.0,
            active_integral: 0.0,
            connections: 0,
            broken: 0,
            bytes: 0,
            broken_bytes: 0,
            fallback_connections: 0,
            fallback_broken: 0,
            series: Vec::new(),
            timeseries,
        }
    }

    /// The instant the window opens, so the engine can count what is open then.
    pub fn start(&self) -> Nanos {
        self.start
    }

    pub fn in_window(&self, now: Nanos) -> bool {
        self.started && now <= self.end
    }

    /// Opens the window: `open` connections (`open_fallback` without timestamps, `bytes`
    /// in all) are open at its start.
    pub fn open(&mut self, open: u64, open_fallback: u64, bytes: u64) {
        self.started = true;
        self.connections += open;
        self.fallback_connections += open_fallback;
        self.bytes += bytes;
    }

    /// Integrates the state that held from the last event until `now`.
    #[inline]
    pub fn advance(&mut self, now: Nanos, imbalance: &Imbalance) {
        let now = now.min(self.end);
        if self.started && now > self.last {
            let dt = (now - self.last) as f64;
            self.imbalance_integral += dt * imbalance.system_imbalance();
            self.active_integral += dt * imbalance.sum() as f64;
        }
        self.last = self.last.max(now);
    }

    fn second(&mut self, now: Nanos) -> Option<&mut Second> {
        if !self.timeseries || !self.in_window(now) {
            return None;
        }
        let index = ((now - self.start) / NANOS_PER_SEC) as usize;
        if self.series.len() <= index {
            self.series.resize(index + 1, Second::default());
        }
        self.series.get_mut(index)
    }

    pub fn arrival(&mut self, now: Nanos, bytes: u64, timestamps: bool) {
        if !self.in_window(now) {
            return;
        }
        self.connections += 1;
        self.bytes += bytes;
        if !timestamps {
            self.fallback_connections += 1;
        }
        if let Some(second) = self.second(now) {
            second.arrivals += 1;
        }
    }

    pub fn completion(&mut self, now: Nanos) {
        if let Some(second) = self.second(now) {
            second.completed += 1;
        }
    }

    pub fn broken(&mut self, now: Nanos, bytes: u64, timestamps: bool) {
        if !self.in_window(now) {
            return;
        }
        self.broken += 1;
        self.broken_bytes += bytes;
        if !timestamps {
            self.fallback_broken += 1;
        }
        if let Some(second) = self.second(now) {
            second.broken += 1;
        }
    }

    /// Closes the second that ends at `now` with a snapshot of the state.
    pub fn end_of_second(&mut self, now: Nanos, imbalance: &Imbalance, pool: usize) {
        if let Some(second) = self.second(now.saturating_sub(1)) {
            second.active = imbalance.sum();
            second.pool = pool as u64;
            second.system_imbalance = imbalance.system_imbalance();
        }
    }

    pub fn mean_system_imbalance(&self) -> f64 {
        let span = self.end.saturating_sub(self.start) as f64;
        if span == 0.0 {
            1.0
        } else {
            self.imbalance_integral / span
        }
    }

    pub fn mean_active(&self) -> f64 {
        let span = self.end.saturating_sub(self.start) as f64;
        if span == 0.0 {
            0.0
        } else {
            self.active_integral / span
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_follows_increments_and_decrements() {
        let mut imbalance = Imbalance::default();
        for _ in 0..4 {
            imbalance.add_server(0);
        }
        imbalance.increment(0);
        imbalance.increment(1);
        imbalance.increment(0);
        // Counts 2, 1, 0, 0: max 2, average 0.75.
        assert_eq!(imbalance.max(), 2);
        assert!((imbalance.system_imbalance() - 2.0 / 0.75).abs() < 1e-12);
        imbalance.decrement(2);
        assert_eq!(imbalance.max(), 1);
        imbalance.remove_server(1);
        assert_eq!(imbalance.max(), 1);
        imbalance.remove_server(1);
        assert_eq!(imbalance.max(), 0);
        assert_eq!(imbalance.system_imbalance(), 1.0);
    }

    #[test]
    fn system_imbalance_is_time_weighted() {
        let mut imbalance = Imbalance::default();
        imbalance.add_server(1);
        imbalance.add_server(1);
        let mut recorder = Recorder::new(0, 4, false);
        recorder.open(2, 0, 0);
        // Balanced (1.0) for 1 ns, then counts 2 and 0 (imbalance 2.0) for 3 ns.
        recorder.advance(1, &imbalance);
        imbalance.increment(1);
        imbalance.decrement(1);
        recorder.advance(4, &imbalance);
        assert!((recorder.mean_system_imbalance() - 1.75).abs() < 1e-12);
    }
}
