//! Small scenarios whose outcome can be worked out by hand.
//!
//! Four servers, connections that outlive the run (so nothing ends by itself), and one or
//! two scheduled changes. The expectations are derived in each test's comment.

use cheetah_core::policy::PolicyKind;
use cheetah_sim::engine::{run, RunOptions, RunResult};
use cheetah_sim::lbs::LbSpec;
use cheetah_sim::scenario::{Action, LbPoolSpec, Scenario, ScheduledChange, UpdateSpec};
use cheetah_sim::workload::{DurationModel, WorkloadSpec};

/// Four servers with 20000 connections that never end; `changes` happen during a 10 s run.
fn four_servers(changes: &[(f64, Action)]) -> Scenario {
    Scenario {
        seed: 11,
        servers: 4,
        active_connections: 20_000.0,
        warmup_s: 0.0,
        duration_s: 10.0,
        workload: WorkloadSpec {
            durations: DurationModel::Fixed { seconds: 1.0e9 },
            no_timestamp_share: 0.0,
            ..WorkloadSpec::default()
        },
        updates: UpdateSpec {
            scheduled: changes
                .iter()
                .map(|&(at_s, action)| ScheduledChange { at_s, action })
                .collect(),
            ..UpdateSpec::default()
        },
        ..Scenario::default()
    }
}

fn simulate(scenario: &Scenario, lb: &LbSpec) -> RunResult {
    run(scenario, lb, None, &RunOptions::default())
}

fn lb(name: &str) -> LbSpec {
    LbSpec::from_name(name).unwrap_or_else(|| panic!("no LB {name}"))
}

fn assert_share(result: &RunResult, low: f64, high: f64) {
    let share = result.broken as f64 / result.connections as f64;
    assert!(
        (low..=high).contains(&share),
        "{}: {} of {} broken ({share:.4}), expected {low}..{high}",
        result.lb,
        result.broken,
        result.connections
    );
}

/// `pool[h % 4]` becomes `pool'[h % 3]`: over the 12 residues of `h mod 12` only 3 keep
/// their server, whichever server leaves, so about 3/4 of the connections break.
#[test]
fn removing_one_of_four_servers_breaks_three_quarters_under_modulo_hashing() {
    let scenario = four_servers(&[(5.0, Action::Remove)]);
    assert_share(&simulate(&scenario, &LbSpec::Hash), 0.72, 0.78);
}

/// Maglev moves the removed server's slots (1/4) and a sliver of the others'.
#[test]
fn removing_one_of_four_servers_breaks_about_a_quarter_under_maglev() {
    let scenario = four_servers(&[(5.0, Action::Remove)]);
    assert_share(&simulate(&scenario, &LbSpec::Maglev), 0.23, 0.29);
}

/// The cookie carries the server: nothing breaks, whatever the policy.
#[test]
fn removing_one_of_four_servers_breaks_nothing_under_cheetah() {
    let scenario = four_servers(&[(3.0, Action::Remove), (6.0, Action::Add)]);
    for policy in PolicyKind::ALL {
        let result = simulate(&scenario, &LbSpec::Cheetah { policy });
        assert_eq!(result.broken, 0, "{}", result.lb);
        assert!(result.connections >= 20_000);
    }
}

/// Clients without timestamps stay in the LB's LRU: server changes alone break none.
#[test]
fn cheetah_fallback_connections_survive_server_changes() {
    let mut scenario = four_servers(&[(3.0, Action::Remove), (6.0, Action::Remove)]);
    scenario.workload.no_timestamp_share = 0.5;
    let result = simulate(
        &scenario,
        &LbSpec::Cheetah {
            policy: PolicyKind::PowerOfTwo,
        },
    );
    assert!(result.fallback_connections > 9_000);
    assert_eq!(result.broken, 0);
}

/// Daisy chaining sends the removed server's connections on to it: none break. Without
/// it, Beamer's buckets behave like consistent hashing: the removed quarter breaks.
#[test]
fn beamer_daisy_chaining_saves_a_single_removal() {
    let scenario = four_servers(&[(5.0, Action::Remove)]);
    assert_eq!(simulate(&scenario, &lb("beamer")).broken, 0);
    assert_eq!(simulate(&scenario, &lb("faild")).broken, 0);
    assert_share(&simulate(&scenario, &lb("beamer-no-daisy")), 0.24, 0.26);
}

/// Remove server A, then server B. A's buckets (1/4 of all) went evenly to the three
/// others, so 1/3 of them to B; removing B moves them again and forgets A: the
/// connections on A in those buckets, 1/4 x 1/3 = 1/12 of all, break. B's own
/// connections are B's buckets' previous server now and survive. (Faild with 96 entries
/// per host, so that A's entries split evenly; its default 8 split 3/3/2.)
#[test]
fn beamer_and_faild_break_buckets_that_change_twice() {
    let scenario = four_servers(&[(3.0, Action::Remove), (6.0, Action::Remove)]);
    let faild = LbSpec::Faild {
        entries_per_server: 96,
    };
    for spec in [lb("beamer"), faild] {
        assert_share(&simulate(&scenario, &spec), 0.077, 0.090);
    }
}

/// Beamer forgets the previous server `timeout_s` after the change: the removed server's
/// quarter of the connections break then, even without a second change.
#[test]
fn beamer_timeout_breaks_connections_left_on_the_previous_server() {
    let scenario = four_servers(&[(2.0, Action::Remove)]);
    let beamer = LbSpec::Beamer {
        buckets_per_server: 100,
        timeout_s: Some(5.0),
        daisy_chaining: true,
    };
    let result = run(&scenario, &beamer, None, &RunOptions::default());
    assert_share(&result, 0.24, 0.26);
    let mut short = scenario.clone();
    short.duration_s = 6.9;
    assert_eq!(simulate(&short, &beamer).broken, 0);
}

/// SHELL with depth 2 keeps the removed server in the column's history: no break. The
/// next reconfiguration ages every column (Algorithm 1), so the first removed server's
/// connections (about a quarter) break at the second removal.
#[test]
fn shell_history_of_depth_two_survives_one_change_not_two() {
    let one = four_servers(&[(5.0, Action::Remove)]);
    assert_eq!(simulate(&one, &lb("shell-h2")).broken, 0);
    let two = four_servers(&[(3.0, Action::Remove), (6.0, Action::Remove)]);
    assert_share(&simulate(&two, &lb("shell-h2")), 0.20, 0.30);
    assert_eq!(simulate(&two, &lb("shell-h3")).broken, 0);
}

/// Two stateful LB instances; a server leaves at 3 s (no break: every instance has the
/// state), then a third instance is announced at 6 s. ECMP `m mod 2 -> m mod 3` keeps
/// 2 of the 6 residues of `m mod 6` on their instance, so 2/3 of the connections reach
/// an instance without their state, which places them by Maglev over the current pool:
/// those that were on the removed server (1/4) break. About 2/3 x 1/4 = 1/6.
#[test]
fn stateful_lbs_break_connections_moved_by_ecmp_after_a_server_change() {
    let mut scenario = four_servers(&[(3.0, Action::Remove)]);
    scenario.lb_pool = LbPoolSpec {
        instances: 2,
        changes: vec![ScheduledChange {
            at_s: 6.0,
            action: Action::Add,
        }],
    };
    let stateful = simulate(&scenario, &LbSpec::Stateful);
    assert_share(&stateful, 0.14, 0.19);

    // Cheetah routes cookie connections whatever the instance.
    let cheetah = LbSpec::Cheetah {
        policy: PolicyKind::RoundRobin,
    };
    assert_eq!(simulate(&scenario, &cheetah).broken, 0);

    // Without timestamps cheetah falls back to Maglev + LRU: the same table as the
    // stateful LB, so exactly the same connections break.
    scenario.workload.no_timestamp_share = 1.0;
    let fallback = simulate(&scenario, &cheetah);
    assert_eq!(fallback.broken, stateful.broken);
    assert_eq!(fallback.fallback_broken, fallback.broken);
}

/// Plain hashing has no state to lose when LB instances change: every instance computes
/// the same mapping.
#[test]
fn stateless_lbs_ignore_lb_instance_changes() {
    let mut scenario = four_servers(&[]);
    scenario.lb_pool = LbPoolSpec {
        instances: 3,
        changes: vec![
            ScheduledChange {
                at_s: 2.0,
                action: Action::Remove,
            },
            ScheduledChange {
                at_s: 4.0,
                action: Action::Add,
            },
        ],
    };
    for spec in [LbSpec::Hash, LbSpec::Maglev, lb("beamer"), lb("shell-h2")] {
        let result = simulate(&scenario, &spec);
        assert_eq!(result.broken, 0, "{}", result.lb);
        assert_eq!(result.lb_changes, 2);
    }
}

/// A one-server pool can neither lose its server nor get one back: random updates are
/// no-ops, and the run goes on.
#[test]
fn random_updates_leave_a_single_server_alone() {
    let mut scenario = four_servers(&[]);
    scenario.servers = 1;
    scenario.updates.rate_per_min = 600.0;
    for spec in [LbSpec::Hash, lb("beamer"), lb("shell-h2"), lb("cheetah-rr")] {
        let result = simulate(&scenario, &spec);
        assert_eq!((result.broken, result.dip_updates), (0, 0), "{}", result.lb);
    }
}
