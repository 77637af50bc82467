#!/usr/bin/env bash
# Runs every Go fuzz target of the module for a bounded time each.
#
#   scripts/fuzz.sh [FUZZTIME]      FUZZTIME defaults to 10s (Go's -fuzztime syntax)
#
# A count (for example 500x) is the budget to use where the result must not
# depend on timing, as in CI: with a duration, Go's fuzzing coordinator can
# fail a target with a bare "context deadline exceeded" at the end of the
# time on a loaded machine, having found nothing (golang/go#75804).
# Minimizing a new input is bounded the same way (FUZZMINIMIZE, default
# 200x).
#
# Targets are found by their declarations (func FuzzXxx(f *testing.F)), so a
# new target is fuzzed without being listed here. The seed corpus of each is
# what its f.Add calls give plus testdata/fuzz/FuzzXxx/ in its package; a
# failing input is written there too, and the script stops at the first.
set -euo pipefail
cd "$(dirname "$0")/.."

fuzztime="${1:-10s}"
minimize="${FUZZMINIMIZE:-200x}"
targets=0
while IFS=: read -r file _ decl; do
  name="$(sed -E 's/^func (Fuzz[A-Za-z0-9_]+)\(.*/\1/' <<<"$decl")"
  pkg="./$(dirname "$file")"
  echo "fuzz $pkg $name ($fuzztime)"
  go test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" -fuzzminimizetime "$minimize" "$pkg"
  targets=$((targets + 1))
done < <(grep -rHn --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*(f \*testing\.F)' . | sed 's|^\./||' | sort)
echo "fuzzed $targets targets"
[ "$targets" -gt 0 ]
