"""The import pre-flight of a `kind: agent` candidate, run in a candidate host (never in-process).

Harbor fails an agent class that cannot be imported before any trial (`Job.create`), which from the
outside looks like an unreachable engine; so the backend first asks a candidate host to import and
construct the class. The host answers `hello` once its trusted prologue is done (Harbor imported,
checkout readable) and only then imports candidate code: what it reports before `hello` is believed
(an infrastructure failure), what it reports after is the candidate's verdict.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from vero.core.run import NestedRun
from vero.errors import InfrastructureFailure
from vero.harbor.boundary.launcher import CandidateLauncher
from vero.harbor.boundary.wire import FrameError, FrameWriter, read_frame

__all__ = ["PreflightFailure", "preflight_in_host"]

logger = logging.getLogger("vero.harbor.boundary")

_FAILED_WITHOUT_TYPE = "AgentImportError"


@dataclass(frozen=True)
class PreflightFailure:
    """Why the candidate's class did not import or construct: the candidate's dead attempts.

    Attributes:
        exception_type: the root cause's type name (`AgentImportError` when the host said nothing).
        message: the root cause as Python prints it (candidate text, at most 2000 characters).
    """

    exception_type: str
    message: str = ""


async def preflight_in_host(launcher: CandidateLauncher, run: NestedRun) -> PreflightFailure | None:
    """Import and construct `run.runtime.agent_import_path` from `run.candidate_dir` in a host.

    Returns:
        None when the class constructs and is a `BaseAgent`; otherwise the root cause's type and
        message (`AgentImportError` when the host died without saying).

    Raises:
        InfrastructureFailure: no host could be started, or the host could not import Harbor or
            read the checkout (before any candidate code ran).
    """
    try:
        host = await launcher.spawn()
    except (OSError, RuntimeError) as exc:
        raise InfrastructureFailure(f"no candidate host could be started ({type(exc).__name__})") from None
    try:
        assert host.pipe is not None
        reader, raw_writer = await asyncio.open_connection(sock=host.pipe, limit=1 << 16)
        host.pipe = None
        writer = FrameWriter(raw_writer)
        try:
            await writer.send(
                {
                    "op": "init",
                    "import_path": run.runtime.agent_import_path,
                    "candidate_dir": str(run.candidate_dir.absolute()),
                    "kwargs": {},
                    "probe_paths": [str(run.cases_dir.absolute()), str(run.jobs_dir.absolute())],
                }
            )
            header, _ = await read_frame(reader, 0)
        except (asyncio.IncompleteReadError, ConnectionError, FrameError):
            raise InfrastructureFailure("the candidate host ended before it could import Harbor") from None
        if header.get("op") == "host-error":
            raise InfrastructureFailure(f"the candidate host cannot run: {str(header.get('reason'))[:100]}")
        if header.get("op") != "hello":
            raise InfrastructureFailure("the candidate host did not start")
        # Only a host of its own uid can be kept out of the harness paths; one running as the caller
        # (not isolated: the launcher has said so, unless isolation was asked off) reads them anyway.
        if header.get("exposed") and launcher.isolated:
            logger.warning(
                "evaluation %s: candidate hosts can read %d harness path(s) (the cases or the jobs "
                "dir): make them unreadable to other users, or the file boundary does not hold",
                run.evaluation_id,
                len(header["exposed"]),
            )
        try:
            header, _ = await read_frame(reader, 0)
        except (asyncio.IncompleteReadError, ConnectionError, FrameError):
            return PreflightFailure(_FAILED_WITHOUT_TYPE, "the candidate host ended while importing the agent class")
        if header.get("op") == "ready":
            with contextlib.suppress(Exception):
                await writer.send({"op": "exit"})
            return None
        exception_type = str(header.get("exception_type") or _FAILED_WITHOUT_TYPE)
        return PreflightFailure(
            exception_type if exception_type.isidentifier() else _FAILED_WITHOUT_TYPE,
            str(header.get("message") or "")[:2000],
        )
    finally:
        await host.finish(grace_sec=1.0)
