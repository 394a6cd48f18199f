//! Cookies: where the server of a connection travels.
//!
//! [`tcp_ts`] packs 1 version bit and 15 bits of `server id XOR hash` into the 16 MSB of
//! TSval toward the client; [`msb`] remembers, per server, the MSB the cookie displaced so
//! the echoed TSecr can be restored exactly before the server sees it.

pub mod msb;
pub mod tcp_ts;

pub use msb::{MsbLearn, MsbTable, PersistedMsb, PersistedMsbError};
