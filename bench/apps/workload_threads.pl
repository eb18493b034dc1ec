# Real-program benchmark, perl with ithreads: 4 threads on the 2 CPUs, each
# cloning the interpreter and building a hash of 150,000 small arrays, then
# sorting its keys; everything is freed as the threads are joined.
# Deterministic output.
use threads;
my @t = map {
    my $k = $_;
    threads->create(sub {
        my %h;
        for my $i (1 .. 150000) { $h{"k$k-" . ($i * 7919 % 1000003)} = [$i, "v" x ($i % 30)]; }
        my @s = sort keys %h;
        scalar(@s);
    })
} 1 .. 4;
my $s = 0;
$s += $_->join for @t;
print "$s\n";
