// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// The VIP policies the kernel runs for a SYN (vip_info.policy), each the core's
// (crates/core/src/policy/) step for step, so that a kernel instance seeded with a core
// instance's state picks what the core would: rr.rs, wrr.rs (SmoothWeights), random.rs
// (Xoshiro256++ and Lemire's `uniform_below`), hash.rs, and pow2.rs and least_loaded.rs
// over this CPU's load view (load_view.h), which sees its own picks at once.
//
// Each pick is split in two, as the in-kernel path is (decide, then commit): `*_decide`
// only reads and returns the pool position and, in a local, what the state becomes;
// `*_commit` writes it. Nothing is written for a SYN that goes up after all.

#ifndef CHEETAH_LIB_POLICY_H
#define CHEETAH_LIB_POLICY_H

#include <linux/bpf.h>
#include <linux/types.h>
#include <bpf/bpf_helpers.h>

#include "cheetah_shared.h"
#include "least_loaded.h"
#include "load_view.h"
#include "maps.h"
#include "pool.h"

// rr.rs `RoundRobin::pick`: the cursor's position (0 if it is beyond the pool, which only a
// cursor seeded for another pool can be), and the cursor moves one on.
static __always_inline __u32 rr_decide(const struct policy_state *state, __u32 pool_len,
				       __u32 *next)
{
	__u32 position = state->rr_position < pool_len ? state->rr_position : 0;

	*next = position + 1 == pool_len ? 0 : position + 1;
	return position;
}

// One position of wrr_decide's scan (a bpf_loop callback).
struct wrr_scan {
	const struct policy_state *state;
	const struct vip_weights *weights;
	__u64 steps;
	__s64 best_credit;
	__u32 best;
};

static long wrr_scan_position(__u32 i, void *context)
{
	struct wrr_scan *scan = context;
	__s64 credit;

	if (i >= MAX_HASH_POOL)
		return 1;
	credit = (__s64)((__u64)scan->state->wrr_base[i] + scan->steps * scan->weights->weight[i]);
	if (i == 0 || credit > scan->best_credit) {
		scan->best = i;
		scan->best_credit = credit;
	}
	return 0;
}

// wrr.rs `SmoothWeights::next_position`: every credit grows by its weight, the first
// greatest wins. The credits after this step are wrr_base[i] + (wrr_steps + 1) * weight[i]
// (struct policy_state), in wrapping arithmetic whose result is the core's i64 credit.
// The scan is a bpf_loop (its callback verified once): as a bounded loop, every way out of
// it (one per pool size) had the verifier walk the rest of the program again, which the
// bench's wrappers around the LB took past the verifier's million steps.
static __always_inline __u32 wrr_decide(const struct policy_state *state,
					const struct vip_weights *weights, __u32 pool_len)
{
	struct wrr_scan scan = {
		.state = state,
		.weights = weights,
		.steps = state->wrr_steps + 1,
	};

	bpf_loop(pool_len, wrr_scan_position, &scan, 0);
	return scan.best;
}

// The winner pays the total weight back; every other credit's growth is the step count's.
static __always_inline void wrr_commit(struct policy_state *state, __u32 position, __s64 total)
{
	state->wrr_steps += 1;
	state->wrr_base[position & (MAX_HASH_POOL - 1)] -= total;
}

static __always_inline __u64 rotl64(__u64 x, int k)
{
	return (x << k) | (x >> (64 - k));
}

// rand_xoshiro's Xoshiro256PlusPlus::next_u64.
static __always_inline __u64 xoshiro_next(struct policy_rng *rng)
{
	__u64 result = rotl64(rng->s[0] + rng->s[3], 23) + rng->s[0];
	__u64 t = rng->s[1] << 17;

	rng->s[2] ^= rng->s[0];
	rng->s[3] ^= rng->s[1];
	rng->s[1] ^= rng->s[2];
	rng->s[0] ^= rng->s[3];
	rng->s[2] ^= t;
	rng->s[3] = rotl64(rng->s[3], 45);
	return result;
}

// The high 64 bits of the 128-bit product x * bound, for bound < 2^32 (no 128-bit
// arithmetic in BPF): x * bound = hi * 2^32 + lo with hi, lo < 2^64.
static __always_inline __u64 mul_high(__u64 x, __u32 bound)
{
	__u64 lo = (x & 0xffffffff) * bound;
	__u64 hi = (x >> 32) * bound;

	return (hi + (lo >> 32)) >> 32;
}

// Draws the rejection loop of `uniform_below` may take before the kernel gives up and
// hands the SYN up: a draw is rejected with probability < bound / 2^64 <= 2^-58.
#define UNIFORM_BELOW_DRAWS 4

// random.rs `uniform_below` (Lemire): a uniform position in 0..bound drawn from `rng`, a
// local copy of the CPU's generator; -1 if UNIFORM_BELOW_DRAWS draws were all rejected.
static __always_inline int uniform_below(struct policy_rng *rng, __u32 bound)
{
	__u64 x = xoshiro_next(rng);
	__u64 biased;
	int i;

	if (x * bound < bound) {
		// 2^64 mod bound: the draws below it would make low results one more likely.
		biased = (0 - (__u64)bound) % bound;
		for (i = 1; i < UNIFORM_BELOW_DRAWS; i++) {
			if (x * bound >= biased)
				break;
			x = xoshiro_next(rng);
		}
		if (x * bound < biased)
			return -1;
	}
	return (int)mul_high(x, bound);
}

// pow2.rs `draw_two_positions`: two distinct uniform positions of 0..pool_len (>= 2), in
// drawing order; 0 if uniform_below gave up.
static __always_inline int pow2_draw(struct policy_rng *rng, __u32 pool_len, __u32 *first,
				     __u32 *second)
{
	int a = uniform_below(rng, pool_len);
	int b;

	if (a < 0)
		return 0;
	// Uniform among the other positions: a draw that hits `a` stands for the last one.
	b = uniform_below(rng, pool_len - 1);
	if (b < 0)
		return 0;
	*first = a;
	*second = b == a ? pool_len - 1 : b;
	return 1;
}

// Pool positions one step of least_loaded_decide's scan looks at, unrolled: bpf_loop's
// call per step and its loop test are paid once per stride, not once per position.
#define LEAST_SCAN_STRIDE 8

// least_loaded_decide's scan, kept on the caller's stack: the callbacks have no stack of
// their own (the program's frame leaves them none), so whatever outlives a step lives here.
struct least_scan {
	const struct vip_info *vip;
	const struct vip_big_pool *big; // NULL: the pool is in vip_info (pool.h)
	struct load_view view;
	__u64 best_load;
	__u32 start;
	__u32 pool_len;
	__u32 best;
};

// The scan's `j`-th position from the start: its load under `metric` (a constant: ACTIVE,
// or any published one) read from the view's row, and the best moved if it is strictly
// less. 0 once the pool is done. `j` comes from the step's index, not from a counter in
// the context, so that no position waits on the store of the one before.
static __always_inline int least_scan_one(struct least_scan *scan, __u32 metric, __u32 j)
{
	__u32 position = scan->start + j;
	__u64 load;

	if (j >= scan->pool_len)
		return 0;
	if (position >= scan->pool_len)
		position -= scan->pool_len;
	load = view_load(&scan->view, metric, vip_pool_member(scan->vip, scan->big, position));
	// Strictly less: the first minimum from the start wins (best_load starts above every
	// load, so the start's is taken; testing `j == 0` instead would keep `j` on the stack).
	if (load < scan->best_load) {
		scan->best = position;
		scan->best_load = load;
	}
	return 1;
}

// One step of the scan (a bpf_loop callback): LEAST_SCAN_STRIDE positions, unrolled. Two
// callbacks, so that the metric is branched on once per scan: active connections (this
// CPU's active row), and the published loads (the metric's row, looked up by the metric).
#define LEAST_SCAN_STEP(name, metric)                                                      \
	static long name(__u32 step, void *context)                                        \
	{                                                                                  \
		struct least_scan *scan = context;                                         \
                                                                                           \
		_Pragma("unroll") for (int k = 0; k < LEAST_SCAN_STRIDE; k++)              \
		{                                                                          \
			if (!least_scan_one(scan, metric, step * LEAST_SCAN_STRIDE + k))   \
				return 1;                                                  \
		}                                                                          \
		return 0;                                                                  \
	}

LEAST_SCAN_STEP(least_scan_active, LOAD_METRIC_ACTIVE)
LEAST_SCAN_STEP(least_scan_published, LOAD_METRIC_PACKETS)

// least_loaded.rs `LeastLoaded::pick` over a pool bigger than least_loaded.h caches: the
// scan starts at the cursor's position in the pool, goes round once, and the first least
// loaded wins; the cursor becomes start + 1 (*next). A bpf_loop, as wrr's scan is, of
// LEAST_SCAN_STRIDE positions a step, over the rows looked up once. 0 if the view has no
// row for this CPU or the metric.
static __always_inline int least_loaded_scan(const struct policy_state *state,
					     const struct vip_info *vip,
					     const struct vip_big_pool *big, __u32 pool_len,
					     __u32 *position, __u32 *next)
{
	struct least_scan scan = {
		.vip = vip,
		.big = big,
		.start = state->rr_position % pool_len,
		.pool_len = pool_len,
		.best_load = ~0ull,
	};
	__u32 metric = vip->load_metric;
	__u32 steps = (pool_len + LEAST_SCAN_STRIDE - 1) / LEAST_SCAN_STRIDE;

	scan.best = scan.start;
	if (!load_view_open(metric, &scan.view))
		return 0;
	if (metric == LOAD_METRIC_ACTIVE)
		bpf_loop(steps, least_scan_active, &scan, 0);
	else
		bpf_loop(steps, least_scan_published, &scan, 0);
	*next = scan.start + 1;
	*position = scan.best;
	return 1;
}

// least_loaded.rs `LeastLoaded::pick`: a pool of at most LEAST_CACHE_POSITIONS servers
// from this CPU's cache of its least loaded positions (least_loaded.h), a bigger one by a
// scan. `seq`: the publish_seq the pool was read under.
static __always_inline int least_loaded_decide(const struct policy_state *state,
					       const struct vip_info *vip,
					       const struct vip_big_pool *big, __u32 pool_len,
					       __u32 seq, __u32 *position, __u32 *next)
{
	if (pool_len > LEAST_CACHE_POSITIONS)
		return least_loaded_scan(state, vip, big, pool_len, position, next);
	return least_loaded_cached(state, vip, big, pool_len, seq, position, next);
}

#endif
