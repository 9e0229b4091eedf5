package main

// Sandbox networking for tasks in a Nomad group network (mode "bridge"): Nomad and its CNI
// plugins give the allocation a network namespace on the "nomad" bridge with NAT; this
// file makes that safe for untrusted code, the same rules the local driver applies:
//
//   - the task joins that namespace (it has no other interface than lo and eth0);
//   - its bridge port is "isolated": isolated ports cannot reach each other, so one
//     sandbox never reaches another on the bridge (without br_netfilter, iptables does not
//     see bridged traffic; port isolation is enforced by the bridge itself);
//   - nothing from the bridge reaches the client host's own services (INPUT), and routed
//     traffic to link-local (cloud metadata), loopback, multicast and CGNAT ranges is
//     dropped (FORWARD); replies to connections the host opened still pass; what else a
//     task may reach is its own chain's business (egress.go);
//   - no IPv6: the task's eth0 has it disabled (no link-local address, so nothing of the
//     host's on [::] is in reach over the bridge), and ip6tables drops everything from and
//     to the bridge, should an address ever appear.
//
// The chains are (re)installed when the plugin is configured, idempotently.

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/containerd/containerd/oci"
)

const bridgeName = "nomad"

var (
	deniedNets  = []string{"169.254.0.0/16", "127.0.0.0/8", "0.0.0.0/8", "224.0.0.0/4", "240.0.0.0/4", "100.64.0.0/10"}
	firewallMu  sync.Mutex
	peerIndexRe = regexp.MustCompile(`eth0@if(\d+)`)
)

func ipt(args ...string) error { return xtables("iptables", args...) }

func ip6t(args ...string) error { return xtables("ip6tables", args...) }

func xtables(tool string, args ...string) error {
	out, err := exec.Command(tool, append([]string{"-w"}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", tool, strings.Join(args, " "), err, out)
	}
	return nil
}

// installFirewall puts the HUTCH-NOMAD-IN / HUTCH-NOMAD-FWD chains in place, each table in
// one iptables-restore commit: the plugin starts (a Nomad client restart) while sandboxes run,
// and flushing the chains then appending rule by rule left them empty in between, the
// built-in chains' ACCEPT policy letting a sandbox reach the host and denied networks.
// Declaring a chain in a --noflush restore empties and refills it in the same transaction.
func installFirewall(extraDenied []string) error {
	firewallMu.Lock()
	defer firewallMu.Unlock()
	est := "-m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT"
	v4 := []string{"*filter", ":HUTCH-NOMAD-IN - [0:0]", ":HUTCH-NOMAD-FWD - [0:0]",
		"-A HUTCH-NOMAD-IN " + est, "-A HUTCH-NOMAD-IN -j DROP",
		"-A HUTCH-NOMAD-FWD -o " + bridgeName + " " + est,
		// Replies of a sandbox to a connection opened towards it (its port, from an API host
		// on a denied network): established only if its first packet was let through.
		"-A HUTCH-NOMAD-FWD -i " + bridgeName + " " + est}
	for _, cidr := range append(append([]string{}, deniedNets...), extraDenied...) {
		v4 = append(v4, "-A HUTCH-NOMAD-FWD -i "+bridgeName+" -d "+cidr+" -j DROP")
	}
	if err := restoreTable("iptables-restore", append(v4, "COMMIT")); err != nil {
		return err
	}
	// IPv6: nothing, either way.
	v6 := []string{"*filter", ":HUTCH-NOMAD-IN - [0:0]", ":HUTCH-NOMAD-FWD - [0:0]", "-A HUTCH-NOMAD-IN -j DROP",
		"-A HUTCH-NOMAD-FWD -i " + bridgeName + " -j DROP", "-A HUTCH-NOMAD-FWD -o " + bridgeName + " -j DROP", "COMMIT"}
	if err := restoreTable("ip6tables-restore", v6); err != nil {
		return err
	}
	return jumpsFirstLocked()
}

func restoreTable(tool string, lines []string) error {
	restore := exec.Command(tool, "-w", "--noflush")
	restore.Stdin = strings.NewReader(strings.Join(lines, "\n") + "\n")
	if out, err := restore.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %v: %s", tool, err, out)
	}
	return nil
}

// jumpsFirst puts the jumps into our chains at the head of INPUT and FORWARD. Nomad's CNI
// firewall plugin inserts its own accepting CNI-FORWARD jump at the head when the first
// bridge allocation starts; ours must be evaluated before it, so every task start moves
// them back to the front.
func jumpsFirst() error {
	firewallMu.Lock()
	defer firewallMu.Unlock()
	return jumpsFirstLocked()
}

func jumpsFirstLocked() error {
	jumps := map[string][][]string{
		"iptables": {{"INPUT", "-i", bridgeName, "-j", "HUTCH-NOMAD-IN"}, {"FORWARD", "-i", bridgeName, "-j", "HUTCH-NOMAD-FWD"}},
		// IPv6 FORWARD: both ways (the chain matches the bridge itself).
		"ip6tables": {{"INPUT", "-i", bridgeName, "-j", "HUTCH-NOMAD-IN"}, {"FORWARD", "-j", "HUTCH-NOMAD-FWD"}},
	}
	for _, tool := range []string{"iptables", "ip6tables"} {
		for _, jump := range jumps[tool] {
			out, err := exec.Command(tool, "-w", "-S", jump[0], "1").CombinedOutput()
			if err == nil && strings.TrimSpace(string(out)) == "-A "+strings.Join(jump, " ") {
				continue
			}
			for xtables(tool, append([]string{"-D"}, jump...)...) == nil {
			}
			if err := xtables(tool, append([]string{"-I", jump[0], "1"}, jump[1:]...)...); err != nil {
				return err
			}
		}
	}
	return nil
}

// isolatePort marks the bridge port of the namespace's eth0 as isolated.
func isolatePort(netnsPath string) error {
	out, err := exec.Command("nsenter", "--net="+netnsPath, "ip", "-o", "link", "show", "eth0").CombinedOutput()
	if err != nil {
		return fmt.Errorf("reading eth0 of %s: %v: %s", netnsPath, err, out)
	}
	m := peerIndexRe.FindSubmatch(out)
	if m == nil {
		return fmt.Errorf("eth0 of %s has no veth peer: %s", netnsPath, out)
	}
	links, err := exec.Command("ip", "-o", "link").CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip link: %v", err)
	}
	for _, line := range strings.Split(string(links), "\n") {
		fields := strings.Fields(line)
		if len(fields) > 1 && fields[0] == string(m[1])+":" {
			name := strings.SplitN(strings.TrimSuffix(fields[1], ":"), "@", 2)[0]
			if out, err := exec.Command("ip", "link", "set", "dev", name, "type", "bridge_slave",
				"isolated", "on").CombinedOutput(); err != nil {
				return fmt.Errorf("isolating %s: %v: %s", name, err, out)
			}
			return nil
		}
	}
	return fmt.Errorf("no host interface with index %s", m[1])
}

// noIPv6 disables IPv6 on the namespace's eth0 (its link-local address goes with it) and on
// any interface made later; loopback keeps ::1, the sandbox's own. A sandbox has no
// CAP_NET_ADMIN and a read-only /proc/sys: it cannot turn it back on.
func noIPv6(netnsPath string) error {
	for _, key := range []string{"net.ipv6.conf.default.disable_ipv6", "net.ipv6.conf.eth0.disable_ipv6"} {
		if out, err := exec.Command("nsenter", "--net="+netnsPath, "sysctl", "-qw", key+"=1").CombinedOutput(); err != nil {
			return fmt.Errorf("disabling IPv6 in %s (%s): %v: %s", netnsPath, key, err, out)
		}
	}
	return nil
}

// groupNetwork joins the allocation's network namespace, with its own resolv.conf.
func groupNetwork(netnsPath, resolvConf, taskDir string) ([]oci.SpecOpts, []specs.Mount, error) {
	if err := jumpsFirst(); err != nil {
		return nil, nil, err
	}
	if err := isolatePort(netnsPath); err != nil {
		return nil, nil, err
	}
	if err := noIPv6(netnsPath); err != nil {
		return nil, nil, err
	}
	opts := []oci.SpecOpts{oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: netnsPath})}
	var mounts []specs.Mount
	if resolvConf != "" {
		path := taskDir + "/resolv.conf"
		if err := os.WriteFile(path, []byte(resolvConf), 0o644); err != nil {
			return nil, nil, err
		}
		mounts = append(mounts, bind(path, "/etc/resolv.conf", true))
	}
	return opts, mounts, nil
}

// restrictOutbound keeps a sandbox that only serves a port from opening connections of its
// own: new connections from its address are dropped (replies to inbound ones still pass).
// The rule is tagged with the container id so removeOutboundRule finds it.
func restrictOutbound(netnsPath, id string) error {
	ip, err := bridgeAddress(netnsPath)
	if err != nil {
		return err
	}
	firewallMu.Lock()
	defer firewallMu.Unlock()
	return ipt("-I", "HUTCH-NOMAD-FWD", "1", "-i", bridgeName, "-s", ip, "-m", "conntrack",
		"--ctstate", "NEW", "-m", "comment", "--comment", "hutch:"+id, "-j", "DROP")
}

func removeOutboundRule(id string) {
	firewallMu.Lock()
	defer firewallMu.Unlock()
	out, err := exec.Command("iptables", "-w", "-S", "HUTCH-NOMAD-FWD").CombinedOutput()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "hutch:"+id+" ") || strings.Contains(line, "\"hutch:"+id+"\"") {
			args := strings.Fields(strings.Replace(line, "-A ", "-D ", 1))
			for i, a := range args {
				args[i] = strings.Trim(a, "\"")
			}
			_ = ipt(args...)
		}
	}
}
