//! A small control plane, and servers to add to it, for the control plane's tests.

use super::{ControlPlane, ServerSpec};
use crate::config::{ConfiguredState, LbConfig};
use crate::hash::Secret;

pub(super) const CONFIG: &str = r#"
    quarantine_secs = 60
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

pub(super) fn plane() -> ControlPlane {
    ControlPlane::new(&LbConfig::from_toml(CONFIG).unwrap(), &Secret([7; 16])).unwrap()
}

pub(super) fn spec(id: Option<u16>, last: u8) -> ServerSpec {
    ServerSpec {
        id,
        dip: format!("10.1.0.{last}").parse().unwrap(),
        mac: Some(format!("02:00:00:00:01:{last:02x}")),
        vips: vec![("10.0.0.100:80".into(), 1)],
        state: ConfiguredState::Active,
    }
}

pub(super) fn pool(plane: &ControlPlane) -> Vec<u16> {
    plane.shared().snapshot.load().vips[0]
        .pool
        .servers
        .iter()
        .map(|s| s.0)
        .collect()
}
