//! The stateless cookie stage, as the paper's FastClick element does it: from an echoed
//! TSecr and the connection hash to the server and the TSecr the server must see.
//!
//! Kept apart from the packet plumbing so that it can be measured on its own (the
//! "element-equivalent" benchmark) and mirrored line by line in the XDP program.

use crate::cookie::{tcp_ts, MsbTable};
use crate::tables::{AllServers, ServerSlot, SlotState};
use crate::types::ServerId;
use crate::verdict::DropReason;

/// Decodes the cookie in `tsecr`, checks AllServers, and restores the server's MSB.
#[inline(always)]
pub fn route_by_cookie(
    servers: &AllServers,
    msb: &MsbTable,
    tsecr: u32,
    flow_hash: u64,
) -> Result<(ServerId, u32), DropReason> {
    route(servers, msb, tsecr, flow_hash, |server, _, restored| {
        (server, restored)
    })
}

/// [`route_by_cookie`], also giving the server's AllServers slot, so that the caller need
/// not look it up again to forward the packet.
#[inline(always)]
pub(crate) fn route_to_slot<'a>(
    servers: &'a AllServers,
    msb: &MsbTable,
    tsecr: u32,
    flow_hash: u64,
) -> Result<(ServerId, &'a ServerSlot, u32), DropReason> {
    route(servers, msb, tsecr, flow_hash, |server, slot, restored| {
        (server, slot, restored)
    })
}

/// The stage itself; `routed` shapes the answer (so that each caller's `Result` is only as
/// wide as what it uses).
#[inline(always)]
fn route<'a, R>(
    servers: &'a AllServers,
    msb: &MsbTable,
    tsecr: u32,
    flow_hash: u64,
    routed: impl FnOnce(ServerId, &'a ServerSlot, u32) -> R,
) -> Result<R, DropReason> {
    let decoded = tcp_ts::decode(tcp_ts::extract(tsecr), flow_hash);
    let slot = servers.get(decoded.server);
    match slot.state {
        SlotState::Active | SlotState::Draining => {}
        SlotState::Free => return Err(DropReason::CookieUnknownServer),
        SlotState::Removed => return Err(DropReason::CookieServerRemoved),
    }
    let original_msb = msb
        .restore(decoded.server, decoded.version)
        .ok_or(DropReason::TsMsbUnknown)?;
    Ok(routed(
        decoded.server,
        slot,
        ((original_msb as u32) << 16) | (tsecr & 0xffff),
    ))
}
