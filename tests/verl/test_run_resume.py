"""A verl run resumed from its checkpoint keeps its ``rl.run.id`` (issue 19): the driver keeps the id in verl's
checkpoint folder, written on a fresh start and read back when verl will resume there.

Real: verl's ``run_ppo`` (its ``ray.init`` on a local cluster, the task runner actor, a V1 agent-loop worker
actor tracing samples), launched twice as a driver script (``__main__``) in separate processes, with verl and
Ray instrumented in the driver as ``opentelemetry-instrument`` does. Between the launches the test writes what
verl's ``_save_checkpoint`` leaves for ``find_latest_ckpt_path`` (the tracker file and the ``global_step_N``
folder); the model state a real save adds plays no part in finding the checkpoint."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import ray_scenarios as rs

from otel_agentloop import semconv as sc
from otel_agentloop.analysis import read_jsonl
from otel_agentloop.integrations.verl import _run
from otel_agentloop.setup import process_run_id

DRIVER = textwrap.dedent("""
    import json, sys
    from pathlib import Path

    import otel_agentloop as oal
    from otel_agentloop.integrations import ray as oal_ray
    from otel_agentloop.integrations import verl as oal_verl

    oal_verl.instrument()
    oal_ray.instrument()  # what `opentelemetry-instrument` does in the driver

    import ray
    import verl
    from hydra import compose, initialize_config_dir
    from stock_probe import ProbeTaskRunner
    from verl.trainer.main_ppo import run_ppo

    if __name__ == "__main__":
        folder, mode = sys.argv[1], sys.argv[2]
        config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            config = compose(
                "ppo_trainer",
                overrides=[
                    "ray_kwargs.ray_init.num_cpus=2",
                    f"trainer.default_local_dir={folder}",
                    f"trainer.resume_mode={mode}",
                ],
            )
        try:
            run_ppo(config, task_runner_class=ProbeTaskRunner)
        finally:
            ray.shutdown()
        handle = oal.current_handle()
        handle.shutdown(5)
        print(json.dumps([handle.run_id, handle.run_attempt]))
""")


def _launch(tmp_path: Path, folder: Path, mode: str, trace: Path, output: bool = False) -> Any:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(
        OTEL_AGENTLOOP_FILE=str(trace),
        OTEL_BSP_SCHEDULE_DELAY="50",
        PYTHONPATH=os.pathsep.join([str(rs.ROOT / "tests" / "verl"), str(rs.ROOT), env.get("PYTHONPATH", "")]),
    )
    out = subprocess.run(
        [sys.executable, str(script), str(folder), mode],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    run_id, attempt = json.loads(out.stdout.strip().splitlines()[-1])
    return ((run_id, attempt), out.stderr) if output else (run_id, attempt)


def _save_checkpoint(folder: Path, step: int) -> None:
    """What verl's ``_save_checkpoint`` leaves for ``find_latest_ckpt_path``: the step's folder and the tracker."""
    (folder / f"global_step_{step}" / "actor").mkdir(parents=True)
    (folder / "latest_checkpointed_iteration.txt").write_text(str(step))


def test_a_resumed_verl_run_keeps_its_run_id_on_every_span(tmp_path) -> None:
    folder = tmp_path / "checkpoints" / "proj" / "exp"
    trace = tmp_path / "trace.jsonl"
    first = _launch(tmp_path, folder, "auto", trace)  # fresh start: the run id is written
    assert json.loads((folder / _run.RUN_FILE).read_text()) == {"run_id": first[0]}
    _save_checkpoint(folder, 2)
    resumed = _launch(tmp_path, folder, "auto", trace)  # verl resumes from global_step_2: the same run
    assert resumed[0] == first[0] and resumed[1] != first[1]
    samples = [r for r in read_jsonl(str(trace)) if r.name == sc.SAMPLE_SPAN]
    n = rs.N_PROMPTS * rs.N_SESSIONS
    assert len(samples) == 2 * n  # traced in the workers of both launches
    by_attempt: dict[tuple[str, str], int] = {}
    for r in samples:
        key = (r.resource[sc.RL_RUN_ID], r.resource[sc.RL_RUN_ATTEMPT])
        by_attempt[key] = by_attempt.get(key, 0) + 1
    assert by_attempt == {first: n, resumed: n}


def test_checkpoint_folder_follows_verls_resume_rules(tmp_path, monkeypatch) -> None:
    """``disable`` never resumes (a new run, its id written); ``resume_path`` reads the named checkpoint's
    folder; a run the user named (``OTEL_AGENTLOOP_RUN_ID``) leaves the folder alone."""
    import verl
    from hydra import compose, initialize_config_dir

    folder = tmp_path / "ckpt"
    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")

    def config(*overrides: str):
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            return compose("ppo_trainer", overrides=[f"trainer.default_local_dir={folder}", *overrides])

    _save_checkpoint(folder, 4)
    (folder / _run.RUN_FILE).write_text(json.dumps({"run_id": "earlier-run"}))
    assert _run.checkpoint_folder(config()) == (str(folder), True)
    assert _run.checkpoint_folder(config("trainer.resume_mode=disable")) == (str(folder), False)
    other = tmp_path / "elsewhere"
    path = f"trainer.resume_from_path={other / 'global_step_9'}"
    assert _run.checkpoint_folder(config("trainer.resume_mode=resume_path", path)) == (str(other), True)

    monkeypatch.setenv("OTEL_AGENTLOOP_RUN_ID", "named")
    assert _run.keep_run_id(config()) is None
    monkeypatch.delenv("OTEL_AGENTLOOP_RUN_ID")
    own = process_run_id()
    assert _run.keep_run_id(config("trainer.resume_mode=disable")) == own  # fresh: this launch's id, written
    assert json.loads((folder / _run.RUN_FILE).read_text()) == {"run_id": own}
    (folder / _run.RUN_FILE).write_text(json.dumps({"run_id": "earlier-run"}))
    try:
        assert _run.keep_run_id(config()) == "earlier-run"  # auto, a checkpoint there: resumed
        assert process_run_id() == "earlier-run"
    finally:
        _run.adopt_run_id(own)


# -- never silent, never destructive (issue 26) ------------------------------------------------------------
def _verl_config(folder: Path, *overrides: str):
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose("ppo_trainer", overrides=[f"trainer.default_local_dir={folder}", *overrides])


def _run_file_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and _run.RUN_FILE in r.getMessage()]


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b'{"run_id": "earl', "JSONDecodeError"),
        (b"\xff\xfe not text", "UnicodeDecodeError"),
        (b'{"run_id": ""}', "no run id in it"),
        (b'["earlier-run"]', "no run id in it"),
    ],
    ids=["truncated", "not-utf8", "empty-id", "not-an-object"],
)
def test_a_corrupt_run_file_on_resume_warns_once_starts_a_new_run_and_is_kept_aside(
    tmp_path, caplog, content, why
) -> None:
    """verl resumes (a checkpoint there, ``resume_mode=auto``) but the run file cannot be read back: one warning
    names the file, why, the new run id and where the file went; the file is renamed, byte for byte, never
    overwritten; the new run file holds this launch's id."""
    folder = tmp_path / "ckpt"
    _save_checkpoint(folder, 3)
    (folder / _run.RUN_FILE).write_bytes(content)
    own = process_run_id()
    with caplog.at_level(logging.INFO, logger="otel_agentloop"):
        assert _run.keep_run_id(_verl_config(folder)) == own
    (aside,) = folder.glob(_run.RUN_FILE + ".corrupt-*")
    assert re.fullmatch(re.escape(_run.RUN_FILE) + r"\.corrupt-\d{8}T\d{6}Z", aside.name), aside.name
    assert aside.read_bytes() == content
    assert json.loads((folder / _run.RUN_FILE).read_text()) == {"run_id": own}
    (line,) = _run_file_warnings(caplog)
    assert f"the run file {folder / _run.RUN_FILE} cannot be read" in line and why in line, line
    assert f"this launch starts a new run id {own}; the file is kept as {aside}" in line, line
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [_run.RUN_FILE, aside.name, "global_step_3", "latest_checkpointed_iteration.txt"]
    )


def test_a_second_corrupt_file_in_the_same_second_gets_its_own_name(tmp_path, caplog) -> None:
    folder = tmp_path / "ckpt"
    _save_checkpoint(folder, 1)
    for text in ("first {", "second {"):
        (folder / _run.RUN_FILE).write_text(text)
        _run.keep_run_id(_verl_config(folder))
    kept = sorted(p.read_text() for p in folder.glob(_run.RUN_FILE + ".corrupt-*"))
    assert kept == ["first {", "second {"]


@pytest.mark.parametrize("mode", ["auto", "disable"], ids=["resume", "fresh"])
def test_a_run_file_path_that_is_a_folder_warns_and_leaves_no_temporary_file(tmp_path, caplog, mode) -> None:
    """``otel_agentloop_run.json`` is a folder (on a resume and on a fresh start): one warning names the path and
    what it means; the folder and its content are untouched and no ``otel_agentloop_run.json.<pid>.tmp`` is
    left in the checkpoint folder."""
    folder = tmp_path / "ckpt"
    _save_checkpoint(folder, 2)
    (folder / _run.RUN_FILE).mkdir()
    (folder / _run.RUN_FILE / "keep.txt").write_text("mine")
    own = process_run_id()
    with caplog.at_level(logging.INFO, logger="otel_agentloop"):
        assert _run.keep_run_id(_verl_config(folder, f"trainer.resume_mode={mode}")) == own
    (line,) = _run_file_warnings(caplog)
    assert f"cannot keep the run id in {folder / _run.RUN_FILE} (IsADirectoryError" in line, line
    assert f"this launch's run {own} is not kept, so a resume from this checkpoint folder starts a new run" in line
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [_run.RUN_FILE, "global_step_2", "latest_checkpointed_iteration.txt"]
    )
    assert [p.name for p in (folder / _run.RUN_FILE).iterdir()] == ["keep.txt"]


def test_a_checkpoint_folder_that_is_a_file_warns_and_leaves_nothing_behind(tmp_path, caplog) -> None:
    """``trainer.default_local_dir`` names a file: the run file cannot be written; one warning, nothing
    created next to it (verl itself fails later, when it saves; that is verl's to say)."""
    folder = tmp_path / "ckpt"
    folder.write_text("not a folder")
    with caplog.at_level(logging.WARNING, logger="otel_agentloop"):
        _run.keep_run_id(_verl_config(folder, "trainer.resume_mode=disable"))
    (line,) = _run_file_warnings(caplog)
    assert f"cannot keep the run id in {folder / _run.RUN_FILE} (FileExistsError" in line, line
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"] and folder.read_text() == "not a folder"


def test_a_launch_that_resumes_from_a_corrupt_run_file_says_so_and_traces_under_a_new_run(tmp_path) -> None:
    """Through ``run_ppo`` in a driver process: the warning reaches the driver's stderr, the run goes on (its
    workers trace under the new run id) and the corrupt file is still there, renamed."""
    folder = tmp_path / "checkpoints"
    trace = tmp_path / "trace.jsonl"
    _save_checkpoint(folder, 2)
    (folder / _run.RUN_FILE).write_text('{"run_id": ')
    (run_id, _), stderr = _launch(tmp_path, folder, "auto", trace, output=True)
    (aside,) = folder.glob(_run.RUN_FILE + ".corrupt-*")
    assert aside.read_text() == '{"run_id": '
    assert json.loads((folder / _run.RUN_FILE).read_text()) == {"run_id": run_id}
    lines = [line for line in stderr.splitlines() if "cannot be read" in line]
    assert len(lines) == 1 and f"new run id {run_id}; the file is kept as {aside}" in lines[0], stderr[-3000:]
    samples = [r for r in read_jsonl(str(trace)) if r.name == sc.SAMPLE_SPAN]
    assert samples and {r.resource[sc.RL_RUN_ID] for r in samples} == {run_id}
