//! Where nodes and regions are on the network.

use std::collections::BTreeMap;
use std::net::{SocketAddr, SocketAddrV4};

use tidings_proto::{Membership, NodeId, RegionId};

use crate::config::Transport;

/// The address of every node (its unicast socket) and, for the multicast transport, the group of
/// every region. The GMS will hand these out with the views; until then the caller builds them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AddressBook {
    /// Unicast address of each node.
    pub nodes: BTreeMap<NodeId, SocketAddr>,
    /// IP multicast group and port of each region (used only by [`Transport::Multicast`]).
    pub groups: BTreeMap<RegionId, SocketAddrV4>,
}

/// The resolved destinations of the core thread: what a `Destination` of the protocol turns
/// into. Rebuilt whenever the membership or the address book changes, so sending needs one map
/// lookup and no allocation.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Routes {
    nodes: BTreeMap<NodeId, SocketAddr>,
    /// Per region: the multicast group (one entry) or the members other than this node.
    regions: BTreeMap<RegionId, Vec<SocketAddr>>,
    /// Groups of the regions this node is a member of (to join), multicast only.
    joined: Vec<(RegionId, SocketAddrV4)>,
}

impl Routes {
    pub(crate) fn new(
        me: NodeId,
        membership: &Membership,
        book: &AddressBook,
        transport: &Transport,
    ) -> Routes {
        let mut regions = BTreeMap::new();
        let mut joined = Vec::new();
        for (&region, view) in &membership.regions {
            let (addrs, join) = Self::route(me, view, book, transport);
            if let Some(group) = join {
                joined.push((region, group));
            }
            regions.insert(region, addrs);
        }
        Routes {
            nodes: book.nodes.clone(),
            regions,
            joined,
        }
    }

    /// Brings the routes of `changed` regions up to date with `membership` (a region no longer
    /// in it loses its route), or all of them if the node addresses changed (a member's address
    /// may have been missing): what [`Routes::new`] would build, at the cost of the change.
    pub(crate) fn update(
        &mut self,
        me: NodeId,
        membership: &Membership,
        book: &AddressBook,
        transport: &Transport,
        changed: impl IntoIterator<Item = RegionId>,
    ) {
        if self.nodes != book.nodes {
            *self = Routes::new(me, membership, book, transport);
            return;
        }
        let mut changed: Vec<RegionId> = changed.into_iter().collect();
        changed.sort_unstable();
        // One pass over the joined groups, not one per changed region.
        let joined_before = self.joined.len();
        self.joined
            .retain(|(r, _)| changed.binary_search(r).is_err());
        let mut joined_changed = self.joined.len() != joined_before;
        for region in changed {
            self.regions.remove(&region);
            let Some(view) = membership.regions.get(&region) else {
                continue;
            };
            let (addrs, join) = Self::route(me, view, book, transport);
            if let Some(group) = join {
                self.joined.push((region, group));
                joined_changed = true;
            }
            self.regions.insert(region, addrs);
        }
        if joined_changed {
            // In region order, as `new` builds it.
            self.joined.sort_unstable_by_key(|&(r, _)| r);
        }
    }

    /// A region's destinations, and its group if this node must join it.
    fn route(
        me: NodeId,
        view: &tidings_proto::RegionView,
        book: &AddressBook,
        transport: &Transport,
    ) -> (Vec<SocketAddr>, Option<SocketAddrV4>) {
        let region = view.region;
        let addrs = match transport {
            Transport::Multicast(_) => book
                .groups
                .get(&region)
                .map(|g| vec![SocketAddr::V4(*g)])
                .unwrap_or_default(),
            Transport::Unicast => view
                .members()
                .filter(|&n| n != me)
                .filter_map(|n| book.nodes.get(&n).copied())
                .collect(),
        };
        let join = match (transport, book.groups.get(&region)) {
            (Transport::Multicast(_), Some(group)) if view.partition_of(me).is_some() => {
                Some(*group)
            }
            _ => None,
        };
        (addrs, join)
    }

    /// Routes to regions only, each to the given addresses (tests of the send path).
    #[cfg(test)]
    pub(crate) fn to_regions(regions: BTreeMap<RegionId, Vec<SocketAddr>>) -> Routes {
        Routes {
            regions,
            ..Routes::default()
        }
    }

    /// Routes to single nodes only (tests of the send path).
    #[cfg(test)]
    pub(crate) fn to_nodes(nodes: BTreeMap<NodeId, SocketAddr>) -> Routes {
        Routes {
            nodes,
            ..Routes::default()
        }
    }

    /// The addresses a datagram for `destination` goes to; empty if unknown.
    pub(crate) fn resolve(&self, destination: tidings_proto::Destination) -> &[SocketAddr] {
        match destination {
            tidings_proto::Destination::Node(n) => {
                self.nodes.get(&n).map_or(&[][..], std::slice::from_ref)
            }
            tidings_proto::Destination::Region(r) => {
                self.regions.get(&r).map_or(&[][..], Vec::as_slice)
            }
        }
    }

    /// Multicast groups this node must listen to.
    pub(crate) fn joined(&self) -> &[(RegionId, SocketAddrV4)] {
        &self.joined
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::MulticastConfig;
    use tidings_proto::{Destination, TopicId};

    fn setup() -> (Membership, AddressBook) {
        let subs: BTreeMap<NodeId, Vec<TopicId>> = (0..4u32)
            .map(|i| (NodeId(i), if i == 0 { vec![] } else { vec![TopicId(1)] }))
            .collect();
        let m = Membership::from_subscriptions(&subs, 5);
        let mut book = AddressBook::default();
        for i in 0..4u16 {
            book.nodes.insert(
                NodeId(u32::from(i)),
                SocketAddr::from(([127, 0, 0, 1], 9000 + i)),
            );
        }
        book.groups.insert(
            RegionId(1),
            SocketAddrV4::new(std::net::Ipv4Addr::new(239, 1, 2, 3), 7000),
        );
        (m, book)
    }

    #[test]
    fn unicast_fans_out_to_other_members() {
        let (m, book) = setup();
        let routes = Routes::new(NodeId(1), &m, &book, &Transport::Unicast);
        let to: Vec<u16> = routes
            .resolve(Destination::Region(RegionId(1)))
            .iter()
            .map(SocketAddr::port)
            .collect();
        assert_eq!(to, vec![9002, 9003]);
        assert_eq!(routes.resolve(Destination::Node(NodeId(0))).len(), 1);
        assert!(routes.resolve(Destination::Node(NodeId(9))).is_empty());
        assert!(routes.joined().is_empty());
    }

    #[test]
    fn multicast_uses_the_group_and_members_join_it() {
        let (m, book) = setup();
        let t = Transport::Multicast(MulticastConfig::default());
        let member = Routes::new(NodeId(1), &m, &book, &t);
        assert_eq!(member.resolve(Destination::Region(RegionId(1))).len(), 1);
        assert_eq!(member.joined().len(), 1);
        let sender = Routes::new(NodeId(0), &m, &book, &t);
        assert!(sender.joined().is_empty());
    }
}
