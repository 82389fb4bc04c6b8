"""A verl run keeps its ``rl.run.id`` across a resume from a checkpoint.

When the user names no run (no ``configure(run_id=)``, no ``OTEL_AGENTLOOP_RUN_ID``), the driver keeps the run
id in verl's checkpoint folder (``trainer.default_local_dir``), in :data:`RUN_FILE`: written on a fresh start,
read back when verl will resume from a checkpoint there. The driver decides, in verl's ``run_ppo``, just
before its ``ray.init`` (the patch is on ``verl.trainer.constants_ppo.get_ppo_ray_runtime_env``, which
``run_ppo`` calls with the config there, and which ``python -m verl.trainer.main_ppo`` imports by name):
the run id then reaches every worker through the ``runtime_env`` (``handle.worker_env``).

Resume is found as verl 0.9.1 finds it (``_load_checkpoint`` of both trainers): ``resume_mode=disable`` never
resumes; ``auto`` resumes when ``find_latest_ckpt_path(default_local_dir)`` (verl's own function:
``latest_checkpointed_iteration.txt`` naming an existing ``global_step_N`` folder) finds one;
``resume_path`` resumes from ``resume_from_path`` (its parent folder holds the run file). A relative folder is
taken from the driver's working directory, as verl's trainer takes it from its own (the same on one node).
"""

from __future__ import annotations

import json
import os
from typing import Any

from ..._configure import adopt_run_id, current_handle, process_run_id
from ...config._settings import resolve
from ...core._guard import internal_error, logger
from . import _patching as patching

CONSTANTS_PPO = "verl.trainer.constants_ppo"
RUN_FILE = "otel_agentloop_run.json"


def apply_constants_ppo(module: Any) -> None:
    patching.patch(module, "", "get_ppo_ray_runtime_env", _ppo_runtime_env)


def _ppo_runtime_env(original: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    config = args[0] if args else kwargs.get("config")
    if config is not None:
        try:
            keep_run_id(config)
        except Exception:
            internal_error("verl.keep_run_id")
    return original(*args, **kwargs)


def checkpoint_folder(config: Any) -> tuple[str, bool]:
    """(the folder that holds the run file, whether verl will resume from a checkpoint there)."""
    trainer = config.trainer
    folder = os.path.abspath(str(trainer.default_local_dir))
    mode = trainer.get("resume_mode", "auto")
    if mode == "resume_path":
        path = trainer.get("resume_from_path")
        if isinstance(path, str) and "global_step_" in path:
            return os.path.dirname(os.path.abspath(path.rstrip("/"))), True
        return folder, False
    if mode != "auto":
        return folder, False
    from verl.utils.checkpoint.checkpoint_manager import (  # pyright: ignore[reportMissingImports]
        find_latest_ckpt_path,
    )

    return folder, find_latest_ckpt_path(folder) is not None


def keep_run_id(config: Any) -> str | None:
    """The run id this launch uses, read back from (resume) or written to (fresh start) the checkpoint folder;
    ``None`` (nothing read or written) when the user named the run."""
    handle = current_handle()
    if resolve(only=("run_id",)).run_id is not None or (
        handle is not None and not handle.closed and handle.settings.sources.get("run_id") is not None
    ):
        return None
    folder, resuming = checkpoint_folder(config)
    path = os.path.join(folder, RUN_FILE)
    stored = _read(path) if resuming else None
    if stored is not None:
        adopt_run_id(stored)
        logger.info("otel_agentloop: resuming run %s (from %s)", stored, path)
        return stored
    run_id = handle.run_id if handle is not None and handle.enabled and handle.run_id else process_run_id()
    os.makedirs(folder, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"run_id": run_id}, f)
    os.replace(tmp, path)
    return run_id


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f).get("run_id")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) and value.strip() else None
