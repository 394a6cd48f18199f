//! The config `cheetah run` reads inside the LB namespace: `cheetah.toml` and its secret.

use std::fmt::Write as _;
use std::path::Path;

use super::plan::Topology;
use anyhow::Context;

/// Where the LB's control API listens, inside its namespace.
pub const API_LISTEN: &str = "127.0.0.1:9180";
/// Quarantine of a removed server's id, as the paper's deployment uses.
pub const QUARANTINE_SECS: u64 = 600;

/// Writes the secret, the config and each LB instance's (empty) state folder. Every
/// instance runs this one config with this one key; only its state folder differs.
pub fn write(topo: &Topology) -> anyhow::Result<()> {
    write_secret(&topo.files.secret)?;
    for lb in topo.lbs() {
        std::fs::create_dir_all(&lb.state_dir)
            .with_context(|| format!("cannot create {}", lb.state_dir.display()))?;
    }
    std::fs::write(&topo.files.config, config_text(topo))
        .with_context(|| format!("cannot write {}", topo.files.config.display()))?;
    Ok(())
}

/// The config, with paths relative to its folder so that the whole state dir can be moved.
pub fn config_text(topo: &Topology) -> String {
    let file_name = |path: &Path| {
        path.file_name()
            .expect("plan paths end in a file name")
            .to_string_lossy()
            .into_owned()
    };
    let interfaces: Vec<String> = topo
        .lb
        .interfaces()
        .iter()
        .map(|end| quoted(&end.interface))
        .collect();

    let mut text = String::new();
    let _ = writeln!(
        text,
        "# Written by `cheetah testbed up --prefix {}`; rewritten by every `up`.",
        topo.prefix
    );
    let _ = writeln!(
        text,
        "secret_file = {}  # relative to this file's folder",
        quoted(&file_name(&topo.files.secret))
    );
    let _ = writeln!(text, "mode = {}", quoted(topo.mode.name()));
    let _ = writeln!(text, "forwarding = {}", quoted(topo.forwarding.name()));
    let _ = writeln!(text, "quarantine_secs = {QUARANTINE_SECS}");
    let _ = writeln!(text, "\n[daemon]");
    let _ = writeln!(text, "interfaces = [{}]", interfaces.join(", "));
    let _ = writeln!(text, "api_listen = {}", quoted(API_LISTEN));
    let _ = writeln!(
        text,
        "state_dir = {}  # relative to this file's folder",
        quoted(&file_name(&topo.lb.state_dir))
    );
    for lb in &topo.more_lbs {
        let _ = writeln!(
            text,
            "# LB instance {} runs this file too, with `--state-dir {}`",
            lb.instance,
            lb.state_dir.display()
        );
    }
    for server in &topo.servers {
        let _ = writeln!(text, "\n[[servers]]");
        let _ = writeln!(text, "id = {}", server.id);
        let _ = writeln!(text, "dip = {}", quoted(&server.dip.to_string()));
        let _ = writeln!(text, "mac = {}", quoted(&server.mac));
    }
    let ids: Vec<String> = topo.servers.iter().map(|s| s.id.to_string()).collect();
    let _ = writeln!(text, "\n[[vips]]");
    let _ = writeln!(text, "address = {}", quoted(&topo.vip.to_string()));
    let _ = writeln!(text, "port = {}", topo.vip_port);
    let _ = writeln!(text, "policy = {}", quoted(topo.policy.name()));
    let _ = writeln!(text, "servers = [{}]", ids.join(", "));
    text
}

fn quoted(text: &str) -> String {
    toml::Value::String(text.to_string()).to_string()
}

/// A new key for the (default) cookie layout the LB runs with, as `cheetah run
/// --init-secret` makes one.
fn write_secret(path: &Path) -> anyhow::Result<()> {
    // A previous run's file would keep its mode through `create`; start from nothing.
    let _ = std::fs::remove_file(path);
    cheetah_daemon::config::KeyFile::generate(
        cheetah_core::cookie::CookieLayout::DEFAULT_EPOCH_BITS,
    )?
    .write_new(path)
}

#[cfg(test)]
mod tests {
    use cheetah_core::config::{Forwarding, LbConfig, Mode};
    use cheetah_core::policy::PolicyKind;

    use super::*;
    use crate::testbed::Options;

    fn topology(forwarding: Forwarding) -> Topology {
        Topology::plan(&Options {
            prefix: "t1".into(),
            servers: 4,
            clients: 3,
            forwarding,
            mode: Mode::Maglev,
            policy: PolicyKind::PowerOfTwo,
            dir: Some("/nonexistent/t1".into()),
            ..Options::default()
        })
        .unwrap()
    }

    #[test]
    fn config_lists_every_server_with_its_mac_and_the_vip() {
        let text = config_text(&topology(Forwarding::L2));
        let table: toml::Table = text.parse().expect("valid TOML");
        assert_eq!(table["secret_file"].as_str(), Some("secret"));
        assert_eq!(table["mode"].as_str(), Some("maglev"));
        assert_eq!(table["forwarding"].as_str(), Some("l2"));
        assert_eq!(table["quarantine_secs"].as_integer(), Some(600));

        let daemon = table["daemon"].as_table().unwrap();
        let interfaces: Vec<&str> = daemon["interfaces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(interfaces, ["lb-c", "lb-s", "lb-l"]);
        assert_eq!(daemon["api_listen"].as_str(), Some(API_LISTEN));
        assert_eq!(daemon["state_dir"].as_str(), Some("state"));

        let servers = table["servers"].as_array().unwrap();
        assert_eq!(servers.len(), 4);
        for (j, server) in (1..).zip(servers) {
            assert_eq!(server["id"].as_integer(), Some(j));
            assert_eq!(
                server["dip"].as_str(),
                Some(&*format!("10.20.0.{}", 10 + j))
            );
            assert_eq!(
                server["mac"].as_str(),
                Some(&*format!("02:ce:00:00:02:{j:02x}"))
            );
        }
        let vip = &table["vips"].as_array().unwrap()[0];
        assert_eq!(vip["address"].as_str(), Some("10.99.0.1"));
        assert_eq!(vip["port"].as_integer(), Some(80));
        assert_eq!(vip["policy"].as_str(), Some("pow2"));
        assert_eq!(vip["servers"].as_array().unwrap().len(), 4);
    }

    #[test]
    fn several_instances_share_one_config_and_only_their_state_folders_differ() {
        let topo = Topology::plan(&Options {
            prefix: "t1".into(),
            lbs: 2,
            dir: Some("/nonexistent/t1".into()),
            ..Options::default()
        })
        .unwrap();
        let text = config_text(&topo);
        let table: toml::Table = text.parse().expect("valid TOML");
        let interfaces = table["daemon"]["interfaces"].as_array().unwrap();
        assert_eq!(interfaces, &["lb-c", "lb-s"].map(toml::Value::from));
        assert_eq!(table["daemon"]["state_dir"].as_str(), Some("state"));
        assert!(
            text.contains(
                "instance 2 runs this file too, with `--state-dir /nonexistent/t1/state-lb2`"
            ),
            "{text}"
        );
    }

    #[test]
    fn lb_sections_pass_the_lbs_own_validation() {
        for forwarding in [Forwarding::L2, Forwarding::Nat] {
            let mut table: toml::Table = config_text(&topology(forwarding)).parse().unwrap();
            // These two sections belong to the daemon, which strips them before handing the
            // rest to the LB config (which rejects unknown fields).
            table.remove("daemon");
            table.remove("secret_file");
            let lb = LbConfig::from_toml(&toml::to_string(&table).unwrap()).unwrap();
            let (servers, vips) = lb.validate().unwrap();
            assert_eq!(lb.forwarding, forwarding);
            assert_eq!(lb.mode, Mode::Maglev);
            assert_eq!(servers.len(), 4);
            assert_eq!(vips[0].policy, PolicyKind::PowerOfTwo);
        }
    }

    #[test]
    fn secret_is_128_bits_of_hex_readable_by_root_only() {
        use std::os::unix::fs::PermissionsExt;

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, "old").unwrap();
        write_secret(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let key = cheetah_daemon::config::KeyFile::parse(&text).unwrap();
        assert_eq!(key.cookie_epoch_bits, Some(4));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
