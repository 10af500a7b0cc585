"""``ldp psi``: private set intersection between two organisations over HTTP (docs/PSI.md).

* ``ldp psi serve --items FILE``: the answering party, a service on 127.0.0.1 (``--port``, 0 for a free
  one; the address is printed). ``--cardinality-only`` serves only the size of intersections.
* ``ldp psi client --server URL --items FILE``: the asking party; prints the common items (or, with
  ``--cardinality-only``, only their number), the bytes each way and the time. ``--json`` prints one
  object (``intersection_size``, ``intersection`` — null in cardinality mode —, ``request_bytes``,
  ``answer_bytes``, ``plaintext_bytes``, ``seconds``); ``--out FILE`` writes the common items one a
  line; ``--plot FILE.png`` draws the bytes each way and the share of items in common.

Items files hold one item a line (UTF-8; blank lines skipped, duplicates counted once). Bad input
(missing file, empty set, a server in the other mode or unreachable) exits 2 with the reason.
"""

from __future__ import annotations

import argparse
import json
import sys

from ldp_cli.commands.argtypes import positive_int as _positive_int
from ldp_cli.options import add_log_level, bind_socket, on_stop_signals

__all__ = ["register"]


def _fpr(text: str) -> float:
    v = float(text)
    if not 0.0 < v < 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1), got {text}")
    return v


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("psi", help="private set intersection between two organisations over HTTP")
    verbs = p.add_subparsers(dest="psi_command", required=True)
    s = verbs.add_parser("serve", help="answer PSI requests for the items of FILE")
    s.add_argument("--items", required=True, help="the server's items, one a line")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    s.add_argument("--port", type=int, default=8790, help="port (default 8790; 0 picks a free one)")
    s.add_argument("--cardinality-only", action="store_true", help="reveal only the intersection's size")
    s.add_argument(
        "--fpr", type=_fpr, default=1e-9, help="false-positive rate over a whole client query (default 1e-9)"
    )
    s.add_argument(
        "--max-client-items", type=_positive_int, default=2_000_000, help="largest query (default 2,000,000)"
    )
    add_log_level(s)
    s.set_defaults(func=_run_serve)
    c = verbs.add_parser("client", help="intersect the items of FILE with a PSI server's")
    c.add_argument("--server", required=True, help="the server's base URL, e.g. http://127.0.0.1:8790")
    c.add_argument("--items", required=True, help="the client's items, one a line")
    c.add_argument("--cardinality-only", action="store_true", help="learn only the intersection's size")
    c.add_argument("--out", default=None, help="write the common items to this file, one a line")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.add_argument("--plot", default=None, help="write bytes each way and the share in common to this PNG")
    c.set_defaults(func=_run_client)


def _mode(args: argparse.Namespace) -> str:
    return "cardinality" if args.cardinality_only else "intersection"


def _run_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from estimator.psi.http import create_app
    from estimator.psi.protocol import PsiError, PsiServer, load_items

    try:
        server = PsiServer(load_items(args.items), _mode(args), args.fpr, args.max_client_items)  # type: ignore[arg-type]
    except PsiError as e:
        print(f"ldp psi serve: error: {e}", file=sys.stderr)
        return 2
    sock = bind_socket(args.host, args.port)
    host, port = sock.getsockname()[:2]
    print(f"ldp psi: {len(server.items)} items, {server.mode} mode, listening on http://{host}:{port}", flush=True)
    config = uvicorn.Config(
        create_app(server), access_log=False, server_header=False, log_level=args.log_level, lifespan="on"
    )
    on_stop_signals(_exit_normally)
    uvicorn.Server(config).run(sockets=[sock])
    return 0


def _exit_normally(signum: int, frame: object) -> None:
    raise SystemExit(0)


def _run_client(args: argparse.Namespace) -> int:
    from estimator.psi.http import run_client
    from estimator.psi.protocol import PsiError, load_items

    try:
        r = run_client(args.server, load_items(args.items), _mode(args))  # type: ignore[arg-type]
    except PsiError as e:
        print(f"ldp psi client: error: {e}", file=sys.stderr)
        return 2
    if args.out and r["intersection"] is not None:
        with open(args.out, "w", encoding="utf-8") as f:
            f.writelines(x + "\n" for x in r["intersection"])
        r["out"] = args.out
    if args.plot:
        from estimator.psi.plots import plot_query

        plot_query(r, args.plot)
        r["plot"] = args.plot
    if args.json:
        print(json.dumps(r))
        return 0
    print(
        f"{r['intersection_size']} of {r['client_items']} items in common ({r['mode']} mode); "
        f"sent {r['request_bytes']:,} B, received {r['answer_bytes']:,} B in {r['seconds']:.2f} s"
    )
    if r["intersection"] is not None and not args.out:
        print("\n".join(r["intersection"]))
    return 0
