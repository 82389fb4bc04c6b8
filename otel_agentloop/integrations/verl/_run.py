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

Never silent, never destructive: a run file that cannot be read back on a resume (not JSON, no run id) gets
one warning naming it; this launch then starts a new run id and the file is kept aside as
``otel_agentloop_run.json.corrupt-<UTC time>``, never overwritten. A run file that cannot be written (the path
is a folder, the folder is read-only) gets one warning and leaves no temporary file behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from types import ModuleType
from typing import Any

from ...config._settings import resolve
from ...core._guard import internal_error, logger
from ...setup import adopt_run_id, current_handle, process_run_id
from .._patching import Args, Kwargs, Original
from . import _patching as patching

CONSTANTS_PPO = "verl.trainer.constants_ppo"
RUN_FILE = "otel_agentloop_run.json"


def apply_constants_ppo(module: ModuleType) -> None:
    patching.patch(module, "", "get_ppo_ray_runtime_env", _ppo_runtime_env)


def _ppo_runtime_env(original: Original, args: Args, kwargs: Kwargs) -> object:
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
    stored, problem = _read(path) if resuming else (None, None)
    if stored is not None:
        adopt_run_id(stored)
        logger.info("otel_agentloop: resuming run %s (from %s)", stored, path)
        return stored
    run_id = handle.run_id if handle is not None and handle.enabled and handle.run_id else process_run_id()
    if problem is not None and os.path.isfile(path) and _set_aside(path, problem, run_id) is None:
        return run_id  # an unreadable file that cannot be set aside is left as it is
    if resuming and problem is None:
        logger.info("otel_agentloop: no %s in %s (a checkpoint from before tracing): run %s", RUN_FILE, folder, run_id)
    _write(path, run_id)
    return run_id


def _read(path: str) -> tuple[str | None, str | None]:
    """(the run id stored at ``path``, else ``None``; why it could not be read, ``None`` when it is missing)."""
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError) as exc:  # ValueError: not JSON, not UTF-8
        return None, f"{type(exc).__name__}: {exc}"
    run_id = value.get("run_id") if isinstance(value, dict) else None
    if isinstance(run_id, str) and run_id.strip():
        return run_id, None
    return None, "no run id in it"


def _set_aside(path: str, problem: str, run_id: str) -> str | None:
    """Rename the unreadable run file ``path`` to ``<path>.corrupt-<UTC time>`` (a free name), with one warning
    saying so; ``None`` (also one warning) when it cannot be renamed: it is then left as it is."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside, n = f"{path}.corrupt-{stamp}", 1
    while os.path.lexists(aside):
        n += 1
        aside = f"{path}.corrupt-{stamp}-{n}"
    try:
        os.rename(path, aside)
    except OSError as exc:
        logger.warning(
            "otel_agentloop: the run file %s cannot be read (%s) nor set aside (%s): this launch starts a new "
            "run id %s and leaves the file as it is; a later resume starts a new run id too",
            path,
            problem,
            exc,
            run_id,
        )
        return None
    logger.warning(
        "otel_agentloop: the run file %s cannot be read (%s): this launch starts a new run id %s; the file is "
        "kept as %s",
        path,
        problem,
        run_id,
        aside,
    )
    return aside


def _write(path: str, run_id: str) -> None:
    """Write ``run_id`` to ``path`` through a temporary file that never outlives the call; one warning when it
    cannot be written."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"run_id": run_id}, f)
        os.replace(tmp, path)
    except OSError as exc:
        logger.warning(
            "otel_agentloop: cannot keep the run id in %s (%s: %s): this launch's run %s is not kept, so a resume "
            "from this checkpoint folder starts a new run id",
            path,
            type(exc).__name__,
            exc,
            run_id,
        )
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # gone already after os.replace
