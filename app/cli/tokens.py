"""`moerag tokens create|list|revoke`: scoped API tokens, through the server that holds the data
directory when one does, else on its database directly (no model loaded)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from app.cli.common import server_for, settings_from, token_for


def add_commands(sub: Any, remote: argparse.ArgumentParser) -> None:
    """The `tokens` command group on the main parser's subcommands."""
    tokens = sub.add_parser("tokens", help="scoped API tokens: create, list, revoke")
    actions = tokens.add_subparsers(dest="action", required=True)
    create = actions.add_parser(
        "create", parents=[remote], help="a named token; its secret is printed once (only its hash is kept)"
    )
    create.add_argument("name")
    create.add_argument("--role", choices=["read", "write", "admin"], default="read")
    create.add_argument("--expert", type=int, action="append", default=[], help="an expert's lists it may read")
    create.add_argument("--tag", action="append", default=[], help="documents tagged so (metadata.tags)")
    create.add_argument("--source-prefix", action="append", default=[], help="documents whose source starts so")
    create.add_argument("--expires-days", type=float, help="refused after this many days (default: never)")
    create.set_defaults(func=cmd_create)
    listing = actions.add_parser("list", parents=[remote], help="every token, revoked ones too (never a secret)")
    listing.set_defaults(func=cmd_list)
    revoke = actions.add_parser("revoke", parents=[remote], help="refuse a token from its next request on")
    revoke.add_argument("id", type=int)
    revoke.set_defaults(func=cmd_revoke)


def _run(args: argparse.Namespace, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    """The admin API's answer: from the server holding the data dir, else the same service here."""
    settings = settings_from(args)
    server = server_for(args, settings)
    if server:
        from app.cli.remote import Remote

        with Remote(server, token_for(args, settings, admin=True)) as api:
            return api.call(method, path, ok=(200, 201), json=body)
    from app.core.db import make_engine, make_sessionmaker
    from app.core.migrate import upgrade
    from app.services.tokens import Tokens
    from engine.errors import MoeragError

    settings.resolved_data_dir.mkdir(parents=True, exist_ok=True)
    engine = make_engine(settings.db_url)
    try:
        upgrade(engine)
        tokens = Tokens(make_sessionmaker(engine))
        if method == "POST" and body is not None:
            row, secret = tokens.create(body["name"], body["role"], body["scope"], body["expires_days"])
            return {"token": row, "secret": secret}
        if method == "DELETE":
            return tokens.revoke(int(path.rsplit("/", 1)[1]))
        return tokens.list()
    except MoeragError as exc:
        raise SystemExit(f"moerag: {exc.code}: {exc}") from None
    finally:
        engine.dispose()


def cmd_create(args: argparse.Namespace) -> None:
    scoped = args.expert or args.tag or args.source_prefix
    scope = {"experts": args.expert, "tags": args.tag, "source_prefixes": args.source_prefix} if scoped else None
    body = {"name": args.name, "role": args.role, "scope": scope, "expires_days": args.expires_days}
    made = _run(args, "POST", "/admin/api/tokens", body)
    if args.json:
        print(json.dumps(made))
        return
    print(f"token {made['token']['id']} ({made['token']['name']}, {made['token']['role']}): {made['secret']}")
    print("this secret is shown once; only its SHA-256 is stored")


def cmd_list(args: argparse.Namespace) -> None:
    rows = _run(args, "GET", "/admin/api/tokens")
    if args.json:
        print(json.dumps(rows))
        return
    for t in rows:
        state = "revoked" if t["revoked"] else f"expires {t['expires_at']}" if t["expires_at"] else "active"
        print(f"{t['id']:>4}  {t['name']}  {t['role']}  {json.dumps(t['scope']) if t['scope'] else 'all'}  {state}")


def cmd_revoke(args: argparse.Namespace) -> None:
    row = _run(args, "DELETE", f"/admin/api/tokens/{args.id}")
    print(json.dumps(row) if args.json else f"token {row['id']} ({row['name']}) revoked")
