"""Red-team of recent service changes: the open-file limit a `moat serve`
execution's command starts with is the one the user started serve with
(serve raises its own), on both launch paths, with the rest of the
command's process state as a one-shot `moat exec` gives it; and the kept
secrets-probe answer is not reused after a secret appears without an
entry being added to a signed directory (a mount over a directory of HOME,
an unmount uncovering one, a directory made searchable)."""

import os
import resource
import subprocess
import tempfile
import time

import pytest

from rpc import MOAT, Server
from test_template import output, run
from test_template_probe_cache import kept_answer_then, token, write

PROBE = ("echo SOFT=$(ulimit -Sn) HARD=$(ulimit -Hn); "
         "grep -E 'Sig(Blk|Ign)|NoNewPrivs|Cap(Eff|Bnd)|Seccomp:' /proc/self/status; "
         "umask; ls /proc/self/fd | tr '\\n' ' '; echo; echo LIM-RAN")


@pytest.fixture
def ws():
    with tempfile.TemporaryDirectory(prefix="moat-r2-") as d:
        yield os.path.realpath(d)


def lowered_soft():
    """A soft open-file limit below the hard one (so serve raises its own)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 64:
        pytest.skip("hard open-file limit below 64")
    return 37 + (soft % 7)


def test_serve_commands_get_the_starting_open_file_limit_on_both_paths_contract(ws):
    want = lowered_soft()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)

    def pre():
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))

    direct = subprocess.run([MOAT, "exec", "--no-audit", "--policy", "workspace-write", "--",
                             "sh", "-c", PROBE], cwd=ws, preexec_fn=pre,
                            capture_output=True, text=True, timeout=60)
    assert "LIM-RAN" in direct.stdout, direct
    assert f"SOFT={want} HARD={'unlimited' if hard == resource.RLIM_INFINITY else hard}" \
        in direct.stdout, direct.stdout
    for launch in ("template", "oneshot"):
        s = Server(["--policy", "workspace-write", "--launch", launch], cwd=ws, preexec=pre)
        try:
            for _ in range(2):
                eid, r = run(s, ["sh", "-c", PROBE])
                assert r["launch"] == launch, r
                # The same limits, signal dispositions, capabilities,
                # filter, umask and descriptors as the one-shot command.
                assert output(s, eid) == direct.stdout, (launch, output(s, eid), direct.stdout)
        finally:
            s.close()


def need_root():
    if os.geteuid() != 0:
        pytest.skip("mounting on the host needs root (these cases are root-only)")


def umount(path):
    subprocess.run(["umount", "-l", path], check=False)


def test_cached_probe_tmpfs_mounted_over_a_signed_dir_is_seen(ws):
    # A mount changes no directory's mtime: the mount point's own
    # signature (now the new root's device and inode) must.
    need_root()
    t = token()
    cargo = os.path.join(ws, ".cargo")
    os.makedirs(cargo)

    def make():
        subprocess.run(["mount", "-t", "tmpfs", "r2", cargo], check=True)
        write(os.path.join(cargo, "credentials.toml"), f"token = \"mnt{t}\"\n")
    try:
        o = kept_answer_then(ws, make, "cat .cargo/credentials.toml")
    finally:
        umount(cargo)
    assert f"mnt{t}" not in o, f"credentials mounted in after a kept probe are visible:\n{o}"


def test_cached_probe_bind_mount_over_config_is_seen(ws):
    need_root()
    t = token()
    os.makedirs(os.path.join(ws, ".config"))
    with tempfile.TemporaryDirectory(prefix="moat-r2-src-") as src:
        os.makedirs(os.path.join(src, "gh"))
        write(os.path.join(src, "gh", "hosts.yml"), f"oauth_token: bind{t}\n")
        target = os.path.join(ws, ".config")
        try:
            o = kept_answer_then(
                ws, lambda: subprocess.run(["mount", "--bind", src, target], check=True),
                "cat .config/gh/hosts.yml")
        finally:
            umount(target)
    assert f"bind{t}" not in o, f"credentials bound in after a kept probe are visible:\n{o}"


def test_cached_probe_unmount_uncovering_credentials_is_seen(ws):
    need_root()
    t = token()
    cargo = os.path.join(ws, ".cargo")
    os.makedirs(cargo)
    write(os.path.join(cargo, "credentials.toml"), f"token = \"under{t}\"\n")
    subprocess.run(["mount", "-t", "tmpfs", "r2", cargo], check=True)
    try:
        o = kept_answer_then(ws, lambda: umount(cargo), "cat .cargo/credentials.toml")
    finally:
        umount(cargo)
    assert f"under{t}" not in o, f"credentials uncovered after a kept probe are visible:\n{o}"


def test_cached_probe_dir_made_searchable_is_seen(ws):
    # Unprivileged, the probe cannot look into a mode-000 directory of a
    # HOME outside the workspace (one inside is refused outright: moat
    # must list the workspace); a chmod changes its ctime only.
    if os.geteuid() == 0:
        pytest.skip("unprivileged case: root's probe is not blocked by mode 000")
    t = token()
    home = os.path.realpath(tempfile.mkdtemp(prefix="moat-r2-home-", dir="/var/tmp"))
    cargo = os.path.join(home, ".cargo")
    os.makedirs(cargo)
    secret = os.path.join(cargo, "credentials.toml")
    write(secret, f"token = \"chmod{t}\"\n")
    os.chmod(cargo, 0)
    s = Server(["--policy", "workspace-write"], cwd=ws, env=dict(os.environ, HOME=home))
    try:
        # As kept_answer_then: the service's own new directories in HOME
        # must be older than the cache's stability window first.
        eid, r = run(s, ["sh", "-c", "echo WARM"])
        assert "WARM" in output(s, eid), r
        time.sleep(0.5)
        for _ in range(2):
            eid, r = run(s, ["sh", "-c", f"cat {secret}; echo BEFORE"])
            assert r["launch"] == "template" and "BEFORE" in output(s, eid), r
        os.chmod(cargo, 0o755)
        eid, r = run(s, ["sh", "-c", f"cat {secret}; echo READ-RAN"])
        o = output(s, eid)
        assert r["launch"] == "template" and "READ-RAN" in o, r
    finally:
        s.close()
        os.chmod(cargo, 0o755)
        subprocess.run(["rm", "-rf", home], check=False)
    assert f"chmod{t}" not in o, f"credentials made readable after a kept probe are visible:\n{o}"
