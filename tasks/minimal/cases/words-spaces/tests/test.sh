#!/bin/bash
# Reward 1 when the candidate's word_count gives the expected count for tests/input.txt, else 0.
#
# Candidate code runs only through vero-kit (docs/cases.md "Writing program cases"): as the unprivileged
# candidate user, which can read neither /tests nor /logs/verifier, with limits, and with every
# process it started killed afterwards. Its input comes on stdin (opened here, before the run);
# its output goes to a private file, bounded by --fsize-mb. vero-kit writes the reward last.
set -u
work="$(mktemp -d)"
vero-kit run --cwd /opt/candidate --timeout 20 --nproc 64 --memory-mb 1024 --fsize-mb 1 \
    -- python3 -c 'import sys, textstats; print(textstats.word_count(sys.stdin.read()))' \
    < /tests/input.txt > "$work/out"
status=$?
got="$(head -c 100 "$work/out")"
expected="$(cat /tests/expected.txt)"
if [ "$status" -eq 0 ] && [ "$got" = "$expected" ]; then
    vero-kit reward 1
else
    echo "expected $expected, got ${got:-nothing} (exit $status)"
    vero-kit reward 0
fi
