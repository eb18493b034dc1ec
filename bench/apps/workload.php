<?php
// Real-program benchmark, PHP (run with USE_ZEND_ALLOC=0, so that PHP's
// values come from malloc): 400,000 strings in a hash, ksort, a JSON round
// trip, a filter. Deterministic output.
$a = [];
for ($i = 0; $i < 400000; $i++) {
    $a["k" . ($i * 7919 % 1000003)] = str_repeat("x", $i % 40);
}
ksort($a);
$j = json_encode($a);
$b = json_decode($j, true);
$o = [];
foreach ($b as $k => $v) {
    if (strlen($v) > 20) {
        $o[] = strtoupper($v);
    }
}
echo count($a), " ", strlen($j), " ", count($o), "\n";
