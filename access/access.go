// Package access owns the island's replicated access lists: the serials of
// revoked certificates and the foreign CAs trusted to call the
// coordinator and resource-manager endpoints. Changes go through Raft like
// any other state, so every node refuses and trusts the same certificates,
// also after a restore. The lists are read by auth.Checker on every
// authenticated request (cached until they change) and served to
// operators by package api.
package access

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"math/big"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/raftlockd/raftlockd/auth"
	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
)

// Store is the replicated state as the lists use it.
type Store interface {
	Propose(ctx context.Context, cmd *fsm.Command) (*fsm.Result, error)
	Read(ctx context.Context, fn func(v *fsm.View) error) error
}

// Local is this node's copy of the state, read without asking the leader.
type Local interface {
	AuthGeneration() uint64
	View(fn func(v *fsm.View) error) error
}

// Lists proposes and reads the access lists.
type Lists struct {
	store Store
	local Local
}

// New returns the lists kept in store; local serves auth.Checker.
func New(store Store, local Local) *Lists { return &Lists{store: store, local: local} }

var _ auth.Lists = (*Lists)(nil)

// AuthGeneration implements auth.Lists.
func (l *Lists) AuthGeneration() uint64 { return l.local.AuthGeneration() }

// AccessLists implements auth.Lists from this node's copy: a revocation
// takes effect on a node as soon as it has applied it.
func (l *Lists) AccessLists() (revoked []string, trusted [][]byte, err error) {
	err = l.local.View(func(v *fsm.View) error {
		for _, r := range v.Revocations() {
			revoked = append(revoked, r.Serial)
		}
		for _, t := range v.TrustedCAs() {
			trusted = append(trusted, t.Cert)
		}
		return nil
	})
	return revoked, trusted, err
}

// NormalizeSerial reads a certificate serial written in hex, with or
// without colons, a 0x prefix or leading zeros, as auth.Identity spells it.
func NormalizeSerial(given string) (string, error) {
	s := strings.TrimPrefix(strings.ToLower(strings.ReplaceAll(strings.TrimSpace(given), ":", "")), "0x")
	n, ok := new(big.Int).SetString(s, 16)
	if !ok || s == "" || strings.Trim(s, "0123456789abcdef") != "" || len(s) > 64 {
		return "", errcode.InvalidParams.With("serial %q is not a hexadecimal certificate serial", given)
	}
	return n.Text(16), nil
}

// label checks a free-text field that lists print: at most 256 bytes of
// UTF-8 without control characters.
func label(field, s string) error {
	if len(s) > 256 {
		return errcode.InvalidParams.With("%s longer than 256 bytes", field)
	}
	if !utf8.ValidString(s) || strings.IndexFunc(s, unicode.IsControl) >= 0 {
		return errcode.InvalidParams.With("%s must be UTF-8 without control characters", field)
	}
	return nil
}

// Revoke puts a certificate serial on the denylist.
func (l *Lists) Revoke(ctx context.Context, serial, reason string) (*fsm.AuthInfo, error) {
	serial, err := NormalizeSerial(serial)
	if err != nil {
		return nil, err
	}
	if err := label("reason", reason); err != nil {
		return nil, err
	}
	return l.propose(ctx, &fsm.Command{Op: fsm.OpRevoke, Revoke: &fsm.RevokeCmd{Serial: serial, Reason: reason}})
}

// Revocations lists the denylist.
func (l *Lists) Revocations(ctx context.Context) (out []fsm.Revocation, err error) {
	err = l.store.Read(ctx, func(v *fsm.View) error {
		out = v.Revocations()
		return nil
	})
	return out, err
}

// ParseCA reads a CA certificate from PEM (the first certificate that is a
// CA, so a CA's bundle works as well as its bare certificate).
func ParseCA(pemData []byte) (*x509.Certificate, error) {
	rest := pemData
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			return nil, errcode.InvalidCertificate.With("no CA certificate in the PEM data")
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, errcode.InvalidCertificate.With("%v", err)
		}
		if c.IsCA {
			return c, nil
		}
	}
}

// Trust adds the CA in pemData to the trust list.
func (l *Lists) Trust(ctx context.Context, name string, pemData []byte) (*fsm.AuthInfo, error) {
	ca, err := ParseCA(pemData)
	if err != nil {
		return nil, err
	}
	if len(ca.Raw) > fsm.MaxTrustedCABytes {
		return nil, errcode.InvalidCertificate.With("the CA %q is %d bytes; a trusted CA's certificate is at most %d",
			ca.Subject.CommonName, len(ca.Raw), fsm.MaxTrustedCABytes)
	}
	if now := time.Now(); now.After(ca.NotAfter) {
		return nil, errcode.InvalidCertificate.With("the CA %q expired on %s", ca.Subject.CommonName,
			ca.NotAfter.UTC().Format(time.RFC3339))
	}
	if name == "" {
		name = ca.Subject.CommonName
	}
	if err := label("name", name); err != nil {
		return nil, err
	}
	return l.propose(ctx, &fsm.Command{Op: fsm.OpTrust, Trust: &fsm.TrustCmd{
		Fingerprint: auth.Fingerprint(ca), Name: name, Cert: ca.Raw}})
}

// Untrust drops the CA with fingerprint from the trust list.
func (l *Lists) Untrust(ctx context.Context, fingerprint string) (*fsm.AuthInfo, error) {
	fingerprint = strings.ToLower(strings.ReplaceAll(strings.TrimSpace(fingerprint), ":", ""))
	if len(fingerprint) != 64 || strings.Trim(fingerprint, "0123456789abcdef") != "" {
		return nil, errcode.InvalidParams.With("fingerprint must be 64 hex digits (SHA-256)")
	}
	return l.propose(ctx, &fsm.Command{Op: fsm.OpTrust, Trust: &fsm.TrustCmd{Fingerprint: fingerprint, Remove: true}})
}

// TrustedCAs lists the trust list.
func (l *Lists) TrustedCAs(ctx context.Context) (out []fsm.TrustedCA, err error) {
	err = l.store.Read(ctx, func(v *fsm.View) error {
		out = v.TrustedCAs()
		return nil
	})
	return out, err
}

func (l *Lists) propose(ctx context.Context, cmd *fsm.Command) (*fsm.AuthInfo, error) {
	res, err := l.store.Propose(ctx, cmd)
	if err != nil {
		return nil, fmt.Errorf("access: %w", err)
	}
	if err := res.Error(); err != nil {
		return nil, err
	}
	return res.Auth, nil
}
