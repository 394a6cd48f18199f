//! Random bytes from the kernel (`/dev/urandom`), for everything in the daemon that must not
//! be guessed or shared between instances: the secret, the workers' policy seeds and the
//! health probes' sequence numbers.

use std::io::Read;

/// Fills `bytes` from the kernel's generator.
pub fn fill(bytes: &mut [u8]) -> std::io::Result<()> {
    std::fs::File::open("/dev/urandom")?.read_exact(bytes)
}

#[cfg(test)]
mod tests {
    #[test]
    fn two_draws_differ() {
        let (mut a, mut b) = ([0u8; 16], [0u8; 16]);
        super::fill(&mut a).unwrap();
        super::fill(&mut b).unwrap();
        assert_ne!(a, b);
    }
}
