"""``python -m tidings.bench``: messages/s and latency of a Python publisher and subscribers.

One publisher (this process, which also embeds the membership service) and ``--subscribers``
subscriber processes on loopback, one bytes topic. The publisher publishes as fast as back
pressure lets it (``publish``, or ``publish_many`` with ``--publish-batch N``, which wait with the
GIL released); each subscriber reads in
batches (``recv_many``), checks that every message comes in order without a gap (a batch's
headers read by ``map`` and compared in one list comparison), and samples
the latency of one message in ``--sample-every`` (the publisher writes ``time.monotonic_ns()``,
one clock for every process of a Linux host, into the payload). After ``--warmup-seconds``,
``--seconds`` are measured; then the publisher waits until its last message is stable and
sends an end marker.

    python -m tidings.bench --subscribers 1 --message-bytes 1000
    python -m tidings.bench --subscribers 4 --message-bytes 64 --json
"""

from __future__ import annotations

import argparse
import json
import operator
import os
import struct
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

from . import _api

# Payload header: the publisher's monotonic clock (ns) and the message's sequence number.
HEADER = struct.Struct(">QQ")
# The sequence number of the end marker.
END = (1 << 64) - 1


def _percentile(sorted_values: List[float], p: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(p / 100 * (len(sorted_values) - 1))))
    return sorted_values[k]


def _subscriber(args: argparse.Namespace) -> None:
    # A batch's headers are read, and their order checked, in a few calls that loop in C.
    unpack = HEADER.unpack_from
    value_of = operator.attrgetter("value")
    seq_of = operator.itemgetter(1)
    with _api.Node(gms=args.gms) as node:
        sub = node.subscribe(args.topic, capacity=args.capacity)
        print("ready", flush=True)
        monotonic_ns = time.monotonic_ns
        expected = 0
        first_ns: Optional[int] = None
        window_start_ns = window_end_ns = 0
        in_window = 0
        samples: List[float] = []
        sample_every = args.sample_every
        # The process's CPU time at the first batch of the window and at the first after it.
        cpu_start: Optional[float] = None
        cpu_end: Optional[float] = None
        while True:
            batch = sub.recv_many(args.batch, timeout=60)
            if not batch:
                raise SystemExit("subscriber: no message for 60 s")
            now = monotonic_ns()
            if first_ns is None:
                first_ns = now
                window_start_ns = first_ns + int(args.warmup_seconds * 1e9)
                window_end_ns = window_start_ns + int(args.seconds * 1e9)
            heads = list(map(unpack, map(value_of, batch)))
            seqs = list(map(seq_of, heads))
            ended = seqs[-1] == END
            if ended:
                seqs.pop()
            count = len(seqs)
            if seqs != list(range(expected, expected + count)):
                at = next(i for i, seq in enumerate(seqs) if seq != expected + i)
                raise SystemExit(f"subscriber: message {seqs[at]} came where {expected + at} was due")
            if cpu_end is None and now >= window_start_ns:
                if cpu_start is None:
                    cpu_start = time.process_time()
                elif now >= window_end_ns:
                    cpu_end = time.process_time()
            if window_start_ns <= now < window_end_ns:
                in_window += count
                # The messages of this batch whose sequence number is a multiple of sample_every.
                for i in range(-expected % sample_every, count, sample_every):
                    samples.append((now - heads[i][0]) / 1000)
            expected += count
            if ended:
                print(
                    json.dumps(
                        {
                            "received": expected,
                            "in_window": in_window,
                            "cpu_seconds": (cpu_end or time.process_time()) - (cpu_start or 0.0),
                            "latency_us": samples,
                        }
                    ),
                    flush=True,
                )
                return


def _publisher(args: argparse.Namespace) -> Dict[str, Any]:
    with _api.Node(gms="private", transport=args.transport) as node:
        command = [sys.executable, "-m", "tidings.bench", "--role", "subscriber"]
        children = [
            subprocess.Popen(
                command
                + [
                    "--gms",
                    node.gms_addr,
                    "--topic",
                    args.topic,
                    "--seconds",
                    str(args.seconds),
                    "--warmup-seconds",
                    str(args.warmup_seconds),
                    "--batch",
                    str(args.batch),
                    "--capacity",
                    str(args.capacity),
                    "--sample-every",
                    str(args.sample_every),
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(args.subscribers)
        ]
        try:
            for child in children:
                assert child.stdout is not None
                line = child.stdout.readline().strip()
                if line != "ready":
                    raise SystemExit(f"a subscriber did not start: {line!r}")
            pub = node.publisher(args.topic)
            padding = bytes(max(0, args.message_bytes - HEADER.size))
            pack = HEADER.pack
            publish = pub.publish
            publish_many = pub.publish_many
            one_by_one = args.publish_batch <= 1
            monotonic_ns = time.monotonic_ns
            seq = 0
            # A group is one clock reading and, with --publish-batch, one publish_many call.
            group = args.publish_batch if not one_by_one else args.sample_every
            started = monotonic_ns()
            window_start = started + int(args.warmup_seconds * 1e9)
            window_end = window_start + int(args.seconds * 1e9)
            in_window_first = in_window_last = None
            cpu_start = cpu_end = 0.0
            while True:
                now = monotonic_ns()
                if now >= window_end:
                    break
                if in_window_first is None and now >= window_start:
                    in_window_first, cpu_start = seq, time.process_time()
                # One clock reading per group: its first message carries it exactly, and later
                # ones count their wait in the group too; the clock costs as much as a publish.
                if one_by_one:
                    for _ in range(group):
                        publish(pack(now, seq) + padding)
                        seq += 1
                else:
                    publish_many([pack(now, s) + padding for s in range(seq, seq + group)])
                    seq += group
            in_window_last, cpu_end = seq, time.process_time()
            handle = publish(pack(monotonic_ns(), END) + padding)
            handle.wait_stable(timeout=60)
            results = []
            for child in children:
                out, _ = child.communicate(timeout=60)
                if child.returncode != 0:
                    raise SystemExit(f"a subscriber failed (exit {child.returncode})")
                results.append(json.loads(out.strip().splitlines()[-1]))
        finally:
            for child in children:
                child.kill()
    published_in_window = (in_window_last or 0) - (in_window_first or 0)
    for r in results:
        if r["received"] != seq:
            raise SystemExit(f"a subscriber got {r['received']} of {seq} messages")
    latencies = sorted(v for r in results for v in r["latency_us"])
    return {
        "api": "python",
        "subscribers": args.subscribers,
        "message_bytes": args.message_bytes,
        "seconds": args.seconds,
        "published": seq,
        "publisher_msgs_per_s": published_in_window / args.seconds,
        "publisher_cpu_us_per_msg": (cpu_end - cpu_start) * 1e6 / max(1, published_in_window),
        # As `tidings bench` counts it: the CPU of every process over the measured seconds, per
        # message published in them.
        "cpu_us_per_msg_all_processes": (
            (cpu_end - cpu_start) + sum(r["cpu_seconds"] for r in results)
        )
        * 1e6
        / max(1, published_in_window),
        "subscriber_msgs_per_s_min": min(r["in_window"] for r in results) / args.seconds,
        "latency_us_p50": _percentile(latencies, 50),
        "latency_us_p90": _percentile(latencies, 90),
        "latency_us_p99": _percentile(latencies, 99),
        "latency_us_max": latencies[-1] if latencies else float("nan"),
        "in_order": True,
    }


def main(argv: Optional[List[str]] = None) -> None:
    """Runs the benchmark (or, with ``--role subscriber``, one of its subscribers)."""
    p = argparse.ArgumentParser(prog="python -m tidings.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--subscribers", type=int, default=1, help="subscriber processes (1)")
    p.add_argument("--message-bytes", type=int, default=1000, help="payload bytes (1000)")
    p.add_argument("--seconds", type=float, default=3.0, help="measured seconds (3)")
    p.add_argument("--warmup-seconds", type=float, default=1.0, help="warm-up seconds (1)")
    p.add_argument(
        "--batch",
        type=int,
        default=512,
        help="recv_many batch, messages (512: fewer messages alive than the threshold of "
        "Python's cyclic GC, 700, so that a batch triggers no collection)",
    )
    p.add_argument("--capacity", type=int, default=16384, help="subscription queue, messages")
    p.add_argument("--sample-every", type=int, default=16, help="latency sample: 1 message in N")
    p.add_argument(
        "--publish-batch",
        type=int,
        default=1,
        help="messages per publish_many call (1: one publish call per message)",
    )
    p.add_argument("--transport", default="unicast", choices=["unicast", "multicast"])
    p.add_argument("--topic", default="bench")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--role", default="publisher", choices=["publisher", "subscriber"], help=argparse.SUPPRESS)
    p.add_argument("--gms", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.message_bytes < HEADER.size:
        p.error(f"--message-bytes must be at least {HEADER.size} (the timestamp and sequence number)")
    if args.role == "subscriber":
        _subscriber(args)
        return
    r = _publisher(args)
    if args.json:
        print(json.dumps(r))
        return
    print(
        f"python 1 -> {r['subscribers']}, {r['message_bytes']}-byte messages, "
        f"{r['seconds']:g} s measured (pid {os.getpid()})\n"
        f"  publisher    {r['publisher_msgs_per_s']:>12,.0f} messages/s  "
        f"({r['publisher_cpu_us_per_msg']:.2f} us of CPU per message)\n"
        f"  subscribers  {r['subscriber_msgs_per_s_min']:>12,.0f} messages/s (the slowest)\n"
        f"  CPU          {r['cpu_us_per_msg_all_processes']:.2f} us per message, all processes\n"
        f"  latency      p50 {r['latency_us_p50']:.0f} us  p90 {r['latency_us_p90']:.0f} us  "
        f"p99 {r['latency_us_p99']:.0f} us  max {r['latency_us_max']:.0f} us\n"
        f"  every subscriber got all {r['published']:,} messages in order"
    )


if __name__ == "__main__":
    main()
