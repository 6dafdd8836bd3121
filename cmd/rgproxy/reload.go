package main

import (
	"flag"
	"fmt"
	"log/slog"
	"strings"

	"github.com/rgproxy/rgproxy/internal/reload"
	"github.com/rgproxy/rgproxy/internal/rgpolicy"
	"github.com/rgproxy/rgproxy/mysqlproto"
)

// reloadable says whether SIGHUP may change a setting (a flag's name)
// while rgproxy serves; every other one needs a restart.
func reloadable(name string) bool {
	switch name {
	case "log-level", "max-wait", "max-wait-in-txn", "max-connections", "max-backend-concurrency",
		"strict-resource-groups", "tls-cert", "tls-key", "chargeback-tag-keys":
		return true
	}
	return false
}

// flagSetOf returns a flag set whose values are c's.
func flagSetOf(c config) *flag.FlagSet {
	v := c
	fs := newFlagSet(&v) // binding sets every field to its default...
	v = c                // ...so put c's values back behind the flags
	return fs
}

// diffConfig lists the settings that differ between old and new, by flag
// name; "ru" stands for the config file's [ru] table.
func diffConfig(old, new config) []reload.Change {
	cs := reload.Diff(flagSetOf(old), flagSetOf(new))
	if old.RU != new.RU {
		cs = append(cs, reload.Change{Name: "ru", Old: fmt.Sprintf("%+v", old.RU), New: fmt.Sprintf("%+v", new.RU)})
	}
	return cs
}

// reloader applies the configuration again on SIGHUP: the command line and
// the --config file as it is now, flags winning over the file as at start.
type reloader struct {
	args []string
	// cur is the configuration in force: what a reload applied, and the
	// start-up values of what it could not.
	cur   config
	level *slog.LevelVar
	srv   *mysqlproto.Server
	// policy is nil without metering.
	policy *rgpolicy.Policy
	// cert is the client TLS certificate in force; empty without TLS.
	cert reload.Certificate
	log  *slog.Logger
}

// reload reads the configuration again and applies what changed and may
// change while serving, in one log line naming each change (old → new);
// a changed setting that needs a restart is named in a warning and left
// as it is. A configuration that does not parse or validate, or whose
// certificate does not load, changes nothing.
func (r *reloader) reload() {
	next, _, err := parseArgs(r.args)
	if err != nil {
		reload.Failed(r.log, r.cur.ConfigFile, err)
		return
	}
	var cert reload.Certificate
	tlsOnOff := (r.cur.TLSCert == "") != (next.TLSCert == "")
	if next.TLSCert != "" && !tlsOnOff {
		if cert, err = reload.LoadCertificate(next.TLSCert, next.TLSKey); err != nil {
			reload.Failed(r.log, r.cur.ConfigFile, fmt.Errorf("client TLS: %w", err))
			return
		}
	}
	apply, refuse := reload.Split(diffConfig(r.cur, next), func(name string) bool {
		// CLIENT_SSL is offered or not from the start.
		return reloadable(name) && !(tlsOnOff && (name == "tls-cert" || name == "tls-key"))
	})
	// The certificate is named by its file and fingerprint, so a file
	// rotated in place shows as a change.
	apply = reload.Without(apply, "tls-cert")
	if cert.Label != "" && cert.Label != r.cert.Label {
		if err := r.srv.SetClientCertificate(cert.Certificate); err != nil {
			reload.Failed(r.log, r.cur.ConfigFile, err)
			return
		}
		apply = append(apply, reload.Change{Name: "tls-cert", Old: r.cert.Label, New: cert.Label})
		r.cert = cert
	}

	for _, c := range apply {
		switch c.Name {
		case "max-connections":
			_ = r.srv.SetMaxConnections(next.MaxConnections) // validated: >= 0
			r.cur.MaxConnections = next.MaxConnections
		case "tls-cert", "tls-key":
			r.cur.TLSCert, r.cur.TLSKey = next.TLSCert, next.TLSKey
		case "log-level":
			r.cur.LogLevel = next.LogLevel
		case "max-wait":
			r.cur.MaxWait = next.MaxWait
		case "max-wait-in-txn":
			r.cur.MaxWaitInTxn = next.MaxWaitInTxn
		case "max-backend-concurrency":
			r.cur.MaxBackendConcurrency = next.MaxBackendConcurrency
		case "strict-resource-groups":
			r.cur.StrictResourceGroups = next.StrictResourceGroups
		case "chargeback-tag-keys":
			r.cur.ChargebackTagKeys = next.ChargebackTagKeys
		}
	}
	if r.policy != nil {
		r.policy.Reload(policySettings(r.cur))
	}
	reload.Log(r.log, r.level, parseLevel(r.cur.LogLevel), r.cur.ConfigFile, apply, refuse)
}

// parseLevel turns a validated --log-level into a slog level.
func parseLevel(s string) slog.Level {
	var l slog.Level
	_ = l.UnmarshalText([]byte(strings.ToUpper(s)))
	return l
}
