// hutch-exec-agent runs commands inside one nomad sandbox for the API, so that a command costs
// a fork instead of a runc exec (about 45 ms each). The API starts it once per sandbox through
// an ordinary Nomad alloc exec, so it has exactly the sandbox's confinement (uid, capabilities,
// seccomp, cgroup, network namespace); the commands it forks inherit that confinement.
//
// Its stdin and stdout carry frames (drivers/nomad/agent.py is the other end): a 9-byte
// header (kind, command id as a big-endian uint32, payload length as a big-endian uint32) and
// the payload.
//
//	API -> agent: 'S' start (JSON startRequest), 'I' stdin bytes, 'E' stdin closed,
//	              'K' signal (one byte: its number), 'A' output acknowledged (uint32 bytes),
//	              'D' dropped: the API reads no more of the command (it killed it, or gave up
//	              waiting for its exit): it is killed, and its output is read and discarded
//	agent -> API: 'R' ready (JSON, id 0), 'P' started (JSON pid), '1' stdout, '2' stderr,
//	              'a' stdin consumed (uint32 bytes), 'X' exit (JSON exitReport),
//	              'H' heartbeat (id 0, every heartbeatEvery; JSON load: the commands it holds
//	              and its goroutines, so what a command leaves behind in it can be seen)
//
// Both directions are windowed per command (window bytes unacknowledged at most), so one
// slow command or slow reader never holds up another's frames. At the end of its stdin (the
// API's session is gone) the agent kills what it started and exits: no agent outlives its API.
package main

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

const (
	window  = 1 << 20 // bytes in flight per command and direction
	chunk   = 32 << 10
	tagEnv  = "HUTCH_EXEC_TAG" // the plugin's marker (containerd-driver/handle.go): its kill verb and pids guard see our commands too
	version = 1
	// Nomad 1.10's exec handler notices its websocket is gone only when the exec next writes
	// (command/agent/alloc_endpoint.go), and only then ends the exec (and this agent): an idle
	// agent writes a heartbeat so an API that died without closing its session is noticed.
	heartbeatEvery = 2 * time.Second
	reapEvery      = 2 * time.Second // the reaper's sweep, however its signals fared (reap)
)

// How many idle threads the agent makes as it starts (drivers/nomad/agents.py sets it from the
// sandbox's pids limit), and the most it makes whatever it is told.
const (
	spareEnv  = "HUTCH_EXEC_SPARE_THREADS"
	spareMost = 16
)

type startRequest struct {
	Argv  []string `json:"argv"`
	Env   []string `json:"env"`
	Cwd   string   `json:"cwd"`
	Tag   string   `json:"tag"`
	Stdin bool     `json:"stdin"`
	// Helper: argv is one of this binary's own helpers (helper.go), run as a command. Only
	// the API's start request says so: no command a sandbox's user runs can become one.
	Helper bool `json:"helper"`
}

type exitReport struct {
	Code   int    `json:"code"`
	Error  string `json:"error,omitempty"` // "cwd", "pids" (EAGAIN: no pid left) or "fork": the command did not start
	Reason string `json:"reason,omitempty"`
}

type agent struct {
	out  *bufio.Writer
	wmu  sync.Mutex
	mu   sync.Mutex
	cmds map[uint32]*command
	pids map[int]*command // running, by pid: the reaper's index
	// exited wakes the reaper: a command's pidfd became readable (watchExit), or, where the
	// kernel or the sandbox's seccomp has no pidfd_open, a SIGCHLD. Nil: the sweep only.
	exited chan os.Signal
	pidfds bool
}

func main() {
	if len(os.Args) > 0 && os.Args[0] == helperName { // one of the agent's commands (helper.go)
		os.Exit(helper(os.Args[1:]))
	}
	runtime.GOMAXPROCS(1) // few threads: each counts against the sandbox's pids limit
	if err := beyondReach(); err != nil {
		fmt.Fprintf(os.Stderr, "hutch-exec-agent: %v\n", err)
		os.Exit(1)
	}
	if len(os.Args) > 1 {
		_ = os.Remove(os.Args[1]) // the copy we were started from: nothing left in the sandbox's /tmp
	}
	spare, _ := strconv.Atoi(os.Getenv(spareEnv))
	spareThreads(min(max(spare, 0), spareMost))
	// No signal is ignored here: an ignored disposition would pass to the commands through exec.
	a := &agent{out: bufio.NewWriterSize(pollable(1, "stdout"), 64<<10), cmds: map[uint32]*command{}, pids: map[int]*command{}}
	// A command's exit is seen through its pidfd, in the runtime's poller (watchExit): os/signal
	// holds threads for good (its signal mask's, its receiver's; one thread fewer without it,
	// counted), each a pid of the sandbox, which a small pids limit has for spare threads
	// instead. SIGCHLD where there is no pidfd_open, asked for before the ready frame, so
	// before any command can be forked: a child's exit that came before the reaper goroutine
	// first ran was dropped by the runtime (no one had asked for the signal), and the command
	// stayed a zombie, never reported.
	a.exited = make(chan os.Signal, 16)
	if a.pidfds = pidfdsWork(); !a.pidfds {
		signal.Notify(a.exited, syscall.SIGCHLD)
	}
	go a.reap(a.exited)
	go a.heartbeat()
	ready, _ := json.Marshal(map[string]int{"pid": os.Getpid(), "version": version})
	a.send('R', 0, ready)
	a.read(bufio.NewReaderSize(pollable(0, "stdin"), 64<<10))
	a.killAll()
	os.Exit(0)
}

// beyondReach keeps the sandbox's own processes (same uid) out of the agent: every command's
// stdin, a tenant's secrets among them, passes through its memory, and it must be no easier a
// target than the commands themselves. Not dumpable: no ptrace attach, no /proc/<pid>/mem,
// maps, environ or fd. The API starts it from an execute-only file, which the kernel already
// execs not dumpable (so there is no window after the exec); this holds whatever started it.
// An attach made before (through a dumpable parent) would survive: then the agent refuses to run.
func beyondReach() error {
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_DUMPABLE, 0, 0); errno != 0 {
		return fmt.Errorf("prctl(PR_SET_DUMPABLE, 0): %v", errno)
	}
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return fmt.Errorf("reading /proc/self/status: %v", err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if tracer, ok := strings.CutPrefix(line, "TracerPid:"); ok && strings.TrimSpace(tracer) != "0" {
			return fmt.Errorf("traced by pid %s: not running", strings.TrimSpace(tracer))
		}
	}
	return nil
}

// pollable is fd made non-blocking, as a file the runtime's poller waits on: a read or write
// that has to wait parks its goroutine instead of holding a thread in the system call. The
// session's stdin, read all the time, held a thread for good (and a stdout write behind a slow
// reader one more), and each thread is a pid of the sandbox. What it frees (and watchExit
// frees) pays for the spare threads a small pids limit now gets (drivers/nomad/agents.py,
// spare_threads). Only the agent has these pipes.
func pollable(fd int, name string) *os.File {
	_ = syscall.SetNonblock(fd, true) // else as before: a blocking file, a thread in each wait
	return os.NewFile(uintptr(fd), name)
}

// spareThreads makes n OS threads now and leaves them idle. The runtime hands the agent's work
// to another thread whenever a goroutine sits in a system call (GOMAXPROCS=1: the one P is
// taken from it), and makes that thread when it has no idle one; it never ends an idle one. A
// thread is a pid of the sandbox: made lazily, the first one needed once a command had filled
// the pids limit (a fork bomb; a slow write under load) could not be made, and the runtime
// aborts then ("failed to create new OS thread"), taking every running command's session
// with it. Made now, the agent holds the threads it needs before its commands can take them.
func spareThreads(n int) {
	var locked, release sync.WaitGroup
	locked.Add(n)
	release.Add(1)
	for range n {
		go func() {
			// Locked, the goroutine keeps its thread while it waits: the next one needs another.
			runtime.LockOSThread()
			locked.Done()
			release.Wait()
			runtime.UnlockOSThread() // its thread goes idle, kept by the runtime
		}()
	}
	locked.Wait()
	release.Done()
}

func (a *agent) heartbeat() {
	for range time.Tick(heartbeatEvery) {
		a.send('H', 0, a.load())
	}
}

// load: the commands the agent holds (running, or their output not yet all sent) and its
// goroutines; both go back to what they were once its commands have ended.
func (a *agent) load() []byte {
	a.mu.Lock()
	held := len(a.cmds)
	a.mu.Unlock()
	b, _ := json.Marshal(map[string]int{"commands": held, "goroutines": runtime.NumGoroutine()})
	return b
}

// send writes one frame; a broken stdout means the API is gone.
func (a *agent) send(kind byte, id uint32, payload []byte) {
	var head [9]byte
	head[0] = kind
	binary.BigEndian.PutUint32(head[1:5], id)
	binary.BigEndian.PutUint32(head[5:9], uint32(len(payload)))
	a.wmu.Lock()
	defer a.wmu.Unlock()
	_, err := a.out.Write(head[:])
	if err == nil {
		_, err = a.out.Write(payload)
	}
	if err == nil {
		err = a.out.Flush()
	}
	if err != nil {
		a.killAll()
		os.Exit(0)
	}
}

func (a *agent) read(in *bufio.Reader) {
	var head [9]byte
	for {
		if _, err := io.ReadFull(in, head[:]); err != nil {
			return
		}
		id := binary.BigEndian.Uint32(head[1:5])
		payload := make([]byte, binary.BigEndian.Uint32(head[5:9]))
		if _, err := io.ReadFull(in, payload); err != nil {
			return
		}
		a.handle(head[0], id, payload)
	}
}

func (a *agent) handle(kind byte, id uint32, payload []byte) {
	if kind == 'S' {
		var req startRequest
		if err := json.Unmarshal(payload, &req); err != nil || len(req.Argv) == 0 {
			a.exit(id, exitReport{Code: -1, Error: "request", Reason: fmt.Sprintf("bad start request: %v", err)})
			return
		}
		a.start(id, req)
		return
	}
	a.mu.Lock()
	c := a.cmds[id]
	a.mu.Unlock()
	if c == nil {
		return // ended already: late stdin, acks or signals mean nothing
	}
	if c.stdin == nil && (kind == 'I' || kind == 'E') {
		return // started without stdin
	}
	switch kind {
	case 'I':
		c.stdin.push(payload)
	case 'E':
		c.stdin.close()
	case 'K':
		if len(payload) == 1 {
			c.signal(syscall.Signal(payload[0]))
		}
	case 'A':
		if len(payload) == 4 {
			c.out.release(int(binary.BigEndian.Uint32(payload)))
		}
	case 'D':
		c.drop()
	}
}

func (a *agent) exit(id uint32, r exitReport) {
	b, _ := json.Marshal(r)
	a.send('X', id, b)
}

func (a *agent) killAll() {
	a.mu.Lock()
	cmds := make([]*command, 0, len(a.cmds))
	for _, c := range a.cmds {
		cmds = append(cmds, c)
	}
	a.mu.Unlock()
	for _, c := range cmds { // signal takes the lock itself
		c.signal(syscall.SIGKILL)
	}
}

// sysPidfdOpen is pidfd_open(2)'s number (the same on amd64 and arm64).
const sysPidfdOpen = 434

// pidfdsWork says whether pidfd_open is there (Linux 5.3; a seccomp profile may refuse it).
func pidfdsWork() bool {
	fd, _, errno := syscall.RawSyscall(sysPidfdOpen, uintptr(os.Getpid()), 0, 0)
	if errno != 0 {
		return false
	}
	syscall.Close(int(fd))
	return true
}

// watchExit wakes the reaper once pid has exited: its pidfd turns readable then, and is waited
// on in the runtime's poller, not by a thread. A pid already reaped (ESRCH) wakes it at once.
func (a *agent) watchExit(pid int) {
	defer func() {
		select {
		case a.exited <- syscall.SIGCHLD:
		default: // the reaper has a wake-up pending already
		}
	}()
	fd, _, errno := syscall.RawSyscall(sysPidfdOpen, uintptr(pid), 0, 0)
	if errno != 0 || syscall.SetNonblock(int(fd), true) != nil {
		if errno == 0 {
			syscall.Close(int(fd))
		}
		return
	}
	f := os.NewFile(fd, "pidfd")
	defer f.Close()
	conn, err := f.SyscallConn()
	if err != nil {
		return
	}
	waited := false // f's first call says not yet: Read then waits for the pidfd to be readable
	_ = conn.Read(func(uintptr) bool {
		done := waited
		waited = true
		return done
	})
}

// reap waits for the commands' exits without a thread blocked per command: when woken (a
// command's pidfd, or SIGCHLD), and every reapEvery whatever came, every child that has exited.
// A wake-up is not a record: one lost (the drivers/nomad/helpers.py write that hung in CI: its
// helper a zombie nobody reported) costs reapEvery, not the command's whole wait.
func (a *agent) reap(exited <-chan os.Signal) {
	sweep := time.NewTicker(reapEvery)
	defer sweep.Stop()
	for {
		select {
		case <-exited:
		case <-sweep.C:
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if err != nil || pid <= 0 {
				break
			}
			a.mu.Lock()
			c := a.pids[pid]
			delete(a.pids, pid)
			a.mu.Unlock()
			if c != nil {
				go c.finish(status)
			}
		}
	}
}
