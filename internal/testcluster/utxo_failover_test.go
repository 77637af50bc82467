package testcluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/config"
	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/wire"
)

// Three spenders race for the same outputs through different nodes while
// the leader crashes and comes back: no output is ever acknowledged to two
// different children, every acknowledged spend is what every node holds
// afterwards, and an output nobody was told they won is spent by one of
// the children that tried, or by none.
func TestLeaderCrashDuringConflictingSpends(t *testing.T) {
	c := Start(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const outputs = 60
	parent := testutil.UTXOTx("parent", outputs, 546)
	if _, err := c.RetryingClient(others(c, leader)[0]).UTXOCreate(ctx, parent); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	won := map[int][]string{} // vout -> children told they spent it
	var progress sync.WaitGroup
	started := make(chan struct{}, 3*outputs)
	spender := func(child string, node int) {
		defer progress.Done()
		cl := c.RetryingClient(node)
		for v := 0; v < outputs && ctx.Err() == nil; v++ {
			started <- struct{}{}
			req := wire.UTXOSpendRequest{Spends: []wire.UTXOSpend{testutil.UTXOSpend("parent", v, child, 0)}}
			// Retried until the answer is known: a repeated spend of the
			// same output by the same child is a success without change.
			for ctx.Err() == nil {
				_, err := cl.UTXOSpend(ctx, req)
				var e *errcode.Error
				if err == nil {
					mu.Lock()
					won[v] = append(won[v], child)
					mu.Unlock()
					break
				}
				if errors.As(err, &e) && e.Code == errcode.UTXOSpendFailed.Code {
					break // lost the race
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	for i, child := range []string{"alice", "bob", "carol"} {
		progress.Add(1)
		go spender(child, i)
	}
	// The leader crashes a third of the way in and returns at two thirds.
	for n := 0; n < 3*outputs; n++ {
		<-started
		switch n {
		case outputs:
			c.Crash(leader)
		case 2 * outputs:
			c.Start(leader)
		}
	}
	progress.Wait()
	if ctx.Err() != nil {
		t.Fatal("the spenders did not finish in time")
	}
	c.WaitConverged(20 * time.Second)

	got, err := c.RetryingClient(leader).UTXOGet(context.Background(), parent.TxID, false)
	if err != nil {
		t.Fatal(err)
	}
	children := map[string]bool{testutil.Hash32("alice"): true, testutil.Hash32("bob"): true, testutil.Hash32("carol"): true}
	spent := 0
	for _, o := range got.Outputs {
		v := int(o.Vout)
		if len(won[v]) > 1 {
			t.Errorf("output %d was acknowledged to %v", v, won[v])
		}
		if len(won[v]) == 1 && o.SpendingTxID != testutil.Hash32(won[v][0]) {
			t.Errorf("output %d acknowledged to %s is spent by %s", v, won[v][0], o.SpendingTxID)
		}
		if o.SpendingTxID != "" {
			spent++
			if !children[o.SpendingTxID] {
				t.Errorf("output %d spent by an unknown child %s", v, o.SpendingTxID)
			}
		}
	}
	if spent != got.SpentOutputs || spent != outputs {
		t.Errorf("%d outputs spent, counter %d, of %d", spent, got.SpentOutputs, outputs)
	}
}

// Five creates of one multi-record transaction race through the three
// nodes: one succeeds, four answer tx_exists, and the transaction is never
// left creating.
func TestConcurrentMultiRecordCreates(t *testing.T) {
	c := Start(t, 3, Configure(func(cfg *config.Server) { cfg.UTXOBatchSize = 4 }))
	c.WaitLeader(10 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for round := 0; round < 5; round++ {
		req := testutil.UTXOTx(fmt.Sprintf("race-%d", round), 18, 1)
		errs := make([]error, 5)
		var wg sync.WaitGroup
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = c.Client(i%3).UTXOCreate(ctx, req)
			}()
		}
		wg.Wait()
		ok := 0
		for _, err := range errs {
			var e *errcode.Error
			switch {
			case err == nil:
				ok++
			case !errors.As(err, &e) || e.Code != errcode.TxExists.Code:
				t.Fatalf("round %d: %v", round, err)
			}
		}
		got, err := c.Client(0).UTXOGet(ctx, req.TxID, false)
		if ok != 1 || err != nil || got.Creating || len(got.RecordsCreating) != 0 || got.Records != 5 || len(got.Outputs) != 18 {
			t.Fatalf("round %d: %d successes (%v); %+v, %v", round, ok, errs, got, err)
		}
	}
	c.WaitConverged(15 * time.Second)
}
