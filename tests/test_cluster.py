"""Real daemons sharing one real PostgreSQL ledger (DESIGN §14).

Each test starts ``harness serve --ledger URL`` processes, each with its own home and
socket, on a fresh schema of the test database, with a short lease so failover is quick.
Skipped, saying why, without a test database; always run under CI (.ci/run starts one).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from daemons import wait_for_daemon
from procs import alive_with

from harness.client import Client

LEASE = 1.5  # seconds: how long a dead daemon's sessions wait for another
DEADLINE = 30.0
ALLOW = [
    {"permission": permission, "pattern": "*", "action": "allow"}
    for permission in ("bash", "edit", "external_directory")
]


class Daemon:
    def __init__(self, process: subprocess.Popen[bytes], socket: Path, log: Path) -> None:
        self.process = process
        self.client = Client(socket)
        self.log = log

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=DEADLINE)


class Cluster:
    def __init__(self, url: str, root: Path, socket_dir: Path) -> None:
        self.url = url
        self.root = root
        self.socket_dir = socket_dir
        self.daemons: list[Daemon] = []
        config = root / "config.toml"
        config.write_text(f"lease_seconds = {LEASE}\n")
        self.env = dict(os.environ)
        self.env["HARNESS_CONFIG"] = str(config)
        # Unsandboxed: these tests are about the orphans a killed daemon leaves.
        self.env["HARNESS_SANDBOX"] = "off"

    def start(self, count: int) -> list[Daemon]:
        started = []
        for _ in range(count):
            index = len(self.daemons)
            env = dict(self.env)
            env["HARNESS_HOME"] = str(self.root / f"home-{index}")
            socket = self.socket_dir / f"d{index}.sock"
            env["HARNESS_SOCKET"] = str(socket)
            log = self.root / f"daemon-{index}.log"
            with log.open("ab") as out:
                process = subprocess.Popen(
                    [sys.executable, "-m", "harness", "serve", "--ledger", self.url],
                    stderr=out,
                    env=env,
                )
            self.daemons.append(Daemon(process, socket, log))
            started.append(self.daemons[-1])
        for daemon in started:
            wait_for_daemon(daemon.process, daemon.client.socket_path, daemon.log, DEADLINE)
        return started

    def query(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            return conn.execute(sql, args).fetchall()  # type: ignore[arg-type]

    def holder_pid(self, session_id: str) -> int | None:
        rows = self.query(
            "SELECT owner FROM leases WHERE session_id = %s"
            " AND expires > extract(epoch FROM clock_timestamp())",
            session_id,
        )
        return int(rows[0][0].split(":")[1]) if rows else None

    def finished(self, session_id: str) -> list[dict[str, Any]]:
        return [
            json.loads(row[0])
            for row in self.query(
                "SELECT data FROM events WHERE session_id = %s AND type = 'turn.finished'"
                " ORDER BY seq",
                session_id,
            )
        ]


@pytest.fixture
def cluster(postgres_schema: str, tmp_path: Path, socket_dir: Path) -> Iterator[Cluster]:
    made = Cluster(postgres_schema, tmp_path, socket_dir)
    try:
        yield made
    finally:
        for daemon in made.daemons:
            daemon.kill()


def wait_for(what: str, check: Callable[[], bool], timeout: float = DEADLINE) -> float:
    """Poll ``check`` until true; the seconds it took."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < timeout, f"timed out waiting for {what}"
        time.sleep(0.02)
    return time.monotonic() - start


def script(path: Path, turns: list[dict[str, Any]]) -> str:
    path.write_text(json.dumps(turns))
    return f"scripted:{path}"


def lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def users(messages: list[dict[str, Any]]) -> list[str]:
    return [
        "".join(p["text"] for p in m["parts"] if p["type"] == "text")
        for m in messages
        if m["info"]["role"] == "user"
    ]


def test_a_session_made_on_one_daemon_is_listed_prompted_and_followed_on_the_others(
    cluster: Cluster, tmp_path: Path, project: Path
) -> None:
    a, b, c = cluster.start(3)
    model = script(tmp_path / "s.json", [{"text": "the answer", "delay": 0.05}])
    session = a.client.create_session(directory=str(project), model=model)["id"]
    assert [s["id"] for s in b.client.sessions()] == [session]
    assert c.client.session(session)["model"] == model
    follow = c.client.events(session)
    follow.open()
    sent = b.client.prompt(session, "a question")
    seen = []
    for event in follow:
        seen.append(event)
        if event.type == "turn.finished":
            break
    follow.close()
    assert seen[-1].data["message_id"] == sent and seen[-1].data["answer"] == "the answer"
    # Every durable event of the turn, in seq order, once: exactly what the ledger holds.
    durable = [e.seq for e in seen if e.seq is not None]
    stored = [row[0] for row in cluster.query(
        "SELECT seq FROM events WHERE session_id = %s AND seq >= %s AND seq <= %s ORDER BY seq",
        session, durable[0], durable[-1],
    )]  # fmt: skip
    assert durable == stored
    assert {"inbox.added", "turn.started", "message.created", "turn.finished"} <= {
        e.type for e in seen
    }
    # Last-Event-ID on yet another daemon: the rest of the story, no gap, no duplicate.
    middle = durable[len(durable) // 2]
    replay = a.client.events(session, after=middle)
    rest = []
    for event in replay:
        rest.append(event.seq)
        if event.type == "turn.finished":
            break
    replay.close()
    assert rest == [s for s in stored if s > middle]
    assert users(a.client.messages(session)) == ["a question"]


def test_kill_9_of_the_lease_holder_mid_tool_and_mid_stream_another_daemon_finishes(
    cluster: Cluster, tmp_path: Path, project: Path
) -> None:
    daemons = cluster.start(3)
    count_a, count_b = tmp_path / "count-a", tmp_path / "count-b"
    orphan = "sleep 62.7171"  # the command the kill orphans
    model_a = script(
        tmp_path / "a.json",
        [
            {"tool_calls": [{"name": "bash", "arguments": {
                "command": f"echo a >> {count_a} && {orphan}"}}]},
            {"text": "A: done"},
        ],
    )  # fmt: skip
    b_turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "bash", "arguments": {"command": f"echo b >> {count_b}"}}]},
        {"text": "B: done", "delay": 60},  # the kill lands while this step streams
    ]
    model_b = script(tmp_path / "b.json", b_turns)
    first = daemons[0].client
    a = first.create_session(directory=str(project), model=model_a, permission=ALLOW)["id"]
    b = first.create_session(directory=str(project), model=model_b, permission=ALLOW)["id"]
    first.prompt(a, "count for A")
    first.prompt(b, "count for B")
    wait_for(
        "A's bash to run and B's second step to stream",
        lambda: lines(count_a) == 1
        and cluster.query("SELECT 1 FROM parts WHERE session_id = %s AND status = 'running'", a)
        != []
        and cluster.query(
            "SELECT 1 FROM messages WHERE session_id = %s AND role = 'assistant'"
            " AND (data::json ->> 'step') = '2'",
            b,
        )
        != [],
    )
    holders = {cluster.holder_pid(a), cluster.holder_pid(b)}
    b_turns[1] = {"text": "B: done"}  # the next daemon's model answers at once
    script(tmp_path / "b.json", b_turns)
    victims = [d for d in daemons if d.process.pid in holders]
    assert victims, "no daemon holds the sessions"
    for victim in victims:
        victim.kill()
    assert alive_with(orphan), "the orphaned tool process should still be running"
    survivor = next(d for d in daemons if d not in victims)
    failover = wait_for(
        "both turns to finish on another daemon",
        lambda: len(cluster.finished(a)) == 1 and len(cluster.finished(b)) == 1,
    )
    assert failover <= LEASE + 10  # the lease, a keeper's round, a step: generous under load
    assert cluster.finished(a)[0]["answer"] == "A: done"
    assert cluster.finished(b)[0]["answer"] == "B: done"
    wait_for("the orphan to be killed by the new holder", lambda: not alive_with(orphan))
    # The bash side effects happened once; one user message per prompt.
    assert lines(count_a) == 1 and lines(count_b) == 1
    messages_a, messages_b = survivor.client.messages(a), survivor.client.messages(b)
    assert users(messages_a) == ["count for A"] and users(messages_b) == ["count for B"]
    tool_a = [p for m in messages_a for p in m["parts"] if p["type"] == "tool"]
    assert [t["state"]["status"] for t in tool_a] == ["error"]
    assert tool_a[0]["state"]["error"] == "interrupted by restart"
    leased = cluster.query("SELECT data FROM events WHERE type = 'session.leased'")
    assert {json.loads(row[0])["session_id"] for row in leased} == {a, b}
    seqs = [row[0] for row in cluster.query("SELECT seq FROM events ORDER BY seq")]
    assert seqs == list(range(1, len(seqs) + 1))


def test_a_frozen_holder_is_fenced_once_another_daemon_took_its_session(
    cluster: Cluster, tmp_path: Path, project: Path
) -> None:
    """SIGSTOP plays a partition: the holder stops renewing, another daemon takes over;
    woken again, the old holder's writes are refused and change nothing."""
    first, second = cluster.start(2)
    marker = tmp_path / "after-the-pause"
    model = script(
        tmp_path / "s.json",
        [
            {"tool_calls": [{"name": "bash", "arguments": {
                "command": f"sleep 3.3131 && echo late >> {marker}"}}]},
            {"text": "resumed elsewhere"},
        ],
    )  # fmt: skip
    session = first.client.create_session(directory=str(project), model=model, permission=ALLOW)
    sid = session["id"]
    first.client.prompt(sid, "go")
    running = "SELECT 1 FROM parts WHERE session_id = %s AND status = 'running'"
    wait_for("the bash to run", lambda: cluster.query(running, sid) != [])
    holder = next(d for d in (first, second) if d.process.pid == cluster.holder_pid(sid))
    other = second if holder is first else first
    holder.process.send_signal(signal.SIGSTOP)
    try:
        wait_for("the other daemon to finish the turn", lambda: len(cluster.finished(sid)) == 1)
        assert cluster.finished(sid)[0]["answer"] == "resumed elsewhere"
        last = cluster.query("SELECT max(seq) FROM events WHERE session_id = %s", sid)[0][0]
    finally:
        holder.process.send_signal(signal.SIGCONT)
    # The frozen daemon wakes up mid-call: its command was killed by the new holder (the
    # same machine) or ends; whatever it reports is refused by the fence.
    time.sleep(LEASE + 3)
    assert cluster.query("SELECT max(seq) FROM events WHERE session_id = %s", sid)[0][0] == last
    assert not marker.exists()
    assert other.client.session(sid)["status"] == "idle"
    text = holder.log.read_text()
    assert "lease lost" in text or "write refused" in text or "taken by another" in text


def test_fifty_sessions_over_three_daemons_are_all_answered(
    cluster: Cluster, tmp_path: Path, project: Path
) -> None:
    daemons = cluster.start(3)
    model = script(tmp_path / "s.json", [{"text": "answered"}])
    sessions = []
    for index in range(50):
        client = daemons[index % 3].client
        sessions.append(client.create_session(directory=str(project), model=model)["id"])
    prompts = {}
    for index, session in enumerate(sessions):
        prompts[session] = daemons[(index + 1) % 3].client.prompt(session, f"question {index}")
    wait_for(
        "every session to be answered",
        lambda: cluster.query("SELECT count(*) FROM events WHERE type = 'turn.finished'")[0][0]
        >= 50,
        timeout=90,
    )
    for session, message_id in prompts.items():
        finished = cluster.finished(session)
        assert [(f["message_id"], f["answer"]) for f in finished] == [(message_id, "answered")]
    ran_on = cluster.query("SELECT DISTINCT owner FROM leases WHERE epoch > 0")
    assert len(ran_on) >= 2, "the work should spread over the daemons"


def test_an_ask_raised_on_the_holder_is_listed_and_answered_through_another_daemon(
    cluster: Cluster, tmp_path: Path, project: Path
) -> None:
    first, second = cluster.start(2)
    done = tmp_path / "done"
    model = script(
        tmp_path / "s.json",
        [
            {"tool_calls": [{"name": "bash", "arguments": {"command": f"echo ok >> {done}"}}]},
            {"text": "ran it"},
        ],
    )
    sid = first.client.create_session(directory=str(project), model=model)["id"]
    first.client.prompt(sid, "run it")
    asks: list[dict[str, Any]] = []

    def listed_everywhere() -> bool:
        asks[:] = second.client.permissions(sid)
        return bool(asks) and first.client.permissions(sid) == asks

    wait_for("the ask to be listed on both daemons", listed_everywhere)
    holder = cluster.holder_pid(sid)
    answering = second if holder == first.process.pid else first
    answered: set[str] = set()

    def answer_each() -> bool:
        # bash, then external_directory (the file is outside the project): each answered
        # through the daemon that does not run the session.
        for pending in answering.client.permissions(sid):
            if pending["id"] not in answered:
                answered.add(pending["id"])
                answering.client.reply_permission(pending["id"], "once")
        return len(cluster.finished(sid)) == 1

    wait_for("the turn to finish", answer_each)
    assert cluster.finished(sid)[0]["answer"] == "ran it"
    assert lines(done) == 1
    assert first.client.permissions(sid) == [] and second.client.permissions(sid) == []
    decided = cluster.query(
        "SELECT data FROM events WHERE type = 'permission.decided' AND session_id = %s", sid
    )
    sources = [json.loads(row[0])["source"] for row in decided]
    assert sources == ["reply"] * len(answered) and len(answered) >= 1


# --- what a daemon that does not run the session can do to it (issue 18) --------------------

QUESTION = {
    "question": "Which database?",
    "options": [{"label": "Postgres", "description": "a server"}, {"label": "SQLite"}],
}


def others_of(cluster: Cluster, session_id: str, daemons: list[Daemon]) -> tuple[Daemon, Daemon]:
    """The daemon holding the session's lease, and one that does not."""
    wait_for("a daemon to hold the session", lambda: cluster.holder_pid(session_id) is not None)
    holder_pid = cluster.holder_pid(session_id)
    holder = next(d for d in daemons if d.process.pid == holder_pid)
    return holder, next(d for d in daemons if d is not holder)


def api_error(call: Callable[[], object]) -> tuple[int, str, str]:
    from harness.client import ApiError

    with pytest.raises(ApiError) as raised:
        call()
    return raised.value.status, raised.value.code, raised.value.message


def test_a_question_asked_on_the_holder_is_listed_and_answered_through_another_daemon(
    cluster: Cluster, tmp_path: Path, project: Path
) -> None:
    daemons = cluster.start(2)
    model = script(
        tmp_path / "s.json",
        [
            {"tool_calls": [{"name": "question", "arguments": {"questions": [QUESTION]}}]},
            {"text": "noted"},
            {"tool_calls": [{"name": "question", "arguments": {"questions": [QUESTION]}}]},
            {"text": "not reached"},
        ],
    )
    sid = daemons[0].client.create_session(directory=str(project), model=model)["id"]
    daemons[1].client.prompt(sid, "ask me")
    asked: list[dict[str, Any]] = []

    def listed_everywhere() -> bool:
        asked[:] = daemons[1].client.questions(sid)
        return bool(asked) and daemons[0].client.questions(sid) == asked

    wait_for("the question to be listed on both daemons", listed_everywhere)
    holder, other = others_of(cluster, sid, daemons)
    question_id = asked[0]["id"]
    # Bad answers and unknown ids get, through the other daemon, what the holder says.
    wrong = [["Postgres"], ["SQLite"]]  # two answers for one question
    assert api_error(lambda: other.client.answer_question(question_id, wrong)) == api_error(
        lambda: holder.client.answer_question(question_id, wrong)
    )
    assert api_error(lambda: other.client.answer_question(question_id, wrong))[0] == 422
    unknown = api_error(lambda: other.client.answer_question("que_nope", [["x"]]))
    assert unknown == api_error(lambda: holder.client.answer_question("que_nope", [["x"]]))
    assert unknown[:2] == (404, "not_found")
    assert other.client.questions(sid) == asked  # still pending after the bad answers
    other.client.answer_question(question_id, [[" Postgres "]])
    wait_for("the turn to finish", lambda: len(cluster.finished(sid)) == 1)
    assert cluster.finished(sid)[0]["answer"] == "noted"
    tools = [p for m in holder.client.messages(sid) for p in m["parts"] if p["type"] == "tool"]
    assert tools[0]["state"]["status"] == "completed"
    assert "Postgres" in tools[0]["state"]["output"]
    replied = cluster.query(
        "SELECT data FROM events WHERE type = 'question.replied' AND session_id = %s", sid
    )
    assert [json.loads(row[0])["answers"] for row in replied] == [[["Postgres"]]]
    assert holder.client.questions(sid) == [] and other.client.questions(sid) == []
    # A rejection through the other daemon: the turn stops, as on one daemon.
    daemons[0].client.prompt(sid, "ask again")
    # The holder lists a question once asked, the other daemon once it is committed.
    wait_for("the second question on both daemons", listed_everywhere)
    holder, other = others_of(cluster, sid, daemons)
    second = other.client.questions(sid)[0]["id"]
    other.client.reject_question(second)
    wait_for("the second turn to finish", lambda: len(cluster.finished(sid)) == 2)
    assert cluster.finished(sid)[1]["reason"] != "answered"
    assert api_error(lambda: other.client.reject_question(second))[:2] == (404, "not_found")


def sleeping_turn(
    cluster: Cluster, tmp_path: Path, project: Path, command: str, after: str
) -> tuple[list[Daemon], str, str]:
    """Two daemons, and a turn prompted through the first that runs ``command`` in bash;
    returned once the bash is running (``after`` is the model's next reply)."""
    daemons = cluster.start(2)
    model = script(
        tmp_path / "s.json",
        [
            {"tool_calls": [{"name": "bash", "arguments": {"command": command}}]},
            {"text": after},
        ],
    )
    sid = daemons[0].client.create_session(directory=str(project), model=model, permission=ALLOW)
    sid = sid["id"]
    daemons[0].client.prompt(sid, "sleep")
    running = "SELECT 1 FROM parts WHERE session_id = %s AND status = 'running'"
    wait_for("the bash to run", lambda: cluster.query(running, sid) != [] and alive_with(command))
    return daemons, sid, command


def test_cancel_through_another_daemon_stops_the_turn_on_its_holder(
    cluster: Cluster, tmp_path: Path, project: Path
) -> None:
    daemons, sid, command = sleeping_turn(cluster, tmp_path, project, "sleep 61.8181", "never")
    holder, other = others_of(cluster, sid, daemons)
    started = time.monotonic()
    assert other.client.cancel(sid) is True
    wait_for("the turn to end", lambda: len(cluster.finished(sid)) == 1, timeout=10)
    latency = time.monotonic() - started
    assert cluster.finished(sid)[0]["reason"] == "cancelled"
    wait_for("the command to be killed", lambda: not alive_with(command), timeout=10)
    assert latency < 5, f"a cancel through another daemon took {latency:.2f}s"
    wait_for("the lease to be given back", lambda: cluster.holder_pid(sid) is None)
    # Nothing runs any more: the same answer through either daemon.
    assert other.client.cancel(sid) is False and holder.client.cancel(sid) is False
    unknown = api_error(lambda: other.client.cancel("ses_unknown"))
    assert unknown == api_error(lambda: holder.client.cancel("ses_unknown"))
    assert unknown[:2] == (404, "not_found")
    assert users(other.client.messages(sid)) == ["sleep"]


def test_delete_through_another_daemon_leaves_no_turn_running_on_the_holder(
    cluster: Cluster, tmp_path: Path, project: Path
) -> None:
    daemons = cluster.start(2)
    model = script(tmp_path / "s.json", [{"text": "slow", "delay": 60}])
    sid = daemons[0].client.create_session(directory=str(project), model=model)["id"]
    daemons[0].client.prompt(sid, "take your time")
    streaming = "SELECT 1 FROM turns WHERE session_id = %s"
    wait_for("the turn to start", lambda: cluster.query(streaming, sid) != [])
    holder, other = others_of(cluster, sid, daemons)
    other.client.delete(sid)
    kinds = [
        row[0]
        for row in cluster.query(
            "SELECT type FROM events WHERE session_id = %s ORDER BY seq", sid
        )
    ]
    # The turn ended (cancelled, on its holder) before the deletion was written.
    assert kinds[-1] == "session.deleted" and "turn.finished" in kinds
    assert cluster.finished(sid)[0]["reason"] == "cancelled"
    assert cluster.query(streaming, sid) == []
    wait_for("the lease to be given back", lambda: cluster.holder_pid(sid) is None)
    time.sleep(LEASE)  # a zombie turn would write again, or renew its lease, by now
    after = cluster.query("SELECT type FROM events WHERE session_id = %s ORDER BY seq", sid)
    assert [row[0] for row in after] == kinds
    assert cluster.holder_pid(sid) is None
    assert "session actor died" not in holder.log.read_text()
    for daemon in daemons:
        assert api_error(lambda d=daemon: d.client.session(sid))[0] == 404  # type: ignore[misc]
        assert sid not in [s["id"] for s in daemon.client.sessions()]


def collect_turn(stream: Any, into: list[Any]) -> None:
    """Read a stream's events until a turn finishes (in a thread of its own)."""
    for event in stream:
        into.append(event)
        if event.type == "turn.finished":
            return


def test_deltas_stream_to_subscribers_of_every_daemon_not_only_the_holders(
    cluster: Cluster, tmp_path: Path, project: Path
) -> None:
    import threading

    daemons = cluster.start(3)
    long_text = "".join(f"{index:05d}é" for index in range(4000))  # 24 kB: two 12 kB deltas
    model = script(
        tmp_path / "s.json",
        [
            {"text": "one two three four five six", "chunks": 6, "chunk_delay": 0.15},
            {"text": long_text, "chunks": 2, "chunk_delay": 0.2},
        ],
    )
    sid = daemons[0].client.create_session(directory=str(project), model=model)["id"]
    for text, turn in (("one two three four five six", "short"), (long_text, "long")):
        # A stream of the session on each daemon, and one of every session ('*').
        streams = [daemon.client.events(sid) for daemon in daemons]
        streams += [daemon.client.events() for daemon in daemons]
        seen: list[list[Any]] = [[] for _ in streams]
        for stream in streams:
            stream.open()  # subscribed, here and by the holder's relay, before the prompt
        readers = [
            threading.Thread(target=collect_turn, args=(stream, into), daemon=True)
            for stream, into in zip(streams, seen, strict=True)
        ]
        for reader in readers:
            reader.start()
        daemons[0].client.prompt(sid, f"a {turn} answer")
        for reader in readers:
            reader.join(DEADLINE)
        for stream in streams:
            stream.close()
        for index, events in enumerate(seen):
            assert events and events[-1].type == "turn.finished", f"daemon {index}"
            assert events[-1].data["answer"] == text
            deltas = [e for e in events if e.type == "part.delta"]
            assert "".join(e.data["delta"] for e in deltas) == text, f"daemon {index}"
            assert len(deltas) >= (3 if turn == "short" else 2), f"daemon {index}: {len(deltas)}"
            ended = next(
                i for i, e in enumerate(events)
                if e.type == "part.updated" and e.data.get("type") == "text" and e.data.get("end")
            )  # fmt: skip
            assert all(events.index(d) < ended for d in deltas), "a delta after its part ended"
        if turn == "long":  # relayed in pieces under PostgreSQL's 8,000-byte NOTIFY limit
            counts = sorted(sum(e.type == "part.delta" for e in events) for events in seen)
            assert counts[0] == 2 and counts[-1] >= 4, counts
    # Nobody watches any more: the watch rows are gone.
    wait_for("the watch rows to go", lambda: cluster.query("SELECT * FROM watchers") == [])


def test_the_cli_through_a_daemon_that_does_not_run_the_session(
    cluster: Cluster, tmp_path: Path, project: Path
) -> None:
    """harness events/answer/approve/show/sessions/cancel, run against the other daemon."""
    daemons = cluster.start(2)
    model = script(
        tmp_path / "s.json",
        [
            {"tool_calls": [{"name": "question", "arguments": {"questions": [QUESTION]}}]},
            {"tool_calls": [{"name": "bash", "arguments": {"command": "echo ok > done.txt"}}]},
            {"text": "all done", "chunks": 4, "chunk_delay": 0.1},
        ],
    )
    sid = daemons[0].client.create_session(directory=str(project), model=model)["id"]

    def cli(daemon: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
        env = dict(cluster.env, HARNESS_SOCKET=str(daemon.client.socket_path))
        return subprocess.run(
            [sys.executable, "-m", "harness", *args],
            env=env, capture_output=True, text=True, timeout=DEADLINE,
        )  # fmt: skip

    daemons[0].client.prompt(sid, "ask, then run")
    wait_for("the question", lambda: bool(daemons[1].client.questions(sid)))
    holder, other = others_of(cluster, sid, daemons)
    env = dict(cluster.env, HARNESS_SOCKET=str(other.client.socket_path))
    follower = subprocess.Popen(
        [sys.executable, "-m", "harness", "events", "--session", sid, "--after", "0", "--json"],
        env=env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        question = other.client.questions(sid)[0]["id"]
        unknown = cli(other, "answer", "que_unknown", "x")
        assert unknown.returncode != 0
        assert (unknown.returncode, unknown.stderr) == (
            (same := cli(holder, "answer", "que_unknown", "x")).returncode, same.stderr
        )
        answered = cli(other, "answer", question, "SQLite")
        assert answered.returncode == 0, answered.stderr
        events: list[dict[str, Any]] = []

        def read() -> None:
            assert follower.stdout is not None
            for line in follower.stdout:
                events.append(json.loads(line))
                if events[-1]["type"] == "turn.finished":
                    return

        import threading

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        approved: set[str] = set()

        def approve_each() -> bool:
            # bash, and the write its redirection makes: each approved through the CLI.
            for ask in other.client.permissions(sid):
                if ask["id"] not in approved:
                    approved.add(ask["id"])
                    done = cli(other, "approve", ask["id"])
                    assert done.returncode == 0, done.stderr
            return not reader.is_alive()

        wait_for("the turn to finish", approve_each)
        assert approved
        assert events and events[-1]["type"] == "turn.finished", [e["type"] for e in events]
    finally:
        follower.kill()
        follower.wait()
    assert events[-1]["data"]["answer"] == "all done"
    deltas = "".join(e["data"]["delta"] for e in events if e["type"] == "part.delta")
    assert deltas == "all done"
    seqs = [e["seq"] for e in events if e["seq"] is not None]
    assert seqs == sorted(seqs) and len(seqs) == len(set(seqs))
    assert (project / "done.txt").read_text() == "ok\n"
    shown = json.loads(cli(other, "show", sid, "--json").stdout)
    assert "all done" in json.dumps(shown)
    listed = json.loads(cli(other, "sessions", "--json").stdout)
    assert sid in json.dumps(listed)
    cancelled = cli(other, "cancel", sid, "--json")
    assert json.loads(cancelled.stdout)["cancelled"] is False


def test_connections_cut_mid_turn_are_remade_and_the_turn_finishes_with_nothing_lost(
    cluster: Cluster, tmp_path: Path, project: Path
) -> None:
    """pg_terminate_backend on every connection of both daemons, twice, mid-tool and
    mid-stream: each one reconnects, and the turn ends once, with its bash run once."""
    import uuid

    name = f"harness-cut-{uuid.uuid4().hex[:8]}"
    cluster.url += f"&application_name={name}"
    daemons = cluster.start(2)
    count = tmp_path / "count"
    model = script(
        tmp_path / "s.json",
        [
            {"tool_calls": [{"name": "bash", "arguments": {
                "command": f"echo once >> {count} && sleep 1.5"}}]},
            {"text": "survived the cuts", "chunks": 10, "chunk_delay": 0.15},
        ],
    )  # fmt: skip
    sid = daemons[0].client.create_session(directory=str(project), model=model, permission=ALLOW)
    sid = sid["id"]
    follow = daemons[1].client.events(sid)
    follow.open()
    seen: list[Any] = []
    import threading

    reader = threading.Thread(target=collect_turn, args=(follow, seen), daemon=True)
    reader.start()
    sent = daemons[0].client.prompt(sid, "count once")

    def cut() -> int:
        return len(cluster.query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = %s AND pid <> pg_backend_pid()", name,
        ))  # fmt: skip

    wait_for("the bash to run", lambda: lines(count) == 1)
    assert cut() >= 8  # four connections per daemon at least (write, control, read, listen)
    wait_for("the answer to stream", lambda: any(e.type == "part.delta" for e in seen))
    assert cut() >= 8
    reader.join(DEADLINE)
    follow.close()
    assert seen and seen[-1].type == "turn.finished"
    assert seen[-1].data["message_id"] == sent
    assert seen[-1].data["answer"] == "survived the cuts"
    assert [f["answer"] for f in cluster.finished(sid)] == ["survived the cuts"]
    assert lines(count) == 1
    assert users(daemons[1].client.messages(sid)) == ["count once"]
    durable = [e.seq for e in seen if e.seq is not None]
    assert durable == sorted(set(durable))
    seqs = [row[0] for row in cluster.query("SELECT seq FROM events ORDER BY seq")]
    assert seqs == list(range(1, len(seqs) + 1))
    # Both daemons are connected again and serve: a second turn runs through the other.
    assert len(cluster.query(
        "SELECT 1 FROM pg_stat_activity WHERE application_name = %s", name)) >= 8  # fmt: skip


def test_a_cancel_sent_while_the_holder_is_dead_holds_when_another_daemon_takes_over(
    cluster: Cluster, tmp_path: Path, project: Path
) -> None:
    daemons, sid, command = sleeping_turn(
        cluster, tmp_path, project, "sleep 63.3131", "should not run: the turn was cancelled"
    )
    holder, other = others_of(cluster, sid, daemons)
    holder.kill()
    # The dead holder's lease has not lapsed: nobody can act on the cancel yet.
    assert cluster.holder_pid(sid) == holder.process.pid
    assert other.client.cancel(sid) is True
    wait_for("the turn to end on the other daemon", lambda: len(cluster.finished(sid)) == 1)
    assert cluster.finished(sid)[0]["reason"] == "cancelled"
    wait_for("the orphaned command to be killed", lambda: not alive_with(command))
    steps = cluster.query(
        "SELECT 1 FROM messages WHERE session_id = %s AND role = 'assistant'", sid
    )
    assert len(steps) == 1, "the model was asked again after the cancel"
    assert other.client.session(sid)["status"] == "idle"


def test_harness_run_through_another_daemon_streams_the_turn_its_holder_runs(
    cluster: Cluster, tmp_path: Path, project: Path
) -> None:
    """The user's case: ``harness run --session`` through daemon B while daemon A holds
    the session (busy with a first turn), so A runs the new turn too; B's client sees it
    stream, delta by delta, and exits with the answer."""
    daemons = cluster.start(2)
    second = "streamed from the other daemon"
    model = script(
        tmp_path / "s.json",
        [
            {"text": "first, slowly", "delay": 2},
            {"text": second, "chunks": 5, "chunk_delay": 0.15},
        ],
    )
    sid = daemons[0].client.create_session(directory=str(project), model=model)["id"]
    daemons[0].client.prompt(sid, "first")
    wait_for("the first turn to start", lambda: cluster.holder_pid(sid) is not None)
    holder, other = others_of(cluster, sid, daemons)
    env = dict(cluster.env, HARNESS_SOCKET=str(other.client.socket_path))
    ran = subprocess.run(
        [sys.executable, "-m", "harness", "run", "--json", "--session", sid, "second"],
        env=env, capture_output=True, text=True, timeout=DEADLINE, cwd=project,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    events = [json.loads(line) for line in ran.stdout.splitlines()]
    assert events[-1]["type"] == "turn.finished" and events[-1]["data"]["answer"] == second
    turn = events[-1]["data"]["message_id"]
    started = next(
        i for i, e in enumerate(events)
        if e["type"] == "turn.started" and e["data"].get("message_id") == turn
    )  # fmt: skip
    # (It follows the session from now on: the end of the first turn streams in too.)
    # The answer's deltas by their part: relayed live, a delta may come before the
    # turn.started the tail reads from the ledger (pg_live.py), so not by position.
    answer_parts = {
        e["data"]["id"] for e in events[started:]
        if e["type"] == "part.updated" and e["data"].get("text") == second
    }  # fmt: skip
    deltas = [
        e["data"]["delta"] for e in events
        if e["type"] == "part.delta" and e["data"].get("part_id") in answer_parts
    ]  # fmt: skip
    assert "".join(deltas) == second and len(deltas) >= 3
    # The holder ran both turns: the lease never changed hands.
    assert cluster.query("SELECT 1 FROM events WHERE type = 'session.leased'") == []
    owners = cluster.query("SELECT owner FROM leases WHERE session_id = %s", sid)
    assert [int(row[0].split(":")[1]) for row in owners] == [holder.process.pid]
    assert [f["answer"] for f in cluster.finished(sid)] == ["first, slowly", second]


def test_a_prompt_steered_and_one_queued_through_another_daemon_reach_the_running_turn(
    cluster: Cluster, tmp_path: Path, project: Path
) -> None:
    """The holder skips its per-step inbox read while it has seen no input added (issue
    18): input sent through another daemon reaches it through the tail, which moves the
    mark. So a steered prompt still joins the running turn, a queued one runs after it."""
    a, b = cluster.start(2)
    step = {"tool_calls": [{"name": "read", "arguments": {"path": "notes.txt"}}], "delay": 0.4}
    turns = [
        step,
        {**step, "tool_calls": [{"name": "read", "arguments": {"path": "other.txt"}}]},
        {"text": "first done", "delay": 0.4},
        {"text": "queued done"},
    ]
    model = script(tmp_path / "s.json", turns)
    session = a.client.create_session(directory=str(project), model=model)["id"]
    first = a.client.prompt(session, "first")
    wait_for("the turn to run", lambda: cluster.holder_pid(session) is not None)
    holder = cluster.holder_pid(session)
    other = b if holder == a.process.pid else a
    assert holder in (a.process.pid, b.process.pid) and other.process.pid != holder
    wait_for(
        "the first step to start",
        lambda: cluster.query(
            "SELECT count(*) FROM messages WHERE session_id = %s AND role = 'assistant'",
            session,
        )[0][0]
        >= 1,
    )
    queued = other.client.prompt(session, "afterwards", delivery="queue")
    steered = other.client.prompt(session, "also this", delivery="steer")
    wait_for("both turns to finish", lambda: len(cluster.finished(session)) >= 2)
    finished = cluster.finished(session)
    assert [(f["message_id"], f["answer"]) for f in finished] == [
        (first, "first done"),
        (queued, "queued done"),
    ]
    messages = other.client.messages(session)
    assert [m["info"]["id"] for m in messages if m["info"]["role"] == "user"] == [
        first,
        steered,
        queued,
    ]
    # Steered into the first turn: its last step (the answer) came after it.
    steered_at = [m["info"]["id"] for m in messages].index(steered)
    assert any(
        m["info"]["role"] == "assistant" and m["info"].get("parent_id") == first
        for m in messages[steered_at + 1 :]
    ), "the first turn took a step after the steered prompt"


def test_a_subscriber_joining_a_daemon_that_read_filtered_hears_the_story_whole(
    cluster: Cluster, tmp_path: Path, project: Path
) -> None:
    """A daemon with no subscriber reads only the other daemons' events it acts on
    (input, replies, cancels; issue 18). A subscriber that joins it later with
    Last-Event-ID gets the rest of the story from the ledger, then live, with no gap
    and no duplicate, while the other daemon runs the turns."""
    daemons = cluster.start(2)
    model = script(
        tmp_path / "s.json",
        [
            {"tool_calls": [{"name": "read", "arguments": {"path": "a.txt"}}], "delay": 0.3},
            {"text": "first"},
            {"text": "second", "delay": 0.3},
        ],
    )
    (project / "a.txt").write_text("a\n")
    sid = daemons[0].client.create_session(directory=str(project), model=model)["id"]
    daemons[0].client.prompt(sid, "one")
    wait_for("the first turn to start", lambda: cluster.holder_pid(sid) is not None)
    holder, other = others_of(cluster, sid, daemons)
    wait_for("the first turn to end", lambda: len(cluster.finished(sid)) == 1)
    stored = [row[0] for row in cluster.query(
        "SELECT seq FROM events WHERE session_id = %s ORDER BY seq", sid
    )]  # fmt: skip
    middle = stored[len(stored) // 2]
    stream = other.client.events(sid, after=middle)
    stream.open()
    second = holder.client.prompt(sid, "two")
    heard = []
    for event in stream:
        if event.seq is not None:
            heard.append(event.seq)
        if event.type == "turn.finished" and event.data.get("message_id") == second:
            break
    stream.close()
    stored = [row[0] for row in cluster.query(
        "SELECT seq FROM events WHERE session_id = %s AND seq > %s AND seq <= %s ORDER BY seq",
        sid, middle, heard[-1],
    )]  # fmt: skip
    assert heard == stored
    assert [f["answer"] for f in cluster.finished(sid)] == ["first", "second"]
