"""A service keeps its audit log open between executions and continues the
hash chain from memory (`AuditLog::append`'s kept head): every execution is
still on record before its result is reported, the chain still verifies
when another moat process appends between two of the service's
executions, and a log moved away (rotated) is not written to again — the
next execution is recorded in the new log at the path."""

import json
import os
import subprocess
import tempfile

import pytest

from rpc import HANG, MOAT


@pytest.fixture
def ws():
    with tempfile.TemporaryDirectory(prefix="moat-audit-kept-") as d:
        yield os.path.realpath(d)


class AuditedServer:
    """`moat serve --stdio --audit-log LOG`, one request at a time."""

    def __init__(self, ws, log):
        self.proc = subprocess.Popen(
            [MOAT, "serve", "--stdio", "--audit-log", log, "--policy", "workspace-contained"],
            cwd=ws,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.next_id = 0

    def run(self, command):
        """Executes `command` and returns (execution id, its finished event)."""
        self.next_id += 1
        msg = {"jsonrpc": "2.0", "id": self.next_id, "method": "execute", "params": {"command": command}}
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        self.proc.stdin.flush()
        eid = None
        while True:
            line = self.proc.stdout.readline()
            assert line, self.proc.stderr.read().decode(errors="replace")
            m = json.loads(line)
            if m.get("id") == self.next_id:
                assert "result" in m, m
                eid = m["result"]["execution_id"]
                continue
            p = m.get("params", {})
            if eid and p.get("execution_id") == eid and p.get("type") in ("execution.finished", "execution.failed"):
                return eid, p

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=HANG)


def records(log):
    with open(log) as f:
        return [json.loads(l) for l in f]


def verify(log):
    r = subprocess.run([MOAT, "audit", "verify", "--log", log], capture_output=True, timeout=HANG)
    assert r.returncode == 0, (r.stdout.decode(), r.stderr.decode())


def recorded(log, eid):
    """The event types on record for execution `eid`."""
    return [r["type"] for r in records(log) if r.get("execution_id") == eid]


def test_a_kept_log_stays_one_chain_with_other_appenders_and_after_rotation(ws):
    state = tempfile.mkdtemp(prefix="moat-audit-kept-log-")
    log = os.path.join(state, "audit.jsonl")
    srv = AuditedServer(ws, log)
    try:
        first, fin = srv.run(["/bin/true"])
        assert fin["type"] == "execution.finished" and fin.get("launch") == "template", fin
        # On record before the result was reported (this client saw it).
        assert recorded(log, first) == ["policy.resolved", "execution.started", "execution.finished"]
        # Another moat process appends between two of the service's runs.
        other = subprocess.run(
            [MOAT, "exec", "--audit-log", log, "--policy", "workspace-contained", "--", "true"],
            cwd=ws, capture_output=True, timeout=HANG,
        )
        assert other.returncode == 0, other.stderr.decode()
        second, _ = srv.run(["/bin/true"])
        assert recorded(log, second) == ["policy.resolved", "execution.started", "execution.finished"]
        verify(log)
        seqs = [r["seq"] for r in records(log)]
        assert seqs == list(range(1, len(seqs) + 1)), seqs
        assert len(seqs) >= 9, seqs
        # Rotated, a new empty log created in its place (logrotate's
        # `create 0600`): the service's next execution is recorded there;
        # the rotated one is left as it was.
        rotated = log + ".1"
        os.rename(log, rotated)
        os.close(os.open(log, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        before = open(rotated, "rb").read()
        third, _ = srv.run(["/bin/true"])
        assert open(rotated, "rb").read() == before
        assert recorded(log, third) == ["policy.resolved", "execution.started", "execution.finished"]
        assert records(log)[0]["seq"] == 1
        verify(log)
        verify(rotated)
    finally:
        srv.close()
