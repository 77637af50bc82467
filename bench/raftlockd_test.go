package bench

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/auth"
	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/wire"
)

// recordingUTXO is the raftlockd driver noting the transactions it created
// and spent successfully.
type recordingUTXO struct {
	*Raftlockd

	mu      sync.Mutex
	created map[string][]string // txid -> output hashes
	spent   map[string][]Outpoint
}

func (r *recordingUTXO) UTXOCreate(ctx context.Context, worker int, txid string, hashes []string) error {
	if err := r.Raftlockd.UTXOCreate(ctx, worker, txid, hashes); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.created[txid] = hashes
	return nil
}

func (r *recordingUTXO) UTXOSpend(ctx context.Context, worker int, spender string, ins []Outpoint) error {
	if err := r.Raftlockd.UTXOSpend(ctx, worker, spender, ins); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.spent[spender] = ins
	return nil
}

// TestRaftlockdUTXOWorkloads runs utxo-spend and utxo-create against a
// real single-node server and reads back what they wrote.
func TestRaftlockdUTXOWorkloads(t *testing.T) {
	srv := testutil.StartServer(t, testutil.Config(t, t.TempDir()))
	c := testutil.Client(t, srv.URL())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d := &recordingUTXO{Raftlockd: &Raftlockd{Clients: []*client.Client{c}}, created: map[string][]string{},
		spent: map[string][]Outpoint{}}

	// 5 outputs per parent: each client runs out and creates more.
	res, err := Run(ctx, d, Options{Workload: UTXOSpend, Clients: 3, Ops: 40, Warmup: 100 * time.Millisecond, ParentOutputs: 5})
	if err != nil {
		t.Fatal(err)
	}
	if res.System != "raftlockd" || res.Ops != 40 || res.Errors != 0 {
		t.Fatalf("utxo-spend: %d ops, %d errors (%s)", res.Ops, res.Errors, res.FirstErr)
	}
	if len(d.spent) < 41 || len(d.created) < 2*3*2 {
		t.Fatalf("%d spends of %d parents: the clients did not create more parents", len(d.spent), len(d.created))
	}
	parents := map[string]*wire.UTXOTx{}
	for txid := range d.created {
		tx, err := c.UTXOGet(ctx, txid, false)
		if err != nil {
			t.Fatal(err)
		}
		if tx.TotalOutputs != 5 {
			t.Fatalf("parent %s: %d outputs, want 5", txid, tx.TotalOutputs)
		}
		for v, o := range tx.Outputs {
			if o.UTXOHash != d.created[txid][v] {
				t.Fatalf("parent %s output %d: hash %s, want %s", txid, v, o.UTXOHash, d.created[txid][v])
			}
		}
		parents[txid] = tx
	}
	for spender, ins := range d.spent {
		if len(ins) != 2 || ins[0].TxID == ins[1].TxID {
			t.Fatalf("spend %s: inputs %+v, want one output of each of two parents", spender, ins)
		}
		for vin, in := range ins {
			o := parents[in.TxID].Outputs[in.Vout]
			if o.SpendingTxID != spender || o.Vin == nil || *o.Vin != uint32(vin) {
				t.Fatalf("%s:%d spent by %s vin %v, want %s vin %d", in.TxID, in.Vout, o.SpendingTxID, o.Vin, spender, vin)
			}
		}
	}
	// The spends were real: spending an output again is refused.
	for spender, ins := range d.spent {
		err := d.Raftlockd.UTXOSpend(ctx, 0, newTxID(), ins[:1])
		var e *errcode.Error
		if !errors.Is(err, errcode.UTXOSpendFailed) || !errors.As(err, &e) || len(e.Spends) != 1 ||
			e.Spends[0].Code != wire.UTXOSpent || e.Spends[0].SpendingTxID != spender {
			t.Fatalf("second spend of an output spent by %s: %v (%+v)", spender, err, e)
		}
		break
	}

	clear(d.created)
	res, err = Run(ctx, d, Options{Workload: UTXOCreate, Clients: 2, Ops: 10})
	if err != nil {
		t.Fatal(err)
	}
	if res.Ops != 10 || res.Errors != 0 || len(d.created) != 11 {
		t.Fatalf("utxo-create: %d ops, %d errors (%s), %d transactions", res.Ops, res.Errors, res.FirstErr, len(d.created))
	}
	for txid, hashes := range d.created {
		tx, err := c.UTXOGet(ctx, txid, false)
		if err != nil {
			t.Fatal(err)
		}
		if tx.TotalOutputs != 2 || tx.SpentOutputs != 0 || tx.Outputs[0].UTXOHash != hashes[0] || tx.Outputs[1].UTXOHash != hashes[1] {
			t.Fatalf("created %s: %+v", txid, tx)
		}
	}
}

// countingTransport counts the acquires sent while counting is on.
type countingTransport struct {
	base     http.RoundTripper
	counting atomic.Bool
	acquires atomic.Int64
}

func (c *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if c.counting.Load() && req.URL.Path == "/v1/acquire" {
		c.acquires.Add(1)
	}
	return c.base.RoundTrip(req)
}

// TestRaftlockdPutAcquiresOutsideTheMeasurement: put measures one update
// under a lease the client holds for the run; taking the lease is not
// part of any measured operation.
func TestRaftlockdPutAcquiresOutsideTheMeasurement(t *testing.T) {
	srv := testutil.StartServer(t, testutil.Config(t, t.TempDir()))
	tr := &countingTransport{base: &http.Transport{TLSClientConfig: auth.ClientConfig(testutil.ClientBundle(t))}}
	c, err := client.New(srv.URL(), client.WithHTTPClient(&http.Client{Transport: tr}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, warmup := range []time.Duration{0, 100 * time.Millisecond} {
		tr.acquires.Store(0)
		res, err := Run(ctx, &Raftlockd{Clients: []*client.Client{c}}, Options{Workload: Put, Clients: 3, Ops: 30, Warmup: warmup,
			Measure: func(context.Context) func(*Result) {
				tr.counting.Store(true)
				return func(*Result) { tr.counting.Store(false) }
			}})
		if err != nil {
			t.Fatal(err)
		}
		if res.Ops != 30 || res.Errors != 0 {
			t.Fatalf("warm-up %v: %d ops, %d errors (%s)", warmup, res.Ops, res.Errors, res.FirstErr)
		}
		if n := tr.acquires.Load(); n != 0 {
			t.Errorf("warm-up %v: %d of the 30 measured puts acquired their lease: their latency is two replicated writes", warmup, n)
		}
	}
}
