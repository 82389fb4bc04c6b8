"""A verifiers 0.4 taskset whose 2 tools are served by one eval-level shared tool server (the taskset's
``toolsets()``: launched once, serving every rollout, each rollout's state through verifiers' signed state
channel): ``vf_tools_env``'s ``PingToolset`` (so the server runs as ``python -m vf_tools_env``), 2 tasks, the same
reward (the fraction of the 2 tools called at least once)."""

import verifiers.v1 as vf
from vf_tools_env import PingState, PingToolset


class SharedTask(vf.Task[vf.TaskData, PingState, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def both_tools(self, trace: vf.Trace) -> float:
        return (float(trace.state.pings > 0) + float(trace.state.pongs > 0)) / 2


class SharedConfig(vf.TasksetConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class SharedTaskset(vf.Taskset[SharedTask, SharedConfig]):
    @classmethod
    def toolsets(cls, config: SharedConfig) -> list[vf.Toolset]:
        return [PingToolset(config.tools)]

    def load(self) -> list[SharedTask]:
        return [SharedTask(vf.TaskData(idx=i, prompt=f"ping {i}"), self.config.task) for i in range(2)]


__all__ = ["SharedTaskset"]
