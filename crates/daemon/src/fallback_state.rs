//! The fallback table across a restart: `fallback.bin` in the state directory.
//!
//! Connections without a cookie (clients without TCP timestamps, servers that decline
//! them) are routed by the shared fallback table (`cheetah_core::lb::fallback`), which
//! lives in the process. A restarted LB that forgot them would send their next packets
//! where Maglev points now; since their SYN, the pool may have changed (and a connection
//! the policy placed, whose server then declined timestamps, was never where Maglev
//! points). So the persister writes the table's flows here with the state file, every
//! second and on shutdown, and the next start takes them back before its workers run: a
//! `kill -9` loses at most the last second's new flows, which Maglev still places as it did
//! unless the pool changed within that second.
//!
//! The file is binary, little-endian:
//!
//! ```text
//! magic "cheetah-fallback" | version u32 = 1 | saved_at_unix_ms u64 |
//! fingerprint length u16 | fingerprint (the key's, as `status` prints it) |
//! sets u64 | flows u64 | flows x (set u32, tag u32, server u16, idle units u16)
//! ```
//!
//! It is replaced by a rename, not synced: a crash of the host may leave the previous file,
//! or none, or a short one, which the next start refuses (with a warning) like one written
//! under another key or for a bigger table.

use std::fs;
use std::path::Path;

use anyhow::bail;
use cheetah_core::lb::fallback::SavedFlow;
use cheetah_core::lb::LbShared;
use cheetah_core::types::{Nanos, ServerId};

use crate::replace_file::{replace_file, Sync};

pub const FALLBACK_FILE: &str = "fallback.bin";
const MAGIC: &[u8; 16] = b"cheetah-fallback";
const VERSION: u32 = 1;
const FLOW_BYTES: usize = 12;

/// What a start found in the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Restored {
    /// No file: nothing to take over.
    NoFile,
    /// This many flows were taken over.
    Flows(usize),
    /// The file was not used (why).
    Refused(String),
    /// The table already holds this many flows, newer than any file: an earlier run's
    /// words, reused from a pinned map. The file is not read.
    Kept(usize),
}

/// The table's flows as bytes of the file.
pub fn encode(shared: &LbShared, now: Nanos, now_unix_ms: u64) -> Vec<u8> {
    let flows = shared.fallback.export(now);
    let fingerprint = shared.secret_fingerprint().as_bytes();
    let mut out = Vec::with_capacity(64 + fingerprint.len() + flows.len() * FLOW_BYTES);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&now_unix_ms.to_le_bytes());
    out.extend_from_slice(&(fingerprint.len() as u16).to_le_bytes());
    out.extend_from_slice(fingerprint);
    out.extend_from_slice(&(shared.fallback.sets() as u64).to_le_bytes());
    out.extend_from_slice(&(flows.len() as u64).to_le_bytes());
    for flow in &flows {
        out.extend_from_slice(&flow.set.to_le_bytes());
        out.extend_from_slice(&flow.tag.to_le_bytes());
        out.extend_from_slice(&flow.server.0.to_le_bytes());
        out.extend_from_slice(&flow.idle_units.to_le_bytes());
    }
    out
}

/// A file's contents: when it was saved, the key fingerprint, the table's sets, the flows.
#[derive(Debug, PartialEq, Eq)]
pub struct Decoded {
    pub saved_at_unix_ms: u64,
    pub fingerprint: String,
    pub sets: usize,
    pub flows: Vec<SavedFlow>,
}

pub fn decode(bytes: &[u8]) -> anyhow::Result<Decoded> {
    let mut rest = bytes;
    let mut take = |n: usize| -> anyhow::Result<&[u8]> {
        if rest.len() < n {
            bail!("cut short");
        }
        let (head, tail) = rest.split_at(n);
        rest = tail;
        Ok(head)
    };
    if take(MAGIC.len())? != MAGIC {
        bail!("not a cheetah fallback file");
    }
    let version = u32::from_le_bytes(take(4)?.try_into()?);
    if version != VERSION {
        bail!("version {version} is not one this build reads ({VERSION})");
    }
    let saved_at_unix_ms = u64::from_le_bytes(take(8)?.try_into()?);
    let length = u16::from_le_bytes(take(2)?.try_into()?) as usize;
    let fingerprint = String::from_utf8_lossy(take(length)?).into_owned();
    let sets = u64::from_le_bytes(take(8)?.try_into()?) as usize;
    let count = u64::from_le_bytes(take(8)?.try_into()?) as usize;
    if rest.len() != count.saturating_mul(FLOW_BYTES) {
        bail!(
            "{count} flows announced, {} bytes of them: cut short or corrupt",
            rest.len()
        );
    }
    let flows = rest
        .chunks_exact(FLOW_BYTES)
        .map(|b| SavedFlow {
            set: u32::from_le_bytes(b[0..4].try_into().unwrap()),
            tag: u32::from_le_bytes(b[4..8].try_into().unwrap()),
            server: ServerId(u16::from_le_bytes(b[8..10].try_into().unwrap())),
            idle_units: u16::from_le_bytes(b[10..12].try_into().unwrap()),
        })
        .collect();
    Ok(Decoded {
        saved_at_unix_ms,
        fingerprint,
        sets,
        flows,
    })
}

/// Writes `bytes` ([`encode`]) to `dir/fallback.bin`, replacing the file by a rename, not
/// synced (see the module doc).
pub fn save(dir: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    replace_file(dir, FALLBACK_FILE, bytes, Sync::NotSynced)
}

/// Takes the flows of `dir/fallback.bin` into `shared`'s table (before any worker runs).
/// The time since the save counts as idle time.
pub fn restore(dir: &Path, shared: &LbShared, now: Nanos, now_unix_ms: u64) -> Restored {
    let held = shared.fallback.len();
    if held != 0 {
        return Restored::Kept(held);
    }
    let path = dir.join(FALLBACK_FILE);
    let bytes = match fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Restored::NoFile,
        Err(e) => return Restored::Refused(format!("cannot read {}: {e}", path.display())),
    };
    let decoded = match decode(&bytes) {
        Ok(decoded) => decoded,
        Err(e) => return Restored::Refused(format!("{}: {e:#}", path.display())),
    };
    if decoded.fingerprint != shared.secret_fingerprint() {
        return Restored::Refused(format!(
            "{} was written under another key or cookie layout (fingerprint {})",
            path.display(),
            decoded.fingerprint
        ));
    }
    if decoded.sets < shared.fallback.sets() {
        return Restored::Refused(format!(
            "{} holds a table of {} flows, smaller than this one's {}: its flows cannot be placed",
            path.display(),
            decoded.sets * cheetah_core::lb::fallback::WAYS,
            shared.fallback.capacity()
        ));
    }
    let down_ms = now_unix_ms.saturating_sub(decoded.saved_at_unix_ms);
    let idle_units = down_ms.saturating_mul(1_000_000) >> 30;
    Restored::Flows(
        shared
            .fallback
            .import(decoded.sets, &decoded.flows, idle_units, now),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use cheetah_core::cookie::CookieLayout;
    use cheetah_core::hash::Secret;
    use cheetah_core::lb::fallback::FallbackTable;
    use cheetah_core::lb::SharedTables;
    use cheetah_core::tables::Snapshot;
    use cheetah_core::types::NANOS_PER_SEC;

    fn shared(secret: u8, capacity: usize) -> LbShared {
        LbShared::new(
            &Secret([secret; 16]),
            CookieLayout::DEFAULT,
            Snapshot::empty(),
            capacity,
        )
    }

    /// A plane's shared state whose fallback table is over borrowed words, as the
    /// daemon's is over the XDP program's mmapped `fallback` map.
    fn shared_over_words(secret: u8, capacity: usize) -> LbShared {
        #[repr(C, align(64))]
        struct Set([std::sync::atomic::AtomicU64; 8]);
        let sets: &'static [Set] = Box::leak(
            (0..capacity / 8)
                .map(|_| Set(Default::default()))
                .collect::<Box<[Set]>>(),
        );
        // SAFETY: a set is 8 words, and the sets live for the rest of the test process.
        let words = unsafe { std::slice::from_raw_parts(sets.as_ptr().cast(), capacity) };
        let layout = CookieLayout::DEFAULT;
        let tables = SharedTables {
            fallback: FallbackTable::with_words(words),
            ..SharedTables::new(layout, 8)
        };
        LbShared::with_tables(&Secret([secret; 16]), tables, Snapshot::empty())
    }

    /// 100 flows saved by an LB with key `1`, taken back by `new`, which must then hold them.
    fn saved_flows_come_back_into(dir: &std::path::Path, new: &LbShared) -> LbShared {
        let old = shared(1, 1024);
        for n in 0..100u64 {
            let hash = n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            old.fallback
                .insert(hash, ServerId((n % 7) as u16), n * NANOS_PER_SEC);
        }
        save(dir, &encode(&old, 200 * NANOS_PER_SEC, 1_000_000)).unwrap();
        assert_eq!(restore(dir, new, 0, 1_003_000), Restored::Flows(100));
        for n in 0..100u64 {
            let hash = n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            assert_eq!(new.fallback.peek(hash), Some(ServerId((n % 7) as u16)));
        }
        old
    }

    #[test]
    fn a_restart_takes_the_flows_back_into_words_shared_with_the_kernel() {
        let dir = tempfile::tempdir().unwrap();
        let new = shared_over_words(1, 1024);
        let old = saved_flows_come_back_into(dir.path(), &new);
        // And back out of them for the next restart.
        assert_eq!(
            encode(&new, 0, 1_004_000).len(),
            encode(&old, 0, 1_004_000).len()
        );
    }

    #[test]
    fn the_flows_survive_a_restart_and_nothing_else_is_taken() {
        let dir = tempfile::tempdir().unwrap();
        let new = shared(1, 1024);
        saved_flows_come_back_into(dir.path(), &new);
        // Another key: the file's flows are other connections.
        let other_key = shared(2, 1024);
        assert!(matches!(
            restore(dir.path(), &other_key, 0, 1_003_000),
            Restored::Refused(_)
        ));
        assert!(other_key.fallback.is_empty());
        // A bigger table cannot place them; a smaller one can.
        assert!(matches!(
            restore(dir.path(), &shared(1, 4096), 0, 1_003_000),
            Restored::Refused(_)
        ));
        assert!(matches!(
            restore(dir.path(), &shared(1, 512), 0, 1_003_000),
            Restored::Flows(_)
        ));
        // A table that holds flows already (a pinned map's, newer) takes none.
        assert_eq!(restore(dir.path(), &new, 0, 1_003_000), Restored::Kept(100));
        // No file; a file cut short.
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(
            restore(empty.path(), &shared(1, 1024), 0, 0),
            Restored::NoFile
        );
        let bytes = fs::read(dir.path().join(FALLBACK_FILE)).unwrap();
        fs::write(dir.path().join(FALLBACK_FILE), &bytes[..bytes.len() - 5]).unwrap();
        assert!(matches!(
            restore(dir.path(), &shared(1, 1024), 0, 0),
            Restored::Refused(_)
        ));
    }

    #[test]
    fn the_format_round_trips() {
        let table = shared(3, 64);
        table.fallback.insert(0x1234_5678_0000_0005, ServerId(9), 0);
        let decoded = decode(&encode(&table, 3 * NANOS_PER_SEC, 42)).unwrap();
        assert_eq!(decoded.saved_at_unix_ms, 42);
        assert_eq!(decoded.fingerprint, table.secret_fingerprint());
        assert_eq!(decoded.sets, 8);
        assert_eq!(
            decoded.flows,
            vec![SavedFlow {
                set: 5,
                tag: 0x1234_5678,
                server: ServerId(9),
                idle_units: 2,
            }]
        );
        assert!(decode(b"not a fallback file").is_err());
    }
}
