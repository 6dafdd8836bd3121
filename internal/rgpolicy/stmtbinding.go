package rgpolicy

import (
	"bytes"

	"github.com/rgproxy/rgproxy/resourcegroup"
	"github.com/rgproxy/rgproxy/sqlscan"
)

// stmtBindingOf turns TiDB's statement binding (CREATE [GLOBAL] BINDING
// FOR stmt USING stmt /*+ RESOURCE_GROUP(g) */, DROP [GLOBAL] BINDING FOR
// stmt [USING stmt]) into the digest binding it stands for: the FOR
// statement's digest, read in the session's mode m as the statement's
// own would be, bound to the hint's group. Of the ways to split the text
// at a USING (resourcegroup.StmtBinding.Splits), the first whose two
// statements have the same digest — the same shape, hints and comments
// aside — is taken, as TiDB requires of them.
func stmtBindingOf(b *resourcegroup.StmtBinding, m sqlscan.Mode) (resourcegroup.Statement, error) {
	for _, sp := range b.Splits() {
		var fs sqlscan.Scan
		_, _, fd := sqlscan.Query([]byte(sp.For), m, nil, &fs, nil, true)
		digest := resourcegroup.FormatDigest(fs.DigestHash)
		if sp.Using == "" {
			return &resourcegroup.DropDigestBinding{Digest: digest}, nil
		}
		var us sqlscan.Scan
		_, _, ud := sqlscan.Query([]byte(sp.Using), m, nil, &us, nil, true)
		if len(fd) == 0 || !bytes.Equal(fd, ud) {
			continue
		}
		if !b.Create {
			return &resourcegroup.DropDigestBinding{Digest: digest}, nil
		}
		g, ok := resourcegroup.HintGroup(us.Hint, m)
		if !ok {
			return nil, resourcegroup.NewInvalid("invalid digest binding: the USING statement carries no /*+ RESOURCE_GROUP(g) */ " +
				"hint after its first keyword; rgproxy's bindings choose a resource group, not a plan " +
				"(or: CREATE RESOURCE GROUP BINDING FOR DIGEST '" + digest + "' TO g)")
		}
		return &resourcegroup.CreateDigestBinding{Digest: digest, Group: g}, nil
	}
	return nil, resourcegroup.NewInvalid("invalid digest binding: the FOR and USING statements are not the same statement " +
		"apart from hints, comments and literals (their digests differ)")
}
