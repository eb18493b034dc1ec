"""The allocators graceslab is compared with, for bench/run and
bench/apps/run: name -> library to preload (None: the C library's own
malloc), and the baseline the ratios are taken to."""

import os

LIBDIR = "/usr/lib/x86_64-linux-gnu"
PEERS = [
    ("glibc", None),
    ("jemalloc", LIBDIR + "/libjemalloc.so.2"),
    ("mimalloc", LIBDIR + "/libmimalloc.so.2"),
    ("tcmalloc", LIBDIR + "/libtcmalloc_minimal.so.4"),
]
BASELINE = "jemalloc"


def candidates(build_dir):
    """Every allocator to try: the peers, then graceslab's shared library
    in build_dir."""
    return PEERS + [("graceslab", os.path.join(os.path.abspath(build_dir), "libgraceslab.so"))]
