//! Sending (`Node::poll_transmit`): control first, then retransmissions, then new data, then
//! silences, each written into the caller's buffer.

use tidings_wire::{
    write_silence, Header, Kind, Message, MessagesWriter, Priority, RegionId, Silence,
};

use crate::outbox::{Control, RepairCause};
use crate::policy::FlowWindow;
use crate::time::Time;
use crate::timers::schedule_stream;
use crate::Destination;

use super::{Node, Transmit};

impl Node {
    pub(super) fn header(
        &self,
        kind: Kind,
        region: RegionId,
        view: tidings_wire::ViewId,
    ) -> Header {
        Header {
            kind,
            region,
            view,
            sender: self.me,
            // Stamped by `poll_transmit`, as on every datagram.
            incarnation: 0,
        }
    }

    pub(super) fn poll_control(&mut self, buf: &mut [u8]) -> Option<Transmit> {
        while let Some(c) = self.out.control.pop_front() {
            let encoded = c.encode(self.me, buf);
            let transmit = match (encoded, c) {
                (
                    Ok((t, written)),
                    Control::Pull {
                        to,
                        region,
                        view,
                        origin,
                        mut ranges,
                    },
                ) if written < ranges.len() => {
                    // The ranges that did not fit go in the next datagram.
                    ranges.drain(..written);
                    self.out.control.push_front(Control::Pull {
                        to,
                        region,
                        view,
                        origin,
                        ranges,
                    });
                    Some(t)
                }
                (encoded, c) => {
                    match c {
                        Control::Token { bytes, .. } => self.out.recycle_token_buffer(bytes),
                        Control::Nak { ranges, .. } | Control::Pull { ranges, .. } => {
                            self.out.recycle_range_list(ranges);
                        }
                        _ => {}
                    }
                    encoded.ok().map(|(t, _)| t)
                }
            };
            match transmit {
                Some(t) => return Some(t),
                // Every control kind fits `max_datagram_bytes`, which `poll_transmit` checked:
                // a refusal here is a bug of this crate (counted, and a panic in debug builds).
                None => {
                    debug_assert!(false, "a control packet did not fit max_datagram_bytes");
                    self.out.stats.control_unsendable += 1;
                }
            }
        }
        None
    }

    pub(super) fn poll_repair(&mut self, now: Time, buf: &mut [u8]) -> Option<Transmit> {
        loop {
            self.expire_repairs(now);
            let first = self.out.repairs.front()?.clone();
            let header = self.header(Kind::Retransmit, first.region, first.view);
            let Ok(mut w) = MessagesWriter::retransmit(buf, &header, first.origin) else {
                return None;
            };
            'jobs: while let Some(job) = self.out.repairs.front_mut() {
                if !job.same_packet(&first) {
                    break;
                }
                while job.next < job.end {
                    let seq = job.next;
                    let msg = if job.origin == self.me {
                        self.outbound
                            .get(&job.region)
                            .filter(|s| seq <= s.sent_upto)
                            .and_then(|s| s.get(seq))
                            .map(|m| (m.msg_id, m.topic, m.timestamp_us, &m.payload))
                    } else {
                        self.regions
                            .get(&job.region)
                            .and_then(|r| r.inbound.get(&job.origin))
                            .and_then(|s| s.get(seq))
                            .map(|m| (m.msg_id, m.topic, m.timestamp_us, &m.payload))
                    };
                    let Some((msg_id, topic, timestamp_us, payload)) = msg else {
                        self.out.stats.repair_misses += 1;
                        job.next += 1;
                        self.out.repairs_queued -= 1;
                        continue;
                    };
                    let m = Message {
                        seq,
                        msg_id: msg_id.0,
                        timestamp_us,
                        topic,
                        payload,
                    };
                    if w.push(&m).is_err() {
                        break 'jobs;
                    }
                    match job.cause {
                        RepairCause::Push => self.out.stats.messages_pushed += 1,
                        RepairCause::Pull => self.out.stats.messages_resent_on_pull += 1,
                        RepairCause::Nak => self.out.stats.messages_resent_on_nak += 1,
                    }
                    job.next += 1;
                    self.out.repairs_queued -= 1;
                }
                self.out.repairs.pop_front();
            }
            if w.count() > 0 {
                let len = w.finish();
                self.out.stats.retransmit_packets_sent += 1;
                return Some(Transmit {
                    destination: first.to,
                    len,
                    priority: Priority::Recovery,
                });
            }
        }
    }

    /// Drops queued retransmissions that waited longer than `repair_queue_ttl`.
    pub(super) fn expire_repairs(&mut self, now: Time) {
        while let Some(job) = self.out.repairs.front() {
            if now < job.queued_at + self.config.repair_queue_ttl {
                break;
            }
            let left = (job.end - job.next) as usize;
            self.out.repairs_queued -= left;
            self.out.stats.repair_queue_expired += left as u64;
            self.out.repairs.pop_front();
        }
    }

    pub(super) fn poll_data(&mut self, now: Time, buf: &mut [u8]) -> Option<Transmit> {
        // Each queued stream is looked at once per call: one whose window is closed (or that is
        // paused) goes to the back and waits for its ACKs.
        for _ in 0..self.send_queue.data.len() {
            let region = self.send_queue.data.pop_front()?;
            let Some(stream) = self.outbound.get_mut(&region) else {
                continue;
            };
            if stream.unsent_msgs() == 0 {
                stream.data_queued = false;
                continue;
            }
            let others_unstable = self
                .config
                .window
                .algorithm
                .others_unstable(self.regions.get(&region));
            if !stream.can_send(&self.config, others_unstable) {
                self.send_queue.data.push_back(region);
                continue;
            }
            let header = Header {
                kind: Kind::Data,
                region,
                view: stream.view,
                sender: self.me,
                incarnation: 0,
            };
            let Ok(mut w) = MessagesWriter::data(buf, &header) else {
                self.send_queue.data.push_front(region);
                return None;
            };
            let packed = stream.pack_unsent(&mut w, &self.config, others_unstable);
            if packed == 0 {
                self.send_queue.data.push_back(region);
                continue;
            }
            let len = w.finish();
            stream.last_send = now;
            stream.last_data_at = now;
            stream.silences_since_data = 0;
            self.send_queue.sent(stream);
            // New messages of this node's own stream for the region's rings to carry; only a
            // ring that was asleep moves the region's deadline.
            let woke = self
                .regions
                .get_mut(&region)
                .is_some_and(|state| state.wake_leads(now, &self.config));
            // Round robin: a stream with more to send goes behind the others.
            if stream.unsent_msgs() > 0 {
                self.send_queue.data.push_back(region);
            } else {
                stream.data_queued = false;
            }
            self.out.stats.data_packets_sent += 1;
            self.out.stats.messages_sent += packed as u64;
            // A first send gives the stream a silence deadline.
            self.stream_changed(region);
            if woke {
                self.schedule_region_timer(region);
            }
            return Some(Transmit {
                destination: Destination::Region(region),
                len,
                priority: Priority::Data,
            });
        }
        None
    }

    pub(super) fn poll_silence(&mut self, now: Time, buf: &mut [u8]) -> Option<Transmit> {
        if self.send_queue.silences_pending == 0 {
            // Whatever is left are entries of silences a data send made unnecessary.
            self.send_queue.silences.clear();
            return None;
        }
        let me = self.me;
        while let Some(region) = self.send_queue.silences.pop_front() {
            let Some(stream) = self.outbound.get_mut(&region) else {
                continue;
            };
            if !stream.silence_pending {
                continue;
            }
            let header = Header {
                kind: Kind::Silence,
                region,
                view: stream.view,
                sender: me,
                incarnation: 0,
            };
            let silence = Silence {
                last_seq: stream.sent_upto,
                timestamp_us: now.as_micros(),
                acked_upto: stream.stable_upto,
            };
            let Ok(len) = write_silence(buf, &header, &silence) else {
                self.send_queue.silences.push_front(region);
                return None;
            };
            self.send_queue.sent(stream);
            stream.last_send = now;
            stream.silences_since_data = stream.silences_since_data.saturating_add(1);
            self.out.stats.silences_sent += 1;
            schedule_stream(&mut self.timers.streams, region, stream, &self.config);
            return Some(Transmit {
                destination: Destination::Region(region),
                len,
                priority: Priority::Data,
            });
        }
        None
    }
}
