"""What a host written in Python does with shadowbrain: the official MCP SDK (`mcp` on the
Python package index) connects, lists the tools, remembers, recalls and sends feedback.

    python mcp_client.py stdio BINARY DATA_DIR   # starts `BINARY mcp --data DATA_DIR`
    python mcp_client.py http URL KEY            # Streamable HTTP with `Authorization: Bearer KEY`
    python mcp_client.py hold URL KEY SECONDS    # one connection, a recall every 100 ms

Run by tests/mcp.rs with the interpreter of the throwaway virtualenv that
scripts/install-mcp-sdk makes. Prints one JSON line per connection mode (the protocol
version negotiated and what the tools answered); exits non-zero when a check fails.
"""

import asyncio
import json
import sys
import time

import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

TOOLS = [
    "remember", "recall", "feedback", "forget", "mark",
    "timeline", "sessions", "knowledge_search", "knowledge_graph", "condense",
]


def check(condition, what):
    if not condition:
        raise SystemExit(f"check failed: {what}")


async def session(server, mode, session_id):
    async with Client(server, mode=mode) as client:
        tools = await client.list_tools()
        names = [t.name for t in tools.tools]
        check(names == TOOLS, f"the tools are the contract's: {names}")
        check(all(t.output_schema for t in tools.tools), "every tool has an output schema")

        remembered = await client.call_tool("remember", {
            "session_id": session_id,
            "events": [
                {"kind": "observation", "text": "the deploy runner moved to eu-2"},
                {"kind": "user_message", "text": "send the weekly report as CSV"},
            ],
        })
        check(not remembered.is_error, f"remember: {remembered.content}")
        ids = remembered.structured_content["ids"]
        check(len(ids) == 2, f"two ids: {ids}")

        recalled = await client.call_tool("recall", {
            "session_id": session_id, "query": "which region does the deploy runner use?", "k": 5,
        })
        check(not recalled.is_error, f"recall: {recalled.content}")
        memories = recalled.structured_content["memories"]
        check(any(m["id"] == ids[0] for m in memories), f"the deploy memory is recalled: {memories}")
        check("eu-2" in recalled.structured_content["context"], "the context has it")
        check("recall_id" in recalled.content[0].text, "the text names the recall id")
        recall_id = recalled.structured_content["recall_id"]

        feedback = await client.call_tool("feedback", {
            "session_id": session_id, "recall_id": recall_id, "outcome": "success",
        })
        check(not feedback.is_error, f"feedback: {feedback.content}")
        check(feedback.structured_content["updated"] >= 1, "feedback updated the memories")

        bad = await client.call_tool("recall", {"session_id": session_id, "query": "x", "k": 0})
        check(bad.is_error, "k = 0 is a tool error")
        check("invalid_k" in bad.content[0].text, f"the error names the field: {bad.content}")

        return {
            "mode": mode,
            "protocol_version": client.protocol_version,
            "tools": len(names),
            "recalled": len(memories),
            "updated": feedback.structured_content["updated"],
        }


async def hold(url, key, seconds):
    """One connection (the legacy, session-based mode: what most clients speak today) kept
    for `seconds`, recalling every 100 ms: prints `ok MS` or `error MS WHY` per call, MS
    the Unix time in milliseconds, so the caller can line the calls up with a fault."""
    async def refused(response):
        # The SDK turns an HTTP error into "Server returned an error response": say which.
        if response.status_code >= 400:
            await response.aread()
            print(f"refused {int(time.time() * 1000)} {response.status_code} {response.text}",
                  file=sys.stderr, flush=True)

    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=30,
                              event_hooks={"response": [refused]})
    server = streamable_http_client(url, http_client=http)
    async with Client(server, mode="legacy") as client:
        remembered = await client.call_tool("remember", {
            "session_id": "held",
            "events": [{"kind": "observation", "text": "the held session's first event"}],
        })
        check(not remembered.is_error, f"remember: {remembered.content}")
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            try:
                recalled = await client.call_tool("recall", {
                    "session_id": "held", "query": "first event", "k": 3,
                })
                if recalled.is_error:
                    print(f"error {int(time.time() * 1000)} {recalled.content}", flush=True)
                else:
                    print(f"ok {int(time.time() * 1000)}", flush=True)
            except Exception as e:  # the caller counts them: any is a failure
                print(f"error {int(time.time() * 1000)} {type(e).__name__}: {e}", flush=True)
            await asyncio.sleep(0.1)


async def main():
    if sys.argv[1] == "hold":
        await hold(sys.argv[2], sys.argv[3], float(sys.argv[4]))
        return
    kind, target, arg = sys.argv[1:4]
    results = []
    for mode in ("auto", "legacy"):
        if kind == "stdio":
            server = StdioServerParameters(command=target, args=["mcp", "--data", arg])
        else:
            http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {arg}"}, timeout=30)
            server = streamable_http_client(target, http_client=http)
        results.append(await session(server, mode, f"python-{mode}"))
    for result in results:
        print(json.dumps(result))


asyncio.run(main())
