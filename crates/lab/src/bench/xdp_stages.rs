//! Where the in-kernel path's time goes: bpf/xdp_bench.c's `bench_client_stage_K` and
//! `bench_reply_stage_K` run the first K stages of the established client->server and the
//! server->client path (the same lib/ functions, in lib/fast_path.h's order), each ending in
//! XDP_TX. One round runs bench_trivial, every stage program and bench_lb, in that order,
//! on the same frame; a stage's increment is the median over the rounds of (its time - the
//! previous program's time), so drift hits both sides of every difference alike, as in the
//! lb/trivial rows. After the stages comes bench_lb_inline, the LB inlined without the tag
//! check and the call of lb_process (send_out and the stages' glue), then bench_lb (what
//! the tag check and the call add).
//! After bench_lb the round runs bench_lb_twin, the same code loaded at another address:
//! its difference from bench_lb is placement alone (caches, branch predictors), the
//! resolution of every increment.

use anyhow::ensure;
use libbpf_rs::ProgramMut;

use super::xdp::{
    program, spread, test_run, Bench, Path, Ports, Spread, WARM_UP_RUNS, XDP_REDIRECT, XDP_TX,
};

/// What each stage program adds to the one before it: lib/… names as in bpf/xdp_bench.c.
const CLIENT_STAGES: [&str; 7] = [
    "lb_config, parse_plain_tcp",
    "VIP filter, ACK and NOP NOP TS checks, vip_slots[slot] (the classification too)",
    "nothing (the checks are in 2)",
    "siphash_finish, cookie unmask",
    "servers[id], msb_restores[unmasked] (decode)",
    "TSecr rewrite + TCP checksum, both MACs",
    "server_traffic[id] + stats count (2 per-CPU lookups)",
];
const REPLY_STAGES: [&str; 7] = [
    "lb_config, parse_plain_tcp, VIP filter: daddr no VIP's (no vips, no vip_addrs)",
    "the sender: server_side[ingress], reply_senders[slot of (saddr, sport, src MAC)]",
    "flags, NOP NOP TS, msb_seen + clock check",
    "siphash_finish, cookie encode",
    "next hop toward the client: this CPU's next_hop_cache slot (next_hops, then bpf_fib_lookup, on a miss)",
    "TSval rewrite + TCP checksum, MACs from the next hop",
    "server_traffic[id] + stats count (2 per-CPU lookups)",
];

pub(super) struct Stage {
    adds: String,
    /// This program's time minus the previous one's, per round.
    increment: Spread,
    /// This program's time minus bench_trivial's, per round.
    cumulative: Spread,
}

pub(super) struct Breakdown {
    label: &'static str,
    stages: Vec<Stage>,
}

/// Times the stage programs of `direction` (cheetah, l2: the bench must hold that setup).
pub(super) fn breakdown(
    bench: &Bench,
    direction: Path,
    ports: &Ports,
    runs: u32,
) -> anyhow::Result<Breakdown> {
    let (label, prefix, adds, whole_action): (_, _, &[&str], _) = match direction {
        Path::ClientToServer => (
            "established client->server cheetah (l2)",
            "bench_client_stage_",
            &CLIENT_STAGES,
            XDP_TX,
        ),
        _ => (
            "server->client cheetah (l2)",
            "bench_reply_stage_",
            &REPLY_STAGES,
            XDP_REDIRECT,
        ),
    };
    let (frame, _) = bench.frame(direction)?;
    bench.write_frame(&frame)?;
    let object = bench.program.object();
    let mut names = vec!["bench_trivial".to_string()];
    names.extend((1..=adds.len()).map(|k| format!("{prefix}{k}")));
    names.push("bench_lb_inline".into());
    names.push("bench_lb_call".into());
    names.push("bench_lb".into());
    names.push("bench_lb_twin".into());
    let programs: Vec<ProgramMut<'_>> = names
        .iter()
        .map(|name| program(object, name))
        .collect::<anyhow::Result<_>>()?;
    let expected = |p: usize| {
        if p + 4 >= names.len() {
            whole_action
        } else {
            XDP_TX
        }
    };
    let ingress = ports.servers.ifindex;
    let mut times: Vec<Vec<f64>> = vec![Vec::with_capacity(runs as usize); names.len()];
    for round in 0..WARM_UP_RUNS + runs {
        for (p, subject) in programs.iter().enumerate() {
            let (action, ns) = test_run(subject, &frame, ingress)?;
            ensure!(
                action == expected(p),
                "{label}: {} returned {action}, not {} (a stage missed what the whole path finds)",
                names[p],
                expected(p)
            );
            if round >= WARM_UP_RUNS {
                times[p].push(f64::from(ns));
            }
        }
    }
    let differences = |later: usize, earlier: usize| -> Vec<f64> {
        times[later]
            .iter()
            .zip(&times[earlier])
            .map(|(l, e)| l - e)
            .collect()
    };
    let stages = (1..names.len())
        .map(|p| Stage {
            adds: match adds.get(p - 1) {
                Some(stage) => stage.to_string(),
                None if p + 3 < names.len() => {
                    "send_out (the whole path, the LB inlined: bench_lb_inline)".into()
                }
                None if p + 2 < names.len() => {
                    "the call to the global cheetah_decide (bench_lb_call)".into()
                }
                None if p + 1 < names.len() => {
                    "the tag and IP options checks before the call (bench_lb)".into()
                }
                None => "nothing: bench_lb_twin, the same code at another address".into(),
            },
            increment: spread(differences(p, p - 1)),
            cumulative: spread(differences(p, 0)),
        })
        .collect();
    Ok(Breakdown { label, stages })
}

pub(super) fn render(breakdown: &Breakdown, markdown: bool) -> String {
    let mut out = format!(
        "breakdown, {} (each program = the previous one + its stage):\n",
        breakdown.label
    );
    let header = [
        "stage",
        "adds",
        "increment ns median (p10 to p90)",
        "cumulative ns net of trivial",
    ];
    if markdown {
        out.push_str(&format!("\n| {} |\n", header.join(" | ")));
        out.push_str("| --- | --- | --- | --- |\n");
    } else {
        out.push_str(&format!(
            "{:<5} {:<70} {:>22} {:>12}\n",
            header[0], header[1], "increment (p10 to p90)", "cumulative"
        ));
    }
    for (k, stage) in breakdown.stages.iter().enumerate() {
        let increment = format!(
            "{:.0} ({:.0} to {:.0})",
            stage.increment.median, stage.increment.p10, stage.increment.p90
        );
        let cumulative = format!("{:.0}", stage.cumulative.median);
        let number = match breakdown.stages.len() - k {
            1 => "twin".to_string(),
            2 => "whole".to_string(),
            _ => (k + 1).to_string(),
        };
        if markdown {
            out.push_str(&format!(
                "| {number} | {} | {increment} | {cumulative} |\n",
                stage.adds
            ));
        } else {
            out.push_str(&format!(
                "{number:<5} {:<70} {increment:>22} {cumulative:>12}\n",
                stage.adds
            ));
        }
    }
    let whole = &breakdown.stages[..breakdown.stages.len() - 1];
    let sum: f64 = whole.iter().map(|s| s.increment.median).sum();
    out.push_str(&format!(
        "sum of the increments' medians up to the whole: {sum:.0} ns (the median of the whole is {:.0} ns)\n",
        whole.last().map_or(0.0, |s| s.cumulative.median)
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stage(adds: &str, increment: f64, cumulative: f64) -> Stage {
        let at = |v: f64| Spread {
            median: v,
            p10: v - 1.0,
            p90: v + 1.0,
        };
        Stage {
            adds: adds.into(),
            increment: at(increment),
            cumulative: at(cumulative),
        }
    }

    #[test]
    fn the_last_two_rows_are_the_whole_path_and_its_twin_which_the_sum_leaves_out() {
        let breakdown = Breakdown {
            label: "path",
            stages: vec![
                stage("a", 10.0, 10.0),
                stage("b", 5.0, 15.0),
                stage("send", 2.0, 17.0),
                stage("twin", 30.0, 47.0),
            ],
        };
        let text = render(&breakdown, true);
        assert!(text.contains("| 1 | a | 10 (9 to 11) | 10 |"), "{text}");
        assert!(
            text.contains("| whole | send | 2 (1 to 3) | 17 |"),
            "{text}"
        );
        assert!(
            text.contains("| twin | twin | 30 (29 to 31) | 47 |"),
            "{text}"
        );
        assert!(text.contains("up to the whole: 17 ns (the median of the whole is 17 ns)"));
    }

    #[test]
    fn every_stage_program_has_a_description() {
        // bpf/xdp_bench.c defines CLIENT_STAGE(1..7) and REPLY_STAGE(1..8).
        let source = include_str!("../../../../bpf/xdp_bench.c");
        for (prefix, stages) in [
            ("CLIENT_STAGE(", CLIENT_STAGES.len()),
            ("REPLY_STAGE(", REPLY_STAGES.len()),
        ] {
            let defined = source
                .lines()
                .filter(|l| l.starts_with(prefix) && l.ends_with(')'))
                .count();
            assert_eq!(
                defined, stages,
                "{prefix}..) programs against their descriptions"
            );
        }
    }
}
