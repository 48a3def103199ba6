"""Type stubs of the extension module ``tidings._tidings`` (the Rust library through PyO3).

Applications use the ``tidings`` package, which wraps these classes; ``Message``,
``PublishHandle`` and the exceptions are re-exported from it as they are.
"""

from typing import Any, Callable, Dict, Final, Iterable, List, Optional, Tuple, Union, final

TOPIC_NAME_BYTES_MAX: Final[int]
LOCAL_GMS_PORT: Final[int]

def check_topic_name(name: str) -> None:
    """Raises ``TopicNameError`` unless ``name`` is 1..=TOPIC_NAME_BYTES_MAX bytes of UTF-8."""

def waiting() -> int:
    """How many threads are outside the interpreter in the extension and will come back."""

def begin_exit() -> None:
    """From now on no call leaves the interpreter (called at exit, once the nodes are closed)."""

class TidingsError(Exception):
    """Base class of every error tidings raises."""

class ConfigError(TidingsError):
    """A configuration value cannot work; the message names the field."""

class BindError(TidingsError):
    """The node's socket could not be bound."""

class StartError(TidingsError):
    """The node could not start (socket, membership service, protocol configuration)."""

class MetricsError(TidingsError):
    """The metrics endpoint could not start."""

class GmsError(TidingsError):
    """The embedded membership service could not start."""

class TopicNameError(TidingsError):
    """A topic name is empty or too long."""

class WouldBlock(TidingsError):
    """Back pressure (from try_publish)."""

class TimeoutError(TidingsError):
    """A wait ran out of time."""

class EmptyError(TidingsError):
    """try_recv found no message queued."""

class NotStableError(TimeoutError):
    """A wait for stability ran out of time while regions did not acknowledge."""

class TooLargeError(TidingsError):
    """The encoded message does not fit one datagram."""

    len: int
    max: int

class EncodeError(TidingsError):
    """The value could not be encoded by the topic's codec."""

class DecodeError(TidingsError):
    """A received message could not be decoded by the subscription's codec."""

    topic: str
    why: str

class RefusedError(TidingsError):
    """The node refused the request."""

class TopicRefusedError(RefusedError):
    """The membership service's access rules refused a subscription or publisher."""

    topic: str
    action: str
    rule: str

class SlowConsumerError(TidingsError):
    """The subscription's reader fell behind and was disconnected."""

    topic: str
    capacity: int
    waited: float

class ClosedError(TidingsError):
    """The node has shut down, or the subscription has ended."""

class ShutdownError(TidingsError):
    """The node's core thread panicked while shutting down."""

@final
class Message:
    """One delivered message."""

    @property
    def value(self) -> Any:
        """The value, decoded by the subscription's codec (bytes on a bytes topic)."""
    @property
    def origin(self) -> int:
        """The id of the node that published it."""
    @property
    def topic(self) -> str:
        """The topic's name."""
    @property
    def topic_id(self) -> int:
        """The topic's id."""
    @property
    def sent_at_us(self) -> int:
        """When it was published, in microseconds since the Unix epoch by the publisher's
        clock (its wall clock read once when its process started, advanced monotonically)."""

@final
class PublishHandle:
    """Identifies one published message; await it, or call ``wait_stable``."""

    @property
    def ticket(self) -> int:
        """The message's position among its publisher's messages, from 1."""
    def is_stable(self) -> bool:
        """Whether the message (and every earlier one of its publisher) is stable."""
    def wait_stable(self, timeout: Optional[float] = None) -> None:
        """Waits until the message is stable, at most ``timeout`` seconds."""
    def poll_stable(self, wake: Callable[[], None]) -> bool:
        """One step of awaiting the handle."""
    def __await__(self) -> Any: ...

@final
class Node:
    """A node; wrapped by ``tidings.Node``."""

    def __init__(
        self,
        gms: str,
        gms_addrs: List[str],
        bind: str,
        transport: str,
        subscription_capacity: int,
        subscription_share: float,
        metrics: Optional[str] = None,
    ) -> None: ...
    @property
    def id(self) -> int: ...
    @property
    def local_addr(self) -> str: ...
    @property
    def gms_addrs(self) -> List[str]: ...
    @property
    def metrics_addr(self) -> Optional[str]: ...
    @property
    def closed(self) -> bool: ...
    def publisher(
        self, name: str, encode: Optional[Callable[[Any], bytes]] = None
    ) -> "Publisher": ...
    def subscribe(
        self,
        name: str,
        capacity: Optional[int] = None,
        disconnect_after: Optional[float] = None,
        decode: Optional[Callable[[bytes], Any]] = None,
    ) -> "Subscription": ...
    def publishers(
        self, topics: List[Tuple[str, Optional[Callable[[Any], bytes]]]]
    ) -> List["Publisher"]: ...
    def subscribe_many(
        self,
        topics: List[
            Tuple[str, Optional[Callable[[bytes], Any]], Callable[[Union[Message, BaseException]], None]]
        ],
    ) -> List["WorkerSubscription"]: ...
    def stats(self) -> Dict[str, int]: ...
    def close(self) -> None: ...

@final
class Publisher:
    """A publisher; wrapped by ``tidings.Publisher``."""

    @property
    def name(self) -> str: ...
    @property
    def topic_id(self) -> int: ...
    @property
    def max_payload(self) -> int: ...
    @property
    def published_count(self) -> int: ...
    def encode(self, value: Any) -> bytes: ...
    def publish(self, value: Any, timeout: Optional[float] = None) -> PublishHandle: ...
    def publish_many(
        self, values: Iterable[Any], timeout: Optional[float] = None
    ) -> Optional[PublishHandle]: ...
    def try_publish(self, value: Any) -> PublishHandle: ...
    def poll_publish(self, data: bytes, wake: Callable[[], None]) -> Optional[PublishHandle]: ...

@final
class Subscription:
    """A subscription; wrapped by ``tidings.Subscription``."""

    @property
    def name(self) -> str: ...
    @property
    def topic_id(self) -> int: ...
    @property
    def queued(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    def bottleneck(self) -> Tuple[Optional[float], int]: ...
    def set_share(self, share: float) -> None: ...
    def recv(self, timeout: Optional[float] = None) -> Message: ...
    def try_recv(self) -> Message: ...
    def recv_many(self, n: int, timeout: Optional[float] = None) -> List[Message]: ...
    def poll_recv(self, wake: Callable[[], None]) -> Optional[Message]: ...
    def close(self) -> None: ...

@final
class WorkerSubscription:
    """A subscription whose callable runs on the node's delivery workers; wrapped by
    ``tidings.WorkerSubscription``."""

    @property
    def name(self) -> str: ...
    @property
    def topic_id(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    def set_share(self, share: float) -> None: ...
    def close(self) -> None: ...
