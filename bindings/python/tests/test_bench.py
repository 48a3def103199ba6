"""``python -m tidings.bench`` runs end to end: its subscribers check every message's order."""

import json
import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "args",
    [
        ["--subscribers", "1", "--message-bytes", "1000", "--publish-batch", "64"],
        ["--subscribers", "2", "--message-bytes", "16", "--batch", "100"],
    ],
)
def test_the_benchmark_runs_and_every_subscriber_gets_every_message_in_order(args):
    out = subprocess.run(
        [sys.executable, "-m", "tidings.bench", "--seconds", "0.5", "--warmup-seconds", "0.2", "--json"]
        + args,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["in_order"] is True
    assert result["published"] > 0 and result["publisher_msgs_per_s"] > 0
    assert result["subscriber_msgs_per_s_min"] > 0
    assert result["latency_us_p50"] > 0
    assert result["cpu_us_per_msg_all_processes"] > result["publisher_cpu_us_per_msg"] > 0
