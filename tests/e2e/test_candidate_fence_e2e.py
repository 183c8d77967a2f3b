"""A `kind: agent` candidate host's network is fenced in the compiled sidecar container, on Docker.

`tasks/puzzle-agent` (a `kind: agent` target) is compiled; its compose file must give `eval-sidecar`
`CAP_NET_ADMIN` (and the verifier's too), and its sidecar image is built as Compose builds it (the
layer cache the examples' runs leave). Two containers of that image go on a network of their own,
as `main` and `eval-sidecar` are on the task's: one stands in for `main` (`fence/main_side.py`: a
TCP and a UDP listener, what a coding agent would run to receive a leak), the other runs, as root
with the compose file's capabilities, the real `NetworkFence`, the real inference gateway and the
real `CandidateLauncher` (`fence/scenario.py`), whose candidate host runs the hostile
`agents/fence_candidate.py`.

What it must show:
1. root, whom the fence leaves alone, reaches `main` over TCP and UDP, resolves its name and reaches
   a loopback listener: the targets are there (the control);
2. the candidate's call to its own gateway answers 200, while its TCP and UDP to `main`, ICMP, the
   loopback listener, the API port, DNS, IPv6 loopback and an IPv4-mapped address all fail, and
   nothing it sent arrives in `main`;
3. from `main`, the candidate's TCP listener (backlog 0) and UDP port look exactly like a port
   nobody holds (each probe times out), the candidate accepts and receives nothing, and the
   sidecar-style API port still answers;
4. without `CAP_NET_ADMIN` the fence is not installed and says why (the evaluation would fail
   closed, `FenceUnavailable`), and without `CAP_SYS_ADMIN` the launcher does not open
   (`NamespacesUnavailable`, naming it);
5. each host is in namespaces of its own (`vero.harbor.boundary.namespaces`, with the compose
   file's `CAP_SYS_ADMIN`): the first host leaves a marker in `/tmp`, `/var/tmp`, `/dev/shm`, a
   POSIX queue, a SysV segment and an abstract unix socket and sees them (the control), while a
   host alive at the same time and a later one find none of them (nor does root in the real
   `/tmp`, `/var/tmp`, `/dev/shm`); every host is pid 1 of its own pid namespace and sees only its
   own processes, has only a loopback, cannot read `/workspace` or `/vero/context` (planted
   readable by anyone, as their volumes come), and holds no capability (CapEff, CapPrm, CapBnd,
   CapAmb 0, `no_new_privs`);
6. no host reads the kernel's live counters (`/proc/sys/kernel/pty/nr`, `fs/aio-nr`, `fs/file-nr`,
   `/proc/loadavg`, `/proc/stat`, `/proc/meminfo`) or the sidecar's memory cgroup (its high-water
   mark), which root in the container reads, and an ordinary Python program still runs there.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml

from vero.compiler import compile_task

from ._examples import TASKS_DIR, compose_build, harbor_env, remove_images, secret_env

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1500)]

HERE = Path(__file__).resolve().parent
MAIN_TCP, MAIN_UDP, LOOPBACK, API, LISTEN_TCP, LISTEN_UDP, NOBODY = 9999, 9998, 8124, 8000, 7777, 7777, 7775


def _docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=check)


def test_candidate_host_reaches_only_its_gateway_in_the_compiled_sidecar(tmp_path: Path) -> None:
    layout = compile_task(TASKS_DIR / "puzzle-agent" / "build.yaml", tmp_path / "task").layout
    sidecar = yaml.safe_load(layout.compose_path.read_text())["services"]["eval-sidecar"]
    assert sidecar.get("cap_add") == ["NET_ADMIN", "SYS_ADMIN"], sidecar
    verifier = yaml.safe_load(layout.verifier_compose_path.read_text())["services"]["main"]
    assert verifier.get("cap_add") == ["NET_ADMIN", "SYS_ADMIN"], verifier
    project = f"vero-e2e-fence-{uuid.uuid4().hex[:8]}"
    image, network = f"{project}-eval-sidecar", f"{project}-net"
    main, side = f"{project}-main", f"{project}-side"
    mounts = ["-v", f"{HERE / 'fence'}:/opt/fence-scenario:ro", "-v", f"{HERE / 'agents'}:/opt/fence:ro"]
    try:
        compose_build(layout.compose_path, project, {**harbor_env(), **secret_env("puzzle-agent")}, timeout_sec=1200)
        _docker("network", "create", network)
        _docker(
            "run", "-d", "--name", main, "--network", network, *mounts, image,
            "python", "/opt/fence-scenario/main_side.py", "listen", str(MAIN_TCP), str(MAIN_UDP),
        )  # fmt: skip
        main_ip = _docker("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", main).stdout
        targets = {
            "main": main_ip.strip(), "main_name": main, "main_tcp": MAIN_TCP, "main_udp": MAIN_UDP,
            "loopback": LOOPBACK, "api": API, "listen_tcp": LISTEN_TCP, "listen_udp": LISTEN_UDP,
        }  # fmt: skip
        capabilities = [f"--cap-add={cap}" for cap in sidecar["cap_add"]]
        scenario = subprocess.Popen(
            [
                "docker", "run", "--rm", "--init", "--name", side, "--network", network, *capabilities, *mounts,
                image, "python", "/opt/fence-scenario/scenario.py", "fenced", json.dumps(targets),
            ],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert scenario.stdout is not None
            line = scenario.stdout.readline()
            assert line.strip() == "LISTENING", line + scenario.stderr.read()[-3000:]  # type: ignore[union-attr]
            side_ip = _docker("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", side).stdout
            probe = _docker(
                "exec", main, "python", "/opt/fence-scenario/main_side.py", "probe", side_ip.strip(),
                str(LISTEN_TCP), str(NOBODY), str(API),
            )  # fmt: skip
            out, err = scenario.communicate(timeout=600)
        finally:
            if scenario.poll() is None:
                scenario.kill()
        assert scenario.returncode == 0, out[-3000:] + err[-3000:]
        result = json.loads(out.strip().splitlines()[-1])
        received = [json.loads(x) for x in _docker("logs", main).stdout.splitlines() if x.startswith("{")]
        unfenced = subprocess.run(
            ["docker", "run", "--rm", *mounts, image, "python", "/opt/fence-scenario/scenario.py", "install"],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
    finally:
        for container in (side, main):
            _docker("rm", "-f", container, check=False)
        _docker("network", "rm", network, check=False)
        remove_images([image, f"{project}-main"])

    # 1. The control: the targets are reachable for whoever the fence does not confine.
    control = result["control"]
    assert control["main_tcp"] == control["loopback_tcp"] == "connected" and control["main_udp"] == "sent", control
    assert control["dns"] == targets["main"], control
    assert any(r.get("tcp") == "CONTROL" for r in received) and any(r.get("udp") == "CONTROL" for r in received)

    # 2. The candidate: its gateway works, nothing else does, and nothing of it reached `main`.
    candidate = result["candidate"]
    print(f"\n[e2e] candidate host behind the fence: {candidate}")
    assert result["isolated"] is True and int(candidate["uid"]) >= 52000, candidate
    assert candidate["gateway"] == "200 gpt-4o-mini", candidate
    for attack in (
        "main_tcp", "main_udp", "main_icmp", "loopback_tcp", "api_tcp", "dns", "ipv6_loopback", "ipv4_mapped",
    ):  # fmt: skip
        assert candidate[attack].startswith("denied"), (attack, candidate)
    # In its own network namespace 127.0.0.11 is its own loopback, where no resolver listens (the
    # lookup above fails); the datagram goes nowhere else.
    assert candidate["dns_udp"].startswith("denied") or candidate["dns_udp"] == "sent", candidate
    assert [r for r in received if "LEAK" in (r.get("tcp") or r.get("udp") or "")] == [], received

    # 3. From `main`, the candidate's ports are a port nobody holds; the API still answers.
    outcome = json.loads(probe.stdout.strip().splitlines()[-1])
    print(f"[e2e] main's probes of the sidecar: {outcome}")
    assert outcome[str(API)] == "connected", outcome
    for key in ("", "_udp"):
        assert outcome[f"{LISTEN_TCP}{key}"] == outcome[f"{NOBODY}{key}"] == "TimeoutError", outcome
    assert candidate["listen"] == {"tcp_accepted": 0, "udp_received": 0}, candidate

    # 4. No CAP_NET_ADMIN: no fence; no CAP_SYS_ADMIN: no launcher; each names its cause.
    refused = json.loads(unfenced.stdout.strip().splitlines()[-1])
    assert refused["installed"] is False and "CAP_NET_ADMIN" in refused["error"], refused
    assert refused["namespaces"] is False and "CAP_SYS_ADMIN" in refused["namespaces_error"], refused

    # 5. One host's leftovers reach neither a host beside it nor a later one; each sees only itself.
    first, concurrent, later = candidate["namespace"], result["concurrent"], result["later"]
    print(f"[e2e] hosts' views: first {first}\n  concurrent {concurrent}\n  later {later}")
    marker = next(name for name in first["listings"]["/tmp"] if name.startswith("vero-marker-"))
    assert all(marker in first["listings"][p] for p in ("/tmp", "/var/tmp", "/dev/shm")), first
    assert first["mqueue"] >= 0 and first["shm_key"] >= 0 and first["sysv"][0], first
    assert first["unix_names"] and first["abstract_connect"] == "connected", first
    assert result["first_alive"] is True, result  # the concurrent host looked while the first held them
    assert result["real"] == {"/tmp": [], "/var/tmp": [], "/dev/shm": []}, result["real"]
    for seen in (concurrent, later):
        assert "stderr" not in seen, seen
        assert not any(marker in name for names in seen["listings"].values() for name in names or []), seen
        assert seen["sysv"] == [[], [], []] and seen["shm_key"] == -1 and seen["mqueue"] == -1, seen
        assert seen["unix_names"] == [] and seen["abstract_connect"] == "ConnectionRefusedError", seen
    for seen in (first, concurrent, later):
        assert seen["pid"] == 1 and seen["foreign_pids"] == [] and len(seen["pids"]) <= 4, seen
        status = seen["status"]
        assert {status[k] for k in ("CapEff", "CapPrm", "CapBnd", "CapAmb")} == {"0000000000000000"}, status
        assert status["NoNewPrivs"] == "1", status
        assert seen["interfaces"] == ["lo"] and seen["hostname"] == "vero-candidate", seen
        trusted = {"/workspace", "/vero/context", "/workspace/secret.txt", "/vero/context/secret.txt"}
        assert set(seen["readable"]) == set(result["hidden"]) == trusted, seen
        assert all(answer.startswith("refused") for answer in seen["readable"].values()), seen
        # No global live counter of the kernel, no cgroup of the sidecar (root reads them: the
        # control below); an ordinary Python program (CPU count, a process pool, a child) runs.
        assert all(a == "read: " or a.startswith("refused") for a in seen["kernel"].values()), seen["kernel"]
        assert seen["sys_dir"] == "listed: devices" and seen["python"].endswith(" [0, 1, 2, 3] 42"), seen
    kernel = result["kernel"]
    assert kernel["/proc/sys/kernel/pty/nr"].isdigit() and kernel["/proc/sys/fs/aio-nr"].isdigit(), kernel
    assert any((kernel[p] or "").isdigit() for p in kernel if p.startswith("/sys/fs/cgroup/")), kernel
    assert len({first["uid"], concurrent["uid"], later["uid"]}) == 3
