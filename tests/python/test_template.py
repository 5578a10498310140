"""`moat serve` executions forked from a pre-built sandbox template
(issue 11 §5): nothing of one execution is visible to the next (files in
/tmp, HOME and /dev/shm, processes, environment, fds, abstract unix
sockets), cancel kills a setsid grandchild, a secret created after the
template was built stays hidden, and a template execution reports what a
one-shot execution of the same request reports."""

import base64
import os
import random
import tempfile

import pytest

from rpc import Server, host_pids_with, wait_for


@pytest.fixture
def ws():
    with tempfile.TemporaryDirectory(prefix="moat-tpl-") as d:
        yield os.path.realpath(d)


def token():
    return str(random.randint(10**8, 10**9 - 1))


def output(s, eid, stream="execution.stdout"):
    """Everything the execution wrote on `stream`, from its events."""
    chunks = [
        m["params"] for m in list(s.log)
        if m.get("method") == "event"
        and m["params"].get("execution_id") == eid
        and m["params"].get("type") == stream
    ]
    return b"".join(base64.b64decode(c["data"]) for c in chunks).decode(errors="replace")


def run(s, command, **params):
    ex = s.ok("execute", {"command": command, **params})
    eid = ex["execution_id"]
    s.finished(eid)
    wait_for(lambda: s.ok("getExecution", {"execution_id": eid})["finished_at"], "the result")
    return eid, s.ok("getExecution", {"execution_id": eid})


def test_template_executions_see_no_files_processes_env_or_fds_of_the_previous_one(ws):
    t = token()
    env = dict(os.environ, MOAT_TPL_SERVICE_SECRET=f"svc{t}")
    s = Server(["--policy", "workspace-contained"], cwd=ws, env=env)
    try:
        eid1, r1 = run(s, ["sh", "-c",
                           f"echo {t} > /tmp/tmpleft{t}; echo {t} > $HOME/homeleft{t}; "
                           f"echo {t} > /dev/shm/shmleft{t}; exec 7>/tmp/fdleft{t}; "
                           f"sh -c 'sleep {t}' & echo FIRST-RAN"])
        assert r1["launch"] == "template", r1
        assert "FIRST-RAN" in output(s, eid1), r1
        # The background process died with the first execution.
        wait_for(lambda: host_pids_with(f"sleep {t}") == [], "the first execution's background process to go")
        eid2, r2 = run(s, ["sh", "-c",
                           "ls -a /tmp $HOME /dev/shm; echo FDS; ls /proc/self/fd; echo PIDS; "
                           "ls /proc | grep '^[0-9]'; echo ENV; env; tr '\\0' '\\n' < /proc/1/environ; "
                           f"echo SECOND-RAN"])
        assert r2["launch"] == "template", r2
        o = output(s, eid2)
        assert "SECOND-RAN" in o, (r2, output(s, eid2, "execution.stderr"))
        for left in ("tmpleft", "homeleft", "shmleft", "fdleft"):
            assert f"{left}{t}" not in o, f"{left} of the first execution is visible:\n{o}"
        assert f"svc{t}" not in o, f"the service's environment reached the sandbox:\n{o}"
        fds = [int(x) for x in o.split("FDS\n")[1].split("PIDS")[0].split()]
        assert all(fd <= 3 for fd in fds), f"an fd beyond stdio (and ls's own) is open: {fds}"
        pids = [int(x) for x in o.split("PIDS\n")[1].split("ENV")[0].split()]
        assert pids and max(pids) < 10, f"processes other than this execution's: {pids}"
    finally:
        s.close()


def test_template_abstract_socket_of_a_running_execution_is_unreachable_from_the_next(ws):
    t = token()
    name = f"moat-tpl-{t}"
    s = Server(["--policy", "workspace-contained"], cwd=ws)
    try:
        ex = s.ok("execute", {"command": ["python3", "-c", (
            "import socket,time\n"
            "s=socket.socket(socket.AF_UNIX)\n"
            f"s.bind('\\0{name}'); s.listen(1)\n"
            "print('BOUND', flush=True)\n"
            "s.settimeout(60)\n"
            "try:\n"
            "    s.accept(); print('ACCEPTED', flush=True)\n"
            "except OSError:\n"
            "    pass\n")]})
        first = ex["execution_id"]
        wait_for(lambda: "BOUND" in output(s, first), "the first execution to bind its socket")
        eid, r = run(s, ["python3", "-c", (
            "import socket\n"
            "s=socket.socket(socket.AF_UNIX)\n"
            "try:\n"
            f"    s.connect('\\0{name}'); print('CONNECTED')\n"
            "except OSError as e:\n"
            "    print('REFUSED', e.errno)\n")])
        o = output(s, eid)
        assert r["launch"] == "template", r
        assert "REFUSED" in o and "CONNECTED" not in o, o
        s.ok("cancelExecution", {"execution_id": first})
        s.finished(first)
        assert "ACCEPTED" not in output(s, first)
    finally:
        s.close()


def test_template_cancel_kills_a_setsid_grandchild(ws):
    t = token()
    s = Server(["--policy", "workspace-write"], cwd=ws)
    try:
        ex = s.ok("execute", {"command": ["sh", "-c", f'setsid sh -c "touch up; exec sleep {t}" & sleep {t}1']})
        eid = ex["execution_id"]
        wait_for(lambda: os.path.exists(os.path.join(ws, "up")), "the grandchild to start")
        wait_for(lambda: host_pids_with(f"sleep {t}"), "the grandchild on the host")
        s.ok("cancelExecution", {"execution_id": eid})
        s.finished(eid)
        wait_for(lambda: s.ok("getExecution", {"execution_id": eid})["finished_at"], "the result")
        res = s.ok("getExecution", {"execution_id": eid})
        assert res["launch"] == "template", res
        assert res["termination_reason"] == "canceled", res
        assert host_pids_with(f"sleep {t}") == [], "the setsid grandchild survived the cancel"
    finally:
        s.close()


def test_template_secret_created_after_the_template_was_built_is_hidden(ws):
    # The workspace is HOME too, so a protected home path can appear in it.
    t = token()
    env = dict(os.environ, HOME=ws)
    s = Server(["--policy", "workspace-write"], cwd=ws, env=env)
    try:
        eid, r = run(s, ["sh", "-c", "echo BUILT"])
        assert r["launch"] == "template" and "BUILT" in output(s, eid), r
        # The host changes after the template was built.
        with open(os.path.join(ws, ".env"), "w") as f:
            f.write(f"TOKEN=envsecret{t}\n")
        os.makedirs(os.path.join(ws, ".aws"))
        with open(os.path.join(ws, ".aws", "credentials"), "w") as f:
            f.write(f"aws_secret_access_key=awssecret{t}\n")
        eid, r = run(s, ["sh", "-c", "cat .env; ls -a .aws; cat .aws/credentials; echo CAT-RAN"])
        o = output(s, eid)
        assert r["launch"] == "template", r
        assert "CAT-RAN" in o, (r, output(s, eid, "execution.stderr"))
        assert f"envsecret{t}" not in o, f"the .env created later is visible:\n{o}"
        assert f"awssecret{t}" not in o, f"the ~/.aws created later is visible:\n{o}"
        # The stand-ins: .env is there and empty, .aws an empty directory.
        assert "credentials" not in o.split("CAT-RAN")[0].replace("cat: .aws/credentials", ""), o
    finally:
        s.close()


VOLATILE = {"execution_id", "session_id", "started_at", "finished_at", "resource_usage", "launch"}


def test_template_and_oneshot_results_are_the_same(ws):
    results = {}
    for launch in ("template", "oneshot"):
        s = Server(["--policy", "workspace-write", "--launch", launch], cwd=ws)
        try:
            eid, r = run(s, ["sh", "-c", "cat; echo out; echo err >&2; cat /nonexistent-moat; exit 3"],
                         stdin={"mode": "bytes", "data": base64.b64encode(b"in\n").decode()})
            assert r["launch"] == launch, r
            results[launch] = ({k: v for k, v in r.items() if k not in VOLATILE},
                               output(s, eid), output(s, eid, "execution.stderr"))
        finally:
            s.close()
    assert results["template"] == results["oneshot"], results


def test_template_killed_is_replaced_not_asked(ws):
    # A template process that died (killed, out of memory) must not turn
    # every later execution into a failure.
    s = Server(["--policy", "workspace-contained"], cwd=ws)
    try:
        eid, r = run(s, ["sh", "-c", "echo BUILT"])
        assert r["launch"] == "template" and "BUILT" in output(s, eid), r
        kids = []
        for task in os.listdir(f"/proc/{s.proc.pid}/task"):
            with open(f"/proc/{s.proc.pid}/task/{task}/children") as f:
                kids += [int(p) for p in f.read().split()]
        assert kids, "the service started no template process"
        for pid in kids:
            os.kill(pid, 9)

        def dead(pid):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
            except OSError:
                return True

        # Dead, not dying: a template killed while it takes a request fails
        # that one execution (it may have started it; it is never re-run).
        wait_for(lambda: all(dead(p) for p in kids), "the template to die")
        eid, r = run(s, ["sh", "-c", "echo AFTER-KILL"])
        assert r["launch"] == "template" and r["status"] == "finished", r
        assert "AFTER-KILL" in output(s, eid), r
    finally:
        s.close()
