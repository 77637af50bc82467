package auth

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// ErrRevoked: the certificate's serial is on the island's denylist.
var ErrRevoked = errors.New("the certificate has been revoked")

// Lists are the island's replicated access lists, as a Checker reads them.
type Lists interface {
	// AuthGeneration changes whenever the lists may have changed.
	AuthGeneration() uint64
	// AccessLists returns the revoked serials and the DER certificates of
	// the CAs trusted besides the island's own.
	AccessLists() (revoked []string, trusted [][]byte, err error)
}

// Checker verifies the certificates callers present: against the island's
// own CA (from the node's bundle, so a reload takes effect at once) and,
// where the caller allows it, the CAs on the trust list; and against the
// denylist. The lists are cached and reloaded when their generation moves.
type Checker struct {
	src   *Source
	lists Lists

	mu      sync.Mutex
	gen     uint64
	loaded  bool
	revoked map[string]bool
	trusted *x509.CertPool

	// verified remembers the chains verified since the lists or the
	// node's bundle last changed: a client sends its chain with every
	// request over one connection, and checking its signatures again each
	// time would cost more than the request.
	verifiedMu sync.Mutex
	verified   map[verifiedKey]verifiedChain
}

// maxVerified bounds the verified chains remembered; when full, the memory
// starts over.
const maxVerified = 4096

type verifiedKey struct {
	chain   [sha256.Size]byte
	foreign bool
	usage   x509.ExtKeyUsage
}

type verifiedChain struct {
	id     Identity
	valid  validity
	bundle *Bundle // the node's bundle the chain was verified against
	gen    uint64  // the lists' generation it was verified with
}

// NewChecker checks against src's CA and lists (nil: no lists).
func NewChecker(src *Source, lists Lists) *Checker { return &Checker{src: src, lists: lists} }

// current returns the cached lists and their generation, reloading them
// when they changed.
func (c *Checker) current() (map[string]bool, *x509.CertPool, uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lists == nil {
		return nil, x509.NewCertPool(), 0, nil
	}
	gen := c.lists.AuthGeneration()
	if c.loaded && gen == c.gen {
		return c.revoked, c.trusted, gen, nil
	}
	revoked, trusted, err := c.lists.AccessLists()
	if err != nil {
		return nil, nil, 0, fmt.Errorf("auth: read access lists: %w", err)
	}
	c.revoked = make(map[string]bool, len(revoked))
	for _, s := range revoked {
		c.revoked[s] = true
	}
	c.trusted = x509.NewCertPool()
	for _, der := range trusted {
		if cert, err := x509.ParseCertificate(der); err == nil {
			c.trusted.AddCert(cert)
		}
	}
	c.gen, c.loaded = gen, true
	return c.revoked, c.trusted, gen, nil
}

// Check returns the identity that chain, presented by a caller, proves at
// now. With foreign set, a chain to a CA on the trust list is accepted too
// (Identity.Foreign).
func (c *Checker) Check(chain []*x509.Certificate, foreign bool, now time.Time) (Identity, error) {
	return c.check(chain, foreign, now, x509.ExtKeyUsageClientAuth)
}

// check is Check for usage (see verify).
func (c *Checker) check(chain []*x509.Certificate, foreign bool, now time.Time, usage x509.ExtKeyUsage) (Identity, error) {
	revoked, trusted, gen, err := c.current()
	if err != nil {
		return Identity{}, err
	}
	if len(chain) == 0 {
		return Identity{}, ErrNoCertificate
	}
	bundle := c.src.Bundle()
	key := verifiedKey{chain: chainDigest(chain), foreign: foreign, usage: usage}
	c.verifiedMu.Lock()
	v, ok := c.verified[key]
	c.verifiedMu.Unlock()
	if !ok || v.bundle != bundle || v.gen != gen || !v.valid.covers(now) {
		id, valid, err := verify(chain, bundle.Roots(), now, usage)
		if errors.Is(err, ErrUnknownCA) && foreign {
			if id, valid, err = verify(chain, trusted, now, usage); err == nil {
				id.Foreign = true
			}
		}
		if err != nil {
			return Identity{}, err
		}
		v = verifiedChain{id: id, valid: valid, bundle: bundle, gen: gen}
		c.verifiedMu.Lock()
		if c.verified == nil || len(c.verified) >= maxVerified {
			c.verified = make(map[verifiedKey]verifiedChain)
		}
		c.verified[key] = v
		c.verifiedMu.Unlock()
	}
	if revoked[v.id.Serial] {
		return Identity{}, fmt.Errorf("%w: serial %s", ErrRevoked, v.id.Serial)
	}
	return v.id, nil
}

// chainDigest identifies a presented chain.
func chainDigest(chain []*x509.Certificate) [sha256.Size]byte {
	h := sha256.New()
	for _, c := range chain {
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(len(c.Raw)))
		h.Write(n[:])
		h.Write(c.Raw)
	}
	var out [sha256.Size]byte
	h.Sum(out[:0])
	return out
}

// TrustedCAs returns the CAs on the trust list.
func (c *Checker) TrustedCAs() (*x509.CertPool, error) {
	_, trusted, _, err := c.current()
	return trusted, err
}

// PeerHTTPConfig is the TLS configuration a node calls other nodes' and
// islands' HTTP APIs at host (a DNS name or an IP address) with: it
// presents the node's server certificate and accepts a server certificate
// for host, issued by the island's CA or one on the trust list. The host
// is given rather than read from the handshake because a peer dialed by
// IP address is not named in the handshake (no SNI).
func (c *Checker) PeerHTTPConfig(host string) *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, ServerName: host, InsecureSkipVerify: true, //nolint:gosec // verified below
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return c.src.certificate() },
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return ErrNoCertificate
			}
			leaf := cs.PeerCertificates[0]
			if err := leaf.VerifyHostname(host); err != nil {
				return fmt.Errorf("auth: %w", err)
			}
			return c.checkPeer(cs.PeerCertificates)
		}}
}

// checkPeer checks the chain a peer's server presented against the
// island's CA, the trust list and the denylist as they are now.
func (c *Checker) checkPeer(chain []*x509.Certificate) error {
	id, err := c.check(chain, true, time.Now(), x509.ExtKeyUsageServerAuth)
	if err != nil {
		return err
	}
	if id.Role != RoleServer {
		return fmt.Errorf("%w: a %s certificate is not a server's", ErrWrongRole, id.Role)
	}
	return nil
}

// DialPeer connects to a peer's HTTP API at addr (host:port) over TLS
// with PeerHTTPConfig; it is an http.Transport's DialTLSContext. The
// connection checks the peer's chain again before it sends anything once
// the access lists have changed since it was checked, so that a CA taken
// off the trust list (or a revoked serial) is refused on connections kept
// open from before as on new ones.
func (c *Checker) DialPeer(ctx context.Context, network, addr string) (net.Conn, error) {
	return c.DialPeerOver(nil)(ctx, network, addr)
}

// peerDialTimeout bounds a peer connection, its TLS handshake included.
var peerDialTimeout = 10 * time.Second

// DialPeerOver is DialPeer running its handshake over the connections
// dial opens (nil: TCP), for a network that is not the host's (tests
// inject faults there).
func (c *Checker) DialPeerOver(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	if dial == nil {
		dial = (&net.Dialer{KeepAlive: 30 * time.Second}).DialContext
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		// The connection and its handshake together: a peer that accepts
		// but never answers (a stopped process) does not hold the dial,
		// whose context (an http.Transport's) has no deadline of its own.
		ctx, cancel := context.WithTimeout(ctx, peerDialTimeout)
		defer cancel()
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, fmt.Errorf("auth: peer address %q: %w", addr, err)
		}
		// The generation read before the handshake: lists that change
		// during it are checked again at the first write.
		_, _, gen, err := c.current()
		if err != nil {
			return nil, err
		}
		raw, err := dial(ctx, network, addr)
		if err != nil {
			return nil, fmt.Errorf("auth: %w", err)
		}
		tc := tls.Client(raw, c.PeerHTTPConfig(host))
		if err := tc.HandshakeContext(ctx); err != nil {
			_ = raw.Close()
			return nil, fmt.Errorf("auth: %w", err)
		}
		return &peerConn{Conn: tc, c: c, chain: tc.ConnectionState().PeerCertificates, gen: gen}, nil
	}
}

// peerConn is a connection to a peer's API whose chain was accepted under
// the access lists of generation gen.
type peerConn struct {
	net.Conn
	c     *Checker
	chain []*x509.Certificate

	mu  sync.Mutex
	gen uint64
}

// Write sends b once the peer's chain is accepted under the current access
// lists; a chain they refuse closes the connection with nothing sent (an
// http.Transport then dials again, which the handshake refuses).
func (p *peerConn) Write(b []byte) (int, error) {
	if err := p.recheck(); err != nil {
		_ = p.Conn.Close()
		return 0, fmt.Errorf("auth: the peer is no longer accepted: %w", err)
	}
	return p.Conn.Write(b)
}

func (p *peerConn) recheck() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, _, gen, err := p.c.current()
	if err != nil || gen == p.gen {
		return err
	}
	if err := p.c.checkPeer(p.chain); err != nil {
		return err
	}
	p.gen = gen
	return nil
}
