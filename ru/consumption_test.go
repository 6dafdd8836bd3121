package ru

import "testing"

func TestConsumptionAddSub(t *testing.T) {
	a := Consumption{RRU: 1.5, WRU: 2, ReadBytes: 100, WriteBytes: 50, BackendSeconds: 0.25, Statements: 1}
	b := Consumption{RRU: 0.5, WRU: -1, ReadBytes: 28, WriteBytes: -50, BackendSeconds: 0.5, Statements: 2}

	sum := a
	sum.Add(b)
	want := Consumption{RRU: 2, WRU: 1, ReadBytes: 128, WriteBytes: 0, BackendSeconds: 0.75, Statements: 3}
	if sum != want {
		t.Fatalf("a+b = %s, want %s", sum, want)
	}
	if got := sum.RU(); got != 3 {
		t.Fatalf("RU() = %v, want 3", got)
	}
	sum.Sub(b)
	if sum != a {
		t.Fatalf("a+b-b = %s, want %s", sum, a)
	}
	sum.Sub(a)
	if !sum.IsZero() {
		t.Fatalf("a-a = %s, want zero", sum)
	}
	if a.IsZero() {
		t.Fatalf("%s reported as zero", a)
	}
	if got, want := a.Scale(0.5), (Consumption{RRU: 0.75, WRU: 1, ReadBytes: 50, WriteBytes: 25, BackendSeconds: 0.125, Statements: 0.5}); got != want {
		t.Fatalf("a×0.5 = %s, want %s", got, want)
	}
}

func TestConsumptionString(t *testing.T) {
	tests := []struct {
		c    Consumption
		want string
	}{
		{Consumption{}, "RU=0 RRU=0 WRU=0 read=0B written=0B backend=0s statements=0"},
		{Consumption{RRU: 0.625, WRU: 2, Statements: 1},
			"RU=2.625 RRU=0.625 WRU=2 read=0B written=0B backend=0s statements=1"},
		{Consumption{RRU: 1.0 / 3, BackendSeconds: 0.001, ReadBytes: 65536},
			"RU=0.333333 RRU=0.333333 WRU=0 read=65536B written=0B backend=0.001s statements=0"},
		{Consumption{WRU: -4, WriteBytes: -4096},
			"RU=-4 RRU=0 WRU=-4 read=0B written=-4096B backend=0s statements=0"},
		{Consumption{WRU: -1e-9}, "RU=0 RRU=0 WRU=0 read=0B written=0B backend=0s statements=0"},
	}
	for _, tc := range tests {
		if got := tc.c.String(); got != tc.want {
			t.Errorf("String() = %q, want %q", got, tc.want)
		}
	}
}
