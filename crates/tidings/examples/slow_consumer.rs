//! One unread subscription beside a busy one: what it costs the busy topic, and how fast the
//! unread one catches up once it is read again (ADR 35).
//!
//! Three nodes in one process (A embeds the membership service). A subscribes to "fast",
//! published by C, and, in the second run, also to "slow", published by B, which it does not
//! read while B publishes as fast as it may. C then publishes `FAST` (200,000) small messages
//! on "fast" and A reads them: the example prints A's delivery rate of "fast" without the
//! unread subscription (before it, and again after it, each on a topic of its own) and with it
//! beside. Then B stops, A reads "slow", and the example prints how many of B's messages came
//! and at what rate (the recovery), checking they came in order.
//!
//! ```text
//! cargo run --release -p tidings --example slow_consumer
//! ```

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tidings::{Node, Topic};

/// A whole-number setting from the environment, or its default.
fn setting(name: &str, default: u64) -> Result<u64, String> {
    match std::env::var(name) {
        Ok(v) => v.parse().map_err(|e| format!("{name} {v:?}: {e}")),
        Err(_) => Ok(default),
    }
}

/// C publishes `n` messages on `fast` while A reads them; A's rate, messages per second.
fn fast_rate(
    a: &Node,
    c: &Node,
    fast: &Topic<u64>,
    n: u64,
) -> Result<f64, Box<dyn std::error::Error>> {
    let sub = a.subscribe(fast)?;
    let mut publisher = c.publisher(fast)?;
    #[allow(clippy::disallowed_methods)] // an example measures wall time
    let start = Instant::now();
    let writer = std::thread::spawn(move || -> Result<(), tidings::Error> {
        for k in 0..n {
            publisher.publish(&k)?;
        }
        Ok(())
    });
    for k in 0..n {
        let m = sub.recv_timeout(Duration::from_secs(30))?;
        if m.value != k {
            return Err(format!("fast message {k} came as {}", m.value).into());
        }
    }
    let took = start.elapsed();
    writer.join().map_err(|_| "the fast publisher panicked")??;
    Ok(n as f64 / took.as_secs_f64())
}

#[allow(clippy::disallowed_methods)] // an example measures wall time
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n = setting("FAST", 200_000)?;
    let capacity = usize::try_from(setting("CAPACITY", 1024)?)?;
    let a = Node::builder().private_gms().start()?;
    let b = Node::builder().gms(a.gms_addr()).start()?;
    let c = Node::builder().gms(a.gms_addr()).start()?;

    let alone: Topic<u64> = Topic::new("measure/fast-alone")?;
    let without = fast_rate(&a, &c, &alone, n)?;
    println!("fast topic alone:                      {without:>10.0} msgs/s ({n} messages)");

    let slow: Topic<u64> = Topic::new("measure/slow")?;
    let fast: Topic<u64> = Topic::new("measure/fast")?;
    let unread = a.subscription(&slow).capacity(capacity).subscribe()?;
    let mut flooder = b.publisher(&slow)?;
    let stop = Arc::new(AtomicBool::new(false));
    let published = Arc::new(AtomicU64::new(0));
    let (s, p) = (Arc::clone(&stop), Arc::clone(&published));
    let flood = std::thread::spawn(move || {
        let mut k = 0u64;
        while !s.load(Ordering::Acquire) {
            if flooder
                .publish_timeout(&k, Duration::from_millis(20))
                .is_ok()
            {
                k += 1;
                p.store(k, Ordering::Release);
            }
        }
    });
    let waited = Instant::now();
    while unread.bottleneck().since.is_none() {
        if waited.elapsed() > Duration::from_secs(30) {
            return Err("the unread subscription never filled".into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let held_at = published.load(Ordering::Acquire);
    let beside = fast_rate(&a, &c, &fast, n)?;
    let held_end = published.load(Ordering::Acquire);
    println!("fast topic beside an unread one:       {beside:>10.0} msgs/s");
    println!(
        "B's publisher meanwhile:               {held_at} published when the subscription filled, \
         {held_end} after C's run (held by A's window)"
    );

    stop.store(true, Ordering::Release);
    flood.join().map_err(|_| "the flooder panicked")?;
    let total = published.load(Ordering::Acquire);
    let start = Instant::now();
    for k in 0..total {
        let m = unread.recv_timeout(Duration::from_secs(30))?;
        if m.value != k {
            return Err(format!("slow message {k} came as {}", m.value).into());
        }
    }
    let took = start.elapsed();
    println!(
        "recovery: all {total} of B's messages in order in {took:.2?}, {:.0} msgs/s",
        total as f64 / took.as_secs_f64()
    );
    drop(unread);
    let after: Topic<u64> = Topic::new("measure/fast-after")?;
    let again = fast_rate(&a, &c, &after, n)?;
    println!("fast topic alone again:                {again:>10.0} msgs/s");
    println!(
        "beside / alone (mean of both):         {:.1}%",
        200.0 * beside / (without + again)
    );
    let stats = a.stats()?.runtime;
    println!(
        "A: {} holds, {} releases, {:?} held in all, {} held-stream stops in the protocol",
        stats.delivery_stalls,
        stats.topic_releases,
        stats.topic_held_time,
        stats.proto.held_topic_stops
    );
    c.shutdown()?;
    b.shutdown()?;
    a.shutdown()?;
    Ok(())
}
