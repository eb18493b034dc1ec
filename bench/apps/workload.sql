-- Real-program benchmark, sqlite3 (in memory): 300,000 rows of text of
-- 8..47 bytes, two indexes, a grouped query, an update that grows a third
-- of the rows, a self-join, deletes and VACUUM. Deterministic output.
PRAGMA journal_mode=OFF;
PRAGMA synchronous=OFF;
CREATE TABLE t(a INTEGER, b TEXT, c REAL);
WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < 300000)
INSERT INTO t SELECT i, substr(printf('%08x%08x%08x%08x%08x%08x', i * 2654435761 % 4294967296,
                                      i * 40503 % 65536, i, i * 7, i * 13, i * 31), 1, 8 + i % 40),
                     i * 0.5 FROM s;
CREATE INDEX tb ON t(b);
CREATE INDEX ta ON t(a % 1000);
SELECT count(*), sum(length(b)) FROM t;
SELECT a % 1000 AS k, count(*), max(b) FROM t GROUP BY k ORDER BY 3 LIMIT 3;
UPDATE t SET b = b || 'x' WHERE a % 3 = 0;
SELECT count(*) FROM t x JOIN t y ON x.a = y.a + 1 WHERE x.a % 10 = 0;
DELETE FROM t WHERE a % 2 = 0;
VACUUM;
SELECT count(*), sum(length(b)) FROM t;
