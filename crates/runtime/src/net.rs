//! Sockets: setup (buffers, multicast options), batched receive (recvmmsg and GRO through
//! quinn-udp; well-filled buffers handed over without a copy, the rest copied into a compact
//! arena), and batched send (GSO runs) of datagrams pulled from the protocol.

use std::collections::VecDeque;
use std::io::{self, IoSliceMut};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

use bytes::{Bytes, BytesMut};
use quinn_udp::{RecvMeta, UdpSockRef, UdpSocketState};
use socket2::{Domain, Protocol, SockRef, Socket, Type};
use tidings_gms::arena::ARENA_REUSE_PROBES;
use tidings_gms::BlockArena;
use tidings_proto::Destination;

use crate::addr::Routes;
use crate::config::{RuntimeConfig, Transport};

/// Datagrams the kernel dropped on arrival at `sockets` for want of buffer space, summed: the
/// `drops` column of their lines in `/proc/net/udp` and `/proc/net/udp6`, found by socket
/// inode. 0 where that cannot be read (not Linux, no `/proc`).
pub(crate) fn kernel_drops<'a>(sockets: impl Iterator<Item = &'a mio::net::UdpSocket>) -> u64 {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let inodes: Vec<String> = sockets
            .filter_map(|s| {
                let link = std::fs::read_link(format!("/proc/self/fd/{}", s.as_raw_fd())).ok()?;
                let link = link.to_str()?;
                Some(link.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
            })
            .collect();
        if inodes.is_empty() {
            return 0;
        }
        // The kernel writes these tables a page at a time, so a socket opened or closed
        // elsewhere meanwhile can shift a line out of one read or into it twice: each socket's
        // line counts once, and the tables are read again until every socket was seen (a few
        // attempts), so the sum never misses one, never counts one twice, and never goes
        // backwards.
        let mut found: Vec<Option<u64>> = vec![None; inodes.len()];
        for _ in 0..PROC_NET_UDP_READS {
            found.fill(None);
            for table in ["/proc/net/udp", "/proc/net/udp6"] {
                let Ok(text) = std::fs::read_to_string(table) else {
                    continue;
                };
                // Columns: sl local rem st tx:rx tr:when retrnsmt uid timeout inode ref pointer drops
                for line in text.lines().skip(1) {
                    let fields: Vec<&str> = line.split_whitespace().collect();
                    let (Some(inode), Some(d)) = (fields.get(9), fields.last()) else {
                        continue;
                    };
                    if let Some(k) = inodes.iter().position(|i| i == inode) {
                        found[k].get_or_insert(d.parse::<u64>().unwrap_or(0));
                    }
                }
            }
            if found.iter().all(Option::is_some) {
                break;
            }
        }
        found.iter().flatten().sum()
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = sockets;
        0
    }
}

/// Reads of `/proc/net/udp` [`kernel_drops`] makes at most until it has seen every socket.
#[cfg(target_os = "linux")]
const PROC_NET_UDP_READS: usize = 5;

/// Receive buffers per system call: quinn-udp's `recvmmsg` batch.
pub(crate) const RECV_BUFFERS: usize = quinn_udp::BATCH_SIZE;
/// Size of each receive buffer: the largest UDP payload, so that neither a big datagram nor a
/// GRO-coalesced run is ever truncated.
const RECV_BUFFER_BYTES: usize = 64 * 1024;
/// GSO sends may not exceed one IP datagram's worth of payload in total.
const GSO_BYTES_MAX: usize = 65_000;

/// A socket the core thread reads (the unicast socket, which also sends, or a multicast group's).
#[derive(Debug)]
pub(crate) struct NetSocket {
    pub(crate) socket: mio::net::UdpSocket,
    pub(crate) state: UdpSocketState,
    /// Edge-triggered readiness: set by a readable event, cleared when a read would block.
    pub(crate) readable: bool,
    /// The IP TOS byte the socket sends with now (see [`TxBatch::flush`]).
    tos: u8,
}

impl NetSocket {
    /// Sends the following datagrams with `tos` (one `setsockopt` when it changes). Fails only
    /// if the kernel refuses the option; the caller then sends unmarked.
    fn set_tos(&mut self, tos: u8) -> io::Result<()> {
        if self.tos != tos {
            SockRef::from(&self.socket).set_tos(u32::from(tos))?;
            self.tos = tos;
        }
        Ok(())
    }
}

/// Asks for the configured socket buffers. The kernel caps an ordinary request at
/// `net.core.rmem_max` / `wmem_max` (and reports twice what it granted, its bookkeeping
/// overhead); a process allowed to (`CAP_NET_ADMIN`) then gets the configured size anyway
/// (`SO_RCVBUFFORCE`), since a receive buffer smaller than what the senders' windows let arrive
/// at once makes the kernel drop datagrams that must then be repaired. Without the privilege
/// the capped size stays (the granted size is in the runtime's stats).
/// Public so that a benchmark's raw UDP sockets get the buffers a node's sockets get.
pub fn set_socket_buffers(socket: &SockRef<'_>, config: &RuntimeConfig) -> io::Result<()> {
    let (recv, send) = (
        config.socket_recv_buffer_bytes,
        config.socket_send_buffer_bytes,
    );
    socket.set_recv_buffer_size(recv)?;
    if socket.recv_buffer_size()? < recv.saturating_mul(2) {
        let _ = rustix::net::sockopt::set_socket_recv_buffer_size_force(&**socket, recv);
    }
    socket.set_send_buffer_size(send)?;
    if socket.send_buffer_size()? < send.saturating_mul(2) {
        let _ = rustix::net::sockopt::set_socket_send_buffer_size_force(&**socket, send);
    }
    Ok(())
}

/// Prepares the node's unicast socket (which sends everything, multicast included).
pub(crate) fn unicast_socket(
    socket: std::net::UdpSocket,
    config: &RuntimeConfig,
) -> io::Result<NetSocket> {
    {
        let s = SockRef::from(&socket);
        set_socket_buffers(&s, config)?;
        if let Transport::Multicast(m) = &config.transport {
            s.set_multicast_if_v4(&m.interface)?;
            s.set_multicast_loop_v4(m.loopback)?;
            s.set_multicast_ttl_v4(m.ttl)?;
        }
    }
    // Sets non-blocking mode and, where the kernel has it, GRO.
    let state = UdpSocketState::new(UdpSockRef::from(&socket))?;
    Ok(NetSocket {
        socket: mio::net::UdpSocket::from_std(socket),
        state,
        readable: true,
        tos: 0,
    })
}

/// Groups one socket joins at most on Linux: the kernel's default `igmp_max_memberships`, read
/// from `/proc` where it can be (a join past the real limit fails with `ENOBUFS`, and the
/// caller then opens another socket).
pub(crate) fn groups_per_socket() -> usize {
    #[cfg(target_os = "linux")]
    {
        std::fs::read_to_string("/proc/sys/net/ipv4/igmp_max_memberships")
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or(20)
    }
    // Elsewhere a socket is bound to its one group's address (see `group_socket`).
    #[cfg(not(target_os = "linux"))]
    {
        1
    }
}

/// A socket for the multicast groups of `first`'s port, joined with [`join_group`]; true if
/// it can take more groups than `first`.
///
/// On Linux it is bound to the wildcard address with `IP_MULTICAST_ALL` off, so it receives
/// exactly the groups joined on it, up to [`groups_per_socket`] of them: a node in thousands of
/// regions needs a descriptor (and a receive call) per twenty groups, not per group. Where that
/// cannot be (another platform, or the port is taken on a specific address, say by a node's
/// unicast socket on 127.0.0.1 that got the same port) it is bound to `first`'s address and
/// takes that group only.
pub(crate) fn group_socket(
    first: SocketAddrV4,
    config: &RuntimeConfig,
) -> io::Result<(NetSocket, bool)> {
    let socket = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
    // Several nodes on one host listen to the same groups and port.
    socket.set_reuse_address(true)?;
    set_socket_buffers(&SockRef::from(&socket), config)?;
    // Linux would otherwise deliver every group joined by any socket on this port.
    #[cfg(target_os = "linux")]
    socket.set_multicast_all_v4(false)?;
    #[cfg(target_os = "linux")]
    let shared = {
        let any = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, first.port());
        match socket.bind(&SocketAddr::V4(any).into()) {
            Ok(()) => true,
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                socket.bind(&SocketAddr::V4(first).into())?;
                false
            }
            Err(e) => return Err(e),
        }
    };
    #[cfg(not(target_os = "linux"))]
    let shared = {
        socket.bind(&SocketAddr::V4(first).into())?;
        false
    };
    let socket: std::net::UdpSocket = socket.into();
    let state = UdpSocketState::new(UdpSockRef::from(&socket))?;
    let net = NetSocket {
        socket: mio::net::UdpSocket::from_std(socket),
        state,
        readable: true,
        tos: 0,
    };
    Ok((net, shared))
}

/// Joins `group` on `socket` (a [`group_socket`] of the group's port).
pub(crate) fn join_group(
    socket: &NetSocket,
    group: Ipv4Addr,
    interface: Ipv4Addr,
) -> io::Result<()> {
    SockRef::from(&socket.socket).join_multicast_v4(&group, &interface)
}

/// Leaves a group (best effort: closing the socket leaves it too).
pub(crate) fn leave_group(socket: &NetSocket, group: Ipv4Addr, interface: Ipv4Addr) {
    let _ = SockRef::from(&socket.socket).leave_multicast_v4(&group, &interface);
}

/// Least bytes a receive buffer must hold to be handed over whole (see [`RxBuffers`]): a
/// quarter of it, so that what its datagrams pin is at most four times their size.
const SHARE_BUFFER_MIN_BYTES: usize = RECV_BUFFER_BYTES / 4;
/// Most handed-over receive buffers kept for reuse: 512 of 64 KiB, 32 MiB (as the arena).
const SHARED_BUFFERS_RETAINED_MAX: usize = 512;

/// The buffers of `recvmmsg`, and where received datagrams go from there.
///
/// Each datagram is first inspected where it was received, in a buffer that only this holds:
/// the caller may change its bytes (a sealing member opens it in place, `Member::open_received`)
/// and says how many of them to keep, if any. Then a buffer that the kernel filled well (at
/// least [`SHARE_BUFFER_MIN_BYTES`]: a GRO run of datagrams from one sender, the common case at
/// high rates) is handed over whole: its kept datagrams become `Bytes` slices of it, without a
/// copy, and a recycled buffer takes its place. A recycled buffer is one handed over before
/// whose slices have all been dropped (`Bytes::try_into_mut` takes it back, whole and
/// initialised, without allocating); a new one is allocated only when none is free, so a steady
/// flow allocates nothing. A buffer with little in it (datagrams arriving one by one) has its
/// kept datagrams copied into the [`BlockArena`] instead, so that a few small datagrams never
/// pin 64 KiB each.
pub(crate) struct RxBuffers {
    /// `RECV_BUFFERS` buffers of `RECV_BUFFER_BYTES`, initialised, in the shared
    /// representation (freezing and slicing them never allocates).
    buffers: Vec<BytesMut>,
    meta: [RecvMeta; RECV_BUFFERS],
    /// Buffers handed over, oldest first, until every datagram of them is gone.
    handed_over: VecDeque<Bytes>,
    /// The datagrams of the buffer being handed over that are kept: (offset, length, the
    /// caller's tag). Its capacity is kept.
    kept: Vec<(usize, usize, u8)>,
    /// Receive buffers allocated so far (the first `RECV_BUFFERS` included).
    pub(crate) buffers_allocated: u64,
}

impl std::fmt::Debug for RxBuffers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RxBuffers")
            .field("buffers", &self.buffers.len())
            .field("handed_over", &self.handed_over.len())
            .field("buffers_allocated", &self.buffers_allocated)
            .finish_non_exhaustive()
    }
}

/// Kept datagrams a buffer is expected to hold at most (1000-byte datagrams filling it); more
/// only grow [`RxBuffers::kept`] once.
const KEPT_PER_BUFFER: usize = RECV_BUFFER_BYTES / 1000;

impl RxBuffers {
    /// Receive buffers.
    pub(crate) fn new() -> RxBuffers {
        let mut rx = RxBuffers {
            buffers: Vec::with_capacity(RECV_BUFFERS),
            meta: [RecvMeta::default(); RECV_BUFFERS],
            handed_over: VecDeque::with_capacity(SHARED_BUFFERS_RETAINED_MAX),
            kept: Vec::with_capacity(KEPT_PER_BUFFER),
            buffers_allocated: 0,
        };
        for _ in 0..RECV_BUFFERS {
            let buffer = rx.new_buffer();
            rx.buffers.push(buffer);
        }
        rx
    }

    fn new_buffer(&mut self) -> BytesMut {
        self.buffers_allocated += 1;
        let mut buffer = BytesMut::zeroed(RECV_BUFFER_BYTES);
        // An empty split moves the buffer to the shared representation now, once, instead of
        // at its first slice (an allocation each time it came back).
        drop(buffer.split_off(RECV_BUFFER_BYTES));
        buffer
    }

    /// A buffer to receive into: a recycled one if some handed-over buffer is free again.
    fn fresh_buffer(&mut self) -> BytesMut {
        for _ in 0..ARENA_REUSE_PROBES.min(self.handed_over.len()) {
            let Some(buffer) = self.handed_over.pop_front() else {
                break;
            };
            match buffer.try_into_mut() {
                Ok(buffer) if buffer.len() == RECV_BUFFER_BYTES => return buffer,
                Ok(_) => {}
                // Still in use: look at it again after the others.
                Err(buffer) => self.handed_over.push_back(buffer),
            }
        }
        self.new_buffer()
    }

    /// One `recvmmsg` on `socket`: the number of buffers filled (each may hold several
    /// datagrams, see [`RxBuffers::datagrams`]).
    pub(crate) fn recv(&mut self, socket: &NetSocket) -> io::Result<usize> {
        let mut buffers = self.buffers.iter_mut();
        let mut slices: [IoSliceMut<'_>; RECV_BUFFERS] = std::array::from_fn(|_| {
            IoSliceMut::new(buffers.next().map_or(&mut [][..], |b| &mut b[..]))
        });
        socket.state.recv(
            UdpSockRef::from(&socket.socket),
            &mut slices,
            &mut self.meta,
        )
    }

    /// Goes through the datagrams of the `filled` buffers of the last `recv` (GRO buffers are
    /// split at their stride): `inspect` sees each where it was received and may change it in
    /// place; it returns how many of its first bytes to keep and a tag, or `None` to drop it.
    /// `keep` then gets each kept datagram (a slice of its handed-over buffer or a copy in
    /// `arena`, see [`RxBuffers`]) with its tag. Returns the number kept.
    pub(crate) fn datagrams(
        &mut self,
        filled: usize,
        arena: &mut BlockArena,
        mut inspect: impl FnMut(SocketAddr, &mut [u8]) -> Option<(usize, u8)>,
        mut keep: impl FnMut(Bytes, u8),
    ) -> usize {
        let mut count = 0;
        for i in 0..filled.min(RECV_BUFFERS) {
            let meta = self.meta[i];
            let len = meta.len.min(RECV_BUFFER_BYTES);
            if len == 0 {
                // An empty datagram: still one (invalid) arrival.
                if let Some((_, tag)) = inspect(meta.addr, &mut []) {
                    keep(Bytes::new(), tag);
                    count += 1;
                }
                continue;
            }
            let stride = if meta.stride == 0 { len } else { meta.stride };
            self.kept.clear();
            for (k, datagram) in self.buffers[i][..len].chunks_mut(stride).enumerate() {
                let at = k * stride;
                if let Some((kept, tag)) = inspect(meta.addr, datagram) {
                    self.kept.push((at, kept.min(datagram.len()), tag));
                }
            }
            count += self.kept.len();
            if len < SHARE_BUFFER_MIN_BYTES {
                for &(at, kept, tag) in &self.kept {
                    keep(arena.keep(&self.buffers[i][at..at + kept]), tag);
                }
                continue;
            }
            let fresh = self.fresh_buffer();
            let whole = std::mem::replace(&mut self.buffers[i], fresh).freeze();
            for &(at, kept, tag) in &self.kept {
                keep(whole.slice(at..at + kept), tag);
            }
            if self.handed_over.len() >= SHARED_BUFFERS_RETAINED_MAX {
                // Let the oldest go: freed when its last datagram is dropped.
                self.handed_over.pop_front();
            }
            self.handed_over.push_back(whole);
        }
        count
    }

    /// A fresh arena for the datagrams [`RxBuffers::datagrams`] copies.
    pub(crate) fn arena() -> BlockArena {
        BlockArena::default()
    }
}

/// One datagram pulled from the protocol, waiting to be sent.
#[derive(Clone, Copy, Debug)]
struct TxItem {
    offset: usize,
    len: usize,
    destination: Destination,
    /// A congestion control datagram (DCQ or UCA): sent with the control DSCP. Tokens, ACKs
    /// and NAKs are not: a token overtaking the data it announces makes receivers ask again
    /// for what is only queued (ADR 11).
    control: bool,
}

/// What a flush achieved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Flush {
    /// Everything pulled was sent (or dropped with a counted error).
    Done,
    /// The socket buffer is full; the rest waits for a writable event.
    Blocked,
}

/// Counters a flush updates.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TxCounts {
    pub(crate) send_calls: u64,
    pub(crate) datagrams: u64,
    pub(crate) bytes: u64,
    pub(crate) short_sends: u64,
    pub(crate) errors: u64,
    pub(crate) unroutable: u64,
    /// Times the kernel refused to set the TOS byte (the datagrams left unmarked).
    pub(crate) tos_errors: u64,
    pub(crate) control_datagrams: u64,
}

/// Datagrams pulled from the protocol into one contiguous buffer, so that runs to the same
/// destination with the same length are already laid out as a GSO send wants them.
#[derive(Debug)]
pub(crate) struct TxBatch {
    buf: Vec<u8>,
    items: Vec<TxItem>,
    datagram_bytes_max: usize,
    items_max: usize,
    /// Progress through `items`: the first unsent item, and how many of its run's addresses
    /// have been served.
    next_item: usize,
    next_address: usize,
    gso_segments_max: usize,
}

impl TxBatch {
    pub(crate) fn new(
        items_max: usize,
        datagram_bytes_max: usize,
        gso_segments_max: usize,
    ) -> TxBatch {
        TxBatch {
            buf: vec![0; items_max * datagram_bytes_max],
            items: Vec::with_capacity(items_max),
            datagram_bytes_max,
            items_max,
            next_item: 0,
            next_address: 0,
            gso_segments_max: gso_segments_max.max(1),
        }
    }

    /// Whether datagrams are waiting to be sent.
    pub(crate) fn has_pending(&self) -> bool {
        self.next_item < self.items.len()
    }

    /// Pulls up to a batch of datagrams with `pull` (the protocol's `poll_transmit`); returns
    /// how many. Only call when nothing is pending.
    pub(crate) fn fill(
        &mut self,
        mut pull: impl FnMut(&mut [u8]) -> Option<tidings_proto::Transmit>,
    ) -> usize {
        debug_assert!(!self.has_pending());
        self.items.clear();
        self.next_item = 0;
        self.next_address = 0;
        let mut offset = 0;
        while self.items.len() < self.items_max {
            let Some(slot) = self.buf.get_mut(offset..offset + self.datagram_bytes_max) else {
                break;
            };
            let Some(t) = pull(slot) else {
                break;
            };
            // The protocol never writes more than the slot; a longer length would be its bug.
            debug_assert!(t.len <= self.datagram_bytes_max);
            let len = t.len.min(self.datagram_bytes_max);
            self.items.push(TxItem {
                offset,
                len,
                destination: t.destination,
                control: t.priority == tidings_proto::Priority::Control
                    && slot
                        .get(..len)
                        .and_then(tidings_wire::peek_kind)
                        .is_some_and(|kind| {
                            matches!(kind, tidings_wire::Kind::Dcq | tidings_wire::Kind::Uca)
                        }),
            });
            offset += len;
        }
        self.items.len()
    }

    /// Sends what is pending: runs of consecutive datagrams with the same destination and
    /// length (the last of a run may be shorter) leave in one GSO `sendmsg` per address.
    /// DCQs and UCAs leave with the IP TOS byte `control_tos` (DSCP in its upper six bits;
    /// 0 leaves them unmarked), everything else with 0; runs never mix the two, and the socket
    /// option changes only where the kind does (a DCQ every few hundred milliseconds per
    /// sender, UCAs only under congestion).
    pub(crate) fn flush(
        &mut self,
        socket: &mut NetSocket,
        routes: &Routes,
        (gso, control_tos): (bool, u8),
        counts: &mut TxCounts,
    ) -> Flush {
        while let Some(first) = self.items.get(self.next_item).copied() {
            let tos = if first.control { control_tos } else { 0 };
            if socket.set_tos(tos).is_err() {
                counts.tos_errors += 1;
            }
            // quinn-udp gives every IPv4 send an IP_TOS control message carrying only the ECN
            // bits, which overrides the socket's TOS: marked datagrams leave one by one through
            // a plain `sendto` instead (they are few).
            let marked = tos != 0;
            let segments_max = if marked {
                1
            } else if gso {
                self.gso_segments_max
                    .min(socket.state.max_gso_segments())
                    .min(GSO_BYTES_MAX / first.len.max(1))
                    .max(1)
            } else {
                1
            };
            let addresses = routes.resolve(first.destination);
            let mut run = 1;
            let mut run_bytes = first.len;
            while run < segments_max {
                let Some(next) = self.items.get(self.next_item + run) else {
                    break;
                };
                // Datagrams of different regions whose members are the same nodes (or that
                // share a multicast group) go to the same addresses: one run. A node sending
                // on many topics of one subscriber, a region each, made a `sendmsg` per
                // datagram without this.
                if (next.destination != first.destination
                    && routes.resolve(next.destination) != addresses)
                    || next.len > first.len
                    || next.control != first.control
                {
                    break;
                }
                run += 1;
                run_bytes += next.len;
                if next.len < first.len {
                    // A shorter datagram ends a GSO run.
                    break;
                }
            }
            let contents = &self.buf[first.offset..first.offset + run_bytes];
            if addresses.is_empty() {
                counts.unroutable += run as u64;
            }
            while let Some(&address) = addresses.get(self.next_address) {
                let transmit = quinn_udp::Transmit {
                    destination: address,
                    ecn: None,
                    contents,
                    segment_size: (run > 1).then_some(first.len),
                    src_ip: None,
                };
                counts.send_calls += 1;
                let sent = if marked {
                    socket.socket.send_to(contents, address).map(drop)
                } else {
                    socket
                        .state
                        .try_send(UdpSockRef::from(&socket.socket), &transmit)
                };
                match sent {
                    Ok(()) => {
                        counts.datagrams += run as u64;
                        if first.control {
                            counts.control_datagrams += run as u64;
                        }
                        counts.bytes += run_bytes as u64;
                        self.next_address += 1;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        counts.short_sends += 1;
                        return Flush::Blocked;
                    }
                    Err(_) if run > 1 && socket.state.max_gso_segments() <= 1 => {
                        // The kernel refused GSO on this path; quinn-udp turned it off for
                        // the socket. Send this run again, one datagram at a time.
                        return self.flush(socket, routes, (gso, control_tos), counts);
                    }
                    Err(_) => {
                        // Dropped; the protocol recovers it like a loss.
                        counts.errors += run as u64;
                        self.next_address += 1;
                    }
                }
            }
            self.next_item += run;
            self.next_address = 0;
        }
        Flush::Done
    }
}

#[cfg(test)]
mod rx_tests {
    use super::*;

    /// A receiving socket of the runtime, and a plain sender aimed at it.
    fn pair() -> (NetSocket, std::net::UdpSocket) {
        let receiver = unicast_socket(
            std::net::UdpSocket::bind("127.0.0.1:0").unwrap(),
            &RuntimeConfig::default(),
        )
        .unwrap();
        let sender = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        sender
            .connect(receiver.socket.local_addr().unwrap())
            .unwrap();
        (receiver, sender)
    }

    /// Receives until `count` datagrams came (the socket is non-blocking), keeping each as
    /// the core does; `open` stands for the member's opening in place (it may change the bytes
    /// and returns how many to keep).
    #[allow(clippy::disallowed_methods)] // a test's bound on its wait, in wall time
    fn receive(
        rx: &mut RxBuffers,
        arena: &mut BlockArena,
        socket: &NetSocket,
        count: usize,
        open: fn(&mut [u8]) -> usize,
    ) -> Vec<Bytes> {
        let mut kept = Vec::new();
        let mut seen = 0;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while seen < count {
            assert!(std::time::Instant::now() < deadline, "{seen} of {count}");
            match rx.recv(socket) {
                Ok(filled) => {
                    rx.datagrams(
                        filled,
                        arena,
                        |_, d| {
                            seen += 1;
                            Some((open(d), 7))
                        },
                        |d, tag| {
                            assert_eq!(tag, 7);
                            kept.push(d);
                        },
                    );
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                Err(e) => panic!("{e}"),
            }
        }
        kept
    }

    /// Keeps a datagram as it came.
    fn as_is(d: &mut [u8]) -> usize {
        d.len()
    }

    /// Changes a datagram in place and keeps its first half, as opening does.
    fn halve(d: &mut [u8]) -> usize {
        for b in d.iter_mut() {
            *b = b.wrapping_add(1);
        }
        d.len() / 2
    }

    /// Full buffers are handed over whole and come back once their slices are dropped; a
    /// datagram held pins its buffer and is never overwritten.
    #[test]
    fn full_buffers_are_handed_over_and_come_back_once_their_slices_are_gone() {
        let (socket, sender) = pair();
        let mut rx = RxBuffers::new();
        let mut arena = RxBuffers::arena();
        let start = rx.buffers_allocated;
        let big = |k: u8| vec![k; 20_000];
        // Each datagram fills a buffer past the threshold: handed over, no copy in the arena.
        for round in 0..50u8 {
            sender.send(&big(round)).unwrap();
            let kept = receive(&mut rx, &mut arena, &socket, 1, as_is);
            assert_eq!(&kept[0][..], &big(round)[..]);
        }
        assert!(
            rx.buffers_allocated <= start + ARENA_REUSE_PROBES as u64,
            "dropped datagrams give their buffers back: {rx:?}"
        );
        assert_eq!(
            arena.blocks_allocated(),
            1,
            "nothing went through the arena"
        );
        sender.send(&big(7)).unwrap();
        let pinned = receive(&mut rx, &mut arena, &socket, 1, as_is);
        for round in 0..50u8 {
            sender.send(&big(round)).unwrap();
            receive(&mut rx, &mut arena, &socket, 1, as_is);
        }
        assert_eq!(
            &pinned[0][..],
            &big(7)[..],
            "a held datagram is never overwritten"
        );
    }

    /// What the inspection wrote in place is what is kept, in a handed-over buffer or in the
    /// arena alike.
    #[test]
    fn datagrams_are_kept_as_changed_in_place() {
        let (socket, sender) = pair();
        let mut rx = RxBuffers::new();
        let mut arena = RxBuffers::arena();
        for size in [20_000usize, 1000] {
            sender.send(&vec![3u8; size]).unwrap();
            let kept = receive(&mut rx, &mut arena, &socket, 1, halve);
            assert_eq!(&kept[0][..], &vec![4u8; size / 2][..], "{size}");
        }
    }

    #[test]
    fn small_datagrams_are_copied_into_the_arena() {
        let (socket, sender) = pair();
        let mut rx = RxBuffers::new();
        let mut arena = RxBuffers::arena();
        let start = rx.buffers_allocated;
        for k in 0..10u8 {
            sender.send(&[k; 1000]).unwrap();
        }
        let kept = receive(&mut rx, &mut arena, &socket, 10, as_is);
        for (k, d) in kept.iter().enumerate() {
            assert_eq!(&d[..], &[k as u8; 1000][..]);
        }
        assert_eq!(rx.buffers_allocated, start, "no buffer handed over");
    }
}

#[cfg(test)]
mod tx_tests {
    use super::*;
    use tidings_proto::{Destination, NodeId, Priority, Transmit};
    use tidings_wire::{Header, Kind, ViewId};

    /// A datagram as the protocol would hand it out: its class and what writes it.
    type Item = (Priority, fn(&mut [u8]) -> usize);

    /// What the protocol would hand out: the next item, written into the slot.
    fn pull(kinds: &mut std::vec::IntoIter<Item>, buf: &mut [u8]) -> Option<Transmit> {
        let (priority, write) = kinds.next()?;
        Some(Transmit {
            destination: Destination::Node(NodeId(1)),
            len: write(buf),
            priority,
        })
    }

    const HEADER: Header = Header {
        kind: Kind::Dcq,
        incarnation: 0,
        region: tidings_proto::RegionId(0),
        view: ViewId(1),
        sender: NodeId(0),
    };

    fn dcq(buf: &mut [u8]) -> usize {
        tidings_wire::write_dcq(buf, &HEADER, 7, 1000).unwrap()
    }

    fn ack(buf: &mut [u8]) -> usize {
        tidings_wire::write_ack(buf, &HEADER, NodeId(0), 7).unwrap()
    }

    /// Not a packet at all, as long as a DCQ.
    fn data(buf: &mut [u8]) -> usize {
        let len = dcq(buf);
        buf[..len].fill(0xda);
        len
    }

    #[test]
    fn dcqs_and_ucas_leave_marked_in_runs_of_their_own() {
        let receiver = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        receiver
            .set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let routes = Routes::to_nodes([(NodeId(1), receiver.local_addr().unwrap())].into());
        let mut socket = unicast_socket(
            std::net::UdpSocket::bind("127.0.0.1:0").unwrap(),
            &RuntimeConfig::default(),
        )
        .unwrap();
        let tos_now = |s: &NetSocket| SockRef::from(&s.socket).tos().unwrap();
        let ef = 46 << 2;
        let mut batch = TxBatch::new(8, 100, 8);
        let mut send = |socket: &mut NetSocket, items: Vec<Item>, tos: u8| {
            let mut items = items.into_iter();
            batch.fill(|buf| pull(&mut items, buf));
            let mut counts = TxCounts::default();
            assert_eq!(
                batch.flush(socket, &routes, (true, tos), &mut counts),
                Flush::Done
            );
            assert_eq!(counts.tos_errors, 0);
            counts
        };

        // Data, a DCQ, data, all of one length and destination: three sends, not one GSO run.
        let counts = send(
            &mut socket,
            vec![
                (Priority::Data, data),
                (Priority::Control, dcq),
                (Priority::Data, data),
            ],
            ef,
        );
        assert_eq!(
            (
                counts.send_calls,
                counts.datagrams,
                counts.control_datagrams
            ),
            (3, 3, 1)
        );
        assert_eq!(tos_now(&socket), 0, "data leaves unmarked");
        let mut buf = [0u8; 64];
        for first in [0xda, 0x54, 0xda] {
            receiver.recv(&mut buf).unwrap();
            assert_eq!(buf[0], first);
        }

        // A DCQ alone: the socket is marked while it leaves (and stays so until the next
        // datagram of another kind); an ACK, control for the protocol, is not; with no DSCP
        // configured nothing is.
        send(&mut socket, vec![(Priority::Control, dcq)], ef);
        assert_eq!(tos_now(&socket), u32::from(ef));
        let counts = send(&mut socket, vec![(Priority::Control, ack)], ef);
        assert_eq!((counts.datagrams, counts.control_datagrams), (1, 0));
        assert_eq!(tos_now(&socket), 0);
        send(&mut socket, vec![(Priority::Control, dcq)], 0);
        assert_eq!(tos_now(&socket), 0);
    }
}

#[cfg(test)]
mod tx_run_tests {
    use super::*;
    use tidings_proto::{Destination, Priority, RegionId, Transmit};

    /// Datagrams of regions with the same members leave in one GSO run: a node sending on
    /// many topics of one subscriber, a region each, made a `sendmsg` per datagram before.
    #[test]
    fn regions_with_the_same_addresses_share_a_run() {
        let a = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        for r in [&a, &b] {
            r.set_read_timeout(Some(std::time::Duration::from_secs(5)))
                .unwrap();
        }
        let (to_a, to_b) = (a.local_addr().unwrap(), b.local_addr().unwrap());
        let routes = Routes::to_regions(
            [
                (RegionId(1), vec![to_a]),
                (RegionId(2), vec![to_a]),
                (RegionId(3), vec![to_b]),
                (RegionId(4), vec![to_a]),
            ]
            .into(),
        );
        let mut socket = unicast_socket(
            std::net::UdpSocket::bind("127.0.0.1:0").unwrap(),
            &RuntimeConfig::default(),
        )
        .unwrap();
        let mut batch = TxBatch::new(8, 100, 8);
        let mut regions = [1u32, 2, 3, 4].into_iter();
        batch.fill(|buf| {
            let r = regions.next()?;
            buf[..100].fill(r as u8);
            Some(Transmit {
                destination: Destination::Region(RegionId(r)),
                len: 100,
                priority: Priority::Data,
            })
        });
        let mut counts = TxCounts::default();
        assert_eq!(
            batch.flush(&mut socket, &routes, (true, 0), &mut counts),
            Flush::Done
        );
        // Regions 1 and 2 in one run (one call where the kernel has GSO), 3, then 4: region 4
        // goes to A again but after B's datagram, and runs keep the protocol's order.
        let gso = socket.state.max_gso_segments() > 1;
        assert_eq!(counts.send_calls, if gso { 3 } else { 4 });
        assert_eq!(counts.datagrams, 4);
        let mut buf = [0u8; 200];
        for first in [1u8, 2, 4] {
            let n = a.recv(&mut buf).unwrap();
            assert_eq!((n, buf[0]), (100, first));
        }
        let n = b.recv(&mut buf).unwrap();
        assert_eq!((n, buf[0]), (100, 3));
    }
}

#[cfg(all(test, target_os = "linux"))]
mod group_socket_tests {
    use super::*;

    /// Groups of a port share a wildcard-bound socket, unless the port is taken on a specific
    /// address (a node's unicast socket that happens to have the pool's port): then the socket
    /// is bound to its one group, as before sharing.
    #[test]
    fn a_group_socket_is_shared_unless_its_port_is_taken() {
        let config = RuntimeConfig::default();
        let free = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = free.local_addr().unwrap().port();
        drop(free);
        let group = SocketAddrV4::new(Ipv4Addr::new(239, 255, 77, 1), port);
        let (socket, shared) = group_socket(group, &config).unwrap();
        assert!(shared, "the wildcard takes several groups");
        join_group(&socket, *group.ip(), Ipv4Addr::LOCALHOST).unwrap();
        join_group(&socket, Ipv4Addr::new(239, 255, 77, 2), Ipv4Addr::LOCALHOST).unwrap();
        drop(socket);

        let taken = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = taken.local_addr().unwrap().port();
        let group = SocketAddrV4::new(Ipv4Addr::new(239, 255, 77, 3), port);
        let (socket, shared) = group_socket(group, &config).unwrap();
        assert!(!shared, "bound to its one group beside 127.0.0.1:{port}");
        join_group(&socket, *group.ip(), Ipv4Addr::LOCALHOST).unwrap();
    }
}

#[cfg(all(test, target_os = "linux"))]
mod kernel_drops_tests {
    use super::kernel_drops;

    /// Datagrams sent to a socket nobody reads, past its (small) receive buffer, are counted as
    /// the kernel's drops of that socket, and not of another.
    #[test]
    fn datagrams_past_a_full_receive_buffer_are_counted() {
        let full = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        socket2::SockRef::from(&full)
            .set_recv_buffer_size(4096)
            .unwrap();
        let other = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let sender = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = full.local_addr().unwrap();
        for _ in 0..200 {
            let _ = sender.send_to(&[7u8; 1000], to);
        }
        let (full, other) = (
            mio::net::UdpSocket::from_std(full),
            mio::net::UdpSocket::from_std(other),
        );
        let drops = kernel_drops(std::iter::once(&full));
        assert!(
            drops > 100,
            "{drops} drops counted of 200 datagrams into 4 KiB"
        );
        assert_eq!(kernel_drops(std::iter::once(&other)), 0);
        assert_eq!(kernel_drops([&full, &other].into_iter()), drops);
    }
}
