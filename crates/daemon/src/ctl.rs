//! `cheetah ctl`: the operator's client for the daemon's control API.
//!
//! Prints human tables by default and the API's JSON with `--json`, both from the API's
//! typed views (`api/views.rs`), the structs the daemon serialises. Values are sent as
//! typed and validated by the daemon, so its messages (naming the field) are what the
//! operator sees. Exit status: 0 on success, 2 when the daemon refused the request (a 4xx,
//! printed as `error: <message>`) or the command line is wrong, 1 when the daemon cannot be
//! reached or failed.

use std::fmt::Write as _;
use std::time::Duration;

use clap::{Args as ClapArgs, Subcommand};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

use crate::api::views::{
    AddedView, ErrorView, HealthView, JoinPool, LoadReport, MemberView, ReadyView, ServerView,
    ServersView, SetWeights, StatusView, VipView, VipsView,
};
use crate::api::DEFAULT_LISTEN;

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Address of the daemon's control API.
    #[arg(long, default_value = DEFAULT_LISTEN, global = true)]
    pub api: String,
    /// Print the API's JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: CtlCommand,
}

#[derive(Subcommand, Debug)]
pub enum CtlCommand {
    /// Version, mode, interfaces, workers and server counts.
    Status,
    /// Whether this LB instance is ready for traffic (every active server's health decided
    /// and every healthy one's clock probed): exit status 0 when ready, 1 when not.
    Ready,
    /// List, add, drain, activate or remove servers.
    #[command(subcommand)]
    Servers(ServersCommand),
    /// List VIPs with their policies and pools.
    #[command(subcommand)]
    Vips(VipsCommand),
    /// Set a VIP's policy.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Set weights in a VIP's pool.
    #[command(subcommand)]
    Weights(WeightsCommand),
    /// Add a server to a VIP's pool or take it out.
    #[command(subcommand)]
    Pool(PoolCommand),
    /// Report a server's load.
    #[command(subcommand)]
    Load(LoadCommand),
}

#[derive(Subcommand, Debug)]
pub enum ServersCommand {
    List,
    /// Add a server (it takes new connections at once in the VIPs given).
    Add {
        #[arg(long)]
        dip: String,
        #[arg(long)]
        mac: Option<String>,
        /// Server id (default: the lowest free one).
        #[arg(long)]
        id: Option<u16>,
        /// A VIP to join, `address:port` or `address:port:weight`; repeatable.
        #[arg(long = "vip", value_name = "VIP[:WEIGHT]")]
        vips: Vec<String>,
        /// Add it draining: its replies forwarded and its cookies decoded, but no new
        /// connections until `servers activate` (how to add a server to several instances).
        #[arg(long)]
        draining: bool,
    },
    /// Stop new connections to a server; its connections keep going.
    Drain {
        id: u16,
    },
    /// Put a draining server back into service.
    Activate {
        id: u16,
    },
    /// Retire a server; its id is quarantined before it can be reused.
    Remove {
        id: u16,
    },
}

#[derive(Subcommand, Debug)]
pub enum VipsCommand {
    List,
}

#[derive(Subcommand, Debug)]
pub enum PolicyCommand {
    /// `policy set 10.0.0.100:80 pow2 --metric active-connections`
    Set {
        vip: String,
        /// hash, maglev, rr, wrr, awrr, pow2, least-loaded or random.
        policy: String,
        /// active-connections, packets, bytes or reported.
        #[arg(long)]
        metric: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum WeightsCommand {
    /// `weights set 10.0.0.100:80 1=3 2=1`
    Set {
        vip: String,
        #[arg(required = true, value_name = "ID=WEIGHT")]
        weights: Vec<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum PoolCommand {
    Join {
        vip: String,
        id: u16,
        #[arg(long, default_value_t = 1)]
        weight: u32,
    },
    /// Its connections keep going.
    Leave { vip: String, id: u16 },
}

#[derive(Subcommand, Debug)]
pub enum LoadCommand {
    /// `load report 3 --value 0.7 --active 120`
    Report {
        id: u16,
        /// The server's load (e.g. CPU utilisation), compared across servers.
        #[arg(long)]
        value: Option<f64>,
        /// The connections the server really has open.
        #[arg(long)]
        active: Option<u64>,
    },
}

/// How a request went wrong, and the exit status that says so.
enum Failure {
    /// The daemon refused the request (4xx), or the command line was wrong.
    Refused(String),
    /// The daemon could not be reached or failed (5xx).
    Failed(String),
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if let CtlCommand::Ready = args.command {
        return ready(&args);
    }
    match execute(&args) {
        Ok(text) => {
            print!("{text}");
            Ok(())
        }
        Err(Failure::Refused(message)) => {
            eprintln!("error: {message}");
            std::process::exit(2)
        }
        Err(Failure::Failed(message)) => {
            eprintln!("error: {message}");
            std::process::exit(1)
        }
    }
}

/// `ctl ready`: the answer is the exit status, so a 503 (not ready) is an answer here, not
/// a failure.
fn ready(args: &Args) -> anyhow::Result<()> {
    let client = Client::new(&args.api);
    let view = match client.call_allowing::<ReadyView>("/ready", 503) {
        Ok(view) => view,
        Err(Failure::Refused(message) | Failure::Failed(message)) => {
            eprintln!("error: {message}");
            std::process::exit(1)
        }
    };
    let ready = view.ready;
    print!("{}", show(args.json, view, show_ready));
    if !ready {
        std::process::exit(1)
    }
    Ok(())
}

struct Client {
    agent: ureq::Agent,
    base: String,
    api: String,
}

enum Method {
    Get,
    Post,
    Put,
    Delete,
}

impl Client {
    fn new(api: &str) -> Self {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(10)))
            .build()
            .into();
        Client {
            agent,
            base: format!("http://{api}"),
            api: api.to_string(),
        }
    }

    /// Sends the request and reads the answer as the view `T`.
    fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<T, Failure> {
        self.send(method, path, body, None)
    }

    /// A GET whose answer is the view `T` also with status `also` (e.g. `/ready`'s 503).
    fn call_allowing<T: DeserializeOwned>(&self, path: &str, also: u16) -> Result<T, Failure> {
        self.send(Method::Get, path, None, Some(also))
    }

    fn send<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
        also: Option<u16>,
    ) -> Result<T, Failure> {
        let url = format!("{}{path}", self.base);
        let response = match (method, body) {
            (Method::Get, _) => self.agent.get(&url).call(),
            (Method::Delete, _) => self.agent.delete(&url).call(),
            (Method::Post, Some(body)) => self.agent.post(&url).send_json(&body),
            (Method::Post, None) => self.agent.post(&url).send_empty(),
            (Method::Put, body) => self.agent.put(&url).send_json(body.unwrap_or(Value::Null)),
        };
        let mut response = response.map_err(|e| self.unreachable(e))?;
        let status = response.status();
        let text = response
            .body_mut()
            .read_to_string()
            .map_err(|e| Failure::Failed(format!("cannot read the daemon's answer: {e}")))?;
        if status.is_success() || Some(status.as_u16()) == also {
            return serde_json::from_str(&text).map_err(|e| {
                Failure::Failed(format!(
                    "the daemon's answer to {path} is not what this ctl reads ({e}): {text}"
                ))
            });
        }
        let message = match serde_json::from_str::<ErrorView>(&text) {
            Ok(ErrorView { error }) => error,
            // Not the API's error body (something else answered): show it as it came.
            Err(_) => {
                let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
                format!("{status}: {value}")
            }
        };
        if status.is_client_error() {
            Err(Failure::Refused(message))
        } else {
            Err(Failure::Failed(format!(
                "the daemon failed ({status}): {message}"
            )))
        }
    }

    fn unreachable(&self, e: ureq::Error) -> Failure {
        let why = match &e {
            ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
                "connection refused".to_string()
            }
            other => other.to_string(),
        };
        Failure::Failed(format!(
            "the cheetah daemon is not reachable at {} ({why}); is it running, and is --api its API address?",
            self.api
        ))
    }
}

/// Percent-encodes a path segment (a VIP key may hold `[` and `]`).
fn segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~:".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// `address:port` or `address:port:weight`.
fn vip_and_weight(text: &str) -> Value {
    if text.parse::<std::net::SocketAddr>().is_err() {
        if let Some((vip, weight)) = text.rsplit_once(':') {
            if let (Ok(_), Ok(weight)) =
                (vip.parse::<std::net::SocketAddr>(), weight.parse::<u32>())
            {
                return json!({ "vip": vip, "weight": weight });
            }
        }
    }
    json!({ "vip": text })
}

/// A request body of the API's types, as JSON. Through a [`Value`], whose keys are sorted,
/// so the bytes sent are the same as for a body written as JSON here.
fn body(request: &impl Serialize) -> Value {
    serde_json::to_value(request).expect("a request body always serialises")
}

/// `view` as a table or a line (`human`), or as the API's JSON with `--json`.
fn show<T: Serialize>(json: bool, view: T, human: impl FnOnce(&T) -> String) -> String {
    if json {
        // Through a `Value`, whose keys are sorted: the order `--json` has always printed.
        let value = serde_json::to_value(&view).unwrap_or_default();
        format!(
            "{}\n",
            serde_json::to_string_pretty(&value).unwrap_or_default()
        )
    } else {
        human(&view)
    }
}

fn execute(args: &Args) -> Result<String, Failure> {
    let client = Client::new(&args.api);
    let json = args.json;
    Ok(match &args.command {
        CtlCommand::Status => show(
            json,
            client.call::<StatusView>(Method::Get, "/status", None)?,
            show_status,
        ),
        CtlCommand::Ready => unreachable!("`ctl ready` answers with its exit status (ready())"),
        CtlCommand::Servers(ServersCommand::List) => show(
            json,
            client.call::<ServersView>(Method::Get, "/servers", None)?,
            show_servers,
        ),
        CtlCommand::Servers(ServersCommand::Add {
            dip,
            mac,
            id,
            vips,
            draining,
        }) => {
            // The operator's text as typed (not `AddServer`, whose `dip` is parsed): the
            // daemon validates it and names the field in its message.
            let mut body = json!({ "dip": dip, "vips": vips.iter().map(|v| vip_and_weight(v)).collect::<Vec<_>>() });
            if let Some(mac) = mac {
                body["mac"] = json!(mac);
            }
            if let Some(id) = id {
                body["id"] = json!(id);
            }
            if *draining {
                body["state"] = json!("draining");
            }
            show(
                json,
                client.call::<AddedView>(Method::Post, "/servers", Some(body))?,
                |v| format!("server {} added\n", v.id),
            )
        }
        CtlCommand::Servers(ServersCommand::Drain { id }) => show(
            json,
            client.call::<ServerView>(Method::Post, &format!("/servers/{id}/drain"), None)?,
            |v| format!("server {} is draining: no new connections\n", v.id),
        ),
        CtlCommand::Servers(ServersCommand::Activate { id }) => show(
            json,
            client.call::<ServerView>(Method::Post, &format!("/servers/{id}/activate"), None)?,
            |v| format!("server {} is active\n", v.id),
        ),
        CtlCommand::Servers(ServersCommand::Remove { id }) => show(
            json,
            client.call::<ServerView>(Method::Delete, &format!("/servers/{id}"), None)?,
            |v| {
                format!(
                    "server {} removed; its id is quarantined for {} s\n",
                    v.id,
                    json_text(&v.quarantine_left_secs)
                )
            },
        ),
        CtlCommand::Vips(VipsCommand::List) => show(
            json,
            client.call::<VipsView>(Method::Get, "/vips", None)?,
            show_vips,
        ),
        CtlCommand::Policy(PolicyCommand::Set {
            vip,
            policy,
            metric,
        }) => {
            // The operator's names as typed (not `SetPolicy`), for the daemon to check.
            let mut body = json!({ "policy": policy });
            if let Some(metric) = metric {
                body["metric"] = json!(metric);
            }
            let path = format!("/vips/{}/policy", segment(vip));
            show(
                json,
                client.call::<VipView>(Method::Put, &path, Some(body))?,
                show_vip,
            )
        }
        CtlCommand::Weights(WeightsCommand::Set { vip, weights }) => {
            let mut request = SetWeights {
                weights: Default::default(),
            };
            for w in weights {
                let parsed = w.split_once('=').and_then(|(id, weight)| {
                    Some((id.parse::<u16>().ok()?, weight.parse::<u32>().ok()?))
                });
                let Some((id, weight)) = parsed else {
                    return Err(Failure::Refused(format!(
                        "weights: `{w}` is not ID=WEIGHT (e.g. 3=2)"
                    )));
                };
                request.weights.insert(id, weight);
            }
            let path = format!("/vips/{}/weights", segment(vip));
            show(
                json,
                client.call::<VipView>(Method::Put, &path, Some(body(&request)))?,
                show_vip,
            )
        }
        CtlCommand::Pool(PoolCommand::Join { vip, id, weight }) => {
            let path = format!("/vips/{}/servers", segment(vip));
            let request = JoinPool {
                id: *id,
                weight: *weight,
            };
            show(
                json,
                client.call::<VipView>(Method::Post, &path, Some(body(&request)))?,
                show_vip,
            )
        }
        CtlCommand::Pool(PoolCommand::Leave { vip, id }) => {
            let path = format!("/vips/{}/servers/{id}", segment(vip));
            show(
                json,
                client.call::<VipView>(Method::Delete, &path, None)?,
                show_vip,
            )
        }
        CtlCommand::Load(LoadCommand::Report { id, value, active }) => {
            let request = LoadReport {
                load: *value,
                active_connections: *active,
            };
            show(
                json,
                client.call::<ServerView>(
                    Method::Post,
                    &format!("/servers/{id}/load"),
                    Some(body(&request)),
                )?,
                |v| {
                    format!(
                        "server {}: reported load {}, active connections {}\n",
                        v.id,
                        json_text(&v.reported_load),
                        v.active_connections
                    )
                },
            )
        }
    })
}

// ---- human output ----------------------------------------------------------------------

/// A number of the API's that is a float, as a table cell: two decimals at most.
fn float(value: f64) -> String {
    format!("{}", (value * 100.0).round() / 100.0)
}

/// An optional value as a table cell: `-` when there is none.
fn optional<T: ToString>(value: &Option<T>) -> String {
    value
        .as_ref()
        .map_or_else(|| "-".into(), ToString::to_string)
}

/// A value as the API's JSON writes it (`0.0` for a float, `null` for none).
fn json_text(value: &impl Serialize) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

/// The name the API gives a value (a policy's `pow2`, a metric's `packets`).
fn api_name(value: &impl Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(Value::String(name)) => name,
        other => other.map(|v| v.to_string()).unwrap_or_default(),
    }
}

/// Items joined by `separator`, or `-` when there are none.
fn joined(items: Vec<String>, separator: &str) -> String {
    if items.is_empty() {
        "-".into()
    } else {
        items.join(separator)
    }
}

/// Left-aligned columns, two spaces apart.
fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let mut text = String::new();
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                text.push_str(c);
            } else {
                let _ = write!(text, "{c:<w$}  ");
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(headers.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    out
}

fn duration(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m{s:02}s"),
        (0, _, _) => format!("{h}h{m:02}m{s:02}s"),
        _ => format!("{d}d{h:02}h{m:02}m"),
    }
}

fn show_status(v: &StatusView) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "cheetah {}", v.version);
    let _ = writeln!(out, "mode                {}", v.mode);
    let _ = writeln!(out, "forwarding          {}", v.forwarding);
    let _ = writeln!(
        out,
        "cookie layout       {} epoch bits, idle connections survive {} s",
        v.cookie_epoch_bits,
        float(v.idle_limit_secs)
    );
    let _ = writeln!(out, "secret fingerprint  {}", v.secret_fingerprint);
    let _ = writeln!(out, "uptime              {}", duration(v.uptime_secs));
    let _ = writeln!(out, "snapshot generation {}", v.snapshot_generation);
    let _ = writeln!(
        out,
        "servers             {} active, {} draining, {} removed",
        v.servers.active, v.servers.draining, v.servers.removed
    );
    let _ = writeln!(out, "vips                {}", v.vips);
    let _ = writeln!(
        out,
        "ready               {}",
        if v.ready {
            "yes"
        } else {
            "no (cheetah ctl ready says why)"
        }
    );
    if v.interfaces.is_empty() {
        out.push_str("interfaces          none reported (no data path attached)\n");
    } else {
        out.push('\n');
        let rows: Vec<Vec<String>> = v
            .interfaces
            .iter()
            .map(|i| {
                vec![
                    i.name.clone(),
                    i.ifindex.to_string(),
                    i.xdp_mode.clone(),
                    i.queues
                        .iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(","),
                ]
            })
            .collect();
        out.push_str(&table(&["INTERFACE", "IFINDEX", "XDP", "QUEUES"], &rows));
    }
    if !v.workers.is_empty() {
        out.push('\n');
        let rows: Vec<Vec<String>> = v
            .workers
            .iter()
            .map(|w| {
                vec![
                    w.index.to_string(),
                    w.queue.to_string(),
                    w.packets.to_string(),
                    w.dropped.to_string(),
                    w.rx_packets.to_string(),
                    w.tx_packets.to_string(),
                    float(w.packets_per_second),
                ]
            })
            .collect();
        out.push_str(&table(
            &["WORKER", "QUEUE", "PACKETS", "DROPPED", "RX", "TX", "PKT/S"],
            &rows,
        ));
    }
    out
}

fn show_servers(v: &ServersView) -> String {
    let rows: Vec<Vec<String>> = v
        .servers
        .iter()
        .map(|s| {
            vec![
                s.id.to_string(),
                s.dip.to_string(),
                optional(&s.mac),
                s.state.clone(),
                s.active_connections.to_string(),
                s.packets.to_string(),
                s.bytes.to_string(),
                float(s.reported_load),
                optional(&s.quarantine_left_secs),
                joined(s.vips.clone(), ","),
                health_cell(&s.health),
            ]
        })
        .collect();
    table(
        &[
            "ID",
            "DIP",
            "MAC",
            "STATE",
            "ACTIVE",
            "PACKETS",
            "BYTES",
            "LOAD",
            "QUARANTINE",
            "VIPS",
            "HEALTH",
        ],
        &rows,
    )
}

/// A server's health per VIP, with the reason: `up (syn-ack)`; with several VIPs, each
/// named: `10.0.0.1:80 up (syn-ack); 10.0.0.1:443 down (refused)`.
fn health_cell(health: &[HealthView]) -> String {
    let one = |h: &HealthView| format!("{} ({})", h.state, h.reason);
    match health {
        [] => "-".into(),
        [only] => one(only),
        several => several
            .iter()
            .map(|h| format!("{} {}", h.vip, one(h)))
            .collect::<Vec<_>>()
            .join("; "),
    }
}

fn show_ready(v: &ReadyView) -> String {
    if v.ready {
        return "ready\n".into();
    }
    let mut out = String::from("not ready; waiting for:\n");
    for what in &v.waiting {
        let _ = writeln!(out, "  {what}");
    }
    out
}

/// `id*weight`, with the state when it is not active: `9*3(draining)`.
fn member(m: &MemberView) -> String {
    let mark = if m.state == "active" {
        String::new()
    } else {
        format!("({})", m.state)
    };
    format!("{}*{}{mark}", m.id, m.weight)
}

fn vip_row(v: &VipView) -> Vec<String> {
    vec![
        v.vip.clone(),
        api_name(&v.policy),
        api_name(&v.metric),
        v.backend_port.to_string(),
        joined(v.members.iter().map(member).collect(), " "),
        joined(v.departed.iter().map(u16::to_string).collect(), ","),
    ]
}

const VIP_HEADERS: [&str; 6] = [
    "VIP",
    "POLICY",
    "METRIC",
    "BACKEND",
    "MEMBERS (ID*WEIGHT)",
    "DEPARTED",
];

fn show_vips(v: &VipsView) -> String {
    let rows: Vec<Vec<String>> = v.vips.iter().map(vip_row).collect();
    table(&VIP_HEADERS, &rows)
}

fn show_vip(v: &VipView) -> String {
    table(&VIP_HEADERS, &[vip_row(v)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vip_keys_are_path_safe() {
        assert_eq!(segment("10.0.0.1:80"), "10.0.0.1:80");
        assert_eq!(segment("[2001:db8::1]:80"), "%5B2001:db8::1%5D:80");
        assert_eq!(segment("a/b"), "a%2Fb");
    }

    #[test]
    fn vip_weights_are_split_off_only_when_they_parse() {
        assert_eq!(
            vip_and_weight("10.0.0.1:80"),
            json!({ "vip": "10.0.0.1:80" })
        );
        assert_eq!(
            vip_and_weight("10.0.0.1:80:3"),
            json!({ "vip": "10.0.0.1:80", "weight": 3 })
        );
        assert_eq!(
            vip_and_weight("[::1]:80:2"),
            json!({ "vip": "[::1]:80", "weight": 2 })
        );
        assert_eq!(vip_and_weight("nonsense"), json!({ "vip": "nonsense" }));
    }

    /// The human output is printed from the typed views, but reads as it did when it was
    /// printed from the JSON: floats rounded in tables and as JSON writes them in
    /// sentences, enums by their API names.
    #[test]
    fn cells_read_as_the_json_does() {
        use cheetah_core::policy::{LoadMetric, PolicyKind};
        assert_eq!(float(524.288), "524.29");
        assert_eq!(float(0.0), "0");
        assert_eq!(json_text(&0.0f64), "0.0");
        assert_eq!(json_text(&None::<u64>), "null");
        assert_eq!(optional(&None::<u64>), "-");
        assert_eq!(api_name(&PolicyKind::PowerOfTwo), "pow2");
        assert_eq!(
            api_name(&LoadMetric::ActiveConnections),
            "active-connections"
        );
        let draining = MemberView {
            id: 9,
            weight: 3,
            state: "draining".into(),
        };
        assert_eq!(member(&draining), "9*3(draining)");
    }

    #[test]
    fn tables_align_columns() {
        let t = table(&["A", "BB"], &[vec!["xxx".into(), "y".into()]]);
        assert_eq!(t, "A    BB\nxxx  y\n");
        assert_eq!(duration(59), "59s");
        assert_eq!(duration(3_661), "1h01m01s");
    }
}
