"""The Modal emulator's side of the local Docker engine: images, sandbox containers, their commands
and files, and the DinD slots.

- **Images.** The emulator's "registry" is the local engine: `from_registry(tag)` is the local
  image of that tag (no pull: no registry is reachable here), `docker:*-dind` is the emulator's
  stand-in (`dind/Dockerfile`: Debian's engine and Compose v2); `from_dockerfile` and
  `dockerfile_commands` are built by the engine's builder (the docker SDK; the CLI here has no
  BuildKit, so these builds have a cache of their own, warm after the first).
- **Sandboxes.** One container each, on the emulator's own bridge network (no traffic between
  sandboxes: `enable_icc=false`), labelled with the emulator instance and the sandbox's tags.
  A direct sandbox gets the emulator's client (`sdk/modal`) mounted read-only at `CLIENT_DIR` and
  first on `PYTHONPATH`, where a real sandbox would have the real SDK from the package index.
- **DinD sandboxes** (an image derived from the stand-in, with `runtime="vm"` or
  `experimental_options={"enable_docker": True}`, as Modal requires): every capability this engine
  grants (it refuses privileged containers: `CAP_SYS_RESOURCE` is not in its bounding set), no
  seccomp, all devices, the host's cgroup tree read-write, and `/var/lib/docker` on a **slot**: a
  named volume kept between sandboxes (one sandbox at a time per slot, by `flock` on a file in
  `SLOT_LOCK_DIR`, across every process of this machine), so the inner dockerd's images and build
  cache outlive a sandbox. Before a sandbox is handed over, what an earlier one left in the slot
  (containers, volumes, networks, images other than the preloaded ones) is removed, and the
  preloaded images are given to the inner dockerd (`docker save | docker load`, once per slot and
  image): the engine's image with the emulator's client added (`client_image`), under the
  engine's tag, since inner builds `FROM` it cannot pull.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import logging
import os
import signal
import subprocess
import tarfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import docker
from docker.errors import APIError, NotFound

logger = logging.getLogger("modal_emulator")

HERE = Path(__file__).resolve().parent
SDK_DIR = HERE / "sdk"
DIND_DIR = HERE / "dind"
CLIENT_DIR = "/opt/vero-modal-emulator"
"""Where sandboxes find the emulator's `modal` package."""
SLOT_LOCK_DIR = Path("/tmp/vero-modal-emulator-slots")
SLOT_VOLUME_PREFIX = "vero-modal-emulator-dind-"
RUNTIME_SLOTS = {"vm": 0, "gvisor": 1}
"""The slot a DinD sandbox of each runtime tries first (`acquire_slot`)."""
LABEL = "vero-modal-emulator"
TAG_LABEL_PREFIX = f"{LABEL}.tag."
# Every capability but CAP_SYS_RESOURCE, which this engine cannot grant (`--privileged` fails).
DIND_CAPABILITIES = (
    "CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP LINUX_IMMUTABLE "
    "NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER SYS_MODULE SYS_RAWIO SYS_CHROOT "
    "SYS_PTRACE SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE "
    "AUDIT_CONTROL SETFCAP MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ"
).split()


class EngineError(Exception):
    """A Docker operation of the emulator failed (the message is for the caller)."""


def _build(client: docker.DockerClient, context: bytes, tag: str, dockerfile: str = "Dockerfile") -> str:
    """Build a tar context with the engine's builder (the docker SDK's `images.build`); the image id.

    Raises:
        EngineError: with the tail of the build log.
    """
    from docker.errors import BuildError

    try:
        image, _ = client.images.build(
            fileobj=io.BytesIO(context), custom_context=True, dockerfile=dockerfile, tag=tag, rm=True, forcerm=True
        )
    except BuildError as exc:
        lines = [str(entry.get("stream") or entry.get("error") or "") for entry in exc.build_log]
        raise EngineError(f"the image did not build: {''.join(lines)[-1500:]}") from None
    except APIError as exc:
        raise EngineError(f"the image did not build: {exc.explanation or exc}") from None
    return image.id


def _dockerfile_context(dockerfile: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        data = dockerfile.encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _tree_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class Built:
    """An image the emulator can run: a local image id, and whether it is a DinD image."""

    ref: str
    dind: bool


class Engine:
    """The Docker side of one emulator instance (see the module docstring).

    Args:
        instance: the instance's id (names its network and labels its objects).
        preload: engine images given to every DinD sandbox's dockerd, with the client added.
        dns: resolvers the inner dockerds give their containers (default: the host's).
    """

    def __init__(self, instance: str, preload: Sequence[str] = ("python:3.13-slim",), dns: Sequence[str] = ()) -> None:
        self.instance = instance
        self.client = docker.from_env(timeout=600)
        self.api = self.client.api
        self.preload = tuple(preload)
        self.dns = tuple(dns) or _host_resolvers()
        self.network_name = f"vero-modal-emu-{instance}"
        self.network = self.client.networks.create(
            self.network_name,
            driver="bridge",
            options={"com.docker.network.bridge.enable_icc": "false"},
            labels={LABEL: instance},
        )
        self.network.reload()
        self.gateway = _gateway(self.network.attrs)
        self._tags: list[str] = []
        self._client_images: dict[str, str] = {}

    # -- images ---------------------------------------------------------------------------------

    def _tag(self, kind: str, key: str) -> str:
        tag = f"vero-modal-emu-{self.instance}/{kind}:{key}"
        self._tags.append(tag)
        return tag

    def dind_image(self) -> str:
        """The stand-in for `docker:*-dind` (built once; BuildKit's cache makes later builds free)."""
        tag = f"vero-modal-emulator/dind:{_tree_digest(DIND_DIR)}"
        try:
            return self.client.images.get(tag).id
        except NotFound:
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w") as archive:
                archive.add(DIND_DIR, arcname=".")
            return _build(self.client, buffer.getvalue(), tag)

    def registry(self, tag: str) -> Built:
        """`Image.from_registry(tag)`: the local image of that tag (`docker:*-dind`: the stand-in).

        Raises:
            EngineError: no local image has that tag (the emulator pulls nothing).
        """
        name = tag.split("@", 1)[0]
        if name.startswith("docker:") and "dind" in name:
            return Built(self.dind_image(), dind=True)
        try:
            return Built(self.client.images.get(tag).id, dind=False)
        except NotFound:
            raise EngineError(f"image {tag!r} is not in the emulator's registry (the local Docker engine)") from None

    def build_dockerfile(self, context: bytes) -> Built:
        """`Image.from_dockerfile`: `context` is a tar holding `.vero-emulator.Dockerfile`."""
        key = hashlib.sha256(context).hexdigest()[:16]
        tag = self._tag("dockerfile", key)
        return Built(_build(self.client, context, tag, dockerfile=".vero-emulator.Dockerfile"), dind=False)

    def build_commands(self, parent: Built, commands: Sequence[str]) -> Built:
        """`image.dockerfile_commands(...)`: the parent image and the commands, built."""
        dockerfile = f"FROM {parent.ref}\n" + "".join(f"{line}\n" for line in commands)
        tag = self._tag("commands", hashlib.sha256(dockerfile.encode()).hexdigest()[:16])
        return Built(_build(self.client, _dockerfile_context(dockerfile), tag), dind=parent.dind)

    def client_image(self, name: str) -> str:
        """`name` with the emulator's client added (for inner dockerds): its image id.

        The tag depends on the base image's id and the client's source only, so every emulator
        instance on this machine builds the same image, and a slot loads it once.
        """
        if name in self._client_images:
            return self._client_images[name]
        base = self.client.images.get(name)
        tag = (
            f"vero-modal-emulator/client:{hashlib.sha256((base.id + _tree_digest(SDK_DIR)).encode()).hexdigest()[:16]}"
        )
        try:
            image_id = self.client.images.get(tag).id
        except NotFound:
            env = dict(e.split("=", 1) for e in base.attrs["Config"].get("Env") or [])
            path = f"{CLIENT_DIR}:{env['PYTHONPATH']}" if env.get("PYTHONPATH") else CLIENT_DIR
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w") as archive:
                archive.add(SDK_DIR / "modal", arcname="modal", filter=_no_bytecode)
                dockerfile = f"FROM {base.id}\nCOPY modal {CLIENT_DIR}/modal\nENV PYTHONPATH={path}\n".encode()
                info = tarfile.TarInfo("Dockerfile")
                info.size = len(dockerfile)
                archive.addfile(info, io.BytesIO(dockerfile))
            image_id = _build(self.client, buffer.getvalue(), tag)
        self._client_images[name] = image_id
        return image_id

    # -- sandboxes ------------------------------------------------------------------------------

    def start(
        self,
        sandbox_id: str,
        image: Built,
        *,
        entrypoint: Sequence[str],
        env: Mapping[str, str],
        tags: Mapping[str, str],
        block_network: bool,
        docker_ok: bool,
        nano_cpus: int | None,
        mem_limit_mb: int | None,
        volumes: Mapping[str, str],
        workdir: str | None,
        slot: DindSlot | None,
    ) -> str:
        """Create and start one sandbox's container; its id.

        Raises:
            EngineError: Docker refused it.
        """
        labels = {LABEL: self.instance, f"{LABEL}.sandbox": sandbox_id}
        labels |= {TAG_LABEL_PREFIX + k: v for k, v in tags.items()}
        environment = dict(env)
        mounts = [docker.types.Mount(path, name, type="volume") for path, name in volumes.items()]
        kwargs: dict = {}
        if image.dind and docker_ok and slot is not None:
            mounts.append(docker.types.Mount("/var/lib/docker", slot.volume, type="volume"))
            mounts.append(docker.types.Mount("/sys/fs/cgroup", "/sys/fs/cgroup", type="bind"))
            kwargs.update(
                cap_add=DIND_CAPABILITIES,
                security_opt=["seccomp=unconfined", "apparmor=unconfined"],
                device_cgroup_rules=["a *:* rwm"],
            )
            environment["VERO_MODAL_EMULATOR_DNS"] = " ".join(self.dns)
        elif not image.dind:
            mounts.append(docker.types.Mount(CLIENT_DIR, str(SDK_DIR), type="bind", read_only=True))
            image_env = dict(
                e.split("=", 1) for e in self.client.images.get(image.ref).attrs["Config"].get("Env") or []
            )
            prior = environment.get("PYTHONPATH") or image_env.get("PYTHONPATH")
            environment["PYTHONPATH"] = f"{CLIENT_DIR}:{prior}" if prior else CLIENT_DIR
        if entrypoint:
            kwargs.update(entrypoint=[entrypoint[0]], command=list(entrypoint[1:]))
        try:
            container = self.client.containers.run(
                image.ref,
                detach=True,
                name=f"vero-modal-emu-{self.instance}-{sandbox_id}",
                labels=labels,
                environment=environment,
                network=None if block_network else self.network_name,
                network_mode="none" if block_network else None,
                mounts=mounts,
                nano_cpus=nano_cpus,
                mem_limit=f"{mem_limit_mb}m" if mem_limit_mb else None,
                working_dir=workdir,
                **kwargs,
            )
        except APIError as exc:
            raise EngineError(f"the sandbox's container did not start: {exc.explanation or exc}") from None
        return container.id

    def address(self, container_id: str) -> str | None:
        """The container's address on the emulator's network (None without a network)."""
        try:
            networks = self.api.inspect_container(container_id)["NetworkSettings"]["Networks"] or {}
        except (NotFound, APIError):
            return None
        return (networks.get(self.network_name) or {}).get("IPAddress") or None

    def wait_exit(self, container_id: str) -> int:
        """Block until the container exits; its exit status (137 when it is gone)."""
        try:
            return int(self.api.wait(container_id, timeout=None)["StatusCode"])
        except (NotFound, APIError):
            return 137
        except Exception:  # noqa: BLE001 - a broken wait stream: the container is gone for us
            return 137

    def remove(self, container_id: str) -> None:
        with contextlib.suppress(NotFound, APIError):
            self.api.remove_container(container_id, force=True, v=True)

    def exec(
        self,
        container_id: str,
        args: Sequence[str],
        *,
        env: Mapping[str, str],
        workdir: str | None,
        timeout_sec: float | None,
        stdin: bytes | None = None,
    ) -> tuple[int, bytes, bytes]:
        """Run a command in the container to its end: `(returncode, stdout, stderr)`.

        A command still running at `timeout_sec` is killed with everything it started (by host
        pid) and returns -1, as Modal's processes do.
        """
        try:
            created = self.api.exec_create(
                container_id, list(args), environment=dict(env), workdir=workdir, stdin=stdin is not None
            )
        except NotFound:
            raise EngineError("the sandbox is not running") from None
        except APIError as exc:
            raise EngineError(f"the command did not start: {exc.explanation or exc}") from None
        exec_id = created["Id"]
        result: dict = {}

        def run() -> None:
            try:
                if stdin is None:
                    result["out"] = self.api.exec_start(exec_id, demux=True)
                else:
                    sock = self.api.exec_start(exec_id, socket=True)
                    result["out"] = _talk(sock, stdin)
            except Exception as exc:  # noqa: BLE001 - reported as the command's failure
                result["error"] = exc

        import threading

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        worker.join(timeout_sec)
        timed_out = worker.is_alive()
        if timed_out:
            with contextlib.suppress(NotFound, APIError):
                _kill_tree(int(self.api.exec_inspect(exec_id)["Pid"]))
            worker.join(30)
        if "error" in result and not timed_out:
            raise EngineError(f"the command failed to run: {result['error']}")
        stdout, stderr = result.get("out") or (b"", b"")
        if timed_out:
            return -1, stdout or b"", stderr or b""
        try:
            code = self.api.exec_inspect(exec_id)["ExitCode"]
        except NotFound:
            code = 137
        return (137 if code is None else int(code)), stdout or b"", stderr or b""

    def put_file(self, container_id: str, path: str, data: bytes, mode: int) -> None:
        """Write one file (parents created, as Modal's `copy_from_local` does)."""
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode, info.mtime = len(data), mode, int(time.time())
            archive.addfile(info, io.BytesIO(data))
        try:
            self.api.put_archive(container_id, "/", buffer.getvalue())
        except NotFound:
            raise EngineError("the sandbox is not running") from None
        except APIError as exc:
            raise EngineError(f"cannot write {path}: {exc.explanation or exc}") from None

    def get_file(self, container_id: str, path: str) -> bytes | None:
        """One file's bytes; None when it does not exist.

        Raises:
            IsADirectoryError: it is a directory.
        """
        try:
            stream, stat = self.api.get_archive(container_id, path)
        except NotFound:
            return None
        if stat["mode"] & (1 << 31):  # Go's os.ModeDir
            raise IsADirectoryError(path)
        data = b"".join(stream)
        with tarfile.open(fileobj=io.BytesIO(data)) as archive:
            member = archive.next()
            if member is None:
                return b""
            if member.issym() or member.islnk():
                return self.get_file(container_id, str(Path(path).parent / member.linkname))
            extracted = archive.extractfile(member)
            return extracted.read() if extracted is not None else b""

    # -- DinD -----------------------------------------------------------------------------------

    def prepare_dind(self, container_id: str, timeout_sec: float = 120) -> None:
        """Wait for the inner dockerd, clear what earlier sandboxes left in the slot, and give it
        the preloaded images (see the module docstring).

        Raises:
            EngineError: the inner dockerd did not answer in time.
        """
        deadline = time.monotonic() + timeout_sec
        while True:
            code, _, err = self.exec(container_id, ["docker", "info"], env={}, workdir=None, timeout_sec=30)
            if code == 0:
                break
            if time.monotonic() > deadline:
                raise EngineError(f"the sandbox's dockerd did not start: {err.decode(errors='replace')[-500:]}")
            time.sleep(1)
        keep = " ".join(self.preload)
        script = (
            "docker ps -aq | xargs -r docker rm -f >/dev/null 2>&1; "
            "docker volume ls -q | xargs -r docker volume rm -f >/dev/null 2>&1; "
            "docker network prune -f >/dev/null 2>&1; "
            "docker images --format '{{.Repository}}:{{.Tag}} {{.ID}}' | while read -r name id; do "
            f'case " {keep} " in *" $name "*) ;; *) docker rmi -f "$id" >/dev/null 2>&1;; esac; done; '
            "docker builder prune -af --keep-storage 6gb >/dev/null 2>&1; true"
        )
        self.exec(container_id, ["sh", "-c", script], env={}, workdir=None, timeout_sec=300)
        for name in self.preload:
            image_id = self.client_image(name)
            code, out, _ = self.exec(
                container_id,
                ["docker", "image", "inspect", "-f", "{{.Id}}", name],
                env={},
                workdir=None,
                timeout_sec=60,
            )
            if code == 0 and out.decode().strip() == image_id:
                continue
            saved = subprocess.Popen(["docker", "save", image_id], stdout=subprocess.PIPE)
            loaded = subprocess.run(
                ["docker", "exec", "-i", container_id, "docker", "load", "-q"],
                stdin=saved.stdout,
                capture_output=True,
                timeout=900,
                check=False,
            )
            saved.wait(timeout=900)
            if loaded.returncode != 0 or saved.returncode != 0:
                raise EngineError(f"could not load {name} into the sandbox: {loaded.stderr.decode()[-500:]}")
            self.exec(container_id, ["docker", "tag", image_id, name], env={}, workdir=None, timeout_sec=60)

    def inner_services(self, container_id: str) -> dict[str, str]:
        """Compose service -> the id of its running inner container, in a DinD sandbox.

        Raises:
            EngineError: the inner `docker ps` failed or timed out (-1), or a service has two
                running containers; the message has its exit status and output.
        """
        code, out, err = self.exec(
            container_id,
            ["docker", "ps", "--format", '{{.ID}} {{.Label "com.docker.compose.service"}}'],
            env={},
            workdir=None,
            timeout_sec=300,
        )
        if code != 0:
            raise EngineError(f"the sandbox's docker ps exited {code}: {(err or out).decode(errors='replace')[-300:]}")
        services: dict[str, str] = {}
        for line in out.decode().splitlines():
            inner_id, _, service = line.partition(" ")
            if service in services:
                raise EngineError(f"service {service!r} has more than one running container: {out.decode()[-300:]}")
            if service:
                services[service] = inner_id
        return services

    def inner_exec(
        self,
        container_id: str,
        service: str,
        argv: Sequence[str],
        *,
        user: str | None = None,
        stdin: bytes = b"",
        inner_id: str | None = None,
    ) -> tuple[int, bytes, bytes]:
        """Run `argv` in the inner container of Compose service `service` of a DinD sandbox
        (`inner_id` if given: one of `inner_services`, looked up before a slow probe).

        Raises:
            EngineError: as `inner_services`, or no container of `service` is running.
        """
        if inner_id is None:
            running = self.inner_services(container_id)
            if service not in running:
                raise EngineError(f"no running container of service {service!r} (running: {sorted(running)})")
            inner_id = running[service]
        command = ["docker", "exec", "-i", *(["-u", user] if user else []), inner_id, *argv]
        return self.exec(container_id, command, env={}, workdir=None, timeout_sec=600, stdin=stdin)

    # -- teardown -------------------------------------------------------------------------------

    def close(self) -> None:
        """Remove what this instance made: its containers, network and image tags."""
        for container in self.client.containers.list(all=True, filters={"label": f"{LABEL}={self.instance}"}):
            self.remove(container.id)
        with contextlib.suppress(NotFound, APIError):
            self.network.remove()
        for tag in dict.fromkeys(self._tags):
            with contextlib.suppress(NotFound, APIError):
                self.client.images.remove(tag, noprune=True)


class DindSlot:
    """One slot: a named volume for an inner dockerd's `/var/lib/docker`, held with `flock`."""

    def __init__(self, index: int, handle: object) -> None:
        self.index = index
        self.volume = f"{SLOT_VOLUME_PREFIX}{index}"
        self._handle = handle

    def release(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.close()  # closing the file drops the lock


def acquire_slot(client: docker.DockerClient, prefer: int = 0, limit: int = 32) -> DindSlot:
    """Slot `prefer` if it is free, else the first free slot of this machine (its volume created if
    missing). The service prefers one slot per runtime (`RUNTIME_SLOTS`): the inner builds of the
    two runtimes are cached apart anyway (Harbor's gVisor overlay builds with `build.network: host`),
    so each slot keeps one runtime's cache warm, and a trial of each runtime can run at once.

    Raises:
        EngineError: every one of `limit` slots is held.
    """
    SLOT_LOCK_DIR.mkdir(mode=0o777, exist_ok=True)
    for index in dict.fromkeys([prefer, *range(limit)]):
        handle = (SLOT_LOCK_DIR / f"{index}.lock").open("a")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        slot = DindSlot(index, handle)
        try:
            client.volumes.get(slot.volume)
        except NotFound:
            client.volumes.create(slot.volume, labels={f"{LABEL}.slot": str(index)})
        return slot
    raise EngineError(f"all {limit} DinD slots are in use")


def _talk(sock: object, stdin: bytes) -> tuple[bytes, bytes]:
    """Send `stdin` to an exec's attached socket, close it for writing, read the multiplexed output."""
    import socket as socket_module
    import struct

    raw = getattr(sock, "_sock", sock)
    raw.sendall(stdin)
    with contextlib.suppress(OSError):
        raw.shutdown(socket_module.SHUT_WR)
    data = b""
    while chunk := raw.recv(65536):
        data += chunk
    raw.close()
    out, err, offset = b"", b"", 0
    while offset + 8 <= len(data):
        kind, size = struct.unpack(">BxxxL", data[offset : offset + 8])
        payload = data[offset + 8 : offset + 8 + size]
        if kind == 2:
            err += payload
        else:
            out += payload
        offset += 8 + size
    return out, err


def _kill_tree(pid: int) -> None:
    """SIGKILL `pid` and every descendant (host pids; a few passes against forks)."""
    for _ in range(3):
        victims = _descendants(pid) | {pid}
        for victim in victims:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(victim, signal.SIGKILL)
        time.sleep(0.1)


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    pending = [root]
    while pending:
        for child in children.get(pending.pop(), []):
            if child not in found:
                found.add(child)
                pending.append(child)
    return found


def _no_bytecode(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    return None if "__pycache__" in info.name or info.name.endswith(".pyc") else info


def _host_resolvers() -> tuple[str, ...]:
    try:
        lines = Path("/etc/resolv.conf").read_text().splitlines()
    except OSError:
        return ()
    servers = [line.split()[1] for line in lines if line.startswith("nameserver") and len(line.split()) > 1]
    return tuple(s for s in servers if not s.startswith("127."))


def _gateway(attrs: Mapping) -> str:
    """The host's address on a network (IPAM's gateway, else the subnet's first host)."""
    import ipaddress

    for config in (attrs.get("IPAM") or {}).get("Config") or []:
        if config.get("Gateway"):
            return str(config["Gateway"])
        if config.get("Subnet"):
            return str(next(ipaddress.ip_network(config["Subnet"]).hosts()))
    raise EngineError("the emulator's network has no subnet")


def labelled_containers(client: docker.DockerClient, instance: str) -> Iterator[object]:
    """The containers of one emulator instance."""
    yield from client.containers.list(all=True, filters={"label": f"{LABEL}={instance}"})
