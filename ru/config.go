// Package ru is rgproxy's cost model: it turns what is known about a
// statement before it is forwarded (RequestInfo) and what was measured after
// its final packet (ResponseInfo) into Request Units, split into read RU (RRU)
// and write RU (WRU) as TiDB/PD and CockroachDB do.
//
// The package does no I/O and keeps no state: a Config is a set of
// coefficients, and its BeforeCost and AfterCost methods are pure functions.
package ru

import (
	"errors"
	"fmt"
	"math"
)

// ErrInvalidConfig is returned (wrapped) by Config.Validate.
var ErrInvalidConfig = errors.New("ru: invalid config")

// Config holds the cost coefficients. It decodes from a `[ru]` TOML table;
// start from DefaultConfig so that keys absent from the file keep their
// defaults. The defaults are PD's DefaultRequestUnitConfig.
type Config struct {
	// ReadBaseCost is the RRU a read or `other` statement pays per batch.
	// Unit: RU. Default 0.125.
	ReadBaseCost float64 `toml:"read_base_cost"`
	// ReadPerRequestBaseCost is the RRU a read or `other` statement pays per
	// request. Unit: RU. Default 0.5.
	ReadPerRequestBaseCost float64 `toml:"read_per_request_base_cost"`
	// WriteBaseCost is the WRU a write statement pays per batch.
	// Unit: RU. Default 1.
	WriteBaseCost float64 `toml:"write_base_cost"`
	// WritePerRequestBaseCost is the WRU a write statement pays per request.
	// Unit: RU. Default 1.
	WritePerRequestBaseCost float64 `toml:"write_per_request_base_cost"`
	// ReadCostPerByte is the RRU per result byte the backend returns.
	// Unit: RU per byte. Default 1/65536 (1 RU per 64 KiB).
	ReadCostPerByte float64 `toml:"read_cost_per_byte"`
	// WriteCostPerByte is the WRU per byte of a write statement's payload.
	// Unit: RU per byte. Default 1/1024 (1 RU per KiB).
	WriteCostPerByte float64 `toml:"write_cost_per_byte"`
	// CPUMsCost is the RRU per millisecond of CPU: the CPU time of the
	// backend thread serving the session where rgproxy can read it
	// (--cpu-source proc), else the statement's backend time (wall).
	// Unit: RU per millisecond. Default 1/3 (1 RU per 3 ms).
	CPUMsCost float64 `toml:"cpu_ms_cost"`
}

// DefaultConfig returns TiDB's coefficients: README's RU table and
// docs/design.md §5.
func DefaultConfig() Config {
	return Config{
		ReadBaseCost:            0.125,
		ReadPerRequestBaseCost:  0.5,
		WriteBaseCost:           1,
		WritePerRequestBaseCost: 1,
		ReadCostPerByte:         1.0 / (64 * 1024),
		WriteCostPerByte:        1.0 / 1024,
		CPUMsCost:               1.0 / 3,
	}
}

// Validate reports the first coefficient that is negative, NaN or infinite.
// Zero is allowed: it switches that part of the cost off.
func (c Config) Validate() error {
	fields := []struct {
		key string
		v   float64
	}{
		{"read_base_cost", c.ReadBaseCost},
		{"read_per_request_base_cost", c.ReadPerRequestBaseCost},
		{"write_base_cost", c.WriteBaseCost},
		{"write_per_request_base_cost", c.WritePerRequestBaseCost},
		{"read_cost_per_byte", c.ReadCostPerByte},
		{"write_cost_per_byte", c.WriteCostPerByte},
		{"cpu_ms_cost", c.CPUMsCost},
	}
	for _, f := range fields {
		if math.IsNaN(f.v) || math.IsInf(f.v, 0) || f.v < 0 {
			return fmt.Errorf("%w: %s must be a finite number >= 0, got %v", ErrInvalidConfig, f.key, f.v)
		}
	}
	return nil
}
