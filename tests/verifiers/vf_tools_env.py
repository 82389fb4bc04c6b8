"""A verifiers 0.4 taskset for the tests: 2 tasks, a task-scoped Toolset of 2 tools (``ping``, ``pong``; each
counts its calls in the rollout's state) and a reward (the fraction of the 2 tools called at least once).
Run as a module, it is the tool server (verifiers launches ``python -m vf_tools_env``)."""

import verifiers.v1 as vf


class PingState(vf.State):
    pings: int = 0
    pongs: int = 0


class PingToolset(vf.Toolset[vf.ToolsetConfig, PingState]):
    TOOL_PREFIX = "pp"

    @vf.tool
    def ping(self) -> str:
        """Count a ping."""
        self.state.pings += 1
        return f"pings={self.state.pings}"

    @vf.tool
    def pong(self) -> str:
        """Count a pong."""
        self.state.pongs += 1
        return f"pongs={self.state.pongs}"


class PingTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class PingTask(vf.Task[vf.TaskData, PingState, PingTaskConfig]):
    @classmethod
    def toolsets(cls, config: PingTaskConfig) -> list[vf.Toolset]:
        return [PingToolset(config.tools)]

    @vf.reward(weight=1.0)
    async def both_tools(self, trace: vf.Trace) -> float:
        return (float(trace.state.pings > 0) + float(trace.state.pongs > 0)) / 2


class PingConfig(vf.TasksetConfig):
    task: PingTaskConfig = PingTaskConfig()


class PingTaskset(vf.Taskset[PingTask, PingConfig]):
    def load(self) -> list[PingTask]:
        return [PingTask(vf.TaskData(idx=i, prompt=f"ping {i}"), self.config.task) for i in range(2)]


__all__ = ["PingTaskset"]


if __name__ == "__main__":
    PingToolset.run()
