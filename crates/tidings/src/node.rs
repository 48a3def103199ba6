//! The node: its builder, topics, publishers, subscriptions and shutdown.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tidings_gms::{GmsConfig, LinkSecurity, ServiceSecurity};
use tidings_proto::NodeId;
use tidings_runtime::{
    GmsLinkConfig, GmsServer, GmsServerError, GmsSnapshot, MetricsServer, NodeRuntime,
    RuntimeConfig, RuntimeStats, Transport,
};
use tidings_seal::{AllowList, Identity, Mode as SecurityMode, PublicKey};

use crate::error::{Error, RecvError, RequestError, StartError};
use crate::publish::{Publisher, PublisherGroup};
use crate::subscribe::{CallbackSubscription, MessageBatch, SlowConsumerPolicy, Subscription};
use crate::topic::{Message, Topic};

/// The port of the membership service a node started with the default [`GmsMode::Local`] looks
/// for on `127.0.0.1`, and starts there if the port is free.
pub const LOCAL_GMS_PORT: u16 = 17400;

/// Where the node finds the membership service.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum GmsMode {
    /// The default: the service at `127.0.0.1:`[`LOCAL_GMS_PORT`], started in this process if
    /// that port is free. So the processes of one host that start nodes with the default
    /// builder form one group: the first embeds the service, the others join it (and lose it
    /// when that first node shuts down; run `tidings gms` for a service of its own).
    Local {
        /// The service's configuration, if this node starts it.
        config: GmsConfig,
    },
    /// Run the service inside this process, bound to `bind` (other nodes then name its address,
    /// [`Node::gms_addr`]). On `127.0.0.1:0` ([`NodeBuilder::private_gms`]) the node is alone
    /// in a group of its own until others join with its address.
    Embedded {
        /// Address to bind the service to.
        bind: SocketAddr,
        /// The service's configuration.
        config: GmsConfig,
    },
    /// Join the service at these addresses: one for `tidings gms` or another node's embedded
    /// service, every replica's (by index) for a replicated one.
    Connect(Vec<SocketAddr>),
}

/// Builds a [`Node`]: every setting has a documented default and is checked by
/// [`start`](NodeBuilder::start).
#[derive(Clone, Debug)]
pub struct NodeBuilder {
    bind: SocketAddr,
    gms: GmsMode,
    runtime: RuntimeConfig,
    protocol: tidings_proto::Config,
    link: Option<GmsLinkConfig>,
    subscription_capacity: usize,
    share: f64,
    metrics: Option<SocketAddr>,
    identity: Option<Identity>,
    service_key: Option<PublicKey>,
    service_security: Option<ServiceSecurity>,
    sealing: Option<SecurityMode>,
}

impl Default for NodeBuilder {
    fn default() -> Self {
        NodeBuilder {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            gms: GmsMode::Local {
                config: GmsConfig::default(),
            },
            runtime: RuntimeConfig::default(),
            protocol: NodeBuilder::default_protocol_config(),
            link: None,
            subscription_capacity: 1024,
            share: 1.0,
            metrics: None,
            identity: None,
            service_key: None,
            service_security: None,
            sealing: None,
        }
    }
}

/// Largest accepted subscription queue, in messages.
const SUBSCRIPTION_CAPACITY_MAX: usize = 1 << 24;

/// The token interval of nodes on real networks (ADR 0006): 10 ms instead of the sans-IO
/// protocol's 100 ms.
const TOKEN_INTERVAL_DEFAULT: Duration = Duration::from_millis(10);

/// The window of unstable messages per sender and region of nodes on real networks: the
/// protocol's node-wide bound on held messages (`node_held_msgs_max`, 32,768) instead of its
/// 16,384, so that small messages are bound by the window's bytes (16 MiB) over the time to
/// stability, as large ones are, rather than by its count.
const WINDOW_MSGS_DEFAULT: usize = 32_768;

impl NodeBuilder {
    /// The protocol configuration a node starts with: [`tidings_proto::Config::default`] with a
    /// 10 ms token interval instead of 100 ms (`docs/adr/0006-runtime-protocol-defaults.md`).
    ///
    /// Why: a message becomes stable about one token round after it is received, so the token
    /// interval sets how soon a sender's memory is freed and how long an idle ring waits. With
    /// 100 ms tokens a sender's `window.msgs_max` (16,384) unstable messages per region would
    /// also cap it at 163,840 messages/s; token pacing (`token_interval_min`, ADR 0019) now
    /// releases rounds sooner for fast senders whatever the interval, and 10 ms keeps
    /// stability (and so the sender's memory) ten times sooner for the others, at about 100
    /// token hand-offs (and their confirmations) per second per ring member, a few tens of
    /// kB/s. The simulator keeps the protocol's own defaults.
    ///
    /// The window is 32,768 messages instead of 16,384 (its byte bound, 16 MiB, unchanged),
    /// and the receive window twice that: at 4 M messages/s of 32 bytes, 16,384 messages are
    /// about as long as their way to stability (a few token rounds of `token_interval_min` and
    /// the acknowledgement), and a sender at that window waits for stability instead of
    /// sending (docs/benchmarks.md, issue 30's targets).
    pub fn default_protocol_config() -> tidings_proto::Config {
        let mut c = tidings_proto::Config::default();
        c.token_interval = TOKEN_INTERVAL_DEFAULT;
        c.window.msgs_max = WINDOW_MSGS_DEFAULT;
        c.receive_window_msgs = c.receive_window_msgs.max(2 * WINDOW_MSGS_DEFAULT);
        c
    }

    /// The node's unicast address (data and membership traffic). Default `127.0.0.1:0` (any free
    /// port on loopback); use the host's address for nodes on several hosts.
    #[must_use]
    pub fn bind(mut self, addr: SocketAddr) -> Self {
        self.bind = addr;
        self
    }

    /// Joins the membership service at `addr` instead of embedding one.
    #[must_use]
    pub fn gms(mut self, addr: SocketAddr) -> Self {
        self.gms = GmsMode::Connect(vec![addr]);
        self
    }

    /// Joins the replicated membership service whose replicas are at `addrs`, by index (the
    /// order of the replicas' `--peers` list), instead of embedding one. One address is the
    /// same as [`gms`](NodeBuilder::gms); [`start`](NodeBuilder::start) checks the list
    /// (1..=7 addresses, none twice).
    #[must_use]
    pub fn gms_replicas(mut self, addrs: &[SocketAddr]) -> Self {
        self.gms = GmsMode::Connect(addrs.to_vec());
        self
    }

    /// Embeds the membership service, bound to `bind`, with `config`.
    #[must_use]
    pub fn embedded_gms(mut self, bind: SocketAddr, config: GmsConfig) -> Self {
        self.gms = GmsMode::Embedded { bind, config };
        self
    }

    /// Embeds a membership service of the node's own on a free loopback port, instead of the
    /// shared one at [`LOCAL_GMS_PORT`]: the node forms a group of its own, which others join
    /// with its [`gms_addr`](Node::gms_addr) (tests that run side by side, for one).
    #[must_use]
    pub fn private_gms(self) -> Self {
        self.embedded_gms(SocketAddr::from(([127, 0, 0, 1], 0)), GmsConfig::default())
    }

    /// Where the node finds the membership service. Default [`GmsMode::Local`].
    #[must_use]
    pub fn gms_mode(mut self, mode: GmsMode) -> Self {
        self.gms = mode;
        self
    }

    /// How region datagrams leave: unicast fan-out (default, works everywhere) or IP multicast.
    #[must_use]
    pub fn transport(mut self, transport: Transport) -> Self {
        self.runtime.transport = transport;
        self
    }

    /// The runtime's configuration (quanta, batches, socket buffers, scheduler...).
    #[must_use]
    pub fn runtime_config(mut self, config: RuntimeConfig) -> Self {
        self.runtime = config;
        self
    }

    /// The protocol's configuration (windows, token rings, repair, congestion control...).
    /// Default [`NodeBuilder::default_protocol_config`].
    #[must_use]
    pub fn protocol_config(mut self, config: tidings_proto::Config) -> Self {
        self.protocol = config;
        self
    }

    /// The membership client's settings (join and leave timeouts, heartbeats). The server
    /// addresses in it are replaced by the builder's GMS addresses.
    #[must_use]
    pub fn gms_link(mut self, link: GmsLinkConfig) -> Self {
        self.link = Some(link);
        self
    }

    /// Messages an iterator [`Subscription`] holds before the node holds its topic's streams
    /// (back pressure, [`SlowConsumerPolicy`]). Default 1024.
    #[must_use]
    pub fn subscription_capacity(mut self, capacity: usize) -> Self {
        self.subscription_capacity = capacity;
        self
    }

    /// Share of the delivery workers' time each new subscription gets when topics compete, in
    /// `(0, 1]`. Default 1 (equal shares).
    #[must_use]
    pub fn subscription_share(mut self, share: f64) -> Self {
        self.share = share;
        self
    }

    /// This node's identity (`tidings keygen`): the node runs a Noise handshake with the
    /// membership service before it joins, proving the identity and checking the service's key
    /// ([`service_key`](NodeBuilder::service_key), or the embedded service's own), and speaks
    /// to the service only over that encrypted session. Default none: the plain link, for a
    /// service that admits anyone.
    #[must_use]
    pub fn identity(mut self, identity: Identity) -> Self {
        self.identity = Some(identity);
        self
    }

    /// The public key of the membership service this node joins (with
    /// [`identity`](NodeBuilder::identity)); a service that cannot prove it holds the key is
    /// not spoken to. Not needed when this node embeds the service with
    /// [`secure_gms`](NodeBuilder::secure_gms).
    #[must_use]
    pub fn service_key(mut self, key: PublicKey) -> Self {
        self.service_key = Some(key);
        self
    }

    /// The membership service this node embeds (if it does) admits only `allowed`, proving
    /// itself with `identity`; nodes join it with their own identity and its public key. A node
    /// that embeds it needs an [`identity`](NodeBuilder::identity) on the list too.
    #[must_use]
    pub fn secure_gms(mut self, identity: Identity, allowed: AllowList) -> Self {
        self.service_security = Some(ServiceSecurity { identity, allowed });
        self
    }

    /// Serves the node's metrics for Prometheus on `addr` (`GET /metrics`, OpenMetrics text;
    /// port 0 picks a free one, see [`Node::metrics_addr`]). Off by default.
    #[must_use]
    pub fn metrics(mut self, addr: SocketAddr) -> Self {
        self.metrics = Some(addr);
        self
    }

    /// How this node's protocol datagrams (data, retransmissions, tokens, ACKs, NAKs ...) are
    /// protected, under the datagram keys the membership service hands to its admitted
    /// members: [`SecurityMode::Off`], [`SecurityMode::Authenticate`] (an AEAD tag over the
    /// clear datagram: outsiders cannot forge or replay) or [`SecurityMode::Encrypt`] (the
    /// payload encrypted too). Anything but `Off` needs an [`identity`](NodeBuilder::identity):
    /// the keys travel only over the admitted link. Every node of a group must use the same
    /// mode.
    ///
    /// Default: `Encrypt` when the node has an identity, `Off` otherwise. A user who set up
    /// identities asked for protection, and admission alone would leave every datagram
    /// forgeable by anyone on the network; encryption also keeps topic data from everyone on
    /// the path, and with AES-256-GCM on CPUs with AES instructions it costs less than
    /// authenticating alone (`docs/security.md`).
    #[must_use]
    pub fn security(mut self, mode: SecurityMode) -> Self {
        self.sealing = Some(mode);
        self
    }

    /// Checks the settings, starts the embedded membership service if asked, and joins.
    pub fn start(self) -> Result<Node, StartError> {
        if !(1..=SUBSCRIPTION_CAPACITY_MAX).contains(&self.subscription_capacity) {
            return Err(StartError::Config(format!(
                "subscription_capacity = {} must be within 1..={SUBSCRIPTION_CAPACITY_MAX}",
                self.subscription_capacity
            )));
        }
        if !(self.share > 0.0 && self.share <= 1.0) {
            return Err(StartError::Config(format!(
                "subscription_share = {} must be within (0, 1]",
                self.share
            )));
        }
        self.runtime
            .validate()
            .map_err(|e| StartError::Config(e.to_string()))?;
        self.protocol
            .validate()
            .map_err(|e| StartError::Config(e.to_string()))?;
        let embedded_key = self.service_security.as_ref().map(|s| *s.identity.public());
        let service_key = self.service_key.or(embedded_key);
        let security = match (self.identity, service_key) {
            (Some(identity), Some(service)) => Some(LinkSecurity::new(identity, service)),
            (Some(_), None) => {
                return Err(StartError::Config(
                    "identity is set but no service_key: the node needs the membership \
                     service's public key (or secure_gms for an embedded service)"
                        .to_owned(),
                ))
            }
            (None, Some(_)) if self.service_security.is_some() => {
                return Err(StartError::Config(
                    "secure_gms is set but this node has no identity: the service would \
                     refuse its own node"
                        .to_owned(),
                ))
            }
            (None, _) => None,
        };
        // A mode given in a `gms_link` counts when `security` was not called.
        let link_sealing = self
            .link
            .as_ref()
            .map(|l| l.sealing)
            .filter(|m| *m != SecurityMode::Off);
        let sealing = match (self.sealing.or(link_sealing), security.is_some()) {
            (None, true) => SecurityMode::Encrypt,
            (None, false) => SecurityMode::Off,
            (Some(SecurityMode::Off), _) => SecurityMode::Off,
            (Some(mode), true) => mode,
            (Some(mode), false) => {
                return Err(StartError::Config(format!(
                    "security mode {mode} needs an identity (and the service's key): datagram \
                     keys are handed out only to admitted nodes"
                )))
            }
        };
        let service_security = self.service_security;
        let (server, gms_addrs) = match self.gms {
            GmsMode::Local { config } => {
                let addr = SocketAddr::from(([127, 0, 0, 1], LOCAL_GMS_PORT));
                match GmsServer::start_secure(config, addr, service_security) {
                    Ok(server) => (Some(server), vec![addr]),
                    // Taken: the service another node of this host started (if nothing there
                    // answers, the join times out and says so).
                    Err(GmsServerError::Io(e)) if e.kind() == io::ErrorKind::AddrInUse => {
                        (None, vec![addr])
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            GmsMode::Embedded { bind, config } => {
                let server = GmsServer::start_secure(config, bind, service_security)?;
                let addr = server.local_addr();
                (Some(server), vec![addr])
            }
            GmsMode::Connect(addrs) => (None, addrs),
        };
        let mut link = self
            .link
            .unwrap_or_else(|| GmsLinkConfig::replicated(gms_addrs.clone()));
        link.set_servers(gms_addrs.clone());
        if security.is_some() {
            link.security = security;
        }
        link.sealing = sealing;
        let socket = UdpSocket::bind(self.bind).map_err(|source| StartError::Bind {
            addr: self.bind,
            source,
        })?;
        let runtime = NodeRuntime::join(self.runtime, self.protocol, link, socket)?;
        let metrics = match self.metrics {
            Some(addr) => Some(runtime.serve_metrics(addr)?),
            None => None,
        };
        Ok(Node {
            metrics,
            id: runtime.id(),
            local_addr: runtime.local_addr(),
            runtime: Some(runtime),
            server,
            gms_addrs,
            subscription_capacity: self.subscription_capacity,
            share: self.share,
        })
    }
}

/// Counters of a node.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct NodeStats {
    /// The runtime's and the protocol's counters.
    pub runtime: RuntimeStats,
    /// The embedded membership service's state, if this node embeds it.
    pub gms: Option<GmsSnapshot>,
}

/// One process's membership in the group: publish and subscribe by topic name.
///
/// Start one with [`Node::builder`]. [`shutdown`](Node::shutdown) (or dropping the node) leaves
/// the group cleanly: the membership service removes the node at once and the others' views
/// drop it.
#[derive(Debug)]
pub struct Node {
    /// Serves the metrics, if asked for (stopped before the runtime).
    metrics: Option<MetricsServer>,
    id: NodeId,
    local_addr: SocketAddr,
    runtime: Option<NodeRuntime>,
    server: Option<GmsServer>,
    /// The membership service's replicas' addresses (never empty: `start` validated them).
    gms_addrs: Vec<SocketAddr>,
    subscription_capacity: usize,
    share: f64,
}

impl Node {
    /// A builder with the defaults: loopback, the host's shared membership service
    /// ([`GmsMode::Local`]), unicast fan-out.
    #[must_use]
    pub fn builder() -> NodeBuilder {
        NodeBuilder::default()
    }

    fn runtime(&self) -> Result<&NodeRuntime, RequestError> {
        self.runtime.as_ref().ok_or(RequestError::Closed)
    }

    /// This node's id (given by the membership service).
    #[must_use]
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The node's unicast address.
    #[must_use]
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Where the node serves its metrics ([`NodeBuilder::metrics`]), if it does.
    #[must_use]
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(MetricsServer::local_addr)
    }

    /// The membership service's address: the embedded one's (give it to the other nodes), or
    /// the first of those this node joined.
    #[must_use]
    pub fn gms_addr(&self) -> SocketAddr {
        self.gms_addrs[0]
    }

    /// Every replica address of the membership service this node joined (one unless the
    /// service is replicated).
    #[must_use]
    pub fn gms_addrs(&self) -> &[SocketAddr] {
        &self.gms_addrs
    }

    /// A publisher on `topic`: declares to the membership service that this node publishes on
    /// it, and returns once the node knows the topic's regions.
    pub fn publisher<T>(&self, topic: &Topic<T>) -> Result<Publisher<T>, RequestError> {
        let runtime = self.runtime()?;
        let id = runtime.advertise(topic.name())?;
        Ok(Publisher::new(runtime.publisher(), topic.clone(), id))
    }

    /// Publishers of every topic of `topics`, in their order: like [`publisher`](Self::publisher)
    /// for each, but the membership service is told in batches (up to 128 topics per request),
    /// one membership update per batch instead of one per topic, so that a node publishing on
    /// thousands of topics starts in time linear in their number.
    pub fn publishers<T>(&self, topics: &[Topic<T>]) -> Result<Vec<Publisher<T>>, RequestError> {
        let runtime = self.runtime()?;
        let names: Vec<String> = topics.iter().map(|t| t.name().to_owned()).collect();
        let ids = runtime.advertise_many(&names)?;
        Ok(topics
            .iter()
            .zip(ids)
            .map(|(topic, id)| Publisher::new(runtime.publisher(), topic.clone(), id))
            .collect())
    }

    /// One publisher for every topic of `topics` ([`PublisherGroup`]: one queue to the core
    /// thread, the group's messages published in call order whatever their topics), the
    /// membership service told in batches as by [`publishers`](Self::publishers). For a thread
    /// that publishes on many topics in turn.
    pub fn publisher_group<T>(
        &self,
        topics: &[Topic<T>],
    ) -> Result<PublisherGroup<T>, RequestError> {
        let runtime = self.runtime()?;
        let names: Vec<String> = topics.iter().map(|t| t.name().to_owned()).collect();
        let ids = runtime.advertise_many(&names)?;
        Ok(PublisherGroup::new(
            runtime.publisher(),
            topics.iter().cloned().zip(ids).collect(),
        ))
    }

    /// Subscribes to `topic`, read as an iterator; in force when this returns (every message
    /// published after it is delivered). The node's subscription capacity and the default
    /// [`SlowConsumerPolicy::SlowDown`]; [`Node::subscription`] chooses others.
    pub fn subscribe<T: Send + 'static>(
        &self,
        topic: &Topic<T>,
    ) -> Result<Subscription<T>, RequestError> {
        self.subscription(topic).subscribe()
    }

    /// A builder for an iterator subscription to `topic` with its own queue capacity and
    /// slow-consumer policy.
    #[must_use]
    pub fn subscription<'a, T: Send + 'static>(
        &'a self,
        topic: &'a Topic<T>,
    ) -> SubscribeBuilder<'a, T> {
        SubscribeBuilder {
            node: self,
            topic,
            capacity: self.subscription_capacity,
            policy: SlowConsumerPolicy::SlowDown,
        }
    }

    /// Subscribes to `topic` with a callback, run on a delivery worker thread for every message
    /// in order (a message that does not decode as `T` comes as `Err(RecvError::Decode)`). Its back
    /// pressure is its delivery task's queue: a callback slower than the topic fills it, and the
    /// topic's streams are then held at this node until the callback has taken half of it
    /// ([`CallbackSubscription`]).
    pub fn subscribe_with<T, F>(
        &self,
        topic: &Topic<T>,
        mut callback: F,
    ) -> Result<CallbackSubscription, RequestError>
    where
        T: Send + 'static,
        F: FnMut(Result<Message<T>, RecvError>) + Send + 'static,
    {
        let runtime = self.runtime()?;
        let decode = topic.decoder();
        let topic_name = topic.name().to_owned();
        let inner = runtime.subscribe_named(topic.name(), self.share, move |d| {
            callback(to_message(d, decode, &topic_name));
        })?;
        Ok(CallbackSubscription {
            handle: Box::new(inner),
        })
    }

    /// Subscribes to `topic` with a callback run once per batch: the run of the topic's
    /// messages, in order, that one input (a datagram, a repair) brought, as a
    /// [`MessageBatch`] that decodes each message as the callback takes it. It runs on a
    /// delivery worker thread like [`subscribe_with`](Self::subscribe_with)'s, with the same
    /// back pressure (its delivery task's queue, here of batches) and the same share of the
    /// workers' time: the scheduler charges each batch's measured time to the subscription
    /// ([`CallbackSubscription::set_share`]). Messages the callback leaves in the batch are
    /// dropped when it returns.
    pub fn subscribe_batch_with<T, F>(
        &self,
        topic: &Topic<T>,
        mut callback: F,
    ) -> Result<CallbackSubscription, RequestError>
    where
        T: Send + 'static,
        F: FnMut(&mut MessageBatch<'_, T>) + Send + 'static,
    {
        let runtime = self.runtime()?;
        let decode = topic.decoder();
        let topic_name = topic.name().to_owned();
        let inner = runtime.subscribe_named_batch(topic.name(), self.share, move |deliveries| {
            let topic = deliveries.topic();
            let mut batch = MessageBatch {
                deliveries: deliveries.drain(),
                topic,
                decode,
                name: &topic_name,
            };
            callback(&mut batch);
        })?;
        Ok(CallbackSubscription {
            handle: Box::new(inner),
        })
    }

    /// Subscribes to every topic of `topics` with callbacks, the `i`-th topic's being
    /// `callback_for(i)`; like [`subscribe_with`](Self::subscribe_with) for each, but the
    /// membership service takes them in batches (up to 128 per request) and changes the views
    /// once per batch. Subscribing to thousands of topics one by one costs time quadratic in
    /// their number (each subscription is a view change that carries the region's topics); this
    /// costs linear time. Returns once all are in force, in the order of `topics`; on an error,
    /// none is kept.
    pub fn subscribe_many_with<T, F>(
        &self,
        topics: &[Topic<T>],
        mut callback_for: impl FnMut(usize) -> F,
    ) -> Result<Vec<CallbackSubscription>, RequestError>
    where
        T: Send + 'static,
        F: FnMut(Result<Message<T>, RecvError>) + Send + 'static,
    {
        let runtime = self.runtime()?;
        let names: Vec<String> = topics.iter().map(|t| t.name().to_owned()).collect();
        let inner = runtime.subscribe_named_many(&names, self.share, |i| {
            let mut callback = callback_for(i);
            let decode = topics[i].decoder();
            let topic_name = names[i].clone();
            move |d| callback(to_message(d, decode, &topic_name))
        })?;
        Ok(inner
            .into_iter()
            .map(|s| CallbackSubscription {
                handle: Box::new(s),
            })
            .collect())
    }

    /// Subscribes to every topic of `topics` with one callback, `callback(i, message)` for a
    /// message of the `i`-th topic: like [`subscribe_many_with`](Self::subscribe_many_with),
    /// but the topics share one delivery task, which takes the in-order run of all their
    /// messages as one batch whatever their topic. A node taking thousands of topics
    /// round-robin then pays per batch, not per message, for the hand-over to the workers,
    /// and keeps one task warm instead of one per topic.
    ///
    /// The topics are one subscription for the delivery workers: the node's share is the
    /// group's, and a callback slower than the topics fills the one task's queue: the group's
    /// topics are then held at this node together until it has taken half of it (other
    /// subscriptions go on). Each topic keeps its [`CallbackSubscription`]:
    /// dropping one stops that topic alone. Returns once all are in force, in the order of
    /// `topics`; on an error, none is kept. A topic given twice is refused.
    pub fn subscribe_group_with<T, F>(
        &self,
        topics: &[Topic<T>],
        mut callback: F,
    ) -> Result<Vec<CallbackSubscription>, RequestError>
    where
        T: Send + 'static,
        F: FnMut(usize, Result<Message<T>, RecvError>) + Send + 'static,
    {
        let runtime = self.runtime()?;
        let names: Vec<String> = topics.iter().map(|t| t.name().to_owned()).collect();
        let decoders: Vec<_> = topics.iter().map(Topic::decoder).collect();
        let topic_names = names.clone();
        let inner = runtime.subscribe_named_group(&names, self.share, move |i, d| {
            if let (Some(&decode), Some(name)) = (decoders.get(i), topic_names.get(i)) {
                callback(i, to_message(d, decode, name));
            }
        })?;
        Ok(inner
            .into_iter()
            .map(|s| CallbackSubscription {
                handle: Box::new(s),
            })
            .collect())
    }

    /// The node's counters (and the embedded service's state).
    pub fn stats(&self) -> Result<NodeStats, Error> {
        Ok(NodeStats {
            runtime: self.runtime()?.stats()?,
            gms: self.server.as_ref().and_then(GmsServer::snapshot),
        })
    }

    /// The embedded membership service, if this node runs it.
    #[must_use]
    pub fn embedded_gms(&self) -> Option<&GmsServer> {
        self.server.as_ref()
    }

    /// Leaves the group and stops: messages already handed to subscriptions are delivered,
    /// then the embedded service (if any) stops. Returns the final counters.
    pub fn shutdown(mut self) -> Result<RuntimeStats, Error> {
        self.stop()
    }

    fn stop(&mut self) -> Result<RuntimeStats, Error> {
        drop(self.metrics.take());
        let stats = match self.runtime.take() {
            Some(r) => r.shutdown().map_err(|e| Error::Shutdown(e.to_string()))?,
            None => RuntimeStats::default(),
        };
        if let Some(server) = self.server.take() {
            server.shutdown();
        }
        Ok(stats)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// A delivery as the application sees it: decoded as the topic's type, or the reason it was not.
pub(crate) fn to_message<T>(
    d: tidings_proto::Delivery,
    decode: fn(bytes::Bytes) -> Result<T, String>,
    topic_name: &str,
) -> Result<Message<T>, RecvError> {
    let (origin, topic, sent_at_us) = (d.origin, d.topic, d.timestamp_us);
    decode(d.payload)
        .map(|value| Message {
            value,
            origin,
            topic,
            sent_at_us,
        })
        .map_err(|why| RecvError::Decode {
            topic: topic_name.to_owned(),
            why,
        })
}

/// Options of one iterator subscription, from [`Node::subscription`].
#[derive(Debug)]
pub struct SubscribeBuilder<'a, T> {
    node: &'a Node,
    topic: &'a Topic<T>,
    capacity: usize,
    policy: SlowConsumerPolicy,
}

impl<T: Send + 'static> SubscribeBuilder<'_, T> {
    /// Messages the subscription's queue holds: how far its reader may lag before the policy
    /// applies. Default the node's `subscription_capacity`.
    #[must_use]
    pub fn capacity(mut self, capacity: usize) -> Self {
        self.capacity = capacity;
        self
    }

    /// What happens when the queue is full. Default [`SlowConsumerPolicy::SlowDown`].
    #[must_use]
    pub fn slow_consumer(mut self, policy: SlowConsumerPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Subscribes; in force when this returns (every message published after it is delivered).
    pub fn subscribe(self) -> Result<Subscription<T>, RequestError> {
        if !(1..=SUBSCRIPTION_CAPACITY_MAX).contains(&self.capacity) {
            return Err(RequestError::Config(format!(
                "subscription capacity {} must be within 1..={SUBSCRIPTION_CAPACITY_MAX}",
                self.capacity
            )));
        }
        let node = self.node;
        let runtime = node.runtime()?;
        // Unbounded underneath, bounded by the runtime: it hands on at most `capacity`
        // deliveries the reader has not taken (the queue tells it of each one taken), and holds
        // the topic's streams at this node while the reader is behind. Nothing waits here.
        let (sender, queue) = crate::queue::queue();
        let sender = Arc::new(Mutex::new(Some(sender)));
        let told = Arc::clone(&sender);
        let capacity = self.capacity;
        let max_wait = match self.policy {
            SlowConsumerPolicy::SlowDown => None,
            SlowConsumerPolicy::Disconnect { max_wait } => Some(max_wait),
        };
        let decode = self.topic.decoder();
        let name = self.topic.name().to_owned();
        let topic_name = name.clone();
        let error_name = name.clone();
        // A batch's messages, decoded before the queue is locked, then queued under one lock
        // (the storage is kept from batch to batch).
        let mut decoded = Vec::new();
        let (inner, unread) = runtime.subscribe_named_bounded(
            &name,
            node.share,
            (capacity, max_wait),
            move |batch| {
                decoded.extend(batch.drain().map(|d| to_message(d, decode, &topic_name)));
                // None once disconnected: nothing more is queued for it (it was told).
                if let Some(queue) = lock(&sender).as_ref() {
                    // Fails only once the application dropped the subscription.
                    let _ = queue.send_many(&mut decoded);
                }
                decoded.clear();
            },
            move |waited| {
                // The error goes after what is queued; dropping the sender then ends the
                // reader's iterator.
                if let Some(queue) = lock(&told).take() {
                    let _ = queue.send(Err(RecvError::SlowConsumer {
                        topic: error_name,
                        capacity,
                        waited,
                    }));
                }
            },
        )?;
        queue.count_takes_in(Arc::clone(&unread));
        Ok(Subscription {
            inner,
            queue,
            name,
            unread,
        })
    }

    /// Subscribes with a callback that runs on a thread of its own, fed from the subscription's
    /// bounded queue, so that [`capacity`](Self::capacity) and
    /// [`slow_consumer`](Self::slow_consumer) apply to it as to an iterator: under
    /// [`SlowConsumerPolicy::Disconnect`] a callback that falls behind gets the messages queued
    /// before, then `Err(RecvError::SlowConsumer)` as its last call. In force when this returns.
    pub fn subscribe_with<F>(self, mut callback: F) -> Result<CallbackSubscription, RequestError>
    where
        F: FnMut(Result<Message<T>, RecvError>) + Send + 'static,
    {
        let subscription = self.subscribe()?;
        let queue = subscription.queue.clone();
        let thread_name = format!("tidings-callback-{}", subscription.name);
        // Ends when the queue does: the subscription was dropped (unsubscribed), disconnected
        // for being slow, or the node shut down.
        std::thread::Builder::new()
            .name(thread_name)
            .spawn(move || {
                for message in queue.iter() {
                    callback(message);
                }
            })
            .map_err(|e| RequestError::Refused(format!("no thread for the callback: {e}")))?;
        Ok(CallbackSubscription {
            handle: Box::new(subscription),
        })
    }
}

/// Locks the sender of a subscription's queue (a panic elsewhere does not poison it for good).
fn lock<U>(m: &Mutex<U>) -> std::sync::MutexGuard<'_, U> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
