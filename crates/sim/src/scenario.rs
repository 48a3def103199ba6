//! Scenarios: a cluster of real `proto` nodes with publishers, subscriptions and faults, run on the
//! simulated network while the [`Ledger`] checks the delivery promise.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::rc::Rc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tidings_gms::{Member, MemberConfig, MemberEvent, NamedRequest, ReceivedDatagram};
use tidings_proto::{
    Config, ConfigError, CongestionControl, Delivery, Destination, Event, Membership, MsgId, Node,
    NodeId, RecoveryPacing, RegionId, Time, TopicId,
};

use tidings_seal::Mode;

use crate::attack::{AttackReport, AttackStats, Attacker, AttackerSetup};
use crate::checker::{payload_for, Ledger, PAYLOAD_ID_LEN};
use crate::churn::{ChurnEvent, ChurnKind, Install, MembershipOracle, DETECTION_DEFAULT};
use crate::fault::{FaultError, FaultSpec};
use crate::gms::{from_gms, to_gms, GmsFault, GmsLog, MembershipKind, ServiceRole};
use crate::net::LinkConfig;
use crate::report::{Percentiles, Recovery, RunReport};
use crate::world::{Host, NodeNetConfig, Tap, World, WorldConfig, WorldError};

/// Everything that defines a run; the same scenario and seed give the same run, byte for byte.
#[derive(Clone, Debug, PartialEq)]
pub struct Scenario {
    /// Nodes in all (senders included); every node subscribes according to its interest profile.
    pub nodes: u32,
    /// Nodes `0..senders` publish.
    pub senders: u32,
    /// Whether senders subscribe too (by their profile). Default false: as in the papers'
    /// experiments, senders and receivers are distinct nodes.
    pub senders_subscribe: bool,
    /// Topics, numbered from 1.
    pub topics: u32,
    /// Interest profiles: node `i` has profile `i mod profiles`, and nodes of one profile subscribe
    /// to the same topics, so each profile is a region. `None`: 1 for a single topic, else one
    /// profile per 12 nodes (at least 2), so topics span several regions.
    pub profiles: Option<u32>,
    /// Loss on every node's downlink; blackout and freeze windows on the flaky nodes.
    pub faults: FaultSpec,
    /// Also apply the loss model to every uplink (a sender's uplink loss is a loss of the whole
    /// region, repaired through the region leader's NAK). Default false.
    pub uplink_loss: bool,
    /// How many nodes (the highest-numbered ones, never senders) get the blackout and freeze
    /// windows; each gets a random phase. Default 1, as in paper 000's perturbed-node experiments.
    pub flaky: u32,
    /// Seconds of publishing.
    pub seconds: f64,
    /// Most seconds after publishing stops for everything to become stable (the liveness phase).
    pub drain_seconds: f64,
    /// Seeds the network, the faults, the topics chosen and the protocol's random choices.
    pub seed: u64,
    /// Payload bytes per message. Default 1000 (the papers' experiments).
    pub message_bytes: usize,
    /// Caching replicas per message: the partition size. Default 5 (paper 000).
    pub replication: usize,
    /// Per-sender publish rate in messages per second; `None`: as fast as flow control allows.
    pub publish_rate: Option<f64>,
    /// Link bandwidth of every node, Mbit/s. Default 100 (the papers' cluster).
    pub link_mbps: f64,
    /// One-hop latency of every link ([`LinkConfig::latency`]). Default 50 us (a LAN hop). No
    /// command-line flag: tests set it to give repairs a round trip that does not come from
    /// queueing (the NACK window test of `tests/experiments.rs`).
    pub link_latency: Duration,
    /// Every link serves DCQs and UCAs before the data waiting
    /// ([`LinkConfig::control_priority`]). Default off (one FIFO per link, a plain switch).
    pub control_priority: bool,
    /// Protocol configuration of every node (its `rng_seed` is replaced by one derived from `seed`).
    pub proto: Config,
    /// Random membership events (crash, leave, join, resubscribe) spread over the middle of the
    /// publishing phase; senders never churn. Default 0. With the GMS a leave unsubscribes from
    /// everything (the node stays a member, so its id stays), a join or resubscribe asks for
    /// another profile's topics, and a crash stops the node until the GMS notices.
    pub churn: u32,
    /// Adoptions spread over the middle of the publishing phase: one of the first three
    /// receivers subscribes to one of [`FRESH_TOPICS`] extra topics that no profile takes and
    /// every sender publishes on. A topic whose first subscriber already holds such a topic
    /// joins that node's region, which only adds a topic to it (its streams go on, ADR 30); a
    /// second subscriber moves the topic on. Default 0 (and no extra topics).
    pub adopt: u32,
    /// Abandonments spread over the middle of the publishing phase, after adoptions began: one
    /// of the adopters drops one of the [`FRESH_TOPICS`] if it holds it (else the event does
    /// nothing). A node alone in the region of its fresh topics keeps that region with one topic
    /// fewer, a view its streams go on through (ADR 30, addendum). Default 0; takes effect only
    /// with `adopt`.
    pub abandon: u32,
    /// Membership events at given times, besides the random ones.
    pub churn_events: Vec<ChurnEvent>,
    /// Crash the largest region's leader and one of its partition leaders during publishing.
    pub crash_leaders: bool,
    /// A subscription that stops reading for a while ([`Scenario::slow_consumer_plan`]): the
    /// first receiver holds the first topic it subscribes to from 20% to 70% of the publishing
    /// time (`Member::hold_topic`, as the runtime does for a full subscription), and only
    /// sender 0 publishes that topic, so the node's streams from the other senders do not
    /// carry it. The checker asks that the node delivers the held topic not at all during the
    /// hold and the other streams' messages throughout it, and everything by the end.
    /// Default false.
    pub slow_consumer: bool,
    /// How long a crash goes unnoticed by the membership. Default 300 ms. With the GMS it is the
    /// heartbeat timeout (a ring neighbour's suspicion removes a silent node after a third of it).
    pub detection: Duration,
    /// Which membership service runs: the oracle (default) or the real GMS on an extra node.
    pub membership: MembershipKind,
    /// Approximate regions (ADR 34): the planner (the oracle's, or the GMS's) forms regions under
    /// this bound on each node's waste, in thousandths, and each node delivers its own
    /// subscriptions only. 0 (default): exact regions.
    pub waste_max_permille: u32,
    /// With the GMS: how many replicas run it, on as many extra nodes (1: the one-process
    /// service; 3 or 5: replicated on Raft). Default 1.
    pub gms_replicas: u32,
    /// With replicas: the fault the service suffers, at 40% of the publishing time. Default
    /// none.
    pub gms_fault: Option<GmsFault>,
    /// Changes to links at given times (a throttled link, a link that fails and comes back):
    /// the congestion experiments. Default none.
    pub link_events: Vec<LinkEvent>,
    /// CPU time each accepted publish costs the sender's node (the application's send path on
    /// the node's CPU, competing with packet processing). Default zero.
    pub publish_cost: Duration,
    /// CPU time of every node per datagram received or sent. Default
    /// [`NodeNetConfig::PROC_COST_PER_PACKET_DEFAULT`] (2 us).
    pub proc_cost_per_packet: Duration,
    /// Regions kept apart: topic `t` is wanted by profile `t mod profiles` alone (no random
    /// overlap), and sender `s` publishes only the topics of profile `s mod profiles`, so each
    /// sender feeds one region of its own (the congestion experiment with several bottlenecks,
    /// Gryphon Figs. 12-15). Default false.
    pub regions_apart: bool,
    /// Senders publish their topics in turn (round robin, paper 000's many-topic experiment)
    /// instead of drawing one at random for each message. Default false.
    pub round_robin_topics: bool,
    /// With the GMS: how protocol datagrams are sealed. Any mode but [`Mode::Off`] (the
    /// default) gives every node an identity drawn from the seed, admits it over the real
    /// Noise link (`NodeLink`, `ServiceLink`), has the service hand out datagram keys, and
    /// seals and opens every protocol datagram in each node's `Member`, as the runtime does.
    /// The one-process service only.
    pub security: Mode,
    /// With the GMS: a hostile host joins the LAN ([`crate::attack`]): it sniffs, tries to join
    /// without credentials, replays and forges datagrams, and uses the region keys of a member
    /// the scenario crashes ([`crate::attack::traitor`]) in other regions, and in its own after
    /// the service removed it. Default false.
    pub attacker: bool,
}

/// A subscription that stops reading for a while ([`Scenario::slow_consumer`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlowConsumerPlan {
    /// The node whose subscription stops reading.
    pub node: NodeId,
    /// Its topic, held at the node.
    pub topic: TopicId,
    /// When the hold starts.
    pub from: Time,
    /// When it ends (the topic is released).
    pub until: Time,
}

/// How long after publishing a message of a stream that does not carry the held topic the
/// slow consumer's node has to deliver it, during the hold ([`Scenario::slow_consumer`]).
pub const SLOW_CONSUMER_LAG: Duration = Duration::from_millis(100);

/// Topics no profile takes, for [`Scenario::adopt`].
pub const FRESH_TOPICS: u32 = 3;

/// A change to one node's links at a given time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkEvent {
    /// When it happens.
    pub at: Time,
    /// Whose link.
    pub node: NodeId,
    /// What happens.
    pub change: LinkChange,
}

/// What a [`LinkEvent`] does.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LinkChange {
    /// The switch port towards the node (its downlink) gets a new rate and buffer from now on.
    Downlink {
        /// New serialization rate, bits per second.
        bandwidth_bps: u64,
        /// New drop-tail buffer, bytes.
        buffer_bytes: usize,
    },
    /// The node's uplink gets a new rate and buffer from now on.
    Uplink {
        /// New serialization rate, bits per second.
        bandwidth_bps: u64,
        /// New drop-tail buffer, bytes.
        buffer_bytes: usize,
    },
    /// The node's inbound link fails for this long (everything arriving is lost), then comes
    /// back. Replaces the node's blackout windows.
    Outage {
        /// How long the link stays down.
        duration: Duration,
    },
}

impl Default for Scenario {
    fn default() -> Self {
        Scenario {
            nodes: 21,
            senders: 1,
            senders_subscribe: false,
            topics: 1,
            profiles: None,
            faults: FaultSpec::NONE,
            uplink_loss: false,
            flaky: 1,
            seconds: 5.0,
            drain_seconds: 30.0,
            seed: 1,
            message_bytes: 1000,
            replication: 5,
            publish_rate: None,
            link_mbps: 100.0,
            link_latency: LinkConfig::LATENCY_DEFAULT,
            control_priority: false,
            proto: Config::default(),
            churn: 0,
            adopt: 0,
            abandon: 0,
            churn_events: Vec::new(),
            crash_leaders: false,
            slow_consumer: false,
            detection: DETECTION_DEFAULT,
            membership: MembershipKind::Oracle,
            waste_max_permille: 0,
            gms_replicas: 1,
            gms_fault: None,
            link_events: Vec::new(),
            publish_cost: Duration::ZERO,
            proc_cost_per_packet: NodeNetConfig::PROC_COST_PER_PACKET_DEFAULT,
            regions_apart: false,
            round_robin_topics: false,
            security: Mode::Off,
            attacker: false,
        }
    }
}

/// A scenario that cannot run, and why.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// A field is out of range.
    #[error("scenario: {0}")]
    Invalid(String),
    /// The protocol configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The fault specification is invalid.
    #[error(transparent)]
    Fault(#[from] FaultError),
    /// The simulated world refused the setup.
    #[error(transparent)]
    World(#[from] WorldError),
}

/// Progress of a running scenario, reported about once per simulated second.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    /// Simulated time reached.
    pub now: Time,
    /// Seconds of publishing.
    pub publish_seconds: f64,
    /// Messages published so far.
    pub published: u64,
    /// Messages stable so far.
    pub stable: u64,
}

impl Scenario {
    /// Checks the scenario.
    pub fn validate(&self) -> Result<(), ScenarioError> {
        if self.waste_max_permille >= 1000 {
            return Err(ScenarioError::Invalid(
                "the waste bound must be below 1 (1000 permille)".into(),
            ));
        }
        if !(1..=tidings_gms::REPLICAS_MAX as u32).contains(&self.gms_replicas) {
            return Err(ScenarioError::Invalid(format!(
                "gms_replicas must be 1..={}",
                tidings_gms::REPLICAS_MAX
            )));
        }
        if self.gms_fault.is_some()
            && (self.gms_replicas < 3 || self.membership != MembershipKind::Gms)
        {
            return Err(ScenarioError::Invalid(
                "a GMS fault needs the GMS with 3 or more replicas (--gms --gms-replicas 3)".into(),
            ));
        }
        if (self.security != Mode::Off || self.attacker) && self.membership != MembershipKind::Gms {
            return Err(ScenarioError::Invalid(
                "sealing and the attacker need the GMS (--gms)".into(),
            ));
        }
        if self.attacker && crate::attack::traitor(self.nodes).0 < self.senders {
            return Err(ScenarioError::Invalid(
                "the attacker needs a receiver to crash (more nodes than senders)".into(),
            ));
        }
        let bad = |s: String| Err(ScenarioError::Invalid(s));
        if self.nodes == 0 || self.nodes > 100_000 {
            return bad(format!("--nodes {} must be within 1..=100000", self.nodes));
        }
        if !self.senders_subscribe && self.senders >= self.nodes {
            return bad(format!(
                "--senders {} leaves no receiver among {} nodes",
                self.senders, self.nodes
            ));
        }
        if self.senders == 0 || self.senders > self.nodes {
            return bad(format!(
                "--senders {} must be within 1..=nodes ({})",
                self.senders, self.nodes
            ));
        }
        if self.topics == 0 || self.topics > 1_000_000 {
            return bad(format!(
                "--topics {} must be within 1..=1000000",
                self.topics
            ));
        }
        if self.profiles == Some(0) {
            return bad("--profiles must be at least 1".into());
        }
        if !(self.seconds > 0.0 && self.seconds <= 86_400.0) {
            return bad(format!(
                "--seconds {} must be within (0, 86400]",
                self.seconds
            ));
        }
        if !(self.drain_seconds >= 0.0 && self.drain_seconds <= 86_400.0) {
            return bad(format!(
                "--drain-seconds {} must be within [0, 86400]",
                self.drain_seconds
            ));
        }
        if self.message_bytes < PAYLOAD_ID_LEN {
            return bad(format!(
                "--message-bytes {} must be at least {PAYLOAD_ID_LEN}",
                self.message_bytes
            ));
        }
        if self.replication == 0 {
            return bad("--replication must be at least 1".into());
        }
        if let Some(r) = self.publish_rate {
            if !(r > 0.0 && r.is_finite()) {
                return bad(format!("--rate {r} must be positive"));
            }
        }
        if !(self.link_mbps > 0.0 && self.link_mbps <= 1e6) {
            return bad(format!(
                "--link-mbps {} must be within (0, 1000000]",
                self.link_mbps
            ));
        }
        if self.link_latency > Duration::from_secs(1) {
            return bad(format!(
                "link latency {:?} must be at most 1 s",
                self.link_latency
            ));
        }
        for e in &self.link_events {
            if e.node.0 >= self.nodes {
                return bad(format!("link event for {} of {} nodes", e.node, self.nodes));
            }
            match e.change {
                LinkChange::Downlink {
                    bandwidth_bps,
                    buffer_bytes,
                }
                | LinkChange::Uplink {
                    bandwidth_bps,
                    buffer_bytes,
                } => {
                    if bandwidth_bps == 0 || buffer_bytes < self.proto.max_datagram_bytes {
                        return bad(format!(
                            "link event at {:?}: bandwidth must be positive and the buffer hold a datagram",
                            e.at
                        ));
                    }
                }
                LinkChange::Outage { duration } => {
                    if duration.is_zero() {
                        return bad("an outage must last".into());
                    }
                }
            }
        }
        self.proto.validate()?;
        Ok(())
    }

    /// The membership a node installs: `m`, told the node's own `subscriptions` with
    /// approximate regions (its regions may carry topics it does not subscribe to).
    fn own_membership(&self, m: &Membership, subscriptions: &[TopicId]) -> Membership {
        let mut m = m.clone();
        if self.waste_max_permille > 0 {
            m.subscriptions = Some(subscriptions.iter().copied().collect());
        }
        m
    }

    /// Interest profiles in use.
    #[must_use]
    pub fn profile_count(&self) -> u32 {
        self.profiles
            .unwrap_or(if self.topics == 1 {
                1
            } else {
                (self.nodes / 12).max(2)
            })
            .min(self.nodes)
    }

    /// The topics each node subscribes to (`[i]` for `NodeId(i)`): topic `t` is wanted by profile
    /// `t mod profiles` and by each other profile with probability 0.3, so topics span several
    /// regions and profiles overlap irregularly.
    #[must_use]
    pub fn subscriptions(&self) -> Vec<Vec<TopicId>> {
        let k = self.profile_count() as usize;
        let mut rng = fastrand::Rng::with_seed(self.seed ^ 0x5355_4253);
        let mut by_profile: Vec<Vec<TopicId>> = vec![Vec::new(); k];
        for t in 0..self.topics {
            for (p, topics) in by_profile.iter_mut().enumerate() {
                // The draw is made as before (only for other profiles), so keeping regions
                // apart changes nothing else.
                if p == t as usize % k || (rng.f64() < 0.3 && !self.regions_apart) {
                    topics.push(TopicId(t + 1));
                }
            }
        }
        (0..self.nodes as usize)
            .map(|i| {
                if (i as u32) < self.senders && !self.senders_subscribe {
                    Vec::new()
                } else {
                    by_profile[i % k].clone()
                }
            })
            .collect()
    }

    /// The subscription that stops reading ([`Scenario::slow_consumer`]): the node, its held
    /// topic, and when the hold starts and ends. `None` without the fault, or without a
    /// receiver that subscribes to something.
    #[must_use]
    pub fn slow_consumer_plan(&self) -> Option<SlowConsumerPlan> {
        if !self.slow_consumer || self.senders >= self.nodes {
            return None;
        }
        let node = NodeId(self.senders);
        let topic = *self.subscriptions().get(node.0 as usize)?.first()?;
        Some(SlowConsumerPlan {
            node,
            topic,
            from: Time::ZERO + secs(self.seconds * 0.2),
            until: Time::ZERO + secs(self.seconds * 0.7),
        })
    }

    /// Topics no profile takes, adopted during the run (`adopt`): ids after `topics`.
    #[must_use]
    pub fn fresh_topics(&self) -> u32 {
        if self.adopt > 0 {
            FRESH_TOPICS
        } else {
            0
        }
    }

    /// The topics a joining or resubscribing node takes: those of another receiver's initial
    /// profile (chosen by the node's id, so the run stays deterministic).
    fn profile_topics(&self, node: NodeId) -> Vec<TopicId> {
        let subs = self.subscriptions();
        let current = subs.get(node.0 as usize).cloned().unwrap_or_default();
        let k = self.profile_count().max(1);
        for shift in 1..=k {
            let other = (node.0 + shift) as usize;
            let candidate = subs
                .get(other % subs.len().max(1))
                .cloned()
                .unwrap_or_default();
            if !candidate.is_empty() && candidate != current {
                return candidate;
            }
        }
        current
    }

    /// The membership events of the run: the given ones, the leader crashes if asked, and
    /// `churn` random ones spread over 20%..80% of the publishing phase. Senders never churn.
    #[must_use]
    pub fn churn_plan(&self, membership: &Membership) -> Vec<ChurnEvent> {
        let mut plan = self.churn_events.clone();
        let at = |f: f64| Time::ZERO + secs(self.seconds * f);
        if self.crash_leaders {
            // The promise is for live senders, so only receivers are crashed: the leader of the
            // largest region whose leader is not a sender, then a partition leader of it.
            let receiver = |n: &NodeId| n.0 >= self.senders;
            let region = membership
                .regions
                .values()
                .filter(|r| {
                    r.partitions
                        .first()
                        .and_then(|p| p.first())
                        .is_some_and(receiver)
                })
                .max_by_key(|r| (r.member_count(), r.region));
            if let Some(r) = region {
                plan.push(ChurnEvent {
                    at: at(0.3),
                    kind: ChurnKind::Crash,
                    node: r.partitions[0][0],
                });
                let other = r
                    .partitions
                    .iter()
                    .skip(1)
                    .filter_map(|p| p.first())
                    .find(|n| receiver(n));
                if let Some(&node) = other {
                    plan.push(ChurnEvent {
                        at: at(0.6),
                        kind: ChurnKind::Crash,
                        node,
                    });
                }
            }
        }
        if self.attacker {
            // The removed member whose key the attacker keeps.
            plan.push(ChurnEvent {
                at: at(0.2),
                kind: ChurnKind::Crash,
                node: crate::attack::traitor(self.nodes),
            });
        }
        let mut rng = fastrand::Rng::with_seed(self.seed ^ 0x4348_5552_4e00);
        let receivers: Vec<NodeId> = (self.senders..self.nodes).map(NodeId).collect();
        let mut left: Vec<NodeId> = Vec::new();
        let mut gone: Vec<NodeId> = plan
            .iter()
            .filter(|e| e.kind == ChurnKind::Crash)
            .map(|e| e.node)
            .collect();
        for k in 0..self.churn {
            let time = at(0.2 + 0.6 * (f64::from(k) + 0.5) / f64::from(self.churn));
            let active: Vec<NodeId> = receivers
                .iter()
                .copied()
                .filter(|n| !gone.contains(n) && !left.contains(n))
                .collect();
            let kind = match rng.u8(..4) {
                0 => ChurnKind::Crash,
                1 => ChurnKind::Leave,
                2 if !left.is_empty() => ChurnKind::Join,
                _ => ChurnKind::Resubscribe,
            };
            let node = match kind {
                ChurnKind::Join => left.remove(rng.usize(..left.len())),
                _ if active.len() <= 2 => continue,
                _ => active[rng.usize(..active.len())],
            };
            match kind {
                ChurnKind::Crash => gone.push(node),
                ChurnKind::Leave => left.push(node),
                _ => {}
            }
            plan.push(ChurnEvent {
                at: time,
                kind,
                node,
            });
        }
        // Adoptions, from a generator of their own (plans without them are as before): a few
        // nodes take the fresh topics, so a node often holds one already when it takes another.
        let mut rng = fastrand::Rng::with_seed(self.seed ^ 0x4144_4f50_5400);
        let adopters: Vec<NodeId> = receivers
            .iter()
            .copied()
            .filter(|n| !gone.contains(n))
            .take(3)
            .collect();
        for k in 0..self.adopt {
            if adopters.is_empty() {
                break;
            }
            plan.push(ChurnEvent {
                at: at(0.2 + 0.6 * (f64::from(k) + 0.5) / f64::from(self.adopt)),
                kind: ChurnKind::Adopt(TopicId(self.topics + 1 + rng.u32(..FRESH_TOPICS))),
                node: adopters[rng.usize(..adopters.len())],
            });
        }
        // Abandonments, from a generator of their own again, over 30%..80% of the phase (after
        // the first adoptions, so that there is something to drop).
        let mut rng = fastrand::Rng::with_seed(self.seed ^ 0x4142_414e_444f);
        let abandons = if self.adopt > 0 { self.abandon } else { 0 };
        for k in 0..abandons {
            if adopters.is_empty() {
                break;
            }
            plan.push(ChurnEvent {
                at: at(0.3 + 0.5 * (f64::from(k) + 0.5) / f64::from(self.abandon)),
                kind: ChurnKind::Abandon(TopicId(self.topics + 1 + rng.u32(..FRESH_TOPICS))),
                node: adopters[rng.usize(..adopters.len())],
            });
        }
        plan
    }

    /// The command that replays this scenario.
    #[must_use]
    pub fn replay_command(&self) -> String {
        let d = Scenario::default();
        let mut cmd = format!(
            "tidings sim run --nodes {} --senders {} --topics {} --loss {} --seconds {} --seed {}",
            self.nodes, self.senders, self.topics, self.faults, self.seconds, self.seed
        );
        if let Some(p) = self.profiles {
            cmd += &format!(" --profiles {p}");
        }
        if self.waste_max_permille > 0 {
            cmd += &format!(
                " --waste-max {}",
                f64::from(self.waste_max_permille) / 1000.0
            );
        }
        if self.uplink_loss {
            cmd += " --uplink-loss";
        }
        if self.senders_subscribe {
            cmd += " --senders-subscribe";
        }
        if self.flaky != d.flaky {
            cmd += &format!(" --flaky {}", self.flaky);
        }
        if self.drain_seconds != d.drain_seconds {
            cmd += &format!(" --drain-seconds {}", self.drain_seconds);
        }
        if self.message_bytes != d.message_bytes {
            cmd += &format!(" --message-bytes {}", self.message_bytes);
        }
        if self.replication != d.replication {
            cmd += &format!(" --replication {}", self.replication);
        }
        if let Some(r) = self.publish_rate {
            cmd += &format!(" --rate {r}");
        }
        if self.churn > 0 {
            cmd += &format!(" --churn {}", self.churn);
        }
        if self.adopt > 0 {
            cmd += &format!(" --adopt {}", self.adopt);
        }
        if self.abandon > 0 {
            cmd += &format!(" --abandon {}", self.abandon);
        }
        if self.crash_leaders {
            cmd += " --crash-leaders";
        }
        if self.slow_consumer {
            cmd += " --slow-consumer";
        }
        if self.proto.congestion.control == CongestionControl::Pdcc {
            cmd += " --congestion-control";
        }
        if self.proto.recovery.pacing == RecoveryPacing::Sdcc {
            cmd += " --adaptive-nack-window";
        }
        if self.detection != DETECTION_DEFAULT {
            cmd += &format!(" --detection-ms {}", self.detection.as_millis());
        }
        if self.link_mbps != d.link_mbps {
            cmd += &format!(" --link-mbps {}", self.link_mbps);
        }
        if self.link_latency != d.link_latency {
            // No flag for it: say so rather than print a command that runs something else.
            cmd += &format!(" (and a link latency of {:?})", self.link_latency);
        }
        if self.control_priority {
            cmd += " --control-priority";
        }
        if self.membership == MembershipKind::Gms {
            cmd += " --gms";
            if self.gms_replicas > 1 {
                cmd += &format!(" --gms-replicas {}", self.gms_replicas);
            }
            if let Some(f) = self.gms_fault {
                cmd += &format!(" --gms-fault {}", f.name());
            }
            if self.security != Mode::Off {
                cmd += &format!(" --security {}", self.security.name());
            }
            if self.attacker {
                cmd += " --attacker";
            }
        }
        cmd
    }
}

/// A publisher's plan.
#[derive(Debug)]
struct Publisher {
    topics: Vec<TopicId>,
    rng: fastrand::Rng,
    next_topic: TopicId,
    until: Time,
    interval: Option<Duration>,
    next_at: Time,
    /// Waiting for back pressure to ease (no timer until an input arrives).
    blocked: bool,
    len: usize,
    /// Topics in turn ([`Scenario::round_robin_topics`]); `turn` indexes `next_topic`.
    round_robin: bool,
    turn: usize,
}

/// A simulated node: the real control plane ([`Member`]: the protocol node, and with the GMS its
/// client), its publisher, and the shared checker; or, on the extra node, the membership service.
#[derive(Debug)]
pub struct SimHost {
    member: Member,
    /// This host's simulator id (with the GMS, the protocol node's id is [`to_gms`] of it).
    me: NodeId,
    ledger: Rc<RefCell<Ledger>>,
    publisher: Option<Publisher>,
    /// With the GMS: the nodes that run it (simulator ids), by replica index.
    gms_nodes: Vec<NodeId>,
    /// With the GMS, on its node: the service.
    service: Option<Box<ServiceRole>>,
    gms_log: Option<Rc<RefCell<GmsLog>>>,
    /// Topics this node wants (with the GMS: what it asked the service for).
    wanted: BTreeSet<TopicId>,
    /// Subscriptions asked for and not yet answered, by token.
    asked: BTreeMap<u64, TopicId>,
    /// The protocol's events taken in bulk and not yet handed to the checker (storage kept).
    protocol_events: VecDeque<Event>,
    next_token: u64,
    /// GMS datagrams too large even for fragments (dropped).
    gms_oversize: u64,
    /// Fragments of GMS datagrams larger than the world's datagram limit, waiting to go.
    fragments: VecDeque<(NodeId, Vec<u8>)>,
    /// GMS datagrams fragmented so far (numbers them).
    fragmented: u32,
    /// Fragments received, being put together.
    reassembly: crate::gms::Reassembly,
    /// CPU time per accepted publish ([`Scenario::publish_cost`]).
    publish_cost: Duration,
    /// CPU time spent publishing and not yet charged by the world.
    cpu_charge: Duration,
    /// On the hostile host ([`Scenario::attacker`]): the attacker.
    attacker: Option<Box<Attacker>>,
}

impl SimHost {
    /// The protocol node.
    #[must_use]
    pub fn node(&self) -> &Node {
        self.member.node()
    }

    /// Holds `topic` back at the node: its subscription stops reading
    /// ([`Scenario::slow_consumer`]).
    pub fn hold_topic(&mut self, topic: TopicId) {
        self.member.hold_topic(topic);
    }

    /// Ends [`hold_topic`](Self::hold_topic): what the held streams kept is delivered.
    pub fn release_topic(&mut self, now: Time, topic: TopicId) {
        self.member.release_topic(now, topic);
        self.after_input(now);
    }

    /// Installs a new membership (a view change of the oracle) on the node.
    pub fn apply_membership(&mut self, now: Time, membership: Membership) {
        self.member.set_membership(now, membership);
        self.after_input(now);
    }

    /// The membership service, if this host runs it.
    #[must_use]
    pub fn gms_service(&self) -> Option<&tidings_gms::Gms> {
        self.service.as_ref().map(|s| s.gms())
    }

    /// GMS datagrams dropped for exceeding the world's datagram limit (between replicas: for
    /// being longer than the replicas' fragment size, which fits that limit).
    #[must_use]
    pub fn gms_oversize(&self) -> u64 {
        self.gms_oversize + self.service.as_ref().map_or(0, |s| s.oversize)
    }

    /// The attacker's outcome so far, if this host is the hostile one.
    #[must_use]
    pub fn attack_stats(&self) -> Option<AttackStats> {
        self.attacker.as_ref().map(|a| a.stats())
    }

    /// The member's control-plane counters (sealing and opening included).
    #[must_use]
    pub fn member_stats(&self) -> &tidings_gms::MemberStats {
        self.member.stats()
    }

    /// Whether this node's ids are the GMS's (the node joined through it).
    fn gms_ids(&self) -> bool {
        !self.gms_nodes.is_empty()
    }

    /// The service (or replica) this host runs, for the scenario's faults.
    pub(crate) fn service_mut(&mut self) -> Option<&mut ServiceRole> {
        self.service.as_deref_mut()
    }

    /// Whether this host runs the replica that serves clients now (the leader).
    #[must_use]
    pub fn gms_serving(&self) -> bool {
        self.service.as_ref().is_some_and(|s| s.is_serving())
    }

    /// A protocol node id in simulator ids.
    fn sim_id(&self, node: NodeId) -> NodeId {
        if self.gms_ids() {
            from_gms(node).unwrap_or(node)
        } else {
            node
        }
    }

    /// With the GMS: from now on this node wants exactly `topics`. The member subscribes and
    /// unsubscribes by name, as an application would through the library: a topic it no longer
    /// wants is dropped once its subscription is answered; the view changes arrive later, over
    /// the network. The caller wakes the node so its requests go out.
    pub fn gms_set_topics(&mut self, now: Time, topics: &[TopicId]) {
        if self.member.client().is_none() {
            return;
        }
        let want: BTreeSet<TopicId> = topics.iter().copied().collect();
        for &t in self.wanted.difference(&want) {
            self.member.unsubscribe(t);
        }
        let mut names = Vec::new();
        for &t in want.difference(&self.wanted) {
            let token = self.next_token;
            self.next_token += 1;
            self.asked.insert(token, t);
            names.push((token, crate::gms::topic_name(t)));
        }
        self.wanted = want;
        if !names.is_empty() {
            self.member
                .request_named(now, NamedRequest::Subscribe, names);
        }
        self.after_input(now);
        // A topic subscribed to is delivered from the request on where this node's regions
        // already carry it (approximate regions), before any install says so.
        if self.gms_ids() {
            let m = crate::gms::translate(self.member.node().membership().clone());
            self.ledger
                .borrow_mut()
                .local_topics(self.me, crate::gms::local_topics(&m, self.me));
        }
    }

    /// Hands the member's events to the checker, in the order they happened: what the node
    /// delivered under a membership is judged by that membership, not by the next.
    /// The protocol's events are taken in bulk up to the member's next own event, as the
    /// runtime takes them.
    fn take_events(&mut self, now: Time) {
        let me = self.me;
        let mut events = std::mem::take(&mut self.protocol_events);
        loop {
            self.member.take_protocol_events(&mut events);
            while let Some(ev) = events.pop_front() {
                self.on_protocol_event(ev, now);
            }
            let Some(ev) = self.member.poll_event() else {
                break;
            };
            match ev {
                MemberEvent::Protocol(ev) => self.on_protocol_event(ev, now),
                MemberEvent::Installed { changed } => {
                    // With the oracle the scenario tells the checker; with the GMS, each node's
                    // install is what it may deliver from now on, and the views it installed
                    // must be the same at every member.
                    if self.gms_ids() {
                        let m = crate::gms::translate(self.member.node().membership().clone());
                        let mut ledger = self.ledger.borrow_mut();
                        match &changed {
                            Some(regions) => regions
                                .iter()
                                .filter_map(|r| m.regions.get(r))
                                .for_each(|v| ledger.installed_view(me, v)),
                            None => m
                                .regions
                                .values()
                                .for_each(|v| ledger.installed_view(me, v)),
                        }
                        ledger.local_topics(me, crate::gms::local_topics(&m, me));
                        if self.publisher.is_some() {
                            ledger.sender_view(me, crate::gms::sender_view(&m));
                        }
                    }
                }
                MemberEvent::Answered { token, result } => {
                    let asked = self.asked.remove(&token);
                    if let (Some(topic), Ok(_)) = (asked, result) {
                        if !self.wanted.contains(&topic) {
                            self.member.unsubscribe(topic);
                        }
                    }
                }
                MemberEvent::TopicBound { name, topic } => {
                    if name != crate::gms::topic_name(topic) {
                        self.ledger.borrow_mut().external_violation(format!(
                            "{me} was told topic {name:?} is {topic}, expected {}",
                            crate::gms::topic_name(topic)
                        ));
                    }
                }
                MemberEvent::Removed => {
                    if let Some(log) = &self.gms_log {
                        log.borrow_mut().removed_alive.insert(me);
                    }
                }
                // The checker judges delivery and stability itself; the member's own reports
                // of stalls are for applications.
                // The simulator's clients do not rejoin (`ClientConfig::rejoin` is off).
                MemberEvent::Left
                | MemberEvent::Stalled(_)
                | MemberEvent::StallCleared { .. }
                | MemberEvent::Rejoined { .. }
                | MemberEvent::TopicMoved { .. } => {}
            }
        }
        self.protocol_events = events;
    }

    fn on_protocol_event(&mut self, ev: Event, now: Time) {
        let me = self.me;
        match ev {
            Event::Deliver(d) => {
                let d = Delivery {
                    origin: self.sim_id(d.origin),
                    ..d
                };
                self.ledger.borrow_mut().delivered(me, &d, now);
            }
            Event::Stable { first, last } => {
                let mut ledger = self.ledger.borrow_mut();
                for m in first.0..=last.0 {
                    ledger.stable(me, MsgId(m), now);
                }
            }
            Event::TokenRound { top, rtt, .. } => {
                self.ledger.borrow_mut().token_round(top, rtt);
            }
            // The member reports suspicions to the GMS; the oracle learns of crashes by its
            // own detection delay.
            Event::Suspect { .. } => {}
        }
    }

    fn after_input(&mut self, now: Time) {
        let me = self.me;
        if let Some(service) = self.service.as_mut() {
            service.after_input(now, me, &mut self.ledger.borrow_mut());
        }
        self.take_events(now);
        if let Some(p) = self.publisher.as_mut() {
            p.blocked = false;
            while now < p.until && now >= p.next_at {
                if !self.member.can_publish(p.next_topic, p.len) {
                    p.blocked = true;
                    break;
                }
                let id = self.member.node().stats().messages_published + 1;
                let payload = Bytes::from(payload_for(me, id, p.len));
                match self.member.publish(now, p.next_topic, payload) {
                    Ok(msg_id) => {
                        self.cpu_charge += self.publish_cost;
                        self.ledger
                            .borrow_mut()
                            .published(me, msg_id, p.next_topic, p.len, now)
                    }
                    Err(_) => {
                        p.blocked = true;
                        break;
                    }
                }
                p.next_topic = if p.round_robin {
                    p.turn = (p.turn + 1) % p.topics.len();
                    p.topics[p.turn]
                } else {
                    p.topics[p.rng.usize(..p.topics.len())]
                };
                if let Some(iv) = p.interval {
                    p.next_at += iv;
                }
            }
            if now >= p.until {
                // Done publishing: no more publisher timer.
                p.next_at = Time::MAX;
            }
        }
        self.take_events(now);
    }
}

impl Host for SimHost {
    fn handle_datagram(&mut self, now: Time, datagram: Bytes) {
        if let Some(a) = self.attacker.as_mut() {
            a.handle_datagram(now, datagram);
            return;
        }
        let whole;
        let datagram = match self.reassembly.take(&datagram) {
            Some(d) => {
                whole = Bytes::from(d);
                whole
            }
            None if datagram.starts_with(&crate::gms::FRAGMENT_MAGIC) => {
                self.after_input(now);
                return;
            }
            None => datagram,
        };
        if let Some((from, body)) = crate::gms::unwrap_replica(&datagram) {
            if let Some(service) = self.service.as_mut() {
                service.handle_replica(now, from, body);
            }
        } else if let Some((from, body)) = crate::gms::unwrap(&datagram) {
            if let Some(service) = self.service.as_mut() {
                service.handle_datagram(now, from, body);
            } else if let Some(replica) = self.gms_nodes.iter().position(|&n| n == from) {
                self.member.handle_gms_datagram(now, replica, body);
            }
        } else {
            // As the runtime does: a sealed datagram is opened where it was received (the
            // copy here stands for the kernel's into the receive buffer), then handed over.
            let opened = if self.member.seals() {
                let mut buf = BytesMut::from(&datagram[..]);
                self.member.open_received(&mut buf).map(|len| {
                    buf.truncate(len);
                    buf.freeze()
                })
            } else {
                Some(datagram)
            };
            if let Some(opened) = opened {
                self.member
                    .handle_datagram(now, ReceivedDatagram::Opened(opened));
            }
        }
        self.after_input(now);
    }

    fn handle_timeout(&mut self, now: Time) {
        if let Some(a) = self.attacker.as_mut() {
            a.handle_timeout(now);
            return;
        }
        self.member.handle_timeout(now);
        if let Some(service) = self.service.as_mut() {
            service.handle_timeout(now);
        }
        self.after_input(now);
    }

    fn poll_transmit(&mut self, now: Time, buf: &mut [u8]) -> Option<(Destination, usize)> {
        if let Some(a) = self.attacker.as_mut() {
            return a.poll_transmit(buf);
        }
        loop {
            if let Some((to, bytes)) = self.fragments.pop_front() {
                if let Some(slot) = buf.get_mut(..bytes.len()) {
                    slot.copy_from_slice(&bytes);
                    return Some((Destination::Node(to), bytes.len()));
                }
                continue;
            }
            let next = match self.service.as_mut() {
                Some(service) => service.outgoing.pop_front(),
                None => self
                    .member
                    .poll_gms_transmit()
                    .and_then(|(replica, datagram)| {
                        let to = *self.gms_nodes.get(replica)?;
                        Some((to, crate::gms::wrap(self.me, &datagram)))
                    }),
            };
            let Some((to, bytes)) = next else { break };
            if let Some(slot) = buf.get_mut(..bytes.len()) {
                slot.copy_from_slice(&bytes);
                return Some((Destination::Node(to), bytes.len()));
            }
            // Larger than a datagram: in fragments, as IP would send it.
            self.fragmented = self.fragmented.wrapping_add(1);
            let pieces = crate::gms::fragments(self.me, self.fragmented, &bytes, buf.len());
            if pieces.is_empty() {
                self.gms_oversize += 1;
            }
            self.fragments.extend(pieces.into_iter().map(|f| (to, f)));
        }
        let t = self
            .member
            .poll_transmit(now, buf)
            .expect("the world's transmit buffer holds max_datagram_bytes")?;
        let destination = match t.destination {
            Destination::Node(n) => Destination::Node(self.sim_id(n)),
            region => region,
        };
        Some((destination, t.len))
    }

    fn poll_regions(&mut self) -> Option<BTreeMap<RegionId, Vec<NodeId>>> {
        self.service.as_mut().and_then(|s| s.poll_regions())
    }

    fn take_cpu_charge(&mut self) -> Duration {
        std::mem::take(&mut self.cpu_charge)
    }

    fn poll_timeout(&self) -> Option<Time> {
        if let Some(a) = self.attacker.as_ref() {
            return a.poll_timeout();
        }
        let publish = self
            .publisher
            .as_ref()
            .filter(|p| !p.blocked && p.next_at < p.until)
            .map(|p| p.next_at);
        let gms = self.service.as_ref().and_then(|s| s.poll_timeout());
        // Asked twice in every turn of every node: pairwise, without an iterator.
        let earliest = |a: Option<Time>, b: Option<Time>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        earliest(earliest(self.member.poll_timeout(), publish), gms)
    }
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// A built scenario: the world of hosts, the shared checker, the membership service and the
/// initial membership.
pub struct Built {
    /// The simulated world of hosts.
    pub world: World<SimHost>,
    /// The checker, shared with every host.
    pub ledger: Rc<RefCell<Ledger>>,
    /// The membership service of the run.
    pub oracle: MembershipOracle,
    /// The initial membership.
    pub membership: Membership,
    /// With the GMS: what it did during the run (shared with its host).
    pub gms_log: Option<Rc<RefCell<GmsLog>>>,
    /// With [`Scenario::attacker`]: the hostile host's id.
    pub attacker: Option<NodeId>,
}

/// A host whose protocol node takes part in no region (the GMS's, the attacker's): what it
/// runs beside the node is set by the caller.
fn idle_host(
    s: &Scenario,
    me: NodeId,
    ledger: &Rc<RefCell<Ledger>>,
    gms_log: &Option<Rc<RefCell<GmsLog>>>,
) -> Result<SimHost, tidings_gms::MemberError> {
    let member = Member::with_membership(
        s.proto.clone(),
        MemberConfig::default(),
        me,
        Membership::default(),
        Time::ZERO,
    )?;
    Ok(SimHost {
        member,
        me,
        ledger: ledger.clone(),
        publisher: None,
        gms_nodes: Vec::new(),
        service: None,
        gms_log: gms_log.clone(),
        wanted: BTreeSet::new(),
        asked: BTreeMap::new(),
        protocol_events: VecDeque::new(),
        next_token: 1,
        gms_oversize: 0,
        fragments: VecDeque::new(),
        fragmented: 0,
        reassembly: crate::gms::Reassembly::default(),
        publish_cost: s.publish_cost,
        cpu_charge: Duration::ZERO,
        attacker: None,
    })
}

/// Builds the world of a scenario: the nodes, their subscriptions and faults.
pub fn build(s: &Scenario) -> Result<Built, ScenarioError> {
    s.validate()?;
    let subs = s.subscriptions();
    let mut oracle = MembershipOracle::new(&subs, s.replication).approximate(s.waste_max_permille);
    let oracle_membership = oracle.membership();
    let ledger = Rc::new(RefCell::new(Ledger::new(&subs)));
    let mut links: Vec<Option<tidings_gms::NodeLink>> = Vec::new();
    let mut service_key = None;
    let (membership, mut clients, services, own, gms_log) = match s.membership {
        MembershipKind::Oracle => (oracle_membership, Vec::new(), Vec::new(), None, None),
        MembershipKind::Gms => {
            let b = crate::gms::bootstrap(
                s.seed,
                &subs,
                s.senders,
                s.topics + s.fresh_topics(),
                &crate::gms::ServiceSetup {
                    detection: s.detection,
                    partition_size: s.replication,
                    replicas: s.gms_replicas,
                    waste_max_permille: s.waste_max_permille,
                    datagram_bytes: s.proto.max_datagram_bytes,
                    security: s.security,
                },
            )
            .map_err(|e| ScenarioError::Invalid(format!("gms bootstrap: {e}")))?;
            links = b.links.into_iter().map(Some).collect();
            service_key = b.service_key;
            let mut l = ledger.borrow_mut();
            l.asynchronous();
            for (&r, v) in &b.global.regions {
                l.view_issued(r, v.view, Time::ZERO);
            }
            for (i, m) in b.memberships.iter().enumerate() {
                let me = NodeId(i as u32);
                l.local_topics(me, crate::gms::local_topics(m, me));
                if me.0 < s.senders {
                    l.sender_view(me, crate::gms::sender_view(m));
                }
            }
            let clients: Vec<Option<tidings_gms::GmsClient>> =
                b.clients.into_iter().map(Some).collect();
            (
                b.global,
                clients,
                b.services,
                Some(b.memberships),
                Some(b.log),
            )
        }
    };
    let all_topics: Vec<TopicId> = (1..=s.topics + s.fresh_topics()).map(TopicId).collect();
    let mut hosts = Vec::with_capacity(s.nodes as usize + 1);
    for i in 0..s.nodes {
        let config = {
            let mut c = s.proto.clone();
            c.rng_seed = s.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(i);
            c
        };
        let member = match clients.get_mut(i as usize).and_then(Option::take) {
            Some(client) => {
                let member = Member::joined(
                    config,
                    crate::gms::member_config(s.security),
                    client,
                    Time::ZERO,
                )
                .map_err(|e| ScenarioError::Invalid(format!("node {i}: {e}")))?;
                match links.get_mut(i as usize).and_then(Option::take) {
                    Some(link) => member.with_link(link),
                    None => member,
                }
            }
            None => Member::with_membership(
                config,
                MemberConfig::default(),
                NodeId(i),
                s.own_membership(&membership, oracle.subscriptions_of(NodeId(i))),
                Time::ZERO,
            )
            .map_err(|e| ScenarioError::Invalid(format!("node {i}: {e}")))?,
        };
        if gms_log.is_some() {
            debug_assert_eq!(member.id(), to_gms(NodeId(i)));
            debug_assert!(own
                .as_ref()
                .and_then(|o| o.get(i as usize))
                .is_some_and(|m| {
                    m == &crate::gms::translate(member.node().membership().clone())
                }));
        }
        let publisher = (i < s.senders).then(|| {
            let mut rng = fastrand::Rng::with_seed(s.seed ^ (u64::from(i) << 40) ^ 0x0050_5542);
            let k = s.profile_count().max(1);
            let topics: Vec<TopicId> = if s.regions_apart {
                all_topics
                    .iter()
                    .copied()
                    .filter(|t| (t.0 - 1) % k == i % k)
                    .collect()
            } else {
                all_topics.clone()
            };
            // A sender with no topic of its own (more senders than topics) publishes to all.
            let mut topics = if topics.is_empty() {
                all_topics.clone()
            } else {
                topics
            };
            // Only sender 0 publishes the slow consumer's topic.
            if let Some(plan) = s.slow_consumer_plan().filter(|_| i != 0) {
                if topics.len() > 1 {
                    topics.retain(|&t| t != plan.topic);
                }
            }
            let (next_topic, turn) = if s.round_robin_topics {
                (topics[0], 0)
            } else {
                (topics[rng.usize(..topics.len())], 0)
            };
            Publisher {
                round_robin: s.round_robin_topics,
                turn,
                topics,
                rng,
                next_topic,
                until: Time::ZERO + secs(s.seconds),
                interval: s.publish_rate.map(|r| secs(1.0 / r)),
                next_at: Time::ZERO,
                blocked: false,
                len: s.message_bytes,
            }
        });
        hosts.push(SimHost {
            member,
            me: NodeId(i),
            ledger: ledger.clone(),
            publisher,
            gms_nodes: (0..services.len() as u32)
                .map(|k| NodeId(s.nodes + k))
                .collect(),
            service: None,
            gms_log: gms_log.clone(),
            wanted: subs[i as usize].iter().copied().collect(),
            asked: BTreeMap::new(),
            protocol_events: VecDeque::new(),
            next_token: 1,
            gms_oversize: 0,
            fragments: VecDeque::new(),
            fragmented: 0,
            reassembly: crate::gms::Reassembly::default(),
            publish_cost: s.publish_cost,
            cpu_charge: Duration::ZERO,
            attacker: None,
        });
    }
    let service_nodes = services.len() as u32;
    for (k, service) in services.into_iter().enumerate() {
        let me = NodeId(s.nodes + k as u32);
        // A GMS node: an idle protocol node (no regions) beside the service or its replica.
        let mut host = idle_host(s, me, &ledger, &gms_log)
            .map_err(|e| ScenarioError::Invalid(format!("the GMS node: {e}")))?;
        host.service = Some(Box::new(service));
        hosts.push(host);
    }
    let attacker = if s.attacker {
        let me = NodeId(s.nodes + service_nodes);
        let (_, mut client) = crate::gms::configs(s.detection, s.replication);
        client.seed = s.seed ^ 0x4556_494c_0000;
        let joining = tidings_gms::Joining::new(
            s.proto.clone(),
            crate::gms::member_config(s.security),
            client,
        )
        .map_err(|e| ScenarioError::Invalid(format!("the attacker: {e}")))?;
        let attacker = Attacker::new(AttackerSetup {
            me,
            nodes: s.nodes,
            gms: NodeId(s.nodes),
            topics: s.topics,
            mode: s.security,
            service_key,
            start: Time::ZERO + secs(s.seconds * 0.1),
            until: Time::ZERO + secs(s.seconds + 0.5),
            seed: s.seed,
            joining,
        })
        .map_err(ScenarioError::Invalid)?;
        let mut host = idle_host(s, me, &ledger, &gms_log)
            .map_err(|e| ScenarioError::Invalid(format!("the attacker's node: {e}")))?;
        host.attacker = Some(Box::new(attacker));
        hosts.push(host);
        Some(me)
    } else {
        None
    };
    let link = LinkConfig {
        bandwidth_bps: (s.link_mbps * 1e6) as u64,
        latency: s.link_latency,
        control_priority: s.control_priority,
        ..LinkConfig::default()
    };
    let base = NodeNetConfig {
        uplink: link,
        downlink: link,
        proc_cost_per_packet: s.proc_cost_per_packet,
        ..NodeNetConfig::default()
    };
    let mut world_config = WorldConfig::uniform(s.seed, hosts.len(), &base);
    world_config.max_datagram = s.proto.max_datagram_bytes;
    world_config.tap = attacker.map(|node| Tap {
        node,
        every: crate::attack::TAP_EVERY,
    });
    let mut rng = fastrand::Rng::with_seed(s.seed ^ 0x464c_414b);
    let flaky_from = s.nodes.saturating_sub(s.flaky).max(s.senders);
    let horizon = secs(s.seconds);
    for (i, node) in world_config.nodes.iter_mut().enumerate() {
        let loss_only = FaultSpec {
            blackout: None,
            freeze: None,
            ..s.faults
        };
        node.apply_faults(&loss_only)?;
        if s.uplink_loss {
            if let Some(loss) = &s.faults.loss {
                node.loss_up = loss.model()?;
            }
        }
        if i as u32 >= flaky_from && (i as u32) < s.nodes {
            // A random phase within the run, so even a short run sees the perturbation.
            let phase = |period: Duration, rng: &mut fastrand::Rng| {
                let span = period.min(horizon).as_nanos().max(1) as u64;
                Duration::from_nanos(rng.u64(..span))
            };
            if let Some(b) = s.faults.blackout {
                node.blackout = Some(b.with_phase(phase(b.period, &mut rng)));
            }
            if let Some(f) = s.faults.freeze {
                node.freeze = Some(f.with_phase(phase(f.period, &mut rng)));
            }
        }
    }
    let regions = membership
        .regions
        .iter()
        .map(|(&r, v)| (r, v.members().collect()))
        .collect();
    let world = World::new(world_config, hosts, regions)?;
    Ok(Built {
        world,
        ledger,
        oracle,
        membership,
        gms_log,
        attacker,
    })
}

/// Runs a scenario to completion (everything stable) or to the end of its drain time, calling
/// `progress` about once per simulated second.
pub fn run(s: &Scenario, progress: &mut dyn FnMut(&Progress)) -> Result<RunReport, ScenarioError> {
    run_observed(s, progress, &mut |_, _, _| {})
}

/// [`run`], also calling `observe(now, world, ledger)` every 100 ms of simulated time (the
/// experiments' time series).
pub fn run_observed(
    s: &Scenario,
    progress: &mut dyn FnMut(&Progress),
    observe: &mut dyn FnMut(Time, &World<SimHost>, &Ledger),
) -> Result<RunReport, ScenarioError> {
    let Built {
        mut world,
        ledger,
        mut oracle,
        membership,
        gms_log,
        attacker,
    } = build(s)?;
    let mut crash_times: BTreeMap<NodeId, Time> = BTreeMap::new();
    let mut events = s.churn_plan(&membership);
    events.sort_by_key(|e| e.at);
    let mut events = std::collections::VecDeque::from(events);
    let mut link_events = s.link_events.clone();
    link_events.sort_by_key(|e| e.at);
    let mut link_events = std::collections::VecDeque::from(link_events);
    let mut installs: Vec<Install> = Vec::new();
    let mut crashed = vec![false; s.nodes as usize];
    // Each node's subscriptions as churn changed them (an adoption adds to them).
    let mut subscribed: Vec<Vec<TopicId>> = s.subscriptions();
    let mut churn_log = Vec::new();
    let mut view_changes = 0u64;
    let step = Duration::from_millis(100);
    let publish_end = Time::ZERO + secs(s.seconds);
    let hard_end = publish_end + secs(s.drain_seconds);
    let mut t = Time::ZERO;
    // The GMS fault, due at 40% of the publishing time (and again at each step until a leader
    // is there to strike).
    let mut gms_fault = s.gms_fault.map(|f| (f, Time::ZERO + secs(s.seconds * 0.4)));
    // The slow consumer's hold and release, in turn.
    let slow_consumer = s.slow_consumer_plan();
    let mut slow_events: std::collections::VecDeque<(Time, bool)> = slow_consumer
        .map(|p| [(p.from, true), (p.until, false)])
        .into_iter()
        .flatten()
        .collect();
    let mut next_sample = Time::ZERO;
    let mut pending_samples: Vec<u64> = Vec::new();
    let mut next_progress = Time::ZERO + Duration::from_secs(1);
    let completion = loop {
        let next_event = events.front().map(|e| e.at);
        let next_install = installs.iter().map(|i| i.at).min();
        let next_link = link_events.front().map(|e| e.at);
        t = [
            Some(next_sample + step),
            next_event,
            next_install,
            next_link,
            gms_fault.map(|(_, at)| at.max(t)),
            slow_events.front().map(|&(at, _)| at),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(t + step);
        world.run_until(t);
        // Link changes due now.
        while link_events.front().is_some_and(|e| e.at <= t) {
            let Some(e) = link_events.pop_front() else {
                break;
            };
            match e.change {
                LinkChange::Downlink {
                    bandwidth_bps,
                    buffer_bytes,
                } => world.reconfigure_downlink(e.node, bandwidth_bps, buffer_bytes)?,
                LinkChange::Uplink {
                    bandwidth_bps,
                    buffer_bytes,
                } => world.reconfigure_uplink(e.node, bandwidth_bps, buffer_bytes)?,
                LinkChange::Outage { duration } => {
                    let start = t.as_nanos() % (1u64 << 62);
                    let window = crate::fault::Periodic {
                        duration,
                        period: Duration::from_nanos(1 << 62),
                        phase: Duration::from_nanos(start),
                    };
                    world.set_blackout(e.node, Some(window))?;
                }
            }
        }
        while let Some(&(_, hold)) = slow_events.front().filter(|&&(at, _)| at <= t) {
            slow_events.pop_front();
            let Some(plan) = slow_consumer else { break };
            if crashed[plan.node.0 as usize] {
                continue;
            }
            let host = world.host_mut(plan.node);
            if hold {
                host.hold_topic(plan.topic);
                ledger
                    .borrow_mut()
                    .hold_started(plan.node, plan.topic, t, SLOW_CONSUMER_LAG);
            } else {
                ledger.borrow_mut().hold_ended(t);
                host.release_topic(t, plan.topic);
            }
            world.wake(plan.node)?;
        }
        if let Some((fault, at)) = gms_fault.filter(|&(_, at)| at <= t) {
            if strike_gms(&mut world, s, fault, t)? {
                gms_fault = None;
                if let Some(log) = &gms_log {
                    log.borrow_mut().fault_at = Some(t);
                }
            } else {
                // No leader yet: try again a little later.
                gms_fault = Some((fault, at.max(t) + Duration::from_millis(10)));
            }
        }
        // Membership events due now.
        while events.front().is_some_and(|e| e.at <= t) {
            let Some(e) = events.pop_front() else { break };
            if crashed[e.node.0 as usize] {
                continue;
            }
            if let ChurnKind::Abandon(topic) = e.kind {
                if subscribed[e.node.0 as usize].binary_search(&topic).is_err() {
                    // Nothing to drop: the event does nothing (and is not logged).
                    continue;
                }
            }
            churn_log.push(e.to_string());
            match e.kind {
                ChurnKind::Crash => {
                    if let Some(a) = attacker.filter(|_| e.node == crate::attack::traitor(s.nodes))
                    {
                        // The removed member's region keys go to the attacker.
                        let keys: Vec<(RegionId, u32, [u8; 32])> = world
                            .host(e.node)
                            .member
                            .client()
                            .map(|c| c.region_keys().map(|(r, id, k)| (r, id, k.0)).collect())
                            .unwrap_or_default();
                        if let Some(h) = world.host_mut(a).attacker.as_mut() {
                            for (region, id, secret) in keys {
                                h.steal(region, id, secret, to_gms(e.node));
                            }
                        }
                    }
                    crashed[e.node.0 as usize] = true;
                    world.crash(e.node, t)?;
                    ledger.borrow_mut().crashed(e.node);
                    crash_times.insert(e.node, t);
                    if gms_log.is_none() {
                        installs.push(Install {
                            at: t + s.detection,
                            cause: e,
                        });
                    }
                }
                ChurnKind::Leave
                | ChurnKind::Join
                | ChurnKind::Resubscribe
                | ChurnKind::Adopt(_)
                | ChurnKind::Abandon(_) => {
                    let topics = match e.kind {
                        ChurnKind::Leave => Vec::new(),
                        ChurnKind::Adopt(topic) => {
                            let mut topics = subscribed[e.node.0 as usize].clone();
                            if let Err(at) = topics.binary_search(&topic) {
                                topics.insert(at, topic);
                            }
                            topics
                        }
                        ChurnKind::Abandon(topic) => {
                            let mut topics = subscribed[e.node.0 as usize].clone();
                            topics.retain(|&t| t != topic);
                            topics
                        }
                        _ => s.profile_topics(e.node),
                    };
                    subscribed[e.node.0 as usize].clone_from(&topics);
                    if gms_log.is_some() {
                        // The client asks the GMS; the GMS tells the checker when it applies it.
                        world.host_mut(e.node).gms_set_topics(t, &topics);
                        world.wake(e.node)?;
                        continue;
                    }
                    oracle.set(e.node, &topics);
                    ledger.borrow_mut().set_subscriptions(e.node, &topics, t);
                    installs.push(Install { at: t, cause: e });
                }
            }
        }
        // Memberships that take effect now.
        let (due, later): (Vec<Install>, Vec<Install>) =
            installs.drain(..).partition(|i| i.at <= t);
        installs = later;
        if !due.is_empty() {
            for i in &due {
                if i.cause.kind == ChurnKind::Crash {
                    oracle.remove(i.cause.node);
                }
            }
            let m = oracle.membership();
            world.set_regions(
                m.regions
                    .iter()
                    .map(|(&r, v)| (r, v.members().collect()))
                    .collect(),
            )?;
            view_changes += 1;
            ledger.borrow_mut().view_change(t);
            for n in 0..s.nodes {
                if !crashed[n as usize] {
                    let own = s.own_membership(&m, oracle.subscriptions_of(NodeId(n)));
                    world.host_mut(NodeId(n)).apply_membership(t, own);
                    world.wake(NodeId(n))?;
                }
            }
        }
        if t < next_sample + step {
            continue;
        }
        next_sample = t;
        observe(t, &world, &ledger.borrow());
        for i in 0..s.senders {
            pending_samples.push(world.host(NodeId(i)).node().stats().unstable_msgs_current);
        }
        let (published, stable, all_stable) = {
            let l = ledger.borrow();
            (l.published_total(), l.stable_total(), l.all_stable())
        };
        if t >= next_progress {
            progress(&Progress {
                now: t,
                publish_seconds: s.seconds,
                published,
                stable,
            });
            next_progress += Duration::from_secs(1);
        }
        // With the GMS, also wait until it has removed every crashed node.
        let settled = gms_log.as_ref().is_none_or(|l| {
            let l = l.borrow();
            crash_times.keys().all(|n| l.removed.contains_key(n))
        });
        if t >= publish_end
            && all_stable
            && slow_events.is_empty()
            && events.is_empty()
            && installs.is_empty()
            && link_events.is_empty()
            && settled
        {
            break Some(t);
        }
        if t >= hard_end {
            break None;
        }
    };
    if let Some(log) = &gms_log {
        let l = log.borrow();
        let mut ledger = ledger.borrow_mut();
        for &n in &l.removed_alive {
            if !crashed[n.0 as usize] {
                let why = l
                    .removed
                    .get(&n)
                    .map_or(String::new(), |(t, cause)| format!(" ({cause:?} at {t:?})"));
                ledger.external_violation(format!("the GMS removed {n}, which was alive{why}"));
            }
        }
        let oversize: u64 = world.hosts().iter().map(SimHost::gms_oversize).sum();
        if oversize > 0 {
            ledger.external_violation(format!(
                "{oversize} GMS datagram(s) exceeded the datagram limit"
            ));
        }
    }
    let attack = attacker.map(|a| {
        let foreign_joins = gms_log.as_ref().map_or(0, |l| l.borrow().foreign_joins);
        attack_report(s, &world, a, foreign_joins, &mut ledger.borrow_mut())
    });
    ledger.borrow_mut().finish(world.now());
    // The serving replica's (or the one service's) membership; any replica's without one.
    let service_hosts = || world.hosts().iter().skip(s.nodes as usize);
    let final_host = service_hosts()
        .find(|h| h.gms_serving())
        .or_else(|| service_hosts().next());
    let final_membership = match final_host.and_then(SimHost::gms_service) {
        Some(gms) => crate::gms::global_membership(gms),
        None => oracle.membership(),
    };
    let mut report = RunReport::build(
        s,
        &world,
        &ledger.borrow(),
        &final_membership,
        &pending_samples,
        completion,
    );
    report.view_changes = view_changes;
    report.churn = churn_log;
    report.attack = attack;
    if let Some(log) = &gms_log {
        let l = log.borrow();
        report.membership = "gms";
        report.view_changes = l.view_changes;
        let mut h = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3)
            .map_err(|e| ScenarioError::Invalid(format!("histogram: {e}")))?;
        for (n, at) in &crash_times {
            if let Some((removed, _)) = l.removed.get(n) {
                let _ = h.record(((*removed - *at).as_micros() as u64).max(1));
            }
        }
        report.crash_detection_ms = percentiles_ms(&h);
        if let Some(at) = l.fault_at {
            let ms = |t: Time| (t - at).as_secs_f64() * 1e3;
            report.gms_fault_to_leader_ms = l
                .leaderships
                .iter()
                .find(|&&(when, _)| when >= at)
                .map(|&(when, _)| ms(when));
            report.gms_fault_to_view_ms = l.first_view_after_fault.map(ms);
        }
    }
    Ok(report)
}

/// What the attacker sent and what the members and the service refused; with sealing on, an
/// attack that no counter shows is a violation (the members must have seen it), and so is the
/// service taking the attacker's join in any mode.
fn attack_report(
    s: &Scenario,
    world: &World<SimHost>,
    attacker: NodeId,
    foreign_joins: u64,
    ledger: &mut Ledger,
) -> AttackReport {
    let mut r = AttackReport {
        sent: world.host(attacker).attack_stats().unwrap_or_default(),
        ..AttackReport::default()
    };
    for i in 0..s.nodes {
        let m = world.host(NodeId(i)).member_stats();
        r.refused.add(&m.open);
        if let Some(l) = world.host(NodeId(i)).member.link_stats() {
            r.members_gms_refused += l.refused;
        }
    }
    if let Some(l) = world
        .host(NodeId(s.nodes))
        .service
        .as_ref()
        .and_then(|svc| svc.link_stats())
    {
        r.gms_not_admitted = l.not_admitted;
        r.gms_plain_dropped = l.plain_dropped;
        r.gms_bad_hellos = l.bad_hellos;
        r.gms_refused = l.refused;
        r.gms_no_session = l.no_session;
    }
    if r.sent.joined || foreign_joins > 0 {
        ledger.external_violation(format!(
            "the service took {foreign_joins} join(s) from the attacker"
        ));
    }
    if s.security != Mode::Off {
        let f = &r.refused;
        let seen = [
            (
                "its join",
                r.sent.join_datagrams > 3,
                r.gms_not_admitted > 0,
            ),
            (
                "forged tags",
                r.sent.forged_data + r.sent.forged_control > 20,
                f.bad_tag > 0,
            ),
            (
                "guessed key ids",
                r.sent.forged_unknown_key > 20,
                f.unknown_key > 0,
            ),
            (
                "replays",
                r.sent.replayed > 20,
                f.replayed + f.too_old + f.retired_key > 0,
            ),
            (
                "the removed member's key",
                r.sent.old_key > 10,
                f.retired_key > 0,
            ),
            (
                "a region's key in another region",
                r.sent.cross_region > 10,
                f.unknown_key + f.bad_tag > 0,
            ),
            (
                "forged GMS requests",
                r.sent.forged_gms > 5,
                r.gms_plain_dropped > 0,
            ),
        ];
        for (what, sent, refused) in seen {
            if sent && !refused {
                ledger.external_violation(format!("the attacker's {what} went unrefused: {r:?}"));
            }
        }
    }
    r
}

/// Strikes the replicated GMS with `fault` at `now`; false if no replica leads yet.
fn strike_gms(
    world: &mut World<SimHost>,
    s: &Scenario,
    fault: GmsFault,
    now: Time,
) -> Result<bool, ScenarioError> {
    let replicas = s.gms_replicas;
    let node = |k: u32| NodeId(s.nodes + k);
    let Some(leader) = (0..replicas).find(|&k| world.host(node(k)).gms_serving()) else {
        return Ok(false);
    };
    match fault {
        GmsFault::CrashLeader => world.crash(node(leader), now)?,
        GmsFault::IsolateLeader => {
            let r = world
                .host_mut(node(leader))
                .service_mut()
                .ok_or_else(|| ScenarioError::Invalid("the leader runs no replica".into()))?;
            r.isolate(now + Duration::from_secs(1));
            world.wake(node(leader))?;
        }
        GmsFault::RestartReplica => {
            let follower = node((leader + 1) % replicas);
            let r = world
                .host_mut(follower)
                .service_mut()
                .ok_or_else(|| ScenarioError::Invalid("the follower runs no replica".into()))?;
            r.restart().map_err(ScenarioError::Invalid)?;
            world.wake(follower)?;
        }
    }
    Ok(true)
}

/// Per-node and summed protocol counters (helpers for the report).
pub(crate) fn recovery_totals(world: &World<SimHost>) -> Recovery {
    let mut r = Recovery::default();
    for h in world.hosts() {
        let s = h.node().stats();
        r.pulls_sent += s.pulls_sent;
        r.messages_rehomed += s.messages_rehomed;
        r.views_continued += s.views_continued;
        r.pulls_to_sender += s.pulls_to_sender;
        r.pull_seqs_requested += s.pull_seqs_requested;
        r.repairs_received += s.repairs_received;
        r.messages_pushed += s.messages_pushed;
        r.messages_resent_on_pull += s.messages_resent_on_pull;
        r.messages_resent_on_nak += s.messages_resent_on_nak;
        r.naks_sent += s.naks_sent;
        r.acks_sent += s.acks_sent;
        r.tokens_lost += s.tokens_lost;
        r.tokens_resent += s.tokens_resent;
        r.suspicions += s.suspicions;
        r.ucas_received += s.ucas_received;
        r.publish_rate_limited += s.publish_rate_limited;
        r.token_rounds_completed += s.token_rounds_completed;
        r.duplicates_dropped += s.duplicates_dropped;
        r.out_of_window_dropped += s.out_of_window_dropped;
        r.repair_misses += s.repair_misses;
        r.repair_queue_overflows += s.repair_queue_overflows;
        r.repair_queue_expired += s.repair_queue_expired;
        r.malformed_dropped += s.malformed_dropped + s.invalid_dropped;
    }
    r
}

/// Percentiles of a histogram in milliseconds.
pub(crate) fn percentiles_ms(h: &hdrhistogram::Histogram<u64>) -> Percentiles {
    let ms = |us: u64| us as f64 / 1000.0;
    if h.is_empty() {
        return Percentiles::default();
    }
    Percentiles {
        p50: ms(h.value_at_quantile(0.5)),
        p99: ms(h.value_at_quantile(0.99)),
        max: ms(h.max()),
        count: h.len(),
    }
}
