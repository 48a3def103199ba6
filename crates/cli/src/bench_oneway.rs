//! The raw UDP one-way latency of `tidings bench --rate`: what the kernel alone takes to move a
//! datagram of the run's size from one process to another on this host, at the run's rate.
//!
//! The parent sends timestamped datagrams, paced exactly as a benchmark publisher paces its
//! messages, to one receiver process per subscriber (this binary re-executed as the hidden
//! `tidings bench-udp-receiver`), each datagram to every receiver in turn, as tidings' unicast
//! fan-out sends it. A receiver blocks in `recv` like a subscriber's core thread in
//! `epoll_wait`, and subtracts the stamp from its own reading of the clock the benchmark's
//! latencies use ([`shared_clock_ns`], `CLOCK_MONOTONIC`, one clock for every process).

use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::Duration;

use clap::Args;
use hdrhistogram::Histogram;

use super::bench_sys::shared_clock_ns;

/// Largest latency recorded, in microseconds (the benchmark's subscribers use the same bound).
const LATENCY_US_MAX: u64 = 600_000_000;
/// Bytes of a datagram's stamp: send time (shared clock, ns) and flags.
const STAMP_BYTES: usize = 16;
/// Flag: the datagram is in the measured window.
const FLAG_MEASURED: u64 = 1;
/// Flag: the run is over; the receiver reports and exits.
const FLAG_END: u64 = 2;
/// Longest wait for a receiver to start or to report.
const RECEIVER_TIMEOUT: Duration = Duration::from_secs(20);

/// `tidings bench-udp-receiver`: one receiver of the one-way measurement.
#[derive(Args, Debug)]
pub(crate) struct ReceiverArgs {
    /// Address to bind (port chosen by the kernel); printed on stdout.
    #[arg(long)]
    interface: Ipv4Addr,
    /// The receiver exits by itself after this many milliseconds, whatever happens.
    #[arg(long)]
    lifetime_ms: u64,
}

/// What the one-way measurement found, in microseconds.
pub(crate) struct OneWay {
    /// Latencies of the measured window's datagrams at every receiver.
    pub(crate) latency_us: Histogram<u64>,
    /// Datagrams sent in the window, per receiver.
    pub(crate) sent_in_window: u64,
}

/// The receiver process: binds, prints its address, records the latency of every measured
/// datagram until the end marker (or its lifetime), then prints the histogram as one JSON line
/// of `[value, count]` pairs.
pub(crate) fn run_receiver(args: &ReceiverArgs) -> ExitCode {
    match receive(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-udp-receiver: {e}");
            ExitCode::FAILURE
        }
    }
}

fn receive(args: &ReceiverArgs) -> Result<(), String> {
    let socket = UdpSocket::bind((args.interface, 0)).map_err(|e| e.to_string())?;
    let addr = socket.local_addr().map_err(|e| e.to_string())?;
    let mut stdout = std::io::stdout();
    writeln!(stdout, "{addr}")
        .and_then(|()| stdout.flush())
        .map_err(|e| e.to_string())?;
    let mut h =
        Histogram::<u64>::new_with_bounds(1, LATENCY_US_MAX, 3).map_err(|e| e.to_string())?;
    let deadline = shared_clock_ns().saturating_add(args.lifetime_ms.saturating_mul(1_000_000));
    let mut buf = vec![0u8; 65_536];
    loop {
        let left = deadline.saturating_sub(shared_clock_ns());
        if left == 0 {
            break;
        }
        socket
            .set_read_timeout(Some(Duration::from_nanos(left)))
            .map_err(|e| e.to_string())?;
        let n = match socket.recv(&mut buf) {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) =>
            {
                continue
            }
            Err(e) => return Err(e.to_string()),
        };
        let now = shared_clock_ns();
        let Some(stamp) = buf.get(..STAMP_BYTES).filter(|_| n >= STAMP_BYTES) else {
            continue;
        };
        let field = |b: &[u8]| b.iter().fold(0u64, |v, &x| v << 8 | u64::from(x));
        let (sent, flags) = (field(&stamp[..8]), field(&stamp[8..]));
        if flags & FLAG_END != 0 {
            break;
        }
        if flags & FLAG_MEASURED != 0 {
            h.saturating_record((now.saturating_sub(sent) / 1_000).clamp(1, LATENCY_US_MAX));
        }
    }
    let pairs: Vec<(u64, u64)> = h
        .iter_recorded()
        .map(|v| (v.value_iterated_to(), v.count_at_value()))
        .collect();
    let line = serde_json::to_string(&pairs).map_err(|e| e.to_string())?;
    writeln!(stdout, "{line}")
        .and_then(|()| stdout.flush())
        .map_err(|e| e.to_string())
}

/// Receivers, killed and reaped when dropped.
struct Receivers(Vec<(Child, BufReader<std::process::ChildStdout>)>);

impl Drop for Receivers {
    fn drop(&mut self) {
        for (c, _) in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Measures the one-way latency: `receivers` processes, datagrams of `datagram_bytes` at `rate`
/// per second, `warmup` then `duration` measured.
pub(crate) fn measure(
    interface: Ipv4Addr,
    receivers: u32,
    datagram_bytes: usize,
    rate: u64,
    warmup: Duration,
    duration: Duration,
) -> Result<OneWay, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    let lifetime = RECEIVER_TIMEOUT + warmup + duration;
    let mut all = Receivers(Vec::new());
    let mut addrs: Vec<SocketAddr> = Vec::new();
    for _ in 0..receivers {
        let mut child = Command::new(&exe)
            .args([
                "bench-udp-receiver",
                "--interface",
                &interface.to_string(),
                "--lifetime-ms",
                &lifetime.as_millis().to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start a receiver: {e}"))?;
        let Some(stdout) = child.stdout.take() else {
            return Err("receiver stdout missing".to_owned());
        };
        all.0.push((child, BufReader::new(stdout)));
    }
    for (_, out) in &mut all.0 {
        let mut line = String::new();
        out.read_line(&mut line).map_err(|e| e.to_string())?;
        addrs.push(
            line.trim()
                .parse()
                .map_err(|e| format!("receiver said {line:?}: {e}"))?,
        );
    }
    let socket = UdpSocket::bind((interface, 0)).map_err(|e| e.to_string())?;
    let mut datagram = vec![0x5au8; datagram_bytes.max(STAMP_BYTES)];
    let start = shared_clock_ns() + 10_000_000;
    let window_start = start + nanos(warmup);
    let window_end = window_start + nanos(duration);
    let mut sent = 0u64;
    let mut sent_in_window = 0u64;
    loop {
        // Paced as the benchmark's publisher: datagram `sent` is due at start + sent / rate.
        let due = start + sent.saturating_mul(1_000_000_000) / rate.max(1);
        let mut now = shared_clock_ns();
        if now < due {
            std::thread::sleep(Duration::from_nanos(due - now).min(Duration::from_millis(1)));
            continue;
        }
        now = shared_clock_ns();
        if now >= window_end {
            break;
        }
        // In the window by when it was due, not when it went: a sender that fell behind in the
        // warm-up (a loaded host) catches up with datagrams that belong to the warm-up, and
        // counting them would put more than `rate * duration` in the window.
        let measured = due >= window_start;
        datagram[..8].copy_from_slice(&now.to_be_bytes());
        datagram[8..16].copy_from_slice(&u64::from(measured).to_be_bytes());
        for a in &addrs {
            // A full socket buffer loses a datagram; the receivers count what arrives.
            let _ = socket.send_to(&datagram, a);
        }
        sent += 1;
        sent_in_window += u64::from(measured);
    }
    datagram[8..16].copy_from_slice(&FLAG_END.to_be_bytes());
    let mut latency_us =
        Histogram::<u64>::new_with_bounds(1, LATENCY_US_MAX, 3).map_err(|e| e.to_string())?;
    for (i, (_, out)) in all.0.iter_mut().enumerate() {
        // One end marker each: a lost one (loopback loses none unless a buffer is full) ends
        // the receiver at its lifetime instead.
        let mut line = String::new();
        let _ = socket.send_to(&datagram, addrs[i]);
        out.read_line(&mut line)
            .map_err(|e| format!("receiver {i}: {e}"))?;
        let pairs: Vec<(u64, u64)> = serde_json::from_str(line.trim())
            .map_err(|e| format!("receiver {i} said {line:?}: {e}"))?;
        for (v, c) in pairs {
            latency_us
                .record_n(v.clamp(1, LATENCY_US_MAX), c)
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(OneWay {
        latency_us,
        sent_in_window,
    })
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
