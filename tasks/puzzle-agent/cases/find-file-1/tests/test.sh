#!/bin/bash
# reward 1 when /app/answer.txt holds the expected answer (tests/expected.txt), else 0. Trailing
# whitespace on each line and trailing blank lines are ignored.
mkdir -p /logs/verifier
python3 - <<'PY'
import json
import os
from pathlib import Path


def normalize(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines()).rstrip("\n")


expected = normalize(Path("/tests/expected.txt").read_text(encoding="utf-8"))
answer_path = Path("/app/answer.txt")
try:
    answer = normalize(answer_path.read_text(encoding="utf-8"))
except (OSError, UnicodeDecodeError) as exc:
    print(f"FAIL: cannot read {answer_path}: {type(exc).__name__}")
    answer = None
reward = 1 if answer == expected else 0
if answer is not None:
    print("PASS" if reward else f"FAIL: expected {expected[:200]!r}, got {answer[:200]!r}")
tmp = "/logs/verifier/reward.json.tmp"
with open(tmp, "w", encoding="utf-8") as f:
    json.dump({"reward": reward}, f)
os.replace(tmp, "/logs/verifier/reward.json")
PY
