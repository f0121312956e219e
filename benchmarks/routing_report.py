"""The tables of benchmarks/routing.py: scope leakage by domain, the router's figures, where routed's
misses are, the markdown report."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from typing import Any

import numpy as np
import torch

from benchmarks.evalcorpus import FAQ_PAGES, domain_of

DOMAINS = ("debian", "git", "nodejs", "postgresql", "python", "sqlite")
MISS_DEPTH = 100  # how deep `miss_anatomy` looks for a missed answer on the path the question took
RANK_BANDS = ((11, 20), (21, 50), (51, MISS_DEPTH))  # beyond the top 10, up to MISS_DEPTH


def chunk_experts(rt: Any, sources: Collection[str] | None = None) -> list[tuple[str, int | None]]:
    """(page source, the expert owning the chunk's list) for every chunk, or those of `sources`' pages."""
    from sqlalchemy import select

    from app.core.models import Chunk, Cluster, Document

    query = (
        select(Document.source, Cluster.expert_id)
        .select_from(Chunk)
        .join(Document, Document.id == Chunk.document_id)
        .join(Cluster, Cluster.id == Chunk.cluster_id)
    )
    with rt.sessions() as s:
        return list(s.execute(query if sources is None else query.where(Document.source.in_(sources))).tuples())


def domain_leakage(rt: Any, ids: dict[str, int]) -> dict[str, Any]:
    """Chunks whose list belongs to another domain's expert: out of reach of their own expert path."""
    name = {v: k for k, v in ids.items()}
    rows = chunk_experts(rt)
    out: dict[str, Any] = {"per_domain": {}}
    total = Counter()
    leaked = Counter()
    for source, expert in rows:
        d = domain_of(source)
        keys = [d, "all"] + (["faq_pages"] if FAQ_PAGES.match(source) else [])
        for key in keys:
            total[key] += 1
            leaked[key] += name.get(expert) != d
    for key in total:
        share = round(leaked[key] / total[key], 4)
        if key in DOMAINS:
            out["per_domain"][key] = share
        else:
            out[key] = share
    out["faq_page_chunks_outside"] = leaked["faq_pages"]
    out["faq_page_chunks"] = total["faq_pages"]
    return out


def page_experts(rt: Any, questions: list[dict[str, str]]) -> list[int | None]:
    """The expert holding each question's answer page (most of its chunks' lists; None: no such page).

    The expert path can find an answer only there. On the FAQ pages it is the question's own
    domain (their leakage is 0); elsewhere whole pages sit in another domain's expert (PostgreSQL's
    numeric and XML types with Python's), and a route there is the right route.
    """
    votes: dict[str, Counter[int | None]] = {}
    for source, expert in chunk_experts(rt, {q["source"] for q in questions}):
        votes.setdefault(source, Counter())[expert] += 1
    return [votes[q["source"]].most_common(1)[0][0] if q["source"] in votes else None for q in questions]


def right_page_on_path(routes: list[Any], pages: list[int | None]) -> float:
    """Share of the expert path's questions sent to the expert holding their answer's page."""
    on_path = [
        r.expert is not None and r.expert.id == p for r, p in zip(routes, pages, strict=True) if r.path == "expert"
    ]
    return round(sum(on_path) / max(len(on_path), 1), 3)


def route_losses(
    questions: list[dict[str, str]],
    routes: list[Any],
    first: dict[str, list[int | None]],
) -> list[dict[str, Any]]:
    """The questions where routed and global hybrid or the oracle route disagree on hit@10, each
    with the route it took, so every loss (and gain) of the expert path can be read.

    first: the rank of the first hit (None: none in the top 10) per question for "routed",
    "hybrid" and "oracle".
    """
    out = []
    for i, (q, route) in enumerate(zip(questions, routes, strict=True)):
        found = {name: ranks[i] for name, ranks in first.items()}
        if len({rank is not None for rank in found.values()}) == 1:
            continue  # all three agree
        expert = route.expert.name if route.expert is not None else None
        top = [(e.name if e is not None else None, round(p, 3)) for e, p in route.top]
        out.append(
            {
                "id": q["id"],
                "domain": q["domain"],
                "question": q["question"],
                "path": route.path,
                "reason": route.reason,
                "expert": expert,
                "confidence": round(route.confidence, 3) if route.confidence is not None else None,
                "top": top,
                "first_hit": found,
            }
        )
    return out


def miss_anatomy(
    routes: list[Any],
    pages: list[int | None],
    routed_first: list[int | None],
    deeper: dict[int, int | None],
) -> dict[str, Any]:
    """Where routed's misses are: sent to another expert than the one holding the answer's page,
    answered by the fallback, or sent to the right expert and ranked below the top 10 there.

    routed_first: the first hit's rank in routed's top 10 per question (None: a miss).
    deeper: per missed question (its index), the first hit's rank in the top MISS_DEPTH of the
    path it took (the same expert, or the fallback), asked again that deep; None: not there.
    Each path's misses are counted by rank band: they tell a ranking loss (a reranker's work)
    from a routing one (the gate's).
    """

    def bands(ranks: list[int | None]) -> dict[str, int]:
        out = {f"{a}-{b}": sum(r is not None and a <= r <= b for r in ranks) for a, b in RANK_BANDS}
        return out | {f"beyond {MISS_DEPTH}": sum(r is None for r in ranks)}

    misses = [i for i, r in enumerate(routed_first) if r is None]
    misrouted, fallback, right = [], [], []
    for i in misses:
        route = routes[i]
        if route.path != "expert":
            fallback.append(i)
        elif route.expert is None or route.expert.id != pages[i]:
            misrouted.append(i)
        else:
            right.append(i)
    return {
        "misses": len(misses),
        "questions": len(routed_first),
        "misrouted": len(misrouted),
        "misrouted_ranks_there": bands([deeper.get(i) for i in misrouted]),
        "fallback": len(fallback),
        "fallback_reasons": dict(Counter(routes[i].reason for i in fallback)),
        "fallback_ranks": bands([deeper.get(i) for i in fallback]),
        "right_expert": len(right),
        "right_expert_ranks": bands([deeper.get(i) for i in right]),
    }


def path_figures(routes: list[Any], questions: list[dict[str, str]]) -> tuple[float, float]:
    """(share of questions on the expert path, share of those sent to their own domain's expert)."""
    on_path = [
        r.expert is not None and r.expert.name == q["domain"]
        for r, q in zip(routes, questions, strict=True)
        if r.path == "expert"
    ]
    return round(len(on_path) / len(questions), 3), round(sum(on_path) / max(len(on_path), 1), 3)


def router_figures(
    rt: Any,
    questions: list[dict[str, str]],
    q_vecs: np.ndarray,
    ids: dict[str, int],
    routes: list[Any],
    pages: list[int | None] | None = None,
) -> dict[str, Any]:
    """The active router on the questions: accuracy, calibration, the expert path's share and precision.

    With `pages` (`page_experts`) the right expert is the one holding the answer's page; the
    domain's figures are kept beside (`accuracy_by_domain`, `expert_path_accuracy`)."""
    from engine.calibration import ece_noise_floor, lowest_ece_by_temperature
    from engine.router_training import evaluate as evaluate_router

    router = rt.state().router
    position = {e: i for i, e in enumerate(router.expert_ids)}
    # The right class is the expert holding the answer's page, which is what the router learns to
    # name (each chunk's label is its list's expert), or the domain's where no page is known. On
    # the FAQ pages the two agree; elsewhere whole pages sit in another domain's expert.
    known = pages if pages is not None else [None] * len(questions)
    truth = [p if p is not None else ids[q["domain"]] for q, p in zip(questions, known, strict=True)]
    labels = torch.tensor([position[t] for t in truth])
    by_domain = torch.tensor([position[ids[q["domain"]]] for q in questions])
    bm25 = rt.state().lexical
    queries = [bm25.query(q["question"]) for q in questions] if bm25 is not None else None
    logits = router.served_logits(rt.indexes.index, q_vecs, queries)  # [Q, C], as the served gate computes them
    quality = evaluate_router(logits, labels, router.temperature, rt.settings.route_threshold)
    conf = torch.softmax(logits / router.temperature, -1).max(-1).values  # [Q]
    floor = ece_noise_floor(conf)
    bound = lowest_ece_by_temperature(logits, labels)  # T chosen on these questions: a bound, not served
    per_domain_share = {}
    for d in sorted({q["domain"] for q in questions}):
        pick = [i for i, q in enumerate(questions) if q["domain"] == d]
        share, right = path_figures([routes[i] for i in pick], [questions[i] for i in pick])
        per_domain_share[d] = {"expert_path_share": share, "right_on_path": right}
    share, right = path_figures(routes, questions)
    return {
        "version": router.version_id,
        "accuracy": round(quality["accuracy"], 3),
        "accuracy_by_domain": round(float((logits.argmax(-1) == by_domain).float().mean()), 3),
        "ece_before": round(quality["ece_before"], 4),
        "ece_after": round(quality["ece_after"], 4),
        # Below the accuracy: under-confident (falls back more than it needs to); above: over-confident.
        "mean_confidence": round(float(conf.mean()), 3),
        "reliability": quality["reliability"],
        # What a perfectly calibrated gate with these confidences would show on this many questions.
        "ece_if_calibrated": {k: round(v, 4) for k, v in floor.items()},
        "temperature": round(router.temperature, 3),
        # The lowest ECE any one temperature reaches on these questions (and that T), chosen on them.
        "ece_best_temperature": {"ece": round(bound["ece"], 4), "temperature": round(bound["temperature"], 3)},
        "coverage_at_threshold": round(quality["coverage_at_threshold"], 3),
        "accuracy_at_threshold": round(quality["accuracy_at_threshold"], 3),
        "expert_path_share": share,
        "expert_path_accuracy": right,
        "expert_path_right_page": right_page_on_path(routes, pages) if pages is not None else None,
        "fallback_reasons": dict(Counter(r.reason for r in routes if r.path == "fallback")),
        "per_domain": per_domain_share,
        "training": {k: v for k, v in router.metrics.items() if isinstance(v, int | float)},
    }


def _bound(router: dict[str, Any]) -> str:
    b = router.get("ece_best_temperature")
    return f"{b['ece']} ({b['temperature']})" if b else ""


def _anatomy(a: dict[str, Any]) -> str:
    """`miss_anatomy` as a table: one row per kind of miss, its ranks on the path it took."""
    bands = list(a["right_expert_ranks"])
    lines = [
        f"| routed's {a['misses']} misses of {a['questions']} | questions | first hit on that path: "
        + " | ".join(bands)
        + " |",
        "|---" * (len(bands) + 2) + "|",
    ]
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(a["fallback_reasons"].items()))
    rows = (
        ("sent to the expert holding the answer's page", a["right_expert"], a["right_expert_ranks"]),
        ("sent to another expert", a["misrouted"], a["misrouted_ranks_there"]),
        (f"answered by the fallback ({reasons or 'none'})", a["fallback"], a["fallback_ranks"]),
    )
    for name, n, ranks in rows:
        lines.append(f"| {name} | {n} | " + " | ".join(str(ranks[b]) for b in bands) + " |")
    return "\n".join(lines)


def markdown(result: dict[str, Any]) -> str:
    lines = ["| retrieval | hit@1 | hit@5 | hit@10 | MRR@10 | top-1 domain |", "|---|---|---|---|---|---|"]
    for name, m in result["retrieval"].items():
        lines.append(f"| {name} | {m['hit@1']} | {m['hit@5']} | {m['hit@10']} | {m['mrr@10']} | {m['top1_domain']} |")
    lines += ["", "| routed minus | hit@10 diff | 95% CI | only routed / only other |", "|---|---|---|---|"]
    for name, d in result["routed_minus"].items():
        ci = f"[{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]"
        lines.append(f"| {name} | {d['diff']:+.3f} | {ci} | {d['a_only']} / {d['b_only']} |")
    lines += [
        "",
        "| router | accuracy: the answer page's expert (its domain's) | mean confidence | expert-path share "
        "| right on path (domain) | right on path (the answer page's expert) | ECE "
        "| ECE if calibrated (mean, p95) | T | lowest ECE of any T on these questions (its T) |",
    ]
    lines += ["|---|---|---|---|---|---|---|---|---|---|"]
    for key in ("router", "router_faq_blind"):
        if key in result:
            r = result[key]
            lines.append(
                f"| {key} | {r['accuracy']} ({r.get('accuracy_by_domain', '')}) | {r.get('mean_confidence', '')} | "
                f"{r['expert_path_share']} | "
                f"{r['expert_path_accuracy']} | {r.get('expert_path_right_page', '')} | "
                f"{r['ece_after']} | {r['ece_if_calibrated']['mean']}, {r['ece_if_calibrated']['p95']} | "
                f"{r['temperature']} | {_bound(r)} |"
            )
    if "miss_anatomy" in result:
        lines += ["", _anatomy(result["miss_anatomy"])]
    domains = result["per_domain_hit@10"]
    names = [n for n in next(iter(domains.values())) if n != "questions"]
    lines += ["", "| domain (questions) | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for d, row in domains.items():
        lines.append(f"| {d} ({row['questions']}) | " + " | ".join(str(row[n]) for n in names) + " |")
    for name, sub in result.get("also", {}).items():
        lines += ["", f"### Also: {name} ({sub['corpus']['questions']} questions, the same store and router)", ""]
        lines.append(markdown(sub))
    return "\n".join(lines)
