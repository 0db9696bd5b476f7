#!/usr/bin/env python3
"""Scores fwai tools search --batch runs: recall@1, recall@5, MRR@10 per kind
and overall, with p50/p95 of the daemon's took_ms; then compares every run
with the whole-document BM25 peer run on the same queries (per kind, ratios,
the targets).
Each run is compared with the peer per kind, with 95% paired bootstrap
intervals (resampling the queries) of the recall@5 ratio and MRR@10 difference.
Usage: eval_tools.py QUERIES name=RUN... [--peer PEER_DIR --catalog CATALOG] [--json OUT]"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile


def pct(values, p):
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p * (len(v) - 1))))] if v else 0.0


def metrics(sel):
    n = len(sel)
    return {"n": n,
            "recall@1": sum(1 for r in sel if r[1] and r[1] <= 1) / n,
            "recall@5": sum(1 for r in sel if r[1] and r[1] <= 5) / n,
            "mrr@10": sum(1.0 / r[1] for r in sel if r[1]) / n}


def bootstrap(ours, peer, reps=2000, seed=7):
    """Paired bootstrap over the queries: 95% intervals of our recall@5 / the
    peer's and of our MRR@10 - the peer's. ours, peer: ranks (None = not in 10)."""
    rng = random.Random(seed)
    n = len(ours)
    r5 = lambda ranks, idx: sum(1 for i in idx if ranks[i] and ranks[i] <= 5)
    rr = lambda ranks, idx: sum(1.0 / ranks[i] for i in idx if ranks[i])
    ratios, diffs = [], []
    for _ in range(reps):
        idx = [rng.randrange(n) for _ in range(n)]
        p5 = r5(peer, idx)
        ratios.append(r5(ours, idx) / p5 if p5 else float("inf"))
        diffs.append((rr(ours, idx) - rr(peer, idx)) / n)
    ratios.sort()
    diffs.sort()
    lo, hi = int(0.025 * reps), int(0.975 * reps) - 1
    return (ratios[lo], ratios[hi]), (diffs[lo], diffs[hi])


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
    print(f"{'mode':<19}{'kind':<12}{'n':>3}   recall@1  recall@5   MRR@10 | took_ms p50    p95")
    summary, last, ranks = {}, None, {}
    for arg in a.runs:
        name, path = arg.split("=", 1)
        runs = {}
        for line in open(path):
            r = json.loads(line)
            runs[r["query"]] = r
        rows = []
        ranks[name] = []
        for q in queries:
            r = runs.get(q["query"], {"results": [], "took_ms": 0})
            names = [h["tool"]["ToolName"] for h in r.get("results", [])[:10]]
            rank = names.index(q["tool"]) + 1 if q["tool"] in names else None
            rows.append((q["kind"], rank, r.get("took_ms", 0)))
            ranks[name].append(rank)
        summary[name] = {}
        for kind in kinds + ["overall"]:
            sel = rows if kind == "overall" else [r for r in rows if r[0] == kind]
            m = metrics(sel)
            took = [r[2] for r in sel]
            m["p95_ms"] = pct(took, .95)
            summary[name][kind] = m
            print(f"{name:<19}{kind:<12}{m['n']:>3}   {m['recall@1']:8.3f}  {m['recall@5']:8.3f}  {m['mrr@10']:7.3f} |"
                  f"      {pct(took, .5):6.2f} {pct(took, .95):6.2f}")
        last = name
    if a.peer and a.catalog and last:
        with tempfile.NamedTemporaryFile("r", suffix=".jsonl") as dump:
            out = subprocess.run([sys.executable, os.path.join(a.peer, "baseline_bm25.py"), a.catalog,
                                  a.queries, "--dump", dump.name],
                                 capture_output=True, text=True, check=True).stdout
            peer_rank = {json.loads(l)["query"]: json.loads(l)["rank"] for l in dump if l.strip()}
        peer = json.loads([l for l in out.splitlines() if l.startswith("RESULT ")][-1][7:])
        for arg in a.runs:
            name = arg.split("=", 1)[0]
            compare(name, queries, kinds, summary[name], peer, ranks[name],
                    [peer_rank.get(q["query"]) or None for q in queries])
        summary["peer"] = peer
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(summary, fh, indent=1)
    print("RESULT " + json.dumps({k: v.get("overall") for k, v in summary.items() if isinstance(v, dict)}))


def compare(name, queries, kinds, ours, peer, our_ranks, peer_ranks):
    print()
    print(f"{name} against the whole-document BM25 peer, same queries, same run "
          "(95% paired bootstrap intervals, 2,000 resamples):")
    print(f"{'kind':<12}{'n':>3} | recall@5 fwai   peer  ratio [interval]   | "
          "MRR@10 fwai   peer  difference [interval]")
    for kind in kinds + ["overall"]:
        sel = [i for i, q in enumerate(queries) if kind == "overall" or q["kind"] == kind]
        f, p = ours[kind], peer[kind]
        r5 = f["recall@5"] / p["recall@5"] if p["recall@5"] else float("inf")
        (rlo, rhi), (dlo, dhi) = bootstrap([our_ranks[i] for i in sel], [peer_ranks[i] for i in sel])
        f["ratio_r5"], f["ratio_r5_ci"] = r5, [rlo, rhi]
        f["mrr_diff"], f["mrr_diff_ci"] = f["mrr@10"] - p["mrr@10"], [dlo, dhi]
        print(f"{kind:<12}{f['n']:>3} |        {f['recall@5']:.3f}  {p['recall@5']:.3f}  {r5:5.2f} "
              f"[{rlo:.2f}, {rhi:.2f}] |      {f['mrr@10']:.3f}  {p['mrr@10']:.3f}  "
              f"{f['mrr@10'] - p['mrr@10']:+.3f} [{dlo:+.3f}, {dhi:+.3f}]")
    f, p = ours["overall"], peer["overall"]
    r5 = f["recall@5"] / p["recall@5"] if p["recall@5"] else float("inf")
    below = [k for k in kinds if ours[k]["recall@5"] < peer[k]["recall@5"]]
    print(f"targets: recall@5 >= 1.15x peer: {'met' if r5 >= 1.15 else 'NOT met'} ({r5:.2f}); "
          f"no kind below the peer: {'met' if not below else 'NOT met (' + ', '.join(below) + ')'}; "
          f"MRR@10 above the peer: {'met' if f['mrr@10'] > p['mrr@10'] else 'NOT met'} "
          f"({f['mrr@10']:.3f} vs {p['mrr@10']:.3f})")


if __name__ == "__main__":
    main()
