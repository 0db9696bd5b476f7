#!/usr/bin/env python3
"""Scores fwai tools search --batch runs: recall@1, recall@5, MRR@10 per kind
and overall, with p50/p95 of the daemon's took_ms.
Usage: eval_tools.py QUERIES name=RUN..."""
import json
import sys


def pct(values, p):
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p * (len(v) - 1))))] if v else 0.0


def main():
    queries = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
    kinds = sorted({q["kind"] for q in queries})
    print(f"queries {sys.argv[1]}: {len(queries)}")
    print(f"{'mode':<15}{'kind':<12}{'n':>3}   recall@1  recall@5   MRR@10 | took_ms p50    p95")
    summary = {}
    for arg in sys.argv[2:]:
        name, path = arg.split("=", 1)
        runs = {}
        for line in open(path):
            r = json.loads(line)
            runs[r["query"]] = r
        rows = []
        for q in queries:
            r = runs.get(q["query"], {"results": [], "took_ms": 0})
            names = [h["tool"]["ToolName"] for h in r.get("results", [])[:10]]
            rank = names.index(q["tool"]) + 1 if q["tool"] in names else None
            rows.append((q["kind"], rank, r.get("took_ms", 0)))
        for kind in kinds + ["overall"]:
            sel = rows if kind == "overall" else [r for r in rows if r[0] == kind]
            n = len(sel)
            r1 = sum(1 for r in sel if r[1] and r[1] <= 1) / n
            r5 = sum(1 for r in sel if r[1] and r[1] <= 5) / n
            mrr = sum(1.0 / r[1] for r in sel if r[1]) / n
            took = [r[2] for r in sel]
            print(f"{name:<15}{kind:<12}{n:>3}   {r1:8.3f}  {r5:8.3f}  {mrr:7.3f} |      {pct(took, .5):6.2f} {pct(took, .95):6.2f}")
            if kind == "overall":
                summary[name] = {"recall@1": r1, "recall@5": r5, "mrr@10": mrr, "p95_ms": pct(took, .95)}
    print("RESULT " + json.dumps(summary))


if __name__ == "__main__":
    main()
