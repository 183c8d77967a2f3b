#!/bin/bash
# reward 1 when /app/answer.txt holds the expected answer (tests/expected.txt), else 0. Trailing
# whitespace on each line and trailing blank lines are ignored. The answer must be a regular file:
# a symlink planted by the agent (say, to /tests/expected.txt) scores 0.
#
# Processes the agent left behind are killed first (kill(-1) as `agent` reaches all of that user's
# processes, Linux kill(2)): Harbor makes /logs/verifier world-writable. Python runs isolated (-I)
# from /, so nothing in /app or the environment can shadow a module.
setpriv --reuid=agent --regid=agent --clear-groups -- bash -c 'kill -KILL -1' 2>/dev/null || true
mkdir -p /logs/verifier
cd /
python3 -I - <<'PY'
import json
import os
import stat


def normalize(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines()).rstrip("\n")


with open("/tests/expected.txt", encoding="utf-8") as f:
    expected = normalize(f.read())
answer = None
try:
    fd = os.open("/app/answer.txt", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise OSError("not a regular file")
        answer = normalize(f.read(1 << 20).decode("utf-8"))
except (OSError, UnicodeDecodeError) as exc:
    print(f"FAIL: cannot read /app/answer.txt as a regular UTF-8 file: {type(exc).__name__}: {exc}")
reward = 1 if answer == expected else 0
if answer is not None:
    print("PASS" if reward else f"FAIL: expected {expected[:200]!r}, got {answer[:200]!r}")
try:
    os.unlink("/logs/verifier/reward.json")
except FileNotFoundError:
    pass
with open("/logs/verifier/reward.json", "w", encoding="utf-8") as f:
    json.dump({"reward": reward}, f)
PY
