package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"

	"github.com/rgproxy/rgproxy/internal/reload"
	"github.com/rgproxy/rgproxy/tokenserver"
)

// reloadable says whether SIGHUP may change a setting (a flag's name)
// while rgserver serves; every other one needs a restart.
func reloadable(name string) bool {
	switch name {
	case "log-level", "tls-cert", "tls-key", "admin-token-file", "proxy-token-file":
		return true
	}
	return false
}

// flagSetOf returns a flag set whose values are c's (bind takes c's values
// as the defaults).
func flagSetOf(c config) *flag.FlagSet {
	var file string
	var version bool
	fs := flag.NewFlagSet("rgserver", flag.ContinueOnError)
	bind(fs, &c, &file, &version)
	return fs
}

// reloader applies the configuration again on SIGHUP: the command line and
// the --config file as it is now, flags winning over the file as at start.
type reloader struct {
	args []string
	// cur is the configuration in force.
	cur   config
	level *slog.LevelVar
	// cert is the gRPC TLS certificate in force; nil without TLS.
	cert atomic.Pointer[reload.Certificate]
	log  *slog.Logger
	// auth and srv take the token files read again; nil in tests that
	// reload only the rest.
	auth *tokenserver.Authenticator
	srv  *tokenserver.Server
}

// getCertificate serves the certificate in force to each new TLS
// handshake (tls.Config.GetCertificate); running streams keep theirs.
func (r *reloader) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return &r.cert.Load().Certificate, nil
}

// reload reads the configuration again and applies the log level, the
// TLS certificate (a file rotated in place counts) and the token files
// (--admin-token-file, --proxy-token-file, read again whether or not their
// names changed: a credential taken out of them is revoked and its
// streams end), in one log line; a changed setting that needs a restart
// is named in a warning and left as it is. A configuration that does not
// parse or validate, whose certificate does not load, or whose token
// files do not (or would turn authentication on or off), changes nothing.
func (r *reloader) reload() {
	next, _, err := parseArgs(r.args, io.Discard)
	if err != nil {
		reload.Failed(r.log, r.cur.ConfigFile, err)
		return
	}
	tlsOnOff := (r.cur.TLSCert == "") != (next.TLSCert == "")
	apply, refuse := reload.Split(reload.Diff(flagSetOf(r.cur), flagSetOf(next)), func(name string) bool {
		// gRPC's credentials are chosen at start.
		return reloadable(name) && !(tlsOnOff && (name == "tls-cert" || name == "tls-key"))
	})
	var cert reload.Certificate
	if next.TLSCert != "" && !tlsOnOff {
		if cert, err = reload.LoadCertificate(next.TLSCert, next.TLSKey); err != nil {
			reload.Failed(r.log, r.cur.ConfigFile, fmt.Errorf("tls: %w", err))
			return
		}
	}
	if r.auth != nil {
		ac, err := authConfig(next)
		if err != nil {
			reload.Failed(r.log, r.cur.ConfigFile, err)
			return
		}
		added, revoked, err := r.auth.Reload(ac)
		if err != nil {
			reload.Failed(r.log, r.cur.ConfigFile, err)
			return
		}
		if r.srv != nil {
			r.srv.ForgetCredentials(revoked)
		}
		if len(added)+len(revoked) > 0 {
			r.log.Info("credentials reloaded: the streams of revoked ones are ended", "added", strings.Join(added, ","), "revoked", strings.Join(revoked, ","))
		}
		r.cur.AdminTokenFile, r.cur.ProxyTokenFile = next.AdminTokenFile, next.ProxyTokenFile
	}
	if next.TLSCert != "" && !tlsOnOff {
		// The certificate is named by its file and fingerprint, so a
		// file rotated in place shows as a change.
		apply = reload.Without(apply, "tls-cert")
		if old := r.cert.Load(); cert.Label != old.Label {
			apply = append(apply, reload.Change{Name: "tls-cert", Old: old.Label, New: cert.Label})
			r.cert.Store(&cert)
		}
		r.cur.TLSCert, r.cur.TLSKey = next.TLSCert, next.TLSKey
	}
	r.cur.LogLevel = next.LogLevel
	level, _ := parseLevel(next.LogLevel) // validated
	reload.Log(r.log, r.level, level, r.cur.ConfigFile, apply, refuse)
}
