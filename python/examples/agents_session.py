"""An OpenAI Agents SDK agent whose conversation and memory live in shadowbrain.

    python examples/agents_session.py [DATA_DIR]

With OPENAI_API_KEY set, the agent runs on OpenAI's model; without it, on the SDK's
scripted model (the same runner, no network), so the example runs anywhere. Run it twice
with the same DATA_DIR: the second run starts with the first one's conversation.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile

from agents import Agent, Model, Runner, set_tracing_disabled
from agents.testing import ScriptedModel, assistant_message, function_call

from shadowbrain import Memory
from shadowbrain.agents import ShadowbrainSession, memory_tools


def model() -> Model | str:
    if os.environ.get("OPENAI_API_KEY"):
        return "gpt-4.1-mini"
    set_tracing_disabled(True)
    return ScriptedModel(
        [
            [function_call("remember", {"text": "Ana's usual order is a flat white"}, call_id="c1")],
            [assistant_message("Noted: a flat white.")],
            [function_call("recall", {"query": "what does Ana usually order?"}, call_id="c2")],
            [assistant_message("Your usual, a flat white.")],
        ]
    )


async def main(data: str) -> None:
    with Memory(data) as memory:
        print(f"memory: {memory!r}, {memory.embedder}")
        agent = Agent(
            name="barista",
            instructions="You serve Ana. Remember her preferences with the remember tool "
            "and look them up with recall.",
            model=model(),
            tools=memory_tools(memory, "cafe", agent_id="barista"),
        )
        session = ShadowbrainSession("ana-chat", memory, agent_id="barista")
        before = len(await session.get_items())
        for said in ["My usual is a flat white.", "The usual, please."]:
            result = await Runner.run(agent, said, session=session)
            print(f"Ana: {said}\nbarista: {result.final_output}")
        items = await session.get_items()
        print(f"the session holds {len(items)} items ({before} from earlier runs)")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        asyncio.run(main(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            asyncio.run(main(os.path.join(tmp, "data")))
