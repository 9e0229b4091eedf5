package main

import (
	"sync"
	"time"

	"github.com/hashicorp/nomad/plugins/drivers"
)

// Why this file exists: Nomad 1.10's HTTP exec handler (command/agent/alloc_endpoint.go)
// forwards the websocket's input to the client on one goroutine and the client's frames
// back on another, and checks for an input error before reading each frame. When a
// command exits while its stdin is still streaming in (`head -c 10` fed 1 GiB), the next
// stdin frame meets the closed RPC pipe, and the handler may close the websocket before
// it has passed on the exit frame and the last output. So the plugin keeps, for a while,
// what every tagged exec ended with: its exit and the tail of each output stream, with
// byte counts, and the `{"exit": tag}` verb hands it out. The caller knows how many bytes
// it received and takes the rest from the tail.

const (
	exitTailBytes = 256 << 10       // per stream: more than Nomad buffers between frames
	exitKeep      = 2 * time.Minute // how long an ended exec's record is kept
	exitMaxKept   = 512             // per task: the oldest go first
)

// tailWriter passes writes on and counts them, keeping the last exitTailBytes.
type tailWriter struct {
	w       interface{ Write([]byte) (int, error) }
	mu      sync.Mutex
	total   int64
	tail    []byte
	writing int // writes under way: the stream is taking them (a slow reader), not idle
}

func (t *tailWriter) Write(p []byte) (int, error) {
	t.mu.Lock()
	// Counted whether or not the stream took them: bytes Nomad's side refused are exactly
	// the ones the caller must recover.
	t.total += int64(len(p))
	t.tail = append(t.tail, p...)
	if len(t.tail) > 2*exitTailBytes {
		t.tail = append([]byte(nil), t.tail[len(t.tail)-exitTailBytes:]...)
	}
	t.writing++
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		t.writing--
		t.mu.Unlock()
	}()
	return t.w.Write(p)
}

// progress is how many bytes passed so far, and whether a write is under way (blocked on a
// slow reader downstream: output is still moving even if the count stands still).
func (t *tailWriter) progress() (int64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.total, t.writing > 0
}

func (t *tailWriter) snapshot() streamEnd {
	t.mu.Lock()
	defer t.mu.Unlock()
	tail := t.tail
	if len(tail) > exitTailBytes {
		tail = tail[len(tail)-exitTailBytes:]
	}
	return streamEnd{Total: t.total, Tail: append([]byte(nil), tail...)}
}

type streamEnd struct {
	Total int64  `json:"total"`
	Tail  []byte `json:"tail"` // base64 in JSON
}

// execEnd is what the exit verb answers.
type execEnd struct {
	ExitCode  int       `json:"exitCode"`
	Signal    int       `json:"signal"`
	OOMKilled bool      `json:"oomKilled"`
	Stdout    streamEnd `json:"stdout"`
	Stderr    streamEnd `json:"stderr"`
	at        time.Time
}

type exitRecords struct {
	mu   sync.Mutex
	ends map[string]*execEnd
}

func (r *exitRecords) put(tag string, res *drivers.ExitResult, stdout, stderr *tailWriter) {
	end := &execEnd{ExitCode: res.ExitCode, Signal: res.Signal, OOMKilled: res.OOMKilled,
		Stdout: stdout.snapshot(), Stderr: stderr.snapshot(), at: time.Now()}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ends == nil {
		r.ends = map[string]*execEnd{}
	}
	var oldest string
	for t, e := range r.ends {
		if time.Since(e.at) > exitKeep {
			delete(r.ends, t)
		} else if oldest == "" || e.at.Before(r.ends[oldest].at) {
			oldest = t
		}
	}
	if len(r.ends) >= exitMaxKept && oldest != "" {
		delete(r.ends, oldest)
	}
	r.ends[tag] = end
}

// get hands out what the tagged exec ended with; nil if unknown or still running. Not once:
// an answer lost with a broken exec stream is asked for again. Records go after exitKeep,
// or the oldest when exitMaxKept are held.
func (r *exitRecords) get(tag string) *execEnd {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ends[tag]
}
