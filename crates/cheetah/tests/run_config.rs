//! `cheetah run --config` on broken configs, without root: the config, the secret and the
//! API address are checked before any interface is touched (`src/run.rs`: config, then
//! secret, then state directory, then the API's listening socket, then the interfaces), so
//! each mistake is reported, by name, by a process that changed nothing.
//!
//! The live counterpart, beside a running LB, is in `live/abuse.rs`.

#[path = "shared/exit_within.rs"]
mod exit_within;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use exit_within::exit_within;

/// A config whose every part is valid; each test breaks one thing. Line numbers matter:
/// the tests check that messages name the user's lines.
const GOOD: &str = r#"secret_file = "secret"
mode = "cheetah"
forwarding = "l2"

[daemon]
interfaces = ["no-such-if0"]
api_listen = "127.0.0.1:0"
state_dir = "state"

[[servers]]
id = 1
dip = "10.20.0.11"
mac = "02:ce:00:00:02:01"

[[servers]]
id = 2
dip = "10.20.0.12"
mac = "02:ce:00:00:02:02"

[[vips]]
address = "10.99.0.1"
port = 80
policy = "rr"
servers = [1, 2]
"#;

const SECRET: &str = "000102030405060708090a0b0c0d0e0f\n";

/// A temporary directory with a secret and `config` in it.
struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    /// `config` in a directory of its own, with pinned maps of its own too: the tests run
    /// in parallel, and two `cheetah run` on one pin directory refuse each other.
    fn new(config: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        // In place of the blank line after state_dir, so that line numbers stay; a BPF
        // filesystem takes no `.` in a name.
        let name = dir
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .replace('.', "");
        let pins = format!(
            "state_dir = \"state\"\nbpf_pin_dir = \"/run/cheetah/bpf/run-config-{name}\"\n"
        );
        let config = config.replacen("state_dir = \"state\"\n\n", &pins, 1);
        std::fs::write(dir.path().join("secret"), SECRET).unwrap();
        std::fs::write(dir.path().join("cheetah.toml"), config).unwrap();
        Setup { dir }
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("cheetah.toml")
    }

    fn state_dir_exists(&self) -> bool {
        self.dir.path().join("state").exists()
    }

    /// `cheetah run --config cheetah.toml`, which must fail; its stderr.
    fn run_fails(&self) -> String {
        run_fails(&self.config())
    }
}

fn run_fails(config: &Path) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cheetah"));
    command.args(["run", "--config"]).arg(config);
    let (code, stderr) = exit_within(command, Duration::from_secs(20));
    assert_ne!(code, Some(0), "the config was accepted:\n{stderr}");
    stderr
}

fn assert_says(stderr: &str, message: &str) {
    assert!(
        stderr.contains(message),
        "expected {message:?} in:\n{stderr}"
    );
}

/// A config error stops the start before the secret is read or the state directory made.
fn refused_as_config(config: &str, message: &str) {
    let setup = Setup::new(config);
    let stderr = setup.run_fails();
    assert_says(&stderr, "is not valid");
    assert_says(&stderr, message);
    assert!(
        !setup.state_dir_exists(),
        "a refused config made the state directory"
    );
}

#[test]
fn an_unknown_field_is_named_with_its_line() {
    let config = GOOD.replace(
        "forwarding = \"l2\"\n",
        "forwarding = \"l2\"\ncolour = \"blue\"\n",
    );
    refused_as_config(&config, "line 4: unknown field `colour`");
    let in_server = GOOD.replace(
        "dip = \"10.20.0.12\"\n",
        "dip = \"10.20.0.12\"\nweight = 3\n",
    );
    refused_as_config(
        &in_server,
        "line 18: unknown field `weight`, expected one of `id`, `dip`",
    );
    let in_daemon = GOOD.replace(
        "state_dir = \"state\"\n",
        "state_dir = \"state\"\nthreads = 4\n",
    );
    refused_as_config(&in_daemon, "daemon: unknown field `threads`");
}

#[test]
fn a_bad_value_is_named_with_its_line() {
    refused_as_config(
        &GOOD.replace("10.20.0.12", "10.20.0.312"),
        "line 17: invalid IP address syntax",
    );
    refused_as_config(
        &GOOD.replace("policy = \"rr\"", "policy = \"fastest\""),
        "line 23: unknown variant `fastest`",
    );
}

#[test]
fn a_duplicate_server_id_is_refused() {
    refused_as_config(
        &GOOD.replace("id = 2", "id = 1"),
        "servers[1].id: server id 1 is used twice",
    );
}

#[test]
fn an_l2_server_without_a_mac_is_refused() {
    refused_as_config(
        &GOOD.replace("mac = \"02:ce:00:00:02:02\"\n", ""),
        "servers[1].mac: l2 forwarding needs each server's MAC address",
    );
}

#[test]
fn a_pool_naming_an_undefined_server_is_refused() {
    refused_as_config(
        &GOOD.replace("servers = [1, 2]", "servers = [1, 2, 9]"),
        "vips[0].servers[2]: server 9 is not defined in [[servers]]",
    );
}

#[test]
fn an_impossible_interface_name_is_a_config_error() {
    refused_as_config(
        &GOOD.replace(
            "[\"no-such-if0\"]",
            "[\"no-such-if0\", \"far-too-long-for-linux\"]",
        ),
        "daemon.interfaces[1]: `far-too-long-for-linux` is not an interface name",
    );
}

#[test]
fn a_config_without_a_daemon_section_cannot_run() {
    let config = GOOD.replace(
        "[daemon]\ninterfaces = [\"no-such-if0\"]\napi_listen = \"127.0.0.1:0\"\nstate_dir = \"state\"\n",
        "",
    );
    let stderr = Setup::new(&config).run_fails();
    assert_says(&stderr, "the config has no [daemon] section");
}

#[test]
fn a_missing_secret_needs_init_secret() {
    let setup = Setup::new(GOOD);
    std::fs::remove_file(setup.dir.path().join("secret")).unwrap();
    let stderr = setup.run_fails();
    assert_says(&stderr, "secret file");
    assert_says(&stderr, "does not exist; pass --init-secret to create it");
    assert!(
        !setup.dir.path().join("secret").exists(),
        "a secret was made"
    );
    assert!(!setup.state_dir_exists());
}

#[test]
fn a_malformed_secret_is_refused() {
    let setup = Setup::new(GOOD);
    std::fs::write(setup.dir.path().join("secret"), "not a key\n").unwrap();
    let stderr = setup.run_fails();
    assert_says(&stderr, "expected 32 hex digits (128 bits)");
}

/// The config is read first: with both a bad config and no secret, the config is named.
#[test]
fn config_errors_come_before_secret_errors() {
    let setup = Setup::new(&GOOD.replace("mode = \"cheetah\"", "mode = \"fastest\""));
    std::fs::remove_file(setup.dir.path().join("secret")).unwrap();
    let stderr = setup.run_fails();
    assert_says(&stderr, "line 2: unknown variant `fastest`");
    assert!(!stderr.contains("secret"), "{stderr}");
}

#[test]
fn a_busy_api_address_is_named() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let setup = Setup::new(&GOOD.replace("127.0.0.1:0", &address));
    let stderr = setup.run_fails();
    assert_says(
        &stderr,
        &format!("cannot listen on {address} for the control API"),
    );
    assert_says(&stderr, "Address already in use");
}

/// The interfaces are the last thing checked: the API bound, then a missing interface
/// stops the start before anything is attached.
#[test]
fn a_missing_interface_is_named() {
    let stderr = Setup::new(GOOD).run_fails();
    assert_says(
        &stderr,
        "interface no-such-if0 does not exist in this network namespace",
    );
}

#[test]
fn a_layout_or_id_the_cookie_cannot_carry_is_refused() {
    refused_as_config(
        &GOOD.replace("mode = \"cheetah\"\n", "mode = \"cheetah\"\ncookie_epoch_bits = 1\n"),
        "cookie_epoch_bits: 1 is not a cookie layout: epoch bits go from 2 (131 s idle, 16384 server ids) to 8 (8388 s idle, 256 server ids)",
    );
    refused_as_config(
        &GOOD.replace("id = 2", "id = 5000").replace("servers = [1, 2]", "servers = [1, 5000]"),
        "servers[1].id: 5000 is above 4095, the largest server id the cookie carries with cookie_epoch_bits = 4",
    );
}

/// A second instance sharing the key file, or a restart, configured with another cookie
/// layout than the key was made for: it would read the other's cookies as other servers.
#[test]
fn a_key_made_for_another_layout_stops_the_start() {
    let setup = Setup::new(&GOOD.replace(
        "mode = \"cheetah\"\n",
        "mode = \"cheetah\"\ncookie_epoch_bits = 5\n",
    ));
    std::fs::write(
        setup.dir.path().join("secret"),
        format!("{SECRET}cookie_epoch_bits = 4\n"),
    )
    .unwrap();
    let stderr = setup.run_fails();
    assert_says(&stderr, "cookie_epoch_bits = 5, but the secret file");
    assert_says(&stderr, "was made for cookie_epoch_bits = 4");
    assert!(
        !setup.state_dir_exists(),
        "a refused start made the state directory"
    );
}
