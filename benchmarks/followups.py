"""Follow-up questions on the evaluation store: is a conversation's second turn routed to the
first turn's topic, and is a second turn on a new topic left alone?

    python benchmarks/followups.py --data-dir D [--llm http://127.0.0.1:8080/v1 --model smollm2]
    # results: benchmarks/results/followups.json

Two-turn conversations are made from the FAQ dev questions (`../shared/eval/faq-dev.jsonl`),
each question the first turn once:

- **follow-up**: the second turn is one of FOLLOW_UPS ("and how do I undo that?", in turn); the
  right route is the first question's domain expert (the fallback is counted apart, not wrong);
- **switch**: the second turn is the next dev question of another domain, asked as written; the
  right route is its own domain, and its FAQ answer should stay in the top 10 (section 5's rule).

Each second turn is made standalone three ways: as asked (no rewrite), by the rule
(`engine.followup.standalone`), and, with `--llm`, by the model through `make_standalone` as a
served conversation asks it (the reply checked, the rule when refused), except that the first
turn's answer is not in the history it sees (the turns are routed and retrieved, not answered).
Each is then routed and retrieved by the pipeline as served (k=10). An expert's domain is the
one holding most of its chunks. The dev questions are only asked here: nothing is trained or tuned on them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

RESULTS = Path(__file__).resolve().parent / "results"
FOLLOW_UPS = (
    "and how do I undo that?",
    "what about the configuration?",
    "why?",
    "can you show an example of it?",
    "is there an alternative to that?",
    "and on older versions?",
    "how do I check that it worked?",
    "what are the risks of doing this?",
)


def expert_domains(rt: Any) -> dict[int, str]:
    """{expert id: the domain holding most of its chunks}."""
    from sqlalchemy import select

    from app.core.models import Chunk, Cluster, Document
    from benchmarks.evalcorpus import domain_of

    votes: dict[int, Counter[str]] = {}
    with rt.sessions() as s:
        rows = s.execute(
            select(Cluster.expert_id, Document.source).join(Chunk, Chunk.cluster_id == Cluster.id).join(Document)
        )
        for expert, source in rows:
            if expert is not None:
                votes.setdefault(expert, Counter())[domain_of(source)] += 1
    return {e: c.most_common(1)[0][0] for e, c in votes.items()}


def conversations(questions: list[dict[str, str]]) -> list[dict[str, Any]]:
    """[{kind, first, second, domain, gold}]: a follow-up and a switch for each dev question."""
    out: list[dict[str, Any]] = []
    for i, q in enumerate(questions):
        out.append({"kind": "follow-up", "first": q["question"], "second": FOLLOW_UPS[i % len(FOLLOW_UPS)],
                    "domain": q["domain"], "gold": None})  # fmt: skip
        nxt = next(o for o in questions[i + 1 :] + questions[:i] if o["domain"] != q["domain"])
        out.append(
            {"kind": "switch", "first": q["question"], "second": nxt["question"], "domain": nxt["domain"], "gold": nxt}
        )
    return out


def score(rt: Any, convs: list[dict[str, Any]], way: str, domains: dict[int, str], complete: Any) -> dict[str, Any]:
    """Route and retrieve each second turn made standalone by `way`: counts per kind."""
    from benchmarks.evalcorpus import is_hit
    from engine.followup import make_standalone, standalone
    from engine.pipeline import AskRequest

    limit = rt.settings.max_question_chars
    tally: dict[str, Counter[str]] = {}
    rewrite_ms: list[float] = []
    for c in convs:
        t = time.perf_counter()
        if way == "as asked":
            text, by = c["second"], None
        elif way == "rule":
            text = standalone(c["second"], c["first"], limit)
            by = "rule" if text != c["second"] else None
        else:
            text, by = make_standalone(c["second"], [(c["first"], None)], limit, complete)
            rewrite_ms.append((time.perf_counter() - t) * 1000)
        p = rt.pipeline.prepare(AskRequest(text, top_k=10))
        n = tally.setdefault(c["kind"], Counter())
        n["questions"] += 1
        n[f"by {by}"] += 1
        expert = p.route.expert.id if p.route.path == "expert" and p.route.expert is not None else None
        n["fallback" if expert is None else "right" if domains.get(expert) == c["domain"] else "wrong"] += 1
        if c["gold"] is not None:
            n["hit@10"] += any(is_hit(x.chunk.text, x.chunk.source, c["gold"]) for x in p.citations)
    out: dict[str, Any] = {}
    for kind, n in tally.items():
        total = n["questions"]
        out[kind] = {k: v for k, v in sorted(n.items())} | {
            "right share": round(n["right"] / total, 3),
            "wrong share": round(n["wrong"] / total, 3),
            "right where routed": round(n["right"] / max(1, n["right"] + n["wrong"]), 3),
        }
        if "hit@10" in n:
            out[kind]["hit@10 share"] = round(n["hit@10"] / total, 3)
    if rewrite_ms:
        rewrite_ms.sort()
        out["rewrite_ms_p50"] = round(rewrite_ms[len(rewrite_ms) // 2], 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, required=True, help="the evaluation store (routed, one expert a domain)")
    ap.add_argument("--llm", help="an OpenAI-compatible server's base URL: also score the model's rewrite")
    ap.add_argument("--model", default="default", help="--llm: the model's name")
    ap.add_argument("--name", default="followups")
    args = ap.parse_args()

    from app.core.settings import Settings
    from app.runtime import Runtime
    from benchmarks.evalcorpus import load_questions
    from engine.followup import REWRITE_SECONDS, REWRITE_TOKENS
    from engine.generators import OpenAIGenerator

    rt = Runtime(Settings(data_dir=args.data_dir, question_cache=0, answer_cache=0))
    rt.start()
    try:
        domains = expert_domains(rt)
        convs = conversations(load_questions())
        ways = ["as asked", "rule"] + (["llm"] if args.llm else [])
        complete = None
        if args.llm:
            model = OpenAIGenerator(args.llm, args.model)
            complete = partial(model.complete, max_tokens=REWRITE_TOKENS, timeout=REWRITE_SECONDS)
        result: dict[str, Any] = {
            "command": "python benchmarks/followups.py " + " ".join(sys.argv[1:]),
            "store_chunks": rt.stats()["chunks"],
            "experts": {str(e): d for e, d in sorted(domains.items())},
            "conversations": len(convs),
            "model_server": {"url": args.llm, "model": args.model} if args.llm else None,
        }
        for way in ways:
            t = time.perf_counter()
            result[way] = score(rt, convs, way, domains, complete)
            result[way]["seconds"] = round(time.perf_counter() - t, 1)
            print(way, json.dumps(result[way]), flush=True)
    finally:
        rt.close()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
