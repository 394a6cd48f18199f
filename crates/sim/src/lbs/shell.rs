//! SHELL (Desmouceaux et al., ICNP'18): stateless, application-aware load balancing with a
//! power-of-choices scheme and a consistent-hashing history.
//!
//! Rules modelled (section III of the paper):
//!
//! * A SYN is hashed to one of `B` buckets (35591 in SHELL's evaluation) whose first
//!   history row lists `c` candidate servers (c = 2). The SYN visits them in order; a
//!   candidate accepts if its local state allows, the last one always accepts. We model
//!   the local test as "my active connections are at most the pool's average" (SHELL
//!   leaves the acceptance policy to the server agent; 6LB's agents compare their busy
//!   threads to a threshold).
//! * The accepting candidate's index `c_i` is echoed by the client (covert channel in the
//!   TCP timestamp). Later packets are steered along column `c_i` of the bucket's history
//!   matrix, `h` rows deep: the connection survives while its server is in that column.
//! * On every reconfiguration the history shifts down one row for *all* buckets, the new
//!   candidate lists become row 0, and entries equal to the new row-0 entry are deleted
//!   (Algorithm 1, literally: an unchanged bucket thus loses its oldest row too).
//! * Candidate lists come from consistent hashing. SHELL uses 6LB's algorithm; we use
//!   rendezvous (highest-random-weight) hashing, which has the property that matters here:
//!   a server leaving or joining only changes the lists that contain it, one position
//!   each (positions are kept stable, so only that column changes).

use cheetah_core::policy::maglev::server_hash;
use cheetah_core::policy::PolicyRng;
use cheetah_core::ServerId;

use crate::conns::{Conn, ConnTable};
use crate::lbs::bucket_table::NONE;
use crate::lbs::{LbModel, World};

const SCORE_SEED: u64 = 0x243f_6a88_85a3_08d3;

pub struct Shell {
    buckets: usize,
    choices: usize,
    depth: usize,
    /// Row 0 of every bucket: `choices` candidates each.
    row: Vec<u16>,
    /// Column `(bucket, choice)` at `(bucket * choices + choice) * depth`, most recent
    /// first, padded with `NONE`.
    history: Vec<u16>,
    members: Vec<ServerId>,
}

#[inline]
fn score(bucket: usize, server: u16) -> u64 {
    server_hash(
        server,
        (bucket as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ SCORE_SEED,
    )
}

impl Shell {
    pub fn new(buckets: u32, choices: u32, depth: u32) -> Self {
        Shell {
            buckets: buckets.max(1) as usize,
            choices: choices.max(1) as usize,
            depth: depth.max(1) as usize,
            row: Vec::new(),
            history: Vec::new(),
            members: Vec::new(),
        }
    }

    fn candidates(&self, bucket: usize) -> &[u16] {
        &self.row[bucket * self.choices..(bucket + 1) * self.choices]
    }

    fn column(&self, bucket: usize, choice: usize) -> &[u16] {
        let start = (bucket * self.choices + choice) * self.depth;
        &self.history[start..start + self.depth]
    }

    /// The best-scoring member of `bucket` not already among its candidates.
    fn best_outside(&self, bucket: usize) -> u16 {
        let row = self.candidates(bucket);
        self.members
            .iter()
            .map(|id| id.0)
            .filter(|id| !row.contains(id))
            .max_by_key(|&id| (score(bucket, id), id))
            .unwrap_or(NONE)
    }

    fn fill_rows(&mut self) {
        self.row = vec![NONE; self.buckets * self.choices];
        for bucket in 0..self.buckets {
            for choice in 0..self.choices {
                let best = self.best_outside(bucket);
                self.row[bucket * self.choices + choice] = best;
            }
        }
    }

    fn update_rows(&mut self, pool: &[ServerId]) {
        let leaving: Vec<u16> = self
            .members
            .iter()
            .filter(|id| pool.binary_search(id).is_err())
            .map(|id| id.0)
            .collect();
        let joining: Vec<u16> = pool
            .iter()
            .filter(|id| self.members.binary_search(id).is_err())
            .map(|id| id.0)
            .collect();
        self.members = pool.to_vec();
        for bucket in 0..self.buckets {
            for choice in 0..self.choices {
                let position = bucket * self.choices + choice;
                if leaving.contains(&self.row[position]) || self.row[position] == NONE {
                    self.row[position] = NONE;
                    self.row[position] = self.best_outside(bucket);
                }
            }
            for &newcomer in &joining {
                let row = &self.row[bucket * self.choices..(bucket + 1) * self.choices];
                if row.contains(&newcomer) {
                    continue;
                }
                // Replace the weakest candidate if the newcomer scores higher.
                let (weakest, weakest_score) = row
                    .iter()
                    .enumerate()
                    .map(|(j, &id)| (j, if id == NONE { 0 } else { score(bucket, id) }))
                    .min_by_key(|&(j, s)| (s, j))
                    .expect("choices >= 1");
                if score(bucket, newcomer) > weakest_score {
                    self.row[bucket * self.choices + weakest] = newcomer;
                }
            }
        }
    }

    /// Algorithm 1: shift every column down, put the new row 0 on top, delete duplicates
    /// of it.
    fn shift_history(&mut self) {
        let depth = self.depth;
        let mut old = vec![NONE; depth];
        for (column, &top) in self.row.iter().enumerate() {
            let entries = &mut self.history[column * depth..(column + 1) * depth];
            old.copy_from_slice(entries);
            entries.fill(NONE);
            entries[0] = top;
            let mut next = 1;
            for &entry in &old[..depth - 1] {
                if entry != NONE && entry != top {
                    entries[next] = entry;
                    next += 1;
                }
            }
        }
    }
}

impl LbModel for Shell {
    fn start(&mut self, world: &World) {
        self.members = world.pool.to_vec();
        self.fill_rows();
        self.history = vec![NONE; self.buckets * self.choices * self.depth];
        for (column, &top) in self.row.iter().enumerate() {
            self.history[column * self.depth] = top;
        }
    }

    fn place(&mut self, world: &World, _rng: &mut PolicyRng, conn: &mut Conn) -> ServerId {
        let bucket = (conn.flow_hash % self.buckets as u64) as usize;
        let average = world.average_active();
        let row = self.candidates(bucket);
        let last = row
            .iter()
            .rposition(|&id| id != NONE)
            .expect("pool not empty");
        let choice = (0..=last)
            .find(|&j| {
                row[j] != NONE
                    && (j == last || f64::from(world.active_of(ServerId(row[j]))) <= average)
            })
            .expect("the last candidate accepts");
        conn.aux = bucket as u64 | (choice as u64) << 32;
        ServerId(row[choice])
    }

    fn pool_changed(&mut self, world: &World, conns: &mut ConnTable, broken: &mut Vec<u32>) {
        self.update_rows(world.pool);
        self.shift_history();
        for (slot, conn) in conns.iter() {
            let bucket = (conn.aux & 0xffff_ffff) as usize;
            let choice = (conn.aux >> 32) as usize;
            if !self.column(bucket, choice).contains(&conn.server.0) {
                broken.push(slot);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_keeps_distinct_owners_most_recent_first() {
        let mut shell = Shell::new(1, 1, 3);
        shell.row = vec![1];
        shell.history = vec![1, NONE, NONE];
        shell.row = vec![2];
        shell.shift_history();
        assert_eq!(shell.history, [2, 1, NONE]);
        // Unchanged bucket: the shift and the duplicate deletion age its history.
        shell.shift_history();
        assert_eq!(shell.history, [2, 1, NONE]);
        shell.row = vec![3];
        shell.shift_history();
        assert_eq!(shell.history, [3, 2, 1]);
        shell.shift_history();
        assert_eq!(shell.history, [3, 2, NONE]);
    }

    #[test]
    fn candidates_are_distinct_and_stable_under_unrelated_changes() {
        let pool: Vec<ServerId> = (0..20).map(ServerId).collect();
        let mut shell = Shell::new(500, 2, 2);
        shell.members = pool.clone();
        shell.fill_rows();
        for bucket in 0..500 {
            let row = shell.candidates(bucket);
            assert_ne!(row[0], row[1]);
        }
        let before = shell.row.clone();
        let smaller: Vec<ServerId> = pool.iter().copied().filter(|id| id.0 != 7).collect();
        shell.update_rows(&smaller);
        let changed = before
            .iter()
            .zip(&shell.row)
            .filter(|(a, b)| a != b)
            .count();
        let had_seven = before.iter().filter(|&&id| id == 7).count();
        assert_eq!(changed, had_seven);
        shell.update_rows(&pool);
        let back = before
            .iter()
            .zip(&shell.row)
            .filter(|(a, b)| a != b)
            .count();
        assert!(back <= had_seven, "{back} > {had_seven}");
    }
}
