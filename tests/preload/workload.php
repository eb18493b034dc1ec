<?php
// A deterministic PHP workload for run_preload.sh: hashes, strings, sorting,
// JSON, regular expressions, serialisation and objects. Run with
// USE_ZEND_ALLOC=0, so that PHP's own values come from malloc; the
// extensions (pdo.so among them) are loaded with dlopen(RTLD_DEEPBIND).
mt_srand(42);
$h = [];
for ($i = 0; $i < 200000; $i++) {
    $h["key" . mt_rand(0, 50000)] = str_repeat(chr(65 + $i % 26), $i % 97);
}
ksort($h);
echo count($h), " ", sha1(implode(",", array_keys($h))), "\n";

$words = [];
for ($i = 0; $i < 50000; $i++) {
    $words[] = substr(md5((string)$i), 0, 1 + $i % 16);
}
usort($words, fn($a, $b) => strlen($a) <=> strlen($b) ?: strcmp($a, $b));
echo sha1(implode(" ", $words)), "\n";

$doc = [];
for ($i = 0; $i < 20000; $i++) {
    $doc[] = ["id" => $i, "tags" => array_fill(0, $i % 7, "t$i"), "v" => $i / 3];
}
$json = json_encode($doc);
$back = json_decode($json, true);
echo strlen($json), " ", count($back), " ", $back[19999]["id"], "\n";

$text = str_repeat("alpha beta gamma 12345 delta-epsilon ", 20000);
echo preg_match_all('/\b([a-z]+)-([a-z]+)\b/', $text, $m), " ",
     strlen(preg_replace('/\d+/', '#', $text)), "\n";

class Node { public $next; public $val; function __construct($v, $n) { $this->val = $v; $this->next = $n; } }
$list = null;
for ($i = 0; $i < 10000; $i++) { $list = new Node($i, $list); }
$sum = 0;
for ($n = $list; $n; $n = $n->next) { $sum += $n->val; }
echo $sum, " ", strlen(serialize(array_slice($doc, 0, 1000))), "\n";
echo implode(",", get_loaded_extensions()) !== "" ? "extensions ok\n" : "none\n";
