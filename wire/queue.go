package wire

import "encoding/json"

// Queue vocabulary: the bodies of /v1/queue/..., named as lockd's api
// package names them.

// Nack intents.
const (
	NackIntentFailure = "failure" // a failed delivery: counts against max_attempts
	NackIntentDefer   = "defer"   // handed back on purpose: does not count
)

// DeadLetterSuffix names a queue's dead-letter queue: "<queue>.dlq".
const DeadLetterSuffix = ".dlq"

// BlockNoWait as wait_seconds answers at once when nothing is ready.
const BlockNoWait int64 = -1

// Multipart part names of enqueue requests and delivery responses.
const (
	PartMeta    = "meta"
	PartPayload = "payload"
	PartState   = "state" // dequeueWithState/subscribeWithState with include_state=1 (raftlockd)
)

// EnqueueRequest is the JSON "meta" part of POST /v1/queue/enqueue.
type EnqueueRequest struct {
	Namespace                string          `json:"namespace,omitempty"`
	Queue                    string          `json:"queue,omitempty"`
	DelaySeconds             int64           `json:"delay_seconds,omitempty"`
	VisibilityTimeoutSeconds int64           `json:"visibility_timeout_seconds,omitempty"`
	TTLSeconds               int64           `json:"ttl_seconds,omitempty"`
	MaxAttempts              int             `json:"max_attempts,omitempty"`
	Attributes               json.RawMessage `json:"attributes,omitempty"`
	PayloadContentType       string          `json:"payload_content_type,omitempty"`
	TxnID                    string          `json:"txn_id,omitempty"`
}

// EnqueueResponse is the body answered by POST /v1/queue/enqueue.
type EnqueueResponse struct {
	Namespace                string `json:"namespace,omitempty"`
	Queue                    string `json:"queue"`
	MessageID                string `json:"message_id"`
	Attempts                 int    `json:"attempts"`
	MaxAttempts              int    `json:"max_attempts"`
	FailureAttempts          int    `json:"failure_attempts"`
	NotVisibleUntilUnix      int64  `json:"not_visible_until_unix"`
	VisibilityTimeoutSeconds int64  `json:"visibility_timeout_seconds"`
	PayloadBytes             int64  `json:"payload_bytes"`
	CorrelationID            string `json:"correlation_id,omitempty"`
}

// DequeueRequest is the body of POST /v1/queue/dequeue, dequeueWithState,
// subscribe and subscribeWithState.
type DequeueRequest struct {
	Namespace                string `json:"namespace,omitempty"`
	Queue                    string `json:"queue,omitempty"`
	Owner                    string `json:"owner,omitempty"`
	VisibilityTimeoutSeconds int64  `json:"visibility_timeout_seconds,omitempty"`
	WaitSeconds              int64  `json:"wait_seconds,omitempty"`
	PageSize                 int    `json:"page_size,omitempty"`
	StartAfter               string `json:"start_after,omitempty"`
	TxnID                    string `json:"txn_id,omitempty"`
}

// Message describes a delivered (or enqueued) message: lockd's api.Message.
type Message struct {
	Namespace                string          `json:"namespace,omitempty"`
	Queue                    string          `json:"queue"`
	MessageID                string          `json:"message_id"`
	Attempts                 int             `json:"attempts"`
	MaxAttempts              int             `json:"max_attempts"`
	FailureAttempts          int             `json:"failure_attempts"`
	NotVisibleUntilUnix      int64           `json:"not_visible_until_unix"`
	VisibilityTimeoutSeconds int64           `json:"visibility_timeout_seconds"`
	Attributes               json.RawMessage `json:"attributes,omitempty"`
	PayloadContentType       string          `json:"payload_content_type,omitempty"`
	PayloadBytes             int64           `json:"payload_bytes"`
	CorrelationID            string          `json:"correlation_id,omitempty"`
	LeaseID                  string          `json:"lease_id"`
	LeaseExpiresAtUnix       int64           `json:"lease_expires_at_unix"`
	FencingToken             int64           `json:"fencing_token"`
	TxnID                    string          `json:"txn_id,omitempty"`
	// MetaETag is the delivery's fencing token in decimal: it changes with
	// every delivery of the message and with nothing else.
	MetaETag                string `json:"meta_etag"`
	StateETag               string `json:"state_etag,omitempty"`
	StateLeaseID            string `json:"state_lease_id,omitempty"`
	StateLeaseExpiresAtUnix int64  `json:"state_lease_expires_at_unix,omitempty"`
	StateFencingToken       int64  `json:"state_fencing_token,omitempty"`
	StateTxnID              string `json:"state_txn_id,omitempty"`
}

// DequeueResponse is the JSON "meta" part of a delivery.
type DequeueResponse struct {
	Message    *Message `json:"message,omitempty"`
	NextCursor string   `json:"next_cursor,omitempty"`
}

// AckRequest is the body of POST /v1/queue/ack.
type AckRequest struct {
	Namespace         string `json:"namespace,omitempty"`
	Queue             string `json:"queue"`
	MessageID         string `json:"message_id"`
	LeaseID           string `json:"lease_id"`
	FencingToken      int64  `json:"fencing_token,omitempty"`
	MetaETag          string `json:"meta_etag,omitempty"`
	StateETag         string `json:"state_etag,omitempty"`
	StateLeaseID      string `json:"state_lease_id,omitempty"`
	StateFencingToken int64  `json:"state_fencing_token,omitempty"`
	TxnID             string `json:"txn_id,omitempty"`
}

// AckResponse is the body answered by POST /v1/queue/ack.
type AckResponse struct {
	Acked         bool   `json:"acked"`
	CorrelationID string `json:"correlation_id,omitempty"`
}

// NackRequest is the body of POST /v1/queue/nack.
type NackRequest struct {
	Namespace         string          `json:"namespace,omitempty"`
	Queue             string          `json:"queue"`
	MessageID         string          `json:"message_id"`
	LeaseID           string          `json:"lease_id"`
	FencingToken      int64           `json:"fencing_token,omitempty"`
	MetaETag          string          `json:"meta_etag,omitempty"`
	Intent            string          `json:"intent,omitempty"` // failure (default) or defer
	DelaySeconds      int64           `json:"delay_seconds,omitempty"`
	LastError         json.RawMessage `json:"last_error,omitempty"`
	StateETag         string          `json:"state_etag,omitempty"`
	StateLeaseID      string          `json:"state_lease_id,omitempty"`
	StateFencingToken int64           `json:"state_fencing_token,omitempty"`
	TxnID             string          `json:"txn_id,omitempty"`
}

// NackResponse is the body answered by POST /v1/queue/nack.
type NackResponse struct {
	Requeued      bool   `json:"requeued"`
	MetaETag      string `json:"meta_etag"`
	CorrelationID string `json:"correlation_id,omitempty"`
	// DeadLetterQueue names the queue the message moved to when this was
	// its last allowed failure (raftlockd).
	DeadLetterQueue string `json:"dead_letter_queue,omitempty"`
}

// ExtendRequest is the body of POST /v1/queue/extend.
type ExtendRequest struct {
	Namespace         string `json:"namespace,omitempty"`
	Queue             string `json:"queue"`
	MessageID         string `json:"message_id"`
	LeaseID           string `json:"lease_id"`
	FencingToken      int64  `json:"fencing_token,omitempty"`
	MetaETag          string `json:"meta_etag,omitempty"`
	ExtendBySeconds   int64  `json:"extend_by_seconds,omitempty"`
	StateLeaseID      string `json:"state_lease_id,omitempty"`
	StateFencingToken int64  `json:"state_fencing_token,omitempty"`
	TxnID             string `json:"txn_id,omitempty"`
}

// ExtendResponse is the body answered by POST /v1/queue/extend.
type ExtendResponse struct {
	LeaseExpiresAtUnix       int64  `json:"lease_expires_at_unix"`
	VisibilityTimeoutSeconds int64  `json:"visibility_timeout_seconds"`
	MetaETag                 string `json:"meta_etag"`
	StateLeaseExpiresAtUnix  int64  `json:"state_lease_expires_at_unix,omitempty"`
	CorrelationID            string `json:"correlation_id,omitempty"`
}

// QueueStatsRequest is the body of POST /v1/queue/stats.
type QueueStatsRequest struct {
	Namespace string `json:"namespace,omitempty"`
	Queue     string `json:"queue,omitempty"`
}

// QueueStatsResponse is the body answered by POST /v1/queue/stats: lockd's
// fields, then raftlockd's counts.
type QueueStatsResponse struct {
	Namespace               string `json:"namespace"`
	Queue                   string `json:"queue"`
	Available               bool   `json:"available"`
	HeadMessageID           string `json:"head_message_id,omitempty"`
	HeadEnqueuedAtUnix      int64  `json:"head_enqueued_at_unix,omitempty"`
	HeadNotVisibleUntilUnix int64  `json:"head_not_visible_until_unix,omitempty"`
	HeadAgeSeconds          int64  `json:"head_age_seconds,omitempty"`
	WaitingConsumers        int    `json:"waiting_consumers"`
	PendingCandidates       int    `json:"pending_candidates"`
	TotalConsumers          int    `json:"total_consumers"`
	HasActiveWatcher        bool   `json:"has_active_watcher"`
	CorrelationID           string `json:"correlation_id,omitempty"`

	Ready           int `json:"ready"`
	InFlight        int `json:"in_flight"`
	Delayed         int `json:"delayed"`
	Staged          int `json:"staged"`
	DeadLetterReady int `json:"dead_letter_ready"`
}
