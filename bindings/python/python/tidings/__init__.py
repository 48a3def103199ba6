"""tidings: reliable multicast and publish-subscribe for applications whose processes share
many topics at once.

Every subscriber of a topic gets every message published on it, exactly once and in the order
each publisher sent them, while it stays a member. A publisher can wait until a message is
*stable*: received by every member of every region its topic spans.

>>> import tidings
>>> with tidings.Node(gms="private") as node:
...     subscription = node.subscribe(tidings.Topic("greetings", tidings.STR))
...     publisher = node.publisher(tidings.Topic("greetings", tidings.STR))
...     handle = publisher.publish("hello")
...     handle.wait_stable(timeout=5)
...     subscription.recv(timeout=5).value
'hello'

The Rust library does the work (``tidings._tidings``, built with PyO3); every wait releases
the GIL, and Ctrl-C interrupts it.
"""

from ._api import (
    Bottleneck,
    CallbackSubscription,
    Disconnect,
    Node,
    Publisher,
    SlowDown,
    Subscription,
    Topic,
    WorkerSubscription,
)
from ._codecs import (
    BYTES,
    JSON,
    MSGPACK,
    STR,
    BytesCodec,
    Codec,
    JsonCodec,
    MsgpackCodec,
    StrCodec,
)
from ._tidings import (
    LOCAL_GMS_PORT,
    TOPIC_NAME_BYTES_MAX,
    BindError,
    ClosedError,
    ConfigError,
    DecodeError,
    EmptyError,
    EncodeError,
    GmsError,
    Message,
    MetricsError,
    NotStableError,
    PublishHandle,
    RefusedError,
    ShutdownError,
    SlowConsumerError,
    StartError,
    TidingsError,
    TimeoutError,
    TooLargeError,
    TopicNameError,
    TopicRefusedError,
    WouldBlock,
)

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
    "Message",
    "PublishHandle",
    "Codec",
    "BytesCodec",
    "StrCodec",
    "JsonCodec",
    "MsgpackCodec",
    "BYTES",
    "STR",
    "JSON",
    "MSGPACK",
    "LOCAL_GMS_PORT",
    "TOPIC_NAME_BYTES_MAX",
    "TidingsError",
    "ConfigError",
    "BindError",
    "StartError",
    "MetricsError",
    "GmsError",
    "TopicNameError",
    "WouldBlock",
    "TimeoutError",
    "EmptyError",
    "NotStableError",
    "TooLargeError",
    "EncodeError",
    "DecodeError",
    "RefusedError",
    "TopicRefusedError",
    "SlowConsumerError",
    "ClosedError",
    "ShutdownError",
]
