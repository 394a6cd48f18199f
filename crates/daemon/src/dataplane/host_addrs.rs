//! The LB host's own IPv4 addresses, for the XDP program's `host_addrs` map: a NAT
//! backend's packet addressed to one of them answers the host itself (a health probe) and
//! goes to the kernel, not to the reply path.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

/// Every IPv4 address of every interface of this network namespace (loopback included:
/// an address on `lo` is the host's too).
pub fn ipv4_addresses() -> std::io::Result<BTreeSet<Ipv4Addr>> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut addresses = BTreeSet::new();
    let mut at = list;
    while !at.is_null() {
        // SAFETY: `at` is an element of the list getifaddrs made, which lives until
        // freeifaddrs; an AF_INET ifa_addr points to a sockaddr_in.
        unsafe {
            let entry = &*at;
            if !entry.ifa_addr.is_null() && (*entry.ifa_addr).sa_family as i32 == libc::AF_INET {
                let sin = &*(entry.ifa_addr as *const libc::sockaddr_in);
                addresses.insert(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)));
            }
            at = entry.ifa_next;
        }
    }
    // SAFETY: the list getifaddrs returned, freed once.
    unsafe { libc::freeifaddrs(list) };
    Ok(addresses)
}

#[cfg(test)]
mod tests {
    #[test]
    fn loopback_is_among_them() {
        let addresses = super::ipv4_addresses().unwrap();
        assert!(
            addresses.contains(&std::net::Ipv4Addr::LOCALHOST),
            "{addresses:?}"
        );
    }
}
