#!/bin/bash
# Scores the candidate matmul installed at /opt/candidate on one matrix size (MATMUL_N, from
# task.toml [verifier].env).
#
# reward = naive_sec / candidate_sec, the best-of-runs wall times of the naive triple loop
# (tests/naive.c) and of the candidate, both linked with the same harness (tests/bench.c), built with
# the same flags and run alternately in this container, so machine speed and noise cancel out.
# The reward is 0 when the candidate fails to build, crashes, times out or computes a wrong result.
# When the harness itself cannot be built or run, no reward file is written: the trial has no
# valid reward (Harbor 0.26 `verifier/verifier.py`: RewardFileNotFoundError), never a fake 0.
set -u

N="${MATMUL_N:?MATMUL_N is set in task.toml [verifier].env}"
ROUNDS="${MATMUL_ROUNDS:-5}"        # alternating naive/candidate runs
REPS="${MATMUL_REPS:-5}"            # timed calls per run
RUN_TIMEOUT_SEC="${MATMUL_RUN_TIMEOUT_SEC:-60}"
CFLAGS=(-O2 -std=c11)
CANDIDATE_DIR=/opt/candidate
REWARD_FILE=/logs/verifier/reward.json

mkdir -p /logs/verifier
work="$(mktemp -d)"

write_reward() {
    printf '{"reward": %s}\n' "$1" > "$REWARD_FILE.tmp" && mv "$REWARD_FILE.tmp" "$REWARD_FILE"
}

# Prints the best_sec value of one bench run, or fails.
best_sec() {
    local output
    output="$(timeout "$RUN_TIMEOUT_SEC" "$@")" || return 1
    printf '%s\n' "$output" | sed -n 's/^best_sec=//p' | grep -E '^[0-9.]+$' || return 1
}

echo "== case: n=$N rounds=$ROUNDS reps=$REPS flags=${CFLAGS[*]}"
gcc --version | head -n 1

if ! gcc "${CFLAGS[@]}" -o "$work/naive" /tests/bench.c /tests/naive.c -lm; then
    echo "HARNESS ERROR: the naive build failed; no reward written"
    exit 1
fi

write_reward 0
if [ ! -f "$CANDIDATE_DIR/matmul.c" ]; then
    echo "FAIL: $CANDIDATE_DIR/matmul.c is missing"
    exit 0
fi
if ! gcc "${CFLAGS[@]}" -I"$CANDIDATE_DIR" -o "$work/candidate" /tests/bench.c "$CANDIDATE_DIR/matmul.c" -lm; then
    echo "FAIL: the candidate does not compile"
    exit 0
fi

# The candidate's first run checks its result against the harness's own naive multiply.
if ! candidate_sec="$(best_sec "$work/candidate" "$N" 1 1)"; then
    echo "FAIL: the candidate crashed, timed out or computed a wrong result"
    exit 0
fi
naive_times=()
candidate_times=("$candidate_sec")
for ((round = 1; round <= ROUNDS; round++)); do
    if ! t="$(best_sec "$work/naive" "$N" "$REPS" 0)"; then
        echo "HARNESS ERROR: the naive run failed; no reward written"
        rm -f "$REWARD_FILE"
        exit 1
    fi
    naive_times+=("$t")
    if ! t="$(best_sec "$work/candidate" "$N" "$REPS" 0)"; then
        echo "FAIL: the candidate crashed or timed out"
        exit 0
    fi
    candidate_times+=("$t")
done

echo "naive_sec: ${naive_times[*]}"
echo "candidate_sec: ${candidate_times[*]}"
reward="$(python3 - "${naive_times[*]}" "${candidate_times[*]}" <<'PY'
import sys

naive = min(float(t) for t in sys.argv[1].split())
candidate = max(min(float(t) for t in sys.argv[2].split()), 1e-9)
print(f"{naive / candidate:.4f}")
PY
)" || { echo "HARNESS ERROR: cannot compute the speed-up"; rm -f "$REWARD_FILE"; exit 1; }
echo "speed-up: $reward"
write_reward "$reward"
