package wire

import (
	"bytes"
	"encoding/json"
)

// Bodies of the /v1/utxo/... endpoints. Transaction ids and hashes travel as
// lowercase hex: a txid is 64 characters (32 bytes), a utxo_hash too.

// UTXONamespace is the namespace a client certificate must be allowed
// (read for GET /v1/utxo/tx, read-write for the rest) to use the UTXO
// endpoints.
const UTXONamespace = "utxo"

// UTXOParticipantNamespace is the namespace of a UTXO transaction taking
// part in a two-phase transaction: the participant {namespace: ".utxo",
// key: <txid>} names every output of txid staged for it (spends) or the
// transaction itself (a staged create).
const UTXOParticipantNamespace = ".utxo"

// Per-item codes of a failed UTXO operation (UTXOItemError.Code). A spend
// reserved by another two-phase transaction fails with "LOCKED:<txn_id>".
const (
	UTXOTxNotFound       = "TX_NOT_FOUND"
	UTXOCreating         = "CREATING"
	UTXOConflicting      = "CONFLICTING"
	UTXOLocked           = "LOCKED"
	UTXOCoinbaseImmature = "COINBASE_IMMATURE"
	UTXONotFound         = "UTXO_NOT_FOUND"
	UTXOHashMismatch     = "UTXO_HASH_MISMATCH"
	UTXOFrozenUntil      = "FROZEN_UNTIL"
	UTXOInvalidSpend     = "INVALID_SPEND"
	UTXOFrozen           = "FROZEN"
	UTXOSpent            = "SPENT"
	UTXOAlreadyFrozen    = "ALREADY_FROZEN"
	UTXONotFrozen        = "UTXO_NOT_FROZEN"
	UTXOLockedPrefix     = "LOCKED:"
	// In a block: a transaction given twice, or one whose outputs are out
	// of order.
	UTXOTxExists          = "TX_EXISTS"
	UTXOInvalid           = "INVALID_TX"
	UTXOCoinbaseMaturity  = 100  // blocks before a coinbase output is spendable
	UTXOReassignMaturity  = 1000 // blocks before a reassigned output is spendable
	UTXODefaultBatchSize  = 20000
	UTXOMaxBatchSize      = 1 << 20 // outputs of one record
	UTXOMaxPruneBatch     = 1 << 20 // transactions one prune pass looks at
	UTXODefaultEntryBytes = 1 << 20
	// UTXOOutputBytes is the size of one output in a create command's
	// Raft entry: vout, hash and satoshis.
	UTXOOutputBytes = 4 + 32 + 8
)

// UTXORecordBytes is the largest Raft entry creating a record of batch
// outputs may need: the outputs and up to 1 KiB of metadata.
func UTXORecordBytes(batch int) int { return batch*UTXOOutputBytes + 1024 }

// UTXOOutput is one output of a transaction being created.
type UTXOOutput struct {
	Vout     uint32 `json:"vout"`
	UTXOHash string `json:"utxo_hash"`
	Satoshis uint64 `json:"satoshis"`
}

// UTXOOutpoint names an output: the transaction and its index.
type UTXOOutpoint struct {
	TxID     string `json:"txid"`
	Vout     uint32 `json:"vout"`
	UTXOHash string `json:"utxo_hash,omitempty"`
}

// UTXOMinedInfo places a transaction in a block.
type UTXOMinedInfo struct {
	BlockID     uint32 `json:"block_id"`
	BlockHeight uint32 `json:"block_height"`
	SubtreeIdx  int32  `json:"subtree_idx"`
}

// UTXOCreateRequest is the body of POST /v1/utxo/create.
type UTXOCreateRequest struct {
	TxID        string         `json:"txid"`
	Outputs     []UTXOOutput   `json:"outputs"`
	Inputs      []UTXOOutpoint `json:"inputs,omitempty"`
	Coinbase    bool           `json:"coinbase,omitempty"`
	Conflicting bool           `json:"conflicting,omitempty"`
	Locked      bool           `json:"locked,omitempty"`
	Frozen      bool           `json:"frozen,omitempty"`
	BlockHeight uint32         `json:"block_height,omitempty"`
	Mined       *UTXOMinedInfo `json:"mined,omitempty"`
	TxnID       string         `json:"txn_id,omitempty"`
	TTLSeconds  int64          `json:"ttl_seconds,omitempty"` // with txn_id: how long the staged create waits for a decision
}

// UTXOCreateResponse answers POST /v1/utxo/create.
type UTXOCreateResponse struct {
	TxID        string          `json:"txid"`
	Records     int             `json:"records"`
	TxnID       string          `json:"txn_id,omitempty"`
	Participant *TxnParticipant `json:"participant,omitempty"`
}

// UTXOSpend spends one output.
type UTXOSpend struct {
	TxID         string `json:"txid"`
	Vout         uint32 `json:"vout"`
	UTXOHash     string `json:"utxo_hash"`
	SpendingTxID string `json:"spending_txid"`
	Vin          uint32 `json:"vin"`
}

// UTXOSpendRequest is the body of POST /v1/utxo/spend: all of its spends
// happen, or none.
type UTXOSpendRequest struct {
	Spends            []UTXOSpend `json:"spends"`
	IgnoreConflicting bool        `json:"ignore_conflicting,omitempty"`
	IgnoreLocked      bool        `json:"ignore_locked,omitempty"`
	TxnID             string      `json:"txn_id,omitempty"`
	TTLSeconds        int64       `json:"ttl_seconds,omitempty"` // with txn_id: how long the reservation waits for a decision
}

// UTXOSpendResponse answers POST /v1/utxo/spend.
type UTXOSpendResponse struct {
	Spent        int              `json:"spent"`
	TxnID        string           `json:"txn_id,omitempty"`
	Participants []TxnParticipant `json:"participants,omitempty"`
}

// UTXOOutpointsRequest is the body of /v1/utxo/unspend, freeze and unfreeze.
type UTXOOutpointsRequest struct {
	Outpoints []UTXOOutpoint `json:"outpoints"`
}

// UTXOReassignRequest is the body of /v1/utxo/reassign: a frozen output
// gets a new hash and becomes spendable 1000 blocks later.
type UTXOReassignRequest struct {
	TxID        string `json:"txid"`
	Vout        uint32 `json:"vout"`
	UTXOHash    string `json:"utxo_hash"`
	NewUTXOHash string `json:"new_utxo_hash"`
}

// MissingRequired names the first field that v's type requires
// (RequiredFields) and raw, the JSON object v was decoded from, leaves out
// or sets to null; "" when there is none. Decoding alone cannot tell: an
// absent field decodes to its zero value.
func MissingRequired(raw []byte, v any) string {
	rq, ok := v.(interface{ RequiredFields() []string })
	if !ok {
		return ""
	}
	var present map[string]json.RawMessage
	_ = json.Unmarshal(raw, &present)
	for _, f := range rq.RequiredFields() {
		if t := bytes.TrimSpace(present[f]); len(t) == 0 || bytes.Equal(t, []byte("null")) {
			return f
		}
	}
	return ""
}

// UTXOFlagRequest is the body of /v1/utxo/conflicting and /v1/utxo/locked.
type UTXOFlagRequest struct {
	TxIDs []string `json:"txids"`
	Value bool     `json:"value"`
}

// RequiredFields: an absent (or null) value is an error, not a clearing
// of the flag.
func (UTXOFlagRequest) RequiredFields() []string { return []string{"value"} }

// UTXOPreserveRequest is the body of /v1/utxo/preserve.
type UTXOPreserveRequest struct {
	TxIDs       []string `json:"txids"`
	UntilHeight uint32   `json:"until_height"`
}

// RequiredFields: an absent (or null) until_height is an error, not a
// preservation that ends at once.
func (UTXOPreserveRequest) RequiredFields() []string { return []string{"until_height"} }

// UTXOMinedRequest is the body of /v1/utxo/mined: the transactions are in
// block BlockID (or, with Unset, no longer are).
type UTXOMinedRequest struct {
	TxIDs          []string `json:"txids"`
	BlockID        uint32   `json:"block_id"`
	BlockHeight    uint32   `json:"block_height"`
	SubtreeIdx     int32    `json:"subtree_idx"`
	OnLongestChain bool     `json:"on_longest_chain"`
	Unset          bool     `json:"unset,omitempty"`
}

// RequiredFields: the block is always named; a block being added also
// needs its height, which would otherwise be taken as 0 and the
// transactions' retention counted from there.
func (r UTXOMinedRequest) RequiredFields() []string {
	if r.Unset {
		return []string{"block_id"}
	}
	return []string{"block_id", "block_height"}
}

// UTXOLongestChainRequest is the body of /v1/utxo/longest-chain.
type UTXOLongestChainRequest struct {
	TxIDs          []string `json:"txids"`
	OnLongestChain bool     `json:"on_longest_chain"`
}

// RequiredFields: an absent (or null) on_longest_chain is an error, not
// false.
func (UTXOLongestChainRequest) RequiredFields() []string { return []string{"on_longest_chain"} }

// UTXOHeightRequest is the body of /v1/utxo/height.
type UTXOHeightRequest struct {
	BlockHeight uint32 `json:"block_height"`
}

// RequiredFields names what the request must carry although its zero value
// is a height: an absent (or null) block_height is an error, not 0.
func (UTXOHeightRequest) RequiredFields() []string { return []string{"block_height"} }

// UTXOUpdateResponse answers the outpoint, flag, mined and height
// endpoints: how many items changed and, for txid lists, the txids that
// were not found (they change nothing).
type UTXOUpdateResponse struct {
	Updated     int      `json:"updated"`
	NotFound    []string `json:"not_found,omitempty"`
	BlockHeight *uint32  `json:"block_height,omitempty"` // the height endpoint's answer, 0 included
}

// UTXOTxOutput is an output as GET /v1/utxo/tx shows it.
type UTXOTxOutput struct {
	Vout              uint32  `json:"vout"`
	UTXOHash          string  `json:"utxo_hash"`
	Satoshis          uint64  `json:"satoshis"`
	SpendingTxID      string  `json:"spending_txid,omitempty"`
	Vin               *uint32 `json:"vin,omitempty"`
	SpendingData      string  `json:"spending_data,omitempty"` // 36 bytes hex: spending txid, vin (little endian)
	Frozen            bool    `json:"frozen,omitempty"`
	SpendableAtHeight uint32  `json:"spendable_at_height,omitempty"`
	ReservedBy        string  `json:"reserved_by,omitempty"` // a two-phase transaction holding a staged spend
}

// UTXOTx answers GET /v1/utxo/tx?txid=: every field of the transaction's
// records.
type UTXOTx struct {
	TxID            string         `json:"txid"`
	Outputs         []UTXOTxOutput `json:"outputs"`
	Inputs          []UTXOOutpoint `json:"inputs,omitempty"`
	Coinbase        bool           `json:"coinbase"`
	Conflicting     bool           `json:"conflicting"`
	Locked          bool           `json:"locked"`
	Creating        bool           `json:"creating"`
	StagedBy        string         `json:"staged_by,omitempty"` // a two-phase transaction whose commit creates it
	BlockHeight     uint32         `json:"block_height"`
	BlockIDs        []uint32       `json:"block_ids"`
	BlockHeights    []uint32       `json:"block_heights"`
	SubtreeIdxs     []int32        `json:"subtree_idxs"`
	UnminedSince    *uint32        `json:"unmined_since"`
	DeleteAtHeight  uint32         `json:"delete_at_height,omitempty"`
	PreserveUntil   uint32         `json:"preserve_until,omitempty"`
	DeletedChildren []string       `json:"deleted_children,omitempty"`
	TotalOutputs    int            `json:"total_outputs"`
	SpentOutputs    int            `json:"spent_outputs"`
	Records         int            `json:"records"`
	RecordsCreating []int          `json:"records_creating,omitempty"`
	ChainHeight     uint32         `json:"chain_height"`
}

// UTXOBlockInput is an input of a block transaction: the output it spends.
type UTXOBlockInput struct {
	TxID     string `json:"txid"`
	Vout     uint32 `json:"vout"`
	UTXOHash string `json:"utxo_hash"`
}

// UTXOBlockTx is one transaction of a block.
type UTXOBlockTx struct {
	TxID     string           `json:"txid"`
	Coinbase bool             `json:"coinbase,omitempty"`
	Inputs   []UTXOBlockInput `json:"inputs"`
	Outputs  []UTXOOutput     `json:"outputs"`
}

// UTXOBlockRequest is the body of POST /v1/utxo/blocks/apply.
type UTXOBlockRequest struct {
	Height   uint32        `json:"height"`
	Hash     string        `json:"hash"`
	PrevHash string        `json:"prev_hash"`
	Txs      []UTXOBlockTx `json:"txs"`
}

// UTXOBlockInfo describes an applied block.
type UTXOBlockInfo struct {
	Height     uint32 `json:"height"`
	Hash       string `json:"hash"`
	PrevHash   string `json:"prev_hash"`
	BlockID    uint32 `json:"block_id"`
	Txs        int    `json:"txs"`
	Created    int    `json:"created"`
	Mined      int    `json:"mined"`
	Spent      int    `json:"spent"`
	AppliedAt  int64  `json:"applied_at_unix_ms"`
	EntryCount int    `json:"raft_entries,omitempty"`
}

// UTXOBlockResponse answers POST /v1/utxo/blocks/apply.
type UTXOBlockResponse struct {
	Block          UTXOBlockInfo `json:"block"`
	AlreadyApplied bool          `json:"already_applied,omitempty"`
	ChainHeight    uint32        `json:"chain_height"`
}

// UTXORollbackRequest is the body of POST /v1/utxo/blocks/rollback.
type UTXORollbackRequest struct {
	ToHeight uint32 `json:"to_height"`
}

// RequiredFields: an absent (or null) to_height is an error, not a
// rollback of every block.
func (UTXORollbackRequest) RequiredFields() []string { return []string{"to_height"} }

// UTXORollbackResponse answers POST /v1/utxo/blocks/rollback.
type UTXORollbackResponse struct {
	Undone      []UTXOBlockInfo `json:"undone"`
	ChainHeight uint32          `json:"chain_height"`
}

// UTXORetained counts due transactions a prune pass kept, by reason.
type UTXORetained struct {
	UnminedChild    int64 `json:"unmined_child"`
	UnstableChild   int64 `json:"unstable_child"`
	UnreadableChild int64 `json:"unreadable_child"`
}

// UTXOPruneResponse answers POST /v1/utxo/prune: what one pass did.
type UTXOPruneResponse struct {
	Examined    int          `json:"examined"`
	Pruned      []string     `json:"pruned"`
	Retained    UTXORetained `json:"retained"`
	Preserved   int          `json:"preserved"`
	DeltasFreed int          `json:"deltas_freed"`
	Cursor      string       `json:"cursor"`
	Wrapped     bool         `json:"wrapped"`
	ChainHeight uint32       `json:"chain_height"`
	DurationMs  float64      `json:"duration_ms"`
}

// UTXOTiming is the latest and the mean duration of an operation on this
// node, and how many were timed.
type UTXOTiming struct {
	Count  int64   `json:"count"`
	LastMs float64 `json:"last_ms"`
	MeanMs float64 `json:"mean_ms"`
}

// UTXOStatus answers GET /v1/utxo/status.
type UTXOStatus struct {
	ChainHeight      uint32         `json:"chain_height"`
	LastBlock        *UTXOBlockInfo `json:"last_block"`
	RetentionBlocks  uint32         `json:"retention_blocks"`
	RollbackWindow   uint32         `json:"rollback_window"`
	OldestRollback   uint32         `json:"oldest_rollback_height"`
	Deltas           int            `json:"deltas_kept"`
	Transactions     int64          `json:"transactions"`
	Records          int64          `json:"records"`
	Outputs          int64          `json:"outputs"`
	DAHPending       int64          `json:"dah_pending"`
	DAHDue           int            `json:"dah_due"`
	PruneCursor      string         `json:"prune_cursor"`
	Pruned           int64          `json:"pruned_total"`
	PrunePasses      int64          `json:"prune_passes"`
	PruneCycles      int64          `json:"prune_cycles"`
	Retained         UTXORetained   `json:"retained_current_cycle"`
	RetainedLast     UTXORetained   `json:"retained_last_cycle"`
	BlocksApplied    int64          `json:"blocks_applied"`
	BlocksRolledBack int64          `json:"blocks_rolled_back"`
	Apply            UTXOTiming     `json:"apply"`
	Rollback         UTXOTiming     `json:"rollback"`
	Prune            UTXOTiming     `json:"prune"`
	Node             string         `json:"node,omitempty"`
}
