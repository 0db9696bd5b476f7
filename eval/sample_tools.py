#!/usr/bin/env python3
"""sample_tools.py CATALOG.jsonl [--seed N] [--exclude QUERIES.jsonl ...]

The seeded random sample of tools that eval/tools-unseen.jsonl was written
from: tools of the evaluation catalog that no excluded query set targets,
drawn per source in the development set's proportions. Prints one line per
pick, in the order drawn: source, ToolName. A question was written for each
pick in order, skipping a pick only when the catalog holds a twin the query
could not tell apart (the same description under another name), as the
catalog's own README asks; skipped picks are listed in the set's notes.
"""
import argparse
import json
import random

QUOTA = [("openocd", 27), ("gdb", 15), ("git", 9), ("mcp", 9)]
SPARE = 6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("catalog")
    ap.add_argument("--seed", type=int, default=20)
    ap.add_argument("--exclude", action="append", default=[])
    a = ap.parse_args()
    used = set()
    for path in a.exclude:
        for line in open(path, encoding="utf-8"):
            if line.strip():
                used.add(json.loads(line)["tool"])
    tools = [json.loads(l) for l in open(a.catalog, encoding="utf-8") if l.strip()]
    rng = random.Random(a.seed)
    for source, n in QUOTA:
        pool = sorted(t["ToolName"] for t in tools
                      if t["source"].split(":")[0] == source and t["ToolName"] not in used)
        for name in rng.sample(pool, n + SPARE):
            print(f"{source}\t{name}")


if __name__ == "__main__":
    main()
