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
ATTACKS_TEMPLATE = r"""
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

# Late intake: a process left running in main keeps submitting straight over HTTP (a commit of the
# probe's tree) and holds one CLI submit and one CLI eval at a proxy of its own until it sees intake
# closed, then lets both through: each kind's refusal and its exit code then cost one round trip
# after the close, not a CLI start (Harbor stops main soon after its close hook; under load there
# was room for one CLI start only). Before the agent ends it takes every ephemeral port of main
# (the outside attacker's way to make the close hook's TCP connection fail) and goes on over
# connections it opened before. Every attempt is logged where Harbor collects main's artifacts.
late=$(git commit-tree "$probe^{tree}" -p "$probe" -m "late: the probe's tree, submitted after the agent ended")
out late_commit "$late"
cat > /tmp/late.py <<'PY'
LATE_PY
PY
setsid python3 /tmp/late.py "$late" > /tmp/late.out 2>&1 < /dev/null &
# Both CLI requests are held at the proxy before the agent ends, so their start-up is behind them.
for i in $(seq 600); do [ -e /tmp/late-ready ] && break; sleep 0.1; done
out late_started "$([ -e /tmp/late-ready ] && echo yes || echo no)"
"""


LATE_PY = r"""
# The process the hostile agent leaves in main (standard library only): argv[1] is the commit to submit.
import http.client
import json
import os
import queue
import resource
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

LOG = "/logs/artifacts/late.log"
LATE = sys.argv[1]
SIDECAR = urlsplit(os.environ["VERO_SIDECAR_URL"])
closed = threading.Event()
held = threading.Semaphore(0)
lock = threading.Lock()


def log(what, t0, t1, code, text):
    line = f"{what} {t0:.6f} {t1:.6f} {code} {' '.join(text.split())[:200]}\n"
    with lock, open(LOG, "a") as f:
        f.write(line)


def connect():
    conn = http.client.HTTPConnection(SIDECAR.hostname, SIDECAR.port or 80, timeout=60)
    conn.connect()
    return conn


# Connections opened before the ports are taken (below) and kept alive: no new one can be made after.
pool = queue.Queue()
for _ in range(5):
    pool.put(connect())


def send(method, path, body=None):
    conn = pool.get()
    try:
        conn.request(method, path, body=body, headers={"content-type": "application/json"})
        answer = conn.getresponse()
        return answer.status, answer.getheader("content-type", "application/json"), answer.read()
    finally:
        pool.put(conn)


def keep_alive():
    # Under uvicorn's keep-alive timeout (5 s) on every pooled connection (the queue rotates them).
    while True:
        for _ in range(pool.qsize() or 1):
            try:
                send("GET", "/health")
            except OSError:
                pass
        time.sleep(0.5)


PER_PROCESS = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
HELD = []


def hold_ports(low, high):
    # A child process binds a socket on each port of [low, high] it can and holds them (one process
    # per share: main's open-file limit is below the number of ephemeral ports); returns how many.
    read, write = os.pipe()
    if os.fork() == 0:
        os.close(read)
        resource.setrlimit(resource.RLIMIT_NOFILE, (PER_PROCESS, PER_PROCESS))
        taken = []
        for port in range(low, high + 1):
            sock = socket.socket()
            try:
                sock.bind(("0.0.0.0", port))
            except OSError:
                sock.close()
                continue
            taken.append(sock)
        os.write(write, f"{len(taken)}\n".encode())
        time.sleep(3600)
        os._exit(0)
    os.close(write)
    return int(os.read(read, 64) or b"0")


def take_ephemeral_ports():
    # What the outside attacker did: a bound socket on every ephemeral port of main's network
    # namespace, so nothing in main (root's hook included) can open a TCP connection. Logged with a
    # probe connection, which must fail for the attack to be in effect.
    low, high = map(int, open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
    share = PER_PROCESS - 64  # the files a child inherits, with room to spare
    taken = sum(hold_ports(start, min(start + share - 1, high)) for start in range(low, high + 1, share))
    # A port a connection of main already uses (to this proxy, say) cannot be bound, yet a new
    # connection to the sidecar may share it: so open and keep connections to the sidecar until
    # none can be made. The last attempt is the probe.
    for _ in range(1000):
        t0 = time.time()
        try:
            HELD.append(connect())
            code, text = 0, "connected"
        except OSError as exc:
            code, text = exc.errno or -1, repr(exc)
            break
    log(
        "probe/connect",
        t0,
        time.time(),
        code,
        f"{taken} of {high - low + 1} ports bound, {len(HELD)} more held by connections; {text}",
    )


class Hold(BaseHTTPRequestHandler):
    # Passes reads through; holds each POST until intake is seen closed, then forwards it.

    def do_GET(self):
        self.relay(None)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        held.release()
        closed.wait()
        self.relay(body)

    def relay(self, body):
        status, kind, data = send(self.command, self.path, body)
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def cli(*argv):
    env = dict(os.environ, VERO_SIDECAR_URL=f"http://127.0.0.1:{proxy.server_address[1]}")
    t0 = time.time()
    done = subprocess.run(["vero", "harbor", *argv], env=env, capture_output=True, text=True)
    log(f"cli/{argv[0]}", t0, time.time(), done.returncode, done.stderr)


proxy = ThreadingHTTPServer(("127.0.0.1", 0), Hold)
threading.Thread(target=proxy.serve_forever, daemon=True).start()
clis = [
    threading.Thread(target=cli, args=args)
    for args in (("submit", "--version", LATE), ("eval", "--partition", "holdout"))
]
for thread in clis:
    thread.start()
for thread in clis:
    held.acquire()
threading.Thread(target=keep_alive, daemon=True).start()
take_ephemeral_ports()
open("/tmp/late-ready", "w").close()
end = time.time() + 600
while time.time() < end:  # until Harbor stops main
    t0 = time.time()
    try:
        status, _, data = send("POST", "/submissions", json.dumps({"version": LATE}).encode())
        text = data.decode(errors="replace")
    except OSError as exc:
        status, text = 0, repr(exc)
    log("http/submit", t0, time.time(), status, text)
    if "intake_closed" in text:
        closed.set()
    time.sleep(0.05)
"""
ATTACKS = ATTACKS_TEMPLATE.replace("LATE_PY", LATE_PY)


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
