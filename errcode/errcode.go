// Package errcode owns raftlockd's stable error codes: every rejection the
// state machine, the services and the HTTP API can produce is an *Error with a
// code from this file. The codes are part of the wire contract (they travel in
// the lockd-compatible error envelope), so they live in one leaf package that
// the FSM, the HTTP layer and the Go client can all import. How a code maps to
// an HTTP status is decided in exactly one place: package api.
package errcode

import (
	"errors"
	"fmt"
)

// Error is a rejection with a stable code. It is a value that can be copied,
// compared with errors.Is (by code) and serialised.
type Error struct {
	Code           string `json:"error"`
	Detail         string `json:"detail,omitempty"`
	CurrentVersion int64  `json:"current_version,omitempty"`
	CurrentETag    string `json:"current_etag,omitempty"`
	RetryAfter     int64  `json:"retry_after_seconds,omitempty"`
	LeaderEndpoint string `json:"leader_endpoint,omitempty"`
}

func (e *Error) Error() string {
	if e.Detail == "" {
		return e.Code
	}
	return e.Code + ": " + e.Detail
}

// Is reports whether target is an *Error with the same code, so that
// errors.Is(err, errcode.LeaseRequired) works on copies carrying details.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && e != nil && t != nil && t.Code == e.Code
}

// With returns a copy of e carrying a formatted detail message.
func (e *Error) With(format string, args ...any) *Error {
	c := *e
	c.Detail = fmt.Sprintf(format, args...)
	return &c
}

// Code returns the stable code of err, or "" when err carries none.
func Code(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

func code(c string) *Error { return &Error{Code: c} }

// Request shape.
var (
	InvalidBody        = code("invalid_body")
	MissingBody        = code("missing_body")
	RequestTooLarge    = code("request_too_large")
	StateTooLarge      = code("state_too_large")
	MissingKey         = code("missing_key")
	InvalidKey         = code("invalid_key")
	InvalidNamespace   = code("invalid_namespace")
	MissingOwner       = code("missing_owner")
	InvalidTTL         = code("invalid_ttl")
	InvalidBlock       = code("invalid_block")
	MissingLease       = code("missing_lease")
	InvalidLease       = code("invalid_lease")
	MissingTxn         = code("missing_txn")
	InvalidTxn         = code("invalid_txn")
	InvalidVersion     = code("invalid_version")
	MissingFencing     = code("missing_fencing_token")
	InvalidFencing     = code("invalid_fencing_token")
	InvalidIdempotency = code("invalid_idempotency_key")
	ChecksumMismatch   = code("checksum_mismatch")
	SizeMismatch       = code("size_mismatch")
	InvalidParams      = code("invalid_params")
	NotFound           = code("not_found")
	MethodNotAllowed   = code("method_not_allowed")
)

// Cluster administration.
var (
	InvalidSnapshot = code("invalid_snapshot") // an uploaded backup is not a raftlockd state file
	InvalidEndpoint = code("invalid_endpoint") // not an http(s) URL of a member's API
	LastVoter       = code("last_voter")       // the change would leave the cluster without a voter
)

// Lease ownership.
var (
	LeaseRequired   = code("lease_required")
	LeaseExpired    = code("lease_expired")
	FencingMismatch = code("fencing_mismatch")
	TxnMismatch     = code("txn_mismatch")
)

// Conflicts.
var (
	Waiting         = code("waiting")
	AlreadyExists   = code("already_exists")
	VersionConflict = code("version_conflict")
	ETagMismatch    = code("etag_mismatch")
	TxnCommitted    = code("txn_committed")
	TxnRolledBack   = code("txn_rolled_back")
	TxnTooLarge     = code("txn_too_large")
)

// Availability.
var (
	NoLeader      = code("no_leader")
	NotLeader     = code("not_leader")
	ShuttingDown  = code("shutdown_draining")
	Internal      = code("internal_error")
	MalformedCmd  = code("malformed_command")
	UnknownCmd    = code("unknown_command")
	NotReady      = code("not_ready")
	Unavailable   = code("unavailable")
	RequestCancel = code("request_cancelled")
)
