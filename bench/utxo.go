package bench

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"sync"
)

// DefaultParentOutputs is the number of outputs of each parent transaction
// utxo-spend creates to spend.
const DefaultParentOutputs = 1000

// Outpoint names an unspent output: its transaction, its index and its
// hash (txid and hash: 64 hex digits).
type Outpoint struct {
	TxID string
	Vout uint32
	Hash string
}

// UTXODriver is a Driver that also stores Bitcoin-style transaction
// outputs.
type UTXODriver interface {
	Driver
	// UTXOCreate records transaction txid with len(hashes) outputs, output
	// i with hashes[i].
	UTXOCreate(ctx context.Context, worker int, txid string, hashes []string) error
	// UTXOSpend spends ins as inputs 0, 1, ... of transaction spender, all
	// of them in one request that spends every one or none.
	UTXOSpend(ctx context.Context, worker int, spender string, ins []Outpoint) error
}

// Supports reports whether d runs workload.
func Supports(d Driver, workload string) bool {
	var ok bool
	switch workload {
	case Lock, Handoff:
		ok = true
	case XACommit:
		_, ok = d.(XADriver)
	case Queue:
		_, ok = d.(QueueDriver)
	case PublicRead:
		_, ok = d.(ReadDriver)
	case Put:
		_, ok = d.(PutDriver)
	case UTXOSpend, UTXOCreate:
		_, ok = d.(UTXODriver)
	}
	return ok
}

// newTxID is a fresh transaction id: the SHA-256 of 32 random bytes, in
// hex.
func newTxID() string {
	var seed [32]byte
	_, _ = rand.Read(seed[:]) // never fails (crypto/rand)
	sum := sha256.Sum256(seed[:])
	return hex.EncodeToString(sum[:])
}

// outputHashes are the hashes of the first n outputs of txid: output v's
// is the SHA-256 of the txid's bytes and v (4 bytes, little endian), in hex.
func outputHashes(txid string, n int) []string {
	buf := make([]byte, 0, 36)
	raw, err := hex.DecodeString(txid)
	if err != nil {
		raw = []byte(txid)
	}
	out := make([]string, n)
	for v := range n {
		buf = binary.LittleEndian.AppendUint32(append(buf[:0], raw...), uint32(v))
		sum := sha256.Sum256(buf)
		out[v] = hex.EncodeToString(sum[:])
	}
	return out
}

// utxoPools are the unspent outputs each client of a utxo-spend run
// created for itself to spend. Client c's pool is only used by the
// goroutine running client c.
type utxoPools struct {
	d       UTXODriver
	outputs int          // per parent
	free    [][]Outpoint // per client, in the order they are spent
}

func newUTXOPools(d UTXODriver, clients, outputs int) *utxoPools {
	if outputs <= 0 {
		outputs = DefaultParentOutputs
	}
	return &utxoPools{d: d, outputs: outputs, free: make([][]Outpoint, clients)}
}

// fill gives every client its first parents, the clients concurrently.
func (p *utxoPools) fill(ctx context.Context) error {
	errs := make([]error, len(p.free))
	var wg sync.WaitGroup
	for c := range p.free {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[c] = p.refill(ctx, c)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// refill creates two parent transactions for client when it has fewer
// than two unspent outputs left. Their outputs alternate in the pool, so
// that every spend takes one output of each parent.
func (p *utxoPools) refill(ctx context.Context, client int) error {
	if len(p.free[client]) >= 2 {
		return nil
	}
	parents := [2]string{newTxID(), newTxID()}
	var hashes [2][]string
	for i, txid := range parents {
		hashes[i] = outputHashes(txid, p.outputs)
		if err := p.d.UTXOCreate(ctx, client, txid, hashes[i]); err != nil {
			return fmt.Errorf("create parent %s: %w", txid, err)
		}
	}
	free := make([]Outpoint, 0, 2*p.outputs)
	for v := range p.outputs {
		for i, txid := range parents {
			free = append(free, Outpoint{TxID: txid, Vout: uint32(v), Hash: hashes[i][v]})
		}
	}
	p.free[client] = free
	return nil
}

// spend spends the client's next two outputs in a new transaction. They
// leave the pool whatever the outcome: a failed or interrupted spend may
// have happened.
func (p *utxoPools) spend(ctx context.Context, client int) error {
	free := p.free[client]
	if len(free) < 2 {
		return fmt.Errorf("bench: client %d has no outputs left to spend", client)
	}
	ins := free[:2:2]
	p.free[client] = free[2:]
	return p.d.UTXOSpend(ctx, client, newTxID(), ins)
}
