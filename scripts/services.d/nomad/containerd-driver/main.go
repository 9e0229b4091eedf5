// hutch-containerd: a Nomad task driver that runs each task as a containerd
// container (runc), from an OCI image, with exec through Nomad's alloc exec API.
//
// Written for hutch because the community containerd driver's Go module cannot be
// fetched from the module proxy this project builds from. It does what hutch's
// sandboxes need and what a Nomad task driver must do, nothing more:
//
//   - StartTask: pull the image (plain HTTP for a registry on loopback), create a
//     container with a new snapshot, and start it. The process runs as an
//     unprivileged uid with no capabilities, no_new_privs and containerd's default
//     seccomp profile narrowed to hutch's floor (seccomp.go), in new pid/ipc/uts/mount
//     namespaces and, unless the task asks
//     for the host's, a network namespace with only loopback. Memory, CPU (CFS
//     quota from millicores) and pids limits go to the container's cgroup.
//     A task without a CPU limit gets one CPU, never the whole client; /dev/shm is sized
//     inside the memory limit (limits.go).
//   - A per-allocation workspace directory on the host (workspace_root/<alloc id>)
//     is bind-mounted at the task's workspace path and owned by the task's uid.
//   - Nothing of Nomad's reaches the container: not its task dirs (/alloc, /local),
//     not /secrets (the Task API socket, the workload identity), not its NOMAD_*
//     environment; the task's stdout and stderr go to /dev/null, not a file on the
//     client's disk. A task on the bridge has no IPv6 and its own egress chain (network.go,
//     egress.go).
//   - ExecTaskStreaming: runs a process in the container. A command may start with
//     the envelope "hutch-exec:v1" followed by a JSON object {"env":[..],"cwd":".."}
//     so that environment and working directory reach the OCI process spec exactly
//     (the alloc exec API itself carries only argv). Cancelling the exec (the
//     websocket closing) kills the process and every descendant. With tty=true the
//     process runs on a pseudo-terminal of the container's own devpts, resized as
//     Nomad's tty_size messages say.
//   - RecoverTask reattaches to containers after a plugin or agent restart.
//   - An OOM kill (containerd's /tasks/oom event) is reported in the exit result.
package main

import (
	"context"

	log "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/plugins"
)

func main() {
	plugins.ServeCtx(func(ctx context.Context, logger log.Logger) interface{} {
		return NewDriver(ctx, logger)
	})
}
