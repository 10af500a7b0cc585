"""One way to declare a service's settings: a frozen dataclass, range-checked, from CLI over environment over defaults.

A service declares its settings as a frozen dataclass whose
``__post_init__`` calls :func:`check_ranges` (and any checks of its own),
and builds them with :func:`settings_from_env`::

    @dataclasses.dataclass(frozen=True)
    class SinkSettings:
        flush_records: int = 100_000
        flush_seconds: float = 5.0

        def __post_init__(self) -> None:
            check_ranges(self, {"flush_records": (1, 1 << 30), "flush_seconds": (0.01, 3600.0)})

    SinkSettings.from_env = classmethod(lambda cls, environ=None, **kw: settings_from_env(cls, "LDP_SINK_", environ, kw))

Values passed explicitly (the command line; ``None`` means "not given") win
over the environment (``<PREFIX><FIELD>``, e.g. ``LDP_SINK_FLUSH_RECORDS``,
or an alias such as ``LDP_TRANSPORT``), which wins over the defaults. Every
invalid value is a :class:`~pipeline.errors.ConfigError` that names the
setting and its valid range.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any, TypeVar

from pipeline.errors import ConfigError
from pipeline.transport.base import check_topic_name

__all__ = ["check_ranges", "check_topics", "check_names", "default_member", "settings_from_env", "parse_env_value"]

T = TypeVar("T")


def check_ranges(obj: Any, ranges: Mapping[str, tuple[float, float]]) -> None:
    """Raise :class:`ConfigError` unless each named field of ``obj`` lies in its inclusive ``(lo, hi)``.

    A field whose dataclass type (or default) is ``float`` accepts ints and
    floats; any other field must be an ``int`` (never a ``bool``).
    """
    types = {f.name: f for f in dataclasses.fields(obj)}
    for name, (lo, hi) in ranges.items():
        val = getattr(obj, name)
        integral = not _is_float_field(types[name])
        ok = not isinstance(val, bool) and isinstance(val, int if integral else (int, float)) and lo <= val <= hi
        if not ok:
            kind = "an integer" if integral else "a number"
            bounds = f"{lo} to {hi}" if integral else f"{lo:g} to {hi:g}"  # 16777216, not 1.67772e+07
            raise ConfigError(f"{name} must be {kind} from {bounds}, got {val!r}")


def check_topics(obj: Any, *names: str) -> None:
    """Raise :class:`ConfigError` unless each named field of ``obj`` is a valid topic name."""
    for name in names:
        try:
            check_topic_name(getattr(obj, name))
        except ValueError as exc:
            raise ConfigError(f"{name}: {exc}") from None


def default_member(role: str, *, host: str | None = None, pid: int | None = None) -> str:
    """A consumer-group member name no other process shares: ``<role>-<host>-<pid>``.

    The host name (``socket.gethostname()``: a container's id in a container) is cut to 60 characters and
    every character outside ``[A-Za-z0-9._-]`` becomes ``-``, so the name is also a valid Kafka
    ``group.instance.id`` and transactional id. It changes with every start: a worker that must find its
    place (and fence its predecessor's open transaction) after a restart is given a stable ``--member``.
    """
    import re
    import socket

    h = re.sub(r"[^A-Za-z0-9._-]", "-", (host if host is not None else socket.gethostname())[:60]) or "host"
    return f"{role}-{h}-{os.getpid() if pid is None else pid}"


def check_names(obj: Any, *names: str, optional: tuple[str, ...] = ()) -> None:
    """Raise :class:`ConfigError` unless each named field (consumer group, member name) is a non-empty string
    of at most 200 characters; those in ``optional`` may also be ``None``."""
    for name in (*names, *optional):
        v = getattr(obj, name)
        if v is None and name in optional:
            continue
        if not isinstance(v, str) or not v or len(v) > 200:
            raise ConfigError(f"{name} must be a non-empty string, got {v!r}")


def _is_float_field(field: dataclasses.Field[Any]) -> bool:
    if isinstance(field.default, float):
        return True
    return field.type in (float, "float", "float | None")


def parse_env_value(field: dataclasses.Field[Any], raw: str, env_name: str) -> Any:
    """``raw`` (an environment variable's text) as the type of ``field``'s default."""
    default = field.default
    try:
        if isinstance(default, bool) or field.type in (bool, "bool"):
            return raw.strip().lower() in ("1", "true", "yes", "on")
        if isinstance(default, int) or field.type in (int, "int", "int | None"):
            return int(raw)
        if _is_float_field(field):
            return float(raw)
    except ValueError:
        raise ConfigError(f"${env_name}={raw!r} is not a number") from None
    return raw


def settings_from_env(
    cls: type[T],
    prefix: str,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    *,
    aliases: Mapping[str, str] | None = None,
) -> T:
    """An instance of the settings dataclass ``cls``: ``overrides`` (``None`` ignored) over ``environ`` over defaults.

    ``environ`` defaults to ``os.environ``; field ``f`` is read from
    ``<prefix><F>`` and then from ``aliases[f]``. Unknown override names are
    a :class:`ConfigError`.
    """
    env = os.environ if environ is None else environ
    aliases = aliases or {}
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    for name, f in fields.items():
        key = prefix + name.upper()
        raw = env.get(key)
        if raw is None and name in aliases:
            key = aliases[name]
            raw = env.get(key)
        if raw is not None:
            values[name] = parse_env_value(f, raw, key)
    for name, value in (overrides or {}).items():
        if name not in fields:
            raise ConfigError(f"{cls.__name__} has no setting {name!r}; it has {sorted(fields)}")
        if value is not None:
            values[name] = value
    return cls(**values)
