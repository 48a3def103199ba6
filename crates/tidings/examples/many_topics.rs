//! Many topics at once: one node publishes on N topics (default 1,000; the first argument
//! changes it), another subscribes to all of them with callbacks that run on the node's
//! delivery workers (no thread per topic), in batches (`Node::subscribe_many_with`,
//! `Node::publishers`) or, with `one-by-one` as the second argument, one `subscribe_with` and
//! one `publisher` per topic; every message of every topic must arrive in order. Prints how long
//! subscribing, creating the publishers and the traffic took, and what each node sent and
//! received (datagrams, silences, token rounds, ACKs, repairs) and how their core threads kept
//! up (longest cycle, latest alarm).
//!
//! `cargo run --release -p tidings --example many_topics -- 5000 [one-by-one]`
//!
//! With `IDLE_SECONDS=3` in the environment it also waits that long once subscribed, before
//! anything is published, and prints the CPU the process used meanwhile (what the quiet regions
//! cost; Linux, from `/proc/self/stat`), and again once everything published is stable (what
//! regions that have had traffic cost at rest). With `MULTICAST=1` the regions use IP multicast on
//! loopback (groups from a /16 pool of the embedded service, the first 4,096 of them shared by
//! the regions past that many; `MULTICAST_GROUPS=N` uses N), not unicast. With
//! `MESSAGES_PER_TOPIC=N` each topic carries N messages instead of 20 (a longer traffic phase).
//!
//! The topics share their subscribers, so the membership service puts them in regions of up to
//! `PlannerConfig::subset_topics_max` topics each (1,024 by default: 98 regions for 100,000
//! topics). `SUBSET_TOPICS_MAX=N` sets that bound; `SUBSET_TOPICS_MAX=1` gives every topic a
//! region of its own, the cost of topics whose subscribers all differ.

// An application measuring its own wall time (the lint keeps the clock out of the protocol).
#![allow(clippy::disallowed_methods)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::net::SocketAddr;

use tidings::{Bytes, GmsConfig, MulticastConfig, MulticastPool, Node, Topic, Transport};

/// Longest traffic phase (publishing and delivery).
const TRAFFIC_SECONDS_MAX: Duration = Duration::from_secs(120);

/// Messages published on each topic unless `MESSAGES_PER_TOPIC` in the environment says
/// otherwise.
const MESSAGES_PER_TOPIC_DEFAULT: u64 = 20;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let topics: u64 = match std::env::args().nth(1) {
        Some(n) => n.parse().map_err(|e| format!("topics {n:?}: {e}"))?,
        None => 1_000,
    };
    let messages_per_topic: u64 = match std::env::var("MESSAGES_PER_TOPIC") {
        Ok(n) => n
            .parse()
            .map_err(|e| format!("MESSAGES_PER_TOPIC {n:?}: {e}"))?,
        Err(_) => MESSAGES_PER_TOPIC_DEFAULT,
    };
    let one_by_one = std::env::args().nth(2).as_deref() == Some("one-by-one");
    let multicast = std::env::var_os("MULTICAST").is_some_and(|v| v == "1");
    let transport = if multicast {
        Transport::Multicast(MulticastConfig::default())
    } else {
        Transport::Unicast
    };
    let mut gms = GmsConfig::default();
    if let Ok(n) = std::env::var("SUBSET_TOPICS_MAX") {
        gms.planner.subset_topics_max = n
            .parse()
            .map_err(|e| format!("SUBSET_TOPICS_MAX {n:?}: {e}"))?;
    }
    if multicast {
        let port = std::net::UdpSocket::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        gms.multicast_pool = Some(MulticastPool {
            base: [239, 77, 0, 0],
            prefix_len: 16,
            port,
            ports: MulticastPool::PORTS_DEFAULT,
            groups_max: match std::env::var("MULTICAST_GROUPS") {
                Ok(n) => n
                    .parse()
                    .map_err(|e| format!("MULTICAST_GROUPS {n:?}: {e}"))?,
                Err(_) => MulticastPool::GROUPS_MAX_DEFAULT,
            },
        });
    }
    let publisher_node = Node::builder()
        .embedded_gms(SocketAddr::from(([127, 0, 0, 1], 0)), gms)
        .transport(transport.clone())
        .start()?;
    let subscriber_node = Node::builder()
        .gms(publisher_node.gms_addr())
        .transport(transport)
        .start()?;

    // Per topic: the next sequence number expected; a message out of order counts an error.
    let next: Arc<Vec<AtomicU64>> = Arc::new((0..topics).map(|_| AtomicU64::new(0)).collect());
    let errors = Arc::new(AtomicU64::new(0));
    let delivered = Arc::new(AtomicU64::new(0));
    let names = (0..topics)
        .map(|t| Topic::raw(format!("sensors/{t}")))
        .collect::<Result<Vec<_>, _>>()?;
    // The callback of topic `t`: checks that its messages come in order.
    let callback_for = |t: usize| {
        let (next, errors, delivered) = (next.clone(), errors.clone(), delivered.clone());
        move |message: Result<tidings::Message<Bytes>, tidings::RecvError>| {
            let expected = &next[t];
            let seq = message
                .ok()
                .and_then(|m| Some(u64::from_be_bytes(m.value.get(..8)?.try_into().ok()?)));
            if seq == Some(expected.load(Ordering::Relaxed)) {
                expected.fetch_add(1, Ordering::Relaxed);
            } else {
                errors.fetch_add(1, Ordering::Relaxed);
            }
            delivered.fetch_add(1, Ordering::Relaxed);
        }
    };
    let started = Instant::now();
    let subscriptions = if one_by_one {
        names
            .iter()
            .enumerate()
            .map(|(t, topic)| subscriber_node.subscribe_with(topic, callback_for(t)))
            .collect::<Result<Vec<_>, _>>()?
    } else {
        subscriber_node.subscribe_many_with(&names, callback_for)?
    };
    println!(
        "{topics} topics subscribed {} in {:.2} s (RSS {})",
        if one_by_one {
            "one by one"
        } else {
            "in batches"
        },
        started.elapsed().as_secs_f64(),
        rss()
    );
    let idle_seconds = std::env::var("IDLE_SECONDS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok());
    if let Some(seconds) = idle_seconds {
        idle("idle", seconds);
    }
    let started = Instant::now();
    let mut publishers = if one_by_one {
        names
            .iter()
            .map(|topic| publisher_node.publisher(topic))
            .collect::<Result<Vec<_>, _>>()?
    } else {
        publisher_node.publishers(&names)?
    };
    println!(
        "{topics} publishers created in {:.2} s (RSS {}); the service's regions: {}",
        started.elapsed().as_secs_f64(),
        rss(),
        publisher_node
            .stats()?
            .gms
            .map_or(0, |g| g.stats.regions_current)
    );
    let started = Instant::now();
    // Publishing and delivery together get at most this long: a node that cannot keep up
    // holds its publishers back (back pressure), and the run still ends with its figures.
    let deadline = started + TRAFFIC_SECONDS_MAX;
    let mut published = 0u64;
    let mut last = Vec::new();
    'publish: for seq in 0..messages_per_topic {
        last.clear();
        for publisher in &mut publishers {
            let mut payload = seq.to_be_bytes().to_vec();
            payload.resize(100, 0);
            let left = deadline.saturating_duration_since(Instant::now());
            match publisher.publish_timeout(&Bytes::from(payload), left) {
                Ok(handle) => {
                    published += 1;
                    last.push(handle);
                }
                Err(tidings::PublishError::Timeout) => {
                    println!(
                        "publishing stopped after {} s: {published} messages published",
                        TRAFFIC_SECONDS_MAX.as_secs()
                    );
                    break 'publish;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
    let total = topics * messages_per_topic;
    while delivered.load(Ordering::Relaxed) < published && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let seconds = started.elapsed().as_secs_f64();
    let got = delivered.load(Ordering::Relaxed);
    println!(
        "{got} of {total} messages delivered in {seconds:.2} s ({:.0} msgs/s), {} out of order",
        got as f64 / seconds,
        errors.load(Ordering::Relaxed)
    );
    {
        // What the two nodes did: datagrams, repairs and the protocol's periodic traffic.
        for (name, node) in [
            ("publisher", &publisher_node),
            ("subscriber", &subscriber_node),
        ] {
            if let Ok(stats) = node.stats() {
                let (r, p) = (&stats.runtime, &stats.runtime.proto);
                println!(
                    "{name}: datagrams sent {} received {} dropped by the kernel {}, \
                     send errors {}, short sends {}; messages sent {} received {} delivered {}; \
                     pulls {} (to the sender {}), repairs {}, silences sent {} received {}, \
                     tokens released {}, acks sent {} received {}, unstable now {}; \
                     memberships installed {}",
                    r.datagrams_sent,
                    r.datagrams_received,
                    r.kernel_drops,
                    r.send_errors,
                    r.short_sends,
                    p.messages_sent,
                    p.messages_received,
                    p.messages_delivered,
                    p.pulls_sent,
                    p.pulls_to_sender,
                    p.repairs_received,
                    p.silences_sent,
                    p.silences_received,
                    p.tokens_released,
                    p.acks_sent,
                    p.acks_received,
                    p.unstable_msgs_current,
                    p.view_changes,
                );
                println!(
                    "{name} core thread: cycle max {} us (last second {}), alarm lateness max {} \
                     us (last second {}, per-second maxima by log2 us {:?}), \
                     I/O quanta expired {}, alarms fired {}, sleeps {}",
                    r.cycle_time.max_us,
                    r.cycle_time.last_second_max_us,
                    r.alarm_lateness.max_us,
                    r.alarm_lateness.last_second_max_us,
                    r.alarm_lateness.histogram_log2_us,
                    r.io_quantum_expired,
                    r.alarms_fired,
                    r.sleeps,
                );
            }
        }
    }
    if published == total {
        for (publisher, handle) in publishers.iter_mut().zip(&last) {
            publisher.wait_stable(*handle, Duration::from_secs(10))?;
        }
        if let Some(seconds) = idle_seconds {
            // The regions have had traffic (their streams exist) and all of it is stable.
            idle("idle after the traffic", seconds);
            println!("RSS at rest after the traffic: {}", rss());
        }
    }
    drop(subscriptions);
    subscriber_node.shutdown()?;
    publisher_node.shutdown()?;
    if got != total || errors.load(Ordering::Relaxed) != 0 {
        return Err("not every message arrived in order".into());
    }
    Ok(())
}

/// Sleeps `seconds` and prints the cores the process used meanwhile.
fn idle(what: &str, seconds: f64) {
    let before = cpu_seconds();
    std::thread::sleep(Duration::from_secs_f64(seconds));
    if let (Some(before), Some(after)) = (before, cpu_seconds()) {
        println!(
            "{what} for {seconds} s: {:.2} cores",
            (after - before) / seconds
        );
    }
}

/// The process's resident memory now (Linux: `VmRSS` of `/proc/self/status`), or "?".
fn rss() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
            let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(format!("{:.0} MB", kb / 1024.0))
        })
        .unwrap_or_else(|| "?".into())
}

/// CPU time (user and system, all threads) this process has used, in seconds: fields 14 and 15
/// of `/proc/self/stat`, in clock ticks of 1/100 s (Linux). `None` where that is not readable.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count after it.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let mut fields = rest.split_whitespace().skip(11);
    let user: f64 = fields.next()?.parse().ok()?;
    let system: f64 = fields.next()?.parse().ok()?;
    Some((user + system) / 100.0)
}
