//! One replica of the membership service replicated on Raft (ADR 32), sans-IO.
//!
//! `n` replicas (3 or 5; 1 works too) each own a [`Gms`] and a raft-rs node. The leader turns
//! what it hears from clients and what its failure detection finds into [`Decision`]s, which
//! it proposes; every replica applies the committed ones in log order at the time the leader
//! stamped on them, so every replica holds the same state and numbers every member's update
//! stream alike. Only the leader that has applied its whole log serves clients: it sends the
//! update streams (each message [`GmsMessage::Stamped`] with its term), detects failures and so
//! issues views. A follower answers a client [`GmsMessage::Redirect`] to the leader it knows.

mod codec;
mod fragment;

use std::collections::VecDeque;
use std::time::Duration;

use raft::eraftpb::MessageType;
use raft::eraftpb::{ConfState, Entry, HardState, Message, Snapshot};
use raft::storage::MemStorage;
use raft::{ProgressState, RawNode, SnapshotStatus, StateRole, Storage};
use tidings_proto::Time;

pub use codec::{
    decode_decision, decode_durable, decode_raft, encode_decision, encode_durable, encode_raft,
    DurableError, DurableFile, DurableLimits, RaftLimits, DURABLE_MAGIC, DURABLE_VERSION,
};
pub use fragment::{
    decode_fragment, encode_fragments, Fragment, FragmentError, FragmentLimits, FragmentStats,
    Reassembly, FRAGMENT_BYTES_DEFAULT, FRAGMENT_BYTES_MIN, FRAGMENT_HEADER_LEN, FRAGMENT_TAG,
};

use crate::config::{ConfigError, GmsConfig};
use crate::message::GmsMessage;
use crate::service::{Gms, GmsEvent, GmsTransmit, Peer};

/// Most replicas of one service.
pub const REPLICAS_MAX: usize = 7;

/// Configuration of one replica. Every replica of a service must be given the same values
/// except `index` (and `seed` may differ too).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReplicaConfig {
    /// This replica's index, `0..replicas`.
    pub index: usize,
    /// How many replicas the service has (1..=[`REPLICAS_MAX`]). A majority must be up.
    pub replicas: usize,
    /// Seeds this replica's election timeout (drawn once; raft-rs's own draw is given a range
    /// of one value, so nothing here depends on a thread's random generator).
    pub seed: u64,
    /// The Raft tick. Default 10 ms.
    pub tick_interval: Duration,
    /// Ticks between the leader's heartbeats. Default 2 (20 ms).
    pub heartbeat_ticks: usize,
    /// Ticks of silence before a follower stands for election, at the least; also how often a
    /// leader checks that a majority still hears it (it steps down otherwise). Default 15
    /// (150 ms): a few heartbeats may be lost.
    pub election_ticks: usize,
    /// Each replica's election timeout is `election_ticks` plus a draw in
    /// `0..=election_spread_ticks`, so that replicas rarely stand together. Default 15.
    pub election_spread_ticks: usize,
    /// Entries applied since the last snapshot that make the replica take a new one and drop
    /// the log before it. Default 1000.
    pub snapshot_entries: u64,
    /// Largest replica-to-replica message accepted, in bytes (a snapshot travels in one).
    /// Default 16 MiB; at most `u32::MAX`.
    pub message_bytes_max: usize,
    /// Largest datagram a replica sends another, in bytes: a message longer than this leaves
    /// in fragments of at most this size (header included), each its own datagram, put
    /// together again by the receiving replica. At least [`FRAGMENT_BYTES_MIN`], below
    /// `message_bytes_max`. Default [`FRAGMENT_BYTES_DEFAULT`], what fits one UDP datagram
    /// over IPv4 with a socket host's magic.
    pub fragment_bytes: usize,
    /// Most fragments sent to one replica per tick: a long message's fragments leave at this
    /// pace (the first ones at once), so that a snapshot of megabytes does not overflow the
    /// receiving socket's buffer in one burst. Default 4 (256 KB per 10 ms tick at the
    /// default fragment size: a 16 MiB snapshot in about 0.65 s).
    pub fragments_per_tick: usize,
    /// Most messages a replica puts together at once from one peer's fragments; a peer that
    /// starts another drops its oldest. Each holds at most `message_bytes_max` bytes, as its
    /// fragments arrive. Default 4.
    pub reassembly_partials_max: usize,
    /// A message in progress of which no fragment arrived for this long is dropped (Raft sends
    /// it again). Checked at [`Replica::handle_timeout`] and at every fragment. Default 1 s.
    pub reassembly_timeout: Duration,
    /// A leader that sent a follower a snapshot (its last fragment) and has not heard it was
    /// installed this long after sends it again (raft-rs waits for the snapshot's fate otherwise, and a lost
    /// fragment would stall the follower for good). Default 2 s.
    pub snapshot_timeout: Duration,
    /// Largest batch of entries in one append, in bytes. Default 60,000 (one UDP datagram).
    pub append_bytes_max: u64,
    /// Most log entries in one message. Default 1024.
    pub entries_per_message_max: usize,
    /// Most appends in flight to one follower. Default 64.
    pub inflight_appends_max: usize,
    /// The service's configuration (the same on every replica).
    pub gms: GmsConfig,
}

impl Default for ReplicaConfig {
    fn default() -> Self {
        ReplicaConfig {
            index: 0,
            replicas: 1,
            seed: 0,
            tick_interval: Duration::from_millis(10),
            heartbeat_ticks: 2,
            election_ticks: 15,
            election_spread_ticks: 15,
            snapshot_entries: 1000,
            message_bytes_max: 16 << 20,
            fragment_bytes: FRAGMENT_BYTES_DEFAULT,
            fragments_per_tick: 4,
            reassembly_partials_max: 4,
            reassembly_timeout: Duration::from_secs(1),
            snapshot_timeout: Duration::from_secs(2),
            append_bytes_max: 60_000,
            entries_per_message_max: 1024,
            inflight_appends_max: 64,
            gms: GmsConfig::default(),
        }
    }
}

/// Why a replica could not start.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReplicaError {
    /// The replica's configuration is invalid.
    #[error("invalid replica configuration: {0}")]
    Config(&'static str),
    /// The service's configuration is invalid.
    #[error(transparent)]
    Gms(#[from] ConfigError),
    /// raft-rs refused to start.
    #[error("raft: {0}")]
    Raft(String),
    /// The durable state's snapshot does not decode.
    #[error(transparent)]
    Snapshot(#[from] crate::service::SnapshotError),
    /// The durable state is not one a replica of this configuration could have kept.
    #[error("durable state refused: {0}")]
    Durable(&'static str),
}

impl ReplicaConfig {
    /// Checks the configuration.
    pub fn validate(&self) -> Result<(), ReplicaError> {
        let e = |m| Err(ReplicaError::Config(m));
        if self.replicas == 0 || self.replicas > REPLICAS_MAX {
            return e("replicas must be 1..=REPLICAS_MAX");
        }
        if self.index >= self.replicas {
            return e("index must be below replicas");
        }
        if self.tick_interval.is_zero() {
            return e("tick_interval must be positive");
        }
        if self.heartbeat_ticks == 0 || self.election_ticks <= self.heartbeat_ticks {
            return e("election_ticks must exceed heartbeat_ticks, which must be positive");
        }
        if self.snapshot_entries == 0 {
            return e("snapshot_entries must be positive");
        }
        if self.entries_per_message_max == 0 || self.inflight_appends_max == 0 {
            return e("entries_per_message_max and inflight_appends_max must be positive");
        }
        if self.append_bytes_max == 0 || self.append_bytes_max >= self.message_bytes_max as u64 {
            return e("append_bytes_max must be positive and below message_bytes_max");
        }
        if u32::try_from(self.message_bytes_max).is_err() {
            return e("message_bytes_max must fit 32 bits");
        }
        if self.fragment_bytes < FRAGMENT_BYTES_MIN || self.fragment_bytes >= self.message_bytes_max
        {
            return e("fragment_bytes must be FRAGMENT_BYTES_MIN or more, below message_bytes_max");
        }
        if self.reassembly_partials_max == 0 || self.fragments_per_tick == 0 {
            return e("reassembly_partials_max and fragments_per_tick must be positive");
        }
        if self.reassembly_timeout.is_zero() || self.snapshot_timeout.is_zero() {
            return e("reassembly_timeout and snapshot_timeout must be positive");
        }
        self.gms.validate()?;
        Ok(())
    }
}

/// What a replica sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplicaTransmit {
    /// A message to a client (the host maps a joiner's nonce to where its `Join` came from).
    Client(GmsTransmit),
    /// A datagram to another replica, by index.
    Replica {
        /// The replica's index.
        to: usize,
        /// The encoded message ([`encode_raft`]), or one fragment of it
        /// ([`encode_fragments`]): at most [`ReplicaConfig::fragment_bytes`] either way.
        bytes: Vec<u8>,
    },
}

/// What a replica reports to its host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplicaEvent {
    /// The service applied a committed decision with this consequence (every replica reports
    /// it, at its own application).
    Gms(GmsEvent),
    /// This replica leads term `term` and serves clients (it has applied its whole log).
    Leading {
        /// The term.
        term: u64,
    },
    /// This replica stopped leading, or learned of a new leader.
    Following {
        /// The term.
        term: u64,
        /// The leader's index, if known.
        leader: Option<usize>,
    },
}

/// Counters of a replica.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplicaStats {
    /// Replica datagrams that failed to decode or exceeded the bounds (dropped).
    pub malformed: u64,
    /// Replica datagrams from an index outside `0..replicas`, or whose sender is not the
    /// replica the host says it came from, or addressed to another replica (dropped).
    pub impostors: u64,
    /// Replica messages of a term older than this replica's (raft-rs answers a stale leader's
    /// append so it steps down, and drops the rest).
    pub stale_term: u64,
    /// Client datagrams that failed to decode (dropped).
    pub client_malformed: u64,
    /// Client messages answered with a redirect (this replica does not serve).
    pub redirects: u64,
    /// Decisions proposed to the log.
    pub proposals: u64,
    /// Proposals raft-rs refused (leadership lost meanwhile): the clients resend.
    pub proposals_dropped: u64,
    /// Committed decisions applied.
    pub applied: u64,
    /// Committed entries that did not decode (skipped alike by every replica).
    pub entries_malformed: u64,
    /// Snapshots taken (each drops the log before it).
    pub snapshots_taken: u64,
    /// Snapshots received from the leader and restored.
    pub snapshots_restored: u64,
    /// Bytes of the service state in the last snapshot taken or restored.
    pub snapshot_bytes: u64,
    /// Times this replica became the serving leader.
    pub leaderships: u64,
    /// Snapshots sent again because the follower had not installed the last one within
    /// [`ReplicaConfig::snapshot_timeout`] (a fragment lost, or the follower away).
    pub snapshots_retried: u64,
    /// Messages sent in fragments and put together from them (see [`FragmentStats`]).
    pub fragments: FragmentStats,
}

/// What a replica keeps on stable storage: Raft's hard state (term, vote, commit), the latest
/// snapshot and the log after it. A replica restarted from it ([`Replica::restart`]) catches up
/// from the leader. [`encode_durable`] and [`decode_durable`] put it in a file and take it back
/// (the socket host, `tidings gms --data-dir`); [`Replica::durable_generation`] tells a host
/// when it changed.
#[derive(Clone, Debug, PartialEq)]
pub struct Durable {
    hard_state: HardState,
    snapshot: Snapshot,
    entries: Vec<Entry>,
}

impl Durable {
    /// What every replica of a service that starts from a given state keeps: a snapshot of
    /// `state` ([`Gms::snapshot`]) as the first entry of term 1, committed. Replicas
    /// [`restart`](Replica::restart)ed from it hold that state and elect a leader as any
    /// restarted service does (the simulator's bootstrap, applied to one service before time
    /// zero, is handed to its replicas this way).
    #[must_use]
    pub fn seeded(state: Vec<u8>, replicas: usize) -> Durable {
        let mut snapshot = Snapshot {
            data: state.into(),
            ..Snapshot::default()
        };
        let md = snapshot.mut_metadata();
        md.index = 1;
        md.term = 1;
        let voters: Vec<u64> = (0..replicas).map(raft_id).collect();
        md.set_conf_state(ConfState::from((voters, vec![])));
        let hard_state = HardState {
            term: 1,
            commit: 1,
            ..HardState::default()
        };
        Durable {
            hard_state,
            snapshot,
            entries: Vec::new(),
        }
    }

    /// Bytes of the snapshot and the log entries held: what a replica's memory grows with.
    #[must_use]
    pub fn bytes(&self) -> usize {
        self.snapshot.data.len()
            + self
                .entries
                .iter()
                .map(|e| e.data.len() + 24)
                .sum::<usize>()
    }

    /// Log entries held after the snapshot.
    #[must_use]
    pub fn entries(&self) -> usize {
        self.entries.len()
    }

    /// Raft's term in this state.
    #[must_use]
    pub fn term(&self) -> u64 {
        self.hard_state.term
    }

    /// Checks that a replica of a `replicas`-replica service could have kept this state, so
    /// that raft-rs takes it without panicking: the snapshot (if any) lists those voters, the
    /// log runs on without a gap from at most the snapshot's index, holds no configuration
    /// change, its terms never fall, and the hard state's term, vote and commit agree with it.
    pub fn check(&self, replicas: usize) -> Result<(), &'static str> {
        let md = self.snapshot.get_metadata();
        if md.index > 0 {
            let voters: Vec<u64> = (0..replicas).map(raft_id).collect();
            let cs = md.get_conf_state();
            if cs.voters != voters || !cs.learners.is_empty() {
                return Err("the snapshot's voters are not the replicas");
            }
            if md.term == 0 {
                return Err("a snapshot of term 0");
            }
        } else if md.term != 0 {
            return Err("an empty snapshot with a term");
        }
        let mut last = (md.index, md.term);
        if let Some(first) = self.entries.first() {
            if first.index > md.index + 1 || first.index == 0 {
                return Err("the log does not follow the snapshot");
            }
        }
        let mut prev: Option<&Entry> = None;
        for e in &self.entries {
            if e.get_entry_type() != raft::eraftpb::EntryType::EntryNormal {
                return Err("a configuration change in the log (the replicas are fixed)");
            }
            if let Some(p) = prev {
                if p.index.checked_add(1) != Some(e.index) {
                    return Err("the log has a gap");
                }
                if e.term < p.term {
                    return Err("the log's terms fall");
                }
            }
            if e.index == md.index && md.index > 0 && e.term != md.term {
                return Err("the entry at the snapshot's index has another term");
            }
            if e.index > md.index {
                if e.term < md.term {
                    return Err("an entry after the snapshot has an older term");
                }
                last = (e.index, e.term);
            }
            prev = Some(e);
        }
        let hs = &self.hard_state;
        if hs.term < last.1 {
            return Err("the term is older than the log's");
        }
        if hs.vote > replicas as u64 {
            return Err("a vote for no replica");
        }
        if hs.commit < md.index || hs.commit > last.0 {
            return Err("the commit index is outside the log");
        }
        Ok(())
    }
}

/// Storage of one replica: raft-rs's in-memory log plus the latest snapshot, which
/// `MemStorage` does not keep the data of.
struct ReplicaStorage {
    mem: MemStorage,
    snapshot: Snapshot,
}

impl Storage for ReplicaStorage {
    fn initial_state(&self) -> raft::Result<raft::RaftState> {
        self.mem.initial_state()
    }
    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        context: raft::GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        self.mem.entries(low, high, max_size, context)
    }
    fn term(&self, idx: u64) -> raft::Result<u64> {
        if idx == self.snapshot.get_metadata().index {
            return Ok(self.snapshot.get_metadata().term);
        }
        self.mem.term(idx)
    }
    fn first_index(&self) -> raft::Result<u64> {
        self.mem.first_index()
    }
    fn last_index(&self) -> raft::Result<u64> {
        self.mem.last_index()
    }
    fn snapshot(&self, _request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        if self.snapshot.get_metadata().index == 0 {
            return Err(raft::Error::Store(
                raft::StorageError::SnapshotTemporarilyUnavailable,
            ));
        }
        Ok(self.snapshot.clone())
    }
}

/// One replica of the replicated membership service, sans-IO.
///
/// Drive it like [`Gms`]: [`handle_client`](Replica::handle_client) with a client's datagram,
/// [`handle_replica`](Replica::handle_replica) with another replica's, and
/// [`handle_timeout`](Replica::handle_timeout); after each call drain
/// [`poll_transmit`](Replica::poll_transmit) and [`poll_event`](Replica::poll_event) until they
/// return `None`, then call `handle_timeout` at [`poll_timeout`](Replica::poll_timeout) (or
/// earlier). It never reads a clock, starts a thread or draws from a thread's random
/// generator: `now` and the seed are inputs, so a seeded simulator replays it exactly.
///
/// What a replica sends to replicas must reach them after the host has kept
/// [`durable`](Replica::durable) where a crash does not lose it (an in-memory host keeps it
/// across a simulated crash; the socket host with a data directory writes it to a file before
/// it sends, whenever [`durable_generation`](Replica::durable_generation) moved).
pub struct Replica {
    config: ReplicaConfig,
    raw: RawNode<ReplicaStorage>,
    gms: Gms,
    /// The index of the empty entry this replica appended on winning its term: once applied,
    /// its state holds every decision committed before, and it serves.
    term_start: Option<u64>,
    serving: bool,
    /// The leader last reported in an event, with its term.
    reported: (u64, Option<u64>),
    next_tick: Option<Time>,
    last_now: Time,
    applied: u64,
    /// Counts changes of the durable state (see `durable_generation`).
    durable_generation: u64,
    /// Messages being put together from other replicas' fragments.
    reassembly: Reassembly,
    /// Numbers this replica's next fragmented message.
    next_message: u64,
    /// By replica index: when this leader last sent that follower a snapshot, until it is
    /// known installed (see `retry_snapshots`).
    snapshots_sent: Vec<Option<Time>>,
    /// By replica index: fragments waiting for their turn (see `fragments_per_tick`).
    paced: Vec<VecDeque<Vec<u8>>>,
    /// By replica index: fragments released since the last tick.
    released: Vec<usize>,
    outbox: VecDeque<ReplicaTransmit>,
    events: VecDeque<ReplicaEvent>,
    stats: ReplicaStats,
}

impl std::fmt::Debug for Replica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replica")
            .field("index", &self.config.index)
            .field("term", &self.term())
            .field("serving", &self.serving)
            .field("applied", &self.applied)
            .finish_non_exhaustive()
    }
}

/// Raft ids run from 1; replica indices from 0.
fn raft_id(index: usize) -> u64 {
    index as u64 + 1
}

impl Replica {
    /// A new replica of a new service (empty log).
    pub fn new(config: ReplicaConfig) -> Result<Replica, ReplicaError> {
        config.validate()?;
        let voters: Vec<u64> = (0..config.replicas).map(raft_id).collect();
        let mem = MemStorage::new_with_conf_state(ConfState::from((voters, vec![])));
        let storage = ReplicaStorage {
            mem,
            snapshot: Snapshot::default(),
        };
        let gms = Gms::new_replicated(config.gms.clone())?;
        Replica::start(config, storage, gms, 0)
    }

    /// A replica restarted from what it kept ([`durable`](Replica::durable)): its snapshot is
    /// restored, and the log after it is applied again as raft-rs hands the committed part
    /// back; the leader sends what it missed.
    ///
    /// A state no replica of this configuration could have kept ([`Durable::check`]) is
    /// refused.
    pub fn restart(config: ReplicaConfig, durable: Durable) -> Result<Replica, ReplicaError> {
        config.validate()?;
        durable
            .check(config.replicas)
            .map_err(ReplicaError::Durable)?;
        let mem = MemStorage::new();
        let mut gms = Gms::new_replicated(config.gms.clone())?;
        let applied = durable.snapshot.get_metadata().index;
        {
            let mut core = mem.wl();
            if applied > 0 {
                gms.restore(durable.snapshot.get_data())?;
                core.apply_snapshot(durable.snapshot.clone())
                    .map_err(|e| ReplicaError::Raft(e.to_string()))?;
            } else {
                let voters: Vec<u64> = (0..config.replicas).map(raft_id).collect();
                core.set_conf_state(ConfState::from((voters, vec![])));
            }
            // The entry at the snapshot's index is kept beside it (see `compact`): the log
            // resumes after it.
            let after: Vec<Entry> = durable
                .entries
                .iter()
                .filter(|e| e.index > applied)
                .cloned()
                .collect();
            core.append(&after)
                .map_err(|e| ReplicaError::Raft(e.to_string()))?;
            core.set_hardstate(durable.hard_state.clone());
        }
        let storage = ReplicaStorage {
            mem,
            snapshot: durable.snapshot,
        };
        Replica::start(config, storage, gms, applied)
    }

    fn start(
        config: ReplicaConfig,
        storage: ReplicaStorage,
        gms: Gms,
        applied: u64,
    ) -> Result<Replica, ReplicaError> {
        // The election timeout, drawn here from the seed: raft-rs draws from the range
        // [min, max), given one value.
        let spread = config.election_spread_ticks as u64 + 1;
        let draw = fastrand::Rng::with_seed(config.seed).u64(..spread) as usize;
        let timeout = config.election_ticks + draw;
        let raft_config = raft::Config {
            id: raft_id(config.index),
            election_tick: config.election_ticks,
            heartbeat_tick: config.heartbeat_ticks,
            min_election_tick: timeout,
            max_election_tick: timeout + 1,
            applied,
            max_size_per_msg: config.append_bytes_max,
            max_inflight_msgs: config.inflight_appends_max,
            check_quorum: true,
            pre_vote: true,
            ..raft::Config::default()
        };
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let raw = RawNode::new(&raft_config, storage, &logger)
            .map_err(|e| ReplicaError::Raft(e.to_string()))?;
        let reassembly = Reassembly::new(
            config.replicas,
            FragmentLimits::new(config.message_bytes_max),
            config.reassembly_partials_max,
            config.reassembly_timeout,
        );
        let snapshots_sent = vec![None; config.replicas];
        let paced = vec![VecDeque::new(); config.replicas];
        let released = vec![0; config.replicas];
        Ok(Replica {
            config,
            raw,
            gms,
            term_start: None,
            serving: false,
            reported: (0, None),
            next_tick: None,
            last_now: Time::ZERO,
            applied,
            durable_generation: 0,
            reassembly,
            next_message: 0,
            snapshots_sent,
            paced,
            released,
            outbox: VecDeque::new(),
            events: VecDeque::new(),
            stats: ReplicaStats::default(),
        })
    }

    /// The configuration in force.
    #[must_use]
    pub fn config(&self) -> &ReplicaConfig {
        &self.config
    }

    /// The counters.
    #[must_use]
    pub fn stats(&self) -> &ReplicaStats {
        &self.stats
    }

    /// The service state this replica holds (read only).
    #[must_use]
    pub fn gms(&self) -> &Gms {
        &self.gms
    }

    /// The current Raft term.
    #[must_use]
    pub fn term(&self) -> u64 {
        self.raw.raft.term
    }

    /// Whether this replica leads and serves clients.
    #[must_use]
    pub fn is_serving(&self) -> bool {
        self.serving
    }

    /// The leader's index, if known.
    #[must_use]
    pub fn leader(&self) -> Option<usize> {
        let id = self.raw.raft.leader_id;
        (id != 0).then(|| (id - 1) as usize)
    }

    /// The index of the last applied log entry.
    #[must_use]
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// What this replica must keep across a crash (see [`Durable`]).
    #[must_use]
    pub fn durable(&self) -> Durable {
        let store = self.raw.store();
        // Read and released before `entries`, which takes the storage's write lock.
        let hard_state = store.mem.rl().hard_state().clone();
        let first = self.raw.store().first_index().unwrap_or(1);
        let last = self.raw.store().last_index().unwrap_or(0);
        let entries = if last >= first {
            store
                .mem
                .entries(first, last + 1, None, raft::GetEntriesContext::empty(false))
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        Durable {
            hard_state,
            snapshot: store.snapshot.clone(),
            entries,
        }
    }

    /// A number that grows whenever what [`durable`](Replica::durable) returns changes (the
    /// hard state, the log, or the snapshot): a host keeps the durable state again only when
    /// it differs from the one it kept last. Cheap; starts at 0.
    #[must_use]
    pub fn durable_generation(&self) -> u64 {
        self.durable_generation
    }

    /// A datagram from a client (`from` as [`Gms::handle_message`] takes it).
    pub fn handle_client(&mut self, now: Time, from: Peer, bytes: &[u8]) {
        self.handle_client_as(now, from, None, bytes);
    }

    /// As [`handle_client`](Replica::handle_client), from a client whose admitted GMS link
    /// proved `identity`: a leader checks the access rules (`GmsConfig::acl`) against it and
    /// logs what it refused.
    pub fn handle_client_as(
        &mut self,
        now: Time,
        from: Peer,
        identity: Option<&tidings_seal::PublicKey>,
        bytes: &[u8],
    ) {
        self.last_now = self.last_now.max(now);
        let msg = match GmsMessage::decode(bytes) {
            Ok(msg) => msg,
            Err(_) => {
                self.stats.client_malformed += 1;
                return;
            }
        };
        if self.serving {
            if let (Peer::Node(_), GmsMessage::Heartbeat) = (from, &msg) {
                // The answer tells the client its leader lives (it fails over otherwise).
                self.outbox.push_back(ReplicaTransmit::Client(GmsTransmit {
                    to: from,
                    msg: GmsMessage::Stamped {
                        term: self.term(),
                        msg: Box::new(GmsMessage::Heartbeat),
                    },
                }));
            }
            self.gms.handle_message_as(now, from, identity, msg);
        } else {
            self.stats.redirects += 1;
            let leader = self.leader().and_then(|l| u32::try_from(l).ok());
            self.outbox.push_back(ReplicaTransmit::Client(GmsTransmit {
                to: from,
                msg: GmsMessage::Redirect {
                    term: self.term(),
                    leader,
                },
            }));
        }
        self.pump(now);
    }

    /// A datagram from replica `from` (the index the host knows the source by): a whole
    /// message, or a fragment of one (kept until the message is whole). Malformed ones, and
    /// ones whose claimed sender is not `from`, are counted and dropped.
    pub fn handle_replica(&mut self, now: Time, from: usize, bytes: &[u8]) {
        self.last_now = self.last_now.max(now);
        let whole;
        let bytes = if bytes.first() == Some(&FRAGMENT_TAG) {
            if from >= self.config.replicas || from == self.config.index {
                self.stats.impostors += 1;
                return;
            }
            match self
                .reassembly
                .take(now, from, bytes, &mut self.stats.fragments)
            {
                Some(w) => {
                    whole = w;
                    &whole[..]
                }
                None => return,
            }
        } else {
            bytes
        };
        let limits = RaftLimits {
            message_bytes_max: self.config.message_bytes_max,
            entries_max: self.config.entries_per_message_max,
        };
        let msg = match decode_raft(bytes, limits) {
            Ok(m) => m,
            Err(_) => {
                self.stats.malformed += 1;
                return;
            }
        };
        if from >= self.config.replicas
            || from == self.config.index
            || msg.from != raft_id(from)
            || msg.to != raft_id(self.config.index)
        {
            self.stats.impostors += 1;
            return;
        }
        if msg.term != 0 && msg.term < self.term() {
            self.stats.stale_term += 1;
        }
        if self.raw.step(msg).is_err() {
            self.stats.malformed += 1;
        }
        self.pump(now);
    }

    /// Time has passed: Raft ticks, and the serving leader's failure detection and
    /// retransmissions.
    pub fn handle_timeout(&mut self, now: Time) {
        self.last_now = self.last_now.max(now);
        let tick = self.config.tick_interval;
        let mut next = self.next_tick.unwrap_or(now + tick);
        // Ticks missed while the host was away count once each, up to an election's worth.
        let mut ticks = 0;
        while now >= next {
            if ticks <= self.config.election_ticks + self.config.election_spread_ticks {
                self.raw.tick();
                ticks += 1;
            }
            next += tick;
        }
        self.next_tick = Some(next);
        if ticks > 0 {
            self.released.fill(0);
            for to in 0..self.paced.len() {
                self.release(to);
            }
        }
        self.reassembly.expire(now, &mut self.stats.fragments);
        self.retry_snapshots(now);
        self.pump(now);
        if self.serving {
            self.gms.handle_timeout(now);
            self.pump(now);
        }
    }

    /// The next time [`handle_timeout`](Replica::handle_timeout) must be called.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Time> {
        let tick = self.next_tick.unwrap_or(self.last_now);
        match self.gms.poll_timeout() {
            Some(t) if self.serving => Some(t.min(tick)),
            _ => Some(tick),
        }
    }

    /// Whether the service wants entropy for its master datagram secret
    /// ([`Gms::wants_key_entropy`]).
    #[must_use]
    pub fn wants_key_entropy(&self) -> bool {
        self.gms.wants_key_entropy()
    }

    /// Entropy for the master datagram secret, drawn by the host; a serving leader without one
    /// proposes it at once, as a logged command, so every replica holds it.
    pub fn give_key_entropy(&mut self, now: Time, bytes: [u8; 32]) {
        self.gms.give_key_entropy(bytes);
        self.pump(now);
    }

    /// The next message to send.
    pub fn poll_transmit(&mut self) -> Option<ReplicaTransmit> {
        if self.serving {
            let term = self.term();
            while let Some(t) = self.gms.poll_transmit() {
                self.outbox.push_back(ReplicaTransmit::Client(GmsTransmit {
                    to: t.to,
                    msg: GmsMessage::Stamped {
                        term,
                        msg: Box::new(t.msg),
                    },
                }));
            }
        } else {
            // A follower's service sends nothing (this drains what applying queued).
            while self.gms.poll_transmit().is_some() {}
        }
        self.outbox.pop_front()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<ReplicaEvent> {
        while let Some(e) = self.gms.poll_event() {
            self.events.push_back(ReplicaEvent::Gms(e));
        }
        self.events.pop_front()
    }

    /// Proposes what the leader decided, then handles every ready state of raft-rs: messages
    /// out, log appended, committed entries applied, role changes, compaction.
    fn pump(&mut self, now: Time) {
        if self.serving {
            while let Some(d) = self.gms.poll_decision() {
                let mut data = Vec::new();
                encode_decision(now, &d, &mut data);
                self.stats.proposals += 1;
                if self.raw.propose(Vec::new(), data).is_err() {
                    self.stats.proposals_dropped += 1;
                }
            }
        }
        // Each round may commit entries that queue more output; raft-rs needs few rounds.
        while self.raw.has_ready() {
            let mut ready = self.raw.ready();
            if !ready.snapshot().is_empty() || !ready.entries().is_empty() || ready.hs().is_some() {
                self.durable_generation += 1;
            }
            self.send(now, ready.take_messages());
            if !ready.snapshot().is_empty() {
                self.install(ready.snapshot().clone());
            }
            self.apply(ready.take_committed_entries());
            if !ready.entries().is_empty() {
                let _ = self.raw.mut_store().mem.wl().append(ready.entries());
            }
            if let Some(hs) = ready.hs() {
                self.raw.mut_store().mem.wl().set_hardstate(hs.clone());
            }
            self.send(now, ready.take_persisted_messages());
            let mut light = self.raw.advance(ready);
            if let Some(commit) = light.commit_index() {
                self.durable_generation += 1;
                self.raw
                    .mut_store()
                    .mem
                    .wl()
                    .mut_hard_state()
                    .set_commit(commit);
            }
            self.send(now, light.take_messages());
            self.apply(light.take_committed_entries());
            self.raw.advance_apply();
        }
        self.update_role(now);
        self.compact();
    }

    /// Queues Raft's messages: each whole if it fits `fragment_bytes`, in fragments if not.
    fn send(&mut self, now: Time, msgs: Vec<Message>) {
        for m in msgs {
            let Some(to) = (m.to as usize).checked_sub(1) else {
                continue;
            };
            if m.get_msg_type() == MessageType::MsgSnapshot {
                if let Some(sent) = self.snapshots_sent.get_mut(to) {
                    *sent = Some(now);
                }
            }
            let mut bytes = Vec::new();
            encode_raft(&m, &mut bytes);
            if bytes.len() <= self.config.fragment_bytes {
                self.outbox
                    .push_back(ReplicaTransmit::Replica { to, bytes });
                continue;
            }
            let id = self.next_message;
            self.next_message = self.next_message.wrapping_add(1);
            let fragments = encode_fragments(id, &bytes, self.config.fragment_bytes);
            // Empty only past u32::MAX bytes, which `message_bytes_max` refuses anyway.
            self.stats.fragments.messages_fragmented += u64::from(!fragments.is_empty());
            self.stats.fragments.fragments_sent += fragments.len() as u64;
            if let Some(queue) = self.paced.get_mut(to) {
                queue.extend(fragments);
                self.release(to);
            }
        }
    }

    /// Moves fragments for replica `to` to the outbox, up to `fragments_per_tick` a tick.
    fn release(&mut self, to: usize) {
        let (Some(queue), Some(released)) = (self.paced.get_mut(to), self.released.get_mut(to))
        else {
            return;
        };
        while *released < self.config.fragments_per_tick {
            let Some(bytes) = queue.pop_front() else {
                break;
            };
            *released += 1;
            self.outbox
                .push_back(ReplicaTransmit::Replica { to, bytes });
        }
    }

    /// A leader whose snapshot to a follower has not been installed within `snapshot_timeout`
    /// tells raft-rs it failed, so that it sends another: raft-rs sends a follower nothing
    /// while a snapshot to it is pending, and would wait for ever on a lost one.
    fn retry_snapshots(&mut self, now: Time) {
        let leader = self.raw.raft.state == StateRole::Leader;
        for to in 0..self.snapshots_sent.len() {
            let Some(sent) = self.snapshots_sent[to] else {
                continue;
            };
            let id = raft_id(to);
            let pending = leader
                && self
                    .raw
                    .raft
                    .prs()
                    .get(id)
                    .is_some_and(|pr| pr.state == ProgressState::Snapshot);
            if !pending {
                self.snapshots_sent[to] = None;
            } else if !self.paced[to].is_empty() {
                // Still leaving: the timeout runs from its last fragment.
                self.snapshots_sent[to] = Some(now);
            } else if now.saturating_duration_since(sent) >= self.config.snapshot_timeout {
                self.snapshots_sent[to] = None;
                self.stats.snapshots_retried += 1;
                self.raw.report_snapshot(id, SnapshotStatus::Failure);
            }
        }
    }

    /// A snapshot from the leader replaces the state.
    fn install(&mut self, snap: Snapshot) {
        let index = snap.get_metadata().index;
        if self.gms.restore(snap.get_data()).is_err() {
            self.stats.entries_malformed += 1;
            return;
        }
        self.stats.snapshots_restored += 1;
        self.stats.snapshot_bytes = snap.get_data().len() as u64;
        let store = self.raw.mut_store();
        let _ = store.mem.wl().apply_snapshot(snap.clone());
        store.snapshot = snap;
        self.applied = index;
    }

    fn apply(&mut self, entries: Vec<Entry>) {
        for e in entries {
            if e.index <= self.applied {
                continue;
            }
            self.applied = e.index;
            if e.data.is_empty() {
                // The empty entry a new leader appends.
                continue;
            }
            match decode_decision(&e.data) {
                Ok((at, d)) => {
                    self.stats.applied += 1;
                    self.gms.apply_decision(at, d);
                }
                Err(_) => self.stats.entries_malformed += 1,
            }
        }
    }

    /// Follows raft-rs's role: a leader serves once it has applied the empty entry of its term;
    /// a replica that stops leading stops serving.
    fn update_role(&mut self, now: Time) {
        let leader = self.raw.raft.state == StateRole::Leader;
        if leader && self.term_start.is_none() {
            self.term_start = Some(self.raw.raft.raft_log.last_index());
        }
        if !leader {
            self.term_start = None;
            if self.serving {
                self.serving = false;
                self.gms.follow();
            }
        }
        if leader && !self.serving && self.term_start.is_some_and(|s| self.applied >= s) {
            self.serving = true;
            self.stats.leaderships += 1;
            self.gms.lead(now);
            self.events
                .push_back(ReplicaEvent::Leading { term: self.term() });
            // Pending client requests are decided from here on.
        }
        let id = self.raw.raft.leader_id;
        let known = (self.term(), (id != 0).then_some(id));
        if !leader && known != self.reported {
            self.events.push_back(ReplicaEvent::Following {
                term: self.term(),
                leader: self.leader(),
            });
        }
        self.reported = known;
    }

    /// Takes a snapshot and drops the log before it once `snapshot_entries` were applied since
    /// the last one.
    fn compact(&mut self) {
        let last = self.raw.store().snapshot.get_metadata().index;
        let persisted = self.raw.store().last_index().unwrap_or(0);
        if self.applied < last + self.config.snapshot_entries || self.applied > persisted {
            return;
        }
        let Ok(term) = self.raw.store().term(self.applied) else {
            return;
        };
        let mut snap = Snapshot {
            data: self.gms.snapshot().into(),
            ..Snapshot::default()
        };
        self.stats.snapshot_bytes = snap.get_data().len() as u64;
        let md = snap.mut_metadata();
        md.index = self.applied;
        md.term = term;
        md.set_conf_state(self.raw.raft.prs().conf().to_conf_state());
        let store = self.raw.mut_store();
        store.snapshot = snap;
        // The entry at the snapshot's index stays, so its term is still at hand.
        let _ = store.mem.wl().compact(self.applied);
        self.stats.snapshots_taken += 1;
        self.durable_generation += 1;
    }
}

#[cfg(test)]
mod tests;
