//! Faild (Araújo et al., NSDI'18): switches hash connections onto ECMP next-hop entries,
//! each entry's virtual MAC naming a current host and at most one failover origin
//! (`f:r`, "traffic for r is failed over to f"). A host receiving a non-SYN packet it has
//! no socket for forwards it to `r`. Draining a host moves its entries greedily to the
//! hosts with the fewest entries; adding a host drains entries towards it.
//!
//! Rules modelled: one level of failover per entry ("recursive draining fails because it
//! cannot be effectively represented with our current MAC address encoding"), so an entry
//! that changes twice breaks its first host's connections; the failover origin is kept
//! until the entry changes again (Faild waits for drained traffic to decay instead of
//! expiring it). Entries per host default to 8 (a few thousand next hops for 468 hosts,
//! within what switch ECMP groups hold; Faild itself only says "a larger number of ECMP
//! nexthops" than hosts).
//!
//! That is Beamer's daisy chaining without its timeout, on fewer entries, which is why the
//! paper plots the two with one line.

use crate::lbs::beamer::Beamer;

/// Faild: a [`Beamer`] bucket table with one failover host per entry and no expiry.
pub fn faild(entries: u32) -> Beamer {
    Beamer::new(entries, None, true)
}
