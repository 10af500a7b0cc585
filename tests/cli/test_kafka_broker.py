"""``ldp kafka up|status|down`` and the provisioning behind it."""

from __future__ import annotations

import base64
import json
import os
import socket
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from ldp_cli.broker import (
    BrokerConfig,
    BrokerError,
    _save_state,
    default_home,
    down,
    new_cluster_id,
    port_open,
    render_pom,
    render_server_properties,
    status,
    up,
)
from ldp_cli.main import main


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def parse_properties(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.split("=", 1)
            out[k] = v
    return out


def test_server_properties_describe_one_combined_node_on_loopback(tmp_path: Path) -> None:
    cfg = BrokerConfig(home=tmp_path, port=19001, controller_port=19002, node_id=3)
    props = parse_properties(render_server_properties(cfg))
    assert props["process.roles"] == "broker,controller"
    assert props["node.id"] == "3"
    assert props["controller.quorum.voters"] == "3@127.0.0.1:19002"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19001,CONTROLLER://127.0.0.1:19002"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19001"
    assert props["log.dirs"] == str(tmp_path / "data")
    for key in (
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
        "default.replication.factor",
        "min.insync.replicas",
    ):
        assert props[key] == "1", key
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert props["transaction.abort.timed.out.transaction.cleanup.interval.ms"] == "1000"
    assert props["auto.create.topics.enable"] == "false"


def test_pom_lists_the_broker_and_a_logging_binding(tmp_path: Path) -> None:
    cfg = BrokerConfig(home=tmp_path, kafka_version="4.1.1", slf4j_version="1.7.36")
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    root = ET.fromstring(render_pom(cfg))
    deps = {
        (
            d.findtext("m:groupId", namespaces=ns),
            d.findtext("m:artifactId", namespaces=ns),
            d.findtext("m:version", namespaces=ns),
        )
        for d in root.iterfind("m:dependencies/m:dependency", ns)
    }
    assert deps == {("org.apache.kafka", "kafka_2.13", "4.1.1"), ("org.slf4j", "slf4j-simple", "1.7.36")}


def test_cluster_ids_are_16_random_bytes_in_url_safe_base64() -> None:
    ids = {new_cluster_id() for _ in range(200)}
    assert len(ids) == 200
    for cid in ids:
        assert len(cid) == 22 and not cid.startswith("-")
        assert len(base64.urlsafe_b64decode(cid + "==")) == 16


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"port": 9092, "controller_port": 9092}, "must differ"),
        ({"host": "0.0.0.0"}, "loopback"),
        ({"heap": "lots"}, "heap"),
        ({"port": 70000}, "TCP port"),
        ({"kafka_version": "4.1; rm -rf"}, "Maven version"),
    ],
)
def test_config_refuses_bad_settings(tmp_path: Path, kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        BrokerConfig(home=tmp_path, **kwargs)


def test_a_home_remembers_its_ports_and_overrides_win(tmp_path: Path) -> None:
    _save_state(BrokerConfig(home=tmp_path, port=19011, controller_port=19012, heap="256m"), "abc")
    again = BrokerConfig.from_home(tmp_path)
    assert (again.port, again.controller_port, again.heap) == (19011, 19012, "256m")
    assert BrokerConfig.from_home(tmp_path, port=19013, heap=None).port == 19013
    (tmp_path / "broker.json").write_text("{not json")
    with pytest.raises(BrokerError, match="corrupt"):
        BrokerConfig.from_home(tmp_path)


def test_default_home_honours_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LDP_KAFKA_HOME", str(tmp_path / "k"))
    assert default_home() == (tmp_path / "k").resolve()
    monkeypatch.delenv("LDP_KAFKA_HOME")
    assert default_home() == Path(__file__).resolve().parents[2] / ".kafka"


def test_status_and_down_of_an_empty_home(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    assert main(["kafka", "status", "--json", "--home", str(home)]) == 1
    st = json.loads(capsys.readouterr().out)
    assert st["running"] is False and st["pid"] is None and st["detail"].startswith("not running")
    assert main(["kafka", "down", "--home", str(home)]) == 0
    assert "no Kafka broker was running" in capsys.readouterr().out


def test_up_refuses_a_port_held_by_another_program(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        cfg = BrokerConfig(home=tmp_path, port=busy, controller_port=free_port())
        with pytest.raises(BrokerError, match=f"port {busy} .* in use"):
            up(cfg, timeout=5)
    assert not (tmp_path / "lib").exists()


@pytest.mark.kafka
def test_status_reports_the_running_broker_and_up_is_idempotent(
    kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The broker scripts/test started (``ldp kafka up``) is reported; a second ``up`` leaves it alone."""
    assert main(["kafka", "status", "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["running"] and st["answering"] and st["process_alive"]
    assert st["bootstrap"] == kafka_bootstrap
    assert st["kafka_version"].startswith("4.1") and st["brokers"] == 1 and st["cluster_id"]
    assert main(["kafka", "up"]) == 0
    out = capsys.readouterr().out
    assert f"pid {st['pid']}" in out
    assert main(["kafka", "status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["pid"] == st["pid"]


@pytest.mark.kafka
def test_a_second_broker_starts_answers_and_stops_cleanly(kafka_bootstrap: str, tmp_path: Path) -> None:
    """A fresh home (own data, jars shared with the default home): format, start, idempotent up, down."""
    lib = BrokerConfig.from_home().libs
    assert any(lib.glob("kafka_2.13-*.jar")), f"{lib} has no Kafka jars; run `ldp kafka up` first"
    cfg = BrokerConfig(home=tmp_path / "k2", port=free_port(), controller_port=free_port(), heap="256m", lib_dir=lib)
    try:
        st = up(cfg, timeout=120)
        assert st.running and st.bootstrap == cfg.bootstrap and st.cluster_id
        assert (cfg.data_dir / "meta.properties").read_text().count(st.cluster_id) == 1
        again = up(cfg, timeout=60)
        assert again.pid == st.pid
    finally:
        msg = down(cfg, grace=30)
    assert msg.startswith("stopped the Kafka broker") and "SIGKILL" not in msg
    assert not cfg.pid_path.exists()
    assert not port_open("127.0.0.1", cfg.port)
    assert st.pid is not None
    with pytest.raises(ProcessLookupError):
        os.kill(st.pid, 0)
    after = status(cfg)
    assert not after.running and after.detail == "not running"
