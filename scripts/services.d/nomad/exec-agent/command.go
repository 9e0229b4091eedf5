package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// After a command's exit, its output is read on while bytes still move: background children
// may hold the pipes open for ever, so reading stops once they sit idle for drainGrace (the
// plugin's exec does the same: containerd-driver/handle.go).
const drainGrace = 50 * time.Millisecond

type command struct {
	a        *agent
	id       uint32
	tag      string
	pid      int
	stdin    *inbox
	out      *credit
	pipes    []*os.File
	moved    atomic.Int64 // output bytes read so far
	pumps    sync.WaitGroup
	finished chan struct{}
}

func (a *agent) start(id uint32, req startRequest) {
	if st, err := os.Stat(req.Cwd); err != nil || !st.IsDir() {
		a.exit(id, exitReport{Code: -1, Error: "cwd", Reason: req.Cwd})
		return
	}
	path, code := "/proc/self/exe", 0 // a helper: this binary again (helper.go)
	if req.Helper {
		req.Argv = append([]string{helperName}, req.Argv...)
	} else {
		path, code = lookPath(req.Argv[0], req.Env, req.Cwd)
	}
	if code != 0 {
		word := map[int]string{126: "permission denied", 127: "command not found"}[code]
		a.send('2', id, []byte(req.Argv[0]+": "+word+"\n"))
		a.exit(id, exitReport{Code: code})
		return
	}
	c := &command{a: a, id: id, tag: req.Tag, out: newCredit(), finished: make(chan struct{})}
	files, err := c.openPipes(req.Stdin)
	if err != nil {
		a.exit(id, exitReport{Code: -1, Error: "fork", Reason: err.Error()})
		return
	}
	env := append(append([]string{}, req.Env...), tagEnv+"="+req.Tag)
	attr := &syscall.ProcAttr{Dir: req.Cwd, Env: env, Files: fds(files), Sys: &syscall.SysProcAttr{Setpgid: true}}
	// Counted before the fork: a command that exits at once is finished (by the reaper) only
	// after its pumps have read its output.
	c.pumps.Add(2)
	// Held from the fork to the registration, so the reaper cannot miss a command that exits at once.
	a.mu.Lock()
	pid, err := syscall.ForkExec(path, req.Argv, attr)
	if err == nil {
		c.pid = pid
		a.cmds[id] = c
		a.pids[pid] = c
	}
	a.mu.Unlock()
	for _, f := range files {
		f.Close() // the child's ends
	}
	if err != nil {
		c.closeAll()
		switch {
		case errors.Is(err, syscall.ENOENT):
			a.send('2', id, []byte(req.Argv[0]+": command not found\n"))
			a.exit(id, exitReport{Code: 127})
		case errors.Is(err, syscall.EACCES):
			a.send('2', id, []byte(req.Argv[0]+": permission denied\n"))
			a.exit(id, exitReport{Code: 126})
		case errors.Is(err, syscall.EAGAIN):
			// The sandbox's pids limit: the API waits for a pid and asks again. Not "fork": its
			// old way, a runc exec, joins the sandbox's cgroup and clones in it (more pids than
			// this fork), and at the limit Nomad dropped its stream without a word.
			a.exit(id, exitReport{Code: -1, Error: "pids", Reason: err.Error()})
		default: // ENOMEM: the API runs it the old way, which reports it
			a.exit(id, exitReport{Code: -1, Error: "fork", Reason: err.Error()})
		}
		return
	}
	if a.pidfds {
		go a.watchExit(pid)
	}
	started, _ := json.Marshal(map[string]int{"pid": pid})
	a.send('P', id, started)
	go c.pump('1', c.pipes[0])
	go c.pump('2', c.pipes[1])
	if c.stdin != nil {
		go c.stdin.feed(c)
	}
}

// openPipes makes the command's stdout, stderr and (with stdin) stdin pipes: our ends in
// c.pipes / c.stdin, the child's returned (stdin first: /dev/null without stdin).
func (c *command) openPipes(withStdin bool) ([]*os.File, error) {
	var child []*os.File
	if withStdin {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		c.stdin = newInbox(w)
		child = append(child, r)
	} else {
		null, err := os.Open(os.DevNull)
		if err != nil {
			return nil, err
		}
		child = append(child, null)
	}
	for range 2 {
		r, w, err := os.Pipe()
		if err != nil {
			closeFiles(child)
			c.closeAll()
			return nil, err
		}
		c.pipes = append(c.pipes, r)
		child = append(child, w)
	}
	return child, nil
}

func fds(files []*os.File) []uintptr {
	out := make([]uintptr, len(files))
	for i, f := range files {
		out[i] = f.Fd()
	}
	return out
}

func closeFiles(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

func (c *command) closeAll() {
	closeFiles(c.pipes)
	if c.stdin != nil {
		c.stdin.close()
	}
}

// lookPath finds argv0 on the command's own PATH (not the agent's); 127 if it is nowhere,
// 126 if it is there but not executable.
func lookPath(argv0 string, env []string, cwd string) (string, int) {
	if strings.Contains(argv0, "/") {
		p := argv0
		if !filepath.IsAbs(p) {
			p = filepath.Join(cwd, p)
		}
		return p, 0 // ForkExec tells a missing or non-executable file apart
	}
	path := ""
	for _, kv := range env {
		if strings.HasPrefix(kv, "PATH=") {
			path = kv[5:]
		}
	}
	denied := false
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, argv0)
		if !filepath.IsAbs(p) {
			p = filepath.Join(cwd, p)
		}
		st, err := os.Stat(p)
		if err != nil || st.IsDir() {
			continue
		}
		if syscall.Access(p, 1) == nil {
			return p, 0
		}
		denied = true
	}
	if denied {
		return "", 126
	}
	return "", 127
}

// pump copies one output pipe to frames, within the command's output window.
func (c *command) pump(kind byte, r *os.File) {
	defer c.pumps.Done()
	buf := make([]byte, chunk)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			wanted := c.out.acquire(n)
			c.moved.Add(int64(n))
			if wanted {
				c.a.send(kind, c.id, append([]byte(nil), buf[:n]...))
			}
		}
		if err != nil {
			return
		}
	}
}

// finish: the command exited with status; its output is read to the end (or until idle),
// then its exit is sent.
func (c *command) finish(status syscall.WaitStatus) {
	done := make(chan struct{})
	go func() { c.pumps.Wait(); close(done) }()
	last := int64(-1)
	for waiting := true; waiting; {
		select {
		case <-done:
			waiting = false
		case <-time.After(drainGrace):
			if now := c.moved.Load(); now == last && !c.out.blocked() && c.pipesEmpty() {
				for _, p := range c.pipes {
					_ = p.SetReadDeadline(time.Now())
				}
			} else {
				last = now
			}
		}
	}
	closeFiles(c.pipes)
	if c.stdin != nil {
		c.stdin.close()
	}
	c.a.mu.Lock()
	delete(c.a.cmds, c.id)
	c.a.mu.Unlock()
	close(c.finished)
	code := status.ExitStatus()
	if status.Signaled() {
		code = 128 + int(status.Signal())
	}
	c.a.exit(c.id, exitReport{Code: code})
}

// pipesEmpty: nothing is waiting in the output pipes (a pump not yet scheduled to read what a
// command wrote just before its exit must not lose it to the idle cut-off).
func (c *command) pipesEmpty() bool {
	for _, p := range c.pipes {
		raw, err := p.SyscallConn()
		if err != nil {
			continue
		}
		n := 0
		_ = raw.Control(func(fd uintptr) {
			_, _, _ = syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCINQ, uintptr(unsafe.Pointer(&n)))
		})
		if n > 0 {
			return false
		}
	}
	return true
}

// signal sends sig to the command's process group while it is not yet reaped (as drop: once
// reaped its pid, and so its group id, may be another process's, which a late 'K' would hit);
// SIGKILL also ends every process carrying its tag (those that left the group), scanning until
// none is left. The lock is held across the kill: the reaper forgets the pid under it.
func (c *command) signal(sig syscall.Signal) {
	c.a.mu.Lock()
	if c.a.pids[c.pid] == c {
		_ = syscall.Kill(-c.pid, sig)
	}
	c.a.mu.Unlock()
	if sig == syscall.SIGKILL {
		c.killTagged()
	}
}

func (c *command) killTagged() {
	if c.tag == "" {
		return
	}
	go func() {
		for round := 0; round < 50 && killMarked(c.tag) > 0; round++ {
			time.Sleep(10 * time.Millisecond)
		}
	}()
}

// drop: the API reads no more of the command ('D': it was cancelled while its sandbox was
// frozen, killed from outside, or its exit did not come in time). Nothing will acknowledge
// its output again, so its window is opened for good and what is left is read and discarded:
// otherwise its pump waited for acknowledgements for the rest of the session, and the agent
// held the command, its pipes and its end. What is still running of it is killed (its group
// only while it is not yet reaped: its pid may be another's after). As in signal, the lock is
// held across the kill: checked, released, then killed, a reap in between let the group id
// pass to another command of the sandbox, which the kill then hit.
func (c *command) drop() {
	c.out.discard()
	c.signal(syscall.SIGKILL)
}

func killMarked(tag string) int {
	marker := []byte(tagEnv + "=" + tag + "\x00")
	entries, _ := os.ReadDir("/proc")
	killed := 0
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err == nil && bytes.Contains(env, marker) {
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				killed++
			}
		}
	}
	return killed
}

// credit is a command's output window: bytes sent and not yet acknowledged by the API.
type credit struct {
	mu       sync.Mutex
	cond     *sync.Cond
	inflight int
	waiting  int
	dropped  bool // the API reads no more (drop): nothing is sent, nothing waits
}

func newCredit() *credit {
	c := &credit{}
	c.cond = sync.NewCond(&c.mu)
	return c
}

// acquire waits for room for n bytes in the window; false once the output is dropped (not to
// be sent).
func (c *credit) acquire(n int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.inflight >= window && !c.dropped {
		c.waiting++
		c.cond.Wait()
		c.waiting--
	}
	if c.dropped {
		return false
	}
	c.inflight += n
	return true
}

func (c *credit) discard() {
	c.mu.Lock()
	c.dropped = true
	c.mu.Unlock()
	c.cond.Broadcast()
}

func (c *credit) release(n int) {
	c.mu.Lock()
	c.inflight -= n
	c.mu.Unlock()
	c.cond.Broadcast()
}

func (c *credit) blocked() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.waiting > 0
}

// inbox is a command's stdin: what the API sent (within its window), written to the pipe in
// order by feed, each piece acknowledged once written (or dropped, once the command stopped
// reading), so the API may send more.
type inbox struct {
	mu     sync.Mutex
	cond   *sync.Cond
	queue  [][]byte
	closed bool
	w      *os.File
}

func newInbox(w *os.File) *inbox {
	in := &inbox{w: w}
	in.cond = sync.NewCond(&in.mu)
	return in
}

func (in *inbox) push(b []byte) {
	in.mu.Lock()
	in.queue = append(in.queue, b)
	in.mu.Unlock()
	in.cond.Signal()
}

func (in *inbox) close() {
	in.mu.Lock()
	in.closed = true
	in.mu.Unlock()
	in.cond.Signal()
}

func (in *inbox) feed(c *command) {
	broken := false
	for {
		in.mu.Lock()
		for len(in.queue) == 0 && !in.closed {
			in.cond.Wait()
		}
		if len(in.queue) == 0 {
			in.mu.Unlock()
			in.w.Close()
			return
		}
		b := in.queue[0]
		in.queue = in.queue[1:]
		in.mu.Unlock()
		if !broken {
			if _, err := in.w.Write(b); err != nil {
				broken = true // the command closed its stdin or ended: the rest is dropped
				in.w.Close()
			}
		}
		var ack [4]byte
		binary.BigEndian.PutUint32(ack[:], uint32(len(b)))
		c.a.send('a', c.id, ack[:])
	}
}
