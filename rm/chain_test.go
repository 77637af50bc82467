package rm

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/internal/chaingen"
	"github.com/raftlockd/raftlockd/wire"
)

// A block too large for one Raft entry is staged in chunks and applied by
// a last small entry. Stopped after some chunks (as a crashed proposer
// would), nothing of the block is visible; sent again, it applies whole.
func TestLargeBlockIsStagedAndAppliedWhole(t *testing.T) {
	ctx := context.Background()
	store := newFSMStore(t)
	chain := NewChain(store, upgraded{}, ChainLimits{MaxEntryBytes: 8 << 10})
	gen := chaingen.New("staged")
	if _, err := chain.ApplyBlock(ctx, gen.Fund(400, 2)); err != nil {
		t.Fatal(err)
	}
	block := gen.Block(200, 2, 2) // about 55 KB: several chunks
	staged := 0
	chain.step = func(context.Context, string) error {
		if staged++; staged == 3 {
			return errors.New("proposer lost")
		}
		return nil
	}
	if _, err := chain.ApplyBlock(ctx, block); err == nil {
		t.Fatal("the interrupted apply succeeded")
	}
	st, err := chain.Status(ctx, Linearizable)
	if err != nil || st.ChainHeight != 1 || st.Transactions != 200 {
		t.Fatalf("after the interrupted apply: %+v %v", st, err)
	}
	if _, err := (&UTXOs{store: store}).Get(ctx, block.Txs[0].TxID, Linearizable); !errors.Is(err, errcode.TxNotFound) {
		t.Fatalf("a transaction of the unfinished block is visible: %v", err)
	}
	chain.step = nil
	res, err := chain.ApplyBlock(ctx, block)
	if err != nil || res.Block.EntryCount < 3 || res.Block.Created != 200 || res.Block.Spent != 400 {
		t.Fatalf("apply: %+v %v", res, err)
	}
	again, err := chain.ApplyBlock(ctx, block)
	if err != nil || !again.AlreadyApplied {
		t.Fatalf("re-apply: %+v %v", again, err)
	}
	st, _ = chain.Status(ctx, Linearizable)
	if st.ChainHeight != 2 || st.Transactions != 400 || st.LastBlock.Hash != block.Hash || st.Apply.Count != 2 {
		t.Fatalf("status: %+v", st)
	}
}

// upgraded is an island whose every server applies this build's entry
// format.
type upgraded struct{}

func (upgraded) EveryServerApplies() bool { return true }

func TestBadBlocksAreRefusedBeforeRaft(t *testing.T) {
	ctx := context.Background()
	store := newFSMStore(t)
	proposed := 0
	store.refuse = func(*fsm.Command) error { proposed++; return nil }
	chain := NewChain(store, upgraded{}, ChainLimits{})
	good := chaingen.New("bad").Fund(2, 2)
	cases := map[string]struct {
		edit func(b *wire.UTXOBlockRequest)
		code *errcode.Error
	}{
		"bad hash":      {func(b *wire.UTXOBlockRequest) { b.Hash = "xyz" }, errcode.InvalidUTXOBlock},
		"bad prev":      {func(b *wire.UTXOBlockRequest) { b.PrevHash = "" }, errcode.InvalidUTXOBlock},
		"no txs":        {func(b *wire.UTXOBlockRequest) { b.Txs = nil }, errcode.InvalidUTXOBlock},
		"no outputs":    {func(b *wire.UTXOBlockRequest) { b.Txs[0].Outputs = nil }, errcode.InvalidUTXOBlock},
		"bad txid":      {func(b *wire.UTXOBlockRequest) { b.Txs[0].TxID = "00" }, errcode.InvalidTxID},
		"bad utxo hash": {func(b *wire.UTXOBlockRequest) { b.Txs[0].Outputs[0].UTXOHash = "zz" }, errcode.InvalidUTXOHash},
		"vout order": {func(b *wire.UTXOBlockRequest) { b.Txs[0].Outputs[1].Vout = b.Txs[0].Outputs[0].Vout },
			errcode.DuplicateVout},
		"its own prev":  {func(b *wire.UTXOBlockRequest) { b.PrevHash = b.Hash }, errcode.InvalidUTXOBlock},
		"last height":   {func(b *wire.UTXOBlockRequest) { b.Height = math.MaxUint32 }, errcode.InvalidUTXOBlock},
		"vout too high": {func(b *wire.UTXOBlockRequest) { b.Txs[0].Outputs[1].Vout = fsm.MaxBlockVout + 1 }, errcode.InvalidUTXOBlock},
		"coinbase with inputs": {func(b *wire.UTXOBlockRequest) {
			b.Txs[0].Coinbase = true
			b.Txs[0].Inputs = []wire.UTXOBlockInput{{TxID: b.Txs[0].TxID, UTXOHash: b.Txs[0].TxID}}
		}, errcode.InvalidUTXOBlock},
	}
	for name, tc := range cases {
		b := chaingen.New("bad").Fund(2, 2)
		tc.edit(&b)
		if _, err := chain.ApplyBlock(ctx, b); !errors.Is(err, tc.code) {
			t.Errorf("%s: %v, want %s", name, err, tc.code.Code)
		}
	}
	if proposed != 0 {
		t.Fatalf("%d bad blocks reached Raft", proposed)
	}
	if _, err := chain.ApplyBlock(ctx, good); err != nil {
		t.Fatal(err)
	}
}
