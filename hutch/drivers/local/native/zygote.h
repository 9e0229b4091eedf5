/*
 * The zygote: pid 1 of a sandbox forks its commands (included by hutch-nsexec.c).
 *
 * An exec through hutch-nsexec costs the helper's own exec, pidfd_open + setns into five
 * namespaces, the seccomp load and a fork (3-4 ms of every execute). pid 1 has all of that
 * already: it is in every namespace of the sandbox, the sandbox user, without
 * capabilities, under the seccomp filter and its rlimits. So it forks the command itself,
 * and the fork inherits exactly what the command would have got from the helper.
 *
 * Why pid 1 and not a process of its own: no process, no memory per idle sandbox; it dies
 * with the sandbox because it is the sandbox; and the kernel shields a pid namespace's
 * init from its own processes' signals (SIGKILL and SIGSTOP included: it installs no
 * handler), while being non-dumpable it cannot be ptraced nor its fds read (/proc/1/fd,
 * pidfd_getfd) by the sandbox user, who has no CAP_SYS_PTRACE anywhere.
 *
 * The channel: a SOCK_SEQPACKET socket the server made, bound to <sandbox dir>/zygote.sock
 * on the host (a directory only root can enter, outside every sandbox's root: no sandbox
 * can look it up), listened on by pid 1 (--zygote-fd). Per command the server connects and
 * sends one byte with, by SCM_RIGHTS: a memfd holding the request, the command's stdin,
 * stdout, stderr, the status fd, and the cgroup files of its leaf, opened by the server.
 * Writing "0" into those joins the leaf: cgroup.procs and tasks check the credentials of
 * whoever opened the file, not of the writer, so the unprivileged child can join the leaf
 * root picked for it and no other. pid 1 only accepts and forks; the child receives,
 * sets up and execs, and pid 1 reports the wait status when it reaps it. Messages:
 *   child -> server "p"           set up, about to exec (the kernel attaches its pid)
 *   pid 1 -> server "n"           could not fork: nothing started
 *   pid 1 -> server "x" + status  the command's wait status (int), after reaping it
 * A connection closed without "x" means pid 1 is gone: the sandbox died.
 */

#include <poll.h>
#include <sys/signalfd.h>

struct zchild { pid_t pid; int conn; };
static struct zchild *zkids;
static size_t n_zkids, cap_zkids;
static struct rlimit zygote_nofile;  /* pid 1's own, restored in each command */
static int zygote_oom_adj;          /* pid 1's oom_score_adj: commands get 0 */

/* The request memfd: "<argc> <envc>\n" then NUL-terminated cwd, argv..., env... */
static char **zygote_request(int fd, const char **cwd, char ***envp)
{
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap + 1);
    if (!buf) fail("setup", "out of memory");
    for (;;) {
        if (len == cap) {
            if (cap >= ((size_t)128 << 20)) fail("setup", "request over 128 MiB");
            cap *= 2;
            char *more = realloc(buf, cap + 1);
            if (!more) fail("setup", "out of memory");
            buf = more;
        }
        ssize_t r = pread(fd, buf + len, cap - len, (off_t)len);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) fail("setup", "read the request: %s", strerror(errno));
        if (r == 0) break;
        len += (size_t)r;
    }
    close(fd);
    buf[len] = '\0';
    unsigned long argc, envc;
    char *p = memchr(buf, '\n', len);
    if (!p || sscanf(buf, "%lu %lu", &argc, &envc) != 2 || argc == 0 || argc > len || envc > len)
        fail("setup", "bad request header");
    p++;
    char **argv = calloc(argc + 1, sizeof *argv);
    char **env = calloc(envc + 1, sizeof *env);
    if (!argv || !env) fail("setup", "out of memory");
    char *end = buf + len;
    for (unsigned long i = 0; i < 1 + argc + envc; i++) {
        char *nul = p < end ? memchr(p, '\0', (size_t)(end - p)) : NULL;
        if (!nul) fail("setup", "short request");
        if (i == 0) *cwd = p;
        else if (i <= argc) argv[i - 1] = p;
        else env[i - 1 - argc] = p;
        p = nul + 1;
    }
    *envp = env;
    return argv;
}

/* In the forked child of pid 1: receive the request on ``conn``, become the command. */
static void zygote_child(int conn)
{
    enum { FIXED = 5 };  /* request, stdin, stdout, stderr, status */
    int fds[FIXED + MAX_LIST];
    char tag;
    struct iovec iov = {.iov_base = &tag, .iov_len = 1};
    union { char buf[CMSG_SPACE(sizeof fds)]; struct cmsghdr align; } u;
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
    ssize_t got;
    do got = recvmsg(conn, &msg, MSG_CMSG_CLOEXEC); while (got < 0 && errno == EINTR);
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    if (got != 1 || tag != 'r' || (msg.msg_flags & MSG_CTRUNC) || !c || c->cmsg_level != SOL_SOCKET ||
        c->cmsg_type != SCM_RIGHTS)
        _exit(125);
    int n = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
    if (n < FIXED) _exit(125);
    memcpy(fds, CMSG_DATA(c), (size_t)n * sizeof(int));
    status_fd = fds[4];
    const char *cwd = "/";
    char **env;
    char **argv = zygote_request(fds[0], &cwd, &env);
    for (int i = FIXED; i < n; i++) {
        if (write(fds[i], "0", 1) < 0) fail("setup", "join the execution's cgroup: %s", strerror(errno));
        close(fds[i]);
    }
    setsid();
    for (int i = 0; i < 3; i++)
        TRY(dup2(fds[1 + i], i), "dup2: %s", strerror(errno));
    for (int i = 1; i < 4; i++)
        if (fds[i] > 2) close(fds[i]);
    setrlimit(RLIMIT_NOFILE, &zygote_nofile);
    umask(022);
    if (chdir(cwd) < 0) fail("cwd", "%s: %s", cwd, strerror(errno));
    /* The server reads our pid off this message (SO_PASSCRED: the kernel's, translated). */
    if (send(conn, "p", 1, MSG_NOSIGNAL) < 0) _exit(125);
    close(conn);
    syscall(SYS_close_range, 3, ~0U, CLOSE_RANGE_CLOEXEC);
    if (zygote_oom_adj != 0) {
        /* Raising our own score needs no privilege, but a non-dumpable process's /proc files
         * are root's. Made dumpable for this one write, when we hold nothing the command will
         * not hold (exec would make it dumpable anyway). The floor stays 0 (see mode_launch). */
        prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
        int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
        if (fd < 0 || write(fd, "0", 1) < 0) fail("setup", "oom_score_adj: %s", strerror(errno));
        close(fd);
    }
    environ = env;
    for (int sig = 1; sig < NSIG; sig++)
        if (sig != SIGKILL && sig != SIGSTOP) signal(sig, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    execvp(argv[0], argv);
    int err = errno;
    dprintf(2, "%s: %s\n", argv[0], err == ENOENT ? "command not found" : strerror(err));
    _exit(err == ENOENT ? 127 : 126);
}

/* Nothing started: the server runs the helper instead (which forks outside the sandbox). */
static void zygote_refuse(int conn)
{
    if (send(conn, "n", 1, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {}
    close(conn);
}

static void zygote_accept(int lfd, int sfd)
{
    int conn = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (conn < 0) return;
    if (n_zkids == cap_zkids) {
        size_t cap = cap_zkids ? cap_zkids * 2 : 16;
        struct zchild *more = realloc(zkids, cap * sizeof *more);
        if (!more) { zygote_refuse(conn); return; }
        zkids = more;
        cap_zkids = cap;
    }
    pid_t child = fork();
    if (child < 0) { zygote_refuse(conn); return; }  /* at its pids limit, say */
    if (child == 0) {
        close(lfd);
        close(sfd);
        zygote_child(conn);
    }
    zkids[n_zkids++] = (struct zchild){child, conn};
}

static void zygote_reap(void)
{
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (size_t i = 0; i < n_zkids; i++) {
            if (zkids[i].pid != pid) continue;
            char msg[1 + sizeof status] = {'x'};
            memcpy(msg + 1, &status, sizeof status);
            if (send(zkids[i].conn, msg, sizeof msg, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {}
            close(zkids[i].conn);
            zkids[i] = zkids[--n_zkids];
            break;
        }
    }
}

/* pid 1's loop with a zygote socket: accept and fork, reap and report. Every signal is
 * blocked and read off the signalfd (SIGCHLD reaps, the rest are dropped: blocked
 * signals the sandbox sends pid 1 would otherwise queue up). */
static void zygote_loop(int lfd)
{
    sigset_t all;
    sigfillset(&all);
    int sfd = signalfd(-1, &all, SFD_NONBLOCK | SFD_CLOEXEC);
    if (sfd < 0 || fcntl(lfd, F_SETFL, O_NONBLOCK) < 0 || fcntl(lfd, F_SETFD, FD_CLOEXEC) < 0) {
        if (sfd >= 0) close(sfd);
        close(lfd);  /* the server's connects are refused: it runs the helper instead */
        return;
    }
    getrlimit(RLIMIT_NOFILE, &zygote_nofile);
    /* One connection per running command, held until it is reaped. */
    struct rlimit more = {zygote_nofile.rlim_max, zygote_nofile.rlim_max};
    setrlimit(RLIMIT_NOFILE, &more);
    char adj[16] = {0};
    int fd = open("/proc/self/oom_score_adj", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) { if (read(fd, adj, sizeof adj - 1) < 0) {} close(fd); }
    zygote_oom_adj = atoi(adj);
    struct pollfd p[2] = {{.fd = sfd, .events = POLLIN}, {.fd = lfd, .events = POLLIN}};
    for (;;) {
        if (poll(p, 2, -1) < 0) continue;
        if (p[0].revents & POLLIN) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof si) == (ssize_t)sizeof si) {}
            zygote_reap();
        }
        if (p[1].revents & POLLIN) zygote_accept(lfd, sfd);
    }
}
