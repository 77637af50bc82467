// Package auth owns raftlockd's certificates and what they allow: issuing
// a certificate authority and the server, client and TC-client
// certificates it signs; PEM bundles (certificate, key and CA in one file);
// the identity a peer's certificate proves (role, namespace permissions,
// serial, issuing CA); and the TLS material a node serves and dials with,
// reloaded from its files on demand so that certificates rotate without a
// restart. It knows nothing about HTTP or Raft: package api decides what an
// identity may call, package cluster what may join.
package auth

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"
)

// Role is what a certificate is for.
type Role string

// The roles a raftlockd CA issues.
const (
	RoleCA       Role = "ca"
	RoleServer   Role = "server"   // a node: serves the API, joins Raft and gossip, calls other islands
	RoleClient   Role = "client"   // an application: leases, state, queues in its namespaces
	RoleTCClient Role = "tcclient" // transaction tooling: decide, the coordinator's read endpoints
)

// uriScheme prefixes the SAN URIs that carry a certificate's role and
// namespace permissions: raftlockd://role/<role>,
// raftlockd://ns/<namespace>?perm=r|rw (namespace "*": every namespace).
const uriScheme = "raftlockd"

// Perm grants reads, or reads and writes, in a namespace ("*": all).
type Perm struct {
	Namespace string
	Write     bool
}

// String is the permission as a SAN URI.
func (p Perm) String() string {
	perm := "r"
	if p.Write {
		perm = "rw"
	}
	return fmt.Sprintf("%s://ns/%s?perm=%s", uriScheme, p.Namespace, perm)
}

// ParsePerm reads "ns", "ns:r", "ns:rw" or a raftlockd://ns/... URI; the
// default is read-write.
func ParsePerm(s string) (Perm, error) {
	if strings.HasPrefix(s, uriScheme+"://") {
		u, err := url.Parse(s)
		if err != nil {
			return Perm{}, fmt.Errorf("auth: permission %q: %w", s, err)
		}
		return permOfURI(u)
	}
	ns, mode, found := strings.Cut(s, ":")
	p := Perm{Namespace: foldNamespace(ns), Write: true}
	if found {
		switch mode {
		case "r":
			p.Write = false
		case "rw":
		default:
			return Perm{}, fmt.Errorf("auth: permission %q: mode must be r or rw", s)
		}
	}
	if p.Namespace == "" || strings.ContainsAny(p.Namespace, "/?#") {
		return Perm{}, fmt.Errorf("auth: permission %q: bad namespace", s)
	}
	return p, nil
}

// foldNamespace lower-cases A-Z (and nothing else), as the server does
// with the namespace a request names: a permission for "Orders" covers the
// namespace "orders" requests reach however they spell it.
func foldNamespace(ns string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'A' && r <= 'Z' {
			return r + 'a' - 'A'
		}
		return r
	}, ns)
}

func permOfURI(u *url.URL) (Perm, error) {
	if u.Scheme != uriScheme || u.Host != "ns" {
		return Perm{}, fmt.Errorf("auth: %q is not a namespace permission", u)
	}
	ns := foldNamespace(strings.TrimPrefix(u.Path, "/"))
	if ns == "" || strings.Contains(ns, "/") {
		return Perm{}, fmt.Errorf("auth: %q names no namespace", u)
	}
	p := Perm{Namespace: ns}
	switch u.Query().Get("perm") {
	case "r":
	case "rw":
		p.Write = true
	default:
		return Perm{}, fmt.Errorf("auth: %q: perm must be r or rw", u)
	}
	return p, nil
}

// Identity is what a verified certificate proves.
type Identity struct {
	Role     Role
	Name     string // the subject's common name
	Serial   string // hex
	Perms    []Perm
	NotAfter time.Time
	CA       string // fingerprint of the issuing CA (see Fingerprint)
	Node     string // a server certificate's node id, when it is bound to one
	Foreign  bool   // issued by a CA on the trust list, not the island's own
}

// Allows reports whether the identity may read (or, with write, change)
// namespace ns. Servers and TC clients act for the whole cluster.
func (id Identity) Allows(ns string, write bool) bool {
	if id.Role == RoleServer || id.Role == RoleTCClient {
		return true
	}
	return slices.ContainsFunc(id.Perms, func(p Perm) bool {
		return (p.Namespace == "*" || p.Namespace == ns) && (p.Write || !write)
	})
}

// Fingerprint names a certificate: the hex SHA-256 of its DER form.
func Fingerprint(c *x509.Certificate) string {
	sum := sha256.Sum256(c.Raw)
	return hex.EncodeToString(sum[:])
}

// SerialOf is a certificate's serial number as Identity.Serial spells it.
func SerialOf(c *x509.Certificate) string { return strings.ToLower(c.SerialNumber.Text(16)) }

// IdentityOf reads role and permissions from a certificate's SAN URIs. It
// does not verify the certificate: see Verify.
func IdentityOf(c *x509.Certificate) (Identity, error) {
	id := Identity{Name: c.Subject.CommonName, Serial: SerialOf(c), NotAfter: c.NotAfter}
	if c.IsCA {
		id.Role = RoleCA
	}
	for _, u := range c.URIs {
		if u.Scheme != uriScheme {
			continue
		}
		switch u.Host {
		case "role":
			id.Role = Role(strings.TrimPrefix(u.Path, "/"))
		case "node":
			id.Node = strings.TrimPrefix(u.Path, "/")
		case "ns":
			p, err := permOfURI(u)
			if err != nil {
				return Identity{}, err
			}
			id.Perms = append(id.Perms, p)
		}
	}
	if c.IsCA {
		id.Role = RoleCA // a role URI does not make a CA a caller
	}
	switch id.Role {
	case RoleCA, RoleServer, RoleClient, RoleTCClient:
	default:
		return Identity{}, fmt.Errorf("auth: certificate %q carries no raftlockd role", id.Name)
	}
	return id, nil
}
