"""Many topics: subscribed with callbacks and published in batched calls (`subscribe_many`,
`publishers`), and a batch reader on a topic that carries the most.

    python bindings/python/examples/many_topics.py [TOPICS]
"""

import sys
from typing import Callable
import threading
import time

import tidings

topics = int(sys.argv[1]) if len(sys.argv) > 1 else 100

with tidings.Node(gms="private") as node:
    counts = [0] * topics
    done = threading.Event()
    lock = threading.Lock()
    remaining = [topics]

    def on_message(i: int) -> Callable[[tidings.Message], None]:
        def callback(message: tidings.Message) -> None:
            counts[i] += 1
            if counts[i] == 10:
                with lock:
                    remaining[0] -= 1
                    if remaining[0] == 0:
                        done.set()

        return callback

    started = time.monotonic()
    sensors = [tidings.Topic(f"sensor/{i}", tidings.STR) for i in range(topics)]
    # One request per batch of topics; the callbacks run on the node's delivery workers.
    subscriptions = node.subscribe_many(sensors, [on_message(i) for i in range(topics)])
    publishers = node.publishers(sensors)
    print(f"{topics} topics subscribed and published in {time.monotonic() - started:.2f} s")

    bulk = node.subscribe("bulk", capacity=4096)
    bulk_publisher = node.publisher("bulk")
    received = [0]

    def read_bulk() -> None:
        # One call per batch. The reader runs beside the publisher: a full queue holds the
        # topic, and this node's own publisher then waits for its own reader.
        while received[0] < 20_000:
            received[0] += len(bulk.recv_many(1024, timeout=10))

    reader = threading.Thread(target=read_bulk)
    reader.start()
    for round_ in range(10):
        for i, publisher in enumerate(publishers):
            publisher.publish(f"reading {round_} of sensor {i}")
    for i in range(20_000):
        bulk_publisher.publish(i.to_bytes(4, "big") * 16)
    reader.join(30)
    assert done.wait(10), "some sensor topics did not get all their readings"
    print(f"every sensor topic got 10 readings; bulk got {received[0]} messages")
# Leaving the block closes the node, which ends every subscription.
