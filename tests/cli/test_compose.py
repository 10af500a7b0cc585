"""docker-compose.yml and the Dockerfile agree with the code (no Docker engine runs here).

Every pipeline service's command must be accepted by the real ``ldp``
argument parser, its transport must point at the compose broker's
advertised listener, its published port must be the one it listens on and
the command's default, and its topics (if named) the code's topics.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from collector.sinks.parquet import DEFAULT_GROUP as SINK_GROUP
from ldp_cli.broker import DEFAULT_KAFKA_VERSION
from ldp_cli.main import build_parser
from pipeline.topics import RAW_TOPIC, SHUFFLED_TOPIC, SHUFFLER_STATE_TOPIC
from pipeline.transport.kafka import DEFAULT_MAX_REQUEST_SIZE

ROOT = Path(__file__).resolve().parents[2]
SERVICES = {"collector", "shuffler", "estimator", "sink"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def parse(command: list[str]) -> Any:
    return build_parser().parse_args(command)


BROKERS = ("kafka-1", "kafka-2", "kafka-3")


def test_the_services_are_there(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == SERVICES | set(BROKERS) | {"issuer"}


def _env(compose: dict[str, Any], node: str) -> dict[str, str]:
    return {key: str(v) for key, v in compose["services"][node]["environment"].items()}


def test_kafka_is_three_kraft_nodes_of_the_official_image_replicating_everything(compose: dict[str, Any]) -> None:
    """Issue 31: three combined broker/controller nodes, one quorum of all three, every topic (the offsets and
    transaction-state ones too) replicated 3 times with min.insync.replicas 2, so any one node may be down."""
    envs = {node: _env(compose, node) for node in BROKERS}
    voters = {}
    for node, env in envs.items():
        k = compose["services"][node]
        assert k["image"] == f"apache/kafka:{DEFAULT_KAFKA_VERSION}" and k["hostname"] == node
        assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
        assert "CONTROLLER://:9093" in env["KAFKA_LISTENERS"] and "PLAINTEXT://:9092" in env["KAFKA_LISTENERS"]
        assert env["KAFKA_ADVERTISED_LISTENERS"] == f"PLAINTEXT://{node}:9092"
        voters[int(env["KAFKA_NODE_ID"])] = f"{node}:9093"
        for name in (
            "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
            "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
            "KAFKA_DEFAULT_REPLICATION_FACTOR",
        ):
            assert env[name] == "3", (node, name)
        assert env["KAFKA_MIN_INSYNC_REPLICAS"] == env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == "2", node
        assert int(env["KAFKA_MESSAGE_MAX_BYTES"]) >= DEFAULT_MAX_REQUEST_SIZE
        assert int(env["KAFKA_REPLICA_FETCH_MAX_BYTES"]) >= int(env["KAFKA_MESSAGE_MAX_BYTES"])  # followers keep up
        assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"  # the pipeline creates its topics itself
        assert re.fullmatch(r"[A-Za-z0-9_-]{22}", env["CLUSTER_ID"])
        assert "healthcheck" in k
        (volume,) = k["volumes"]
        assert volume.split(":")[0] == f"{node}-data" and volume.split(":")[1] == env["KAFKA_LOG_DIRS"]
    assert sorted(voters) == [1, 2, 3]  # distinct node ids
    quorum = ",".join(f"{i}@{voters[i]}" for i in sorted(voters))
    assert {env["KAFKA_CONTROLLER_QUORUM_VOTERS"] for env in envs.values()} == {quorum}
    assert len({env["CLUSTER_ID"] for env in envs.values()}) == 1
    # every other setting is the same on the three nodes
    per_node = {"KAFKA_NODE_ID", "KAFKA_ADVERTISED_LISTENERS"}
    assert len({tuple(sorted((k, v) for k, v in e.items() if k not in per_node)) for e in envs.values()}) == 1


def test_the_local_cluster_matches_the_compose_one(compose: dict[str, Any], tmp_path: Path) -> None:
    """`ldp kafka up --brokers 3` (what the tests run) replicates as the compose cluster does."""
    from ldp_cli.broker import BrokerConfig
    from ldp_cli.broker_cluster import cluster_configs

    env = _env(compose, "kafka-1")
    cfgs = cluster_configs(tmp_path, BrokerConfig(home=tmp_path, port=21700, controller_port=21710), 3)
    assert {(c.replication, c.min_isr) for c in cfgs} == {
        (int(env["KAFKA_DEFAULT_REPLICATION_FACTOR"]), int(env["KAFKA_MIN_INSYNC_REPLICAS"]))
    }


def test_every_command_is_accepted_by_the_real_parser(compose: dict[str, Any]) -> None:
    from pipeline.transport import open_transport

    nodes = [_env(compose, n)["KAFKA_ADVERTISED_LISTENERS"].replace("PLAINTEXT://", "") for n in BROKERS]
    for name in SERVICES:
        svc = compose["services"][name]
        cmd = svc["command"]
        assert cmd[0] == name, f"service {name} runs `ldp {cmd[0]}`"
        args = parse(cmd)
        assert args.command == name
        transport = getattr(args, "transport", None) or args.transport_url  # the collector's dest
        t = open_transport(transport)  # opens no connection
        assert t.bootstrap.split(",") == nodes, name  # every node, so any one may be down at start
        assert t.replication_factor == 3, name  # the topics the services create are replicated on all three
        t.close()
        assert svc["environment"]["LDP_TRANSPORT"] == transport
        metrics = getattr(args, "metrics", None) or getattr(args, "metrics_path", None)
        metrics = metrics[0] if isinstance(metrics, list) else metrics
        assert metrics.startswith("/app/") and (ROOT / metrics[len("/app/") :]).is_file(), name
        assert {n: d["condition"] for n, d in svc["depends_on"].items() if n in BROKERS} == dict.fromkeys(
            BROKERS, "service_healthy"
        )
        assert svc["build"] == "."


def test_ports_match_what_the_services_listen_on(compose: dict[str, Any]) -> None:
    from ldp_cli.commands.estimator import DEFAULT_PORT

    expect = {"collector": parse(["collector"]).port, "estimator": DEFAULT_PORT}
    assert expect["collector"] == 8080
    for name, default in expect.items():
        svc = compose["services"][name]
        args = parse(svc["command"])
        assert args.port == default and args.host == "0.0.0.0"
        (mapping,) = svc["ports"]
        host_ip, host_port, container_port = mapping.split(":")
        assert host_ip == "127.0.0.1" and int(host_port) == int(container_port) == default
    for name in ("shuffler", "sink"):
        assert "ports" not in compose["services"][name]


def test_topics_and_groups_are_the_codes(compose: dict[str, Any]) -> None:
    s = compose["services"]
    shuffler = parse(s["shuffler"]["command"])
    assert (shuffler.raw_topic, shuffler.shuffled_topic, shuffler.state_topic) == (
        RAW_TOPIC,
        SHUFFLED_TOPIC,
        SHUFFLER_STATE_TOPIC,
    )
    assert parse(s["collector"]["command"]).raw_topic in (None, RAW_TOPIC)
    assert parse(s["estimator"]["command"]).topic == SHUFFLED_TOPIC
    sink = parse(s["sink"]["command"])
    assert sink.topic == SHUFFLED_TOPIC and sink.group == SINK_GROUP
    from ldp_cli.commands.sink import DEFAULT_GROUP as CLI_SINK_GROUP

    assert CLI_SINK_GROUP == SINK_GROUP
    assert parse(s["estimator"]["command"]).group != sink.group  # each consumer sees every batch


def test_state_lives_on_volumes(compose: dict[str, Any]) -> None:
    s = compose["services"]
    est = parse(s["estimator"]["command"])
    sink = parse(s["sink"]["command"])
    col = parse(s["collector"]["command"])
    mounts = {name: [v.split(":")[1] for v in s[name].get("volumes", [])] for name in SERVICES}
    assert any(est.state.startswith(m) for m in mounts["estimator"])
    assert any(sink.dataset.startswith(m) for m in mounts["sink"])
    assert any(col.dedup_path.startswith(m) for m in mounts["collector"])
    named = set(compose["volumes"])
    for name in SERVICES | set(BROKERS) | {"issuer"}:
        for v in s[name].get("volumes", []):
            assert v.split(":")[0] in named


def test_the_dockerfile_builds_the_ldp_entry_point() -> None:
    import tomllib

    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r'^ENTRYPOINT \["ldp"\]$', text, re.M)
    assert re.search(r'pip install .*"\.\[server\]"', text)
    # every package the wheel is made of (pyproject's list, so that a new top-level package cannot be left out
    # of the image: ldp_core was), and the metrics file
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = [p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]]
    assert "ldp_core" in packages
    for folder in (*packages, "metrics"):
        assert re.search(rf"^COPY {folder} \./{folder}$", text, re.M), folder
    assert re.search(r"^USER ldp$", text, re.M)
    assert 'ldp = "ldp_cli.main:main"' in (ROOT / "pyproject.toml").read_text()


def test_the_image_carries_the_native_front_the_compose_collector_serves_with() -> None:
    """The compose collector runs ``--front native``: the image builds ``ldp_front`` (and the compiled opener) from
    native/ in a builder stage and installs the wheels with the server extras."""
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim AS native$", text, re.M)
    for crate in ("front", "opener"):
        assert re.search(rf"^COPY native/{crate} /src/{crate}$", text, re.M), crate
        assert f"maturin build --release --locked -m /src/{crate}/Cargo.toml -o /wheels" in text, crate
    assert re.search(r"^COPY --from=native /wheels /tmp/wheels$", text, re.M)
    assert re.search(r'pip install --no-cache-dir "\.\[server\]" /tmp/wheels/\*\.whl', text)


def test_the_compose_collector_serves_its_port_with_the_native_front(compose: dict[str, Any]) -> None:
    """One worker (the native front serves one process; the CLI refuses more), the front named on the command."""
    col = parse(compose["services"]["collector"]["command"])
    assert col.front == "native"
    assert col.workers == 1


def test_every_service_has_a_readiness_healthcheck_the_status_checker_accepts(compose: dict[str, Any]) -> None:
    """Each pipeline service is checked by ``python -m pipeline.status``: the HTTP ones on their own /readyz,
    the workers on the --status-file their command writes (tests/e2e/test_broker_startup.py runs the checker
    against live workers)."""
    from pipeline.status import main as status_main

    for name in SERVICES:
        svc = compose["services"][name]
        test = svc["healthcheck"]["test"]
        assert test[:4] == ["CMD", "python", "-m", "pipeline.status"], (name, test)
        args = parse(svc["command"])
        if "--url" in test:
            url = urlsplit(test[test.index("--url") + 1])
            assert url.hostname == "127.0.0.1" and url.path == "/readyz"
            assert url.port == args.port, name
        else:
            assert test[4] == args.status_file, name
            # the checker takes these arguments; no worker wrote the file here, so it says not ready
            assert status_main(test[4:]) == 1, name


# -- the token issuer (docs/TOKENS.md) ------------------------------------------------------------------------
def _mounts(svc: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """container path -> (volume, mode) of a service's volumes."""
    out = {}
    for v in svc.get("volumes", []):
        parts = v.split(":")
        out[parts[1]] = (parts[0], parts[2] if len(parts) > 2 else "rw")
    return out


def test_the_issuer_service_is_the_real_command_on_its_own_port_and_volume(compose: dict[str, Any]) -> None:
    from ldp_cli.commands.issuer import AUTHORITY_KEY_ENV, DEFAULT_PORT

    svc = compose["services"]["issuer"]
    args = parse(svc["command"])
    assert (args.command, args.issuer_command) == ("issuer", "serve")
    assert args.host == "0.0.0.0" and args.port == DEFAULT_PORT
    (mapping,) = svc["ports"]
    host_ip, host_port, container_port = mapping.split(":")
    assert host_ip == "127.0.0.1" and int(host_port) == int(container_port) == args.port
    assert args.port != parse(compose["services"]["estimator"]["command"]).port  # both publish on one host
    test = svc["healthcheck"]["test"]
    assert test[:4] == ["CMD", "python", "-m", "pipeline.status"]
    url = urlsplit(test[test.index("--url") + 1])
    assert (url.hostname, url.port, url.path) == ("127.0.0.1", args.port, "/readyz")
    # the state folder (private day keys, counts) is a named volume of its own
    mounts = _mounts(svc)
    assert mounts[args.state][0] == "issuer-state" and "issuer-state" in compose["volumes"]
    # no key on the command line: the authority's public key comes from the environment, required by compose
    assert not args.authority_key and not args.authority
    assert svc["environment"][AUTHORITY_KEY_ENV].startswith("${" + AUTHORITY_KEY_ENV + ":?")
    assert "depends_on" not in svc  # it needs no broker


def test_the_collector_requires_tokens_with_only_the_issuers_public_keys(compose: dict[str, Any]) -> None:
    s = compose["services"]
    col, iss = parse(s["collector"]["command"]), parse(s["issuer"]["command"])
    assert col.require_tokens is True
    assert col.token_issuer == iss.name  # the issuer's name in the token challenge
    assert col.token_origin
    # the token-keys volume is the issuer's public/ folder, read-only in the collector
    issuer_mounts, collector_mounts = _mounts(s["issuer"]), _mounts(s["collector"])
    volume, mode = collector_mounts[col.token_keys]
    assert issuer_mounts[f"{iss.state}/public"] == (volume, "rw") and mode == "ro"
    # the issuer's state volume (its private keys) is mounted nowhere else
    for name, svc in s.items():
        if name != "issuer":
            assert all(v != "issuer-state" for v, _ in _mounts(svc).values()), name
    # spent tokens persist on the collector's volume
    assert any(col.spent_path.startswith(m) for m, (v, _) in collector_mounts.items() if v == "collector-data")
    assert s["collector"]["depends_on"]["issuer"]["condition"] == "service_healthy"


# -- web pages (CORS) -----------------------------------------------------------------------------------------


def _interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ``${NAME:-default}`` substitution (the only form the CORS variables use)."""
    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: env.get(m.group(1)) or m.group(2), value)


def test_the_collector_and_issuer_take_their_allowed_origins_from_the_environment(compose: dict[str, Any]) -> None:
    from collector.settings import CollectorSettings
    from ldp_cli.commands.issuer import ALLOW_ORIGINS_ENV

    s = compose["services"]
    col_env, iss_env = s["collector"]["environment"], s["issuer"]["environment"]
    # the collector's own environment block replaces the anchor's: the shared variables must still be there
    for key, value in compose["x-ldp"]["environment"].items():
        assert col_env[key] == value, key
    host = {"LDP_ALLOW_ORIGINS": "https://app.example.com,http://127.0.0.1:5173"}
    for env in (host, {}):
        col = {k: _interpolate(str(v), env) for k, v in col_env.items()}
        settings = CollectorSettings.from_env(col)
        expect = ("https://app.example.com", "http://127.0.0.1:5173") if env else ()
        assert settings.allow_origins == expect
        assert _interpolate(str(iss_env[ALLOW_ORIGINS_ENV]), env) == env.get("LDP_ALLOW_ORIGINS", "")
    col_args = parse(s["collector"]["command"])
    assert col_args.allow_origins is None  # the flag would win over the environment
    assert parse(s["issuer"]["command"]).allow_origins is None


def test_the_collectors_metrics_listen_apart_and_only_inside_the_compose_network(compose: dict[str, Any]) -> None:
    svc = compose["services"]["collector"]
    args = parse(svc["command"])
    assert args.public_metrics is None  # /metrics is not on the device-facing port
    assert args.metrics_port is not None and args.metrics_port != args.port and args.metrics_host == "0.0.0.0"
    assert [int(p) for p in svc["expose"]] == [args.metrics_port]
    published = [int(m.split(":")[-1]) for m in svc["ports"]]
    assert args.metrics_port not in published and published == [args.port]
    for name, other in compose["services"].items():
        for mapping in other.get("ports", []):
            assert int(str(mapping).split(":")[-1]) != args.metrics_port or name != "collector"


def test_one_collector_service_shares_its_spent_and_dedup_stores_on_one_host(compose: dict[str, Any]) -> None:
    """Issue 28: a second collector without the spent-token store accepts a spent token. As shipped, compose
    runs one collector service (no replicas; its fixed host port also keeps `--scale collector=2` from
    starting), whose workers share one spent-token file and one dedup file on its own volume, mounted by no
    other service: SQLite's locking holds among processes of one host (docs/COLLECTOR.md, "Several collectors")."""
    col = compose["services"]["collector"]
    assert int(col.get("deploy", {}).get("replicas", 1)) == 1
    assert any(str(p).startswith("127.0.0.1:8080:") for p in col["ports"])  # a fixed host port: one instance
    args = parse(col["command"])
    mount = next(v.split(":")[1] for v in col["volumes"] if v.startswith("collector-data:"))
    assert args.spent_path.startswith(mount + "/") and args.dedup_path.startswith(mount + "/")
    others = [
        n for n, s in compose["services"].items() if n != "collector" and "collector-data:" in str(s.get("volumes"))
    ]
    assert others == []
    text = (ROOT / "docker-compose.yml").read_text()
    assert "one host" in text and "spent-token" in text  # the requirement is stated where the operator reads it
