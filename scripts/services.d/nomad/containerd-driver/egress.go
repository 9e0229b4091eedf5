package main

// What a sandbox with a network may reach. Every task on the bridge that may open connections
// gets a chain of its own, jumped to from the head of HUTCH-NOMAD-FWD for packets from its
// bridge address (a port-only task has restrictOutbound's rule instead: it opens nothing):
//
//   - replies, and DNS to the name servers of its resolv.conf (the host's, often on a private
//     address), return to HUTCH-NOMAD-FWD;
//   - the denied ranges are refused: the task config's `denied`, which the hutch server
//     computes with core/egress.denied_ranges (the always-denied ranges, the private ones
//     unless HUTCH_SANDBOX_EGRESS_PERMIT opens some, HUTCH_SANDBOX_EGRESS_DENY's); a task
//     without it gets defaultDenied, the same default;
//   - with network.allow (IPv4 CIDRs the hutch server resolved), the listed CIDRs return and
//     anything else is refused; without it, everything else returns.
//
// So HUTCH-NOMAD-FWD's own drops (the always-denied ranges, the plugin config's denied_cidrs)
// still apply after the chain: a list narrows, never widens. Refusals are rejects, TCP with a
// reset, so connect() fails at once. The hutch server re-resolves allow-list names and sends
// the new set with the `{"allow": [...]}` verb, which replaces the chain whole
// (iptables-restore).

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

// defaultDenied is core/egress.py's denied_ranges() with no operator setting: ALWAYS_DENIED
// and PRIVATE. The hutch server always sends its own list; this is for a task that has none.
var defaultDenied = []string{
	"0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/4", "240.0.0.0/4",
	"10.0.0.0/8", "100.64.0.0/10", "172.16.0.0/12", "192.168.0.0/16",
}

var (
	nameserverRe = regexp.MustCompile(`(?m)^nameserver\s+(\d+\.\d+\.\d+\.\d+)\s*$`)
	inetRe       = regexp.MustCompile(`inet (\d+\.\d+\.\d+\.\d+)/`)
)

// egressChain is the task's chain name (iptables allows 28 characters).
func egressChain(id string) string {
	sum := sha256.Sum256([]byte(id))
	return "HNA-" + hex.EncodeToString(sum[:])[:20]
}

// egressRules is the chain's iptables-restore input; limited: allow is an allow-list (an
// empty one refuses everything), else there is none.
func egressRules(chain, resolvConf string, denied []string, limited bool, allow []string) (string, error) {
	if len(denied) == 0 {
		denied = defaultDenied
	}
	lines := []string{"*filter", ":" + chain + " - [0:0]",
		"-A " + chain + " -m conntrack --ctstate ESTABLISHED,RELATED -j RETURN"}
	for _, m := range nameserverRe.FindAllStringSubmatch(resolvConf, -1) {
		for _, proto := range []string{"udp", "tcp"} {
			lines = append(lines, fmt.Sprintf("-A %s -d %s/32 -p %s --dport 53 -j RETURN", chain, m[1], proto))
		}
	}
	reject := func(match string) {
		lines = append(lines, "-A "+chain+match+" -p tcp -j REJECT --reject-with tcp-reset",
			"-A "+chain+match+" -j REJECT --reject-with icmp-admin-prohibited")
	}
	for _, cidr := range denied {
		if _, n, err := net.ParseCIDR(cidr); err != nil || n.IP.To4() == nil {
			return "", fmt.Errorf("denied: %q is not an IPv4 CIDR", cidr)
		}
		reject(" -d " + cidr)
	}
	if limited {
		for _, cidr := range allow {
			if _, n, err := net.ParseCIDR(cidr); err != nil || n.IP.To4() == nil {
				return "", fmt.Errorf("allow: %q is not an IPv4 CIDR", cidr)
			}
			lines = append(lines, fmt.Sprintf("-A %s -d %s -j RETURN", chain, cidr))
		}
		reject("")
	}
	return strings.Join(append(lines, "COMMIT", ""), "\n"), nil
}

// setEgress installs (or replaces) the chain of container id and its jump.
func setEgress(netnsPath, id, resolvConf string, denied []string, limited bool, allow []string) error {
	ip, err := bridgeAddress(netnsPath)
	if err != nil {
		return err
	}
	chain := egressChain(id)
	rules, err := egressRules(chain, resolvConf, denied, limited, allow)
	if err != nil {
		return err
	}
	firewallMu.Lock()
	defer firewallMu.Unlock()
	restore := exec.Command("iptables-restore", "-w", "--noflush")
	restore.Stdin = strings.NewReader(rules)
	if out, err := restore.CombinedOutput(); err != nil {
		return fmt.Errorf("iptables-restore of %s: %v: %s", chain, err, out)
	}
	jump := []string{"HUTCH-NOMAD-FWD", "-i", bridgeName, "-s", ip, "-m", "comment", "--comment", "hutch:" + id, "-j", chain}
	if ipt(append([]string{"-C"}, jump...)...) == nil {
		return nil
	}
	return ipt(append([]string{"-I", jump[0], "1"}, jump[1:]...)...)
}

// setAllowed is the allow verb: the task's chain with new allow-list addresses.
func (h *taskHandle) setAllowed(cidrs []string) (*drivers.ExitResult, error) {
	var tc TaskConfig
	if err := h.cfg.DecodeDriverConfig(&tc); err != nil || len(tc.Allow) == 0 {
		return nil, fmt.Errorf("task %s has no allow-list to update", h.container.ID())
	}
	ni := h.cfg.NetworkIsolation
	if ni == nil || ni.Path == "" {
		return nil, fmt.Errorf("task %s has no group network", h.container.ID())
	}
	if err := setEgress(ni.Path, h.container.ID(), tc.ResolvConf, tc.Denied, true, cidrs); err != nil {
		return nil, err
	}
	return &drivers.ExitResult{ExitCode: 0}, nil
}

// removeEgressChain deletes the chain of container id (its jump goes with removeOutboundRule).
func removeEgressChain(id string) {
	chain := egressChain(id)
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
