"""The built-in Harbor agent that installs a `kind: program` candidate into a case environment.

`harbor run -a vero.harbor.install_agent:InstallAgent --ak candidate_dir=... --ak install_path=...
[--ak install_command=...]`. In each trial it

1. stages the candidate checkout without `.git` in a host temp dir (symlinks are copied as links,
   never followed: a link in the candidate must not pull a trusted host file into the case);
2. creates `install_path` as root and uploads the staged tree into it (`environment.upload_dir`,
   which is `docker compose cp <dir>/. main:<install_path>` on Docker: files already there are
   overwritten, others kept);
3. gives the tree to the agent user (`[agent].user` of the case, or the image's default user) so an
   unprivileged install command can build in place;
4. runs `install_command`, if any, through `bash -c` as that user with `cwd = install_path`, writing
   its output to `agent/install.txt` and its exit code to `agent/exit-code.txt` (as Harbor's
   oracle does, `agents/oracle.py`).

A non-zero exit raises Harbor's own `NonZeroAgentExitCodeError`: its error policy
(`models/trial/error_policy.py`) still runs the verifier and keeps the reward valid, so the case's
tests decide the score of a candidate whose build failed. The whole `run` is inside Harbor's agent
timeout (`case_timeout_sec`), so a hanging install is an `AgentTimeoutError`, also graded.
"""

from __future__ import annotations

import shlex
import shutil
import tempfile
from pathlib import Path
from typing import override

from harbor.agents.base import BaseAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

__all__ = ["InstallAgent"]

INSTALL_LOG_NAME = "install.txt"
EXIT_CODE_NAME = "exit-code.txt"


def _ignore_top_level_git(root: Path):
    def ignore(directory: str, names: list[str]) -> set[str]:
        return {".git"} if Path(directory) == root and ".git" in names else set()

    return ignore


class InstallAgent(BaseAgent):
    """Uploads the candidate checkout to `install_path` and runs `install_command` there.

    Args:
        logs_dir: the trial's host `agent/` dir (Harbor passes it).
        candidate_dir: host path of the candidate checkout (readable by the `harbor` process).
        install_path: absolute path in the case environment that receives the checkout.
        install_command: optional shell command run in `install_path` after the upload.
        **kwargs: Harbor's framework arguments (`model_name`, `logger`, `extra_env`, ...).
    """

    def __init__(self, logs_dir: Path, candidate_dir: str, install_path: str,
                 install_command: str | None = None, **kwargs) -> None:
        super().__init__(logs_dir=logs_dir, **kwargs)
        if not str(install_path).startswith("/"):
            raise ValueError("install_path must be an absolute path")
        self.candidate_dir = Path(candidate_dir)
        self.install_path = str(install_path)
        self.install_command = install_command or None

    @staticmethod
    @override
    def name() -> str:
        return "vero-install"

    @override
    def version(self) -> str:
        from vero import __version__

        return __version__

    @override
    async def setup(self, environment: BaseEnvironment) -> None:
        # Everything happens in `run`, so the agent timeout (case_timeout_sec) covers it.
        return

    async def _upload(self, environment: BaseEnvironment) -> None:
        quoted = shlex.quote(self.install_path)
        with tempfile.TemporaryDirectory(prefix="vero-install-") as tmp:
            staged = Path(tmp) / "candidate"
            shutil.copytree(self.candidate_dir, staged, symlinks=True,
                            ignore=_ignore_top_level_git(self.candidate_dir))
            await environment.exec(f"mkdir -p {quoted}", user="root")
            await environment.upload_dir(staged, self.install_path)
        # Uploaded files belong to root; hand them to the agent user so it can build in place.
        ids = await environment.exec("printf '%s:%s' \"$(id -u)\" \"$(id -g)\"")
        owner = (ids.stdout or "").strip()
        if ids.return_code == 0 and owner and not owner.startswith("0:"):
            await environment.exec(f"chown -R {shlex.quote(owner)} {quoted}", user="root")

    @override
    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        from harbor.agents.installed.base import NonZeroAgentExitCodeError

        await self._upload(environment)
        context.metadata = {**(context.metadata or {}), "vero_install_path": self.install_path}
        if self.install_command is None:
            return
        result = await environment.exec(self.install_command, cwd=self.install_path)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        (self.logs_dir / INSTALL_LOG_NAME).write_text(
            f"$ {self.install_command}\n--- stdout ---\n{result.stdout or ''}\n"
            f"--- stderr ---\n{result.stderr or ''}\n")
        (self.logs_dir / EXIT_CODE_NAME).write_text(str(result.return_code))
        context.metadata["vero_install_exit_code"] = result.return_code
        if result.return_code != 0:
            raise NonZeroAgentExitCodeError(f"install_command exited with code {result.return_code}")
