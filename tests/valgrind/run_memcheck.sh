#!/usr/bin/env bash
# graceslab's client requests under memcheck: each scenario of
# memcheck_client must give exactly the expected memcheck verdict.
# memcheck replaces malloc in user libraries unless told not to
# (--soname-synonyms=somalloc=nouserintercepts): graceslab must stay the
# allocator for its requests to matter.
set -u
exe=$1
fail=0
vg() {
  env ${VG_ENV:-} valgrind -q --soname-synonyms=somalloc=nouserintercepts --leak-check=full \
    --errors-for-leak-kinds=definite --error-exitcode=42 "$exe" "$1" 2>&1
}
expect() { # scenario, expected exit code, grep pattern ('' = no output)
  out=$(vg "$1"); rc=$?
  if [ "$rc" != "$2" ]; then
    echo "FAIL $1: exit $rc, expected $2"; echo "$out" | head -20; fail=1; return
  fi
  if [ -n "$3" ] && ! grep -q "$3" <<<"$out"; then
    echo "FAIL $1: memcheck output lacks '$3'"; echo "$out" | head -20; fail=1; return
  fi
  if [ -z "$3" ] && [ -n "$out" ]; then
    echo "FAIL $1: unexpected memcheck output"; echo "$out" | head -20; fail=1; return
  fi
  echo "ok   $1"
}
expect clean 0 ''
expect use_after_free 42 'Invalid read of size 1'
expect leak 42 '40 bytes in 1 blocks are definitely lost'
expect overflow 42 'Invalid read of size 1'
expect pending_read 0 ''
expect read_after_gp 42 'Invalid read of size 1'
expect large_after_gp 42 'Invalid read of size 1'
# Aligned blocks past the first of their class (announced to memcheck too).
expect aligned 0 ''
expect aligned_overflow 42 'Invalid read of size 1'
# Dedicated caches: a TYPESAFE_BY_RCU cache's freed objects stay readable.
expect typesafe_read 0 ''
expect cache_use_after_free 42 'Invalid read of size 1'
# A retired slab slot reused by a class with a longer link array.
VG_ENV=GRACESLAB_HEAP_EMPTY_KB=0 expect slot_reuse 0 ''
# malloc_usable_size and in-place realloc resize memcheck's block.
expect usable_size 0 ''
expect usable_size_overflow 42 'Invalid read of size 1'
expect realloc_in_place 42 'Invalid read of size 1'
expect realloc_room 42 'Invalid read of size 1'
expect calloc_cached_large 0 ''
if [ $fail -eq 0 ]; then echo "17 passed, 0 failed"; else echo "memcheck scenarios failed"; fi
exit $fail
