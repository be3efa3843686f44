#!/usr/bin/env bash
# Writes docs/config.md from the config key table (src/train/train_config.cpp, printed by
# `qlora train --help-config`), so the page cannot drift from the keys the engine reads.
#   tools/make_config_doc.sh [QLORA_BINARY] [--check]   (--check: compare, exit 1 when they differ)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
qlora="${1:-$root/build/qlora}"
page="$root/docs/config.md"
tmp="$(mktemp)"
trap 'rm -f "$tmp"' EXIT
{
  echo "# Config keys"
  echo
  echo "Every key \`qlora train\` reads, with its type, default, allowed values and the other tools'"
  echo "spellings it accepts (axolotl, LLaMA-Factory, torchtune, TRL). Generated from the key table by"
  echo "\`tools/make_config_doc.sh\`; the suite fails when this page and the table differ. The same"
  echo "table is printed by \`qlora train --help-config\`."
  echo
  "$qlora" train --help-config
} >"$tmp"
if [ "${2:-}" = --check ]; then
  diff -u "$page" "$tmp" >&2 || { echo "docs/config.md differs from the key table: run tools/make_config_doc.sh" >&2; exit 1; }
  echo "docs/config.md matches the key table"
else
  cp "$tmp" "$page"
  echo "wrote $page"
fi
