// Package wire owns raftlockd's HTTP protocol vocabulary: the JSON request and
// response bodies and the header names of the v1 API. The shapes follow
// lockd's v1 OpenAPI description field for field, so that lockd clients work
// unchanged. Both the server (package api) and the Go client (package client)
// import it, which keeps the two sides from drifting apart.
package wire

// Header names, spelled exactly as lockd clients send and read them.
const (
	HeaderLeaseID        = "X-Lease-ID"
	HeaderTxnID          = "X-Txn-ID"
	HeaderFencingToken   = "X-Fencing-Token"
	HeaderIfVersion      = "X-If-Version"
	HeaderIfStateETag    = "X-If-State-ETag"
	HeaderExpectedSHA256 = "X-Expected-SHA256"
	HeaderExpectedBytes  = "X-Expected-Bytes"
	HeaderKeyVersion     = "X-Key-Version"
	HeaderETag           = "ETag"
	HeaderCorrelationID  = "X-Correlation-Id"
	HeaderIdempotencyKey = "X-Idempotency-Key"
	HeaderRetryAfter     = "Retry-After"
	HeaderServedBy       = "X-Raftlockd-Node"
	HeaderLeader         = "X-Raftlockd-Leader" // the Raft leader's node id, when the serving node knows it
	HeaderSnapshotIndex  = "X-Raftlockd-Snapshot-Index"
	// HeaderSnapshotSHA256 carries the hex SHA-256 of a saved snapshot's
	// stream; a restore upload names it in X-Expected-SHA256.
	HeaderSnapshotSHA256 = "X-Raftlockd-Snapshot-Sha256"
	// HeaderForwardedBy marks a request a follower passed on to the leader;
	// the node receiving it serves it or refuses, and never passes it on again.
	HeaderForwardedBy = "X-Raftlockd-Forwarded-By"
	// HeaderTimeout carries how long the client still waits for the answer
	// (a Go duration such as "1.5s"); the server gives up on the request,
	// including its forwarding to the leader, when that time has passed.
	HeaderTimeout = "X-Raftlockd-Timeout"
	// HeaderTargetBackend names the island a decide or replay is meant for
	// (an island asking its coordinator's island): a server of another
	// island answers txn_backend_mismatch instead. A header rather than a
	// field of lockd's bodies, which builds without it refuse.
	HeaderTargetBackend = "X-Raftlockd-Target-Backend"
)

// DefaultNamespace is used when a request names none.
const DefaultNamespace = "default"

// AcquireRequest is the body of POST /v1/acquire.
type AcquireRequest struct {
	Namespace   string `json:"namespace,omitempty"`
	Key         string `json:"key,omitempty"`
	Owner       string `json:"owner,omitempty"`
	TTLSeconds  int64  `json:"ttl_seconds,omitempty"`
	BlockSecs   int64  `json:"block_seconds,omitempty"`
	IfNotExists bool   `json:"if_not_exists,omitempty"`
	TxnID       string `json:"txn_id,omitempty"`
}

// AcquireResponse is the body answered by POST /v1/acquire.
type AcquireResponse struct {
	Namespace     string `json:"namespace"`
	LeaseID       string `json:"lease_id"`
	TxnID         string `json:"txn_id"`
	Key           string `json:"key"`
	Owner         string `json:"owner"`
	ExpiresAt     int64  `json:"expires_at_unix"`
	Version       int64  `json:"version"`
	StateETag     string `json:"state_etag,omitempty"`
	FencingToken  int64  `json:"fencing_token"`
	RetryAfter    int64  `json:"retry_after_seconds,omitempty"`
	CorrelationID string `json:"correlation_id,omitempty"`
}

// KeepAliveRequest is the body of POST /v1/keepalive.
type KeepAliveRequest struct {
	Namespace  string `json:"namespace,omitempty"`
	Key        string `json:"key,omitempty"`
	LeaseID    string `json:"lease_id,omitempty"`
	TTLSeconds int64  `json:"ttl_seconds,omitempty"`
	TxnID      string `json:"txn_id,omitempty"`
}

// KeepAliveResponse is the body answered by POST /v1/keepalive.
type KeepAliveResponse struct {
	ExpiresAt int64 `json:"expires_at_unix"`
}

// ReleaseRequest is the body of POST /v1/release.
type ReleaseRequest struct {
	Namespace string `json:"namespace,omitempty"`
	Key       string `json:"key,omitempty"`
	LeaseID   string `json:"lease_id,omitempty"`
	TxnID     string `json:"txn_id"`
	Rollback  bool   `json:"rollback,omitempty"`
}

// ReleaseResponse is the body answered by POST /v1/release.
type ReleaseResponse struct {
	Released bool `json:"released"`
}

// MetadataAttributes mirrors lockd's metadata object; raftlockd reports it
// but has no metadata mutations yet.
type MetadataAttributes struct {
	QueryHidden *bool `json:"query_hidden,omitempty"`
}

// UpdateResponse is the body answered by POST /v1/update.
type UpdateResponse struct {
	NewVersion   int64              `json:"new_version"`
	NewStateETag string             `json:"new_state_etag"`
	Bytes        int64              `json:"bytes"`
	Metadata     MetadataAttributes `json:"metadata"`
}

// RemoveResponse is the body answered by POST /v1/remove.
type RemoveResponse struct {
	Removed    bool  `json:"removed"`
	NewVersion int64 `json:"new_version"`
}

// DescribeResponse is the body answered by GET /v1/describe.
type DescribeResponse struct {
	Namespace    string             `json:"namespace"`
	Key          string             `json:"key"`
	Owner        string             `json:"owner,omitempty"`
	LeaseID      string             `json:"lease_id,omitempty"`
	TxnID        string             `json:"txn_id,omitempty"`
	FencingToken int64              `json:"fencing_token,omitempty"`
	ExpiresAt    int64              `json:"expires_at_unix,omitempty"`
	Version      int64              `json:"version"`
	StateETag    string             `json:"state_etag,omitempty"`
	UpdatedAt    int64              `json:"updated_at_unix,omitempty"`
	Waiters      int64              `json:"waiters,omitempty"`
	Metadata     MetadataAttributes `json:"metadata"`
}

// ClusterStatusResponse is the body answered by GET /v1/cluster/status:
// the serving node's view of its Raft group.
type ClusterStatusResponse struct {
	NodeID         string `json:"node_id"`
	RaftAddr       string `json:"raft_addr"`
	State          string `json:"state"`
	LeaderID       string `json:"leader_id,omitempty"`
	LeaderEndpoint string `json:"leader_endpoint,omitempty"`
	LeaderRaftAddr string `json:"leader_raft_addr,omitempty"`
	Term           uint64 `json:"term"`
	LastIndex      uint64 `json:"last_index"`
	LastLogTerm    uint64 `json:"last_log_term"`
	CommitIndex    uint64 `json:"commit_index"`
	AppliedIndex   uint64 `json:"applied_index"`
	LastContactMs  int64  `json:"last_contact_ms"`
	BackendHash    string `json:"backend_hash,omitempty"`
	Joining        bool   `json:"joining,omitempty"` // catching up after joining: takes no part in elections yet
}

// RaftStatus is a server's Raft progress as that server reports it.
type RaftStatus struct {
	State         string `json:"state"`
	Term          uint64 `json:"term"`
	LastContactMs int64  `json:"last_contact_ms"`
	AppliedIndex  uint64 `json:"applied_index"`
	CommitIndex   uint64 `json:"commit_index"`
	LastIndex     uint64 `json:"last_index"`
	Joining       bool   `json:"joining,omitempty"` // catching up after joining: takes no part in elections yet
}

// ClusterMember is one server of GET /v1/cluster/members: every server of
// the Raft configuration and every server gossip knows.
type ClusterMember struct {
	ID           string      `json:"id"`
	RaftAddr     string      `json:"raft_addr,omitempty"`
	APIEndpoint  string      `json:"api_endpoint,omitempty"`
	GossipStatus string      `json:"gossip_status"` // alive, dead or unknown
	Suffrage     string      `json:"suffrage"`      // voter, nonvoter or none (not in the Raft configuration)
	Leader       bool        `json:"leader"`
	Raft         *RaftStatus `json:"raft,omitempty"`  // absent when the server could not be asked
	Error        string      `json:"error,omitempty"` // why the server could not be asked
}

// ClusterMembersResponse is the body answered by GET /v1/cluster/members.
type ClusterMembersResponse struct {
	LeaderID       string          `json:"leader_id,omitempty"`
	LeaderEndpoint string          `json:"leader_endpoint,omitempty"`
	Members        []ClusterMember `json:"members"`
}

// RemovePeerRequest is the body of POST /v1/cluster/remove-peer.
type RemovePeerRequest struct {
	ID string `json:"id"`
}

// RemovePeerResponse is the body answered by POST /v1/cluster/remove-peer.
type RemovePeerResponse struct {
	Removed bool   `json:"removed"`
	ID      string `json:"id"`
	// Running says the removed server is still up (gossip sees it alive):
	// it serves nothing until it is restarted, and rejoins then.
	Running bool `json:"running,omitempty"`
}

// LeaveResponse is the body answered by POST /v1/cluster/leave.
type LeaveResponse struct {
	Left   bool   `json:"left"`
	NodeID string `json:"node_id"`
}

// RestoreResponse is the body answered by POST /v1/cluster/snapshot.
type RestoreResponse struct {
	Restored bool   `json:"restored"`
	Bytes    int64  `json:"bytes"`
	Index    uint64 `json:"snapshot_index"` // the applied index recorded in the restored file
}

// TCLeaderResponse is the body answered by GET /v1/tc/leader (lockd's
// api.TCLeaderResponse).
type TCLeaderResponse struct {
	LeaderID       string `json:"leader_id"`
	LeaderEndpoint string `json:"leader_endpoint"`
	Term           uint64 `json:"term"`
	ExpiresAt      int64  `json:"expires_at"`
}

// TCClusterListResponse is the body answered by GET /v1/tc/cluster/list
// (lockd's api.TCClusterListResponse).
type TCClusterListResponse struct {
	Endpoints []string `json:"endpoints"`
	UpdatedAt int64    `json:"updated_at_unix"`
}

// TCClusterAnnounceRequest is the body of POST /v1/tc/cluster/announce.
type TCClusterAnnounceRequest struct {
	SelfEndpoint string `json:"self_endpoint"`
}

// TCClusterAnnounceResponse is the body answered by POST
// /v1/tc/cluster/announce.
type TCClusterAnnounceResponse struct {
	Endpoints []string `json:"endpoints"`
	ExpiresAt int64    `json:"expires_at_unix"`
	UpdatedAt int64    `json:"updated_at_unix"`
}

// TCClusterLeaveRequest is the body of POST /v1/tc/cluster/leave. lockd
// sends an empty object (the caller leaves); raftlockd also accepts the
// endpoint of the member that is to leave.
type TCClusterLeaveRequest struct {
	SelfEndpoint string `json:"self_endpoint,omitempty"`
}

// TCClusterLeaveResponse is the body answered by POST /v1/tc/cluster/leave.
type TCClusterLeaveResponse struct {
	Endpoints []string `json:"endpoints"`
	UpdatedAt int64    `json:"updated_at_unix"`
}
