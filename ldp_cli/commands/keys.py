"""``ldp keys``: analyzer key pairs for sealed metrics (see :mod:`ldp_core.wire.sealing`, docs/SEALED.md).

``ldp keys new --dir KEYS`` creates an X25519 key pair: the private key in
``KEYS/analyzer-<id>.key`` (mode 0600; it stays with the analyzer: the sink
and the streaming estimator read it with ``--analyzer-keys KEYS``) and the
public entry in ``KEYS/analyzer-<id>.pub.json``. With ``--metrics FILE`` the
public entry becomes the file's current analyzer key (first of
``analyzer_keys``; the previous ones stay, as retired keys that old devices
may still seal to). The private key is never printed. ``ldp keys list``
shows the ids of a key folder.
"""

from __future__ import annotations

import argparse
import json

from ldp_cli.options import summary

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "keys", help="create and list analyzer key pairs for sealed metrics", description=summary(__doc__)
    )
    ks = p.add_subparsers(dest="keys_command", required=True)
    n = ks.add_parser("new", help="create a key pair (private key file mode 0600)")
    n.add_argument("--dir", required=True, help="the analyzer's key folder (created mode 0700)")
    n.add_argument("--metrics", default=None, help="make the new public key this metrics file's current key")
    n.set_defaults(func=run_new)
    ls = ks.add_parser("list", help="the key ids of a key folder")
    ls.add_argument("--dir", required=True)
    ls.set_defaults(func=run_list)


def run_new(args: argparse.Namespace) -> int:
    from ldp_core.files import write_atomic
    from ldp_core.metrics import parse_metrics
    from ldp_core.wire.sealing import new_key_file

    path, key = new_key_file(args.dir)
    out = {"key_id": key.key_id, "private_key_file": str(path), "public": key.public.to_dict()}
    if args.metrics:
        from pathlib import Path

        from ldp_core.metrics import MetricsFileError

        try:  # as JSON: a file that declares sealed metrics before it has a key must be fixable by this command
            doc = json.loads(Path(args.metrics).read_text())
        except (OSError, ValueError) as exc:
            raise MetricsFileError(f"cannot read metrics file {args.metrics!r}: {exc}") from None
        if not isinstance(doc, dict):
            raise MetricsFileError(f"{args.metrics!r} is not a metrics file")
        old = doc.get("analyzer_keys", [])
        keys = [key.public.to_dict()] + [k for k in old if isinstance(k, dict) and k.get("key_id") != key.key_id]
        doc["analyzer_keys"] = keys
        text = json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
        parse_metrics(text, reject_expired=False)  # what is written must load
        write_atomic(args.metrics, text.encode())
        out["metrics"] = args.metrics
    print(json.dumps(out), flush=True)
    return 0


def run_list(args: argparse.Namespace) -> int:
    from ldp_core.wire.sealing import KeyRing

    ring = KeyRing.load(args.dir)
    print(json.dumps({"keys": [{"key_id": k, "public_key": ring[k].public_key.hex()} for k in ring]}), flush=True)
    return 0
