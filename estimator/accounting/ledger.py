"""A privacy budget shared among partners: a durable ledger over one data set or FL task.

A *session* is one SQLite file. Its owner fixes a total (ε, δ) over a data set or an FL task, allocates
*shares* of it to partners (analysts, organisations, jobs), and approves the *kinds* of query each may run
(``central``, ``dpsgd``, ``pate``, ``synth``, ``selection``, ...). Every query or training run is debited
*before it runs* (:meth:`BudgetLedger.debit`, or :func:`debit_before_run` from a job): the debit is refused,
and recorded as refused, when

* the partner has no share (``unknown_partner``),
* the kind was never approved for that partner or for everyone (``unapproved``): a new kind of query needs
  an approval, recorded in the ledger with who gave it,
* the partner's share, or the session's total, would be crossed (``exhausted``).

A refused debit spends nothing. :meth:`BudgetLedger.report` says who spent what, by partner and by kind.

Accounting. The session is one privacy filter of :mod:`estimator.accounting.odometer` (``zcdp`` by default:
Σρ within the largest zCDP budget that converts to (ε, δ); or ``basic``: Σε, Σδ) over *all* debits in the
order they were admitted, whichever partner made them. So the whole interaction, however adaptively each
partner chose its next query after seeing everyone's earlier results, is (ε, δ)-DP (Rogers et al. 2016;
Whitehouse et al. 2023 for the zCDP filter). A share is a fraction of the filter's budget in its own
currency (ρ, or ε and δ); the shares add up to at most 1, and each partner's debits must fit its share. The
per-partner limits only restrict what the session filter admits, so they cannot weaken it.

Durability and concurrency. Every change is one ``BEGIN IMMEDIATE`` transaction
(:func:`ldp_core.sqlite.immediate_transaction`) in which the admitted debits are read back, replayed into a
fresh filter, the new debit checked and the row written: two processes debiting the same session at once run
one after the other and can never overspend (tests/budget runs real processes against one file). The
database is in WAL mode. Debits are never refunded (a run that fails after its debit may already have
released something).

Neighbouring relation: the session's (``add_or_remove`` by default, or ``replace``), applied to every event
as the filter does. Every debit records the relation its event is *stated* under (``neighbors``; default the
session's), and a session never mixes relations unsoundly: an add/remove event in a replace session is priced
under replace, which is group privacy over the two steps of a replacement (every sensitivity doubled: ρ x4,
a pure ε x2); a replace-one event in an add/remove session is refused (reason ``relation``), since no
conversion exists in that direction (replace-one DP between data sets of one size says nothing about a
person's presence: releasing the size is replace-one 0-DP). A caller whose analysis is replace-one but who can
state a sound add/remove event (a fixed-count FL task: :mod:`estimator.fl.budget`) debits that one instead.

Charged once: a debit with a ``ref`` (an FL task's id) is made at most once: repeating it with the same
partner, kind, relation and event charges nothing (a resumed job; logged as ``repeat``), and repeating the
``ref`` with anything else is refused (``changed_plan``). What the guarantee protects: one person's presence in the session's data set (one
example, or one client for an FL task whose events are client-level), against everyone who sees every result
of every partner's debited queries; not results of queries that bypass the ledger.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import time
from fractions import Fraction
from typing import Any, Literal

import numpy as np

from estimator.accounting.accountant import AccountingError, Neighbors
from estimator.accounting.odometer import BasicFilter, PrivacyFilter, ZCDPFilter
from ldp_core.errors import BudgetError
from ldp_core.privacy_events import PrivacyEvent, event_from_dict
from ldp_core.sqlite import immediate_transaction, use_wal

__all__ = [
    "BudgetLedger",
    "LedgerRefusal",
    "LedgerError",
    "debit_before_run",
    "plot_report",
    "REFUSED_EXIT_CODE",
    "PROTECTS",
]

#: the exit code of a command whose run the ledger refused (2 is bad input)
REFUSED_EXIT_CODE = 3

PROTECTS = (
    "one person's presence in the session's data (add/remove unless the session says replace), against everyone "
    "who sees the results of every debited query of every partner, however adaptively chosen; not queries that "
    "bypass the ledger"
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS session (
  id INTEGER PRIMARY KEY CHECK (id = 1), subject TEXT NOT NULL, epsilon REAL NOT NULL, delta REAL NOT NULL,
  filter TEXT NOT NULL, neighbors TEXT NOT NULL, per_release_delta REAL, created REAL NOT NULL, owner TEXT);
CREATE TABLE IF NOT EXISTS partner (name TEXT PRIMARY KEY, share REAL NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS approval (
  kind TEXT NOT NULL, partner TEXT NOT NULL, approved_by TEXT NOT NULL, note TEXT, at REAL NOT NULL,
  PRIMARY KEY (kind, partner));
CREATE TABLE IF NOT EXISTS ledger (
  seq INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, action TEXT NOT NULL, partner TEXT, kind TEXT,
  label TEXT, event TEXT, cost TEXT, detail TEXT, neighbors TEXT, ref TEXT);
"""

#: columns added after the first sessions were written (added on open to an older file)
_ADDED_COLUMNS = (("neighbors", "TEXT"), ("ref", "TEXT"))

Reason = Literal["unknown_partner", "unapproved", "exhausted", "relation", "changed_plan"]


class LedgerError(AccountingError):
    """Bad use of a session (no such file, a share that does not fit, a bad name): a ValueError."""


class LedgerRefusal(BudgetError):
    """A debit the ledger refused (and recorded as refused); ``reason`` says why."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _name(what: str, v: str) -> str:
    if not isinstance(v, str) or not v.strip() or len(v) > 200:
        raise LedgerError(f"{what} must be a non-empty name of at most 200 characters, got {v!r}")
    return v.strip()


class BudgetLedger:
    """One session file (module docstring). Open an existing one with ``BudgetLedger(path)``; make one with
    :meth:`create`."""

    def __init__(self, path: str | os.PathLike[str], timeout: float = 30.0) -> None:
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise LedgerError(f"no budget session at {self.path!r} (create one with `ldp budget create`)")
        self._conn = self._connect(self.path, timeout)
        if self._conn.execute("SELECT name FROM sqlite_master WHERE name = 'session'").fetchone() is None:
            raise LedgerError(f"{self.path!r} is not a budget session")
        self._session = self._read_session()
        self._add_columns()

    def _add_columns(self) -> None:
        """Bring a session written before debits carried their relation and reference up to date."""
        have = {row[1] for row in self._conn.execute("PRAGMA table_info(ledger)")}
        missing = [(c, t) for c, t in _ADDED_COLUMNS if c not in have]
        if missing:
            with immediate_transaction(self._conn):
                have = {row[1] for row in self._conn.execute("PRAGMA table_info(ledger)")}
                for c, t in missing:
                    if c not in have:
                        self._conn.execute(f"ALTER TABLE ledger ADD COLUMN {c} {t}")

    @staticmethod
    def _connect(path: str, timeout: float) -> sqlite3.Connection:
        conn = sqlite3.connect(path, isolation_level=None, timeout=timeout)
        use_wal(conn, timeout)
        return conn

    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str],
        subject: str,
        epsilon: float,
        delta: float,
        filter: Literal["zcdp", "basic"] = "zcdp",
        neighbors: Neighbors = "add_or_remove",
        per_release_delta: float | None = None,
        owner: str = "",
    ) -> BudgetLedger:
        """A new session over ``subject`` (a data set or FL task) with total (``epsilon``, ``delta``)."""
        p = os.fspath(path)
        if os.path.exists(p):
            raise LedgerError(f"{p!r} already exists: a session is never overwritten")
        if filter not in ("zcdp", "basic") or neighbors not in ("add_or_remove", "replace"):
            raise LedgerError(
                f"filter must be zcdp or basic and neighbors add_or_remove or replace, got {filter}, {neighbors}"
            )
        _make_filter(filter, epsilon, delta, neighbors, per_release_delta)  # validates the budget
        folder = os.path.dirname(os.path.abspath(p))
        try:
            os.makedirs(folder, exist_ok=True)  # `ldp budget create out/session.db` on a fresh checkout
        except OSError as exc:
            raise LedgerError(f"cannot create the folder of {p!r}: {exc}") from exc
        conn = cls._connect(p, 30.0)
        try:
            with immediate_transaction(conn):
                for statement in _SCHEMA.split(";"):  # not executescript: it would commit the transaction
                    if statement.strip():
                        conn.execute(statement)
                if conn.execute("SELECT 1 FROM session").fetchone() is not None:
                    raise LedgerError(f"{p!r} already holds a session")
                now = time.time()
                conn.execute(
                    "INSERT INTO session VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        _name("subject", subject),
                        float(epsilon),
                        float(delta),
                        filter,
                        neighbors,
                        per_release_delta,
                        now,
                        owner,
                    ),
                )
                _log(
                    conn,
                    "create",
                    detail={"subject": subject, "epsilon": epsilon, "delta": delta, "filter": filter, "by": owner},
                )
        finally:
            conn.close()
        return cls(p)

    def close(self) -> None:
        self._conn.close()

    @property
    def settings(self) -> dict[str, Any]:
        """The session's fixed settings: subject, epsilon, delta, filter, neighbors, per_release_delta, ..."""
        return dict(self._session)

    def __enter__(self) -> BudgetLedger:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- reading ---------------------------------------------------------------
    def _read_session(self) -> dict[str, Any]:
        row = self._conn.execute(
            "SELECT subject, epsilon, delta, filter, neighbors, per_release_delta, created, owner FROM session"
        ).fetchone()
        if row is None:
            raise LedgerError(f"{self.path!r} holds no session")
        keys = ("subject", "epsilon", "delta", "filter", "neighbors", "per_release_delta", "created", "owner")
        return dict(zip(keys, row))

    def _replayed(self) -> tuple[PrivacyFilter, dict[str, list[Fraction]]]:
        """The session filter with every admitted debit replayed in order, and each partner's exact spend."""
        s = self._session
        flt = _make_filter(s["filter"], s["epsilon"], s["delta"], s["neighbors"], s["per_release_delta"])
        spent: dict[str, list[Fraction]] = {}
        for partner, label, event in self._conn.execute(
            "SELECT partner, label, event FROM ledger WHERE action = 'debit' ORDER BY seq"
        ):
            release = flt.spend(event_from_dict(json.loads(event)), label or "")
            acc = spent.setdefault(partner, [Fraction(0)] * len(flt.units))
            spent[partner] = [a + Fraction(c) for a, c in zip(acc, release.cost)]
        return flt, spent

    def _shares(self) -> dict[str, float]:
        return dict(self._conn.execute("SELECT name, share FROM partner").fetchall())

    def _approved(self, kind: str, partner: str) -> bool:
        row = self._conn.execute(
            "SELECT 1 FROM approval WHERE kind = ? AND partner IN (?, '*')", (kind, partner)
        ).fetchone()
        return row is not None

    # -- changing --------------------------------------------------------------
    def allocate(self, partner: str, share: float, by: str = "") -> dict[str, Any]:
        """Give ``partner`` a ``share`` (a fraction in (0, 1]) of the budget; the shares must add up to at most
        1. A partner's share may be raised, or lowered down to what it has spent."""
        p = _name("partner", partner)
        if not (isinstance(share, (int, float)) and math.isfinite(share) and 0.0 < share <= 1.0):
            raise LedgerError(f"a share is a fraction in (0, 1], got {share!r}")
        with immediate_transaction(self._conn):
            shares = self._shares()
            others = math.fsum(v for k, v in shares.items() if k != p)
            if others + share > 1.0 + 1e-12:
                raise LedgerError(
                    f"share {share:g} for {p!r} does not fit: the other partners hold {others:g} of the budget"
                )
            flt, spent = self._replayed()
            mine = spent.get(p)
            if mine is not None and any(float(s) > share * b for s, b in zip(mine, flt.budget)):
                raise LedgerError(f"{p!r} has already spent more than a share of {share:g}")
            self._conn.execute(
                "INSERT INTO partner VALUES (?, ?, ?) ON CONFLICT(name) DO UPDATE SET share = excluded.share",
                (p, float(share), time.time()),
            )
            _log(self._conn, "allocate", partner=p, detail={"share": share, "by": by})
        return {"partner": p, "share": share}

    def approve(self, kind: str, by: str, partner: str = "*", note: str = "") -> dict[str, Any]:
        """Approve queries of ``kind`` for ``partner`` (``*``: everyone); recorded with who approved."""
        k, who, p = _name("kind", kind), _name("approver", by), _name("partner", partner)
        with immediate_transaction(self._conn):
            self._conn.execute("INSERT OR REPLACE INTO approval VALUES (?, ?, ?, ?, ?)", (k, p, who, note, time.time()))
            _log(self._conn, "approve", partner=p, kind=k, detail={"by": who, "note": note})
        return {"kind": k, "partner": p, "approved_by": who, "note": note}

    def debit(
        self,
        partner: str,
        kind: str,
        event: PrivacyEvent,
        label: str = "",
        *,
        neighbors: Neighbors | None = None,
        ref: str | None = None,
    ) -> dict[str, Any]:
        """Charge ``event`` to ``partner``'s share before the query runs; raise :class:`LedgerRefusal` (after
        recording the refusal) if the partner, the kind, the relation or the budget does not allow it.

        ``neighbors``: the relation ``event`` is stated under (default: the session's), recorded with the debit.
        An add/remove event in a replace session is priced under replace (group privacy: a replacement is one
        removal and one addition, so every sensitivity doubles); a replace event in an add/remove session is
        refused (``relation``): a guarantee between data sets of one size says nothing about adding a person.

        ``ref``: a key that makes the debit happen once (an FL task's id): a later debit with the same ``ref``,
        partner, kind, relation and event is not charged again (it returns the first debit with ``repeat``
        True and logs a ``repeat`` entry); one with the same ``ref`` and anything else is refused
        (``changed_plan``)."""
        p, k = _name("partner", partner), _name("kind", kind)
        rel = self._session["neighbors"] if neighbors is None else neighbors
        if rel not in ("add_or_remove", "replace"):
            raise LedgerError(f"neighbors must be add_or_remove or replace, got {neighbors!r}")
        key = None if ref is None else _name("ref", ref)
        ev = json.dumps(event.to_dict(), sort_keys=True)
        priced = self._session["neighbors"]
        detail: dict[str, Any] = {"priced_under": priced}
        if rel != priced:
            detail["conversion"] = "group privacy: a replacement is a removal and an addition (sensitivity x2)"
        with immediate_transaction(self._conn):
            first = None if key is None else self._first_with_ref(key)
            refusal: tuple[Reason, str] | None
            if first is not None and key is not None:
                refusal = self._same_plan(first, p, k, rel, ev, key)
                if refusal is None:
                    _log(self._conn, "repeat", partner=p, kind=k, label=label, event=ev, neighbors=rel, ref=key,
                         detail={"first": first["seq"], "why": "already debited under this reference"})  # fmt: skip
                    return {"partner": p, "kind": k, "label": first["label"], "cost": first["cost"],
                            "session": self.path, "neighbors": rel, "ref": key, "repeat": True, "seq": first["seq"]}  # fmt: skip
                cost: dict[str, float] = {}
            elif rel == "replace" and priced == "add_or_remove":
                refusal = (
                    "relation",
                    "the event is stated under replace-one neighbours, but the session "
                    f"{self.path!r} protects add/remove: no sound conversion exists (a guarantee between data sets of "
                    "one size says nothing about adding or removing a person); state the event under add/remove, "
                    "or use a session created with --neighbors replace; nothing was spent",
                )
                cost = {}
            else:
                refusal, cost = self._check(p, k, event)
            if refusal is None:
                _log(self._conn, "debit", partner=p, kind=k, label=label, event=ev, cost=cost, detail=detail,
                     neighbors=rel, ref=key)  # fmt: skip
            else:
                why = {"reason": refusal[0], "why": refusal[1], **detail}
                _log(
                    self._conn, "refused", partner=p, kind=k, label=label, event=ev, detail=why, neighbors=rel, ref=key
                )
        if refusal is not None:
            raise LedgerRefusal(refusal[0], refusal[1])
        return {"partner": p, "kind": k, "label": label, "cost": cost, "session": self.path, "neighbors": rel,
                "ref": key, "repeat": False}  # fmt: skip

    def _first_with_ref(self, ref: str) -> dict[str, Any] | None:
        row = self._conn.execute(
            "SELECT seq, partner, kind, label, event, cost, neighbors FROM ledger WHERE action = 'debit' AND ref = ? "
            "ORDER BY seq LIMIT 1",
            (ref,),
        ).fetchone()
        if row is None:
            return None
        seq, partner, kind, label, event, cost, rel = row
        return {"seq": seq, "partner": partner, "kind": kind, "label": label, "event": event,
                "cost": json.loads(cost), "neighbors": rel}  # fmt: skip

    @staticmethod
    def _same_plan(first: dict[str, Any], p: str, k: str, rel: str, ev: str, ref: str) -> tuple[Reason, str] | None:
        """None when a debit under ``ref`` repeats ``first`` exactly; else why it is refused."""
        same_event = json.loads(first["event"]) == json.loads(ev)
        if (first["partner"], first["kind"], first["neighbors"]) == (p, k, rel) and same_event:
            return None
        return (
            "changed_plan",
            f"{ref!r} was debited before (entry {first['seq']}: partner {first['partner']!r}, kind {first['kind']!r}, "
            f"{first['neighbors']}) for another plan; a resumed run must keep the plan it was debited for (a new plan "
            "is a new task id); nothing was spent",
        )

    def _check(self, p: str, k: str, event: PrivacyEvent) -> tuple[tuple[Reason, str] | None, dict[str, float]]:
        """(why the debit is refused, or None; its cost), inside the caller's transaction."""
        flt, spent = self._replayed()
        cost = flt.cost(event)
        priced = dict(zip(flt.units, cost))
        shares = self._shares()
        if p not in shares:
            return (
                "unknown_partner",
                f"{p!r} has no share of the budget session {self.path!r} (`ldp budget allocate`)",
            ), priced
        if not self._approved(k, p):
            return (
                "unapproved",
                (
                    f"queries of kind {k!r} are not approved for {p!r} in {self.path!r}: a new kind of query needs an "
                    f"approval recorded in the ledger (`ldp budget approve {self.path} --kind {k} --by NAME`)"
                ),
            ), priced
        mine = spent.get(p, [Fraction(0)] * len(cost))
        limit = [shares[p] * b for b in flt.budget]
        after = [float(m + Fraction(c)) for m, c in zip(mine, cost)]
        if any(a > lim for a, lim in zip(after, limit)):
            left = ", ".join(f"{u} {max(lim - float(m), 0.0):.6g}" for u, lim, m in zip(flt.units, limit, mine))
            need = ", ".join(f"{u} {c:.6g}" for u, c in zip(flt.units, cost))
            return (
                "exhausted",
                f"what is left of the share of {p!r} cannot pay for this query: it costs {need}, only {left} is left; nothing was spent",
            ), priced
        if not flt.can_spend(event):
            return ("exhausted", "the session's total budget is exhausted; nothing was spent"), priced
        return None, priced

    # -- the report ------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        """Who spent what: the session, each partner's share, spend and what is left, the spend by kind,
        the approvals and every ledger entry (debits and refusals)."""
        with immediate_transaction(self._conn):  # one consistent snapshot
            flt, spent = self._replayed()
            shares = self._shares()
            approvals = [
                {"kind": k, "partner": p, "approved_by": b, "note": n, "at": t}
                for k, p, b, n, t in self._conn.execute("SELECT kind, partner, approved_by, note, at FROM approval")
            ]
            rows = self._conn.execute(
                "SELECT seq, at, action, partner, kind, label, cost, detail, neighbors, ref FROM ledger ORDER BY seq"
            ).fetchall()
        entries = [
            {"seq": s, "at": a, "action": act, "partner": p, "kind": k, "label": lab,
             "cost": json.loads(c) if c else None, "detail": json.loads(d) if d else None,
             "neighbors": rel if rel is not None or act not in ("debit", "refused") else self._session["neighbors"],
             "ref": ref}
            for s, a, act, p, k, lab, c, d, rel, ref in rows
        ]  # fmt: skip
        partners = {}
        for name, share in sorted(shares.items()):
            mine = [float(v) for v in spent.get(name, [Fraction(0)] * len(flt.units))]
            limit = [share * b for b in flt.budget]
            partners[name] = {
                "share": share,
                "budget": dict(zip(flt.units, limit)),
                "spent": dict(zip(flt.units, mine)),
                "remaining": {u: max(lim - m, 0.0) for u, lim, m in zip(flt.units, limit, mine)},
                "debits": sum(1 for e in entries if e["action"] == "debit" and e["partner"] == name),
                "refused": sum(1 for e in entries if e["action"] == "refused" and e["partner"] == name),
            }
        by_kind: dict[str, dict[str, float]] = {}
        for e in entries:
            if e["action"] == "debit":
                acc = by_kind.setdefault(e["kind"], dict.fromkeys(flt.units, 0.0))
                for u in flt.units:
                    acc[u] = acc[u] + e["cost"][u]
        return {
            "session": self.path,
            **{k: self._session[k] for k in ("subject", "epsilon", "delta", "filter", "neighbors", "owner")},
            "status": flt.status(),
            "partners": partners,
            "by_kind": by_kind,
            "approvals": approvals,
            "entries": entries,
            "protects": PROTECTS,
        }


def _make_filter(
    kind: str, epsilon: float, delta: float, neighbors: Neighbors, per_release_delta: float | None
) -> PrivacyFilter:
    if kind == "zcdp":
        return ZCDPFilter(epsilon, delta, neighbors)
    return BasicFilter(epsilon, delta, neighbors, per_release_delta=per_release_delta)


def _log(
    conn: sqlite3.Connection,
    action: str,
    partner: str | None = None,
    kind: str | None = None,
    label: str | None = None,
    event: str | None = None,
    cost: dict[str, float] | None = None,
    detail: dict[str, Any] | None = None,
    neighbors: str | None = None,
    ref: str | None = None,
) -> None:
    conn.execute(
        "INSERT INTO ledger (at, action, partner, kind, label, event, cost, detail, neighbors, ref) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            time.time(),
            action,
            partner,
            kind,
            label,
            event,
            None if cost is None else json.dumps(cost),
            None if detail is None else json.dumps(detail),
            neighbors,
            ref,
        ),
    )


def debit_before_run(
    session: str | os.PathLike[str] | None,
    partner: str | None,
    kind: str,
    event: PrivacyEvent,
    label: str = "",
    *,
    neighbors: Neighbors | None = None,
    ref: str | None = None,
) -> dict[str, Any] | None:
    """What a job calls before it runs: nothing (None) without a ``session``; else debit ``event`` to
    ``partner`` for a query of ``kind`` and return the debit, or raise :class:`LedgerRefusal` (the job must
    then not run; its command exits :data:`REFUSED_EXIT_CODE`). ``neighbors`` and ``ref``: :meth:`BudgetLedger.debit`. PATE (one GNMax query or a whole labelling
    run, as its event), synthetic data and model selection call it the same way."""
    if session is None:
        return None
    if partner is None:
        raise LedgerError("a budget session needs the partner the query is debited to")
    with BudgetLedger(session) as ledger:
        return ledger.debit(partner, kind, event, label, neighbors=neighbors, ref=ref)


def plot_report(report: dict[str, Any], path: str) -> None:
    """Each partner's share of the budget and what it spent, per unit of the session's filter (matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    units = list(report["status"]["budget"])
    names = list(report["partners"])
    fig, axes = plt.subplots(1, len(units), figsize=(6.5 * len(units), 4.2), squeeze=False)
    for ax, u in zip(axes[0], units):
        pos = np.arange(len(names))
        ax.bar(pos, [report["partners"][n]["budget"][u] for n in names], color="#dddddd", label="share")
        ax.bar(pos, [report["partners"][n]["spent"][u] for n in names], width=0.5, label="spent")
        ax.set_xticks(pos, names)
        ax.set_ylabel(u)
        ax.set_title(f"{report['subject']}: {u} by partner ({report['filter']} filter)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
