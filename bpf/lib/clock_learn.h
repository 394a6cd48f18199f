// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// Learning a server's clock from a reply whose MSB is not the newest seen, bit for bit the
// core's `MsbTable::learn_slow` (crates/core/src/cookie/msb.rs) with its `raise_estimate`
// and `publish`, on the very words the core's table is built over (msb_seen, msb_clock,
// msb_restores): the kernel, the workers and the health probes (`learn_probe`, userspace
// only) interleave on them as the core's threads do.
//
// Split as every in-kernel path is (publish.h): clock_learn_decide reads and decides,
// before the publish check; clock_learn_commit writes, after it. The kernel takes every
// outcome a reply can have: `Learned` (the server's first MSB), `Advanced`, and the
// anomalies the core counts and warns of, `Backwards` and `AheadOfRealTime` (nothing
// written) and `TooFrequent` (written as an advance, then counted as unstable). The
// warning is userspace's: the caller hands an anomaly up as a sample now and then
// (fast_path.h clock_sample_due), decided before any write, so that the worker learns it
// exactly as the core would, counts it and logs it.
//
// The core's SeqCst compare-exchanges are __sync_val_compare_and_swap (fully ordered), on
// the 64 bits around a 32-bit word (clock_cas32: clang 14 emits 32-bit BPF atomics only
// with -mcpu=v3, which the program is not built for); its SeqCst loads are volatile loads,
// its SeqCst stores of restore entries volatile stores followed by one fully ordered
// atomic before the estimate is read again (what `publish` needs of them), its Relaxed
// adds to the count of writes atomic adds. The core's loops that retry a lost
// compare-exchange are bounded here; where a bound runs out, see clock_raise_estimate and
// clock_publish.

#ifndef CHEETAH_LIB_CLOCK_LEARN_H
#define CHEETAH_LIB_CLOCK_LEARN_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "cheetah_shared.h"
#include "cookie.h"
#include "maps.h"

#define MSB_GENERATION (~(MSB_GENERATION_ONE - 1))
#define NANOS_PER_MS 1000000ULL
// Rounds of the core's loops that retry after another writer moved a word. A loss means
// another writer moved the estimate meanwhile (a worker, a probe, the refresh: each about
// once a second per server at most), so two rounds in a row are already rare.
#define CLOCK_RETRIES 4

// `compare_exchange` of word `index` of a 32-bit word array whose start is 8-byte aligned
// (every array of the clock's words is): a 64-bit compare-exchange of the pair of words
// holding it, the other word as just read. 1: exchanged. 0: `*current` was not the word
// (then it is what the word holds now), or the other word kept moving.
static __always_inline int clock_cas32(__u32 *words, __u32 index, __u32 *current, __u32 desired)
{
	__u64 *pair = (__u64 *)&words[index & ~1u];
	// Little-endian, as the host: the even word is the pair's low half.
	__u32 shift = (index & 1) * 32;

	for (int i = 0; i < CLOCK_RETRIES; i++) {
		__u64 old = *(volatile __u64 *)pair, new;
		__u32 word = old >> shift;

		if (word != *current) {
			*current = word;
			return 0;
		}
		new = (old & ~(0xffffffffULL << shift)) | (__u64)desired << shift;
		if (__sync_val_compare_and_swap(pair, old, new) == old)
			return 1;
	}
	return 0;
}

// What clock_learn_decide read and decided, for clock_learn_commit.
// No pointer: it is kept in reply_scratch (maps.h), from which a pointer would read back
// as a number; the commit finds msb_seen and msb_clock again.
struct clock_learning {
	__u64 previous; // the anchor read first
	__u64 limit;    // the bound read
	__u32 index;    // the server id
	__u32 tsval;
	__u32 now_ms;
	__u32 current;    // the seen word the decision was made on
	__u32 generation; // the estimate's generation read first
	__u16 id_bits;
	__u16 id_mask;
	// The server's clock was known: the reply advanced it (else it is its first).
	__u8 advanced;
};

static __always_inline __u64 clock_anchor(__u32 now_ms, __u32 tsval)
{
	__u64 here = (__u64)now_ms << 32 | tsval;

	// `UNKNOWN` is all ones; a real anchor one tick off it is as good.
	return here == MSB_UNKNOWN_ANCHOR ? MSB_UNKNOWN_ANCHOR - 1 : here;
}

// `elapsed_ms`: LB ms since the anchor; 0 if this clock reading is a little behind it.
static __always_inline __u32 clock_elapsed_ms(__u64 anchor, __u32 now_ms)
{
	__s32 elapsed = (__s32)(now_ms - (__u32)(anchor >> 32));

	return elapsed > 0 ? elapsed : 0;
}

// `ahead_of_real_time`: whether `tsval` is further ahead than real time allows since
// `anchor` (`latest_tsval`: a server clock up to the drift allowance faster than the LB's).
static __always_inline int clock_ahead_of_real_time(__u64 anchor, __u32 tsval, __u32 now_ms)
{
	__u32 elapsed = clock_elapsed_ms(anchor, now_ms);
	__u32 latest = (__u32)anchor + elapsed + (elapsed >> MSB_DRIFT_ALLOWANCE_SHIFT);

	return (__s32)(tsval - latest) > MSB_TICK_SLACK;
}

// `learn_slow`'s rate check at an advance: more ticks since the previous anchor than
// MSB_MAX_TICKS_PER_MINUTE a minute of real time allows. At most 2^32 ms times 2^16 fits
// in 64 bits; the division is by a constant.
static __always_inline int clock_too_frequent(__u64 previous, __u32 tsval, __u32 now_ms)
{
	__u64 real_ms = (__u32)(now_ms - (__u32)(previous >> 32));
	__u64 ticks = (__u32)(tsval - (__u32)previous);

	return ticks > real_ms * MSB_MAX_TICKS_PER_MINUTE / 60000 + MSB_TICK_SLACK;
}

// `restore_entry`: what an echo of `epoch` restores to under `estimate` (`KNOWN | M^`, or
// 0): the newest MSB <= M^ + 1 that is `epoch` modulo `epochs`, in network byte order,
// flagged beyond the idle limit when more than epochs / 2 periods behind M^.
static __always_inline __u32 clock_restore_entry(__u32 estimate, __u16 epoch, __u16 epochs)
{
	__u16 m = (__u16)estimate, newest = m + 1;
	__u16 msb = newest - ((__u16)(newest - epoch) & (epochs - 1));
	__s16 age = (__s16)(__u16)(m - msb);

	if (!(estimate & MSB_KNOWN))
		return 0;
	return MSB_KNOWN | (age > (__s16)(epochs / 2) ? MSB_BEYOND_IDLE_LIMIT : 0) |
	       bpf_htons(msb);
}

struct clock_publish_round {
	struct msb_restore_words *restores;
	__u32 estimate;
	__u32 id;       // the server id's bits of the unmasked cookie
	__u16 id_bits;
	__u16 epochs;
};

// One store of `publish`'s loop: the restore entry of `epoch` (`CookieLayout::unmasked`).
static long clock_publish_entry(__u32 epoch, void *data)
{
	struct clock_publish_round *round = data;
	__u32 at = ((epoch << round->id_bits) | round->id) & (COOKIE_SPACE - 1);

	*(volatile __u32 *)&round->restores->word[at] =
		clock_restore_entry(round->estimate, epoch, round->epochs);
	return 0;
}

// `publish`: rewrites the server's 2^k restore entries from its estimate, then reads the
// estimate again and goes round while it moved, so that the last stores to the entries
// are of the last estimate. Past CLOCK_RETRIES rounds the estimate is still moving: the
// writer moving it publishes after its own write, and goes round as this one does.
static __always_inline void clock_publish(const struct clock_learning *l,
					  struct msb_clock_words *clock,
					  struct msb_restore_words *restores)
{
	struct clock_publish_round round = {
		.restores = restores,
		.id = l->index & l->id_mask,
		.id_bits = l->id_bits,
		.epochs = 1 << (16 - l->id_bits),
	};
	__u32 *cell = &clock->estimates[l->index & (SERVER_ID_SPACE - 1)];

	round.estimate = *(volatile __u32 *)cell;
	for (int i = 0; i < CLOCK_RETRIES; i++) {
		__u32 now;

		bpf_loop(round.epochs, clock_publish_entry, &round, 0);
		// The stores before the read, as the core's SeqCst ones are: a compare-exchange
		// that changes nothing (fully ordered, where an atomic add without fetch, as
		// clang emits one whose result is unused, is not on every JIT).
		__sync_val_compare_and_swap(&clock->writes, 0, 0);
		now = *(volatile __u32 *)cell;
		if (now == round.estimate)
			return;
		round.estimate = now;
	}
}

// `raise_estimate(server, msb, generation, false)`: moves M^ forward to `m` (never back)
// if the generation is still the one read first, then publishes it and counts the write.
// Past CLOCK_RETRIES lost compare-exchanges, M^ stays as the other writers left it: the
// anchor is written, so the daemon's refresh raises it within a second, as it does for a
// server whose replies another LB instance sees.
static __always_inline void clock_raise_estimate(const struct clock_learning *l, __u16 m,
						 struct msb_clock_words *clock,
						 struct msb_restore_words *restores)
{
	__u32 index = l->index & (SERVER_ID_SPACE - 1);
	__u32 current = *(volatile __u32 *)&clock->estimates[index];

	for (int i = 0; i < CLOCK_RETRIES; i++) {
		if ((current & MSB_GENERATION) != l->generation)
			return;
		if ((current & MSB_KNOWN) && (__s16)(__u16)(m - (__u16)current) <= 0)
			return;
		if (clock_cas32(clock->estimates, index, &current,
				l->generation | MSB_KNOWN | m)) {
			clock_publish(l, clock, restores);
			__sync_fetch_and_add(&clock->writes, 1);
			return;
		}
	}
}

// What `learn_slow` does with a reply, as clock_learn_decide finds it before any write.
enum clock_decision {
	CLOCK_FOR_USERSPACE,  // a map the kernel could not read
	CLOCK_LEARNS,         // `Learned` or `Advanced`: clock_learn_commit writes
	CLOCK_TOO_FREQUENT,   // written as an advance, then `Unstable(TooFrequent)`
	CLOCK_BACKWARDS,      // `Unstable(Backwards)`: nothing written
	CLOCK_AHEAD,          // `Unstable(AheadOfRealTime)`: nothing written
};

// Whether the reply writes the clock's words (clock_learn_commit).
static __always_inline int clock_decision_writes(int decision)
{
	return decision == CLOCK_LEARNS || decision == CLOCK_TOO_FREQUENT;
}

// `learn_slow` up to its first write, for a reply of server `index` whose TSval is `tsval`
// (host order) and whose MSB `cookie_clock_unchanged` did not take against `current`, its
// msb_seen word; `now_ns` the core's `now` (core_now). An enum clock_decision: the core's
// outcome, nothing read having been written.
static __always_inline int clock_learn_decide(struct clock_learning *l, __u32 index,
					      __u32 tsval, __u32 current, __u64 now_ns,
					      struct cookie_layout layout)
{
	__u32 zero = 0;
	__u16 msb = tsval >> 16;
	struct msb_clock_words *clock = bpf_map_lookup_elem(&msb_clock, &zero);

	if (!clock)
		return CLOCK_FOR_USERSPACE;
	index &= SERVER_ID_SPACE - 1;
	l->index = index;
	l->tsval = tsval;
	l->now_ms = now_ns / NANOS_PER_MS;
	l->current = current;
	l->id_bits = layout.id_bits;
	l->id_mask = layout.id_mask;
	// The core's order of reads: the generation, the anchor, the bound.
	l->generation = *(volatile __u32 *)&clock->estimates[index] & MSB_GENERATION;
	l->previous = *(volatile __u64 *)&clock->anchors[index];
	l->limit = *(volatile __u64 *)&clock->limits[index];
	l->advanced = (current & MSB_KNOWN) != 0;
	if (!l->advanced)
		return CLOCK_LEARNS;
	// Unchanged (the newest or the one before) is the caller's test; a step back of more
	// is `Backwards`.
	if ((__s16)(__u16)(msb - (__u16)current) <= 0)
		return CLOCK_BACKWARDS;
	if (l->limit != MSB_UNKNOWN_ANCHOR && clock_ahead_of_real_time(l->limit, tsval, l->now_ms))
		return CLOCK_AHEAD;
	// The core tests it after its writes, on what it read before them: decided here, so
	// that a reply sent up as a sample has written nothing, and userspace's learn_slow
	// writes what it always did.
	if (l->previous != MSB_UNKNOWN_ANCHOR && clock_too_frequent(l->previous, tsval, l->now_ms))
		return CLOCK_TOO_FREQUENT;
	return CLOCK_LEARNS;
}

// The rest of `learn_slow`, in its order of writes (the reverse of `learn_probe`'s, so
// that a probe answer racing it overwrites its writes or makes them fail): the seen word,
// the anchor, the bound (never probed only), the estimate and its restore entries. 0 when
// the seen word moved since clock_learn_decide read it (another writer learnt it): then
// nothing was written, and the reply goes up for userspace to learn from the words as
// they are now.
//
// A global function, verified once on its own: its bounded compare-and-swap loops and
// the publish were walked again for every state the reply path reached them in (a
// quarter of the instructions the verifier processed for the whole program). One call,
// on a reply that moves its server's clock (about one a second per server).
__noinline int clock_learn_commit(const struct clock_learning *l)
{
	struct msb_restore_words *restores;
	struct msb_clock_words *clock;
	struct msb_seen_words *seen;
	__u32 zero = 0, index, current;
	__u64 here;
	__u16 msb;

	if (!l)
		return 0;
	index = l->index & (SERVER_ID_SPACE - 1);
	current = l->current;
	msb = l->tsval >> 16;
	restores = bpf_map_lookup_elem(&msb_restores, &zero);
	clock = bpf_map_lookup_elem(&msb_clock, &zero);
	seen = bpf_map_lookup_elem(&msb_seen, &zero);
	if (!restores || !clock || !seen)
		return 0;
	if (!clock_cas32(seen->word, index, &current, MSB_KNOWN | msb))
		return 0;
	here = clock_anchor(l->now_ms, l->tsval);
	// A failed exchange means a newer anchor (a probe's, another reply's): keep it.
	__sync_val_compare_and_swap(&clock->anchors[index], l->previous, here);
	if (!*(volatile __u8 *)&clock->probed[index])
		__sync_val_compare_and_swap(&clock->limits[index], l->limit, here);
	// Anchored just now, the estimate is the MSB the server sent.
	clock_raise_estimate(l, msb, clock, restores);
	__sync_fetch_and_add(&clock->writes, 1);
	return 1;
}

// The STAT_FAST_* entry of a reply whose clock moved (`decision`): `stat`'s own (a cookie
// written, a close, a duplicate close) with `ts_msb_learned` or `ts_msb_advanced`, or with
// `server_ts_clock_unstable` or `server_ts_ahead_of_real_time`.
static __always_inline __u32 clock_learnt_stat(__u32 stat, int decision,
					       const struct clock_learning *l)
{
	__u32 learned = STAT_FAST_SERVER_COOKIE_LEARNED, unstable = STAT_FAST_SERVER_COOKIE_UNSTABLE;

	if (stat == STAT_FAST_SERVER_CLOSE) {
		learned = STAT_FAST_SERVER_CLOSE_LEARNED;
		unstable = STAT_FAST_SERVER_CLOSE_UNSTABLE;
	} else if (stat == STAT_FAST_SERVER_DUPLICATE_CLOSE) {
		learned = STAT_FAST_SERVER_DUPLICATE_CLOSE_LEARNED;
		unstable = STAT_FAST_SERVER_DUPLICATE_CLOSE_UNSTABLE;
	}
	if (decision == CLOCK_LEARNS)
		return learned + l->advanced;
	return unstable + (decision == CLOCK_AHEAD);
}

#endif
