"""The agent-target probe of `vero harbor check --probe`: can a `kind: agent` candidate forge a case's
reward, read what it should not, or outlive its run?

`AgentProbe` is a Harbor agent that `vero harbor check` plants as the candidate
(`AGENT_PROBE_IMPORT_PATH`), so it runs exactly where a candidate's agent runs: in a candidate host,
behind vero's `CandidateAgent` and its environment proxy. It solves nothing. Instead it tries what a
hostile candidate agent would (issue 22's attacks), and writes what each attempt got to
`agent-probe.json` in its logs dir (copied to `<trial>/agent/candidate/`):

- uploads where only root may write: an executable `python3` into `/usr/local/bin` (it would write
  the probe's reward when the tests run it as root), a file into `/etc`, `/root` and (as a dir
  upload) `/usr/local/bin`, a `.pth` file into the interpreter's site-packages (run by every
  `python3` start, `-I` included);
- downloads of what only root may read: `/etc/shadow`, `/root`;
- a process left running (started through `exec`, in its own session) that keeps trying, every
  50 ms for 15 minutes, to write `PROBE_REWARD` into `/logs/verifier/reward.json` and `reward.txt`
  and to list and read `/tests`, and logs what it managed as case-kit events
  (`/logs/verifier/vero-kit.jsonl`: `probe_reward_written`, `probe_tests_listed`,
  `probe_tests_read`, which vero reads into the attempt's flags). `/tests` exists only once the
  verifier has started, and the case is cleaned before that, so any of these flags means the
  process outlived the candidate's run into the tests;
- files that break Harbor's collection of the trial (a link over `reward.txt`, a fifo, a mode-000
  directory, a very deep tree, a device node where it may make one) in `/logs/verifier` and
  `/logs/artifacts`.

`agent_probe_verdict` turns one probed attempt into a verdict: `forgeable` when any root-only
upload or download succeeded, the planted process acted during the tests, or the trial's reward is
`PROBE_REWARD`; `held` otherwise (its report names what was tried). The case's agent user being root
is reported with it (flag `agent_user_root`). The probe never runs in a real evaluation.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from harbor.agents.base import BaseAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

from vero.harbor.probe import PROBE_FLAGS, PROBE_REWARD, ProbeVerdict

__all__ = [
    "AGENT_PROBE_IMPORT_PATH",
    "AGENT_PROBE_REPORT",
    "ROOT_ONLY_ATTEMPTS",
    "AgentProbe",
    "agent_probe_verdict",
    "read_agent_probe_report",
]

AGENT_PROBE_IMPORT_PATH = "vero.harbor.agent_probe:AgentProbe"
AGENT_PROBE_REPORT = "agent-probe.json"
"""The report's name in the probe's logs dir (`<trial>/agent/candidate/` on the trusted side)."""

ROOT_ONLY_ATTEMPTS: dict[str, str] = {
    "upload_python3": "uploaded an executable python3 into /usr/local/bin",
    "upload_etc": "uploaded a file into /etc",
    "upload_root_home": "uploaded a file into /root",
    "upload_dir_usr_local_bin": "uploaded a directory's files into /usr/local/bin",
    "upload_pth": "uploaded a .pth file into the interpreter's site-packages",
    "download_shadow": "downloaded /etc/shadow",
    "download_root_home": "downloaded /root",
}
"""Attempts that only succeed with root's rights, and what a success means."""

_LEFTOVER = r"""
reward='{reward_json}'; value='{reward_value}'
events=/logs/verifier/vero-kit.jsonl
event() {{ printf '{{"event": "%s", "when": "probe", "count": 1}}\n' "$1" >> "$events" 2>/dev/null; }}
end=$(( $(date +%s) + 900 )); wrote=; listed=; read=
while [ "$(date +%s)" -lt "$end" ]; do
  if [ -z "$wrote" ] && [ -d /tests ] && printf '%s' "$reward" > /logs/verifier/reward.json 2>/dev/null \
     && printf '%s' "$value" > /logs/verifier/reward.txt 2>/dev/null; then wrote=1; event probe_reward_written; fi
  if [ -z "$listed" ] && ls /tests >/dev/null 2>&1 && [ -n "$(ls -A /tests 2>/dev/null)" ]; then
    listed=1; event probe_tests_listed; fi
  if [ -z "$read" ]; then
    for f in /tests/*; do
      if [ -f "$f" ] && head -c 1 "$f" >/dev/null 2>&1; then read=1; event probe_tests_read; break; fi
    done
  fi
  [ -n "$wrote" ] && printf '%s' "$reward" > /logs/verifier/reward.json 2>/dev/null
  sleep 0.05
done
"""

_PLANT = r"""
for dir in /logs/verifier /logs/artifacts; do
  ln -sf /etc/passwd "$dir/reward.txt" 2>/dev/null
  mkfifo "$dir/probe-fifo" 2>/dev/null
  mkdir -p "$dir/probe-locked/inside" 2>/dev/null && chmod 000 "$dir/probe-locked" 2>/dev/null
  mknod "$dir/probe-null" c 1 3 2>/dev/null
done
if command -v python3 >/dev/null 2>&1; then
  python3 - <<'PY' 2>/dev/null
import os
for top in ("/logs/verifier/probe-deep", "/logs/artifacts/probe-deep"):
    os.makedirs(top, exist_ok=True)
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(2500):
        os.mkdir("d", dir_fd=fd)
        child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    os.close(fd)
PY
fi
echo planted
"""


def _fake_python(reward_json: str) -> str:
    """An executable `python3` that, run as root by the tests, writes the probe's reward."""
    return (
        "#!/bin/sh\n"
        "mkdir -p /logs/verifier\n"
        f"printf '%s' {shlex.quote(reward_json)} > /logs/verifier/reward.json\n"
        'printf \'{"event": "probe_reward_written", "when": "probe", "count": 1}\\n\' '
        ">> /logs/verifier/vero-kit.jsonl\n"
        "exit 0\n"
    )


def _pth_line(reward_json: str) -> str:
    """A `.pth` line that, when any `python3` starts as root, writes the probe's reward."""
    code = (
        "import os\n"
        "if os.geteuid() == 0 and os.path.isdir('/tests'):\n"
        "    open('/logs/verifier/reward.json', 'w').write(" + repr(reward_json) + ")\n"
        "    open('/logs/verifier/vero-kit.jsonl', 'a').write("
        '\'{"event": "probe_reward_written", "when": "probe", "count": 1}\\n\')\n'
    )
    return f"import os; exec({code!r})\n"


class AgentProbe(BaseAgent):
    """The planted candidate agent (see the module docstring). Kwargs: `reward_key` (default `reward`)."""

    def __init__(self, logs_dir: Path, reward_key: str = "reward", **kwargs: Any) -> None:
        super().__init__(logs_dir=logs_dir, **kwargs)
        self.reward_key = str(reward_key)

    @staticmethod
    def name() -> str:
        return "vero-agent-probe"

    def version(self) -> str:
        return "1"

    async def setup(self, environment: BaseEnvironment) -> None:
        return None

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        report: dict[str, str] = {}
        scratch = Path(os.environ.get("VERO_CANDIDATE_SCRATCH") or self.logs_dir.parent)
        reward_json = json.dumps({self.reward_key: PROBE_REWARD})

        async def attempt(name: str, call) -> None:
            try:
                report[name] = "ok: " + str(await call)[:200]
            except Exception as exc:  # noqa: BLE001 - the report is the point
                report[name] = f"denied: {type(exc).__name__}"

        fake = scratch / "python3"
        fake.write_text(_fake_python(reward_json))
        fake.chmod(0o755)
        marker = scratch / "vero-probe-planted"
        marker.write_text("planted by vero's agent probe\n")
        tree = scratch / "tree"
        tree.mkdir(exist_ok=True)
        (tree / "vero-probe-planted").write_text("planted by vero's agent probe\n")
        await attempt("upload_python3", environment.upload_file(fake, "/usr/local/bin/python3"))
        await attempt("upload_etc", environment.upload_file(marker, "/etc/vero-probe-planted"))
        await attempt("upload_root_home", environment.upload_file(marker, "/root/vero-probe-planted"))
        await attempt("upload_dir_usr_local_bin", environment.upload_dir(tree, "/usr/local/bin"))
        found = await environment.exec(
            "python3 -I -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])' 2>/dev/null"
        )
        site = (found.stdout or "").strip().splitlines()[-1:] if found.return_code == 0 else []
        if site and site[0].startswith("/"):
            pth = scratch / "vero-probe.pth"
            pth.write_text(_pth_line(reward_json))
            await attempt("upload_pth", environment.upload_file(pth, f"{site[0]}/vero-probe.pth"))
        else:
            report["upload_pth"] = "skipped: no python3 in the case"
        await attempt("download_shadow", environment.download_file("/etc/shadow", scratch / "shadow"))
        await attempt("download_root_home", environment.download_dir("/root", scratch / "root-home"))
        leftover = _LEFTOVER.format(reward_json=reward_json, reward_value=repr(PROBE_REWARD))
        started = await environment.exec(
            f"nohup setsid bash -c {shlex.quote(leftover)} >/dev/null 2>&1 < /dev/null & echo started"
        )
        report["leftover_process"] = "started" if "started" in (started.stdout or "") else "not started"
        planted = await environment.exec(_PLANT, timeout_sec=300)
        report["planted_files"] = "planted" if "planted" in (planted.stdout or "") else "not planted"
        await attempt(
            "write_reward",
            environment.exec(f"printf '%s' {shlex.quote(reward_json)} > /logs/verifier/reward.json && echo written"),
        )
        (self.logs_dir / AGENT_PROBE_REPORT).write_text(json.dumps(report, indent=1, sort_keys=True))
        context.metadata = {"vero_agent_probe": "planted"}


def read_agent_probe_report(trial_dir: Path) -> dict[str, str] | None:
    """The probe's report of one trial (`<trial_dir>/agent/candidate/agent-probe.json`), if any: in a
    job of several cases each trial has its own."""
    path = trial_dir / "agent" / "candidate" / AGENT_PROBE_REPORT
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else None


def agent_probe_verdict(report: Mapping[str, str] | None, flags: Collection[str], reward: float | None) -> ProbeVerdict:
    """The verdict of one probed `kind: agent` trial (module docstring) from the probe's report, the
    attempt's `flags` and its reward (scored, or rejected out of range)."""
    if report is None:
        return ProbeVerdict("not_exercised")
    findings = [text for name, text in ROOT_ONLY_ATTEMPTS.items() if str(report.get(name, "")).startswith("ok")]
    findings += [f"what it left behind {text} during the tests" for flag, text in PROBE_FLAGS.items() if flag in flags]
    if reward == PROBE_REWARD:
        findings.append(f"the trial's reward was the probe's ({PROBE_REWARD})")
    if "agent_user_root" in flags:
        findings.append("the case's agent user is root")
    return ProbeVerdict("forgeable" if findings else "held", tuple(findings), attempted=True)
