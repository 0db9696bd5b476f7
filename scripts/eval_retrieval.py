#!/usr/bin/env python3
"""Scores fwai kb search --batch runs: hit@1, hit@5, MRR@10 at chunk level
(doc matches and the needle is in the returned text, after NFKC + casefold +
whitespace folding) and at document level, per kind and overall, with p50/p95
of the daemon's took_ms and the size of the returned texts; then compares the
last run with the SQLite FTS5 peer run on the same queries (per kind, with the
ratio and the targets).

Usage: eval_retrieval.py QUERIES CORPUS name=RUN... [--peer PEER_DIR] [--json OUT]
"""
import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import unicodedata

KINDS = ["identifier", "paraphrase", "howto"]


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
        words = [len(h["text"].split()) for h in results]
        rows.append({"id": q["id"], "kind": q["kind"], "chunk": chunk_rank, "doc": doc_rank,
                     "took": r.get("took_ms", 0), "words": words})
    return rows


def metrics(rows, key):
    n = len(rows)
    ranks = [r[key] for r in rows]
    return {"hit@1": sum(1 for x in ranks if x is not None and x <= 1) / n,
            "hit@5": sum(1 for x in ranks if x is not None and x <= 5) / n,
            "mrr@10": sum(1.0 / x for x in ranks if x is not None) / n}


def mrr(rows):
    return sum(1.0 / r["chunk"] for r in rows if r["chunk"]) / len(rows) if rows else 0.0


def run_peer(peer_dir, queries_path, corpus):
    dump = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"peer-{os.getpid()}.jsonl")
    out = subprocess.run([sys.executable, os.path.join(peer_dir, "baseline_fts5.py"), corpus, queries_path,
                          "--dump", dump], capture_output=True, text=True, check=True).stdout
    result = json.loads([l for l in out.splitlines() if l.startswith("RESULT ")][-1][7:])
    ranks = {}
    for line in open(dump):
        d = json.loads(line)
        ranks[d["id"]] = (d["rank_chunk"], d["rank_doc"])
    os.unlink(dump)
    return result, ranks


def bootstrap_ratio(rows, peer_ranks, seed=1, n=2000):
    """95% interval of fwai's MRR@10 over the peer's, resampling queries."""
    pairs = [((1.0 / r["chunk"]) if r["chunk"] else 0.0,
              (1.0 / peer_ranks[r["id"]][0]) if peer_ranks[r["id"]][0] else 0.0) for r in rows]
    rng = random.Random(seed)
    ratios = []
    for _ in range(n):
        sample = [pairs[rng.randrange(len(pairs))] for _ in pairs]
        a, b = sum(x for x, _ in sample), sum(y for _, y in sample)
        if b > 0:
            ratios.append(a / b)
    ratios.sort()
    return ratios[int(0.025 * len(ratios))], ratios[int(0.975 * len(ratios)) - 1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("queries")
    ap.add_argument("corpus")
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--peer", help="folder with baseline_fts5.py")
    ap.add_argument("--json", help="write every figure here")
    a = ap.parse_args()
    queries = [json.loads(l) for l in open(a.queries) if l.strip()]
    runs = [x.split("=", 1) for x in a.runs]
    kinds = [k for k in KINDS if any(q["kind"] == k for q in queries)]
    print(f"queries {a.queries}: {len(queries)}")
    print(f"{'mode':<15}{'kind':<12}{'n':>3} | chunk+needle: hit@1  hit@5  MRR@10 | doc: hit@1  hit@5  MRR@10"
          f" | took_ms p50   p95 | words/result")
    report = {"queries": os.path.basename(a.queries), "n": len(queries), "modes": {}}
    last_rows = None
    for name, path in runs:
        rows = score(queries, path)
        last_rows = rows
        report["modes"][name] = {}
        for kind in kinds + ["overall"]:
            sel = rows if kind == "overall" else [r for r in rows if r["kind"] == kind]
            if not sel:
                continue
            c, d = metrics(sel, "chunk"), metrics(sel, "doc")
            took = [r["took"] for r in sel]
            words = [w for r in sel for w in r["words"]]
            print(f"{name:<15}{kind:<12}{len(sel):>3} |               {c['hit@1']:.3f}  {c['hit@5']:.3f}   "
                  f"{c['mrr@10']:.3f} |       {d['hit@1']:.3f}  {d['hit@5']:.3f}   {d['mrr@10']:.3f} |"
                  f"       {pct(took, .5):6.2f} {pct(took, .95):6.2f} | {statistics.median(words) if words else 0:>5.0f}")
            report["modes"][name][kind] = {"n": len(sel), "chunk": c, "doc": d,
                                           "took_ms": {"p50": pct(took, .5), "p95": pct(took, .95)},
                                           "median_words": statistics.median(words) if words else 0}
    if a.peer and last_rows is not None:
        peer, peer_ranks = run_peer(a.peer, a.queries, a.corpus)
        name = runs[-1][0]
        print()
        print(f"{name} against the FTS5 peer (300-word windows), same queries, same run:")
        print(f"{'kind':<12}{'n':>3} | MRR@10 fwai   peer  ratio | hit@5 fwai   peer | doc MRR fwai  peer |"
              f" doc hit@5 fwai  peer")
        report["peer"] = peer
        report["versus_peer"] = {}
        for kind in kinds + ["overall"]:
            sel = last_rows if kind == "overall" else [r for r in last_rows if r["kind"] == kind]
            f = report["modes"][name][kind]
            p = peer[kind]
            ratio = f["chunk"]["mrr@10"] / p["chunk"]["mrr@10"] if p["chunk"]["mrr@10"] > 0 else float("inf")
            print(f"{kind:<12}{len(sel):>3} |      {f['chunk']['mrr@10']:.3f}  {p['chunk']['mrr@10']:.3f}  "
                  f"{ratio:5.2f} |      {f['chunk']['hit@5']:.3f}  {p['chunk']['hit@5']:.3f} |"
                  f"       {f['doc']['mrr@10']:.3f} {p['doc']['mrr@10']:.3f} |"
                  f"           {f['doc']['hit@5']:.3f} {p['doc']['hit@5']:.3f}")
            report["versus_peer"][kind] = {"ratio": ratio}
        lo, hi = bootstrap_ratio(last_rows, peer_ranks)
        overall = report["versus_peer"]["overall"]["ratio"]
        print(f"MRR@10 ratio overall {overall:.2f} (95% bootstrap interval over queries {lo:.2f}-{hi:.2f})")
        report["versus_peer"]["overall"]["interval95"] = [lo, hi]
        below = [k for k in kinds if report["versus_peer"][k]["ratio"] < 1.0]
        doc_hit5 = report["modes"][name]["overall"]["doc"]["hit@5"]
        print(f"targets: MRR@10 >= 1.15x peer: {'met' if overall >= 1.15 else 'NOT met'} ({overall:.2f}); "
              f"no kind below the peer: {'met' if not below else 'NOT met (' + ', '.join(below) + ')'}; "
              f"doc hit@5 >= 0.90: {'met' if doc_hit5 >= 0.90 else 'NOT met'} ({doc_hit5:.3f})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    print("RESULT " + json.dumps({k: v.get("overall") for k, v in report["modes"].items()}))


if __name__ == "__main__":
    main()
