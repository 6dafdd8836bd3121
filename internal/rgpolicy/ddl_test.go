package rgpolicy

import (
	"testing"

	"github.com/rgproxy/rgproxy/resourcegroup"
)

// TestLimited: the groups whose accounts may not create events in strict
// mode are the ones that throttle.
func TestLimited(t *testing.T) {
	for _, tt := range []struct {
		name string
		g    resourcegroup.Group
		want bool
	}{
		{"a rate", resourcegroup.Group{RUPerSec: 20}, true},
		{"a rate, moderated burst", resourcegroup.Group{RUPerSec: 20, Burst: resourcegroup.BurstModerated}, true},
		{"unlimited rate", resourcegroup.Group{RUPerSec: resourcegroup.Unlimited}, false},
		{"unlimited burst", resourcegroup.Group{RUPerSec: 20, Burst: resourcegroup.BurstUnlimited}, false},
		{"MODE WARN", resourcegroup.Group{RUPerSec: 20, Mode: resourcegroup.ModeWarn}, false},
	} {
		if got := limited(tt.g); got != tt.want {
			t.Errorf("%s: limited = %v, want %v", tt.name, got, tt.want)
		}
	}
}
