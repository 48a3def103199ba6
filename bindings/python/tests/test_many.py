"""Subscribing to many topics at once (``Node.subscribe_many``, callbacks on the delivery
workers) and the per-subscription scheduler share (``set_share``)."""

import threading
import time

import pytest

import tidings


def wait_for(predicate, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_subscribe_many_delivers_each_topic_in_order_to_its_callback(node):
    names = [f"many-{i}" for i in range(200)]
    typed = tidings.Topic("many-json", tidings.JSON)
    got, lock = {}, threading.Lock()

    def on_message(m):
        with lock:
            got.setdefault(m.topic, []).append(m.value)

    subs = node.subscribe_many(names + [typed], on_message)
    assert [s.name for s in subs] == names + ["many-json"]
    assert all(isinstance(s, tidings.WorkerSubscription) for s in subs)
    assert len({s.topic_id for s in subs}) == len(subs)
    pubs = node.publishers(names[:5] + [typed])
    for p in pubs[:5]:
        for i in range(100):
            p.publish(f"{p.name}:{i}".encode())
    pubs[-1].publish_many({"i": i} for i in range(100))
    assert wait_for(lambda: sum(map(len, list(got.values()))) == 600), got.keys()
    for n in names[:5]:
        assert got[n] == [f"{n}:{i}".encode() for i in range(100)]
    assert got["many-json"] == [{"i": i} for i in range(100)]
    for s in subs:
        s.close()
    assert all(s.closed for s in subs)


def test_subscribe_many_one_callback_per_topic_and_errors_to_on_error(node):
    topics = [tidings.Topic("per-a", tidings.STR), tidings.Topic("per-b", tidings.JSON)]
    a, b, errors = [], [], []

    def failing(m):
        if m.value == {"fail": True}:
            raise ValueError("the callback failed")
        b.append(m.value)

    subs = node.subscribe_many(topics, [a.append, failing], on_error=errors.append)
    node.publisher(topics[0]).publish("x")
    pub_b = node.publisher(topics[1])
    pub_b.publish({"fail": True})
    node.publisher("per-b").publish(b"\x00 not json")
    pub_b.publish({"ok": 1})
    assert wait_for(lambda: len(a) == 1 and len(b) == 1 and len(errors) == 2), (a, b, errors)
    assert [m.value for m in a] == ["x"] and b == [{"ok": 1}]
    assert isinstance(errors[0], ValueError) and str(errors[0]) == "the callback failed"
    assert isinstance(errors[1], tidings.DecodeError) and errors[1].topic == "per-b"

    # Closed, a subscription gets nothing more; its neighbour goes on.
    subs[0].close()
    subs[0].close()
    node.publisher(topics[0]).publish("after close")
    pub_b.publish({"ok": 2})
    assert wait_for(lambda: len(b) == 2)
    time.sleep(0.2)
    assert [m.value for m in a] == ["x"]
    with pytest.raises(tidings.ClosedError):
        subs[0].set_share(0.5)


def test_subscribe_many_refuses_bad_arguments_and_keeps_none(node):
    with pytest.raises(TypeError, match="2 callables for 3 topics"):
        node.subscribe_many(["x", "y", "z"], [print, print])
    with pytest.raises(TypeError, match="is not callable"):
        node.subscribe_many(["x"], [None])
    with pytest.raises(tidings.TopicNameError):
        node.subscribe_many(["ok", "x" * (tidings.TOPIC_NAME_BYTES_MAX + 1)], print)
    assert node.subscribe_many([], print) == []
    node.close()
    with pytest.raises(tidings.ClosedError):
        node.subscribe_many(["late"], print)


def test_set_share_takes_shares_in_the_open_unit_interval(node):
    sub = node.subscribe("share")
    cbs = node.subscribe("share-cb", callback=lambda m: None)
    (worker,) = node.subscribe_many(["share-w"], lambda m: None)
    for s in (sub, cbs, worker):
        s.set_share(0.25)
        s.set_share(1.0)
        for bad in (0.0, -1.0, 1.5, float("nan")):
            with pytest.raises(tidings.ConfigError, match=r"share .* is not in \(0, 1\]"):
                s.set_share(bad)
    # A share does not change what is delivered.
    sub.set_share(0.1)
    node.publisher("share").publish(b"still delivered")
    assert sub.recv(timeout=10).value == b"still delivered"
    sub.close()
    with pytest.raises(tidings.ClosedError):
        sub.set_share(0.5)
    cbs.close()
    worker.close()
