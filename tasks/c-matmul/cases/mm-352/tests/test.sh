#!/bin/bash
# Scores the candidate matmul installed at /opt/candidate on one matrix size (MATMUL_N, from
# task.toml [verifier].env).
#
# reward = naive_sec / candidate_sec: the best-of-runs CPU times of the naive triple loop
# (tests/naive.c) and of the candidate, both linked with the same harness (tests/bench.c), built with
# the same flags and run alternately in this container. Machine speed cancels out in the ratio, and
# CPU time (unlike wall time) barely moves when other work shares the machine.
# The reward is 0 when the candidate fails to build, crashes, times out or computes a wrong result.
# When the harness itself cannot be built or run, no reward is written (`vero-kit no-reward`): the
# trial has no valid reward (Harbor 0.26 `verifier/verifier.py`: RewardFileNotFoundError), never a
# fake 0.
#
# Candidate code is compiled and run only through vero-kit, as vero's unprivileged candidate user:
# it can read neither /tests nor /logs/verifier, and every process it leaves is killed when each run
# ends (README "Writing program cases"). Benchmarks run with --nproc 1, so they can start no thread
# or process (work hidden there would escape the CPU clock); both binaries run under the same limits.
# `vero-kit reward` writes the reward after killing whatever of the candidate is left.
set -u

N="${MATMUL_N:?MATMUL_N is set in task.toml [verifier].env}"
ROUNDS="${MATMUL_ROUNDS:-5}"        # alternating naive/candidate runs
REPS="${MATMUL_REPS:-5}"            # timed calls per run
RUN_TIMEOUT_SEC="${MATMUL_RUN_TIMEOUT_SEC:-60}"
CFLAGS=(-O2 -std=c11)
CANDIDATE_DIR=/opt/candidate

work="$(mktemp -d)"
chmod 0755 "$work"

harness_error() {
    echo "HARNESS ERROR: $1; no reward written"
    vero-kit no-reward
    exit 1
}

# Prints the best_sec value of one bench run (as the candidate user, no threads or processes), or
# fails. Output goes to a file (at most 1 MB), read after the run.
best_sec() {
    vero-kit run --timeout "$RUN_TIMEOUT_SEC" --nproc 1 --fsize-mb 1 -- "$@" > "$work/run.out" < /dev/null \
        || return 1
    sed -n 's/^best_sec=//p' "$work/run.out" | grep -E '^[0-9.]+$' || return 1
}

echo "== case: n=$N rounds=$ROUNDS reps=$REPS flags=${CFLAGS[*]}"
gcc --version | head -n 1

if ! gcc "${CFLAGS[@]}" -o "$work/naive" /tests/bench.c /tests/naive.c -lm; then
    harness_error "the naive build failed"
fi

vero-kit reward 0
if [ ! -f "$CANDIDATE_DIR/matmul.c" ]; then
    echo "FAIL: $CANDIDATE_DIR/matmul.c is missing"
    exit 0
fi
# gcc reads the candidate's sources (which may #include any path), so it runs as the candidate too,
# writing into a directory given to it; the harness source is copied where it can read it.
mkdir "$work/build"
cp /tests/bench.c "$work/bench.c"
vero-kit give "$work/build"
if ! vero-kit run --timeout "$RUN_TIMEOUT_SEC" --cwd "$work/build" --fsize-mb 64 \
        -- gcc "${CFLAGS[@]}" -I"$CANDIDATE_DIR" -o "$work/build/bench" "$work/bench.c" "$CANDIDATE_DIR/matmul.c" -lm; then
    echo "FAIL: the candidate does not compile"
    vero-kit reward 0
    exit 0
fi
# The binary moves out of the candidate's directory, which then goes: nothing of a run survives to
# the next one.
cp "$work/build/bench" "$work/candidate" && chmod 0755 "$work/candidate"
rm -rf "$work/build"

# The candidate's first run checks its result against the harness's own naive multiply.
if ! candidate_sec="$(best_sec "$work/candidate" "$N" 1 1)"; then
    echo "FAIL: the candidate crashed, timed out or computed a wrong result"
    vero-kit reward 0
    exit 0
fi
naive_times=()
candidate_times=("$candidate_sec")
for ((round = 1; round <= ROUNDS; round++)); do
    t="$(best_sec "$work/naive" "$N" "$REPS" 0)" || harness_error "the naive run failed"
    naive_times+=("$t")
    if ! t="$(best_sec "$work/candidate" "$N" "$REPS" 0)"; then
        echo "FAIL: the candidate crashed or timed out"
        vero-kit reward 0
        exit 0
    fi
    candidate_times+=("$t")
done

echo "naive_cpu_sec: ${naive_times[*]}"
echo "candidate_cpu_sec: ${candidate_times[*]}"
reward="$(python3 -I - "${naive_times[*]}" "${candidate_times[*]}" <<'PY'
import sys

naive = min(float(t) for t in sys.argv[1].split())
candidate = max(min(float(t) for t in sys.argv[2].split()), 1e-9)
print(f"{naive / candidate:.4f}")
PY
)" || harness_error "cannot compute the speed-up"
echo "speed-up: $reward"
vero-kit reward "$reward"
