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


WRAPPED_SERVER = '''
import sys
from mcp.server import MCPServer

server = MCPServer("wrapped")


@server.tool()
def hello() -> str:
    return "hello from the wrapped server"


@server.tool()
def write(path: str) -> str:
    try:
        with open(path, "w") as f:
            f.write("written\\n")
        return "wrote " + path
    except OSError as e:
        return "refused: " + str(e)


server.run()
'''


def test_wrap_runs_another_mcp_server_under_the_policy(ws):
    import sys

    server = os.path.join(ws, "server.py")
    with open(server, "w") as f:
        f.write(WRAPPED_SERVER)
    host_path = f"/var/tmp/moat-wrap-{random.randint(10**8, 10**9 - 1)}"
    inside = os.path.join(ws, "inside.txt")

    async def go():
        params = StdioServerParameters(
            command=MOAT,
            # The interpreter's venv is shown read-only (it may live under /tmp,
            # which is the sandbox's own).
            args=["mcp", "--no-audit", "--policy", "workspace-write", "--ro", sys.prefix, "--wrap", "--", sys.executable, server],
            cwd=ws,
        )
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
                tools = {t.name for t in (await s.list_tools()).tools}
                hi = await s.call_tool("hello", {})
                out = await s.call_tool("write", {"path": host_path})
                ok = await s.call_tool("write", {"path": inside})
                return tools, text_of(hi), text_of(out), text_of(ok)

    tools, hi, out, ok = asyncio.run(asyncio.wait_for(go(), 60))
    assert tools == {"hello", "write"}
    assert hi == "hello from the wrapped server"
    assert out.startswith("refused:"), out
    assert not os.path.exists(host_path), "the wrapped server wrote outside the workspace"
    assert ok == "wrote " + inside and os.path.exists(inside)
