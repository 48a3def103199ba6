//! Installing a membership: region states replaced or continued (ADR 30), the messages of
//! ended streams re-homed, and the timers and gauges of what changed.

use std::collections::BTreeMap;

use tidings_wire::{RegionId, TopicId};

use crate::membership::RegionView;
use crate::region::RegionState;
use crate::send::{OutMsg, OutboundStream};
use crate::time::Time;

use super::Node;

impl Node {
    /// The work of an install, once `self.membership` is the new one: the states of the
    /// regions in `views_changed` (added, dropped, or at a new epoch) are replaced, or go on
    /// into a new view of the same base (ADR 30); the streams whose view ended re-home their
    /// messages; and what the regions touched feed (timers, gauges) is looked at again.
    /// `old_views`: each changed region's view in the membership before.
    pub(super) fn install_views(
        &mut self,
        now: Time,
        views_changed: Vec<RegionId>,
        old_views: BTreeMap<RegionId, RegionView>,
    ) {
        self.input_at = now;
        self.out.stats.view_changes += 1;
        self.gather_msg_id_floors();
        // The regions whose state this install replaces, adds or drops: only they need their
        // timers and gauges looked at again (a node in thousands of regions installs a
        // membership per batch of subscriptions, and kept regions do not change).
        let mut touched: Vec<RegionId> = views_changed;
        self.install_region_states(now, &touched);
        let (ended, continued) = self.end_or_continue_streams(&old_views);
        touched.extend_from_slice(&ended);
        touched.extend_from_slice(&continued);
        let created = self.rehome(now, &ended, &continued, old_views);
        touched.extend_from_slice(&created);
        self.after_install(now, touched);
    }

    /// Folds what every inbound stream delivered into the node's message-id floors, and shares
    /// a copy with the region states installed now.
    pub(super) fn gather_msg_id_floors(&mut self) {
        // Receiving side. With no inbound stream anywhere (`receiving`: a node subscribing to
        // thousands of topics before any traffic) there is no floor to gather, and no pass over
        // every region per install.
        let mut floors_moved = false;
        debug_assert_eq!(
            self.receiving,
            self.regions.values().any(|r| !r.inbound.is_empty()),
            "receiving at install"
        );
        if self.receiving {
            for region in self.regions.values() {
                for (key, floor) in region.stream_msg_id_floors() {
                    let f = self.msg_id_floors.entry(key).or_insert(0);
                    if floor > *f {
                        *f = floor;
                        floors_moved = true;
                    }
                }
            }
        }
        // One copy, shared by the regions installed now (they only read it), made again only
        // when a floor moved (a copy per install was a pass over every stream's topics).
        if floors_moved || self.msg_id_floors.len() != self.floors_shared.len() {
            self.floors_shared = std::sync::Arc::new(self.msg_id_floors.clone());
        }
    }

    /// Replaces, adds or drops the states of the regions in `touched`; a state whose new view
    /// continues it goes on (ADR 30).
    pub(super) fn install_region_states(&mut self, now: Time, touched: &[RegionId]) {
        let floors = &self.floors_shared;
        // The regions whose state this install replaces, adds or drops: only they need their
        // timers and gauges looked at again (a node in thousands of regions installs a
        // membership per batch of subscriptions, and kept regions do not change).
        for &region in touched {
            let old = self.regions.remove(&region);
            let Some(view) = self.membership.regions.get(&region) else {
                continue;
            };
            match old {
                // Only topics were added, or dropped by every member: the streams, rings and
                // caches go on (ADR 30). A dropped topic's messages still in flight here are
                // received and filtered, as any topic the view does not carry.
                Some(mut state) if state.continues_into(view) => {
                    state.continue_into(view, floors);
                    self.regions.insert(region, state);
                    self.out.stats.views_continued += 1;
                }
                _ => {
                    if let Some(mut state) = RegionState::new(view, self.me, &self.config, now) {
                        state.set_msg_id_floors(floors.clone());
                        self.regions.insert(region, state);
                    }
                }
            }
        }
    }

    /// Sorts the outbound streams whose region's view changed: those whose view ended (they
    /// give up their messages) and those that go on into a view of their base (ADR 30).
    pub(super) fn end_or_continue_streams(
        &mut self,
        old_views: &BTreeMap<RegionId, RegionView>,
    ) -> (Vec<RegionId>, Vec<RegionId>) {
        // Sending side: streams whose view ended give up their messages, which go to the
        // regions their topics span now; streams whose region's new view has their base go on
        // in it, unpaused: a receiver that has not installed the view yet keeps their packets
        // until it does, and a pause per view cut a busy region's rate by a third at 100
        // subscriptions a second (ADR 30).
        let mut ended: Vec<RegionId> = Vec::new();
        let mut continued: Vec<RegionId> = Vec::new();
        for (&region, stream) in &mut self.outbound {
            // The partitions the stream ran in are those of the region's view before.
            let continues = |v: &RegionView| {
                old_views
                    .get(&region)
                    .is_some_and(|old| v.continues(stream.view, stream.base, &old.partitions))
            };
            match self.membership.regions.get(&region) {
                Some(v) if v.view == stream.view => {}
                Some(v) if continues(v) => {
                    stream.view = v.view;
                    continued.push(region);
                }
                _ => ended.push(region),
            }
        }
        (ended, continued)
    }

    /// Re-homes the messages of the `ended` streams into the streams of the regions their topics
    /// span now (paused for `view_change_pause` when created here), and the messages of the
    /// topics a `continued` stream gained into it; moves each message's stability count by the
    /// copies that changed hands. Returns the regions whose streams it created.
    pub(super) fn rehome(
        &mut self,
        now: Time,
        ended: &[RegionId],
        continued: &[RegionId],
        old_views: BTreeMap<RegionId, RegionView>,
    ) -> Vec<RegionId> {
        let membership = &self.membership;
        let pause_until = now + self.config.view_change_pause;
        // The topics each continued stream had: a message re-homed into it is new to it only
        // if its topic is not among them (sorted for the look-ups below). Only continued
        // streams are here, so `gained` is false for every other.
        let old_topics: BTreeMap<RegionId, Vec<TopicId>> = old_views
            .into_iter()
            .filter(|(r, _)| continued.contains(r))
            .map(|(r, v)| {
                let mut topics = v.topics;
                topics.sort_unstable();
                (r, topics)
            })
            .collect();
        let gained = |region: RegionId, topic: TopicId| {
            old_topics
                .get(&region)
                .is_some_and(|t| t.binary_search(&topic).is_err())
        };
        // By message id, the first copy of each and how many ended streams held it (a list
        // sorted once: there may be thousands).
        let mut drained: Vec<OutMsg> = Vec::new();
        for region in ended {
            if let Some(mut stream) = self.outbound.remove(region) {
                drained.extend(stream.drain_all());
            }
        }
        drained.sort_by_key(|m| m.msg_id);
        let mut orphans: Vec<(OutMsg, u16)> = Vec::with_capacity(drained.len());
        for m in drained {
            match orphans.last_mut() {
                Some((last, copies)) if last.msg_id == m.msg_id => {
                    *copies = copies.saturating_add(1);
                }
                _ => orphans.push((m, 1)),
            }
        }
        // Re-homed messages for continued streams, appended after the loop below (which looks
        // up what those streams hold and needs them unchanged meanwhile).
        let mut rehomed_into_continued: Vec<(RegionId, OutMsg)> = Vec::new();
        // Streams created here, for regions new to this node: they take every re-homed message of
        // their topics, like the streams of changed regions.
        let mut created: Vec<RegionId> = Vec::new();
        // Per unchanged or continued stream, where the last look-up stopped: orphans come by
        // increasing id and these streams do not change here, so each is walked once (a search
        // per orphan and region was most of this function). A stream created in this loop holds
        // only orphans already handled, so it never holds the current one.
        let mut cursors: Vec<(RegionId, usize)> = Vec::new();
        // The stability count of each orphan moves by what changed hands: minus the ended streams
        // that held it, plus the streams it is pushed into. Streams that still hold it (unchanged
        // ones, and continued ones whose region lost its topic, whose members dropped it) count
        // as before and acknowledge it in their time.
        for (m, copies) in orphans {
            let msg_id = m.msg_id;
            let regions = membership
                .topic_regions
                .get(&m.topic)
                .map_or(&[][..], Vec::as_slice);
            let mut added = 0u16;
            for &region in regions {
                if let Some(stream) = self.outbound.get(&region) {
                    if gained(region, m.topic) {
                        if stream.holds_after(cursor_of(&mut cursors, region), msg_id) {
                            // The topic left this region (its members dropped it) and came back
                            // while the message was still in flight here: not new to it.
                            continue;
                        }
                        // A topic this stream did not carry: the message is new to it.
                        rehomed_into_continued.push((region, m.clone()));
                        self.out.stats.messages_rehomed += 1;
                        added += 1;
                        continue;
                    }
                    let new = ended.contains(&region) || created.contains(&region);
                    if !new {
                        // An unchanged region has it in flight or acknowledged it already.
                        continue;
                    }
                }
                let Some((view, base)) = membership.regions.get(&region).map(|v| (v.view, v.base))
                else {
                    continue;
                };
                if !self.outbound.contains_key(&region) {
                    created.push(region);
                }
                let stream = self.outbound.entry(region).or_insert_with(|| {
                    let mut s = OutboundStream::new(view, base, now);
                    s.paused_until = pause_until;
                    s
                });
                stream.push(m.clone());
                self.out.stats.messages_rehomed += 1;
                added += 1;
            }
            if self.stability.moved(msg_id, copies, added) {
                self.out.stable(msg_id);
            }
        }
        for (region, m) in rehomed_into_continued {
            if let Some(stream) = self.outbound.get_mut(&region) {
                stream.push_rehomed(m);
            }
        }
        created
    }

    /// What an install leaves to do: the send queue, the timers and the gauges of the regions
    /// `touched`, and the datagrams that waited for this membership.
    pub(super) fn after_install(&mut self, now: Time, mut touched: Vec<RegionId>) {
        // Streams were replaced and re-homed messages added: queue every stream with unsent ones.
        self.send_queue.requeue_data(&mut self.outbound);
        // Regions replaced or added enter their ring timers; kept regions keep theirs, asleep or
        // not (re-homed messages only go to streams of replaced or new regions, and sending
        // into a region wakes its rings), and entries of regions gone are skipped when they
        // come up. The streams' timers are entered afresh.
        touched.sort_unstable();
        touched.dedup();
        for &region in &touched {
            self.schedule_region_timer(region);
        }
        self.reset_stream_timer();
        // The gauges change by the parts of the regions touched (before the datagrams below,
        // which expect every region to have its part).
        for &region in &touched {
            self.refresh_or_forget_gauges(region);
        }
        // New and replaced regions start without inbound streams, so a node that had none still
        // has none (without the pass over every region that finds that).
        self.receiving = self.receiving && self.regions.values().any(|r| !r.inbound.is_empty());
        // Datagrams that waited for this membership.
        for datagram in std::mem::take(&mut self.future) {
            self.out.stats.datagrams_received -= 1;
            self.out.stats.bytes_received -= datagram.len() as u64;
            self.handle_datagram(now, datagram);
        }
    }
}

/// `region`'s look-up cursor in `cursors` (a few streams per install, so a list), starting at
/// the stream's front the first time.
pub(super) fn cursor_of(cursors: &mut Vec<(RegionId, usize)>, region: RegionId) -> &mut usize {
    let at = match cursors.iter().position(|(r, _)| *r == region) {
        Some(at) => at,
        None => {
            cursors.push((region, 0));
            cursors.len() - 1
        }
    };
    &mut cursors[at].1
}
