"""``ldp privacy pate``: the ε of PATE's aggregators, data-independent and (from a votes file) data-dependent.

The votes file (``--votes FILE``) holds the teachers' vote counts, one row per query and one column per
class (queries × classes, whole numbers >= 0, the same number of teachers on every row):

* ``.npy``: that 2-D array;
* ``.npz``: the array ``votes`` (or the file's only array), and optionally ``answered`` (one 0/1 flag per
  query: which queries Confident-GNMax answered);
* ``.json``: the array as a list of lists, or an object ``{"votes": [[...], ...], "answered": [...]}``.

Without ``answered`` flags every query counts as answered by GNMax; with ``--threshold`` and ``--sigma1``
the threshold check is then run on the votes here (noise from the OS CSPRNG, or ``--seed`` for a study)
to decide which are answered, as the aggregator would.
"""

from __future__ import annotations

import json
import math
import pathlib
import zipfile
from typing import Any

import numpy as np

from estimator.pate.accounting import (
    PROTECTS,
    PateAccountingError,
    data_dependent,
    data_independent,
    release_data_dependent,
)

__all__ = ["load_votes", "pate_privacy", "DATA_DEPENDENT_PROTECTS"]

DATA_DEPENDENT_PROTECTS = (
    "the same records as the data-independent ε, for these votes: it holds for the teachers' actual data "
    "against every neighbour, but the figure itself depends on the votes, so it is for whoever holds the data; "
    "the published figure (epsilon_data_dependent_published) went through the smooth-sensitivity mechanism "
    "and its own RDP cost is included in it"
)


def _from_json(obj: Any) -> tuple[Any, Any]:
    if isinstance(obj, dict):
        if "votes" not in obj:
            raise PateAccountingError("a JSON votes object needs the key 'votes' (queries × classes)")
        return obj["votes"], obj.get("answered")
    return obj, None


def load_votes(path: str) -> tuple[np.ndarray, np.ndarray | None]:
    """(votes, answered flags or None) from a .npy, .npz or .json file (module docstring)."""
    p = pathlib.Path(path)
    if not p.is_file():
        raise PateAccountingError(f"votes file not found: {path}")
    suffix = p.suffix.lower()
    answered: Any = None
    try:
        if suffix == ".npy":
            votes: Any = np.load(p, allow_pickle=False)
        elif suffix == ".npz":
            with np.load(p, allow_pickle=False) as z:
                names = list(z.files)
                if "votes" in names:
                    votes = z["votes"]
                elif len([n for n in names if n != "answered"]) == 1:
                    votes = z[next(n for n in names if n != "answered")]
                else:
                    raise PateAccountingError(f"{path}: no array 'votes' among {names}")
                answered = z["answered"] if "answered" in names else None
        elif suffix == ".json":
            votes, answered = _from_json(json.loads(p.read_text()))
        else:
            raise PateAccountingError(f"{path}: the votes file must be .npy, .npz or .json")
    except (ValueError, OSError, zipfile.BadZipFile) as exc:
        if isinstance(exc, PateAccountingError):
            raise
        raise PateAccountingError(f"{path}: not a readable votes file ({exc})") from None
    try:
        v = np.asarray(votes, dtype=float)
    except (TypeError, ValueError):
        raise PateAccountingError(f"{path}: the votes must be a queries × classes array of counts") from None
    if v.ndim != 2 or v.shape[0] < 1 or v.shape[1] < 2:
        raise PateAccountingError(f"{path}: the votes must be queries × classes (>= 2 classes), got shape {v.shape}")
    if not np.all(np.isfinite(v)) or np.any(v < 0) or np.any(v != np.round(v)):
        raise PateAccountingError(f"{path}: the votes must be whole numbers >= 0")
    totals = v.sum(axis=1)
    if np.any(totals != totals[0]):
        raise PateAccountingError(f"{path}: every query must have the same number of votes (teachers)")
    a = None if answered is None else np.asarray(answered)
    if a is not None and (a.shape != (len(v),) or not np.all((a == 0) | (a == 1))):
        raise PateAccountingError(f"{path}: 'answered' must be one 0/1 flag per query ({len(v)})")
    return v, None if a is None else a.astype(bool)


def pate_privacy(
    sigma: float,
    queries: int,
    delta: float,
    threshold: float | None = None,
    sigma1: float | None = None,
    votes_path: str | None = None,
    rng: np.random.Generator | None = None,
    order: float | None = None,
) -> dict[str, Any]:
    """The result object of ``ldp privacy pate --json``: ``epsilon`` (data-independent, ``queries`` answered
    GNMax queries at σ), with ``--threshold``/``--sigma1`` ``epsilon_confident`` (every query checked and
    answered: the most it can cost), and with a votes file ``answered``, ``epsilon_data_independent`` (the
    checks plus the answered queries), ``epsilon_data_dependent`` and ``epsilon_data_dependent_published``.
    ``rng`` draws the threshold checks (without answered flags) and the smooth-sensitivity noise."""
    if (threshold is None) != (sigma1 is None):
        raise PateAccountingError("--threshold and --sigma1 go together (Confident-GNMax)")
    di = data_independent(sigma, queries, delta)
    out: dict[str, Any] = {"epsilon": di["epsilon"], "order": di["order"], "delta": delta, "sigma": sigma}
    out |= {"queries": queries, "threshold": threshold, "sigma1": sigma1}
    out["rdp_per_answer"] = "λ/σ² (GNMax: the histogram moves by 1 in two coordinates, L2 sensitivity √2)"
    if threshold is not None and sigma1 is not None:
        conf = data_independent(sigma, queries, delta, queries, sigma1)
        out["epsilon_confident"] = conf["epsilon"]
        out["rdp_per_check"] = "λ/(2σ₁²) (the top count moves by at most 1), paid on every query"
    out |= {"neighbors": "add_remove_or_replace_one_record", "protects": PROTECTS}
    if votes_path is None:
        return out
    votes, answered = load_votes(votes_path)
    if len(votes) != queries:
        raise PateAccountingError(f"the votes file has {len(votes)} queries, --queries says {queries}")
    gen = np.random.default_rng() if rng is None else rng
    if answered is None and threshold is not None and sigma1 is not None:
        answered = votes.max(axis=1) + gen.normal(0.0, sigma1, size=len(votes)) >= threshold
        out["answered_from"] = "threshold_check_run_here"
    else:
        out["answered_from"] = "file" if answered is not None else "all_queries"
    mask = np.ones(len(votes), dtype=bool) if answered is None else answered
    count = int(mask.sum())
    conf_queries = queries if threshold is not None else None
    out["answered"] = count
    out["teachers"] = int(votes[0].sum())
    out["epsilon_data_independent"] = data_independent(sigma, count, delta, conf_queries, sigma1)["epsilon"]
    dd = data_dependent(votes, sigma, delta, mask, threshold, sigma1)
    out["epsilon_data_dependent"] = dd["epsilon"]
    out["order_data_dependent"] = dd["order"]
    pub = release_data_dependent(votes, sigma, delta, gen, mask, threshold, sigma1, order=order)
    out["epsilon_data_dependent_published"] = pub.epsilon
    out["smooth_sensitivity"] = pub.to_dict()
    out["protects_data_dependent"] = DATA_DEPENDENT_PROTECTS
    if not math.isfinite(out["epsilon_data_dependent"]):  # pragma: no cover - the bounds are finite
        raise PateAccountingError("the data-dependent ε is not finite")
    return out
