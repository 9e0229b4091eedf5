package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/nomad/plugins/drivers"
)

func TestChainRulesOrderAndGeneration(t *testing.T) {
	r := egressRules{Limited: true, Allow: []string{"203.0.113.7/32"}, Deny: []string{"0.0.0.0/0"}, Generation: 2}
	rules, err := chainRules("HNA-x", "nameserver 10.0.0.53\n", []string{"10.0.0.0/8"}, r)
	if err != nil {
		t.Fatal(err)
	}
	at := func(s string) int {
		i := strings.Index(rules, s)
		if i < 0 {
			t.Fatalf("%q not in\n%s", s, rules)
		}
		return i
	}
	// New connections carry generation 2's mark; only those skip the checks.
	mark := at("--set-xmark 0x30000/0xfff0000")
	current := at("--mark 0x30000/0xfff0000 -j RETURN")
	// The deny-list comes before DNS: "off" (0.0.0.0/0) leaves no name server either.
	deny := at("-d 0.0.0.0/0 -p tcp -j REJECT")
	dns := at("-d 10.0.0.53/32 -p udp --dport 53 -j RETURN")
	denied := at("-d 10.0.0.0/8 -p tcp -j REJECT")
	allow := at("-d 203.0.113.7/32 -j RETURN")
	if !(mark < current && current < deny && deny < dns && dns < denied && denied < allow) {
		t.Fatalf("rules out of order:\n%s", rules)
	}
	if !strings.HasSuffix(rules, "-A HNA-x -j REJECT --reject-with icmp-admin-prohibited\nCOMMIT\n") {
		t.Fatalf("an allow-list does not end in a reject:\n%s", rules)
	}
}

func TestChainRulesTakeOnlyIPv4CIDRs(t *testing.T) {
	for _, bad := range []string{"1.2.3.4", "::/0", "1.2.3.0/24 -j ACCEPT", "1.2.3.0/24\n-A X -j ACCEPT"} {
		for _, r := range []egressRules{{Deny: []string{bad}}, {Limited: true, Allow: []string{bad}}} {
			if _, err := chainRules("HNA-x", "", nil, r); err == nil {
				t.Fatalf("%q was taken", bad)
			}
		}
	}
}

func TestRulesOfTheMomentOutliveARestart(t *testing.T) {
	cfg := &drivers.TaskConfig{AllocDir: t.TempDir(), Name: "sandbox"}
	if err := os.MkdirAll(cfg.TaskDir().Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	created := TaskConfig{Allow: []string{"203.0.113.7/32"}}
	if got := loadRules(cfg, created); !got.Limited || got.Allow[0] != "203.0.113.7/32" || got.Generation != 0 {
		t.Fatalf("without a file, the task config's rules: %+v", got)
	}
	updated := egressRules{Deny: []string{"0.0.0.0/0"}, Generation: 3}
	if err := saveRules(rulesFile(cfg), updated); err != nil {
		t.Fatal(err)
	}
	if got := loadRules(cfg, created); got.Limited || got.Deny[0] != "0.0.0.0/0" || got.Generation != 3 {
		t.Fatalf("the update's rules: %+v", got)
	}
	// A file that does not read back refuses everything, never the (wider) create-time rules.
	if err := os.WriteFile(rulesFile(cfg), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := loadRules(cfg, TaskConfig{}); len(got.Deny) != 1 || got.Deny[0] != "0.0.0.0/0" {
		t.Fatalf("a torn file: %+v", got)
	}
	if _, err := os.Stat(filepath.Join(cfg.TaskDir().Dir, "hutch-egress.json")); err != nil {
		t.Fatal(err)
	}
}
