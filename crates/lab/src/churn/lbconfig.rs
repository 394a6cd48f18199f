//! The LB config of a churn run, derived from the one `testbed up` wrote.

use std::path::{Path, PathBuf};

use anyhow::Context;

/// Port of the LB's control API, on every address of its host.
pub const API_PORT: u16 = 9180;

/// Writes `<dir>/churn.toml`: the testbed's config with only `pool` defined (the other
/// servers run nginx but are unknown to the LB until the schedule adds them), and the API on
/// every address, so that the servers' load agents reach each instance at its server-side
/// address with one config for all instances. (The XDP program passes this traffic to the
/// host: it is neither to nor from a VIP, nor from a backend's service port.)
pub fn write(testbed_config: &Path, pool: &[u16]) -> anyhow::Result<PathBuf> {
    let text = std::fs::read_to_string(testbed_config)
        .with_context(|| format!("cannot read {}", testbed_config.display()))?;
    let churn = config_text(&text, pool, &format!("0.0.0.0:{API_PORT}"))?;
    let path = testbed_config.with_file_name("churn.toml");
    std::fs::write(&path, churn).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

pub fn config_text(testbed_config: &str, pool: &[u16], api_listen: &str) -> anyhow::Result<String> {
    let mut config: toml::Table = testbed_config
        .parse()
        .context("the testbed's config is not TOML")?;
    let servers = config
        .get_mut("servers")
        .and_then(toml::Value::as_array_mut)
        .context("the testbed's config has no [[servers]]")?;
    servers.retain(|s| {
        s.get("id")
            .and_then(toml::Value::as_integer)
            .is_some_and(|id| pool.iter().any(|p| i64::from(*p) == id))
    });
    let ids = toml::Value::Array(pool.iter().map(|id| i64::from(*id).into()).collect());
    let vip = config
        .get_mut("vips")
        .and_then(toml::Value::as_array_mut)
        .and_then(|vips| vips.first_mut())
        .and_then(toml::Value::as_table_mut)
        .context("the testbed's config has no [[vips]]")?;
    vip.insert("servers".into(), ids);
    let daemon = config
        .get_mut("daemon")
        .and_then(toml::Value::as_table_mut)
        .context("the testbed's config has no [daemon]")?;
    daemon.insert("api_listen".into(), api_listen.into());
    Ok(format!(
        "# Written by `cheetah testbed churn`: the testbed's config with the scenario's first pool.\n{}",
        toml::to_string(&config)?
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TESTBED: &str = r#"
secret_file = "secret"
mode = "hash"
forwarding = "l2"
quarantine_secs = 600

[daemon]
interfaces = ["lb-c", "lb-s", "lb-l"]
api_listen = "127.0.0.1:9180"
state_dir = "state"

[[servers]]
id = 1
dip = "10.20.0.11"
mac = "02:ce:00:00:02:01"

[[servers]]
id = 2
dip = "10.20.0.12"
mac = "02:ce:00:00:02:02"

[[servers]]
id = 3
dip = "10.20.0.13"
mac = "02:ce:00:00:02:03"

[[vips]]
address = "10.99.0.1"
port = 80
policy = "rr"
servers = [1, 2, 3]
"#;

    #[test]
    fn keeps_the_pool_and_moves_the_api_to_the_server_side() {
        let text = config_text(TESTBED, &[1, 2], "10.20.0.1:9180").unwrap();
        let table: toml::Table = text.parse().unwrap();
        assert_eq!(table["mode"].as_str(), Some("hash"));
        assert_eq!(table["servers"].as_array().unwrap().len(), 2);
        let pool = table["vips"][0]["servers"].as_array().unwrap();
        assert_eq!(pool, &[toml::Value::from(1), toml::Value::from(2)]);
        assert_eq!(
            table["daemon"]["api_listen"].as_str(),
            Some("10.20.0.1:9180")
        );
        assert_eq!(table["daemon"]["state_dir"].as_str(), Some("state"));
    }
}
