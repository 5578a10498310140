"""Red-team cases for `moat serve` executions forked from a sandbox
template (issue 11 §5): what the host does to the view's inputs after the
template (or its pre-forked "warm" init) was built must not loosen the view
a later execution gets. A protected path's mount sits on a host dentry; a
host `rm` + re-create, or an atomic rename over it (editors, `git config`,
`passwd` all write that way), detaches that mount in every mount namespace
(the kernel refuses it only in the caller's own), while the plan — so the
template key — stays the same. The one-shot path lays the view after the
plan is computed, so it always covers the new file."""

import os
import tempfile

import pytest

from rpc import Server
from test_template import output, run, token


@pytest.fixture
def ws():
    # Not under /tmp: a workspace under /tmp is laid fresh per execution
    # anyway (it sits on the per-execution /tmp); under /var/tmp its
    # protected paths are mounts of the template's shared view.
    with tempfile.TemporaryDirectory(prefix="moat-tplrt-", dir="/var/tmp") as d:
        os.chmod(d, 0o755)
        yield os.path.realpath(d)


def test_a_hidden_file_recreated_on_the_host_after_the_template_was_built_stays_hidden(ws):
    t = token()
    with open(f"{ws}/.env", "w") as f:
        f.write(f"OLD{t}\n")
    s = Server(["--policy", "workspace-write"], cwd=ws)
    try:
        eid1, r1 = run(s, ["sh", "-c", "cat .env; echo FIRST-RAN"])
        assert "FIRST-RAN" in output(s, eid1), r1
        assert f"OLD{t}" not in output(s, eid1), r1
        # The host replaces the file: the stand-in the template (and its
        # warm init) laid on the old dentry is detached by the kernel.
        os.unlink(f"{ws}/.env")
        with open(f"{ws}/.env", "w") as f:
            f.write(f"NEW{t}\n")
        eid2, r2 = run(s, ["sh", "-c", "cat .env; echo SECOND-RAN"])
        out2 = output(s, eid2)
        assert "SECOND-RAN" in out2, r2
        assert f"NEW{t}" not in out2, (out2, r2)
        # A later execution (a template, not the warm init) too.
        os.rename(f"{ws}/.env", f"{ws}/.env.bak")
        with open(f"{ws}/.env.tmp", "w") as f:
            f.write(f"THIRD{t}\n")
        os.rename(f"{ws}/.env.tmp", f"{ws}/.env")
        eid3, r3 = run(s, ["sh", "-c", "cat .env; echo THIRD-RAN"])
        out3 = output(s, eid3)
        assert "THIRD-RAN" in out3, r3
        assert f"THIRD{t}" not in out3, (out3, r3)
        assert r2["launch"] == "template" and r3["launch"] == "template", (r2, r3)
    finally:
        s.close()


def test_git_config_rewritten_by_rename_on_the_host_stays_write_protected(ws):
    t = token()
    os.makedirs(f"{ws}/.git/hooks")
    with open(f"{ws}/.git/config", "w") as f:
        f.write("[core]\n")
    s = Server(["--policy", "workspace-write"], cwd=ws)
    try:
        eid1, r1 = run(s, ["sh", "-c", f"echo {t} >> .git/config; echo FIRST-RAN"])
        assert "FIRST-RAN" in output(s, eid1), r1
        # `git config` writes config.lock and renames it over config.
        with open(f"{ws}/.git/config.lock", "w") as f:
            f.write("[core]\n\tbare = false\n")
        os.replace(f"{ws}/.git/config.lock", f"{ws}/.git/config")
        eid2, r2 = run(s, ["sh", "-c",
                           f"echo '[core] hooksPath = /x{t}' >> .git/config; echo SECOND-RAN"])
        assert "SECOND-RAN" in output(s, eid2), r2
        with open(f"{ws}/.git/config") as f:
            config = f.read()
        assert t not in config, (config, r2)
        assert r2["launch"] == "template", r2
    finally:
        s.close()


def test_no_writable_directory_outside_the_workspace_carries_a_file_to_the_next_execution(ws):
    """Every directory an execution can write to, found from inside (not
    from a list), is re-made per execution; the workspace alone is shared."""
    t = token()
    s = Server(["--policy", "workspace-write"], cwd=ws)
    try:
        find = ("find / \\( -path /proc -o -path /sys -o -path \"$PWD\" \\) -prune -o "
                "-type d -writable -print 2>/dev/null")
        eid1, r1 = run(s, ["sh", "-c",
                           f"for d in $({find}); do echo {t} > \"$d/left{t}\" && echo \"WROTE $d\"; done; "
                           "echo FIRST-RAN"])
        out1 = output(s, eid1)
        assert "FIRST-RAN" in out1, r1
        wrote = [line[6:] for line in out1.splitlines() if line.startswith("WROTE ")]
        # /tmp, HOME and /dev/shm at least (the probe found what it should).
        assert "/tmp" in wrote and "/dev/shm" in wrote and len(wrote) >= 3, out1
        eid2, r2 = run(s, ["sh", "-c",
                           f"find / \\( -path /proc -o -path /sys -o -path \"$PWD\" \\) -prune -o "
                           f"-name left{t} -print 2>/dev/null; echo SECOND-RAN"])
        out2 = output(s, eid2)
        assert "SECOND-RAN" in out2, r2
        assert f"left{t}" not in out2, (out2, wrote)
        assert r2["launch"] == "template", r2
    finally:
        s.close()


def test_a_workspace_made_again_on_the_host_is_the_one_the_next_execution_writes_contract():
    """The template's bind of the old directory follows its dentry away;
    the next execution must get the directory the path names now (as the
    one-shot path does), not a read-only view of it."""
    t = token()
    with tempfile.TemporaryDirectory(prefix="moat-tplrt-", dir="/var/tmp") as base:
        os.chmod(base, 0o755)
        base = os.path.realpath(base)
        w = f"{base}/ws"
        os.mkdir(w)
        s = Server(["--policy", "workspace-write"], cwd=w)
        try:
            eid1, r1 = run(s, ["sh", "-c", "echo FIRST-RAN"])
            assert "FIRST-RAN" in output(s, eid1), r1
            os.rename(w, f"{base}/old")
            os.mkdir(w)
            eid2, r2 = run(s, ["sh", "-c", f"echo {t} > made{t} && echo SECOND-RAN"])
            assert "SECOND-RAN" in output(s, eid2), (output(s, eid2, "execution.stderr"), r2)
            assert os.path.exists(f"{w}/made{t}"), r2
            assert not os.path.exists(f"{base}/old/made{t}"), r2
        finally:
            s.close()


# add_key into the user keyring, then search it from the next execution:
# executions of a template share its user namespace, and the user keyring
# is per user namespace (a one-shot run has its own).
KEYRING = r'''
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
SYS_add_key, SYS_keyctl = 248, 250
KEY_SPEC_USER_KEYRING, KEYCTL_SEARCH = -4, 10
desc = sys.argv[2].encode()
if sys.argv[1] == "add":
    r = libc.syscall(SYS_add_key, b"user", desc, b"v", 1, KEY_SPEC_USER_KEYRING)
    print("ADDED" if r >= 0 else f"ADD-ERRNO {ctypes.get_errno()}")
else:
    r = libc.syscall(SYS_keyctl, KEYCTL_SEARCH, KEY_SPEC_USER_KEYRING, b"user", desc, 0)
    print("FOUND" if r >= 0 else f"SEARCH-ERRNO {ctypes.get_errno()}")
'''


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="syscall numbers are x86_64's")
def test_a_key_one_execution_adds_to_its_user_keyring_is_not_in_the_next(ws):
    t = token()
    s = Server(["--policy", "workspace-write"], cwd=ws)
    try:
        eid1, r1 = run(s, ["python3", "-c", KEYRING, "add", f"moat-rt-{t}"])
        out1 = output(s, eid1)
        assert "ADDED" in out1 or "ADD-ERRNO" in out1, (out1, r1)
        eid2, r2 = run(s, ["python3", "-c", KEYRING, "search", f"moat-rt-{t}"])
        out2 = output(s, eid2)
        assert "SEARCH-ERRNO" in out2, (out2, r2)
        assert "FOUND" not in out2, (out2, r2)
        assert r2["launch"] == "template", r2
    finally:
        s.close()


def test_sysv_ipc_objects_of_one_execution_are_not_in_the_next(ws):
    t = token()
    s = Server(["--policy", "workspace-write"], cwd=ws)
    try:
        key = f"0x{int(t):08x}"
        eid1, r1 = run(s, ["sh", "-c",
                           f"ipcmk -M 4096 -p 0600 >/dev/null; ipcmk -Q >/dev/null; "
                           f"python3 -c 'import ctypes; l=ctypes.CDLL(None); "
                           f"print(\"SHM\", l.shmget({int(t)}, 4096, 0o1600))'; ipcs -m; echo FIRST-RAN"])
        out1 = output(s, eid1)
        assert "FIRST-RAN" in out1 and key in out1, (out1, r1)
        eid2, r2 = run(s, ["sh", "-c", "ipcs -a; echo SECOND-RAN"])
        out2 = output(s, eid2)
        assert "SECOND-RAN" in out2, r2
        assert key not in out2, (out2, r2)
        assert r2["launch"] == "template", r2
    finally:
        s.close()


CONFINEMENT = r'''
grep -E "^(Cap|NoNewPrivs|Seccomp|Uid|Gid|Groups)" /proc/self/status
cat /proc/self/uid_map /proc/self/gid_map /proc/self/limits; hostname
awk '{print $5, $6, $9, $11}' /proc/self/mountinfo | sed "s|$PWD|WS|g" | sort
find / -maxdepth 3 \( -path /proc -o -path /sys \) -prune -o -writable -print 2>/dev/null \
  | sed "s|$PWD|WS|g" | sort
echo PROBE-RAN
'''


def test_a_template_execution_is_confined_exactly_as_a_one_shot_one(ws):
    """Capabilities, no_new_privs, seccomp, id maps, rlimits, hostname, the
    mount table and what is writable: the same for the same request. The
    only difference allowed is the nested-run socket a template execution
    does not offer (narrower)."""
    seen = {}
    for launch in ("template", "oneshot"):
        s = Server(["--policy", "workspace-write", "--launch", launch], cwd=ws)
        try:
            eid, r = run(s, ["sh", "-c", CONFINEMENT])
            out = output(s, eid)
            assert "PROBE-RAN" in out and r["launch"] == launch, (out, r)
            seen[launch] = [line for line in out.splitlines() if "broker.sock" not in line]
        finally:
            s.close()
    assert "NoNewPrivs:\t1" in seen["template"], seen["template"]
    assert "CapEff:\t0000000000000000" in seen["template"], seen["template"]
    assert seen["template"] == seen["oneshot"], [
        (x, "template" if x in seen["template"] else "oneshot")
        for x in set(seen["template"]) ^ set(seen["oneshot"])]
