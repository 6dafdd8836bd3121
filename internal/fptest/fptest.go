// Package fptest holds what the failpoint tests of every package share:
// skipping where the markers are not compiled in, and turning a failpoint
// on for the length of one test. The markers become live code only in
// `make test-failpoints` (failpoint-toolexec); in a plain build they are
// empty calls, and the failpoint tests skip.
package fptest

import (
	"testing"

	"github.com/pingcap/failpoint"
)

// Need skips t unless the failpoints of the package at path (an import
// path with a trailing "/") are compiled in. compiledIn is that package's
// probe: it reports whether its "probe" marker ran.
func Need(t testing.TB, path string, compiledIn func() bool) {
	t.Helper()
	if err := failpoint.Enable(path+"probe", "return(true)"); err != nil {
		t.Fatal(err)
	}
	defer failpoint.Disable(path + "probe")
	if !compiledIn() {
		t.Skip("failpoints are compiled in only by `make test-failpoints`")
	}
}

// Enable turns the failpoint path+name on with term until t ends.
func Enable(t testing.TB, path, name, term string) {
	t.Helper()
	if err := failpoint.Enable(path+name, term); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { failpoint.Disable(path + name) })
}
