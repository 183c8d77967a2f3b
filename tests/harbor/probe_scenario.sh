#!/bin/bash
# Exercises vero-probe inside a case image (run as root by tests/harbor/test_case_kit.py, with the kit
# at /usr/local/bin/vero-kit and the probe at /usr/local/bin/vero-probe), the way a trial of
# `vero harbor check --probe` does: the candidate installed and its sandbox closed, the probe started,
# then the case's tests. `$1` is how the tests run candidate code: `kit` (through vero-kit) or `bare`
# (as root, the way a case that ignores the kit does). Prints `name=value` lines; the test asserts them.
set -u
out() { printf '%s=%s\n' "$1" "$2"; }
events() { sed -n 's/.*"event": "\(probe_[a-z_]*\)".*/\1/p' /logs/verifier/vero-kit.jsonl 2>/dev/null | sort -u | tr '\n' ' '; }
wait_for() {  # an event of the probe, for at most 20 s
    for _ in $(seq 400); do grep -q "\"$1\"" /logs/verifier/vero-kit.jsonl 2>/dev/null && return 0; sleep 0.05; done
    return 1
}
mkdir -p /logs/verifier /logs/agent /logs/artifacts /opt/cand
chmod 777 /logs/verifier /logs/agent /logs/artifacts
echo 42 > /opt/cand/answer.txt
mkdir -p /opt/cand/lib && echo 'print(1)' > /opt/cand/lib/mod.py
vero-kit setup > /dev/null
vero-kit end-install /opt/cand > /dev/null

out start "$(vero-probe start /opt/cand '{"reward": 918273.645}' 918273.645 > /dev/null; echo $?)"
# Harbor uploads /tests (readable by all) before it runs test.sh.
mkdir -p /tests && echo the-answer > /tests/expected.txt && echo 'exit 0' > /tests/test.sh
ls -R /opt/cand > /dev/null; [ -f /opt/cand/answer.txt ]  # listings and stats plant nothing
sleep 0.5
out before "$(events)"

if [ "$1" = kit ]; then
    out start_as_candidate "$(vero-kit run -- vero-probe start /opt/cand x y 2>/dev/null; echo $?)"
    # Candidate code (reading a file of the candidate in a subdirectory) runs through the kit.
    vero-kit run --timeout 20 -- sh -c 'cat /opt/cand/lib/mod.py > /dev/null; sleep 1' 2> /dev/null
    out run_exit "$?"
    wait_for probe_planted; out planted "$?"
    vero-kit reward 1 2> /dev/null
else
    answer="$(cat /opt/cand/answer.txt)"
    wait_for probe_reward_written; out written "$?"
    wait_for probe_tests_read; out tests_read "$?"
    echo "$answer" > /logs/verifier/reward.txt
fi
sleep 0.3
out events "$(events)"
out reward_json "$(cat /logs/verifier/reward.json 2>/dev/null)"
