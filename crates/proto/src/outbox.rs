//! What handlers produce for later: control packets, retransmission jobs, events and counters.
//! Control packets are small and rare (tokens a few times a second per ring, pulls on loss), so
//! they are kept as values; retransmissions are jobs over sequence ranges, encoded from the held
//! payloads only when a socket can send (docs/design.md section 4: datagrams are built at pull time).

use std::collections::VecDeque;

use tidings_wire::{
    write_ack, write_dcq, write_ranges, write_token_ack, write_uca, BufferFull, Header, Kind,
    MsgId, NodeId, Priority, RegionId, SeqRange, ViewId,
};

use crate::config::Config;
use crate::region::OwnedToken;
use crate::stats::Stats;
use crate::time::Time;
use crate::{Destination, Event};

/// A control packet waiting to be sent.
#[derive(Clone, Debug)]
pub(crate) enum Control {
    /// A token, already encoded (it carries the state of the moment it was processed).
    Token { to: NodeId, bytes: Vec<u8> },
    /// A pull request for stream `origin`.
    Pull {
        to: NodeId,
        region: RegionId,
        view: ViewId,
        origin: NodeId,
        ranges: Vec<SeqRange>,
    },
    /// A congestion query of this node's stream into `region`.
    Dcq {
        region: RegionId,
        view: ViewId,
        seq: u64,
        position_us: u64,
    },
    /// A consolidated congestion alert about `origin`'s stream, to the next node up.
    Uca {
        to: NodeId,
        region: RegionId,
        view: ViewId,
        origin: NodeId,
        seq: u64,
        nonrec: u32,
        rec: u32,
    },
    /// Confirms to `to` that its token arrived.
    TokenAck {
        to: NodeId,
        region: RegionId,
        view: ViewId,
        level: u8,
        ring: u16,
        round: u64,
    },
    /// An aggregate ACK to a sender.
    Ack {
        to: NodeId,
        region: RegionId,
        view: ViewId,
        origin: NodeId,
        stable_upto: u64,
    },
    /// A NAK to a sender.
    Nak {
        to: NodeId,
        region: RegionId,
        view: ViewId,
        origin: NodeId,
        ranges: Vec<SeqRange>,
    },
}

impl Control {
    /// Writes the packet into `buf` as node `sender`: where it goes, its length and priority,
    /// and for a pull the number of its ranges that fit (the rest go in another datagram).
    /// Fails only if `buf` cannot hold the packet's fixed part (or a whole token).
    pub(crate) fn encode(
        &self,
        sender: NodeId,
        buf: &mut [u8],
    ) -> Result<(crate::Transmit, usize), BufferFull> {
        let header = |kind, region, view| Header {
            kind,
            region,
            view,
            sender,
            // `Node::poll_transmit` stamps the node's incarnation.
            incarnation: 0,
        };
        let to_node = |to: NodeId, len: usize, priority: Priority| crate::Transmit {
            destination: Destination::Node(to),
            len,
            priority,
        };
        let control = Priority::Control;
        Ok(match self {
            Control::Token { to, bytes } => {
                let dst = buf.get_mut(..bytes.len()).ok_or(BufferFull)?;
                dst.copy_from_slice(bytes);
                (to_node(*to, bytes.len(), control), 0)
            }
            Control::Dcq {
                region,
                view,
                seq,
                position_us,
            } => {
                let h = header(Kind::Dcq, *region, *view);
                let len = write_dcq(buf, &h, *seq, *position_us)?;
                let t = crate::Transmit {
                    destination: Destination::Region(*region),
                    len,
                    priority: control,
                };
                (t, 0)
            }
            Control::Uca {
                to,
                region,
                view,
                origin,
                seq,
                nonrec,
                rec,
            } => {
                let h = header(Kind::Uca, *region, *view);
                let len = write_uca(buf, &h, *origin, *seq, *nonrec, *rec)?;
                (to_node(*to, len, control), 0)
            }
            Control::TokenAck {
                to,
                region,
                view,
                level,
                ring,
                round,
            } => {
                let h = header(Kind::TokenAck, *region, *view);
                let len = write_token_ack(buf, &h, *level, *ring, *round)?;
                (to_node(*to, len, control), 0)
            }
            Control::Ack {
                to,
                region,
                view,
                origin,
                stable_upto,
            } => {
                let h = header(Kind::Ack, *region, *view);
                let len = write_ack(buf, &h, *origin, *stable_upto)?;
                (to_node(*to, len, control), 0)
            }
            Control::Nak {
                to,
                region,
                view,
                origin,
                ranges,
            } => {
                let h = header(Kind::Nak, *region, *view);
                let (len, written) = write_ranges(buf, &h, Kind::Nak, *origin, ranges)?;
                (to_node(*to, len, control), written)
            }
            Control::Pull {
                to,
                region,
                view,
                origin,
                ranges,
            } => {
                let h = header(Kind::Pull, *region, *view);
                let (len, written) = write_ranges(buf, &h, Kind::Pull, *origin, ranges)?;
                (to_node(*to, len, Priority::Recovery), written)
            }
        })
    }
}

/// Why a message is resent (for the counters).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RepairCause {
    /// Pushed to a ring neighbour that lacked it.
    Push,
    /// Asked for by a pull request.
    Pull,
    /// Re-multicast by the sender after a region NAK.
    Nak,
}

/// Resend sequence numbers `next..end` of stream `origin` in `region` to `to`.
#[derive(Clone, Debug)]
pub(crate) struct RepairJob {
    pub(crate) to: Destination,
    pub(crate) region: RegionId,
    pub(crate) view: ViewId,
    pub(crate) origin: NodeId,
    pub(crate) next: u64,
    pub(crate) end: u64,
    pub(crate) cause: RepairCause,
    /// When the job was queued; a job older than `repair_queue_ttl` is dropped unsent (its
    /// requester has asked again, or elsewhere, by then).
    pub(crate) queued_at: Time,
}

impl RepairJob {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        to: Destination,
        region: RegionId,
        view: ViewId,
        origin: NodeId,
        start: u64,
        end: u64,
        cause: RepairCause,
        queued_at: Time,
    ) -> Self {
        RepairJob {
            to,
            region,
            view,
            origin,
            next: start,
            end,
            cause,
            queued_at,
        }
    }

    pub(crate) fn same_packet(&self, other: &RepairJob) -> bool {
        self.to == other.to
            && self.region == other.region
            && self.view == other.view
            && self.origin == other.origin
    }
}

/// Everything the handlers leave for `poll_transmit`, `poll_event` and the counters.
#[derive(Debug, Default)]
pub(crate) struct Outbox {
    pub(crate) control: VecDeque<Control>,
    pub(crate) repairs: VecDeque<RepairJob>,
    /// Sequence numbers in `repairs`, bounded by `retransmit_queue_max`.
    pub(crate) repairs_queued: usize,
    pub(crate) events: VecDeque<Event>,
    /// The last event queued is an [`Event::Stable`] that the next message to become stable may
    /// extend: cleared by [`Outbox::close_events`].
    stable_open: bool,
    pub(crate) stats: Stats,
    /// ACKs this node, as region leader, owes its own outbound streams.
    pub(crate) self_acks: Vec<(RegionId, u64)>,
    /// Congestion alerts about this node's own streams that reached it as region leader:
    /// (query sequence number, slowest rate).
    pub(crate) self_ucas: Vec<(u64, f64)>,
    /// NAKs this node, as region leader, owes its own outbound streams.
    pub(crate) self_naks: Vec<(RegionId, Vec<SeqRange>)>,
    /// Buffers of tokens that went out, reused for the next ones: a token is encoded every round
    /// on every ring, and the steady state allocates nothing.
    token_buffers: Vec<Vec<u8>>,
    /// Range lists no longer needed (of pulls and NAKs that went out, of token records a token
    /// no longer carries), reused for the next ones: repairs under loss allocate nothing once the
    /// pool is warm.
    range_lists: Vec<Vec<SeqRange>>,
}

/// Most range lists kept for reuse.
const RANGE_LISTS_KEPT: usize = 64;

/// Most token buffers kept for reuse: tokens waiting in the control queue at once are few (one per
/// ring this node is in, plus resends).
const TOKEN_BUFFERS_KEPT: usize = 16;

impl Outbox {
    /// `msg_id`, a message of this node, is stable: counted, and reported by extending the last
    /// event queued if it is the [`Event::Stable`] of the ids just before, else by a new one.
    pub(crate) fn stable(&mut self, msg_id: MsgId) {
        self.stats.messages_stable += 1;
        if self.stable_open {
            if let Some(Event::Stable { last, .. }) = self.events.back_mut() {
                if last.0.checked_add(1) == Some(msg_id.0) {
                    *last = msg_id;
                    return;
                }
            }
        }
        self.events.push_back(Event::Stable {
            first: msg_id,
            last: msg_id,
        });
        self.stable_open = true;
    }

    /// The events queued so far are closed: what becomes stable from now on is reported in
    /// events after them.
    pub(crate) fn close_events(&mut self) {
        self.stable_open = false;
    }

    /// Queues a retransmission job, clipped to the room left in the retransmit queue.
    pub(crate) fn queue_repair(&mut self, mut job: RepairJob, config: &Config) {
        let want = job.end.saturating_sub(job.next) as usize;
        let room = config
            .retransmit_queue_max
            .saturating_sub(self.repairs_queued);
        if want > room {
            self.stats.repair_queue_overflows += (want - room) as u64;
            job.end = job.next + room as u64;
        }
        if job.end <= job.next {
            return;
        }
        self.repairs_queued += (job.end - job.next) as usize;
        self.repairs.push_back(job);
    }

    /// Encodes a token for `to` into `encoded` (kept by the ring for retransmission until the
    /// next member confirms it) and queues a copy for sending.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn send_token(
        &mut self,
        region: RegionId,
        view: ViewId,
        me: NodeId,
        to: NodeId,
        token: &OwnedToken,
        config: &Config,
        encoded: &mut Vec<u8>,
    ) {
        encoded.clear();
        encoded.resize(config.max_datagram_bytes, 0);
        let header = tidings_wire::Header {
            kind: tidings_wire::Kind::Token,
            region,
            view,
            sender: me,
            incarnation: 0,
        };
        let Ok(mut w) =
            tidings_wire::TokenWriter::new(encoded, &header, token.level, token.ring, token.round)
        else {
            encoded.clear();
            return;
        };
        for rec in &token.records {
            // Our own bug if it fails: peers would drop the token as invalid.
            debug_assert!(
                rec.agg_contiguous <= rec.agg_max && rec.prev_contiguous <= rec.prev_max,
                "token record claims a prefix beyond its maximum: {rec:?}"
            );
            if w.push(&rec.as_wire()).is_err() {
                // Records were sized to fit; one that does not is left for a later round.
                break;
            }
        }
        let len = w.finish();
        encoded.truncate(len);
        self.queue_token(to, encoded);
    }

    /// Queues an encoded token for `to`, copied into a recycled buffer.
    pub(crate) fn queue_token(&mut self, to: NodeId, encoded: &[u8]) {
        if encoded.is_empty() {
            return;
        }
        let mut bytes = self.token_buffers.pop().unwrap_or_default();
        bytes.clear();
        bytes.extend_from_slice(encoded);
        self.control.push_back(Control::Token { to, bytes });
    }

    /// An empty range list, recycled if one is free.
    pub(crate) fn take_range_list(&mut self) -> Vec<SeqRange> {
        let mut list = self.range_lists.pop().unwrap_or_default();
        list.clear();
        list
    }

    /// Takes back a range list that is no longer needed, for the next request.
    pub(crate) fn recycle_range_list(&mut self, list: Vec<SeqRange>) {
        if self.range_lists.len() < RANGE_LISTS_KEPT && list.capacity() > 0 {
            self.range_lists.push(list);
        }
    }

    /// Takes back the buffer of a token that went out, for the next one.
    pub(crate) fn recycle_token_buffer(&mut self, bytes: Vec<u8>) {
        if self.token_buffers.len() < TOKEN_BUFFERS_KEPT {
            self.token_buffers.push(bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stable(first: u64, last: u64) -> Event {
        Event::Stable {
            first: MsgId(first),
            last: MsgId(last),
        }
    }

    /// Consecutive ids extend the last event while it is a `Stable` and nobody closed it; a gap,
    /// another event or a close starts a new one. Each message is counted once.
    #[test]
    fn stable_messages_join_the_last_event_until_it_is_closed() {
        let mut out = Outbox::default();
        for id in [1, 2, 3, 5, 6] {
            out.stable(MsgId(id));
        }
        out.close_events();
        out.stable(MsgId(7));
        out.events.push_back(Event::TokenRound {
            region: RegionId(1),
            level: 0,
            top: true,
            rtt: std::time::Duration::ZERO,
        });
        out.stable(MsgId(8));
        out.stable(MsgId(9));
        let events: Vec<Event> = out.events.drain(..).collect();
        assert_eq!(events[..3], [stable(1, 3), stable(5, 6), stable(7, 7)]);
        assert!(matches!(events[3], Event::TokenRound { .. }));
        assert_eq!(events[4..], [stable(8, 9)]);
        assert_eq!(out.stats.messages_stable, 8);
        // Taken: the next one starts afresh.
        out.stable(MsgId(10));
        assert_eq!(out.events.pop_front(), Some(stable(10, 10)));
    }
}
