package ru

import (
	"math"
	"testing"
	"time"
)

// close enough for values such as 1/3 that no float holds exactly.
func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

func sameConsumption(t *testing.T, what string, got, want Consumption) {
	t.Helper()
	if !near(got.RRU, want.RRU) || !near(got.WRU, want.WRU) || !near(got.ReadBytes, want.ReadBytes) ||
		!near(got.WriteBytes, want.WriteBytes) || !near(got.BackendSeconds, want.BackendSeconds) ||
		!near(got.Statements, want.Statements) {
		t.Errorf("%s:\n got  %s\n want %s", what, got, want)
	}
}

func TestCostRules(t *testing.T) {
	cfg := DefaultConfig()
	tests := []struct {
		name          string
		req           RequestInfo
		res           ResponseInfo
		before, after Consumption
	}{
		{
			name:   "read pays 0.5+0.125 RRU up front",
			req:    RequestInfo{Class: ClassRead},
			before: Consumption{RRU: 0.625, Statements: 1},
		},
		{
			name:   "read: 128 KiB of result is 2 RRU and 6 ms of backend time is 2 RRU",
			req:    RequestInfo{Class: ClassRead},
			res:    ResponseInfo{ReadBytes: 128 << 10, BackendTime: 6 * time.Millisecond},
			before: Consumption{RRU: 0.625, Statements: 1},
			after:  Consumption{RRU: 4, ReadBytes: 128 << 10, BackendSeconds: 0.006},
		},
		{
			name:   "one millisecond of backend time is a third of an RU",
			req:    RequestInfo{Class: ClassRead},
			res:    ResponseInfo{BackendTime: time.Millisecond},
			before: Consumption{RRU: 0.625, Statements: 1},
			after:  Consumption{RRU: 1.0 / 3, BackendSeconds: 0.001},
		},
		{
			name:   "known CPU time, not backend time, is the CPU cost",
			req:    RequestInfo{Class: ClassRead},
			res:    ResponseInfo{BackendTime: time.Second, CPUTime: 3 * time.Millisecond, CPUKnown: true},
			before: Consumption{RRU: 0.625, Statements: 1},
			after:  Consumption{RRU: 1, BackendSeconds: 1},
		},
		{
			name:   "a sleep on the backend costs no CPU",
			req:    RequestInfo{Class: ClassRead},
			res:    ResponseInfo{BackendTime: time.Second, CPUKnown: true},
			before: Consumption{RRU: 0.625, Statements: 1},
			after:  Consumption{BackendSeconds: 1},
		},
		{
			name:   "other costs as a read and its bytes are not write bytes",
			req:    RequestInfo{Class: ClassOther, WriteBytes: 4096},
			res:    ResponseInfo{ReadBytes: 64 << 10, WriteBytes: 4096, BackendTime: 3 * time.Millisecond},
			before: Consumption{RRU: 0.625, Statements: 1},
			after:  Consumption{RRU: 2, ReadBytes: 64 << 10, BackendSeconds: 0.003},
		},
		{
			name:   "a read's streamed write bytes are ignored",
			req:    RequestInfo{Class: ClassRead, WriteBytes: 1024},
			res:    ResponseInfo{WriteBytes: 1024},
			before: Consumption{RRU: 0.625, Statements: 1},
		},
		{
			name:   "write pays 1+1 WRU plus 1 WRU per KiB known up front",
			req:    RequestInfo{Class: ClassWrite, WriteBytes: 1024},
			before: Consumption{WRU: 3, WriteBytes: 1024, Statements: 1},
		},
		{
			name:   "write: streamed bytes are WRU, result bytes and backend time RRU",
			req:    RequestInfo{Class: ClassWrite, WriteBytes: 512},
			res:    ResponseInfo{ReadBytes: 64 << 10, WriteBytes: 2048, BackendTime: 3 * time.Millisecond},
			before: Consumption{WRU: 2.5, WriteBytes: 512, Statements: 1},
			after:  Consumption{RRU: 2, WRU: 2, ReadBytes: 64 << 10, WriteBytes: 2048, BackendSeconds: 0.003},
		},
		{
			name:   "failed write: byte cost charged before is refunded, streamed bytes are free, base stays",
			req:    RequestInfo{Class: ClassWrite, WriteBytes: 4096},
			res:    ResponseInfo{WriteBytes: 1024, BackendTime: 3 * time.Millisecond, Failed: true},
			before: Consumption{WRU: 6, WriteBytes: 4096, Statements: 1},
			after:  Consumption{RRU: 1, WRU: -4, WriteBytes: -4096, BackendSeconds: 0.003},
		},
		{
			name:   "failed read is charged like a successful one",
			req:    RequestInfo{Class: ClassRead},
			res:    ResponseInfo{ReadBytes: 64 << 10, BackendTime: 3 * time.Millisecond, Failed: true},
			before: Consumption{RRU: 0.625, Statements: 1},
			after:  Consumption{RRU: 2, ReadBytes: 64 << 10, BackendSeconds: 0.003},
		},
		{
			name:   "fetch counts a statement and pays only read bytes",
			req:    RequestInfo{Class: ClassFetch, WriteBytes: 1024},
			res:    ResponseInfo{ReadBytes: 192 << 10, WriteBytes: 1024, BackendTime: 30 * time.Millisecond},
			before: Consumption{Statements: 1},
			after:  Consumption{RRU: 3, ReadBytes: 192 << 10},
		},
		{
			name: "free costs nothing at all",
			req:  RequestInfo{Class: ClassFree, WriteBytes: 1 << 20},
			res:  ResponseInfo{ReadBytes: 1 << 20, WriteBytes: 1 << 20, BackendTime: time.Second, Failed: true},
		},
		{
			name:   "negative measurements count as zero",
			req:    RequestInfo{Class: ClassWrite, WriteBytes: -100},
			res:    ResponseInfo{ReadBytes: -1, WriteBytes: -5, BackendTime: -time.Second},
			before: Consumption{WRU: 2, Statements: 1},
		},
		{
			name:   "a failed write with negative up-front bytes refunds nothing",
			req:    RequestInfo{Class: ClassWrite, WriteBytes: -100},
			res:    ResponseInfo{Failed: true},
			before: Consumption{WRU: 2, Statements: 1},
		},
		{
			name:   "an unknown class costs as other",
			req:    RequestInfo{Class: Class(42), WriteBytes: 1024},
			res:    ResponseInfo{ReadBytes: 64 << 10, WriteBytes: 1024},
			before: Consumption{RRU: 0.625, Statements: 1},
			after:  Consumption{RRU: 1, ReadBytes: 64 << 10},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sameConsumption(t, "BeforeCost", cfg.BeforeCost(tc.req), tc.before)
			sameConsumption(t, "AfterCost", cfg.AfterCost(tc.req, tc.res), tc.after)
			whole := tc.before
			whole.Add(tc.after)
			sameConsumption(t, "Cost", cfg.Cost(tc.req, tc.res), whole)
		})
	}
}

// Each coefficient moves only its own part of the cost.
func TestCostUsesEachCoefficient(t *testing.T) {
	tests := []struct {
		name string
		set  func(*Config)
		req  RequestInfo
		res  ResponseInfo
		want Consumption
	}{
		{"read base", func(c *Config) { c.ReadBaseCost = 2 }, RequestInfo{Class: ClassRead}, ResponseInfo{},
			Consumption{RRU: 2.5, Statements: 1}},
		{"read per request", func(c *Config) { c.ReadPerRequestBaseCost = 0 }, RequestInfo{Class: ClassOther}, ResponseInfo{},
			Consumption{RRU: 0.125, Statements: 1}},
		{"write base", func(c *Config) { c.WriteBaseCost = 5 }, RequestInfo{Class: ClassWrite}, ResponseInfo{},
			Consumption{WRU: 6, Statements: 1}},
		{"write per request", func(c *Config) { c.WritePerRequestBaseCost = 0.5 }, RequestInfo{Class: ClassWrite}, ResponseInfo{},
			Consumption{WRU: 1.5, Statements: 1}},
		{"read per byte", func(c *Config) { c.ReadCostPerByte = 0.01 }, RequestInfo{Class: ClassFetch}, ResponseInfo{ReadBytes: 300},
			Consumption{RRU: 3, ReadBytes: 300, Statements: 1}},
		{"write per byte", func(c *Config) { c.WriteCostPerByte = 0.5 }, RequestInfo{Class: ClassWrite, WriteBytes: 4}, ResponseInfo{WriteBytes: 2},
			Consumption{WRU: 5, WriteBytes: 6, Statements: 1}},
		{"cpu off", func(c *Config) { c.CPUMsCost = 0 }, RequestInfo{Class: ClassRead}, ResponseInfo{BackendTime: time.Second},
			Consumption{RRU: 0.625, BackendSeconds: 1, Statements: 1}},
		{"cpu per ms", func(c *Config) { c.CPUMsCost = 2 }, RequestInfo{Class: ClassWrite}, ResponseInfo{BackendTime: 1500 * time.Microsecond},
			Consumption{RRU: 3, WRU: 2, BackendSeconds: 0.0015, Statements: 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tc.set(&cfg)
			sameConsumption(t, "Cost", cfg.Cost(tc.req, tc.res), tc.want)
		})
	}
}

func TestClassString(t *testing.T) {
	for c, want := range map[Class]string{
		ClassRead: "read", ClassWrite: "write", ClassOther: "other", ClassFetch: "fetch", ClassFree: "free", Class(9): "class(9)",
	} {
		if got := c.String(); got != want {
			t.Errorf("Class(%d).String() = %q, want %q", uint8(c), got, want)
		}
	}
}

func TestZeroClassIsCharged(t *testing.T) {
	var req RequestInfo
	if got := DefaultConfig().BeforeCost(req).RU(); got != 0.625 {
		t.Fatalf("zero RequestInfo costs %v RU, want a read's 0.625", got)
	}
}
