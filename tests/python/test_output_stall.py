"""A `timeout_ms` must fire while the client has stopped reading the
server's output (both launch modes): the command is killed by its timeout
on its own, not when the client reads again or disconnects."""

import json
import os
import random
import subprocess
import tempfile
import time

import pytest

from rpc import HANG, MOAT, host_pids_with, wait_for


@pytest.mark.parametrize("launch", ["template", "oneshot"])
def test_timeout_fires_while_the_client_stops_reading(launch):
    tok = str(random.randint(10**8, 10**9 - 1))
    with tempfile.TemporaryDirectory(prefix="moat-stall-") as ws:
        # stdout is a pipe this test does not read while the command runs.
        proc = subprocess.Popen(
            [MOAT, "serve", "--stdio", "--no-audit", "--policy", "workspace-write",
             "--launch", launch],
            cwd=os.path.realpath(ws),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        try:
            req = {"jsonrpc": "2.0", "id": 1, "method": "execute", "params": {
                "command": ["bash", "-c", f"echo STALL_START; exec -a stall-{tok} yes STALL_LINE"],
                "timeout_ms": 2000,
            }}
            proc.stdin.write((json.dumps(req) + "\n").encode())
            proc.stdin.flush()
            # The command ran (its process appeared), then its timeout ended
            # it while nobody read: the process is gone.
            wait_for(lambda: host_pids_with(f"stall-{tok}"), "the command to start")
            wait_for(lambda: not host_pids_with(f"stall-{tok}"),
                     "the timeout to end the command while the client stalls")
            # Now read (the connection stays open): the execution ended by
            # its timeout.
            deadline = time.monotonic() + HANG
            ended = None
            for raw in proc.stdout:
                msg = json.loads(raw)
                p = msg.get("params") or {}
                if p.get("type") in ("execution.finished", "execution.failed"):
                    ended = p
                    break
                assert time.monotonic() < deadline, "hang guard"
            assert ended is not None, "the execution's last event"
            assert ended.get("timed_out") is True, ended
        finally:
            proc.kill()
            proc.wait()
