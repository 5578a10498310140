"""What a long-running service keeps (issue 11 §2): it must not grow with
every execution. `moat serve` remembers its last executions within a count
and a byte budget of their kept events (docs/protocol.md); `moat mcp`
returns a call's output with its result and keeps nothing of it after."""

import asyncio
import json
import os
import tempfile

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from rpc import MOAT, Server

# docs/protocol.md: what the service keeps.
MAX_RECORDS = 1000
MAX_KEPT_BYTES = 8 << 20
MAX_METADATA = 16 * 1024


@pytest.fixture
def ws():
    with tempfile.TemporaryDirectory(prefix="moat-mem-") as d:
        yield os.path.realpath(d)


def test_executions_with_large_events_are_forgotten_past_the_byte_budget(ws):
    # Each execution's policy.resolved carries its request's metadata (up to
    # 16 KiB): 600 of them keep ≈ 13 MB of events, past the service's budget,
    # though well under the 1000 executions it remembers by count.
    runs = 600
    blob = "m" * (MAX_METADATA - 100)
    s = Server(["--policy", "workspace-write"], cwd=ws)
    try:
        last = None
        for i in range(runs):
            ex = s.ok("execute", {"command": ["true"], "metadata": {"run": i, "blob": blob}})
            end = s.finished(ex["execution_id"])["params"]
            assert end["type"] == "execution.finished", end
            last = ex["execution_id"]
            # Only this test's bookkeeping: the client forgets what it read.
            s.log.clear()
            s.taken.clear()
        listed = s.ok("listExecutions")
        assert 0 < listed["count"] < runs, f"all {runs} executions remembered ({listed['count']})"
        assert listed["count"] <= MAX_RECORDS
        assert listed["executions"][-1]["execution_id"] == last
        kept = s.ok("tailAudit")["events"]
        size = sum(len(json.dumps(e, separators=(",", ":"))) for e in kept)
        # Compact JSON as the client prints it may differ from the
        # service's by escapes: a tenth of slack.
        assert size <= MAX_KEPT_BYTES * 11 // 10, f"{size} bytes of events kept"
        # The newest execution is still whole: its metadata came back.
        mine = s.ok("getAuditEvents", {"execution_id": last, "types": ["policy.resolved"]})["events"]
        assert mine and mine[0]["metadata"]["run"] == runs - 1, mine[:1]
    finally:
        s.close()


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def mcp_server_pid(ws):
    """The `moat mcp` process serving in `ws`."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            if len(cmd) > 1 and cmd[1] == b"mcp" and os.readlink(f"/proc/{pid}/cwd") == ws:
                return int(pid)
        except OSError:
            continue
    raise AssertionError("no moat mcp process found")


def test_mcp_keeps_no_output_after_the_call(ws):
    # Each call returns up to 1 MiB per stream; kept after the call (nothing
    # can ask for it again) 60 calls held ≥ 60 MiB.
    calls = 60
    out = ["sh", "-c", "head -c 1048576 /dev/zero | tr '\\0' o"]

    async def body(s):
        r = await s.call_tool("exec", {"command": out})
        assert len(r.structured_content["stdout"]) == 1 << 20
        pid = mcp_server_pid(ws)
        before = rss_kb(pid)
        for _ in range(calls):
            r = await s.call_tool("exec", {"command": out})
            assert r.structured_content["exit_code"] == 0
        return before, rss_kb(pid)

    async def go():
        params = StdioServerParameters(command=MOAT, args=["mcp", "--no-audit", "--policy", "workspace-write"], cwd=ws)
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return await asyncio.wait_for(body(session), 300)

    before, after = asyncio.run(go())
    grown_mib = (after - before) / 1024
    assert grown_mib < calls / 3, f"moat mcp grew by {grown_mib:.0f} MiB over {calls} calls of 1 MiB output"
