package wire

// Transaction states of /v1/txn/decide.
const (
	TxnStatePending  = "pending"
	TxnStateCommit   = "commit"
	TxnStateRollback = "rollback"
)

// TxnParticipant names one participant of a transaction: a key of the
// island whose backend hash is BackendHash (empty: the island serving the
// request).
type TxnParticipant struct {
	Namespace   string `json:"namespace"`
	Key         string `json:"key"`
	BackendHash string `json:"backend_hash,omitempty"`
}

// TxnDecisionRequest is the body of POST /v1/txn/decide (state pending,
// commit or rollback), of the resource manager endpoints /v1/txn/commit and
// /v1/txn/rollback, and of raftlockd's /v1/txn/prepare.
type TxnDecisionRequest struct {
	TxnID             string           `json:"txn_id"`
	State             string           `json:"state,omitempty"`
	Participants      []TxnParticipant `json:"participants,omitempty"`
	ExpiresAtUnix     int64            `json:"expires_at_unix,omitempty"`
	TCTerm            uint64           `json:"tc_term,omitempty"`
	TargetBackendHash string           `json:"target_backend_hash,omitempty"`
	// TCBackendHash names the coordinating island on calls from a
	// coordinator to another island's resource manager (raftlockd).
	TCBackendHash string `json:"tc_backend_hash,omitempty"`
	// Owner holds the keys a prepare locks, and a key held by this owner
	// is not a conflict (raftlockd).
	Owner string `json:"owner,omitempty"`
}

// TxnDecisionResponse answers the decision endpoints.
type TxnDecisionResponse struct {
	TxnID  string `json:"txn_id"`
	State  string `json:"state"`
	TCTerm uint64 `json:"tc_term,omitempty"` // the coordinator's term (raftlockd)
}

// TxnReplayRequest is the body of POST /v1/txn/replay.
type TxnReplayRequest struct {
	TxnID string `json:"txn_id"`
}

// TxnReplayResponse answers POST /v1/txn/replay.
type TxnReplayResponse struct {
	TxnID  string `json:"txn_id"`
	State  string `json:"state"`
	TCTerm uint64 `json:"tc_term,omitempty"` // the coordinator's term (raftlockd)
}

// TxnStatusResponse answers raftlockd's GET /v1/txn/status.
type TxnStatusResponse struct {
	TxnID         string           `json:"txn_id"`
	State         string           `json:"state"`
	Reason        string           `json:"reason,omitempty"`
	Detail        string           `json:"detail,omitempty"`
	BackendHash   string           `json:"backend_hash"`              // the island answering
	TCBackendHash string           `json:"tc_backend_hash,omitempty"` // the coordinating island
	TCTerm        uint64           `json:"tc_term,omitempty"`
	ExpiresAtUnix int64            `json:"expires_at_unix,omitempty"`
	Participants  []TxnParticipant `json:"participants"`
	Prepared      []string         `json:"prepared,omitempty"` // islands that prepared
	Acked         []string         `json:"acked,omitempty"`    // islands that applied the decision
	Refused       []string         `json:"refused,omitempty"`  // of those, islands that had decided it the other way
}

// TCRMRegisterRequest is the body of POST /v1/tc/rm/register.
type TCRMRegisterRequest struct {
	BackendHash string `json:"backend_hash"`
	Endpoint    string `json:"endpoint"`
	// PassedOn marks a change one island's coordinator passes on to
	// another, which passes it on further only when it changed its
	// registry (raftlockd).
	PassedOn bool `json:"passed_on,omitempty"`
	// ChangedAtUnixMs is, with PassedOn, when the change was originally
	// made (Unix ms): an island takes it only if it is newer than what it
	// records for the endpoint. Absent (0) it is older than anything
	// recorded (raftlockd).
	ChangedAtUnixMs int64 `json:"changed_at_unix_ms,omitempty"`
}

// TCRMRegisterResponse answers POST /v1/tc/rm/register.
type TCRMRegisterResponse struct {
	BackendHash   string   `json:"backend_hash"`
	Endpoints     []string `json:"endpoints"`
	UpdatedAtUnix int64    `json:"updated_at_unix"`
}

// TCRMUnregisterRequest is the body of POST /v1/tc/rm/unregister.
type TCRMUnregisterRequest = TCRMRegisterRequest

// TCRMUnregisterResponse answers POST /v1/tc/rm/unregister.
type TCRMUnregisterResponse = TCRMRegisterResponse

// TCRMBackend is one island of the RM registry.
type TCRMBackend struct {
	BackendHash   string   `json:"backend_hash"`
	Endpoints     []string `json:"endpoints"`
	UpdatedAtUnix int64    `json:"updated_at_unix"`
}

// TCRMListResponse answers GET /v1/tc/rm/list.
type TCRMListResponse struct {
	Backends      []TCRMBackend `json:"backends"`
	UpdatedAtUnix int64         `json:"updated_at_unix"`
}
