package rm

import (
	"context"
	"encoding/hex"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/wire"
)

// The chain of blocks over the UTXO records: apply a block, roll blocks
// back, run a prune pass, and the status view. This service validates
// requests, turns a block into its Raft entries (one when it fits,
// otherwise staged chunks and a small apply entry) and times what it
// proposes; the state machine plans and executes (fsm/utxo_block.go,
// fsm/utxo_prune.go).

// ChainLimits are the server's chain policies.
type ChainLimits struct {
	MaxEntryBytes int    // largest Raft entry (--max-entry-bytes)
	Retention     uint32 // --utxo-retention-blocks
	Window        uint32 // --utxo-rollback-window
	PruneBatch    int    // transactions a prune pass looks at (--utxo-prune-batch)
}

// Block request bounds.
const (
	maxBlockTxs    = 1 << 20
	maxBlockInputs = 1 << 16
)

// Upgrade tells whether every server of the island applies this build's
// entry format (fsm.EntryFormat). A command whose meaning changed with that
// format is proposed in its new form only then, so that every node applies
// it alike while a cluster is being upgraded.
type Upgrade interface {
	EveryServerApplies() bool
}

// Chain serves blocks, rollbacks, pruning and the UTXO status.
type Chain struct {
	store   Store
	upgrade Upgrade
	limits  ChainLimits
	// observe, when set, is told the duration of each apply, rollback and
	// prune and how many items it handled (metrics).
	observe func(op string, d time.Duration, items int)
	// step, when set, is called after each staged chunk of a block and may
	// stop the apply there, as a crash would: the fault tests use it.
	step func(ctx context.Context, step string) error
	// leads, when set, tells whether this server leads its island: only
	// the leader's retention and window are put in force.
	leads func() bool

	mu      sync.Mutex
	timings map[string]*wire.UTXOTiming
}

// NewChain wires the chain service of an island.
func NewChain(store Store, upgrade Upgrade, limits ChainLimits) *Chain {
	if limits.MaxEntryBytes <= 0 {
		limits.MaxEntryBytes = wire.UTXODefaultEntryBytes
	}
	if limits.Retention == 0 {
		limits.Retention = fsm.DefaultUTXORetention
	}
	limits.Window = max(limits.Window, limits.Retention)
	if limits.PruneBatch <= 0 {
		limits.PruneBatch = 1000
	}
	return &Chain{store: store, upgrade: upgrade, limits: limits, timings: map[string]*wire.UTXOTiming{}}
}

// Observe sets the function told of every timed operation.
func (c *Chain) Observe(fn func(op string, d time.Duration, items int)) { c.observe = fn }

// Leads sets the function that tells whether this server leads its island.
// Without it the server is taken for the leader.
func (c *Chain) Leads(fn func() bool) { c.leads = fn }

// policy is the retention and rollback window a block apply or prune pass
// proposed by this server records in the replicated state: this server's
// flags when it leads, otherwise none (0 leaves the recorded ones as they
// are), since the retention and window in force are the leader's. A server
// of other flags serving a request must not shorten how long spent
// transactions are kept.
func (c *Chain) policy() (retention, window uint32) {
	if c.leads != nil && !c.leads() {
		return 0, 0
	}
	return c.limits.Retention, c.limits.Window
}

func (c *Chain) timed(op string, start time.Time, items int) float64 {
	d := time.Since(start)
	ms := float64(d.Microseconds()) / 1000
	c.mu.Lock()
	t := c.timings[op]
	if t == nil {
		t = &wire.UTXOTiming{}
		c.timings[op] = t
	}
	t.MeanMs = (t.MeanMs*float64(t.Count) + ms) / float64(t.Count+1)
	t.Count++
	t.LastMs = ms
	c.mu.Unlock()
	if c.observe != nil {
		c.observe(op, d, items)
	}
	return ms
}

func (c *Chain) timing(op string) wire.UTXOTiming {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t := c.timings[op]; t != nil {
		return *t
	}
	return wire.UTXOTiming{}
}

func hex32(s, field string, bad *errcode.Error) ([32]byte, error) {
	var out [32]byte
	if !isHex32(s) {
		return out, bad.With("%s %q is not 64 hex digits", field, clip(s))
	}
	_, _ = hex.Decode(out[:], []byte(s))
	return out, nil
}

// blockTxs validates a block's transactions.
func blockTxs(req wire.UTXOBlockRequest) ([]fsm.BlockTx, error) {
	if len(req.Txs) == 0 || len(req.Txs) > maxBlockTxs {
		return nil, errcode.InvalidUTXOBlock.With("a block lists 1-%d transactions", maxBlockTxs)
	}
	txs := make([]fsm.BlockTx, len(req.Txs))
	for i, t := range req.Txs {
		var err error
		bt := &txs[i]
		if bt.TxID, err = hex32(t.TxID, fmt.Sprintf("txs[%d].txid", i), errcode.InvalidTxID); err != nil {
			return nil, err
		}
		bt.Coinbase = t.Coinbase
		if len(t.Inputs) > maxBlockInputs || len(t.Outputs) > maxVouts || (t.Coinbase && len(t.Inputs) > 0) {
			return nil, errcode.InvalidUTXOBlock.With("txs[%d]: a coinbase has no inputs, any other transaction at most %d", i, maxBlockInputs)
		}
		if len(t.Outputs) == 0 {
			return nil, errcode.InvalidUTXOBlock.With("txs[%d]: a transaction needs at least one output", i)
		}
		bt.Inputs = make([]fsm.BlockIn, len(t.Inputs))
		for j, in := range t.Inputs {
			if bt.Inputs[j].TxID, err = hex32(in.TxID, fmt.Sprintf("txs[%d].inputs[%d].txid", i, j), errcode.InvalidTxID); err != nil {
				return nil, err
			}
			if bt.Inputs[j].Hash, err = hex32(in.UTXOHash, fmt.Sprintf("txs[%d].inputs[%d].utxo_hash", i, j), errcode.InvalidUTXOHash); err != nil {
				return nil, err
			}
			bt.Inputs[j].Vout = in.Vout
		}
		bt.Outputs = make([]fsm.UTXOOut, len(t.Outputs))
		for j, o := range t.Outputs {
			if j > 0 && o.Vout <= t.Outputs[j-1].Vout {
				return nil, errcode.DuplicateVout.With("txs[%d]: outputs must be in increasing vout order", i)
			}
			if o.Vout > fsm.MaxBlockVout {
				return nil, errcode.InvalidUTXOBlock.With("txs[%d].outputs[%d]: vout above %d", i, j, fsm.MaxBlockVout)
			}
			if o.Satoshis > maxSatoshis {
				return nil, errcode.InvalidUTXORequest.With("txs[%d].outputs[%d]: satoshis above 21 million coins", i, j)
			}
			if bt.Outputs[j].Hash, err = hex32(o.UTXOHash, fmt.Sprintf("txs[%d].outputs[%d].utxo_hash", i, j), errcode.InvalidUTXOHash); err != nil {
				return nil, err
			}
			bt.Outputs[j].Vout, bt.Outputs[j].Sats = o.Vout, o.Satoshis
		}
	}
	return txs, nil
}

// ApplyBlock applies a whole block, atomically.
func (c *Chain) ApplyBlock(ctx context.Context, req wire.UTXOBlockRequest) (*wire.UTXOBlockResponse, error) {
	start := time.Now()
	hash, err := TxIDHex(req.Hash)
	if err != nil {
		return nil, errcode.InvalidUTXOBlock.With("hash %q is not 64 hex digits", clip(req.Hash))
	}
	prev, err := TxIDHex(req.PrevHash)
	if err != nil {
		return nil, errcode.InvalidUTXOBlock.With("prev_hash %q is not 64 hex digits", clip(req.PrevHash))
	}
	if hash == prev {
		return nil, errcode.InvalidUTXOBlock.With("a block cannot be its own prev_hash")
	}
	if req.Height == math.MaxUint32 {
		// No block could follow it: heights are 32 bits.
		return nil, errcode.InvalidUTXOBlock.With("height %d: a block's height is below %d", req.Height, uint32(math.MaxUint32))
	}
	txs, err := blockTxs(req)
	if err != nil {
		return nil, err
	}
	cmd := &fsm.UTXOBlockCmd{Phase: fsm.BlockPhaseApply, Height: req.Height, Hash: hash, Prev: prev, Txs: txs}
	cmd.Retention, cmd.Window = c.policy()
	entries := 1
	if payload(txs) > c.limits.MaxEntryBytes-blockHeaderBytes {
		// Too large for one entry: stage it in chunks nothing reads, then
		// apply the whole from a small entry.
		chunks, err := c.chunks(txs)
		if err != nil {
			return nil, err
		}
		for i, part := range chunks {
			stage := &fsm.UTXOBlockCmd{Phase: fsm.BlockPhaseStage, Height: req.Height, Hash: hash, Chunk: i, Txs: part}
			res, err := c.propose(ctx, stage)
			if err != nil {
				return nil, err
			}
			if res.Block != nil && res.Block.AlreadyApplied {
				break
			}
			if c.step != nil {
				if err := c.step(ctx, "staged"); err != nil {
					return nil, err
				}
			}
		}
		cmd.Txs, cmd.Chunks = nil, len(chunks)
		entries += len(chunks)
	}
	res, err := c.propose(ctx, cmd)
	if err != nil {
		return nil, err
	}
	b := res.Block
	out := &wire.UTXOBlockResponse{AlreadyApplied: b.AlreadyApplied, ChainHeight: b.Height}
	if b.Applied != nil {
		out.Block = blockInfo(b.Applied)
	}
	if !b.AlreadyApplied {
		out.Block.EntryCount = entries
		c.timed("apply", start, len(txs))
	}
	return out, nil
}

// blockHeaderBytes is room for a block command's JSON header in its entry.
const blockHeaderBytes = 1024

func payload(txs []fsm.BlockTx) int {
	n := 0
	for _, t := range txs {
		n += fsm.BlockTxBytes(t)
	}
	return n
}

// chunks splits txs into runs that each fit an entry with its header.
func (c *Chain) chunks(txs []fsm.BlockTx) ([][]fsm.BlockTx, error) {
	budget := c.limits.MaxEntryBytes - blockHeaderBytes
	var out [][]fsm.BlockTx
	start, size := 0, 0
	for i, t := range txs {
		n := fsm.BlockTxBytes(t)
		if n > budget {
			return nil, errcode.RequestTooLarge.With("txs[%d] needs more than a %d-byte entry", i, c.limits.MaxEntryBytes)
		}
		if size+n > budget {
			out = append(out, txs[start:i])
			start, size = i, 0
		}
		size += n
	}
	return append(out, txs[start:]), nil
}

func (c *Chain) propose(ctx context.Context, cmd *fsm.UTXOBlockCmd) (*fsm.UTXOResult, error) {
	res, err := c.store.Propose(ctx, &fsm.Command{Op: fsm.OpUTXOBlock, UTXOBlock: cmd})
	if err == nil && res.Err != nil {
		err = res.Err
	}
	if err != nil {
		return nil, err
	}
	return res.UTXO, nil
}

func blockInfo(b *fsm.BlockInfo) wire.UTXOBlockInfo {
	return wire.UTXOBlockInfo{Height: b.Height, Hash: b.Hash, PrevHash: b.Prev, BlockID: b.ID, Txs: b.Txs,
		Created: b.Created, Mined: b.Mined, Spent: b.Spent, AppliedAt: b.At}
}

// Rollback undoes the blocks above req.ToHeight.
func (c *Chain) Rollback(ctx context.Context, req wire.UTXORollbackRequest) (*wire.UTXORollbackResponse, error) {
	start := time.Now()
	res, err := c.propose(ctx, &fsm.UTXOBlockCmd{Phase: fsm.BlockPhaseRollback, Height: req.ToHeight})
	if err != nil {
		return nil, err
	}
	out := &wire.UTXORollbackResponse{ChainHeight: res.Block.Height, Undone: []wire.UTXOBlockInfo{}}
	for i := range res.Block.Undone {
		out.Undone = append(out.Undone, blockInfo(&res.Block.Undone[i]))
	}
	if len(out.Undone) > 0 {
		c.timed("rollback", start, len(out.Undone))
	}
	return out, nil
}

// Prune runs one prune pass now. Proposed by the leader, it also records
// this server's retention and rollback window in the replicated state;
// otherwise it judges by those recorded.
func (c *Chain) Prune(ctx context.Context) (*wire.UTXOPruneResponse, error) {
	start := time.Now()
	pass := &fsm.UTXOPruneCmd{Limit: c.limits.PruneBatch, KeepTip: c.upgrade.EveryServerApplies()}
	pass.Retention, pass.Window = c.policy()
	res, err := c.store.Propose(ctx, &fsm.Command{Op: fsm.OpUTXOPrune, UTXOPrune: pass})
	if err == nil && res.Err != nil {
		err = res.Err
	}
	if err != nil {
		return nil, err
	}
	p := res.UTXO.Prune
	out := &wire.UTXOPruneResponse{Examined: p.Examined, Pruned: append([]string{}, p.Pruned...), Preserved: p.Preserved,
		DeltasFreed: p.DeltasFreed, Cursor: p.Cursor, Wrapped: p.Wrapped, ChainHeight: p.Height,
		Retained: wire.UTXORetained(p.Retained)}
	out.DurationMs = c.timed("prune", start, len(p.Pruned))
	return out, nil
}

// PolicyStale reports whether the retention and rollback window in v are
// not this server's: a prune pass records them.
func (c *Chain) PolicyStale(v *fsm.View) bool {
	st := v.UTXOPolicy()
	return st.Retention != c.limits.Retention || st.Window != c.limits.Window
}

// Status returns the UTXO status view.
func (c *Chain) Status(ctx context.Context, cons Consistency) (*wire.UTXOStatus, error) {
	var st fsm.UTXOStatus
	read := c.store.Read
	if cons == Stale {
		read = c.store.ReadStale
	}
	if err := read(ctx, func(v *fsm.View) error { st = v.UTXOStatus(); return nil }); err != nil {
		return nil, fmt.Errorf("rm: read utxo status: %w", err)
	}
	out := &wire.UTXOStatus{ChainHeight: st.Height, RetentionBlocks: st.Retention, RollbackWindow: st.Window,
		OldestRollback: st.OldestDelta, Deltas: st.Deltas, Transactions: st.Stats.Txs, Records: st.Stats.Records,
		Outputs: st.Stats.Outputs, DAHPending: st.Stats.DAHPending, DAHDue: st.DueNow, PruneCursor: st.Cursor,
		Pruned: st.Stats.Pruned, PrunePasses: st.Stats.Passes, PruneCycles: st.Stats.Cycles,
		Retained: wire.UTXORetained(st.Stats.Retained), RetainedLast: wire.UTXORetained(st.Stats.LastRetained),
		BlocksApplied: st.Stats.BlocksApplied, BlocksRolledBack: st.Stats.BlocksUndone,
		Apply: c.timing("apply"), Rollback: c.timing("rollback"), Prune: c.timing("prune")}
	if st.Tip != nil {
		b := blockInfo(st.Tip)
		out.LastBlock = &b
	}
	return out, nil
}
