#!/bin/bash
# A manual sweep of real programs under LD_PRELOAD (not part of `meson
# test`: it needs many programs CI does not install). Each case runs twice
# in a fresh directory, with the system allocator and preloaded; stdout
# plus the exit status must be identical and graceslab must print nothing.
# A case whose first program is not installed is reported as "missing",
# never as passed. docs/reliability.md, section 1, records the last sweep.
#
# usage: tests/preload/sweep.sh /path/to/libgraceslab.so
set -u
LIB=$(readlink -f "${1:?usage: sweep.sh libgraceslab.so}")
SRC=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/gs_sweep.XXXXXX")
trap 'rm -rf "$work"' EXIT
pass=0 fail=0 missing=0

# run NAME PROGRAM COMMAND: PROGRAM must be installed; COMMAND is bash.
run() {
  local name=$1 prog=$2 cmd=$3 mode
  if ! command -v "$prog" >/dev/null; then
    missing=$((missing + 1)); echo "missing $name ($prog not installed)"; return
  fi
  for mode in ref gs; do
    rm -rf "$work/$mode"; mkdir -p "$work/$mode"
    if [ $mode = ref ]; then
      (cd "$work/$mode" && timeout 300 bash -c "$cmd" >out 2>err; echo "rc=$?" >>out)
    else
      (cd "$work/$mode" && LD_PRELOAD=$LIB timeout 300 bash -c "$cmd" >out 2>err; echo "rc=$?" >>out)
    fi
  done
  if cmp -s "$work/ref/out" "$work/gs/out" && ! grep -q graceslab "$work/gs/err"; then
    pass=$((pass + 1)); echo "ok   $name"
  else
    fail=$((fail + 1)); echo "FAIL $name"
    diff "$work/ref/out" "$work/gs/out" | head -5; grep -m3 graceslab "$work/gs/err"
  fi
}
run clang clang "clang -O2 -I$SRC -I$SRC/include -c $SRC/alloc/heap.c -o h.o && nm h.o | sort | md5sum"
run clangxx clang++ "printf '#include <map>\n#include <string>\n#include <iostream>\nint main(){std::map<std::string,int> m; for(int i=0;i<100000;i++) m[std::to_string(i*7919%%100003)]=i; long s=0; for(auto&k:m) s+=k.second*(long)k.first.size(); std::cout<<s<<std::endl;}' > t.cc && clang++ -O2 t.cc -o t && ./t"
run gxx g++ "printf '#include <vector>\n#include <thread>\n#include <memory>\n#include <iostream>\n#include <atomic>\nint main(){std::atomic<long> s{0}; std::vector<std::thread> ts; for(int t=0;t<8;t++) ts.emplace_back([&,t]{ for(int i=0;i<200000;i++){ auto v=std::make_unique<std::vector<int>>(i%%100+1,t); s+=v->size(); } }); for(auto&x:ts) x.join(); std::cout<<s<<std::endl;}' > t.cc && g++ -O2 -pthread t.cc -o t && ./t"
run cmake cmake "mkdir p && cd p && printf 'cmake_minimum_required(VERSION 3.10)\nproject(x C)\nadd_executable(x x.c)\n' > CMakeLists.txt && echo 'int main(void){return 0;}' > x.c && cmake -S . -B b >/dev/null && cmake --build b >/dev/null && ls b/x"
run meson meson "cp -r $SRC/alloc $SRC/include $SRC/meson.build $SRC/meson_options.txt . 2>/dev/null; cp -r $SRC/rcu $SRC/bench $SRC/tests $SRC/docs . ; meson setup bb >/dev/null && ninja -C bb >/dev/null && ls bb/libgraceslab.so"
run make make "printf 'all: a b c\na:\n\t@echo a\nb:\n\t@echo b\nc: a b\n\t@echo c\n' > Makefile && make -j4 -s | sort"
run tar_xz xz "tar cf - -C $SRC alloc rcu | xz -T2 -9 | xz -d | tar tf - | sort"
run zstd zstd "seq 1 3000000 > s && zstd -q -T2 -19 s -o s.zst && zstd -q -d s.zst -o s2 && md5sum s2"
run gzip_bzip2 bzip2 "seq 1 2000000 | gzip -9 | gunzip | bzip2 | bunzip2 | md5sum"
run sort sort "seq 1 2000000 | shuf --random-source=<(yes) | sort -n --parallel=4 -S 50M | md5sum"
run awk awk "seq 1 500000 | awk '{a[\$1%1000]+=\$1} END{for(k in a) s+=a[k]*k; print s}'"
run sed_find sed "find $SRC -type f -name '*.c' | sort | xargs sed -n 's/static//p' | md5sum"
run openssl openssl "openssl speed -seconds 1 -multi 2 sha256 2>/dev/null | grep -c sha256; openssl genrsa 2048 2>/dev/null | openssl rsa -check -noout 2>&1 | head -1"
run sshkeygen ssh-keygen "ssh-keygen -q -t ed25519 -N '' -f k && ssh-keygen -l -f k | awk '{print \$1}'"
run gdb gdb "echo 'int main(void){int x=41; return x+1;}' > m.c && gcc -g m.c -o m && gdb -batch -ex 'break main' -ex run -ex next -ex 'print x' ./m 2>/dev/null | grep '^\\$'"
run vim vim "seq 1 1000 > f && vim -es -c '%s/1/one/g' -c 'wq' f && md5sum f"
run ruby ruby "ruby -e 'h={}; 300000.times{|i| h[i.to_s]=[i]*3}; t=(1..4).map{|k| Thread.new{ (1..50000).map{|i| (i*k).to_s}.join.size}}; p h.size, t.map(&:value).sum'"
run lua lua5.4 "lua5.4 -e 't={} for i=1,1000000 do t[i]=tostring(i) end local s=0 for i=1,#t do s=s+#t[i] end print(s)'"
run tcl tclsh "echo 'set s 0; for {set i 0} {\$i < 300000} {incr i} {lappend l \$i; incr s [string length \$i]}; puts \$s' | tclsh"
run php php "php -r '\$a=[]; for(\$i=0;\$i<500000;\$i++) \$a[\"k\$i\"]=str_repeat(\"x\",\$i%50); echo count(\$a), strlen(implode(\$a)), PHP_EOL;'"
run rustc rustc "echo 'use std::collections::HashMap; fn main(){ let mut m=HashMap::new(); for i in 0..200000u64 { m.insert(i, format!(\"{}\", i*3)); } let s: usize = m.values().map(|v| v.len()).sum(); println!(\"{}\", s); }' > r.rs && rustc -O r.rs -o r 2>/dev/null && ./r"
run java java "printf 'import java.util.*;\npublic class J { public static void main(String[] a) throws Exception { List<Thread> ts=new ArrayList<>(); for(int t=0;t<4;t++){ Thread th=new Thread(()->{ StringBuilder sb=new StringBuilder(); for(int i=0;i<100000;i++) sb.append(i); }); th.start(); ts.add(th);} for(Thread t:ts) t.join(); System.out.println(\"done\"); } }' > J.java && java J.java"
run node node "node -e 'const m=new Map(); for(let i=0;i<500000;i++) m.set(String(i), {i}); let s=0; for (const [k,v] of m) s+=k.length+v.i; console.log(s)'"
run python_threads python3 "python3 -c '
import threading, hashlib, json
out=[]
def w(k):
    d={str(i):[i]*5 for i in range(50000)}
    out.append(hashlib.sha256(json.dumps(d).encode()).hexdigest())
ts=[threading.Thread(target=w,args=(k,)) for k in range(8)]
[t.start() for t in ts]; [t.join() for t in ts]
print(sorted(out)[0])'"
run bc bc "echo '2^20000 % 1000007; scale=2000; 4*a(1)' | bc -l | md5sum"
run jq jq "seq 1 100000 | jq -s 'map(.*2) | add'"
run gpg gpg "export GNUPGHOME=\$PWD/g; mkdir -m700 g; echo hello > m; gpg -q --batch --passphrase x --symmetric -o m.gpg m && gpg -q --batch --passphrase x -d m.gpg 2>/dev/null"
run file_diff file "file -b $SRC/alloc/heap.c; seq 1 100000 > x; seq 2 100001 > y; diff x y | md5sum"
run perl_threads perl "perl -Mthreads -e 'my @t=map { threads->create(sub { my %h; \$h{\$_}=\$_ x 3 for 1..50000; scalar keys %h }) } 1..4; my \$s=0; \$s+=\$_->join for @t; print \"\$s\n\"'"
# PNG carries date:create/modify (the wall-clock second): hash raw pixels.
# -seed before plasma: makes the fractal the same every run.
run convert convert "convert -size 400x300 gradient:blue-red -blur 0x3 -rotate 33 -resize 150% ppm:- | md5sum; convert -seed 1 -size 200x200 plasma:fractal txt:- | md5sum"
run gs gs "printf '%%!PS\n/Times-Roman findfont 20 scalefont setfont 72 700 moveto (graceslab) show showpage\n' > t.ps && gs -q -dBATCH -dNOPAUSE -sDEVICE=txtwrite -sOutputFile=- t.ps"
run gnuplot gnuplot "gnuplot -e 'set term dumb 80 25; plot sin(x)*x'"
run xmllint xmllint "python3 -c \"print('<r>' + ''.join('<i n=\\\"%d\\\">%d</i>' % (i, i*i) for i in range(50000)) + '</r>')\" > x.xml && xmllint --format x.xml | md5sum && xmllint --xpath 'count(//i)' x.xml"
# As root, initdb needs another user: creates a system user gstest.
run postgres psql "export PGDATA=\$PWD/pg; U=\$(id -un); if [ \$(id -u) = 0 ]; then useradd -M gstest 2>/dev/null; mkdir pg; chown gstest pg; R='runuser -u gstest --'; chmod 777 .; else R=''; fi; PGB=\$(ls -d /usr/lib/postgresql/*/bin | head -1); \$R \$PGB/initdb -A trust -U pg >/dev/null 2>&1 && \$R \$PGB/pg_ctl -w -o '-k /tmp -p 55432 -c listen_addresses=' -l log start >/dev/null && psql -h /tmp -p 55432 -U pg -d postgres -qAt -c 'create table t as select g, md5(g::text) m from generate_series(1,200000) g; create index on t(m); select count(*), sum(length(m)) from t; select m from t order by m limit 3;' ; \$R \$PGB/pg_ctl -w stop >/dev/null"
run tmux tmux "tmux -L gs\$\$ new-session -d 'sleep 2' && tmux -L gs\$\$ list-sessions -F '#{session_windows}' && tmux -L gs\$\$ kill-server"
run cargo cargo "cargo new -q --vcs none hello && cd hello && cargo build -q --offline 2>/dev/null && ./target/debug/hello"
run curl curl "curl -s file:///etc/os-release | md5sum"
run dash_mawk mawk "dash -c 'i=0; while [ \$i -lt 2000 ]; do i=\$((i+1)); done; echo \$i' && seq 1 300000 | mawk '{s+=\$1; a[\$1%97]++} END{print s, length(a)}'"
echo "pass=$pass fail=$fail missing=$missing"
[ $fail = 0 ]
