//! The result of a run: what the CLI prints (text or one JSON object) and what sweeps check.
//! Nothing here depends on wall-clock time, so the same seed prints the same bytes.

use std::fmt::Write as _;

use serde::Serialize;
use tidings_proto::Membership;

use crate::checker::Ledger;
use crate::scenario::{percentiles_ms, recovery_totals, Scenario, SimHost};
use crate::world::{DropCounts, World};

/// Percentiles of a distribution, in milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest value.
    pub max: f64,
    /// Number of samples.
    pub count: u64,
}

/// Recovery work summed over all nodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Recovery {
    /// Pull requests to caching members or ring neighbours.
    pub pulls_sent: u64,
    /// Messages senders sent again into the regions of their topics after a view change.
    pub messages_rehomed: u64,
    /// Region states that went on into a view that only added topics or dropped topics every
    /// member left (ADR 30), all nodes.
    pub views_continued: u64,
    /// Pull requests to senders (after caching members did not answer).
    pub pulls_to_sender: u64,
    /// Sequence numbers requested in pulls.
    pub pull_seqs_requested: u64,
    /// Messages that arrived by retransmission and filled a gap.
    pub repairs_received: u64,
    /// Messages pushed to ring neighbours after token comparison.
    pub messages_pushed: u64,
    /// Messages resent in answer to pulls.
    pub messages_resent_on_pull: u64,
    /// Messages re-multicast by senders after region NAKs.
    pub messages_resent_on_nak: u64,
    /// NAKs sent by region leaders.
    pub naks_sent: u64,
    /// ACKs sent by region leaders.
    pub acks_sent: u64,
    /// Token rounds given up (token lost or late).
    pub tokens_lost: u64,
    /// Tokens resent to a ring member that did not confirm them.
    pub tokens_resent: u64,
    /// Ring members reported as suspected.
    pub suspicions: u64,
    /// Congestion alerts that reached senders (PDCC).
    pub ucas_received: u64,
    /// Publishes refused by the congestion-controlled rate (the publisher waited).
    pub publish_rate_limited: u64,
    /// Token rounds completed, all rings.
    pub token_rounds_completed: u64,
    /// Duplicate messages dropped by receivers.
    pub duplicates_dropped: u64,
    /// Messages dropped beyond receive windows.
    pub out_of_window_dropped: u64,
    /// Requested messages the asked node no longer held.
    pub repair_misses: u64,
    /// Retransmission requests refused for a full queue.
    pub repair_queue_overflows: u64,
    /// Queued retransmissions dropped for waiting too long.
    pub repair_queue_expired: u64,
    /// Malformed or invalid datagrams dropped.
    pub malformed_dropped: u64,
}

/// Everything a run measured.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunReport {
    /// "pass" if the checker found nothing wrong, else "fail".
    pub verdict: &'static str,
    /// The first violations found.
    pub violations: Vec<String>,
    /// How many violations there were.
    pub violation_count: u64,
    /// The command that replays this run.
    pub replay: String,
    /// Seed.
    pub seed: u64,
    /// Nodes.
    pub nodes: u32,
    /// Senders.
    pub senders: u32,
    /// Topics.
    pub topics: u32,
    /// Regions formed.
    pub regions: usize,
    /// Members of the largest region.
    pub region_size_max: usize,
    /// The fault specification.
    pub loss: String,
    /// Seconds of publishing.
    pub seconds: f64,
    /// Simulated seconds until everything was stable (null if it never was).
    pub completion_seconds: Option<f64>,
    /// Messages published.
    pub messages_published: u64,
    /// Messages delivered, all receivers.
    pub deliveries: u64,
    /// Messages received and discarded on topics the receiver does not subscribe to
    /// (approximate regions, ADR 34), all receivers.
    pub messages_filtered: u64,
    /// Their payload bytes.
    pub bytes_filtered: u64,
    /// Messages made stable (delivered to every subscriber) per second, all senders, from the
    /// first publish until everything was stable.
    pub throughput_msgs_per_sec: f64,
    /// The same in payload megabytes per second.
    pub throughput_mb_per_sec: f64,
    /// Publish to stable.
    pub time_to_stable_ms: Percentiles,
    /// Publish to delivery, all receivers.
    pub latency_ms: Percentiles,
    /// Round trip of region-level (top) rings.
    pub token_rtt_ms: Percentiles,
    /// Round trip of partition (and intermediate) rings.
    pub partition_token_rtt_ms: Percentiles,
    /// Most messages any sender held pending ACK at any time.
    pub pending_ack_max: u64,
    /// Mean over 100 ms samples of messages pending ACK per sender.
    pub pending_ack_mean: f64,
    /// Largest share of the messages it received that any receiver cached.
    pub cache_fraction_max: f64,
    /// Mean of that share over receivers.
    pub cache_fraction_mean: f64,
    /// Share each node cached (0 for nodes that received nothing).
    pub cache_fraction_per_node: Vec<f64>,
    /// Recovery work.
    pub recovery: Recovery,
    /// Datagrams the network lost, by cause, all nodes.
    pub network_drops: DropCounts,
    /// Memberships installed during the run (view changes): with the oracle, installs on every
    /// node at once; with the GMS, turns of the GMS node in which it issued new views.
    pub view_changes: u64,
    /// Per view change, the time until every live subscriber delivered again.
    pub view_change_pause_ms: Percentiles,
    /// With a slow consumer ([`Scenario::slow_consumer`](crate::Scenario::slow_consumer)):
    /// messages of streams without the held topic its node delivered during the hold.
    pub delivered_beside_hold: u64,
    /// The membership service: "oracle" or "gms".
    pub membership: &'static str,
    /// With the GMS: per crash, the time until the GMS removed the node (zero samples with the
    /// oracle, whose delay is the scenario's `detection`).
    pub crash_detection_ms: Percentiles,
    /// With a fault of the replicated GMS: from the fault to the next replica that began to
    /// lead (ms), if one did after it.
    pub gms_fault_to_leader_ms: Option<f64>,
    /// With a fault of the replicated GMS: from the fault to the first view issued after it
    /// (ms), if one was.
    pub gms_fault_to_view_ms: Option<f64>,
    /// The membership events of the run.
    pub churn: Vec<String>,
    /// With the attacker: what it sent and what was refused.
    pub attack: Option<crate::attack::AttackReport>,
    /// Deliveries of payloads the attacker forged (each a violation).
    pub forged_delivered: u64,
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn round6(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

impl RunReport {
    pub(crate) fn build(
        s: &Scenario,
        world: &World<SimHost>,
        ledger: &Ledger,
        membership: &Membership,
        pending_samples: &[u64],
        completion: Option<tidings_proto::Time>,
    ) -> RunReport {
        let mut violations: Vec<String> = ledger.violations().0.to_vec();
        let mut violation_count = ledger.violations().1;
        let mut extra = |v: String, violations: &mut Vec<String>| {
            violation_count += 1;
            if violations.len() < 20 {
                violations.push(v);
            }
        };
        // Memory bounds: sender windows, and caching replicas of about replication / region size.
        let mut pending_ack_max = 0;
        let (mut messages_filtered, mut bytes_filtered) = (0u64, 0u64);
        let mut fractions = Vec::with_capacity(world.hosts().len());
        // Protocol nodes only (with the GMS, the last host runs the service).
        for (i, h) in world.hosts().iter().take(s.nodes as usize).enumerate() {
            let node = h.node();
            let st = node.stats();
            messages_filtered += st.messages_filtered;
            bytes_filtered += st.bytes_filtered;
            pending_ack_max = pending_ack_max.max(st.unstable_msgs_max);
            if st.unstable_msgs_max as usize > s.proto.window.msgs_max
                || st.unstable_bytes_max as usize > s.proto.window.bytes_max
            {
                extra(
                    format!(
                        "node {i} held {} unstable messages / {} bytes, beyond its window",
                        st.unstable_msgs_max, st.unstable_bytes_max
                    ),
                    &mut violations,
                );
            }
            let block = s.proto.cache_block_msgs;
            let (mut cached, mut received) = (0u64, 0u64);
            for r in node.stream_reports() {
                // The share is per region, in the node's own view of it: a node in several
                // regions caches for each.
                let partitions = r.partitions as u64;
                cached += r.cached_total;
                received += r.delivered_upto;
                let bound = (r.delivered_upto.div_ceil(block * partitions) + 1) * block;
                if r.cached_total > bound {
                    extra(format!("node {i} cached {} of {} messages of {}, beyond the cooperative share {bound}", r.cached_total, r.delivered_upto, r.origin), &mut violations);
                }
            }
            fractions.push(if received == 0 {
                0.0
            } else {
                round6(cached as f64 / received as f64)
            });
        }
        let receiving: Vec<f64> = fractions.iter().copied().filter(|&f| f > 0.0).collect();
        let cache_fraction_max = receiving.iter().copied().fold(0.0, f64::max);
        let cache_fraction_mean = if receiving.is_empty() {
            0.0
        } else {
            round6(receiving.iter().sum::<f64>() / receiving.len() as f64)
        };
        let mut drops = DropCounts::default();
        for n in &world.stats().nodes {
            let d = n.drops;
            drops.loss_up += d.loss_up;
            drops.loss_down += d.loss_down;
            drops.tail_drop_up += d.tail_drop_up;
            drops.tail_drop_down += d.tail_drop_down;
            drops.blackout += d.blackout;
            drops.socket_overflow += d.socket_overflow;
            drops.crashed += d.crashed;
        }
        let published = ledger.published_total();
        // Messages made stable (delivered everywhere) per second, from the first publish to the
        // moment the last became stable; publishing stops at `seconds` and queues drain after.
        let elapsed = completion.map_or(world.now().as_nanos() as f64 / 1e9, |t| {
            t.as_nanos() as f64 / 1e9
        });
        let throughput = ledger.stable_total() as f64 / elapsed.max(1e-9);
        RunReport {
            verdict: if violation_count == 0 { "pass" } else { "fail" },
            violations,
            violation_count,
            replay: s.replay_command(),
            seed: s.seed,
            nodes: s.nodes,
            senders: s.senders,
            topics: s.topics,
            regions: membership.regions.len(),
            region_size_max: membership
                .regions
                .values()
                .map(|r| r.member_count())
                .max()
                .unwrap_or(0),
            loss: s.faults.to_string(),
            seconds: s.seconds,
            completion_seconds: completion.map(|t| round3(t.as_nanos() as f64 / 1e9)),
            messages_published: published,
            deliveries: ledger.deliveries(),
            messages_filtered,
            bytes_filtered,
            throughput_msgs_per_sec: round3(throughput),
            throughput_mb_per_sec: round3(throughput * s.message_bytes as f64 / 1e6),
            time_to_stable_ms: percentiles_ms(&ledger.time_to_stable_us),
            latency_ms: percentiles_ms(&ledger.latency_us),
            token_rtt_ms: percentiles_ms(&ledger.token_rtt_us),
            partition_token_rtt_ms: percentiles_ms(&ledger.partition_token_rtt_us),
            pending_ack_max,
            pending_ack_mean: if pending_samples.is_empty() {
                0.0
            } else {
                round3(pending_samples.iter().sum::<u64>() as f64 / pending_samples.len() as f64)
            },
            cache_fraction_max,
            cache_fraction_mean,
            cache_fraction_per_node: fractions,
            recovery: recovery_totals(world),
            network_drops: drops,
            view_changes: 0,
            view_change_pause_ms: percentiles_ms(&ledger.view_change_pause_us),
            delivered_beside_hold: ledger.delivered_beside_holds,
            membership: "oracle",
            crash_detection_ms: Percentiles::default(),
            gms_fault_to_leader_ms: None,
            gms_fault_to_view_ms: None,
            churn: Vec::new(),
            attack: None,
            forged_delivered: ledger.forged_delivered(),
        }
    }

    /// Whether the checker passed.
    #[must_use]
    pub fn passed(&self) -> bool {
        self.verdict == "pass"
    }

    /// One JSON object.
    #[must_use]
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// A human-readable summary.
    #[must_use]
    pub fn to_text(&self) -> String {
        let mut o = String::new();
        let p = |x: &Percentiles| {
            format!(
                "p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
                x.p50, x.p99, x.max
            )
        };
        let _ = writeln!(o, "scenario      {} nodes, {} sender(s), {} topic(s) in {} region(s) (largest {}), loss {}, {} s, seed {}",
            self.nodes, self.senders, self.topics, self.regions, self.region_size_max, self.loss, self.seconds, self.seed);
        let _ = writeln!(
            o,
            "throughput    {:.0} msgs/s ({:.2} MB/s), {} published, {} deliveries",
            self.throughput_msgs_per_sec,
            self.throughput_mb_per_sec,
            self.messages_published,
            self.deliveries
        );
        if self.messages_filtered > 0 {
            let _ = writeln!(
                o,
                "approximate   {} messages ({} bytes) received on topics not subscribed, discarded ({:.1}% of what receivers kept)",
                self.messages_filtered,
                self.bytes_filtered,
                100.0 * self.messages_filtered as f64
                    / (self.messages_filtered + self.deliveries).max(1) as f64
            );
        }
        match self.completion_seconds {
            Some(c) => {
                let _ = writeln!(o, "completion    everything stable at {c:.1} s");
            }
            None => {
                let _ = writeln!(o, "completion    NOT everything became stable");
            }
        }
        let _ = writeln!(o, "time to stable {}", p(&self.time_to_stable_ms));
        let _ = writeln!(o, "latency       {}", p(&self.latency_ms));
        let _ = writeln!(
            o,
            "token rtt     region {}; partition {}",
            p(&self.token_rtt_ms),
            p(&self.partition_token_rtt_ms)
        );
        let _ = writeln!(
            o,
            "pending ack   max {}, mean {:.0}",
            self.pending_ack_max, self.pending_ack_mean
        );
        let receiving: Vec<f64> = self
            .cache_fraction_per_node
            .iter()
            .copied()
            .filter(|&f| f > 0.0)
            .collect();
        let min = receiving.iter().copied().fold(f64::INFINITY, f64::min);
        let _ = writeln!(
            o,
            "cache         per receiver min {:.2}%, mean {:.2}%, max {:.2}% of messages",
            if receiving.is_empty() {
                0.0
            } else {
                min * 100.0
            },
            self.cache_fraction_mean * 100.0,
            self.cache_fraction_max * 100.0
        );
        let r = &self.recovery;
        let _ = writeln!(o, "recovery      {} repaired; pulls {} (+{} to senders) for {} seqs; pushed {}, resent on pull {}, on NAK {}; NAKs {}; tokens lost {}; duplicates {}",
            r.repairs_received, r.pulls_sent, r.pulls_to_sender, r.pull_seqs_requested, r.messages_pushed, r.messages_resent_on_pull, r.messages_resent_on_nak, r.naks_sent, r.tokens_lost, r.duplicates_dropped);
        let d = &self.network_drops;
        let _ = writeln!(o, "network drops loss {} up / {} down, tail drop {} up / {} down, blackout {}, socket overflow {}",
            d.loss_up, d.loss_down, d.tail_drop_up, d.tail_drop_down, d.blackout, d.socket_overflow);
        if self.view_changes > 0 {
            let _ = writeln!(
                o,
                "membership    {} view change(s), pause until every subscriber delivers again {}",
                self.view_changes,
                p(&self.view_change_pause_ms)
            );
            if self.crash_detection_ms.count > 0 {
                let _ = writeln!(
                    o,
                    "membership    ({}) crash to removal {}",
                    self.membership,
                    p(&self.crash_detection_ms)
                );
            }
            if let Some(ms) = self.gms_fault_to_leader_ms {
                let view = self
                    .gms_fault_to_view_ms
                    .map_or("none".to_owned(), |v| format!("{v:.1} ms"));
                let _ = writeln!(
                    o,
                    "membership    GMS fault to a new leader {ms:.1} ms, to the first view after it {view}"
                );
            }
            for c in &self.churn {
                let _ = writeln!(o, "  churn {c}");
            }
        }
        if let Some(a) = &self.attack {
            let (t, f) = (&a.sent, &a.refused);
            let _ = writeln!(
                o,
                "forged        {} delivered (must be 0)",
                self.forged_delivered
            );
            let _ = writeln!(
                o,
                "attacker      captured {}, join datagrams {} (refused: {}, joined: {}), replayed {}, forged data {}, control {}, under random key ids {}, GMS requests {}, under the removed member's key {}, in another region under its key {}",
                t.captured, t.join_datagrams, t.join_refused, t.joined, t.replayed, t.forged_data,
                t.forged_control, t.forged_unknown_key, t.forged_gms, t.old_key, t.cross_region
            );
            let _ = writeln!(
                o,
                "refused       members: bad tag {}, unknown key {}, retired key {}, replayed {}, too old {}, sender mismatch {}, malformed {}; GMS link: not admitted {}, plain {}, bad hellos {}, refused {}, no session {}; members' GMS links refused {}",
                f.bad_tag, f.unknown_key, f.retired_key, f.replayed, f.too_old, f.sender_mismatch,
                f.malformed, a.gms_not_admitted, a.gms_plain_dropped, a.gms_bad_hellos,
                a.gms_refused, a.gms_no_session, a.members_gms_refused
            );
        }
        let _ = writeln!(
            o,
            "verdict       {} ({} violation(s))",
            self.verdict, self.violation_count
        );
        for v in &self.violations {
            let _ = writeln!(o, "  - {v}");
        }
        if !self.passed() {
            let _ = writeln!(o, "replay        {}", self.replay);
        }
        o
    }
}
