//! Counters of the core thread (STYLE.md item 11), in the spirit of Aeron's system counters.

use std::time::Duration;

/// Buckets of the per-second maxima histograms: bucket `i` counts seconds whose maximum was in
/// `[2^i, 2^(i+1))` microseconds (bucket 0 also takes maxima under 1 µs); the last bucket takes
/// everything from about 8.4 s up.
pub const HISTOGRAM_BUCKETS: usize = 24;

/// The maximum of a quantity in each one-second interval, as paper 000 plots alarm delays
/// (Figures 34-35): the largest ever, the last complete second's, and a log2 histogram of all
/// the seconds' maxima.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MaxPerSecond {
    /// Largest value ever seen, in microseconds.
    pub max_us: u64,
    /// Largest value in the last complete one-second interval, in microseconds.
    pub last_second_max_us: u64,
    /// Completed one-second intervals in which at least one value was seen.
    pub seconds: u64,
    /// Counts of per-second maxima by magnitude (see [`HISTOGRAM_BUCKETS`]).
    pub histogram_log2_us: [u64; HISTOGRAM_BUCKETS],
    /// Largest value in the current (incomplete) interval.
    current_max_us: u64,
    /// Whether the current interval has seen a value.
    current_seen: bool,
}

impl MaxPerSecond {
    /// Records one value.
    pub(crate) fn record(&mut self, value: Duration) {
        let us = u64::try_from(value.as_micros()).unwrap_or(u64::MAX);
        self.max_us = self.max_us.max(us);
        self.current_max_us = self.current_max_us.max(us);
        self.current_seen = true;
    }

    /// Closes the current one-second interval.
    pub(crate) fn roll(&mut self) {
        if !self.current_seen {
            self.last_second_max_us = 0;
            return;
        }
        let us = self.current_max_us;
        let bucket = (u64::BITS - us.max(1).leading_zeros() - 1) as usize;
        self.histogram_log2_us[bucket.min(HISTOGRAM_BUCKETS - 1)] += 1;
        self.last_second_max_us = us;
        self.seconds += 1;
        self.current_max_us = 0;
        self.current_seen = false;
    }

    /// The lower edge of histogram bucket `i`, in microseconds (for printing).
    #[must_use]
    pub fn bucket_floor_us(i: usize) -> u64 {
        if i == 0 {
            0
        } else {
            1u64 << i.min(63)
        }
    }
}

/// Counters of the sealing of protocol datagrams (all zero with sealing off).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SealingStats {
    /// Protocol datagrams sealed.
    pub sealed: u64,
    /// Protocol datagrams dropped because they could not be sealed (no key from the service
    /// yet); the protocol recovers them as lost ones.
    pub unsealed_dropped: u64,
    /// Received datagrams opened, and refused by cause (bad tag, unknown key, retired key,
    /// replayed ...): a refused one never reaches the protocol.
    pub open: tidings_seal::OpenStats,
    /// Received datagrams copied before opening in place (their buffer was shared).
    pub open_copies: u64,
    /// Blocks allocated for those copies, reused once their datagrams are dropped.
    pub open_blocks_allocated: u64,
    /// Datagram keys installed.
    pub keys_installed: u64,
    /// Replaced keys retired after their grace.
    pub keys_retired: u64,
    /// Renewals of the datagram key asked of the service (once per key, when its counter
    /// nears its limit).
    pub key_renewals_asked: u64,
    /// The newest key id this node seals with now, over its regions (ADR 43: a key per
    /// region; ids grow with every key the service makes).
    pub key_id: Option<u32>,
}

/// The counters of one node's runtime. Monotonic unless the name says otherwise.
#[derive(Clone, Debug, Default)]
pub struct RuntimeStats {
    /// Rounds of the core loop (one wait in the kernel, or none, plus the work that followed).
    pub cycles: u64,
    /// Time from the end of a wait in the kernel to the start of the next, per cycle: how long
    /// the core thread is deaf to new events.
    pub cycle_time: MaxPerSecond,
    /// How late protocol alarms fired after their deadline (paper 000 Figures 34-35).
    pub alarm_lateness: MaxPerSecond,
    /// Protocol alarms fired (`handle_timeout` calls).
    pub alarms_fired: u64,
    /// I/O phases cut short by the I/O quantum (work was left).
    pub io_quantum_expired: u64,
    /// Alarm phases cut short by the alarm quantum.
    pub alarm_quantum_expired: u64,
    /// Times the core thread slept in the kernel with nothing to do.
    pub sleeps: u64,

    /// Receive system calls (each returns up to a batch of datagrams).
    pub recv_calls: u64,
    /// Datagrams received (after splitting coalesced GRO buffers).
    pub datagrams_received: u64,
    /// Bytes received.
    pub bytes_received: u64,
    /// Received datagrams dropped on purpose (`RuntimeConfig::receive_loss`).
    pub injected_drops: u64,
    /// Datagrams the kernel dropped on arrival at this node's sockets because their receive
    /// buffers were full (Linux: the `drops` of each socket in `/proc/net/udp`, read when the
    /// statistics are asked for; 0 where unknown). What the protocol must then repair: a
    /// sender outrunning this node, or the node's threads starved of CPU.
    pub kernel_drops: u64,
    /// Received datagrams that are not tidings packets (wrong magic, version or kind), dropped
    /// before the protocol sees them.
    pub invalid_packets: u64,
    /// Received datagrams processed per priority class: control, recovery, data.
    pub received_by_priority: [u64; 3],
    /// Receive errors other than "would block".
    pub recv_errors: u64,

    /// Send system calls.
    pub send_calls: u64,
    /// Datagrams sent (each copy of a fan-out counts).
    pub datagrams_sent: u64,
    /// Bytes sent.
    pub bytes_sent: u64,
    /// Send calls that found the socket buffer full ("would block"); the rest of the batch
    /// waited for the socket to become writable.
    pub short_sends: u64,
    /// Datagrams that could not be sent (an error other than "would block"), dropped; the
    /// protocol recovers them like losses.
    pub send_errors: u64,
    /// Datagrams for a node or region without a known address, dropped.
    pub unroutable: u64,
    /// Congestion control datagrams sent (DCQs, UCAs), each copy counted: those sent with
    /// `control_dscp` when it is set.
    pub control_datagrams_sent: u64,
    /// Times the kernel refused to set the TOS byte for them (those left unmarked).
    pub tos_errors: u64,

    /// Publish requests taken from application threads.
    pub publishes: u64,
    /// Times a publisher's queue was held because the protocol refused more (back pressure).
    pub publish_stalls: u64,
    /// Times a publisher's queue was held because congestion control's publish rate did not
    /// admit the next message yet.
    pub publish_rate_limited: u64,
    /// Publish requests the protocol refused although `can_publish` had admitted them (a bug
    /// if ever non-zero); the message is lost and its publisher's stability stops advancing.
    pub publish_refused: u64,
    /// Publish requests waiting in publisher queues (or held by back pressure), now.
    pub publish_queued_current: u64,
    /// Bytes of publish requests counted against `RuntimeConfig::publish_queued_node_bytes_max`,
    /// now (the requests of `publish_queued_current`, each its payload plus 64 bytes).
    pub publish_queued_node_bytes_current: u64,
    /// Times a blocking publish found the node-wide bound on queued requests reached and
    /// waited for room (`try_publish` reports `WouldBlock` instead, uncounted).
    pub publish_node_bound_waits: u64,
    /// Publishers whose next request is held by back pressure, now.
    pub publishers_stalled_current: u64,
    /// Publishers the core thread serves (alive, or dropped with messages not yet stable), now.
    pub publishers_current: u64,
    /// Slots of storage all publisher queues hold, now (each starts small and grows only as
    /// far as its publisher fills it).
    pub publish_queue_slots_current: u64,
    /// Times more publishers turned busy between two turns than the ready list holds, so the
    /// core thread looked at every publisher once.
    pub publisher_ready_overflows: u64,
    /// Messages delivered to subscription tasks.
    pub deliveries: u64,
    /// Deliveries for topics no subscription of this process listens to, dropped.
    pub deliveries_unsubscribed: u64,
    /// Times a delivery found a subscription without room (its reader's capacity reached, or
    /// its task's queue full) and its topic was held (or, for a group subscription's shared
    /// task, the group's topics together): the topic's streams stop at this node, so their
    /// senders are slowed, while the other topics go on.
    pub delivery_stalls: u64,
    /// Times a held topic (or group) was released (its subscriptions had room again, or the
    /// full one was dropped).
    pub topic_releases: u64,
    /// Time topics spent held, summed over the releases.
    pub topic_held_time: std::time::Duration,
    /// Subscriptions dropped for staying without room longer than their `max_wait`.
    pub slow_consumer_disconnects: u64,
    /// The topics held now, because a subscription of theirs has no room (each on its own;
    /// the topics of a group held as one are in `held_groups`).
    pub held_topics: Vec<HeldTopicState>,
    /// Of `delivery_stalls`, the holds of a whole group subscription: its shared task had no
    /// room, and its topics were held together with one backlog.
    pub group_holds: u64,
    /// The group subscriptions held now, as one each.
    pub held_groups: Vec<HeldGroupState>,
    /// Publishes reported stable to their publishers.
    pub stable: u64,
    /// Protocol events other than deliveries and stability (token rounds, suspicions).
    pub other_events: u64,

    /// Kernel receive buffer granted for the unicast socket, in bytes.
    pub socket_recv_buffer_bytes: usize,
    /// Kernel send buffer granted for the unicast socket, in bytes.
    pub socket_send_buffer_bytes: usize,
    /// Most datagrams per GSO send the kernel accepts (1 without GSO).
    pub gso_segments_max: usize,
    /// Most datagrams the kernel coalesces per received buffer (1 without GRO).
    pub gro_segments: usize,
    /// Multicast groups joined now.
    pub groups_joined: usize,
    /// Times joining a region's multicast group failed (the subscriptions it carries were
    /// refused with the reason).
    pub groups_join_failed: u64,
    /// Sockets the joined groups share (several groups of a port per socket on Linux), now.
    pub group_sockets_current: usize,
    /// Regions of this node whose multicast group is not joined, now.
    pub groups_unjoined_current: usize,
    /// GMS datagrams received from the membership service (nodes that joined through one).
    pub gms_datagrams_received: u64,
    /// GMS datagrams sent to the membership service.
    pub gms_datagrams_sent: u64,
    /// GMS-framed datagrams from an address other than the service's, dropped.
    pub gms_foreign: u64,
    /// Memberships installed (from the GMS or `set_membership`).
    pub memberships_installed: u64,
    /// Suspicions of ring neighbours reported to the GMS.
    pub suspicions_reported: u64,
    /// Sealing of protocol datagrams (`GmsLinkConfig::sealing`): datagrams sealed, dropped
    /// unsealed, opened and refused by cause, keys installed and retired, the key in use.
    pub sealing: SealingStats,
    /// Regions reported stalled: they did not acknowledge a message of this node for
    /// `RuntimeConfig::stall_after`.
    pub stalls_reported: u64,
    /// The regions stalled now, with whom the messages wait for.
    pub stalls: Vec<tidings_gms::Stall>,
    /// The GMS removed this node (it left, or was declared failed); it no longer takes part.
    pub gms_removed: bool,
    /// Times this node joined the GMS again under a new id (the service lost it: restarted
    /// without its state), its subscriptions and publishers carried over.
    pub gms_rejoins: u64,
    /// Messages published under an old id that were not stable when the node joined again:
    /// given up (never sent again, so never delivered twice), and released from the
    /// publishers' windows as if stable.
    pub messages_abandoned: u64,
    /// Requests to the GMS not yet acknowledged by it, now.
    pub gms_requests_unacknowledged: usize,
    /// Requests to the GMS sent again (not acknowledged in time).
    pub gms_requests_retransmitted: u64,
    /// Joins the GMS answered `NonceTaken` (another node held the nonce drawn), each followed
    /// by a join with a fresh one.
    pub gms_nonces_taken: u64,
    /// GMS update items applied.
    pub gms_updates_applied: u64,
    /// Committed batches of GMS updates applied.
    pub gms_commits: u64,
    /// Subscriptions and advertisements by name waiting for the GMS, now: for a name not yet
    /// bound to a topic, and for a bound topic not yet in force at this node.
    pub gms_named_waiting: (usize, usize),

    /// Time from when the core thread took a message from its publisher to when the node
    /// woke with the acknowledgement that made it stable, for every message of this node.
    pub time_to_stable: LatencyHistogram,
    /// Time from when a message's sender took it from its publisher (the timestamp it wrote
    /// on it) to when this node's core thread woke with it and handed it to its subscriptions,
    /// for every message the protocol delivered here from another node. Between hosts it is off
    /// by the hosts' clock difference (negative differences count as 0).
    pub delivery_latency: LatencyHistogram,
    /// The subscriptions of this node, in the order of their topics (a snapshot).
    pub subscriptions: Vec<SubscriptionState>,
    /// The names of the topics this node asked for by name and the service bound, by topic.
    pub topic_names: Vec<(tidings_proto::TopicId, String)>,
    /// Receive-side figures of every inbound stream (a region and a sender), now.
    pub streams: Vec<tidings_proto::StreamReport>,
    /// Messages sent and not yet acknowledged (the window in use), per region this node
    /// sends to, now.
    pub unstable_by_region: Vec<(tidings_proto::RegionId, u64)>,

    /// The protocol's own counters.
    pub proto: tidings_proto::Stats,
}

/// Buckets of a [`LatencyHistogram`]: bucket `i` counts values in `[2^i, 2^(i+1))`
/// microseconds (bucket 0 also takes values under 1 µs); the last takes everything from about
/// 8.4 s up.
pub const LATENCY_BUCKETS: usize = 24;

/// A fixed log2 histogram of durations in microseconds: recording one is a few instructions
/// and no allocation (it lives in the core thread's counters and is copied with them).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LatencyHistogram {
    /// Counts by magnitude (see [`LATENCY_BUCKETS`]).
    pub counts: [u64; LATENCY_BUCKETS],
    /// Values recorded.
    pub count: u64,
    /// Sum of the values recorded, in microseconds.
    pub sum_us: u64,
}

impl LatencyHistogram {
    /// Records one value.
    pub fn record(&mut self, value: Duration) {
        self.record_n(value, 1);
    }

    /// Records `n` times the same value.
    pub fn record_n(&mut self, value: Duration, n: u64) {
        let us = u64::try_from(value.as_micros()).unwrap_or(u64::MAX);
        let bucket = (u64::BITS - us.max(1).leading_zeros() - 1) as usize;
        self.counts[bucket.min(LATENCY_BUCKETS - 1)] += n;
        self.count += n;
        self.sum_us = self.sum_us.saturating_add(us.saturating_mul(n));
    }

    /// The upper edge of bucket `i`, in microseconds (exclusive; `u64::MAX` for the last).
    #[must_use]
    pub fn bucket_ceiling_us(i: usize) -> u64 {
        if i + 1 >= LATENCY_BUCKETS {
            u64::MAX
        } else {
            1u64 << (i + 1)
        }
    }
}

/// One subscription of a node and how far its reader is behind ([`RuntimeStats`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubscriptionState {
    /// Its topic.
    pub topic: tidings_proto::TopicId,
    /// Its id among the node's subscriptions (the delivery task's).
    pub id: u64,
    /// Deliveries its callback ran.
    pub delivered: u64,
    /// Deliveries queued for its callback, now.
    pub queued: u64,
    /// Deliveries handed on to a bounded subscription and not read by its reader yet, now,
    /// those still in its task's queue included (0 for a callback).
    pub unread: u64,
    /// A bounded subscription's capacity (0 for a callback).
    pub capacity: u64,
    /// Whether it is its topic's bottleneck now, and how often it was.
    pub bottleneck: crate::flow::BottleneckState,
}

impl SubscriptionState {
    /// Deliveries it has not read yet: a bounded subscription's unread ones, a callback's
    /// queued ones.
    #[must_use]
    pub fn lag(&self) -> u64 {
        if self.capacity > 0 {
            self.unread
        } else {
            self.queued
        }
    }
}

/// A group subscription held at this node as one, because its shared task has no room
/// ([`RuntimeStats`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeldGroupState {
    /// The id of the group's delivery task.
    pub task: u64,
    /// How many of its topics the protocol holds for it.
    pub topics: usize,
    /// How long it has been held.
    pub held_for: std::time::Duration,
    /// Deliveries of its topics waiting for room in its task, in the order they came.
    pub backlog: usize,
}

/// A topic held at this node because a subscription of it has no room ([`RuntimeStats`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeldTopicState {
    /// The topic.
    pub topic: tidings_proto::TopicId,
    /// How long it has been held.
    pub held_for: std::time::Duration,
    /// Deliveries the protocol made before the hold took effect, waiting for room.
    pub backlog: usize,
    /// Its subscriptions that are full now.
    pub full_subscriptions: usize,
}
