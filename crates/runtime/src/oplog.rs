//! The operator's log lines, through `tracing`: a stalled publisher and whom it waits for,
//! view changes and recoveries at a node, joins, removals and leader changes at the membership
//! service. The library installs no subscriber (the program does: `tidings` writes to stderr).
//! None of these is on a per-message path; where a level is off, a line costs a check of a
//! static and nothing is formatted.
//!
//! Targets: [`STALL_TARGET`], [`VIEW_TARGET`], [`GMS_TARGET`] (`RUST_LOG=tidings::view=debug`
//! and the like pick them).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tidings_gms::{RemoveCause, Stall};
use tidings_proto::{Membership, MsgId, NodeId, RegionId, RegionView};
use tracing::{debug, info, warn, Level};

/// The target of the stalled-publisher lines (`warn` when a region stalls, `info` when it
/// clears).
pub const STALL_TARGET: &str = "tidings::stall";
/// The target of a node's view changes and recoveries (suspicions, its removal).
pub const VIEW_TARGET: &str = "tidings::view";
/// The target of the membership service's lines (joins, removals, leader changes).
pub const GMS_TARGET: &str = "tidings::gms";

/// Region lines of one install past which the rest are counted in one line: a node's first
/// membership may hold 100,000 regions.
const VIEW_LINES_MAX: usize = 16;

/// A thread body that logs to the subscriber in force where it was made (the global one, or
/// a scoped one such as a test's), inside `span`.
pub(crate) fn in_span<T>(
    span: tracing::Span,
    body: impl FnOnce() -> T + Send,
) -> impl FnOnce() -> T + Send {
    let dispatch = tracing::dispatcher::get_default(Clone::clone);
    move || tracing::dispatcher::with_default(&dispatch, || span.in_scope(body))
}

/// Node ids as `1,2,3`.
fn ids(nodes: impl IntoIterator<Item = NodeId>) -> String {
    let list: Vec<String> = nodes.into_iter().map(|n| n.0.to_string()).collect();
    list.join(",")
}

/// A region of this node's messages has not acknowledged its oldest one for `stall_after`.
pub(crate) fn stalled(stall: &Stall) {
    warn!(
        target: STALL_TARGET,
        region = stall.region.0,
        oldest_message = stall.oldest.0,
        waited_s = stall.waited.as_secs_f64(),
        members = %ids(stall.members.iter().copied()),
        "publisher stalled: the region has not acknowledged a message past stall_after; \
         one of its members has not received it or not passed the token on"
    );
}

/// A stalled region acknowledged what it held back.
pub(crate) fn stall_cleared(region: RegionId, waited: Duration) {
    info!(
        target: STALL_TARGET,
        region = region.0,
        waited_s = waited.as_secs_f64(),
        "publisher stall cleared"
    );
}

/// The membership service removed this node.
pub(crate) fn removed(leaving: bool) {
    if leaving {
        info!(target: VIEW_TARGET, "left the group");
    } else {
        warn!(
            target: VIEW_TARGET,
            "removed by the membership service (declared failed); the node has no regions"
        );
    }
}

/// The membership service lost this node (it restarted without its state) and the node
/// joined it again under a new id and incarnation, abandoning its unstable messages.
pub(crate) fn rejoined(old: NodeId, new: NodeId, incarnation: u32, abandoned: usize) {
    warn!(
        target: VIEW_TARGET,
        old = old.0,
        new = new.0,
        incarnation,
        abandoned,
        "joined the membership service again under a new id (the service had lost this node); messages not yet stable were abandoned"
    );
}

/// The oldest message of each stalled region and how long it has waited, as of `now_us`
/// (the member reports a stall once; the node's outbound streams say how it goes on).
pub(crate) fn stalls_now(
    stalls: &mut [Stall],
    oldest_unstable: impl Iterator<Item = (RegionId, MsgId, u64)>,
    now_us: u64,
) {
    let oldest: BTreeMap<RegionId, (MsgId, u64)> =
        oldest_unstable.map(|(r, m, at)| (r, (m, at))).collect();
    for stall in stalls {
        if let Some(&(msg, at)) = oldest.get(&stall.region) {
            stall.oldest = msg;
            stall.waited = Duration::from_micros(now_us.saturating_sub(at));
        }
    }
}

/// What a node's view lines compare against: the members of each region in the last view
/// logged, and the suspicions logged since. Kept only while `tidings::view` logs at `info`.
#[derive(Debug, Default)]
pub(crate) struct ViewLog {
    views: BTreeMap<RegionId, Vec<NodeId>>,
    suspected: BTreeSet<(RegionId, NodeId)>,
}

impl ViewLog {
    /// A ring neighbour suspected (once per member and region until the region's next view).
    pub(crate) fn suspected(&mut self, region: RegionId, node: NodeId) {
        if tracing::enabled!(target: VIEW_TARGET, Level::INFO)
            && self.suspected.insert((region, node))
        {
            info!(
                target: VIEW_TARGET,
                region = region.0,
                member = node.0,
                "ring neighbour suspected; reported to the membership service"
            );
        }
    }

    /// A membership installed: a line per region whose members changed (`info`; a view that
    /// only changed topics at `debug`), of the `changed` regions or, for a whole install, all.
    pub(crate) fn installed(&mut self, membership: &Membership, changed: Option<&[RegionId]>) {
        if !tracing::enabled!(target: VIEW_TARGET, Level::INFO) {
            self.views.clear();
            self.suspected.clear();
            return;
        }
        let regions: Vec<RegionId> = match changed {
            Some(changed) => changed.to_vec(),
            None => {
                let mut all: BTreeSet<RegionId> = membership.regions.keys().copied().collect();
                all.extend(self.views.keys().copied());
                all.into_iter().collect()
            }
        };
        let mut lines = 0;
        let mut unlogged = 0;
        for region in regions {
            self.suspected.retain(|(r, _)| *r != region);
            let view = membership.regions.get(&region);
            let new: Option<Vec<NodeId>> = view.map(|v| v.members().collect());
            let old = match &new {
                Some(n) => self.views.insert(region, n.clone()),
                None => self.views.remove(&region),
            };
            if old == new {
                if let Some(v) = view {
                    debug!(target: VIEW_TARGET, region = region.0, view = v.view.0,
                        "region view installed, same members (topics changed)");
                }
                continue;
            }
            if lines == VIEW_LINES_MAX {
                unlogged += 1;
                continue;
            }
            lines += 1;
            view_changed(region, view, old.unwrap_or_default());
        }
        if unlogged > 0 {
            info!(target: VIEW_TARGET, regions = unlogged,
                "more regions changed members in this install");
        }
    }
}

/// One region's members changed: from `old` to those of `view` (none if the node no longer
/// knows the region).
fn view_changed(region: RegionId, view: Option<&RegionView>, old: Vec<NodeId>) {
    let Some(view) = view else {
        info!(target: VIEW_TARGET, region = region.0, members = %ids(old),
            "region left this node's membership");
        return;
    };
    let old: BTreeSet<NodeId> = old.into_iter().collect();
    let new: BTreeSet<NodeId> = view.members().collect();
    info!(
        target: VIEW_TARGET,
        region = region.0,
        view = view.view.0,
        members = %ids(view.members()),
        joined = %ids(new.difference(&old).copied()),
        left = %ids(old.difference(&new).copied()),
        "region view installed"
    );
}

/// The membership service took a node in.
pub(crate) fn gms_joined(node: NodeId) {
    info!(target: GMS_TARGET, node = node.0, "member joined");
}

/// The membership service removed a node, and why.
pub(crate) fn gms_removed(node: NodeId, cause: RemoveCause) {
    let cause = match cause {
        RemoveCause::Left => "left",
        RemoveCause::HeartbeatTimeout => "heartbeat timeout",
        RemoveCause::Suspected => "suspected by a ring neighbour",
        RemoveCause::Unresponsive => "unresponsive to updates",
    };
    info!(target: GMS_TARGET, node = node.0, cause, "member removed");
}

/// A replica became the serving leader.
pub(crate) fn gms_leading(replica: usize, term: u64) {
    info!(target: GMS_TARGET, replica, term, "replica leads and serves");
}

/// A replica follows (it stopped leading, or learned of a new leader).
pub(crate) fn gms_following(replica: usize, term: u64, leader: Option<usize>) {
    match leader {
        Some(leader) => info!(target: GMS_TARGET, replica, term, leader, "replica follows"),
        None => info!(target: GMS_TARGET, replica, term, "replica follows, leader unknown"),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use tidings_proto::{TopicId, ViewId};

    use super::*;

    /// The lines `body` logs at `filter` (through a file).
    fn logged(filter: &str, body: impl FnOnce()) -> String {
        let path = std::env::temp_dir().join(format!("tidings-oplog-{}", std::process::id()));
        let file = std::fs::File::create(&path).unwrap();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || file.try_clone().unwrap())
            .with_env_filter(filter)
            .finish();
        tracing::subscriber::with_default(subscriber, body);
        let text = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        text
    }

    #[test]
    fn view_lines_name_who_joined_and_left() {
        let subs = (1..=3).map(|n| (NodeId(n), vec![TopicId(7)])).collect();
        let first = Membership::from_subscriptions(&subs, 5);
        let region = *first.regions.keys().next().unwrap();
        let mut second = first.clone();
        let view = second.regions.get_mut(&region).unwrap();
        view.view = ViewId(view.view.0 + 1);
        view.partitions = vec![vec![NodeId(1), NodeId(2), NodeId(4)]];
        let mut views = ViewLog::default();
        let text = logged("tidings=info", || {
            views.installed(&first, None);
            views.suspected(region, NodeId(3));
            views.suspected(region, NodeId(3));
            views.installed(&second, Some(&[region]));
            stall_cleared(region, Duration::from_millis(1500));
        });
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(
            lines[0].contains("members=1,2,3 joined=1,2,3 left="),
            "{text}"
        );
        assert!(
            lines[1].contains("suspected") && lines[1].contains("member=3"),
            "{text}"
        );
        assert!(lines[2].contains("members=1,2,4 joined=4 left=3"), "{text}");
        assert!(lines[3].contains("publisher stall cleared") && lines[3].contains("waited_s=1.5"));
        // Off, nothing is kept to compare against.
        let text = logged("warn", || views.installed(&second, None));
        assert!(text.is_empty() && views.views.is_empty(), "{text}");
    }
}
