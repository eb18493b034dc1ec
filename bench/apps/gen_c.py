"""Writes the C file the gcc case compiles (bench/apps/run): 1500 small
functions, each with a loop and a call to the previous one, so that
-O2 inlines and unrolls a long chain. Deterministic."""
import random
import sys

rng = random.Random(2)
with open(sys.argv[1], "w") as f:
    for i in range(1500):
        f.write("static int f%d(int x){int s=0; for(int i=0;i<x;i++){ s+=i*%d ^ (s>>%d); "
                "if(s%%%d==0) s+=f%d(i&7);} return s;}\n"
                % (i, rng.randrange(1, 99), rng.randrange(1, 9), rng.randrange(2, 50),
                   max(0, i - 1)))
    f.write("int main(void){return f1499(3)&1;}\n")
