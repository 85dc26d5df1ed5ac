"""shadowbrain for the OpenAI Agents SDK (``pip install 'shadowbrain[agents]'``).

``ShadowbrainSession(session_id, memory)`` is a ``Session`` of the SDK: hand it to
``Runner.run(..., session=...)`` and the conversation is kept in shadowbrain. Each item is
one record of kind ``agent_item`` in the shadowbrain session ``session_id``, the item
whole in the record's ``content`` and a readable rendering in its ``text`` (so ``recall``
finds past turns too; a long item, its JSON over 64 KiB, is kept as the text instead),
written pinned so the policy never fades it. Items come back in the order they were added; ``pop_item`` and ``clear_session`` archive records (history is
kept, nothing is recalled from them again).

``memory_tools(memory, session_id)`` gives the agent two function tools, ``remember`` and
``recall``, over the same memory: what it chooses to remember, ranked and explained when it
asks. See docs/python.md.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

try:
    from agents import Tool, function_tool
    from agents.items import TResponseInputItem
    from agents.memory import SessionSettings
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "shadowbrain.agents needs the OpenAI Agents SDK: pip install 'shadowbrain[agents]' "
        f"(or openai-agents) ({e})"
    ) from e

from ._memory import AsyncMemory, Memory, Scope
from ._types import Record

ITEM_KIND = "agent_item"
"""The kind of the records a ``ShadowbrainSession`` keeps its items in."""

# The contract's largest timeline page: one request reads this many records.
_PAGE = 1000
# The contract's largest write: this many items are sent in one request.
_BATCH = 1000
# An item whose JSON is longer than this (a long tool output, a file) is kept as the text
# of its record instead of its content: a text may be four times longer than a content by
# default (1 MiB against 256 KiB, docs/configuration.md "[limits]").
_LONG = 64 * 1024


def _async(memory: Memory | AsyncMemory) -> AsyncMemory:
    return memory if isinstance(memory, AsyncMemory) else AsyncMemory.wrap(memory)


def _plain(item: Any) -> dict[str, Any]:
    # The runner hands over dicts; a caller may hand over the SDK's pydantic models.
    if isinstance(item, Mapping):
        return dict(item)
    dump = getattr(item, "model_dump", None)
    if callable(dump):
        plain: dict[str, Any] = dump(exclude_unset=True, mode="json")
        return plain
    raise TypeError(
        f"a session item is a dict (a TResponseInputItem), not {type(item).__name__}"
    )


def _parts(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, Mapping):
                for field in ("text", "refusal", "transcript"):
                    value = part.get(field)
                    if isinstance(value, str):
                        texts.append(value)
                        break
        return " ".join(texts)
    return ""


def item_text(item: Mapping[str, Any]) -> str:
    """The words of an item, as recall should match them: ``role: text`` for a message,
    the call and its arguments for a tool call, the output for a tool's answer."""
    kind = item.get("type", "message")
    if "role" in item and kind == "message":
        text = f"{item['role']}: {_parts(item.get('content'))}"
    elif kind == "function_call":
        text = f"called {item.get('name')}({item.get('arguments', '')})"
    elif kind == "function_call_output":
        output = item.get("output")
        text = f"tool output: {output if isinstance(output, str) else _parts(output)}"
    else:
        text = f"{kind}: {json.dumps(item, ensure_ascii=False)}"
    return text if text.strip(" :") else str(kind)


def _item(record: Record) -> TResponseInputItem:
    if isinstance(record.metadata, dict) and record.metadata.get("item") == "text":
        long: TResponseInputItem = json.loads(record.text)
        return long
    item: TResponseInputItem = record.content
    return item


class ShadowbrainSession:
    """An Agents SDK ``Session`` kept in shadowbrain (see the module's documentation).

    ``memory`` is a ``Memory`` or an ``AsyncMemory``, embedded or a client; ``agent_id``
    is written on every item (so ``recall`` with scope ``agent`` finds the agent's past
    conversations). One object is safe to use from several tasks: its changes are made one
    at a time.
    """

    def __init__(
        self,
        session_id: str,
        memory: Memory | AsyncMemory,
        *,
        agent_id: str | None = None,
        session_settings: SessionSettings | None = None,
    ) -> None:
        self.session_id = session_id
        self.session_settings = session_settings
        self.memory = _async(memory)
        self.agent_id = agent_id
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"ShadowbrainSession({self.session_id!r}, {self.memory!r})"

    async def _live(self, limit: int | None) -> list[Record]:
        """The session's live items' records, newest first, at most ``limit``."""
        out: list[Record] = []
        before: str | None = None
        # A few items (`pop_item`, a short history) read a short page, not a whole one;
        # records of other kinds in the session are paged past either way.
        size = _PAGE if limit is None else min(_PAGE, limit + 16)
        while limit is None or len(out) < limit:
            page = await self.memory.timeline(self.session_id, limit=size, before=before)
            for record in page:
                if record.kind == ITEM_KIND and record.status in ("pinned", "active"):
                    out.append(record)
                    if limit is not None and len(out) == limit:
                        break
            if len(page) < size:
                break
            before = page[-1].id
        return out

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The conversation, oldest first; with ``limit``, its latest ``limit`` items."""
        if limit is None and self.session_settings is not None:
            limit = self.session_settings.limit
        if limit is not None and limit <= 0:
            return []
        records = await self._live(limit)
        return [_item(r) for r in reversed(records)]

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Appends ``items``, in order, once durable."""
        events = []
        for item in items:
            plain = _plain(item)
            encoded = json.dumps(plain, ensure_ascii=False)
            event: dict[str, Any] = {"kind": ITEM_KIND, "pinned": True}
            if len(encoded) > _LONG:
                event["text"] = encoded
                event["metadata"] = {"item": "text"}
            else:
                event["text"] = item_text(plain)
                event["content"] = plain
            if self.agent_id is not None:
                event["agent_id"] = self.agent_id
            events.append(event)
        async with self._lock:
            for start in range(0, len(events), _BATCH):
                await self.memory.record(self.session_id, events[start : start + _BATCH])

    async def pop_item(self) -> TResponseInputItem | None:
        """Removes the latest item (its record is archived) and answers it."""
        async with self._lock:
            newest = await self._live(1)
            if not newest:
                return None
            await self.memory.forget(newest[0].id)
            return _item(newest[0])

    async def clear_session(self) -> None:
        """Removes every item (their records are archived)."""
        async with self._lock:
            for record in await self._live(None):
                await self.memory.forget(record.id)


def memory_tools(
    memory: Memory | AsyncMemory,
    session_id: str,
    *,
    agent_id: str | None = None,
    scope: Scope = "agent",
    k: int = 5,
) -> list[Tool]:
    """Two function tools over ``memory``: ``remember(text)`` records a fact in
    ``session_id`` (written by ``agent_id``), ``recall(query)`` answers the ``k`` memories
    of ``scope`` that fit, ready for the prompt. With the default scope ``agent`` (which
    needs ``agent_id``; ``session`` otherwise) the agent finds what it remembered in any
    of its sessions, and the knowledge pool."""
    mem = _async(memory)
    if scope == "agent" and agent_id is None:
        scope = "session"

    @function_tool(name_override="remember")
    async def remember(text: str) -> str:
        """Remember a fact, decision or lesson for later conversations.

        Args:
            text: What to remember, in one or two self-contained sentences.
        """
        ids = await mem.record(session_id, text=text, kind="observation", agent_id=agent_id)
        return f"remembered ({ids[0]})"

    @function_tool(name_override="recall")
    async def recall(query: str) -> str:
        """Recall what was remembered about a subject.

        Args:
            query: The question or subject to remember things about.
        """
        answer = await mem.recall(session_id, query, k=k, scope=scope, agent_id=agent_id)
        return answer.context or "nothing remembered about that"

    return [remember, recall]
