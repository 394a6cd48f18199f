//! What a server's reply gets on either path that takes it, the straight line
//! (`fast_path.rs`) or the general server path (`server_path.rs`): the server's clock learnt
//! from its TSval, NAT undone, and its bytes counted toward the server's load. Both paths
//! must give the same bytes and counters for every reply, so these steps exist once.

use super::counters::Counter;
use super::shared::LbShared;
use super::worker::{Ipv4Layout, WorkerState};
use crate::cookie::msb::ClockProblem;
use crate::cookie::MsbLearn;
use crate::tables::Snapshot;
use crate::types::{Nanos, ServerId};
use crate::wire::{Ipv4Packet, TcpSegment};

impl WorkerState {
    /// Learns `server`'s timestamp MSB from the TSval of its reply, counting what changed.
    #[inline(always)]
    pub(super) fn learn_server_clock(
        &self,
        shared: &LbShared,
        server: ServerId,
        tsval: u32,
        now: Nanos,
    ) {
        let learnt = shared.msb.learn(server, tsval, now);
        if learnt != MsbLearn::Unchanged {
            self.count_msb_change(learnt);
        }
    }

    /// What `MsbTable::learn` did, when it did anything (about once a minute per server):
    /// out of line, so the straight line keeps its registers.
    #[cold]
    #[inline(never)]
    fn count_msb_change(&self, learnt: MsbLearn) {
        self.counters.inc(match learnt {
            // Only a probe answer resets a clock; a reply never does.
            MsbLearn::Unchanged | MsbLearn::Reset => return,
            MsbLearn::Learned => Counter::MsbLearned,
            MsbLearn::Advanced => Counter::MsbAdvanced,
            MsbLearn::Unstable(ClockProblem::AheadOfRealTime) => Counter::ServerTsAheadOfRealTime,
            MsbLearn::Unstable(ClockProblem::Backwards | ClockProblem::TooFrequent) => {
                Counter::ServerTsClockUnstable
            }
        });
    }

    /// The reply's last steps toward the client: with NAT it leaves from the VIP's address
    /// and port (the client knows no other), not the server's `server_port`; its IP bytes
    /// count toward `server`'s load.
    ///
    /// `nat` is a constant on the straight line, so the branch folds there.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(super) fn reply_leaves_as_vip(
        &mut self,
        nat: bool,
        snapshot: &Snapshot,
        vip_index: u16,
        packet: &mut [u8],
        layout: Ipv4Layout,
        server: ServerId,
        server_port: u16,
    ) {
        if nat {
            let vip = snapshot.vip(vip_index);
            let (vip_ip, vip_port) = (vip.ipv4_or_zero(), vip.port);
            let old = Ipv4Packet::new_unchecked(&mut packet[layout.l3..layout.end]).set_src(vip_ip);
            let mut segment = TcpSegment::new_unchecked(&mut packet[layout.l4..layout.end]);
            segment.update_checksum_for_address(old, vip_ip);
            if server_port != vip_port {
                segment.set_src_port(vip_port);
            }
        }
        self.loads.on_packet(server, layout.end - layout.l3);
    }
}
