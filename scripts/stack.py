#!/usr/bin/env python3
"""A real Jaeger v2 and OpenTelemetry Collector on 127.0.0.1, built from the Go module proxy and cached.

    python scripts/stack.py build     # once: minutes cold, instant when cached
    python scripts/stack.py up        # Collector on 4317/4318 (+8889 metrics), Jaeger's query API on 16686
    python scripts/stack.py up --store opensearch   # the same on a 3-node OpenSearch (scripts/stack_store.py)
    python scripts/stack.py status    # exit 0: both run and answer, 3: stopped, else 1; says where they listen
    python scripts/stack.py down      # returns once both have exited and their ports are free
    python scripts/stack.py env       # export lines for this stack: eval "$(python3 scripts/stack.py env)"
    python scripts/stack.py which collector|jaeger   # the cached binary's path (built if missing)

One stack per checkout: `up` records which checkout (its repository root) started the stack; `up`, `down` and
`status` from another checkout say so in one line, and `up` and `down` act on it only with `--force` (`make up
FORCE=1`). OTEL_AGENTLOOP_STACK=NAME names a stack of its own: its run directory, data directory and ports (the
defaults plus an offset derived from NAME) are its own (otel_agentloop/config/_local_stack.py; docs/settings.md).

`up` saves what it started in ${OTEL_AGENTLOOP_RUN_DIR:-<cache>/run[-NAME]}/stack.json (ports, directories,
the checkout, and each process's PID, start time and command line); `up`, `down` and `status` all decide what
runs from that state checked against /proc (:func:`survey`), so they agree after any crash: a process that has
exited is forgotten, a PID now held by another program is left alone (scripts/stack_procs.py), `up` restarts what
is missing of a half-up stack on its saved ports, and `down` sends SIGTERM, then SIGKILL after
${OTEL_AGENTLOOP_STOP_TIMEOUT:-30} s. Ports come from the variables the config files substitute
(OTELCOL_GRPC_PORT, JAEGER_QUERY_PORT, ...: ``stack_lib.PORT_VARS``), else the stack's defaults.

`up` keeps Jaeger's traces on disk (Badger) in ${JAEGER_BADGER_DIR:-<data>/jaeger} (<data>:
~/.local/share/otel-agentloop, or its stacks/NAME for a named stack) for ${JAEGER_RETENTION:-168h}: they survive
a crash or restart. Binaries, ports and processes: scripts/stack_lib.py.

The natively built Jaeger serves a placeholder page instead of Jaeger's UI (its web assets are built by
Jaeger's release process, not by `go build`): read traces with `otel-agentloop report --jaeger URL` (add
`--html step.html` for the step's timeline page) or through the query API (api_v3).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import sys
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from pathlib import Path

import stack_procs
import stack_store
from stack_lib import (
    COLLECTOR_BIN,
    JAEGER_BIN,
    PORT_TIMEOUT,
    PORT_VARS,
    PORTS_OF,
    PROCESSES,
    ROOT,
    RUN_DIR,
    STACK,
    STACK_DATA,
    STOP_ORDER,
    STOP_TIMEOUT,
    UP,
    Saved,
    StackError,
    _healthy,
    build,
    build_collector,
    build_jaeger,
    ports_from_env,
    prepare,
    state_file,
)
from stack_procs import Identity


def up_names(store: str) -> tuple[str, ...]:
    return UP if store == "badger" else tuple(stack_store.UP)


@dataclass
class Survey:
    """`up`'s saved state (None when none of it runs) and those of its processes that still run (verified)."""

    saved: Saved | None
    running: dict[str, Identity]

    @property
    def missing(self) -> list[str]:
        return [name for name in up_names(self.saved.store if self.saved else "badger") if name not in self.running]


def _unreadable_state(exc: Exception, forget: bool) -> None:
    """Forget a state file this version cannot read (an older stack.py saved bare PIDs): nothing is signalled."""
    try:
        text = state_file().read_text(errors="replace")[:500]
    except OSError:
        text = ""
    if forget:
        state_file().unlink(missing_ok=True)
    pids = [int(p) for p in re.findall(r'"\w+": (\d+)\s*[,}]', text)]
    now = [f"pid {pid} now runs `{ident.command()}`" for pid in pids if (ident := stack_procs.identity(pid))]
    hint = f" ({'; '.join(now)}: stop it by hand if it is an old stack)" if now else ""
    print(f"stack: forgot {state_file()}: not a state this version wrote ({exc!r}); no PID in it signalled{hint}")


def survey(forget: bool = True, kept: str | None = "`up` or `down` runs now") -> Survey:
    """What runs of `up`'s stack, from the saved state checked against /proc: the one place `up`, `down` and
    `status` decide it. A saved process that has exited, or whose PID another program now holds (left alone),
    is forgotten (unless not ``forget``: ``kept`` says why, e.g. another `up` or `down` holds the lock; None:
    nothing is said); a state with none left is removed; one line says so."""
    if not state_file().exists():
        return Survey(None, {})
    try:
        saved = Saved.read()
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        _unreadable_state(exc, forget)
        return Survey(None, {})
    running, lost = {}, []
    for name, ident in saved.procs.items():
        verdict, now = stack_procs.verdict(ident)
        if verdict == "ours":
            running[name] = ident
        elif now is None:
            lost.append(f"{name} (pid {ident.pid}) has exited")
        else:
            lost.append(f"pid {ident.pid} is no longer our {name} but `{now.command()}`: left alone")
    if lost and not forget:
        if kept is not None:
            print(f"stack: {'; '.join(lost)} ({kept}: {state_file()} left as it is)")
    elif lost and running:
        saved.procs = dict(running)
        saved.write()
        print(f"stack: {'; '.join(lost)}: forgot it in {state_file()}")
    elif lost:
        state_file().unlink()
        print(f"stack: stale state removed ({state_file()}): {'; '.join(lost)}")
    return Survey(saved if running else None, running)


def _label() -> str:
    return "the default stack" if STACK is None else f"stack {STACK!r} (OTEL_AGENTLOOP_STACK)"


def _owner() -> str | None:
    """The checkout that started the saved stack, when it is another one (None: this one, none saved, or a state
    this version cannot read: :func:`survey` says so)."""
    try:
        return Saved.read().foreign()
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _not_ours(owner: str) -> str:
    return f"{_label()} was started by the checkout {owner}, not this one ({ROOT})"


REFUSED = {
    "up": "not started: {whose}; `make up FORCE=1` (scripts/stack.py up --force) uses it from here, or give this "
    "checkout a stack of its own: OTEL_AGENTLOOP_STACK=NAME make up (docs/settings.md)",
    "down": "not stopped: {whose}; `make down FORCE=1` (scripts/stack.py down --force) stops it",
}


def _claim(command: str, force: bool) -> Survey:
    """:func:`survey` for `up` and `down` (the lock held): a stack that another checkout started, of which
    something still runs, is refused with a StackError naming that checkout, unless ``force``. One of which
    nothing runs is stale: forgotten, whoever started it."""
    owner = _owner()
    if owner is not None and not force and survey(forget=False, kept=None).saved is not None:
        raise StackError(REFUSED[command].format(whose=_not_ours(owner)))
    return survey()


@contextlib.contextmanager
def _locked(wait: bool = True) -> Generator[bool, None, None]:
    """One `up` or `down` at a time; yields whether the lock is held (without ``wait``, False if another
    process holds it)."""
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    with open(RUN_DIR / "stack.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True


def _busy(ports: dict[str, int], names: Sequence[str]) -> list[str]:
    busy = [k for n in names for k in PORTS_OF[n] if stack_procs.port_busy(ports[k])]
    return [f"{ports[k]} ({PORT_VARS.get(k, k)})" for k in busy]


def describe(saved: Saved) -> None:
    """Where the stack listens and keeps its data (printed by `up` and `status`)."""
    stack = saved.addresses()
    ports = saved.ports
    print(f"Collector: OTLP gRPC 127.0.0.1:{ports['grpc']}, OTLP HTTP 127.0.0.1:{ports['http']}")
    print(f"  export OTEL_EXPORTER_OTLP_ENDPOINT={stack.otlp_grpc_endpoint}")
    print(f"  spanmetrics {stack.prometheus_url}   health http://127.0.0.1:{ports['otelcol_health']}/")
    print(f"Jaeger query API: {stack.jaeger_url}/api/v3/services")
    print(f"  {stack.jaeger_url}/ is a placeholder page (this native build has no Jaeger UI); read traces with")
    print(f"  otel-agentloop report --jaeger {stack.jaeger_url} [--html step.html], or use docker compose for the UI")
    if saved.store == "badger":
        print(f"  traces on disk in {saved.data_dir} (Badger; kept {saved.retention}: JAEGER_RETENTION changes it)")
    else:
        stack_store.describe(saved)
    print(f"{_label()}, started by the checkout {saved.checkout or '(not recorded)'}")
    print(f"logs and state: {RUN_DIR}   stop: make down (scripts/stack.py down)")


def _start(saved: Saved, names: Sequence[str]) -> None:
    """Start ``names`` with ``saved``'s ports and directories, and add them to ``saved``."""
    busy = _busy(saved.ports, names)
    if busy:
        raise StackError(
            f"port(s) {', '.join(busy)} in use by another program (another Jaeger or Collector, e.g. "
            "`docker compose up`, or another stack: OTEL_AGENTLOOP_STACK gives each name its own ports, "
            "docs/settings.md): stop it, or set those variables to free ports"
        )
    build()
    os.environ["JAEGER_RETENTION"] = saved.retention  # a restarted Jaeger keeps the store's retention
    if saved.store != "badger":
        stack_store.start_up(saved, names)
        return
    stack = prepare(saved.ports, None, saved.data_dir, saved.queue_dir)
    for name in names:
        stack.start_process(name)
        ident = stack_procs.identity(stack.procs[name].pid)
        if ident is None:
            stack.stop()
            raise StackError(f"{name} exited right after starting: see {RUN_DIR / name}.log")
        saved.procs[name] = ident


def _build() -> int:
    build()
    missing_tools = stack_store.missing_tools()
    if missing_tools:  # like `make browser`: the cluster store's tests skip (and fail under CI=true)
        print(
            f"OpenSearch's jars not fetched: {' and '.join(missing_tools)} not installed (Java 17 and Maven); the "
            "cluster store's tests will skip (fail under CI=true), `make up STORE=opensearch` will not start",
            file=sys.stderr,
        )
        return 0
    stack_store.build_opensearch()
    return 0


def up(store: str = "badger", force: bool = False) -> int:
    with _locked():
        found = _claim("up", force)
        if found.saved is not None and found.saved.store != store:
            raise StackError(f"the {found.saved.store} stack is up: `make down` first")
        if found.saved is not None and not found.missing:
            print("stack already up: " + ", ".join(f"{n} pid {i.pid}" for n, i in found.running.items()))
            describe(found.saved)
            return 0
        if found.saved is not None:  # half up: the rest on the same ports and store
            saved, names = found.saved, found.missing
            print(f"stack half up ({', '.join(found.running)} still runs): starting {', '.join(names)}")
        else:
            retention = os.environ.get("JAEGER_RETENTION") or "168h"
            if store == "badger":
                data_dir = Path(os.environ.get("JAEGER_BADGER_DIR") or STACK_DATA / "jaeger")
                ports = ports_from_env()
            else:
                data_dir, ports = stack_store.up_dir(), {**ports_from_env(), **stack_store.ports_from_env()}
            saved = Saved(ports, data_dir, STACK_DATA / "queue", retention, {}, store, str(ROOT), STACK)
            names = list(up_names(store))
        _start(saved, names)
        saved.write()
        print("started " + ", ".join(f"{n} (pid {saved.procs[n].pid})" for n in names))
        describe(saved)
        return 0


def down(force: bool = False) -> int:
    with _locked():
        found = _claim("down", force)
        if found.saved is None:
            print("stack not running")
            return 0
        saved, stuck = found.saved, {}
        for name in (n for n in STOP_ORDER if n in found.running):
            ident = found.running[name]
            stopped, line = stack_procs.stop(ident, STOP_TIMEOUT)
            if stopped:
                busy = stack_procs.wait_ports_free([saved.ports[k] for k in PORTS_OF[name]], PORT_TIMEOUT)
                line += (
                    f"; its ports still in use after {PORT_TIMEOUT:.0f} s: {busy}" if busy else "; its ports are free"
                )
            elif stack_procs.identity(ident.pid) == ident:
                stuck[name] = ident
            print(f"{name} (pid {ident.pid}) {line}")
        if stuck:
            saved.procs = stuck
            saved.write()
            return 1
        state_file().unlink(missing_ok=True)
        return 0


STOPPED = 3
"""`status`'s exit code when nothing of the stack runs (as an LSB init script's `status`); `make status` takes it
as success: a stopped stack is an answer, not an error."""


def status(force: bool = False) -> int:
    """Exit 0 when every process runs and answers, 1 when one is missing or does not answer, :data:`STOPPED` when
    none runs. A stack another checkout started is shown as it is (its state untouched unless ``force``)."""
    owner = _owner()
    if owner is not None:
        print(f"stack: {_not_ours(owner)}: shown as it is; `make up` and `make down` act on it only with FORCE=1")
    with _locked(wait=False) as locked:  # never waits for a build of `up`
        kept = "`up` or `down` runs now" if not locked else f"started by the checkout {owner}"
        found = survey(forget=locked and (owner is None or force), kept=kept)
    if not locked:
        print(f"stack: `up` or `down` runs now (it holds {RUN_DIR / 'stack.lock'})")
    if found.saved is None:
        print("   ".join(f"{name}: down" for name in UP))
        ports = ports_from_env()
        busy = _busy(ports, UP)
        if busy:
            print(f"  (not started by `make up`, but another program listens on {', '.join(busy)})")
        print(f"stack stopped: {_label()}, state in {RUN_DIR}; start: make up (scripts/stack.py up)")
        return STOPPED
    saved, unhealthy = found.saved, []
    for name in (n for n in found.running if n in PROCESSES):
        _, health, path, _ = PROCESSES[name]
        url = f"http://127.0.0.1:{saved.ports[health]}{path}"
        if not _healthy(url):
            unhealthy.append(f"{name} runs but does not answer at {url} (see {RUN_DIR / name}.log)")
    names = up_names(saved.store)
    print("   ".join(f"{n}: up (pid {found.running[n].pid})" if n in found.running else f"{n}: down" for n in names))
    for line in unhealthy:
        print(f"  {line}")
    if found.missing:
        print(f"  half up: `make up` starts {', '.join(found.missing)} again on the same ports; `make down` stops all")
    describe(saved)
    return 1 if unhealthy or found.missing else 0


def which(name: str) -> int:
    """Print the cached binary's path (``jaeger`` or ``collector``), building it first if missing: what a
    cluster node copies (docs/cluster.md)."""
    binaries = {"jaeger": (JAEGER_BIN, build_jaeger), "collector": (COLLECTOR_BIN, build_collector)}
    if name not in binaries:
        print("usage: scripts/stack.py which jaeger|collector", file=sys.stderr)
        return 2
    path, make = binaries[name]
    if not path.exists():
        make(verbose=True)
    print(path)
    return 0


def env() -> int:
    """Print the exports that point a job and `report` at this stack: eval "$(python3 scripts/stack.py env)"."""
    found = survey(forget=False, kept=None)
    ports = found.saved.ports if found.saved is not None else ports_from_env()
    if found.saved is None:
        print(f"# {_label()} is not running (make up); these are the ports it will have", file=sys.stderr)
    if STACK is not None:
        print(f"export OTEL_AGENTLOOP_STACK={STACK}")
    print(f"export OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:{ports['grpc']}")
    print(f"# report: otel-agentloop report --jaeger http://127.0.0.1:{ports['query']}")
    return 0


def main(argv: list[str]) -> int:
    command = argv[1] if len(argv) > 1 else "status"
    if command == "which":
        return which(argv[2] if len(argv) > 2 else "")
    rest = argv[2:]
    force = "--force" in rest
    rest = [a for a in rest if a != "--force"]
    store = rest[1] if rest[:1] == ["--store"] and len(rest) == 2 and command == "up" else None
    if store is not None:
        rest = []
    usable = {"build": False, "env": False, "up": True, "down": True, "status": True}
    if command not in usable or rest or store not in (None, "badger", "opensearch") or (force and not usable[command]):
        print(__doc__)
        return 2
    try:
        if command == "up":
            return up(store or "badger", force)
        if command in ("down", "status"):
            return down(force) if command == "down" else status(force)
        return _build() if command == "build" else env()
    except StackError as exc:
        print(f"stack: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
