/*
 * hutch-nsexec: the only privileged code on the local driver's hot path.
 *
 * Python cannot safely setns() into a pid namespace, drop capabilities and load a
 * seccomp filter between fork and exec, so this helper does exactly that and nothing
 * more. Modes:
 *
 *   launch  host side, once per sandbox: join the sandbox's init cgroups, make its
 *           namespaces (mount, pid, ipc, uts, net; user too with --userns), and
 *           fork its pid 1, which mounts the overlay root, /proc and a minimal /dev in
 *           the private mount namespace (no mount is ever left on the host), pivots,
 *           drops to the sandbox user and reaps orphans for ever.
 *   exec    enter a running sandbox, drop privileges, run a command.
 *   write   enter a running sandbox, drop privileges, write files read from stdin.
 *           Paths are resolved by the kernel in the sandbox's own mount namespace and
 *           with the sandbox user's permissions, so symlinks and ".." can never
 *           reach a host file.
 *   fs      the same entry, then one file operation (argv: read PATH | write PATH
 *           MODE PARENTS | list PATH | mkdir PATH PARENTS | rm PATH DIR RECURSIVE |
 *           symlink PATH TARGET | mv PATH DESTINATION | watch PATH RECURSIVE |
 *           meta PATH KEY VALUE...). read streams the file to stdout and write streams
 *           stdin into it, after an "ok\n" line saying the file is open; failures are
 *           "errno<TAB>N<TAB>message" on --status-fd. Done in here rather than with the
 *           runtime's own tools: no runtime needs cat/find/stat, nothing is parsed
 *           from tool output, and the code runs with exactly the privileges (and the
 *           seccomp filter) of the sandbox's own processes.
 *
 * Exit status 125 with a "kind<TAB>message" line on --status-fd means the helper
 * itself failed (kinds: setup, cwd, file); anything else is the command's status.
 *
 * Built statically (glibc + libseccomp) because it is exec'd inside the sandbox's
 * root, where the host's shared libraries do not exist.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <grp.h>
#include <linux/capability.h>
#include <sched.h>
#include <seccomp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <net/if.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

#define MAX_LIST 32
#define MAX_ENV 4096

extern char **environ;

static int status_fd = -1;

static void fail(const char *kind, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (status_fd >= 0)
        dprintf(status_fd, "%s\t%s\n", kind, msg);
    else
        dprintf(2, "hutch-nsexec: %s: %s\n", kind, msg);
    _exit(125);
}

#define TRY(expr, ...) do { if ((expr) < 0) fail("setup", __VA_ARGS__); } while (0)

struct opts {
    pid_t pid;
    uid_t uid;
    gid_t gid;
    const char *cwd;
    const char *cgroups[MAX_LIST];
    int n_cgroups;
    char **env;  /* exec: MAX_ENV entries, allocated by read_env (not in every sandbox's pid 1) */
    int n_env;
    const char *ov_lower, *ov_upper, *ov_work, *ov_target;
    const char *boot_id;  /* launch: this boot's id, bound over /proc/sys/kernel/random/boot_id */
    int ready_fd, info_fd, netfilter_fd, tty_fd, env_fd, zygote_fd;
    unsigned short tty_rows, tty_cols;
    char *argv_start, *argv_end;  /* the command line's memory (scrub_argv) */
    int userns;
    unsigned long rlimit_data, rlimit_nproc;
    unsigned long long dev_size;  /* launch: bytes of the /dev tmpfs (/dev/shm lives there) */
    char **argv;
};

static void parse(int argc, char **argv, struct opts *o)
{
    memset(o, 0, sizeof *o);
    o->uid = (uid_t)-1;
    o->gid = (gid_t)-1;
    o->ready_fd = -1;
    o->info_fd = -1;
    o->netfilter_fd = -1;
    o->tty_fd = -1;
    o->env_fd = -1;
    o->zygote_fd = -1;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--")) { o->argv = &argv[i + 1]; return; }
        if (!strcmp(a, "--userns")) { o->userns = 1; continue; }
        if (!v) fail("setup", "option %s needs a value", a);
        i++;
        if (!strcmp(a, "--pid")) o->pid = atoi(v);
        else if (!strcmp(a, "--uid")) o->uid = (uid_t)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--gid")) o->gid = (gid_t)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--cwd")) o->cwd = v;
        else if (!strcmp(a, "--status-fd")) status_fd = atoi(v);
        else if (!strcmp(a, "--ready-fd")) o->ready_fd = atoi(v);
        else if (!strcmp(a, "--info-fd")) o->info_fd = atoi(v);
        else if (!strcmp(a, "--netfilter-fd")) o->netfilter_fd = atoi(v);
        else if (!strcmp(a, "--tty-fd")) o->tty_fd = atoi(v);
        else if (!strcmp(a, "--tty-size")) {
            if (sscanf(v, "%hux%hu", &o->tty_rows, &o->tty_cols) != 2) fail("setup", "bad --tty-size %s", v);
        }
        else if (!strcmp(a, "--rlimit-data")) o->rlimit_data = strtoul(v, NULL, 10);
        else if (!strcmp(a, "--rlimit-nproc")) o->rlimit_nproc = strtoul(v, NULL, 10);
        else if (!strcmp(a, "--dev-size")) o->dev_size = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--cgroup-procs") && o->n_cgroups < MAX_LIST) o->cgroups[o->n_cgroups++] = v;
        else if (!strcmp(a, "--env-fd")) o->env_fd = atoi(v);
        else if (!strcmp(a, "--zygote-fd")) o->zygote_fd = atoi(v);
        else if (!strcmp(a, "--ov-lower")) o->ov_lower = v;
        else if (!strcmp(a, "--ov-upper")) o->ov_upper = v;
        else if (!strcmp(a, "--ov-work")) o->ov_work = v;
        else if (!strcmp(a, "--ov-target")) o->ov_target = v;
        else if (!strcmp(a, "--boot-id")) o->boot_id = v;
        else fail("setup", "unknown option %s", a);
    }
}

static void write_str(const char *path, const char *s)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, s, strlen(s)) < 0)
        fail("setup", "write %s: %s", path, strerror(errno));
    close(fd);
}

/* socket() and socketpair() take an allow-list of address families: local sockets, IP
 * (inside the sandbox's own network namespace) and netlink (route/diag queries of that
 * namespace). Every other family answers EAFNOSUPPORT, as on a kernel built without it,
 * so programs fall back instead of failing oddly. That closes AF_VSOCK, which no network
 * namespace confines (it reaches the hypervisor host's services), AF_PACKET, and the
 * rarely used families whose modules the kernel autoloads on first use (RDS, TIPC, KCM,
 * ALG, AX25, X25, ...), the usual door for kernel exploits.
 * The family is an int but the filter sees the whole 64-bit register: values with high
 * bits set (which the kernel truncates to a family) fall under the ">= 64" rule. */
static const int socket_families_allowed[] = {AF_UNIX, AF_INET, AF_INET6, AF_NETLINK};

static int deny_socket_families(scmp_filter_ctx ctx)
{
    static const int calls[] = {SCMP_SYS(socket), SCMP_SYS(socketpair)};
    int rc = 0;
    for (size_t c = 0; c < sizeof calls / sizeof *calls; c++) {
        for (int family = 0; family < 32; family++) {
            int allowed = 0;
            for (size_t i = 0; i < sizeof socket_families_allowed / sizeof *socket_families_allowed; i++)
                allowed |= family == socket_families_allowed[i];
            if (!allowed)
                rc |= seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), calls[c], 1,
                                       SCMP_A0(SCMP_CMP_EQ, (scmp_datum_t)family));
        }
        /* 32..63 in one comparison, everything above in another. */
        rc |= seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), calls[c], 1,
                               SCMP_A0(SCMP_CMP_MASKED_EQ, ~(scmp_datum_t)31, 32));
        rc |= seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), calls[c], 1,
                               SCMP_A0(SCMP_CMP_GE, 64));
    }
    return rc;
}

/* Deny-list on top of what an uncapable uid already cannot do. EPERM for things a
 * program should treat as "not allowed"; ENOSYS where libraries probe and fall back
 * (clone3 -> clone, whose flags we can inspect; io_uring -> epoll). */
static scmp_filter_ctx seccomp_rules(void)
{
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
    if (!ctx) fail("setup", "seccomp_init failed");
    static const int eperm[] = {
        SCMP_SYS(bpf), SCMP_SYS(perf_event_open), SCMP_SYS(userfaultfd),
        SCMP_SYS(keyctl), SCMP_SYS(add_key), SCMP_SYS(request_key),
        SCMP_SYS(kexec_load), SCMP_SYS(kexec_file_load),
        SCMP_SYS(init_module), SCMP_SYS(finit_module), SCMP_SYS(delete_module),
        SCMP_SYS(mount), SCMP_SYS(umount2), SCMP_SYS(pivot_root), SCMP_SYS(chroot),
        SCMP_SYS(open_tree), SCMP_SYS(move_mount), SCMP_SYS(fsopen), SCMP_SYS(fsconfig),
        SCMP_SYS(fsmount), SCMP_SYS(fspick), SCMP_SYS(mount_setattr),
        SCMP_SYS(setns), SCMP_SYS(open_by_handle_at), SCMP_SYS(name_to_handle_at),
        SCMP_SYS(swapon), SCMP_SYS(swapoff), SCMP_SYS(reboot), SCMP_SYS(acct),
        SCMP_SYS(syslog), SCMP_SYS(iopl), SCMP_SYS(ioperm), SCMP_SYS(vhangup),
        SCMP_SYS(lookup_dcookie), SCMP_SYS(quotactl),
    };
    static const int enosys[] = {
        SCMP_SYS(clone3), SCMP_SYS(io_uring_setup), SCMP_SYS(io_uring_enter),
        SCMP_SYS(io_uring_register),
    };
    int rc = 0;
    for (size_t i = 0; i < sizeof eperm / sizeof *eperm; i++)
        rc |= seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), eperm[i], 0);
    for (size_t i = 0; i < sizeof enosys / sizeof *enosys; i++)
        rc |= seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), enosys[i], 0);
    /* Unprivileged user namespaces hand out a fresh set of capabilities: the usual
     * first step of kernel exploits. Other CLONE_NEW* flags already need CAP_SYS_ADMIN. */
    rc |= seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(unshare), 1,
                           SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER));
    rc |= seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                           SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER));
    rc |= deny_socket_families(ctx);
    /* No raw sockets of the allowed families: they bypass the network namespace's filtering. */
    rc |= seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(socket), 1,
                           SCMP_A1(SCMP_CMP_MASKED_EQ, 0xf, SOCK_RAW));
    if (rc) fail("setup", "seccomp_rule_add failed");
    /* Foreign ABIs (i386 int 0x80) get killed by libseccomp's default bad-arch action. */
    return ctx;
}

/* The filter is the same for every sandbox process, but libseccomp compiles its rules anew
 * on each load (about a millisecond of every exec). So the build compiles it once: it runs
 * a first build's "seccomp-bpf" mode (the program libseccomp makes of seccomp_rules(), as
 * seccomp_load would load it) and builds again with that program embedded as
 * HUTCH_SECCOMP_PROG (native.py). Loaded here exactly as seccomp_load does it: the
 * seccomp(2) call with no flags, no_new_privs being set already (drop_privileges). */
#ifdef HUTCH_SECCOMP_PROG
#include <linux/filter.h>
#include <linux/seccomp.h>
static const struct sock_filter seccomp_prog[] = HUTCH_SECCOMP_PROG;
#endif

static void install_seccomp(void)
{
#ifdef HUTCH_SECCOMP_PROG
    struct sock_fprog prog = {
        .len = (unsigned short)(sizeof seccomp_prog / sizeof *seccomp_prog),
        .filter = (struct sock_filter *)seccomp_prog,
    };
    TRY(syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog), "seccomp: %s", strerror(errno));
#else
    scmp_filter_ctx ctx = seccomp_rules();
    if (seccomp_load(ctx) < 0) fail("setup", "seccomp_load failed");
    seccomp_release(ctx);
#endif
}

/* seccomp-bpf: the program libseccomp compiles from seccomp_rules(), raw, on stdout. */
static int mode_seccomp_bpf(void)
{
    scmp_filter_ctx ctx = seccomp_rules();
    if (seccomp_export_bpf(ctx, 1) < 0) fail("setup", "seccomp_export_bpf failed");
    seccomp_release(ctx);
    return 0;
}

/* Become the sandbox user for good: no supplementary groups, no capabilities in any
 * set (bounding included, so not even a setuid binary could return them), no new
 * privileges, and the seccomp filter. */
static void drop_privileges(uid_t uid, gid_t gid, int userns)
{
    if (uid == 0 || gid == 0 || uid == (uid_t)-1 || gid == (gid_t)-1)
        fail("setup", "refusing to run a sandbox as uid %u gid %u", uid, gid);
    /* In a user namespace setgroups is denied (that is what makes an unprivileged
     * gid_map possible); the one mapped group is all there is inside. */
    if (!userns) TRY(setgroups(0, NULL), "setgroups: %s", strerror(errno));
    TRY(setresgid(gid, gid, gid), "setresgid: %s", strerror(errno));
    for (int cap = 0; cap <= 63; cap++)
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno != EINVAL)
            fail("setup", "capbset_drop %d: %s", cap, strerror(errno));
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
    TRY(setresuid(uid, uid, uid), "setresuid: %s", strerror(errno));
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof data);
    TRY(syscall(SYS_capset, &hdr, data), "capset: %s", strerror(errno));
    TRY(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs: %s", strerror(errno));
    install_seccomp();
}

/* A minimal /dev in the sandbox's root, as bubblewrap's --dev made it: a tmpfs with the
 * harmless character devices (made by mknod as root, bound from the host under a user
 * namespace), a private devpts instance and the usual links. Nothing else of the
 * host's /dev is reachable. */
static void setup_dev(int userns, unsigned long long size)
{
    /* Sized to the sandbox's memory limit (--dev-size): its pages are charged to the memory
     * cgroup anyway, and a full /dev/shm then answers ENOSPC instead of the tmpfs default of
     * half the host's RAM. Under a user namespace nobody else polices it (no memory cgroup):
     * the server caps it lower (launch.py). */
    char data[64];
    if (size) snprintf(data, sizeof data, "mode=0755,size=%llu", size);
    else snprintf(data, sizeof data, "mode=0755,size=%s", userns ? "64m" : "512m");
    TRY(mount("tmpfs", "dev", "tmpfs", MS_NOSUID | MS_NOEXEC, data), "mount /dev: %s", strerror(errno));
    static const struct { const char *name; unsigned major, minor; } devices[] = {
        {"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0},
    };
    for (size_t i = 0; i < sizeof devices / sizeof *devices; i++) {
        char host[32], here[32];
        snprintf(host, sizeof host, "/dev/%s", devices[i].name);
        snprintf(here, sizeof here, "dev/%s", devices[i].name);
        if (!userns) {
            /* Root makes the nodes: six mknods instead of six bind mounts, each of which
             * the kernel must also tear down with the mount namespace. */
            TRY(mknod(here, S_IFCHR | 0666, makedev(devices[i].major, devices[i].minor)),
                "mknod %s: %s", here, strerror(errno));
            TRY(chmod(here, 0666), "chmod %s: %s", here, strerror(errno));
            continue;
        }
        /* A user namespace may not make device nodes: bind the host's. The bind keeps
         * the host's flags locked in; a remount could only add flags, and these need none. */
        int fd = open(here, O_CREAT | O_WRONLY | O_CLOEXEC, 0666);
        TRY(fd, "create %s: %s", here, strerror(errno));
        close(fd);
        TRY(mount(host, here, NULL, MS_BIND, NULL), "bind %s: %s", host, strerror(errno));
    }
    TRY(mkdir("dev/shm", 01777), "mkdir /dev/shm: %s", strerror(errno));
    TRY(chmod("dev/shm", 01777), "chmod /dev/shm: %s", strerror(errno));
    TRY(mkdir("dev/pts", 0755), "mkdir /dev/pts: %s", strerror(errno));
    TRY(mount("devpts", "dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620"),
        "mount /dev/pts: %s", strerror(errno));
    static const char *links[][2] = {
        {"pts/ptmx", "dev/ptmx"}, {"/proc/self/fd", "dev/fd"}, {"/proc/self/fd/0", "dev/stdin"},
        {"/proc/self/fd/1", "dev/stdout"}, {"/proc/self/fd/2", "dev/stderr"},
    };
    for (size_t i = 0; i < sizeof links / sizeof *links; i++)
        TRY(symlink(links[i][0], links[i][1]), "symlink %s: %s", links[i][1], strerror(errno));
}

/* The sandbox's own boot id: ``id`` (random, fresh at each boot of the sandbox: the server's)
 * bound read-only over /proc/sys/kernel/random/boot_id, as container runtimes mask /proc
 * paths, so the sandbox never reads the host's (which names the host's boot: the same in every
 * sandbox on it). The file bound is made in the sandbox's own /dev tmpfs and unlinked once
 * bound: the mount table then names no host path or file system (a bind's root is shown in
 * /proc/self/mountinfo). Done while we still hold every capability; the sandbox user, without
 * CAP_SYS_ADMIN and under seccomp, can neither unmount nor remount it, and a new /proc mount
 * is refused while a file of this one is covered. The remount keeps the atime flags (which
 * the kernel locks where a mount came from a more privileged namespace): only read-only,
 * nosuid, nodev and noexec are added. */
static void mask_boot_id(const char *id)
{
    static const char src[] = "dev/.boot_id", dst[] = "proc/sys/kernel/random/boot_id";
    if (strlen(id) != 36 || strspn(id, "0123456789abcdef-") != 36)
        fail("setup", "--boot-id: expected a uuid, got %.40s", id);
    int fd = open(src, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0444);
    TRY(fd, "create /%s: %s", src, strerror(errno));
    if (dprintf(fd, "%s\n", id) != 37) fail("setup", "write /%s: %s", src, strerror(errno));
    close(fd);
    TRY(mount(src, dst, NULL, MS_BIND, NULL), "bind the boot id over /%s: %s", dst, strerror(errno));
    unsigned long flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC;
    struct statvfs sv;
    if (statvfs(dst, &sv) == 0) {
        if (sv.f_flag & ST_NOATIME) flags |= MS_NOATIME;
        if (sv.f_flag & ST_NODIRATIME) flags |= MS_NODIRATIME;
        if (sv.f_flag & ST_RELATIME) flags |= MS_RELATIME;
    }
    TRY(mount(NULL, dst, NULL, flags, NULL), "make /%s read-only: %s", dst, strerror(errno));
    TRY(unlink(src), "unlink /%s: %s", src, strerror(errno));
}

static void loopback_up(void)
{
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    TRY(s, "socket: %s", strerror(errno));
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    strcpy(ifr.ifr_name, "lo");
    TRY(ioctl(s, SIOCGIFFLAGS, &ifr), "lo flags: %s", strerror(errno));
    ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
    TRY(ioctl(s, SIOCSIFFLAGS, &ifr), "lo up: %s", strerror(errno));
    close(s);
}

/* Rootless network: the sandbox's egress rules, loaded into its own network namespace
 * while we still hold capabilities there and still see the host's tree (the runtime
 * has no iptables): the host's iptables-restore reads them from ``fd``. We are not uid 0
 * inside, so an exec would lose every capability; CAP_NET_ADMIN and CAP_NET_RAW are
 * passed on as ambient ones, to that one child only. The sandbox user, capability-less,
 * can neither change nor get around them (raw sockets are refused by seccomp). */
static void load_netfilter(int fd, int noflush)
{
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    TRY(syscall(SYS_capget, &hdr, data), "capget: %s", strerror(errno));
    data[0].inheritable |= (1u << CAP_NET_ADMIN) | (1u << CAP_NET_RAW);
    TRY(syscall(SYS_capset, &hdr, data), "capset: %s", strerror(errno));
    pid_t child = fork();
    TRY(child, "fork: %s", strerror(errno));
    if (child == 0) {
        if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_NET_ADMIN, 0, 0) < 0 ||
            prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_NET_RAW, 0, 0) < 0)
            _exit(126);
        if (dup2(fd, 0) < 0) _exit(126);
        char *args[] = {"iptables-restore", noflush ? "--noflush" : NULL, NULL};
        char *env[] = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", NULL};
        execve("/usr/sbin/iptables-restore", args, env);
        execve("/sbin/iptables-restore", args, env);
        _exit(127);
    }
    int status;
    while (waitpid(child, &status, 0) < 0)
        if (errno != EINTR) fail("setup", "waitpid: %s", strerror(errno));
    close(fd);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail("setup", "loading the sandbox's egress rules (iptables-restore) failed: status %d", status);
}

static void write_map(const char *file, unsigned inside, unsigned outside)
{
    char buf[64];
    snprintf(buf, sizeof buf, "%u %u 1\n", inside, outside);
    write_str(file, buf);
}

/* Resource limits where there are no cgroups (the rootless mode). Memory: RLIMIT_DATA,
 * per process, counting heap and private writable mappings but not address space only
 * reserved (RLIMIT_AS would stop V8, Go and the JVM, which reserve far more than they
 * use). Processes: RLIMIT_NPROC, counted per user and user namespace, i.e. per sandbox. */
static void set_rlimits(struct opts *o)
{
    struct rlimit r;
    if (o->rlimit_data) {
        r.rlim_cur = r.rlim_max = o->rlimit_data;
        TRY(setrlimit(RLIMIT_DATA, &r), "rlimit data: %s", strerror(errno));
    }
    if (o->rlimit_nproc) {
        r.rlim_cur = r.rlim_max = o->rlimit_nproc;
        TRY(setrlimit(RLIMIT_NPROC, &r), "rlimit nproc: %s", strerror(errno));
    }
    r.rlim_cur = r.rlim_max = 0;
    setrlimit(RLIMIT_CORE, &r);  /* no core files of sandbox processes on any host */
}

#include "zygote.h"

static int self_exe = -1;  /* rootless pid 1's own binary, to re-exec (see mode_launch) */
static void scrub_argv(struct opts *o);
static int mode_init(struct opts *o);

/* The sandbox's pid 1, from the host side: join its cgroups, make every namespace
 * (a user namespace too with --userns, for servers that are not root), fork pid 1,
 * print its host pid on --info-fd and exit. Pid 1 mounts the overlay root, /proc and
 * /dev in its private mount namespace (nothing propagates to the host), pivots into
 * the root, detaches the host's tree, then becomes the sandbox user and reaps orphans
 * for ever: it is what exec/write/fs setns() into. What bubblewrap did for us before,
 * without its second exec and without parsing the host's mount table (which costs
 * O(host mounts) per sandbox: 578 leftover mounts here made it 43% of all CPU). */
static int mode_launch(struct opts *o)
{
    /* Opened here, joined by pid 1 itself after the fork (the kernel checks the opener's
     * credentials, as zygote.h's children rely on): a fork is refused at the instance's pids
     * bound (pidstotal.py) but joining never is, so a sandbox is still launched while other
     * sandboxes hold every pid the bound allows. The parent waits on ``joined`` until pid 1
     * is in its cgroups: its pid is printed only then. */
    int cg[MAX_LIST];
    for (int i = 0; i < o->n_cgroups; i++) {
        cg[i] = open(o->cgroups[i], O_WRONLY | O_CLOEXEC);
        if (cg[i] < 0) fail("setup", "open %s: %s", o->cgroups[i], strerror(errno));
    }
    int joined[2];
    TRY(pipe2(joined, O_CLOEXEC), "pipe: %s", strerror(errno));
    /* The sandbox's anchor should outlive any OOM inside the sandbox. Best effort:
     * lowering needs CAP_SYS_RESOURCE, which some hosts withhold even from root. First a
     * privileged "0" on oom_score_adj, which pins at 0 the floor an unprivileged process may
     * lower its score to; then -1000 through the legacy oom_adj (-17), which lowers the score
     * without moving that floor. So the commands pid 1 forks (zygote.h) raise theirs back to
     * 0 and can never lower it again. */
    int oom = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (oom >= 0) { if (write(oom, "0", 1) < 0) {} close(oom); }
    oom = open("/proc/self/oom_adj", O_WRONLY | O_CLOEXEC);
    if (oom >= 0) { if (write(oom, "-17", 3) < 0) {} close(oom); }
    if (o->userns) {
        uid_t uid = geteuid();
        gid_t gid = getegid();
        TRY(unshare(CLONE_NEWUSER), "unshare user namespace: %s", strerror(errno));
        write_str("/proc/self/setgroups", "deny");
        write_map("/proc/self/uid_map", o->uid, uid);
        write_map("/proc/self/gid_map", o->gid, gid);
    }
    TRY(unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWNET),
        "unshare: %s", strerror(errno));
    pid_t child = fork();
    TRY(child, "fork: %s", strerror(errno));
    if (child > 0) {
        /* The host's view of pid 1; its parent (us) exits, so nobody on the host has to
         * reap it and it survives the server. */
        char c;
        close(joined[1]);
        while (read(joined[0], &c, 1) < 0 && errno == EINTR) {}  /* EOF: joined, or pid 1 died */
        if (dprintf(o->info_fd, "%d\n", (int)child) < 0) _exit(125);
        _exit(0);
    }
    for (int i = 0; i < o->n_cgroups; i++) {
        /* "0": this single-threaded process; see cgroups.py */
        if (write(cg[i], "0", 1) < 0) fail("setup", "join %s: %s", o->cgroups[i], strerror(errno));
        close(cg[i]);
    }
    close(joined[0]);
    close(joined[1]);
    setsid();
    if (o->userns) {
        self_exe = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
        TRY(self_exe, "open /proc/self/exe: %s", strerror(errno));
    }
    TRY(mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL), "make-private: %s", strerror(errno));
    char data[8192];
    snprintf(data, sizeof data, "lowerdir=%s,upperdir=%s,workdir=%s%s", o->ov_lower, o->ov_upper, o->ov_work,
             o->userns ? ",userxattr" : "");
    TRY(mount("overlay", o->ov_target, "overlay", MS_NOSUID | MS_NODEV, data), "mount overlay: %s", strerror(errno));
    if (o->netfilter_fd >= 0) load_netfilter(o->netfilter_fd, 0);
    TRY(chdir(o->ov_target), "chdir %s: %s", o->ov_target, strerror(errno));
    TRY(mount("proc", "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL), "mount /proc: %s", strerror(errno));
    setup_dev(o->userns, o->dev_size);
    if (o->boot_id) mask_boot_id(o->boot_id);  /* its file made in /dev, and gone from there */
    TRY(syscall(SYS_pivot_root, ".", "."), "pivot_root: %s", strerror(errno));
    TRY(umount2(".", MNT_DETACH), "detach the host root: %s", strerror(errno));
    TRY(chdir("/"), "chdir /: %s", strerror(errno));
    TRY(sethostname("sandbox", 7), "sethostname: %s", strerror(errno));
    loopback_up();
    set_rlimits(o);
    drop_privileges(o->uid, o->gid, o->userns);
    if (o->userns) {
        /* Rootless, pid 1 execs itself once more, now inside its user namespace: a process
         * forked from the launcher keeps the host's user namespace as its memory's owner,
         * and being non-dumpable, no helper of ours (which has capabilities only in the
         * sandbox's namespace) could then join it. After the exec the owner is the
         * sandbox's namespace, where our helpers are privileged and the sandbox user is
         * not. The fd was opened before the host's tree was detached. */
        char fd_arg[16], zygote_arg[16];
        snprintf(fd_arg, sizeof fd_arg, "%d", o->ready_fd);
        snprintf(zygote_arg, sizeof zygote_arg, "%d", o->zygote_fd);
        char *args[] = {"hutch-init", "init", "--ready-fd", fd_arg, "--zygote-fd", zygote_arg, NULL};
        char *no_env[] = {NULL};
        fexecve(self_exe, args, no_env);
        fail("setup", "re-exec pid 1: %s", strerror(errno));
    }
    scrub_argv(o);
    return mode_init(o);
}

/* pid 1's command line is readable by every process in the sandbox: it should not tell
 * them host paths (the data dir, the runtime cache). */
static void scrub_argv(struct opts *o)
{
    if (!o->argv_start) return;
    memset(o->argv_start, 0, (size_t)(o->argv_end - o->argv_start));
    strcpy(o->argv_start, "hutch-init");
}

/* pid 1 from here on: already the sandbox user, under the seccomp filter. */
static int mode_init(struct opts *o)
{
    /* Non-dumpable: the sandbox user may not ptrace or poke at its own pid 1. */
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    int null = open("/dev/null", O_RDWR);
    if (null >= 0) { dup2(null, 0); dup2(null, 1); dup2(null, 2); }
    if (o->ready_fd >= 0 && write(o->ready_fd, "ready\n", 6) < 0) _exit(125);
    int keep = 3;
    if (o->zygote_fd >= 0) {
        if (o->zygote_fd != 3 && dup2(o->zygote_fd, 3) < 0) o->zygote_fd = -1;
        else { o->zygote_fd = 3; keep = 4; }
    }
    syscall(SYS_close_range, keep, ~0U, 0);
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, NULL);
    if (o->zygote_fd >= 0) zygote_loop(o->zygote_fd);  /* returns only if it could not start */
    for (;;) {
        siginfo_t si;
        if (sigwaitinfo(&all, &si) == SIGCHLD)
            while (waitpid(-1, NULL, WNOHANG) > 0) {}
    }
}

static pid_t child_pid;

static void forward(int sig)
{
    if (child_pid > 0) kill(child_pid, sig);
}

/* Shared by exec and write: enter the sandbox, fork into its pid namespace and return
 * in the child, already in the execution's cgroup and without privileges. The parent
 * never returns: it waits and exits with the child's status. */
static void enter(struct opts *o)
{
    int cg[MAX_LIST];
    for (int i = 0; i < o->n_cgroups; i++) {
        cg[i] = open(o->cgroups[i], O_WRONLY | O_CLOEXEC);
        if (cg[i] < 0) fail("setup", "open %s: %s", o->cgroups[i], strerror(errno));
    }
    int pidfd = syscall(SYS_pidfd_open, o->pid, 0);
    TRY(pidfd, "sandbox init %d: %s", o->pid, strerror(errno));
    struct stat mine, theirs;
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/ns/user", o->pid);
    /* A rootless sandbox has a user namespace of its own: join it first, on its own, so
     * the other joins are checked against the capabilities we then hold in it (the
     * kernel refuses them with EPERM in one combined call here). */
    if (stat("/proc/self/ns/user", &mine) == 0 && stat(path, &theirs) == 0 && mine.st_ino != theirs.st_ino) {
        TRY(setns(pidfd, CLONE_NEWUSER), "setns user: %s", strerror(errno));
        o->userns = 1;
    }
    TRY(setns(pidfd, CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWNET),
        "setns: %s", strerror(errno));
    close(pidfd);

    child_pid = fork();
    TRY(child_pid, "fork: %s", strerror(errno));
    if (child_pid == 0) {
        for (int i = 0; i < o->n_cgroups; i++)
            if (write(cg[i], "0", 1) < 0) fail("setup", "join %s: %s", o->cgroups[i], strerror(errno));
        for (int i = 0; i < o->n_cgroups; i++) close(cg[i]);
        /* Lowered by a privileged writer, oom_score_adj stays lowerable by the child;
         * resetting it while still privileged pins the floor at 0. */
        int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
        if (fd >= 0) { if (write(fd, "0", 1) < 0) {} close(fd); }
        setsid();
        syscall(SYS_close_range, 3, ~0U, CLOSE_RANGE_CLOEXEC);
        set_rlimits(o);
        drop_privileges(o->uid, o->gid, o->userns);
        umask(022);
        if (o->cwd && chdir(o->cwd) < 0) fail("cwd", "%s: %s", o->cwd, strerror(errno));
        return;
    }
    struct sigaction sa = {0};
    sa.sa_handler = forward;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    int status;
    while (waitpid(child_pid, &status, 0) < 0)
        if (errno != EINTR) fail("setup", "waitpid: %s", strerror(errno));
    _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
}

/* A terminal (exec --tty-fd SOCK): allocated from the sandbox's own devpts instance, so
 * the command sees /dev/pts/N of its sandbox and the host's ptys stay out of reach. Opened
 * here, as the sandbox user inside the sandbox, after enter(); the master goes back to the
 * server over SOCK (SCM_RIGHTS) and the peer becomes this session's controlling terminal
 * and the command's stdin, stdout and stderr. */
static void attach_tty(int sock, unsigned short rows, unsigned short cols)
{
    int master = open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (master < 0) fail("setup", "open /dev/ptmx: %s", strerror(errno));
    int unlock = 0;
    TRY(ioctl(master, TIOCSPTLCK, &unlock), "unlock pty: %s", strerror(errno));
    /* TIOCGPTPEER opens the peer through the master, not by a path someone could swap. */
    int peer = ioctl(master, TIOCGPTPEER, O_RDWR | O_NOCTTY);
    TRY(peer, "open pty peer: %s", strerror(errno));
    struct winsize ws = {.ws_row = rows ? rows : 24, .ws_col = cols ? cols : 80};
    TRY(ioctl(master, TIOCSWINSZ, &ws), "set window size: %s", strerror(errno));
    char tag = 'm';
    struct iovec iov = {.iov_base = &tag, .iov_len = 1};
    union { char buf[CMSG_SPACE(sizeof(int))]; struct cmsghdr align; } u;
    memset(&u, 0, sizeof u);
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &master, sizeof(int));
    TRY(sendmsg(sock, &msg, 0), "send pty: %s", strerror(errno));
    close(master);
    close(sock);
    TRY(ioctl(peer, TIOCSCTTY, 0), "set controlling terminal: %s", strerror(errno));
    for (int fd = 0; fd < 3; fd++) TRY(dup2(peer, fd), "dup2 pty: %s", strerror(errno));
    if (peer > 2) close(peer);
}

/* The command's environment: NUL-terminated KEY=VALUE entries read from --env-fd (a
 * memfd the server filled), never from our command line, which every user of the host can
 * read in /proc (and our own environment is empty). */
static void read_env(struct opts *o)
{
    /* Allocated here rather than in struct opts: 32 KiB of pointers that every sandbox's
     * idle pid 1 (which never runs a command itself) kept dirty in its heap. */
    o->env = calloc(MAX_ENV, sizeof *o->env);
    if (!o->env) fail("setup", "out of memory");
    if (o->env_fd < 0) return;
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap + 1);
    if (!buf) fail("setup", "out of memory");
    for (;;) {
        if (len == cap) {
            if (cap >= ((size_t)64 << 20)) fail("setup", "environment over 64 MiB");
            cap *= 2;
            char *more = realloc(buf, cap + 1);
            if (!more) fail("setup", "out of memory");
            buf = more;
        }
        ssize_t r = read(o->env_fd, buf + len, cap - len);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) fail("setup", "read the environment: %s", strerror(errno));
        if (r == 0) break;
        len += (size_t)r;
    }
    close(o->env_fd);
    buf[len] = '\0';
    for (size_t i = 0; i < len && o->n_env < MAX_ENV - 1; i += strlen(buf + i) + 1)
        if (buf[i]) o->env[o->n_env++] = buf + i;
}

static int mode_exec(struct opts *o)
{
    if (!o->argv || !o->argv[0]) fail("setup", "no command");
    read_env(o);
    enter(o);
    if (o->tty_fd >= 0) attach_tty(o->tty_fd, o->tty_rows, o->tty_cols);
    o->env[o->n_env] = NULL;
    environ = o->env;  /* execvp searches the sandbox's PATH, not ours */
    /* Ignored dispositions and the signal mask survive exec: a server started in the
     * background by a non-interactive shell ignores SIGINT and SIGQUIT, and its sandboxes'
     * commands would too (^C in a terminal would do nothing). Every command starts with
     * the defaults, whatever the server's own were. */
    for (int sig = 1; sig < NSIG; sig++)
        if (sig != SIGKILL && sig != SIGSTOP) signal(sig, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    execvp(o->argv[0], o->argv);
    int err = errno;
    dprintf(2, "%s: %s\n", o->argv[0], err == ENOENT ? "command not found" : strerror(err));
    _exit(err == ENOENT ? 127 : 126);
}

static int read_full(FILE *in, char *buf, size_t n)
{
    return fread(buf, 1, n, in) == n ? 0 : -1;
}

static void mkdirs(char *path)
{
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(path, 0755) < 0 && errno != EEXIST) {
            int err = errno;
            *p = '/';
            fail("file", "%s: %s", path, strerror(err));
        }
        *p = '/';
    }
}

/* Records on stdin: "<mode-octal> <path-len> <content-len>\n<path><content>". */
static int mode_write(struct opts *o)
{
    enter(o);
    FILE *in = stdin;
    char line[128];
    while (fgets(line, sizeof line, in)) {
        unsigned mode;
        size_t plen, clen;
        if (sscanf(line, "%o %zu %zu", &mode, &plen, &clen) != 3 || plen == 0 || plen > 4096)
            fail("setup", "bad record header");
        char *path = calloc(1, plen + 1);
        if (!path || read_full(in, path, plen) < 0) fail("setup", "short path");
        mkdirs(path);
        /* O_NONBLOCK: a FIFO planted at the path must not hang us; only regular files. */
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOCTTY | O_NONBLOCK, 0600);
        if (fd < 0) fail("file", "%s: %s", path, strerror(errno));
        struct stat st;
        if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) fail("file", "%s: not a regular file", path);
        if (fchmod(fd, mode & 0777) < 0) fail("file", "%s: %s", path, strerror(errno));
        char buf[65536];
        while (clen > 0) {
            size_t n = clen < sizeof buf ? clen : sizeof buf;
            if (read_full(in, buf, n) < 0) fail("setup", "short content for %s", path);
            for (size_t off = 0; off < n;) {
                ssize_t w = write(fd, buf + off, n - off);
                if (w < 0) fail("file", "%s: %s", path, strerror(errno));
                off += (size_t)w;
            }
            clen -= n;
        }
        if (close(fd) < 0) fail("file", "%s: %s", path, strerror(errno));
        free(path);
    }
    return 0;
}

#include "fileops.h"  /* mode_fs: one file operation as the sandbox user */

/* A live rootless sandbox's egress rules changed (network.allow resolved anew): join its
 * user namespace (ours: we get every capability in it) and its network namespace only,
 * and load the rules on stdin as at launch, without flushing what they do not name. */
static int mode_netfilter(struct opts *o)
{
    int pidfd = syscall(SYS_pidfd_open, o->pid, 0);
    TRY(pidfd, "sandbox init %d: %s", o->pid, strerror(errno));
    TRY(setns(pidfd, CLONE_NEWUSER), "setns user: %s", strerror(errno));
    TRY(setns(pidfd, CLONE_NEWNET), "setns net: %s", strerror(errno));
    close(pidfd);
    load_netfilter(0, 1);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) fail("setup", "usage: hutch-nsexec launch|init|exec|write|fs|netfilter|seccomp-bpf [options] [-- argv]");
    struct opts *o = calloc(1, sizeof *o);
    if (!o) fail("setup", "out of memory");
    parse(argc, argv, o);
    o->argv_start = argv[0];
    o->argv_end = argv[argc - 1] + strlen(argv[argc - 1]) + 1;
    const char *mode = argv[1];
    if (!strcmp(mode, "launch")) return mode_launch(o);
    if (!strcmp(mode, "init")) return mode_init(o);
    if (!strcmp(mode, "exec")) return mode_exec(o);
    if (!strcmp(mode, "write")) return mode_write(o);
    if (!strcmp(mode, "fs")) return mode_fs(o);
    if (!strcmp(mode, "netfilter")) return mode_netfilter(o);
    if (!strcmp(mode, "seccomp-bpf")) return mode_seccomp_bpf();
    fail("setup", "unknown mode %s", mode);
    return 125;
}
