#!/bin/bash
# Real programs with and without LD_PRELOAD=libgraceslab.so: python (a
# selection of its regression tests and a workload script), sqlite3, git,
# gcc, perl, redis (a server on a free loopback port, driven by a
# deterministic redis-cli session and by redis-benchmark), node (a
# workload script with worker threads) and php (a workload script; PHP
# opens its extensions with dlopen(RTLD_DEEPBIND), see alloc/dlopen.c) on
# deterministic inputs. For each, stdout and the exit status
# must be identical under both allocators. A probe first checks that each
# program really runs on graceslab when preloaded (GRACESLAB_STATS=1 makes
# it print its summary at exit; not set for the comparisons themselves,
# because some programs check their children's stderr).
#
# usage: run_preload.sh /path/to/libgraceslab.so [check...]
#   checks: python_regrtest python_script sqlite3 git gcc perl redis node php
#   (default: all)
# Needs: python3 (libpython3.11-testsuite for the regression tests), sqlite3,
# git, gcc, perl, redis-server and redis-tools, nodejs, php-cli.
set -u

so=$(readlink -f "${1:?usage: run_preload.sh libgraceslab.so [check...]}")
shift
[ -f "$so" ] || { echo "no such library: $so" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/gs_preload.XXXXXX")
trap 'rm -rf "$work"' EXIT
py=/usr/bin/python3
failed=0

# Deterministic environment for every program.
export LC_ALL=C TZ=UTC PYTHONHASHSEED=0 PYTHONMALLOC=malloc PYTHONDONTWRITEBYTECODE=1
export HOME="$work/home" GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null
export GIT_AUTHOR_NAME=graceslab GIT_AUTHOR_EMAIL=gs@example.invalid
export GIT_COMMITTER_NAME=graceslab GIT_COMMITTER_EMAIL=gs@example.invalid
mkdir -p "$HOME"

# compare NAME FUNC: runs FUNC (with its working directory set to a fresh
# directory) once with the system allocator and once preloaded; FUNC's
# stdout and exit status must match. The two runs go side by side (they
# share nothing but the machine: their own directories, and redis picks a
# free port each), which halves the test's time on two cores.
compare() {
    local name=$1 fn=$2 mode
    local -A pid
    for mode in ref gs; do
        local dir="$work/$name.$mode"
        mkdir -p "$dir"
        if [ $mode = ref ]; then
            (cd "$dir" && "$fn") >"$work/$name.$mode.out" 2>"$work/$name.$mode.err" &
        else
            (cd "$dir" && export LD_PRELOAD="$so" && "$fn") \
                >"$work/$name.$mode.out" 2>"$work/$name.$mode.err" &
        fi
        pid[$mode]=$!
    done
    for mode in ref gs; do
        wait "${pid[$mode]}"
        echo $? >"$work/$name.$mode.status"
    done
    local ok=1
    if ! cmp -s "$work/$name.ref.status" "$work/$name.gs.status"; then
        echo "FAIL $name: exit status $(cat "$work/$name.ref.status") without graceslab," \
             "$(cat "$work/$name.gs.status") with it"
        ok=0
    fi
    if ! cmp -s "$work/$name.ref.out" "$work/$name.gs.out"; then
        echo "FAIL $name: stdout differs"
        diff "$work/$name.ref.out" "$work/$name.gs.out" | head -20
        ok=0
    fi
    if [ ! -s "$work/$name.ref.out" ]; then
        echo "FAIL $name: no output at all (the check checks nothing)"
        ok=0
    fi
    if [ $ok = 1 ]; then
        echo "ok   $name (exit $(cat "$work/$name.ref.status"), $(wc -l <"$work/$name.ref.out") lines)"
    else
        echo "---- stderr with graceslab:"
        tail -20 "$work/$name.gs.err"
        failed=1
    fi
}

# ------------------------------------------------------------- python

python_regrtest() {
    # Summary lines only: the per-test lines carry timings and load averages.
    "$py" -m test test_json test_re test_hashlib test_collections test_decimal \
        test_zlib test_struct test_dict test_set test_unicode test_threading_local \
        test_bz2 test_email |
        grep -E '^(== )?Tests result|tests? (OK|failed|skipped)|^    test_' |
        sed -e 's/ in [0-9.]* sec//'
    return "${PIPESTATUS[0]}"
}

python_script() {
    "$py" "$here/workload.py"
}

# ------------------------------------------------------------- sqlite3

sqlite3_work() {
    sqlite3 db.sqlite <<'EOF'
PRAGMA journal_mode=DELETE;
CREATE TABLE t(id INTEGER PRIMARY KEY, k TEXT, v INTEGER, blob BLOB);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 200000)
INSERT INTO t(k, v, blob) SELECT printf('key%07d', (i * 7919) % 200003), (i * 31337) % 1000,
                                 zeroblob(i % 300) FROM n;
CREATE INDEX t_k ON t(k);
CREATE INDEX t_v ON t(v, k);
SELECT count(*), sum(v), min(k), max(k), sum(length(blob)) FROM t;
SELECT v, count(*), group_concat(substr(k, 4, 3), ',') FROM
  (SELECT v, k FROM t WHERE v < 5 ORDER BY k LIMIT 40) GROUP BY v ORDER BY v;
SELECT k FROM t WHERE k BETWEEN 'key0100000' AND 'key0100100' ORDER BY k;
UPDATE t SET v = v + 1 WHERE id % 3 = 0;
DELETE FROM t WHERE id % 5 = 0;
SELECT count(*), sum(v) FROM t;
SELECT a.v, count(*) FROM t a JOIN t b ON a.id = b.id + 1 WHERE a.v = b.v % 100
  GROUP BY a.v ORDER BY 2 DESC, 1 LIMIT 10;
VACUUM;
PRAGMA integrity_check;
EOF
}

# ------------------------------------------------------------- git

git_work() {
    export GIT_AUTHOR_DATE='2026-01-01T00:00:00Z' GIT_COMMITTER_DATE='2026-01-01T00:00:00Z'
    git init -q -b main repo && cd repo || return 1
    local i j
    for i in $(seq 1 30); do
        mkdir -p "dir$((i % 5))"
        for j in $(seq 1 20); do
            seq $((i * j)) $((i * j + 200)) | sed "s/^/line $i $j /" >"dir$((i % 5))/file$j.txt"
        done
        git add -A && git commit -q -m "commit $i" || return 1
    done
    git log --stat --format='%H %s' | head -200
    git gc -q --aggressive || return 1
    git fsck --full --strict || return 1
    git count-objects -v | grep -E '^(count|in-pack|packs)'
    git rev-parse HEAD HEAD~10 'HEAD^{tree}'
    git diff --stat HEAD~20 HEAD | tail -3
    git log --format=%h -S'line 17 3' | head
    git archive HEAD | sha256sum
}

# ------------------------------------------------------------- gcc

gcc_work() {
    cat >prog.c <<'EOF'
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
struct node { struct node *l, *r; long key; char name[24]; };
static struct node *insert(struct node *t, long k)
{
    if (!t) {
        t = calloc(1, sizeof *t);
        t->key = k;
        snprintf(t->name, sizeof t->name, "n%ld", k);
        return t;
    }
    if (k < t->key) t->l = insert(t->l, k); else t->r = insert(t->r, k);
    return t;
}
static long walk(struct node *t, long depth)
{
    if (!t) return 0;
    long s = walk(t->l, depth + 1) + walk(t->r, depth + 1) + t->key * depth + (long)strlen(t->name);
    free(t);
    return s;
}
int main(void)
{
    struct node *t = NULL;
    unsigned long x = 88172645463325252ul;
    for (int i = 0; i < 100000; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        t = insert(t, (long)(x % 1000000));
    }
    printf("%ld\n", walk(t, 1));
    return 0;
}
EOF
    gcc -O2 -Wall -S -o - prog.c || return 1
    gcc -O2 -Wall -o prog prog.c || return 1
    ./prog
}

# ------------------------------------------------------------- perl

perl_work() {
    perl -e '
        use strict; use warnings;
        my (%h, @a);
        my $x = 12345;
        for my $i (1 .. 200000) {
            $x = ($x * 1103515245 + 12345) % 2147483648;
            my $k = sprintf("k%06d", $x % 50000);
            $h{$k} .= chr(65 + $i % 26);
            push @a, $x if $i % 7 == 0;
        }
        my @keys = sort { length($h{$b}) <=> length($h{$a}) or $a cmp $b } keys %h;
        print scalar(@keys), " keys\n";
        print "$_ => ", substr($h{$_}, 0, 30), "\n" for @keys[0 .. 9];
        my @s = sort { $a <=> $b } @a;
        print "min $s[0] max $s[-1] n ", scalar(@s), "\n";
        my $text = join " ", map { "word$_" } @s;
        my $n = () = $text =~ /word(\d*7\d*)\b/g;
        print "matches $n\n";
        (my $t2 = $text) =~ s/word(\d+)/<$1>/g;
        print length($t2), "\n";
        my %count; $count{$_ % 97}++ for @s;
        print join(",", map { "$_:$count{$_}" } sort { $a <=> $b } keys %count), "\n";
    '
}

# ------------------------------------------------------------- redis

# A TCP port nobody listens on (the kernel picks it; the tiny window before
# redis-server binds it is harmless on a test machine).
free_port() {
    "$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# The server, the client and the benchmark all run with the caller's
# LD_PRELOAD. redis-server links libjemalloc dynamically; preloaded, its
# malloc/free/realloc/calloc/malloc_usable_size resolve to graceslab (the
# probe below checks it), only mallctl statistics stay jemalloc's.
redis_work() {
    local port pid i status round attempt
    # The run beside this one (compare) starts a server too: should the
    # kernel hand both the same free port, one server cannot bind it. So the
    # server that answers must be this one (its process id), else another
    # port is tried.
    for attempt in 1 2 3 4 5; do
        port=$(free_port) || return 1
        redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
            --dir "$PWD" --dbfilename dump.rdb --logfile "$PWD/redis.log" \
            --enable-debug-command local --lazyfree-lazy-user-del yes >/dev/null &
        pid=$!
        for i in $(seq 1 100); do
            [ "$(redis-cli -p "$port" info server 2>/dev/null | tr -d '\r' |
                 sed -n 's/^process_id://p')" = "$pid" ] && break 2
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
        echo "redis-server did not start on port $port (attempt $attempt)" >&2
    done
    redis_session "$port"
    # redis-benchmark: the test names it completed (its figures are
    # timings); two rounds, small values in a few keys, then 4000-byte
    # values in 20000 random keys; 2 client threads. A crashed server shows
    # as missing names and in the server's exit status below. With
    # 4000-byte values each LRANGE reply is 400 KB: 2000 of them grow and
    # free the same reply buffers as more would (20000 took 43 s, nearly
    # all of it copying 8 GB through the loopback).
    local all=set,get,incr,lpush,rpush,lpop,rpop,sadd,hset,spop,zadd,zpopmin,lrange_100,mset
    for round in "-d 16 -n 20000 -t $all" "-d 4000 -r 20000 -n 20000 -t ${all/lrange_100,/}" \
                 "-d 4000 -r 20000 -n 2000 -t lrange_100"; do
        # shellcheck disable=SC2086
        redis-benchmark -p "$port" -q --csv -c 16 -P 8 --threads 2 $round |
            cut -d, -f1 | tr -d '"'
    done
    # Every request was processed: calls per command (the session's and
    # the benchmark's) and no failed or rejected call.
    redis-cli -p "$port" info commandstats | tr -d '\r' |
        grep -E '^cmdstat_(set|get|incr|lpush|rpop|sadd|hset|zadd|zpopmin|lrange|mset):' |
        sed -e 's/,usec=[^,]*,usec_per_call=[^,]*//' | sort
    printf 'flushall async\nping\n' | redis-cli -p "$port"
    redis-cli -p "$port" shutdown nosave >/dev/null 2>&1
    for i in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -0 "$pid" 2>/dev/null && { kill -9 "$pid"; echo "redis-server did not stop"; }
    wait "$pid"
    status=$?
    echo "redis-server exit status $status"
    [ $status = 0 ] || tail -30 redis.log >&2
    return $status
}

# A deterministic session: every data type, encodings that convert as they
# grow (listpack -> hashtable/skiplist/quicklist), string appends (realloc),
# Lua, SORT, a BGSAVE (fork) and DEBUG RELOAD (save and load the RDB), lazy
# frees on the server's background thread (UNLINK, FLUSHALL ASYNC), and
# DEBUG DIGEST (a hash of the whole data set) after each phase.
redis_session() {
    redis-cli -p "$1" <<'EOF'
flushall
eval "for i = 1, 50000 do redis.call('set', 'k:' .. i, string.rep('v', i % 300)) end return 1" 0
dbsize
get k:299
strlen k:12345
eval "for i = 1, 3000 do redis.call('rpush', 'list', i) redis.call('hset', 'hash', 'f' .. i, i * 3) redis.call('zadd', 'zset', (i * 7919) % 3001, 'm' .. i) redis.call('sadd', 'set', (i * 31) % 1000) end return 1" 0
object encoding list
object encoding hash
object encoding zset
object encoding set
llen list
lrange list 100 110
hget hash f2999
zrange zset 0 9 withscores
zrangebyscore zset 1000 1010
scard set
sort set limit 0 10
sadd odd 1 3 5 1001 1003
sunionstore u set odd
scard u
debug digest
eval "local s = 'x' for i = 1, 200 do s = s .. string.rep(tostring(i), 50) redis.call('append', 'grow', string.rep('y', i * 37)) end redis.call('set', 'big', s) return #s" 0
strlen grow
getrange grow 1000 1010
setrange grow 1000000 end
strlen grow
eval "for i = 1, 20000 do redis.call('hset', 'h2', i, string.rep('z', i % 100)) end return redis.call('hlen', 'h2')" 0
eval "for i = 1, 20000, 2 do redis.call('hdel', 'h2', i) end return redis.call('hlen', 'h2')" 0
eval "for i = 1, 50000, 3 do redis.call('del', 'k:' .. i) end return redis.call('dbsize')" 0
incrbyfloat fl 1.5
lpush l2 a b c d e f g
ltrim l2 1 3
lrange l2 0 -1
debug digest
bgsave
EOF
    # Wait for the fork child to finish, then reload the data set from it.
    local i
    for i in $(seq 1 100); do
        redis-cli -p "$1" info persistence | grep -q '^rdb_bgsave_in_progress:0' && break
        sleep 0.1
    done
    redis-cli -p "$1" info persistence | grep -E '^rdb_(bgsave_in_progress|last_bgsave_status)'
    redis-cli -p "$1" <<'EOF'
debug reload
debug digest
dbsize
unlink h2 big grow
dbsize
flushall async
dbsize
eval "for i = 1, 10000 do redis.call('set', 'again:' .. i, i) end return redis.call('dbsize')" 0
debug digest
EOF
}

# ------------------------------------------------------------- node

node_work() {
    node --expose-gc "$here/workload.js"
}

# ------------------------------------------------------------- php

# USE_ZEND_ALLOC=0: PHP's values come from malloc, not its own arenas
# (as PYTHONMALLOC=malloc for python).
php_work() {
    USE_ZEND_ALLOC=0 php "$here/workload.php"
}

# probe PROGRAM ARGS...: preloaded, the program must print graceslab's
# summary, i.e. its malloc is graceslab's.
probe() {
    if LD_PRELOAD="$so" GRACESLAB_STATS=1 "$@" 2>&1 >/dev/null | grep -q '^graceslab stats:'; then
        echo "ok   probe: $1 runs on graceslab"
    else
        echo "FAIL probe: $* does not run on graceslab when preloaded"
        failed=1
    fi
}

probe "$py" -c 'import json, sqlite3'
probe sqlite3 :memory: 'select 1'
probe git --version
probe gcc --version
probe perl -e 1
probe redis-server --version
probe redis-cli --version
probe node -e 'Buffer.alloc(1 << 20)'
probe php -r 'echo 1;'

checks=${*:-python_regrtest python_script sqlite3 git gcc perl redis node php}
for c in $checks; do
    case $c in
    python_regrtest)
        if "$py" -c 'import test.test_json' 2>/dev/null; then
            compare python_regrtest python_regrtest
        else
            echo "FAIL python_regrtest: the regression tests are not installed (Debian package libpython3.11-testsuite)"
            failed=1
        fi ;;
    python_script) compare python_script python_script ;;
    sqlite3) compare sqlite3 sqlite3_work ;;
    git) compare git git_work ;;
    gcc) compare gcc gcc_work ;;
    perl) compare perl perl_work ;;
    redis) compare redis redis_work ;;
    node) compare node node_work ;;
    php) compare php php_work ;;
    *) echo "unknown check $c" >&2; exit 2 ;;
    esac
done
exit $failed
