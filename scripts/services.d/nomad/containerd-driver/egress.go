package main

// network.allow on nomad: a task with `allow` (IPv4 CIDRs the hutch server resolved) gets a
// chain of its own, jumped to from the head of HUTCH-NOMAD-FWD for packets from its bridge
// address: replies, DNS to the name servers of its resolv.conf and the listed CIDRs return
// (so HUTCH-NOMAD-FWD's drops still apply: a list narrows, never widens); anything else is
// rejected, TCP with a reset so connect() fails at once. The hutch server re-resolves the
// names and sends the new set with the `{"allow": [...]}` verb, which replaces the chain
// whole (iptables-restore).

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"os/exec"
	"regexp"
	"strings"

	"github.com/hashicorp/nomad/plugins/drivers"
)

var (
	nameserverRe = regexp.MustCompile(`(?m)^nameserver\s+(\d+\.\d+\.\d+\.\d+)\s*$`)
	inetRe       = regexp.MustCompile(`inet (\d+\.\d+\.\d+\.\d+)/`)
)

// allowChain is the task's chain name (iptables allows 28 characters).
func allowChain(id string) string {
	sum := sha256.Sum256([]byte(id))
	return "HNA-" + hex.EncodeToString(sum[:])[:20]
}

// setAllowed installs (or replaces) the chain of container id and its jump.
func setAllowed(netnsPath, id, resolvConf string, cidrs []string) error {
	ip, err := bridgeAddress(netnsPath)
	if err != nil {
		return err
	}
	chain := allowChain(id)
	lines := []string{"*filter", ":" + chain + " - [0:0]",
		"-A " + chain + " -m conntrack --ctstate ESTABLISHED,RELATED -j RETURN"}
	for _, m := range nameserverRe.FindAllStringSubmatch(resolvConf, -1) {
		for _, proto := range []string{"udp", "tcp"} {
			lines = append(lines, fmt.Sprintf("-A %s -d %s/32 -p %s --dport 53 -j RETURN", chain, m[1], proto))
		}
	}
	for _, cidr := range cidrs {
		if _, n, err := net.ParseCIDR(cidr); err != nil || n.IP.To4() == nil {
			return fmt.Errorf("allow: %q is not an IPv4 CIDR", cidr)
		}
		lines = append(lines, fmt.Sprintf("-A %s -d %s -j RETURN", chain, cidr))
	}
	lines = append(lines, "-A "+chain+" -p tcp -j REJECT --reject-with tcp-reset",
		"-A "+chain+" -j REJECT --reject-with icmp-admin-prohibited", "COMMIT", "")
	firewallMu.Lock()
	defer firewallMu.Unlock()
	restore := exec.Command("iptables-restore", "-w", "--noflush")
	restore.Stdin = strings.NewReader(strings.Join(lines, "\n"))
	if out, err := restore.CombinedOutput(); err != nil {
		return fmt.Errorf("iptables-restore of %s: %v: %s", chain, err, out)
	}
	jump := []string{"HUTCH-NOMAD-FWD", "-i", bridgeName, "-s", ip, "-m", "comment", "--comment", "hutch:" + id, "-j", chain}
	if ipt(append([]string{"-C"}, jump...)...) == nil {
		return nil
	}
	return ipt(append([]string{"-I", jump[0], "1"}, jump[1:]...)...)
}

// setAllowed is the allow verb: the task's chain with new addresses.
func (h *taskHandle) setAllowed(cidrs []string) (*drivers.ExitResult, error) {
	var tc TaskConfig
	if err := h.cfg.DecodeDriverConfig(&tc); err != nil || len(tc.Allow) == 0 {
		return nil, fmt.Errorf("task %s has no allow-list to update", h.container.ID())
	}
	ni := h.cfg.NetworkIsolation
	if ni == nil || ni.Path == "" {
		return nil, fmt.Errorf("task %s has no group network", h.container.ID())
	}
	if err := setAllowed(ni.Path, h.container.ID(), tc.ResolvConf, cidrs); err != nil {
		return nil, err
	}
	return &drivers.ExitResult{ExitCode: 0}, nil
}

// removeAllowChain deletes the chain of container id (its jump goes with removeOutboundRule).
func removeAllowChain(id string) {
	chain := allowChain(id)
	firewallMu.Lock()
	defer firewallMu.Unlock()
	if ipt("-F", chain) == nil {
		_ = ipt("-X", chain)
	}
}

func bridgeAddress(netnsPath string) (string, error) {
	out, err := exec.Command("nsenter", "--net="+netnsPath, "ip", "-4", "-o", "addr", "show", "eth0").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("reading the address of %s: %v: %s", netnsPath, err, out)
	}
	m := inetRe.FindSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("eth0 of %s has no IPv4 address: %s", netnsPath, out)
	}
	return string(m[1]), nil
}
