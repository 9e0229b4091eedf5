package main

import (
	"errors"
	"net"
	"testing"

	"golang.org/x/sys/unix"
)

func TestConnectReachesALoopbackPortOfTheNamespace(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	go func() {
		if c, err := l.Accept(); err == nil {
			_, _ = c.Write([]byte("hi"))
			c.Close()
		}
	}()
	conn, err := dialIn("/proc/self/ns/net", port)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2)
	if _, err := conn.Read(buf); err != nil || string(buf) != "hi" {
		t.Fatalf("read %q, %v", buf, err)
	}
	conn.Close()
	l.Close()
	if _, err := dialIn("/proc/self/ns/net", port); !errors.Is(err, unix.ECONNREFUSED) {
		t.Fatalf("a port where nothing listens: %v", err)
	}
}
