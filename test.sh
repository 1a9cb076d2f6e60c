#!/usr/bin/env bash
# Meridian's tests, as CI runs them (.ci/run): every package under the race
# detector, then, without it, the tests that skip or shrink under it (the
# allocation pins, whose pools the detector empties at random, and the
# whole-trace replay goals). Arguments go to both passes (e.g. -count=1).
# One package: go test -race ./tier2/
set -euo pipefail
cd "$(dirname "$0")"
# Tests that read the race detector's flag; internal/arch checks that this
# pattern names every one of them.
second='Alloc|ReusesTheBuffer|MatchesHeaders|NeverHurt|OracleAndGIE|TwoReplicasP99|ReplayConservation|Determinism|BeatsRoundRobin|BeatsGIEOnMooncake'
go test -race "$@" ./...
go test -run "$second" "$@" ./...
