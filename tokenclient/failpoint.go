package tokenclient

import (
	"errors"

	"github.com/pingcap/failpoint"

	"github.com/rgproxy/rgproxy/tokenserver/tokenpb"
)

// Failpoints (github.com/pingcap/failpoint) mark where the token stream
// fails in production. They are compiled in only by `make test-failpoints`
// (failpoint-toolexec, with a build cache of its own); in normal builds the
// markers are empty calls:
//
//	tokenStreamSendError  sending a TokenRequest fails
//	tokenStreamRecvError  receiving a TokenResponse fails
//	delayGrant(ms)        a response is applied ms milliseconds late
//	dropGrant             the stream breaks with a grant in flight

// errFailpoint is the error an enabled failpoint injects.
var errFailpoint = errors.New("tokenclient: injected by a failpoint")

// failpointsCompiledIn reports whether the markers were rewritten into
// live code, so that failpoint tests can tell a plain build from theirs.
func failpointsCompiledIn() (on bool) {
	failpoint.Inject("probe", func() { on = true })
	return on
}

// carriesTokens reports whether a response grants any tokens.
func carriesTokens(resp *tokenpb.TokenResponse) bool {
	for _, g := range resp.GetGrants() {
		if g.GetTokens() > 0 {
			return true
		}
	}
	return false
}

// lostGrant records, for tests, the tokens of a response that a failpoint
// dropped on its way in.
func (c *Client) lostGrant(resp *tokenpb.TokenResponse) {
	c.stream.mu.Lock()
	defer c.stream.mu.Unlock()
	for _, g := range resp.GetGrants() {
		c.stream.droppedTokens += g.GetTokens()
	}
}
