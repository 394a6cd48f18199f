// SPDX-License-Identifier: GPL-2.0-only OR Apache-2.0
//
// Whether an address may be a VIP's, from lb_config.vip_addr_filter (one bit per
// address & 63, set by the publisher for every address of vip_addrs, by the core's rule,
// tables/snapshot.rs `vip_addr_bit`). A clear bit answers "no VIP's" without a lookup, for
// most addresses that are not, as the core's `is_vip_addr` answers; a set bit needs the
// vip_addrs (or vips) lookup it would have made anyway.

#ifndef CHEETAH_LIB_VIP_ADDR_FILTER_H
#define CHEETAH_LIB_VIP_ADDR_FILTER_H

#include <bpf/bpf_endian.h>

#include "cheetah_shared.h"

static __always_inline int may_be_vip_addr(const struct lb_config *config, __be32 addr)
{
	return (config->vip_addr_filter >> (bpf_ntohl(addr) & 63)) & 1;
}

#endif
