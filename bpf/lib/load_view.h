// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// This CPU's load view (cheetah_shared.h struct active_row, struct published_row): where
// pow2 and least loaded read a server's load, one plain read a server once the row is
// looked up, and where the program counts its own active connections into it.

#ifndef CHEETAH_LIB_LOAD_VIEW_H
#define CHEETAH_LIB_LOAD_VIEW_H

#include <linux/bpf.h>
#include <linux/types.h>
#include <bpf/bpf_helpers.h>

#include "cheetah_shared.h"
#include "maps.h"

// This CPU's row of active_rows; NULL if the map was sized for fewer CPUs.
static __always_inline struct active_load *own_active_row(void)
{
	__u32 cpu = bpf_get_smp_processor_id();
	struct active_row *row = bpf_map_lookup_elem(&active_rows, &cpu);

	return row ? row->server : NULL;
}

// Adds `change` to this CPU's own count of server `id`'s active connections, wherever
// server_traffic's opened, moved_in or closed move, so that `own` stays their
// opened + moved_in - closed (ServerTraffic::active_delta), from which userspace's base
// is computed; and logs the change for least loaded's caches (load_changes). Ids beyond
// the id space have no server_traffic entry either.
static __always_inline void add_own_active(__u32 id, __s64 change)
{
	struct active_load *row = own_active_row();
	struct load_changes *log;
	__u32 zero = 0;

	if (!row || id >= SERVER_ID_SPACE)
		return;
	row[id].own += change;
	log = bpf_map_lookup_elem(&load_changes_cache, &zero);
	if (log) {
		log->id[log->seq & (LOAD_CHANGES - 1)] = id;
		log->seq += 1;
	}
}

// A server's counted connections change in server_traffic (opened, moved_in, closed:
// what userspace folds) and in this CPU's own count together, so that `own` stays
// opened + moved_in - closed: every change goes through these three. `traffic` is the
// server's server_traffic entry as the caller looked it up (NULL: none).
static __always_inline void count_opened(struct server_traffic *traffic, __u32 id)
{
	if (traffic)
		traffic->opened += 1;
	add_own_active(id, 1);
}

static __always_inline void count_moved_in(struct server_traffic *traffic, __u32 id)
{
	if (traffic)
		traffic->moved_in += 1;
	add_own_active(id, 1);
}

// A counted close, a retransmitted SYN's earlier pick, a count moved away: -1 active.
static __always_inline void count_released(struct server_traffic *traffic, __u32 id)
{
	if (traffic)
		traffic->closed += 1;
	add_own_active(id, -1);
}

// The rows a pick reads its loads from: this CPU's active row for active connections,
// the metric's published row for the others.
struct load_view {
	const struct active_load *active;
	const __u64 *published;
};

// Looks the rows up, once per pick; 0 if a map has no such entry (a CPU beyond those the
// map was sized for, an unknown metric). Both, whatever the metric (the active metric's
// published row is an unused one): the verifier does not tie a later branch on the
// metric to this one's, so a row left NULL here would be one it sees dereferenced.
static __always_inline int load_view_open(__u32 metric, struct load_view *view)
{
	const struct published_row *published = bpf_map_lookup_elem(&published_loads, &metric);

	view->active = own_active_row();
	if (!published || !view->active)
		return 0;
	view->published = published->server;
	return 1;
}

// Active connections of server `id` in this CPU's view: the published base plus this
// CPU's own counts since the fold, wrapping as userspace computed the base, then at
// least 0 as `active.max(0)`.
static __always_inline __u64 active_view_load(const struct active_load *row, __u32 id)
{
	const struct active_load *load = &row[id & (SERVER_ID_SPACE - 1)];
	__s64 active = (__s64)((__u64)load->base + load->own);

	return active < 0 ? 0 : (__u64)active;
}

// The published load of server `id` (report or a rate): the f64's bits, which order as
// the core's f64 does.
static __always_inline __u64 published_view_load(const __u64 *row, __u32 id)
{
	return row[id & (SERVER_ID_SPACE - 1)];
}

// load.rs `LoadView::load` of server `id` under `metric` in this CPU's view, as an
// integer that orders as the core's f64 does. With a constant `metric` the branch folds.
static __always_inline __u64 view_load(const struct load_view *view, __u32 metric, __u32 id)
{
	return metric == LOAD_METRIC_ACTIVE ? active_view_load(view->active, id) :
					      published_view_load(view->published, id);
}

#endif
