//! The metrics endpoint: a node's (or the membership service's) counters as OpenMetrics text
//! over HTTP, for Prometheus. `prometheus-client` writes the format and `tiny_http` serves it;
//! the endpoint is off unless asked for (`NodeBuilder::metrics`, `--metrics ADDR`).
//!
//! Every scrape builds its registry from a fresh snapshot (the node's core thread answers a
//! stats request), so a scrape costs one snapshot and nothing is kept between scrapes.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::mpsc::{self, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::MetricType;
pub use prometheus_client::registry::Registry;
use tidings_proto::{StreamReport, TopicId};

use crate::gms_replica::ReplicaSnapshot;
use crate::gms_server::GmsSnapshot;
use crate::stats::{LatencyHistogram, RuntimeStats, SubscriptionState};

/// The media type of the OpenMetrics text format.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// How often the server thread looks whether it should stop.
const STOP_POLL: Duration = Duration::from_millis(100);

/// Fills a scrape's registry (prefix `tidings`), or says why it cannot (the node stopped).
pub type Collect = Box<dyn Fn(&mut Registry) -> Result<(), String> + Send + 'static>;

/// An HTTP server answering `GET /metrics` with what its [`Collect`] fills in.
#[derive(Debug)]
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// Why the metrics endpoint did not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot serve metrics on {addr}: {why}")]
pub struct MetricsError {
    /// The address asked for.
    pub addr: SocketAddr,
    /// The server's reason (the address is taken, or not this host's).
    pub why: String,
}

impl MetricsServer {
    /// Serves `GET /metrics` on `bind` (port 0: any free port, see
    /// [`local_addr`](MetricsServer::local_addr)) from a thread of its own.
    pub fn start(bind: SocketAddr, collect: Collect) -> Result<MetricsServer, MetricsError> {
        let fail = |why: String| MetricsError { addr: bind, why };
        let server = tiny_http::Server::http(bind).map_err(|e| fail(e.to_string()))?;
        let addr = server
            .server_addr()
            .to_ip()
            .ok_or_else(|| fail("not an IP address".to_owned()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("tidings-metrics".to_owned())
            .spawn(move || serve(&server, &collect, &stopping))
            .map_err(|e| fail(e.to_string()))?;
        Ok(MetricsServer {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// The address it serves on.
    #[must_use]
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving (also done by dropping it).
    pub fn shutdown(mut self) {
        self.stop_thread();
    }

    fn stop_thread(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop_thread();
    }
}

/// Serves metrics from a service thread that answers snapshot requests on `snapshots` (the
/// membership service's and a replica's hosts): each scrape asks for one, waiting at most
/// `SNAPSHOT_WAIT`, and `register` turns it into metrics.
pub(crate) fn serve_snapshots<S: Send + 'static>(
    bind: SocketAddr,
    snapshots: SyncSender<SyncSender<S>>,
    register: fn(&mut Registry, &S),
) -> Result<MetricsServer, MetricsError> {
    MetricsServer::start(
        bind,
        Box::new(move |registry| {
            let (reply, answer) = mpsc::sync_channel(1);
            snapshots
                .send(reply)
                .map_err(|_| "the service has stopped".to_owned())?;
            let snapshot = answer
                .recv_timeout(SNAPSHOT_WAIT)
                .map_err(|_| "the service did not answer in time".to_owned())?;
            register(registry, &snapshot);
            Ok(())
        }),
    )
}

/// How long a scrape waits for the service thread's snapshot.
const SNAPSHOT_WAIT: Duration = Duration::from_secs(5);

fn serve(server: &tiny_http::Server, collect: &Collect, stop: &AtomicBool) {
    while !stop.load(Ordering::Acquire) {
        let request = match server.recv_timeout(STOP_POLL) {
            Ok(Some(r)) => r,
            Ok(None) => continue,
            Err(_) => break,
        };
        let path = request.url().split('?').next().unwrap_or("");
        let response = match (request.method(), path) {
            (tiny_http::Method::Get, "/metrics") => {
                let mut registry = Registry::with_prefix("tidings");
                let mut body = String::new();
                match collect(&mut registry).and_then(|()| {
                    prometheus_client::encoding::text::encode(&mut body, &registry)
                        .map_err(|e| e.to_string())
                }) {
                    Ok(()) => text(body, 200, CONTENT_TYPE),
                    Err(why) => text(format!("no metrics: {why}\n"), 503, "text/plain"),
                }
            }
            (tiny_http::Method::Get, _) => text(
                "not found: the metrics are at /metrics\n".to_owned(),
                404,
                "text/plain",
            ),
            _ => text("only GET is served\n".to_owned(), 405, "text/plain"),
        };
        // A client that went away is not the server's problem.
        let _ = request.respond(response);
    }
}

fn text(body: String, status: u16, content_type: &str) -> tiny_http::Response<io::Cursor<Vec<u8>>> {
    let response = tiny_http::Response::from_string(body).with_status_code(status);
    match tiny_http::Header::from_bytes("Content-Type", content_type) {
        Ok(h) => response.with_header(h),
        Err(()) => response,
    }
}

fn counter(registry: &mut Registry, name: &str, help: &str, value: u64) {
    let c: Counter<u64, AtomicU64> = Counter::default();
    c.inc_by(value);
    registry.register(name, help, c);
}

fn gauge(registry: &mut Registry, name: &str, help: &str, value: u64) {
    let g: Gauge<i64, AtomicI64> = Gauge::default();
    g.set(i64::try_from(value).unwrap_or(i64::MAX));
    registry.register(name, help, g);
}

/// A node's metrics, labelled with its id; those of its topics and subscriptions also with
/// the topic (its name, or its id where the node knows no name), at most `topics_max` topics
/// one by one (the held ones first, then the busiest) and the rest summed into
/// `topic="other"` (`RuntimeConfig::metrics_topics_max`); those of its streams with the region
/// and sender, at most `streams_max` one by one (`RuntimeConfig::metrics_streams_max`).
pub fn register_node(
    registry: &mut Registry,
    node: u32,
    s: &RuntimeStats,
    topics_max: usize,
    streams_max: usize,
) {
    let r = registry.sub_registry_with_label((Cow::Borrowed("node"), Cow::Owned(node.to_string())));
    let p = &s.proto;
    let counters: [(&str, &str, u64); 33] = [
        (
            "datagrams_received",
            "Datagrams read from the node's sockets",
            s.datagrams_received,
        ),
        (
            "bytes_received",
            "Bytes read from the node's sockets",
            s.bytes_received,
        ),
        (
            "datagrams_sent",
            "Datagrams written to the node's sockets",
            s.datagrams_sent,
        ),
        (
            "bytes_sent",
            "Bytes written to the node's sockets",
            s.bytes_sent,
        ),
        (
            "kernel_drops",
            "Datagrams the kernel dropped at the node's sockets (buffers full)",
            s.kernel_drops,
        ),
        (
            "invalid_datagrams",
            "Datagrams dropped as malformed, foreign or invalid",
            p.malformed_dropped + p.foreign_dropped + p.invalid_dropped,
        ),
        ("send_errors", "Sends that failed", s.send_errors),
        (
            "messages_published",
            "Messages published by this node",
            p.messages_published,
        ),
        (
            "messages_stable",
            "Messages of this node that became stable",
            p.messages_stable,
        ),
        (
            "publish_refused",
            "Publishes refused by back pressure (try_publish)",
            s.publish_refused,
        ),
        (
            "publish_stalls",
            "Times a publisher waited for room",
            s.publish_stalls,
        ),
        (
            "messages_received",
            "Messages received (new ones)",
            p.messages_received,
        ),
        (
            "messages_delivered",
            "Messages delivered to this node's subscriptions",
            p.messages_delivered,
        ),
        (
            "duplicates_dropped",
            "Messages received again and dropped",
            p.duplicates_dropped,
        ),
        (
            "out_of_window_dropped",
            "Messages dropped beyond the receive window (repaired later)",
            p.out_of_window_dropped,
        ),
        (
            "repairs_received",
            "Messages received through repair",
            p.repairs_received,
        ),
        (
            "pulls_sent",
            "Repair requests sent to caching members",
            p.pulls_sent,
        ),
        (
            "pulls_to_sender",
            "Repair requests sent to the sender",
            p.pulls_to_sender,
        ),
        (
            "messages_pushed",
            "Messages pushed to ring neighbours",
            p.messages_pushed,
        ),
        (
            "messages_resent_on_pull",
            "Messages resent on a repair request",
            p.messages_resent_on_pull,
        ),
        (
            "messages_resent_on_nak",
            "Messages resent after a region's NAK",
            p.messages_resent_on_nak,
        ),
        (
            "naks_sent",
            "NAKs sent for what a whole region lost",
            p.naks_sent,
        ),
        (
            "token_rounds_completed",
            "Token rounds completed",
            p.token_rounds_completed,
        ),
        ("tokens_lost", "Token rounds lost", p.tokens_lost),
        ("tokens_resent", "Token hand-offs resent", p.tokens_resent),
        ("suspicions", "Ring neighbours suspected", p.suspicions),
        ("view_changes", "Region views installed", p.view_changes),
        (
            "memberships_installed",
            "Memberships installed from the membership service",
            s.memberships_installed,
        ),
        (
            "suspicions_reported",
            "Suspicions reported to the membership service",
            s.suspicions_reported,
        ),
        (
            "stalls_reported",
            "Regions reported stalled (messages unacknowledged past stall_after)",
            s.stalls_reported,
        ),
        (
            "gms_datagrams_sent",
            "Datagrams sent to the membership service",
            s.gms_datagrams_sent,
        ),
        (
            "gms_datagrams_received",
            "Datagrams received from the membership service",
            s.gms_datagrams_received,
        ),
        (
            "delivery_stalls",
            "Times a full subscription queue held deliveries back",
            s.delivery_stalls,
        ),
    ];
    for (name, help, value) in counters {
        counter(r, name, help, value);
    }
    let gauges: [(&str, &str, u64); 10] = [
        (
            "unstable_messages",
            "Messages of this node not yet stable",
            p.unstable_msgs_current,
        ),
        (
            "held_messages",
            "Messages this node holds for its streams",
            p.held_msgs_current,
        ),
        (
            "held_bytes",
            "Bytes this node holds for its streams",
            p.held_bytes_current,
        ),
        (
            "cached_messages",
            "Messages cached for repairs",
            p.cache_msgs_current,
        ),
        (
            "publish_queued_messages",
            "Messages queued by publishers, not yet taken by the protocol",
            s.publish_queued_current,
        ),
        (
            "publish_queued_bytes",
            "Bytes queued by all publishers (bounded by publish_queued_node_bytes_max)",
            s.publish_queued_node_bytes_current,
        ),
        (
            "publishers",
            "Publishers of this node",
            s.publishers_current,
        ),
        (
            "publishers_waiting",
            "Publishers waiting for room",
            s.publishers_stalled_current,
        ),
        (
            "multicast_groups_unjoined",
            "Regions whose multicast group could not be joined",
            s.groups_unjoined_current as u64,
        ),
        (
            "removed_by_gms",
            "1 once the membership service removed this node",
            u64::from(s.gms_removed),
        ),
    ];
    for (name, help, value) in gauges {
        gauge(r, name, help, value);
    }
    // The regions stalled now: whom each waits for (the members of the region).
    let stalled: Family<Vec<(String, String)>, Gauge<f64, AtomicU64>> = Family::default();
    for stall in &s.stalls {
        let members: Vec<String> = stall.members.iter().map(|m| m.0.to_string()).collect();
        stalled
            .get_or_create(&vec![
                ("region".to_owned(), stall.region.0.to_string()),
                ("oldest_message".to_owned(), stall.oldest.0.to_string()),
                ("members".to_owned(), members.join(",")),
            ])
            .set(stall.waited.as_secs_f64());
    }
    r.register(
        "stalled_region_wait_seconds",
        "Regions that have not acknowledged a message of this node for stall_after: how long \
         the oldest has waited, and the region's members (whom it waits for)",
        stalled,
    );
    register_sealing(r, &s.sealing);
    register_streams(r, &s.streams, streams_max);
    register_labelled(r, s, topics_max);
}

/// The sealing of protocol datagrams (all zero with sealing off): datagrams sealed and opened,
/// refusals by cause, and the key schedule.
fn register_sealing(r: &mut Registry, s: &crate::stats::SealingStats) {
    let totals: [(&str, &str, u64); 7] = [
        (
            "sealing_datagrams_sealed",
            "Protocol datagrams sealed",
            s.sealed,
        ),
        (
            "sealing_unsealed_dropped",
            "Protocol datagrams dropped for want of a datagram key (recovered as lost)",
            s.unsealed_dropped,
        ),
        (
            "sealing_datagrams_opened",
            "Received datagrams opened (authenticated, not replayed)",
            s.open.opened,
        ),
        (
            "sealing_open_copies",
            "Received datagrams copied before opening (their buffer was shared)",
            s.open_copies,
        ),
        (
            "sealing_keys_installed",
            "Datagram keys installed",
            s.keys_installed,
        ),
        (
            "sealing_keys_retired",
            "Replaced datagram keys retired after their grace",
            s.keys_retired,
        ),
        (
            "sealing_key_renewals_asked",
            "Renewals of the datagram key asked of the membership service",
            s.key_renewals_asked,
        ),
    ];
    for (name, help, value) in totals {
        counter(r, name, help, value);
    }
    let o = &s.open;
    counters(
        r,
        "sealing_open_refused",
        "Received datagrams refused before the protocol saw them, by cause",
        [
            ("malformed", o.malformed),
            ("unknown_key", o.unknown_key),
            ("retired_key", o.retired_key),
            ("bad_tag", o.bad_tag),
            ("replayed", o.replayed),
            ("too_old", o.too_old),
            ("senders_full", o.senders_full),
            ("sender_mismatch", o.sender_mismatch),
        ]
        .map(|(cause, n)| (labels([("cause", cause.to_owned())]), n)),
    );
    gauge(
        r,
        "sealing_key_id",
        "The id of the datagram key this node seals with (0: none yet)",
        s.key_id.map_or(0, u64::from),
    );
}

/// Label values: a metric family's labels besides the node's.
type Labels = Vec<(String, String)>;

/// A gauge family, one gauge per row.
fn gauges(r: &mut Registry, name: &str, help: &str, rows: impl IntoIterator<Item = (Labels, f64)>) {
    let family: Family<Labels, Gauge<f64, AtomicU64>> = Family::default();
    for (labels, value) in rows {
        family.get_or_create(&labels).set(value);
    }
    r.register(name, help, family);
}

/// A counter family, one counter per row (rows with the same labels add up).
fn counters(
    r: &mut Registry,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (Labels, u64)>,
) {
    let family: Family<Labels, Counter<u64, AtomicU64>> = Family::default();
    for (labels, value) in rows {
        family.get_or_create(&labels).inc_by(value);
    }
    r.register(name, help, family);
}

fn labels<const N: usize>(pairs: [(&str, String); N]) -> Labels {
    pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

/// The label value of a topic that is not one of the `topics_max` busiest.
pub const OTHER_TOPICS: &str = "other";

/// Which topics are labelled one by one: of the held ones first, then the others, the
/// `topics_max` with the most deliveries (then by id), each by its name or id; the others are
/// `other`.
struct TopicLabels {
    kept: BTreeMap<TopicId, String>,
}

impl TopicLabels {
    fn new(s: &RuntimeStats, topics_max: usize) -> TopicLabels {
        let mut delivered: BTreeMap<TopicId, u64> = BTreeMap::new();
        for sub in &s.subscriptions {
            *delivered.entry(sub.topic).or_default() += sub.delivered;
        }
        for held in &s.held_topics {
            delivered.entry(held.topic).or_default();
        }
        let held: BTreeSet<TopicId> = s.held_topics.iter().map(|h| h.topic).collect();
        let mut ranked: Vec<(TopicId, u64, bool)> = delivered
            .into_iter()
            .map(|(t, n)| (t, n, held.contains(&t)))
            .collect();
        // Held topics first (what an operator looks for), then the busiest.
        ranked.sort_unstable_by(|a, b| b.2.cmp(&a.2).then(b.1.cmp(&a.1)).then(a.0.cmp(&b.0)));
        ranked.truncate(topics_max);
        let kept = ranked
            .into_iter()
            .map(|(t, _, _)| {
                let name = s
                    .topic_names
                    .binary_search_by_key(&t, |(id, _)| *id)
                    .ok()
                    .and_then(|i| s.topic_names.get(i))
                    .map_or_else(|| t.0.to_string(), |(_, name)| name.clone());
                (t, name)
            })
            .collect();
        TopicLabels { kept }
    }

    /// The topic's label value, and whether it is labelled one by one.
    fn of(&self, topic: TopicId) -> (String, bool) {
        match self.kept.get(&topic) {
            Some(name) => (name.clone(), true),
            None => (OTHER_TOPICS.to_owned(), false),
        }
    }
}

/// The metrics labelled by region, sender, topic, subscription and stalled member.
fn register_labelled(r: &mut Registry, s: &RuntimeStats, topics_max: usize) {
    gauges(
        r,
        "region_unstable_messages",
        "Messages of this node sent to a region and not yet acknowledged by it (its window in use)",
        s.unstable_by_region
            .iter()
            .map(|(region, n)| (labels([("region", region.0.to_string())]), *n as f64)),
    );
    gauges(
        r,
        "stall_member_wait_seconds",
        "Per member of a region stalled for this node's messages (unacknowledged past \
         stall_after): how long the oldest message has waited for the region, one of whose \
         members has not received it or not passed the token on",
        s.stalls.iter().flat_map(|stall| {
            stall.members.iter().map(move |m| {
                (
                    labels([
                        ("region", stall.region.0.to_string()),
                        ("member", m.0.to_string()),
                    ]),
                    stall.waited.as_secs_f64(),
                )
            })
        }),
    );

    let topics = TopicLabels::new(s, topics_max);
    gauge(
        r,
        "topics_subscribed",
        "Topics this node subscribes to (labelled one by one up to metrics_topics_max)",
        topics_count(s),
    );
    counters(
        r,
        "topic_delivered",
        "Messages of a topic run by this node's subscriptions (each subscription counts)",
        s.subscriptions
            .iter()
            .map(|sub| (labels([("topic", topics.of(sub.topic).0)]), sub.delivered)),
    );
    gauges(
        r,
        "topic_held_seconds",
        "Topics held at this node because a subscription of theirs is full: for how long \
         (their streams stop here; summed over the topics of other)",
        sum_by_label(s.held_topics.iter().map(|h| {
            (
                labels([("topic", topics.of(h.topic).0)]),
                h.held_for.as_secs_f64(),
            )
        })),
    );
    gauges(
        r,
        "topic_held_backlog_messages",
        "Deliveries of a held topic waiting for room",
        sum_by_label(
            s.held_topics
                .iter()
                .map(|h| (labels([("topic", topics.of(h.topic).0)]), h.backlog as f64)),
        ),
    );
    let sub_labels = |sub: &SubscriptionState| {
        let (topic, kept) = topics.of(sub.topic);
        let id = if kept {
            sub.id.to_string()
        } else {
            OTHER_TOPICS.to_owned()
        };
        labels([("topic", topic), ("subscription", id)])
    };
    counters(
        r,
        "subscription_delivered",
        "Messages a subscription's callback or reader was handed and ran",
        s.subscriptions
            .iter()
            .map(|sub| (sub_labels(sub), sub.delivered)),
    );
    gauges(
        r,
        "subscription_lag_messages",
        "Deliveries a subscription has not read yet (queued for its callback, or handed to \
         its reader): how far it is behind",
        sum_by_label(
            s.subscriptions
                .iter()
                .map(|sub| (sub_labels(sub), sub.lag() as f64)),
        ),
    );
    gauges(
        r,
        "subscription_capacity_messages",
        "A bounded subscription's capacity (deliveries handed on and not read); 0 for a callback",
        max_by_label(
            s.subscriptions
                .iter()
                .map(|sub| (sub_labels(sub), sub.capacity as f64)),
        ),
    );
    gauges(
        r,
        "subscription_bottleneck_seconds",
        "How long a subscription has been full with its topic held (its slow reader slows the \
         topic's senders); 0 when it has room",
        max_by_label(s.subscriptions.iter().map(|sub| {
            (
                sub_labels(sub),
                sub.bottleneck.since.map_or(0.0, |d| d.as_secs_f64()),
            )
        })),
    );
    counters(
        r,
        "subscription_bottlenecks",
        "Times a subscription became its topic's bottleneck",
        s.subscriptions
            .iter()
            .map(|sub| (sub_labels(sub), sub.bottleneck.times)),
    );
    r.register(
        "time_to_stable_seconds",
        "Time from when the core thread took a message of this node from its publisher to \
         when the acknowledgement that made it stable arrived",
        SnapshotHistogram::from(&s.time_to_stable),
    );
    r.register(
        "delivery_latency_seconds",
        "Time from when a message's sender took it from its publisher to when this node \
         handed it to its subscriptions, for messages of other nodes (between hosts, off by \
         their clocks' difference)",
        SnapshotHistogram::from(&s.delivery_latency),
    );
}

/// The label value of the region and sender of the streams past `metrics_streams_max`.
pub const OTHER_STREAMS: &str = "other";

/// The per-stream series: at most `streams_max` streams one by one (those with gaps first,
/// then those caching the most, then by region and sender), the others summed into
/// `region="other",sender="other"` (gaps and cached messages only: sequence numbers of
/// different streams do not add up).
fn register_streams(r: &mut Registry, streams: &[StreamReport], streams_max: usize) {
    gauge(
        r,
        "streams",
        "Streams (a sender's messages in a region) this node receives; labelled one by one up \
         to metrics_streams_max",
        streams.len() as u64,
    );
    let mut ranked: Vec<&StreamReport> = streams.iter().collect();
    ranked.sort_unstable_by(|a, b| {
        (b.missing, b.cached_now)
            .cmp(&(a.missing, a.cached_now))
            .then((a.region, a.origin).cmp(&(b.region, b.origin)))
    });
    let rest = ranked.split_off(streams_max.min(ranked.len()));
    let stream = |st: &StreamReport| {
        labels([
            ("region", st.region.0.to_string()),
            ("sender", st.origin.0.to_string()),
        ])
    };
    let other = || {
        labels([
            ("region", OTHER_STREAMS.to_owned()),
            ("sender", OTHER_STREAMS.to_owned()),
        ])
    };
    type Value = fn(&StreamReport) -> u64;
    // Each family's rows: the kept streams one by one, then the others' sum if there are any.
    let rows = |value: Value, summed: bool| {
        let kept = ranked.iter().map(move |st| (stream(st), value(st) as f64));
        let others = (summed && !rest.is_empty())
            .then(|| (other(), rest.iter().map(|st| value(st) as f64).sum()));
        kept.chain(others)
    };
    let families: [(&str, &str, Value, bool); 4] = [
        (
            "stream_delivered_seq",
            "Sequence number a sender's stream in a region is delivered up to, in order, at \
             this node",
            |st| st.delivered_upto,
            false,
        ),
        (
            "stream_stable_seq",
            "Sequence number a sender's stream in a region is known stable up to",
            |st| st.stable_upto,
            false,
        ),
        (
            "stream_missing_messages",
            "Gaps of a sender's stream in a region this node knows of and repairs, now",
            |st| st.missing,
            true,
        ),
        (
            "stream_cached_messages",
            "Messages of a sender's stream in a region this node caches for repairs, now",
            |st| st.cached_now,
            true,
        ),
    ];
    for (name, help, value, summed) in families {
        gauges(r, name, help, rows(value, summed));
    }
}

/// Topics with a subscription at this node.
fn topics_count(s: &RuntimeStats) -> u64 {
    let mut n = 0;
    let mut last = None;
    for sub in &s.subscriptions {
        if last != Some(sub.topic) {
            n += 1;
            last = Some(sub.topic);
        }
    }
    n
}

/// Rows with the same labels summed (the topics rolled up into `other`).
fn sum_by_label(rows: impl Iterator<Item = (Labels, f64)>) -> Vec<(Labels, f64)> {
    let mut by: BTreeMap<Labels, f64> = BTreeMap::new();
    for (l, v) in rows {
        *by.entry(l).or_default() += v;
    }
    by.into_iter().collect()
}

/// Rows with the same labels reduced to their largest value.
fn max_by_label(rows: impl Iterator<Item = (Labels, f64)>) -> Vec<(Labels, f64)> {
    let mut by: BTreeMap<Labels, f64> = BTreeMap::new();
    for (l, v) in rows {
        let e = by.entry(l).or_insert(v);
        *e = e.max(v);
    }
    by.into_iter().collect()
}

/// A histogram copied from a snapshot's [`LatencyHistogram`], in seconds.
#[derive(Debug)]
struct SnapshotHistogram {
    sum_s: f64,
    count: u64,
    /// Upper bounds in seconds (the last `f64::MAX`: `+Inf`) and counts, not cumulative.
    buckets: Vec<(f64, u64)>,
}

impl From<&LatencyHistogram> for SnapshotHistogram {
    fn from(h: &LatencyHistogram) -> Self {
        let buckets = h
            .counts
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let ceiling = LatencyHistogram::bucket_ceiling_us(i);
                let le = if ceiling == u64::MAX {
                    f64::MAX
                } else {
                    ceiling as f64 / 1e6
                };
                (le, n)
            })
            .collect();
        SnapshotHistogram {
            sum_s: h.sum_us as f64 / 1e6,
            count: h.count,
            buckets,
        }
    }
}

impl EncodeMetric for SnapshotHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_histogram::<NoLabelSet>(self.sum_s, self.count, &self.buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// Most members whose metrics endpoints the service lists one by one
/// (`tidings_gms_member_metrics_info`): the first by node id; `gms_member_metrics_endpoints`
/// counts them all.
pub const MEMBER_ENDPOINTS_MAX: usize = 1000;

/// Where members serve their metrics: a series per member (at most [`MEMBER_ENDPOINTS_MAX`])
/// labelled with its id and endpoint, for tools that find the nodes through the service
/// (`tidings top --gms`), and their number.
fn register_member_endpoints(r: &mut Registry, endpoints: &[(tidings_proto::NodeId, SocketAddr)]) {
    gauge(
        r,
        "gms_member_metrics_endpoints",
        "Members that told the service where they serve metrics",
        endpoints.len() as u64,
    );
    gauges(
        r,
        "gms_member_metrics_info",
        "Where a member serves its metrics (1 per member that told the service; the first \
         MEMBER_ENDPOINTS_MAX by node id)",
        endpoints
            .iter()
            .take(MEMBER_ENDPOINTS_MAX)
            .map(|(node, addr)| {
                (
                    labels([
                        ("member", node.0.to_string()),
                        ("address", addr.to_string()),
                    ]),
                    1.0,
                )
            }),
    );
}

/// The membership service's metrics (one process, not replicated).
pub fn register_gms(registry: &mut Registry, s: &GmsSnapshot) {
    register_member_endpoints(registry, &s.member_metrics);
    gauge(
        registry,
        "gms_members",
        "Members of the group",
        s.members.len() as u64,
    );
    gauge(
        registry,
        "gms_topics",
        "Topics bound to ids",
        s.topics.len() as u64,
    );
    counter(
        registry,
        "gms_members_removed",
        "Members removed (failed or left)",
        s.removed.len() as u64,
    );
    counter(
        registry,
        "gms_views_issued",
        "Region views issued",
        s.stats.views_issued,
    );
    counter(
        registry,
        "gms_invalid_datagrams",
        "Datagrams dropped as malformed",
        s.invalid_datagrams,
    );
    counter(
        registry,
        "gms_unknown_sources",
        "Datagrams from addresses that are not members",
        s.unknown_sources,
    );
}

/// A replica's metrics, labelled with its index: its Raft role and term, and (as every
/// replica applies the same log) the group it holds.
pub fn register_replica(registry: &mut Registry, s: &ReplicaSnapshot) {
    let r = registry
        .sub_registry_with_label((Cow::Borrowed("replica"), Cow::Owned(s.index.to_string())));
    register_member_endpoints(r, &s.member_metrics);
    gauge(
        r,
        "gms_members",
        "Members of the group",
        s.members.len() as u64,
    );
    gauge(
        r,
        "gms_topics",
        "Topics bound to ids",
        s.topics.len() as u64,
    );
    counter(
        r,
        "gms_members_removed",
        "Members removed (failed or left)",
        s.removed.len() as u64,
    );
    gauge(r, "gms_raft_term", "The replica's Raft term", s.term);
    gauge(
        r,
        "gms_leader",
        "1 while this replica leads and serves",
        u64::from(s.serving),
    );
    counter(
        r,
        "gms_views_issued",
        "Region views issued",
        s.stats.views_issued,
    );
    counter(
        r,
        "gms_invalid_datagrams",
        "Datagrams dropped as malformed",
        s.invalid_datagrams,
    );
    counter(
        r,
        "gms_unknown_sources",
        "Datagrams from addresses that are not members or replicas",
        s.unknown_sources + s.foreign_replica_datagrams,
    );
    counter(
        r,
        "gms_state_writes",
        "Writes of the replica's state file",
        s.state_writes,
    );
    gauge(
        r,
        "gms_state_bytes",
        "Size of the replica's state file",
        s.state_bytes,
    );
    register_replica_link(r, &s.replica_link);
}

/// The sealed replica links' counters (all zero when the replicas speak plain Raft).
fn register_replica_link(r: &mut Registry, s: &tidings_gms::ReplicaLinkStats) {
    let totals: [(&str, &str, u64); 5] = [
        (
            "gms_replica_link_hellos",
            "Handshakes this replica started with its peers",
            s.outbound.hellos,
        ),
        (
            "gms_replica_link_sessions",
            "Sessions this replica established to send to its peers",
            s.outbound.sessions,
        ),
        (
            "gms_replica_link_admitted",
            "Peers' handshakes admitted (sessions to receive from them)",
            s.inbound.admitted,
        ),
        (
            "gms_replica_link_sealed",
            "Raft messages sealed for peers",
            s.outbound.sealed,
        ),
        (
            "gms_replica_link_opened",
            "Raft messages from peers opened and handed to Raft",
            s.delivered,
        ),
    ];
    for (name, help, value) in totals {
        counter(r, name, help, value);
    }
    counters(
        r,
        "gms_replica_link_refused",
        "Replica datagrams dropped, never applied, by cause",
        [
            ("not_admitted", s.inbound.not_admitted),
            ("bad_hello", s.inbound.bad_hellos),
            ("no_session", s.inbound.no_session),
            ("bad_datagram", s.inbound.refused + s.outbound.refused),
            ("plain", s.plain_dropped),
            ("wrong_peer", s.wrong_peer),
            ("malformed", s.malformed),
        ]
        .map(|(cause, n)| (labels([("cause", cause.to_owned())]), n)),
    );
    counter(
        r,
        "gms_replica_link_refusals_received",
        "Unreadable notices from peers (a peer lost its session or cannot read this replica's \
         hello)",
        s.outbound.unreadable,
    );
}
