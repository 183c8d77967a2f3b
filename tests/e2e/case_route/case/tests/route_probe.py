"""The case's side of the route check (tests/e2e/test_case_route_e2e.py), run by test.sh in `main`.

Prints one JSON line of checks, then `routed` when all hold, else `not routed`."""

import json
import os
import socket
import time
import urllib.error
import urllib.request
from urllib.parse import urlparse

BASE = os.environ.get("OPENAI_BASE_URL", "")
TOKEN = os.environ.get("OPENAI_API_KEY", "")


def chat(token: str) -> tuple[int, str]:
    body = {"model": "gpt-route", "max_tokens": 8, "messages": [{"role": "user", "content": "grade this"}]}
    headers = {"content-type": "application/json"} | ({"authorization": "Bearer " + token} if token else {})
    request = urllib.request.Request(BASE + "/chat/completions", json.dumps(body).encode(), headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.load(response)["choices"][0]["message"]["content"]
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except OSError as exc:
        return 0, type(exc).__name__


def user_simulator() -> dict:
    for _ in range(60):  # the service may still be starting
        try:
            with urllib.request.urlopen("http://usersim:8080/ask", timeout=40) as response:
                return json.load(response)
        except OSError:
            time.sleep(1)
    return {}


def port_open(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=5).close()
        return True
    except OSError:
        return False


checks = {
    "token_is_the_evaluations": TOKEN.startswith("vero-ev-"),
    "grader_call": chat(TOKEN) == (200, "ROUTED"),
    "user_simulator_call": user_simulator() == {"status": 200, "reply": "ROUTED"},
    "no_token_refused": chat("")[0] == 401,
    "sidecar_api_closed": not port_open(urlparse(BASE).hostname or "", 8000),
}
print(json.dumps(checks))
print("routed" if all(checks.values()) else "not routed")
