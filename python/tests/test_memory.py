"""Every method of ``Memory``, embedded and as a client of ``serve``: answers, typed
objects, errors with the contract's codes, threads, asyncio, durability across a close,
and a data directory another holder keeps."""

from __future__ import annotations

import asyncio
import json
import pickle
import subprocess
import sys
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

import shadowbrain
from shadowbrain import (
    AsyncMemory,
    Closed,
    DirectoryInUse,
    InvalidRequest,
    Memory,
    NotFound,
    Recall,
    Recalled,
    Record,
    ShadowbrainError,
)

from .conftest import Server


def test_record_and_recall_answer_typed_explained_memories(memory: Memory) -> None:
    ids = memory.record("s1", text="the deploy runner lives in eu-west-1", agent_id="ops")
    assert len(ids) == 1 and ids[0].startswith("mem-")
    memory.record(
        "s1",
        [
            {"kind": "observation", "text": "the staging database is postgres 16"},
            {"kind": "action", "text": "restarted the cache on host blue", "metadata": {"host": "blue"}},
        ],
    )
    recall = memory.recall("s1", "where does the deploy runner live?", k=3)
    assert isinstance(recall, Recall)
    assert recall.recall_id and recall.policy.name
    assert recall.memories, recall
    best = recall.memories[0]
    assert isinstance(best, Recalled) and isinstance(best, Record)
    assert best.id == ids[0]
    assert best.text == "the deploy runner lives in eu-west-1"
    assert best.kind == "observation" and best.tier == "episodic" and best.status == "active"
    assert best.agent_id == "ops" and best.session_id == "s1" and best.namespace == "default"
    assert best.score > 0 and 0 <= best.why.relevance <= 1
    assert "eu-west-1" in recall.context
    assert "Recalled(" in repr(best)


def test_answers_compare_pickle_and_give_the_contracts_json(memory: Memory) -> None:
    memory.record(
        "p1",
        [
            {"kind": "observation", "text": "the invoice run starts at 02:00", "metadata": {"team": "billing", "n": [1, 2.5, None]}},
            {"kind": "observation", "text": "the invoice run takes an hour", "content": {"took_s": 3600}},
        ],
    )
    recall = memory.recall("p1", "when does the invoice run start?", k=2)
    assert len(recall.memories) == 2
    again = pickle.loads(pickle.dumps(recall))
    assert again == recall and again is not recall
    assert again.memories[0] == recall.memories[0] and isinstance(again.memories[0], Recalled)
    whole = recall.to_dict()
    assert Recall.from_json(json.dumps(whole).encode()) == recall
    assert [m["id"] for m in whole["memories"]] == [m.id for m in recall.memories]
    by_text = {m.text: m for m in recall.memories}
    start = by_text["the invoice run starts at 02:00"]
    assert start.metadata == {"team": "billing", "n": [1, 2.5, None]} and start.content is None
    assert by_text["the invoice run takes an hour"].content == {"took_s": 3600}
    # A score reads as its JSON spells it, embedded or not.
    assert start.score == whole["memories"][[m.id for m in recall.memories].index(start.id)]["score"]
    assert repr(start.score) == repr(json.loads(json.dumps(start.score)))
    # A record equals a record of the same state, not a recalled memory of it.
    record = memory.get(start.id)
    assert isinstance(record, Record) and not isinstance(record, Recalled)
    assert record == pickle.loads(pickle.dumps(record)) and record != start
    assert Record.from_json(json.dumps(record.to_dict()).encode()) == record
    # A field a newer server adds is ignored.
    newer = {**record.to_dict(), "a_newer_field": {"x": 1}}
    assert Record.from_json(json.dumps(newer).encode()) == record
    assert record.to_dict()["metadata"] == {"team": "billing", "n": [1, 2.5, None]}
    assert record.utility.successes == 0 and record.policy.name == recall.policy.name
    assert record.chain is not None and record.chain.newer == []
    assert "Record(id=" in repr(record) and "Recall(recall_id=" in repr(recall)
    with pytest.raises(shadowbrain.ShadowbrainError) as refused:
        Recall.from_json(b'{"memories": 3}')
    assert refused.value.code == "unexpected_answer"


def test_an_embedded_recall_is_the_routes_answer_without_json(tmp_path: Path, config_file: Path) -> None:
    with Memory(tmp_path / "data", config=config_file) as memory:
        memory.record("d1", [{"kind": "observation", "text": f"note {i} about the runner"} for i in range(20)])
        native = memory._transport._native  # type: ignore[attr-defined]
        direct = native.recall("default", "d1", "runner note", 5, "session")
        assert isinstance(direct, Recall)
        body = json.dumps({"query": "runner note", "k": 5, "scope": "session"}).encode()
        status, routed = native.request("default", "POST", "/v1/sessions/d1/recall", body)
        assert status == 200
        routed_json = json.loads(routed)
        mine = direct.to_dict()
        assert set(mine) == set(routed_json)
        assert [m["id"] for m in mine["memories"]] == [m["id"] for m in routed_json["memories"]]
        assert set(mine["memories"][0]) == set(routed_json["memories"][0])
        # A refusal raises the route's code and message.
        status, refused = native.request(
            "default", "POST", "/v1/sessions/d1/recall", b'{"query": "x", "k": 0}'
        )
        with pytest.raises(InvalidRequest) as raised:
            native.recall("default", "d1", "x", 0)
        assert status == 422 and raised.value.status == 422
        assert json.loads(refused)["error"] == {"code": raised.value.code, "message": raised.value.message}


def test_kinds_scope_and_time_filters_are_passed(memory: Memory) -> None:
    memory.record("a1", text="alpha fact about rivers", agent_id="x")
    memory.record("a2", text="alpha fact about mountains", agent_id="x")
    memory.record("a2", text="alpha action taken", kind="action", agent_id="y")
    only_session = memory.recall("a1", "alpha", k=10)
    assert {m.session_id for m in only_session.memories} == {"a1"}
    namespace = memory.recall("a1", "alpha", k=10, scope="namespace")
    assert {m.session_id for m in namespace.memories} == {"a1", "a2"}
    actions = memory.recall("a2", "alpha", k=10, kinds=["action"])
    assert [m.kind for m in actions.memories] == ["action"]
    future = datetime.now(timezone.utc) + timedelta(days=1)
    assert memory.recall("a2", "alpha", since=future).memories == []


def test_feedback_condense_timeline_sessions(memory: Memory) -> None:
    for i in range(8):
        memory.record("s2", text=f"step {i} of the migration went fine")
    recall = memory.recall("s2", "migration step")
    assert memory.feedback("s2", recall_id=recall.recall_id, outcome="success") == len(recall.memories)
    first = recall.memories[0].id
    assert memory.feedback("s2", memory_ids=[first], outcome="failure") == 1
    timeline = memory.timeline("s2", limit=3)
    assert [r.text for r in timeline] == [f"step {i} of the migration went fine" for i in (7, 6, 5)]
    page = memory.timeline("s2", limit=3, before=timeline[-1].id)
    assert [r.text for r in page] == [f"step {i} of the migration went fine" for i in (4, 3, 2)]
    condensed = memory.condense("s2")
    assert condensed is None or condensed.startswith("mem-")
    sessions = {s.session_id: s for s in memory.sessions()}
    assert sessions["s2"].events == 8


def test_get_history_mark_resolve_forget(memory: Memory) -> None:
    (wrong,) = memory.record("s3", text="the api key rotates every 90 days")
    (right,) = memory.record("s3", text="the api token is rotated monthly")
    record = memory.get(wrong)
    assert record.id == wrong and record.chain is not None
    marked = memory.mark(wrong, "wrong", reason="checked with security")
    assert marked.status == "wrong"
    assert wrong not in [m.id for m in memory.recall("s3", "api key rotation").memories]
    actions = [e.action for e in memory.history(wrong)]
    assert actions[0] and len(actions) >= 2
    assert any("checked with security" in e.detail for e in memory.history(wrong))
    forgotten = memory.forget(right)
    assert forgotten.status == "archived"
    restored = memory.mark(forgotten.id, "active")
    assert restored.status == "active"
    (kept,) = memory.record("s3", text="the vault lives in rack 4", pinned=True)
    assert memory.get(kept).status == "pinned"
    assert "pinned" in memory.history(kept)[0].detail


def test_knowledge_search_and_policy(memory: Memory) -> None:
    found = memory.knowledge_search("anything at all", k=5)
    assert isinstance(found, Recall) and found.memories == []
    policy = memory.policy()
    assert policy["name"] and policy["hash"]


@pytest.mark.parametrize(
    ("call", "code", "status"),
    [
        (lambda m: m.recall("s", "q", k=0), "invalid_k", 422),
        (lambda m: m.recall("s", "q", k=1000), "invalid_k", 422),
        (lambda m: m.recall("bad/session", "q"), "invalid_session_id", 422),
        (lambda m: m.record("s", text="x", kind="Not A Kind"), "invalid_kind", 422),
        (lambda m: m.get("mem-ffffffff"), "not_found", 404),
        (lambda m: m.mark("mem-ffffffff", "pinned"), "not_found", 404),
        (lambda m: m.timeline("s", limit=0), "invalid_limit", 422),
        (lambda m: m.timeline("s", before="yesterday"), "invalid_before", 422),
        (lambda m: m.timeline("s", before="mem-ffffffff"), "invalid_before", 422),
        (lambda m: m.feedback("s", outcome="success"), "invalid_feedback", 422),
    ],
)
def test_errors_carry_the_contracts_code(memory: Memory, call, code: str, status: int) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ShadowbrainError) as raised:
        call(memory)
    error = raised.value
    assert (error.code, error.status) == (code, status), error
    assert error.message
    assert isinstance(error, NotFound if status == 404 else InvalidRequest)


class _Count(int):
    """An ``int`` that is not exactly one: it takes the JSON path, not the plain one."""


@pytest.mark.parametrize(
    ("arguments", "code"),
    [
        ({"k": True}, "invalid_recall"),
        ({"k": -1}, "invalid_recall"),
        ({"k": 2.5}, "invalid_recall"),
        ({"scope": "everywhere"}, "invalid_recall"),
        ({"agent_id": 5}, "invalid_recall"),
        ({"include_knowledge": "yes"}, "invalid_recall"),
        ({"token_budget": 10**6}, "invalid_token_budget"),
        ({"scope": "agent"}, "invalid_scope"),
    ],
)
def test_recall_arguments_are_judged_as_the_route_judges_them(
    memory: Memory, arguments: dict[str, object], code: str
) -> None:
    # Embedded, plain arguments skip the JSON: odd ones must still get the route's words.
    with pytest.raises(InvalidRequest) as raised:
        memory.recall("s", "q", **arguments)  # type: ignore[arg-type]
    assert raised.value.code == code, raised.value


def test_plain_and_json_recalls_answer_alike(memory: Memory) -> None:
    memory.record("s5", [{"kind": "observation", "text": f"deploy step {i} failed"} for i in range(6)])
    plain = memory.recall("s5", "deploy failed", k=3, scope="session", include_knowledge=False)
    judged = memory.recall("s5", "deploy failed", k=_Count(3), scope="session", include_knowledge=False)
    assert len(plain.memories) == len(judged.memories) == 3
    assert {m.id for m in plain.memories} == {m.id for m in judged.memories}


@pytest.mark.parametrize(
    ("event", "code"),
    [
        ({"kind": "observation", "text": "x", "importance": float("nan")}, "malformed_json"),
        ({"kind": None, "text": "x"}, "invalid_event"),
        ({"kind": "observation", "text": "x", "pinned": None}, "invalid_event"),
        ({"kind": "observation", "text": "x", "importance": True}, "invalid_event"),
        ({"kind": "observation", "text": "x", "extra": 1}, "invalid_event"),
        ({"text": "x"}, "invalid_event"),
        ({"kind": "observation", "text": "x", "importance": 11}, "invalid_importance"),
        ({"kind": "observation", "text": "x", "importance": 10**30}, "invalid_importance"),
        ({"kind": "observation", "text": ""}, "invalid_text"),
        ({"kind": "observation", "text": "x", "agent_id": "bad agent!"}, "invalid_agent_id"),
        ({"kind": "observation", "text": "x", "parent_id": "mem-ffffffff"}, "invalid_parent_id"),
    ],
)
def test_events_are_judged_as_the_route_judges_them(
    memory: Memory, event: dict[str, object], code: str
) -> None:
    # Embedded, plain events skip the JSON: odd ones must still get the route's words.
    with pytest.raises(InvalidRequest) as raised:
        memory.record("s", [event])
    assert raised.value.code == code, raised.value


def test_plain_and_json_events_are_stored_alike(memory: Memory) -> None:
    event: dict[str, Any] = {
        "kind": "decision",
        "text": "use rack 4",
        "agent_id": "ops",
        "importance": 7,
        "pinned": True,
        "parent_id": None,
    }
    (plain,) = memory.record("s6", [event])
    # Metadata sends the write as JSON, embedded too.
    (judged,) = memory.record("s6", [{**event, "importance": 7.0, "metadata": {"ticket": 12}}])
    a, b = memory.get(plain), memory.get(judged)
    fields = [(r.kind, r.text, r.agent_id, r.importance, r.status) for r in (a, b)]
    assert fields == [("decision", "use rack 4", "ops", 7.0, "pinned")] * 2
    assert b.metadata == {"ticket": 12} and a.metadata is None


def test_bad_arguments_are_refused_before_sending(memory: Memory) -> None:
    with pytest.raises(InvalidRequest) as raised:
        memory.recall("s", "q", since=datetime(2026, 1, 1))
    assert raised.value.code == "invalid_since" and "time zone" in raised.value.message
    with pytest.raises(InvalidRequest):
        memory.record("s")
    with pytest.raises(InvalidRequest):
        memory.record("s", [{"kind": "observation", "text": "x"}], text="y")
    # What cannot be JSON is refused naming the argument, embedded or not.
    with pytest.raises(InvalidRequest) as unsendable:
        memory.recall("s", "x", kinds=[object()])  # type: ignore[list-item]
    assert unsendable.value.code == "invalid_kinds" and "`kinds`" in unsendable.value.message


def test_an_idempotency_key_stores_a_write_once(memory: Memory) -> None:
    first = memory.record("s4", text="once only", idempotency_key="write-1")
    again = memory.record("s4", text="once only", idempotency_key="write-1")
    assert first == again
    assert len(memory.timeline("s4")) == 1
    with pytest.raises(InvalidRequest) as raised:
        memory.record("s4", text="something else", idempotency_key="write-1")
    assert raised.value.code == "invalid_idempotency_key"


def test_a_closed_memory_refuses_calls(memory: Memory) -> None:
    memory.close()
    memory.close()
    with pytest.raises(Closed):
        memory.recall("s", "q")


def test_threads_share_one_memory(memory: Memory) -> None:
    errors: list[BaseException] = []
    ids: list[str] = []
    lock = threading.Lock()

    def agent(n: int) -> None:
        try:
            for i in range(10):
                new = memory.record(f"t{n}", text=f"thread {n} fact {i} zebra{n}")
                with lock:
                    ids.extend(new)
                found = memory.recall(f"t{n}", f"zebra{n}", k=20)
                assert all(m.session_id == f"t{n}" for m in found.memories)
        except BaseException as e:  # noqa: BLE001 — reported below
            errors.append(e)

    threads = [threading.Thread(target=agent, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(ids) == len(set(ids)) == 80
    assert sum(s.events for s in memory.sessions()) == 80


def test_async_memory_answers_the_same(memory: Memory) -> None:
    async def main() -> None:
        m = AsyncMemory.wrap(memory)
        ids = await asyncio.gather(*(m.record(f"as{i}", text=f"async fact {i}") for i in range(10)))
        assert len({i[0] for i in ids}) == 10
        recalls = await asyncio.gather(*(m.recall(f"as{i}", "async fact") for i in range(10)))
        assert all(r.memories for r in recalls)
        assert (await m.get(ids[0][0])).text == "async fact 0"

    asyncio.run(main())


def test_embedded_writes_survive_a_close_and_reopen(tmp_path: Path, config_file: Path) -> None:
    data = tmp_path / "data"
    with Memory(data, config=config_file) as m:
        ids = m.record("s", [{"kind": "observation", "text": f"durable {i}"} for i in range(100)])
        assert m.embedder is not None and "hash" in m.embedder
    with Memory(data, config=config_file) as m:
        # The policy condenses the session as it grows: the 100 events, and its summary.
        episodes = [r for r in m.timeline("s", limit=1000) if r.tier == "episodic"]
        assert len(episodes) == 100
        assert m.get(ids[42]).text == "durable 42"


def test_a_held_directory_is_refused_naming_the_holder(tmp_path: Path, config_file: Path) -> None:
    data = tmp_path / "data"
    with Memory(data, config=config_file):
        with pytest.raises(DirectoryInUse) as raised:
            Memory(data, config=config_file)
        assert "the Python process" in raised.value.message
        # Another process gets the same refusal, naming this one.
        script = (
            "import shadowbrain, sys\n"
            "try:\n"
            f"    shadowbrain.Memory({str(data)!r})\n"
            "except shadowbrain.DirectoryInUse as e:\n"
            "    print(e.message); sys.exit(3)\n"
        )
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        assert out.returncode == 3, out.stderr
        assert "the Python process" in out.stdout
    # Released at close: it opens again.
    Memory(data, config=config_file).close()


def test_a_directory_a_server_holds_is_refused_with_its_url(server: Server, config_file: Path) -> None:
    with pytest.raises(DirectoryInUse) as raised:
        Memory(server.data, config=config_file)
    assert server.url in raised.value.message and "Memory.connect" in raised.value.message


def test_a_client_reaches_the_same_data_as_the_server(server: Server, config_file: Path) -> None:
    with Memory.connect(server.url) as client:
        client.record("shared", text="written over HTTP")
    server.stop()
    with Memory(server.data, config=config_file) as embedded:
        assert [r.text for r in embedded.timeline("shared")] == ["written over HTTP"]


def test_a_client_says_when_the_server_is_not_there() -> None:
    client = Memory.connect("http://127.0.0.1:9", timeout=5)
    with pytest.raises(shadowbrain.ConnectionFailed) as raised:
        client.recall("s", "q")
    assert "127.0.0.1:9" in raised.value.message
    with pytest.raises(InvalidRequest):
        Memory.connect("not a url")


def test_namespaces_are_kept_apart(tmp_path: Path, config_file: Path) -> None:
    with Memory(tmp_path / "data", config=config_file, namespace="acme") as acme:
        (mine,) = acme.record("s", text="acme's secret plan")
        other = acme.in_namespace("globex")
        other.record("s", text="globex's own plan")
        assert [m.text for m in other.recall("s", "plan").memories] == ["globex's own plan"]
        with pytest.raises(NotFound):
            other.get(mine)
        with pytest.raises(InvalidRequest) as raised:
            acme.in_namespace("not a namespace!").recall("s", "q")
        assert raised.value.code == "invalid_namespace"


def test_export_and_import_move_a_namespace(tmp_path: Path, config_file: Path) -> None:
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    with Memory(tmp_path / "a", config=config_file, namespace="team") as a:
        a.record("s", text="the staging database is called orca", agent_id="ops")
        a.record("s", text="deploys freeze on fridays", pinned=True)
        recall = a.recall("s", "staging database")
        a.feedback("s", recall_id=recall.recall_id, outcome="success")
        a.in_namespace("other").record("s", text="not part of the team's export")
        exported = a.export(first)
        assert (exported.records, exported.recalls) == (2, 1)
    with Memory(tmp_path / "b", config=config_file, namespace="team") as b:
        imported = b.import_(first)
        assert (imported.imported, imported.present, imported.problems) == (3, 0, None)
        # Exported again before anything changes it: the same bytes.
        b.export(second)
        assert second.read_bytes() == first.read_bytes()
        found = b.recall("s", "what is the staging database called?")
        assert found.memories[0].text == "the staging database is called orca"
        assert [r.status for r in b.timeline("s")].count("pinned") == 1
        # Feedback on the recall made before the move still finds it.
        assert b.feedback("s", recall_id=recall.recall_id, outcome="success") == len(recall.memories)
        assert b.in_namespace("other").sessions() == []
        # Imported again after the feedback changed both records: nothing is overwritten,
        # and the report says which ids differ and what to do.
        again = b.import_(first)
        assert (again.imported, again.present, len(again.different)) == (0, 1, 2)
        assert again.problems is not None and "present but different: 2" in again.problems


def test_a_bad_export_file_is_refused_naming_the_line(tmp_path: Path, config_file: Path) -> None:
    good = tmp_path / "good.jsonl"
    with Memory(tmp_path / "a", config=config_file) as a:
        a.record("s", text="one")
        a.record("s", text="two")
        a.export(good)
    lines = good.read_text().splitlines()
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([lines[0], lines[1], "{not json", lines[2]]) + "\n")
    with Memory(tmp_path / "b", config=config_file) as b:
        with pytest.raises(shadowbrain.ShadowbrainError, match="line 3 of .*bad.jsonl") as e:
            b.import_(bad)
        assert e.value.code == "import_failed"
        assert "the 1 lines imported before it are durable" in e.value.message
        # The Memory goes on, with the line before the bad one imported.
        assert [r.text for r in b.timeline("s")] == ["one"]
        assert b.import_(good).imported == 1
        with pytest.raises(shadowbrain.ShadowbrainError, match="check the path"):
            b.import_(tmp_path / "missing.jsonl")
        with pytest.raises(shadowbrain.ShadowbrainError, match="is a directory"):
            b.export(tmp_path)


def test_a_client_cannot_export_and_says_how_to(server: Server) -> None:
    with Memory.connect(server.url) as client:
        with pytest.raises(shadowbrain.ShadowbrainError, match="shadowbrain export --data") as e:
            client.export("x.jsonl")
        assert e.value.code == "not_embedded"


def test_calls_from_other_threads_wait_for_an_import(tmp_path: Path, config_file: Path) -> None:
    exported = tmp_path / "export.jsonl"
    with Memory(tmp_path / "a", config=config_file) as a:
        # Ids are kept by an import: the exported ones (400 and up) must not be ones the
        # writer below takes meanwhile (0 and up).
        a.in_namespace("other").record("s", [{"kind": "observation", "text": f"x {i}"} for i in range(400)])
        a.record("s", [{"kind": "observation", "text": f"fact {i}"} for i in range(300)])
        a.export(exported)
    with Memory(tmp_path / "b", config=config_file) as b:
        failures: list[BaseException] = []
        written: list[str] = []
        started = threading.Event()

        def write() -> None:
            started.set()
            try:
                for i in range(100):
                    written.extend(b.record("t", text=f"during the import {i}"))
            except BaseException as e:  # noqa: BLE001 - reported below
                failures.append(e)

        writer = threading.Thread(target=write)
        writer.start()
        started.wait()
        assert b.import_(exported).imported == 300
        writer.join()
        assert failures == []
        assert len(written) == 100
        # (The session's condensations beside them.)
        assert len([r for r in b.timeline("t", limit=1000) if r.tier == "episodic"]) == 100
        assert len([r for r in b.timeline("s", limit=1000) if r.tier == "episodic"]) == 300
