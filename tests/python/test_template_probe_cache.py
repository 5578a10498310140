"""`moat serve` keeps the secrets probe's answer between template
executions while every directory it read is unchanged (issue 11 §5): a
secret created after an execution whose answer was kept, anywhere the probe
looks (a new file in HOME, in a directory of HOME the protected list names
a path beneath, two levels down), is still hidden from the next one."""

import os
import random
import tempfile
import time

import pytest

from rpc import Server
from test_template import output, run


@pytest.fixture
def ws():
    with tempfile.TemporaryDirectory(prefix="moat-tplc-") as d:
        yield os.path.realpath(d)


def token():
    return str(random.randint(10**8, 10**9 - 1))


def kept_answer_then(ws, make, read):
    """Two executions in HOME = `ws` (the second reuses the first's probe
    answer), then `make()` on the host, then `read` in a third; its output."""
    # The directories must be older than the cache's stability window
    # (directory times come from a coarse clock): otherwise nothing is
    # kept and the test would not exercise the kept answer.
    time.sleep(0.5)
    s = Server(["--policy", "workspace-write"], cwd=ws, env=dict(os.environ, HOME=ws))
    try:
        # The service makes its own directories in HOME as it starts (so
        # HOME's times are new): an answer is kept only once they are older
        # than the window. Without this wait no answer was ever kept
        # before `make()` and every test here passed without the cache.
        eid, r = run(s, ["sh", "-c", "echo WARM"])
        assert "WARM" in output(s, eid), r
        time.sleep(0.5)
        for _ in range(2):
            eid, r = run(s, ["sh", "-c", "echo BEFORE"])
            assert r["launch"] == "template" and "BEFORE" in output(s, eid), r
        make()
        eid, r = run(s, ["sh", "-c", read + "; echo READ-RAN"])
        o = output(s, eid)
        assert r["launch"] == "template", r
        assert "READ-RAN" in o, (r, output(s, eid, "execution.stderr"))
        return o
    finally:
        s.close()


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def test_template_cached_probe_new_credentials_in_an_existing_dir_are_hidden(ws):
    t = token()
    os.makedirs(os.path.join(ws, ".cargo"))
    o = kept_answer_then(
        ws,
        lambda: write(os.path.join(ws, ".cargo", "credentials.toml"), f"token = \"cargo{t}\"\n"),
        "cat .cargo/credentials.toml")
    assert f"cargo{t}" not in o, f"credentials created after a kept probe are visible:\n{o}"


def test_template_cached_probe_new_credentials_two_levels_down_are_hidden(ws):
    t = token()
    os.makedirs(os.path.join(ws, ".config", "git"))
    o = kept_answer_then(
        ws,
        lambda: write(os.path.join(ws, ".config", "git", "credentials"), f"https://u:git{t}@host\n"),
        "cat .config/git/credentials")
    assert f"git{t}" not in o, f"credentials created after a kept probe are visible:\n{o}"


def test_template_cached_probe_new_netrc_in_home_is_hidden(ws):
    t = token()
    o = kept_answer_then(
        ws,
        lambda: write(os.path.join(ws, ".netrc"), f"machine h login u password netrc{t}\n"),
        "cat .netrc")
    assert f"netrc{t}" not in o, f"a .netrc created after a kept probe is visible:\n{o}"


def test_template_cached_probe_home_through_a_symlink_new_secret_is_hidden(ws):
    # HOME names the workspace through a symlink: the symlink's own times
    # do not change when a file is created in its target.
    t = token()
    link = ws + "-home"
    os.symlink(ws, link)
    try:
        time.sleep(0.5)
        s = Server(["--policy", "workspace-write"], cwd=ws, env=dict(os.environ, HOME=link))
        try:
            for _ in range(2):
                eid, r = run(s, ["sh", "-c", "echo BEFORE"])
                assert r["launch"] == "template" and "BEFORE" in output(s, eid), r
            write(os.path.join(ws, ".netrc"), f"machine h login u password netrc{t}\n")
            eid, r = run(s, ["sh", "-c", "cat .netrc; echo READ-RAN"])
            o = output(s, eid)
            assert "READ-RAN" in o, (r, output(s, eid, "execution.stderr"))
            assert f"netrc{t}" not in o, f"a .netrc created after a kept probe is visible:\n{o}"
        finally:
            s.close()
    finally:
        os.unlink(link)
