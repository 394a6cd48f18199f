//! The results: tables (plain or markdown), ratios against the baselines measured in the
//! same run, and the targets as PASS/MISS lines.

use std::fmt::Write;

use cheetah_core::config::Mode;

use super::items::{Item, Path};
use super::layouts::Layout;
use super::timing::{Clock, Measurement};
use super::trace::{Role, Trace};

/// One measured row.
pub struct Row {
    pub item: Item,
    /// Packets (or connection ids, for the hash rows) per pass.
    pub count: usize,
    /// Ticks per packet, net of the restore (or, for hashes, of the bare loop).
    pub timing: Measurement,
    /// Dependent-chain ticks per hash (hash rows only).
    pub latency: Option<Measurement>,
    pub ir: Option<f64>,
    /// Timestamp-option lookups of the checking pass: (fast path, slow path).
    pub options: Option<(u64, u64)>,
    pub restore_bytes: f64,
}

/// Everything the report needs besides the rows.
pub struct Context<'a> {
    pub clock: &'a Clock,
    /// Option lookups of the cheetah warm-up LB over the whole trace: (fast, slow).
    pub trace_options: Option<(u64, u64)>,
    pub callgrind_note: Option<String>,
    /// The trace whose option layouts are tabulated.
    pub trace: Option<&'a Trace>,
}

/// A table that prints aligned for a terminal or as markdown.
struct Table {
    header: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn render(&self, markdown: bool) -> String {
        let mut out = String::new();
        if markdown {
            let line = |cells: &[String]| format!("| {} |\n", cells.join(" | "));
            let header: Vec<String> = self.header.iter().map(|h| h.to_string()).collect();
            out += &line(&header);
            out += &line(
                &self
                    .header
                    .iter()
                    .map(|_| "---".to_string())
                    .collect::<Vec<_>>(),
            );
            for row in &self.rows {
                out += &line(row);
            }
            return out;
        }
        let widths: Vec<usize> = (0..self.header.len())
            .map(|c| {
                self.rows
                    .iter()
                    .map(|r| r[c].len())
                    .chain([self.header[c].len()])
                    .max()
                    .unwrap()
            })
            .collect();
        let line = |cells: Vec<&str>| {
            let mut l = String::new();
            for (c, cell) in cells.iter().enumerate() {
                if c == 0 {
                    let _ = write!(l, "{cell:<w$}", w = widths[c]);
                } else {
                    let _ = write!(l, "  {cell:>w$}", w = widths[c]);
                }
            }
            l.trim_end().to_string() + "\n"
        };
        out += &line(self.header.clone());
        for row in &self.rows {
            out += &line(row.iter().map(String::as_str).collect());
        }
        out
    }
}

fn find(rows: &[Row], path: Path, mode: Mode) -> Option<&Row> {
    rows.iter()
        .find(|r| r.item.path == path && r.item.mode == mode && r.item.policy.is_none())
}

/// The row this row's ratio compares against: the same path in `mode`.
fn baseline<'a>(rows: &'a [Row], row: &Row, mode: Mode) -> Option<&'a Row> {
    matches!(row.item.path, Path::Syn | Path::Established | Path::Server)
        .then(|| find(rows, row.item.path, mode))
        .flatten()
}

fn ratio(rows: &[Row], row: &Row, mode: Mode) -> String {
    baseline(rows, row, mode).map_or(String::new(), |b| {
        format!("{:.2}x", row.timing.net.median / b.timing.net.median)
    })
}

fn main_table(rows: &[Row], ctx: &Context) -> Table {
    let clock = ctx.clock;
    let mut table = Table {
        header: vec![
            "path",
            "mode",
            "policy",
            "packets",
            "ns/pkt",
            "ticks/pkt",
            "min",
            "max",
            "restore ticks",
            "restored bytes",
            "with restore",
            "runs used",
            "Ir/pkt",
            "vs hash",
            "vs maglev",
        ],
        rows: Vec::new(),
    };
    for row in rows.iter().filter(|r| r.latency.is_none()) {
        let t = &row.timing;
        table.rows.push(vec![
            row.item.path.describe().to_string(),
            row.item.mode.name().to_string(),
            row.item.policy.map_or("-", |p| p.name()).to_string(),
            row.count.to_string(),
            format!("{:.2}", clock.ns(t.net.median)),
            format!("{:.1}", t.net.median),
            format!("{:.1}", t.net.min),
            format!("{:.1}", t.net.max),
            format!("{:.1}", t.baseline.median),
            format!("{:.0}", row.restore_bytes),
            format!("{:.1}", t.gross.median),
            if t.undisturbed_only {
                format!("{}/{}", t.runs - t.preempted, t.runs)
            } else {
                format!("all {} (noisy!)", t.runs)
            },
            row.ir.map_or("-".to_string(), |ir| format!("{ir:.1}")),
            ratio(rows, row, Mode::Hash),
            ratio(rows, row, Mode::Maglev),
        ]);
    }
    table
}

fn hash_table(rows: &[Row], ctx: &Context) -> Option<Table> {
    let hashes: Vec<&Row> = rows.iter().filter(|r| r.latency.is_some()).collect();
    if hashes.is_empty() {
        return None;
    }
    let toeplitz = hashes
        .iter()
        .find(|r| r.item.path == Path::Toeplitz)
        .copied();
    let mut table = Table {
        header: vec![
            "hash",
            "ids",
            "ticks/hash (throughput)",
            "min",
            "max",
            "ns/hash",
            "ticks/hash (latency)",
            "ns/hash (latency)",
            "Ir/hash",
            "vs Toeplitz (throughput, latency)",
        ],
        rows: Vec::new(),
    };
    for row in &hashes {
        let (t, l) = (&row.timing, row.latency.as_ref().unwrap());
        table.rows.push(vec![
            row.item.path.describe().to_string(),
            row.count.to_string(),
            format!("{:.1}", t.net.median),
            format!("{:.1}", t.net.min),
            format!("{:.1}", t.net.max),
            format!("{:.2}", ctx.clock.ns(t.net.median)),
            format!("{:.1}", l.net.median),
            format!("{:.2}", ctx.clock.ns(l.net.median)),
            row.ir.map_or("-".to_string(), |ir| format!("{ir:.1}")),
            toeplitz.map_or(String::new(), |b| {
                format!(
                    "{:.2}x, {:.2}x",
                    t.net.median / b.timing.net.median,
                    l.net.median / b.latency.as_ref().unwrap().net.median
                )
            }),
        ]);
    }
    Some(table)
}

fn hit_rate((fast, slow): (u64, u64)) -> String {
    let total = fast + slow;
    if total == 0 {
        return "-".into();
    }
    format!(
        "{:.3}% ({fast} of {total})",
        100.0 * fast as f64 / total as f64
    )
}

fn options_table(rows: &[Row], ctx: &Context) -> Table {
    let mut table = Table {
        header: vec!["packets", "timestamp found by the fast path"],
        rows: Vec::new(),
    };
    if let Some(counts) = ctx.trace_options {
        table.rows.push(vec![
            "whole cheetah trace (warm-up LB)".into(),
            hit_rate(counts),
        ]);
    }
    // SYN rows are per policy and look the options up the same way: show one.
    let mut syn_shown = false;
    for row in rows {
        let Some(counts) = row.options else { continue };
        if row.item.mode != Mode::Cheetah || counts.0 + counts.1 == 0 {
            continue;
        }
        if row.item.path == Path::Syn {
            if syn_shown {
                continue;
            }
            syn_shown = true;
        }
        table
            .rows
            .push(vec![row.item.path.describe().into(), hit_rate(counts)]);
    }
    table
}

/// Which option layouts the trace's packets carry, by role, against the intended mix.
fn layout_table(trace: &Trace) -> Table {
    let mut table = Table {
        header: vec!["packets", "options", "fast path", "count", "share"],
        rows: Vec::new(),
    };
    let roles = [
        (Role::ClientSyn, "client SYN"),
        (Role::ServerSynAck, "server SYN-ACK"),
        (Role::ClientEstablished, "client established"),
        (Role::ServerEstablished, "server established"),
    ];
    for (role, name) in roles {
        let of_role: Vec<Layout> = trace
            .packets
            .iter()
            .filter(|p| p.role == role)
            .map(|p| p.layout)
            .collect();
        let mut layouts = of_role.clone();
        layouts.sort();
        layouts.dedup();
        for layout in layouts {
            let count = of_role.iter().filter(|l| **l == layout).count();
            table.rows.push(vec![
                name.to_string(),
                layout.name().to_string(),
                if layout.is_table1() { "yes" } else { "no" }.to_string(),
                count.to_string(),
                format!("{:.2}%", 100.0 * count as f64 / of_role.len() as f64),
            ]);
        }
    }
    table
}

/// The targets, checked against this run.
pub fn targets(rows: &[Row], clock: &Clock) -> Vec<String> {
    let verdict = |ok: bool| if ok { "PASS" } else { "MISS" };
    let mut lines = Vec::new();
    let established = find(rows, Path::Established, Mode::Cheetah);
    let hash = find(rows, Path::Established, Mode::Hash);
    let server = find(rows, Path::Server, Mode::Cheetah);
    let element = find(rows, Path::Element, Mode::Cheetah);
    let missing = |what: &str| format!("n/a   {what}: not measured in this run");
    lines.push(match established {
        Some(r) => {
            let ns = clock.ns(r.timing.net.median);
            format!(
                "{}  client->server established (cheetah) <= 25 ns/packet: {ns:.2} ns",
                verdict(ns <= 25.0)
            )
        }
        None => missing("client->server established <= 25 ns"),
    });
    lines.push(match (established, hash) {
        (Some(c), Some(h)) => {
            let x = c.timing.net.median / h.timing.net.median;
            format!(
                "{}  client->server established <= 1.2x plain hash (same run): {x:.2}x ({:.2} vs {:.2} ns)",
                verdict(x <= 1.2),
                clock.ns(c.timing.net.median),
                clock.ns(h.timing.net.median)
            )
        }
        _ => missing("established vs plain hash"),
    });
    lines.push(match server {
        Some(r) => {
            let ns = clock.ns(r.timing.net.median);
            format!(
                "{}  server->client (cheetah) <= 30 ns/packet: {ns:.2} ns",
                verdict(ns <= 30.0)
            )
        }
        None => missing("server->client <= 30 ns"),
    });
    lines.push(match element {
        Some(r) => format!(
            "{}  element-equivalent <= 17 TSC ticks per client->server packet: {:.1} ticks",
            verdict(r.timing.net.median <= 17.0),
            r.timing.net.median
        ),
        None => missing("element-equivalent <= 17 ticks"),
    });
    lines
}

/// The whole report.
pub fn render(rows: &[Row], ctx: &Context, markdown: bool) -> String {
    let mut out = String::new();
    let heading = |out: &mut String, title: &str| {
        if markdown {
            let _ = writeln!(out, "\n### {title}\n");
        } else {
            let _ = writeln!(out, "\n== {title} ==");
        }
    };
    heading(
        &mut out,
        "Per-packet cost (TSC ticks net of the restore; median, min, max of the runs)",
    );
    out += &main_table(rows, ctx).render(markdown);
    let _ = writeln!(
        out,
        "\nVerdicts: before timing, every packet of every row went through its worker once and \
         was routed as expected (established and no-TS packets to their connection's server): \
         0 dropped, 0 misrouted (any would have aborted the run)."
    );
    if let Some(note) = &ctx.callgrind_note {
        let _ = writeln!(out, "\n{note}");
    }
    if let Some(table) = hash_table(rows, ctx) {
        heading(&mut out, "Keyed hash vs Toeplitz (per connection id)");
        out += &table.render(markdown);
    }
    heading(&mut out, "TCP-options fast-path hit rate");
    out += &options_table(rows, ctx).render(markdown);
    if let Some(trace) = ctx.trace {
        heading(&mut out, "Option layouts in the trace");
        out += &layout_table(trace).render(markdown);
    }
    heading(&mut out, "Targets");
    for line in targets(rows, ctx.clock) {
        if markdown {
            let _ = writeln!(out, "- {line}");
        } else {
            let _ = writeln!(out, "{line}");
        }
    }
    out
}
