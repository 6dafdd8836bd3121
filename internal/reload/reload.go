// Package reload is what rgproxy and rgserver share to apply their
// configuration again on SIGHUP: which flags differ between the
// configuration in force and the one read now, split into those that may
// change while serving and those that need a restart, rendered for one log
// line; and a TLS certificate named by its file and fingerprint, so that a
// log line tells a rotated file from the one in force.
package reload

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
)

// Change is one setting whose value differs.
type Change struct {
	// Name is the flag's name (the config file's key).
	Name string
	// Old and New are the values in force and read now, as flags print them.
	Old, New string
}

// String renders the change as `name: old → new`.
func (c Change) String() string {
	return fmt.Sprintf("%s: %s → %s", c.Name, show(c.Old), show(c.New))
}

// show makes an empty value visible.
func show(v string) string {
	if v == "" {
		return `""`
	}
	return v
}

// Diff lists, sorted by name, every flag of old whose value in new
// differs. old and new declare the same flags: one configuration type
// bound twice.
func Diff(old, new *flag.FlagSet) []Change {
	var out []Change
	old.VisitAll(func(f *flag.Flag) {
		n := new.Lookup(f.Name)
		if n == nil {
			return
		}
		if o, v := f.Value.String(), n.Value.String(); o != v {
			out = append(out, Change{Name: f.Name, Old: o, New: v})
		}
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Split returns the changes whose name reloadable accepts, and the others.
func Split(cs []Change, reloadable func(name string) bool) (apply, refuse []Change) {
	for _, c := range cs {
		if reloadable(c.Name) {
			apply = append(apply, c)
		} else {
			refuse = append(refuse, c)
		}
	}
	return apply, refuse
}

// Without drops the change named name.
func Without(cs []Change, name string) []Change {
	out := make([]Change, 0, len(cs))
	for _, c := range cs {
		if c.Name != name {
			out = append(out, c)
		}
	}
	return out
}

// Join renders changes for one log line, separated by "; ".
func Join(cs []Change) string {
	s := make([]string, len(cs))
	for i, c := range cs {
		s[i] = c.String()
	}
	return strings.Join(s, "; ")
}

// Names lists the changes' names, separated by ", ".
func Names(cs []Change) string {
	s := make([]string, len(cs))
	for i, c := range cs {
		s[i] = c.Name
	}
	return strings.Join(s, ", ")
}

// Certificate is a TLS certificate loaded from PEM files.
type Certificate struct {
	tls.Certificate
	// Label names it: the certificate file and the first bytes of the
	// SHA-256 of its leaf, e.g. "server.pem (sha256:3f2a9c01d4e5)".
	Label string
}

// LoadCertificate reads a PEM certificate and its key.
func LoadCertificate(certFile, keyFile string) (Certificate, error) {
	c, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return Certificate{}, err
	}
	sum := sha256.Sum256(c.Certificate[0])
	return Certificate{Certificate: c, Label: fmt.Sprintf("%s (sha256:%s)", certFile, hex.EncodeToString(sum[:6]))}, nil
}

// Log reports a reload that applied apply and refused refuse: one info
// line naming what changed (old → new), or saying that nothing did, and
// one warning naming what needs a restart. It then sets level to next.
// The lines are written at the more verbose of the two levels, so that
// going from info to error still says so (and from error to info too).
func Log(log *slog.Logger, level *slog.LevelVar, next slog.Level, file string, apply, refuse []Change) {
	level.Set(min(level.Level(), next))
	switch {
	case len(apply) > 0:
		log.Info("config reloaded", "config", file, "changed", Join(apply))
	case len(refuse) == 0:
		log.Info("config reloaded: nothing changed", "config", file)
	}
	if len(refuse) > 0 {
		log.Warn("config reload: these settings need a restart and were not changed",
			"config", file, "refused", Names(refuse), "changes", Join(refuse))
	}
	level.Set(next)
}

// Failed reports a reload that changed nothing because of err.
func Failed(log *slog.Logger, file string, err error) {
	log.Error("config reload failed; nothing changed", "config", file, "err", err)
}

// OnSignal calls reload for each signal on sig until ctx ends, then
// returns; reloads never overlap. The caller runs it on a goroutine it
// owns.
func OnSignal(ctx context.Context, sig <-chan os.Signal, reload func()) {
	for {
		select {
		case <-sig:
			reload()
		case <-ctx.Done():
			return
		}
	}
}
