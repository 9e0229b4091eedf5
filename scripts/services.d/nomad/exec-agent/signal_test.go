package main

import (
	"bufio"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// A 'K' (signal) frame for a command already reaped reaches no one: once reaped, its pid (and
// so its process group id) may be another process's. Before, the agent sent the signal to that
// group all the same, as it would 'D' before it was guarded (drop). The reuse is made here by
// pointing the reaped command's pid at another process group, which must not get the signal.
//
// No reaper here: one left running by this test would take the next test's children (reap_test.go).
func TestASignalForAReapedCommandReachesNoOne(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	go func() { // reads everything the agent sends
		for range frames(r) {
		}
	}()
	a := &agent{out: bufio.NewWriter(w), cmds: map[uint32]*command{}, pids: map[int]*command{}}
	a.start(7, startRequest{Argv: []string{"true"}, Env: []string{"PATH=/usr/bin:/bin"}, Cwd: "/"})
	a.mu.Lock()
	c := a.cmds[7]
	a.mu.Unlock()
	if c == nil {
		t.Fatal("the command did not start")
	}
	// Reaped, as the reaper does it; its finish not yet run, so the agent still holds it.
	var status syscall.WaitStatus
	if _, err := syscall.Wait4(c.pid, &status, 0, nil); err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	delete(a.pids, c.pid)
	a.mu.Unlock()

	other := exec.Command("sleep", "30") // the process its group id now names
	other.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Process.Kill(); _, _ = other.Process.Wait() }()
	c.pid = other.Process.Pid

	a.handle('K', 7, []byte{byte(syscall.SIGTERM)})
	ended := make(chan error, 1)
	go func() { _, err := other.Process.Wait(); ended <- err }()
	select {
	case <-ended:
		t.Fatal("a signal for a reaped command ended the process that took its group id")
	case <-time.After(300 * time.Millisecond):
	}

	// A command not yet reaped still gets its signal.
	a.start(8, startRequest{Argv: []string{"sleep", "30"}, Env: []string{"PATH=/usr/bin:/bin"}, Cwd: "/"})
	a.mu.Lock()
	live := a.cmds[8]
	a.mu.Unlock()
	if live == nil {
		t.Fatal("the second command did not start")
	}
	a.handle('K', 8, []byte{byte(syscall.SIGTERM)})
	if _, err := syscall.Wait4(live.pid, &status, 0, nil); err != nil {
		t.Fatal(err)
	}
	if !status.Signaled() || status.Signal() != syscall.SIGTERM {
		t.Fatalf("the running command's status: %v, want ended by SIGTERM", status)
	}
	a.mu.Lock()
	delete(a.pids, live.pid)
	a.mu.Unlock()
}
