//! The stateless cookie stage, as the paper's FastClick element does it: from an echoed
//! TSecr and the connection hash to the server and the TSecr the server must see.
//!
//! Kept apart from the packet plumbing so that it can be measured on its own (the
//! "element-equivalent" benchmark) and mirrored line by line in the XDP program.

use crate::cookie::{tcp_ts, MsbTable};
use crate::tables::{AllServers, SlotState};
use crate::types::ServerId;
use crate::verdict::DropReason;

/// Decodes the cookie in `tsecr`, checks AllServers, and restores the server's MSB.
#[inline]
pub fn route_by_cookie(
    servers: &AllServers,
    msb: &MsbTable,
    tsecr: u32,
    flow_hash: u64,
) -> Result<(ServerId, u32), DropReason> {
    let decoded = tcp_ts::decode(tcp_ts::extract(tsecr), flow_hash);
    match servers.get(decoded.server).state {
        SlotState::Active | SlotState::Draining => {}
        SlotState::Free => return Err(DropReason::CookieUnknownServer),
        SlotState::Removed => return Err(DropReason::CookieServerRemoved),
    }
    let original_msb = msb
        .restore(decoded.server, decoded.version)
        .ok_or(DropReason::TsMsbUnknown)?;
    Ok((
        decoded.server,
        ((original_msb as u32) << 16) | (tsecr & 0xffff),
    ))
}
