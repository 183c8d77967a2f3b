#!/bin/bash
# Reward 1 when the candidate's word_count gives the expected count for tests/input.txt, else 0.
mkdir -p /logs/verifier
got="$(cd /opt/candidate && python3 -c 'import sys, textstats; print(textstats.word_count(sys.stdin.read()))' < /tests/input.txt)"
if [ "$got" = "$(cat /tests/expected.txt)" ]; then
    echo 1 > /logs/verifier/reward.txt
else
    echo "expected $(cat /tests/expected.txt), got ${got:-nothing}"
    echo 0 > /logs/verifier/reward.txt
fi
