package main

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rgproxy/rgproxy/internal/statuspage"
)

func TestParseArgs(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "rgserver.toml")
	if err := os.WriteFile(file, []byte(`
addr = "0.0.0.0:4000"
election-ttl = "5s"
client-expiry = "2m"
etcd-endpoints = "http://a:2379, http://b:2379"
insecure = true
`), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.toml")
	if err := os.WriteFile(bad, []byte(`adress = "x"`), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		args    []string
		check   func(config) bool
		wantErr error
	}{
		{"defaults", nil, func(c config) bool {
			return c.Addr == "127.0.0.1:3379" && c.StatusAddr == "127.0.0.1:3380" && c.DataDir == "./rgserver-data" &&
				c.ElectionTTL == 3*time.Second && c.ClientExpiry == time.Minute && c.AdvertiseAddr == "127.0.0.1:3379" &&
				c.PersistInterval == 5*time.Second && c.EtcdCompactionRetention == time.Hour && c.EtcdQuotaBackendBytes == 8<<30
		}, nil},
		{"etcd bounds", []string{"--persist-interval", "1s", "--etcd-compaction-retention", "5m", "--etcd-quota-backend-bytes", "1073741824"}, func(c config) bool {
			return c.PersistInterval == time.Second && c.EtcdCompactionRetention == 5*time.Minute && c.EtcdQuotaBackendBytes == 1<<30
		}, nil},
		{"no retention", []string{"--etcd-compaction-retention", "0s"}, nil, errUsage},
		{"no quota", []string{"--etcd-quota-backend-bytes", "0"}, nil, errUsage},
		{"no persist interval", []string{"--persist-interval", "0s"}, nil, errUsage},
		{"file", []string{"--config", file}, func(c config) bool {
			return c.Addr == "0.0.0.0:4000" && c.ElectionTTL == 5*time.Second && c.ClientExpiry == 2*time.Minute &&
				c.StatusAddr == "127.0.0.1:3380" && c.AdvertiseAddr == "0.0.0.0:4000" && c.Insecure
		}, nil},
		{"flags win over file", []string{"--election-ttl", "4s", "--config", file}, func(c config) bool {
			return c.ElectionTTL == 4*time.Second && c.Addr == "0.0.0.0:4000"
		}, nil},
		{"peer addr gets a scheme", []string{"--etcd-peer-addr", "10.0.0.1:2380", "--etcd-initial-cluster", "a=http://10.0.0.1:2380"}, func(c config) bool {
			return c.EtcdPeerAddr == "http://10.0.0.1:2380"
		}, nil},
		{"unknown key in file", []string{"--config", bad}, nil, errUsage},
		{"missing file", []string{"--config", filepath.Join(dir, "none.toml")}, nil, errUsage},
		{"unknown flag", []string{"--nope"}, nil, errUsage},
		{"stray argument", []string{"extra"}, nil, errUsage},
		{"cert without key", []string{"--tls-cert", "c.pem"}, nil, errUsage},
		{"ca without cert", []string{"--tls-ca", "ca.pem"}, nil, errUsage},
		{"ttl under a second", []string{"--election-ttl", "500ms"}, nil, errUsage},
		{"endpoints with peer", []string{"--config", file, "--etcd-peer-addr", "http://x:1"}, nil, errUsage},
		{"help", []string{"--help"}, nil, flag.ErrHelp},
		// Beyond loopback, some authentication or --insecure.
		{"wildcard without auth", []string{"--addr", "0.0.0.0:3379"}, nil, errUsage},
		{"empty host without auth", []string{"--addr", ":3379"}, nil, errUsage},
		{"wildcard, insecure", []string{"--addr", "0.0.0.0:3379", "--insecure"}, func(c config) bool { return c.Insecure }, nil},
		{"wildcard with tokens", []string{"--addr", "0.0.0.0:3379", "--admin-token-file", "a", "--proxy-token-file", "p"}, func(c config) bool {
			return c.AdminTokenFile == "a" && c.ProxyTokenFile == "p" && c.TLSProxyMaxStreams == 1
		}, nil},
		{"wildcard with mTLS", []string{"--addr", "[::]:3379", "--tls-cert", "c", "--tls-key", "k", "--tls-ca", "ca", "--tls-admin-names", "ops, admin2", "--tls-proxy-max-streams", "4"}, func(c config) bool {
			return c.TLSAdminNames == "ops, admin2" && c.TLSProxyMaxStreams == 4
		}, nil},
		{"loopback without auth", []string{"--addr", "localhost:3379"}, func(c config) bool { return !c.authenticates() }, nil},
		{"insecure with a token", []string{"--insecure", "--admin-token-file", "a"}, nil, errUsage},
		{"admin names without ca", []string{"--tls-admin-names", "ops"}, nil, errUsage},
		{"no proxy streams", []string{"--tls-proxy-max-streams", "0"}, nil, errUsage},
		{"budget time zone defaults to UTC", nil, func(c config) bool { return c.BudgetTimeZone == "UTC" && c.budgetLoc == time.UTC }, nil},
		{"budget time zone", []string{"--budget-time-zone", "Europe/Berlin"}, func(c config) bool {
			return c.budgetLoc != nil && c.budgetLoc.String() == "Europe/Berlin"
		}, nil},
		{"unknown budget time zone", []string{"--budget-time-zone", "Mars/Olympus"}, nil, errUsage},
		{"budget time zone in the wrong case", []string{"--budget-time-zone", "europe/berlin"}, nil, errUsage},
		{"local budget time zone", []string{"--budget-time-zone", "Local"}, nil, errUsage},
		{"empty budget time zone", []string{"--budget-time-zone", ""}, nil, errUsage},
		{"compressed budget days", []string{"--budget-day-length", "20s"}, func(c config) bool { return c.BudgetDayLength == 20*time.Second }, nil},
		{"budget day too short", []string{"--budget-day-length", "500ms"}, nil, errUsage},
		{"budget day too long", []string{"--budget-day-length", "25h"}, nil, errUsage},
		{"digest bindings default", nil, func(c config) bool { return c.MaxDigestBindings == 10000 }, nil},
		{"digest bindings", []string{"--max-digest-bindings", "3"}, func(c config) bool { return c.MaxDigestBindings == 3 }, nil},
		{"no digest bindings", []string{"--max-digest-bindings", "0"}, nil, errUsage},
		{"too many digest bindings", []string{"--max-digest-bindings", "1000001"}, nil, errUsage},
		{"service limit", []string{"--service-limit", "8000"}, func(c config) bool { return c.ServiceLimit == 8000 }, nil},
		{"service limit too large", []string{"--service-limit", "1000000000000000001"}, nil, errUsage},
		{"service limit negative", []string{"--service-limit", "-1"}, nil, errUsage},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			c, _, err := parseArgs(tc.args, &stderr)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(c) {
				t.Fatalf("config = %+v", c)
			}
		})
	}
}

func TestHelpDocumentsEveryFlag(t *testing.T) {
	var out bytes.Buffer
	usage(&out)
	for _, f := range []string{"addr", "status-addr", "data-dir", "etcd-endpoints", "etcd-peer-addr", "etcd-initial-cluster",
		"name", "advertise-addr", "election-ttl", "client-expiry", "tls-cert", "tls-key", "tls-ca", "admin-token-file",
		"proxy-token-file", "tls-admin-names", "tls-proxy-max-streams", "insecure", "config", "version", "budget-time-zone", "budget-day-length", "service-limit"} {
		if !strings.Contains(out.String(), "-"+f+" ") && !strings.Contains(out.String(), "-"+f+"\n") {
			t.Errorf("--help does not document --%s", f)
		}
	}
}

func TestVersion(t *testing.T) {
	var out, errOut bytes.Buffer
	if err := run([]string{"--version"}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "rgserver ") {
		t.Fatalf("--version printed %q", out.String())
	}
}

// rgserver's console is on its status address: its default must be a
// port browsers open.
func TestConsoleDefaultOpensInABrowser(t *testing.T) {
	if addr := defaultConfig().StatusAddr; statuspage.BrowserBlocked(addr) {
		t.Fatalf("browsers refuse the default --status-addr %s, where the console is", addr)
	}
}
