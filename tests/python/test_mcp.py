"""`moat mcp` driven by the official MCP Python SDK over stdio: the tool
list, a command run, a refusal, a timeout, a shell string refused, and the
server's ceiling and roots."""

import asyncio
import os
import random
import tempfile

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from rpc import MOAT


@pytest.fixture
def ws():
    with tempfile.TemporaryDirectory(prefix="moat-mcp-") as d:
        yield os.path.realpath(d)


def with_session(ws, args, body):
    async def go():
        params = StdioServerParameters(command=MOAT, args=["mcp", "--no-audit", *args], cwd=ws)
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return await asyncio.wait_for(body(session), 60)

    return asyncio.run(go())


def text_of(result):
    return "\n".join(c.text for c in result.content if getattr(c, "type", "") == "text")


def test_lists_its_tools_contract(ws):
    async def body(s):
        tools = await s.list_tools()
        await s.send_ping()
        return {t.name: t for t in tools.tools}

    tools = with_session(ws, [], body)
    assert set(tools) == {"exec", "capabilities", "explain_policy"}
    assert tools["exec"].input_schema["properties"]["command"]["type"] == "array"


def test_exec_runs_a_command_contract(ws):
    async def body(s):
        return await s.call_tool("exec", {"command": ["sh", "-c", "echo hello; echo $GREETING; cat"], "env": {"GREETING": "hi"}, "stdin": "piped\n"})

    r = with_session(ws, ["--policy", "workspace-write"], body)
    assert r.is_error is False, text_of(r)
    sc = r.structured_content
    assert sc["exit_code"] == 0
    assert sc["stdout"] == "hello\nhi\npiped\n"
    assert sc["policy_hash"].startswith("sha256:")
    assert sc["denials"] == []
    assert "exit code: 0" in text_of(r)


def test_a_refusal_is_an_error_with_the_flag_that_grants_it(ws):
    host_path = f"/var/tmp/moat-mcp-{random.randint(10**8, 10**9 - 1)}"

    async def body(s):
        return await s.call_tool("exec", {"command": ["sh", "-c", f"echo probe-ran; echo x > {host_path}"]})

    r = with_session(ws, ["--policy", "read-only"], body)
    assert not os.path.exists(host_path)
    assert r.is_error is True
    assert "probe-ran" in r.structured_content["stdout"]
    assert any(d["path"] == host_path for d in r.structured_content["denials"])
    text = text_of(r)
    assert f"refused by the sandbox: write {host_path}" in text
    assert "--policy workspace-write" in text or "--rw" in text


def test_a_timeout_stops_the_command(ws):
    async def body(s):
        return await s.call_tool("exec", {"command": ["sh", "-c", "echo started; exec sleep 120"], "timeout_ms": 300})

    r = with_session(ws, [], body)
    assert r.is_error is True
    assert r.structured_content["timed_out"] is True
    assert r.structured_content["error_code"] == "EXECUTION_TIMEOUT"
    assert "timeout" in text_of(r)


def test_a_shell_string_is_refused(ws):
    async def body(s):
        return await s.call_tool("exec", {"command": "touch string-marker"})

    r = with_session(ws, ["--policy", "workspace-write"], body)
    assert r.is_error is True
    assert '["bash", "-c"' in text_of(r)
    assert not os.path.exists(os.path.join(ws, "string-marker"))


def test_an_explicit_shell_argv_runs(ws):
    async def body(s):
        return await s.call_tool("exec", {"command": ["bash", "-c", "touch bash-marker && echo made"]})

    r = with_session(ws, ["--policy", "workspace-write"], body)
    assert r.is_error is False, text_of(r)
    assert os.path.exists(os.path.join(ws, "bash-marker"))


def test_cwd_outside_the_roots_and_wider_policy_are_refused(ws):
    with tempfile.TemporaryDirectory(prefix="moat-mcp-out-") as out:
        async def body(s):
            a = await s.call_tool("exec", {"command": ["sh", "-c", "touch marker"], "cwd": out})
            b = await s.call_tool("exec", {"command": ["sh", "-c", "touch marker"], "policy": "danger-full-access"})
            return a, b

        a, b = with_session(ws, ["--policy", "workspace-write"], body)
        assert a.is_error and a.structured_content["error_code"] == "POLICY_DENIED"
        assert "outside the server's roots" in text_of(a)
        assert not os.path.exists(os.path.join(out, "marker"))
        assert b.is_error and b.structured_content["error_code"] == "POLICY_DENIED"
        assert not os.path.exists(os.path.join(ws, "marker"))


def test_capabilities_and_explain_policy_contract(ws):
    async def body(s):
        return await s.call_tool("capabilities", {}), await s.call_tool("explain_policy", {"policy": "read-only"})

    caps, ex = with_session(ws, ["--policy", "workspace-write"], body)
    assert caps.is_error is False and caps.structured_content["platform"] == "linux"
    assert ex.is_error is False and ex.structured_content["policy"]["level"] == "read-only"
