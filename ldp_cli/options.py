"""Options and set-up shared by the ``ldp`` sub-commands.

The long-lived workers (``collector``, ``shuffler``, ``estimator``, ``sink``,
``fl job``) take the same ``--transport``, ``--metrics``, ``--group``,
``--member``, ``--session-timeout``, ``--idle-exit`` and ``--log-level``
options, set up logging the same way and stop on SIGTERM or Ctrl-C the same
way; each is declared once here.

The metrics file is required by every worker that reads reports, in one way:
``--metrics FILE`` (repeatable where old specs must stay readable), else
``$LDP_METRICS``, else :func:`metrics_files` raises
:class:`~pipeline.errors.ConfigError` and the command exits 2 with
``no metrics file: pass --metrics FILE or set $LDP_METRICS``. No command falls
back to the example metrics file.

Only the standard library is imported at module level: ``ldp --help`` builds
every sub-command's parser, and must not load numba, pandas or uvicorn.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = [
    "LOG_LEVELS",
    "TRANSPORT_HELP",
    "NO_METRICS",
    "add_transport",
    "add_metrics",
    "add_group",
    "add_member",
    "add_session_timeout",
    "add_idle_exit",
    "add_log_level",
    "add_status_file",
    "metrics_files",
    "metrics_file",
    "optional_metrics_files",
    "setup_logging",
    "on_stop_signals",
    "stop_event",
    "bind_socket",
    "consume_forever",
    "add_shuffled_consumer",
    "ShuffledInput",
    "plain",
    "summary",
]

LOG_LEVELS = ["critical", "error", "warning", "info", "debug"]
TRANSPORT_HELP = "sqlite:///path or kafka://host:port (default $LDP_TRANSPORT)"
#: the message (and, through :class:`~pipeline.errors.ConfigError`, exit code 2) of every command without metrics
NO_METRICS = "no metrics file: pass --metrics FILE or set $LDP_METRICS"
_LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


# -- help text ----------------------------------------------------------------------
_ROLE = re.compile(r":(?:mod|class|func|meth|data|attr|exc|obj):`~?([^`]+)`")


def plain(text: str) -> str:
    """``text`` (reST, as in the docstrings) as plain text for ``--help``: a role such as ``:mod:`a.b``` becomes
    its target (``~a.b.C``: just ``C``), double backticks are dropped."""

    def target(m: re.Match[str]) -> str:
        name = m.group(1)
        return name.rsplit(".", 1)[-1] if m.group(0).split("`", 1)[1].startswith("~") else name

    return _ROLE.sub(target, text).replace("``", "")


def summary(doc: str | None) -> str | None:
    """The first paragraph of a module's docstring in plain text (:func:`plain`): a command's description."""
    if not doc:
        return None
    first = doc.strip().split("\n\n", 1)[0]
    return plain(" ".join(line.strip() for line in first.splitlines()))


# -- options ------------------------------------------------------------------------
def add_transport(p: argparse.ArgumentParser, help: str = TRANSPORT_HELP, dest: str = "transport") -> None:
    """``--transport URL`` (default None: the transport reads ``$LDP_TRANSPORT``)."""
    p.add_argument("--transport", dest=dest, default=None, help=help)


def add_metrics(p: argparse.ArgumentParser, help: str, *, repeatable: bool = False, dest: str = "metrics") -> None:
    """``--metrics FILE``, once or (``repeatable``) several times; None when not given (see :func:`metrics_files`)."""
    if repeatable:
        p.add_argument("--metrics", dest=dest, action="append", default=None, help=help)
    else:
        p.add_argument("--metrics", dest=dest, default=None, help=help)


def add_group(p: argparse.ArgumentParser, default: str | None, shown: str | None = None) -> None:
    """``--group NAME``, the consumer group; ``shown`` is the default as the help names it (when computed later)."""
    p.add_argument("--group", default=default, help=f"consumer group (default {shown or default})")


def add_member(p: argparse.ArgumentParser, default: str | None, help: str) -> None:
    """``--member NAME``, the group member's name (``help`` says what the default is and whether to keep it)."""
    p.add_argument("--member", default=default, help=help)


def add_session_timeout(
    p: argparse.ArgumentParser, default: float = 10.0, help: str | None = "group session timeout, seconds"
) -> None:
    p.add_argument("--session-timeout", type=float, default=default, help=help)


def add_idle_exit(p: argparse.ArgumentParser) -> None:
    p.add_argument("--idle-exit", type=float, default=None, help="exit after this many seconds without input")


def add_status_file(p: argparse.ArgumentParser) -> None:
    """``--status-file PATH``: keep a JSON file of the worker's state and counters (:mod:`pipeline.status`)."""
    p.add_argument(
        "--status-file",
        default=None,
        help="keep this JSON file of the state (ready or not) and counters, rewritten on each change and every "
        "5 s; `python -m pipeline.status PATH` checks it (a healthcheck)",
    )


def add_log_level(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log-level", default="warning", choices=LOG_LEVELS)


# -- the metrics file ---------------------------------------------------------------
def optional_metrics_files(given: str | Sequence[str] | None, environ: Mapping[str, str] | None = None) -> list[str]:
    """The metrics files given (``--metrics``, once or repeated), else ``[$LDP_METRICS]``, else ``[]``."""
    if isinstance(given, str):
        given = [given]
    files = [f for f in (given or []) if f]
    if files:
        return files
    env = (os.environ if environ is None else environ).get("LDP_METRICS")
    return [env] if env else []


def metrics_files(given: str | Sequence[str] | None, environ: Mapping[str, str] | None = None) -> list[str]:
    """Like :func:`optional_metrics_files`, but a :class:`~pipeline.errors.ConfigError` (:data:`NO_METRICS`)
    instead of ``[]``: a worker that reads reports never guesses which specs they were made under."""
    files = optional_metrics_files(given, environ)
    if not files:
        from pipeline.errors import ConfigError

        raise ConfigError(NO_METRICS)
    return files


def metrics_file(given: str | None, environ: Mapping[str, str] | None = None) -> str:
    """The one metrics file of a command that takes a single ``--metrics`` (see :func:`metrics_files`)."""
    return metrics_files(given, environ)[0]


# -- process set-up -----------------------------------------------------------------
class _StderrHandler(logging.StreamHandler):
    """A handler that writes to whatever ``sys.stderr`` is when a record is emitted.

    ``logging.basicConfig(stream=sys.stderr)`` binds the stream of the moment;
    a command run in-process (tests, the demo) would leave the root logger
    writing to a stream that has since been closed or replaced.
    """

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


class _OncePerTemplate(logging.Filter):
    """Let a record of a chatty third-party client (kafka-python's ``kafka.*`` loggers) through only once per
    ``every`` seconds per message template: a broker restart makes it log a line (often ERROR) per connection
    attempt, while the processor's own state line (``ldp.status``) already says the broker is gone. Their
    tracebacks are cut to the exception's one line (kept at ``--log-level debug``)."""

    def __init__(self, prefixes: tuple[str, ...] = ("kafka",), every: float = 600.0) -> None:
        super().__init__()
        self.prefixes = prefixes
        self.every = every
        self._last: dict[tuple[str, int, str], float] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(self.prefixes):
            return True

        key = (record.name, record.levelno, str(record.msg))
        now = time.monotonic()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.every:
                return False
            self._last[key] = now
        if record.exc_info and record.exc_info[1] is not None and logging.getLogger().level > logging.DEBUG:
            # kafka-python logs a broker's dropped connection with its traceback: one line says as much
            record.msg, record.args = f"{record.getMessage()}: {record.exc_info[1]!r}", ()
            record.exc_info, record.exc_text = None, None
        return True


def setup_logging(level: str | int, fmt: str = _LOG_FORMAT) -> None:
    """Log records at ``level`` and above to the current stderr, with ``fmt`` (once per process).

    Two exceptions to ``level``, both for the operator: the state changes of
    the stream processors (logger ``ldp.status``: "unreachable", "connected",
    "lost", "recovered") are shown from INFO up at any level but ``critical``
    and ``error``; kafka-python's loggers (``kafka.*``) are held at WARNING
    (unless ``level`` is ``debug``), each message template at most once every
    ten minutes, so that a broker restart does not fill the log with a
    traceback per connection attempt.
    """
    root = logging.getLogger()
    numeric = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    root.setLevel(numeric)
    if not any(isinstance(h, _StderrHandler) for h in root.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter(fmt))
        handler.addFilter(_OncePerTemplate())
        root.addHandler(handler)
    if isinstance(numeric, int) and numeric > logging.DEBUG:
        logging.getLogger("kafka").setLevel(max(logging.WARNING, numeric))
        if numeric <= logging.WARNING:
            logging.getLogger("ldp.status").setLevel(logging.INFO)


def on_stop_signals(handler: Callable[[int, Any], None]) -> None:
    """Install ``handler`` for SIGTERM and SIGINT (Ctrl-C)."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handler)


def stop_event(stop: threading.Event | None = None) -> threading.Event:
    """An event (``stop`` or a new one) that SIGTERM and Ctrl-C set: the worker finishes its step and exits."""
    ev = threading.Event() if stop is None else stop
    on_stop_signals(lambda *_: ev.set())
    return ev


def bind_socket(host: str, port: int, backlog: int | None = None) -> socket.socket:
    """A TCP socket bound to ``host:port`` (IPv6 if ``host`` has a colon; port 0 picks a free one), listening
    with ``backlog`` if given (connections then wait in the backlog until the server accepts them)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    if backlog is not None:
        sock.listen(backlog)
    return sock


def consume_forever(
    engine: Any,
    stop: threading.Event,
    *,
    idle_exit: float | None = None,
    backoff: Any = None,
    rng: Any = None,
) -> None:
    """Run ``engine`` (a :class:`~pipeline.processor.StreamProcessor`) until ``stop`` (or, with ``idle_exit``,
    until it was idle that long) under :meth:`~pipeline.processor.StreamProcessor.supervise`: the join is retried
    with backoff while the broker is down, a transient failure rejoins, a fatal one
    (:data:`~pipeline.processor.FATAL_ERRORS`) propagates."""
    engine.supervise(lambda: engine.run(stop=stop, idle_timeout=idle_exit), stop, backoff=backoff, rng=rng)
    if idle_exit is not None:
        stop.set()


# -- sealed metrics: the analyzer's keys ------------------------------------------------
def add_analyzer_keys(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--analyzer-keys",
        default=None,
        metavar="DIR",
        help="folder of the analyzer's private key files (ldp keys new) that open sealed metrics' records "
        "(default $LDP_ANALYZER_KEYS; required when a metrics file declares a sealed metric)",
    )
    p.add_argument(
        "--open-processes",
        type=int,
        default=None,
        metavar="N",
        help="open sealed batches across N workers (one X25519 exchange per report): threads with the compiled "
        "opener, for batches of 512 reports or more; processes without it, above 4096 reports "
        "(default: one per CPU when there are several, else inline; 1: inline)",
    )
    p.add_argument(
        "--serial-open",
        action="store_const",
        const=1,
        dest="open_processes",
        help="open sealed batches inline, in this process (the same as --open-processes 1)",
    )


def analyzer_opener(given: str | None, files: Sequence[str], *, processes: int | None = 1) -> Any:
    """A :class:`~ldp_core.wire.sealing.BatchOpener` over the key folder (``None`` if no metrics file declares
    a sealed metric and no folder is given). A sealed metric without keys, a missing or unsafe key file, or a
    current analyzer key the folder lacks is a clear error at start-up, not at the first record."""
    import os

    from ldp_core.days import DayWindow
    from ldp_core.metrics import load_metrics
    from ldp_core.wire.sealing import BatchOpener, KeyRing, ReplayGuard, SealingError, default_open_processes

    folder = given or os.environ.get("LDP_ANALYZER_KEYS") or None
    sets = [(f, load_metrics(f, reject_expired=False)) for f in files]
    sealed = sorted({n for _, ms in sets for n, m in ms.items() if m.sealed})
    if folder is None:
        if sealed:
            raise SealingError(
                f"metric(s) {sealed} are sealed: pass the analyzer's key folder (--analyzer-keys DIR or "
                "$LDP_ANALYZER_KEYS) to open their records"
            )
        return None
    ring = KeyRing.load(folder)
    for f, ms in sets:
        if ms.analyzer_key is not None and any(m.sealed for m in ms.values()):
            ring.require([ms.analyzer_key.key_id], where=f"metrics file {f!r}")
    window = DayWindow.from_env()  # replays are remembered as long as the collector and shuffler take the day
    procs = default_open_processes() if processes is None else processes
    return BatchOpener(ring, processes=procs, replays=ReplayGuard(window.max_day_age + window.grace_days))


# -- the shuffled topic's consumers (``ldp sink``, ``ldp estimator``) ---------------------------
def add_shuffled_consumer(p: argparse.ArgumentParser, group: str, member_help: str) -> None:
    """The options every consumer of the shuffled topic takes: the topic, its consumer group and member,
    the partitions if it creates the topic, the session timeout and the analyzer's keys."""
    from pipeline.topics import DEFAULT_PARTITIONS, SHUFFLED_TOPIC

    p.add_argument("--topic", default=SHUFFLED_TOPIC, help=f"shuffled topic (default {SHUFFLED_TOPIC})")
    add_group(p, group)
    add_member(p, None, member_help)
    p.add_argument("--partitions", type=int, default=DEFAULT_PARTITIONS, help="partitions if the topic is created")
    p.add_argument(
        "--shuffled-key",
        choices=("batch", "metric-day"),
        default=None,
        help="the shuffler's --shuffled-key: with it, --shuffled-spread and the topic's partition count every "
        "member derives the partition each sealed record must be read from, and drops one read elsewhere (a copy "
        "a shuffler routed to another member's replay guard; docs/COLLECTOR.md) (default: the deployment's "
        "$LDP_SHUFFLED_KEY, else batch)",
    )
    p.add_argument(
        "--shuffled-spread",
        type=int,
        default=None,
        metavar="N",
        help="the shuffler's --shuffled-spread (0: the topic's partition count); the shuffler and every member "
        "must agree, a member that sees records routed under another N says so and is not ready (default: the "
        "deployment's $LDP_SHUFFLED_SPREAD, else 0)",
    )
    add_session_timeout(p)
    add_analyzer_keys(p)


class ShuffledInput:
    """What a shuffled-topic consumer opens at start-up, in this order (each failure is a clear error before
    any record is read): logging, the metrics files and their catalog, the analyzer's opener, the transport."""

    def __init__(self, args: argparse.Namespace) -> None:
        from pipeline.catalog import SpecCatalog
        from pipeline.transport import open_transport

        setup_logging(args.log_level)
        self.files = metrics_files(args.metrics)
        self.catalog = SpecCatalog.from_files(self.files)
        self.opener = analyzer_opener(args.analyzer_keys, self.files, processes=args.open_processes)
        self.transport = open_transport(args.transport)

    def consumer_options(self, args: argparse.Namespace) -> dict[str, Any]:
        """The keyword arguments the consumer classes share (topic, group, member, partitions, timeout, opener, the
        shuffler's keying)."""
        return {
            "topic": args.topic,
            "group": args.group,
            "member": args.member,
            "session_timeout": args.session_timeout,
            "partitions": args.partitions,
            "opener": self.opener,
            **shuffler_keying(args.shuffled_key, args.shuffled_spread),
        }


def shuffler_keying(key: str | None, spread: int | None) -> dict[str, Any]:
    """A consumer's ``shuffled_key`` and ``shuffled_spread``: as given, else the deployment's environment
    (:func:`pipeline.routes.keying_from_env`)."""
    from pipeline.routes import keying_from_env

    return keying_from_env(key, spread)
