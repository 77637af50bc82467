package bench

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// utxoFake is an in-memory UTXO store that checks what the workloads send:
// 64-hex-digit ids and hashes, fresh txids, spends of existing unspent
// outputs with their hashes, inputs numbered from 0, all or nothing.
type utxoFake struct {
	fake
	createDelay time.Duration

	mu       sync.Mutex
	outs     map[string]map[uint32]*fakeOut // txid -> vout -> output
	spenders map[string]bool
	creates  int
	sizes    map[int]int // outputs per created transaction -> transactions
	spends   int
	violated []string
}

type fakeOut struct {
	hash, spender string
	vin           uint32
}

func newUTXOFake() *utxoFake {
	return &utxoFake{fake: fake{name: "utxo", log: &callLog{}}, outs: map[string]map[uint32]*fakeOut{},
		spenders: map[string]bool{}, sizes: map[int]int{}}
}

func isHex64(s string) bool {
	_, err := hex.DecodeString(s)
	return len(s) == 64 && err == nil
}

func (f *utxoFake) violation(format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	f.violated = append(f.violated, err.Error())
	return err
}

func (f *utxoFake) UTXOCreate(_ context.Context, _ int, txid string, hashes []string) error {
	time.Sleep(f.createDelay)
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case !isHex64(txid):
		return f.violation("create: txid %q", txid)
	case f.outs[txid] != nil || f.spenders[txid]:
		return f.violation("create: txid %s used before", txid)
	case len(hashes) == 0:
		return f.violation("create %s: no outputs", txid)
	}
	outs := map[uint32]*fakeOut{}
	for v, h := range hashes {
		if !isHex64(h) {
			return f.violation("create %s: hash %q", txid, h)
		}
		outs[uint32(v)] = &fakeOut{hash: h}
	}
	f.outs[txid] = outs
	f.creates++
	f.sizes[len(hashes)]++
	return nil
}

func (f *utxoFake) UTXOSpend(_ context.Context, _ int, spender string, ins []Outpoint) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case !isHex64(spender):
		return f.violation("spend: spending txid %q", spender)
	case f.spenders[spender] || f.outs[spender] != nil:
		return f.violation("spend: spending txid %s used before", spender)
	case len(ins) != 2 || ins[0].TxID == ins[1].TxID:
		return f.violation("spend %s: inputs %v, want two of different parents", spender, ins)
	}
	for _, in := range ins {
		o := f.outs[in.TxID][in.Vout]
		switch {
		case o == nil:
			return f.violation("spend %s: no output %s:%d", spender, in.TxID, in.Vout)
		case o.hash != in.Hash:
			return f.violation("spend %s: hash of %s:%d is %s, not %s", spender, in.TxID, in.Vout, o.hash, in.Hash)
		case o.spender != "":
			return f.violation("spend %s: %s:%d spent before by %s", spender, in.TxID, in.Vout, o.spender)
		}
	}
	for vin, in := range ins {
		o := f.outs[in.TxID][in.Vout]
		o.spender, o.vin = spender, uint32(vin)
	}
	f.spenders[spender] = true
	f.spends++
	return nil
}

func TestUTXOSpendSpendsFreshOutputs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f := newUTXOFake()
	f.createDelay = 100 * time.Millisecond
	// 3 outputs per parent: a client makes 3 spends per pair of parents, so
	// most operations of this run follow the creation of new parents.
	res, err := Run(ctx, f, Options{Workload: UTXOSpend, Clients: 3, Ops: 30, Warmup: 20 * time.Millisecond, ParentOutputs: 3})
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.violated) > 0 {
		t.Fatalf("violations: %s", strings.Join(f.violated, "; "))
	}
	if res.Ops != 30 || res.Errors != 0 {
		t.Fatalf("%d ops, %d errors (%s)", res.Ops, res.Errors, res.FirstErr)
	}
	// The first spend, the warm-up's and 30 measured ones; parents in pairs
	// of 3 outputs, every one of 3 clients with a pair before the first spend.
	if f.spends < 31 || f.creates%2 != 0 || f.creates < 6+2*(f.spends-9)/3 || f.sizes[3] != f.creates {
		t.Fatalf("%d spends, %d creates (sizes %v)", f.spends, f.creates, f.sizes)
	}
	for _, outs := range f.outs {
		for v, o := range outs {
			if o.spender != "" && o.vin > 1 {
				t.Fatalf("output %d spent as input %d", v, o.vin)
			}
		}
	}
	// Creating parents takes 100ms; a spend takes no time: the creations
	// are not in the latencies.
	if res.Max >= f.createDelay {
		t.Fatalf("max latency %s: the creation of parents was measured", res.Max)
	}
}

func TestUTXOCreateCreatesTwoOutputs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f := newUTXOFake()
	res, err := Run(ctx, f, Options{Workload: UTXOCreate, Clients: 4, Ops: 40})
	if err != nil {
		t.Fatal(err)
	}
	if len(f.violated) > 0 {
		t.Fatalf("violations: %s", strings.Join(f.violated, "; "))
	}
	if res.Ops != 40 || res.Errors != 0 || f.creates != 41 || f.sizes[2] != 41 || f.spends != 0 {
		t.Fatalf("%d ops, %d errors, %d creates (sizes %v), %d spends", res.Ops, res.Errors, f.creates, f.sizes, f.spends)
	}
}

func TestUTXOSpendCountsFailedCreationsAsErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f := &failingCreates{utxoFake: newUTXOFake(), after: 2}
	// Two parents of 2 outputs: client 0 makes 2 spends (the first and a
	// measured one), then cannot create parents anymore.
	res, err := Run(ctx, f, Options{Workload: UTXOSpend, Clients: 1, Ops: 5, ParentOutputs: 2})
	if err != nil {
		t.Fatal(err)
	}
	if res.Ops != 1 || res.Errors != 4 || !strings.Contains(res.FirstErr, "no more") {
		t.Fatalf("%d ops, %d errors (%s)", res.Ops, res.Errors, res.FirstErr)
	}
	f.after = 0
	if _, err := Run(ctx, f, Options{Workload: UTXOSpend, Clients: 2, Ops: 5}); err == nil ||
		!strings.Contains(err.Error(), "create the outputs to spend") {
		t.Fatalf("a run without outputs to spend: %v", err)
	}
}

type failingCreates struct {
	*utxoFake
	after int
}

func (f *failingCreates) UTXOCreate(ctx context.Context, worker int, txid string, hashes []string) error {
	f.mu.Lock()
	n := f.creates
	f.mu.Unlock()
	if n >= f.after {
		return errors.New("no more")
	}
	return f.utxoFake.UTXOCreate(ctx, worker, txid, hashes)
}

func TestUTXOWorkloadsNeedAUTXODriver(t *testing.T) {
	for _, w := range Workloads {
		want := w != UTXOSpend && w != UTXOCreate
		if got := Supports(&Etcd{}, w); got != want {
			t.Errorf("etcd runs %s: %v, want %v", w, got, want)
		}
		if !Supports(&Raftlockd{}, w) {
			t.Errorf("raftlockd does not run %s", w)
		}
	}
	if Supports(&Raftlockd{}, "nope") {
		t.Error("an unknown workload is supported")
	}
	ctx := context.Background()
	for _, w := range []string{UTXOSpend, UTXOCreate} {
		if _, err := Run(ctx, &Etcd{}, Options{Workload: w, Clients: 1, Ops: 1}); err == nil ||
			err.Error() != "bench: etcd does not run "+w {
			t.Errorf("%s against etcd: %v", w, err)
		}
	}
	// Side by side, the system without UTXO records gets a run that could
	// not start, not a ratio.
	systems := []System{{Driver: newUTXOFake()}, {Driver: &fake{name: "b", log: &callLog{}}}}
	c, err := Compare(ctx, systems, []PlanRow{{UTXOCreate, 1}}, 1, Options{Ops: 3}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := c.Rows[0]
	if r.Results[0].Ops != 3 || r.Results[1].Ops != 0 || !strings.Contains(r.Results[1].FirstErr, "b does not run utxo-create") {
		t.Fatalf("row %+v", r.Results)
	}
}

func TestOutputHashes(t *testing.T) {
	txid := newTxID()
	if !isHex64(txid) || txid == newTxID() {
		t.Fatalf("txid %q", txid)
	}
	a, b := outputHashes(txid, 3), outputHashes(txid, 2)
	if len(a) != 3 || a[0] != b[0] || a[1] != b[1] || a[0] == a[1] || !isHex64(a[2]) {
		t.Fatalf("hashes %v, %v", a, b)
	}
	if outputHashes(newTxID(), 1)[0] == a[0] {
		t.Fatal("two transactions' first outputs share a hash")
	}
}
