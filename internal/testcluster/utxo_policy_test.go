package testcluster

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/config"
	"github.com/raftlockd/raftlockd/internal/chaingen"
	"github.com/raftlockd/raftlockd/wire"
)

// The retention and rollback window are the leader's flags. A server
// configured with a shorter retention than the leader's (a rolling change
// of the flag, a mistake) serves blocks and a prune pass like any other,
// but does not put its own retention in force: a transaction whose child
// is mined fewer blocks below the height than the leader's retention
// stays, through blocks and passes proposed by that server.
func TestAFollowersRetentionIsNotPutInForce(t *testing.T) {
	c := Start(t, 3, Configure(func(cfg *config.Server) {
		cfg.UTXORetentionBlocks, cfg.UTXORollbackWindow = 50, 100
		if cfg.NodeID == "n3" {
			cfg.UTXORetentionBlocks, cfg.UTXORollbackWindow = 2, 4
		}
		cfg.UTXOPruneInterval = 100 * time.Millisecond
	}))
	if c.WaitLeader(10*time.Second) == 2 {
		// n3 must follow: another server leads once it comes back.
		c.Stop(2)
		c.WaitLeader(10 * time.Second)
		c.Start(2)
	}
	const short = 2 // n3
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl := c.RetryingClient(short)

	out := func(name string) []wire.UTXOOutput {
		return []wire.UTXOOutput{{Vout: 0, UTXOHash: chaingen.Hex(name, "out"), Satoshis: 1}}
	}
	parent, child := chaingen.Hex("parent"), chaingen.Hex("child")
	prev := chaingen.Hex("genesis")
	block := func(h uint32, txs ...wire.UTXOBlockTx) {
		t.Helper()
		hash := chaingen.Hex("block", fmt.Sprint(h))
		if _, err := cl.UTXOApplyBlock(ctx, wire.UTXOBlockRequest{Height: h, Hash: hash, PrevHash: prev, Txs: txs}); err != nil {
			t.Fatalf("block %d: %v", h, err)
		}
		prev = hash
	}
	block(1, wire.UTXOBlockTx{TxID: parent, Coinbase: true, Outputs: out("parent")})
	// Coinbase outputs mature after 100 blocks.
	for h := uint32(2); h <= 101; h++ {
		block(h, wire.UTXOBlockTx{TxID: chaingen.Hex("filler", fmt.Sprint(h)), Coinbase: true, Outputs: out(fmt.Sprint(h))})
	}
	block(102, wire.UTXOBlockTx{TxID: child, Inputs: []wire.UTXOBlockInput{{TxID: parent, Vout: 0,
		UTXOHash: chaingen.Hex("parent", "out")}}, Outputs: out("child")})
	for h := uint32(103); h <= 110; h++ {
		block(h, wire.UTXOBlockTx{TxID: chaingen.Hex("filler", fmt.Sprint(h)), Coinbase: true, Outputs: out(fmt.Sprint(h))})
	}
	if _, err := cl.UTXOPrune(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := cl.UTXOStatus(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if st.RetentionBlocks != 50 {
		t.Errorf("retention in force %d after blocks and a pass through a server of retention %d, want the leader's 50",
			st.RetentionBlocks, short)
	}
	got, err := cl.UTXOGet(ctx, parent, false)
	if err != nil {
		t.Fatalf("the parent of a child mined 8 blocks below the height, under a retention of 50: %v", err)
	}
	if got.DeleteAtHeight != 102+50 {
		t.Errorf("the parent's delete-at-height is %d, want %d", got.DeleteAtHeight, 102+50)
	}
}
