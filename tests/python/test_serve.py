"""`moat serve --stdio` against RunSeal's stable execution protocol
(RFC-0006, service mode RFC-0013): every method, events, concurrency,
cancellation of a whole tree, bad input, and the server's ceiling."""

import base64
import os
import random
import shutil
import signal
import subprocess
import tempfile

import pytest

from rpc import MOAT, Server, host_pids_with, wait_for


@pytest.fixture
def ws():
    with tempfile.TemporaryDirectory(prefix="moat-serve-") as d:
        yield os.path.realpath(d)


@pytest.fixture
def outside():
    with tempfile.TemporaryDirectory(prefix="moat-outside-") as d:
        yield os.path.realpath(d)


def serve(ws, *args):
    return Server(list(args), cwd=ws)


def token():
    return str(random.randint(10**8, 10**9 - 1))


def stdout_of(s, execution_id):
    """Everything the execution wrote on stdout, from its events."""
    return b"".join(
        base64.b64decode(m["params"]["data"]) for m in list(s.log)
        if m.get("method") == "event"
        and m["params"].get("execution_id") == execution_id
        and m["params"].get("type") == "execution.stdout"
    )


def run_to_end(s, params):
    ex = s.ok("execute", params)
    end = s.finished(ex["execution_id"])
    return ex, end


def test_every_method_contract(ws):
    s = serve(ws, "--policy", "workspace-write")
    try:
        v = s.ok("getVersion")
        assert v["protocol_version"] == "runseal.protocol/v1"
        assert v["moat_version"]
        caps = s.ok("getCapabilities")
        assert caps["backend"] == "moat-linux" and caps["platform"] == "linux"
        assert set(caps["sandbox_levels"]) >= {"read-only", "workspace-write"} and "proxy" in caps["network_modes"]
        ex_pol = s.ok("explainPolicy", {"policy": "read-only"})
        assert ex_pol["policy"]["level"] == "read-only"
        assert ex_pol["policy_hash"].startswith("sha256:")
        status = s.ok("getServiceStatus")
        assert status["mode"] == "service" and status["transport"] == "stdio"
        assert status["remote_listener"] is False

        ex, end = run_to_end(s, {"command": ["sh", "-c", "echo hello; echo oops >&2; exit 3"]})
        assert ex["execution_id"].startswith("exec_") and ex["status"] == "running"
        assert end["params"]["exit_code"] == 3
        res = s.ok("getExecution", {"execution_id": ex["execution_id"]})
        assert res["status"] == "finished" and res["exit_code"] == 3
        assert res["stdout_bytes"] == len(b"hello\n") and res["stderr_bytes"] == len(b"oops\n")
        assert res["policy_hash"] == ex["policy_hash"]
        assert res["output_truncated"] is False
        assert "duration_ms" in res["resource_usage"]
        assert res["started_at"] and res["finished_at"]

        lst = s.ok("listExecutions")
        assert [e["execution_id"] for e in lst["executions"]] == [ex["execution_id"]]
        sub = s.ok("subscribeEvents", {"execution_id": ex["execution_id"], "types": ["execution.*"]})
        assert sub["subscribed"] is True
        audit = s.ok("getAuditEvents", {"execution_id": ex["execution_id"], "types": ["execution.*"]})
        kinds = [e["type"] for e in audit["events"]]
        assert kinds[0] == "execution.started" and kinds[-1] == "execution.finished", kinds
        assert all(k.startswith("execution.") for k in kinds)
        tail = s.ok("tailAudit")
        assert tail["count"] >= len(kinds) + 1  # policy.resolved too
        disp = s.ok("disposeSession", {"session_id": ex["session_id"]})
        assert disp["disposed"] is True

        # Finished or unknown executions cannot be found for cancelling.
        for bad in [ex["execution_id"], "exec_nope"]:
            err = s.call("cancelExecution", {"execution_id": bad})["error"]
            assert err["code"] == -32000 and err["data"]["code"] == "EXECUTION_NOT_FOUND"
        err = s.call("getExecution", {"execution_id": "exec_nope"})["error"]
        assert err["data"]["code"] == "EXECUTION_NOT_FOUND"
    finally:
        s.close()


def test_events_stream_before_the_result_contract(ws):
    s = serve(ws)
    try:
        rid = s.request("execute", {"command": ["sh", "-c", "printf 'a\\0b'"]})
        ex = s.response(rid)["result"]
        eid = ex["execution_id"]
        end = s.finished(eid)
        order = [
            m for m in s.log
            if m.get("id") == rid or (m.get("method") == "event" and m["params"]["execution_id"] == eid)
        ]
        # The Execution answer comes first, then the lifecycle in order.
        assert "result" in order[0]
        kinds = [m["params"]["type"] for m in order[1:]]
        assert kinds[0] == "policy.resolved" and kinds[1] == "execution.started", kinds
        assert kinds[-1] == "execution.finished"
        out = [m["params"] for m in order[1:] if m["params"]["type"] == "execution.stdout"]
        assert out and out[0]["encoding"] == "base64"
        assert b"".join(base64.b64decode(o["data"]) for o in out) == b"a\0b"
        assert end["params"]["policy_hash"] == ex["policy_hash"]
    finally:
        s.close()


def test_held_events_reach_the_client_while_the_command_still_runs(ws):
    # The service holds an execution's answer and events briefly to write
    # them together (docs/protocol.md); the hold must be bounded: the
    # answer, `execution.started` and the first output arrive while the
    # command still waits for a file only this client makes after seeing
    # that output. Events held to the command's end would never show it
    # (the wait below times out), with no clock in the assertion.
    s = serve(ws)
    try:
        rid = s.request("execute", {"command": [
            "sh", "-c", "echo first; until [ -e go ]; do sleep 0.01; done; echo second"]})
        eid = s.response(rid)["result"]["execution_id"]
        s.event(eid, "execution.started")
        first = s.event(eid, "execution.stdout")["params"]
        assert base64.b64decode(first["data"]) == b"first\n", first
        assert not any(
            m.get("method") == "event" and m["params"].get("execution_id") == eid
            and m["params"].get("type") in ("execution.finished", "execution.failed")
            for m in list(s.log)), "the execution ended before the client let it"
        with open(os.path.join(ws, "go"), "w"):
            pass
        end = s.finished(eid)["params"]
        assert end["type"] == "execution.finished" and end["exit_code"] == 0, end
    finally:
        s.close()


def test_four_executions_run_at_once(ws):
    # Each marks itself started and waits for the other three: only
    # executions that overlap can all finish (serialized, the first would
    # wait for markers that never come, until its timeout).
    s = serve(ws, "--policy", "workspace-write")
    try:
        script = 'touch "m.$0"; while [ "$(ls m.* | wc -l)" -lt 4 ]; do sleep 0.05; done; sleep 1; echo together'
        ids = [
            s.ok("execute", {"command": ["sh", "-c", script, str(i)], "timeout_ms": 30000})["execution_id"]
            for i in range(4)
        ]
        for eid in ids:
            end = s.finished(eid)["params"]
            assert end["exit_code"] == 0 and end["timed_out"] is False, end
        for eid in ids:
            assert s.ok("getExecution", {"execution_id": eid})["stdout_bytes"] == len(b"together\n")
    finally:
        s.close()


def test_cancel_kills_a_setsid_grandchild(ws):
    t = token()
    s = serve(ws, "--policy", "workspace-write")
    try:
        ex = s.ok("execute", {"command": ["sh", "-c", f'setsid sh -c "touch up; exec sleep {t}" & sleep {t}1']})
        eid = ex["execution_id"]
        wait_for(lambda: os.path.exists(os.path.join(ws, "up")), "the grandchild to start")
        wait_for(lambda: host_pids_with(f"sleep {t}"), "the grandchild on the host")
        r = s.ok("cancelExecution", {"execution_id": eid, "reason": "user_requested"})
        assert r["status"] == "canceling"
        s.finished(eid)
        wait_for(lambda: s.ok("getExecution", {"execution_id": eid})["finished_at"], "the result")
        res = s.ok("getExecution", {"execution_id": eid})
        assert res["termination_reason"] == "canceled" and res["status"] == "failed", res
        assert host_pids_with(f"sleep {t}") == [], "the setsid grandchild survived the cancel"
    finally:
        s.close()


def test_closing_stdin_kills_what_the_service_started(ws):
    t = token()
    s = serve(ws, "--policy", "workspace-write")
    s.ok("execute", {"command": ["sh", "-c", f'setsid sleep {t} & touch up; sleep {t}1']})
    wait_for(lambda: os.path.exists(os.path.join(ws, "up")), "the command to start")
    wait_for(lambda: host_pids_with(f"sleep {t}"), "the processes on the host")
    s.close()
    assert s.proc.returncode == 0
    assert host_pids_with(f"sleep {t}") == [], "a process outlived the service"


def test_malformed_oversize_and_unknown_keep_serving_contract(ws):
    s = serve(ws)
    try:
        s.send_raw(b"{not json\n")
        e = s.wait(lambda m: "error" in m, "parse error")
        assert e["id"] is None and e["error"]["code"] == -32700
        assert e["error"]["data"]["code"] == "INVALID_REQUEST"
        s.send_raw(b'[{"jsonrpc":"2.0","id":1,"method":"getVersion"}]\n')
        e = s.wait(lambda m: "error" in m, "batch refused")
        assert e["error"]["code"] == -32600 and e["error"]["data"]["code"] == "INVALID_REQUEST"
        s.send_raw(b'{"jsonrpc":"2.0","id":{"x":1},"method":"getVersion"}\n')
        e = s.wait(lambda m: "error" in m, "bad id")
        assert e["id"] is None and e["error"]["code"] == -32600
        s.send_raw(b'{"jsonrpc":"2.0","id":5,"method":"' + b"x" * (10 * 1024 * 1024 + 16) + b'"}\n')
        e = s.wait(lambda m: "error" in m, "oversize refused")
        assert e["id"] is None and e["error"]["code"] == -32600
        assert e["error"]["data"]["reason"] == "request_too_large"
        e = s.call("noSuchMethod")
        assert e["error"]["code"] == -32601 and e["error"]["data"]["code"] == "METHOD_NOT_FOUND"
        # A notification (no id) gets no answer; the service still serves.
        s.send_raw(b'{"jsonrpc":"2.0","method":"getVersion"}\n')
        assert s.ok("getVersion")["protocol_version"] == "runseal.protocol/v1"
        assert s.proc.poll() is None
    finally:
        s.close()


def test_cwd_outside_the_roots_is_refused(ws, outside):
    os.symlink(outside, os.path.join(ws, "link-out"))
    s = serve(ws, "--policy", "workspace-write")
    try:
        for cwd in [outside, os.path.join(ws, "link-out"), os.path.join(ws, "..")]:
            r = s.call("execute", {"command": ["sh", "-c", "echo ran; touch marker"], "cwd": cwd})
            assert "error" in r, r
            assert r["error"]["data"]["code"] == "POLICY_DENIED", r
            assert not os.path.exists(os.path.join(outside, "marker"))
            assert not os.path.exists(os.path.join(os.path.dirname(ws), "marker"))
        assert s.ok("listExecutions")["count"] == 0
        # Inside a root: runs, and that directory is the writable one.
        os.mkdir(os.path.join(ws, "sub"))
        ex, end = run_to_end(s, {"command": ["sh", "-c", "echo ran; touch marker"], "cwd": "sub"})
        assert end["params"]["exit_code"] == 0
        assert os.path.exists(os.path.join(ws, "sub", "marker"))
    finally:
        s.close()


def test_a_second_root_is_allowed(ws, outside):
    s = serve(ws, "--policy", "workspace-write", "--root", ws, "--root", outside)
    try:
        ex, end = run_to_end(s, {"command": ["sh", "-c", "touch marker"], "cwd": outside})
        assert end["params"]["exit_code"] == 0
        assert os.path.exists(os.path.join(outside, "marker"))
    finally:
        s.close()


def test_a_wider_policy_is_refused(ws):
    s = serve(ws, "--policy", "read-only", "--network", "disabled")
    try:
        for policy in [
            "workspace-write",
            "danger-full-access",
            {"level": "workspace-contained"},
            {"network": "unmanaged"},
            "read-only-proxy",
        ]:
            r = s.call("execute", {"command": ["sh", "-c", f"echo ran > {ws}/marker"], "policy": policy})
            assert "error" in r, (policy, r)
            assert r["error"]["data"]["code"] == "POLICY_DENIED", r
            assert not os.path.exists(os.path.join(ws, "marker"))
        r = s.call("explainPolicy", {"policy": "workspace-write"})
        assert r["error"]["data"]["code"] == "POLICY_DENIED"
        # The server's own level, named the RunSeal way, runs and stays read-only.
        host_path = f"/var/tmp/moat-serve-{token()}"
        ex, end = run_to_end(
            s, {"command": ["sh", "-c", f"echo ran > {host_path}"], "policy": "read-only-disabled"}
        )
        assert end["params"]["exit_code"] != 0
        assert not os.path.exists(host_path)
        res = s.ok("getExecution", {"execution_id": ex["execution_id"]})
        assert any(d.get("path") == host_path for d in res["denials"]), res
    finally:
        s.close()


def test_a_narrower_policy_is_applied(ws):
    s = serve(ws, "--policy", "workspace-write")
    try:
        ex, end = run_to_end(s, {"command": ["sh", "-c", "echo ran; echo x > marker"], "policy": "read-only"})
        assert end["params"]["exit_code"] != 0
        assert not os.path.exists(os.path.join(ws, "marker"))
        assert ex["policy_id"] == "read-only"
    finally:
        s.close()


def test_timeout_reports_execution_timeout(ws):
    s = serve(ws)
    try:
        ex, end = run_to_end(s, {"command": ["sleep", "60"], "timeout_ms": 300})
        assert end["params"]["timed_out"] is True
        res = s.ok("getExecution", {"execution_id": ex["execution_id"]})
        assert res["error_code"] == "EXECUTION_TIMEOUT" and res["termination_reason"] == "timeout"
    finally:
        s.close()


def test_stdin_bytes_and_env(ws):
    s = serve(ws)
    try:
        data = base64.b64encode(b"from stdin\n").decode()
        ex, end = run_to_end(
            s,
            {
                "command": ["sh", "-c", 'cat; echo "$GREETING"'],
                "stdin": {"mode": "bytes", "data": data},
                "env": {"GREETING": "hi"},
            },
        )
        res = s.ok("getExecution", {"execution_id": ex["execution_id"]})
        assert res["stdout_bytes"] == len(b"from stdin\nhi\n"), res
    finally:
        s.close()


def test_socket_serves_the_same_protocol(ws):
    import json
    import socket

    d = tempfile.mkdtemp(prefix="moat-sock-")
    os.chmod(d, 0o700)
    path = os.path.join(d, "moat.sock")
    p = subprocess.Popen([MOAT, "serve", "--no-audit", "--socket", path], cwd=ws, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: os.path.exists(path), "the socket")
        c = socket.socket(socket.AF_UNIX)
        c.connect(path)
        f = c.makefile("rwb")
        f.write(b'{"jsonrpc":"2.0","id":1,"method":"getServiceStatus"}\n')
        f.flush()
        r = json.loads(f.readline())
        assert r["result"]["transport"] == "socket" and r["result"]["remote_listener"] is False
        c.close()
    finally:
        p.kill()
        p.wait()


def test_socket_in_an_open_directory_is_refused(ws):
    d = tempfile.mkdtemp(prefix="moat-sock-")
    os.chmod(d, 0o755)
    path = os.path.join(d, "moat.sock")
    r = subprocess.run([MOAT, "serve", "--no-audit", "--socket", path], cwd=ws, capture_output=True, timeout=60)
    assert r.returncode == 125
    assert b"chmod 700" in r.stderr
    assert not os.path.exists(path)


def test_socket_peer_of_another_user_is_refused(ws):
    # The server runs as an unprivileged user; root (who can enter its 0700
    # directory) connects: SO_PEERCRED shows another uid, so the connection
    # is closed before a byte is read and the request never runs.
    import json
    import pwd
    import socket

    user = os.environ.get("MOAT_CI_USER", "moat-ci")
    if os.geteuid() != 0:
        pytest.skip("needs root to connect as a different user than the server's")
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        pytest.skip(f"no user {user} to run the server as")
    d = tempfile.mkdtemp(prefix="moat-sock-peer-")
    os.chown(d, pw.pw_uid, pw.pw_gid)
    os.chmod(d, 0o700)
    os.chmod(ws, 0o777)
    path = os.path.join(d, "moat.sock")
    marker = os.path.join(ws, "peer-marker")
    p = subprocess.Popen(
        [shutil.which("runuser") or "/usr/sbin/runuser", "-u", user, "--", MOAT, "serve", "--no-audit", "--policy", "workspace-write", "--socket", path],
        cwd=ws, stderr=subprocess.PIPE, start_new_session=True,
    )
    try:
        wait_for(lambda: os.path.exists(path), "the socket")
        c = socket.socket(socket.AF_UNIX)
        c.connect(path)
        c.settimeout(30)
        req = {"jsonrpc": "2.0", "id": 1, "method": "execute", "params": {"command": ["touch", marker]}}
        try:
            c.sendall((json.dumps(req) + "\n").encode())
            answer = c.recv(4096)
        except (BrokenPipeError, ConnectionResetError):
            answer = b""
        assert answer == b"", f"the server answered another user: {answer!r}"
        c.close()
        assert not os.path.exists(marker)
    finally:
        # runuser waits for the server it started; killing runuser alone
        # would leave the server running: kill the whole session.
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
        shutil.rmtree(d, ignore_errors=True)


def test_a_killed_service_takes_its_executions_with_it(ws):
    # SIGKILL leaves the service no chance to clean up: each execution's
    # supervisor must notice its parent is gone and stop its tree.
    t = token()
    s = serve(ws, "--policy", "workspace-write")
    s.ok("execute", {"command": ["sh", "-c", f'setsid sleep {t} & touch up; sleep {t}1']})
    wait_for(lambda: os.path.exists(os.path.join(ws, "up")), "the command to start")
    wait_for(lambda: host_pids_with(f"sleep {t}"), "the processes on the host")
    s.proc.kill()
    s.proc.wait()
    wait_for(lambda: host_pids_with(f"sleep {t}") == [], "the tree to go with the service")


def test_narrowing_a_proxy_server_to_no_network_runs(ws):
    # The server's allow list belongs to its proxy mode: a request that
    # narrows to `disabled` must run without it, not be refused.
    s = serve(ws, "--network", "proxy", "--allow-domain", "example.com")
    try:
        ex, end = run_to_end(s, {"command": ["sh", "-c", "echo ran"], "policy": "read-only-disabled"})
        assert end["params"]["type"] == "execution.finished" and end["params"]["exit_code"] == 0
        res = s.ok("explainPolicy", {"policy": {"network": "disabled"}})
        assert res["policy"]["network"]["mode"] == "disabled"
    finally:
        s.close()


def test_oneshot_execution_stopped_when_the_host_replaces_env(ws):
    # `--launch oneshot`: the execution's init watches the stand-in over
    # `.env`; the host renaming a new `.env` over it stops the execution
    # (exit 125, termination_reason host_replaced), and the new secret is
    # never in its output.
    secret = "NEWSECRET" + token()
    with open(os.path.join(ws, ".env"), "w") as f:
        f.write("OLD")
    s = serve(ws, "--policy", "workspace-write", "--launch", "oneshot")
    try:
        ex = s.ok("execute", {"command": ["sh", "-c",
                                          ": > ready; while [ ! -e host-saw ]; do sleep 0.05; done; "
                                          "for i in 1 2 3 4 5; do cat .env; done; echo DONE"]})
        wait_for(lambda: os.path.exists(os.path.join(ws, "ready")), "the command's ready file")
        with open(os.path.join(ws, ".env.tmp"), "w") as f:
            f.write(secret)
        os.rename(os.path.join(ws, ".env.tmp"), os.path.join(ws, ".env"))
        end = s.finished(ex["execution_id"])
        with open(os.path.join(ws, "host-saw"), "w"):
            pass
        res = s.ok("getExecution", {"execution_id": ex["execution_id"], "include_output": True})
        assert res["exit_code"] == 125, (end, res)
        assert res["termination_reason"] == "host_replaced" and res["status"] == "failed", res
        assert secret.encode() not in stdout_of(s, ex["execution_id"]), res
        assert secret not in str(res) and secret not in str(end), res
    finally:
        s.close()


def test_template_execution_stopped_when_the_host_replaces_env(ws):
    # The default `--launch template`: once the execution has its request,
    # its init watches the stand-in over `.env` as a one-shot init does;
    # the host renaming a new `.env` over it mid-execution stops the
    # execution (exit 125, termination_reason host_replaced), and the new
    # secret is never in its output.
    secret = "NEWSECRET" + token()
    with open(os.path.join(ws, ".env"), "w") as f:
        f.write("OLD")
    s = serve(ws, "--policy", "workspace-write")
    try:
        ex = s.ok("execute", {"command": ["sh", "-c",
                                          ": > ready; while [ ! -e host-saw ]; do sleep 0.05; done; "
                                          "for i in 1 2 3 4 5; do cat .env; done; echo DONE"]})
        wait_for(lambda: os.path.exists(os.path.join(ws, "ready")), "the command's ready file")
        with open(os.path.join(ws, ".env.tmp"), "w") as f:
            f.write(secret)
        os.rename(os.path.join(ws, ".env.tmp"), os.path.join(ws, ".env"))
        try:
            end = s.finished(ex["execution_id"])
        except AssertionError:
            # Not stopped: let the command read `.env`, so that the failure
            # below shows what it saw.
            end = None
        with open(os.path.join(ws, "host-saw"), "w"):
            pass
        if end is None:
            end = s.finished(ex["execution_id"])
        res = s.ok("getExecution", {"execution_id": ex["execution_id"], "include_output": True})
        assert res["launch"] == "template", res
        assert secret.encode() not in stdout_of(s, ex["execution_id"]), res
        assert secret not in str(res) and secret not in str(end), res
        assert res["exit_code"] == 125, (end, res)
        assert res["termination_reason"] == "host_replaced" and res["status"] == "failed", res
    finally:
        s.close()


@pytest.mark.parametrize("launch", ["template", "oneshot"])
def test_an_execution_leaves_no_set_id_program(ws, launch):
    """A set-uid copy of a shell left in the workspace runs as the server's
    user (root, when root serves) for whoever on the host executes it: the
    mode is refused on both launch paths, and the file stays plain."""
    s = serve(ws, "--policy", "workspace-write", "--launch", launch)
    try:
        ex, end = run_to_end(s, {"command": ["sh", "-c", "cp /bin/sh x && echo copied; chmod 4755 x; chmod 2755 x; echo done"]})
        out = stdout_of(s, ex["execution_id"])
        assert b"copied" in out and b"done" in out, out
        mode = os.stat(os.path.join(ws, "x")).st_mode
        assert mode & 0o6000 == 0, oct(mode)
    finally:
        s.close()
