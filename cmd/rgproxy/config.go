package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/rgproxy/rgproxy/internal/rgpolicy"
	"github.com/rgproxy/rgproxy/ru"
)

// config is rgproxy's configuration. Every field is a flag; the optional
// --config TOML file uses the flag names as keys, and flags given on the
// command line win over the file.
type config struct {
	// Listen is the client-facing MySQL address. Default 127.0.0.1:4000.
	Listen string
	// Backend is the MySQL/MariaDB server address. Default 127.0.0.1:3306.
	Backend string
	// StatusAddr serves /metrics, /healthz and /readyz. Default 127.0.0.1:10080.
	StatusAddr string
	// ConsoleAddr serves the console (its page at /, its JSON at
	// /api/console). Default 127.0.0.1:10081: browsers refuse 10080
	// (statuspage.BrowserBlocked). Empty: only on the status address.
	ConsoleAddr string
	// TLSCert and TLSKey are the PEM files of the client-facing TLS
	// certificate; both empty (the default) means clients cannot use TLS.
	TLSCert string
	TLSKey  string
	// RequireTLS refuses clients that do not upgrade to TLS. Default false.
	RequireTLS bool
	// BackendTLS is off, skip-verify or verify. Default off.
	BackendTLS string
	// BackendTLSCA is the PEM CA bundle that verifies the backend's
	// certificate with --backend-tls=verify; empty = the system roots.
	BackendTLSCA string
	// BackendProxyProtocol sends a PROXY protocol v1 header on every
	// backend connection. Default false.
	BackendProxyProtocol bool
	// DialTimeout bounds a backend dial. Default 5s.
	DialTimeout time.Duration
	// HandshakeTimeout bounds a client's login, from its connection to the
	// backend's OK. Default 10s (MariaDB's connect_timeout).
	HandshakeTimeout time.Duration
	// MaxConnections caps client sessions; 0 (the default) derives the cap
	// from the file-descriptor limit (mysqlproto.DefaultMaxConnections).
	MaxConnections int
	// MaxUnauthenticated caps connections that have not logged in yet
	// (each holds a backend connection). Default 64.
	MaxUnauthenticated int
	// MaxUnauthenticatedPerHost caps them per client address (IPv6: /64).
	// Default 16.
	MaxUnauthenticatedPerHost int
	// MaxPacket is the largest client command payload accepted, in bytes.
	// Default 1 GiB.
	MaxPacket int64
	// CommandBufferLimit bounds the bytes held, over all sessions, for
	// client commands being received, beyond each session's first 16 KiB.
	// Default 1 GiB; at least MaxPacket.
	CommandBufferLimit int64
	// NetReadTimeout bounds each wait for the rest of a command a client
	// has started (MariaDB's net_read_timeout). Default 30s.
	NetReadTimeout time.Duration
	// EnablePprof serves Go's profiles under /debug/pprof/ on the status
	// port. Default false.
	EnablePprof bool
	// ShutdownTimeout is how long SIGTERM waits for running statements.
	// Default 30s.
	ShutdownTimeout time.Duration
	// LogLevel is debug, info, warn or error. Default info.
	LogLevel string
	// LogFormat is text or json. Default text.
	LogFormat string

	// Metering turns RU metering, throttling and rgproxy's admin SQL on.
	// false makes a pure proxy. Default true.
	Metering bool
	// TokenServers are rgserver gRPC addresses, comma-separated; the proxy
	// follows NOT_LEADER answers to the leader. Default 127.0.0.1:3379.
	TokenServers string
	// TokenServerTokenFile holds the bearer token rgserver's admin RPCs
	// need (rgserver --admin-token-file); empty = none. Default empty.
	TokenServerTokenFile string
	// TokenServerProxyTokenFile holds this proxy's bearer token for
	// rgserver's token and settings streams and reads (a token of rgserver's
	// --proxy-token-file); empty = none. Default empty.
	TokenServerProxyTokenFile string
	// TokenServerTLSCA (PEM) turns on TLS to rgserver and verifies its
	// certificate; with TokenServerTLSCert and TokenServerTLSKey the proxy
	// also presents a client certificate (rgserver --tls-ca). Default
	// empty: plaintext.
	TokenServerTLSCA, TokenServerTLSCert, TokenServerTLSKey string
	// TokenServerInsecure lets the tokens above travel in clear to an
	// rgserver that is not on loopback. Default false.
	TokenServerInsecure bool
	// ProxyID identifies this proxy to rgserver; default hostname:listen-port.
	ProxyID string
	// StrictResourceGroups: without SUPER, SET RESOURCE GROUP and the hint
	// may name only the user's bound group or default. Default true.
	StrictResourceGroups bool
	// MaxWait is how long a statement may wait for tokens before 8252.
	// Default 30s.
	MaxWait time.Duration
	// MaxWaitInTxn is how long a statement inside an open transaction may
	// wait; after it, it runs on debt. Default 100ms.
	MaxWaitInTxn time.Duration
	// MaxBackendConcurrency caps statements running on the backend at once;
	// waiting ones are admitted by group PRIORITY. 0 = unlimited (default).
	MaxBackendConcurrency int
	// ChargebackTagKeys names the SQLCommenter tag keys whose values are
	// billed (resource_usage_by_tag), comma-separated; "" = none.
	ChargebackTagKeys string
	// DegradedAfter is how long without a grant before the proxy refills
	// locally at RU_PER_SEC / proxies. Default 5s.
	DegradedAfter time.Duration
	// CacheDir keeps the last snapshot of groups and bindings, for starts
	// while rgserver is down. Default ./rgproxy-cache; empty = none.
	CacheDir string

	// AdminUser is rgproxy's one backend account (needs CONNECTION ADMIN or
	// SUPER), used to KILL QUERY runaway statements; empty (the default)
	// disables QUERY_LIMIT ACTION=KILL.
	AdminUser string
	// AdminPasswordFile holds AdminUser's password; rgproxy stores no other.
	AdminPasswordFile string

	// CPUSource is where a statement's CPU time comes from: auto (the
	// backend thread's CPU time when the backend runs here, else wall
	// time), wall or proc. Default auto.
	CPUSource string
	// BackendCPUs is the backend host's CPUs for CALIBRATE RESOURCE; 0 =
	// read them where the backend runs on this host.
	BackendCPUs float64
	// WriteSource is where the bytes a statement wrote come from: auto
	// (the backend's row-based binary log, read with --admin-user, while
	// rgproxy can follow it; else the estimate), binlog, estimate or
	// packet. Default auto.
	WriteSource string
	// MaxStatementShapes is how many statement shapes (digest within a
	// group) the proxy remembers for cost estimates and
	// information_schema.statements_summary. Default 10000.
	MaxStatementShapes int
	// StmtSummaryRefreshInterval is the length of
	// information_schema.statements_summary_history's windows (TiDB's
	// tidb_stmt_summary_refresh_interval). Default 30m.
	StmtSummaryRefreshInterval time.Duration
	// StmtSummaryHistorySize is how many closed windows it keeps (TiDB's
	// tidb_stmt_summary_history_size). Default 24.
	StmtSummaryHistorySize int
	// GroupIdleExpiry: the per-group series of a group with no statement on
	// this proxy for this long are deleted until it is used again. Default 1h.
	GroupIdleExpiry time.Duration

	// RU is the cost model, from the config file's [ru] table only.
	RU ru.Config

	// ConfigFile is --config: the TOML file read at start and on SIGHUP.
	ConfigFile string
}

// defaultConsoleAddr is --console-addr's default: 10080's neighbour, a
// port no browser blocks (statuspage.BrowserBlocked).
const defaultConsoleAddr = "127.0.0.1:10081"

// newFlagSet declares every flag, bound to cfg, with its default.
func newFlagSet(cfg *config) *flag.FlagSet {
	fs := flag.NewFlagSet("rgproxy", flag.ContinueOnError)
	fs.StringVar(&cfg.Listen, "listen", "127.0.0.1:4000", "client-facing MySQL `address`")
	fs.StringVar(&cfg.Backend, "backend", "127.0.0.1:3306", "MySQL/MariaDB server `address`")
	fs.StringVar(&cfg.StatusAddr, "status-addr", "127.0.0.1:10080", "`address` of the status HTTP server (/metrics, /healthz, /readyz)")
	fs.StringVar(&cfg.ConsoleAddr, "console-addr", defaultConsoleAddr, "`address` of the console a browser opens (its page at /, its JSON at /api/console); empty = none beside the status address, which browsers refuse")
	fs.StringVar(&cfg.TLSCert, "tls-cert", "", "PEM `file` of the certificate offered to clients (enables client TLS with --tls-key)")
	fs.StringVar(&cfg.TLSKey, "tls-key", "", "PEM `file` of the key of --tls-cert")
	fs.BoolVar(&cfg.RequireTLS, "require-tls", false, "refuse clients that do not use TLS (needs --tls-cert/--tls-key)")
	fs.StringVar(&cfg.BackendTLS, "backend-tls", "off", "TLS to the backend: off, skip-verify or verify")
	fs.StringVar(&cfg.BackendTLSCA, "backend-tls-ca", "", "PEM CA `file` that verifies the backend with --backend-tls=verify (default: system roots)")
	fs.BoolVar(&cfg.BackendProxyProtocol, "backend-proxy-protocol", false, "send a PROXY protocol v1 header so the backend sees the client's address")
	fs.DurationVar(&cfg.DialTimeout, "dial-timeout", 5*time.Second, "backend dial timeout")
	fs.DurationVar(&cfg.HandshakeTimeout, "handshake-timeout", 10*time.Second, "a client that has not logged in this long after connecting is closed, and its backend connection with it")
	fs.IntVar(&cfg.MaxConnections, "max-connections", 0, "maximum client sessions, beyond which clients get 1040; 0 = derived from the file-descriptor limit: (nofile - 64 - nofile/16) / 3")
	fs.IntVar(&cfg.MaxUnauthenticated, "max-unauthenticated", 64, "connections that have not logged in yet (each holds a backend connection); beyond it clients get 1040 at once")
	fs.IntVar(&cfg.MaxUnauthenticatedPerHost, "max-unauthenticated-per-host", 16, "connections from one client address (IPv6: its /64) that have not logged in yet; beyond it that address gets 1040 at once")
	fs.Int64Var(&cfg.MaxPacket, "max-packet", 1<<30, "largest client command payload accepted, in `bytes`")
	fs.Int64Var(&cfg.CommandBufferLimit, "command-buffer-limit", 1<<30, "`bytes` held at once, over all sessions, for client commands being received beyond each session's first 16 KiB; a command that would go beyond gets 1041")
	fs.DurationVar(&cfg.NetReadTimeout, "net-read-timeout", 30*time.Second, "a client that starts a command and then sends nothing this long gets 1159 and is closed (MariaDB's net_read_timeout)")
	fs.BoolVar(&cfg.EnablePprof, "enable-pprof", false, "serve Go's profiles under /debug/pprof/ on the status port (they show the command line, memory and goroutines to whoever reaches it)")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", 30*time.Second, "on SIGTERM, how long running statements may finish before sessions are closed")
	fs.StringVar(&cfg.LogLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&cfg.LogFormat, "log-format", "text", "log format: text or json")
	fs.BoolVar(&cfg.Metering, "metering", true, "meter and throttle statements by resource group and answer resource-group SQL; false = a pure proxy")
	fs.StringVar(&cfg.TokenServers, "token-server", "127.0.0.1:3379", "rgserver gRPC `addresses`, comma-separated (any replica; NOT_LEADER is followed)")
	fs.StringVar(&cfg.TokenServerTokenFile, "token-server-token-file", "", "`file` holding the bearer token for rgserver's admin RPCs (rgserver --admin-token-file)")
	fs.StringVar(&cfg.TokenServerProxyTokenFile, "token-server-proxy-token-file", "", "`file` holding this proxy's bearer token for rgserver's token and settings streams and reads (one of rgserver's --proxy-token-file)")
	fs.StringVar(&cfg.TokenServerTLSCA, "token-server-tls-ca", "", "PEM CA `file`: dial rgserver with TLS and verify its certificate against it")
	fs.StringVar(&cfg.TokenServerTLSCert, "token-server-tls-cert", "", "PEM client certificate `file` presented to rgserver (its --tls-ca)")
	fs.StringVar(&cfg.TokenServerTLSKey, "token-server-tls-key", "", "PEM `file` of the key of --token-server-tls-cert")
	fs.BoolVar(&cfg.TokenServerInsecure, "token-server-insecure", false, "send rgserver's bearer tokens without TLS to an address that is not loopback")
	fs.StringVar(&cfg.ProxyID, "proxy-id", "", "this proxy's id at rgserver (default hostname:listen-port)")
	fs.BoolVar(&cfg.StrictResourceGroups, "strict-resource-groups", true, "without SUPER, SET RESOURCE GROUP and the RESOURCE_GROUP hint may name only the user's bound group or default (else 1227)")
	fs.DurationVar(&cfg.MaxWait, "max-wait", 30*time.Second, "longest wait for tokens before a statement gets 8252 (fails at once when the estimate exceeds it)")
	fs.StringVar(&cfg.ChargebackTagKeys, "chargeback-tag-keys", "", "SQLCommenter tag keys whose values are billed in information_schema.resource_usage_by_tag, comma-separated (at most 8), e.g. application,controller; accounts are always billed")
	fs.DurationVar(&cfg.MaxWaitInTxn, "max-wait-in-txn", 100*time.Millisecond, "longest wait for tokens inside an open transaction; then the statement runs on debt")
	fs.IntVar(&cfg.MaxBackendConcurrency, "max-backend-concurrency", 0, "statements running on the backend at once, 0 = unlimited; waiting ones are admitted HIGH before MEDIUM before LOW")
	fs.DurationVar(&cfg.DegradedAfter, "degraded-after", 5*time.Second, "without a grant for this long, refill locally at RU_PER_SEC / proxies (degraded mode)")
	fs.StringVar(&cfg.AdminUser, "admin-user", "", "rgproxy's service `account` on the backend (CONNECTION ADMIN or SUPER), for KILL QUERY of runaway statements; without it ACTION=KILL is refused")
	fs.StringVar(&cfg.AdminPasswordFile, "admin-password-file", "", "`file` holding --admin-user's password")
	fs.StringVar(&cfg.CacheDir, "cache-dir", "rgproxy-cache", "`directory` keeping the last snapshot of groups and bindings, for starts while rgserver is down (empty = none)")
	fs.Float64Var(&cfg.BackendCPUs, "backend-cpus", 0, "the backend host's CPUs, for CALIBRATE RESOURCE (fractions allowed, e.g. a quota of 2.5); 0 reads them where the backend runs on this host")
	fs.StringVar(&cfg.CPUSource, "cpu-source", "auto", "CPU time charged per statement: auto (the backend thread's CPU time when the backend runs on this host, else wall time), wall, or proc")
	fs.StringVar(&cfg.WriteSource, "write-source", "auto", "where the bytes a statement wrote come from: auto (the backend's row-based binary log, read as --admin-user, while rgproxy follows it; else the estimate), binlog, estimate (affected rows × the table's average row length) or packet (the statement's own bytes only)")
	fs.DurationVar(&cfg.GroupIdleExpiry, "group-idle-expiry", time.Hour, "a group with no statement here this long loses its per-group metric series until it is used again")
	fs.IntVar(&cfg.MaxStatementShapes, "max-statement-shapes", 10000, "statement shapes (digest within a group) remembered for cost estimates and statements_summary; least recently used evicted")
	fs.DurationVar(&cfg.StmtSummaryRefreshInterval, "stmt-summary-refresh-interval", 30*time.Minute, "length of information_schema.statements_summary_history's windows, aligned to multiples of it since the Unix epoch (TiDB's tidb_stmt_summary_refresh_interval)")
	fs.IntVar(&cfg.StmtSummaryHistorySize, "stmt-summary-history-size", 24, "closed windows information_schema.statements_summary_history keeps besides the current one (TiDB's tidb_stmt_summary_history_size)")
	return fs
}

// errHelp is returned by parseArgs when --help was asked for.
var errHelp = flag.ErrHelp

// parseArgs parses the command line, then applies the --config file to
// every flag the command line did not set.
func parseArgs(args []string) (cfg config, showVersion bool, err error) {
	cfg.RU = ru.DefaultConfig()
	fs := newFlagSet(&cfg)
	configPath := fs.String("config", "", "TOML `file` whose keys are these flag names; flags given on the command line win")
	version := fs.Bool("version", false, "print the version and exit")
	fs.SetOutput(os.Stderr)
	if err := fs.Parse(args); err != nil {
		return cfg, false, err
	}
	if fs.NArg() > 0 {
		return cfg, false, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	cfg.ConfigFile = *configPath
	if *configPath != "" {
		if err := applyConfigFile(fs, *configPath); err != nil {
			return cfg, false, err
		}
		var file struct {
			RU *ru.Config `toml:"ru"`
		}
		file.RU = &cfg.RU
		if _, err := toml.DecodeFile(*configPath, &file); err != nil {
			return cfg, false, fmt.Errorf("config %s: [ru]: %w", *configPath, err)
		}
	}
	return cfg, *version, cfg.validate()
}

// applyConfigFile sets, from a TOML file, every flag not already set on the
// command line. Unknown keys are an error, so a typo never goes unnoticed.
func applyConfigFile(fs *flag.FlagSet, path string) error {
	var raw map[string]any
	if _, err := toml.DecodeFile(path, &raw); err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	keys := make([]string, 0, len(raw))
	for k := range raw {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if k == "ru" { // the cost model's table, decoded by parseArgs
			continue
		}
		if k == "config" || k == "version" || fs.Lookup(k) == nil {
			return fmt.Errorf("config %s: unknown key %q", path, k)
		}
		if set[k] {
			continue
		}
		var v string
		switch x := raw[k].(type) {
		case string, bool, int64, float64:
			v = fmt.Sprint(x)
		default:
			return fmt.Errorf("config %s: key %q: unsupported value %v", path, k, x)
		}
		if err := fs.Set(k, v); err != nil {
			return fmt.Errorf("config %s: key %q: %w", path, k, err)
		}
	}
	return nil
}

func (c *config) validate() error {
	var errs []error
	switch c.BackendTLS {
	case "off", "skip-verify", "verify":
	default:
		errs = append(errs, fmt.Errorf("--backend-tls must be off, skip-verify or verify, not %q", c.BackendTLS))
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		errs = append(errs, errors.New("--tls-cert and --tls-key go together"))
	}
	if c.RequireTLS && c.TLSCert == "" {
		errs = append(errs, errors.New("--require-tls needs --tls-cert and --tls-key"))
	}
	if c.BackendTLSCA != "" && c.BackendTLS != "verify" {
		errs = append(errs, errors.New("--backend-tls-ca needs --backend-tls=verify"))
	}
	if (c.TokenServerTLSCert == "") != (c.TokenServerTLSKey == "") {
		errs = append(errs, errors.New("--token-server-tls-cert and --token-server-tls-key go together"))
	}
	if c.TokenServerTLSCert != "" && c.TokenServerTLSCA == "" {
		errs = append(errs, errors.New("--token-server-tls-cert needs --token-server-tls-ca"))
	}
	if c.HandshakeTimeout <= 0 {
		errs = append(errs, errors.New("--handshake-timeout must be > 0"))
	}
	if c.MaxConnections < 0 {
		errs = append(errs, errors.New("--max-connections must be >= 0"))
	}
	if c.MaxUnauthenticated <= 0 || c.MaxUnauthenticatedPerHost <= 0 {
		errs = append(errs, errors.New("--max-unauthenticated and --max-unauthenticated-per-host must be > 0"))
	}
	if c.MaxPacket < 1024 {
		errs = append(errs, errors.New("--max-packet must be at least 1024"))
	}
	if c.CommandBufferLimit < c.MaxPacket {
		errs = append(errs, errors.New("--command-buffer-limit must be at least --max-packet"))
	}
	if c.NetReadTimeout <= 0 {
		errs = append(errs, errors.New("--net-read-timeout must be > 0"))
	}
	switch strings.ToLower(c.LogLevel) {
	case "debug", "info", "warn", "error":
	default:
		errs = append(errs, fmt.Errorf("--log-level must be debug, info, warn or error, not %q", c.LogLevel))
	}
	if c.MaxWait <= 0 || c.MaxWaitInTxn < 0 || c.DegradedAfter <= 0 {
		errs = append(errs, errors.New("--max-wait and --degraded-after must be > 0, --max-wait-in-txn >= 0"))
	}
	if _, err := rgpolicy.ParseChargebackKeys(c.ChargebackTagKeys); err != nil {
		errs = append(errs, fmt.Errorf("--chargeback-tag-keys: %w", err))
	}
	if (c.AdminUser == "") != (c.AdminPasswordFile == "") {
		errs = append(errs, errors.New("--admin-user and --admin-password-file go together"))
	}
	if !(c.BackendCPUs >= 0 && c.BackendCPUs <= 1<<20) {
		errs = append(errs, fmt.Errorf("--backend-cpus must be from 0 (read them) to 1048576, not %v", c.BackendCPUs))
	}
	if _, err := rgpolicy.ParseCPUSource(c.CPUSource); err != nil {
		errs = append(errs, fmt.Errorf("--cpu-source must be auto, wall or proc, not %q", c.CPUSource))
	}
	if ws, err := rgpolicy.ParseWriteSource(c.WriteSource); err != nil {
		errs = append(errs, fmt.Errorf("--write-source must be auto, binlog, estimate or packet, not %q", c.WriteSource))
	} else if ws == rgpolicy.WriteBinlog && c.AdminUser == "" {
		errs = append(errs, errors.New("--write-source=binlog needs --admin-user (with REPLICATION SLAVE) to read the binary log"))
	}
	if c.GroupIdleExpiry <= 0 {
		errs = append(errs, errors.New("--group-idle-expiry must be > 0"))
	}
	if c.MaxStatementShapes <= 0 {
		errs = append(errs, errors.New("--max-statement-shapes must be > 0"))
	}
	if c.StmtSummaryRefreshInterval < time.Second || c.StmtSummaryRefreshInterval > 24*time.Hour {
		errs = append(errs, fmt.Errorf("--stmt-summary-refresh-interval must be between 1s and 24h, not %s", c.StmtSummaryRefreshInterval))
	}
	if c.StmtSummaryHistorySize < 1 || c.StmtSummaryHistorySize > 255 {
		errs = append(errs, fmt.Errorf("--stmt-summary-history-size must be between 1 and 255, not %d", c.StmtSummaryHistorySize))
	}
	if c.MaxBackendConcurrency < 0 {
		errs = append(errs, errors.New("--max-backend-concurrency must be >= 0"))
	}
	if c.Metering && strings.TrimSpace(c.TokenServers) == "" {
		errs = append(errs, errors.New("--token-server is needed with --metering"))
	}
	if err := c.RU.Validate(); err != nil {
		errs = append(errs, err)
	}
	switch c.LogFormat {
	case "text", "json":
	default:
		errs = append(errs, fmt.Errorf("--log-format must be text or json, not %q", c.LogFormat))
	}
	return errors.Join(errs...)
}
