#!/bin/sh
# Derives a preference dataset (TRL's conversational prompt/chosen/rejected JSONL) from the WordNet
# definitions make_dataset.sh writes. Each row asks for the meaning of a word; the chosen answer is
# its WordNet definition in the house style, the rejected one either another word's definition
# passed off as this word's (odd rows) or a vague non-answer of the kind a small chat model gives
# (even rows):
#   {"prompt": [{"role": "user", "content": "What does \"ocean\" mean?"}],
#    "chosen": [{"role": "assistant", "content": "ocean (noun): a large body of water ..."}],
#    "rejected": [{"role": "assistant", "content": "ocean (noun): a person who ..."}]}
# WordNet 3.0 Copyright 2006 by Princeton University (see make_dataset.sh for the licence).
#
#   usage: make_dpo_dataset.sh DEFINE_DIR OUT_DIR [MAX_TRAIN_ROWS]
#     DEFINE_DIR holds make_dataset.sh's train.jsonl and eval.jsonl; writes OUT_DIR/train.jsonl and
#     OUT_DIR/eval.jsonl (one preference row per definition row, the same split).
set -eu
IN=${1:?usage: make_dpo_dataset.sh DEFINE_DIR OUT_DIR [MAX_TRAIN_ROWS]}
OUT=${2:?usage: make_dpo_dataset.sh DEFINE_DIR OUT_DIR [MAX_TRAIN_ROWS]}
MAX=${3:-100000}
for f in train.jsonl eval.jsonl; do
  [ -s "$IN/$f" ] || { echo "error: $IN/$f not found (run examples/smollm2/make_dataset.sh $IN first)" >&2; exit 1; }
done
mkdir -p "$OUT"
for split in train eval; do
  awk -v max="$MAX" -v part="$split" '
  # make_dataset.sh writes exactly {"messages": [{"role": "user", "content": Q}, {"role": "assistant", "content": A}]}
  # with every quote inside Q and A escaped, so these delimiters occur once per line.
  BEGIN { U = "{\"messages\": [{\"role\": \"user\", \"content\": \""; M = "\"}, {\"role\": \"assistant\", \"content\": \""; E = "\"}]}" }
  {
    i = index($0, M)
    if (substr($0, 1, length(U)) != U || i == 0 || substr($0, length($0) - length(E) + 1) != E) {
      printf "error: line %d of %s.jsonl is not a make_dataset.sh row\n", NR, part > "/dev/stderr"; exit 1
    }
    n++
    q[n] = substr($0, length(U) + 1, i - length(U) - 1)
    a[n] = substr($0, i + length(M), length($0) - i - length(M) - length(E) + 1)
    p = index(a[n], " (")       # "word (pos): definition..." -> the word and the rest
    word[n] = substr(a[n], 1, p - 1); rest[n] = substr(a[n], p)
  }
  END {
    if (n < 8) { print "error: too few rows to pair" > "/dev/stderr"; exit 1 }
    vague[0] = "That is a great question! The word \\\"%s\\\" can mean different things depending on the context in which it is used."
    vague[1] = "I am not sure what \\\"%s\\\" means. You could look it up in a dictionary."
    vague[2] = "\\\"%s\\\" is a common English word that people use in everyday life."
    for (k = 1; k <= n && k <= max; k++) {
      if (k % 2) rej = word[k] rest[(k + 6) % n + 1]       # another word'"'"'s meaning
      else rej = sprintf(vague[int(k / 2) % 3], word[k])
      printf "{\"prompt\": [{\"role\": \"user\", \"content\": \"%s\"}], \"chosen\": [{\"role\": \"assistant\", \"content\": \"%s\"}], \"rejected\": [{\"role\": \"assistant\", \"content\": \"%s\"}]}\n", q[k], a[k], rej
    }
  }' "$IN/$split.jsonl" > "$OUT/$split.jsonl"
done
echo "wrote $(wc -l < "$OUT/train.jsonl") train and $(wc -l < "$OUT/eval.jsonl") eval preference rows to $OUT" >&2
