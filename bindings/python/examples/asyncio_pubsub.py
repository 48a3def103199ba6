"""asyncio: a producer task and a consumer task on one topic, with back pressure.

    python bindings/python/examples/asyncio_pubsub.py
"""

import asyncio

import tidings


async def main() -> None:
    topic = tidings.Topic("ticks", tidings.JSON)
    with tidings.Node(gms="private") as node:
        subscription = node.subscribe(topic, capacity=256)
        publisher = node.publisher(topic)

        async def produce(count: int) -> None:
            handle = None
            for i in range(count):
                # Waits (the task, not the thread) while the window is full.
                handle = await publisher.publish_async({"tick": i})
            assert handle is not None
            await asyncio.wait_for(handle, timeout=5)  # stable
            print(f"published {count}, all stable")

        async def consume(count: int) -> None:
            total = 0
            async for message in subscription:
                total += message.value["tick"]
                if message.value["tick"] == count - 1:
                    break
            print(f"received {count}, sum of ticks {total}")

        await asyncio.gather(produce(10_000), consume(10_000))


asyncio.run(main())
