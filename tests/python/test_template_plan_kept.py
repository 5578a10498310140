"""`moat serve` reuses the last plan (and its template key's serialized
view) for an equal policy and equal host facts (issue 11 §5): a tool
config rewritten on the host between two template executions changes the
facts, so the next execution is planned afresh and sees the new redacted
copy, never the kept one, and never the credential. Fails with the
plan's or the key's comparison removed (the kept plan, or the kept key,
would serve the first copy again)."""

import os
import random
import tempfile

import pytest

from rpc import Server
from test_template import output, run


@pytest.fixture
def dirs():
    with tempfile.TemporaryDirectory(prefix="moat-tplk-") as d:
        ws, home = os.path.join(d, "ws"), os.path.join(d, "home")
        os.makedirs(ws)
        os.makedirs(home)
        yield os.path.realpath(ws), os.path.realpath(home)


def token():
    return str(random.randint(10**8, 10**9 - 1))


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def test_template_kept_plan_a_rewritten_tool_config_is_seen_redacted_by_the_next_execution(dirs):
    ws, home = dirs
    one, two = token(), token()
    npmrc = os.path.join(home, ".npmrc")
    write(npmrc, f"registry=https://one{one}.example/\n//one{one}.example/:_authToken=first{one}\n")
    s = Server(["--policy", "workspace-contained"], cwd=ws, env=dict(os.environ, HOME=home))
    try:
        read = ["sh", "-c", 'cat "$HOME/.npmrc"; echo READ-RAN']
        # Two executions of one plan: the second runs on the kept plan.
        for _ in range(2):
            eid, r = run(s, read)
            o = output(s, eid)
            assert r["launch"] == "template" and "READ-RAN" in o, (r, output(s, eid, "execution.stderr"))
            assert f"one{one}.example" in o, f"the redacted copy is missing:\n{o}"
            assert f"first{one}" not in o, f"the credential is visible:\n{o}"
        # The host's config changes (another size, another registry).
        write(npmrc, f"registry=https://two{two}.example/\n//two{two}.example/:_authToken=second{two}\n"
                     "fund=false\n")
        eid, r = run(s, read)
        o = output(s, eid)
        assert r["launch"] == "template" and "READ-RAN" in o, (r, output(s, eid, "execution.stderr"))
        assert f"two{two}.example" in o, f"the next execution sees the old copy:\n{o}"
        assert f"one{one}.example" not in o, f"the next execution sees the old copy:\n{o}"
        assert f"second{two}" not in o, f"the new credential is visible:\n{o}"
    finally:
        s.close()
