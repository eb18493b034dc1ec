"""A deterministic Python workload for run_preload.sh: json, re, sqlite3,
threads, hashing, big containers. Prints digests of everything it computes,
so that any difference under LD_PRELOAD=libgraceslab.so shows in stdout."""
import hashlib
import json
import random
import re
import sqlite3
import threading
import zlib
from collections import Counter, OrderedDict

rng = random.Random(20261203)


def digest(obj):
    return hashlib.sha256(repr(obj).encode()).hexdigest()[:16]


# json: nested documents, round trips.
docs = []
for i in range(3000):
    docs.append({
        "id": i,
        "name": "item%05d" % rng.randrange(100000),
        "tags": [rng.choice("abcdefgh") * rng.randrange(1, 20) for _ in range(rng.randrange(8))],
        "nested": {"x": rng.random(), "y": [rng.randrange(1000) for _ in range(rng.randrange(30))]},
    })
text = json.dumps(docs, sort_keys=True)
back = json.loads(text)
assert back == docs
print("json", len(text), digest(back[::97]))

# re: many patterns over a large text.
words = " ".join("w%d%s" % (rng.randrange(10000), rng.choice(["", "x", "yy", "zzz"])) for _ in range(60000))
print("re findall", len(re.findall(r"w(\d*7\d*)y+\b", words)))
print("re sub", digest(re.sub(r"w(\d+)(z+)", lambda m: m.group(2) + m.group(1)[::-1], words)[:5000]))
print("re split", len(re.split(r"\s+w\d{2}\s", words)))

# sqlite3 in memory and on disk.
db = sqlite3.connect("work.sqlite")
db.execute("CREATE TABLE kv(k TEXT PRIMARY KEY, v BLOB, n INTEGER)")
db.executemany("INSERT INTO kv VALUES (?, ?, ?)",
               (("k%06d" % i, bytes(rng.randrange(256) for _ in range(i % 200)), i * 7 % 1000)
                for i in range(20000)))
db.commit()
print("sqlite", db.execute("SELECT count(*), sum(length(v)), sum(n) FROM kv").fetchone())
print("sqlite group", db.execute(
    "SELECT n % 10, count(*), sum(length(v)) FROM kv GROUP BY n % 10 ORDER BY 1").fetchall()[:4])
db.execute("DELETE FROM kv WHERE n % 3 = 0")
db.commit()
db.execute("VACUUM")
print("sqlite after", db.execute("SELECT count(*), max(k) FROM kv").fetchone())
db.close()

# threads: each builds and hashes its own structures, results joined.
results = {}
lock = threading.Lock()


def work(tid):
    r = random.Random(tid)
    d = {}
    for i in range(20000):
        d["%d-%d" % (tid, r.randrange(5000))] = [r.random()] * (i % 7)
    h = hashlib.sha1()
    for k in sorted(d):
        h.update(k.encode())
        h.update(str(len(d[k])).encode())
    with lock:
        results[tid] = h.hexdigest()


threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("threads", digest(sorted(results.items())))

# hashing and compression of large buffers.
blob = bytes(rng.randrange(256) for _ in range(1 << 20)) * 4
for name in ("md5", "sha1", "sha256", "sha512", "blake2b", "sha3_256"):
    print(name, hashlib.new(name, blob).hexdigest()[:24])
z = zlib.compress(blob * 2, 6)
print("zlib", len(z), zlib.crc32(zlib.decompress(z)))

# containers: big lists, dicts, sets, strings.
c = Counter(rng.randrange(1000) for _ in range(300000))
print("counter", c.most_common(3))
od = OrderedDict((str(i), i * i) for i in range(100000))
for i in range(0, 100000, 3):
    od.move_to_end(str(i))
print("ordereddict", list(od.items())[:3], len(od))
s = set(range(0, 1000000, 7)) ^ set(range(0, 1000000, 11))
print("set", len(s), sum(s) % 1000003)
strs = ["".join(rng.choice("abcdef") for _ in range(rng.randrange(1, 50))) for _ in range(50000)]
strs.sort()
print("strings", digest(strs[::1000]), len("|".join(strs)))
