//! One (VIP, server)'s health as this instance decides it: probe outcomes, counted in a
//! row, move it between unknown, up and down (`fall` failures in a row take it down,
//! `rise` successes bring it up), with a reason an operator can read.

use std::time::Instant;

use cheetah_core::tables::Health;

/// What one probe found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// The server answered the SYN with a SYN-ACK for it.
    SynAck,
    /// The HTTP check got this status (2xx and 3xx are healthy).
    HttpStatus(u16),
    /// The server answered with a RST: nothing listens on the port.
    Refused,
    /// No answer within the timeout.
    Timeout,
    /// The probe could not be made or read (no route, a broken HTTP answer...).
    Failed(String),
}

impl ProbeOutcome {
    /// Every value of [`ProbeOutcome::result`], for metrics with zeros.
    pub const RESULTS: [&'static str; 5] = ["ok", "refused", "timeout", "bad_status", "error"];

    pub fn healthy(&self) -> bool {
        match self {
            ProbeOutcome::SynAck => true,
            ProbeOutcome::HttpStatus(status) => (200..400).contains(status),
            _ => false,
        }
    }

    /// The `result` label of `cheetah_health_probes_total`.
    pub fn result(&self) -> &'static str {
        match self {
            ProbeOutcome::SynAck => "ok",
            ProbeOutcome::HttpStatus(_) if self.healthy() => "ok",
            ProbeOutcome::HttpStatus(_) => "bad_status",
            ProbeOutcome::Refused => "refused",
            ProbeOutcome::Timeout => "timeout",
            ProbeOutcome::Failed(_) => "error",
        }
    }

    /// In words, as the reason of a health state.
    pub fn describe(&self) -> String {
        match self {
            ProbeOutcome::SynAck => "syn-ack".into(),
            ProbeOutcome::HttpStatus(status) => format!("http {status}"),
            ProbeOutcome::Refused => "refused".into(),
            ProbeOutcome::Timeout => "timeout".into(),
            ProbeOutcome::Failed(why) => why.clone(),
        }
    }
}

/// How many probes in a row decide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Thresholds {
    pub fall: u32,
    pub rise: u32,
}

/// The state of one (VIP, server) and the probes in a row that lead to the next.
#[derive(Clone, Debug)]
pub struct HealthMachine {
    state: Health,
    successes: u32,
    failures: u32,
    reason: String,
    since: Instant,
}

impl HealthMachine {
    /// Unknown until its probes decide, whichever way: `rise` successes or `fall` failures
    /// in a row.
    pub fn new(now: Instant) -> Self {
        HealthMachine {
            state: Health::Unknown,
            successes: 0,
            failures: 0,
            reason: "not probed yet".into(),
            since: now,
        }
    }

    pub fn state(&self) -> Health {
        self.state
    }

    /// Why it is in its state: the last probe's outcome, and while that outcome disagrees
    /// with the state, how far the count is from changing it (`timeout (1 of 3 to go
    /// down)`).
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// When it entered its state.
    pub fn since(&self) -> Instant {
        self.since
    }

    /// Takes one probe's outcome; returns the new state if it changed.
    pub fn record(
        &mut self,
        outcome: &ProbeOutcome,
        thresholds: Thresholds,
        now: Instant,
    ) -> Option<Health> {
        let (count, needed, target) = if outcome.healthy() {
            self.failures = 0;
            self.successes = self.successes.saturating_add(1);
            (self.successes, thresholds.rise, Health::Up)
        } else {
            self.successes = 0;
            self.failures = self.failures.saturating_add(1);
            (self.failures, thresholds.fall, Health::Down)
        };
        let what = outcome.describe();
        if self.state == target {
            self.reason = what;
            return None;
        }
        if count >= needed {
            self.state = target;
            self.since = now;
            self.reason = what;
            return Some(target);
        }
        self.reason = format!("{what} ({count} of {needed} to go {})", target.name());
        None
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const DEFAULTS: Thresholds = Thresholds { fall: 3, rise: 2 };

    fn feed(machine: &mut HealthMachine, outcomes: &[ProbeOutcome]) -> Vec<Option<Health>> {
        let start = Instant::now();
        outcomes
            .iter()
            .enumerate()
            .map(|(i, o)| machine.record(o, DEFAULTS, start + Duration::from_secs(i as u64)))
            .collect()
    }

    #[test]
    fn rise_successes_bring_it_up_and_fall_failures_take_it_down() {
        let mut m = HealthMachine::new(Instant::now());
        assert_eq!(m.state(), Health::Unknown);
        assert_eq!(m.reason(), "not probed yet");
        assert_eq!(
            feed(&mut m, &[ProbeOutcome::SynAck]),
            [None],
            "one success of two"
        );
        assert_eq!(m.reason(), "syn-ack (1 of 2 to go up)");
        assert_eq!(feed(&mut m, &[ProbeOutcome::SynAck]), [Some(Health::Up)]);
        assert_eq!(m.reason(), "syn-ack");
        let up_since = m.since();
        assert_eq!(
            feed(
                &mut m,
                &[
                    ProbeOutcome::Timeout,
                    ProbeOutcome::Refused,
                    ProbeOutcome::SynAck,
                ]
            ),
            [None, None, None],
            "a success in between starts the count again"
        );
        assert_eq!(m.state(), Health::Up);
        assert_eq!(m.since(), up_since);
        assert_eq!(
            feed(
                &mut m,
                &[
                    ProbeOutcome::Refused,
                    ProbeOutcome::Refused,
                    ProbeOutcome::Refused
                ]
            ),
            [None, None, Some(Health::Down)]
        );
        assert_eq!(m.reason(), "refused");
        assert_eq!(
            feed(&mut m, &[ProbeOutcome::Timeout]),
            [None],
            "already down"
        );
        assert_eq!(m.reason(), "timeout");
        assert_eq!(feed(&mut m, &[ProbeOutcome::SynAck]), [None]);
        assert_eq!(m.reason(), "syn-ack (1 of 2 to go up)");
        assert_eq!(feed(&mut m, &[ProbeOutcome::SynAck]), [Some(Health::Up)]);
    }

    #[test]
    fn an_undecided_server_goes_down_after_fall_failures() {
        let mut m = HealthMachine::new(Instant::now());
        assert_eq!(
            feed(&mut m, &[ProbeOutcome::Timeout, ProbeOutcome::Timeout]),
            [None, None]
        );
        assert_eq!(m.reason(), "timeout (2 of 3 to go down)");
        assert_eq!(
            feed(&mut m, &[ProbeOutcome::Failed("no route to host".into())]),
            [Some(Health::Down)]
        );
        assert_eq!(m.reason(), "no route to host");
    }

    #[test]
    fn http_statuses_2xx_and_3xx_are_healthy() {
        for (status, healthy, result) in [
            (200, true, "ok"),
            (204, true, "ok"),
            (301, true, "ok"),
            (399, true, "ok"),
            (404, false, "bad_status"),
            (503, false, "bad_status"),
            (199, false, "bad_status"),
        ] {
            let outcome = ProbeOutcome::HttpStatus(status);
            assert_eq!(outcome.healthy(), healthy, "{status}");
            assert_eq!(outcome.result(), result, "{status}");
            assert!(ProbeOutcome::RESULTS.contains(&outcome.result()));
        }
        let mut m = HealthMachine::new(Instant::now());
        let one = Thresholds { fall: 1, rise: 1 };
        assert_eq!(
            m.record(&ProbeOutcome::HttpStatus(503), one, Instant::now()),
            Some(Health::Down)
        );
        assert_eq!(m.reason(), "http 503");
    }
}
