package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// A fork bomb left running in the background by a command that itself ended (`b(){ b | b &
// }; b; exit`) holds the container at its pids limit for ever: no later exec can fork, so
// the sandbox is unusable until destroyed. The guard watches the container's pids cgroup
// and OOM kills: when forks have been refused at the limit (pids.events "max" grew) or the
// memory limit's OOM killer struck in two consecutive
// seconds, the tag of an ended exec with the most live processes is ended whole (killExec:
// every process carrying its tag). A running exec is left to its timeout or a cancel (it
// still has an owner). A single burst that hits the limit once is left alone.
// The local driver does the same with its execution leaves (LocalDriver._guard_pids).

const pidsGuardPeriod = time.Second

func (h *taskHandle) guardPids() {
	events, procs := h.pidsFile("pids.events"), h.pidsFile("cgroup.procs")
	ticker := time.NewTicker(pidsGuardPeriod)
	defer ticker.Stop()
	last, lastOOMs, rising := forkRefusals(events), h.d.oomCount(h.container.ID()), 0
	for {
		select {
		case <-h.done:
			return
		case <-ticker.C:
		}
		// Refused forks, or OOM kills (a bomb that reaches the memory limit before the pids
		// limit churns there instead: the OOM killer takes its processes, never init).
		now, ooms := forkRefusals(events), h.d.oomCount(h.container.ID())
		if now > last || ooms > lastOOMs {
			rising++
		} else {
			rising = 0
		}
		last, lastOOMs = now, ooms
		if rising < 2 {
			continue
		}
		rising = 0
		h.mu.Lock()
		running := map[string]bool{}
		for tag := range h.tagged {
			running[tag] = true
		}
		h.mu.Unlock()
		if tag, n := busiestTag(procs, running); tag != "" {
			h.d.logger.Warn("the sandbox is held at its pids or memory limit: ending the exec that fills it",
				"container", h.container.ID(), "tag", tag, "processes", n)
			h.endFrozen(tag)
		}
	}
}

// pidsFile is the path of a file of the container's pids cgroup (v1, else v2: one file tree).
func (h *taskHandle) pidsFile(name string) string {
	v1 := filepath.Join("/sys/fs/cgroup/pids", h.d.config.Namespace, h.container.ID())
	if _, err := os.Stat(v1); err == nil {
		return filepath.Join(v1, name)
	}
	return filepath.Join("/sys/fs/cgroup", h.d.config.Namespace, h.container.ID(), name)
}

func forkRefusals(events string) int64 {
	b, err := os.ReadFile(events)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "max" {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n
		}
	}
	return 0
}

// busiestTag is the exec tag (tagEnv) most of the cgroup's processes carry, spared ones aside.
func busiestTag(procs string, spared map[string]bool) (string, int) {
	b, err := os.ReadFile(procs)
	if err != nil {
		return "", 0
	}
	counts := map[string]int{}
	prefix := []byte(tagEnv + "=")
	for _, pid := range strings.Fields(string(b)) {
		env, err := os.ReadFile(filepath.Join("/proc", pid, "environ"))
		if err != nil {
			continue
		}
		for _, kv := range bytes.Split(env, []byte{0}) {
			if bytes.HasPrefix(kv, prefix) {
				counts[string(kv[len(prefix):])]++
				break
			}
		}
	}
	best, most := "", 0
	for tag, n := range counts {
		if n > most && !spared[tag] {
			best, most = tag, n
		}
	}
	return best, most
}

// endFrozen kills every process carrying tag with the container frozen, so none can fork
// between the scan and its kill (a bomb re-forks faster than a scan-and-kill loop catches
// it); the killed die when thawed. Then killExec's loop catches anything left.
func (h *taskHandle) endFrozen(tag string) {
	if err := h.freeze(true); err == nil {
		killMarked(tag)
		if err := h.freeze(false); err != nil {
			h.d.logger.Warn("thawing after the pids guard", "container", h.container.ID(), "error", err)
		}
	}
	h.killExec(tag, 0)
}
