package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/mount"
)

// A task's disk limit (disk_bytes), as the local driver does it (drivers/local/disks.py):
// this kernel has no disk quotas, and a limit must look like a full disk from inside
// (ENOSPC, df showing it, deleting makes room). So the task's writable files live on a
// sparse ext4 image of that size, loop-mounted on the client: the workspace bind-mounted
// at /home/agentuity, and the container's overlay upper and work dirs, which replace the
// snapshot's own (its snapshot stays empty). One limit covers everything the sandbox can
// write but /tmp-like tmpfs mounts the runtime has none of.

// diskDir is where a task's limited file system is mounted; its image is diskDir + ".img".
func diskDir(workspaceRoot, allocID string) string {
	return filepath.Join(workspaceRoot, ".disks", allocID)
}

// makeDisk formats and mounts a size-byte file system at dir with the task's workspace
// (owned by uid:gid), upper and work directories inside.
func makeDisk(dir string, size int64, uid, gid int) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return err
	}
	removeDisk(dir) // an earlier attempt of this very task
	img := dir + ".img"
	f, err := os.OpenFile(img, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	f.Close()
	if err != nil {
		return err
	}
	// No journal (the disk does not outlive its task), no background inode-table zeroing
	// (it would write megabytes into every image), no blocks reserved for root.
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-b", "4096", "-m", "0",
		"-O", "^has_journal,^resize_inode", "-E", "lazy_itable_init=1,nodiscard", img).CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.ext4: %v: %s", err, strings.TrimSpace(string(out)))
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	if out, err := exec.Command("mount", "-o", "loop,nosuid,nodev,noinit_itable", img, dir).CombinedOutput(); err != nil {
		return fmt.Errorf("mounting %s: %v: %s", img, err, strings.TrimSpace(string(out)))
	}
	for _, name := range []string{"upper", "work", "workspace"} {
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			return err
		}
	}
	return os.Chown(filepath.Join(dir, "workspace"), uid, gid)
}

// removeDisk unmounts (lazily: a dying container may hold it a moment; the loop device
// clears itself with the last user) and deletes a task's disk. Idempotent.
func removeDisk(dir string) {
	_ = syscall.Unmount(dir, syscall.MNT_DETACH)
	_ = os.Remove(dir)
	_ = os.Remove(dir + ".img")
}

// diskRootfs is the container's rootfs mounts with the overlay's upper and work dirs
// moved onto the task's disk.
func diskRootfs(ctx context.Context, client *containerd.Client, snapshotter, key, dir string) ([]mount.Mount, error) {
	mounts, err := client.SnapshotService(snapshotter).Mounts(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("reading the snapshot's mounts: %v", err)
	}
	moved := false
	for i, m := range mounts {
		if m.Type != "overlay" {
			continue
		}
		opts := append([]string(nil), m.Options...)
		for j, o := range opts {
			switch {
			case strings.HasPrefix(o, "upperdir="):
				opts[j], moved = "upperdir="+filepath.Join(dir, "upper"), true
			case strings.HasPrefix(o, "workdir="):
				opts[j] = "workdir=" + filepath.Join(dir, "work")
			}
		}
		mounts[i].Options = opts
	}
	if !moved {
		return nil, fmt.Errorf("a disk limit needs the overlayfs snapshotter (got %q mounts)", snapshotter)
	}
	return mounts, nil
}
