#!/usr/bin/env python3
"""Scores fwai kb search --batch runs: hit@1, hit@5, MRR@10 at chunk level
(doc matches and the needle is in the chunk text, after NFKC + casefold +
whitespace folding) and at document level, per kind and overall, with p50/p95
of the daemon's took_ms. Usage: eval_retrieval.py QUERIES CORPUS name=RUN..."""
import json
import re
import statistics
import sys
import unicodedata


def norm(s):
    return re.sub(r"\s+", " ", unicodedata.normalize("NFKC", s).casefold()).strip()


def pct(values, p):
    v = sorted(values)
    if not v:
        return 0.0
    i = min(len(v) - 1, int(round(p * (len(v) - 1))))
    return v[i]


def score(queries, run):
    by_query = {}
    for line in open(run):
        r = json.loads(line)
        by_query[r["query"]] = r
    rows = []
    for q in queries:
        r = by_query.get(q["query"], {"results": [], "took_ms": 0})
        results = r.get("results", [])[:10]
        chunk_rank = doc_rank = None
        needle = norm(q["needle"])
        for i, h in enumerate(results):
            doc = h["doc"][2:] if h["doc"].startswith("./") else h["doc"]
            if doc == q["doc"]:
                if doc_rank is None:
                    doc_rank = i + 1
                if chunk_rank is None and needle in norm(h["text"]):
                    chunk_rank = i + 1
        rows.append((q["kind"], chunk_rank, doc_rank, r.get("took_ms", 0)))
    return rows


def metrics(rows, idx):
    n = len(rows)
    h1 = sum(1 for r in rows if r[idx] is not None and r[idx] <= 1) / n
    h5 = sum(1 for r in rows if r[idx] is not None and r[idx] <= 5) / n
    mrr = sum(1.0 / r[idx] for r in rows if r[idx] is not None) / n
    return h1, h5, mrr


def main():
    queries = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
    runs = [a.split("=", 1) for a in sys.argv[3:]]
    kinds = sorted({q["kind"] for q in queries})
    print(f"queries {sys.argv[1]}: {len(queries)}")
    print(f"{'mode':<15}{'kind':<12}{'n':>3} | chunk+needle: hit@1  hit@5  MRR@10 | doc: hit@1  hit@5  MRR@10 | took_ms p50   p95")
    summary = {}
    for name, path in runs:
        rows = score(queries, path)
        for kind in kinds + ["overall"]:
            sel = rows if kind == "overall" else [r for r in rows if r[0] == kind]
            if not sel:
                continue
            c = metrics(sel, 1)
            d = metrics(sel, 2)
            took = [r[3] for r in sel]
            print(f"{name:<15}{kind:<12}{len(sel):>3} |               {c[0]:.3f}  {c[1]:.3f}   {c[2]:.3f} |"
                  f"       {d[0]:.3f}  {d[1]:.3f}   {d[2]:.3f} |       {pct(took, .5):6.2f} {pct(took, .95):6.2f}")
            if kind == "overall":
                summary[name] = {"chunk": {"hit@1": c[0], "hit@5": c[1], "mrr@10": c[2]},
                                 "doc": {"hit@1": d[0], "hit@5": d[1], "mrr@10": d[2]},
                                 "took_ms": {"p50": pct(took, .5), "p95": pct(took, .95)}}
    print("RESULT " + json.dumps(summary))


if __name__ == "__main__":
    main()
