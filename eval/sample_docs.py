#!/usr/bin/env python3
"""sample_docs.py CORPUS [--seed N] [--exclude QUERIES.jsonl ...]

The seeded random sample of documents that eval/retrieval-unseen.jsonl was
written from: documents of the evaluation corpus that no excluded query set
uses, drawn per corpus part (so every kind of document is represented), and
for the two PDF manuals a sample of pages. Prints one line per pick, in the
order drawn: part, document, page (PDFs) — a question was written for each,
in order, skipping a pick only when the text holds nothing to ask (recorded
in the set's notes).

Distractor pages (the OpenOCD indexes and licence) are never drawn.
"""
import argparse
import json
import os
import random
import subprocess

# Questions to write per part (80 in all).
QUOTA = [("dt/", 20), ("hwmon/", 11), ("kdoc/", 10), ("openocd/", 9), ("avr/", 9), ("msp430/", 9),
         ("pdf/sdccman.pdf", 6), ("pdf/gputils.pdf", 6)]
SPARE = 4  # extra picks per part, used in order when a pick has nothing to ask
DISTRACTORS = {"openocd/index.html", "openocd/Command-and-Driver-Index.html",
               "openocd/OpenOCD-Concept-Index.html", "openocd/License.html"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus")
    ap.add_argument("--seed", type=int, default=20)
    ap.add_argument("--exclude", action="append", default=[])
    a = ap.parse_args()
    used = set()
    for path in a.exclude:
        for line in open(path, encoding="utf-8"):
            if line.strip():
                used.add(json.loads(line)["doc"])
    files = []
    for root, dirs, names in os.walk(a.corpus):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for n in sorted(names):
            if not n.startswith("."):
                files.append(os.path.relpath(os.path.join(root, n), a.corpus))
    files.sort()
    rng = random.Random(a.seed)
    for prefix, n in QUOTA:
        if prefix.endswith(".pdf"):
            out = subprocess.run(["pdftotext", "-enc", "UTF-8", os.path.join(a.corpus, prefix), "-"],
                                 capture_output=True, text=True, check=True).stdout
            pages = len(out.split("\f"))
            # Skip the title page and table of contents: pages 1-6.
            for p in rng.sample(range(7, pages), n + SPARE):
                print(f"{prefix}\t{prefix}\tpage {p}")
            continue
        pool = [f for f in files if f.startswith(prefix) and f not in used and f not in DISTRACTORS]
        for f in rng.sample(pool, min(len(pool), n + SPARE)):
            print(f"{prefix}\t{f}")


if __name__ == "__main__":
    main()
