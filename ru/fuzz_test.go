package ru

import (
	"math"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
)

// FuzzConfig decodes arbitrary [ru] tables and, for every config that
// validates, checks that costs never go negative except for a failed write's
// refund, which never takes back more than the byte cost it charged.
func FuzzConfig(f *testing.F) {
	f.Add("[ru]\nread_base_cost = 0.25\n", uint8(ClassRead), int64(100), int64(1<<16), int64(3e6), false)
	f.Add("[ru]\nwrite_cost_per_byte = 1e300\n", uint8(ClassWrite), int64(1<<40), int64(0), int64(0), true)
	f.Add("[ru]\ncpu_ms_cost = -1\n", uint8(ClassOther), int64(0), int64(0), int64(1), false)
	f.Add("[ru\n", uint8(ClassFetch), int64(-1), int64(-1), int64(-1), true)
	f.Fuzz(func(t *testing.T, doc string, class uint8, wb, rb, bt int64, failed bool) {
		fc := struct {
			RU Config `toml:"ru"`
		}{RU: DefaultConfig()}
		if _, err := toml.Decode(doc, &fc); err != nil {
			return
		}
		cfg := fc.RU
		if cfg.Validate() != nil {
			return
		}
		req := RequestInfo{Class: Class(class), WriteBytes: wb}
		res := ResponseInfo{ReadBytes: rb, WriteBytes: wb / 2, BackendTime: time.Duration(bt), Failed: failed}
		before, after := cfg.BeforeCost(req), cfg.AfterCost(req, res)
		for _, v := range []float64{before.RRU, before.WRU, before.ReadBytes, before.WriteBytes, before.Statements,
			after.RRU, after.ReadBytes, after.BackendSeconds} {
			if v < 0 || math.IsNaN(v) {
				t.Fatalf("negative or NaN part: before %s, after %s", before, after)
			}
		}
		if after.WRU < 0 || after.WriteBytes < 0 {
			if !(failed && req.Class == ClassWrite) {
				t.Fatalf("refund outside a failed write: %s", after)
			}
			if -after.WRU > before.WRU || -after.WriteBytes != before.WriteBytes {
				t.Fatalf("refund %s exceeds charge %s", after, before)
			}
		}
	})
}
