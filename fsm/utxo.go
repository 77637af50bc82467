package fsm

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/wire"
)

// UTXO records: Bitcoin-style transaction outputs kept in the replicated
// state, spent exactly once.
//
// A transaction (txid) is stored as one or more records: record i holds the
// vouts [i*batch, (i+1)*batch). Record 0, the master, also holds the
// transaction's metadata and counters. A record's own metadata is one small
// value; every output is a value of its own (txid|vout), so a spend
// rewrites a few dozen bytes however many outputs the transaction has.
//
// Creation of a transaction with many records takes several Raft entries
// (each bounded by the server's --max-entry-bytes): a lock record
// (txid|0xFFFFFFFF) with an expiry on replicated time, every record with
// creating set, then creating cleared on the children and, last, on the
// master. While the master carries creating, no output of the transaction
// is spendable. Marking the transaction mined clears creating everywhere.
//
// Spends and creates may be staged for a two-phase transaction: a staged
// spend reserves the output for the transaction (others are refused with
// LOCKED:<txn> at once) and a staged create keeps the transaction creating
// until the decision. The participant {.utxo, txid} stands for all of it
// (utxoResource).

// Buckets of the UTXO records.
var (
	bucketUTXORecs  = []byte("utxo_recs")   // txid(32)|record(4) -> UTXORecord; txid|0xFFFFFFFF -> UTXOLock
	bucketUTXOOuts  = []byte("utxo_outs")   // txid(32)|vout(4) -> utxoOutput
	bucketUTXOHolds = []byte("utxo_holds")  // txn\0txid(32) -> utxoHold
	bucketUTXOExp   = []byte("utxo_exp")    // expires_at|'L' txid or 'H' txn\0txid -> nil
	metaUTXOHeight  = []byte("utxo_height") // the chain height (8 bytes)
)

// maxRecordVouts bounds the vouts of one record.
const maxRecordVouts = wire.UTXOMaxBatchSize

// MaxBlockVout bounds the vouts of a block's transactions: the block
// keeps each transaction's outputs in one record.
const MaxBlockVout = maxRecordVouts - 1

// utxoLockIndex is the record index of a transaction's lock record.
const utxoLockIndex = 0xFFFFFFFF

// UTXORecord is one record of a transaction: the range of vouts it holds
// and, for the master (record 0), the transaction's metadata.
type UTXORecord struct {
	First    uint32      `json:"first"`
	Count    uint32      `json:"count"`
	Creating bool        `json:"creating,omitempty"`
	Master   *UTXOMaster `json:"master,omitempty"`
}

// UTXOMaster is the metadata of a transaction, kept in its master record.
type UTXOMaster struct {
	Records         int         `json:"records"`
	Vouts           uint32      `json:"vouts"` // length of the vout range, gaps included
	Total           int         `json:"total"` // outputs stored
	Spent           int         `json:"spent"`
	Coinbase        bool        `json:"coinbase,omitempty"`
	Conflicting     bool        `json:"conflicting,omitempty"`
	Locked          bool        `json:"locked,omitempty"`
	Height          uint32      `json:"height,omitempty"` // block height of creation
	BlockIDs        []uint32    `json:"block_ids"`
	BlockHeights    []uint32    `json:"block_heights"`
	SubtreeIdxs     []int32     `json:"subtree_idxs"`
	UnminedSince    *uint32     `json:"unmined_since,omitempty"`
	DeleteAtHeight  uint32      `json:"dah,omitempty"`
	PreserveUntil   uint32      `json:"preserve_until,omitempty"`
	DeletedChildren []string    `json:"deleted_children,omitempty"`
	Inputs          []UTXOPoint `json:"inputs,omitempty"`
	StagedBy        string      `json:"staged_by,omitempty"` // the two-phase transaction whose commit creates it
	CreatedAt       int64       `json:"created_at"`

	// The delete-at-height and preserve-until the record was read with:
	// writing the master moves its index entries when they changed.
	dahWas, presWas uint32
}

// UTXOLock is the lock record of a creation in progress.
type UTXOLock struct {
	Owner     string `json:"owner"`
	Records   int    `json:"records"`
	Txn       string `json:"txn,omitempty"`
	CreatedAt int64  `json:"created_at"`
	ExpiresAt int64  `json:"expires_at"`
}

// utxoOutput is one output. Spender (hex) and Vin are its spending data.
type utxoOutput struct {
	Hash        string       `json:"h"`
	Sats        uint64       `json:"s"`
	Spent       bool         `json:"spent,omitempty"`
	Spender     string       `json:"by,omitempty"`
	Vin         uint32       `json:"vin,omitempty"`
	Frozen      bool         `json:"frozen,omitempty"`
	SpendableAt uint32       `json:"sah,omitempty"`
	Rsv         *utxoReserve `json:"rsv,omitempty"`
}

// utxoReserve is a spend staged for a two-phase transaction.
type utxoReserve struct {
	Txn     string `json:"txn"`
	Spender string `json:"by"`
	Vin     uint32 `json:"vin"`
}

// utxoHold is what a two-phase transaction holds of one UTXO transaction:
// reserved vouts and/or its staged creation, until ExpiresAt.
type utxoHold struct {
	Vouts     []uint32 `json:"vouts,omitempty"`
	Create    bool     `json:"create,omitempty"`
	ExpiresAt int64    `json:"expires_at"`
}

// UTXOPoint names an output; Hash is checked where an operation names one.
type UTXOPoint struct {
	TxID string `json:"txid"`
	Vout uint32 `json:"vout"`
	Hash string `json:"h,omitempty"`
}

// UTXOOut is an output carried by a create command.
type UTXOOut struct {
	Vout uint32
	Hash [32]byte
	Sats uint64
}

// utxoOutBytes is the size of one output in a create command's payload.
const utxoOutBytes = wire.UTXOOutputBytes

// EncodeUTXOOuts packs outputs as the payload of a create command.
func EncodeUTXOOuts(outs []UTXOOut) []byte {
	b := make([]byte, 0, len(outs)*utxoOutBytes)
	for _, o := range outs {
		b = binary.BigEndian.AppendUint32(b, o.Vout)
		b = append(b, o.Hash[:]...)
		b = binary.BigEndian.AppendUint64(b, o.Sats)
	}
	return b
}

func decodeUTXOOuts(b []byte) ([]UTXOOut, bool) {
	if len(b)%utxoOutBytes != 0 {
		return nil, false
	}
	out := make([]UTXOOut, 0, len(b)/utxoOutBytes)
	for ; len(b) > 0; b = b[utxoOutBytes:] {
		var o UTXOOut
		o.Vout = binary.BigEndian.Uint32(b)
		copy(o.Hash[:], b[4:36])
		o.Sats = binary.BigEndian.Uint64(b[36:])
		out = append(out, o)
	}
	return out, true
}

// Phases of a create.
const (
	UTXOPhaseLock     = "lock"     // take the lock record (and, staged, enlist)
	UTXOPhaseRecord   = "record"   // write one record with creating set
	UTXOPhaseChildren = "children" // clear creating on every child record
	UTXOPhaseMaster   = "master"   // clear creating on the master, drop the lock
	UTXOPhaseUnlock   = "unlock"   // drop the lock of a creator that gives up
	// UTXOPhaseWhole creates a transaction of one record in one entry:
	// nothing to lock, nothing ever creating.
	UTXOPhaseWhole = "whole"
)

// UTXOCreateCmd is one step of creating transaction TxID.
type UTXOCreateCmd struct {
	Phase   string      `json:"phase"`
	TxID    string      `json:"txid"`
	Owner   string      `json:"owner"` // the creating request; holder of the lock
	Records int         `json:"records"`
	TTL     int64       `json:"ttl,omitempty"` // lock: milliseconds
	TxnID   string      `json:"txn,omitempty"`
	Record  int         `json:"record,omitempty"`
	First   uint32      `json:"first,omitempty"`
	Count   uint32      `json:"count,omitempty"`
	Master  *UTXOMaster `json:"master,omitempty"` // record 0: metadata
	Frozen  bool        `json:"frozen,omitempty"` // record: outputs start frozen
	Outputs []UTXOOut   `json:"-"`                // record: carried in the payload
}

// UTXOSpendCmd spends outputs, all or none.
type UTXOSpendCmd struct {
	Spends            []UTXOSpendItem `json:"spends"`
	IgnoreConflicting bool            `json:"ignore_conflicting,omitempty"`
	IgnoreLocked      bool            `json:"ignore_locked,omitempty"`
	TxnID             string          `json:"txn,omitempty"`
	TTL               int64           `json:"ttl,omitempty"` // staged: milliseconds until presumed abort
}

// UTXOSpendItem spends one output for child Spender's input Vin.
type UTXOSpendItem struct {
	TxID    string `json:"txid"`
	Vout    uint32 `json:"vout"`
	Hash    string `json:"h"`
	Spender string `json:"by"`
	Vin     uint32 `json:"vin"`
}

// Kinds of UTXOUpdateCmd.
const (
	UTXOUnspend      = "unspend"
	UTXOFreeze       = "freeze"
	UTXOUnfreeze     = "unfreeze"
	UTXOReassign     = "reassign"
	UTXOConflicting  = "conflicting"
	UTXOLockedFlag   = "locked"
	UTXOPreserve     = "preserve"
	UTXOMined        = "mined"
	UTXOLongestChain = "longest_chain"
	UTXOHeight       = "height"
)

// UTXOUpdateCmd changes outputs (unspend, freeze, unfreeze, reassign; all
// or none) or transactions (flags, preserve, mined, longest chain), or sets
// the chain height.
type UTXOUpdateCmd struct {
	Kind           string      `json:"kind"`
	Outpoints      []UTXOPoint `json:"outpoints,omitempty"`
	NewHash        string      `json:"new_hash,omitempty"`
	TxIDs          []string    `json:"txids,omitempty"`
	Value          bool        `json:"value,omitempty"`
	Height         uint32      `json:"height,omitempty"`
	BlockID        uint32      `json:"block_id,omitempty"`
	SubtreeIdx     int32       `json:"subtree_idx,omitempty"`
	OnLongestChain bool        `json:"on_longest_chain,omitempty"`
	Unset          bool        `json:"unset,omitempty"`
}

// UTXOResult reports a UTXO command.
type UTXOResult struct {
	// Create (lock): the records present and whether the master is
	// still creating (false when there is no master yet).
	Present  []int `json:"present,omitempty"`
	Creating bool  `json:"creating,omitempty"`
	Spent    int   `json:"spent,omitempty"`
	Updated  int   `json:"updated,omitempty"`
	// NotFound lists the txids of an update that do not exist.
	NotFound []string `json:"not_found,omitempty"`
	// Recover lists transactions a spend found creating with no live
	// lock: their creation was abandoned and may be completed.
	Recover []string     `json:"recover,omitempty"`
	Height  uint32       `json:"height,omitempty"`
	Block   *BlockResult `json:"block,omitempty"`
	Prune   *PruneResult `json:"prune,omitempty"`
}

// UTXO helpers.

func txidBytes(s string) ([]byte, bool) {
	if len(s) != 64 {
		return nil, false
	}
	b, err := hex.DecodeString(s)
	return b, err == nil
}

func validHash(s string) bool { _, ok := txidBytes(s); return ok }

func recKey(txid []byte, idx uint32) []byte {
	return binary.BigEndian.AppendUint32(slices.Clone(txid), idx)
}

func holdKey(txn string, txid []byte) []byte {
	return append(append([]byte(txn), 0), txid...)
}

func (r reader) utxoHeight() uint32 { return uint32(u64(r.b(bucketMeta).Get(metaUTXOHeight))) }

func (r reader) utxoRecord(txid []byte, idx uint32) *UTXORecord {
	raw := r.b(bucketUTXORecs).Get(recKey(txid, idx))
	if raw == nil {
		return nil
	}
	var rec UTXORecord
	if err := decodeRecord(raw, &rec); err != nil {
		must(fmt.Errorf("fsm: decode record %x: %w", recKey(txid, idx), err))
	}
	return &rec
}

func (r reader) utxoMaster(txid []byte) *UTXORecord {
	rec := r.utxoRecord(txid, 0)
	if rec == nil || rec.Master == nil {
		return nil
	}
	rec.Master.dahWas, rec.Master.presWas = rec.Master.DeleteAtHeight, rec.Master.PreserveUntil
	return rec
}

func (r reader) utxoLock(txid []byte) *UTXOLock {
	var l UTXOLock
	if !r.getJSON(bucketUTXORecs, recKey(txid, utxoLockIndex), &l) {
		return nil
	}
	return &l
}

func (r reader) utxoOut(txid []byte, vout uint32) *utxoOutput {
	raw := r.b(bucketUTXOOuts).Get(recKey(txid, vout))
	if raw == nil {
		return nil
	}
	var o utxoOutput
	if err := decodeOut(raw, &o); err != nil {
		must(fmt.Errorf("fsm: decode output %x: %w", recKey(txid, vout), err))
	}
	return &o
}

func (r reader) utxoHold(txn string, txid []byte) *utxoHold {
	var h utxoHold
	if !r.getJSON(bucketUTXOHolds, holdKey(txn, txid), &h) {
		return nil
	}
	return &h
}

// present lists the records of txid that exist.
func (r reader) utxoPresent(txid []byte, records int) []int {
	var out []int
	for i := 0; i < records; i++ {
		if r.b(bucketUTXORecs).Get(recKey(txid, uint32(i))) != nil {
			out = append(out, i)
		}
	}
	return out
}

// putUTXORecord writes a record; writing a master first brings its
// delete-at-height up to date (see utxoLifecycle).
func (s *applyState) putUTXORecord(txid []byte, idx uint32, rec *UTXORecord) {
	if idx == 0 && rec.Master != nil {
		s.utxoLifecycle(txid, rec)
	}
	s.put(bucketUTXORecs, recKey(txid, idx), encodeRecord(rec))
}

func (s *applyState) setUTXOTimer(when int64, ref []byte) {
	s.put(bucketUTXOExp, timerKey(when, ref), nil)
	s.emit(Event{Kind: EventTimer, When: when})
}

func (s *applyState) dropLock(txid []byte) {
	k := recKey(txid, utxoLockIndex)
	var l UTXOLock
	if s.getJSON(bucketUTXORecs, k, &l) {
		s.del(bucketUTXORecs, k)
		if l.Txn == "" {
			s.del(bucketUTXOExp, timerKey(l.ExpiresAt, append([]byte{'L'}, txid...)))
		}
	}
}

// lockBlocks reports a live lock of another creator.
func (s *applyState) lockBlocks(txid []byte, owner string) bool {
	l := s.utxoLock(txid)
	return l != nil && l.ExpiresAt > s.now && l.Owner != owner
}

func txExists(detail string) *Result { return fail(errcode.TxExists.With("%s", detail)) }

// enlistUTXO adds the participant {.utxo, txid} to txn and extends the
// hold of txn on txid.
func (s *applyState) enlistUTXO(txn, txidHex string, txid []byte, ttl int64, vouts []uint32, create bool) *errcode.Error {
	p := Participant{Namespace: wire.UTXOParticipantNamespace, Key: txidHex}
	if err := s.mayEnlist(txn, p); err != nil {
		return err
	}
	t := s.txn(txn)
	if t == nil {
		t = &TxnRecord{State: TxnPending, CreatedAt: s.now}
	}
	mergeParticipants(t, []Participant{p})
	s.storeTxn(txn, t)
	h := s.utxoHold(txn, txid)
	if h == nil {
		h = &utxoHold{}
	} else {
		s.del(bucketUTXOExp, timerKey(h.ExpiresAt, append([]byte{'H'}, holdKey(txn, txid)...)))
	}
	for _, v := range vouts {
		if !slices.Contains(h.Vouts, v) {
			h.Vouts = append(h.Vouts, v)
		}
	}
	h.Create = h.Create || create
	h.ExpiresAt = max(h.ExpiresAt, s.now+ttl)
	s.putJSON(bucketUTXOHolds, holdKey(txn, txid), h)
	s.setUTXOTimer(h.ExpiresAt, append([]byte{'H'}, holdKey(txn, txid)...))
	return nil
}

// mayEnlist checks, before anything is written, that txn can take ps.
func (s *applyState) mayEnlist(txn string, ps ...Participant) *errcode.Error {
	t := s.txn(txn)
	if t != nil && t.State != TxnPending {
		return decidedErr(t)
	}
	if t != nil && tooMany(t, ps) || len(sortParticipants(slices.Clone(ps))) > MaxParticipants {
		return errcode.TxnTooLarge.With("a transaction holds at most %d participants", MaxParticipants)
	}
	return nil
}

func (s *applyState) utxoCreate(c *UTXOCreateCmd) *Result {
	txid, ok := txidBytes(c.TxID)
	if !ok || c.Owner == "" || tooLong(c.Owner, c.TxnID) || hasNUL(c.Owner, c.TxnID) || c.Records <= 0 || c.Records > 1<<20 {
		return fail(errcode.MalformedCmd.With("utxo create needs a txid, an owner and a record count"))
	}
	switch c.Phase {
	case UTXOPhaseLock:
		return s.utxoLockPhase(c, txid)
	case UTXOPhaseRecord:
		return s.utxoRecordPhase(c, txid)
	case UTXOPhaseWhole:
		return s.utxoWhole(c, txid)
	case UTXOPhaseUnlock:
		if l := s.utxoLock(txid); l != nil && l.Owner == c.Owner && l.Txn == "" {
			s.dropLock(txid)
		}
		return &Result{UTXO: &UTXOResult{}}
	case UTXOPhaseChildren, UTXOPhaseMaster:
		if s.lockBlocks(txid, c.Owner) {
			return txExists("the transaction is being created")
		}
		m := s.utxoMaster(txid)
		if m == nil || len(s.utxoPresent(txid, m.Master.Records)) != m.Master.Records {
			return fail(errcode.InvalidUTXORequest.With("the transaction's records are not all present"))
		}
		if c.Phase == UTXOPhaseChildren {
			for i := 1; i < m.Master.Records; i++ {
				s.clearCreating(txid, uint32(i))
			}
			return &Result{UTXO: &UTXOResult{}}
		}
		for i := 1; i < m.Master.Records; i++ {
			if rec := s.utxoRecord(txid, uint32(i)); rec.Creating {
				return fail(errcode.InvalidUTXORequest.With("record %d is still creating", i))
			}
		}
		s.clearCreating(txid, 0)
		s.dropLock(txid)
		return &Result{UTXO: &UTXOResult{}}
	}
	return fail(errcode.MalformedCmd.With("unknown utxo create phase %q", c.Phase))
}

// utxoWhole creates a transaction that fits one record in one step; one
// that exists answers tx_exists.
func (s *applyState) utxoWhole(c *UTXOCreateCmd, txid []byte) *Result {
	if c.Records != 1 || c.Record != 0 || c.TxnID != "" {
		return fail(errcode.MalformedCmd.With("a whole create is one record and not staged"))
	}
	if s.lockBlocks(txid, c.Owner) {
		return txExists("the transaction is being created")
	}
	if m := s.utxoMaster(txid); m != nil {
		if m.Master.StagedBy != "" {
			return txExists("the transaction is staged by transaction " + m.Master.StagedBy)
		}
		return txExists("the transaction exists")
	}
	res := s.utxoRecordPhase(c, txid)
	if res.Err == nil {
		s.clearCreating(txid, 0)
		s.dropLock(txid) // an expired one
	}
	return res
}

func (s *applyState) clearCreating(txid []byte, idx uint32) {
	if rec := s.utxoRecord(txid, idx); rec != nil && rec.Creating {
		rec.Creating = false
		s.putUTXORecord(txid, idx, rec)
	}
}

func (s *applyState) utxoLockPhase(c *UTXOCreateCmd, txid []byte) *Result {
	if c.TTL <= 0 {
		return fail(errcode.MalformedCmd.With("utxo lock needs a ttl"))
	}
	m := s.utxoMaster(txid)
	if m != nil && !m.Creating {
		return txExists("the transaction exists")
	}
	if m != nil && m.Master.StagedBy != "" {
		return txExists("the transaction is staged by transaction " + m.Master.StagedBy)
	}
	if m != nil && c.TxnID != "" && s.rules() >= formatV11 {
		// The records an unfinished creation outside any transaction left
		// are not the transaction's: its decision could neither complete
		// nor remove them (from format 11 on).
		return txExists("an earlier creation of the transaction, outside any transaction, is unfinished: create it without a transaction to finish it")
	}
	if s.lockBlocks(txid, c.Owner) {
		return txExists("the transaction is being created")
	}
	if c.TxnID != "" {
		if err := s.mayEnlist(c.TxnID, Participant{Namespace: wire.UTXOParticipantNamespace, Key: c.TxID}); err != nil {
			return fail(err)
		}
	}
	s.dropLock(txid)
	if c.TxnID != "" {
		if err := s.enlistUTXO(c.TxnID, c.TxID, txid, c.TTL, nil, true); err != nil {
			return fail(err)
		}
	}
	l := UTXOLock{Owner: c.Owner, Records: c.Records, Txn: c.TxnID, CreatedAt: s.now, ExpiresAt: s.now + c.TTL}
	s.putJSON(bucketUTXORecs, recKey(txid, utxoLockIndex), l)
	if c.TxnID == "" {
		s.setUTXOTimer(l.ExpiresAt, append([]byte{'L'}, txid...))
	}
	res := &UTXOResult{Present: s.utxoPresent(txid, c.Records)}
	if m != nil {
		res.Creating = true
	}
	return &Result{UTXO: res}
}

func (s *applyState) utxoRecordPhase(c *UTXOCreateCmd, txid []byte) *Result {
	if c.Record < 0 || c.Record >= c.Records || (c.Record == 0) != (c.Master != nil) || len(c.Outputs) > int(c.Count) ||
		c.Count == 0 || c.Count > maxRecordVouts || uint64(c.First)+uint64(c.Count) > 1<<32-1 {
		return fail(errcode.MalformedCmd.With("bad utxo record"))
	}
	for i, o := range c.Outputs {
		if o.Vout < c.First || o.Vout-c.First >= c.Count || (i > 0 && o.Vout <= c.Outputs[i-1].Vout) {
			return fail(errcode.MalformedCmd.With("utxo record outputs out of range or order"))
		}
	}
	if m := c.Master; m != nil {
		// Record 0 fixes the layout a block completing the creation follows
		// (blockPlan.complete): record i holds the vouts from i*Count.
		if c.First != 0 || uint64(m.Records) != max(1, (uint64(m.Vouts)+uint64(c.Count)-1)/uint64(c.Count)) {
			return fail(errcode.MalformedCmd.With("utxo records do not cover the vouts in records of %d", c.Count))
		}
		if m.Records != c.Records || m.Total < 0 || m.Spent != 0 || len(m.BlockIDs) != len(m.BlockHeights) ||
			len(m.BlockIDs) != len(m.SubtreeIdxs) || len(m.Inputs) > 1<<20 {
			return fail(errcode.MalformedCmd.With("bad utxo master"))
		}
		for _, in := range m.Inputs {
			if _, ok := txidBytes(in.TxID); !ok {
				return fail(errcode.MalformedCmd.With("bad utxo input"))
			}
		}
	}
	if s.lockBlocks(txid, c.Owner) {
		return txExists("the transaction is being created")
	}
	if c.TxnID != "" {
		if err := s.holdsCreation(c.TxnID, txid); err != nil {
			return fail(err)
		}
	}
	// A transaction created whole meanwhile (by a block) or laid out in
	// another number of records is not this creation's: writing a record
	// would put fresh outputs over its own, spent ones among them.
	if m := s.utxoMaster(txid); m != nil && (!m.Creating || m.Master.Records != c.Records) {
		return txExists("the transaction exists")
	}
	if s.b(bucketUTXORecs).Get(recKey(txid, uint32(c.Record))) != nil {
		return &Result{UTXO: &UTXOResult{}} // written by an earlier attempt
	}
	rec := &UTXORecord{First: c.First, Count: c.Count, Creating: true}
	if c.Master != nil {
		m := *c.Master
		m.Spent, m.CreatedAt, m.StagedBy = 0, s.now, c.TxnID
		m.Inputs = slices.Clone(m.Inputs)
		for i := range m.Inputs {
			m.Inputs[i].Hash = "" // a master names its inputs; their hashes are checked by spends
		}
		m.DeleteAtHeight, m.DeletedChildren = 0, nil
		if len(m.BlockIDs) == 0 {
			h := s.utxoHeight()
			m.UnminedSince = &h
			m.BlockIDs, m.BlockHeights, m.SubtreeIdxs = []uint32{}, []uint32{}, []int32{}
		} else {
			m.UnminedSince = nil
		}
		rec.Master = &m
	}
	for _, o := range c.Outputs {
		s.putOut(recKey(txid, o.Vout), &utxoOutput{Hash: hex.EncodeToString(o.Hash[:]), Sats: o.Sats, Frozen: c.Frozen})
	}
	s.putUTXORecord(txid, uint32(c.Record), rec)
	st := s.utxoStats()
	st.Records++
	st.Outputs += int64(len(c.Outputs))
	if c.Record == 0 {
		st.Txs++
	}
	return &Result{UTXO: &UTXOResult{}}
}

// holdsCreation checks that the records of a staged creation may still be
// written: their transaction is pending and holds the creation it locked,
// and its hold has not run out. A transaction decided before its records
// came would otherwise leave them staged by it for good.
func (s *applyState) holdsCreation(txn string, txid []byte) *errcode.Error {
	t := s.txn(txn)
	if t != nil && t.State != TxnPending {
		return decidedErr(t)
	}
	h, l := s.utxoHold(txn, txid), s.utxoLock(txid)
	switch {
	case t == nil || h == nil || !h.Create || l == nil || l.Txn != txn:
		return errcode.TxExists.With("transaction %s does not hold the creation lock; nothing was written", txn)
	case h.ExpiresAt <= s.now:
		return errcode.TxnRolledBack.With("the hold of transaction %s expired, so it rolls back; nothing was written", txn)
	}
	return nil
}

// txCheck is the per-transaction part of a spend's checks, in order.
func (s *applyState) txCheck(m *UTXORecord, txn string, ignoreConflicting, ignoreLocked bool, height uint32) string {
	switch {
	case m == nil:
		return wire.UTXOTxNotFound
	case m.Master.StagedBy != "" && m.Master.StagedBy != txn:
		return wire.UTXOLockedPrefix + m.Master.StagedBy
	case m.Creating:
		return wire.UTXOCreating
	case m.Master.Conflicting && !ignoreConflicting:
		return wire.UTXOConflicting
	case m.Master.Locked && !ignoreLocked:
		return wire.UTXOLocked
	case m.Master.Coinbase && uint64(height) < uint64(m.Master.Height)+wire.UTXOCoinbaseMaturity:
		return wire.UTXOCoinbaseImmature
	}
	return ""
}

// utxoBatch caches the masters and outputs one command reads and changes,
// and writes the changed ones back in key order.
type utxoBatch struct {
	s        *applyState
	masters  map[string]*UTXORecord
	outs     map[string]*utxoOutput
	dirtyM   []string // in the order first changed
	dirtyO   []string
	dirty    map[string]bool // keys in dirtyM or dirtyO ('m' or 'o' first)
	failures []errcode.Item
}

func newUTXOBatch(s *applyState) *utxoBatch {
	return &utxoBatch{s: s, masters: map[string]*UTXORecord{}, outs: map[string]*utxoOutput{}, dirty: map[string]bool{}}
}

func (b *utxoBatch) master(txid []byte) *UTXORecord {
	k := string(txid)
	if m, ok := b.masters[k]; ok {
		return m
	}
	m := b.s.utxoMaster(txid)
	b.masters[k] = m
	return m
}

func (b *utxoBatch) out(txid []byte, vout uint32) *utxoOutput {
	k := string(recKey(txid, vout))
	if o, ok := b.outs[k]; ok {
		return o
	}
	o := b.s.utxoOut(txid, vout)
	b.outs[k] = o
	return o
}

func (b *utxoBatch) touchMaster(txid []byte) {
	if k := string(txid); !b.dirty["m"+k] {
		b.dirty["m"+k] = true
		b.dirtyM = append(b.dirtyM, k)
	}
}

func (b *utxoBatch) touchOut(txid []byte, vout uint32) {
	b.touchOutKey(string(recKey(txid, vout)))
}

func (b *utxoBatch) touchOutKey(k string) {
	if !b.dirty["o"+k] {
		b.dirty["o"+k] = true
		b.dirtyO = append(b.dirtyO, k)
	}
}

func (b *utxoBatch) failItem(i int, code string, o *utxoOutput) {
	it := errcode.Item{Index: i, Code: code}
	if code == wire.UTXOSpent && o != nil {
		vin := o.Vin
		it.SpendingTxID, it.Vin = o.Spender, &vin
	}
	b.failures = append(b.failures, it)
}

// flush writes the changed values in key order, which keeps bbolt's
// cursor on neighbouring pages.
func (b *utxoBatch) flush() {
	slices.Sort(b.dirtyM)
	slices.Sort(b.dirtyO)
	for _, k := range b.dirtyM {
		b.s.putUTXORecord([]byte(k), 0, b.masters[k])
	}
	for _, k := range b.dirtyO {
		b.s.putOut([]byte(k), b.outs[k])
	}
}

// outpoint finds an output and checks its hash: UTXO_NOT_FOUND,
// UTXO_HASH_MISMATCH.
func (b *utxoBatch) outpoint(m *UTXORecord, txid []byte, vout uint32, hash string) (*utxoOutput, string) {
	var o *utxoOutput
	if vout < m.Master.Vouts {
		o = b.out(txid, vout)
	}
	switch {
	case o == nil:
		return nil, wire.UTXONotFound
	case hash != "" && o.Hash != hash:
		return o, wire.UTXOHashMismatch
	}
	return o, ""
}

func (s *applyState) utxoSpend(c *UTXOSpendCmd) *Result {
	if len(c.Spends) == 0 || len(c.Spends) > 1<<20 || c.TTL < 0 || (c.TxnID != "" && (!validTxnID(c.TxnID) || c.TTL == 0)) {
		return fail(errcode.MalformedCmd.With("utxo spend needs spends"))
	}
	for _, sp := range c.Spends {
		if _, ok := txidBytes(sp.TxID); !ok || !validHash(sp.Hash) || !validHash(sp.Spender) {
			return fail(errcode.MalformedCmd.With("bad utxo spend item"))
		}
	}
	if c.TxnID != "" {
		if t := s.txn(c.TxnID); t != nil && t.State != TxnPending {
			return fail(decidedErr(t))
		}
	}
	b := newUTXOBatch(s)
	var recover []string
	type staged struct {
		txid []byte
		hex  string
		vout uint32
	}
	var reserved []staged
	for i, sp := range c.Spends {
		txid, _ := txidBytes(sp.TxID)
		m := b.master(txid)
		if code := s.txCheck(m, c.TxnID, c.IgnoreConflicting, c.IgnoreLocked, s.utxoHeight()); code != "" {
			b.failItem(i, code, nil)
			if code == wire.UTXOCreating && !slices.Contains(recover, sp.TxID) {
				if l := s.utxoLock(txid); l == nil || (l.Txn == "" && l.ExpiresAt <= s.now) {
					recover = append(recover, sp.TxID)
				}
			}
			continue
		}
		o, code := b.outpoint(m, txid, sp.Vout, sp.Hash)
		if code == "" && o.SpendableAt > s.utxoHeight() {
			code = wire.UTXOFrozenUntil
		}
		if code != "" {
			b.failItem(i, code, o)
			continue
		}
		same := o.Spent && o.Spender == sp.Spender && o.Vin == sp.Vin
		sameRsv := o.Rsv != nil && o.Rsv.Txn == c.TxnID && o.Rsv.Spender == sp.Spender && o.Rsv.Vin == sp.Vin
		switch {
		case same && slices.Contains(m.Master.DeletedChildren, sp.Spender):
			b.failItem(i, wire.UTXOInvalidSpend, o)
		case same || sameRsv:
			// The same spend again: done already, nothing changes.
		case o.Frozen:
			b.failItem(i, wire.UTXOFrozen, o)
		case o.Rsv != nil && o.Rsv.Txn == c.TxnID:
			// The transaction reserved it for another spender (earlier in
			// this request, or before): as good as spent by that one.
			b.failItem(i, wire.UTXOSpent, &utxoOutput{Spender: o.Rsv.Spender, Vin: o.Rsv.Vin})
		case o.Rsv != nil:
			b.failItem(i, wire.UTXOLockedPrefix+o.Rsv.Txn, o)
		case o.Spent:
			b.failItem(i, wire.UTXOSpent, o)
		case c.TxnID != "":
			o.Rsv = &utxoReserve{Txn: c.TxnID, Spender: sp.Spender, Vin: sp.Vin}
			b.touchOut(txid, sp.Vout)
			reserved = append(reserved, staged{txid: txid, hex: sp.TxID, vout: sp.Vout})
		default:
			o.Spent, o.Spender, o.Vin = true, sp.Spender, sp.Vin
			m.Master.Spent++
			b.touchOut(txid, sp.Vout)
			b.touchMaster(txid)
		}
	}
	if len(b.failures) > 0 {
		e := errcode.UTXOSpendFailed.With("%d of %d spends failed; nothing was spent", len(b.failures), len(c.Spends))
		e.Spends = b.failures
		return &Result{Err: e, UTXO: &UTXOResult{Recover: recover}}
	}
	if len(reserved) > 0 {
		ps := make([]Participant, len(reserved))
		for i, r := range reserved {
			ps[i] = Participant{Namespace: wire.UTXOParticipantNamespace, Key: r.hex}
		}
		if err := s.mayEnlist(c.TxnID, ps...); err != nil {
			return fail(err)
		}
	}
	for _, r := range reserved {
		// Checked above: enlisting can no longer fail, so nothing is
		// written unless everything is.
		if err := s.enlistUTXO(c.TxnID, r.hex, r.txid, c.TTL, []uint32{r.vout}, false); err != nil {
			must(err)
		}
	}
	b.flush()
	return &Result{UTXO: &UTXOResult{Spent: len(c.Spends)}}
}

func (s *applyState) utxoUpdate(c *UTXOUpdateCmd) *Result {
	switch c.Kind {
	case UTXOUnspend, UTXOFreeze, UTXOUnfreeze, UTXOReassign:
		return s.utxoOutpoints(c)
	case UTXOConflicting, UTXOLockedFlag, UTXOPreserve, UTXOMined, UTXOLongestChain:
		return s.utxoTxFlags(c)
	case UTXOHeight:
		s.put(bucketMeta, metaUTXOHeight, putU64(uint64(c.Height)))
		return &Result{UTXO: &UTXOResult{Updated: 1, Height: c.Height}}
	}
	return fail(errcode.MalformedCmd.With("unknown utxo update %q", c.Kind))
}

func (s *applyState) utxoOutpoints(c *UTXOUpdateCmd) *Result {
	if len(c.Outpoints) == 0 || len(c.Outpoints) > 1<<20 || (c.Kind == UTXOReassign && (len(c.Outpoints) != 1 || !validHash(c.NewHash))) {
		return fail(errcode.MalformedCmd.With("utxo %s needs outpoints", c.Kind))
	}
	for _, p := range c.Outpoints {
		if _, ok := txidBytes(p.TxID); !ok || (p.Hash != "" && !validHash(p.Hash)) {
			return fail(errcode.MalformedCmd.With("bad utxo outpoint"))
		}
	}
	b := newUTXOBatch(s)
	updated := 0
	for i, p := range c.Outpoints {
		txid, _ := txidBytes(p.TxID)
		m := b.master(txid)
		if m == nil {
			b.failItem(i, wire.UTXOTxNotFound, nil)
			continue
		}
		o, code := b.outpoint(m, txid, p.Vout, p.Hash)
		if code == "" {
			code = utxoOutpointRule(c.Kind, o)
		}
		if code != "" {
			b.failItem(i, code, o)
			continue
		}
		switch c.Kind {
		case UTXOUnspend:
			if !o.Spent {
				continue
			}
			o.Spent, o.Spender, o.Vin = false, "", 0
			m.Master.Spent--
			m.Master.DeleteAtHeight = 0
			b.touchMaster(txid)
		case UTXOFreeze:
			o.Frozen = true
		case UTXOUnfreeze:
			o.Frozen = false
		case UTXOReassign:
			o.Hash, o.Frozen, o.SpendableAt = c.NewHash, false, uint32(min(uint64(s.utxoHeight())+wire.UTXOReassignMaturity, 1<<32-1))
		}
		b.touchOut(txid, p.Vout)
		updated++
	}
	if len(b.failures) > 0 {
		e := errcode.UTXOUpdateFailed.With("%d of %d outpoints failed; nothing changed", len(b.failures), len(c.Outpoints))
		e.Outpoints = b.failures
		return fail(e)
	}
	b.flush()
	return &Result{UTXO: &UTXOResult{Updated: updated}}
}

// utxoOutpointRule is the per-output check of an outpoint operation.
func utxoOutpointRule(kind string, o *utxoOutput) string {
	switch kind {
	case UTXOUnspend:
		switch {
		case o.Frozen:
			return wire.UTXOFrozen
		case o.Rsv != nil:
			return wire.UTXOLockedPrefix + o.Rsv.Txn
		}
	case UTXOFreeze:
		switch {
		case o.Spent:
			return wire.UTXOSpent
		case o.Rsv != nil:
			return wire.UTXOLockedPrefix + o.Rsv.Txn
		case o.Frozen:
			return wire.UTXOAlreadyFrozen
		}
	case UTXOUnfreeze, UTXOReassign:
		if !o.Frozen {
			return wire.UTXONotFrozen
		}
	}
	return ""
}

func (s *applyState) utxoTxFlags(c *UTXOUpdateCmd) *Result {
	if len(c.TxIDs) == 0 || len(c.TxIDs) > 1<<20 {
		return fail(errcode.MalformedCmd.With("utxo %s needs txids", c.Kind))
	}
	for _, id := range c.TxIDs {
		if _, ok := txidBytes(id); !ok {
			return fail(errcode.MalformedCmd.With("bad txid"))
		}
	}
	res := &UTXOResult{}
	height := s.utxoHeight()
	for _, id := range c.TxIDs {
		txid, _ := txidBytes(id)
		rec := s.utxoMaster(txid)
		if rec == nil {
			if !slices.Contains(res.NotFound, id) {
				res.NotFound = append(res.NotFound, id)
			}
			continue
		}
		m := rec.Master
		switch c.Kind {
		case UTXOConflicting:
			m.Conflicting = c.Value
		case UTXOLockedFlag:
			m.Locked = c.Value
		case UTXOPreserve:
			m.PreserveUntil, m.DeleteAtHeight = c.Height, 0
		case UTXOLongestChain:
			m.UnminedSince = nil
			if !c.OnLongestChain {
				m.UnminedSince = &height
			}
		case UTXOMined:
			s.utxoSetMined(txid, rec, c, height)
		}
		s.putUTXORecord(txid, 0, rec)
		res.Updated++
	}
	return &Result{UTXO: res}
}

// utxoSetMined records (or with Unset removes) a block of the transaction.
// Marking it mined completes an unfinished creation: creating is cleared on
// every record and the lock dropped.
func (s *applyState) utxoSetMined(txid []byte, rec *UTXORecord, c *UTXOUpdateCmd, height uint32) {
	m := rec.Master
	if c.Unset {
		for i := 0; i < len(m.BlockIDs); {
			if m.BlockIDs[i] == c.BlockID {
				m.BlockIDs = slices.Delete(m.BlockIDs, i, i+1)
				m.BlockHeights = slices.Delete(m.BlockHeights, i, i+1)
				m.SubtreeIdxs = slices.Delete(m.SubtreeIdxs, i, i+1)
				continue
			}
			i++
		}
		if len(m.BlockIDs) == 0 {
			m.UnminedSince = &height
		}
		return
	}
	if !m.inBlock(c.BlockID, c.Height, s.rules() >= formatV9) {
		m.BlockIDs = append(m.BlockIDs, c.BlockID)
		m.BlockHeights = append(m.BlockHeights, c.Height)
		m.SubtreeIdxs = append(m.SubtreeIdxs, c.SubtreeIdx)
	}
	m.UnminedSince = nil
	if !c.OnLongestChain {
		m.UnminedSince = &height
	}
	s.finishMined(txid, rec)
}

// finishMined completes the creation of a transaction marked mined:
// creating is cleared on every record and the lock dropped (a two-phase
// transaction's staged creation keeps its lock). A creation with records
// missing stays creating, and its lock stays, for the creator to write
// them. The caller writes the master.
func (s *applyState) finishMined(txid []byte, rec *UTXORecord) {
	if len(s.utxoPresent(txid, rec.Master.Records)) != rec.Master.Records {
		return
	}
	for i := 1; i < rec.Master.Records; i++ {
		s.clearCreating(txid, uint32(i))
	}
	rec.Creating = false
	if rec.Master.StagedBy == "" {
		s.dropLock(txid)
	}
}

// sweepUTXO ends what is due in utxo_exp: abandoned creation locks are
// dropped, and a two-phase transaction whose hold ran out is rolled back
// (or, prepared for another island's coordinator, put in doubt).
func (s *applyState) sweepUTXO(budget int, res *SweepResult) int {
	for _, tk := range s.dueKeys(bucketUTXOExp, s.now, max(budget, 0)) {
		if budget <= 0 {
			break // the rest is left for the next sweep (More)
		}
		budget--
		when, ref := splitTimer(tk)
		s.del(bucketUTXOExp, tk)
		if len(ref) == 0 {
			continue
		}
		switch ref[0] {
		case 'L':
			txid := ref[1:]
			if l := s.utxoLock(txid); l != nil && l.Txn == "" && l.ExpiresAt == when {
				s.del(bucketUTXORecs, recKey(txid, utxoLockIndex))
				res.Expired++
			}
		case 'H':
			i := bytes.IndexByte(ref, 0)
			if i < 0 {
				continue
			}
			txn := string(ref[1:i])
			t := s.txn(txn)
			if t == nil || t.State != TxnPending {
				continue
			}
			if t.Home != "" {
				if t.DoubtAt == 0 || t.DoubtAt > s.now {
					s.setDoubt(txn, t, s.now)
					s.storeTxn(txn, t)
				}
				continue
			}
			budget -= len(t.Participants)
			s.decide(txn, false, ReasonExpired)
			res.Expired++
		}
	}
	return budget
}

// utxoResource is the UTXO transaction txid taking part in a two-phase
// transaction: its outputs the transaction reserved and, if it staged the
// creation, the transaction itself.
type utxoResource struct {
	s    *applyState
	txid []byte
}

func (r utxoResource) holder(txn, owner string) (string, bool) {
	if m := r.s.utxoMaster(r.txid); m != nil && m.Master.StagedBy != "" && m.Master.StagedBy != txn {
		return "txn " + m.Master.StagedBy, true
	}
	return "", false
}

func (r utxoResource) held(txn string) bool { return r.s.utxoHold(txn, r.txid) != nil }

func (r utxoResource) expired(txn string) bool {
	h := r.s.utxoHold(txn, r.txid)
	return h != nil && h.ExpiresAt <= r.s.now
}

// lock takes nothing: the outputs a transaction spends are reserved by its
// staged spend, which names them.
func (r utxoResource) lock(string, Waiter) {}

func (r utxoResource) finish(txn string, commit bool) {
	h := r.s.utxoHold(txn, r.txid)
	if h == nil {
		return
	}
	hk := holdKey(txn, r.txid)
	r.s.del(bucketUTXOHolds, hk)
	r.s.del(bucketUTXOExp, timerKey(h.ExpiresAt, append([]byte{'H'}, hk...)))
	if l := r.s.utxoLock(r.txid); h.Create && l != nil && l.Txn == txn {
		r.s.dropLock(r.txid) // decided before its records were all written
	}
	rec := r.s.utxoMaster(r.txid)
	if rec == nil {
		return
	}
	if h.Create && rec.Master.StagedBy == txn {
		if !commit {
			r.s.dropUTXOTx(r.txid)
			return
		}
		rec.Master.StagedBy = ""
		r.s.dropLock(r.txid)
		if len(r.s.utxoPresent(r.txid, rec.Master.Records)) == rec.Master.Records {
			for i := 1; i < rec.Master.Records; i++ {
				r.s.clearCreating(r.txid, uint32(i))
			}
			rec.Creating = false
		}
	}
	for _, v := range h.Vouts {
		o := r.s.utxoOut(r.txid, v)
		if o == nil || o.Rsv == nil || o.Rsv.Txn != txn {
			continue
		}
		if commit && !o.Spent {
			o.Spent, o.Spender, o.Vin = true, o.Rsv.Spender, o.Rsv.Vin
			rec.Master.Spent++
		}
		o.Rsv = nil
		r.s.putOut(recKey(r.txid, v), o)
	}
	r.s.putUTXORecord(r.txid, 0, rec)
}

// dropUTXOTx deletes every record and output of txid, its lock and its
// index entries.
func (s *applyState) dropUTXOTx(txid []byte) {
	s.dropLock(txid)
	if rec := s.utxoMaster(txid); rec != nil {
		s.unindexUTXO(txid, rec.Master)
		s.utxoStats().Txs--
	}
	st := s.utxoStats()
	for _, b := range [][]byte{bucketUTXOOuts, bucketUTXORecs} {
		var keys [][]byte
		c := s.b(b).Cursor()
		for k, _ := c.Seek(txid); k != nil && bytes.HasPrefix(k, txid); k, _ = c.Next() {
			keys = append(keys, bytes.Clone(k))
		}
		for _, k := range keys {
			s.del(b, k)
		}
		if bytes.Equal(b, bucketUTXOOuts) {
			st.Outputs -= int64(len(keys))
		} else {
			st.Records -= int64(len(keys))
		}
	}
}

// UTXOHeight returns the chain height.
func (v *View) UTXOHeight() uint32 { return v.utxoHeight() }

// UTXOTx describes transaction txid (hex) with every output, or returns
// nil when it does not exist.
func (v *View) UTXOTx(txidHex string) *wire.UTXOTx {
	txid, ok := txidBytes(txidHex)
	if !ok {
		return nil
	}
	rec := v.utxoMaster(txid)
	if rec == nil {
		return nil
	}
	m := rec.Master
	out := &wire.UTXOTx{TxID: txidHex, Coinbase: m.Coinbase, Conflicting: m.Conflicting, Locked: m.Locked,
		Creating: rec.Creating, StagedBy: m.StagedBy, BlockHeight: m.Height,
		BlockIDs: append([]uint32{}, m.BlockIDs...), BlockHeights: append([]uint32{}, m.BlockHeights...),
		SubtreeIdxs:    append([]int32{}, m.SubtreeIdxs...),
		DeleteAtHeight: m.DeleteAtHeight, PreserveUntil: m.PreserveUntil, DeletedChildren: slices.Clone(m.DeletedChildren),
		TotalOutputs: m.Total, SpentOutputs: m.Spent, Records: m.Records, ChainHeight: v.utxoHeight(),
		Outputs: []wire.UTXOTxOutput{}}
	if m.UnminedSince != nil {
		u := *m.UnminedSince
		out.UnminedSince = &u
	}
	for _, in := range m.Inputs {
		out.Inputs = append(out.Inputs, wire.UTXOOutpoint{TxID: in.TxID, Vout: in.Vout})
	}
	for i := 0; i < m.Records; i++ {
		if r := v.utxoRecord(txid, uint32(i)); r != nil && r.Creating {
			out.RecordsCreating = append(out.RecordsCreating, i)
		}
	}
	p := slices.Clone(txid)
	c := v.b(bucketUTXOOuts).Cursor()
	for k, val := c.Seek(p); k != nil && bytes.HasPrefix(k, p); k, val = c.Next() {
		var o utxoOutput
		must(decodeOut(val, &o))
		to := wire.UTXOTxOutput{Vout: binary.BigEndian.Uint32(k[32:]), UTXOHash: o.Hash, Satoshis: o.Sats, Frozen: o.Frozen,
			SpendableAtHeight: o.SpendableAt}
		if o.Spent {
			vin := o.Vin
			to.SpendingTxID, to.Vin = o.Spender, &vin
			sd, _ := hex.DecodeString(o.Spender)
			to.SpendingData = hex.EncodeToString(binary.LittleEndian.AppendUint32(sd, o.Vin))
		}
		if o.Rsv != nil {
			to.ReservedBy = o.Rsv.Txn
		}
		out.Outputs = append(out.Outputs, to)
	}
	return out
}
