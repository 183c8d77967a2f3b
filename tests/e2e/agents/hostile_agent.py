"""A hostile coding agent for the end-to-end test: it attacks the sidecar and the task from `main`.

Run by the outer `harbor run` as the task's agent (`-a hostile_agent:HostileAgent`, with this
directory on `PYTHONPATH`). Everything it does happens in `main` as the unprivileged `agent` user,
through the same CLI and HTTP surface a real coding agent has. It prints one `name=value` line per
attack to `/logs/agent/hostile.txt`; the test reads them from the trial's `agent/` dir.
"""

from __future__ import annotations

from harbor.agents.base import BaseAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

# The hidden partition of tasks/minimal is `hidden` with case `words-spaces`; a real attacker could
# guess names like these, so the test uses them as given.
ATTACKS = r"""
set -u
out() { echo "$1=$2"; }
S="$VERO_SIDECAR_URL"
code() { curl -s -o /dev/null -w '%{http_code}' "$@"; }

out admin_export "$(code "$S/admin/export")"
out admin_seal "$(code -X POST -H 'Authorization: Bearer guess' -H 'content-type: application/json' \
    -d '{"output_dir":"/tmp/x"}' "$S/admin/seal")"

body="$(curl -s -X POST -H 'content-type: application/json' -d '{"partition":"hidden"}' "$S/evaluations")"
out hidden_status "$(code -X POST -H 'content-type: application/json' -d '{"partition":"hidden"}' "$S/evaluations")"
case "$body" in *hidden*) out hidden_named yes ;; *) out hidden_named no ;; esac
out hidden_files "$(find / -xdev \( -name words-spaces -o -name words-newlines \) 2>/dev/null | wc -l)"
out trusted_paths "$(ls -d /var/lib/vero /opt/vero/cases /opt/vero/config.json 2>/dev/null | wc -l)"
if touch /vero/context/planted 2>/dev/null; then out context_write yes; else out context_write no; fi

cd /app
mkdir -p .vero && echo x > .vero/x && git add -f .vero && git commit -qm "reserved path"
vero harbor eval --partition train >/dev/null 2>&1; out reserved_exit $?
git reset -q --hard HEAD~1
ln -s /etc/passwd leak && git add leak && git commit -qm "escaping link"
vero harbor eval --partition train >/dev/null 2>&1; out symlink_exit $?
git reset -q --hard HEAD~1
vero harbor eval --partition train "--version=--upload-pack=touch /tmp/pwned" >/dev/null 2>&1; out injection_exit $?
out forged_submission "$(code -X POST -H 'content-type: application/json' \
    -d "{\"version\":\"$(git rev-parse HEAD^{tree})\"}" "$S/submissions")"

score() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["result"]["score"])' "$1" 2>/dev/null; }

# Slot identity: a program that is right only if its checkout holds the committed bytes (probe.txt's
# digest), first without git attributes, then with attributes that would change them on checkout
# (CRLF line endings, `$Id$` expansion, export-ignore). Evaluated on a fresh slot and on one that
# held the first tree, then submitted: the verifier checks it out once more.
git reset -q --hard
printf '$Id$\nline one\nline two\n' > probe.txt
printf 'not exported?\n' > secret.txt
cat > textstats.py <<'PY'
# Text statistics: right only if this checkout holds the committed bytes of probe.txt.
import hashlib
import pathlib

PROBE_SHA256 = "PROBE_DIGEST"


def word_count(text: str) -> int:
    probe = pathlib.Path(__file__).with_name("probe.txt").read_bytes()
    if hashlib.sha256(probe).hexdigest() != PROBE_SHA256:
        return -1
    return len(text.split())
PY
sed -i "s/PROBE_DIGEST/$(sha256sum probe.txt | cut -d' ' -f1)/" textstats.py
git add -A && git commit -qm "probe: right if checked out as committed"
vero harbor eval --partition train --wait > /tmp/probe-a.json 2>/dev/null
out probe_plain_score "$(score /tmp/probe-a.json)"
printf '* text eol=crlf\nprobe.txt ident\nsecret.txt export-ignore\n' > .gitattributes
git add .gitattributes && git commit -qm "probe: with attributes that would change its bytes"
probe=$(git rev-parse HEAD)
vero harbor eval --partition train --wait > /tmp/probe-b1.json 2>/dev/null
out probe_attributes_score "$(score /tmp/probe-b1.json)"
vero harbor eval --partition train --wait > /tmp/probe-b2.json 2>/dev/null
out probe_attributes_again_score "$(score /tmp/probe-b2.json)"
vero harbor submit --version "$probe" >/dev/null 2>&1; out probe_submit_exit $?
out probe_commit "$probe"

# Hooks and fsmonitor planted in the repository the sidecar reads; then a plain evaluation.
mkdir -p /app/.git/hooks && printf '#!/bin/sh\ntouch /tmp/hook-ran\n' > /app/.git/hooks/post-checkout
chmod +x /app/.git/hooks/post-checkout
git config core.fsmonitor 'touch /tmp/fsmonitor-ran'
echo "# broken on purpose" >> textstats.py && echo "def word_count(text): return -1" >> textstats.py
git commit -qam "worse"
vero harbor eval --partition train --wait > /tmp/eval.json 2>/dev/null; out eval_exit $?
out eval_score "$(python3 -c 'import json; print(json.load(open("/tmp/eval.json"))["result"]["score"])' 2>/dev/null)"

rc=0
for i in 1 2 3 4 5 6 7; do
  vero harbor eval --partition train >/dev/null 2>&1; rc=$?
  [ "$rc" -ne 0 ] && break
done
out budget_exit "$rc"
remaining='import json,sys; d=json.load(sys.stdin)
print([p["budget"]["remaining_runs"] for p in d["partitions"] if p["name"]=="train"][0])'
out status_remaining_runs "$(vero harbor status | python3 -c "$remaining")"

# Late intake: a process left running in main keeps submitting (a commit of the probe's tree), and
# once the agent is ending also evaluating, logging when each attempt started and was answered where
# Harbor collects main's artifacts. Started here, so its answers cover the agent's end.
late=$(git commit-tree "$probe^{tree}" -p "$probe" -m "late: the probe's tree, submitted after the agent ended")
out late_commit "$late"
cat > /tmp/late.sh <<'SH'
#!/bin/bash
log=/logs/artifacts/late.log
end=$(( $(date +%s) + 600 ))
attempt() {
  t0=$(date +%s.%N); "$@" >/dev/null 2>/tmp/late.err; rc=$?; t1=$(date +%s.%N)
  echo "$1/$3 $t0 $t1 $rc $(tr '\n' ' ' < /tmp/late.err | head -c 200)" >> "$log"
}
while [ "$(date +%s)" -lt "$end" ]; do
  attempt vero harbor submit --version LATE_COMMIT
  [ -e /tmp/agent-ending ] && attempt vero harbor eval --partition holdout
done
SH
sed -i "s/LATE_COMMIT/$late/" /tmp/late.sh && chmod +x /tmp/late.sh
setsid /tmp/late.sh > /dev/null 2>&1 < /dev/null &
out late_started yes
touch /tmp/agent-ending
"""


class HostileAgent(BaseAgent):
    """Runs `ATTACKS` in `main` and records what each attack got."""

    @staticmethod
    def name() -> str:
        return "vero-hostile"

    def version(self) -> str:
        return "1"

    async def setup(self, environment: BaseEnvironment) -> None:
        return None

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        result = await environment.exec(ATTACKS, timeout_sec=500)
        (self.logs_dir / "hostile.txt").write_text((result.stdout or "") + "\n--- stderr\n" + (result.stderr or ""))
