package tokenclient

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestRecordRunawayNeverBlocks: with nobody sending (rgserver away), the
// queue fills and further events are dropped and counted at once; the
// strings of a queued event are cut to their bounds.
func TestRecordRunawayNeverBlocks(t *testing.T) {
	c, _ := newTestClient(t, nil)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range runawayQueueLen + 10 {
			c.RecordRunaway(RunawayEvent{Group: "g", SampleSQL: strings.Repeat("é", 600), MaskedSQL: strings.Repeat("a\xff", 1000), Account: strings.Repeat("u", 300)})
		}
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second): // a send that blocks never returns
		t.Fatal("RecordRunaway blocked on a full queue")
	}
	if got := testutil.ToFloat64(c.met.runawayDropped); got != 10 {
		t.Errorf("dropped %v events, want 10", got)
	}
	e := <-c.runaways.queue
	if len(e.GetSampleSql()) != runawaySample || len(e.GetAccount()) != runawayStringMax ||
		len(e.GetMaskedSql()) != runawaySample || !utf8.ValidString(e.GetMaskedSql()) {
		t.Errorf("queued event: sample of %d bytes, masked of %d, account of %d", len(e.GetSampleSql()), len(e.GetMaskedSql()), len(e.GetAccount()))
	}
}

func TestStartRunawayHistoryChecksInstance(t *testing.T) {
	c, _ := newTestClient(t, nil)
	for _, in := range []string{"", strings.Repeat("x", 257)} {
		if err := c.StartRunawayHistory(in); err == nil {
			t.Errorf("StartRunawayHistory(%d bytes) took it", len(in))
		}
	}
}
