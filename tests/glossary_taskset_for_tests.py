"""A verifiers tool taskset written as the verifiers docs show one (their `glossary`
example, docs/v1/tasksets.md): a Toolset with one `@vf.tool`, a Task that declares it and
scores `trace.last_reply`, a Taskset that loads the tasks. Exported in `__all__`, so that
its module name is its taskset id."""

import verifiers.v1 as vf

FACTS = {
    "ada lovelace": "the first computer program",
    "alan turing": "the turing machine",
    "grace hopper": "the first compiler",
}


class GlossaryToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = "facts"

    @vf.tool
    def lookup(self, name: str) -> str:
        """Look up what a person or thing is known for."""
        return FACTS.get(name.strip().lower(), "no entry found")


class GlossaryTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class GlossaryTaskData(vf.TaskData):
    answer: str


class GlossaryTask(vf.Task[GlossaryTaskData, vf.State, GlossaryTaskConfig]):
    @classmethod
    def toolsets(cls, config: GlossaryTaskConfig) -> list[vf.Toolset]:
        return [GlossaryToolset(config.tools)]

    @vf.reward(weight=1.0)
    async def looked_up(self, trace: vf.Trace) -> float:
        return float(self.data.answer.lower() in (trace.last_reply or "").lower())


class GlossaryConfig(vf.TasksetConfig):
    task: GlossaryTaskConfig = GlossaryTaskConfig()


class GlossaryTaskset(vf.Taskset[GlossaryTask, GlossaryConfig]):
    def load(self) -> list[GlossaryTask]:
        return [
            GlossaryTask(
                GlossaryTaskData(
                    idx=i,
                    name=entity.title(),
                    prompt=f'Use the `facts_lookup` tool to look up "{entity.title()}".',
                    answer=fact,
                ),
                self.config.task,
            )
            for i, (entity, fact) in enumerate(FACTS.items())
        ]


__all__ = ["GlossaryTaskset"]
