package auth

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// fakeLists are access lists held in memory; calls counts the reloads.
type fakeLists struct {
	mu      sync.Mutex
	gen     uint64
	revoked []string
	trusted [][]byte
	err     error
	calls   int
}

func (f *fakeLists) AuthGeneration() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.gen
}

func (f *fakeLists) AccessLists() ([]string, [][]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	return append([]string(nil), f.revoked...), append([][]byte(nil), f.trusted...), f.err
}

// set replaces the lists; bump moves the generation as the state machine
// does when it applies a change.
func (f *fakeLists) set(revoked []string, trusted [][]byte, bump bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.revoked, f.trusted = revoked, trusted
	if bump {
		f.gen++
	}
}

func (f *fakeLists) reloads() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

func chain(b *Bundle) []*x509.Certificate { return []*x509.Certificate{b.Cert} }

func TestCheckerOwnAndTrustedCAs(t *testing.T) {
	own, foreign, stranger := mustCA(t), mustCA(t), mustCA(t)
	node := NewStaticSource(mustIssue(t, own, RoleServer, IssueOptions{Name: "node"}))
	lists := &fakeLists{trusted: [][]byte{foreign.Cert.Raw}}
	c := NewChecker(node, lists)
	now := time.Now()

	cl := mustIssue(t, own, RoleClient, IssueOptions{Name: "app", Perms: []Perm{{Namespace: "orders", Write: true}}})
	foreignSrv := mustIssue(t, foreign, RoleServer, IssueOptions{Name: "island-b"})
	strangerSrv := mustIssue(t, stranger, RoleServer, IssueOptions{Name: "island-x"})
	expired := mustIssue(t, own, RoleClient, IssueOptions{Name: "old", NotBefore: now.Add(-2 * time.Hour), Validity: time.Hour})
	notYet := mustIssue(t, own, RoleClient, IssueOptions{Name: "early", NotBefore: now.Add(time.Hour), Validity: time.Hour})
	foreignExpired := mustIssue(t, foreign, RoleServer, IssueOptions{Name: "old-b", NotBefore: now.Add(-2 * time.Hour), Validity: time.Hour})

	for _, tc := range []struct {
		name        string
		chain       []*x509.Certificate
		foreign     bool
		wantErr     error
		wantForeign bool
	}{
		{name: "own CA", chain: chain(cl)},
		{name: "own CA where foreign CAs are allowed", chain: chain(cl), foreign: true},
		{name: "trusted foreign CA where only the own CA is", chain: chain(foreignSrv), wantErr: ErrUnknownCA},
		{name: "trusted foreign CA where foreign CAs are allowed", chain: chain(foreignSrv), foreign: true, wantForeign: true},
		{name: "untrusted CA", chain: chain(strangerSrv), foreign: true, wantErr: ErrUnknownCA},
		{name: "no certificate", chain: nil, foreign: true, wantErr: ErrNoCertificate},
		{name: "expired", chain: chain(expired), wantErr: ErrExpired},
		{name: "not valid yet", chain: chain(notYet), wantErr: ErrExpired},
		{name: "expired, of a trusted foreign CA", chain: chain(foreignExpired), foreign: true, wantErr: ErrExpired},
		{name: "a CA certificate", chain: chain(own), wantErr: ErrWrongRole},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, err := c.Check(tc.chain, tc.foreign, now)
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Fatalf("Check: %v, want %v", err, tc.wantErr)
			}
			if err == nil && id.Foreign != tc.wantForeign {
				t.Fatalf("Foreign = %v, want %v", id.Foreign, tc.wantForeign)
			}
		})
	}
	id, err := c.Check(chain(cl), false, now)
	if err != nil || id.Role != RoleClient || id.Name != "app" || id.CA != Fingerprint(own.Cert) ||
		id.Serial != SerialOf(cl.Cert) || !id.Allows("orders", true) || id.Allows("billing", false) {
		t.Fatalf("client identity: %+v %v", id, err)
	}
	id, err = c.Check(chain(foreignSrv), true, now)
	if err != nil || id.CA != Fingerprint(foreign.Cert) || id.Role != RoleServer {
		t.Fatalf("foreign identity: %+v %v", id, err)
	}
}

func TestCheckerRevocations(t *testing.T) {
	own, foreign := mustCA(t), mustCA(t)
	lists := &fakeLists{trusted: [][]byte{foreign.Cert.Raw}}
	c := NewChecker(NewStaticSource(mustIssue(t, own, RoleServer, IssueOptions{Name: "node"})), lists)
	cl := mustIssue(t, own, RoleClient, IssueOptions{Name: "app"})
	other := mustIssue(t, own, RoleClient, IssueOptions{Name: "other"})
	foreignSrv := mustIssue(t, foreign, RoleServer, IssueOptions{Name: "island-b"})
	now := time.Now()
	for _, b := range []*Bundle{cl, other} {
		if _, err := c.Check(chain(b), false, now); err != nil {
			t.Fatalf("before revocation: %v", err)
		}
	}
	lists.set([]string{SerialOf(cl.Cert), SerialOf(foreignSrv.Cert)}, [][]byte{foreign.Cert.Raw}, true)
	if _, err := c.Check(chain(cl), false, now); !errors.Is(err, ErrRevoked) {
		t.Fatalf("revoked client: %v", err)
	}
	if _, err := c.Check(chain(foreignSrv), true, now); !errors.Is(err, ErrRevoked) {
		t.Fatalf("revoked server of a trusted CA: %v", err)
	}
	if _, err := c.Check(chain(other), false, now); err != nil {
		t.Fatalf("a revocation refused another serial: %v", err)
	}
}

// The lists are read once per generation: a change is seen as soon as the
// generation moves, and not before.
func TestCheckerReloadsListsWhenTheGenerationMoves(t *testing.T) {
	own := mustCA(t)
	lists := &fakeLists{gen: 7}
	c := NewChecker(NewStaticSource(mustIssue(t, own, RoleServer, IssueOptions{Name: "node"})), lists)
	cl := mustIssue(t, own, RoleClient, IssueOptions{Name: "app"})
	now := time.Now()
	for range 5 {
		if _, err := c.Check(chain(cl), false, now); err != nil {
			t.Fatal(err)
		}
	}
	if n := lists.reloads(); n != 1 {
		t.Fatalf("lists read %d times for one generation, want 1", n)
	}
	lists.set([]string{SerialOf(cl.Cert)}, nil, false)
	if _, err := c.Check(chain(cl), false, now); err != nil {
		t.Fatalf("the cached lists were not used: %v", err)
	}
	lists.set([]string{SerialOf(cl.Cert)}, nil, true)
	if _, err := c.Check(chain(cl), false, now); !errors.Is(err, ErrRevoked) {
		t.Fatalf("after the generation moved: %v", err)
	}
	if n := lists.reloads(); n != 2 {
		t.Fatalf("lists read %d times over two generations, want 2", n)
	}
	// Unrevoking (a restore to an earlier state) takes effect the same way.
	lists.set(nil, nil, true)
	if _, err := c.Check(chain(cl), false, now); err != nil {
		t.Fatalf("after the revocation was dropped: %v", err)
	}
	// Lists that cannot be read refuse everyone, and are read again on
	// the next check.
	lists.mu.Lock()
	lists.err, lists.gen = errors.New("disk on fire"), lists.gen+1
	lists.mu.Unlock()
	if _, err := c.Check(chain(cl), false, now); err == nil {
		t.Fatal("a check passed without the lists")
	}
	lists.mu.Lock()
	lists.err = nil
	lists.mu.Unlock()
	if _, err := c.Check(chain(cl), false, now); err != nil {
		t.Fatalf("after the lists came back: %v", err)
	}
}

func TestCheckerWithoutLists(t *testing.T) {
	own, foreign := mustCA(t), mustCA(t)
	c := NewChecker(NewStaticSource(mustIssue(t, own, RoleServer, IssueOptions{Name: "node"})), nil)
	if _, err := c.Check(chain(mustIssue(t, own, RoleClient, IssueOptions{Name: "app"})), true, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Check(chain(mustIssue(t, foreign, RoleServer, IssueOptions{Name: "b"})), true, time.Now()); !errors.Is(err, ErrUnknownCA) {
		t.Fatalf("foreign CA without a trust list: %v", err)
	}
}

// The island's own CA is the one of the node's current bundle: after the
// bundle is replaced by one of a new CA and reloaded, the old CA's
// certificates are refused.
func TestCheckerFollowsTheReloadedCA(t *testing.T) {
	oldCA, newCA := mustCA(t), mustCA(t)
	path := filepath.Join(t.TempDir(), "server.pem")
	if err := mustIssue(t, oldCA, RoleServer, IssueOptions{Name: "node"}).WriteFile(path); err != nil {
		t.Fatal(err)
	}
	src, err := OpenSource(path)
	if err != nil {
		t.Fatal(err)
	}
	c := NewChecker(src, &fakeLists{})
	oldClient := mustIssue(t, oldCA, RoleClient, IssueOptions{Name: "app"})
	newClient := mustIssue(t, newCA, RoleClient, IssueOptions{Name: "app"})
	if _, err := c.Check(chain(oldClient), false, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := mustIssue(t, newCA, RoleServer, IssueOptions{Name: "node"}).WriteFile(path); err != nil {
		t.Fatal(err)
	}
	if err := src.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Check(chain(oldClient), false, time.Now()); !errors.Is(err, ErrUnknownCA) {
		t.Fatalf("old CA after the reload: %v", err)
	}
	if _, err := c.Check(chain(newClient), false, time.Now()); err != nil {
		t.Fatalf("new CA after the reload: %v", err)
	}
}

// peerAPI is an HTTPS server presenting cert that answers with the serial
// of the client certificate it was shown.
func peerAPI(t *testing.T, cert *Bundle) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{MinVersion: tls.VersionTLS12,
		Certificates: []tls.Certificate{cert.TLSCertificate()}, ClientAuth: tls.RequestClientCert})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, ErrorLog: log.New(io.Discard, "", 0),
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if len(r.TLS.PeerCertificates) > 0 {
				_, _ = io.WriteString(w, SerialOf(r.TLS.PeerCertificates[0]))
			}
		})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
	return "https://" + ln.Addr().String()
}

// The client a node calls other nodes' and islands' APIs with accepts only
// server certificates, for the host dialed, of its CA or a trusted one,
// and presents the node's own certificate.
func TestPeerHTTPConfig(t *testing.T) {
	own, foreign, stranger := mustCA(t), mustCA(t), mustCA(t)
	nodeCert := mustIssue(t, own, RoleServer, IssueOptions{Name: "node"})
	lists := &fakeLists{trusted: [][]byte{foreign.Cert.Raw}}
	c := NewChecker(NewStaticSource(nodeCert), lists)
	loopback := []string{"127.0.0.1", "localhost"}
	revoked := mustIssue(t, own, RoleServer, IssueOptions{Name: "revoked", Hosts: loopback})
	lists.set([]string{SerialOf(revoked.Cert)}, [][]byte{foreign.Cert.Raw}, true)

	for _, tc := range []struct {
		name   string
		server *Bundle
		host   string // dial this host instead of 127.0.0.1
		ok     bool
	}{
		{name: "server of the own CA", server: mustIssue(t, own, RoleServer, IssueOptions{Name: "peer", Hosts: loopback}), ok: true},
		{name: "server of the own CA, by name", server: mustIssue(t, own, RoleServer, IssueOptions{Name: "peer", Hosts: loopback}), host: "localhost", ok: true},
		{name: "server of a trusted CA", server: mustIssue(t, foreign, RoleServer, IssueOptions{Name: "island-b", Hosts: loopback}), ok: true},
		{name: "server of an untrusted CA", server: mustIssue(t, stranger, RoleServer, IssueOptions{Name: "island-x", Hosts: loopback})},
		{name: "server certificate for another host", server: mustIssue(t, own, RoleServer, IssueOptions{Name: "elsewhere", Hosts: []string{"10.9.8.7", "elsewhere.example"}})},
		{name: "server certificate for another host, by name", server: mustIssue(t, own, RoleServer, IssueOptions{Name: "elsewhere", Hosts: []string{"elsewhere.example"}}), host: "localhost"},
		{name: "client certificate", server: mustIssue(t, own, RoleClient, IssueOptions{Name: "app"})},
		{name: "tcclient certificate", server: mustIssue(t, own, RoleTCClient, IssueOptions{Name: "tc"})},
		{name: "revoked server", server: revoked},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := peerAPI(t, tc.server)
			if tc.host != "" {
				_, port, _ := net.SplitHostPort(url[len("https://"):])
				url = "https://" + net.JoinHostPort(tc.host, port)
			}
			tr := &http.Transport{DialTLSContext: c.DialPeer}
			defer tr.CloseIdleConnections()
			resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get(url)
			if !tc.ok {
				if err == nil {
					resp.Body.Close()
					t.Fatal("the peer was accepted")
				}
				return
			}
			if err != nil {
				t.Fatalf("the peer was refused: %v", err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if string(body) != SerialOf(nodeCert.Cert) {
				t.Fatalf("the peer saw client certificate %q, want the node's %s", body, SerialOf(nodeCert.Cert))
			}
		})
	}
}

// A chain verified once is remembered, but never past its validity: the
// same chain checked after the certificate expired is refused.
func TestCheckerRemembersChainsOnlyWhileValid(t *testing.T) {
	own := mustCA(t)
	c := NewChecker(NewStaticSource(mustIssue(t, own, RoleServer, IssueOptions{Name: "node"})), &fakeLists{})
	now := time.Now()
	cl := mustIssue(t, own, RoleClient, IssueOptions{Name: "app", NotBefore: now.Add(-time.Minute), Validity: time.Hour})
	for range 3 {
		if _, err := c.Check(chain(cl), false, now); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Check(chain(cl), false, now.Add(2*time.Hour)); !errors.Is(err, ErrExpired) {
		t.Fatalf("an expired certificate, verified before: %v", err)
	}
	if _, err := c.Check(chain(cl), false, now.Add(-time.Hour)); !errors.Is(err, ErrExpired) {
		t.Fatalf("a certificate not valid yet, verified before: %v", err)
	}
	// A foreign check of a chain first seen as an own one is its own entry.
	id, err := c.Check(chain(cl), true, now)
	if err != nil || id.Foreign {
		t.Fatalf("own chain checked with foreign allowed: %+v %v", id, err)
	}
}

// BenchmarkCheck is the cost of checking the chain a client presents with
// every request over one connection.
func BenchmarkCheck(b *testing.B) {
	own, err := NewCA(IssueOptions{})
	if err != nil {
		b.Fatal(err)
	}
	srv, _ := own.Issue(RoleServer, IssueOptions{Name: "node"})
	cl, _ := own.Issue(RoleClient, IssueOptions{Name: "app"})
	c := NewChecker(NewStaticSource(srv), &fakeLists{})
	now := time.Now()
	for b.Loop() {
		if _, err := c.Check(chain(cl), false, now); err != nil {
			b.Fatal(err)
		}
	}
}

// A peer that accepts the connection but never answers the handshake (a
// stopped process) fails the dial once the dial's time is up, instead of
// holding it, and its connection, for as long as the caller's context
// lasts (an http.Transport's has no deadline).
func TestAPeerThatNeverAnswersTheHandshakeFailsTheDial(t *testing.T) {
	old := peerDialTimeout
	peerDialTimeout = 300 * time.Millisecond
	t.Cleanup(func() { peerDialTimeout = old })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { conn.Close() })
		}
	}()
	own := mustCA(t)
	c := NewChecker(NewStaticSource(mustIssue(t, own, RoleServer, IssueOptions{Name: "node"})), nil)
	done := make(chan error, 1)
	go func() {
		conn, err := c.DialPeer(context.Background(), "tcp", ln.Addr().String())
		if conn != nil {
			conn.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the dial of a silent peer succeeded")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the dial of a peer that never answers its handshake is still waiting")
	}
}

// recertify is ca's certificate again, same name and key, valid from
// notBefore to notAfter and signed by parent (itself when nil).
func recertify(t *testing.T, ca, parent *Bundle, notBefore, notAfter time.Time) *x509.Certificate {
	t.Helper()
	if parent == nil {
		parent = ca
	}
	tmpl := *ca.Cert
	tmpl.SerialNumber = big.NewInt(time.Now().UnixNano())
	tmpl.NotBefore, tmpl.NotAfter = notBefore, notAfter
	der, err := x509.CreateCertificate(rand.Reader, &tmpl, parent.Cert, ca.Key.Public(), parent.Key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// A certificate valid itself but whose CA certificate, root or
// intermediate, has expired or is not valid yet, is refused as expired,
// not as signed by an unknown CA.
func TestACertificateOfACAOutOfItsValidityIsRefusedAsExpired(t *testing.T) {
	now := time.Now()
	own, foreign, stranger := mustCA(t), mustCA(t), mustCA(t)
	ownExpired := recertify(t, own, nil, now.Add(-48*time.Hour), now.Add(-time.Hour))
	ownNotYet := recertify(t, own, nil, now.Add(time.Hour), now.Add(48*time.Hour))
	foreignExpired := recertify(t, foreign, nil, now.Add(-48*time.Hour), now.Add(-time.Hour))
	strangerExpired := recertify(t, stranger, nil, now.Add(-48*time.Hour), now.Add(-time.Hour))
	strangerNotYet := recertify(t, stranger, nil, now.Add(time.Hour), now.Add(48*time.Hour))

	// An intermediate CA of the own CA, presented with an expired
	// certificate.
	inter, err := own.Issue(RoleServer, IssueOptions{Name: "intermediate"})
	if err != nil {
		t.Fatal(err)
	}
	inter.Cert = recertify(t, &Bundle{Cert: caTemplate(t, "intermediate", inter.Cert), Key: inter.Key}, own, now.Add(-time.Minute), now.Add(24*time.Hour))
	interExpired := recertify(t, inter, own, now.Add(-48*time.Hour), now.Add(-time.Hour))

	cl := mustIssue(t, own, RoleClient, IssueOptions{Name: "app"})
	viaInter := mustIssue(t, inter, RoleClient, IssueOptions{Name: "app2"})
	foreignSrv := mustIssue(t, foreign, RoleServer, IssueOptions{Name: "island-b"})
	strangerSrv := mustIssue(t, stranger, RoleServer, IssueOptions{Name: "island-x"})

	for _, tc := range []struct {
		name    string
		cas     []*x509.Certificate
		chain   []*x509.Certificate
		foreign bool
		wantErr error
	}{
		{name: "own CA expired", cas: []*x509.Certificate{ownExpired}, chain: chain(cl), wantErr: ErrExpired},
		{name: "own CA not valid yet", cas: []*x509.Certificate{ownNotYet}, chain: chain(cl), wantErr: ErrExpired},
		{name: "intermediate expired", cas: own.CAs, chain: []*x509.Certificate{viaInter.Cert, interExpired}, wantErr: ErrExpired},
		{name: "intermediate valid", cas: own.CAs, chain: []*x509.Certificate{viaInter.Cert, inter.Cert}},
		{name: "trusted foreign CA expired", cas: own.CAs, chain: chain(foreignSrv), foreign: true, wantErr: ErrExpired},
		{name: "unknown CA beside an expired one", cas: []*x509.Certificate{ownExpired}, chain: chain(strangerSrv), foreign: true, wantErr: ErrUnknownCA},
		// A CA certificate out of its validity that leads to no trusted
		// CA leaves the chain untrusted, whatever its dates.
		{name: "unknown CA presented expired", cas: own.CAs, chain: []*x509.Certificate{strangerSrv.Cert, strangerExpired}, wantErr: ErrUnknownCA},
		{name: "unknown CA presented expired to a node trusting others", cas: own.CAs, chain: []*x509.Certificate{strangerSrv.Cert, strangerExpired}, foreign: true, wantErr: ErrUnknownCA},
		{name: "unknown CA presented not valid yet", cas: own.CAs, chain: []*x509.Certificate{strangerSrv.Cert, strangerNotYet}, wantErr: ErrUnknownCA},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := mustIssue(t, own, RoleServer, IssueOptions{Name: "node"})
			node.CAs = tc.cas
			c := NewChecker(NewStaticSource(node), &fakeLists{trusted: [][]byte{foreignExpired.Raw}})
			_, err := c.Check(tc.chain, tc.foreign, now)
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Fatalf("Check: %v, want %v", err, tc.wantErr)
			}
			if !tc.foreign {
				roots := x509.NewCertPool()
				for _, c := range tc.cas {
					roots.AddCert(c)
				}
				if _, err := Verify(tc.chain, roots, now); !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
					t.Fatalf("Verify: %v, want %v", err, tc.wantErr)
				}
			}
		})
	}
}

// caTemplate is cert made a CA named name.
func caTemplate(t *testing.T, name string, cert *x509.Certificate) *x509.Certificate {
	t.Helper()
	c := *cert
	c.Subject.CommonName = name
	c.IsCA, c.BasicConstraintsValid = true, true
	c.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	c.ExtKeyUsage = nil
	c.URIs = []*url.URL{{Scheme: uriScheme, Host: "role", Path: "/" + string(RoleCA)}}
	return &c
}
