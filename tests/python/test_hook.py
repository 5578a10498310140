"""`moat hook claude-code` fed the PreToolUse JSON Claude Code sends: the
Bash command is rewritten to run confined, in the same directory, and the
call is denied when moat cannot confine it."""

import json
import os
import random
import subprocess
import tempfile

import pytest

from rpc import MOAT


@pytest.fixture
def ws():
    with tempfile.TemporaryDirectory(prefix="moat-hook-") as d:
        yield os.path.realpath(d)


@pytest.fixture
def home():
    with tempfile.TemporaryDirectory(prefix="moat-hook-home-") as d:
        yield os.path.realpath(d)


def env_for(home):
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": home,
        "LANG": "C.UTF-8",
    }


def hook_input(ws, command, tool="Bash"):
    # The shape Claude Code sends a PreToolUse command hook on stdin.
    return {
        "session_id": "0b3c4d5e-aaaa-bbbb-cccc-000000000000",
        "transcript_path": os.path.join(ws, "transcript.jsonl"),
        "cwd": ws,
        "permission_mode": "default",
        "hook_event_name": "PreToolUse",
        "tool_name": tool,
        "tool_input": {"command": command, "description": "run it", "timeout": 120000},
        "tool_use_id": "toolu_01ABC",
    }


def run_hook(ws, home, payload):
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return subprocess.run([MOAT, "hook", "claude-code"], input=data, cwd=ws, env=env_for(home), capture_output=True, timeout=60)


def test_bash_call_is_rewritten_to_run_confined_in_the_same_directory(ws, home):
    host_path = f"/var/tmp/moat-hook-{random.randint(10**8, 10**9 - 1)}"
    command = f"echo probe-ran; pwd; echo \"it's\" > made.txt; echo x > {host_path}"
    r = run_hook(ws, home, hook_input(ws, command))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)["hookSpecificOutput"]
    assert out["hookEventName"] == "PreToolUse"
    assert out["permissionDecision"] == "allow"
    updated = out["updatedInput"]
    assert updated["description"] == "run it" and updated["timeout"] == 120000
    assert updated["command"] != command
    # What Claude Code's Bash tool then runs, from the agent's directory.
    ran = subprocess.run(["bash", "-c", updated["command"]], cwd=ws, env=env_for(home), capture_output=True, timeout=60)
    lines = ran.stdout.decode().splitlines()
    assert lines[:2] == ["probe-ran", ws], ran
    assert open(os.path.join(ws, "made.txt")).read() == "it's\n"
    assert not os.path.exists(host_path), "the rewritten command wrote outside the workspace"
    assert ran.returncode != 0


def test_ask_leaves_the_approval_to_claude_code_contract(ws, home):
    r = subprocess.run([MOAT, "hook", "claude-code", "--ask"], input=json.dumps(hook_input(ws, "true")).encode(), cwd=ws, env=env_for(home), capture_output=True, timeout=60)
    assert json.loads(r.stdout)["hookSpecificOutput"]["permissionDecision"] == "ask"


def test_fails_closed_when_moat_cannot_confine(ws, home):
    os.makedirs(os.path.join(home, ".config", "moat"))
    with open(os.path.join(home, ".config", "moat", "config.toml"), "w") as f:
        f.write("this is [not toml\n")
    r = run_hook(ws, home, hook_input(ws, "touch bare-marker"))
    assert r.returncode == 0
    out = json.loads(r.stdout)["hookSpecificOutput"]
    assert out["permissionDecision"] == "deny"
    assert "updatedInput" not in out
    assert "config.toml" in out["permissionDecisionReason"]
    assert not os.path.exists(os.path.join(ws, "bare-marker"))


def test_malformed_input_is_denied(ws, home):
    r = run_hook(ws, home, b"{not json")
    out = json.loads(r.stdout)["hookSpecificOutput"]
    assert out["permissionDecision"] == "deny"


def test_other_tools_get_no_opinion_contract(ws, home):
    r = run_hook(ws, home, hook_input(ws, "x", tool="Read"))
    assert r.returncode == 0 and r.stdout == b""


def test_the_trusted_project_file_applies_and_an_untrusted_one_denies(ws, home):
    with open(os.path.join(ws, ".moat.toml"), "w") as f:
        f.write('env = { PROJECT_MARK = "from-project" }\n')
    call = hook_input(ws, "echo probe-ran; echo mark=$PROJECT_MARK; touch bare-marker")
    # Untrusted: moat would have to ask, and cannot here: the call is denied.
    r = run_hook(ws, home, call)
    out = json.loads(r.stdout)["hookSpecificOutput"]
    assert out["permissionDecision"] == "deny" and "moat trust" in out["permissionDecisionReason"]
    assert not os.path.exists(os.path.join(ws, "bare-marker"))
    # Trusted: the rewritten command runs with the project's grant.
    t = subprocess.run([MOAT, "trust", ws], input=b"y\n", env=env_for(home), capture_output=True, timeout=60)
    assert t.returncode == 0, t.stderr
    out = json.loads(run_hook(ws, home, call).stdout)["hookSpecificOutput"]
    ran = subprocess.run(["bash", "-c", out["updatedInput"]["command"]], cwd=ws, env=env_for(home), capture_output=True, timeout=60)
    assert ran.stdout.decode().splitlines()[:2] == ["probe-ran", "mark=from-project"], ran
