package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/containerd"
	apievents "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/cio"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/oci"
	"github.com/containerd/containerd/remotes/docker"
	"github.com/containerd/typeurl/v2"
	log "github.com/hashicorp/go-hclog"
	cstructs "github.com/hashicorp/nomad/client/structs"
	"github.com/hashicorp/nomad/drivers/shared/eventer"
	"github.com/hashicorp/nomad/plugins/base"
	"github.com/hashicorp/nomad/plugins/drivers"
	"github.com/hashicorp/nomad/plugins/drivers/fsisolation"
	"github.com/hashicorp/nomad/plugins/shared/hclspec"
	pstructs "github.com/hashicorp/nomad/plugins/shared/structs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

const (
	pluginName        = "hutch-containerd"
	pluginVersion     = "0.1.0"
	taskHandleVersion = 1
	fingerprintPeriod = 15 * time.Second
	execEnvelope      = "hutch-exec:v1"
	// After an exec's process exits, background children may still hold its
	// stdout; output is drained until it makes no progress for this long.
	drainGrace = 200 * time.Millisecond
	drainMax   = 30 * time.Second // output still flowing this long after an exec's exit is cut
)

var (
	pluginInfo = &base.PluginInfoResponse{
		Type:              base.PluginTypeDriver,
		PluginApiVersions: []string{drivers.ApiVersion010},
		PluginVersion:     pluginVersion,
		Name:              pluginName,
	}

	configSpec = hclspec.NewObject(map[string]*hclspec.Spec{
		"address": hclspec.NewDefault(hclspec.NewAttr("address", "string", false),
			hclspec.NewLiteral(`"/run/containerd/containerd.sock"`)),
		"namespace": hclspec.NewDefault(hclspec.NewAttr("namespace", "string", false),
			hclspec.NewLiteral(`"nomad"`)),
		"snapshotter": hclspec.NewDefault(hclspec.NewAttr("snapshotter", "string", false),
			hclspec.NewLiteral(`"overlayfs"`)),
		"runtime": hclspec.NewDefault(hclspec.NewAttr("runtime", "string", false),
			hclspec.NewLiteral(`"io.containerd.runc.v2"`)),
		"workspace_root": hclspec.NewDefault(hclspec.NewAttr("workspace_root", "string", false),
			hclspec.NewLiteral(`"/var/lib/hutch/nomad-workspaces"`)),
		"sandbox_firewall": hclspec.NewDefault(hclspec.NewAttr("sandbox_firewall", "bool", false),
			hclspec.NewLiteral(`true`)),
		// Registries on the cluster network served over plain HTTP ("10.0.0.1:5000"); a
		// registry on loopback always is.
		"insecure_registries": hclspec.NewAttr("insecure_registries", "list(string)", false),
		// The cluster's own networks (Nomad servers, the registry, Kafka, PostgreSQL): no
		// sandbox reaches them, whatever its network.allow says.
		"denied_cidrs": hclspec.NewAttr("denied_cidrs", "list(string)", false),
	})

	taskConfigSpec = hclspec.NewObject(map[string]*hclspec.Spec{
		"image":          hclspec.NewAttr("image", "string", true),
		"command":        hclspec.NewAttr("command", "string", false),
		"args":           hclspec.NewAttr("args", "list(string)", false),
		"uid":            hclspec.NewAttr("uid", "number", false),
		"gid":            hclspec.NewAttr("gid", "number", false),
		"cpu_millis":     hclspec.NewAttr("cpu_millis", "number", false),
		"pids_limit":     hclspec.NewAttr("pids_limit", "number", false),
		"host_network":   hclspec.NewAttr("host_network", "bool", false),
		"hostname":       hclspec.NewAttr("hostname", "string", false),
		"workspace":      hclspec.NewAttr("workspace", "string", false),
		"readonly_paths": hclspec.NewAttr("readonly_paths", "list(string)", false),
		"resolv_conf":    hclspec.NewAttr("resolv_conf", "string", false),
		"no_outbound":    hclspec.NewAttr("no_outbound", "bool", false),
		"disk_bytes":     hclspec.NewAttr("disk_bytes", "number", false),
		"allow":          hclspec.NewAttr("allow", "list(string)", false),
		"denied":         hclspec.NewAttr("denied", "list(string)", false),
		"deny":           hclspec.NewAttr("deny", "list(string)", false),
	})

	capabilities = &drivers.Capabilities{
		SendSignals:  true,
		Exec:         true,
		FSIsolation:  fsisolation.Image,
		MountConfigs: drivers.MountConfigSupportAll,
		NetIsolationModes: []drivers.NetIsolationMode{
			drivers.NetIsolationModeHost,
			drivers.NetIsolationModeGroup,
			drivers.NetIsolationModeTask,
		},
	}

	idUnsafe = regexp.MustCompile(`[^A-Za-z0-9_.-]`)
)

// Config is the plugin block of the Nomad client configuration.
type Config struct {
	Address       string `codec:"address"`
	Namespace     string `codec:"namespace"`
	Snapshotter   string `codec:"snapshotter"`
	Runtime       string `codec:"runtime"`
	WorkspaceRoot string `codec:"workspace_root"`
	// SandboxFirewall installs network.go's rules for tasks on the bridge.
	SandboxFirewall    bool     `codec:"sandbox_firewall"`
	InsecureRegistries []string `codec:"insecure_registries"`
	DeniedCIDRs        []string `codec:"denied_cidrs"`
}

// TaskConfig is a task's config block.
type TaskConfig struct {
	Image       string   `codec:"image"`
	Command     string   `codec:"command"`
	Args        []string `codec:"args"`
	UID         int      `codec:"uid"`
	GID         int      `codec:"gid"`
	CPUMillis   int      `codec:"cpu_millis"`
	PidsLimit   int      `codec:"pids_limit"`
	HostNetwork bool     `codec:"host_network"`
	Hostname    string   `codec:"hostname"`
	Workspace   string   `codec:"workspace"`
	ResolvConf  string   `codec:"resolv_conf"`
	NoOutbound  bool     `codec:"no_outbound"` // on the bridge only to serve a port
	DiskBytes   int64    `codec:"disk_bytes"`  // a disk limit (disk.go); 0: none
	Allow       []string `codec:"allow"`       // network.allow's CIDRs (allow.go); none: unrestricted
	// The IPv4 ranges the sandbox's traffic is refused to (the hutch server's
	// core/egress.denied_ranges); none: defaultDenied (egress.go).
	Denied []string `codec:"denied"`
	Deny   []string `codec:"deny"` // network.deny's CIDRs (egress.go)
}

// TaskState is what Nomad keeps for RecoverTask.
type TaskState struct {
	ContainerID string
	Workspace   string
	Disk        string // the task's limited file system (disk.go), if it has one
	StartedAt   time.Time
}

type Driver struct {
	ctx     context.Context
	logger  log.Logger
	eventer *eventer.Eventer
	config  Config

	mu     sync.Mutex
	client *containerd.Client
	tasks  map[string]*taskHandle
	ooms   map[string]int // container id -> OOM events seen
}

func NewDriver(ctx context.Context, logger log.Logger) *Driver {
	logger = logger.Named(pluginName)
	return &Driver{
		ctx:     ctx,
		logger:  logger,
		eventer: eventer.NewEventer(ctx, logger),
		tasks:   map[string]*taskHandle{},
		ooms:    map[string]int{},
	}
}

func (d *Driver) PluginInfo() (*base.PluginInfoResponse, error) { return pluginInfo, nil }
func (d *Driver) ConfigSchema() (*hclspec.Spec, error)          { return configSpec, nil }
func (d *Driver) TaskConfigSchema() (*hclspec.Spec, error)      { return taskConfigSpec, nil }
func (d *Driver) Capabilities() (*drivers.Capabilities, error)  { return capabilities, nil }

func (d *Driver) SetConfig(cfg *base.Config) error {
	var config Config
	if len(cfg.PluginConfig) != 0 {
		if err := base.MsgPackDecode(cfg.PluginConfig, &config); err != nil {
			return err
		}
	}
	d.mu.Lock()
	d.config = config
	d.mu.Unlock()
	for _, cidr := range config.DeniedCIDRs {
		if _, _, err := net.ParseCIDR(cidr); err != nil {
			return fmt.Errorf("denied_cidrs: %q is not a CIDR: %v", cidr, err)
		}
	}
	if config.SandboxFirewall {
		if err := installFirewall(config.DeniedCIDRs); err != nil {
			d.logger.Error("installing the sandbox firewall", "error", err)
			return err
		}
	}
	return nil
}

// plainHTTP: loopback registries and the configured insecure ones are spoken to over HTTP.
func (d *Driver) plainHTTP(host string) (bool, error) {
	for _, h := range d.config.InsecureRegistries {
		if h == host {
			return true, nil
		}
	}
	return docker.MatchLocalhost(host)
}

// nsCtx is a context in the plugin's containerd namespace.
func (d *Driver) nsCtx(ctx context.Context) context.Context {
	return namespaces.WithNamespace(ctx, d.config.Namespace)
}

func (d *Driver) getClient() (*containerd.Client, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.client != nil {
		return d.client, nil
	}
	client, err := containerd.New(d.config.Address, containerd.WithDefaultNamespace(d.config.Namespace),
		containerd.WithTimeout(5*time.Second))
	if err != nil {
		return nil, fmt.Errorf("connecting to containerd at %s: %w", d.config.Address, err)
	}
	d.client = client
	go d.watchOOM(client)
	return client, nil
}

// watchOOM counts containerd's OOM events per container.
func (d *Driver) watchOOM(client *containerd.Client) {
	for {
		msgs, errs := client.Subscribe(d.ctx, `topic=="/tasks/oom"`)
	loop:
		for {
			select {
			case <-d.ctx.Done():
				return
			case err := <-errs:
				d.logger.Warn("containerd event stream ended; resubscribing", "error", err)
				break loop
			case env := <-msgs:
				if env == nil || env.Event == nil {
					continue
				}
				ev, err := typeurl.UnmarshalAny(env.Event)
				if err != nil {
					continue
				}
				if oom, ok := ev.(*apievents.TaskOOM); ok {
					d.mu.Lock()
					d.ooms[oom.ContainerID]++
					d.mu.Unlock()
				}
			}
		}
		select {
		case <-d.ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

func (d *Driver) oomCount(containerID string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ooms[containerID]
}

// -- fingerprint ---------------------------------------------------------------------

func (d *Driver) Fingerprint(ctx context.Context) (<-chan *drivers.Fingerprint, error) {
	ch := make(chan *drivers.Fingerprint)
	go func() {
		defer close(ch)
		timer := time.NewTimer(0)
		for {
			select {
			case <-ctx.Done():
				return
			case <-d.ctx.Done():
				return
			case <-timer.C:
				timer.Reset(fingerprintPeriod)
				select {
				case ch <- d.fingerprint():
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return ch, nil
}

func (d *Driver) fingerprint() *drivers.Fingerprint {
	client, err := d.getClient()
	if err == nil {
		ctx, cancel := context.WithTimeout(d.nsCtx(d.ctx), 5*time.Second)
		defer cancel()
		var v containerd.Version
		if v, err = client.Version(ctx); err == nil {
			return &drivers.Fingerprint{
				Health:            drivers.HealthStateHealthy,
				HealthDescription: drivers.DriverHealthy,
				Attributes: map[string]*pstructs.Attribute{
					"driver." + pluginName:                     pstructs.NewBoolAttribute(true),
					"driver." + pluginName + ".containerd":     pstructs.NewStringAttribute(v.Version),
					"driver." + pluginName + ".plugin_version": pstructs.NewStringAttribute(pluginVersion),
				},
			}
		}
	}
	return &drivers.Fingerprint{Health: drivers.HealthStateUnhealthy, HealthDescription: err.Error()}
}

// -- start ---------------------------------------------------------------------------

func containerID(cfg *drivers.TaskConfig) string {
	return idUnsafe.ReplaceAllString(cfg.Name, "_") + "-" + cfg.AllocID
}

func (d *Driver) StartTask(cfg *drivers.TaskConfig) (*drivers.TaskHandle, *drivers.DriverNetwork, error) {
	if _, ok := d.getTask(cfg.ID); ok {
		return nil, nil, fmt.Errorf("task with ID %q already started", cfg.ID)
	}
	var tc TaskConfig
	if err := cfg.DecodeDriverConfig(&tc); err != nil {
		return nil, nil, fmt.Errorf("failed to decode driver config: %v", err)
	}
	client, err := d.getClient()
	if err != nil {
		return nil, nil, err
	}
	ctx := d.nsCtx(d.ctx)
	image, err := d.ensureImage(ctx, client, tc.Image)
	if err != nil {
		return nil, nil, err
	}

	id := containerID(cfg)
	workspaceHost, disk := "", ""
	var mounts []specs.Mount
	if tc.DiskBytes > 0 {
		disk = diskDir(d.config.WorkspaceRoot, cfg.AllocID)
		if err := makeDisk(disk, tc.DiskBytes, tc.UID, gidOf(tc)); err != nil {
			removeDisk(disk)
			return nil, nil, fmt.Errorf("disk limit: %v", err)
		}
	}
	failed := true // until the task runs: what was made for it goes
	defer func() {
		if failed && disk != "" {
			removeDisk(disk)
		}
	}()
	if tc.Workspace != "" && disk != "" {
		workspaceHost = filepath.Join(disk, "workspace")
		mounts = append(mounts, bind(workspaceHost, tc.Workspace, false))
	} else if tc.Workspace != "" {
		workspaceHost = filepath.Join(d.config.WorkspaceRoot, cfg.AllocID)
		if err := os.MkdirAll(workspaceHost, 0o755); err != nil {
			return nil, nil, fmt.Errorf("workspace: %v", err)
		}
		if err := os.Chown(workspaceHost, tc.UID, gidOf(tc)); err != nil {
			return nil, nil, fmt.Errorf("workspace: %v", err)
		}
		mounts = append(mounts, bind(workspaceHost, tc.Workspace, false))
	}
	// Nothing of Nomad's goes into a sandbox: not the task dirs (/alloc, /local: writable on the
	// client's disk, outside any disk limit), not /secrets (the Task API socket, root on the
	// host through a raw_exec job; the workload identity), not Nomad's environment. Only the
	// volumes a job asks for (hutch's ask for none).
	for _, m := range cfg.Mounts {
		mounts = append(mounts, bind(m.HostPath, m.TaskPath, m.Readonly))
	}
	env := sandboxEnv(cfg.Env)
	opts := []oci.SpecOpts{
		oci.WithImageConfig(image),
		oci.WithEnv(env),
		oci.WithUIDGID(uint32(tc.UID), uint32(gidOf(tc))),
		oci.WithNoNewPrivileges,
		oci.WithCapabilities(nil),
		oci.WithAmbientCapabilities(nil),
		withSandboxSeccomp(),
		oci.WithMounts(mounts),
		oci.WithHostname(firstNonEmpty(tc.Hostname, "sandbox")),
	}
	if tc.Command != "" {
		opts = append(opts, oci.WithProcessArgs(append([]string{tc.Command}, tc.Args...)...))
	}
	if tc.Workspace != "" {
		opts = append(opts, oci.WithProcessCwd(tc.Workspace))
	}
	if tc.HostNetwork {
		return nil, nil, fmt.Errorf("host_network: sandboxes never share the host's network")
	} else if ni := cfg.NetworkIsolation; ni != nil && ni.Mode == drivers.NetIsolationModeGroup && ni.Path != "" {
		if !d.config.SandboxFirewall {
			return nil, nil, fmt.Errorf("group networking needs sandbox_firewall = true in the plugin config")
		}
		netOpts, netMounts, err := groupNetwork(ni.Path, tc.ResolvConf, cfg.TaskDir().Dir)
		if err != nil {
			return nil, nil, err
		}
		opts = append(opts, netOpts...)
		opts = append(opts, oci.WithMounts(netMounts))
		if tc.NoOutbound {
			if err := restrictOutbound(ni.Path, id); err != nil {
				return nil, nil, err
			}
		} else if err := setEgress(ni.Path, id, tc.ResolvConf, tc.Denied, loadRules(cfg, tc)); err != nil {
			return nil, nil, err
		}
	}
	limits, err := sandboxLimits(cfg, tc)
	if err != nil {
		return nil, nil, err
	}
	opts = append(opts, limits...)
	if tc.PidsLimit > 0 {
		opts = append(opts, oci.WithPidsLimit(int64(tc.PidsLimit)))
	}

	// A container left by an earlier attempt of this very task would block the name.
	if old, err := client.LoadContainer(ctx, id); err == nil {
		d.deleteContainer(ctx, old)
	}
	container, err := client.NewContainer(ctx, id,
		containerd.WithImage(image),
		containerd.WithSnapshotter(d.config.Snapshotter),
		containerd.WithNewSnapshot(id, image),
		containerd.WithRuntime(d.config.Runtime, nil),
		containerd.WithNewSpec(opts...),
	)
	if err != nil {
		return nil, nil, fmt.Errorf("creating container %s: %v", id, err)
	}
	// The task's own stdout and stderr are init's (an idle shell: it writes nothing), and any
	// process of the sandbox can write to them (through /proc/<pid>/fd/1 of init's children):
	// a file on the client's disk there grew without bound. They go nowhere.
	logPath := os.DevNull
	var taskOpts []containerd.NewTaskOpts
	if disk != "" {
		rootfs, err := diskRootfs(ctx, client, d.config.Snapshotter, id, disk)
		if err != nil {
			d.deleteContainer(ctx, container)
			return nil, nil, fmt.Errorf("disk limit: %v", err)
		}
		taskOpts = append(taskOpts, containerd.WithRootFS(rootfs))
	}
	task, err := container.NewTask(ctx, cio.LogFile(logPath), taskOpts...)
	if err != nil {
		d.deleteContainer(ctx, container)
		return nil, nil, fmt.Errorf("creating task %s: %v", id, err)
	}
	h := newTaskHandle(d, cfg, container, task, workspaceHost)
	h.disk = disk
	h.egress = outboundRules(cfg)
	exitC, err := task.Wait(ctx)
	if err != nil {
		d.deleteContainer(ctx, container)
		return nil, nil, fmt.Errorf("waiting on task %s: %v", id, err)
	}
	if err := task.Start(ctx); err != nil {
		d.deleteContainer(ctx, container)
		return nil, nil, fmt.Errorf("starting task %s: %v", id, err)
	}
	commandsBeforeInit(int(task.Pid()), d.logger)
	handle := drivers.NewTaskHandle(taskHandleVersion)
	handle.Config = cfg
	state := TaskState{ContainerID: id, Workspace: workspaceHost, Disk: disk, StartedAt: h.startedAt}
	if err := handle.SetDriverState(&state); err != nil {
		d.deleteContainer(ctx, container)
		return nil, nil, fmt.Errorf("saving driver state: %v", err)
	}
	failed = false
	d.setTask(cfg.ID, h)
	go h.watch(exitC)
	go h.guardPids()
	return handle, nil, nil
}

func gidOf(tc TaskConfig) int {
	if tc.GID != 0 {
		return tc.GID
	}
	return tc.UID
}

func firstNonEmpty(values ...string) string {
	for _, v := range values {
		if v != "" {
			return v
		}
	}
	return ""
}

// sandboxEnv is the task's environment without what Nomad adds of its own (NOMAD_* names the
// allocation, its dirs and, with an identity, its token) or of Vault's and Consul's.
func sandboxEnv(taskEnv map[string]string) []string {
	env := make([]string, 0, len(taskEnv))
	for k, v := range taskEnv {
		if !strings.HasPrefix(k, "NOMAD_") && !strings.HasPrefix(k, "VAULT_") && !strings.HasPrefix(k, "CONSUL_") {
			env = append(env, k+"="+v)
		}
	}
	return env
}

func bind(src, dst string, readonly bool) specs.Mount {
	options := []string{"rbind", "rprivate", "nosuid", "nodev"}
	if readonly {
		options = append(options, "ro")
	} else {
		options = append(options, "rw")
	}
	return specs.Mount{Type: "bind", Source: src, Destination: dst, Options: options}
}

// commandsBeforeInit makes the OOM killer take what commands start before the sandbox's
// pid 1 when the memory limit is reached (a killed init ends the allocation: a fork bomb
// at the limit took its sandbox with it). Lowering init's score needs CAP_SYS_RESOURCE,
// which hosts like this one withhold even from root; raising needs nothing. So the
// container's shim, init's parent, is raised once init runs: every exec inherits its
// score through runc exec (the container's spec sets none), init keeps the old one.
func commandsBeforeInit(initPid int, logger log.Logger) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", initPid))
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	if err != nil || len(fields) < 2 {
		logger.Warn("finding the shim of a sandbox's init", "pid", initPid, "error", err)
		return
	}
	if err := os.WriteFile("/proc/"+fields[1]+"/oom_score_adj", []byte("500"), 0); err != nil {
		logger.Warn("raising the OOM score of a sandbox's commands", "shim", fields[1], "error", err)
	}
}

func (d *Driver) ensureImage(ctx context.Context, client *containerd.Client, ref string) (containerd.Image, error) {
	image, err := client.GetImage(ctx, ref)
	if err == nil {
		unpacked, uerr := image.IsUnpacked(ctx, d.config.Snapshotter)
		if uerr == nil && unpacked {
			return image, nil
		}
		if uerr == nil {
			if err := image.Unpack(ctx, d.config.Snapshotter); err != nil {
				return nil, fmt.Errorf("unpacking image %s: %v", ref, err)
			}
			return image, nil
		}
	} else if !errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("looking up image %s: %v", ref, err)
	}
	resolver := docker.NewResolver(docker.ResolverOptions{
		Hosts: docker.ConfigureDefaultRegistries(docker.WithPlainHTTP(d.plainHTTP)),
	})
	started := time.Now()
	image, err = client.Pull(ctx, ref, containerd.WithPullUnpack,
		containerd.WithPullSnapshotter(d.config.Snapshotter), containerd.WithResolver(resolver))
	if err != nil {
		return nil, fmt.Errorf("pulling image %s: %v", ref, err)
	}
	d.logger.Info("pulled image", "ref", ref, "took", time.Since(started))
	return image, nil
}

func (d *Driver) deleteContainer(ctx context.Context, c containerd.Container) {
	if task, err := c.Task(ctx, nil); err == nil {
		if st, err := task.Status(ctx); err == nil && st.Status == containerd.Paused {
			_ = task.Resume(ctx)
		}
		_ = task.Kill(ctx, syscall.SIGKILL, containerd.WithKillAll)
		if _, err := task.Delete(ctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			d.logger.Warn("deleting task", "id", c.ID(), "error", err)
		}
	}
	if err := c.Delete(ctx, containerd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
		d.logger.Warn("deleting container", "id", c.ID(), "error", err)
	}
}

// -- recover, wait, stop, destroy -------------------------------------------------------

func (d *Driver) RecoverTask(handle *drivers.TaskHandle) error {
	if handle == nil {
		return fmt.Errorf("handle cannot be nil")
	}
	if _, ok := d.getTask(handle.Config.ID); ok {
		return nil
	}
	var state TaskState
	if err := handle.GetDriverState(&state); err != nil {
		return fmt.Errorf("decoding task state: %v", err)
	}
	client, err := d.getClient()
	if err != nil {
		return err
	}
	ctx := d.nsCtx(d.ctx)
	container, err := client.LoadContainer(ctx, state.ContainerID)
	if err != nil {
		return fmt.Errorf("loading container %s: %v", state.ContainerID, err)
	}
	task, err := container.Task(ctx, nil)
	if err != nil {
		return fmt.Errorf("loading task of container %s: %v", state.ContainerID, err)
	}
	// The firewall was re-installed when the plugin started: a port-only sandbox's rule too.
	var tc TaskConfig
	if err := handle.Config.DecodeDriverConfig(&tc); err == nil && tc.NoOutbound {
		if ni := handle.Config.NetworkIsolation; ni != nil && ni.Path != "" {
			removeOutboundRule(state.ContainerID)
			if err := restrictOutbound(ni.Path, state.ContainerID); err != nil {
				return fmt.Errorf("restricting %s: %v", state.ContainerID, err)
			}
		}
	} else if err == nil {
		// The jump went with the chains' reinstall; the chain is put back with the rules of
		// the moment (rulesFile: an update's, a refresh's addresses).
		if ni := handle.Config.NetworkIsolation; ni != nil && ni.Path != "" {
			if err := setEgress(ni.Path, state.ContainerID, tc.ResolvConf, tc.Denied, loadRules(handle.Config, tc)); err != nil {
				return fmt.Errorf("limiting %s: %v", state.ContainerID, err)
			}
		}
	}
	h := newTaskHandle(d, handle.Config, container, task, state.Workspace)
	h.startedAt, h.disk = state.StartedAt, state.Disk
	h.egress = outboundRules(handle.Config)
	exitC, err := task.Wait(ctx)
	if err != nil {
		return fmt.Errorf("waiting on task %s: %v", state.ContainerID, err)
	}
	d.setTask(handle.Config.ID, h)
	go h.watch(exitC)
	go h.guardPids()
	return nil
}

func (d *Driver) WaitTask(ctx context.Context, taskID string) (<-chan *drivers.ExitResult, error) {
	h, ok := d.getTask(taskID)
	if !ok {
		return nil, drivers.ErrTaskNotFound
	}
	ch := make(chan *drivers.ExitResult)
	go func() {
		defer close(ch)
		select {
		case <-ctx.Done():
			return
		case <-d.ctx.Done():
			return
		case <-h.done:
		}
		select {
		case <-ctx.Done():
		case <-d.ctx.Done():
		case ch <- h.result():
		}
	}()
	return ch, nil
}

func (d *Driver) StopTask(taskID string, timeout time.Duration, signal string) error {
	h, ok := d.getTask(taskID)
	if !ok {
		return drivers.ErrTaskNotFound
	}
	sig := syscall.SIGTERM
	if s, ok := signalByName(signal); ok {
		sig = s
	}
	ctx := d.nsCtx(d.ctx)
	_ = h.freeze(false) // a frozen process cannot die
	if err := h.task.Kill(ctx, sig); err != nil && !errdefs.IsNotFound(err) {
		d.logger.Warn("signalling task", "id", h.container.ID(), "error", err)
	}
	select {
	case <-h.done:
		return nil
	case <-time.After(timeout):
	}
	if err := h.task.Kill(ctx, syscall.SIGKILL, containerd.WithKillAll); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("killing task: %v", err)
	}
	select {
	case <-h.done:
	case <-time.After(10 * time.Second):
		return fmt.Errorf("task %s did not exit after SIGKILL", h.container.ID())
	}
	return nil
}

func (d *Driver) DestroyTask(taskID string, force bool) error {
	h, ok := d.getTask(taskID)
	if !ok {
		return drivers.ErrTaskNotFound
	}
	if h.running() && !force {
		return fmt.Errorf("cannot destroy running task")
	}
	ctx := d.nsCtx(d.ctx)
	d.deleteContainer(ctx, h.container)
	removeOutboundRule(h.container.ID())
	removeEgressChain(h.container.ID())
	if h.disk != "" && strings.HasPrefix(h.disk, d.config.WorkspaceRoot+"/") {
		removeDisk(h.disk) // the workspace with it
	} else if h.workspace != "" && strings.HasPrefix(h.workspace, d.config.WorkspaceRoot+"/") {
		if err := os.RemoveAll(h.workspace); err != nil {
			d.logger.Warn("removing workspace", "path", h.workspace, "error", err)
		}
	}
	d.mu.Lock()
	delete(d.tasks, taskID)
	delete(d.ooms, h.container.ID())
	d.mu.Unlock()
	return nil
}

func (d *Driver) InspectTask(taskID string) (*drivers.TaskStatus, error) {
	h, ok := d.getTask(taskID)
	if !ok {
		return nil, drivers.ErrTaskNotFound
	}
	return h.status(), nil
}

func (d *Driver) TaskStats(ctx context.Context, taskID string, interval time.Duration) (<-chan *cstructs.TaskResourceUsage, error) {
	h, ok := d.getTask(taskID)
	if !ok {
		return nil, drivers.ErrTaskNotFound
	}
	ch := make(chan *cstructs.TaskResourceUsage)
	go h.stats(ctx, interval, ch)
	return ch, nil
}

func (d *Driver) TaskEvents(ctx context.Context) (<-chan *drivers.TaskEvent, error) {
	return d.eventer.TaskEvents(ctx)
}

func (d *Driver) SignalTask(taskID string, signal string) error {
	h, ok := d.getTask(taskID)
	if !ok {
		return drivers.ErrTaskNotFound
	}
	sig, ok := signalByName(signal)
	if !ok {
		return fmt.Errorf("unknown signal %q", signal)
	}
	return h.task.Kill(d.nsCtx(d.ctx), sig)
}

// ExecTask runs a command to completion (script checks).
func (d *Driver) ExecTask(taskID string, cmd []string, timeout time.Duration) (*drivers.ExecTaskResult, error) {
	h, ok := d.getTask(taskID)
	if !ok {
		return nil, drivers.ErrTaskNotFound
	}
	ctx, cancel := context.WithTimeout(d.ctx, timeout)
	defer cancel()
	var stdout, stderr limitedBuffer
	result, err := h.exec(ctx, cmd, nil, &stdout, &stderr, nil)
	if err != nil {
		return nil, err
	}
	return &drivers.ExecTaskResult{Stdout: stdout.Bytes(), Stderr: stderr.Bytes(), ExitResult: result}, nil
}

// ExecTaskStreaming is what Nomad's alloc exec API (/v1/client/allocation/:id/exec) calls.
func (d *Driver) ExecTaskStreaming(ctx context.Context, taskID string, opts *drivers.ExecOptions) (*drivers.ExitResult, error) {
	h, ok := d.getTask(taskID)
	if !ok {
		return nil, drivers.ErrTaskNotFound
	}
	if opts.Tty {
		// A terminal (hutch's open_terminal): a command like any other, on a pseudo-terminal;
		// the verbs below are never asked for with one.
		return h.exec(ctx, opts.Command, opts.Stdin, opts.Stdout, opts.Stderr, &terminal{resize: opts.ResizeCh})
	}
	if envelope, _, err := parseEnvelope(opts.Command); err == nil && envelope != nil && envelope.Kill != "" {
		if h.killTagged(envelope.Kill) {
			return &drivers.ExitResult{ExitCode: 0}, nil
		}
		return &drivers.ExitResult{ExitCode: 1}, nil
	}
	if envelope, _, err := parseEnvelope(opts.Command); err == nil && envelope != nil && envelope.Freeze != nil {
		if err := h.freeze(*envelope.Freeze); err != nil {
			return nil, err
		}
		return &drivers.ExitResult{ExitCode: 0}, nil
	}
	if envelope, _, err := parseEnvelope(opts.Command); err == nil && envelope != nil && envelope.Exit != "" {
		end := h.exits.get(envelope.Exit)
		if end == nil {
			return &drivers.ExitResult{ExitCode: 1}, nil
		}
		out, _ := json.Marshal(end)
		if _, err := opts.Stdout.Write(out); err != nil {
			return nil, err
		}
		return &drivers.ExitResult{ExitCode: 0}, nil
	}
	if envelope, _, err := parseEnvelope(opts.Command); err == nil && envelope != nil && (envelope.Allow != nil || envelope.Egress != nil) {
		var err error
		if envelope.Egress != nil {
			err = h.setRules(*envelope.Egress)
		} else {
			err = h.setAllowed(*envelope.Allow)
		}
		if errors.Is(err, errNoOutbound) {
			_, _ = fmt.Fprintln(opts.Stdout, err)
			return &drivers.ExitResult{ExitCode: exitNoOutbound}, nil
		} else if err != nil {
			return nil, err
		}
		return &drivers.ExitResult{ExitCode: 0}, nil
	}
	if envelope, _, err := parseEnvelope(opts.Command); err == nil && envelope != nil && envelope.Connect != 0 {
		code, err := h.connect(ctx, envelope.Connect, opts.Stdin, opts.Stdout)
		if err != nil {
			return nil, err
		}
		return &drivers.ExitResult{ExitCode: code}, nil
	}
	if envelope, _, err := parseEnvelope(opts.Command); err == nil && envelope != nil && envelope.Usage {
		out, _ := json.Marshal(h.usage())
		if _, err := opts.Stdout.Write(out); err != nil {
			return nil, err
		}
		return &drivers.ExitResult{ExitCode: 0}, nil
	}
	return h.exec(ctx, opts.Command, opts.Stdin, opts.Stdout, opts.Stderr, nil)
}

func (d *Driver) getTask(id string) (*taskHandle, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	h, ok := d.tasks[id]
	return h, ok
}

func (d *Driver) setTask(id string, h *taskHandle) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.tasks[id] = h
}

// execEnvelopeSpec is the optional first part of an exec command.
//
//	{"env": ["K=V", ...], "cwd": "/dir", "tag": "exec-1"}   run argv with this env and cwd
//	  (+ "ttySize": {"height": 24, "width": 80})            a terminal exec's first window size
//	{"kill": "exec-1"}                                      kill what carries the tag: the exec's tree, its processes (killTagged)
//	{"freeze": true|false}                                  pause / resume the whole container
//	{"usage": true}                                         the container's cpu, peak memory, memory now and page cache, as JSON
//	{"exit": "exec-1"}                                      how the ended tagged exec ended, as JSON (exits.go)
//	{"allow": ["1.2.3.4/32", ...]}                          replace the task's allow-list addresses (egress.go)
//	{"egress": {"allow": [...]|null, "deny": [...]}}        replace the task's egress rules whole (egress.go)
//	  (both answer exit 3 for a task made without outbound network: it has no rules to change)
//	{"connect": 8000}                                       a connection to that port inside the sandbox, on stdin/stdout (connect.go)
//
// The kill verb exists because closing the exec websocket does not reach the plugin while
// the command is silent: Nomad's HTTP handler only notices at the command's next output.
type execEnvelopeSpec struct {
	Env    []string      `json:"env"`
	Cwd    string        `json:"cwd"`
	Tag    string        `json:"tag"`
	Kill   string        `json:"kill"`
	Freeze *bool         `json:"freeze"`
	Usage  bool          `json:"usage"`
	Exit   string        `json:"exit"`
	Allow  *[]string     `json:"allow"`
	Egress *egressUpdate `json:"egress"`
	// Connect: a TCP connection to this port of the sandbox's loopback (connect.go).
	Connect int `json:"connect"`
	// NoStdin: the command gets an empty stdin (end of file at once), without waiting for
	// the exec stream's stdin close to travel through Nomad.
	NoStdin bool `json:"noStdin"`
	// TtySize: the size a terminal starts with, so that what the command asks for first is
	// right (a resize can only follow its start).
	TtySize *drivers.TerminalSize `json:"ttySize"`
}

func parseEnvelope(cmd []string) (*execEnvelopeSpec, []string, error) {
	if len(cmd) < 2 || cmd[0] != execEnvelope {
		return nil, cmd, nil
	}
	var env execEnvelopeSpec
	if err := json.Unmarshal([]byte(cmd[1]), &env); err != nil {
		return nil, nil, fmt.Errorf("bad %s envelope: %v", execEnvelope, err)
	}
	return &env, cmd[2:], nil
}
