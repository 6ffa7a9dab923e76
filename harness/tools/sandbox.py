"""The sandbox every subprocess a tool starts runs in (DESIGN §8, Sandbox).

Permission patterns cannot stop what a command does once it runs (an interpreter runs any
code it is given), so the commands run under bubblewrap (``bwrap``), as Codex does on
Linux:

- ``workspace-write`` (the default): the whole filesystem read-only, the session
  directory writable except its ``.git``, a fresh tmpfs as ``/tmp``, no network unless
  the permission ``bash_network`` allows the command;
- ``read-only``: the same with the session directory read-only too;
- ``off``: the command runs as it is.

``.git`` stays read-only because a command that can write it can plant hooks, an
fsmonitor or a pager that the next ``git`` run executes: harness's own (the environment
block) or the user's. Only the session directory's own ``.git`` needs it: an enclosing
repository's is outside the directory, hence read-only already, and a repository nested
deeper is one harness never runs git in.

The command keeps harness's process-group design: bwrap is started in a new session of
its own (``start_new_session``), so it has no controlling terminal to inject keystrokes
into, and bwrap, its init and the command share that process group, which
``kill_process_group`` signals as a whole. ``--unshare-pid`` makes the kill complete: when
the namespace's init dies (with bwrap, through ``--die-with-parent``, or when the command
exits) the kernel kills everything left inside, even a process that left the group with
``setsid``.

Turning the network off does not cut Unix sockets: they are files, and a command that can
open harness's own socket can approve its own permission asks, and one that reaches a
container engine or the system bus can start anything outside the sandbox. So the
sandbox hides, wherever they exist: harness's home and socket (``hidden``, from the
config), the user's runtime directory (``$XDG_RUNTIME_DIR``: the session bus, user
services) and the container and system-bus sockets (``SYSTEM_SOCKETS``). Other sockets on
the filesystem stay reachable.

Whether bwrap works is probed once per binary; where it is missing or cannot build a
sandbox (no user namespaces), commands run unsandboxed and ``Sandbox.unavailable`` says
why, for the notice on stderr and the ``sandbox.unavailable`` event.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from harness.secrets import tool_environment

SandboxMode = Literal["workspace-write", "read-only", "off"]
SANDBOX_MODES: tuple[SandboxMode, ...] = ("workspace-write", "read-only", "off")
PROBE_SECONDS = 10.0

# Mounted for every sandboxed command, in this order: the later mounts go on top. Run as
# root, bwrap keeps every capability unless told otherwise, and with CAP_SYS_ADMIN a
# command simply remounts / read-write; and uid 0 may write /proc/sys (core_pattern runs a
# program as root on the host), which bwrap leaves writable in its fresh /proc.
_BASE = (
    "--ro-bind", "/", "/",
    "--dev", "/dev",
    "--proc", "/proc",
    "--ro-bind-try", "/proc/sys", "/proc/sys",
    "--tmpfs", "/tmp",
    "--unshare-pid",
    "--unshare-ipc",
    "--cap-drop", "ALL",
    "--die-with-parent",
)  # fmt: skip

# Sockets that hand out control of the machine: container engines, the system bus, systemd.
SYSTEM_SOCKETS = (
    "/run/docker.sock",
    "/run/containerd",
    "/run/podman",
    "/run/dbus",
    "/run/systemd/private",
    "/run/snapd.socket",
)

# What a command prints when the sandbox stopped it; only then does the result say why.
_READ_ONLY_TELLS = ("Read-only file system",)
_NETWORK_TELLS = (
    "Network is unreachable",
    "Temporary failure in name resolution",
    "Could not resolve host",
    "Name or service not known",
    "No address associated with hostname",
    "Connection refused",
)


def parse_sandbox_mode(value: str, source: str = "sandbox") -> SandboxMode:
    """``value`` as a mode; a ValueError naming ``source`` and the choices otherwise."""
    mode = value.strip().lower()
    if mode not in SANDBOX_MODES:
        choices = ", ".join(SANDBOX_MODES)
        raise ValueError(f"{source}={value!r}: expected one of {choices}")
    return mode


# Probes started ahead (``start_probe``), by bwrap's absolute path, until ``_probe`` reads
# them; and each path's answer, probed once per process.
_started: dict[str, subprocess.Popen[bytes]] = {}
_answers: dict[str, str | None] = {}


def start_probe(bwrap: str = "bwrap") -> None:
    """Start probing ``bwrap`` now; ``Sandbox.open`` takes the answer later.

    The probe is a bwrap process of its own (~10-20 ms, nearly all of it bwrap setting
    up namespaces, not ours): started before the imports that come before
    ``open_harness``, its wait overlaps them instead of adding to the start-up
    (``harness run`` calls this). Anything that goes wrong here is left for the probe
    proper to find and report.
    """
    path = shutil.which(bwrap)
    if path is None:
        return
    path = os.path.abspath(path)
    if path in _started or path in _answers:
        return  # already started, or already answered in this process
    try:
        _started[path] = _spawn_probe(path)
    except OSError:
        return


def _spawn_probe(path: str) -> subprocess.Popen[bytes]:
    """bwrap building a sandbox around ``true``: its exit and stderr are the answer."""
    return subprocess.Popen(
        [path, *_BASE, "--unshare-net", "true"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=tool_environment(),
    )


def _probe(path: str) -> str | None:
    """None when ``path`` can build a sandbox on this machine, else why it cannot."""
    if path not in _answers:
        _answers[path] = _run_probe(path)
    return _answers[path]


def _run_probe(path: str) -> str | None:
    started = _started.pop(path, None)
    try:
        if started is None:
            started = _spawn_probe(path)
        with started:
            try:
                _, stderr = started.communicate(timeout=PROBE_SECONDS)
            except subprocess.TimeoutExpired:
                started.kill()
                started.communicate()
                return f"{path} did not answer within {PROBE_SECONDS:.0f} s"
    except OSError as error:
        return f"{path} could not be started: {error.strerror or error}"
    if started.returncode != 0:
        lines = stderr.decode("utf-8", "replace").strip().splitlines()
        detail = lines[-1] if lines else f"exit code {started.returncode}"
        return f"{path} cannot build a sandbox here: {detail}"
    return None


def probe(bwrap: str = "bwrap") -> tuple[str | None, str | None]:
    """``(absolute path, None)`` when bubblewrap works, else ``(path or None, reason)``."""
    path = shutil.which(bwrap)
    if path is None:
        return None, f"bubblewrap ({bwrap}) was not found"
    return path, _probe(os.path.abspath(path))


@dataclass(frozen=True, slots=True)
class Launch:
    """How to start a command: the argv to exec, its environment, the fds it inherits."""

    argv: list[str]
    env: dict[str, str]
    pass_fds: tuple[int, ...] = ()


class StatusPipe:
    """Where bwrap says which process is the sandbox's init (``--json-status-fd``).

    bwrap exits as soon as its init reports the command's exit status, while the kernel is
    still emptying the PID namespace; the caller's kill would find the group alive and
    signal and poll it. Waiting for the init itself to exit is exact: the kernel has
    killed and reaped everything else in the namespace by then.
    """

    def __init__(self) -> None:
        self.read_end, self.write_end = os.pipe()
        os.set_blocking(self.read_end, False)

    def close_write_end(self) -> None:
        if self.write_end >= 0:
            os.close(self.write_end)
            self.write_end = -1

    def init_pid(self) -> int | None:
        """The init's pid, once bwrap has written it (it does before the command runs)."""
        try:
            data = os.read(self.read_end, 4096)
        except OSError:
            return None
        for line in data.decode("utf-8", "replace").splitlines():
            try:
                pid = json.loads(line).get("child-pid")
            except (ValueError, AttributeError):
                continue
            if isinstance(pid, int) and pid > 1:
                return pid
        return None

    def close(self) -> None:
        self.close_write_end()
        if self.read_end >= 0:
            os.close(self.read_end)
            self.read_end = -1


@dataclass(frozen=True, slots=True)
class Sandbox:
    """The sandbox in effect for a harness; ``Sandbox()`` is none at all."""

    mode: SandboxMode = "off"  # what commands actually run under
    requested: SandboxMode = "off"
    bwrap: str | None = None
    unavailable: str | None = None  # why ``requested`` could not be had
    secret_env: tuple[str, ...] = ()  # credential names from config, on top of the known ones
    hidden: tuple[str, ...] = ()  # harness's own home and socket: invisible to commands

    @classmethod
    def open(
        cls,
        requested: SandboxMode,
        *,
        bwrap: str = "bwrap",
        secret_env: Iterable[str] = (),
        hidden: Iterable[str | Path] = (),
    ) -> Sandbox:
        """The sandbox ``requested``, or ``off`` with the reason where bwrap does not work."""
        secrets = tuple(secret_env)
        if requested == "off":
            return cls(secret_env=secrets)
        masked = tuple(str(path) for path in hidden)
        path, reason = probe(bwrap)
        if reason is not None or path is None:
            return cls("off", requested, path, reason or "no bwrap", secrets)
        return cls(requested, requested, path, None, secrets, masked)

    @property
    def notice(self) -> str | None:
        """The one line to show where the requested sandbox is not in effect."""
        if self.unavailable is None:
            return None
        return (
            f"sandbox unavailable ({self.unavailable}): commands run without a sandbox; "
            "install bubblewrap, or pass --sandbox off to silence this"
        )

    def command(
        self,
        argv: Sequence[str],
        directory: Path,
        *,
        network: bool,
        status: StatusPipe | None = None,
    ) -> Launch:
        """Wrap ``argv``, to run in ``directory``; ``network`` lets it reach the network;
        bwrap reports to ``status``."""
        env = tool_environment(self.secret_env)
        if self.mode == "off" or self.bwrap is None:
            return Launch(list(argv), env)
        place = str(directory)
        args = [self.bwrap, *_BASE]
        if not network:
            args.append("--unshare-net")
        # A mask that holds the session directory goes first, so the directory shows
        # through it; one inside the directory goes after, so it stays hidden.
        masks = _masks([*self.hidden, os.environ.get("XDG_RUNTIME_DIR", ""), *SYSTEM_SOCKETS])
        args += [arg for path, mask in masks if _holds(path, directory) for arg in mask]
        if self.mode == "workspace-write":
            args += ["--bind", place, place]
            args += [arg for git in _git_dirs(directory) for arg in ("--ro-bind", git, git)]
        else:
            # Mounted again so that a directory under /tmp shows through the private tmpfs.
            args += ["--ro-bind", place, place]
        args += [arg for path, mask in masks if not _holds(path, directory) for arg in mask]
        env["TMPDIR"] = "/tmp"
        fds: tuple[int, ...] = ()
        if status is not None:
            fds = (status.write_end,)
            args += ["--json-status-fd", str(status.write_end)]
        return Launch([*args, "--chdir", place, "--", *argv], env, fds)

    def explain(self, output: str, directory: Path, *, network: bool) -> str | None:
        """Why the sandbox stopped the command, when its output shows that it did."""
        if self.mode == "off":
            return None
        notes = []
        if any(tell in output for tell in _READ_ONLY_TELLS):
            if self.mode == "read-only":
                notes.append(
                    "(sandbox: read-only mode, only /tmp is writable; writing in "
                    f"{directory} needs --sandbox workspace-write)"
                )
            else:
                notes.append(
                    f"(sandbox: the filesystem outside {directory} is read-only, and so is "
                    f"{directory / '.git'}; only the session directory and /tmp are "
                    "writable; writes elsewhere need --sandbox off)"
                )
        if not network and any(tell in output for tell in _NETWORK_TELLS):
            notes.append(
                "(sandbox: the command has no network, not even the host's localhost; the "
                "permission bash_network allows it: --allow bash_network, or "
                "--allow 'bash_network:<command pattern>'. harness's own socket and the "
                "system's service sockets stay hidden either way)"
            )
        return "\n".join(notes) or None


def _masks(paths: Iterable[str]) -> list[tuple[Path, list[str]]]:
    """The bwrap arguments that hide each existing path: a tmpfs over a directory,
    /dev/null over anything else (a socket). Paths under /tmp are hidden already."""
    masks: list[tuple[Path, list[str]]] = []
    for name in dict.fromkeys(paths):
        if not name:
            continue
        path = Path(os.path.realpath(name))
        if path == Path("/tmp") or Path("/tmp") in path.parents or not path.exists():
            continue
        mask = ["--tmpfs", str(path)] if path.is_dir() else ["--ro-bind", "/dev/null", str(path)]
        masks.append((path, mask))
    return masks


def _holds(path: Path, directory: Path) -> bool:
    return path == directory or path in directory.parents


def _git_dirs(directory: Path) -> list[str]:
    """The session directory's own ``.git`` (a directory, or a worktree's file), to keep
    read-only; a symlinked one is protected where it points, if that is inside."""
    git = directory / ".git"
    try:
        if not git.is_symlink():
            return [str(git)] if git.exists() else []
        target = git.resolve(strict=True)
    except (OSError, RuntimeError):
        return []
    inside = target == directory or directory in target.parents
    return [str(target)] if inside else []
