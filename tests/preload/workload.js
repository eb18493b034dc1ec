// A deterministic node workload for run_preload.sh: buffers and typed arrays
// (their backing stores come from malloc/calloc), zlib, brotli, crypto
// hashes, JSON, big Maps and Sets, strings and regular expressions, worker
// threads that transfer buffers between threads (cross-thread frees), file
// I/O, and explicit garbage collection so that freed backing stores go back
// to the allocator. Prints digests of everything it computes, so that any
// difference under LD_PRELOAD=libgraceslab.so shows in stdout.
'use strict';
const crypto = require('crypto');
const fs = require('fs');
const os = require('os');
const path = require('path');
const zlib = require('zlib');
const { Worker, isMainThread, parentPort, workerData } = require('worker_threads');

// xorshift32: the same sequence on every run.
function rng(seed) {
  let x = seed >>> 0 || 1;
  return () => {
    x ^= x << 13; x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5; x >>>= 0;
    return x;
  };
}

const sha = (data) => crypto.createHash('sha256').update(data).digest('hex').slice(0, 16);

// Buffers of many sizes (small ones from node's pool, large ones malloc'd),
// filled with a pattern, compressed and checked after a round trip.
function workerJob(seed, rounds) {
  const r = rng(seed);
  const h = crypto.createHash('sha256');
  let total = 0;
  for (let i = 0; i < rounds; i++) {
    const n = 1 + (r() % (i % 5 === 0 ? 1 << 20 : 1 << 14));
    const b = Buffer.allocUnsafe(n);
    for (let k = 0; k < n; k += 4096) b.fill((r() & 0xff), k, Math.min(n, k + 4096));
    const z = i % 2 ? zlib.deflateSync(b, { level: 1 }) : zlib.gzipSync(b);
    const back = i % 2 ? zlib.inflateSync(z) : zlib.gunzipSync(z);
    if (!back.equals(b)) throw new Error(`zlib round trip differs at round ${i}`);
    h.update(back);
    total += n;
  }
  return { total, digest: h.digest('hex').slice(0, 16) };
}

if (!isMainThread) {
  const res = workerJob(workerData.seed, workerData.rounds);
  // Hand a big buffer to the main thread: it is freed there.
  const ab = new ArrayBuffer(3 << 20);
  new Uint8Array(ab).fill(workerData.seed & 0xff);
  parentPort.postMessage({ res, ab }, [ab]);
  return;
}

async function main() {
  const r = rng(20261203);
  const out = [];

  // 1. Buffers, zlib, brotli in the main thread.
  const main1 = workerJob(1234, 120);
  out.push(`buffers: ${main1.total} bytes ${main1.digest}`);
  const text = Buffer.from(Array.from({ length: 20000 }, (_, i) => `line ${i} ${i * 7919 % 10007}\n`).join(''));
  const br = zlib.brotliCompressSync(text, { params: { [zlib.constants.BROTLI_PARAM_QUALITY]: 5 } });
  out.push(`brotli: ${text.length} -> ok ${zlib.brotliDecompressSync(br).equals(text)} ${sha(zlib.brotliDecompressSync(br))}`);

  // 2. Typed arrays: sort, grow by copying, reduce.
  let ta = new Float64Array(0);
  for (let i = 0; i < 40; i++) {
    const grown = new Float64Array(ta.length + 25000);
    grown.set(ta);
    for (let k = ta.length; k < grown.length; k++) grown[k] = (r() % 1000003) / 7;
    ta = grown;
  }
  ta.sort();
  out.push(`typed: n ${ta.length} min ${ta[0].toFixed(4)} max ${ta[ta.length - 1].toFixed(4)} sum ${ta.reduce((a, b) => a + b, 0).toFixed(2)}`);

  // 3. JSON documents, Maps and Sets.
  const docs = [];
  for (let i = 0; i < 20000; i++)
    docs.push({ id: i, name: `item${r() % 100000}`, tags: Array.from({ length: r() % 6 }, () => 'abcdefgh'[r() % 8].repeat(1 + r() % 12)), v: r() % 1000 });
  const json = JSON.stringify(docs);
  const back = JSON.parse(json);
  out.push(`json: ${json.length} chars ${sha(json)} equal ${JSON.stringify(back) === json}`);
  const m = new Map();
  const s = new Set();
  for (const d of back) {
    m.set(d.name, (m.get(d.name) || 0) + d.v);
    for (const t of d.tags) s.add(t);
  }
  for (let i = 0; i < 200000; i++) m.set(`k${r() % 50000}`, i);
  for (const k of [...m.keys()].filter((k, i) => i % 3 === 0)) m.delete(k);
  out.push(`map: ${m.size} keys set: ${s.size} ${sha([...m.entries()].sort().join(';'))}`);

  // 4. Strings and regular expressions.
  let str = '';
  for (let i = 0; i < 50000; i++) str += `w${r() % 9973} `;
  const matches = str.match(/w(\d*7\d*)\b/g) || [];
  out.push(`regex: ${matches.length} matches ${sha(str.replace(/w(\d+)/g, '<$1>'))}`);
  out.push(`encode: ${sha(new TextEncoder().encode(str.toUpperCase()))}`);

  // 5. Crypto: hashes, HMAC, a cipher round trip, pbkdf2.
  const key = crypto.createHash('sha256').update('graceslab').digest();
  const iv = Buffer.alloc(16, 7);
  const c = crypto.createCipheriv('aes-256-cbc', key, iv);
  const enc = Buffer.concat([c.update(text), c.final()]);
  const d = crypto.createDecipheriv('aes-256-cbc', key, iv);
  const dec = Buffer.concat([d.update(enc), d.final()]);
  out.push(`crypto: ${sha(enc)} ok ${dec.equals(text)} hmac ${crypto.createHmac('sha512', key).update(json).digest('hex').slice(0, 16)} pbkdf2 ${crypto.pbkdf2Sync('pw', 'salt', 2000, 32, 'sha256').toString('hex').slice(0, 16)}`);

  // 6. Files: write, read back, stream through gzip.
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'gs_node.'));
  const f = path.join(dir, 'data.bin');
  fs.writeFileSync(f, Buffer.concat([text, enc]));
  const rd = fs.readFileSync(f);
  await new Promise((res, rej) => fs.createReadStream(f).pipe(zlib.createGzip()).pipe(fs.createWriteStream(f + '.gz')).on('finish', res).on('error', rej));
  out.push(`files: ${rd.length} ${sha(rd)} gz-ok ${zlib.gunzipSync(fs.readFileSync(f + '.gz')).equals(rd)}`);
  fs.rmSync(dir, { recursive: true });

  // 7. Worker threads: each compresses on its own thread and transfers a
  // 3 MiB buffer to this one, which frees it.
  const results = await Promise.all([11, 22, 33, 44].map((seed) => new Promise((res, rej) => {
    const w = new Worker(__filename, { workerData: { seed, rounds: 60 } });
    w.on('message', (msg) => res({ seed, msg }));
    w.on('error', rej);
  })));
  for (const { seed, msg } of results)
    out.push(`worker ${seed}: ${msg.res.total} bytes ${msg.res.digest} ab ${msg.ab.byteLength} ${new Uint8Array(msg.ab)[12345]}`);

  // 8. Garbage: drop everything, collect, allocate again.
  docs.length = 0;
  m.clear();
  if (global.gc) for (let i = 0; i < 3; i++) global.gc();
  const again = workerJob(99, 40);
  out.push(`after gc: ${again.total} bytes ${again.digest}`);
  console.log(out.join('\n'));
}

main().catch((e) => { console.error(e); process.exit(1); });
