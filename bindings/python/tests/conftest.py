"""Shared fixtures. Every node of these tests uses a membership service of its own (a private
one, or another test node's), never the host's shared one, so the tests run beside anything
else on the host; and every test is bounded in time by a watchdog."""

import faulthandler
import os
import subprocess
import sys
import textwrap
import time

import pytest

import tidings

# Longest a test may take before the watchdog dumps every thread's stack and ends the run.
TEST_SECONDS_MAX = float(os.environ.get("TIDINGS_TEST_SECONDS_MAX", "120"))


@pytest.fixture(autouse=True)
def watchdog():
    faulthandler.dump_traceback_later(TEST_SECONDS_MAX, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture
def node():
    """A node with a membership service of its own."""
    with tidings.Node(gms="private") as n:
        yield n


@pytest.fixture
def pair():
    """Two nodes of one group: the first embeds the service, the second joins it."""
    with tidings.Node(gms="private") as a, tidings.Node(gms=a.gms_addr) as b:
        yield a, b


def python_child(code: str, *args: str, **kwargs) -> subprocess.Popen:
    """Starts `code` in a child Python process (stdout and stderr piped, text)."""
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def fill_until_would_block(pub, seconds_max=60.0):
    """Publishes until the publisher is held (no room for 0.2 s: the window is full, not only
    the queue the node's core thread drains), checks that try_publish then raises WouldBlock,
    and returns how many were published."""
    published = 0
    deadline = time.monotonic() + seconds_max
    while True:
        if time.monotonic() > deadline:
            pytest.fail(f"{published} messages published in {seconds_max} s without back pressure")
        try:
            pub.publish(bytes(1000), timeout=0.2)
            published += 1
        except tidings.TimeoutError:
            break
    with pytest.raises(tidings.WouldBlock, match=r"^back pressure: the publisher's queue"):
        pub.try_publish(bytes(1000))
    return published
