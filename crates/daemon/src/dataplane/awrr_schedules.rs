//! Publishes the cycle the kernel serves each awrr VIP's SYNs from (`awrr_schedules`,
//! bpf/lib/schedule.h): the buckets a core worker's awrr would derive from the loads it
//! sees (`awrr_buckets_into` over `KernelLoads::view`), as the core's `Schedule`, replaced
//! whenever they change, at every fold (50 ms).
//!
//! Not inside the publish window (docs/dataplane.md "Schedules"): a whole value of the
//! hash map is replaced at once, and a reader sees the old cycle or the new. A VIP whose
//! pool just changed may pick from its old pool's cycle until the next fold; the kernel
//! bounds every position by the pool, so that is a member of the new pool.

use std::collections::BTreeMap;

use anyhow::Context;
use cheetah_core::policy::awrr::awrr_buckets_into;
use cheetah_core::policy::schedule::Schedule;
use cheetah_core::policy::{LoadView, PolicyKind};
use cheetah_core::tables::Snapshot;
use cheetah_core::types::ServerId;
use libbpf_rs::{MapCore, MapFlags};

use super::xdp::SteeringProgram;
use super::xdp_layout::{VipSchedule, KERNEL_POLICY_AWRR, MAX_VIPS};
use super::xdp_tables::kernel_policy;

/// What a VIP's published cycle was built from.
#[derive(PartialEq, Eq)]
struct Published {
    servers: Vec<ServerId>,
    buckets: Vec<u32>,
}

#[derive(Default)]
pub struct AwrrSchedules {
    /// By VIP index; `None` until the first call, which also clears what an earlier run
    /// left in a pinned map.
    published: Option<BTreeMap<u32, Published>>,
    buckets: Vec<u32>,
    schedule: Schedule,
}

impl AwrrSchedules {
    pub fn new() -> Self {
        AwrrSchedules::default()
    }

    /// Publishes the cycle of every kernel awrr VIP of `snapshot` whose buckets under
    /// `loads` (or pool) changed since the last call, and removes those of VIPs that are
    /// no longer awrr in the kernel.
    pub fn publish(
        &mut self,
        steering: &SteeringProgram,
        snapshot: &Snapshot,
        loads: &LoadView,
    ) -> anyhow::Result<()> {
        let map = steering.try_map("awrr_schedules")?;
        let published = match &mut self.published {
            Some(published) => published,
            None => {
                let left: Vec<Vec<u8>> = map.keys().collect();
                for key in left {
                    map.delete(&key)
                        .context("cannot clear awrr_schedules of an earlier run")?;
                }
                self.published.insert(BTreeMap::new())
            }
        };
        // Ascending, as the indices are visited.
        let mut awrr = Vec::new();
        for (index, vip) in snapshot.vips.iter().take(MAX_VIPS).enumerate() {
            let pool = &vip.pool;
            // Every fold (50 ms): only awrr VIPs are asked, not wrr ones, whose question
            // may sort their weights.
            if vip.policy != PolicyKind::AutoWeightedRoundRobin
                || kernel_policy(vip.policy, &pool.weights) != KERNEL_POLICY_AWRR
            {
                continue;
            }
            let index = index as u32;
            awrr.push(index);
            awrr_buckets_into(pool, loads, &mut self.buckets);
            let unchanged = published
                .get(&index)
                .is_some_and(|p| p.buckets == self.buckets && p.servers == pool.servers);
            // awrr_buckets_into fits every pool the kernel holds to a Schedule.
            if unchanged || !self.schedule.rebuild(&self.buckets) {
                continue;
            }
            map.update(
                &index.to_ne_bytes(),
                &VipSchedule::value_of(self.schedule.cycle()),
                MapFlags::ANY,
            )
            .with_context(|| format!("cannot publish VIP {index}'s awrr cycle"))?;
            published.insert(
                index,
                Published {
                    servers: pool.servers.clone(),
                    buckets: self.buckets.clone(),
                },
            );
        }
        let stale: Vec<u32> = published
            .keys()
            .copied()
            .filter(|index| awrr.binary_search(index).is_err())
            .collect();
        for index in stale {
            map.delete(&index.to_ne_bytes())
                .with_context(|| format!("cannot remove VIP {index}'s awrr cycle"))?;
            published.remove(&index);
        }
        Ok(())
    }
}
