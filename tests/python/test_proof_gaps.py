"""Proof gaps of issue 11 (docs/proof.md): the Claude Code hook driven by the
real Claude Code CLI (npm `@anthropic-ai/claude-code`), which runs its
PreToolUse hook offline here because its model API is a local fake that
answers with one Bash tool call. No request leaves the machine."""

import json
import os
import random
import shutil
import subprocess
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rpc import MOAT

# Where .ci/run installs the agent CLIs (a prefix every test user can read).
CLAUDE = os.environ.get("MOAT_CLAUDE", "/opt/moat-ci-agents/bin/claude")


class FakeAnthropic:
    """A loopback stand-in for the Anthropic Messages API: a request that
    offers the Bash tool gets one `tool_use` of `command`; the request that
    carries its `tool_result` gets a final text (and the result is kept);
    anything else (title or quota side requests) gets a short text."""

    def __init__(self, command):
        self.command = command
        self.tool_results = []
        self.paths = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                fake.paths.append(("GET", self.path))
                self.send_response(404)
                self.send_header("content-length", "0")
                self.end_headers()

            def do_HEAD(self):
                self.do_GET()

            def do_POST(self):
                fake.paths.append(("POST", self.path))
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))) or b"{}")
                if not self.path.startswith("/v1/messages") or "count_tokens" in self.path:
                    data = json.dumps({"input_tokens": 10}).encode()
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                block = fake.answer(body)
                fake.reply(self, body, block)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def answer(self, body):
        msgs = body.get("messages") or []
        last = msgs[-1] if msgs else {}
        content = last.get("content")
        if isinstance(content, list):
            results = [c for c in content if isinstance(c, dict) and c.get("type") == "tool_result"]
            if results:
                self.tool_results.extend(results)
                return {"type": "text", "text": "done"}
        tools = {t.get("name") for t in body.get("tools") or []}
        if "Bash" in tools and not self.tool_results:
            return {"type": "tool_use", "id": f"toolu_moat{random.randint(10**6, 10**7)}", "name": "Bash",
                    "input": {"command": self.command, "description": "run the probe"}}
        return {"type": "text", "text": "ok"}

    @staticmethod
    def reply(handler, body, block):
        stop = "tool_use" if block["type"] == "tool_use" else "end_turn"
        message = {"id": "msg_moat", "type": "message", "role": "assistant", "model": body.get("model", "claude"),
                   "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": 10, "output_tokens": 1}}
        if not body.get("stream"):
            data = json.dumps({**message, "content": [block], "stop_reason": stop}).encode()
            handler.send_response(200)
            handler.send_header("content-type", "application/json")
            handler.send_header("content-length", str(len(data)))
            handler.end_headers()
            handler.wfile.write(data)
            return
        if block["type"] == "tool_use":
            start = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        else:
            start = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        events = [
            ("message_start", {"type": "message_start", "message": {**message, "content": []}}),
            ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": start}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                               "usage": {"output_tokens": 5}}),
            ("message_stop", {"type": "message_stop"}),
        ]
        data = "".join(f"event: {k}\ndata: {json.dumps(v)}\n\n" for k, v in events).encode()
        handler.send_response(200)
        handler.send_header("content-type", "text/event-stream")
        handler.send_header("content-length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def close(self):
        self.server.shutdown()


def run_claude(ws, home, fake, hook_command):
    settings = {"hooks": {"PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": hook_command}]}]}}
    settings_path = os.path.join(home, "settings.json")
    with open(settings_path, "w") as f:
        json.dump(settings, f)
    env = {
        "PATH": os.path.dirname(CLAUDE) + ":" + os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": home,
        "LANG": "C.UTF-8",
        "SHELL": "/bin/bash",
        "ANTHROPIC_BASE_URL": fake.url,
        "ANTHROPIC_API_KEY": "sk-ant-moat-proof-fake",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
    }
    return subprocess.run(
        [CLAUDE, "-p", "run the probe", "--settings", settings_path, "--output-format", "json"],
        cwd=ws, env=env, capture_output=True, timeout=180, stdin=subprocess.DEVNULL,
    )


@pytest.fixture
def dirs():
    ws = os.path.realpath(tempfile.mkdtemp(prefix="moat-claude-ws-"))
    home = os.path.realpath(tempfile.mkdtemp(prefix="moat-claude-home-"))
    try:
        yield ws, home
    finally:
        shutil.rmtree(ws, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)


def tool_output(fake):
    parts = []
    for r in fake.tool_results:
        c = r.get("content")
        if isinstance(c, str):
            parts.append(c)
        elif isinstance(c, list):
            parts.extend(x.get("text", "") for x in c if isinstance(x, dict))
    return "\n".join(parts)


def test_real_claude_code_runs_its_bash_call_through_the_hook_confined(dirs):
    """The real CLI sends the hook its PreToolUse JSON, takes the rewritten
    command and runs it: the probe ran in the agent's directory (its marker
    line, its file in the workspace) and its write outside the workspace was
    refused (the host file never appears). Seen failing with the hook
    replaced by one that allows without rewriting (the host file is written)."""
    if not os.access(CLAUDE, os.X_OK):
        pytest.skip(f"the Claude Code CLI is not installed at {CLAUDE} (.ci/run installs it)")
    ws, home = dirs
    host_path = f"/var/tmp/moat-claude-{random.randint(10**8, 10**9 - 1)}"
    fake = FakeAnthropic(f"echo probe-ran; pwd; touch made-by-claude; echo x > {host_path}")
    try:
        hook = f"'{MOAT}' hook claude-code"
        r = run_claude(ws, home, fake, hook)
        out = tool_output(fake)
        ctx = f"claude exit {r.returncode}\nstdout: {r.stdout[-2000:]!r}\nstderr: {r.stderr[-2000:]!r}\nrequests: {fake.paths}\ntool output: {out!r}"
        assert fake.tool_results, "Claude Code never ran the tool call\n" + ctx
        assert "probe-ran" in out, ctx
        assert ws in out, "the command did not run in the agent's directory\n" + ctx
        assert os.path.exists(os.path.join(ws, "made-by-claude")), ctx
        assert not os.path.exists(host_path), "the Bash call wrote outside the workspace: it ran unconfined\n" + ctx
        assert "moat" in out or "Read-only" in out or "Permission denied" in out, ctx
    finally:
        fake.close()
        if os.path.exists(host_path):
            os.unlink(host_path)


def test_real_claude_code_with_a_hook_that_does_not_rewrite_writes_outside_positive_control(dirs):
    """The mutation the case above must catch, kept as a control: the same
    session with a hook that allows the call without rewriting it runs the
    probe bare, and its write outside the workspace lands (so the case
    above can fail, and its fake API really drives a Bash call)."""
    if not os.access(CLAUDE, os.X_OK):
        pytest.skip(f"the Claude Code CLI is not installed at {CLAUDE} (.ci/run installs it)")
    ws, home = dirs
    host_path = f"/var/tmp/moat-claude-{random.randint(10**8, 10**9 - 1)}"
    fake = FakeAnthropic(f"echo probe-ran; echo x > {host_path}")
    allow = json.dumps({"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "allow"}})
    try:
        r = run_claude(ws, home, fake, f"echo '{allow}'")
        ctx = f"claude exit {r.returncode}\nstderr: {r.stderr[-2000:]!r}\ntool output: {tool_output(fake)!r}"
        assert "probe-ran" in tool_output(fake), ctx
        assert os.path.exists(host_path), ctx
    finally:
        fake.close()
        if os.path.exists(host_path):
            os.unlink(host_path)


# Execution A leaves something of each kind behind (a file in its /tmp and
# its HOME, a process, an environment variable, an open descriptor, a
# listening abstract socket), marks itself ready and stays alive until B is
# done; B, and C after A ended, look for each and print what they find.
LEAVER = r'''
import os, socket, subprocess, sys, time
t, ws = sys.argv[1], sys.argv[2]
for d in ("/tmp", os.environ["HOME"]):
    open(os.path.join(d, "leak-" + t), "w").write("A\n")
fd = os.open("/tmp/leak-" + t, os.O_RDONLY)
os.set_inheritable(fd, True)
s = socket.socket(socket.AF_UNIX)
s.bind("\0moat-leak-" + t)
s.listen(1)
subprocess.Popen(["sleep", t + "7"], close_fds=False)
print("LEAVER-READY", flush=True)
open(os.path.join(ws, "ready-A"), "w").close()
deadline = time.monotonic() + 60
while not os.path.exists(os.path.join(ws, "done-B")) and time.monotonic() < deadline:
    time.sleep(0.05)
'''

LOOKER = r'''
import os, socket, sys
t = sys.argv[1]
print("LOOKER-RAN")
for d in ("/tmp", os.environ["HOME"]):
    print("FILE", d, os.path.exists(os.path.join(d, "leak-" + t)))
procs = []
for p in os.listdir("/proc"):
    if p.isdigit():
        try:
            procs.append(open(f"/proc/{p}/cmdline", "rb").read())
        except OSError:
            pass
print("PROC", any((t + "7").encode() in c and c.startswith(b"sleep") for c in procs))
print("ENV", "LEAK_A" in os.environ)
fds = sorted(int(f) for f in os.listdir("/proc/self/fd"))
links = []
for f in fds:
    try:
        links.append(os.readlink(f"/proc/self/fd/{f}"))
    except OSError:
        pass
print("FD", any(("leak-" + t) in l for l in links))
c = socket.socket(socket.AF_UNIX)
try:
    c.connect("\0moat-leak-" + t)
    print("ABSTRACT", True)
except OSError:
    print("ABSTRACT", False)
open(sys.argv[2] + "/done-" + sys.argv[3], "w").close()
'''


def look(s, t, ws, name):
    from test_serve import run_to_end
    import base64

    ex, end = run_to_end(s, {"command": ["python3", "-c", LOOKER, t, ws, name], "timeout_ms": 60000})
    out = b"".join(
        base64.b64decode(m["params"]["data"]) for m in s.log
        if m.get("method") == "event" and m["params"].get("execution_id") == ex["execution_id"]
        and m["params"].get("type") == "execution.stdout"
    ).decode()
    assert "LOOKER-RAN" in out, (end, out)
    return out


@pytest.mark.parametrize("launch", ["template", "oneshot"])
def test_nothing_of_one_execution_is_visible_to_the_next(tmp_path, launch):
    """Issue 11 §5 ("a test proves it"): files in /tmp and HOME, processes,
    environment, descriptors and abstract sockets of one execution are not
    visible to another running at the same time, nor to the next one.
    Against a service that runs commands unconfined every check prints True."""
    from rpc import Server, wait_for

    ws = os.path.realpath(str(tmp_path))
    t = str(random.randint(10**8, 10**9 - 1))
    s = Server(["--policy", "workspace-write", "--launch", launch], cwd=ws)
    try:
        a = s.ok("execute", {"command": ["python3", "-c", LEAVER, t, ws], "env": {"LEAK_A": "1"}, "timeout_ms": 90000})
        wait_for(lambda: os.path.exists(os.path.join(ws, "ready-A")), "execution A to leave its traces")
        during = look(s, t, ws, "B")
        end_a = s.finished(a["execution_id"])
        assert end_a["params"].get("exit_code") == 0, end_a
        after = look(s, t, ws, "C")
        for when, out in (("while A ran", during), ("after A ended", after)):
            seen = [line for line in out.splitlines() if line.endswith(" True")]
            assert seen == [], f"{when}, the next execution saw A's: {seen}\n{out}"
            for kind in ("FILE /tmp", "PROC", "ENV", "FD", "ABSTRACT"):
                assert kind in out, (kind, out)
    finally:
        s.close()


@pytest.mark.parametrize("launch", ["template", "oneshot"])
def test_finished_executions_hold_no_descriptors_of_the_service(tmp_path, launch):
    """Issue 11's benchmark bullet (1,000 executions, no fd growth) as a
    test at a smaller count: a finished execution leaves the service no open
    descriptor. It failed before the fix (one pidfd per finished execution
    kept in its record: 63 -> 1005 over 1,000 runs, near moat-ci's 1024
    descriptor limit), and passes after (the record drops its supervisor's
    pidfd when the execution ends)."""
    from rpc import Server

    s = Server(["--policy", "workspace-contained", "--launch", launch], cwd=os.path.realpath(str(tmp_path)))

    def fds():
        return sorted(os.listdir(f"/proc/{s.proc.pid}/fd"), key=int)

    def execute():
        ex = s.ok("execute", {"command": ["/bin/true"]})
        s.finished(ex["execution_id"])
        # The record is marked done after the last event: wait for it.
        from rpc import wait_for
        wait_for(lambda: s.ok("getExecution", {"execution_id": ex["execution_id"]})["finished_at"], "the result")

    try:
        for _ in range(5):
            execute()
        before = fds()
        for _ in range(100):
            execute()
        after = fds()
        links = [os.readlink(f"/proc/{s.proc.pid}/fd/{f}") for f in after if f not in before]
        assert len(after) - len(before) <= 4, f"{len(before)} -> {len(after)} descriptors after 100 executions: {links[:10]}"
    finally:
        s.close()
