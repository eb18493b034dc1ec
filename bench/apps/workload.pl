# Real-program benchmark, perl: a hash of 400,000 small arrays, sorted
# keys, a regex filter, join and split. Deterministic output.
my %h;
my @a;
for my $i (1 .. 400000) { $h{"k" . ($i * 7919 % 1000003)} = [$i, "v" x ($i % 30)]; }
for my $k (sort keys %h) { push @a, $k if $k =~ /7$/; }
my $s = join(",", @a);
my @b = split /,/, $s;
print scalar(keys %h), " ", scalar(@b), "\n";
