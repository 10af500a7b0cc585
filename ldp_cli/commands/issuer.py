"""``ldp issuer``: the anonymous upload-token issuer (:mod:`collector.issuer`, docs/TOKENS.md).

* ``ldp issuer serve --state DIR --authority-key B64 [--tokens-per-day K]``: run it (127.0.0.1:8091 by
  default); ``--authority FILE`` takes the public key from an enrollment authority key file instead, and with
  neither the keys come from ``$LDP_ISSUER_AUTHORITY_KEY`` (base64, comma-separated: how docker-compose.yml
  passes them); ``--allow-origin ORIGIN`` (repeatable, else ``$LDP_ISSUER_ALLOW_ORIGINS``, comma-separated)
  lets web pages of those origins fetch keys and tokens cross-origin (CORS);
* ``ldp issuer keys --state DIR [--days N]``: make the day keys of today and the next days ahead of time
  (private keys mode 0600 in ``DIR/keys``, public ones in ``DIR/public``: the collector's ``--token-keys``);
* ``ldp issuer enroll``: the same as ``ldp fl enroll`` (one enrollment authority serves both): mint device
  credentials for tests, the demo and operators without an attestation service.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import sys
import time

from ldp_cli.options import add_log_level, bind_socket, on_stop_signals, summary

__all__ = ["register", "DEFAULT_PORT", "AUTHORITY_KEY_ENV", "ALLOW_ORIGINS_ENV"]

#: beside the estimator's 8090 on one host
DEFAULT_PORT = 8091
#: the enrollment authorities' public keys (base64, comma-separated) when no --authority-key/--authority is given
AUTHORITY_KEY_ENV = "LDP_ISSUER_AUTHORITY_KEY"
#: the web page origins allowed cross-origin (comma-separated) when no --allow-origin is given
ALLOW_ORIGINS_ENV = "LDP_ISSUER_ALLOW_ORIGINS"


def register(sub: argparse._SubParsersAction) -> None:
    from ldp_cli.commands import fl

    p = sub.add_parser("issuer", help="the anonymous upload-token issuer", description=summary(__doc__))
    isub = p.add_subparsers(dest="issuer_command", required=True)
    s = isub.add_parser("serve", help="run the issuer")
    s.add_argument("--state", required=True, help="state folder: day keys and per-device counts (SQLite)")
    s.add_argument("--authority-key", action="append", default=[], help="an authority's public key (base64)")
    s.add_argument("--authority", action="append", default=[], help="an enrollment authority key file")
    s.add_argument("--tokens-per-day", type=int, default=64, help="K: tokens per device per UTC day (default 64)")
    s.add_argument("--name", default="ldp-issuer", help="the issuer's name in the token challenge")
    s.add_argument(
        "--allow-origin",
        dest="allow_origins",
        action="append",
        default=None,
        metavar="ORIGIN",
        help="a web page origin whose browsers may fetch keys and tokens (CORS); repeatable; * allows any page "
        f"(default ${ALLOW_ORIGINS_ENV}, comma-separated, else none)",
    )
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 picks a free one)")
    add_log_level(s)
    s.set_defaults(func=run_serve)
    k = isub.add_parser("keys", help="make the day keys ahead of time")
    k.add_argument("--state", required=True)
    k.add_argument("--days", type=int, default=2, help="today and the next N-1 days (default 2)")
    k.set_defaults(func=run_keys)
    e = isub.add_parser("enroll", help="mint device credentials (as ldp fl enroll)")
    e.add_argument("--authority", required=True, help="the authority key file")
    e.add_argument("--init-authority", action="store_true", help="create the authority key file (refuses to overwrite)")
    e.add_argument("--device-id", action="append", default=[], help="a device id to enroll (repeatable)")
    e.add_argument(
        "--out", default=None, metavar="DIR", help="folder (not a file) for the device bundles (<device-id>.json)"
    )
    e.add_argument("--lifetime-days", type=int, default=365, help="credential lifetime (default 365)")
    e.set_defaults(func=fl.run_enroll_cmd)


def _authority_keys(args: argparse.Namespace) -> tuple[bytes, ...]:
    import os

    from ldp_core.tokens.enrollment import EnrollmentAuthority

    texts = list(args.authority_key)
    if not texts and not args.authority:
        texts = [t.strip() for t in os.environ.get(AUTHORITY_KEY_ENV, "").split(",") if t.strip()]
        if not texts:
            raise ValueError(
                f"the issuer needs an enrollment authority public key: --authority-key B64, --authority FILE or "
                f"${AUTHORITY_KEY_ENV} (ldp issuer enroll --init-authority prints it as authority_key)"
            )
    keys = []
    for text in texts:
        try:
            raw = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"--authority-key {text[:20]!r} is not base64") from None
        if len(raw) != 32:
            raise ValueError("--authority-key must be a 32-byte Ed25519 public key in base64")
        keys.append(raw)
    keys += [EnrollmentAuthority.load(f).public_key for f in args.authority]
    return tuple(keys)


def run_serve(args: argparse.Namespace) -> int:
    import os

    import uvicorn

    from collector.cors import parse_origins
    from collector.errors import ConfigError
    from collector.issuer import IssuerSettings, create_issuer_app

    try:
        origins = parse_origins(
            args.allow_origins if args.allow_origins is not None else os.environ.get(ALLOW_ORIGINS_ENV, ""),
            what="--allow-origin" if args.allow_origins is not None else f"${ALLOW_ORIGINS_ENV}",
        )
    except ConfigError as exc:
        print(f"ldp issuer: error: {exc}", file=sys.stderr)
        return 2
    settings = IssuerSettings(
        args.state,
        _authority_keys(args),
        issuer_name=args.name,
        tokens_per_day=args.tokens_per_day,
        allow_origins=origins,
    )
    app = create_issuer_app(settings)
    sock = bind_socket(args.host, args.port)
    host, port = sock.getsockname()[:2]
    k = settings.tokens_per_day
    print(
        f"ldp issuer: listening on http://{host}:{port} (K = {k} tokens/device/metric-day: one install puts at most"
        f" {k} x r reports into any one metric-day, r = the metric's max_reports_per_day)",
        flush=True,
    )
    server = uvicorn.Server(
        uvicorn.Config(app, access_log=False, server_header=False, log_level=args.log_level, lifespan="on")
    )
    on_stop_signals(_exit_normally)
    server.run(sockets=[sock])
    return 0


def run_keys(args: argparse.Namespace) -> int:
    from collector.issuer import IssuerKeys, public_key_entry
    from ldp_core.days import iso_day, utc_day

    keys = IssuerKeys(args.state)
    today = utc_day(time.time())
    out = []
    for i in range(max(1, args.days)):
        day = iso_day(today + i)
        out.append(public_key_entry(day, keys.key(day).public_key))
    json.dump({"keys": [{"day": e["day"], "token_key_id": e["token_key_id"]} for e in out]}, sys.stdout)
    print()
    return 0


def _exit_normally(signum: int, frame: object) -> None:
    raise SystemExit(0)
