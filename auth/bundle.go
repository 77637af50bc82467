package auth

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"
)

// Bundle is a certificate with its private key and the CA that issued it,
// kept in one PEM file. A CA's bundle holds the CA itself and the gossip key
// its servers share; a server's bundle carries that gossip key too.
type Bundle struct {
	Cert      *x509.Certificate
	Key       crypto.Signer
	CAs       []*x509.Certificate
	GossipKey []byte // 32 bytes: memberlist's AES-256 key for the CA's servers
	// GossipAccept are further gossip keys a node reads but does not send
	// with: while a cluster moves to a new CA (and its gossip key), nodes
	// that switched and nodes that did not yet still understand each other
	// (see Extend).
	GossipAccept [][]byte

	rootsOnce sync.Once
	roots     *x509.CertPool
}

// PEM block types of a bundle.
const (
	pemCert      = "CERTIFICATE"
	pemKey       = "PRIVATE KEY"
	pemGossipKey = "RAFTLOCKD GOSSIP KEY"
)

// Encode writes the bundle as PEM: the certificate, its key, the CA
// certificates and the gossip key, in that order.
func (b *Bundle) Encode() ([]byte, error) {
	key, err := x509.MarshalPKCS8PrivateKey(b.Key)
	if err != nil {
		return nil, fmt.Errorf("auth: encode key: %w", err)
	}
	out := pem.EncodeToMemory(&pem.Block{Type: pemCert, Bytes: b.Cert.Raw})
	out = append(out, pem.EncodeToMemory(&pem.Block{Type: pemKey, Bytes: key})...)
	for _, ca := range b.CAs {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: pemCert, Bytes: ca.Raw})...)
	}
	for _, k := range b.GossipKeys() {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: pemGossipKey, Bytes: k})...)
	}
	return out, nil
}

// GossipKeys are the bundle's gossip keys, the one sent with first.
func (b *Bundle) GossipKeys() [][]byte {
	var keys [][]byte
	if len(b.GossipKey) > 0 {
		keys = append(keys, b.GossipKey)
	}
	for _, k := range b.GossipAccept {
		if !slices.ContainsFunc(keys, func(have []byte) bool { return bytes.Equal(have, k) }) {
			keys = append(keys, k)
		}
	}
	return keys
}

// Extend returns b that also trusts other's CA certificates and reads
// other's gossip keys, still presenting b's certificate and sending with
// b's gossip key. It is the bridge of a move to a new CA: first every node
// gets its current bundle extended with the new CA, then its bundle of the
// new CA extended with the old one, and last the new CA's bundle alone.
func (b *Bundle) Extend(other *Bundle) *Bundle {
	out := &Bundle{Cert: b.Cert, Key: b.Key, CAs: slices.Clone(b.CAs), GossipKey: b.GossipKey,
		GossipAccept: slices.Clone(b.GossipAccept)}
	for _, ca := range other.CAs {
		if !slices.ContainsFunc(out.CAs, ca.Equal) {
			out.CAs = append(out.CAs, ca)
		}
	}
	for _, k := range other.GossipKeys() {
		if !slices.ContainsFunc(out.GossipKeys(), func(have []byte) bool { return bytes.Equal(have, k) }) {
			out.GossipAccept = append(out.GossipAccept, k)
		}
	}
	return out
}

// ParseBundle reads what Encode wrote.
func ParseBundle(data []byte) (*Bundle, error) {
	b := &Bundle{}
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		switch block.Type {
		case pemCert:
			c, err := x509.ParseCertificate(block.Bytes)
			if err != nil {
				return nil, fmt.Errorf("auth: bundle certificate: %w", err)
			}
			if b.Cert == nil {
				b.Cert = c
			} else {
				b.CAs = append(b.CAs, c)
			}
		case pemKey:
			k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
			if err != nil {
				return nil, fmt.Errorf("auth: bundle key: %w", err)
			}
			signer, ok := k.(crypto.Signer)
			if !ok {
				return nil, errors.New("auth: bundle key cannot sign")
			}
			b.Key = signer
		case pemGossipKey:
			if len(block.Bytes) != 32 {
				return nil, errors.New("auth: gossip key must be 32 bytes")
			}
			if b.GossipKey == nil {
				b.GossipKey = block.Bytes
			} else {
				b.GossipAccept = append(b.GossipAccept, block.Bytes)
			}
		}
	}
	switch {
	case b.Cert == nil:
		return nil, errors.New("auth: bundle holds no certificate")
	case b.Key == nil:
		return nil, errors.New("auth: bundle holds no private key")
	}
	if pub, ok := b.Key.Public().(interface{ Equal(crypto.PublicKey) bool }); !ok || !pub.Equal(b.Cert.PublicKey) {
		return nil, errors.New("auth: bundle key does not match its certificate")
	}
	if b.Cert.IsCA && len(b.CAs) == 0 {
		b.CAs = []*x509.Certificate{b.Cert}
	}
	return b, nil
}

// LoadBundle reads a bundle file.
func LoadBundle(path string) (*Bundle, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	b, err := ParseBundle(raw)
	if err != nil {
		return nil, fmt.Errorf("%w (%s)", err, path)
	}
	return b, nil
}

// WriteFile stores the bundle at path (mode 0600), replacing it atomically.
func (b *Bundle) WriteFile(path string) error {
	raw, err := b.Encode()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	// A new file of its own (never one left behind or planted next to
	// path, whose mode or link would stay) holds the key until the rename.
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	tmp := f.Name()
	_, err = f.Write(raw)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("auth: %w", err)
	}
	return nil
}

// TLSCertificate is the bundle as crypto/tls serves it.
func (b *Bundle) TLSCertificate() tls.Certificate {
	return tls.Certificate{Certificate: [][]byte{b.Cert.Raw}, PrivateKey: b.Key, Leaf: b.Cert}
}

// Roots is a pool of the bundle's CA certificates.
func (b *Bundle) Roots() *x509.CertPool {
	b.rootsOnce.Do(func() {
		b.roots = x509.NewCertPool()
		for _, c := range b.CAs {
			b.roots.AddCert(c)
		}
	})
	return b.roots
}

// Identity is IdentityOf the bundle's certificate.
func (b *Bundle) Identity() (Identity, error) {
	id, err := IdentityOf(b.Cert)
	if err == nil && len(b.CAs) > 0 {
		id.CA = Fingerprint(b.CAs[0])
	}
	return id, err
}

// IssueOptions describe a certificate to issue.
type IssueOptions struct {
	Name     string        // common name
	Hosts    []string      // server: DNS names and IP addresses it answers on
	Node     string        // server: the node id it is for ("": any)
	Perms    []Perm        // client: namespaces it may use
	Validity time.Duration // 0: a year (ten for a CA)
	// NotBefore starts the validity period, which then lasts Validity;
	// zero: it starts a minute ago (for clock skew) and lasts Validity from now.
	NotBefore time.Time
}

// newKeyAndSerial makes the key and the random serial of a new certificate.
func newKeyAndSerial() (*ecdsa.PrivateKey, *big.Int, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("auth: %w", err)
	}
	sn, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, fmt.Errorf("auth: %w", err)
	}
	return key, sn, nil
}

// NewCA creates a certificate authority with a fresh gossip key.
func NewCA(o IssueOptions) (*Bundle, error) {
	if o.Name == "" {
		o.Name = "raftlockd CA"
	}
	if o.Validity <= 0 {
		o.Validity = 10 * 365 * 24 * time.Hour
	}
	key, sn, err := newKeyAndSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: sn, Subject: pkix.Name{CommonName: o.Name},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(o.Validity), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		URIs:     []*url.URL{{Scheme: uriScheme, Host: "role", Path: "/" + string(RoleCA)}}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("auth: create CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	gossip := make([]byte, 32)
	if _, err := rand.Read(gossip); err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	return &Bundle{Cert: cert, Key: key, CAs: []*x509.Certificate{cert}, GossipKey: gossip}, nil
}

// Issue signs a certificate for role with the CA bundle ca.
func (ca *Bundle) Issue(role Role, o IssueOptions) (*Bundle, error) {
	if !ca.Cert.IsCA {
		return nil, errors.New("auth: the issuing bundle is not a CA")
	}
	if o.Name == "" {
		return nil, errors.New("auth: a certificate needs a name")
	}
	if o.Validity <= 0 {
		o.Validity = 365 * 24 * time.Hour
	}
	key, sn, err := newKeyAndSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	notBefore, notAfter := now.Add(-time.Minute), now.Add(o.Validity)
	if !o.NotBefore.IsZero() {
		notBefore, notAfter = o.NotBefore, o.NotBefore.Add(o.Validity)
	}
	// A certificate is of no use past its CA's expiry: it ends with it,
	// so that its own expiry is the one a caller is told of.
	notAfter = minTime(notAfter, ca.Cert.NotAfter)
	tmpl := &x509.Certificate{SerialNumber: sn, Subject: pkix.Name{CommonName: o.Name},
		NotBefore: notBefore, NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, BasicConstraintsValid: true,
		URIs: []*url.URL{{Scheme: uriScheme, Host: "role", Path: "/" + string(role)}}}
	b := &Bundle{Key: key, CAs: []*x509.Certificate{ca.Cert}}
	switch role {
	case RoleServer:
		// Servers also dial each other (Raft, forwarding, other islands).
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
		for _, h := range o.Hosts {
			if ip := net.ParseIP(h); ip != nil {
				if !slices.ContainsFunc(tmpl.IPAddresses, ip.Equal) {
					tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
				}
			} else if h != "" && !slices.Contains(tmpl.DNSNames, h) {
				tmpl.DNSNames = append(tmpl.DNSNames, h)
			}
		}
		if o.Node != "" {
			tmpl.URIs = append(tmpl.URIs, &url.URL{Scheme: uriScheme, Host: "node", Path: "/" + o.Node})
		}
		b.GossipKey = ca.GossipKey
	case RoleClient, RoleTCClient:
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
		for _, p := range o.Perms {
			u, err := url.Parse(p.String())
			if err != nil {
				return nil, fmt.Errorf("auth: %w", err)
			}
			tmpl.URIs = append(tmpl.URIs, u)
		}
	default:
		return nil, fmt.Errorf("auth: cannot issue a %q certificate", role)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, fmt.Errorf("auth: issue %s certificate: %w", role, err)
	}
	if b.Cert, err = x509.ParseCertificate(der); err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	return b, nil
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
