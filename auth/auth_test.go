package auth

import (
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func mustCA(t *testing.T) *Bundle {
	t.Helper()
	ca, err := NewCA(IssueOptions{Name: "test CA"})
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func mustIssue(t *testing.T, ca *Bundle, role Role, o IssueOptions) *Bundle {
	t.Helper()
	b, err := ca.Issue(role, o)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestBundlesRoundTripAndCarryIdentities(t *testing.T) {
	ca := mustCA(t)
	srv := mustIssue(t, ca, RoleServer, IssueOptions{Name: "node1", Hosts: []string{"127.0.0.1", "node1"}})
	cl := mustIssue(t, ca, RoleClient, IssueOptions{Name: "app", Perms: []Perm{{Namespace: "orders", Write: true}, {Namespace: "*"}}})
	dir := t.TempDir()
	for name, b := range map[string]*Bundle{"ca.pem": ca, "server.pem": srv, "client.pem": cl} {
		path := filepath.Join(dir, name)
		if err := b.WriteFile(path); err != nil {
			t.Fatal(err)
		}
		back, err := LoadBundle(path)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !back.Cert.Equal(b.Cert) || len(back.CAs) != 1 || !back.CAs[0].Equal(ca.Cert) {
			t.Fatalf("%s did not round-trip", name)
		}
	}
	if string(srv.GossipKey) != string(ca.GossipKey) || len(ca.GossipKey) != 32 {
		t.Fatal("a server bundle carries its CA's gossip key")
	}
	id, err := cl.Identity()
	if err != nil || id.Role != RoleClient || id.Name != "app" || id.CA != Fingerprint(ca.Cert) {
		t.Fatalf("client identity: %+v %v", id, err)
	}
	for _, c := range []struct {
		ns    string
		write bool
		ok    bool
	}{{"orders", true, true}, {"orders", false, true}, {"other", false, true}, {"other", true, false}} {
		if id.Allows(c.ns, c.write) != c.ok {
			t.Errorf("Allows(%s, write=%v) = %v", c.ns, c.write, !c.ok)
		}
	}
	sid, _ := srv.Identity()
	if sid.Role != RoleServer || !sid.Allows("anything", true) {
		t.Fatalf("server identity: %+v", sid)
	}
}

// A certificate ends no later than its CA, whatever validity it asks for,
// and names each of its hosts once.
func TestIssuedCertificatesEndWithTheirCA(t *testing.T) {
	ca, err := NewCA(IssueOptions{Name: "short CA", Validity: 30 * 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	srv := mustIssue(t, ca, RoleServer, IssueOptions{Name: "node1", Validity: 365 * 24 * time.Hour,
		Hosts: []string{"127.0.0.1", "node1", "127.0.0.1", "node1", "::1"}})
	if srv.Cert.NotAfter.After(ca.Cert.NotAfter) {
		t.Errorf("server certificate ends %v, after its CA (%v)", srv.Cert.NotAfter, ca.Cert.NotAfter)
	}
	if len(srv.Cert.IPAddresses) != 2 || len(srv.Cert.DNSNames) != 1 {
		t.Errorf("hosts %v %v, want each once", srv.Cert.IPAddresses, srv.Cert.DNSNames)
	}
	cl := mustIssue(t, ca, RoleClient, IssueOptions{Name: "app", NotBefore: time.Now(), Validity: 365 * 24 * time.Hour})
	if !cl.Cert.NotAfter.Equal(ca.Cert.NotAfter) {
		t.Errorf("client certificate ends %v, want its CA's end %v", cl.Cert.NotAfter, ca.Cert.NotAfter)
	}
}

func TestParsePerm(t *testing.T) {
	for in, want := range map[string]Perm{
		"orders":                         {Namespace: "orders", Write: true},
		"orders:r":                       {Namespace: "orders"},
		"*:rw":                           {Namespace: "*", Write: true},
		"raftlockd://ns/orders?perm=r":   {Namespace: "orders"},
		"raftlockd://ns/billing?perm=rw": {Namespace: "billing", Write: true},
		"raftlockd://ns/%2A?perm=r":      {Namespace: "*"},
		"Orders:r":                       {Namespace: "orders"},
		"raftlockd://ns/Billing?perm=rw": {Namespace: "billing", Write: true},
	} {
		got, err := ParsePerm(in)
		if err != nil || got != want {
			t.Errorf("%q: %+v %v, want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "orders:x", "raftlockd://ns/orders?perm=w", "raftlockd://role/client", "a/b"} {
		if _, err := ParsePerm(bad); err == nil {
			t.Errorf("%q: want an error", bad)
		}
	}
}

// A certificate issued before namespaces were lower-cased at issue still
// covers its namespace as requests spell it (the server lower-cases them).
func TestPermissionsOfACertificateIgnoreCase(t *testing.T) {
	cl := mustIssue(t, mustCA(t), RoleClient, IssueOptions{Name: "app", Perms: []Perm{{Namespace: "Orders", Write: true}}})
	id, err := cl.Identity()
	if err != nil || !id.Allows("orders", true) || id.Allows("billing", false) {
		t.Fatalf("identity %+v %v: want namespace orders, read-write, only", id, err)
	}
}

func TestVerify(t *testing.T) {
	ca, other := mustCA(t), mustCA(t)
	cl := mustIssue(t, ca, RoleClient, IssueOptions{Name: "app"})
	expired := mustIssue(t, ca, RoleClient, IssueOptions{Name: "old", Validity: time.Millisecond})
	foreign := mustIssue(t, other, RoleClient, IssueOptions{Name: "stranger"})
	roots := ca.Roots()
	if _, err := Verify(nil, roots, time.Now()); !errors.Is(err, ErrNoCertificate) {
		t.Fatalf("no certificate: %v", err)
	}
	if _, err := Verify([]*x509.Certificate{expired.Cert}, roots, time.Now().Add(time.Second)); !errors.Is(err, ErrExpired) {
		t.Fatalf("expired: %v", err)
	}
	if _, err := Verify([]*x509.Certificate{foreign.Cert}, roots, time.Now()); !errors.Is(err, ErrUnknownCA) {
		t.Fatalf("foreign: %v", err)
	}
	if _, err := Verify([]*x509.Certificate{ca.Cert}, roots, time.Now()); !errors.Is(err, ErrWrongRole) {
		t.Fatalf("a CA as a peer: %v", err)
	}
	id, err := Verify([]*x509.Certificate{cl.Cert}, roots, time.Now())
	if err != nil || id.Role != RoleClient || id.CA != Fingerprint(ca.Cert) {
		t.Fatalf("client: %+v %v", id, err)
	}
}

// Peers talk mutual TLS only with server certificates of their CA, and a
// reloaded bundle is used for the next connection.
func TestPeerTLSAndReload(t *testing.T) {
	ca, other := mustCA(t), mustCA(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "server.pem")
	if err := mustIssue(t, ca, RoleServer, IssueOptions{Name: "a"}).WriteFile(path); err != nil {
		t.Fatal(err)
	}
	src, err := OpenSource(path)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", src.PeerServerConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.(*tls.Conn).Handshake()
				_, _ = c.Write([]byte("ok"))
			}()
		}
	}()
	dial := func(s *Source) error {
		c, err := tls.Dial("tcp", ln.Addr().String(), s.PeerClientConfig())
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 2)
		_, err = io.ReadFull(c, buf)
		return err
	}
	if err := dial(NewStaticSource(mustIssue(t, ca, RoleServer, IssueOptions{Name: "b"}))); err != nil {
		t.Fatalf("peer of the same CA: %v", err)
	}
	if err := dial(NewStaticSource(mustIssue(t, other, RoleServer, IssueOptions{Name: "x"}))); err == nil {
		t.Fatal("a peer of another CA got in")
	}
	client := mustIssue(t, ca, RoleClient, IssueOptions{Name: "c"})
	c, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{client.TLSCertificate()}})
	if err == nil {
		buf := make([]byte, 2)
		_, err = io.ReadFull(c, buf)
		c.Close()
	}
	if err == nil {
		t.Fatal("a client certificate got in as a peer")
	}
	// Rotation: the file is replaced, the next handshake presents the new
	// certificate.
	before := src.Bundle().Cert.SerialNumber
	if err := mustIssue(t, ca, RoleServer, IssueOptions{Name: "a"}).WriteFile(path); err != nil {
		t.Fatal(err)
	}
	if err := src.Reload(); err != nil {
		t.Fatal(err)
	}
	conn, err := tls.Dial("tcp", ln.Addr().String(), NewStaticSource(mustIssue(t, ca, RoleServer, IssueOptions{Name: "b"})).PeerClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	got := conn.ConnectionState().PeerCertificates[0].SerialNumber
	conn.Close()
	if got.Cmp(before) == 0 {
		t.Fatal("the reloaded certificate is not served")
	}
	// A client bundle is refused as a node's bundle.
	if err := client.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	if err := src.Reload(); err == nil {
		t.Fatal("a client bundle was accepted as the node's")
	}
	// So are an expired server certificate and one of another CA.
	otherCA, err := NewCA(IssueOptions{Name: "other"})
	if err != nil {
		t.Fatal(err)
	}
	foreign := mustIssue(t, otherCA, RoleServer, IssueOptions{Name: "a"})
	foreign.CAs = ca.CAs
	for name, b := range map[string]*Bundle{
		"expired":       mustIssue(t, ca, RoleServer, IssueOptions{Name: "a", NotBefore: time.Now().Add(-48 * time.Hour), Validity: time.Hour}),
		"of another CA": foreign,
	} {
		if err := b.WriteFile(path); err != nil {
			t.Fatal(err)
		}
		if err := src.Reload(); err == nil {
			t.Fatalf("an %s server certificate was accepted", name)
		}
		if src.Bundle().Cert.SerialNumber.Cmp(got) != 0 {
			t.Fatalf("after refusing an %s certificate the node no longer serves its own", name)
		}
	}
	_ = net.ErrClosed
}

// Extend adds another CA's certificates and gossip keys to a bundle, which
// still presents its own certificate and sends with its own key; the
// accepted keys survive the file.
func TestExtendBridgesTwoCAs(t *testing.T) {
	oldCA, newCA := mustCA(t), mustCA(t)
	node := mustIssue(t, oldCA, RoleServer, IssueOptions{Name: "node"})
	bridge := node.Extend(newCA)
	if !bridge.Cert.Equal(node.Cert) || !bytes.Equal(bridge.GossipKey, oldCA.GossipKey) {
		t.Fatal("the extended bundle does not present its own certificate and key")
	}
	if len(bridge.CAs) != 2 || !bridge.CAs[0].Equal(oldCA.Cert) || !bridge.CAs[1].Equal(newCA.Cert) {
		t.Fatalf("CAs %d, want the old then the new", len(bridge.CAs))
	}
	if keys := bridge.GossipKeys(); len(keys) != 2 || !bytes.Equal(keys[1], newCA.GossipKey) {
		t.Fatalf("gossip keys %d, want its own and the new CA's", len(keys))
	}
	// Extending again with the same CA changes nothing.
	if again := bridge.Extend(newCA); len(again.CAs) != 2 || len(again.GossipKeys()) != 2 {
		t.Fatalf("extending twice: %d CAs, %d keys", len(again.CAs), len(again.GossipKeys()))
	}
	path := filepath.Join(t.TempDir(), "node.pem")
	if err := bridge.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	read, err := LoadBundle(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(read.GossipKey, oldCA.GossipKey) || len(read.GossipAccept) != 1 || !bytes.Equal(read.GossipAccept[0], newCA.GossipKey) {
		t.Fatal("the gossip keys did not survive the file")
	}
	// Certificates of both CAs verify against the bridge.
	for name, b := range map[string]*Bundle{"old": oldCA, "new": newCA} {
		peer := mustIssue(t, b, RoleServer, IssueOptions{Name: name})
		if _, err := Verify([]*x509.Certificate{peer.Cert}, read.Roots(), time.Now()); err != nil {
			t.Fatalf("a server of the %s CA: %v", name, err)
		}
	}
	// The other direction: the new certificate, still reading the old key.
	back := mustIssue(t, newCA, RoleServer, IssueOptions{Name: "node"}).Extend(oldCA)
	if !bytes.Equal(back.GossipKey, newCA.GossipKey) || !bytes.Equal(back.GossipAccept[0], oldCA.GossipKey) {
		t.Fatal("a new-CA bundle extended with the old CA does not send with the new key and read the old")
	}
}

// A CA certificate is never a caller, whatever role its SAN URIs claim.
func TestACACertificateClaimingARoleIsStillACA(t *testing.T) {
	ca := mustCA(t)
	tmpl := *ca.Cert
	tmpl.URIs = []*url.URL{{Scheme: uriScheme, Host: "role", Path: "/" + string(RoleServer)}}
	der, err := x509.CreateCertificate(rand.Reader, &tmpl, ca.Cert, ca.Cert.PublicKey, ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	claiming, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	if id, err := IdentityOf(claiming); err != nil || id.Role != RoleCA {
		t.Fatalf("a CA claiming the server role: %+v %v", id, err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(claiming)
	if _, err := Verify([]*x509.Certificate{claiming}, roots, time.Now()); !errors.Is(err, ErrWrongRole) {
		t.Fatalf("a CA claiming the server role as a peer: %v", err)
	}
}

// withUsages is b re-signed by ca with the extended key usages given (none:
// the certificate names none).
func withUsages(t *testing.T, ca, b *Bundle, usages ...x509.ExtKeyUsage) *Bundle {
	t.Helper()
	tmpl := *b.Cert
	tmpl.ExtKeyUsage = usages
	der, err := x509.CreateCertificate(rand.Reader, &tmpl, ca.Cert, b.Cert.PublicKey, ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &Bundle{Cert: cert, Key: b.Key, CAs: b.CAs, GossipKey: b.GossipKey}
}

// A certificate serves only the authentication its extended key usages
// name: a server-only certificate is no caller, a client-only one no
// server, one that names none is both.
func TestExtendedKeyUsagesAreChecked(t *testing.T) {
	ca := mustCA(t)
	srv := mustIssue(t, ca, RoleServer, IssueOptions{Name: "n1", Hosts: []string{"127.0.0.1"}})
	serverOnly := withUsages(t, ca, srv, x509.ExtKeyUsageServerAuth)
	clientOnly := withUsages(t, ca, srv, x509.ExtKeyUsageClientAuth)
	either := withUsages(t, ca, srv)
	c := NewChecker(NewStaticSource(srv), &fakeLists{})
	for _, tc := range []struct {
		name   string
		b      *Bundle
		caller bool // accepted from a caller
		server bool // accepted from a server dialled
	}{{"both usages", srv, true, true}, {"server only", serverOnly, false, true}, {"client only", clientOnly, true, false},
		{"none named", either, true, true}} {
		_, err := c.Check(chain(tc.b), false, time.Now())
		if (err == nil) != tc.caller || err != nil && !errors.Is(err, ErrWrongRole) {
			t.Errorf("%s presented by a caller: %v", tc.name, err)
		}
		if _, err := Verify(chain(tc.b), ca.Roots(), time.Now()); (err == nil) != tc.caller {
			t.Errorf("%s verified as a caller's: %v", tc.name, err)
		}
		_, err = c.check(chain(tc.b), false, time.Now(), x509.ExtKeyUsageServerAuth)
		if (err == nil) != tc.server || err != nil && !strings.Contains(err.Error(), "not for server authentication") {
			t.Errorf("%s presented by a server: %v", tc.name, err)
		}
		// Peers: the one accepting checks for client use, the one dialling
		// for server use.
		node := NewStaticSource(srv)
		if err := node.verifyServer(x509.ExtKeyUsageClientAuth)(tls.ConnectionState{PeerCertificates: chain(tc.b)}); (err == nil) != tc.caller {
			t.Errorf("%s dialling a peer: %v", tc.name, err)
		}
		if err := node.verifyServer(x509.ExtKeyUsageServerAuth)(tls.ConnectionState{PeerCertificates: chain(tc.b)}); (err == nil) != tc.server {
			t.Errorf("%s dialled by a peer: %v", tc.name, err)
		}
	}
}

// A bundle holds a private key: it is written readable by its owner only,
// whatever a file left behind next to it (an interrupted write's, or one
// planted there) holds or points to.
func TestABundleIsWrittenPrivate(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "ca.pem")
	decoy := filepath.Join(dir, "decoy")
	if err := os.WriteFile(path+".tmp", []byte("stale"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(decoy, filepath.Join(dir, ".ca.pem.tmp")); err != nil {
		t.Fatal(err)
	}
	ca := mustCA(t)
	for range 2 { // a new file, then a replaced one
		if err := ca.WriteFile(path); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Lstat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != 0o600 {
			t.Fatalf("bundle written with mode %s, want -rw-------", fi.Mode())
		}
	}
	if _, err := os.Lstat(decoy); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the write followed a link next to the bundle: %v", err)
	}
	back, err := LoadBundle(path)
	if err != nil || back.Cert.SerialNumber.Cmp(ca.Cert.SerialNumber) != 0 {
		t.Fatalf("read back: %v", err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 3 { // ca.pem and the two files that were there
		t.Fatalf("files left in the directory: %v", entries)
	}
}
