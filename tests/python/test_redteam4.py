"""Red-team pass on `moat serve` (issue 11): a request must not move the
server's ceiling, whatever it names."""

import base64
import json
import os
import random
import socket
import subprocess
import tempfile

import pytest

from rpc import MOAT, Server, SocketClient, host_pids_with, socket_server, wait_for  # noqa: F401 (a fixture)


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


def test_a_sandboxed_command_cannot_use_the_service_socket(ws):
    # The socket lives where the executions can see it (inside the
    # workspace); a read-only execution connects to it and asks the server
    # for a write its own policy refuses.
    d = os.path.join(ws, "run")
    os.mkdir(d, 0o700)
    path = os.path.join(d, "moat.sock")
    marker = os.path.join(ws, "written-through-the-socket")
    p = subprocess.Popen(
        [MOAT, "serve", "--no-audit", "--policy", "workspace-write", "--socket", path],
        cwd=ws,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: os.path.exists(path) or p.poll() is not None, "the socket")
        assert p.poll() is None, p.stderr.read().decode(errors="replace")
        outer = SocketClient(path)
        inner = (
            "import json, socket, sys\n"
            "print('probe-ran', flush=True)\n"
            "c = socket.socket(socket.AF_UNIX)\n"
            f"c.connect({path!r})\n"
            "c.settimeout(30)\n"
            f"req = {{'jsonrpc': '2.0', 'id': 1, 'method': 'execute', 'params': {{'command': ['touch', {marker!r}]}}}}\n"
            "try:\n"
            "    c.sendall((json.dumps(req) + '\\n').encode())\n"
            "    got = c.recv(65536)\n"
            "except OSError as e:\n"
            "    got = repr(e).encode()\n"
            "print('answer', got, flush=True)\n"
            "try:\n"
            "    c.recv(65536)\n"
            "except OSError:\n"
            "    pass\n"
        )
        ex = outer.ok("execute", {"command": ["python3", "-c", inner], "policy": "read-only"})
        wait_for(
            lambda: any(e.get("type") in ("execution.finished", "execution.failed") for e in outer.events_of(ex["execution_id"])),
            "the sandboxed client",
        )
        out = b"".join(
            base64.b64decode(e["data"]) for e in outer.events_of(ex["execution_id"]) if e["type"] == "execution.stdout"
        )
        assert b"probe-ran" in out, out
        hang_up(outer)
    finally:
        p.kill()
        p.wait()
    assert not os.path.exists(marker), f"a sandboxed command drove the service: {out!r}"
    assert b'"result"' not in out, out


NARROWINGS_OF_THE_WRONG_TYPE = [
    {"level": ["read-only"]},
    {"sandbox_level": {"name": "read-only"}},
    {"policy_id": 1, "level": None, "sandbox_level": "read-only", "network": 0},
]


@pytest.mark.parametrize("policy", NARROWINGS_OF_THE_WRONG_TYPE, ids=["list", "object", "number"])
def test_a_narrowing_the_server_cannot_read_is_refused_not_dropped(ws, policy):
    # A request that asks for read-only in a shape the server does not take
    # must not run at the server's (wider) workspace-write.
    target = os.path.join(ws, "written")
    mark = token()
    s = Server(["--policy", "workspace-write"], cwd=ws)
    try:
        r, end = run(s, {"command": ["sh", "-c", f"echo ran-{mark}; echo x > written"], "policy": policy})
        if "error" in r:
            assert r["error"]["data"]["code"] == "POLICY_INVALID", r
        elif policy.get("sandbox_level") == "read-only":
            assert f"ran-{mark}".encode() in stdout_of(s, r["result"]["execution_id"])
    finally:
        s.close()
    assert not os.path.exists(target), f"policy {policy} was dropped: the run wrote the workspace"


def test_unknown_keys_in_a_network_object_are_refused_contract(ws):
    s = Server(["--policy", "workspace-write", "--network", "proxy", "--allow-domain", "example.com"], cwd=ws)
    try:
        for network in ({"mode": "proxy", "allow_domains": ["api.example.com"]}, {"mode": "proxy", "allow": []}, 5):
            r = s.call("explainPolicy", {"policy": {"network": network}})
            assert "error" in r and r["error"]["data"]["code"] == "POLICY_INVALID", (network, r)
            r = s.call("execute", {"command": ["true"], "policy": {"network": network}})
            assert "error" in r and r["error"]["data"]["code"] == "POLICY_INVALID", (network, r)
    finally:
        s.close()


# docs/protocol.md: how many executions the service remembers.
MAX_RECORDS = 1000


def test_one_clients_thousand_executions_do_not_evict_another_clients_result(ws, socket_server):
    a = SocketClient(socket_server)
    b = SocketClient(socket_server)
    try:
        mark = token()
        mine = b.ok("execute", {"command": ["sh", "-c", f"echo kept-{mark}"]})["execution_id"]
        wait_for(lambda: any(e.get("type") == "execution.finished" for e in b.events_of(mine)), "B's execution")
        # A runs past what the service remembers, MAX_RUNNING_PER_CLIENT at a time.
        done = 0
        while done < MAX_RECORDS + 10:
            batch = [a.ok("execute", {"command": ["true"]})["execution_id"] for _ in range(MAX_RUNNING_PER_CLIENT)]
            for x in batch:
                wait_for(lambda: any(e.get("type") == "execution.finished" for e in a.events_of(x)), "A's execution")
            a.log.clear()
            a.taken.clear()
            done += len(batch)
        r = b.call("getExecution", {"execution_id": mine})
        assert "result" in r, f"A's executions evicted B's result: {r}"
        assert r["result"]["exit_code"] == 0 and r["result"]["stdout_bytes"] == len(f"kept-{mark}\n")
        assert b.ok("listExecutions")["count"] == 1
    finally:
        hang_up(a)
        hang_up(b)


def test_a_flood_of_connections_does_not_stop_the_service_serving_its_clients(ws):
    # The server gets a small fd limit (as an unprivileged user's default
    # 1024 would be, smaller so the test stays cheap); a client floods it
    # with idle connections, past what the limit could hold.
    import resource

    limit = 256
    d = tempfile.mkdtemp(prefix="moat-rt4-sock-")
    os.chmod(d, 0o700)
    path = os.path.join(d, "moat.sock")
    p = subprocess.Popen(
        [MOAT, "serve", "--no-audit", "--policy", "workspace-write", "--socket", path],
        cwd=ws,
        stderr=subprocess.DEVNULL,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit)),
    )
    flood = []
    try:
        wait_for(lambda: os.path.exists(path) or p.poll() is not None, "the socket")
        b = SocketClient(path)
        assert b.ok("getVersion")["protocol_version"]
        for _ in range(limit + 44):
            c = socket.socket(socket.AF_UNIX)
            c.connect(path)
            flood.append(c)
        # B, connected before the flood, still gets its commands run.
        mark = token()
        r = b.call("execute", {"command": ["sh", "-c", f"echo still-{mark}"]})
        assert "result" in r, f"the flood stopped the service running B's command: {r}"
        ex = r["result"]["execution_id"]
        wait_for(lambda: any(e.get("type") == "execution.finished" for e in b.events_of(ex)), "B's execution")
        out = b"".join(base64.b64decode(e["data"]) for e in b.events_of(ex) if e["type"] == "execution.stdout")
        assert f"still-{mark}".encode() in out
        # Once the flood is gone, a new client is served again.
        for c in flood:
            c.close()
        flood.clear()
        wait_for(lambda: answers_version(path), "a new client served after the flood")
        hang_up(b)
    finally:
        for c in flood:
            c.close()
        p.kill()
        p.wait()


def answers_version(path):
    c = socket.socket(socket.AF_UNIX)
    try:
        c.settimeout(5)
        c.connect(path)
        c.sendall(b'{"jsonrpc":"2.0","id":1,"method":"getVersion"}\n')
        return b"runseal.protocol/v1" in c.recv(65536)
    except OSError:
        return False
    finally:
        c.close()


def mcp_session(ws, args, body, hang=60):
    import asyncio

    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    async def go():
        params = StdioServerParameters(command=MOAT, args=["mcp", "--no-audit", *args], cwd=ws)
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return await asyncio.wait_for(body(session), hang)

    return asyncio.run(go())


def test_mcp_a_cwd_inside_git_cannot_write_its_hooks(ws):
    subprocess.run(["git", "init", "-q", ws], check=True)
    hook = os.path.join(ws, ".git", "hooks", "pre-commit")

    async def body(s):
        return await s.call_tool("exec", {"command": ["sh", "-c", "echo pwned > hooks/pre-commit"], "cwd": ".git"})

    r = mcp_session(ws, ["--policy", "workspace-write"], body)
    assert not os.path.exists(hook), "an MCP call's cwd made .git/hooks writable"
    assert r.is_error


def test_mcp_one_string_in_argv_is_one_program_never_a_shell_contract(ws):
    async def body(s):
        return await s.call_tool("exec", {"command": ["touch argv-marker; echo split"]})

    r = mcp_session(ws, ["--policy", "workspace-write"], body)
    assert r.is_error and r.structured_content["exit_code"] == 127, r
    assert not os.path.exists(os.path.join(ws, "argv-marker"))


# Other ways to a shell or an interpreter than ["bash", "-c"]: none is
# refused (the policy has no program list; see docs/integrations.md), and
# each runs confined exactly as bash does.
OTHER_SHELLS = [
    ["/bin/sh", "-c", "echo ran; echo x > {host}"],
    ["env", "bash", "-c", "echo ran; echo x > {host}"],
    ["python3", "-c", "print('ran', flush=True); open('{host}', 'w').write('x')"],
]


@pytest.mark.parametrize("argv", OTHER_SHELLS, ids=["sh", "env-bash", "python3"])
def test_mcp_other_shells_run_but_stay_confined(ws, argv):
    import shutil

    host = f"/var/tmp/moat-rt4-{token()}"
    argv = [a.format(host=host) for a in argv]
    if argv[0] == "python3":
        argv[0] = shutil.which("python3") or "python3"

    async def body(s):
        return await s.call_tool("exec", {"command": argv})

    try:
        r = mcp_session(ws, ["--policy", "workspace-write"], body)
        assert r.structured_content["stdout"].startswith("ran"), r
        assert not os.path.exists(host), f"{argv[0]} wrote outside the workspace"
        assert r.is_error
    finally:
        if os.path.exists(host):
            os.unlink(host)


def hook(ws, home, payload):
    import json

    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home, "LANG": "C.UTF-8"}
    r = subprocess.run([MOAT, "hook", "claude-code"], input=data, cwd=ws, env=env, capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["hookSpecificOutput"], env


def bash_input(cwd, command):
    return {
        "session_id": "0b3c4d5e-aaaa-bbbb-cccc-000000000000",
        "cwd": cwd,
        "hook_event_name": "PreToolUse",
        "tool_name": "Bash",
        "tool_input": {"command": command, "description": "x"},
    }


@pytest.fixture
def home():
    with tempfile.TemporaryDirectory(prefix="moat-rt4-home-") as d:
        yield os.path.realpath(d)


TRICKY = [
    "echo 'it'\"'\"'s'; echo \"$(echo sub)\" `echo tick`",
    "cat <<'EOF'\nline $HOME\nEOF\ncat <<EOF\n$(echo expanded)\nEOF",
    "printf '%s\\n' a\\\nb; echo 'multi\nline'",
    "echo \\'; echo '\\'",
    "echo done #'; touch {host}",
]


@pytest.mark.parametrize("command", TRICKY, ids=["quotes", "heredoc", "continuation", "backslash", "comment"])
def test_the_hook_keeps_a_tricky_command_whole_and_confined(ws, home, command):
    host = f"/var/tmp/moat-rt4-hook-{token()}"
    command = command.replace("{host}", host)
    probe = f"{command}\necho probe-ran; pwd; echo x > {host}"
    out, env = hook(ws, home, bash_input(ws, probe))
    assert out["permissionDecision"] == "allow", out
    rewritten = out["updatedInput"]["command"]
    # What the command prints bare (a host file it writes aside), and what
    # the rewritten one prints: the same lines, from the same directory.
    bare = subprocess.run(["bash", "-c", command], cwd=ws, env=env, capture_output=True, timeout=60).stdout
    ran = subprocess.run(["bash", "-c", rewritten], cwd=ws, env=env, capture_output=True, timeout=60)
    try:
        assert ran.stdout == bare + f"probe-ran\n{ws}\n".encode(), (ran.stdout, ran.stderr)
        assert not os.path.exists(host), "the rewritten command wrote outside the workspace"
    finally:
        if os.path.exists(host):
            os.unlink(host)


def test_the_hook_runs_where_the_shell_is_not_where_the_input_says_contract(ws, home):
    with tempfile.TemporaryDirectory(prefix="moat-rt4-else-") as elsewhere:
        elsewhere = os.path.realpath(elsewhere)
        out, env = hook(ws, home, bash_input(elsewhere, "pwd"))
        assert out["permissionDecision"] == "allow", out
        ran = subprocess.run(["bash", "-c", out["updatedInput"]["command"]], cwd=ws, env=env, capture_output=True, timeout=60)
        assert ran.stdout.decode().strip() == ws, ran


@pytest.mark.parametrize(
    "payload",
    [
        {"tool_name": "Bash"},
        {"tool_name": "Bash", "tool_input": {}},
        {"tool_name": "Bash", "tool_input": {"command": ["ls"]}},
        {"tool_name": "Bash", "tool_input": "ls"},
        b"\xff\xfe not json",
    ],
    ids=["no-input", "no-command", "argv", "string-input", "bytes"],
)
def test_the_hook_denies_a_call_it_cannot_read_contract(ws, home, payload):
    out, _ = hook(ws, home, payload)
    assert out["permissionDecision"] == "deny", out
    assert "updatedInput" not in out


# docs/protocol.md: what the service keeps of one execution.
MAX_KEPT_EVENTS = 1000
MAX_KEPT_DENIALS = 256


def test_a_command_causing_endless_decisions_does_not_grow_the_service_contract(ws):
    # In proxy mode each refused CONNECT is a network.decision (and a
    # denial); a command looping on them must not make the service keep
    # every one of them.
    import sys

    n = MAX_KEPT_EVENTS + 1500
    code = (
        "import os, socket, urllib.parse\n"
        "p = urllib.parse.urlparse(os.environ.get('HTTP_PROXY') or os.environ['http_proxy'])\n"
        f"for i in range({n}):\n"
        "    c = socket.create_connection((p.hostname, p.port))\n"
        "    c.sendall(b'CONNECT d%d.invalid:443 HTTP/1.1\\r\\nHost: d%d.invalid:443\\r\\n\\r\\n' % (i, i))\n"
        "    c.recv(1000)\n"
        "    c.close()\n"
        "print('looped', flush=True)\n"
    )
    s = Server(["--policy", "workspace-write", "--network", "proxy", "--allow-domain", "example.com"], cwd=ws)
    try:
        r, end = run(s, {"command": [os.path.realpath(sys.executable), "-c", code]})
        assert end is not None, r
        ex = r["result"]["execution_id"]
        assert b"looped" in stdout_of(s, ex)
        streamed = [m for m in s.log if m.get("method") == "event" and m["params"]["type"] == "network.decision"]
        assert len(streamed) >= n, "the decisions are still streamed"
        kept = s.ok("getAuditEvents", {"execution_id": ex})
        assert kept["count"] <= MAX_KEPT_EVENTS + 1, kept["count"]
        assert kept["events"][-1]["type"] == "execution.finished"
        assert s.ok("tailAudit")["count"] <= MAX_KEPT_EVENTS + 1
        assert len(s.ok("getExecution", {"execution_id": ex})["denials"]) <= MAX_KEPT_DENIALS
    finally:
        s.close()


def test_remembered_executions_hold_no_fds(ws):
    # A service that held an fd per remembered execution ran out of them
    # (1000 remembered, a 1024 fd limit) and could start nothing more.
    s = Server(["--policy", "workspace-write"], cwd=ws)
    fds = lambda: len(os.listdir(f"/proc/{s.proc.pid}/fd"))  # noqa: E731
    try:
        run(s, {"command": ["true"]})
        before = fds()
        for _ in range(40):
            r, end = run(s, {"command": ["true"]})
            assert end is not None, r
        after = fds()
        assert s.ok("listExecutions")["count"] == 41
        assert after <= before + 4, f"{after - before} more fds after 40 finished executions"
    finally:
        s.close()


def test_mcp_a_call_the_client_abandons_stops_its_command(ws):
    # The client gives up on a call (its read timeout) and sends
    # notifications/cancelled; the command must not go on running for the
    # rest of the session (and each retry start another one).
    tok = token()
    started = os.path.join(ws, "started")

    async def body(s):
        try:
            # The client's patience: long enough for the command to start on
            # a loaded machine (3 s was not, under a concurrent CI run).
            await s.call_tool("exec", {"command": ["sh", "-c", f"touch started; exec sleep 300 {tok}"]}, read_timeout_seconds=10)
        except Exception:
            pass
        assert os.path.exists(started), "the command never started"
        import asyncio

        deadline = asyncio.get_running_loop().time() + 60
        while host_pids_with(tok) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        left = host_pids_with(tok)
        # The session goes on serving.
        r = await s.call_tool("exec", {"command": ["echo", "after"]})
        return left, r

    left, r = mcp_session(ws, ["--policy", "workspace-write"], body, hang=150)
    assert not left, f"the abandoned call's command still runs: {left}"
    assert r.structured_content["stdout"] == "after\n"


@pytest.mark.parametrize("cwd,plant", [(".local/bin", "git"), (".local", "bin/git"), (".config/git", "config")])
def test_a_cwd_inside_a_home_path_that_runs_code_cannot_write_it(cwd, plant):
    # A server whose workspace is the home: the home's paths that run code
    # (PATH entries, git's config) stay read-only at the root, and a
    # request naming one (or a parent of one) as its cwd must not make it
    # writable.
    with tempfile.TemporaryDirectory(prefix="moat-rt4-home-") as h:
        h = os.path.realpath(h)
        for d in (".local/bin", ".config/git"):
            os.makedirs(os.path.join(h, d))
        target = os.path.join(h, cwd, plant)
        mark = token()
        s = Server(["--policy", "workspace-write"], cwd=h, env=dict(os.environ, HOME=h))
        try:
            r, end = run(s, {"command": ["sh", "-c", f"echo ran-{mark}"]})
            assert end and f"ran-{mark}".encode() in stdout_of(s, r["result"]["execution_id"]), r
            r, end = run(s, {"command": ["sh", "-c", f"echo '#!/bin/sh' > {plant}"], "cwd": cwd})
            if "error" in r:
                assert r["error"]["data"]["code"] == "POLICY_DENIED", r
        finally:
            s.close()
        assert not os.path.exists(target), f"{target} was planted through cwd {cwd}"


@pytest.mark.parametrize("timeout", ["100", -1, 1.5, 0, 2**64 - 1], ids=["string", "negative", "fraction", "zero", "huge"])
def test_a_timeout_the_server_cannot_read_is_refused_not_dropped(ws, timeout):
    # A server without a --timeout of its own: a request's unreadable
    # timeout_ms must not leave the command without one.
    s = Server(["--policy", "workspace-write"], cwd=ws)
    try:
        r = s.call("explainPolicy", {"timeout_ms": timeout})
        assert "error" in r and r["error"]["data"]["code"] == "INVALID_REQUEST", r
        r = s.call("execute", {"command": ["true"], "timeout_ms": timeout})
        assert "error" in r and r["error"]["data"]["code"] == "INVALID_REQUEST", r
    finally:
        s.close()


def service_rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(next(l for l in f if l.startswith("VmRSS")).split()[1])


@pytest.mark.parametrize("launch", ["template", "oneshot"])
def test_output_faster_than_the_client_reads_does_not_grow_the_service(ws, launch):
    # A command writes far more than the client has read; the service must
    # hold it back (the command waits), not buffer it: buffered, one
    # command's output grows the service until the kernel kills it, with
    # every client's executions.
    total = 128 << 20
    d = tempfile.mkdtemp(prefix="moat-rt4-sock-")
    os.chmod(d, 0o700)
    path = os.path.join(d, "moat.sock")
    p = subprocess.Popen(
        [MOAT, "serve", "--no-audit", "--policy", "workspace-write", "--launch", launch, "--socket", path],
        cwd=ws,
        stderr=subprocess.DEVNULL,
    )
    c = None
    try:
        wait_for(lambda: os.path.exists(path) or p.poll() is not None, "the socket")
        c = socket.socket(socket.AF_UNIX)
        c.connect(path)
        req = {"jsonrpc": "2.0", "id": 1, "method": "execute",
               "params": {"command": ["sh", "-c", f"head -c {total} /dev/zero; touch wrote-all"]}}
        c.sendall((json.dumps(req) + "\n").encode())
        base = None
        peak = 0
        got = 0
        marker = os.path.join(ws, "wrote-all")
        c.settimeout(60)
        while not os.path.exists(marker):
            chunk = c.recv(1 << 20)
            assert chunk, "the service hung up"
            got += len(chunk)
            rss = service_rss_kb(p.pid)
            base = rss if base is None else base
            peak = max(peak, rss)
        assert peak - base < 48 << 10, f"the service grew by {(peak - base) >> 10} MiB holding output back"
    finally:
        if c:
            c.close()
        p.kill()
        p.wait()
