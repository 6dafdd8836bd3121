package mysqlproto

import "testing"

type countingPolicy struct{ next Policy }

func (p countingPolicy) Open(info SessionInfo) SessionPolicy { return p.next.Open(info) }
func (p countingPolicy) WrapsPassThrough() bool {
	_, ok := p.next.(PassThrough)
	return ok
}

type blockingPolicy struct{ PassThrough }

// A wrapper of PassThrough keeps the server's pass-through shortcuts (no
// digest, no hangup check during Before); a wrapper of a real policy, or a
// policy of its own, does not.
func TestPassesThrough(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    Policy
		want bool
	}{
		{"PassThrough", PassThrough{}, true},
		{"wrapper of PassThrough", countingPolicy{PassThrough{}}, true},
		{"wrapper of a policy", countingPolicy{blockingPolicy{}}, false},
		{"a policy", blockingPolicy{}, false},
	} {
		if got := passesThrough(tc.p); got != tc.want {
			t.Errorf("%s: passesThrough = %v, want %v", tc.name, got, tc.want)
		}
	}
}
