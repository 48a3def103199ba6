//! Counters for everything an operator or a checker needs (STYLE.md item 11). Plain integers: the
//! node is single-threaded; whoever drives it copies them out.

/// The counters of one node. Monotonic unless the name says `_current`; `_max` are high-water marks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Datagrams handed out by `poll_transmit`.
    pub datagrams_sent: u64,
    /// Bytes handed out by `poll_transmit`.
    pub bytes_sent: u64,
    /// Control packets dropped because they did not fit `max_datagram_bytes` (a bug of this
    /// crate; `poll_transmit` refuses shorter buffers up front).
    pub control_unsendable: u64,
    /// Datagrams given to `handle_datagram`.
    pub datagrams_received: u64,
    /// Bytes given to `handle_datagram`.
    pub bytes_received: u64,
    /// Datagrams that failed to decode (bad magic, version, lengths...), dropped.
    pub malformed_dropped: u64,
    /// Datagrams for a region or view this node is not part of, dropped.
    pub foreign_dropped: u64,
    /// Datagrams of another incarnation of the membership service than this node's
    /// ([`Node::set_incarnation`](crate::Node::set_incarnation)), dropped unread.
    pub incarnation_dropped: u64,
    /// Well-formed datagrams whose content no correct peer sends (ACK beyond what was sent, token of
    /// a ring we are not in...), dropped.
    pub invalid_dropped: u64,

    /// Messages accepted by `publish`.
    pub messages_published: u64,
    /// `publish` calls refused with `WouldBlock` (back pressure).
    pub publish_would_block: u64,
    /// Data packets sent (first transmissions).
    pub data_packets_sent: u64,
    /// Messages sent for the first time (one per region they go to).
    pub messages_sent: u64,
    /// Messages reported stable to the application.
    pub messages_stable: u64,
    /// Unstable messages held for retransmission, summed over region streams (current).
    pub unstable_msgs_current: u64,
    /// Most unstable messages in any one region stream at any time.
    pub unstable_msgs_max: u64,
    /// Messages held by all outbound streams now: unsent plus unstable (what back pressure
    /// bounds; a message sent to several regions counts once per region).
    pub held_msgs_current: u64,
    /// Payload bytes held by all outbound streams now: unsent plus unstable (counted per region,
    /// though the payload is stored once).
    pub held_bytes_current: u64,
    /// Most of `held_bytes_current` ever.
    pub held_bytes_max: u64,
    /// Most unstable payload bytes in any one region stream at any time.
    pub unstable_bytes_max: u64,
    /// Silence heartbeats sent.
    pub silences_sent: u64,

    /// New messages received (first copy, within the receive window).
    pub messages_received: u64,
    /// Copies of messages already received or delivered, dropped.
    pub duplicates_dropped: u64,
    /// Messages beyond the receive window, dropped (they will be recovered later).
    pub out_of_window_dropped: u64,
    /// Messages delivered to the application, in order.
    pub messages_delivered: u64,
    /// Times a stream's in-order delivery stopped at a message of a topic the host holds
    /// back (`Node::hold_topic`).
    pub held_topic_stops: u64,
    /// Messages beyond the receive window of a stream stopped at a held topic, dropped (also
    /// counted in `out_of_window_dropped`; recovered once the topic is released).
    pub held_topic_window_dropped: u64,
    /// Messages received in order on topics this node does not subscribe to (possible only with
    /// approximate regions, ADR 34), not delivered.
    pub messages_filtered: u64,
    /// Payload bytes of `messages_filtered`: what approximate regions cost this node.
    pub bytes_filtered: u64,
    /// Silence heartbeats received.
    pub silences_received: u64,

    /// Pull requests sent to peers (caching members or the previous ring member).
    pub pulls_sent: u64,
    /// Pull requests sent to a stream's sender after caching members did not answer.
    pub pulls_to_sender: u64,
    /// Sequence numbers asked for in pull requests.
    pub pull_seqs_requested: u64,
    /// Pull requests received.
    pub pulls_received: u64,
    /// Requested messages this node did not hold (no longer cached, never received), skipped.
    pub repair_misses: u64,
    /// Retransmission requests dropped because the retransmit queue was full.
    pub repair_queue_overflows: u64,
    /// Queued retransmissions dropped unsent because they waited longer than `repair_queue_ttl`.
    pub repair_queue_expired: u64,
    /// Messages pushed to the previous ring member after comparing token records.
    pub messages_pushed: u64,
    /// Messages resent in answer to pull requests.
    pub messages_resent_on_pull: u64,
    /// Messages re-multicast by a sender in answer to a region NAK.
    pub messages_resent_on_nak: u64,
    /// Retransmission packets sent.
    pub retransmit_packets_sent: u64,
    /// Retransmitted messages received that were new (repaired a gap).
    pub repairs_received: u64,

    /// Tokens released by this node as a ring leader.
    pub tokens_released: u64,
    /// Times a ring this node leads found nothing to carry and went to sleep (its timer stops
    /// until something touches the region).
    pub ring_sleeps: u64,
    /// Token rounds released sooner than `token_interval` because a sender of the ring was fast
    /// (token pacing, [`Config::token_interval_min`](crate::Config::token_interval_min)).
    pub tokens_paced: u64,
    /// Tokens passed on to the next ring member.
    pub tokens_forwarded: u64,
    /// Token rounds completed (the token came back to this leader).
    pub token_rounds_completed: u64,
    /// Rounds a leader gave up on because its token did not come back in time.
    pub tokens_lost: u64,
    /// Tokens resent because the next member did not confirm them in time.
    pub tokens_resent: u64,
    /// Ring members reported as suspected (`Event::Suspect`).
    pub suspicions: u64,
    /// Tokens of an old round, or duplicates, dropped.
    pub tokens_stale_dropped: u64,
    /// Aggregate ACKs sent (as region leader).
    pub acks_sent: u64,
    /// Aggregate ACKs received (as sender).
    pub acks_received: u64,
    /// NAKs sent (as region leader).
    pub naks_sent: u64,
    /// NAKs received (as sender).
    pub naks_received: u64,

    /// Congestion queries sent (as a sender, one per region).
    pub dcqs_sent: u64,
    /// Congestion alerts sent up the hierarchy.
    pub ucas_sent: u64,
    /// Congestion alerts that reached this node as a sender.
    pub ucas_received: u64,
    /// `publish` calls refused by the congestion-controlled publish rate.
    pub publish_rate_limited: u64,
    /// The publish rate in force, thousandths of messages per second (0: not throttled).
    pub publish_rate_milli_current: u64,
    /// The NACK window in force: the most messages this node may have requested and not yet
    /// received, on the inbound stream where it is smallest (0 without inbound streams).
    pub nack_window_msgs_current: u64,
    /// Memberships applied (view changes).
    pub view_changes: u64,
    /// Region views this node is a member of that continued its streams, rings and caches
    /// into a new view of the same base (only topics were added, or dropped by every member;
    /// ADR 30).
    pub views_continued: u64,
    /// Messages resent into a new view because they were unstable in the old one.
    pub messages_rehomed: u64,
    /// Messages received in a new view that this node had delivered in an earlier one, not
    /// delivered again.
    pub view_duplicates_dropped: u64,
    /// Datagrams of a view not known yet, kept until it arrives.
    pub future_view_buffered: u64,
    /// Datagrams of a future view dropped because the buffer was full.
    pub future_view_overflows: u64,
    /// Datagrams of a view that has ended, dropped.
    pub stale_view_dropped: u64,

    /// Messages put in this node's cooperative cache.
    pub cache_inserts: u64,
    /// Messages dropped from the cache once stable.
    pub cache_evictions: u64,
    /// Messages in the cache now.
    pub cache_msgs_current: u64,
    /// Most messages in the cache at any time.
    pub cache_msgs_max: u64,
}
