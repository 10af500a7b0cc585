"""Provision and run the project's own single-node Apache Kafka broker.

No container engine is assumed. Apache Kafka's broker is published on Maven
Central as ``org.apache.kafka:kafka_2.13``; this module

1. writes a small ``pom.xml`` listing it and a logging binding
   (``org.slf4j:slf4j-simple``) and runs Maven's
   ``dependency:copy-dependencies -DincludeScope=runtime`` into ``<home>/lib``
   (cached: done once per Kafka version);
2. writes ``server.properties`` for one combined KRaft node
   (``process.roles=broker,controller``) listening on 127.0.0.1 only, with
   every replication factor and min ISR set to 1 so that the offsets and
   transaction-state topics can be created on a single node;
3. formats the log directory once with ``kafka.tools.StorageTool format``
   and a random cluster id;
4. starts ``java -cp '<home>/lib/*' kafka.Kafka server.properties`` as a
   detached process (own session and process group, pid file, log file) and
   waits until a kafka-python admin client sees the broker registered and
   unfenced.

``up`` is idempotent: a running broker that answers is left alone. ``down``
sends SIGTERM (a controlled shutdown takes a few seconds), then SIGKILL after
a grace period. The layout of ``<home>`` (default ``.kafka/`` at the
repository root, or ``$LDP_KAFKA_HOME``)::

    pom.xml  lib/  lib.version  config/server.properties  data/
    broker.json  kafka.pid  kafka.log  lock

Facts used: the class names and the ``format`` sub-command come from Kafka's
``bin/kafka-storage.sh`` and ``bin/kafka-server-start.sh``; the settings from
Kafka's ``config/server.properties`` and its broker configuration reference.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ldp_cli.errors import BrokerError
from ldp_core.files import write_atomic
from pipeline.transport.base import TransportError

__all__ = [
    "DEFAULT_KAFKA_VERSION",
    "DEFAULT_SCALA_VERSION",
    "DEFAULT_SLF4J_VERSION",
    "DEPENDENCY_PLUGIN",
    "BrokerError",
    "BrokerConfig",
    "BrokerStatus",
    "default_home",
    "render_pom",
    "render_server_properties",
    "new_cluster_id",
    "provision",
    "format_storage",
    "up",
    "status",
    "down",
    "probe",
    "port_open",
]

DEFAULT_KAFKA_VERSION = "4.1.1"
DEFAULT_SCALA_VERSION = "2.13"
DEFAULT_SLF4J_VERSION = "1.7.36"
#: pinned: Maven 3.8's default binding of ``dependency:`` is the 2013 release 2.8
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
_MIN_JAVA = 17
_VERSION_RE = re.compile(r"^[0-9]+(\.[0-9]+)*([.-][A-Za-z0-9]+)*$")
_HEAP_RE = re.compile(r"^[0-9]+[kKmMgG]$")


def default_home() -> Path:
    """``$LDP_KAFKA_HOME``, else ``.kafka/`` at the repository root (else in the working directory)."""
    env = os.environ.get("LDP_KAFKA_HOME")
    if env:
        return Path(env).expanduser().resolve()
    root = Path(__file__).resolve().parents[1]
    if not (root / "pyproject.toml").exists():
        root = Path.cwd()
    return root / ".kafka"


@dataclasses.dataclass(frozen=True)
class BrokerConfig:
    """Where and how the local broker runs.

    ``lib_dir`` defaults to ``<home>/lib``; pointing several homes at one
    ``lib_dir`` shares a single download (the tests do this).
    """

    home: Path = dataclasses.field(default_factory=default_home)
    host: str = "127.0.0.1"
    port: int = 9092
    controller_port: int = 9093
    kafka_version: str = DEFAULT_KAFKA_VERSION
    scala_version: str = DEFAULT_SCALA_VERSION
    slf4j_version: str = DEFAULT_SLF4J_VERSION
    heap: str = "512m"
    node_id: int = 1
    num_partitions: int = 1
    message_max_bytes: int = 8 << 20
    lib_dir: Path | None = None
    #: a node of a cluster (:mod:`ldp_cli.broker_cluster`): the quorum's ``id@host:port`` list (default: this
    #: node alone), the replication factor of every topic and internal topic, the min ISR, a shared cluster id
    voters: str = ""
    replication: int = 1
    min_isr: int = 1
    cluster_id: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "home", Path(self.home).expanduser().resolve())
        if self.lib_dir is not None:
            object.__setattr__(self, "lib_dir", Path(self.lib_dir).expanduser().resolve())
        for name in ("port", "controller_port"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 65535:
                raise ValueError(f"{name} must be a TCP port in 1..65535, got {v!r}")
        if self.port == self.controller_port:
            raise ValueError(
                f"port and controller_port must differ (both are {self.port}); pick another controller port"
            )
        if self.host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"host must be a loopback address (127.0.0.1, localhost or ::1), got {self.host!r}")
        for name in ("kafka_version", "scala_version", "slf4j_version"):
            if not _VERSION_RE.match(getattr(self, name)):
                raise ValueError(f"{name} {getattr(self, name)!r} is not a Maven version such as 4.1.1")
        if not _HEAP_RE.match(self.heap):
            raise ValueError(f"heap must look like 512m or 1g, got {self.heap!r}")
        if self.num_partitions < 1 or self.node_id < 0 or self.message_max_bytes < 1 << 20:
            raise ValueError("num_partitions must be >= 1, node_id >= 0 and message_max_bytes >= 1 MiB")

    @property
    def bootstrap(self) -> str:
        """``host:port`` of the broker listener, for clients."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def libs(self) -> Path:
        return self.lib_dir if self.lib_dir is not None else self.home / "lib"

    @property
    def data_dir(self) -> Path:
        return self.home / "data"

    @property
    def properties_path(self) -> Path:
        return self.home / "config" / "server.properties"

    @property
    def pid_path(self) -> Path:
        return self.home / "kafka.pid"

    @property
    def log_path(self) -> Path:
        return self.home / "kafka.log"

    @property
    def state_path(self) -> Path:
        return self.home / "broker.json"

    @classmethod
    def from_home(cls, home: Path | str | None = None, **overrides: Any) -> BrokerConfig:
        """The config the broker in ``home`` was last started with, updated by ``overrides`` (``None`` ignored)."""
        home_path = Path(home).expanduser().resolve() if home is not None else default_home()
        saved: dict[str, Any] = {}
        state = home_path / "broker.json"
        if state.exists():
            try:
                saved = json.loads(state.read_text())["config"]
            except (ValueError, KeyError, TypeError) as exc:
                raise BrokerError(f"{state} is corrupt ({exc}); delete it and run `ldp kafka up` again") from exc
        fields = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in saved.items() if k in fields and k != "home"}
        kwargs.update({k: v for k, v in overrides.items() if v is not None})
        if kwargs.get("lib_dir") is not None:
            kwargs["lib_dir"] = Path(kwargs["lib_dir"])
        return cls(home=home_path, **kwargs)

    def to_json_obj(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["home"] = str(self.home)
        d["lib_dir"] = None if self.lib_dir is None else str(self.lib_dir)
        return d


@dataclasses.dataclass(frozen=True)
class BrokerStatus:
    """What ``ldp kafka status`` reports."""

    home: str
    bootstrap: str
    pid: int | None
    process_alive: bool
    answering: bool
    kafka_version: str | None
    cluster_id: str | None
    brokers: int
    detail: str

    @property
    def running(self) -> bool:
        return self.process_alive and self.answering

    def to_json_obj(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["running"] = self.running
        return d


def render_pom(cfg: BrokerConfig) -> str:
    """A pom whose runtime dependencies are exactly the broker and a logging binding."""
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<!-- written by ldp_cli/broker.py: the local Kafka broker's runtime -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.ldp</groupId>
  <artifactId>ldp-kafka-runtime</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_{cfg.scala_version}</artifactId>
      <version>{cfg.kafka_version}</version>
    </dependency>
    <dependency>
      <groupId>org.slf4j</groupId>
      <artifactId>slf4j-simple</artifactId>
      <version>{cfg.slf4j_version}</version>
    </dependency>
  </dependencies>
</project>
"""


def render_server_properties(cfg: BrokerConfig) -> str:
    """``server.properties`` of one combined broker+controller KRaft node on loopback."""
    h = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
    props = {
        "process.roles": "broker,controller",
        "node.id": str(cfg.node_id),
        "controller.quorum.voters": cfg.voters or f"{cfg.node_id}@{h}:{cfg.controller_port}",
        "listeners": f"PLAINTEXT://{h}:{cfg.port},CONTROLLER://{h}:{cfg.controller_port}",
        "advertised.listeners": f"PLAINTEXT://{h}:{cfg.port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(cfg.data_dir),
        "num.partitions": str(cfg.num_partitions),
        "default.replication.factor": str(cfg.replication),
        "min.insync.replicas": str(cfg.min_isr),
        "offsets.topic.replication.factor": str(cfg.replication),
        "offsets.topic.num.partitions": "8",
        "transaction.state.log.replication.factor": str(cfg.replication),
        "transaction.state.log.min.isr": str(cfg.min_isr),
        "transaction.state.log.num.partitions": "8",
        "share.coordinator.state.topic.replication.factor": str(cfg.replication),
        "share.coordinator.state.topic.min.isr": str(cfg.min_isr),
        "group.initial.rebalance.delay.ms": "0",
        # a transaction open past its timeout (a worker that died and was not restarted) blocks read_committed
        # readers until its coordinator aborts it: look every second, not every 10 s (Kafka's default)
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
        # lets tests use short session timeouts to observe a crashed member leave quickly
        "group.min.session.timeout.ms": "500",
        "auto.create.topics.enable": "false",
        "message.max.bytes": str(cfg.message_max_bytes),
        "replica.fetch.max.bytes": str(cfg.message_max_bytes),
        "log.retention.hours": "168",
        # keep the producer's timestamp (the transports send the start of the UTC day), never the append time
        "log.message.timestamp.type": "CreateTime",
        "log.segment.bytes": str(256 << 20),
    }
    lines = ["# written by ldp_cli/broker.py; regenerated by every `ldp kafka up`"]
    lines += [f"{k}={v}" for k, v in props.items()]
    return "\n".join(lines) + "\n"


def new_cluster_id() -> str:
    """A random KRaft cluster id: 16 random bytes in unpadded URL-safe base64 (22 characters).

    Kafka's own ``Uuid.randomUuid`` rejects ids whose string starts with ``-``
    (they read as command-line flags); so does this.
    """
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


# -- tools -------------------------------------------------------------------


def _which(tool: str, hint: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise BrokerError(f"`{tool}` is not on PATH: {hint}")
    return path


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    return _which(
        "java",
        f"install a Java {_MIN_JAVA}+ runtime (Debian: apt-get install openjdk-17-jre-headless) or set JAVA_HOME",
    )


def _check_java(java: str) -> None:
    out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not m:
        raise BrokerError(f"cannot read the Java version from `{java} -version`: {out.stderr.strip()!r}")
    major = int(m.group(1)) if m.group(1) != "1" else int(m.group(2) or 0)
    if major < _MIN_JAVA:
        raise BrokerError(
            f"Kafka's broker needs Java {_MIN_JAVA}+, `{java}` is Java {major}: install a newer JDK or set JAVA_HOME"
        )


def _tail(path: Path, lines: int = 25) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


@contextlib.contextmanager
def _locked(cfg: BrokerConfig) -> Iterator[None]:
    """Serialize ``up``/``down`` on one home across processes."""
    cfg.home.mkdir(parents=True, exist_ok=True)
    with open(cfg.home / "lock", "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# -- provisioning ------------------------------------------------------------


def _lib_stamp(cfg: BrokerConfig) -> str:
    return f"kafka_{cfg.scala_version}:{cfg.kafka_version} slf4j-simple:{cfg.slf4j_version}"


def provision(cfg: BrokerConfig, *, log: Any = None) -> bool:
    """Download the broker's jars into ``cfg.libs`` unless already there; return whether it downloaded.

    Runs ``mvn -B -q -f <home>/pom.xml <plugin>:copy-dependencies
    -DincludeScope=runtime -DoutputDirectory=<tmp>`` and renames the folder
    into place only when Maven succeeded, so an interrupted download is
    retried from scratch rather than half-used. Maven's own cache
    (``~/.m2``) makes later downloads local.
    """
    stamp = cfg.libs.parent / f"{cfg.libs.name}.version"
    if stamp.exists() and stamp.read_text().strip() == _lib_stamp(cfg) and any(cfg.libs.glob("kafka_*.jar")):
        return False
    mvn = _which("mvn", "install Apache Maven (Debian: apt-get install maven); it fetches Kafka from Maven Central")
    cfg.home.mkdir(parents=True, exist_ok=True)
    pom = cfg.home / "pom.xml"
    pom.write_text(render_pom(cfg))
    tmp = cfg.libs.parent / f"{cfg.libs.name}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = [
        mvn,
        "-B",
        "-q",
        "-f",
        str(pom),
        f"{DEPENDENCY_PLUGIN}:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={tmp}",
    ]
    if log is not None:
        log(f"downloading Apache Kafka {cfg.kafka_version} and its runtime dependencies with Maven (once) ...")
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        out = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-20:])
        raise BrokerError(
            f"Maven could not fetch Kafka {cfg.kafka_version} (exit {proc.returncode}); "
            f"check that Maven Central is reachable. Command: {' '.join(cmd)}\n{out}"
        )
    if not any(tmp.glob(f"kafka_{cfg.scala_version}-{cfg.kafka_version}.jar")):
        raise BrokerError(f"Maven succeeded but {tmp} holds no kafka_{cfg.scala_version}-{cfg.kafka_version}.jar")
    shutil.rmtree(cfg.libs, ignore_errors=True)
    cfg.libs.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(cfg.libs)
    stamp.write_text(_lib_stamp(cfg) + "\n")
    if log is not None:
        log(
            f"downloaded {sum(1 for _ in cfg.libs.glob('*.jar'))} jars into {cfg.libs} in {time.monotonic() - t0:.1f} s"
        )
    return True


def _classpath(cfg: BrokerConfig) -> str:
    return str(cfg.libs / "*")


def format_storage(cfg: BrokerConfig, java: str) -> str:
    """Format ``cfg.data_dir`` for KRaft once; return the cluster id (read back when already formatted)."""
    meta = cfg.data_dir / "meta.properties"
    if meta.exists():
        for line in meta.read_text().splitlines():
            if line.startswith("cluster.id="):
                return line.split("=", 1)[1].strip()
        raise BrokerError(f"{meta} has no cluster.id; run `ldp kafka down --purge` to start from an empty log")
    cfg.data_dir.mkdir(parents=True, exist_ok=True)
    cid = cfg.cluster_id or new_cluster_id()
    cmd = [
        java,
        "-Xmx256m",
        "-cp",
        _classpath(cfg),
        "kafka.tools.StorageTool",
        "format",
        "--cluster-id",
        cid,
        "--config",
        str(cfg.properties_path),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0 or not meta.exists():
        out = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise BrokerError(f"formatting the KRaft log directory failed (exit {proc.returncode}): {' '.join(cmd)}\n{out}")
    return cid


# -- process -----------------------------------------------------------------


def _read_pid(cfg: BrokerConfig) -> int | None:
    try:
        return int(cfg.pid_path.read_text().strip())
    except (OSError, ValueError):
        return None


def _is_our_broker(pid: int, cfg: BrokerConfig) -> bool:
    """Whether ``pid`` is alive and is the JVM started for ``cfg`` (guards against pid reuse)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    cmdline = Path(f"/proc/{pid}/cmdline")
    if not cmdline.exists():
        return True
    try:
        args = cmdline.read_bytes().split(b"\0")
    except OSError:
        return False
    if not args or args == [b""]:
        return False  # a zombie: exited, not yet reaped
    return b"kafka.Kafka" in args and str(cfg.properties_path).encode() in args


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def probe(bootstrap: str, timeout: float = 5.0) -> dict[str, Any]:
    """Ask the broker at ``bootstrap`` to describe its cluster; raise :class:`BrokerError` if it cannot.

    Returns ``{"cluster_id", "brokers": [...]}`` once at least one broker is
    registered and unfenced (:func:`pipeline.transport.kafka.describe_cluster`).
    """
    from pipeline.transport.kafka import describe_cluster

    try:
        return describe_cluster(bootstrap, timeout=timeout)
    except TransportError as exc:
        raise BrokerError(str(exc)) from exc


def _save_state(cfg: BrokerConfig, cluster_id: str) -> None:
    write_atomic(
        cfg.state_path, (json.dumps({"config": cfg.to_json_obj(), "cluster_id": cluster_id}, indent=2) + "\n").encode()
    )


def up(cfg: BrokerConfig, *, timeout: float = 120.0, log: Any = None) -> BrokerStatus:
    """Provision (once), format (once) and start the broker, then wait until it answers.

    Idempotent: when this home's broker already runs, it only waits for it to
    answer. Raises :class:`BrokerError` with the log's tail if the JVM exits
    or does not answer within ``timeout`` seconds, and when another program
    holds the port.
    """
    with _locked(cfg):
        pid = _read_pid(cfg)
        if pid is not None and _is_our_broker(pid, cfg):
            running = BrokerConfig.from_home(cfg.home)
            if (running.port, running.controller_port) != (cfg.port, cfg.controller_port):
                raise BrokerError(
                    f"the broker of {cfg.home} already runs on port {running.port} "
                    f"(controller {running.controller_port}); run `ldp kafka down` first to change ports"
                )
            _wait_ready(cfg, pid, timeout)
            return status(cfg)
        java = _java()
        _check_java(java)
        for port in (cfg.port, cfg.controller_port):
            if port_open(cfg.host, port):
                raise BrokerError(
                    f"port {port} on {cfg.host} is already in use by another program; "
                    f"stop it or choose other ports (ldp kafka up --port P --controller-port Q)"
                )
        provision(cfg, log=log)
        cfg.properties_path.parent.mkdir(parents=True, exist_ok=True)
        cfg.properties_path.write_text(render_server_properties(cfg))
        cluster_id = format_storage(cfg, java)
        _save_state(cfg, cluster_id)
        cmd = [
            java,
            "-server",
            f"-Xms{cfg.heap}",
            f"-Xmx{cfg.heap}",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true",
            "-Dorg.slf4j.simpleLogger.showDateTime=true",
            "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd'T'HH:mm:ss.SSS",
            "-cp",
            _classpath(cfg),
            "kafka.Kafka",
            str(cfg.properties_path),
        ]
        with open(cfg.log_path, "ab") as logf:
            logf.write(f"\n==== ldp kafka up {time.strftime('%Y-%m-%dT%H:%M:%S')}: {' '.join(cmd)}\n".encode())
            logf.flush()
            proc = subprocess.Popen(
                cmd,
                cwd=cfg.home,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        cfg.pid_path.write_text(f"{proc.pid}\n")
        if log is not None:
            log(f"started Kafka {cfg.kafka_version} (pid {proc.pid}) on {cfg.bootstrap}; log: {cfg.log_path}")
        try:
            _wait_ready(cfg, proc.pid, timeout, proc=proc)
        except BrokerError:
            _terminate(proc.pid, grace=10.0, proc=proc)
            cfg.pid_path.unlink(missing_ok=True)
            raise
        return status(cfg)


def _wait_ready(cfg: BrokerConfig, pid: int, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    last = "not tried"
    while True:
        exited = proc.poll() is not None if proc is not None else not _is_our_broker(pid, cfg)
        if exited:
            code = f" with code {proc.returncode}" if proc is not None else ""
            raise BrokerError(
                f"the Kafka JVM (pid {pid}) exited{code} before answering; last lines of {cfg.log_path}:\n"
                f"{_tail(cfg.log_path)}"
            )
        try:
            probe(cfg.bootstrap, timeout=3.0)
            return
        except BrokerError as exc:
            last = str(exc)
        if time.monotonic() > deadline:
            raise BrokerError(
                f"the Kafka broker (pid {pid}) did not answer on {cfg.bootstrap} within {timeout:g} s "
                f"({last}); last lines of {cfg.log_path}:\n{_tail(cfg.log_path)}"
            )
        time.sleep(0.25)


def status(cfg: BrokerConfig, *, timeout: float = 5.0) -> BrokerStatus:
    """Whether this home's broker process is alive and answering, with its version and cluster id."""
    pid = _read_pid(cfg)
    alive = pid is not None and _is_our_broker(pid, cfg)
    answering, cluster_id, brokers, detail = False, None, 0, ""
    if alive:
        try:
            info = probe(cfg.bootstrap, timeout=timeout)
            answering, cluster_id, brokers = True, info["cluster_id"], len(info["brokers"])
            detail = "running"
        except BrokerError as exc:
            detail = f"process alive but not answering: {exc}"
    else:
        detail = "not running" if pid is None else f"not running (stale pid file: {pid})"
        if port_open(cfg.host, cfg.port):
            detail += f"; another program listens on {cfg.bootstrap}"
    version = None
    jars = sorted(cfg.libs.glob(f"kafka_{cfg.scala_version}-*.jar"))
    if jars:
        version = jars[0].stem.split("-", 1)[1]
    return BrokerStatus(
        home=str(cfg.home),
        bootstrap=cfg.bootstrap,
        pid=pid if alive else None,
        process_alive=alive,
        answering=answering,
        kafka_version=version,
        cluster_id=cluster_id,
        brokers=brokers,
        detail=detail,
    )


def _terminate(pid: int, grace: float, proc: subprocess.Popen[bytes] | None = None) -> bool:
    """SIGTERM the broker's process group, SIGKILL it after ``grace`` seconds; return whether SIGKILL was needed."""

    def gone() -> bool:
        if proc is not None:
            return proc.poll() is not None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        args = Path(f"/proc/{pid}/cmdline")
        exited = args.exists() and args.read_bytes() == b""  # exiting or a zombie
        if exited:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)  # reap it when it is our own child (up() and down() in one process)
        return exited

    def signal_group(sig: int) -> None:
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:
            os.kill(pid, sig)

    signal_group(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if gone():
            return False
        time.sleep(0.1)
    signal_group(signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not gone():
        time.sleep(0.05)
    return True


def down(cfg: BrokerConfig, *, grace: float = 30.0, purge: bool = False) -> str:
    """Stop this home's broker (SIGTERM, then SIGKILL after ``grace`` s); ``purge`` also deletes its log directory."""
    with _locked(cfg):
        pid = _read_pid(cfg)
        if pid is not None and _is_our_broker(pid, cfg):
            killed = _terminate(pid, grace)
            msg = f"stopped the Kafka broker (pid {pid})" + (" with SIGKILL after SIGTERM timed out" if killed else "")
        else:
            msg = "no Kafka broker was running" + (f" (removed stale pid file {pid})" if pid is not None else "")
        cfg.pid_path.unlink(missing_ok=True)
        if purge:
            shutil.rmtree(cfg.data_dir, ignore_errors=True)
            msg += f"; deleted {cfg.data_dir}"
        return msg
