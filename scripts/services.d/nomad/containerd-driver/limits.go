package main

// A sandbox's container gets the limits it is counted at, never none.

import (
	"context"
	"fmt"
	"strings"

	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/oci"
	"github.com/hashicorp/nomad/plugins/drivers"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

const (
	// A task that names no CPU still gets a quota: the hutch server's default (one CPU,
	// HUTCH_DEFAULT_CPU's), never the whole client.
	defaultCPUMillis = 1000
	cfsPeriod        = 100000
	// containerd's own /dev/shm size; a smaller memory limit makes it smaller.
	shmMaxBytes = 64 << 20
)

// sandboxLimits: memory (swap included, so a limit is a limit), a CPU quota and /dev/shm
// inside the memory limit. A task without a memory limit is refused: a sandbox never runs
// unlimited (Nomad always sets one from the task's MemoryMB).
func sandboxLimits(cfg *drivers.TaskConfig, tc TaskConfig) ([]oci.SpecOpts, error) {
	var memory int64
	if lr := cfg.Resources; lr != nil && lr.LinuxResources != nil {
		memory = lr.LinuxResources.MemoryLimitBytes
	}
	if memory <= 0 {
		return nil, fmt.Errorf("the task has no memory limit: a sandbox never runs unlimited")
	}
	cpu := tc.CPUMillis
	if cpu <= 0 {
		cpu = defaultCPUMillis
	}
	return []oci.SpecOpts{
		oci.WithMemoryLimit(uint64(memory)), withMemorySwap(memory),
		oci.WithCPUCFS(int64(cpu)*cfsPeriod/1000, cfsPeriod),
		withShmSize(min(memory, shmMaxBytes)),
	}, nil
}

func withMemorySwap(limit int64) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *specs.Spec) error {
		if s.Linux != nil && s.Linux.Resources != nil && s.Linux.Resources.Memory != nil {
			s.Linux.Resources.Memory.Swap = &limit
		}
		return nil
	}
}

// withShmSize sizes the /dev/shm tmpfs. Its pages are charged to the container's memory
// cgroup anyway; the size makes a full /dev/shm an ENOSPC before it is an OOM kill.
func withShmSize(bytes int64) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *specs.Spec) error {
		for i, m := range s.Mounts {
			if m.Destination != "/dev/shm" {
				continue
			}
			var options []string
			for _, o := range m.Options {
				if !strings.HasPrefix(o, "size=") {
					options = append(options, o)
				}
			}
			s.Mounts[i].Options = append(options, fmt.Sprintf("size=%dk", bytes>>10))
			return nil
		}
		return fmt.Errorf("the container spec has no /dev/shm to size")
	}
}
