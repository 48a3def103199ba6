"""asyncio: async for, publish_async, awaiting handles, cancellation without loss."""

import asyncio

import pytest

import tidings
from conftest import fill_until_would_block


def run(coro, timeout=60):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def test_async_for_and_publish_async(pair):
    a, b = pair
    topic = tidings.Topic("aio", tidings.JSON)
    sub = b.subscribe(topic)
    pub = a.publisher(topic)

    async def main():
        async def produce():
            last = None
            for i in range(1000):
                last = await pub.publish_async({"i": i})
            await last  # stable
            assert last.is_stable()

        async def consume():
            got = []
            async for message in sub:
                got.append(message.value["i"])
                if len(got) == 1000:
                    return got

        _, got = await asyncio.gather(produce(), consume())
        assert got == list(range(1000))

    run(main())


def test_cancelled_recv_async_loses_nothing(node):
    sub = node.subscribe("cancel")
    pub = node.publisher("cancel")

    async def main():
        task = asyncio.ensure_future(sub.recv_async())
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        pub.publish(b"first")
        pub.publish(b"second")
        assert (await sub.recv_async()).value == b"first"
        assert (await sub.recv_async()).value == b"second"

    run(main())


def test_concurrent_readers_take_messages_in_turn(node):
    sub = node.subscribe("shared")
    pub = node.publisher("shared")

    async def main():
        async def reader(n):
            return [(await sub.recv_async()).value for _ in range(n)]

        tasks = [asyncio.ensure_future(reader(50)) for _ in range(4)]
        await asyncio.sleep(0.1)
        for i in range(200):
            await pub.publish_async(b"%03d" % i)
        results = await asyncio.gather(*tasks)
        everything = sorted(v for r in results for v in r)
        assert everything == [b"%03d" % i for i in range(200)]
        for r in results:
            assert r == sorted(r)

    run(main())


def test_publish_async_waits_under_back_pressure(pair):
    a, b = pair
    sub = b.subscribe("abp", capacity=32)
    pub = a.publisher("abp")

    async def main():
        published = fill_until_would_block(pub)
        waiting = asyncio.ensure_future(pub.publish_async(bytes(1000)))
        await asyncio.sleep(0.3)
        assert not waiting.done(), "publish_async did not wait under back pressure"
        received = 0
        while received < published + 1:
            received += len(sub.recv_many(1024, timeout=0))
            await asyncio.sleep(0.001)
        handle = await waiting
        assert handle.ticket == published + 1

    run(main())
