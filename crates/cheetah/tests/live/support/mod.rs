//! What the live end-to-end tests share: a testbed that tears itself down, the LB as a
//! child process in its namespace, `ctl` and `loadgen` runs, packet captures and their
//! parsing, and the lock that runs one live scenario at a time.

pub mod echoes;
mod instances;
mod load;
pub mod stats;

#[path = "../../shared/exit_within.rs"]
mod exit_within;
#[path = "../../shared/programs.rs"]
mod programs;

pub use exit_within::exit_within;
pub use instances::Instances;
pub use load::*;
pub use programs::*;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cheetah_daemon::api::StatusView;
use cheetah_lab::scrape;
use serde_json::Value;

/// Live scenarios run one at a time, whichever test thread runs them (the machine has 2
/// cores): the guard is held while scenario `test` runs. `None`, said loudly, without root
/// (network namespaces, XDP); CI runs as root.
pub fn live_scenario(test: &str) -> Option<MutexGuard<'static, ()>> {
    if !is_root() {
        eprintln!("\n*** SKIPPED {test}: needs root (network namespaces, XDP) ***\n");
        return None;
    }
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    Some(ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner()))
}

/// Declares live scenarios as tests: each body runs only as root, and alone (see
/// [`live_scenario`]); the test's name is the one its SKIPPED line prints.
macro_rules! live_tests {
    ($(fn $name:ident() $body:block)+) => {
        $(
            #[test]
            fn $name() {
                if let Some(_alone) = $crate::support::live_scenario(stringify!($name)) $body
            }
        )+
    };
}
pub(crate) use live_tests;

pub fn spawn_in_netns(namespace: &str, program: &str, args: &[&str], log: &Path) -> Child {
    let out = std::fs::File::create(log).expect("cannot create a log file");
    Command::new("ip")
        .args(["netns", "exec", namespace, program])
        .args(args)
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("cannot spawn in a namespace")
}

/// A testbed brought up for one test and taken down when the test ends, also on failure.
pub struct Testbed {
    pub prefix: String,
    pub summary: Value,
    pub dir: PathBuf,
}

impl Testbed {
    /// `servers` servers and `clients` clients behind one LB with `forwarding`, every VIP
    /// round-robin: the testbed most scenarios need.
    pub fn round_robin(prefix: &str, forwarding: &str, servers: usize, clients: usize) -> Self {
        let (servers, clients) = (servers.to_string(), clients.to_string());
        Self::up(
            prefix,
            &[
                "--servers",
                &servers,
                "--clients",
                &clients,
                "--forwarding",
                forwarding,
                "--policy",
                "rr",
            ],
        )
    }

    pub fn up(prefix: &str, extra: &[&str]) -> Self {
        let mut args = vec!["testbed", "up", "--prefix", prefix];
        args.extend_from_slice(extra);
        // Build the guard before asserting, so a half-made testbed is removed too.
        let mut testbed = Testbed {
            prefix: prefix.to_string(),
            summary: Value::Null,
            dir: PathBuf::new(),
        };
        cheetah_ok(&args);
        let dir = PathBuf::from(format!("/run/cheetah-testbed/{prefix}"));
        let text = std::fs::read_to_string(dir.join("testbed.json")).expect("testbed.json");
        testbed.summary = serde_json::from_str(&text).expect("testbed.json is JSON");
        testbed.dir = PathBuf::from(testbed.summary["files"]["dir"].as_str().unwrap());
        testbed
    }

    pub fn ns(&self, role: &str) -> String {
        format!("{}-{role}", self.prefix)
    }

    pub fn config_path(&self) -> PathBuf {
        PathBuf::from(self.summary["files"]["config"].as_str().unwrap())
    }

    pub fn secret_path(&self) -> PathBuf {
        PathBuf::from(self.summary["files"]["secret"].as_str().unwrap())
    }

    pub fn vip(&self) -> String {
        format!(
            "{}:{}",
            self.summary["vip"].as_str().unwrap(),
            self.summary["vip_port"]
        )
    }

    /// Writes a variant of the LB config whose pool holds only `pool` (the other servers
    /// run nginx but are unknown to the LB until a test adds them).
    pub fn config_with_pool(&self, pool: &[u16]) -> PathBuf {
        let text = std::fs::read_to_string(self.config_path()).unwrap();
        let mut config: toml::Table = text.parse().unwrap();
        let servers = config["servers"].as_array_mut().unwrap();
        servers.retain(|s| pool.contains(&(s["id"].as_integer().unwrap() as u16)));
        let vips = config["vips"].as_array_mut().unwrap();
        vips[0]["servers"] = toml::Value::Array(
            pool.iter()
                .map(|id| toml::Value::Integer(*id as i64))
                .collect(),
        );
        let path = self.dir.join("cheetah-test.toml");
        std::fs::write(&path, toml::to_string(&config).unwrap()).unwrap();
        path
    }

    /// The `cheetah ctl` arguments that add testbed server `id` to the VIP.
    pub fn server_add_args(&self, id: u16) -> Vec<String> {
        let (dip, mac) = self.server(id);
        [
            "servers",
            "add",
            "--id",
            &id.to_string(),
            "--dip",
            &dip,
            "--mac",
            &mac,
            "--vip",
            &self.vip(),
        ]
        .map(String::from)
        .to_vec()
    }

    /// The VIP and its port.
    pub fn vip_addr(&self) -> std::net::SocketAddrV4 {
        self.vip()
            .parse()
            .expect("the testbed's VIP is address:port")
    }

    /// A capture filter that leaves out the LB host's own traffic with the servers: its
    /// health probes (SYN, the server's SYN-ACK, the host's RST), which carry server
    /// TSvals at times no request explains.
    pub fn not_health_probes(&self) -> String {
        let lb = self.summary["lb"]["server_side"]["address"]
            .as_str()
            .expect("testbed.json has the LB's server-side address");
        format!("not host {lb}")
    }

    /// The address of client `c<index>`.
    pub fn client_address(&self, index: usize) -> std::net::Ipv4Addr {
        self.summary["clients"][index]["address"]
            .as_str()
            .unwrap_or_else(|| panic!("testbed has no client c{index}"))
            .parse()
            .unwrap()
    }

    /// The LB's key, to decode cookies as the LB does.
    pub fn secret(&self) -> cheetah_core::hash::Secret {
        cheetah_daemon::config::read_secret(&self.secret_path()).expect("the testbed's secret")
    }

    /// Ids of the servers the testbed made.
    pub fn server_ids(&self) -> Vec<u16> {
        self.summary["servers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_u64().unwrap() as u16)
            .collect()
    }

    /// (dip, mac) of server `id` as the testbed made it.
    pub fn server(&self, id: u16) -> (String, String) {
        let server = self.server_entry("id", id);
        (
            server["dip"].as_str().unwrap().to_string(),
            server["mac"].as_str().unwrap().to_string(),
        )
    }

    /// What server `name` (`s<j>`) adds to the host's TCP clock: its TSval on the wire is
    /// (CLOCK_MONOTONIC ms + this) mod 2^32. 0 for every server with `--server-clocks shared`.
    pub fn clock_offset(&self, name: &str) -> u32 {
        self.server_entry("name", name)["clock_offset"]
            .as_u64()
            .expect("testbed.json records each server's clock_offset") as u32
    }
}

impl Testbed {
    /// The server whose `field` is `value` in `testbed.json`.
    fn server_entry<T>(&self, field: &str, value: T) -> &Value
    where
        Value: PartialEq<T>,
        T: std::fmt::Display + Copy,
    {
        self.summary["servers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s[field] == value)
            .unwrap_or_else(|| panic!("testbed has no server with {field} {value}"))
    }
}

/// CLOCK_MONOTONIC in ms: the host's TCP timestamp clock under `tcp_timestamps=2`.
pub fn monotonic_ms() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec to write into.
    assert_eq!(
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) },
        0
    );
    now.tv_sec as u64 * 1000 + now.tv_nsec as u64 / 1_000_000
}

impl Drop for Testbed {
    fn drop(&mut self) {
        let out = cheetah(&["testbed", "down", "--prefix", &self.prefix]);
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            eprintln!("testbed down {} failed: {stderr}", self.prefix);
            // Frames the LB's XDP program sent were lost on a veth: the test must not pass
            // (unless it is failing already: a second panic would abort).
            if stderr.contains(cheetah_lab::testbed::XDP_DROPS_ON_VETHS)
                && !std::thread::panicking()
            {
                panic!("testbed {}: {stderr}", self.prefix);
            }
        }
    }
}

/// `cheetah run` in the testbed's LB namespace.
pub struct Lb {
    namespace: String,
    config: PathBuf,
    /// Further `cheetah run` arguments (e.g. `--fault ...`), given at every start.
    extra_args: Vec<String>,
    pub log: PathBuf,
    child: Option<Child>,
    starts: u32,
}

impl Lb {
    pub fn start(testbed: &Testbed, config: &Path) -> Self {
        Self::start_with_args(testbed, config, &[])
    }

    /// Like [`Lb::start`], with more `cheetah run` arguments.
    pub fn start_with_args(testbed: &Testbed, config: &Path, extra_args: &[&str]) -> Self {
        Self::start_in(
            &testbed.ns("lb"),
            config,
            extra_args,
            testbed.dir.join("lb.log"),
        )
    }

    /// `cheetah run` in `namespace`, its logs `log` with the start's number.
    pub fn start_in(namespace: &str, config: &Path, extra_args: &[&str], log: PathBuf) -> Self {
        let mut lb = Lb {
            namespace: namespace.to_string(),
            config: config.to_path_buf(),
            extra_args: extra_args.iter().map(|a| a.to_string()).collect(),
            log,
            child: None,
            starts: 0,
        };
        lb.restart();
        lb
    }

    /// Starts the LB again (after `kill9` or `stop`), and waits until its data path runs
    /// (`StatusView::data_path_up`), not only its API.
    pub fn restart(&mut self) {
        self.starts += 1;
        let log = self.log.with_extension(format!("{}.log", self.starts));
        let config = self.config.to_string_lossy().into_owned();
        let mut args = vec!["run", "--config", &config];
        args.extend(self.extra_args.iter().map(String::as_str));
        self.child = Some(spawn_in_netns(&self.namespace, cheetah_bin(), &args, &log));
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let status = self.ctl(&["--json", "status"]);
            if status.status.success() {
                let status: StatusView = serde_json::from_slice(&status.stdout).unwrap();
                if status.data_path_up() {
                    return;
                }
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "cheetah run exited with {status}:\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            assert!(Instant::now() < deadline, "cheetah run did not come up");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            // `ip netns exec` execs the binary, so the child's pid is the LB's.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let _ = child.wait();
        }
    }

    /// Whether the LB process is still alive (it was not stopped and did not exit).
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|child| child.try_wait().unwrap().is_none())
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub fn ctl(&self, args: &[&str]) -> Output {
        let mut all = vec!["ctl"];
        all.extend_from_slice(args);
        in_netns(&self.namespace, cheetah_bin(), &all)
    }

    pub fn ctl_ok(&self, args: &[&str]) -> String {
        let out = self.ctl(args);
        assert!(
            out.status.success(),
            "`cheetah ctl {}` failed: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `active_connections` of every server by id, from `cheetah ctl --json servers list`.
    pub fn active_connections(&self) -> std::collections::BTreeMap<u16, u64> {
        let text = self.ctl_ok(&["--json", "servers", "list"]);
        let list: Value = serde_json::from_str(&text).expect("servers list is JSON");
        list["servers"]
            .as_array()
            .expect("a servers array")
            .iter()
            .map(|s| {
                (
                    s["id"].as_u64().unwrap() as u16,
                    s["active_connections"].as_u64().unwrap(),
                )
            })
            .collect()
    }

    /// How often the LB counted `event` (`cheetah_events_total`), over all workers.
    pub fn event_count(&self, event: &str) -> f64 {
        metric_sum(
            &self.metrics(),
            "cheetah_events_total",
            &[&format!("event=\"{event}\"")],
        )
    }

    /// The Prometheus text of the running LB.
    pub fn metrics(&self) -> String {
        String::from_utf8_lossy(
            &in_netns(
                &self.namespace,
                "curl",
                &["-s", "-m", "5", "http://127.0.0.1:9180/metrics"],
            )
            .stdout,
        )
        .into_owned()
    }
}

impl Drop for Lb {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Sum of the samples of `metric` whose labels contain every `label="value"` given.
/// What the XDP program counted as core event `event`: `cheetah_events_total` of worker
/// `xdp` in a `/metrics` text.
pub fn kernel_event(metrics: &str, event: &str) -> f64 {
    let event = format!("event=\"{event}\"");
    metric_sum(metrics, "cheetah_events_total", &["worker=\"xdp\"", &event])
}

pub fn metric_sum(text: &str, metric: &str, labels: &[&str]) -> f64 {
    scrape::samples(text)
        .filter(|s| s.name == metric && labels.iter().all(|l| s.labels.contains(l)))
        .map(|s| s.value)
        .sum()
}

/// Every sample of `metric` summed by the value of `label` (e.g. drops by `reason`, over
/// all workers).
pub fn metric_by_label(
    text: &str,
    metric: &str,
    label: &str,
) -> std::collections::BTreeMap<String, f64> {
    let mut sums = std::collections::BTreeMap::new();
    for sample in scrape::samples(text).filter(|s| s.name == metric) {
        if let Some(value) = sample.label(label) {
            *sums.entry(value.to_string()).or_insert(0.0) += sample.value;
        }
    }
    sums
}

/// Sets `key` to `value` in `namespace` (the lab's `testbed::sysctl`), failing the test if
/// it cannot.
pub fn set_sysctl(namespace: &str, key: &str, value: &str) {
    cheetah_lab::testbed::sysctl(namespace, &[(key, value)])
        .unwrap_or_else(|e| panic!("sysctl {key}={value} in {namespace}: {e:#}"));
}

/// Drops by reason, summed over the workers.
pub fn drops_by_reason(metrics: &str) -> std::collections::BTreeMap<String, u64> {
    counts_by_label(metrics, "cheetah_drops_total", "reason")
}

/// What the XDP program handed to the workers between two `/metrics` texts, by reason
/// (`cheetah_xdp_to_userspace_total`).
pub fn handed_up_between(before: &str, after: &str) -> std::collections::BTreeMap<String, u64> {
    let by_reason = |metrics| counts_by_label(metrics, "cheetah_xdp_to_userspace_total", "reason");
    deltas(&by_reason(before), &by_reason(after))
}

/// [`metric_by_label`] for a counter: whole counts.
pub fn counts_by_label(
    metrics: &str,
    metric: &str,
    label: &str,
) -> std::collections::BTreeMap<String, u64> {
    metric_by_label(metrics, metric, label)
        .into_iter()
        .map(|(value, count)| (value, count as u64))
        .collect()
}

/// `after - before` for every key of `after` (counters only grow).
pub fn deltas(
    before: &std::collections::BTreeMap<String, u64>,
    after: &std::collections::BTreeMap<String, u64>,
) -> std::collections::BTreeMap<String, u64> {
    after
        .iter()
        .map(|(key, value)| (key.clone(), value - before.get(key).copied().unwrap_or(0)))
        .collect()
}

/// `cheetah testbed inject ARGS` in a client namespace; its JSON summary.
pub fn inject(namespace: &str, args: &[&str]) -> Value {
    let mut all = vec!["testbed", "inject"];
    all.extend_from_slice(args);
    let out = in_netns_ok(namespace, cheetah_bin(), &all);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("inject printed no JSON ({e}): {out}"))
}

/// The `Ip:` counters of `/proc/net/snmp` in a namespace, by name (`InHdrErrors`, ...).
pub fn ip_snmp(namespace: &str) -> std::collections::BTreeMap<String, u64> {
    let text = in_netns_ok(namespace, "cat", &["/proc/net/snmp"]);
    let mut ip_lines = text.lines().filter(|line| line.starts_with("Ip: "));
    let (names, values) = (ip_lines.next().unwrap(), ip_lines.next().unwrap());
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .skip(1)
        .map(|(name, value)| (name.to_string(), value.parse().unwrap_or(0)))
        .collect()
}

/// One `curl URL` from namespace `client`, the body thrown away: the words its
/// `--write-out` printed (`%{http_code}` is `000` when no connection was made). `options`
/// are further curl options, such as its timeouts.
pub fn curl_write_out(
    testbed: &Testbed,
    client: &str,
    url: &str,
    write_out: &str,
    options: &[&str],
) -> Vec<String> {
    let mut args = vec!["-s", "-o", "/dev/null", "-w", write_out];
    args.extend_from_slice(options);
    args.push(url);
    let out = in_netns(&testbed.ns(client), "curl", &args);
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// One request on a new connection from client `client` (`c0`, `c1`...): (status,
/// X-Server, seconds); status `000` and f64::MAX seconds when nothing answered in 5 s.
pub fn timed_request(testbed: &Testbed, client: &str) -> (String, String, f64) {
    let url = format!("http://{}/", testbed.vip());
    // The header last: without an answer it is empty, and the words before it stay put.
    let write_out = "%{http_code} %{time_total} %header{x-server}";
    let mut words = curl_write_out(testbed, client, &url, write_out, &["-m", "5"]).into_iter();
    let status = words.next().unwrap_or_default();
    let seconds = words
        .next()
        .and_then(|w| w.parse().ok())
        .unwrap_or(f64::MAX);
    let server = words.next().unwrap_or_default();
    (status, server, seconds)
}

/// An nftables table in a namespace, there for one test: deleted when dropped.
pub struct NftTable {
    namespace: String,
    family: &'static str,
    name: String,
    installed: bool,
}

impl NftTable {
    /// Installs `table FAMILY NAME { BODY }` in `namespace` (the rules file goes in the
    /// testbed's directory).
    pub fn install(
        testbed: &Testbed,
        namespace: &str,
        family: &'static str,
        name: &str,
        body: &str,
    ) -> Self {
        let path = testbed.dir.join(format!("{name}.nft"));
        std::fs::write(&path, format!("table {family} {name} {{\n{body}}}\n")).unwrap();
        let out = in_netns(namespace, "nft", &["-f", path.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "nft -f failed (nftables installed? scripts/setup.sh installs it): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        NftTable {
            namespace: namespace.to_string(),
            family,
            name: name.to_string(),
            installed: true,
        }
    }

    /// `nft list table`: the rules with their counters.
    pub fn list(&self) -> String {
        in_netns_ok(
            &self.namespace,
            "nft",
            &["list", "table", self.family, &self.name],
        )
    }

    /// Deletes the table before the test ends.
    pub fn remove(&mut self) {
        if std::mem::take(&mut self.installed) {
            in_netns_ok(
                &self.namespace,
                "nft",
                &["delete", "table", self.family, &self.name],
            );
        }
    }
}

impl Drop for NftTable {
    fn drop(&mut self) {
        if self.installed {
            let _ = in_netns(
                &self.namespace,
                "nft",
                &["delete", "table", self.family, &self.name],
            );
        }
    }
}

/// tcpdump writing a pcap in a namespace until stopped.
pub struct Capture {
    child: Child,
    pub path: PathBuf,
}

impl Capture {
    pub fn start(namespace: &str, interface: &str, filter: &str, path: &Path) -> Self {
        Self::start_with_snaplen(namespace, interface, filter, path, None)
    }

    /// Captures only the first `snaplen` bytes of each frame (enough for the headers at
    /// 128), which keeps long captures small; [`read_pcap`] reads such files.
    pub fn start_with_snaplen(
        namespace: &str,
        interface: &str,
        filter: &str,
        path: &Path,
        snaplen: Option<u32>,
    ) -> Self {
        let snaplen = snaplen.map(|n| n.to_string());
        let snaplen_args: Vec<&str> = match &snaplen {
            Some(n) => vec!["-s", n],
            None => Vec::new(),
        };
        let child = Command::new("ip")
            // Immediate mode: without it tcpdump holds packets in its ring until a block
            // fills, and a short capture ends with none written.
            .args([
                "netns",
                "exec",
                namespace,
                "tcpdump",
                "--immediate-mode",
                "-U",
            ])
            .arg("-n")
            .args(&snaplen_args)
            .args(["-i", interface, "-w"])
            .arg(path)
            .arg(filter)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cannot start tcpdump");
        // tcpdump says "listening on" once the socket is open; give it that moment.
        let deadline = Instant::now() + Duration::from_secs(5);
        while !path.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(300));
        Capture {
            child,
            path: path.to_path_buf(),
        }
    }

    /// Stops tcpdump (SIGINT flushes the file) and returns the captured frames.
    pub fn finish(mut self) -> Vec<Vec<u8>> {
        std::thread::sleep(Duration::from_millis(300));
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let _ = self.child.wait();
        read_pcap(&self.path)
    }

    /// Like [`Capture::finish`]: the TCP segments among the frames, in capture order.
    pub fn segments(self) -> Vec<TcpView> {
        self.finish().iter().filter_map(|f| parse_tcp(f)).collect()
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The frames of a classic pcap file (what `tcpdump -w` writes), in capture order.
///
/// Hand-written rather than `pcap_file`, which refuses records cut short by a snaplen
/// (`orig_len > snap_len`), exactly what header-only captures are. A record cut short by
/// tcpdump being stopped ends the list.
pub fn read_pcap(path: &Path) -> Vec<Vec<u8>> {
    let bytes = std::fs::read(path).expect("capture file");
    assert!(bytes.len() >= 24, "{}: no pcap header", path.display());
    let magic: [u8; 4] = bytes[0..4].try_into().unwrap();
    // Microsecond or nanosecond timestamps, either byte order: only the order matters here.
    let big_endian = match magic {
        [0xd4, 0xc3, 0xb2, 0xa1] | [0x4d, 0x3c, 0xb2, 0xa1] => false,
        [0xa1, 0xb2, 0xc3, 0xd4] | [0xa1, 0xb2, 0x3c, 0x4d] => true,
        _ => panic!("{}: not a pcap file (magic {magic:02x?})", path.display()),
    };
    let word = |at: usize| {
        let raw: [u8; 4] = bytes[at..at + 4].try_into().unwrap();
        if big_endian {
            u32::from_be_bytes(raw)
        } else {
            u32::from_le_bytes(raw)
        }
    };
    let mut frames = Vec::new();
    let mut at = 24;
    while at + 16 <= bytes.len() {
        let captured = word(at + 8) as usize;
        let data = at + 16;
        if data + captured > bytes.len() {
            break;
        }
        frames.push(bytes[data..data + captured].to_vec());
        at = data + captured;
    }
    frames
}

/// A counter of `/proc/net/netstat` or `/proc/net/snmp` (e.g. `("TcpExt", "PAWSEstab")`)
/// as the namespace's own TCP stack counts it; `None` if this kernel has no such counter.
pub fn netstat_counter(namespace: &str, group: &str, name: &str) -> Option<u64> {
    let text = in_netns_ok(namespace, "cat", &["/proc/net/netstat", "/proc/net/snmp"]);
    let prefix = format!("{group}:");
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with(&prefix)).collect();
    // Each group is a line of names followed by a line of values.
    lines.chunks(2).find_map(|pair| {
        let [names, values] = pair else { return None };
        let position = names.split_whitespace().position(|n| n == name)?;
        values.split_whitespace().nth(position)?.parse().ok()
    })
}

/// The fields of an Ethernet/IPv4/TCP frame the tests look at.
#[derive(Clone, Copy, Debug)]
pub struct TcpView {
    pub src: [u8; 4],
    pub dst: [u8; 4],
    pub sport: u16,
    pub dport: u16,
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    pub payload_len: usize,
    /// (TSval, TSecr) if the segment carries a timestamp option.
    pub timestamps: Option<(u32, u32)>,
}

impl TcpView {
    pub fn is_rst(&self) -> bool {
        self.flags & 0x04 != 0
    }
    pub fn is_syn(&self) -> bool {
        self.flags & 0x02 != 0
    }
    pub fn is_ack(&self) -> bool {
        self.flags & 0x10 != 0
    }
    pub fn is_syn_ack(&self) -> bool {
        self.flags & 0x12 == 0x12
    }
    pub fn is_fin(&self) -> bool {
        self.flags & 0x01 != 0
    }
}

/// RSTs in a client-side capture (SYNs, FINs and RSTs, in capture order) that could have
/// reset a live connection.
///
/// Two kinds of RST break nothing, and both follow from a SYN-ACK lost while the LB was
/// down (a stateless LB with a non-hash policy places the retransmitted SYN anew):
/// - the cleanup of the first server's half-open connection, which the client's TCP
///   ignores (out of window): the 4-tuple shows SYN-ACKs with two different ISNs;
/// - a RST after the client closed the connection (its FIN was sent): a late ACK from the
///   client's FIN_WAIT or TIME_WAIT socket echoing the other server's cookie reaches a
///   server without the connection, whose RST only ends the client's closing socket.
///
/// Any other RST is a real reset.
pub fn unexplained_resets(segments: &[TcpView]) -> Vec<TcpView> {
    let client_port = |t: &TcpView| if t.sport == 80 { t.dport } else { t.sport };
    segments
        .iter()
        .enumerate()
        .filter(|(_, t)| t.is_rst())
        .filter(|(at, rst)| {
            let port = client_port(rst);
            let mut isns: Vec<u32> = segments
                .iter()
                .filter(|t| t.is_syn_ack() && client_port(t) == port)
                .map(|t| t.seq)
                .collect();
            isns.sort_unstable();
            isns.dedup();
            let client_closed_before = segments[..*at]
                .iter()
                .any(|t| t.is_fin() && t.dport == 80 && t.sport == port);
            isns.len() < 2 && !client_closed_before
        })
        .map(|(_, t)| *t)
        .collect()
}

/// A deliberately independent parser (not the core's), so the tests check the core's
/// output with code that does not share its bugs.
pub fn parse_tcp(frame: &[u8]) -> Option<TcpView> {
    let mut at = 12;
    let mut ethertype = u16::from_be_bytes([*frame.get(at)?, *frame.get(at + 1)?]);
    while ethertype == 0x8100 || ethertype == 0x88a8 {
        at += 4;
        ethertype = u16::from_be_bytes([*frame.get(at)?, *frame.get(at + 1)?]);
    }
    if ethertype != 0x0800 {
        return None;
    }
    let ip = frame.get(at + 2..)?;
    let ihl = (*ip.first()? & 0x0f) as usize * 4;
    if ip.len() < 20 || ip[9] != 6 || ip.len() < ihl + 20 {
        return None;
    }
    let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    let tcp = &ip[ihl..];
    let data_offset = (tcp[12] >> 4) as usize * 4;
    let options = tcp.get(20..data_offset)?;
    let mut timestamps = None;
    let mut i = 0;
    while i < options.len() {
        match options[i] {
            0 => break,
            1 => i += 1,
            kind => {
                let len = *options.get(i + 1)? as usize;
                if len < 2 || i + len > options.len() {
                    return None;
                }
                if kind == 8 && len == 10 {
                    let word = |o: usize| {
                        u32::from_be_bytes(options[i + o..i + o + 4].try_into().unwrap())
                    };
                    timestamps = Some((word(2), word(6)));
                }
                i += len;
            }
        }
    }
    Some(TcpView {
        src: ip[12..16].try_into().unwrap(),
        dst: ip[16..20].try_into().unwrap(),
        sport: u16::from_be_bytes([tcp[0], tcp[1]]),
        dport: u16::from_be_bytes([tcp[2], tcp[3]]),
        seq: u32::from_be_bytes(tcp[4..8].try_into().unwrap()),
        ack: u32::from_be_bytes(tcp[8..12].try_into().unwrap()),
        flags: tcp[13],
        payload_len: total.saturating_sub(ihl + data_offset),
        timestamps,
    })
}

/// Waits for a condition, polling; false if it did not hold in time.
pub fn eventually(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `cheetah testbed churn` started in the background (it brings up and takes down its own
/// testbed); [`Churn::finish`] waits for it and returns `<out>/<mode>.json`.
pub struct Churn {
    child: Child,
    pub out: PathBuf,
    /// `<mode>`, or `<mode>-<n>lbs` with several LB instances: names the results file.
    pub stem: String,
    log: PathBuf,
}

impl Churn {
    pub fn start(mode: &str, prefix: &str, out: &Path, extra: &[&str]) -> Self {
        Self::start_with_lbs(mode, 1, prefix, out, extra)
    }

    /// Like [`Churn::start`] with `lbs` LB instances: the results are
    /// `<out>/<mode>-<lbs>lbs.json` for more than one.
    pub fn start_with_lbs(mode: &str, lbs: u16, prefix: &str, out: &Path, extra: &[&str]) -> Self {
        std::fs::create_dir_all(out).unwrap();
        let stem = if lbs == 1 {
            mode.to_string()
        } else {
            format!("{mode}-{lbs}lbs")
        };
        let log = out.join(format!("churn-{stem}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let out_arg = out.to_string_lossy().into_owned();
        let child = Command::new(cheetah_bin())
            .args([
                "testbed",
                "churn",
                "--mode",
                mode,
                "--prefix",
                prefix,
                "--out",
                &out_arg,
                "--progress",
                "--lbs",
                &lbs.to_string(),
            ])
            .args(extra)
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("cannot start cheetah testbed churn");
        Churn {
            child,
            out: out.to_path_buf(),
            stem,
            log,
        }
    }

    pub fn finish(mut self) -> Value {
        let status = self.child.wait().unwrap();
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        eprintln!("churn {}:\n{log}", self.stem);
        assert!(status.success(), "cheetah testbed churn failed:\n{log}");
        let path = self.out.join(format!("{}.json", self.stem));
        let text = std::fs::read_to_string(&path).expect("the churn results file");
        serde_json::from_str(&text).expect("churn results are JSON")
    }
}

impl Drop for Churn {
    fn drop(&mut self) {
        // A test that fails early still stops the runner, which then tears its testbed down.
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
            let _ = self.child.wait();
        }
    }
}

/// Waits until testbed `prefix`, brought up by someone else (the churn runner), is
/// complete: `up` writes `testbed.json` last.
pub fn wait_for_testbed(prefix: &str, timeout: Duration) -> bool {
    let summary = PathBuf::from(format!("/run/cheetah-testbed/{prefix}/testbed.json"));
    eventually(timeout, || summary.exists())
}
