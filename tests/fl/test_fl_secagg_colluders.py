"""SecAgg against a malicious server with colluding share holders, and against Sybil neighbours (issue 28).

Every attack plays the server over HTTP against real :class:`client_sdk.fl.device.FLDevice` objects
(:mod:`tests.support.secagg_adversary`). Before the fix the devices required only 2t > holders: the split with
1 colluder on a server-chosen graph (n = 7, t = 3) and on the job's own graph for 6 clients (complete, t = 3),
and with 2 colluders on a server-chosen graph and on neighbor_graph(16, 8) with t = 5, recovered the target's
quantized update exactly, and so did the server that showed the target only Sybil neighbours with ids outside
the task. Now the task signs its collusion bound c (``max_colluders``) and its client set; devices refuse a
round with 2t ≤ holders + c, and adverts of ids outside the task."""

from __future__ import annotations

import numpy as np
import pytest

from estimator.fl.secagg_server import default_threshold, neighbor_graph
from ldp_core.fl.secagg import split_attack_possible, threshold_for_colluders
from tests.support.fl_pipeline_support import make_data, task_spec
from tests.support.secagg_adversary import run_mitm, run_split

# A graph the server picks on 7 clients: client 1 (the target) has 5 holders, 2..6; 7 is not its neighbour. Every
# degree is at most 5, so 2t = 6 > holders everywhere (the old rule holds) while 5 + c >= 6 for any colluder; the
# edges let t - c holders on each side count t signatures of their own survivor set among their neighbours
SERVER_GRAPH = {
    1: (2, 3, 4, 5, 6),
    2: (1, 3, 4, 5, 6),
    3: (1, 2, 4, 7),
    4: (1, 2, 3),
    5: (1, 2, 6, 7),
    6: (1, 2, 5, 7),
    7: (3, 5, 6),
}


def _complete(n: int) -> dict[int, tuple[int, ...]]:
    return {u: tuple(v for v in range(1, n + 1) if v != u) for u in range(1, n + 1)}


def _spec(name: str, n: int, c: int):  # type: ignore[no-untyped-def]
    return task_spec(name, n, secagg=True, sampling={"kind": "fixed", "count": n}, rounds=1, max_colluders=c)


HARARY_16 = neighbor_graph(16, 8, np.random.default_rng(0))
#: the two colluders the server picks among client 1's neighbours on HARARY_16: the first pair (in the order of
#: itertools.combinations of its neighbour list) for which a consistent split exists; for (3, 4) none does
HARARY_PAIR = (3, 5)

CASES = [
    # (name, graph, t the server asks for, colluders among the target's holders)
    ("server-graph-1", SERVER_GRAPH, 3, (2,)),
    ("server-graph-2", SERVER_GRAPH, 3, (2, 3)),
    ("harary-16-8-2", HARARY_16, 5, HARARY_PAIR),
]
HONEST = [
    ("harary-16-8-1", HARARY_16, tuple(HARARY_16[1][:1])),
    ("harary-16-8-2", HARARY_16, HARARY_PAIR),
    ("complete-6-1", _complete(6), (2,)),
]


@pytest.mark.parametrize("name, graph, t, colluders", CASES, ids=[c[0] for c in CASES])
def test_the_split_attack_works_when_the_task_understates_collusion(name, graph, t, colluders) -> None:  # type: ignore[no-untyped-def]
    """The control: a task that states max_colluders = 0 (what every task implied before) gets exactly that
    protection, so the same server recovers the target's quantized update bit for bit. This is the attack
    that succeeded on the old code for every case (checked once against the commit before the fix)."""
    n = len(graph)
    assert split_attack_possible(len(graph[1]), t, len(colluders)) and not split_attack_possible(len(graph[1]), t, 0)
    res = run_split(_spec(f"{name}-c0", n, 0), graph, t, 1, colluders, make_data(n))
    assert res.recovered, res


@pytest.mark.parametrize("name, graph, t, colluders", CASES, ids=[c[0] for c in CASES])
def test_devices_refuse_a_threshold_a_split_with_the_stated_colluders_could_break(name, graph, t, colluders) -> None:  # type: ignore[no-untyped-def]
    """The task states c = the colluders used: the target refuses to share its secrets (counted under
    ``collusion_bound``, the reason in ``last_error``), so the server recovers nothing."""
    n, c = len(graph), len(colluders)
    res = run_split(_spec(f"{name}-c{c}", n, c), graph, t, 1, colluders, make_data(n))
    assert not res.recovered
    assert res.reason == "the target refused to share its secrets"
    assert res.target_errors.get("collusion_bound") == 1
    assert res.target_last_error is not None and "2t > holders + colluders" in res.target_last_error


@pytest.mark.parametrize("name, graph, colluders", HONEST, ids=[c[0] for c in HONEST])
def test_the_jobs_own_threshold_for_the_stated_colluders_leaves_no_split(name, graph, colluders) -> None:  # type: ignore[no-untyped-def]
    """On the job's graphs, with the t the job now picks for c (⌊(k + c)/2⌋ + 1: 5 for degree 8 and c = 1, 6 for
    c = 2, 4 for K6 and c = 1) the devices take part, and the same server cannot find t − c honest holders per
    side (2(t − c) > k − c)."""
    n, c = len(graph), len(colluders)
    k = len(graph[1])
    t_job = default_threshold(k, c)
    assert t_job == threshold_for_colluders(k, c) and not split_attack_possible(k, t_job, c)
    res = run_split(_spec(f"{name}-job", n, c), graph, t_job, 1, colluders, make_data(n))
    assert not res.recovered
    assert res.reason.startswith("too few honest holders"), res
    assert "collusion_bound" not in res.target_errors


def test_one_colluder_on_the_old_default_graphs_is_stopped_by_parity_and_the_consistency_round() -> None:
    """Why the matrix above has no honest-graph case with 1 colluder that works on the old code: the job's
    Harary graphs have an even degree k, where the old t = k/2 + 1 already gives 2t > k + 1; its complete graphs
    (odd k, t = (k + 1)/2) allow the count, but every other client is a holder there, so a holder told "the target
    dropped" sees only t − 1 other signatures on its set and reveals nothing (the consistency round)."""
    assert not split_attack_possible(8, default_threshold(8), 1)
    res = run_split(_spec("k6-c0", 6, 0), _complete(6), 3, 1, (2,), make_data(6))
    assert not res.recovered
    assert res.reason.startswith("no assignment of survivor sets"), res


def test_a_server_showing_only_sybil_neighbours_outside_the_task_gets_nothing() -> None:
    """The MITM: every advert the target sees is from a device the operator's authority enrolled under an id the
    task does not name. Before the fix the target shared its secrets with them and the server unmasked its
    input; now each advert is refused (``advert_outside_task``) and, with fewer than t neighbours left, the
    target shares nothing."""
    graph = _complete(5)
    res = run_mitm(_spec("mitm", 5, 1), graph, 3, 1, make_data(5))
    assert not res.recovered
    assert res.target_errors.get("advert_outside_task") == 4
    assert res.reason == "the target sent no shares"


def test_a_pinned_authority_refuses_what_the_operators_authority_minted() -> None:
    """The operator holds the task's usual authority (the tests' AUTHORITY) and can mint credentials for ids in
    the task. A device configured with an authority the operator does not hold refuses an identity the operator
    re-issued for it, and every neighbour advert whose credential the operator's authority signed; the same
    neighbours enrolled by the pinned authority pass."""
    import base64
    import os

    from client_sdk.fl.device import FLDevice
    from ldp_core.fl.errors import FLError
    from ldp_core.fl.protocol import make_upload, sign_upload
    from ldp_core.tokens.enrollment import EnrollmentAuthority
    from tests.support.fl_pipeline_support import enroll

    independent = EnrollmentAuthority.generate()
    spec = _spec("pinned", 4, 1)
    x, y = make_data(1)[0]
    with pytest.raises(FLError, match="another enrollment authority"):
        FLDevice(
            "http://127.0.0.1:9",
            spec.task,
            "dev-0",
            x,
            y,
            identity=enroll("dev-0"),
            pinned_authority_key=independent.public_key,
        )
    dev = FLDevice(
        "http://127.0.0.1:9",
        spec.task,
        "dev-0",
        x,
        y,
        identity=independent.enroll("dev-0"),
        pinned_authority_key=independent.public_key,
    )

    def view(identities):  # type: ignore[no-untyped-def]
        adverts, auths = {}, {}
        for i, ident in identities.items():
            keys = {"share_key": os.urandom(32), "mask_key": os.urandom(32)}
            up = sign_upload(make_upload(spec.task, 0, "advert", ident.device_id, keys), ident)
            adverts[str(i)] = [
                base64.b64encode(keys["share_key"]).decode(),
                base64.b64encode(keys["mask_key"]).decode(),
            ]
            auths[str(i)] = {"client_id": ident.device_id, **(up.auth or {})}
        return {"adverts": adverts, "advert_auth": auths}

    dev._round = {"round": 0, "task_clients": frozenset(spec.clients)}
    minted = view({2: enroll("dev-1"), 3: enroll("dev-2"), 4: enroll("dev-3")})
    assert dev._verified_adverts(minted, 0) == {} and dev.errors["bad_advert"] == 3
    genuine = view({2: independent.enroll("dev-1"), 3: independent.enroll("dev-2"), 4: independent.enroll("dev-3")})
    assert set(dev._verified_adverts(genuine, 0)) == {2, 3, 4}


@pytest.mark.parametrize("c", [0, 1, 2, 3])
def test_the_jobs_graph_and_threshold_defeat_the_stated_colluders_for_every_round_size(c: int) -> None:
    """The job's own choice (``estimator.fl.phases._configure_secagg``) for 3..20 sampled clients, with t free or
    fixed by the task: every client's holder count k satisfies 2t > k + c (no device would refuse, no split
    exists) and t <= k; a task whose sample cannot withstand c is refused when it is read, with the reason."""
    from estimator.fl.checkpoint import JobState
    from estimator.fl.phases import _configure_secagg
    from ldp_core.fl.errors import FLError

    for n in range(3, 21):
        if c >= n - 1:
            with pytest.raises(FLError, match="cannot be withstood"):
                _spec(f"job-{n}-{c}", n, c)
            continue
        for fixed in (None, c + 2):
            kw = {} if fixed is None else {"secagg_threshold": fixed}
            spec = task_spec(
                f"job-{n}-{c}", n, secagg=True, sampling={"kind": "fixed", "count": n}, rounds=1, max_colluders=c, **kw
            )
            st = JobState(selected=list(spec.clients))
            failure = _configure_secagg(st, spec, np.random.default_rng(n), spec.build_model().num_params)
            if failure is not None:  # only a fixed t can leave no degree; the reason says which bound
                assert fixed is not None and "2t > k +" in failure, failure
                continue
            t = st.secagg["threshold"]
            assert fixed is None or t == fixed
            for vs in st.secagg["neighbors"].values():
                assert t <= len(vs) and not split_attack_possible(len(vs), t, c), (n, c, t, len(vs))
