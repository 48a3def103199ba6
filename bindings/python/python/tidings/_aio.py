"""asyncio: awaiting the extension's futures without holding a thread.

The extension polls its Rust future once per call and, when it is not ready, keeps a waker
that calls a Python callable from a helper thread once progress is possible. The callable
resolves an ``asyncio.Future`` of the task's loop through ``call_soon_threadsafe``; the task
then polls again. Nothing is taken from a queue or published until a poll says it is done, so
cancelling the task at any await loses nothing.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Optional, TypeVar

T = TypeVar("T")


def _resolve(future: "asyncio.Future[None]") -> None:
    if not future.done():
        future.set_result(None)


def _waker(loop: asyncio.AbstractEventLoop, future: "asyncio.Future[None]") -> Callable[[], None]:
    def wake() -> None:
        try:
            loop.call_soon_threadsafe(_resolve, future)
        except RuntimeError:
            # The loop was closed: the task that waited is gone with it.
            pass

    return wake


async def poll_until(poll: Callable[[Callable[[], None]], Optional[T]]) -> T:
    """Calls ``poll(wake)`` until it returns something other than ``None``, awaiting a wake
    between calls."""
    loop = asyncio.get_running_loop()
    while True:
        future: asyncio.Future[None] = loop.create_future()
        result = poll(_waker(loop, future))
        if result is not None:
            return result
        await future


async def wait_stable(handle: Any) -> None:
    """Waits until ``handle``'s message is stable (what awaiting a ``PublishHandle`` does)."""
    await poll_until(lambda wake: True if handle.poll_stable(wake) else None)
