//! Cookies: where the server of a connection travels.
//!
//! [`tcp_ts`] packs k epoch bits (the server's MSB modulo 2^k) and 16 - k bits of
//! `server id XOR hash` into the 16 MSB of TSval toward the client; [`msb`] estimates each
//! server's clock so the echoed TSecr can be restored exactly before the server sees it.

pub mod msb;
pub mod tcp_ts;

pub use msb::{ClockWords, MsbLearn, MsbTable, PersistedMsb, PersistedMsbError, SharedWords};
pub use tcp_ts::{BadEpochBits, CookieLayout};
