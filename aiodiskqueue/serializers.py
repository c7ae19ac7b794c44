"""Serializers for typed queues (:mod:`aiodiskqueue.typed`): objects in, bytes on disk.

The core stores bytes only; this layer is optional and never used unless asked for.

* :class:`JsonSerializer` — UTF-8 JSON, compact, ``NaN`` and ``Infinity`` refused.
* :class:`MsgpackSerializer` — MessagePack, needs the ``msgpack`` extra
  (``pip install "asyncio-diskqueue[msgpack]"``), imported only when used.
* :class:`PickleSerializer` — any picklable object. **Never the default, and never
  for queues another party can write to**: unpickling a crafted record runs
  arbitrary code in the consumer. Use it only for files only your own code writes.

Any object with ``dumps(value) -> bytes`` and ``loads(data) -> value`` is a
:class:`Serializer`. A serializer's own exceptions are turned into
:class:`SerializationError` / :class:`DeserializationError` by the typed queue.
"""

from __future__ import annotations

import importlib
import json
import pickle
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar, final

from .errors import DeserializationError, MissingExtra, SerializationError

__all__ = [
    "DeserializationError",
    "JsonSerializer",
    "MissingExtra",
    "MsgpackSerializer",
    "PickleSerializer",
    "SerializationError",
    "Serializer",
]

T = TypeVar("T")


class Serializer(Protocol[T]):
    """Turns values of type ``T`` into bytes and back."""

    def dumps(self, value: T, /) -> bytes:
        """The bytes stored for ``value``; raises any exception if it cannot be stored."""
        ...

    def loads(self, data: bytes, /) -> T:
        """The value stored as ``data``; raises any exception if ``data`` is not one."""
        ...


@final
class JsonSerializer(Generic[T]):
    """UTF-8 JSON (compact, no ASCII escaping; ``NaN``/``Infinity`` raise).

    ``T`` is what the queue's ``get()`` is typed to return; JSON itself gives back
    dicts, lists, str, int, float, bool and None (tuples come back as lists, dict
    keys as str). ``default`` and ``object_hook`` are passed to :mod:`json`.
    Write ``JsonSerializer[dict[str, int]]()`` to say what ``T`` is.
    """

    def __init__(self, *, default: Callable[[Any], Any] | None = None,
                 object_hook: Callable[[dict[str, Any]], Any] | None = None) -> None:
        self._default = default
        self._object_hook = object_hook

    def dumps(self, value: T, /) -> bytes:
        """JSON text of ``value`` as UTF-8."""
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False,
                          default=self._default).encode("utf-8")

    def loads(self, data: bytes, /) -> T:
        """The value of the JSON text ``data``."""
        value: T = json.loads(data, object_hook=self._object_hook)
        return value


@final
class PickleSerializer(Generic[T]):
    """Any picklable object, with ``protocol`` (default: the highest).

    **Danger**: ``loads`` runs whatever code a crafted record asks for. Use it only
    for queues written by your own code alone; it is never a default.
    """

    def __init__(self, *, protocol: int = pickle.HIGHEST_PROTOCOL) -> None:
        if isinstance(protocol, bool) or not isinstance(protocol, int) \
                or not 0 <= protocol <= pickle.HIGHEST_PROTOCOL:
            raise ValueError(f"protocol must be an int in [0, {pickle.HIGHEST_PROTOCOL}], "
                             f"got {protocol!r}")
        self._protocol = protocol

    def dumps(self, value: T, /) -> bytes:
        """``pickle.dumps(value)``."""
        return pickle.dumps(value, protocol=self._protocol)

    def loads(self, data: bytes, /) -> T:
        """``pickle.loads(data)``: only for data your own code wrote."""
        value: T = pickle.loads(data)  # documented danger: trusted queues only
        return value


@final
class MsgpackSerializer(Generic[T]):
    """MessagePack through the ``msgpack`` package (the ``msgpack`` extra).

    bytes stay bytes and str stays str (``use_bin_type``, ``raw=False``); tuples
    come back as lists. ``default`` and ``ext_hook`` are passed to msgpack.

    Raises MissingExtra at construction if msgpack is not installed.
    """

    def __init__(self, *, default: Callable[[Any], Any] | None = None,
                 ext_hook: Callable[[int, bytes], Any] | None = None) -> None:
        try:
            msgpack = importlib.import_module("msgpack")
        except ImportError as exc:
            raise MissingExtra('MsgpackSerializer needs msgpack: '
                               'pip install "asyncio-diskqueue[msgpack]"') from exc
        self._packb: Callable[..., bytes] = msgpack.packb
        self._unpackb: Callable[..., Any] = msgpack.unpackb
        self._default = default
        self._ext = {} if ext_hook is None else {"ext_hook": ext_hook}

    def dumps(self, value: T, /) -> bytes:
        """MessagePack bytes of ``value``."""
        return self._packb(value, use_bin_type=True, default=self._default)

    def loads(self, data: bytes, /) -> T:
        """The value of the MessagePack bytes ``data`` (all of them: trailing bytes raise)."""
        value: T = self._unpackb(data, raw=False, **self._ext)
        return value
