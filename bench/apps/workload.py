"""Real-program benchmark, CPython: builds a large dict of small lists and
strings, round-trips 40,000 JSON documents, counts regex matches and sorts.
Run with and without PYTHONMALLOC=malloc (bench/apps/run). Deterministic:
prints counts that must match the run on glibc."""
import json
import random
import re

rng = random.Random(1)
table = {}
for i in range(300000):
    table["k%d" % rng.randrange(10**7)] = [i, str(i) * (i % 7), {"a": i}]
docs = [{"id": i, "v": [rng.random() for _ in range(i % 20)], "s": "x" * (i % 300)}
        for i in range(40000)]
text = json.dumps(docs)
back = json.loads(text)
words = re.findall(r"\w+", text[:3000000])
counts = {}
for w in words:
    counts[w] = counts.get(w, 0) + 1
ordered = sorted(table.items(), key=lambda kv: kv[1][0])
print(len(table), len(back), len(words), len(counts), ordered[0][1][0], ordered[-1][0])
