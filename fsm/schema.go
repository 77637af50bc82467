package fsm

import (
	"bytes"
	"encoding/binary"
)

// Buckets of the state file. Every value is deterministic JSON (struct fields
// in declaration order) or raw bytes, so two nodes that applied the same log
// hold byte-identical buckets.
var (
	bucketMeta     = []byte("meta")      // applied index, replicated clock, counters
	bucketKeys     = []byte("keys")      // ns\0key -> KeyRecord
	bucketDocs     = []byte("docs")      // ns\0key -> committed JSON document
	bucketWaiters  = []byte("waiters")   // ns\0key\0seq -> Waiter (FIFO per key)
	bucketWaitReq  = []byte("wait_req")  // request id -> waiters key
	bucketLeaseExp = []byte("lease_exp") // expires_at|ns\0key -> nil
	bucketWaitExp  = []byte("wait_exp")  // deadline|waiters key -> nil
	bucketWaitTxn  = []byte("wait_txn")  // txn id\0waiters key -> nil
	bucketTxns     = []byte(".txns")     // txn id -> TxnRecord (the reserved .txns namespace)
	bucketTxnDone  = []byte("txn_done")  // decided_at|txn id -> nil
)

var allBuckets = [][]byte{bucketMeta, bucketKeys, bucketDocs, bucketWaiters, bucketWaitReq,
	bucketLeaseExp, bucketWaitExp, bucketWaitTxn, bucketTxns, bucketTxnDone,
	bucketTxnExp, bucketTxnFanout, bucketTxnDoubt, bucketTxnStaged, bucketTCTerms, bucketRMs,
	bucketQMsgs, bucketQBodies, bucketQReady, bucketQVis, bucketQTTL, bucketQWaiters, bucketQWaitReq, bucketQWaitExp, bucketQEnded, bucketQEndedAt, bucketQIdem, bucketQIdemAt, bucketQCounts,
	bucketRevoked, bucketTrust, bucketDistrust, bucketUTXORecs, bucketUTXOOuts, bucketUTXOHolds, bucketUTXOExp,
	bucketUTXODAH, bucketUTXOPreserve, bucketUTXOBlocks, bucketUTXOUndo, bucketUTXOStage}

var (
	metaApplied = []byte("applied") // index(8) term(8)
	metaNow     = []byte("now")     // replicated clock, Unix ms
	metaSeq     = []byte("seq")     // last waiter sequence number
	metaBackend = []byte("backend") // the island's backend hash
	metaVoters  = []byte("voters")  // the island's voter high-water mark
	metaRMs     = []byte("rms")     // when the RM registry last changed, Unix ms
	// metaMsgTokens is the highest fencing token any message was delivered
	// with (8 bytes): a restore raises every message's counter to it, since
	// a message the backup holds may have been delivered since and be gone.
	metaMsgTokens = []byte("msg_tokens")
	// metaKeyTokens is the highest fencing token of a forgotten key record
	// (8 bytes): a key without a record counts on from it.
	metaKeyTokens = []byte("key_tokens")
	// metaTxnForgot is the latest time (Unix ms, 8 bytes) at which a
	// transaction record the island has forgotten had been created, from
	// rules format 13 on; the adoption of those rules and a restore set it
	// to the latest time the island may have forgotten a record of (the
	// retention before, the replaced state's clock). A transaction the
	// island has no record of whose id was minted later was never known
	// here (TxnClockSkew aside).
	metaTxnForgot = []byte("txn_forgot")
	// metaRules is the newest entry format whose rules the island follows
	// (8 bytes; absent: formatV1). A sweep raises it once every server
	// applies that format (SweepCmd.Format); rules that changed with a
	// format apply from then on, on every node alike.
	metaRules = []byte("rules")
)

// Transaction states as recorded in .txns.
const (
	TxnPending  = "pending"
	TxnCommit   = "commit"
	TxnRollback = "rollback"
)

// Why a transaction was decided.
const (
	ReasonRelease = "release"
	ReasonExpired = "expired"
)

// KeyRecord is everything the state machine knows about one key except its
// document: the fencing counter (which never shrinks: a record that holds
// nothing else is forgotten only into the island's floor, ForgetKeysCmd),
// the committed state's metadata, the current lease, and how many acquirers
// are queued.
type KeyRecord struct {
	Fencing   int64  `json:"fencing"`
	Version   int64  `json:"version"`
	State     bool   `json:"state,omitempty"`
	ETag      string `json:"etag,omitempty"`
	Size      int64  `json:"size,omitempty"`
	UpdatedAt int64  `json:"updated_at,omitempty"`
	Lease     *Lease `json:"lease,omitempty"`
	Waiters   int64  `json:"waiters,omitempty"`
}

// Lease is a granted lease. Times are replicated Unix milliseconds.
type Lease struct {
	ID         string `json:"id"`
	TxnID      string `json:"txn"`
	Owner      string `json:"owner"`
	RequestID  string `json:"req,omitempty"`
	Token      int64  `json:"token"`
	TTL        int64  `json:"ttl"`
	AcquiredAt int64  `json:"acquired_at"`
	ExpiresAt  int64  `json:"expires_at"`
}

// Waiter is a queued acquire.
type Waiter struct {
	RequestID  string `json:"req"`
	LeaseID    string `json:"lease"`
	TxnID      string `json:"txn"`
	Owner      string `json:"owner"`
	TTL        int64  `json:"ttl"`
	Deadline   int64  `json:"deadline"`
	EnqueuedAt int64  `json:"enqueued_at"`
	Attempt    string `json:"attempt,omitempty"` // the attempt of the request that waits now
	Node       string `json:"node,omitempty"`    // the server where it waits
	Run        string `json:"run,omitempty"`     // and that server's run
}

// Participant is one resource enlisted in a transaction: a key of this
// island (Backend empty) or of the island named by Backend.
type Participant struct {
	Namespace string `json:"ns"`
	Key       string `json:"key"`
	Backend   string `json:"backend,omitempty"`
}

// TxnRecord is a transaction's entry in .txns: its participants and, once
// decided, the final decision. A decision is never changed afterwards.
//
// On the island coordinating it (Home empty), TCTerm is the Raft term of
// the entry that recorded the decision, Prepared and Acked list the other
// islands that prepared and applied it, and ExpiresAt is when a pending
// decision is presumed aborted. On a resource manager's island Home names
// the coordinating island, TCTerm its coordinator's term, and DoubtAt when
// to ask it for a decision that has not arrived.
type TxnRecord struct {
	ID           string        `json:"-"` // filled in by readers; the bucket key holds it
	State        string        `json:"state"`
	Reason       string        `json:"reason,omitempty"`
	Detail       string        `json:"detail,omitempty"`
	Participants []Participant `json:"participants"`
	CreatedAt    int64         `json:"created_at"`
	DecidedAt    int64         `json:"decided_at,omitempty"`
	Home         string        `json:"home,omitempty"`
	TCTerm       uint64        `json:"tc_term,omitempty"`
	ExpiresAt    int64         `json:"expires_at,omitempty"`
	DoubtAt      int64         `json:"doubt_at,omitempty"`
	StagedUntil  int64         `json:"staged_until,omitempty"` // the latest staged enqueue's hold on the transaction
	Prepared     []string      `json:"prepared,omitempty"`
	Acked        []string      `json:"acked,omitempty"`
	// Refused lists the islands among Acked that had decided the
	// transaction the other way before they were told the decision (rules
	// of format 14 on).
	Refused    []string `json:"refused,omitempty"`
	ReopenedAt int64    `json:"reopened_at,omitempty"` // islands were added after every island had applied the decision
	DoneAt     int64    `json:"done_at,omitempty"`     // every island had applied the decision (rules of format 8 on)
}

// retainedPast reports whether the retention of t, decided and applied
// everywhere, started after at: islands were added to it since the timer
// set at at, and acknowledged it later (DoneAt, from rules format 8 on) or
// not yet; before format 8 only a reopening after at counts.
func (t *TxnRecord) retainedPast(at int64) bool {
	if len(t.Unacked()) > 0 {
		return true
	}
	if t.DoneAt != 0 {
		return t.DoneAt > at
	}
	return t.ReopenedAt > at
}

// has reports whether (ns, key) of this island takes part in t.
func (t *TxnRecord) has(ns, key string) bool {
	for _, p := range t.Participants {
		if p.Backend == "" && p.Namespace == ns && p.Key == key {
			return true
		}
	}
	return false
}

// keyOf joins a namespace and key; neither may contain a NUL byte.
func keyOf(ns, key string) []byte {
	k := make([]byte, 0, len(ns)+len(key)+1)
	k = append(k, ns...)
	k = append(k, 0)
	return append(k, key...)
}

func splitKey(k []byte) (ns, key string) {
	i := bytes.IndexByte(k, 0)
	if i < 0 {
		return "", string(k)
	}
	return string(k[:i]), string(k[i+1:])
}

func waiterPrefix(k []byte) []byte {
	return append(bytes.Clone(k), 0)
}

func waiterKey(k []byte, seq uint64) []byte {
	return binary.BigEndian.AppendUint64(waiterPrefix(k), seq)
}

// waiterOwner recovers ns\0key from a waiters key.
func waiterOwner(wk []byte) []byte {
	if len(wk) < 9 {
		return nil
	}
	return wk[:len(wk)-9]
}

func txnWaiterKey(txn string, wk []byte) []byte {
	k := make([]byte, 0, len(txn)+1+len(wk))
	k = append(k, txn...)
	k = append(k, 0)
	return append(k, wk...)
}

// timerKey orders entries by time: when(8, big endian) followed by ref.
func timerKey(when int64, ref []byte) []byte {
	k := make([]byte, 8, 8+len(ref))
	binary.BigEndian.PutUint64(k, uint64(when))
	return append(k, ref...)
}

func splitTimer(k []byte) (int64, []byte) {
	if len(k) < 8 {
		return 0, nil
	}
	return int64(binary.BigEndian.Uint64(k[:8])), k[8:]
}

func u64(v []byte) uint64 {
	if len(v) < 8 {
		return 0
	}
	return binary.BigEndian.Uint64(v)
}

func putU64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }
