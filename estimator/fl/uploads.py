"""An upload's way into the job's round: parsed, authenticated, checked against the round, folded into the state.

Idempotence: upload ids are content-derived and bind the round. The same id again in the current round
is a **duplicate** (a retry, or a second collector's copy): counted in ``duplicates``, changing nothing.
An id accepted in one of the last :data:`REPLAY_WINDOW` rounds, re-sent later, is refused as
``replayed``; any other upload for another round as ``stale_round`` (:func:`ldp_core.fl.protocol.check_upload_against`).
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable

import numpy as np

from estimator.fl.checkpoint import JobState
from estimator.fl.task import FLTaskSpec
from ldp_core.fl.errors import UpdateRejected
from ldp_core.fl.protocol import RoundState, Upload, check_upload_against, parse_upload, verify_upload_auth

__all__ = ["REPLAY_WINDOW", "take_upload"]

log = logging.getLogger("ldp.fl.job")

#: rounds whose accepted upload ids the job keeps, to count a re-sent old upload as ``replayed``
REPLAY_WINDOW = 16


def take_upload(st: JobState, spec: FLTaskSpec, payload_size: int, clock: Callable[[], float], value: bytes) -> None:
    """Fold the upload record ``value`` into ``st`` if it is a valid upload of the current round; an upload of
    another task is skipped, a duplicate counted in ``st.duplicates``, a refused one in ``st.rejected`` (by
    reason), an accepted one in ``st.accepted`` (by kind). ``clock`` is read for the upload's authentication:
    the updates topic is not trusted either."""
    try:
        u = parse_upload(value, payload_size=payload_size)
        if u.task != spec.task:
            return
        verify_upload_auth(u, spec.authority_key, clock())
        if u.upload_id in st.seen:  # a retry (or a second collector's copy) of an accepted upload: idempotent
            st.duplicates[u.kind] += 1
            log.info("duplicate of upload %s (round %d): already counted", u.upload_id, u.round)
            return
        if u.round < st.round and u.upload_id in st.past_ids.get(u.round, ()):
            raise UpdateRejected(
                "replayed", f"upload {u.upload_id} was accepted in round {u.round}; the current round is {st.round}"
            )
        check_upload_against(u, _round_view(st, spec))
        _fold(st, spec, u)
    except UpdateRejected as exc:
        st.rejected[exc.reason] += 1
        log.info("rejected an upload (%s): %s", exc.reason, exc)
        return
    st.seen.add(u.upload_id)
    st.accepted[u.kind] += 1


def _round_view(st: JobState, spec: FLTaskSpec) -> RoundState:
    """The round as far as an upload's check needs it (not the published round state)."""
    return RoundState(
        task=spec.task,
        seq=st.seq,
        round=st.round,
        phase=st.phase,
        rounds=spec.rounds,
        model=spec.model,
        params=st.params,
        selected=tuple(st.selected),
        secagg=st.secagg,
        indices=st.indices,
        adverts=st.adverts,
        survivors=tuple(st.survivors),
    )


def _fold(st: JobState, spec: FLTaskSpec, u: Upload) -> None:
    """Add a checked upload to the round: a plain update, or the SecAgg message of its kind (one per client)."""
    if u.kind == "update":
        if u.client_id in st.updates:
            raise UpdateRejected("duplicate_client", f"{u.client_id} already uploaded in round {st.round}")
        st.updates[u.client_id] = (
            u.upload_id,
            np.asarray(u.payload["vector"], np.float32),
            int(u.payload["num_examples"]),
        )
        return
    me = st.indices[u.client_id]
    if u.kind == "advert":
        if me in st.adverts:
            raise UpdateRejected("duplicate_client", f"client {me} already advertised keys")
        st.adverts[me] = (u.payload["share_key"], u.payload["mask_key"])
        assert u.auth is not None  # verified in take_upload
        # peers check this signature themselves: the server cannot swap in keys of its own
        st.advert_auth[me] = {"client_id": u.client_id, **u.auth}
    elif u.kind == "shares":
        if me in st.shares:
            raise UpdateRejected("duplicate_client", f"client {me} already shared keys")
        st.shares[me] = dict(u.payload["ciphertexts"])
        if "commitments" in u.payload:
            st.commitments[me] = dict(u.payload["commitments"])
    elif u.kind == "masked":
        if me in st.survivors:
            raise UpdateRejected("duplicate_client", f"client {me} already sent its masked input")
        if me not in set(st.secagg["sharers"]):  # type: ignore[index]
            raise UpdateRejected("bad_secagg", f"client {me} did not share keys: its input could not be unmasked")
        assert st.masked_sum is not None
        st.masked_sum += u.payload["vector"]
        st.survivors.append(me)
    elif u.kind == "consistency":
        _fold_consistency(st, spec, u, me)
    else:
        if me in st.reveals:
            raise UpdateRejected("duplicate_client", f"client {me} already revealed its shares")
        st.reveals[me] = dict(u.payload["shares"])


def _fold_consistency(st: JobState, spec: FLTaskSpec, u: Upload, me: int) -> None:
    """A survivor's signature of the round's survivor set (checked here: peers reveal only on t of them)."""
    from ldp_core.fl.secagg import SURVIVORS_TAG, survivors_message
    from ldp_core.tokens.enrollment import Credential, verify_signature

    if me in st.consistency:
        raise UpdateRejected("duplicate_client", f"client {me} already signed the survivor set")
    assert u.auth is not None  # verified in take_upload
    cred = Credential.from_dict(u.auth["credential"])
    message = survivors_message(spec.task, st.round, st.survivors)
    if not verify_signature(cred.public_key, u.payload["signature"], SURVIVORS_TAG, message):
        raise UpdateRejected("bad_secagg", f"client {me}'s signature is not of this round's survivor set")
    st.consistency[me] = {
        "client_id": u.client_id,
        "credential": u.auth["credential"],
        "signature": base64.b64encode(u.payload["signature"]).decode(),
    }
