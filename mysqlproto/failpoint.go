package mysqlproto

import (
	"errors"

	"github.com/pingcap/failpoint"
)

// Failpoints (github.com/pingcap/failpoint) mark where a proxy session
// fails in production. They are compiled in only by `make test-failpoints`
// (failpoint-toolexec, with a build cache of its own); in normal builds the
// markers are empty calls:
//
//	backendDialError     dialing the backend fails
//	backendReadError(n)  reading the backend's response fails once n
//	                     bytes of it were relayed
//	clientWriteStall(ms) each write to a client blocks ms milliseconds

// errFailpoint is the error an enabled failpoint injects.
var errFailpoint = errors.New("mysqlproto: injected by a failpoint")

// failpointsCompiledIn reports whether the markers were rewritten into
// live code, so that failpoint tests can tell a plain build from theirs.
func failpointsCompiledIn() (on bool) {
	failpoint.Inject("probe", func() { on = true })
	return on
}
