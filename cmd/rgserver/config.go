package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"
	_ "time/tzdata" // --budget-time-zone's names, whatever the host has

	"github.com/BurntSushi/toml"

	"github.com/rgproxy/rgproxy/internal/netaddr"
	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/tokenserver"
)

// errUsage marks a bad command line or config file (exit status 2).
var errUsage = errors.New("rgserver: usage")

// config is rgserver's configuration. The TOML keys mirror the flags;
// flags given on the command line win over the file.
type config struct {
	// Addr is the gRPC listen address. Default 127.0.0.1:3379 (loopback).
	Addr string `toml:"addr"`
	// StatusAddr serves /metrics, /healthz, /readyz. Default 127.0.0.1:3380.
	StatusAddr string `toml:"status-addr"`
	// DataDir holds the embedded etcd member's data. Default ./rgserver-data.
	DataDir string `toml:"data-dir"`
	// EtcdEndpoints, comma-separated, selects an existing etcd cluster
	// instead of the embedded member. Default "" (embedded).
	EtcdEndpoints string `toml:"etcd-endpoints"`
	// EtcdPeerAddr is the embedded member's peer URL (http://host:port),
	// needed when several rgservers form one etcd cluster. Default "" (a
	// free loopback port, single node).
	EtcdPeerAddr string `toml:"etcd-peer-addr"`
	// EtcdInitialCluster lists every embedded member as name=peerURL,...
	// Default "" (this member alone).
	EtcdInitialCluster string `toml:"etcd-initial-cluster"`
	// Name is this replica's etcd member name. Default "rgserver".
	Name string `toml:"name"`
	// AdvertiseAddr is the gRPC address proxies are sent to when this
	// replica leads. Default: Addr.
	AdvertiseAddr string `toml:"advertise-addr"`
	// ElectionTTL is the leader's session TTL (whole seconds). Default 3s.
	ElectionTTL time.Duration `toml:"election-ttl"`
	// ClientExpiry drops a vanished proxy's slots after this long. Default 60s.
	ClientExpiry time.Duration `toml:"client-expiry"`
	// PersistInterval is how often the leader saves the bucket states that
	// changed. Default 5s.
	PersistInterval time.Duration `toml:"persist-interval"`
	// RunawayHistoryRetention is how long the runaway history keeps a row
	// after its last event. Default 168h.
	RunawayHistoryRetention time.Duration `toml:"runaway-history-retention"`
	// EtcdCompactionRetention is the history the embedded member keeps
	// (periodic compaction). Default 1h.
	EtcdCompactionRetention time.Duration `toml:"etcd-compaction-retention"`
	// EtcdQuotaBackendBytes is the embedded member's database quota
	// (NOSPACE beyond it). Default 8 GiB.
	EtcdQuotaBackendBytes int64 `toml:"etcd-quota-backend-bytes"`
	// TLSCert and TLSKey (PEM files) turn on TLS for gRPC. Default "" (plaintext).
	TLSCert string `toml:"tls-cert"`
	TLSKey  string `toml:"tls-key"`
	// TLSCA (PEM file) requires and verifies client certificates (mTLS).
	// Default "" (no client certificates).
	TLSCA string `toml:"tls-ca"`
	// AdminTokenFile holds the administrators' bearer token: it may call
	// every RPC. Default "" (none).
	AdminTokenFile string `toml:"admin-token-file"`
	// ProxyTokenFile holds the proxies' bearer tokens, one per line as
	// "<name> <token> [max-streams]" (or one bare token): a proxy token
	// may stream tokens, watch and read, not change anything. Default ""
	// (none).
	ProxyTokenFile string `toml:"proxy-token-file"`
	// TLSAdminNames, comma-separated, are the client certificate
	// identities (subject CN, DNS, URI or e-mail SAN) that are
	// administrators under --tls-ca; every other verified certificate is
	// a proxy. Default "" (none).
	TLSAdminNames string `toml:"tls-admin-names"`
	// TLSProxyMaxStreams is how many proxies one proxy certificate
	// identity may be at once (AcquireTokens streams, proxy ids). Default 1.
	TLSProxyMaxStreams int `toml:"tls-proxy-max-streams"`
	// Insecure lets rgserver listen beyond loopback with no
	// authentication at all (anyone who reaches it may change groups).
	// Default false.
	Insecure bool `toml:"insecure"`
	// LogLevel is debug, info, warn or error. Default info.
	LogLevel string `toml:"log-level"`
	// BudgetTimeZone is the IANA time zone budgets' windows align to
	// (docs/budgets.md). Default UTC. Every replica needs the same one;
	// a change needs a restart.
	BudgetTimeZone string `toml:"budget-time-zone"`
	// budgetLoc is BudgetTimeZone loaded, by check.
	budgetLoc *time.Location
	// BudgetDayLength is how long a budget's DAY lasts: 24h (real days
	// in BudgetTimeZone) but for tests and soak runs, which compress
	// budgets' time (an HOUR 1/24 of it, a WEEK 7 and a MONTH 30 of them,
	// aligned to the Unix epoch). A change needs a restart.
	BudgetDayLength time.Duration `toml:"budget-day-length"`
	// MaxDigestBindings bounds the digest bindings (CREATE RESOURCE GROUP
	// BINDING FOR DIGEST) kept in etcd and sent to every proxy. Default
	// 10,000.
	MaxDigestBindings int `toml:"max-digest-bindings"`
	// ServiceLimit is the service limit in RU/s (0: none) while etcd holds
	// none set by SQL (ALTER RESOURCE CONTROL SERVICE LIMIT, which
	// overrides it on every replica). A change needs a restart.
	ServiceLimit uint64 `toml:"service-limit"`

	// ConfigFile is --config, read at start and on SIGHUP (not a key).
	ConfigFile string `toml:"-"`
}

// maxDigestBindings is the largest --max-digest-bindings: every proxy keeps
// every binding, and a snapshot part carries them.
const maxDigestBindings = 1000000

func defaultConfig() config {
	return config{
		Addr:         "127.0.0.1:3379",
		StatusAddr:   "127.0.0.1:3380",
		DataDir:      "./rgserver-data",
		Name:         "rgserver",
		ElectionTTL:  3 * time.Second,
		ClientExpiry: 60 * time.Second,
		LogLevel:     "info",

		BudgetTimeZone:     "UTC",
		BudgetDayLength:    24 * time.Hour,
		TLSProxyMaxStreams: 1,
		MaxDigestBindings:  resourcegroup.MaxDigestBindings,

		PersistInterval:         tokenserver.DefaultPersistInterval,
		RunawayHistoryRetention: tokenserver.DefaultRunawayRetention,
		EtcdCompactionRetention: tokenserver.DefaultCompactionRetention,
		EtcdQuotaBackendBytes:   tokenserver.DefaultQuotaBackendBytes,
	}
}

// bind declares every flag onto c, with c's current values as defaults.
func bind(fs *flag.FlagSet, c *config, configFile *string, version *bool) {
	fs.StringVar(configFile, "config", "", "TOML file whose keys mirror these flags (flags win)")
	fs.BoolVar(version, "version", false, "print the version and exit")
	fs.StringVar(&c.Addr, "addr", c.Addr, "gRPC listen address")
	fs.StringVar(&c.StatusAddr, "status-addr", c.StatusAddr, "HTTP address for /metrics, /healthz, /readyz")
	fs.StringVar(&c.DataDir, "data-dir", c.DataDir, "data directory of the embedded etcd member")
	fs.StringVar(&c.EtcdEndpoints, "etcd-endpoints", c.EtcdEndpoints, "comma-separated endpoints of an existing etcd cluster (instead of embedding one)")
	fs.StringVar(&c.EtcdPeerAddr, "etcd-peer-addr", c.EtcdPeerAddr, "peer URL of the embedded etcd member, e.g. http://10.0.0.1:2380")
	fs.StringVar(&c.EtcdInitialCluster, "etcd-initial-cluster", c.EtcdInitialCluster, "embedded members as name=peerURL,... (one per rgserver)")
	fs.StringVar(&c.Name, "name", c.Name, "this replica's etcd member name")
	fs.StringVar(&c.AdvertiseAddr, "advertise-addr", c.AdvertiseAddr, "gRPC address proxies reach this replica at (default --addr)")
	fs.DurationVar(&c.ElectionTTL, "election-ttl", c.ElectionTTL, "leader session TTL; a dead leader is replaced after about this long")
	fs.DurationVar(&c.ClientExpiry, "client-expiry", c.ClientExpiry, "drop a silent proxy's share after this long")
	fs.DurationVar(&c.PersistInterval, "persist-interval", c.PersistInterval, "how often the leader saves the bucket states that changed to etcd")
	fs.DurationVar(&c.RunawayHistoryRetention, "runaway-history-retention", c.RunawayHistoryRetention, "how long information_schema.runaway_queries keeps a row after its last event")
	fs.DurationVar(&c.EtcdCompactionRetention, "etcd-compaction-retention", c.EtcdCompactionRetention, "history the embedded etcd member keeps; it compacts older revisions periodically")
	fs.Int64Var(&c.EtcdQuotaBackendBytes, "etcd-quota-backend-bytes", c.EtcdQuotaBackendBytes, "embedded etcd's database quota in bytes; beyond it etcd raises NOSPACE and refuses writes")
	fs.StringVar(&c.TLSCert, "tls-cert", c.TLSCert, "PEM certificate for gRPC TLS")
	fs.StringVar(&c.TLSKey, "tls-key", c.TLSKey, "PEM private key for gRPC TLS")
	fs.StringVar(&c.TLSCA, "tls-ca", c.TLSCA, "PEM CA bundle: require client certificates signed by it (mTLS)")
	fs.StringVar(&c.AdminTokenFile, "admin-token-file", c.AdminTokenFile, "file holding the administrators' bearer token (every RPC)")
	fs.StringVar(&c.ProxyTokenFile, "proxy-token-file", c.ProxyTokenFile, "file of proxy bearer tokens, lines \"<name> <token> [max-streams]\" (token and settings streams and reads)")
	fs.StringVar(&c.TLSAdminNames, "tls-admin-names", c.TLSAdminNames, "comma-separated client certificate identities (CN or SAN) that are administrators under --tls-ca; other certificates are proxies")
	fs.IntVar(&c.TLSProxyMaxStreams, "tls-proxy-max-streams", c.TLSProxyMaxStreams, "proxies one proxy certificate identity may be at once")
	fs.BoolVar(&c.Insecure, "insecure", c.Insecure, "accept every caller without authentication, even beyond loopback (anyone who reaches --addr may change groups)")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "log level: debug, info, warn, error")
	fs.StringVar(&c.BudgetTimeZone, "budget-time-zone", c.BudgetTimeZone, "IANA time zone (e.g. Europe/Berlin) that budgets' hours, days, weeks and months follow; the same on every replica")
	fs.IntVar(&c.MaxDigestBindings, "max-digest-bindings", c.MaxDigestBindings, "how many statement digests may be bound to resource groups (CREATE RESOURCE GROUP BINDING FOR DIGEST), 1 to 1000000")
	fs.Uint64Var(&c.ServiceLimit, "service-limit", c.ServiceLimit, "the RU/s of every MODE ENFORCE resource group together, shared by PRIORITY (0: none), until ALTER RESOURCE CONTROL SERVICE LIMIT sets one in etcd; at most 1e15")
	fs.DurationVar(&c.BudgetDayLength, "budget-day-length", c.BudgetDayLength, "how long a budget's DAY lasts: 24h but in tests and soak runs, which compress budgets' windows (1s to 24h); the same on every replica")
}

// parseArgs reads the command line and, with --config, the file under it.
// It returns version = true when --version was given.
func parseArgs(args []string, stderr io.Writer) (c config, version bool, err error) {
	// First pass: find --config. Second pass: flags over the file's values.
	c = defaultConfig()
	var file string
	fs := flag.NewFlagSet("rgserver", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	bind(fs, &c, &file, &version)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage(stderr)
		}
		return c, false, fmt.Errorf("%w: %w", errUsage, err)
	}
	c = defaultConfig()
	if file != "" {
		md, err := toml.DecodeFile(file, &c)
		if err != nil {
			return c, false, fmt.Errorf("%w: config %s: %w", errUsage, file, err)
		}
		if und := md.Undecoded(); len(und) > 0 {
			return c, false, fmt.Errorf("%w: config %s: unknown keys %v", errUsage, file, und)
		}
	}
	fs = flag.NewFlagSet("rgserver", flag.ContinueOnError)
	fs.SetOutput(stderr)
	bind(fs, &c, &file, &version)
	if err := fs.Parse(args); err != nil {
		return c, false, fmt.Errorf("%w: %w", errUsage, err)
	}
	if fs.NArg() > 0 {
		return c, false, fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args())
	}
	c.ConfigFile = file
	return c, version, c.check()
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: rgserver [flags]\n\nrgserver hands out tokens from one global bucket per resource group to every rgproxy.\n\nflags:")
	var c config
	var file string
	var v bool
	c = defaultConfig()
	fs := flag.NewFlagSet("rgserver", flag.ContinueOnError)
	bind(fs, &c, &file, &v)
	fs.SetOutput(w)
	fs.PrintDefaults()
}

// check rejects inconsistent settings.
func (c *config) check() error {
	switch {
	case c.Addr == "":
		return fmt.Errorf("%w: --addr is empty", errUsage)
	case (c.TLSCert == "") != (c.TLSKey == ""):
		return fmt.Errorf("%w: --tls-cert and --tls-key go together", errUsage)
	case c.TLSCA != "" && c.TLSCert == "":
		return fmt.Errorf("%w: --tls-ca needs --tls-cert and --tls-key", errUsage)
	case c.ElectionTTL < time.Second:
		return fmt.Errorf("%w: --election-ttl %v is under 1s", errUsage, c.ElectionTTL)
	case c.ClientExpiry <= 0:
		return fmt.Errorf("%w: --client-expiry must be positive", errUsage)
	case c.PersistInterval <= 0:
		return fmt.Errorf("%w: --persist-interval must be positive", errUsage)
	case c.RunawayHistoryRetention <= 0:
		return fmt.Errorf("%w: --runaway-history-retention must be positive", errUsage)
	case c.EtcdCompactionRetention <= 0:
		return fmt.Errorf("%w: --etcd-compaction-retention must be positive", errUsage)
	case c.EtcdQuotaBackendBytes <= 0:
		return fmt.Errorf("%w: --etcd-quota-backend-bytes must be positive", errUsage)
	case c.EtcdEndpoints != "" && (c.EtcdPeerAddr != "" || c.EtcdInitialCluster != ""):
		return fmt.Errorf("%w: --etcd-endpoints excludes --etcd-peer-addr and --etcd-initial-cluster", errUsage)
	case c.EtcdEndpoints == "" && c.DataDir == "":
		return fmt.Errorf("%w: --data-dir is empty", errUsage)
	case c.TLSAdminNames != "" && c.TLSCA == "":
		return fmt.Errorf("%w: --tls-admin-names needs --tls-ca (client certificates)", errUsage)
	case c.MaxDigestBindings < 1 || c.MaxDigestBindings > maxDigestBindings:
		return fmt.Errorf("%w: --max-digest-bindings %d: give 1 to %d", errUsage, c.MaxDigestBindings, maxDigestBindings)
	case c.TLSProxyMaxStreams < 1:
		return fmt.Errorf("%w: --tls-proxy-max-streams must be at least 1", errUsage)
	case c.Insecure && c.authenticates():
		return fmt.Errorf("%w: --insecure turns authentication off; it cannot go with --admin-token-file, --proxy-token-file or --tls-ca", errUsage)
	case !c.authenticates() && !c.Insecure && !netaddr.IsLoopback(c.Addr):
		return fmt.Errorf("%w: --addr %s is not a loopback address and no authentication is configured, so anyone who reaches it could change resource groups and take their tokens. "+
			"Add --admin-token-file and --proxy-token-file (bearer tokens; with --tls-cert and --tls-key so they do not travel in clear), "+
			"or --tls-cert, --tls-key, --tls-ca and --tls-admin-names (mutual TLS); or --insecure to run without authentication on a trusted network", errUsage, c.Addr)
	}
	if _, err := parseLevel(c.LogLevel); err != nil {
		return fmt.Errorf("%w: --log-level: %w", errUsage, err)
	}
	loc, err := loadBudgetZone(c.BudgetTimeZone)
	if err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	c.budgetLoc = loc
	if c.BudgetDayLength < time.Second || c.BudgetDayLength > 24*time.Hour {
		return fmt.Errorf("%w: --budget-day-length %v: give 1s to 24h (24h: real days)", errUsage, c.BudgetDayLength)
	}
	if err := resourcegroup.ValidateServiceLimit(c.ServiceLimit); err != nil {
		return fmt.Errorf("%w: --service-limit %d: give 0 (none) to %d", errUsage, c.ServiceLimit, resourcegroup.MaxRU)
	}
	if c.EtcdPeerAddr != "" && !strings.Contains(c.EtcdPeerAddr, "://") {
		c.EtcdPeerAddr = "http://" + c.EtcdPeerAddr
	}
	if c.AdvertiseAddr == "" {
		c.AdvertiseAddr = c.Addr
	}
	return nil
}

// authenticates reports whether some authentication is configured: a
// token file or client certificates.
func (c *config) authenticates() bool {
	return c.AdminTokenFile != "" || c.ProxyTokenFile != "" || c.TLSCA != ""
}

// parseLevel reads --log-level: debug, info, warn or error, any case.
func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	err := l.UnmarshalText([]byte(s))
	return l, err
}

// loadBudgetZone reads --budget-time-zone: an IANA name from the zone
// database built into the binary (so the host's need not have it). Local
// and the empty name are refused: they would follow each host's own
// setting, and every replica must count the same windows.
func loadBudgetZone(name string) (*time.Location, error) {
	const want = "an IANA time zone name such as UTC, Europe/Berlin or America/New_York"
	if name == "" || strings.EqualFold(name, "Local") {
		return nil, fmt.Errorf("--budget-time-zone %q: give %s; the host's local zone is not accepted, as every replica must count the same windows", name, want)
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf("--budget-time-zone %q is not %s (names are case-sensitive): %w", name, want, err)
	}
	return loc, nil
}
