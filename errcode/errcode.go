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
	"slices"
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
	// Home names the island coordinating a transaction (txn_coordinated,
	// txn_not_home); it is not part of lockd's envelope.
	Home string `json:"home_backend_hash,omitempty"`
	// Island names the island that answered a txn_backend_mismatch
	// refusing a request meant for another island (the endpoint it was
	// sent to is not that island's); it is not part of lockd's envelope.
	Island string `json:"backend_hash,omitempty"`
	// TxnID names the transaction of a txn_coordinated refusal.
	TxnID string `json:"txn_id,omitempty"`
	// Spends and Outpoints list the failed items of a UTXO spend
	// (utxo_spend_failed) or outpoint operation (utxo_outpoint_failed).
	Spends    []Item `json:"spends,omitempty"`
	Outpoints []Item `json:"outpoints,omitempty"`
}

// Item is one failed item of a UTXO operation: its index in the request
// and its code (for SPENT also the spender holding the output).
type Item struct {
	Index        int     `json:"index"`
	Code         string  `json:"code"`
	SpendingTxID string  `json:"spending_txid,omitempty"`
	Vin          *uint32 `json:"vin,omitempty"`
	// A block's item: Index is the transaction's position in the block,
	// TxID names it and Input is the failing input (absent when the
	// transaction itself failed).
	TxID  string  `json:"txid,omitempty"`
	Input *uint32 `json:"input,omitempty"`
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

func code(c string) *Error {
	all = append(all, c)
	return &Error{Code: c}
}

// all lists every code of this package, in declaration order.
var all []string

// All returns every code this package defines.
func All() []string { return slices.Clone(all) }

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
	InvalidChecksum    = code("invalid_expected_sha256") // X-Expected-SHA256 is not 64 hex digits
	InvalidSize        = code("invalid_expected_bytes")  // X-Expected-Bytes is not a non-negative integer
	InvalidTimeout     = code("invalid_timeout")         // X-Raftlockd-Timeout is not a positive duration
	InvalidParams      = code("invalid_params")
	NotFound           = code("not_found")
	MethodNotAllowed   = code("method_not_allowed")
	TLSRequired        = code("tls_required") // a plain-HTTP request reached a port that speaks TLS
)

// Cluster administration.
var (
	InvalidSnapshot = code("invalid_snapshot") // an uploaded backup is not a raftlockd state file
	InvalidEndpoint = code("invalid_endpoint") // not an http(s) URL of a member's API
	LastVoter       = code("last_voter")       // the change would leave the cluster without a voter
)

// Authentication (the certificate a caller presented) and authorisation
// (what it allows).
var (
	CertificateRequired  = code("certificate_required")  // no client certificate was presented
	CertificateUntrusted = code("certificate_untrusted") // not signed by a CA this island trusts for the endpoint
	CertificateExpired   = code("certificate_expired")   // outside its validity period
	CertificateRevoked   = code("certificate_revoked")   // its serial is on the island's denylist
	RoleForbidden        = code("role_forbidden")        // its role may not call this endpoint
	NamespaceForbidden   = code("namespace_forbidden")   // its permissions do not cover the namespace
	InvalidCertificate   = code("invalid_certificate")   // an uploaded certificate cannot be used
)

// Lease ownership.
var (
	LeaseRequired   = code("lease_required")
	LeaseExpired    = code("lease_expired")
	FencingMismatch = code("fencing_mismatch")
	TxnMismatch     = code("txn_mismatch")
	// LeaseMismatch: a release named a lease or fencing token that does not
	// hold the key while the transaction it named is still open, so nothing
	// was released or committed.
	LeaseMismatch = code("lease_mismatch")
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
	// The body sent does not match X-Expected-SHA256 / X-Expected-Bytes.
	ChecksumMismatch = code("expected_sha256_mismatch")
	SizeMismatch     = code("expected_bytes_mismatch")
)

// Queues.
var (
	QueueEmpty           = code("queue_empty")                  // nothing ready (within the wait)
	QueueMessageNotFound = code("queue_message_not_found")      // no such message
	QueueLeaseMismatch   = code("queue_message_lease_mismatch") // the delivery's lease or token is not the caller's
	InvalidQueue         = code("invalid_queue")
	PayloadTooLarge      = code("payload_too_large")
)

// UTXO records.
var (
	InvalidTxID        = code("invalid_txid")         // not 64 hex digits
	InvalidUTXOHash    = code("invalid_utxo_hash")    // not 64 hex digits
	DuplicateVout      = code("duplicate_vout")       // an output index given twice
	InvalidUTXORequest = code("invalid_utxo_request") // a malformed UTXO request (empty, out of range, duplicates)
	TxExists           = code("tx_exists")            // the transaction exists or is being created
	TxNotFound         = code("tx_not_found")         // no such transaction
	UTXOSpendFailed    = code("utxo_spend_failed")    // a spend item failed: nothing was spent
	UTXOUpdateFailed   = code("utxo_outpoint_failed") // an outpoint item failed: nothing changed
	InvalidUTXOBlock   = code("invalid_utxo_block")   // a malformed block or rollback request
	BlockNotOnTip      = code("block_not_on_tip")     // the block's prev_hash is not the last applied block
	BlockRejected      = code("block_rejected")       // a transaction or input of the block failed: nothing was applied
	// BlockRollbackWindow: the rollback reaches below the oldest block
	// whose undo delta is kept.
	BlockRollbackWindow = code("block_beyond_rollback_window")
)

// Transactions across islands.
var (
	TxnPending         = code("txn_pending")          // no final decision recorded for the transaction
	TxnBackendMismatch = code("txn_backend_mismatch") // the request names another island
	TxnBackendUnknown  = code("txn_backend_unknown")  // a participant's island has no RM registered
	TCTermStale        = code("tc_term_stale")        // a coordinator term older than one already seen
	TxnLockConflict    = code("txn_lock_conflict")    // a participant is held by another transaction: LOCKED:<holder>
	TxnNotHome         = code("txn_not_home")         // this island is a resource manager, not the coordinator
	TxnCoordinated     = code("txn_coordinated")      // the transaction spans islands; its coordinator decides it
	TxnFanoutFailed    = code("txn_fanout_failed")    // decision recorded, but an island did not apply it yet
	TxnOutcomeMixed    = code("txn_outcome_mixed")    // decision recorded, but an island had decided the other way
	TCRMReplication    = code("tc_rm_replication_failed")
	TxnUnreachable     = code("txn_island_unreachable") // an island of the transaction did not answer; retry
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
