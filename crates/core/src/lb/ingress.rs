//! Which side of the LB a packet arrived on: what the I/O layer knows of a packet and its
//! bytes do not say. A server's reply teaches the LB the server's clock, so a packet that
//! merely claims to be one (its source is a server's address and port, or a server's MAC)
//! must not be believed when it comes from where clients are.

/// The side of the LB a port faces, passed with every packet or burst.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ingress {
    /// A port facing the clients only: no server's reply arrives here, so a segment that
    /// looks like one is forged and dropped (`reply_from_client_side`).
    ClientSide,
    /// A port facing the servers: it carries their replies, and may carry client packets
    /// too (an LB with one interface, or clients beside the servers).
    ServerSide,
}

impl Ingress {
    pub fn name(self) -> &'static str {
        match self {
            Ingress::ClientSide => "client side",
            Ingress::ServerSide => "server side",
        }
    }
}
