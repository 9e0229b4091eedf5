package main

import (
	"bufio"
	"os"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// A command the API stopped reading (cancelled while its sandbox was frozen: the API kills it
// through the plugin and reads no more of its output) with its output window full ends in the
// agent too once the API says so ('D'): its pumps, its finish and its pipes, and its exit is
// sent. Before, its pump waited for acknowledgements no one would send, for the rest of the
// session, and the agent held the command (and its pipes) as running.
//
// No reaper here: one left running by this test would take the next test's children (reap_test.go).
func TestADroppedCommandWithItsWindowFullEnds(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	a := &agent{out: bufio.NewWriter(w), cmds: map[uint32]*command{}, pids: map[int]*command{}}
	exits := make(chan frame, 1)
	go func() { // reads everything the agent sends and acknowledges nothing
		for f := range frames(r) {
			if f.kind == 'X' {
				exits <- f
			}
		}
	}()
	time.Sleep(50 * time.Millisecond)
	before := runtime.NumGoroutine()
	a.start(9, startRequest{Argv: []string{"yes"}, Env: []string{"PATH=/usr/bin:/bin"}, Cwd: "/"})
	a.mu.Lock()
	c := a.cmds[9]
	a.mu.Unlock()
	if c == nil {
		t.Fatal("the command did not start")
	}
	for waited := 0; !c.out.blocked(); waited++ {
		if waited > 300 {
			t.Fatal("the command's output window did not fill within 3 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The plugin's kill verb, from outside the sandbox; then the exit, as the reaper sees it.
	_ = syscall.Kill(-c.pid, syscall.SIGKILL)
	var status syscall.WaitStatus
	if _, err := syscall.Wait4(c.pid, &status, 0, nil); err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	delete(a.pids, c.pid)
	a.mu.Unlock()
	go c.finish(status)
	time.Sleep(200 * time.Millisecond) // its output still waits for acknowledgements
	a.handle('D', 9, nil)
	select {
	case f := <-exits:
		if f.id != 9 {
			t.Fatalf("exit frame of command %d, want 9's", f.id)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("no exit within 3 s of the API dropping a command it killed: the agent still holds it")
	}
	a.mu.Lock()
	held := len(a.cmds)
	a.mu.Unlock()
	if held != 0 {
		t.Fatalf("the agent holds %d command(s) after the exit", held)
	}
	for waited := 0; runtime.NumGoroutine() > before; waited++ {
		if waited > 200 {
			buf := make([]byte, 1<<16)
			t.Fatalf("%d goroutines left, %d before the command:\n%s", runtime.NumGoroutine(), before,
				buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}
