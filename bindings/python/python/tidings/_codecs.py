"""Codecs: how a topic's values become bytes and back."""

from __future__ import annotations

import json
from typing import Any, Optional, Protocol, TypeVar, runtime_checkable

T = TypeVar("T")

__all__ = [
    "Codec",
    "BytesCodec",
    "StrCodec",
    "JsonCodec",
    "MsgpackCodec",
    "BYTES",
    "STR",
    "JSON",
    "MSGPACK",
]


@runtime_checkable
class Codec(Protocol[T]):
    """What a topic's codec does: ``encode`` a value into bytes, ``decode`` bytes into a value.

    ``encode`` raises (any exception) for a value it does not take: the publisher raises
    ``EncodeError`` with that exception as its cause. ``decode`` raises for bytes that are not
    one of its values: the subscription raises ``DecodeError`` in the message's place.
    Every process must use the same codec for a topic name.
    """

    def encode(self, value: T) -> bytes:
        """The value as bytes."""
        ...

    def decode(self, data: bytes) -> T:
        """The value these bytes encode."""
        ...


class BytesCodec:
    """Bytes as they are (``bytes`` or ``bytearray`` published, ``bytes`` received): the
    default, and the fastest (the extension handles it without calling Python)."""

    def encode(self, value: bytes) -> bytes:
        """The bytes themselves (a ``bytearray`` too)."""
        if isinstance(value, (bytes, bytearray)):
            return bytes(value)
        raise TypeError(f"a bytes topic takes bytes or bytearray, not {type(value).__name__}")

    def decode(self, data: bytes) -> bytes:
        """The bytes themselves."""
        return data

    def __repr__(self) -> str:
        return "BYTES"


class StrCodec:
    """Text, as UTF-8."""

    def encode(self, value: str) -> bytes:
        """The text in UTF-8; a ``TypeError`` for anything but ``str``."""
        if not isinstance(value, str):
            raise TypeError(f"a str topic takes str, not {type(value).__name__}")
        return value.encode("utf-8")

    def decode(self, data: bytes) -> str:
        """The text; a ``UnicodeDecodeError`` for bytes that are not UTF-8."""
        return data.decode("utf-8")

    def __repr__(self) -> str:
        return "STR"


class JsonCodec:
    """Any value the ``json`` module takes (dicts, lists, str, numbers, bools, None), as compact
    UTF-8 JSON. ``dumps`` options (``default=``, ``sort_keys=``...) can be given."""

    def __init__(self, **dumps_options: Any) -> None:
        self._options = {"separators": (",", ":"), "ensure_ascii": False, **dumps_options}

    def encode(self, value: Any) -> bytes:
        """The value as JSON; a ``TypeError`` for a value JSON cannot carry."""
        return json.dumps(value, **self._options).encode("utf-8")

    def decode(self, data: bytes) -> Any:
        """The value; a ``ValueError`` for bytes that are not JSON."""
        return json.loads(data)

    def __repr__(self) -> str:
        return "JSON"


class MsgpackCodec:
    """Any value msgpack takes, through the ``msgpack`` package (``pip install msgpack``, or
    ``pip install tidings[msgpack]``): smaller and faster than JSON, and it carries bytes.
    Creating the codec does not need the package; using it does, and says so if it is missing.
    """

    def __init__(self) -> None:
        self._packb: Optional[Any] = None
        self._unpackb: Optional[Any] = None

    def _load(self) -> None:
        try:
            import msgpack  # type: ignore[import-not-found,import-untyped,unused-ignore]
        except ImportError as e:
            raise ImportError(
                "the msgpack codec needs the msgpack package: pip install msgpack"
            ) from e
        self._packb = msgpack.packb
        self._unpackb = msgpack.unpackb

    def encode(self, value: Any) -> bytes:
        """The value as msgpack; a ``TypeError`` for a value msgpack cannot carry."""
        if self._packb is None:
            self._load()
        assert self._packb is not None
        data: bytes = self._packb(value, use_bin_type=True)
        return data

    def decode(self, data: bytes) -> Any:
        """The value; an error of msgpack for bytes that are not msgpack."""
        if self._unpackb is None:
            self._load()
        assert self._unpackb is not None
        return self._unpackb(data, raw=False)

    def __repr__(self) -> str:
        return "MSGPACK"


BYTES = BytesCodec()
"""Bytes as they are: the codec of a topic given by name alone."""
STR = StrCodec()
"""Text, as UTF-8."""
JSON = JsonCodec()
"""Values of the ``json`` module, as compact JSON."""
MSGPACK = MsgpackCodec()
"""Values msgpack takes, through the ``msgpack`` package."""
