//! What the membership-service tests share: a service that detects failures in a fraction of a
//! second, nodes whose client talks to it as quickly, and a bounded wait.

// Each test crate uses a part of this module.
#![allow(dead_code, clippy::unwrap_used, clippy::disallowed_methods)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tidings::{GmsConfig, GmsLinkConfig, Node, ReplicaConfig};
use tidings_gms::ClientConfig;

/// The service's settings: a member is removed 0.6 s after its last heartbeat (0.3 s after a
/// suspicion), and updates are resent every 50 ms.
pub(crate) fn gms_config() -> GmsConfig {
    let mut c = GmsConfig::default();
    c.heartbeat_timeout = Duration::from_millis(600);
    c.suspicion_timeout = Duration::from_millis(300);
    c.retransmit_interval = Duration::from_millis(50);
    c
}

/// A replica with [`gms_config`]'s service.
pub(crate) fn replica_config() -> ReplicaConfig {
    let mut c = ReplicaConfig::default();
    c.gms = gms_config();
    c
}

/// The link to the service at `servers` (its replicas, by index): heartbeats every 100 ms,
/// resends every 50 ms, failover after 300 ms of silence, leave confirmed within 500 ms.
pub(crate) fn link(servers: &[SocketAddr]) -> GmsLinkConfig {
    let mut link = GmsLinkConfig::replicated(servers.to_vec());
    link.client = ClientConfig {
        heartbeat_interval: Duration::from_millis(100),
        retransmit_interval: Duration::from_millis(50),
        failover_timeout: Duration::from_millis(300),
        ..link.client
    };
    link.leave_timeout = Duration::from_millis(500);
    link
}

/// A node of the service at `servers` over [`link`].
pub(crate) fn node(servers: &[SocketAddr]) -> Node {
    node_over(servers, link(servers))
}

/// A node of the service at `servers` over `link`.
pub(crate) fn node_over(servers: &[SocketAddr], link: GmsLinkConfig) -> Node {
    Node::builder()
        .gms_replicas(servers)
        .gms_link(link)
        .start()
        .unwrap()
}

/// Calls `done` every 10 ms until it returns something, at most `wait`; panics with `what`
/// after that.
pub(crate) fn wait_for<T>(what: &str, wait: Duration, mut done: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(t) = done() {
            return t;
        }
        assert!(start.elapsed() < wait, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}
