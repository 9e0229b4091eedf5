package main

// The agent's own file helpers, for what no runtime ships a tool for (the E2B wire's file
// metadata and directory watches; drivers/nomad/helpers.py is the other end). A start request
// marked "helper" runs this binary again (/proc/self/exe: the agent's file is unlinked, its
// inode is not) with argv[0] helperName, as an ordinary command of the agent: the sandbox's
// uid and confinement, its tag, its windows. The helper never runs as the agent itself.
//
//	meta PATH KEY VALUE...   the file's user.e2b.* xattrs become exactly these pairs
//	xattrs PATH              the user.e2b.* pairs of PATH (a directory: of each entry), as
//	                         records "<name-len> <meta-len>\n<name><key>\0<value>\0..."
//	disk PATH LIMITED        the disk the sandbox's files take, as JSON {"used", "total"} (diskUsage)
//	watch PATH RECURSIVE     inotify, as hutch-nsexec's fs watch (drivers/local/native/fileops.h):
//	                         "ok\n", then "<kind> <name-len>\n<name>" records (C W R N M), "O 0\n"
//	                         on an overflow; a byte on stdin asks for every event queued so far,
//	                         answered "F 0\n" after them
//
// A failure is "hutch-fs: errno N PATH" on stderr and exit 3.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"
)

const (
	helperName = "hutch-exec-agent-helper"
	metaPrefix = "user.e2b."
	watchMax   = 8192 // watched directories of one watch, as the local helper's
	watchMask  = syscall.IN_CREATE | syscall.IN_MODIFY | syscall.IN_ATTRIB | syscall.IN_DELETE |
		syscall.IN_MOVED_FROM | syscall.IN_MOVED_TO | syscall.IN_DELETE_SELF | syscall.IN_MOVE_SELF |
		syscall.IN_ONLYDIR | syscall.IN_DONT_FOLLOW
)

func helper(args []string) int {
	runtime.GOMAXPROCS(1)
	if len(args) < 2 {
		return fail(syscall.EINVAL, "")
	}
	op, path := args[0], args[1]
	switch {
	case op == "meta" && len(args)%2 == 0:
		return setMeta(path, args[2:])
	case op == "xattrs" && len(args) == 2:
		return listMeta(path)
	case op == "watch" && len(args) == 3:
		return watch(path, args[2] == "1")
	case op == "disk" && len(args) == 3:
		return diskUsage(path, args[2] == "1")
	}
	return fail(syscall.EINVAL, path)
}

func fail(err error, path string) int {
	errno, ok := err.(syscall.Errno)
	if !ok {
		if pe, isPath := err.(*os.PathError); isPath {
			errno, ok = pe.Err.(syscall.Errno)
		}
	}
	if !ok {
		errno = syscall.EIO
	}
	fmt.Fprintf(os.Stderr, "hutch-fs: errno %d %s\n", int(errno), path)
	return 3
}

func xattrCall(trap uintptr, path string, a, b, c uintptr) (int, error) {
	p, err := syscall.BytePtrFromString(path)
	if err != nil {
		return 0, err
	}
	n, _, e := syscall.Syscall6(trap, uintptr(unsafe.Pointer(p)), a, b, c, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// names lists path's extended attributes without following a symlink.
func names(path string) ([]string, error) {
	buf := make([]byte, 65536)
	n, err := xattrCall(syscall.SYS_LLISTXATTR, path, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), 0)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, name := range bytes.Split(buf[:n], []byte{0}) {
		if bytes.HasPrefix(name, []byte(metaPrefix)) {
			out = append(out, string(name))
		}
	}
	return out, nil
}

func setMeta(path string, pairs []string) int {
	old, err := names(path)
	if err != nil {
		return fail(err, path)
	}
	for _, name := range old {
		k, _ := syscall.BytePtrFromString(name)
		if _, err := xattrCall(syscall.SYS_LREMOVEXATTR, path, uintptr(unsafe.Pointer(k)), 0, 0); err != nil {
			return fail(err, path)
		}
	}
	for i := 0; i+1 < len(pairs); i += 2 {
		k, err := syscall.BytePtrFromString(metaPrefix + pairs[i])
		if err != nil {
			return fail(syscall.EINVAL, path)
		}
		v := append([]byte(pairs[i+1]), 0)
		if _, err := xattrCall(syscall.SYS_LSETXATTR, path, uintptr(unsafe.Pointer(k)),
			uintptr(unsafe.Pointer(&v[0])), uintptr(len(v)-1)); err != nil {
			return fail(err, path)
		}
	}
	return 0
}

// pairsOf is path's metadata as "key\0value\0" pairs (a value holding a NUL left out, as the
// local helper does: it could not be told apart).
func pairsOf(path string) []byte {
	found, err := names(path)
	if err != nil {
		return nil
	}
	var out []byte
	value := make([]byte, 4096)
	for _, name := range found {
		k, _ := syscall.BytePtrFromString(name)
		n, err := xattrCall(syscall.SYS_LGETXATTR, path, uintptr(unsafe.Pointer(k)), uintptr(unsafe.Pointer(&value[0])),
			uintptr(len(value)))
		if err != nil || bytes.IndexByte(value[:n], 0) >= 0 {
			continue
		}
		out = append(append(append(out, name[len(metaPrefix):]...), 0), value[:n]...)
		out = append(out, 0)
	}
	return out
}

func listMeta(path string) int {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return fail(err, path)
	}
	out := os.Stdout
	record := func(name, full string) {
		var lst syscall.Stat_t
		if syscall.Lstat(full, &lst) != nil || lst.Mode&syscall.S_IFMT == syscall.S_IFLNK {
			return
		}
		if meta := pairsOf(full); len(meta) > 0 {
			fmt.Fprintf(out, "%d %d\n%s%s", len(name), len(meta), name, meta)
		}
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		record(filepath.Base(path), path)
		return 0
	}
	dir, err := os.Open(path)
	if err != nil {
		return fail(err, path)
	}
	defer dir.Close()
	entries, _ := dir.Readdirnames(-1)
	for _, name := range entries {
		record(name, filepath.Join(path, name))
	}
	return 0
}

type watcher struct {
	fd        int
	root      string
	recursive bool
	rel       map[int]string // by watch descriptor: the directory's path below root
}

func watch(path string, recursive bool) int {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return fail(err, path)
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		return fail(syscall.ENOTDIR, path)
	}
	fd, err := syscall.InotifyInit1(syscall.IN_NONBLOCK | syscall.IN_CLOEXEC)
	if err != nil {
		return fail(err, path)
	}
	w := &watcher{fd: fd, root: path, recursive: recursive, rel: map[int]string{}}
	if err := w.add("", 0, false); err != nil {
		return fail(err, path)
	}
	if !emit([]byte("ok\n")) {
		return 0
	}
	fds := [2]pollFd{{fd: int32(fd), events: pollIn}, {fd: 0, events: pollIn}}
	asked := make([]byte, 64)
	for {
		fds[0].revents, fds[1].revents = 0, 0
		_, _, e := syscall.Syscall(syscall.SYS_POLL, uintptr(unsafe.Pointer(&fds[0])), 2, ^uintptr(0))
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			return fail(e, "poll")
		}
		if fds[1].revents != 0 {
			if n, _ := syscall.Read(0, asked); n <= 0 {
				return 0 // nobody listens any more
			}
			more, err := w.drain()
			if err != nil {
				return fail(err, "inotify")
			}
			if !more || !emit([]byte("F 0\n")) {
				return 0
			}
		} else if fds[0].revents != 0 {
			if more, err := w.drain(); err != nil || !more {
				return 0
			}
		}
	}
}

const pollIn = 0x1

type pollFd struct {
	fd      int32
	events  int16
	revents int16
}

// emit writes all of b to stdout; false once nobody reads it.
func emit(b []byte) bool {
	for len(b) > 0 {
		n, err := syscall.Write(1, b)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return false
		}
		b = b[n:]
	}
	return true
}

func record(kind byte, rel, name string) bool {
	full := rel
	if rel != "" && name != "" {
		full += "/"
	}
	full += name
	return emit([]byte(string(kind) + " " + strconv.Itoa(len(full)) + "\n" + full))
}

// add watches root/rel (and, recursive, the directories below it); only the root's own
// failure, or the kernel's watch limit, is an error. announce: a directory that came after
// the watch began (made, or moved in): what it holds already was made before its own watch
// existed, so no event of it can come; it is told as made (and written, a file with bytes)
// instead, its subdirectories likewise. A change racing the scan may be told twice; none is
// missed (the local driver's helper does the same: fileops.h).
func (w *watcher) add(rel string, depth int, announce bool) error {
	full := w.root
	if rel != "" {
		full = filepath.Join(w.root, rel)
	}
	wd, err := syscall.InotifyAddWatch(w.fd, full, watchMask)
	if err != nil {
		if rel == "" || err == syscall.ENOSPC {
			return err
		}
		return nil // raced away, or not ours to read
	}
	if _, ok := w.rel[wd]; !ok {
		if len(w.rel) >= watchMax {
			return syscall.ENOSPC
		}
		w.rel[wd] = rel
	}
	if !w.recursive || depth > 64 {
		return nil
	}
	dir, err := os.Open(full)
	if err != nil {
		return nil
	}
	entries, _ := dir.ReadDir(-1)
	dir.Close()
	for _, e := range entries {
		if announce {
			record('C', rel, e.Name())
			if e.Type().IsRegular() {
				if info, err := e.Info(); err == nil && info.Size() > 0 {
					record('W', rel, e.Name())
				}
			}
		}
		if e.IsDir() {
			if err := w.add(filepath.Join(rel, e.Name()), depth+1, announce); err != nil && err == syscall.ENOSPC {
				return err
			}
		}
	}
	return nil
}

// drain reports every event readable now; false once the watched directory itself is gone.
func (w *watcher) drain() (bool, error) {
	buf := make([]byte, 1<<16)
	for {
		n, err := syscall.Read(w.fd, buf)
		if err == syscall.EINTR {
			continue
		}
		if err == syscall.EAGAIN {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		for p := 0; p+syscall.SizeofInotifyEvent <= n; {
			ev := (*syscall.InotifyEvent)(unsafe.Pointer(&buf[p]))
			nameBytes := buf[p+syscall.SizeofInotifyEvent : p+syscall.SizeofInotifyEvent+int(ev.Len)]
			p += syscall.SizeofInotifyEvent + int(ev.Len)
			name := string(bytes.TrimRight(nameBytes, "\x00"))
			if ev.Mask&syscall.IN_Q_OVERFLOW != 0 {
				if !emit([]byte("O 0\n")) {
					return false, nil
				}
				continue
			}
			rel, ok := w.rel[int(ev.Wd)]
			if !ok {
				continue
			}
			if ev.Mask&syscall.IN_IGNORED != 0 {
				delete(w.rel, int(ev.Wd))
				if rel == "" {
					return false, nil
				}
				continue
			}
			if ev.Mask&(syscall.IN_DELETE_SELF|syscall.IN_MOVE_SELF) != 0 {
				if rel == "" {
					kind := byte('N')
					if ev.Mask&syscall.IN_DELETE_SELF != 0 {
						kind = 'R'
					}
					record(kind, "", "")
				}
				continue // a subdirectory's own going is its parent's event
			}
			sent := true
			if ev.Mask&(syscall.IN_CREATE|syscall.IN_MOVED_TO) != 0 {
				sent = record('C', rel, name)
				if w.recursive && ev.Mask&syscall.IN_ISDIR != 0 {
					if err := w.add(filepath.Join(rel, name), 1, true); err != nil {
						return false, err
					}
				}
			}
			for _, k := range []struct {
				mask uint32
				kind byte
			}{{syscall.IN_MODIFY, 'W'}, {syscall.IN_ATTRIB, 'M'}, {syscall.IN_DELETE, 'R'}, {syscall.IN_MOVED_FROM, 'N'}} {
				if sent && ev.Mask&k.mask != 0 {
					sent = record(k.kind, rel, name)
				}
			}
			if !sent {
				return false, nil
			}
		}
	}
}

// diskUsage: what the sandbox's files take and the size of the file system they are on. With
// a disk limit (limited) the workspace at home and the container's writable layer share one
// file system of that size (containerd-driver/disk.go): its own counts say both. Without, the
// workspace (a directory of the client's disk) is walked whole, and of the root file system
// (an overlay) only what the writable layer holds: the inodes changed since the sandbox
// started (a copy-up or a new file sets ctime, which no call of the sandbox can set back),
// the image's own files older than that.
func diskUsage(home string, limited bool) int {
	var hs syscall.Statfs_t
	if err := syscall.Statfs(home, &hs); err != nil {
		return fail(err, home)
	}
	out := map[string]uint64{}
	if limited {
		out["used"] = (hs.Blocks - hs.Bfree) * uint64(hs.Frsize)
		out["total"] = hs.Blocks * uint64(hs.Frsize)
	} else {
		var rs syscall.Statfs_t
		if err := syscall.Statfs("/", &rs); err != nil {
			return fail(err, "/")
		}
		started, err := sandboxStart()
		if err != nil {
			return fail(err, "/proc/1/stat")
		}
		out["used"] = walkBytes(home, 0) + walkBytes("/", started)
		out["total"] = rs.Blocks * uint64(rs.Frsize)
	}
	b, _ := json.Marshal(out)
	if !emit(b) {
		return 3
	}
	return 0
}

// walkBytes sums the blocks of the inodes under root on root's own file system (each counted
// once) whose ctime is at or after since (Unix seconds; 0: all).
func walkBytes(root string, since int64) uint64 {
	var rst syscall.Stat_t
	if syscall.Lstat(root, &rst) != nil {
		return 0
	}
	seen := map[uint64]bool{}
	var total uint64
	_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		var st syscall.Stat_t
		if err != nil || syscall.Lstat(path, &st) != nil {
			return nil // raced away, or not the sandbox's to read
		}
		if st.Dev != rst.Dev {
			if d.IsDir() {
				return filepath.SkipDir // another mount (/proc, /dev, the workspace): not this layer
			}
			return nil
		}
		if st.Ctim.Sec >= since && !seen[st.Ino] {
			seen[st.Ino] = true
			total += uint64(st.Blocks) * 512
		}
		return nil
	})
	return total
}

// sandboxStart is when the sandbox's pid 1 started, in Unix seconds (a second early: ctime
// and the boot clock are read at different resolutions).
func sandboxStart() (int64, error) {
	stat, err := os.ReadFile("/proc/1/stat")
	if err != nil {
		return 0, err
	}
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	if len(fields) < 20 {
		return 0, syscall.EINVAL
	}
	ticks, err := strconv.ParseInt(fields[19], 10, 64) // starttime: field 22 of the whole line
	if err != nil {
		return 0, err
	}
	procStat, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(procStat), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			boot, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, err
			}
			return boot + ticks/100 - 1, nil // USER_HZ is 100 on Linux
		}
	}
	return 0, syscall.EINVAL
}
