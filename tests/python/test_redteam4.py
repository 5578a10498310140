"""Red-team pass on `moat serve` (issue 11): a request must not move the
server's ceiling, whatever it names."""

import base64
import os
import random
import socket
import subprocess
import tempfile

import pytest

from rpc import MOAT, Server, host_pids_with, wait_for
from test_service_isolation import SocketClient


@pytest.fixture
def ws():
    with tempfile.TemporaryDirectory(prefix="moat-rt4-") as d:
        yield os.path.realpath(d)


def token():
    return str(random.randint(10**8, 10**9 - 1))


def run(s, params):
    """Runs a request to its end: (the answer, the last event or None)."""
    r = s.call("execute", params)
    if "error" in r:
        return r, None
    end = s.finished(r["result"]["execution_id"])
    return r, end


def stdout_of(s, execution_id):
    return b"".join(
        base64.b64decode(m["params"]["data"])
        for m in list(s.log)
        if m.get("method") == "event"
        and m["params"].get("execution_id") == execution_id
        and m["params"].get("type") == "execution.stdout"
    )


# A path at the top of the server's workspace that runs code later on the
# host, and a file a command could plant in it. Relative to the workspace
# root moat keeps each read-only; a request that names the directory as its
# `cwd` must not make it the (writable) workspace of its execution.
PLANTS = [
    (".git", "hooks/pre-commit"),
    (".git", "config"),
    (".git/hooks", "post-checkout"),
    (".claude", "settings.json"),
    (".vscode", "tasks.json"),
]


@pytest.mark.parametrize("cwd,plant", PLANTS, ids=[f"{c}:{p}" for c, p in PLANTS])
def test_a_cwd_inside_a_protected_workspace_path_cannot_write_it(ws, cwd, plant):
    subprocess.run(["git", "init", "-q", ws], check=True)
    for d in (".claude", ".vscode"):
        os.mkdir(os.path.join(ws, d))
    target = os.path.join(ws, cwd, plant)
    before = open(target, "rb").read() if os.path.exists(target) else None
    mark = token()
    s = Server(["--policy", "workspace-write"], cwd=ws)
    try:
        # Control: the same request with the server's own workspace as cwd runs.
        r, end = run(s, {"command": ["sh", "-c", f"echo ran-{mark}"]})
        assert end and end["params"]["type"] == "execution.finished", r
        assert f"ran-{mark}".encode() in stdout_of(s, r["result"]["execution_id"])
        script = f"echo ran-{mark}; printf 'pwned-{mark}\\n' >> {plant}"
        r, end = run(s, {"command": ["sh", "-c", script], "cwd": cwd})
        if "error" in r:
            assert r["error"]["data"]["code"] == "POLICY_DENIED", r
    finally:
        s.close()
    after = open(target, "rb").read() if os.path.exists(target) else None
    assert after == before, f"{target} was written through cwd {cwd}: {after!r}"


def test_a_cwd_inside_a_read_only_grant_cannot_write_it(ws):
    os.makedirs(os.path.join(ws, "vendor", "lib"))
    target = os.path.join(ws, "vendor", "lib", "planted")
    mark = token()
    s = Server(["--policy", "workspace-write", "--ro", "vendor"], cwd=ws)
    try:
        r, end = run(s, {"command": ["sh", "-c", f"echo ran-{mark}; echo {mark} > planted"], "cwd": "vendor/lib"})
        if "error" in r:
            assert r["error"]["data"]["code"] == "POLICY_DENIED", r
    finally:
        s.close()
    assert not os.path.exists(target), "a --ro grant of the server was written through cwd"


def test_a_cwd_inside_a_hidden_workspace_path_cannot_read_it(ws):
    secret = "s3cr3t-" + token()
    os.makedirs(os.path.join(ws, ".env.d"))
    with open(os.path.join(ws, ".env.d", "prod"), "w") as f:
        f.write(secret)
    s = Server(["--policy", "read-only"], cwd=ws)
    try:
        # Control: from the workspace root, .env.d is hidden.
        r, end = run(s, {"command": ["sh", "-c", "echo ran; cat .env.d/prod"]})
        assert end is not None, r
        out = stdout_of(s, r["result"]["execution_id"])
        assert b"ran" in out and secret.encode() not in out
        r, end = run(s, {"command": ["sh", "-c", "echo ran; cat prod"], "cwd": ".env.d"})
        if "error" in r:
            assert r["error"]["data"]["code"] == "POLICY_DENIED", r
        else:
            out = stdout_of(s, r["result"]["execution_id"])
            assert b"ran" in out and secret.encode() not in out, out
    finally:
        s.close()


def test_a_plain_subdirectory_cwd_still_runs_positive_control(ws):
    os.makedirs(os.path.join(ws, "src", "pkg"))
    mark = token()
    s = Server(["--policy", "workspace-write"], cwd=ws)
    try:
        r, end = run(s, {"command": ["sh", "-c", f"echo {mark} > made"], "cwd": "src/pkg"})
        assert end and end["params"]["type"] == "execution.finished", r
        assert end["params"]["exit_code"] == 0, end
    finally:
        s.close()
    assert open(os.path.join(ws, "src", "pkg", "made")).read().strip() == mark


def hang_up(c):
    """Closes a client's connection for good (its reader holds a dup)."""
    c.sock.shutdown(socket.SHUT_RDWR)
    c.close()


# docs/protocol.md: what one client may have running at once.
MAX_RUNNING_PER_CLIENT = 16


@pytest.fixture
def socket_server(ws):
    d = tempfile.mkdtemp(prefix="moat-rt4-sock-")
    os.chmod(d, 0o700)
    path = os.path.join(d, "moat.sock")
    p = subprocess.Popen(
        [MOAT, "serve", "--no-audit", "--policy", "workspace-write", "--socket", path],
        cwd=ws,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: os.path.exists(path) or p.poll() is not None, "the socket")
        assert p.poll() is None, p.stderr.read().decode(errors="replace")
        yield path
    finally:
        p.kill()
        p.wait()


def test_one_client_cannot_flood_the_service_with_executions(ws, socket_server):
    tok = token()
    flood = MAX_RUNNING_PER_CLIENT + 8
    a = SocketClient(socket_server)
    b = SocketClient(socket_server)
    try:
        answers = [a.call("execute", {"command": ["sleep", "300", tok]}) for _ in range(flood)]
        started = [r["result"]["execution_id"] for r in answers if "result" in r]
        refused = [r["error"]["data"] for r in answers if "error" in r]
        assert all(e["code"] == "EXECUTION_LIMIT_EXCEEDED" for e in refused), refused
        # The side effect: no more of A's commands run than the limit.
        wait_for(lambda: len(host_pids_with(tok)) >= len(started), "A's sleeps")
        assert len(host_pids_with(tok)) <= MAX_RUNNING_PER_CLIENT, "one client ran past the limit"
        # The service keeps serving another client meanwhile.
        mark = token()
        ex = b.ok("execute", {"command": ["sh", "-c", f"echo ok-{mark}"]})
        wait_for(
            lambda: any(e.get("type") == "execution.finished" for e in b.events_of(ex["execution_id"])),
            "B's execution",
        )
        out = b"".join(
            base64.b64decode(e["data"]) for e in b.events_of(ex["execution_id"]) if e["type"] == "execution.stdout"
        )
        assert f"ok-{mark}".encode() in out
        # A slot comes back when one of A's executions ends.
        a.ok("cancelExecution", {"execution_id": started[0]})
        wait_for(lambda: "result" in a.call("execute", {"command": ["true"]}), "a freed slot")
    finally:
        for c in (a, b):
            hang_up(c)
    wait_for(lambda: not host_pids_with(tok), "A's sleeps gone with its connection")
