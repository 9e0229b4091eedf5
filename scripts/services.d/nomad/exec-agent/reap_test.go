package main

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"io"
	"os"
	"testing"
	"time"
)

type frame struct {
	kind    byte
	id      uint32
	payload []byte
}

// frames reads what the agent sends from r.
func frames(r io.Reader) <-chan frame {
	out := make(chan frame, 64)
	go func() {
		defer close(out)
		var head [9]byte
		for {
			if _, err := io.ReadFull(r, head[:]); err != nil {
				return
			}
			payload := make([]byte, binary.BigEndian.Uint32(head[5:9]))
			if _, err := io.ReadFull(r, payload); err != nil {
				return
			}
			out <- frame{head[0], binary.BigEndian.Uint32(head[1:5]), payload}
		}
	}()
	return out
}

// A command whose SIGCHLD nobody received (it exited before the agent listened, as the first
// command of a fresh agent could, its reaper goroutine not yet run) is still reported: the
// reaper's sweep finds it. Before the sweep it stayed a zombie and its exit never came.
func TestAnExitWhoseSignalWasLostIsStillReported(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	a := &agent{out: bufio.NewWriter(w), cmds: map[uint32]*command{}, pids: map[int]*command{}}
	got := frames(r)
	a.start(7, startRequest{Argv: []string{"sh", "-c", "exit 5"}, Env: []string{"PATH=/usr/bin:/bin"}, Cwd: "/"})
	time.Sleep(200 * time.Millisecond)          // it has exited: a zombie, its signal gone to no one
	go a.reap(make(chan os.Signal))             // no signal comes: only the sweep can see it
	deadline := time.After(3 * 2 * time.Second) // reapEvery, three times over
	for {
		select {
		case f, ok := <-got:
			if !ok {
				t.Fatal("the agent's output ended")
			}
			if f.kind != 'X' {
				continue
			}
			var report exitReport
			if err := json.Unmarshal(f.payload, &report); err != nil || f.id != 7 || report.Code != 5 {
				t.Fatalf("exit frame %d %q (%v), want command 7's exit 5", f.id, f.payload, err)
			}
			return
		case <-deadline:
			t.Fatal("no exit frame within 6 s of a command that exited")
		}
	}
}
