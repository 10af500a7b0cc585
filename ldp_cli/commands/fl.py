"""``ldp fl``: federated learning in production, and the older spelling of ``ldp study``'s scenarios.

* ``job``: the aggregation job of one task over the pipeline (:mod:`estimator.fl.job`);
  prints ``ldp fl job: running`` once it serves a round and its JSON status when it stops.
* ``enroll``: the enrollment authority's key, and device credentials minted with it.
* ``sign-task``: the authority's key and signature put into a task file.
* ``device``: N devices of a task from one data file against the collector (:mod:`ldp_cli.commands.fl_device`).
* ``clinics``, ``drift``, ``compress``, ``personalize``, ``attack``, ``local-dpsgd``: the research
  scenarios of :mod:`ldp_cli.commands.study` (``ldp study <scenario>``), registered here too with the
  same options, output and ``--json`` keys.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ldp_cli.commands.argtypes import positive_int as _positive_int
from ldp_cli.commands.fl_device import register_device
from ldp_cli.commands.fl_job_plan import add_plan_flags
from ldp_cli.commands.study import add_scenarios
from ldp_cli.options import add_group, add_member, add_session_timeout, add_transport, stop_event
from ldp_cli.progress import add_progress_flags, lines

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fl",
        help="federated-learning scenarios with client-level DP",
        description="Federated-learning scenarios that reproduce published set-ups on seeded synthetic data.",
    )
    fsub = p.add_subparsers(dest="scenario", required=True)
    add_scenarios(fsub, ["clinics"])  # first, where `ldp fl --help` always listed it
    j = fsub.add_parser(
        "job",
        help="run a federated task's aggregation job over the pipeline",
        description="The aggregation job (estimator/fl/job.py): publishes rounds to the rounds topic, "
        "consumes device uploads from the updates topic (through `ldp collector --fl`), aggregates "
        "with client-level DP, robust aggregators or optional secure aggregation, "
        "and resumes exactly where it stopped after a crash.",
    )
    j.add_argument("--task", required=True, help="the task file (JSON of estimator.fl.task.FLTaskSpec)")
    add_transport(j)
    add_group(j, None, shown="ldp-fl-<task>")
    add_member(j, "fl-job-0", "member name; keep it across restarts")
    j.add_argument("--rounds-topic", default=None)
    j.add_argument("--updates-topic", default=None)
    j.add_argument("--state-topic", default=None)
    j.add_argument("--status-file", default=None, help="write the JSON status here (atomically, as it changes)")
    j.add_argument(
        "--checkpoint-interval",
        type=float,
        default=1.0,
        help="seconds between mid-phase checkpoints while uploads arrive (default 1)",
    )
    add_session_timeout(j, help=None)
    j.add_argument(
        "--max-record-bytes",
        type=_positive_int,
        default=900_000,
        help="largest record the job writes; checkpoints and round states are split into chunks "
        "of at most this size (default 900000, under Kafka's common 1 MB message.max.bytes)",
    )
    j.add_argument("--keep-running", action="store_true", help="do not exit after the last round")
    add_plan_flags(j)
    add_progress_flags(j)
    j.set_defaults(func=run_job_cmd)
    e = fsub.add_parser(
        "enroll",
        help="create the enrollment authority key, or mint device credentials with it",
        description="Device enrollment (ldp_core/tokens/enrollment.py): --init-authority writes a new Ed25519 "
        "authority key file (mode 0600); with --device-id, mints a signing key and an authority-signed "
        "credential per device into --out (one bundle per device, mode 0600). For tests, the demo and "
        "operators without an attestation service; in production the device makes its own key and only "
        "its public key is certified (EnrollmentAuthority.certify).",
    )
    e.add_argument("--authority", required=True, help="the authority key file")
    e.add_argument("--init-authority", action="store_true", help="create the authority key file (refuses to overwrite)")
    e.add_argument("--device-id", action="append", default=[], help="a device id to enroll (repeatable)")
    e.add_argument(
        "--out", default=None, metavar="DIR", help="folder (not a file) for the device bundles (<device-id>.json)"
    )
    e.add_argument("--lifetime-days", type=_positive_int, default=365, help="credential lifetime (default 365)")
    e.set_defaults(func=run_enroll_cmd)
    g = fsub.add_parser(
        "sign-task",
        help="put the authority's key and signature into a task file",
        description="Sets enrollment_key and task_signature (the authority's signature of the task's "
        "security configuration: name, secagg, secagg_threshold, enrollment key, and with secagg "
        "max_colluders and the client list) in the task file; "
        "devices refuse SecAgg rounds whose configuration is not signed.",
    )
    g.add_argument("--authority", required=True, help="the authority key file")
    g.add_argument("--task", required=True, help="the task file (rewritten in place unless --out)")
    g.add_argument(
        "--out", default=None, metavar="FILE", help="write the signed task to this file (default: rewrite --task)"
    )
    g.set_defaults(func=run_sign_task_cmd)
    register_device(fsub)
    add_scenarios(fsub, ["drift", "compress", "personalize", "attack", "local-dpsgd"])


def run_job_cmd(args: argparse.Namespace) -> int:
    from estimator.fl.job import AggregationJob, JobSettings
    from estimator.fl.status import round_line
    from estimator.fl.task import EXAMPLE_ENROLLMENT_KEY, FLTaskSpec
    from ldp_core.fl.errors import FLError
    from pipeline.topics import FL_ROUNDS_TOPIC, FL_STATE_TOPIC, FL_UPDATES_TOPIC
    from pipeline.transport import open_transport

    try:
        spec = FLTaskSpec.from_file(args.task)  # a relative root_data is relative to the task file
    except FLError as exc:
        raise SystemExit(f"ldp fl job: {exc}") from None
    if spec.enrollment_key == EXAMPLE_ENROLLMENT_KEY:
        print(
            "ldp fl job: warning: the task trusts the example authority (examples/fl/example-authority.json), whose "
            "private key is public: anyone can enroll as its devices. Make your own: docs/fl/RUNNING.md",
            file=sys.stderr,
        )
    from ldp_cli.commands.fl_job_plan import make_plan, run_selection

    plan = make_plan(args, spec)  # debits the whole plan first (refused: exit 3, nothing runs)
    if isinstance(plan, int):
        return plan

    def settings(task: FLTaskSpec) -> JobSettings:
        suffix = task.task[len(spec.task) :]  # a candidate's ".c<i>"
        return JobSettings(
            group=(args.group + suffix) if args.group else f"ldp-fl-{task.task}",
            member=args.member,
            rounds_topic=args.rounds_topic or FL_ROUNDS_TOPIC,
            updates_topic=args.updates_topic or FL_UPDATES_TOPIC,
            state_topic=args.state_topic or FL_STATE_TOPIC,
            session_timeout=args.session_timeout,
            checkpoint_interval=args.checkpoint_interval,
            status_path=args.status_file,
            max_record_bytes=args.max_record_bytes,
        )

    stop = stop_event()
    show = lines(args, "ldp fl job")  # per-round lines on stderr (a terminal, or --progress)
    with open_transport(args.transport) as transport:

        def run_one(task: FLTaskSpec) -> dict[str, Any] | None:
            job = AggregationJob(transport, task, settings(task), vote_release=_vote_release(task))
            if args.status_file:  # the job writes it as it runs; on each change of state too (waiting for the broker)
                job.state_listeners.append(lambda _job, _state: job._write_status(force=True))
            job.round_listeners.append(lambda record: show(round_line(record, task.rounds)))
            try:
                if not job.connect(stop):
                    return None
                print(
                    f"ldp fl job: running task {task.task} (round {job.status()['round']}, restores {job.restores})",
                    flush=True,
                )
                keep = args.keep_running and plan.candidates is None
                status = job.supervise(lambda: job.run(stop, exit_when_done=not keep), stop)
                return status if status is not None else job.status()  # None: stopped while reconnecting
            finally:
                job.close()

        if plan.candidates is None:
            status = run_one(spec)
        else:
            status = run_selection(args, plan, run_one, show)
    if status is None:
        return 0
    status.pop("params", None)
    if plan.debit is not None:
        status["budget"] = plan.debit
    print(json.dumps(status), flush=True)
    return 0


def run_enroll_cmd(args: argparse.Namespace) -> int:
    import base64
    import os

    from ldp_core.tokens.enrollment import EnrollmentAuthority, EnrollmentError

    try:
        if args.init_authority:
            if os.path.exists(args.authority):
                raise SystemExit(f"ldp fl enroll: {args.authority} exists; refusing to overwrite an authority key")
            auth = EnrollmentAuthority.generate()
            auth.save(args.authority)
        else:
            auth = EnrollmentAuthority.load(args.authority)
        devices = []
        if args.device_id:
            if not args.out:
                raise SystemExit("ldp fl enroll: --device-id needs --out (the folder for the device bundles)")
            os.makedirs(args.out, exist_ok=True)
            for d in args.device_id:
                ident = auth.enroll(d, lifetime=args.lifetime_days * 86400)
                path = os.path.join(args.out, f"{d}.json")
                ident.save(path)
                devices.append({"device_id": d, "path": path, "expires_at": ident.credential.expires_at})
    except EnrollmentError as exc:
        raise SystemExit(f"ldp fl enroll: {exc}") from None
    print(
        json.dumps(
            {"authority_key": base64.b64encode(auth.public_key).decode(), "key_id": auth.key_id, "devices": devices}
        )
    )
    return 0


def run_sign_task_cmd(args: argparse.Namespace) -> int:
    import base64
    import dataclasses
    import os

    from estimator.fl.task import FLTaskSpec, resolve_task_paths
    from ldp_core.fl.errors import FLError
    from ldp_core.tokens.enrollment import EnrollmentAuthority, EnrollmentError

    try:
        auth = EnrollmentAuthority.load(args.authority)
    except EnrollmentError as exc:
        raise SystemExit(f"ldp fl sign-task: {exc}") from None
    with open(args.task) as f:
        d = json.load(f)
    d["enrollment_key"] = base64.b64encode(auth.public_key).decode()
    d.pop("task_signature", None)
    try:  # a relative root_data (fltrust) is checked relative to the task file and written back as it was
        spec = FLTaskSpec.from_dict(resolve_task_paths(d, os.path.dirname(os.path.abspath(args.task))))
    except FLError as exc:
        raise SystemExit(f"ldp fl sign-task: {exc}") from None
    spec = dataclasses.replace(spec, task_signature=base64.b64encode(auth.sign_document(spec.signed_config())).decode())
    out = args.out or args.task
    written = spec.to_dict()
    if isinstance(d.get("aggregator"), dict) and "root_data" in d["aggregator"]:
        written["aggregator"]["root_data"] = d["aggregator"]["root_data"]  # the path as the file wrote it
    with open(out, "w") as f:
        json.dump(written, f, indent=2)
    print(json.dumps({"task": spec.task, "out": out, "signed": spec.signed_config()}))
    return 0


def _vote_release(spec: Any) -> Any:
    """A PATE task's answer to its unmasked vote histograms (estimator/pate/fl_task.py), else None."""
    if spec.pate is None:
        return None
    from estimator.pate.fl_task import PateVoteRelease

    return PateVoteRelease(spec)
