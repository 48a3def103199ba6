//! The sans-IO node: the one type a driver (the runtime or the simulator) talks to.

mod install;
mod receive;
mod timeout;
mod transmit;

use receive::deliver_in_order;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::Bytes;
use tidings_wire::{Body, MsgId, NodeId, Packet, Priority, RegionId, TopicId, MESSAGE_HEADER_LEN};

use crate::config::{Config, ConfigError};
use crate::event::{Delivery, Event};
use crate::gauges::{GaugeShare, Gauges};
use crate::membership::{Membership, MembershipChange};
use crate::outbox::Outbox;
use crate::policy::{Congestion, CongestionPolicy};
use crate::region::{OwnedRecord, RegionState};
use crate::send::{OutMsg, OutboundStream, StabilityTracker};
use crate::send_queue::SendQueue;
use crate::stats::Stats;
use crate::time::Time;
use crate::timers::{Timer, Timers};
use crate::topic_bits::TopicBits;
use crate::Destination;

/// A datagram produced by [`Node::poll_transmit`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// Where it goes.
    pub destination: Destination,
    /// Its length in the buffer given to `poll_transmit`.
    pub len: usize,
    /// Its class (a driver with several queues may send control first).
    pub priority: Priority,
}

/// [`Node::poll_transmit`] was given a buffer shorter than `max_datagram_bytes`, which every
/// datagram it writes must be able to fill.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("transmit buffer of {len} bytes is shorter than max_datagram_bytes ({needed})")]
pub struct BufferTooSmall {
    /// The length of the buffer given.
    pub len: usize,
    /// The length needed: the configuration's `max_datagram_bytes`.
    pub needed: usize,
}

/// Why `publish` did not take a message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PublishError {
    /// Back pressure: the send queue of `region` holds its limit of unsent plus unstable data.
    /// Wait for `Stable` events (or any progress) and try again.
    #[error("send queue of region {region} is full; wait for messages to become stable")]
    WouldBlock {
        /// The region whose queue is full.
        region: RegionId,
    },
    /// Congestion control: the publish rate (adapted to the slowest receiver) does not allow
    /// another message before `retry_at`. Nothing was dropped; publish again then.
    #[error("publish rate reached (congestion control); retry at {retry_at:?}")]
    RateLimited {
        /// When the rate allows the next message.
        retry_at: Time,
    },
    /// The payload does not fit one datagram.
    #[error("payload of {len} bytes exceeds the largest of {max} bytes; split it or raise max_datagram_bytes")]
    TooLarge {
        /// The payload length.
        len: usize,
        /// The largest payload that fits.
        max: usize,
    },
}

/// Receive-side figures of one inbound stream, for reports and checkers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StreamReport {
    /// The region.
    pub region: RegionId,
    /// Partitions of the node's view of the region (the stream's caching share is one in this
    /// many).
    pub partitions: usize,
    /// The sender.
    pub origin: NodeId,
    /// Delivered (or filtered) in order up to here.
    pub delivered_upto: u64,
    /// Known stable in the region up to here.
    pub stable_upto: u64,
    /// Messages ever cached by this node for recovery.
    pub cached_total: u64,
    /// Messages in the cache now.
    pub cached_now: u64,
    /// Known gaps now.
    pub missing: u64,
    /// Gryphon's doubt horizon in the sender's clock, microseconds.
    pub doubt_horizon_us: u64,
    /// Progress of the doubt horizon in tick-seconds per second, smoothed (equation 5); 1.0 means
    /// keeping up with the sender in real time. `None` before two samples, and always without
    /// congestion control or the adaptive NACK window (`Config::doubt_sample_interval`).
    pub doubt_rate: Option<f64>,
}

/// One node of the protocol, without I/O.
///
/// # The drain contract
/// Feed inputs with [`handle_datagram`](Node::handle_datagram),
/// [`handle_timeout`](Node::handle_timeout) (when the time from
/// [`poll_timeout`](Node::poll_timeout) has come) and [`publish`](Node::publish). After any input,
/// drain [`poll_event`](Node::poll_event) until `None`, call
/// [`poll_transmit`](Node::poll_transmit) while the socket can send and it returns datagrams, and
/// re-read [`poll_timeout`](Node::poll_timeout). `now` must never go backwards. Nothing inside reads
/// a clock, a socket or an unseeded random source.
#[derive(Debug)]
pub struct Node {
    /// The configuration, validated once in [`Node::new`].
    config: Config,
    /// This node's id.
    me: NodeId,
    /// The membership in force (region views, topics' regions, subscriptions).
    membership: Membership,
    /// `membership.subscriptions` as bits, for the test of each message delivered.
    delivered: Option<TopicBits>,
    /// The regions this node is a member of: receive streams, rings, caches (`region/`).
    regions: BTreeMap<RegionId, RegionState>,
    /// This node's outbound stream into each region it publishes to (`send.rs`).
    outbound: BTreeMap<RegionId, OutboundStream>,
    /// Which published messages are stable in every region they went to.
    stability: StabilityTracker,
    /// The message id of the next publish.
    next_msg_id: u64,
    /// What the handlers produce: control packets, retransmission jobs, events, counters.
    out: Outbox,
    /// The seeded random source (repair targets), from `Config::rng_seed` and the node id.
    rng: fastrand::Rng,
    /// The `now` of the input being handled (the latest one passed in): lets a change found
    /// deep in a handler, such as the first gap after a time without any, schedule from it.
    input_at: Time,
    /// The regions whose outbound streams have data or a silence to send.
    send_queue: SendQueue,
    /// Datagrams of views not known yet, oldest first (bounded by `future_datagrams_max`).
    future: std::collections::VecDeque<Bytes>,
    /// Per origin, the highest message id delivered in views that ended; kept even while this node
    /// is in no region, so a node that leaves and joins again never delivers a message twice.
    msg_id_floors: BTreeMap<(NodeId, TopicId), u64>,
    /// The copy of `msg_id_floors` that region states installed since it last moved share.
    floors_shared: std::sync::Arc<BTreeMap<(NodeId, TopicId), u64>>,
    /// The records of the last token received, kept so the next token reuses the list.
    token_records: Vec<OwnedRecord>,
    /// The congestion control policy and its state (PDCC's publish rate, or none).
    congestion: Congestion,
    /// The deadlines, by the timer they serve.
    timers: Timers,
    /// The regions a periodic scan visited (reused, so that scans do not allocate).
    scanned_regions: Vec<RegionId>,
    /// Some region has an inbound stream (the doubt sample is due only then). Streams appear
    /// when a region's datagrams or timers touch it and go only with a new membership, so this
    /// is set there and recomputed at each install, instead of a pass over every region in
    /// `poll_timeout`.
    receiving: bool,
    /// Each region's part in the gauges of [`crate::Stats`].
    gauges: Gauges,
    /// Topics the host holds back at this node ([`Node::hold_topic`]): in-order delivery of a
    /// stream stops at its next message of one of them. Sorted; a vector, so that holding and
    /// releasing over and over allocates nothing (a host holds a few at a time, or the
    /// thousands of a group of topics at once, [`Node::hold_topics`]).
    held_topics: Vec<TopicId>,
    /// The membership service's incarnation: written in every datagram sent, and every
    /// datagram received of another is dropped unread. 0 without a service.
    incarnation: u32,
    /// The regions whose streams a [`PublishRun`] published into and whose gauges and silence
    /// deadlines are not refreshed yet (each stream's `published_unrefreshed` is set while it
    /// is listed). Empty outside a run.
    published: Vec<RegionId>,
    /// Messages (one per region) those streams gained since their gauges were refreshed. 0
    /// outside a run.
    published_held_msgs: u64,
}

/// A run of publishes into a [`Node`] ([`Node::publish_run`]): the streams published into are
/// refreshed (their part of the gauges, their silence deadlines) once, when the run is dropped.
/// The node is borrowed for the run, so nothing reads the gauges or the timers before then.
#[derive(Debug)]
pub struct PublishRun<'a> {
    node: &'a mut Node,
}

impl PublishRun<'_> {
    /// [`Node::publish_or_return`], admitted by the same checks.
    pub fn publish_or_return(
        &mut self,
        now: Time,
        topic: TopicId,
        payload: Bytes,
    ) -> Result<MsgId, (PublishError, Bytes)> {
        self.node.publish_unrefreshed(now, topic, payload)
    }
}

impl Drop for PublishRun<'_> {
    fn drop(&mut self) {
        self.node.refresh_published();
    }
}

/// Where a datagram's view stands relative to what this node knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ViewStatus {
    /// A view this node is in (or sends to), or an earlier view of the same base: process it
    /// as of this view.
    Current(tidings_wire::ViewId),
    /// A later view, or a region not known yet: keep it until the membership catches up.
    Future,
    /// An ended view: drop it.
    Stale,
    /// Nothing to do with this node.
    Foreign,
}

impl Node {
    /// A node `me` with the given membership. Fails if the configuration is invalid.
    pub fn new(
        config: Config,
        me: NodeId,
        membership: Membership,
        now: Time,
    ) -> Result<Node, ConfigError> {
        config.validate()?;
        let regions = membership
            .regions
            .values()
            .filter_map(|view| RegionState::new(view, me, &config, now))
            .map(|r| (r.region, r))
            .collect();
        let rng = fastrand::Rng::with_seed(config.rng_seed ^ (u64::from(me.0) << 32));
        let congestion = Congestion::new(now, &config);
        Ok(Node {
            config,
            me,
            delivered: membership.subscriptions.as_ref().map(TopicBits::from_set),
            membership,
            regions,
            outbound: BTreeMap::new(),
            stability: StabilityTracker::new(),
            next_msg_id: 1,
            out: Outbox::default(),
            rng,
            input_at: now,
            send_queue: SendQueue::default(),
            future: std::collections::VecDeque::new(),
            msg_id_floors: BTreeMap::new(),
            floors_shared: std::sync::Arc::default(),
            token_records: Vec::new(),
            congestion,
            timers: Timers::new(now),
            scanned_regions: Vec::new(),
            receiving: false,
            gauges: Gauges::default(),
            held_topics: Vec::new(),
            incarnation: 0,
            published: Vec::new(),
            published_held_msgs: 0,
        })
        .map(|mut node| {
            node.schedule_all_region_timers();
            // Every region has its part of the gauges from the start (the periodic scans
            // refresh only the regions they visit).
            node.update_gauges();
            node
        })
    }

    /// This node's id.
    #[must_use]
    pub fn id(&self) -> NodeId {
        self.me
    }

    /// The incarnation of the membership service whose views this node runs (0 by default):
    /// [`poll_transmit`](Node::poll_transmit) writes it into every datagram, and a received
    /// datagram of another is dropped before anything else reads it (`incarnation_dropped`),
    /// so that the packets of a service restarted without its state, which numbers regions and
    /// views again, and of the views it lost never mix.
    pub fn set_incarnation(&mut self, incarnation: u32) {
        self.incarnation = incarnation;
    }

    /// The incarnation this node writes and accepts.
    #[must_use]
    pub fn incarnation(&self) -> u32 {
        self.incarnation
    }

    /// Numbers this node's messages from `first` on, for a node that replaces another of the
    /// same host (a member that joined again): the host's message ids go on without reuse.
    /// Ignored once a message was published.
    pub fn set_first_msg_id(&mut self, first: MsgId) {
        if self.next_msg_id == 1 && first.0 > 0 {
            self.next_msg_id = first.0;
            self.stability = StabilityTracker::starting_at(first.0);
        }
    }

    /// The id the next published message gets.
    #[must_use]
    pub fn next_msg_id(&self) -> MsgId {
        MsgId(self.next_msg_id)
    }

    /// The oldest message of this node not yet stable (sent or not), or the next id when every
    /// message is: with [`is_stable`](Node::is_stable), what a host gives up when it replaces
    /// the node.
    #[must_use]
    pub fn first_unstable(&self) -> MsgId {
        MsgId(self.stability.first().min(self.next_msg_id))
    }

    /// The configuration in force.
    #[must_use]
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The counters.
    #[must_use]
    pub fn stats(&self) -> &Stats {
        &self.out.stats
    }

    /// Largest payload `publish` accepts.
    #[must_use]
    pub fn max_payload(&self) -> usize {
        // A retransmission carries 4 more bytes (the origin) than a data packet.
        (self.config.max_datagram_bytes - tidings_wire::HEADER_LEN - 6 - MESSAGE_HEADER_LEN)
            .min(usize::from(u16::MAX))
    }

    /// Whether `publish(topic, payload of len bytes)` would be accepted now.
    #[must_use]
    pub fn can_publish(&self, topic: TopicId, len: usize) -> bool {
        len <= self.max_payload()
            && self
                .membership
                .topic_regions
                .get(&topic)
                .is_none_or(|regions| {
                    self.node_admits(regions.len())
                        && !(self.held_topics.binary_search(&topic).is_ok()
                            && regions
                                .iter()
                                .any(|r| self.regions.get(r).is_some_and(|s| s.subscribes(topic))))
                        && regions.iter().all(|r| {
                            self.outbound
                                .get(r)
                                .is_none_or(|s| s.admits(len, &self.config))
                        })
                })
    }

    /// Whether the node may hold `regions` more messages (one per region) within
    /// [`Config::node_held_msgs_max`]. The gauge it reads leaves out the messages of a [`PublishRun`] not yet refreshed, which
    /// are counted here.
    fn node_admits(&self, regions: usize) -> bool {
        (self.out.stats.held_msgs_current + self.published_held_msgs) as usize + regions
            <= self.config.node_held_msgs_max
    }

    /// Publishes `payload` on `topic`: stores it once, gives it the next sequence number of every
    /// region the topic spans, and returns its message id (a handle for [`Node::is_stable`] and
    /// [`Event::Stable`]). Delivered at once if this node subscribes to `topic`.
    pub fn publish(
        &mut self,
        now: Time,
        topic: TopicId,
        payload: Bytes,
    ) -> Result<MsgId, PublishError> {
        self.publish_or_return(now, topic, payload)
            .map_err(|(error, _)| error)
    }

    /// [`Node::publish`], which gives the payload back with the error when it refuses the
    /// message: a caller that retries later keeps it without holding a second reference (a
    /// clone and a drop of a shared buffer's count per message, which another thread may be
    /// writing).
    pub fn publish_or_return(
        &mut self,
        now: Time,
        topic: TopicId,
        payload: Bytes,
    ) -> Result<MsgId, (PublishError, Bytes)> {
        let result = self.publish_unrefreshed(now, topic, payload);
        self.refresh_published();
        result
    }

    /// Starts a run of publishes ([`PublishRun::publish_or_return`]) that refreshes the gauges
    /// and the silence deadlines of the streams it publishes into once, when the run is
    /// dropped, instead of after every message. Each publish is admitted as
    /// [`publish_or_return`](Node::publish_or_return) would admit it (the node-wide bound counts
    /// the run's messages), and once the run is dropped the node is as those publishes one by
    /// one would have left it.
    pub fn publish_run(&mut self) -> PublishRun<'_> {
        PublishRun { node: self }
    }

    /// [`Node::publish_or_return`] without the refresh of the streams it publishes into: they
    /// are listed in `published` for [`Node::refresh_published`], and the messages they gained
    /// counted in `published_held_msgs` (which [`Node::node_admits`] adds to the gauge).
    fn publish_unrefreshed(
        &mut self,
        now: Time,
        topic: TopicId,
        payload: Bytes,
    ) -> Result<MsgId, (PublishError, Bytes)> {
        self.input_at = now;
        let max = self.max_payload();
        if payload.len() > max {
            let len = payload.len();
            return Err((PublishError::TooLarge { len, max }, payload));
        }
        // Borrowed, not cloned: publishing allocates nothing per message (the fields touched below
        // are disjoint from the membership).
        let regions: &[RegionId] = self
            .membership
            .topic_regions
            .get(&topic)
            .map_or(&[], Vec::as_slice);
        for region in regions {
            if self
                .outbound
                .get(region)
                .is_some_and(|s| !s.admits(payload.len(), &self.config))
            {
                self.out.stats.publish_would_block += 1;
                return Err((PublishError::WouldBlock { region: *region }, payload));
            }
        }
        if let Some(&region) = regions.first().filter(|_| !self.node_admits(regions.len())) {
            self.out.stats.publish_would_block += 1;
            return Err((PublishError::WouldBlock { region }, payload));
        }
        // Approximate regions (ADR 34): a region may carry topics this node does not subscribe to.
        let delivered_here = self.delivered.as_ref().is_none_or(|s| s.contains(topic))
            && regions
                .iter()
                .any(|r| self.regions.get(r).is_some_and(|s| s.subscribes(topic)));
        if let Some(&region) = regions
            .first()
            .filter(|_| delivered_here && self.held_topics.binary_search(&topic).is_ok())
        {
            // This node's own subscription to the topic has no room: its own messages wait too.
            self.out.stats.publish_would_block += 1;
            return Err((PublishError::WouldBlock { region }, payload));
        }
        if !regions.is_empty() {
            if let Err(retry_at) = self.congestion.admit(now, &self.config) {
                self.out.stats.publish_rate_limited += 1;
                self.timers.rate_retry_at = Some(retry_at);
                return Err((PublishError::RateLimited { retry_at }, payload));
            }
        }
        let msg_id = MsgId(self.next_msg_id);
        self.next_msg_id += 1;
        let timestamp_us = now.as_micros();
        // The last holder takes the payload itself rather than a clone: the delivery if this
        // node subscribes, else the last region's stream.
        let mut payload = Some(payload);
        for (i, &region) in regions.iter().enumerate() {
            // The view is looked up only for a new stream.
            let views = &self.membership.regions;
            let stream = self.outbound.entry(region).or_insert_with(|| {
                let (view, base) = views
                    .get(&region)
                    .map_or_else(Default::default, |v| (v.view, v.base));
                OutboundStream::new(view, base, now)
            });
            let payload = if i + 1 == regions.len() && !delivered_here {
                payload.take()
            } else {
                payload.clone()
            };
            stream.push(OutMsg {
                msg_id,
                topic,
                timestamp_us,
                payload: payload.unwrap_or_default(),
            });
            self.send_queue.queue_data(region, stream);
            // Unsent messages shorten the silence interval and count in the gauges: refreshed
            // by `refresh_published`.
            if !std::mem::replace(&mut stream.published_unrefreshed, true) {
                self.published.push(region);
            }
        }
        self.published_held_msgs += regions.len() as u64;
        self.out.stats.messages_published += 1;
        // A topic nobody subscribes to is stable at once (it reached everyone it must).
        self.stability
            .register(msg_id, u16::try_from(regions.len()).unwrap_or(u16::MAX));
        if regions.is_empty() {
            self.out.stable(msg_id);
        }
        if delivered_here {
            self.out.stats.messages_delivered += 1;
            self.out.events.push_back(Event::Deliver(Delivery {
                origin: self.me,
                topic,
                msg_id,
                timestamp_us,
                payload: payload.unwrap_or_default(),
            }));
        }
        Ok(msg_id)
    }

    /// The gauges and the silence deadlines of the streams published into since the last
    /// refresh ([`Node::publish_unrefreshed`]).
    fn refresh_published(&mut self) {
        let mut published = std::mem::take(&mut self.published);
        for &region in &published {
            self.stream_changed(region);
        }
        published.clear();
        self.published = published;
        self.published_held_msgs = 0;
    }

    /// Whether a message this node published is stable everywhere it must be.
    #[must_use]
    pub fn is_stable(&self, msg_id: MsgId) -> bool {
        msg_id.0 < self.next_msg_id && self.stability.is_stable(msg_id)
    }

    /// Processes one received datagram. Malformed or foreign input is counted and dropped.
    pub fn handle_datagram(&mut self, now: Time, datagram: Bytes) {
        self.receive(now, datagram, ViewStatus::Future);
    }

    /// Processes one datagram received on a multicast group. Regions may share a group (the
    /// membership service's `groups_max`), and a node joins a group only once it knows a region
    /// on it, so a datagram of a region this node does not know is another region's traffic on
    /// the shared group: counted (`foreign_dropped`) and dropped, not kept as from a view yet
    /// to come as [`handle_datagram`](Node::handle_datagram) would (a region this node is about
    /// to join recovers what it dropped, as from any loss).
    pub fn handle_group_datagram(&mut self, now: Time, datagram: Bytes) {
        self.receive(now, datagram, ViewStatus::Foreign);
    }

    /// `unknown_region`: what a datagram of a region missing from the membership is.
    fn receive(&mut self, now: Time, datagram: Bytes, unknown_region: ViewStatus) {
        self.input_at = now;
        self.out.stats.datagrams_received += 1;
        self.out.stats.bytes_received += datagram.len() as u64;
        if tidings_wire::peek_incarnation(&datagram).is_some_and(|i| i != self.incarnation) {
            self.out.stats.incarnation_dropped += 1;
            return;
        }
        let packet = match Packet::parse(&datagram) {
            Ok(p) => p,
            Err(_) => {
                self.out.stats.malformed_dropped += 1;
                return;
            }
        };
        let mut h = packet.header;
        if h.sender == self.me {
            // Our own multicast looped back.
            self.out.stats.foreign_dropped += 1;
            return;
        }
        match self.view_status(&h, &packet.body, unknown_region) {
            // A packet of an earlier view of the same base is taken as of the current one.
            ViewStatus::Current(view) => h.view = view,
            ViewStatus::Future => {
                if self.future.len() >= self.config.future_datagrams_max {
                    self.future.pop_front();
                    self.out.stats.future_view_overflows += 1;
                }
                self.out.stats.future_view_buffered += 1;
                self.future.push_back(datagram.clone());
                return;
            }
            ViewStatus::Stale => {
                self.out.stats.stale_view_dropped += 1;
                return;
            }
            ViewStatus::Foreign => {
                self.out.stats.foreign_dropped += 1;
                return;
            }
        }
        match packet.body {
            Body::Data(messages) => {
                self.receive_messages(now, &h, h.sender, messages, &datagram, false);
            }
            Body::Retransmit { origin, messages } => {
                self.receive_messages(now, &h, origin, messages, &datagram, true);
            }
            Body::Silence(s) => self.on_silence(now, &h, s),
            Body::Token(t) => {
                if !self.on_token(now, &h, &t) {
                    return;
                }
            }
            Body::Ack {
                origin,
                stable_upto,
            } => self.on_ack(&h, origin, stable_upto),
            Body::Dcq { seq, position_us } => {
                if let Some(region) = self.regions.get_mut(&h.region) {
                    region.on_dcq(h.sender, seq, position_us, &self.config, &mut self.out);
                }
            }
            Body::Uca {
                origin,
                seq,
                min_nonrec_rate_milli,
                min_rec_rate_milli,
            } => {
                let (nonrec, rec) = (
                    crate::pdcc::milli_to_rate(min_nonrec_rate_milli),
                    crate::pdcc::milli_to_rate(min_rec_rate_milli),
                );
                self.on_uca(now, &h, origin, seq, (nonrec, rec));
            }
            Body::TokenAck { level, ring, round } => {
                if !self.check_member_region(&h) {
                    return;
                }
                if let Some(region) = self.regions.get_mut(&h.region) {
                    region.on_token_ack(h.sender, level, ring, round, &mut self.out);
                }
            }
            Body::Nak { origin, ranges } => {
                if !self.on_nak(now, &h, origin, ranges) {
                    return;
                }
            }
            Body::Pull { origin, ranges } => {
                if !self.on_pull(now, &h, origin, ranges) {
                    return;
                }
            }
        }
        // What a datagram changes is confined to its region (ACKs of other regions refresh
        // theirs in `apply_ack`).
        self.refresh_gauges(h.region);
        if let Some(region) = self.regions.get_mut(&h.region) {
            // It may give a sleeping ring something to carry (the timer is re-entered below
            // either way).
            region.wake_leads(now, &self.config);
            self.receiving |= !region.inbound.is_empty();
        }
        self.schedule_region_timer(h.region);
    }

    /// Approximate regions (ADR 34): the topics this node subscribes to, and so delivers. A
    /// region view lists the topics the region carries; with approximate regions some members
    /// do not subscribe to all of them. Such a member receives those messages, takes its part
    /// in the region's reliability (tokens, acknowledgements, caching, forwarding) and does not
    /// deliver them (counted in [`Stats::messages_filtered`](crate::Stats::messages_filtered)
    /// and [`Stats::bytes_filtered`](crate::Stats::bytes_filtered)); nor does it deliver its
    /// own publications on them. `None` (the default) delivers every topic of its regions:
    /// exact regions, where every member subscribes to every topic its region carries. Takes
    /// effect for the messages received from now on. The same as
    /// [`Membership::subscriptions`], which [`set_membership`](Node::set_membership) installs
    /// with the rest.
    pub fn set_subscriptions(&mut self, topics: Option<BTreeSet<TopicId>>) {
        self.delivered = topics.as_ref().map(TopicBits::from_set);
        self.membership.subscriptions = topics;
    }

    /// Adds `topic` to the topics this node delivers, or takes it out: one change to
    /// [`set_subscriptions`](Node::set_subscriptions)'s set, for a host that follows
    /// subscriptions one at a time. A node that delivered every topic of its regions (`None`)
    /// delivers from then on only the topics added.
    pub fn set_subscribed(&mut self, topic: TopicId, subscribed: bool) {
        let topics = self
            .membership
            .subscriptions
            .get_or_insert_with(BTreeSet::new);
        if subscribed {
            topics.insert(topic);
        } else {
            topics.remove(&topic);
        }
        self.delivered
            .get_or_insert_with(TopicBits::default)
            .set(topic, subscribed);
    }

    /// The membership in force: the last one [`set_membership`](Node::set_membership) gave, with
    /// the changes [`update_membership`](Node::update_membership) applied since.
    #[must_use]
    pub fn membership(&self) -> &Membership {
        &self.membership
    }

    /// Installs a new membership (from the GMS): region views this node is in are rebuilt when
    /// their view changed (fresh streams and rings; message ids delivered before are remembered
    /// so resent messages are not delivered twice); what this node had published and was not yet
    /// stable in a changed region is sent again into the regions its topic spans now, after
    /// `view_change_pause`; datagrams buffered for the new views are processed. A view that
    /// [continues](crate::membership::RegionView::continues) the one before (same base: only topics were added,
    /// ADR 30) keeps the region's state and this node's stream into it instead; only the
    /// messages of the topics it gained are re-homed into it.
    pub fn set_membership(&mut self, now: Time, membership: Membership) {
        // The regions whose view epoch differs: added, dropped or changed. (Content under an
        // unchanged epoch is taken as it comes, as a view's state is kept.)
        let mut views_changed: Vec<RegionId> = membership
            .regions
            .iter()
            .filter(|(r, v)| {
                self.membership
                    .regions
                    .get(r)
                    .is_none_or(|old| old.view != v.view)
            })
            .map(|(&r, _)| r)
            .collect();
        views_changed.extend(
            self.membership
                .regions
                .keys()
                .filter(|r| !membership.regions.contains_key(r)),
        );
        let mut old = std::mem::replace(&mut self.membership, membership);
        self.delivered = self
            .membership
            .subscriptions
            .as_ref()
            .map(TopicBits::from_set);
        let old_views = views_changed
            .iter()
            .filter_map(|r| old.regions.remove(r).map(|v| (*r, v)))
            .collect();
        self.install_views(now, views_changed, old_views);
    }

    /// Applies a change of the membership in place: each region's view as it is now (`None`:
    /// gone) and each published topic's region list as it is now (`None`: no longer
    /// published), for the regions and topics that changed. The same as
    /// [`set_membership`](Node::set_membership) with the whole membership so changed, at a cost
    /// that follows the change: a node in 100,000 regions need not pass over all of them (nor
    /// its host copy them) for a batch of subscriptions that touched a few hundred.
    pub fn update_membership(&mut self, now: Time, change: MembershipChange) {
        let mut views_changed = Vec::new();
        let mut old_views = BTreeMap::new();
        for (region, view) in change.regions {
            match view {
                Some(view) => {
                    let differs = self
                        .membership
                        .regions
                        .get(&region)
                        .is_none_or(|old| old.view != view.view);
                    if differs {
                        views_changed.push(region);
                    }
                    if let Some(old) = self.membership.regions.insert(region, view) {
                        if differs {
                            old_views.insert(region, old);
                        }
                    }
                }
                None => {
                    if let Some(old) = self.membership.regions.remove(&region) {
                        views_changed.push(region);
                        old_views.insert(region, old);
                    }
                }
            }
        }
        for (topic, regions) in change.topic_regions {
            match regions {
                Some(regions) => self.membership.topic_regions.insert(topic, regions),
                None => self.membership.topic_regions.remove(&topic),
            };
        }
        views_changed.sort_unstable();
        views_changed.dedup();
        self.install_views(now, views_changed, old_views);
    }

    /// Runs every timer that is due, in this order: the rings, congestion control's query, the
    /// doubt sample, the repair scan, the outbound streams' silences and pauses.
    pub fn handle_timeout(&mut self, now: Time) {
        self.input_at = now;
        self.run_ring_timers(now);
        self.apply_self_feedback(now);
        if self.timers.rate_retry_at.is_some_and(|t| now >= t) {
            self.timers.rate_retry_at = None;
        }
        if self.congestion.next_query().is_some_and(|at| now >= at) {
            self.query_congestion(now);
        }
        // The periodic scans concern inbound streams only (their doubt rates, NACK windows and
        // gaps), so they skip regions that have none, and only the regions they visit get their
        // gauges refreshed: a node that is alone in thousands of quiet regions (the sole
        // subscriber of many topics) paid a pass over all of them, and a whole recomputation
        // of the gauges, every repair interval.
        let mut scanned = std::mem::take(&mut self.scanned_regions);
        if self.config.reads_doubt_horizons() && now >= self.timers.doubt_sample_at {
            self.sample_doubt_horizons(now, &mut scanned);
        }
        if now >= self.timers.repair_scan_at {
            self.scan_repairs(now, &mut scanned);
        }
        self.run_stream_timers(now);
        scanned.sort_unstable();
        scanned.dedup();
        for &region in &scanned {
            self.refresh_gauges(region);
        }
        scanned.clear();
        self.scanned_regions = scanned;
        // Every region's part of the gauges is what a whole recomputation finds (checked in
        // debug builds, so by every simulator test).
        #[cfg(debug_assertions)]
        self.gauges.check(
            &self.outbound,
            &self.regions,
            &self.config,
            &self.timers.repair_scan_regions,
            &self.out.stats,
        );
    }

    /// The next time [`handle_timeout`](Node::handle_timeout) must be called, and which timer
    /// it is for (the earliest; `handle_timeout` runs every timer that is due).
    #[must_use]
    pub fn poll_timeout(&self) -> Option<(Time, Timer)> {
        // May be a skipped entry, earlier than any current deadline: that only wakes the
        // caller early once.
        let rings = self
            .timers
            .regions
            .peek()
            .map(|Reverse((at, _))| (*at, Timer::Region));
        // Regions with gaps, and those whose gaps closed since the last scan (visited once more).
        let repair = (!self.timers.repair_scan_regions.is_empty())
            .then_some((self.timers.repair_scan_at, Timer::RepairScan));
        // A lower bound of the outbound streams' silences and pauses, not their exact minimum
        // (a pass over every stream would cost a node with 1000 streams most of its protocol
        // time): an entry left early by later sends wakes the node once, and `handle_timeout`
        // re-enters it at the stream's real deadline.
        let silences_and_pauses = self
            .timers
            .streams
            .peek()
            .map(|Reverse((at, ..))| (*at, Timer::Stream));
        let dcq = self
            .congestion
            .next_query()
            .filter(|_| !self.outbound.is_empty())
            .map(|at| (at, Timer::CongestionQuery));
        let rate_retry = self.timers.rate_retry_at.map(|at| (at, Timer::RateRetry));
        let others = rings
            .into_iter()
            .chain(repair)
            .chain(silences_and_pauses)
            .chain(dcq)
            .chain(rate_retry)
            .min_by_key(|&(at, _)| at);
        // The doubt sample is due only for its readers and if some region receives (kept in
        // `receiving`; debug builds check it against a pass over the regions).
        debug_assert_eq!(
            self.receiving,
            self.regions.values().any(|r| !r.inbound.is_empty())
        );
        let doubt = (others.is_none_or(|(t, _)| self.timers.doubt_sample_at < t)
            && self.receiving
            && self.config.reads_doubt_horizons())
        .then_some((self.timers.doubt_sample_at, Timer::DoubtSample));
        others.into_iter().chain(doubt).min_by_key(|&(at, _)| at)
    }

    /// The next event for the application, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.out.events.pop_front()
    }

    /// Moves the next events, at most `max`, to the back of `into`, in the order
    /// [`poll_event`](Self::poll_event) would return them; returns how many. A host taking a
    /// datagram's worth of deliveries at once moves them in bulk rather than one call each.
    pub fn take_events(&mut self, into: &mut VecDeque<Event>, max: usize) -> usize {
        let n = self.out.events.len().min(max);
        if n == self.out.events.len() && into.is_empty() {
            // Every event, into an empty queue: the two queues trade storage.
            std::mem::swap(into, &mut self.out.events);
        } else {
            into.extend(self.out.events.drain(..n));
        }
        n
    }

    /// Events waiting for [`poll_event`](Self::poll_event): what the caller has not taken yet
    /// (deliveries held back while the application is behind, for instance).
    #[must_use]
    pub fn events_pending(&self) -> usize {
        self.out.events.len()
    }

    /// [`events_pending`](Self::events_pending), for a caller that places events of its own
    /// after those: they are closed, so that what becomes stable from now on is reported in
    /// events after them (an [`Event::Stable`] queued now is not extended any more).
    pub fn close_events(&mut self) -> usize {
        self.out.close_events();
        self.out.events.len()
    }

    /// Holds `topic` back at this node, for a host whose application cannot take more of it
    /// (a full subscription): each stream (sender, region) stops its in-order delivery at its
    /// next message of `topic`, so its receive window stops advancing, what arrives beyond the
    /// window is dropped (`Stats::held_topic_window_dropped`) and the token record and ACKs do
    /// not cover the held message: the sender's window closes and its publisher slows down.
    /// Other topics of the same stream wait behind the held message; other streams go on.
    /// Messages this node publishes on `topic` are refused (`WouldBlock`) while it subscribes
    /// to it. Idempotent.
    pub fn hold_topic(&mut self, topic: TopicId) {
        if let Err(at) = self.held_topics.binary_search(&topic) {
            self.held_topics.insert(at, topic);
        }
    }

    /// [`hold_topic`](Self::hold_topic) for every topic of `topics` at once (a host whose one
    /// delivery task takes them all has no room): one merge of the held set, where one call per
    /// topic would shift it once per topic. Idempotent; no allocation once the set's storage
    /// has grown to the most topics held at once.
    pub fn hold_topics(&mut self, topics: &[TopicId]) {
        if topics.is_empty() {
            return;
        }
        let was_empty = self.held_topics.is_empty();
        self.held_topics.extend_from_slice(topics);
        if !was_empty || !topics.is_sorted() {
            self.held_topics.sort_unstable();
        }
        self.held_topics.dedup();
    }

    /// Ends [`hold_topic`](Self::hold_topic): the streams stopped at `topic` deliver what they
    /// hold in order (as events), and what their windows dropped comes back through the
    /// protocol's usual recovery.
    pub fn release_topic(&mut self, now: Time, topic: TopicId) {
        let Ok(at) = self.held_topics.binary_search(&topic) else {
            return;
        };
        self.held_topics.remove(at);
        self.deliver_released(now);
    }

    /// [`release_topic`](Self::release_topic) for every topic of `topics` (sorted) at once: the
    /// held set is filtered once and every region's held streams are walked once, not once per
    /// topic. Topics of `topics` not held are left alone.
    pub fn release_topics(&mut self, now: Time, topics: &[TopicId]) {
        debug_assert!(topics.is_sorted(), "release_topics takes sorted topics");
        let before = self.held_topics.len();
        // Both sorted: one merge-like pass.
        let mut released = topics.iter().peekable();
        self.held_topics.retain(|t| {
            while released.next_if(|r| *r < t).is_some() {}
            released.next_if_eq(&t).is_none()
        });
        if self.held_topics.len() != before {
            self.deliver_released(now);
        }
    }

    /// After topics were released: every region's held streams deliver what they hold up to
    /// their next message of a topic still held.
    fn deliver_released(&mut self, now: Time) {
        self.input_at = now;
        let held_topics = &self.held_topics;
        let delivers = self.delivered.as_ref();
        let out = &mut self.out;
        // The regions whose streams went on (scratch storage of the periodic scans, reused).
        let mut moved = std::mem::take(&mut self.scanned_regions);
        moved.clear();
        for (&id, region) in &mut self.regions {
            let (caching, topics, streams) = region.held_parts();
            for stream in streams.filter(|s| s.is_held()) {
                let origin = stream.origin;
                let still = stream.deliver_ready(
                    |t| held_topics.binary_search(&t).is_ok() && topics.binary_search(&t).is_ok(),
                    |seq, msg, fresh| {
                        deliver_in_order(out, origin, topics, delivers, caching, seq, msg, fresh)
                    },
                );
                if still {
                    out.stats.held_topic_stops += 1;
                }
                if moved.last() != Some(&id) {
                    moved.push(id);
                }
            }
        }
        // As after a datagram: the gauges, the rings and the timers of what changed.
        for &region in &moved {
            self.refresh_gauges(region);
            if let Some(r) = self.regions.get_mut(&region) {
                r.wake_leads(now, &self.config);
            }
            self.schedule_region_timer(region);
        }
        moved.clear();
        self.scanned_regions = moved;
    }

    /// Whether [`hold_topic`](Self::hold_topic) holds `topic` now.
    #[must_use]
    pub fn is_topic_held(&self, topic: TopicId) -> bool {
        self.held_topics.binary_search(&topic).is_ok()
    }

    /// Writes the next datagram to send into `buf`: control first, then retransmissions, then
    /// new data (round-robin over regions, packing as many messages as fit), then silence
    /// heartbeats. `Ok(None)`: nothing to send now. A buffer shorter than `max_datagram_bytes`
    /// is refused before anything is taken from the queues: a driver's buffer is sized once, so
    /// this is a bug of the driver, which the error names.
    pub fn poll_transmit(
        &mut self,
        now: Time,
        buf: &mut [u8],
    ) -> Result<Option<Transmit>, BufferTooSmall> {
        let needed = self.config.max_datagram_bytes;
        let len = buf.len();
        let Some(buf) = buf.get_mut(..needed) else {
            return Err(BufferTooSmall { len, needed });
        };
        let t = self
            .poll_control(buf)
            .or_else(|| self.poll_repair(now, buf))
            .or_else(|| self.poll_data(now, buf))
            .or_else(|| self.poll_silence(now, buf));
        if let Some(t) = t {
            tidings_wire::stamp_incarnation(&mut buf[..t.len], self.incarnation);
            self.out.stats.datagrams_sent += 1;
            self.out.stats.bytes_sent += t.len as u64;
        }
        Ok(t)
    }

    /// [`Node::refresh_gauges`] for a region this node may have left (neither receiving nor
    /// sending in it): its part leaves the gauges.
    fn refresh_or_forget_gauges(&mut self, region: RegionId) {
        if self.outbound.contains_key(&region) || self.regions.contains_key(&region) {
            self.refresh_gauges(region);
        } else {
            self.gauges.forget(region, &mut self.out.stats);
        }
    }

    /// Updates the gauges after a change confined to `region`, by difference: the cost of a
    /// message does not grow with the number of regions the node is in.
    fn refresh_gauges(&mut self, region: RegionId) {
        let share = GaugeShare::of(region, &self.outbound, &self.regions, &self.config);
        self.set_gauge_share(region, share);
    }

    /// Recomputes every gauge from every stream (a new node).
    fn update_gauges(&mut self) {
        self.gauges.recompute(
            &self.outbound,
            &self.regions,
            &self.config,
            &mut self.timers.repair_scan_regions,
            &mut self.out.stats,
        );
    }

    /// Puts `share` in place of `region`'s part in the gauges; a region that gains gaps enters
    /// the repair scan.
    fn set_gauge_share(&mut self, region: RegionId, share: GaugeShare) {
        if self.gauges.set(region, share, &mut self.out.stats) {
            self.timers.repair_scan_regions.insert(region);
            if self.gauges.regions_with_gaps() == 1 {
                // The first gap after a time without any: the scan comes when it is due
                // (`repair_delay` after it was noticed, now). The periodic scan's phase was
                // stale: a scan at once that found nothing due put the first request a whole
                // `repair_interval` after the gap (5 ms, not 2), unless another timer (the
                // doubt sample's, which woke every node ten times a second) had moved it.
                self.timers.repair_scan_at = self.input_at + self.config.repair_delay;
            }
        }
    }

    /// Receive-side figures of every inbound stream.
    #[must_use]
    pub fn stream_reports(&self) -> Vec<StreamReport> {
        self.regions
            .values()
            .flat_map(|r| {
                r.inbound.values().map(move |s| StreamReport {
                    region: r.region,
                    partitions: r.partition_count(),
                    origin: s.origin,
                    delivered_upto: s.delivered_upto,
                    stable_upto: s.stable_upto,
                    cached_total: s.cached_total,
                    cached_now: s.cache_len() as u64,
                    missing: s.missing_count() as u64,
                    doubt_horizon_us: s.doubt_horizon_us,
                    doubt_rate: s.doubt_rate,
                })
            })
            .collect()
    }

    /// A dump of the token rings' state of every region, for debugging.
    #[doc(hidden)]
    #[must_use]
    pub fn debug_rings(&self) -> String {
        self.regions
            .values()
            .map(RegionState::debug_rings)
            .collect()
    }

    /// Per region this node sends to and that has not acknowledged everything sent: the oldest
    /// message it has not acknowledged, and when that message was published (microseconds of
    /// this node's clock). What a publisher waits for when its messages do not become stable.
    pub fn oldest_unstable(&self) -> impl Iterator<Item = (RegionId, MsgId, u64)> + '_ {
        self.outbound
            .iter()
            .filter_map(|(&r, s)| s.oldest_unstable().map(|m| (r, m.msg_id, m.timestamp_us)))
    }

    /// Messages held unstable (sent, not yet acknowledged) per region this node sends to.
    #[must_use]
    pub fn unstable_by_region(&self) -> Vec<(RegionId, u64)> {
        self.outbound
            .iter()
            .map(|(&r, s)| (r, s.unstable_msgs()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The node's bits of the topics it delivers say what its membership's set says.
    fn assert_delivered_follows(node: &Node) {
        let set = node.membership.subscriptions.as_ref();
        assert_eq!(node.delivered.is_some(), set.is_some());
        for t in (0..200)
            .chain(65_530..65_545)
            .chain([u32::MAX])
            .map(TopicId)
        {
            assert_eq!(
                node.delivered.as_ref().map(|d| d.contains(t)),
                set.map(|s| s.contains(&t)),
                "{t:?}"
            );
        }
    }

    #[test]
    fn the_delivered_topics_follow_every_change_of_the_subscriptions() {
        let t0 = Time::ZERO;
        let mut membership = Membership {
            subscriptions: Some([TopicId(1), TopicId(2), TopicId(70_000)].into()),
            ..Membership::default()
        };
        let mut node = Node::new(Config::default(), NodeId(1), membership.clone(), t0).unwrap();
        assert_delivered_follows(&node);
        node.set_subscribed(TopicId(3), true);
        node.set_subscribed(TopicId(1), false);
        node.set_subscribed(TopicId(65_540), true);
        assert_delivered_follows(&node);
        node.set_subscriptions(None);
        assert_delivered_follows(&node);
        node.set_subscribed(TopicId(199), true);
        assert_delivered_follows(&node);
        membership.subscriptions = None;
        node.set_membership(t0, membership.clone());
        assert_delivered_follows(&node);
        membership.subscriptions = Some([TopicId(5)].into());
        node.set_membership(t0, membership);
        assert_delivered_follows(&node);
        node.set_subscriptions(Some([TopicId(65_535), TopicId(u32::MAX)].into()));
        assert_delivered_follows(&node);
    }
}
