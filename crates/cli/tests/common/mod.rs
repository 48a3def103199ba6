//! What the CLI's end-to-end tests share: running the `tidings` binary under a watchdog, and
//! standalone membership services that die with the test.

#![allow(clippy::unwrap_used, dead_code)]

use std::io::Write;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

/// Longest any command of these tests may run before it is killed.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(120);

/// Kills a child that outlives the test (a panic included).
pub(crate) struct Guard(pub(crate) Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `tidings ARGS` with `stdin` (none: an empty, closed stdin), killing it if it outlives
/// [`TIMEOUT`].
pub(crate) fn tidings(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tidings"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(mut s) = child.stdin.take() {
        s.write_all(stdin.as_bytes()).unwrap();
    }
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if rx.recv_timeout(TIMEOUT).is_err() {
            // Still running: kill it by its pid (the bench and the demo kill their own children
            // when their parent goes away, and each child has a lifetime of its own).
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
    });
    let output = child.wait_with_output().unwrap();
    let _ = tx.send(());
    watchdog.join().unwrap();
    output
}

/// Starts a standalone membership service (`tidings gms`) on a free loopback port; returns it
/// (killed when dropped) and its address.
pub(crate) fn standalone_gms() -> (Guard, String) {
    standalone_gms_with(&[])
}

/// [`standalone_gms`] with more arguments for `tidings gms`.
pub(crate) fn standalone_gms_with(args: &[&str]) -> (Guard, String) {
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let gms = Guard(
        Command::new(env!("CARGO_BIN_EXE_tidings"))
            .args(["gms", "--bind", &addr, "--seconds", "100"])
            .args(args)
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    (gms, addr)
}
