"""The emulator client's transport: one HTTP call per SDK call, the token pair on every one.

Configuration is read from the environment at each call, as Modal's client reads its own:
`MODAL_SERVER_URL` (where the emulator's control service listens; Modal's name for the API server),
`MODAL_TOKEN_ID` and `MODAL_TOKEN_SECRET` (sent as `x-modal-token-id` / `x-modal-token-secret`,
the metadata names Modal's client uses). An error answer names a class of `modal.exception`,
which is raised with its message.

Every SDK call has a blocking form and an `.aio` form (`_dual`), as Modal's methods do; the `.aio`
form runs the blocking one in a worker thread, so a cancelled caller leaves the call to finish
(like a remote call already sent).
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable
from typing import Any

import httpx

from modal import exception

_TIMEOUT = httpx.Timeout(connect=30.0, read=None, write=600.0, pool=30.0)


def _base_url() -> str:
    url = os.environ.get("MODAL_SERVER_URL", "").rstrip("/")
    if not url:
        raise exception.ConnectionError(
            "the Modal emulator's client needs MODAL_SERVER_URL (the control service's address)"
        )
    return url


def _headers() -> dict[str, str]:
    return {
        "x-modal-token-id": os.environ.get("MODAL_TOKEN_ID", ""),
        "x-modal-token-secret": os.environ.get("MODAL_TOKEN_SECRET", ""),
    }


def _raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        body = response.json()
        name, message = str(body["error"]), str(body["message"])
    except (ValueError, KeyError, TypeError):
        name, message = "InternalError", f"HTTP {response.status_code}: {response.text[:500]}"
    cls = getattr(exception, name, None)
    if not (isinstance(cls, type) and issubclass(cls, exception.Error)):
        cls = exception.InternalError
    raise cls(message)


def call(method: str, path: str, *, json: Any = None, content: bytes | None = None, params: Any = None) -> Any:
    """One request to the control service; the decoded JSON answer (or the raw bytes of an
    `application/octet-stream` answer).

    Raises:
        modal.exception.Error: the class the service named (`AuthError` for a bad token pair), or
            `ConnectionError` when the service cannot be reached.
    """
    try:
        with httpx.Client(base_url=_base_url(), timeout=_TIMEOUT, trust_env=False) as client:
            response = client.request(method, path, json=json, content=content, params=params, headers=_headers())
    except httpx.TransportError as exc:
        raise exception.ConnectionError(f"the Modal emulator is unreachable ({type(exc).__name__})") from None
    _raise_for(response)
    if response.headers.get("content-type", "").startswith("application/octet-stream"):
        return response.content
    return response.json()


class _Bound:
    """A method bound to its object (or class): call it, or await `.aio(...)`."""

    def __init__(self, fn: Callable[..., Any], target: Any) -> None:
        self._fn = fn
        self._target = target
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._fn(self._target, *args, **kwargs)

    async def aio(self, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(self._fn, self._target, *args, **kwargs)


class _dual:  # a decorator, like Modal's synchronicity wrappers: lower case
    """Decorator: a method callable as `obj.m(...)` and `await obj.m.aio(...)`; on the class
    (`Sandbox.create`) the class itself is the first argument."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self._fn = fn

    def __get__(self, obj: Any, owner: type | None = None) -> _Bound:
        return _Bound(self._fn, obj if obj is not None else owner)


dual = _dual
