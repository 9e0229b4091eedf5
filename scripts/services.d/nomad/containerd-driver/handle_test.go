package main

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func write(t *testing.T, path, text string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestCgroupUsageReadsV2(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "hutch", "c1")
	write(t, filepath.Join(dir, "cpu.stat"), "usage_usec 2500000\nuser_usec 1\n")
	write(t, filepath.Join(dir, "memory.peak"), "9000\n")
	write(t, filepath.Join(dir, "memory.current"), "8192\n")
	write(t, filepath.Join(dir, "memory.stat"), "anon 4096\nfile 2048\nfile_dirty 0\n")
	got := cgroupUsage(root, "hutch", "c1")
	want := map[string]float64{"cpuSeconds": 2.5, "memoryPeakBytes": 9000, "memoryBytes": 8192, "memoryCacheBytes": 2048}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

func TestCgroupUsageReadsV1(t *testing.T) {
	root := t.TempDir()
	write(t, filepath.Join(root, "cpuacct", "hutch", "c1", "cpuacct.usage"), "3000000000\n")
	mem := filepath.Join(root, "memory", "hutch", "c1")
	write(t, filepath.Join(mem, "memory.max_usage_in_bytes"), "7000\n")
	write(t, filepath.Join(mem, "memory.usage_in_bytes"), "6000\n")
	write(t, filepath.Join(mem, "memory.stat"), "cache 10\ntotal_cache 1000\n")
	got := cgroupUsage(root, "hutch", "c1")
	want := map[string]float64{"cpuSeconds": 3, "memoryPeakBytes": 7000, "memoryBytes": 6000, "memoryCacheBytes": 1000}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

func TestCgroupUsageLeavesOutWhatIsMissing(t *testing.T) {
	root := t.TempDir()
	write(t, filepath.Join(root, "hutch", "c1", "memory.current"), "8192\n") // no memory.stat: no pair
	if got := cgroupUsage(root, "hutch", "c1"); len(got) != 0 {
		t.Fatalf("got %v, want nothing", got)
	}
}
