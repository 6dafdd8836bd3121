package tokenserver

import (
	"errors"

	"github.com/pingcap/failpoint"
)

// Failpoints (github.com/pingcap/failpoint) mark where rgserver fails in
// production. They are compiled in only by `make test-failpoints`
// (failpoint-toolexec, with a build cache of its own); in normal builds the
// markers are empty calls:
//
//	etcdWriteError   a group create or alter fails before reaching etcd
//	etcdTxnConflict  an alter's compare-and-swap loses to another writer
//	etcdReadError    reading one group or the group list fails
//	settingsWatchLag(ms)  the settings watch applies each change ms late
//	persistError     saving the bucket states fails
//	campaignError    a leader campaign fails
//	resignError      a leader's resign on shutdown fails
//
// and electionRetry (failpoint.EnableCall) reports each failed election
// round to a test.

// errFailpoint is the error an enabled failpoint injects.
var errFailpoint = errors.New("tokenserver: injected by a failpoint")

// failpointsCompiledIn reports whether the markers were rewritten into
// live code, so that failpoint tests can tell a plain build from theirs.
func failpointsCompiledIn() (on bool) {
	failpoint.Inject("probe", func() { on = true })
	return on
}
