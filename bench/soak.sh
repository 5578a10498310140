#!/usr/bin/env bash
# Soak: RUNS moat runs (default 1,000) cycling through plain runs, runs with
# every resource limit, a fork bomb under --pids, output past --output-limit,
# memory past --memory and a --timeout kill; then checks that nothing is left:
# the runs' cgroups, mounts in moat's own mount namespace, temporary
# directories, open descriptors and processes. Exit 1 if anything is left.
# Run it as root (cgroup v1 mechanism) and as an unprivileged user (rlimits).
# Env: RUNS (default 1000), MOAT (default target/debug/moat, built if missing).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUNS="${RUNS:-1000}"
MOAT="${MOAT:-$ROOT/target/debug/moat}"
if [ ! -x "$MOAT" ]; then
    (cd "$ROOT" && cargo build --bins >&2)
fi
MARK="moat-soak-$$-$RANDOM"
WS="$(mktemp -d "/var/tmp/$MARK-XXXXXX")"
trap 'rm -rf "$WS"' EXIT
cd "$WS"
# moat's own temporary files go to TMPDIR: a private one, which must end
# empty. New entries in the shared /tmp and /var/tmp are listed too, but only
# as information (other users of the host create theirs meanwhile).
export TMPDIR="$WS/tmpdir"
mkdir "$TMPDIR"

cgroups() { { find /sys/fs/cgroup -maxdepth 6 -type d -name 'moat-*' 2>/dev/null || true; } | sort; }
temps() { { ls -1d /tmp/* /var/tmp/* /dev/shm/* 2>/dev/null || true; } | { grep -v "$MARK" || true; } | sort; }
mounts() { wc -l < /proc/self/mountinfo; }
# Open file handles across the host (first field of file-nr): other users of
# the host move it too, so only a growth of half a handle per run counts.
fds() { cut -f1 /proc/sys/fs/file-nr; }

cg0="$(cgroups)"; tmp0="$(temps)"; mnt0="$(mounts)"; fd0="$(fds)"
echo "soak: $RUNS runs of $MOAT as uid $(id -u), kernel $(uname -r)"
start=$(date +%s)
fail=0
for i in $(seq 1 "$RUNS"); do
    case $((i % 8)) in
        0) args=(--policy read-only -- true) ;;
        1) args=(--policy workspace-write --memory 256M --pids 128 --cpu-time 10s --file-size 16M
                 --open-files 256 --tmp-size 16M --output-limit 1M -- sh -c "echo $MARK > /tmp/x") ;;
        2) args=(--policy workspace-write --pids 32 --timeout 20s --
                 bash -c "f() { [ \$1 -lt 8 ] && { f \$((\$1+1)) & f \$((\$1+1)) & }; sleep 15; }; f 0; wait # $MARK") ;;
        3) args=(--policy read-only --output-limit 8K -- yes "$MARK") ;;
        4) args=(--policy workspace-contained --memory 64M --timeout 20s --
                 python3 -c "s = b'x' * (256 << 20) # $MARK") ;;
        5) args=(--policy read-only --timeout 200ms -- sleep 5) ;;
        6) args=(--policy danger-full-access --output-limit 4K --pids 64 --limits best-effort -- sh -c "yes $MARK") ;;
        7) args=(--policy workspace-write --network proxy -- true) ;;
    esac
    rc=0
    "$MOAT" exec --no-audit --quiet "${args[@]}" >/dev/null 2>"$WS/err" </dev/null || rc=$?
    if [ "$rc" = 125 ]; then
        echo "run $i (${args[*]:0:3}) refused: $(head -c 300 "$WS/err")" >&2
        fail=1
    fi
done
echo "runs done in $(( $(date +%s) - start ))s"

# What is left, checked twice a second apart (the last run's cleanup is
# synchronous, so nothing should need the second look).
left=""
for attempt in 1 2; do
    left=""
    cg1="$(cgroups)"; new_cg="$(comm -13 <(echo "$cg0") <(echo "$cg1") | grep -v '^$' || true)"
    [ -n "$new_cg" ] && left+="cgroups left: $new_cg"$'\n'
    [ -n "$(ls -A "$TMPDIR")" ] && left+="left in TMPDIR: $(ls -A "$TMPDIR")"$'\n'
    mnt1="$(mounts)"; [ "$mnt1" != "$mnt0" ] && left+="mounts: $mnt0 before, $mnt1 after"$'\n'
    fd1="$(fds)"; [ $((fd1 - fd0)) -gt $((RUNS / 2)) ] && left+="open file handles on the host: $fd0 before, $fd1 after"$'\n'
    procs="$(pgrep -f "$MARK" | grep -v "^$$\$" || true)"
    [ -n "$procs" ] && left+="processes left: $(ps -o pid,args -p $(echo $procs | tr ' ' ,) 2>/dev/null)"$'\n'
    [ -z "$left" ] && break
    sleep 1
done
if [ -n "$left" ]; then
    printf 'LEFT BEHIND after %s runs:\n%s' "$RUNS" "$left"
    exit 1
fi
tmp1="$(temps)"; new_tmp="$(comm -13 <(echo "$tmp0") <(echo "$tmp1") | grep -v '^$' || true)"
[ -n "$new_tmp" ] && printf 'for information, new in the shared /tmp, /var/tmp, /dev/shm (any user of the host):\n%s\n' "$new_tmp"
echo "open file handles on the host: $fd0 before, $(fds) after"
echo "nothing left behind after $RUNS runs (cgroups, mounts, TMPDIR, open file handles, processes)"
exit "$fail"
