package main

import (
	"strings"
	"testing"
)

// TestWriteSourceFlag: --write-source takes auto, binlog, estimate or
// packet; binlog needs the service account that reads the log.
func TestWriteSourceFlag(t *testing.T) {
	tests := []struct {
		args    []string
		wantErr string
	}{
		{nil, ""},
		{[]string{"--write-source", "estimate"}, ""},
		{[]string{"--write-source", "packet"}, ""},
		{[]string{"--write-source", "binlog", "--admin-user", "rgsvc", "--admin-password-file", "/dev/null"}, ""},
		{[]string{"--write-source", "binlog"}, "--write-source=binlog needs --admin-user"},
		{[]string{"--write-source", "rows"}, "--write-source must be auto, binlog, estimate or packet"},
	}
	for _, tc := range tests {
		cfg, _, err := parseArgs(tc.args)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%v: %v", tc.args, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%v: %v, want an error saying %q", tc.args, err, tc.wantErr)
		case tc.wantErr == "" && tc.args == nil && cfg.WriteSource != "auto":
			t.Errorf("default --write-source %q", cfg.WriteSource)
		}
	}
}
