package main

// The connect verb: a TCP connection to a port the sandbox's processes listen on, any port,
// made for the hutch server (E2B's `{port}-{id}.{domain}` hosts), as the local driver's
// portconnect.py does. The plugin connects to 127.0.0.1:port inside the sandbox's network
// namespace (its group network's, or its own loopback-only one) and splices the connection
// to the alloc exec's stdin and stdout: the sandbox gains no network by it (nothing of its
// own leaves its namespace), and only a holder of the hutch server's Nomad token can ask.
//
// The first line on stdout is `{"opened":true}`; a port where nothing listens ends the
// exec with exitRefused and the error on stdout. The connection ends when the sandbox's
// side closes it, or with the stdin's end and the sandbox's answer to it, or when the task
// ends.

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

const exitRefused = 4

// dialIn connects to 127.0.0.1:port from inside the network namespace at nsPath. The socket
// is made on a thread moved into that namespace (and back): a socket belongs to the
// namespace it was made in for good.
func dialIn(nsPath string, port int) (net.Conn, error) {
	target, err := os.Open(nsPath)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %v", nsPath, err)
	}
	defer target.Close()
	type result struct {
		conn net.Conn
		err  error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked if the way back fails: the thread then ends with the goroutine
		own, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			done <- result{nil, err}
			return
		}
		defer own.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			done <- result{nil, fmt.Errorf("entering %s: %v", nsPath, err)}
			runtime.UnlockOSThread()
			return
		}
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		back := unix.Setns(int(own.Fd()), unix.CLONE_NEWNET)
		if back == nil {
			runtime.UnlockOSThread()
		}
		if err != nil {
			done <- result{nil, err}
			return
		}
		// The connect itself needs no namespace: the socket has it.
		addr := &unix.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}
		if err := unix.Connect(fd, addr); err != nil {
			unix.Close(fd)
			done <- result{nil, err}
			return
		}
		f := os.NewFile(uintptr(fd), "sandbox:"+strconv.Itoa(port))
		conn, err := net.FileConn(f)
		f.Close()
		done <- result{conn, err}
	}()
	select {
	case r := <-done:
		return r.conn, r.err
	case <-time.After(10 * time.Second):
		return nil, fmt.Errorf("connecting to port %d timed out", port)
	}
}

// netnsPath is the task's network namespace: its group network's, else its init's own.
func (h *taskHandle) netnsPath() string {
	if ni := h.cfg.NetworkIsolation; ni != nil && ni.Path != "" {
		return ni.Path
	}
	return fmt.Sprintf("/proc/%d/ns/net", h.task.Pid())
}

// connect is the connect verb.
func (h *taskHandle) connect(ctx context.Context, port int, stdin io.Reader, stdout io.Writer) (int, error) {
	if port < 1 || port > 65535 {
		return 0, fmt.Errorf("connect: port %d is not a port", port)
	}
	if !h.running() {
		return 0, fmt.Errorf("task %s is not running", h.container.ID())
	}
	conn, err := dialIn(h.netnsPath(), port)
	if err != nil {
		_, _ = fmt.Fprintf(stdout, "%v\n", err)
		return exitRefused, nil
	}
	defer conn.Close()
	if _, err := io.WriteString(stdout, "{\"opened\":true}\n"); err != nil {
		return 0, err
	}
	fromSandbox := make(chan struct{})
	go func() {
		_, _ = io.Copy(stdout, conn)
		close(fromSandbox)
	}()
	go func() {
		if stdin != nil {
			_, _ = io.Copy(conn, stdin)
		}
		if tcp, ok := conn.(*net.TCPConn); ok {
			_ = tcp.CloseWrite() // the caller's end: the sandbox's server reads end of file
		}
	}()
	select {
	case <-fromSandbox:
	case <-ctx.Done():
	case <-h.done:
	}
	return 0, nil
}
