//! Network namespaces joined by a bridge, and child processes of the test binary running inside
//! them, for the tests that need real links between nodes (`netns.rs`, `netns_bottleneck.rs`).
//!
//! Each node gets a namespace of its own with one veth link (`veth0`, address
//! [`address`]`(i)`); the other end (`p{i}`) is a port of bridge `br0` in a hub namespace. Test
//! hosts are deleted on drop, also when the test panics, and names carry the pid and a run
//! number, so concurrent tests and runs do not collide. Where namespaces cannot be created the
//! test panics with a plain message: it never passes without having run.

#![allow(clippy::unwrap_used, dead_code)]

use std::io::{BufRead, BufReader};
use std::net::Ipv4Addr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::Duration;

/// Node `i`'s address on the bridge: 198.18.0.(i + 1), in the benchmarking range 198.18.0.0/15.
pub(crate) fn address(i: u32) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 0, u8::try_from(i + 1).unwrap())
}

/// Everyone's addresses for nodes `0..=last`, each in a namespace of its own at
/// [`address`]`(i)` and `port`; one multicast group per region of `membership`, at
/// `239.255.{group_block}.k` and the ports after `port`.
pub(crate) fn address_book(
    membership: &tidings_proto::Membership,
    last: u32,
    port: u16,
    group_block: u8,
) -> tidings_runtime::AddressBook {
    let mut book = tidings_runtime::AddressBook::default();
    for i in 0..=last {
        book.nodes.insert(
            tidings_proto::NodeId(i),
            std::net::SocketAddr::from((address(i), port)),
        );
    }
    for (k, &region) in membership.regions.keys().enumerate() {
        let group = Ipv4Addr::new(239, 255, group_block, u8::try_from(k + 1).unwrap());
        let group_port = port + 1 + u16::try_from(k).unwrap();
        book.groups
            .insert(region, std::net::SocketAddrV4::new(group, group_port));
    }
    book
}

/// Runs `program ARGS`; the error says what failed. Returns standard output.
pub(crate) fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run `{program}` (iproute2): {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "`{program} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Runs `ip ARGS`; the error says what failed.
pub(crate) fn ip(args: &[&str]) -> Result<(), String> {
    run("ip", args).map(drop)
}

/// Run number within this process: two tests of one binary may build namespaces at once.
static RUNS: AtomicU32 = AtomicU32::new(0);

/// The namespaces of one run: a hub holding the bridge, and one per node. Deleted on drop, also
/// when the test panics.
pub(crate) struct Namespaces {
    /// The namespace of the bridge and of the node links' bridge-side ends (`p{i}`).
    pub(crate) hub: String,
    /// One namespace per node, in node order.
    pub(crate) nodes: Vec<String>,
}

impl Namespaces {
    /// Creates the hub, its bridge and `nodes` node namespaces, each linked to the bridge.
    /// `what` names what the test would have tested, for the message when namespaces are
    /// unavailable.
    pub(crate) fn create(nodes: u32, what: &str) -> Namespaces {
        remove_stale();
        let pid = std::process::id();
        let run = RUNS.fetch_add(1, Ordering::Relaxed);
        let prefix = format!("tdg{pid}r{run}");
        let hub = format!("{prefix}hub");
        if let Err(e) = ip(&["netns", "add", &hub]) {
            panic!(
                "network namespaces are unavailable here, so {what} was NOT tested (this test \
                 needs root and iproute2): {e}"
            );
        }
        // From here on, dropping `ns` (also by a panic) deletes what was created.
        let mut ns = Namespaces {
            hub,
            nodes: Vec::new(),
        };
        let setup = |ns: &mut Namespaces| -> Result<(), String> {
            // Without an IGMP querier, snooping could prune a group; flood multicast instead.
            ip(&[
                "-n",
                &ns.hub,
                "link",
                "add",
                "br0",
                "type",
                "bridge",
                "mcast_snooping",
                "0",
            ])?;
            ip(&["-n", &ns.hub, "link", "set", "br0", "up"])?;
            for i in 0..nodes {
                let name = format!("{prefix}n{i}");
                ip(&["netns", "add", &name])?;
                ns.nodes.push(name.clone());
                let port = Namespaces::port(i);
                // veth0 in the node's namespace, its peer on the hub's bridge.
                ip(&[
                    "-n", &name, "link", "add", "veth0", "type", "veth", "peer", "name", &port,
                    "netns", &ns.hub,
                ])?;
                ip(&["-n", &ns.hub, "link", "set", &port, "master", "br0"])?;
                ip(&["-n", &ns.hub, "link", "set", &port, "up"])?;
                let cidr = format!("{}/15", address(i));
                ip(&["-n", &name, "addr", "add", &cidr, "dev", "veth0"])?;
                ip(&["-n", &name, "link", "set", "veth0", "up"])?;
                ip(&["-n", &name, "link", "set", "lo", "up"])?;
                ip(&["-n", &name, "route", "add", "224.0.0.0/4", "dev", "veth0"])?;
            }
            Ok(())
        };
        if let Err(e) = setup(&mut ns) {
            // `ns` is dropped by the unwind and deletes what was created.
            panic!("setting up the namespaces and the bridge failed: {e}");
        }
        ns
    }

    /// The bridge port (in the hub) of node `i`'s link: what leaves it goes to node `i`, so a
    /// qdisc on it limits node `i`'s downlink.
    pub(crate) fn port(i: u32) -> String {
        format!("p{i}")
    }
}

/// Deletes namespaces left by runs of these tests that were killed before their guard ran (their
/// pid, in the name, is gone).
fn remove_stale() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some(rest) = name.strip_prefix("tdg") else {
            continue;
        };
        let pid: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let suffix = &rest[pid.len()..];
        let ours = suffix.ends_with("hub")
            || suffix
                .rsplit_once('n')
                .is_some_and(|(_, i)| !i.is_empty() && i.chars().all(|c| c.is_ascii_digit()));
        if !pid.is_empty() && ours && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "del", name]);
        }
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        // Deleting a namespace deletes its end of each veth pair, and with it the peer and any
        // qdisc on either end; the bridge goes with the hub.
        for name in self.nodes.iter().chain(std::iter::once(&self.hub)) {
            if let Err(e) = ip(&["netns", "del", name]) {
                eprintln!("cleanup: {e}");
            }
        }
    }
}

/// The child processes; killed and reaped on drop (before the namespaces are deleted: a live
/// process would keep its namespace alive).
pub(crate) struct Children(pub(crate) Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            drop(c.stdin.take());
        }
        let deadline = tidings_runtime::now() + Duration::from_secs(10);
        for c in &mut self.0 {
            while matches!(c.try_wait(), Ok(None)) && tidings_runtime::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts this test binary in `namespace`, running only `test`, with the environment variable
/// `child_var` set to `value` (which tells the test it is a child, and which node it is). Lines
/// it prints that contain `CHILD-` are sent to `lines`, from `CHILD-` on.
pub(crate) fn spawn_in(
    namespace: &str,
    test: &str,
    (child_var, value): (&str, &str),
    lines: mpsc::Sender<String>,
) -> Child {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new("ip")
        .args(["netns", "exec", namespace])
        .arg(exe)
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(child_var, value)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            // libtest prints "test NAME ... " without a newline before the output.
            if let Some(at) = line.find("CHILD-") {
                let _ = lines.send(line[at..].to_owned());
            }
        }
    });
    child
}

/// Reads stdin lines in a thread; `None` when stdin closes (the parent is done or gone).
pub(crate) fn stdin_lines() -> mpsc::Receiver<Option<String>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines().map_while(Result::ok) {
            if tx.send(Some(line)).is_err() {
                return;
            }
        }
        let _ = tx.send(None);
    });
    rx
}

/// The number after `name ` in a result line.
pub(crate) fn field(line: &str, name: &str) -> u64 {
    let at = line.find(name).unwrap() + name.len();
    line[at..]
        .split(|c: char| !c.is_ascii_digit() && c != ' ')
        .next()
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}
