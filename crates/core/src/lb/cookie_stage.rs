//! The stateless cookie stage, as the paper's FastClick element does it: from an echoed
//! TSecr and the connection hash to the server and the TSecr the server must see.
//!
//! Kept apart from the packet plumbing so that it can be measured on its own (the
//! "element-equivalent" benchmark).

use crate::cookie::{tcp_ts, MsbTable};
use crate::tables::{AllServers, ServerSlot, SlotState};
use crate::types::ServerId;
use crate::verdict::DropReason;

/// Decodes the cookie in `tsecr`, checks AllServers, and restores the server's MSB: the
/// server and the TSecr it must see.
#[inline(always)]
pub fn route_by_cookie(
    servers: &AllServers,
    msb: &MsbTable,
    tsecr: u32,
    flow_hash: u64,
) -> Result<(ServerId, u32), DropReason> {
    route(
        servers,
        msb,
        tcp_ts::extract(tsecr),
        flow_hash,
        |server, _, restored| {
            (
                server,
                ((u16::from_be(restored) as u32) << 16) | (tsecr & 0xffff),
            )
        },
    )
}

/// The stage as the straight line uses it: from the echoed cookie (TSecr's 16 MSB) to the
/// server, its AllServers slot (so that the caller need not look it up again to forward
/// the packet), and the restored MSB in network byte order, ready to be written over the
/// cookie.
#[inline(always)]
pub fn route_to_slot<'a>(
    servers: &'a AllServers,
    msb: &MsbTable,
    echoed: u16,
    flow_hash: u64,
) -> Result<(ServerId, &'a ServerSlot, u16), DropReason> {
    route(servers, msb, echoed, flow_hash, |server, slot, restored| {
        (server, slot, restored)
    })
}

/// The stage itself; `routed` shapes the answer (so that each caller's `Result` is only as
/// wide as what it uses). The restored MSB is in network byte order.
#[inline(always)]
fn route<'a, R>(
    servers: &'a AllServers,
    msb: &MsbTable,
    echoed: u16,
    flow_hash: u64,
    routed: impl FnOnce(ServerId, &'a ServerSlot, u16) -> R,
) -> Result<R, DropReason> {
    let layout = msb.layout();
    let unmasked = layout.unmask(echoed, flow_hash);
    let server = layout.server(unmasked);
    let slot = servers.get(server);
    if !slot.state.forwards() {
        return Err(not_forwarding(slot.state));
    }
    let restored = msb
        .restore_unmasked(unmasked)
        .ok_or(DropReason::TsMsbUnknown)?;
    Ok(routed(server, slot, restored))
}

/// Why a cookie naming a server in `state`, which does not forward, is dropped.
#[cold]
fn not_forwarding(state: SlotState) -> DropReason {
    match state {
        SlotState::Removed => DropReason::CookieServerRemoved,
        _ => DropReason::CookieUnknownServer,
    }
}
