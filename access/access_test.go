package access_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/raftlockd/raftlockd/access"
	"github.com/raftlockd/raftlockd/auth"
	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
)

func TestNormalizeSerial(t *testing.T) {
	for in, want := range map[string]string{
		"1f2e":                  "1f2e",
		"1F2E":                  "1f2e",
		"01:F2:2E":              "1f22e",
		"0x00ff":                "ff",
		"0XFF":                  "ff",
		"  ab:cd \n":            "abcd",
		"0":                     "0",
		strings.Repeat("f", 64): strings.Repeat("f", 64),
	} {
		got, err := access.NormalizeSerial(in)
		if err != nil || got != want {
			t.Errorf("NormalizeSerial(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "   ", "0x", ":", "xyz", "12g4", "-1f", "+1f", "1f 2e", strings.Repeat("f", 65)} {
		if got, err := access.NormalizeSerial(bad); !errors.Is(err, errcode.InvalidParams) {
			t.Errorf("NormalizeSerial(%q) = %q, %v; want %s", bad, got, err, errcode.InvalidParams.Code)
		}
	}
}

// A serial as openssl prints it (upper case, colon-separated, with a
// leading zero byte) names the certificate as auth.Identity does.
func TestNormalizeSerialMatchesIdentities(t *testing.T) {
	ca, err := auth.NewCA(auth.IssueOptions{Name: "ca"})
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		b, err := ca.Issue(auth.RoleClient, auth.IssueOptions{Name: "app"})
		if err != nil {
			t.Fatal(err)
		}
		raw := b.Cert.SerialNumber.Bytes()
		var parts []string
		for _, x := range append([]byte{0}, raw...) {
			parts = append(parts, strings.ToUpper(string("0123456789abcdef"[x>>4])+string("0123456789abcdef"[x&15])))
		}
		got, err := access.NormalizeSerial(strings.Join(parts, ":"))
		if err != nil || got != auth.SerialOf(b.Cert) {
			t.Fatalf("%s: %q %v, want %q", strings.Join(parts, ":"), got, err, auth.SerialOf(b.Cert))
		}
	}
}

func pemOf(der []byte) []byte { return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}) }

func TestParseCA(t *testing.T) {
	ca, err := auth.NewCA(auth.IssueOptions{Name: "island b"})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ca.Issue(auth.RoleServer, auth.IssueOptions{Name: "node", Hosts: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	caBundle, _ := ca.Encode()
	srvBundle, _ := srv.Encode()
	for name, in := range map[string][]byte{
		"bare CA certificate":        pemOf(ca.Cert.Raw),
		"CA bundle":                  caBundle,
		"server bundle (leaf first)": srvBundle,
		"text around the PEM":        append(append([]byte("issued by ops\n"), pemOf(ca.Cert.Raw)...), "trailer\n"...),
	} {
		got, err := access.ParseCA(in)
		if err != nil || !got.Equal(ca.Cert) {
			t.Errorf("%s: %v", name, err)
		}
	}
	for name, in := range map[string][]byte{
		"nothing":                 nil,
		"not PEM":                 []byte("hello"),
		"a leaf certificate only": pemOf(srv.Cert.Raw),
		"a key only":              pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1, 2, 3}}),
		"a broken certificate":    pemOf([]byte("not DER")),
	} {
		if _, err := access.ParseCA(in); !errors.Is(err, errcode.InvalidCertificate) {
			t.Errorf("%s: %v, want %s", name, err, errcode.InvalidCertificate.Code)
		}
	}
}

// store applies proposals to a real state machine, as Raft would.
type store struct {
	mu    sync.Mutex
	f     *fsm.FSM
	index uint64
}

func (s *store) Propose(_ context.Context, c *fsm.Command) (*fsm.Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c.Now = time.Now().UnixMilli()
	data, err := fsm.Encode(c)
	if err != nil {
		return nil, err
	}
	s.index++
	return s.f.ApplyBatch([]*raft.Log{{Index: s.index, Term: 1, Type: raft.LogCommand, Data: data}})[0].(*fsm.Result), nil
}

func (s *store) Read(_ context.Context, fn func(v *fsm.View) error) error { return s.f.View(fn) }

func openLists(t *testing.T) (*access.Lists, *fsm.FSM) {
	t.Helper()
	f, err := fsm.Open(filepath.Join(t.TempDir(), "state.db"), fsm.Options{Fatal: func(err error) { t.Errorf("fatal: %v", err) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return access.New(&store{f: f}, f), f
}

func TestListsThroughTheStateMachine(t *testing.T) {
	ctx := context.Background()
	l, f := openLists(t)
	foreign, err := auth.NewCA(auth.IssueOptions{Name: "island b"})
	if err != nil {
		t.Fatal(err)
	}
	gen := l.AuthGeneration()

	info, err := l.Revoke(ctx, "0x0A:BC", "lost laptop")
	if err != nil || !info.Changed || info.Revocation.Serial != "abc" {
		t.Fatalf("revoke: %+v %v", info, err)
	}
	if info, err = l.Revoke(ctx, "abc", "again"); err != nil || info.Changed || info.Revocation.Reason != "lost laptop" {
		t.Fatalf("revoke again: %+v %v", info, err)
	}
	if _, err := l.Revoke(ctx, "not hex", ""); !errors.Is(err, errcode.InvalidParams) {
		t.Fatalf("bad serial: %v", err)
	}
	for _, reason := range []string{strings.Repeat("r", 257), "a\x00b", "\xff", "line\nbreak"} {
		if _, err := l.Revoke(ctx, "ab", reason); !errors.Is(err, errcode.InvalidParams) {
			t.Fatalf("reason %q: %v", reason, err)
		}
	}

	caPEM, _ := foreign.Encode()
	info, err = l.Trust(ctx, "", caPEM)
	if err != nil || !info.Changed || info.Trust.Name != "island b" || info.Trust.Fingerprint != auth.Fingerprint(foreign.Cert) {
		t.Fatalf("trust: %+v %v", info, err)
	}
	if _, err := l.Trust(ctx, "a\x00", caPEM); !errors.Is(err, errcode.InvalidParams) {
		t.Fatalf("trust with a control character in its name: %v", err)
	}
	if _, err := l.Trust(ctx, "x", []byte("junk")); !errors.Is(err, errcode.InvalidCertificate) {
		t.Fatalf("trust junk: %v", err)
	}
	if _, err := l.Trust(ctx, "old", expiredCA(t)); !errors.Is(err, errcode.InvalidCertificate) {
		t.Fatalf("trust an expired CA: %v", err)
	}
	var hosts []string
	for i := range 800 {
		hosts = append(hosts, fmt.Sprintf("node-%03d.island-c.example", i))
	}
	large := selfSignedCA(t, "large CA", time.Now().Add(24*time.Hour), hosts)
	if _, err := l.Trust(ctx, "large", large); !errors.Is(err, errcode.InvalidCertificate) {
		t.Fatalf("trust a CA of more than %d bytes: %v", fsm.MaxTrustedCABytes, err)
	}
	if _, err := l.Untrust(ctx, "abc"); !errors.Is(err, errcode.InvalidParams) {
		t.Fatalf("untrust a bad fingerprint: %v", err)
	}

	revs, err := l.Revocations(ctx)
	if err != nil || len(revs) != 1 || revs[0].Serial != "abc" {
		t.Fatalf("revocations: %+v %v", revs, err)
	}
	cas, err := l.TrustedCAs(ctx)
	if err != nil || len(cas) != 1 || !bytes.Equal(cas[0].Cert, foreign.Cert.Raw) {
		t.Fatalf("trusted CAs: %+v %v", cas, err)
	}
	if l.AuthGeneration() == gen || l.AuthGeneration() != f.AuthGeneration() {
		t.Fatalf("generation %d (state machine %d, before %d)", l.AuthGeneration(), f.AuthGeneration(), gen)
	}

	// What a Checker reads: serials and DER certificates.
	revoked, trusted, err := l.AccessLists()
	if err != nil || len(revoked) != 1 || revoked[0] != "abc" || len(trusted) != 1 || !bytes.Equal(trusted[0], foreign.Cert.Raw) {
		t.Fatalf("access lists: %v %d %v", revoked, len(trusted), err)
	}

	// Fingerprints are accepted as operators copy them: upper case, colons.
	colons := strings.ToUpper(auth.Fingerprint(foreign.Cert))
	var spaced []string
	for i := 0; i < len(colons); i += 2 {
		spaced = append(spaced, colons[i:i+2])
	}
	if info, err = l.Untrust(ctx, strings.Join(spaced, ":")); err != nil || !info.Changed {
		t.Fatalf("untrust: %+v %v", info, err)
	}
	if _, trusted, _ = l.AccessLists(); len(trusted) != 0 {
		t.Fatal("the CA is still trusted")
	}
}

// expiredCA is the PEM of a CA whose validity ended yesterday.
func expiredCA(t *testing.T) []byte {
	t.Helper()
	return selfSignedCA(t, "old CA", time.Now().Add(-24*time.Hour), nil)
}

// selfSignedCA is a CA certificate valid until notAfter naming hosts.
func selfSignedCA(t *testing.T, name string, notAfter time.Time, hosts []string) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: notAfter.Add(-24 * time.Hour), NotAfter: notAfter, DNSNames: hosts,
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
