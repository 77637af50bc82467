package fsm

import (
	"encoding/json"
	"strings"

	"github.com/raftlockd/raftlockd/errcode"
)

// The island's replicated access lists: certificate serials it refuses
// (revocations) and the foreign CAs whose servers and TC clients may call
// its coordinator and resource-manager endpoints. They are state like any
// other, so every node enforces the same lists and a restore brings them
// back; an operator's restore of an older backup keeps the current
// revocations too, and leaves out the CAs removed from the trust list since
// (PrepareRestore).
var (
	bucketRevoked  = []byte("auth_revoked") // serial (lower-case hex) -> Revocation
	bucketTrust    = []byte("tc_trust")     // CA fingerprint -> TrustedCA
	bucketDistrust = []byte("tc_distrust")  // CA fingerprint -> removed at (8 bytes): removed from the trust list
)

// RevokeCmd adds a certificate serial to the denylist.
type RevokeCmd struct {
	Serial string `json:"serial"` // lower-case hex
	Reason string `json:"reason,omitempty"`
}

// TrustCmd adds (or with Remove drops) a CA allowed to call the
// coordinator and resource-manager endpoints.
type TrustCmd struct {
	Fingerprint string `json:"fingerprint"` // hex SHA-256 of the certificate
	Name        string `json:"name,omitempty"`
	Cert        []byte `json:"cert,omitempty"` // DER; required to add
	Remove      bool   `json:"remove,omitempty"`
}

// Revocation is a denylist entry.
type Revocation struct {
	Serial    string `json:"serial"`
	Reason    string `json:"reason,omitempty"`
	RevokedAt int64  `json:"revoked_at"`
}

// TrustedCA is a trust list entry.
type TrustedCA struct {
	Fingerprint string `json:"fingerprint"`
	Name        string `json:"name,omitempty"`
	Cert        []byte `json:"cert"`
	AddedAt     int64  `json:"added_at"`
}

// AuthInfo is what an access-list command left behind; Changed says
// whether it changed anything.
type AuthInfo struct {
	Revocation *Revocation `json:"revocation,omitempty"`
	Trust      *TrustedCA  `json:"trust,omitempty"`
	Changed    bool        `json:"changed,omitempty"`
}

func isLowerHex(s string, max int) bool {
	if s == "" || len(s) > max {
		return false
	}
	return strings.Trim(s, "0123456789abcdef") == ""
}

func (s *applyState) revoke(c *RevokeCmd) *Result {
	if !isLowerHex(c.Serial, 64) || len(c.Reason) > 256 {
		return fail(errcode.MalformedCmd.With("a revocation needs a lower-case hex serial"))
	}
	var r Revocation
	if s.getJSON(bucketRevoked, []byte(c.Serial), &r) {
		return &Result{Auth: &AuthInfo{Revocation: &r}}
	}
	r = Revocation{Serial: c.Serial, Reason: c.Reason, RevokedAt: s.now}
	s.putJSON(bucketRevoked, []byte(c.Serial), r)
	s.authChanged = true
	return &Result{Auth: &AuthInfo{Revocation: &r, Changed: true}}
}

// MaxTrustedCABytes bounds the DER form of a trusted CA's certificate.
const MaxTrustedCABytes = 16 << 10

func (s *applyState) trust(c *TrustCmd) *Result {
	if !isLowerHex(c.Fingerprint, 64) || len(c.Fingerprint) != 64 || len(c.Name) > 256 || len(c.Cert) > MaxTrustedCABytes ||
		(!c.Remove && len(c.Cert) == 0) {
		return fail(errcode.MalformedCmd.With("a trust entry needs a SHA-256 fingerprint and, to add, the certificate"))
	}
	var t TrustedCA
	has := s.getJSON(bucketTrust, []byte(c.Fingerprint), &t)
	switch {
	case c.Remove && has:
		s.del(bucketTrust, []byte(c.Fingerprint))
		s.put(bucketDistrust, []byte(c.Fingerprint), putU64(uint64(s.now)))
	case !c.Remove && !has:
		t = TrustedCA{Fingerprint: c.Fingerprint, Name: c.Name, Cert: c.Cert, AddedAt: s.now}
		s.putJSON(bucketTrust, []byte(c.Fingerprint), t)
		s.del(bucketDistrust, []byte(c.Fingerprint))
	default:
		if !has {
			return &Result{Auth: &AuthInfo{}}
		}
		return &Result{Auth: &AuthInfo{Trust: &t}}
	}
	s.authChanged = true
	return &Result{Auth: &AuthInfo{Trust: &t, Changed: true}}
}

// Revocations lists the denylist in serial order.
func (v *View) Revocations() []Revocation {
	var out []Revocation
	c := v.b(bucketRevoked).Cursor()
	for k, raw := c.First(); k != nil; k, raw = c.Next() {
		var r Revocation
		must(json.Unmarshal(raw, &r))
		out = append(out, r)
	}
	return out
}

// TrustedCAs lists the trust list in fingerprint order.
func (v *View) TrustedCAs() []TrustedCA {
	var out []TrustedCA
	c := v.b(bucketTrust).Cursor()
	for k, raw := c.First(); k != nil; k, raw = c.Next() {
		var t TrustedCA
		must(json.Unmarshal(raw, &t))
		out = append(out, t)
	}
	return out
}

// AuthGeneration changes whenever the access lists may have changed (a
// revocation or trust command applied, a restore, a reset): readers cache
// the lists and reload them when it moves.
func (f *FSM) AuthGeneration() uint64 { return f.authGen.Load() }
