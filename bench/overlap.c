/* Measures whether building the sandbox's namespaces in a child can overlap
 * moat's host-side work before the launch (the probe and the plan), on this
 * machine, before that restructuring is built (ARCHITECTURE.md, "Launch
 * performance", the third pass). Run by bench/overlap.sh; one mode a process:
 *
 *   serial   host work (~0.75 ms of directory listings and lstats, like the
 *            probe), then clone(all of moat's namespace flags) as moat does
 *            today; the child writes its id maps and reports ready.
 *   early    clone(CLONE_NEWUSER|CLONE_NEWPID) first (cheap); the child
 *            unshares the mount, ipc, uts, cgroup and network namespaces
 *            (the expensive part, done in the child's own time) and writes
 *            its id maps while the parent does the host work.
 *   migrated as early, and the parent moves the child to another cpu right
 *            after the clone (a new child is queued on its parent's cpu and
 *            otherwise runs only once the parent blocks: no overlap at all).
 *
 * Prints the microseconds from the start to the child's ready report (the
 * point where moat's init would take the plan), then reaps the child. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long long micros(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000LL + t.tv_nsec / 1000;
}

static void put(const char *path, const char *s) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, s, strlen(s)) != (ssize_t)strlen(s)) {
        perror(path);
        _exit(1);
    }
    close(fd);
}

static void id_maps(unsigned uid, unsigned gid) {
    char b[64];
    put("/proc/self/setgroups", "deny");
    snprintf(b, sizeof b, "0 %u 1", uid);
    put("/proc/self/uid_map", b);
    snprintf(b, sizeof b, "0 %u 1", gid);
    put("/proc/self/gid_map", b);
}

/* Probe-like host work: list /usr/bin and lstat its first 60 names, twice. */
static void host_work(void) {
    for (int i = 0; i < 2; i++) {
        DIR *d = opendir("/usr/bin");
        if (!d) { perror("/usr/bin"); exit(1); }
        struct dirent *e;
        struct stat st;
        for (int k = 0; k < 60 && (e = readdir(d)); k++)
            fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW);
        closedir(d);
    }
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: overlap serial|early|migrated\n"); return 2; }
    const char *mode = argv[1];
    long long start = micros();
    unsigned uid = getuid(), gid = getgid();
    unsigned long rest = CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP | CLONE_NEWNET;
    int ready[2];
    if (pipe2(ready, O_CLOEXEC)) { perror("pipe"); return 1; }
    int serial = !strcmp(mode, "serial");
    if (serial)
        host_work();
    int cpu = sched_getcpu();
    long pid = syscall(SYS_clone, (serial ? CLONE_NEWUSER | CLONE_NEWPID | rest : CLONE_NEWUSER | CLONE_NEWPID) | SIGCHLD, 0, 0, 0, 0);
    if (pid < 0) { perror("clone"); return 1; }
    if (pid == 0) {
        if (!serial && unshare(rest)) { perror("unshare"); _exit(1); }
        id_maps(uid, gid);
        if (write(ready[1], "r", 1) != 1) _exit(1);
        _exit(0);
    }
    if (!strcmp(mode, "migrated")) {
        cpu_set_t mine, other;
        CPU_ZERO(&other);
        if (sched_getaffinity(0, sizeof mine, &mine) == 0)
            for (int c = 0; c < CPU_SETSIZE; c++)
                if (c != cpu && CPU_ISSET(c, &mine)) { CPU_SET(c, &other); break; }
        if (CPU_COUNT(&other)) sched_setaffinity(pid, sizeof other, &other);
    }
    if (!serial)
        host_work();
    char c;
    int status;
    if (read(ready[0], &c, 1) != 1) { fprintf(stderr, "the child failed\n"); return 1; }
    long long took = micros() - start;
    if (waitpid(pid, &status, 0) != pid || status != 0) {
        fprintf(stderr, "the child failed\n");
        return 1;
    }
    printf("%lld\n", took);
    return 0;
}
