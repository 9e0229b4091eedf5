package main

// The sandbox's seccomp profile: containerd's default (an allow-list of system calls,
// EPERM for the rest), narrowed the way the local driver's filter is
// (drivers/local/native/hutch-nsexec.c), so a sandbox meets one security floor
// whichever driver runs it.

import (
	"context"
	"runtime"

	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/contrib/seccomp"
	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// socket() and socketpair() take an allow-list of address families: local sockets, IP
// (inside the sandbox's own network namespace) and netlink. Every other family answers
// EAFNOSUPPORT, as on a kernel built without it: AF_VSOCK (no network namespace confines
// it: it reaches the hypervisor host's services), AF_PACKET, and the rarely used families
// whose modules the kernel autoloads (RDS, TIPC, KCM, ALG, AX25, X25, ...).
var socketFamiliesAllowed = []uint64{unix.AF_UNIX, unix.AF_INET, unix.AF_INET6, unix.AF_NETLINK}

// Calls taken out of containerd's default allow-list: the socket calls get the family
// rules below instead; socketcall (the i386 multiplexer) hides its arguments in memory
// where no filter can read them, so it is refused outright (EPERM, the default);
// io_uring does its I/O outside the system calls the filter sees (ENOSYS, as on the local
// driver: libraries fall back to epoll).
var nativeArch = map[string]specs.Arch{"amd64": specs.ArchX86_64, "arm64": specs.ArchAARCH64}

var removedCalls = map[string]bool{
	"socket": true, "socketpair": true, "socketcall": true,
	"io_uring_setup": true, "io_uring_enter": true, "io_uring_register": true,
}

func withSandboxSeccomp() oci.SpecOpts {
	return func(ctx context.Context, client oci.Client, c *containers.Container, s *specs.Spec) error {
		if err := seccomp.WithDefaultProfile()(ctx, client, c, s); err != nil {
			return err
		}
		profile := s.Linux.Seccomp
		// The native ABI only, as on the local driver (libseccomp kills a foreign one): on an
		// i386 or x32 ABI, libseccomp filters socket() through the socketcall multiplexer,
		// whose arguments no filter can read, so the family rules below cannot hold there.
		if native, ok := nativeArch[runtime.GOARCH]; ok {
			profile.Architectures = []specs.Arch{native}
		}
		var kept []specs.LinuxSyscall
		for _, rule := range profile.Syscalls {
			var names []string
			for _, name := range rule.Names {
				if !removedCalls[name] {
					names = append(names, name)
				}
			}
			if len(names) > 0 {
				rule.Names = names
				kept = append(kept, rule)
			}
		}
		profile.Syscalls = append(kept, socketFamilyRules()...)
		profile.Syscalls = append(profile.Syscalls, errnoRule(unix.ENOSYS, "io_uring_setup", "io_uring_enter", "io_uring_register"))
		return nil
	}
}

func errnoRule(errno unix.Errno, names ...string) specs.LinuxSyscall {
	ret := uint(errno)
	return specs.LinuxSyscall{Names: names, Action: specs.ActErrno, ErrnoRet: &ret}
}

// One rule per comparison: the rules of a call are ORed (runc splits several comparisons
// of one argument into separate rules anyway). The family is an int but the filter sees
// the whole 64-bit register: values with high bits set (the kernel truncates them to a
// family) fall under the ">= 64" rule, never under an allowed family's.
func socketFamilyRules() []specs.LinuxSyscall {
	calls := []string{"socket", "socketpair"}
	allowed := map[uint64]bool{}
	var rules []specs.LinuxSyscall
	for _, family := range socketFamiliesAllowed {
		allowed[family] = true
		rules = append(rules, specs.LinuxSyscall{Names: calls, Action: specs.ActAllow,
			Args: []specs.LinuxSeccompArg{{Index: 0, Value: family, Op: specs.OpEqualTo}}})
	}
	deny := func(arg specs.LinuxSeccompArg) {
		rule := errnoRule(unix.EAFNOSUPPORT, calls...)
		rule.Args = []specs.LinuxSeccompArg{arg}
		rules = append(rules, rule)
	}
	for family := uint64(0); family < 32; family++ {
		if !allowed[family] {
			deny(specs.LinuxSeccompArg{Index: 0, Value: family, Op: specs.OpEqualTo})
		}
	}
	deny(specs.LinuxSeccompArg{Index: 0, Value: ^uint64(31), ValueTwo: 32, Op: specs.OpMaskedEqual}) // 32..63
	deny(specs.LinuxSeccompArg{Index: 0, Value: 64, Op: specs.OpGreaterEqual})
	return rules
}
