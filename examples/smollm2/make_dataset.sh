#!/bin/sh
# Derives a small instruction dataset (OpenAI "messages" JSONL) from WordNet 3.0, as packaged by
# Debian (wordnet-base: /usr/share/wordnet). Each row asks for the meaning of a common English word
# and answers in one fixed house style:
#   {"messages": [{"role": "user", "content": "What does \"ocean\" mean?"},
#                 {"role": "assistant", "content": "ocean (noun): a large body of water ... Example: ..."}]}
# Words are the first senses WordNet's semantic-concordance counts mark as frequent. The split is
# deterministic: every 12th word goes to the eval file.
#
# WordNet 3.0 Copyright 2006 by Princeton University. All rights reserved. Used under the WordNet
# 3.0 licence (permission to use, copy, modify and distribute for any purpose without fee, with
# this notice kept; see /usr/share/doc/wordnet-base/copyright). THE DATABASE IS PROVIDED "AS IS".
#
#   usage: make_dataset.sh OUT_DIR [MIN_COUNT] [MAX_ROWS]   writes OUT_DIR/train.jsonl, eval.jsonl
set -eu
OUT=${1:?usage: make_dataset.sh OUT_DIR [MIN_COUNT] [MAX_ROWS]}
MIN=${2:-15}
MAX=${3:-2000}
WN=${WORDNET_DIR:-/usr/share/wordnet}
for f in cntlist.rev index.noun index.verb index.adj index.adv data.noun data.verb data.adj data.adv; do
  [ -r "$WN/$f" ] || { echo "error: $WN/$f not found (apt-get install wordnet-base)" >&2; exit 1; }
done
mkdir -p "$OUT"
awk -v min="$MIN" -v max="$MAX" -v out="$OUT" '
function esc(s) { gsub(/\\/, "\\\\", s); gsub(/"/, "\\\"", s); gsub(/\t/, " ", s); return s }
function trim(s) { sub(/^[ \t]+/, "", s); sub(/[ \t]+$/, "", s); return s }
BEGIN { posname["n"] = "noun"; posname["v"] = "verb"; posname["a"] = "adjective"; posname["r"] = "adverb" }
FILENAME ~ /cntlist\.rev$/ {
  # sense_key sense_number tag_count; sense_key = lemma%ss_type:lex_filenum:lex_id:head:head_id
  if ($2 != 1 || $3 < min) next
  split($1, k, "%"); lemma = k[1]; t = substr(k[2], 1, 1)
  if (lemma !~ /^[a-z][a-z]+$/ || length(lemma) < 4) next
  p = (t == 1) ? "n" : (t == 2) ? "v" : (t == 3 || t == 5) ? "a" : (t == 4) ? "r" : ""
  if (p == "" || (lemma in seen)) next
  seen[lemma] = 1; want[p, lemma] = ++nwant; order[nwant] = lemma; opos[nwant] = p
  next
}
FILENAME ~ /index\./ {
  if (substr($0, 1, 1) == " ") next
  p = $2; if (!((p, $1) in want)) next
  # fields: lemma pos synset_cnt p_cnt [ptr x p_cnt] sense_cnt tagsense_cnt offsets...
  first_offset[p, $1] = $(5 + $4 + 2)
  need[p, $(5 + $4 + 2)] = 1
  next
}
FILENAME ~ /data\./ {
  if (substr($0, 1, 1) == " ") next
  p = $3; if (p == "s") p = "a"
  if (!((p, $1) in need)) next
  g = $0; sub(/^[^|]*\| */, "", g); gloss[p, $1] = trim(g)
  next
}
END {
  n = 0
  for (i = 1; i <= nwant && n < max; i++) {
    w = order[i]; p = opos[i]
    if (!((p, w) in first_offset)) continue
    g = gloss[p, first_offset[p, w]]; if (g == "") continue
    # "definition; \"example\"; \"example\"" -> definition + first example
    def = g; ex = ""
    q = index(g, "\"")
    if (q > 0) { def = substr(g, 1, q - 1); ex = substr(g, q + 1); sub(/".*/, "", ex) }
    def = trim(def); sub(/;+$/, "", def); def = trim(def)
    if (length(def) < 8) continue
    n++
    m = (n + int(n / 12)) % 3
    ask = (m == 0) ? "What does \"" w "\" mean?" : (m == 1) ? "Define the word \"" w "\"." : "What is the meaning of \"" w "\"?"
    ans = w " (" posname[p] "): " def "."
    if (ex != "") ans = ans " Example: \"" ex "\""
    row = "{\"messages\": [{\"role\": \"user\", \"content\": \"" esc(ask) "\"}, {\"role\": \"assistant\", \"content\": \"" esc(ans) "\"}]}"
    if (n % 12 == 0) { print row > (out "/eval.jsonl"); ne++ } else { print row > (out "/train.jsonl"); nt++ }
  }
  printf "wrote %d train and %d eval rows (WordNet 3.0 first senses with concordance count >= %d) to %s\n", nt, ne, min, out > "/dev/stderr"
}' "$WN/cntlist.rev" "$WN/index.noun" "$WN/index.verb" "$WN/index.adj" "$WN/index.adv" \
   "$WN/data.noun" "$WN/data.verb" "$WN/data.adj" "$WN/data.adv"
