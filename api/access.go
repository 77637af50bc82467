package api

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"net/http"

	"github.com/raftlockd/raftlockd/access"
	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/wire"
)

// The access-list endpoints: /v1/auth/revoke and /v1/auth/revoked, and
// /v1/tc/trust. They are administrative (a server certificate of the
// island's own CA).

// AccessLists is the island's certificate denylist and CA trust list.
type AccessLists interface {
	Revoke(ctx context.Context, serial, reason string) (*fsm.AuthInfo, error)
	Revocations(ctx context.Context) ([]fsm.Revocation, error)
	Trust(ctx context.Context, name string, pemData []byte) (*fsm.AuthInfo, error)
	Untrust(ctx context.Context, fingerprint string) (*fsm.AuthInfo, error)
	TrustedCAs(ctx context.Context) ([]fsm.TrustedCA, error)
}

func (h *handler) routeAccess(route func(method, path string, fn func(http.ResponseWriter, *http.Request) error)) {
	if h.Access == nil {
		return
	}
	route(http.MethodPost, "/v1/auth/revoke", h.revoke)
	route(http.MethodGet, "/v1/auth/revoked", h.revoked)
	route("", "/v1/tc/trust", h.trust)
}

func revocation(r fsm.Revocation) wire.Revocation {
	return wire.Revocation{Serial: r.Serial, Reason: r.Reason, RevokedAt: r.RevokedAt / 1000}
}

func (h *handler) revoke(w http.ResponseWriter, r *http.Request) error {
	var req wire.RevokeRequest
	if err := h.decodeJSON(w, r, &req); err != nil {
		return err
	}
	if req.Serial == "" {
		return errcode.InvalidParams.With("serial is required")
	}
	if id := identityOf(r.Context()); id != nil {
		if s, err := access.NormalizeSerial(req.Serial); err == nil && s == id.Serial {
			return errcode.InvalidParams.With("serial %s is the certificate this request is made with: revoking it would lock its holder out", s)
		}
	}
	info, err := h.Access.Revoke(r.Context(), req.Serial, req.Reason)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, wire.RevokeResponse{Revocation: revocation(*info.Revocation), Changed: info.Changed})
	return nil
}

func (h *handler) revoked(w http.ResponseWriter, r *http.Request) error {
	list, err := h.Access.Revocations(r.Context())
	if err != nil {
		return err
	}
	out := wire.RevocationsResponse{Revoked: []wire.Revocation{}}
	for _, e := range list {
		out.Revoked = append(out.Revoked, revocation(e))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func trustedCA(t fsm.TrustedCA) wire.TrustedCA {
	out := wire.TrustedCA{Fingerprint: t.Fingerprint, Name: t.Name, AddedAt: t.AddedAt / 1000,
		CertPEM: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: t.Cert}))}
	if c, err := x509.ParseCertificate(t.Cert); err == nil {
		out.Subject, out.NotAfter = c.Subject.String(), c.NotAfter.Unix()
	}
	return out
}

// trust lists the trust list (GET) or changes it (POST).
func (h *handler) trust(w http.ResponseWriter, r *http.Request) error {
	switch r.Method {
	case http.MethodGet, http.MethodHead: // HEAD: the GET without its body, as on every GET endpoint
		list, err := h.Access.TrustedCAs(r.Context())
		if err != nil {
			return err
		}
		out := wire.TrustListResponse{Trusted: []wire.TrustedCA{}}
		for _, t := range list {
			out.Trusted = append(out.Trusted, trustedCA(t))
		}
		writeJSON(w, http.StatusOK, out)
		return nil
	case http.MethodPost:
	default:
		w.Header().Set("Allow", "GET, HEAD, POST")
		return errcode.MethodNotAllowed.With("/v1/tc/trust needs GET (or HEAD) or POST")
	}
	var req wire.TrustRequest
	if err := h.decodeJSON(w, r, &req); err != nil {
		return err
	}
	var info *fsm.AuthInfo
	var err error
	switch {
	case req.Remove:
		info, err = h.Access.Untrust(r.Context(), req.Fingerprint)
	case req.CertPEM == "":
		return errcode.InvalidParams.With("cert_pem is required to add a CA")
	default:
		info, err = h.Access.Trust(r.Context(), req.Name, []byte(req.CertPEM))
	}
	if err != nil {
		return err
	}
	out := wire.TrustResponse{Changed: info.Changed}
	if info.Trust != nil && !req.Remove {
		t := trustedCA(*info.Trust)
		out.Trusted = &t
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
