"""Members of a consumer group: unique default names, and Kafka's static membership for explicit ones."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid

import pytest

from pipeline.settings import default_member
from pipeline.transport import open_transport


def test_default_member_names_differ_per_process_and_are_valid_instance_ids() -> None:
    here = default_member("shuffler")
    assert here.startswith("shuffler-") and here.endswith(f"-{os.getpid()}")
    other = subprocess.run(
        [sys.executable, "-c", "from pipeline.settings import default_member; print(default_member('shuffler'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert other != here and other.startswith("shuffler-")  # a second process on this host: another name
    odd = default_member("sink", host="web 1/eu:west" + "x" * 100, pid=7)
    assert re.fullmatch(r"[A-Za-z0-9._-]{1,249}", odd) and odd.endswith("-7")


def test_two_shufflers_without_member_get_different_names(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """What ``ldp shuffler`` prints as its group/member name, twice, on the embedded log."""
    from tests.support.metrics_docs import dictionary, metric, metrics_doc

    (tmp_path / "m.json").write_text(json.dumps(metrics_doc(tab=metric("grr", 1.0, dictionary("a", "b")))))
    env = {k: v for k, v in os.environ.items() if k != "LDP_SHUFFLER_MEMBER"}
    names = []
    for _ in range(2):
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "ldp_cli",
                "shuffler",
                "--transport",
                f"sqlite:///{tmp_path}/log.sqlite3",
                "--metrics",
                str(tmp_path / "m.json"),
                "--key-file",
                str(tmp_path / "key"),
                "--idle-exit",
                "0.5",
                "--no-guarantee",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert out.returncode == 0, out.stderr
        (line,) = [x for x in out.stdout.splitlines() if x.startswith("ldp shuffler: running as ")]
        names.append(line.split(" as ", 1)[1].split(" on ", 1)[0])
    assert names[0] != names[1] and all(n.startswith("ldp-shuffler/shuffler-") for n in names), names


#: joins ``group`` as a static member named ``worker-a`` and prints its assignment after every change
_MEMBER = """
import sys, time
from pipeline.transport import open_transport
t = open_transport("kafka://" + sys.argv[1])
c = t.consume(sys.argv[2], sys.argv[3], member="worker-a", session_timeout=float(sys.argv[4]), static=True)
last = None
while True:
    c.poll(timeout=0.1)
    now = sorted(tp.partition for tp in c.assignment())
    if now != last:
        print(" ".join(map(str, now)) or "-", flush=True)
        last = now
"""


def _start_member(bootstrap: str, topic: str, group: str, session: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _MEMBER, bootstrap, topic, group, str(session)],
        stdout=subprocess.PIPE,
        text=True,
    )


def _assigned_line(proc: subprocess.Popen[str], others: list, deadline: float) -> str:  # type: ignore[type-arg]
    """The member's next non-empty assignment line (polling ``others`` meanwhile, so they heartbeat)."""
    import selectors

    sel = selectors.DefaultSelector()
    assert proc.stdout is not None
    sel.register(proc.stdout, selectors.EVENT_READ)
    while time.monotonic() < deadline:
        for c in others:
            c.poll(timeout=0.05)
        if sel.select(timeout=0.05):
            line = proc.stdout.readline().strip()
            if line and line != "-":
                return line
    raise AssertionError("the member was assigned no partition in time")


@pytest.mark.kafka
def test_a_static_member_killed_and_restarted_gets_its_partitions_back_at_once(kafka_bootstrap: str) -> None:
    """A member named explicitly joins with group.instance.id = its name: killed with SIGKILL (no goodbye),
    a new process of the same name owns the same partitions well within the session timeout, and the
    other member's partitions never move (no rebalance)."""
    t = open_transport(f"kafka://{kafka_bootstrap}")
    topic = f"static.{uuid.uuid4().hex[:10]}"
    group = f"g-static-{uuid.uuid4().hex[:8]}"
    t.create_topic(topic, 4)
    session = 20.0
    procs: list[subprocess.Popen[str]] = []
    try:
        b = t.consume(topic, group, member="worker-b", session_timeout=session, static=True)
        assert getattr(b, "static", None) is True
        procs.append(_start_member(kafka_bootstrap, topic, group, session))
        first = _assigned_line(procs[0], [b], time.monotonic() + 90)
        t0 = time.monotonic()
        while len(b.assignment()) + len(first.split()) != 4:  # settled: every partition owned once
            b.poll(timeout=0.1)
            assert time.monotonic() - t0 < 60, (first, b.assignment())
        owned_b = b.assignment()
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(10)
        t0 = time.monotonic()
        procs.append(_start_member(kafka_bootstrap, topic, group, session))
        again = _assigned_line(procs[1], [b], t0 + session)
        took = time.monotonic() - t0
        assert again == first
        assert took < session / 3, f"the restarted member waited {took:.1f} s for its partitions"
        for _ in range(10):
            b.poll(timeout=0.1)
        assert b.assignment() == owned_b
        b.close()
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
        t.close()
