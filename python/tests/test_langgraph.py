"""The LangGraph adapter against the real LangGraph: ``ShadowbrainStore`` checked op for op
against LangGraph's own ``InMemoryStore`` on a random sequence of puts, gets, deletes,
searches and listings; natural-language search ranked by shadowbrain's recall; and a
compiled graph whose nodes put and search memories, driven by langchain_core's fake chat
model, embedded and against a real server."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.runtime import Runtime
from langgraph.store.base import BaseStore, Item, PutOp
from langgraph.store.memory import InMemoryStore

import shadowbrain
from shadowbrain import Memory
from shadowbrain.langgraph import ITEM_KIND, ShadowbrainStore, session_of

NAMESPACES = [("users", "ana"), ("users", "bo"), ("users", "bo", "drafts"), ("docs",), ("weird: ns/ü", "x y")]
KEYS = ["a", "b", "c", "key with spaces", "ключ"]


def _plain(item: Item | None) -> tuple[tuple[str, ...], str, dict[str, Any]] | None:
    return None if item is None else (item.namespace, item.key, item.value)


def test_the_store_answers_as_langgraphs_own_store(memory: Memory) -> None:
    """200 random operations, the same on both stores; every answer compared."""
    ours, theirs = ShadowbrainStore(memory), InMemoryStore()
    rng = random.Random(48)
    for step in range(200):
        namespace, key = rng.choice(NAMESPACES), rng.choice(KEYS)
        roll = rng.random()
        what = f"step {step}"
        if roll < 0.4:
            value = {"topic": rng.choice(["food", "travel"]), "n": rng.randint(0, 9), "tags": ["x", str(step)]}
            ours.put(namespace, key, value)
            theirs.put(namespace, key, value)
        elif roll < 0.55:
            ours.delete(namespace, key)
            theirs.delete(namespace, key)
        elif roll < 0.75:
            assert _plain(ours.get(namespace, key)) == _plain(theirs.get(namespace, key)), what
        elif roll < 0.9:
            prefix = namespace[: rng.randint(0, len(namespace))]
            filters: list[dict[str, Any] | None] = [None, {"topic": "food"}, {"n": {"$gte": 5}}, {"n": {"$ne": 3}, "topic": "travel"}]
            flt = rng.choice(filters)
            got = sorted(map(_plain, ours.search(prefix, filter=flt, limit=100)), key=repr)
            want = sorted(map(_plain, theirs.search(prefix, filter=flt, limit=100)), key=repr)
            assert got == want, what
        else:
            depth = rng.choice([None, 1, 2])
            # LangGraph's in-memory store keeps listing a namespace whose items were all
            # deleted; ours lists the namespaces that hold items, as its database stores do.
            live = {i.namespace for i in theirs.search((), limit=1000)}
            want_ns = sorted({n if depth is None else n[:depth] for n in live})
            assert ours.list_namespaces(max_depth=depth) == want_ns, what
            assert ours.list_namespaces(prefix=("users",)) == sorted(n for n in live if n[0] == "users"), what
            assert ours.list_namespaces(suffix=("drafts",)) == sorted(n for n in live if n[-1] == "drafts"), what


def test_puts_replace_and_keep_the_history(memory: Memory) -> None:
    store = ShadowbrainStore(memory)
    store.put(("prefs",), "theme", {"value": "dark"})
    first = store.get(("prefs",), "theme")
    assert first is not None
    store.put(("prefs",), "theme", {"value": "light"})
    second = store.get(("prefs",), "theme")
    assert second is not None and second.value == {"value": "light"}
    assert second.created_at == first.created_at
    assert second.updated_at >= first.updated_at
    # Recall never returns the old value; the timeline keeps both, the old one obsolete.
    hits = store.search(("prefs",), query="value dark", limit=5)
    assert [h.value for h in hits] == [{"value": "light"}]
    records = memory.timeline(session_of(("prefs",), "theme"))
    assert [(r.kind, r.status) for r in records] == [(ITEM_KIND, "pinned"), (ITEM_KIND, "obsolete")]
    assert "replaced by a newer value" in memory.history(records[1].id)[-1].detail
    store.delete(("prefs",), "theme")
    assert store.get(("prefs",), "theme") is None
    assert store.search(("prefs",)) == []
    store.put(("prefs",), "theme", {"value": "blue"})
    again = store.get(("prefs",), "theme")
    assert again is not None and again.value == {"value": "blue"} and again.created_at > first.created_at


def test_a_query_is_ranked_by_recall_within_the_prefix_and_filter(memory: Memory) -> None:
    store = ShadowbrainStore(memory, fields=["text"])
    docs = {
        "py": {"text": "python programming tutorial with list comprehensions", "lang": "en"},
        "ts": {"text": "typescript generics guide", "lang": "en"},
        "cook": {"text": "how to bake sourdough bread at home", "lang": "en"},
        "py-fr": {"text": "tutoriel de programmation python", "lang": "fr"},
    }
    for key, value in docs.items():
        store.put(("docs", "public"), key, value)
    store.put(("docs", "private"), "py", {"text": "python programming secrets", "lang": "en"})
    hits = store.search(("docs", "public"), query="python programming tutorial", limit=3)
    assert hits[0].key == "py" and hits[0].namespace == ("docs", "public")
    assert all(h.namespace == ("docs", "public") for h in hits)
    assert all(h.score is not None for h in hits)
    assert [h.score for h in hits] == sorted((h.score or 0.0 for h in hits), reverse=True)
    french = store.search(("docs",), query="python programming", filter={"lang": "fr"})
    assert [h.key for h in french] == ["py-fr"]
    both = store.search(("docs",), query="python programming", limit=10)
    assert {("docs", "private"), ("docs", "public")} <= {h.namespace for h in both}
    assert len(store.search(("docs",), query="python programming", limit=1, offset=1)) == 1


def test_long_namespaces_are_hashed_and_still_listed(memory: Memory) -> None:
    store = ShadowbrainStore(memory)
    namespace = ("org", "x" * 120)
    assert session_of(namespace, "k").startswith("lgh:")
    store.put(namespace, "k", {"v": 1})
    assert _plain(store.get(namespace, "k")) == (namespace, "k", {"v": 1})
    assert store.list_namespaces() == [namespace]
    assert [i.key for i in store.search(("org",))] == ["k"]
    # A fresh store (no cache) reads the tuple back from the record.
    assert ShadowbrainStore(memory).list_namespaces(prefix=("org",)) == [namespace]


def test_bad_requests_say_what_to_do(memory: Memory) -> None:
    store = ShadowbrainStore(memory)
    # LangGraph's own refusal for a store without TTLs; a PutOp with one sent straight to
    # batch gets ours.
    with pytest.raises(NotImplementedError, match="TTL is not supported"):
        store.put(("a",), "k", {"v": 1}, ttl=5)
    with pytest.raises(shadowbrain.InvalidRequest, match="without ttl"):
        store.batch([PutOp(("a",), "k", {"v": 1}, ttl=5)])
    store.put(("a",), "k", {"v": 1})
    with pytest.raises(shadowbrain.InvalidRequest, match=r"\$regex"):
        store.search(("a",), filter={"v": {"$regex": "1"}})


class Remembered(MessagesState):
    memories: list[str]


def build(store: BaseStore, replies: list[str]) -> Any:
    model = GenericFakeChatModel(messages=iter([AIMessage(r) for r in replies]))

    def remember(state: Remembered, runtime: Runtime[None]) -> dict[str, Any]:
        said = str(state["messages"][-1].content)
        if said.startswith("remember:"):
            assert runtime.store is not None
            fact = said.removeprefix("remember:").strip()
            runtime.store.put(("memories", "ana"), f"fact-{len(fact)}", {"text": fact})
        return {}

    def respond(state: Remembered, runtime: Runtime[None]) -> dict[str, Any]:
        assert runtime.store is not None
        question = str(state["messages"][-1].content)
        found = [str(i.value["text"]) for i in runtime.store.search(("memories", "ana"), query=question, limit=2)]
        prompt: list[BaseMessage] = [SystemMessage("You remember: " + "; ".join(found)), *state["messages"]]
        return {"messages": [model.invoke(prompt)], "memories": found}

    graph = StateGraph(Remembered)
    graph.add_node("remember", remember)
    graph.add_node("respond", respond)
    graph.add_edge(START, "remember")
    graph.add_edge("remember", "respond")
    graph.add_edge("respond", END)
    return graph.compile(store=store)


def test_a_compiled_graph_puts_and_searches_memories(memory: Memory) -> None:
    app = build(ShadowbrainStore(memory), ["Noted.", "Noted.", "You are allergic to peanuts."])
    app.invoke({"messages": [HumanMessage("remember: I am allergic to peanuts")], "memories": []})
    app.invoke({"messages": [HumanMessage("remember: my cat is called Miso")], "memories": []})
    # A new conversation: what the graph stored is found again through the store.
    out = app.invoke({"messages": [HumanMessage("what food allergy do I have?")], "memories": []})
    assert out["memories"][0] == "I am allergic to peanuts"
    assert out["messages"][-1].content == "You are allergic to peanuts."


def test_a_graph_run_asynchronously_uses_the_async_path(memory: Memory) -> None:
    store = ShadowbrainStore(shadowbrain.AsyncMemory.wrap(memory))
    app = build(store, ["Noted.", "Miso."])

    async def run() -> dict[str, Any]:
        await app.ainvoke({"messages": [HumanMessage("remember: my cat is called Miso")], "memories": []})
        result: dict[str, Any] = await app.ainvoke({"messages": [HumanMessage("what is my cat called?")], "memories": []})
        return result

    out = asyncio.run(run())
    assert out["memories"] == ["my cat is called Miso"]
    stored = asyncio.run(store.aget(("memories", "ana"), f"fact-{len('my cat is called Miso')}"))
    assert stored is not None and stored.value == {"text": "my cat is called Miso"}


def test_items_survive_a_restart(tmp_path: Path, config_file: Path) -> None:
    with Memory(tmp_path / "data", config=config_file) as m:
        ShadowbrainStore(m).put(("users", "ana"), "prefs", {"theme": "dark"})
    with Memory(tmp_path / "data", config=config_file) as m:
        store = ShadowbrainStore(m)
        assert _plain(store.get(("users", "ana"), "prefs")) == (("users", "ana"), "prefs", {"theme": "dark"})
        assert store.list_namespaces() == [("users", "ana")]
