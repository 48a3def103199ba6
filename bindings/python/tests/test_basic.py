"""Publishing and receiving within one process: codecs, errors, iterators, callbacks."""

import threading
import time

import pytest

import tidings


def test_bytes_in_order_with_origin_and_topic(node):
    sub = node.subscribe("numbers")
    pub = node.publisher("numbers")
    sent = [i.to_bytes(4, "big") * 25 for i in range(2000)]
    for payload in sent:
        pub.publish(payload)
    got = []
    while len(got) < len(sent):
        batch = sub.recv_many(512, timeout=10)
        assert batch, f"only {len(got)} of {len(sent)} messages came"
        got.extend(batch)
    assert [m.value for m in got] == sent
    assert {m.origin for m in got} == {node.id}
    assert {m.topic for m in got} == {"numbers"}
    assert {m.topic_id for m in got} == {sub.topic_id} == {pub.topic_id}
    assert pub.published_count == len(sent)


@pytest.mark.parametrize(
    "codec,values",
    [
        (tidings.STR, ["", "hello", "ünïcødé ✓"]),
        (tidings.JSON, [{"a": 1, "b": [1, 2.5, None]}, "text", 3, [True, False]]),
        (tidings.MSGPACK, [{"a": 1, "b": b"raw"}, [1, 2, 3], "x", None]),
    ],
    ids=["str", "json", "msgpack"],
)
def test_codecs_round_trip(node, codec, values):
    if codec is tidings.MSGPACK:
        pytest.importorskip("msgpack")
    topic = tidings.Topic("typed", codec)
    sub = node.subscribe(topic)
    pub = node.publisher(topic)
    for v in values:
        pub.publish(v)
    assert [sub.recv(timeout=10).value for _ in values] == values


def test_custom_codec(node):
    class Point:
        def __init__(self, x, y):
            self.x, self.y = x, y

    class PointCodec:
        def encode(self, p):
            return p.x.to_bytes(2, "big") + p.y.to_bytes(2, "big")

        def decode(self, data):
            return Point(int.from_bytes(data[:2], "big"), int.from_bytes(data[2:], "big"))

    assert isinstance(PointCodec(), tidings.Codec)
    topic = tidings.Topic("points", PointCodec())
    sub = node.subscribe(topic)
    node.publisher(topic).publish(Point(3, 4))
    p = sub.recv(timeout=10).value
    assert (p.x, p.y) == (3, 4)


def test_publishing_the_wrong_type_raises_encode_error(node):
    text = node.publisher(tidings.Topic("text", tidings.STR))
    with pytest.raises(tidings.EncodeError, match=r"^could not encode the message: a str topic takes str, not bytes$") as e:
        text.publish(b"bytes")
    assert isinstance(e.value.__cause__, TypeError)
    raw = node.publisher("raw")
    with pytest.raises(tidings.EncodeError, match="a bytes topic takes bytes or bytearray, not str"):
        raw.publish("text")
    with pytest.raises(tidings.EncodeError):
        node.publisher(tidings.Topic("json", tidings.JSON)).publish(object())
    raw.publish(bytearray(b"a bytearray is bytes"))


def test_receiving_another_type_raises_decode_error_in_its_place(node):
    sub = node.subscribe(tidings.Topic("mixed", tidings.JSON))
    raw = node.publisher("mixed")
    raw.publish(b'{"ok": 1}')
    raw.publish(b"\xff not json")
    raw.publish(b'{"ok": 2}')
    assert sub.recv(timeout=10).value == {"ok": 1}
    with pytest.raises(tidings.DecodeError) as e:
        sub.recv(timeout=10)
    assert str(e.value).startswith(
        'could not decode a message of topic "mixed" as the subscription\'s type: '
    )
    assert e.value.topic == "mixed" and e.value.why
    assert isinstance(e.value.__cause__, ValueError)
    assert sub.recv(timeout=10).value == {"ok": 2}


def test_recv_many_stops_before_an_undecodable_message_and_keeps_the_rest(node):
    sub = node.subscribe(tidings.Topic("mixed", tidings.STR))
    raw = node.publisher("mixed")
    for payload in [b"one", b"two", b"\xff", b"three"]:
        h = raw.publish(payload)
    h.wait_stable(timeout=10)
    deadline = time.monotonic() + 10
    while sub.queued < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [m.value for m in sub.recv_many(10, timeout=10)] == ["one", "two"]
    with pytest.raises(tidings.DecodeError):
        sub.recv_many(10, timeout=10)
    assert [m.value for m in sub.recv_many(10, timeout=10)] == ["three"]


def test_errors_carry_the_library_messages(node):
    with pytest.raises(tidings.TopicNameError, match=r'^topic name "" must be 1\.\.=256 bytes of UTF-8$'):
        tidings.Topic("")
    with pytest.raises(tidings.TopicNameError):
        node.subscribe("x" * (tidings.TOPIC_NAME_BYTES_MAX + 1))
    with pytest.raises(tidings.ConfigError, match=r"^invalid configuration: subscription_capacity = 0 must be within 1\.\.="):
        tidings.Node(gms="private", subscription_capacity=0)
    with pytest.raises(tidings.ConfigError, match="transport"):
        tidings.Node(gms="private", transport="carrier-pigeon")
    with pytest.raises(tidings.ConfigError, match="is not a host:port address"):
        tidings.Node(gms="nowhere")
    sub = node.subscribe("quiet")
    with pytest.raises(tidings.EmptyError, match=r"^no message is queued$"):
        sub.try_recv()
    started = time.monotonic()
    with pytest.raises(tidings.TimeoutError, match=r"^timed out: no message$"):
        sub.recv(timeout=0.2)
    assert 0.15 < time.monotonic() - started < 5
    assert sub.recv_many(10, timeout=0.1) == []
    pub = node.publisher("big")
    with pytest.raises(tidings.TooLargeError, match="exceeds the largest of") as e:
        pub.publish(bytes(pub.max_payload + 1))
    assert (e.value.len, e.value.max) == (pub.max_payload + 1, pub.max_payload)
    assert issubclass(tidings.NotStableError, tidings.TimeoutError)
    assert all(issubclass(getattr(tidings, n), tidings.TidingsError) for n in tidings.__all__ if n.endswith("Error"))


def test_stability_handles(node):
    sub = node.subscribe("stable")
    pub = node.publisher("stable")
    handles = [pub.publish(b"m%d" % i) for i in range(100)]
    assert [h.ticket for h in handles] == list(range(1, 101))
    pub.wait_stable(handles[-1], timeout=10)
    assert all(pub.is_stable(h) for h in handles)
    assert len(sub.recv_many(100, timeout=5)) >= 1


def test_iteration_ends_when_the_node_closes():
    node = tidings.Node(gms="private")
    sub = node.subscribe("t")
    pub = node.publisher("t")
    for i in range(10):
        pub.publish(b"%d" % i)
    got = []
    reader = threading.Thread(target=lambda: got.extend(m.value for m in sub))
    reader.start()
    deadline = time.monotonic() + 10
    while len(got) < 10 and time.monotonic() < deadline:
        time.sleep(0.01)
    node.close()
    reader.join(10)
    assert not reader.is_alive()
    assert got == [b"%d" % i for i in range(10)]
    with pytest.raises(tidings.ClosedError, match=r"^the node has shut down$"):
        pub.publish(b"late")
    with pytest.raises(tidings.ClosedError):
        node.subscribe("t")
    node.close()  # twice: nothing


def test_close_ends_a_blocked_recv_in_another_thread(node):
    sub = node.subscribe("t")
    errors = []

    def read():
        try:
            sub.recv()
        except tidings.ClosedError as e:
            errors.append(e)

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(0.2)
    sub.close()
    reader.join(5)
    assert not reader.is_alive() and len(errors) == 1
    assert sub.closed


def test_callback_subscription_in_order(node):
    got, done = [], threading.Event()

    def on_message(m):
        got.append(m.value)
        if len(got) == 500:
            done.set()

    errors = []
    with node.subscribe(tidings.Topic("cb", tidings.JSON), callback=on_message, on_error=errors.append) as cbs:
        assert isinstance(cbs, tidings.CallbackSubscription)
        pub = node.publisher(tidings.Topic("cb", tidings.JSON))
        for i in range(500):
            pub.publish({"i": i})
        node.publisher("cb").publish(b"\x00 not json")
        assert done.wait(10)
        deadline = time.monotonic() + 10
        while not errors and time.monotonic() < deadline:
            time.sleep(0.01)
    assert got == [{"i": i} for i in range(500)]
    assert len(errors) == 1 and isinstance(errors[0], tidings.DecodeError)


def test_publish_releases_the_gil_while_it_waits(pair):
    # While a publish waits for room (the subscriber's full queue holds the topic), another
    # Python thread runs.
    a, b = pair
    sub = b.subscribe("held", capacity=4)
    pub = a.publisher("held")
    ticks, stop = [0], threading.Event()

    def tick():
        while not stop.is_set():
            ticks[0] += 1

    ticker = threading.Thread(target=tick)
    ticker.start()
    try:
        with pytest.raises(tidings.TimeoutError, match=r"^timed out: no room to publish$"):
            for i in range(1_000_000):
                pub.publish(bytes(1000), timeout=1.0)
        before = ticks[0]
        with pytest.raises(tidings.TimeoutError):
            pub.publish(bytes(1000), timeout=0.5)
        assert ticks[0] - before > 1000, "the ticker did not run while publish waited"
    finally:
        stop.set()
        ticker.join()
        sub.close()


def test_membership_service_options():
    with tidings.Node(embed_gms="127.0.0.1:0") as a:
        host, port = a.gms_addr.rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0
        # One replica's address in a list is the same as the address alone.
        with tidings.Node(gms=[a.gms_addr]) as b, tidings.Node(gms=a.gms_addr) as c:
            assert b.gms_addrs == c.gms_addrs == [a.gms_addr]
            assert len({a.id, b.id, c.id}) == 3
            sub = c.subscribe("shared")
            handle = b.publisher("shared").publish(b"across nodes")
            handle.wait_stable(timeout=10)
            message = sub.recv(timeout=10)
            assert (message.value, message.origin) == (b"across nodes", b.id)
            stats = c.stats()
            assert stats["datagrams_received"] > 0 and set(stats) >= {"bytes_received", "kernel_drops"}
    with pytest.raises(tidings.ConfigError, match="exclusive"):
        tidings.Node(gms="private", embed_gms="127.0.0.1:0")
    with pytest.raises(tidings.ConfigError, match="names no replica"):
        tidings.Node(gms=[])
    assert a.closed and "closed" in repr(a)


def test_publish_many_publishes_in_order_and_returns_the_last_handle(node):
    sub = node.subscribe(tidings.Topic("many", tidings.STR))
    pub = node.publisher(tidings.Topic("many", tidings.STR))
    assert pub.publish_many([]) is None
    handle = pub.publish_many(f"m{i}" for i in range(1000))
    assert handle is not None and handle.ticket == 1000
    handle.wait_stable(timeout=10)
    got = []
    while len(got) < 1000:
        batch = sub.recv_many(512, timeout=10)
        assert batch, f"only {len(got)} of 1000 messages came"
        got.extend(m.value for m in batch)
    assert got == [f"m{i}" for i in range(1000)]

    # A value the codec refuses stops the call there: the ones before it are published.
    with pytest.raises(tidings.EncodeError, match="a str topic takes str, not int"):
        pub.publish_many(["a", "b", 3, "d"])
    assert pub.published_count == 1002
    assert [sub.recv(timeout=10).value for _ in range(2)] == ["a", "b"]
    with pytest.raises(tidings.TimeoutError):
        sub.recv(timeout=0.2)


def test_publishers_of_many_topics_in_one_call(node):
    names = [f"batch-{i}" for i in range(300)]
    subs = [node.subscribe(n) for n in names[:3]]
    typed = tidings.Topic("batch-typed", tidings.STR)
    typed_sub = node.subscribe(typed)
    pubs = node.publishers(names + [typed])
    assert [p.name for p in pubs] == names + ["batch-typed"]
    assert len({p.topic_id for p in pubs}) == len(pubs)
    for p in pubs[:3]:
        p.publish(p.name.encode())
    pubs[-1].publish("typed")
    assert [s.recv(timeout=10).value for s in subs] == [n.encode() for n in names[:3]]
    assert typed_sub.recv(timeout=10).value == "typed"
    with pytest.raises(tidings.TopicNameError):
        node.publishers(["ok", ""])


def test_payloads_of_every_size_arrive_intact_across_reused_publisher_memory(node):
    # The publisher copies payloads into chunks of its own, which it uses again once their
    # messages are stable: many rounds of mixed sizes, each waited stable, must all come back
    # byte for byte.
    sub = node.subscribe("sizes", capacity=4096)
    pub = node.publisher("sizes")
    sizes = [1, 17, 1000, pub.max_payload, 0, 999, 700, pub.max_payload - 1]
    expected = []
    for round_ in range(100):
        values = [bytes([round_ % 251, i % 251]) * (size // 2) + b"x" * (size % 2) for i, size in enumerate(sizes)]
        pub.publish_many(values).wait_stable(timeout=10)
        pub.publish(bytearray(b"from a bytearray %d" % round_)).wait_stable(timeout=10)
        expected += values + [b"from a bytearray %d" % round_]
        got = []
        while len(got) < len(values) + 1:
            got += [m.value for m in sub.recv_many(64, timeout=10)]
        assert got == expected[-len(got):]
    assert pub.published_count == len(expected)
