"""A LangGraph graph that remembers across conversations with shadowbrain as its store.

    python examples/langgraph_store.py [DATA_DIR]

The graph's nodes put what the user asks to remember and search it, by meaning, for each
question (``store.search(..., query=...)`` is shadowbrain's recall). The chat model is
langchain_core's fake one so the example runs anywhere; put any chat model in its place.
"""

from __future__ import annotations

import os
import sys
import tempfile
import uuid
from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.runtime import Runtime

from shadowbrain import Memory
from shadowbrain.langgraph import ShadowbrainStore

USER = ("memories", "ana")

chat = GenericFakeChatModel(
    messages=iter(
        [AIMessage("Noted."), AIMessage("Noted."), AIMessage("You're allergic to peanuts.")]
    )
)


def remember(state: MessagesState, runtime: Runtime[None]) -> dict[str, Any]:
    said = str(state["messages"][-1].content)
    if said.lower().startswith("remember") and runtime.store is not None:
        fact = said.split(" ", 1)[1]
        runtime.store.put(USER, str(uuid.uuid5(uuid.NAMESPACE_OID, fact)), {"text": fact})
    return {}


def respond(state: MessagesState, runtime: Runtime[None]) -> dict[str, Any]:
    question = str(state["messages"][-1].content)
    found = runtime.store.search(USER, query=question, limit=3) if runtime.store else []
    known = "; ".join(str(item.value["text"]) for item in found)
    prompt: list[BaseMessage] = [SystemMessage(f"What you know about Ana: {known}")]
    return {"messages": [chat.invoke(prompt + list(state["messages"]))]}


def main(data: str) -> None:
    graph = StateGraph(MessagesState)
    graph.add_node("remember", remember)
    graph.add_node("respond", respond)
    graph.add_edge(START, "remember")
    graph.add_edge("remember", "respond")
    graph.add_edge("respond", END)
    with Memory(data) as memory:
        store = ShadowbrainStore(memory, fields=["text"])
        app = graph.compile(store=store)
        for said in [
            "remember that I am allergic to peanuts",
            "remember that my cat is called Miso",
            "Which food should I avoid?",
        ]:
            # Each message starts a new conversation: only the store carries memory over.
            out = app.invoke({"messages": [HumanMessage(said)]})
            print(f"Ana: {said}\nassistant: {out['messages'][-1].content}")
        best = store.search(USER, query="Which food should I avoid?", limit=1)
        print(f"the store's best match: {best[0].value['text']!r} (score {best[0].score:.3f})")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(os.path.join(tmp, "data"))
