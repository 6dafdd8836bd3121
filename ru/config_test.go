package ru

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
)

func TestDefaultConfig(t *testing.T) {
	want := Config{
		ReadBaseCost:            0.125,
		ReadPerRequestBaseCost:  0.5,
		WriteBaseCost:           1,
		WritePerRequestBaseCost: 1,
		ReadCostPerByte:         1.0 / 65536,
		WriteCostPerByte:        1.0 / 1024,
		CPUMsCost:               1.0 / 3,
	}
	if got := DefaultConfig(); got != want {
		t.Fatalf("DefaultConfig() = %+v, want %+v", got, want)
	}
	if err := want.Validate(); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		key string
		set func(*Config, float64)
	}{
		{"read_base_cost", func(c *Config, v float64) { c.ReadBaseCost = v }},
		{"read_per_request_base_cost", func(c *Config, v float64) { c.ReadPerRequestBaseCost = v }},
		{"write_base_cost", func(c *Config, v float64) { c.WriteBaseCost = v }},
		{"write_per_request_base_cost", func(c *Config, v float64) { c.WritePerRequestBaseCost = v }},
		{"read_cost_per_byte", func(c *Config, v float64) { c.ReadCostPerByte = v }},
		{"write_cost_per_byte", func(c *Config, v float64) { c.WriteCostPerByte = v }},
		{"cpu_ms_cost", func(c *Config, v float64) { c.CPUMsCost = v }},
	}
	for _, tc := range tests {
		for _, bad := range []float64{-1, -1e-12, math.NaN(), math.Inf(1), math.Inf(-1)} {
			cfg := DefaultConfig()
			tc.set(&cfg, bad)
			err := cfg.Validate()
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.key) {
				t.Errorf("%s = %v: Validate() = %v, want ErrInvalidConfig naming %s", tc.key, bad, err, tc.key)
			}
		}
		cfg := DefaultConfig()
		tc.set(&cfg, 0)
		if err := cfg.Validate(); err != nil {
			t.Errorf("%s = 0: Validate() = %v, want nil (zero switches a cost off)", tc.key, err)
		}
	}
}

// fileConfig is how a binary's config file holds the cost model.
type fileConfig struct {
	Listen string `toml:"listen"`
	RU     Config `toml:"ru"`
}

func TestDecodeTOML(t *testing.T) {
	tests := []struct {
		name    string
		doc     string
		want    func(*Config)
		wantErr string
	}{
		{name: "no [ru] table keeps every default", doc: `listen = ":4000"`, want: func(*Config) {}},
		{
			name: "absent keys keep their defaults",
			doc: `listen = ":4000"
[ru]
read_base_cost = 0.25
write_cost_per_byte = 0.001
cpu_ms_cost = 0 # backend time free
`,
			want: func(c *Config) { c.ReadBaseCost = 0.25; c.WriteCostPerByte = 0.001; c.CPUMsCost = 0 },
		},
		{
			name: "integers are accepted for float coefficients",
			doc:  "[ru]\nwrite_base_cost = 2\nwrite_per_request_base_cost = 3\nread_per_request_base_cost = 1\nread_cost_per_byte = 1.52587890625e-05\n",
			want: func(c *Config) { c.WriteBaseCost = 2; c.WritePerRequestBaseCost = 3; c.ReadPerRequestBaseCost = 1 },
		},
		{name: "a string is a type error", doc: "[ru]\nread_base_cost = \"cheap\"\n", wantErr: "read_base_cost"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fc := fileConfig{RU: DefaultConfig()}
			_, err := toml.Decode(tc.doc, &fc)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Decode error = %v, want one naming %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			want := DefaultConfig()
			tc.want(&want)
			if fc.RU != want {
				t.Fatalf("decoded %+v, want %+v", fc.RU, want)
			}
			if err := fc.RU.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
		})
	}
}

func TestDecodedNegativeFailsValidate(t *testing.T) {
	fc := fileConfig{RU: DefaultConfig()}
	if _, err := toml.Decode("[ru]\nwrite_cost_per_byte = -0.5\n", &fc); err != nil {
		t.Fatal(err)
	}
	if err := fc.RU.Validate(); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Validate() = %v, want ErrInvalidConfig", err)
	}
}
