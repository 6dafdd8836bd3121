package tokenclient

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rgproxy/rgproxy/internal/clock"
	"github.com/rgproxy/rgproxy/internal/netaddr"
)

// Sentinel errors of this package.
var (
	// ErrThrottled: the statement's tokens could not be had within its
	// maximum wait (the caller answers 8252). Nothing was charged.
	ErrThrottled = errors.New("tokenclient: resource group quota exceeded")
	// ErrUnknownGroup: rgserver does not know the group the tokens were
	// asked for (it was dropped); the caller should fall back to `default`.
	ErrUnknownGroup = errors.New("tokenclient: unknown resource group")
	// ErrUnavailable: rgserver could not be reached for an admin RPC, or
	// Start found neither rgserver nor a cache snapshot.
	ErrUnavailable = errors.New("tokenclient: rgserver unavailable")
	// ErrConfig: the Config is invalid.
	ErrConfig = errors.New("tokenclient: invalid config")
	// ErrClosed: the Client was closed.
	ErrClosed = errors.New("tokenclient: client closed")
)

// Protocol constants that are not worth a flag.
const (
	// notifyLead is how much demand the notify threshold keeps in reserve:
	// a group asks for tokens when it holds less than demand × notifyLead,
	// so a grant normally lands before the bucket runs dry.
	notifyLead = time.Second
	// waitLead converts RU that statements wait for into demand (RU/s):
	// waiting statements want their tokens within this time.
	waitLead = 20 * time.Millisecond
	// requestHeadroom scales a request above the target period's demand.
	requestHeadroom = 1.1
	// minRequest is the least a token request asks for, in RU.
	minRequest = 1.0
	// minAskInterval spaces two token requests of one group, so a grant
	// smaller than the threshold cannot start a request storm.
	minAskInterval = 100 * time.Millisecond
	// trickleLead: a group fed by a trickle asks again only when the
	// trickle has at most this much time left.
	trickleLead = time.Second
	// releaseAfter: a group with no statement for this long gives back
	// the tokens its bucket saved (rgserver's bucket saves the group's
	// capacity from then on). Well within rgserver's slot expiry (60 s by
	// default), after which rgserver no longer counts what this proxy
	// said it holds.
	releaseAfter = 20 * time.Second
	// tick is the period of the stream loop's housekeeping (periodic
	// reports, low-token polling, degraded-mode checks).
	tick = 100 * time.Millisecond
	// quietAfter: a group with nothing waiting and no statement for this
	// long wants nothing now, whatever its EWMA remembers, and says so
	// to rgserver at once (demand 0). Above the purse sweep (purseSweep)
	// plus a tick, so a busy group's purses never make it look quiet;
	// short enough that a service limit's spare capacity moves to the
	// groups still running (a BACKGROUND group) within a second of the
	// others stopping, not a report period later.
	quietAfter = 300 * time.Millisecond
	// ewmaInterval is the sampling period of the demand EWMA.
	ewmaInterval = time.Second
	// ewmaAlpha is the weight of the newest sample in the demand EWMA.
	ewmaAlpha = 0.5
	// backoffMin and backoffMax bound the reconnect backoff.
	backoffMin = 100 * time.Millisecond
	backoffMax = 2 * time.Second
	// syncWait bounds how long a Store write waits for the settings cache to
	// show it (read-your-writes through one proxy).
	syncWait = time.Second
	// usageWindow is the window of Usage's RU/s, in one-second slots.
	usageWindow = 10
	// cacheFile is the snapshot's file name under Config.CacheDir.
	cacheFile = "rgproxy-groups.json"
)

// Config configures a Client. The zero value of every field but Servers is
// usable.
type Config struct {
	// Servers are rgserver gRPC addresses (host:port), tried in turn; token
	// requests follow NOT_LEADER redirects to the leader. Required.
	Servers []string
	// ProxyID is the stable id of this proxy in token requests. Default:
	// hostname:pid:start-time (Unix seconds).
	ProxyID string
	// TargetPeriod is how long a grant should last: a request asks for
	// about avg RU/s × TargetPeriod × 1.1 − tokens left. Default 5 s.
	TargetPeriod time.Duration
	// DegradedAfter is how long without a grant (rgserver unreachable, or
	// a request unanswered) before degraded mode: local refill at
	// RU_PER_SEC ÷ proxies of the last grant. Default 5 s.
	DegradedAfter time.Duration
	// ReportPeriod: consumption is reported at least this often while a
	// group consumes. Default: TargetPeriod.
	ReportPeriod time.Duration
	// CacheDir is where the snapshot of groups and bindings (a JSON file)
	// is kept for starts while rgserver is down; "" = no snapshot.
	CacheDir string
	// TLS, when non-nil, is used to dial rgserver; nil = plaintext.
	TLS *tls.Config
	// AdminToken is sent as "authorization: Bearer <token>" on
	// ResourceGroupService writes (rgserver --admin-token-file), and on
	// token and settings streams when ProxyToken is empty; "" = none.
	AdminToken string
	// ProxyToken is sent as "authorization: Bearer <token>" on the token
	// and settings streams (a line of rgserver --proxy-token-file), and on
	// writes when AdminToken is empty; "" = none.
	ProxyToken string
	// InsecureTokens lets the tokens above travel without TLS to an
	// rgserver address that is not loopback. Default false: they are
	// sent in clear only to loopback (grpc's RequireTransportSecurity).
	InsecureTokens bool
	// Capabilities tell rgserver what this proxy can enforce and how to
	// name it; sent in the first message of every token stream. rgserver
	// refuses a QUERY_LIMIT ACTION = KILL while a live proxy cannot kill.
	Capabilities Capabilities
	// Clock is the time source; nil = real time.
	Clock Clock
	// Logger receives the client's logs; nil = slog.Default().
	Logger *slog.Logger
	// Registerer is where the client's metrics are registered; nil = not
	// registered.
	Registerer prometheus.Registerer
	// IdleExpiry: a group with no AcquireShare or Charge on this proxy for
	// this long is forgotten here — its local state and its per-group
	// series — once nothing about it is still owed (see Client.expireIdle);
	// its next use starts it again at 0. `default` is never forgotten.
	// Default 1 h.
	IdleExpiry time.Duration
}

// Capabilities are what a proxy can enforce (docs/design.md §7.8).
type Capabilities struct {
	// CanKill: the proxy has a service account on the backend
	// (--admin-user) to carry out QUERY_LIMIT ACTION = KILL.
	CanKill bool
	// Instance is the address clients reach the proxy at (host:port).
	Instance string
	// Version is the proxy's version.
	Version string
}

// withDefaults validates cfg and fills in its defaults.
func (cfg Config) withDefaults() (Config, error) {
	var servers []string
	for _, s := range cfg.Servers {
		if s = strings.TrimSpace(s); s != "" {
			servers = append(servers, s)
		}
	}
	if len(servers) == 0 {
		return cfg, fmt.Errorf("%w: no token server address", ErrConfig)
	}
	cfg.Servers = servers
	if (cfg.AdminToken != "" || cfg.ProxyToken != "") && cfg.TLS == nil && !cfg.InsecureTokens {
		for _, s := range servers {
			if !netaddr.IsLoopback(s) {
				return cfg, fmt.Errorf("%w: rgserver %s is not a loopback address: its credentials would travel in clear; dial it with TLS, or allow it explicitly", ErrConfig, s)
			}
		}
	}
	if cfg.TargetPeriod < 0 || cfg.DegradedAfter < 0 || cfg.ReportPeriod < 0 || cfg.IdleExpiry < 0 {
		return cfg, fmt.Errorf("%w: negative period", ErrConfig)
	}
	if cfg.TargetPeriod == 0 {
		cfg.TargetPeriod = 5 * time.Second
	}
	if cfg.DegradedAfter == 0 {
		cfg.DegradedAfter = 5 * time.Second
	}
	if cfg.ReportPeriod == 0 {
		cfg.ReportPeriod = cfg.TargetPeriod
	}
	if cfg.IdleExpiry == 0 {
		cfg.IdleExpiry = time.Hour
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ProxyID == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			host = "unknown"
		}
		cfg.ProxyID = fmt.Sprintf("%s:%d:%d", host, os.Getpid(), cfg.Clock.Now().Unix())
	}
	return cfg, nil
}
