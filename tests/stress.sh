#!/usr/bin/env bash
# `make test-stress`: run a command (the test suite) with two CPU-burning processes beside it,
# as on a busy shared machine, so that a test which races the clock fails here and not in CI.
# The burners are shell busy loops in their own process group, ended however the command ends.
set -euo pipefail
burners=()
for _ in 1 2; do
    (while :; do :; done) &
    burners+=("$!")
done
trap 'kill "${burners[@]}" 2>/dev/null || true' EXIT
"$@"
