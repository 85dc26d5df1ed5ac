"""The OpenAI Agents SDK adapter against the real SDK: ``ShadowbrainSession`` as its
``Session`` protocol says, and a run of the SDK's ``Runner`` with its scripted model (the
SDK's ``Model`` interface, no network) that keeps its conversation in shadowbrain and
uses the ``remember``/``recall`` tools, embedded and against a real server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, Runner, set_tracing_disabled
from agents.memory import Session, SessionSettings
from agents.testing import ScriptedModel, assistant_message, function_call

import shadowbrain
from shadowbrain import Memory
from shadowbrain.agents import ITEM_KIND, ShadowbrainSession, item_text, memory_tools

set_tracing_disabled(True)

ITEMS: list[Any] = [
    {"role": "user", "content": "book the usual table for friday"},
    {
        "type": "function_call",
        "call_id": "call-1",
        "name": "book",
        "arguments": json.dumps({"day": "friday", "seats": 4}),
    },
    {"type": "function_call_output", "call_id": "call-1", "output": "booked: table 7 at 19:00"},
    {
        "role": "assistant",
        "type": "message",
        "status": "completed",
        "id": "msg-1",
        "content": [{"type": "output_text", "text": "Table 7 is yours at 19:00.", "annotations": []}],
    },
]


def test_the_session_keeps_items_whole_and_in_order(memory: Memory) -> None:
    async def run() -> None:
        session = ShadowbrainSession("chat-1", memory, agent_id="concierge")
        assert isinstance(session, Session)
        assert await session.get_items() == []
        assert await session.pop_item() is None
        await session.add_items(ITEMS[:2])
        await session.add_items(ITEMS[2:])
        assert await session.get_items() == ITEMS
        assert await session.get_items(limit=2) == ITEMS[2:]
        assert await session.get_items(limit=0) == []
        # Another object over the same memory sees the same conversation.
        assert await ShadowbrainSession("chat-1", memory).get_items() == ITEMS
        assert await ShadowbrainSession("chat-2", memory).get_items() == []
        assert await session.pop_item() == ITEMS[-1]
        assert await session.get_items() == ITEMS[:-1]
        await session.clear_session()
        assert await session.get_items() == []
        await session.add_items(ITEMS[:1])
        assert await session.get_items() == ITEMS[:1]

    asyncio.run(run())
    # Each item is a pinned record the rest of the API sees: recallable, never faded,
    # written by the session's agent; the cleared ones archived, with their history.
    records = memory.timeline("chat-1", limit=100)
    assert all(r.kind == ITEM_KIND for r in records)
    assert [r.status for r in records].count("pinned") == 1
    assert [r.status for r in records].count("archived") == len(ITEMS)
    assert all(r.agent_id == "concierge" for r in records if r.status == "archived")
    found = memory.recall("chat-1", "which table did we book", scope="session")
    assert found.memories and found.memories[0].kind == ITEM_KIND
    assert records[0].text == "user: book the usual table for friday"


def test_items_are_paged_past_a_timeline_page(memory: Memory) -> None:
    many: list[Any] = [{"role": "user", "content": f"message {i}"} for i in range(1203)]

    async def run() -> None:
        session = ShadowbrainSession("long", memory)
        await session.add_items(many)
        assert await session.get_items() == many
        assert await session.get_items(limit=1001) == many[-1001:]

    asyncio.run(run())


def test_a_long_item_is_kept_whole(memory: Memory) -> None:
    page = "line of a long tool output\n" * 20_000  # 540 KB: over the content limit
    long: Any = {"type": "function_call_output", "call_id": "call-9", "output": page}

    async def run() -> None:
        session = ShadowbrainSession("long-items", memory)
        await session.add_items([ITEMS[0], long, ITEMS[3]])
        assert await session.get_items() == [ITEMS[0], long, ITEMS[3]]
        assert await session.pop_item() == ITEMS[3]
        assert await session.pop_item() == long

    asyncio.run(run())


def test_session_settings_limit_applies_when_no_limit_is_given(memory: Memory) -> None:
    async def run() -> None:
        session = ShadowbrainSession("chat", memory, session_settings=SessionSettings(limit=1))
        await session.add_items(ITEMS)
        assert await session.get_items() == ITEMS[-1:]
        assert await session.get_items(limit=3) == ITEMS[-3:]

    asyncio.run(run())


def test_item_text_reads_each_kind_of_item() -> None:
    assert item_text(ITEMS[0]) == "user: book the usual table for friday"
    assert item_text(ITEMS[1]).startswith("called book(")
    assert item_text(ITEMS[2]) == "tool output: booked: table 7 at 19:00"
    assert item_text(ITEMS[3]) == "assistant: Table 7 is yours at 19:00."
    assert item_text({"type": "reasoning", "summary": []}).startswith("reasoning: ")


def test_a_bad_item_is_refused_and_nothing_is_written(memory: Memory) -> None:
    async def run() -> None:
        session = ShadowbrainSession("bad", memory)
        with pytest.raises(TypeError, match="TResponseInputItem"):
            await session.add_items([ITEMS[0], 42])  # type: ignore[list-item]
        assert await session.get_items() == []

    asyncio.run(run())


def test_a_runner_keeps_its_conversation_and_uses_the_memory_tools(memory: Memory) -> None:
    """Two runs of the SDK's runner on one session: the first remembers a fact with the
    tool, the second recalls it; the second run's model sees the first run's turns, read
    back from shadowbrain."""
    model = ScriptedModel(
        [
            [function_call("remember", {"text": "the user's table is number 7"}, call_id="r1")],
            [assistant_message("I'll remember your table.")],
            [function_call("recall", {"query": "which table does the user like?"}, call_id="r2")],
            [assistant_message("Your table is number 7.")],
        ]
    )
    agent = Agent(
        name="concierge",
        instructions="Help the user; remember what matters.",
        model=model,
        tools=memory_tools(memory, "chat-9", agent_id="concierge"),
    )
    session = ShadowbrainSession("chat-9", memory, agent_id="concierge")

    async def run() -> None:
        first = await Runner.run(agent, "my table is number 7", session=session)
        assert first.final_output == "I'll remember your table."
        second = await Runner.run(agent, "which table do I like?", session=session)
        assert second.final_output == "Your table is number 7."

    asyncio.run(run())
    model.assert_complete()
    # The last model call was given the whole conversation from the session, in order,
    # and the recall tool's answer, which found what the first run remembered.
    last = model.calls[-1].input
    assert isinstance(last, list)
    said = [i.get("content") for i in last if i.get("role") == "user"]
    assert said == ["my table is number 7", "which table do I like?"]
    outputs = [i["output"] for i in last if i.get("type") == "function_call_output"]
    assert outputs[0].startswith("remembered (mem-")
    assert "the user's table is number 7" in outputs[1]
    items = asyncio.run(session.get_items())
    assert [i.get("type", "message") for i in items] == [
        "message",
        "function_call",
        "function_call_output",
        "message",
        "message",
        "function_call",
        "function_call_output",
        "message",
    ]
    # What the tool remembered is an ordinary memory of the agent.
    facts = memory.recall("elsewhere", "table number", scope="agent", agent_id="concierge", kinds=["observation"])
    assert [m.text for m in facts.memories] == ["the user's table is number 7"]


def test_the_conversation_survives_a_restart(tmp_path: Path, config_file: Path) -> None:
    with Memory(tmp_path / "data", config=config_file) as m:
        asyncio.run(ShadowbrainSession("s", m).add_items(ITEMS))

    async def reopen() -> list[Any]:
        async with shadowbrain.AsyncMemory(tmp_path / "data", config=config_file) as m:
            return await ShadowbrainSession("s", m).get_items()

    assert asyncio.run(reopen()) == ITEMS
