package rm

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/rs/xid"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/wire"
)

// UTXO records: create (split into bounded records under a lock record),
// spend, unspend, freeze, reassign, flags, mined marks and the chain
// height. This service validates requests, splits a transaction into
// records no larger than one Raft entry may be, drives the phases of a
// creation and the recovery of abandoned ones; the rules themselves are
// applied by the state machine (fsm/utxo.go).

// UTXOLimits are the server's UTXO policies.
type UTXOLimits struct {
	BatchSize     int           // vouts per record (--utxo-batch-size)
	MaxEntryBytes int           // largest Raft entry a command may encode to (--max-entry-bytes)
	DefaultTxnTTL time.Duration // how long a staged spend or create waits for its decision
	MaxTxnTTL     time.Duration
}

// Lock record TTLs: 30 s plus 2 s per record, at most 5 minutes.
const (
	utxoLockBase      = 30 * time.Second
	utxoLockPerRecord = 2 * time.Second
	utxoLockMax       = 300 * time.Second
	maxSatoshis       = 21_000_000 * 100_000_000
	maxVouts          = 1 << 24
	maxUTXOItems      = 1 << 16
	maxRecords        = 1 << 20 // records of one transaction the state machine takes
)

// UTXOLockTTL is the lifetime of the lock record of a creation of n records.
func UTXOLockTTL(records int) time.Duration {
	return min(utxoLockBase+time.Duration(records)*utxoLockPerRecord, utxoLockMax)
}

// UTXOs serves the UTXO records.
type UTXOs struct {
	store  Store
	island Island
	limits UTXOLimits
	// step, when set, is called after each step of a creation ("lock",
	// "record", "phase1", "children", "master") and may stop the creation
	// there with an error, as a crash would: the fault tests use it.
	step func(ctx context.Context, step string) error
}

// NewUTXOs wires the UTXO service of an island.
func NewUTXOs(store Store, island Island, limits UTXOLimits) *UTXOs {
	if limits.BatchSize <= 0 {
		limits.BatchSize = wire.UTXODefaultBatchSize
	}
	if limits.MaxEntryBytes <= 0 {
		limits.MaxEntryBytes = wire.UTXODefaultEntryBytes
	}
	if limits.DefaultTxnTTL <= 0 {
		limits.DefaultTxnTTL = 30 * time.Second
	}
	if limits.MaxTxnTTL < limits.DefaultTxnTTL {
		limits.MaxTxnTTL = time.Hour
	}
	return &UTXOs{store: store, island: island, limits: limits}
}

// TxIDHex validates a transaction id: 64 hex digits, returned lower case.
func TxIDHex(s string) (string, error) {
	if !isHex32(s) {
		return "", errcode.InvalidTxID.With("txid %q is not 64 hex digits", clip(s))
	}
	return strings.ToLower(s), nil
}

func utxoHash(s, field string) (string, error) {
	if !isHex32(s) {
		return "", errcode.InvalidUTXOHash.With("%s %q is not 64 hex digits", field, clip(s))
	}
	return strings.ToLower(s), nil
}

func isHex32(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// txIDs validates a list of transaction ids and returns each once, lower
// case, in the order first listed: a transaction listed twice is updated,
// and counted, once.
func txIDs(ids []string) ([]string, error) {
	if len(ids) == 0 || len(ids) > maxUTXOItems {
		return nil, errcode.InvalidUTXORequest.With("txids must list 1-%d transactions", maxUTXOItems)
	}
	out := make([]string, 0, len(ids))
	seen := make(map[string]bool, len(ids))
	for _, raw := range ids {
		id, err := TxIDHex(raw)
		if err != nil {
			return nil, err
		}
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out, nil
}

func (u *UTXOs) txnTTL(txn string, seconds int64, floor time.Duration) (string, int64, error) {
	if txn == "" {
		if seconds != 0 {
			return "", 0, errcode.InvalidTTL.With("ttl_seconds applies to a staged request (txn_id)")
		}
		return "", 0, nil
	}
	id, err := TxnID(txn)
	if err != nil {
		return "", 0, err
	}
	ttl := max(u.limits.DefaultTxnTTL, floor)
	if seconds != 0 {
		// Compared in seconds: a duration of that many would overflow.
		maxSecs := int64(u.limits.MaxTxnTTL / time.Second)
		if seconds < 0 || seconds > maxSecs {
			return "", 0, errcode.InvalidTTL.With("ttl_seconds must be 1-%d", maxSecs)
		}
		ttl = time.Duration(seconds) * time.Second
	}
	return id, ttl.Milliseconds(), nil
}

// propose sends cmd, refusing one that would exceed the entry limit, and
// returns its result or its rejection.
func (u *UTXOs) propose(ctx context.Context, cmd *fsm.Command) (*fsm.Result, error) {
	if err := u.fits(cmd); err != nil {
		return nil, err
	}
	res, err := u.store.Propose(ctx, cmd)
	if err == nil && res.Err != nil {
		err = res.Err
	}
	return res, err
}

func (u *UTXOs) fits(cmd *fsm.Command) error {
	raw, err := fsm.Encode(cmd)
	if err != nil {
		return err
	}
	if len(raw) > u.limits.MaxEntryBytes {
		return errcode.RequestTooLarge.With("the request needs a %d-byte entry; the limit is %d (split it, or lower --utxo-batch-size)",
			len(raw), u.limits.MaxEntryBytes)
	}
	return nil
}

// createPlan is a validated create: its records' commands.
type createPlan struct {
	txid    string
	records []*fsm.UTXOCreateCmd
	txn     string
	ttl     int64
}

func (u *UTXOs) plan(req wire.UTXOCreateRequest) (*createPlan, error) {
	txid, err := TxIDHex(req.TxID)
	if err != nil {
		return nil, err
	}
	if len(req.Outputs) == 0 {
		return nil, errcode.InvalidUTXORequest.With("a transaction needs at least one output")
	}
	if len(req.Inputs) > maxUTXOItems {
		return nil, errcode.InvalidUTXORequest.With("at most %d inputs", maxUTXOItems)
	}
	outs := make([]fsm.UTXOOut, len(req.Outputs))
	for i, o := range req.Outputs {
		h, err := utxoHash(o.UTXOHash, "utxo_hash")
		if err != nil {
			return nil, err
		}
		if o.Vout >= maxVouts || o.Satoshis > maxSatoshis {
			return nil, errcode.InvalidUTXORequest.With("output %d: vout below %d and at most %d satoshis", i, maxVouts, uint64(maxSatoshis))
		}
		outs[i] = fsm.UTXOOut{Vout: o.Vout, Sats: o.Satoshis}
		hex.Decode(outs[i].Hash[:], []byte(h))
	}
	slices.SortFunc(outs, func(a, b fsm.UTXOOut) int { return int(a.Vout) - int(b.Vout) })
	for i := 1; i < len(outs); i++ {
		if outs[i].Vout == outs[i-1].Vout {
			return nil, errcode.DuplicateVout.With("vout %d is given twice", outs[i].Vout)
		}
	}
	m := &fsm.UTXOMaster{Vouts: outs[len(outs)-1].Vout + 1, Total: len(outs), Coinbase: req.Coinbase,
		Conflicting: req.Conflicting, Locked: req.Locked, Height: req.BlockHeight}
	if req.Mined != nil {
		m.BlockIDs = []uint32{req.Mined.BlockID}
		m.BlockHeights = []uint32{req.Mined.BlockHeight}
		m.SubtreeIdxs = []int32{req.Mined.SubtreeIdx}
		if m.Height == 0 {
			m.Height = req.Mined.BlockHeight
		}
	}
	for _, in := range req.Inputs {
		id, err := TxIDHex(in.TxID)
		if err != nil {
			return nil, err
		}
		m.Inputs = append(m.Inputs, fsm.UTXOPoint{TxID: id, Vout: in.Vout})
	}
	batch := uint32(u.limits.BatchSize)
	n := int((m.Vouts + batch - 1) / batch)
	if n > maxRecords {
		return nil, errcode.InvalidUTXORequest.With("vouts up to %d need %d records of %d outputs; at most %d",
			m.Vouts-1, n, batch, maxRecords)
	}
	m.Records = n
	p := &createPlan{txid: txid}
	if p.txn, p.ttl, err = u.txnTTL(req.TxnID, req.TTLSeconds, UTXOLockTTL(n)); err != nil {
		return nil, err
	}
	for i := 0; i < n; i++ {
		first := uint32(i) * batch
		c := &fsm.UTXOCreateCmd{Phase: fsm.UTXOPhaseRecord, TxID: txid, Records: n, Record: i, First: first,
			Count: min(batch, m.Vouts-first), Frozen: req.Frozen, TxnID: p.txn}
		lo, _ := slices.BinarySearchFunc(outs, first, func(o fsm.UTXOOut, v uint32) int { return int(o.Vout) - int(v) })
		hi, _ := slices.BinarySearchFunc(outs, first+c.Count, func(o fsm.UTXOOut, v uint32) int { return int(o.Vout) - int(v) })
		c.Outputs = outs[lo:hi]
		if i == 0 {
			c.Master = m
		}
		if err := u.fits(&fsm.Command{Op: fsm.OpUTXOCreate, UTXOCreate: c}); err != nil {
			return nil, err
		}
		p.records = append(p.records, c)
	}
	return p, nil
}

// stepStop is a creation stopped at a step by a fault test.
type stepStop struct{ err error }

func (s *stepStop) Error() string { return s.err.Error() }
func (s *stepStop) Unwrap() error { return s.err }

func (u *UTXOs) at(ctx context.Context, step string) error {
	if u.step == nil {
		return nil
	}
	if err := u.step(ctx, step); err != nil {
		return &stepStop{err}
	}
	return nil
}

// Create stores a transaction's outputs: the lock record, every missing
// record with creating set, then creating cleared on the children and the
// master. A create that finds the transaction complete, or being created
// under a live lock, answers tx_exists; one that finds records of an
// abandoned attempt completes them. A staged create (txn_id) stops after
// the records: the transaction's commit completes it, its rollback
// deletes it.
func (u *UTXOs) Create(ctx context.Context, req wire.UTXOCreateRequest) (*wire.UTXOCreateResponse, error) {
	p, err := u.plan(req)
	if err != nil {
		return nil, err
	}
	owner := xid.New().String()
	n := len(p.records)
	if n == 1 && p.txn == "" {
		// One record: created in one entry, never seen creating.
		c := p.records[0]
		c.Phase, c.Owner = fsm.UTXOPhaseWhole, owner
		if _, err := u.propose(ctx, &fsm.Command{Op: fsm.OpUTXOCreate, UTXOCreate: c}); err != nil {
			return nil, err
		}
		return &wire.UTXOCreateResponse{TxID: p.txid, Records: 1}, nil
	}
	ttl := UTXOLockTTL(n).Milliseconds()
	if p.txn != "" {
		ttl = p.ttl
	}
	res, err := u.propose(ctx, &fsm.Command{Op: fsm.OpUTXOCreate, UTXOCreate: &fsm.UTXOCreateCmd{
		Phase: fsm.UTXOPhaseLock, TxID: p.txid, Owner: owner, Records: n, TTL: ttl, TxnID: p.txn}})
	if err != nil {
		if p.txn == "" && lockUnknown(res) {
			err = u.giveUp(ctx, p.txid, owner, err)
		}
		return nil, err
	}
	if err := u.at(ctx, "lock"); err != nil {
		return nil, err
	}
	if len(res.UTXO.Present) == n && res.UTXO.Creating && p.txn == "" {
		// Every record is there: an earlier attempt stopped in phase 2.
		if err := u.complete(ctx, p.txid, owner, n); err != nil {
			return nil, u.giveUp(ctx, p.txid, owner, err)
		}
		return nil, errcode.TxExists.With("the transaction exists; its creation was completed")
	}
	for _, c := range p.records {
		if slices.Contains(res.UTXO.Present, c.Record) {
			continue
		}
		c.Owner = owner
		if _, err := u.propose(ctx, &fsm.Command{Op: fsm.OpUTXOCreate, UTXOCreate: c}); err != nil {
			if p.txn == "" {
				err = u.giveUp(ctx, p.txid, owner, err)
			}
			return nil, err
		}
		if err := u.at(ctx, "record"); err != nil {
			return nil, err
		}
	}
	out := &wire.UTXOCreateResponse{TxID: p.txid, Records: n}
	if p.txn != "" {
		out.TxnID = p.txn
		out.Participant = &wire.TxnParticipant{Namespace: wire.UTXOParticipantNamespace, Key: p.txid,
			BackendHash: u.island.BackendHash()}
		return out, nil
	}
	if err := u.at(ctx, "phase1"); err != nil {
		return nil, err
	}
	if err := u.complete(ctx, p.txid, owner, n); err != nil {
		return nil, u.giveUp(ctx, p.txid, owner, err)
	}
	return out, nil
}

// giveUp releases the lock of a creation that failed, so that a retry need
// not wait for it to expire (the records written stay for the retry to
// complete). A stop injected by a fault test is a crash: nothing runs. When
// err is a forward whose answer has not come, the release waits for it
// (awaitAnswer): the leader may take the failed command up after a release
// sent at once, which would then find no lock to release.
func (u *UTXOs) giveUp(ctx context.Context, txid, owner string, err error) error {
	var stopped *stepStop
	if errors.As(err, &stopped) {
		return err
	}
	awaitAnswer(ctx, err)
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_, _ = u.propose(uctx, &fsm.Command{Op: fsm.OpUTXOCreate, UTXOCreate: &fsm.UTXOCreateCmd{
		Phase: fsm.UTXOPhaseUnlock, TxID: txid, Owner: owner, Records: 1}})
	return err
}

// lockUnknown reports whether a lock proposal that failed may have taken
// the lock all the same: its answer was lost (a forward whose caller went
// away, a leader that changed) rather than a refusal of the state machine.
func lockUnknown(res *fsm.Result) bool { return res == nil || res.Err == nil }

// complete runs phase 2: children first, the master last.
func (u *UTXOs) complete(ctx context.Context, txid, owner string, n int) error {
	for _, phase := range []string{fsm.UTXOPhaseChildren, fsm.UTXOPhaseMaster} {
		if phase == fsm.UTXOPhaseChildren && n == 1 {
			continue
		}
		if _, err := u.propose(ctx, &fsm.Command{Op: fsm.OpUTXOCreate, UTXOCreate: &fsm.UTXOCreateCmd{
			Phase: phase, TxID: txid, Owner: owner, Records: n}}); err != nil {
			return err
		}
		if err := u.at(ctx, phase); err != nil {
			return err
		}
	}
	return nil
}

// recover completes the creation of txid if it was abandoned with every
// record written; it is best effort (another creator may hold the lock).
// Records missing, it leaves the transaction to its creator's retry.
func (u *UTXOs) recover(ctx context.Context, txid string) {
	var n int
	if err := u.store.Read(ctx, func(v *fsm.View) error {
		if tx := v.UTXOTx(txid); tx != nil {
			n = tx.Records
		}
		return nil
	}); err != nil || n == 0 {
		return
	}
	owner := xid.New().String()
	res, err := u.propose(ctx, &fsm.Command{Op: fsm.OpUTXOCreate, UTXOCreate: &fsm.UTXOCreateCmd{
		Phase: fsm.UTXOPhaseLock, TxID: txid, Owner: owner, Records: n, TTL: UTXOLockTTL(n).Milliseconds()}})
	if err != nil {
		if lockUnknown(res) {
			_ = u.giveUp(ctx, txid, owner, err)
		}
		return
	}
	if !res.UTXO.Creating {
		return
	}
	if len(res.UTXO.Present) < n {
		_ = u.giveUp(ctx, txid, owner, nil)
		return
	}
	if err := u.complete(ctx, txid, owner, n); err != nil {
		_ = u.giveUp(ctx, txid, owner, err)
	}
}

// Spend spends every listed output or none. Meeting a transaction whose
// creation was abandoned with all its records written, it completes that
// creation and tries once more.
func (u *UTXOs) Spend(ctx context.Context, req wire.UTXOSpendRequest) (*wire.UTXOSpendResponse, error) {
	if len(req.Spends) == 0 || len(req.Spends) > maxUTXOItems {
		return nil, errcode.InvalidUTXORequest.With("spends must list 1-%d outputs", maxUTXOItems)
	}
	c := &fsm.UTXOSpendCmd{IgnoreConflicting: req.IgnoreConflicting, IgnoreLocked: req.IgnoreLocked,
		Spends: make([]fsm.UTXOSpendItem, len(req.Spends))}
	var err error
	if c.TxnID, c.TTL, err = u.txnTTL(req.TxnID, req.TTLSeconds, 0); err != nil {
		return nil, err
	}
	var txids []string
	for i, sp := range req.Spends {
		it := &c.Spends[i]
		if it.TxID, err = TxIDHex(sp.TxID); err != nil {
			return nil, err
		}
		if it.Hash, err = utxoHash(sp.UTXOHash, "utxo_hash"); err != nil {
			return nil, err
		}
		if it.Spender, err = TxIDHex(sp.SpendingTxID); err != nil {
			return nil, err
		}
		it.Vout, it.Vin = sp.Vout, sp.Vin
		if !slices.Contains(txids, it.TxID) {
			txids = append(txids, it.TxID)
		}
	}
	cmd := &fsm.Command{Op: fsm.OpUTXOSpend, UTXOSpend: c}
	res, err := u.propose(ctx, cmd)
	if err != nil && res != nil && res.UTXO != nil && len(res.UTXO.Recover) > 0 {
		for _, id := range res.UTXO.Recover {
			u.recover(ctx, id)
		}
		res, err = u.propose(ctx, cmd)
	}
	if err != nil {
		return nil, err
	}
	out := &wire.UTXOSpendResponse{Spent: res.UTXO.Spent}
	if c.TxnID != "" {
		out.TxnID = c.TxnID
		for _, id := range txids {
			out.Participants = append(out.Participants, wire.TxnParticipant{Namespace: wire.UTXOParticipantNamespace,
				Key: id, BackendHash: u.island.BackendHash()})
		}
	}
	return out, nil
}

func outpoints(ps []wire.UTXOOutpoint, hashRequired bool) ([]fsm.UTXOPoint, error) {
	if len(ps) == 0 || len(ps) > maxUTXOItems {
		return nil, errcode.InvalidUTXORequest.With("outpoints must list 1-%d outputs", maxUTXOItems)
	}
	out := make([]fsm.UTXOPoint, len(ps))
	for i, p := range ps {
		id, err := TxIDHex(p.TxID)
		if err != nil {
			return nil, err
		}
		out[i] = fsm.UTXOPoint{TxID: id, Vout: p.Vout}
		if p.UTXOHash != "" || hashRequired {
			if out[i].Hash, err = utxoHash(p.UTXOHash, "utxo_hash"); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

func (u *UTXOs) update(ctx context.Context, c *fsm.UTXOUpdateCmd) (*wire.UTXOUpdateResponse, error) {
	res, err := u.propose(ctx, &fsm.Command{Op: fsm.OpUTXOUpdate, UTXOUpdate: c})
	if err != nil {
		return nil, err
	}
	out := &wire.UTXOUpdateResponse{Updated: res.UTXO.Updated, NotFound: res.UTXO.NotFound}
	if c.Kind == fsm.UTXOHeight {
		out.BlockHeight = &res.UTXO.Height
	}
	return out, nil
}

func (u *UTXOs) outpointOp(ctx context.Context, kind string, ps []wire.UTXOOutpoint) (*wire.UTXOUpdateResponse, error) {
	pts, err := outpoints(ps, true)
	if err != nil {
		return nil, err
	}
	return u.update(ctx, &fsm.UTXOUpdateCmd{Kind: kind, Outpoints: pts})
}

// Unspend clears the spending data of outputs, all or none.
func (u *UTXOs) Unspend(ctx context.Context, req wire.UTXOOutpointsRequest) (*wire.UTXOUpdateResponse, error) {
	return u.outpointOp(ctx, fsm.UTXOUnspend, req.Outpoints)
}

// Freeze freezes unspent outputs, all or none.
func (u *UTXOs) Freeze(ctx context.Context, req wire.UTXOOutpointsRequest) (*wire.UTXOUpdateResponse, error) {
	return u.outpointOp(ctx, fsm.UTXOFreeze, req.Outpoints)
}

// Unfreeze unfreezes frozen outputs, all or none.
func (u *UTXOs) Unfreeze(ctx context.Context, req wire.UTXOOutpointsRequest) (*wire.UTXOUpdateResponse, error) {
	return u.outpointOp(ctx, fsm.UTXOUnfreeze, req.Outpoints)
}

// Reassign gives a frozen output a new hash; it becomes spendable 1000
// blocks above the current height.
func (u *UTXOs) Reassign(ctx context.Context, req wire.UTXOReassignRequest) (*wire.UTXOUpdateResponse, error) {
	pts, err := outpoints([]wire.UTXOOutpoint{{TxID: req.TxID, Vout: req.Vout, UTXOHash: req.UTXOHash}}, true)
	if err != nil {
		return nil, err
	}
	h, err := utxoHash(req.NewUTXOHash, "new_utxo_hash")
	if err != nil {
		return nil, err
	}
	return u.update(ctx, &fsm.UTXOUpdateCmd{Kind: fsm.UTXOReassign, Outpoints: pts, NewHash: h})
}

func (u *UTXOs) txFlag(ctx context.Context, c *fsm.UTXOUpdateCmd, ids []string) (*wire.UTXOUpdateResponse, error) {
	var err error
	if c.TxIDs, err = txIDs(ids); err != nil {
		return nil, err
	}
	return u.update(ctx, c)
}

// SetConflicting sets or clears the conflicting flag of transactions.
func (u *UTXOs) SetConflicting(ctx context.Context, req wire.UTXOFlagRequest) (*wire.UTXOUpdateResponse, error) {
	return u.txFlag(ctx, &fsm.UTXOUpdateCmd{Kind: fsm.UTXOConflicting, Value: req.Value}, req.TxIDs)
}

// SetLocked sets or clears the locked flag of transactions.
func (u *UTXOs) SetLocked(ctx context.Context, req wire.UTXOFlagRequest) (*wire.UTXOUpdateResponse, error) {
	return u.txFlag(ctx, &fsm.UTXOUpdateCmd{Kind: fsm.UTXOLockedFlag, Value: req.Value}, req.TxIDs)
}

// Preserve keeps transactions until a height.
func (u *UTXOs) Preserve(ctx context.Context, req wire.UTXOPreserveRequest) (*wire.UTXOUpdateResponse, error) {
	return u.txFlag(ctx, &fsm.UTXOUpdateCmd{Kind: fsm.UTXOPreserve, Height: req.UntilHeight}, req.TxIDs)
}

// SetMined records that transactions are in a block (or, unset, no longer).
func (u *UTXOs) SetMined(ctx context.Context, req wire.UTXOMinedRequest) (*wire.UTXOUpdateResponse, error) {
	return u.txFlag(ctx, &fsm.UTXOUpdateCmd{Kind: fsm.UTXOMined, BlockID: req.BlockID, Height: req.BlockHeight,
		SubtreeIdx: req.SubtreeIdx, OnLongestChain: req.OnLongestChain, Unset: req.Unset}, req.TxIDs)
}

// SetLongestChain says whether transactions are mined on the longest chain.
func (u *UTXOs) SetLongestChain(ctx context.Context, req wire.UTXOLongestChainRequest) (*wire.UTXOUpdateResponse, error) {
	return u.txFlag(ctx, &fsm.UTXOUpdateCmd{Kind: fsm.UTXOLongestChain, OnLongestChain: req.OnLongestChain}, req.TxIDs)
}

// SetHeight sets the chain height.
func (u *UTXOs) SetHeight(ctx context.Context, req wire.UTXOHeightRequest) (*wire.UTXOUpdateResponse, error) {
	return u.update(ctx, &fsm.UTXOUpdateCmd{Kind: fsm.UTXOHeight, Height: req.BlockHeight})
}

// Get describes a transaction with every output.
func (u *UTXOs) Get(ctx context.Context, txid string, c Consistency) (*wire.UTXOTx, error) {
	id, err := TxIDHex(txid)
	if err != nil {
		return nil, err
	}
	var tx *wire.UTXOTx
	read := u.store.Read
	if c == Stale {
		read = u.store.ReadStale
	}
	if err := read(ctx, func(v *fsm.View) error {
		tx = v.UTXOTx(id)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("rm: read utxo %s: %w", id, err)
	}
	if tx == nil {
		return nil, errcode.TxNotFound.With("no transaction %s", id)
	}
	return tx, nil
}
