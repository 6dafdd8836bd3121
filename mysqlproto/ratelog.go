package mysqlproto

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/rgproxy/rgproxy/internal/clock"
)

// logEvery is the least time between two lines of a rate-limited log.
const logEvery = time.Second

// logLimiter writes one kind of log line at most once per logEvery, so
// that a flood of refused connections or broken packets costs a line a
// second, not a line each: the first event is logged at once; those that
// follow within the period are counted, by key, and logged as one summary
// line when the period ends, with the attributes of the last of them.
type logLimiter struct {
	log   *slog.Logger
	clk   clock.Clock
	level slog.Level
	// msg is the message of one event; summary that of the line that
	// sums up several; keyName labels the counts by key.
	msg, summary, keyName string

	mu      sync.Mutex
	last    time.Time // when the last line was written
	pending map[string]int64
	sample  []any // the attributes of the last event not yet logged
	timer   clock.Timer
}

func newLogLimiter(log *slog.Logger, clk clock.Clock, level slog.Level, msg, summary, keyName string) *logLimiter {
	return &logLimiter{log: log, clk: clk, level: level, msg: msg, summary: summary, keyName: keyName,
		pending: make(map[string]int64)}
}

// event records one event of the given key; attrs describe it.
func (l *logLimiter) event(key string, attrs ...any) {
	if !l.log.Enabled(context.Background(), l.level) {
		return
	}
	l.mu.Lock()
	now := l.clk.Now()
	if l.timer == nil && (l.last.IsZero() || now.Sub(l.last) >= logEvery) {
		l.last = now
		l.mu.Unlock()
		l.log.Log(context.Background(), l.level, l.msg, append([]any{l.keyName, key}, attrs...)...)
		return
	}
	l.pending[key]++
	l.sample = attrs
	if l.timer == nil {
		l.timer = l.clk.AfterFunc(max(0, l.last.Add(logEvery).Sub(now)), l.flush)
	}
	l.mu.Unlock()
}

// flush writes the summary of the events counted since the last line.
func (l *logLimiter) flush() {
	l.mu.Lock()
	var total int64
	keys := make([]string, 0, len(l.pending))
	for k, n := range l.pending {
		keys = append(keys, k)
		total += n
	}
	sort.Strings(keys)
	var by strings.Builder
	for i, k := range keys {
		if i > 0 {
			by.WriteByte(' ')
		}
		fmt.Fprintf(&by, "%s=%d", k, l.pending[k])
	}
	sample := l.sample
	clear(l.pending)
	l.sample = nil
	l.timer = nil
	l.last = l.clk.Now()
	l.mu.Unlock()
	if total == 0 {
		return
	}
	attrs := []any{"count", total, l.keyName + "s", by.String()}
	for i := 0; i+1 < len(sample); i += 2 {
		if k, ok := sample[i].(string); ok {
			attrs = append(attrs, "last_"+k, sample[i+1])
		}
	}
	l.log.Log(context.Background(), l.level, l.summary, attrs...)
}

// stop cancels a pending summary (the server is shutting down); the
// events it would have summed up are logged now.
func (l *logLimiter) stop() {
	l.mu.Lock()
	t := l.timer
	l.mu.Unlock()
	if t != nil && t.Stop() {
		l.flush()
	}
}
