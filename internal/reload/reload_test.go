package reload

import (
	"bytes"
	"flag"
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"
)

type conf struct {
	Addr  string
	Wait  time.Duration
	Level string
	On    bool
}

func flags(c *conf) *flag.FlagSet {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.StringVar(&c.Addr, "addr", c.Addr, "")
	fs.DurationVar(&c.Wait, "wait", c.Wait, "")
	fs.StringVar(&c.Level, "level", c.Level, "")
	fs.BoolVar(&c.On, "on", c.On, "")
	return fs
}

func TestDiffSplitJoin(t *testing.T) {
	old := conf{Addr: "a:1", Wait: time.Second, Level: "info", On: true}
	tests := []struct {
		name          string
		new           conf
		apply, refuse string
	}{
		{"same", old, "", ""},
		{"reloadable only", conf{Addr: "a:1", Wait: 100 * time.Millisecond, Level: "debug", On: true},
			"level: info → debug; wait: 1s → 100ms", ""},
		{"both, sorted", conf{Addr: "b:2", Wait: time.Second, Level: "", On: false},
			`level: info → ""`, "addr: a:1 → b:2; on: true → false"},
	}
	reloadable := func(n string) bool { return n == "wait" || n == "level" }
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, n := old, tt.new
			apply, refuse := Split(Diff(flags(&o), flags(&n)), reloadable)
			if got := Join(apply); got != tt.apply {
				t.Errorf("apply %q, want %q", got, tt.apply)
			}
			if got := Join(refuse); got != tt.refuse {
				t.Errorf("refuse %q, want %q", got, tt.refuse)
			}
		})
	}
	o, n := old, conf{Addr: "b:2", Level: "warn"}
	if got := Names(Diff(flags(&o), flags(&n))); got != "addr, level, on, wait" {
		t.Errorf("Names: %q", got)
	}
}

func TestDiffIgnoresFlagsOnlyOneSideHas(t *testing.T) {
	o, n := conf{Addr: "a"}, conf{Addr: "b"}
	small := flag.NewFlagSet("t", flag.ContinueOnError)
	small.String("other", "x", "")
	if got := Diff(flags(&o), small); len(got) != 0 {
		t.Errorf("got %v", got)
	}
	if got := Diff(flags(&o), flags(&n)); !reflect.DeepEqual(got, []Change{{"addr", "a", "b"}}) {
		t.Errorf("got %v", got)
	}
}

func TestLoadCertificateErrors(t *testing.T) {
	if _, err := LoadCertificate("/nonexistent/cert.pem", "/nonexistent/key.pem"); err == nil || !strings.Contains(err.Error(), "nonexistent") {
		t.Fatalf("missing files: %v", err)
	}
}

func TestLogSaysLevelChangeEitherWay(t *testing.T) {
	for _, tt := range []struct{ from, to slog.Level }{{slog.LevelInfo, slog.LevelError}, {slog.LevelError, slog.LevelDebug}} {
		var buf bytes.Buffer
		level := new(slog.LevelVar)
		level.Set(tt.from)
		log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: level}))
		ch := []Change{{"log-level", tt.from.String(), tt.to.String()}}
		Log(log, level, tt.to, "f.toml", ch, Without([]Change{{"tls-cert", "a", "b"}, {"listen", "x", "y"}}, "tls-cert"))
		out := buf.String()
		if !strings.Contains(out, `msg="config reloaded" config=f.toml changed="log-level: `+tt.from.String()) ||
			!strings.Contains(out, `refused=listen changes="listen: x → y"`) || level.Level() != tt.to {
			t.Errorf("%v → %v: level %v, log:\n%s", tt.from, tt.to, level.Level(), out)
		}
	}
}
