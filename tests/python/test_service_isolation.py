"""`moat serve` clients are kept apart, request metadata reaches the audit
records, and streamed stdin (RFC-0021's writeExecutionInput /
closeExecutionInput) reaches the command."""

import base64
import json
import os
import subprocess
import tempfile
import time

import pytest

from rpc import HANG, MOAT, Server, SocketClient, socket_server, wait_for  # noqa: F401 (a fixture)


@pytest.fixture
def ws():
    with tempfile.TemporaryDirectory(prefix="moat-iso-") as d:
        yield os.path.realpath(d)


def normalized_error(r, execution_id):
    """The error answer with the id asked about replaced by a placeholder."""
    assert "error" in r, r
    assert r["error"]["data"]["code"] == "EXECUTION_NOT_FOUND", r
    return json.dumps(r["error"], sort_keys=True).replace(execution_id, "ID")


def test_a_socket_client_cannot_see_or_touch_another_clients_execution(ws, socket_server):
    marker = os.path.join(ws, "a-still-running")
    a = SocketClient(socket_server)
    b = SocketClient(socket_server)
    try:
        ex = a.ok(
            "execute",
            {"command": ["sh", "-c", f"echo a-ran; while :; do touch {marker}; sleep 0.05; done"]},
        )
        eid, sid = ex["execution_id"], ex["session_id"]
        wait_for(lambda: os.path.exists(marker), "A's command running")
        wait_for(lambda: any(e["type"] == "execution.stdout" for e in a.events_of(eid)), "A's output")
        # B gets exactly the answer an unknown id gets: no existence oracle.
        unknown = "exec_" + "0" * 32
        for method in ("getExecution", "cancelExecution", "subscribeEvents", "getAuditEvents"):
            theirs = b.call(method, {"execution_id": eid})
            nobody = b.call(method, {"execution_id": unknown})
            assert normalized_error(theirs, eid) == normalized_error(nobody, unknown), (method, theirs, nobody)
        listed = b.ok("listExecutions")
        assert eid not in json.dumps(listed), listed
        tail = b.ok("tailAudit")
        assert eid not in json.dumps(tail), tail
        disposed = b.ok("disposeSession", {"session_id": sid})
        assert disposed["canceled"] == [] and disposed["disposed"] is False, disposed
        status = b.ok("getServiceStatus")
        assert status["active_executions"] == 0, status
        # B saw none of A's events.
        assert b.events_of(eid) == []
        # A's execution was not cancelled by anything B did: still running,
        # still A's to see and to cancel.
        os.unlink(marker)
        wait_for(lambda: os.path.exists(marker), "A's command still running after B's calls")
        assert a.ok("getExecution", {"execution_id": eid})["status"] == "running"
        assert eid in json.dumps(a.ok("listExecutions"))
        assert a.ok("getServiceStatus")["active_executions"] == 1
        a.ok("cancelExecution", {"execution_id": eid})
        wait_for(
            lambda: any(e["type"] in ("execution.finished", "execution.failed") for e in a.events_of(eid)),
            "A's execution to end",
        )
    finally:
        a.close()
        b.close()


def audit_lines(path, execution_id):
    with open(path) as f:
        return [json.loads(l) for l in f if execution_id in l]


def test_request_metadata_is_recorded_redacted_and_bounded(ws):
    log = os.path.join(ws, "..", os.path.basename(ws) + "-audit.jsonl")
    log = os.path.realpath(log)
    p = subprocess.Popen(
        [MOAT, "serve", "--stdio", "--audit-log", log],
        cwd=ws,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )

    def call(rid, method, params):
        p.stdin.write((json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}) + "\n").encode())
        p.stdin.flush()
        while True:
            line = p.stdout.readline()
            assert line, p.stderr.read().decode(errors="replace")
            m = json.loads(line)
            if m.get("id") == rid:
                return m

    try:
        meta = {"agent_id": "agent_123", "skill": {"id": "skill_x", "api_token": "s3cr3t-value-1234"}, "n": 7}
        r = call(1, "execute", {"command": ["sh", "-c", "echo meta-ran"], "metadata": meta})
        eid = r["result"]["execution_id"]
        deadline = time.monotonic() + HANG
        while True:
            res = call(2, "getExecution", {"execution_id": eid})["result"]
            if res["status"] != "running" or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert res["status"] == "finished", res
        # Through the protocol.
        evs = call(3, "getAuditEvents", {"execution_id": eid})["result"]["events"]
        resolved = [e for e in evs if e["type"] == "policy.resolved"]
        assert resolved and resolved[0]["metadata"]["agent_id"] == "agent_123", evs
        assert resolved[0]["metadata"]["skill"]["id"] == "skill_x"
        assert resolved[0]["metadata"]["skill"]["api_token"] == "***"
        assert resolved[0]["metadata"]["n"] == 7
        # In the log itself, read back with `moat audit show`.
        shown = subprocess.run(
            [MOAT, "audit", "show", "--log", log, eid], capture_output=True, timeout=HANG
        )
        text = shown.stdout.decode() + shown.stderr.decode()
        assert "agent_123" in text, text
        assert "s3cr3t-value-1234" not in text
        on_disk = audit_lines(log, eid)
        assert any(l.get("metadata", {}).get("agent_id") == "agent_123" for l in on_disk), on_disk
        assert "s3cr3t-value-1234" not in open(log).read()
        # Not an object, or too big: refused before anything runs.
        for bad, reason in (([1, 2], "metadata_invalid"), ({"x": "y" * (64 << 10)}, "metadata_too_large")):
            r = call(4, "execute", {"command": ["sh", "-c", "echo must-not-run"], "metadata": bad})
            assert r["error"]["data"]["code"] == "INVALID_REQUEST", r
            assert r["error"]["data"]["reason"] == reason, r
        assert "must-not-run" not in open(log).read()
    finally:
        p.stdin.close()
        p.wait(timeout=HANG)


def test_streamed_stdin_reaches_the_command_and_ends_with_close(ws):
    s = Server([], cwd=ws)
    try:
        ex = s.ok("execute", {"command": ["sh", "-c", "echo begin; cat; echo end-of-input"], "stdin": {"mode": "stream"}})
        eid = ex["execution_id"]
        s.event(eid, "execution.stdout")  # "begin": the command waits on its stdin
        w = s.ok(
            "writeExecutionInput",
            {"execution_id": eid, "stream": "stdin", "encoding": "base64",
             "data": "base64:" + base64.b64encode(b"first line\n").decode()},
        )
        assert w["accepted_bytes"] == len(b"first line\n"), w
        s.ok("writeExecutionInput", {"execution_id": eid, "data": base64.b64encode(b"second\n").decode()})
        c = s.ok("closeExecutionInput", {"execution_id": eid, "stream": "stdin"})
        assert c["closed"] is True, c
        again = s.ok("closeExecutionInput", {"execution_id": eid, "stream": "stdin"})
        assert again["closed"] is True
        late = s.call("writeExecutionInput", {"execution_id": eid, "data": base64.b64encode(b"late").decode()})
        assert late["error"]["data"]["code"] == "EXECUTION_INPUT_CLOSED", late
        fin = s.finished(eid)
        assert fin["params"]["type"] == "execution.finished" and fin["params"]["exit_code"] == 0, fin
        out = b"".join(
            base64.b64decode(m["params"]["data"])
            for m in s.log
            if m.get("method") == "event" and m["params"].get("execution_id") == eid
            and m["params"]["type"] == "execution.stdout"
        )
        assert out == b"begin\nfirst line\nsecond\nend-of-input\n", out
        # Input to an execution that is not streamed, or over the chunk limit, is refused.
        ex2 = s.ok("execute", {"command": ["true"]})
        r = s.call("writeExecutionInput", {"execution_id": ex2["execution_id"], "data": "eA=="})
        assert r["error"]["data"]["code"] in ("EXECUTION_INPUT_CLOSED", "EXECUTION_NOT_FOUND"), r
        ex3 = s.ok("execute", {"command": ["sh", "-c", "cat >/dev/null"], "stdin": {"mode": "stream"}})
        big = base64.b64encode(b"x" * (64 * 1024 + 1)).decode()
        r = s.call("writeExecutionInput", {"execution_id": ex3["execution_id"], "data": big})
        assert r["error"]["data"]["code"] == "INVALID_REQUEST", r
        s.ok("closeExecutionInput", {"execution_id": ex3["execution_id"]})
        assert s.finished(ex3["execution_id"])["params"]["exit_code"] == 0
        # `inherit` stays refused, with a stable code.
        r = s.call("execute", {"command": ["true"], "stdin": {"mode": "inherit"}})
        assert r["error"]["data"]["code"] == "INVALID_REQUEST", r
        assert r["error"]["data"]["reason"] == "stdin_mode_unsupported", r
    finally:
        s.close()


def test_another_client_cannot_write_to_a_streamed_stdin(ws, socket_server):
    got = os.path.join(ws, "got")
    a = SocketClient(socket_server)
    b = SocketClient(socket_server)
    try:
        ex = a.ok("execute", {"command": ["sh", "-c", f"cat > {got}"], "stdin": {"mode": "stream"}})
        eid = ex["execution_id"]
        r = b.call("writeExecutionInput", {"execution_id": eid, "data": base64.b64encode(b"from-b\n").decode()})
        assert r["error"]["data"]["code"] == "EXECUTION_NOT_FOUND", r
        r = b.call("closeExecutionInput", {"execution_id": eid})
        assert r["error"]["data"]["code"] == "EXECUTION_NOT_FOUND", r
        a.ok("writeExecutionInput", {"execution_id": eid, "data": base64.b64encode(b"from-a\n").decode()})
        a.ok("closeExecutionInput", {"execution_id": eid})
        wait_for(
            lambda: any(e["type"] in ("execution.finished", "execution.failed") for e in a.events_of(eid)),
            "the end of A's execution",
        )
        with open(got, "rb") as f:
            assert f.read() == b"from-a\n"
    finally:
        a.close()
        b.close()
