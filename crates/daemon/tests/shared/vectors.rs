//! The test vectors of `testdata/vectors` (docs/test-vectors.md), the subset of
//! crates/core/tests/vectors.rs's format the XDP tests read, and the hex both print
//! (included by path, `#[path]`).

// The differential runner reads the frames only, the parity test every field.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use cheetah_core::config::LbConfig;
use cheetah_core::hash::Secret;
use cheetah_core::types::ServerId;
use cheetah_core::verdict::Verdict;
use serde::Deserialize;

#[derive(Deserialize)]
pub struct VectorFile {
    #[serde(default)]
    pub removed_servers: Vec<u16>,
    pub vector: Vec<Vector>,
}

#[derive(Deserialize)]
pub struct Vector {
    pub name: String,
    pub now_ns: u64,
    #[serde(default)]
    pub msb_state: Vec<MsbEntry>,
    #[serde(default)]
    pub prelude: Vec<PreludePacket>,
    pub packet_in: String,
    pub verdict: String,
    pub packet_out: String,
}

#[derive(Deserialize)]
pub struct MsbEntry {
    pub server: u16,
    pub msb: u16,
}

#[derive(Deserialize)]
pub struct PreludePacket {
    pub now_ns: u64,
    pub packet_in: String,
    pub verdict: String,
}

impl Vector {
    /// The clocks the vector starts from, as `MsbTable::import` takes them.
    pub fn msb_import(&self) -> Vec<(ServerId, u32)> {
        self.msb_state
            .iter()
            .map(|e| (ServerId(e.server), u32::from(e.msb) << 16))
            .collect()
    }
}

/// One directory of `testdata/vectors`: its config, secret and vectors.
pub struct Suite {
    pub name: String,
    pub config: LbConfig,
    pub secret: Secret,
    pub file: VectorFile,
}

pub fn load_suite(dir: &Path) -> Suite {
    let name = dir.file_name().unwrap().to_string_lossy().into_owned();
    let config = LbConfig::from_toml(&read(&dir.join("config.toml")))
        .unwrap_or_else(|e| panic!("{name}/config.toml: {e}"));
    let secret = Secret::from_hex(&read(&dir.join("secret.hex")))
        .unwrap_or_else(|| panic!("{name}/secret.hex: not 32 hex digits"));
    let file: VectorFile = toml::from_str(&read(&dir.join("vectors.toml")))
        .unwrap_or_else(|e| panic!("{name}/vectors.toml: {e}"));
    Suite {
        name,
        config,
        secret,
        file,
    }
}

/// Every suite's directory, sorted by name.
pub fn suite_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(vectors_dir())
        .expect("testdata/vectors")
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("vectors.toml").exists())
        .collect();
    dirs.sort();
    assert!(!dirs.is_empty(), "no suite under testdata/vectors");
    dirs
}

/// The vector files' spelling of a verdict.
pub fn verdict_name(verdict: Verdict) -> String {
    match verdict {
        Verdict::ToServer(server) => format!("to_server:{}", server.0),
        Verdict::ToClient => "to_client".into(),
        Verdict::ToAllServers { vip } => format!("to_all_servers:{vip}"),
        Verdict::Pass => "pass".into(),
        Verdict::Drop(reason) => format!("drop:{}", reason.name()),
    }
}

pub fn repository_path(relative: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(relative)
}

fn vectors_dir() -> PathBuf {
    repository_path("testdata/vectors")
}

pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
