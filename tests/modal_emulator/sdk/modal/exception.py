"""`modal.exception` of the emulator's client: the names Harbor 0.26 and vero catch or may meet.

The tree follows Modal's (`modal.exception`): every error is a `modal.exception.Error`; sandbox
filesystem errors derive from `SandboxFilesystemError`. The service sends an error as
`{"error": <class name>, "message": ...}` and the client raises the class of that name.
"""

from __future__ import annotations

import builtins


class Error(Exception):
    """Base of every error the emulator's client raises."""


class AuthError(Error):
    """The token pair is missing or wrong (checked on every call)."""


class NotFoundError(Error):
    """The object (app, sandbox, secret, volume, image) does not exist."""


class AlreadyExistsError(Error):
    """A running sandbox of the same app already has that name."""


class InvalidError(Error):
    """The call cannot succeed as made (bad arguments)."""


class InternalError(Error):
    """The service failed (a Docker error, an image that did not build)."""


class NotSupportedError(Error, NotImplementedError):
    """A Modal feature the emulator does not emulate (it says so instead of pretending)."""


class ConnectionError(Error, builtins.ConnectionError):
    """The service cannot be reached."""


class SandboxTerminatedError(Error):
    """`Sandbox.wait(raise_on_termination=True)` on a sandbox that was terminated."""


class SandboxTimeoutError(Error):
    """`Sandbox.wait(raise_on_termination=True)` on a sandbox that ran out of its lifetime."""


class ImageBuildError(Error):
    """An image did not build."""


class SandboxFilesystemError(Error):
    """Base of `Sandbox.filesystem` errors."""


class SandboxFilesystemNotFoundError(SandboxFilesystemError, FileNotFoundError):
    """The path does not exist in the sandbox."""


class SandboxFilesystemNotADirectoryError(SandboxFilesystemError, NotADirectoryError):
    """A path that should be a directory is not one."""


class SandboxFilesystemIsADirectoryError(SandboxFilesystemError, IsADirectoryError):
    """A path that should be a file is a directory."""


__all__ = [
    "AlreadyExistsError",
    "AuthError",
    "ConnectionError",
    "Error",
    "ImageBuildError",
    "InternalError",
    "InvalidError",
    "NotFoundError",
    "NotSupportedError",
    "SandboxFilesystemError",
    "SandboxFilesystemIsADirectoryError",
    "SandboxFilesystemNotADirectoryError",
    "SandboxFilesystemNotFoundError",
    "SandboxTerminatedError",
    "SandboxTimeoutError",
]
