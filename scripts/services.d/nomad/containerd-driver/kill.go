package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// How the plugin kills what an exec started (killTagged, the pids guard): by its process tree
// and by the tag every process of it carries (tagEnv), from the host.

// killRounds bounds a kill's scans; a scan that finds none ends it sooner.
const killRounds = 200

// killExec kills everything an exec started: its tree, and every process carrying its tag
// (background children that outlived their parent and were reparented to pid 1, which a
// walk of the tree no longer finds). Scans repeat until one finds none: a process forked
// between a scan and its kills carries the tag too and dies in the next round, so even a
// fork bomb ends. No freeze: the container's other commands run on meanwhile (a frozen
// container refuses new execs).
func (h *taskHandle) killExec(tag string, pid int) {
	killTree(pid)
	for round := 0; round < killRounds; round++ {
		if killMarked(tag) == 0 {
			return
		}
		time.Sleep(5 * time.Millisecond) // let the killed die (a zombie keeps its environ no more)
	}
}

// killContained is killExec's rounds over the container's own processes (its pids cgroup's):
// a tag no exec of ours carries reaches no further. How many it killed.
func (h *taskHandle) killContained(tag string) int {
	killed := 0
	for round := 0; round < killRounds; round++ {
		procs, err := os.ReadFile(h.pidsFile("cgroup.procs"))
		if err != nil {
			h.d.logger.Warn("listing the container's processes", "container", h.container.ID(), "error", err)
			return killed
		}
		n := killMarkedAmong(tag, strings.Fields(string(procs)))
		if n == 0 {
			return killed
		}
		killed += n
		time.Sleep(5 * time.Millisecond)
	}
	return killed
}

// killMarked SIGKILLs every process carrying tag in its environment; how many it killed.
func killMarked(tag string) int {
	entries, _ := os.ReadDir("/proc")
	pids := make([]string, 0, len(entries))
	for _, e := range entries {
		pids = append(pids, e.Name())
	}
	return killMarkedAmong(tag, pids)
}

// killMarkedAmong is killMarked over pids (names in /proc; any other name is skipped).
func killMarkedAmong(tag string, pids []string) int {
	marker := []byte(tagEnv + "=" + tag + "\x00")
	found := 0
	for _, name := range pids {
		p, err := strconv.Atoi(name)
		if err != nil {
			continue
		}
		if env, err := os.ReadFile(filepath.Join("/proc", name, "environ")); err == nil && bytes.Contains(env, marker) {
			if syscall.Kill(p, syscall.SIGKILL) == nil {
				found++
			}
		}
	}
	return found
}

// killTree SIGKILLs pid's descendants (host pids, read from /proc), then pid.
func killTree(pid int) {
	if pid <= 0 {
		return
	}
	children := map[int][]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(s[i+1:])
		if len(fields) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(fields[1])
		children[ppid] = append(children[ppid], p)
	}
	var victims []int
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		victims = append(victims, p)
		queue = append(queue, children[p]...)
	}
	for i := len(victims) - 1; i >= 0; i-- {
		_ = syscall.Kill(victims[i], syscall.SIGKILL)
	}
}
