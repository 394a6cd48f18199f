use std::time::Duration;

use cheetah_core::config::ConfiguredState;
use cheetah_core::policy::{LoadMetric, PolicyKind};
use cheetah_core::tables::{ControlPlane, ServerSpec, SlotState};
use cheetah_core::types::NANOS_PER_SEC;
use cheetah_core::ServerId;
use cheetah_daemon::clock::unix_ms;
use cheetah_daemon::persist::{self, Persister, StateFile, TablesFrom};
use cheetah_daemon::saver;

use crate::common::{self, SECRET, VIP};

/// A daemon after runtime changes, saved: server 5 added (weight 4), 2 removed
/// (quarantined), policy pow2 on packets; every server's MSB known.
fn saved_state(dir: &std::path::Path) -> StateFile {
    let state = common::state_with(&common::config(), Some(dir));
    {
        let mut control = state.control();
        control
            .add_server(
                ServerSpec {
                    id: Some(5),
                    dip: "10.1.0.5".parse().unwrap(),
                    mac: Some("02:00:00:01:00:05".into()),
                    vips: vec![(VIP.into(), 4)],
                    state: ConfiguredState::Active,
                },
                state.now(),
            )
            .unwrap();
        control.remove_server(2, state.now()).unwrap();
        control
            .set_policy(VIP, PolicyKind::PowerOfTwo, Some(LoadMetric::Packets))
            .unwrap();
    }
    for (id, msb) in [(1u16, 0x1234u16), (2, 0x2222), (5, 0x5555)] {
        state.shared.msb.learn(ServerId(id), (msb as u32) << 16, 0);
    }
    state.persist();
    let file = Persister::new(dir, &common::config())
        .unwrap()
        .load()
        .unwrap()
        .expect("saved");
    assert_eq!(file.msb.servers.len(), 3);
    file
}

fn pool(plane: &ControlPlane) -> Vec<(u16, u32)> {
    plane.vips()[0]
        .members
        .iter()
        .map(|(id, w)| (id.0, *w))
        .collect()
}

fn state_of(plane: &ControlPlane, id: u16) -> Option<(SlotState, Option<u64>)> {
    plane
        .servers(0)
        .into_iter()
        .find(|s| s.id.0 == id)
        .map(|s| (s.state, s.quarantine_left_secs))
}

#[test]
fn same_config_the_saved_tables_win() {
    let dir = tempfile::tempdir().unwrap();
    let file = saved_state(dir.path());
    let (plane, report) =
        persist::restore(&common::config(), &SECRET, Some(&file), 0, unix_ms()).unwrap();
    assert_eq!(report.tables, TablesFrom::SavedState);
    assert_eq!(
        pool(&plane),
        vec![(1, 1), (5, 4)],
        "runtime changes survive"
    );
    assert_eq!(plane.vips()[0].policy, PolicyKind::PowerOfTwo);
    assert_eq!(plane.vips()[0].metric, LoadMetric::Packets);
    assert_eq!(state_of(&plane, 2), Some((SlotState::Removed, Some(600))));
    assert_eq!(report.msb, Ok(2), "the removed server's MSB is not needed");
    assert_eq!(plane.shared().msb.get(ServerId(5)), Some(0x5555));
    assert_eq!(plane.shared().msb.get(ServerId(1)), Some(0x1234));
    // Written atomically: no temporary file is left behind.
    let mut names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, vec!["fallback.bin", "state.json"]);
}

#[test]
fn changed_config_wins_but_quarantine_and_msb_survive() {
    let dir = tempfile::tempdir().unwrap();
    let file = saved_state(dir.path());
    let mut changed = common::config();
    changed.vips[0].policy = PolicyKind::Maglev;
    // Server 1 moved to another address: its old MSB belongs to another host.
    changed.servers[0].dip = "10.1.0.101".parse().unwrap();
    // Server 2 is still removed in the file, but the changed config has only 1: id 2 must
    // stay quarantined.
    changed.servers.truncate(1);
    changed.vips[0].servers = vec![1];
    let (mut plane, report) =
        persist::restore(&changed, &SECRET, Some(&file), 0, unix_ms()).unwrap();
    assert_eq!(report.tables, TablesFrom::ConfigChanged);
    assert_eq!(pool(&plane), vec![(1, 1)], "the config's pool");
    assert_eq!(plane.vips()[0].policy, PolicyKind::Maglev);
    assert_eq!(
        state_of(&plane, 5),
        None,
        "runtime-added server gone with the tables"
    );
    assert_eq!(state_of(&plane, 2), Some((SlotState::Removed, Some(600))));
    assert_eq!(report.quarantine_kept, vec![(2, 600)]);
    assert!(plane
        .add_server(
            ServerSpec {
                id: Some(2),
                dip: "10.1.0.2".parse().unwrap(),
                mac: Some("02:00:00:01:00:02".into()),
                vips: vec![],
                state: ConfiguredState::Active,
            },
            NANOS_PER_SEC,
        )
        .is_err());
    assert_eq!(plane.shared().msb.get(ServerId(1)), None, "address changed");
    assert_eq!(report.msb, Ok(0));

    // Same addresses, changed policy only: the MSB of server 1 is restored.
    let mut changed = common::config();
    changed.vips[0].policy = PolicyKind::Maglev;
    let (plane, report) = persist::restore(&changed, &SECRET, Some(&file), 0, unix_ms()).unwrap();
    assert_eq!(report.tables, TablesFrom::ConfigChanged);
    assert_eq!(
        report.quarantine_overridden,
        vec![2],
        "the config defines 2 again"
    );
    assert_eq!(state_of(&plane, 2), Some((SlotState::Active, None)));
    assert_eq!(
        report.msb,
        Ok(1),
        "only 1: 2 was removed when saved, 5 is gone"
    );
    assert_eq!(plane.shared().msb.get(ServerId(1)), Some(0x1234));
}

#[test]
fn downtime_ages_quarantines_and_carries_clocks_forward_until_they_are_too_old() {
    let dir = tempfile::tempdir().unwrap();
    let mut file = saved_state(dir.path());
    file.saved_at_unix_ms -= 100_000;
    file.msb.saved_at_unix_ms -= 100_000;
    let (plane, report) =
        persist::restore(&common::config(), &SECRET, Some(&file), 0, unix_ms()).unwrap();
    assert_eq!(report.tables, TablesFrom::SavedState);
    assert_eq!(report.msb, Ok(2));
    // 100 s on, server 1's clock has crossed one MSB boundary.
    assert_eq!(plane.shared().msb.get(ServerId(1)), Some(0x1235));
    let left = state_of(&plane, 2).unwrap().1.unwrap();
    assert!(
        (499..=500).contains(&left),
        "100 s of downtime counted: {left}"
    );

    // Down for longer than the quarantine and the clocks' shelf life.
    file.saved_at_unix_ms -= 501_000;
    file.msb.saved_at_unix_ms -= 501_000;
    let (plane, report) =
        persist::restore(&common::config(), &SECRET, Some(&file), 0, unix_ms()).unwrap();
    assert_eq!(state_of(&plane, 2), None, "the id is free");
    let refused = report.msb.unwrap_err();
    assert!(refused.contains("more than 600000 ms"), "{refused}");
    assert_eq!(plane.shared().msb.get(ServerId(1)), None);
}

#[test]
fn a_state_file_of_another_cookie_layout_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    saved_state(dir.path());
    let mut other = common::config();
    other.cookie_epoch_bits = 5;
    let persister = Persister::new(dir.path(), &other).unwrap();
    let clock = cheetah_daemon::Clock::start();
    let refused = persister
        .restore(&other, &SECRET, &clock)
        .err()
        .expect("another layout is refused")
        .to_string();
    assert!(
        refused.starts_with("cookie_epoch_bits = 5, but ")
            && refused.contains("running cookie_epoch_bits = 4"),
        "{refused}"
    );
    // The file is left as it was: the operator decides.
    assert_eq!(
        persister.load().unwrap().unwrap().cookie_epoch_bits,
        Some(4)
    );
}

/// The upgrade from the one-version-bit layout: the tables (and quarantines) of a format 1
/// file survive; its MSBs, which no layout can use, do not.
#[test]
fn a_file_from_before_layouts_keeps_its_tables_but_not_its_msbs() {
    let dir = tempfile::tempdir().unwrap();
    let file = saved_state(dir.path());
    let mut json: serde_json::Value = serde_json::to_value(&file).unwrap();
    json["format"] = 1.into();
    json.as_object_mut().unwrap().remove("cookie_epoch_bits");
    json["msb"]["servers"] = serde_json::json!([[1, 0x1234], [5, 0x5555]]);
    std::fs::write(dir.path().join("state.json"), json.to_string()).unwrap();
    let persister = Persister::new(dir.path(), &common::config()).unwrap();
    let old = persister.load().unwrap().unwrap();
    assert_eq!(old.cookie_epoch_bits, None);
    assert!(old.msb.servers.is_empty());
    let clock = cheetah_daemon::Clock::start();
    let plane = persister
        .restore(&common::config(), &SECRET, &clock)
        .unwrap();
    assert_eq!(pool(&plane), vec![(1, 1), (5, 4)]);
    assert_eq!(plane.shared().msb.get(ServerId(1)), None);
}

#[test]
fn saved_tables_that_no_longer_validate_fall_back_to_the_config() {
    let dir = tempfile::tempdir().unwrap();
    let mut file = saved_state(dir.path());
    file.tables.vips[0].members[0].weight = 0;
    let (plane, report) =
        persist::restore(&common::config(), &SECRET, Some(&file), 0, unix_ms()).unwrap();
    assert_eq!(
        report.tables,
        TablesFrom::SavedStateInvalid(
            "vips[0].members[0].weight: weight must be at least 1".into()
        )
    );
    assert_eq!(pool(&plane), vec![(1, 1), (2, 1)]);
}

#[test]
fn the_saver_thread_saves_periodically_and_on_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let state = common::state_with(&common::config(), Some(dir.path()));
    let persister = Persister::new(dir.path(), &common::config()).unwrap();
    let saver = saver::spawn(state.clone(), Duration::from_millis(20)).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while persister.load().unwrap().is_none() {
        assert!(std::time::Instant::now() < deadline, "never saved");
        std::thread::sleep(Duration::from_millis(10));
    }
    state.shared.msb.learn(ServerId(1), 0x4321_0000, 0);
    saver.shutdown();
    let file = persister.load().unwrap().unwrap();
    let saved: Vec<(u16, u16)> = file
        .msb
        .servers
        .iter()
        .map(|&(id, tsval)| (id, (tsval >> 16) as u16))
        .collect();
    assert_eq!(saved, vec![(1, 0x4321)], "saved on shutdown");
    assert_eq!(file.cookie_epoch_bits, Some(4));
    assert!(unix_ms() - file.saved_at_unix_ms < 10_000);
}

#[test]
fn restore_from_disk_ignores_an_unreadable_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("state.json"), "{ not json").unwrap();
    let persister = Persister::new(dir.path(), &common::config()).unwrap();
    assert!(persister.load().is_err());
    let clock = cheetah_daemon::Clock::start();
    let plane = persister
        .restore(&common::config(), &SECRET, &clock)
        .unwrap();
    assert_eq!(pool(&plane), vec![(1, 1), (2, 1)]);
    // And a good file is used.
    saved_state(dir.path());
    let plane = persister
        .restore(&common::config(), &SECRET, &clock)
        .unwrap();
    assert_eq!(pool(&plane), vec![(1, 1), (5, 4)]);
}

/// Connections without a cookie are routed by the fallback table, which a restart would
/// otherwise forget: the next start takes its flows back (`fallback.bin`), with the key it
/// was written under.
#[test]
fn the_fallback_table_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let state = common::state_with(&common::config(), Some(dir.path()));
    let flows: Vec<u64> = (1..=50u64)
        .map(|n| n.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .collect();
    for (i, hash) in flows.iter().enumerate() {
        state
            .shared
            .fallback
            .insert(*hash, ServerId(1 + (i % 2) as u16), state.now());
    }
    state.persist();
    drop(state);

    let clock = cheetah_daemon::Clock::start();
    let plane = Persister::new(dir.path(), &common::config())
        .unwrap()
        .restore(&common::config(), &SECRET, &clock)
        .unwrap();
    for (i, hash) in flows.iter().enumerate() {
        assert_eq!(
            plane.shared().fallback.peek(*hash),
            Some(ServerId(1 + (i % 2) as u16))
        );
    }
    // Under another key the same file describes no connection of this LB.
    let other = Persister::new(dir.path(), &common::config())
        .unwrap()
        .restore(
            &common::config(),
            &cheetah_core::hash::Secret([7; 16]),
            &clock,
        )
        .unwrap();
    assert!(other.shared().fallback.is_empty());
}
