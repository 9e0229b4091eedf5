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
// still has an owner): one Nomad runs (h.tagged), and one the sandbox's exec agent runs
// (itself one of ours, its commands its children: spareRunning). A single burst that hits
// the limit once is left alone.
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
		running := map[string]int{}
		for tag, t := range h.tagged {
			running[tag] = t.pid
		}
		h.mu.Unlock()
		if tag, n := busiestTag(scanTagged(procs), running); tag != "" {
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

// tagged is a process of the container that carries an exec tag (tagEnv), and its parent.
type tagged struct {
	pid, ppid int
	tag       string
}

// scanTagged reads the container's processes that carry a tag (those that cleared their
// environment escape it: docs/isolation.md).
func scanTagged(procs string) []tagged {
	b, err := os.ReadFile(procs)
	if err != nil {
		return nil
	}
	var out []tagged
	prefix := []byte(tagEnv + "=")
	for _, field := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(field)
		if err != nil {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", field, "environ"))
		if err != nil {
			continue // gone, or a zombie: nothing of it runs
		}
		ppid := parentOf(field)
		for _, kv := range bytes.Split(env, []byte{0}) {
			if bytes.HasPrefix(kv, prefix) {
				out = append(out, tagged{pid: pid, ppid: ppid, tag: string(kv[len(prefix):])})
				break
			}
		}
	}
	return out
}

// parentOf is the parent pid (as the host sees it) of a process; 0 if unknown.
func parentOf(pid string) int {
	stat, err := os.ReadFile(filepath.Join("/proc", pid, "stat"))
	if err != nil {
		return 0
	}
	// "pid (comm) state ppid ...": comm may hold spaces and parentheses, the last ')' ends it.
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	if len(fields) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(fields[1])
	return ppid
}

// spareRunning is the tags that belong to a running exec: those of the execs Nomad runs
// (running: tag -> the exec's process), and those of the processes whose parent is one of
// those execs' own process, alive and still carrying its tag: the commands the sandbox's
// exec agent (an exec of ours) runs, each its child until it ends. Once a command ends, what
// it left in the background is reparented to the sandbox's init (the agent is no subreaper),
// so an ended command's bomb is not spared. The tag check guards against a recycled pid: an
// exec that ended leaves its pid free before its entry goes, and a process of the sandbox
// that got it would otherwise spare its own children's tags.
func spareRunning(ps []tagged, running map[string]int) map[string]bool {
	spared := map[string]bool{}
	live := map[int]bool{}
	for tag := range running {
		spared[tag] = true
	}
	for _, p := range ps {
		if pid, ok := running[p.tag]; ok && pid == p.pid {
			live[p.pid] = true
		}
	}
	for _, p := range ps {
		if live[p.ppid] {
			spared[p.tag] = true
		}
	}
	return spared
}

// busiestTag is the exec tag most of the processes carry, a running exec's aside.
func busiestTag(ps []tagged, running map[string]int) (string, int) {
	spared := spareRunning(ps, running)
	counts := map[string]int{}
	for _, p := range ps {
		counts[p.tag]++
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
