package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/rs/xid"

	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/wire"
)

// Raftlockd drives raftlockd through the Go client; worker w talks to
// Clients[w % len(Clients)], so that load spreads over a cluster's nodes.
// With Second set (clients of another island, whose backend hash is
// SecondHash), a transaction's second key lives on that island, and the
// coordinator's decision goes through TC (clients of the first island
// that may call the coordinator: a TC client's certificate; default
// Clients).
type Raftlockd struct {
	Clients    []*client.Client
	Second     []*client.Client
	SecondHash string
	TC         []*client.Client

	mu     sync.Mutex
	leases map[string]*client.Lease // held by Put until Finish
}

func (r *Raftlockd) c(worker int) *client.Client { return r.Clients[worker%len(r.Clients)] }

func (r *Raftlockd) tc(worker int) *client.Client {
	if len(r.TC) == 0 {
		return r.c(worker)
	}
	return r.TC[worker%len(r.TC)]
}

// Name implements Driver.
func (r *Raftlockd) Name() string { return "raftlockd" }

// LockCycle implements Driver: acquire, update, release (commit).
func (r *Raftlockd) LockCycle(ctx context.Context, worker int, key string, payload []byte) error {
	l, err := r.c(worker).Acquire(ctx, wire.AcquireRequest{Key: key, Owner: "bench", TTLSeconds: 30})
	if err != nil {
		return fmt.Errorf("acquire: %w", err)
	}
	if _, err := l.Update(ctx, payload, client.Conditions{}); err != nil {
		return fmt.Errorf("update: %w", err)
	}
	if err := l.Release(ctx, false); err != nil {
		return fmt.Errorf("release: %w", err)
	}
	return nil
}

// Handoff implements Driver: wait for the shared key, then release it.
func (r *Raftlockd) Handoff(ctx context.Context, worker int, key string) error {
	l, err := r.c(worker).Acquire(ctx, wire.AcquireRequest{Key: key, Owner: "bench", TTLSeconds: 30})
	if err != nil {
		return fmt.Errorf("acquire: %w", err)
	}
	if err := l.Release(ctx, false); err != nil {
		return fmt.Errorf("release: %w", err)
	}
	return nil
}

// XACommit implements XADriver: both keys in one transaction, committed
// by a release when they share an island and by the coordinator's
// two-phase commit when the second key is on another island.
func (r *Raftlockd) XACommit(ctx context.Context, worker int, keys [2]string, payload []byte) error {
	txn := xid.New().String()
	first := r.c(worker)
	second := first
	if len(r.Second) > 0 {
		second = r.Second[worker%len(r.Second)]
	}
	var leases [2]*client.Lease
	for i, c := range []*client.Client{first, second} {
		l, err := c.Acquire(ctx, wire.AcquireRequest{Key: keys[i], Owner: "bench", TTLSeconds: 30, TxnID: txn})
		if err != nil {
			return fmt.Errorf("acquire: %w", err)
		}
		if _, err := l.Update(ctx, payload, client.Conditions{}); err != nil {
			return fmt.Errorf("update: %w", err)
		}
		leases[i] = l
	}
	if len(r.Second) == 0 {
		if err := leases[0].Release(ctx, false); err != nil {
			return fmt.Errorf("release: %w", err)
		}
		return nil
	}
	out, err := r.tc(worker).TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStateCommit,
		Participants: []wire.TxnParticipant{{Key: keys[0]}, {Key: keys[1], BackendHash: r.SecondHash}}})
	if err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	if out.State != wire.TxnStateCommit {
		return fmt.Errorf("commit: transaction %s", out.State)
	}
	return nil
}

// QueueCycle implements QueueDriver: enqueue, dequeue (waiting for it),
// ack. With a cluster, the pair's producer and consumer talk to different
// nodes.
func (r *Raftlockd) QueueCycle(ctx context.Context, worker int, queue string, payload []byte) error {
	if _, err := r.c(worker).Enqueue(ctx, wire.EnqueueRequest{Queue: queue}, payload); err != nil {
		return fmt.Errorf("enqueue: %w", err)
	}
	d, err := r.c(worker+1).Dequeue(ctx, wire.DequeueRequest{Queue: queue, Owner: "bench", WaitSeconds: 10})
	if err != nil {
		return fmt.Errorf("dequeue: %w", err)
	}
	if err := d.Ack(ctx); err != nil {
		return fmt.Errorf("ack: %w", err)
	}
	return nil
}

// Seed implements ReadDriver: a lock cycle that commits payload to key.
func (r *Raftlockd) Seed(ctx context.Context, key string, payload []byte) error {
	return r.LockCycle(ctx, 0, key, payload)
}

// PublicRead implements ReadDriver: the committed document of key, read
// linearizably without a lease (`client get --public`).
func (r *Raftlockd) PublicRead(ctx context.Context, worker int, key string) error {
	doc, err := r.c(worker).GetPublic(ctx, "", key)
	if err != nil {
		return fmt.Errorf("get: %w", err)
	}
	if !doc.Exists {
		return fmt.Errorf("get %s: no committed document", key)
	}
	return nil
}

// Put implements PutDriver. raftlockd has no write without a lease: the
// closest to a plain write is an update of the key's document under a lease
// the client keeps for the run (acquired by the first Put to the key). Each
// update is one replicated, acknowledged write; public readers see the last
// one once Finish releases the lease.
func (r *Raftlockd) Put(ctx context.Context, worker int, key string, payload []byte) error {
	l, err := r.putLease(ctx, worker, key)
	if err != nil {
		return err
	}
	if _, err := l.Update(ctx, payload, client.Conditions{}); err != nil {
		return fmt.Errorf("update: %w", err)
	}
	return nil
}

// PreparePut implements PutPreparer: it takes the lease Put updates key
// under, before the run measures anything.
func (r *Raftlockd) PreparePut(ctx context.Context, worker int, key string) error {
	_, err := r.putLease(ctx, worker, key)
	return err
}

// putLease returns the lease Put holds on key, acquiring it the first time.
func (r *Raftlockd) putLease(ctx context.Context, worker int, key string) (*client.Lease, error) {
	r.mu.Lock()
	l := r.leases[key]
	r.mu.Unlock()
	if l != nil {
		return l, nil
	}
	l, err := r.c(worker).Acquire(ctx, wire.AcquireRequest{Key: key, Owner: "bench", TTLSeconds: 600})
	if err != nil {
		return nil, fmt.Errorf("acquire: %w", err)
	}
	r.mu.Lock()
	if r.leases == nil {
		r.leases = map[string]*client.Lease{}
	}
	r.leases[key] = l
	r.mu.Unlock()
	return l, nil
}

// Finish implements Finisher: it releases (commits) the leases Put holds.
func (r *Raftlockd) Finish(ctx context.Context) error {
	r.mu.Lock()
	leases := r.leases
	r.leases = nil
	r.mu.Unlock()
	var errs []error
	for _, l := range leases {
		if err := l.Release(ctx, false); err != nil {
			errs = append(errs, fmt.Errorf("release %s: %w", l.Key, err))
		}
	}
	return errors.Join(errs...)
}

// outputSatoshis is the value of every output the UTXO workloads create.
const outputSatoshis = 1000

// UTXOCreate implements UTXODriver: one /v1/utxo/create request.
func (r *Raftlockd) UTXOCreate(ctx context.Context, worker int, txid string, hashes []string) error {
	outs := make([]wire.UTXOOutput, len(hashes))
	for i, h := range hashes {
		outs[i] = wire.UTXOOutput{Vout: uint32(i), UTXOHash: h, Satoshis: outputSatoshis}
	}
	if _, err := r.c(worker).UTXOCreate(ctx, wire.UTXOCreateRequest{TxID: txid, Outputs: outs}); err != nil {
		return fmt.Errorf("utxo create: %w", err)
	}
	return nil
}

// UTXOSpend implements UTXODriver: one /v1/utxo/spend request spending
// every input or none.
func (r *Raftlockd) UTXOSpend(ctx context.Context, worker int, spender string, ins []Outpoint) error {
	spends := make([]wire.UTXOSpend, len(ins))
	for i, in := range ins {
		spends[i] = wire.UTXOSpend{TxID: in.TxID, Vout: in.Vout, UTXOHash: in.Hash, SpendingTxID: spender, Vin: uint32(i)}
	}
	out, err := r.c(worker).UTXOSpend(ctx, wire.UTXOSpendRequest{Spends: spends})
	if err != nil {
		return fmt.Errorf("utxo spend: %w", err)
	}
	if out.Spent != len(ins) {
		return fmt.Errorf("utxo spend: %d of %d outputs spent", out.Spent, len(ins))
	}
	return nil
}
