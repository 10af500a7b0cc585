"""DP-FTRL with secure aggregation over the pipeline (embedded log), and what a reader of the topics learns.

* The job unmasks each round's sum of clipped, quantized updates and adds the tree's increment to it:
  the model moves by exactly (decoded sums + the tree's released noise) / m̄, a client contributes at
  most once per tree (left out of the sample otherwise), stopping and restarting the job mid-tree
  ends bit-identical to an uninterrupted run, and ε per adversary is DP-FTRL's figure (none against
  the operator, whose noise is central).
* The attack: whoever reads ``ldp.fl.updates`` (the operator, or anyone with access to the topic)
  tries to read a device's update from its upload. With SecAgg it finds uniform words (a KS test cannot
  tell them from uniform; the device's own quantized words are far from it); on the plain ``dp_ftrl``
  path, the only one before, the upload *is* the clipped update, recovered exactly.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from estimator.fl.aggregator_specs import secagg_quantization_slack
from estimator.fl.ftrl import ftrl_epsilon
from ldp_core.fl.protocol import parse_upload
from ldp_core.fl.secagg import Quantizer
from pipeline.transport import open_transport
from tests.support.fl_pipeline_support import (
    JobThread,
    Topics,
    collector,
    devices_for,
    drive,
    final_params,
    make_data,
    reference_run,
    run_with_restart,
    task_spec,
)

N_CLIENTS, COUNT, ROUNDS, RESTART = 10, 5, 4, 2
Z, C = 0.8, 0.5


def _spec(name: str, secagg: bool = True) -> Any:
    return task_spec(
        name,
        N_CLIENTS,
        secagg=secagg,
        sampling={"kind": "fixed", "count": COUNT},
        rounds=ROUNDS,
        clip_norm=C,
        noise_multiplier=Z,
        aggregator={"kind": "dp_ftrl", "restart_every": RESTART},
        phase_timeout=20.0,
    )


def _run(tmp: Path, spec: Any) -> tuple[dict[str, Any], list[Any], list[Any], np.ndarray, Any]:
    """One uninterrupted run: (status, devices, every record of the updates topic, first model, the job)."""
    data = make_data(N_CLIENTS)
    topics = Topics.fresh()
    url = f"sqlite:///{tmp}/transport.sqlite3"
    with open_transport(url) as tr, collector(tmp, url, topics) as srv:
        devices = devices_for(srv.url, spec, data)
        with JobThread(tr, spec, topics, checkpoint_interval=0.2) as jt:
            x0 = jt.job._st.params.copy()
            drive(devices, jt.finished, timeout=90)
            status = jt.result
            job = jt.job
        reader = tr.consume(topics.updates, f"reader-{topics.group}")
        records = list(reader.records(idle_timeout=1.0))
        reader.close()
    assert status is not None
    return status, devices, records, x0, job


def test_dp_ftrl_runs_with_secagg_and_restarts_bit_identical(tmp_path: Path) -> None:
    spec = _spec("ftrl-sa")
    status, devices, _, x0, job = _run(tmp_path / "a", spec)
    hist = status["history"]
    assert [h.get("failed") for h in hist] == [None] * ROUNDS, hist
    # once per tree: the devices whose masked input went into round r's sum, disjoint within each tree
    by_round = [{d.client_id for d in devices if r in d.quantized} for r in range(ROUNDS)]
    assert [len(s) for s in by_round] == [h["clients"] for h in hist]
    for t in range(0, ROUNDS, RESTART):
        assert not by_round[t] & by_round[t + 1]
    assert any(len(s) < COUNT for s in by_round)  # the rule acted on this seed's sample
    assert [h["tree_step"] for h in hist] == [1, 2, 1, 2]
    # the node noise covers the decoded contributions' norm bound C + slack (float32 clip + rounding)
    slack = secagg_quantization_slack(spec)
    assert 0 < slack < 1e-6 and job._ftrl.tree.stddev == Z * (C + slack) == hist[-1]["noise_stddev"]
    # the model moved by the unmasked sums plus the tree's noise: the residual is the noise the trees
    # released, i.e. the last tree's prefix plus the first tree's (seen through the rounds' decoded sums)
    x = x0.astype(np.float64)
    decoded = []
    for r in range(ROUNDS):
        total = np.zeros(5, np.uint32)
        for d in devices:
            if r in d.quantized:
                total += d.quantized[r]
        decoded.append(Quantizer.for_clients(len(by_round[r]), C).decode_sum(total))
    residual = (final_params(status).astype(np.float64) - x) * COUNT - sum(decoded)
    second_tree = job._ftrl.tree.prefix()  # each tree's released noise: one level-1 node, N(0, (zC)²)
    assert job._ftrl.tree.trees == 2 and np.min(np.abs(second_tree)) > 1e-3
    # (the first tree's is checked against the restarted job's restored tree below; float32 rounding of
    # the model over 4 steps, times m̄ = 5, stays below 1e-4 while the noise's scale is zC = 0.4)
    # ε: DP-FTRL's exact figure, the same for observers and whoever knows the sample; none against the operator
    eps = ftrl_epsilon(Z, ROUNDS, spec.delta, RESTART)
    assert hist[-1]["epsilon"] == eps
    by = {a["adversary"]: a for a in status["epsilon_by_adversary"]}
    assert by["observer"]["epsilon"] == by["knows_sample"]["epsilon"] == eps
    assert by["observer"]["amplification"] is False
    assert by["server_operator"]["epsilon"] is None and "un-noised sum" in by["server_operator"]["sees"]

    seen: dict[str, Any] = {}

    def at_restore(jt: Any, st: dict[str, Any]) -> None:
        ftrl = jt.job._ftrl
        seen.update(round=st["round"], params=jt.job._st.params.astype(np.float64), prefix=ftrl.tree.prefix())

    restarted = run_with_restart(tmp_path / "b", spec, make_data(N_CLIENTS), at_restore)
    assert np.array_equal(final_params(restarted), final_params(status))
    # the restored job's tree is the first tree's (restore after round 1 or 2 of it): the model's residual
    # up to there is exactly its prefix noise; the devices' words are the same in both runs (seeded)
    r0 = seen["round"]
    assert r0 in (1, 2)
    part = (seen["params"] - x) * COUNT - sum(decoded[:r0])
    assert np.max(np.abs(part - seen["prefix"])) < 1e-4 and np.min(np.abs(seen["prefix"])) > 1e-3
    if r0 == 2:  # the whole first tree: the final residual is the first tree's noise plus the second's
        assert np.max(np.abs(residual - seen["prefix"] - second_tree)) < 1e-4
    keep = ("round", "clients", "epsilon", "tree_step", "secagg_survivors")
    assert [{k: h[k] for k in keep} for h in restarted["history"]] == [{k: h[k] for k in keep} for h in hist]


def _uploads(records: list[Any], kind: str) -> list[Any]:
    out = []
    for rec in records:
        u = parse_upload(rec.value, payload_size=5)
        if u.kind == kind:
            out.append(u)
    return out


def test_a_reader_of_the_updates_topic_sees_uniform_words_with_secagg(tmp_path: Path) -> None:
    status, devices, records, _, _ = _run(tmp_path, _spec("ftrl-sa-read"))
    masked = _uploads(records, "masked")
    assert not _uploads(records, "update")  # no plain update is ever published
    quantized = {(d.client_id, r): q for d in devices for r, q in d.quantized.items()}
    assert len(masked) == len(quantized) == sum(h["clients"] for h in status["history"])
    words = np.concatenate([np.asarray(u.payload["vector"], np.uint32) for u in masked]).astype(np.float64)
    truth = np.concatenate(list(quantized.values())).astype(np.float64)
    # KS against U[0, 2^32): the masked words pass at 1e-3; the devices' own quantized words (what the
    # reader would need) sit within s·C ≈ 2^31/n of 0 mod 2^32 and fail by far
    assert stats.kstest(words / 2**32, "uniform").pvalue > 1e-3
    assert stats.kstest(truth / 2**32, "uniform").pvalue < 1e-6
    # and none of the masked uploads is (or decodes near) the device's update it carries
    for u in masked:
        q = quantized[(u.client_id, u.round)]
        assert not np.array_equal(np.asarray(u.payload["vector"], np.uint32), q)


def test_on_the_plain_dp_ftrl_path_the_reader_recovers_every_clipped_update(tmp_path: Path) -> None:
    """The same reader on the path dp_ftrl had before SecAgg: each upload is the device's clipped float32
    update, so the attack above succeeds exactly (and the KS check of uniform words fails)."""
    spec = _spec("ftrl-plain-read", secagg=False)
    status, devices, records, _, _ = _run(tmp_path, spec)
    ups = _uploads(records, "update")
    assert len(ups) == COUNT * ROUNDS and not _uploads(records, "masked")
    sent: dict[tuple[str, int], np.ndarray] = {}

    def capture(r: int, batch: list[Any]) -> list[Any]:  # what each device uploads (run_rounds' twin)
        sent.update({(u.client_id, r): np.asarray(u.delta, np.float32) for u in batch})
        return batch

    reference_run(spec, make_data(N_CLIENTS), tamper=capture)
    for u in ups:  # the reader holds each device's clipped update exactly
        assert np.array_equal(np.asarray(u.payload["vector"], np.float32), sent[(u.client_id, u.round)])
    with pytest.raises(AssertionError):
        words = np.concatenate([np.asarray(u.payload["vector"], np.float32).view(np.uint32) for u in ups])
        assert stats.kstest(words.astype(np.float64) / 2**32, "uniform").pvalue > 1e-3
    assert math.isfinite(status["history"][-1]["epsilon"])
