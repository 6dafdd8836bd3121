// Command rgproxy is a MySQL-protocol proxy that forwards every client
// session to a dedicated backend connection and reports each statement to
// a policy. This file holds flags, wiring, signals and the status server;
// the wire lives in mysqlproto.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/rgproxy/rgproxy/internal/binlog"
	"github.com/rgproxy/rgproxy/internal/reload"
	"github.com/rgproxy/rgproxy/internal/rgpolicy"
	"github.com/rgproxy/rgproxy/internal/statuspage"
	"github.com/rgproxy/rgproxy/mysqlproto"
	"github.com/rgproxy/rgproxy/tokenclient"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	// SIGHUP reloads the configuration (reload.go); caught from the start
	// so that an early one does not kill the process, and handled once
	// the server runs.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	cfg, showVersion, err := parseArgs(os.Args[1:])
	if errors.Is(err, errHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "rgproxy:", err)
		os.Exit(2)
	}
	if showVersion {
		fmt.Println("rgproxy", version)
		return
	}
	level := new(slog.LevelVar)
	level.Set(parseLevel(cfg.LogLevel))
	logger := newLogger(cfg, level, os.Stderr)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, cfg, logger, &reloader{args: os.Args[1:], level: level}, hup); err != nil {
		logger.Error("rgproxy stopped", "err", err)
		os.Exit(1)
	}
}

// newLogger logs at level, which a reload may change.
func newLogger(cfg config, level *slog.LevelVar, w *os.File) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// run serves until ctx ends (SIGTERM), then shuts down gracefully. Each
// signal on hup makes rl apply the configuration again.
func run(ctx context.Context, cfg config, logger *slog.Logger, rl *reloader, hup <-chan os.Signal) error {
	pcfg, cert, err := proxyConfig(cfg, logger)
	if err != nil {
		return err
	}
	metrics := newMetrics()
	var policy mysqlproto.Policy = mysqlproto.PassThrough{}
	var tc *tokenclient.Client
	var rp *rgpolicy.Policy
	var reader *binlog.Reader
	if cfg.Metering {
		// The token stream starts before the listener: --listen names the
		// instance (the cluster views' name once a port 0 is bound).
		caps := tokenclient.Capabilities{CanKill: cfg.AdminUser != "", Instance: instanceNameOf(cfg.Listen), Version: version}
		tc, err = startTokenClient(ctx, cfg, caps, metrics, logger)
		if err != nil {
			return err
		}
		defer tc.Close()
		var killer rgpolicy.Killer
		var roles rgpolicy.RoleChecker
		writes, _ := rgpolicy.ParseWriteSource(cfg.WriteSource) // validated
		if cfg.AdminUser != "" {
			password, err := readAdminPassword(cfg.AdminPasswordFile)
			if err != nil {
				return err
			}
			var svc *serviceConn
			if svc, err = newServiceConn(cfg.Backend, cfg.AdminUser, password, pcfg.BackendTLS, cfg.DialTimeout); err != nil {
				return err
			}
			defer svc.Close()
			pctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
			err = svc.Ping(pctx)
			cancel()
			if err != nil {
				return err
			}
			killer, roles = svc, svc
			if writes == rgpolicy.WriteAuto || writes == rgpolicy.WriteBinlog {
				reader, err = binlog.New(binlog.Config{Addr: cfg.Backend, User: cfg.AdminUser, Password: password,
					TLS: pcfg.BackendTLS, DialTimeout: cfg.DialTimeout, Logger: logger})
				if err != nil {
					return err
				}
				metrics.registerBinlog(reader)
			}
		}
		cpu, _ := rgpolicy.ParseCPUSource(cfg.CPUSource) // validated
		pol := rgpolicy.Config{
			Tokens:          tc,
			Cost:            cfg.RU,
			Killer:          killer,
			Cluster:         tc,
			Runaways:        tc,
			Usage:           tc,
			Chargeback:      tc,
			Roles:           roles,
			Instance:        instanceNameOf(cfg.Listen),
			Settings:        policySettings(cfg),
			Shapes:          cfg.MaxStatementShapes,
			SummaryWindow:   cfg.StmtSummaryRefreshInterval,
			SummaryWindows:  cfg.StmtSummaryHistorySize,
			IdleGroupExpiry: cfg.GroupIdleExpiry,
			CPU:             cpu,
			BackendCPUs:     cfg.BackendCPUs,
			BackendAddr:     cfg.Backend,
			Registerer:      metrics.reg,
			Logger:          logger,
			Writes:          writes,
		}
		if reader != nil {
			pol.Binlog = reader
		}
		if rp, err = rgpolicy.New(pol); err != nil {
			return err
		}
		// A group dropped, or idle here for --group-idle-expiry, leaves
		// the policy's series too.
		tc.OnGroupForgotten(rp.ForgetGroup)
		policy = rp
		pcfg.ScanWords = rgpolicy.ScanWords()
	}
	pcfg.Policy = metrics.wrap(policy)
	srv, err := mysqlproto.NewServer(pcfg)
	if err != nil {
		return err
	}
	metrics.registerServer(srv)
	rl.cur, rl.cert, rl.srv, rl.policy, rl.log = cfg, cert, srv, rp, logger

	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	statusLn, err := net.Listen("tcp", cfg.StatusAddr)
	if err != nil {
		ln.Close()
		return fmt.Errorf("status listen %s: %w", cfg.StatusAddr, err)
	}
	if tc != nil {
		// Cluster-wide views name this proxy by the address clients reach.
		if err := tc.StartInspect(instanceName(ln.Addr()), rp); err != nil {
			logger.Warn("cluster-wide views will not show this proxy", "err", err)
		}
		if err := tc.StartRunawayHistory(instanceName(ln.Addr())); err != nil {
			logger.Warn("the runaway history will not show this proxy's events", "err", err)
		}
	}
	var probes sync.WaitGroup // the /readyz probes: waited for after the status server
	handler, err := statusHandler(metrics, func(ctx context.Context) (readiness, error) {
		r := readiness{Metering: cfg.Metering}
		if tc != nil {
			r.Degraded = tc.Degraded()
		}
		if rp != nil {
			r.CPUSource = rp.CPUSourceInForce()
			r.WriteSource = rp.WriteSourceInForce()
			r.QueryLimitUnenforced = rp.QueryLimitUnenforced()
		}
		return r, mysqlproto.ProbeBackend(ctx, pcfg)
	}, &probes, cfg.EnablePprof, &consoleSource{proxyID: proxyID(cfg), policy: rp, now: time.Now,
		conns: func() (int64, int) { return srv.Stats().Connections, srv.MaxConnections() }})
	if err != nil {
		ln.Close()
		statusLn.Close()
		return err
	}
	status := &http.Server{ReadHeaderTimeout: statusReadHeaderTimeout, Handler: handler}
	// The console also has an address of its own: browsers refuse the
	// status port 10080, so the page opens where README says.
	console := &http.Server{ReadHeaderTimeout: statusReadHeaderTimeout, Handler: consoleHandler(handler)}
	consoleAt := statusLn.Addr().String()
	var consoleLn net.Listener
	if cfg.ConsoleAddr != "" && cfg.ConsoleAddr != cfg.StatusAddr {
		if statuspage.BrowserBlocked(cfg.ConsoleAddr) {
			logger.Warn("browsers refuse to open the console at this port", "console_addr", cfg.ConsoleAddr)
		}
		cl, err := net.Listen("tcp", cfg.ConsoleAddr)
		switch {
		case err != nil && cfg.ConsoleAddr == defaultConsoleAddr:
			// Proxies that share a host and were each given their own
			// --status-addr before the console had an address keep
			// starting: the first one takes the default.
			logger.Warn("the console's default address is taken: the console is served on the status address only; give --console-addr",
				"console_addr", cfg.ConsoleAddr, "err", err)
		case err != nil:
			ln.Close()
			statusLn.Close()
			return fmt.Errorf("console listen %s: %w", cfg.ConsoleAddr, err)
		default:
			consoleLn = cl
			consoleAt = cl.Addr().String()
		}
	} else if statuspage.BrowserBlocked(cfg.StatusAddr) {
		logger.Warn("browsers refuse to open the console at the status port; give it --console-addr", "status_addr", cfg.StatusAddr)
	}

	// Every part runs under one group: the first to fail stops the others
	// (as SIGTERM does), and run returns once all of them have stopped.
	g, gctx := errgroup.WithContext(ctx)
	if reader != nil {
		g.Go(func() error { reader.Run(gctx); return nil })
	}
	if rp != nil {
		g.Go(func() error { rp.Run(gctx); return nil })
	}
	g.Go(func() error { reload.OnSignal(gctx, hup, rl.reload); return nil })
	g.Go(func() error {
		if err := status.Serve(statusLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("status server: %w", err)
		}
		return nil
	})
	if consoleLn != nil {
		g.Go(func() error {
			if err := console.Serve(consoleLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("console server: %w", err)
			}
			return nil
		})
	}
	g.Go(func() error {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, mysqlproto.ErrServerClosed) {
			return fmt.Errorf("serve: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		logger.Info("shutting down", "timeout", cfg.ShutdownTimeout.String())
		sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			logger.Warn("shutdown cut running sessions", "err", err)
		}
		status.Close()
		console.Close()
		probes.Wait() // each ends within probeTimeout
		return nil
	})
	logger.Info("rgproxy serving", "version", version, "listen", ln.Addr().String(),
		"backend", cfg.Backend, "status", statusLn.Addr().String(), "console", consoleAt, "max_connections", srv.MaxConnections())
	if err := g.Wait(); err != nil {
		return err
	}
	logger.Info("stopped")
	return nil
}

// policySettings are the policy's reloadable settings in cfg.
func policySettings(cfg config) rgpolicy.Settings {
	return rgpolicy.Settings{
		Strict:                cfg.StrictResourceGroups,
		MaxWait:               cfg.MaxWait,
		MaxWaitInTxn:          cfg.MaxWaitInTxn,
		MaxBackendConcurrency: cfg.MaxBackendConcurrency,
		ChargebackTagKeys:     chargebackKeys(cfg.ChargebackTagKeys),
	}
}

// chargebackKeys is a validated --chargeback-tag-keys as a list.
func chargebackKeys(s string) []string {
	keys, _ := rgpolicy.ParseChargebackKeys(s) // validated at start and on SIGHUP
	return keys
}

// startTokenClient connects to rgserver. When neither rgserver nor a
// cached snapshot is available the proxy still serves — every session in
// the built-in default group — while the client keeps trying to connect.
func startTokenClient(ctx context.Context, cfg config, caps tokenclient.Capabilities, m *metrics, logger *slog.Logger) (*tokenclient.Client, error) {
	tcfg := tokenclient.Config{
		Capabilities:  caps,
		ProxyID:       cfg.ProxyID,
		DegradedAfter: cfg.DegradedAfter,
		CacheDir:      cfg.CacheDir,
		IdleExpiry:    cfg.GroupIdleExpiry,
		Logger:        logger,
		Registerer:    m.reg,
	}
	for _, s := range strings.Split(cfg.TokenServers, ",") {
		if s = strings.TrimSpace(s); s != "" {
			tcfg.Servers = append(tcfg.Servers, s)
		}
	}
	tcfg.ProxyID = proxyID(cfg)
	var err error
	if tcfg.AdminToken, err = readToken("--token-server-token-file", cfg.TokenServerTokenFile); err != nil {
		return nil, err
	}
	if tcfg.ProxyToken, err = readToken("--token-server-proxy-token-file", cfg.TokenServerProxyTokenFile); err != nil {
		return nil, err
	}
	// The file may also hold this proxy's line of rgserver's
	// --proxy-token-file: "<name> <token> [max-streams]".
	switch f := strings.Fields(tcfg.ProxyToken); {
	case strings.Contains(tcfg.ProxyToken, "\n") || len(f) > 3:
		return nil, fmt.Errorf("--token-server-proxy-token-file: %s must hold one token, or one line \"<name> <token> [max-streams]\"", cfg.TokenServerProxyTokenFile)
	case len(f) > 1:
		tcfg.ProxyToken = f[1]
	}
	tcfg.InsecureTokens = cfg.TokenServerInsecure
	if cfg.TokenServerTLSCA != "" {
		if tcfg.TLS, err = tokenServerTLS(cfg); err != nil {
			return nil, err
		}
	}
	tc, err := tokenclient.New(tcfg)
	if err != nil {
		if errors.Is(err, tokenclient.ErrConfig) && (tcfg.AdminToken != "" || tcfg.ProxyToken != "") {
			return nil, fmt.Errorf("%w (TLS: --token-server-tls-ca; in clear: --token-server-insecure)", err)
		}
		return nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := tc.Start(sctx); err != nil {
		logger.Warn("rgserver unreachable and no cached snapshot: serving the default group only until it answers",
			"token_servers", cfg.TokenServers, "err", err)
	}
	return tc, nil
}

// readToken reads a bearer token file ("" = none): its content, trimmed.
func readToken(flagName, file string) (string, error) {
	if file == "" {
		return "", nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flagName, err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("%s: %s is empty", flagName, file)
	}
	return tok, nil
}

// tokenServerTLS is the TLS configuration rgproxy dials rgserver with:
// rgserver's certificate verified against --token-server-tls-ca, and the
// client certificate of --token-server-tls-cert when given.
func tokenServerTLS(cfg config) (*tls.Config, error) {
	pem, err := os.ReadFile(cfg.TokenServerTLSCA)
	if err != nil {
		return nil, fmt.Errorf("--token-server-tls-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--token-server-tls-ca: no certificate in %s", cfg.TokenServerTLSCA)
	}
	tc := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if cfg.TokenServerTLSCert != "" {
		cert, err := tls.LoadX509KeyPair(cfg.TokenServerTLSCert, cfg.TokenServerTLSKey)
		if err != nil {
			return nil, fmt.Errorf("--token-server-tls-cert: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// instanceName is what cluster-wide views show as this proxy's INSTANCE:
// its MySQL listen address, the host's name in place of an unspecified
// IP (--listen :4000).
func instanceName(a net.Addr) string { return instanceNameOf(a.String()) }

// instanceNameOf is instanceName of a host:port.
func instanceNameOf(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		if h, err := os.Hostname(); err == nil && h != "" {
			host = h
		}
	}
	return net.JoinHostPort(host, port)
}

// proxyID is --proxy-id, or hostname:listen-port.
func proxyID(cfg config) string {
	if cfg.ProxyID != "" {
		return cfg.ProxyID
	}
	host, _ := os.Hostname()
	_, port, _ := net.SplitHostPort(cfg.Listen)
	return host + ":" + port
}

// proxyConfig turns flags into mysqlproto's configuration, loading TLS
// material so that bad files fail at start, not at the first client. cert
// is the client certificate (empty without client TLS).
func proxyConfig(cfg config, logger *slog.Logger) (pc mysqlproto.Config, cert reload.Certificate, err error) {
	pc = mysqlproto.Config{
		BackendAddr:               cfg.Backend,
		DialTimeout:               cfg.DialTimeout,
		HandshakeTimeout:          cfg.HandshakeTimeout,
		RequireTLS:                cfg.RequireTLS,
		BackendProxyProtocol:      cfg.BackendProxyProtocol,
		MaxConnections:            cfg.MaxConnections,
		MaxUnauthenticated:        cfg.MaxUnauthenticated,
		MaxUnauthenticatedPerHost: cfg.MaxUnauthenticatedPerHost,
		MaxPacketPayload:          cfg.MaxPacket,
		CommandBufferLimit:        cfg.CommandBufferLimit,
		NetReadTimeout:            cfg.NetReadTimeout,
		Logger:                    logger,
	}
	if cfg.TLSCert != "" {
		if cert, err = reload.LoadCertificate(cfg.TLSCert, cfg.TLSKey); err != nil {
			return pc, cert, fmt.Errorf("client TLS: %w", err)
		}
		pc.ClientTLS = &tls.Config{Certificates: []tls.Certificate{cert.Certificate}, MinVersion: tls.VersionTLS12}
	}
	switch cfg.BackendTLS {
	case "skip-verify":
		pc.BackendTLS = &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}
	case "verify":
		host, _, err := net.SplitHostPort(cfg.Backend)
		if err != nil {
			return pc, cert, fmt.Errorf("--backend %q: %w", cfg.Backend, err)
		}
		tc := &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12}
		if cfg.BackendTLSCA != "" {
			pem, err := os.ReadFile(cfg.BackendTLSCA)
			if err != nil {
				return pc, cert, fmt.Errorf("backend TLS CA: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return pc, cert, fmt.Errorf("backend TLS CA %s: no PEM certificate found", cfg.BackendTLSCA)
			}
			tc.RootCAs = pool
		}
		pc.BackendTLS = tc
	}
	return pc, cert, nil
}
