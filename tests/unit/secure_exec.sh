#!/bin/bash
# A set-user-ID program ignores every GRACESLAB_* option (alloc/options.c):
# its caller must not switch on fault injection or the statistics summary
# in a program that runs with more rights than the caller has.
#
# usage: secure_exec.sh /path/to/secure_probe
# Runs the probe with GRACESLAB_OS_FAIL_AFTER_MB=16 and GRACESLAB_STATS=1,
# first as it is (the options must take effect: the 64 MiB block fails and
# the summary is printed) and then as a set-user-ID copy owned by `nobody`
# (AT_SECURE: the block must succeed and nothing be printed on stderr).
# Exit 77 (a skip, shown as SKIP by meson) when this machine cannot make
# the copy: not root, or a file system mounted nosuid.
set -u
probe=${1:?usage: secure_exec.sh secure_probe}
fail=0

run() { # run PROGRAM OUT ERR
    GRACESLAB_OS_FAIL_AFTER_MB=16 GRACESLAB_STATS=1 "$1" >"$2" 2>"$3"
}

work=$(mktemp -d "${GS_BUILD_DIR:-.}/secure_exec.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
chmod 755 "$work"

run "$probe" "$work/plain.out" "$work/plain.err"
if ! grep -qx 'secure=0 big=Cannot allocate memory' "$work/plain.out"; then
    echo "FAIL plain run: expected the injected failure, got: $(cat "$work/plain.out")"
    fail=1
fi
if ! grep -q '^graceslab stats: ' "$work/plain.err"; then
    echo "FAIL plain run: GRACESLAB_STATS=1 printed no summary"
    fail=1
fi

[ $fail = 0 ] || exit 1
if [ "$(id -u)" != 0 ]; then
    echo "SKIP set-user-ID run: needs root to make a copy owned by nobody"
    exit 77
fi
cp "$probe" "$work/probe"
chown nobody "$work/probe" && chmod 4755 "$work/probe" || exit 1
run "$work/probe" "$work/suid.out" "$work/suid.err"
if grep -qx 'secure=0 .*' "$work/suid.out"; then
    echo "SKIP set-user-ID run: the kernel did not mark the copy AT_SECURE (nosuid mount?)"
    exit 77
fi
if ! grep -qx 'secure=1 big=ok' "$work/suid.out"; then
    echo "FAIL set-user-ID run: options taken from the caller: $(cat "$work/suid.out")"
    fail=1
fi
if [ -s "$work/suid.err" ]; then
    echo "FAIL set-user-ID run: printed on stderr: $(head -3 "$work/suid.err")"
    fail=1
fi
[ $fail = 0 ] && echo "ok: options honoured as the caller, ignored as set-user-ID"
exit $fail
