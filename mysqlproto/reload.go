package mysqlproto

import (
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrNoClientTLS is returned by SetClientCertificate on a Server started
// without Config.ClientTLS: whether CLIENT_SSL is offered is fixed at start.
var ErrNoClientTLS = errors.New("mysqlproto: client TLS is off (no Config.ClientTLS); it cannot be turned on while serving")

// The settings below may change while the server serves (rgproxy's
// SIGHUP). Each takes effect for what starts after the call; what runs
// already keeps what it started with.

// SetMaxConnections changes Config.MaxConnections (0: derived from the
// file-descriptor limit, as at start). Lowering it closes no session: new
// clients get ERR 1040 until fewer than the limit remain.
func (s *Server) SetMaxConnections(n int) error {
	if n < 0 {
		return fmt.Errorf("mysqlproto: MaxConnections %d is negative", n)
	}
	s.maxConns.Store(int64(effectiveMaxConnections(n)))
	return nil
}

// MaxConnections is the limit in force; 0 = unlimited (no descriptor
// limit is known).
func (s *Server) MaxConnections() int { return int(s.maxConns.Load()) }

// SetClientCertificate replaces the certificate offered to clients that
// upgrade to TLS from now on; sessions already under TLS keep the one they
// shook hands with.
func (s *Server) SetClientCertificate(cert tls.Certificate) error {
	if s.cfg.ClientTLS == nil {
		return ErrNoClientTLS
	}
	if len(cert.Certificate) == 0 || cert.PrivateKey == nil {
		return errors.New("mysqlproto: client TLS certificate without certificate or key")
	}
	s.clientCert.Store(&cert)
	s.certGen.Add(1)
	return nil
}

// reloadableTLS returns a copy of c whose certificate is the one last given
// to SetClientCertificate, else c's own (its GetCertificate, then its
// Certificates, chosen as crypto/tls chooses). tls.Server asks
// GetCertificate at every full handshake (crypto/tls skips it when
// Certificates is set and the client sends no SNI, hence Certificates
// moves into the callback), so a new certificate reaches new sessions
// without touching running ones. A session ticket issued under an earlier
// certificate is not resumed (see ticketsForThisCertificate).
func (s *Server) reloadableTLS(c *tls.Config) *tls.Config {
	c = c.Clone()
	if c.WrapSession == nil && c.UnwrapSession == nil {
		s.ticketsForThisCertificate(c)
	}
	own, certs := c.GetCertificate, c.Certificates
	c.Certificates = nil
	c.GetCertificate = func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
		if cert := s.clientCert.Load(); cert != nil {
			return cert, nil
		}
		if own != nil {
			if cert, err := own(hello); cert != nil || err != nil {
				return cert, err
			}
		}
		if len(certs) == 0 {
			return nil, errors.New("mysqlproto: no client TLS certificate")
		}
		for i := range certs {
			if len(certs) > 1 && hello.SupportsCertificate(&certs[i]) == nil {
				return &certs[i], nil
			}
		}
		return &certs[0], nil
	}
	return c
}

// certGenTag starts the SessionState.Extra entry that names the
// certificate generation a session ticket was issued under.
var certGenTag = []byte("rgproxy-cert-gen/1:")

// ticketsForThisCertificate makes c's session tickets carry the
// certificate generation (SetClientCertificate's count) and refuses to
// resume one from another generation: that client then does a full
// handshake and sees the new certificate, as a client without a ticket
// does. Tickets stay encrypted with c's own, automatically rotated keys.
func (s *Server) ticketsForThisCertificate(c *tls.Config) {
	c.WrapSession = func(cs tls.ConnectionState, ss *tls.SessionState) ([]byte, error) {
		ss.Extra = append(ss.Extra, binary.BigEndian.AppendUint64(bytes.Clone(certGenTag), s.certGen.Load()))
		return c.EncryptTicket(cs, ss)
	}
	c.UnwrapSession = func(identity []byte, cs tls.ConnectionState) (*tls.SessionState, error) {
		ss, err := c.DecryptTicket(identity, cs)
		if ss == nil || err != nil {
			return ss, err
		}
		for _, e := range ss.Extra {
			if g, ok := bytes.CutPrefix(e, certGenTag); ok && len(g) == 8 {
				if binary.BigEndian.Uint64(g) == s.certGen.Load() {
					return ss, nil
				}
				break
			}
		}
		return nil, nil // not resumed: a full handshake follows
	}
}
