//! Publishing from async code: under back pressure the task waits, not the thread. Any executor
//! works; this one uses `pollster`, the smallest.

use std::time::Duration;

use tidings::{Bytes, Node, Topic};

const MESSAGES: u32 = 10_000;

fn main() -> Result<(), tidings::Error> {
    let node = Node::builder().private_gms().start()?;
    let peer = Node::builder().gms(node.gms_addr()).start()?;
    let topic = Topic::raw("ticks")?;
    let subscription = peer.subscribe(&topic)?;
    // Read while publishing: an unread subscription would hold the publisher back (back
    // pressure), and stability needs the subscriber.
    let reader = std::thread::spawn(move || {
        let mut received = 0u32;
        while received < MESSAGES && subscription.recv_timeout(Duration::from_secs(10)).is_ok() {
            received += 1;
        }
        received
    });
    let mut publisher = node.publisher(&topic)?;
    pollster::block_on(async {
        let mut last = None;
        for i in 0..MESSAGES {
            let payload = Bytes::from(i.to_be_bytes().to_vec());
            last = Some(publisher.publish_async(&payload).await?);
        }
        if let Some(h) = last {
            publisher.wait_stable_async(h).await?;
        }
        Ok::<(), tidings::Error>(())
    })?;
    let received = reader.join().unwrap_or(0);
    println!("published {MESSAGES} messages, all stable; the subscriber received {received}");
    peer.shutdown()?;
    node.shutdown()?;
    Ok(())
}
