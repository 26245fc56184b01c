#!/bin/sh
# The repository stands alone: no reference to a design document outside
# it ("SPEC"), and every moe8 symbol the docs and the header's comments name
# exists in the code.  usage: docs_check.sh SOURCE_DIR
set -u
src="$1"
cd "$src" || exit 1
fail=0
if git rev-parse --git-dir >/dev/null 2>&1; then
  hits=$(git grep -n "SPEC" -- . ':!tests/fuzz/corpus' ':!tests/docs_check.sh' || true)
else
  hits=$(grep -rn "SPEC" --exclude-dir=.git --exclude-dir=corpus --exclude=docs_check.sh . | grep -v '^./build' || true)
fi
if [ -n "$hits" ]; then echo "FAIL: references to a document outside the repository:"; echo "$hits"; fail=1; fi
code="src include tools tests python CMakeLists.txt scripts bench"
# moe8 symbols, test helpers, and the code names in backquotes (kernels, helpers)
names=$( (cat docs/*.md README.md | grep -o '\bmoe8__\{0,1\}[a-z0-9_]*[a-z0-9]\b\|\btu_[a-z0-9_]*[a-z0-9]\b';
          cat docs/*.md | grep -o '`[a-z][a-z0-9]*_[a-z0-9_]*[a-z0-9]`' | tr -d '`') | sort -u)
n=0
for s in $names; do
  n=$((n + 1))
  # the name must appear in the code outside the docs
  case "$s" in fuzz_corpus_*|fuzz_replay_*|test_ep_np*) s=${s%_*}_ ;; esac  # names CMake builds from a loop
  if ! grep -rq -- "$s" $code 2>/dev/null; then echo "FAIL: the docs name '$s', which the code lacks"; fail=1; fi
done
[ $fail -eq 0 ] && echo "docs check: ok ($n names checked, no outside references)"
exit $fail
