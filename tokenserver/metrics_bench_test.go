package tokenserver

import (
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/ru"
)

// BenchmarkScrape100k is one /metrics scrape (gzip) of 100,000 groups
// with 12 proxy slots each, as make bench-server's paced run leaves them.
func BenchmarkScrape100k(b *testing.B) {
	now := time.Now()
	s := &Server{cfg: Config{Now: time.Now}, alloc: NewAllocator(AllocConfig{})}
	for i := range 100_000 {
		name := fmt.Sprintf("bench%05d", i)
		s.alloc.SetGroup(name, Settings{RUPerSec: 1_000_000, Burst: resourcegroup.BurstModerated}, now)
		for p := range 12 {
			id := fmt.Sprintf("proxy-%03d", (i+p)%200)
			if _, err := s.alloc.Acquire(name, Request{ProxyID: id, Wanted: 100, Demand: 20}, now); err != nil {
				b.Fatal(err)
			}
			s.alloc.Report(name, id, ru.Consumption{RRU: 50.5, WRU: 40.25, Statements: 10}, 0, 0, 0, now)
		}
	}
	h := s.MetricsHandler(prometheus.NewRegistry())
	b.ResetTimer()
	for range b.N {
		req := httptest.NewRequest("GET", "/metrics", nil)
		req.Header.Set("Accept-Encoding", "gzip")
		w := httptest.NewRecorder()
		w.Body = nil // discard what is written
		h.ServeHTTP(w, req)
	}
}
