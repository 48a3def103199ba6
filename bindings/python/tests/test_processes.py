"""Across processes: delivery in order from another process, a publisher killed mid-run,
Ctrl-C during a blocking receive, and interpreter exit with live nodes."""

import signal
import time

import pytest

import tidings
from conftest import python_child

PUBLISHER = """
import sys, tidings
gms, count = sys.argv[1], int(sys.argv[2])
with tidings.Node(gms=gms) as node:
    pub = node.publisher(tidings.Topic("seq", tidings.JSON))
    print("ready", flush=True)
    handle = None
    for i in range(count):
        handle = pub.publish({"i": i, "pad": "x" * 100}, timeout=30)
    handle.wait_stable(timeout=30)
print("done", flush=True)
"""


def test_delivery_in_order_from_another_process(node):
    sub = node.subscribe(tidings.Topic("seq", tidings.JSON))
    count = 5000
    child = python_child(PUBLISHER, node.gms_addr, str(count))
    try:
        got = []
        while len(got) < count:
            batch = sub.recv_many(1000, timeout=30)
            assert batch, f"only {len(got)} of {count} messages came"
            got.extend(batch)
        assert [m.value["i"] for m in got] == list(range(count))
        assert len({m.origin for m in got}) == 1 and got[0].origin != node.id
        out, err = child.communicate(timeout=30)
        assert child.returncode == 0, err
        assert out.split() == ["ready", "done"]
    finally:
        child.kill()


ENDLESS = """
import sys, tidings
with tidings.Node(gms=sys.argv[1]) as node:
    pub = node.publisher("endless")
    print("ready", flush=True)
    i = 0
    while True:
        pub.publish(i.to_bytes(8, "big"), timeout=30)
        i += 1
"""


def test_a_publisher_killed_mid_run(node):
    sub = node.subscribe("endless")
    mine = node.subscribe("after")
    child = python_child(ENDLESS, node.gms_addr)
    try:
        assert child.stdout.readline().strip() == "ready"
        got = []
        while len(got) < 2000:
            got.extend(m.value for m in sub.recv_many(1000, timeout=30))
        child.kill()
        child.wait(10)
        # What came before the kill is in order, without gaps or repeats.
        while True:
            batch = sub.recv_many(1000, timeout=1)
            if not batch:
                break
            got.extend(m.value for m in batch)
        assert [int.from_bytes(v, "big") for v in got] == list(range(len(got)))
        # The group goes on without it: the membership service removes the dead node, and
        # this node's own messages become stable.
        pub = node.publisher("after")
        handle = pub.publish(b"still here")
        handle.wait_stable(timeout=30)
        assert mine.recv(timeout=10).value == b"still here"
    finally:
        child.kill()


def test_ctrl_c_interrupts_a_blocking_recv():
    child = python_child(
        """
        import signal, time, tidings
        # Python leaves SIGINT ignored if it started so (a child of a background job): the
        # handler a terminal's Ctrl-C reaches is installed here whatever the parent did.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        with tidings.Node(gms="private") as node:
            sub = node.subscribe("nothing")
            print("ready", flush=True)
            started = time.monotonic()
            try:
                sub.recv()
            except KeyboardInterrupt:
                print("interrupted after %.1f s" % (time.monotonic() - started), flush=True)
        print("closed", flush=True)
        """
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=20)
        assert time.monotonic() - sent < 10
        assert child.returncode == 0, err
        assert "interrupted after" in out and out.rstrip().endswith("closed"), (out, err)
    finally:
        child.kill()


SHUTDOWN = """
import asyncio, sys, threading, tidings
a = tidings.Node(gms="private")
b = tidings.Node(gms=a.gms_addr)
held = b.subscribe("held", capacity=4)            # full: holds its topic, its publisher waits
cb = b.subscribe("cb", callback=lambda m: None)   # a callback thread
blocked = b.subscribe("quiet")
threading.Thread(target=lambda: blocked.recv(), daemon=True).start()   # a blocked reader
pub = a.publisher("held")
threading.Thread(target=lambda: [pub.publish(bytes(100)) for _ in range(1_000_000)], daemon=True).start()
a.publisher("cb").publish(b"x")
many = b.subscribe_many(["many"], lambda m: None)   # callbacks on the delivery workers, busy
pm = a.publisher("many")
threading.Thread(target=lambda: [pm.publish(bytes(100)) for _ in range(1_000_000)], daemon=True).start()
loop = asyncio.new_event_loop()
loop.run_until_complete(asyncio.sleep(0))
task = loop.create_task(blocked.recv_async())     # a pending asyncio receive
loop.run_until_complete(asyncio.sleep(0.1))
print("live", flush=True)
if sys.argv[1] == "raise":
    raise RuntimeError("the application failed with live nodes")
"""


# Exit races the library's threads (the asyncio waker calling into Python, readers returning
# from detached waits), so each ending runs in several processes at once.
EXIT_RUNS = 6


@pytest.mark.parametrize("ending", ["return", "raise"])
def test_interpreter_exit_with_live_nodes_does_not_hang_or_crash(ending):
    children = [python_child(SHUTDOWN, ending) for _ in range(EXIT_RUNS)]
    try:
        started = time.monotonic()
        for child in children:
            out, err = child.communicate(timeout=60)
            assert time.monotonic() - started < 60
            assert out.strip() == "live", (out, err)
            if ending == "return":
                assert child.returncode == 0, (child.returncode, err)
            else:
                assert child.returncode == 1 and "the application failed with live nodes" in err, err
            assert "panick" not in err and "Fatal" not in err and "Segmentation" not in err, err
    finally:
        for child in children:
            child.kill()
