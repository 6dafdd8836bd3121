package tokenclient

import (
	"fmt"
	"testing"

	"github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// BenchmarkApplyWatchChange: one ALTER reaching a proxy that caches
// 100,000 groups costs the same as with ten (changes are applied in place).
func BenchmarkApplyWatchChange(b *testing.B) {
	for _, n := range []int{10, 100000} {
		b.Run(fmt.Sprintf("groups=%d", n), func(b *testing.B) {
			c, _ := newTestClient(b, nil)
			snap := &tokenpb.WatchResponse{Revision: 1, Snapshot: true}
			for i := range n {
				snap.Events = append(snap.Events, &tokenpb.WatchEvent{Group: &tokenpb.ResourceGroup{Name: fmt.Sprintf("g%06d", i), RuPerSec: 10}})
			}
			c.applySettings(snap)
			rev := int64(1)
			for b.Loop() {
				rev++
				c.applySettings(&tokenpb.WatchResponse{Revision: rev, Events: []*tokenpb.WatchEvent{
					{Group: &tokenpb.ResourceGroup{Name: "g000001", RuPerSec: uint64(rev), Version: rev}}}})
			}
		})
	}
}
