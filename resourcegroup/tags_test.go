package resourcegroup

import (
	"strings"
	"testing"
)

func TestTagBindingKey(t *testing.T) {
	for _, kv := range [][2]string{{"route", "/report"}, {"a=b", "c=d"}, {"k", ""}, {"x y+z%", "é'/\\,"}} {
		k := TagBindingKey(kv[0], kv[1])
		if strings.Count(k, "=") != 1 || strings.Contains(k, "/") {
			t.Errorf("TagBindingKey(%q, %q) = %q: not one '=' and no '/'", kv[0], kv[1], k)
		}
		key, value, err := SplitTagBindingKey(k)
		if err != nil || key != kv[0] || value != kv[1] {
			t.Errorf("SplitTagBindingKey(%q) = %q, %q, %v", k, key, value, err)
		}
	}
	for _, bad := range []string{"noequals", "%zz=a", "a=%zz"} {
		if _, _, err := SplitTagBindingKey(bad); err == nil {
			t.Errorf("SplitTagBindingKey(%q) succeeded", bad)
		}
	}
}
