package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

// The exec agent (pid 10, an exec Nomad runs, tag "agent") runs a command (pid 11, tag "run",
// a child of the agent) whose bomb (12, 13) is its grandchildren; an ended command's bomb
// (tag "ended") hangs off the sandbox's init (pid 1).
var guardScan = []tagged{
	{pid: 10, ppid: 9, tag: "agent"},
	{pid: 11, ppid: 10, tag: "run"},
	{pid: 12, ppid: 11, tag: "run"},
	{pid: 13, ppid: 12, tag: "run"},
	{pid: 14, ppid: 12, tag: "run"},
	{pid: 20, ppid: 1, tag: "ended"},
	{pid: 21, ppid: 20, tag: "ended"},
}

func TestPidsGuardSparesACommandTheAgentRuns(t *testing.T) {
	// "run" has the most processes, but its command still runs under the live agent.
	if tag, n := busiestTag(guardScan, map[string]int{"agent": 10}); tag != "ended" || n != 2 {
		t.Fatalf("ended: got %q (%d), want the ended command's tag", tag, n)
	}
}

func TestPidsGuardEndsACommandWhoseAgentEnded(t *testing.T) {
	// No exec of Nomad's behind the agent's tag any more: its commands have no owner.
	if tag, n := busiestTag(guardScan, map[string]int{}); tag != "run" || n != 4 {
		t.Fatalf("got %q (%d), want run (4)", tag, n)
	}
}

func TestPidsGuardSparesNothingThroughARecycledPid(t *testing.T) {
	// The agent's exec ended and its pid 10 went to a process of the bomb (tag "ended") before
	// the entry was removed: that process's children are not a running exec's.
	scan := append([]tagged{}, guardScan[1:]...)
	scan = append(scan, tagged{pid: 10, ppid: 1, tag: "ended"})
	if tag, n := busiestTag(scan, map[string]int{"agent": 10}); tag != "run" || n != 4 {
		t.Fatalf("got %q (%d), want run (4)", tag, n)
	}
}

func TestPidsGuardReadsTagsAndParents(t *testing.T) {
	// A real process of ours: its tag from its environment, its parent from its stat (its
	// command's name holds a space and a parenthesis, as a tenant's may).
	dir := t.TempDir()
	sleeper := filepath.Join(dir, "a) b")
	if err := os.Symlink("/bin/sleep", sleeper); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(sleeper, "30")
	cmd.Env = []string{"A=1", tagEnv + "=t1", "B=2"}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	procs := filepath.Join(dir, "cgroup.procs")
	if err := os.WriteFile(procs, []byte(strconv.Itoa(cmd.Process.Pid)+"\n999999999\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got := scanTagged(procs)
	want := tagged{pid: cmd.Process.Pid, ppid: os.Getpid(), tag: "t1"}
	if len(got) != 1 || got[0] != want {
		t.Fatalf("got %+v, want [%+v]", got, want)
	}
}
