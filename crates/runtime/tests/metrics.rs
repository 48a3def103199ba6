//! The metrics endpoints of the membership service and of its replicas: scraped over HTTP,
//! they answer OpenMetrics text with the service's figures, and nothing but `GET /metrics`.

// Tests bound their waits by wall time.
#![allow(clippy::unwrap_used, clippy::disallowed_methods)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
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
fn sealed_replicas_count_their_links() {
    let service = tidings_seal::Identity::generate().unwrap();
    let security = tidings_gms::ServiceSecurity {
        identity: service,
        allowed: tidings_seal::AllowList::new(),
    };
    let replicas =
        GmsReplicaServer::start_loopback_secure(&ReplicaConfig::default(), 2, None, Some(security))
            .unwrap();
    let metrics: Vec<_> = replicas
        .iter()
        .map(|r| r.serve_metrics(loopback()).unwrap())
        .collect();
    let start = std::time::Instant::now();
    // Two replicas elect a leader over their sealed links.
    let (index, response) = loop {
        let leader = metrics.iter().enumerate().find_map(|(i, m)| {
            let r = request(m.local_addr(), "GET", "/metrics");
            r.contains(&format!("tidings_gms_leader{{replica=\"{i}\"}} 1"))
                .then_some((i, r))
        });
        if let Some(found) = leader {
            break found;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "no leader");
        std::thread::sleep(Duration::from_millis(50));
    };
    let of = |name: &str| sample(&response, &format!("{name}{{replica=\"{index}\"}}"));
    assert!(
        of("tidings_gms_replica_link_sessions_total") >= Some(1.0),
        "{response}"
    );
    assert!(
        of("tidings_gms_replica_link_admitted_total") >= Some(1.0),
        "{response}"
    );
    assert!(
        of("tidings_gms_replica_link_opened_total") >= Some(1.0),
        "{response}"
    );
    assert!(
        of("tidings_gms_replica_link_sealed_total") >= Some(1.0),
        "{response}"
    );
    let plain =
        format!("tidings_gms_replica_link_refused_total{{replica=\"{index}\",cause=\"plain\"}}");
    assert_eq!(sample(&response, &plain), Some(0.0), "{response}");
    drop(metrics);
    for r in replicas {
        r.shutdown();
    }
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

/// Log lines written to memory, for a test to read.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl tracing_subscriber::fmt::MakeWriter<'_> for Captured {
    type Writer = Captured;

    fn make_writer(&self) -> Captured {
        self.clone()
    }
}

/// The value of the first sample of `name` in a scrape.
fn sample(scrape: &str, name: &str) -> Option<f64> {
    scrape
        .lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[test]
fn a_stalled_publisher_names_the_members_it_waits_for() {
    use std::collections::BTreeMap;
    use tidings_proto::{Config, Membership, NodeId, TopicId};
    use tidings_runtime::{AddressBook, NodeRuntime, RuntimeConfig};

    // The nodes' threads log to the subscriber in force where they start.
    let logs = Captured::default();
    let _logging = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_writer(logs.clone())
            .with_env_filter("tidings=info")
            .finish(),
    );

    // Node 0 publishes on topic 1, which nodes 1 and 2 subscribe to (one region).
    let subs: BTreeMap<NodeId, Vec<TopicId>> = [(0, vec![]), (1, vec![1]), (2, vec![1])]
        .into_iter()
        .map(|(n, t)| (NodeId(n), t.into_iter().map(TopicId).collect()))
        .collect();
    let membership = Membership::from_subscriptions(&subs, 5);
    let sockets: Vec<std::net::UdpSocket> = (0..3)
        .map(|_| std::net::UdpSocket::bind("127.0.0.1:0").unwrap())
        .collect();
    let mut book = AddressBook::default();
    for (i, s) in sockets.iter().enumerate() {
        book.nodes.insert(NodeId(i as u32), s.local_addr().unwrap());
    }
    let mut nodes: Vec<NodeRuntime> = sockets
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            let config = {
                let mut c = RuntimeConfig::default();
                c.stall_after = Duration::from_millis(200);
                c
            };
            let (id, m, b) = (NodeId(i as u32), membership.clone(), book.clone());
            NodeRuntime::start_with_socket(config, Config::default(), id, m, b, s).unwrap()
        })
        .collect();
    let sender = nodes.remove(0);
    let metrics = sender.serve_metrics(loopback()).unwrap();
    let receiver_metrics = nodes[0].serve_metrics(loopback()).unwrap();
    let latency_count = "tidings_delivery_latency_seconds_count{node=\"1\"}";
    let before = request(receiver_metrics.local_addr(), "GET", "/metrics");
    assert_eq!(sample(&before, latency_count), Some(0.0), "{before}");
    let mut publisher = sender.publisher();
    let publish = |publisher: &mut tidings_runtime::Publisher| {
        publisher
            .publish_timeout(
                TopicId(1),
                bytes::Bytes::from_static(b"m"),
                Some(Duration::from_secs(10)),
            )
            .unwrap()
    };
    let first = publish(&mut publisher);
    publisher
        .wait_stable(first, Duration::from_secs(10))
        .unwrap();
    let r = request(metrics.local_addr(), "GET", "/metrics");
    assert!(
        !r.contains("tidings_stall_member_wait_seconds{"),
        "stalled before: {r}"
    );
    assert!(
        r.contains("tidings_time_to_stable_seconds_count{node=\"0\"} 1"),
        "{r}"
    );
    // The sealing counters are there (zero: these nodes do not seal), refusals by cause.
    for line in [
        "tidings_sealing_datagrams_sealed_total{node=\"0\"} 0",
        "tidings_sealing_datagrams_opened_total{node=\"0\"} 0",
        "tidings_sealing_open_refused_total{node=\"0\",cause=\"bad_tag\"} 0",
        "tidings_sealing_open_refused_total{node=\"0\",cause=\"replayed\"} 0",
        "tidings_sealing_keys_installed_total{node=\"0\"} 0",
        "tidings_sealing_key_renewals_asked_total{node=\"0\"} 0",
    ] {
        assert!(r.contains(line), "{line} missing: {r}");
    }
    // The subscriber's delivery latency counted the message (stable: delivered everywhere),
    // within the test's wait, and the sender's own messages are not counted at the sender.
    let after = request(receiver_metrics.local_addr(), "GET", "/metrics");
    assert_eq!(sample(&after, latency_count), Some(1.0), "{after}");
    let latency_sum = sample(&after, "tidings_delivery_latency_seconds_sum{node=\"1\"}");
    assert!(
        latency_sum.is_some_and(|s| (0.0..10.0).contains(&s)),
        "{after}"
    );
    assert_eq!(
        sample(&r, "tidings_delivery_latency_seconds_count{node=\"0\"}"),
        Some(0.0),
        "{r}"
    );
    drop(receiver_metrics);
    // Node 1 goes away without telling anyone (no membership service): the region can no
    // longer acknowledge, and the gauge names its members.
    drop(nodes.remove(0).shutdown());
    publish(&mut publisher);
    let start = std::time::Instant::now();
    let r = loop {
        let r = request(metrics.local_addr(), "GET", "/metrics");
        let waiting = |m: u32| {
            r.lines().any(|l| {
                l.starts_with("tidings_stall_member_wait_seconds{node=\"0\",")
                    && l.contains(&format!("member=\"{m}\""))
            })
        };
        if waiting(1) && waiting(2) {
            break r;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "no stall: {r}");
        std::thread::sleep(Duration::from_millis(50));
    };
    // The message waits in the region's window.
    let window = sample(&r, "tidings_region_unstable_messages{node=\"0\",");
    assert_eq!(window, Some(1.0), "{r}");
    // The log says so once, naming the members, in the node's span.
    let text = logs.text();
    let stalled: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("publisher stalled"))
        .collect();
    assert_eq!(stalled.len(), 1, "{text}");
    for part in [
        "WARN",
        "node{id=0}",
        "tidings::stall",
        "region=",
        "members=1,2",
    ] {
        assert!(stalled[0].contains(part), "{part} missing: {text}");
    }
    // The oldest message's wait grows from scrape to scrape.
    let stall = "tidings_stalled_region_wait_seconds{node=\"0\",";
    let before = sample(&r, stall).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let after = sample(&request(metrics.local_addr(), "GET", "/metrics"), stall).unwrap();
    assert!(after >= before + 0.25, "{before} s, then {after} s");
    drop(metrics);
    drop(nodes.remove(0).shutdown());
    drop(sender.shutdown());
}

#[test]
fn streams_past_the_bound_roll_up_into_other() {
    use tidings_proto::{NodeId, RegionId, StreamReport};
    use tidings_runtime::{register_node, MetricsServer, RuntimeStats};

    // Ten streams (five regions, two senders each), three labelled one by one: the two with
    // gaps, then the one caching the most.
    let streams: Vec<StreamReport> = (0..10u32)
        .map(|i| StreamReport {
            region: RegionId(i / 2),
            partitions: 1,
            origin: NodeId(i % 2 + 1),
            delivered_upto: 100,
            stable_upto: 90,
            cached_total: 10,
            cached_now: u64::from(i),
            missing: u64::from(i == 2 || i == 7),
            doubt_horizon_us: 0,
            doubt_rate: None,
        })
        .collect();
    let stats = RuntimeStats {
        streams,
        ..RuntimeStats::default()
    };
    let server = MetricsServer::start(
        loopback(),
        Box::new(move |registry| {
            register_node(registry, 0, &stats, 100, 3);
            Ok(())
        }),
    )
    .unwrap();
    let r = request(server.local_addr(), "GET", "/metrics");
    let series = |name: &str| -> Vec<&str> {
        r.lines()
            .filter(|l| l.starts_with(&format!("tidings_{name}{{")))
            .collect()
    };
    assert!(
        series("streams").contains(&"tidings_streams{node=\"0\"} 10"),
        "{r}"
    );
    let missing = series("stream_missing_messages");
    assert_eq!(missing.len(), 4, "{r}");
    for kept in [
        "region=\"1\",sender=\"1\"",
        "region=\"3\",sender=\"2\"",
        "region=\"4\",sender=\"2\"",
    ] {
        assert!(
            missing.iter().any(|l| l.contains(kept)),
            "{kept} not kept: {r}"
        );
    }
    // The seven others: no gaps, 0+1+3+4+5+6+8 cached.
    let other = "{node=\"0\",region=\"other\",sender=\"other\"}";
    let of_others = |name: &str| sample(&r, &format!("tidings_{name}{other}"));
    assert_eq!(of_others("stream_missing_messages"), Some(0.0), "{r}");
    assert_eq!(of_others("stream_cached_messages"), Some(27.0), "{r}");
    // Sequence numbers of different streams do not add up: none for other.
    assert_eq!(series("stream_delivered_seq").len(), 3, "{r}");
    assert_eq!(series("stream_stable_seq").len(), 3, "{r}");
}
