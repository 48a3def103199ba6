"""Back pressure: a subscriber that does not read holds its topic, its publisher's window
fills, try_publish raises WouldBlock and publish waits; a slow consumer under Disconnect is
disconnected with SlowConsumerError after the messages queued before."""

import threading
import time

import pytest

import tidings
from conftest import fill_until_would_block

PAYLOAD = bytes(1000)


def test_would_block_then_publish_waits_until_the_reader_drains(pair):
    a, b = pair
    sub = b.subscribe("bp", capacity=64)
    pub = a.publisher("bp")
    published = fill_until_would_block(pub)
    assert published >= 64
    # publish_many waits for room too, and its timeout bounds the whole call.
    with pytest.raises(tidings.TimeoutError):
        pub.publish_many([PAYLOAD] * 10, timeout=0.3)
    assert pub.published_count - published < 10
    published = pub.published_count

    # The reader drains in another thread: the blocking publish (GIL released) gets room.
    received = [0]

    def drain():
        while True:
            try:
                received[0] += len(sub.recv_many(256, timeout=5))
            except tidings.ClosedError:
                return
            if received[0] >= published + 100:
                return

    reader = threading.Thread(target=drain)
    reader.start()
    started = time.monotonic()
    for _ in range(100):
        pub.publish(PAYLOAD, timeout=30)
    assert time.monotonic() - started < 30
    reader.join(30)
    assert not reader.is_alive()
    assert received[0] == published + 100


def test_slow_consumer_is_disconnected_after_its_queued_messages(pair):
    a, b = pair
    sub = b.subscribe("slow", capacity=8, slow_consumer=tidings.Disconnect(max_wait=0.2))
    fast = b.subscribe("slow", capacity=4096)
    pub = a.publisher("slow")
    for i in range(100):
        pub.publish(i.to_bytes(4, "big"), timeout=30)
    # The fast subscriber of the same topic gets everything: the slow one was let go.
    got_fast = []
    while len(got_fast) < 100:
        batch = fast.recv_many(100, timeout=10)
        assert batch, f"the fast subscriber got only {len(got_fast)} of 100"
        got_fast.extend(m.value for m in batch)
    assert got_fast == [i.to_bytes(4, "big") for i in range(100)]
    got_slow = []
    with pytest.raises(tidings.SlowConsumerError) as e:
        while True:
            got_slow.append(sub.recv(timeout=10).value)
    assert got_slow == [i.to_bytes(4, "big") for i in range(len(got_slow))]
    assert 1 <= len(got_slow) <= 8
    assert (e.value.topic, e.value.capacity) == ("slow", 8)
    assert e.value.waited >= 0.2
    assert str(e.value).startswith('subscription to "slow" disconnected: its queue of 8 messages stayed full')
    with pytest.raises(tidings.ClosedError):
        sub.recv(timeout=5)
    assert list(sub) == []


def test_an_unread_subscription_reports_itself_the_bottleneck(pair):
    a, b = pair
    sub = b.subscribe("held", capacity=32)
    assert sub.bottleneck() == tidings.Bottleneck(since=None, times=0)
    pub = a.publisher("held")
    fill_until_would_block(pub)
    state = sub.bottleneck()
    assert state.since is not None and state.since > 0 and state.times == 1
    # Read everything (the held messages refill the queue as it drains).
    while sub.recv_many(64, timeout=0.5):
        pass
    state = sub.bottleneck()
    assert state.since is None and state.times >= 1
    sub.close()
    with pytest.raises(tidings.ClosedError):
        sub.bottleneck()
