package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"

	"github.com/rgproxy/rgproxy/internal/reload"
)

// reloadable says whether SIGHUP may change a setting (a flag's name)
// while rgserver serves; every other one needs a restart.
func reloadable(name string) bool {
	switch name {
	case "log-level", "tls-cert", "tls-key":
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
}

// getCertificate serves the certificate in force to each new TLS
// handshake (tls.Config.GetCertificate); running streams keep theirs.
func (r *reloader) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return &r.cert.Load().Certificate, nil
}

// reload reads the configuration again and applies the log level and the
// TLS certificate (a file rotated in place counts), in one log line; a
// changed setting that needs a restart is named in a warning and left as
// it is. A configuration that does not parse or validate, or whose
// certificate does not load, changes nothing.
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
	if next.TLSCert != "" && !tlsOnOff {
		cert, err := reload.LoadCertificate(next.TLSCert, next.TLSKey)
		if err != nil {
			reload.Failed(r.log, r.cur.ConfigFile, fmt.Errorf("tls: %w", err))
			return
		}
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
