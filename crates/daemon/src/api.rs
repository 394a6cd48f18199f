//! The daemon's HTTP/JSON control API (routes and examples in `docs/api.md`).
//!
//! It runs on its own thread with a current-thread tokio runtime, so the data-path threads
//! are never disturbed, and binds before returning, so a bad or busy address is an error
//! at start-up. Every change goes through the [`ControlPlane`], which validates it as a
//! whole before publishing: a refused request changes nothing. After every successful
//! change the state file is saved before the response is sent.
//!
//! Status codes: 200 (201 for creations), 400 for an invalid request (malformed JSON,
//! unknown field, bad path parameter, a value the control plane refuses), 404 for an
//! unknown server, VIP or route, 409 for a conflict (a quarantined id, a MAC in use...).
//! Every error body is `{"error": "<field>: <problem>"}`.
//!
//! This file is the routes and handlers; the JSON they take and give is typed in
//! [`views`].

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::extract::path::ErrorKind;
use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{FromRequest, FromRequestParts, Path, Request, State};
use axum::http::request::Parts;
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use cheetah_core::config::ConfigError;
use cheetah_core::policy::ReportedLoad;
use cheetah_core::tables::control::ServerInfo;
use cheetah_core::tables::{ControlError, ControlPlane, ServerSpec, SlotState};
use cheetah_core::types::ServerId;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use tokio::sync::oneshot;

use super::metrics;
use super::service::ServiceThread;
use super::state::DaemonState;

pub mod views;

pub use views::{
    AddServer, AddedView, ErrorView, HealthView, InterfaceView, JoinPool, JoinVip, LoadReport,
    MemberView, ReadyView, ServerCounts, ServerView, ServersView, SetPolicy, SetWeights,
    StatusView, VipView, VipsView, WorkerView,
};

/// Where the API listens unless told otherwise: loopback only.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9180";

/// The running API. Dropping it (or [`ApiHandle::shutdown`]) stops the server and joins
/// its thread.
pub struct ApiHandle {
    addr: SocketAddr,
    service: ServiceThread,
}

impl ApiHandle {
    /// The bound address (the real port when asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn shutdown(self) {
        self.service.shutdown();
    }
}

/// Binds `listen` and serves the API on a new thread. Also ticks `state` once a second
/// (quarantine expiry, packet rates).
pub fn spawn(state: Arc<DaemonState>, listen: SocketAddr) -> anyhow::Result<ApiHandle> {
    let listener = std::net::TcpListener::bind(listen)
        .with_context(|| format!("cannot listen on {listen} for the control API"))?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .context("cannot start the control API's runtime")?;
    let listener = {
        let _in_runtime = runtime.enter();
        tokio::net::TcpListener::from_std(listener)?
    };
    let app = router(Arc::clone(&state));
    let (stop, stopped) = oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("cheetah-api".into())
        .spawn(move || {
            runtime.block_on(async move {
                let ticker = tokio::spawn(async move {
                    let mut every = tokio::time::interval(Duration::from_secs(1));
                    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    loop {
                        every.tick().await;
                        state.tick();
                    }
                });
                let served = axum::serve(listener, app)
                    .with_graceful_shutdown(async {
                        let _ = stopped.await;
                    })
                    .await;
                ticker.abort();
                if let Err(e) = served {
                    tracing::error!(error = %e, "control API stopped");
                }
            })
        })
        .context("cannot start the control API's thread")?;
    tracing::info!(%addr, "control API listening");
    Ok(ApiHandle {
        addr,
        service: ServiceThread::new(
            move || {
                let _ = stop.send(());
            },
            thread,
        ),
    })
}

/// Every route of the API.
pub fn router(state: Arc<DaemonState>) -> Router {
    Router::new()
        .route("/status", get(status))
        .route("/ready", get(ready))
        .route("/servers", get(list_servers).post(add_server))
        .route("/servers/{id}", delete(remove_server))
        .route("/servers/{id}/drain", post(drain_server))
        .route("/servers/{id}/activate", post(activate_server))
        .route("/servers/{id}/load", post(report_load))
        .route("/vips", get(list_vips))
        .route("/vips/{vip}/policy", put(set_policy))
        .route("/vips/{vip}/weights", put(set_weights))
        .route("/vips/{vip}/servers", post(join_pool))
        .route("/vips/{vip}/servers/{id}", delete(leave_pool))
        .route("/metrics", get(scrape))
        .route_layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            answered_once_published,
        ))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed on this route",
            )
        })
        .with_state(state)
}

/// How long a change's answer waits for the data path to take it: many rounds of the
/// daemon's main thread, which publishes every 50 ms.
const PUBLISH_WAIT: Duration = Duration::from_secs(2);

/// Answers a change once packets see it (`published.rs`). Should the data path not take
/// it within [`PUBLISH_WAIT`] (its maps refuse the writes, say), the answer goes anyway and
/// the log says so: the change is made and saved, and the main thread keeps trying.
async fn answered_once_published(State(state): Daemon, request: Request, next: Next) -> Response {
    let changes = request.method() != Method::GET;
    let response = next.run(request).await;
    if changes && response.status().is_success() {
        let generation = state.shared.snapshot.generation();
        if !state.published.reached(generation, PUBLISH_WAIT).await {
            tracing::warn!(
                generation,
                "answered a change that the XDP program's maps do not hold yet"
            );
        }
    }
    response
}

// ---- errors and extractors -------------------------------------------------------------

/// An error response: `{"error": message}` with a status.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
        }
    }

    fn invalid(field: &str, problem: &str) -> Self {
        Self::from(ControlError::Invalid(ConfigError::new(field, problem)))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorView {
            error: self.message,
        };
        (self.status, Json(body)).into_response()
    }
}

impl From<ControlError> for ApiError {
    fn from(e: ControlError) -> Self {
        let status = match &e {
            ControlError::Invalid(_) => StatusCode::BAD_REQUEST,
            ControlError::NotFound(_) => StatusCode::NOT_FOUND,
            ControlError::Conflict(_) => StatusCode::CONFLICT,
        };
        ApiError::new(status, e.to_string())
    }
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> Self {
        let status = match &rejection {
            // Axum answers 422 for well-formed JSON of the wrong shape; to the API it is a
            // bad request like any other.
            JsonRejection::JsonDataError(_) | JsonRejection::JsonSyntaxError(_) => {
                StatusCode::BAD_REQUEST
            }
            other => other.status(),
        };
        let text = rejection.body_text();
        // A shape error reads `<field>: <problem>` once axum's preamble is off.
        let message = match text.strip_prefix(JSON_DATA_PREAMBLE) {
            Some(rest) => rest.to_string(),
            None => text,
        };
        ApiError::new(status, message)
    }
}

const JSON_DATA_PREAMBLE: &str = "Failed to deserialize the JSON body into the target type: ";

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        match &rejection {
            PathRejection::FailedToDeserializePathParams(e) => {
                let message = match e.kind() {
                    ErrorKind::ParseErrorAtKey {
                        key,
                        value,
                        expected_type,
                    } => format!(
                        "{key}: `{value}` is not a valid {}",
                        expected_type.rsplit("::").next().unwrap_or(expected_type)
                    ),
                    _ => rejection.body_text(),
                };
                ApiError::new(StatusCode::BAD_REQUEST, message)
            }
            other => ApiError::new(other.status(), other.body_text()),
        }
    }
}

/// A JSON body whose rejections are [`ApiError`]s.
struct Body<T>(T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let Json(value) = Json::<T>::from_request(req, state).await?;
        Ok(Body(value))
    }
}

/// Path parameters whose rejections are [`ApiError`]s.
struct Param<T>(T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for Param<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(value) = Path::<T>::from_request_parts(parts, state).await?;
        Ok(Param(value))
    }
}

type Daemon = State<Arc<DaemonState>>;

/// `/servers/{id}/...`: named, so a bad value is reported as `id: ...`.
#[derive(Deserialize)]
struct IdPath {
    id: u16,
}

/// `/vips/{vip}/...`.
#[derive(Deserialize)]
struct VipPath {
    vip: String,
}

/// `/vips/{vip}/servers/{id}`.
#[derive(Deserialize)]
struct VipServerPath {
    vip: String,
    id: u16,
}
type ApiResult<T> = Result<T, ApiError>;

// ---- views of the tables ---------------------------------------------------------------

fn vip_key(address: IpAddr, port: u16) -> String {
    SocketAddr::new(address, port).to_string()
}

fn server_view(state: &DaemonState, control: &ControlPlane, info: &ServerInfo) -> ServerView {
    let load = state.shared.loads.server(info.id);
    ServerView {
        id: info.id.0,
        dip: IpAddr::V4(info.dip),
        mac: info.mac.clone(),
        state: info.state.name().to_string(),
        quarantine_left_secs: info.quarantine_left_secs,
        active_connections: load.active_connections,
        new_connections: load.new_connections,
        packets: load.packets,
        bytes: load.bytes,
        reported_load: load.reported_load,
        vips: control
            .vips()
            .iter()
            .filter(|v| v.members.iter().any(|(m, _)| *m == info.id))
            .map(|v| vip_key(v.address, v.port))
            .collect(),
        health: control
            .vips()
            .iter()
            .filter(|v| v.members.iter().any(|(m, _)| *m == info.id))
            .map(|v| health_view(state, control, (v.address, v.port), info.id))
            .collect(),
        clock_probed: state.shared.msb.probed(info.id),
    }
}

fn health_view(
    state: &DaemonState,
    control: &ControlPlane,
    vip: (IpAddr, u16),
    id: ServerId,
) -> HealthView {
    let decided = state.health.get(&(vip, id));
    HealthView {
        vip: vip_key(vip.0, vip.1),
        state: control.health(vip, id).name().to_string(),
        reason: decided.as_ref().map_or_else(
            || "not probed (not active, or no prober runs)".to_string(),
            |d| d.reason.clone(),
        ),
        since_secs: decided
            .map_or_else(|| state.uptime().as_secs(), |d| d.since.elapsed().as_secs()),
    }
}

fn servers_view(state: &DaemonState, control: &ControlPlane) -> ServersView {
    let servers = control
        .servers(state.now())
        .iter()
        .map(|info| server_view(state, control, info))
        .collect();
    ServersView { servers }
}

fn one_server(state: &DaemonState, control: &ControlPlane, id: u16) -> ApiResult<ServerView> {
    control
        .servers(state.now())
        .iter()
        .find(|s| s.id.0 == id)
        .map(|info| server_view(state, control, info))
        .ok_or_else(|| ControlError::NotFound(format!("server {id} does not exist")).into())
}

fn vips_view(control: &ControlPlane) -> VipsView {
    let states: BTreeMap<ServerId, SlotState> = control
        .servers(0)
        .into_iter()
        .map(|s| (s.id, s.state))
        .collect();
    let vips = control
        .vips()
        .iter()
        .map(|v| VipView {
            vip: vip_key(v.address, v.port),
            address: v.address,
            port: v.port,
            backend_port: v.backend_port,
            policy: v.policy,
            metric: v.metric,
            members: v
                .members
                .iter()
                .map(|(id, weight)| MemberView {
                    id: id.0,
                    weight: *weight,
                    state: states.get(id).map_or("free", |s| s.name()).to_string(),
                })
                .collect(),
            departed: v.departed.iter().map(|id| id.0).collect(),
        })
        .collect();
    VipsView { vips }
}

fn one_vip(control: &ControlPlane, key: &str) -> ApiResult<VipView> {
    let (address, port) = cheetah_core::tables::control::parse_vip_key(key)?;
    vips_view(control)
        .vips
        .into_iter()
        .find(|v| v.address == address && v.port == port)
        .ok_or_else(|| ControlError::NotFound(format!("VIP {key} does not exist")).into())
}

// ---- handlers --------------------------------------------------------------------------

async fn status(State(state): Daemon) -> Json<StatusView> {
    let (counts, vips) = {
        let control = state.control();
        let mut counts = ServerCounts::default();
        for s in control.servers(state.now()) {
            match s.state {
                SlotState::Active => counts.active += 1,
                SlotState::Draining => counts.draining += 1,
                SlotState::Removed => counts.removed += 1,
                SlotState::Free => {}
            }
        }
        (counts, control.vips().len())
    };
    let rates = state.packet_rates();
    let workers = state
        .workers()
        .iter()
        .enumerate()
        .map(|(i, w)| WorkerView {
            index: w.index,
            queue: w.queue,
            packets: w.counters.packets(),
            dropped: w.counters.get(cheetah_core::lb::Counter::Dropped),
            rx_packets: w.io.rx_packets.load(std::sync::atomic::Ordering::Relaxed),
            tx_packets: w.io.tx_packets.load(std::sync::atomic::Ordering::Relaxed),
            packets_per_second: rates.get(i).copied().unwrap_or(0.0),
        })
        .collect();
    Json(StatusView {
        version: env!("CARGO_PKG_VERSION").to_string(),
        mode: state.mode.name().to_string(),
        forwarding: state.forwarding.name().to_string(),
        cookie_epoch_bits: state.shared.layout().epoch_bits(),
        idle_limit_secs: state.shared.layout().max_idle_ms() as f64 / 1000.0,
        secret_fingerprint: state.secret_fingerprint.clone(),
        uptime_secs: state.uptime().as_secs(),
        started_at_unix_ms: state.started_unix_ms(),
        snapshot_generation: state.shared.snapshot.generation(),
        interfaces: state
            .interfaces()
            .into_iter()
            .map(|i| InterfaceView {
                name: i.name,
                ifindex: i.ifindex,
                xdp_mode: i.xdp_mode,
                queues: i.queues,
            })
            .collect(),
        workers,
        servers: counts,
        vips,
        ready: state.readiness().ready,
    })
}

async fn ready(State(state): Daemon) -> (StatusCode, Json<ReadyView>) {
    let readiness = state.readiness();
    let status = if readiness.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        Json(ReadyView {
            ready: readiness.ready,
            waiting: readiness.waiting,
        }),
    )
}

async fn list_servers(State(state): Daemon) -> Json<ServersView> {
    let control = state.control();
    Json(servers_view(&state, &control))
}

async fn add_server(
    State(state): Daemon,
    Body(body): Body<AddServer>,
) -> ApiResult<(StatusCode, Json<AddedView>)> {
    let spec = ServerSpec {
        id: body.id,
        dip: body.dip,
        mac: body.mac.clone(),
        vips: body
            .vips
            .iter()
            .map(|v| (v.vip.clone(), v.weight))
            .collect(),
        state: body.state,
    };
    let id = state.control().add_server(spec, state.now())?;
    tracing::info!(
        id = id.0,
        dip = %body.dip,
        mac = body.mac.as_deref().unwrap_or("-"),
        vips = ?body.vips.iter().map(|v| format!("{}*{}", v.vip, v.weight)).collect::<Vec<_>>(),
        state = SlotState::from(body.state).name(),
        "server added"
    );
    state.persist();
    Ok((StatusCode::CREATED, Json(AddedView { id: id.0 })))
}

async fn drain_server(
    State(state): Daemon,
    Param(IdPath { id }): Param<IdPath>,
) -> ApiResult<Json<ServerView>> {
    let view = {
        let mut control = state.control();
        control.drain_server(id)?;
        one_server(&state, &control, id)?
    };
    tracing::info!(id, "server draining: no new connections");
    state.persist();
    Ok(Json(view))
}

async fn activate_server(
    State(state): Daemon,
    Param(IdPath { id }): Param<IdPath>,
) -> ApiResult<Json<ServerView>> {
    let view = {
        let mut control = state.control();
        control.activate_server(id)?;
        one_server(&state, &control, id)?
    };
    tracing::info!(id, "server active");
    state.persist();
    Ok(Json(view))
}

async fn remove_server(
    State(state): Daemon,
    Param(IdPath { id }): Param<IdPath>,
) -> ApiResult<Json<ServerView>> {
    let view = {
        let mut control = state.control();
        control.remove_server(id, state.now())?;
        one_server(&state, &control, id)?
    };
    tracing::info!(
        id,
        quarantine_secs = view.quarantine_left_secs,
        "server removed: its id is quarantined"
    );
    state.persist();
    Ok(Json(view))
}

async fn report_load(
    State(state): Daemon,
    Param(IdPath { id }): Param<IdPath>,
    Body(body): Body<LoadReport>,
) -> ApiResult<Json<ServerView>> {
    if body.load.is_none() && body.active_connections.is_none() {
        return Err(ApiError::invalid(
            "load",
            "give `load`, `active_connections` or both",
        ));
    }
    let view = {
        let control = state.control();
        control.report_load(
            id,
            ReportedLoad {
                load: body.load,
                active_connections: body.active_connections,
            },
        )?;
        one_server(&state, &control, id)?
    };
    // Agents may report every second: not a table change, so debug only.
    tracing::debug!(id, load = ?body.load, active = ?body.active_connections, "load report");
    Ok(Json(view))
}

async fn list_vips(State(state): Daemon) -> Json<VipsView> {
    Json(vips_view(&state.control()))
}

async fn set_policy(
    State(state): Daemon,
    Param(VipPath { vip }): Param<VipPath>,
    Body(body): Body<SetPolicy>,
) -> ApiResult<Json<VipView>> {
    let view = {
        let mut control = state.control();
        control.set_policy(&vip, body.policy, body.metric)?;
        one_vip(&control, &vip)?
    };
    tracing::info!(
        %vip,
        policy = body.policy.name(),
        metric = ?view.metric,
        "VIP policy set"
    );
    state.persist();
    Ok(Json(view))
}

async fn set_weights(
    State(state): Daemon,
    Param(VipPath { vip }): Param<VipPath>,
    Body(body): Body<SetWeights>,
) -> ApiResult<Json<VipView>> {
    if body.weights.is_empty() {
        return Err(ApiError::invalid(
            "weights",
            "give at least one server id and its weight",
        ));
    }
    let weights: Vec<(u16, u32)> = body.weights.iter().map(|(id, w)| (*id, *w)).collect();
    let view = {
        let mut control = state.control();
        control
            .set_weights(&vip, &weights)
            .map_err(|e| name_weight_by_id(e, &weights))?;
        one_vip(&control, &vip)?
    };
    tracing::info!(%vip, weights = ?body.weights, "VIP weights set");
    state.persist();
    Ok(Json(view))
}

/// The control plane names a weight by its position (`weights[1]`); the API's weights are
/// keyed by server id, so name it `weights.<id>`.
fn name_weight_by_id(e: ControlError, weights: &[(u16, u32)]) -> ControlError {
    match e {
        ControlError::Invalid(c) => {
            let field = c
                .field
                .strip_prefix("weights[")
                .and_then(|rest| rest.strip_suffix(']'))
                .and_then(|i| i.parse::<usize>().ok())
                .and_then(|i| weights.get(i))
                .map_or(c.field.clone(), |(id, _)| format!("weights.{id}"));
            ControlError::Invalid(ConfigError::new(field, c.problem))
        }
        other => other,
    }
}

async fn join_pool(
    State(state): Daemon,
    Param(VipPath { vip }): Param<VipPath>,
    Body(body): Body<JoinPool>,
) -> ApiResult<(StatusCode, Json<VipView>)> {
    let view = {
        let mut control = state.control();
        control.join_pool(&vip, body.id, body.weight)?;
        one_vip(&control, &vip)?
    };
    tracing::info!(%vip, id = body.id, weight = body.weight, "server joined the pool");
    state.persist();
    Ok((StatusCode::CREATED, Json(view)))
}

async fn leave_pool(
    State(state): Daemon,
    Param(VipServerPath { vip, id }): Param<VipServerPath>,
) -> ApiResult<Json<VipView>> {
    let view = {
        let mut control = state.control();
        control.leave_pool(&vip, id)?;
        one_vip(&control, &vip)?
    };
    tracing::info!(%vip, id, "server left the pool (its connections keep going)");
    state.persist();
    Ok(Json(view))
}

async fn scrape(State(state): Daemon) -> Response {
    (
        [(header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
        metrics::render(&state),
    )
        .into_response()
}
