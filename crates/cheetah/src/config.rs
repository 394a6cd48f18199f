//! The config file: the LB sections belong to `cheetah_core::config`; the daemon's own
//! settings (the secret file) are taken out here first, so each side rejects unknown fields.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use cheetah_core::config::LbConfig;
use cheetah_core::hash::Secret;
use serde::Deserialize;

use crate::dataplane::xdp::XdpMode;

pub struct FileConfig {
    pub lb: LbConfig,
    /// Where the 128-bit secret lives, relative paths taken from the config's folder.
    pub secret_file: Option<PathBuf>,
    /// How `cheetah run` attaches to the host; absent for `replay`-only configs.
    pub daemon: Option<DaemonConfig>,
}

/// The `[daemon]` section: everything about the host rather than the load-balancing logic.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonConfig {
    /// Interfaces the LB receives and sends on (clients' and servers' sides may be one).
    pub interfaces: Vec<String>,
    /// Address of the HTTP control API and metrics.
    #[serde(default = "default_api_listen")]
    pub api_listen: SocketAddr,
    /// Where state that must survive a restart is kept (relative to the config's folder).
    #[serde(default = "default_state_dir")]
    pub state_dir: PathBuf,
    #[serde(default)]
    pub xdp_mode: XdpMode,
    /// Spin instead of sleeping in poll() when idle: lower latency, one full core per worker.
    #[serde(default)]
    pub busy_poll: bool,
    /// Workers (one per queue); default: as many as the interfaces have queues.
    #[serde(default)]
    pub workers: Option<u32>,
    /// UMEM frames (2 KiB each) per worker.
    #[serde(default = "default_frames")]
    pub frames_per_worker: u32,
}

fn default_api_listen() -> SocketAddr {
    "127.0.0.1:9180".parse().unwrap()
}
fn default_state_dir() -> PathBuf {
    PathBuf::from("/var/lib/cheetah")
}
fn default_frames() -> u32 {
    8192
}

impl DaemonConfig {
    fn validate(&self) -> anyhow::Result<()> {
        if self.interfaces.is_empty() {
            bail!("daemon.interfaces: at least one interface is needed");
        }
        if self.interfaces.len() > crate::dataplane::xdp::MAX_INTERFACES {
            bail!(
                "daemon.interfaces: at most {} interfaces",
                crate::dataplane::xdp::MAX_INTERFACES
            );
        }
        for (i, name) in self.interfaces.iter().enumerate() {
            if self.interfaces[..i].contains(name) {
                bail!("daemon.interfaces[{i}]: {name} is listed twice");
            }
        }
        if self.workers == Some(0) {
            bail!("daemon.workers: must be at least 1");
        }
        if !(1024..=1 << 20).contains(&self.frames_per_worker) {
            bail!("daemon.frames_per_worker: must be between 1024 and 1048576");
        }
        Ok(())
    }
}

impl FileConfig {
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config {}", path.display()))?;
        Self::parse(&text, path.parent().unwrap_or(Path::new(".")))
            .with_context(|| format!("config {} is not valid", path.display()))
    }

    pub fn parse(text: &str, base: &Path) -> anyhow::Result<Self> {
        let mut table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| anyhow::anyhow!("{}", e.message()))?;
        let secret_file = match table.remove("secret_file") {
            Some(toml::Value::String(p)) => Some(base.join(p)),
            Some(_) => bail!("secret_file: must be a path string"),
            None => None,
        };
        let daemon = match table.remove("daemon") {
            Some(value) => {
                let mut daemon: DaemonConfig = value
                    .try_into()
                    .map_err(|e: toml::de::Error| anyhow::anyhow!("daemon: {}", e.message()))?;
                daemon.validate()?;
                daemon.state_dir = base.join(&daemon.state_dir);
                Some(daemon)
            }
            None => None,
        };
        let lb = LbConfig::from_toml(&toml::to_string(&table)?).map_err(anyhow::Error::msg)?;
        lb.validate().map_err(anyhow::Error::msg)?;
        Ok(FileConfig {
            lb,
            secret_file,
            daemon,
        })
    }
}

/// Reads a secret file: 32 hex digits (128 bits), surrounding whitespace ignored.
pub fn read_secret(path: &Path) -> anyhow::Result<Secret> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read secret file {}", path.display()))?;
    Secret::from_hex(&text).with_context(|| {
        format!(
            "secret file {}: expected 32 hex digits (128 bits)",
            path.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "/etc/cheetah";

    #[test]
    fn the_example_config_is_valid() {
        let text = include_str!("../../../examples/cheetah.toml");
        let config = FileConfig::parse(text, Path::new(BASE)).unwrap();
        let daemon = config.daemon.unwrap();
        assert_eq!(daemon.interfaces, ["eth1"]);
        assert_eq!(daemon.xdp_mode, XdpMode::Auto);
        assert_eq!(
            config.secret_file.unwrap(),
            Path::new(BASE).join("cheetah.key")
        );
        assert_eq!(config.lb.servers.len(), 3);
    }

    fn daemon_error(section: &str) -> String {
        let text = format!("[daemon]\n{section}\n");
        format!(
            "{:#}",
            FileConfig::parse(&text, Path::new(BASE)).err().unwrap()
        )
    }

    #[test]
    fn daemon_section_errors_name_the_field() {
        assert!(daemon_error("interfaces = []").contains("daemon.interfaces"));
        assert!(daemon_error("interfaces = [\"a\", \"a\"]").contains("daemon.interfaces[1]"));
        assert!(daemon_error("interfaces = [\"a\"]\nworkers = 0").contains("daemon.workers"));
        assert!(daemon_error("interfaces = [\"a\"]\nframes_per_worker = 5")
            .contains("daemon.frames_per_worker"));
        let unknown = daemon_error("interfaces = [\"a\"]\nbusy = true");
        assert!(
            unknown.contains("daemon") && unknown.contains("busy"),
            "{unknown}"
        );
        let bad_mode = daemon_error("interfaces = [\"a\"]\nxdp_mode = \"fast\"");
        assert!(bad_mode.contains("fast"), "{bad_mode}");
        let bad_addr = daemon_error("interfaces = [\"a\"]\napi_listen = \"localhost\"");
        assert!(bad_addr.contains("daemon"), "{bad_addr}");
    }

    #[test]
    fn relative_state_dir_is_taken_from_the_config_folder() {
        let text = "[daemon]\ninterfaces = [\"a\"]\nstate_dir = \"state\"\n";
        let config = FileConfig::parse(text, Path::new(BASE)).unwrap();
        assert_eq!(
            config.daemon.unwrap().state_dir,
            Path::new(BASE).join("state")
        );
    }
}
