/*
 * File operations and directory watches (included by hutch-nsexec.c): `hutch-nsexec fs OP
 * PATH ...` enters the sandbox (enter()) and does one operation as the sandbox user, inside
 * the sandbox's own view of its files, so a path or link a tenant made can only lead where
 * the sandbox itself could go. Errors go out as the helper's status line (fail_errno).
 */
/* ---- fs: one file operation as the sandbox user, inside the sandbox's view ---- */

static void fail_errno(int err, const char *what)
{
    if (status_fd >= 0)
        dprintf(status_fd, "errno\t%d\t%s: %s\n", err, what, strerror(err));
    _exit(125);
}

static void write_all(int fd, const char *buf, size_t n, const char *what)
{
    while (n > 0) {
        ssize_t w = write(fd, buf, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (fd == 1 && errno == EPIPE) _exit(0);  /* the reader went away */
            fail_errno(errno, what);
        }
        buf += w;
        n -= (size_t)w;
    }
}

/* mkdir -p of every component of path (all of it when whole, else up to the last '/'). */
static void fs_mkdirs(const char *path, int whole)
{
    size_t n = strlen(path);
    char *buf = malloc(n + 2);
    if (!buf) fail_errno(ENOMEM, path);
    memcpy(buf, path, n + 1);
    if (whole) { buf[n] = '/'; buf[n + 1] = 0; }
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) < 0) {
            int err = errno;
            struct stat st;
            if (err != EEXIST) fail_errno(err, buf);
            if (stat(buf, &st) < 0) fail_errno(errno, buf);
            if (!S_ISDIR(st.st_mode)) fail_errno(ENOTDIR, buf);
        }
        *p = '/';
    }
    free(buf);
}

static void fs_read(const char *path)
{
    /* O_NONBLOCK: a FIFO planted at the path must not hang us; only regular files. */
    int fd = open(path, O_RDONLY | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) fail_errno(errno, path);
    struct stat st;
    if (fstat(fd, &st) < 0) fail_errno(errno, path);
    if (S_ISDIR(st.st_mode)) fail_errno(EISDIR, path);
    if (!S_ISREG(st.st_mode)) fail_errno(EINVAL, path);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    write_all(1, "ok\n", 3, "stdout");
    static char buf[1 << 20];
    for (;;) {
        ssize_t r = read(fd, buf, sizeof buf);
        if (r < 0) { if (errno == EINTR) continue; fail_errno(errno, path); }
        if (r == 0) break;
        write_all(1, buf, (size_t)r, "stdout");
    }
}

static void fs_write(const char *path, unsigned mode, int parents)
{
    if (parents) fs_mkdirs(path, 0);
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOCTTY | O_NONBLOCK, 0600);
    if (fd < 0) fail_errno(errno == ENXIO ? EINVAL : errno, path);  /* ENXIO: a FIFO nobody reads */
    struct stat st;
    if (fstat(fd, &st) < 0) fail_errno(errno, path);
    if (!S_ISREG(st.st_mode)) fail_errno(EINVAL, path);
    /* No change made for nothing: each is an event to whoever watches the directory. */
    if (st.st_size && ftruncate(fd, 0) < 0) fail_errno(errno, path);
    if ((st.st_mode & 07777) != (mode & 0777) && fchmod(fd, mode & 0777) < 0) fail_errno(errno, path);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    write_all(1, "ok\n", 3, "stdout");
    static char buf[1 << 20];
    for (;;) {
        ssize_t r = read(0, buf, sizeof buf);
        if (r < 0) { if (errno == EINTR) continue; fail_errno(errno, "stdin"); }
        if (r == 0) break;
        write_all(fd, buf, (size_t)r, path);
    }
    if (close(fd) < 0) fail_errno(errno, path);
}

/* The name the sandbox's own /etc/passwd or /etc/group gives id (as ls shows it: the
 * number when none). Read here, inside, so it is the sandbox's view of its users; the
 * last answer is kept, since a listing's entries mostly share one owner. */
struct id_cache { int known; unsigned id; char name[64]; };

static const char *id_name(const char *file, unsigned id, struct id_cache *c)
{
    if (c->known && c->id == id) return c->name;
    c->known = 1;
    c->id = id;
    snprintf(c->name, sizeof c->name, "%u", id);
    FILE *f = fopen(file, "re");
    if (!f) return c->name;
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL, *end;
        if (!c2 || c1 == line) continue;
        unsigned long v = strtoul(c2 + 1, &end, 10);
        if (end == c2 + 1 || *end != ':' || v != id) continue;
        *c1 = 0;
        if (strlen(line) < sizeof c->name && !strpbrk(line, " \t")) snprintf(c->name, sizeof c->name, "%s", line);
        break;
    }
    fclose(f);
    return c->name;
}

/* A file's metadata: its user.e2b.* extended attributes, as "key\0value\0" pairs (the
 * prefix dropped; a value holding a NUL is left out, it could not be told apart). */
#define META_PREFIX "user.e2b."
static size_t fs_meta(const char *path, char *out, size_t cap)
{
    static char names[65536], value[4096];
    ssize_t n = llistxattr(path, names, sizeof names);
    size_t used = 0;
    for (ssize_t i = 0; i < n; i += (ssize_t)strlen(names + i) + 1) {
        const char *k = names + i;
        if (strncmp(k, META_PREFIX, strlen(META_PREFIX))) continue;
        ssize_t vn = lgetxattr(path, k, value, sizeof value);
        if (vn < 0 || memchr(value, 0, (size_t)vn)) continue;
        size_t kl = strlen(k) - strlen(META_PREFIX);
        if (used + kl + (size_t)vn + 2 > cap) break;
        memcpy(out + used, k + strlen(META_PREFIX), kl + 1);
        used += kl + 1;
        memcpy(out + used, value, (size_t)vn);
        used += (size_t)vn;
        out[used++] = 0;
    }
    return used;
}

/* meta PATH KEY VALUE...: the file's metadata becomes exactly these pairs. */
static void fs_set_meta(const char *path, char **pairs, int n)
{
    static char names[65536];
    ssize_t len = llistxattr(path, names, sizeof names);
    if (len < 0) fail_errno(errno, path);
    for (ssize_t i = 0; i < len; i += (ssize_t)strlen(names + i) + 1)
        if (!strncmp(names + i, META_PREFIX, strlen(META_PREFIX)) && lremovexattr(path, names + i) < 0)
            fail_errno(errno, path);
    for (int i = 0; i + 1 < n; i += 2) {
        char key[512];
        if (snprintf(key, sizeof key, META_PREFIX "%s", pairs[i]) >= (int)sizeof key) fail_errno(ENAMETOOLONG, path);
        if (lsetxattr(path, key, pairs[i + 1], strlen(pairs[i + 1]), 0) < 0) fail_errno(errno, path);
    }
}

/* Records: "<mode-octal> <size> <mtime-s> <mtime-ns> <name-len> <link-len> <owner> <group>
 * <meta-len>\n<name><link><meta>". */
static void fs_entry(int dirfd, const char *name, const char *shown, const char *full)
{
    static struct id_cache users, groups;
    static char meta[65536];
    struct stat st;
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) return;  /* raced away */
    char link[4096];
    ssize_t ln = 0;
    if (S_ISLNK(st.st_mode)) {
        ln = readlinkat(dirfd, name, link, sizeof link);
        if (ln < 0) ln = 0;
    }
    size_t mn = S_ISLNK(st.st_mode) ? 0 : fs_meta(full, meta, sizeof meta);
    char head[256];
    int h = snprintf(head, sizeof head, "%o %lld %lld %ld %zu %zd %s %s %zu\n", (unsigned)st.st_mode,
                     (long long)st.st_size, (long long)st.st_mtim.tv_sec, (long)st.st_mtim.tv_nsec,
                     strlen(shown), ln, id_name("/etc/passwd", st.st_uid, &users),
                     id_name("/etc/group", st.st_gid, &groups), mn);
    write_all(1, head, (size_t)h, "stdout");
    write_all(1, shown, strlen(shown), "stdout");
    write_all(1, link, (size_t)ln, "stdout");
    write_all(1, meta, mn, "stdout");
}

static void fs_list(const char *path)
{
    struct stat st;
    if (stat(path, &st) < 0) fail_errno(errno, path);
    if (!S_ISDIR(st.st_mode)) {
        const char *base = strrchr(path, '/');
        base = base && base[1] ? base + 1 : path;
        fs_entry(AT_FDCWD, path, base, path);
        return;
    }
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) fail_errno(errno, path);
    DIR *d = fdopendir(fd);
    if (!d) fail_errno(errno, path);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char full[8192];
        snprintf(full, sizeof full, "%s/%s", path, e->d_name);
        fs_entry(fd, e->d_name, e->d_name, full);
    }
    closedir(d);
}

static void fs_mkdir(const char *path, int parents)
{
    if (parents) { fs_mkdirs(path, 1); return; }
    if (mkdir(path, 0755) < 0) {
        int err = errno;
        struct stat st;
        if (err != EEXIST) fail_errno(err, path);
        if (stat(path, &st) < 0 || !S_ISDIR(st.st_mode)) fail_errno(EEXIST, path);
    }
}

/* Empty a directory without ever following a symlink: every step is relative to an
 * fd opened with O_NOFOLLOW, so a link swapped in mid-way is removed, not entered. */
static void rm_tree_at(int parent, const char *name, int depth)
{
    if (depth > 4096) fail_errno(ELOOP, name);
    int fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) fail_errno(errno, name);
    DIR *d = fdopendir(fd);
    if (!d) fail_errno(errno, name);
    int removed;
    do {
        removed = 0;
        struct dirent *e;
        rewinddir(d);
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            if (unlinkat(fd, e->d_name, 0) == 0) { removed = 1; continue; }
            if (errno != EISDIR && errno != EPERM) fail_errno(errno, e->d_name);
            rm_tree_at(fd, e->d_name, depth + 1);
            if (unlinkat(fd, e->d_name, AT_REMOVEDIR) < 0) fail_errno(errno, e->d_name);
            removed = 1;
        }
    } while (removed);
    closedir(d);
}

static void fs_rm(const char *path, int directory, int recursive)
{
    struct stat st;
    if (lstat(path, &st) < 0) {
        if (errno == ENOENT) { write_all(1, "absent\n", 7, "stdout"); return; }
        fail_errno(errno, path);
    }
    if (!S_ISDIR(st.st_mode)) {
        if (directory && !S_ISLNK(st.st_mode)) fail_errno(ENOTDIR, path);
        if (unlink(path) < 0) fail_errno(errno, path);
    } else {
        if (!directory) fail_errno(EISDIR, path);
        if (rmdir(path) < 0) {
            if ((errno != ENOTEMPTY && errno != EEXIST) || !recursive) fail_errno(errno, path);
            rm_tree_at(AT_FDCWD, path, 0);
            if (rmdir(path) < 0) fail_errno(errno, path);
        }
    }
    write_all(1, "removed\n", 8, "stdout");
}

static void fs_symlink(const char *path, const char *target)
{
    fs_mkdirs(path, 0);
    if (symlink(target, path) == 0) return;
    struct stat st;
    if (errno != EEXIST || lstat(path, &st) < 0 || S_ISDIR(st.st_mode)) fail_errno(EEXIST, path);
    if (unlink(path) < 0) fail_errno(errno, path);
    if (symlink(target, path) < 0) fail_errno(errno, path);
}

/* rename(2) as is (a file never replaces a directory); the failure names the path it is
 * about, the source's absence or the destination's conflict. */
static void fs_mv(const char *src, const char *dst)
{
    struct stat st;
    if (lstat(src, &st) < 0) fail_errno(errno, src);
    fs_mkdirs(dst, 0);
    if (rename(src, dst) < 0) fail_errno(errno, dst);
}

/* watch PATH RECURSIVE: inotify on a directory (and, recursive, every directory below it,
 * those made later too), as the sandbox user sees them. After "ok\n", each event is a record
 * "<kind> <name-len>\n<name>" (kind: C create, W write, R remove, N rename, M chmod; the name
 * relative to PATH), "O 0\n" if the kernel's queue overflowed; a byte on stdin asks for
 * every event queued so far and is answered "F 0\n" after them (so an event of a change
 * made before the byte was sent is never late). Ends at stdin's EOF, or when PATH goes. */
#define WATCH_MAX 8192
#define WATCH_MASK (IN_CREATE | IN_MODIFY | IN_ATTRIB | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | \
                    IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW)
static char *watch_rel[WATCH_MAX];  /* by watch descriptor: the directory's path below PATH */
static int watch_ifd, watch_recursive;
static const char *watch_root;

static void watch_emit(char kind, const char *rel, const char *name);

/* announce: a directory that came after the watch began (made, or moved in): what it holds
 * already was made before its own watch existed, so no event of it can come; it is told as
 * made (and written, a file with bytes) instead, its subdirectories likewise. A change racing
 * the scan may be told twice; none is missed. */
static void watch_add(const char *rel, int depth, int announce)
{
    char full[8192];
    if (snprintf(full, sizeof full, "%s%s%s", watch_root, *rel ? "/" : "", rel) >= (int)sizeof full) {
        if (!*rel) fail_errno(ENAMETOOLONG, watch_root);
        return;  /* deeper than a path can say: a cut one could name another directory */
    }
    int wd = inotify_add_watch(watch_ifd, full, WATCH_MASK);
    if (wd < 0) {
        if (!*rel) fail_errno(errno, watch_root);
        if (errno == ENOSPC) fail_errno(ENOSPC, full);  /* the kernel's watch limit: say so */
        return;  /* raced away, or not ours to read */
    }
    if (wd >= WATCH_MAX) fail_errno(ENOSPC, full);
    if (!watch_rel[wd]) watch_rel[wd] = strdup(rel);
    if (!watch_recursive || depth > 64) return;
    DIR *d = opendir(full);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (announce) {
            watch_emit('C', rel, e->d_name);
            struct stat st;
            if (e->d_type == DT_REG && fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && st.st_size > 0)
                watch_emit('W', rel, e->d_name);
        }
        if (e->d_type != DT_DIR) continue;
        char sub[8192];
        if (snprintf(sub, sizeof sub, "%s%s%s", rel, *rel ? "/" : "", e->d_name) < (int)sizeof sub)
            watch_add(sub, depth + 1, announce);
    }
    closedir(d);
}

static void watch_emit(char kind, const char *rel, const char *name)
{
    const char *sep = *rel && *name ? "/" : "";
    char head[32];
    int h = snprintf(head, sizeof head, "%c %zu\n", kind, strlen(rel) + strlen(sep) + strlen(name));
    write_all(1, head, (size_t)h, "stdout");
    write_all(1, rel, strlen(rel), "stdout");
    write_all(1, sep, strlen(sep), "stdout");
    write_all(1, name, strlen(name), "stdout");
}

/* Every event readable now; returns 0 once the watched directory itself is gone. */
static int watch_drain(void)
{
    static char buf[1 << 16] __attribute__((aligned(__alignof__(struct inotify_event))));
    for (;;) {
        ssize_t r = read(watch_ifd, buf, sizeof buf);
        if (r < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN) return 1;
            fail_errno(errno, "inotify");
        }
        for (char *p = buf; p < buf + r;) {
            struct inotify_event *ev = (struct inotify_event *)p;
            p += sizeof *ev + ev->len;
            if (ev->mask & IN_Q_OVERFLOW) { write_all(1, "O 0\n", 4, "stdout"); continue; }
            const char *rel = ev->wd >= 0 && ev->wd < WATCH_MAX ? watch_rel[ev->wd] : NULL;
            if (!rel) continue;
            const char *name = ev->len ? ev->name : "";
            if (ev->mask & IN_IGNORED) {
                free(watch_rel[ev->wd]);
                watch_rel[ev->wd] = NULL;
                if (!*rel) return 0;
                continue;
            }
            if (ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF)) {
                if (!*rel) watch_emit(ev->mask & IN_DELETE_SELF ? 'R' : 'N', "", "");
                continue;  /* a subdirectory's own going is its parent's event */
            }
            if (ev->mask & (IN_CREATE | IN_MOVED_TO)) {
                watch_emit('C', rel, name);
                if (watch_recursive && (ev->mask & IN_ISDIR)) {
                    char sub[8192];
                    if (snprintf(sub, sizeof sub, "%s%s%s", rel, *rel ? "/" : "", name) < (int)sizeof sub)
                        watch_add(sub, 1, 1);
                }
            }
            if (ev->mask & IN_MODIFY) watch_emit('W', rel, name);
            if (ev->mask & IN_ATTRIB) watch_emit('M', rel, name);
            if (ev->mask & IN_DELETE) watch_emit('R', rel, name);
            if (ev->mask & IN_MOVED_FROM) watch_emit('N', rel, name);
        }
    }
}

static void fs_watch(const char *path, int recursive)
{
    struct stat st;
    if (stat(path, &st) < 0) fail_errno(errno, path);
    if (!S_ISDIR(st.st_mode)) fail_errno(ENOTDIR, path);
    watch_ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (watch_ifd < 0) fail_errno(errno, path);
    watch_root = path;
    watch_recursive = recursive;
    watch_add("", 0, 0);
    write_all(1, "ok\n", 3, "stdout");
    struct pollfd fds[2] = {{.fd = watch_ifd, .events = POLLIN}, {.fd = 0, .events = POLLIN}};
    for (;;) {
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR) continue;
            fail_errno(errno, "poll");
        }
        if (fds[1].revents) {
            char asked[64];
            ssize_t r = read(0, asked, sizeof asked);
            if (r <= 0) return;  /* nobody listens any more */
            if (!watch_drain()) return;
            write_all(1, "F 0\n", 4, "stdout");
        } else if (fds[0].revents && !watch_drain()) {
            return;
        }
    }
}

static int mode_fs(struct opts *o)
{
    char **a = o->argv;
    int n = 0;
    while (a && a[n]) n++;
    if (n < 2) fail("setup", "fs: no operation");
    signal(SIGPIPE, SIG_IGN);
    enter(o);
    const char *op = a[0], *path = a[1];
    if (!strcmp(op, "read") && n == 2) fs_read(path);
    else if (!strcmp(op, "write") && n == 4) fs_write(path, (unsigned)strtoul(a[2], NULL, 8), a[3][0] == '1');
    else if (!strcmp(op, "list") && n == 2) fs_list(path);
    else if (!strcmp(op, "mkdir") && n == 3) fs_mkdir(path, a[2][0] == '1');
    else if (!strcmp(op, "rm") && n == 4) fs_rm(path, a[2][0] == '1', a[3][0] == '1');
    else if (!strcmp(op, "symlink") && n == 3) fs_symlink(path, a[2]);
    else if (!strcmp(op, "mv") && n == 3) fs_mv(path, a[2]);
    else if (!strcmp(op, "watch") && n == 3) fs_watch(path, a[2][0] == '1');
    else if (!strcmp(op, "meta") && n % 2 == 0) fs_set_meta(path, a + 2, n - 2);
    else fail("setup", "fs: bad operation %s", op);
    return 0;
}
