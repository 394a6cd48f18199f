//! What the churn scenario does to the LB while the load runs, and when.
//!
//! Times are fractions of the run, so a short test run and the full demo go through the same
//! steps in the same order. Every step is something an operator does to a live service:
//! growing the pool, draining servers, switching the policy, restarting the LB. Removals
//! are not scheduled: a drained server is removed once it has no connection left (see
//! `scenario.rs`), as docs/operations.md asks.

use std::time::Duration;

use anyhow::bail;
use cheetah_core::policy::PolicyKind;

/// One change to the LB.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// `ctl servers add` with the VIP, draining, on every instance, then `ctl servers
    /// activate` on every instance: the server takes new connections from then on.
    Add(u16),
    /// `ctl servers drain`: no new connections; the runner removes it once it is empty.
    Drain(u16),
    /// `ctl policy set`, with the load metric the policy should weigh.
    Policy {
        policy: PolicyKind,
        metric: &'static str,
    },
    /// SIGTERM, then a new `cheetah run` (state file: tables, MSBs).
    GracefulRestart,
    /// SIGKILL, then a new `cheetah run`: nothing is flushed on the way down.
    KillRestart,
}

impl Action {
    /// Short text for the progress line, the results and the plot.
    pub fn label(&self) -> String {
        match self {
            Action::Add(id) => format!("add s{id}"),
            Action::Drain(id) => format!("drain s{id}"),
            Action::Policy { policy, .. } => format!("policy {policy}"),
            Action::GracefulRestart => "LB restart (SIGTERM)".into(),
            Action::KillRestart => "LB restart (kill -9)".into(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// Since the start of the load.
    pub at: Duration,
    pub action: Action,
}

/// The pool the LB starts with and the steps, for `servers` testbed servers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// Server ids in the LB's config at start; the others are added by steps.
    pub initial_pool: Vec<u16>,
    pub steps: Vec<Step>,
}

/// Fewest servers the schedule works with: two are added at run time, three are drained,
/// and the pool must still hold two that take new connections at the end.
pub const MIN_SERVERS: u16 = 5;

impl Schedule {
    /// The scenario for `servers` servers (ids 1..=servers) and a run of `duration`.
    ///
    /// The LB starts with all but the last two servers. Server 2 is drained early while it
    /// holds long-lived sessions (they must keep going to the end, so it is removed only
    /// after the load stops); the first added server is drained after it has only had
    /// connections that end (so it empties and is removed during the load). Policy changes
    /// and both kinds of restart fall between them. The last drain comes early enough that
    /// a half-open connection on that server (a SYN-ACK whose client completed with another
    /// server, retransmitted for about a minute) is gone before the run ends, so every
    /// drained server is removed; and the timestamp MSB moves on after the kill -9.
    pub fn new(servers: u16, duration: Duration) -> anyhow::Result<Self> {
        if servers < MIN_SERVERS {
            bail!("the churn scenario needs at least {MIN_SERVERS} servers (--servers {servers})");
        }
        let first_added = servers - 1;
        let second_added = servers;
        let at = |fraction: f64| duration.mul_f64(fraction);
        let steps = vec![
            (0.08, Action::Add(first_added)),
            (
                0.16,
                Action::Policy {
                    policy: PolicyKind::PowerOfTwo,
                    metric: "active-connections",
                },
            ),
            (0.24, Action::Drain(2)),
            (0.32, Action::GracefulRestart),
            (0.40, Action::Add(second_added)),
            (0.48, Action::Drain(first_added)),
            (
                0.56,
                Action::Policy {
                    policy: PolicyKind::AutoWeightedRoundRobin,
                    metric: "reported",
                },
            ),
            (0.64, Action::KillRestart),
            (0.70, Action::Drain(second_added)),
        ]
        .into_iter()
        .map(|(fraction, action)| Step {
            at: at(fraction),
            action,
        })
        .collect();
        Ok(Schedule {
            initial_pool: (1..first_added).collect(),
            steps,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eight_servers_start_with_six_and_add_the_other_two() {
        let schedule = Schedule::new(8, Duration::from_secs(150)).unwrap();
        assert_eq!(schedule.initial_pool, [1, 2, 3, 4, 5, 6]);
        let added: Vec<u16> = schedule
            .steps
            .iter()
            .filter_map(|s| match s.action {
                Action::Add(id) => Some(id),
                _ => None,
            })
            .collect();
        assert_eq!(added, [7, 8]);
    }

    #[test]
    fn steps_are_in_order_within_the_run_and_cover_every_kind_of_change() {
        let duration = Duration::from_secs(150);
        let schedule = Schedule::new(8, duration).unwrap();
        let times: Vec<Duration> = schedule.steps.iter().map(|s| s.at).collect();
        assert!(times.windows(2).all(|w| w[0] < w[1]), "{times:?}");
        assert!(*times.last().unwrap() < duration);
        let has = |wanted: fn(&Action) -> bool| schedule.steps.iter().any(|s| wanted(&s.action));
        assert!(has(|a| matches!(a, Action::GracefulRestart)));
        assert!(has(|a| matches!(a, Action::KillRestart)));
        assert!(has(|a| matches!(
            a,
            Action::Policy {
                policy: PolicyKind::PowerOfTwo,
                ..
            }
        )));
        assert!(has(|a| matches!(
            a,
            Action::Policy {
                policy: PolicyKind::AutoWeightedRoundRobin,
                ..
            }
        )));
        // An early server holding long-lived sessions, then both added servers.
        let drained: Vec<u16> = schedule
            .steps
            .iter()
            .filter_map(|s| match s.action {
                Action::Drain(id) => Some(id),
                _ => None,
            })
            .collect();
        assert_eq!(drained, [2, 7, 8]);
    }

    #[test]
    fn the_schedule_scales_with_the_duration() {
        let long = Schedule::new(8, Duration::from_secs(150)).unwrap();
        let short = Schedule::new(8, Duration::from_secs(40)).unwrap();
        for (l, s) in long.steps.iter().zip(&short.steps) {
            assert_eq!(l.action, s.action);
            let ratio = l.at.as_secs_f64() / s.at.as_secs_f64();
            assert!((ratio - 150.0 / 40.0).abs() < 1e-6);
        }
    }

    #[test]
    fn too_few_servers_are_refused() {
        let error = Schedule::new(4, Duration::from_secs(60)).unwrap_err();
        assert!(error.to_string().contains("at least 5"), "{error}");
    }
}
