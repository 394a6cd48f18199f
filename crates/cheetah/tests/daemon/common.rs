use std::path::Path;
use std::sync::Arc;

use cheetah_core::config::{Forwarding, LbConfig, Mode};
use cheetah_core::hash::Secret;
use cheetah_core::policy::PolicyKind;
use cheetah_core::tables::ControlPlane;
use cheetah_core::testkit;
use cheetah_daemon::api::{self, ApiHandle};
use cheetah_daemon::persist::Persister;
use cheetah_daemon::{Clock, DaemonState};
use serde_json::Value;

pub const SECRET: Secret = Secret([9; 16]);
pub const VIP: &str = "10.0.0.100:80";

/// One round-robin VIP (10.0.0.100:80) over servers 1 and 2 (testkit's DIPs and MACs).
pub fn config() -> LbConfig {
    testkit::config(Mode::Cheetah, Forwarding::L2, PolicyKind::RoundRobin, 2)
}

pub fn state_with(config: &LbConfig, dir: Option<&Path>) -> Arc<DaemonState> {
    let clock = Clock::start();
    let plane = ControlPlane::new(config, &SECRET).unwrap();
    let persister = dir.map(|d| Persister::new(d, config).unwrap());
    Arc::new(DaemonState::new(plane, clock, persister))
}

pub struct Running {
    pub state: Arc<DaemonState>,
    pub api: ApiHandle,
    agent: ureq::Agent,
}

pub fn start() -> Running {
    start_with(state_with(&config(), None))
}

pub fn start_with(state: Arc<DaemonState>) -> Running {
    let api = api::spawn(Arc::clone(&state), "127.0.0.1:0".parse().unwrap()).unwrap();
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    Running { state, api, agent }
}

impl Running {
    pub fn addr(&self) -> String {
        self.api.local_addr().to_string()
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.api.local_addr())
    }

    fn finish(response: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> (u16, Value) {
        let mut response = response.unwrap();
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().unwrap();
        let value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {text:?} (status {status})"));
        (status, value)
    }

    pub fn get(&self, path: &str) -> (u16, Value) {
        Self::finish(self.agent.get(&self.url(path)).call())
    }

    pub fn text(&self, path: &str) -> (u16, String, String) {
        let mut response = self.agent.get(&self.url(path)).call().unwrap();
        let kind = response
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        let text = response.body_mut().read_to_string().unwrap();
        (response.status().as_u16(), kind, text)
    }

    /// `method` with a raw JSON body (sent as `application/json`), or none.
    pub fn send(&self, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
        let url = self.url(path);
        let response = match (method, body) {
            ("POST", Some(b)) => self
                .agent
                .post(&url)
                .header("content-type", "application/json")
                .send(b),
            ("POST", None) => self.agent.post(&url).send_empty(),
            ("PUT", Some(b)) => self
                .agent
                .put(&url)
                .header("content-type", "application/json")
                .send(b),
            ("PUT", None) => self.agent.put(&url).send_empty(),
            ("DELETE", _) => self.agent.delete(&url).call(),
            _ => panic!("{method}"),
        };
        Self::finish(response)
    }

    pub fn post(&self, path: &str, body: &str) -> (u16, Value) {
        self.send("POST", path, Some(body))
    }

    pub fn put(&self, path: &str, body: &str) -> (u16, Value) {
        self.send("PUT", path, Some(body))
    }

    /// GET /servers and /vips, to check that a refused request changed nothing.
    pub fn tables(&self) -> (Value, Value, u64) {
        (
            self.get("/servers").1,
            self.get("/vips").1,
            self.state.shared.snapshot.generation(),
        )
    }
}
