//! Links: a FIFO serializer with a drop-tail buffer, the building block of the simulated switched
//! network (each node has an uplink to the switch and a downlink from it).

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
    /// backlog at 100 Mbit/s).
    pub buffer_bytes: usize,
}

impl LinkConfig {
    /// Default serialization rate: switched 100 Mbit/s.
    pub const BANDWIDTH_BPS_DEFAULT: u64 = 100_000_000;
    /// Default one-hop latency.
    pub const LATENCY_DEFAULT: Duration = Duration::from_micros(50);
    /// Default drop-tail buffer.
    pub const BUFFER_BYTES_DEFAULT: usize = 256 * 1024;

    /// Checks that the link can carry anything: non-zero bandwidth and buffer.
    pub fn validate(&self) -> Result<(), LinkConfigError> {
        if self.bandwidth_bps == 0 {
            return Err(LinkConfigError::ZeroBandwidth);
        }
        if self.buffer_bytes == 0 {
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
    /// Most bytes ever queued (including the packet just accepted).
    pub queued_bytes_max: usize,
}

/// One link direction: packets are serialized one after another at `bandwidth_bps` in offer
/// order (FIFO), then arrive `latency` later. The buffer holds every byte not yet fully
/// transmitted, including the packet on the wire.
///
/// Offers must come in non-decreasing time order (checked in debug builds); the world guarantees
/// it by offering uplinks at the owning node's clock and downlinks at the switch in event order.
#[derive(Clone, Debug)]
pub struct Link {
    config: LinkConfig,
    /// Exact serialization cost per byte when the bandwidth divides 8 Gbit/s evenly (100 Mbit/s:
    /// 80 ns), which skips a 128-bit division per packet.
    nanos_per_byte: Option<u64>,
    /// When the transmitter finishes everything accepted so far.
    free_at: Time,
    /// Accepted packets not yet fully transmitted at the last look: (finish time, cumulative
    /// bytes accepted up to and including this packet). Cumulative counts make "when is there room
    /// for n bytes" a binary search.
    in_flight: VecDeque<(Time, u64)>,
    /// Bytes ever accepted.
    bytes_accepted: u64,
    /// Bytes ever fully transmitted, as of `advanced_to`.
    bytes_done: u64,
    advanced_to: Time,
    last_offer: Time,
    stats: LinkStats,
}

impl Link {
    /// An idle link.
    pub fn new(config: LinkConfig) -> Result<Link, LinkConfigError> {
        config.validate()?;
        let nanos_per_byte = 8_000_000_000u64
            .is_multiple_of(config.bandwidth_bps)
            .then(|| 8_000_000_000 / config.bandwidth_bps);
        Ok(Link {
            config,
            nanos_per_byte,
            free_at: Time::ZERO,
            in_flight: VecDeque::new(),
            bytes_accepted: 0,
            bytes_done: 0,
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

    /// Forgets packets fully transmitted by `now`.
    fn advance(&mut self, now: Time) {
        if now < self.advanced_to {
            return;
        }
        self.advanced_to = now;
        while let Some(&(finish, cumulative)) = self.in_flight.front() {
            if finish > now {
                break;
            }
            self.bytes_done = cumulative;
            self.in_flight.pop_front();
        }
    }

    /// Bytes accepted but not fully transmitted at `now`.
    pub fn queued_bytes(&mut self, now: Time) -> usize {
        self.advance(now);
        usize::try_from(self.bytes_accepted - self.bytes_done).unwrap_or(usize::MAX)
    }

    /// Whether a packet of `len` bytes offered at `now` would be accepted.
    pub fn has_room(&mut self, now: Time, len: usize) -> bool {
        self.queued_bytes(now).saturating_add(len) <= self.config.buffer_bytes
    }

    /// The earliest time at or after `now` at which a packet of `len` bytes would be accepted
    /// (assuming nothing else is offered meanwhile); [`Time::MAX`] if it never fits.
    pub fn room_at(&mut self, now: Time, len: usize) -> Time {
        if len > self.config.buffer_bytes {
            return Time::MAX;
        }
        self.advance(now);
        // Need bytes_accepted - done(t) + len <= buffer, i.e. done(t) >= target.
        let target =
            (self.bytes_accepted + len as u64).saturating_sub(self.config.buffer_bytes as u64);
        if target <= self.bytes_done {
            return now;
        }
        let index = self.in_flight.partition_point(|&(_, cum)| cum < target);
        self.in_flight
            .get(index)
            .map_or(self.free_at, |&(finish, _)| finish)
    }

    /// Bytes accepted but not fully transmitted at `now`, without forgetting anything (for
    /// observers holding a shared reference; `now` at or after the last offer).
    #[must_use]
    pub fn queued_bytes_at(&self, now: Time) -> usize {
        let done = self
            .in_flight
            .iter()
            .take_while(|&&(finish, _)| finish <= now)
            .last()
            .map_or(self.bytes_done, |&(_, cumulative)| cumulative);
        usize::try_from(self.bytes_accepted - done).unwrap_or(usize::MAX)
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
        self.nanos_per_byte = 8_000_000_000u64
            .is_multiple_of(bandwidth_bps)
            .then(|| 8_000_000_000 / bandwidth_bps);
        Ok(())
    }

    /// Offers a packet of `len` bytes at `now`. On acceptance returns its arrival time at the far
    /// end: transmission starts at `max(now, free_at)`, takes `len * 8 / bandwidth_bps` (rounded
    /// up to the nanosecond), and the packet arrives `latency` after its last bit leaves.
    pub fn offer(&mut self, now: Time, len: usize) -> Result<Time, Dropped> {
        debug_assert!(
            now >= self.last_offer,
            "link offers must be in time order: {now:?} after {:?}",
            self.last_offer
        );
        self.last_offer = now;
        self.stats.packets_offered += 1;
        self.stats.bytes_offered += len as u64;
        let queued_bytes = self.queued_bytes(now);
        if queued_bytes.saturating_add(len) > self.config.buffer_bytes {
            self.stats.packets_dropped += 1;
            self.stats.bytes_dropped += len as u64;
            return Err(Dropped { queued_bytes, len });
        }
        let start = self.free_at.max(now);
        let finish = start
            + Duration::from_nanos(transmit_nanos(
                len,
                self.config.bandwidth_bps,
                self.nanos_per_byte,
            ));
        self.free_at = finish;
        self.bytes_accepted += len as u64;
        self.in_flight.push_back((finish, self.bytes_accepted));
        self.stats.packets_sent += 1;
        self.stats.bytes_sent += len as u64;
        self.stats.queued_bytes_max = self.stats.queued_bytes_max.max(queued_bytes + len);
        Ok(finish + self.config.latency)
    }
}
