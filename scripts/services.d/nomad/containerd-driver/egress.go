package main

// What a sandbox with a network may reach. Every task on the bridge that may open connections
// gets a chain of its own, jumped to from the head of HUTCH-NOMAD-FWD for packets from its
// bridge address (a port-only task has restrictOutbound's rule instead: it opens nothing):
//
//   - replies pass: to connections the sandbox opened under the rules now in force (see
//     generationMark), and to connections opened towards it (its port);
//   - the sandbox's own network.deny is refused (its name servers too: 0.0.0.0/0 there is
//     network off, which is how the hutch server turns a live sandbox's network off);
//   - DNS to the name servers of its resolv.conf (the host's, often on a private address)
//     returns to HUTCH-NOMAD-FWD;
//   - the denied ranges are refused: the task config's `denied`, which the hutch server
//     computes with core/egress.denied_ranges (the always-denied ranges, the private ones
//     unless HUTCH_SANDBOX_EGRESS_PERMIT opens some, HUTCH_SANDBOX_EGRESS_DENY's); a task
//     without it gets defaultDenied, the same default;
//   - with an allow-list (IPv4 CIDRs the hutch server resolved), the listed CIDRs return and
//     anything else is refused; without it, everything else returns.
//
// So HUTCH-NOMAD-FWD's own drops (the always-denied ranges, the plugin config's denied_cidrs)
// still apply after the chain: a list narrows, never widens. Refusals are rejects, TCP with a
// reset, so connect() fails at once. Two verbs replace the chain whole, in one
// iptables-restore commit: `{"egress": {...}}` (a live sandbox's update_network: new rules,
// a new generation) and `{"allow": [...]}` (the hutch server re-resolved the allow-list's
// names: new addresses, the same generation).

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
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

// egressRules is what a task's chain enforces beyond the server's denied ranges: the task
// config's at the start, replaced whole by the egress verb (a live sandbox's update_network)
// and its allow-list addresses by the allow verb (a refresh of its names). They are kept in
// the task dir (rulesFile, never mounted into the sandbox), so a plugin restart (RecoverTask)
// puts back the rules of the moment, not those the task was created with.
type egressRules struct {
	Limited bool     `json:"limited"` // Allow is an allow-list (an empty one refuses everything)
	Allow   []string `json:"allow"`   // its CIDRs
	Deny    []string `json:"deny"`    // network.deny's CIDRs; 0.0.0.0/0: network off
	// Generation: bumped by each egress verb, kept by the allow verb; see generationMark.
	Generation int `json:"generation"`
}

// Connections a sandbox opens are marked (conntrack's mark, these bits, as the local
// driver's network.py does) with the generation of the rules that let them through; only
// those of the rules now in force skip the checks. An egress verb bumps the generation, so a
// connection opened under the old rules is judged anew by the new ones packet by packet: one
// to a destination they no longer allow is reset, not carried on because it was established.
// A refresh of an allow-list's addresses keeps the generation (a name whose addresses rotated
// does not cut a download under way). Connections opened towards the sandbox (its port) carry
// no mark: their replies pass, as they always did.
const generationMask = 0x0FFF0000

func generationMark(generation int) string {
	return fmt.Sprintf("0x%x/0x%x", ((generation%0xFFF)+1)<<16, generationMask)
}

// rulesFile is where a task's current egressRules are kept.
func rulesFile(cfg *drivers.TaskConfig) string {
	return filepath.Join(cfg.TaskDir().Dir, "hutch-egress.json")
}

// loadRules: the task's rules of the moment; the task config's if no verb changed them. A
// file that cannot be read back (it is only ever written whole) refuses everything rather
// than fall back to the create-time rules, which may be wider.
func loadRules(cfg *drivers.TaskConfig, tc TaskConfig) egressRules {
	data, err := os.ReadFile(rulesFile(cfg))
	if errors.Is(err, os.ErrNotExist) {
		return egressRules{Limited: len(tc.Allow) > 0, Allow: tc.Allow, Deny: tc.Deny}
	}
	var r egressRules
	if err != nil || json.Unmarshal(data, &r) != nil {
		return egressRules{Deny: []string{"0.0.0.0/0"}}
	}
	return r
}

// outboundRules: the rules of a task with outbound network on the bridge (it has a chain);
// nil for any other (a port only, or no network).
func outboundRules(cfg *drivers.TaskConfig) *egressRules {
	var tc TaskConfig
	if err := cfg.DecodeDriverConfig(&tc); err != nil || tc.NoOutbound {
		return nil
	}
	ni := cfg.NetworkIsolation
	if ni == nil || ni.Mode != drivers.NetIsolationModeGroup || ni.Path == "" {
		return nil
	}
	r := loadRules(cfg, tc)
	return &r
}

func saveRules(path string, r egressRules) error {
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func ipv4CIDRs(field string, cidrs []string) error {
	for _, cidr := range cidrs {
		// Each becomes part of a rule line: only a parsed IPv4 network gets there.
		if _, n, err := net.ParseCIDR(cidr); err != nil || n.IP.To4() == nil || strings.ContainsAny(cidr, " \n\t") {
			return fmt.Errorf("%s: %q is not an IPv4 CIDR", field, cidr)
		}
	}
	return nil
}

// chainRules is the chain's iptables-restore input: the sandbox's own deny-list first (its
// name servers included: 0.0.0.0/0 there is no network at all), then DNS to its name servers
// (the host's, often on a private address), the server's denied ranges, and the allow-list
// if it has one.
func chainRules(chain, resolvConf string, denied []string, r egressRules) (string, error) {
	if len(denied) == 0 {
		denied = defaultDenied
	}
	for field, cidrs := range map[string][]string{"denied": denied, "deny": r.Deny, "allow": r.Allow} {
		if err := ipv4CIDRs(field, cidrs); err != nil {
			return "", err
		}
	}
	mark := generationMark(r.Generation)
	lines := []string{"*filter", ":" + chain + " - [0:0]",
		"-A " + chain + " -m conntrack --ctstate NEW -j CONNMARK --set-xmark " + mark,
		"-A " + chain + " -m conntrack --ctstate ESTABLISHED,RELATED -m connmark --mark " + mark + " -j RETURN",
		fmt.Sprintf("-A %s -m conntrack --ctstate ESTABLISHED,RELATED -m connmark --mark 0x0/0x%x -j RETURN",
			chain, generationMask)}
	reject := func(match string) {
		lines = append(lines, "-A "+chain+match+" -p tcp -j REJECT --reject-with tcp-reset",
			"-A "+chain+match+" -j REJECT --reject-with icmp-admin-prohibited")
	}
	for _, cidr := range r.Deny {
		reject(" -d " + cidr)
	}
	for _, m := range nameserverRe.FindAllStringSubmatch(resolvConf, -1) {
		for _, proto := range []string{"udp", "tcp"} {
			lines = append(lines, fmt.Sprintf("-A %s -d %s/32 -p %s --dport 53 -j RETURN", chain, m[1], proto))
		}
	}
	for _, cidr := range denied {
		reject(" -d " + cidr)
	}
	if r.Limited {
		for _, cidr := range r.Allow {
			lines = append(lines, fmt.Sprintf("-A %s -d %s -j RETURN", chain, cidr))
		}
		reject("")
	}
	return strings.Join(append(lines, "COMMIT", ""), "\n"), nil
}

// setEgress installs (or replaces, in one commit) the chain of container id and its jump.
func setEgress(netnsPath, id, resolvConf string, denied []string, r egressRules) error {
	ip, err := bridgeAddress(netnsPath)
	if err != nil {
		return err
	}
	chain := egressChain(id)
	rules, err := chainRules(chain, resolvConf, denied, r)
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

// errNoOutbound: the task has no chain to change (made without outbound network: a port
// only, or no network at all). The verbs answer it with exitNoOutbound.
var errNoOutbound = errors.New("the sandbox was made without outbound network")

const exitNoOutbound = 3

// replaceRules puts next in force and keeps it (rulesFile); the old rules stay in force, and
// on record, if either fails.
func (h *taskHandle) replaceRules(next func(egressRules) (egressRules, error)) error {
	h.egressMu.Lock()
	defer h.egressMu.Unlock()
	if h.egress == nil {
		return errNoOutbound
	}
	var tc TaskConfig
	if err := h.cfg.DecodeDriverConfig(&tc); err != nil {
		return err
	}
	ni := h.cfg.NetworkIsolation
	if ni == nil || ni.Path == "" {
		return errNoOutbound
	}
	r, err := next(*h.egress)
	if err != nil {
		return err
	}
	if err := setEgress(ni.Path, h.container.ID(), tc.ResolvConf, tc.Denied, r); err != nil {
		return err
	}
	if err := saveRules(rulesFile(h.cfg), r); err != nil {
		if back := setEgress(ni.Path, h.container.ID(), tc.ResolvConf, tc.Denied, *h.egress); back != nil {
			return fmt.Errorf("keeping the rules: %v; putting the old ones back: %v", err, back)
		}
		return fmt.Errorf("keeping the rules: %v", err)
	}
	h.egress = &r
	return nil
}

// setAllowed is the allow verb: the task's allow-list with new addresses, same generation.
func (h *taskHandle) setAllowed(cidrs []string) error {
	return h.replaceRules(func(r egressRules) (egressRules, error) {
		if !r.Limited {
			return r, fmt.Errorf("task %s has no allow-list to update", h.container.ID())
		}
		r.Allow = cidrs
		return r, nil
	})
}

// egressUpdate is the egress verb's body: the rules replaced whole.
type egressUpdate struct {
	Allow *[]string `json:"allow"` // null: no allow-list
	Deny  []string  `json:"deny"`
}

// setRules is the egress verb: the task's rules replaced whole under a new generation.
func (h *taskHandle) setRules(u egressUpdate) error {
	return h.replaceRules(func(r egressRules) (egressRules, error) {
		next := egressRules{Deny: u.Deny, Generation: r.Generation + 1}
		if u.Allow != nil {
			next.Limited, next.Allow = true, *u.Allow
		}
		return next, nil
	})
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
