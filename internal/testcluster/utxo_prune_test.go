package testcluster

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/config"
	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/internal/chaingen"
	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/wire"
)

// Blocks are applied on a three-node cluster while the leader's pruner
// deletes spent transactions a few at a time; the leader crashes in the
// middle of it. The new leader's pruner resumes from the replicated
// cursor: in the end every fully spent transaction whose children are
// stable is gone, deleted once (the pruned counter equals the number of
// transactions that are gone), the one whose child is unmined is still
// there, and every node holds the same state.
func TestLeaderCrashInTheMiddleOfPruning(t *testing.T) {
	c := Start(t, 3, Configure(func(cfg *config.Server) {
		cfg.UTXORetentionBlocks, cfg.UTXORollbackWindow = 2, 4
		cfg.UTXOPruneBatch, cfg.UTXOPruneInterval = 3, 150*time.Millisecond
	}))
	leader := c.WaitLeader(10 * time.Second)
	cl := c.RetryingClient(others(c, leader)[0])
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	gen := chaingen.New("prune")
	var blocks []wire.UTXOBlockRequest
	blocks = append(blocks, gen.Fund(102, 2)) // 51 transactions; the blocks spend 50
	for i := 0; i < 5; i++ {
		blocks = append(blocks, gen.Block(10, 2, 2)) // each spends both outputs of one earlier transaction
	}
	for _, b := range blocks {
		if _, err := cl.UTXOApplyBlock(ctx, b); err != nil {
			t.Fatalf("block %d: %v", b.Height, err)
		}
	}
	// A transaction of the funding block spent by a child that is not
	// mined: it must stay.
	kept := blocks[0].Txs[50]
	child := chaingen.Hex("unmined child")
	if _, err := cl.UTXOCreate(ctx, wire.UTXOCreateRequest{TxID: child, Outputs: []wire.UTXOOutput{{Vout: 0,
		UTXOHash: chaingen.Hex("unmined child", "out"), Satoshis: 1}}}); err != nil {
		t.Fatal(err)
	}
	var spends []wire.UTXOSpend
	for _, o := range kept.Outputs {
		spends = append(spends, wire.UTXOSpend{TxID: kept.TxID, Vout: o.Vout, UTXOHash: o.UTXOHash, SpendingTxID: child, Vin: o.Vout})
	}
	if _, err := cl.UTXOSpend(ctx, wire.UTXOSpendRequest{Spends: spends}); err != nil {
		t.Fatal(err)
	}
	// Which transactions are fully spent by mined children.
	spentBy := map[string]int{}
	for _, b := range blocks {
		for _, tx := range b.Txs {
			for _, in := range tx.Inputs {
				spentBy[in.TxID]++
			}
		}
	}
	var gone []string
	for _, b := range blocks {
		for _, tx := range b.Txs {
			if spentBy[tx.TxID] == len(tx.Outputs) {
				gone = append(gone, tx.TxID)
			}
		}
	}
	// Move the chain on so that every child is stable: pruning starts.
	for i := 0; i < 3; i++ {
		if _, err := cl.UTXOApplyBlock(ctx, gen.Fund(2, 2)); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, 30*time.Second, "the pruner to have started", func() bool {
		st, err := cl.UTXOStatus(ctx, false)
		return err == nil && st.Pruned > 0
	})
	before, err := cl.UTXOStatus(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if before.Pruned >= int64(len(gone)) {
		t.Fatalf("pruning finished before the crash (%d of %d): make the passes smaller", before.Pruned, len(gone))
	}
	c.Crash(leader)
	testutil.WaitFor(t, 60*time.Second, "the new leader to finish pruning", func() bool {
		st, err := cl.UTXOStatus(ctx, false)
		return err == nil && st.DAHDue == 1 && st.Pruned >= int64(len(gone))
	})
	st, err := cl.UTXOStatus(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if st.Pruned != int64(len(gone)) || st.PrunePasses <= before.PrunePasses || st.RetainedLast.UnminedChild != 1 {
		t.Fatalf("pruned %d of %d; passes %d then %d; %+v", st.Pruned, len(gone), before.PrunePasses, st.PrunePasses, st)
	}
	for _, b := range blocks {
		for _, tx := range b.Txs {
			_, err := cl.UTXOGet(ctx, tx.TxID, false)
			if want := !slices.Contains(gone, tx.TxID); (err == nil) != want {
				t.Errorf("%s: present %v, want %v (%v)", tx.TxID, err == nil, want, err)
			}
		}
	}
	if _, err := cl.UTXOGet(ctx, kept.TxID, false); err != nil {
		t.Fatalf("the parent of an unmined child was deleted: %v", err)
	}
	c.Start(leader)
	c.WaitConverged(20 * time.Second)
}

// The retention and rollback window a server is started with are in force
// before any block is applied. A rollback to the oldest height the window
// keeps leaves that block as the tip: the chain goes on from it and from
// nothing else, and nothing below it can be reached.
func TestRollbackToTheWindowsEdgeKeepsTheTip(t *testing.T) {
	c := Start(t, 3, Configure(func(cfg *config.Server) {
		cfg.UTXORetentionBlocks, cfg.UTXORollbackWindow = 2, 3
		cfg.UTXOPruneInterval = 50 * time.Millisecond
	}))
	leader := c.WaitLeader(10 * time.Second)
	cl := c.RetryingClient(others(c, leader)[0])
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Until gossip shows every server on this build's entry format, prune
	// passes free as older builds do.
	testutil.WaitFor(t, 10*time.Second, "every server to announce this build's entry format",
		c.Nodes[leader].Server.Node().EveryServerApplies)
	testutil.WaitFor(t, 10*time.Second, "the configured retention and window", func() bool {
		st, err := cl.UTXOStatus(ctx, false)
		return err == nil && st.RetentionBlocks == 2 && st.RollbackWindow == 3
	})

	gen := chaingen.New("edge")
	var blocks []wire.UTXOBlockRequest
	for i := 0; i < 8; i++ {
		b := gen.Fund(2, 1)
		blocks = append(blocks, b)
		if _, err := cl.UTXOApplyBlock(ctx, b); err != nil {
			t.Fatalf("block %d: %v", b.Height, err)
		}
	}
	testutil.WaitFor(t, 10*time.Second, "the pruner to free the deltas out of the window", func() bool {
		st, err := cl.UTXOStatus(ctx, false)
		return err == nil && st.Deltas == 3 && st.OldestRollback == 5
	})
	if res, err := cl.UTXORollback(ctx, 5); err != nil || len(res.Undone) != 3 || res.ChainHeight != 5 {
		t.Fatalf("rollback to the window's edge: %+v %v", res, err)
	}
	st, err := cl.UTXOStatus(ctx, false)
	if err != nil || st.LastBlock == nil || st.LastBlock.Hash != blocks[4].Hash || st.ChainHeight != 5 {
		t.Fatalf("status after the rollback: %+v %v", st, err)
	}
	if _, err := cl.UTXORollback(ctx, 4); !errors.Is(err, errcode.BlockRollbackWindow) {
		t.Fatalf("rollback below the window: %v", err)
	}
	stray := chaingen.New("stray").Fund(1, 1)
	if _, err := cl.UTXOApplyBlock(ctx, stray); !errors.Is(err, errcode.BlockNotOnTip) {
		t.Fatalf("a block that does not extend the tip: %v", err)
	}
	next := chaingen.New("next").Fund(1, 1)
	next.Height, next.PrevHash = 6, blocks[4].Hash
	if res, err := cl.UTXOApplyBlock(ctx, next); err != nil || res.ChainHeight != 6 {
		t.Fatalf("a block on the tip: %+v %v", res, err)
	}
	c.WaitConverged(20 * time.Second)
}
