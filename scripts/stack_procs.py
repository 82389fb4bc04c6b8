"""Processes of `scripts/stack.py up` after its own process has exited: who they are, and stopping them safely.

A saved PID is ours only while the process holding it has the start time (/proc/<pid>/stat field 22, clock
ticks since boot) and the command line (/proc/<pid>/cmdline) that `up` saved: after a crash the kernel may
give the PID to an unrelated program, which is then never signalled. A signal goes through a pidfd opened
before the check, so the process checked is the process signalled (no PID-reuse race in between); without
pidfds (kernels before 5.3) the check is repeated right before each signal. Linux only (/proc): elsewhere no
saved process can be checked, so none is signalled.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
import socket
import time
from collections.abc import Generator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Verdict = Literal["ours", "gone", "foreign"]


@dataclass(frozen=True)
class Identity:
    """One process, as /proc shows it: its PID, start time (clock ticks since boot) and argv."""

    pid: int
    start_time: int
    cmdline: tuple[str, ...]

    def to_json(self) -> dict[str, object]:
        return {"pid": self.pid, "start_time": self.start_time, "cmdline": list(self.cmdline)}

    @classmethod
    def from_json(cls, data: object) -> Identity:
        """Raises ValueError (or KeyError/TypeError) on anything but what :meth:`to_json` wrote."""
        if not isinstance(data, dict):
            raise ValueError(f"not a saved process: {data!r}")
        pid, start, argv = data["pid"], data["start_time"], data["cmdline"]
        if not (isinstance(pid, int) and isinstance(start, int) and isinstance(argv, list)):
            raise ValueError(f"not a saved process: {data!r}")
        return cls(pid, start, tuple(str(a) for a in argv))

    def command(self) -> str:
        return " ".join(self.cmdline) or "?"


def identity(pid: int) -> Identity | None:
    """The process holding ``pid`` now, or None when none does (or it has exited and is a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        argv = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    # Field 2 (comm) is in parentheses and may hold spaces or ')': the fields after the last ')' start at 3.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return Identity(pid, int(fields[22 - 3]), tuple(os.fsdecode(a) for a in argv.split(b"\0")[:-1]))


def verdict(saved: Identity) -> tuple[Verdict, Identity | None]:
    """Whether ``saved`` still runs (``ours``), has exited (``gone``) or its PID now belongs to another
    process (``foreign``, returned with it)."""
    now = identity(saved.pid)
    if now is None:
        return "gone", None
    return ("ours" if now == saved else "foreign"), now


def _wait_fd(fd: int, timeout: float) -> bool:
    """Whether the process of pidfd ``fd`` exits within ``timeout`` s."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0, int(timeout * 1000))))


def _wait_gone(saved: Identity, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while verdict(saved)[0] == "ours":
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@contextlib.contextmanager
def _pidfd(pid: int) -> Generator[int | None, None, None]:
    """A pidfd of ``pid`` (None where the kernel or Python has none); raises ProcessLookupError if none runs."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError) as exc:
        if isinstance(exc, ProcessLookupError):
            raise
        yield None
        return
    try:
        yield fd
    finally:
        os.close(fd)


def _signal(saved: Identity, fd: int | None, sig: signal.Signals) -> bool:
    """Send ``sig`` to ``saved`` if it is still ours; False if it is not (or has exited)."""
    try:
        if fd is not None:
            signal.pidfd_send_signal(fd, sig)
        elif verdict(saved)[0] == "ours":
            os.kill(saved.pid, sig)
        else:
            return False
    except ProcessLookupError:
        return False
    return True


def _wait(saved: Identity, fd: int | None, timeout: float) -> bool:
    return _wait_fd(fd, timeout) if fd is not None else _wait_gone(saved, timeout)


def stop(saved: Identity, timeout: float, kill_timeout: float = 10) -> tuple[bool, str]:
    """Stop ``saved`` if it is still ours: SIGTERM, wait up to ``timeout`` s for it to exit, then SIGKILL and
    wait up to ``kill_timeout`` s. Returns whether it no longer runs, and what happened as the end of a
    sentence ("exited 0.4 s after SIGTERM", "left alone: ..."). Never signals a process that is not ``saved``."""
    try:
        with _pidfd(saved.pid) as fd:
            state, now = verdict(saved)
            if state == "gone":
                return True, "was not running"
            if state == "foreign":
                assert now is not None
                return False, f"left alone: pid {saved.pid} is now another program ({now.command()})"
            t0 = time.monotonic()
            if not _signal(saved, fd, signal.SIGTERM) or _wait(saved, fd, timeout):
                return True, f"exited {time.monotonic() - t0:.1f} s after SIGTERM"
            if not _signal(saved, fd, signal.SIGKILL) or _wait(saved, fd, kill_timeout):
                return True, f"did not exit within {timeout:.0f} s of SIGTERM: killed with SIGKILL"
            return False, f"still running {kill_timeout:.0f} s after SIGKILL (stuck in the kernel?)"
    except ProcessLookupError:
        return True, "was not running"


def port_busy(port: int) -> bool:
    """Whether a listener holds 127.0.0.1:``port`` (a bind as the Go servers do it, with SO_REUSEADDR, fails)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            raise
    return False


def wait_ports_free(ports: Iterable[int], timeout: float) -> list[int]:
    """Wait up to ``timeout`` s until no listener holds any of ``ports``; returns those still held."""
    deadline = time.monotonic() + timeout
    while True:
        busy = [p for p in ports if port_busy(p)]
        if not busy or time.monotonic() > deadline:
            return busy
        time.sleep(0.05)
