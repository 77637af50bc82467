package wire

// The island's access lists: /v1/auth/revoke and /v1/auth/revoked (the
// certificate denylist), /v1/tc/trust (the CAs allowed to call the
// coordinator and resource-manager endpoints).

// RevokeRequest puts a certificate serial (hex) on the denylist.
type RevokeRequest struct {
	Serial string `json:"serial"`
	Reason string `json:"reason,omitempty"`
}

// Revocation is a denylist entry.
type Revocation struct {
	Serial    string `json:"serial"`
	Reason    string `json:"reason,omitempty"`
	RevokedAt int64  `json:"revoked_at"` // Unix seconds
}

// RevokeResponse reports the entry; Changed is false when the serial was
// already revoked.
type RevokeResponse struct {
	Revocation Revocation `json:"revocation"`
	Changed    bool       `json:"changed"`
}

// RevocationsResponse lists the denylist.
type RevocationsResponse struct {
	Revoked []Revocation `json:"revoked"`
}

// TrustRequest adds a CA (PEM: a certificate or a CA bundle) to the trust
// list, or with Remove drops the CA with Fingerprint.
type TrustRequest struct {
	Name        string `json:"name,omitempty"`
	CertPEM     string `json:"cert_pem,omitempty"`
	Fingerprint string `json:"fingerprint,omitempty"`
	Remove      bool   `json:"remove,omitempty"`
}

// TrustedCA is a trust list entry.
type TrustedCA struct {
	Fingerprint string `json:"fingerprint"`
	Name        string `json:"name,omitempty"`
	Subject     string `json:"subject"`
	NotAfter    int64  `json:"not_after"` // Unix seconds
	AddedAt     int64  `json:"added_at"`  // Unix seconds
	CertPEM     string `json:"cert_pem"`
}

// TrustResponse reports the entry (empty after a removal).
type TrustResponse struct {
	Trusted *TrustedCA `json:"trusted,omitempty"`
	Changed bool       `json:"changed"`
}

// TrustListResponse lists the trust list.
type TrustListResponse struct {
	Trusted []TrustedCA `json:"trusted"`
}
