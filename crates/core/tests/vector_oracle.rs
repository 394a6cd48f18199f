//! Runs `scripts/check_vectors.py`, the oracle for `testdata/vectors/` that is not the core
//! (docs/test-vectors.md, "The oracle"): `tests/vectors.rs` shows the core still produces
//! the committed bytes; this shows the bytes are what the cookie layout says they must be.
//!
//! The oracle is Python (standard library only) so that it shares no code with the core;
//! python3 is on every machine that builds this project (scripts/setup.sh installs it).
//! The mutation tests feed it copies of the vectors with one deliberate error each, so an
//! oracle that stopped checking would fail here instead of passing everything.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn oracle(vectors: &Path) -> Output {
    Command::new("python3")
        .arg(repo().join("scripts/check_vectors.py"))
        .arg(vectors)
        .output()
        .expect("python3 runs (scripts/setup.sh installs it)")
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn the_vectors_agree_with_an_oracle_that_is_not_the_core() {
    let output = oracle(&repo().join("testdata/vectors"));
    let report = text(&output);
    println!("{report}");
    assert!(
        output.status.success(),
        "scripts/check_vectors.py:\n{report}"
    );
}

/// A copy of the vectors with `change` applied to vector `name` of `suite`.
fn mutated(tag: &str, suite: &str, name: &str, change: impl Fn(&mut toml::Table)) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cheetah-oracle-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for entry in std::fs::read_dir(repo().join("testdata/vectors")).unwrap() {
        let from = entry.unwrap().path();
        let to = dir.join(from.file_name().unwrap());
        std::fs::create_dir_all(&to).unwrap();
        for file in ["config.toml", "secret.hex", "vectors.toml"] {
            std::fs::copy(from.join(file), to.join(file)).unwrap();
        }
    }
    let path = dir.join(suite).join("vectors.toml");
    let mut file: toml::Table = std::fs::read_to_string(&path).unwrap().parse().unwrap();
    let vector = file["vector"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .map(|v| v.as_table_mut().unwrap())
        .find(|v| v["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("{suite}/{name} is a vector"));
    change(vector);
    std::fs::write(&path, toml::to_string(&file).unwrap()).unwrap();
    dir
}

/// Rewrites the big-endian u16 at `at` in the vector's `packet_out`.
fn rewrite_u16(vector: &mut toml::Table, at: usize, f: impl Fn(u16) -> u16) {
    let mut frame = hex::decode(vector["packet_out"].as_str().unwrap()).unwrap();
    let old = u16::from_be_bytes([frame[at], frame[at + 1]]);
    frame[at..at + 2].copy_from_slice(&f(old).to_be_bytes());
    vector.insert("packet_out".into(), hex::encode(frame).into());
}

fn assert_caught(dir: &Path, vector: &str, what: &str) {
    let output = oracle(dir);
    let report = text(&output);
    let _ = std::fs::remove_dir_all(dir);
    assert!(
        !output.status.success() && report.contains(vector) && report.contains(what),
        "the oracle missed {what} in {vector}:\n{report}"
    );
}

/// Offsets in the vectors' client ACK and server segment (Ethernet, IPv4 without
/// options, TCP, NOP NOP TS): TSval at 58, TSecr at 62.
const TSVAL_AT: usize = 14 + 20 + 20 + 4;
const TSECR_AT: usize = TSVAL_AT + 4;

#[test]
fn the_oracle_catches_an_echo_restored_one_window_too_old() {
    // What a restore that took "newest <= M^" instead of "<= M^ + 1" would do to the echo
    // one period ahead: 16 periods (one window at k = 4) back.
    let dir = mutated("window", "l2-cheetah", "echo-next-period", |v| {
        rewrite_u16(v, TSECR_AT, |msb| msb.wrapping_sub(16))
    });
    assert_caught(&dir, "l2-cheetah/echo-next-period", "TSecr");
}

#[test]
fn the_oracle_catches_a_cookie_naming_another_server() {
    let dir = mutated("id", "l2-cheetah-k6", "server-data", |v| {
        rewrite_u16(v, TSVAL_AT, |cookie| cookie ^ 1)
    });
    assert_caught(&dir, "l2-cheetah-k6/server-data", "names server");
}

#[test]
fn the_oracle_catches_a_wrong_epoch() {
    // The top bit of the id half, taken for an epoch bit: a layout one bit off.
    let dir = mutated("epoch", "l2-cheetah-k2", "server-data-msb-ffff", |v| {
        rewrite_u16(v, TSVAL_AT, |cookie| cookie ^ 0x4000)
    });
    assert_caught(&dir, "l2-cheetah-k2/server-data-msb-ffff", "epoch");
}

#[test]
fn the_oracle_catches_an_uncounted_echo_beyond_the_idle_limit() {
    let dir = mutated("count", "l2-cheetah", "echo-9-periods-old", |v| {
        v.remove("echoes_beyond_idle_limit");
    });
    assert_caught(
        &dir,
        "l2-cheetah/echo-9-periods-old",
        "echoes_beyond_idle_limit",
    );
}
