"""The Modal emulator itself: the SDK surface Harbor 0.26 and vero call, against the control service
and real containers, and its refusals. (Its DinD sandboxes and the whole Modal path are exercised by
`tests/e2e/test_modal_emulated_e2e.py`.)

Every client runs in its own process with `PYTHONPATH` naming the emulator's `modal` package, as the
host's `harbor run` does; this process never imports it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from modal_emulator import ModalEmulator

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]

IMAGE = "python:3.13-slim"


@pytest.fixture(scope="module")
def emulator():
    with ModalEmulator(preload=()) as emu:
        yield emu


def client(emulator: ModalEmulator, code: str, **env: str) -> dict:
    """Run `code` (which sets `out`, a JSON-able dict) as a client process; `out`."""
    script = "import json, modal, os, pathlib, tempfile, time\nout = {}\n" + textwrap.dedent(code)
    script += "\nprint(json.dumps(out))"
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, **emulator.env(), **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_call_needs_the_token_pair(emulator):
    refused_before = emulator.service.refused_calls
    out = client(
        emulator,
        """
        for name, value in (("MODAL_TOKEN_SECRET", "as-wrong"), ("MODAL_TOKEN_ID", "")):
            saved = os.environ[name]
            os.environ[name] = value
            try:
                modal.App.lookup("__harbor__", create_if_missing=True)
                out[name] = "accepted"
            except modal.exception.AuthError:
                out[name] = "refused"
            try:
                list(modal.Sandbox.list(app_id=None))
                out[name + "_list"] = "accepted"
            except modal.exception.AuthError:
                out[name + "_list"] = "refused"
            os.environ[name] = saved
        out["with_the_pair"] = bool(modal.App.lookup("__harbor__", create_if_missing=True).app_id)
        """,
    )
    assert out == {
        "MODAL_TOKEN_SECRET": "refused",
        "MODAL_TOKEN_SECRET_list": "refused",
        "MODAL_TOKEN_ID": "refused",
        "MODAL_TOKEN_ID_list": "refused",
        "with_the_pair": True,
    }
    assert emulator.service.refused_calls - refused_before == 4


def test_a_sandbox_runs_commands_moves_files_and_ends(emulator):
    out = client(
        emulator,
        f"""
        app = modal.App.lookup("emu-test", create_if_missing=True)
        image = modal.Image.from_registry("{IMAGE}")
        sandbox = modal.Sandbox.create(
            "sh", "-c", "sleep infinity", app=app, image=image, timeout=600, name="one",
            tags={{"vero.session": "ses-0000000000000001", "vero.job": "ev-1"}},
            secrets=[modal.Secret.from_dict({{"SANDBOX_VAR": "from-create"}})],
        )
        try:
            modal.Sandbox.create("sleep", "1", app=app, image=image, name="one")
            out["same_name"] = "accepted"
        except modal.exception.AlreadyExistsError:
            out["same_name"] = "refused"
        p = sandbox.exec("bash", "-c", 'echo "$SANDBOX_VAR $EXEC_VAR"; echo oops >&2; exit 7',
                         secrets=[modal.Secret.from_dict({{"EXEC_VAR": "from-exec"}})], text=False)
        out["exec"] = [p.stdout.read().decode(), p.stderr.read().decode(), p.wait()]
        started = time.monotonic()
        p = sandbox.exec("bash", "-c", "sleep 120 & echo $! > /tmp/child; sleep 120", timeout=2)
        out["timed_out"] = [p.wait(), time.monotonic() - started < 60]
        p = sandbox.exec("bash", "-c", 'kill -0 "$(cat /tmp/child)" 2>/dev/null && echo alive || echo gone')
        out["child_after_timeout"] = p.stdout.read().strip()
        local = pathlib.Path(tempfile.mkdtemp()) / "in.bin"
        local.write_bytes(bytes(range(256)) * 1000)
        sandbox.filesystem.copy_from_local(local, "/opt/deep/er/in.bin")
        back = local.with_name("back.bin")
        sandbox.filesystem.copy_to_local("/opt/deep/er/in.bin", back)
        out["round_trip"] = back.read_bytes() == local.read_bytes()
        out["listed"] = sandbox.filesystem.list_files("/opt/deep/er")
        for path, name in (("/opt/deep/er/in.bin", "file"), ("/no/such", "missing")):
            try:
                sandbox.filesystem.list_files(path)
                out[name] = "listed"
            except modal.exception.SandboxFilesystemNotADirectoryError:
                out[name] = "not a directory"
            except modal.exception.SandboxFilesystemNotFoundError:
                out[name] = "not found"
        found = modal.Sandbox.list(app_id=app.app_id, tags={{"vero.job": "ev-1"}})
        out["listed_by_tag"] = [s.object_id for s in found] == [sandbox.object_id]
        out["other_tag"] = [s.object_id for s in modal.Sandbox.list(app_id=app.app_id, tags={{"vero.job": "ev-2"}})]
        out["running_poll"] = sandbox.poll()
        sandbox.terminate()
        out["after_terminate"] = [sandbox.poll(), [s.object_id for s in modal.Sandbox.list(app_id=app.app_id)]]
        try:
            sandbox.wait(raise_on_termination=True)
        except modal.exception.SandboxTerminatedError:
            out["wait_raises"] = True
        short = modal.Sandbox.create("sh", "-c", "sleep infinity", app=app, image=image, timeout=3)
        short.wait(raise_on_termination=False)
        out["lifetime"] = short.returncode
        """,
    )
    assert out["same_name"] == "refused"
    assert out["exec"] == ["from-create from-exec\n", "oops\n", 7]
    assert out["timed_out"] == [-1, True] and out["child_after_timeout"] == "gone"
    assert out["round_trip"] is True and out["listed"] == ["in.bin"]
    assert out["file"] == "not a directory" and out["missing"] == "not found"
    assert out["listed_by_tag"] is True and out["other_tag"] == []
    assert out["running_poll"] is None
    assert out["after_terminate"] == [137, []] and out["wait_raises"] is True
    assert out["lifetime"] == 137
    ended = {r.name: r.ended_by for r in emulator.sandboxes() if r.app_id == emulator.service.apps["emu-test"]}
    assert ended["one"] == "terminate" and ended[None] == "timeout"
    assert emulator.running() == []


def test_what_the_emulator_cannot_do_is_refused_not_faked(emulator):
    out = client(
        emulator,
        f"""
        app = modal.App.lookup("emu-refusals", create_if_missing=True)
        image = modal.Image.from_registry("{IMAGE}")
        for name, kwargs in (
            ("gpu", {{"gpu": "A100:1"}}),
            ("idle", {{"idle_timeout": 30}}),
            ("allowlist", {{"outbound_domain_allowlist": ["pypi.org"], "outbound_cidr_allowlist": []}}),
            ("tunnel", {{"unencrypted_ports": [22]}}),
        ):
            try:
                modal.Sandbox.create("sleep", "60", app=app, image=image, **kwargs)
                out[name] = "accepted"
            except modal.exception.NotSupportedError:
                out[name] = "refused"
        try:
            modal.Image.from_registry("no-such-image:anywhere")._hydrate()
            out["unknown_image"] = "accepted"
        except modal.exception.InternalError as error:
            out["unknown_image"] = "registry" in str(error)
        try:
            modal.App.lookup("never-made")
            out["missing_app"] = "found"
        except modal.exception.NotFoundError:
            out["missing_app"] = "not found"
        """,
    )
    assert out == {
        "gpu": "refused",
        "idle": "refused",
        "allowlist": "refused",
        "tunnel": "refused",
        "unknown_image": True,
        "missing_app": "not found",
    }
    assert emulator.running() == []


def test_vero_terminates_an_interrupted_jobs_sandboxes_by_tag(emulator):
    """`vero.harbor.environments.modal.terminate_modal_sandboxes` (what the sidecar and the verifier run after
    a cancel, a timeout or a restart) through the SDK surface: only the job's own sandboxes end."""
    session, other = "ses-00000000000000aa", "ses-00000000000000bb"
    out = client(
        emulator,
        f"""
        import asyncio
        from vero.harbor.environments.modal import terminate_modal_sandboxes
        app = modal.App.lookup("__harbor__", create_if_missing=True)
        image = modal.Image.from_registry("{IMAGE}")
        made = {{}}
        for key, tags in (
            ("job1", {{"vero.session": "{session}", "vero.job": "ev-1"}}),
            ("job2", {{"vero.session": "{session}", "vero.job": "ev-2"}}),
            ("other", {{"vero.session": "{other}", "vero.job": "ev-1"}}),
            ("untagged", {{}}),
        ):
            made[key] = modal.Sandbox.create("sh", "-c", "sleep infinity", app=app, image=image, tags=tags, timeout=600)
        out["job"] = asyncio.run(terminate_modal_sandboxes(session="{session}", job="ev-1"))
        out["after_job"] = {{k: s.poll() for k, s in made.items()}}
        out["session"] = asyncio.run(terminate_modal_sandboxes(session="{session}"))
        out["after_session"] = {{k: s.poll() for k, s in made.items()}}
        for sandbox in made.values():
            sandbox.terminate()
        """,
    )
    assert out["job"] == 1 and out["after_job"] == {"job1": 137, "job2": None, "other": None, "untagged": None}
    assert out["session"] == 1 and out["after_session"] == {"job1": 137, "job2": 137, "other": None, "untagged": None}
    assert emulator.running() == []
