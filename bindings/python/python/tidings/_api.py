"""Nodes, topics, publishers and subscriptions: the Python face of the Rust library."""

from __future__ import annotations

import asyncio
import atexit
import sys
import threading
import time
import traceback
import weakref
from dataclasses import dataclass
from typing import (
    Any,
    AsyncIterator,
    Callable,
    Dict,
    Generic,
    Iterable,
    Iterator,
    List,
    Optional,
    Sequence,
    TypeVar,
    Union,
    overload,
)

from . import _tidings
from ._aio import poll_until
from ._codecs import BYTES, BytesCodec, Codec
from ._tidings import ClosedError, Message, PublishHandle, TidingsError

T = TypeVar("T")

__all__ = [
    "Node",
    "Topic",
    "Publisher",
    "Subscription",
    "CallbackSubscription",
    "WorkerSubscription",
    "Bottleneck",
    "SlowDown",
    "Disconnect",
]


class Topic(Generic[T]):
    """A topic: a name every process agrees on, and the codec of its values.

    ``Topic("prices")`` carries bytes as they are; ``Topic("prices", tidings.JSON)`` carries
    what ``json`` does; any object with ``encode(value) -> bytes`` and ``decode(bytes) ->
    value`` (``tidings.Codec``) can be the codec. Creating a topic touches no network; the
    name is checked (1 to ``TOPIC_NAME_BYTES_MAX`` bytes of UTF-8) and ``TopicNameError``
    raised if it is not one.
    """

    __slots__ = ("name", "codec")

    @overload
    def __init__(self: "Topic[bytes]", name: str) -> None: ...

    @overload
    def __init__(self, name: str, codec: "Codec[T]") -> None: ...

    def __init__(self, name: str, codec: "Codec[Any]" = BYTES) -> None:
        if not isinstance(name, str):
            raise TypeError(f"a topic name is a str, not {type(name).__name__}")
        if not (callable(getattr(codec, "encode", None)) and callable(getattr(codec, "decode", None))):
            raise TypeError(
                f"codec {codec!r} must have encode(value) -> bytes and decode(bytes) -> value"
            )
        _tidings.check_topic_name(name)
        self.name = name
        self.codec = codec

    def _encode(self) -> Optional[Callable[[Any], bytes]]:
        return None if isinstance(self.codec, BytesCodec) else self.codec.encode

    def _decode(self) -> Optional[Callable[[bytes], Any]]:
        return None if isinstance(self.codec, BytesCodec) else self.codec.decode

    def __repr__(self) -> str:
        return f"Topic({self.name!r}, {self.codec!r})"


@dataclass(frozen=True)
class SlowDown:
    """Slow-consumer policy (the default): while the subscription's queue is full its topic is
    held at this node (its publishers slow down), until the reader has taken half of it.
    Nothing is lost."""


@dataclass(frozen=True)
class Disconnect:
    """Slow-consumer policy: hold the topic at most ``max_wait`` seconds; if the queue is still
    full then, the subscription is disconnected: its reader gets what was queued, then
    ``SlowConsumerError``, then the end."""

    max_wait: float


def _topic(topic: Union[str, "Topic[Any]"]) -> "Topic[Any]":
    return Topic(topic) if isinstance(topic, str) else topic


# Nodes not yet closed, closed at interpreter exit while the interpreter still runs every
# thread (finalization would otherwise drop them at an arbitrary point).
_live: "weakref.WeakSet[Node]" = weakref.WeakSet()

# Longest the exit waits for threads blocked in tidings calls to return once the nodes are
# closed (each such wait ends within its 100 ms slice, or at once when its node closes).
_EXIT_WAIT_SECONDS = 2.0


@atexit.register
def _close_live_nodes() -> None:
    for node in list(_live):
        try:
            node.close()
        except TidingsError:
            pass
    # Threads still waiting in the extension (a reader blocked in recv, a publisher under back
    # pressure, the asyncio waker) return now that their nodes are closed; they must be back in
    # the interpreter before it finalizes, which ends any thread that attaches after (through
    # Rust frames: the process aborts). From `begin_exit` on, no thread leaves it any more.
    _tidings.begin_exit()
    deadline = time.monotonic() + _EXIT_WAIT_SECONDS
    while _tidings.waiting() > 0 and time.monotonic() < deadline:
        time.sleep(0.005)


class Node:
    """One process's membership in the group: publish and subscribe by topic.

    ``gms`` says where the membership service is:

    - ``None`` (the default, as in the Rust library): the host's shared service at
      ``127.0.0.1:LOCAL_GMS_PORT`` (17400), which the first node of the host to start embeds,
      so every process of a host started with the defaults is in one group;
    - ``"private"``: a service of the node's own on a free loopback port, a group of its own
      that others join with its ``gms_addr`` (tests that run side by side, for one);
    - ``"host:port"``: join that service (``tidings gms``, or another node's ``gms_addr``);
    - a list of ``"host:port"``: the replicas of a replicated service, in their order.

    ``embed_gms="host:port"`` embeds the node's own service bound to that address instead.
    ``transport`` is ``"unicast"`` (fan-out, works everywhere) or ``"multicast"`` (IP
    multicast on loopback). ``subscription_capacity`` is the default queue of a
    subscription, in messages (1024); ``subscription_share`` the share of the delivery
    workers' time each subscription gets when topics compete, in (0, 1]. ``metrics``
    serves Prometheus metrics on ``host:port``.

    Use it as a context manager, or call ``close()``: it leaves the group cleanly. Nodes
    still open when the interpreter exits are closed then.
    """

    def __init__(
        self,
        gms: Union[None, str, Sequence[str]] = None,
        *,
        embed_gms: Optional[str] = None,
        transport: str = "unicast",
        bind: str = "127.0.0.1:0",
        subscription_capacity: int = 1024,
        subscription_share: float = 1.0,
        metrics: Optional[str] = None,
    ) -> None:
        if embed_gms is not None:
            if gms is not None:
                raise _config_error("gms and embed_gms are exclusive: give one")
            kind, addrs = "embed", [embed_gms]
        elif gms is None:
            kind, addrs = "local", []
        elif gms == "private":
            kind, addrs = "private", []
        elif isinstance(gms, str):
            kind, addrs = "connect", [gms]
        else:
            kind, addrs = "connect", list(gms)
            if not addrs:
                raise _config_error("gms = [] names no replica")
        self._inner = _tidings.Node(
            kind,
            addrs,
            bind,
            transport,
            subscription_capacity,
            subscription_share,
            metrics,
        )
        _live.add(self)

    @property
    def id(self) -> int:
        """This node's id (given by the membership service)."""
        return self._inner.id

    @property
    def local_addr(self) -> str:
        """The node's unicast address, ``host:port``."""
        return self._inner.local_addr

    @property
    def gms_addr(self) -> str:
        """The membership service's address: the embedded one's (give it to the other nodes),
        or the first of those this node joined."""
        return self._inner.gms_addrs[0]

    @property
    def gms_addrs(self) -> List[str]:
        """Every replica address of the membership service this node joined."""
        return self._inner.gms_addrs

    @property
    def metrics_addr(self) -> Optional[str]:
        """Where the node serves its metrics, if it does."""
        return self._inner.metrics_addr

    @property
    def closed(self) -> bool:
        """Whether the node has been closed."""
        return self._inner.closed

    @overload
    def publisher(self, topic: str) -> "Publisher[bytes]": ...

    @overload
    def publisher(self, topic: "Topic[T]") -> "Publisher[T]": ...

    def publisher(self, topic: Union[str, "Topic[Any]"]) -> "Publisher[Any]":
        """A publisher on ``topic`` (a name for a bytes topic, or a ``Topic``): tells the
        membership service this node publishes on it, and returns once the node knows the
        topic's regions."""
        topic = _topic(topic)
        return Publisher(self._inner.publisher(topic.name, topic._encode()), topic)

    def publishers(self, topics: Sequence[Union[str, "Topic[Any]"]]) -> List["Publisher[Any]"]:
        """Publishers of every topic of ``topics`` (names or ``Topic`` objects), in their
        order, as ``publisher`` makes each; the membership service is told in batches, so
        starting to publish on thousands of topics takes time linear in their number."""
        resolved = [_topic(t) for t in topics]
        inners = self._inner.publishers([(t.name, t._encode()) for t in resolved])
        return [Publisher(inner, t) for inner, t in zip(inners, resolved)]

    @overload
    def subscribe(
        self,
        topic: str,
        *,
        capacity: Optional[int] = None,
        slow_consumer: Union[SlowDown, Disconnect, None] = None,
        callback: None = None,
        on_error: None = None,
    ) -> "Subscription[bytes]": ...

    @overload
    def subscribe(
        self,
        topic: "Topic[T]",
        *,
        capacity: Optional[int] = None,
        slow_consumer: Union[SlowDown, Disconnect, None] = None,
        callback: None = None,
        on_error: None = None,
    ) -> "Subscription[T]": ...

    @overload
    def subscribe(
        self,
        topic: Union[str, "Topic[Any]"],
        *,
        capacity: Optional[int] = None,
        slow_consumer: Union[SlowDown, Disconnect, None] = None,
        callback: Callable[["Message"], Any],
        on_error: Optional[Callable[[BaseException], Any]] = None,
    ) -> "CallbackSubscription": ...

    def subscribe(
        self,
        topic: Union[str, "Topic[Any]"],
        *,
        capacity: Optional[int] = None,
        slow_consumer: Union[SlowDown, Disconnect, None] = None,
        callback: Optional[Callable[["Message"], Any]] = None,
        on_error: Optional[Callable[[BaseException], Any]] = None,
    ) -> Union["Subscription[Any]", "CallbackSubscription"]:
        """Subscribes to ``topic`` (a name for a bytes topic, or a ``Topic``); in force when
        this returns (every message published after it is delivered).

        Messages wait in a queue of ``capacity`` messages (default the node's
        ``subscription_capacity``). When it is full, ``slow_consumer`` applies: ``SlowDown()``
        (the default) holds the topic at this node, which slows its publishers down;
        ``Disconnect(max_wait)`` disconnects the subscription if the queue stays full
        ``max_wait`` seconds. Nothing is dropped silently.

        Without ``callback`` the subscription is read: ``recv``, ``recv_many``, ``for``,
        ``async for``. With it, ``callback(message)`` runs on a thread of the subscription's
        own, in order; errors (``DecodeError``, ``SlowConsumerError``, and what the callback
        raises) go to ``on_error(exception)``, or are printed to stderr without it.
        """
        topic = _topic(topic)
        if slow_consumer is None or isinstance(slow_consumer, SlowDown):
            disconnect_after = None
        elif isinstance(slow_consumer, Disconnect):
            disconnect_after = float(slow_consumer.max_wait)
        else:
            raise TypeError(
                f"slow_consumer must be SlowDown() or Disconnect(max_wait), not {slow_consumer!r}"
            )
        inner = self._inner.subscribe(topic.name, capacity, disconnect_after, topic._decode())
        subscription: Subscription[Any] = Subscription(inner, topic)
        if callback is None:
            if on_error is not None:
                raise TypeError("on_error goes with callback")
            return subscription
        return CallbackSubscription(subscription, callback, on_error)

    def subscribe_many(
        self,
        topics: Sequence[Union[str, "Topic[Any]"]],
        callback: Union[Callable[["Message"], Any], Sequence[Callable[["Message"], Any]]],
        *,
        on_error: Optional[Callable[[BaseException], Any]] = None,
    ) -> List["WorkerSubscription"]:
        """Subscribes to every topic of ``topics`` (names or ``Topic`` objects) with callbacks,
        in one batched request to the membership service (the Rust
        ``Node::subscribe_many_with``): subscribing to thousands of topics takes time linear in
        their number, where one ``subscribe`` each takes quadratic time. Returns once all are in
        force, a ``WorkerSubscription`` per topic in the order of ``topics``; on an error none is
        kept.

        ``callback`` is one callable for every topic (``message.topic`` tells them apart) or a
        sequence of one per topic. It runs on the node's delivery workers, in order within its
        topic, holding the GIL: keep it short (a slow callback holds its topic back at this
        node, and the workers it shares with the node's other callbacks), and do not close the
        node from it. Errors (``DecodeError``, and what the callback raises) go to
        ``on_error(exception)``, or are printed to stderr without it.
        """
        resolved = [_topic(t) for t in topics]
        if callable(callback):
            callbacks: List[Callable[["Message"], Any]] = [callback] * len(resolved)
        else:
            callbacks = list(callback)
            if len(callbacks) != len(resolved):
                raise TypeError(
                    f"callback: {len(callbacks)} callables for {len(resolved)} topics "
                    "(give one callable, or one per topic)"
                )
            for c in callbacks:
                if not callable(c):
                    raise TypeError(f"callback: {c!r} is not callable")
        inners = self._inner.subscribe_many(
            [
                (t.name, t._decode(), _deliverer(t.name, c, on_error))
                for t, c in zip(resolved, callbacks)
            ]
        )
        return [WorkerSubscription(inner, t) for inner, t in zip(inners, resolved)]

    def stats(self) -> Dict[str, int]:
        """A few of the node's counters, by name."""
        return self._inner.stats()

    def close(self) -> None:
        """Leaves the group and stops (the embedded membership service, if any, too).
        Subscriptions then end (``ClosedError``, the end of iteration) once their queued
        messages are taken; publishing raises ``ClosedError``. Closing twice does nothing."""
        self._inner.close()
        _live.discard(self)

    def __enter__(self) -> "Node":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"gms={self.gms_addr!r}"
        return f"Node(id={self.id}, {state})"


def _report(
    name: str, on_error: Optional[Callable[[BaseException], Any]], error: BaseException
) -> None:
    """Hands a callback subscription's error to ``on_error``, or prints it to stderr (with what
    ``on_error`` raised, if it raised)."""
    if on_error is not None:
        try:
            on_error(error)
            return
        except Exception as e:  # noqa: BLE001 - reported below, the deliveries go on
            error = e
    print(f"tidings: callback subscription to {name!r}:", file=sys.stderr)
    traceback.print_exception(type(error), error, error.__traceback__, file=sys.stderr)


def _deliverer(
    name: str,
    callback: Callable[["Message"], Any],
    on_error: Optional[Callable[[BaseException], Any]],
) -> Callable[[Union["Message", BaseException]], None]:
    """What the delivery workers call for each item of a ``subscribe_many`` topic: the message
    goes to ``callback``, an exception in its place (and what the callback raises) to
    ``_report``."""

    def deliver(item: Union["Message", BaseException]) -> None:
        if isinstance(item, BaseException):
            _report(name, on_error, item)
            return
        try:
            callback(item)
        except Exception as e:  # noqa: BLE001 - the callback's own error, reported
            _report(name, on_error, e)

    return deliver


def _config_error(message: str) -> BaseException:
    return _tidings.ConfigError(f"invalid configuration: {message}")


@dataclass(frozen=True)
class Bottleneck:
    """A subscription's state as the bottleneck of its topic (``Subscription.bottleneck()``):
    a full queue holds the topic's streams at its node."""

    since: Optional[float]
    """For how many seconds the subscription has been full with its topic held (``None``: it
    is not now)."""
    times: int
    """How many times it has become the bottleneck."""


class _OnTopic:
    """What every handle on one topic has: the topic, its name and its id."""

    topic: "Topic[Any]"
    _inner: Any

    @property
    def name(self) -> str:
        """The topic's name."""
        return self.topic.name

    @property
    def topic_id(self) -> int:
        """The topic's id, as the membership service bound it."""
        return int(self._inner.topic_id)


_Closing = TypeVar("_Closing", bound="_Closable")


class _Closable(_OnTopic):
    """A subscription: its share of the delivery workers, and closing it (also by leaving its
    ``with`` block) unsubscribes."""

    @property
    def closed(self) -> bool:
        """Whether the subscription was closed."""
        return bool(self._inner.closed)

    def set_share(self, share: float) -> None:
        """Changes the share of the delivery workers' time this subscription's deliveries get
        when topics compete, in (0, 1] (the node's ``subscription_share`` until changed).
        ``ConfigError`` for a share outside it; ``ClosedError`` once closed."""
        self._inner.set_share(share)

    def close(self) -> None:
        """Unsubscribes. Closing twice does nothing."""
        self._inner.close()

    def unsubscribe(self) -> None:
        """Unsubscribes (``close``)."""
        self.close()

    def __enter__(self: _Closing) -> _Closing:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Publisher(_OnTopic, Generic[T]):
    """Publishes on one topic. Messages of one publisher are delivered in the order they were
    published; use one publisher from one thread (or task) at a time.

    ``publish`` waits while back pressure holds (with the GIL released); ``try_publish``
    raises ``WouldBlock`` instead; ``await publish_async`` waits in asyncio. Each returns a
    ``PublishHandle``: ``handle.wait_stable(timeout)``, or ``await handle``, waits until the
    message (and every earlier one of this publisher) is stable, received by every member of
    every region its topic spans.
    """

    _inner: _tidings.Publisher

    def __init__(self, inner: _tidings.Publisher, topic: "Topic[T]") -> None:
        self._inner = inner
        self.topic = topic
        # The extension's methods themselves, so a publish costs no Python call of its own (the
        # methods of the class below document them).
        self.publish = inner.publish  # type: ignore[method-assign]
        self.try_publish = inner.try_publish  # type: ignore[method-assign]

    @property
    def max_payload(self) -> int:
        """Largest encoded message accepted, in bytes (``TooLargeError`` beyond)."""
        return self._inner.max_payload

    @property
    def published_count(self) -> int:
        """Messages this publisher has published."""
        return self._inner.published_count

    def publish(self, value: T, timeout: Optional[float] = None) -> PublishHandle:
        """Publishes ``value``, waiting while back pressure holds, at most ``timeout`` seconds
        (``None``: until there is room or the node closes; Ctrl-C interrupts the wait)."""
        return self._inner.publish(value, timeout)

    def publish_many(
        self, values: Iterable[T], timeout: Optional[float] = None
    ) -> Optional[PublishHandle]:
        """Publishes every value of ``values`` in order, as ``publish`` does each, in one call
        into the library (the whole call waits at most ``timeout`` seconds). Returns the last
        message's handle (``None`` for no values). If it raises, the values before the failing
        one were published (``published_count`` says how many)."""
        return self._inner.publish_many(values, timeout)

    def try_publish(self, value: T) -> PublishHandle:
        """Publishes ``value`` without waiting: raises ``WouldBlock`` under back pressure."""
        return self._inner.try_publish(value)

    async def publish_async(self, value: T) -> PublishHandle:
        """Publishes ``value`` from asyncio: under back pressure the task waits, not the
        thread. Cancelled while waiting, the value is not published."""
        data = self._inner.encode(value)
        poll = self._inner.poll_publish
        handle: PublishHandle = await poll_until(lambda wake: poll(data, wake))
        return handle

    def is_stable(self, handle: PublishHandle) -> bool:
        """Whether ``handle``'s message (and every earlier one) is stable."""
        return handle.is_stable()

    def wait_stable(self, handle: PublishHandle, timeout: Optional[float] = None) -> None:
        """Waits until ``handle``'s message and every earlier one are stable, at most
        ``timeout`` seconds: ``TimeoutError``, or ``NotStableError`` naming what holds it."""
        handle.wait_stable(timeout)

    async def wait_stable_async(self, handle: PublishHandle) -> None:
        """Waits from asyncio until ``handle``'s message is stable (``await handle`` too)."""
        await handle

    def __repr__(self) -> str:
        return f"Publisher({self.topic!r})"


class Subscription(_Closable, Generic[T]):
    """A subscription read from its queue: every message of the topic, in each publisher's
    order, as ``Message`` objects (``.value``, ``.origin``, ``.topic``).

    Read it with ``recv(timeout)``, ``try_recv()``, ``recv_many(n, timeout)`` (a batch per
    call, so a Python loop keeps up), as an iterator (``for message in subscription``, which
    ends when the subscription does), or from asyncio (``await recv_async()``,
    ``async for``). A message the codec cannot decode raises ``DecodeError`` in its place;
    a disconnected slow consumer gets ``SlowConsumerError`` after its queued messages.
    Closing it (or leaving its ``with`` block) unsubscribes.
    """

    _inner: _tidings.Subscription

    def __init__(self, inner: _tidings.Subscription, topic: "Topic[T]") -> None:
        self._inner = inner
        self.topic = topic
        # The extension's methods themselves, so a receive costs no Python call of its own (the
        # methods of the class below document them).
        self.recv = inner.recv  # type: ignore[method-assign]
        self.try_recv = inner.try_recv  # type: ignore[method-assign]
        self.recv_many = inner.recv_many  # type: ignore[method-assign]
        self._async_lock: Optional[asyncio.Lock] = None
        self._async_loop: Optional[asyncio.AbstractEventLoop] = None

    @property
    def queued(self) -> int:
        """Messages queued and not yet taken."""
        return self._inner.queued

    def bottleneck(self) -> Bottleneck:
        """Whether this subscription holds its topic back now (its queue is full), since
        when, and how many times it has. Raises ``ClosedError`` once closed."""
        since, times = self._inner.bottleneck()
        return Bottleneck(since, times)

    def recv(self, timeout: Optional[float] = None) -> Message:
        """The next message, waiting at most ``timeout`` seconds (``None``: as long as it
        takes). ``TimeoutError`` if none came; ``ClosedError`` once the subscription ended
        and every queued message was taken."""
        return self._inner.recv(timeout)

    def try_recv(self) -> Message:
        """The next message if one is queued; ``EmptyError`` if none is."""
        return self._inner.try_recv()

    def recv_many(self, n: int, timeout: Optional[float] = None) -> List[Message]:
        """Up to ``n`` messages: waits at most ``timeout`` seconds for the first, then takes
        those already queued (without releasing the GIL: taking them never waits). An empty
        list if none came in time.

        Each ``Message`` counts toward the threshold of Python's cyclic garbage collector
        (700 new objects by default) while it lives: a loop that drops each batch once
        handled and takes a few hundred per call (``n=512``) triggers no collection, while
        ``n`` above the threshold triggers one per full batch."""
        return self._inner.recv_many(n, timeout)

    async def recv_async(self) -> Message:
        """The next message, from asyncio: the task waits, not the thread. Several tasks may
        wait on one subscription; they take messages in turn. Cancelled while waiting, no
        message is taken."""
        loop = asyncio.get_running_loop()
        if self._async_lock is None or self._async_loop is not loop:
            self._async_lock, self._async_loop = asyncio.Lock(), loop
        async with self._async_lock:
            message: Message = await poll_until(self._inner.poll_recv)
            return message

    def __iter__(self) -> Iterator[Message]:
        return self

    def __next__(self) -> Message:
        try:
            return self._inner.recv(None)
        except ClosedError:
            raise StopIteration from None

    def __aiter__(self) -> AsyncIterator[Message]:
        return self

    async def __anext__(self) -> Message:
        try:
            return await self.recv_async()
        except ClosedError:
            raise StopAsyncIteration from None

    def __repr__(self) -> str:
        return f"Subscription({self.topic!r}, queued={self.queued})"


class CallbackSubscription(_Closable):
    """A subscription whose messages go to a callback, on a thread of its own, in order.

    The subscription's queue, capacity and slow-consumer policy apply as to a read one: a
    callback slower than its topic slows the topic down (or, under ``Disconnect``, is
    disconnected with ``SlowConsumerError``). Closing it unsubscribes and waits for the
    callback in progress to return.
    """

    _inner: _tidings.Subscription

    def __init__(
        self,
        subscription: "Subscription[Any]",
        callback: Callable[["Message"], Any],
        on_error: Optional[Callable[[BaseException], Any]],
    ) -> None:
        self._subscription = subscription
        self.topic = subscription.topic
        self._inner = subscription._inner
        self._callback = callback
        self._on_error = on_error
        self._thread = threading.Thread(
            target=self._run, name=f"tidings-callback-{subscription.name}", daemon=True
        )
        self._thread.start()

    def bottleneck(self) -> Bottleneck:
        """Whether the callback holds its topic back now (its queue is full), since when,
        and how many times it has."""
        return self._subscription.bottleneck()

    def _report(self, error: BaseException) -> None:
        _report(self.name, self._on_error, error)

    def _run(self) -> None:
        recv = self._subscription._inner.recv
        while True:
            try:
                message = recv(None)
            except ClosedError:
                return
            except TidingsError as e:
                self._report(e)
                continue
            try:
                self._callback(message)
            except Exception as e:  # noqa: BLE001 - the callback's own error, reported
                self._report(e)

    def close(self, timeout: Optional[float] = 5.0) -> None:
        """Unsubscribes and waits at most ``timeout`` seconds for the callback thread to end."""
        self._subscription.close()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def __repr__(self) -> str:
        return f"CallbackSubscription({self._subscription.topic!r})"


class WorkerSubscription(_Closable):
    """A subscription of ``Node.subscribe_many``: its callback runs on the node's delivery
    workers, in order within the topic, with no queue of its own.

    A callback slower than its topic fills its delivery task's queue in the node's scheduler,
    and the topic is then held at this node (its publishers slow down, other topics go on)
    until the callback catches up. Closing it unsubscribes: messages not yet delivered are
    dropped, a call already running finishes.
    """

    _inner: _tidings.WorkerSubscription

    def __init__(self, inner: _tidings.WorkerSubscription, topic: "Topic[Any]") -> None:
        self._inner = inner
        self.topic = topic

    def __repr__(self) -> str:
        return f"WorkerSubscription({self.topic!r})"
