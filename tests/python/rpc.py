"""A small JSON-RPC 2.0 client for `moat serve --stdio`, written against
RunSeal's RFC-0006 text: one message per line, `event` notifications; and
the socket client and `moat serve --socket` fixture the service tests share."""

import json
import os
import socket
import subprocess
import tempfile
import threading
import time

import pytest

MOAT = os.environ.get("MOAT_BIN", "moat")
# Hang guard only: no test asserts on elapsed time.
HANG = 60


def host_pids_with(token):
    """Host pids whose command line holds `token` (the process is gone
    when this is empty)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if token.encode() in cmd and b"moat" not in cmd.split(b"\0")[0]:
            found.append(int(pid))
    return found


def wait_for(pred, what):
    deadline = time.monotonic() + HANG
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


class Server:
    """`moat serve --stdio ARGS`, with every line it writes queued."""

    def __init__(self, args, cwd, env=None, preexec=None):
        self.proc = subprocess.Popen(
            [MOAT, "serve", "--stdio", "--no-audit", *args],
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            preexec_fn=preexec,
        )
        self.log = []  # every message, in arrival order
        self.taken = set()  # indices into log already returned by wait()
        self.ended = False
        self.next_id = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for raw in self.proc.stdout:
            self.log.append(json.loads(raw))
        self.ended = True

    def send_raw(self, data: bytes):
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def request(self, method, params=None):
        """Sends a request and returns its id."""
        self.next_id += 1
        msg = {"jsonrpc": "2.0", "id": self.next_id, "method": method}
        if params is not None:
            msg["params"] = params
        self.send_raw((json.dumps(msg) + "\n").encode())
        return self.next_id

    def wait(self, pred, what):
        """Returns the first message not yet returned that matches `pred`,
        in arrival order."""
        deadline = time.monotonic() + HANG
        while time.monotonic() < deadline:
            ended = self.ended
            for i, msg in enumerate(list(self.log)):
                if i not in self.taken and pred(msg):
                    self.taken.add(i)
                    return msg
            if ended:
                raise AssertionError(f"server ended while waiting for {what}: {self.stderr()}")
            time.sleep(0.01)
        raise AssertionError(f"timed out waiting for {what}")

    def response(self, rid):
        return self.wait(lambda m: m.get("id") == rid and "method" not in m, f"response {rid}")

    def call(self, method, params=None):
        return self.response(self.request(method, params))

    def ok(self, method, params=None):
        r = self.call(method, params)
        assert "result" in r, r
        return r["result"]

    def event(self, execution_id, kind):
        return self.wait(
            lambda m: m.get("method") == "event"
            and m["params"].get("execution_id") == execution_id
            and m["params"].get("type") == kind,
            f"{kind} of {execution_id}",
        )

    def finished(self, execution_id):
        """The execution's last event (finished or failed)."""
        return self.wait(
            lambda m: m.get("method") == "event"
            and m["params"].get("execution_id") == execution_id
            and m["params"].get("type") in ("execution.finished", "execution.failed"),
            f"end of {execution_id}",
        )

    def stderr(self):
        try:
            return self.proc.stderr.read().decode(errors="replace") if self.proc.poll() is not None else ""
        except Exception:
            return ""

    def close(self):
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=HANG)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


class SocketClient:
    """One connection to `moat serve --socket`, every message it reads queued."""

    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(path)
        self.file = self.sock.makefile("rwb")
        self.log = []
        self.taken = set()
        self.next_id = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for raw in self.file:
            self.log.append(json.loads(raw))

    def call(self, method, params=None):
        self.next_id += 1
        rid = self.next_id
        msg = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params or {}}
        self.file.write((json.dumps(msg) + "\n").encode())
        self.file.flush()
        deadline = time.monotonic() + HANG
        while time.monotonic() < deadline:
            for i, m in enumerate(list(self.log)):
                if i not in self.taken and m.get("id") == rid and "method" not in m:
                    self.taken.add(i)
                    return m
            time.sleep(0.01)
        raise AssertionError(f"no answer to {method}")

    def ok(self, method, params=None):
        r = self.call(method, params)
        assert "result" in r, r
        return r["result"]

    def events_of(self, execution_id):
        return [
            m["params"]
            for m in list(self.log)
            if m.get("method") == "event" and m["params"].get("execution_id") == execution_id
        ]

    def close(self):
        self.sock.close()


@pytest.fixture
def socket_server(ws):
    """`moat serve --socket` at workspace-write in the requesting module's `ws`,
    in a directory only this user can enter; yields the socket's path."""
    d = tempfile.mkdtemp(prefix="moat-serve-sock-")
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
