#!/bin/bash
# Half the reward for the candidate's word count (run through vero-kit as the candidate user, as
# tasks/minimal does), half for the route: the user simulator and this grader both got the model's
# answer through the gateway, a call without the token was refused, and nothing answers on the
# sidecar API's port at the gateway's address (route_probe.py prints its checks, then one word).
set -u
work="$(mktemp -d)"
vero-kit run --cwd /opt/candidate --timeout 20 --nproc 64 --memory-mb 1024 --fsize-mb 1 \
    -- python3 -c 'import sys, textstats; print(textstats.word_count(sys.stdin.read()))' \
    < /tests/input.txt > "$work/out"
status=$?
got="$(head -c 100 "$work/out")"
expected="$(cat /tests/expected.txt)"
python3 /tests/route_probe.py > "$work/probe" 2>&1
cat "$work/probe"
reward=0
if [ "$status" -eq 0 ] && [ "$got" = "$expected" ]; then reward=$((reward + 1)); fi
if [ "$(tail -n 1 "$work/probe")" = "routed" ]; then reward=$((reward + 1)); fi
case "$reward" in
    2) vero-kit reward 1 ;;
    1) vero-kit reward 0.5 ;;
    *) vero-kit reward 0 ;;
esac
