#!/bin/bash
# Scores the candidate matmul installed at /opt/candidate on one matrix size (MATMUL_N, from
# task.toml [verifier].env).
#
# reward = naive_sec / candidate_sec: the best-of-runs CPU times of the naive triple loop
# (tests/naive.c) and of the candidate, both linked with the same harness (tests/bench.c), built with
# the same flags and run alternately in this container. Machine speed cancels out in the ratio, and
# CPU time (unlike wall time) barely moves when other work shares the machine.
# The reward is 0 when the candidate fails to build, crashes, times out or computes a wrong result.
# When the harness itself cannot be built or run, no reward file is written: the trial has no
# valid reward (Harbor 0.26 `verifier/verifier.py`: RewardFileNotFoundError), never a fake 0.
#
# Candidate code is built and run as `nobody`. Benchmarks run with RLIMIT_NPROC=1, so they can start
# no thread or process (work hidden there would escape the CPU clock), and every process `nobody`
# left behind is killed before each naive run and before the reward is written: candidate code can
# neither slow the naive baseline down nor touch the reward file (Harbor makes /logs/verifier
# world-writable).
set -u

N="${MATMUL_N:?MATMUL_N is set in task.toml [verifier].env}"
ROUNDS="${MATMUL_ROUNDS:-5}"        # alternating naive/candidate runs
REPS="${MATMUL_REPS:-5}"            # timed calls per run
RUN_TIMEOUT_SEC="${MATMUL_RUN_TIMEOUT_SEC:-60}"
CFLAGS=(-O2 -std=c11)
CANDIDATE_DIR=/opt/candidate
REWARD_FILE=/logs/verifier/reward.json
UNPRIVILEGED=(setpriv --reuid=nobody --regid=nogroup --clear-groups --)

mkdir -p /logs/verifier
work="$(mktemp -d)"
chmod 0755 "$work"
mkdir "$work/candidate-src"

kill_unprivileged() {
    # kill(-1) from `nobody` reaches every process of `nobody` except the caller (Linux kill(2)).
    "${UNPRIVILEGED[@]}" bash -c 'kill -KILL -1' 2>/dev/null || true
}

write_reward() {
    kill_unprivileged
    rm -f "$REWARD_FILE"
    printf '{"reward": %s}\n' "$1" > "$REWARD_FILE"
}

# Prints the best_sec value of one bench run (as `nobody`), or fails. Output goes through a file, not
# a pipe: a pipe would stay open, and the shell would wait, as long as any process forked by the
# candidate lives.
best_sec() {
    local status
    timeout "$RUN_TIMEOUT_SEC" "${UNPRIVILEGED[@]}" prlimit --nproc=1 -- "$@" > "$work/run.out" < /dev/null
    status=$?
    kill_unprivileged
    [ "$status" -eq 0 ] || return 1
    sed -n 's/^best_sec=//p' "$work/run.out" | grep -E '^[0-9.]+$' || return 1
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
cp -R "$CANDIDATE_DIR/." "$work/candidate-src/"
cp /tests/bench.c "$work/bench.c"
chown -R nobody:nogroup "$work/candidate-src"
if ! timeout "$RUN_TIMEOUT_SEC" "${UNPRIVILEGED[@]}" gcc "${CFLAGS[@]}" -I"$work/candidate-src" \
        -o "$work/candidate-src/bench" "$work/bench.c" "$work/candidate-src/matmul.c" -lm; then
    echo "FAIL: the candidate does not compile"
    write_reward 0
    exit 0
fi
# The binary moves out of the candidate's (writable) directory so that nothing it does can swap it.
cp "$work/candidate-src/bench" "$work/candidate"

# The candidate's first run checks its result against the harness's own naive multiply.
if ! candidate_sec="$(best_sec "$work/candidate" "$N" 1 1)"; then
    echo "FAIL: the candidate crashed, timed out or computed a wrong result"
    write_reward 0
    exit 0
fi
naive_times=()
candidate_times=("$candidate_sec")
for ((round = 1; round <= ROUNDS; round++)); do
    if ! t="$(best_sec "$work/naive" "$N" "$REPS" 0)"; then
        echo "HARNESS ERROR: the naive run failed; no reward written"
        kill_unprivileged
        rm -f "$REWARD_FILE"
        exit 1
    fi
    naive_times+=("$t")
    if ! t="$(best_sec "$work/candidate" "$N" "$REPS" 0)"; then
        echo "FAIL: the candidate crashed or timed out"
        write_reward 0
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
)" || { echo "HARNESS ERROR: cannot compute the speed-up"; kill_unprivileged; rm -f "$REWARD_FILE"; exit 1; }
echo "speed-up: $reward"
write_reward "$reward"
