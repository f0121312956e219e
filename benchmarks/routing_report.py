"""The tables of benchmarks/routing.py: scope leakage by domain, per-domain hit@10, the markdown report."""

from __future__ import annotations

from collections import Counter
from typing import Any

from benchmarks.evalcorpus import FAQ_PAGES, domain_of

DOMAINS = ("debian", "git", "nodejs", "postgresql", "python", "sqlite")


def domain_leakage(rt: Any, ids: dict[str, int]) -> dict[str, Any]:
    """Chunks whose list belongs to another domain's expert: out of reach of their own expert path."""
    from sqlalchemy import select

    from app.models import Chunk, Cluster, Document

    name = {v: k for k, v in ids.items()}
    with rt.sessions() as s:
        rows = s.execute(
            select(Document.source, Cluster.expert_id)
            .select_from(Chunk)
            .join(Document, Document.id == Chunk.document_id)
            .join(Cluster, Cluster.id == Chunk.cluster_id)
        ).all()
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


def markdown(result: dict[str, Any]) -> str:
    lines = ["| retrieval | hit@1 | hit@5 | hit@10 | MRR@10 | top-1 domain |", "|---|---|---|---|---|---|"]
    for name, m in result["retrieval"].items():
        lines.append(f"| {name} | {m['hit@1']} | {m['hit@5']} | {m['hit@10']} | {m['mrr@10']} | {m['top1_domain']} |")
    lines += ["", "| routed minus | hit@10 diff | 95% CI | only routed / only other |", "|---|---|---|---|"]
    for name, d in result["routed_minus"].items():
        ci = f"[{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]"
        lines.append(f"| {name} | {d['diff']:+.3f} | {ci} | {d['a_only']} / {d['b_only']} |")
    lines += ["", "| router | accuracy | expert-path share | right on path | ECE | temperature |"]
    lines += ["|---|---|---|---|---|---|"]
    for key in ("router", "router_faq_blind"):
        if key in result:
            r = result[key]
            lines.append(
                f"| {key} | {r['accuracy']} | {r['expert_path_share']} | {r['expert_path_accuracy']} | "
                f"{r['ece_after']} | {r['temperature']} |"
            )
    domains = result["per_domain_hit@10"]
    names = [n for n in next(iter(domains.values())) if n != "questions"]
    lines += ["", "| domain (questions) | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for d, row in domains.items():
        lines.append(f"| {d} ({row['questions']}) | " + " | ".join(str(row[n]) for n in names) + " |")
    return "\n".join(lines)
