//! `Subscription::set_share`: an iterator subscription's share of the delivery workers' time.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use tidings::{Bytes, Node, RequestError, Topic};

#[test]
fn an_iterator_subscription_takes_a_share_in_the_open_unit_interval() {
    let node = Node::builder().private_gms().start().unwrap();
    let topic = Topic::raw("share").unwrap();
    let sub = node.subscribe(&topic).unwrap();
    sub.set_share(0.25).unwrap();
    sub.set_share(1.0).unwrap();
    for bad in [0.0, -0.5, 1.5, f64::NAN] {
        match sub.set_share(bad) {
            Err(RequestError::Config(why)) => assert!(why.contains("is not in (0, 1]"), "{why}"),
            other => panic!("share {bad}: {other:?}"),
        }
    }
    sub.set_share(0.1).unwrap();
    let mut publisher = node.publisher(&topic).unwrap();
    publisher
        .publish(&Bytes::from_static(b"still delivered"))
        .unwrap();
    let message = sub.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(&message.value[..], b"still delivered");
}
