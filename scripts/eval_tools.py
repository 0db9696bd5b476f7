#!/usr/bin/env python3
"""Scores fwai tools search --batch runs: recall@1, recall@5, MRR@10 per kind
and overall, with p50/p95 of the daemon's took_ms; then compares the last run
with the whole-document BM25 peer run on the same queries (per kind, ratios,
the targets).
Usage: eval_tools.py QUERIES name=RUN... [--peer PEER_DIR --catalog CATALOG] [--json OUT]"""
import argparse
import json
import os
import subprocess
import sys


def pct(values, p):
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p * (len(v) - 1))))] if v else 0.0


def metrics(sel):
    n = len(sel)
    return {"n": n,
            "recall@1": sum(1 for r in sel if r[1] and r[1] <= 1) / n,
            "recall@5": sum(1 for r in sel if r[1] and r[1] <= 5) / n,
            "mrr@10": sum(1.0 / r[1] for r in sel if r[1]) / n}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("queries")
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--peer")
    ap.add_argument("--catalog")
    ap.add_argument("--json")
    a = ap.parse_args()
    queries = [json.loads(l) for l in open(a.queries) if l.strip()]
    kinds = [k for k in ("direct", "task", "paraphrase") if any(q["kind"] == k for q in queries)]
    print(f"queries {a.queries}: {len(queries)}")
    print(f"{'mode':<15}{'kind':<12}{'n':>3}   recall@1  recall@5   MRR@10 | took_ms p50    p95")
    summary, last = {}, None
    for arg in a.runs:
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
        summary[name] = {}
        for kind in kinds + ["overall"]:
            sel = rows if kind == "overall" else [r for r in rows if r[0] == kind]
            m = metrics(sel)
            took = [r[2] for r in sel]
            m["p95_ms"] = pct(took, .95)
            summary[name][kind] = m
            print(f"{name:<15}{kind:<12}{m['n']:>3}   {m['recall@1']:8.3f}  {m['recall@5']:8.3f}  {m['mrr@10']:7.3f} |"
                  f"      {pct(took, .5):6.2f} {pct(took, .95):6.2f}")
        last = name
    if a.peer and a.catalog and last:
        out = subprocess.run([sys.executable, os.path.join(a.peer, "baseline_bm25.py"), a.catalog, a.queries],
                             capture_output=True, text=True, check=True).stdout
        peer = json.loads([l for l in out.splitlines() if l.startswith("RESULT ")][-1][7:])
        print()
        print(f"{last} against the whole-document BM25 peer, same queries, same run:")
        print(f"{'kind':<12}{'n':>3} | recall@5 fwai   peer  ratio | MRR@10 fwai   peer  ratio")
        for kind in kinds + ["overall"]:
            f, p = summary[last][kind], peer[kind]
            r5 = f["recall@5"] / p["recall@5"] if p["recall@5"] else float("inf")
            mr = f["mrr@10"] / p["mrr@10"] if p["mrr@10"] else float("inf")
            print(f"{kind:<12}{f['n']:>3} |        {f['recall@5']:.3f}  {p['recall@5']:.3f}  {r5:5.2f} |"
                  f"      {f['mrr@10']:.3f}  {p['mrr@10']:.3f}  {mr:5.2f}")
        f, p = summary[last]["overall"], peer["overall"]
        r5 = f["recall@5"] / p["recall@5"] if p["recall@5"] else float("inf")
        print(f"targets: recall@5 >= 1.15x peer: {'met' if r5 >= 1.15 else 'NOT met'} ({r5:.2f}); "
              f"MRR@10 above the peer: {'met' if f['mrr@10'] > p['mrr@10'] else 'NOT met'} "
              f"({f['mrr@10']:.3f} vs {p['mrr@10']:.3f})")
        summary["peer"] = peer
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(summary, fh, indent=1)
    print("RESULT " + json.dumps({k: v.get("overall") for k, v in summary.items() if isinstance(v, dict)}))


if __name__ == "__main__":
    main()
