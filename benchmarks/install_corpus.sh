#!/usr/bin/env bash
# The Debian documentation packages of ../shared/eval/corpus.md (section 1), installed if missing.
set -euo pipefail
# Debian's nodejs-doc conflicts with a NodeSource nodejs: apt removes that one (moerag needs no node).
pkgs=(python3.11-doc postgresql-doc-15 sqlite3-doc nodejs-doc git-doc debian-policy debian-reference-en debian-faq)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  echo "installing the evaluation corpus: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
