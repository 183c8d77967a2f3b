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
