//! Gryphon's bottleneck experiment (paper 002, Figs. 2-3) on a real network (issue 6): one
//! publisher and three subscribers, each a process of this test binary in its own network
//! namespace, on one bridge, `Transport::Multicast`. The publisher offers 2,500 messages/s of
//! 1000 bytes (about 22 Mbit/s on the wire); 3 s after it starts, the bridge port towards
//! subscriber 1 (the *victim*) gets a `tc` token bucket (`tbf`) of 10 Mbit/s with a 512 KiB
//! queue, the downlink of a slow receiver, which sends the datagrams the runtime marks
//! Expedited Forwarding (PDCC's DCQs and UCAs) ahead of the others, as a switch port trusting
//! DSCP does (`TIDINGS_BOTTLENECK_FIFO=1`: one FIFO). Publishing lasts 50 s; the run about 52 s.
//!
//! With congestion control (PDCC and SDCC, ADR 9's settings) the test checks, over the steady
//! part (from 20 s after the onset to the end of publishing):
//! - complete delivery: every subscriber gets every published message once, in order, and
//!   everything is stable;
//! - no collapse: the victim's goodput is at least 80% of the bottleneck, and the publisher's
//!   rate follows the bottleneck (within 75-110% of it);
//! - bounded queues: the tbf drops at most 1% of what it sent and its median backlog is under
//!   half its limit, and the publisher's unstable messages stay under 4,000 (about 3.5 s at
//!   the bottleneck rate).
//!
//! Without congestion control (`#[ignore]`d: it shows a failure, and takes longer) the same run
//! must collapse: the victim's goodput or the publish rate falls below 70% of the bottleneck, or
//! the run does not complete in time. Both print the run second by second; the figures are in
//! `docs/experiments/README.md`.
//!
//! Needs root and iproute2 with `tc` (CI runs as root). Where namespaces cannot be created the
//! test says so and fails: it never passes without having run.

#![allow(clippy::unwrap_used)]

mod netns_support;

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use netns_support::{
    address, address_book, field, run, spawn_in, stdin_lines, Children, Namespaces,
};
use tidings_proto::{Config, CongestionControl, Membership, NodeId, RecoveryPacing, TopicId};
use tidings_runtime::{
    AddressBook, MulticastConfig, NodeRuntime, PublishError, RuntimeConfig, Transport,
};

/// Set in a child process: "NODE CC", its node id and whether congestion control is on (0/1).
const CHILD: &str = "TIDINGS_BOTTLENECK_TEST_CHILD";
/// Node 0 publishes; nodes 1..=SUBSCRIBERS subscribe; node VICTIM is behind the bottleneck.
const SUBSCRIBERS: u32 = 3;
const VICTIM: u32 = 1;
const TOPIC: TopicId = TopicId(0);
const PAYLOAD_BYTES: usize = 1000;
/// Bytes one message occupies on the victim's link (tbf counts whole frames): Ethernet 14, IPv4
/// 20, UDP 8, tidings header 16, data packet 2, message header 30, payload. At 1000 bytes one
/// message fills a datagram (two would exceed the 1472-byte limit).
const WIRE_BYTES_PER_MSG: u64 = 14 + 20 + 8 + 16 + 2 + 30 + PAYLOAD_BYTES as u64;
/// What the publisher offers (it publishes up to this rate, as fast as it is allowed).
const OFFERED_MSGS_PER_S: f64 = 2500.0;
/// The victim's downlink while throttled: 1,147 messages/s.
const BOTTLENECK_BITS_PER_S: u64 = 10_000_000;
/// The token bucket's depth: what may leave at line rate after an idle moment (at least one
/// rate-per-timer-tick, so the rate holds on kernels with 100 Hz timers).
const TBF_BURST_BYTES: u64 = 32 << 10;
/// Most bytes queued in the token bucket before it drops: about 0.4 s at the bottleneck, more
/// than PDCC's queueing thresholds plus its reaction time, so that in the steady part what
/// bounds the queue is congestion control, not the limit. (With 1 MiB and 8 Mbit/s the first
/// overload takes so long to repair that PDCC cuts the rate to 82 messages/s meanwhile: ADR 9.)
const TBF_LIMIT_BYTES: u64 = 512 << 10;
/// When the bottleneck starts, after the publisher does.
const ONSET: Duration = Duration::from_secs(3);
/// How long the publisher publishes.
const PUBLISHING: Duration = Duration::from_secs(50);
/// Where the steady part starts, after the onset: PDCC's first reaction and its probe towards
/// the bottleneck are done by then.
const STEADY_AFTER_ONSET: Duration = Duration::from_secs(20);
/// Every wait of the test is bounded by this (or less).
const TIMEOUT: Duration = Duration::from_secs(60);
/// Unicast port of every node (each namespace has its own network stack, so one port serves all).
const PORT: u16 = 40_000;
/// Series are kept in bins of this many milliseconds of wall-clock time (shared by all processes
/// of the host, whatever their namespace).
const BIN_MS: u64 = 100;

/// The bottleneck in messages per second.
fn bottleneck_msgs_per_s() -> f64 {
    BOTTLENECK_BITS_PER_S as f64 / 8.0 / WIRE_BYTES_PER_MSG as f64
}

/// Wall-clock milliseconds: the one clock the processes of the test share for binning their
/// series (each runtime's own clock starts with its process).
#[allow(clippy::disallowed_methods)]
fn unix_ms() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

fn membership() -> Membership {
    let subs: BTreeMap<NodeId, Vec<TopicId>> = (0..=SUBSCRIBERS)
        .map(|i| (NodeId(i), if i == 0 { vec![] } else { vec![TOPIC] }))
        .collect();
    Membership::from_subscriptions(&subs, 5)
}

/// Everyone's addresses: fixed, since each node has a namespace of its own; one group per region.
fn book() -> AddressBook {
    address_book(&membership(), SUBSCRIBERS, PORT, 1)
}

fn runtime_config(me: u32) -> RuntimeConfig {
    let mut c = RuntimeConfig::default();
    let mut multicast = MulticastConfig::default();
    multicast.interface = address(me);
    multicast.ttl = 1;
    // One node per namespace: with loopback off every datagram crosses the bridge.
    multicast.loopback = false;
    c.transport = Transport::Multicast(multicast);
    c
}

/// The protocol as nodes on real networks run it (ADR 6: 10 ms tokens), congestion control on
/// (PDCC and SDCC, as in the simulated experiments) or off. PDCC's settings are ADR 9's for a
/// LAN: with Table 1's (1 s queries, 2 s t_noUCA, a fixed r_min of 2 messages/s) the rate, once
/// cut during the first overload, climbs back by about 1 message/s per second and never reaches
/// the bottleneck again within a run.
fn protocol_config(congestion_control: bool) -> Config {
    let mut cfg = Config::default();
    cfg.congestion.control = if congestion_control {
        CongestionControl::Pdcc
    } else {
        CongestionControl::None
    };
    cfg.congestion.dcq_interval = Duration::from_millis(500);
    cfg.congestion.t_no_uca = Duration::from_secs(1);
    cfg.congestion.rate_min_increase_share = 0.1;
    cfg.congestion.decrease_holdoff = Duration::from_secs(1);
    cfg.congestion.queue_delay_baseline = Duration::from_secs(10);
    cfg.congestion.queue_delay_threshold = Duration::from_millis(100);
    cfg.congestion.standing_queue_threshold = Duration::from_millis(200);
    cfg.recovery.pacing = if congestion_control {
        RecoveryPacing::Sdcc
    } else {
        RecoveryPacing::Fixed
    };
    cfg.token_interval = Duration::from_millis(10);
    cfg
}

fn payload(index: u64) -> Bytes {
    let mut p = Vec::with_capacity(PAYLOAD_BYTES);
    p.extend_from_slice(&index.to_be_bytes());
    p.resize(PAYLOAD_BYTES, 0x5a);
    Bytes::from(p)
}

/// A per-bin series as one line: `CHILD-SERIES NODE NAME FIRST_BIN v,v,...`.
fn print_series(me: u32, name: &str, bins: &BTreeMap<u64, u64>) {
    let (Some(&first), Some(&last)) = (bins.keys().next(), bins.keys().next_back()) else {
        println!("CHILD-SERIES {me} {name} 0 ");
        return;
    };
    let values: Vec<String> = (first..=last)
        .map(|b| bins.get(&b).copied().unwrap_or(0).to_string())
        .collect();
    println!("CHILD-SERIES {me} {name} {first} {}", values.join(","));
}

/// Runs only in a child process, inside a namespace: one node.
#[test]
fn child_bottleneck_node() {
    let Ok(var) = std::env::var(CHILD) else {
        return;
    };
    let (me, cc) = var.split_once(' ').unwrap();
    let me: u32 = me.parse().unwrap();
    let input = stdin_lines();
    let node = NodeRuntime::start(
        runtime_config(me),
        protocol_config(cc == "1"),
        NodeId(me),
        membership(),
        book(),
    )
    .unwrap();
    let verdict = if me == 0 {
        publisher(&node, &input)
    } else {
        subscriber(me, &node, &input)
    };
    let stats = node.stats().unwrap();
    println!(
        "CHILD-RESULT {me} {verdict} (datagrams received {}, repairs {}, unstable max {}, dcqs \
         {}, ucas received {}, rate limited {}, out of window {}, marked sent {}, tos errors \
         {})",
        stats.datagrams_received,
        stats.proto.repairs_received,
        stats.proto.unstable_msgs_max,
        stats.proto.dcqs_sent,
        stats.proto.ucas_received,
        stats.proto.publish_rate_limited,
        stats.proto.out_of_window_dropped,
        stats.control_datagrams_sent,
        stats.tos_errors,
    );
    // Stay in the region (its token ring carries the acknowledgements that make the last
    // messages stable) until the parent closes stdin, or the timeout.
    while let Ok(Some(_)) = input.recv_timeout(TIMEOUT) {}
    node.shutdown().unwrap();
}

/// Publishes at up to the offered rate for `PUBLISHING`, as fast as back pressure and the
/// congestion-controlled rate allow (a message it could not publish is not made up for later:
/// the offered load never bursts above its rate).
fn publisher(node: &NodeRuntime, input: &mpsc::Receiver<Option<String>>) -> String {
    println!("CHILD-READY 0");
    match input.recv_timeout(TIMEOUT) {
        Ok(Some(line)) if line == "GO" => {}
        other => return format!("no-GO-from-the-parent: {other:?}"),
    }
    let mut p = node.publisher();
    let start = tidings_runtime::now();
    let mut published_per_bin = BTreeMap::new();
    let mut rate_per_bin = BTreeMap::new();
    let mut unstable_per_bin = BTreeMap::new();
    let mut next = 0u64;
    let mut last = None;
    // A token bucket at the offered rate, 20 ms deep.
    let burst = OFFERED_MSGS_PER_S * 0.02;
    let mut credit = 0.0f64;
    let mut credit_at = start;
    let mut next_sample = start;
    loop {
        let now = tidings_runtime::now();
        if now >= start + PUBLISHING {
            break;
        }
        if now >= next_sample {
            let s = node.stats().unwrap();
            let bin = unix_ms() / BIN_MS;
            rate_per_bin.insert(bin, s.proto.publish_rate_milli_current / 1000);
            unstable_per_bin.insert(bin, s.proto.unstable_msgs_current);
            next_sample += Duration::from_millis(BIN_MS);
        }
        credit = (credit + (now - credit_at).as_secs_f64() * OFFERED_MSGS_PER_S).min(burst);
        credit_at = now;
        while credit >= 1.0 {
            match p.try_publish(TOPIC, payload(next)) {
                Ok(h) => {
                    last = Some(h);
                    next += 1;
                    credit -= 1.0;
                    *published_per_bin.entry(unix_ms() / BIN_MS).or_insert(0) += 1;
                }
                Err(PublishError::WouldBlock(_)) => {
                    // Held by back pressure or the rate: this offer is lost.
                    credit = 0.0;
                }
                Err(e) => return format!("publish-{next}-failed: {e}"),
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    println!("CHILD-PUBLISHED {next} {}", unix_ms() / BIN_MS);
    print_series(0, "published", &published_per_bin);
    print_series(0, "rate", &rate_per_bin);
    print_series(0, "unstable", &unstable_per_bin);
    let Some(last) = last else {
        return "nothing-published".to_owned();
    };
    match p.wait_stable(last, TIMEOUT) {
        Ok(()) => "ok".to_owned(),
        Err(e) => format!("not-stable: {e}"),
    }
}

/// What a subscriber saw: the next index it expects, deliveries out of order, deliveries per bin.
#[derive(Default)]
struct Received {
    next: u64,
    out_of_order: u64,
    per_bin: BTreeMap<u64, u64>,
}

fn subscriber(me: u32, node: &NodeRuntime, input: &mpsc::Receiver<Option<String>>) -> String {
    let log: Arc<Mutex<Received>> = Arc::default();
    let sink = Arc::clone(&log);
    let subscription = node
        .subscribe(TOPIC, 1.0, move |d| {
            let index = u64::from_be_bytes(d.payload[0..8].try_into().unwrap());
            let mut r = sink.lock().unwrap();
            if index == r.next {
                r.next += 1;
            } else {
                r.out_of_order += 1;
            }
            *r.per_bin.entry(unix_ms() / BIN_MS).or_insert(0) += 1;
        })
        .unwrap();
    println!("CHILD-READY {me}");
    let expected: u64 = match input.recv_timeout(TIMEOUT * 2) {
        Ok(Some(line)) => match line.strip_prefix("EXPECT ").map(str::parse) {
            Some(Ok(n)) => n,
            _ => return format!("bad-line-from-the-parent: {line}"),
        },
        other => return format!("no-EXPECT-from-the-parent: {other:?}"),
    };
    let deadline = tidings_runtime::now() + TIMEOUT;
    while log.lock().unwrap().next < expected && tidings_runtime::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(subscription);
    let r = log.lock().unwrap();
    print_series(me, "delivered", &r.per_bin);
    if r.next == expected && r.out_of_order == 0 {
        "ok".to_owned()
    } else {
        format!(
            "got-{}-of-{expected}-in-order,-{}-out-of-order",
            r.next, r.out_of_order
        )
    }
}

/// The token bucket on the victim's downlink; removed on drop (the namespaces' guard would
/// remove it with the link anyway).
struct Bottleneck {
    hub: String,
    port: String,
    /// Whether marked datagrams have a band of their own (see [`Bottleneck::install`]).
    priority: bool,
}

impl Bottleneck {
    /// The token bucket, and under it (unless `TIDINGS_BOTTLENECK_FIFO` is set) two classes
    /// of strict priority that send datagrams marked Expedited Forwarding (the runtime's `control_dscp`: DCQs and
    /// UCAs) first, from a small queue of their own, and everything else from a FIFO of
    /// `TBF_LIMIT_BYTES`: a switch port that honours DSCP, as Gryphon's brokers sent DCQ and
    /// UCA at high priority (ADR 11).
    fn install(hub: &str, port: &str) -> Bottleneck {
        let rate = format!("{BOTTLENECK_BITS_PER_S}bit");
        let burst = TBF_BURST_BYTES.to_string();
        let limit = TBF_LIMIT_BYTES.to_string();
        let fifo = std::env::var_os("TIDINGS_BOTTLENECK_FIFO").is_some();
        let tbf = [
            "qdisc", "add", "dev", port, "root", "handle", "1:", "tbf", "rate", &rate, "burst",
            &burst, "limit", &limit,
        ];
        // HTB only to order what the token bucket takes: both classes far above the
        // bottleneck's rate, so neither is ever held back and the higher priority goes first.
        let priority: [&[&str]; 6] = [
            &[
                "qdisc", "add", "dev", port, "parent", "1:1", "handle", "10:", "htb", "default",
                "2",
            ],
            &[
                "class", "add", "dev", port, "parent", "10:", "classid", "10:1", "htb", "rate",
                "1gbit", "quantum", "60000", "prio", "0",
            ],
            &[
                "class", "add", "dev", port, "parent", "10:", "classid", "10:2", "htb", "rate",
                "1gbit", "quantum", "60000", "prio", "1",
            ],
            &[
                "qdisc", "add", "dev", port, "parent", "10:1", "handle", "11:", "pfifo", "limit",
                "64",
            ],
            &[
                "qdisc", "add", "dev", port, "parent", "10:2", "handle", "12:", "bfifo", "limit",
                &limit,
            ],
            &[
                "filter", "add", "dev", port, "parent", "10:", "protocol", "ip", "prio", "1",
                "u32", "match", "ip", "dsfield", "0xb8", "0xfc", "flowid", "10:1",
            ],
        ];
        let commands = std::iter::once(&tbf[..])
            .chain(if fifo { &[][..] } else { &priority[..] }.iter().copied());
        for command in commands {
            let args: Vec<&str> = ["-n", hub].iter().chain(command).copied().collect();
            if let Err(e) = run("tc", &args) {
                panic!("the bottleneck could not be installed, so it was NOT tested: {e}");
            }
        }
        Bottleneck {
            hub: hub.to_owned(),
            port: port.to_owned(),
            priority: !fifo,
        }
    }

    /// Packets the priority band has sent (DCQs and UCAs marked by the runtime), `None`
    /// without it.
    fn priority_sent(&self) -> Option<u64> {
        if !self.priority {
            return None;
        }
        let out = run(
            "tc",
            &["-n", &self.hub, "-s", "qdisc", "show", "dev", &self.port],
        )
        .ok()?;
        // "qdisc pfifo 11: parent 10:1 limit 64p\n Sent 123 bytes 45 pkt (dropped 0, ..."
        let band = &out[out.find("qdisc pfifo 11:")?..];
        let at = band.find("bytes")? + "bytes".len();
        band[at..].split_whitespace().next()?.parse().ok()
    }

    /// The qdisc's counters now: (backlog bytes, packets dropped, packets sent).
    fn sample(&self) -> Option<(u64, u64, u64)> {
        let out = run(
            "tc",
            &["-n", &self.hub, "-s", "qdisc", "show", "dev", &self.port],
        )
        .ok()?;
        // "Sent 123 bytes 45 pkt (dropped 6, overlimits 7 requeues 0)\n backlog 8b 9p ..."
        let number_after = |key: &str| -> Option<u64> {
            let at = out.find(key)? + key.len();
            out[at..]
                .trim_start()
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        };
        let sent = {
            let at = out.find("bytes")? + "bytes".len();
            out[at..].split_whitespace().next()?.parse().ok()?
        };
        Some((number_after("backlog")?, number_after("dropped")?, sent))
    }
}

impl Drop for Bottleneck {
    fn drop(&mut self) {
        let _ = run(
            "tc",
            &["-n", &self.hub, "qdisc", "del", "dev", &self.port, "root"],
        );
    }
}

/// A series of one node, by name: its first bin and values.
type Series = BTreeMap<(u32, String), (u64, Vec<u64>)>;

/// What one run measured.
#[derive(Debug)]
struct Outcome {
    /// Every `CHILD-RESULT` line, by node.
    results: Vec<String>,
    /// Messages published.
    published: u64,
    /// The steady part, in bins: [from, to).
    steady: (u64, u64),
    series: Series,
    /// tbf samples after the onset: (bin, backlog bytes, dropped packets, sent packets).
    tbf: Vec<(u64, u64, u64, u64)>,
    /// Packets the bottleneck's priority band sent (marked DCQs and UCAs), if it had one.
    priority_sent: Option<u64>,
    /// Wall time of the run, from GO to the last result.
    duration: Duration,
}

impl Outcome {
    fn verdict(&self, node: u32) -> &str {
        self.results
            .iter()
            .find(|r| r.starts_with(&format!("CHILD-RESULT {node} ")))
            .and_then(|r| r.split_whitespace().nth(2))
            .unwrap_or("no-result")
    }

    /// Mean per second of a series over the steady part.
    fn steady_rate(&self, node: u32, name: &str) -> f64 {
        let Some((first, values)) = self.series.get(&(node, name.to_owned())) else {
            return 0.0;
        };
        let (from, to) = self.steady;
        let sum: u64 = (from..to)
            .filter_map(|b| values.get(usize::try_from(b.checked_sub(*first)?).ok()?))
            .sum();
        sum as f64 / ((to - from) * BIN_MS) as f64 * 1000.0
    }

    /// Largest value of a series over the steady part.
    fn steady_max(&self, node: u32, name: &str) -> u64 {
        let Some((first, values)) = self.series.get(&(node, name.to_owned())) else {
            return 0;
        };
        let (from, to) = self.steady;
        (from..to)
            .filter_map(|b| values.get(usize::try_from(b.checked_sub(*first)?).ok()?))
            .copied()
            .max()
            .unwrap_or(0)
    }

    /// Largest tbf backlog in bytes: over the whole run, over the steady part.
    fn backlog_max(&self) -> (u64, u64) {
        let all = self.tbf.iter().map(|s| s.1).max().unwrap_or(0);
        let steady = self
            .tbf
            .iter()
            .filter(|s| s.0 >= self.steady.0 && s.0 < self.steady.1)
            .map(|s| s.1)
            .max()
            .unwrap_or(0);
        (all, steady)
    }

    /// Median tbf backlog in bytes over the steady part.
    fn backlog_median_steady(&self) -> u64 {
        let mut steady: Vec<u64> = self
            .tbf
            .iter()
            .filter(|s| s.0 >= self.steady.0 && s.0 < self.steady.1)
            .map(|s| s.1)
            .collect();
        steady.sort_unstable();
        steady.get(steady.len() / 2).copied().unwrap_or(0)
    }

    /// tbf drops and packets sent: over the whole run, over the steady part.
    fn tbf_counts(&self) -> ((u64, u64), (u64, u64)) {
        let last = self.tbf.last().map_or((0, 0), |s| (s.2, s.3));
        let in_steady: Vec<_> = self
            .tbf
            .iter()
            .filter(|s| s.0 >= self.steady.0 && s.0 < self.steady.1)
            .collect();
        let steady = match (in_steady.first(), in_steady.last()) {
            (Some(a), Some(b)) => (b.2 - a.2, b.3 - a.3),
            _ => (0, 0),
        };
        (last, steady)
    }

    /// The run second by second from the publisher's first bin (printed by the tests, for the
    /// record): published, PDCC rate (last sample), unstable (last), delivered at the victim and
    /// at another subscriber, tbf backlog (largest) and drops.
    fn table(&self) -> String {
        let at = |node: u32, name: &str, bin: u64| -> Option<u64> {
            let (first, values) = self.series.get(&(node, name.to_owned()))?;
            values
                .get(usize::try_from(bin.checked_sub(*first)?).ok()?)
                .copied()
        };
        let Some(&(start, _)) = self.series.get(&(0, "published".to_owned())) else {
            return String::new();
        };
        let per_s = 1000 / BIN_MS;
        let mut out =
            String::from("t_s published pdcc_rate unstable victim other backlog_kib tbf_drops\n");
        let mut drops_before = 0;
        for second in 0.. {
            let bins: Vec<u64> = (start + second * per_s..start + (second + 1) * per_s).collect();
            let sum = |node, name| bins.iter().filter_map(|&b| at(node, name, b)).sum::<u64>();
            let last = |node, name| bins.iter().rev().find_map(|&b| at(node, name, b));
            let tbf: Vec<_> = self.tbf.iter().filter(|s| bins.contains(&s.0)).collect();
            let victim = sum(VICTIM, "delivered");
            if victim == 0 && sum(2, "delivered") == 0 && second > 5 {
                break;
            }
            let drops = tbf.last().map_or(drops_before, |s| s.2);
            out += &format!(
                "{second} {} {} {} {victim} {} {} {}\n",
                sum(0, "published"),
                last(0, "rate").unwrap_or(0),
                last(0, "unstable").unwrap_or(0),
                sum(2, "delivered"),
                tbf.iter().map(|s| s.1).max().unwrap_or(0) >> 10,
                drops - drops_before,
            );
            drops_before = drops;
        }
        out
    }

    fn summary(&self, congestion_control: bool) -> String {
        let bottleneck = bottleneck_msgs_per_s();
        let victim = self.steady_rate(VICTIM, "delivered");
        let other = self.steady_rate(2, "delivered");
        let published = self.steady_rate(0, "published");
        let (backlog_all, backlog_steady) = self.backlog_max();
        let ((drops, sent), (drops_steady, sent_steady)) = self.tbf_counts();
        let unstable_max = self.results.first().map_or(0, |r| field(r, "unstable max"));
        format!(
            "congestion control {}: duration {:.1} s, published {} messages; steady part \
             ({:.1} s): victim goodput {victim:.0} msgs/s = {:.0}% of the bottleneck \
             ({bottleneck:.0} msgs/s), other subscriber {other:.0} msgs/s, publish rate \
             {published:.0} msgs/s = {:.0}% of the bottleneck, largest PDCC rate {} msgs/s, \
             largest unstable {} msgs (whole run {unstable_max}); tbf backlog max {} KiB (whole \
             run {} KiB, steady median {} KiB), tbf drops {drops_steady} of {sent_steady} sent (whole run {drops} of \
             {sent}); marked datagrams sent first: {}; verdicts: publisher {}, victim {}, \
             others {} {}",
            if congestion_control { "on" } else { "off" },
            self.duration.as_secs_f64(),
            self.published,
            ((self.steady.1 - self.steady.0) * BIN_MS) as f64 / 1000.0,
            victim / bottleneck * 100.0,
            published / bottleneck * 100.0,
            self.steady_max(0, "rate"),
            self.steady_max(0, "unstable"),
            backlog_steady >> 10,
            backlog_all >> 10,
            self.backlog_median_steady() >> 10,
            self.priority_sent
                .map_or_else(|| "no priority band".to_owned(), |n| n.to_string()),
            self.verdict(0),
            self.verdict(VICTIM),
            self.verdict(2),
            self.verdict(3),
        )
    }
}

/// Runs the experiment once: namespaces, children, the bottleneck at the onset, everything
/// measured; cleaned up before it returns (or by the guards, if it panics).
fn run_experiment(congestion_control: bool) -> Outcome {
    let namespaces = Namespaces::create(SUBSCRIBERS + 1, "the bottleneck experiment");
    let (tx, rx) = mpsc::channel();
    let mut children = Children(
        (0..=SUBSCRIBERS)
            .map(|i| {
                let value = format!("{i} {}", u8::from(congestion_control));
                spawn_in(
                    &namespaces.nodes[i as usize],
                    "child_bottleneck_node",
                    (CHILD, &value),
                    tx.clone(),
                )
            })
            .collect(),
    );
    drop(tx);
    let mut ready = 0;
    while ready <= SUBSCRIBERS {
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(line) if line.starts_with("CHILD-READY") => ready += 1,
            Ok(line) => panic!("a child failed before it was ready: {line}"),
            Err(e) => panic!("children not ready in time ({ready} of 4): {e}"),
        }
    }
    let started = tidings_runtime::now();
    let send = |children: &mut Children, i: usize, line: &str| {
        let stdin = children.0[i].stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    };
    send(&mut children, 0, "GO");
    std::thread::sleep(ONSET);
    let bottleneck = Arc::new(Bottleneck::install(
        &namespaces.hub,
        &Namespaces::port(VICTIM),
    ));
    let onset_bin = unix_ms() / BIN_MS;
    // Sample the token bucket every bin until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (bottleneck, stop) = (Arc::clone(&bottleneck), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut samples = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                if let Some((backlog, dropped, sent)) = bottleneck.sample() {
                    samples.push((unix_ms() / BIN_MS, backlog, dropped, sent));
                }
                std::thread::sleep(Duration::from_millis(BIN_MS));
            }
            samples
        })
    };
    let mut results = Vec::new();
    let mut series = Series::new();
    let mut published = None;
    let deadline = started + ONSET + PUBLISHING + TIMEOUT;
    while results.len() <= SUBSCRIBERS as usize {
        let left = deadline.saturating_duration_since(tidings_runtime::now());
        let line = match rx.recv_timeout(left) {
            Ok(line) => line,
            Err(e) => {
                eprintln!("results missing ({e}): {results:?}");
                break;
            }
        };
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["CHILD-PUBLISHED", n, end_bin] => {
                published = Some((n.parse::<u64>().unwrap(), end_bin.parse::<u64>().unwrap()));
                for i in 1..=SUBSCRIBERS {
                    send(&mut children, i as usize, &format!("EXPECT {n}"));
                }
            }
            ["CHILD-SERIES", node, name, first, rest @ ..] => {
                let values = rest
                    .first()
                    .map(|v| v.split(',').map(|x| x.parse().unwrap()).collect())
                    .unwrap_or_default();
                series.insert(
                    (node.parse().unwrap(), (*name).to_owned()),
                    (first.parse().unwrap(), values),
                );
            }
            ["CHILD-RESULT", ..] => results.push(line.clone()),
            _ => {}
        }
    }
    let duration = tidings_runtime::now() - started;
    stop.store(true, Ordering::Relaxed);
    let tbf = sampler.join().unwrap();
    let priority_sent = bottleneck.priority_sent();
    drop(bottleneck);
    drop(children);
    drop(namespaces);
    results.sort();
    let (published, end_bin) = published.unwrap_or((0, onset_bin));
    let steady_from = onset_bin + STEADY_AFTER_ONSET.as_millis() as u64 / BIN_MS;
    Outcome {
        results,
        published,
        steady: (steady_from, end_bin.max(steady_from + 1)),
        series,
        tbf,
        priority_sent,
        duration,
    }
}

#[test]
fn bottleneck_with_congestion_control() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    let outcome = run_experiment(true);
    let summary = outcome.summary(true);
    eprintln!("{}{summary}\n{:#?}", outcome.table(), outcome.results);
    let bottleneck = bottleneck_msgs_per_s();
    // Complete delivery, and everything stable.
    for node in 0..=SUBSCRIBERS {
        assert_eq!(outcome.verdict(node), "ok", "node {node}: {summary}");
    }
    // No collapse: the victim gets most of its link, and the publisher follows the bottleneck.
    let victim = outcome.steady_rate(VICTIM, "delivered") / bottleneck;
    assert!(victim >= 0.8, "victim's goodput too low: {summary}");
    let published = outcome.steady_rate(0, "published") / bottleneck;
    assert!(
        (0.75..=1.1).contains(&published),
        "the publish rate does not follow the bottleneck: {summary}"
    );
    // Bounded queues: in the steady part the token bucket overflows at most rarely (PDCC cuts
    // the rate before its queue is full: the largest backlog is printed, it has been 400-485 KiB
    // of 512), it is mostly far from full, and the publisher's unstable messages stay far below
    // its window (16,384).
    assert!(
        outcome.backlog_median_steady() < TBF_LIMIT_BYTES / 2,
        "tbf backlog: {summary}"
    );
    let (_, (drops, sent)) = outcome.tbf_counts();
    assert!(drops * 100 <= sent, "tbf drops: {summary}");
    assert!(
        outcome.steady_max(0, "unstable") < 4000,
        "unstable window: {summary}"
    );
    // The publisher's DCQs cross the victim's port marked, so its priority band carried them.
    if let Some(sent) = outcome.priority_sent {
        assert!(
            sent > 0,
            "no marked datagram reached the priority band: {summary}"
        );
    }
}

#[test]
#[ignore = "shows the collapse without congestion control; about 90 s"]
fn bottleneck_without_congestion_control() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    let outcome = run_experiment(false);
    let summary = outcome.summary(false);
    eprintln!("{}{summary}\n{:#?}", outcome.table(), outcome.results);
    let bottleneck = bottleneck_msgs_per_s();
    let victim = outcome.steady_rate(VICTIM, "delivered") / bottleneck;
    let published = outcome.steady_rate(0, "published") / bottleneck;
    let complete = (0..=SUBSCRIBERS).all(|n| outcome.verdict(n) == "ok");
    // The collapse: the victim's queue stays full, repairs join it, stability stalls, the
    // publisher's window fills and every subscriber waits for the victim.
    assert!(
        victim < 0.7 || published < 0.7 || !complete,
        "without congestion control the bottleneck was expected to collapse: {summary}"
    );
}
