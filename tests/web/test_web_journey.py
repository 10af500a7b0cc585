"""The web journey: a web app on its own origin, in Chromium, through the deployment docker-compose.yml runs.

The pipeline runs as real ``ldp`` processes on 127.0.0.1, each started with its command and environment from
``docker-compose.yml`` (read here, not copied): the token issuer, the collector (``LDP_ALLOW_ORIGINS`` set to
the page's origin, as the compose file passes it), the shuffler, the streaming estimator and the Parquet sink,
on the embedded log instead of Kafka; the collector requires anonymous tokens (``--require-tokens``) as there.
What the test changes in those commands, and why, is in
:class:`Deployment` (the paths and ports of a container become a temporary folder and free ports; the
shuffler's crowd threshold drops to 1, as in tests/web/test_web_e2e.py, so that every report is released and
the estimates can be compared with a known truth: the threshold has its own tests).

``sdk-web/test/browser/journey.ts`` serves a page at ``http://127.0.0.1:21601`` that loads the bundled web SDK
(``scripts/bundle.mjs``) and ships ``metrics/example.json`` as text, as an app would; it simulates
:data:`USERS` users (each a ``TelemetryClient`` with its own IndexedDB database and a seeded
``SimulationSource``, enrolled with the test's enrollment authority and given the ``tokens`` option) who
record their values of every metric of the file (frequency, heavy hitters, mean, distribution) and flush:
each gets its tokens from the issuer (after the key-consistency check against the collector) and pays each
upload with one. A second page, at ``http://127.0.0.1:21602`` (an origin the deployment does not
list), tries the same: the browser refuses it, its SDK says so (failed fetches, ``flush()`` false), its
reports stay on the device (a new client reads them back) and nothing of it lands (the estimator counts
exactly the first page's reports). Then the same users record the same values with the Python SDK (seeded
simulation clients). The two SDKs encode byte for byte alike given the same draws (the shared vectors), but
their seeded generators differ (xoshiro128** in TypeScript, numpy's PCG64 in Python), so the same seeds do
not give the same draws: the two estimates agree within their intervals, not exactly.

Checks, all on one stack, each at a false-alarm rate of 1e-10 (z = 6.47 two-sided, :data:`Z`; about 3,100
checks in all, so below 1e-6 for the test): every web frequency estimate (``GET /v1/estimates``) holds the
true count of each item in its interval at :data:`CONFIDENCE`, and the web mean's interval the true mean; the
Python SDK's estimate (the total minus the web's: frequency and mean estimates are linear in the reports'
sums) lies within Z sd of the truth and of the web's (sd from the mechanism's ``count_variance`` at the truth,
times sqrt 2 for the difference; for the mean, the plug-in variance); the Square Wave reports of each SDK
(the estimator's exact output-bin sums) match the values: their bin sum is within Z sd of its expectation
given each user's input bin (mean and variance of a report's bin from ``transition_matrix``); the heavy
hitter (70% of the users) is discovered by the batch job with its true count in its interval; and the batch
job ``ldp estimate --json`` over the sink's dataset gives the stream's answers (same reports, same
estimator); the collector's spent-token store holds exactly one token per upload of both SDKs. Chromium and
node are required (a failure, not a skip).
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import yaml

from collector.spent_tokens import SpentTokens
from ldp_core.days import utc_day
from ldp_core.mechanisms import frequency_spec
from ldp_core.metrics import MetricSet, load_metrics
from tests.support.pipeline_procs import ROOT, Service, free_port
from tests.web.node_support import run_tsx
from tests.web.test_web_browser import CHROMIUM

METRICS_FILE = ROOT / "metrics" / "example.json"
PAGE_ORIGIN = "http://127.0.0.1:21601"  # the app: listed in LDP_ALLOW_ORIGINS
REFUSED_ORIGIN = "http://127.0.0.1:21602"  # another site: not listed
#: the metrics of metrics/example.json the journey records: all of them (frequency, heavy hitters, mean and
#: distribution); the web SDK must refuse none
JOURNEY_METRICS = (
    "emoji_used",
    "settings_tab",
    "dark_mode",
    "search_word",
    "session_minutes",
    "session_minutes_distribution",
)
FREQUENCY = ("emoji_used", "settings_tab", "dark_mode")
USERS = 150
TOKEN_ORIGIN = "ldp-collector"  # docker-compose.yml's --token-origin
TOKEN_STOCK = 6  # tokens a device fetches at once: one per metric, its uploads of the day
WEB_SEED = 20261206
PY_SEED = 61206
CONFIDENCE = 1 - 1e-10
Z = 6.47  # two-sided normal quantile of 1e-10

EMOJIS = ["😀", "😂", "❤️", "👍", "🎉", "🙏", "😍", "🔥", "😭", "🤔", "✨", "😊", "💯", "😅", "👀", "🙌"]
TABS = ["general", "privacy", "notifications", "appearance", "accounts", "billing"]  # billing: "other"
#: search words and their shares: one heavy hitter the discovery must find, a tail it need not
WORDS = {"weather": 0.7, "news": 0.1, "maps": 0.05, "recipes": 0.05, "football": 0.05, "lyrics": 0.05}


def population(rng: np.random.Generator) -> list[dict[str, list[Any]]]:
    """Each user's values (fixed seed): Zipf-like choices; two settings tabs (the metric allows 2 a day); one
    session length in minutes (gamma, mean 60; a few beyond 240, which the metric clamps) for both numeric
    metrics."""

    def pick(options: list[str], k: int, p: Any = None) -> list[str]:
        w = 1.0 / np.arange(1, len(options) + 1) if p is None else np.asarray(p)
        return [options[i] for i in rng.choice(len(options), size=k, p=w / w.sum())]

    users = []
    for _ in range(USERS):
        minutes = round(float(rng.gamma(2.0, 30.0)), 2)
        users.append(
            {
                "emoji_used": pick(EMOJIS, 1),
                "settings_tab": pick(TABS, 2),
                "dark_mode": pick(["on", "off"], 1),
                "search_word": pick(list(WORDS), 1, list(WORDS.values())),
                "session_minutes": [minutes],
                "session_minutes_distribution": [minutes],
            }
        )
    return users


def truth_of(metrics: MetricSet, users: list[dict[str, list[Any]]]) -> dict[str, np.ndarray]:
    """True counts per item of the frequency metrics; the values (clamped) of the others."""
    out: dict[str, np.ndarray] = {m: np.zeros(frequency_spec(metrics[m].spec).domain_size) for m in FREQUENCY}
    for user in users:
        for m in FREQUENCY:
            for v in user[m]:
                index = metrics[m].domain.index_of(v)
                assert isinstance(index, int), (m, v)
                out[m][index] += 1
    for m in ("session_minutes", "session_minutes_distribution"):
        out[m] = np.clip([u[m][0] for u in users], 0.0, 240.0)
    return out


def reports_per_metric(users: list[dict[str, list[Any]]]) -> dict[str, int]:
    return {m: sum(len(u[m]) for u in users) for m in JOURNEY_METRICS}


# -- the deployment, from docker-compose.yml --------------------------------------------------------------


def _expand(value: str, env: dict[str, str]) -> str:
    """Compose's ``${VAR:-default}`` / ``${VAR:?message}`` interpolation, from ``env``."""

    def one(m: re.Match[str]) -> str:
        name, op, rest = m.group(1), m.group(2), m.group(3)
        if name in env and env[name] != "":
            return env[name]
        assert op != ":?", f"docker-compose.yml needs ${name}: {rest}"
        return rest or ""

    return re.sub(r"\$\{(\w+)(?:(:[-?])([^}]*))?\}", one, value)


def compose_command(
    compose: dict[str, Any], service: str, paths: dict[str, str], overrides: dict[str, str | None]
) -> tuple[list[str], dict[str, str]]:
    """``service``'s command and environment in docker-compose.yml, with the container's paths and the broker
    replaced by ``paths`` (every ``/data/...``, ``/tmp/...``, ``/app/...`` and ``kafka://`` value must be
    mapped) and the flags in ``overrides`` set to a new value (``None``: the flag is dropped; a flag the
    command lacks is added)."""
    spec = compose["services"][service]
    argv: list[str] = []
    command = [str(a) for a in spec["command"]]
    i = 0
    while i < len(command):
        arg = command[i]
        if arg in overrides:
            new = overrides[arg]
            takes_value = i + 1 < len(command) and not command[i + 1].startswith("--")
            if new is not None:
                argv += [arg, new] if takes_value else [arg]
            i += 2 if takes_value else 1
            continue
        if re.match(r"^(/data/|/tmp/|/app/|kafka://)", arg):
            assert arg in paths, f"docker-compose.yml's {service} uses {arg}: map it"
            arg = paths[arg]
        argv.append(arg)
        i += 1
    for flag, value in overrides.items():
        if flag not in command and value is not None:
            argv += [flag, value]
    env = {}
    for k, v in (spec.get("environment") or compose["x-ldp"]["environment"]).items():
        v = _expand(str(v), paths)
        env[k] = paths.get(v, v)
    return argv, env


class Deployment:
    """The compose services as ``ldp`` processes in ``workdir``."""

    def __init__(self, workdir: Path, *, allow_origins: str, authority_key: str) -> None:
        compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
        self.workdir = workdir
        ports = {p: str(free_port()) for p in ("8080", "8090", "8091", "9464")}
        self.collector_url = f"http://127.0.0.1:{ports['8080']}"
        self.estimator_url = f"http://127.0.0.1:{ports['8090']}"
        self.issuer_url = f"http://127.0.0.1:{ports['8091']}"
        self.collector_metrics_url = f"http://127.0.0.1:{ports['9464']}/metrics"
        self.dataset = workdir / "dataset"
        issuer_state = workdir / "issuer"
        paths = {
            # the compose services' transport (the three-node cluster) is one embedded log here
            compose["x-ldp"]["environment"]["LDP_TRANSPORT"]: f"sqlite:///{workdir / 'transport.sqlite3'}",
            "/app/metrics/example.json": str(METRICS_FILE),
            "/data/issuer": str(issuer_state),
            # the token-keys volume: the issuer writes the public halves, the collector reads them
            "/data/token-keys": str(issuer_state / "public"),
            "/data/collector/batch-ids.sqlite3": str(workdir / "batch-ids.sqlite3"),
            "/data/collector/spent-tokens.sqlite3": str(workdir / "spent-tokens.sqlite3"),
            "/data/estimator": str(workdir / "estimator"),
            "/data/dataset": str(self.dataset),
            "/tmp/ldp-shuffler.status.json": str(workdir / "shuffler.status.json"),
            "/tmp/ldp-sink.status.json": str(workdir / "sink.status.json"),
            "LDP_ALLOW_ORIGINS": allow_origins,
            "LDP_ISSUER_AUTHORITY_KEY": authority_key,
        }
        loopback = {"--host": "127.0.0.1"}
        overrides: dict[str, dict[str, str | None]] = {
            "issuer": {**loopback, "--port": ports["8091"]},
            "collector": {
                **loopback,
                "--port": ports["8080"],
                "--metrics-host": "127.0.0.1",
                "--metrics-port": ports["9464"],
            },
            # the container's working folder (/app/ldp-data/shuffler.key by default) is the temporary one here
            "shuffler": {"--min-batch": "1", "--key-file": str(workdir / "shuffler.key")},
            "estimator": {**loopback, "--port": ports["8090"]},
            "sink": {},
        }
        ready = {
            "issuer": ("listening on", self.issuer_url),
            "collector": ("listening on", self.collector_url),
            "shuffler": ("ldp shuffler: running", None),
            "estimator": ("listening on", self.estimator_url),
            "sink": ("ldp sink: writing", None),
        }
        self.services: dict[str, Service] = {}
        self.env: dict[str, dict[str, str]] = {}
        for name, over in overrides.items():
            argv, env = compose_command(compose, name, paths, over)
            text, url = ready[name]
            self.services[name] = Service(name, argv, workdir / f"{name}.log", text, url)
            self.env[name] = env

    def start(self) -> None:
        """Launch every service, the collector once the issuer is ready (compose's ``depends_on``), and wait
        until each is ready."""

        def launch(name: str) -> None:
            os.environ.update(self.env[name])  # Service.launch hands os.environ to Popen
            try:
                self.services[name].launch()
            finally:
                for k in self.env[name]:
                    os.environ.pop(k, None)

        for name in self.services:
            if name != "collector":
                launch(name)
        self.services["issuer"].wait_ready(90)
        assert httpx.get(self.issuer_url + "/readyz", timeout=30).status_code == 200
        launch("collector")
        for s in self.services.values():
            s.wait_ready(90)

    def stop(self) -> None:
        for s in self.services.values():
            if s.alive():
                assert s.proc is not None
                s.proc.terminate()
        for s in self.services.values():
            s.stop()  # waits for the exit (kills after 30 s)

    def tails(self) -> str:
        return "\n".join(f"--- {n}\n{s.tail(15)}" for n, s in self.services.items())

    def counted(self) -> dict[str, int]:
        r = httpx.get(f"{self.estimator_url}/v1/estimates", timeout=30)
        r.raise_for_status()
        out: dict[str, int] = {}
        for e in r.json()["estimates"]:
            out[e["metric"]] = out.get(e["metric"], 0) + e["n"]
        return out

    def wait_counted(self, expected: dict[str, int], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while (got := self.counted()) != expected:
            assert all(got.get(m, 0) <= n for m, n in expected.items()), f"counted more than sent: {got}"
            assert time.monotonic() < deadline, f"counted {got}, expected {expected}\n{self.tails()}"
            for s in self.services.values():
                assert s.alive(), f"{s.name} exited:\n{s.tail()}"
            time.sleep(0.2)

    def estimates(self, metric: str, day: int) -> dict[str, Any]:
        r = httpx.get(
            f"{self.estimator_url}/v1/estimates/{metric}", params={"day": day, "confidence": CONFIDENCE}, timeout=60
        )
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        return body


# -- the SDKs -----------------------------------------------------------------------------------------------


def web_pages(
    dep: Deployment, metrics: MetricSet, users: list[dict[str, list[Any]]], workdir: Path, authority: Any
) -> Any:
    policy = {
        "perMetricDaily": max(m.daily_epsilon for m in metrics.values()),
        "totalDaily": sum(m.daily_epsilon for m in metrics.values()),
    }
    common = {
        "collectorUrl": dep.collector_url,
        "bundledMetrics": METRICS_FILE.read_text(),
        "policy": policy,
        "concurrency": 12,
        "tokens": {"issuerUrl": dep.issuer_url, "origin": TOKEN_ORIGIN, "stock": TOKEN_STOCK},
    }

    def devices(prefix: str, n: int) -> list[str]:
        """Each simulated user's enrollment bundle (``ldp issuer enroll``'s file, as text)."""
        return [json.dumps(authority.enroll(f"{prefix}-{i}").to_dict()) for i in range(n)]

    plan = {
        "pages": [
            {
                **common,
                "origin": PAGE_ORIGIN,
                "users": users,
                "devices": devices("web", len(users)),
                "seed": WEB_SEED,
                "storagePrefix": "journey",
            },
            {
                **common,
                "origin": REFUSED_ORIGIN,
                "users": users[:3],
                "devices": devices("other-site", 3),
                "seed": WEB_SEED,
                "storagePrefix": "refused",
                "reopen": True,  # after the failed flushes, count what each device still holds
            },
        ]
    }
    path = workdir / "plan.json"
    path.write_text(json.dumps(plan, ensure_ascii=False))
    assert os.access(CHROMIUM, os.X_OK), f"{CHROMIUM} is required (scripts/install-browser)"
    out = run_tsx("test/browser/journey.ts", str(path), CHROMIUM, timeout=900)
    (workdir / "pages.json").write_text(json.dumps(out))
    return out


def python_devices(
    dep: Deployment, metrics: MetricSet, users: list[dict[str, list[Any]]], workdir: Path, authority: Any
) -> None:
    """The same users, values and metrics with the Python SDK (seeded simulation clients)."""
    from client_sdk.client import TelemetryClient
    from client_sdk.config import ClientConfig
    from client_sdk.policy import LocalPolicy

    policy = LocalPolicy(
        per_metric_daily=max(m.daily_epsilon for m in metrics.values()),
        total_daily=sum(m.daily_epsilon for m in metrics.values()),
    )

    def device(i: int) -> None:
        bundle = workdir / f"device-{i}-enrollment.json"
        bundle.parent.mkdir(parents=True, exist_ok=True)
        authority.enroll(f"py-{i}").save(bundle)
        config = ClientConfig(
            mode="simulation",
            simulation_seed=PY_SEED + i,
            batch_max_age=0.0,
            issuer_url=dep.issuer_url,
            enrollment_path=bundle,
            token_origin=TOKEN_ORIGIN,
            token_stock=TOKEN_STOCK,
        )
        with TelemetryClient(workdir / f"device-{i}", dep.collector_url, policy, metrics, config=config) as client:
            for metric, values in users[i].items():
                for v in values:
                    client.record(metric, v)
            assert client.flush(timeout=60), client.errors()
            assert client.pending_reports() == 0

    with ThreadPoolExecutor(8) as pool:  # devices are independent (own folders); the uploads overlap
        list(pool.map(device, range(len(users))))


def batch_estimate(dep: Deployment, metric: str, day: int, include_noise: bool = False) -> dict[str, Any]:
    """``ldp estimate --json`` over the sink's dataset (the CLI's code, in this process); ``include_noise`` lists
    heavy-hitter candidates below the reporting rule too (flagged ``could_be_noise``)."""
    from ldp_cli.main import main

    argv = ["estimate", "--dataset", str(dep.dataset), "--metric", metric, "--days", str(day)]
    argv += ["--confidence", str(CONFIDENCE), "--metrics", str(METRICS_FILE), "--json", "--no-progress"]
    argv += ["--include-noise"] if include_noise else []
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert main(argv) == 0, err.getvalue()
    answer: dict[str, Any] = json.loads(out.getvalue())
    return answer


def wait_dataset(dep: Deployment, total: int, timeout: float = 60.0) -> None:
    import pyarrow.parquet as pq

    deadline = time.monotonic() + timeout
    while True:
        n = sum(pq.read_metadata(f).num_rows for f in dep.dataset.rglob("part-*.parquet"))
        if n >= total:
            assert n == total, f"the dataset holds {n} reports, {total} were sent"
            return
        assert time.monotonic() < deadline, f"the dataset holds {n} of {total} reports\n{dep.tails()}"
        time.sleep(0.2)


# -- the checks, per kind ---------------------------------------------------------------------------------------


def check_frequency(metrics: MetricSet, truth: dict[str, np.ndarray], web: Any, total: Any) -> None:
    """The web estimate holds every true count in its interval; the Python SDK's (total - web) is within Z sd of
    the truth and of the web's, sd from the mechanism's count_variance at the truth."""
    for m in FREQUENCY:
        t, body = truth[m], web[m]
        lo, hi = np.array(body["ci_low"]), np.array(body["ci_high"])
        assert body["confidence"] == CONFIDENCE
        bad = np.flatnonzero((t < lo) | (t > hi))
        assert bad.size == 0, f"{m}: true counts outside the intervals at {bad[:10]}: {t[bad[:10]]}"
        sd = np.sqrt(frequency_spec(metrics[m].spec).count_variance(t))
        py = np.array(total[m]["counts"]) - np.array(body["counts"])
        z_truth = (py - t) / sd
        z_web = (py - np.array(body["counts"])) / (np.sqrt(2) * sd)
        assert np.all(np.abs(z_truth) < Z), f"{m}: Python SDK vs truth, z = {np.round(z_truth, 2)}"
        assert np.all(np.abs(z_web) < Z), f"{m}: Python SDK vs web SDK, z = {np.round(z_web, 2)}"


def check_mean(truth: dict[str, np.ndarray], web: Any, total: Any) -> None:
    """The web mean's interval holds the true mean; the Python SDK's mean (2 total - web: equal counts) is within
    Z sd of the truth and of the web's, its variance 2x the total's (plug-in: half the reports)."""
    m = "session_minutes"
    true_mean = float(np.mean(truth[m]))
    w, t = web[m], total[m]
    assert w["ci_low"][0] <= true_mean <= w["ci_high"][0], (true_mean, w)
    var_one = 2.0 * t["variance"][0]
    py = 2.0 * t["mean"][0] - w["mean"][0]
    assert abs(py - true_mean) < Z * np.sqrt(var_one), (py, true_mean, var_one)
    assert abs(py - w["mean"][0]) < Z * np.sqrt(2 * var_one), (py, w["mean"][0], var_one)


def check_distribution(metrics: MetricSet, truth: dict[str, np.ndarray], web_bins: Any, total_bins: Any) -> None:
    """Square Wave reports as the values say: the sum of the reported output bins (the estimator's exact sums)
    against its expectation given each user's input bin, sd from the transition matrix (sum over users of
    the variance of one report's bin) - for the web's reports and for the Python SDK's (total - web)."""
    m = "session_minutes_distribution"
    spec = metrics[m].spec
    matrix = spec.transition_matrix()  # [out bin, in bin]
    j = np.arange(matrix.shape[0], dtype=np.float64)
    mu, second = j @ matrix, (j * j) @ matrix
    inputs = spec.input_bins(truth[m])
    expect, sd = float(mu[inputs].sum()), float(np.sqrt((second - mu * mu)[inputs].sum()))
    web_bins, total_bins = np.asarray(web_bins), np.asarray(total_bins)
    for who, bins in (("web", web_bins), ("python", total_bins - web_bins)):
        assert bins.sum() == len(inputs), (who, bins.sum())
        z = (float(j @ bins) - expect) / sd
        assert abs(z) < Z, f"{m}: {who} SDK's Square Wave reports, z = {z:.2f}"


def state_sums(dep: Deployment, metric: str, day: int) -> dict[str, Any]:
    """The estimator's exact sums of ``metric`` on ``day`` (``GET /v1/state``: what it counted)."""
    from estimator.service.state import EstimatorState

    r = httpx.get(f"{dep.estimator_url}/v1/state", timeout=60)
    r.raise_for_status()
    keys = {k: ks for k, ks in EstimatorState.from_json_obj(r.json()).counted().keys.items() if k[0] == metric}
    assert [k[2] for k in keys] == [day], keys
    return dict(next(iter(keys.values())).acc.sums)


# -- the journey ----------------------------------------------------------------------------------------------


def check_pages(app: Any, other: Any, metrics: MetricSet, per_metric: dict[str, int], dep: Deployment) -> None:
    # the app's page: cross-origin, every user's reports delivered, nothing refused or left over
    assert app["origin"] == PAGE_ORIGIN != dep.collector_url
    assert app["metricsError"] is None and app["served"] == sorted(metrics), app
    assert sorted(set(metrics) - set(app["unsupported"])) == sorted(JOURNEY_METRICS), app["unsupported"]
    assert app["fetchErrors"] == 0 and app["consoleErrorCount"] == 0, app
    assert app["flushed"] == USERS and app["pending"] == 0 and app["rejections"] == [], app
    assert app["stats"]["recorded"] == sum(per_metric.values()) == app["stats"]["uploaded_reports"], app
    assert {k: v for k, v in app["errors"].items() if v} == {}, app

    assert app["sent"] == sum(per_metric.values()) and app["refused"] == 0 and app["waiting"] == {}, app
    assert app["stats"]["tokens_fetched"] >= len(JOURNEY_METRICS) * USERS, app["stats"]

    # the other site's page: the browser refuses it (collector and issuer alike), the SDK says so
    # (flushResult: nothing sent, reports waiting on a transient failure), the reports stay on the device
    assert other["origin"] == REFUSED_ORIGIN
    assert other["metricsError"] is not None and "Failed to fetch" in other["metricsError"], other
    assert other["fetchErrors"] >= 3 and other["flushed"] == 0 and other["sent"] == 0, other
    assert sum(other["waiting"].values()) == 3, other
    assert other["stats"]["uploaded_reports"] == 0 and other["stats"].get("tokens_fetched", 0) == 0, other
    assert other["stats"]["recorded"] == 3 * 7 == sum(other["kept"]), other
    assert any("blocked by CORS policy" in e for e in other["consoleErrors"]), other


def test_web_journey_through_the_compose_deployment(tmp_path: Path) -> None:
    from ldp_core.tokens.enrollment import EnrollmentAuthority

    metrics = load_metrics(METRICS_FILE, reject_expired=False)
    users = population(np.random.default_rng(WEB_SEED))
    truth = truth_of(metrics, users)
    per_metric = reports_per_metric(users)
    authority = EnrollmentAuthority.generate()
    dep = Deployment(tmp_path, allow_origins=PAGE_ORIGIN, authority_key=base64.b64encode(authority.public_key).decode())
    day = utc_day(time.time())
    sw = "session_minutes_distribution"
    try:
        dep.start()
        out = web_pages(dep, metrics, users, tmp_path, authority)
        check_pages(*out["pages"], metrics, per_metric, dep)

        # nothing of the refused page landed: the estimator counts exactly the app's reports
        dep.wait_counted(per_metric)
        web = {m: dep.estimates(m, day) for m in JOURNEY_METRICS}
        assert {m: web[m]["n"] for m in JOURNEY_METRICS} == per_metric
        web_bins = state_sums(dep, sw, day)["bins"]

        # the Python SDK: the same users and values, through the same deployment
        python_devices(dep, metrics, users, tmp_path / "py", authority)
        dep.wait_counted({m: 2 * n for m, n in per_metric.items()})
        total = {m: dep.estimates(m, day) for m in JOURNEY_METRICS}
        total_bins = state_sums(dep, sw, day)["bins"]

        # the batch job over the sink's dataset
        wait_dataset(dep, 2 * sum(per_metric.values()))
        # 300 users are far too few for the heavy-hitter reporting rule (Bonferroni over every candidate at
        # 1 - 1e-10): the candidates are listed with their flags, and the check is on what they carry
        batch = {m: batch_estimate(dep, m, day, include_noise=m == "search_word") for m in JOURNEY_METRICS}
        # every upload of both SDKs paid with its own anonymous token (the collector's record of redeemed ones)
        store = SpentTokens(tmp_path / "spent-tokens.sqlite3")
        spent = len(store.records())
        store.close()
        assert spent == 2 * USERS * len(JOURNEY_METRICS), spent
        # the compose collector serves its port with the native front: every upload went its fast path, the
        # rest (metrics document, token keys, CORS preflights, readiness) through its proxy to the app
        front = front_events(dep)
        assert front["uploads"] >= spent and front["proxied"] >= 2, front
        (tmp_path / "journey.json").write_text(json.dumps({"web": web, "total": total, "batch": batch}))
    finally:
        dep.stop()

    check_frequency(metrics, truth, web, total)
    check_mean(truth, web, total)
    check_distribution(metrics, truth, web_bins, total_bins)
    check_heavy_hitters(users, web, total, batch)
    check_batch_agrees(total, batch)


def front_events(dep: Deployment) -> dict[str, float]:
    """``ldp_collector_front_events_total`` by event, from the collector's operational-metrics port."""
    text = httpx.get(dep.collector_metrics_url, timeout=30).text
    found = re.findall(r'^ldp_collector_front_events_total\{event="(\w+)"\} (\S+)$', text, re.M)
    return {event: float(value) for event, value in found}


def check_heavy_hitters(users: list[dict[str, list[Any]]], web: Any, total: Any, batch: Any) -> None:
    """PEM: the stream counts each SDK's reports per level; the batch job over the dataset (both SDKs: twice
    the users) ranks the heavy hitter first among its candidates, its interval holding its true count (300 users are
    too few for the reporting rule, so the candidates are read with ``--include-noise``)."""
    m = "search_word"
    assert web[m]["n"] == USERS and total[m]["n"] == 2 * USERS
    assert sum(total[m]["reports_per_part"]) == 2 * USERS
    true_count = 2 * sum(u[m][0] == "weather" for u in users)
    assert batch[m]["rows"] and batch[m]["rows"][0]["value"] == "weather", batch[m]["rows"][:5]  # ranked first
    rows = {r["value"]: r for r in batch[m]["rows"]}
    assert rows["weather"]["ci_low"] <= true_count <= rows["weather"]["ci_high"], (true_count, rows["weather"])


def check_batch_agrees(total: Any, batch: Any) -> None:
    """The batch job reads the sink's copy of the reports the estimator counted: the same answers."""
    for m in JOURNEY_METRICS:
        assert batch[m]["n"] == total[m]["n"], (m, batch[m]["n"], total[m]["n"])
    for m in FREQUENCY:
        rows = sorted(batch[m]["rows"], key=lambda r: r["item"])
        np.testing.assert_allclose([r["estimate"] for r in rows], total[m]["counts"], rtol=1e-9, atol=1e-6)
        np.testing.assert_allclose([r["ci_low"] for r in rows], total[m]["ci_low"], rtol=1e-9, atol=1e-6)
    mean_rows = batch["session_minutes"]["rows"]
    np.testing.assert_allclose([r["mean"] for r in mean_rows], total["session_minutes"]["mean"], rtol=1e-9)
    sw = "session_minutes_distribution"
    np.testing.assert_allclose([r["share"] for r in batch[sw]["rows"]], total[sw]["hist"], rtol=1e-6, atol=1e-9)
    stream_q = [total[sw]["quantiles"][f"p{round(q['q'] * 100, 6):g}"]["value"] for q in batch[sw]["quantiles"]]
    np.testing.assert_allclose([q["value"] for q in batch[sw]["quantiles"]], stream_q, rtol=1e-6)
