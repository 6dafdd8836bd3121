package ru

import (
	"fmt"
	"math"
)

// Consumption is what one statement, or a sum of statements, was charged.
// Fields may be negative in a single AfterCost (a failed write's refund) or
// in a difference made with Sub.
type Consumption struct {
	// RRU is the read Request Units charged.
	RRU float64
	// WRU is the write Request Units charged.
	WRU float64
	// ReadBytes is the result bytes charged for.
	ReadBytes float64
	// WriteBytes is the written payload bytes charged for.
	WriteBytes float64
	// BackendSeconds is the backend time charged for, in seconds.
	BackendSeconds float64
	// Statements counts the statements charged (each counts once, in
	// BeforeCost).
	Statements float64
	// CPUSeconds is the backend CPU time charged for, in seconds: the
	// backend thread's CPU time (or a short statement's capped wall time)
	// where the CPU part was CPU-true (ResponseInfo.CPUKnown), else 0. RU
	// per backend CPU-second (CALIBRATE RESOURCE) is RU over it.
	CPUSeconds float64
}

// Add adds o to c field by field.
func (c *Consumption) Add(o Consumption) {
	c.RRU += o.RRU
	c.WRU += o.WRU
	c.ReadBytes += o.ReadBytes
	c.WriteBytes += o.WriteBytes
	c.BackendSeconds += o.BackendSeconds
	c.Statements += o.Statements
	c.CPUSeconds += o.CPUSeconds
}

// Sub subtracts o from c field by field, e.g. to get the consumption since
// the last report from two running totals.
func (c *Consumption) Sub(o Consumption) {
	c.RRU -= o.RRU
	c.WRU -= o.WRU
	c.ReadBytes -= o.ReadBytes
	c.WriteBytes -= o.WriteBytes
	c.BackendSeconds -= o.BackendSeconds
	c.Statements -= o.Statements
	c.CPUSeconds -= o.CPUSeconds
}

// Scale returns c with every field multiplied by f, e.g. the part f of a
// debt split off to be paid now.
func (c Consumption) Scale(f float64) Consumption {
	return Consumption{RRU: c.RRU * f, WRU: c.WRU * f, ReadBytes: c.ReadBytes * f, WriteBytes: c.WriteBytes * f,
		BackendSeconds: c.BackendSeconds * f, Statements: c.Statements * f, CPUSeconds: c.CPUSeconds * f}
}

// RU is the total Request Units: RRU + WRU.
func (c Consumption) RU() float64 { return c.RRU + c.WRU }

// IsZero reports whether nothing was charged.
func (c Consumption) IsZero() bool { return c == Consumption{} }

// String prints c on one line, e.g.
// "RU=2.625 RRU=0.625 WRU=2 read=0B written=0B backend=0s statements=1".
func (c Consumption) String() string {
	return fmt.Sprintf("RU=%g RRU=%g WRU=%g read=%gB written=%gB backend=%gs statements=%g",
		round(c.RU()), round(c.RRU), round(c.WRU), c.ReadBytes, c.WriteBytes, round(c.BackendSeconds), c.Statements)
}

// round keeps String readable: six decimals are more than any dashboard or
// test story needs.
func round(x float64) float64 {
	const scale = 1e6
	r := math.Round(x*scale) / scale
	if r == 0 {
		return 0 // no "-0"
	}
	return r
}
