"""`moerag experts refit`: re-fit the experts to the content, the diff shown first, applied with --yes;
`moerag experts define`: an expert defined by documents (ids, a source folder, a tag);
`moerag experts history` and `moerag experts undo`: the changes that can be undone, and the undo."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from app.cli.common import local_runtime, server_for, settings_from, token_for


def add_commands(sub: Any, remote: argparse.ArgumentParser) -> None:
    """The `experts` command group on the main parser's subcommands."""
    experts = sub.add_parser("experts", help="re-fit the experts to the content")
    actions = experts.add_subparsers(dest="action", required=True)
    refit = actions.add_parser(
        "refit",
        parents=[remote],
        help="recluster, propose experts, show the diff; with --yes apply it and retrain the router",
    )
    refit.add_argument(
        "--experts", type=int, default=0, help="experts in all (default: today's kept, one new expert a new topic)"
    )
    refit.add_argument("--clusters", type=int, default=0, help="lists to make (default: automatic, from the size)")
    refit.add_argument("--keep-emptied", action="store_true", help="keep the unowned experts the refit leaves empty")
    refit.add_argument("--yes", action="store_true", help="apply the plan (without it only the diff is printed)")
    refit.set_defaults(func=cmd_refit)
    define = actions.add_parser(
        "define",
        parents=[remote],
        help="define an expert by documents: it gets lists of exactly their chunks, then a router is trained",
    )
    define.add_argument("expert", help="the expert's id or name")
    define.add_argument("--ids", default="", help="comma-separated document ids")
    define.add_argument("--source-prefix", help="documents whose source starts with this (a folder: docs/k8s/)")
    define.add_argument("--tag", help="documents whose metadata tags hold this")
    define.add_argument("--clear", action="store_true", help="define it by its clusters again (it keeps them)")
    define.set_defaults(func=cmd_define)
    history = actions.add_parser("history", parents=[remote], help="the changes to the experts that undo can revert")
    history.set_defaults(func=cmd_history)
    undo = actions.add_parser(
        "undo", parents=[remote], help="undo the last change to the experts (re-fit, proposal, map, define, delete)"
    )
    undo.add_argument("--yes", action="store_true", help="undo it (without it only the change is shown)")
    undo.set_defaults(func=cmd_undo)


def cmd_refit(args: argparse.Namespace) -> None:
    from tqdm import tqdm

    if args.experts < 0 or args.clusters < 0:
        raise SystemExit("moerag: --experts and --clusters take a positive count")
    settings = settings_from(args)
    params = {"experts": args.experts or None, "clusters": args.clusters or None}
    with tqdm(total=100, unit="%", desc="refit", disable=args.quiet) as bar:

        def progress(done: int, total: int) -> None:
            bar.n = done * 100 // max(total, 1)
            bar.refresh()

        with ExitStack() as stack:  # one runtime (one model load) for the plan and its apply, here
            server = server_for(args, settings)
            run = (
                _remote(server, token_for(args, settings, admin=True), progress)
                if server
                else _local(stack.enter_context(local_runtime(settings)), progress)
            )
            plan = run(params | {"apply": False})
            if args.yes:
                result = run(params | {"apply": True, "delete_emptied": not args.keep_emptied})
    if args.json:
        print(json.dumps(result if args.yes else plan))
        return
    print(describe(plan))
    if args.yes:
        print(f"applied: {len(result['experts'])} experts over {result['clusters']} lists; router {result['router']}")
    else:
        print("nothing changed: run again with --yes to apply this plan")


def _history(args: argparse.Namespace, undo: bool) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The undoable changes, newest first, and (`undo`) the result of undoing the newest."""
    settings = settings_from(args)
    server = server_for(args, settings)
    if server:
        from app.cli.remote import Remote

        with Remote(server, token_for(args, settings, admin=True)) as api:
            items = list(api.call("GET", "/admin/api/experts/history", params={"limit": 20})["items"])
            if not (undo and items):
                return items, None
            return items, dict(api.follow_job(api.call("POST", "/admin/api/experts/undo", ok=(202,)))["result"])
    from app.clustering import expert_history
    from app.services import expert_undo
    from engine.errors import MoeragError

    with local_runtime(settings) as rt:
        items = expert_history.history(rt.sessions, 0, 20)[1]
        if not (undo and items):
            return items, None
        try:
            return items, expert_undo.undo(rt.indexes, rt.routers.activate, rt.routers.retrain)
        except MoeragError as exc:
            raise SystemExit(f"moerag: {exc.code}: {exc.message}") from None


def cmd_history(args: argparse.Namespace) -> None:
    items, _ = _history(args, undo=False)
    if args.json:
        print(json.dumps(items, default=str))
        return
    for v in items:
        print(f"{v['id']:>5}  {v['created_at']}  {v['summary']}")
    if not items:
        print("no change to the experts to undo")


def cmd_undo(args: argparse.Namespace) -> None:
    items, result = _history(args, undo=args.yes)
    if not items:
        raise SystemExit("moerag: nothing to undo: no change to the experts is recorded")
    if result is None:
        print(f"would undo: {items[0]['summary']} (experts before it: {', '.join(items[0]['experts']) or 'none'})")
        print("nothing changed: run again with --yes to undo it")
        return
    if args.json:
        print(json.dumps(result))
        return
    back = ", ".join(result.get("restored", [])) or "none"
    removed = ", ".join(result.get("removed", [])) or "none"
    print(f"undone: {result['summary']}; experts restored: {back}; removed: {removed}")


def cmd_define(args: argparse.Namespace) -> None:
    try:
        ids = [int(i) for i in args.ids.split(",") if i.strip()]
    except ValueError:
        raise SystemExit(f"moerag: --ids takes comma-separated document ids, not {args.ids!r}") from None
    selector = {k: v for k, v in (("ids", ids), ("source_prefix", args.source_prefix), ("tag", args.tag)) if v}
    if not selector and not args.clear:
        raise SystemExit("moerag: give --ids, --source-prefix or --tag (or --clear)")
    settings = settings_from(args)
    server = server_for(args, settings)
    if server:
        from app.cli.remote import Remote

        with Remote(server, token_for(args, settings, admin=True)) as api:
            expert = _expert_id(args.expert, api.call("GET", "/admin/api/experts", params={"limit": 500})["items"])
            path = f"/admin/api/experts/{expert}/documents"
            if args.clear:
                api.call("DELETE", path, ok=(204,))
                result: dict[str, Any] = {"cleared": expert}
            else:
                result = dict(api.follow_job(api.call("PUT", path, ok=(202,), json=selector))["result"])
    else:
        result = _define_here(settings, args.expert, None if args.clear else selector)
    print(json.dumps(result) if args.json else _said(result))


def _define_here(settings: Any, name: str, selector: dict[str, Any] | None) -> dict[str, Any]:
    from sqlalchemy import select

    from app.clustering import expert_documents
    from app.core.models import Expert
    from app.services import expert_scopes
    from engine.errors import MoeragError

    with local_runtime(settings) as rt:
        with rt.sessions() as s:
            expert = _expert_id(name, [{"id": i, "name": n} for i, n in s.execute(select(Expert.id, Expert.name))])
        try:
            expert_documents.define(rt.sessions, expert, selector)
            if selector is None:
                return {"cleared": expert}
            result = expert_scopes.carve(rt.indexes, expert)
            result["router"] = rt.routers.retrain()
            return result
        except MoeragError as exc:
            raise SystemExit(f"moerag: {exc.code}: {exc.message}") from None


def _expert_id(name: str, experts: list[dict[str, Any]]) -> int:
    for e in experts:
        if str(e["id"]) == name or e["name"] == name:
            return int(e["id"])
    raise SystemExit(f"moerag: no expert {name!r} (ids and names: moerag's console, or GET /admin/api/experts)")


def _said(result: dict[str, Any]) -> str:
    if "cleared" in result:
        return f"expert {result['cleared']} is defined by its clusters again"
    return (
        f"{result['documents']} documents ({result['chunks']} chunks) now make up the expert's "
        f"{result['lists']} lists; router {result.get('router')}"
    )


def _remote(server: str, token: str | None, progress: Callable[[int, int], None]) -> Any:
    from app.cli.remote import Remote

    def run(params: dict[str, Any]) -> dict[str, Any]:
        with Remote(server, token) as api:
            job = api.call("POST", "/admin/api/experts/refit", ok=(202,), json=params)
            return dict(api.follow_job(job, progress)["result"])

    return run


def _local(rt: Any, progress: Callable[[int, int], None]) -> Any:
    from app.clustering.content_fit import ContentFit
    from app.services.refit import Refit
    from engine.errors import MoeragError

    refit = Refit(rt.indexes, rt.routers, ContentFit(rt.sessions, rt.indexes, lambda: rt.catalogue.version).new_topics)

    def run(params: dict[str, Any]) -> dict[str, Any]:
        experts, clusters = params["experts"] or 0, params["clusters"] or 0
        try:
            if not params["apply"]:
                return refit.plan(experts, clusters, progress)
            return refit.apply(experts, clusters, params["delete_emptied"], progress)
        except MoeragError as exc:
            raise SystemExit(f"moerag: {exc.code}: {exc.message}") from None

    return run


def describe(plan: dict[str, Any]) -> str:
    """The plan as the operator reads it before saying yes."""
    lines = [
        f"{plan['chunks']} chunks into {plan['clusters']} lists (the smallest {plan['smallest_list']} chunks), "
        f"{len(plan['experts'])} experts:"
    ]
    for e in plan["experts"]:
        what = (
            "new "
            if e["new"]
            else f"owned, unchanged: expert {e['expert_id']} "
            if e.get("owned")
            else f"keeps expert {e['expert_id']} "
        )
        titles = "; ".join(e["titles"][:3])
        size = f"{e.get('documents', '?')} documents, {e['lists']} lists, {e['chunks']} chunks"
        lines.append(f"  {what}{e['name']!r}: {size} ({titles})")
    for e in plan["emptied_experts"]:
        lines.append(f"  emptied: expert {e['id']} {e['name']!r} (deleted unless --keep-emptied)")
    left = plan.get("unassigned") or {}
    if left.get("documents"):
        lines.append(f"  unassigned: {left['documents']} documents ({left['why']}): {'; '.join(left['titles'][:5])}")
    if plan.get("note"):
        lines.append(f"  note: {plan['note']}")
    return "\n".join(lines)
