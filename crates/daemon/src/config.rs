//! The config file: the LB sections belong to `cheetah_core::config`; the daemon's own
//! settings (the secret file) are taken out here first, so each side rejects unknown fields.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use cheetah_core::config::LbConfig;
use cheetah_core::hash::Secret;
use serde::Deserialize;

use crate::dataplane::pin::PinDir;
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
    /// Where packets are handled: `xdp` (in the kernel where the XDP program can, the
    /// rest through AF_XDP) or `afxdp` (every packet through AF_XDP). Taken out of the
    /// table by [`FileConfig::parse`], so its error names the field.
    #[serde(skip)]
    pub datapath: Datapath,
    /// Spin instead of sleeping in poll() when idle: lower latency, one full core per worker.
    #[serde(default)]
    pub busy_poll: bool,
    /// Workers (one per queue); default: as many as the interfaces have queues.
    #[serde(default)]
    pub workers: Option<u32>,
    /// UMEM frames (2 KiB each) per worker.
    #[serde(default = "default_frames")]
    pub frames_per_worker: u32,
    /// The interfaces servers' replies arrive on; default: those the kernel routes a
    /// server's address through (`dataplane/sides.rs`).
    #[serde(default)]
    pub server_interfaces: Option<Vec<String>>,
    /// Where the XDP program's maps are pinned, so that its state outlives the process
    /// (`dataplane/pin.rs`): an absolute path on a BPF filesystem, one per LB instance;
    /// default: one under `pin::DEFAULT_ROOT` named after the network namespace and the
    /// interfaces.
    #[serde(default)]
    pub bpf_pin_dir: Option<PathBuf>,
}

/// `[daemon] datapath`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Datapath {
    /// The XDP program forwards what it can itself (`LB_FAST_PATH`) and hands the rest to
    /// the AF_XDP workers.
    #[default]
    Xdp,
    /// Every packet of the LB goes through the AF_XDP workers; the XDP program only steers.
    AfXdp,
}

impl Datapath {
    pub const ALL: [Datapath; 2] = [Datapath::Xdp, Datapath::AfXdp];

    pub fn name(self) -> &'static str {
        match self {
            Datapath::Xdp => "xdp",
            Datapath::AfXdp => "afxdp",
        }
    }

    /// Whether the XDP program's in-kernel path is on.
    pub fn fast_path(self) -> bool {
        self == Datapath::Xdp
    }

    fn from_toml(value: &toml::Value) -> anyhow::Result<Self> {
        let name = value
            .as_str()
            .context("daemon.datapath: must be a string (\"xdp\" or \"afxdp\")")?;
        Datapath::ALL
            .into_iter()
            .find(|d| d.name() == name)
            .with_context(|| format!("daemon.datapath: `{name}` is not a data path (xdp or afxdp)"))
    }
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
            if !is_valid_interface_name(name) {
                bail!(
                    "daemon.interfaces[{i}]: `{name}` is not an interface name (1 to 15 characters, none of them `/`, `:` or white space)"
                );
            }
            if self.interfaces[..i].contains(name) {
                bail!("daemon.interfaces[{i}]: {name} is listed twice");
            }
        }
        for (i, name) in self.server_interfaces.iter().flatten().enumerate() {
            if !self.interfaces.contains(name) {
                bail!("daemon.server_interfaces[{i}]: {name} is not one of daemon.interfaces");
            }
        }
        if self.workers == Some(0) {
            bail!("daemon.workers: must be at least 1");
        }
        if !(1024..=1 << 20).contains(&self.frames_per_worker) {
            bail!("daemon.frames_per_worker: must be between 1024 and 1048576");
        }
        if let Some(dir) = &self.bpf_pin_dir {
            PinDir::new(dir)?;
        }
        Ok(())
    }

    /// The pin directory: `bpf_pin_dir`, or the default for this network namespace and
    /// these interfaces (`PinDir::default_for`).
    pub fn pin_dir(&self) -> anyhow::Result<PinDir> {
        match &self.bpf_pin_dir {
            Some(dir) => PinDir::new(dir),
            None => PinDir::default_for(&self.interfaces),
        }
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
            Some(mut value) => {
                let datapath = match value.as_table_mut().and_then(|t| t.remove("datapath")) {
                    Some(name) => Datapath::from_toml(&name)?,
                    None => Datapath::default(),
                };
                let mut daemon: DaemonConfig = value
                    .try_into()
                    .map_err(|e: toml::de::Error| anyhow::anyhow!("daemon: {}", e.message()))?;
                daemon.datapath = datapath;
                daemon.validate()?;
                daemon.state_dir = base.join(&daemon.state_dir);
                Some(daemon)
            }
            None => None,
        };
        // The core names the line of a bad value; give it the user's lines, not those of a
        // re-serialized (and key-sorted) table, whenever the file's layout allows.
        let lb_text = match lb_sections_in_place(text, &table) {
            Some(lb_text) => lb_text,
            None => toml::to_string(&table)?,
        };
        let lb = LbConfig::from_toml(&lb_text).map_err(anyhow::Error::msg)?;
        lb.validate().map_err(anyhow::Error::msg)?;
        Ok(FileConfig {
            lb,
            secret_file,
            daemon,
        })
    }
}

/// What Linux accepts as an interface name (`dev_valid_name`): shorter than IFNAMSIZ, not
/// `.` or `..`, without `/`, `:` or white space. Checked with the config, so that a typo
/// is reported before the daemon binds its API or touches any interface.
fn is_valid_interface_name(name: &str) -> bool {
    (1..=15).contains(&name.len())
        && name != "."
        && name != ".."
        && !name
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace())
}

/// The config text with the `secret_file` line and the `[daemon]` table blanked out, lines
/// kept, so that errors in the LB sections name the user's line numbers. `None` when the
/// layout is not the plain one (a dotted `daemon.x = ...` key, an inline table, a
/// multi-line `secret_file`...): the blanked text must parse to exactly `lb_table`.
fn lb_sections_in_place(text: &str, lb_table: &toml::Table) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    let mut in_daemon = false;
    let mut before_any_table = true;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_start();
        if trimmed.starts_with('[') {
            let name = trimmed.trim_start_matches('[').split(']').next()?.trim();
            in_daemon = name == "daemon";
            before_any_table = false;
        }
        let key = trimmed.split('=').next().unwrap_or_default().trim();
        let secret_line = before_any_table && key.trim_matches('"') == "secret_file";
        if in_daemon || secret_line {
            out.push_str(if line.ends_with('\n') { "\n" } else { "" });
        } else {
            out.push_str(line);
        }
    }
    let blanked: toml::Table = out.parse().ok()?;
    (blanked == *lb_table).then_some(out)
}

/// A secret file: the 128-bit key as 32 hex digits on its first line, and the cookie
/// layout it was made for (`cookie_epoch_bits = N`) on the second. Instances that share
/// the key must share the layout; recording it with the key makes an instance configured
/// otherwise refuse to start. Files made before layouts have the key alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyFile {
    pub secret: Secret,
    pub cookie_epoch_bits: Option<u8>,
}

impl KeyFile {
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
        let secret = lines
            .next()
            .and_then(Secret::from_hex)
            .ok_or("expected 32 hex digits (128 bits) on the first line")?;
        let cookie_epoch_bits = match lines.next() {
            None => None,
            Some(line) => {
                let value = line
                    .strip_prefix("cookie_epoch_bits")
                    .and_then(|rest| rest.trim_start().strip_prefix('='))
                    .and_then(|v| v.trim().parse::<u8>().ok())
                    .ok_or_else(|| {
                        format!("second line `{line}`: expected `cookie_epoch_bits = N`")
                    })?;
                Some(value)
            }
        };
        if let Some(extra) = lines.next() {
            return Err(format!("unexpected third line `{extra}`"));
        }
        Ok(KeyFile {
            secret,
            cookie_epoch_bits,
        })
    }

    /// A new random key (128 bits from /dev/urandom) for `cookie_epoch_bits`.
    pub fn generate(cookie_epoch_bits: u8) -> anyhow::Result<Self> {
        let mut key = [0u8; 16];
        crate::entropy::fill(&mut key).context("cannot read /dev/urandom for the secret")?;
        Ok(KeyFile {
            secret: Secret(key),
            cookie_epoch_bits: Some(cookie_epoch_bits),
        })
    }

    /// Writes the file at `path`, which must not exist yet, readable only by its owner:
    /// whoever knows the key can forge cookies and steer connections to any server.
    pub fn write_new(&self, path: &Path) -> anyhow::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .and_then(|mut file| file.write_all(self.text().as_bytes()))
            .with_context(|| format!("cannot create secret file {}", path.display()))
    }

    pub fn text(&self) -> String {
        let mut text = format!("{}\n", self.secret.to_hex());
        if let Some(bits) = self.cookie_epoch_bits {
            text.push_str(&format!("cookie_epoch_bits = {bits}\n"));
        }
        text
    }

    /// Refuses a config whose layout differs from the one this key was made for.
    pub fn check_layout(&self, path: &Path, configured: u8) -> anyhow::Result<()> {
        match self.cookie_epoch_bits {
            Some(made_for) if made_for != configured => anyhow::bail!(
                "cookie_epoch_bits = {configured}, but the secret file {} was made for cookie_epoch_bits = {made_for}: \
                 LB instances sharing a key must share the cookie layout, or each reads the other's cookies as other servers. \
                 Set cookie_epoch_bits = {made_for}; or, to change the layout (every open connection breaks), make a new key \
                 for every instance",
                path.display()
            ),
            _ => Ok(()),
        }
    }
}

/// Reads a secret file ([`KeyFile`]).
pub fn read_key_file(path: &Path) -> anyhow::Result<KeyFile> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read secret file {}", path.display()))?;
    KeyFile::parse(&text)
        .map_err(|problem| anyhow::anyhow!("secret file {}: {problem}", path.display()))
}

/// The key of a secret file ([`KeyFile`]).
pub fn read_secret(path: &Path) -> anyhow::Result<Secret> {
    Ok(read_key_file(path)?.secret)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "/etc/cheetah";

    #[test]
    fn key_files_carry_the_layout_they_were_made_for() {
        let key = "000102030405060708090a0b0c0d0e0f";
        let old = KeyFile::parse(&format!("{key}\n")).unwrap();
        assert_eq!(old.cookie_epoch_bits, None);
        assert!(old.check_layout(Path::new("k"), 3).is_ok());
        let new = KeyFile::parse(&format!("{key}\ncookie_epoch_bits = 4\n")).unwrap();
        assert_eq!(new.cookie_epoch_bits, Some(4));
        assert_eq!(KeyFile::parse(&new.text()).unwrap(), new);
        assert!(new.check_layout(Path::new("k"), 4).is_ok());
        let refused = new
            .check_layout(Path::new("/etc/cheetah/k"), 5)
            .unwrap_err()
            .to_string();
        assert!(
            refused.starts_with("cookie_epoch_bits = 5, but the secret file /etc/cheetah/k was made for cookie_epoch_bits = 4"),
            "{refused}"
        );
        for (text, problem) in [
            ("zz", "expected 32 hex digits"),
            (
                &format!("{key}\nepoch = 4"),
                "expected `cookie_epoch_bits = N`",
            ),
            (
                &format!("{key}\ncookie_epoch_bits = four"),
                "expected `cookie_epoch_bits = N`",
            ),
            (
                &format!("{key}\ncookie_epoch_bits = 4\nmore"),
                "unexpected third line",
            ),
        ] {
            let error = KeyFile::parse(text).unwrap_err();
            assert!(error.contains(problem), "{text:?}: {error}");
        }
    }

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
        assert!(
            daemon_error("interfaces = [\"a\", \"b\"]\nserver_interfaces = [\"b\", \"c\"]")
                .starts_with("daemon.server_interfaces[1]: c is not one of daemon.interfaces")
        );
        assert!(daemon_error("interfaces = [\"a\"]\nframes_per_worker = 5")
            .contains("daemon.frames_per_worker"));
        assert!(daemon_error("interfaces = [\"a\"]\nbpf_pin_dir = \"pins\"")
            .starts_with("daemon.bpf_pin_dir: `pins` must be an absolute path"),);
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
    fn datapath_is_xdp_unless_the_config_says_afxdp() {
        let parse = |extra: &str| {
            let text = format!("[daemon]\ninterfaces = [\"a\"]\n{extra}\n");
            FileConfig::parse(&text, Path::new(BASE))
                .unwrap()
                .daemon
                .unwrap()
                .datapath
        };
        assert_eq!(parse(""), Datapath::Xdp);
        assert!(parse("").fast_path());
        assert_eq!(parse("datapath = \"xdp\""), Datapath::Xdp);
        assert_eq!(parse("datapath = \"afxdp\""), Datapath::AfXdp);
        assert!(!Datapath::AfXdp.fast_path());
        let bad = daemon_error("interfaces = [\"a\"]\ndatapath = \"dpdk\"");
        assert!(
            bad.starts_with("daemon.datapath: `dpdk` is not a data path"),
            "{bad}"
        );
        let not_a_string = daemon_error("interfaces = [\"a\"]\ndatapath = 1");
        assert!(
            not_a_string.starts_with("daemon.datapath: must be a string"),
            "{not_a_string}"
        );
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

    const CONFIG: &str = r#"# a comment
secret_file = "cheetah.key"
mode = "cheetah"

[daemon]
interfaces = ["eth1"]
api_listen = "127.0.0.1:9180"

[[servers]]
id = 1
dip = "10.1.0.1"
mac = "02:00:00:00:01:01"

[[servers]]
id = 2
dip = "10.1.0.2"
mac = "02:00:00:00:01:02"

[[vips]]
address = "10.0.0.100"
port = 80
servers = [1, 2]
"#;

    fn error_of(text: &str) -> String {
        let error = FileConfig::parse(text, Path::new("/etc/cheetah"))
            .err()
            .unwrap();
        format!("{error:#}")
    }

    #[test]
    fn a_good_config_splits_into_its_parts() {
        let file = FileConfig::parse(CONFIG, Path::new("/etc/cheetah")).unwrap();
        assert_eq!(
            file.secret_file,
            Some(PathBuf::from("/etc/cheetah/cheetah.key"))
        );
        assert_eq!(file.daemon.unwrap().interfaces, ["eth1"]);
        assert_eq!(file.lb.servers.len(), 2);
    }

    /// Regression: errors named lines of the re-serialized, key-sorted LB table, so an
    /// unknown field on line 4 was reported on line 1.
    #[test]
    fn errors_in_the_lb_sections_name_the_users_line() {
        let unknown = CONFIG.replace(
            "mode = \"cheetah\"\n",
            "mode = \"cheetah\"\ncolour = \"blue\"\n",
        );
        assert!(
            error_of(&unknown).starts_with("line 4: unknown field `colour`"),
            "{}",
            error_of(&unknown)
        );
        let bad_dip = CONFIG.replace("10.1.0.2", "10.1.0.300");
        assert!(
            error_of(&bad_dip).starts_with("line 16: "),
            "{}",
            error_of(&bad_dip)
        );
    }

    #[test]
    fn unusual_layouts_still_parse() {
        let inline = CONFIG
            .replace(
                "[daemon]\ninterfaces = [\"eth1\"]\napi_listen = \"127.0.0.1:9180\"\n",
                "",
            )
            .replace(
                "mode = \"cheetah\"\n",
                "mode = \"cheetah\"\ndaemon = { interfaces = [\"eth2\"] }\n",
            );
        let file = FileConfig::parse(&inline, Path::new("/")).unwrap();
        assert_eq!(file.daemon.unwrap().interfaces, ["eth2"]);
        let dotted = inline.replace(
            "daemon = { interfaces = [\"eth2\"] }",
            "daemon.interfaces = [\"eth3\"]",
        );
        let file = FileConfig::parse(&dotted, Path::new("/")).unwrap();
        assert_eq!(file.daemon.unwrap().interfaces, ["eth3"]);
    }

    #[test]
    fn interface_names_linux_would_refuse_are_config_errors() {
        for bad in ["", "this-name-is-too-long", "eth0:1", "a b", "a/b", ".."] {
            let text = CONFIG.replace("[\"eth1\"]", &format!("[\"eth1\", \"{bad}\"]"));
            let error = error_of(&text);
            assert!(
                error.starts_with("daemon.interfaces[1]: "),
                "{bad:?}: {error}"
            );
        }
        assert!(is_valid_interface_name("veth-lb-c0.100"));
    }
}
