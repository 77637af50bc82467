package auth

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// Why a peer's certificate is refused.
var (
	ErrNoCertificate = errors.New("no certificate was presented")
	ErrExpired       = errors.New("the certificate has expired or is not valid yet")
	ErrUnknownCA     = errors.New("the certificate is not signed by a trusted CA")
	ErrWrongRole     = errors.New("the certificate's role does not allow this")
)

// Verify checks a certificate chain (leaf first) that a caller presented
// against roots at time now and returns the identity it proves, with the
// fingerprint of the CA it chains to.
func Verify(chain []*x509.Certificate, roots *x509.CertPool, now time.Time) (Identity, error) {
	id, _, err := verify(chain, roots, now, x509.ExtKeyUsageClientAuth)
	return id, err
}

// validity is the time a verified chain stays valid in: the intersection
// of its certificates' validity periods.
type validity struct{ notBefore, notAfter time.Time }

func (v validity) covers(now time.Time) bool {
	return !now.Before(v.notBefore) && !now.After(v.notAfter)
}

// verify checks chain for usage: client authentication for a caller's
// certificate, server authentication for the certificate of a server
// dialled. A certificate that names no extended key usage serves both.
func verify(chain []*x509.Certificate, roots *x509.CertPool, now time.Time, usage x509.ExtKeyUsage) (Identity, validity, error) {
	if len(chain) == 0 {
		return Identity{}, validity{}, ErrNoCertificate
	}
	leaf := chain[0]
	if now.After(leaf.NotAfter) || now.Before(leaf.NotBefore) {
		return Identity{}, validity{}, ErrExpired
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	chains, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{usage}})
	if invalid := (x509.CertificateInvalidError{}); errors.As(err, &invalid) && invalid.Reason == x509.IncompatibleUsage {
		what := "client"
		if usage == x509.ExtKeyUsageServerAuth {
			what = "server"
		}
		return Identity{}, validity{}, fmt.Errorf("%w: the certificate is not for %s authentication (extended key usage)", ErrWrongRole, what)
	}
	// A CA certificate that signed the chain but is outside its validity
	// period comes back as such (the certificate itself was checked
	// above): the chain is refused for the time, not for its signer, when
	// that CA is trusted. One that leads to no trusted CA, such as an
	// expired CA certificate a caller presents with its own, leaves the
	// chain untrusted, whatever its dates.
	if invalid := (x509.CertificateInvalidError{}); errors.As(err, &invalid) && invalid.Reason == x509.Expired &&
		trustedOutOfTime(invalid.Cert, roots, inter, now) {
		return Identity{}, validity{}, fmt.Errorf("%w: a CA certificate of its chain: %v", ErrExpired, err)
	}
	if err != nil {
		return Identity{}, validity{}, fmt.Errorf("%w: %v", ErrUnknownCA, err)
	}
	id, err := IdentityOf(leaf)
	if err != nil {
		return Identity{}, validity{}, fmt.Errorf("%w: %v", ErrWrongRole, err)
	}
	if id.Role == RoleCA {
		return Identity{}, validity{}, fmt.Errorf("%w: a CA certificate is not a peer", ErrWrongRole)
	}
	v := validity{notBefore: leaf.NotBefore, notAfter: leaf.NotAfter}
	for _, c := range chains[0][1:] {
		if c.NotBefore.After(v.notBefore) {
			v.notBefore = c.NotBefore
		}
		if c.NotAfter.Before(v.notAfter) {
			v.notAfter = c.NotAfter
		}
	}
	root := chains[0][len(chains[0])-1]
	id.CA = Fingerprint(root)
	return id, v, nil
}

// trustedOutOfTime tells whether ca, a CA certificate outside its validity
// period at now, is one of roots or chains to them (through inter) at a time
// it is valid, its issuers' own validity judged the same way.
func trustedOutOfTime(ca *x509.Certificate, roots, inter *x509.CertPool, now time.Time) bool {
	for range 8 { // a chain's length, at most
		at := now
		if at.Before(ca.NotBefore) {
			at = ca.NotBefore
		}
		if at.After(ca.NotAfter) {
			at = ca.NotAfter
		}
		_, err := ca.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: at,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
		invalid := x509.CertificateInvalidError{}
		switch {
		case err == nil:
			return true
		case errors.As(err, &invalid) && invalid.Reason == x509.Expired && invalid.Cert != nil && !invalid.Cert.Equal(ca):
			ca = invalid.Cert // its issuer is out of time then: judged at a time it is valid
		default:
			return false
		}
	}
	return false
}

// Source serves a node's TLS material from its bundle file. Reload reads
// the file again; connections made afterwards use the new certificate, and
// peers are verified against the new CA certificates.
type Source struct {
	path    string
	current atomic.Pointer[Bundle]
	node    atomic.Pointer[string] // the node id the server runs as, once known
}

// RunAs tells the source the node id its server runs as: a reloaded bundle
// bound to another node is refused, as one is at start, since peers would
// refuse the node's Raft under its own id.
func (s *Source) RunAs(id string) { s.node.Store(&id) }

// OpenSource loads the bundle at path.
func OpenSource(path string) (*Source, error) {
	s := &Source{path: path}
	if err := s.Reload(); err != nil {
		return nil, err
	}
	return s, nil
}

// NewStaticSource serves b (tests, and bundles held in memory).
func NewStaticSource(b *Bundle) *Source {
	s := &Source{}
	s.current.Store(b)
	return s
}

// Path is the bundle file the source reloads.
func (s *Source) Path() string { return s.path }

// Reload reads the bundle file again. A file that does not hold a server
// bundle leaves the current one in place.
func (s *Source) Reload() error {
	if s.path == "" {
		return nil
	}
	b, err := LoadBundle(s.path)
	if err != nil {
		return err
	}
	id, err := IdentityOf(b.Cert)
	if err != nil {
		return fmt.Errorf("%w (%s)", err, s.path)
	}
	if id.Role != RoleServer {
		return fmt.Errorf("auth: %s holds a %s certificate, not a server's", s.path, id.Role)
	}
	if runs := s.node.Load(); runs != nil && id.Node != "" && id.Node != *runs {
		return fmt.Errorf("auth: %s holds node %q's certificate, but this server is node %q", s.path, id.Node, *runs)
	}
	// A certificate the bundle's own CAs do not vouch for, or one outside
	// its validity, would lock the node out of its cluster.
	if _, err := b.Cert.Verify(x509.VerifyOptions{Roots: b.Roots(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return fmt.Errorf("auth: %s: the certificate does not verify against the bundle's CA: %w", s.path, err)
	}
	s.current.Store(b)
	return nil
}

// Bundle is the current bundle.
func (s *Source) Bundle() *Bundle { return s.current.Load() }

func (s *Source) certificate() (*tls.Certificate, error) {
	c := s.Bundle().TLSCertificate()
	return &c, nil
}

// APIConfig is the TLS configuration of the HTTP API: it presents the
// node's certificate and asks for, without requiring, a client
// certificate, which the API verifies per endpoint (so that probes work
// without one and refusals are answered with an error code).
func (s *Source) APIConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, ClientAuth: tls.RequestClientCert,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return s.certificate() }}
}

// verifyServer returns a check that accepts only a server certificate of
// the current CA, for usage (client authentication: the peer dialled this
// node; server authentication: this node dialled it). It is the
// configurations' VerifyConnection, which crypto/tls also calls when a
// session is resumed (VerifyPeerCertificate is not): a TLS session a peer
// was given before its CA was dropped does not let it back in.
func (s *Source) verifyServer(usage x509.ExtKeyUsage) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		id, _, err := verify(cs.PeerCertificates, s.Bundle().Roots(), time.Now(), usage)
		if err != nil {
			return err
		}
		if id.Role != RoleServer {
			return fmt.Errorf("%w: a %s certificate is not a server's", ErrWrongRole, id.Role)
		}
		return nil
	}
}

// PeerServerConfig is the TLS configuration a node accepts its peers'
// connections with (Raft, forwarding, member RPCs): both sides present
// server certificates of the same CA.
func (s *Source) PeerServerConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, ClientAuth: tls.RequireAnyClientCert,
		GetCertificate:   func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return s.certificate() },
		VerifyConnection: s.verifyServer(x509.ExtKeyUsageClientAuth)}
}

// PeerClientConfig is the TLS configuration a node dials its peers with.
// Peers are known by their Raft address, not a host name in their
// certificate: what is checked is that they hold a server certificate of
// the same CA.
func (s *Source) PeerClientConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: true, //nolint:gosec // verified below
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return s.certificate() },
		VerifyConnection:     s.verifyServer(x509.ExtKeyUsageServerAuth)}
}

// PeerNode is the node id the certificate a peer presented on cs is bound
// to ("": the certificate names none).
func (s *Source) PeerNode(cs tls.ConnectionState) string {
	if len(cs.PeerCertificates) == 0 {
		return ""
	}
	id, err := IdentityOf(cs.PeerCertificates[0])
	if err != nil {
		return ""
	}
	return id.Node
}

// Node is the node id the bundle's certificate is bound to ("": none).
func (s *Source) Node() string {
	id, err := IdentityOf(s.Bundle().Cert)
	if err != nil {
		return ""
	}
	return id.Node
}

// ClientConfig is the TLS configuration an API client dials with bundle b:
// it presents b's certificate and checks the server's against b's CA and
// the host name dialed.
func ClientConfig(b *Bundle) *tls.Config {
	cert := b.TLSCertificate()
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: b.Roots(), Certificates: []tls.Certificate{cert}}
}
