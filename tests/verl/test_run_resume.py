"""A verl run resumed from its checkpoint keeps its ``rl.run.id`` (issue 19): the driver keeps the id in verl's
checkpoint folder, written on a fresh start and read back when verl will resume there.

Real: verl's ``run_ppo`` (its ``ray.init`` on a local cluster, the task runner actor, a V1 agent-loop worker
actor tracing samples), launched twice as a driver script (``__main__``) in separate processes, with verl and
Ray instrumented in the driver as ``opentelemetry-instrument`` does. Between the launches the test writes what
verl's ``_save_checkpoint`` leaves for ``find_latest_ckpt_path`` (the tracker file and the ``global_step_N``
folder); the model state a real save adds plays no part in finding the checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import ray_scenarios as rs

from otel_agentloop import semconv as sc
from otel_agentloop._configure import process_run_id
from otel_agentloop.analysis._decode import read_jsonl
from otel_agentloop.integrations.verl import _run

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


def _launch(tmp_path: Path, folder: Path, mode: str, trace: Path) -> tuple[str, str]:
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
    return run_id, attempt


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
