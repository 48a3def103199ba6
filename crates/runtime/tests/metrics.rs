//! The metrics endpoints of the membership service and of its replicas: scraped over HTTP,
//! they answer OpenMetrics text with the service's figures, and nothing but `GET /metrics`.

// Tests bound their waits by wall time.
#![allow(clippy::unwrap_used, clippy::disallowed_methods)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use tidings_gms::{GmsConfig, ReplicaConfig};
use tidings_runtime::{GmsReplicaServer, GmsServer};

fn request(addr: SocketAddr, method: &str, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

#[test]
fn the_service_serves_its_metrics() {
    let server = GmsServer::start(GmsConfig::default(), loopback()).unwrap();
    let metrics = server.serve_metrics(loopback()).unwrap();
    let response = request(metrics.local_addr(), "GET", "/metrics");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.contains("tidings_gms_members 0"), "{response}");
    assert!(
        response.contains("tidings_gms_views_issued_total 0"),
        "{response}"
    );
    assert!(response.trim_end().ends_with("# EOF"), "{response}");
    assert!(request(metrics.local_addr(), "GET", "/other").starts_with("HTTP/1.1 404"));
    assert!(request(metrics.local_addr(), "POST", "/metrics").starts_with("HTTP/1.1 405"));
    // A scrape after the service stopped says so instead of hanging.
    server.shutdown();
    assert!(request(metrics.local_addr(), "GET", "/metrics").starts_with("HTTP/1.1 503"));
    metrics.shutdown();
}

#[test]
fn a_replica_serves_its_metrics_with_its_role() {
    let replicas = GmsReplicaServer::start_loopback(&ReplicaConfig::default(), 1).unwrap();
    let replica = &replicas[0];
    let metrics = replica.serve_metrics(loopback()).unwrap();
    let start = std::time::Instant::now();
    // The single replica elects itself within a few election timeouts.
    let response = loop {
        let r = request(metrics.local_addr(), "GET", "/metrics");
        if r.contains("tidings_gms_leader{replica=\"0\"} 1") {
            break r;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{r}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        response.contains("tidings_gms_raft_term{replica=\"0\"}"),
        "{response}"
    );
    drop(metrics);
    for r in replicas {
        r.shutdown();
    }
}
