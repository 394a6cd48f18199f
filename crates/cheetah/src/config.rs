//! The config file: the LB sections belong to `cheetah_core::config`; the daemon's own
//! settings (the secret file) are taken out here first, so each side rejects unknown fields.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use cheetah_core::config::LbConfig;
use cheetah_core::hash::Secret;

pub struct FileConfig {
    pub lb: LbConfig,
    /// Where the 128-bit secret lives, relative paths taken from the config's folder.
    pub secret_file: Option<PathBuf>,
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
        let lb = LbConfig::from_toml(&toml::to_string(&table)?).map_err(anyhow::Error::msg)?;
        lb.validate().map_err(anyhow::Error::msg)?;
        Ok(FileConfig { lb, secret_file })
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
