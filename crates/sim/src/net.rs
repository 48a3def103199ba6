//! Links: a serializer with drop-tail buffers, the building block of the simulated switched
//! network (each node has an uplink to the switch and a downlink from it). A link is one FIFO, or,
//! with [`LinkConfig::control_priority`], a small control queue served strictly before the data
//! FIFO.

use std::collections::VecDeque;
use std::time::Duration;

use serde::Serialize;
use tidings_proto::Time;

/// The physical parameters of one link direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkConfig {
    /// Serialization rate. Default 100 Mbit/s: the papers' cluster was switched 100 Mbit/s
    /// Ethernet, and the experiments' throughput limits come from it.
    pub bandwidth_bps: u64,
    /// Propagation plus switching delay added after serialization. Default 50 us, a store-and-
    /// forward LAN hop.
    pub latency: Duration,
    /// Bytes that may wait for (or be in) transmission; a packet that would exceed it is dropped
    /// at the tail. Default 256 KiB, a switch port or NIC queue of the era (about 21 ms of
    /// backlog at 100 Mbit/s). With `control_priority` it bounds the data queue alone.
    pub buffer_bytes: usize,
    /// Serve control-class packets ([`Class::Control`]: the world puts Gryphon's DCQs and UCAs
    /// there) before any data-class packet waiting, in a queue of their own (strict priority, not preemptive:
    /// the packet on the wire finishes first). Default off: a plain switch port, or a NIC, is one
    /// FIFO unless it is configured to trust packet markings, and that is what the fault sweeps
    /// and the Horus figures model. On, the link models a broker's output queue that sends its
    /// control messages ahead of data (Gryphon's brokers did: paper 002, section 3.1, "DCQ and UCA
    /// messages are treated as high-priority messages"), or a switch port with a priority queue
    /// for marked traffic; the Gryphon experiments turn it on (ADRs 11 and 12).
    pub control_priority: bool,
    /// Bytes the control queue may hold (waiting or on the wire), drop-tail like the data queue;
    /// used only with `control_priority`. Default 64 KiB: hundreds of tokens or alerts, far more
    /// than a node has in flight to one port; the port's memory is this plus `buffer_bytes`.
    pub control_buffer_bytes: usize,
}

/// The queue a packet joins on a link with [`LinkConfig::control_priority`] (without it, every
/// packet joins the one FIFO whatever its class).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Class {
    /// Small congestion-control messages: served first, in their own bounded queue.
    Control,
    /// Everything else.
    Data,
}

impl LinkConfig {
    /// Default serialization rate: switched 100 Mbit/s.
    pub const BANDWIDTH_BPS_DEFAULT: u64 = 100_000_000;
    /// Default one-hop latency.
    pub const LATENCY_DEFAULT: Duration = Duration::from_micros(50);
    /// Default drop-tail buffer.
    pub const BUFFER_BYTES_DEFAULT: usize = 256 * 1024;
    /// Default bound of the control queue (with `control_priority`).
    pub const CONTROL_BUFFER_BYTES_DEFAULT: usize = 64 * 1024;

    /// Checks that the link can carry anything: non-zero bandwidth and buffers.
    pub fn validate(&self) -> Result<(), LinkConfigError> {
        if self.bandwidth_bps == 0 {
            return Err(LinkConfigError::ZeroBandwidth);
        }
        if self.buffer_bytes == 0 || (self.control_priority && self.control_buffer_bytes == 0) {
            return Err(LinkConfigError::ZeroBuffer);
        }
        Ok(())
    }

    /// Time to serialize `len` bytes, rounded up to the nanosecond.
    #[must_use]
    pub fn transmit_time(&self, len: usize) -> Duration {
        Duration::from_nanos(transmit_nanos(len, self.bandwidth_bps.max(1), None))
    }
}

impl Default for LinkConfig {
    fn default() -> LinkConfig {
        LinkConfig {
            bandwidth_bps: Self::BANDWIDTH_BPS_DEFAULT,
            latency: Self::LATENCY_DEFAULT,
            buffer_bytes: Self::BUFFER_BYTES_DEFAULT,
            control_priority: false,
            control_buffer_bytes: Self::CONTROL_BUFFER_BYTES_DEFAULT,
        }
    }
}

/// Why a [`LinkConfig`] was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LinkConfigError {
    /// A zero bandwidth would never finish a packet.
    #[error("link bandwidth is zero")]
    ZeroBandwidth,
    /// A zero buffer would drop every packet.
    #[error("link buffer is zero bytes")]
    ZeroBuffer,
}

fn transmit_nanos(len: usize, bandwidth_bps: u64, nanos_per_byte: Option<u64>) -> u64 {
    match nanos_per_byte {
        Some(per_byte) => per_byte.saturating_mul(len as u64),
        None => {
            let bits_ns = (len as u128) * 8 * 1_000_000_000;
            u64::try_from(bits_ns.div_ceil(u128::from(bandwidth_bps))).unwrap_or(u64::MAX)
        }
    }
}

/// A packet refused by a full drop-tail buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("tail drop: {queued_bytes} bytes queued + {len} > buffer")]
pub struct Dropped {
    /// Bytes queued (not yet fully transmitted) when the packet was offered.
    pub queued_bytes: usize,
    /// The refused packet's length.
    pub len: usize,
}

/// Counters of one link.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LinkStats {
    /// Packets offered to the link.
    pub packets_offered: u64,
    /// Bytes offered to the link.
    pub bytes_offered: u64,
    /// Packets accepted for transmission.
    pub packets_sent: u64,
    /// Bytes accepted for transmission.
    pub bytes_sent: u64,
    /// Packets refused by the drop-tail buffer.
    pub packets_dropped: u64,
    /// Bytes refused by the drop-tail buffer.
    pub bytes_dropped: u64,
    /// Most bytes ever queued, both queues together (including the packet just accepted).
    pub queued_bytes_max: usize,
    /// Packets accepted into the control queue (with `control_priority`).
    pub control_packets_sent: u64,
    /// Most bytes ever in the control queue (with `control_priority`).
    pub control_queued_bytes_max: usize,
}

/// An accepted packet not yet fully transmitted.
#[derive(Clone, Copy, Debug)]
struct OnWire {
    finish: Time,
    len: usize,
    class: Class,
}

/// An accepted packet on its way to the far end (it may still be queued).
#[derive(Clone, Debug)]
struct InTransit<P> {
    arrival: Time,
    class: Class,
    payload: P,
}

/// One link direction: packets are serialized one after another at `bandwidth_bps`, then arrive
/// `latency` later. Without [`LinkConfig::control_priority`] they are sent in offer order (FIFO);
/// with it, a control packet is sent after the packet on the wire and the control packets before
/// it, ahead of the data waiting, which it delays by its own transmission time. The buffers hold
/// every byte not yet fully transmitted, including the packet on the wire.
///
/// The link carries the payloads ([`Link::pop_arrival`] hands them out at the far end, in arrival
/// order); a packet accepted but lost on the way (`payload` `None`) only occupies the wire.
///
/// Offers must come in non-decreasing time order (checked in debug builds); the world guarantees
/// it by offering uplinks at the owning node's clock and downlinks at the switch in event order.
#[derive(Clone, Debug)]
pub struct Link<P = ()> {
    config: LinkConfig,
    /// Exact serialization cost per byte when the bandwidth divides 8 Gbit/s evenly (100 Mbit/s:
    /// 80 ns), which skips a 128-bit division per packet.
    nanos_per_byte: Option<u64>,
    /// When the transmitter finishes everything accepted so far.
    free_at: Time,
    /// Accepted packets not fully transmitted at `advanced_to`, in transmission order: the
    /// first is on the wire, then the waiting control packets, then the waiting data packets.
    wire: VecDeque<OnWire>,
    /// Bytes of `wire` per class.
    queued_control_bytes: usize,
    queued_data_bytes: usize,
    /// Delivered packets not yet handed out, in arrival order.
    transit: VecDeque<InTransit<P>>,
    advanced_to: Time,
    last_offer: Time,
    stats: LinkStats,
}

impl<P> Link<P> {
    /// An idle link.
    pub fn new(config: LinkConfig) -> Result<Link<P>, LinkConfigError> {
        config.validate()?;
        Ok(Link {
            config,
            nanos_per_byte: nanos_per_byte(config.bandwidth_bps),
            free_at: Time::ZERO,
            wire: VecDeque::new(),
            queued_control_bytes: 0,
            queued_data_bytes: 0,
            transit: VecDeque::new(),
            advanced_to: Time::ZERO,
            last_offer: Time::ZERO,
            stats: LinkStats::default(),
        })
    }

    /// The link's parameters.
    #[must_use]
    pub fn config(&self) -> &LinkConfig {
        &self.config
    }

    /// The link's counters.
    #[must_use]
    pub fn stats(&self) -> &LinkStats {
        &self.stats
    }

    /// When the transmitter becomes idle (everything accepted so far is on the far side of the
    /// serializer).
    #[must_use]
    pub fn free_at(&self) -> Time {
        self.free_at
    }

    /// The queue a packet of `class` joins on this link.
    fn queue_of(&self, class: Class) -> Class {
        if self.config.control_priority {
            class
        } else {
            Class::Data
        }
    }

    /// Forgets packets fully transmitted by `now`.
    fn advance(&mut self, now: Time) {
        if now < self.advanced_to {
            return;
        }
        self.advanced_to = now;
        while let Some(&packet) = self.wire.front() {
            if packet.finish > now {
                break;
            }
            match packet.class {
                Class::Control => self.queued_control_bytes -= packet.len,
                Class::Data => self.queued_data_bytes -= packet.len,
            }
            self.wire.pop_front();
        }
    }

    /// Bytes accepted but not fully transmitted at `now`, both queues.
    pub fn queued_bytes(&mut self, now: Time) -> usize {
        self.advance(now);
        self.queued_control_bytes + self.queued_data_bytes
    }

    /// Bytes of `queue` and its bound, as of the last advance.
    fn queue_and_bound(&self, queue: Class) -> (usize, usize) {
        match queue {
            Class::Control => (self.queued_control_bytes, self.config.control_buffer_bytes),
            Class::Data => (self.queued_data_bytes, self.config.buffer_bytes),
        }
    }

    /// Whether a data-class packet of `len` bytes offered at `now` would be accepted.
    pub fn has_room(&mut self, now: Time, len: usize) -> bool {
        self.advance(now);
        let (queued, bound) = self.queue_and_bound(Class::Data);
        queued.saturating_add(len) <= bound
    }

    /// The earliest time at or after `now` at which a data-class packet of `len` bytes would be
    /// accepted (assuming nothing else is offered meanwhile); [`Time::MAX`] if it never fits.
    pub fn room_at(&mut self, now: Time, len: usize) -> Time {
        if len > self.config.buffer_bytes {
            return Time::MAX;
        }
        self.advance(now);
        let (queued, bound) = self.queue_and_bound(Class::Data);
        // Need queued - freed + len <= bound.
        let mut needed = (queued + len).saturating_sub(bound);
        if needed == 0 {
            return now;
        }
        for packet in &self.wire {
            if packet.class == Class::Data {
                needed = needed.saturating_sub(packet.len);
                if needed == 0 {
                    return packet.finish;
                }
            }
        }
        self.free_at
    }

    /// Bytes accepted but not fully transmitted at `now`, both queues, without forgetting
    /// anything (for observers holding a shared reference; `now` at or after the last offer).
    #[must_use]
    pub fn queued_bytes_at(&self, now: Time) -> usize {
        let done: usize = self
            .wire
            .iter()
            .take_while(|packet| packet.finish <= now)
            .map(|packet| packet.len)
            .sum();
        self.queued_control_bytes + self.queued_data_bytes - done
    }

    /// Changes the serialization rate and the buffer from now on (a link being throttled or
    /// restored): packets already accepted keep their transmission times, packets offered later
    /// use the new rate, and the new buffer applies to what is offered next (what is queued
    /// beyond it stays). The latency cannot change, so arrivals stay in order.
    pub fn reconfigure(
        &mut self,
        bandwidth_bps: u64,
        buffer_bytes: usize,
    ) -> Result<(), LinkConfigError> {
        let config = LinkConfig {
            bandwidth_bps,
            buffer_bytes,
            ..self.config
        };
        config.validate()?;
        self.config = config;
        self.nanos_per_byte = nanos_per_byte(bandwidth_bps);
        Ok(())
    }

    /// Offers a packet of `len` bytes and `class` at `now`; `payload`, called only if the packet
    /// is accepted, gives what arrives (`None`: the packet is lost on the way, after taking its
    /// place on the wire). On acceptance returns
    /// its arrival time at the far end: the packet arrives `latency` after its last bit leaves.
    /// A data-class packet (or any packet without `control_priority`) starts when everything
    /// accepted before it is sent, a control-class packet when the packet on the wire and the
    /// control packets before it are; either takes `len * 8 / bandwidth_bps` (rounded up to the
    /// nanosecond).
    pub fn offer(
        &mut self,
        now: Time,
        len: usize,
        class: Class,
        payload: impl FnOnce() -> Option<P>,
    ) -> Result<Time, Dropped> {
        debug_assert!(
            now >= self.last_offer,
            "link offers must be in time order: {now:?} after {:?}",
            self.last_offer
        );
        self.last_offer = now;
        self.stats.packets_offered += 1;
        self.stats.bytes_offered += len as u64;
        self.advance(now);
        // Without priority every packet is data to the link.
        let class = self.queue_of(class);
        let (queued_bytes, bound) = self.queue_and_bound(class);
        if queued_bytes.saturating_add(len) > bound {
            self.stats.packets_dropped += 1;
            self.stats.bytes_dropped += len as u64;
            return Err(Dropped { queued_bytes, len });
        }
        let tx = Duration::from_nanos(transmit_nanos(
            len,
            self.config.bandwidth_bps,
            self.nanos_per_byte,
        ));
        let finish = match class {
            Class::Data => {
                let finish = self.free_at.max(now) + tx;
                self.wire.push_back(OnWire { finish, len, class });
                self.queued_data_bytes += len;
                finish
            }
            Class::Control => {
                self.stats.control_packets_sent += 1;
                self.queued_control_bytes += len;
                self.stats.control_queued_bytes_max = self
                    .stats
                    .control_queued_bytes_max
                    .max(self.queued_control_bytes);
                self.jump_the_data_queue(now, len, tx)
            }
        };
        self.free_at = self.free_at.max(now) + tx;
        debug_assert!(self
            .wire
            .back()
            .is_none_or(|last| last.finish == self.free_at));
        let arrival = finish + self.config.latency;
        if let Some(payload) = payload() {
            let packet = InTransit {
                arrival,
                class,
                payload,
            };
            // Nearly always the latest arrival (only a control packet jumping the queue lands
            // earlier): appending skips a binary search that was a tenth of a GMS churn run.
            if self.transit.back().is_none_or(|p| p.arrival <= arrival) {
                self.transit.push_back(packet);
            } else {
                let at = self.transit.partition_point(|p| p.arrival <= arrival);
                self.transit.insert(at, packet);
            }
        }
        self.stats.packets_sent += 1;
        self.stats.bytes_sent += len as u64;
        let queued = self.queued_control_bytes + self.queued_data_bytes;
        self.stats.queued_bytes_max = self.stats.queued_bytes_max.max(queued);
        Ok(arrival)
    }

    /// Puts a control packet of `len` bytes (taking `tx`) on the wire after the packet being sent
    /// at `now` (advanced to) and the control packets waiting, and delays the data packets
    /// waiting by `tx`; returns its finish time.
    fn jump_the_data_queue(&mut self, now: Time, len: usize, tx: Duration) -> Time {
        let Some(on_wire) = self.wire.front().copied() else {
            let finish = now + tx;
            self.wire.push_back(OnWire {
                finish,
                len,
                class: Class::Control,
            });
            return finish;
        };
        let waiting_control = self
            .wire
            .iter()
            .skip(1)
            .take_while(|p| p.class == Class::Control)
            .count();
        let at = 1 + waiting_control;
        let finish = self.wire[at - 1].finish + tx;
        for packet in self.wire.range_mut(at..) {
            packet.finish += tx;
        }
        self.wire.insert(
            at,
            OnWire {
                finish,
                len,
                class: Class::Control,
            },
        );
        // The waiting data packets arrive later by as much. They are the data packets of the
        // transit queue that finish after the one on the wire, at its end.
        let sent_by = on_wire.finish + self.config.latency;
        for packet in self.transit.iter_mut().rev() {
            if packet.arrival <= sent_by {
                break;
            }
            if packet.class == Class::Data {
                packet.arrival += tx;
            }
        }
        finish
    }

    /// When the next packet arrives at the far end, if any is on its way.
    #[must_use]
    pub fn next_arrival(&self) -> Option<Time> {
        self.transit.front().map(|p| p.arrival)
    }

    /// The next packet, if it has arrived by `now`.
    pub fn pop_arrival(&mut self, now: Time) -> Option<P> {
        if self.transit.front()?.arrival > now {
            return None;
        }
        self.transit.pop_front().map(|p| p.payload)
    }
}

fn nanos_per_byte(bandwidth_bps: u64) -> Option<u64> {
    8_000_000_000u64
        .is_multiple_of(bandwidth_bps)
        .then(|| 8_000_000_000 / bandwidth_bps)
}
