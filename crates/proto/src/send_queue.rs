//! What a node has to send from its own streams, in the order `poll_transmit` sends it: the
//! outbound streams with unsent messages, round-robin, then the streams that owe a silence
//! heartbeat. Both are queues of regions, so that sending a datagram costs the same whatever the
//! number of streams (a pass over every stream made a node publishing on thousands of topics
//! quadratic).
//!
//! Invariants: a region is in `data` at most once, exactly while its stream's `data_queued` is
//! set; `silences_pending` counts the streams whose `silence_pending` is set, each of which has
//! an entry in `silences` (an entry whose flag a data send cleared since is skipped).

use std::collections::{BTreeMap, VecDeque};

use tidings_wire::RegionId;

use crate::send::OutboundStream;

/// The regions whose outbound streams have data or a silence to send.
#[derive(Debug, Default)]
pub(crate) struct SendQueue {
    /// Streams with unsent messages, in round-robin order.
    pub(crate) data: VecDeque<RegionId>,
    /// Streams whose `silence_pending` was set, in that order.
    pub(crate) silences: VecDeque<RegionId>,
    /// Streams whose `silence_pending` is set.
    pub(crate) silences_pending: usize,
}

impl SendQueue {
    /// `region`'s stream has unsent messages: queued for data unless it is already.
    pub(crate) fn queue_data(&mut self, region: RegionId, stream: &mut OutboundStream) {
        if !stream.data_queued {
            stream.data_queued = true;
            self.data.push_back(region);
        }
    }

    /// Queues every stream with unsent messages afresh (a new membership replaced streams and
    /// re-homed messages).
    pub(crate) fn requeue_data(&mut self, outbound: &mut BTreeMap<RegionId, OutboundStream>) {
        self.data.clear();
        for (&region, stream) in outbound {
            stream.data_queued = stream.unsent_msgs() > 0;
            if stream.data_queued {
                self.data.push_back(region);
            }
        }
    }

    /// `region`'s stream owes a silence heartbeat.
    pub(crate) fn queue_silence(&mut self, region: RegionId, stream: &mut OutboundStream) {
        stream.silence_pending = true;
        self.silences_pending += 1;
        self.silences.push_back(region);
    }

    /// A datagram (data or silence) went out of `stream`: a silence it owed is paid.
    pub(crate) fn sent(&mut self, stream: &mut OutboundStream) {
        if std::mem::take(&mut stream.silence_pending) {
            self.silences_pending -= 1;
        }
    }

    /// Counts the pending silences afresh (a new membership replaced streams).
    pub(crate) fn recount_silences(&mut self, outbound: &BTreeMap<RegionId, OutboundStream>) {
        self.silences_pending = outbound.values().filter(|s| s.silence_pending).count();
    }
}
