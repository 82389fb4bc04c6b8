"""``scripts/stack.py`` as ``make up``/``down``/``status`` run it, with a test's own directories and free ports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .conftest import stack_mod, stack_procs

Identity = stack_procs.Identity
SCRIPT = Path(stack_mod.__file__).resolve().with_name("stack.py")  # `make up`'s command line
OUR_VARS = ("OTEL_", "OTELCOL_", "JAEGER_", "GATEWAY_")
STOPPED = 3  # `status`'s exit code when nothing of the stack runs (`make status` takes it as an answer)


class Cli:
    """`scripts/stack.py` with this test's directories and ports."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.run_dir = tmp_path / "run"
        self.ports = {key: stack_mod.free_port() for key in stack_mod.DEFAULT_PORTS}
        env = {k: v for k, v in os.environ.items() if not k.startswith(OUR_VARS)}
        if "OTEL_AGENTLOOP_CACHE" in os.environ:  # where the binaries are
            env["OTEL_AGENTLOOP_CACHE"] = os.environ["OTEL_AGENTLOOP_CACHE"]
        env.update({var: str(self.ports[key]) for key, var in stack_mod.PORT_VARS.items()})
        env.update(OTEL_AGENTLOOP_RUN_DIR=str(self.run_dir), OTEL_AGENTLOOP_DATA=str(tmp_path / "data"))
        self.env = env

    def __call__(self, command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(SCRIPT), command],
            env=self.env,
            cwd=self.tmp,
            capture_output=True,
            text=True,
            timeout=240,
        )

    @property
    def state_file(self) -> Path:
        return self.run_dir / "stack.json"

    def saved(self) -> dict[str, Identity]:
        processes = json.loads(self.state_file.read_text())["processes"]
        return {name: Identity.from_json(data) for name, data in processes.items()}

    def write_state(self, processes: dict[str, object]) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        state = {
            "version": 2,
            "ports": self.ports,
            "data_dir": str(self.tmp / "data" / "jaeger"),
            "queue_dir": str(self.tmp / "data" / "queue"),
            "retention": "168h",
            "processes": processes,
        }
        self.state_file.write_text(json.dumps(state))

    def our_ports(self) -> list[int]:
        return [self.ports[key] for name in stack_mod.UP for key in stack_mod.PORTS_OF[name]]
