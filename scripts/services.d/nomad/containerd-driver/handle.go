package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/cio"
	"github.com/containerd/containerd/errdefs"
	cstructs "github.com/hashicorp/nomad/client/structs"
	"github.com/hashicorp/nomad/plugins/drivers"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

type taskHandle struct {
	d         *Driver
	cfg       *drivers.TaskConfig
	container containerd.Container
	task      containerd.Task
	workspace string
	disk      string // its limited file system (disk.go), if any
	startedAt time.Time

	mu          sync.Mutex
	state       drivers.TaskState
	exitResult  *drivers.ExitResult
	completedAt time.Time
	done        chan struct{}
	execSeq     int
	tagged      map[string]*taggedExec
	exits       exitRecords // what tagged execs ended with (exits.go)

	egressMu sync.Mutex   // one rules change at a time (egress.go)
	egress   *egressRules // the rules in force; nil: no outbound network, nothing to change
}

type taggedExec struct {
	pid    int
	killed bool
}

// freeze pauses (true) or resumes (false) every process of the container. Idempotent.
func (h *taskHandle) freeze(on bool) error {
	ctx := h.d.nsCtx(context.Background())
	st, err := h.task.Status(ctx)
	if err != nil {
		return fmt.Errorf("reading task status: %v", err)
	}
	// Anything but the wanted state (a freeze may be half done: "pausing") gets the call.
	switch {
	case on && st.Status != containerd.Paused:
		return h.task.Pause(ctx)
	case !on && st.Status != containerd.Running:
		return h.task.Resume(ctx)
	}
	return nil
}

// killTagged kills what carries tag: a running exec's process tree and every process with the
// tag in its environment (killExec); with no exec of ours behind the tag (a command the
// sandbox's exec agent forked, the agent ended or not answering), those processes of the
// container alone, in rounds until none is left (killContained). Done from the host, so a
// sandbox at its pids limit, where no process can start, is no obstacle. False if nothing
// carried the tag.
func (h *taskHandle) killTagged(tag string) bool {
	h.mu.Lock()
	t, ok := h.tagged[tag]
	if ok {
		t.killed = true
	}
	h.mu.Unlock()
	if !ok {
		return h.killContained(tag) > 0
	}
	h.killExec(tag, t.pid)
	return true
}

// tagEnv marks every process an exec started (see exec).
const tagEnv = "HUTCH_EXEC_TAG"

func newTaskHandle(d *Driver, cfg *drivers.TaskConfig, c containerd.Container, t containerd.Task, workspace string) *taskHandle {
	return &taskHandle{
		d: d, cfg: cfg, container: c, task: t, workspace: workspace,
		startedAt: time.Now().Round(time.Millisecond),
		state:     drivers.TaskStateRunning,
		done:      make(chan struct{}),
		tagged:    map[string]*taggedExec{},
	}
}

func (h *taskHandle) watch(exitC <-chan containerd.ExitStatus) {
	status := <-exitC
	code, _, err := status.Result()
	result := &drivers.ExitResult{ExitCode: int(code), Err: err}
	if code > 128 && code < 160 {
		result.Signal = int(code) - 128
	}
	if h.d.oomCount(h.container.ID()) > 0 {
		result.OOMKilled = true
	}
	h.mu.Lock()
	h.state = drivers.TaskStateExited
	h.exitResult = result
	h.completedAt = time.Now()
	h.mu.Unlock()
	close(h.done)
}

func (h *taskHandle) running() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.state == drivers.TaskStateRunning
}

func (h *taskHandle) result() *drivers.ExitResult {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.exitResult.Copy()
}

func (h *taskHandle) status() *drivers.TaskStatus {
	h.mu.Lock()
	defer h.mu.Unlock()
	return &drivers.TaskStatus{
		ID:          h.cfg.ID,
		Name:        h.cfg.Name,
		State:       h.state,
		StartedAt:   h.startedAt,
		CompletedAt: h.completedAt,
		ExitResult:  h.exitResult.Copy(),
		DriverAttributes: map[string]string{
			"container_id": h.container.ID(),
		},
	}
}

// stats reports the container's memory use from its cgroup (v1 or v2) so Nomad's
// allocation stats are meaningful; CPU is left to Nomad's defaults.
func (h *taskHandle) stats(ctx context.Context, interval time.Duration, ch chan<- *cstructs.TaskResourceUsage) {
	defer close(ch)
	timer := time.NewTimer(0)
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.done:
			return
		case <-timer.C:
			timer.Reset(interval)
		}
		usage := &cstructs.TaskResourceUsage{
			ResourceUsage: &cstructs.ResourceUsage{
				MemoryStats: &cstructs.MemoryStats{Measured: []string{"Usage"}},
				CpuStats:    &cstructs.CpuStats{},
			},
			Timestamp: time.Now().UTC().UnixNano(),
		}
		if used, ok := h.memoryUsage(); ok {
			usage.ResourceUsage.MemoryStats.Usage = used
		}
		select {
		case <-ctx.Done():
			return
		case ch <- usage:
		}
	}
}

// usage is what the container used so far (cpu seconds, peak memory bytes) and what it holds
// now (memory bytes, of which page cache), from its cgroup; absent values are left out.
func (h *taskHandle) usage() map[string]float64 {
	return cgroupUsage("/sys/fs/cgroup", h.d.config.Namespace, h.container.ID())
}

// cgroupUsage reads a container's cgroup under root: v1 (cpuacct, memory hierarchies) or v2
// (cpu.stat, memory.peak, memory.current, memory.stat).
func cgroupUsage(root, ns, id string) map[string]float64 {
	out := map[string]float64{}
	read := func(path string) (float64, bool) {
		b, err := os.ReadFile(path)
		if err != nil {
			return 0, false
		}
		v, err := strconv.ParseFloat(strings.Fields(string(b) + " 0")[0], 64)
		return v, err == nil
	}
	field := func(path, name string) (float64, bool) {
		b, err := os.ReadFile(path)
		if err != nil {
			return 0, false
		}
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[0] == name {
				v, err := strconv.ParseFloat(f[1], 64)
				return v, err == nil
			}
		}
		return 0, false
	}
	v1, v2 := filepath.Join(root, "memory", ns, id), filepath.Join(root, ns, id)
	if v, ok := read(filepath.Join(root, "cpuacct", ns, id, "cpuacct.usage")); ok {
		out["cpuSeconds"] = v / 1e9
	} else if v, ok := field(filepath.Join(v2, "cpu.stat"), "usage_usec"); ok {
		out["cpuSeconds"] = v / 1e6
	}
	if v, ok := read(filepath.Join(v1, "memory.max_usage_in_bytes")); ok {
		out["memoryPeakBytes"] = v
	} else if v, ok := read(filepath.Join(v2, "memory.peak")); ok {
		out["memoryPeakBytes"] = v
	}
	// Held now and its page cache, as the local driver reads them (drivers/local/cgroups.py).
	if v, ok := read(filepath.Join(v1, "memory.usage_in_bytes")); ok {
		if c, ok := field(filepath.Join(v1, "memory.stat"), "total_cache"); ok {
			out["memoryBytes"], out["memoryCacheBytes"] = v, c
		}
	} else if v, ok := read(filepath.Join(v2, "memory.current")); ok {
		if c, ok := field(filepath.Join(v2, "memory.stat"), "file"); ok {
			out["memoryBytes"], out["memoryCacheBytes"] = v, c
		}
	}
	return out
}

func (h *taskHandle) memoryUsage() (uint64, bool) {
	ns := h.d.config.Namespace
	for _, p := range []string{
		filepath.Join("/sys/fs/cgroup/memory", ns, h.container.ID(), "memory.usage_in_bytes"),
		filepath.Join("/sys/fs/cgroup", ns, h.container.ID(), "memory.current"),
	} {
		if b, err := os.ReadFile(p); err == nil {
			if v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err == nil {
				return v, true
			}
		}
	}
	return 0, false
}

// exec runs a process in the container and returns its exit. Cancelling ctx kills the
// process and its descendants; the result is then an exit by SIGKILL. With term, the
// process runs on a pseudo-terminal (its output, stderr included, comes on stdout).
func (h *taskHandle) exec(ctx context.Context, command []string, stdin io.Reader, stdout, stderr io.Writer, term *terminal) (*drivers.ExitResult, error) {
	envelope, argv, err := parseEnvelope(command)
	if err != nil {
		return nil, err
	}
	if len(argv) == 0 {
		return nil, fmt.Errorf("empty command")
	}
	nsctx := h.d.nsCtx(context.Background()) // outlives ctx: cleanup must run after a cancel
	spec, err := h.container.Spec(nsctx)
	if err != nil {
		return nil, fmt.Errorf("reading container spec: %v", err)
	}
	pspec := *spec.Process
	pspec.Terminal = term != nil
	pspec.Args = argv
	if envelope != nil && envelope.NoStdin {
		stdin = nil // an empty reader below: end of file at once
	}
	if envelope != nil {
		pspec.Env = envelope.Env
		if envelope.Cwd != "" {
			pspec.Cwd = envelope.Cwd
		}
		if envelope.Tag != "" {
			// Inherited by every descendant, orphans reparented to pid 1 included: what a
			// cancel or timeout kills (killTagged), as the local driver kills a cgroup leaf.
			pspec.Env = append(append([]string{}, pspec.Env...), tagEnv+"="+envelope.Tag)
		}
		if term != nil && envelope.TtySize != nil {
			pspec.ConsoleSize = &specs.Box{Height: uint(envelope.TtySize.Height), Width: uint(envelope.TtySize.Width)}
		}
	}
	h.mu.Lock()
	h.execSeq++
	execID := fmt.Sprintf("exec-%d-%d", time.Now().UnixNano(), h.execSeq)
	h.mu.Unlock()

	// The shim keeps the process's stdin open until told: at our reader's EOF, CloseIO.
	if stdin == nil {
		stdin = bytes.NewReader(nil)
	}
	if term != nil {
		term.in, term.flush, term.done = stdin, make(chan chan struct{}), make(chan struct{})
		defer close(term.done)
		stdin = term
	}
	closer := &stdinCloser{r: stdin}
	outTail, errTail := &tailWriter{w: stdout}, &tailWriter{w: stderr}
	streams := []cio.Opt{cio.WithStreams(closer, outTail, errTail)}
	diag, nl := stderr, "\n" // where the plugin's own words about the command go
	if term != nil {
		// runc makes the terminal inside the container (its devpts) and the shim copies it
		// to stdout; closing stdin (CloseIO below) makes the shim close it: a hangup.
		streams = append(streams, cio.WithTerminal)
		diag, nl = stdout, "\r\n" // a terminal has one screen, and ours bypasses its line discipline
	}
	ioCreator := cio.NewCreator(streams...)
	process, err := h.task.Exec(nsctx, execID, &pspec, ioCreator)
	if err != nil {
		return nil, fmt.Errorf("creating exec process: %v", err)
	}
	defer func() {
		if _, err := process.Delete(nsctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			h.d.logger.Warn("deleting exec process", "exec", execID, "error", err)
		}
	}()
	exitC, err := process.Wait(nsctx)
	if err != nil {
		return nil, fmt.Errorf("waiting on exec process: %v", err)
	}
	oomBefore := h.d.oomCount(h.container.ID())
	if err := process.Start(nsctx); err != nil {
		msg := err.Error()
		switch {
		case strings.Contains(msg, "cwd"):
			return nil, fmt.Errorf("working directory %s does not exist or is not a directory", pspec.Cwd)
		case strings.Contains(msg, "executable file not found") || strings.Contains(msg, "no such file or directory"):
			fmt.Fprintf(diag, "%s: command not found%s", argv[0], nl)
			return &drivers.ExitResult{ExitCode: 127}, nil
		case strings.Contains(msg, "permission denied"):
			fmt.Fprintf(diag, "%s: permission denied%s", argv[0], nl)
			return &drivers.ExitResult{ExitCode: 126}, nil
		}
		return nil, fmt.Errorf("starting exec process: %v", err)
	}
	// Only now: the shim drops a CloseIO that comes before the process starts, and a command
	// given no stdin (or a short one) would then wait for input for ever.
	closer.setClose(func() { _ = process.CloseIO(nsctx, containerd.WithStdinCloser) })
	if term != nil {
		// The caller waits for a first frame to know the terminal is up (an error before
		// this closes the stream instead): one byte on stderr, which the command never has.
		_, _ = stderr.Write([]byte{0})
		go term.resizes(nsctx, process)
	}
	pid := int(process.Pid())
	if envelope != nil && envelope.Tag != "" {
		h.mu.Lock()
		h.tagged[envelope.Tag] = &taggedExec{pid: pid}
		h.mu.Unlock()
		defer func() {
			h.mu.Lock()
			delete(h.tagged, envelope.Tag)
			h.mu.Unlock()
		}()
	}

	var status containerd.ExitStatus
	select {
	case status = <-exitC:
	case <-ctx.Done():
		if envelope != nil && envelope.Tag != "" {
			h.killExec(envelope.Tag, pid)
		} else {
			killTree(pid)
		}
		_ = process.Kill(nsctx, syscall.SIGKILL)
		status = <-exitC
		killTree(pid) // children that were forking while we looked
	}
	// stdin the command did not read: taken and dropped, so Nomad's side of the exec stream,
	// still sending it, is not left blocked (it then aborts the stream, and the exit is lost).
	go func() { _, _ = io.Copy(io.Discard, closer.r) }()
	// Output already written sits in the fifos and is still being copied out, as fast as the
	// exec stream takes it (a 30 MiB export behind a slow reader holds a fifo's worth and more
	// when the command exits). Background children may hold the fifos open for ever, so stop
	// once the copy sits idle, blocked reading an empty fifo, for drainGrace (or drainMax
	// after the exit): never while bytes still move, or the output loses its tail.
	drained := make(chan struct{})
	go func() { process.IO().Wait(); close(drained) }()
	moved := int64(-1)
	deadline := time.Now().Add(drainMax)
	for waiting := true; waiting; {
		select {
		case <-drained:
			waiting = false
		case <-time.After(drainGrace):
			out, outBusy := outTail.progress()
			errN, errBusy := errTail.progress()
			idle := out+errN == moved && !outBusy && !errBusy
			if idle || time.Now().After(deadline) {
				process.IO().Cancel()
				waiting = false
			}
			moved = out + errN
		}
	}
	code, _, err := status.Result()
	if err != nil {
		return nil, err
	}
	result := &drivers.ExitResult{ExitCode: int(code)}
	if code > 128 && code < 160 {
		result.Signal = int(code) - 128
	}
	if code == 137 && h.d.oomCount(h.container.ID()) > oomBefore {
		result.OOMKilled = true
	}
	if envelope != nil && envelope.Tag != "" {
		h.exits.put(envelope.Tag, result, outTail, errTail)
	}
	return result, nil
}

var signals = map[string]syscall.Signal{
	"SIGHUP": syscall.SIGHUP, "SIGINT": syscall.SIGINT, "SIGQUIT": syscall.SIGQUIT,
	"SIGKILL": syscall.SIGKILL, "SIGUSR1": syscall.SIGUSR1, "SIGUSR2": syscall.SIGUSR2,
	"SIGTERM": syscall.SIGTERM, "SIGSTOP": syscall.SIGSTOP, "SIGCONT": syscall.SIGCONT,
}

func signalByName(name string) (syscall.Signal, bool) {
	name = strings.ToUpper(name)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	s, ok := signals[name]
	return s, ok
}

// limitedBuffer keeps the first 1 MiB written to it (script check output).
type limitedBuffer struct{ bytes.Buffer }

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := 1<<20 - b.Len(); room > 0 {
		if len(p) > room {
			b.Buffer.Write(p[:room])
		} else {
			b.Buffer.Write(p)
		}
	}
	return len(p), nil
}

// stdinCloser tells the shim to close the process's stdin once the reader is drained
// (the process may be created after the copy already hit EOF: then at setClose).
type stdinCloser struct {
	r     io.Reader
	mu    sync.Mutex
	eof   bool
	close func()
	done  bool
}

func (s *stdinCloser) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err == io.EOF {
		s.mu.Lock()
		s.eof = true
		s.fire()
		s.mu.Unlock()
	}
	return n, err
}

func (s *stdinCloser) setClose(f func()) {
	s.mu.Lock()
	s.close = f
	s.fire()
	s.mu.Unlock()
}

func (s *stdinCloser) fire() {
	if s.eof && s.close != nil && !s.done {
		s.done = true
		go s.close()
	}
}

// terminal is what a tty exec adds: the window's size, as the client changes it. Nomad hands
// resizes and input over apart (a channel and a pipe), so input waits in Read until the
// resizes sent before it are applied: a command typed after a resize sees the new size.
type terminal struct {
	resize <-chan drivers.TerminalSize
	in     io.Reader
	flush  chan chan struct{}
	done   chan struct{} // closed when the exec returns
}

func (t *terminal) Read(p []byte) (int, error) {
	n, err := t.in.Read(p)
	ack := make(chan struct{})
	select {
	case t.flush <- ack:
		<-ack
	case <-t.done:
	}
	return n, err
}

// resizes applies the resizes to process until the exec returns, and those already sent
// whenever input is on its way.
func (t *terminal) resizes(ctx context.Context, process containerd.Process) {
	apply := func(size drivers.TerminalSize) { _ = process.Resize(ctx, uint32(size.Width), uint32(size.Height)) }
	for {
		select {
		case size := <-t.resize:
			apply(size)
		case ack := <-t.flush:
			for pending := true; pending; {
				select {
				case size := <-t.resize:
					apply(size)
				default:
					pending = false
				}
			}
			close(ack)
		case <-t.done:
			return
		}
	}
}
